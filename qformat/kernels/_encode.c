/* qformat native int encoders (issue 45 item 5): the bytes of qformat.schemes.int_'s NumPy path.
 *
 * Symmetric (int_symmetric.symmetric, the binary32 path of int_.symmetric_reference): per group,
 * five candidate scales +-amax / m rounded to the scale dtype, each judged by the binary32 sum of
 * squared errors of the values a reader decodes, summed element by element in the group's order
 * (what NumPy's einsum("ij,ij->j") does: one rounding per product and per sum, no fused
 * multiply-add); a candidate replaces the best only when below best * float32(1 - 1e-4); then the
 * codes nearest to x for the chosen scale, elements whose binary32 quotient lies near a half
 * integer recomputed by the float64 rule (int_symmetric._reference_codes).  Groups the NumPy fast
 * path does not cover (NaN, Inf, zero or extreme range, scales that overflow or underflow, float16
 * output outside its normal range) are left to Python: their status byte is 0.
 *
 * Asymmetric (int_._asymmetric) where the product is exact (float32 output, 16-bit scales): the
 * float64 rule, element by element as NumPy evaluates it.
 *
 * Layout: 16 groups at a time, transposed (element i of group j at [i][j]), so every step runs
 * along the 16 lanes and each lane's sum stays sequential: the loops vectorize without
 * reassociation.  -ffp-contract=off (setup.py) keeps every step one binary32 or binary64 rounding;
 * the same body is compiled for baseline x86-64, AVX2 and AVX-512 (runtime dispatch) and writes
 * the same bytes at every level (tests compare them).  One call encodes a range of rows with the
 * GIL released; qformat.schemes.int_ spreads ranges over qformat.kernels.pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#if defined(__GNUC__)
#define AI static inline __attribute__((always_inline))
#else
#define AI static inline
#endif

enum { SRC_F32 = 0, SRC_F16 = 1, SRC_BF16 = 2 };          /* input element kinds */
enum { OUT_F32 = 0, OUT_F16 = 1, OUT_BF16 = 2 };          /* logical dtype (decoded values) */

static float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    uint32_t u;
    float f;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13);
    } else if (e == 0) {
        f = (float)m * 0x1p-24f; /* exact: a subnormal half is m * 2^-24 */
        return sign ? -f : f;
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    memcpy(&f, &u, 4);
    return f;
}

AI float load(const void *x, int src, Py_ssize_t k) {
    if (src == SRC_F32) return ((const float *)x)[k];
    const uint16_t h = ((const uint16_t *)x)[k];
    if (src == SRC_F16) return f16_to_f32(h);
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* v rounded (nearest, ties to even) to a binary format with p fraction bits, smallest normal
 * exponent emin and largest finite value top (Inf beyond), as a double: exact arithmetic (the
 * quotient by a power of two is exact and rint rounds it once).  Used per group and per rare
 * element only. */
static double round_to(double v, int p, int emin, double top) {
    if (v == 0.0 || !isfinite(v)) return v;
    int e;
    const double a = fabs(v);
    frexp(a, &e);
    e -= 1;
    if (e < emin) e = emin;
    const double ulp = ldexp(1.0, e - p), r = rint(a / ulp) * ulp;
    return copysign(r > top ? INFINITY : r, v);
}
/* The same rounding on the bits of a double whose result is a normal number of the format
 * (2^emin <= |v|, checked by the caller): add the round-half-to-even increment for the dropped
 * bits, clear them (a carry into the exponent is the rounding up to the next binade). */
static inline double round_bits64(double v, int p) {
    uint64_t u;
    const int sh = 52 - p;
    memcpy(&u, &v, 8);
    u = (u + ((1ull << (sh - 1)) - 1ull) + ((u >> sh) & 1ull)) & (~0ull << sh);
    memcpy(&v, &u, 8);
    return v;
}
static double to_kind(double v, int kind) { /* OUT_* or, for scales, 1 f16 / 2 bf16 */
    const double a = fabs(v);
    if (kind == OUT_F16 && a >= 0x1p-14 && a < 65504.0) return round_bits64(v, 10); /* below the top: at most the top */
    if (kind == OUT_BF16 && a >= 0x1p-126 && a < 0x1.fep127) return round_bits64(v, 7);
    if (kind == OUT_F16) return round_to(v, 10, -14, 65504.0);
    if (kind == OUT_BF16) return round_to(v, 7, -126, 0x1.fep127);
    return round_to(v, 23, -126, 0x1.fffffep127);
}

/* Binary32 d rounded to float16 / bfloat16 on its bits (int_symmetric.round_bits; exact where the
 * result is normal or zero, which the fast path guarantees). */
AI float round_bits(float d, int sh) {
    uint32_t u;
    memcpy(&u, &d, 4);
    u = (u + ((1u << (sh - 1)) - 1u) + ((u >> sh) & 1u)) & (0xFFFFFFFFu << sh);
    memcpy(&d, &u, 4);
    return d;
}

/* rint for |v| <= 2^22 (every quotient here is within 2^(b-1) + 2): the binary32 sum rounds to
 * an integer, nearest even, and the difference is exact.  (The sign of a zero result may differ
 * from rintf's; no step below depends on it.) */
AI float rint22(float v) { return (v + 12582912.0f) - 12582912.0f; }
AI float clampf(float v, float lo, float hi) { return v < lo ? lo : (v > hi ? hi : v); }

/* int_symmetric._reference_codes for one element (x, s as float64). */
static float ref_code(double x, double s, int lo, int hi, int dk) {
    const double y = x / s;
    double q0 = rint(y);
    q0 = q0 < lo ? lo : (q0 > hi ? hi : q0);
    if (dk == OUT_F32) return (float)q0;
    double q1 = q0 + (y > q0 ? 1.0 : -1.0);
    q1 = q1 < lo ? lo : (q1 > hi ? hi : q1);
    double e0 = fabs(to_kind(to_kind(q0 * s, OUT_F32), dk) - x), e1 = fabs(to_kind(to_kind(q1 * s, OUT_F32), dk) - x);
    if (isnan(e0)) e0 = INFINITY;
    if (isnan(e1)) e1 = INFINITY;
    return (float)(e1 < e0 ? q1 : q0);
}

typedef struct {
    const void *x;
    int src, g, bits, sk, dk, packed;
    void *codes;     /* int8 [n, g], or uint8 [n, g / 2] when packed */
    double *scales;  /* [n] */
    uint8_t *status; /* [n]: 1 encoded here, 0 left to Python */
    float *xt, *qf;  /* scratch: xt [g][LANES], qf [3 g] */
    uint16_t *s16;   /* NULL or [n]: the scales' float16 / bfloat16 bits (sk), for the groups encoded here */
} sym_job;

/* The bits of a scale exactly representable in float16 (sk 1) or bfloat16 (2), nonzero and
 * finite (the groups encoded here): bfloat16 the top half of binary32; float16 rebiased, or
 * shifted into a subnormal (exactly: no bit is dropped). */
static inline uint16_t scale_bits(double v, int sk) {
    const float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    if (sk != 1) return (uint16_t)(u >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u, e = (u >> 23) & 0xFFu, m = u & 0x7FFFFFu;
    if (e >= 113) return (uint16_t)(sign | ((e - 112) << 10) | (m >> 13));
    return (uint16_t)(sign | ((m | 0x800000u) >> (126 - e)));
}

/* The five binary32 squared-error sums of a block ([5][LANES]), each sequential over the group;
 * sh: 0 (float32 output) or the bits float16 / bfloat16 rounding drops. */
AI void estimates(const float *restrict xt, int g, float inv[3][LANES], float A32[3][LANES], float flo, float fhi, int sh,
                  float E[5][LANES]) {
    for (int i = 0; i < g; i++) {
        const float *restrict xi = xt + i * LANES;
        for (int j = 0; j < LANES; j++) {
            const float v = xi[j];
            const float r0 = rint22(v * inv[0][j]), r1 = rint22(v * inv[1][j]), r2 = rint22(v * inv[2][j]);
            float d0 = clampf(r0, flo, fhi) * A32[0][j], d1 = clampf(r0, -fhi, -flo) * A32[0][j];
            float d2 = clampf(r1, -fhi, -flo) * A32[1][j], d3 = clampf(r1, flo, fhi) * A32[1][j];
            float d4 = clampf(r2, -fhi, -flo) * A32[2][j];
            if (sh) {
                d0 = round_bits(d0, sh), d1 = round_bits(d1, sh), d2 = round_bits(d2, sh);
                d3 = round_bits(d3, sh), d4 = round_bits(d4, sh);
            }
            d0 -= v, d1 -= v, d2 -= v, d3 -= v, d4 -= v;
            E[0][j] += d0 * d0, E[1][j] += d1 * d1, E[2][j] += d2 * d2, E[3][j] += d3 * d3, E[4][j] += d4 * d4;
        }
    }
}

/* 16 x 16 floats: rows [16] (row k at rows + k * stride) into t (t[i * LANES + k] = row k's i),
 * four stages that each swap one bit of the row index with the same bit of the column index
 * (two-operand shuffles: AVX-512's vpermt2ps; issue 45 item 5, the scalar copy took a quarter of
 * the encoder's time).  Exact: values are only moved. */
typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef float v16fu __attribute__((vector_size(64), aligned(4)));
typedef uint8_t v16u8 __attribute__((vector_size(16)));
AI void transpose16(const float *rows, Py_ssize_t stride, float *t) {
    v16f R[16];
    for (int k = 0; k < 16; k++) R[k] = *(const v16fu *)(rows + k * stride);
    static const v16i LO[4] = {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
                               {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
                               {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
                               {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}};
    static const v16i HI[4] = {{1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31},
                               {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                               {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31},
                               {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}};
    for (int s = 0; s < 4; s++) {
        const int b = 1 << s;
        for (int r = 0; r < 16; r++)
            if (!(r & b)) {
                const v16f a = R[r], c = R[r + b];
                R[r] = __builtin_shuffle(a, c, LO[s]);
                R[r + b] = __builtin_shuffle(a, c, HI[s]);
            }
    }
    for (int k = 0; k < 16; k++) memcpy(t + k * LANES, &R[k], 64);
}

/* One block of nl (<= LANES) groups starting at row r0. */
/* g: J->g, passed separately so that the common group sizes compile with constant loop bounds;
 * wide: compiled for AVX-512 (the shuffle transpose; a scalar copy elsewhere). */
AI void sym_block(const sym_job *J, Py_ssize_t r0, int nl, const int g, const int wide) {
    const int lo = -(1 << (J->bits - 1)), hi = (1 << (J->bits - 1)) - 1, dk = J->dk;
    const int sh = dk == OUT_F16 ? 13 : 16;
    const double half = (double)(1 << (J->bits - 1));
    float *restrict xt = J->xt, *restrict qf = J->qf;
    float mx[LANES], mn[LANES], A32[3][LANES], inv[3][LANES], E[5][LANES], s32[LANES], sinv[LANES], sgn[LANES];
    double S[5][LANES];
    int fast[LANES], pos[LANES];
    if (wide && g == 32 && nl == LANES && J->src == SRC_F32) {
        const float *x0 = (const float *)J->x + r0 * g;
        transpose16(x0, g, xt);
        transpose16(x0 + 16, g, xt + 16 * LANES);
    } else
    for (int j = 0; j < LANES; j++) { /* padding lanes repeat the last group */
        const Py_ssize_t r = r0 + (j < nl ? j : nl - 1);
        if (J->src == SRC_F32) {
            const float *restrict xr = (const float *)J->x + r * g;
            for (int i = 0; i < g; i++) xt[i * LANES + j] = xr[i];
        } else {
            for (int i = 0; i < g; i++) xt[i * LANES + j] = load(J->x, J->src, r * g + i);
        }
    }
    /* NaN is skipped here; a group holding one gets NaN estimates, caught below */
    { /* 16 lanes as one vector (the scalar loops stayed scalar): v > max / v < min selects */
        v16f vmx, vmn;
        for (int j = 0; j < LANES; j++) vmx[j] = -INFINITY, vmn[j] = INFINITY;
        for (int i = 0; i < g; i++) {
            v16f v;
            memcpy(&v, xt + i * LANES, 64);
            const v16i gt = v > vmx, lt = v < vmn;
            vmx = (v16f)(((v16i)v & gt) | ((v16i)vmx & ~gt));
            vmn = (v16f)(((v16i)v & lt) | ((v16i)vmn & ~lt));
        }
        memcpy(mx, &vmx, 64);
        memcpy(mn, &vmn, 64);
    }
    /* per group: the candidate magnitudes amax / m rounded to the scale dtype, in lanes (the
     * rounding on the bits where the result is a normal number of it; to_kind otherwise) */
    const double m[3] = {half, half + 0.5, half + 0.25};
    const int p = J->sk == OUT_F16 ? 10 : 7;
    const double nmin = J->sk == OUT_F16 ? 0x1p-14 : 0x1p-126, nmax = J->sk == OUT_F16 ? 65504.0 : 0x1.fep127;
    double Ad[3][LANES], q40[LANES], amaxd[LANES];
    int odd[LANES], anyodd = 0;
    /* lane loops without branches (they vectorize; issue 45 item 5): the same operations per lane */
    for (int j = 0; j < LANES; j++) {
        const int pm = mx[j] > -mn[j];
        amaxd[j] = pm ? (double)mx[j] : -(double)mn[j];
        q40[j] = pm ? -1.0 : 1.0;
        odd[j] = mx[j] == -mn[j];
    }
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < LANES; j++) {
            const double v = amaxd[j] / m[k];
            odd[j] |= !(v >= nmin && v < nmax);
            Ad[k][j] = round_bits64(v, p);
        }
    for (int j = 0; j < LANES; j++) anyodd |= odd[j];
    if (anyodd)
        for (int j = 0; j < LANES; j++) {
            if (!odd[j]) continue; /* rare: a tie of both signs, or a scale outside the normal range */
            const double amax = amaxd[j];
            if (mx[j] == -mn[j] && mx[j] > 0) /* the first element of largest magnitude decides */
                for (int i = 0; i < g; i++)
                    if (fabsf(xt[i * LANES + j]) == mx[j]) {
                        q40[j] = xt[i * LANES + j] > 0 ? -1.0 : 1.0;
                        break;
                    }
            for (int k = 0; k < 3; k++) Ad[k][j] = to_kind(amax / m[k], J->sk);
        }
    int allfast = 1;
    for (int j = 0; j < LANES; j++) {
        int f = amaxd[j] > 0x1p-50 && amaxd[j] < 0x1p50;
        for (int k = 0; k < 3; k++) {
            f &= Ad[k][j] > 0 && Ad[k][j] <= 0x1.fffffffffffffp1023; /* finite and positive */
            if (dk == OUT_F16) f &= Ad[k][j] >= 0x1p-14;
        }
        if (dk == OUT_F16) f &= half * Ad[0][j] <= 65504.0;
        fast[j] = f & (j < nl);
        allfast &= fast[j];
    }
    if (!allfast)
        for (int j = 0; j < LANES; j++) {
            if (fast[j]) continue; /* benign values; the lane's results are not used */
            Ad[0][j] = Ad[1][j] = Ad[2][j] = 1.0;
            for (int i = 0; i < g; i++) xt[i * LANES + j] = 0.0f;
        }
    for (int j = 0; j < LANES; j++) {
        pos[j] = q40[j] > 0;
        S[0][j] = q40[j] * Ad[0][j], S[1][j] = -q40[j] * Ad[0][j], S[2][j] = -Ad[1][j], S[3][j] = Ad[1][j], S[4][j] = -Ad[2][j];
        for (int k = 0; k < 3; k++) A32[k][j] = (float)Ad[k][j], inv[k][j] = 1.0f / (float)Ad[k][j];
        for (int c = 0; c < 5; c++) E[c][j] = 0.0f;
    }
    const float flo = (float)lo, fhi = (float)hi;
    /* the five estimates: +a0, -a0 (one quotient), -a1, +a1 (one quotient), -a2; a loop per
     * output kind, so that float32's has no rounding step (not even one computed and discarded) */
    if (dk == OUT_F32)
        estimates(xt, g, inv, A32, flo, fhi, 0, E);
    else
        estimates(xt, g, inv, A32, flo, fhi, sh, E);
    const float keep = (float)(1.0 - 1e-4);
    double sb[LANES];
    for (int j = 0; j < LANES; j++) {
        /* a NaN anywhere in the group makes every estimate NaN (d - NaN): left to Python */
        fast[j] &= E[0][j] == E[0][j];
        /* Q4_0's sign first: E[0] is +a0's estimate, E[1] -a0's; then the first candidate below
         * best * keep replaces it, in order (selects, not branches) */
        float be = pos[j] ? E[0][j] : E[1][j];
        const float e1 = pos[j] ? E[1][j] : E[0][j];
        double sv = S[0][j]; /* S[0] is the scale whose estimate is be, S[1] e1's (q40 signs both) */
        const double s1 = S[1][j];
        int t = e1 < be * keep;
        be = t ? e1 : be, sv = t ? s1 : sv;
        for (int c = 2; c < 5; c++) {
            t = E[c][j] < be * keep;
            be = t ? E[c][j] : be, sv = t ? S[c][j] : sv;
        }
        sb[j] = sv;
        s32[j] = (float)sv, sinv[j] = 1.0f / (float)sv, sgn[j] = sv > 0 ? 1.0f : -1.0f;
    }
    for (int j = 0; j < LANES; j++)
        if (fast[j]) {
            J->scales[r0 + j] = sb[j];
            if (J->s16) J->s16[r0 + j] = scale_bits(sb[j], J->sk);
        }
    /* the codes, group by group in the row layout (contiguous, vectorized along the group);
     * elements near a half integer are redone by the float64 rule */
    const float halfeps = 0.5f - (float)((1 - lo) * 0x1p-21);
    for (int j = 0; j < nl; j++) {
        const Py_ssize_t r = r0 + j;
        J->status[r] = (uint8_t)fast[j];
        if (!fast[j]) continue;
        const float *restrict xr;
        if (J->src == SRC_F32) {
            xr = (const float *)J->x + r * g;
        } else {
            for (int i = 0; i < g; i++) qf[i] = xt[i * LANES + j];
            xr = qf;
        }
        float *restrict qr = qf + g;
        const float sj = s32[j], si = sinv[j], sg = sgn[j];
        int near = 0;
        for (int i = 0; i < g; i++) {
            const float v = xr[i], y = v * si, rr = rint22(y);
            near |= fabsf(y - rr) > halfeps;
            float q0 = clampf(rr, flo, fhi);
            if (dk != OUT_F32) {
                const float t = (v - q0 * sj) * sg;
                const float q1 = clampf((t > 0 ? 2.0f : 0.0f) + q0 - 1.0f, flo, fhi);
                const float e0 = fabsf(round_bits(q0 * sj, sh) - v), e1 = fabsf(round_bits(q1 * sj, sh) - v);
                q0 = e1 < e0 ? q1 : q0;
            }
            qr[i] = q0;
        }
        if (near)
            for (int i = 0; i < g; i++) {
                const float y = xr[i] * si;
                if (fabsf(y - rint22(y)) > halfeps) qr[i] = ref_code((double)xr[i], J->scales[r], lo, hi, dk);
            }
        if (J->packed && g == 32) { /* even and odd codes apart (two shuffles), nibble pairs, bytes */
            v16f a, c;
            memcpy(&a, qr, 64);
            memcpy(&c, qr + 16, 64);
            const v16i ia = __builtin_convertvector(a, v16i), ic = __builtin_convertvector(c, v16i);
            const v16i e = __builtin_shuffle(ia, ic, (v16i){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30});
            const v16i o = __builtin_shuffle(ia, ic, (v16i){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31});
            const v16u8 pb = __builtin_convertvector((e & 15) | ((o & 15) << 4), v16u8);
            memcpy((uint8_t *)J->codes + r * 16, &pb, 16);
        } else if (J->packed) { /* codes to bytes first (one vector conversion), then nibble pairs */
            int8_t *restrict q8 = (int8_t *)(qr + g);
            for (int i = 0; i < g; i++) q8[i] = (int8_t)(int)qr[i];
            uint8_t *restrict o = (uint8_t *)J->codes + r * (g / 2);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            const uint16_t *restrict w = (const uint16_t *)q8; /* a pair per 16-bit word: contiguous loads */
            for (int i = 0; i < g / 2; i++) o[i] = (uint8_t)((w[i] & 0x0Fu) | ((w[i] >> 4) & 0xF0u));
#else
            for (int i = 0; i < g / 2; i++) o[i] = (uint8_t)((q8[2 * i] & 15) | ((uint8_t)q8[2 * i + 1] << 4));
#endif
        } else {
            int8_t *restrict o = (int8_t *)J->codes + r * g;
            for (int i = 0; i < g; i++) o[i] = (int8_t)(int)qr[i];
        }
    }
}

AI void sym_rows(const sym_job *J, Py_ssize_t a, Py_ssize_t b, const int wide) {
    for (Py_ssize_t r = a; r < b; r += LANES) {
        const int nl = b - r < LANES ? (int)(b - r) : LANES;
        if (J->g == 32)
            sym_block(J, r, nl, 32, wide);
        else
            sym_block(J, r, nl, J->g, wide);
    }
}

typedef struct {
    const void *x;
    int src, g, bits, sk, packed;
    uint8_t *codes; /* uint8 [n, g], or [n, g / 2] packed */
    double *scales, *zeros;
    uint8_t *status;
} asym_job;

/* int_._asymmetric with an exact product (float32 output, 16-bit scales), one row. */
AI void asym_row(const asym_job *J, Py_ssize_t r, double *y) {
    const int g = J->g;
    const double qmax = (double)((1 << J->bits) - 1);
    float mn = 0.0f, mx = 0.0f;
    int bad = 0;
    for (int i = 0; i < g; i++) {
        const float v = load(J->x, J->src, r * g + i);
        y[i] = (double)v;
        mn = v < mn ? v : mn;
        mx = v > mx ? v : mx;
        bad |= v != v;
    }
    const double s = to_kind(((double)mx - (double)mn) / qmax, J->sk);
    if (bad || !isfinite(s)) {
        J->status[r] = 0;
        return;
    }
    double z = 0.0;
    if (s > 0) {
        z = rint(-(double)mn / s);
        z = z < 0 ? 0 : (z > qmax ? qmax : z);
    }
    const double d = s != 0 ? s : 1.0;
    for (int i = 0; i < g; i++) {
        double q = s != 0 ? y[i] / d : 0.0;
        q = rint(q + z);
        y[i] = q < 0 ? 0 : (q > qmax ? qmax : q);
    }
    if (J->packed) {
        uint8_t *o = J->codes + r * (g / 2);
        for (int i = 0; i < g; i += 2) o[i / 2] = (uint8_t)((int)y[i] | ((int)y[i + 1] << 4));
    } else {
        uint8_t *o = J->codes + r * g;
        for (int i = 0; i < g; i++) o[i] = (uint8_t)(int)y[i];
    }
    J->scales[r] = s, J->zeros[r] = z, J->status[r] = 1;
}

AI void asym_rows(const asym_job *J, Py_ssize_t a, Py_ssize_t b, double *y) {
    for (Py_ssize_t r = a; r < b; r++) asym_row(J, r, y);
}

static void sym_generic(const sym_job *J, Py_ssize_t a, Py_ssize_t b) { sym_rows(J, a, b, 0); }
static void asym_generic(const asym_job *J, Py_ssize_t a, Py_ssize_t b, double *y) { asym_rows(J, a, b, y); }
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define QF_X86 1
__attribute__((target("avx2"))) static void sym_avx2(const sym_job *J, Py_ssize_t a, Py_ssize_t b) { sym_rows(J, a, b, 0); }
__attribute__((target("avx2"))) static void asym_avx2(const asym_job *J, Py_ssize_t a, Py_ssize_t b, double *y) { asym_rows(J, a, b, y); }
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void sym_avx512(const sym_job *J, Py_ssize_t a, Py_ssize_t b) {
    sym_rows(J, a, b, 1);
}
__attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void asym_avx512(const asym_job *J, Py_ssize_t a, Py_ssize_t b,
                                                                                      double *y) {
    asym_rows(J, a, b, y);
}
static int best_level(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
}
#else
static int best_level(void) { return 0; }
#endif

static int check_common(Py_ssize_t n, int g, int bits, int src, int sk, int packed, Py_ssize_t xlen, Py_ssize_t clen, Py_ssize_t slen,
                        Py_ssize_t stlen, int *level) {
    const int esize = src == SRC_F32 ? 4 : 2;
    if (*level < 0) *level = best_level();
    if (*level > best_level()) return PyErr_Format(PyExc_ValueError, "level %d is not supported on this CPU", *level), -1;
    if (src < SRC_F32 || src > SRC_BF16 || sk < 1 || sk > 2 || bits < 2 || bits > 8 || n < 0 || g < 1 || (packed && (g % 2 || bits != 4)))
        return PyErr_SetString(PyExc_ValueError, "bad encoder arguments"), -1;
    if (xlen != (Py_ssize_t)esize * n * g || clen != (packed ? n * (g / 2) : n * g) || slen != 8 * n || stlen != n)
        return PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the rows"), -1;
    return 0;
}

/* int_sym(x, src, n, g, bits, scale_kind, out_kind, packed, codes, scales, status[, level[, s16]]):
 * n groups of g values (x: float32 / float16 / bfloat16, C order), scale_kind 1 float16, 2
 * bfloat16; out_kind 0 float32, 1 float16, 2 bfloat16; codes int8 [n, g] or packed nibbles
 * [n, g / 2]; scales float64 [n]; status uint8 [n]; s16 (None or uint16 [n]): also the scales'
 * bits in scale_kind (saves the caller a float64 conversion).  Returns how many groups were left
 * (status 0; their scales and s16 entries are the caller's to write). */
static PyObject *py_int_sym(PyObject *self, PyObject *args) {
    Py_buffer xb, cb, sb, stb, hb = {0};
    Py_ssize_t n;
    int src, g, bits, sk, dk, packed, level = -1;
    PyObject *ho = Py_None;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iniiiipw*w*w*|iO", &xb, &src, &n, &g, &bits, &sk, &dk, &packed, &cb, &sb, &stb, &level, &ho)) return NULL;
    if (ho != Py_None && PyObject_GetBuffer(ho, &hb, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&xb), PyBuffer_Release(&cb), PyBuffer_Release(&sb), PyBuffer_Release(&stb);
        return NULL;
    }
    PyObject *ret = NULL;
    if (check_common(n, g, bits, src, sk, packed, xb.len, cb.len, sb.len, stb.len, &level) == 0) {
        if (dk < OUT_F32 || dk > OUT_BF16) {
            PyErr_SetString(PyExc_ValueError, "bad output kind");
        } else if (hb.buf != NULL && hb.len != 2 * n) {
            PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the rows");
        } else {
            float *buf = n ? malloc(sizeof(float) * (LANES + 3) * (size_t)g) : NULL;
            if (n && !buf) {
                PyErr_NoMemory();
            } else {
                sym_job J = {xb.buf, src, g, bits, sk, dk, packed, cb.buf, (double *)sb.buf, (uint8_t *)stb.buf, buf, buf + LANES * g,
                             (uint16_t *)hb.buf};
                Py_ssize_t left = 0;
                Py_BEGIN_ALLOW_THREADS
#if QF_X86
                if (level == 2)
                    sym_avx512(&J, 0, n);
                else if (level == 1)
                    sym_avx2(&J, 0, n);
                else
#endif
                    sym_generic(&J, 0, n);
                for (Py_ssize_t r = 0; r < n; r++) left += !J.status[r];
                Py_END_ALLOW_THREADS
                free(buf);
                ret = PyLong_FromSsize_t(left);
            }
        }
    }
    if (hb.buf != NULL) PyBuffer_Release(&hb);
    PyBuffer_Release(&xb), PyBuffer_Release(&cb), PyBuffer_Release(&sb), PyBuffer_Release(&stb);
    return ret;
}

/* int_asym(x, src, n, g, bits, scale_kind, packed, codes, scales, zeros, status[, level]): the
 * float32-output rule (exact product); codes uint8 [n, g] or packed [n, g / 2]; scales and zero
 * points float64 [n].  Returns how many groups were left (status 0). */
static PyObject *py_int_asym(PyObject *self, PyObject *args) {
    Py_buffer xb, cb, sb, zb, stb;
    Py_ssize_t n;
    int src, g, bits, sk, packed, level = -1;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*iniiipw*w*w*w*|i", &xb, &src, &n, &g, &bits, &sk, &packed, &cb, &sb, &zb, &stb, &level)) return NULL;
    PyObject *ret = NULL;
    if (check_common(n, g, bits, src, sk, packed, xb.len, cb.len, sb.len, stb.len, &level) == 0) {
        if (zb.len != 8 * n) {
            PyErr_SetString(PyExc_ValueError, "buffer sizes do not match the rows");
        } else {
            double *y = n ? malloc(sizeof(double) * (size_t)g) : NULL;
            if (n && !y) {
                PyErr_NoMemory();
            } else {
                asym_job J = {xb.buf, src, g, bits, sk, packed, cb.buf, (double *)sb.buf, (double *)zb.buf, (uint8_t *)stb.buf};
                Py_ssize_t left = 0;
                Py_BEGIN_ALLOW_THREADS
#if QF_X86
                if (level == 2)
                    asym_avx512(&J, 0, n, y);
                else if (level == 1)
                    asym_avx2(&J, 0, n, y);
                else
#endif
                    asym_generic(&J, 0, n, y);
                for (Py_ssize_t r = 0; r < n; r++) left += !J.status[r];
                Py_END_ALLOW_THREADS
                free(y);
                ret = PyLong_FromSsize_t(left);
            }
        }
    }
    PyBuffer_Release(&xb), PyBuffer_Release(&cb), PyBuffer_Release(&sb), PyBuffer_Release(&zb), PyBuffer_Release(&stb);
    return ret;
}

static PyObject *py_best_level(PyObject *self, PyObject *args) {
    (void)self, (void)args;
    return PyLong_FromLong(best_level());
}

static PyMethodDef methods[] = {
    {"int_sym", py_int_sym, METH_VARARGS, "Symmetric int group encoder (the NumPy fast path's bytes)."},
    {"int_asym", py_int_asym, METH_VARARGS, "Asymmetric int group encoder, float32 output (the NumPy path's bytes)."},
    {"best_level", py_best_level, METH_NOARGS, "0 baseline, 1 AVX2, 2 AVX-512: the best level this CPU runs."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_encode", "qformat's native int group encoders.", -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__encode(void) { return PyModule_Create(&module); }
