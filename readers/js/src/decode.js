// Decoding (SPEC.md §7-§10): unpacking codes from containers, element values, parameter grids
// (plain, group-indexed, flat, encoded), binary32 arithmetic with one rounding per step (a
// Float32Array store rounds a float64 result of one operation on binary32 operands, which is the
// binary32 operation: float64 has more than 2*24+2 significand bits), then the cast of §10.3.
//
// The order in which a tensor is refused while decoding follows the reference implementation:
// the tensor is decoded in chunks of rows along axis 0 (2^18 elements, kept whole on parameter
// blocks); in each chunk the codes are checked against the codebook (CODE_OUT_OF_RANGE), then
// each parameter in the order zero, scale, bias: its group index (GROUP_INDEX_RANGE), then its
// nested descriptor, recursively.

import { CODEBOOKS } from "./tables.js";
import { error } from "./errors.js";
import { allocate } from "./alloc.js";
import { gridShape, params, storedGridShape, usesSlots, wordsPerRow } from "./descriptor.js";
import { bf16ToF32, f16Table, f32FromBits, f32ToF16Bits, floatLut, intLut, roundTrip } from "./floats.js";
import { scaleToCanonical, unpackDevice } from "./layouts.js";
import { OP_ADD, OP_DIV, OP_MUL, OP_SUB, decodeRows, fastPacking } from "./fast.js";

/** @typedef {import("./descriptor.js").Descriptor} Descriptor */
/** @typedef {import("./descriptor.js").Param} Param */
/** @typedef {[number, number][]} Region */

const CHUNK_ELEMENTS = 1 << 18;

/**
 * Everything a decode reads: stored tensors by name, as bytes.
 * @typedef {object} Store
 * @property {(name: string) => import("./container.js").Entry} entry
 * @property {(name: string) => Uint8Array} bytes   the stored tensor's bytes
 */

/** @param {Uint8Array} b @param {number} c @returns {(k: number) => number} */
function wordReader(b, c) {
  if (c === 8) return (k) => b[k];
  if (c === 16) return (k) => b[2 * k] | (b[2 * k + 1] << 8);
  return (k) => (b[4 * k] | (b[4 * k + 1] << 8) | (b[4 * k + 2] << 16) | (b[4 * k + 3] << 24)) >>> 0;
}

/** @param {number[]} shape */
function strides(shape) {
  const s = new Array(shape.length);
  let acc = 1;
  for (let a = shape.length - 1; a >= 0; a--) {
    s[a] = acc;
    acc *= shape[a];
  }
  return s;
}

/** @param {Region} region */
const regionSize = (region) => region.reduce((a, [lo, hi]) => a * (hi - lo), 1);

/**
 * Call fn(index, k) for every index of `region` in row-major order (k counts from 0).
 * The index array is reused between calls.
 * @param {Region} region @param {(idx: number[], k: number) => void} fn
 */
function forEachIndex(region, fn) {
  const r = region.length;
  const total = regionSize(region);
  if (total === 0) return;
  const idx = region.map(([lo]) => lo);
  for (let k = 0; k < total; k++) {
    fn(idx, k);
    for (let a = r - 1; a >= 0; a--) {
      if (++idx[a] < region[a][1]) break;
      idx[a] = region[a][0];
    }
  }
}

/**
 * The 2^bits binary32 element values and how many codes are valid (SPEC.md §6).
 * @param {Descriptor} desc @param {Store} store
 */
export function elementTable(desc, store) {
  const el = desc.codes.element;
  const n = 2 ** el.bits;
  if (el.type === "int") return { table: intLut(el.bits, /** @type {string} */ (el.signedness), el.code_offset, el.frac_bits), valid: n };
  if (el.type === "float") return { table: floatLut(/** @type {string} */ (el.format)), valid: n };
  const table = new Float32Array(n).fill(NaN);
  let values;
  if (el.table != null) values = CODEBOOKS[/** @type {keyof typeof CODEBOOKS} */ (el.table)].values_f32.map((h) => f32FromBits(parseInt(h, 16)));
  else values = Array.from(widen(store, /** @type {string} */ (el.table_tensor)));
  table.set(values.slice(0, n));
  return { table, valid: values.length };
}

/** Bits per element of the stored dtypes a parameter or table may have. */
const WIDEN_BITS = { F32: 32, F16: 16, BF16: 16, I8: 8, U8: 8, I16: 16, U16: 16, I32: 32, U32: 32, F8_E4M3: 8, F8_E5M2: 8, F8_E8M0: 8 };
const F8_FORMATS = { F8_E4M3: "e4m3fn", F8_E5M2: "e5m2", F8_E8M0: "e8m0fnu" };

/**
 * out[at..at+len) = the stored values [f, f+len) of a tensor of `dtype`, widened exactly to
 * binary32 (SPEC.md §9.2; I32/U32 are rounded to nearest even by the store).
 * @param {string} dtype @param {Uint8Array} b @param {number} f @param {number} len
 * @param {Float32Array} out @param {number} at
 */
function widenInto(dtype, b, f, len, out, at) {
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const end = at + len;
  switch (dtype) {
    case "F32": for (let k = at, i = 4 * f; k < end; k++, i += 4) out[k] = dv.getFloat32(i, true); break;
    case "F16": {
      const t = f16Table();
      for (let k = at, i = 2 * f; k < end; k++, i += 2) out[k] = t[b[i] | (b[i + 1] << 8)];
      break;
    }
    case "BF16": for (let k = at, i = 2 * f; k < end; k++, i += 2) out[k] = bf16ToF32(b[i] | (b[i + 1] << 8)); break;
    case "I8": for (let k = at, i = f; k < end; k++, i++) out[k] = (b[i] << 24) >> 24; break;
    case "U8": for (let k = at, i = f; k < end; k++, i++) out[k] = b[i]; break;
    case "I16": for (let k = at, i = 2 * f; k < end; k++, i += 2) out[k] = dv.getInt16(i, true); break;
    case "U16": for (let k = at, i = 2 * f; k < end; k++, i += 2) out[k] = dv.getUint16(i, true); break;
    case "I32": for (let k = at, i = 4 * f; k < end; k++, i += 4) out[k] = dv.getInt32(i, true); break;
    case "U32": for (let k = at, i = 4 * f; k < end; k++, i += 4) out[k] = dv.getUint32(i, true); break;
    default: {
      const fmt = F8_FORMATS[/** @type {keyof typeof F8_FORMATS} */ (dtype)];
      if (fmt === undefined) throw new Error(`cannot widen ${dtype}`);
      const t = floatLut(fmt);
      for (let k = at, i = f; k < end; k++, i++) out[k] = t[b[i]];
    }
  }
}

/**
 * A stored float or integer tensor's values widened exactly to binary32 (SPEC.md §9.2).
 * @param {Store} store @param {string} name @returns {Float32Array}
 */
export function widen(store, name) {
  const e = store.entry(name);
  const b = store.bytes(name);
  const bits = WIDEN_BITS[/** @type {keyof typeof WIDEN_BITS} */ (e.dtype)];
  if (bits === undefined) throw new Error(`cannot widen ${e.dtype}`);
  const n = (b.length * 8) / bits;
  const out = allocate(Float32Array, n, `the values of stored tensor ${JSON.stringify(name)}`);
  widenInto(e.dtype, b, 0, n, out, 0);
  return out;
}

/**
 * The codes of `region` (logical order), row-major over the region.
 * `mark(word, shift, nbits)`, when given, is told which bits of which container each code uses.
 * @param {Descriptor} desc @param {Store} store @param {Region} region
 * @param {((word: number, shift: number, nbits: number) => void)|null} [mark] @returns {Uint8Array}
 */
export function readCodes(desc, store, region, mark = null) {
  const out = new Uint8Array(regionSize(region));
  const shape = desc.shape;
  if (desc.layout !== "canonical") {
    const w = wordReader(store.bytes(desc.codes.tensor), 32);
    const q = unpackDevice(desc, w);
    const K = shape[1];
    forEachIndex(region, (i, k) => {
      out[k] = q[i[0] * K + i[1]];
    });
    return out;
  }
  const p = desc.codes.packing;
  const b = desc.codes.element.bits;
  const c = p.container;
  const rank = shape.length;
  const order = p.order && p.order.length ? p.order : shape.map((_, a) => a);
  const stored = order.map((a) => shape[a]);
  const L = p.axis === null ? stored.reduce((x, y) => x * y, 1) : stored[p.axis];
  const W = Number(wordsPerRow(p, BigInt(L), b));
  const word = wordReader(store.bytes(desc.codes.tensor), c);
  const mask = (1 << b) - 1;
  const lsb = p.bit_order === "lsb_first";
  const slots = usesSlots(p, b);
  const n = Math.floor(c / b);
  const inv = new Array(n);
  if (p.slot_order) p.slot_order.forEach((v, s) => { inv[v] = s; });
  else for (let s = 0; s < n; s++) inv[s] = s;
  const T = p.planes_span;
  const perSeg = T === null ? 0 : Math.ceil(T / n);
  /** @param {number} pos @param {number} base @param {number} stride */
  const codeAt = (pos, base, stride) => {
    if (slots) {
      let q, s;
      if (T === null) {
        q = Math.floor(pos / n);
        s = inv[pos % n];
      } else {
        const g = Math.floor(pos / T);
        const o = pos - g * T;
        const Tg = Math.min(T, L - g * T);
        const Mg = Math.ceil(Tg / n);
        q = g * perSeg + (o % Mg);
        s = inv[Math.floor(o / Mg)];
      }
      const shift = lsb ? s * b : c - (s + 1) * b;
      if (mark) mark(base + q * stride, shift, b);
      return (word(base + q * stride) >>> shift) & mask;
    }
    const k0 = pos * b;
    const q = Math.floor(k0 / c);
    const t = k0 - q * c;
    const w0 = word(base + q * stride);
    if (t + b <= c) {
      if (mark) mark(base + q * stride, lsb ? t : c - t - b, b);
      return lsb ? (w0 >>> t) & mask : (w0 >>> (c - t - b)) & mask;
    }
    const first = c - t; // bits in w0
    const rest = b - first; // bits in the next container
    if (mark) {
      mark(base + q * stride, lsb ? t : 0, first);
      mark(base + (q + 1) * stride, lsb ? 0 : c - rest, rest);
    }
    const w1 = word(base + (q + 1) * stride);
    if (lsb) return ((w0 >>> t) & ((1 << first) - 1)) | ((w1 & ((1 << rest) - 1)) << first);
    return ((w0 & ((1 << first) - 1)) << rest) | ((w1 >>> (c - rest)) & ((1 << rest) - 1));
  };
  const si = new Array(rank);
  if (p.axis === null) {
    const st = strides(stored);
    forEachIndex(region, (i, k) => {
      let pos = 0;
      for (let j = 0; j < rank; j++) pos += i[order[j]] * st[j];
      out[k] = codeAt(pos, 0, 1);
    });
    return out;
  }
  const ax = p.axis;
  const comp = [...stored];
  comp[ax] = W;
  const cs = strides(comp);
  forEachIndex(region, (i, k) => {
    let base = 0;
    for (let j = 0; j < rank; j++) {
      si[j] = i[order[j]];
      if (j !== ax) base += si[j] * cs[j];
    }
    out[k] = codeAt(si[ax], base, cs[ax]);
  });
  return out;
}

/**
 * Group index values [lo, hi) as Numbers, range-checked (SPEC.md §8.2).
 * @param {Param} prm @param {Store} store @param {number} lo @param {number} hi @param {string|null} tensor
 */
function groupIndex(prm, store, lo, hi, tensor) {
  const gi = /** @type {import("./descriptor.js").GroupIndex} */ (prm.blocks.index);
  const e = store.entry(gi.tensor);
  const b = store.bytes(gi.tensor);
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength);
  const out = new Array(hi - lo);
  for (let k = lo; k < hi; k++) {
    let v;
    switch (e.dtype) {
      case "I8": v = dv.getInt8(k); break;
      case "U8": v = dv.getUint8(k); break;
      case "I16": v = dv.getInt16(2 * k, true); break;
      case "U16": v = dv.getUint16(2 * k, true); break;
      case "I32": v = dv.getInt32(4 * k, true); break;
      case "U32": v = dv.getUint32(4 * k, true); break;
      default: {
        const x = dv.getBigInt64(8 * k, true);
        v = x < 0n ? -1 : x >= BigInt(gi.count) ? gi.count : Number(x);
      }
    }
    if (v < 0 || v >= gi.count) {
      throw error("GROUP_INDEX_RANGE", `group index at position ${k} is outside 0..${gi.count - 1}`, tensor, `${prm.role}.blocks.index.tensor`);
    }
    out[k - lo] = v;
  }
  return out;
}

/**
 * The decode-time checks of SPEC.md §10.6 on `region` of `desc`, in the order §1.4 (1.2.1) fixes
 * for one tensor, before any value is computed (so a tensor decoded in chunks still reports its
 * codes before its parameters): the codes the region uses against the codebook
 * (CODE_OUT_OF_RANGE), then each parameter in the order zero, scale, bias: the group index values
 * the region uses (GROUP_INDEX_RANGE), then its nested descriptor, checked whole.
 * @param {Descriptor} desc @param {Store} store @param {Region} region @param {string|null} tensor
 */
function precheck(desc, store, region, tensor) {
  const { table, valid } = elementTable(desc, store);
  if (valid < table.length && regionSize(region) > 0) {
    const codes = readCodes(desc, store, region);
    let max = -1;
    for (let i = 0; i < codes.length; i++) if (codes[i] > max) max = codes[i];
    if (max >= valid) throw error("CODE_OUT_OF_RANGE", `code ${max} is past the end of a ${valid}-entry codebook`, tensor, "codes.tensor");
  }
  for (const prm of params(desc)) {
    const gi = prm.blocks.index;
    if (gi !== null && regionSize(region) > 0) groupIndex(prm, store, region[gi.axis][0], region[gi.axis][1], tensor);
    if (prm.encoded !== null) checkNestedWhole(prm.encoded, store, tensor);
  }
}

/** @type {WeakMap<Store, WeakSet<Descriptor>>} nested descriptors whose whole check passed, per store */
const checkedWhole = new WeakMap();

/**
 * SPEC.md 1.2.1 §10.6: the nested descriptor of an encoded parameter is checked whole, whether or
 * not an element of the outer tensor uses a cell: every code of its codes component, every value
 * of its group indices, its own nested descriptors (precheck over its whole shape).  Once per store.
 * @param {Descriptor} desc @param {Store} store @param {string|null} tensor
 */
function checkNestedWhole(desc, store, tensor) {
  let seen = checkedWhole.get(store);
  if (seen?.has(desc)) return;
  precheck(desc, store, desc.shape.map((n) => /** @type {[number, number]} */ ([0, n])), tensor);
  if (!seen) checkedWhole.set(store, (seen = new WeakSet()));
  seen.add(desc);
}

/**
 * The binary32 values of the grid cells `box` of a parameter, row-major over the box.
 * @param {Param} prm @param {Descriptor} desc @param {Store} store @param {Region} box
 * @param {number} depth @param {string|null} tensor @param {Map<Param, Float32Array>} cache
 */
function gridValues(prm, desc, store, box, depth, tensor, cache) {
  if (prm.encoded !== null) {
    const enc = prm.encoded;
    checkNestedWhole(enc, store, tensor);
    const x = decodeRegion(enc, store, box, depth + 1, tensor);
    if (enc.dtype !== "float32") for (let i = 0; i < x.length; i++) x[i] = roundTrip(x[i], enc.dtype);
    return x;
  }
  const stored = storedGridShape(prm, desc.shape).map(Number);
  const st = strides(stored);
  const q = stored.length;
  const out = new Float32Array(regionSize(box));
  const identity = !(prm.order && prm.order.length) || prm.order.every((v, i) => v === i);
  if (identity && desc.layout === "canonical") {
    // the box's runs along the last axis, widened straight from the stored bytes
    const name = /** @type {string} */ (prm.tensor);
    const dtype = store.entry(name).dtype;
    const bytes = store.bytes(name);
    if (q === 0) {
      widenInto(dtype, bytes, 0, 1, out, 0);
      return out;
    }
    const [l0, h0] = box[q - 1];
    const len = h0 - l0;
    if (!out.length) return out;
    forEachIndex(/** @type {Region} */ ([...box.slice(0, q - 1), [0, 1]]), (g, k) => {
      let f = l0;
      for (let j = 0; j < q - 1; j++) f += g[j] * st[j];
      widenInto(dtype, bytes, f, len, out, k * len);
    });
    return out;
  }
  let all = cache.get(prm);
  if (!all) {
    all = widen(store, /** @type {string} */ (prm.tensor));
    if (depth === 0 && prm === desc.scale) all = scaleToCanonical(desc, all);
    cache.set(prm, all);
  }
  const order = prm.order && prm.order.length ? prm.order : stored.map((_, a) => a);
  const src = all;
  forEachIndex(box, (g, k) => {
    let f = 0;
    for (let j = 0; j < q; j++) f += g[order[j]] * st[j];
    out[k] = src[f];
  });
  return out;
}

/**
 * A parameter of the fast path for `region`: its values on the region's cells and where each
 * row's cells start (the same cells, hence the same box of the grid, as the general path).
 * @param {Param} prm @param {Descriptor} desc @param {Store} store @param {Region} region
 * @param {number} depth @param {string|null} tensor @param {Map<Param, Float32Array>} cache
 * @returns {import("./fast.js").Step}
 */
function fastStep(prm, desc, store, region, depth, tensor, cache) {
  const b = prm.blocks;
  const r = region.length;
  const op = prm.role === "zero" ? OP_SUB : prm.op === "multiply" ? OP_MUL : prm.op === "divide" ? OP_DIV : prm.op === "add" ? OP_ADD : OP_SUB;
  const C = desc.shape[r - 1];
  if (b.type === "flat") {
    const S = b.size;
    const st = strides(desc.shape);
    let f0 = 0;
    let f1 = 0;
    for (let a = 0; a < r; a++) {
      f0 += region[a][0] * st[a];
      f1 += (region[a][1] - 1) * st[a];
    }
    const c0 = Math.floor(f0 / S);
    const vals = gridValues(prm, desc, store, [[c0, Math.floor(f1 / S) + 1]], depth, tensor, cache);
    return {
      op, vals, period: S, flat: true,
      cellOf: (rowLin, _lead, lo) => {
        const f = rowLin * C + lo;
        return [Math.floor(f / S) - c0, f % S];
      },
    };
  }
  const size = b.size;
  /** @type {Region} */
  const box = region.map(([lo, hi], a) => (size[a] === null ? [0, 1] : [Math.floor(lo / /** @type {number} */ (size[a])), Math.floor((hi - 1) / /** @type {number} */ (size[a])) + 1]));
  const vals = gridValues(prm, desc, store, box, depth, tensor, cache);
  const bs = strides(box.map(([lo, hi]) => hi - lo));
  const sl = size[r - 1];
  return {
    op, vals, period: sl === null ? Infinity : sl, flat: false,
    cellOf: (_rowLin, lead, lo) => {
      let base = 0;
      for (let a = 0; a < r - 1; a++) {
        const s = size[a];
        base += ((s === null ? 0 : Math.floor(lead[a] / s)) - box[a][0]) * bs[a];
      }
      if (sl === null) return [base, 0];
      return [base + Math.floor(lo / sl) - box[r - 1][0], lo % sl];
    },
  };
}

/**
 * Decode `region` of a descriptor to binary32, before the cast to its logical dtype.
 * @param {Descriptor} desc @param {Store} store @param {Region} region @param {number} depth @param {string|null} tensor
 * @param {Float32Array|null} [dst]  where to write the values (default: a new array)
 * @param {Map<Param, Float32Array>|null} [cache]  widened parameter tensors, shared by a decode's chunks
 * @returns {Float32Array}
 */
export function decodeRegion(desc, store, region, depth, tensor, dst = null, cache = null) {
  const { table, valid } = elementTable(desc, store);
  const size = regionSize(region);
  /** @type {Map<Param, Float32Array>} */
  const pcache = cache ?? new Map();
  cache = pcache;
  if (valid >= table.length && size > 0 && fastPacking(desc) && params(desc).every((p) => p.blocks.index === null)) {
    const x = dst ?? new Float32Array(size);
    // parameters in the order zero, scale, bias, as the general path (nested decodes may refuse)
    const steps = params(desc).map((prm) => fastStep(prm, desc, store, region, depth, tensor, pcache));
    const p = desc.codes.packing;
    const rowBytes = p.axis === null ? 0 : (Number(wordsPerRow(p, BigInt(desc.shape[region.length - 1]), desc.codes.element.bits)) * p.container) / 8;
    decodeRows(desc, store.bytes(desc.codes.tensor), rowBytes, region, table, steps, x);
    return x;
  }
  const codes = readCodes(desc, store, region);
  if (valid < table.length) {
    let max = -1;
    for (let i = 0; i < codes.length; i++) if (codes[i] > max) max = codes[i];
    if (max >= valid) throw error("CODE_OUT_OF_RANGE", `code ${max} is past the end of a ${valid}-entry codebook`, tensor, "codes.tensor");
  }
  const x = new Float32Array(codes.length);
  for (let i = 0; i < codes.length; i++) x[i] = table[codes[i]];
  for (const prm of params(desc)) {
    const b = prm.blocks;
    /** @type {Int32Array|Float64Array} */
    let cellOf;
    let v;
    if (b.type === "flat") {
      const st = strides(desc.shape);
      const cells = new Float64Array(x.length);
      let c0 = Infinity;
      let c1 = -Infinity;
      forEachIndex(region, (i, k) => {
        let f = 0;
        for (let a = 0; a < i.length; a++) f += i[a] * st[a];
        const c = Math.floor(f / b.size);
        cells[k] = c;
        if (c < c0) c0 = c;
        if (c > c1) c1 = c;
      });
      if (!x.length) c0 = c1 = 0;
      else c1 += 1;
      for (let k = 0; k < cells.length; k++) cells[k] -= c0;
      v = gridValues(prm, desc, store, [[c0, c1]], depth, tensor, cache);
      cellOf = cells;
    } else {
      const rank = region.length;
      /** @type {number[][]} */
      const rel = [];
      /** @type {Region} */
      const box = [];
      for (let a = 0; a < rank; a++) {
        const [lo, hi] = region[a];
        let cells;
        if (b.index !== null && a === b.index.axis) cells = groupIndex(prm, store, lo, hi, tensor);
        else {
          const s = b.size[a];
          cells = [];
          for (let pos = lo; pos < hi; pos++) cells.push(s === null ? 0 : Math.floor(pos / s));
        }
        let c0 = Infinity;
        let c1 = -Infinity;
        for (const c of cells) {
          if (c < c0) c0 = c;
          if (c > c1) c1 = c;
        }
        if (!cells.length) c0 = c1 = 0;
        else c1 += 1;
        box.push([c0, c1]);
        rel.push(cells.map((c) => c - c0));
      }
      v = gridValues(prm, desc, store, box, depth, tensor, cache);
      const bs = strides(box.map(([lo, hi]) => hi - lo));
      const cells = new Float64Array(x.length);
      forEachIndex(region, (i, k) => {
        let f = 0;
        for (let a = 0; a < rank; a++) f += rel[a][i[a] - region[a][0]] * bs[a];
        cells[k] = f;
      });
      cellOf = cells;
    }
    const op = prm.role === "zero" ? "subtract" : prm.op;
    const n = x.length;
    if (op === "subtract") for (let k = 0; k < n; k++) x[k] = x[k] - v[cellOf[k]];
    else if (op === "multiply") for (let k = 0; k < n; k++) x[k] = x[k] * v[cellOf[k]];
    else if (op === "divide") for (let k = 0; k < n; k++) x[k] = x[k] / v[cellOf[k]];
    else for (let k = 0; k < n; k++) x[k] = x[k] + v[cellOf[k]];
  }
  if (dst) {
    dst.set(x);
    return dst;
  }
  return x;
}

/** @param {number} a @param {number} b */
const gcd = (a, b) => {
  while (b) [a, b] = [b, a % b];
  return a;
};

/** Rows per chunk that keep parameter blocks whole along axis 0 (as the reference). @param {Descriptor} desc */
function rowMultiple(desc) {
  let m = 1;
  const inner = desc.shape.slice(1).reduce((a, b) => a * b, 1);
  for (const prm of params(desc)) {
    const b = prm.blocks;
    let k;
    if (b.type === "flat") k = b.size / gcd(b.size, Math.max(1, inner));
    else if (b.index !== null && b.index.axis === 0) k = 1;
    else k = b.size[0] || 1;
    m = (m * k) / gcd(m, k);
  }
  return m <= 4096 ? m : 1;
}

/**
 * Decode `region` (default: all) of a validated descriptor to its logical dtype: Float32Array for
 * float32, the bit patterns in a Uint16Array for float16 and bfloat16.
 * @param {Descriptor} desc @param {Store} store @param {Region|null} region @param {string|null} tensor
 * @returns {Float32Array|Uint16Array}
 */
export function decode(desc, store, region, tensor) {
  const reg = region ?? desc.shape.map((n) => /** @type {[number, number]} */ ([0, n]));
  const size = regionSize(reg);
  const out = allocate(desc.dtype === "float32" ? Float32Array : Uint16Array, size, `the ${size} decoded ${desc.dtype} values`, tensor);
  if (size === 0) return out;
  precheck(desc, store, reg, tensor);
  const put = (/** @type {Float32Array} */ x, /** @type {number} */ at) => {
    if (desc.dtype === "float32") out.set(x, at);
    else if (desc.dtype === "float16") for (let i = 0; i < x.length; i++) out[at + i] = f32ToF16Bits(x[i]);
    else {
      // SPEC.md §10.3's bfloat16 rule (f32ToBf16Bits) on the binary32 bits: NaN -> 0x7fc0, else
      // (w + 0x7fff + bit 16 of w) >> 16; ToUint32 of a sum below 2^33 keeps bits 16..31 exact
      const w32 = new Uint32Array(x.buffer, x.byteOffset, x.length);
      for (let i = 0; i < w32.length; i++) {
        const w = w32[i];
        out[at + i] = (w & 0x7fffffff) > 0x7f800000 ? 0x7fc0 : ((w + 0x7fff + ((w >>> 16) & 1)) >>> 16) & 0xffff;
      }
    }
  };
  /** @type {Map<Param, Float32Array>} */
  const cache = new Map();
  if (reg.length === 0) {
    put(decodeRegion(desc, store, reg, 0, tensor, null, cache), 0);
    return out;
  }
  const row = Math.max(1, regionSize(reg.slice(1)));
  const mult = rowMultiple(desc);
  const step = Math.max(mult, Math.floor(Math.max(1, Math.floor(CHUNK_ELEMENTS / row)) / mult) * mult);
  const [lo0, hi0] = reg[0];
  const f32 = desc.dtype === "float32";
  /** @type {Float32Array|null} */
  let tmp = null;
  for (let start = lo0; start < hi0; start += step) {
    const end = Math.min(hi0, start + step);
    const sub = /** @type {Region} */ ([[start, end], ...reg.slice(1)]);
    const at = (start - lo0) * row;
    const len = (end - start) * row;
    if (f32) decodeRegion(desc, store, sub, 0, tensor, /** @type {Float32Array} */ (out).subarray(at, at + len), cache);
    else {
      if (!tmp || tmp.length < len) tmp = new Float32Array(len);
      put(decodeRegion(desc, store, sub, 0, tensor, tmp.subarray(0, len), cache), at);
    }
  }
  return out;
}

export { gridShape };
