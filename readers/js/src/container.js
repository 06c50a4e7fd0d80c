// The strict safetensors container (SPEC.md §2): the header length, the header JSON, the
// tensor entries and the tiling of the data buffer, checked in the order of §2.3 before
// anything from the header is used.  Nothing is allocated from an unchecked size.
//
// The order is required since 1.2.1: checks 1, 2, 3 (NOT_SAFETENSORS in place of a failing 2 or
// 3 for a file that is no safetensors file at all), 4, 6, 7 on the whole header; then the members
// of the header object in the order of the header text: check 8 on `__metadata__` where it
// appears, checks 10, 11, 12, 13, 14 on each tensor entry before the next; then 15, 16, 17.
// Offsets are exact however many digits they have (BigInt, or HugeInt beyond
// json.js's EXACT_DIGITS), so the code never depends on where a reader stops reading digits.

import { DTYPES, LIMITS } from "./tables.js";
import { error } from "./errors.js";
import { HugeInt, JFloat, JsonError, parseStrict } from "./json.js";

const TWO64 = 1n << 64n;
const TWO48 = 1n << 48n;
const WS = " \t\n\r";

/** @typedef {bigint|HugeInt} Exact  an exact integer of the header */

/** Sign and decimal digits of an exact integer. @param {Exact} v @returns {[boolean, string]} */
function parts(v) {
  if (v instanceof HugeInt) return [v.negative, v.digits];
  return v < 0n ? [true, (-v).toString()] : [false, v.toString()];
}

/** Compare two exact integers (-1, 0, 1): BigInts natively, HugeInts by their digits. @param {Exact} a @param {Exact} b */
export function cmpExact(a, b) {
  if (typeof a === "bigint" && typeof b === "bigint") return a < b ? -1 : a > b ? 1 : 0;
  const [na, da] = parts(a);
  const [nb, db] = parts(b);
  if (na !== nb) return na ? -1 : 1;
  const mag = da.length !== db.length ? (da.length < db.length ? -1 : 1) : da < db ? -1 : da > db ? 1 : 0;
  return na ? -mag : mag;
}

/** `a + k` exactly, for a non-negative exact integer `a` and a BigInt 0 <= k < 2^64. @param {Exact} a @param {bigint} k @returns {Exact} */
function addExact(a, k) {
  if (typeof a === "bigint") return a + k;
  // the low 24 digits plus k (< 10^20) carry at most 1 into the rest, which then adds 1 there
  const d = a.digits;
  const cut = d.length - 24;
  const low = BigInt(d.slice(cut)) + k;
  let lowDigits = low.toString().padStart(24, "0");
  let high = d.slice(0, cut);
  if (lowDigits.length > 24) {
    lowDigits = lowDigits.slice(1);
    let i = high.length - 1;
    while (i >= 0 && high[i] === "9") i--;
    high = (i < 0 ? "1" : high.slice(0, i) + String.fromCharCode(high.charCodeAt(i) + 1)) + "0".repeat(high.length - 1 - i);
  }
  return new HugeInt(high + lowDigits);
}

/** An exact integer as a message shows it (at most 40 digits). @param {Exact|number} v */
function show(v) {
  const t = String(v);
  return t.length <= 40 ? t : `${t.slice(0, 12)}...${t.slice(-12)} (${t.replace("-", "").length} digits)`;
}

const UTF8_TEXT = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * The length (1 to 4) of the UTF-8 sequence starting at `b[i]` (RFC 3629's table of well-formed
 * byte sequences), 0 when the bytes there are no well-formed sequence, or -1 when they are a
 * well-formed sequence cut by the end of `b`.
 * @param {Uint8Array} b @param {number} i
 */
function utf8Sequence(b, i) {
  const c = b[i];
  if (c < 0x80) return 1;
  /** @type {[number, number][]} the ranges of the continuation bytes */
  let ranges;
  if (c >= 0xc2 && c <= 0xdf) ranges = [[0x80, 0xbf]];
  else if (c === 0xe0) ranges = [[0xa0, 0xbf], [0x80, 0xbf]];
  else if ((c >= 0xe1 && c <= 0xec) || c === 0xee || c === 0xef) ranges = [[0x80, 0xbf], [0x80, 0xbf]];
  else if (c === 0xed) ranges = [[0x80, 0x9f], [0x80, 0xbf]];
  else if (c === 0xf0) ranges = [[0x90, 0xbf], [0x80, 0xbf], [0x80, 0xbf]];
  else if (c >= 0xf1 && c <= 0xf3) ranges = [[0x80, 0xbf], [0x80, 0xbf], [0x80, 0xbf]];
  else if (c === 0xf4) ranges = [[0x80, 0x8f], [0x80, 0xbf], [0x80, 0xbf]];
  else return 0;
  for (let j = 0; j < ranges.length; j++) {
    if (i + 1 + j >= b.length) return -1;
    const x = b[i + 1 + j];
    if (x < ranges[j][0] || x > ranges[j][1]) return 0;
  }
  return ranges.length + 1;
}

/**
 * SPEC.md 1.2.1 §2.3 (d): after dropping at most 3 trailing bytes that are an incomplete (cut)
 * UTF-8 sequence, `b` is well-formed UTF-8 whose code points are all U+0009, U+000A, U+000D,
 * U+0020..U+007E or U+00A0 and above.
 * @param {Uint8Array} b
 */
export function isText(b) {
  let end = b.length;
  for (let i = 0; i < b.length;) {
    const n = utf8Sequence(b, i);
    if (n === 0) return false;
    if (n < 0) {  // a sequence cut by the end (at most 3 bytes: a 4-byte lead and 2 continuations)
      end = i;
      break;
    }
    i += n;
  }
  for (const ch of UTF8_TEXT.decode(b.subarray(0, end))) {
    const cp = /** @type {number} */ (ch.codePointAt(0));
    if (!(cp === 0x09 || cp === 0x0a || cp === 0x0d || (cp >= 0x20 && cp <= 0x7e) || cp >= 0xa0)) return false;
  }
  return true;
}

/**
 * What a file whose first 8 bytes `b` fail check 2 or 3 is, when SPEC.md §2.3 (1.2.1) says it is
 * no safetensors file at all (NOT_SAFETENSORS): a GGUF file, a ZIP archive, a Python pickle
 * stream, text; null otherwise (the check's own code).
 * @param {Uint8Array} b  the first 8 bytes
 */
export function notSafetensors(b) {
  if (b.length < 8) return null;
  const n = new DataView(b.buffer, b.byteOffset, 8).getBigUint64(0, true);
  const head4 = String.fromCharCode(b[0], b[1], b[2], b[3]);
  if (head4 === "GGUF") return "a GGUF file (qformat convert reads it)";
  if (head4 === "PK\x03\x04") return "a ZIP archive (a PyTorch .bin/.pt checkpoint?)";
  // a pickle of protocol 4 or 5 starts with a frame whose 8-byte length leaves bytes 6 and 7 zero
  if (b[0] === 0x80 && b[1] >= 2 && b[1] <= 5) return "a serialized Python object stream (a PyTorch .bin checkpoint?)";
  if (n < TWO48) return null;
  if (isText(b)) return "a text file";
  return null;
}

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

/** A non-negative integer of the header ("-0" is 0): a Number, BigInt or HugeInt. @param {any} v */
function isNonNegativeInt(v) {
  if (v instanceof HugeInt) return !v.negative;
  return ((typeof v === "number" && Number.isInteger(v)) || typeof v === "bigint") && v >= 0;
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
  if (n > BigInt(LIMITS.max_header_bytes) || n === 0n || 8n + n > BigInt(size)) {
    const what = notSafetensors(pre);
    if (what !== null) throw mal("NOT_SAFETENSORS", `the file is ${what}, not safetensors: its first 8 bytes are no safetensors header length`);
  }
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
    // the order SPEC.md 1.2.1 §2.3 gives on one entry: exactly the three members and `dtype` a
    // string (check 10), `dtype` a storage dtype (check 11), then the rest of check 10 (`shape`,
    // `data_offsets`, the rank), then checks 12, 13, 14
    if (!(ent instanceof Map) || ent.size !== 3 || !ent.has("dtype") || !ent.has("shape") || !ent.has("data_offsets")) {
      throw mal("TENSOR_ENTRY_INVALID", "expected exactly the fields data_offsets, dtype, shape", name);
    }
    const dt = ent.get("dtype");
    const shape = ent.get("shape");
    const offs = ent.get("data_offsets");
    if (typeof dt !== "string") throw mal("TENSOR_ENTRY_INVALID", "dtype must be a string", name);
    if (!Object.hasOwn(DTYPES, dt)) throw mal("DTYPE_UNKNOWN", `dtype ${JSON.stringify(dt)} is not a safetensors dtype`, name);
    if (!Array.isArray(shape) || !shape.every(isNonNegativeInt)) {
      throw mal("TENSOR_ENTRY_INVALID", "shape must be a list of non-negative integers", name);
    }
    if (!(Array.isArray(offs) && offs.length === 2 && offs.every(isNonNegativeInt))) {
      throw mal("TENSOR_ENTRY_INVALID", "data_offsets must be two non-negative integers", name);
    }
    if (shape.length > LIMITS.max_rank) throw mal("TENSOR_ENTRY_INVALID", `rank must be at most ${LIMITS.max_rank}, found ${shape.length}`, name);
    // §2.2: an entry of 2^64 or more is SIZE_OVERFLOW even in an empty tensor; the count is exact
    if (shape.some((s) => s instanceof HugeInt || BigInt(s) >= TWO64)) throw mal("SIZE_OVERFLOW", "a shape entry does not fit 64 bits", name);
    const bshape = shape.map((s) => BigInt(s));
    let numel = 1n;
    for (const s of bshape) numel *= s;
    if (numel >= TWO64) throw mal("SIZE_OVERFLOW", "element count overflows 64 bits", name);
    const nbits = numel * BigInt(DTYPES[dt].bits);
    if (nbits >= TWO64) throw mal("SIZE_OVERFLOW", "bit size overflows 64 bits", name);
    if (nbits % 8n) throw mal("SUB_BYTE_MISALIGNED", `${numel} elements of ${dt} do not fill whole bytes`, name);
    /** @type {Exact} */
    const b = offs[0] instanceof HugeInt ? offs[0] : BigInt(offs[0]);
    /** @type {Exact} */
    const e = offs[1] instanceof HugeInt ? offs[1] : BigInt(offs[1]);
    // exact arithmetic (1.2.1): [2^64+5, 2^64+9] of 4 bytes passes here and fails the tiling
    if (cmpExact(e, b) < 0) throw mal("OFFSETS_INVALID", `data_offsets [${show(b)}, ${show(e)}] end before they begin`, name);
    if (cmpExact(e, addExact(b, nbits / 8n)) !== 0) {
      const span = typeof e === "bigint" && typeof b === "bigint" ? `${e - b}` : "another number of bytes";
      throw mal("TENSOR_SIZE_MISMATCH", `shape needs ${nbits / 8n} bytes, data_offsets [${show(b)}, ${show(e)}] span ${span}`, name);
    }
    entries.set(name, { name, dtype: dt, shape: bshape, begin: /** @type {any} */ (b), end: /** @type {any} */ (e) });
  }
  const sorted = [...entries.values()].sort((x, y) => cmpExact(/** @type {any} */ (x.begin), /** @type {any} */ (y.begin)) || cmpExact(/** @type {any} */ (x.end), /** @type {any} */ (y.end)));
  /** @type {Exact} */
  let pos = 0n;
  for (const ent of sorted) {
    if (cmpExact(/** @type {any} */ (ent.begin), pos) !== 0) throw mal("OFFSETS_INVALID", `data_offsets begin at ${show(ent.begin)}, expected ${show(pos)}`, ent.name);
    pos = /** @type {any} */ (ent.end);
  }
  const dataStart = 8n + n;
  if (typeof pos !== "bigint") throw mal("DATA_TRUNCATED", `tensor data needs ${show(pos)} bytes after the header, the file has ${BigInt(size) - dataStart}`);
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
