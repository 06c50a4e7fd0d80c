// qformat reader core: runs anywhere a Uint8Array does (browsers, Node, Deno, Bun).
// No Node API is used in src/ except by src/node.js.

import { parseHeader } from "./container.js";
import { QFormatError, error } from "./errors.js";
import { interpret, logicalNames, problems } from "./model.js";
import { decode } from "./decode.js";
import { memorySource } from "./source.js";
import { checkPayload } from "./check.js";

export { QFormatError } from "./errors.js";
export { memorySource } from "./source.js";
export { parseStrict, JsonError } from "./json.js";
export { f32ToF16Bits, f32ToBf16Bits, f16ToF32, bf16ToF32, floatLut } from "./floats.js";
export { encodeSafetensors } from "./write.js";

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
  /** @param {import("./source.js").ByteSource} src */
  constructor(src) {
    this.src = src;
    this.header = parseHeader(src);
    this.model = interpret(this.header);
    if (this.model.fileProblems.length) throw this.model.fileProblems[0];
    /** @type {Map<string, Uint8Array>} */
    this._bytes = new Map();
    const h = this.header;
    this.store = {
      entry: (/** @type {string} */ n) => /** @type {import("./container.js").Entry} */ (h.entries.get(n)),
      bytes: (/** @type {string} */ n) => {
        let b = this._bytes.get(n);
        if (!b) {
          const e = /** @type {import("./container.js").Entry} */ (h.entries.get(n));
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

  /** The file's __metadata__ without the 'qformat' member. */
  metadata() {
    return Object.fromEntries([...(this.header.metadata ?? new Map())].filter(([k]) => k !== "qformat"));
  }

  /** Every problem found without decoding (file, then tensors). */
  problems() {
    return problems(this.model);
  }

  /** @param {string} name */
  _require(name) {
    if (!this.model.raw.has(name) && !this.model.plain.includes(name)) throw error("TENSOR_NOT_FOUND", `no tensor named ${JSON.stringify(name)}`, name);
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

  /** The logical shape. @param {string} name @returns {number[]} */
  shape(name) {
    this._require(name);
    this._validated(name);
    if (this.model.raw.has(name)) return [.../** @type {any} */ (this.model.descriptors.get(name)).shape];
    return /** @type {any} */ (this.header.entries.get(name)).shape.map(Number);
  }

  /**
   * A box of a tensor (one [lo, hi) per axis; default: all of it), decoded.
   * @param {string} name @param {[number, number][]|null} [box] @returns {Tensor}
   */
  read(name, box = null) {
    this._require(name);
    this._validated(name);
    const shape = this.shape(name);
    const reg = box ?? shape.map((n) => /** @type {[number, number]} */ ([0, n]));
    if (reg.length !== shape.length || reg.some(([lo, hi], a) => !(Number.isInteger(lo) && Number.isInteger(hi) && lo >= 0 && lo <= hi && hi <= shape[a]))) {
      throw error("SLICE_INVALID", `expected ${shape.length} ranges [lo, hi) within the shape [${shape}]`, name);
    }
    const outShape = reg.map(([lo, hi]) => hi - lo);
    if (this.model.raw.has(name)) {
      const desc = /** @type {import("./descriptor.js").Descriptor} */ (this.model.descriptors.get(name));
      return { dtype: desc.dtype, shape: outShape, data: decode(desc, this.store, box, name), quantized: true };
    }
    const e = /** @type {import("./container.js").Entry} */ (this.header.entries.get(name));
    const all = this.store.bytes(name);
    if (box === null) return { dtype: e.dtype, shape: outShape, data: all.slice(), quantized: false };
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
    /** @type {Map<string, Tensor>} */
    const out = new Map();
    for (const name of this.keys()) out.set(name, this.getTensor(name));
    return out;
  }
}

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
 */
export function openFile(bytes) {
  return new QFile(memorySource(bytes));
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
 * @returns {QFormatError[]}
 */
export function check(input) {
  const src = "read" in input && typeof input.read === "function" ? /** @type {import("./source.js").ByteSource} */ (input) : memorySource(/** @type {any} */ (input));
  let f;
  try {
    f = new QFile(src);
  } catch (e) {
    if (e instanceof QFormatError) return [e];
    throw e;
  }
  const out = f.problems();
  for (const [name, desc] of f.model.descriptors) out.push(...checkPayload(name, desc, f.store));
  return out;
}
