/* qformat's native matmul (_matmul.c), included there: the tiled path for many rows of bfloat16 x.
 * Not a standalone header: it uses _matmul.c's job type, targets and the few-rows forming macros
 * defined before its #include. */

/* ---- many rows of bfloat16 x (more than BLK_MIN_XBYTES of x): rows_bf16 in chunks of BLK_KC columns ----
 * rows_bf16 forms 4 whole weight rows and then streams all of x (M K bfloat16 values: 14.7 MB at
 * 512 rows of a 14336-column layer) past them, from L3 or memory, once per 4 weight rows: at 512
 * rows that measured 2.6x torch's bfloat16 matmul on 4096 x 14336 against 1.25x on 14336 x 4096
 * (issue 45).  Here the columns go in chunks of BLK_KC: 4 weight rows' chunk formed (FEW_FORM512's
 * steps, rounded to bfloat16 as rows_bf16 rounds them) into a 4 KB tile, multiplied by every row
 * of x's chunk (M BLK_KC values, 512 KB at 512 rows: in L2 for the whole share), each chunk's sums
 * added to y's.  No whole decoded copy: one 4 x BLK_KC tile per thread. */
#define BLK_KC 512
/* x's bytes above which the chunked path runs (past the few-rows path): a smaller x stays in L2
 * for rows_bf16, which measured faster there (8 rows of a 14336-column layer, 229 KB: 1.25x
 * torch bf16 chunked, 1.58x on rows_bf16; one thread, thread CPU time) */
#ifndef BLK_MIN_XBYTES
#define BLK_MIN_XBYTES ((size_t)1 << 20)
#endif

/* y[m0 + i, n + c] (+)= the chunk's products, i < NM rows of x, c < nr of the tile's 4 rows. */
TGTBF static inline __attribute__((always_inline)) void mul4c_bf16(const mm_job *j, const uint16_t *x, const uint16_t *w, Py_ssize_t m0,
                                                                   Py_ssize_t n, const int NM, Py_ssize_t k0, Py_ssize_t k1, int nr) {
    const Py_ssize_t K = j->K, N = j->N;
    __m512 a[4][4];
    Py_ssize_t k;
    int i, c;
    for (i = 0; i < NM; i++)
        for (c = 0; c < 4; c++) a[i][c] = _mm512_setzero_ps();
    for (k = k0; k < k1; k += 32) {
        const uint16_t *wk = w + (k - k0);
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wk), w1 = (__m512bh)_mm512_loadu_si512(wk + BLK_KC);
        const __m512bh w2 = (__m512bh)_mm512_loadu_si512(wk + 2 * BLK_KC), w3 = (__m512bh)_mm512_loadu_si512(wk + 3 * BLK_KC);
        for (i = 0; i < NM; i++) {
            const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + (m0 + i) * K + k);
            a[i][0] = _mm512_dpbf16_ps(a[i][0], xv, w0);
            a[i][1] = _mm512_dpbf16_ps(a[i][1], xv, w1);
            a[i][2] = _mm512_dpbf16_ps(a[i][2], xv, w2);
            a[i][3] = _mm512_dpbf16_ps(a[i][3], xv, w3);
        }
    }
    for (i = 0; i < NM; i++) /* (four sums at once by unpacks measured 8-25% slower here) */
        for (c = 0; c < nr; c++) {
            float *d = j->y + (m0 + i) * N + n + c;
            const float v = _mm512_reduce_add_ps(a[i][c]);
            *d = k0 ? *d + v : v;
        }
}

/* the tile: row s's chunk at wb + s BLK_KC, 32 columns per pair */
#define BLK_PAIR_STORE(k, lo, hi)                                                                                       \
    do {                                                                                                                \
        int s_;                                                                                                         \
        FEW_UNROLL for (s_ = 0; s_ < RW; s_++)                                                                          \
            _mm512_storeu_si512((void *)(wb + s_ * BLK_KC + (k) - k0), (__m512i)_mm512_cvtne2ps_pbh(hi[s_], lo[s_]));   \
    } while (0)

#define BLK_KERNEL(NAME, TARGET, FORM, SETUP)                                                                           \
    TARGET static inline __attribute__((always_inline)) void NAME##_body(const mm_job *j, const uint16_t *x, const int kind) { \
        const Py_ssize_t K = j->K, G = K / j->g, g = j->g, M = j->M;                                                    \
        const int hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL, RW = 4;                                      \
        const Py_ssize_t rowbytes = kind == K_NIB4 ? K / 2 : K;                                                         \
        uint16_t wb[4 * BLK_KC] __attribute__((aligned(64)));                                                           \
        Py_ssize_t k0, k1, nb, m, o;                                                                                    \
        int s;                                                                                                          \
        SETUP;                                                                                                          \
        for (k0 = 0; k0 < K; k0 += BLK_KC) {                                                                            \
            k1 = k0 + BLK_KC < K ? k0 + BLK_KC : K;                                                                     \
            for (nb = j->n0; nb < j->n1; nb += 4) {                                                                     \
                const int nr = j->n1 - nb < 4 ? (int)(j->n1 - nb) : 4;                                                  \
                const uint8_t *wr[4];                                                                                   \
                const float *zr[4], *sr[4], *br[4];                                                                     \
                FEW_UNROLL for (s = 0; s < 4; s++) {                                                                    \
                    const Py_ssize_t n = nb + (s < nr ? s : nr - 1);                                                    \
                    wr[s] = j->w + n * rowbytes;                                                                        \
                    zr[s] = hz ? j->z + n * G : NULL, sr[s] = hs ? j->s + n * G : NULL, br[s] = hb ? j->b + n * G : NULL; \
                    if (n + 4 < j->n1) /* the next tile's codes, into L2 */                                            \
                        for (o = k0 * rowbytes / K; o < k1 * rowbytes / K; o += 64)                                     \
                            __builtin_prefetch(j->w + (n + 4) * rowbytes + o, 0, QF_PF_LOCALITY);                       \
                }                                                                                                       \
                FORM(BLK_PAIR_STORE);                                                                                   \
                for (m = 0; m + 3 < M; m += 4) mul4c_bf16(j, x, wb, m, nb, 4, k0, k1, nr);                              \
                switch (M - m) {                                                                                        \
                case 3: mul4c_bf16(j, x, wb, m, nb, 3, k0, k1, nr); break;                                              \
                case 2: mul4c_bf16(j, x, wb, m, nb, 2, k0, k1, nr); break;                                              \
                case 1: mul4c_bf16(j, x, wb, m, nb, 1, k0, k1, nr); break;                                              \
                default: break;                                                                                         \
                }                                                                                                       \
            }                                                                                                           \
        }                                                                                                               \
    }
BLK_KERNEL(blk_bf, TGTBF, FEW_FORM512, FEW_SETUP512)
BLK_KERNEL(blk_bfvb, TGTVBBF, FEW_FORMVB, FEW_SETUPVB)
TGTBF static void blk_bf(const mm_job *j, const uint16_t *x) {
    switch (j->kind) {
    case K_NIB4: blk_bf_body(j, x, K_NIB4); break;
    case K_I8: blk_bf_body(j, x, K_I8); break;
    case K_U8: blk_bf_body(j, x, K_U8); break;
    case K_E4M3: blk_bf_body(j, x, K_E4M3); break;
    case K_E5M2: blk_bf_body(j, x, K_E5M2); break;
    default: blk_bf_body(j, x, K_LUT8); break;
    }
}
TGTVBBF static void blk_bfvb(const mm_job *j, const uint16_t *x) { blk_bfvb_body(j, x, K_LUT8); }
