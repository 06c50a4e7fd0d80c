// qformat reader core: runs anywhere a Uint8Array does (browsers, Node, Deno, Bun).
// No Node API is used in src/ except by src/node.js.

import { parseHeader } from "./container.js";
import { QFormatError, error } from "./errors.js";
import { interpret, logicalNames, problems, storedOf } from "./model.js";
import { decode } from "./decode.js";
import { memorySource } from "./source.js";
import { checkPayload } from "./check.js";
import { DIGEST_DIGITS, digestProblems, sha256Hex } from "./digest.js";
import { allocate, checkLength } from "./alloc.js";
import { wasmDecode } from "./wasm.js";

export { QFormatError } from "./errors.js";
export { memorySource, bufferSource, blobSource, RangeCache } from "./source.js";
export { urlSource, PROBE_BYTES, DEADLINE_MS, MIN_BYTES_PER_SECOND } from "./http.js";
export { redactUrl, redactUrlsIn } from "./redact.js";
export { MAX_ARRAY_LENGTH } from "./alloc.js";
export { openAsync, openUrl, openBlob, openBytesAsync, checkAsync, fetchRanges, LazyFile, MAX_PARALLEL, PART_BYTES } from "./lazy.js";
export { parseStrict, JsonError } from "./json.js";
export { f32ToF16Bits, f32ToBf16Bits, f16ToF32, bf16ToF32, floatLut } from "./floats.js";
export { encodeSafetensors } from "./write.js";
export { sha256Hex } from "./digest.js";
export { initWasm, initWasmAsync, useWasm, wasmInfo, MIN_VALUES } from "./wasm.js";

/** @typedef {"float32"|"float16"|"bfloat16"|string} DType */
/**
 * @typedef {object} Tensor
 * @property {DType} dtype  logical dtype (qformat tensors) or safetensors dtype (plain tensors)
 * @property {number[]} shape
 * @property {Float32Array|Uint16Array|Uint8Array} data  float32: values; float16/bfloat16: bit
 *   patterns; plain tensors: their stored bytes (little-endian) as a Uint8Array
 * @property {boolean} quantized
 */

/** A sizes-checked, interpreted qformat (or plain safetensors) file. */
export class QFile {
  /**
   * @param {import("./source.js").ByteSource} src
   * @param {{verify?: boolean, sha256?: (bytes: Uint8Array) => string}} [opts]  verify: check a 1.2 file's
   *   digests (SPEC.md §3.8) of each tensor's stored bytes before it is first read
   */
  constructor(src, opts = {}) {
    this.src = src;
    this.header = parseHeader(src);
    this.model = interpret(this.header);
    if (this.model.fileProblems.length) throw this.model.fileProblems[0];
    this.verify = Boolean(opts.verify);
    this._sha256 = opts.sha256 ?? sha256Hex;
    /** @type {Set<string>} */
    this._verified = new Set();
    const dg = this.model.digests ?? null;
    if (this.verify && dg !== null && !DIGEST_DIGITS.has(dg.get("algorithm"))) throw digestProblems(dg, this.header, () => new Uint8Array(0), (s) => s)[0];
    /** @type {Map<string, Uint8Array>} */
    this._bytes = new Map();
    const h = this.header;
    this.store = {
      entry: (/** @type {string} */ n) => /** @type {import("./container.js").Entry} */ (h.entries.get(n)),
      bytes: (/** @type {string} */ n) => {
        let b = this._bytes.get(n);
        if (!b) {
          const e = /** @type {import("./container.js").Entry} */ (h.entries.get(n));
          checkLength(e.end - e.begin, `the ${e.end - e.begin} bytes of stored tensor ${JSON.stringify(n)}`, n);  // before the source allocates them
          b = src.read(h.dataStart + e.begin, e.end - e.begin);
          this._bytes.set(n, b);
        }
        return b;
      },
    };
  }

  /** Logical and plain tensor names, sorted by code point (components are not listed). */
  keys() {
    return logicalNames(this.model);
  }

  /** The file's __metadata__ without the 'qformat' member; null when the file has no __metadata__ (as safetensors). */
  metadata() {
    if (this.header.metadata === null) return null;
    return Object.fromEntries([...this.header.metadata].filter(([k]) => k !== "qformat"));
  }

  /** keys() in the order of their data in the file, as safetensors' load_file returns them: by the
   * (BEGIN, END) of a plain tensor or the smallest of a logical tensor's components, then by name. */
  fileOrder() {
    /** @type {Map<string, [number, number]>} */
    const first = new Map();
    const ents = this.header.entries;
    for (const [comp, owner] of this.model.components) {
      const e = /** @type {import("./container.js").Entry} */ (ents.get(comp));
      const f = first.get(owner);
      if (!f || e.begin < f[0] || (e.begin === f[0] && e.end < f[1])) first.set(owner, [e.begin, e.end]);
    }
    const at = (/** @type {string} */ n) => first.get(n) ?? (ents.has(n) ? [/** @type {any} */ (ents.get(n)).begin, /** @type {any} */ (ents.get(n)).end] : [-1, -1]);
    return this.keys().sort((x, y) => {
      const [a, b] = [at(x), at(y)];
      return a[0] - b[0] || a[1] - b[1] || (x < y ? -1 : x > y ? 1 : 0);
    });
  }

  /** Every problem found without decoding (file, then tensors). */
  problems() {
    return problems(this.model);
  }

  /** @param {string} name */
  _require(name) {
    if (!this.model.raw.has(name) && !this.model.plainSet.has(name)) throw error("TENSOR_NOT_FOUND", `no tensor named ${JSON.stringify(name)}`, name);
  }

  /** The descriptor of a logical tensor as parsed JSON (Maps turned into plain objects), or null for a plain tensor. @param {string} name */
  descriptor(name) {
    this._require(name);
    if (!this.model.raw.has(name)) return null;
    return toPlain(this.model.raw.get(name));
  }

  /** @param {string} name */
  isQuantized(name) {
    this._require(name);
    return this.model.raw.has(name);
  }

  /** @param {string} name */
  _validated(name) {
    const probs = this.model.tensorProblems.get(name);
    if (probs && probs.length) throw probs[0];
  }

  /** With `verify`: DIGEST_MISMATCH unless the stored tensors `name` reads have their recorded digests. @param {string} name */
  _checkDigests(name) {
    const dg = this.model.digests ?? null;
    if (!this.verify || dg === null || this._verified.has(name)) return;
    // a digest listed under the logical name itself (no stored tensor) refuses it too (SPEC.md §3.8)
    const stored = storedOf(this.model, name);
    const probs = digestProblems(dg, this.header, this.store.bytes, () => name, this._sha256, stored.includes(name) ? stored : [...stored, name]);
    if (probs.length) throw probs[0];
    this._verified.add(name);
  }

  /** The logical shape. @param {string} name @returns {number[]} */
  shape(name) {
    this._require(name);
    this._validated(name);
    if (this.model.raw.has(name)) return [.../** @type {any} */ (this.model.descriptors.get(name)).shape];
    const e = /** @type {import("./container.js").Entry} */ (this.header.entries.get(name));
    if (RAW_BYTES.has(e.dtype)) return [e.end - e.begin];
    return e.shape.map(Number);
  }

  /**
   * A box of a tensor (one [lo, hi) per axis; default: all of it), decoded.
   * @param {string} name @param {[number, number][]|null} [box] @returns {Tensor}
   */
  read(name, box = null) {
    this._require(name);
    this._validated(name);
    this._checkDigests(name);
    const shape = this.shape(name);
    const reg = box ?? shape.map((n) => /** @type {[number, number]} */ ([0, n]));
    if (reg.length !== shape.length || reg.some(([lo, hi], a) => !(Number.isInteger(lo) && Number.isInteger(hi) && lo >= 0 && lo <= hi && hi <= shape[a]))) {
      throw error("SLICE_INVALID", `expected ${shape.length} ranges [lo, hi) within the shape [${shape}]`, name);
    }
    const outShape = reg.map(([lo, hi]) => hi - lo);
    if (this.model.raw.has(name)) {
      const desc = /** @type {import("./descriptor.js").Descriptor} */ (this.model.descriptors.get(name));
      const alloc = (/** @type {number} */ n) => allocate(desc.dtype === "float32" ? Float32Array : Uint16Array, n, `the ${n} decoded ${desc.dtype} values`, name);
      const data = wasmDecode(this, name, desc, box, alloc) ?? decode(desc, this.store, box, name);
      return { dtype: desc.dtype, shape: outShape, data, quantized: true };
    }
    const e = /** @type {import("./container.js").Entry} */ (this.header.entries.get(name));
    const all = this.store.bytes(name);
    if (RAW_BYTES.has(e.dtype)) {  // §2.6: F6_* reads as its raw bytes, a 1-D U8 array
      return { dtype: "U8", shape: outShape, data: box === null ? all.slice() : all.slice(reg[0][0], reg[0][1]), quantized: false };
    }
    if (box === null) return { dtype: e.dtype, shape: outShape, data: all.slice(), quantized: false };
    if (e.dtype === "F4") {  // §2.6: value k in the low nibble of byte k >> 1 (odd), the high one (even); the box packed the same way
      const vals = allocate(Uint8Array, all.length * 2, "the values of an F4 tensor", name);
      for (let i = 0; i < all.length; i++) {
        vals[2 * i] = all[i] & 0x0f;
        vals[2 * i + 1] = all[i] >> 4;
      }
      const box4 = plainBox(vals, shape, reg, 1);
      const packed = new Uint8Array((box4.length + 1) >> 1);
      for (let k = 0; k < box4.length; k++) packed[k >> 1] |= k & 1 ? box4[k] << 4 : box4[k];
      return { dtype: e.dtype, shape: outShape, data: packed, quantized: false };
    }
    return { dtype: e.dtype, shape: outShape, data: plainBox(all, shape, reg, bytesPer(e.dtype)), quantized: false };
  }

  /** The whole tensor, decoded to its logical dtype (plain tensors: as stored). @param {string} name */
  getTensor(name) {
    return this.read(name, null);
  }

  /**
   * Rows [lo, hi) along axis 0, decoded.  Every value equals the whole tensor's (SPEC.md §8.4).
   * @param {string} name @param {[number, number]} rows
   */
  getSlice(name, rows) {
    const shape = this.shape(name);
    if (!shape.length) throw error("SLICE_INVALID", "a rank-0 tensor has no rows", name);
    return this.read(name, [rows, ...shape.slice(1).map((n) => /** @type {[number, number]} */ ([0, n]))]);
  }

  /** Every tensor, decoded; raises the first problem of the file (as a reader, SPEC.md §1.4). */
  loadAll() {
    const probs = this.problems();
    if (probs.length) throw probs[0];
    // SPEC.md 1.2.1 §3.8: a verifying whole-file request verifies every listed digest (a listed
    // name that is no stored tensor fails it too) after step 7 and before any decode-time check,
    // so a damaged file reports DIGEST_MISMATCH, not the symptom
    const dg = this.model.digests ?? null;
    if (this.verify && dg !== null) {
      const comps = this.model.components;
      const dp = digestProblems(dg, this.header, this.store.bytes, (s) => comps.get(s) ?? s, this._sha256);
      if (dp.length) throw dp[0];
      for (const name of this.keys()) this._verified.add(name);
    }
    // the decode-time checks (§10.6) in the code-point order of the names (§1.4, 1.2.1): decoded
    // in that order, returned in the order of their data (as safetensors' load_file)
    /** @type {Map<string, Tensor>} */
    const decoded = new Map();
    for (const name of this.keys()) decoded.set(name, this.getTensor(name));
    /** @type {Map<string, Tensor>} */
    const out = new Map();
    for (const name of this.fileOrder()) out.set(name, /** @type {Tensor} */ (decoded.get(name)));
    return out;
  }
}

/** Storage dtypes whose plain tensors read as raw bytes (SPEC.md §2.6). */
const RAW_BYTES = new Set(["F6_E2M3", "F6_E3M2"]);

/** @param {string} dtype */
function bytesPer(dtype) {
  return ({ BOOL: 1, U8: 1, I8: 1, U16: 2, I16: 2, F16: 2, BF16: 2, U32: 4, I32: 4, F32: 4, U64: 8, I64: 8, F64: 8, C64: 8 })[dtype] ?? 1;
}

/** @param {Uint8Array} all @param {number[]} shape @param {[number, number][]} reg @param {number} item */
function plainBox(all, shape, reg, item) {
  const size = reg.reduce((a, [lo, hi]) => a * (hi - lo), 1);
  const out = new Uint8Array(size * item);
  if (!size) return out;
  const st = [];
  let acc = 1;
  for (let a = shape.length - 1; a >= 0; a--) {
    st[a] = acc;
    acc *= shape[a];
  }
  const idx = reg.map(([lo]) => lo);
  for (let k = 0; k < size; k++) {
    let f = 0;
    for (let a = 0; a < idx.length; a++) f += idx[a] * st[a];
    out.set(all.subarray(f * item, f * item + item), k * item);
    for (let a = idx.length - 1; a >= 0; a--) {
      if (++idx[a] < reg[a][1]) break;
      idx[a] = reg[a][0];
    }
  }
  return out;
}

/** @param {any} v @returns {any} */
function toPlain(v) {
  if (v instanceof Map) return Object.fromEntries([...v].map(([k, x]) => [k, toPlain(x)]));
  if (Array.isArray(v)) return v.map(toPlain);
  return v;
}

/**
 * Open a qformat file held in memory.  Container and file-scope problems throw a QFormatError
 * (its `code` is the error code); a refused tensor throws when it is read.
 * @param {ArrayBuffer|ArrayBufferView} bytes
 * @param {{verify?: boolean, sha256?: (bytes: Uint8Array) => string}} [opts]  see QFile
 */
export function openFile(bytes, opts = {}) {
  return new QFile(memorySource(bytes), opts);
}

/** Open a file through any ByteSource. @param {import("./source.js").ByteSource} src */
export function openSource(src) {
  return new QFile(src);
}

/**
 * Every problem of a file, as a checker reports them (SPEC.md §12): container, file-scope and
 * tensor problems, the refusals of decoding (CODE_OUT_OF_RANGE, GROUP_INDEX_RANGE) and the payload
 * conditions of §12.4 (PADDING_NONZERO, PARAM_NONFINITE, PARAM_DIVISOR_ZERO, PARAM_INT_RANGE).
 * @param {ArrayBuffer|ArrayBufferView|import("./source.js").ByteSource} input
 * @param {{strict?: boolean, digests?: boolean, sha256?: (bytes: Uint8Array) => string}} [opts]  strict: also what
 *   readers accept but writers never write (SPEC.md §2.4); digests: also verify the digests of a 1.2 file
 *   (SPEC.md §3.8: DIGEST_MISMATCH, DIGEST_UNSUPPORTED; reads every stored byte); sha256: the hash to
 *   use (default: this package's portable one; the Node layer passes node:crypto's)
 * @returns {QFormatError[]}
 */
export function check(input, opts = {}) {
  const src = "read" in input && typeof input.read === "function" ? /** @type {import("./source.js").ByteSource} */ (input) : memorySource(/** @type {any} */ (input));
  let f;
  try {
    f = new QFile(src);
  } catch (e) {
    if (e instanceof QFormatError) return [e];
    throw e;
  }
  const out = [...(opts.strict ? f.header.lenient : []), ...f.problems()];
  // loops, not push(...list): a spread of a long list overflows the stack (issue 40)
  for (const [name, desc] of f.model.descriptors) for (const p of checkPayload(name, desc, f.store)) out.push(p);
  if (opts.digests) {
    const comps = f.model.components;
    for (const p of digestProblems(f.model.digests ?? null, f.header, f.store.bytes, (s) => comps.get(s) ?? s, opts.sha256)) out.push(p);
  }
  return out;
}
