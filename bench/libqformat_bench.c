/* libqformat decode speed (issue 41 items 2, 8): the `libqformat` section of `python -m bench`.
 *
 *   libqformat_bench FILE REPS TENSOR...
 *
 * For each quantized TENSOR of FILE: decode to float32 into a warm caller buffer (median of
 * REPS calls after one warm-up) with 1 and 2 threads (pthreads over row ranges, each thread one
 * qf_decode_rows-sized call on its rows), next to memcpy of the same output size timed in this
 * process (ratio = memcpy time / decode time: 1.0 = as fast as copying the output).  Two entry
 * points are timed: the public qf_decode_rows (as api.c stands) and qf_decode_into, the fused
 * whole of a decode (rounding and output dtype included) that api.c's decode_impl is meant to
 * call; their outputs are checked equal bit for bit first.  Then a row slice: 1/16 of the rows,
 * decoded from a copy of the file in which every page of the tensor's stored components outside
 * the slice's share of their bytes is made unreadable (mprotect): the decode succeeds only if it
 * reads no byte of the other rows (SPEC.md 8.4); its time is printed next to the whole decode's.
 * One JSON object per line on stdout.  Linux (POSIX mmap, mprotect, pthreads). */
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "kernel.h"
#include "qformat.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct job {
    const qf_file *f;
    size_t index;
    const qf_desc *d;
    qf_str name;
    uint64_t r0, r1, rowsize;
    float *dst;
    int fused;
    qf_status status;
} job;

static void *run_job(void *arg) {
    job *j = (job *)arg;
    qf_error err;
    float *dst = j->dst + (j->r0 * j->rowsize);
    size_t bytes = (size_t)((j->r1 - j->r0) * j->rowsize * 4);
    if (j->fused) j->status = qf_decode_into(j->f, j->d, j->r0, j->r1 - j->r0, QF_OUT_FLOAT32, dst, j->name, &err);
    else j->status = qf_decode_rows(j->f, j->index, j->r0, j->r1 - j->r0, QF_OUT_FLOAT32, dst, bytes, &err);
    if (j->status) fprintf(stderr, "decode failed: %s %s\n", err.code, err.message);
    return NULL;
}

/* rows [r0, r1) over `threads` threads; seconds */
static double decode_rows(const qf_file *f, size_t index, const qf_desc *d, qf_str name, uint64_t r0, uint64_t r1, uint64_t rowsize,
                          float *dst, int threads, int fused) {
    job jobs[16];
    pthread_t th[16];
    double t0 = now();
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job){f, index, d, name, r0 + (r1 - r0) * (uint64_t)t / (uint64_t)threads, r0 + (r1 - r0) * (uint64_t)(t + 1) / (uint64_t)threads,
                        rowsize, dst - r0 * rowsize, fused, QF_OK};
        if (t) pthread_create(&th[t], NULL, run_job, &jobs[t]);
    }
    run_job(&jobs[0]);
    for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
    double s = now() - t0;
    for (int t = 0; t < threads; t++)
        if (jobs[t].status) exit(2);
    return s;
}

static double median_decode(const qf_file *f, size_t index, const qf_desc *d, qf_str name, uint64_t r0, uint64_t r1, uint64_t rowsize,
                            float *dst, int threads, int fused, int reps) {
    double ts[101];
    decode_rows(f, index, d, name, r0, r1, rowsize, dst, threads, fused); /* warm-up */
    for (int k = 0; k < reps; k++) ts[k] = decode_rows(f, index, d, name, r0, r1, rowsize, dst, threads, fused);
    qsort(ts, (size_t)reps, sizeof(double), cmp_d);
    return ts[reps / 2];
}

static double median_memcpy(void *dst, const void *src, size_t n, int reps) {
    double ts[101];
    memcpy(dst, src, n);
    for (int k = 0; k < reps; k++) {
        double t0 = now();
        memcpy(dst, src, n);
        ts[k] = now() - t0;
    }
    qsort(ts, (size_t)reps, sizeof(double), cmp_d);
    return ts[reps / 2];
}

static sigjmp_buf fault_jmp;
static void on_fault(int sig) {
    (void)sig;
    siglongjmp(fault_jmp, 1);
}

/* the slice decode with SIGSEGV caught: 1 when it touched an unreadable page */
static int guarded_decode(const qf_file *f, size_t index, const qf_desc *d, qf_str name, uint64_t r0, uint64_t r1, uint64_t rowsize,
                          float *dst, int reps, double *secs) {
    struct sigaction sa, old;
    int faulted = 0;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fault;
    sigaction(SIGSEGV, &sa, &old);
    if (sigsetjmp(fault_jmp, 1) == 0)
        *secs = median_decode(f, index, d, name, r0, r1, rowsize, dst, 1, 1, reps);
    else
        faulted = 1;
    sigaction(SIGSEGV, &old, NULL);
    return faulted;
}

static void *alloc_warm(size_t n, int byte) {
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) return NULL;
    memset(p, byte, n);
    return p;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: libqformat_bench FILE REPS TENSOR...\n");
        return 2;
    }
    int reps = atoi(argv[2]);
    if (reps < 1) reps = 1;
    if (reps > 101) reps = 101;
    FILE *fp = fopen(argv[1], "rb");
    if (!fp) { perror(argv[1]); return 2; }
    fseek(fp, 0, SEEK_END);
    long fsize = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), maplen = ((size_t)fsize + page - 1) / page * page;
    /* the file in anonymous pages (so that parts can be made unreadable); opened from memory */
    unsigned char *mem = (unsigned char *)mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED || fread(mem, 1, (size_t)fsize, fp) != (size_t)fsize) { perror("read"); return 2; }
    fclose(fp);
    qf_file *f = NULL;
    qf_error err;
    if (qf_open_memory(mem, (size_t)fsize, NULL, &f, &err)) { fprintf(stderr, "open: %s\n", err.message); return 2; }
    int level = qfk_cpu_level();
    for (int a = 3; a < argc; a++) {
        size_t index;
        if (qf_find_tensor(f, argv[a], strlen(argv[a]), &index, &err)) { fprintf(stderr, "%s: %s\n", argv[a], err.message); return 2; }
        const qf_exposed *x = &f->exposed[index];
        const qf_desc *d = f->logical[x->logical].desc;
        uint64_t rows = d->shape[0], rowsize = 1, numel;
        for (size_t k = 1; k < d->rank; k++) rowsize *= d->shape[k];
        numel = rows * rowsize;
        size_t nbytes = (size_t)numel * 4;
        float *out = (float *)alloc_warm(nbytes, 0), *ref = (float *)alloc_warm(nbytes, 0);
        void *src = alloc_warm(nbytes, 1), *cpy = alloc_warm(nbytes, 0);
        if (!out || !ref || !src || !cpy) { fprintf(stderr, "out of memory\n"); return 2; }
        /* the same bits through both entry points, and with 2 threads */
        decode_rows(f, index, d, x->name, 0, rows, rowsize, ref, 1, 0);
        decode_rows(f, index, d, x->name, 0, rows, rowsize, out, 2, 1);
        int same = memcmp(out, ref, nbytes) == 0;
        double mc = median_memcpy(cpy, src, nbytes, reps < 5 ? 5 : reps);
        for (int threads = 1; threads <= 2; threads++)
            for (int fused = 1; fused >= 0; fused--) {
                double s = median_decode(f, index, d, x->name, 0, rows, rowsize, out, threads, fused, reps);
                printf("{\"tensor\": \"%s\", \"entry\": \"%s\", \"threads\": %d, \"ms\": %.9g, \"memcpy_ms\": %.9g, \"x_memcpy\": %.9g, "
                       "\"out_MB\": %.9g, \"ns_per_value\": %.9g, \"same_bits\": %s, \"level\": \"%s\"}\n",
                       argv[a], fused ? "qf_decode_into" : "qf_decode_rows", threads, s * 1e3, mc * 1e3, mc / s, (double)nbytes / 1048576.0,
                       s * 1e9 / (double)numel, same ? "true" : "false", qfk_level_name(level));
                fflush(stdout);
            }
        /* a row slice: the tensor's stored components unreadable outside the slice's share */
        uint64_t s0 = rows / 2, s1 = s0 + (rows / 16 ? rows / 16 : 1);
        if (s1 > rows) s1 = rows;
        size_t prot_bytes = 0, comp_bytes = 0;
        struct { unsigned char *p; size_t n; } prot[32];
        int np = 0;
        for (size_t e = 0; e < f->nentries && np < 30; e++) {
            if (f->owner[e] != x->logical) continue;
            const qf_entry *en = &f->entries[e];
            uint64_t len = en->end - en->begin;
            comp_bytes += (size_t)len;
            uint64_t keep0 = len * s0 / rows, keep1 = (len * s1 + rows - 1) / rows;
            unsigned char *base = mem + (f->data_start + en->begin);
            uintptr_t lo[2] = {(uintptr_t)base, (uintptr_t)(base + keep1)}, hi[2] = {(uintptr_t)(base + keep0), (uintptr_t)(base + len)};
            for (int k = 0; k < 2; k++) {
                uintptr_t p0 = (lo[k] + page - 1) / page * page, p1 = hi[k] / page * page;
                if (p1 > p0) {
                    mprotect((void *)p0, p1 - p0, PROT_NONE);
                    prot[np].p = (unsigned char *)p0;
                    prot[np++].n = p1 - p0;
                    prot_bytes += p1 - p0;
                }
            }
        }
        double slice_s = 0, whole_s = 0;
        int faulted = guarded_decode(f, index, d, x->name, s0, s1, rowsize, out + s0 * rowsize, reps, &slice_s);
        for (int k = 0; k < np; k++) mprotect(prot[k].p, prot[k].n, PROT_READ | PROT_WRITE);
        if (!faulted) {
            whole_s = median_decode(f, index, d, x->name, 0, rows, rowsize, out, 1, 1, reps);
            faulted = memcmp(out + s0 * rowsize, ref + s0 * rowsize, (size_t)((s1 - s0) * rowsize * 4)) != 0 ? 2 : 0;
        }
        printf("{\"tensor\": \"%s\", \"slice\": [%llu, %llu], \"rows\": %llu, \"component_bytes\": %zu, \"unreadable_bytes\": %zu, "
               "\"read_only_its_rows\": %s, \"ms\": %.9g, \"whole_ms\": %.9g, \"time_fraction\": %.9g, \"row_fraction\": %.9g}\n",
               argv[a], (unsigned long long)s0, (unsigned long long)s1, (unsigned long long)rows, comp_bytes, prot_bytes,
               faulted ? "false" : "true", slice_s * 1e3, whole_s * 1e3, whole_s > 0 ? slice_s / whole_s : 0.0,
               (double)(s1 - s0) / (double)rows);
        fflush(stdout);
        free(out); free(ref); free(src); free(cpy);
        if (faulted == 1) return 3;
    }
    qf_close(f);
    munmap(mem, maplen);
    return 0;
}
