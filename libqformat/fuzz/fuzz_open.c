/* libFuzzer entry point for libqformat: open an arbitrary byte string as a qformat file and use
 * every read-only entry point on it.  The contract under test: nothing crashes, reads or writes
 * out of bounds, leaks, or returns a status whose code string is empty or unknown.
 *
 * Build with clang -fsanitize=fuzzer,address,undefined (libFuzzer), or with gcc through
 * fuzz/driver.c (cmake -DQF_FUZZ=ON), which calls the same function. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qformat.h"

#define QF_FUZZ_DECODE_CAP ((uint64_t)64 << 20) /* skip decodes needing more than 64 MiB */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A cheap behaviour signature of the last input, for fuzz/driver.c (which keeps inputs whose
 * signature is new): the open status, the tensor count (bucketed) and the set of codes that
 * decoding and checking returned.  libFuzzer ignores it. */
uint64_t qf_fuzz_feature;
static uint64_t seen_codes, open_status, tensor_bucket;

static void feature(uint64_t status)
{
    seen_codes |= (uint64_t)1 << (status % 64);
}

static void finish_feature(void)
{
    uint64_t h = 0xcbf29ce484222325ull;
    uint64_t parts[3] = {open_status, tensor_bucket, seen_codes};
    for (int k = 0; k < 3; k++)
        h = (h ^ parts[k]) * 0x100000001b3ull;
    qf_fuzz_feature = h;
}

static void fail(const char *what, qf_status s, const qf_error *err)
{
    const char *code = (int)s >= 0 && (int)s < (int)QF_STATUS_COUNT ? qf_status_code(s) : "(out of range)";
    fprintf(stderr, "qformat-fuzz: contract violation: %s (status %d, code \"%s\", err.code \"%.40s\", message \"%.200s\")\n",
            what, (int)s, code ? code : "(null)", err ? err->code : "", err ? err->message : "");
    abort();
}

/* A returned status must be QF_OK with an empty code, or a known code that round-trips and is
 * the one written to err. */
static qf_status chk(const char *what, qf_status s, const qf_error *err)
{
    const char *code = qf_status_code(s);
    feature((uint64_t)s);
    if (s == QF_OK) {
        if (err->code[0] != 0)
            fail(what, s, err);
        return s;
    }
    if ((int)s < 0 || (int)s >= (int)QF_STATUS_COUNT || code == NULL || code[0] == 0)
        fail(what, s, err);
    if (qf_status_from_code(code) != s)
        fail(what, s, err);
    if (strcmp(err->code, code) != 0)
        fail(what, s, err);
    if (memchr(err->message, 0, sizeof err->message) == NULL || memchr(err->code, 0, sizeof err->code) == NULL)
        fail(what, s, err);
    return s;
}

static int problem_cb(void *user, const qf_problem *p)
{
    size_t *count = (size_t *)user;
    const char *code = qf_status_code(p->status);
    feature((uint64_t)p->status);
    if (p->status == QF_OK || code == NULL || code[0] == 0 || p->code == NULL || strcmp(p->code, code) != 0)
        fail("qf_check problem", p->status, NULL);
    if (p->message)
        (void)strlen(p->message);
    if (p->tensor)
        (void)strlen(p->tensor);
    if (p->field)
        (void)strlen(p->field);
    ++*count;
    return *count > 10000; /* stop an endless report */
}

static void touch(const void *p, size_t n)
{
    /* read every byte handed out, so an out-of-bounds pointer is caught */
    const volatile unsigned char *b = (const volatile unsigned char *)p;
    unsigned acc = 0;
    for (size_t i = 0; i < n; i++)
        acc += b[i];
    (void)acc;
}

static void exercise(const qf_file *f)
{
    qf_error err;
    size_t n = qf_tensor_count(f);
    tensor_bucket = n < 8 ? n : n < 64 ? 8 : 9;
    chk("qf_file_status", qf_file_status(f, &err), &err);
    for (size_t i = 0; i < n; i++) {
        struct qf_tensor_info info;
        memset(&info, 0, sizeof info);
        qf_status s = chk("qf_tensor_info", qf_tensor_info(f, i, &info, &err), &err);
        if (info.name)
            touch(info.name, info.name_len);
        if (info.dtype)
            (void)strlen(info.dtype);
        if (info.rank > QF_MAX_RANK)
            fail("qf_tensor_info rank > QF_MAX_RANK", s, &err);
        if (s != QF_OK)
            continue;
        if (info.name) {
            size_t idx = (size_t)-1;
            if (chk("qf_find_tensor", qf_find_tensor(f, info.name, info.name_len, &idx, &err), &err) == QF_OK && idx >= n)
                fail("qf_find_tensor index out of range", QF_OK, &err);
        }
        if (info.is_quantized) {
            if (info.numel > QF_FUZZ_DECODE_CAP / 4)
                continue;
            size_t bytes = (size_t)info.numel * 4;
            void *dst = malloc(bytes ? bytes : 1); /* exact size: ASan sees one byte past it */
            if (!dst)
                continue;
            chk("qf_decode f32", qf_decode(f, i, QF_OUT_FLOAT32, dst, bytes, &err), &err);
            chk("qf_decode f16", qf_decode(f, i, QF_OUT_FLOAT16, dst, bytes / 2, &err), &err);
            if (bytes && chk("qf_decode short", qf_decode(f, i, QF_OUT_BFLOAT16, dst, bytes / 2 - 1, &err), &err) == QF_OK)
                fail("qf_decode accepted a destination one byte short", QF_OK, &err);
            if (info.rank > 0 && info.shape[0] > 0) {
                uint64_t rows = info.shape[0];
                uint64_t row_elems = info.numel / rows;
                chk("qf_decode_rows last", qf_decode_rows(f, i, rows - 1, 1, QF_OUT_BFLOAT16, dst, (size_t)(row_elems * 2), &err), &err);
                if (chk("qf_decode_rows past", qf_decode_rows(f, i, rows, 1, QF_OUT_FLOAT32, dst, bytes, &err), &err) == QF_OK)
                    fail("qf_decode_rows accepted a row past the end", QF_OK, &err);
            }
            free(dst);
        } else {
            const void *p = NULL;
            size_t nb = 0;
            if (chk("qf_plain_bytes", qf_plain_bytes(f, i, &p, &nb, &err), &err) == QF_OK && nb)
                touch(p, nb);
        }
    }
    size_t ns = qf_stored_count(f);
    for (size_t j = 0; j < ns; j++) {
        const char *name = NULL, *dtype = NULL;
        size_t name_len = 0, rank = 0, nbytes = 0;
        const uint64_t *shape = NULL;
        const void *data = NULL;
        qf_status s = qf_stored_info(f, j, &name, &name_len, &dtype, &rank, &shape, &data, &nbytes);
        if (s != QF_OK && (qf_status_code(s) == NULL || qf_status_code(s)[0] == 0))
            fail("qf_stored_info", s, NULL);
        if (s == QF_OK) {
            if (rank > QF_MAX_RANK)
                fail("qf_stored_info rank > QF_MAX_RANK", s, NULL);
            if (name)
                touch(name, name_len);
            if (shape)
                touch(shape, rank * sizeof *shape);
            if (data)
                touch(data, nbytes);
        }
    }
    size_t mlen = 0;
    const char *m = qf_metadata(f, "format", &mlen);
    if (m)
        touch(m, mlen);
    for (unsigned flags = 0; flags < 4; flags++) {
        size_t count = 0;
        chk("qf_check", qf_check(f, flags, problem_cb, &count, &err), &err);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qf_error err;
    seen_codes = open_status = tensor_bucket = 0;
    for (int verify = 0; verify < 2; verify++) {
        qf_open_options opts;
        memset(&opts, 0, sizeof opts);
        opts.struct_size = sizeof opts;
        opts.verify_digests = verify;
        qf_file *f = NULL;
        qf_status s = chk("qf_open_memory", qf_open_memory(data, size, verify ? &opts : NULL, &f, &err), &err);
        if (!verify)
            open_status = (uint64_t)s;
        if (s != QF_OK) {
            if (f != NULL)
                fail("qf_open_memory failed yet returned a handle", s, &err);
            break; /* verify_digests does not change what opening refuses */
        }
        if (f == NULL)
            fail("qf_open_memory returned QF_OK without a handle", s, &err);
        exercise(f);
        qf_close(f);
    }
    size_t count = 0;
    chk("qf_check_memory", qf_check_memory(data, size, QF_CHECK_STRICT | QF_CHECK_DIGESTS, problem_cb, &count, &err), &err);
    finish_feature();
    return 0;
}
