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
    if (bits == 4) {
        for (int j = 0; j < QK / 2; j++) y[2 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    } else {
        uint32_t qh = 0;
        for (int j = 0; j < QK; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        for (int k = 0; k < 4; k++) y[2 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < QK / 2; j++) y[6 + j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    }
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
    if (bits == 4) {
        for (int j = 0; j < QK / 2; j++) y[4 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    } else {
        uint32_t qh = 0;
        for (int j = 0; j < QK; j++) qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        for (int k = 0; k < 4; k++) y[4 + k] = (uint8_t)(qh >> (8 * k));
        for (int j = 0; j < QK / 2; j++) y[8 + j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    }
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
static void fit_codes(int n, int nmax, const float *x, float iscale, int8_t *L, int offset, float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = MAX(-nmax, MIN(nmax - 1, l));
        if (L) L[i] = (int8_t)(l + offset);
        float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

static float make_qx(int n, int nmax, const float *x, int8_t *L) {
    float max;
    if (absmax(n, x, &max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float sumlx, suml2;
    fit_codes(n, nmax, x, -nmax / max, L, nmax, &sumlx, &suml2);
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        const float iscale = -(nmax + 0.1f * is) / max;
        fit_codes(n, nmax, x, iscale, NULL, 0, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            fit_codes(n, nmax, x, iscale, L, nmax, &sumlx, &suml2);  /* the same sums again, and the codes */
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
    fit_codes(n, nmax, x, -nmax / max, L, 0, &sumlx, &suml2);
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

static void q2_k_finish(const float *x, uint8_t *y, const float *scales, const float *mins, uint8_t *L) {
    uint8_t *sc = y, *qs = y + 16;
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
    two_bit_planes(L, qs);
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

static void q3_k_finish(const float *x, uint8_t *y, const float *scales, int8_t *L) {
    uint8_t *hmask = y, *qs = y + 32, *sc = y + 96;
    float max_scale;
    absmax(16, scales, &max_scale);
    memset(sc, 0, 12);
    uint16_t d16;
    if (max_scale) {
        float iscale = -32.f / max_scale;
        for (int j = 0; j < 16; ++j) {
            int8_t l = (int8_t)nearest_int(iscale * scales[j]);
            l = (int8_t)(MAX(-32, MIN(31, l)) + 32);
            if (j < 8)
                sc[j] = (uint8_t)(l & 0xF);
            else
                sc[j - 8] |= (uint8_t)((l & 0xF) << 4);
            l >>= 4;
            sc[j % 4 + 8] |= (uint8_t)(l << (2 * (j / 4)));
        }
        d16 = f32_to_f16(1 / iscale);
    } else {
        d16 = f32_to_f16(0.f);
    }
    put16(y + 108, d16);
    const float dd = f16_to_f32(d16);
    for (int j = 0; j < 16; ++j) {
        int8_t s = (int8_t)(j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4);
        s = (int8_t)((s | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) - 32);
        float d = dd * s;
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
    for (int ib = 0; ib < 16; ++ib) scales[ib] = make_qx(16, 32, x + 16 * ib, L + 16 * ib);
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
static const struct {
    const char *name;
    int block, size;
    block_fn fn;
} TYPES[] = {
    {"Q4_0", QK, 18, q4_0}, {"Q4_1", QK, 20, q4_1}, {"Q5_0", QK, 22, q5_0}, {"Q5_1", QK, 24, q5_1}, {"Q8_0", QK, 34, q8_0},
    {"Q2_K", QK_K, 84, q2_k}, {"Q3_K", QK_K, 110, q3_k}, {"Q4_K", QK_K, 144, q4_k}, {"Q5_K", QK_K, 176, q5_k}, {"Q6_K", QK_K, 210, q6_k},
};


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
        q3_k_finish(x, y, scales, L);
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

/* The block loop of one type at one level: 0 the scalar functions, 1 the lane functions (in
 * the function's own ISA: baseline in run_lanes, AVX2 in run_lanes_avx2). */
AI void run_body(int t, const float *x, uint8_t *y, Py_ssize_t nb, int lanes) {
    const int block = TYPES[t].block, size = TYPES[t].size;
    if (lanes) {
        const char *n = TYPES[t].name;
        if (!strcmp(n, "Q2_K")) {
            for (Py_ssize_t i = 0; i < nb; i++) q2_k_lanes(x + i * block, y + i * size);
            return;
        }
        if (!strcmp(n, "Q3_K")) {
            for (Py_ssize_t i = 0; i < nb; i++) q3_k_lanes(x + i * block, y + i * size);
            return;
        }
        if (!strcmp(n, "Q4_K")) {
            for (Py_ssize_t i = 0; i < nb; i++) q4_k_lanes(x + i * block, y + i * size);
            return;
        }
        if (!strcmp(n, "Q5_K")) {
            for (Py_ssize_t i = 0; i < nb; i++) q5_k_lanes(x + i * block, y + i * size);
            return;
        }
        if (!strcmp(n, "Q6_K")) {
            for (Py_ssize_t i = 0; i < nb; i++) q6_k_lanes(x + i * block, y + i * size);
            return;
        }
    }
    for (Py_ssize_t i = 0; i < nb; i++) TYPES[t].fn(x + i * block, y + i * size);
}

static void run_scalar(int t, const float *x, uint8_t *y, Py_ssize_t nb) { run_body(t, x, y, nb, 0); }
static void run_lanes(int t, const float *x, uint8_t *y, Py_ssize_t nb) { run_body(t, x, y, nb, 1); }
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define QF_X86 1
__attribute__((target("avx2"))) static void run_lanes_avx2(int t, const float *x, uint8_t *y, Py_ssize_t nb) { run_body(t, x, y, nb, 1); }
/* Without AVX2 the scalar functions: the lanes as SSE pairs measured slower than them. */
static int best_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") ? 2 : 0;
}
static int max_level(void) { return best_level() == 2 ? 2 : 1; }
#else
static int best_level(void) { return 0; }
static int max_level(void) { return 1; }
#endif

/* quantize(type, x, out[, level]): x a C-contiguous float32 buffer of whole blocks, out a
 * writable buffer of exactly the blocks' bytes; level 0 the scalar functions, 1 the lane
 * functions in the baseline ISA, 2 in AVX2, -1 (default) best_level().  Every level writes the
 * same bytes (tests compare them all). */
static PyObject *py_quantize(PyObject *self, PyObject *args) {
    const char *name;
    Py_buffer xb, yb;
    int level = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "sy*w*|i", &name, &xb, &yb, &level)) return NULL;
    int t = -1;
    for (size_t k = 0; k < sizeof TYPES / sizeof TYPES[0]; k++)
        if (strcmp(name, TYPES[k].name) == 0) t = (int)k;
    PyObject *ret = NULL;
    if (level < 0) level = best_level();
    if (t < 0) {
        PyErr_Format(PyExc_ValueError, "unknown type %s", name);
    } else if (level > max_level()) {
        PyErr_Format(PyExc_ValueError, "level %d is not supported on this CPU (at most %d)", level, max_level());
    } else if (xb.len % (4 * TYPES[t].block)) {
        PyErr_SetString(PyExc_ValueError, "the input is not whole float32 blocks");
    } else if (yb.len != xb.len / (4 * TYPES[t].block) * TYPES[t].size) {
        PyErr_SetString(PyExc_ValueError, "the output buffer does not hold exactly the blocks");
    } else {
        const Py_ssize_t nb = xb.len / (4 * TYPES[t].block);
        const float *x = (const float *)xb.buf;
        uint8_t *y = (uint8_t *)yb.buf;
        Py_BEGIN_ALLOW_THREADS
#if QF_X86
        if (level == 2)
            run_lanes_avx2(t, x, y, nb);
        else
#endif
        if (level == 1)
            run_lanes(t, x, y, nb);
        else
            run_scalar(t, x, y, nb);
        Py_END_ALLOW_THREADS
        ret = Py_None;
        Py_INCREF(ret);
    }
    PyBuffer_Release(&xb);
    PyBuffer_Release(&yb);
    return ret;
}

static PyObject *py_best_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(best_level());
}

static PyMethodDef methods[] = {
    {"quantize", py_quantize, METH_VARARGS, "quantize(type, x, out[, level]): ggml's reference blocks of float32 x into out."},
    {"best_level", py_best_level, METH_NOARGS, "The level used by default: 2 (lanes, AVX2) where the CPU has AVX2, else 0 (scalar)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_ggml", "qformat's native GGUF block quantizers.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ggml(void) { return PyModule_Create(&module); }
