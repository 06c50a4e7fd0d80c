/* libqformat: read, check and decode qformat files (quantized tensors in safetensors files).
 *
 * Specification: SPEC.md version 1.2.  Every call returns a qf_status and, where it takes a
 * qf_error *, fills it with the SPEC.md section 16 code string and a message naming the tensor,
 * the field, what was expected and what was found (code "" on success).  err may be NULL.
 *
 * Handles are opaque.  After qf_open_* returns, a qf_file is never modified: any number of
 * threads may call the const functions on one qf_file at once.  No global mutable state. */
#ifndef QFORMAT_H
#define QFORMAT_H

#include <stddef.h>
#include <stdint.h>
#include "qformat_codes.h" /* qf_status: QF_OK and one QF_E_<CODE> per error code (generated) */

#ifdef __cplusplus
extern "C" {
#endif

#define QF_VERSION_MAJOR 0
#define QF_VERSION_MINOR 1
#define QF_VERSION_PATCH 0
#define QF_SPEC_VERSION "1.2"

typedef struct qf_file qf_file;

typedef struct qf_error {
    char code[40];     /* "" when OK, else a SPEC.md section 16 code such as "HEADER_DUPLICATE_KEY" */
    char message[512];
} qf_error;

typedef enum qf_out_dtype { QF_OUT_FLOAT32 = 0, QF_OUT_FLOAT16 = 1, QF_OUT_BFLOAT16 = 2 } qf_out_dtype;

typedef struct qf_open_options {
    size_t struct_size;      /* sizeof(qf_open_options); 0 is read as the current size */
    int verify_digests;      /* non-zero: verify a 1.2 file's digests (SPEC.md 3.8) of the stored
                                tensors a tensor reads before it is decoded or handed out */
    uint64_t max_file_bytes; /* 0: no limit beyond the format's (SPEC.md 13: callers may set lower limits) */
    int keep_refused;        /* non-zero: a file whose container is sound but whose qformat object is
                                refused at file scope (3.7 steps 1-4) is still returned in *out with
                                that status, so that its stored tensors can be listed (qf_stored_*,
                                sharded indexes, SPEC.md 14); it exposes no tensor */
} qf_open_options;

#define QF_MAX_RANK 64

/* The function qf_tensor_info() owns the plain name, so the type is struct qf_tensor_info
 * (typedef qf_tensor_info_t). */
typedef struct qf_tensor_info {
    const char *name;        /* UTF-8, owned by the qf_file; may hold NUL bytes: use name_len */
    size_t name_len;
    int is_quantized;        /* 1: a logical tensor defined by a descriptor; 0: a plain tensor */
    const char *dtype;       /* logical dtype ("float32", "float16", "bfloat16") or the storage dtype ("F32", "U8", ...) */
    const char *stored_dtype;/* plain: the storage dtype; quantized: the codes component's */
    size_t rank;
    uint64_t shape[QF_MAX_RANK];  /* the tensor's shape (plain F6_*: [nbytes], SPEC.md 2.6) */
    uint64_t numel;
    uint64_t nbytes;         /* bytes qf_decode (in the logical dtype) or qf_plain_bytes hands out */
    const char *element;     /* quantized: "int", "float" or "codebook"; else NULL */
    unsigned bits;           /* quantized: the element's bit width */
    const char *scheme;      /* quantized: the informative scheme id or NULL */
    const char *layout;      /* quantized: layout name ("canonical", ...) */
    int has_zero, has_scale, has_bias;
    const char *codes_tensor;/* quantized: the codes component's name (NUL-terminated) */
} qf_tensor_info_t;

typedef struct qf_problem {
    qf_status status;
    const char *code;        /* the section 16 code string */
    const char *tensor;      /* the logical (or stored) tensor concerned, or NULL */
    const char *field;       /* the member at fault (e.g. "scale.encoded.codes.tensor"), or "" */
    const char *message;
} qf_problem;

/* Called once per problem; return non-zero to stop the check early. */
typedef int (*qf_problem_cb)(void *user, const qf_problem *p);

#define QF_CHECK_STRICT  1u  /* also what readers accept but writers never write (SPEC.md 2.4) */
#define QF_CHECK_DIGESTS 2u  /* also verify digests (SPEC.md 3.8; reads every stored byte) */

/* Open.  Fails with the container code (SPEC.md 2.3) or the file-scope code of the qformat
 * object (3.7 steps 1-4); a refused logical tensor is reported when it is asked for. */
qf_status qf_open_memory(const void *data, size_t size, const qf_open_options *opts, qf_file **out, qf_error *err);
qf_status qf_open_path(const char *path, const qf_open_options *opts, qf_file **out, qf_error *err);
void qf_close(qf_file *f);

/* Exposed tensors (logical and plain), in the order of their data in the file (SPEC.md 2.4). */
size_t qf_tensor_count(const qf_file *f);
qf_status qf_find_tensor(const qf_file *f, const char *name, size_t name_len, size_t *index, qf_error *err);
/* Fills *out; returns the tensor's own refusal code (out->name etc. are still filled). */
qf_status qf_tensor_info(const qf_file *f, size_t i, struct qf_tensor_info *out, qf_error *err);
/* The first problem a reader reports for the whole file (SPEC.md 1.4), QF_OK if none (decode-
 * time refusals of 10.6 are found only by decoding).  With verify_digests (qf_open_options),
 * then every digest the file lists (3.8: after 3.7 step 7, before decode-time checks): a damaged
 * stored tensor, or a listed name that is no stored tensor, fails the whole file with
 * DIGEST_MISMATCH (DIGEST_UNSUPPORTED for an algorithm other than sha256). */
qf_status qf_file_status(const qf_file *f, qf_error *err);

/* Decode a quantized tensor to its logical values, rounded to the logical dtype, then written as
 * `dt` (widening is exact; asking for the logical dtype gives its exact bits).  dst_bytes must
 * be at least numel * (4 or 2).  qf_decode_rows decodes rows [row0, row0+nrows) along axis 0. */
qf_status qf_decode(const qf_file *f, size_t i, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err);
qf_status qf_decode_rows(const qf_file *f, size_t i, uint64_t row0, uint64_t nrows, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err);
/* A plain tensor's stored bytes (inside the file's memory; valid until qf_close). */
qf_status qf_plain_bytes(const qf_file *f, size_t i, const void **data, size_t *nbytes, qf_error *err);

/* ---- Raw components (SPEC.md 4.2, 6-10): for engines that run their own kernels ----
 *
 * A quantized tensor's stored pieces (packed codes, scales, zero points, biases, group indexes,
 * in-file codebooks, and the components of encoded parameters) are stored tensors of the file:
 * qf_tensor_component() maps a role path to a stored tensor index, qf_stored_info() hands out
 * that tensor's dtype, shape and bytes (inside the file's memory, valid until qf_close), and
 * qf_tensor_quant() gives the parsed element, packing and parameter members a kernel needs, so
 * that an engine need not parse JSON.  qf_tensor_descriptor() gives the descriptor itself.
 *
 * What these calls do not do: decode-time refusals (SPEC.md 10.6) and payload checks (12.4:
 * padding, non-finite or zero divisor parameters, group index range, codebook range) are not
 * applied to raw components; an engine that needs them runs qf_check() first, or decodes.
 * Example: examples/c/matvec.c computes y = W x from the raw int4 codes and scales, bit for
 * bit equal to y computed from qf_decode()'s float32 weights. */

/* The logical tensor i's descriptor as JSON text: the value its name maps to in the file's
 * qformat object "tensors" member, re-serialized at open in a canonical form: no whitespace,
 * object members in the file's order (never sorted), strings as UTF-8 with only the escapes
 * JSON requires (\" \\ \b \f \n \r \t, other control characters as \u00XX), integer literals
 * exactly as written (sign and magnitude; below 2^64), and every other number (a fraction or
 * exponent, or an integer of 2^64 or more) as the shortest text that reads back as the same
 * binary64 value, with ".0" added where that text would read as an integer (2.0 stays 2.0;
 * 1e2 is written 100.0).
 *   f: an open file; i: an exposed tensor index (< qf_tensor_count(f)).
 *   json, len: receive the text (not NUL-terminated; use len) owned by the file, valid until
 *     qf_close(f); both may be written even when a status other than QF_OK is returned.
 *   Returns QF_OK; QF_E_TENSOR_NOT_FOUND when i is out of range or tensor i is a plain tensor;
 *   for a logical tensor the file refuses, the tensor's own refusal code (as qf_tensor_info()
 *   does), with json and len still filled, so that tools can show what was refused. */
qf_status qf_tensor_descriptor(const qf_file *f, size_t i, const char **json, size_t *len, qf_error *err);

/* The stored tensor that fills role `role` of logical tensor i: *stored_index is an index for
 * qf_stored_info() (< qf_stored_count(f)).
 *   role: a NUL-terminated reference path of SPEC.md 4.2, optionally under "ROLE.encoded."
 *     prefixes for nested descriptors (9.3), ROLE being zero, scale or bias:
 *       "codes.tensor"                 packed codes (7)          short form "codes"
 *       "codes.element.table_tensor"   an in-file codebook (6.4)
 *       "ROLE.tensor"                  plain parameter values (9.2)   short form "ROLE"
 *       "ROLE.blocks.index.tensor"     a group index (8.2)       short form "ROLE.blocks.index"
 *     for example "scale", "zero.tensor", "scale.blocks.index.tensor", "scale.encoded.codes",
 *     "scale.encoded.scale", "bias.encoded.zero.encoded.codes.tensor".
 *   Returns QF_OK; QF_E_TENSOR_NOT_FOUND when i is out of range, tensor i is plain, role is NULL
 *   or not a path of this form (the message says so), or the descriptor has no component at
 *   that place (no such parameter, an encoded parameter asked for its "ROLE" tensor, no group
 *   index, a built-in codebook); the tensor's own refusal code when the file refuses tensor i;
 *   with verify_digests (qf_open_options), DIGEST_MISMATCH / DIGEST_UNSUPPORTED as qf_decode()
 *   reports them (every stored tensor of tensor i is verified, on every call). */
qf_status qf_tensor_component(const qf_file *f, size_t i, const char *role, size_t *stored_index, qf_error *err);

typedef enum qf_element_type { QF_ELEMENT_INT = 0, QF_ELEMENT_FLOAT = 1, QF_ELEMENT_CODEBOOK = 2 } qf_element_type;
typedef enum qf_signedness {
    QF_SIGNEDNESS_UNSIGNED = 0, QF_SIGNEDNESS_TWOS_COMPLEMENT = 1, QF_SIGNEDNESS_OFFSET_BINARY = 2
} qf_signedness;
/* The step of SPEC.md 10.1 a parameter performs: x = x - v, x * v, x / v, x + v (one binary32
 * operation each, 10.2).  A zero point always subtracts. */
typedef enum qf_param_op { QF_PARAM_SUBTRACT = 0, QF_PARAM_MULTIPLY = 1, QF_PARAM_DIVIDE = 2, QF_PARAM_ADD = 3 } qf_param_op;

/* One parameter (SPEC.md 8, 9) of a descriptor, as qf_tensor_quant() reports it. */
typedef struct qf_param_info {
    int present;              /* 0: the descriptor has no parameter of this role (other members 0) */
    qf_param_op op;
    int encoded;              /* 1: the values are a nested descriptor: qf_tensor_quant() with prefix
                                 "ROLE.encoded", components "ROLE.encoded.codes" etc.;
                                 0: a plain tensor, component "ROLE" */
    const char *dtype;        /* plain: the component's storage dtype ("F32", "F16", "I8", ...); encoded: NULL */
    int flat;                 /* 1: flat blocks of flat_size elements of the row-major flattened tensor (8.3) */
    uint64_t flat_size;
    size_t grid_rank;         /* rank of the grid G: the tensor's rank (grid blocks) or 1 (flat) */
    uint64_t grid[QF_MAX_RANK];  /* G: cells per axis (8.1-8.3) */
    uint64_t block[QF_MAX_RANK]; /* grid blocks: the size s_a of axis a, 0 where the file says null
                                    (one block spans the axis); cell g_a = floor(i_a / s_a) */
    int has_index;            /* 1: along index_axis the cell is read from the group index
                                 component "ROLE.blocks.index" (8.2), index_count cells */
    size_t index_axis;
    uint64_t index_count;
    int has_order;            /* plain: the component holds G permuted by order (9.2); 0: identity */
    unsigned order[QF_MAX_RANK];
} qf_param_info;

/* The parsed descriptor members a kernel needs (SPEC.md 5-9), exact: nothing is derived beyond
 * what the spec defines (stream/slots, row_length, words_per_row). */
typedef struct qf_quant_info {
    size_t struct_size;       /* in: sizeof(qf_quant_info) as the caller compiled it (0: the current
                                 size); only that many bytes are written */
    const char *dtype;        /* the descriptor's logical dtype: "float32", "float16", "bfloat16" */
    size_t rank;
    uint64_t shape[QF_MAX_RANK];
    /* element (6) */
    qf_element_type element;
    unsigned bits;            /* b: bits per code, 1..8 */
    qf_signedness signedness; /* int */
    unsigned code_offset;     /* int: k, u' = (u + k) mod 2^b */
    unsigned frac_bits;       /* int: f, e = v * 2^-f */
    const char *float_format; /* float: "e4m3fn", "e5m2", "e2m3fn", "e3m2fn", "e2m1fn", "e8m0fnu"; else NULL */
    const char *codebook;     /* codebook: the built-in table's name ("nf4", ...), or NULL when the
                                 table is the component "codes.element.table_tensor" */
    /* packing (7) of the component "codes", whose storage dtype is codes_dtype */
    const char *codes_dtype;
    unsigned container;       /* c: 8, 16 or 32 bits, little-endian */
    int msb_first;            /* bit_order: 0 lsb_first, 1 msb_first */
    int axis;                 /* the storage axis rows run along, or -1 for null (one row, 7.4) */
    int has_order;            /* storage order (7.3): stored grid = transpose(logical, order) */
    unsigned order[QF_MAX_RANK];
    int stream;               /* 1: stream arrangement (7.6); 0: slot arrangement (7.7) */
    unsigned slots;           /* slot arrangement: n = floor(c / b) codes per container; stream: 0 */
    int has_slot_order;       /* slot s holds position q*n + slot_order[s] (7.7); 0: identity */
    unsigned slot_order[32];
    uint64_t planes_span;     /* T of planes (7.8), 0 without planes */
    uint64_t row_alignment;   /* k (7.9), 1 when absent */
    uint64_t row_length;      /* L: codes per row (S'[axis], or numel for axis null) */
    uint64_t words_per_row;   /* W: containers per row, alignment included */
    /* parameters, in the order 10.1 applies them */
    qf_param_info zero, scale, bias;
    const char *layout;       /* "canonical", or a device layout (11) whose arrangement the
                                 components hold: an engine that knows only canonical refuses it */
    int allow_nonfinite_params;
} qf_quant_info;

/* The parsed members of logical tensor i's descriptor (prefix NULL or "") or of a nested
 * descriptor of one of its encoded parameters (prefix "ROLE.encoded", repeated for deeper
 * levels: "scale.encoded.zero.encoded"; a trailing '.' is accepted).
 *   out: written up to out->struct_size bytes (set it first); names are owned by the file,
 *     valid until qf_close(f).
 *   Returns QF_OK; QF_E_TENSOR_NOT_FOUND when i is out of range, tensor i is plain, or the prefix
 *   names no encoded parameter; the tensor's own refusal code when the file refuses tensor i. */
qf_status qf_tensor_quant(const qf_file *f, size_t i, const char *prefix, qf_quant_info *out, qf_error *err);

/* Raw access to any stored tensor (components included), by header name. */
size_t qf_stored_count(const qf_file *f);
qf_status qf_stored_info(const qf_file *f, size_t j, const char **name, size_t *name_len, const char **dtype,
                         size_t *rank, const uint64_t **shape, const void **data, size_t *nbytes);

/* The file's __metadata__ value for `key` (NUL-terminated key), or NULL. */
const char *qf_metadata(const qf_file *f, const char *key, size_t *len);

/* Every problem a checker reports (SPEC.md 12), like `qformat check`.  Returns QF_OK when none
 * was found, else the status of the first problem. */
qf_status qf_check(const qf_file *f, unsigned flags, qf_problem_cb cb, void *user, qf_error *err);
/* The same for a file not yet opened: container and file-scope problems are reported too. */
qf_status qf_check_memory(const void *data, size_t size, unsigned flags, qf_problem_cb cb, void *user, qf_error *err);

/* Sharded checkpoints (SPEC.md 14).  qf_index_open checks the index and every shard name
 * (INDEX_INVALID); then, for each shard k in order, open qf_index_shard_path(x, k) with
 * keep_refused set (a container failure is that shard's code), call qf_index_check_shard
 * (INDEX_MISMATCH, before the shard's own file-scope code), then read its tensors; a name two
 * shards expose is INDEX_MISMATCH.  qformat_c.c's `read` shows the sequence. */
typedef struct qf_index qf_index;
qf_status qf_index_open(const char *path, qf_index **out, qf_error *err);
size_t qf_index_shard_count(const qf_index *x);
char *qf_index_shard_path(const qf_index *x, size_t k); /* malloc'd; free() it */
qf_status qf_index_check_shard(const qf_index *x, size_t k, const qf_file *f, qf_error *err);
void qf_index_close(qf_index *x);

const char *qf_status_code(qf_status s);     /* "HEADER_DUPLICATE_KEY"; "" for QF_OK */
const char *qf_status_category(qf_status s); /* "malformed", "invalid", "unsupported", "usage" */
qf_status qf_status_from_code(const char *code);
const char *qf_version_string(void);

#ifdef __cplusplus
}
#endif
#endif
