/* qformat native GGUF block quantizers (issue 25): the bytes of ggml's quantize_row_<type>_ref.
 *
 * The same algorithms as qformat/schemes/ggml_blocks.py (the NumPy reference, which states the
 * rules and their sources: llama.cpp's ggml/src/ggml-quants.c), block by block in C.  Bit
 * exactness rests on the build: -ffp-contract=off (no fused multiply-add; ggml-base is built
 * without contraction on x86) and no -ffast-math (every float expression evaluated as written,
 * in binary32, true division, subnormals kept), exactly as llama-quantize evaluates it.
 *
 * F16 conversion is done on the bits (round to nearest even, as GGML_FP32_TO_FP16), so the file
 * needs no F16C.  Float to integer conversions of NaN or Inf, which C leaves undefined and ggml
 * meets only for blocks whose values are all below ~1e-38, are done explicitly as x86 does them
 * (INT_MIN), so the bytes do not depend on the compiler.
 *
 * One call quantizes n blocks of one type; it releases the GIL and qformat.schemes.gguf spreads
 * chunks of rows over threads (the bytes never depend on the split).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define QK 32
#define QK_K 256
#define GROUP_MAX_EPS 1e-15f

/* x86's cvttss2si: truncation toward zero, INT_MIN for NaN or out of range. */
static inline int32_t trunc_i32(float v) {
    if (!(v > -2147483648.0f && v < 2147483648.0f)) return INT32_MIN;
    return (int32_t)v;
}

/* ggml's nearest_int (x + 1.5 * 2^23, bits): round half to even for |x| < 2^22; the bits
 * trick itself for anything else, as ggml computes it. */
static inline int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: Inf */
    if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero in F16 */
        if (ax < 0x33000000u) return (uint16_t)sign; /* below 2^-25: rounds to 0 (2^-25 itself ties to even 0) */
        uint32_t e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = ax + 0xfffu + ((ax >> 13) & 1u); /* round to nearest even at bit 13 */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ffu, x;
    if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* subnormal: normalise */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            x = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else if (e == 31) {
        x = sign | 0x7f800000u | (m << 13);
    } else {
        x = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

static inline void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

static inline float get16(const uint8_t *p) { return f16_to_f32((uint16_t)(p[0] | (p[1] << 8))); }

#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

/* -- 32-element types ------------------------------------------------------------------------- */
/* The codes q[32] of a 32-element block at qs: for 5 bits first their fifth bits as one
 * little-endian uint32 (bit j: element j), then the low nibbles (byte j: elements j and j + 16). */
static void pack_legacy(uint8_t *qs, const uint8_t *q, int bits) {
    if (bits == 5) {
        uint32_t qh = 0;
        for (int j = 0; j < QK; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        for (int k = 0; k < 4; k++) qs[k] = (uint8_t)(qh >> (8 * k));
        qs += 4;
    }
    for (int j = 0; j < QK / 2; j++) qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
}

static void q4_0_like(const float *x, uint8_t *y, int nmax, int bits) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK; j++) {
        const float v = x[j];
        if (amax < fabsf(v)) {
            amax = fabsf(v);
            max = v;
        }
    }
    const float d = max / (float)-nmax;
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    const float off = (float)nmax + 0.5f;
    const int top = (1 << bits) - 1;
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) q[j] = (uint8_t)MIN(top, (int8_t)trunc_i32(x[j] * id + off));
    pack_legacy(y + 2, q, bits);
}

static void q4_1_like(const float *x, uint8_t *y, int bits) {
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int j = 0; j < QK; j++) {
        const float v = x[j];
        if (v < min) min = v;
        if (v > max) max = v;
    }
    const float d = (max - min) / (float)((1 << bits) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    put16(y + 2, f32_to_f16(min));
    uint8_t q[QK];
    for (int j = 0; j < QK; j++) {
        const int32_t t = trunc_i32((x[j] - min) * id + 0.5f);
        q[j] = bits == 4 ? (uint8_t)MIN(15, (int8_t)t) : (uint8_t)t;
    }
    pack_legacy(y + 4, q, bits);
}

/* roundf (half away from zero) to int8 as ggml's (int8_t)roundf(v) is evaluated on x86:
 * exact without the libm call for |v| < 2^23 (v - trunc(v) is exact there), roundf itself
 * (then x86's INT_MIN for NaN or Inf) otherwise. */
static inline int8_t round_i8(float v) {
    if (!(fabsf(v) < 8388608.0f)) return (int8_t)trunc_i32(roundf(v));
    int32_t i = (int32_t)v;
    const float f = v - (float)i;
    i += (f >= 0.5f) - (f <= -0.5f);
    return (int8_t)i;
}

static void q8_0(const float *x, uint8_t *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    for (int j = 0; j < QK; j++) y[2 + j] = (uint8_t)round_i8(x[j] * id);
}

/* -- K-quant helpers (ggml's make_qkx2_quants, make_qx_quants with rmse_type 1, make_q3_quants) */
static float make_qkx2(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *the_min, uint8_t *Laux,
                       float rmin, float rdelta, int nstep, int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAX(0, MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAX(0, MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* The first element of largest magnitude (ggml's ``if (ax > amax)`` loop): its magnitude, and
 * in *max its value (0 when every element is 0). */
static float absmax(int n, const float *x, float *max) {
    float amax = 0;
    *max = 0;
    for (int i = 0; i < n; ++i) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            *max = x[i];
        }
    }
    return amax;
}

/* One candidate scale of make_qx_quants / make_q3_quants: codes clamp(nearest(iscale x)) and
 * the x^2-weighted sums sum(w x l), sum(w l l) in ggml's order; codes stored as l + offset
 * when L is given. */
static void fit_codes(int n, int nmax, const float *x, const float *qw, float iscale, int8_t *L, int offset, float *sumlx,
                      float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        if (L) L[i] = (int8_t)(l + offset);
        float w = qw ? qw[i] : x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* make_qx_quants with rmse_type 1: weights qw (the importance-weighted quantizers) or, NULL, x^2. */
static float make_qx(int n, int nmax, const float *x, int8_t *L, const float *qw) {
    float max;
    if (absmax(n, x, &max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float sumlx, suml2;
    fit_codes(n, nmax, x, qw, -nmax / max, L, nmax, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        fit_codes(n, nmax, x, qw, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            fit_codes(n, nmax, x, qw, iscale, L, nmax, &sumlx, &suml2);  /* the same sums again, and the codes */
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

static float make_q3(int n, int nmax, const float *x, int8_t *L) {
    float max;
    if (absmax(n, x, &max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float sumlx, suml2;
    fit_codes(n, nmax, x, NULL, -nmax / max, L, 0, &sumlx, &suml2);
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = MAX(-nmax, MIN(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

static void two_bit_planes(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* -- K-quants: one super-block of 256 ---------------------------------------------------------- */
static void q2_k_search(const float *x, float *scales, float *mins, uint8_t *L) {
    uint8_t Laux[16];
    float weights[16];
    for (int j = 0; j < 16; ++j) {
        for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
        scales[j] = make_qkx2(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
    }
}

/* Q2_K's bytes after the scale bytes (y[0..15]) are set: d and dmin, the codes re-fitted to
 * the stored scales (L from the search kept where a scale is 0), the 2-bit planes. */
static void q2_k_store(const float *x, uint8_t *y, uint16_t d16, uint16_t dmin16, uint8_t *L) {
    const uint8_t *sc = y;
    put16(y + 80, d16);
    put16(y + 82, dmin16);
    const float dd = f16_to_f32(d16), dmm = f16_to_f32(dmin16);
    for (int j = 0; j < 16; ++j) {
        const float d = dd * (sc[j] & 0xF);
        if (!d) continue;
        const float dm = dmm * (sc[j] >> 4);
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int((x[16 * j + ii] + dm) / d);
            L[16 * j + ii] = (uint8_t)MAX(0, MIN(3, l));
        }
    }
    two_bit_planes(L, y + 16);
}

static void q2_k_finish(const float *x, uint8_t *y, const float *scales, const float *mins, uint8_t *L) {
    uint8_t *sc = y;
    float max_scale = 0, max_min = 0;
    const float q4scale = 15.f;
    for (int j = 0; j < 16; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    uint16_t d16, dmin16;
    if (max_scale > 0) {
        float iscale = q4scale / max_scale;
        for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)nearest_int(iscale * scales[j]);
        d16 = f32_to_f16(max_scale / q4scale);
    } else {
        memset(sc, 0, 16);
        d16 = f32_to_f16(0.f);
    }
    if (max_min > 0) {
        float iscale = q4scale / max_min;
        for (int j = 0; j < 16; ++j) sc[j] = (uint8_t)(sc[j] | ((unsigned)nearest_int(iscale * mins[j]) << 4));
        dmin16 = f32_to_f16(max_min / q4scale);
    } else {
        dmin16 = f32_to_f16(0.f);
    }
    q2_k_store(x, y, d16, dmin16, L);
}

static void q2_k(const float *x, uint8_t *y) {
    float scales[16], mins[16];
    uint8_t L[QK_K];
    q2_k_search(x, scales, mins, L);
    q2_k_finish(x, y, scales, mins, L);
}

static void q3_k_search(const float *x, float *scales, int8_t *L) {
    for (int j = 0; j < 16; ++j) scales[j] = make_q3(16, 4, x + 16 * j, L + 16 * j);
}

/* Q3_K's bytes from the 6-bit scales l6 (stored values 0..63) and d: the scale bytes, the codes
 * re-fitted to the stored scales (L: 0..7 from the search, kept where a scale is 0), hmask, qs. */
/* Q3_K's 12 scale bytes (y + 96) from the 6-bit scales l6 and its F16 d (y + 108); returns d. */
static inline float q3_k_put_scales(uint8_t *y, const int8_t *l6, uint16_t d16) {
    uint8_t *sc = y + 96;
    memset(sc, 0, 12);
    for (int j = 0; j < 16; ++j) {
        int l = l6[j];
        if (j < 8)
            sc[j] = (uint8_t)(l & 0xF);
        else
            sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
        l >>= 4;
        sc[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
    }
    put16(y + 108, d16);
    return f16_to_f32(d16);
}

/* Sub-block j's stored scale (-32..31), read back from the 12 scale bytes as ggml does. */
static inline int8_t q3_k_scale(const uint8_t *sc, int j) {
    const int8_t s = (int8_t)(j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4);
    return (int8_t)((s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
}

static void q3_k_store(const float *x, uint8_t *y, const int8_t *l6, uint16_t d16, int8_t *L) {
    uint8_t *hmask = y, *qs = y + 32;
    const float dd = q3_k_put_scales(y, l6, d16);
    for (int j = 0; j < 16; ++j) {
        float d = dd * q3_k_scale(y + 96, j);
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(MAX(-4, MIN(3, l)) + 4);
        }
    }
    memset(hmask, 0, 32);
    int m = 0;
    uint8_t hm = 1;
    uint8_t U[QK_K];
    for (int j = 0; j < QK_K; ++j) {
        int v = L[j];
        if (v > 3) {
            hmask[m] |= hm;
            v -= 4;
        }
        U[j] = (uint8_t)v;
        if (++m == 32) {
            m = 0;
            hm = (uint8_t)(hm << 1);
        }
    }
    two_bit_planes(U, qs);
}

/* The 16 sub-block scales quantized to 6 bits (l6: stored values 0..63) under an F16 d. */
static inline uint16_t q3_k_scales6(const float *scales, int8_t *l6) {
    float max_scale;
    absmax(16, scales, &max_scale);
    memset(l6, 0, 16);
    if (!max_scale) return f32_to_f16(0.f);
    float iscale = -32.f / max_scale;
    for (int j = 0; j < 16; ++j) {
        int8_t l = (int8_t)nearest_int(iscale * scales[j]);
        l6[j] = (int8_t)(MAX(-32, MIN(31, l)) + 32);
    }
    return f32_to_f16(1 / iscale);
}

static void q3_k_finish(const float *x, uint8_t *y, const float *scales, int8_t *L) {
    int8_t l6[16];
    const uint16_t d16 = q3_k_scales6(scales, l6);
    q3_k_store(x, y, l6, d16, L);
}

static void q3_k(const float *x, uint8_t *y) {
    int8_t L[QK_K];
    float scales[16];
    q3_k_search(x, scales, L);
    q3_k_finish(x, y, scales, L);
}

/* Q4_K (nmax 15) and Q5_K (nmax 31): the search (sub-block scales, minimums, codes), then the
 * 12 scale/min bytes plus d, dmin at y and the final codes L. */
static void q45_k_search(const float *x, int nmax, float rmin, int nstep, float *scales, float *mins, uint8_t *L) {
    uint8_t Laux[32];
    float weights[32];
    for (int j = 0; j < 8; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
    }
}

static void q45_k_finish(const float *x, uint8_t *y, int nmax, const float *scales, const float *mins, uint8_t *L) {
    uint8_t *sc = y + 4;
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; ++j) {
        ls[j] = (uint8_t)MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        lm[j] = (uint8_t)MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
    }
    for (int j = 0; j < 4; ++j) {
        sc[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        sc[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        sc[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    const uint16_t d16 = f32_to_f16(max_scale / 63.f), dmin16 = f32_to_f16(max_min / 63.f);
    put16(y, d16);
    put16(y + 2, dmin16);
    const float dd = f16_to_f32(d16), dmm = f16_to_f32(dmin16);
    for (int j = 0; j < 8; ++j) {
        const float d = dd * ls[j];
        if (!d) continue;
        const float dm = dmm * lm[j];
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAX(0, MIN(nmax, l));
        }
    }
}

static void q4_k_pack(uint8_t *y, const uint8_t *L) {
    uint8_t *q = y + 16;
    for (int j = 0; j < QK_K; j += 64) {
        for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
        q += 32;
    }
}

static void q5_k_pack(uint8_t *y, const uint8_t *L) {
    uint8_t *qh = y + 16, *ql = y + 48;
    memset(qh, 0, 32);
    uint8_t m1 = 1, m2 = 2;
    for (int n = 0; n < QK_K; n += 64) {
        for (int j = 0; j < 32; ++j) {
            int l1 = L[n + j];
            if (l1 > 15) {
                l1 -= 16;
                qh[j] |= m1;
            }
            int l2 = L[n + j + 32];
            if (l2 > 15) {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[j] = (uint8_t)(l1 | (l2 << 4));
        }
        m1 = (uint8_t)(m1 << 2);
        m2 = (uint8_t)(m2 << 2);
        ql += 32;
    }
}

static void q4_k(const float *x, uint8_t *y) {
    float scales[8], mins[8];
    uint8_t L[QK_K];
    q45_k_search(x, 15, -1.f, 20, scales, mins, L);
    q45_k_finish(x, y, 15, scales, mins, L);
    q4_k_pack(y, L);
}

static void q5_k(const float *x, uint8_t *y) {
    float scales[8], mins[8];
    uint8_t L[QK_K];
    q45_k_search(x, 31, -0.5f, 15, scales, mins, L);
    q45_k_finish(x, y, 31, scales, mins, L);
    q5_k_pack(y, L);
}

static void q6_k_search(const float *x, float *scales, int8_t *L) {
    for (int ib = 0; ib < 16; ++ib) scales[ib] = make_qx(16, 32, x + 16 * ib, L + 16 * ib, NULL);
}

static void q6_k_finish(const float *x, uint8_t *y, const float *scales, int8_t *L) {
    float max_scale;
    if (absmax(16, scales, &max_scale) < GROUP_MAX_EPS) {
        memset(y, 0, 210);
        put16(y + 208, f32_to_f16(0.f));
        return;
    }
    float iscale = -128.f / max_scale;
    const uint16_t d16 = f32_to_f16(1 / iscale);
    put16(y + 208, d16);
    int8_t *s8 = (int8_t *)(y + 192);
    for (int ib = 0; ib < 16; ++ib) s8[ib] = (int8_t)MIN(127, nearest_int(iscale * scales[ib]));
    const float dd = f16_to_f32(d16);
    for (int j = 0; j < 16; ++j) {
        float d = dd * s8[j];
        if (!d) continue;
        for (int ii = 0; ii < 16; ++ii) {
            int l = nearest_int(x[16 * j + ii] / d);
            L[16 * j + ii] = (int8_t)(MAX(-32, MIN(31, l)) + 32);
        }
    }
    uint8_t *ql = y, *qh = y + 128;
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            const uint8_t q1 = L[j + l + 0] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

static void q6_k(const float *x, uint8_t *y) {
    float scales[16];
    int8_t L[QK_K];
    q6_k_search(x, scales, L);
    q6_k_finish(x, y, scales, L);
}

static void q4_0(const float *x, uint8_t *y) { q4_0_like(x, y, 8, 4); }
static void q5_0(const float *x, uint8_t *y) { q4_0_like(x, y, 16, 5); }
static void q4_1(const float *x, uint8_t *y) { q4_1_like(x, y, 4); }
static void q5_1(const float *x, uint8_t *y) { q4_1_like(x, y, 5); }

typedef void (*block_fn)(const float *, uint8_t *);
/* IQ4_NL, IQ4_XS, TQ1_0, TQ2_0: the section at the end of the file. */
static void iq4_nl_block(const float *x, uint8_t *y);
static void iq4_xs_block(const float *x, uint8_t *y);
static void tq1_0_block(const float *x, uint8_t *y);
static void tq2_0_block(const float *x, uint8_t *y);
static int nonlinear_weighted_row(const char *name, const float *x, const float *qw, Py_ssize_t n, uint8_t *y);

static const struct {
    const char *name;
    int block, size;
    block_fn fn;
} TYPES[] = {
    {"Q4_0", QK, 18, q4_0}, {"Q4_1", QK, 20, q4_1}, {"Q5_0", QK, 22, q5_0}, {"Q5_1", QK, 24, q5_1}, {"Q8_0", QK, 34, q8_0},
    {"Q2_K", QK_K, 84, q2_k}, {"Q3_K", QK_K, 110, q3_k}, {"Q4_K", QK_K, 144, q4_k}, {"Q5_K", QK_K, 176, q5_k}, {"Q6_K", QK_K, 210, q6_k},
    /* the non-linear and ternary types: defined in their own section at the end of the file */
    {"IQ4_NL", QK, 18, iq4_nl_block}, {"IQ4_XS", QK_K, 136, iq4_xs_block}, {"TQ1_0", QK_K, 54, tq1_0_block}, {"TQ2_0", QK_K, 66, tq2_0_block},
};


/* -- importance-weighted quantizers (ggml's quantize_row_<type>_impl, llama-quantize --imatrix) --
 * The same algorithms as qformat/schemes/ggml_weighted.py, one row at a time (the legacy types'
 * sigma2 is the row's mean square, the K types' each super-block's).  Scalar: ggml's own are. */
static float make_qp(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float max = 0;
    for (int i = 0; i < n; ++i) max = MAX(max, x[i]);
    if (max < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = nmax / max;
    for (int i = 0; i < n; ++i) L[i] = (uint8_t)nearest_int(iscale * x[i]); /* uint8_t stores wrap, as ggml's */
    float scale = 1 / iscale;
    float best_mse = 0;
    for (int i = 0; i < n; ++i) {
        float diff = x[i] - scale * L[i];
        best_mse += qw[i] * diff * diff;
    }
    for (int is = -4; is <= 4; ++is) {
        if (is == 0) continue;
        float iscale_is = (0.1f * is + nmax) / max;
        float scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; ++i) {
            int l = MIN(nmax, nearest_int(iscale_is * x[i]));
            float diff = x[i] - scale_is * l;
            mse += qw[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = MIN(nmax, nearest_int(iscale * x[i]));
        L[i] = (uint8_t)l;
        float w = qw[i];
        sumlx += w * x[i] * l;
        suml2 += w * l * l;
    }
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            float w = qw[i];
            float slx = sumlx - w * x[i] * L[i];
            float sl2 = suml2 - w * L[i] * L[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = MIN(nmax, nearest_int(x[i] * sl2 / slx));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (uint8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* w[l] = qw[l] * sqrtf(sigma2 + x[l]^2) for k elements; returns their sum (from 0, in order). */
static float weigh(int k, const float *x, const float *qw, float sigma2, float *w) {
    float sum = 0;
    for (int l = 0; l < k; ++l) w[l] = qw[l] * sqrtf(sigma2 + x[l] * x[l]);
    for (int l = 0; l < k; ++l) sum += w[l];
    return sum;
}

static float sum_sq(Py_ssize_t n, const float *x) {
    float s = 0;
    for (Py_ssize_t j = 0; j < n; ++j) s += x[j] * x[j];
    return s;
}

static void legacy_store(uint8_t *y, const uint8_t *L, float d, float min, int bits, int with_min) {
    put16(y, f32_to_f16(d));
    if (with_min) put16(y + 2, f32_to_f16(-min));
    pack_legacy(y + (with_min ? 4 : 2), L, bits);
}

/* Blocks [b0, b1) of a row of a legacy type, scalar (the row's sigma2 given). */
static void legacy_w_blocks(const float *x, const float *qw, float sigma2, Py_ssize_t b0, Py_ssize_t b1, uint8_t *y, int bits,
                            int with_min) {
    const int size = (with_min ? 4 : 2) + (bits == 5 ? 4 : 0) + 16;
    for (Py_ssize_t ib = b0; ib < b1; ++ib) {
        const float *xb = x + QK * ib;
        float weight[QK], d, min = 0;
        uint8_t L[QK], Laux[QK];
        weigh(QK, xb, qw + QK * ib, sigma2, weight);
        if (with_min)
            d = make_qkx2(QK, (1 << bits) - 1, xb, weight, L, &min, Laux, -0.9f, 0.05f, 36, 0);
        else
            d = make_qx(QK, 1 << (bits - 1), xb, (int8_t *)L, weight);
        legacy_store(y + size * ib, L, d, min, bits, with_min);
    }
}

/* The importance weights of a super-block's sub-blocks of `sub` elements: w[256], sw[256 / sub]. */
static void k_weights(const float *x, const float *qw, float sigma2, int sub, float *w, float *sw) {
    for (int j = 0; j < QK_K / sub; ++j) sw[j] = weigh(sub, x + sub * j, qw + sub * j, sigma2, w + sub * j);
}

static void q2_k_w_finish(const float *x, uint8_t *y, const float *scales, const float *mins, const float *sw, uint8_t *L) {
    uint8_t Ls[16], Lm[16];
    const uint16_t d16 = f32_to_f16(make_qp(16, 15, scales, Ls, sw));
    const uint16_t dmin16 = f32_to_f16(make_qp(16, 15, mins, Lm, sw));
    for (int j = 0; j < 16; ++j) y[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    q2_k_store(x, y, d16, dmin16, L);
}

static void q2_k_w(const float *x, const float *qw, uint8_t *y) {
    float scales[16], mins[16], sw[16], w[QK_K];
    uint8_t L[QK_K], Laux[16];
    k_weights(x, qw, sum_sq(QK_K, x) / QK_K, 16, w, sw);
    for (int j = 0; j < 16; ++j)
        scales[j] = make_qkx2(16, 3, x + 16 * j, w + 16 * j, L + 16 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    q2_k_w_finish(x, y, scales, mins, sw, L);
}

static void q3_k_w(const float *x, const float *qw, uint8_t *y) {
    const float sigma2 = 2 * sum_sq(QK_K, x) / QK_K;
    float scales[16], sw[16], weight[16];
    int8_t L[QK_K], Ls[16];
    for (int j = 0; j < 16; ++j) {
        sw[j] = weigh(16, x + 16 * j, qw + 16 * j, sigma2, weight);
        scales[j] = make_qx(16, 4, x + 16 * j, L + 16 * j, weight);
    }
    const float d_block = make_qx(16, 32, scales, Ls, sw);
    q3_k_store(x, y, Ls, f32_to_f16(d_block), L);
}

static void q45_k_w_finish(const float *x, uint8_t *y, int nmax, const float *scales, const float *mins, const float *sw, uint8_t *L) {
    uint8_t Ls[8], Lm[8];
    const float d_block = make_qp(8, 63, scales, Ls, sw);
    const float m_block = make_qp(8, 63, mins, Lm, sw);
    uint8_t *sc = y + 4;
    for (int j = 0; j < 8; ++j) {
        uint8_t ls = Ls[j], lm = Lm[j];
        if (nmax == 31) { /* Q5_K clamps; Q4_K stores the codes as they are */
            ls = (uint8_t)MIN(63, ls);
            lm = (uint8_t)MIN(63, lm);
        }
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j - 0] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    const uint16_t d16 = f32_to_f16(d_block), dmin16 = f32_to_f16(m_block);
    put16(y, d16);
    put16(y + 2, dmin16);
    const float dd = f16_to_f32(d16), dmm = f16_to_f32(dmin16);
    for (int j = 0; j < 8; ++j) {
        uint8_t s, m; /* ggml's get_scale_min_k4 */
        if (j < 4) {
            s = sc[j] & 63;
            m = sc[j + 4] & 63;
        } else {
            s = (uint8_t)((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
            m = (uint8_t)((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
        }
        const float d = dd * s;
        if (!d) continue;
        const float dm = dmm * m;
        for (int ii = 0; ii < 32; ++ii) {
            int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAX(0, MIN(nmax, l));
        }
    }
    if (nmax == 15)
        q4_k_pack(y, L);
    else
        q5_k_pack(y, L);
}

static void q45_k_w(const float *x, const float *qw, uint8_t *y, int nmax) {
    float scales[8], mins[8], sw[8], w[QK_K];
    uint8_t L[QK_K], Laux[32];
    k_weights(x, qw, 2 * sum_sq(QK_K, x) / QK_K, 32, w, sw);
    for (int j = 0; j < 8; ++j)
        scales[j] = make_qkx2(32, nmax, x + 32 * j, w + 32 * j, L + 32 * j, &mins[j], Laux, -0.9f, 0.05f, 36, 0);
    q45_k_w_finish(x, y, nmax, scales, mins, sw, L);
}

static void q6_k_w(const float *x, const float *qw, uint8_t *y) {
    float scales[16];
    int8_t L[QK_K];
    for (int ib = 0; ib < 16; ++ib) scales[ib] = make_qx(16, 32, x + 16 * ib, L + 16 * ib, qw + 16 * ib);
    q6_k_finish(x, y, scales, L);
}

/* -- 8 sub-blocks at a time --------------------------------------------------------------------
 * The searches of make_qkx2 (Q2_K, Q4_K, Q5_K) and make_qx (Q6_K) run on 8 sub-blocks at once,
 * one per lane of 8-wide vectors: every lane performs exactly the scalar function's binary32
 * operations in its order (a per-lane select replaces each branch), so the bytes are the scalar
 * path's; the loop-carried sums, latency-bound in the scalar code, then advance 8 sub-blocks per
 * instruction.  GCC's vector extensions compile this for the baseline ISA (as SSE pairs) and,
 * in the *_avx2 clones picked at run time, as AVX2. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi" /* 32-byte vectors pass only between always-inline functions */
#endif
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef uint8_t v32b __attribute__((vector_size(32)));
typedef float v8fu __attribute__((vector_size(32), aligned(4))); /* an unaligned load */

#define AI static inline __attribute__((always_inline))

AI v8f vsplat(float a) { return (v8f){a, a, a, a, a, a, a, a}; }
AI v8i isplat(int32_t a) { return (v8i){a, a, a, a, a, a, a, a}; }
AI v8f vsel(v8i m, v8f a, v8f b) { return (v8f)(((v8i)a & m) | ((v8i)b & ~m)); }
AI v8i isel(v8i m, v8i a, v8i b) { return (a & m) | (b & ~m); }
AI v8f vabs(v8f x) { return (v8f)((v8i)x & isplat(0x7fffffff)); }
AI v8i vnearest(v8f f) {
    v8i i = (v8i)(f + vsplat(12582912.f));
    return (i & isplat(0x007fffff)) - isplat(0x00400000);
}
AI v8i iclamp(v8i l, int lo, int hi) {
    l = isel(l < isplat(lo), isplat(lo), l);
    return isel(l > isplat(hi), isplat(hi), l);
}
AI v8f tof(v8i l) { return __builtin_convertvector(l, v8f); }

/* make_qkx2_quants on lanes: X, W [n] (n <= 32); L [n] out; scale, the_min out. */
AI void qkx2_lanes(int n, int nmax, const v8f *X, const v8f *W, v8i *L, v8f *scale_out, v8f *min_out, float rmin,
                   float rdelta, int nstep, int use_mad) {
    v8f min = X[0], max = X[0], sum_w = W[0], sum_x = W[0] * X[0];
    for (int i = 1; i < n; ++i) {
        min = vsel(X[i] < min, X[i], min);
        max = vsel(X[i] > max, X[i], max);
        sum_w += W[i];
        sum_x += W[i] * X[i];
    }
    min = vsel(min > vsplat(0), vsplat(0), min);
    const v8i flat = max == min;
    v8f iscale = vsplat((float)nmax) / (max - min);
    v8f scale = vsplat(1) / iscale;
    v8f best = vsplat(0);
    for (int i = 0; i < n; ++i) {
        L[i] = iclamp(vnearest(iscale * (X[i] - min)), 0, nmax);
        v8f diff = scale * tof(L[i]) + min - X[i];
        diff = use_mad ? vabs(diff) : diff * diff;
        best += W[i] * diff;
    }
    v8i Laux[32];
    for (int is = 0; is <= nstep; ++is) {
        iscale = vsplat(rmin + rdelta * is + nmax) / (max - min);
        v8f sum_l = vsplat(0), sum_l2 = vsplat(0), sum_xl = vsplat(0);
        for (int i = 0; i < n; ++i) {
            Laux[i] = iclamp(vnearest(iscale * (X[i] - min)), 0, nmax);
            const v8f l = tof(Laux[i]), wl = W[i] * l;
            sum_l += wl;
            sum_l2 += wl * l;
            sum_xl += wl * X[i];
        }
        const v8f D = sum_w * sum_l2 - sum_l * sum_l;
        const v8i ok = (D > vsplat(0)) & ~flat;
        if (!(ok[0] | ok[1] | ok[2] | ok[3] | ok[4] | ok[5] | ok[6] | ok[7])) continue;
        v8f this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
        v8f this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
        const v8i pos = this_min > vsplat(0);
        this_min = vsel(pos, vsplat(0), this_min);
        this_scale = vsel(pos, sum_xl / sum_l2, this_scale);
        v8f cur = vsplat(0);
        for (int i = 0; i < n; ++i) {
            v8f diff = this_scale * tof(Laux[i]) + this_min - X[i];
            diff = use_mad ? vabs(diff) : diff * diff;
            cur += W[i] * diff;
        }
        const v8i win = ok & (cur < best);
        for (int i = 0; i < n; ++i) L[i] = isel(win, Laux[i], L[i]);
        best = vsel(win, cur, best);
        scale = vsel(win, this_scale, scale);
        min = vsel(win, this_min, min);
    }
    for (int i = 0; i < n; ++i) L[i] = isel(flat, isplat(0), L[i]);
    *scale_out = vsel(flat, vsplat(0), scale);
    *min_out = -min;
}

/* make_qx_quants (rmse_type 1, no weights) on lanes: X [n]; L [n] out (0 .. 2 nmax - 1). */
/* The common start of make_qx_quants and make_q3_quants on lanes: per lane the first element of
 * largest magnitude (max; 0 for an all-zero sub-block), the mask of sub-blocks below
 * GROUP_MAX_EPS, and the weights W = x^2, WX = x^2 x. */
AI v8i absmax_weights_lanes(int n, const v8f *X, v8f *max_out, v8f *W, v8f *WX) {
    v8f amax = vsplat(0), max = vsplat(0);
    for (int i = 0; i < n; ++i) {
        const v8f ax = vabs(X[i]);
        const v8i m = ax > amax;
        amax = vsel(m, ax, amax);
        max = vsel(m, X[i], max);
        W[i] = X[i] * X[i];
        WX[i] = W[i] * X[i];
    }
    *max_out = max;
    return amax < vsplat(GROUP_MAX_EPS);
}

AI v8f qx_lanes(int n, int nmax, const v8f *X, v8i *L) {
    v8f max, W[16], WX[16];
    const v8i zero = absmax_weights_lanes(n, X, &max, W, WX);
    v8f iscale = vsplat((float)-nmax) / max;
    v8f sumlx = vsplat(0), suml2 = vsplat(0);
    for (int i = 0; i < n; ++i) {
        const v8i l = iclamp(vnearest(iscale * X[i]), -nmax, nmax - 1);
        L[i] = l + isplat(nmax);
        const v8f lf = tof(l);
        sumlx += WX[i] * lf;
        suml2 += W[i] * lf * lf;
    }
    v8f scale = vsel(suml2 != vsplat(0), sumlx / suml2, vsplat(0));
    v8f best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = vsplat(-(nmax + 0.1f * is)) / max;
        v8i Lq[16];
        sumlx = suml2 = vsplat(0);
        for (int i = 0; i < n; ++i) {
            Lq[i] = iclamp(vnearest(iscale * X[i]), -nmax, nmax - 1);
            const v8f lf = tof(Lq[i]);
            sumlx += WX[i] * lf;
            suml2 += W[i] * lf * lf;
        }
        const v8i win = (suml2 > vsplat(0)) & (sumlx * sumlx > best * suml2);
        for (int i = 0; i < n; ++i) L[i] = isel(win, Lq[i] + isplat(nmax), L[i]);
        scale = vsel(win, sumlx / suml2, scale);
        best = vsel(win, scale * sumlx, best);
    }
    for (int i = 0; i < n; ++i) L[i] = isel(zero, isplat(0), L[i]);
    return vsel(zero, vsplat(0), scale);
}

/* make_q3_quants (do_rmse) on lanes: X [n]; L [n] out (0 .. 2 nmax - 1, or 0 for a zero
 * sub-block).  A lane whose pass changed nothing leaves the loop, as ggml's break does. */
AI v8f q3_lanes(int n, int nmax, const v8f *X, v8i *L) {
    v8f max, W[16], WX[16];
    const v8i zero = absmax_weights_lanes(n, X, &max, W, WX);
    const v8f iscale = vsplat((float)-nmax) / max;
    v8f sumlx = vsplat(0), suml2 = vsplat(0);
    for (int i = 0; i < n; ++i) {
        L[i] = iclamp(vnearest(iscale * X[i]), -nmax, nmax - 1);
        const v8f lf = tof(L[i]);
        sumlx += WX[i] * lf;
        suml2 += W[i] * lf * lf;
    }
    v8i active = ~zero;
    for (int itry = 0; itry < 5; ++itry) {
        v8i changed = isplat(0);
        for (int i = 0; i < n; ++i) {
            const v8f li = tof(L[i]);
            const v8f slx = sumlx - WX[i] * li;
            const v8f sl2 = suml2 - W[i] * li * li;
            const v8i nl = iclamp(vnearest(X[i] * sl2 / slx), -nmax, nmax - 1);
            const v8f nf = tof(nl);
            const v8f slx2 = slx + WX[i] * nf;
            const v8f sl22 = sl2 + W[i] * nf * nf;
            const v8i take = active & (slx > vsplat(0)) & (nl != L[i]) & (sl22 > vsplat(0)) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22);
            L[i] = isel(take, nl, L[i]);
            sumlx = vsel(take, slx2, sumlx);
            suml2 = vsel(take, sl22, suml2);
            changed |= take;
        }
        active &= changed;
        if (!(active[0] | active[1] | active[2] | active[3] | active[4] | active[5] | active[6] | active[7])) break;
    }
    for (int i = 0; i < n; ++i) L[i] = isel(zero, isplat(0), L[i] + isplat(nmax));
    return vsel(zero, vsplat(0), vsel(suml2 > vsplat(0), sumlx / suml2, vsplat(0)));
}

/* Lanes k = 0..7 <- sub-blocks first + k of size n (x: the super-block). */
AI void gather(const float *x, int first, int n, v8f *X) {
    for (int i = 0; i < n; ++i)
        for (int k = 0; k < 8; ++k) X[i][k] = x[(first + k) * n + i];
}

AI void q2_k_lanes(const float *x, uint8_t *y) {
    float scales[16], mins[16];
    uint8_t L[QK_K];
    for (int g = 0; g < 2; ++g) {
        v8f X[16], W[16], sc, mn;
        v8i Lv[16];
        gather(x, 8 * g, 16, X);
        for (int i = 0; i < 16; ++i) W[i] = vabs(X[i]);
        qkx2_lanes(16, 3, X, W, Lv, &sc, &mn, -0.5f, 0.1f, 15, 1);
        for (int k = 0; k < 8; ++k) {
            scales[8 * g + k] = sc[k];
            mins[8 * g + k] = mn[k];
            for (int i = 0; i < 16; ++i) L[16 * (8 * g + k) + i] = (uint8_t)Lv[i][k];
        }
    }
    q2_k_finish(x, y, scales, mins, L);
}

/* q3_k_store on lanes (issue 45 item 5: the scalar store, a division and a data-dependent branch
 * per element, took most of Q3_K's time): the same binary32 quotient x / d and nearest_int per
 * element, 8 at a time, and the hmask / 2-bit planes built 32 codes at a time without branches
 * (codes are 0..7: bit 2 goes to hmask, bits 0-1 to the planes, as the scalar v > 3 / v - 4). */
typedef int8_t v8s8 __attribute__((vector_size(8)));
AI void q3_k_store_lanes(const float *x, uint8_t *y, const int8_t *l6, uint16_t d16, int8_t *L) {
    uint8_t *hmask = y, *qs = y + 32;
    const float dd = q3_k_put_scales(y, l6, d16);
    for (int j = 0; j < 16; ++j) {
        const float d = dd * q3_k_scale(y + 96, j);
        if (!d) continue;
        for (int h = 0; h < 2; ++h) {
            const v8f xv = *(const v8fu *)(x + 16 * j + 8 * h);
            const v8i l = iclamp(vnearest(xv / vsplat(d)), -4, 3) + isplat(4);
            const v8s8 b = __builtin_convertvector(l, v8s8);
            memcpy(L + 16 * j + 8 * h, &b, 8);
        }
    }
    v32b H = {0}, U[8];
    for (int r = 0; r < 8; ++r) {
        v32b v;
        memcpy(&v, L + 32 * r, 32);
        H |= ((v >> 2) & 1) << r;
        U[r] = v & 3;
    }
    memcpy(hmask, &H, 32);
    for (int a = 0; a < 2; ++a) {
        const v32b q = U[4 * a] | (U[4 * a + 1] << 2) | (U[4 * a + 2] << 4) | (U[4 * a + 3] << 6);
        memcpy(qs + 32 * a, &q, 32);
    }
}

/* q3_k_finish with the store above. */
AI void q3_k_finish_lanes(const float *x, uint8_t *y, const float *scales, int8_t *L) {
    int8_t l6[16];
    const uint16_t d16 = q3_k_scales6(scales, l6);
    q3_k_store_lanes(x, y, l6, d16, L);
}

/* Q3_K (make_q3_quants, nmax 4) and Q6_K (make_qx_quants, nmax 32): 16 sub-blocks of 16, two
 * groups of 8 lanes, then the scalar finish. */
AI void signed_k_lanes(const float *x, uint8_t *y, int q6) {
    float scales[16];
    int8_t L[QK_K];
    for (int g = 0; g < 2; ++g) {
        v8f X[16];
        v8i Lv[16];
        gather(x, 8 * g, 16, X);
        const v8f sc = q6 ? qx_lanes(16, 32, X, Lv) : q3_lanes(16, 4, X, Lv);
        for (int k = 0; k < 8; ++k) {
            scales[8 * g + k] = sc[k];
            for (int i = 0; i < 16; ++i) L[16 * (8 * g + k) + i] = (int8_t)Lv[i][k];
        }
    }
    if (q6)
        q6_k_finish(x, y, scales, L);
    else
        q3_k_finish_lanes(x, y, scales, L);
}

AI void q3_k_lanes(const float *x, uint8_t *y) { signed_k_lanes(x, y, 0); }

AI void q45_k_lanes(const float *x, uint8_t *y, int nmax, float rmin, int nstep, uint8_t *L) {
    float scales[8], mins[8];
    v8f X[32], W[32], sc, mn, sum_x2 = vsplat(0), av_x;
    v8i Lv[32];
    gather(x, 0, 32, X);
    for (int l = 0; l < 32; ++l) sum_x2 += X[l] * X[l];
    for (int k = 0; k < 8; ++k) av_x[k] = sqrtf(sum_x2[k] / 32);
    for (int l = 0; l < 32; ++l) W[l] = av_x + vabs(X[l]);
    qkx2_lanes(32, nmax, X, W, Lv, &sc, &mn, rmin, 0.1f, nstep, 0);
    for (int k = 0; k < 8; ++k) {
        scales[k] = sc[k];
        mins[k] = mn[k];
        for (int i = 0; i < 32; ++i) L[32 * k + i] = (uint8_t)Lv[i][k];
    }
    q45_k_finish(x, y, nmax, scales, mins, L);
}

AI void q4_k_lanes(const float *x, uint8_t *y) {
    uint8_t L[QK_K];
    q45_k_lanes(x, y, 15, -1.f, 20, L);
    q4_k_pack(y, L);
}

AI void q5_k_lanes(const float *x, uint8_t *y) {
    uint8_t L[QK_K];
    q45_k_lanes(x, y, 31, -0.5f, 15, L);
    q5_k_pack(y, L);
}

AI void q6_k_lanes(const float *x, uint8_t *y) { signed_k_lanes(x, y, 1); }

/* Q8_0 on lanes: the block's largest magnitude (order-free), then roundf(x * id) as round_i8
 * does it, 8 values per vector; a lane of |v| >= 2^23 (an Inf id: every value of the block
 * below ~1e-38) takes round_i8 itself. */
AI void q8_0_lanes(const float *x, uint8_t *y) {
    v8f X[4];
    memcpy(X, x, sizeof X);
    v8f a = vabs(X[0]);
    for (int g = 1; g < 4; ++g) a = vsel(vabs(X[g]) > a, vabs(X[g]), a);
    float amax = 0.0f;
    for (int k = 0; k < 8; ++k) amax = MAX(amax, a[k]);
    const float d = amax / 127.0f;
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    for (int g = 0; g < 4; ++g) {
        const v8f v = X[g] * vsplat(id);
        const v8i ok = vabs(v) < vsplat(8388608.0f);
        const v8f vs = vsel(ok, v, vsplat(0));
        v8i i = __builtin_convertvector(vs, v8i); /* truncation, exact below 2^23 */
        const v8f f = vs - tof(i);
        i = i - (f >= vsplat(0.5f)) + (f <= vsplat(-0.5f)); /* a true comparison is -1 */
        for (int k = 0; k < 8; ++k) y[2 + 8 * g + k] = (uint8_t)(ok[k] ? (int8_t)i[k] : round_i8(v[k]));
    }
}

/* Q4_0 / Q5_0 and Q4_1 / Q5_1 on lanes: the block's 32 values as four vectors of 8.  The scale
 * search is order-free but for which of two values wins a tie (Q4_0's first of the largest
 * magnitude, Q4_1's first of two signed zeros), settled below as the scalar code settles it.
 * The codes are converted directly where every lane's value is in int32's range and the
 * out-of-range lanes (NaN or Inf scale: blocks of values below ~1e-38) get x86's INT_MIN, as
 * trunc_i32 gives them, so no per-element branch stops the vectorizer. */

/* The 32 values of a block as 4 vectors, loaded straight into registers (a memcpy to the stack
 * and back stalls on store forwarding). */
AI void load_block(const float *x, v8f *X) {
    for (int g = 0; g < 4; ++g) X[g] = *(const v8fu *)(x + 8 * g);
}

/* Reductions of 8 lanes in 3 steps (not a 7-long chain); exact: max of values that exclude NaN,
 * min and or of integers. */
AI v8f vmax_nonan(v8f a, v8f b) { return vsel(b > a, b, a); }
AI float hmax8(v8f a) {
    a = vmax_nonan(a, __builtin_shuffle(a, (v8i){4, 5, 6, 7, 0, 1, 2, 3}));
    a = vmax_nonan(a, __builtin_shuffle(a, (v8i){2, 3, 0, 1, 6, 7, 4, 5}));
    return vmax_nonan(a, __builtin_shuffle(a, (v8i){1, 0, 3, 2, 5, 4, 7, 6}))[0];
}
AI int32_t hmin8i(v8i a) {
    v8i b = __builtin_shuffle(a, (v8i){4, 5, 6, 7, 0, 1, 2, 3});
    a = isel(b < a, b, a);
    b = __builtin_shuffle(a, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    a = isel(b < a, b, a);
    b = __builtin_shuffle(a, (v8i){1, 0, 3, 2, 5, 4, 7, 6});
    return isel(b < a, b, a)[0];
}
AI uint32_t hor8(v8i a) {
    a |= __builtin_shuffle(a, (v8i){4, 5, 6, 7, 0, 1, 2, 3});
    a |= __builtin_shuffle(a, (v8i){2, 3, 0, 1, 6, 7, 4, 5});
    return (uint32_t)(a | __builtin_shuffle(a, (v8i){1, 0, 3, 2, 5, 4, 7, 6}))[0];
}

AI v8i trunc_lanes(v8f v) {
    const v8i ok = (v > vsplat(-2147483648.0f)) & (v < vsplat(2147483648.0f));
    return isel(ok, __builtin_convertvector(vsel(ok, v, vsplat(0)), v8i), isplat(INT32_MIN));
}

/* The codes Q[4] (low bits significant) packed as pack_legacy packs them. */
AI void pack_lanes(uint8_t *qs, const v8i *Q, int bits) {
    if (bits == 5) {
        const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
        v8i h = isplat(0);
        for (int g = 0; g < 4; ++g) h |= ((Q[g] >> 4) & isplat(1)) << (lane + isplat(8 * g));
        const uint32_t qh = hor8(h);
        for (int k = 0; k < 4; ++k) qs[k] = (uint8_t)(qh >> (8 * k));
        qs += 4;
    }
    /* byte j of qs: the low byte of lane j of P (0..7 in P[0], 8..15 in P[1]): one byte shuffle */
    const v8i P0 = (Q[0] & isplat(0x0f)) | ((Q[2] & isplat(0x0f)) << 4), P1 = (Q[1] & isplat(0x0f)) | ((Q[3] & isplat(0x0f)) << 4);
    const v32b b = __builtin_shuffle((v32b)P0, (v32b)P1, (v32b){0, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60,
                                                                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
    memcpy(qs, &b, 16);
}

AI void q4_0_like_lanes(const float *x, uint8_t *y, int nmax, int bits) {
    v8f X[4];
    load_block(x, X);
    v8f a = vsplat(0); /* NaN never wins a comparison: skipped, as in the scalar loop */
    for (int g = 0; g < 4; ++g) a = vsel(vabs(X[g]) > a, vabs(X[g]), a);
    const float amax = hmax8(a);
    float max = 0.0f;
    if (amax > 0.0f) { /* the first of the largest magnitude, as q4_0_like; no branch per element */
        static const v8i index[4] = {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15},
                                     {16, 17, 18, 19, 20, 21, 22, 23}, {24, 25, 26, 27, 28, 29, 30, 31}};
        const v8f am = vsplat(amax);
        v8i first = isplat(QK);
        for (int g = 3; g >= 0; --g) first = isel(vabs(X[g]) == am, index[g], first);
        max = x[hmin8i(first)];
    }
    const float d = max / (float)-nmax;
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    const int top = (1 << bits) - 1;
    v8i Q[4];
    for (int g = 0; g < 4; ++g) {
        v8i i = trunc_lanes(X[g] * vsplat(id) + vsplat((float)nmax + 0.5f));
        i = (i << 24) >> 24; /* (int8_t) */
        Q[g] = isel(i > isplat(top), isplat(top), i);
    }
    pack_lanes(y + 2, Q, bits);
}

AI void q4_1_like_lanes(const float *x, uint8_t *y, int bits) {
    v8f X[4];
    load_block(x, X);
    v8f mn = vsplat(3.402823466e+38f), mx = vsplat(-3.402823466e+38f);
    for (int g = 0; g < 4; ++g) {
        mn = vsel(X[g] < mn, X[g], mn);
        mx = vsel(X[g] > mx, X[g], mx);
    }
    float min = 3.402823466e+38f, max = -3.402823466e+38f;
    for (int k = 0; k < 8; ++k) {
        if (mn[k] < min) min = mn[k];
        if (mx[k] > max) max = mx[k];
    }
    if (min == 0.0f || max == 0.0f) { /* which zero's sign: the scalar loop's order decides */
        min = 3.402823466e+38f, max = -3.402823466e+38f;
        for (int j = 0; j < QK; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
    }
    const float d = (max - min) / (float)((1 << bits) - 1);
    const float id = d ? 1.0f / d : 0.0f;
    put16(y, f32_to_f16(d));
    put16(y + 2, f32_to_f16(min));
    v8i Q[4];
    for (int g = 0; g < 4; ++g) {
        v8i i = trunc_lanes((X[g] - vsplat(min)) * vsplat(id) + vsplat(0.5f));
        if (bits == 4) {
            i = (i << 24) >> 24; /* (int8_t), then MIN(15, .) */
            i = isel(i > isplat(15), isplat(15), i);
        }
        Q[g] = i;
    }
    pack_lanes(y + 4, Q, bits);
}

AI void q4_0_lanes(const float *x, uint8_t *y) { q4_0_like_lanes(x, y, 8, 4); }
AI void q5_0_lanes(const float *x, uint8_t *y) { q4_0_like_lanes(x, y, 16, 5); }
AI void q4_1_lanes(const float *x, uint8_t *y) { q4_1_like_lanes(x, y, 4); }
AI void q5_1_lanes(const float *x, uint8_t *y) { q4_1_like_lanes(x, y, 5); }

/* -- importance-weighted searches on lanes: make_qkx3_quants (= make_qkx2 with rmin -0.9, rdelta
 * 0.05, 36 steps) of 8 sub-blocks (Q2_K, Q4_K, Q5_K) or 8 blocks (Q4_1, Q5_1) at once, with the
 * importance weights; the rest of each quantizer is the scalar code above. */
AI void q2_k_w_lanes(const float *x, const float *qw, uint8_t *y) {
    float scales[16], mins[16], sw[16], w[QK_K];
    uint8_t L[QK_K];
    k_weights(x, qw, sum_sq(QK_K, x) / QK_K, 16, w, sw);
    for (int g = 0; g < 2; ++g) {
        v8f X[16], W[16], sc, mn;
        v8i Lv[16];
        gather(x, 8 * g, 16, X);
        gather(w, 8 * g, 16, W);
        qkx2_lanes(16, 3, X, W, Lv, &sc, &mn, -0.9f, 0.05f, 36, 0);
        for (int k = 0; k < 8; ++k) {
            scales[8 * g + k] = sc[k];
            mins[8 * g + k] = mn[k];
            for (int i = 0; i < 16; ++i) L[16 * (8 * g + k) + i] = (uint8_t)Lv[i][k];
        }
    }
    q2_k_w_finish(x, y, scales, mins, sw, L);
}

AI void q45_k_w_lanes(const float *x, const float *qw, uint8_t *y, int nmax) {
    float scales[8], mins[8], sw[8], w[QK_K];
    uint8_t L[QK_K];
    v8f X[32], W[32], sc, mn;
    v8i Lv[32];
    k_weights(x, qw, 2 * sum_sq(QK_K, x) / QK_K, 32, w, sw);
    gather(x, 0, 32, X);
    gather(w, 0, 32, W);
    qkx2_lanes(32, nmax, X, W, Lv, &sc, &mn, -0.9f, 0.05f, 36, 0);
    for (int k = 0; k < 8; ++k) {
        scales[k] = sc[k];
        mins[k] = mn[k];
        for (int i = 0; i < 32; ++i) L[32 * k + i] = (uint8_t)Lv[i][k];
    }
    q45_k_w_finish(x, y, nmax, scales, mins, sw, L);
}

/* Q4_1 / Q5_1: groups of 8 whole blocks of a row on lanes, the rest scalar. */
AI void legacy_min_w_lanes(const float *x, const float *qw, float sigma2, Py_ssize_t nb, uint8_t *y, int bits) {
    const int size = 4 + (bits == 5 ? 4 : 0) + 16;
    Py_ssize_t ib = 0;
    for (; ib + 8 <= nb; ib += 8) {
        float w[8 * QK];
        for (int k = 0; k < 8; ++k) weigh(QK, x + QK * (ib + k), qw + QK * (ib + k), sigma2, w + QK * k);
        v8f X[32], W[32], sc, mn;
        v8i Lv[32];
        gather(x + QK * ib, 0, 32, X);
        gather(w, 0, 32, W);
        qkx2_lanes(32, (1 << bits) - 1, X, W, Lv, &sc, &mn, -0.9f, 0.05f, 36, 0);
        for (int k = 0; k < 8; ++k) {
            uint8_t L[QK];
            for (int i = 0; i < 32; ++i) L[i] = (uint8_t)Lv[i][k];
            legacy_store(y + size * (ib + k), L, sc[k], mn[k], bits, 1);
        }
    }
    legacy_w_blocks(x, qw, sigma2, ib, nb, y, bits, 1);
}

/* One row of n elements of type t with the importance vector qw (n values): ggml's
 * quantize_<type> with quant_weights; `lanes` as in run_body. */
AI void weighted_row(int t, const float *x, const float *qw, Py_ssize_t n, uint8_t *y, int lanes) {
    const char *name = TYPES[t].name;
    const int size = TYPES[t].size;
    if (nonlinear_weighted_row(name, x, qw, n, y)) return; /* IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 */
    if (!strcmp(name, "Q8_0")) {
        for (Py_ssize_t i = 0; i < n / QK; i++) q8_0(x + i * QK, y + i * size); /* quantize_q8_0 ignores the weights */
        return;
    }
    if (TYPES[t].block == QK) {
        const int bits = name[1] == '5' ? 5 : 4, with_min = name[3] == '1';
        const float sigma2 = sum_sq(n, x) / n;
        if (lanes && with_min)
            legacy_min_w_lanes(x, qw, sigma2, n / QK, y, bits);
        else
            legacy_w_blocks(x, qw, sigma2, 0, n / QK, y, bits, with_min);
        return;
    }
    for (Py_ssize_t i = 0; i < n / QK_K; i++) {
        const float *xs = x + i * QK_K, *ws = qw + i * QK_K;
        uint8_t *ys = y + i * size;
        if (!strcmp(name, "Q2_K")) {
            if (lanes) q2_k_w_lanes(xs, ws, ys); else q2_k_w(xs, ws, ys);
        } else if (!strcmp(name, "Q3_K")) {
            q3_k_w(xs, ws, ys);
        } else if (!strcmp(name, "Q4_K") || !strcmp(name, "Q5_K")) {
            const int nmax = name[1] == '4' ? 15 : 31;
            if (lanes) q45_k_w_lanes(xs, ws, ys, nmax); else q45_k_w(xs, ws, ys, nmax);
        } else {
            q6_k_w(xs, ws, ys);
        }
    }
}

AI void weighted_body(int t, const float *x, const float *qw, Py_ssize_t rows, Py_ssize_t n, uint8_t *y, int lanes) {
    const Py_ssize_t row_bytes = n / TYPES[t].block * TYPES[t].size;
    for (Py_ssize_t r = 0; r < rows; r++) weighted_row(t, x + r * n, qw, n, y + r * row_bytes, lanes);
}

static void weighted_scalar(int t, const float *x, const float *qw, Py_ssize_t rows, Py_ssize_t n, uint8_t *y) {
    weighted_body(t, x, qw, rows, n, y, 0);
}
static void weighted_lanes(int t, const float *x, const float *qw, Py_ssize_t rows, Py_ssize_t n, uint8_t *y) {
    weighted_body(t, x, qw, rows, n, y, 1);
}

/* -- the packed code component, written with the blocks (issue 45 item 5) ---------------------
 * scheme gguf's ``codes`` component is every block's codes packed least significant bits first,
 * rows of whole blocks, as extract_packed reads them out of the blocks; for Q4_0 / Q4_1 (4 bits),
 * Q5_0 / Q5_1 (5) and Q3_K (3) quantize writes it too, from each block's bytes while they are in
 * cache, so the blocks are not read a second time.  count * bits is a whole number of bytes for
 * these types: a block's codes are codes_bytes() bytes at that block's offset. */
typedef uint16_t v16u16 __attribute__((vector_size(32)));
typedef uint32_t v8u32 __attribute__((vector_size(32)));
typedef uint64_t v4u64 __attribute__((vector_size(32)));

/* Bytes of a block's packed codes (0: not written by quantize). */
static int codes_bytes(const char *name) {
    if (!strcmp(name, "Q4_0") || !strcmp(name, "Q4_1")) return 16;
    if (!strcmp(name, "Q5_0") || !strcmp(name, "Q5_1")) return 20;
    if (!strcmp(name, "Q3_K")) return 96;
    return 0;
}

/* 32 codes c (bytes, element order; only the low `bits` bits kept) packed lsb first into 4 * bits
 * bytes at out: pairs into 16-bit lanes, those into 32-bit lanes, those into 64-bit lanes
 * (8 codes: `bits` bytes at the bottom of each 64-bit lane), then the lanes' low bytes. */
AI void pack_codes32(v32b c, int bits, uint8_t *out) {
    const uint16_t m = (uint16_t)((1u << bits) - 1u);
    v16u16 w = (v16u16)c;
    w = (w & m) | ((w >> (8 - bits)) & (uint16_t)(m << bits));
    if (bits == 4) {
        const v32b b = __builtin_shuffle((v32b)w, (v32b){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
                                                       0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
        memcpy(out, &b, 16);
        return;
    }
    v8u32 u = (v8u32)w;
    u = (u & ((1u << 2 * bits) - 1u)) | ((u >> (16 - 2 * bits)) & (((1u << 2 * bits) - 1u) << 2 * bits));
    v4u64 z = (v4u64)u;
    z = (z & ((1ull << 4 * bits) - 1ull)) | ((z >> (32 - 4 * bits)) & (((1ull << 4 * bits) - 1ull) << 4 * bits));
    uint8_t tmp[32];
    memcpy(tmp, &z, 32);
    for (int k = 0; k < 4; ++k) memcpy(out + bits * k, tmp + 8 * k, (size_t)bits);
}

/* The packed codes of one block of the named kind (0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q3_K) read
 * from its bytes blk: the runs of qformat.convert.gguf's layout (low nibbles, high nibbles, the
 * fifth bits of qh; Q3_K's 2-bit planes and hmask bit). */
AI void codes_from_block(int kind, const uint8_t *blk, uint8_t *out) {
    if (kind == 4) {
        v32b H, Q[2];
        memcpy(&H, blk, 32);
        memcpy(Q, blk + 32, 64);
        for (int r = 0; r < 8; ++r) {
            const v32b c = ((Q[r / 4] >> (2 * (r % 4))) & 3) | (((H >> r) & 1) << 2);
            pack_codes32(c, 3, out + 12 * r);
        }
        return;
    }
    const int five = kind >= 2, hdr = (kind & 1) ? 4 : 2;
    const uint8_t *qs = blk + hdr + (five ? 4 : 0);
    uint8_t c[32];
    uint32_t qh = 0;
    if (five) qh = (uint32_t)blk[hdr] | ((uint32_t)blk[hdr + 1] << 8) | ((uint32_t)blk[hdr + 2] << 16) | ((uint32_t)blk[hdr + 3] << 24);
    for (int j = 0; j < 16; ++j) {
        c[j] = (uint8_t)((qs[j] & 0xF) | (((qh >> j) & 1) << 4));
        c[j + 16] = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
    v32b cv;
    memcpy(&cv, c, 32);
    pack_codes32(cv, five ? 5 : 4, out);
}

/* Source element kinds: the input rows as stored (the checkpoint's float16 or bfloat16 read
 * without a float32 copy of the whole tensor). */
enum { SRC_F32 = 0, SRC_F16 = 1, SRC_BF16 = 2 };

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
/* F16C conversion of n (a multiple of 8) binary16 values: exact, as f16_to_f32. */
__attribute__((target("avx2,f16c"))) static void f16_block_f16c(const uint16_t *h, float *o, int n) {
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(o + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
}
#endif

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
/* Q4_0 / Q5_0 (with_min 0) and Q4_1 / Q5_1 (1) of float32 blocks, 8 blocks at a time in AVX2
 * (issue 45 item 5), and their packed codes when `codes` is given.  The per-block statistics (the
 * largest and smallest value, NaN skipped: vmaxps / vminps with the value as first operand
 * return the other one for a NaN) are reduced for 8 blocks at once, so d, 1 / d and the F16
 * conversions run on 8 lanes; each lane performs exactly the scalar function's binary32
 * operations.  Where the scalar loop's order matters the lane takes the scalar rule: Q4_0's
 * first value of the largest magnitude when +m and -m both occur, Q4_1's signed zeros.  The codes:
 * vcvttps2dq is trunc_i32 (INT_MIN for NaN and out of range), the low byte is the (int8_t) /
 * (uint8_t) cast, vpminsb the MIN(top, .).  Returns the blocks done (a multiple of 8); *amax grows
 * to the largest magnitude, as block_f32 computes it. */
__attribute__((target("avx2,f16c"))) static inline __m256 hred8(const __m256 *v, int mx) {
    __m256 q[2];
    for (int h = 0; h < 2; ++h) {
        __m256 m[2];
        for (int p = 0; p < 2; ++p) {
            const __m256 a = v[4 * h + 2 * p], b = v[4 * h + 2 * p + 1];
            const __m256 lo = _mm256_unpacklo_ps(a, b), hi = _mm256_unpackhi_ps(a, b);
            m[p] = mx ? _mm256_max_ps(lo, hi) : _mm256_min_ps(lo, hi);
        }
        const __m256 lo = _mm256_shuffle_ps(m[0], m[1], 0x44), hi = _mm256_shuffle_ps(m[0], m[1], 0xEE);
        q[h] = mx ? _mm256_max_ps(lo, hi) : _mm256_min_ps(lo, hi);
    }
    const __m256 lo = _mm256_permute2f128_ps(q[0], q[1], 0x20), hi = _mm256_permute2f128_ps(q[0], q[1], 0x31);
    return mx ? _mm256_max_ps(lo, hi) : _mm256_min_ps(lo, hi);
}

__attribute__((target("avx2,f16c"))) static Py_ssize_t legacy_avx2(const float *x, uint8_t *y, uint8_t *codes, uint16_t *dp, uint16_t *mp,
                                                                Py_ssize_t nb, int bits, int with_min, float *amax) {
    const int nmax = 1 << (bits - 1), size = (with_min ? 4 : 2) + (bits == 5 ? 4 : 0) + 16, cb = 4 * bits;
    const __m256 lo_init = _mm256_set1_ps(with_min ? 3.402823466e+38f : INFINITY);
    const __m256 hi_init = _mm256_set1_ps(with_min ? -3.402823466e+38f : -INFINITY);
    const __m256 sign = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7), lowbyte = _mm256_set1_epi32(0xFF);
    const __m256i top = _mm256_set1_epi8((char)((1 << bits) - 1));
    const __m256 off = _mm256_set1_ps(with_min ? 0.5f : (float)nmax + 0.5f);
    const __m256 div = _mm256_set1_ps(with_min ? (float)((1 << bits) - 1) : (float)-nmax);
    __m256 run = _mm256_set1_ps(*amax);
    Py_ssize_t b0 = 0;
    for (; b0 + 8 <= nb; b0 += 8) {
        const float *xb = x + QK * b0;
        __m256 P[8], N[8];
        for (int k = 0; k < 8; ++k) {
            const float *v = xb + QK * k;
            const __m256 x0 = _mm256_loadu_ps(v), x1 = _mm256_loadu_ps(v + 8), x2 = _mm256_loadu_ps(v + 16), x3 = _mm256_loadu_ps(v + 24);
            P[k] = _mm256_max_ps(_mm256_max_ps(x2, _mm256_max_ps(x0, hi_init)), _mm256_max_ps(x3, _mm256_max_ps(x1, hi_init)));
            N[k] = _mm256_min_ps(_mm256_min_ps(x2, _mm256_min_ps(x0, lo_init)), _mm256_min_ps(x3, _mm256_min_ps(x1, lo_init)));
        }
        __m256 mx = hred8(P, 1), mn = hred8(N, 0);
        const __m256 A = _mm256_max_ps(mx, _mm256_xor_ps(mn, sign)); /* the largest magnitude, NaN skipped */
        run = _mm256_max_ps(A, run);
        float mxa[8], mna[8];
        _mm256_storeu_ps(mxa, mx);
        _mm256_storeu_ps(mna, mn);
        __m256 d, m = zero;
        if (!with_min) {
            const __m256 pos = _mm256_cmp_ps(mx, A, _CMP_EQ_OQ), neg = _mm256_cmp_ps(_mm256_xor_ps(mn, sign), A, _CMP_EQ_OQ);
            const __m256 valid = _mm256_cmp_ps(A, zero, _CMP_GT_OQ);
            __m256 mv = _mm256_and_ps(valid, _mm256_blendv_ps(mn, mx, pos));
            const int tie = _mm256_movemask_ps(_mm256_and_ps(valid, _mm256_and_ps(pos, neg)));
            if (tie) { /* +m and -m both: the first of them, as q4_0_like's loop */
                float mv_a[8];
                _mm256_storeu_ps(mv_a, mv);
                for (int k = 0; k < 8; ++k) {
                    if (!((tie >> k) & 1)) continue;
                    float am = 0.0f, v = 0.0f;
                    for (int j = 0; j < QK; j++)
                        if (am < fabsf(xb[QK * k + j])) {
                            am = fabsf(xb[QK * k + j]);
                            v = xb[QK * k + j];
                        }
                    mv_a[k] = v;
                }
                mv = _mm256_loadu_ps(mv_a);
            }
            d = _mm256_div_ps(mv, div);
        } else {
            const int z = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(mx, zero, _CMP_EQ_OQ), _mm256_cmp_ps(mn, zero, _CMP_EQ_OQ)));
            if (z) { /* a zero is the min or max: which zero's sign, the scalar loop's order decides */
                for (int k = 0; k < 8; ++k) {
                    if (!((z >> k) & 1)) continue;
                    float lo = 3.402823466e+38f, hi = -3.402823466e+38f;
                    for (int j = 0; j < QK; j++) {
                        if (xb[QK * k + j] < lo) lo = xb[QK * k + j];
                        if (xb[QK * k + j] > hi) hi = xb[QK * k + j];
                    }
                    mna[k] = lo;
                    mxa[k] = hi;
                }
                mx = _mm256_loadu_ps(mxa);
                mn = _mm256_loadu_ps(mna);
            }
            m = mn;
            d = _mm256_div_ps(_mm256_sub_ps(mx, mn), div);
        }
        const __m256 id = _mm256_and_ps(_mm256_div_ps(_mm256_set1_ps(1.0f), d), _mm256_cmp_ps(d, zero, _CMP_NEQ_UQ));
        uint16_t dh[8], mh[8];
        _mm_storeu_si128((__m128i *)dh, _mm256_cvtps_ph(d, _MM_FROUND_TO_NEAREST_INT));
        _mm_storeu_si128((__m128i *)mh, _mm256_cvtps_ph(m, _MM_FROUND_TO_NEAREST_INT));
        float ida[8], ma[8];
        _mm256_storeu_ps(ida, id);
        _mm256_storeu_ps(ma, m);
        const int nan = _mm256_movemask_ps(_mm256_cmp_ps(d, d, _CMP_UNORD_Q)) | _mm256_movemask_ps(_mm256_cmp_ps(m, m, _CMP_UNORD_Q));
        if (nan) { /* a NaN's F16 bits as f32_to_f16 writes them */
            float da[8];
            _mm256_storeu_ps(da, d);
            for (int k = 0; k < 8; ++k) {
                dh[k] = f32_to_f16(da[k]);
                mh[k] = f32_to_f16(ma[k]);
            }
        }
        if (dp) memcpy(dp + b0, dh, 16);
        if (mp) memcpy(mp + b0, mh, 16);
        for (int k = 0; k < 8; ++k) {
            const float *v = xb + QK * k;
            uint8_t *o = y + size * (b0 + k);
            const __m256 idk = _mm256_set1_ps(ida[k]), mk = _mm256_set1_ps(ma[k]);
            __m256i t[4];
            for (int g = 0; g < 4; ++g) {
                __m256 xv = _mm256_loadu_ps(v + 8 * g);
                if (with_min) xv = _mm256_sub_ps(xv, mk);
                t[g] = _mm256_and_si256(_mm256_cvttps_epi32(_mm256_add_ps(_mm256_mul_ps(xv, idk), off)), lowbyte);
            }
            __m256i q = _mm256_packus_epi16(_mm256_packus_epi32(t[0], t[1]), _mm256_packus_epi32(t[2], t[3]));
            q = _mm256_permutevar8x32_epi32(q, order); /* the 32 low bytes, element order */
            if (!with_min || bits == 4) q = _mm256_min_epi8(q, top);
            memcpy(o, &dh[k], 2);
            if (with_min) memcpy(o + 2, &mh[k], 2);
            uint8_t *qs = o + (with_min ? 4 : 2);
            if (bits == 5) {
                const uint32_t qh = (uint32_t)_mm256_movemask_epi8(_mm256_slli_epi16(q, 3)); /* bit 4 of each code */
                memcpy(qs, &qh, 4);
                qs += 4;
            }
            const __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
            const __m128i nib = _mm_set1_epi8(0x0F);
            _mm_storeu_si128((__m128i *)qs, _mm_or_si128(_mm_and_si128(lo, nib), _mm_andnot_si128(nib, _mm_slli_epi16(hi, 4))));
            if (codes) {
                uint8_t *c = codes + cb * (b0 + k);
                if (bits == 4) {
                    const __m256i w = _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi16(0x000F)),
                                                      _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi16(0x00F0)));
                    _mm_storeu_si128((__m128i *)c, _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
                } else {
                    __m256i w = _mm256_or_si256(_mm256_and_si256(q, _mm256_set1_epi16(0x001F)),
                                                _mm256_and_si256(_mm256_srli_epi16(q, 3), _mm256_set1_epi16(0x03E0)));
                    w = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi32(0x3FF)), _mm256_and_si256(_mm256_srli_epi32(w, 6), _mm256_set1_epi32(0xFFC00)));
                    w = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi64x(0xFFFFF)),
                                        _mm256_and_si256(_mm256_srli_epi64(w, 12), _mm256_set1_epi64x(0xFFFFF00000ll)));
                    w = _mm256_shuffle_epi8(w, _mm256_setr_epi8(0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 0, 0, 0, 0, 0, 0,
                                                                0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 0, 0, 0, 0, 0, 0));
                    const __m128i h1 = _mm256_extracti128_si256(w, 1);
                    _mm_storeu_si128((__m128i *)c, _mm256_castsi256_si128(w)); /* bytes 10..15 rewritten next */
                    _mm_storel_epi64((__m128i *)(c + 10), h1);
                    const uint16_t last = (uint16_t)_mm_extract_epi16(h1, 4);
                    memcpy(c + 18, &last, 2);
                }
            }
        }
    }
    float r[8];
    _mm256_storeu_ps(r, run);
    for (int k = 0; k < 8; ++k) *amax = MAX(*amax, r[k]);
    return b0;
}
#endif

/* One block of the input as float32: x itself for float32, else converted into buf (exactly:
 * binary16 and bfloat16 are subsets of binary32); *amax grows to its largest magnitude. */
/* Not inlined: its branches on the source kind stay out of the (large, inlined) block loops. */
static __attribute__((noinline)) const float *block_f32(const void *x, int src, Py_ssize_t i, int block, float *buf, int f16c,
                                                         float *amax) {
    const float *xb;
    if (src == SRC_F32) {
        xb = (const float *)x + i * block;
    } else if (src == SRC_F16) {
        const uint16_t *h = (const uint16_t *)x + i * block;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
        if (f16c) {
            f16_block_f16c(h, buf, block);
        } else
#endif
        {
            (void)f16c;
            for (int j = 0; j < block; ++j) buf[j] = f16_to_f32(h[j]);
        }
        xb = buf;
    } else {
        const uint16_t *h = (const uint16_t *)x + i * block;
        for (int j = 0; j < block; ++j) {
            const uint32_t bits = (uint32_t)h[j] << 16;
            memcpy(buf + j, &bits, 4);
        }
        xb = buf;
    }
    /* MAX(|v|, m) skips NaN (|v| > m is false) and is otherwise order-free: 8 running maxima,
     * not one 32- or 256-long dependency chain (block is a multiple of 8). */
    float m[8], r = *amax;
    for (int k = 0; k < 8; ++k) m[k] = r;
    for (int j = 0; j < block; j += 8)
        for (int k = 0; k < 8; ++k) m[k] = MAX(fabsf(xb[j + k]), m[k]);
    /* all non-NaN and >= +0: the tree's result equals the chain's */
    *amax = MAX(MAX(MAX(m[0], m[1]), MAX(m[2], m[3])), MAX(MAX(m[4], m[5]), MAX(m[6], m[7])));
    return xb;
}

/* The block loop of one type at one level: 0 the scalar functions, 1 the lane functions (in
 * the function's own ISA: baseline in run_lanes, AVX2 in run_lanes_avx2); returns the input's
 * largest magnitude (for the caller's range check). */
AI float run_body(int t, const void *x, int src, uint8_t *y, Py_ssize_t nb, int lanes, int f16c, uint8_t *codes, uint16_t *dp,
                 uint16_t *mp) {
    const int block = TYPES[t].block, size = TYPES[t].size;
    const char *n = TYPES[t].name;
    int lk = 0; /* which lane function: each called by name in its own loop, inlined in this ISA */
    float buf[QK_K], amax = 0.0f;
    if (lanes) {
        static const char *const lane_types[] = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q4_1", "Q5_1"};
        for (int k = 0; k < 10; ++k)
            if (!strcmp(n, lane_types[k])) lk = k + 1;
    }
    int ck = -1; /* codes_from_block's kind, where codes are written */
    const int cb = codes ? codes_bytes(n) : 0;
    if (cb) {
        static const char *const code_types[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q3_K"};
        for (int k = 0; k < 5; ++k)
            if (!strcmp(n, code_types[k])) ck = k;
    }
    Py_ssize_t i0 = 0;
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    if (f16c && src == SRC_F32 && lk >= 7) /* the legacy types in AVX2, 8 blocks at a time */
        i0 = legacy_avx2((const float *)x, y, codes, dp, mp, nb, lk <= 8 ? (lk == 7 ? 4 : 5) : (lk == 9 ? 4 : 5), lk >= 9, &amax);
#endif
    const int extras = ck >= 0 || dp || mp; /* the block loop without them where none is asked for */
#define QF_BLOCKS(fn)                                                                          \
    if (!extras)                                                                               \
        for (Py_ssize_t i = i0; i < nb; i++) fn(block_f32(x, src, i, block, buf, f16c, &amax), y + i * size); \
    else                                                                                       \
        for (Py_ssize_t i = i0; i < nb; i++) {                                                 \
            fn(block_f32(x, src, i, block, buf, f16c, &amax), y + i * size);                   \
            if (ck >= 0) codes_from_block(ck, y + i * size, codes + i * cb);                   \
            if (dp) memcpy(dp + i, y + i * size, 2);                                            \
            if (mp) memcpy(mp + i, y + i * size + 2, 2);                                        \
        }
    switch (lk) {
    case 1: QF_BLOCKS(q2_k_lanes); break;
    case 2: QF_BLOCKS(q3_k_lanes); break;
    case 3: QF_BLOCKS(q4_k_lanes); break;
    case 4: QF_BLOCKS(q5_k_lanes); break;
    case 5: QF_BLOCKS(q6_k_lanes); break;
    case 6: QF_BLOCKS(q8_0_lanes); break;
    case 7: QF_BLOCKS(q4_0_lanes); break;
    case 8: QF_BLOCKS(q5_0_lanes); break;
    case 9: QF_BLOCKS(q4_1_lanes); break;
    case 10: QF_BLOCKS(q5_1_lanes); break;
    default: QF_BLOCKS(TYPES[t].fn);
    }
#undef QF_BLOCKS
    return amax;
}

static float run_scalar(int t, const void *x, int src, uint8_t *y, Py_ssize_t nb, uint8_t *c, uint16_t *dp, uint16_t *mp) {
    return run_body(t, x, src, y, nb, 0, 0, c, dp, mp);
}
static float run_lanes(int t, const void *x, int src, uint8_t *y, Py_ssize_t nb, uint8_t *c, uint16_t *dp, uint16_t *mp) {
    return run_body(t, x, src, y, nb, 1, 0, c, dp, mp);
}
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define QF_X86 1
__attribute__((target("avx2,f16c"))) static float run_lanes_avx2(int t, const void *x, int src, uint8_t *y, Py_ssize_t nb, uint8_t *c,
                                                                  uint16_t *dp, uint16_t *mp) {
    return run_body(t, x, src, y, nb, 1, 1, c, dp, mp);
}
__attribute__((target("avx2,f16c"))) static void weighted_lanes_avx2(int t, const float *x, const float *qw, Py_ssize_t rows, Py_ssize_t n,
                                                                uint8_t *y) {
    weighted_body(t, x, qw, rows, n, y, 1);
}
/* Without AVX2 (and F16C, which every AVX2 CPU has) the scalar functions: the lanes as SSE
 * pairs measured slower than them. */
static int best_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") ? 2 : 0;
}
static int max_level(void) { return best_level() == 2 ? 2 : 1; }
#else
static int best_level(void) { return 0; }
static int max_level(void) { return 1; }
#endif

/* quantize(type, x, out[, level[, src[, codes[, d[, m]]]]]): x a C-contiguous buffer of whole
 * blocks of float32 (src 0, the default), float16 (1) or bfloat16 (2) values, out a writable
 * buffer of exactly the blocks' bytes; level 0 the scalar functions, 1 the lane functions in the
 * baseline ISA, 2 in AVX2, -1 (default) best_level().  codes (None or a writable buffer of
 * exactly codes_bytes() per block; Q4_0, Q4_1, Q5_0, Q5_1 and Q3_K only): also the blocks' packed
 * codes, the bytes extract_packed reads out of them for rows of whole blocks; d and m (None or
 * writable buffers of 2 bytes per block; Q4_0, Q4_1, Q5_0, Q5_1, m only Q4_1 and Q5_1): the
 * blocks' F16 d and m, as stored in them.  Every level and source kind writes the same bytes for
 * the same values (tests compare them all).  Returns the input's largest magnitude (NaN
 * skipped). */
static PyObject *py_quantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer xb, yb, cbuf = {0}, dbuf = {0}, mbuf = {0};
    int level = -1, src = SRC_F32;
    PyObject *co = Py_None, *dobj = Py_None, *mobj = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "sy*w*|iiOOO", &name, &xb, &yb, &level, &src, &co, &dobj, &mobj)) return NULL;
    if ((co != Py_None && PyObject_GetBuffer(co, &cbuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) ||
        (dobj != Py_None && PyObject_GetBuffer(dobj, &dbuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) ||
        (mobj != Py_None && PyObject_GetBuffer(mobj, &mbuf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)) {
        PyBuffer_Release(&xb);
        PyBuffer_Release(&yb);
        if (cbuf.buf != NULL) PyBuffer_Release(&cbuf);
        if (dbuf.buf != NULL) PyBuffer_Release(&dbuf);
        return NULL;
    }
    int t = -1;
    for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++)
        if (strcmp(name, TYPES[k].name) == 0) t = (int)k;
    PyObject *ret = NULL;
    const int esize = src == SRC_F32 ? 4 : 2;
    if (level < 0) level = best_level();
    if (t < 0) {
        PyErr_Format(PyExc_ValueError, "unknown type %s", name);
    } else if (src < SRC_F32 || src > SRC_BF16) {
        PyErr_Format(PyExc_ValueError, "unknown source kind %d", src);
    } else if (level > max_level()) {
        PyErr_Format(PyExc_ValueError, "level %d is not supported on this CPU (at most %d)", level, max_level());
    } else if (xb.len % (esize * TYPES[t].block)) {
        PyErr_SetString(PyExc_ValueError, "the input is not whole blocks");
    } else if (yb.len != xb.len / (esize * TYPES[t].block) * TYPES[t].size) {
        PyErr_SetString(PyExc_ValueError, "the output buffer does not hold exactly the blocks");
    } else if (cbuf.buf != NULL && !codes_bytes(TYPES[t].name)) {
        PyErr_Format(PyExc_ValueError, "quantize writes no codes for type %s", name);
    } else if (cbuf.buf != NULL && cbuf.len != xb.len / (esize * TYPES[t].block) * codes_bytes(TYPES[t].name)) {
        PyErr_SetString(PyExc_ValueError, "the codes buffer does not hold exactly the blocks' codes");
    } else if ((dbuf.buf != NULL && (t > 3 || dbuf.len != xb.len / (esize * QK) * 2)) ||
               (mbuf.buf != NULL && (t != 1 && t != 3 ? 1 : mbuf.len != xb.len / (esize * QK) * 2))) {
        PyErr_Format(PyExc_ValueError, "quantize writes no such d / m for type %s, or a buffer is not 2 bytes a block", name);
    } else {
        const Py_ssize_t nb = xb.len / (esize * TYPES[t].block);
        uint8_t *y = (uint8_t *)yb.buf, *c = (uint8_t *)cbuf.buf;
        uint16_t *dp = (uint16_t *)dbuf.buf, *mp = (uint16_t *)mbuf.buf;
        float amax;
        Py_BEGIN_ALLOW_THREADS
#if QF_X86
        if (level == 2)
            amax = run_lanes_avx2(t, xb.buf, src, y, nb, c, dp, mp);
        else
#endif
        if (level == 1)
            amax = run_lanes(t, xb.buf, src, y, nb, c, dp, mp);
        else
            amax = run_scalar(t, xb.buf, src, y, nb, c, dp, mp);
        Py_END_ALLOW_THREADS
        ret = PyFloat_FromDouble(amax);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    if (cbuf.buf != NULL) PyBuffer_Release(&cbuf);
    if (dbuf.buf != NULL) PyBuffer_Release(&dbuf);
    if (mbuf.buf != NULL) PyBuffer_Release(&mbuf);
    return ret;
}

/* quantize_weighted(type, x, importance, out[, level]): rows of x (C-contiguous float32, each of
 * len(importance) elements, a whole number of blocks) as ggml's quantize_<type> with those
 * quant_weights writes them, into out (exactly the rows' bytes); levels as quantize's. */
static PyObject *py_quantize_weighted(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer xb, wb, yb;
    int level = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "sy*y*w*|i", &name, &xb, &wb, &yb, &level)) return NULL;
    if (level < 0) level = best_level();
    int t = -1;
    for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++)
        if (strcmp(name, TYPES[k].name) == 0) t = (int)k;
    PyObject *ret = NULL;
    const Py_ssize_t n = wb.len / 4;
    if (t < 0) {
        PyErr_Format(PyExc_ValueError, "unknown type %s", name);
    } else if (level > max_level()) {
        PyErr_Format(PyExc_ValueError, "level %d is not supported on this CPU (at most %d)", level, max_level());
    } else if (wb.len % 4 || n == 0 || n % TYPES[t].block) {
        PyErr_SetString(PyExc_ValueError, "the importance vector is not whole float32 blocks");
    } else if (xb.len % (4 * n)) {
        PyErr_SetString(PyExc_ValueError, "the input is not whole rows of the importance vector's length");
    } else if (yb.len != xb.len / (4 * n) * (n / TYPES[t].block * TYPES[t].size)) {
        PyErr_SetString(PyExc_ValueError, "the output buffer does not hold exactly the rows' blocks");
    } else {
        const Py_ssize_t rows = xb.len / (4 * n);
        const float *x = (const float *)xb.buf, *qw = (const float *)wb.buf;
        uint8_t *y = (uint8_t *)yb.buf;
        Py_BEGIN_ALLOW_THREADS
#if QF_X86
        if (level == 2)
            weighted_lanes_avx2(t, x, qw, rows, n, y);
        else
#endif
        if (level == 1)
            weighted_lanes(t, x, qw, rows, n, y);
        else
            weighted_scalar(t, x, qw, rows, n, y);
        Py_END_ALLOW_THREADS
        ret = Py_None;
        Py_INCREF(ret);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&wb);
    PyBuffer_Release(&yb);
    return ret;
}

/* == The other way (issue 42 item 6): GGUF export's unpacking and ggml's dequantization ==========
 * unpack(words, bits, out): rows of codes packed lsb-first in bytes (a little-endian bit stream;
 * bits 1..8), words [rows, W] C-contiguous uint8, into out [rows, length] uint8 (length codes a
 * row, the first ceil(length * bits / 8) bytes of each row read).
 * dequantize(type, blocks, out): ggml's dequantize_row_<type> (ggml-quants.c) of whole blocks
 * into binary32 out: d (F16 widened exactly) times the code, one rounding per product in ggml's
 * order (and gguf-py's: qformat.export.gguf._decode, the NumPy statement of the same rule, which
 * tests compare with this).  Both release the GIL. */
static void unpack_rows_lsb(const uint8_t *w, Py_ssize_t rows, Py_ssize_t stride, int bits, Py_ssize_t length, uint8_t *out) {
    const unsigned mask = (1u << bits) - 1u;
    const Py_ssize_t nbytes = (length * bits + 7) / 8;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * stride;
        uint8_t *o = out + r * length;
        if (bits == 8) {
            memcpy(o, row, (size_t)length);
        } else if (bits == 4) {
            Py_ssize_t i = 0;
            for (; i + 1 < length; i += 2) {
                o[i] = row[i >> 1] & 0xF;
                o[i + 1] = row[i >> 1] >> 4;
            }
            if (i < length) o[i] = row[i >> 1] & 0xF;
        } else if (bits == 2) {
            for (Py_ssize_t i = 0; i < length; i++) o[i] = (row[i >> 2] >> ((i & 3) * 2)) & 3;
        } else if (bits == 1) {
            for (Py_ssize_t i = 0; i < length; i++) o[i] = (row[i >> 3] >> (i & 7)) & 1;
        } else {
            /* 8 codes are exactly `bits` bytes: whole groups at once, then the rest code by code */
            const Py_ssize_t groups = length / 8;
            for (Py_ssize_t g = 0; g < groups; g++) {
                const uint8_t *src = row + g * bits;
                uint64_t v = 0;
                for (int k = 0; k < bits; k++) v |= (uint64_t)src[k] << (8 * k);
                uint8_t *dst = o + g * 8;
                for (int k = 0; k < 8; k++) dst[k] = (uint8_t)((v >> (k * bits)) & mask);
            }
            Py_ssize_t bit = groups * 8 * (Py_ssize_t)bits;
            for (Py_ssize_t i = groups * 8; i < length; i++, bit += bits) {
                const Py_ssize_t b = bit >> 3;
                unsigned v = row[b];
                if (b + 1 < nbytes) v |= (unsigned)row[b + 1] << 8;
                o[i] = (uint8_t)((v >> (bit & 7)) & mask);
            }
        }
    }
}

static PyObject *py_unpack(PyObject *self, PyObject *args) {
    Py_buffer wb, ob;
    int bits;
    Py_ssize_t rows;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*inw*", &wb, &bits, &rows, &ob)) return NULL;
    PyObject *ret = NULL;
    if (bits < 1 || bits > 8) {
        PyErr_Format(PyExc_ValueError, "bits %d is not 1..8", bits);
    } else if (rows <= 0 || wb.len % rows || ob.len % rows) {
        PyErr_SetString(PyExc_ValueError, "the words and the output are not whole rows");
    } else if ((ob.len / rows * bits + 7) / 8 > wb.len / rows) {
        PyErr_SetString(PyExc_ValueError, "a row of words is shorter than its codes");
    } else {
        const uint8_t *w = (const uint8_t *)wb.buf;
        uint8_t *o = (uint8_t *)ob.buf;
        const Py_ssize_t stride = wb.len / rows, length = ob.len / rows;
        Py_BEGIN_ALLOW_THREADS
        unpack_rows_lsb(w, rows, stride, bits, length, o);
        Py_END_ALLOW_THREADS
        ret = Py_None;
        Py_INCREF(ret);
    }
    PyBuffer_Release(&wb);
    PyBuffer_Release(&ob);
    return ret;
}

static inline void k4_scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
    }
}

static void deq_block(int t, const uint8_t *b, float *y) {
    switch (t) {
    case 0: { /* Q4_0 */
        const float d = get16(b);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)((b[2 + j] & 0xF) - 8) * d;
            y[j + 16] = (float)((b[2 + j] >> 4) - 8) * d;
        }
        break;
    }
    case 1: { /* Q4_1 */
        const float d = get16(b), m = get16(b + 2);
        for (int j = 0; j < 16; j++) {
            y[j] = (float)(b[4 + j] & 0xF) * d + m;
            y[j + 16] = (float)(b[4 + j] >> 4) * d + m;
        }
        break;
    }
    case 2: case 3: { /* Q5_0, Q5_1 */
        const int with_m = t == 3;
        const float d = get16(b), m = with_m ? get16(b + 2) : 0.0f;
        const uint8_t *h = b + (with_m ? 4 : 2), *qs = h + 4;
        const uint32_t qh = (uint32_t)h[0] | ((uint32_t)h[1] << 8) | ((uint32_t)h[2] << 16) | ((uint32_t)h[3] << 24);
        for (int j = 0; j < 16; j++) {
            const int x0 = (qs[j] & 0xF) | (((qh >> j) << 4) & 0x10), x1 = (qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
            if (with_m) {
                y[j] = (float)x0 * d + m;
                y[j + 16] = (float)x1 * d + m;
            } else {
                y[j] = (float)(x0 - 16) * d;
                y[j + 16] = (float)(x1 - 16) * d;
            }
        }
        break;
    }
    case 4: { /* Q8_0 */
        const float d = get16(b);
        for (int j = 0; j < 32; j++) y[j] = (float)(int8_t)b[2 + j] * d;
        break;
    }
    case 5: { /* Q2_K: scales[16], qs[64], d, dmin */
        const uint8_t *sc = b, *q = b + 16;
        const float d = get16(b + 80), mn = get16(b + 82);
        int is = 0;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                for (int half = 0; half < 2; half++) {
                    const uint8_t s = sc[is++];
                    const float dl = d * (float)(s & 0xF), ml = mn * (float)(s >> 4);
                    for (int l = 0; l < 16; l++) *y++ = dl * (float)((q[l + 16 * half] >> shift) & 3) - ml;
                }
                shift += 2;
            }
            q += 32;
        }
        break;
    }
    case 6: { /* Q3_K: hmask[32], qs[64], scales[12], d */
        const uint8_t *hm = b, *q = b + 32, *s = b + 96;
        const float d = get16(b + 108);
        int8_t scales[16];
        for (int j = 0; j < 16; j++) {
            const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
            const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
            scales[j] = (int8_t)((lo | (hi << 4)) - 32);
        }
        int is = 0;
        uint8_t m = 1;
        for (int n = 0; n < QK_K; n += 128) {
            int shift = 0;
            for (int j = 0; j < 4; j++) {
                for (int half = 0; half < 2; half++) {
                    const float dl = d * (float)scales[is++];
                    for (int l = 0; l < 16; l++) {
                        const int k = l + 16 * half;
                        *y++ = dl * (float)(((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4));
                    }
                }
                shift += 2;
                m <<= 1;
            }
            q += 32;
        }
        break;
    }
    case 7: case 8: { /* Q4_K: d, dmin, scales[12], qs[128]; Q5_K: the same with qh[32] before qs */
        const float d = get16(b), mn = get16(b + 2);
        const uint8_t *sc = b + 4, *qh = b + 16, *ql = b + (t == 8 ? 48 : 16);
        int is = 0;
        uint8_t u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            uint8_t s, mm;
            k4_scale_min(is, sc, &s, &mm);
            const float d1 = d * (float)s, m1 = mn * (float)mm;
            k4_scale_min(is + 1, sc, &s, &mm);
            const float d2 = d * (float)s, m2 = mn * (float)mm;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)((ql[l] & 0xF) + (t == 8 && (qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)((ql[l] >> 4) + (t == 8 && (qh[l] & u2) ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
        break;
    }
    case 9: { /* Q6_K: ql[128], qh[64], scales[16] (int8), d */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        const float d = get16(b + 208);
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
        break;
    }
    }
}

static const struct {
    const char *name;
    int block, size;
} DEQ_TYPES[] = {{"Q4_0", QK, 18}, {"Q4_1", QK, 20}, {"Q5_0", QK, 22}, {"Q5_1", QK, 24}, {"Q8_0", QK, 34},
                 {"Q2_K", QK_K, 84}, {"Q3_K", QK_K, 110}, {"Q4_K", QK_K, 144}, {"Q5_K", QK_K, 176}, {"Q6_K", QK_K, 210}};

static PyObject *py_dequantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer bb, yb;
    (void)self;
    if (!PyArg_ParseTuple(args, "sy*w*", &name, &bb, &yb)) return NULL;
    int t = -1;
    for (size_t k = 0; k < sizeof DEQ_TYPES / sizeof DEQ_TYPES[0]; k++)
        if (strcmp(name, DEQ_TYPES[k].name) == 0) t = (int)k;
    PyObject *ret = NULL;
    if (t < 0) {
        PyErr_Format(PyExc_ValueError, "dequantize: unknown type %s", name);
    } else if (bb.len % DEQ_TYPES[t].size || yb.len != bb.len / DEQ_TYPES[t].size * DEQ_TYPES[t].block * 4) {
        PyErr_SetString(PyExc_ValueError, "dequantize: the blocks and the output do not match");
    } else {
        const Py_ssize_t nb = bb.len / DEQ_TYPES[t].size;
        const uint8_t *b = (const uint8_t *)bb.buf;
        float *y = (float *)yb.buf;
        const int size = DEQ_TYPES[t].size, block = DEQ_TYPES[t].block;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < nb; i++) deq_block(t, b + i * size, y + i * block);
        Py_END_ALLOW_THREADS
        ret = Py_None;
        Py_INCREF(ret);
    }
    PyBuffer_Release(&bb);
    PyBuffer_Release(&yb);
    return ret;
}

/* The body of py_insert (runs checked by the caller): ``table`` NULL, the codes as stored, with
 * no lookup; inlined at each call, so the two calls compile to two loops and the one without a
 * table vectorizes (a GGUF export's codes are the stored ones for every type but Q4_0's signed
 * forms). */
AI void insert_runs(uint8_t *b, const uint8_t *c, const int32_t *r, Py_ssize_t nb, Py_ssize_t nr, Py_ssize_t size, Py_ssize_t per,
                   const uint8_t *table) {
    for (Py_ssize_t i = 0; i < nb; i++) {
        uint8_t *blk = b + i * size;
        const uint8_t *cd = c + i * per;
        for (Py_ssize_t j = 0; j < nr; j++) {
            const int32_t *q = r + 6 * j;
            const int n = q[1], rs = q[3], ls = q[5];
            const uint8_t mask = (uint8_t)q[4];
            const uint8_t *restrict src = cd + q[0];
            uint8_t *restrict dst = blk + q[2];
            if (table != NULL) {
                for (int k = 0; k < n; k++) dst[k] |= (uint8_t)((uint8_t)((table[src[k]] >> ls) & mask) << rs);
            } else if (rs == 0 && ls == 0 && mask == 0xFF) {
                for (int k = 0; k < n; k++) dst[k] |= src[k];
            } else {
                for (int k = 0; k < n; k++) dst[k] |= (uint8_t)((uint8_t)((src[k] >> ls) & mask) << rs);
            }
        }
    }
}

/* insert(blocks, codes, runs, nblocks[, table]): the inverse of qformat.convert._fastpack.extract, what
 * qformat.export.gguf._insert does in NumPy: for every block i (blocks [nb, size], codes
 * [nb, per] uint8, C-contiguous) and run (c0, n, b0, rs, mask, ls) of runs (int32 [R, 6]),
 * blocks[i, b0 + k] |= ((code >> ls) & mask) << rs for k < n (bounds checked here), where code is
 * codes[i, c0 + k], or table[codes[i, c0 + k]] when a 256-byte table is given. */
static PyObject *py_insert(PyObject *self, PyObject *args) {
    Py_buffer bb, cb, rb, lb = {0};
    Py_ssize_t nb;
    (void)self;
    if (!PyArg_ParseTuple(args, "w*y*y*n|y*", &bb, &cb, &rb, &nb, &lb)) return NULL;
    PyObject *ret = NULL;
    const Py_ssize_t nr = rb.len / (6 * (Py_ssize_t)sizeof(int32_t));
    uint8_t table[256];
    if (lb.buf != NULL && lb.len == 256) memcpy(table, lb.buf, 256);
    if (lb.buf != NULL && lb.len != 256) {
        PyErr_SetString(PyExc_ValueError, "insert: the code table is not 256 bytes");
    } else if (nb <= 0 || bb.len % nb || cb.len % nb || rb.len % (6 * (Py_ssize_t)sizeof(int32_t))) {
        PyErr_SetString(PyExc_ValueError, "insert: the blocks, codes and runs are not whole rows");
    } else {
        const Py_ssize_t size = bb.len / nb, per = cb.len / nb;
        const int32_t *r = (const int32_t *)rb.buf;
        int bad = 0;
        for (Py_ssize_t j = 0; j < nr; j++) {
            const int32_t *q = r + 6 * j;
            if (q[0] < 0 || q[1] < 0 || q[2] < 0 || q[0] + q[1] > per || q[2] + q[1] > size || q[3] < 0 || q[3] > 7 || q[5] < 0 || q[5] > 7)
                bad = 1;
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "insert: a run lies outside the block or the codes");
        } else {
            uint8_t *b = (uint8_t *)bb.buf;
            const uint8_t *c = (const uint8_t *)cb.buf;
            Py_BEGIN_ALLOW_THREADS
            if (lb.buf == NULL)
                insert_runs(b, c, r, nb, nr, size, per, NULL);
            else
                insert_runs(b, c, r, nb, nr, size, per, table);
            Py_END_ALLOW_THREADS
            ret = Py_None;
            Py_INCREF(ret);
        }
    }
    PyBuffer_Release(&bb);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&rb);
    if (lb.buf != NULL) PyBuffer_Release(&lb);
    return ret;
}

/* extract_packed(blocks, nblocks, runs, count, bits, length, out): a GGUF code field read out of
 * every block and packed canonically, what qformat.convert._fastpack.extract_packed gives: for
 * block i, code c0 + k (of count) is the OR over the runs (c0, n, b0, rs, mask, ls) (int32
 * [R, 6]) of ((block[b0 + k] >> rs) & mask) << ls; rows of length codes (whole blocks) are packed
 * least significant bits first into ceil(length * bits / 8) bytes each, padding bits zero. */
static PyObject *py_extract_packed(PyObject *self, PyObject *args) {
    Py_buffer bb, rb, ob;
    Py_ssize_t nb, length;
    int count, bits;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*ny*iinw*", &bb, &nb, &rb, &count, &bits, &length, &ob)) return NULL;
    PyObject *ret = NULL;
    const Py_ssize_t nr = rb.len / (6 * (Py_ssize_t)sizeof(int32_t));
    if (nb <= 0 || bb.len % nb || count <= 0 || count > 4096 || bits < 1 || bits > 8 || length <= 0 || length % count ||
        rb.len % (6 * (Py_ssize_t)sizeof(int32_t)) || (nb * count) % length) {
        PyErr_SetString(PyExc_ValueError, "extract_packed: inconsistent sizes");
    } else {
        const Py_ssize_t size = bb.len / nb, rows = nb * count / length, width = (length * bits + 7) / 8, bpr = length / count;
        const int32_t *r = (const int32_t *)rb.buf;
        int bad = ob.len != rows * width;
        for (Py_ssize_t j = 0; j < nr && !bad; j++) {
            const int32_t *q = r + 6 * j;
            if (q[0] < 0 || q[1] < 0 || q[2] < 0 || q[0] + q[1] > count || q[2] + q[1] > size || q[3] < 0 || q[3] > 7 || q[5] < 0 || q[5] > 7)
                bad = 1;
        }
        if (bad) {
            PyErr_SetString(PyExc_ValueError, "extract_packed: a run lies outside the block or the codes, or the output is not the rows' bytes");
        } else {
            const uint8_t *b = (const uint8_t *)bb.buf;
            uint8_t *o = (uint8_t *)ob.buf;
            /* a first run over every code is stored, not OR-ed into zeros (no memset); 8-bit codes
             * that are one run of whole bytes (Q8_0) are copied straight from the block */
            const int first_all = nr > 0 && r[0] == 0 && r[1] == count;
            const int whole_bytes = bits == 8 && nr == 1 && first_all && r[3] == 0 && r[5] == 0 && (uint8_t)r[4] == 0xFF;
            Py_BEGIN_ALLOW_THREADS
            uint8_t codes[4096];
            for (Py_ssize_t row = 0; row < rows; row++) {
                uint8_t *orow = o + row * width, *w = orow;
                uint64_t acc = 0; /* bits not yet stored, least significant first */
                int nacc = 0;
                for (Py_ssize_t k = 0; k < bpr; k++) {
                    const uint8_t *blk = b + (row * bpr + k) * size;
                    if (whole_bytes) {
                        memcpy(w, blk + r[2], (size_t)count);
                        w += count;
                        continue;
                    }
                    if (!first_all) memset(codes, 0, (size_t)count);
                    for (Py_ssize_t j = 0; j < nr; j++) {
                        const int32_t *q = r + 6 * j;
                        const int n = q[1], rs = q[3], ls = q[5];
                        const uint8_t mask = (uint8_t)q[4];
                        const uint8_t *restrict src = blk + q[2];
                        uint8_t *restrict dst = codes + q[0];
                        if (j == 0 && first_all) {
                            for (int e = 0; e < n; e++) dst[e] = (uint8_t)((uint8_t)((src[e] >> rs) & mask) << ls);
                        } else {
                            for (int e = 0; e < n; e++) dst[e] |= (uint8_t)((uint8_t)((src[e] >> rs) & mask) << ls);
                        }
                    }
                    if (bits == 8) {
                        memcpy(w, codes, (size_t)count);
                        w += count;
                    } else if (nacc == 0 && count % 8 == 0) { /* 8 codes are exactly `bits` bytes */
                        const uint64_t m = (1u << bits) - 1u;
                        for (int e = 0; e < count; e += 8) {
                            uint64_t v = 0;
                            for (int i = 0; i < 8; i++) v |= (codes[e + i] & m) << (i * bits);
                            for (int i = 0; i < bits; i++) w[i] = (uint8_t)(v >> (8 * i));
                            w += bits;
                        }
                    } else {
                        const uint64_t m = (1u << bits) - 1u;
                        for (int e = 0; e < count; e++) {
                            acc |= (codes[e] & m) << nacc;
                            nacc += bits;
                            while (nacc >= 8) {
                                *w++ = (uint8_t)acc;
                                acc >>= 8;
                                nacc -= 8;
                            }
                        }
                    }
                }
                if (nacc > 0) *w++ = (uint8_t)acc; /* the row's last bits, padding zero */
                (void)orow;
            }
            Py_END_ALLOW_THREADS
            ret = Py_None;
            Py_INCREF(ret);
        }
    }
    PyBuffer_Release(&bb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ob);
    return ret;
}

static PyObject *py_best_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(best_level());
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS,
     "quantize(type, x, out[, level[, src[, codes]]]): ggml's reference blocks of x (float32, float16 or bfloat16) into out "
     "(and, for Q4_0, Q4_1, Q5_0, Q5_1, Q3_K, their packed codes into codes); returns the largest magnitude of x."},
    {"quantize_weighted", py_quantize_weighted, METH_VARARGS,
     "quantize_weighted(type, x, importance, out): rows of float32 x as ggml's quantize_<type> with quant_weights."},
    {"unpack", py_unpack, METH_VARARGS,
     "unpack(words, bits, rows, out): rows of lsb-first packed codes (uint8 bytes) into out, one uint8 code each."},
    {"dequantize", py_dequantize, METH_VARARGS,
     "dequantize(type, blocks, out): ggml's dequantize_row_<type> of whole blocks (Q4_0 ... Q6_K) into float32 out."},
    {"insert", py_insert, METH_VARARGS,
     "insert(blocks, codes, runs, nblocks): OR each block's codes into their bits of the block (the runs of a GGUF field)."},
    {"extract_packed", py_extract_packed, METH_VARARGS,
     "extract_packed(blocks, nblocks, runs, count, bits, length, out): a field's codes of every block, packed canonically in rows of length."},
    {"best_level", py_best_level, METH_NOARGS, "The level used by default: 2 (lanes, AVX2) where the CPU has AVX2, else 0 (scalar)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml", "qformat's native GGUF block quantizers.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml(void) { return PyModule_Create(&module); }


/* == IQ4_NL, IQ4_XS, TQ1_0, TQ2_0 (issue 42 item 7) =============================================
 * ggml's quantize_iq4_nl / quantize_iq4_xs (quantize_row_iq4_nl_impl with ntry 7, what
 * llama-quantize calls, with or without quant_weights) and quantize_row_tq1_0_ref / _tq2_0_ref,
 * as qformat/schemes/ggml_blocks.py computes them (the NumPy reference, bit-identical; tests
 * compare the two and both with llama.cpp's ggml-quants.c).  Scalar, block by block. */
static const int8_t KVALUES_IQ4NL[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static inline int best_index_iq4(float x) {
    const int8_t *val = KVALUES_IQ4NL;
    if (x <= val[0]) return 0;
    if (x >= val[15]) return 15;
    int ml = 0, mu = 15;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav; else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

/* quantize_row_iq4_nl_impl(sbs, 32, x, ..., kvalues_iq4nl, qw, 7): sbs 32 writes an IQ4_NL
 * block (d, qs), 256 an IQ4_XS block (d, scales_h, scales_l, qs); qw NULL: weights x^2. */
static void iq4_impl(int sbs, const float *x, const float *qw, uint8_t *y) {
    const int ntry = 7, nb = sbs / 32;
    const int8_t *values = KVALUES_IQ4NL;
    float scales[QK_K / 32], weight[32];
    uint8_t L[QK_K];
    float sigma2 = 0;
    for (int j = 0; j < sbs; ++j) sigma2 += x[j] * x[j];
    sigma2 *= 2.f / sbs;
    float max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < nb; ++ib) {
        const float *xb = x + ib * 32;
        uint8_t *Lb = L + ib * 32;
        if (qw) {
            for (int j = 0; j < 32; ++j) weight[j] = qw[ib * 32 + j] * sqrtf(sigma2 + xb[j] * xb[j]);
        } else {
            for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
        }
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) {
                amax = ax;
                max = xb[j];
            }
        }
        if (amax < GROUP_MAX_EPS) {
            scales[ib] = 0;
            memset(Lb, 0, 32); /* every later use recomputes these codes (ntry > 0) */
            continue;
        }
        float d = -max / values[0];
        float id = 1 / d;
        float sumqx = 0, sumq2 = 0;
        for (int j = 0; j < 32; ++j) {
            int l = best_index_iq4(id * xb[j]);
            Lb[j] = (uint8_t)l;
            float q = values[l], w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
        float best = d * sumqx;
        for (int itry = -ntry; itry <= ntry; ++itry) {
            id = (itry + values[0]) / max;
            sumqx = sumq2 = 0;
            for (int j = 0; j < 32; ++j) {
                float q = values[best_index_iq4(id * xb[j])], w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        float abs_d = fabsf(d);
        if (abs_d > amax_scale) {
            amax_scale = abs_d;
            max_scale = d;
        }
    }
    uint8_t *q4;
    if (nb > 1) {
        uint16_t scales_h = 0;
        uint8_t *scales_l = y + 4;
        float d = -max_scale / 32;
        put16(y, f32_to_f16(d));
        float id = d ? 1 / d : 0.f;
        for (int ib = 0; ib < nb; ++ib) {
            int l = nearest_int(id * scales[ib]);
            l = MAX(-32, MIN(31, l));
            float dl = d * l;
            float idl = dl ? 1 / dl : 0.f;
            for (int j = 0; j < 32; ++j) L[ib * 32 + j] = (uint8_t)best_index_iq4(idl * x[ib * 32 + j]);
            l += 32;
            uint8_t l_l = l & 0xf, l_h = (uint8_t)(l >> 4);
            if (ib % 2 == 0) scales_l[ib / 2] = l_l;
            else scales_l[ib / 2] |= (uint8_t)(l_l << 4);
            scales_h |= (uint16_t)(l_h << 2 * (ib % 8));
        }
        put16(y + 2, scales_h);
        q4 = y + 8;
    } else {
        put16(y, f32_to_f16(scales[0]));
        float id = scales[0] ? 1 / scales[0] : 0;
        for (int j = 0; j < sbs; ++j) L[j] = (uint8_t)best_index_iq4(id * x[j]);
        q4 = y + 2;
    }
    for (int i = 0; i < sbs / 32; ++i)
        for (int j = 0; j < 16; ++j) q4[16 * i + j] = (uint8_t)(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
}

static void iq4_nl_block(const float *x, uint8_t *y) { iq4_impl(QK, x, NULL, y); }
static void iq4_xs_block(const float *x, uint8_t *y) { iq4_impl(QK_K, x, NULL, y); }

/* (int)lroundf(v) as ggml meets it on x86-64: half away from zero; Inf / NaN (a block below
 * ~3e-39, whose 1/d overflows) give LONG_MIN, whose low 32 bits are 0. */
static inline int lround_i32(float v) {
    if (!(fabsf(v) < 2147483648.f)) return 0;
    return (int)lroundf(v);
}

/* TQ1_0 / TQ2_0's shared start: d = amax (F16 at byte d_off), the digits lroundf(x / d) + 1. */
static void ternary_digits(const float *x, int *xi, uint8_t *y, int d_off) {
    float amax = 0.0f;
    for (int j = 0; j < QK_K; j++) amax = MAX(amax, fabsf(x[j]));
    const float d = amax, id = d ? 1.0f / d : 0.0f;
    put16(y + d_off, f32_to_f16(d));
    for (int j = 0; j < QK_K; j++) xi[j] = lround_i32(x[j] * id) + 1;
}

static inline uint8_t ceil_243(uint8_t q) { return (uint8_t)(((uint16_t)q * 256 + (243 - 1)) / 243); }

static void tq1_0_block(const float *x, uint8_t *y) {
    int xi[QK_K];
    ternary_digits(x, xi, y, 52);
    for (int m = 0; m < 32; ++m) { /* 5 elements per byte, along 32 bytes */
        uint8_t q = 0;
        for (int n = 0; n < 5; ++n) q = (uint8_t)(q * 3 + xi[m + n * 32]);
        y[m] = ceil_243(q);
    }
    for (int m = 0; m < 16; ++m) { /* along 16 bytes */
        uint8_t q = 0;
        for (int n = 0; n < 5; ++n) q = (uint8_t)(q * 3 + xi[160 + m + n * 16]);
        y[32 + m] = ceil_243(q);
    }
    for (int j = 0; j < 4; ++j) { /* qh: 4 elements per byte, the first in the top trit */
        uint8_t q = 0;
        for (int m = 0; m < 4; ++m) q = (uint8_t)(q * 3 + xi[240 + j + m * 4]);
        q = (uint8_t)(q * 3);
        y[48 + j] = ceil_243(q);
    }
}

static void tq2_0_block(const float *x, uint8_t *y) {
    int xi[QK_K];
    ternary_digits(x, xi, y, 64);
    for (int j = 0; j < 2; ++j)
        for (int m = 0; m < 32; ++m) {
            uint8_t q = 0;
            for (int n = 0; n < 4; ++n) q = (uint8_t)(q + ((xi[128 * j + m + n * 32] & 3) << (2 * n)));
            y[32 * j + m] = q;
        }
}

/* quantize_<type> with quant_weights for these types (1), or 0 for another type: IQ4_NL / IQ4_XS
 * use the weights; quantize_tq1_0 / _tq2_0 ignore them. */
static int nonlinear_weighted_row(const char *name, const float *x, const float *qw, Py_ssize_t n, uint8_t *y) {
    if (!strcmp(name, "IQ4_NL")) {
        for (Py_ssize_t i = 0; i < n / QK; i++) iq4_impl(QK, x + i * QK, qw + i * QK, y + i * 18);
    } else if (!strcmp(name, "IQ4_XS")) {
        for (Py_ssize_t i = 0; i < n / QK_K; i++) iq4_impl(QK_K, x + i * QK_K, qw + i * QK_K, y + i * 136);
    } else if (!strcmp(name, "TQ1_0")) {
        for (Py_ssize_t i = 0; i < n / QK_K; i++) tq1_0_block(x + i * QK_K, y + i * 54);
    } else if (!strcmp(name, "TQ2_0")) {
        for (Py_ssize_t i = 0; i < n / QK_K; i++) tq2_0_block(x + i * QK_K, y + i * 66);
    } else {
        return 0;
    }
    return 1;
}
