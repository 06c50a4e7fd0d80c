/* qformat native matmul kernel (issue 23): y[M, N] = x[M, K] @ W[N, K]^T with W read packed.
 *
 * The weight is a table of element values indexed by codes (4-bit codes two per byte, low
 * nibble first, or one code per byte), with up to three per-group parameters applied in the
 * order SPEC.md section 10 gives: zero (subtract), scale (multiply), bias (add), each one
 * binary32 value per (row, group of `g` columns).  Each weight the kernel multiplies is formed
 * with exactly those binary32 operations (this file is compiled with -ffp-contract=off, so the
 * weight steps are never fused), so it equals qformat's decoded binary32 weight bit for bit;
 * only the dot products use fused multiply-add (explicit intrinsics) and their own summation
 * order, which the caller's error bound covers (qformat_torch.kernels.error_bound).
 *
 * Code kinds and how the vector path turns a code into its element value (the caller checks, on
 * all 256 (or 16) codes, that the table it passes equals what the kind computes, so the scalar
 * path, which always reads the table, and the vector path agree bit for bit):
 *   NIB4   16-entry table, per group folded with the parameters into two 8-lane registers and
 *          looked up with permutevar8x32 (one lookup per weight, no arithmetic per weight);
 *   I8/U8  the code as a signed / unsigned integer;
 *   E4M3   OCP e4m3fn (no NaN code present: checked by the caller) via binary16 and F16C;
 *   E5M2   OCP e5m2 via binary16 (its top byte) and F16C;
 *   LUT8   any other 256-entry table, by gather.
 *
 * Threads come from the caller: one call computes output columns [n0, n1) with the GIL
 * released; qformat.kernels splits N over its thread pool.  Every buffer size is checked before
 * the GIL is released.  Dispatch: AVX2+FMA+F16C where the CPU has them (AVX-512 machines run
 * the AVX2 path), else the portable scalar loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#define QF_X86 1
#else
#define QF_X86 0
#endif

enum { K_NIB4 = 0, K_I8 = 1, K_U8 = 2, K_E4M3 = 3, K_E5M2 = 4, K_LUT8 = 5 };
enum { LVL_GENERIC = 0, LVL_AVX2 = 1 };
#define MAXG 4096 /* largest group the scalar path's per-group weight buffer holds */

typedef struct {
    const float *x;      /* [M, K] */
    const uint8_t *w;    /* [N, K/2] (NIB4) or [N, K] */
    const float *table;  /* 16 or 256 binary32 element values */
    const float *z, *s, *b; /* [N, K/g] each, or NULL */
    float *y;            /* [M, N] */
    Py_ssize_t M, K, N, g, n0, n1;
    int kind;
} mm_job;

/* The element value of code c with the group's parameters, in SPEC.md's order. */
static inline float apply(float v, int hz, float z, int hs, float s, int hb, float b) {
    if (hz) v = v - z;
    if (hs) v = v * s;
    if (hb) v = v + b;
    return v;
}

static void rows_generic(const mm_job *j) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g, M = j->M, N = j->N;
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    float wbuf[MAXG];
    Py_ssize_t n, q, k, m;
    for (n = j->n0; n < j->n1; n++) {
        const uint8_t *wr = j->w + n * rowbytes;
        for (m = 0; m < M; m++) j->y[m * N + n] = 0.0f;
        for (q = 0; q < G; q++) {
            float z = j->z ? j->z[n * G + q] : 0.0f, s = j->s ? j->s[n * G + q] : 0.0f, b = j->b ? j->b[n * G + q] : 0.0f;
            for (k = 0; k < g; k++) {
                Py_ssize_t kk = q * g + k;
                unsigned c = j->kind == K_NIB4 ? (kk & 1 ? wr[kk >> 1] >> 4 : wr[kk >> 1] & 15) : wr[kk];
                wbuf[k] = apply(j->table[c], j->z != NULL, z, j->s != NULL, s, j->b != NULL, b);
            }
            for (m = 0; m < M; m++) {
                const float *xr = j->x + m * K + q * g;
                float acc = 0.0f;
                for (k = 0; k < g; k++) acc += wbuf[k] * xr[k];
                j->y[m * N + n] += acc;
            }
        }
    }
}

#if QF_X86
#define TGT __attribute__((target("avx2,fma,f16c")))

TGT static inline float hsum8(__m256 v) {
    __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    a = _mm_add_ss(a, _mm_movehdup_ps(a));
    return _mm_cvtss_f32(a);
}

/* 8 element values (before parameters) of one-byte codes at p. */
TGT static inline __m256 byte_values(const uint8_t *p, int kind, const float *table) {
    __m128i raw = _mm_loadl_epi64((const __m128i *)p);
    switch (kind) {
    case K_I8: return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
    case K_U8: return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(raw));
    case K_E4M3: {
        /* e4m3fn s.eeee.mmm -> binary16 s.0eeee.mmm0000000 (value 2^-8 of the e4m3 value,
         * subnormals included), then an exact scaling by 2^8. */
        __m128i h = _mm_cvtepu8_epi16(raw);
        __m128i bits = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7F)), 7),
                                    _mm_slli_epi16(_mm_and_si128(h, _mm_set1_epi16(0x80)), 8));
        return _mm256_mul_ps(_mm256_cvtph_ps(bits), _mm256_set1_ps(256.0f));
    }
    case K_E5M2: return _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(raw), 8));
    default: return _mm256_i32gather_ps(table, _mm256_cvtepu8_epi32(raw), 4);
    }
}

/* 8 weights of 4-bit codes (4 bytes at p, low nibble first) from the group's folded table. */
TGT static inline __m256 nib_weights(const uint8_t *p, __m256 tlo, __m256 thi) {
    uint32_t v;
    memcpy(&v, p, 4);
    __m128i b = _mm_shuffle_epi8(_mm_cvtsi32_si128((int)v), _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, -1, -1, -1, -1, -1, -1, -1, -1));
    __m256i idx = _mm256_and_si256(_mm256_srlv_epi32(_mm256_cvtepu8_epi32(b), _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4)),
                                   _mm256_set1_epi32(15));
    __m256 lo = _mm256_permutevar8x32_ps(tlo, idx), hi = _mm256_permutevar8x32_ps(thi, idx);
    return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
}

/* Byte planes of a 16-entry binary32 table: plane i holds byte i of each entry, in both 128-bit
 * lanes, for vpshufb (one lookup per byte of 32 codes; this beats vpermps + blend on CPUs whose
 * 256-bit permutes are slow). */
TGT static inline void planes16(const float *t, __m256i pl[4]) {
    uint8_t b[4][16];
    int v, i;
    for (v = 0; v < 16; v++) {
        uint32_t u;
        memcpy(&u, t + v, 4);
        for (i = 0; i < 4; i++) b[i][v] = (uint8_t)(u >> (8 * i));
    }
    for (i = 0; i < 4; i++) pl[i] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b[i]));
}

/* The element values of 32 4-bit codes (16 bytes at p) as four registers, in the order
 * [0-3 | 16-19], [4-7 | 20-23], [8-11 | 24-27], [12-15 | 28-31] (x is permuted to match). */
TGT static inline void nib32(const uint8_t *p, const __m256i pl[4], __m256 v[4]) {
    const __m128i m = _mm_set1_epi8(15);
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    __m128i lo = _mm_and_si128(b, m), hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
    __m256i c = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
    __m256i b0 = _mm256_shuffle_epi8(pl[0], c), b1 = _mm256_shuffle_epi8(pl[1], c);
    __m256i b2 = _mm256_shuffle_epi8(pl[2], c), b3 = _mm256_shuffle_epi8(pl[3], c);
    __m256i l01 = _mm256_unpacklo_epi8(b0, b1), h01 = _mm256_unpackhi_epi8(b0, b1);
    __m256i l23 = _mm256_unpacklo_epi8(b2, b3), h23 = _mm256_unpackhi_epi8(b2, b3);
    v[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(l01, l23));
    v[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(l01, l23));
    v[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(h01, h23));
    v[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(h01, h23));
}

/* x's K values in nib32's order, per 32 columns (K % 32 == 0). */
static void permute32(const float *x, float *xp, Py_ssize_t K) {
    static const int ord[32] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23,
                                8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31};
    Py_ssize_t k;
    int i;
    for (k = 0; k < K; k += 32)
        for (i = 0; i < 32; i++) xp[k + i] = x[k + ord[i]];
}

/* One row of x (M = 1): each 32 weights formed and multiplied at once, four accumulators.
 * `xp`: x permuted by permute32 where the codes are 4-bit (g % 16 == 0, K % 32 == 0). */
TGT static inline __attribute__((always_inline)) void row1_body(const mm_job *j, const float *xp, const int kind, const int hz,
                                                                const int hs, const int hb) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    const Py_ssize_t rowbytes = kind == K_NIB4 ? K / 2 : K;
    const int nib = kind == K_NIB4;
    __m256i pl[4];
    Py_ssize_t n, q, k;
    int i;
    if (nib) planes16(j->table, pl);
    for (n = j->n0; n < j->n1; n++) {
        const uint8_t *wr = j->w + n * rowbytes;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        if (nib) { /* 32 columns at a time; their low 16 and high 16 may lie in two groups (g = 16) */
            const float *zr = hz ? j->z + n * G : NULL, *sr = hs ? j->s + n * G : NULL, *br = hb ? j->b + n * G : NULL;
            const Py_ssize_t hpg = g / 16; /* halves of 16 columns per group: no division in the loop */
            Py_ssize_t qa = 0, ca = 0, qb;
            for (k = 0; k < K; k += 32) {
                __m256 v[4];
                if (++ca == hpg) ca = 0, qb = qa + 1; else qb = qa;
                nib32(wr + k / 2, pl, v);
                const __m256 vz = hz ? _mm256_set_m128(_mm_set1_ps(zr[qb]), _mm_set1_ps(zr[qa])) : _mm256_setzero_ps();
                const __m256 vs = hs ? _mm256_set_m128(_mm_set1_ps(sr[qb]), _mm_set1_ps(sr[qa])) : _mm256_setzero_ps();
                const __m256 vb = hb ? _mm256_set_m128(_mm_set1_ps(br[qb]), _mm_set1_ps(br[qa])) : _mm256_setzero_ps();
                if (++ca == hpg) ca = 0, qa = qb + 1; else qa = qb;
                for (i = 0; i < 4; i++) {
                    if (hz) v[i] = _mm256_sub_ps(v[i], vz);
                    if (hs) v[i] = _mm256_mul_ps(v[i], vs);
                    if (hb) v[i] = _mm256_add_ps(v[i], vb);
                    a[i] = _mm256_fmadd_ps(v[i], _mm256_loadu_ps(xp + k + 8 * i), a[i]);
                }
            }
        } else {
            for (q = 0; q < G; q++) {
                const float z = hz ? j->z[n * G + q] : 0.0f, s = hs ? j->s[n * G + q] : 0.0f, b = hb ? j->b[n * G + q] : 0.0f;
                const __m256 vz = _mm256_set1_ps(z), vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
                const uint8_t *wg = wr + q * g;
                const float *xr = j->x + q * g;
                k = 0;
                for (; k + 32 <= g; k += 32)
                    for (i = 0; i < 4; i++) {
                        __m256 w = byte_values(wg + k + 8 * i, kind, j->table);
                        if (hz) w = _mm256_sub_ps(w, vz);
                        if (hs) w = _mm256_mul_ps(w, vs);
                        if (hb) w = _mm256_add_ps(w, vb);
                        a[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xr + k + 8 * i), a[i]);
                    }
                for (; k < g; k += 8) {
                    __m256 w = byte_values(wg + k, kind, j->table);
                    if (hz) w = _mm256_sub_ps(w, vz);
                    if (hs) w = _mm256_mul_ps(w, vs);
                    if (hb) w = _mm256_add_ps(w, vb);
                    a[0] = _mm256_fmadd_ps(w, _mm256_loadu_ps(xr + k), a[0]);
                }
            }
        }
        j->y[n] = hsum8(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
    }
}

/* row1_body with the code kind and the parameters' presence as constants (no tests in the
 * inner loops: measured 2x on the e5m2 path). */
#define ROW1_FLAGS(KIND)                                      \
    switch (flags) {                                          \
    case 0: row1_body(j, xp, KIND, 0, 0, 0); break;           \
    case 1: row1_body(j, xp, KIND, 0, 0, 1); break;           \
    case 2: row1_body(j, xp, KIND, 0, 1, 0); break;           \
    case 3: row1_body(j, xp, KIND, 0, 1, 1); break;           \
    case 4: row1_body(j, xp, KIND, 1, 0, 0); break;           \
    case 5: row1_body(j, xp, KIND, 1, 0, 1); break;           \
    case 6: row1_body(j, xp, KIND, 1, 1, 0); break;           \
    default: row1_body(j, xp, KIND, 1, 1, 1); break;          \
    }
TGT static void row1_avx2(const mm_job *j, const float *xp) {
    const int flags = (j->z != NULL) << 2 | (j->s != NULL) << 1 | (j->b != NULL);
    switch (j->kind) {
    case K_NIB4: ROW1_FLAGS(K_NIB4) break;
    case K_I8: ROW1_FLAGS(K_I8) break;
    case K_U8: ROW1_FLAGS(K_U8) break;
    case K_E4M3: ROW1_FLAGS(K_E4M3) break;
    case K_E5M2: ROW1_FLAGS(K_E5M2) break;
    default: ROW1_FLAGS(K_LUT8) break;
    }
}
#undef ROW1_FLAGS

/* Weight row n formed into `w` (K binary32 values), each weight as the scalar steps form it. */
TGT static void form_row(const mm_job *j, Py_ssize_t n, float *w) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    const int hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL, nib = j->kind == K_NIB4;
    const uint8_t *wr = j->w + n * rowbytes;
    Py_ssize_t q, k;
    for (q = 0; q < G; q++) {
        const float z = hz ? j->z[n * G + q] : 0.0f, s = hs ? j->s[n * G + q] : 0.0f, b = hb ? j->b[n * G + q] : 0.0f;
        const __m256 vz = _mm256_set1_ps(z), vs = _mm256_set1_ps(s), vb = _mm256_set1_ps(b);
        __m256 tlo = _mm256_setzero_ps(), thi = tlo;
        if (nib) { /* the group's 16 weights */
            tlo = _mm256_loadu_ps(j->table);
            thi = _mm256_loadu_ps(j->table + 8);
            if (hz) { tlo = _mm256_sub_ps(tlo, vz); thi = _mm256_sub_ps(thi, vz); }
            if (hs) { tlo = _mm256_mul_ps(tlo, vs); thi = _mm256_mul_ps(thi, vs); }
            if (hb) { tlo = _mm256_add_ps(tlo, vb); thi = _mm256_add_ps(thi, vb); }
        }
        const uint8_t *wg = wr + (nib ? q * g / 2 : q * g);
        float *wq = w + q * g;
        for (k = 0; k < g; k += 8) {
            __m256 v;
            if (nib)
                v = nib_weights(wg + k / 2, tlo, thi);
            else {
                v = byte_values(wg + k, j->kind, j->table);
                if (hz) v = _mm256_sub_ps(v, vz);
                if (hs) v = _mm256_mul_ps(v, vs);
                if (hb) v = _mm256_add_ps(v, vb);
            }
            _mm256_storeu_ps(wq + k, v);
        }
    }
}

/* Several rows of x: two weight rows formed at a time into `wrow` (2K values, in L1/L2), then
 * multiplied by 4 rows of x at a time: 8 accumulators, each x load serving both weight rows. */
TGT static void rows_avx2(const mm_job *j, float *wrow) {
    const Py_ssize_t K = j->K, M = j->M, N = j->N;
    float *w0 = wrow, *w1 = wrow + K;
    Py_ssize_t n, k, m, mm;
    for (n = j->n0; n + 1 < j->n1; n += 2) {
        form_row(j, n, w0);
        form_row(j, n + 1, w1);
        for (m = 0; m < M; m += 4) {
            const Py_ssize_t nm = M - m < 4 ? M - m : 4;
            const float *x0 = j->x + m * K;
            __m256 a[4], c[4];
            for (mm = 0; mm < 4; mm++) a[mm] = c[mm] = _mm256_setzero_ps();
            if (nm == 4)
                for (k = 0; k < K; k += 8) {
                    const __m256 u = _mm256_loadu_ps(w0 + k), v = _mm256_loadu_ps(w1 + k);
                    __m256 x;
                    x = _mm256_loadu_ps(x0 + k);         a[0] = _mm256_fmadd_ps(u, x, a[0]); c[0] = _mm256_fmadd_ps(v, x, c[0]);
                    x = _mm256_loadu_ps(x0 + K + k);     a[1] = _mm256_fmadd_ps(u, x, a[1]); c[1] = _mm256_fmadd_ps(v, x, c[1]);
                    x = _mm256_loadu_ps(x0 + 2 * K + k); a[2] = _mm256_fmadd_ps(u, x, a[2]); c[2] = _mm256_fmadd_ps(v, x, c[2]);
                    x = _mm256_loadu_ps(x0 + 3 * K + k); a[3] = _mm256_fmadd_ps(u, x, a[3]); c[3] = _mm256_fmadd_ps(v, x, c[3]);
                }
            else
                for (k = 0; k < K; k += 8) {
                    const __m256 u = _mm256_loadu_ps(w0 + k), v = _mm256_loadu_ps(w1 + k);
                    for (mm = 0; mm < nm; mm++) {
                        const __m256 x = _mm256_loadu_ps(x0 + mm * K + k);
                        a[mm] = _mm256_fmadd_ps(u, x, a[mm]);
                        c[mm] = _mm256_fmadd_ps(v, x, c[mm]);
                    }
                }
            for (mm = 0; mm < nm; mm++) {
                j->y[(m + mm) * N + n] = hsum8(a[mm]);
                j->y[(m + mm) * N + n + 1] = hsum8(c[mm]);
            }
        }
    }
    for (; n < j->n1; n++) { /* an odd last row */
        form_row(j, n, w0);
        for (m = 0; m < M; m++) {
            const float *xr = j->x + m * K;
            __m256 a0 = _mm256_setzero_ps();
            for (k = 0; k < K; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), _mm256_loadu_ps(xr + k), a0);
            j->y[m * N + n] = hsum8(a0);
        }
    }
}

static int cpu_level(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") ? LVL_AVX2 : LVL_GENERIC;
}
#else
static int cpu_level(void) { return LVL_GENERIC; }
#endif

static PyObject *bad(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

/* matmul(x, M, K, w, N, kind, table, g, z, s, b, y, n0, n1, level)
 * x: binary32 [M, K]; w: codes; table: 16 (NIB4) or 256 binary32 values; z, s, b: binary32
 * [N, K/g] or None; y: binary32 [M, N], columns [n0, n1) written; level 0 scalar, 1 AVX2. */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    Py_buffer bx = {0}, bw = {0}, bt = {0}, by = {0}, bp[3];
    PyObject *po[3];
    Py_ssize_t M, K, N, g, n0, n1;
    int kind, level, i, np_ = 0, use_row1, use_rows;
    float *xp = NULL, *wrow = NULL;
    mm_job j;
    (void)self;
    memset(bp, 0, sizeof bp);
    if (!PyArg_ParseTuple(args, "y*nny*niy*nOOOw*nni", &bx, &M, &K, &bw, &N, &kind, &bt, &g, &po[0], &po[1], &po[2], &by, &n0, &n1,
                          &level))
        return NULL;
#define FAIL(msg)                                          \
    do {                                                   \
        PyBuffer_Release(&bx);                             \
        PyBuffer_Release(&bw);                             \
        PyBuffer_Release(&bt);                             \
        PyBuffer_Release(&by);                             \
        for (i = 0; i < np_; i++) PyBuffer_Release(&bp[i]); \
        PyMem_RawFree(xp);                                 \
        PyMem_RawFree(wrow);                               \
        return msg ? bad(msg) : NULL;                      \
    } while (0)
    if (M < 1 || M > 1024 || K < 1 || N < 1 || g < 8 || g > MAXG || g % 8 || K % g) FAIL("bad sizes (g must be a multiple of 8 up to 4096 dividing K)");
    if (kind < K_NIB4 || kind > K_LUT8) FAIL("bad code kind");
    if (n0 < 0 || n1 > N || n0 > n1) FAIL("bad column range");
    if (K > PY_SSIZE_T_MAX / 4 / M || K > PY_SSIZE_T_MAX / N || M > PY_SSIZE_T_MAX / 4 / N) FAIL("sizes overflow");
    if (bx.len < M * K * 4) FAIL("x too short");
    if (bw.len < N * (kind == K_NIB4 ? K / 2 : K)) FAIL("codes too short");
    if (bt.len != (kind == K_NIB4 ? 16 : 256) * 4) FAIL("table must hold 16 (4-bit) or 256 binary32 values");
    if (by.len < M * N * 4) FAIL("y too short");
    for (i = 0; i < 3; i++) {
        if (po[i] == Py_None) continue;
        if (PyObject_GetBuffer(po[i], &bp[np_], PyBUF_SIMPLE) < 0) FAIL(NULL);
        np_++;
        if (bp[np_ - 1].len < N * (K / g) * 4) FAIL("parameter too short");
    }
    memset(&j, 0, sizeof j);
    j.x = (const float *)bx.buf;
    j.w = (const uint8_t *)bw.buf;
    j.table = (const float *)bt.buf;
    j.y = (float *)by.buf;
    {
        int t = 0;
        const float **dst[3] = {&j.z, &j.s, &j.b};
        for (i = 0; i < 3; i++)
            if (po[i] != Py_None) *dst[i] = (const float *)bp[t++].buf;
    }
    j.M = M, j.K = K, j.N = N, j.g = g, j.n0 = n0, j.n1 = n1, j.kind = kind;
    if (level > cpu_level()) FAIL("kernel level not supported on this CPU");
    use_row1 = level == LVL_AVX2 && M == 1 && (kind != K_NIB4 || (g % 16 == 0 && K % 32 == 0));
    use_rows = level == LVL_AVX2 && !use_row1;
    if (use_rows) {
        wrow = (float *)PyMem_RawMalloc((size_t)K * 2 * sizeof(float));
        if (!wrow) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
    }
    if (use_row1 && kind == K_NIB4) {
        xp = (float *)PyMem_RawMalloc((size_t)K * sizeof(float));
        if (!xp) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
        permute32(j.x, xp, K);
    }
    Py_BEGIN_ALLOW_THREADS
#if QF_X86
    if (use_row1)
        row1_avx2(&j, xp);
    else if (use_rows)
        rows_avx2(&j, wrow);
    else
#endif
        rows_generic(&j);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(xp);
    PyMem_RawFree(wrow);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&bw);
    PyBuffer_Release(&bt);
    PyBuffer_Release(&by);
    for (i = 0; i < np_; i++) PyBuffer_Release(&bp[i]);
    Py_RETURN_NONE;
#undef FAIL
}

static PyObject *py_cpu_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(cpu_level());
}

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS, "x @ W^T with W packed (see the file's header)."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "1 where the AVX2+FMA+F16C path runs, else 0."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matmul", "qformat's native matmul kernel.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__matmul(void) { return PyModule_Create(&module); }
