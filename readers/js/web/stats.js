// The numbers the page shows, without the DOM (so Node tests them): a tensor's row of the table,
// its decoded values as numbers, a histogram, and the SQNR of one tensor against another.

import { DTYPES } from "../src/tables.js";
import { bf16ToF32, f16ToF32, floatLut } from "../src/floats.js";

/**
 * The table row of tensor `name` of a LazyFile: scheme, shape, logical dtype, stored bytes and
 * bits per weight.  A tensor the file refuses gives its error instead of the shape.
 * @param {import("../src/lazy.js").LazyFile} f @param {string} name
 */
export function tensorRow(f, name) {
  const h = f.file.header;
  const bytes = f.stored(name).reduce((s, n) => {
    const e = /** @type {import("../src/container.js").Entry} */ (h.entries.get(n));
    return s + (e.end - e.begin);
  }, 0);
  const desc = f.descriptor(name);
  const row = {
    name,
    scheme: desc ? String(desc.scheme ?? "(none)") : "plain",
    dtype: desc ? String(desc.dtype) : /** @type {any} */ (h.entries.get(name)).dtype,
    bytes,
    shape: /** @type {number[]|null} */ (null),
    bitsPerWeight: /** @type {number|null} */ (null),
    error: /** @type {string|null} */ (null),
  };
  try {
    row.shape = f.shape(name);
  } catch (e) {
    row.error = /** @type {any} */ (e).code ?? String(e);
    return row;
  }
  const numel = row.shape.reduce((a, b) => a * b, 1);
  row.bitsPerWeight = numel ? (bytes * 8) / numel : null;
  if (!desc && DTYPES[/** @type {keyof typeof DTYPES} */ (row.dtype)] && numel) row.bitsPerWeight = DTYPES[/** @type {keyof typeof DTYPES} */ (row.dtype)].bits;
  return row;
}

/** Plain storage dtypes whose stored bytes read as numbers, and how. */
const PLAIN = {
  F32: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getFloat32(4 * i, true),
  F64: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getFloat64(8 * i, true),
  F16: (/** @type {DataView} */ v, /** @type {number} */ i) => f16ToF32(v.getUint16(2 * i, true)),
  BF16: (/** @type {DataView} */ v, /** @type {number} */ i) => bf16ToF32(v.getUint16(2 * i, true)),
  I8: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getInt8(i),
  U8: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getUint8(i),
  BOOL: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getUint8(i),
  I16: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getInt16(2 * i, true),
  U16: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getUint16(2 * i, true),
  I32: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getInt32(4 * i, true),
  U32: (/** @type {DataView} */ v, /** @type {number} */ i) => v.getUint32(4 * i, true),
  I64: (/** @type {DataView} */ v, /** @type {number} */ i) => Number(v.getBigInt64(8 * i, true)),
  U64: (/** @type {DataView} */ v, /** @type {number} */ i) => Number(v.getBigUint64(8 * i, true)),
};
/** @type {Record<string, string>} */
const PLAIN_FP8 = { F8_E4M3: "e4m3fn", F8_E5M2: "e5m2", F8_E8M0: "e8m0fnu" };

/**
 * A decoded tensor's values as numbers (Float64Array), or null for a dtype that has none
 * (complex, fp6, fp4 and FNUZ plain tensors).
 * @param {import("../src/index.js").Tensor} t
 */
export function toNumbers(t) {
  const d = t.data;
  if (t.dtype === "float32") return Float64Array.from(/** @type {Float32Array} */ (d));
  if (t.dtype === "float16") return Float64Array.from(/** @type {Uint16Array} */ (d), f16ToF32);
  if (t.dtype === "bfloat16") return Float64Array.from(/** @type {Uint16Array} */ (d), bf16ToF32);
  if (PLAIN_FP8[t.dtype]) {
    const lut = floatLut(PLAIN_FP8[t.dtype]);
    return Float64Array.from(/** @type {Uint8Array} */ (d), (c) => lut[c]);
  }
  const get = PLAIN[/** @type {keyof typeof PLAIN} */ (t.dtype)];
  if (!get) return null;
  const v = new DataView(d.buffer, d.byteOffset, d.byteLength);
  const n = d.byteLength / (DTYPES[/** @type {keyof typeof DTYPES} */ (t.dtype)].bits / 8);
  const out = new Float64Array(n);
  for (let i = 0; i < n; i++) out[i] = get(v, i);
  return out;
}

/**
 * A histogram of the finite values in `bins` equal bins over [min, max]; NaN and infinities are counted apart.
 * @param {Float64Array} xs @param {number} [bins]
 */
export function histogram(xs, bins = 64) {
  let lo = Infinity;
  let hi = -Infinity;
  let nonfinite = 0;
  for (const x of xs) {
    if (!Number.isFinite(x)) nonfinite++;
    else {
      if (x < lo) lo = x;
      if (x > hi) hi = x;
    }
  }
  const counts = new Array(bins).fill(0);
  if (lo > hi) return { lo: 0, hi: 0, counts, nonfinite };
  const w = hi > lo ? (hi - lo) / bins : 1;
  for (const x of xs) {
    if (Number.isFinite(x)) counts[Math.min(bins - 1, Math.floor((x - lo) / w))]++;
  }
  return { lo, hi, counts, nonfinite };
}

/**
 * Signal-to-quantization-noise ratio of `y` against the reference `x`, in dB:
 * 10 log10(sum x^2 / sum (x - y)^2).  Infinity when they are equal, NaN when either has a
 * non-finite value or the lengths differ.
 * @param {Float64Array} x @param {Float64Array} y
 */
export function sqnr(x, y) {
  if (x.length !== y.length) return NaN;
  let s = 0;
  let e = 0;
  for (let i = 0; i < x.length; i++) {
    const d = x[i] - y[i];
    s += x[i] * x[i];
    e += d * d;
  }
  if (!Number.isFinite(s) || !Number.isFinite(e)) return NaN;
  if (e === 0) return Infinity;
  return 10 * Math.log10(s / e);
}

/** A byte count for people: 1536 -> "1.5 KiB". @param {number} n */
export function human(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return i ? `${n.toFixed(1)} ${u[i]}` : `${n} B`;
}
