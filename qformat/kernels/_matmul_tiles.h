/* qformat's native matmul (_matmul.c), included there: the tiled path for many rows of bfloat16 x.
 * Not a standalone header: it uses _matmul.c's job type, targets and the few-rows forming macros
 * defined before its #include. */

/* ---- many rows of bfloat16 x (more than BLK_MIN_XBYTES of x): a GEMM on bfloat16 pairs ----
 * The previous tiles here (4 weight rows' chunk times every row of x, one vdpbf16ps per 32 columns)
 * ended each chunk with 16 horizontal sums per 4 x 4 outputs: at 512 rows 1.5-1.9x torch's
 * bfloat16 matmul (issue 45).  Now no horizontal sum: vdpbf16ps's 16 lanes are 16 output columns.
 * A tile of TL_NC weight rows' chunk of kc (TL_KC) columns is formed (FEW_FORM512's or FEW_FORMVB's
 * steps, each binary32 weight rounded to bfloat16 by vcvtne2ps2bf16, round to nearest even: the
 * bfloat16 weight rows_bf16 and the few-rows path multiply) into the layout of vdpbf16ps's second
 * operand: for each pair of columns k, k + 1 (in x_bf16's order), TL_NB registers of 16 weight
 * rows' two values.  x's pair x[m, k:k+2] is one 32-bit broadcast (x's block packed so that the
 * TL_MR rows' pairs are one stream); a microkernel step is TL_NB loads of the tile, TL_MR
 * broadcasts and TL_MR x TL_NB vdpbf16ps into TL_MR x TL_NC sums held in registers over the whole
 * chunk, added to y's between chunks.  Loops: blocks of mc (TL_MC) rows of x, chunks of kc columns
 * (x's packed block, mc kc bfloat16 values, in L2), tiles of the share (the tile, TL_NC kc values,
 * from L2 for every TL_MR rows of the block).  Only the sums' order differs from the other bfloat16
 * paths (the same error bound: binary32 sums of exact products, one weight rounding; subnormal x
 * never comes here, weights are proved normal by the caller).
 * Measured (2-core EPYC, AVX512_BF16, one thread, thread CPU time, M = 512, int4 g32 / int8 /
 * nf4 / mxfp4 / Q4_K on 4096 x 14336 and 14336 x 4096): 1.0-1.1x torch bf16 F.linear, where the
 * previous tiles took 1.5-1.9x (bench/results_tiles_avx512.json). */

/* x's bytes above which this path runs (past the few-rows path): a smaller x stays in L2 for
 * rows_bf16, which measured faster there (8 rows of a 14336-column layer, 229 KB: 1.25x torch
 * bf16 on the previous tiles, 1.58x on rows_bf16; one thread, thread CPU time) */
#ifndef BLK_MIN_XBYTES
#define BLK_MIN_XBYTES ((size_t)1 << 20)
#endif
/* rows of x per microkernel step and 16-column registers of sums per row: TL_MR TL_NB sums,
 * TL_NB tile registers and a broadcast in AVX-512's 32 registers */
#define TL_MR 6
#define TL_NB 4
#define TL_NC (16 * TL_NB)
/* columns per chunk (a multiple of 64, FEW_FORMVB's step) and rows of x per block: x's packed block
 * 512 KB, the tile 128 KB, in L2's 1 MB (measured: 512 x 512, 128 x 2048 and 384 x 640 within a few
 * percent, none faster) */
#ifndef TL_KC
#define TL_KC 1024
#endif
#ifndef TL_MC
#define TL_MC 256
#endif
/* columns formed for all the tile's rows at a time (a multiple of 64): 4 KB of staging in L1 */
#ifndef TL_FS
#define TL_FS 128
#endif

/* 4 weight rows' 32 bfloat16 weights (columns k..k+31: 16 pairs), transposed within 128-bit lanes
 * (u_i's lane L: the 4 rows' pair 4 L + i) and staged whole in L1: tl_st + ((k - ks) / 32 * 4 + i)
 * * 4 + gq (64-byte units), gq the group's place among the register's 4 row groups. */
#define TL_PAIR_STAGE(k, lo, hi)                                                                                           \
    do {                                                                                                                   \
        const __m512i t0_ = (__m512i)_mm512_cvtne2ps_pbh(hi[0], lo[0]), t1_ = (__m512i)_mm512_cvtne2ps_pbh(hi[1], lo[1]);  \
        const __m512i t2_ = (__m512i)_mm512_cvtne2ps_pbh(hi[2], lo[2]), t3_ = (__m512i)_mm512_cvtne2ps_pbh(hi[3], lo[3]);  \
        const __m512i a0_ = _mm512_unpacklo_epi32(t0_, t1_), a1_ = _mm512_unpackhi_epi32(t0_, t1_);                         \
        const __m512i a2_ = _mm512_unpacklo_epi32(t2_, t3_), a3_ = _mm512_unpackhi_epi32(t2_, t3_);                         \
        __m512i *d_ = tl_st + ((k) - ks) / 32 * 16 + gq;                                                                   \
        _mm512_store_si512(d_, _mm512_unpacklo_epi64(a0_, a2_));                                                           \
        _mm512_store_si512(d_ + 4, _mm512_unpackhi_epi64(a0_, a2_));                                                       \
        _mm512_store_si512(d_ + 8, _mm512_unpacklo_epi64(a1_, a3_));                                                       \
        _mm512_store_si512(d_ + 12, _mm512_unpackhi_epi64(a1_, a3_));                                                      \
    } while (0)

/* The staged 4 row groups of register b, columns [ks, ke), into the tile: per 32 columns and i, the
 * 4 groups' vectors transposed by 128-bit lanes (lane L of group gq to lane gq of pair 4 L + i). */
TGTBF static inline __attribute__((always_inline)) void tl_unstage(const __m512i *st, uint16_t *tile, Py_ssize_t ks, Py_ssize_t ke,
                                                                   Py_ssize_t k0, int b) {
    Py_ssize_t k;
    int i;
    for (k = ks; k < ke; k += 32) {
        const __m512i *v = st + (k - ks) / 32 * 16;
        uint16_t *d = tile + (k - k0) / 2 * (2 * TL_NC) + 32 * b;
        FEW_UNROLL for (i = 0; i < 4; i++) {
            const __m512i v0 = _mm512_load_si512(v + 4 * i), v1 = _mm512_load_si512(v + 4 * i + 1);
            const __m512i v2 = _mm512_load_si512(v + 4 * i + 2), v3 = _mm512_load_si512(v + 4 * i + 3);
            const __m512i t0 = _mm512_shuffle_i32x4(v0, v1, 0x44), t1 = _mm512_shuffle_i32x4(v0, v1, 0xEE);
            const __m512i t2 = _mm512_shuffle_i32x4(v2, v3, 0x44), t3 = _mm512_shuffle_i32x4(v2, v3, 0xEE);
            _mm512_store_si512(d + (0 + i) * (2 * TL_NC), _mm512_shuffle_i32x4(t0, t2, 0x88));
            _mm512_store_si512(d + (4 + i) * (2 * TL_NC), _mm512_shuffle_i32x4(t0, t2, 0xDD));
            _mm512_store_si512(d + (8 + i) * (2 * TL_NC), _mm512_shuffle_i32x4(t1, t3, 0x88));
            _mm512_store_si512(d + (12 + i) * (2 * TL_NC), _mm512_shuffle_i32x4(t1, t3, 0xDD));
        }
    }
}

/* y[m0 + i, n + 16 b + l] (+)= the tile's products for i < MR rows of x (xr: their packed pairs
 * of the chunk), np pairs; mk[b]: the columns of register b inside the share.  first: the
 * chunk is the first (y not read).  pfy: the next call's TL_MR rows of y (inside the block), prefetched, or NULL. */
TGTBF static inline __attribute__((always_inline)) void tl_micro(const uint16_t *tile, const uint32_t *xr, Py_ssize_t np,
                                                                 float *yr, Py_ssize_t N, const int MR, const int first,
                                                                 const __mmask16 *mk, const float *pfy) {
    __m512 a[TL_MR][TL_NB];
    Py_ssize_t p;
    int i, b;
    FEW_UNROLL for (i = 0; i < MR; i++) {
        FEW_UNROLL for (b = 0; b < TL_NB; b++) a[i][b] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mk[b], yr + i * N + 16 * b);
    }
    if (pfy)
        FEW_UNROLL for (i = 0; i < MR; i++) FEW_UNROLL for (b = 0; b < TL_NB; b++) _mm_prefetch((const char *)(pfy + i * N + 16 * b), _MM_HINT_T0);
    for (p = 0; p < np; p++) {
        const uint16_t *t = tile + p * (2 * TL_NC);
        __m512bh wv[TL_NB];
        FEW_UNROLL for (b = 0; b < TL_NB; b++) wv[b] = (__m512bh)_mm512_load_si512((const void *)(t + 32 * b));
        FEW_UNROLL for (i = 0; i < MR; i++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xr[p * TL_MR + i]);
            FEW_UNROLL for (b = 0; b < TL_NB; b++) a[i][b] = _mm512_dpbf16_ps(a[i][b], xv, wv[b]);
        }
    }
    FEW_UNROLL for (i = 0; i < MR; i++) FEW_UNROLL for (b = 0; b < TL_NB; b++) _mm512_mask_storeu_ps(yr + i * N + 16 * b, mk[b], a[i][b]);
}

/* x's block (rows [mb, me), columns [k0, k1)) packed into xpk: per TL_MR rows, per pair, the
 * TL_MR rows' pairs (a last group of fewer rows keeps the stride), so that a microkernel step's
 * broadcasts read one 24-byte stream through one pointer (measured within noise of broadcasting
 * from x's rows, K apart: a cost of M K / 2 copies, against N / TL_NC reads of each pair) */
#define TL_PACK                                                                                              \
    do {                                                                                                     \
        Py_ssize_t mm_, p_;                                                                                  \
        int i_;                                                                                              \
        for (mm_ = mb; mm_ < me; mm_ += TL_MR) {                                                              \
            uint32_t *d_ = xpk + (mm_ - mb) * (kc / 2);                                                      \
            for (i_ = 0; i_ < TL_MR && mm_ + i_ < me; i_++) {                                                \
                const uint32_t *s_ = (const uint32_t *)(const void *)(x + (mm_ + i_) * K + k0);              \
                for (p_ = 0; p_ < (k1 - k0) / 2; p_++) d_[p_ * TL_MR + i_] = s_[p_];                         \
            }                                                                                                \
        }                                                                                                    \
    } while (0)

/* The codes (and parameters) of the tile's rows in columns [ka, kb), into L1: the next TL_FS
 * columns while these are formed (from L2, where the previous tile's calls prefetched them, the
 * forming loads waited on each line) */
#define TL_PF_L1(ka, kb)                                                                                     \
    do {                                                                                                     \
        Py_ssize_t r_, o_;                                                                                   \
        for (r_ = nb; r_ < nb + nr; r_++) {                                                                  \
            for (o_ = (ka) * rowbytes / K; o_ < (kb) * rowbytes / K; o_ += 64)                               \
                _mm_prefetch((const char *)(j->w + r_ * rowbytes + o_), _MM_HINT_T0);                        \
            if (hz) _mm_prefetch((const char *)(j->z + r_ * G + (ka) / g), _MM_HINT_T0);                     \
            if (hs) _mm_prefetch((const char *)(j->s + r_ * G + (ka) / g), _MM_HINT_T0);                     \
            if (hb) _mm_prefetch((const char *)(j->b + r_ * G + (ka) / g), _MM_HINT_T0);                     \
        }                                                                                                    \
    } while (0)

/* The body: per block of mc rows of x, per chunk of kc columns (x's block packed), per tile of
 * TL_NC weight rows (rows past the share repeat its last row; their sums are masked off): the
 * tile formed TL_FS columns at a time, then multiplied by every TL_MR rows of the block.  The next
 * tile's codes are prefetched into L2 a few rows per microkernel call, and each TL_FS columns' into
 * L1 while the previous are formed (measured: the forming loads' waits 3-6% of the time before). */
#define BLK_KERNEL(NAME, TARGET, FORM, SETUP)                                                                           \
    TARGET static inline __attribute__((always_inline)) void NAME##_body(const mm_job *j, const uint16_t *x, const int kind, \
                                                                         uint16_t *tile, uint32_t *xpk, const Py_ssize_t kc, \
                                                                         const Py_ssize_t mc) {         \
        const Py_ssize_t K = j->K, G = K / j->g, g = j->g, M = j->M, N = j->N;                                          \
        const int hz = j->z != NULL, hs = j->s != NULL, hb = j->b != NULL, RW = 4;                                      \
        const Py_ssize_t rowbytes = kind == K_NIB4 ? K / 2 : K;                                                         \
        Py_ssize_t mb, k0, k1, nb, m, o, ks;                                                                                \
        int s, gq, b;                                                                                                   \
        __m512i tl_st[TL_FS / 2] __attribute__((aligned(64))); /* TL_FS / 32 steps of 16 vectors */                     \
        SETUP;                                                                                                          \
        for (mb = 0; mb < M; mb += mc) {                                                                             \
            const Py_ssize_t me = mb + mc < M ? mb + mc : M;                                                      \
            const Py_ssize_t calls = (me - mb + TL_MR - 1) / TL_MR;                                                     \
            for (k0 = 0; k0 < K; k0 += kc) {                                                                            \
                k1 = k0 + kc < K ? k0 + kc : K;                                                                         \
                const Py_ssize_t c0 = k0 * rowbytes / K, c1 = k1 * rowbytes / K;                                        \
                TL_PACK;                                                                                                \
                for (nb = j->n0; nb < j->n1; nb += TL_NC) {                                                             \
                    const int nr = j->n1 - nb < TL_NC ? (int)(j->n1 - nb) : TL_NC;                                      \
                    __mmask16 mk[TL_NB];                                                                                \
                    for (b = 0; b < TL_NB; b++) {                                                                       \
                        const int v = nr - 16 * b;                                                                      \
                        mk[b] = v >= 16 ? (__mmask16)0xFFFF : v <= 0 ? (__mmask16)0 : (__mmask16)((1u << v) - 1);       \
                    }                                                                                                   \
                    /* TL_FS columns at a time: each register's 4 row groups formed and staged (TL_FS 32 bytes \
                     * in L1), then stored whole into the tile (rows past the share: its last row again) */     \
                    TL_PF_L1(k0, k0 + TL_FS < k1 ? k0 + TL_FS : k1);                                                    \
                    for (ks = k0; ks < k1; ks += TL_FS) {                                                               \
                        const Py_ssize_t ke = ks + TL_FS < k1 ? ks + TL_FS : k1;                                        \
                        if (ke < k1) TL_PF_L1(ke, ke + TL_FS < k1 ? ke + TL_FS : k1);                                   \
                        for (b = 0; b < TL_NB; b++) {                                                                   \
                            for (gq = 0; gq < 4; gq++) {                                                                \
                                const uint8_t *wr[4];                                                                   \
                                const float *zr[4], *sr[4], *br[4];                                                     \
                                FEW_UNROLL for (s = 0; s < 4; s++) {                                                    \
                                    const int r = 16 * b + 4 * gq + s;                                                  \
                                    const Py_ssize_t n = nb + (r < nr ? r : nr - 1);                                    \
                                    wr[s] = j->w + n * rowbytes;                                                        \
                                    zr[s] = hz ? j->z + n * G : NULL, sr[s] = hs ? j->s + n * G : NULL, br[s] = hb ? j->b + n * G : NULL; \
                                }                                                                                       \
                                {                                                                                       \
                                    const Py_ssize_t k0 = ks, k1 = ke; /* the forming macros' range */                  \
                                    FORM(TL_PAIR_STAGE);                                                                \
                                }                                                                                       \
                            }                                                                                           \
                            tl_unstage(tl_st, tile, ks, ke, k0, b);                                                     \
                        }                                                                                               \
                    }                                                                                                   \
                    /* the next tile's rows (the same chunk), spread over this tile's calls */                          \
                    const Py_ssize_t pn0 = nb + TL_NC, pn1 = nb + 2 * TL_NC < j->n1 ? nb + 2 * TL_NC : j->n1;           \
                    const Py_ssize_t per = (TL_NC + calls - 1) / calls;                                                 \
                    Py_ssize_t pr = pn0, call = 0;                                                                      \
                    for (m = mb; m < me; m += TL_MR, call++) {                                                          \
                        const Py_ssize_t q = me - m;                                                                    \
                        const uint32_t *xr = xpk + (m - mb) * (kc / 2);                                                 \
                        float *yr = j->y + m * N + nb;                                                                  \
                        const float *pfy = k0 && m + 2 * TL_MR <= me ? yr + TL_MR * N : NULL;                            \
                        Py_ssize_t e;                                                                                   \
                        for (e = 0; e < per && pr < pn1; e++, pr++)                                                     \
                            for (o = c0; o < c1; o += 64) __builtin_prefetch(j->w + pr * rowbytes + o, 0, QF_PF_LOCALITY); \
                        switch (q < TL_MR ? q : TL_MR) {                                                                \
                        case 1: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 1, k0 == 0, mk, pfy); break;              \
                        case 2: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 2, k0 == 0, mk, pfy); break;              \
                        case 3: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 3, k0 == 0, mk, pfy); break;              \
                        case 4: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 4, k0 == 0, mk, pfy); break;              \
                        case 5: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 5, k0 == 0, mk, pfy); break;              \
                        default: tl_micro(tile, xr, (k1 - k0) / 2, yr, N, 6, k0 == 0, mk, pfy); break;             \
                        }                                                                                               \
                    }                                                                                                   \
                }                                                                                                       \
            }                                                                                                           \
        }                                                                                                               \
    }
BLK_KERNEL(blk_bf, TGTBF, FEW_FORM512, FEW_SETUP512)
BLK_KERNEL(blk_bfvb, TGTVBBF, FEW_FORMVB, FEW_SETUPVB)

/* The tile (TL_KC / 2 pairs of TL_NC weight rows: 128 KB at 1024 columns) and x's packed block
 * ((TL_MC + TL_MR) TL_KC bfloat16 values), on the heap (a worker's stack may be small), aligned for
 * the tile's 64-byte loads; where that fails, 33 KB of stack for chunks of TL_SMALL_KC columns and
 * blocks of TL_SMALL_MC rows (the same products: y read and written more often, weights formed
 * more often). */
#define TL_BYTES(kc, mc) ((size_t)(kc) * TL_NC * 2 + (size_t)((mc) + TL_MR) * (kc) * 2)
#define TL_SMALL_KC 128
#define TL_SMALL_MC 60
#ifndef TL_HEAP /* 0: always the stack (to test that route) */
#define TL_HEAP 1
#endif
#define TL_MEM                                                                                         \
    uint16_t small[TL_BYTES(TL_SMALL_KC, TL_SMALL_MC) / 2] __attribute__((aligned(64)));               \
    void *raw = TL_HEAP ? PyMem_RawMalloc(TL_BYTES(TL_KC, TL_MC) + 64) : NULL;                         \
    uint16_t *tile = raw ? (uint16_t *)((char *)raw + (64 - (uintptr_t)raw % 64) % 64) : small;        \
    const Py_ssize_t kc = raw ? TL_KC : TL_SMALL_KC, mc = raw ? TL_MC : TL_SMALL_MC;                   \
    uint32_t *xpk = (uint32_t *)(tile + kc * TL_NC)

TGTBF static void blk_bf(const mm_job *j, const uint16_t *x) {
    TL_MEM;
    switch (j->kind) {
    case K_NIB4: blk_bf_body(j, x, K_NIB4, tile, xpk, kc, mc); break;
    case K_I8: blk_bf_body(j, x, K_I8, tile, xpk, kc, mc); break;
    case K_U8: blk_bf_body(j, x, K_U8, tile, xpk, kc, mc); break;
    case K_E4M3: blk_bf_body(j, x, K_E4M3, tile, xpk, kc, mc); break;
    case K_E5M2: blk_bf_body(j, x, K_E5M2, tile, xpk, kc, mc); break;
    default: blk_bf_body(j, x, K_LUT8, tile, xpk, kc, mc); break;
    }
    PyMem_RawFree(raw);
}
TGTVBBF static void blk_bfvb(const mm_job *j, const uint16_t *x) {
    TL_MEM;
    blk_bfvb_body(j, x, K_LUT8, tile, xpk, kc, mc);
    PyMem_RawFree(raw);
}
