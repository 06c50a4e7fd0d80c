/* qformat-c: the command-line tool of libqformat and its conformance reader
 * (conformance/README.md, the command protocol):
 *
 *   qformat-c read [--verify] INPUT OUTPUT
 *                                      decode INPUT (.safetensors or *.safetensors.index.json)
 *                                      into a plain safetensors OUTPUT; on failure print the
 *                                      error code as the first word of the last line, exit 1;
 *                                      --verify: verify the digests first (SPEC.md 3.8)
 *   qformat-c check [--strict] [--digests] FILE   every problem's code, one per line
 *   qformat-c check --json [--strict] [--digests] PATH...   the JSON report of `qformat check --json`
 *   qformat-c --batch [LIST]           lines "INPUT<TAB>OUTPUT" -> one JSON line each
 *   qformat-c inspect FILE             list the tensors
 *   qformat-c inspect --json PATH      the JSON of `qformat inspect --json` (PATH: a file or an index) */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "qformat.h"
#include "internal.h" /* the tool links the static library: has_qformat, minor, digests */

typedef struct otensor {
    char *name; size_t name_len;
    const char *dtype;
    size_t rank; uint64_t shape[QF_MAX_RANK];
    unsigned char *data; size_t nbytes;
} otensor;
typedef struct olist { otensor *v; size_t n, cap; } olist;

typedef struct fail { qf_status code; char msg[600]; } fail;

static int set_fail(fail *fl, qf_status s, const char *msg) {
    fl->code = s;
    snprintf(fl->msg, sizeof fl->msg, "%s", msg);
    return 0;
}

static void olist_free(olist *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].name), free(l->v[i].data);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

static otensor *olist_push(olist *l) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        otensor *v = (otensor *)realloc(l->v, cap * sizeof *v);
        if (!v) return NULL;
        l->v = v;
        l->cap = cap;
    }
    otensor *t = &l->v[l->n++];
    memset(t, 0, sizeof *t);
    return t;
}

static int olist_has(const olist *l, const char *name, size_t n) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].name_len == n && memcmp(l->v[i].name, name, n) == 0) return 1;
    return 0;
}

/* every exposed tensor of an open file, decoded (1.4: the first problem decides; the decode-time
 * checks go tensor by tensor in code-point order of the names, 1.2.1, while the output keeps the
 * file's order) */
typedef struct pending { size_t index, slot; const char *name; size_t name_len; qf_out_dtype dt; int quantized; } pending;

static int by_name(const void *a, const void *b) {
    const pending *x = (const pending *)a, *y = (const pending *)b;
    size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
    int c = memcmp(x->name, y->name, n); /* UTF-8 byte order is code-point order */
    return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int load_file(qf_file *f, olist *out, fail *fl) {
    qf_error err;
    qf_status s = qf_file_status(f, &err);
    if (s) return set_fail(fl, s, err.message);
    size_t n = qf_tensor_count(f);
    pending *todo = (pending *)calloc(n ? n : 1, sizeof *todo);
    if (!todo) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
    int ok = 1;
    for (size_t i = 0; i < n && ok; i++) {
        struct qf_tensor_info ti;
        s = qf_tensor_info(f, i, &ti, &err);
        if (s) { ok = set_fail(fl, s, err.message); break; }
        if (olist_has(out, ti.name, ti.name_len)) {
            snprintf(err.message, sizeof err.message, "tensor \"%.*s\" appears in more than one shard", (int)(ti.name_len > 100 ? 100 : ti.name_len), ti.name);
            ok = set_fail(fl, QF_E_INDEX_MISMATCH, err.message);
            break;
        }
        otensor *t = olist_push(out);
        if (!t) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); break; }
        t->name = (char *)malloc(ti.name_len + 1);
        if (!t->name) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); break; }
        memcpy(t->name, ti.name, ti.name_len);
        t->name[ti.name_len] = 0;
        t->name_len = ti.name_len;
        t->rank = ti.rank;
        memcpy(t->shape, ti.shape, sizeof t->shape);
        todo[i] = (pending){i, out->n - 1, NULL, ti.name_len, QF_OUT_FLOAT32, ti.is_quantized != 0};
        if (ti.is_quantized) {
            qf_out_dtype dt = !strcmp(ti.dtype, "float32") ? QF_OUT_FLOAT32 : !strcmp(ti.dtype, "float16") ? QF_OUT_FLOAT16 : QF_OUT_BFLOAT16;
            todo[i].dt = dt;
            t->dtype = dt == QF_OUT_FLOAT32 ? "F32" : dt == QF_OUT_FLOAT16 ? "F16" : "BF16";
            if (ti.nbytes > SIZE_MAX) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "too large"); break; }
            t->nbytes = (size_t)ti.nbytes;
        } else {
            t->dtype = ti.dtype;
        }
    }
    if (ok) {
        for (size_t i = 0; i < n; i++) todo[i].name = out->v[todo[i].slot].name;
        qsort(todo, n, sizeof *todo, by_name);
    }
    for (size_t k = 0; k < n && ok; k++) {
        otensor *t = &out->v[todo[k].slot];
        size_t i = todo[k].index;
        if (todo[k].quantized) {
            t->data = (unsigned char *)malloc(t->nbytes ? t->nbytes : 1);
            if (!t->data) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory for the decoded values"); break; }
            s = qf_decode(f, i, todo[k].dt, t->data, t->nbytes, &err);
            if (s) { ok = set_fail(fl, s, err.message); break; }
        } else {
            const void *p;
            size_t nb;
            s = qf_plain_bytes(f, i, &p, &nb, &err);
            if (s) { ok = set_fail(fl, s, err.message); break; }
            t->nbytes = nb;
            t->data = (unsigned char *)malloc(nb ? nb : 1);
            if (!t->data) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); break; }
            if (nb) memcpy(t->data, p, nb);
        }
    }
    free(todo);
    return ok;
}

/* ---- writing a plain safetensors file ---- */
typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;
static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = (char *)realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json_string(sbuf *b, const char *s, size_t n) {
    sb_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '"' || c == '\\') { tmp[0] = '\\'; tmp[1] = (char)c; sb_put(b, tmp, 2); }
        else if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); sb_put(b, tmp, 6); }
        else sb_put(b, (const char *)&c, 1);
    }
    sb_put(b, "\"", 1);
}

static int write_output(const char *path, const olist *l) {
    sbuf h = {0};
    sb_str(&h, "{");
    uint64_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        const otensor *t = &l->v[i];
        char num[64];
        if (i) sb_str(&h, ",");
        sb_json_string(&h, t->name, t->name_len);
        sb_str(&h, ":{\"dtype\":\"");
        sb_str(&h, t->dtype);
        sb_str(&h, "\",\"shape\":[");
        for (size_t a = 0; a < t->rank; a++) {
            snprintf(num, sizeof num, "%s%llu", a ? "," : "", (unsigned long long)t->shape[a]);
            sb_str(&h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off, (unsigned long long)(off + t->nbytes));
        sb_str(&h, num);
        off += t->nbytes;
    }
    sb_str(&h, "}");
    while (!h.oom && h.n % 8) sb_str(&h, " ");
    if (h.oom) { free(h.p); return 0; }
    FILE *fp = fopen(path, "wb");
    if (!fp) { free(h.p); return 0; }
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.n >> (8 * i));
    int ok = fwrite(len, 1, 8, fp) == 8 && fwrite(h.p, 1, h.n, fp) == h.n;
    for (size_t i = 0; ok && i < l->n; i++)
        if (l->v[i].nbytes) ok = fwrite(l->v[i].data, 1, l->v[i].nbytes, fp) == l->v[i].nbytes;
    ok &= fclose(fp) == 0;
    free(h.p);
    return ok;
}

/* ---- sharded checkpoints (SPEC.md 14) ---- */
static unsigned char *read_all(const char *path, size_t *n, size_t limit, int *too_big) {
    *too_big = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) { fclose(fp); return NULL; }
    if (limit && (uint64_t)st.st_size > limit) { fclose(fp); *too_big = 1; return NULL; }
    size_t sz = (size_t)st.st_size;
    unsigned char *b = (unsigned char *)malloc(sz ? sz : 1);
    if (b && sz && fread(b, 1, sz, fp) != sz) { free(b); b = NULL; }
    fclose(fp);
    *n = sz;
    return b;
}

/* SPEC.md 14 (1.2.1): a name two shards expose is INDEX_MISMATCH, checked with the listing rules
 * once a shard's container is read (before its qformat content is used).  A shard whose
 * qformat object is refused at file scope (3.7 steps 1-4) exposes nothing; otherwise every
 * member name of its `tensors` (refused at step 5 or not) and every plain tensor counts.
 * seen: the names of the earlier shards; 1 when f adds none of them (they are then added). */
static int exposure_ok(olist *seen, const qf_file *f, char *msg, size_t msgn) {
    size_t n = qf_tensor_count(f);
    for (size_t i = 0; i < n; i++) {
        struct qf_tensor_info ti;
        qf_tensor_info(f, i, &ti, NULL);
        if (olist_has(seen, ti.name, ti.name_len)) {
            snprintf(msg, msgn, "field weight_map: tensor \"%.*s\" appears in more than one shard", (int)(ti.name_len > 100 ? 100 : ti.name_len), ti.name);
            return 0;
        }
    }
    for (size_t i = 0; i < n; i++) {
        struct qf_tensor_info ti;
        qf_tensor_info(f, i, &ti, NULL);
        otensor *t = olist_push(seen);
        if (!t || !(t->name = (char *)malloc(ti.name_len + 1))) return 1; /* out of memory: the decode's own check remains */
        memcpy(t->name, ti.name, ti.name_len);
        t->name[ti.name_len] = 0;
        t->name_len = ti.name_len;
    }
    return 1;
}

static int load_index(const char *path, olist *out, fail *fl, int verify) {
    qf_index *x = NULL;
    qf_error err;
    qf_status s = qf_index_open(path, &x, &err);
    if (s) return set_fail(fl, s, err.message);
    int ok = 1;
    olist seen = {0};
    for (size_t k = 0; ok && k < qf_index_shard_count(x); k++) {
        char *sp = qf_index_shard_path(x, k);
        if (!sp) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); break; }
        qf_open_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.keep_refused = 1;
        o.verify_digests = verify;
        qf_file *f = NULL;
        s = qf_open_path(sp, &o, &f, &err);
        free(sp);
        if (!f) { ok = set_fail(fl, s, err.message); break; }
        qf_error e2;
        qf_status m = qf_index_check_shard(x, k, f, &e2);
        if (m) ok = set_fail(fl, m, e2.message);
        else if (!exposure_ok(&seen, f, e2.message, sizeof e2.message)) ok = set_fail(fl, QF_E_INDEX_MISMATCH, e2.message);
        else if (s) ok = set_fail(fl, s, err.message);
        else ok = load_file(f, out, fl);
        qf_close(f);
    }
    olist_free(&seen);
    qf_index_close(x);
    return ok;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int read_one(const char *input, const char *output, fail *fl, int verify) {
    olist out = {0};
    int ok;
    struct stat st;
    if (stat(input, &st) != 0 || S_ISDIR(st.st_mode)) {
        olist_free(&out);
        return set_fail(fl, QF_E_FILE_UNREADABLE, "the input does not exist or is a folder");
    }
    if (ends_with(input, ".json")) ok = load_index(input, &out, fl, verify);
    else {
        qf_file *f = NULL;
        qf_error err;
        qf_open_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.verify_digests = verify;
        qf_status s = qf_open_path(input, &o, &f, &err);
        if (s) ok = set_fail(fl, s, err.message);
        else {
            ok = load_file(f, &out, fl);
            qf_close(f);
        }
    }
    if (ok && !write_output(output, &out)) ok = set_fail(fl, QF_E_FILE_UNREADABLE, "cannot write the output");
    olist_free(&out);
    return ok;
}

/* ---- check ---- */
/* one line per problem: control characters of names and messages are shown as '?' */
static void put_clean(const char *s) {
    for (; s && *s; s++) putchar((unsigned char)*s < 0x20 ? '?' : *s);
}
static int print_problem(void *user, const qf_problem *p) {
    (void)user;
    printf("%s\t", p->code);
    if (p->tensor) { printf("tensor \""); put_clean(p->tensor); printf("\" "); }
    if (p->field && p->field[0]) { printf("field "); put_clean(p->field); printf(": "); }
    put_clean(p->message);
    printf("\n");
    return 0;
}

static int cmd_check(int argc, char **argv) {
    unsigned flags = 0;
    const char *path = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--strict")) flags |= QF_CHECK_STRICT;
        else if (!strcmp(argv[i], "--digests")) flags |= QF_CHECK_DIGESTS;
        else path = argv[i];
    }
    if (!path) { fprintf(stderr, "usage: qformat-c check [--strict] [--digests] FILE\n"); return 2; }
    size_t n = 0;
    int big = 0;
    unsigned char *b = read_all(path, &n, 0, &big);
    if (!b) { printf("FILE_UNREADABLE\tcannot read %s\n", path); return 1; }
    qf_error err;
    qf_status s = qf_check_memory(b, n, flags, print_problem, NULL, &err);
    free(b);
    return s ? 1 : 0;
}

static int cmd_inspect(const char *path) {
    qf_file *f = NULL;
    qf_error err;
    qf_status s = qf_open_path(path, NULL, &f, &err);
    if (s) { printf("%s\n%s\n", err.message, qf_status_code(s)); return 1; }
    for (size_t i = 0; i < qf_tensor_count(f); i++) {
        struct qf_tensor_info ti;
        s = qf_tensor_info(f, i, &ti, &err);
        printf("%.*s\t%s\t%s\t[", (int)ti.name_len, ti.name, ti.is_quantized ? "quantized" : "plain", ti.dtype ? ti.dtype : "?");
        for (size_t a = 0; a < ti.rank; a++) printf("%s%llu", a ? ", " : "", (unsigned long long)ti.shape[a]);
        printf("]");
        if (ti.is_quantized && ti.element) printf("\t%s%u\t%s", ti.element, ti.bits, ti.layout);
        if (s) printf("\trefused: %s", err.code);
        printf("\n");
    }
    qf_close(f);
    return 0;
}

static void json_out(const char *s) {
    sbuf b = {0};
    sb_json_string(&b, s, strlen(s));
    fputs(b.p ? b.p : "\"\"", stdout);
    free(b.p);
}

static int cmd_batch(const char *list) {
    FILE *in = list ? fopen(list, "r") : stdin;
    if (!in) { fprintf(stderr, "cannot read %s\n", list); return 2; }
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    while ((got = getline(&line, &cap, in)) > 0) {
        while (got && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        int blank = 1;
        for (ssize_t i = 0; i < got; i++) blank &= line[i] == ' ' || line[i] == '\t';
        if (blank) continue;
        char *tab = strchr(line, '\t');
        const char *output = "/dev/null";
        if (tab) { *tab = 0; output = tab + 1; }
        fail fl = {QF_OK, ""};
        read_one(line, output, &fl, 0);
        printf("{\"input\":");
        json_out(line);
        if (fl.code) printf(",\"code\":\"%s\",\"crash\":null}\n", qf_status_code(fl.code));
        else printf(",\"code\":null,\"crash\":null}\n");
        fflush(stdout);
    }
    free(line);
    if (list) fclose(in);
    return 0;
}

/* ---- check --json and inspect --json: the JSON of the Python CLI (`qformat check --json`,
 * `qformat inspect --json`, format_version 1; qformat/check.py, qformat/inspection.py), for
 * qformat and plain safetensors files and sharded indexes.  Messages are this library's own
 * (the codes, tensors and fields are the same); inspect reports kind "qformat" or "safetensors"
 * only (no convert source detection, no GGUF summary). ---- */
static void sb_u64(sbuf *b, uint64_t v) {
    char t[32];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sb_str(b, t);
}
static void sb_strz(sbuf *b, const char *s) {
    if (s) sb_json_string(b, s, strlen(s));
    else sb_str(b, "null");
}
static void sb_key(sbuf *b, int *first, const char *k) {
    if (!*first) sb_str(b, ", ");
    *first = 0;
    sb_json_string(b, k, strlen(k));
    sb_str(b, ": ");
}
/* Python's repr(round(x, 4)) for a value below 1e16 */
static void sb_round4(sbuf *b, uint64_t num, uint64_t den) {
    if (!den) { sb_str(b, "null"); return; }
    char t[64];
    snprintf(t, sizeof t, "%.4f", (double)num / (double)den);
    size_t n = strlen(t);
    while (n > 0 && t[n - 1] == '0' && t[n - 2] != '.') t[--n] = 0;
    sb_str(b, t);
}

static const char *dirname_end(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* -- check -- */
typedef struct jprob { qf_status code; char *file, *tensor, *field, *message; int payload; } jprob;
typedef struct jprobs { jprob *v; size_t n, cap; } jprobs;
static char *dupz(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *d = (char *)malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}
static void jp_add(jprobs *l, qf_status code, const char *file, const char *tensor, const char *field, const char *msg) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        jprob *v = (jprob *)realloc(l->v, cap * sizeof *v);
        if (!v) return;
        l->v = v;
        l->cap = cap;
    }
    jprob *p = &l->v[l->n++];
    p->code = code;
    p->file = dupz(file);
    p->tensor = dupz(tensor);
    p->field = field && field[0] ? dupz(field) : NULL;
    p->message = dupz(msg);
    p->payload = code == QF_E_PADDING_NONZERO || code == QF_E_PARAM_NONFINITE || code == QF_E_PARAM_DIVISOR_ZERO ||
                 code == QF_E_PARAM_INT_RANGE || code == QF_E_GROUP_INDEX_RANGE || code == QF_E_CODE_OUT_OF_RANGE;
}
static void jp_free(jprobs *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].file), free(l->v[i].tensor), free(l->v[i].field), free(l->v[i].message);
    free(l->v);
    memset(l, 0, sizeof *l);
}
static void sb_problem(sbuf *b, const jprob *p) {
    int first = 1;
    sb_str(b, "{");
    sb_key(b, &first, "code"); sb_strz(b, qf_status_code(p->code));
    sb_key(b, &first, "file"); sb_strz(b, p->file);
    sb_key(b, &first, "tensor"); sb_strz(b, p->tensor);
    sb_key(b, &first, "field"); sb_strz(b, p->field);
    sb_key(b, &first, "message"); sb_strz(b, p->message);
    sb_str(b, "}");
}
static void sb_problems(sbuf *b, const jprobs *l, size_t from, size_t to) {
    sb_str(b, "[");
    for (size_t i = from; i < to; i++) {
        if (i > from) sb_str(b, ", ");
        sb_problem(b, &l->v[i]);
    }
    sb_str(b, "]");
}

typedef struct jfile { char *path; uint64_t quantized, plain, stored; long long digests_verified; size_t p0, p1; } jfile;
typedef struct jcheck { jfile *v; size_t n, cap; jprobs probs; jprobs top; } jcheck;

typedef struct cb_ctx { jprobs *l; const char *file; } cb_ctx;
static int collect_problem(void *user, const qf_problem *p) {
    cb_ctx *c = (cb_ctx *)user;
    jp_add(c->l, p->status, c->file, p->tensor, p->field, p->message);
    return 0;
}

static int tensor_cmp(const char *a, const char *b) {
    if (!a || !b) return (a != NULL) - (b != NULL);
    return strcmp(a, b);
}

static size_t digest_count(const qf_file *f) {
    const qj *t = f->digests ? qj_get(f->digests, "tensors") : NULL;
    return t ? t->n : 0;
}

/* one file: FileReport of qformat/check.py */
static void check_one(jcheck *r, const char *path, unsigned flags) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 8;
        jfile *v = (jfile *)realloc(r->v, cap * sizeof *v);
        if (!v) return;
        r->v = v;
        r->cap = cap;
    }
    jfile *jf = &r->v[r->n++];
    memset(jf, 0, sizeof *jf);
    jf->path = dupz(path);
    jf->digests_verified = -1;
    jf->p0 = r->probs.n;
    size_t n = 0;
    int big = 0;
    unsigned char *buf = read_all(path, &n, 0, &big);
    if (!buf) {
        char m[300];
        snprintf(m, sizeof m, "cannot read %.250s", path);
        jp_add(&r->probs, QF_E_FILE_UNREADABLE, path, NULL, NULL, m);
        jf->p1 = r->probs.n;
        return;
    }
    qf_open_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.keep_refused = 1;
    qf_file *f = NULL;
    qf_error err;
    qf_status fs = qf_open_memory(buf, n, &o, &f, &err);
    int file_scope = fs != QF_OK; /* container or file-scope refusal: no tensor, no payload, no digests */
    if (f) {
        jf->stored = qf_stored_count(f);
        for (size_t i = 0; i < qf_tensor_count(f); i++) {
            struct qf_tensor_info ti;
            qf_tensor_info(f, i, &ti, NULL);
            if (ti.is_quantized) jf->quantized++;
            else jf->plain++;
        }
    }
    cb_ctx c = {&r->probs, path};
    size_t before = r->probs.n;
    /* a container failure: Python reports it alone (lenient findings need a read header) */
    qf_check_memory(buf, n, f ? flags : flags & ~QF_CHECK_STRICT, collect_problem, &c, &err);
    /* Python orders payload problems by tensor name (sorted descriptors), after the others */
    size_t k = before;
    for (size_t i = before; i < r->probs.n; i++)
        if (!r->probs.v[i].payload) { jprob t = r->probs.v[i]; memmove(&r->probs.v[k + 1], &r->probs.v[k], (i - k) * sizeof t); r->probs.v[k++] = t; }
    for (size_t i = k + 1; i < r->probs.n; i++) { /* stable insertion sort by tensor */
        jprob t = r->probs.v[i];
        size_t j = i;
        while (j > k && tensor_cmp(r->probs.v[j - 1].tensor, t.tensor) > 0) { r->probs.v[j] = r->probs.v[j - 1]; j--; }
        r->probs.v[j] = t;
    }
    /* digests problems (DIGEST_*) come after the payload ones: move them to the end */
    k = before;
    for (size_t i = before; i < r->probs.n; i++) {
        qf_status s = r->probs.v[i].code;
        if (s != QF_E_DIGEST_MISMATCH && s != QF_E_DIGEST_UNSUPPORTED) { jprob t = r->probs.v[i]; memmove(&r->probs.v[k + 1], &r->probs.v[k], (i - k) * sizeof t); r->probs.v[k++] = t; }
    }
    if ((flags & QF_CHECK_DIGESTS) && f && !file_scope) {
        size_t listed = digest_count(f), bad = 0, unsupported = 0;
        for (size_t i = before; i < r->probs.n; i++) {
            if (r->probs.v[i].code == QF_E_DIGEST_UNSUPPORTED) unsupported = 1;
            if (r->probs.v[i].code == QF_E_DIGEST_MISMATCH) bad++;
        }
        jf->digests_verified = unsupported ? 0 : (long long)(listed - (bad > listed ? listed : bad));
    }
    if (f) qf_close(f);
    free(buf);
    jf->p1 = r->probs.n;
}

/* an index problem: the message's "field NAME: " prefix is its field */
static void index_problem(jcheck *r, qf_status s, const char *path, const char *msg) {
    char field[96] = "";
    if (!strncmp(msg, "field ", 6)) {
        const char *q = strstr(msg + 6, ": ");
        if (q && (size_t)(q - msg - 6) < sizeof field) {
            memcpy(field, msg + 6, (size_t)(q - msg - 6));
            field[q - msg - 6] = 0;
            msg = q + 2;
        }
    }
    jp_add(&r->top, s, path, NULL, field, msg);
}

static void check_index_json(jcheck *r, const char *path, unsigned flags) {
    qf_index *x = NULL;
    qf_error err;
    qf_status s = qf_index_open(path, &x, &err);
    if (s) { index_problem(r, s, path, err.message); return; }
    olist seen = {0};
    for (size_t k = 0; k < qf_index_shard_count(x); k++) {
        char *sp = qf_index_shard_path(x, k);
        if (!sp) break;
        check_one(r, sp, flags);
        qf_file *f = NULL;
        qf_open_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.keep_refused = 1;
        qf_open_path(sp, &o, &f, &err);
        if (f) {
            qf_error e2;
            qf_status m = qf_index_check_shard(x, k, f, &e2);
            if (m) index_problem(r, m, path, e2.message);
            if (!exposure_ok(&seen, f, e2.message, sizeof e2.message)) index_problem(r, QF_E_INDEX_MISMATCH, path, e2.message);
            qf_close(f);
        }
        free(sp);
    }
    olist_free(&seen);
    qf_index_close(x);
}

static int cmd_check_json(int argc, char **argv, unsigned flags) {
    jcheck r;
    memset(&r, 0, sizeof r);
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--strict") || !strcmp(argv[i], "--digests") || !strcmp(argv[i], "--json")) continue;
        if (ends_with(argv[i], ".safetensors.index.json")) check_index_json(&r, argv[i], flags);
        else check_one(&r, argv[i], flags);
    }
    size_t total = r.top.n + r.probs.n;
    long long dv = -1;
    for (size_t i = 0; i < r.n; i++)
        if (r.v[i].digests_verified >= 0) dv = (dv < 0 ? 0 : dv) + r.v[i].digests_verified;
    sbuf b = {0};
    int first = 1;
    sb_str(&b, "{");
    sb_key(&b, &first, "ok"); sb_str(&b, total ? "false" : "true");
    sb_key(&b, &first, "files"); sb_str(&b, "[");
    for (size_t i = 0; i < r.n; i++) {
        const jfile *jf = &r.v[i];
        int f2 = 1;
        sb_str(&b, i ? ", {" : "{");
        sb_key(&b, &f2, "path"); sb_strz(&b, jf->path);
        sb_key(&b, &f2, "ok"); sb_str(&b, jf->p1 > jf->p0 ? "false" : "true");
        sb_key(&b, &f2, "quantized_tensors"); sb_u64(&b, jf->quantized);
        sb_key(&b, &f2, "plain_tensors"); sb_u64(&b, jf->plain);
        sb_key(&b, &f2, "stored_tensors"); sb_u64(&b, jf->stored);
        sb_key(&b, &f2, "digests_verified");
        if (jf->digests_verified < 0) sb_str(&b, "null");
        else sb_u64(&b, (uint64_t)jf->digests_verified);
        sb_key(&b, &f2, "problems"); sb_problems(&b, &r.probs, jf->p0, jf->p1);
        sb_str(&b, "}");
    }
    sb_str(&b, "]");
    sb_key(&b, &first, "digests_verified");
    if (dv < 0) sb_str(&b, "null");
    else sb_u64(&b, (uint64_t)dv);
    sb_key(&b, &first, "problems");
    sb_str(&b, "[");
    for (size_t i = 0; i < total; i++) {
        if (i) sb_str(&b, ", ");
        sb_problem(&b, i < r.top.n ? &r.top.v[i] : &r.probs.v[i - r.top.n]);
    }
    sb_str(&b, "]}\n");
    fputs(b.p ? b.p : "", stdout);
    free(b.p);
    int unreadable = 0;
    for (size_t i = 0; i < total; i++) {
        qf_status s = i < r.top.n ? r.top.v[i].code : r.probs.v[i - r.top.n].code;
        unreadable |= s == QF_E_FILE_UNREADABLE; /* NOT_SAFETENSORS is a file problem (malformed, SPEC.md 1.2.1) */
    }
    for (size_t i = 0; i < r.n; i++) free(r.v[i].path);
    free(r.v);
    jp_free(&r.probs);
    jp_free(&r.top);
    return unreadable ? 2 : total ? 1 : 0;
}

/* -- inspect -- */
typedef struct irow {
    char *name; size_t name_len;
    size_t rank; uint64_t shape[QF_MAX_RANK];
    const char *dtype;
    int quantized;
    char scheme[400]; const char *scheme_source;
    char element[120];
    sbuf block;                   /* JSON or empty: null */
    char granularity[120]; int has_gran;
    const char *layout;
    uint64_t elements, stored_bytes;
    sbuf components;              /* JSON array */
    size_t seq;
} irow;

static const char *numpy_name(const char *st) {
    static const char *const map[][2] = {{"BOOL", "bool"}, {"U8", "uint8"}, {"I8", "int8"}, {"U16", "uint16"}, {"I16", "int16"},
        {"U32", "uint32"}, {"I32", "int32"}, {"U64", "uint64"}, {"I64", "int64"}, {"F16", "float16"}, {"BF16", "bfloat16"},
        {"F32", "float32"}, {"F64", "float64"}, {"C64", "complex64"}, {"F8_E4M3", "float8_e4m3fn"}, {"F8_E5M2", "float8_e5m2"},
        {"F8_E8M0", "float8_e8m0fnu"}, {"F8_E4M3FNUZ", "float8_e4m3fnuz"}, {"F8_E5M2FNUZ", "float8_e5m2fnuz"}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (!strcmp(map[i][0], st)) return map[i][1];
    return st; /* F6_*, F4: no NumPy view (qformat/tables/dtypes.json) */
}

/* element_text() of qformat/inspection.py */
static void element_text(const qf_quant_info *q, char *out, size_t n) {
    static const char *const SG[] = {"unsigned", "twos_complement", "offset_binary"};
    if (q->element == QF_ELEMENT_INT) {
        int k = snprintf(out, n, "int%u %s", q->bits, SG[q->signedness]);
        if (q->code_offset && k > 0 && (size_t)k < n) k += snprintf(out + k, n - (size_t)k, " offset %u", q->code_offset);
        if (q->frac_bits && k > 0 && (size_t)k < n) snprintf(out + k, n - (size_t)k, " frac %u", q->frac_bits);
    } else if (q->element == QF_ELEMENT_FLOAT) snprintf(out, n, "%s", q->float_format);
    else snprintf(out, n, "codebook%u %s", q->bits, q->codebook ? q->codebook : "in-file");
}

/* blocks_text() of qformat/inspection.py */
static void blocks_text(const qf_param_info *p, const qf_quant_info *q, char *out, size_t n) {
    if (p->flat) { snprintf(out, n, "flat %llu", (unsigned long long)p->flat_size); return; }
    size_t r = q->rank;
    uint64_t eff[QF_MAX_RANK];
    for (size_t a = 0; a < r; a++) eff[a] = p->block[a] == 0 || p->block[a] > q->shape[a] ? q->shape[a] : p->block[a];
    if (p->has_index) {
        uint64_t c = p->index_count ? p->index_count : 1, s = q->shape[p->index_axis];
        snprintf(out, n, "%llu g_idx", (unsigned long long)(s / c + (s % c != 0)));
        return;
    }
    int all = 1, ones_but_last = 1, ones_but_two = 1;
    for (size_t a = 0; a < r; a++) all &= eff[a] == q->shape[a];
    for (size_t a = 0; a + 1 < r; a++) ones_but_last &= eff[a] == 1;
    for (size_t a = 0; a + 2 < r; a++) ones_but_two &= eff[a] == 1;
    if (all) { snprintf(out, n, "tensor"); return; }
    if (r >= 2 && ones_but_last && eff[r - 1] == q->shape[r - 1]) { snprintf(out, n, "channel"); return; }
    if (ones_but_last) { snprintf(out, n, "%llu", (unsigned long long)eff[r - 1]); return; }
    if (r >= 2 && eff[r - 1] == q->shape[r - 1] && ones_but_two) {
        snprintf(out, n, "%llu along axis %zu", (unsigned long long)eff[r - 2], r - 2);
        return;
    }
    size_t k = 0;
    out[0] = 0;
    for (size_t a = 0; a < r && k < n; a++) k += (size_t)snprintf(out + k, n - k, "%s%llu", a ? "x" : "", (unsigned long long)eff[a]);
}

static const char *stored_name(const qf_file *f, size_t j, size_t *len) {
    const char *nm = NULL;
    qf_stored_info(f, j, &nm, len, NULL, NULL, NULL, NULL, NULL);
    return nm;
}

/* the components in references() order (qformat/descriptor.py), once each, and their bytes */
typedef struct comps { size_t v[256]; size_t n; } comps;
static void refs_of(const qf_file *f, size_t i, const char *prefix, comps *c, int depth) {
    qf_quant_info q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    if (qf_tensor_quant(f, i, prefix, &q, NULL) || depth > 8) return;
    static const char *const ROLE[3] = {"zero", "scale", "bias"};
    const qf_param_info *ps[3] = {&q.zero, &q.scale, &q.bias};
    char path[200];
    size_t j;
    const char *leaf[2] = {"codes", "codes.element.table_tensor"};
    for (int k = 0; k < 2; k++) {
        snprintf(path, sizeof path, "%s%s", prefix, leaf[k]);
        if (!qf_tensor_component(f, i, path, &j, NULL)) {
            int seen = 0;
            for (size_t m = 0; m < c->n; m++) seen |= c->v[m] == j;
            if (!seen && c->n < 256) c->v[c->n++] = j;
        }
    }
    for (int r = 0; r < 3; r++) {
        if (!ps[r]->present) continue;
        const char *tails[2] = {".blocks.index", ""};
        for (int k = 0; k < 2; k++) {
            snprintf(path, sizeof path, "%s%s%s", prefix, ROLE[r], tails[k]);
            if (!qf_tensor_component(f, i, path, &j, NULL)) {
                int seen = 0;
                for (size_t m = 0; m < c->n; m++) seen |= c->v[m] == j;
                if (!seen && c->n < 256) c->v[c->n++] = j;
            }
        }
        if (ps[r]->encoded) {
            snprintf(path, sizeof path, "%s%s.encoded.", prefix, ROLE[r]);
            refs_of(f, i, path, c, depth + 1);
        }
    }
}

static void quantized_row(const qf_file *f, size_t i, const struct qf_tensor_info *ti, irow *row) {
    qf_quant_info q;
    memset(&q, 0, sizeof q);
    q.struct_size = sizeof q;
    qf_tensor_quant(f, i, NULL, &q, NULL);
    row->quantized = 1;
    row->dtype = q.dtype;
    row->rank = q.rank;
    memcpy(row->shape, q.shape, sizeof row->shape);
    element_text(&q, row->element, sizeof row->element);
    row->layout = ti->layout;
    const qf_param_info *p = q.scale.present ? &q.scale : q.zero.present ? &q.zero : q.bias.present ? &q.bias : NULL;
    const char *role = p == &q.scale ? "scale" : p == &q.zero ? "zero" : "bias";
    if (p) {
        blocks_text(p, &q, row->granularity, sizeof row->granularity);
        row->has_gran = 1;
        sbuf *b = &row->block;
        if (p->flat) {
            sb_str(b, "{\"type\": \"flat\", \"size\": ");
            sb_u64(b, p->flat_size);
        } else {
            sb_str(b, "{\"type\": \"grid\", \"size\": [");
            for (size_t a = 0; a < q.rank; a++) {
                if (a) sb_str(b, ", ");
                if (p->block[a]) sb_u64(b, p->block[a]);
                else sb_str(b, "null");
            }
            sb_str(b, "]");
            if (p->has_index) {
                char path[40];
                size_t j, nl;
                snprintf(path, sizeof path, "%s.blocks.index", role);
                qf_tensor_component(f, i, path, &j, NULL);
                const char *nm = stored_name(f, j, &nl);
                sb_str(b, ", \"index\": {\"axis\": ");
                sb_u64(b, p->index_axis);
                sb_str(b, ", \"tensor\": ");
                sb_json_string(b, nm, nl);
                sb_str(b, ", \"count\": ");
                sb_u64(b, p->index_count);
                sb_str(b, "}");
            }
        }
        sb_str(b, "}");
    }
    if (ti->scheme && ti->scheme[0]) {
        snprintf(row->scheme, sizeof row->scheme, "%s", ti->scheme);
        row->scheme_source = "descriptor";
    } else { /* derived_scheme() */
        int k;
        if (q.element == QF_ELEMENT_INT) k = snprintf(row->scheme, sizeof row->scheme, "int%u", q.bits);
        else if (q.element == QF_ELEMENT_FLOAT) k = snprintf(row->scheme, sizeof row->scheme, "%s", q.float_format);
        else k = snprintf(row->scheme, sizeof row->scheme, "codebook%u", q.bits);
        if (p) {
            const char *g = row->granularity;
            char gi[120];
            snprintf(gi, sizeof gi, "%s", g);
            char *cut = strstr(gi, " g_idx");
            if (cut) *cut = 0;
            if (!strcmp(g, "channel")) k += snprintf(row->scheme + k, sizeof row->scheme - (size_t)k, " per channel");
            else if (!strcmp(g, "tensor")) k += snprintf(row->scheme + k, sizeof row->scheme - (size_t)k, " per tensor");
            else if (g[0] >= '0' && g[0] <= '9' && !strchr(gi, ' ')) k += snprintf(row->scheme + k, sizeof row->scheme - (size_t)k, " g%s", g);
            else k += snprintf(row->scheme + k, sizeof row->scheme - (size_t)k, " %s", g);
        }
        if (q.zero.present) snprintf(row->scheme + k, sizeof row->scheme - (size_t)k, " asym");
        row->scheme_source = "derived";
    }
    comps c = {{0}, 0};
    refs_of(f, i, "", &c, 0);
    sb_str(&row->components, "[");
    for (size_t m = 0; m < c.n; m++) {
        size_t nl, nb;
        const char *nm = NULL;
        qf_stored_info(f, c.v[m], &nm, &nl, NULL, NULL, NULL, NULL, &nb);
        if (m) sb_str(&row->components, ", ");
        sb_json_string(&row->components, nm, nl);
        row->stored_bytes += nb;
    }
    sb_str(&row->components, "]");
    row->elements = 1;
    for (size_t a = 0; a < q.rank; a++) row->elements *= q.shape[a];
}

static void plain_row(const qf_file *f, const struct qf_tensor_info *ti, irow *row) {
    for (size_t j = 0; j < qf_stored_count(f); j++) {
        const char *nm, *dt;
        size_t nl, rank, nb;
        const uint64_t *shape;
        qf_stored_info(f, j, &nm, &nl, &dt, &rank, &shape, NULL, &nb);
        if (nl != ti->name_len || memcmp(nm, ti->name, nl)) continue;
        row->rank = rank;
        for (size_t a = 0; a < rank && a < QF_MAX_RANK; a++) row->shape[a] = shape[a];
        row->dtype = numpy_name(dt);
        snprintf(row->element, sizeof row->element, "%s", dt);
        row->stored_bytes = nb;
        row->elements = 1;
        for (size_t a = 0; a < rank; a++) row->elements *= shape[a];
        sb_str(&row->components, "[");
        sb_json_string(&row->components, nm, nl);
        sb_str(&row->components, "]");
        return;
    }
}

/* natural_key() of qformat/inspection.py: text and (ASCII) digit runs, numbers by value */
static int natural_cmp(const char *a, size_t an, const char *b, size_t bn) {
    size_t i = 0, j = 0;
    for (int num = 0;; num ^= 1) {
        size_t i0 = i, j0 = j;
        if (!num) {
            while (i < an && !(a[i] >= '0' && a[i] <= '9')) i++;
            while (j < bn && !(b[j] >= '0' && b[j] <= '9')) j++;
            size_t la = i - i0, lb = j - j0, m = la < lb ? la : lb;
            int c = m ? memcmp(a + i0, b + j0, m) : 0;
            if (c) return c;
            if (la != lb) return la < lb ? -1 : 1;
            if (i == an || j == bn) return (i == an ? 0 : 1) - (j == bn ? 0 : 1); /* list lengths */
        } else {
            while (i < an && a[i] >= '0' && a[i] <= '9') i++;
            while (j < bn && b[j] >= '0' && b[j] <= '9') j++;
            while (i0 + 1 < i && a[i0] == '0') i0++;
            while (j0 + 1 < j && b[j0] == '0') j0++;
            if (i - i0 != j - j0) return i - i0 < j - j0 ? -1 : 1;
            int c = memcmp(a + i0, b + j0, i - i0);
            if (c) return c;
        }
    }
}
static int row_cmp(const void *x, const void *y) {
    const irow *a = (const irow *)x, *b = (const irow *)y;
    int c = natural_cmp(a->name, a->name_len, b->name, b->name_len);
    return c ? c : (a->seq > b->seq) - (a->seq < b->seq);
}
static const char *row_scheme(const irow *r) { return r->quantized ? r->scheme : "plain"; }
static const char *row_gran(const irow *r) { return r->has_gran ? r->granularity : ""; }
static int group_cmp(const irow *a, const irow *b) {
    if (a->quantized != b->quantized) return a->quantized ? -1 : 1;
    int c = strcmp(row_scheme(a), row_scheme(b));
    if (!c) c = strcmp(a->element, b->element);
    if (!c) c = strcmp(row_gran(a), row_gran(b));
    return c;
}
static int group_qcmp(const void *x, const void *y) {
    const irow *a = *(const irow *const *)x, *b = *(const irow *const *)y;
    int c = group_cmp(a, b);
    return c ? c : (a->seq > b->seq) - (a->seq < b->seq);
}

static void sb_totals(sbuf *b, const char *k, uint64_t n, uint64_t el, uint64_t nb, int q, const char *scheme, const char *element,
                      const char *gran) {
    int first = 1;
    (void)k;
    sb_str(b, "{");
    if (scheme) {
        sb_key(b, &first, "scheme"); sb_strz(b, scheme);
        sb_key(b, &first, "element"); sb_strz(b, element);
        sb_key(b, &first, "granularity"); sb_strz(b, gran && gran[0] ? gran : NULL);
        sb_key(b, &first, "quantized"); sb_str(b, q ? "true" : "false");
    }
    sb_key(b, &first, "tensors"); sb_u64(b, n);
    sb_key(b, &first, "elements"); sb_u64(b, el);
    sb_key(b, &first, "stored_bytes"); sb_u64(b, nb);
    sb_key(b, &first, "bits_per_weight"); sb_round4(b, nb * 8, el);
    sb_str(b, "}");
}

static int cmd_inspect_json(const char *path) {
    const char *paths[512];
    char *owned[512];
    size_t np = 0, nowned = 0;
    qf_index *x = NULL;
    qf_error err;
    int rc = 0;
    if (ends_with(path, ".json")) {
        if (!ends_with(path, ".safetensors.index.json")) {
            fprintf(stderr, "qformat-c: FILE_UNREADABLE: '%s' is a JSON file but not a sharded checkpoint index (*.safetensors.index.json)\n", path);
            return 2;
        }
        qf_status s = qf_index_open(path, &x, &err);
        if (s) { fprintf(stderr, "qformat-c: %s: %s\n", qf_status_code(s), err.message); return 2; }
        for (size_t k = 0; k < qf_index_shard_count(x) && np < 512; k++) paths[np++] = owned[nowned++] = qf_index_shard_path(x, k);
    } else paths[np++] = path;
    irow *rows = NULL;
    size_t nrows = 0, caprows = 0;
    char *versions[512];
    size_t nver = 0;
    uint64_t file_bytes = 0;
    int any_q = 0;
    olist seen = {0};
    sbuf files = {0};
    sb_str(&files, "[");
    for (size_t k = 0; k < np && !rc; k++) {
        qf_open_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.keep_refused = x != NULL;
        qf_file *f = NULL;
        qf_status s = qf_open_path(paths[k], &o, &f, &err);
        if (f && x) { /* the listing rules and the exposure check, then the shard's qformat content (SPEC.md 14) */
            qf_error e2;
            qf_status m = qf_index_check_shard(x, k, f, &e2);
            if (m) s = m, err = e2;
            else if (!exposure_ok(&seen, f, e2.message, sizeof e2.message)) s = QF_E_INDEX_MISMATCH, err = e2;
        }
        if (!s) s = qf_file_status(f, &err);
        if (s) {
            fprintf(stderr, "qformat-c: %s: %s\n", qf_status_code(s), err.message);
            if (f) qf_close(f);
            rc = 2;
            break;
        }
        struct stat st;
        if (stat(paths[k], &st) == 0) file_bytes += (uint64_t)st.st_size;
        if (k) sb_str(&files, ", ");
        sb_strz(&files, dirname_end(paths[k]));
        if (f->has_qformat) {
            char v[32];
            snprintf(v, sizeof v, "1.%d", f->minor);
            any_q = 1;
            int seen = 0;
            for (size_t m = 0; m < nver; m++) seen |= !strcmp(versions[m], v);
            if (!seen && nver < 512) versions[nver++] = dupz(v);
        }
        for (size_t i = 0; i < qf_tensor_count(f); i++) {
            struct qf_tensor_info ti;
            qf_tensor_info(f, i, &ti, NULL);
            if (nrows == caprows) {
                caprows = caprows ? 2 * caprows : 64;
                rows = (irow *)realloc(rows, caprows * sizeof *rows);
                if (!rows) { fprintf(stderr, "qformat-c: out of memory\n"); return 3; }
            }
            irow *row = &rows[nrows++];
            memset(row, 0, sizeof *row);
            row->name = (char *)malloc(ti.name_len + 1);
            if (row->name) memcpy(row->name, ti.name, ti.name_len), row->name[ti.name_len] = 0;
            row->name_len = ti.name_len;
            /* Python lists quantized tensors in descriptor order first, then plain ones */
            row->seq = (ti.is_quantized ? 0 : ((size_t)1 << 40)) + nrows;
            if (ti.is_quantized) quantized_row(f, i, &ti, row);
            else plain_row(f, &ti, row);
        }
        qf_close(f);
    }
    sb_str(&files, "]");
    for (size_t m = 0; x && !rc && m < nrows; m++) /* SPEC.md 14: a name two shards expose */
        for (size_t j = m + 1; !rc && j < nrows; j++)
            if (rows[m].name_len == rows[j].name_len && !memcmp(rows[m].name, rows[j].name, rows[m].name_len)) {
                fprintf(stderr, "qformat-c: INDEX_MISMATCH: tensor \"%s\" appears in more than one shard\n", rows[m].name);
                rc = 2;
            }
    if (!rc) {
        qsort(rows, nrows, sizeof *rows, row_cmp);
        for (size_t m = 1; m < nver; m++) /* sorted versions */
            for (size_t j = m; j > 0 && strcmp(versions[j - 1], versions[j]) > 0; j--) { char *t = versions[j]; versions[j] = versions[j - 1]; versions[j - 1] = t; }
        sbuf b = {0};
        int first = 1;
        sb_str(&b, "{");
        sb_key(&b, &first, "format_version"); sb_str(&b, "1");
        sb_key(&b, &first, "path"); sb_strz(&b, path);
        sb_key(&b, &first, "kind"); sb_strz(&b, any_q ? "qformat" : "safetensors");
        sb_key(&b, &first, "source_format"); sb_str(&b, "null");
        sb_key(&b, &first, "spec_version");
        if (nver == 0) sb_str(&b, "null");
        else if (nver == 1) sb_strz(&b, versions[0]);
        else {
            sb_str(&b, "[");
            for (size_t m = 0; m < nver; m++) { if (m) sb_str(&b, ", "); sb_strz(&b, versions[m]); }
            sb_str(&b, "]");
        }
        sb_key(&b, &first, "files"); sb_str(&b, files.p);
        sb_key(&b, &first, "file_bytes"); sb_u64(&b, file_bytes);
        sb_key(&b, &first, "gguf"); sb_str(&b, "null");
        uint64_t el = 0, nb = 0, qel = 0, qnb = 0, nq = 0;
        for (size_t m = 0; m < nrows; m++) {
            el += rows[m].elements, nb += rows[m].stored_bytes;
            if (rows[m].quantized) nq++, qel += rows[m].elements, qnb += rows[m].stored_bytes;
        }
        int f2 = 1;
        sb_key(&b, &first, "totals");
        sb_str(&b, "{");
        sb_key(&b, &f2, "tensors"); sb_u64(&b, nrows);
        sb_key(&b, &f2, "quantized"); sb_u64(&b, nq);
        sb_key(&b, &f2, "plain"); sb_u64(&b, nrows - nq);
        sb_key(&b, &f2, "elements"); sb_u64(&b, el);
        sb_key(&b, &f2, "stored_bytes"); sb_u64(&b, nb);
        sb_key(&b, &f2, "bits_per_weight"); sb_round4(&b, nb * 8, el);
        sb_key(&b, &f2, "quantized_elements"); sb_u64(&b, qel);
        sb_key(&b, &f2, "quantized_stored_bytes"); sb_u64(&b, qnb);
        sb_key(&b, &f2, "quantized_bits_per_weight"); sb_round4(&b, qnb * 8, qel);
        sb_str(&b, "}");
        sb_key(&b, &first, "schemes");
        sb_str(&b, "[");
        irow **order = (irow **)malloc((nrows ? nrows : 1) * sizeof *order);
        for (size_t m = 0; order && m < nrows; m++) order[m] = &rows[m];
        if (order) qsort(order, nrows, sizeof *order, group_qcmp);
        for (size_t m = 0; order && m < nrows;) {
            size_t e = m;
            uint64_t gel = 0, gnb = 0;
            while (e < nrows && !group_cmp(order[m], order[e])) gel += order[e]->elements, gnb += order[e]->stored_bytes, e++;
            if (m) sb_str(&b, ", ");
            sb_totals(&b, NULL, e - m, gel, gnb, order[m]->quantized, row_scheme(order[m]), order[m]->element, row_gran(order[m]));
            m = e;
        }
        free(order);
        sb_str(&b, "]");
        sb_key(&b, &first, "tensors");
        sb_str(&b, "[");
        for (size_t m = 0; m < nrows; m++) {
            const irow *r = &rows[m];
            int f3 = 1;
            sb_str(&b, m ? ", {" : "{");
            sb_key(&b, &f3, "name"); sb_json_string(&b, r->name, r->name_len);
            sb_key(&b, &f3, "shape"); sb_str(&b, "[");
            for (size_t a = 0; a < r->rank; a++) { if (a) sb_str(&b, ", "); sb_u64(&b, r->shape[a]); }
            sb_str(&b, "]");
            sb_key(&b, &f3, "dtype"); sb_strz(&b, r->dtype);
            sb_key(&b, &f3, "quantized"); sb_str(&b, r->quantized ? "true" : "false");
            sb_key(&b, &f3, "scheme"); sb_strz(&b, r->quantized ? r->scheme : NULL);
            sb_key(&b, &f3, "scheme_source"); sb_strz(&b, r->quantized ? r->scheme_source : NULL);
            sb_key(&b, &f3, "element"); sb_strz(&b, r->element);
            sb_key(&b, &f3, "block"); sb_str(&b, r->block.n ? r->block.p : "null");
            sb_key(&b, &f3, "granularity"); sb_strz(&b, r->has_gran ? r->granularity : NULL);
            sb_key(&b, &f3, "layout"); sb_strz(&b, r->quantized ? r->layout : NULL);
            sb_key(&b, &f3, "elements"); sb_u64(&b, r->elements);
            sb_key(&b, &f3, "stored_bytes"); sb_u64(&b, r->stored_bytes);
            sb_key(&b, &f3, "bits_per_weight"); sb_round4(&b, r->stored_bytes * 8, r->elements);
            sb_key(&b, &f3, "components"); sb_str(&b, r->components.p ? r->components.p : "[]");
            sb_str(&b, "}");
        }
        sb_str(&b, "]}\n");
        if (b.oom) { fprintf(stderr, "qformat-c: out of memory\n"); rc = 3; }
        else fputs(b.p, stdout);
        free(b.p);
    }
    for (size_t m = 0; m < nrows; m++) free(rows[m].name), free(rows[m].block.p), free(rows[m].components.p);
    free(rows);
    for (size_t m = 0; m < nver; m++) free(versions[m]);
    for (size_t m = 0; m < nowned; m++) free(owned[m]);
    olist_free(&seen);
    free(files.p);
    if (x) qf_index_close(x);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--batch")) return cmd_batch(argc >= 3 ? argv[2] : NULL);
    if (argc >= 2 && !strcmp(argv[1], "check")) {
        unsigned flags = 0;
        int json = 0;
        for (int i = 2; i < argc; i++) {
            if (!strcmp(argv[i], "--json")) json = 1;
            if (!strcmp(argv[i], "--strict")) flags |= QF_CHECK_STRICT;
            if (!strcmp(argv[i], "--digests")) flags |= QF_CHECK_DIGESTS;
        }
        return json ? cmd_check_json(argc - 2, argv + 2, flags) : cmd_check(argc - 2, argv + 2);
    }
    if (argc == 3 && !strcmp(argv[1], "inspect")) return cmd_inspect(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "inspect") && (!strcmp(argv[2], "--json") || !strcmp(argv[3], "--json")))
        return cmd_inspect_json(!strcmp(argv[2], "--json") ? argv[3] : argv[2]);
    if ((argc == 4 || (argc == 5 && !strcmp(argv[2], "--verify"))) && !strcmp(argv[1], "read")) {
        fail fl = {QF_OK, ""};
        if (read_one(argv[argc - 2], argv[argc - 1], &fl, argc == 5)) return 0;
        fprintf(stderr, "%s\n", fl.msg);
        printf("%s\n", qf_status_code(fl.code));
        return 1;
    }
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("qformat-c %s (SPEC %s)\n", qf_version_string(), QF_SPEC_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: qformat-c read [--verify] INPUT OUTPUT | check [--json] [--strict] [--digests] FILE | inspect [--json] FILE | --batch [LIST]\n");
    return 2;
}
