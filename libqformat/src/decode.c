/* Decoding (SPEC.md 6-11): element values, unpacking codes from containers (stream, slots,
 * planes, device layouts), parameter grids (plain, group-indexed, flat, encoded), binary32
 * arithmetic with one rounding per step, and the payload checks of a checker (12.4).
 *
 * Arithmetic: every step is one C float operation.  C11 evaluates float operations in float
 * when FLT_EVAL_METHOD is 0 (x86-64 SSE, AArch64), and ISO C mode (-std=c11) makes GCC's
 * default -ffp-contract=off, so no step is fused with another (10.2).  Build with
 * -ffp-contract=off whatever the mode, and never with -ffast-math. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"
#include "sha256.h"
#include "kernel.h"

#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD != 0
#error "libqformat needs FLT_EVAL_METHOD == 0 (binary32 operations evaluated in binary32)"
#endif

/* ------------------------------------------------------------------ floats */
static float f32_from_bits(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t f32_bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }

float qf_f16_to_f32(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return f32_from_bits(s | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * 0x1p-24f; /* exact: m < 2^10 */
        return s ? -v : v;
    }
    return f32_from_bits(s | ((e + 112) << 23) | (m << 13));
}
float qf_bf16_to_f32(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

uint16_t qf_f32_to_f16(float x) {
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t exp = (u >> 23) & 0xff, mant = u & 0x7fffff;
    if (exp == 0xff) return (uint16_t)(sign | (mant ? 0x7e00 : 0x7c00));
    if (exp >= 113) {
        if (exp > 142) return (uint16_t)(sign | 0x7c00);
        uint32_t h = ((exp - 112) << 10) | (mant >> 13), rem = mant & 0x1fff;
        if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry into 0x7c00 is Inf: right */
        return (uint16_t)(sign | h);
    }
    uint32_t m = exp == 0 ? mant : (mant | 0x800000);
    uint32_t shift = 126 - (exp == 0 ? 1 : exp);
    if (shift > 24) return sign;
    uint32_t q = m >> shift, rem = m - (q << shift), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
}

uint16_t qf_f32_to_bf16(float x) {
    uint32_t w = f32_bits(x);
    if ((w & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)(((uint64_t)w + 0x7fff + ((w >> 16) & 1)) >> 16);
}

float qf_round_to(float x, int dtype) {
    if (dtype == 1) return qf_f16_to_f32(qf_f32_to_f16(x));
    if (dtype == 2) return qf_bf16_to_f32(qf_f32_to_bf16(x));
    return x;
}

static float float_code(const qf_float_format *ff, unsigned u) {
    unsigned E = ff->exponent_bits, M = ff->mantissa_bits;
    int neg = ff->is_signed && ((u >> (E + M)) & 1);
    unsigned ex = (u >> M) & ((1u << E) - 1), m = u & ((1u << M) - 1);
    int allE = ex == (1u << E) - 1;
    double v;
    if (ff->specials == QF_SPECIALS_IEEE && allE) {
        if (m) return NAN;
        v = INFINITY;
    } else if (ff->specials == QF_SPECIALS_NAN_ALL_ONES && allE && m == (1u << M) - 1) return NAN;
    else if (M == 0) v = ldexp(1.0, (int)ex - ff->bias);
    else if (ex == 0) v = ldexp((double)m, 1 - ff->bias - (int)M);
    else v = ldexp((double)((1u << M) + m), (int)ex - ff->bias - (int)M);
    return (float)(neg ? -v : v); /* exact in binary32 (6.3) */
}

/* ------------------------------------------------------------------ stored values */
const unsigned char *qf_entry_bytes(const qf_file *f, const qf_entry *e) { return f->data + f->data_start + e->begin; }

static size_t dt_bytes(int dt) { return qf_dtypes[dt].bits / 8; }

/* the stored dtypes a parameter, table or group index may have, decided once per tensor */
enum { K_F32, K_F16, K_BF16, K_I8, K_U8, K_I16, K_U16, K_I32, K_U32, K_I64, K_E4M3, K_E5M2, K_E8M0, K_OTHER };
static int dt_kind(int dt) {
    static const char *const names[] = {"F32", "F16", "BF16", "I8", "U8", "I16", "U16", "I32", "U32", "I64", "F8_E4M3", "F8_E5M2", "F8_E8M0"};
    for (int k = 0; k < K_OTHER; k++)
        if (!strcmp(qf_dtypes[dt].name, names[k])) return k;
    return K_OTHER;
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint16_t le16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* a stored value widened exactly to binary32 (9.2; I32/U32 rounded to nearest even) */
static float widen_kind(int kind, const unsigned char *b, uint64_t k) {
    switch (kind) {
    case K_F32: return f32_from_bits(le32(b + 4 * k));
    case K_F16: return qf_f16_to_f32(le16(b + 2 * k));
    case K_BF16: return qf_bf16_to_f32(le16(b + 2 * k));
    case K_I8: return (float)(int8_t)b[k];
    case K_U8: return (float)b[k];
    case K_I16: return (float)(int16_t)le16(b + 2 * k);
    case K_U16: return (float)le16(b + 2 * k);
    case K_I32: return (float)(int32_t)le32(b + 4 * k);
    case K_U32: return (float)le32(b + 4 * k);
    case K_E4M3: return float_code(&qf_float_formats[QF_FMT_e4m3fn], b[k]);
    case K_E5M2: return float_code(&qf_float_formats[QF_FMT_e5m2], b[k]);
    case K_E8M0: return float_code(&qf_float_formats[QF_FMT_e8m0fnu], b[k]);
    default: return NAN;
    }
}
static float widen_one(int dt, const unsigned char *b, uint64_t k) { return widen_kind(dt_kind(dt), b, k); }

/* a whole stored tensor widened (malloc'd; its size was checked against the file) */
static float *widen_all(const qf_file *f, const qf_entry *e, uint64_t *count) {
    uint64_t n = (e->end - e->begin) / dt_bytes(e->dtype);
    *count = n;
    float *o = (float *)malloc((size_t)(n ? n : 1) * sizeof(float));
    if (!o) return NULL;
    const unsigned char *b = qf_entry_bytes(f, e);
    int kind = dt_kind(e->dtype);
    if (kind == K_E4M3 || kind == K_E5M2 || kind == K_E8M0) {
        float lut[256];
        for (unsigned u = 0; u < 256; u++) {
            unsigned char c = (unsigned char)u;
            lut[u] = widen_kind(kind, &c, 0);
        }
        for (uint64_t k = 0; k < n; k++) o[k] = lut[b[k]];
    } else
        for (uint64_t k = 0; k < n; k++) o[k] = widen_kind(kind, b, k);
    return o;
}

static int64_t int_kind(int kind, const unsigned char *b, uint64_t k) {
    switch (kind) {
    case K_I8: return (int8_t)b[k];
    case K_U8: return b[k];
    case K_I16: return (int16_t)le16(b + 2 * k);
    case K_U16: return le16(b + 2 * k);
    case K_I32: return (int32_t)le32(b + 4 * k);
    case K_U32: return le32(b + 4 * k);
    default: {
        uint64_t x = (uint64_t)le32(b + 8 * k) | (uint64_t)le32(b + 8 * k + 4) << 32;
        int64_t v;
        memcpy(&v, &x, 8);
        return v; /* I64 */
    }
    }
}

/* ------------------------------------------------------------------ element table */
/* lut: 256 entries; *valid: how many codes are valid (codebook length) */
static qf_status element_table(const qf_file *f, const qf_desc *d, float lut[256], unsigned *valid) {
    unsigned n = 1u << d->bits;
    for (unsigned u = 0; u < 256; u++) lut[u] = NAN;
    *valid = n;
    if (d->el_type == QF_EL_INT) {
        for (unsigned u = 0; u < n; u++) {
            unsigned w = (u + d->code_offset) % n;
            int v = (int)w;
            if (d->signedness == QF_SIGN_TWOS) v = w >= n / 2 ? (int)w - (int)n : (int)w;
            else if (d->signedness == QF_SIGN_OFFSET) v = (int)w - (int)(n / 2);
            lut[u] = (float)ldexp((double)v, -(int)d->frac_bits);
        }
    } else if (d->el_type == QF_EL_FLOAT) {
        for (unsigned u = 0; u < n; u++) lut[u] = float_code(&qf_float_formats[d->fmt], u);
    } else if (d->table >= 0) {
        const qf_codebook *cb = &qf_codebooks[d->table];
        for (unsigned u = 0; u < cb->len && u < n; u++) lut[u] = f32_from_bits(cb->values[u]);
        *valid = cb->len;
    } else {
        int e = qf_find_entry(f, d->table_tensor);
        if (e < 0) return QF_E_COMPONENT_MISSING;
        const qf_entry *en = &f->entries[e];
        uint64_t len = en->rank == 1 ? en->shape[0] : 0;
        for (uint64_t u = 0; u < len && u < n; u++) lut[u] = widen_one(en->dtype, qf_entry_bytes(f, en), u);
        *valid = (unsigned)(len < n ? len : n);
    }
    return QF_OK;
}

/* ------------------------------------------------------------------ codes */
typedef struct unpacker {
    const unsigned char *bytes;
    uint64_t nbytes;
    unsigned c, b, n, mask;
    int lsb, slots;
    unsigned inv[256];
    uint64_t T, perSeg, L;
    int planes;
    unsigned char *used; /* padding check: bits that hold a code bit */
} unpacker;

static uint32_t word_at(const unpacker *u, uint64_t k) {
    uint64_t off = k * (u->c / 8);
    if (off + u->c / 8 > u->nbytes) return 0; /* never: the component's shape was checked */
    const unsigned char *p = u->bytes + off;
    if (u->c == 8) return p[0];
    if (u->c == 16) return (uint32_t)p[0] | (uint32_t)p[1] << 8;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void mark(const unpacker *u, uint64_t word, unsigned shift, unsigned nbits) {
    if (!u->used) return;
    for (unsigned t = shift; t < shift + nbits; t++) {
        uint64_t byte = word * (u->c / 8) + t / 8;
        if (byte < u->nbytes) u->used[byte] |= (unsigned char)(1u << (t & 7));
    }
}

/* the code at row position pos, for a row whose first container is `base`, containers `stride` apart (10.5) */
static unsigned code_at(const unpacker *u, uint64_t pos, uint64_t base, uint64_t stride) {
    unsigned c = u->c, b = u->b;
    if (u->slots) {
        uint64_t q;
        unsigned s;
        if (!u->planes) {
            q = pos / u->n;
            s = u->inv[pos % u->n];
        } else {
            uint64_t g = pos / u->T, o = pos - g * u->T;
            uint64_t Tg = u->T < u->L - g * u->T ? u->T : u->L - g * u->T;
            uint64_t Mg = qf_ceil_div(Tg, u->n);
            q = g * u->perSeg + o % Mg;
            s = u->inv[o / Mg];
        }
        unsigned shift = u->lsb ? s * b : c - (s + 1) * b;
        mark(u, base + q * stride, shift, b);
        return (word_at(u, base + q * stride) >> shift) & u->mask;
    }
    uint64_t k0 = pos * b, q = k0 / c;
    unsigned t = (unsigned)(k0 - q * c);
    uint32_t w0 = word_at(u, base + q * stride);
    if (t + b <= c) {
        unsigned shift = u->lsb ? t : c - t - b;
        mark(u, base + q * stride, shift, b);
        return (w0 >> shift) & u->mask;
    }
    unsigned first = c - t, rest = b - first;
    mark(u, base + q * stride, u->lsb ? t : 0, first);
    mark(u, base + (q + 1) * stride, u->lsb ? 0 : c - rest, rest);
    uint32_t w1 = word_at(u, base + (q + 1) * stride);
    if (u->lsb) return ((w0 >> t) & ((1u << first) - 1)) | ((w1 & ((1u << rest) - 1)) << first);
    return ((w0 & ((1u << first) - 1)) << rest) | ((w1 >> (c - rest)) & ((1u << rest) - 1));
}

static const int MARLIN_IL4[8] = {0, 2, 4, 6, 1, 3, 5, 7}, MARLIN_IL8[4] = {0, 2, 1, 3};
static void marlin_perm(unsigned bits, int perm_out[1024]) {
    int perm[1024], k = 0;
    for (int i = 0; i < 32; i++) {
        int col = i / 4, p1[8], np = 0;
        for (int blk = 0; blk < 2; blk++) {
            int rows[4] = {2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1};
            for (int r = 0; r < 4; r++) p1[np++] = 16 * rows[r] + col + 8 * blk;
        }
        for (int j = 0; j < 4; j++)
            for (int x = 0; x < 8; x++) perm[k++] = p1[x] + 256 * j;
    }
    const int *il = bits == 4 ? MARLIN_IL4 : MARLIN_IL8;
    int nil = bits == 4 ? 8 : 4;
    for (int m = 0; m < 1024; m++) perm_out[m] = perm[nil * (m / nil) + il[m % nil]];
}

/* device layouts (11.3, 11.4): the whole logical code grid q[N*K] */
static unsigned char *unpack_device(const qf_file *f, const qf_desc *d, const qf_entry *e) {
    uint64_t N = d->shape[0], K = d->shape[1], NK;
    if (qf_mul_u64(N, K, &NK)) return NULL;
    unsigned char *q = (unsigned char *)calloc((size_t)(NK ? NK : 1), 1);
    if (!q) return NULL;
    unpacker u = {0};
    u.bytes = qf_entry_bytes(f, e);
    u.nbytes = e->end - e->begin;
    u.c = 32;
    if (d->layout == QF_LAYOUT_TINYGEMM) {
        int64_t T = 2;
        qj_int_in(qj_get(d->layout_params, "inner_k_tiles"), 0, 64, &T);
        uint64_t NT = N / 8, KO = K / (uint64_t)(16 * T), W = (uint64_t)T / 2, idx = 0;
        for (uint64_t nt = 0; nt < NT; nt++)
            for (uint64_t ko = 0; ko < KO; ko++)
                for (uint64_t t = 0; t < 32; t++)
                    for (uint64_t w = 0; w < W; w++) {
                        uint32_t v = word_at(&u, idx++);
                        for (unsigned j = 0; j < 8; j++) {
                            unsigned i = j % 4, h = j / 4;
                            uint64_t n = 8 * nt + t / 4;
                            uint64_t k = 16 * (ko * (uint64_t)T + 2 * w) + 2 * (t % 4) + 8 * (i % 2) + 16 * (i / 2) + h;
                            q[n * K + k] = (unsigned char)((v >> (4 * j)) & 0xf);
                        }
                    }
        return q;
    }
    unsigned b = d->bits, P = 32 / b, mask = (1u << b) - 1;
    int perm[1024];
    marlin_perm(b, perm);
    uint64_t rowLen = 16 * N;
    unsigned char *R = (unsigned char *)malloc((size_t)rowLen);
    if (!R) { free(q); return NULL; }
    for (uint64_t kt = 0; kt < K / 16; kt++) {
        for (uint64_t x = 0; x < rowLen / P; x++) {
            uint32_t v = word_at(&u, kt * (rowLen / P) + x);
            for (unsigned i = 0; i < P; i++) R[P * x + i] = (unsigned char)((v >> (b * i)) & mask);
        }
        for (uint64_t un = 0; un < rowLen / 1024; un++)
            for (int m = 0; m < 1024; m++) {
                uint64_t a = 1024 * un + (uint64_t)perm[m];
                uint64_t nt = a / 256, r = (a >> 4) & 15, c = a & 15;
                q[(16 * nt + c) * K + 16 * kt + r] = R[1024 * un + (uint64_t)m];
            }
    }
    free(R);
    return q;
}

static void strides_of(const uint64_t *s, size_t r, uint64_t *st) {
    uint64_t acc = 1;
    for (size_t a = r; a-- > 0;) {
        st[a] = acc;
        acc *= s[a]; /* bounded: every shape here has been checked against the file */
    }
}

/* per grid axis, how far one cell along it moves in the parameter's values: row-major strides of
 * the grid as stored (its `order` applied; an encoded parameter's values are in grid order) */
static void cell_coefficients(const qf_param *p, const uint64_t *grid, size_t gr, uint64_t *pcoef) {
    if (p->encoded) {
        strides_of(grid, gr, pcoef);
        return;
    }
    uint64_t sg[64], pst[64];
    unsigned ord[64];
    for (size_t j = 0; j < gr; j++) {
        ord[j] = p->has_order ? p->order[j] : (unsigned)j;
        sg[j] = grid[ord[j]];
    }
    strides_of(sg, gr, pst);
    for (size_t j = 0; j < gr; j++) pcoef[ord[j]] = pst[j];
}

/* the codes of rows [r0, r1) (axis 0; rank 0: the one element), row-major; used: padding map */
static qf_status read_codes(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, unsigned char *out, unsigned char *used) {
    int ei = qf_find_entry(f, d->codes_tensor);
    if (ei < 0) return QF_E_COMPONENT_MISSING;
    const qf_entry *e = &f->entries[ei];
    size_t rank = d->rank;
    uint64_t rowsize = 1;
    for (size_t a = 1; a < rank; a++) rowsize *= d->shape[a];
    if (d->layout != QF_LAYOUT_CANONICAL) {
        unsigned char *q = unpack_device(f, d, e);
        if (!q) return QF_E_SHAPE_UNREPRESENTABLE;
        memcpy(out, q + r0 * rowsize, (size_t)((r1 - r0) * rowsize));
        free(q);
        return QF_OK;
    }
    unpacker u = {0};
    u.bytes = qf_entry_bytes(f, e);
    u.nbytes = e->end - e->begin;
    u.c = d->container;
    u.b = d->bits;
    u.n = u.c / u.b;
    u.mask = (1u << u.b) - 1;
    u.lsb = d->lsb;
    u.slots = qf_uses_slots(d);
    u.used = used;
    for (unsigned s = 0; s < u.n && s < 256; s++) u.inv[s] = s;
    if (d->has_slot_order)
        for (size_t s = 0; s < d->nslot; s++) u.inv[d->slot_order[s]] = (unsigned)s;
    u.planes = d->has_planes;
    u.T = d->planes_span;
    u.perSeg = u.planes ? qf_ceil_div(u.T, u.n) : 0;
    uint64_t stored[64], lst[64], coef[64];
    unsigned order[64], inv[64];
    for (size_t j = 0; j < rank; j++) {
        order[j] = d->has_order ? d->order[j] : (unsigned)j;
        inv[order[j]] = (unsigned)j;
        stored[j] = d->shape[order[j]];
    }
    uint64_t numel = 1;
    for (size_t a = 0; a < rank; a++) numel *= d->shape[a];
    uint64_t L = d->axis_null ? numel : stored[d->axis];
    u.L = L;
    int of = 0;
    uint64_t W = qf_words_per_row(d, L, 1, &of);
    uint64_t rowaxis = 0, stride = 1;
    if (d->axis_null) {
        strides_of(stored, rank, lst);
        for (size_t a = 0; a < rank; a++) coef[a] = lst[inv[a]];
    } else {
        uint64_t comp[64], cs[64] = {0};
        memcpy(comp, stored, rank * sizeof(uint64_t));
        comp[d->axis] = W;
        strides_of(comp, rank, cs);
        rowaxis = order[d->axis];
        stride = cs[d->axis];
        for (size_t a = 0; a < rank; a++) coef[a] = a == rowaxis ? 0 : cs[inv[a]];
    }
    uint64_t idx[64] = {0};
    idx[0] = r0;
    uint64_t total = rank ? (r1 - r0) * rowsize : 1;
    for (uint64_t k = 0; k < total; k++) {
        uint64_t acc = 0;
        for (size_t a = 0; a < rank; a++) acc += idx[a] * coef[a];
        if (d->axis_null) out[k] = (unsigned char)code_at(&u, acc, 0, 1);
        else out[k] = (unsigned char)code_at(&u, idx[rowaxis], acc, stride);
        for (size_t a = rank; a-- > 0;) {
            if (++idx[a] < (a == 0 ? r1 : d->shape[a])) break;
            idx[a] = a == 0 ? r0 : 0;
        }
    }
    return QF_OK;
}

/* ------------------------------------------------------------------ the fused kernel (kernel.c) */
/* Where the kernel covers a decode (canonical layout, rank >= 1, elements of at most 8 bits),
 * the decode is planned as qformat/decode.py plans it for the same kernel: the codes as rows of
 * packed bytes (byte containers with 1, 2, 4 or 8 whole codes per byte, planes included) or else
 * unpacked one per byte; a 256-entry byte table; each parameter's cells as CONST / BLOCK / FLAT
 * / COLS over the rows' own cells; a two-level parameter's rows decoded first (the same way, or
 * by the general path).  Only the bytes of the requested rows are read (SPEC.md 8.4).  Anything
 * else -- and any error, which the general path then reports with its own message -- takes the
 * general path below, which is also the reference the kernel's bits are tested against.
 * Nothing here is shared between calls: threads may decode rows of one file at once. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
#define QF_FAST_LE (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__)
#elif defined(_M_X64) || defined(_M_IX86) || defined(_M_ARM64)
#define QF_FAST_LE 1
#else
#define QF_FAST_LE 0 /* the kernel reads parameter values in host order */
#endif

enum { FAST_OK = 0, FAST_NO = 1 };
/* a float32 output from this many bytes per call is written with non-temporal stores where the kernel can */
#define QF_STREAM_FROM ((size_t)16 << 20)

/* a decode's scratch: grown as needed and kept from one chunk to the next (one allocation per
 * buffer per call, whatever the number of chunks), owned by the call (no state is shared) */
typedef struct fast_mem {
    void *rowoff[3], *colidx[3], *gidx[3], *vals[3], *bt, *codes;
    size_t cap_rowoff[3], cap_colidx[3], cap_gidx[3], cap_vals[3], cap_bt, cap_codes;
    int nested_ok[3];         /* the encoded parameter of this slot was checked whole (nested_whole_ok) */
} fast_mem;

static void *fast_grow(void **p, size_t *cap, size_t need) {
    if (need > *cap) {
        void *q = realloc(*p, need ? need : 1);
        if (!q) return NULL;
        *p = q;
        *cap = need;
    }
    return *p;
}
#define FAST_GROW(m, name, k, n, T) ((T *)fast_grow(&(m)->name[k], &(m)->cap_##name[k], (size_t)(n) * sizeof(T)))
#define FAST_GROW1(m, name, n, T) ((T *)fast_grow(&(m)->name, &(m)->cap_##name, (size_t)(n) * sizeof(T)))

static void fast_free(fast_mem *m) {
    for (int k = 0; k < 3; k++) { free(m->rowoff[k]); free(m->colidx[k]); free(m->gidx[k]); free(m->vals[k]); }
    free(m->bt);
    free(m->codes);
}

/* the region: R rows of C values; the first row is row g0 of all rows of Cfull values, its first column c0 */
typedef struct fast_geo { uint64_t R, C, Cfull, c0, g0, r0, r1; } fast_geo;

/* values per chunk of a large decode: each chunk's temporaries (unpacked codes, two-level
 * parameter values, row offsets) stay small and in cache */
#define QF_CHUNK_VALUES ((uint64_t)1 << 18)

static int fast_rows(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, int outkind, void *out, size_t depth);
static qf_status decode_rows_depth(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, float *x, size_t depth,
                                   qf_str tensor, qf_error *err);

/* SPEC.md 1.2.1, 10.6: a nested descriptor is decode-time checked whole -- every code of its codes
 * component and every value of its group indexes, nested descriptors' included -- whether or not
 * an element of the outer tensor uses that cell.  1 when all pass (the kernel then decodes only
 * the cells the region uses); 0 sends the decode to the general path, which decodes the nested
 * descriptor whole and reports the first failure in its order. */
static int nested_whole_ok(const qf_file *f, const qf_desc *d) {
    uint64_t numel = 1;
    for (size_t a = 0; a < d->rank; a++) numel *= d->shape[a];
    if (numel) {
        float lut0[256];
        unsigned valid0 = 0;
        /* a canonical layout's codes are read without fail, each masked to `bits` bits: where the
         * codebook holds every such code, no code can be past its end and nothing need be read */
        if (d->layout == QF_LAYOUT_CANONICAL && d->bits >= 1 && d->bits <= 8) {
            if (element_table(f, d, lut0, &valid0)) return 0;
            if (valid0 >= (1u << d->bits)) numel = 0;
        }
    }
    if (numel) {
        if (numel > SIZE_MAX) return 0;
        unsigned char *codes = (unsigned char *)malloc((size_t)numel);
        float lut[256];
        unsigned valid = 0;
        int ok = codes && !read_codes(f, d, 0, d->rank ? d->shape[0] : 1, codes, NULL) && !element_table(f, d, lut, &valid);
        for (uint64_t k = 0; ok && k < numel; k++) ok = codes[k] < valid;
        free(codes);
        if (!ok) return 0;
    }
    for (int r = 0; r < 3; r++) {
        const qf_param *p = &d->p[r];
        if (!p->present) continue;
        if (p->has_index) {
            int ei = qf_find_entry(f, p->index_tensor);
            if (ei < 0 || p->index_axis >= d->rank) return 0;
            const qf_entry *e = &f->entries[ei];
            uint64_t S = d->shape[p->index_axis];
            if (S > (e->end - e->begin) / dt_bytes(e->dtype)) return 0;
            int kind = dt_kind(e->dtype);
            for (uint64_t k = 0; k < S; k++) {
                int64_t x = int_kind(kind, qf_entry_bytes(f, e), k);
                if (x < 0 || (uint64_t)x >= p->index_count) return 0;
            }
        }
        if (p->encoded && !nested_whole_ok(f, p->encoded)) return 0;
    }
    return 1;
}

/* one parameter for the kernel: cells of the region's rows, values widened only where needed */
static int fast_param(const qf_file *f, const qf_desc *d, const qf_param *p, const fast_geo *g, qfk_param *kp, size_t *vlen,
                      size_t *ncol, fast_mem *m, int slot, size_t depth) {
    size_t rank = d->rank, L = rank - 1;
    uint64_t grid[64], pcoef[64];
    size_t gr = 0;
    if (qf_grid_shape(p, d, grid, &gr) || gr == 0) return FAST_NO;
    int64_t *ro = FAST_GROW(m, rowoff, slot, g->R, int64_t);
    if (!ro) return FAST_NO;
    kp->op = p->op == QF_OP_SUB ? QFK_OP_SUB : p->op == QF_OP_MUL ? QFK_OP_MUL : p->op == QF_OP_DIV ? QFK_OP_DIV : QFK_OP_ADD;
    kp->colidx = NULL;
    *ncol = 0;
    if (p->flat) {
        for (uint64_t k = 0; k < g->R; k++) ro[k] = (int64_t)((g->g0 + k) * g->Cfull + g->c0);
        kp->mode = QFK_MODE_FLAT;
        kp->a = 0;
        kp->b = (int64_t)p->flat_size;
    } else {
        cell_coefficients(p, grid, gr, pcoef);
        /* a group index: the positions the region uses, range-checked (else the general path reports it) */
        const int64_t *gidx = NULL;
        uint64_t glo = 0;
        unsigned ax = p->index_axis;
        if (p->has_index) {
            int ei = qf_find_entry(f, p->index_tensor);
            if (ei < 0 || ax >= rank) return FAST_NO;
            const qf_entry *e = &f->entries[ei];
            uint64_t ghi;
            if (ax == L) { glo = g->c0; ghi = g->c0 + g->C; }
            else if (ax == 0) { glo = g->r0; ghi = g->r1; }
            else { glo = 0; ghi = d->shape[ax]; }
            if (ghi > (e->end - e->begin) / dt_bytes(e->dtype)) return FAST_NO;
            int64_t *gi = FAST_GROW(m, gidx, slot, ghi - glo + 1, int64_t);
            if (!gi) return FAST_NO;
            int kind = dt_kind(e->dtype);
            for (uint64_t k = glo; k < ghi; k++) {
                gi[k - glo] = int_kind(kind, qf_entry_bytes(f, e), k);
                if (gi[k - glo] < 0 || (uint64_t)gi[k - glo] >= p->index_count) return FAST_NO;
            }
            gidx = gi;
        }
        /* rows: the leading axes' cells (odometer over axes 0 .. rank-2) */
        uint64_t idx[64] = {0};
        idx[0] = g->r0;
        for (uint64_t k = 0; k < g->R; k++) {
            uint64_t cell = 0;
            for (size_t a = 0; a + 1 < rank; a++) {
                uint64_t c;
                if (p->has_index && a == ax) c = (uint64_t)gidx[idx[a] - glo];
                else c = p->size[a] ? idx[a] / p->size[a] : 0;
                cell += c * pcoef[a];
            }
            ro[k] = (int64_t)cell;
            for (size_t a = rank - 1; a-- > 0;) {
                if (++idx[a] < (a == 0 ? g->r1 : d->shape[a])) break;
                idx[a] = a == 0 ? g->r0 : 0;
            }
        }
        /* the last axis */
        uint64_t cl = pcoef[L], s = p->has_index && ax == L ? 0 : p->size[L];
        if (p->has_index && ax == L) {
            int64_t *ci = FAST_GROW(m, colidx, slot, g->C, int64_t);
            if (!ci) return FAST_NO;
            for (uint64_t c = 0; c < g->C; c++) ci[c] = gidx[c] * (int64_t)cl;
            kp->mode = QFK_MODE_COLS;
        } else if (s == 0 || g->c0 / s == (g->c0 + g->C - 1) / s) {
            uint64_t add = s ? g->c0 / s * cl : 0;
            for (uint64_t k = 0; k < g->R; k++) ro[k] += (int64_t)add;
            kp->mode = QFK_MODE_CONST;
        } else if (cl == 1) {
            for (uint64_t k = 0; k < g->R; k++) ro[k] += (int64_t)(g->c0 / s);
            kp->mode = QFK_MODE_BLOCK;
            kp->a = (int64_t)(g->c0 % s);
            kp->b = (int64_t)s;
        } else {
            int64_t *ci = FAST_GROW(m, colidx, slot, g->C, int64_t);
            if (!ci) return FAST_NO;
            for (uint64_t c = 0; c < g->C; c++) ci[c] = (int64_t)((g->c0 + c) / s * cl);
            kp->mode = QFK_MODE_COLS;
        }
        if (kp->mode == QFK_MODE_COLS) {
            kp->colidx = (const int64_t *)m->colidx[slot];
            *ncol = (size_t)g->C;
        }
        if (kp->mode != QFK_MODE_BLOCK) { kp->a = 0; kp->b = 1; }
    }
    kp->rowoff = ro;
    int64_t lo, hi;
    if (qfk_param_range(kp, (qfk_int)g->R, (qfk_int)g->C, *ncol, &lo, &hi) < 0) return FAST_NO;
    /* the values: plain binary32 / binary16 / bfloat16 cells as stored; anything else widened
     * (or decoded: a two-level parameter) for the cells [base, ...) the rows use */
    int64_t base = 0;
    if (p->encoded) {
        const qf_desc *ed = p->encoded;
        if (ed->rank != gr || ed->rank == 0) return FAST_NO;
        if (!m->nested_ok[slot]) {
            if (!nested_whole_ok(f, ed)) return FAST_NO;
            m->nested_ok[slot] = 1;
        }
        for (size_t a = 0; a < gr; a++)
            if (ed->shape[a] != grid[a]) return FAST_NO;
        uint64_t st0 = 1;
        for (size_t a = 1; a < gr; a++) st0 *= grid[a];
        if (st0 == 0) return FAST_NO;
        uint64_t elo = (uint64_t)lo / st0, ehi = (uint64_t)hi / st0 + 1, nv = (ehi - elo) * st0;
        if (ehi > ed->shape[0]) return FAST_NO;
        float *v = FAST_GROW(m, vals, slot, nv, float);
        if (!v) return FAST_NO;
        if (fast_rows(f, ed, elo, ehi, QFK_OUT_F32, v, depth + 1) != FAST_OK) {
            qf_error e2;
            if (decode_rows_depth(f, ed, elo, ehi, v, depth + 1, (qf_str){"", 0}, &e2)) return FAST_NO;
        }
        if (ed->dtype)
            for (uint64_t k = 0; k < nv; k++) v[k] = qf_round_to(v[k], ed->dtype);
        base = (int64_t)(elo * st0);
        kp->v = v;
        kp->vkind = QFK_VAL_F32;
        *vlen = (size_t)nv;
    } else {
        int ei = qf_find_entry(f, p->tensor);
        if (ei < 0) return FAST_NO;
        const qf_entry *e = &f->entries[ei];
        uint64_t count = (e->end - e->begin) / dt_bytes(e->dtype);
        if ((uint64_t)hi >= count) return FAST_NO;
        int kind = dt_kind(e->dtype);
        if (kind == K_F32 || kind == K_F16 || kind == K_BF16) {
            kp->v = qf_entry_bytes(f, e);
            kp->vkind = kind == K_F32 ? QFK_VAL_F32 : kind == K_F16 ? QFK_VAL_F16 : QFK_VAL_BF16;
            *vlen = (size_t)count;
        } else {
            if (kind == K_OTHER) return FAST_NO;
            uint64_t nv = (uint64_t)(hi - lo) + 1;
            float *v = FAST_GROW(m, vals, slot, nv, float);
            if (!v) return FAST_NO;
            for (uint64_t k = 0; k < nv; k++) v[k] = widen_kind(kind, qf_entry_bytes(f, e), (uint64_t)lo + k);
            base = lo;
            kp->v = v;
            kp->vkind = QFK_VAL_F32;
            *vlen = (size_t)nv;
        }
    }
    if (base) {
        if (kp->mode == QFK_MODE_FLAT) kp->a += base;
        else if (kp->mode == QFK_MODE_COLS) {
            int64_t cmin = INT64_MAX, *ci = (int64_t *)m->colidx[slot];
            for (uint64_t c = 0; c < g->C; c++) cmin = ci[c] < cmin ? ci[c] : cmin;
            for (uint64_t c = 0; c < g->C; c++) ci[c] -= cmin;
            for (uint64_t k = 0; k < g->R; k++) ro[k] -= base - cmin;
        } else
            for (uint64_t k = 0; k < g->R; k++) ro[k] -= base;
    }
    return FAST_OK;
}

/* codes [p0, p0 + n) of one row of byte containers holding a bit stream (codes straddle bytes) */
static void unpack_stream_row(const unsigned char *row, uint64_t p0, uint64_t n, unsigned b, int lsb, unsigned char *o) {
    const unsigned mask = (1u << b) - 1;
    const uint64_t nb = qf_ceil_div((p0 + n) * b, 8); /* the row's bytes the codes use */
    uint64_t c = 0;
    /* two bytes at a time where the second is one of them */
    if (lsb)
        for (; c < n && ((p0 + c) * b) / 8 + 1 < nb; c++) {
            uint64_t k0 = (p0 + c) * b, q = k0 / 8;
            o[c] = (unsigned char)((((unsigned)row[q] | (unsigned)row[q + 1] << 8) >> (k0 % 8)) & mask);
        }
    else
        for (; c < n && ((p0 + c) * b) / 8 + 1 < nb; c++) {
            uint64_t k0 = (p0 + c) * b, q = k0 / 8;
            o[c] = (unsigned char)((((unsigned)row[q] << 8 | row[q + 1]) >> (16 - k0 % 8 - b)) & mask);
        }
    for (; c < n; c++) { /* the last codes: within the last byte */
        uint64_t k0 = (p0 + c) * b, q = k0 / 8;
        unsigned t = (unsigned)(k0 % 8);
        o[c] = (unsigned char)((lsb ? row[q] >> t : row[q] >> (8 - t - b)) & mask);
    }
}

/* rows [r0, r1) of axis 0 by the kernel into out (outkind), or FAST_NO; stream: see kernel.h */
static int fast_chunk(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, int outkind, void *out, size_t depth, int stream,
                      fast_mem *m) {
#ifdef QF_NO_KERNEL /* a build with the general path only (tests compare the two) */
    return FAST_NO;
#endif
    if (!QF_FAST_LE || d->rank == 0 || d->rank > 64 || d->layout != QF_LAYOUT_CANONICAL || d->bits < 1 || d->bits > 8 || r1 <= r0)
        return FAST_NO;
    if ((uintptr_t)out % (outkind == QFK_OUT_F32 ? 4u : 2u)) return FAST_NO;
    size_t rank = d->rank;
    fast_geo g;
    g.r0 = r0;
    g.r1 = r1;
    g.Cfull = d->shape[rank - 1];
    if (rank == 1) {
        g.R = 1; g.C = r1 - r0; g.c0 = r0; g.g0 = 0;
    } else {
        uint64_t mid = 1;
        for (size_t a = 1; a + 1 < rank; a++) mid *= d->shape[a];
        g.R = (r1 - r0) * mid; g.C = g.Cfull; g.c0 = 0; g.g0 = r0 * mid;
    }
    if (g.R == 0 || g.C == 0) return FAST_NO;
    if (g.R > (uint64_t)PTRDIFF_MAX / 8 || g.C > (uint64_t)PTRDIFF_MAX / 8 || g.R > SIZE_MAX / 8 / g.C) return FAST_NO;
    int ei = qf_find_entry(f, d->codes_tensor);
    if (ei < 0) return FAST_NO;
    const qf_entry *ce = &f->entries[ei];
    const unsigned char *bytes = qf_entry_bytes(f, ce);
    uint64_t nbytes = ce->end - ce->begin;
    float lut[256];
    unsigned valid = 0;
    if (element_table(f, d, lut, &valid)) return FAST_NO;
    unsigned b = d->bits, mask = (1u << b) - 1, full = 1u << b;
    qfk_job j;
    qfk_lens lens;
    memset(&j, 0, sizeof j);
    memset(&lens, 0, sizeof lens);
    int of = 0, rc = FAST_NO;
    unsigned inv[8];
    /* codes: the packed bytes where one byte holds whole codes of one row (qformat.regions.byte_lookup) */
    unsigned n = d->container == 8 ? 8 / b : 0;
    int direct = d->container == 8 && !d->has_order && qf_uses_slots(d) && (n == 1 || n == 2 || n == 4 || n == 8) && g.C % n == 0 &&
                 g.c0 % n == 0;
    if (direct && d->has_planes) {
        uint64_t t = d->planes_span;
        direct = !d->axis_null && d->axis == rank - 1 && t && t % n == 0 && g.C % t == 0 && g.c0 % t == 0 && QFK_TILE % t == 0;
        if (direct) j.span = (qfk_int)t;
    } else if (direct && !d->axis_null && d->axis != rank - 1)
        direct = 0;
    if (direct) {
        uint64_t start, stride;
        if (d->axis_null) { start = (g.g0 * g.Cfull + g.c0) / n; stride = g.Cfull / n; }
        else {
            uint64_t W = qf_words_per_row(d, g.Cfull, 1, &of);
            if (of) goto done;
            start = g.g0 * W + g.c0 / n;
            stride = W;
        }
        if (start > nbytes || (g.R - 1) * stride + g.C / n > nbytes - start) goto done;
        for (unsigned s = 0; s < n; s++) inv[s] = s;
        if (d->has_slot_order) {
            if (d->nslot != n) goto done;
            for (size_t s = 0; s < d->nslot; s++) inv[d->slot_order[s]] = (unsigned)s;
        }
        float *bt = FAST_GROW1(m, bt, 256 * (size_t)n, float);
        if (!bt) goto done;
        unsigned char bad[256];
        int anybad = 0;
        for (unsigned v = 0; v < 256; v++) {
            bad[v] = 0;
            for (unsigned k = 0; k < n; k++) {
                unsigned s = inv[k], shift = d->lsb ? s * b : 8 - (s + 1) * b, code = (v >> shift) & mask;
                bt[v * n + k] = lut[code];
                if (code >= valid) bad[v] = 1, anybad = 1;
            }
        }
        j.codes = bytes + start;
        j.stride = (qfk_int)stride;
        j.n = (int)n;
        j.bt = bt;
        lens.codes = (size_t)(nbytes - start);
        lens.bt = 256 * (size_t)n * sizeof(float);
        if (anybad) /* a codebook shorter than 2^bits: a code past its end is the general path's error */
            for (uint64_t r = 0; r < g.R; r++)
                for (uint64_t k = 0; k < g.C / n; k++)
                    if (bad[j.codes[r * stride + k]]) goto done;
    } else {
        /* codes unpacked one per byte: rows of a byte container along the last axis here, anything else by read_codes */
        unsigned char *codes = FAST_GROW1(m, codes, g.R * g.C, unsigned char);
        if (!codes) goto done;
        if (d->container == 8 && !d->has_order && !d->has_planes && !d->axis_null && d->axis == rank - 1) {
            uint64_t W = qf_words_per_row(d, g.Cfull, 1, &of);
            unsigned ns = qf_uses_slots(d) ? 8 / b : 0;
            if (of) goto done;
            for (unsigned s = 0; s < 8; s++) inv[s] = s;
            if (d->has_slot_order) {
                if (d->nslot != ns || ns > 8) goto done;
                for (size_t s = 0; s < d->nslot; s++) inv[d->slot_order[s]] = (unsigned)s;
            }
            if ((g.g0 + g.R - 1) * W + (ns ? qf_ceil_div(g.c0 + g.C, ns) : qf_ceil_div((g.c0 + g.C) * b, 8)) > nbytes) goto done;
            for (uint64_t r = 0; r < g.R; r++) {
                const unsigned char *row = bytes + (g.g0 + r) * W;
                unsigned char *o = codes + r * g.C;
                if (ns) {
                    for (uint64_t c = 0; c < g.C; c++) {
                        uint64_t pos = g.c0 + c;
                        unsigned s = inv[pos % ns], shift = d->lsb ? s * b : 8 - (s + 1) * b;
                        o[c] = (unsigned char)((row[pos / ns] >> shift) & mask);
                    }
                } else
                    unpack_stream_row(row, g.c0, g.C, b, d->lsb, o);
            }
        } else if (read_codes(f, d, r0, r1, codes, NULL))
            goto done;
        if (valid < full)
            for (uint64_t k = 0; k < g.R * g.C; k++)
                if (codes[k] >= valid) goto done;
        float *bt = FAST_GROW1(m, bt, 256, float);
        if (!bt) goto done;
        memcpy(bt, lut, sizeof lut);
        j.codes = codes;
        j.stride = (qfk_int)g.C;
        j.n = 1;
        j.bt = bt;
        lens.codes = (size_t)(g.R * g.C);
        lens.bt = 256 * sizeof(float);
    }
    for (int r = 0; r < 3; r++) {
        const qf_param *p = &d->p[r];
        if (!p->present) continue;
        int k = j.nparams;
        if (fast_param(f, d, p, &g, &j.p[k], &lens.values[k], &lens.colidx[k], m, k, depth)) goto done;
        lens.rowoff[k] = (size_t)g.R;
        j.nparams++;
    }
    j.R = (qfk_int)g.R;
    j.C = (qfk_int)g.C;
    j.outkind = outkind;
    j.out = out;
    lens.out = (size_t)(g.R * g.C) * (outkind == QFK_OUT_F32 ? 4 : 2);
    j.stream = stream;
    if (qfk_check(&j, &lens)) goto done;
    qfk_run(&j, 0, j.R, qfk_cpu_level());
    rc = FAST_OK;
done:
    return rc;
}

/* rows [r0, r1) by the kernel, in chunks of whole rows of axis 0 (the same bits: every value's
 * steps are the same whatever the chunk), or FAST_NO (nothing was decoded or part was: the
 * general path then decodes the whole again) */
static int fast_rows(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, int outkind, void *out, size_t depth) {
    uint64_t rowsize = 1;
    for (size_t a = 1; a < d->rank; a++) rowsize *= d->shape[a];
    size_t item = outkind == QFK_OUT_F32 ? 4 : 2;
    int stream = outkind == QFK_OUT_F32 && d->rank && (r1 - r0) * rowsize * item >= QF_STREAM_FROM;
    uint64_t step = d->rank > 1 && rowsize ? QF_CHUNK_VALUES / rowsize : 0;
    if (step < 1) step = 1;
    if (d->rank < 2) step = r1 - r0;
    fast_mem m;
    int rc = FAST_OK;
    memset(&m, 0, sizeof m);
    for (uint64_t c = r0; c < r1 && rc == FAST_OK; c += step) {
        uint64_t e = r1 - c < step ? r1 : c + step;
        rc = fast_chunk(f, d, c, e, outkind, (unsigned char *)out + (c - r0) * rowsize * item, depth, stream, &m);
    }
    fast_free(&m);
    return rc;
}

/* ------------------------------------------------------------------ decode */
static const char *const ROLE_NAMES[3] = {"zero", "scale", "bias"};

/* marlin_dense: stored scale values (row-major) -> natural order (11.4 "Scales") */
static void marlin_scales(const qf_desc *d, float *v, uint64_t n) {
    uint64_t g = d->p[QF_ROLE_SCALE].size[1];
    int grouped = g != 0 && g < d->shape[1];
    unsigned run = grouped ? 64 : 32, sp[64];
    static const unsigned single[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    for (unsigned m = 0; m < run; m++) sp[m] = grouped ? 8 * (m % 8) + m / 8 : 2 * (m / 8) + single[m % 8];
    float tmp[64];
    for (uint64_t u = 0; u + run <= n; u += run) {
        for (unsigned m = 0; m < run; m++) tmp[sp[m]] = v[u + m];
        memcpy(v + u, tmp, run * sizeof(float));
    }
}

static qf_status decode_whole(const qf_file *f, const qf_desc *d, float **out, uint64_t *n, qf_str tensor, qf_error *err);

/* the parameter's values V (stored order for a plain tensor, logical order for an encoded one) */
static qf_status param_values(const qf_file *f, const qf_desc *d, const qf_param *p, size_t depth, float **v, uint64_t *n,
                              qf_str tensor, qf_error *err) {
    if (p->encoded) {
        qf_status s = decode_whole(f, p->encoded, v, n, tensor, err);
        if (s) return s;
        if (p->encoded->dtype)
            for (uint64_t k = 0; k < *n; k++) (*v)[k] = qf_round_to((*v)[k], p->encoded->dtype);
        return QF_OK;
    }
    int ei = qf_find_entry(f, p->tensor);
    if (ei < 0) return QF_E_COMPONENT_MISSING;
    *v = widen_all(f, &f->entries[ei], n);
    if (!*v) {
        qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory widening a parameter");
        return QF_E_SHAPE_UNREPRESENTABLE;
    }
    if (depth == 0 && p->role == QF_ROLE_SCALE && d->layout == QF_LAYOUT_MARLIN) marlin_scales(d, *v, *n);
    return QF_OK;
}

static qf_status decode_rows_depth(const qf_file *f, const qf_desc *d, uint64_t r0, uint64_t r1, float *x, size_t depth,
                                   qf_str tensor, qf_error *err) {
    size_t rank = d->rank;
    uint64_t rowsize = 1;
    for (size_t a = 1; a < rank; a++) rowsize *= d->shape[a];
    uint64_t total = rank ? (r1 - r0) * rowsize : 1;
    if (total == 0) return QF_OK;
    unsigned char *codes = (unsigned char *)malloc((size_t)total);
    if (!codes) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    qf_status s = read_codes(f, d, r0, r1, codes, NULL);
    float lut[256];
    unsigned valid = 0;
    if (!s) s = element_table(f, d, lut, &valid);
    if (s) {
        free(codes);
        qf_set_error(err, s, "tensor \"%.*s\": cannot read its codes", (int)(tensor.n > 100 ? 100 : tensor.n), tensor.p);
        return s;
    }
    for (uint64_t k = 0; k < total; k++) {
        if (codes[k] >= valid) {
            qf_set_error(err, QF_E_CODE_OUT_OF_RANGE, "tensor \"%.*s\", field codes.tensor: code %u is past the end of a %u-entry codebook",
                         (int)(tensor.n > 100 ? 100 : tensor.n), tensor.p, codes[k], valid);
            free(codes);
            return QF_E_CODE_OUT_OF_RANGE;
        }
        x[k] = lut[codes[k]];
    }
    free(codes);
    uint64_t lst[64];
    strides_of(d->shape, rank, lst);
    for (int r = 0; r < 3; r++) {
        const qf_param *p = &d->p[r];
        if (!p->present) continue;
        int64_t *gidx = NULL;
        if (p->has_index) {
            int ei = qf_find_entry(f, p->index_tensor);
            const qf_entry *e = &f->entries[ei];
            uint64_t S = d->shape[p->index_axis];
            gidx = (int64_t *)malloc((size_t)(S ? S : 1) * sizeof(int64_t));
            if (!gidx) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
            uint64_t lo = p->index_axis == 0 && rank ? r0 : 0, hi = p->index_axis == 0 && rank ? r1 : S;
            int kind = dt_kind(e->dtype);
            for (uint64_t k = 0; k < S; k++) gidx[k] = int_kind(kind, qf_entry_bytes(f, e), k);
            for (uint64_t k = lo; k < hi; k++)
                if (gidx[k] < 0 || (uint64_t)gidx[k] >= p->index_count) {
                    qf_set_error(err, QF_E_GROUP_INDEX_RANGE, "tensor \"%.*s\", field %s.blocks.index.tensor: group index at position %llu is outside 0..%llu",
                                 (int)(tensor.n > 100 ? 100 : tensor.n), tensor.p, ROLE_NAMES[r], (unsigned long long)k, (unsigned long long)(p->index_count - 1));
                    free(gidx);
                    return QF_E_GROUP_INDEX_RANGE;
                }
        }
        float *v = NULL;
        uint64_t nv = 0;
        s = param_values(f, d, p, depth, &v, &nv, tensor, err);
        if (s) { free(gidx); free(v); return s; }
        /* per logical axis: the cell contribution coefficient */
        uint64_t grid[64], pcoef[64];
        size_t gr = 0;
        qf_grid_shape(p, d, grid, &gr);
        if (!p->flat) cell_coefficients(p, grid, gr, pcoef);
        uint64_t idx[64] = {0};
        idx[0] = rank ? r0 : 0;
        int op = p->op;
        for (uint64_t k = 0; k < total; k++) {
            uint64_t cell = 0;
            if (p->flat) {
                uint64_t fl = 0;
                for (size_t a = 0; a < rank; a++) fl += idx[a] * lst[a];
                cell = fl / p->flat_size;
            } else
                for (size_t a = 0; a < rank; a++) {
                    uint64_t g;
                    if (p->has_index && a == p->index_axis) g = (uint64_t)gidx[idx[a]];
                    else g = p->size[a] ? idx[a] / p->size[a] : 0;
                    cell += g * pcoef[a];
                }
            float pv = cell < nv ? v[cell] : NAN;
            switch (op) {
            case QF_OP_SUB: x[k] = x[k] - pv; break;
            case QF_OP_MUL: x[k] = x[k] * pv; break;
            case QF_OP_DIV: x[k] = x[k] / pv; break;
            default: x[k] = x[k] + pv; break;
            }
            for (size_t a = rank; a-- > 0;) {
                if (++idx[a] < (a == 0 ? r1 : d->shape[a])) break;
                idx[a] = a == 0 ? r0 : 0;
            }
        }
        free(v);
        free(gidx);
    }
    (void)depth;
    return QF_OK;
}

static qf_status decode_whole_depth(const qf_file *f, const qf_desc *d, float **out, uint64_t *n, size_t depth, qf_str tensor, qf_error *err) {
    uint64_t numel = 1;
    for (size_t a = 0; a < d->rank; a++) numel *= d->shape[a];
    *n = numel;
    *out = (float *)malloc((size_t)(numel ? numel : 1) * sizeof(float));
    if (!*out) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    if (numel && d->rank && fast_rows(f, d, 0, d->shape[0], QFK_OUT_F32, *out, depth) == FAST_OK) return QF_OK;
    return decode_rows_depth(f, d, 0, d->rank ? d->shape[0] : 1, *out, depth, tensor, err);
}

static qf_status decode_whole(const qf_file *f, const qf_desc *d, float **out, uint64_t *n, qf_str tensor, qf_error *err) {
    /* nested descriptors are never in a device layout (11.1 rule 1): depth > 0 */
    return decode_whole_depth(f, d, out, n, 1, tensor, err);
}

qf_status qf_decode_desc(const qf_file *f, const qf_desc *d, uint64_t row0, uint64_t nrows, float *out, qf_str tensor, qf_error *err) {
    if (d->rank && nrows && fast_rows(f, d, row0, row0 + nrows, QFK_OUT_F32, out, 0) == FAST_OK) return QF_OK;
    return decode_rows_depth(f, d, row0, d->rank ? row0 + nrows : 1, out, 0, tensor, err);
}

/* a binary32 value of the logical dtype (rounded already) in the output dtype */
static void put_out(int dt, void *dst, uint64_t k, float v) {
    if (dt == QFK_OUT_F32) memcpy((unsigned char *)dst + 4 * k, &v, 4);
    else {
        uint16_t h = dt == QFK_OUT_F16 ? qf_f32_to_f16(v) : qf_f32_to_bf16(v);
        memcpy((unsigned char *)dst + 2 * k, &h, 2);
    }
}

qf_status qf_decode_into(const qf_file *f, const qf_desc *d, uint64_t row0, uint64_t nrows, int dt, void *dst, qf_str tensor,
                         qf_error *err) {
    uint64_t count = 1;
    for (size_t a = 1; a < d->rank; a++) count *= d->shape[a];
    count *= d->rank ? nrows : 1;
    if (count == 0) return QF_OK;
    if (d->rank && (d->dtype == 0 || d->dtype == dt) && fast_rows(f, d, row0, row0 + nrows, dt, dst, 0) == FAST_OK) return QF_OK;
    if (d->rank && d->dtype != 0 && d->dtype != dt) { /* the logical dtype's values by the kernel, then the output dtype */
        uint16_t *h = (uint16_t *)malloc((size_t)count * 2);
        int ok = h && fast_rows(f, d, row0, row0 + nrows, d->dtype, h, 0) == FAST_OK;
        if (ok)
            for (uint64_t k = 0; k < count; k++) put_out(dt, dst, k, d->dtype == 1 ? qf_f16_to_f32(h[k]) : qf_bf16_to_f32(h[k]));
        free(h);
        if (ok) return QF_OK;
    }
    /* the general path: binary32 values, rounded to the logical dtype (10.3), then the output dtype */
    float *tmp = dt == QFK_OUT_F32 && (uintptr_t)dst % 4 == 0 ? (float *)dst : (float *)malloc((size_t)count * sizeof(float));
    if (!tmp) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    qf_status s = decode_rows_depth(f, d, row0, d->rank ? row0 + nrows : 1, tmp, 0, tensor, err);
    if (!s)
        for (uint64_t k = 0; k < count; k++) put_out(dt, dst, k, qf_round_to(tmp[k], d->dtype));
    if ((void *)tmp != dst) free(tmp);
    return s;
}

/* ------------------------------------------------------------------ payload checks (12.4) */
qf_status qf_check_payload(const qf_file *f, const qf_desc *d, qf_str tensor, const char *prefix, size_t depth, qf_probs *out) {
    char fld[200];
    uint64_t numel = 1;
    for (size_t a = 0; a < d->rank; a++) numel *= d->shape[a];
    int ei = qf_find_entry(f, d->codes_tensor);
    const qf_entry *ce = &f->entries[ei];
    uint64_t nb = ce->end - ce->begin;
    unsigned char *codes = (unsigned char *)malloc((size_t)(numel ? numel : 1));
    unsigned char *used = d->layout == QF_LAYOUT_CANONICAL ? (unsigned char *)calloc((size_t)(nb ? nb : 1), 1) : NULL;
    if (!codes || (d->layout == QF_LAYOUT_CANONICAL && !used)) { free(codes); free(used); return QF_E_SHAPE_UNREPRESENTABLE; }
    if (numel) read_codes(f, d, 0, d->rank ? d->shape[0] : 1, codes, used);
    snprintf(fld, sizeof fld, "%scodes.tensor", prefix);
    if (used) {
        const unsigned char *b = qf_entry_bytes(f, ce);
        for (uint64_t i = 0; i < nb; i++)
            if (b[i] & ~used[i]) {
                qf_probs_add(out, QF_E_PADDING_NONZERO, tensor, 1, fld, "padding bits of the codes component are set (byte %llu)", (unsigned long long)i);
                break;
            }
    }
    float lut[256];
    unsigned valid = 0;
    element_table(f, d, lut, &valid);
    for (uint64_t k = 0; k < numel; k++)
        if (codes[k] >= valid) {
            qf_probs_add(out, QF_E_CODE_OUT_OF_RANGE, tensor, 1, fld, "a code is past the end of a %u-entry codebook", valid);
            break;
        }
    free(codes);
    free(used);
    for (int r = 0; r < 3; r++) {
        const qf_param *p = &d->p[r];
        if (!p->present) continue;
        if (p->has_index) {
            const qf_entry *e = &f->entries[qf_find_entry(f, p->index_tensor)];
            uint64_t cnt = (e->end - e->begin) / dt_bytes(e->dtype);
            int kind = dt_kind(e->dtype);
            for (uint64_t k = 0; k < cnt; k++) {
                int64_t x = int_kind(kind, qf_entry_bytes(f, e), k);
                if (x < 0 || (uint64_t)x >= p->index_count) {
                    snprintf(fld, sizeof fld, "%s%s.blocks.index.tensor", prefix, ROLE_NAMES[r]);
                    qf_probs_add(out, QF_E_GROUP_INDEX_RANGE, tensor, 1, fld, "group index %llu is outside 0..%llu", (unsigned long long)k, (unsigned long long)(p->index_count - 1));
                    break;
                }
            }
        }
        float *vals = NULL;
        uint64_t nv = 0;
        if (p->has_tensor) {
            const qf_entry *e = &f->entries[qf_find_entry(f, p->tensor)];
            snprintf(fld, sizeof fld, "%s%s.tensor", prefix, ROLE_NAMES[r]);
            const char *dn = qf_dtypes[e->dtype].name;
            if (dn[0] == 'I' || dn[0] == 'U') {
                uint64_t cnt = (e->end - e->begin) / dt_bytes(e->dtype);
                int big = 0, zero = 0, kind = dt_kind(e->dtype);
                for (uint64_t k = 0; k < cnt; k++) {
                    int64_t x = int_kind(kind, qf_entry_bytes(f, e), k);
                    if (x > (int64_t)QF_LIMIT_MAX_INT_PARAM_MAGNITUDE || x < -(int64_t)QF_LIMIT_MAX_INT_PARAM_MAGNITUDE) big = 1;
                    if (x == 0) zero = 1;
                }
                if (big) qf_probs_add(out, QF_E_PARAM_INT_RANGE, tensor, 1, fld, "an integer parameter exceeds max_int_param_magnitude");
                if (p->op == QF_OP_DIV && zero) qf_probs_add(out, QF_E_PARAM_DIVISOR_ZERO, tensor, 1, fld, "a divisor scale value is zero");
                continue;
            }
            vals = widen_all(f, e, &nv);
            if (!vals) return QF_E_SHAPE_UNREPRESENTABLE;
            if (depth == 0 && r == QF_ROLE_SCALE && d->layout == QF_LAYOUT_MARLIN) marlin_scales(d, vals, nv);
        } else {
            char sub[200];
            snprintf(sub, sizeof sub, "%s%s.encoded.", prefix, ROLE_NAMES[r]);
            size_t before = out->n;
            qf_status s = qf_check_payload(f, p->encoded, tensor, sub, depth + 1, out);
            if (s) return s;
            if (out->n > before) continue;
            qf_error e2;
            s = decode_whole(f, p->encoded, &vals, &nv, tensor, &e2);
            snprintf(fld, sizeof fld, "%s%s.encoded", prefix, ROLE_NAMES[r]);
            if (s) {
                free(vals);
                qf_probs_add(out, s, tensor, 1, fld, "%s", e2.message);
                continue;
            }
            if (p->encoded->dtype)
                for (uint64_t k = 0; k < nv; k++) vals[k] = qf_round_to(vals[k], p->encoded->dtype);
        }
        int nonfinite = 0, zero = 0;
        for (uint64_t k = 0; k < nv; k++) {
            if (!isfinite(vals[k])) nonfinite = 1;
            if (vals[k] == 0.0f) zero = 1;
        }
        free(vals);
        if (!d->allow_nonfinite && nonfinite) qf_probs_add(out, QF_E_PARAM_NONFINITE, tensor, 1, fld, "a %s value is NaN or infinite", ROLE_NAMES[r]);
        if (p->op == QF_OP_DIV && zero) qf_probs_add(out, QF_E_PARAM_DIVISOR_ZERO, tensor, 1, fld, "a divisor scale value is zero");
    }
    return QF_OK;
}
