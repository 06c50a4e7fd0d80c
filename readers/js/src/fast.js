// The fast decode path (SPEC.md §7-§10 for the common packings): codes of 1, 2, 4 or 8 bits in
// a byte stream (8-bit containers, or little-endian 16/32-bit containers filled lsb_first),
// packed along the last axis (or as one stream, axis null) in logical order, no slot order or
// planes, and parameters on grid or flat blocks without a group index.  The values are the
// general path's bit for bit: the same binary32 operations in the same order, one rounding each.
//
// Per row of the region, the row is cut into segments on which every parameter is constant.
// Where all parameters share their block length and a segment is at least as long as the code
// table, the segment's values come from a small table (the element value of every code with the
// parameter steps applied, each step rounded to binary32 by the Float32Array store) and the
// codes are looked up in it, one byte at a time, copying bit patterns through Int32Array views.
// Otherwise the element values are looked up first and each parameter is applied in place, one
// pass per parameter, with the parameter value hoisted out of the segment's loop.

/** @typedef {import("./descriptor.js").Descriptor} Descriptor */
/** @typedef {[number, number][]} Region */

export const OP_SUB = 0;
export const OP_MUL = 1;
export const OP_DIV = 2;
export const OP_ADD = 3;

/**
 * A parameter step of a chunk: its binary32 values (`vals`) and where each row's cells are.
 * `cellOf(rowLin, lead, lo)` returns [first cell, phase] of the row's element `lo`: the element
 * j of the row uses cell first + floor((phase + j - lo) / period).
 * @typedef {{op: number, vals: Float32Array, period: number, flat: boolean,
 *            cellOf: (rowLin: number, lead: number[], lo: number) => [number, number]}} Step
 */

let enabled = true;

/** Turn the fast path off (every decode takes the general path) or on again; for tests. @param {boolean} on */
export function setFastPath(on) {
  enabled = !!on;
}

/**
 * Whether the fast path decodes `region` of `desc` (packing only; the caller checks the element
 * table and the parameters).
 * @param {Descriptor} desc
 */
export function fastPacking(desc) {
  if (!enabled || desc.layout !== "canonical") return false;
  const shape = desc.shape;
  const r = shape.length;
  if (r === 0) return false;
  const p = desc.codes.packing;
  const b = desc.codes.element.bits;
  if (b !== 1 && b !== 2 && b !== 4 && b !== 8) return false;
  if (p.axis !== null && p.axis !== r - 1) return false;
  if (p.order && p.order.length && !p.order.every((v, i) => v === i)) return false;
  if (p.planes_span !== null) return false;
  if (p.slot_order && !p.slot_order.every((v, i) => v === i)) return false;
  if (p.bit_order !== "lsb_first" && p.container !== 8) return false;
  return true;
}

/**
 * Decode the rows of `region` into `x` (row-major over the region).
 * @param {Descriptor} desc @param {Uint8Array} codes the codes tensor's bytes
 * @param {number} rowBytes bytes per stored row (axis = last) or 0 (axis null: one stream)
 * @param {Region} region @param {Float32Array} lut element value of every code (2^bits entries)
 * @param {Step[]} steps the parameters in the order zero, scale, bias @param {Float32Array} x
 */
export function decodeRows(desc, codes, rowBytes, region, lut, steps, x) {
  const shape = desc.shape;
  const r = shape.length;
  const C = shape[r - 1];
  const [lo, hi] = region[r - 1];
  const n = hi - lo;
  const bits = desc.codes.element.bits;
  const msb = desc.codes.packing.bit_order === "msb_first";
  const T = lut.length;
  const x32 = new Int32Array(x.buffer, x.byteOffset, x.length);
  const stream = desc.codes.packing.axis === null;
  // the table path: every step has the same block length and kind, and segments are long enough
  let table = steps.length === 0;
  // one multiply on short segments: element value times the parameter, no table
  const direct = steps.length === 1 && steps[0].op === OP_MUL && steps[0].period <= 4 * T;
  if (!table && !direct) {
    const p0 = steps[0].period;
    table = p0 >= T && steps.every((s) => s.period === p0 && s.flat === steps[0].flat);
  }
  const c32 = new Uint32Array(codes.buffer, 0, codes.buffer.byteLength >> 2);
  const t = new Float32Array(T);
  const t32 = new Int32Array(t.buffer);
  const lut32 = new Int32Array(lut.buffer, lut.byteOffset, T);
  if (!steps.length) t.set(lut);
  const cells = new Array(steps.length).fill(0);
  // leading axes: iterate the region's rows in row-major order
  const lead = region.slice(0, r - 1).map(([a]) => a);
  const rows = region.slice(0, r - 1).reduce((a, [l, h]) => a * (h - l), 1);
  const leadStrides = new Array(r - 1);
  for (let a = r - 2, acc = 1; a >= 0; a--) {
    leadStrides[a] = acc;
    acc *= shape[a];
  }
  let oo = 0;
  for (let row = 0; row < rows; row++) {
    let rowLin = 0;
    for (let a = 0; a < r - 1; a++) rowLin += lead[a] * leadStrides[a];
    const bo = stream ? 0 : rowLin * rowBytes;
    const pos0 = stream ? rowLin * C : 0; // code position of the row's element 0 from byte bo
    const xo = oo - lo; // x index of the row's element j: xo + j
    if (direct) {
      const st = steps[0];
      let [c, phase] = st.cellOf(rowLin, lead, lo);
      const period = st.period;
      const vals = st.vals;
      const cpw = 32 / bits; // codes per 32-bit word
      if (bits >= 4 && (hi - lo) % cpw === 0 && phase % cpw === 0 && (period === Infinity || period % cpw === 0) && headOf(codes, bo, pos0, lo, hi, bits) === 0) {
        // the whole row in words, segments of whole words: no per-segment call
        const q = (codes.byteOffset + bo + ((pos0 + lo) * bits) / 8) >> 2;
        const words = (hi - lo) / cpw;
        const first = period === Infinity ? words : (period - phase) / cpw;
        mulRow(c32, q, words, first, period === Infinity ? words : period / cpw, vals, c, lut, x, xo + lo, bits, msb);
        oo += n;
        for (let a = r - 2; a >= 0; a--) {
          if (++lead[a] < region[a][1]) break;
          lead[a] = region[a][0];
        }
        continue;
      }
      let j = lo;
      let end = Math.min(hi, lo + period - phase);
      while (j < hi) {
        multiply(codes, c32, bo, pos0, j, end, bits, msb, lut, vals[c], x, xo);
        c++;
        j = end;
        end = Math.min(hi, end + period);
      }
    } else if (table) {
      if (!steps.length) lookup(codes, c32, bo, pos0, lo, hi, bits, msb, t32, x32, xo);
      else {
        let phase = 0;
        for (let s = 0; s < steps.length; s++) {
          const [c, ph] = steps[s].cellOf(rowLin, lead, lo);
          cells[s] = c;
          phase = ph;
        }
        const period = steps[0].period;
        let j = lo;
        let end = Math.min(hi, lo + period - phase);
        while (j < hi) {
          buildTable(t, lut, steps, cells);
          lookup(codes, c32, bo, pos0, j, end, bits, msb, t32, x32, xo);
          for (let s = 0; s < cells.length; s++) cells[s]++;
          j = end;
          end = Math.min(hi, end + period);
        }
      }
    } else {
      lookup(codes, c32, bo, pos0, lo, hi, bits, msb, lut32, x32, xo);
      for (const st of steps) {
        let [c, phase] = st.cellOf(rowLin, lead, lo);
        const period = st.period;
        const vals = st.vals;
        let j = lo;
        let end = Math.min(hi, lo + period - phase);
        while (j < hi) {
          applyStep(x, xo + j, xo + end, st.op, vals[c]);
          c++;
          j = end;
          end = Math.min(hi, end + period);
        }
      }
    }
    oo += n;
    for (let a = r - 2; a >= 0; a--) {
      if (++lead[a] < region[a][1]) break;
      lead[a] = region[a][0];
    }
  }
}

/**
 * t[k] = the value of code k after every step (one binary32 rounding per step, by the store).
 * @param {Float32Array} t @param {Float32Array} lut @param {Step[]} steps @param {number[]} cells
 */
function buildTable(t, lut, steps, cells) {
  const T = t.length;
  for (let s = 0; s < steps.length; s++) {
    const src = s === 0 ? lut : t;
    const v = steps[s].vals[cells[s]];
    switch (steps[s].op) {
      case OP_MUL: for (let k = 0; k < T; k++) t[k] = src[k] * v; break;
      case OP_SUB: for (let k = 0; k < T; k++) t[k] = src[k] - v; break;
      case OP_DIV: for (let k = 0; k < T; k++) t[k] = src[k] / v; break;
      default: for (let k = 0; k < T; k++) t[k] = src[k] + v;
    }
  }
}

/**
 * x[a..e) = x[a..e) op v, each result rounded to binary32 by the store.
 * @param {Float32Array} x @param {number} a @param {number} e @param {number} op @param {number} v
 */
function applyStep(x, a, e, op, v) {
  switch (op) {
    case OP_MUL: for (let k = a; k < e; k++) x[k] = x[k] * v; break;
    case OP_SUB: for (let k = a; k < e; k++) x[k] = x[k] - v; break;
    case OP_DIV: for (let k = a; k < e; k++) x[k] = x[k] / v; break;
    default: for (let k = a; k < e; k++) x[k] = x[k] + v;
  }
}

/** Whether this platform's typed arrays are little-endian (the word loops need it). */
const LITTLE = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * The code at position p of the byte stream starting at byte bo.
 * @param {Uint8Array} codes @param {number} bo @param {number} p @param {number} bits @param {boolean} msb
 */
function codeAt(codes, bo, p, bits, msb) {
  if (bits === 8) return codes[bo + p];
  const per = 8 / bits;
  const slot = p % per;
  const shift = msb ? 8 - (slot + 1) * bits : slot * bits;
  return (codes[bo + Math.floor(p / per)] >> shift) & ((1 << bits) - 1);
}

/**
 * How many of elements [a, e) precede the first whole 32-bit word of the buffer: the head of
 * single codes before the word loop.  -1 where there are no word loops (1- and 2-bit codes, a
 * big-endian platform).
 * @param {Uint8Array} codes @param {number} bo @param {number} pos0 @param {number} a @param {number} e @param {number} bits
 */
function headOf(codes, bo, pos0, a, e, bits) {
  if (!LITTLE || bits < 4) return -1;
  const w = bits === 8 ? 4 : 8; // codes per word
  const A = (codes.byteOffset + bo) * (w >> 2) + pos0 + a; // code index from the buffer's start
  const head = (w - (A % w)) % w;
  return head < e - a ? head : e - a;
}

/**
 * x32[xo + j] = t32[code of element j] for j in [a, e): bit patterns copied, nothing rounded.
 * The code of element j is at position pos0 + j of the byte stream starting at byte bo.
 * @param {Uint8Array} codes @param {Uint32Array} c32 the whole buffer as words
 * @param {number} bo @param {number} pos0 @param {number} a @param {number} e
 * @param {number} bits @param {boolean} msb @param {Int32Array} t32 @param {Int32Array} x32 @param {number} xo
 */
function lookup(codes, c32, bo, pos0, a, e, bits, msb, t32, x32, xo) {
  let head = headOf(codes, bo, pos0, a, e, bits);
  let words = 0;
  if (head < 0) head = e - a;
  else words = Math.floor((e - a - head) / (32 / bits));
  let j = a;
  for (const h = a + head; j < h; j++) x32[xo + j] = t32[codeAt(codes, bo, pos0 + j, bits, msb)];
  if (words) {
    let k = xo + j;
    let q = (codes.byteOffset + bo + ((pos0 + j) * bits) / 8) >> 2;
    const qEnd = q + words;
    if (bits === 8) {
      for (; q < qEnd; q++, k += 4) {
        const c = c32[q];
        x32[k] = t32[c & 255];
        x32[k + 1] = t32[(c >>> 8) & 255];
        x32[k + 2] = t32[(c >>> 16) & 255];
        x32[k + 3] = t32[c >>> 24];
      }
    } else if (msb) {
      for (; q < qEnd; q++, k += 8) {
        const c = c32[q];
        x32[k] = t32[(c >>> 4) & 15];
        x32[k + 1] = t32[c & 15];
        x32[k + 2] = t32[(c >>> 12) & 15];
        x32[k + 3] = t32[(c >>> 8) & 15];
        x32[k + 4] = t32[(c >>> 20) & 15];
        x32[k + 5] = t32[(c >>> 16) & 15];
        x32[k + 6] = t32[c >>> 28];
        x32[k + 7] = t32[(c >>> 24) & 15];
      }
    } else {
      for (; q < qEnd; q++, k += 8) {
        const c = c32[q];
        x32[k] = t32[c & 15];
        x32[k + 1] = t32[(c >>> 4) & 15];
        x32[k + 2] = t32[(c >>> 8) & 15];
        x32[k + 3] = t32[(c >>> 12) & 15];
        x32[k + 4] = t32[(c >>> 16) & 15];
        x32[k + 5] = t32[(c >>> 20) & 15];
        x32[k + 6] = t32[(c >>> 24) & 15];
        x32[k + 7] = t32[c >>> 28];
      }
    }
    j += words * (32 / bits);
  }
  for (; j < e; j++) x32[xo + j] = t32[codeAt(codes, bo, pos0 + j, bits, msb)];
}

/**
 * x[xo + j] = lut[code of element j] * v for j in [a, e) (binary32 product, rounded by the store).
 * @param {Uint8Array} codes @param {Uint32Array} c32 @param {number} bo @param {number} pos0 @param {number} a
 * @param {number} e @param {number} bits @param {boolean} msb @param {Float32Array} lut @param {number} v
 * @param {Float32Array} x @param {number} xo
 */
function multiply(codes, c32, bo, pos0, a, e, bits, msb, lut, v, x, xo) {
  let head = headOf(codes, bo, pos0, a, e, bits);
  let words = 0;
  if (head < 0) head = e - a;
  else words = Math.floor((e - a - head) / (32 / bits));
  let j = a;
  for (const h = a + head; j < h; j++) x[xo + j] = lut[codeAt(codes, bo, pos0 + j, bits, msb)] * v;
  if (words) {
    let k = xo + j;
    let q = (codes.byteOffset + bo + ((pos0 + j) * bits) / 8) >> 2;
    const qEnd = q + words;
    if (bits === 8) {
      for (; q < qEnd; q++, k += 4) {
        const c = c32[q];
        x[k] = lut[c & 255] * v;
        x[k + 1] = lut[(c >>> 8) & 255] * v;
        x[k + 2] = lut[(c >>> 16) & 255] * v;
        x[k + 3] = lut[c >>> 24] * v;
      }
    } else if (msb) {
      for (; q < qEnd; q++, k += 8) {
        const c = c32[q];
        x[k] = lut[(c >>> 4) & 15] * v;
        x[k + 1] = lut[c & 15] * v;
        x[k + 2] = lut[(c >>> 12) & 15] * v;
        x[k + 3] = lut[(c >>> 8) & 15] * v;
        x[k + 4] = lut[(c >>> 20) & 15] * v;
        x[k + 5] = lut[(c >>> 16) & 15] * v;
        x[k + 6] = lut[c >>> 28] * v;
        x[k + 7] = lut[(c >>> 24) & 15] * v;
      }
    } else {
      for (; q < qEnd; q++, k += 8) {
        const c = c32[q];
        x[k] = lut[c & 15] * v;
        x[k + 1] = lut[(c >>> 4) & 15] * v;
        x[k + 2] = lut[(c >>> 8) & 15] * v;
        x[k + 3] = lut[(c >>> 12) & 15] * v;
        x[k + 4] = lut[(c >>> 16) & 15] * v;
        x[k + 5] = lut[(c >>> 20) & 15] * v;
        x[k + 6] = lut[(c >>> 24) & 15] * v;
        x[k + 7] = lut[c >>> 28] * v;
      }
    }
    j += words * (32 / bits);
  }
  for (; j < e; j++) x[xo + j] = lut[codeAt(codes, bo, pos0 + j, bits, msb)] * v;
}

/**
 * x[k..] = lut[code] * vals[c + segment] for `words` whole words of codes from word q of the
 * buffer: the first segment has `first` words, the others `per` words each.  One flat loop over
 * the words (the parameter is re-read per word: cheaper than a loop per segment).
 * @param {Uint32Array} c32 @param {number} q @param {number} words @param {number} first @param {number} per
 * @param {Float32Array} vals @param {number} c @param {Float32Array} lut @param {Float32Array} x @param {number} k
 * @param {number} bits @param {boolean} msb
 */
function mulRow(c32, q, words, first, per, vals, c, lut, x, k, bits, msb) {
  const qLast = q + words;
  if (bits === 4 && !msb && first === per && (per & (per - 1)) === 0) {
    // segments of 2^sh words from the row's first word: the segment of word q is (q - q0) >> sh
    const sh = 31 - Math.clz32(per);
    for (let i = 0; q < qLast; q++, i++, k += 8) {
      const v = vals[c + (i >>> sh)];
      const w = c32[q];
      x[k] = lut[w & 15] * v;
      x[k + 1] = lut[(w >>> 4) & 15] * v;
      x[k + 2] = lut[(w >>> 8) & 15] * v;
      x[k + 3] = lut[(w >>> 12) & 15] * v;
      x[k + 4] = lut[(w >>> 16) & 15] * v;
      x[k + 5] = lut[(w >>> 20) & 15] * v;
      x[k + 6] = lut[(w >>> 24) & 15] * v;
      x[k + 7] = lut[w >>> 28] * v;
    }
    return;
  }
  let v = vals[c];
  let left = first; // words left in the current segment
  if (bits === 8) {
    for (; q < qLast; q++, k += 4) {
      if (left === 0) {
        v = vals[++c];
        left = per;
      }
      left--;
      const w = c32[q];
      x[k] = lut[w & 255] * v;
      x[k + 1] = lut[(w >>> 8) & 255] * v;
      x[k + 2] = lut[(w >>> 16) & 255] * v;
      x[k + 3] = lut[w >>> 24] * v;
    }
  } else if (msb) {
    for (; q < qLast; q++, k += 8) {
      if (left === 0) {
        v = vals[++c];
        left = per;
      }
      left--;
      const w = c32[q];
      x[k] = lut[(w >>> 4) & 15] * v;
      x[k + 1] = lut[w & 15] * v;
      x[k + 2] = lut[(w >>> 12) & 15] * v;
      x[k + 3] = lut[(w >>> 8) & 15] * v;
      x[k + 4] = lut[(w >>> 20) & 15] * v;
      x[k + 5] = lut[(w >>> 16) & 15] * v;
      x[k + 6] = lut[w >>> 28] * v;
      x[k + 7] = lut[(w >>> 24) & 15] * v;
    }
  } else {
    for (; q < qLast; q++, k += 8) {
      if (left === 0) {
        v = vals[++c];
        left = per;
      }
      left--;
      const w = c32[q];
      x[k] = lut[w & 15] * v;
      x[k + 1] = lut[(w >>> 4) & 15] * v;
      x[k + 2] = lut[(w >>> 8) & 15] * v;
      x[k + 3] = lut[(w >>> 12) & 15] * v;
      x[k + 4] = lut[(w >>> 16) & 15] * v;
      x[k + 5] = lut[(w >>> 20) & 15] * v;
      x[k + 6] = lut[(w >>> 24) & 15] * v;
      x[k + 7] = lut[w >>> 28] * v;
    }
  }
}
