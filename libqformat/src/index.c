/* Sharded checkpoints (SPEC.md 14): the index file, its shard names, and the listing rules
 * checked against each opened shard.  The required order: the index itself (size, JSON,
 * weight_map), then every shard name and its existence (INDEX_INVALID), then shard by shard
 * in code-point order of file names: its container, the listing rules (INDEX_MISMATCH), its
 * qformat content.  A tensor name is never a path: shard names are plain file names. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include "internal.h"

struct qf_index {
    qf_arena arena;
    unsigned char *raw;
    const qj *wm;
    qf_str *shards; size_t nshards;
    char *folder;
};

static int cmp_str(const void *a, const void *b) { return qf_str_cmp(*(const qf_str *)a, *(const qf_str *)b); }

static int plain_name_ok(qf_str s) {
    if (s.n == 0 || qf_str_is(s, ".") || qf_str_is(s, "..")) return 0;
    for (size_t i = 0; i < s.n; i++)
        if (s.p[i] == '/' || s.p[i] == '\\' || s.p[i] == 0) return 0;
    if (s.n >= 2 && s.p[1] == ':' && ((s.p[0] >= 'A' && s.p[0] <= 'Z') || (s.p[0] >= 'a' && s.p[0] <= 'z'))) return 0;
    return 1;
}

void qf_index_close(qf_index *x) {
    if (!x) return;
    qf_arena_free(&x->arena);
    free(x->raw);
    free(x->shards);
    free(x->folder);
    free(x);
}

qf_status qf_index_open(const char *path, qf_index **out, qf_error *err) {
    if (err) err->code[0] = err->message[0] = 0;
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    struct stat st;
    if (!fp || fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fp) fclose(fp);
        qf_set_error(err, QF_E_FILE_UNREADABLE, "cannot read \"%s\"", path);
        return QF_E_FILE_UNREADABLE;
    }
    if ((uint64_t)st.st_size > QF_LIMIT_MAX_INDEX_BYTES) {
        fclose(fp);
        qf_set_error(err, QF_E_INDEX_INVALID, "the index is larger than %llu bytes", QF_LIMIT_MAX_INDEX_BYTES);
        return QF_E_INDEX_INVALID;
    }
    qf_index *x = (qf_index *)calloc(1, sizeof *x);
    size_t n = (size_t)st.st_size;
    if (x) x->raw = (unsigned char *)malloc(n ? n : 1);
    if (!x || !x->raw || (n && fread(x->raw, 1, n, fp) != n)) {
        fclose(fp);
        qf_index_close(x);
        qf_set_error(err, QF_E_FILE_UNREADABLE, "cannot read \"%s\"", path);
        return QF_E_FILE_UNREADABLE;
    }
    fclose(fp);
    qj *obj = NULL;
    size_t end = 0;
    char msg[200] = "";
    int ok = qf_utf8_valid(x->raw, n) &&
             qj_parse(&x->arena, (const char *)x->raw, n, 0, (unsigned)QF_LIMIT_MAX_JSON_DEPTH, &obj, &end, msg, sizeof msg) == QJ_OK;
    for (size_t i = end; ok && i < n; i++) ok = x->raw[i] == ' ' || x->raw[i] == '\t' || x->raw[i] == '\n' || x->raw[i] == '\r';
    const qj *wm = ok ? qj_get(obj, "weight_map") : NULL;
    ok = ok && obj->t == QJ_OBJ && wm && wm->t == QJ_OBJ;
    for (size_t i = 0; ok && i < wm->n; i++) ok = wm->items[i]->t == QJ_STR;
    if (!ok) {
        qf_index_close(x);
        qf_set_error(err, QF_E_INDEX_INVALID, "expected one JSON object with an object 'weight_map' mapping tensor names to shard file names%s%s",
                     msg[0] ? ": " : "", msg);
        return QF_E_INDEX_INVALID;
    }
    x->wm = wm;
    size_t plen = strlen(path);
    x->folder = (char *)malloc(plen + 2);
    x->shards = (qf_str *)malloc((wm->n ? wm->n : 1) * sizeof(qf_str));
    if (!x->folder || !x->shards) {
        qf_index_close(x);
        qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
        return QF_E_SHAPE_UNREPRESENTABLE;
    }
    memcpy(x->folder, path, plen + 1);
    char *slash = strrchr(x->folder, '/');
    if (slash) slash[1] = 0;
    else x->folder[0] = 0;
    for (size_t i = 0; i < wm->n; i++) x->shards[i] = wm->items[i]->s;
    if (wm->n) qsort(x->shards, wm->n, sizeof(qf_str), cmp_str);
    size_t u = 0;
    for (size_t i = 0; i < wm->n; i++)
        if (!u || !qf_str_eq(x->shards[u - 1], x->shards[i])) x->shards[u++] = x->shards[i];
    x->nshards = u;
    for (size_t i = 0; i < u; i++) {
        char *p = NULL;
        int good = plain_name_ok(x->shards[i]) && (p = qf_index_shard_path(x, i)) != NULL;
        struct stat s2;
        good = good && stat(p, &s2) == 0 && S_ISREG(s2.st_mode);
        free(p);
        if (!good) {
            qf_set_error(err, QF_E_INDEX_INVALID, "field weight_map: shard \"%.*s\" is not a plain file name of a file in the index's folder",
                         (int)(x->shards[i].n > 100 ? 100 : x->shards[i].n), x->shards[i].p);
            qf_index_close(x);
            return QF_E_INDEX_INVALID;
        }
    }
    *out = x;
    return QF_OK;
}

size_t qf_index_shard_count(const qf_index *x) { return x ? x->nshards : 0; }

char *qf_index_shard_path(const qf_index *x, size_t k) {
    if (!x || k >= x->nshards) return NULL;
    size_t a = strlen(x->folder), b = x->shards[k].n;
    char *p = (char *)malloc(a + b + 1);
    if (!p) return NULL;
    memcpy(p, x->folder, a);
    memcpy(p + a, x->shards[k].p, b);
    p[a + b] = 0;
    return p;
}

qf_status qf_index_check_shard(const qf_index *x, size_t k, const qf_file *f, qf_error *err) {
    if (err) err->code[0] = err->message[0] = 0;
    if (!x || k >= x->nshards || !f) return QF_E_INDEX_INVALID;
    qf_str shard = x->shards[k];
    const qj *wm = x->wm;
    size_t cnt = 0;
    qf_str *listed = (qf_str *)malloc((wm->n ? wm->n : 1) * sizeof(qf_str));
    if (!listed) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    for (size_t i = 0; i < wm->n; i++)
        if (qf_str_eq(wm->items[i]->s, shard)) listed[cnt++] = wm->keys[i];
    if (cnt) qsort(listed, cnt, sizeof(qf_str), cmp_str);
    qf_status st = QF_OK;
    /* a listed name that is neither a stored tensor nor a logical tensor of the shard; a shard
       refused at file scope defines no logical tensor */
    for (size_t i = 0; i < cnt && !st; i++) {
        int vis = qf_find_entry(f, listed[i]) >= 0;
        for (size_t j = 0; j < f->nlogical && !vis && !f->refused; j++) vis = qf_str_eq(f->logical[j].name, listed[i]);
        if (!vis) {
            qf_set_error(err, QF_E_INDEX_MISMATCH, "field weight_map: the index places \"%.*s\" in \"%.*s\", which has no such tensor",
                         (int)(listed[i].n > 100 ? 100 : listed[i].n), listed[i].p, (int)(shard.n > 100 ? 100 : shard.n), shard.p);
            st = QF_E_INDEX_MISMATCH;
        }
    }
    for (size_t j = 0; j < f->nentries && !st; j++) {
        const qf_entry *e = &f->entries[f->by_name[j]]; /* in name order */
        if (!cnt || !bsearch(&e->name, listed, cnt, sizeof(qf_str), cmp_str)) {
            qf_set_error(err, QF_E_INDEX_MISMATCH, "field weight_map: shard \"%.*s\" holds \"%.*s\", which the index does not list",
                         (int)(shard.n > 100 ? 100 : shard.n), shard.p, (int)(e->name.n > 100 ? 100 : e->name.n), e->name.p);
            st = QF_E_INDEX_MISMATCH;
        }
    }
    free(listed);
    return st;
}
