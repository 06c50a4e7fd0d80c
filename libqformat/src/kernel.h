/* The fused decode kernel (issue 23; shared since issue 41): packed codes -> element value ->
 * parameters (zero, scale, bias, in that order) -> one round-to-nearest-even cast, in one pass.
 *
 * ONE C source for both decoders: libqformat's decode.c plans a decode and calls it, and the
 * Python package's extension qformat/kernels/_native.c is a thin CPython wrapper around it
 * (setup.py compiles this file into the extension).  No Python, no global state: every call
 * gets its level and its job, so concurrent calls on disjoint outputs are safe.
 *
 * The region is seen as R rows of C values (rows = all leading axes, C = the last axis).  A
 * byte table gives, for each of the 256 byte values, the binary32 values of the n codes that
 * byte holds (n = 1, 2, 4 or 8; element order, bit order and slot order already applied); the
 * codes are the packed bytes themselves or codes unpacked one per byte (n = 1).  A parameter's
 * binary32 values V come decoded already (two-level parameters included); the cell of (r, c) is
 *     CONST:  rowoff[r]
 *     BLOCK:  rowoff[r] + (c + a) / b          (blocks of b along the last axis)
 *     FLAT:   (rowoff[r] + c) / b - a          (flat blocks; rowoff = flat position of the row)
 *     COLS:   rowoff[r] + colidx[c]            (anything else separable: group indices, ...)
 * Every step is one binary32 operation (SPEC.md 10): compile with -ffp-contract=off, never
 * with -ffast-math.  See kernel.c for the row kernels and the runtime dispatch. */
#ifndef QF_KERNEL_H
#define QF_KERNEL_H

#include <stddef.h>
#include <stdint.h>

typedef ptrdiff_t qfk_int;

enum { QFK_OP_SUB = 0, QFK_OP_MUL = 1, QFK_OP_DIV = 2, QFK_OP_ADD = 3 };
enum { QFK_MODE_CONST = 0, QFK_MODE_BLOCK = 1, QFK_MODE_FLAT = 2, QFK_MODE_COLS = 3 };
enum { QFK_OUT_F32 = 0, QFK_OUT_F16 = 1, QFK_OUT_BF16 = 2 };
enum { QFK_LVL_GENERIC = 0, QFK_LVL_AVX2 = 1, QFK_LVL_AVX512 = 2 };
enum { QFK_NIB_NONE = 0, QFK_NIB_LSB = 1, QFK_NIB_MSB = 2 };
enum { QFK_VAL_F32 = 0, QFK_VAL_F16 = 1, QFK_VAL_BF16 = 2 };

/* Columns decoded per tile: the tile's binary32 values stay in L1 between the lookup, the
 * parameter steps and the cast.  A planes span must divide it. */
#define QFK_TILE 1024

typedef struct qfk_param {
    int op, mode, vkind; /* vkind: the values' format, QFK_VAL_F32 / QFK_VAL_F16 / QFK_VAL_BF16 */
    const void *v;       /* the values (any byte alignment; little-endian) */
    const int64_t *rowoff;
    const int64_t *colidx; /* COLS only */
    int64_t a, b;
} qfk_param;

typedef struct qfk_job {
    const uint8_t *codes;
    qfk_int stride, R, C;
    int n, nib, outkind, nparams;
    qfk_int span; /* planes (SPEC.md 7.12): segments of span values, byte j holding j, m + j, ... */
    const float *bt;
    float lut16[16];
    /* stream: a float32 output too large to stay in cache; the AVX2 and AVX-512 nibble rows
     * write lines on a 64-byte boundary with non-temporal stores (the same bits) */
    int stream;
    /* six: 6-bit codes, four in three bytes, least significant bits first (a bit stream in byte
     * containers: GGUF K-quants' sub-block scales, Q6_K's codes); n is 1 (the byte table's first 64
     * entries are the codes' values) and C a multiple of 4, so each row is C / 4 * 3 bytes */
    int six;
    qfk_param p[3];
    void *out;
} qfk_job;

/* Sizes of the buffers behind a job, for qfk_check. */
typedef struct qfk_lens {
    size_t codes;     /* bytes from j->codes */
    size_t bt;        /* bytes of the byte table */
    size_t out;       /* bytes of the output */
    size_t values[3]; /* values of each parameter (items of its vkind) */
    size_t rowoff[3]; /* entries of each rowoff */
    size_t colidx[3]; /* entries of each colidx (0 when NULL) */
} qfk_lens;

/* Checks every size, table length and the full range of parameter cells the job can touch,
 * and fills j->nib (the nibble fast path's table) from the byte table.  Returns NULL when the
 * job is safe to run, else the reason.  Memory safety never depends on the caller past this. */
const char *qfk_check(qfk_job *j, const qfk_lens *lens);

/* Runs rows [r0, r1) of a checked job at a level the CPU has (qfk_cpu_level()). */
void qfk_run(const qfk_job *j, qfk_int r0, qfk_int r1, int level);

/* The best level this CPU (and build) supports. */
int qfk_cpu_level(void);
/* "generic", "avx2", "avx512" */
const char *qfk_level_name(int level);

/* The range [lo, hi] of cells parameter p touches over R rows and C columns (ncol: entries of
 * colidx); -1 when the parameter is malformed. */
int qfk_param_range(const qfk_param *p, qfk_int R, qfk_int C, size_t ncol, int64_t *lo, int64_t *hi);

#endif
