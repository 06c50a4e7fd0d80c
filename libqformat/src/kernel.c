/* The fused decode kernel: packed codes -> element value -> parameters (zero, scale, bias, in
 * that order) -> one round-to-nearest-even cast, in one pass.  See kernel.h for the job.
 *
 * Bit-exact with SPEC.md section 10: every step is one binary32 operation.  Builds compile
 * this file with -ffp-contract=off (no fused multiply-add) and without -ffast-math (no
 * reassociation, true division, subnormals kept); nothing here changes MXCSR.
 *
 * Along a row a parameter is constant over runs of columns; the kernel applies each run's
 * constants to the run with a plain loop the compiler vectorizes.
 *
 * Dispatch: the row kernel is compiled three times (baseline ISA, AVX2+F16C, AVX-512) from one
 * always-inline body; the caller picks the level (qfk_cpu_level() or lower), and on a non-x86
 * machine (WebAssembly included) only the baseline exists (NEON is aarch64's baseline, SIMD128
 * WebAssembly's, so compilers vectorize the same loops for them).  Threads come from the
 * caller: the kernel keeps no state between calls, so rows of one output may be decoded by
 * several threads at once (bits never depend on the thread count). */
#include "kernel.h"

#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define QF_X86 1
#else
#define QF_X86 0
#endif

#if defined(__wasm_simd128__)
#include <wasm_simd128.h>
#define QF_WASM_SIMD 1
#else
#define QF_WASM_SIMD 0
#endif

#if defined(__GNUC__)
#define QF_INLINE static inline __attribute__((always_inline))
#else
#define QF_INLINE static inline
#endif
/* -- conversions (SPEC.md 10.3), integer forms the compiler vectorizes ---------------------- */
QF_INLINE uint16_t f32_to_bf16(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN stays NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

QF_INLINE uint16_t f32_to_f16(uint32_t u) {
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quiet */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 (or Inf) */
    if (a >= 0x38800000u) { /* a binary16 normal: rebias, round away 13 bits (RNE) */
        uint32_t m = a - 0x38000000u;
        m = m + 0xfffu + ((m >> 13) & 1u);
        return (uint16_t)(sign | (m >> 13));
    }
    if (a <= 0x33000000u) return (uint16_t)sign; /* at most 2^-25: ties to even give 0 */
    { /* a binary16 subnormal (or the smallest normal by rounding): units of 2^-24 */
        uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, s = 126u - e;
        uint32_t q = mant >> s, rem = mant & ((1u << s) - 1u), half = 1u << (s - 1u);
        q += (rem > half) || (rem == half && (q & 1u));
        return (uint16_t)(sign | q);
    }
}

/* -- element values ------------------------------------------------------------------------ */
QF_INLINE void lut_generic(const qfk_job *j, const uint8_t *b, qfk_int w, float *x) {
    const float *bt = j->bt;
    qfk_int i, nb;
    if (j->six) { /* 6-bit codes, four in three bytes, lsb first */
        for (i = 0; i + 4 <= w; i += 4, b += 3) {
            const uint32_t v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16;
            x[i] = bt[v & 63u];
            x[i + 1] = bt[(v >> 6) & 63u];
            x[i + 2] = bt[(v >> 12) & 63u];
            x[i + 3] = bt[(v >> 18) & 63u];
        }
        return;
    }
    if (j->span) { /* planes: in each segment of span values (m bytes), byte i's k-th code is value k * m + i */
        const int n = j->n;
        const qfk_int t = j->span, m = t / n;
        qfk_int s0, k;
        for (s0 = 0; s0 < w; s0 += t, b += m, x += t)
            for (k = 0; k < n; k++)
                for (i = 0; i < m; i++) x[k * m + i] = bt[n * (size_t)b[i] + k];
        return;
    }
    switch (j->n) {
    case 1:
        for (i = 0; i < w; i++) x[i] = bt[b[i]];
        break;
    case 2:
        nb = w / 2;
        for (i = 0; i < nb; i++) memcpy(x + 2 * i, bt + 2 * (size_t)b[i], 8);
        break;
    case 4:
        nb = w / 4;
        for (i = 0; i < nb; i++) memcpy(x + 4 * i, bt + 4 * (size_t)b[i], 16);
        break;
    default:
        nb = w / 8;
        for (i = 0; i < nb; i++) memcpy(x + 8 * i, bt + 8 * (size_t)b[i], 32);
        break;
    }
}

#if QF_X86
/* Two codes per byte (int4, nf4, fp4, ...): a 16-entry table in two registers, looked up with
 * vpermps on each nibble and a blend on the nibble's bit 3; 8 bytes -> 16 values per step. */
__attribute__((target("avx2"))) static void lut_nib_avx2(const qfk_job *j, const uint8_t *b, qfk_int w, float *x) {
    const __m256 tlo = _mm256_loadu_ps(j->lut16), thi = _mm256_loadu_ps(j->lut16 + 8);
    const __m256i m15 = _mm256_set1_epi32(15);
    qfk_int nb = w / 2, i = 0;
    for (; i + 8 <= nb; i += 8) {
        __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + i)));
        __m256i lo = _mm256_and_si256(v, m15), hi = _mm256_srli_epi32(v, 4);
        __m256 vl = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, lo), _mm256_permutevar8x32_ps(thi, lo),
                                     _mm256_castsi256_ps(_mm256_slli_epi32(lo, 28)));
        __m256 vh = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, hi), _mm256_permutevar8x32_ps(thi, hi),
                                     _mm256_castsi256_ps(_mm256_slli_epi32(hi, 28)));
        __m256 first = j->nib == QFK_NIB_LSB ? vl : vh, second = j->nib == QFK_NIB_LSB ? vh : vl;
        __m256 a = _mm256_unpacklo_ps(first, second), c = _mm256_unpackhi_ps(first, second);
        _mm256_storeu_ps(x + 2 * i, _mm256_permute2f128_ps(a, c, 0x20));
        _mm256_storeu_ps(x + 2 * i + 8, _mm256_permute2f128_ps(a, c, 0x31));
    }
    for (; i < nb; i++) memcpy(x + 2 * i, j->bt + 2 * (size_t)b[i], 8);
}

#endif

#if QF_WASM_SIMD
/* WebAssembly SIMD128: the 16-entry table as four byte planes (byte q of each binary32 value),
 * looked up with i8x16.swizzle on the nibbles (already in output order) and the four planes
 * interleaved back into binary32 lanes; 16 bytes -> 32 values per step.  The table is the byte
 * table's own values (nibble_order checked them bit for bit): the same bits as lut_generic. */
QF_INLINE void nib16_wasm(v128_t idx, const v128_t *pl, float *x) {
    const v128_t q0 = wasm_i8x16_swizzle(pl[0], idx), q1 = wasm_i8x16_swizzle(pl[1], idx), q2 = wasm_i8x16_swizzle(pl[2], idx),
                 q3 = wasm_i8x16_swizzle(pl[3], idx);
    const v128_t a = wasm_i8x16_shuffle(q0, q1, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                 b = wasm_i8x16_shuffle(q0, q1, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                 c = wasm_i8x16_shuffle(q2, q3, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23),
                 d = wasm_i8x16_shuffle(q2, q3, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    wasm_v128_store(x, wasm_i16x8_shuffle(a, c, 0, 8, 1, 9, 2, 10, 3, 11));
    wasm_v128_store(x + 4, wasm_i16x8_shuffle(a, c, 4, 12, 5, 13, 6, 14, 7, 15));
    wasm_v128_store(x + 8, wasm_i16x8_shuffle(b, d, 0, 8, 1, 9, 2, 10, 3, 11));
    wasm_v128_store(x + 12, wasm_i16x8_shuffle(b, d, 4, 12, 5, 13, 6, 14, 7, 15));
}

static void lut_nib_wasm(const qfk_job *j, const uint8_t *b, qfk_int w, float *x) {
    uint8_t planes[4][16];
    v128_t pl[4];
    const v128_t m15 = wasm_i8x16_splat(15);
    const int lsb = j->nib == QFK_NIB_LSB;
    qfk_int nb = w / 2, i = 0;
    int k;
    for (k = 0; k < 16; k++) {
        uint32_t u;
        memcpy(&u, j->lut16 + k, 4);
        planes[0][k] = (uint8_t)u;
        planes[1][k] = (uint8_t)(u >> 8);
        planes[2][k] = (uint8_t)(u >> 16);
        planes[3][k] = (uint8_t)(u >> 24);
    }
    for (k = 0; k < 4; k++) pl[k] = wasm_v128_load(planes[k]);
    for (; i + 16 <= nb; i += 16) {
        const v128_t v = wasm_v128_load(b + i), lo = wasm_v128_and(v, m15), hi = wasm_u8x16_shr(v, 4);
        const v128_t f = lsb ? lo : hi, s = lsb ? hi : lo;
        nib16_wasm(wasm_i8x16_shuffle(f, s, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), pl, x + 2 * i);
        nib16_wasm(wasm_i8x16_shuffle(f, s, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31), pl, x + 2 * i + 16);
    }
    for (; i < nb; i++) memcpy(x + 2 * i, j->bt + 2 * (size_t)b[i], 8);
}
#endif

#if QF_X86
/* binary16 by the hardware's conversion with the rounding given in the instruction (RNE). */
__attribute__((target("avx2,f16c"))) static void cast_f16_f16c(const float *x, uint16_t *o, qfk_int w) {
    qfk_int i = 0;
    for (; i + 8 <= w; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    for (; i < w; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        o[i] = f32_to_f16(u);
    }
}

/* bfloat16 (SPEC.md 10.3's integer form), 16 values per step: w + 0x7FFF + (bit 16 of w), top
 * half; NaN kept NaN (quieted) by a blend. */
__attribute__((target("avx2"))) static void cast_bf16_avx2(const float *x, uint16_t *o, qfk_int w) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), abs = _mm256_set1_epi32(0x7fffffff),
                  inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    qfk_int i = 0;
    for (; i + 16 <= w; i += 16) {
        __m256i h[2];
        int q;
        for (q = 0; q < 2; q++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(x + i + 8 * q));
            __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs), inf);
            h[q] = _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
        }
        _mm256_storeu_si256((__m256i *)(o + i), _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8));
    }
    for (; i < w; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        o[i] = f32_to_bf16(u);
    }
}
#endif

/* -- parameters ---------------------------------------------------------------------------- */
/* A parameter cell's binary32 value: stored float16 / bfloat16 cells are widened here, exactly
 * (every binary16 and bfloat16 value is a binary32 value), one cell per run of columns, instead
 * of a NumPy cast of the whole grid box per chunk. */
QF_INLINE float pval(const qfk_param *p, int64_t off) {
    uint32_t u;
    uint16_t h;
    float f;
    /* memcpy: the cells may sit at any byte offset of a mapped file */
    if (p->vkind == QFK_VAL_F32) {
        memcpy(&f, (const char *)p->v + 4 * off, 4);
        return f;
    }
    memcpy(&h, (const char *)p->v + 2 * off, 2);
    u = h;
    if (p->vkind == QFK_VAL_BF16) {
        u <<= 16;
    } else {
        uint32_t sgn = (u & 0x8000u) << 16, e = (u >> 10) & 0x1fu, m = u & 0x3ffu;
        if (e == 0x1f)
            u = sgn | 0x7f800000u | (m << 13); /* Inf, NaN */
        else if (e)
            u = sgn | ((e + 112u) << 23) | (m << 13);
        else if (!m)
            u = sgn;
        else { /* a binary16 subnormal m * 2^-24: normalize */
            e = 113u;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sgn | (e << 23) | ((m & 0x3ffu) << 13);
        }
    }
    memcpy(&f, &u, 4);
    return f;
}

QF_INLINE void apply(int op, float k, float *restrict x, qfk_int w) {
    qfk_int i;
    switch (op) {
    case QFK_OP_SUB: for (i = 0; i < w; i++) x[i] = x[i] - k; break;
    case QFK_OP_MUL: for (i = 0; i < w; i++) x[i] = x[i] * k; break;
    case QFK_OP_DIV: for (i = 0; i < w; i++) x[i] = x[i] / k; break;
    default: for (i = 0; i < w; i++) x[i] = x[i] + k; break;
    }
}

/* The cell of column c and the next column where it changes (C: never). */
QF_INLINE void param_at(const qfk_param *p, qfk_int r, qfk_int c, qfk_int C, int64_t *off, qfk_int *next) {
    int64_t ro = p->rowoff[r];
    switch (p->mode) {
    case QFK_MODE_CONST: *off = ro; *next = C; break;
    case QFK_MODE_BLOCK: *off = ro + (c + p->a) / p->b; *next = c + (p->b - (c + p->a) % p->b); break;
    case QFK_MODE_FLAT: *off = (ro + c) / p->b - p->a; *next = c + (p->b - (ro + c) % p->b); break;
    default: {
        int64_t k = p->colidx[c];
        qfk_int e = c + 1;
        while (e < C && p->colidx[e] == k) e++;
        *off = ro + k;
        *next = e;
    }
    }
}

QF_INLINE void cast_out(const qfk_job *j, const float *x, qfk_int r, qfk_int t0, qfk_int w, int lvl) {
    uint16_t *o = (uint16_t *)j->out + r * j->C + t0;
    qfk_int i;
    if (j->outkind == QFK_OUT_BF16) {
        const uint32_t *u = (const uint32_t *)x;
#if QF_X86
        if (lvl >= QFK_LVL_AVX2) {
            cast_bf16_avx2(x, o, w);
            return;
        }
#endif
        for (i = 0; i < w; i++) o[i] = f32_to_bf16(u[i]);
        return;
    }
#if QF_X86
    if (lvl >= QFK_LVL_AVX2) {
        cast_f16_f16c(x, o, w);
        return;
    }
#endif
    (void)lvl;
    for (i = 0; i < w; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        o[i] = f32_to_f16(u);
    }
}

/* Apply parameter p (cell off[k], changing at column next[k]) to tile columns [t0, t1) of x,
 * with the operation OP between each value and its cell's value: one plain loop per run. */
#define PARAM_RUNS(OP)                                                                  \
    do {                                                                                \
        for (c = t0; c < t1;) {                                                         \
            qfk_int e = next[k] < t1 ? next[k] : t1, i;                              \
            const float kv = pval(p, off[k]);                                           \
            float *restrict xs = x + (c - t0);                                          \
            for (i = 0; i < e - c; i++) xs[i] = xs[i] OP kv;                            \
            c = e;                                                                      \
            if (c == next[k] && c < C) {                                                \
                if (p->mode == QFK_MODE_COLS) {                                             \
                    param_at(p, r, c, C, &off[k], &next[k]);                            \
                } else { /* BLOCK, FLAT: the next cell, one block on */                 \
                    off[k] += 1;                                                        \
                    next[k] += (qfk_int)p->b;                                        \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    } while (0)

#if QF_X86
/* The int4 / nf4 / fp4 row in one pass (AVX2): 8 bytes -> 16 values by the nibble table, each
 * parameter's cell value broadcast in a register and applied in the spec's order, then stored
 * in the output dtype.  Taken where every parameter's cell changes only on multiples of 16
 * columns (grid or flat blocks of a multiple of 16, aligned; per-row; per-tensor). */
QF_INLINE int nib_row_ok(const qfk_job *j, const qfk_int *next) {
    int k;
    if ((j->nib == QFK_NIB_NONE && j->n != 1) || j->span || j->C % 16) return 0;
    for (k = 0; k < j->nparams; k++) {
        const qfk_param *p = &j->p[k];
        if (p->mode == QFK_MODE_CONST) continue;
        if (p->mode == QFK_MODE_COLS || p->b % 16 || next[k] % 16) return 0;
    }
    return 1;
}

__attribute__((target("avx2,f16c"))) static void nib_row_avx2(const qfk_job *j, qfk_int r, int64_t *off, qfk_int *next) {
    const __m256 tlo = _mm256_loadu_ps(j->lut16), thi = _mm256_loadu_ps(j->lut16 + 8);
    const __m256i m15 = _mm256_set1_epi32(15);
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff), absm = _mm256_set1_epi32(0x7fffffff),
                  inf = _mm256_set1_epi32(0x7f800000), quiet = _mm256_set1_epi32(0x40);
    const uint8_t *b = j->codes + r * j->stride;
    const qfk_int C = j->C;
    const int np = j->nparams, lsb = j->nib == QFK_NIB_LSB;
    __m256 kv[3];
    qfk_int c;
    int k, q;
    for (k = 0; k < np; k++) kv[k] = _mm256_set1_ps(pval(&j->p[k], off[k]));
    for (c = 0; c < C; c += 16) {
        __m256 v[2];
        for (k = 0; k < np; k++)
            if (c == next[k]) { /* BLOCK, FLAT: the next cell */
                off[k] += 1;
                next[k] += (qfk_int)j->p[k].b;
                kv[k] = _mm256_set1_ps(pval(&j->p[k], off[k]));
            }
        if (j->n == 1) { /* one code per byte (int8, fp8, ...): 16 bytes -> 16 values by two gathers from the byte table */
            v[0] = _mm256_i32gather_ps(j->bt, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + c))), 4);
            v[1] = _mm256_i32gather_ps(j->bt, _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + c + 8))), 4);
        } else {
            __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(b + c / 2)));
            __m256i lo = _mm256_and_si256(w, m15), hi = _mm256_srli_epi32(w, 4);
            __m256 vl = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, lo), _mm256_permutevar8x32_ps(thi, lo),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(lo, 28)));
            __m256 vh = _mm256_blendv_ps(_mm256_permutevar8x32_ps(tlo, hi), _mm256_permutevar8x32_ps(thi, hi),
                                         _mm256_castsi256_ps(_mm256_slli_epi32(hi, 28)));
            __m256 first = lsb ? vl : vh, second = lsb ? vh : vl;
            __m256 t0 = _mm256_unpacklo_ps(first, second), t1 = _mm256_unpackhi_ps(first, second);
            v[0] = _mm256_permute2f128_ps(t0, t1, 0x20);
            v[1] = _mm256_permute2f128_ps(t0, t1, 0x31);
        }
        for (k = 0; k < np; k++)
            for (q = 0; q < 2; q++) switch (j->p[k].op) {
                case QFK_OP_SUB: v[q] = _mm256_sub_ps(v[q], kv[k]); break;
                case QFK_OP_MUL: v[q] = _mm256_mul_ps(v[q], kv[k]); break;
                case QFK_OP_DIV: v[q] = _mm256_div_ps(v[q], kv[k]); break;
                default: v[q] = _mm256_add_ps(v[q], kv[k]); break;
                }
        if (j->outkind == QFK_OUT_F32) {
            float *o = (float *)j->out + r * C + c;
            if (j->stream && !((uintptr_t)o & 63)) { /* a large output: whole lines, no read-for-ownership */
                _mm256_stream_ps(o, v[0]);
                _mm256_stream_ps(o + 8, v[1]);
            } else {
                _mm256_storeu_ps(o, v[0]);
                _mm256_storeu_ps(o + 8, v[1]);
            }
        } else if (j->outkind == QFK_OUT_F16) {
            uint16_t *o = (uint16_t *)j->out + r * C + c;
            _mm_storeu_si128((__m128i *)o, _mm256_cvtps_ph(v[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            _mm_storeu_si128((__m128i *)(o + 8), _mm256_cvtps_ph(v[1], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
            uint16_t *o = (uint16_t *)j->out + r * C + c;
            __m256i h[2];
            for (q = 0; q < 2; q++) {
                __m256i u = _mm256_castps_si256(v[q]);
                __m256i rr = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(_mm256_srli_epi32(u, 16), one)), 16);
                __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
                h[q] = _mm256_blendv_epi8(rr, _mm256_or_si256(_mm256_srli_epi32(u, 16), quiet), nan);
            }
            _mm256_storeu_si256((__m256i *)o, _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xD8));
        }
    }
}
#endif

#if QF_X86
/* The same row at AVX-512: 16 bytes -> 32 values per step.  One vpermps holds the whole
 * 16-entry table (no blend of two halves as at AVX2), and the two nibble streams are
 * interleaved by one two-source permute each.  Taken where every parameter's cell changes only
 * on multiples of 16 columns and rows are whole steps of 32 (each half of a step gets its own
 * cells: g16 scales of nvfp4 and Q6_K too); other rows keep the AVX2 row.  The same binary32 operations in the same order: the same bits. */
QF_INLINE int nib_row_ok512(const qfk_job *j, const qfk_int *next) {
    int k;
    if (j->C % 32) return 0;
    for (k = 0; k < j->nparams; k++) {
        const qfk_param *p = &j->p[k];
        if (p->mode == QFK_MODE_CONST) continue;
        if (p->b % 16 || next[k] % 16) return 0;
    }
    return 1;
}

/* PATH: 0 nibbles, 1 one code per byte, 2 six (a constant in each caller below: each gets only its own lookup) */
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) QF_INLINE void nib_row_avx512_body(const qfk_job *j, qfk_int r, int64_t *off,
                                                                                           qfk_int *next, const int PATH, const int NP) {
    const __m512 t16 = _mm512_loadu_ps(j->lut16);
    const __m512i m15 = _mm512_set1_epi32(15);
    const __m512i ilo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i ihi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), absm = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000), quiet = _mm512_set1_epi32(0x40);
    const uint8_t *b = j->codes + r * j->stride;
    const qfk_int C = j->C;
    const int lsb = j->nib == QFK_NIB_LSB, outkind = j->outkind, stream = j->stream;
    void *const out = j->out;
    int op[3] = {0, 0, 0};
    qfk_int bk[3] = {1, 1, 1};
    __m512 kv[3];
    qfk_int c;
    int k, q;
    __m512 t256[16];
    /* six: code i of 16 is bits [6i, 6i + 6) of 12 bytes: the 16-bit word at byte 6i / 8, shifted by 6i % 8 */
    const __m128i sh_lo = _mm_setr_epi8(0, 1, 0, 1, 1, 2, 2, 3, 3, 4, 3, 4, 4, 5, 5, 6);
    const __m128i sh_hi = _mm_setr_epi8(6, 7, 6, 7, 7, 8, 8, 9, 9, 10, 9, 10, 10, 11, 11, 12);
    const __m512i sh6 = _mm512_setr_epi32(0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2, 0, 6, 4, 2), m63 = _mm512_set1_epi32(63);
    for (k = 0; k < 16; k++) t256[k] = PATH ? _mm512_loadu_ps(j->bt + 16 * k) : t16;
    for (k = 0; k < NP; k++) {
        kv[k] = _mm512_set1_ps(pval(&j->p[k], off[k]));
        op[k] = j->p[k].op;
        bk[k] = (qfk_int)j->p[k].b;
    }
    for (c = 0; c < C; c += 32) {
        __m512 v[2];
        if (PATH == 2) { /* 6-bit codes: 24 bytes -> 32 codes (12 bytes, read masked, per 16), the table's first 64 values */
            for (q = 0; q < 2; q++) {
                const __m128i raw = _mm_maskz_loadu_epi8((__mmask16)0x0fff, b + c / 4 * 3 + 12 * q);
                const __m256i w16 = _mm256_set_m128i(_mm_shuffle_epi8(raw, sh_hi), _mm_shuffle_epi8(raw, sh_lo));
                const __m512i ix = _mm512_and_si512(_mm512_srlv_epi32(_mm512_cvtepu16_epi32(w16), sh6), m63);
                const __mmask16 b5 = _mm512_test_epi32_mask(ix, _mm512_set1_epi32(32));
                v[q] = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t256[0], ix, t256[1]), _mm512_permutex2var_ps(t256[2], ix, t256[3]));
            }
        } else if (PATH == 1) { /* one code per byte: 32 bytes -> 32 values, the 256-entry table in 16 registers */
            for (q = 0; q < 2; q++) {
                const __m512i ix = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + c + 16 * q)));
                const __mmask16 b5 = _mm512_test_epi32_mask(ix, _mm512_set1_epi32(32)), b6 = _mm512_test_epi32_mask(ix, _mm512_set1_epi32(64)),
                                b7 = _mm512_test_epi32_mask(ix, _mm512_set1_epi32(128));
                __m512 s0 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t256[0], ix, t256[1]), _mm512_permutex2var_ps(t256[2], ix, t256[3]));
                __m512 s1 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t256[4], ix, t256[5]), _mm512_permutex2var_ps(t256[6], ix, t256[7]));
                __m512 s2 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t256[8], ix, t256[9]), _mm512_permutex2var_ps(t256[10], ix, t256[11]));
                __m512 s3 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t256[12], ix, t256[13]), _mm512_permutex2var_ps(t256[14], ix, t256[15]));
                v[q] = _mm512_mask_blend_ps(b7, _mm512_mask_blend_ps(b6, s0, s1), _mm512_mask_blend_ps(b6, s2, s3));
            }
        } else {
            __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + c / 2)));
            __m512 vl = _mm512_permutexvar_ps(_mm512_and_si512(w, m15), t16);
            __m512 vh = _mm512_permutexvar_ps(_mm512_srli_epi32(w, 4), t16);
            __m512 first = lsb ? vl : vh, second = lsb ? vh : vl;
            v[0] = _mm512_permutex2var_ps(first, ilo, second);
            v[1] = _mm512_permutex2var_ps(first, ihi, second);
        }
        for (q = 0; q < 2; q++) /* each half of 16 columns: a cell changes only on a multiple of 16 */
            for (k = 0; k < NP; k++) {
                if (c + 16 * q == next[k]) { /* BLOCK, FLAT: the next cell */
                    off[k] += 1;
                    next[k] += bk[k];
                    kv[k] = _mm512_set1_ps(pval(&j->p[k], off[k]));
                }
                switch (op[k]) {
                case QFK_OP_SUB: v[q] = _mm512_sub_ps(v[q], kv[k]); break;
                case QFK_OP_MUL: v[q] = _mm512_mul_ps(v[q], kv[k]); break;
                case QFK_OP_DIV: v[q] = _mm512_div_ps(v[q], kv[k]); break;
                default: v[q] = _mm512_add_ps(v[q], kv[k]); break;
                }
            }
        if (outkind == QFK_OUT_F32) {
            float *o = (float *)out + r * C + c;
            if (stream && !((uintptr_t)o & 63)) { /* a large output: no read-for-ownership of lines written whole */
                _mm512_stream_ps(o, v[0]);
                _mm512_stream_ps(o + 16, v[1]);
            } else {
                _mm512_storeu_ps(o, v[0]);
                _mm512_storeu_ps(o + 16, v[1]);
            }
        } else if (outkind == QFK_OUT_F16) {
            uint16_t *o = (uint16_t *)out + r * C + c;
            _mm256_storeu_si256((__m256i *)o, _mm512_cvtps_ph(v[0], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            _mm256_storeu_si256((__m256i *)(o + 16), _mm512_cvtps_ph(v[1], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else { /* bfloat16: round to nearest even on the integer bits, NaN kept quiet (as cast_bf16_avx2) */
            uint16_t *o = (uint16_t *)out + r * C + c;
            for (q = 0; q < 2; q++) {
                __m512i u = _mm512_castps_si512(v[q]);
                __m512i rr = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
                __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absm), inf);
                __m512i h = _mm512_mask_blend_epi32(nan, rr, _mm512_or_si512(_mm512_srli_epi32(u, 16), quiet));
                _mm256_storeu_si256((__m256i *)(o + 16 * q), _mm512_cvtepi32_epi16(h));
            }
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) static void nib_row_avx512_nib(const qfk_job *j, qfk_int r, int64_t *off, qfk_int *next) {
    switch (j->nparams) {
    case 0: nib_row_avx512_body(j, r, off, next, 0, 0); break;
    case 1: nib_row_avx512_body(j, r, off, next, 0, 1); break;
    case 2: nib_row_avx512_body(j, r, off, next, 0, 2); break;
    default: nib_row_avx512_body(j, r, off, next, 0, 3); break;
    }
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) static void nib_row_avx512_n1(const qfk_job *j, qfk_int r, int64_t *off, qfk_int *next) {
    switch (j->nparams) {
    case 0: nib_row_avx512_body(j, r, off, next, 1, 0); break;
    case 1: nib_row_avx512_body(j, r, off, next, 1, 1); break;
    case 2: nib_row_avx512_body(j, r, off, next, 1, 2); break;
    default: nib_row_avx512_body(j, r, off, next, 1, 3); break;
    }
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) static void nib_row_avx512_six(const qfk_job *j, qfk_int r, int64_t *off, qfk_int *next) {
    switch (j->nparams) {
    case 0: nib_row_avx512_body(j, r, off, next, 2, 0); break;
    case 1: nib_row_avx512_body(j, r, off, next, 2, 1); break;
    case 2: nib_row_avx512_body(j, r, off, next, 2, 2); break;
    default: nib_row_avx512_body(j, r, off, next, 2, 3); break;
    }
}
#endif

QF_INLINE void rows_body(const qfk_job *j, qfk_int r0, qfk_int r1, int lvl) {
    float buf[QFK_TILE];
    const qfk_int C = j->C;
    qfk_int r, t0, c;
    int k;
    for (r = r0; r < r1; r++) {
        const uint8_t *row = j->codes + r * j->stride;
        int64_t off[3];
        qfk_int next[3];
        for (k = 0; k < j->nparams; k++) param_at(&j->p[k], r, 0, C, &off[k], &next[k]);
#if QF_X86
        if (lvl >= QFK_LVL_AVX2 && nib_row_ok(j, next)) {
            if (lvl >= QFK_LVL_AVX512 && nib_row_ok512(j, next)) {
                if (j->six) nib_row_avx512_six(j, r, off, next);
                else if (j->n == 1) nib_row_avx512_n1(j, r, off, next);
                else nib_row_avx512_nib(j, r, off, next);
                continue;
            }
            if (!j->six) { /* 6-bit codes below AVX-512: the tile path */
                nib_row_avx2(j, r, off, next);
                continue;
            }
        }
#endif
        for (t0 = 0; t0 < C; t0 += QFK_TILE) {
            qfk_int t1 = t0 + QFK_TILE < C ? t0 + QFK_TILE : C;
            float *x = j->outkind == QFK_OUT_F32 ? (float *)j->out + r * C + t0 : buf;
            const uint8_t *b = j->six ? row + t0 / 4 * 3 : row + t0 / j->n;
#if QF_X86
            if (lvl >= QFK_LVL_AVX2 && j->nib != QFK_NIB_NONE && !j->span)
                lut_nib_avx2(j, b, t1 - t0, x);
            else
#endif
#if QF_WASM_SIMD
            if (j->nib != QFK_NIB_NONE && !j->span)
                lut_nib_wasm(j, b, t1 - t0, x);
            else
#endif
                lut_generic(j, b, t1 - t0, x);
            /* parameter by parameter (the tile stays in L1): runs of columns with one cell */
            for (k = 0; k < j->nparams; k++) {
                const qfk_param *p = &j->p[k];
                switch (p->op) {
                case QFK_OP_SUB: PARAM_RUNS(-); break;
                case QFK_OP_MUL: PARAM_RUNS(*); break;
                case QFK_OP_DIV: PARAM_RUNS(/); break;
                default: PARAM_RUNS(+); break;
                }
            }
            if (j->outkind != QFK_OUT_F32) cast_out(j, x, r, t0, t1 - t0, lvl);
        }
    }
}

static void rows_generic(const qfk_job *j, qfk_int r0, qfk_int r1) { rows_body(j, r0, r1, QFK_LVL_GENERIC); }
#if QF_X86
__attribute__((target("avx2,f16c"))) static void rows_avx2(const qfk_job *j, qfk_int r0, qfk_int r1) {
    rows_body(j, r0, r1, QFK_LVL_AVX2);
    if (j->stream) _mm_sfence(); /* the streamed stores are visible before the call returns */
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c"))) static void rows_avx512(const qfk_job *j, qfk_int r0, qfk_int r1) {
    rows_body(j, r0, r1, QFK_LVL_AVX512);
    if (j->stream) _mm_sfence(); /* the streamed stores are visible before the call returns */
}
#endif

void qfk_run(const qfk_job *j, qfk_int r0, qfk_int r1, int level) {
    if (r0 < 0) r0 = 0;
    if (r1 > j->R) r1 = j->R;
    if (r0 >= r1 || j->C <= 0) return;
#if QF_X86
    if (level >= QFK_LVL_AVX512)
        rows_avx512(j, r0, r1);
    else if (level == QFK_LVL_AVX2)
        rows_avx2(j, r0, r1);
    else
#endif
        rows_generic(j, r0, r1);
    (void)level;
}

static const char *const LEVEL_NAMES[] = {"generic", "avx2", "avx512"};

const char *qfk_level_name(int level) { return LEVEL_NAMES[level < 0 || level > QFK_LVL_AVX512 ? 0 : level]; }

int qfk_cpu_level(void) {
#if QF_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return QFK_LVL_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c")) return QFK_LVL_AVX2;
#endif
    return QFK_LVL_GENERIC;
}

/* -- checks -------------------------------------------------------------------------------- */

static int nibble_order(qfk_job *j) {
    /* Which nibble holds the first of a byte's two codes, read off the byte table itself
     * (compared bit for bit), so the fast lookup is used only where it gives the same bits. */
    const float *bt = j->bt;
    int b, ord;
    for (ord = QFK_NIB_LSB; ord <= QFK_NIB_MSB; ord++) {
        int ok = 1;
        for (b = 0; b < 16; b++) j->lut16[b] = bt[2 * (ord == QFK_NIB_LSB ? b : b << 4)];
        for (b = 0; b < 256 && ok; b++) {
            float f = j->lut16[ord == QFK_NIB_LSB ? (b & 15) : (b >> 4)], s = j->lut16[ord == QFK_NIB_LSB ? (b >> 4) : (b & 15)];
            ok = memcmp(&f, bt + 2 * b, 4) == 0 && memcmp(&s, bt + 2 * b + 1, 4) == 0;
        }
        if (ok) return ord;
    }
    return QFK_NIB_NONE;
}


int qfk_param_range(const qfk_param *p, qfk_int R, qfk_int C, size_t ncol, int64_t *lo, int64_t *hi) {
    int64_t rmin = INT64_MAX, rmax = INT64_MIN, cmin = 0, cmax = 0;
    qfk_int r, c;
    if (R <= 0 || C <= 0 || !p->rowoff) return -1;
    for (r = 0; r < R; r++) {
        if (p->rowoff[r] < rmin) rmin = p->rowoff[r];
        if (p->rowoff[r] > rmax) rmax = p->rowoff[r];
    }
    if (rmin < 0 || rmax > ((int64_t)1 << 52)) return -1;
    switch (p->mode) {
    case QFK_MODE_CONST: *lo = rmin; *hi = rmax; return 0;
    case QFK_MODE_BLOCK:
        if (p->b < 1 || p->a < 0 || p->a > ((int64_t)1 << 52)) return -1;
        *lo = rmin + p->a / p->b;
        *hi = rmax + (C - 1 + p->a) / p->b;
        return 0;
    case QFK_MODE_FLAT:
        if (p->b < 1 || p->a < 0) return -1;
        *lo = rmin / p->b - p->a;
        *hi = (rmax + C - 1) / p->b - p->a;
        return 0;
    case QFK_MODE_COLS:
        if (!p->colidx || ncol < (size_t)C) return -1;
        cmin = INT64_MAX;
        cmax = INT64_MIN;
        for (c = 0; c < C; c++) {
            if (p->colidx[c] < cmin) cmin = p->colidx[c];
            if (p->colidx[c] > cmax) cmax = p->colidx[c];
        }
        if (cmin < 0 || cmax > ((int64_t)1 << 52)) return -1;
        *lo = rmin + cmin;
        *hi = rmax + cmax;
        return 0;
    }
    return -1;
}

const char *qfk_check(qfk_job *j, const qfk_lens *lens) {
    const qfk_int R = j->R, C = j->C, stride = j->stride;
    const int n = j->n;
    qfk_int itemsize, rowbytes;
    int k;
    if (n != 1 && n != 2 && n != 4 && n != 8) return "codes per byte must be 1, 2, 4 or 8";
    if (R < 0 || C < 0 || stride < 0) return "negative size";
    if (C % n) return "row length is not a whole number of bytes";
    if (j->six && (n != 1 || C % 4 || j->span)) return "6-bit codes need n = 1, whole groups of 4 codes and no planes";
    rowbytes = j->six ? C / 4 * 3 : C / n;
    if (j->outkind < QFK_OUT_F32 || j->outkind > QFK_OUT_BF16) return "bad output kind";
    if (j->span && (j->span < 0 || j->span % n || QFK_TILE % j->span || C % j->span))
        return "planes span must divide the tile and the row, in whole bytes";
    itemsize = j->outkind == QFK_OUT_F32 ? 4 : 2;
    if (R && C) {
        if (stride > PTRDIFF_MAX / R || (R - 1) * stride > PTRDIFF_MAX - rowbytes) return "codes too large";
        if (!j->codes || lens->codes < (size_t)((R - 1) * stride + rowbytes)) return "codes buffer too short";
        if (C > PTRDIFF_MAX / R / itemsize) return "output too large";
    }
    if (!j->bt || lens->bt != 256 * (size_t)n * sizeof(float)) return "byte table must hold 256 * n binary32 values";
    if ((R && C && !j->out) || lens->out / (size_t)itemsize < (size_t)R * (size_t)C) return "output buffer too short";
    if (j->nparams < 0 || j->nparams > 3) return "at most three parameters";
    for (k = 0; k < j->nparams; k++) {
        const qfk_param *p = &j->p[k];
        int64_t lo, hi;
        if (p->op < QFK_OP_SUB || p->op > QFK_OP_ADD || p->mode < QFK_MODE_CONST || p->mode > QFK_MODE_COLS) return "bad parameter op or mode";
        if (p->vkind < QFK_VAL_F32 || p->vkind > QFK_VAL_BF16) return "bad parameter value format";
        if (lens->rowoff[k] < (size_t)R) return "row offsets too short";
        if (R && C) {
            if (qfk_param_range(p, R, C, p->colidx ? lens->colidx[k] : 0, &lo, &hi) < 0) return "parameter cells out of range";
            if (lo < 0 || (uint64_t)hi >= (uint64_t)lens->values[k] || !p->v) return "parameter cells out of range";
        }
    }
    j->nib = n == 2 ? nibble_order(j) : QFK_NIB_NONE;
    if (j->outkind != QFK_OUT_F32) j->stream = 0;
    return NULL;
}
