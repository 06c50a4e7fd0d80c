// The strict safetensors container (SPEC.md §2): the header length, the header JSON, the
// tensor entries and the tiling of the data buffer, checked in the order of §2.3 before
// anything from the header is used.  Nothing is allocated from an unchecked size.

import { DTYPES, LIMITS } from "./tables.js";
import { error } from "./errors.js";
import { JFloat, JsonError, parseStrict } from "./json.js";

const TWO64 = 1n << 64n;
const WS = " \t\n\r";

/**
 * @typedef {object} Entry  one stored tensor
 * @property {string} name
 * @property {string} dtype   safetensors dtype name
 * @property {bigint[]} shape exact shape (entries may exceed 2^53 when another entry is 0)
 * @property {number} begin   byte offset in the data buffer
 * @property {number} end
 */

/**
 * @typedef {object} Header
 * @property {Map<string,string>|null} metadata
 * @property {Map<string, Entry>} entries  in header order
 * @property {number} dataStart  8 + N
 * @property {number} fileSize
 * @property {import("./errors.js").QFormatError[]} lenient  what only check --strict reports (SPEC.md §2.4)
 */

/** @param {any} v */
function isHeaderInt(v) {
  return (typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint";
}

const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/** @param {string} code @param {string} msg @param {string|null} [tensor] */
const mal = (code, msg, tensor = null) => error(code, msg, tensor);

/**
 * Read and validate the header of a safetensors file (SPEC.md §2.3, checks 1-17).
 * @param {import("./source.js").ByteSource} src
 * @returns {Header}
 */
export function parseHeader(src) {
  const size = src.size;
  if (size < 8) throw mal("HEADER_TOO_SMALL", `expected at least 8 bytes, the file has ${size}`);
  const pre = src.read(0, 8);
  const n = new DataView(pre.buffer, pre.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(LIMITS.max_header_bytes)) throw mal("HEADER_TOO_LARGE", `header length ${n} exceeds the limit ${LIMITS.max_header_bytes}`);
  if (n === 0n || 8n + n > BigInt(size)) throw mal("HEADER_LENGTH_INVALID", `header length ${n} does not fit a file of ${size} bytes`);
  const hlen = Number(n);
  let text;
  try {
    text = utf8.decode(src.read(8, hlen));
  } catch {
    throw mal("HEADER_NOT_UTF8", "the header is not valid UTF-8");
  }
  // §2.3, §2.4: JSON whitespace may precede the object and pad it (safetensors reads both; writers
  // write neither, so check --strict reports them from `lenient`)
  /** @type {import("./errors.js").QFormatError[]} */
  const lenient = [];
  let lead = 0;
  while (lead < text.length && WS.includes(text[lead])) lead++;
  if (lead) lenient.push(mal("HEADER_LEADING_WHITESPACE", `the header begins with ${lead} JSON whitespace byte(s) before '{': safetensors reads it, its writer never writes it`));
  if (text[lead] !== "{") throw mal("HEADER_INVALID_JSON", `the header must begin with '{' (after optional JSON whitespace), found ${JSON.stringify(text.slice(lead, lead + 1))}`);
  let obj, end;
  try {
    ({ value: obj, end } = parseStrict(text.slice(lead), { maxDepth: LIMITS.max_json_depth, header: true }));
    end += lead;
  } catch (e) {
    if (e instanceof JsonError && e.kind === "duplicate") throw mal("HEADER_DUPLICATE_KEY", e.message);
    if (e instanceof JsonError) throw mal("HEADER_INVALID_JSON", `the header is not valid JSON: ${e.message}`);
    throw e;
  }
  let nonSpace = false;
  for (let i = end; i < text.length; i++) {
    if (!WS.includes(text[i])) throw mal("HEADER_INVALID_JSON", "only JSON whitespace padding may follow the header object");
    if (text[i] !== " ") nonSpace = true;
  }
  if (nonSpace) lenient.push(mal("HEADER_PADDING_NOT_SPACE", "the header object is followed by padding other than spaces (0x20): safetensors reads it, its writer pads with spaces"));
  if (!(obj instanceof Map)) throw mal("HEADER_INVALID_JSON", "the header must be a JSON object");

  /** @type {Map<string,string>|null} */
  let metadata = null;
  /** @type {Map<string, Entry>} */
  const entries = new Map();
  for (const [name, ent] of obj) {
    if (name === "__metadata__") {
      if (ent === null) {  // §2.4: what mx.save_safetensors writes; read as no metadata, as safetensors does
        lenient.push(mal("METADATA_INVALID", "__metadata__ is null: read as no metadata, as safetensors reads it"));
        continue;
      }
      if (!(ent instanceof Map) || ![...ent.values()].every((v) => typeof v === "string")) {
        throw mal("METADATA_INVALID", "__metadata__ must be an object whose values are all strings");
      }
      metadata = ent;
      continue;
    }
    if (name === "") lenient.push(mal("TENSOR_NAME_INVALID", "a tensor name is empty: safetensors writes and reads it, qformat reads it", ""));
    if (!(ent instanceof Map) || ent.size !== 3 || !ent.has("dtype") || !ent.has("shape") || !ent.has("data_offsets")) {
      throw mal("TENSOR_ENTRY_INVALID", "expected exactly the fields data_offsets, dtype, shape", name);
    }
    const dt = ent.get("dtype");
    const shape = ent.get("shape");
    const offs = ent.get("data_offsets");
    if (typeof dt !== "string") throw mal("TENSOR_ENTRY_INVALID", "dtype must be a string", name);
    if (!Object.hasOwn(DTYPES, dt)) throw mal("DTYPE_UNKNOWN", `dtype ${JSON.stringify(dt)} is not a safetensors dtype`, name);
    if (!Array.isArray(shape) || !shape.every((s) => isHeaderInt(s) && s >= 0)) {
      throw mal("TENSOR_ENTRY_INVALID", "shape must be a list of non-negative integers", name);
    }
    if (!(Array.isArray(offs) && offs.length === 2 && offs.every((o) => isHeaderInt(o) && o >= 0))) {
      throw mal("TENSOR_ENTRY_INVALID", "data_offsets must be two non-negative integers", name);
    }
    if (shape.length > LIMITS.max_rank) throw mal("TENSOR_ENTRY_INVALID", `rank must be at most ${LIMITS.max_rank}, found ${shape.length}`, name);
    const bshape = shape.map((s) => BigInt(s));
    // §2.2: an entry of 2^64 or more is SIZE_OVERFLOW even in an empty tensor; the count is exact
    if (bshape.some((s) => s >= TWO64)) throw mal("SIZE_OVERFLOW", "a shape entry does not fit 64 bits", name);
    let numel = 1n;
    for (const s of bshape) numel *= s;
    if (numel >= TWO64) throw mal("SIZE_OVERFLOW", "element count overflows 64 bits", name);
    const nbits = numel * BigInt(DTYPES[dt].bits);
    if (nbits >= TWO64) throw mal("SIZE_OVERFLOW", "bit size overflows 64 bits", name);
    if (nbits % 8n) throw mal("SUB_BYTE_MISALIGNED", `${numel} elements of ${dt} do not fill whole bytes`, name);
    const b = BigInt(offs[0]);
    const e = BigInt(offs[1]);
    if (e < b) throw mal("OFFSETS_INVALID", `data_offsets [${b}, ${e}] end before they begin`, name);
    if (e - b !== nbits / 8n) throw mal("TENSOR_SIZE_MISMATCH", `shape needs ${nbits / 8n} bytes, data_offsets span ${e - b}`, name);
    entries.set(name, { name, dtype: dt, shape: bshape, begin: /** @type {any} */ (b), end: /** @type {any} */ (e) });
  }
  const sorted = [...entries.values()].sort((x, y) => (x.begin < y.begin ? -1 : x.begin > y.begin ? 1 : x.end < y.end ? -1 : x.end > y.end ? 1 : 0));
  let pos = 0n;
  for (const ent of sorted) {
    if (/** @type {any} */ (ent.begin) !== pos) throw mal("OFFSETS_INVALID", `data_offsets begin at ${ent.begin}, expected ${pos}`, ent.name);
    pos = /** @type {any} */ (ent.end);
  }
  const dataStart = 8n + n;
  if (dataStart + pos > BigInt(size)) throw mal("DATA_TRUNCATED", `tensor data needs ${pos} bytes after the header, the file has ${BigInt(size) - dataStart}`);
  if (dataStart + pos < BigInt(size)) throw mal("TRAILING_BYTES", `${BigInt(size) - dataStart - pos} bytes follow the last tensor's data`);
  // every offset is now within the file: plain Numbers from here on
  for (const ent of entries.values()) {
    ent.begin = Number(ent.begin);
    ent.end = Number(ent.end);
  }
  return { metadata, entries, dataStart: Number(dataStart), fileSize: size, lenient };
}

export { JFloat };
