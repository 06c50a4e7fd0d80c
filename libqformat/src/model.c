/* The qformat view of a file whose container is valid (SPEC.md 3.7): the qformat object, its
 * version, file-scope problems (which refuse the whole file), each descriptor's structural
 * checks (3.2 Q1-Q5, 5.5 D1-D14) and semantic checks (5-9, 11) against the component headers,
 * component claims and name conflicts (4.3), plain tensors (2.2, 2.6).  Only headers are read
 * here, never payload bytes. */
#include <stdio.h>
#include <stdlib.h>
#include "internal.h"

#define READER_MINOR 2
#define MAX_SAFE 9007199254740991LL

static int is_obj(const qj *v) { return v && v->t == QJ_OBJ; }
static int is_str(const qj *v) { return v && v->t == QJ_STR; }
static int is_name(const qj *v) { return is_str(v) && v->s.n > 0; }
static int str_is(const qj *v, const char *z) { return is_str(v) && qf_str_is(v->s, z); }
static int string_of(const qj *v, size_t lo, size_t hi) {
    if (!is_str(v)) return 0;
    size_t n = qf_utf8_codepoints(v->s);
    return n >= lo && n <= hi;
}
static int in_list(qf_str k, const char *const *list) {
    for (; *list; list++)
        if (qf_str_is(k, *list)) return 1;
    return 0;
}
static int only_members(const qj *o, const char *const *allowed) {
    for (size_t i = 0; i < o->n; i++)
        if (!in_list(o->keys[i], allowed)) return 0;
    return 1;
}
static int has_members(const qj *o, const char *const *req) {
    for (; *req; req++)
        if (!qj_has(o, *req)) return 0;
    return 1;
}
static int int_in(const qj *v, int64_t lo, int64_t hi) { return qj_int_in(v, lo, hi, NULL); }
static int array_ints(const qj *v, size_t lo, size_t hi, int64_t a, int64_t b) {
    if (!v || v->t != QJ_ARR || v->n < lo || v->n > hi) return 0;
    for (size_t i = 0; i < v->n; i++)
        if (!int_in(v->items[i], a, b)) return 0;
    return 1;
}

static const char *const EL_INT[] = {"type", "bits", "signedness", "code_offset", "frac_bits", NULL};
static const char *const EL_INT_REQ[] = {"type", "bits", "signedness", NULL};
static const char *const EL_FLOAT[] = {"type", "format", NULL};
static const char *const EL_CB[] = {"type", "bits", "table", "table_tensor", NULL};
static const char *const EL_CB_REQ[] = {"type", "bits", NULL};
static const char *const GRID[] = {"type", "size", "index", NULL};
static const char *const GRID_REQ[] = {"type", "size", NULL};
static const char *const INDEX[] = {"axis", "tensor", "count", NULL};
static const char *const FLAT[] = {"type", "size", NULL};
static const char *const DESC_MEMBERS[] = {"shape", "dtype", "codes", "zero", "scale", "bias", "layout", "allow_nonfinite_params", "scheme", "extensions", NULL};
static const char *const DESC_REQ[] = {"shape", "dtype", "codes", NULL};
static const char *const CODES[] = {"tensor", "element", "packing", NULL};
static const char *const PACKING[] = {"container", "bit_order", "axis", "order", "straddle", "slot_order", "planes", "row_alignment", NULL};
static const char *const SPAN[] = {"span", NULL};
static const char *const PARAM[] = {"blocks", "op", "tensor", "order", "encoded", NULL};
static const char *const LAYOUT[] = {"name", "parameters", NULL};
static const char *const EXT[] = {"name", "must_understand", "configuration", NULL};
static const char *const ROLES[] = {"zero", "scale", "bias"};

static int float_format(qf_str s) {
    for (int i = 0; i < QF_NUM_FLOAT_FORMATS; i++)
        if (qf_str_is(s, qf_float_formats[i].name)) return i;
    return -1;
}
static int codebook_index(qf_str s) {
    for (int i = 0; i < QF_NUM_CODEBOOKS; i++)
        if (qf_str_is(s, qf_codebooks[i].name)) return i;
    return -1;
}

/* 5.5 E-int, E-float, E-codebook (D7) */
static int is_element(const qj *e) {
    if (!is_obj(e)) return 0;
    const qj *t = qj_get(e, "type");
    if (str_is(t, "int"))
        return has_members(e, EL_INT_REQ) && only_members(e, EL_INT) && int_in(qj_get(e, "bits"), 1, 8) &&
               (str_is(qj_get(e, "signedness"), "unsigned") || str_is(qj_get(e, "signedness"), "twos_complement") ||
                str_is(qj_get(e, "signedness"), "offset_binary")) &&
               (!qj_has(e, "code_offset") || int_in(qj_get(e, "code_offset"), 0, 255)) &&
               (!qj_has(e, "frac_bits") || int_in(qj_get(e, "frac_bits"), 0, 16));
    if (str_is(t, "float"))
        return has_members(e, EL_FLOAT) && only_members(e, EL_FLOAT) && is_str(qj_get(e, "format")) &&
               float_format(qj_get(e, "format")->s) >= 0;
    if (str_is(t, "codebook"))
        return has_members(e, EL_CB_REQ) && only_members(e, EL_CB) && (qj_has(e, "table") != qj_has(e, "table_tensor")) &&
               int_in(qj_get(e, "bits"), 1, 8) &&
               (!qj_has(e, "table") || (is_str(qj_get(e, "table")) && codebook_index(qj_get(e, "table")->s) >= 0)) &&
               (!qj_has(e, "table_tensor") || is_name(qj_get(e, "table_tensor")));
    return 0;
}

/* 5.5 B-grid, B-flat (D11) */
static int is_blocks(const qj *b) {
    if (!is_obj(b)) return 0;
    const qj *t = qj_get(b, "type");
    if (str_is(t, "grid")) {
        if (!has_members(b, GRID_REQ) || !only_members(b, GRID)) return 0;
        const qj *s = qj_get(b, "size");
        if (s->t != QJ_ARR || s->n > QF_LIMIT_MAX_RANK) return 0; /* the schema's 64 (SPEC.md 1.2.1, 5.5 B-grid) */
        for (size_t i = 0; i < s->n; i++)
            if (s->items[i]->t != QJ_NULL && !int_in(s->items[i], 1, MAX_SAFE)) return 0;
        const qj *ix = qj_get(b, "index");
        if (!ix) return 1;
        return is_obj(ix) && has_members(ix, INDEX) && only_members(ix, INDEX) && int_in(qj_get(ix, "axis"), 0, 15) &&
               is_name(qj_get(ix, "tensor")) && int_in(qj_get(ix, "count"), 1, MAX_SAFE);
    }
    if (str_is(t, "flat")) return has_members(b, FLAT) && only_members(b, FLAT) && int_in(qj_get(b, "size"), 1, MAX_SAFE);
    return 0;
}

static int is_extensions(const qj *v) {
    if (!v || v->t != QJ_ARR || v->n > QF_LIMIT_MAX_EXTENSIONS) return 0;
    for (size_t i = 0; i < v->n; i++) {
        const qj *e = v->items[i];
        if (!is_obj(e) || !qj_has(e, "name") || !only_members(e, EXT) || !string_of(qj_get(e, "name"), 1, 256)) return 0;
        const qj *m = qj_get(e, "must_understand"), *c = qj_get(e, "configuration");
        if (m && m->t != QJ_BOOL) return 0;
        if (c && !is_obj(c)) return 0;
    }
    return 1;
}

/* the failures of checks D1-D14: their number and whether they share one code */
typedef struct sfail { int n; qf_status first; int mixed; char what[160]; } sfail;
static void sf_add(sfail *f, qf_status code, const char *check, const char *at, const char *msg) {
    if (f->n == 0) {
        f->first = code;
        snprintf(f->what, sizeof f->what, "%.8s at %.60s: %.80s", check, at[0] ? at : "(descriptor)", msg);
    } else if (code != f->first) f->mixed = 1;
    f->n++;
}
static qf_status sf_code(const sfail *f) { return f->n == 0 ? QF_OK : f->mixed ? QF_E_SCHEMA_VIOLATION : f->first; }

static void desc_failures(const qj *d, const char *at, sfail *out) {
    char path[160];
#define P(m) (snprintf(path, sizeof path, "%s%s%s", at, at[0] ? "." : "", m), path)
    if (!is_obj(d)) {
        sf_add(out, QF_E_SCHEMA_VIOLATION, "D1", at, "a descriptor must be a JSON object");
        return;
    }
    if (!has_members(d, DESC_REQ)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D2", at, "a descriptor needs 'shape', 'dtype' and 'codes'");
    if (!only_members(d, DESC_MEMBERS)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D2", at, "unknown descriptor members");
    const qj *v;
    if ((v = qj_get(d, "shape")) && !array_ints(v, 0, QF_LIMIT_MAX_RANK, 0, MAX_SAFE))
        sf_add(out, QF_E_SHAPE_INVALID, "D3", P("shape"), "expected an array of at most 64 integers 0..2^53-1");
    if ((v = qj_get(d, "dtype")) && !(str_is(v, "float32") || str_is(v, "float16") || str_is(v, "bfloat16")))
        sf_add(out, QF_E_DTYPE_INVALID, "D4", P("dtype"), "expected one of float32, float16, bfloat16");
    if ((v = qj_get(d, "codes"))) {
        if (!is_obj(v) || !has_members(v, CODES) || !only_members(v, CODES))
            sf_add(out, QF_E_SCHEMA_VIOLATION, "D5", P("codes"), "expected an object with exactly the members tensor, element, packing");
        if (is_obj(v)) {
            const qj *c = v;
            if ((v = qj_get(c, "tensor")) && !is_name(v)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D6", P("codes.tensor"), "expected a name");
            if ((v = qj_get(c, "element")) && !is_element(v))
                sf_add(out, QF_E_ELEMENT_INVALID, "D7", P("codes.element"), "not an int, float or codebook element as 5.5 describes them");
            const qj *p = qj_get(c, "packing");
            if (p) {
                const char *pp = P("codes.packing");
                char pk[160];
                snprintf(pk, sizeof pk, "%s", pp);
                if (!is_obj(p)) sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "is not an object");
                else {
                    const qj *x;
                    if (!qj_has(p, "container") || !qj_has(p, "bit_order") || !qj_has(p, "axis"))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "needs container, bit_order and axis");
                    if ((x = qj_get(p, "container")) && !(int_in(x, 8, 8) || int_in(x, 16, 16) || int_in(x, 32, 32)))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'container' is not the integer 8, 16 or 32");
                    if ((x = qj_get(p, "bit_order")) && !(str_is(x, "lsb_first") || str_is(x, "msb_first")))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'bit_order' is not lsb_first or msb_first");
                    if ((x = qj_get(p, "axis")) && !(x->t == QJ_NULL || int_in(x, 0, 15)))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'axis' is not null or an integer 0..15");
                    if ((x = qj_get(p, "order")) && !array_ints(x, 0, QF_LIMIT_MAX_RANK, 0, 15))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'order' is not an array of at most 64 integers 0..15");
                    if ((x = qj_get(p, "straddle")) && x->t != QJ_BOOL) sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'straddle' is not a boolean");
                    if ((x = qj_get(p, "slot_order")) && !array_ints(x, 1, 256, 0, 255))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'slot_order' is not an array of 1 to 256 integers 0..255");
                    if ((x = qj_get(p, "planes")) && !(is_obj(x) && int_in(qj_get(x, "span"), 1, MAX_SAFE)))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'planes' is not an object with an integer 'span' 1..2^53-1");
                    if ((x = qj_get(p, "row_alignment")) && !int_in(x, 1, 65536))
                        sf_add(out, QF_E_PACKING_INVALID, "D8", pk, "'row_alignment' is not an integer 1..65536");
                    if (!only_members(p, PACKING)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D9", pk, "a member other than the eight of 7.1");
                    if ((x = qj_get(p, "planes")) && is_obj(x) && !only_members(x, SPAN))
                        sf_add(out, QF_E_SCHEMA_VIOLATION, "D9", pk, "'planes' has a member other than 'span'");
                }
            }
        }
    }
    for (int r = 0; r < 3; r++) {
        const qj *q = qj_get(d, ROLES[r]);
        if (!q) continue;
        char rp[160];
        snprintf(rp, sizeof rp, "%s", P(ROLES[r]));
        if (!is_obj(q)) {
            sf_add(out, QF_E_SCHEMA_VIOLATION, "D10", rp, "is not an object");
            continue;
        }
        int bad = !qj_has(q, "blocks") || !only_members(q, PARAM) || qj_has(q, "tensor") == qj_has(q, "encoded") ||
                  (qj_has(q, "order") && qj_has(q, "encoded"));
        const qj *op = qj_get(q, "op");
        if (r == QF_ROLE_ZERO) bad |= op != NULL;
        else if (r == QF_ROLE_SCALE) bad |= !(str_is(op, "multiply") || str_is(op, "divide"));
        else bad |= !(str_is(op, "add") || str_is(op, "subtract"));
        if (qj_has(q, "tensor") && !is_name(qj_get(q, "tensor"))) bad = 1;
        if (qj_has(q, "order") && !array_ints(qj_get(q, "order"), 0, QF_LIMIT_MAX_RANK, 0, 15)) bad = 1;
        if (bad) sf_add(out, QF_E_SCHEMA_VIOLATION, "D10", rp, "not a parameter as 5.5 D10 describes it");
        if (qj_has(q, "blocks") && !is_blocks(qj_get(q, "blocks"))) sf_add(out, QF_E_BLOCKS_INVALID, "D11", rp, "blocks are not grid or flat blocks as 5.5 describes them");
        if (qj_has(q, "encoded")) {
            sfail inner = {0};
            char ip[200];
            snprintf(ip, sizeof ip, "%.150s.encoded", rp);
            desc_failures(qj_get(q, "encoded"), ip, &inner);
            if (inner.n) sf_add(out, QF_E_SCHEMA_VIOLATION, "D12", ip, inner.what);
        }
    }
    if ((v = qj_get(d, "layout"))) {
        if (!is_obj(v) || !is_name(qj_get(v, "name")) || (qj_has(v, "parameters") && !is_obj(qj_get(v, "parameters"))))
            sf_add(out, QF_E_LAYOUT_INVALID, "D13", P("layout"), "expected an object with a name 'name' and an object 'parameters'");
        if (is_obj(v) && !only_members(v, LAYOUT)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D13'", P("layout"), "a member other than name and parameters");
    }
    if ((v = qj_get(d, "allow_nonfinite_params")) && v->t != QJ_BOOL) sf_add(out, QF_E_SCHEMA_VIOLATION, "D14", P("allow_nonfinite_params"), "expected a boolean");
    if ((v = qj_get(d, "scheme")) && !string_of(v, 1, 64)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D14", P("scheme"), "expected a string of 1 to 64 characters");
    if ((v = qj_get(d, "extensions")) && !is_extensions(v)) sf_add(out, QF_E_SCHEMA_VIOLATION, "D14", P("extensions"), "expected a list of extensions as 3.5 describes them");
#undef P
}

/* nesting depth of a raw descriptor: only an object `encoded` in an object parameter counts */
static int depth_of(const qj *d, int level) {
    int best = 0;
    if (level > 70) return level;
    for (int r = 0; r < 3; r++) {
        const qj *p = qj_get(d, ROLES[r]);
        const qj *e = is_obj(p) ? qj_get(p, "encoded") : NULL;
        if (is_obj(e)) {
            int x = 1 + depth_of(e, level + 1);
            if (x > best) best = x;
        }
    }
    return best;
}

/* ------------------------------------------------------------------ descriptor objects */
static uint64_t jint(const qj *v) { int64_t x = 0; qj_int_in(v, 0, INT64_MAX, &x); return (uint64_t)x; }

static unsigned *uint_list(qf_arena *a, const qj *v, size_t *n) {
    *n = v->n;
    unsigned *o = (unsigned *)qf_arena_alloc(a, (v->n ? v->n : 1) * sizeof(unsigned));
    if (o)
        for (size_t i = 0; i < v->n; i++) o[i] = (unsigned)jint(v->items[i]);
    return o;
}

static qf_desc *desc_from(qf_arena *a, const qj *d);

static int param_from(qf_arena *a, qf_param *p, int role, const qj *q) {
    p->present = 1;
    p->role = role;
    const qj *op = qj_get(q, "op");
    p->op = role == QF_ROLE_ZERO ? QF_OP_SUB : str_is(op, "multiply") ? QF_OP_MUL : str_is(op, "divide") ? QF_OP_DIV
                                                                               : str_is(op, "add") ? QF_OP_ADD : QF_OP_SUB;
    const qj *b = qj_get(q, "blocks");
    p->blocks_json = b;
    if (str_is(qj_get(b, "type"), "flat")) {
        p->flat = 1;
        p->flat_size = jint(qj_get(b, "size"));
    } else {
        const qj *s = qj_get(b, "size");
        p->nsize = s->n;
        p->size = (uint64_t *)qf_arena_alloc(a, (s->n ? s->n : 1) * sizeof(uint64_t));
        if (!p->size) return 0;
        for (size_t i = 0; i < s->n; i++) p->size[i] = s->items[i]->t == QJ_NULL ? 0 : jint(s->items[i]);
        const qj *ix = qj_get(b, "index");
        if (ix) {
            p->has_index = 1;
            p->index_axis = (unsigned)jint(qj_get(ix, "axis"));
            p->index_tensor = qj_get(ix, "tensor")->s;
            p->index_count = jint(qj_get(ix, "count"));
        }
    }
    const qj *t = qj_get(q, "tensor");
    if (t) { p->has_tensor = 1; p->tensor = t->s; }
    const qj *o = qj_get(q, "order");
    if (o) { p->has_order = 1; if (!(p->order = uint_list(a, o, &p->norder))) return 0; }
    const qj *e = qj_get(q, "encoded");
    if (e && !(p->encoded = desc_from(a, e))) return 0;
    return 1;
}

static qf_desc *desc_from(qf_arena *a, const qj *d) {
    qf_desc *x = (qf_desc *)qf_arena_alloc(a, sizeof *x);
    if (!x) return NULL;
    const qj *s = qj_get(d, "shape");
    x->rank = s->n;
    x->shape = (uint64_t *)qf_arena_alloc(a, (s->n ? s->n : 1) * sizeof(uint64_t));
    if (!x->shape) return NULL;
    for (size_t i = 0; i < s->n; i++) x->shape[i] = jint(s->items[i]);
    const qj *dt = qj_get(d, "dtype");
    x->dtype = str_is(dt, "float32") ? 0 : str_is(dt, "float16") ? 1 : 2;
    const qj *c = qj_get(d, "codes"), *el = qj_get(c, "element"), *pk = qj_get(c, "packing");
    x->codes_tensor = qj_get(c, "tensor")->s;
    x->table = -1;
    const qj *ty = qj_get(el, "type");
    if (str_is(ty, "int")) {
        x->el_type = QF_EL_INT;
        x->bits = (unsigned)jint(qj_get(el, "bits"));
        const qj *sg = qj_get(el, "signedness");
        x->signedness = str_is(sg, "unsigned") ? QF_SIGN_UNSIGNED : str_is(sg, "twos_complement") ? QF_SIGN_TWOS : QF_SIGN_OFFSET;
        if (qj_has(el, "code_offset")) x->code_offset = (unsigned)jint(qj_get(el, "code_offset"));
        if (qj_has(el, "frac_bits")) x->frac_bits = (unsigned)jint(qj_get(el, "frac_bits"));
    } else if (str_is(ty, "float")) {
        x->el_type = QF_EL_FLOAT;
        x->fmt = float_format(qj_get(el, "format")->s);
        x->bits = qf_float_formats[x->fmt].bits;
    } else {
        x->el_type = QF_EL_CODEBOOK;
        x->bits = (unsigned)jint(qj_get(el, "bits"));
        if (qj_has(el, "table")) x->table = codebook_index(qj_get(el, "table")->s);
        else { x->has_table_tensor = 1; x->table_tensor = qj_get(el, "table_tensor")->s; }
    }
    x->container = (unsigned)jint(qj_get(pk, "container"));
    x->lsb = str_is(qj_get(pk, "bit_order"), "lsb_first");
    const qj *ax = qj_get(pk, "axis");
    x->axis_null = ax->t == QJ_NULL;
    if (!x->axis_null) x->axis = (unsigned)jint(ax);
    const qj *o = qj_get(pk, "order");
    if (o) { x->has_order = 1; if (!(x->order = uint_list(a, o, &x->norder))) return NULL; }
    const qj *st = qj_get(pk, "straddle");
    x->straddle = st ? st->b : 1;
    const qj *so = qj_get(pk, "slot_order");
    if (so) { x->has_slot_order = 1; if (!(x->slot_order = uint_list(a, so, &x->nslot))) return NULL; }
    const qj *pl = qj_get(pk, "planes");
    if (pl) { x->has_planes = 1; x->planes_span = jint(qj_get(pl, "span")); }
    x->row_alignment = qj_has(pk, "row_alignment") ? jint(qj_get(pk, "row_alignment")) : 1;
    for (int r = 0; r < 3; r++) {
        const qj *q = qj_get(d, ROLES[r]);
        if (q && !param_from(a, &x->p[r], r, q)) return NULL;
    }
    const qj *lay = qj_get(d, "layout");
    if (lay) {
        x->layout_name = qj_get(lay, "name")->s;
        x->layout_params = qj_get(lay, "parameters");
    } else x->layout_name = (qf_str){"canonical", 9};
    x->layout = qf_str_is(x->layout_name, "canonical") ? QF_LAYOUT_CANONICAL : qf_str_is(x->layout_name, "tinygemm_int4_cuda") ? QF_LAYOUT_TINYGEMM
              : qf_str_is(x->layout_name, "marlin_dense") ? QF_LAYOUT_MARLIN : QF_LAYOUT_OTHER;
    const qj *an = qj_get(d, "allow_nonfinite_params");
    x->allow_nonfinite = an ? an->b : 0;
    const qj *sc = qj_get(d, "scheme");
    if (sc) { x->has_scheme = 1; x->scheme = sc->s; }
    x->extensions = qj_get(d, "extensions");
    return x;
}

/* ------------------------------------------------------------------ geometry */
int qf_uses_slots(const qf_desc *d) { return d->container % d->bits == 0 || !d->straddle; }

uint64_t qf_words_per_row(const qf_desc *d, uint64_t length, int aligned, int *overflow) {
    uint64_t w, c = d->container, b = d->bits;
    if (qf_uses_slots(d)) {
        uint64_t n = c / b;
        if (!d->has_planes) w = qf_ceil_div(length, n);
        else {
            uint64_t t = d->planes_span, full = length / t, rest = length % t;
            w = full * qf_ceil_div(t, n) + (rest ? qf_ceil_div(rest, n) : 0); /* <= length */
        }
    } else {
        /* ceil(length * b / c) without overflow: length = q*c + r */
        uint64_t q = length / c, r = length % c;
        w = q * b + qf_ceil_div(r * b, c);
    }
    if (!aligned || d->row_alignment <= 1) return w;
    uint64_t k = d->row_alignment, cw = qf_ceil_div(w, k), out;
    if (qf_mul_u64(cw, k, &out)) { *overflow = 1; return 0; }
    return out;
}

/* The parameter grid shape G (SPEC.md 8), logical axis order. */
int qf_grid_shape(const qf_param *p, const qf_desc *d, uint64_t *g, size_t *gr) {
    if (p->flat) {
        uint64_t n = 1;
        int z = 0;
        for (size_t a = 0; a < d->rank; a++) z |= d->shape[a] == 0;
        if (z) n = 0;
        else
            for (size_t a = 0; a < d->rank; a++)
                if (qf_mul_u64(n, d->shape[a], &n)) return 1;
        g[0] = qf_ceil_div(n, p->flat_size);
        *gr = 1;
        return 0;
    }
    for (size_t a = 0; a < d->rank; a++) {
        if (p->has_index && a == p->index_axis) g[a] = p->index_count;
        else if (p->size[a] == 0) g[a] = 1;
        else g[a] = qf_ceil_div(d->shape[a], p->size[a]);
    }
    *gr = d->rank;
    return 0;
}

static int is_perm(const unsigned *o, size_t n, size_t rank) {
    if (n != rank) return 0;
    unsigned char seen[256] = {0};
    for (size_t i = 0; i < n; i++) {
        if (o[i] >= rank || o[i] >= 256 || seen[o[i]]) return 0;
        seen[o[i]] = 1;
    }
    return 1;
}

static void shape_text(char *buf, size_t n, const uint64_t *s, size_t r) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (size_t i = 0; i < r && k < n - 24; i++) k += (size_t)snprintf(buf + k, n - k, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
    if (k < n - 2) snprintf(buf + k, n - k, "]");
}

/* ------------------------------------------------------------------ semantic validation */
typedef struct vctx {
    qf_file *f;
    qf_str name;
    qf_probs *probs;
} vctx;

#define ADD(code, fld, ...) qf_probs_add(v->probs, code, v->name, 1, fld, __VA_ARGS__)

static int ext_name_ok(qf_str s) {
    /* ^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*)+$ */
    size_t i = 0, labels = 0;
    while (i <= s.n) {
        if (i == s.n) return 0;
        unsigned char c = (unsigned char)s.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))) return 0;
        i++;
        while (i < s.n) {
            c = (unsigned char)s.p[i];
            if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-') i++;
            else break;
        }
        labels++;
        if (i == s.n) return labels >= 2;
        if (s.p[i] != '.') return 0;
        i++;
    }
    return 0;
}

static void extension_problems(qf_probs *out, const qj *exts, int newer, const char *scope, qf_str tensor, int has_tensor) {
    if (!exts) return;
    for (size_t i = 0; i < exts->n; i++) {
        qf_str nm = qj_get(exts->items[i], "name")->s;
        const qj *mu = qj_get(exts->items[i], "must_understand");
        int must = mu ? mu->b : 1;
        if (!ext_name_ok(nm)) {
            qf_probs_add(out, QF_E_EXTENSION_NAME_INVALID, tensor, has_tensor, "extensions", "expected a dotted lower-case namespaced name, found \"%.*s\"", (int)(nm.n > 80 ? 80 : nm.n), nm.p);
            continue;
        }
        int dup = 0;
        for (size_t j = 0; j < i && !dup; j++) {
            qf_str o = qj_get(exts->items[j], "name")->s;
            dup = qf_str_eq(o, nm) && ext_name_ok(o);
        }
        if (dup) {
            qf_probs_add(out, QF_E_EXTENSION_NAME_INVALID, tensor, has_tensor, "extensions", "extension \"%.*s\" appears twice in one list", (int)(nm.n > 80 ? 80 : nm.n), nm.p);
            continue;
        }
        if (nm.n >= 8 && memcmp(nm.p, "qformat.", 8) == 0 && !newer)
            qf_probs_add(out, QF_E_EXTENSION_NAME_INVALID, tensor, has_tensor, "extensions", "\"%.*s\" is in the reserved 'qformat.' namespace", (int)(nm.n > 80 ? 80 : nm.n), nm.p);
        else if (must)
            qf_probs_add(out, QF_E_EXTENSION_UNKNOWN, tensor, has_tensor, "extensions", "%s extension \"%.*s\" is must_understand and this reader does not implement it", scope, (int)(nm.n > 80 ? 80 : nm.n), nm.p);
    }
}

static int same_blocks(const qf_param *a, const qf_param *b) {
    if (a->flat != b->flat) return 0;
    if (a->flat) return a->flat_size == b->flat_size;
    if (a->nsize != b->nsize || a->has_index != b->has_index) return 0;
    for (size_t i = 0; i < a->nsize; i++)
        if (a->size[i] != b->size[i]) return 0;
    if (a->has_index)
        return a->index_axis == b->index_axis && a->index_count == b->index_count && qf_str_eq(a->index_tensor, b->index_tensor);
    return 1;
}

static void layout_problems(vctx *v, const qf_desc *d, int minor, size_t depth, size_t before) {
    const qf_layout_info *info = NULL;
    for (int i = 0; i < QF_NUM_LAYOUTS; i++)
        if (qf_str_is(d->layout_name, qf_layouts[i].name)) info = &qf_layouts[i];
    if (!info || info->since_minor > minor) {
        ADD(QF_E_LAYOUT_UNKNOWN, "layout.name", "layout \"%.*s\" is not defined in version 1.%d", (int)(d->layout_name.n > 60 ? 60 : d->layout_name.n), d->layout_name.p, minor);
        return;
    }
    if (info->forbidden) {
        ADD(QF_E_LAYOUT_FORBIDDEN, "layout.name", "layout \"%s\" is not portable; store the canonical codes instead", info->name);
        return;
    }
    qf_status bad = minor > READER_MINOR ? QF_E_FEATURE_UNSUPPORTED : QF_E_LAYOUT_INVALID;
    const qj *prm = d->layout_params;
    size_t np = prm ? prm->n : 0;
    if (info->nparams == 0 && np) {
        ADD(bad, "layout.parameters", "layout \"%s\" takes no parameters", info->name);
        return;
    }
    /* SPEC.md 1.2.1, 11.1: a missing required argument (LAYOUT_INVALID in every minor) comes
     * before unknown members and values outside the list (FEATURE_UNSUPPORTED in a newer minor) */
    for (unsigned k = 0; k < info->nparams; k++)
        if (!qj_get(prm, info->params[k].name))
            ADD(QF_E_LAYOUT_INVALID, "layout.parameters", "layout \"%s\" requires parameter \"%s\"", info->name, info->params[k].name);
    for (size_t i = 0; i < np; i++) {
        int known = 0;
        for (unsigned k = 0; k < info->nparams; k++) known |= qf_str_is(prm->keys[i], info->params[k].name);
        if (!known) ADD(bad, "layout.parameters", "unknown layout parameter \"%.*s\"", (int)(prm->keys[i].n > 60 ? 60 : prm->keys[i].n), prm->keys[i].p);
    }
    for (unsigned k = 0; k < info->nparams; k++) {
        const qj *val = qj_get(prm, info->params[k].name);
        if (!val) continue;
        int ok = 0;
        int64_t x;
        if (qj_int_in(val, INT64_MIN, INT64_MAX, &x))
            for (unsigned j = 0; j < info->params[k].nvalues; j++) ok |= info->params[k].values[j] == x;
        if (!ok) ADD(bad, "layout.parameters", "parameter \"%s\" of layout \"%s\" is outside its allowed values", info->params[k].name, info->name);
    }
    if (v->probs->n > before || d->layout == QF_LAYOUT_CANONICAL) return;
    if (depth > 0) {
        ADD(QF_E_LAYOUT_MISMATCH, "layout.name", "device layout \"%s\" is allowed only in a top-level descriptor", info->name);
        return;
    }
    if (d->rank != 2) {
        ADD(QF_E_LAYOUT_SHAPE, "shape", "layout \"%s\" needs a rank-2 logical weight [N, K]", info->name);
        return;
    }
    int tiny = d->layout == QF_LAYOUT_TINYGEMM;
    int64_t T = 0;
    if (tiny) qj_int_in(qj_get(prm, "inner_k_tiles"), 0, 64, &T);
    int bits_ok = tiny ? d->bits == 4 : (d->bits == 4 || d->bits == 8);
    if (d->el_type != QF_EL_INT || !bits_ok || d->signedness != QF_SIGN_OFFSET || d->code_offset || d->frac_bits)
        ADD(QF_E_LAYOUT_MISMATCH, "codes.element", "layout \"%s\" needs an offset_binary int element of %s bits", info->name, tiny ? "4" : "4 or 8");
    int order_ok = !d->has_order || (d->norder == 2 && d->order[0] == 0 && d->order[1] == 1);
    if (d->container != 32 || !d->lsb || d->axis_null || d->axis != 1 || !order_ok || d->has_slot_order || d->has_planes || d->row_alignment != 1)
        ADD(QF_E_LAYOUT_MISMATCH, "codes.packing", "layout \"%s\" needs the canonical packing {container 32, lsb_first, axis 1}", info->name);
    uint64_t N = d->shape[0], K = d->shape[1];
    if (tiny ? (N % 8 || K % (uint64_t)(16 * T)) : (K % 128 || N % 64))
        ADD(QF_E_LAYOUT_SHAPE, "shape", "layout \"%s\": [N, K] = [%llu, %llu] breaks its divisibility rules", info->name, (unsigned long long)N, (unsigned long long)K);
    if (d->p[QF_ROLE_ZERO].present) ADD(QF_E_LAYOUT_MISMATCH, "zero", "layout \"%s\" has no zero point", info->name);
    if (!tiny && d->p[QF_ROLE_BIAS].present) ADD(QF_E_LAYOUT_MISMATCH, "bias", "layout \"%s\" has no bias", info->name);
    const qf_param *s = &d->p[QF_ROLE_SCALE];
    if (!s->present) {
        ADD(QF_E_LAYOUT_MISMATCH, "scale", "layout \"%s\" needs a 'scale' parameter", info->name);
        return;
    }
    for (int r = QF_ROLE_SCALE; r <= (tiny ? QF_ROLE_BIAS : QF_ROLE_SCALE); r++) {
        const qf_param *q = &d->p[r];
        if (!q->present) continue;
        const char *role = r == QF_ROLE_SCALE ? "scale" : "bias";
        int op = r == QF_ROLE_SCALE ? QF_OP_MUL : QF_OP_ADD;
        if (!q->has_tensor || q->op != op || q->flat || q->has_index || q->nsize != 2 || q->size[0] != 1) {
            ADD(QF_E_LAYOUT_MISMATCH, role, "layout \"%s\" needs '%s' as a plain tensor with op %s and grid blocks [1, G]", info->name, role, r == QF_ROLE_SCALE ? "multiply" : "add");
            continue;
        }
        if (!tiny && !(q->has_order && q->norder == 2 && q->order[0] == 1 && q->order[1] == 0))
            ADD(QF_E_LAYOUT_MISMATCH, role, "layout \"%s\" stores the scale as [K/G, N]: 'order' must be [1, 0]", info->name);
        uint64_t g = q->size[1];
        int ok = !tiny && (g == 0 || g >= K);
        if (!ok) {
            if (tiny) ok = g != 0 && (g == 32 || g == 64 || g == 128 || g == 256) && K % g == 0;
            else ok = g != 0 && (g == 32 || g == 64 || g == 128) && K % g == 0;
        }
        if (!ok) ADD(QF_E_LAYOUT_GROUP_SIZE, role, "group size %llu is not allowed by layout \"%s\"", (unsigned long long)g, info->name);
    }
    if (tiny && d->p[QF_ROLE_BIAS].present && !same_blocks(&d->p[QF_ROLE_BIAS], s))
        ADD(QF_E_LAYOUT_MISMATCH, "bias.blocks", "layout \"%s\" stores scale and bias as pairs: their blocks must be equal", info->name);
}

static const qf_entry *info_of(vctx *v, qf_str name) {
    int i = qf_find_entry(v->f, name);
    return i < 0 ? NULL : &v->f->entries[i];
}

static int dt_in(int dt, const char *const *list) {
    for (; *list; list++)
        if (strcmp(qf_dtypes[dt].name, *list) == 0) return 1;
    return 0;
}
static const char *const C8[] = {"U8", "I8", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", NULL};
static const char *const C16[] = {"U16", "I16", "F16", "BF16", NULL};
static const char *const C32[] = {"U32", "I32", "F32", NULL};
static const char *const PARAM_DT[] = {"F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "I8", "U8", "I16", "U16", "I32", "U32", NULL};
static const char *const INDEX_DT[] = {"I8", "U8", "I16", "U16", "I32", "U32", "I64", NULL};
static const char *const TABLE_DT[] = {"F32", "F16", "BF16", NULL};

static int same_shape(const uint64_t *a, size_t ra, const uint64_t *b, size_t rb) {
    if (ra != rb) return 0;
    for (size_t i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}
static int same_squeezed(const uint64_t *a, size_t ra, const uint64_t *b, size_t rb) {
    size_t i = 0, j = 0;
    for (;;) {
        while (i < ra && a[i] == 1) i++;
        while (j < rb && b[j] == 1) j++;
        if (i == ra || j == rb) return i == ra && j == rb;
        if (a[i] != b[j]) return 0;
        i++, j++;
    }
}

static void validate_desc(vctx *v, const qf_desc *d, size_t depth, int newer, int minor);

static void param_problems(vctx *v, const qf_desc *d, const qf_param *prm, size_t depth, int newer, int minor) {
    char fld[160];
    const char *role = ROLES[prm->role];
    size_t before = v->probs->n;
    if (!prm->flat) {
        if (prm->nsize != d->rank) {
            snprintf(fld, sizeof fld, "%s.blocks.size", role);
            ADD(QF_E_BLOCKS_INVALID, fld, "expected %zu entries, found %zu", d->rank, prm->nsize);
            return;
        }
        if (prm->has_index) {
            if (prm->index_axis >= d->rank) {
                snprintf(fld, sizeof fld, "%s.blocks.index.axis", role);
                ADD(QF_E_BLOCKS_INVALID, fld, "expected an axis below %zu", d->rank);
                return;
            }
            if (prm->size[prm->index_axis] != 0) {
                snprintf(fld, sizeof fld, "%s.blocks.size", role);
                ADD(QF_E_BLOCKS_INVALID, fld, "the indexed axis %u must have size null", prm->index_axis);
            }
            snprintf(fld, sizeof fld, "%s.blocks.index.tensor", role);
            const qf_entry *t = info_of(v, prm->index_tensor);
            if (!t) ADD(QF_E_COMPONENT_MISSING, fld, "no tensor named \"%.*s\" in the file", (int)(prm->index_tensor.n > 80 ? 80 : prm->index_tensor.n), prm->index_tensor.p);
            else if (!dt_in(t->dtype, INDEX_DT)) ADD(QF_E_COMPONENT_DTYPE, fld, "a group index needs an integer dtype, found %s", qf_dtypes[t->dtype].name);
            else if (!(t->rank == 1 && t->shape[0] == d->shape[prm->index_axis]))
                ADD(QF_E_COMPONENT_SHAPE, fld, "expected shape [%llu]", (unsigned long long)d->shape[prm->index_axis]);
        }
    }
    if (v->probs->n > before) return;
    uint64_t grid[64];
    size_t gr = 0;
    qf_grid_shape(prm, d, grid, &gr);
    if (prm->has_tensor) {
        if (prm->has_order && !is_perm(prm->order, prm->norder, gr)) {
            snprintf(fld, sizeof fld, "%s.order", role);
            ADD(QF_E_BLOCKS_INVALID, fld, "expected a permutation of 0..%zu", gr ? gr - 1 : 0);
            return;
        }
        snprintf(fld, sizeof fld, "%s.tensor", role);
        const qf_entry *t = info_of(v, prm->tensor);
        if (!t) {
            ADD(QF_E_COMPONENT_MISSING, fld, "no tensor named \"%.*s\" in the file", (int)(prm->tensor.n > 80 ? 80 : prm->tensor.n), prm->tensor.p);
            return;
        }
        if (!dt_in(t->dtype, PARAM_DT)) ADD(QF_E_COMPONENT_DTYPE, fld, "a parameter cannot be stored as %s", qf_dtypes[t->dtype].name);
        uint64_t stored[64];
        for (size_t j = 0; j < gr; j++) stored[j] = prm->has_order && prm->norder == gr ? grid[prm->order[j]] : grid[j];
        if (!same_squeezed(t->shape, t->rank, stored, gr)) {
            char a[200], b[200];
            shape_text(a, sizeof a, stored, gr);
            shape_text(b, sizeof b, t->shape, t->rank);
            ADD(QF_E_COMPONENT_SHAPE, fld, "expected the parameter grid %s (size-1 axes may differ), found %s", a, b);
        }
        return;
    }
    const qf_desc *enc = prm->encoded;
    snprintf(fld, sizeof fld, "%s.encoded", role);
    if (depth + 1 > QF_LIMIT_MAX_NESTING_DEPTH) {
        ADD(QF_E_DEPTH_EXCEEDED, fld, "nesting depth %zu exceeds the limit", depth + 1);
        return;
    }
    if (!same_shape(enc->shape, enc->rank, grid, gr)) {
        char a[200];
        shape_text(a, sizeof a, grid, gr);
        snprintf(fld, sizeof fld, "%s.encoded.shape", role);
        ADD(QF_E_SHAPE_INVALID, fld, "an encoded parameter's shape must equal its grid %s", a);
        return;
    }
    size_t from = v->probs->n;
    validate_desc(v, enc, depth + 1, newer, minor);
    for (size_t i = from; i < v->probs->n; i++) {
        qf_prob *p = &v->probs->v[i];
        char nf[200];
        snprintf(nf, sizeof nf, "%s.encoded%s%s", role, p->field[0] ? "." : "", p->field);
        nf[sizeof p->field - 1] = 0;
        memcpy(p->field, nf, sizeof p->field);
    }
}

static void validate_desc(vctx *v, const qf_desc *d, size_t depth, int newer, int minor) {
    size_t before = v->probs->n;
    /* 5.2: numel below 2^64, then an empty shape must be representable */
    uint64_t numel = 1, nz = 1;
    int zero = 0, over = 0, nzover = 0;
    for (size_t a = 0; a < d->rank; a++) {
        if (d->shape[a] == 0) zero = 1;
        else if (qf_mul_u64(nz, d->shape[a], &nz)) nzover = 1;
    }
    if (zero) numel = 0;
    else { numel = nz; over = nzover; }
    if (over) {
        ADD(QF_E_SHAPE_INVALID, "shape", "the element count reaches 2^64");
        return;
    }
    if (zero) {
        uint64_t bytes;
        if (nzover || qf_mul_u64(nz, d->dtype == 0 ? 4 : 2, &bytes) || bytes >= ((uint64_t)1 << 63)) {
            ADD(QF_E_SHAPE_UNREPRESENTABLE, "shape", "the empty logical shape is too large for an array (2^63 bytes or more)");
            return;
        }
    }
    extension_problems(v->probs, d->extensions, newer, "tensor", v->name, 1);
    layout_problems(v, d, minor, depth, before);
    if (v->probs->n > before) return;
    /* element */
    if (d->el_type == QF_EL_INT && d->code_offset >= (1u << d->bits))
        ADD(QF_E_ELEMENT_INVALID, "codes.element", "code_offset must be below 2^bits = %u", 1u << d->bits);
    if (d->el_type == QF_EL_CODEBOOK) {
        if (d->table >= 0) {
            if (qf_codebooks[d->table].len > (1u << d->bits))
                ADD(QF_E_CODEBOOK_INVALID, "codes.element.table", "table %s has %u entries, more than 2^%u", qf_codebooks[d->table].name, qf_codebooks[d->table].len, d->bits);
        } else {
            const qf_entry *t = info_of(v, d->table_tensor);
            if (!t) ADD(QF_E_COMPONENT_MISSING, "codes.element.table_tensor", "no tensor named \"%.*s\" in the file", (int)(d->table_tensor.n > 80 ? 80 : d->table_tensor.n), d->table_tensor.p);
            else if (!dt_in(t->dtype, TABLE_DT)) ADD(QF_E_CODEBOOK_INVALID, "codes.element.table_tensor", "table dtype must be F32, F16 or BF16, found %s", qf_dtypes[t->dtype].name);
            else if (t->rank != 1 || t->shape[0] < 1 || t->shape[0] > (1u << d->bits))
                ADD(QF_E_CODEBOOK_INVALID, "codes.element.table_tensor", "table must be 1-D with 1..%u entries", 1u << d->bits);
        }
    }
    /* packing */
    if (d->bits > d->container) ADD(QF_E_PACKING_INVALID, "codes.packing", "container of %u bits is narrower than %u-bit codes", d->container, d->bits);
    else {
        unsigned n = d->container / d->bits;
        if (!qf_uses_slots(d)) {
            if (d->has_slot_order) ADD(QF_E_PACKING_INVALID, "codes.packing", "slot_order needs whole slots (set straddle false)");
            if (d->has_planes) ADD(QF_E_PACKING_INVALID, "codes.packing", "planes need whole slots (set straddle false)");
        }
        if (d->has_slot_order && !is_perm(d->slot_order, d->nslot, n)) ADD(QF_E_PACKING_INVALID, "codes.packing", "slot_order must be a permutation of 0..%u", n - 1);
    }
    if (d->has_order && !is_perm(d->order, d->norder, d->rank)) ADD(QF_E_PACKING_INVALID, "codes.packing.order", "expected a permutation of 0..%zu", d->rank ? d->rank - 1 : 0);
    if (!d->axis_null) {
        if (d->rank == 0) ADD(QF_E_PACKING_INVALID, "codes.packing.axis", "a rank-0 tensor must be packed with axis null");
        else if (d->axis >= d->rank) ADD(QF_E_PACKING_INVALID, "codes.packing.axis", "expected a storage axis below %zu", d->rank);
    }
    if (v->probs->n == before) {
        const qf_entry *t = info_of(v, d->codes_tensor);
        if (!t) ADD(QF_E_COMPONENT_MISSING, "codes.tensor", "no tensor named \"%.*s\" in the file", (int)(d->codes_tensor.n > 80 ? 80 : d->codes_tensor.n), d->codes_tensor.p);
        else {
            const char *const *ok = d->container == 8 ? C8 : d->container == 16 ? C16 : C32;
            if (!dt_in(t->dtype, ok)) ADD(QF_E_COMPONENT_DTYPE, "codes.tensor", "a %u-bit container cannot be stored as %s", d->container, qf_dtypes[t->dtype].name);
            uint64_t want[64];
            size_t wr = d->rank;
            char a[200], b[200];
            shape_text(b, sizeof b, t->shape, t->rank);
            if (d->layout != QF_LAYOUT_CANONICAL) {
                uint64_t N = d->shape[0], K = d->shape[1];
                if (d->layout == QF_LAYOUT_TINYGEMM) {
                    int64_t T = 2;
                    qj_int_in(qj_get(d->layout_params, "inner_k_tiles"), 0, 64, &T);
                    want[0] = N / 8; want[1] = K / (uint64_t)(16 * T); want[2] = 32; want[3] = (uint64_t)T / 2;
                    wr = 4;
                } else {
                    want[0] = K / 16; want[1] = N * 16 * d->bits / 32;
                    wr = 2;
                }
                if (!same_shape(t->shape, t->rank, want, wr)) {
                    shape_text(a, sizeof a, want, wr);
                    ADD(QF_E_COMPONENT_SHAPE, "codes.tensor", "layout %.*s stores the codes as %s, found %s", (int)d->layout_name.n, d->layout_name.p, a, b);
                }
            } else {
                uint64_t stored[64], L;
                for (size_t j = 0; j < d->rank; j++) stored[j] = d->shape[d->has_order ? d->order[j] : j];
                int of = 0;
                if (d->axis_null) {
                    L = numel;
                    uint64_t W = qf_words_per_row(d, L, 1, &of), cnt = 1;
                    int z = 0, o2 = 0;
                    for (size_t k = 0; k < t->rank; k++) z |= t->shape[k] == 0;
                    if (z) cnt = 0;
                    else
                        for (size_t k = 0; k < t->rank && !o2; k++) o2 = qf_mul_u64(cnt, t->shape[k], &cnt);
                    if (of || o2 || cnt != W)
                        ADD(QF_E_COMPONENT_SHAPE, "codes.tensor", "expected %llu containers in all, found shape %s", (unsigned long long)W, b);
                } else {
                    L = stored[d->axis];
                    uint64_t W = qf_words_per_row(d, L, 1, &of);
                    memcpy(want, stored, d->rank * sizeof(uint64_t));
                    want[d->axis] = W;
                    if (of || !same_shape(t->shape, t->rank, want, d->rank)) {
                        shape_text(a, sizeof a, want, d->rank);
                        ADD(QF_E_COMPONENT_SHAPE, "codes.tensor", "expected shape %s, found %s", a, b);
                    }
                }
            }
        }
    }
    for (int r = 0; r < 3; r++)
        if (d->p[r].present) param_problems(v, d, &d->p[r], depth, newer, minor);
}

/* ------------------------------------------------------------------ the file */
static int version_ok(qf_str s, long *major, long *minor) {
    /* ^(0|[1-9][0-9]{0,8})\.(0|[1-9][0-9]{0,8})$ */
    size_t i = 0;
    long part[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        size_t st = i;
        while (i < s.n && s.p[i] >= '0' && s.p[i] <= '9') i++;
        size_t len = i - st;
        if (len == 0 || len > 9 || (len > 1 && s.p[st] == '0')) return 0;
        for (size_t j = st; j < i; j++) part[k] = part[k] * 10 + (s.p[j] - '0');
        if (k == 0) {
            if (i >= s.n || s.p[i] != '.') return 0;
            i++;
        }
    }
    if (i != s.n) return 0;
    *major = part[0];
    *minor = part[1];
    return 1;
}

static int digests_ok(const qj *d, char *why, size_t n) {
    if (!is_obj(d)) { snprintf(why, n, "Q5: 'digests' is not an object"); return 0; }
    static const char *const DG[] = {"algorithm", "tensors", NULL};
    if (!only_members(d, DG)) { snprintf(why, n, "Q5: 'digests' has unknown members"); return 0; }
    const qj *alg = qj_get(d, "algorithm");
    int ok = is_str(alg) && alg->s.n >= 1 && alg->s.n <= 32;
    for (size_t i = 0; ok && i < alg->s.n; i++) {
        char c = alg->s.p[i];
        ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || (c == '-' && i > 0);
    }
    if (!ok) { snprintf(why, n, "Q5: 'digests.algorithm' is not a name of [a-z0-9-] (1 to 32 characters)"); return 0; }
    const qj *ts = qj_get(d, "tensors");
    if (!is_obj(ts)) { snprintf(why, n, "Q5: 'digests.tensors' is not an object"); return 0; }
    for (size_t i = 0; i < ts->n; i++) {
        const qj *x = ts->items[i];
        int good = is_str(x) && x->s.n >= 1 && x->s.n <= 128;
        for (size_t k = 0; good && k < x->s.n; k++) {
            char c = x->s.p[k];
            good = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
        }
        if (!good) { snprintf(why, n, "Q5: a digest is not 1 to 128 lower-case hexadecimal digits"); return 0; }
    }
    return 1;
}

typedef struct claimref { qf_str comp; int owner; size_t seq; } claimref;
static int claim_cmp(const void *x, const void *y) {
    const claimref *a = (const claimref *)x, *b = (const claimref *)y;
    int c = qf_str_cmp(a->comp, b->comp);
    if (c) return c;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

typedef struct refl { qf_str *name; int *is_index; size_t n, cap; } refl;
static int refl_push(refl *r, qf_str s, int idx) {
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        qf_str *a = (qf_str *)realloc(r->name, cap * sizeof *a);
        if (!a) return 0;
        r->name = a;
        int *b = (int *)realloc(r->is_index, cap * sizeof *b);
        if (!b) return 0;
        r->is_index = b;
        r->cap = cap;
    }
    r->name[r->n] = s;
    r->is_index[r->n++] = idx;
    return 1;
}
/* every reference of a descriptor (SPEC.md 4.2), in the order of the reference reader */
static int references(const qf_desc *d, refl *r) {
    if (!refl_push(r, d->codes_tensor, 0)) return 0;
    if (d->has_table_tensor && !refl_push(r, d->table_tensor, 0)) return 0;
    for (int k = 0; k < 3; k++) {
        const qf_param *p = &d->p[k];
        if (!p->present) continue;
        if (p->has_index && !refl_push(r, p->index_tensor, 1)) return 0;
        if (p->has_tensor) { if (!refl_push(r, p->tensor, 0)) return 0; }
        else if (p->encoded && !references(p->encoded, r)) return 0;
    }
    return 1;
}

qf_status qf_interpret(qf_file *f, qf_error *err) {
    f->owner = (int *)qf_arena_alloc(&f->arena, (f->nentries ? f->nentries : 1) * sizeof(int));
    f->plain_prob_of = (int *)qf_arena_alloc(&f->arena, (f->nentries ? f->nentries : 1) * sizeof(int));
    if (!f->owner || !f->plain_prob_of) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    for (size_t i = 0; i < f->nentries; i++) f->owner[i] = -1, f->plain_prob_of[i] = -1;
    const qj *text = qj_get(f->metadata, "qformat");
    if (text) {
        f->has_qformat = 1;
        if (text->s.n > QF_LIMIT_MAX_QFORMAT_JSON_BYTES) {
            qf_set_error(err, QF_E_QFORMAT_JSON_INVALID, "the qformat metadata value is larger than %llu bytes", QF_LIMIT_MAX_QFORMAT_JSON_BYTES);
            return QF_E_QFORMAT_JSON_INVALID;
        }
        qj *obj = NULL;
        size_t end = 0;
        char msg[200] = "";
        int rc = qj_parse(&f->arena, text->s.p, text->s.n, 0, (unsigned)QF_LIMIT_MAX_JSON_DEPTH, &obj, &end, msg, sizeof msg);
        if (rc == QJ_OK)
            for (size_t i = end; i < text->s.n; i++) {
                char c = text->s.p[i];
                if (c != ' ' && c != '\t' && c != '\n' && c != '\r') { rc = QJ_ERR_SYNTAX; snprintf(msg, sizeof msg, "text follows the JSON object"); break; }
            }
        if (rc != QJ_OK) {
            qf_set_error(err, QF_E_QFORMAT_JSON_INVALID, "the qformat metadata value is not valid JSON: %s", msg);
            return QF_E_QFORMAT_JSON_INVALID;
        }
        if (obj->t != QJ_OBJ) {
            qf_set_error(err, QF_E_QFORMAT_JSON_INVALID, "the qformat metadata value must be a JSON object");
            return QF_E_QFORMAT_JSON_INVALID;
        }
        const qj *ver = qj_get(obj, "version");
        if (!ver) {
            qf_set_error(err, QF_E_VERSION_MISSING, "field version: the qformat object has no 'version'");
            return QF_E_VERSION_MISSING;
        }
        long major = 0, minor = 0;
        if (!is_str(ver) || !version_ok(ver->s, &major, &minor)) {
            qf_set_error(err, QF_E_VERSION_INVALID, "field version: expected a string MAJOR.MINOR such as \"1.0\"");
            return QF_E_VERSION_INVALID;
        }
        if (major != 1) {
            qf_set_error(err, QF_E_VERSION_UNSUPPORTED, "field version: this reader implements major version 1, the file declares %ld.%ld", major, minor);
            return QF_E_VERSION_UNSUPPORTED;
        }
        f->minor = (int)minor;
        f->newer = minor > READER_MINOR;
        int with_digests = f->newer || minor >= 2;
        char why[200] = "";
        const qj *tensors = qj_get(obj, "tensors");
        if (!tensors) snprintf(why, sizeof why, "Q1: the qformat object has no 'tensors'");
        else if (!is_obj(tensors)) snprintf(why, sizeof why, "Q2: 'tensors' is not an object");
        if (!why[0] && !f->newer) {
            static const char *const TOP[] = {"version", "tensors", "extensions", NULL};
            static const char *const TOP2[] = {"version", "tensors", "extensions", "digests", NULL};
            if (!only_members(obj, with_digests ? TOP2 : TOP)) snprintf(why, sizeof why, "Q3: unknown top-level members");
        }
        if (!why[0] && qj_has(obj, "extensions") && !is_extensions(qj_get(obj, "extensions")))
            snprintf(why, sizeof why, "Q4: 'extensions' is not a list of extensions as 3.5 describes them");
        if (!why[0] && with_digests && qj_has(obj, "digests")) digests_ok(qj_get(obj, "digests"), why, sizeof why);
        if (why[0]) {
            qf_status s = f->newer ? QF_E_FEATURE_UNSUPPORTED : QF_E_SCHEMA_VIOLATION;
            qf_set_error(err, s, "%s", why);
            return s;
        }
        qf_probs fp = {0};
        extension_problems(&fp, qj_get(obj, "extensions"), f->newer, "file", (qf_str){0, 0}, 0);
        if (fp.n) {
            qf_error_from_prob(err, &fp.v[0]);
            qf_status s = fp.v[0].status;
            qf_probs_free(&fp);
            return s;
        }
        if (with_digests && qj_has(obj, "digests")) f->digests = qj_get(obj, "digests");
        f->nlogical = tensors->n;
        f->logical = (qf_logical *)calloc(tensors->n ? tensors->n : 1, sizeof(qf_logical));
        if (!f->logical) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
        for (size_t i = 0; i < tensors->n; i++) {
            qf_logical *L = &f->logical[i];
            L->name = tensors->keys[i];
            L->raw = tensors->items[i];
            if (L->name.n == 0 || qf_str_is(L->name, "__metadata__")) {
                qf_probs_add(&L->probs, QF_E_SCHEMA_VIOLATION, L->name, 1, "", "a logical tensor name must not be empty or __metadata__");
                continue;
            }
            if (is_obj(L->raw) && depth_of(L->raw, 0) > (int)QF_LIMIT_MAX_NESTING_DEPTH) {
                qf_probs_add(&L->probs, QF_E_DEPTH_EXCEEDED, L->name, 1, "", "encoded parameters nest deeper than %llu", QF_LIMIT_MAX_NESTING_DEPTH);
                continue;
            }
            sfail sf = {0};
            desc_failures(L->raw, "", &sf);
            if (sf.n) {
                qf_probs_add(&L->probs, f->newer ? QF_E_FEATURE_UNSUPPORTED : sf_code(&sf), L->name, 1, "", "%s", sf.what);
                continue;
            }
            L->desc = desc_from(&f->arena, L->raw);
            if (!L->desc) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
            vctx v = {f, L->name, &L->probs};
            validate_desc(&v, L->desc, 0, f->newer, f->minor);
        }
        /* step 6: claims (4.3) */
        claimref *cl = NULL;
        size_t ncl = 0, capcl = 0, seq = 0;
        refl r = {0};
        for (size_t i = 0; i < f->nlogical; i++) {
            if (!f->logical[i].desc) continue;
            r.n = 0;
            if (!references(f->logical[i].desc, &r)) { free(r.name); free(r.is_index); free(cl); qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
            for (size_t k = 0; k < r.n; k++) {
                int state = -1; /* is_index of the most recent earlier reference to the same name */
                for (size_t j = k; j-- > 0;)
                    if (qf_str_eq(r.name[j], r.name[k])) { state = r.is_index[j]; break; }
                if (state == 1 && r.is_index[k]) continue;
                if (ncl == capcl) {
                    capcl = capcl ? capcl * 2 : 64;
                    claimref *n2 = (claimref *)realloc(cl, capcl * sizeof *cl);
                    if (!n2) { free(r.name); free(r.is_index); free(cl); qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
                    cl = n2;
                }
                cl[ncl].comp = r.name[k];
                cl[ncl].owner = (int)i;
                cl[ncl].seq = seq++;
                ncl++;
            }
        }
        free(r.name);
        free(r.is_index);
        if (ncl) qsort(cl, ncl, sizeof *cl, claim_cmp);
        for (size_t a = 0; a < ncl;) {
            size_t b = a;
            while (b < ncl && qf_str_eq(cl[b].comp, cl[a].comp)) b++;
            if (b - a > 1) {
                for (size_t k = a; k < b; k++) {
                    int dupo = 0;
                    for (size_t j = a; j < k; j++) dupo |= cl[j].owner == cl[k].owner;
                    if (dupo) continue;
                    qf_logical *L = &f->logical[cl[k].owner];
                    qf_probs_add(&L->probs, QF_E_COMPONENT_CLAIMED_TWICE, L->name, 1, "", "component \"%.*s\" is referenced %zu times",
                                 (int)(cl[a].comp.n > 80 ? 80 : cl[a].comp.n), cl[a].comp.p, b - a);
                }
            }
            int e = qf_find_entry(f, cl[a].comp);
            if (e >= 0) f->owner[e] = cl[a].owner;
            a = b;
        }
        free(cl);
        for (size_t i = 0; i < f->nlogical; i++) {
            qf_logical *L = &f->logical[i];
            int e = qf_find_entry(f, L->name);
            if (e < 0) continue;
            int own = f->owner[e];
            if (own < 0 && L->probs.n == 0)
                qf_probs_add(&L->probs, QF_E_NAME_CONFLICT, L->name, 1, "", "logical tensor has the name of a plain tensor");
            else if (own >= 0 && own != (int)i)
                qf_probs_add(&L->probs, QF_E_NAME_CONFLICT, L->name, 1, "", "logical tensor has the name of a component of \"%.*s\"",
                             (int)(f->logical[own].name.n > 80 ? 80 : f->logical[own].name.n), f->logical[own].name.p);
        }
    }
    /* exposed tensors: logical ones and plain ones (2.4 order: by data, then name) */
    size_t cap = f->nlogical + f->nentries + 1;
    f->exposed = (qf_exposed *)calloc(cap, sizeof(qf_exposed));
    if (!f->exposed) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); return QF_E_SHAPE_UNREPRESENTABLE; }
    for (size_t i = 0; i < f->nlogical; i++) {
        qf_exposed *x = &f->exposed[f->nexposed++];
        x->name = f->logical[i].name;
        x->logical = (int)i;
        x->entry = -1;
        x->key_begin = x->key_end = UINT64_MAX; /* a refused tensor without components sorts first */
        int first = 1;
        for (size_t e = 0; e < f->nentries; e++) {
            if (f->owner[e] != (int)i) continue;
            const qf_entry *en = &f->entries[e];
            if (first || en->begin < x->key_begin || (en->begin == x->key_begin && en->end < x->key_end)) {
                x->key_begin = en->begin;
                x->key_end = en->end;
                first = 0;
            }
        }
        if (first) x->key_begin = x->key_end = 0, x->logical = (int)i;
    }
    for (size_t e = 0; e < f->nentries; e++) {
        const qf_entry *en = &f->entries[e];
        if (f->owner[e] >= 0) continue;
        int is_logical = 0;
        for (size_t i = 0; i < f->nlogical && !is_logical; i++) is_logical = qf_str_eq(f->logical[i].name, en->name);
        if (is_logical) continue;
        qf_exposed *x = &f->exposed[f->nexposed++];
        x->name = en->name;
        x->logical = -1;
        x->entry = (int)e;
        x->key_begin = en->begin;
        x->key_end = en->end;
        /* 2.2: an empty plain tensor must be representable (F6_* read as 1-D bytes) */
        int zero = 0;
        for (size_t k = 0; k < en->rank; k++) zero |= en->shape[k] == 0;
        const char *dn = qf_dtypes[en->dtype].name;
        if (zero && strncmp(dn, "F6_", 3) != 0) {
            unsigned bits = qf_dtypes[en->dtype].bits;
            uint64_t span = bits >= 8 ? bits / 8 : 1;
            int of = 0;
            for (size_t k = 0; k < en->rank && !of; k++)
                if (en->shape[k]) of = qf_mul_u64(span, en->shape[k], &span);
            if (of || span >= ((uint64_t)1 << 63)) {
                f->plain_prob_of[e] = (int)f->plain_probs.n;
                qf_probs_add(&f->plain_probs, QF_E_SHAPE_UNREPRESENTABLE, en->name, 1, "shape",
                             "plain tensor of %s is empty but too large for an array (2^63 bytes or more)", dn);
            }
        }
    }
    /* sort: (begin, end, name) -- insertion of a shell sort, reentrant */
    size_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
    for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++) {
        size_t g = gaps[gi];
        for (size_t i = g; i < f->nexposed; i++) {
            qf_exposed t = f->exposed[i];
            size_t j = i;
            for (; j >= g; j -= g) {
                const qf_exposed *p = &f->exposed[j - g];
                int c = p->key_begin != t.key_begin ? (p->key_begin > t.key_begin ? 1 : -1)
                      : p->key_end != t.key_end ? (p->key_end > t.key_end ? 1 : -1) : qf_str_cmp(p->name, t.name);
                if (c <= 0) break;
                f->exposed[j] = f->exposed[j - g];
            }
            f->exposed[j] = t;
        }
    }
    return QF_OK;
}
