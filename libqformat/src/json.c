/* Strict JSON (SPEC.md 1.2, 2.3 checks 6-7, 3.1, 14), the arena, exact header integers,
 * UTF-8 helpers and problem lists.
 *
 * The parser reports problems in the order the reference readers do: first nesting deeper than
 * the limit anywhere in the text (brackets outside strings, scanned before parsing, so the
 * recursive parser never goes deeper than the limit); then, while parsing, a syntax error where
 * it occurs or a repeated member name when its object closes; last, a lone surrogate escape in
 * any string (found while parsing, reported only once the text parsed). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"

/* ------------------------------------------------------------------ arena */
void *qf_arena_alloc(qf_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    qf_arena_block *b = a->head;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (size_t)1 << 16 ? n : (size_t)1 << 16;
        if (cap > SIZE_MAX - sizeof(qf_arena_block) - 16) return NULL;
        b = (qf_arena_block *)calloc(1, sizeof(qf_arena_block) + 16 + cap);
        if (!b) return NULL;
        b->cap = cap;
        b->next = a->head;
        a->head = b;
    }
    unsigned char *base = (unsigned char *)(b + 1);
    base += (16 - ((uintptr_t)base & 15)) & 15;
    void *p = base + b->used;
    b->used += n;
    return p;
}

void qf_arena_free(qf_arena *a) {
    qf_arena_block *b = a->head;
    while (b) {
        qf_arena_block *n = b->next;
        free(b);
        b = n;
    }
    a->head = NULL;
}

int qf_str_cmp(qf_str a, qf_str b) {
    size_t n = a.n < b.n ? a.n : b.n;
    int c = n ? memcmp(a.p, b.p, n) : 0;
    if (c) return c;
    return a.n < b.n ? -1 : a.n > b.n ? 1 : 0;
}

/* ------------------------------------------------------------------ decimal integers */
int qf_dec_cmp(qf_str a, qf_str b) {
    if (a.n != b.n) return a.n < b.n ? -1 : 1;
    int c = a.n ? memcmp(a.p, b.p, a.n) : 0;
    return c < 0 ? -1 : c > 0;
}

int qf_dec_is_sum(qf_str a, uint64_t add, qf_str e) {
    unsigned char ad[20];
    size_t an = 0, len;
    for (; add; add /= 10) ad[an++] = (unsigned char)(add % 10); /* least significant first */
    len = a.n > an ? a.n : an;
    unsigned carry = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned s = (i < a.n ? (unsigned)(a.p[a.n - 1 - i] - '0') : 0u) + (i < an ? ad[i] : 0u) + carry;
        carry = s / 10;
        if (i >= e.n || (unsigned)(e.p[e.n - 1 - i] - '0') != s % 10) return 0;
    }
    if (carry) {
        if (len >= e.n || e.p[e.n - 1 - len] != '1') return 0;
        len++;
    }
    return e.n == len;
}

int qf_dec_to_u64(qf_str a, uint64_t *v) {
    uint64_t x = 0;
    for (size_t i = 0; i < a.n; i++) {
        unsigned d = (unsigned)(a.p[i] - '0');
        if (x > (UINT64_MAX - d) / 10) return 0;
        x = x * 10 + d;
    }
    *v = x;
    return 1;
}

/* ------------------------------------------------------------------ UTF-8 */
/* RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF. */
int qf_utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c < 0x80) { i++; continue; }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c >= 0xE1 && c <= 0xEC) k = 2;
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xEE && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else return 0;
        if (n - i <= k) return 0;
        if (s[i + 1] < lo || s[i + 1] > hi) return 0;
        for (size_t j = 2; j <= k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k + 1;
    }
    return 1;
}

size_t qf_utf8_codepoints(qf_str s) {
    size_t n = 0;
    for (size_t i = 0; i < s.n; i++)
        if (((unsigned char)s.p[i] & 0xC0) != 0x80) n++;
    return n;
}

/* ------------------------------------------------------------------ problems */
static void copy_trunc(char *dst, size_t cap, const char *src) {
    size_t n = strlen(src);
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = 0;
}

void qf_probs_add(qf_probs *l, qf_status s, qf_str tensor, int has_tensor, const char *field, const char *fmt, ...) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        qf_prob *v = (qf_prob *)realloc(l->v, cap * sizeof *v);
        if (!v) return; /* out of memory: the problem is dropped, never a crash */
        l->v = v;
        l->cap = cap;
    }
    qf_prob *p = &l->v[l->n++];
    memset(p, 0, sizeof *p);
    p->status = s;
    if (has_tensor) {
        p->tensor = (char *)malloc(tensor.n + 1);
        if (p->tensor) {
            if (tensor.n) memcpy(p->tensor, tensor.p, tensor.n);
            p->tensor[tensor.n] = 0;
        }
    }
    copy_trunc(p->field, sizeof p->field, field ? field : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->message, sizeof p->message, fmt, ap);
    va_end(ap);
}

void qf_probs_free(qf_probs *l) {
    for (size_t i = 0; i < l->n; i++) free(l->v[i].tensor);
    free(l->v);
    l->v = NULL;
    l->n = l->cap = 0;
}

void qf_set_error(qf_error *err, qf_status s, const char *fmt, ...) {
    if (!err) return;
    copy_trunc(err->code, sizeof err->code, qf_status_code(s));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
}

void qf_error_from_prob(qf_error *err, const qf_prob *p) {
    if (!err) return;
    char where[256] = "";
    if (p->tensor && p->field[0]) snprintf(where, sizeof where, "tensor \"%.100s\", field %s: ", p->tensor, p->field);
    else if (p->tensor) snprintf(where, sizeof where, "tensor \"%.100s\": ", p->tensor);
    else if (p->field[0]) snprintf(where, sizeof where, "field %s: ", p->field);
    qf_set_error(err, p->status, "[%s] %s%s", qf_status_code(p->status), where, p->message);
}

/* ------------------------------------------------------------------ parser */
typedef struct jp {
    qf_arena *a;
    const unsigned char *s;
    size_t n, i;
    int header;
    int surrogate;   /* a lone surrogate escape was seen */
    int err;
    char *msg;
    size_t msgn;
} jp;

static void fail(jp *p, int kind, const char *what) {
    if (p->err) return;
    p->err = kind;
    if (p->msg) snprintf(p->msg, p->msgn, "%s at byte %zu", what, p->i);
}

static void ws(jp *p) {
    while (p->i < p->n) {
        unsigned char c = p->s[p->i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') p->i++;
        else break;
    }
}

static int hex4(const unsigned char *s, unsigned *v) {
    unsigned x = 0;
    for (int k = 0; k < 4; k++) {
        unsigned c = s[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        x = x * 16 + d;
    }
    *v = x;
    return 1;
}

static size_t put_utf8(unsigned char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (unsigned char)cp; return 1; }
    if (cp < 0x800) { o[0] = (unsigned char)(0xC0 | (cp >> 6)); o[1] = (unsigned char)(0x80 | (cp & 63)); return 2; }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12)); o[1] = (unsigned char)(0x80 | ((cp >> 6) & 63));
        o[2] = (unsigned char)(0x80 | (cp & 63)); return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18)); o[1] = (unsigned char)(0x80 | ((cp >> 12) & 63));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 63)); o[3] = (unsigned char)(0x80 | (cp & 63)); return 4;
}

/* p->s[p->i] == '"'.  Escapes pair left to right (SPEC.md 1.2): a high surrogate escape pairs
 * only with an immediately following low surrogate escape. */
static int jstring(jp *p, qf_str *out) {
    p->i++;
    size_t start = p->i, k = start;
    int esc = 0;
    for (;;) {
        if (k >= p->n) { p->i = k; fail(p, QJ_ERR_SYNTAX, "unterminated string"); return 0; }
        unsigned char c = p->s[k];
        if (c == '"') break;
        if (c < 0x20) { p->i = k; fail(p, QJ_ERR_SYNTAX, "invalid control character in a string"); return 0; }
        if (c == '\\') { esc = 1; k += 2; } else k++;
    }
    size_t end = k;
    if (!esc) {
        out->p = (const char *)p->s + start;
        out->n = end - start;
        p->i = end + 1;
        return 1;
    }
    unsigned char *o = (unsigned char *)qf_arena_alloc(p->a, end - start + 1);
    if (!o) { fail(p, QJ_ERR_NOMEM, "out of memory"); return 0; }
    size_t w = 0, i = start;
    while (i < end) {
        unsigned char c = p->s[i];
        if (c != '\\') { o[w++] = c; i++; continue; }
        unsigned char e = p->s[i + 1];
        switch (e) {
        case '"': o[w++] = '"'; i += 2; break;
        case '\\': o[w++] = '\\'; i += 2; break;
        case '/': o[w++] = '/'; i += 2; break;
        case 'b': o[w++] = '\b'; i += 2; break;
        case 'f': o[w++] = '\f'; i += 2; break;
        case 'n': o[w++] = '\n'; i += 2; break;
        case 'r': o[w++] = '\r'; i += 2; break;
        case 't': o[w++] = '\t'; i += 2; break;
        case 'u': {
            unsigned v, v2;
            if (i + 6 > end || !hex4(p->s + i + 2, &v)) { p->i = i; fail(p, QJ_ERR_SYNTAX, "invalid \\u escape"); return 0; }
            i += 6;
            if (v >= 0xD800 && v <= 0xDBFF && i + 6 <= end && p->s[i] == '\\' && p->s[i + 1] == 'u' &&
                hex4(p->s + i + 2, &v2) && v2 >= 0xDC00 && v2 <= 0xDFFF) {
                i += 6;
                w += put_utf8(o + w, 0x10000 + ((v - 0xD800) << 10) + (v2 - 0xDC00));
            } else {
                if (v >= 0xD800 && v <= 0xDFFF) p->surrogate = 1;
                w += put_utf8(o + w, v); /* a lone surrogate: refused once parsing ends */
            }
            break;
        }
        default: p->i = i; fail(p, QJ_ERR_SYNTAX, "invalid escape"); return 0;
        }
    }
    out->p = (const char *)o;
    out->n = w;
    p->i = end + 1;
    return 1;
}

static int key_cmp_ctx(const qf_str *keys, size_t a, size_t b) { return qf_str_cmp(keys[a], keys[b]); }

/* sort indices by key (heap sort: no recursion, no allocation beyond idx) */
static void sift(size_t *idx, const qf_str *keys, size_t root, size_t n) {
    for (;;) {
        size_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && key_cmp_ctx(keys, idx[c], idx[c + 1]) < 0) c++;
        if (key_cmp_ctx(keys, idx[root], idx[c]) >= 0) return;
        size_t t = idx[root]; idx[root] = idx[c]; idx[c] = t;
        root = c;
    }
}
static int has_duplicate(qf_arena *a, const qf_str *keys, size_t n, int *nomem) {
    if (n < 2) return 0;
    if (n <= 8) {
        for (size_t x = 0; x < n; x++)
            for (size_t y = x + 1; y < n; y++)
                if (qf_str_eq(keys[x], keys[y])) return 1;
        return 0;
    }
    size_t *idx = (size_t *)malloc(n * sizeof *idx);
    (void)a;
    if (!idx) { *nomem = 1; return 0; }
    for (size_t k = 0; k < n; k++) idx[k] = k;
    for (size_t k = n / 2; k-- > 0;) sift(idx, keys, k, n);
    for (size_t end = n; end > 1; end--) {
        size_t t = idx[0]; idx[0] = idx[end - 1]; idx[end - 1] = t;
        sift(idx, keys, 0, end - 1);
    }
    int dup = 0;
    for (size_t k = 1; k < n && !dup; k++) dup = qf_str_eq(keys[idx[k - 1]], keys[idx[k]]);
    free(idx);
    return dup;
}

static qj *jvalue(jp *p);

/* growable temporary list of children, copied into the arena when complete */
typedef struct tmpv { qj **v; qf_str *k; size_t n, cap; } tmpv;
static int tmp_push(tmpv *t, qj *v, qf_str k, int with_key) {
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 8;
        qj **nv = (qj **)realloc(t->v, cap * sizeof *nv);
        if (!nv) return 0;
        t->v = nv;
        if (with_key) {
            qf_str *nk = (qf_str *)realloc(t->k, cap * sizeof *nk);
            if (!nk) return 0;
            t->k = nk;
        }
        t->cap = cap;
    }
    t->v[t->n] = v;
    if (with_key) t->k[t->n] = k;
    t->n++;
    return 1;
}

static qj *new_node(jp *p, qj_type t) {
    qj *v = (qj *)qf_arena_alloc(p->a, sizeof *v);
    if (!v) { fail(p, QJ_ERR_NOMEM, "out of memory"); return NULL; }
    v->t = t;
    return v;
}

static qj *jcontainer(jp *p, int obj) {
    qj *v = new_node(p, obj ? QJ_OBJ : QJ_ARR);
    if (!v) return NULL;
    p->i++;
    tmpv t = {0};
    ws(p);
    if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) {
        p->i++;
        return v;
    }
    for (;;) {
        qf_str key = {0};
        if (obj) {
            if (p->i >= p->n || p->s[p->i] != '"') { fail(p, QJ_ERR_SYNTAX, "expecting a member name"); goto bad; }
            if (!jstring(p, &key)) goto bad;
            ws(p);
            if (p->i >= p->n || p->s[p->i] != ':') { fail(p, QJ_ERR_SYNTAX, "expecting ':'"); goto bad; }
            p->i++;
            ws(p);
        }
        qj *c = jvalue(p);
        if (!c) goto bad;
        if (!tmp_push(&t, c, key, obj)) { fail(p, QJ_ERR_NOMEM, "out of memory"); goto bad; }
        ws(p);
        if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) { p->i++; break; }
        if (p->i >= p->n || p->s[p->i] != ',') { fail(p, QJ_ERR_SYNTAX, obj ? "expecting ',' or '}'" : "expecting ',' or ']'"); goto bad; }
        p->i++;
        ws(p);
    }
    v->n = t.n;
    v->items = (qj **)qf_arena_alloc(p->a, t.n * sizeof(qj *));
    if (!v->items) { fail(p, QJ_ERR_NOMEM, "out of memory"); goto bad; }
    memcpy(v->items, t.v, t.n * sizeof(qj *));
    if (obj) {
        v->keys = (qf_str *)qf_arena_alloc(p->a, t.n * sizeof(qf_str));
        if (!v->keys) { fail(p, QJ_ERR_NOMEM, "out of memory"); goto bad; }
        memcpy(v->keys, t.k, t.n * sizeof(qf_str));
        int nomem = 0;
        if (has_duplicate(p->a, v->keys, v->n, &nomem)) { fail(p, QJ_ERR_DUPLICATE, "a member name appears twice in one object"); goto bad; }
        if (nomem) { fail(p, QJ_ERR_NOMEM, "out of memory"); goto bad; }
    }
    free(t.v);
    free(t.k);
    return v;
bad:
    free(t.v);
    free(t.k);
    return NULL;
}

/* strtod in the "C" locale whatever the caller's locale (a decimal comma would misread "1.5");
 * uselocale is per thread, so this stays safe for concurrent callers. */
static double c_strtod(const char *s) {
    locale_t c = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    locale_t old = c ? uselocale(c) : (locale_t)0;
    double d = strtod(s, NULL);
    if (c) {
        uselocale(old);
        freelocale(c);
    }
    return d;
}

static qj *jnumber(jp *p) {
    size_t st = p->i, k = st;
    const unsigned char *s = p->s;
    int neg = 0;
    if (k < p->n && s[k] == '-') { neg = 1; k++; }
    size_t ds = k;
    if (k < p->n && s[k] == '0') k++;
    else if (k < p->n && s[k] >= '1' && s[k] <= '9') { while (k < p->n && s[k] >= '0' && s[k] <= '9') k++; }
    else { fail(p, QJ_ERR_SYNTAX, "expecting a value (NaN and Infinity are not JSON)"); return NULL; }
    size_t de = k;
    int frac = 0, exp = 0;
    if (k + 1 < p->n && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
        frac = 1; k++;
        while (k < p->n && s[k] >= '0' && s[k] <= '9') k++;
    }
    if (k < p->n && (s[k] == 'e' || s[k] == 'E')) {
        size_t e = k + 1;
        if (e < p->n && (s[e] == '+' || s[e] == '-')) e++;
        if (e < p->n && s[e] >= '0' && s[e] <= '9') {
            exp = 1; k = e;
            while (k < p->n && s[k] >= '0' && s[k] <= '9') k++;
        }
    }
    qj *v = new_node(p, QJ_NUM);
    if (!v) return NULL;
    v->neg = neg;
    p->i = k;
    size_t len = k - st;
    if (frac || exp) {
        /* the binary64 value (strtod rounds to nearest even; overflow gives +-HUGE_VAL = inf) */
        char buf[64];
        char *tmp = len < sizeof buf ? buf : (char *)malloc(len + 1);
        if (!tmp) { fail(p, QJ_ERR_NOMEM, "out of memory"); return NULL; }
        memcpy(tmp, s + st, len);
        tmp[len] = 0;
        v->d = c_strtod(tmp);
        if (tmp != buf) free(tmp);
        return v;
    }
    v->int_lit = 1;
    v->dig.p = (const char *)s + ds;
    v->dig.n = de - ds;
    if (len >= 100) { /* as the reference: a value of 100 characters or more reads as +-2^64 (its digits stay exact) */
        v->huge = 1;
        v->d = neg ? -18446744073709551616.0 : 18446744073709551616.0;
        return v;
    }
    uint64_t mag = 0;
    for (size_t j = ds; j < de; j++) {
        unsigned d = s[j] - '0';
        if (mag > (UINT64_MAX - d) / 10) { v->huge = 1; break; }
        mag = mag * 10 + d;
    }
    v->mag = v->huge ? 0 : mag;
    v->d = v->huge ? 18446744073709551616.0 : (double)mag; /* correctly rounded conversion */
    if (neg) v->d = -v->d;
    return v;
}

static qj *jvalue(jp *p) {
    if (p->i >= p->n) { fail(p, QJ_ERR_SYNTAX, "expecting a value"); return NULL; }
    unsigned char c = p->s[p->i];
    if (c == '{') return jcontainer(p, 1);
    if (c == '[') return jcontainer(p, 0);
    if (c == '"') {
        qj *v = new_node(p, QJ_STR);
        if (!v || !jstring(p, &v->s)) return NULL;
        return v;
    }
    if (p->n - p->i >= 4 && memcmp(p->s + p->i, "true", 4) == 0) {
        qj *v = new_node(p, QJ_BOOL);
        if (v) { v->b = 1; p->i += 4; }
        return v;
    }
    if (p->n - p->i >= 5 && memcmp(p->s + p->i, "false", 5) == 0) {
        qj *v = new_node(p, QJ_BOOL);
        if (v) p->i += 5;
        return v;
    }
    if (p->n - p->i >= 4 && memcmp(p->s + p->i, "null", 4) == 0) {
        qj *v = new_node(p, QJ_NULL);
        if (v) p->i += 4;
        return v;
    }
    return jnumber(p);
}

int qj_parse(qf_arena *a, const char *text, size_t len, int header_mode, unsigned max_depth, qj **out, size_t *end,
             char *msg, size_t msgn) {
    /* 1. depth over the whole text, brackets outside strings; the count may go below zero (text
     * after the object, SPEC.md 2.3 (a)), so it is signed */
    long long depth = 0;
    int in = 0, esc = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (in) {
            if (esc) esc = 0;
            else if (c == '\\') esc = 1;
            else if (c == '"') in = 0;
        } else if (c == '"') in = 1;
        else if (c == '[' || c == '{') {
            if (++depth > (long long)max_depth) {
                if (msg) snprintf(msg, msgn, "nesting deeper than %u", max_depth);
                return QJ_ERR_DEPTH;
            }
        } else if (c == ']' || c == '}') depth--;
    }
    jp p = {a, (const unsigned char *)text, len, 0, header_mode, 0, 0, msg, msgn};
    qj *v = jvalue(&p);
    if (!v) return p.err ? p.err : QJ_ERR_SYNTAX;
    if (p.surrogate) {
        if (msg) snprintf(msg, msgn, "a string holds a lone surrogate escape");
        return QJ_ERR_SURROGATE;
    }
    *out = v;
    *end = p.i;
    return QJ_OK;
}

const qj *qj_get(const qj *o, const char *key) {
    if (!o || o->t != QJ_OBJ) return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (qf_str_is(o->keys[i], key)) return o->items[i];
    return NULL;
}
int qj_has(const qj *o, const char *key) { return qj_get(o, key) != NULL; }

int qj_is_int(const qj *v) {
    if (!v || v->t != QJ_NUM) return 0;
    if (v->int_lit) return 1;
    double d = v->d;
    if (!(d == d) || d - d != 0) return 0;
    if (d >= 9007199254740992.0 || d <= -9007199254740992.0) return 1; /* every such double is integral */
    return (double)(int64_t)d == d;
}

int qj_int_in(const qj *v, int64_t lo, int64_t hi, int64_t *out) {
    if (!v || v->t != QJ_NUM) return 0;
    int64_t x;
    if (v->int_lit) {
        if (v->huge) return 0;
        if (v->neg) {
            if (v->mag > (uint64_t)INT64_MAX) return 0;
            x = -(int64_t)v->mag;
        } else {
            if (v->mag > (uint64_t)INT64_MAX) return 0;
            x = (int64_t)v->mag;
        }
    } else {
        double d = v->d;
        if (!(d == d) || d - d != 0) return 0;            /* NaN or infinite: never an integer */
        if (d < (double)lo || d > (double)hi) return 0;   /* bounds used here are exact doubles */
        if ((double)(int64_t)d != d) return 0;
        x = (int64_t)d;
    }
    if (x < lo || x > hi) return 0;
    if (out) *out = x;
    return 1;
}
