/* The safetensors container (SPEC.md 2): the header length, the header JSON, the tensor
 * entries and the tiling of the data buffer, checked in the order of 2.3 before anything from
 * the header is used.  Nothing is allocated from an unchecked size: the header is at most
 * max_header_bytes and inside the file before it is parsed, and tensor byte ranges are exact
 * (decimal digit strings, SPEC.md 1.2.1: however many digits) until the tiling check has put
 * them inside the file. */
#include <stdlib.h>
#include "internal.h"

static int is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static int dtype_index(qf_str s) {
    for (int i = 0; i < QF_NUM_DTYPES; i++)
        if (qf_str_is(s, qf_dtypes[i].name)) return i;
    return -1;
}

/* A header integer: written without fraction or exponent, non-negative (-0 is 0). */
static int header_uint(const qj *v) { return v && v->t == QJ_NUM && v->int_lit && (!v->neg || (!v->huge && v->mag == 0)); }

typedef struct span { qf_str b, e; size_t idx; } span;

static int span_cmp(const void *x, const void *y) {
    const span *a = (const span *)x, *b = (const span *)y;
    int c = qf_dec_cmp(a->b, b->b);
    if (!c) c = qf_dec_cmp(a->e, b->e);
    return c;
}


/* SPEC.md 1.2.1, 2.3 (d): after dropping at most 3 trailing bytes that are a cut UTF-8 sequence,
 * b is well-formed UTF-8 (RFC 3629) whose code points are TAB, LF, CR, U+0020..U+007E or U+00A0
 * and above */
static int is_text(const unsigned char *b, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned c = b[i], cp;
        if (c < 0x80) {
            if (!(c == 0x09 || c == 0x0A || c == 0x0D || (c >= 0x20 && c <= 0x7E))) return 0;
            i++;
            continue;
        }
        size_t k;
        unsigned lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) k = 1, cp = c & 0x1F;
        else if (c == 0xE0) k = 2, lo = 0xA0, cp = c & 0x0F;
        else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) k = 2, cp = c & 0x0F;
        else if (c == 0xED) k = 2, hi = 0x9F, cp = c & 0x0F;
        else if (c == 0xF0) k = 3, lo = 0x90, cp = c & 0x07;
        else if (c >= 0xF1 && c <= 0xF3) k = 3, cp = c & 0x07;
        else if (c == 0xF4) k = 3, hi = 0x8F, cp = c & 0x07;
        else return 0;
        for (size_t j = 1; j <= k; j++) {
            if (i + j == n) return 1; /* a sequence cut by the end (at most 3 bytes): dropped */
            unsigned x = b[i + j];
            if (x < (j == 1 ? lo : 0x80) || x > (j == 1 ? hi : 0xBF)) return 0;
            cp = (cp << 6) | (x & 0x3F);
        }
        if (cp < 0xA0) return 0; /* U+0080..U+009F: C1 controls */
        i += k + 1;
    }
    return 1;
}

/* SPEC.md 1.2.1, 2.3: what a file whose first 8 bytes b (n: their little-endian value) fail
 * check 2 or 3 is when it is no safetensors file at all, or NULL (a damaged length) */
static const char *not_safetensors(const unsigned char *b, uint64_t n) {
    if (!memcmp(b, "GGUF", 4)) return "a GGUF file";
    if (!memcmp(b, "PK\x03\x04", 4)) return "a ZIP archive (a PyTorch .bin/.pt checkpoint?)";
    /* a pickle of protocol 4 or 5 starts with a frame whose 8-byte length leaves bytes 6 and 7
     * zero: no bound on n here */
    if (b[0] == 0x80 && b[1] >= 2 && b[1] <= 5) return "a serialized Python object stream (a PyTorch .bin checkpoint?)";
    if (n < ((uint64_t)1 << 48)) return NULL;
    if (is_text(b, 8)) return "a text file";
    return NULL;
}

static char *tensor_label(const qf_entry *e, char *buf, size_t n) {
    size_t k = e->name.n < n - 1 ? e->name.n : n - 1;
    memcpy(buf, e->name.p, k);
    buf[k] = 0;
    return buf;
}

qf_status qf_parse_container(qf_file *f, qf_error *err) {
    uint64_t size = f->size;
    if (size < 8) {
        qf_set_error(err, QF_E_HEADER_TOO_SMALL, "expected at least 8 bytes, the file has %llu", (unsigned long long)size);
        return QF_E_HEADER_TOO_SMALL;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | f->data[i];
    if (n > QF_LIMIT_MAX_HEADER_BYTES || n == 0 || n > size - 8) {
        const char *what = not_safetensors(f->data, n);
        if (what) {
            qf_set_error(err, QF_E_NOT_SAFETENSORS, "the file is %s, not safetensors: its first 8 bytes are no safetensors header length", what);
            return QF_E_NOT_SAFETENSORS;
        }
    }
    if (n > QF_LIMIT_MAX_HEADER_BYTES) {
        qf_set_error(err, QF_E_HEADER_TOO_LARGE, "header length %llu exceeds the limit %llu", (unsigned long long)n, QF_LIMIT_MAX_HEADER_BYTES);
        return QF_E_HEADER_TOO_LARGE;
    }
    if (n == 0 || n > size - 8) {
        qf_set_error(err, QF_E_HEADER_LENGTH_INVALID, "header length %llu does not fit a file of %llu bytes", (unsigned long long)n, (unsigned long long)size);
        return QF_E_HEADER_LENGTH_INVALID;
    }
    const char *text = (const char *)f->data + 8;
    size_t hlen = (size_t)n;
    if (!qf_utf8_valid((const unsigned char *)text, hlen)) {
        qf_set_error(err, QF_E_HEADER_NOT_UTF8, "the header is not valid UTF-8");
        return QF_E_HEADER_NOT_UTF8;
    }
    size_t lead = 0;
    while (lead < hlen && is_ws((unsigned char)text[lead])) lead++;
    if (lead) qf_probs_add(&f->lenient, QF_E_HEADER_LEADING_WHITESPACE, (qf_str){0, 0}, 0, "",
                           "the header begins with %zu JSON whitespace byte(s) before '{': safetensors reads it, its writer never writes it", lead);
    if (lead >= hlen || text[lead] != '{') {
        qf_set_error(err, QF_E_HEADER_INVALID_JSON, "the header must begin with '{' (after optional JSON whitespace)");
        return QF_E_HEADER_INVALID_JSON;
    }
    qj *root = NULL;
    size_t end = 0;
    char msg[200] = "";
    int rc = qj_parse(&f->arena, text + lead, hlen - lead, 1, (unsigned)QF_LIMIT_MAX_JSON_DEPTH, &root, &end, msg, sizeof msg);
    if (rc == QJ_ERR_DUPLICATE) {
        qf_set_error(err, QF_E_HEADER_DUPLICATE_KEY, "the header repeats a member name in one object (%s)", msg);
        return QF_E_HEADER_DUPLICATE_KEY;
    }
    if (rc == QJ_ERR_NOMEM) {
        qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory while parsing the header");
        return QF_E_SHAPE_UNREPRESENTABLE;
    }
    if (rc != QJ_OK) {
        qf_set_error(err, QF_E_HEADER_INVALID_JSON, "the header is not valid JSON: %s", msg);
        return QF_E_HEADER_INVALID_JSON;
    }
    end += lead;
    int nonspace = 0;
    for (size_t i = end; i < hlen; i++) {
        if (!is_ws((unsigned char)text[i])) {
            qf_set_error(err, QF_E_HEADER_INVALID_JSON, "only JSON whitespace padding may follow the header object (byte %zu)", i);
            return QF_E_HEADER_INVALID_JSON;
        }
        if (text[i] != ' ') nonspace = 1;
    }
    if (nonspace) qf_probs_add(&f->lenient, QF_E_HEADER_PADDING_NOT_SPACE, (qf_str){0, 0}, 0, "",
                               "the header object is followed by padding other than spaces (0x20)");
    if (root->t != QJ_OBJ) {
        qf_set_error(err, QF_E_HEADER_INVALID_JSON, "the header must be a JSON object");
        return QF_E_HEADER_INVALID_JSON;
    }
    f->entries = (qf_entry *)qf_arena_alloc(&f->arena, (root->n ? root->n : 1) * sizeof(qf_entry));
    span *spans = (span *)calloc(root->n ? root->n : 1, sizeof(span));
    if (!f->entries || !spans) {
        free(spans);
        qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory");
        return QF_E_SHAPE_UNREPRESENTABLE;
    }
    qf_status st = QF_OK;
    char lab[120];
    size_t ne = 0;
    for (size_t i = 0; i < root->n; i++) {
        qf_str name = root->keys[i];
        const qj *ent = root->items[i];
        if (qf_str_is(name, "__metadata__")) {
            if (ent->t == QJ_NULL) { /* 2.4: what mx.save_safetensors writes; read as no metadata */
                qf_probs_add(&f->lenient, QF_E_METADATA_INVALID, (qf_str){0, 0}, 0, "__metadata__",
                             "__metadata__ is null: read as no metadata, as safetensors reads it");
                continue;
            }
            int ok = ent->t == QJ_OBJ;
            for (size_t k = 0; ok && k < ent->n; k++) ok = ent->items[k]->t == QJ_STR;
            if (!ok) {
                qf_set_error(err, QF_E_METADATA_INVALID, "__metadata__ must be an object whose values are all strings");
                st = QF_E_METADATA_INVALID;
                goto out;
            }
            f->metadata = ent;
            continue;
        }
        qf_entry *e = &f->entries[ne];
        e->name = name;
        e->order = ne;
        tensor_label(e, lab, sizeof lab);
        if (name.n == 0) qf_probs_add(&f->lenient, QF_E_TENSOR_NAME_INVALID, name, 1, "",
                                      "a tensor name is empty: safetensors writes and reads it, qformat reads it");
        const qj *dt = qj_get(ent, "dtype"), *shape = qj_get(ent, "shape"), *offs = qj_get(ent, "data_offsets");
        if (ent->t != QJ_OBJ || ent->n != 3 || !dt || !shape || !offs) {
            qf_set_error(err, QF_E_TENSOR_ENTRY_INVALID, "tensor \"%s\": expected exactly the fields data_offsets, dtype, shape", lab);
            st = QF_E_TENSOR_ENTRY_INVALID;
            goto out;
        }
        if (dt->t != QJ_STR) {
            qf_set_error(err, QF_E_TENSOR_ENTRY_INVALID, "tensor \"%s\": dtype must be a string", lab);
            st = QF_E_TENSOR_ENTRY_INVALID;
            goto out;
        }
        e->dtype = dtype_index(dt->s);
        if (e->dtype < 0) {
            qf_set_error(err, QF_E_DTYPE_UNKNOWN, "tensor \"%s\": dtype \"%.*s\" is not a safetensors dtype", lab, (int)(dt->s.n > 40 ? 40 : dt->s.n), dt->s.p);
            st = QF_E_DTYPE_UNKNOWN;
            goto out;
        }
        int ok = shape->t == QJ_ARR;
        for (size_t k = 0; ok && k < shape->n; k++) ok = header_uint(shape->items[k]);
        if (!ok) {
            qf_set_error(err, QF_E_TENSOR_ENTRY_INVALID, "tensor \"%s\": shape must be a list of non-negative integers", lab);
            st = QF_E_TENSOR_ENTRY_INVALID;
            goto out;
        }
        if (!(offs->t == QJ_ARR && offs->n == 2 && header_uint(offs->items[0]) && header_uint(offs->items[1]))) {
            qf_set_error(err, QF_E_TENSOR_ENTRY_INVALID, "tensor \"%s\": data_offsets must be two non-negative integers", lab);
            st = QF_E_TENSOR_ENTRY_INVALID;
            goto out;
        }
        if (shape->n > QF_LIMIT_MAX_RANK) {
            qf_set_error(err, QF_E_TENSOR_ENTRY_INVALID, "tensor \"%s\": rank must be at most %llu, found %zu", lab, QF_LIMIT_MAX_RANK, shape->n);
            st = QF_E_TENSOR_ENTRY_INVALID;
            goto out;
        }
        e->rank = shape->n;
        e->shape = (uint64_t *)qf_arena_alloc(&f->arena, (e->rank ? e->rank : 1) * sizeof(uint64_t));
        if (!e->shape) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); st = QF_E_SHAPE_UNREPRESENTABLE; goto out; }
        for (size_t k = 0; k < e->rank; k++) {
            const qj *s = shape->items[k];
            if (s->huge) {
                qf_set_error(err, QF_E_SIZE_OVERFLOW, "tensor \"%s\": shape entry %zu does not fit 64 bits", lab, k);
                st = QF_E_SIZE_OVERFLOW;
                goto out;
            }
            e->shape[k] = s->neg ? 0 : s->mag;
        }
        /* 2.2: the exact count is 0 when an entry is 0, however large the others */
        uint64_t count = 1;
        int zero = 0, over = 0;
        for (size_t k = 0; k < e->rank; k++) zero |= e->shape[k] == 0;
        if (!zero)
            for (size_t k = 0; k < e->rank && !over; k++) over = qf_mul_u64(count, e->shape[k], &count);
        else count = 0;
        if (over) {
            qf_set_error(err, QF_E_SIZE_OVERFLOW, "tensor \"%s\": element count overflows 64 bits", lab);
            st = QF_E_SIZE_OVERFLOW;
            goto out;
        }
        uint64_t nbits;
        if (qf_mul_u64(count, qf_dtypes[e->dtype].bits, &nbits)) {
            qf_set_error(err, QF_E_SIZE_OVERFLOW, "tensor \"%s\": bit size overflows 64 bits", lab);
            st = QF_E_SIZE_OVERFLOW;
            goto out;
        }
        if (nbits % 8) {
            qf_set_error(err, QF_E_SUB_BYTE_MISALIGNED, "tensor \"%s\": %llu elements of %s do not fill whole bytes", lab,
                         (unsigned long long)count, qf_dtypes[e->dtype].name);
            st = QF_E_SUB_BYTE_MISALIGNED;
            goto out;
        }
        qf_str b = offs->items[0]->dig, en = offs->items[1]->dig;
        if (qf_dec_cmp(en, b) < 0) {
            qf_set_error(err, QF_E_OFFSETS_INVALID, "tensor \"%s\": data_offsets end before they begin", lab);
            st = QF_E_OFFSETS_INVALID;
            goto out;
        }
        if (!qf_dec_is_sum(b, nbits / 8, en)) {
            qf_set_error(err, QF_E_TENSOR_SIZE_MISMATCH, "tensor \"%s\": shape needs %llu bytes, data_offsets span another length", lab,
                         (unsigned long long)(nbits / 8));
            st = QF_E_TENSOR_SIZE_MISMATCH;
            goto out;
        }
        spans[ne].b = b;
        spans[ne].e = en;
        spans[ne].idx = ne;
        ne++;
    }
    f->nentries = ne;
    qsort(spans, ne, sizeof(span), span_cmp);
    qf_str pos = {"0", 1};
    for (size_t i = 0; i < ne; i++) {
        if (qf_dec_cmp(spans[i].b, pos) != 0) {
            qf_set_error(err, QF_E_OFFSETS_INVALID, "tensor \"%s\": data_offsets do not tile the data buffer",
                         tensor_label(&f->entries[spans[i].idx], lab, sizeof lab));
            st = QF_E_OFFSETS_INVALID;
            goto out;
        }
        pos = spans[i].e;
    }
    {
        /* the data buffer's end: 8 + n + pos against the file size (pos >= 2^64: past it) */
        uint64_t p64 = 0, total = 0;
        int past = !qf_dec_to_u64(pos, &p64) || qf_add_u64(8 + n, p64, &total) || total > size;
        if (past) {
            qf_set_error(err, QF_E_DATA_TRUNCATED, "the tensor data runs past the end of the file of %llu bytes", (unsigned long long)size);
            st = QF_E_DATA_TRUNCATED;
            goto out;
        }
        if (total < size) {
            qf_set_error(err, QF_E_TRAILING_BYTES, "bytes follow the last tensor's data");
            st = QF_E_TRAILING_BYTES;
            goto out;
        }
    }
    /* every range is now inside the file */
    for (size_t i = 0; i < ne; i++) {
        qf_dec_to_u64(spans[i].b, &f->entries[spans[i].idx].begin);
        qf_dec_to_u64(spans[i].e, &f->entries[spans[i].idx].end);
    }
    f->data_start = 8 + n;
    f->by_name = (size_t *)qf_arena_alloc(&f->arena, (ne ? ne : 1) * sizeof(size_t));
    if (!f->by_name) { qf_set_error(err, QF_E_SHAPE_UNREPRESENTABLE, "out of memory"); st = QF_E_SHAPE_UNREPRESENTABLE; goto out; }
    for (size_t i = 0; i < ne; i++) f->by_name[i] = i;
    /* names are unique (HEADER_DUPLICATE_KEY): sort by bytes for lookups */
    {
        /* qsort has no context pointer; a shell sort keeps this reentrant (no static state) */
        size_t gaps[] = {701, 301, 132, 57, 23, 10, 4, 1};
        for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++) {
            size_t g = gaps[gi];
            for (size_t i = g; i < ne; i++) {
                size_t t = f->by_name[i], j = i;
                while (j >= g && qf_str_cmp(f->entries[f->by_name[j - g]].name, f->entries[t].name) > 0) {
                    f->by_name[j] = f->by_name[j - g];
                    j -= g;
                }
                f->by_name[j] = t;
            }
        }
    }
out:
    free(spans);
    return st;
}


int qf_find_entry(const qf_file *f, qf_str name) {
    size_t lo = 0, hi = f->nentries;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = qf_str_cmp(f->entries[f->by_name[mid]].name, name);
        if (c == 0) return (int)f->by_name[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return -1;
}
