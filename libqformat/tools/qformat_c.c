/* qformat-c: the command-line tool of libqformat and its conformance reader
 * (conformance/README.md, the command protocol):
 *
 *   qformat-c read INPUT OUTPUT        decode INPUT (.safetensors or *.safetensors.index.json)
 *                                      into a plain safetensors OUTPUT; on failure print the
 *                                      error code as the first word of the last line, exit 1
 *   qformat-c check [--strict] [--digests] FILE   every problem's code, one per line
 *   qformat-c --batch [LIST]           lines "INPUT<TAB>OUTPUT" -> one JSON line each
 *   qformat-c inspect FILE             list the tensors */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "qformat.h"

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

/* every exposed tensor of an open file, decoded (1.4: the first problem decides) */
static int load_file(qf_file *f, olist *out, fail *fl) {
    qf_error err;
    qf_status s = qf_file_status(f, &err);
    if (s) return set_fail(fl, s, err.message);
    size_t n = qf_tensor_count(f);
    for (size_t i = 0; i < n; i++) {
        struct qf_tensor_info ti;
        s = qf_tensor_info(f, i, &ti, &err);
        if (s) return set_fail(fl, s, err.message);
        if (olist_has(out, ti.name, ti.name_len)) {
            snprintf(err.message, sizeof err.message, "tensor \"%.*s\" appears in more than one shard", (int)(ti.name_len > 100 ? 100 : ti.name_len), ti.name);
            return set_fail(fl, QF_E_INDEX_MISMATCH, err.message);
        }
        otensor *t = olist_push(out);
        if (!t) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
        t->name = (char *)malloc(ti.name_len + 1);
        if (!t->name) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
        memcpy(t->name, ti.name, ti.name_len);
        t->name[ti.name_len] = 0;
        t->name_len = ti.name_len;
        t->rank = ti.rank;
        memcpy(t->shape, ti.shape, sizeof t->shape);
        if (ti.is_quantized) {
            qf_out_dtype dt = !strcmp(ti.dtype, "float32") ? QF_OUT_FLOAT32 : !strcmp(ti.dtype, "float16") ? QF_OUT_FLOAT16 : QF_OUT_BFLOAT16;
            t->dtype = dt == QF_OUT_FLOAT32 ? "F32" : dt == QF_OUT_FLOAT16 ? "F16" : "BF16";
            if (ti.nbytes > SIZE_MAX) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "too large");
            t->nbytes = (size_t)ti.nbytes;
            t->data = (unsigned char *)malloc(t->nbytes ? t->nbytes : 1);
            if (!t->data) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory for the decoded values");
            s = qf_decode(f, i, dt, t->data, t->nbytes, &err);
            if (s) return set_fail(fl, s, err.message);
        } else {
            const void *p;
            size_t nb;
            s = qf_plain_bytes(f, i, &p, &nb, &err);
            if (s) return set_fail(fl, s, err.message);
            t->dtype = ti.dtype;
            t->nbytes = nb;
            t->data = (unsigned char *)malloc(nb ? nb : 1);
            if (!t->data) return set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
            if (nb) memcpy(t->data, p, nb);
        }
    }
    return 1;
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

static int load_index(const char *path, olist *out, fail *fl) {
    qf_index *x = NULL;
    qf_error err;
    qf_status s = qf_index_open(path, &x, &err);
    if (s) return set_fail(fl, s, err.message);
    int ok = 1;
    for (size_t k = 0; ok && k < qf_index_shard_count(x); k++) {
        char *sp = qf_index_shard_path(x, k);
        if (!sp) { ok = set_fail(fl, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); break; }
        qf_open_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.keep_refused = 1;
        qf_file *f = NULL;
        s = qf_open_path(sp, &o, &f, &err);
        free(sp);
        if (!f) { ok = set_fail(fl, s, err.message); break; }
        qf_error e2;
        qf_status m = qf_index_check_shard(x, k, f, &e2);
        if (m) ok = set_fail(fl, m, e2.message);
        else if (s) ok = set_fail(fl, s, err.message);
        else ok = load_file(f, out, fl);
        qf_close(f);
    }
    qf_index_close(x);
    return ok;
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int read_one(const char *input, const char *output, fail *fl) {
    olist out = {0};
    int ok;
    struct stat st;
    if (stat(input, &st) != 0 || S_ISDIR(st.st_mode)) {
        olist_free(&out);
        return set_fail(fl, QF_E_FILE_UNREADABLE, "the input does not exist or is a folder");
    }
    if (ends_with(input, ".json")) ok = load_index(input, &out, fl);
    else {
        qf_file *f = NULL;
        qf_error err;
        qf_status s = qf_open_path(input, NULL, &f, &err);
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
        read_one(line, output, &fl);
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

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "--batch")) return cmd_batch(argc >= 3 ? argv[2] : NULL);
    if (argc >= 2 && !strcmp(argv[1], "check")) return cmd_check(argc - 2, argv + 2);
    if (argc == 3 && !strcmp(argv[1], "inspect")) return cmd_inspect(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "read")) {
        fail fl = {QF_OK, ""};
        if (read_one(argv[2], argv[3], &fl)) return 0;
        fprintf(stderr, "%s\n", fl.msg);
        printf("%s\n", qf_status_code(fl.code));
        return 1;
    }
    if (argc == 2 && !strcmp(argv[1], "--version")) {
        printf("qformat-c %s (SPEC %s)\n", qf_version_string(), QF_SPEC_VERSION);
        return 0;
    }
    fprintf(stderr, "usage: qformat-c read INPUT OUTPUT | check [--strict] [--digests] FILE | inspect FILE | --batch [LIST]\n");
    return 2;
}
