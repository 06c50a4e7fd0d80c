/* The public API: opening (memory or a read-only mapping), the exposed tensors, decoding,
 * plain bytes, digests (SPEC.md 3.8) and the checker (12). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "internal.h"
#include "sha256.h"

static void serialize_descriptors(qf_file *f);
static qf_status verify_file(const qf_file *f, qf_error *err);

const char *qf_status_code(qf_status s) { return (unsigned)s < QF_STATUS_COUNT ? qf_status_names[s] : "UNKNOWN"; }
const char *qf_status_category(qf_status s) { return (unsigned)s < QF_STATUS_COUNT ? qf_status_categories[s] : ""; }
qf_status qf_status_from_code(const char *code) {
    for (int i = 1; i < QF_STATUS_COUNT; i++)
        if (!strcmp(qf_status_names[i], code)) return (qf_status)i;
    return QF_OK;
}
const char *qf_version_string(void) { return "0.1.0"; }

static void clear_err(qf_error *err) {
    if (err) err->code[0] = err->message[0] = 0;
}

static void free_file(qf_file *f) {
    if (!f) return;
    for (size_t i = 0; i < f->nlogical; i++) qf_probs_free(&f->logical[i].probs);
    free(f->logical);
    free(f->exposed);
    qf_probs_free(&f->lenient);
    qf_probs_free(&f->plain_probs);
    qf_arena_free(&f->arena);
    if (f->map) munmap(f->map, f->map_len);
    free(f->owned);
    free(f);
}

void qf_close(qf_file *f) { free_file(f); }

/* what only a checker sees needs the file kept even when open fails: `keep` */
static qf_status open_bytes(const void *data, size_t size, const qf_open_options *opts, qf_file **out, qf_error *err, int keep) {
    clear_err(err);
    *out = NULL;
    qf_file *f = (qf_file *)calloc(1, sizeof *f);
    if (!f) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    if (opts) f->opts = *opts;
    f->data = (const unsigned char *)data;
    f->size = size;
    if (f->opts.max_file_bytes && size > f->opts.max_file_bytes) {
        qf_set_error(err, QF_E_FILE_UNREADABLE, "the file is %zu bytes, larger than the caller's limit %llu", size, (unsigned long long)f->opts.max_file_bytes);
        free(f);
        return QF_E_FILE_UNREADABLE;
    }
    qf_status s = qf_parse_container(f, err);
    if (s) {
        if (keep) { *out = f; return s; } /* only for the checker's strict findings */
        free_file(f);
        return s;
    }
    s = qf_interpret(f, err);
    serialize_descriptors(f);
    if (s && !keep && !f->opts.keep_refused) { free_file(f); return s; }
    if (s) f->refused = s;
    *out = f;
    return s;
}

qf_status qf_open_memory(const void *data, size_t size, const qf_open_options *opts, qf_file **out, qf_error *err) {
    if (!out) return QF_E_FILE_UNREADABLE;
    qf_status s = open_bytes(size ? data : "", size, opts, out, err, 0);
    return s;
}

qf_status qf_open_path(const char *path, const qf_open_options *opts, qf_file **out, qf_error *err) {
    clear_err(err);
    if (!out) return QF_E_FILE_UNREADABLE;
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        qf_set_error(err, QF_E_FILE_UNREADABLE, "cannot read \"%s\": %s", path, strerror(errno));
        return QF_E_FILE_UNREADABLE;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        qf_set_error(err, QF_E_FILE_UNREADABLE, "\"%s\" is not a regular file", path);
        return QF_E_FILE_UNREADABLE;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL;
    unsigned char *owned = NULL;
    if (size) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) { /* fall back to read() */
            map = NULL;
            owned = (unsigned char *)malloc(size);
            size_t done = 0;
            while (owned && done < size) {
                ssize_t n = read(fd, owned + done, size - done);
                if (n <= 0) { free(owned); owned = NULL; break; }
                done += (size_t)n;
            }
            if (!owned) {
                close(fd);
                qf_set_error(err, QF_E_FILE_UNREADABLE, "cannot read \"%s\"", path);
                return QF_E_FILE_UNREADABLE;
            }
        }
    }
    close(fd);
    const void *data = map ? map : owned ? (const void *)owned : (const void *)"";
    qf_file *f = NULL;
    qf_status s = open_bytes(data, size, opts, &f, err, 1);
    if (f) {
        f->map = map;
        f->map_len = size;
        f->owned = owned;
    } else {
        if (map) munmap(map, size);
        free(owned);
    }
    if (s && !(f && f->refused && f->opts.keep_refused)) { free_file(f); return s; }
    *out = f;
    return s;
}

size_t qf_tensor_count(const qf_file *f) { return f ? f->nexposed : 0; }

qf_status qf_find_tensor(const qf_file *f, const char *name, size_t name_len, size_t *index, qf_error *err) {
    clear_err(err);
    qf_str n = {name, name_len};
    for (size_t i = 0; i < f->nexposed; i++)
        if (qf_str_eq(f->exposed[i].name, n)) { *index = i; return QF_OK; }
    qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "no tensor named \"%.*s\"", (int)(name_len > 100 ? 100 : name_len), name);
    return QF_E_TENSOR_NOT_FOUND;
}

static qf_status refusal(const qf_file *f, const qf_exposed *x, qf_error *err) {
    if (x->logical >= 0) {
        const qf_logical *L = &f->logical[x->logical];
        if (L->probs.n) { qf_error_from_prob(err, &L->probs.v[0]); return L->probs.v[0].status; }
    } else if (f->plain_prob_of[x->entry] >= 0) {
        const qf_prob *p = &f->plain_probs.v[f->plain_prob_of[x->entry]];
        qf_error_from_prob(err, p);
        return p->status;
    }
    return QF_OK;
}

static const char *const LOGICAL_DT[3] = {"float32", "float16", "bfloat16"};

qf_status qf_tensor_info(const qf_file *f, size_t i, struct qf_tensor_info *out, qf_error *err) {
    clear_err(err);
    if (!f || i >= f->nexposed) { qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "no tensor %zu", i); return QF_E_TENSOR_NOT_FOUND; }
    const qf_exposed *x = &f->exposed[i];
    memset(out, 0, sizeof *out);
    out->name = x->name.p;
    out->name_len = x->name.n;
    if (x->logical >= 0) {
        out->is_quantized = 1;
        const qf_desc *d = f->logical[x->logical].desc;
        if (d) {
            out->dtype = LOGICAL_DT[d->dtype];
            out->rank = d->rank;
            out->numel = 1;
            for (size_t a = 0; a < d->rank && a < QF_MAX_RANK; a++) out->shape[a] = d->shape[a], out->numel *= d->shape[a];
            out->nbytes = out->numel * (d->dtype ? 2 : 4);
            out->element = d->el_type == QF_EL_INT ? "int" : d->el_type == QF_EL_FLOAT ? "float" : "codebook";
            out->bits = d->bits;
            out->layout = d->layout == QF_LAYOUT_CANONICAL ? "canonical" : d->layout == QF_LAYOUT_TINYGEMM ? "tinygemm_int4_cuda"
                        : d->layout == QF_LAYOUT_MARLIN ? "marlin_dense" : "unknown";
            out->has_zero = d->p[0].present;
            out->has_scale = d->p[1].present;
            out->has_bias = d->p[2].present;
            int e = qf_find_entry(f, d->codes_tensor);
            out->codes_tensor = e >= 0 ? f->entries[e].name.p : NULL;
            out->stored_dtype = e >= 0 ? qf_dtypes[f->entries[e].dtype].name : NULL;
            out->scheme = f->logical[x->logical].scheme; /* NUL-terminated copy made at open */
        }
    } else {
        const qf_entry *e = &f->entries[x->entry];
        const char *dn = qf_dtypes[e->dtype].name;
        out->stored_dtype = dn;
        out->nbytes = e->end - e->begin;
        if (!strncmp(dn, "F6_", 3)) { /* 2.6: raw bytes, 1-D */
            out->dtype = "U8";
            out->rank = 1;
            out->shape[0] = out->nbytes;
            out->numel = out->nbytes;
        } else {
            out->dtype = dn;
            out->rank = e->rank;
            out->numel = 1;
            for (size_t a = 0; a < e->rank; a++) out->shape[a] = e->shape[a], out->numel *= e->shape[a];
        }
    }
    return refusal(f, x, err);
}

qf_status qf_file_status(const qf_file *f, qf_error *err) {
    clear_err(err);
    /* a tensor refused at step 5 decides before claims and names (1.4) */
    for (size_t i = 0; i < f->nlogical; i++) {
        const qf_probs *p = &f->logical[i].probs;
        if (p->n && p->v[0].status != QF_E_COMPONENT_CLAIMED_TWICE && p->v[0].status != QF_E_NAME_CONFLICT) {
            qf_error_from_prob(err, &p->v[0]);
            return p->v[0].status;
        }
    }
    /* step 6: COMPONENT_CLAIMED_TWICE before NAME_CONFLICT, whatever tensor has which (1.4, 1.2.1) */
    for (int pass = 0; pass < 2; pass++) {
        const qf_status want = pass == 0 ? QF_E_COMPONENT_CLAIMED_TWICE : QF_E_NAME_CONFLICT;
        for (size_t i = 0; i < f->nlogical; i++) {
            const qf_probs *p = &f->logical[i].probs;
            for (size_t k = 0; k < p->n; k++)
                if (p->v[k].status == want) { qf_error_from_prob(err, &p->v[k]); return want; }
        }
    }
    for (size_t i = 0; i < f->nlogical; i++) {
        const qf_probs *p = &f->logical[i].probs;
        if (p->n) { qf_error_from_prob(err, &p->v[0]); return p->v[0].status; }
    }
    if (f->plain_probs.n) { qf_error_from_prob(err, &f->plain_probs.v[0]); return f->plain_probs.v[0].status; }
    return verify_file(f, err);
}

/* ---- digests (3.8) ---- */
static void hex32(const unsigned char d[32], char out[65]) {
    static const char *h = "0123456789abcdef";
    for (int i = 0; i < 32; i++) out[2 * i] = h[d[i] >> 4], out[2 * i + 1] = h[d[i] & 15];
    out[64] = 0;
}

/* one listed digest: 0 when it matches */
static int digest_problem(const qf_file *f, qf_str stored, const qj *want, qf_str owner, qf_probs *out) {
    char field[96];
    snprintf(field, sizeof field, "digests.tensors[\"%.*s\"]", (int)(stored.n > 60 ? 60 : stored.n), stored.p);
    int e = qf_find_entry(f, stored);
    if (e < 0) {
        qf_probs_add(out, QF_E_DIGEST_MISMATCH, stored, 1, field, "'digests' lists a name that is no stored tensor of the file");
        return 1;
    }
    if (want->s.n != 64) {
        qf_probs_add(out, QF_E_DIGEST_MISMATCH, owner, 1, field, "expected a sha256 digest of 64 digits, found %zu", want->s.n);
        return 1;
    }
    const qf_entry *en = &f->entries[e];
    unsigned char d[32];
    char hex[65];
    qf_sha256(qf_entry_bytes(f, en), (size_t)(en->end - en->begin), d);
    hex32(d, hex);
    if (memcmp(hex, want->s.p, 64) != 0) {
        qf_probs_add(out, QF_E_DIGEST_MISMATCH, owner, 1, field, "the stored bytes have sha256 %s, the file records another digest", hex);
        return 1;
    }
    return 0;
}

static int digest_supported(const qf_file *f) { return qf_str_is(qj_get(f->digests, "algorithm")->s, "sha256"); }

static qf_str owner_name(const qf_file *f, qf_str stored) {
    int e = qf_find_entry(f, stored);
    if (e >= 0 && f->owner[e] >= 0) return f->logical[f->owner[e]].name;
    return stored;
}

/* with verify_digests: DIGEST_UNSUPPORTED for an algorithm this reader does not implement, else
 * QF_OK; *go says whether there are digests to verify */
static qf_status verify_start(const qf_file *f, int *go, qf_error *err) {
    *go = f->opts.verify_digests && f->digests;
    if (*go && !digest_supported(f)) {
        qf_set_error(err, QF_E_DIGEST_UNSUPPORTED, "field digests.algorithm: the digest algorithm is not one this reader implements (sha256)");
        return QF_E_DIGEST_UNSUPPORTED;
    }
    return QF_OK;
}

/* with verify_digests: the stored tensors an exposed tensor reads, and its own name */
static qf_status verify_exposed(const qf_file *f, const qf_exposed *x, qf_error *err) {
    int go;
    qf_status st = verify_start(f, &go, err);
    if (st || !go) return st;
    const qj *ts = qj_get(f->digests, "tensors");
    qf_probs pr = {0};
    for (size_t k = 0; k < ts->n && !pr.n; k++) {
        qf_str s = ts->keys[k];
        int e = qf_find_entry(f, s);
        int mine = qf_str_eq(s, x->name) || (e >= 0 && (x->logical >= 0 ? f->owner[e] == x->logical : e == x->entry));
        if (mine) digest_problem(f, s, ts->items[k], x->name, &pr);
    }
    if (pr.n) {
        qf_error_from_prob(err, &pr.v[0]);
        qf_status s = pr.v[0].status;
        qf_probs_free(&pr);
        return s;
    }
    return QF_OK;
}

/* with verify_digests: the whole file's digests, after 3.7 step 7 and before any decode-time
 * check (SPEC.md 1.2.1, 3.8): the first listed digest that fails, a listed name that is no
 * stored tensor included (DIGEST_MISMATCH under that name: a request for the whole file fails) */
static qf_status verify_file(const qf_file *f, qf_error *err) {
    int go;
    qf_status st = verify_start(f, &go, err);
    if (st || !go) return st;
    const qj *ts = qj_get(f->digests, "tensors");
    qf_probs pr = {0};
    for (size_t k = 0; k < ts->n && !pr.n; k++) digest_problem(f, ts->keys[k], ts->items[k], owner_name(f, ts->keys[k]), &pr);
    if (!pr.n) return QF_OK;
    qf_error_from_prob(err, &pr.v[0]);
    qf_status s = pr.v[0].status;
    qf_probs_free(&pr);
    return s;
}

/* ---- decoding ---- */
static qf_status decode_impl(const qf_file *f, size_t i, int whole, uint64_t row0, uint64_t nrows, qf_out_dtype dt, void *dst,
                             size_t dst_bytes, qf_error *err) {
    clear_err(err);
    if (!f || i >= f->nexposed) { qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "no tensor %zu", i); return QF_E_TENSOR_NOT_FOUND; }
    const qf_exposed *x = &f->exposed[i];
    if (x->logical < 0) {
        qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "tensor \"%.*s\" is a plain tensor: read it with qf_plain_bytes", (int)(x->name.n > 100 ? 100 : x->name.n), x->name.p);
        return QF_E_TENSOR_NOT_FOUND;
    }
    qf_status s = refusal(f, x, err);
    if (s) return s;
    if ((s = verify_exposed(f, x, err))) return s;
    const qf_desc *d = f->logical[x->logical].desc;
    uint64_t rowsize = 1, rows = d->rank ? d->shape[0] : 1;
    for (size_t a = 1; a < d->rank; a++) rowsize *= d->shape[a];
    if (whole) { row0 = 0; nrows = rows; }
    if (row0 > rows || nrows > rows - row0 || (!d->rank && (row0 || nrows != 1))) {
        qf_set_error(err, QF_E_SLICE_INVALID, "rows [%llu, %llu) are outside the tensor's %llu rows", (unsigned long long)row0,
                     (unsigned long long)(row0 + nrows), (unsigned long long)rows);
        return QF_E_SLICE_INVALID;
    }
    uint64_t count, need;
    unsigned osz = dt == QF_OUT_FLOAT32 ? 4 : 2;
    if (qf_mul_u64(nrows, rowsize, &count) || qf_mul_u64(count, osz, &need) || need > dst_bytes) {
        qf_set_error(err, QF_E_SLICE_INVALID, "the destination holds %zu bytes, the decoded rows need more", dst_bytes);
        return QF_E_SLICE_INVALID;
    }
    if (count == 0) return QF_OK; /* an empty tensor reads no component value (8.2, 10.6) */
    return qf_decode_into(f, d, row0, nrows, (int)dt, dst, x->name, err);
}

qf_status qf_decode(const qf_file *f, size_t i, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err) {
    return decode_impl(f, i, 1, 0, 0, dt, dst, dst_bytes, err);
}
qf_status qf_decode_rows(const qf_file *f, size_t i, uint64_t row0, uint64_t nrows, qf_out_dtype dt, void *dst, size_t dst_bytes, qf_error *err) {
    return decode_impl(f, i, 0, row0, nrows, dt, dst, dst_bytes, err);
}

qf_status qf_plain_bytes(const qf_file *f, size_t i, const void **data, size_t *nbytes, qf_error *err) {
    clear_err(err);
    if (!f || i >= f->nexposed || f->exposed[i].logical >= 0) {
        qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "tensor %zu is not a plain tensor", i);
        return QF_E_TENSOR_NOT_FOUND;
    }
    const qf_exposed *x = &f->exposed[i];
    qf_status s = refusal(f, x, err);
    if (s) return s;
    if ((s = verify_exposed(f, x, err))) return s;
    const qf_entry *e = &f->entries[x->entry];
    *data = qf_entry_bytes(f, e);
    *nbytes = (size_t)(e->end - e->begin);
    return QF_OK;
}

size_t qf_stored_count(const qf_file *f) { return f ? f->nentries : 0; }
qf_status qf_stored_info(const qf_file *f, size_t j, const char **name, size_t *name_len, const char **dtype, size_t *rank,
                         const uint64_t **shape, const void **data, size_t *nbytes) {
    if (!f || j >= f->nentries) return QF_E_TENSOR_NOT_FOUND;
    const qf_entry *e = &f->entries[j];
    if (name) *name = e->name.p;
    if (name_len) *name_len = e->name.n;
    if (dtype) *dtype = qf_dtypes[e->dtype].name;
    if (rank) *rank = e->rank;
    if (shape) *shape = e->shape;
    if (data) *data = qf_entry_bytes(f, e);
    if (nbytes) *nbytes = (size_t)(e->end - e->begin);
    return QF_OK;
}

const char *qf_metadata(const qf_file *f, const char *key, size_t *len) {
    const qj *v = f ? qj_get(f->metadata, key) : NULL;
    if (!v) return NULL;
    if (len) *len = v->s.n;
    return v->s.p;
}

/* ---- the checker ---- */
static int emit(qf_problem_cb cb, void *user, const qf_prob *p, qf_status *first) {
    if (!*first) *first = p->status;
    if (!cb) return 0;
    qf_problem q = {p->status, qf_status_code(p->status), p->tensor, p->field, p->message};
    return cb(user, &q);
}

static qf_status check_file(const qf_file *f, unsigned flags, qf_problem_cb cb, void *user, qf_error *err) {
    qf_status first = QF_OK;
    if (flags & QF_CHECK_STRICT)
        for (size_t i = 0; i < f->lenient.n; i++)
            if (emit(cb, user, &f->lenient.v[i], &first)) goto done;
    /* the reference checker's order: tensors refused at step 5 in `tensors` order, then those
     * refused for a component claimed twice (by name), then name conflicts (in `tensors` order) */
    for (int pass = 0; pass < 3; pass++) {
        size_t *ix = NULL, m = 0;
        if (f->nlogical && !(ix = (size_t *)malloc(f->nlogical * sizeof *ix))) {
            qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
            return QF_E_SHAPE_UNREPRESENTABLE;
        }
        for (size_t i = 0; i < f->nlogical; i++) {
            const qf_probs *p = &f->logical[i].probs;
            if (!p->n) continue;
            int kind = p->v[0].status == QF_E_COMPONENT_CLAIMED_TWICE ? 1 : p->v[0].status == QF_E_NAME_CONFLICT ? 2 : 0;
            if (kind == pass) ix[m++] = i;
        }
        if (pass == 1) /* insertion sort by name (few tensors are refused) */
            for (size_t a = 1; a < m; a++)
                for (size_t b = a; b > 0; b--) {
                    qf_str x = f->logical[ix[b - 1]].name, y = f->logical[ix[b]].name;
                    size_t n = x.n < y.n ? x.n : y.n;
                    int c = memcmp(x.p, y.p, n);
                    if (c < 0 || (c == 0 && x.n <= y.n)) break;
                    size_t t = ix[b - 1]; ix[b - 1] = ix[b]; ix[b] = t;
                }
        int stop = 0;
        for (size_t j = 0; j < m && !stop; j++)
            for (size_t k = 0; k < f->logical[ix[j]].probs.n && !stop; k++)
                stop = emit(cb, user, &f->logical[ix[j]].probs.v[k], &first);
        free(ix);
        if (stop) goto done;
    }
    for (size_t i = 0; i < f->plain_probs.n; i++)
        if (emit(cb, user, &f->plain_probs.v[i], &first)) goto done;
    for (size_t i = 0; i < f->nlogical; i++) {
        const qf_logical *L = &f->logical[i];
        if (!L->desc || L->probs.n) continue;
        qf_probs pr = {0};
        qf_check_payload(f, L->desc, L->name, "", 0, &pr);
        int stop = 0;
        for (size_t k = 0; k < pr.n && !stop; k++) stop = emit(cb, user, &pr.v[k], &first);
        qf_probs_free(&pr);
        if (stop) goto done;
    }
    if ((flags & QF_CHECK_DIGESTS) && f->digests) {
        qf_probs pr = {0};
        if (!digest_supported(f))
            qf_probs_add(&pr, QF_E_DIGEST_UNSUPPORTED, (qf_str){0, 0}, 0, "digests.algorithm", "the digest algorithm is not one this reader implements (sha256); the digests cannot be verified");
        else {
            const qj *ts = qj_get(f->digests, "tensors");
            for (size_t k = 0; k < ts->n; k++) digest_problem(f, ts->keys[k], ts->items[k], owner_name(f, ts->keys[k]), &pr);
        }
        int stop = 0;
        for (size_t k = 0; k < pr.n && !stop; k++) stop = emit(cb, user, &pr.v[k], &first);
        qf_probs_free(&pr);
    }
done:
    if (first) qf_set_error(err, first, "the file has problems; the first is %s", qf_status_code(first));
    return first;
}

qf_status qf_check(const qf_file *f, unsigned flags, qf_problem_cb cb, void *user, qf_error *err) {
    clear_err(err);
    return check_file(f, flags, cb, user, err);
}

qf_status qf_check_memory(const void *data, size_t size, unsigned flags, qf_problem_cb cb, void *user, qf_error *err) {
    clear_err(err);
    qf_file *f = NULL;
    qf_error e;
    qf_status s = open_bytes(size ? data : "", size, NULL, &f, &e, 1);
    if (s) {
        qf_status first = QF_OK;
        if (f && (flags & QF_CHECK_STRICT))
            for (size_t i = 0; i < f->lenient.n; i++) emit(cb, user, &f->lenient.v[i], &first);
        qf_prob p;
        memset(&p, 0, sizeof p);
        p.status = s;
        /* the error's "tensor \"NAME\": " and "field NAME: " prefixes become the problem's tensor and field */
        const char *m = e.message;
        char tname[256] = "";
        if (m[0] == '[' && strstr(m, "] ")) m = strstr(m, "] ") + 2; /* "[CODE] " of a file-scope problem */
        if (!strncmp(m, "tensor \"", 8)) {
            const char *q = strstr(m + 8, "\": ");
            if (q && (size_t)(q - (m + 8)) < sizeof tname) {
                memcpy(tname, m + 8, (size_t)(q - (m + 8)));
                tname[q - (m + 8)] = 0;
                p.tensor = tname;
                m = q + 3;
            }
        }
        if (!strncmp(m, "field ", 6)) {
            const char *q = strstr(m + 6, ": ");
            if (q && (size_t)(q - (m + 6)) < sizeof p.field && !memchr(m + 6, ' ', (size_t)(q - (m + 6)))) {
                memcpy(p.field, m + 6, (size_t)(q - (m + 6)));
                m = q + 2;
            }
        }
        snprintf(p.message, sizeof p.message, "%.390s", m);
        emit(cb, user, &p, &first);
        free_file(f);
        if (err) {
            if (first == s) *err = e;
            else qf_set_error(err, first, "the file has problems; the first is %s", qf_status_code(first));
        }
        return first;
    }
    s = check_file(f, flags, cb, user, err);
    free_file(f);
    return s;
}

/* ---- raw components (qformat.h: qf_tensor_descriptor, qf_tensor_component, qf_tensor_quant) ---- */
typedef struct jbuf { char *p; size_t n, cap; int oom; } jbuf;

static void jb_put(jbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
}
static void jb_z(jbuf *b, const char *s) { jb_put(b, s, strlen(s)); }

static void jb_string(jbuf *b, qf_str s) {
    jb_put(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < s.n; i++) {
        unsigned char c = (unsigned char)s.p[i];
        const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : c == '\n' ? "\\n"
                      : c == '\r' ? "\\r" : c == '\t' ? "\\t" : NULL;
        if (!e && c >= 0x20) continue;
        jb_put(b, s.p + run, i - run);
        run = i + 1;
        if (e) jb_z(b, e);
        else {
            char u[8];
            snprintf(u, sizeof u, "\\u%04x", c);
            jb_z(b, u);
        }
    }
    jb_put(b, s.p + run, s.n - run);
    jb_put(b, "\"", 1);
}

/* qformat.h's number rule: integer literals exactly, other values as the shortest binary64 text */
static void jb_number(jbuf *b, const qj *v) {
    char t[48];
    if (v->int_lit && !v->huge) {
        snprintf(t, sizeof t, "%s%llu", v->neg ? "-" : "", (unsigned long long)v->mag);
        jb_z(b, t);
        return;
    }
    if (v->d != v->d || v->d - v->d != 0) { /* a literal beyond binary64's range reads as infinity */
        jb_z(b, v->d < 0 ? "-1e999" : "1e999");
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*g", prec, v->d);
        if (strtod(t, NULL) == v->d) break;
    }
    jb_z(b, t);
    if (!strpbrk(t, ".e")) jb_z(b, ".0");
}

static void jb_value(jbuf *b, const qj *v) {
    switch (v->t) {
    case QJ_NULL: jb_z(b, "null"); break;
    case QJ_BOOL: jb_z(b, v->b ? "true" : "false"); break;
    case QJ_NUM: jb_number(b, v); break;
    case QJ_STR: jb_string(b, v->s); break;
    case QJ_ARR:
        jb_put(b, "[", 1);
        for (size_t k = 0; k < v->n; k++) {
            if (k) jb_put(b, ",", 1);
            jb_value(b, v->items[k]);
        }
        jb_put(b, "]", 1);
        break;
    case QJ_OBJ:
        jb_put(b, "{", 1);
        for (size_t k = 0; k < v->n; k++) {
            if (k) jb_put(b, ",", 1);
            jb_string(b, v->keys[k]);
            jb_put(b, ":", 1);
            jb_value(b, v->items[k]);
        }
        jb_put(b, "}", 1);
        break;
    }
}

/* at open: every logical tensor's descriptor text, in the file's arena (the file stays immutable) */
static void serialize_descriptors(qf_file *f) {
    jbuf b = {0};
    for (size_t i = 0; i < f->nlogical; i++) {
        qf_logical *L = &f->logical[i];
        if (!L->raw) continue;
        b.n = 0;
        jb_value(&b, L->raw);
        if (b.oom) break;
        char *p = (char *)qf_arena_alloc(&f->arena, b.n + 1);
        if (!p) break;
        memcpy(p, b.p, b.n);
        L->json = p;
        L->json_len = b.n;
        if (L->desc && L->desc->has_scheme) {
            char *z = (char *)qf_arena_alloc(&f->arena, L->desc->scheme.n + 1);
            if (z) memcpy(z, L->desc->scheme.p, L->desc->scheme.n);
            L->scheme = z;
        }
    }
    free(b.p);
}

static qf_status logical_at(const qf_file *f, size_t i, const qf_exposed **xo, const qf_logical **Lo, qf_error *err) {
    if (!f || i >= f->nexposed) { qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "no tensor %zu", i); return QF_E_TENSOR_NOT_FOUND; }
    const qf_exposed *x = &f->exposed[i];
    if (x->logical < 0) {
        qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "tensor \"%.*s\" is a plain tensor: it has no descriptor or components (read it with qf_plain_bytes)",
                     (int)(x->name.n > 100 ? 100 : x->name.n), x->name.p);
        return QF_E_TENSOR_NOT_FOUND;
    }
    *xo = x;
    *Lo = &f->logical[x->logical];
    return QF_OK;
}

qf_status qf_tensor_descriptor(const qf_file *f, size_t i, const char **json, size_t *len, qf_error *err) {
    clear_err(err);
    const qf_exposed *x;
    const qf_logical *L;
    qf_status s = logical_at(f, i, &x, &L, err);
    if (s) return s;
    if (!L->json) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory for the descriptor text"); return QF_E_SHAPE_UNREPRESENTABLE; }
    if (json) *json = L->json;
    if (len) *len = L->json_len;
    return refusal(f, x, err);
}

static const char *const ROLE_NAME[3] = {"zero", "scale", "bias"};

/* consume "ROLE.encoded" steps ("." between and after them); NULL with a message when a step
 * names no encoded parameter */
static const qf_desc *walk_encoded(const qf_desc *d, const char **path, char *why, size_t whyn) {
    for (;;) {
        const char *p = *path;
        int hit = -1;
        size_t len = 0;
        for (int r = 0; r < 3 && hit < 0; r++) {
            len = strlen(ROLE_NAME[r]);
            if (!strncmp(p, ROLE_NAME[r], len) && !strncmp(p + len, ".encoded", 8) && (p[len + 8] == '.' || p[len + 8] == 0)) hit = r;
        }
        if (hit < 0) return d;
        if (!d->p[hit].present || !d->p[hit].encoded) {
            snprintf(why, whyn, "the descriptor has no encoded parameter '%s' at \"%.*s\"", ROLE_NAME[hit], (int)(len + 8), p);
            return NULL;
        }
        d = d->p[hit].encoded;
        p += len + 8;
        if (*p == '.') p++;
        *path = p;
    }
}

static int is_one_of(const char *s, const char *a, const char *b) { return !strcmp(s, a) || !strcmp(s, b); }

qf_status qf_tensor_component(const qf_file *f, size_t i, const char *role, size_t *stored_index, qf_error *err) {
    clear_err(err);
    const qf_exposed *x;
    const qf_logical *L;
    qf_status s = logical_at(f, i, &x, &L, err);
    if (s) return s;
    if ((s = refusal(f, x, err))) return s;
    if (!role) { qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "no role path given"); return QF_E_TENSOR_NOT_FOUND; }
    char why[200] = "";
    const char *rest = role;
    const qf_desc *d = walk_encoded(L->desc, &rest, why, sizeof why);
    qf_str name = {0, 0};
    int found = 0, known = 1;
    if (d) {
        if (is_one_of(rest, "codes", "codes.tensor")) name = d->codes_tensor, found = 1;
        else if (!strcmp(rest, "codes.element.table_tensor")) {
            if (d->has_table_tensor) name = d->table_tensor, found = 1;
            else snprintf(why, sizeof why, "the element has no in-file codebook (table_tensor)");
        } else {
            known = 0;
            for (int r = 0; r < 3 && !known; r++) {
                size_t n = strlen(ROLE_NAME[r]);
                if (strncmp(rest, ROLE_NAME[r], n) || (rest[n] != 0 && rest[n] != '.')) continue;
                const char *tail = rest + n;
                const qf_param *p = &d->p[r];
                if (is_one_of(tail, "", ".tensor")) {
                    known = 1;
                    if (p->present && p->has_tensor) name = p->tensor, found = 1;
                    else snprintf(why, sizeof why, p->present ? "the parameter '%s' is encoded: its components are \"%s.encoded.codes\" etc."
                                                              : "the descriptor has no parameter '%s'%.0s", ROLE_NAME[r], ROLE_NAME[r]);
                } else if (is_one_of(tail, ".blocks.index", ".blocks.index.tensor")) {
                    known = 1;
                    if (p->present && p->has_index) name = p->index_tensor, found = 1;
                    else snprintf(why, sizeof why, "the descriptor has no group index for '%s'", ROLE_NAME[r]);
                }
            }
            if (!known) snprintf(why, sizeof why, "not a reference path of SPEC.md 4.2 (codes, codes.element.table_tensor, ROLE, ROLE.blocks.index, ROLE.encoded.PATH)");
        }
    }
    int e = found ? qf_find_entry(f, name) : -1;
    if (e < 0) {
        qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "tensor \"%.*s\" has no component \"%.80s\": %s", (int)(x->name.n > 100 ? 100 : x->name.n),
                     x->name.p, role, why[0] ? why : "the stored tensor is missing");
        return QF_E_TENSOR_NOT_FOUND;
    }
    if ((s = verify_exposed(f, x, err))) return s;
    if (stored_index) *stored_index = (size_t)e;
    return QF_OK;
}

static void param_info(const qf_file *f, const qf_desc *d, const qf_param *p, qf_param_info *o) {
    memset(o, 0, sizeof *o);
    if (!p->present) return;
    o->present = 1;
    o->op = (qf_param_op)p->op;
    o->encoded = p->encoded != NULL;
    if (p->has_tensor) {
        int e = qf_find_entry(f, p->tensor);
        o->dtype = e >= 0 ? qf_dtypes[f->entries[e].dtype].name : NULL;
    }
    o->flat = p->flat;
    o->flat_size = p->flat_size;
    qf_grid_shape(p, d, o->grid, &o->grid_rank); /* validated at open: no overflow */
    for (size_t a = 0; !p->flat && a < p->nsize && a < QF_MAX_RANK; a++) o->block[a] = p->size[a];
    o->has_index = p->has_index;
    o->index_axis = p->index_axis;
    o->index_count = p->index_count;
    o->has_order = p->has_order;
    for (size_t a = 0; p->has_order && a < p->norder && a < QF_MAX_RANK; a++) o->order[a] = p->order[a];
}

qf_status qf_tensor_quant(const qf_file *f, size_t i, const char *prefix, qf_quant_info *out, qf_error *err) {
    clear_err(err);
    const qf_exposed *x;
    const qf_logical *L;
    qf_status s = logical_at(f, i, &x, &L, err);
    if (s) return s;
    if ((s = refusal(f, x, err))) return s;
    char why[200] = "";
    const char *rest = prefix ? prefix : "";
    const qf_desc *d = walk_encoded(L->desc, &rest, why, sizeof why);
    if (d && *rest) snprintf(why, sizeof why, "\"%.80s\" is not a prefix ROLE.encoded[.ROLE.encoded...]", prefix), d = NULL;
    if (!d) {
        qf_set_error(err, QF_E_TENSOR_NOT_FOUND, "tensor \"%.*s\": %s", (int)(x->name.n > 100 ? 100 : x->name.n), x->name.p, why);
        return QF_E_TENSOR_NOT_FOUND;
    }
    qf_quant_info *q = (qf_quant_info *)calloc(1, sizeof *q);
    if (!q) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    q->struct_size = sizeof *q;
    q->dtype = LOGICAL_DT[d->dtype];
    q->rank = d->rank;
    uint64_t numel = 1;
    for (size_t a = 0; a < d->rank && a < QF_MAX_RANK; a++) q->shape[a] = d->shape[a], numel *= d->shape[a];
    q->element = (qf_element_type)d->el_type;
    q->bits = d->bits;
    q->signedness = (qf_signedness)d->signedness;
    q->code_offset = d->code_offset;
    q->frac_bits = d->frac_bits;
    q->float_format = d->el_type == QF_EL_FLOAT ? qf_float_formats[d->fmt].name : NULL;
    q->codebook = d->el_type == QF_EL_CODEBOOK && d->table >= 0 ? qf_codebooks[d->table].name : NULL;
    int e = qf_find_entry(f, d->codes_tensor);
    q->codes_dtype = e >= 0 ? qf_dtypes[f->entries[e].dtype].name : NULL;
    q->container = d->container;
    q->msb_first = !d->lsb;
    q->axis = d->axis_null ? -1 : (int)d->axis;
    q->has_order = d->has_order;
    for (size_t a = 0; d->has_order && a < d->norder && a < QF_MAX_RANK; a++) q->order[a] = d->order[a];
    q->stream = !qf_uses_slots(d);
    q->slots = q->stream ? 0 : d->container / d->bits;
    q->has_slot_order = d->has_slot_order;
    for (size_t k = 0; d->has_slot_order && k < d->nslot && k < 32; k++) q->slot_order[k] = d->slot_order[k];
    q->planes_span = d->has_planes ? d->planes_span : 0;
    q->row_alignment = d->row_alignment;
    if (d->axis_null) q->row_length = numel;
    else q->row_length = d->shape[d->has_order ? d->order[d->axis] : d->axis];
    int of = 0;
    q->words_per_row = qf_words_per_row(d, q->row_length, 1, &of);
    param_info(f, d, &d->p[QF_ROLE_ZERO], &q->zero);
    param_info(f, d, &d->p[QF_ROLE_SCALE], &q->scale);
    param_info(f, d, &d->p[QF_ROLE_BIAS], &q->bias);
    q->layout = d->layout == QF_LAYOUT_CANONICAL ? "canonical" : d->layout == QF_LAYOUT_TINYGEMM ? "tinygemm_int4_cuda"
              : d->layout == QF_LAYOUT_MARLIN ? "marlin_dense" : "unknown";
    q->allow_nonfinite_params = d->allow_nonfinite;
    size_t n = out->struct_size == 0 || out->struct_size > sizeof *q ? sizeof *q : out->struct_size;
    memcpy(out, q, n);
    if (n >= sizeof(size_t)) out->struct_size = n;
    free(q);
    return QF_OK;
}
