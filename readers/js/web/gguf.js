// GGUF headers for the viewer's table (ggml docs/gguf.md; the same layout and checks as
// qformat/convert/gguf_file.py): the metadata keys and each tensor's name, ggml type, shape and
// bytes.  Tensor data are not read or decoded here.  Every count, length and dimension is
// checked against the bytes left before it is used, so a hostile header is refused with
// CONVERT_SOURCE_INVALID (CONVERT_UNSUPPORTED for a variant this reader does not handle) and
// never sizes an allocation; the header is read in growing ranges through an AsyncByteSource.

import { error } from "../src/errors.js";
import { LIMITS } from "../src/tables.js";

/** ggml type id -> [name, elements per block, bytes per block] (as gguf_file.py's GGML_TYPES). */
export const GGML_TYPES = Object.freeze({
  0: ["F32", 1, 4], 1: ["F16", 1, 2], 2: ["Q4_0", 32, 18], 3: ["Q4_1", 32, 20], 6: ["Q5_0", 32, 22],
  7: ["Q5_1", 32, 24], 8: ["Q8_0", 32, 34], 9: ["Q8_1", 32, 40], 10: ["Q2_K", 256, 84], 11: ["Q3_K", 256, 110],
  12: ["Q4_K", 256, 144], 13: ["Q5_K", 256, 176], 14: ["Q6_K", 256, 210], 15: ["Q8_K", 256, 292],
  16: ["IQ2_XXS", 256, 66], 17: ["IQ2_XS", 256, 74], 18: ["IQ3_XXS", 256, 98], 19: ["IQ1_S", 256, 50],
  20: ["IQ4_NL", 32, 18], 21: ["IQ3_S", 256, 110], 22: ["IQ2_S", 256, 82], 23: ["IQ4_XS", 256, 136],
  24: ["I8", 1, 1], 25: ["I16", 1, 2], 26: ["I32", 1, 4], 27: ["I64", 1, 8], 28: ["F64", 1, 8],
  29: ["IQ1_M", 256, 56], 30: ["BF16", 1, 2], 34: ["TQ1_0", 256, 54], 35: ["TQ2_0", 256, 66],
  39: ["MXFP4", 32, 17], 40: ["NVFP4", 64, 36], 41: ["Q1_0", 128, 18],
});
/** GGUF value type id -> size in bytes (strings and arrays: null). */
const VALUE_SIZE = /** @type {Record<number, number|null>} */ ({ 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 8: null, 9: null, 10: 8, 11: 8, 12: 8 });
const MAX_DIMS = 4;
const MAX_ARRAY_DEPTH = 8;
const MAX_NAME_BYTES = 65536;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** @param {Uint8Array} head */
export function isGguf(head) {
  return head.length >= 4 && head[0] === 0x47 && head[1] === 0x47 && head[2] === 0x55 && head[3] === 0x46;
}

/** @param {string} what @param {string} msg */
const bad = (what, msg) => error("CONVERT_SOURCE_INVALID", `GGUF ${what}: ${msg}`, null, what);

/** Sequential reads of the header through an AsyncByteSource, fetched in doubling ranges. */
class HeaderReader {
  /** @param {import("../src/source.js").AsyncByteSource & {prefix?: Uint8Array}} src */
  constructor(src) {
    this.src = src;
    this.buf = src.prefix?.length ? src.prefix : new Uint8Array(0);
    this.pos = 0;
  }

  /** Make [pos, pos + n) readable, or refuse: past the end of the file, or past max_header_bytes. @param {number} n @param {string} what */
  async need(n, what) {
    const end = this.pos + n;
    if (end > this.src.size) throw bad(what, `expected ${n} bytes at offset ${this.pos}, found the end of the file at ${this.src.size} (truncated)`);
    if (end <= this.buf.length) return;
    if (end > LIMITS.max_header_bytes) throw bad(what, `the header runs past ${LIMITS.max_header_bytes} bytes`);
    const want = Math.min(this.src.size, LIMITS.max_header_bytes, Math.max(end, 2 * this.buf.length, 65536));
    const more = await this.src.read(this.buf.length, want - this.buf.length);
    const grown = new Uint8Array(want);
    grown.set(this.buf);
    grown.set(more, this.buf.length);
    this.buf = grown;
  }

  /** @param {number} n @param {string} what */
  async bytes(n, what) {
    await this.need(n, what);
    this.pos += n;
    return this.buf.subarray(this.pos - n, this.pos);
  }

  /** @param {string} what */
  async u32(what) {
    const b = await this.bytes(4, what);
    return new DataView(b.buffer, b.byteOffset, 4).getUint32(0, true);
  }

  /** A uint64 that must be at most `max` (a count or length checked against what is left). @param {string} what @param {number} max */
  async u64(what, max) {
    const b = await this.bytes(8, what);
    const v = new DataView(b.buffer, b.byteOffset, 8).getBigUint64(0, true);
    if (v > BigInt(max)) throw bad(what, `${v} exceeds ${max}`);
    return Number(v);
  }

  left() {
    return this.src.size - this.pos;
  }

  /** @param {string} what @param {number} [limit] */
  async str(what, limit = this.left()) {
    const n = await this.u64(`${what} length`, Math.min(limit, this.left()));
    try {
      return utf8.decode(await this.bytes(n, what));
    } catch (e) {
      if (/** @type {any} */ (e).code) throw e;
      throw bad(what, "not valid UTF-8");
    }
  }

  /** A value of type `t`: scalars as numbers (64-bit ones as BigInt), strings, arrays as {type, count, head}. @param {number} t @param {string} what @param {number} depth @returns {Promise<any>} */
  async value(t, what, depth = 0) {
    if (!(t in VALUE_SIZE)) throw error("CONVERT_UNSUPPORTED", `GGUF ${what}: value type ${t} is not one of 0-12`);
    if (t === 8) return this.str(what);
    if (t === 9) {
      if (depth >= MAX_ARRAY_DEPTH) throw bad(what, `arrays nest deeper than ${MAX_ARRAY_DEPTH}`);
      const et = await this.u32(`${what} element type`);
      if (!(et in VALUE_SIZE)) throw error("CONVERT_UNSUPPORTED", `GGUF ${what}: element type ${et} is not one of 0-12`);
      const min = VALUE_SIZE[et] ?? (et === 8 ? 8 : 12);
      const count = await this.u64(`${what} count`, Math.floor(this.left() / min));
      const head = [];
      for (let i = 0; i < count; i++) {
        const v = await this.value(et, `${what}[${i}]`, depth + 1);
        if (i < 8) head.push(v);
      }
      return { type: et, count, head };
    }
    const size = /** @type {number} */ (VALUE_SIZE[t]);
    const b = await this.bytes(size, what);
    const v = new DataView(b.buffer, b.byteOffset, size);
    return [() => v.getUint8(0), () => v.getInt8(0), () => v.getUint16(0, true), () => v.getInt16(0, true), () => v.getUint32(0, true),
      () => v.getInt32(0, true), () => v.getFloat32(0, true), () => v.getUint8(0) !== 0, null, null, () => v.getBigUint64(0, true),
      () => v.getBigInt64(0, true), () => v.getFloat64(0, true)][t]?.();
  }
}

/**
 * @typedef {object} GgufTensor
 * @property {string} name
 * @property {number} type  ggml type id
 * @property {string} typeName
 * @property {number[]} shape  NumPy order (GGUF's dims reversed)
 * @property {number} offset  relative to the data section
 * @property {number} bytes
 * @property {number} bitsPerWeight
 */

/**
 * Read a GGUF file's header.
 * @param {import("../src/source.js").AsyncByteSource & {prefix?: Uint8Array}} src
 * @returns {Promise<{version: number, alignment: number, dataStart: number, kv: Map<string, any>, tensors: GgufTensor[]}>}
 */
export async function readGguf(src) {
  const r = new HeaderReader(src);
  if (src.size < 24) throw bad("header", `the file is ${src.size} bytes, expected at least 24 (magic, version, tensor_count, kv_count)`);
  if (!isGguf(await r.bytes(4, "magic"))) throw bad("magic", "the file does not begin with GGUF");
  const version = await r.u32("version");
  if (version !== 2 && version !== 3) throw error("CONVERT_UNSUPPORTED", `GGUF version ${version}: only versions 2 and 3 are read`);
  // each tensor info takes at least 8 + 4 + 4 + 8 bytes, each key/value at least 8 + 4 + 1
  const nTensors = await r.u64("tensor_count", Math.floor(r.left() / 24));
  const nKv = await r.u64("kv_count", Math.floor(r.left() / 13));
  /** @type {Map<string, any>} */
  const kv = new Map();
  for (let i = 0; i < nKv; i++) {
    const key = await r.str(`key ${i}`, MAX_NAME_BYTES);
    if (kv.has(key)) throw bad(key, "the key appears twice");
    const t = await r.u32(`${key} type`);
    kv.set(key, await r.value(t, key));
  }
  const alignment = kv.has("general.alignment") ? Number(kv.get("general.alignment")) : 32;
  if (!(Number.isInteger(alignment) && alignment > 0 && (alignment & (alignment - 1)) === 0)) throw bad("general.alignment", `${alignment} is not a power of two`);
  /** @type {GgufTensor[]} */
  const tensors = [];
  const names = new Set();
  for (let i = 0; i < nTensors; i++) {
    const name = await r.str(`tensor ${i} name`, MAX_NAME_BYTES);
    if (names.has(name)) throw bad(name, "two tensors have this name");
    names.add(name);
    const nd = await r.u32(`${name} n_dims`);
    if (nd > MAX_DIMS) throw bad(`${name} n_dims`, `${nd} exceeds ${MAX_DIMS}`);
    const dims = [];
    let numel = 1;
    for (let d = 0; d < nd; d++) {
      const n = await r.u64(`${name} dim ${d}`, src.size * 8);  // no tensor has more elements than the file has bits
      dims.push(n);
      numel *= n;
    }
    if (numel > src.size * 8) throw bad(`${name} dims`, `${numel} elements cannot fit a file of ${src.size} bytes`);
    const type = await r.u32(`${name} type`);
    const info = /** @type {Record<number, [string, number, number]>} */ (GGML_TYPES)[type];
    if (!info) throw error("CONVERT_UNSUPPORTED", `GGUF tensor ${name}: ggml type ${type} is not known`, name);
    const [typeName, be, bs] = info;
    if ((dims[0] ?? 1) % be) throw bad(`${name} dims`, `the innermost dimension ${dims[0]} is not a multiple of ${typeName}'s block of ${be}`);
    const offset = await r.u64(`${name} offset`, src.size);
    const bytes = (numel / be) * bs;
    tensors.push({ name, type, typeName, shape: dims.slice().reverse(), offset, bytes, bitsPerWeight: (bs * 8) / be });
  }
  const dataStart = nTensors ? Math.ceil(r.pos / alignment) * alignment : r.pos;
  for (const t of tensors) {
    if (t.offset % alignment) throw bad(`${t.name} offset`, `${t.offset} is not a multiple of the alignment ${alignment}`);
    if (dataStart + t.offset + t.bytes > src.size) throw bad(`${t.name} offset`, `bytes ${t.offset}-${t.offset + t.bytes} of the data section lie past the end of the file`);
  }
  return { version, alignment, dataStart, kv, tensors };
}
