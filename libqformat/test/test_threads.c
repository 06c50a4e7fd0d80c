/* Concurrent reads of one qf_file (qformat.h: "any number of threads may call the const
 * functions on one qf_file at once").  Every quantized tensor of FILE is decoded once
 * sequentially; then THREADS threads decode it again at the same time, each a different mix of
 * whole tensors, row ranges and output dtypes, plus qf_tensor_info / qf_check calls in between;
 * every concurrent result must equal the sequential one byte for byte.  Built with
 * -fsanitize=thread by tests/test_libqformat.py, so a data race is a report even when the bytes
 * happen to agree.
 *
 *   test_threads FILE [THREADS]      prints "ok N tensors, M decodes" or what differed; exit 1 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "qformat.h"

typedef struct {
    const qf_file *f;
    size_t n;          /* tensors */
    unsigned char **want[3]; /* per out dtype, per tensor: the sequential decode (NULL: not quantized) */
    size_t *bytes[3];
    int id;
    long decodes, bad;
} job;

static size_t out_size(int dt) { return dt == QF_OUT_FLOAT32 ? 4 : 2; }

static void *run(void *arg) {
    job *j = (job *)arg;
    unsigned seed = 2654435761u * (unsigned)(j->id + 1);
    for (int round = 0; round < 3; round++) {
        for (size_t k = 0; k < j->n; k++) {
            size_t i = (k + (size_t)j->id * 7) % j->n;
            seed = seed * 1103515245u + 12345u;
            int dt = (int)((seed >> 16) % 3);
            if (!j->want[dt][i]) continue;
            struct qf_tensor_info t;
            qf_error err;
            if (qf_tensor_info(j->f, i, &t, &err) != QF_OK) { j->bad++; continue; }
            size_t osz = out_size(dt), total = j->bytes[dt][i];
            unsigned char *buf = malloc(total ? total : 1);
            if (!buf) { j->bad++; continue; }
            uint64_t rows = t.rank ? t.shape[0] : 1;
            if (t.rank && rows > 1 && (seed & 1)) {  /* a row range */
                uint64_t r0 = (seed >> 8) % rows, nr = 1 + (seed >> 20) % (rows - r0);
                size_t row_bytes = (size_t)(total / rows);
                if (qf_decode_rows(j->f, i, r0, nr, (qf_out_dtype)dt, buf, (size_t)nr * row_bytes, &err) != QF_OK ||
                    memcmp(buf, j->want[dt][i] + r0 * row_bytes, (size_t)nr * row_bytes) != 0) {
                    fprintf(stderr, "thread %d: tensor %zu rows [%llu, %llu) dtype %d differ (%s)\n", j->id, i,
                            (unsigned long long)r0, (unsigned long long)(r0 + nr), dt, err.code);
                    j->bad++;
                }
            } else if (qf_decode(j->f, i, (qf_out_dtype)dt, buf, total, &err) != QF_OK || memcmp(buf, j->want[dt][i], total) != 0) {
                fprintf(stderr, "thread %d: tensor %zu dtype %d differs (%s)\n", j->id, i, dt, err.code);
                j->bad++;
            }
            (void)osz;
            free(buf);
            j->decodes++;
        }
        qf_error err;
        qf_check(j->f, 0, NULL, NULL, &err);  /* a whole check, concurrently with the decodes */
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: test_threads FILE [THREADS]\n"); return 2; }
    int nthreads = argc > 2 ? atoi(argv[2]) : 4;
    if (nthreads < 1 || nthreads > 64) nthreads = 4;
    qf_file *f;
    qf_error err;
    if (qf_open_path(argv[1], NULL, &f, &err) != QF_OK) { fprintf(stderr, "%s: %s\n", err.code, err.message); return 1; }
    size_t n = qf_tensor_count(f), quantized = 0;
    job base = {0};
    base.f = f;
    base.n = n;
    for (int dt = 0; dt < 3; dt++) {
        base.want[dt] = calloc(n ? n : 1, sizeof *base.want[dt]);
        base.bytes[dt] = calloc(n ? n : 1, sizeof *base.bytes[dt]);
        if (!base.want[dt] || !base.bytes[dt]) return 1;
    }
    for (size_t i = 0; i < n; i++) {
        struct qf_tensor_info t;
        if (qf_tensor_info(f, i, &t, &err) != QF_OK || !t.is_quantized) continue;
        quantized++;
        for (int dt = 0; dt < 3; dt++) {
            size_t total = (size_t)t.numel * out_size(dt);
            unsigned char *b = malloc(total ? total : 1);
            if (!b || qf_decode(f, i, (qf_out_dtype)dt, b, total, &err) != QF_OK) { fprintf(stderr, "sequential decode of %zu: %s\n", i, err.code); return 1; }
            base.want[dt][i] = b;
            base.bytes[dt][i] = total;
        }
    }
    pthread_t th[64];
    job jobs[64];
    for (int k = 0; k < nthreads; k++) {
        jobs[k] = base;
        jobs[k].id = k;
        if (pthread_create(&th[k], NULL, run, &jobs[k]) != 0) return 1;
    }
    long decodes = 0, bad = 0;
    for (int k = 0; k < nthreads; k++) {
        pthread_join(th[k], NULL);
        decodes += jobs[k].decodes;
        bad += jobs[k].bad;
    }
    for (int dt = 0; dt < 3; dt++) {
        for (size_t i = 0; i < n; i++) free(base.want[dt][i]);
        free(base.want[dt]);
        free(base.bytes[dt]);
    }
    qf_close(f);
    if (bad) { printf("FAILED: %ld of %ld concurrent decodes differ\n", bad, decodes); return 1; }
    printf("ok %zu tensors, %ld decodes in %d threads\n", quantized, decodes, nthreads);
    return 0;
}
