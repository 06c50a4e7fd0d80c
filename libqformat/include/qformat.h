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
 * time refusals of 10.6 are found only by decoding). */
qf_status qf_file_status(const qf_file *f, qf_error *err);

/* Decode a quantized tensor to its logical values, rounded to the logical dtype, then written as
 * `dt` (widening is exact; asking for the logical dtype gives its exact bits).  dst_bytes must
 * be at least numel * (4 or 2).  qf_decode_rows decodes rows [row0, row0+nrows) along axis 0. */
qf_status qf_decode(const qf_file *f, size_t i, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err);
qf_status qf_decode_rows(const qf_file *f, size_t i, uint64_t row0, uint64_t nrows, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err);
/* A plain tensor's stored bytes (inside the file's memory; valid until qf_close). */
qf_status qf_plain_bytes(const qf_file *f, size_t i, const void **data, size_t *nbytes, qf_error *err);

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
