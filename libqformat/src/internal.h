/* libqformat internals shared by the source files.  Not installed. */
#ifndef QF_INTERNAL_H
#define QF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include "qformat.h"
#include "tables_gen.h"

/* ---- overflow-checked arithmetic: each returns 1 on overflow (and leaves *r unspecified) ---- */
static inline int qf_mul_u64(uint64_t a, uint64_t b, uint64_t *r) {
    if (a != 0 && b > UINT64_MAX / a) return 1;
    *r = a * b;
    return 0;
}
static inline int qf_add_u64(uint64_t a, uint64_t b, uint64_t *r) {
    if (b > UINT64_MAX - a) return 1;
    *r = a + b;
    return 0;
}
static inline uint64_t qf_ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* ---- arena: every parse result lives here and is freed at once ---- */
typedef struct qf_arena_block { struct qf_arena_block *next; size_t used, cap; } qf_arena_block;
typedef struct qf_arena { qf_arena_block *head; } qf_arena;
void *qf_arena_alloc(qf_arena *a, size_t n); /* zeroed; NULL when out of memory */
void qf_arena_free(qf_arena *a);

/* ---- byte strings (names may hold NUL after \u0000) ---- */
typedef struct qf_str { const char *p; size_t n; } qf_str;
static inline int qf_str_eq(qf_str a, qf_str b) { return a.n == b.n && (a.n == 0 || memcmp(a.p, b.p, a.n) == 0); }
static inline int qf_str_is(qf_str a, const char *z) { size_t n = strlen(z); return a.n == n && memcmp(a.p, z, n) == 0; }
int qf_str_cmp(qf_str a, qf_str b); /* UTF-8 byte order = code point order */

/* ---- exact integers of the header (SPEC.md 1.2.1, 2.1): offsets are compared exactly, however
 * many digits they have, as decimal digit strings (a JSON integer has no leading zeros) ---- */
int qf_dec_cmp(qf_str a, qf_str b);                   /* digit strings a <=> b */
int qf_dec_is_sum(qf_str a, uint64_t add, qf_str e);  /* e == a + add */
int qf_dec_to_u64(qf_str a, uint64_t *v);             /* 0 when a >= 2^64 */

/* ---- JSON (strict: SPEC.md 1.2, 2.3 checks 6-7, 3.1, 14) ---- */
typedef enum { QJ_NULL, QJ_BOOL, QJ_NUM, QJ_STR, QJ_ARR, QJ_OBJ } qj_type;
typedef struct qj {
    qj_type t;
    int b;             /* QJ_BOOL */
    /* QJ_NUM */
    int int_lit;       /* written without fraction and exponent */
    int neg;           /* a '-' sign */
    int huge;          /* int_lit and magnitude >= 2^64 */
    uint64_t mag;      /* int_lit and !huge: the magnitude */
    double d;          /* the value rounded to binary64 (RNE, strtod) */
    qf_str dig;        /* int_lit: the magnitude's decimal digits as written ("-0": "0") */
    /* QJ_STR: s; QJ_ARR: items; QJ_OBJ: keys + items */
    qf_str s;
    size_t n;
    struct qj **items;
    qf_str *keys;
} qj;
enum { QJ_OK = 0, QJ_ERR_DEPTH, QJ_ERR_SYNTAX, QJ_ERR_DUPLICATE, QJ_ERR_SURROGATE, QJ_ERR_NOMEM };
/* Parse one JSON value at text[0] (no leading whitespace skipped).  *end: the byte after it. */
int qj_parse(qf_arena *a, const char *text, size_t len, int header_mode, unsigned max_depth, qj **out, size_t *end,
             char *msg, size_t msgn);
const qj *qj_get(const qj *o, const char *key); /* member of an object, NULL when absent or o not an object */
int qj_has(const qj *o, const char *key);
/* An integer in the sense of SPEC.md 3.2 (integral value however written) within [lo, hi]. */
int qj_int_in(const qj *v, int64_t lo, int64_t hi, int64_t *out);
int qj_is_int(const qj *v);
int qf_utf8_valid(const unsigned char *s, size_t n);
size_t qf_utf8_codepoints(qf_str s);

/* ---- problems ---- */
typedef struct qf_prob {
    qf_status status;
    char *tensor;   /* NUL-terminated (malloc) or NULL */
    char field[96];
    char message[400];
} qf_prob;
typedef struct qf_probs { qf_prob *v; size_t n, cap; } qf_probs;
void qf_probs_add(qf_probs *l, qf_status s, qf_str tensor, int has_tensor, const char *field, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 6, 7)))
#endif
    ;
void qf_probs_free(qf_probs *l);
void qf_set_error(qf_error *err, qf_status s, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
void qf_error_from_prob(qf_error *err, const qf_prob *p);

/* ---- container ---- */
typedef struct qf_entry {
    qf_str name;
    int dtype;                /* index in qf_dtypes */
    size_t rank;
    uint64_t *shape;          /* arena */
    uint64_t begin, end;      /* relative to the data buffer; checked against the file */
    size_t order;             /* header order */
} qf_entry;

/* ---- descriptors (SPEC.md 5-9) ---- */
enum { QF_EL_INT, QF_EL_FLOAT, QF_EL_CODEBOOK };
enum { QF_SIGN_UNSIGNED, QF_SIGN_TWOS, QF_SIGN_OFFSET };
enum { QF_ROLE_ZERO, QF_ROLE_SCALE, QF_ROLE_BIAS };
enum { QF_OP_SUB, QF_OP_MUL, QF_OP_DIV, QF_OP_ADD };
enum { QF_LAYOUT_CANONICAL = 0, QF_LAYOUT_TINYGEMM = 1, QF_LAYOUT_MARLIN = 2, QF_LAYOUT_OTHER = 3 };

typedef struct qf_desc qf_desc;
typedef struct qf_param {
    int present, role, op;
    int flat;                 /* flat blocks */
    uint64_t flat_size;
    size_t nsize;             /* grid: entries of size (0 = null) */
    uint64_t *size;
    int has_index; unsigned index_axis; qf_str index_tensor; uint64_t index_count;
    int has_tensor; qf_str tensor;
    int has_order; size_t norder; unsigned *order;
    qf_desc *encoded;
    const qj *blocks_json;    /* to compare two blocks objects (layout rule 6) */
} qf_param;

struct qf_desc {
    size_t rank;
    uint64_t *shape;
    int dtype;                /* 0 float32, 1 float16, 2 bfloat16 */
    qf_str codes_tensor;
    int el_type, signedness;
    unsigned bits, code_offset, frac_bits;
    int fmt;                  /* float format index */
    int table;                /* codebook index or -1 */
    int has_table_tensor; qf_str table_tensor;
    unsigned container; int lsb; int axis_null; unsigned axis;
    int has_order; size_t norder; unsigned *order;
    int straddle;
    int has_slot_order; size_t nslot; unsigned *slot_order;
    int has_planes; uint64_t planes_span;
    uint64_t row_alignment;
    qf_param p[3];            /* zero, scale, bias */
    qf_str layout_name; int layout; const qj *layout_params; int64_t inner_k_tiles;
    int allow_nonfinite;
    int has_scheme; qf_str scheme;
    const qj *extensions;
};

/* a logical tensor */
typedef struct qf_logical {
    qf_str name;
    const qj *raw;
    qf_desc *desc;            /* NULL when refused at 5.1-5.3 */
    qf_probs probs;           /* its refusals, in check order */
    const char *json;         /* raw re-serialized (compact, keys in file order; api.c at open), or NULL */
    size_t json_len;
    const char *scheme;       /* desc->scheme NUL-terminated (api.c at open), or NULL */
} qf_logical;

typedef struct qf_exposed {
    qf_str name;
    int logical;              /* index in f->logical, or -1 */
    int entry;                /* index in f->entries (plain), or -1 */
    uint64_t key_begin, key_end;
} qf_exposed;

struct qf_file {
    const unsigned char *data; size_t size;
    void *map; size_t map_len; unsigned char *owned;
    qf_arena arena;
    qf_open_options opts;
    qf_status refused;        /* keep_refused: the file-scope refusal (3.7 steps 1-4) */
    uint64_t data_start;
    qf_entry *entries; size_t nentries;
    size_t *by_name;          /* entry indices sorted by name */
    const qj *metadata;       /* object or NULL */
    qf_probs lenient;         /* what only a strict checker reports */
    /* qformat model */
    int has_qformat; int minor; int newer;
    const qj *digests;        /* a valid digests member of a 1.2+ file, or NULL */
    qf_logical *logical; size_t nlogical;
    int *owner;               /* per entry: the logical tensor it is a component of, or -1 */
    qf_probs plain_probs;     /* SHAPE_UNREPRESENTABLE of plain tensors */
    int *plain_prob_of;       /* per entry: index in plain_probs or -1 */
    qf_exposed *exposed; size_t nexposed;
};

/* container.c */
qf_status qf_parse_container(qf_file *f, qf_error *err);
int qf_find_entry(const qf_file *f, qf_str name); /* index or -1 */
/* model.c */
qf_status qf_interpret(qf_file *f, qf_error *err);
uint64_t qf_words_per_row(const qf_desc *d, uint64_t length, int aligned, int *overflow);
int qf_uses_slots(const qf_desc *d);
int qf_grid_shape(const qf_param *p, const qf_desc *d, uint64_t *g, size_t *gr); /* 1 on overflow */
/* decode.c */
qf_status qf_decode_desc(const qf_file *f, const qf_desc *d, uint64_t row0, uint64_t nrows, float *out, qf_str tensor,
                         qf_error *err);
/* rows [row0, row0 + nrows) (rank 0: the one element) in the output dtype dt (qf_out_dtype),
 * rounded to the logical dtype first (10.3): the whole of qf_decode_rows after its checks, by
 * the fused kernel (kernel.c) wherever it covers the descriptor */
qf_status qf_decode_into(const qf_file *f, const qf_desc *d, uint64_t row0, uint64_t nrows, int dt, void *dst, qf_str tensor,
                         qf_error *err);
qf_status qf_check_payload(const qf_file *f, const qf_desc *d, qf_str tensor, const char *prefix, size_t depth,
                           qf_probs *out);
const unsigned char *qf_entry_bytes(const qf_file *f, const qf_entry *e);
uint16_t qf_f32_to_f16(float x);
uint16_t qf_f32_to_bf16(float x);
float qf_f16_to_f32(uint16_t h);
float qf_bf16_to_f32(uint16_t h);
float qf_round_to(float x, int dtype);

#endif
