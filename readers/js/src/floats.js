// Exact float conversions (SPEC.md §6.3, §9.2, §10.3), on bit patterns: no rounding happens
// except where the specification says so, and subnormals are kept.

import { FLOAT_FORMATS } from "./tables.js";

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** The binary32 bit pattern of a binary32 value. @param {number} x */
export function f32Bits(x) {
  f32[0] = x;
  return u32[0];
}

/** The binary32 value of a bit pattern. @param {number} bits */
export function f32FromBits(bits) {
  u32[0] = bits >>> 0;
  return f32[0];
}

/** binary16 bits -> exact binary32 value. @param {number} h */
export function f16ToF32(h) {
  const s = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  if (e === 0x1f) return m ? NaN : s * Infinity;
  if (e === 0) return s * m * 2 ** -24;
  return s * (1024 + m) * 2 ** (e - 25);
}

/** @type {Float32Array|null} */
let f16Values = null;

/** The exact binary32 value of every binary16 bit pattern (built once, 256 KB). */
export function f16Table() {
  if (!f16Values) {
    f16Values = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) f16Values[h] = f16ToF32(h);
  }
  return f16Values;
}

/** bfloat16 bits -> exact binary32 value. @param {number} h */
export function bf16ToF32(h) {
  return f32FromBits((h & 0xffff) << 16);
}

/**
 * binary32 value -> binary16 bits, IEEE round to nearest even; overflow to Inf; subnormals kept.
 * @param {number} x  a binary32 value
 */
export function f32ToF16Bits(x) {
  const u = f32Bits(x);
  const sign = (u >>> 16) & 0x8000;
  const exp = (u >>> 23) & 0xff;
  const mant = u & 0x7fffff;
  if (exp === 0xff) return sign | (mant ? 0x7e00 : 0x7c00);
  if (exp >= 113) {
    // normal binary16 range or above: (exp - 112) is the binary16 exponent
    if (exp > 142) return sign | 0x7c00;
    let h = ((exp - 112) << 10) | (mant >>> 13);
    const rem = mant & 0x1fff;
    if (rem > 0x1000 || (rem === 0x1000 && h & 1)) h++; // a carry may reach 0x7c00 (Inf): correct
    return sign | h;
  }
  // subnormal binary16 (or zero): value = m * 2^(e - 150), in units of 2^-24 that is m / 2^shift
  const m = exp === 0 ? mant : mant | 0x800000;
  const shift = 126 - (exp === 0 ? 1 : exp);
  if (shift > 24) return sign;
  const q = m >>> shift;
  const rem = m - q * 2 ** shift;
  const half = 2 ** (shift - 1);
  const h = rem > half || (rem === half && q & 1) ? q + 1 : q;
  return sign | h;
}

/** binary32 value -> bfloat16 bits (SPEC.md §10.3). @param {number} x */
export function f32ToBf16Bits(x) {
  if (Number.isNaN(x)) return 0x7fc0;
  const w = f32Bits(x);
  return Math.floor((w + 0x7fff + ((w >>> 16) & 1)) / 65536) & 0xffff;
}

/** @type {Map<string, Float32Array>} */
const lutCache = new Map();

/**
 * Values of every code of a float element format (SPEC.md §6.3), as binary32.
 * @param {string} fmt @returns {Float32Array}
 */
export function floatLut(fmt) {
  let out = lutCache.get(fmt);
  if (out) return out;
  const spec = FLOAT_FORMATS[/** @type {keyof typeof FLOAT_FORMATS} */ (fmt)];
  const E = spec.exponent_bits;
  const M = spec.mantissa_bits;
  const B = spec.bias;
  const n = 2 ** spec.bits;
  out = new Float32Array(n);
  for (let u = 0; u < n; u++) {
    const s = spec.signed && (u >> (E + M)) & 1 ? -1 : 1;
    const ex = (u >> M) & ((1 << E) - 1);
    const m = u & ((1 << M) - 1);
    const allE = ex === (1 << E) - 1;
    let v;
    if (spec.specials === "ieee" && allE) v = m === 0 ? s * Infinity : NaN;
    else if (spec.specials === "nan_all_ones" && allE && m === (1 << M) - 1) v = NaN;
    else if (M === 0) v = 2 ** (ex - B);
    else if (ex === 0) v = s * m * 2 ** (1 - B - M);
    else v = s * (2 ** M + m) * 2 ** (ex - B - M);
    out[u] = v;
  }
  lutCache.set(fmt, out);
  return out;
}

/**
 * Values of every code of an integer element (SPEC.md §6.2).
 * @param {number} bits @param {string} signedness @param {number} codeOffset @param {number} fracBits
 */
export function intLut(bits, signedness, codeOffset, fracBits) {
  const n = 2 ** bits;
  const out = new Float32Array(n);
  for (let u = 0; u < n; u++) {
    const w = (u + codeOffset) % n;
    let v = w;
    if (signedness === "twos_complement") v = w >= n / 2 ? w - n : w;
    else if (signedness === "offset_binary") v = w - n / 2;
    out[u] = v * 2 ** -fracBits;
  }
  return out;
}

/**
 * Round a binary32 value to a logical dtype and widen it back (an encoded parameter's value, §9.3).
 * @param {number} x @param {string} dtype
 */
export function roundTrip(x, dtype) {
  if (dtype === "float16") return f16ToF32(f32ToF16Bits(x));
  if (dtype === "bfloat16") return bf16ToF32(f32ToBf16Bits(x));
  return x;
}
