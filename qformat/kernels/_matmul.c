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
 * One call computes output columns [n0, n1) with the GIL released, split into shares over the
 * process's OpenMP threads or this file's pool (see pool_run).  Every buffer size is checked
 * before the GIL is released.  Dispatch: AVX-512 (F, BW, VL, DQ) where the CPU has it and the
 * shapes allow (groups of a multiple of 16 columns), with AVX512_VBMI byte planes for byte codes
 * whose values are bfloat16 values, and for several rows of bfloat16 x (the caller's bf16x)
 * AMX tiles or AVX512_BF16 dot products; 2 to FEWMAX rows of x take the few-rows path (each
 * weight formed in registers once for all rows, few_f32 / few_bf) and bfloat16 x of more than
 * 1 MiB (L2) without AMX the column-chunked tiles (blk_bf); else AVX2+FMA+F16C where the CPU has
 * them, else the portable scalar loop.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#include <immintrin.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define QF_X86 1
#else
#define QF_X86 0
#endif

/* K_LUT6: a 256-entry table whose codes the caller promises are below 64 (6-bit codes, one per
 * byte); every path but row1_bfs6 takes it as K_LUT8 (py_matmul maps it) */
enum { K_NIB4 = 0, K_I8 = 1, K_U8 = 2, K_E4M3 = 3, K_E5M2 = 4, K_LUT8 = 5, K_LUT6 = 6 };
enum { LVL_GENERIC = 0, LVL_AVX2 = 1, LVL_AVX512 = 2 };
static int g_amx_off = 0; /* the AMX path switched off (py_amx), with the GIL held */
static int g_planes_off = 0; /* the VBMI byte-plane path switched off (py_planes), with the GIL held */
static int g_few_off = 0; /* the few-rows path (2 to FEWMAX rows of x) switched off (py_few), with the GIL held */
static int g_bf1_off = 0; /* the one-row bfloat16 path (row1_bfs) switched off (py_bf1), with the GIL held */
#define MAXG 4096 /* largest group the scalar path's per-group weight buffer holds */
/* most rows of x the few-rows path takes: at 8 rows (2 weight rows in lockstep) it measured no faster
 * than rows_bf16 for int4 g32 and slower for Q4_K (issue 45 notes), at 2 and 4 rows 1.3-1.7x faster */
#define FEWMAX 4

typedef struct {
    const float *x;      /* [M, K] */
    const uint8_t *w;    /* [N, K/2] (NIB4) or [N, K] */
    const float *table;  /* 16 or 256 binary32 element values */
    const float *z, *s, *b; /* [N, K/g] each, or NULL */
    float *y;            /* [M, N] */
    Py_ssize_t M, K, N, g, n0, n1;
    int kind;
    const uint8_t *planes; /* bfloat16 byte planes of the table (AVX512_VBMI byte path), or NULL */
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

/* Software prefetch of the codes QF_PF_BYTES ahead, into L2: without it one thread's sequential
 * stream of codes ran far below the memory bandwidth, the loop waiting on each line (measured on
 * a 2-core AVX-512 VM, M = 1, 24 matrices of 4096 x 2816 in turn so that none is in cache, AVX-512
 * level, ms per matrix: 4-bit codes g32 1.53 -> 0.67 on one thread, 0.81 -> 0.46 on two; int8 per
 * channel 0.88 -> 0.70 on two; 4 KiB ahead or into L1 measured within 10% of this).  A prefetch
 * never faults; rows past the caller's range are not touched.  QF_NO_PREFETCH builds without it,
 * to measure it again. */
#ifndef QF_PF_BYTES
#define QF_PF_BYTES 16384
#endif
#ifndef QF_PF_LOCALITY
#define QF_PF_LOCALITY 2
#endif
static inline Py_ssize_t pf_rows(Py_ssize_t rowbytes) { return (QF_PF_BYTES + rowbytes - 1) / rowbytes; }

static inline void prefetch_row(const mm_job *j, Py_ssize_t n, Py_ssize_t rowbytes) {
    Py_ssize_t o;
#ifdef QF_NO_PREFETCH
    return;
#endif
    if (n < j->n1)
        for (o = 0; o < rowbytes; o += 64) __builtin_prefetch(j->w + n * rowbytes + o, 0, QF_PF_LOCALITY);
}

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
    const Py_ssize_t ahead = pf_rows(rowbytes);
    if (nib) planes16(j->table, pl);
    for (n = j->n0; n < j->n1; n++) {
        const uint8_t *wr = j->w + n * rowbytes;
        prefetch_row(j, n + ahead, rowbytes);
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

/* BODY(j, xp, kind, hz, hs, hb) with the code kind and the parameters' presence as constants
 * (no tests in the inner loops: measured 2x on the e5m2 path); the one-row loops of both levels. */
#define FLAGS_SWITCH(BODY, KIND)                           \
    switch (flags) {                                       \
    case 0: BODY(j, xp, KIND, 0, 0, 0); break;             \
    case 1: BODY(j, xp, KIND, 0, 0, 1); break;             \
    case 2: BODY(j, xp, KIND, 0, 1, 0); break;             \
    case 3: BODY(j, xp, KIND, 0, 1, 1); break;             \
    case 4: BODY(j, xp, KIND, 1, 0, 0); break;             \
    case 5: BODY(j, xp, KIND, 1, 0, 1); break;             \
    case 6: BODY(j, xp, KIND, 1, 1, 0); break;             \
    default: BODY(j, xp, KIND, 1, 1, 1); break;            \
    }
#define KINDS_SWITCH(BODY)                                                              \
    do {                                                                                \
        const int flags = (j->z != NULL) << 2 | (j->s != NULL) << 1 | (j->b != NULL);   \
        switch (j->kind) {                                                              \
        case K_NIB4: FLAGS_SWITCH(BODY, K_NIB4) break;                                  \
        case K_I8: FLAGS_SWITCH(BODY, K_I8) break;                                      \
        case K_U8: FLAGS_SWITCH(BODY, K_U8) break;                                      \
        case K_E4M3: FLAGS_SWITCH(BODY, K_E4M3) break;                                  \
        case K_E5M2: FLAGS_SWITCH(BODY, K_E5M2) break;                                  \
        default: FLAGS_SWITCH(BODY, K_LUT8) break;                                      \
        }                                                                               \
    } while (0)
TGT static void row1_avx2(const mm_job *j, const float *xp) { KINDS_SWITCH(row1_body); }

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
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    for (n = j->n0; n + 1 < j->n1; n += 2) {
        prefetch_row(j, n + 2, rowbytes);
        prefetch_row(j, n + 3, rowbytes);
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


/* ---- AVX-512 (F, BW, VL, DQ): 16 lanes, a 4-bit code's whole 16-entry table in one register ----
 * 4-bit codes: the group's table folded with its parameters (the same binary32 steps per table
 * entry as per weight, so the folded entry is the weight bit for bit) and looked up with one
 * vpermps per 16 codes (vpermps reads the low 4 bits of each index: a byte's low nibble needs no
 * mask).  16 bytes give 32 codes: the low nibbles (elements 0, 2, .., 30) and the high ones
 * (1, 3, .., 31); x is permuted to that even/odd order once per call (permute_eo).  Where a
 * block of 32 columns spans two groups (g % 32 == 16: nvfp4's 16), the two folded tables are
 * one 32-entry table for vpermt2ps, the index's bit 4 naming the group of each lane. */
#define TGT512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define TGTVB __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx2,fma,f16c")))
#define TGTVBBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,avx512bf16,avx2,fma,f16c")))

/* x's K values in the even/odd order of each 32 columns (K % 32 == 0). */
static void permute_eo(const float *x, float *xp, Py_ssize_t K) {
    Py_ssize_t k;
    int i;
    for (k = 0; k < K; k += 32)
        for (i = 0; i < 16; i++) xp[k + i] = x[k + 2 * i], xp[k + 16 + i] = x[k + 2 * i + 1];
}

/* The 16 table entries with one group's parameters, in SPEC.md's order. */
TGT512 static inline __m512 fold16(__m512 t, const int hz, const float *z, const int hs, const float *s, const int hb, const float *b) {
    if (hz) t = _mm512_sub_ps(t, _mm512_set1_ps(*z));
    if (hs) t = _mm512_mul_ps(t, _mm512_set1_ps(*s));
    if (hb) t = _mm512_add_ps(t, _mm512_set1_ps(*b));
    return t;
}

/* 16 element values (before parameters) of one-byte codes at p. */
TGT512 static inline __m512 byte_values16(const uint8_t *p, const int kind, const float *table) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)p);
    switch (kind) {
    case K_I8: return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(raw));
    case K_U8: return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(raw));
    case K_E4M3: { /* as byte_values: binary16 of 2^-8 times the value, then exactly times 2^8 */
        const __m256i h = _mm256_cvtepu8_epi16(raw);
        const __m256i bits = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7F)), 7),
                                             _mm256_slli_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x80)), 8));
        return _mm512_mul_ps(_mm512_cvtph_ps(bits), _mm512_set1_ps(256.0f));
    }
    case K_E5M2: return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(raw), 8));
    default: return _mm512_i32gather_ps(_mm512_cvtepu8_epi32(raw), table, 4);
    }
}

/* 16 weights of one-byte codes at p with one group's parameters. */
TGT512 static inline __m512 byte_weights16(const uint8_t *p, const int kind, const float *table, const int hz, const float *z,
                                           const int hs, const float *s, const int hb, const float *b) {
    __m512 w = byte_values16(p, kind, table);
    if (hz) w = _mm512_sub_ps(w, _mm512_set1_ps(*z));
    if (hs) w = _mm512_mul_ps(w, _mm512_set1_ps(*s));
    if (hb) w = _mm512_add_ps(w, _mm512_set1_ps(*b));
    return w;
}

/* Row n's weights, 32 columns (16 code bytes) at a time for 4-bit codes, 16 for byte codes,
 * handed to `EMIT(k, w)` with k the first column of the 16 weights w (in permute_eo's order for
 * 4-bit codes).  A macro so that the multiply-accumulate (M = 1) and the store (M > 1) share
 * one definition of how a weight is formed. */
#define FORM_ROW512(EMIT)                                                                                                    \
    do {                                                                                                                     \
        const uint8_t *wr_ = j->w + n * (nib ? K / 2 : K);                                                                   \
        const float *zr_ = hz ? j->z + n * G : NULL, *sr_ = hs ? j->s + n * G : NULL, *br_ = hb ? j->b + n * G : NULL;       \
        Py_ssize_t q_, k_;                                                                                                   \
        if (nib && g % 32 == 0) {                                                                                            \
            for (q_ = 0; q_ < G; q_++) {                                                                                     \
                const __m512 t_ = fold16(tab, hz, zr_ + q_, hs, sr_ + q_, hb, br_ + q_);                                     \
                for (k_ = q_ * g; k_ < (q_ + 1) * g; k_ += 32) {                                                             \
                    const __m512i c_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr_ + k_ / 2)));               \
                    EMIT(k_, _mm512_permutexvar_ps(c_, t_));                                                                 \
                    EMIT(k_ + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(c_, 4), t_));                                       \
                }                                                                                                            \
            }                                                                                                                \
        } else if (nib) { /* g % 32 == 16: lanes 0-7 of each half from group qa, 8-15 from qb */                            \
            const __m512i sel_ = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);                  \
            const Py_ssize_t hpg_ = g / 16;                                                                                  \
            Py_ssize_t qa_ = 0, ca_ = 0, qb_;                                                                                \
            for (k_ = 0; k_ < K; k_ += 32) {                                                                                 \
                if (++ca_ == hpg_) ca_ = 0, qb_ = qa_ + 1; else qb_ = qa_;                                                   \
                const __m512 ta_ = fold16(tab, hz, zr_ + qa_, hs, sr_ + qa_, hb, br_ + qa_);                                 \
                const __m512 tb_ = fold16(tab, hz, zr_ + qb_, hs, sr_ + qb_, hb, br_ + qb_);                                 \
                if (++ca_ == hpg_) ca_ = 0, qa_ = qb_ + 1; else qa_ = qb_;                                                   \
                const __m512i c_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr_ + k_ / 2)));                   \
                /* (c & 15) | sel and (c >> 4) | sel: the code, and bit 4 naming the lane's group */                        \
                EMIT(k_, _mm512_permutex2var_ps(ta_, _mm512_ternarylogic_epi32(c_, _mm512_set1_epi32(15), sel_, 0xEA), tb_)); \
                EMIT(k_ + 16, _mm512_permutex2var_ps(ta_, _mm512_or_si512(_mm512_srli_epi32(c_, 4), sel_), tb_));           \
            }                                                                                                                \
        } else {                                                                                                             \
            for (q_ = 0; q_ < G; q_++)                                                                                       \
                for (k_ = q_ * g; k_ < (q_ + 1) * g; k_ += 16)                                                               \
                    EMIT(k_, byte_weights16(wr_ + k_, kind, j->table, hz, zr_ + q_, hs, sr_ + q_, hb, br_ + q_));            \
        }                                                                                                                    \
    } while (0)


/* One row of x (M = 1): four accumulators, taken in turn by successive 16-weight steps. */
TGT512 static inline __attribute__((always_inline)) void row1_512_body(const mm_job *j, const float *xp, const int kind, const int hz,
                                                                       const int hs, const int hb) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    const int nib = kind == K_NIB4;
    const __m512 tab = nib ? _mm512_loadu_ps(j->table) : _mm512_setzero_ps();
    const float *x = nib ? xp : j->x;
    const Py_ssize_t rowbytes = nib ? K / 2 : K, ahead = pf_rows(rowbytes);
    Py_ssize_t n;
    for (n = j->n0; n < j->n1; n++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        prefetch_row(j, n + ahead, rowbytes);
        /* rotate the accumulators: a0 <- a0 + w x, then a0..a3 shift, so that consecutive FMAs
         * are independent (the compiler renames; no data moves) */
#define ACC1(k, w)                                                      \
    do {                                                                \
        const __m512 t0_ = _mm512_fmadd_ps((w), _mm512_loadu_ps(x + (k)), a0); \
        a0 = a1, a1 = a2, a2 = a3, a3 = t0_;                            \
    } while (0)
        FORM_ROW512(ACC1);
#undef ACC1
        j->y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

TGT512 static void row1_avx512(const mm_job *j, const float *xp) { KINDS_SWITCH(row1_512_body); }

/* Weight row n formed into w (K binary32 values, permute_eo's order for 4-bit codes). */
TGTVB static void form_row_vb(const mm_job *j, Py_ssize_t n, float *w);
TGTVBBF static void form_row_vb_bf16(const mm_job *j, Py_ssize_t n, uint16_t *w);

TGT512 static void form_row512(const mm_job *j, Py_ssize_t n, float *w) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    if (j->planes) {
        form_row_vb(j, n, w);
        return;
    }
    const int kind = j->kind, nib = kind == K_NIB4, hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL;
    const __m512 tab = nib ? _mm512_loadu_ps(j->table) : _mm512_setzero_ps();
#define STORE1(k, v) _mm512_storeu_ps(w + (k), (v))
    FORM_ROW512(STORE1);
#undef STORE1
}

/* y[m0 + i, n + c] for i < NM rows of x, c < 4 formed weight rows w (each K long): 4 x NM
 * accumulators, each x load serving four weight rows and each weight load NM rows of x. */
TGT512 static inline __attribute__((always_inline)) void mul4(const mm_job *j, const float *x, const float *w, Py_ssize_t m0,
                                                              Py_ssize_t n, const int NM) {
    const Py_ssize_t K = j->K, N = j->N;
    __m512 a[4][4];
    Py_ssize_t k;
    int i, c;
    for (i = 0; i < NM; i++)
        for (c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (k = 0; k < K; k += 16) {
        const __m512 w0 = _mm512_loadu_ps(w + k), w1 = _mm512_loadu_ps(w + K + k);
        const __m512 w2 = _mm512_loadu_ps(w + 2 * K + k), w3 = _mm512_loadu_ps(w + 3 * K + k);
        for (i = 0; i < NM; i++) {
            const __m512 xv = _mm512_loadu_ps(x + (m0 + i) * K + k);
            a[i][0] = _mm512_fmadd_ps(w0, xv, a[i][0]);
            a[i][1] = _mm512_fmadd_ps(w1, xv, a[i][1]);
            a[i][2] = _mm512_fmadd_ps(w2, xv, a[i][2]);
            a[i][3] = _mm512_fmadd_ps(w3, xv, a[i][3]);
        }
    }
    for (i = 0; i < NM; i++)
        for (c = 0; c < 4; c++) j->y[(m0 + i) * N + n + c] = _mm512_reduce_add_ps(a[i][c]);
}

/* Several rows of x: four weight rows formed at a time into `wrow` (4K values), then multiplied
 * by 4 rows of x at a time (x: permute_eo's order for 4-bit codes). */
TGT512 static void rows_avx512(const mm_job *j, const float *x, float *wrow) {
    const Py_ssize_t K = j->K, M = j->M, N = j->N;
    Py_ssize_t n, m, k, c;
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    for (n = j->n0; n + 3 < j->n1; n += 4) {
        for (c = 0; c < 4; c++) prefetch_row(j, n + 4 + c, rowbytes);
        for (c = 0; c < 4; c++) form_row512(j, n + c, wrow + c * K);
        for (m = 0; m + 3 < M; m += 4) mul4(j, x, wrow, m, n, 4);
        switch (M - m) {
        case 3: mul4(j, x, wrow, m, n, 3); break;
        case 2: mul4(j, x, wrow, m, n, 2); break;
        case 1: mul4(j, x, wrow, m, n, 1); break;
        default: break;
        }
    }
    for (; n < j->n1; n++) { /* the last rows of an odd share */
        form_row512(j, n, wrow);
        for (m = 0; m < M; m++) {
            __m512 a0 = _mm512_setzero_ps();
            for (k = 0; k < K; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wrow + k), _mm512_loadu_ps(x + m * K + k), a0);
            j->y[m * N + n] = _mm512_reduce_add_ps(a0);
        }
    }
}

/* ---- byte codes by bfloat16 byte planes (AVX512_VBMI) ----
 * Where every one of the 256 element values is a bfloat16 value (fp8 e4m3 and e5m2, small
 * integers such as converted Q5_K/Q6_K codes; checked per call on the table), the binary32 value
 * of a code is its bfloat16 bits shifted up by 16: two 256-byte planes (the bits' low and high
 * bytes) looked up for 64 codes at a time by vpermt2b (128 entries per lookup, the code's top
 * bit choosing between two), then interleaved into binary32 with zero low halves.  13 shuffles
 * per 64 weights where the fp8 conversion through binary16 took about 40 operations.  The
 * interleave leaves each 64 columns in the order r*16 + 4L + i <- 16L + 4r + i (register r,
 * 128-bit lane L), which x is permuted to once per call (permute_q64); parameters are per 16
 * columns at least (g = 16, 32 or a multiple of 64), spread over the lanes to match. */

static void permute_q64(const float *x, float *xq, Py_ssize_t K) {
    Py_ssize_t b;
    int r, L, i;
    for (b = 0; b < K; b += 64)
        for (r = 0; r < 4; r++)
            for (L = 0; L < 4; L++)
                for (i = 0; i < 4; i++) xq[b + 16 * r + 4 * L + i] = x[b + 16 * L + 4 * r + i];
}

/* The 4 x 16 element values of the 64 codes at p (permute_q64's order). */
TGTVB static inline __attribute__((always_inline)) void planes64(const uint8_t *p, const __m512i pl[8], __m512 v[4]) {
    const __m512i c = _mm512_loadu_si512((const void *)p);
    const __mmask64 top = _mm512_movepi8_mask(c);
    const __m512i lo = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(pl[0], c, pl[1]), _mm512_permutex2var_epi8(pl[2], c, pl[3]));
    const __m512i hi = _mm512_mask_blend_epi8(top, _mm512_permutex2var_epi8(pl[4], c, pl[5]), _mm512_permutex2var_epi8(pl[6], c, pl[7]));
    const __m512i w0 = _mm512_unpacklo_epi8(lo, hi), w1 = _mm512_unpackhi_epi8(lo, hi), z = _mm512_setzero_si512();
    v[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w0));
    v[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w0));
    v[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(z, w1));
    v[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, w1));
}

/* One parameter per lane for the 64 columns from k (permute_q64's order: lane 4L + i is column
 * 16L + 4r + i, in group (k + 16L) / g). */
TGTVB static inline __m512 pvec(const float *p, Py_ssize_t k, Py_ssize_t g) {
    if (g == 16) return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_castps128_ps512(_mm_loadu_ps(p + k / 16)));
    if (g == 32) return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(p[k / 32]), _mm512_set1_ps(p[k / 32 + 1]));
    return _mm512_set1_ps(p[k / g]);
}

/* Row n's weights, 64 columns at a time, handed to EMIT(k, v[4]). */
#define FORM_ROW_VB(EMIT)                                                                                  \
    do {                                                                                                   \
        const uint8_t *wr_ = j->w + n * K;                                                                 \
        const float *zr_ = j->z ? j->z + n * G : NULL, *sr_ = j->s ? j->s + n * G : NULL;                  \
        const float *br_ = j->b ? j->b + n * G : NULL;                                                     \
        Py_ssize_t k_;                                                                                     \
        int i_;                                                                                            \
        for (k_ = 0; k_ < K; k_ += 64) {                                                                   \
            __m512 v_[4];                                                                                  \
            planes64(wr_ + k_, pl, v_);                                                                    \
            if (zr_) { const __m512 p_ = pvec(zr_, k_, g); for (i_ = 0; i_ < 4; i_++) v_[i_] = _mm512_sub_ps(v_[i_], p_); } \
            if (sr_) { const __m512 p_ = pvec(sr_, k_, g); for (i_ = 0; i_ < 4; i_++) v_[i_] = _mm512_mul_ps(v_[i_], p_); } \
            if (br_) { const __m512 p_ = pvec(br_, k_, g); for (i_ = 0; i_ < 4; i_++) v_[i_] = _mm512_add_ps(v_[i_], p_); } \
            EMIT(k_, v_);                                                                                  \
        }                                                                                                  \
    } while (0)

TGTVB static inline void load_planes(const uint8_t *planes, __m512i pl[8]) {
    int i;
    for (i = 0; i < 8; i++) pl[i] = _mm512_loadu_si512((const void *)(planes + 64 * i));
}

/* M = 1: four accumulators, one per register of a block. */
TGTVB static void row1_vb(const mm_job *j, const float *xq) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g, ahead = pf_rows(K);
    __m512i pl[8];
    Py_ssize_t n;
    load_planes(j->planes, pl);
    for (n = j->n0; n < j->n1; n++) {
        __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
        prefetch_row(j, n + ahead, K);
#define ACCV(k, v)                                                                                   \
    do {                                                                                             \
        int r_;                                                                                      \
        for (r_ = 0; r_ < 4; r_++) a[r_] = _mm512_fmadd_ps((v)[r_], _mm512_loadu_ps(xq + (k) + 16 * r_), a[r_]); \
    } while (0)
        FORM_ROW_VB(ACCV);
#undef ACCV
        j->y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
    }
}

/* Row n formed into w (binary32, permute_q64's order). */
TGTVB static void form_row_vb(const mm_job *j, Py_ssize_t n, float *w) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    __m512i pl[8];
    load_planes(j->planes, pl);
#define STOREV(k, v)                                                                     \
    do {                                                                                 \
        int r_;                                                                          \
        for (r_ = 0; r_ < 4; r_++) _mm512_storeu_ps(w + (k) + 16 * r_, (v)[r_]);         \
    } while (0)
    FORM_ROW_VB(STOREV);
#undef STOREV
}

/* Row n formed and rounded to bfloat16 into w (permute_q64's order). */
TGTVBBF static void form_row_vb_bf16(const mm_job *j, Py_ssize_t n, uint16_t *w) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    __m512i pl[8];
    load_planes(j->planes, pl);
#define STOREVB(k, v)                                                                                           \
    do {                                                                                                        \
        int r_;                                                                                                 \
        for (r_ = 0; r_ < 4; r_++) _mm256_storeu_si256((__m256i *)(w + (k) + 16 * r_), (__m256i)_mm512_cvtneps_pbh((v)[r_])); \
    } while (0)
    FORM_ROW_VB(STOREVB);
#undef STOREVB
}

/* The planes of a 256-entry table where every value is a bfloat16 value (else 0). */
static int bf16_planes(const float *table, uint8_t *planes) {
    int c;
    for (c = 0; c < 256; c++) {
        uint32_t u;
        memcpy(&u, table + c, 4);
        if (u & 0xFFFF) return 0;
        planes[c] = (uint8_t)(u >> 16);
        planes[256 + c] = (uint8_t)(u >> 24);
    }
    return 1;
}

static int cpu_vbmi(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vbmi");
}

/* ---- bfloat16 dot products (AVX512_BF16), several rows of bfloat16 activations ----
 * Where x holds bfloat16 values (the caller says so) and the weights are in bfloat16's normal
 * range (the caller proves it), each formed binary32 weight is rounded to bfloat16 (round to
 * nearest even, as torch's .to(torch.bfloat16): the rounding F.linear does on the decode path)
 * and the products are summed by vdpbf16ps: each product of two bfloat16 values is exact in
 * binary32 and each addition rounds like an FMA's, so the error bound is the binary32 sum's plus
 * that one weight rounding.  vdpbf16ps treats subnormal inputs as zero and flushes subnormal
 * results: x with a subnormal value takes the binary32 path (checked per call), weights are
 * proved normal by the caller, and a flushed partial sum is an absolute error below 2^-126 per
 * step (qformat_torch.kernels.error_bound counts it).  Twice the products per instruction of the
 * binary32 FMA path, the weights' buffer half its size. */
#define TGTBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma,f16c")))

/* binary32 -> bfloat16 bits, round to nearest even (vcvtneps2bf16; it takes a subnormal input as
 * zero, which the callers exclude: weights proved normal, x checked).  A NaN stays a NaN. */
TGTBF static inline __m256i bf16_of(__m512 v) { return (__m256i)_mm512_cvtneps_pbh(v); }

/* Weight row n formed and rounded to bfloat16 into w (K values, permute_eo's order for 4-bit codes). */
TGTBF static void form_row_bf16(const mm_job *j, Py_ssize_t n, uint16_t *w) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g;
    if (j->planes) {
        form_row_vb_bf16(j, n, w);
        return;
    }
    const int kind = j->kind, nib = kind == K_NIB4, hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL;
    const __m512 tab = nib ? _mm512_loadu_ps(j->table) : _mm512_setzero_ps();
#define STOREBF(k, v) _mm256_storeu_si256((__m256i *)(w + (k)), bf16_of(v))
    FORM_ROW512(STOREBF);
#undef STOREBF
}

/* The lanes of v holding a subnormal value (exponent bits all zero, not zero): vdpbf16ps and
 * tdpbf16ps would take them as zero. */
TGTBF static inline __mmask16 subnormal16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    return _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7F800000)) & _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7FFFFFFF));
}

/* x's M x K values as bfloat16 bits (round to nearest even: exact for bfloat16 values); 0 where
 * a value is subnormal, else 1. */
TGTBF static int x_bf16(const float *x, Py_ssize_t n, uint16_t *out) {
    Py_ssize_t i;
    __mmask16 sub = 0;
    for (i = 0; i < n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        sub |= subnormal16(v);
        _mm256_storeu_si256((__m256i *)(out + i), bf16_of(v));
    }
    return sub == 0;
}

TGTBF static inline __attribute__((always_inline)) void mul4_bf16(const mm_job *j, const uint16_t *x, const uint16_t *w, Py_ssize_t m0,
                                                                  Py_ssize_t n, const int NM) {
    const Py_ssize_t K = j->K, N = j->N;
    __m512 a[4][4];
    Py_ssize_t k;
    int i, c;
    for (i = 0; i < NM; i++)
        for (c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (k = 0; k < K; k += 32) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k), w1 = (__m512bh)_mm512_loadu_si512(w + K + k);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(w + 2 * K + k), w3 = (__m512bh)_mm512_loadu_si512(w + 3 * K + k);
        for (i = 0; i < NM; i++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * K + k);
            a[i][0] = _mm512_dpbf16_ps(a[i][0], xv, w0);
            a[i][1] = _mm512_dpbf16_ps(a[i][1], xv, w1);
            a[i][2] = _mm512_dpbf16_ps(a[i][2], xv, w2);
            a[i][3] = _mm512_dpbf16_ps(a[i][3], xv, w3);
        }
    }
    for (i = 0; i < NM; i++)
        for (c = 0; c < 4; c++) j->y[(m0 + i) * N + n + c] = _mm512_reduce_add_ps(a[i][c]);
}

/* rows_avx512 with bfloat16 weights and x (K % 32 == 0). */
TGTBF static void rows_bf16(const mm_job *j, const uint16_t *x, uint16_t *wrow) {
    const Py_ssize_t K = j->K, M = j->M, N = j->N;
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    Py_ssize_t n, m, k, c;
    for (n = j->n0; n + 3 < j->n1; n += 4) {
        for (c = 0; c < 4; c++) prefetch_row(j, n + 4 + c, rowbytes);
        for (c = 0; c < 4; c++) form_row_bf16(j, n + c, wrow + c * K);
        for (m = 0; m + 3 < M; m += 4) mul4_bf16(j, x, wrow, m, n, 4);
        switch (M - m) {
        case 3: mul4_bf16(j, x, wrow, m, n, 3); break;
        case 2: mul4_bf16(j, x, wrow, m, n, 2); break;
        case 1: mul4_bf16(j, x, wrow, m, n, 1); break;
        default: break;
        }
    }
    for (; n < j->n1; n++) {
        form_row_bf16(j, n, wrow);
        for (m = 0; m < M; m++) {
            __m512 a0 = _mm512_setzero_ps();
            for (k = 0; k < K; k += 32)
                a0 = _mm512_dpbf16_ps(a0, (__m512bh)_mm512_loadu_si512(x + m * K + k), (__m512bh)_mm512_loadu_si512(wrow + k));
            j->y[m * N + n] = _mm512_reduce_add_ps(a0);
        }
    }
}

/* ---- a few rows of x (2 <= M <= FEWMAX, issue 45): each weight formed once, in registers, and applied
 * to every row of x ----
 * rows_avx512 / rows_bf16 store four formed weight rows (K values each, in L2 for a 14336-column
 * layer) and read them back for every 4 rows of x, and stream all of x (M K values) from L2 per 4
 * weight rows: at 2 to 8 rows that took about as long as torch's bfloat16 matmul, which reads 3.5x
 * the bytes.  Here RW = 4 weight rows at a time (RW x M accumulators in registers) have each 32
 * weights formed in registers (the same steps: folded 16-entry tables for 4-bit codes,
 * byte_weights16, or the VBMI byte planes) and multiplied at once into every row's
 * accumulators, nothing stored; each x load serves RW weight rows.  x is read in chunks of kc
 * columns (all M rows in FEW_XBYTES, in L1) for FEW_R weight rows in turn, the partial sums kept
 * per (weight row, x row) between chunks, so x comes from L2 once per FEW_R weight rows.  Binary32
 * x: FMAs; bfloat16 x (the bf16x conditions of rows_bf16): the 32 weights rounded to bfloat16 by
 * vcvtne2ps2bf16 (round to nearest even, as cvtneps_pbh; lo's 16 before hi's, so x is x_bf16's
 * plain conversion) and one vdpbf16ps per row of x.  Every weight is the one the other paths form;
 * only the sums' order differs (the same error bound). */
#define FEW_R 16
/* full unrolling of the loops over RW and NM before scalar replacement: without it GCC kept the
 * accumulators in a stack array, storing all of them every 32 columns */
#define FEW_UNROLL _Pragma("GCC unroll 16")
#ifndef FEW_XBYTES
#define FEW_XBYTES 16384
#endif

/* Columns per chunk: all M rows of x in FEW_XBYTES, a multiple of 64 (the planes' step), at least 64. */
static inline Py_ssize_t few_chunk(Py_ssize_t K, int M, int esize) {
    Py_ssize_t kc = FEW_XBYTES / ((Py_ssize_t)M * esize) / 64 * 64;
    if (kc < 64) kc = 64;
    return kc < K ? kc : K;
}

/* The RW rows' weights in columns [k0, k1) (multiples of 32), 32 at a time, handed to
 * PAIR(k, lo, hi): lo[r] the 16 weights of row r's columns k.., hi[r] those of k + 16.. (in
 * permute_eo's order for 4-bit codes).  g % 16 == 0. */
#define FEW_FORM512(PAIR)                                                                                                      \
    do {                                                                                                                       \
        Py_ssize_t k_;                                                                                                         \
        int r_;                                                                                                                \
        __m512 lo_[4], hi_[4];                                                                                                 \
        if (kind == K_NIB4 && g % 32 == 0) {                                                                                   \
            const Py_ssize_t gp_ = g / 32;                                                                                     \
            Py_ssize_t q_ = k0 / g, c_ = (k0 % g) / 32;                                                                        \
            __m512 t_[4];                                                                                                      \
            FEW_UNROLL for (r_ = 0; r_ < RW; r_++) t_[r_] = fold16(tab, hz, zr[r_] + q_, hs, sr[r_] + q_, hb, br[r_] + q_);               \
            for (k_ = k0; k_ < k1; k_ += 32) {                                                                                 \
                if (c_ == gp_) {                                                                                               \
                    c_ = 0, q_++;                                                                                              \
                    FEW_UNROLL for (r_ = 0; r_ < RW; r_++) t_[r_] = fold16(tab, hz, zr[r_] + q_, hs, sr[r_] + q_, hb, br[r_] + q_);       \
                }                                                                                                              \
                c_++;                                                                                                          \
                FEW_UNROLL for (r_ = 0; r_ < RW; r_++) {                                                                                  \
                    const __m512i cc_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr[r_] + k_ / 2)));             \
                    lo_[r_] = _mm512_permutexvar_ps(cc_, t_[r_]);                                                              \
                    hi_[r_] = _mm512_permutexvar_ps(_mm512_srli_epi32(cc_, 4), t_[r_]);                                        \
                }                                                                                                              \
                PAIR(k_, lo_, hi_);                                                                                            \
            }                                                                                                                  \
        } else { /* the two halves of 32 columns in groups qa_ and qb_ (the same one unless g % 32 == 16) */                 \
            const __m512i sel_ = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16);                     \
            const Py_ssize_t hpg_ = g / 16;                                                                                    \
            Py_ssize_t qa_ = k0 / g, ca_ = (k0 % g) / 16, qb_;                                                                 \
            for (k_ = k0; k_ < k1; k_ += 32) {                                                                                 \
                if (++ca_ == hpg_) ca_ = 0, qb_ = qa_ + 1; else qb_ = qa_;                                                     \
                FEW_UNROLL for (r_ = 0; r_ < RW; r_++) {                                                                                  \
                    if (kind == K_NIB4) {                                                                                      \
                        const __m512 ta_ = fold16(tab, hz, zr[r_] + qa_, hs, sr[r_] + qa_, hb, br[r_] + qa_);                  \
                        const __m512 tb_ = fold16(tab, hz, zr[r_] + qb_, hs, sr[r_] + qb_, hb, br[r_] + qb_);                  \
                        const __m512i cc_ = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(wr[r_] + k_ / 2)));         \
                        lo_[r_] = _mm512_permutex2var_ps(ta_, _mm512_ternarylogic_epi32(cc_, _mm512_set1_epi32(15), sel_, 0xEA), tb_); \
                        hi_[r_] = _mm512_permutex2var_ps(ta_, _mm512_or_si512(_mm512_srli_epi32(cc_, 4), sel_), tb_);          \
                    } else {                                                                                                   \
                        lo_[r_] = byte_weights16(wr[r_] + k_, kind, j->table, hz, zr[r_] + qa_, hs, sr[r_] + qa_, hb, br[r_] + qa_); \
                        hi_[r_] = byte_weights16(wr[r_] + k_ + 16, kind, j->table, hz, zr[r_] + qb_, hs, sr[r_] + qb_, hb, br[r_] + qb_); \
                    }                                                                                                          \
                }                                                                                                              \
                if (++ca_ == hpg_) ca_ = 0, qa_ = qb_ + 1; else qa_ = qb_;                                                     \
                PAIR(k_, lo_, hi_);                                                                                            \
            }                                                                                                                  \
        }                                                                                                                      \
    } while (0)

/* The same from the VBMI byte planes (k0, k1 multiples of 64; permute_q64's order). */
#define FEW_FORMVB(PAIR)                                                                                                       \
    do {                                                                                                                       \
        Py_ssize_t k_;                                                                                                         \
        int i_, r_;                                                                                                            \
        for (k_ = k0; k_ < k1; k_ += 64) {                                                                                     \
            __m512 v_[4][4], lo_[4], hi_[4];                                                                                   \
            FEW_UNROLL for (r_ = 0; r_ < RW; r_++) {                                                                                      \
                planes64(wr[r_] + k_, pl, v_[r_]);                                                                             \
                if (hz) { const __m512 p_ = pvec(zr[r_], k_, g); FEW_UNROLL for (i_ = 0; i_ < 4; i_++) v_[r_][i_] = _mm512_sub_ps(v_[r_][i_], p_); } \
                if (hs) { const __m512 p_ = pvec(sr[r_], k_, g); FEW_UNROLL for (i_ = 0; i_ < 4; i_++) v_[r_][i_] = _mm512_mul_ps(v_[r_][i_], p_); } \
                if (hb) { const __m512 p_ = pvec(br[r_], k_, g); FEW_UNROLL for (i_ = 0; i_ < 4; i_++) v_[r_][i_] = _mm512_add_ps(v_[r_][i_], p_); } \
                lo_[r_] = v_[r_][0], hi_[r_] = v_[r_][1];                                                                      \
            }                                                                                                                  \
            PAIR(k_, lo_, hi_);                                                                                                \
            FEW_UNROLL for (r_ = 0; r_ < RW; r_++) lo_[r_] = v_[r_][2], hi_[r_] = v_[r_][3];                                              \
            PAIR(k_ + 32, lo_, hi_);                                                                                           \
        }                                                                                                                      \
    } while (0)

/* binary32 x (x + m K: row m, in the weights' order): each x load serves the RW weight rows */
#define FEW_PAIR_F32(k, lo, hi)                                                                       \
    do {                                                                                              \
        int m_, s_;                                                                                   \
        FEW_UNROLL for (m_ = 0; m_ < NM; m_++) {                                                                 \
            const __m512 xl_ = _mm512_loadu_ps(x + m_ * K + (k)), xh_ = _mm512_loadu_ps(x + m_ * K + (k) + 16); \
            FEW_UNROLL for (s_ = 0; s_ < RW; s_++) a[s_][m_] = _mm512_fmadd_ps(hi[s_], xh_, _mm512_fmadd_ps(lo[s_], xl_, a[s_][m_])); \
        }                                                                                             \
    } while (0)
/* bfloat16 x (x_bf16's layout): the 32 weights of each row rounded to bfloat16, one vdpbf16ps per
 * (weight row, row of x) */
#define FEW_PAIR_BF(k, lo, hi)                                                                        \
    do {                                                                                              \
        __m512bh p_[4];                                                                               \
        int m_, s_;                                                                                   \
        FEW_UNROLL for (s_ = 0; s_ < RW; s_++) p_[s_] = _mm512_cvtne2ps_pbh(hi[s_], lo[s_]);                     \
        FEW_UNROLL for (m_ = 0; m_ < NM; m_++) {                                                                 \
            const __m512bh xv_ = (__m512bh)_mm512_loadu_si512(x + m_ * K + (k));                      \
            FEW_UNROLL for (s_ = 0; s_ < RW; s_++) a[s_][m_] = _mm512_dpbf16_ps(a[s_][m_], xv_, p_[s_]);        \
        }                                                                                             \
    } while (0)

/* The kernel's body: FEW_R weight rows at a time, x in chunks of kc columns, RW weight rows in
 * lockstep (rows past the share repeat its last row; their sums are not stored). */
#define FEW_KERNEL(NAME, TARGET, XT, FORM, PAIR, SETUP)                                                                       \
    TARGET static inline __attribute__((always_inline)) void NAME##_body(const mm_job *j, const XT *x, const int kind, const int NM, \
                                                                         const int RW) {                                       \
        const Py_ssize_t K = j->K, G = K / j->g, g = j->g, N = j->N;                                                           \
        const int hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL;                                                     \
        const Py_ssize_t rowbytes = kind == K_NIB4 ? K / 2 : K, kc = few_chunk(K, NM, (int)sizeof(XT));                       \
        __m512 acc[FEW_R][FEWMAX];                                                                                             \
        Py_ssize_t nb, k0, k1, r, o;                                                                                           \
        int m, s;                                                                                                              \
        SETUP;                                                                                                                 \
        for (nb = j->n0; nb < j->n1; nb += FEW_R) {                                                                            \
            const Py_ssize_t nr = j->n1 - nb < FEW_R ? j->n1 - nb : FEW_R;                                                     \
            for (k0 = 0; k0 < K; k0 += kc) {                                                                                   \
                k1 = k0 + kc < K ? k0 + kc : K;                                                                                \
                for (r = 0; r < nr; r += RW) {                                                                                 \
                    __m512 a[4][FEWMAX];                                                                                       \
                    const uint8_t *wr[4];                                                                                      \
                    const float *zr[4], *sr[4], *br[4];                                                                        \
                    FEW_UNROLL for (s = 0; s < RW; s++) {                                                                                 \
                        const Py_ssize_t n = nb + (r + s < nr ? r + s : nr - 1);                                               \
                        wr[s] = j->w + n * rowbytes;                                                                           \
                        zr[s] = hz ? j->z + n * G : NULL, sr[s] = hs ? j->s + n * G : NULL, br[s] = hb ? j->b + n * G : NULL;  \
                        /* the same chunk of the next block's row, into L2 (rows past n1 not touched) */                       \
                        if (r + s < nr && n + FEW_R < j->n1)                                                                   \
                            for (o = k0 * rowbytes / K; o < k1 * rowbytes / K; o += 64)                                        \
                                __builtin_prefetch(j->w + (n + FEW_R) * rowbytes + o, 0, QF_PF_LOCALITY);                      \
                        FEW_UNROLL for (m = 0; m < NM; m++) a[s][m] = k0 ? acc[r + s][m] : _mm512_setzero_ps();                           \
                    }                                                                                                          \
                    FORM(PAIR);                                                                                                \
                    FEW_UNROLL for (s = 0; s < RW; s++)                                                                                   \
                        FEW_UNROLL for (m = 0; m < NM; m++) acc[r + s][m] = a[s][m];                                                      \
                }                                                                                                              \
            }                                                                                                                  \
            for (r = 0; r < nr; r++)                                                                                           \
                FEW_UNROLL for (m = 0; m < NM; m++) j->y[m * N + nb + r] = _mm512_reduce_add_ps(acc[r][m]);                               \
        }                                                                                                                      \
    }

#define FEW_SETUP512 const __m512 tab = kind == K_NIB4 ? _mm512_loadu_ps(j->table) : _mm512_setzero_ps()
#define FEW_SETUPVB                \
    __m512i pl[8];                 \
    load_planes(j->planes, pl)
FEW_KERNEL(few_f32, TGT512, float, FEW_FORM512, FEW_PAIR_F32, FEW_SETUP512)
FEW_KERNEL(few_f32vb, TGTVB, float, FEW_FORMVB, FEW_PAIR_F32, FEW_SETUPVB)
FEW_KERNEL(few_bf, TGTBF, uint16_t, FEW_FORM512, FEW_PAIR_BF, FEW_SETUP512)
FEW_KERNEL(few_bfvb, TGTVBBF, uint16_t, FEW_FORMVB, FEW_PAIR_BF, FEW_SETUPVB)

/* BODY(j, x, kind, NM, RW) with the rows of x (NM) and the weight rows in lockstep (RW: RW x NM
 * accumulators of at most 16, FEW_R a multiple of RW) as constants.  (NM = 8 with RW = 2 measured
 * 1.0-1.4x torch bfloat16 where rows_bf16 measured 1.3-1.6x: FEWMAX.) */
#define FEW_ROWS(BODY, KIND)                                \
    switch (j->M) {                                         \
    case 2: BODY(j, x, KIND, 2, 4); break;                  \
    case 3: BODY(j, x, KIND, 3, 4); break;                  \
    default: BODY(j, x, KIND, 4, 4); break;                 \
    }
#define FEW_KINDS(BODY)                                     \
    switch (j->kind) {                                      \
    case K_NIB4: FEW_ROWS(BODY, K_NIB4) break;              \
    case K_I8: FEW_ROWS(BODY, K_I8) break;                  \
    case K_U8: FEW_ROWS(BODY, K_U8) break;                  \
    case K_E4M3: FEW_ROWS(BODY, K_E4M3) break;              \
    case K_E5M2: FEW_ROWS(BODY, K_E5M2) break;              \
    default: FEW_ROWS(BODY, K_LUT8) break;                  \
    }
TGT512 static void few_f32(const mm_job *j, const float *x) { FEW_KINDS(few_f32_body); }
TGTVB static void few_f32vb(const mm_job *j, const float *x) { FEW_ROWS(few_f32vb_body, K_LUT8); }
TGTBF static void few_bf(const mm_job *j, const uint16_t *x) { FEW_KINDS(few_bf_body); }
TGTVBBF static void few_bfvb(const mm_job *j, const uint16_t *x) { FEW_ROWS(few_bfvb_body, K_LUT8); }

/* ---- one row of bfloat16 x, 4-bit codes with a scale only (issue 45): the 16 element values as
 * bfloat16 and each group's dot product scaled once ----
 * At one row of x every weight is used once, so forming it is the cost: row1_avx512 spends about 8
 * vector operations per 32 weights (a lookup per 16 binary32 weights, an FMA per 16), twice what
 * streaming the bytes allows.  Where x holds bfloat16 values (the caller's bf16x, checked here for
 * subnormals) and the code's parameters are a scale alone (z and b absent: int4 symmetric, nf4,
 * mxfp4, nvfp4), sum_k W[n,k] x[k] = sum_q s[n,q] sum_{k in q} t[c_k] x[k]: the 16 table values are
 * rounded to bfloat16 once per call (round to nearest even, as every bf16 path rounds a weight),
 * 64 codes become 64 bfloat16 values by two vpermw lookups (16-bit lanes; the table is repeated in
 * entries 16-31 so that the low nibble needs no mask), vdpbf16ps sums their exact products with x
 * in binary32, and the group's scale multiplies that sum (one FMA per 64 columns, or per group
 * where g is a multiple of 64).  About 9 operations per 64 weights.
 * Error: the kernel's weight is bf16(t) s exactly, within 2^-9 + 2^-24 of qformat's binary32 weight
 * fl(t s) relative: the one rounding to bfloat16 that error_bound allows a bf16 kernel (u |x||W|);
 * the binary32 sums are a group's sum, one multiplication and the sum over groups: at most
 * g + G + 2 <= K + 2 roundings deep (the gamma_k term); vdpbf16ps flushes a subnormal partial sum
 * (the absolute term) and would take a subnormal input as zero: x is checked, and every nonzero
 * table value must be a normal bfloat16 (checked per call, else the binary32 path runs). */

/* x (K % 64 == 0): per 64 columns k.., the 32 columns k + 2i, then k + 2i + 1 (the order of a
 * last 64 columns in row1_bfs and of every 64 in row1_bfs6). */
static void permute_eo64(const float *x, Py_ssize_t K, float *xo) {
    Py_ssize_t k;
    int i;
    for (k = 0; k < K; k += 64)
        for (i = 0; i < 32; i++) xo[k + i] = x[k + 2 * i], xo[k + 32 + i] = x[k + 2 * i + 1];
}

/* x (K % 64 == 0) in row1_bfs's order: per 128 columns k.., the 32 columns k + 4i, then k + 4i + 1,
 * k + 4i + 2, k + 4i + 3 (i < 32); a last 64 columns in permute_eo64's order. */
static void permute_bf1(const float *x, Py_ssize_t K, float *xo) {
    const Py_ssize_t K128 = K / 128 * 128;
    Py_ssize_t k;
    int r, i;
    for (k = 0; k < K128; k += 128)
        for (r = 0; r < 4; r++)
            for (i = 0; i < 32; i++) xo[k + 32 * r + i] = x[k + 4 * i + r];
    if (K128 < K) permute_eo64(x + K128, 64, xo + K128);
}

/* The first n table values (a multiple of 16) as bfloat16 bits, where every one is zero or a
 * finite normal binary32 value that rounds to a finite bfloat16 (else 0: vcvtneps2bf16 and
 * vdpbf16ps would take a subnormal as zero; rounding a normal value cannot give a subnormal). */
TGTBF static int table_bf16(const float *table, int n, uint16_t *tb) {
    int i;
    for (i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, table + i, 4);
        if ((u & 0x7FFFFFFF) && ((u & 0x7F800000) == 0 || (u & 0x7F800000) == 0x7F800000)) return 0;
    }
    for (i = 0; i < n; i += 16) _mm256_storeu_si256((__m256i *)(tb + i), bf16_of(_mm512_loadu_ps(table + i)));
    for (i = 0; i < n; i++)
        if (((tb[i] >> 7) & 0xFF) == 0xFF) return 0; /* rounded up to infinity */
    return 1;
}

/* The scale of each binary32 lane of a sum whose lanes hold cpl consecutive columns from k (8 for
 * a 128-column step, 4 for a 64-column one): each group's scale over its g / cpl lanes (the group
 * indices by constant divisors in the common cases), 1 without a scale. */
TGTBF static inline __attribute__((always_inline)) __m512 bf_scale(const float *sr, Py_ssize_t k, Py_ssize_t g, const int cpl) {
    if (!sr) return _mm512_set1_ps(1.0f);
    if (g == 2 * cpl)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7),
                                     _mm512_castps256_ps512(_mm256_loadu_ps(sr + k / (2 * cpl))));
    if (g == 4 * cpl)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                                     _mm512_castps128_ps512(_mm_loadu_ps(sr + k / (4 * cpl))));
    if (g == 8 * cpl)
        return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                     _mm512_castpd_ps(_mm512_castpd128_pd512(_mm_load_sd((const double *)(sr + k / (8 * cpl))))));
    return _mm512_set1_ps(sr[k / g]);
}

/* 128 weights of 4-bit codes (one 64-byte load at p) as bfloat16 table values: l[r]'s 16-bit lane i
 * is column 4i + r.  vpermw looks up bits 0-4 of each lane (the table is repeated in entries 16-31,
 * so bit 4 does not matter), and the lane shifted right by 4, 8 and 12 gives the other three
 * codes: no widening step. */
TGTBF static inline __attribute__((always_inline)) void look128(const uint8_t *p, const __m512i tab, __m512i l[4]) {
    const __m512i c = _mm512_loadu_si512((const void *)p);
    l[0] = _mm512_permutexvar_epi16(c, tab);
    l[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 4), tab);
    l[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 8), tab);
    l[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(c, 12), tab);
}

/* Four sums a0..a3 taken in turn by successive steps, a0 <- t (which reads a0), then rotated so
 * that consecutive steps are independent. */
#define ROT4(t)                                          \
    do {                                                 \
        const __m512 t_ = (t);                           \
        a0 = a1, a1 = a2, a2 = a3, a3 = t_;              \
    } while (0)

/* One row of x: y[n] for n in [n0, n1), 128 columns per look128; the sum's binary32 lane L holds
 * columns k + 8L .. k + 8L + 7 (k + 4L .. k + 4L + 3 in a last 64 columns). */
TGTBF static void row1_bfs(const mm_job *j, const uint16_t *xb, const uint16_t *tb) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g, K128 = K / 128 * 128, ahead = pf_rows(K / 2);
    const __m512i tab = _mm512_loadu_si512((const void *)tb);
    Py_ssize_t n, k, q;
    for (n = j->n0; n < j->n1; n++) {
        const uint8_t *wr = j->w + n * (K / 2);
        const float *sr = j->s ? j->s + n * G : NULL;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, d;
        prefetch_row(j, n + ahead, K / 2);
#define DOT128(d, k)                                                                                       \
    do {                                                                                                   \
        __m512i l_[4];                                                                                     \
        int r_;                                                                                            \
        look128(wr + (k) / 2, tab, l_);                                                                    \
        for (r_ = 0; r_ < 4; r_++)                                                                         \
            d = _mm512_dpbf16_ps(d, (__m512bh)l_[r_], (__m512bh)_mm512_loadu_si512((const void *)(xb + (k) + 32 * r_))); \
    } while (0)
        if (g % 128 == 0) {
            for (q = 0; q < G; q++) {
                d = _mm512_setzero_ps();
                for (k = q * g; k < (q + 1) * g; k += 128) DOT128(d, k);
                ROT4(sr ? _mm512_fmadd_ps(d, _mm512_set1_ps(sr[q]), a0) : _mm512_add_ps(d, a0));
            }
        } else {
            for (k = 0; k < K128; k += 128) {
                d = _mm512_setzero_ps();
                DOT128(d, k);
                ROT4(_mm512_fmadd_ps(d, bf_scale(sr, k, g, 8), a0));
            }
            if (K128 < K) { /* the last 64 columns: lane i of lo / hi is column k + 2i / k + 2i + 1 */
                const __m512i c_ = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(wr + K128 / 2)));
                d = _mm512_dpbf16_ps(_mm512_setzero_ps(), (__m512bh)_mm512_permutexvar_epi16(c_, tab), (__m512bh)_mm512_loadu_si512((const void *)(xb + K128)));
                d = _mm512_dpbf16_ps(d, (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(c_, 4), tab), (__m512bh)_mm512_loadu_si512((const void *)(xb + K128 + 32)));
                ROT4(_mm512_fmadd_ps(d, bf_scale(sr, K128, g, 4), a0));
            }
        }
#undef DOT128
        j->y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

/* ---- 2 to BFS_MAX rows of bfloat16 x, the same weights (issue 45): each 128 columns of a weight
 * row looked up once and multiplied into every row of x ----
 * few_bf forms 32 binary32 weights per row (a folded table per group, two lookups, a widening and
 * a rounding to bfloat16: 5 operations) before one vdpbf16ps per row of x; here 128 weights take
 * 8 (row1_bfs's load, shifts and lookups) and each row of x adds one FMA per 128 columns for the
 * scale: the operations per weight fall from 5 / 32 + M / 32 to about 10 / 128 + 5 M / 128, and
 * at 8 rows, where few_bf was slower than rows_bf16, the dot products set the pace.  x in chunks
 * of kc columns (all rows in BFS_XBYTES, in L1), the partial sums of FEW_R weight rows kept between
 * chunks, RW weight rows in lockstep; the same weights and the same error terms as row1_bfs. */
#define BFS_MAX 8
#define BFS_XBYTES 16384
/* x's row stride in few_bfs (bfloat16 values): K plus 64, so that the rows of a chunk do not fall on
 * the same L1 sets (K a multiple of 2048 puts 8 rows 4 KB apart in address bits 6-11) */
#define BFS_XS(K) ((K) + 64)

/* One pass: RW weight rows' columns [k0, k1) times NM rows of x from m0, the sums acc[r + s][m0 + m]
 * kept in registers for the pass (RW x NM of them, RW x NM dot products in flight, the RW x 4
 * lookups: at most 30 registers). */
#define BFS_PASS(NM, m0)                                                                                                  \
    do {                                                                                                                  \
        __m512 a_[2][4];                                                                                                  \
        int i_, m_, s_;                                                                                                   \
        FEW_UNROLL for (s_ = 0; s_ < RW; s_++)                                                                            \
            FEW_UNROLL for (m_ = 0; m_ < (NM); m_++) a_[s_][m_] = k0 ? acc[r + s_][(m0) + m_] : _mm512_setzero_ps();     \
        for (k = k0; k < k1; k += 128) {                                                                                  \
            __m512i l_[2][4];                                                                                             \
            __m512 sv_[2], d_[2][4];                                                                                      \
            FEW_UNROLL for (s_ = 0; s_ < RW; s_++) {                                                                      \
                look128(wr[s_] + k / 2, tab, l_[s_]);                                                                     \
                sv_[s_] = bf_scale(sr[s_], k, g, 8);                                                                      \
                FEW_UNROLL for (m_ = 0; m_ < (NM); m_++) d_[s_][m_] = _mm512_setzero_ps();                                \
            }                                                                                                             \
            /* the four lookups' dot products taken in turn over every (weight row, row of x): RW NM  \
             * independent sums in flight rather than one chain of four at a time */                                    \
            FEW_UNROLL for (i_ = 0; i_ < 4; i_++)                                                                         \
                FEW_UNROLL for (m_ = 0; m_ < (NM); m_++) {                                                                \
                    const __m512bh xv_ = (__m512bh)_mm512_loadu_si512((const void *)(xb + ((m0) + m_) * XS + k + 32 * i_)); \
                    FEW_UNROLL for (s_ = 0; s_ < RW; s_++) d_[s_][m_] = _mm512_dpbf16_ps(d_[s_][m_], (__m512bh)l_[s_][i_], xv_); \
                }                                                                                                         \
            FEW_UNROLL for (s_ = 0; s_ < RW; s_++)                                                                        \
                FEW_UNROLL for (m_ = 0; m_ < (NM); m_++) a_[s_][m_] = _mm512_fmadd_ps(d_[s_][m_], sv_[s_], a_[s_][m_]);   \
        }                                                                                                                 \
        FEW_UNROLL for (s_ = 0; s_ < RW; s_++)                                                                            \
            FEW_UNROLL for (m_ = 0; m_ < (NM); m_++) acc[r + s_][(m0) + m_] = a_[s_][m_];                                 \
    } while (0)

/* NM rows of x (at most BFS_MAX) as NP passes of 4 and a last of NL (1 to 4), each pass over the
 * chunk with RW = 2 weight rows in lockstep: a pass of all 8 rows would not fit the registers
 * (measured: the sums spilled), one weight row at a time measured 1.4-2x slower (each x load then
 * serves one dot product).  A pass looks the codes up again (8 operations per 128 columns and
 * weight row, against 16-32 dot products), from L1. */
TGTBF static inline __attribute__((always_inline)) void few_bfs_body(const mm_job *j, const uint16_t *xb, const uint16_t *tb, const int NM,
                                                                     const int NL) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g, N = j->N, XS = BFS_XS(K);
    const int RW = 2, NP = (NM - NL) / 4;
    const __m512i tab = _mm512_loadu_si512((const void *)tb);
    Py_ssize_t kc = BFS_XBYTES / (NM * 2) / 128 * 128, nb, k0, k1, k, r, o;
    __m512 acc[FEW_R][BFS_MAX];
    int m, s, p;
    if (kc < 128) kc = 128;
    if (kc > K) kc = K;
    for (nb = j->n0; nb < j->n1; nb += FEW_R) {
        const Py_ssize_t nr = j->n1 - nb < FEW_R ? j->n1 - nb : FEW_R;
        for (k0 = 0; k0 < K; k0 += kc) {
            k1 = k0 + kc < K ? k0 + kc : K;
            for (r = 0; r < nr; r += RW) {
                const uint8_t *wr[2];
                const float *sr[2];
                FEW_UNROLL for (s = 0; s < RW; s++) {
                    const Py_ssize_t n = nb + (r + s < nr ? r + s : nr - 1);
                    wr[s] = j->w + n * (K / 2);
                    sr[s] = j->s ? j->s + n * G : NULL;
                    if (r + s < nr && n + FEW_R < j->n1) /* the same chunk of the next block's row, into L2 */
                        for (o = k0 / 2; o < k1 / 2; o += 64) __builtin_prefetch(j->w + (n + FEW_R) * (K / 2) + o, 0, QF_PF_LOCALITY);
                }
                for (p = 0; p < NP; p++) BFS_PASS(4, 4 * p);
                BFS_PASS(NL, 4 * NP);
            }
        }
        for (r = 0; r < nr; r++)
            for (m = 0; m < NM; m++) j->y[m * N + nb + r] = _mm512_reduce_add_ps(acc[r][m]);
    }
}
#undef BFS_PASS

TGTBF static void few_bfs(const mm_job *j, const uint16_t *xb, const uint16_t *tb) {
    switch (j->M) {
    case 2: few_bfs_body(j, xb, tb, 2, 2); break;
    case 3: few_bfs_body(j, xb, tb, 3, 3); break;
    case 4: few_bfs_body(j, xb, tb, 4, 4); break;
    case 5: few_bfs_body(j, xb, tb, 5, 1); break;
    case 6: few_bfs_body(j, xb, tb, 6, 2); break;
    case 7: few_bfs_body(j, xb, tb, 7, 3); break;
    default: few_bfs_body(j, xb, tb, 8, 4); break;
    }
}

/* ---- one row of bfloat16 x, 6-bit codes in bytes with a scale alone (issue 45: GGUF's Q6_K) ----
 * row1_bfs for codes below 64 (K_LUT6): the first 64 table values as bfloat16 in two registers,
 * 64 bytes of codes read as 32 16-bit lanes and looked up twice by vpermt2w (bits 0-5 of the lane:
 * the even column's code; the lane shifted right by 8: the odd column's), the dot products with
 * x in permute_eo64's order, the group's scale once per 64 columns (or per group).  About 9
 * operations per 64 weights where the byte-plane path takes about 20.  The same weights and
 * error terms as row1_bfs. */

TGTBF static void row1_bfs6(const mm_job *j, const uint16_t *xb, const uint16_t *tb) {
    const Py_ssize_t K = j->K, G = K / j->g, g = j->g, ahead = pf_rows(K);
    const __m512i ta = _mm512_loadu_si512((const void *)tb), tb2 = _mm512_loadu_si512((const void *)(tb + 32));
    Py_ssize_t n, k, q;
    for (n = j->n0; n < j->n1; n++) {
        const uint8_t *wr = j->w + n * K;
        const float *sr = j->s ? j->s + n * G : NULL;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, d;
        prefetch_row(j, n + ahead, K);
        /* lane L of the sum: columns k + 4L .. k + 4L + 3 */
#define DOT6(d, k)                                                                                                     \
    do {                                                                                                               \
        const __m512i c_ = _mm512_loadu_si512((const void *)(wr + (k)));                                               \
        d = _mm512_dpbf16_ps(d, (__m512bh)_mm512_permutex2var_epi16(ta, c_, tb2), (__m512bh)_mm512_loadu_si512((const void *)(xb + (k)))); \
        d = _mm512_dpbf16_ps(d, (__m512bh)_mm512_permutex2var_epi16(ta, _mm512_srli_epi16(c_, 8), tb2), (__m512bh)_mm512_loadu_si512((const void *)(xb + (k) + 32))); \
    } while (0)
        if (g % 64 == 0) {
            for (q = 0; q < G; q++) {
                d = _mm512_setzero_ps();
                for (k = q * g; k < (q + 1) * g; k += 64) DOT6(d, k);
                ROT4(sr ? _mm512_fmadd_ps(d, _mm512_set1_ps(sr[q]), a0) : _mm512_add_ps(d, a0));
            }
        } else {
            for (k = 0; k < K; k += 64) {
                d = _mm512_setzero_ps();
                DOT6(d, k);
                ROT4(_mm512_fmadd_ps(d, bf_scale(sr, k, g, 4), a0));
            }
        }
#undef DOT6
        j->y[n] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

#undef ROT4

#include "_matmul_tiles.h" /* blk_bf, blk_bfvb: many rows of bfloat16 x in column chunks */

static int cpu_bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16");
}

/* ---- AMX (AMX-TILE + AMX-BF16): several rows of bfloat16 activations on the tile unit ----
 * The same products as the bfloat16 dot products above (bfloat16 weights rounded to nearest
 * even, exact products, binary32 sums, subnormal inputs as zero and subnormal results flushed:
 * the same conditions and the same bound), computed by tdpbf16ps: C[16 weight rows][16 rows of
 * x] += A[16 weight rows][32 columns] . B[32 columns as 16 pairs][16 rows of x].  A is 16 formed
 * weight rows as they lie in `wrow` (no transpose); B is x in the tile's pair layout, built once
 * per call and padded with zero rows of x to a multiple of 16 (the padded outputs are not
 * stored).  Forming the weights is then the whole cost: several rows of x cost about what one
 * does.  Linux hands out the tile state only on request (arch_prctl ARCH_REQ_XCOMP_PERM): asked
 * once per process; refused, or on another OS, the AVX-512 paths run. */
#define TGTAMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,avx2,fma,f16c")))

static int g_amx = -1; /* unknown / 0 no / 1 yes; set with the GIL held */

static int amx_usable(void) {
    if (g_amx < 0) {
        g_amx = 0;
        __builtin_cpu_init();
#if defined(__linux__) && defined(SYS_arch_prctl)
        if (__builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("avx512bf16"))
            g_amx = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#endif
    }
    return g_amx;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* x (M x K binary32, bfloat16 values) as tdpbf16ps's B operand: for each 16 rows of x (zero
 * rows past M), K/2 tile rows of 16 pairs: xv[c][p][i][h] = x[16c + i][2p + h] in bfloat16. */
TGTAMX static int x_pairs(const float *x, Py_ssize_t M, Py_ssize_t K, uint16_t *xv) {
    const Py_ssize_t chunks = (M + 15) / 16;
    Py_ssize_t p, i;
    __mmask16 sub = 0;
    memset(xv, 0, (size_t)chunks * 16 * (size_t)K * sizeof(uint16_t));
    for (i = 0; i < M; i++) {
        const float *xr = x + i * K;
        uint16_t *dst = xv + (i / 16) * 16 * K + (i % 16) * 2;
        for (p = 0; p < K; p += 16) {
            const __m512 v = _mm512_loadu_ps(xr + p);
            uint16_t b[16];
            int h;
            sub |= subnormal16(v);
            _mm256_storeu_si256((__m256i *)b, bf16_of(v));
            for (h = 0; h < 16; h += 2) { /* columns p + h, p + h + 1: one pair, tile row (p + h) / 2 */
                uint16_t *d = dst + ((p + h) / 2) * 32;
                d[0] = b[h];
                d[1] = b[h + 1];
            }
        }
    }
    return sub == 0;
}

/* The tail of a share that is not 16 rows: binary32 FMAs on the bfloat16-rounded weights and x,
 * the same products. */
TGTAMX static void tail_bf16(const mm_job *j, Py_ssize_t n, const uint16_t *xv, uint16_t *w) {
    const Py_ssize_t K = j->K, M = j->M, N = j->N;
    Py_ssize_t m, k;
    form_row_bf16(j, n, w);
    for (m = 0; m < M; m++) {
        const uint16_t *xc = xv + (m / 16) * 16 * K + (m % 16) * 2;
        float acc = 0.0f;
        for (k = 0; k < K; k += 2) {
            uint32_t a0 = (uint32_t)w[k] << 16, a1 = (uint32_t)w[k + 1] << 16, b0 = (uint32_t)xc[k / 2 * 32] << 16,
                     b1 = (uint32_t)xc[k / 2 * 32 + 1] << 16;
            float fa0, fa1, fb0, fb1;
            memcpy(&fa0, &a0, 4), memcpy(&fa1, &a1, 4), memcpy(&fb0, &b0, 4), memcpy(&fb1, &b1, 4);
            acc += fa1 * fb1; /* exact products, one rounding per addition (contraction is off) */
            acc += fa0 * fb0;
        }
        j->y[m * N + n] = acc;
    }
}

TGTAMX static void rows_amx(const mm_job *j, const uint16_t *xv, uint16_t *wrow) {
    const Py_ssize_t K = j->K, M = j->M, N = j->N, chunks = (M + 15) / 16;
    const Py_ssize_t rowbytes = j->kind == K_NIB4 ? K / 2 : K;
    tile_config cfg;
    float c[16][16];
    Py_ssize_t n, k, ch, r, i;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (i = 0; i < 3; i++) cfg.rows[i] = 16, cfg.colsb[i] = 64;
    _tile_loadconfig(&cfg);
    for (n = j->n0; n + 15 < j->n1; n += 16) {
        for (r = 0; r < 16; r++) {
            prefetch_row(j, n + 16 + r, rowbytes);
            form_row_bf16(j, n + r, wrow + r * K);
        }
        for (ch = 0; ch < chunks; ch++) {
            const uint16_t *xc = xv + ch * 16 * K;
            _tile_zero(0);
            for (k = 0; k < K; k += 32) {
                _tile_loadd(1, wrow + k, K * 2);
                _tile_loadd(2, xc + k * 16, 64);
                _tile_dpbf16ps(0, 1, 2);
            }
            _tile_stored(0, c, 64);
            for (i = 0; i < 16 && ch * 16 + i < M; i++)
                for (r = 0; r < 16; r++) j->y[(ch * 16 + i) * N + n + r] = c[r][i];
        }
    }
    _tile_release();
    for (; n < j->n1; n++) tail_bf16(j, n, xv, wrow);
}

static int cpu_level(void) {
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c"))) return LVL_GENERIC;
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512dq")
               ? LVL_AVX512
               : LVL_AVX2;
}
#else
static int cpu_level(void) { return LVL_GENERIC; }
static int cpu_bf16(void) { return 0; }
static int amx_usable(void) { return 0; }
#endif

static PyObject *bad(const char *msg) {
    PyErr_SetString(PyExc_ValueError, msg);
    return NULL;
}

/* ---- the thread pool: one call's column shares on persistent native threads ----
 * Python's ThreadPoolExecutor took about 80 us per round trip here (a condition variable each
 * way), more than a whole matmul of a 1024 x 1024 layer at one row of x: the second thread made
 * small layers slower.  These workers spin for up to SPIN_NS after their last share (a call
 * comes every few tens of microseconds while a model runs) and then sleep on a condition
 * variable; the caller takes share 0 itself and spins until the others are done.  One call at a
 * time: a second Python thread calling meanwhile runs its shares on its own thread.  After a
 * fork the child starts with no workers (pthread_atfork). */
#define MAXT 64
#ifndef SPIN_NS
#define SPIN_NS 100000L
#endif

typedef struct {
    mm_job base; /* n0, n1: the whole range of the call */
    const float *xp;
    const uint16_t *xb;
    const uint16_t *tb; /* row1_bfs's 32-entry (row1_bfs6: 64-entry) bfloat16 table, or NULL */
    char *scratch; /* wsz bytes per share */
    size_t wsz;
    int usebf, use512, use_row1, use_rows, use_few, use_bf1, use_bf6, nt, gomp;
    Py_ssize_t step;
} mm_call;
static int g_gomp_off = 0; /* the OpenMP route switched off (py_threading), with the GIL held */

static void run_share(const mm_call *c, int i) {
    mm_job j = c->base;
    float *wrow = c->scratch ? (float *)(c->scratch + (size_t)i * c->wsz) : NULL;
    j.n0 = c->base.n0 + (Py_ssize_t)i * c->step;
    j.n1 = j.n0 + c->step < c->base.n1 ? j.n0 + c->step : c->base.n1;
    if (j.n0 >= j.n1) return;
#if QF_X86
    if (c->use_bf6)
        row1_bfs6(&j, c->xb, c->tb);
    else if (c->use_bf1 && j.M == 1)
        row1_bfs(&j, c->xb, c->tb);
    else if (c->use_bf1)
        few_bfs(&j, c->xb, c->tb);
    else if (c->use_few && c->usebf && j.planes)
        few_bfvb(&j, c->xb);
    else if (c->use_few && c->usebf)
        few_bf(&j, c->xb);
    else if (c->use_few && j.planes)
        few_f32vb(&j, c->xp);
    else if (c->use_few)
        few_f32(&j, c->xp ? c->xp : j.x);
    else if (c->usebf == 2)
        rows_amx(&j, c->xb, (uint16_t *)wrow);
    else if (c->usebf && (size_t)j.M * (size_t)j.K * 2 > BLK_MIN_XBYTES && j.planes)
        blk_bfvb(&j, c->xb);
    else if (c->usebf && (size_t)j.M * (size_t)j.K * 2 > BLK_MIN_XBYTES)
        blk_bf(&j, c->xb);
    else if (c->usebf)
        rows_bf16(&j, c->xb, (uint16_t *)wrow);
    else if (c->use512 && c->use_row1 && j.planes)
        row1_vb(&j, c->xp);
    else if (c->use512 && c->use_row1)
        row1_avx512(&j, c->xp);
    else if (c->use512)
        rows_avx512(&j, c->xp ? c->xp : j.x, wrow);
    else if (c->use_row1)
        row1_avx2(&j, c->xp);
    else if (c->use_rows)
        rows_avx2(&j, wrow);
    else
#endif
        rows_generic(&j);
}

#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#define QF_POOL 1

#if QF_X86
#define QF_RELAX() __builtin_ia32_pause()
#else
#define QF_RELAX() ((void)0)
#endif

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;   /* held by the call using the pool */
static pthread_mutex_t wake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake_cv = PTHREAD_COND_INITIALIZER;
static int pool_n = 0;                  /* workers started (with pool_mu held) */
static atomic_uint pool_gen;            /* bumped once per call: the workers' signal */
static atomic_int pool_left;            /* workers that have not yet acknowledged this call */
static atomic_int pool_sleepers;
static const mm_call *pool_call;        /* written before pool_gen's bump, read after it */
static int pool_want;                   /* workers 0 .. pool_want - 1 take shares 1 .. pool_want */
static unsigned pool_start_gen[MAXT];   /* pool_gen when each worker was started: its first call is the next */

static long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long)t.tv_sec * 1000000000L + t.tv_nsec;
}

static void *worker_main(void *arg) {
    const int idx = (int)(intptr_t)arg;
    unsigned seen = pool_start_gen[idx];
    for (;;) {
        unsigned g;
        long t0 = now_ns(), spins = 0;
        while ((g = atomic_load(&pool_gen)) == seen) {
            QF_RELAX();
            if ((++spins & 255) == 0 && now_ns() - t0 > SPIN_NS) break;
        }
        if (g == seen) { /* sleep until the next call (the caller wakes sleepers under wake_mu) */
            pthread_mutex_lock(&wake_mu);
            atomic_fetch_add(&pool_sleepers, 1);
            while ((g = atomic_load(&pool_gen)) == seen) pthread_cond_wait(&wake_cv, &wake_mu);
            atomic_fetch_sub(&pool_sleepers, 1);
            pthread_mutex_unlock(&wake_mu);
        }
        seen = g;
        if (idx < pool_want) run_share(pool_call, idx + 1);
        /* every worker acknowledges every call, taking part or not: so none still reads this
         * call's pool_call / pool_want when the next call writes them */
        atomic_fetch_sub(&pool_left, 1);
    }
    return NULL;
}

static void pool_after_fork(void) { /* the child has none of the parent's threads */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER, w = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool_mu = m, wake_mu = w, wake_cv = cv;
    pool_n = 0;
    atomic_store(&pool_sleepers, 0);
    atomic_store(&pool_left, 0);
}

/* The process's GNU OpenMP runtime, where one is already loaded (torch's CPU build brings its
 * own): its threads are the ones that run torch's operators and spin between them, so a second
 * set of threads (the pool above) fought them for the cores -- on 2 cores, an nf4 Llama ran at
 * 17 tokens/s with the pool against 27 on one thread and 31 with OMP_WAIT_POLICY=PASSIVE.
 * The kernel's shares then run as one OpenMP parallel region on those threads (libgomp's
 * GOMP_parallel, its stable entry point for `#pragma omp parallel`), found by dlsym in the
 * already-loaded library; nothing is loaded that was not. */
#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
typedef void (*gomp_parallel_t)(void (*)(void *), void *, unsigned, unsigned);
typedef int (*omp_int_t)(void);
static gomp_parallel_t g_gomp_parallel;
static omp_int_t g_omp_thread_num, g_omp_num_threads;
static int g_gomp = -1; /* unknown / 0 none loaded / 1 found; set with the GIL held */

static unsigned long long g_adds_seen = ~0ULL; /* the loader's count of loads at the last look */

static int find_gomp(struct dl_phdr_info *info, size_t size, void *data) {
    int *st = (int *)data; /* [0]: found, [1]: first object seen */
    if (st[1]) { /* the first object: nothing loaded since the last look, nothing to look for */
        st[1] = 0;
        if (size >= offsetof(struct dl_phdr_info, dlpi_adds) + sizeof info->dlpi_adds) {
            if (info->dlpi_adds == g_adds_seen) return 1;
            g_adds_seen = info->dlpi_adds;
        }
    }
    if (info->dlpi_name && strstr(info->dlpi_name, "libgomp")) {
        void *h = dlopen(info->dlpi_name, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            g_gomp_parallel = (gomp_parallel_t)dlsym(h, "GOMP_parallel");
            g_omp_thread_num = (omp_int_t)dlsym(h, "omp_get_thread_num");
            g_omp_num_threads = (omp_int_t)dlsym(h, "omp_get_num_threads");
            st[0] = g_gomp_parallel && g_omp_thread_num && g_omp_num_threads;
            dlclose(h); /* RTLD_NOLOAD: the library stays loaded by whoever loaded it */
            return st[0];
        }
    }
    return 0;
}

static int gomp_usable(void) {
    if (g_gomp != 1) { /* looked for again until found: torch may be imported after this module */
        int st[2] = {0, 1};
        dl_iterate_phdr(find_gomp, st);
        g_gomp = st[0];
    }
    return g_gomp == 1 && !g_gomp_off;
}

static void gomp_body(void *arg) {
    const mm_call *c = (const mm_call *)arg;
    const int team = g_omp_num_threads();
    int i;
    for (i = g_omp_thread_num(); i < c->nt; i += team) run_share(c, i);
}
#else
static int gomp_usable(void) { return 0; }
#endif

/* Runs the call's nt shares: as an OpenMP region where the process has libgomp loaded, else on
 * the workers where the pool is free, else all on this thread. */
static void pool_run(const mm_call *c) {
    int i, want = c->nt - 1;
#if defined(__linux__)
    if (want > 0 && c->gomp) {
        g_gomp_parallel(gomp_body, (void *)c, (unsigned)c->nt, 0);
        return;
    }
#endif
    if (want == 0 || pthread_mutex_trylock(&pool_mu) != 0) {
        for (i = 0; i < c->nt; i++) run_share(c, i);
        return;
    }
    while (pool_n < want) { /* start workers as needed; if that fails, this thread does the rest */
        pthread_t th;
        pthread_attr_t at;
        int ok;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pool_start_gen[pool_n] = atomic_load(&pool_gen);
        ok = pthread_create(&th, &at, worker_main, (void *)(intptr_t)pool_n) == 0;
        pthread_attr_destroy(&at);
        if (!ok) break;
        pool_n++;
    }
    if (want > pool_n) want = pool_n;
    pool_call = c;
    pool_want = want;
    atomic_store(&pool_left, pool_n);
    atomic_fetch_add(&pool_gen, 1);
    if (atomic_load(&pool_sleepers) > 0) {
        pthread_mutex_lock(&wake_mu);
        pthread_cond_broadcast(&wake_cv);
        pthread_mutex_unlock(&wake_mu);
    }
    run_share(c, 0);
    for (i = want + 1; i < c->nt; i++) run_share(c, i);
    while (atomic_load(&pool_left) > 0) QF_RELAX();
    pthread_mutex_unlock(&pool_mu);
}
#else
#define QF_POOL 0
static int gomp_usable(void) { return 0; }
static void pool_run(const mm_call *c) { /* no pthreads: every share on this thread */
    int i;
    for (i = 0; i < c->nt; i++) run_share(c, i);
}
#endif

/* matmul(x, M, K, w, N, kind, table, g, z, s, b, y, n0, n1, level[, bf16x[, threads]])
 * x: binary32 [M, K]; w: codes; table: 16 (NIB4) or 256 binary32 values; z, s, b: binary32
 * [N, K/g] or None; y: binary32 [M, N], columns [n0, n1) written; level 0 scalar, 1 AVX2,
 * 2 AVX-512; bf16x: 1 where x holds bfloat16 values and every nonzero weight is proved within
 * bfloat16's normal range (the AVX512_BF16 path may then run for M > 1), else 0; threads: the
 * columns [n0, n1) are split over this many threads of the pool (shares of whole 16 columns, at
 * least 64 columns each). */
static PyObject *py_matmul(PyObject *self, PyObject *args) {
    Py_buffer bx = {0}, bw = {0}, bt = {0}, by = {0}, bp[3];
    PyObject *po[3];
    Py_ssize_t M, K, N, g, n0, n1;
    int kind, lut6, level, i, np_ = 0, use_row1, use_rows, use512, use_few, bf16x = 0, usebf = 0, threads = 1;
    mm_call call;
    float *xp = NULL, *wrow = NULL;
    uint16_t *xb = NULL;
    uint16_t tb[64];
    uint8_t planes[512];
    mm_job j;
    (void)self;
    memset(bp, 0, sizeof bp);
    if (!PyArg_ParseTuple(args, "y*nny*niy*nOOOw*nni|ii", &bx, &M, &K, &bw, &N, &kind, &bt, &g, &po[0], &po[1], &po[2], &by, &n0, &n1,
                          &level, &bf16x, &threads))
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
        PyMem_RawFree(xb);                                 \
        return msg ? bad(msg) : NULL;                      \
    } while (0)
    if (M < 1 || M > 1024 || K < 1 || N < 1 || g < 8 || g > MAXG || g % 8 || K % g) FAIL("bad sizes (g must be a multiple of 8 up to 4096 dividing K)");
    if (kind < K_NIB4 || kind > K_LUT6) FAIL("bad code kind");
    lut6 = kind == K_LUT6;
    if (lut6) kind = K_LUT8; /* the same table and paths; row1_bfs6 below may take it */
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
    /* AVX-512 where the shapes allow (16 columns per step; 4-bit codes: 32 columns in one or
     * two groups), else AVX2 */
    use512 = level == LVL_AVX512 && g % 16 == 0 && (kind != K_NIB4 || K % 32 == 0);
    if (level == LVL_AVX512 && !use512) level = LVL_AVX2;
    use_row1 = level >= LVL_AVX2 && M == 1 && (kind != K_NIB4 || (g % 16 == 0 && K % 32 == 0));
    use_rows = level >= LVL_AVX2 && !use_row1;
    /* 2 to FEWMAX rows of x at the AVX-512 level: each weight formed once for all rows (few_f32 / few_bf) */
    use_few = use512 && M >= 2 && M <= FEWMAX && K % 32 == 0 && !g_few_off;
    /* shares: whole 16 columns (cache lines of y), at least 64 columns each */
    if (threads < 1) threads = 1;
    if (threads > MAXT) threads = MAXT;
    if (threads > (n1 - n0) / 64) threads = (n1 - n0) / 64 > 0 ? (int)((n1 - n0) / 64) : 1;
    memset(&call, 0, sizeof call);
    call.step = ((n1 - n0 + threads - 1) / threads + 15) / 16 * 16;
    call.nt = call.step > 0 ? (int)((n1 - n0 + call.step - 1) / call.step) : 1;
    if (call.nt < 1) call.nt = 1;
    /* per share: 16 bfloat16 weight rows (AMX) or 4 binary32 ones, whichever is larger, rounded to
     * a cache line */
    call.wsz = use_rows && !use_few ? ((size_t)K * 32 + 63) / 64 * 64 : 0;
    if (call.wsz) {
        wrow = (float *)PyMem_RawMalloc(call.wsz * (size_t)call.nt + 64);
        if (!wrow) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
    }
#if QF_X86
    /* byte codes whose 256 values are all bfloat16 values: the VBMI planes (see planes64) */
    if (use512 && (kind == K_E4M3 || kind == K_E5M2 || kind == K_LUT8) && K % 64 == 0 && (g == 16 || g == 32 || g % 64 == 0) &&
        !g_planes_off && cpu_vbmi() && bf16_planes(j.table, planes))
        j.planes = planes;
#endif
#if QF_X86
    /* the bfloat16-table paths, a scale alone: 1 to BFS_MAX rows of 4-bit codes (row1_bfs / few_bfs;
     * several rows in whole 128-column steps) or one row of codes below 64 (row1_bfs6); the table
     * and x checked */
    if (use512 && bf16x && !j.z && !j.b && (g == 16 || g == 32 || g % 64 == 0) && !g_bf1_off && cpu_bf16() &&
        (kind == K_NIB4 ? (M == 1 ? K % 64 == 0 : M <= BFS_MAX && K % 128 == 0) && table_bf16(j.table, 16, tb)
                        : lut6 && M == 1 && K % 64 == 0 && table_bf16(j.table, 64, tb))) {
        const Py_ssize_t xs = M == 1 ? K : BFS_XS(K); /* few_bfs's row stride */
        if (!lut6) memcpy(tb + 16, tb, 32); /* the 16 values twice: vpermw reads bits 0-4 */
        xp = (float *)PyMem_RawMalloc((size_t)xs * (size_t)M * sizeof(float));
        xb = (uint16_t *)PyMem_RawMalloc((size_t)xs * (size_t)M * sizeof(uint16_t));
        if (!xp || !xb) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
        memset(xp, 0, (size_t)xs * (size_t)M * sizeof(float)); /* the pads: converted, never read */
        for (i = 0; i < M; i++) (lut6 ? permute_eo64 : permute_bf1)(j.x + i * K, K, xp + i * xs);
        call.use_bf1 = x_bf16(xp, M * xs, xb);
        PyMem_RawFree(xp);
        xp = NULL;
        if (!call.use_bf1) {
            PyMem_RawFree(xb);
            xb = NULL;
        } else { /* no formed weight rows to keep; not the byte planes' x order */
            call.use_bf6 = lut6;
            j.planes = NULL;
            PyMem_RawFree(wrow);
            wrow = NULL;
            call.wsz = 0;
        }
    }
#endif
    if (!call.use_bf1 && (use_row1 || use512) && (kind == K_NIB4 || j.planes)) { /* x in the order the weights are formed */
        const Py_ssize_t rows = use512 ? M : 1;
        xp = (float *)PyMem_RawMalloc((size_t)K * (size_t)rows * sizeof(float));
        if (!xp) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
        for (i = 0; i < rows; i++) {
#if QF_X86
            if (j.planes)
                permute_q64(j.x + i * K, xp + i * K, K);
            else if (use512)
                permute_eo(j.x + i * K, xp + i * K, K);
            else
#endif
                permute32(j.x, xp, K);
        }
    }
    /* bfloat16 dot products: several rows of bfloat16 x (the caller's bf16x: x holds bfloat16
     * values and the weights are proved in bfloat16's normal range), none subnormal */
    if (!call.use_bf1 && use512 && use_rows && bf16x && K % 32 == 0 && cpu_bf16()) {
        const int amx = !use_few && !g_amx_off && amx_usable();
        /* AMX: x in the tile's pair layout, in chunks of 16 rows; else plain bfloat16 rows */
        const size_t xn = amx ? (size_t)((M + 15) / 16) * 16 * (size_t)K : (size_t)M * (size_t)K;
        xb = (uint16_t *)PyMem_RawMalloc(xn * sizeof(uint16_t));
        if (!xb) {
            PyErr_NoMemory();
            FAIL(NULL);
        }
#if QF_X86
        if (amx)
            usebf = x_pairs(xp ? xp : j.x, M, K, xb) ? 2 : 0;
        else
            usebf = x_bf16(xp ? xp : j.x, M * K, xb);
#endif
    }
    call.base = j;
    call.xp = xp;
    call.xb = xb;
    call.tb = call.use_bf1 ? tb : NULL;
    call.scratch = wrow ? (char *)wrow + (64 - (uintptr_t)wrow % 64) % 64 : NULL;
    call.usebf = usebf, call.use512 = use512, call.use_row1 = use_row1, call.use_rows = use_rows, call.use_few = use_few;
    call.gomp = call.nt > 1 && gomp_usable();
    Py_BEGIN_ALLOW_THREADS
    pool_run(&call);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(xp);
    PyMem_RawFree(wrow);
    PyMem_RawFree(xb);
    PyBuffer_Release(&bx);
    PyBuffer_Release(&bw);
    PyBuffer_Release(&bt);
    PyBuffer_Release(&by);
    for (i = 0; i < np_; i++) PyBuffer_Release(&bp[i]);
    Py_RETURN_NONE;
#undef FAIL
}

/* amx(flag): flag 0 switches the AMX path off (the AVX512_BF16 dot products run instead, for
 * tests and benchmarks), 1 back on where usable; returns whether it is on now. */
static PyObject *py_amx(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &flag)) return NULL;
    if (flag == 0) g_amx_off = 1;
    if (flag == 1) g_amx_off = 0;
    return PyBool_FromLong(!g_amx_off && amx_usable());
}

/* threading([openmp]): "openmp" where the shares run on the process's libgomp threads, else
 * "pool" (or "none" without pthreads); openmp=0 switches the OpenMP route off (tests,
 * benchmarks), 1 back on. */
static PyObject *py_threading(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &flag)) return NULL;
    if (flag == 0) g_gomp_off = 1;
    if (flag == 1) g_gomp_off = 0;
    return PyUnicode_FromString(gomp_usable() ? "openmp" : QF_POOL ? "pool" : "none");
}

/* planes([flag]): whether byte codes with bfloat16 values take the AVX512_VBMI byte planes
 * (where this CPU has VBMI); 0 switches them off (tests, benchmarks), 1 back on. */
static PyObject *py_planes(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &flag)) return NULL;
    if (flag == 0) g_planes_off = 1;
    if (flag == 1) g_planes_off = 0;
#if QF_X86
    return PyBool_FromLong(!g_planes_off && cpu_level() == LVL_AVX512 && cpu_vbmi());
#else
    return PyBool_FromLong(0);
#endif
}

/* few([flag]): whether 2 to FEWMAX (4) rows of x take the few-rows path (each weight formed once for all
 * rows) at the AVX-512 level; 0 switches it off (tests, benchmarks: the rows_* paths run), 1 back on. */
static PyObject *py_few(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &flag)) return NULL;
    if (flag == 0) g_few_off = 1;
    if (flag == 1) g_few_off = 0;
    return PyBool_FromLong(!g_few_off && cpu_level() == LVL_AVX512);
}

/* bf1([flag]): whether one row of bfloat16 x with 4-bit codes and a scale alone takes row1_bfs
 * (bfloat16 table, each group's dot product scaled once) where the CPU has AVX512_BF16; 0 switches
 * it off (tests, benchmarks: row1_avx512 runs), 1 back on. */
static PyObject *py_bf1(PyObject *self, PyObject *args) {
    int flag = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "|i", &flag)) return NULL;
    if (flag == 0) g_bf1_off = 1;
    if (flag == 1) g_bf1_off = 0;
#if QF_X86
    return PyBool_FromLong(!g_bf1_off && cpu_level() == LVL_AVX512 && cpu_bf16());
#else
    return PyBool_FromLong(0);
#endif
}

static PyObject *py_cpu_bf16(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyBool_FromLong(cpu_level() == LVL_AVX512 && cpu_bf16());
}

static PyObject *py_cpu_level(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    return PyLong_FromLong(cpu_level());
}

/* defined in the last section of this file (preparing a weight) */
static PyObject *py_unpack_codes(PyObject *self, PyObject *args);
static PyObject *py_weight_span(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"matmul", py_matmul, METH_VARARGS, "x @ W^T with W packed (see the file's header)."},
    {"threading", py_threading, METH_VARARGS, "threading([openmp]): which threads run a call's shares (see the file)."},
    {"planes", py_planes, METH_VARARGS, "planes([flag]): whether the AVX512_VBMI byte planes run; 0 switches them off, 1 back on."},
    {"few", py_few, METH_VARARGS, "few([flag]): whether 2 to 4 rows of x take the few-rows path; 0 switches it off, 1 back on."},
    {"bf1", py_bf1, METH_VARARGS, "bf1([flag]): whether one row of bfloat16 x with 4-bit codes and a scale alone takes the bfloat16-table path; 0 switches it off, 1 back on."},
    {"amx", py_amx, METH_VARARGS, "amx([flag]): whether the AMX path runs; 0 switches it off, 1 back on."},
    {"cpu_bf16", py_cpu_bf16, METH_NOARGS, "Whether the AVX-512 level's bfloat16 dot products (AVX512_BF16) run on this CPU."},
    {"cpu_level", py_cpu_level, METH_NOARGS, "2 where the AVX-512 path runs, 1 where the AVX2+FMA+F16C one, else 0."},
    {"unpack_codes", py_unpack_codes, METH_VARARGS, "unpack_codes(words, stride, rows, length, bits, mode, shifts, out, nib): codes as this kernel reads them."},
    {"weight_span", py_weight_span, METH_VARARGS, "weight_span(values, zero, scale, bias, cells): extremes of the nonzero finite candidate weights."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_matmul", "qformat's native matmul kernel.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__matmul(void) {
#if QF_POOL
    static int registered = 0;
    if (!registered && pthread_atfork(NULL, NULL, pool_after_fork) == 0) registered = 1;
#endif
    return PyModule_Create(&module);
}

/* ==== preparing a weight for this kernel (issue 42 item 6): qformat_torch's LutGrouped.prepare ====
 * Loading a model prepares every layer once; these two steps were most of Gemma 3 270M's first
 * forward when done with torch ops (the codes' unpacking through int64 temporaries, and the
 * candidate-weight scan, each a few dozen small parallel regions per layer).  Both are plain
 * loops here, on one thread with the GIL released; neither touches the matmul code above. */
#include <float.h>
#include <math.h>

/* Bytes b[0..n) of a row as one integer, least (lsb) or most (msb) significant byte first. */
static inline uint64_t load_le(const uint8_t *b, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | b[i];
    return v;
}
static inline uint64_t load_be(const uint8_t *b, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = v << 8 | b[i];
    return v;
}

/* The `len` codes of one row of a bit stream of `bits`-bit codes (SPEC.md 7.2, containers of one
 * byte, codes straddling bytes): code j is bits [j*bits, (j+1)*bits) of the row read as one
 * little-endian (lsb_first) or big-endian (msb_first) number.  Eight codes fill exactly `bits`
 * bytes, so whole groups of eight are read with one load each (`bits` is a constant where the
 * switch below inlines this); a row's last, partial group reads only the bytes its codes need. */
static inline __attribute__((always_inline)) void stream_row(const uint8_t *w, Py_ssize_t len, uint8_t *out, const int bits,
                                                             const int msb) {
    const unsigned mask = (1u << bits) - 1u;
    Py_ssize_t j = 0;
    for (; j + 8 <= len; j += 8, w += bits) {
        const uint64_t v = msb ? load_be(w, bits) : load_le(w, bits);
        for (int i = 0; i < 8; i++) out[j + i] = (uint8_t)((msb ? v >> (8 * bits - (i + 1) * bits) : v >> (i * bits)) & mask);
    }
    if (j < len) { /* the tail: fewer than eight codes, in ceil(rest * bits / 8) bytes */
        const int rest = (int)(len - j), nb = (rest * bits + 7) / 8;
        const uint64_t v = msb ? load_be(w, nb) << (8 * (bits - nb)) : load_le(w, nb);
        for (int i = 0; i < rest; i++) out[j + i] = (uint8_t)((msb ? v >> (8 * bits - (i + 1) * bits) : v >> (i * bits)) & mask);
    }
}

static void stream_rows(const uint8_t *w, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t len, int bits, int msb, uint8_t *out,
                        Py_ssize_t ostride, uint8_t *tmp) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *src = w + r * stride;
        uint8_t *dst = tmp ? tmp : out + r * ostride;
#define QF_ROW(B)                                           \
    case B:                                                 \
        if (msb)                                            \
            stream_row(src, len, dst, B, 1);                \
        else                                                \
            stream_row(src, len, dst, B, 0);                \
        break;
        switch (bits) {
            QF_ROW(1) QF_ROW(2) QF_ROW(3) QF_ROW(4) QF_ROW(5) QF_ROW(6) QF_ROW(7) QF_ROW(8)
        }
#undef QF_ROW
        if (tmp) /* two codes per byte, low nibble first */
            for (Py_ssize_t i = 0; i < len / 2; i++) out[r * ostride + i] = (uint8_t)(tmp[2 * i] | tmp[2 * i + 1] << 4);
    }
}

/* Whole slots (SPEC.md 7.2: codes that do not straddle bytes): code j of a row is in byte j / n,
 * at right shift shifts[j % n] (the slot order folded in by the caller). */
static void slot_rows(const uint8_t *w, Py_ssize_t stride, Py_ssize_t rows, Py_ssize_t len, int bits, const uint8_t *shifts, int n,
                      uint8_t *out, Py_ssize_t ostride, uint8_t *tmp) {
    const unsigned mask = (1u << bits) - 1u;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const uint8_t *src = w + r * stride;
        uint8_t *dst = tmp ? tmp : out + r * ostride;
        for (Py_ssize_t j = 0; j < len; j++) dst[j] = (uint8_t)((src[j / n] >> shifts[j % n]) & mask);
        if (tmp)
            for (Py_ssize_t i = 0; i < len / 2; i++) out[r * ostride + i] = (uint8_t)(tmp[2 * i] | tmp[2 * i + 1] << 4);
    }
}

/* unpack_codes(words, stride, rows, length, bits, mode, shifts, out, nib): the codes of `rows`
 * rows of packed bytes (`stride` bytes apart, the row's codes from its first byte) into `out`:
 * uint8 [rows, length] or, with nib, [rows, length / 2] two codes per byte, low nibble first
 * (length even), the codes this kernel reads.  mode 0: whole slots, len(shifts) codes per byte
 * at those right shifts; 1: a least-significant-first bit stream; 2: a most-significant-first
 * one.  Every size is checked before a byte is read: a row's codes must lie in its stride. */
static PyObject *py_unpack_codes(PyObject *self, PyObject *args) {
    Py_buffer bw = {0}, bs = {0}, bo = {0};
    Py_ssize_t stride, rows, len, need;
    int bits, mode, nib, n;
    uint8_t *tmp = NULL;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*nnniiy*w*p", &bw, &stride, &rows, &len, &bits, &mode, &bs, &bo, &nib)) return NULL;
#define UFAIL(msg)               \
    do {                         \
        PyBuffer_Release(&bw);   \
        PyBuffer_Release(&bs);   \
        PyBuffer_Release(&bo);   \
        return bad(msg);         \
    } while (0)
    n = (int)bs.len;
    if (bits < 1 || bits > 8 || mode < 0 || mode > 2 || rows < 0 || len < 0 || stride < 0) UFAIL("bad sizes");
    if (mode == 0 && (n < 1 || n * bits > 8)) UFAIL("slots: 1 to 8 / bits shifts");
    for (int i = 0; mode == 0 && i < n; i++)
        if (((const uint8_t *)bs.buf)[i] + bits > 8) UFAIL("slots: a shift past the byte");
    if (nib && (bits > 4 || len % 2)) UFAIL("nibbles need codes of at most 4 bits and an even length");
    if (len > PY_SSIZE_T_MAX / 8) UFAIL("sizes overflow");
    need = mode == 0 ? (len + n - 1) / n : (len * bits + 7) / 8;
    if (need > stride) UFAIL("a row's codes do not fit its stride");
    if (rows && (stride > PY_SSIZE_T_MAX / rows || bw.len < (rows - 1) * stride + need)) UFAIL("words too short");
    if (rows && len > PY_SSIZE_T_MAX / rows) UFAIL("sizes overflow");
    if (bo.len < rows * (nib ? len / 2 : len)) UFAIL("out too short");
    if (nib && len && !(tmp = (uint8_t *)PyMem_RawMalloc((size_t)len))) {
        PyBuffer_Release(&bw);
        PyBuffer_Release(&bs);
        PyBuffer_Release(&bo);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    if (mode == 0)
        slot_rows((const uint8_t *)bw.buf, stride, rows, len, bits, (const uint8_t *)bs.buf, n, (uint8_t *)bo.buf, nib ? len / 2 : len, tmp);
    else
        stream_rows((const uint8_t *)bw.buf, stride, rows, len, bits, mode == 2, (uint8_t *)bo.buf, nib ? len / 2 : len, tmp);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(tmp);
    PyBuffer_Release(&bw);
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bo);
    Py_RETURN_NONE;
#undef UFAIL
}

/* The extremes of |w| over the nonzero finite candidates w = ((v - z) * s) + b (each step one
 * binary32 rounding: this file is compiled with -ffp-contract=off; absent parameters skipped) of
 * every value v and every cell's (z, s, b).  The flags are constants where span_cells is inlined,
 * so each combination is its own loop.  The values go 16 at a time (a short block padded with
 * NaN, whose candidates are excluded) into 16 lanes of running extremes, written as selects and
 * lane-wise min/max so that the loop vectorizes; the lanes are combined at the end.  Min and
 * max of the same non-NaN set in any order: the torch scan's extremes. */
static inline __attribute__((always_inline)) void span_cells(const float *v, int nv, const float *z, const float *s, const float *b,
                                                             Py_ssize_t cells, float *plo, float *phi, const int hz, const int hs,
                                                             const int hb) {
    float lo16[16], hi16[16], vb[16];
    for (int i = 0; i < 16; i++) lo16[i] = INFINITY, hi16[i] = 0.0f;
    for (int base = 0; base < nv; base += 16) {
        for (int i = 0; i < 16; i++) vb[i] = base + i < nv ? v[base + i] : NAN;
        for (Py_ssize_t c = 0; c < cells; c++) {
            const float zc = hz ? z[c] : 0.0f, sc = hs ? s[c] : 1.0f, bc = hb ? b[c] : 0.0f;
            for (int i = 0; i < 16; i++) {
                float w = vb[i];
                if (hz) w = w - zc;
                if (hs) w = w * sc;
                if (hb) w = w + bc;
                w = fabsf(w);
                const int ok = w != 0.0f && w <= FLT_MAX; /* nonzero and finite (NaN fails both) */
                const float wl = ok ? w : INFINITY, wh = ok ? w : 0.0f;
                lo16[i] = wl < lo16[i] ? wl : lo16[i];
                hi16[i] = wh > hi16[i] ? wh : hi16[i];
            }
        }
    }
    float lo = *plo, hi = *phi;
    for (int i = 0; i < 16; i++) {
        lo = lo16[i] < lo ? lo16[i] : lo;
        hi = hi16[i] > hi ? hi16[i] : hi;
    }
    *plo = lo, *phi = hi;
}

/* weight_span(values, zero, scale, bias, cells): (smallest, largest) |w| as above, each parameter
 * float32 [cells] or None, values float32 (at most 256); (inf, 0.0) where no candidate is nonzero
 * and finite.  qformat_torch.kernels.LutGrouped._weight_span's scan, bit for bit. */
static PyObject *py_weight_span(PyObject *self, PyObject *args) {
    Py_buffer bv = {0}, bp[3];
    PyObject *po[3];
    const float *p[3] = {NULL, NULL, NULL};
    Py_ssize_t cells;
    int i, nv, got = 0;
    float lo = INFINITY, hi = 0.0f;
    (void)self;
    memset(bp, 0, sizeof bp);
    if (!PyArg_ParseTuple(args, "y*OOOn", &bv, &po[0], &po[1], &po[2], &cells)) return NULL;
#define SFAIL(msg)                                       \
    do {                                                 \
        PyBuffer_Release(&bv);                           \
        for (int k_ = 0; k_ < got; k_++) PyBuffer_Release(&bp[k_]); \
        return msg ? bad(msg) : NULL;                    \
    } while (0)
    nv = (int)(bv.len / 4);
    if (bv.len % 4 || bv.len > 256 * 4 || cells < 0 || cells > PY_SSIZE_T_MAX / 4) SFAIL("values: at most 256 binary32; cells >= 0");
    for (i = 0; i < 3; i++) {
        if (po[i] == Py_None) continue;
        if (PyObject_GetBuffer(po[i], &bp[got], PyBUF_SIMPLE) < 0) SFAIL(NULL);
        got++;
        if (bp[got - 1].len < cells * 4) SFAIL("parameter too short");
        p[i] = (const float *)bp[got - 1].buf;
    }
    {
        const float *v = (const float *)bv.buf, *z = p[0], *s = p[1], *b = p[2];
        Py_BEGIN_ALLOW_THREADS
        switch ((z != NULL) << 2 | (s != NULL) << 1 | (b != NULL)) {
        case 0: span_cells(v, nv, z, s, b, cells, &lo, &hi, 0, 0, 0); break;
        case 1: span_cells(v, nv, z, s, b, cells, &lo, &hi, 0, 0, 1); break;
        case 2: span_cells(v, nv, z, s, b, cells, &lo, &hi, 0, 1, 0); break;
        case 3: span_cells(v, nv, z, s, b, cells, &lo, &hi, 0, 1, 1); break;
        case 4: span_cells(v, nv, z, s, b, cells, &lo, &hi, 1, 0, 0); break;
        case 5: span_cells(v, nv, z, s, b, cells, &lo, &hi, 1, 0, 1); break;
        case 6: span_cells(v, nv, z, s, b, cells, &lo, &hi, 1, 1, 0); break;
        default: span_cells(v, nv, z, s, b, cells, &lo, &hi, 1, 1, 1); break;
        }
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&bv);
    for (i = 0; i < got; i++) PyBuffer_Release(&bp[i]);
    return Py_BuildValue("(dd)", (double)lo, (double)hi);
#undef SFAIL
}
