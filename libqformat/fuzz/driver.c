/* A standalone mutation fuzz driver for LLVMFuzzerTestOneInput (fuzz/fuzz_open.c), for toolchains
 * without libFuzzer (gcc).  Flags follow libFuzzer's spelling:
 *
 *   qformat-fuzz [flags] [DIR|FILE ...]
 *     DIR ...                 seed corpora: every regular file under each DIR (recursively)
 *                             (no DIR: every *.safetensors under the conformance corpus)
 *     FILE ...                (only files, no DIR) run each file once and exit: reproduces a crash
 *     -seed=N                 random seed (default: time-based, printed)
 *     -runs=N                 executions (default 100000; -1: unbounded)
 *     -max_total_time=S       stop after S seconds (0: no limit)
 *     -max_len=N              largest mutant in bytes (default 1 MiB)
 *     -timeout=S              an execution slower than S seconds is a finding (default 20)
 *     -artifact_prefix=P      where crash files go (default "./"): P + "crash-<hash>"
 *     -save_every_input=1     also write each input to P + "current-input" before running it
 *                             (slower; catches a death the handlers cannot see)
 *     -leak_check_every=N     run LeakSanitizer every N executions (default 20000; 0: at exit only)
 *     -print_every=N          status line every N executions (default 100000)
 *
 * A finding (a sanitizer report, a signal, a timeout, an abort() of the entry point's contract
 * checks, a leak) writes the input to the crash file and exits non-zero.  Sanitizers are built
 * with -fno-sanitize-recover=all, so the first report is fatal. */
#define _POSIX_C_SOURCE 200809L

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define QF_HAVE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QF_HAVE_ASAN 1
#endif
#endif
#ifdef QF_HAVE_ASAN
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/lsan_interface.h>
#endif

#ifndef QF_DEFAULT_SEED_DIR
#define QF_DEFAULT_SEED_DIR "conformance/v1/cases"
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
extern uint64_t qf_fuzz_feature; /* defined by fuzz/fuzz_open.c */

/* ------------------------------------------------------------------ random */
static uint64_t rng_state;
static uint64_t rnd(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

/* ------------------------------------------------------------------ buffers */
typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf;

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "qformat-fuzz: out of memory\n");
        exit(3);
    }
    return q;
}
static void reserve(buf *b, size_t n)
{
    if (n > b->cap || b->p == NULL) {
        size_t c = b->cap ? b->cap : 256;
        while (c < n)
            c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
}
static void set_bytes(buf *b, const uint8_t *p, size_t n)
{
    reserve(b, n);
    if (n)
        memcpy(b->p, p, n);
    b->n = n;
}
static void insert_at(buf *b, size_t at, const uint8_t *p, size_t n)
{
    if (n == 0)
        return;
    reserve(b, b->n + n);
    memmove(b->p + at + n, b->p + at, b->n - at);
    if (p)
        memcpy(b->p + at, p, n);
    b->n += n;
}
static void erase_at(buf *b, size_t at, size_t n)
{
    if (n == 0)
        return;
    memmove(b->p + at, b->p + at + n, b->n - at - n);
    b->n -= n;
}

/* ------------------------------------------------------------------ corpus */
typedef struct entry {
    uint8_t *p;
    size_t n;
} entry;
static entry *corpus;
static size_t ncorpus, corpus_cap, nseeds;
static size_t max_len = (size_t)1 << 20;

static void corpus_add(const uint8_t *p, size_t n)
{
    if (ncorpus == corpus_cap) {
        corpus_cap = corpus_cap ? corpus_cap * 2 : 64;
        corpus = xrealloc(corpus, corpus_cap * sizeof *corpus);
    }
    corpus[ncorpus].p = xrealloc(NULL, n);
    if (n)
        memcpy(corpus[ncorpus].p, p, n);
    corpus[ncorpus].n = n;
    ncorpus++;
}

static int read_file(const char *path, buf *out)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    out->n = 0;
    for (;;) {
        reserve(out, out->n + 65536);
        size_t r = fread(out->p + out->n, 1, 65536, f);
        out->n += r;
        if (r == 0)
            break;
    }
    fclose(f);
    return 0;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static void load_dir(const char *dir, const char *suffix, int depth)
{
    DIR *d = opendir(dir);
    if (!d || depth > 16) {
        if (d)
            closedir(d);
        return;
    }
    struct dirent *e;
    /* sorted for reproducibility: collect then sort names */
    char **names = NULL;
    size_t nn = 0, cap = 0;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (nn == cap) {
            cap = cap ? cap * 2 : 32;
            names = xrealloc(names, cap * sizeof *names);
        }
        size_t l = strlen(dir) + strlen(e->d_name) + 2;
        names[nn] = xrealloc(NULL, l);
        snprintf(names[nn], l, "%s/%s", dir, e->d_name);
        nn++;
    }
    closedir(d);
    for (size_t i = 1; i < nn; i++)
        for (size_t j = i; j > 0 && strcmp(names[j - 1], names[j]) > 0; j--) {
            char *t = names[j];
            names[j] = names[j - 1];
            names[j - 1] = t;
        }
    buf b = {0};
    for (size_t i = 0; i < nn; i++) {
        struct stat st;
        if (stat(names[i], &st) == 0) {
            if (S_ISDIR(st.st_mode))
                load_dir(names[i], suffix, depth + 1);
            else if (S_ISREG(st.st_mode) && (!suffix || ends_with(names[i], suffix)) && read_file(names[i], &b) == 0 &&
                     b.n <= max_len)
                corpus_add(b.p, b.n);
        }
        free(names[i]);
    }
    free(names);
    free(b.p);
}

/* ------------------------------------------------------------------ dictionary (JSON tokens) */
static char **dict;
static size_t ndict, dict_cap;

static void dict_add(const char *s, size_t n)
{
    if (n == 0 || n > 64 || ndict >= 4096)
        return;
    for (size_t i = 0; i < ndict; i++)
        if (strlen(dict[i]) == n && memcmp(dict[i], s, n) == 0)
            return;
    if (ndict == dict_cap) {
        dict_cap = dict_cap ? dict_cap * 2 : 64;
        dict = xrealloc(dict, dict_cap * sizeof *dict);
    }
    dict[ndict] = xrealloc(NULL, n + 1);
    memcpy(dict[ndict], s, n);
    dict[ndict][n] = 0;
    ndict++;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static void wr64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* the JSON header [8, 8+hlen) when the length field is in range */
static int header_span(const buf *b, size_t *lo, size_t *hi)
{
    if (b->n < 10)
        return 0;
    uint64_t h = rd64(b->p);
    if (h == 0 || h > b->n - 8)
        return 0;
    *lo = 8;
    *hi = 8 + (size_t)h;
    return 1;
}

static void harvest_tokens(const entry *e)
{
    buf b = {e->p, e->n, e->n};
    size_t lo, hi;
    if (!header_span(&b, &lo, &hi))
        return;
    for (size_t i = lo; i < hi; i++) {
        if (e->p[i] == '"') {
            size_t j = i + 1;
            while (j < hi && e->p[j] != '"')
                j++;
            if (j < hi)
                dict_add((const char *)e->p + i, j - i + 1); /* with quotes */
            i = j;
        }
    }
}

static const char *const json_numbers[] = {
    "0", "1", "-1", "2", "3", "4", "7", "8", "15", "16", "31", "32", "33", "63", "64", "65", "127", "128", "255", "256",
    "1024", "65535", "65536", "2147483647", "2147483648", "4294967295", "4294967296", "9007199254740992",
    "9007199254740993", "9223372036854775807", "9223372036854775808", "18446744073709551615",
    "18446744073709551616", "1e308", "1e309", "-0", "0.5", "1.0", "1e3", "-9223372036854775808", "00", "01", "1.",
    "NaN", "Infinity", "-Infinity", "true", "false", "null", "[]", "{}", "\"\"", "[0]", "[1,1]", "[0,0]",
};
static const char json_specials[] = "\"{}[],:\\ 0123456789-.eE";

/* ------------------------------------------------------------------ mutations */
static const int64_t interesting[] = {
    0, 1, -1, 2, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255, 256, 511, 512, 1023, 1024, 4095, 4096, 32767, 32768,
    65535, 65536, 100000000, 2147483647, -2147483648LL, 4294967295LL, 4294967296LL, INT64_MAX, INT64_MIN,
    0x7ff0000000000000LL, /* +inf as double bits */ 0x7f800000LL, 0x7fc00000LL, 0xff800000LL, 0x7c00LL, 0xfc00LL, 0x7e00LL,
};

static void fix_header_length(buf *b, int64_t delta)
{
    if (b->n < 8)
        return;
    uint64_t h = rd64(b->p);
    wr64(b->p, h + (uint64_t)delta);
}

/* Replace [at, at+len) by s, keeping the header length consistent when the span is inside it. */
static void replace_in_header(buf *b, size_t at, size_t len, const char *s, size_t n, int keep_len)
{
    erase_at(b, at, len);
    insert_at(b, at, (const uint8_t *)s, n);
    if (keep_len)
        fix_header_length(b, (int64_t)n - (int64_t)len);
}

static void mutate_json(buf *b)
{
    size_t lo, hi;
    if (!header_span(b, &lo, &hi))
        return;
    int keep = below(10) < 9; /* usually keep the length field in step, so the JSON gets parsed */
    size_t at = lo + below(hi - lo);
    switch (below(8)) {
    case 0: { /* rewrite a number */
        size_t s = at;
        while (s < hi && !(b->p[s] >= '0' && b->p[s] <= '9'))
            s++;
        if (s >= hi)
            return;
        size_t e = s;
        while (e < hi && ((b->p[e] >= '0' && b->p[e] <= '9') || b->p[e] == '.' || b->p[e] == 'e' || b->p[e] == '-' || b->p[e] == '+'))
            e++;
        if (s > lo && b->p[s - 1] == '-')
            s--;
        const char *v = json_numbers[below(sizeof json_numbers / sizeof json_numbers[0])];
        replace_in_header(b, s, e - s, v, strlen(v), keep);
        break;
    }
    case 1: { /* increment / decrement a digit */
        for (size_t k = 0; k < 64; k++) {
            size_t i = lo + below(hi - lo);
            if (b->p[i] >= '0' && b->p[i] <= '9') {
                b->p[i] = (uint8_t)('0' + (b->p[i] - '0' + (below(2) ? 1 : 9)) % 10);
                return;
            }
        }
        break;
    }
    case 2: { /* replace a string token with one from the dictionary */
        size_t s = at;
        while (s < hi && b->p[s] != '"')
            s++;
        if (s >= hi || !ndict)
            return;
        size_t e = s + 1;
        while (e < hi && b->p[e] != '"')
            e++;
        if (e >= hi)
            return;
        const char *v = dict[below(ndict)];
        replace_in_header(b, s, e - s + 1, v, strlen(v), keep);
        break;
    }
    case 3: { /* delete one structural character */
        for (size_t k = 0; k < 64; k++) {
            size_t i = lo + below(hi - lo);
            if (strchr("\"{}[],:", b->p[i]) && b->p[i]) {
                replace_in_header(b, i, 1, "", 0, keep);
                return;
            }
        }
        break;
    }
    case 4: { /* insert a structural character or a number/dictionary token */
        const char *v;
        char one[2] = {0, 0};
        if (below(2)) {
            one[0] = json_specials[below(sizeof json_specials - 1)];
            v = one;
        } else if (below(2) && ndict) {
            v = dict[below(ndict)];
        } else {
            v = json_numbers[below(sizeof json_numbers / sizeof json_numbers[0])];
        }
        replace_in_header(b, at, 0, v, strlen(v), keep);
        break;
    }
    case 5: { /* swap bracket kinds / quote kinds */
        for (size_t k = 0; k < 64; k++) {
            size_t i = lo + below(hi - lo);
            uint8_t c = b->p[i];
            static const char from[] = "[]{}\",:", to[] = "{}[]',;";
            const char *f = c ? strchr(from, c) : NULL;
            if (f) {
                b->p[i] = (uint8_t)to[f - from];
                return;
            }
        }
        break;
    }
    case 6: { /* duplicate a "key": value pair (a range between a quote and the next comma) */
        size_t s = at;
        while (s < hi && b->p[s] != '"')
            s++;
        size_t e = s + 1;
        while (e < hi && b->p[e] != ',')
            e++;
        if (s >= hi || e >= hi || e - s > 4096)
            return;
        size_t n = e - s + 1;
        uint8_t *tmp = xrealloc(NULL, n);
        memcpy(tmp, b->p + s, n);
        insert_at(b, s, tmp, n);
        free(tmp);
        if (keep)
            fix_header_length(b, (int64_t)n);
        break;
    }
    default: { /* non-ASCII / control / escape bytes inside the header */
        static const char *const odd[] = {"\\u0000", "\\ud800", "\\\"", "\xc3\xa9", "\xff", "\xed\xa0\x80", "\t", "\n", "\\", "\x7f"};
        const char *v = odd[below(sizeof odd / sizeof odd[0])];
        replace_in_header(b, at, below(2), v, strlen(v), keep);
        break;
    }
    }
}

static void mutate_once(buf *b)
{
    size_t lo, hi;
    switch (below(12)) {
    case 0: /* bit flip */
        if (b->n)
            b->p[below(b->n)] ^= (uint8_t)(1u << below(8));
        break;
    case 1: /* byte set */
        if (b->n)
            b->p[below(b->n)] = (uint8_t)rnd();
        break;
    case 2: { /* interesting integer (1, 2, 4 or 8 bytes, little endian) at a random offset */
        size_t w = (size_t)1 << below(4);
        if (b->n < w)
            break;
        size_t at = below(b->n - w + 1);
        uint64_t v = (uint64_t)interesting[below(sizeof interesting / sizeof interesting[0])];
        for (size_t i = 0; i < w; i++)
            b->p[at + i] = (uint8_t)(v >> (8 * i));
        break;
    }
    case 3: { /* the 8-byte header length */
        if (b->n < 8)
            break;
        uint64_t h = rd64(b->p), v;
        switch (below(6)) {
        case 0: v = h + 1 + below(8); break;
        case 1: v = h - 1 - below(8); break;
        case 2: v = b->n - 8; break;
        case 3: v = (uint64_t)interesting[below(sizeof interesting / sizeof interesting[0])]; break;
        case 4: v = (uint64_t)100000000 + below(3) - 1; break;
        default: v = h ^ ((uint64_t)1 << below(64)); break;
        }
        wr64(b->p, v);
        break;
    }
    case 4: case 5: case 6: /* JSON-aware edits */
        mutate_json(b);
        break;
    case 7: { /* insert a random range */
        size_t n = 1 + below(below(2) ? 8 : 256);
        if (b->n + n > max_len)
            break;
        size_t at = below(b->n + 1);
        insert_at(b, at, NULL, n);
        uint8_t fill = (uint8_t)rnd();
        int mode = (int)below(3);
        for (size_t i = 0; i < n; i++)
            b->p[at + i] = mode == 0 ? fill : mode == 1 ? (uint8_t)rnd() : (uint8_t)(at + i < b->n - n ? b->p[at + n + i] : 0);
        break;
    }
    case 8: { /* delete a range */
        if (!b->n)
            break;
        size_t at = below(b->n);
        size_t n = 1 + below(below(2) ? 8 : 256);
        if (n > b->n - at)
            n = b->n - at;
        erase_at(b, at, n);
        break;
    }
    case 9: { /* splice: a prefix of this input and a suffix of another */
        if (ncorpus < 2)
            break;
        const entry *o = &corpus[below(ncorpus)];
        size_t cut = below(b->n + 1), from = below(o->n + 1);
        if (cut + (o->n - from) > max_len)
            break;
        b->n = cut;
        insert_at(b, cut, o->p + from, o->n - from);
        break;
    }
    case 10: { /* swap the payloads: another seed's data after this header */
        if (!ncorpus || !header_span(b, &lo, &hi))
            break;
        const entry *o = &corpus[below(ncorpus)];
        buf ob = {o->p, o->n, o->n};
        size_t olo, ohi;
        if (!header_span(&ob, &olo, &ohi) || hi + (o->n - ohi) > max_len)
            break;
        b->n = hi;
        insert_at(b, hi, o->p + ohi, o->n - ohi);
        break;
    }
    default: { /* payload bytes: random run in the data section */
        if (!header_span(b, &lo, &hi) || hi >= b->n)
            break;
        size_t at = hi + below(b->n - hi);
        size_t n = 1 + below(16);
        for (size_t i = 0; i < n && at + i < b->n; i++)
            b->p[at + i] = below(4) ? (uint8_t)rnd() : (uint8_t)(below(2) ? 0xff : 0);
        break;
    }
    }
    if (b->n > max_len)
        b->n = max_len;
}

/* ------------------------------------------------------------------ findings */
static const uint8_t *volatile cur_data;
static volatile size_t cur_size;
static const char *artifact_prefix = "./";
static volatile sig_atomic_t dumping;

static void dump_current(const char *kind)
{
    /* async-signal-safe: only open/write/close and manual formatting */
    if (dumping)
        return;
    dumping = 1;
    const uint8_t *p = cur_data;
    size_t n = cur_size;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; p && i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    char path[4096];
    size_t k = 0, lp = strlen(artifact_prefix), lk = strlen(kind);
    if (lp + lk + 20 >= sizeof path)
        return;
    memcpy(path, artifact_prefix, lp);
    k = lp;
    memcpy(path + k, kind, lk);
    k += lk;
    path[k++] = '-';
    for (int i = 15; i >= 0; i--)
        path[k++] = "0123456789abcdef"[(h >> (4 * i)) & 15];
    path[k] = 0;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        size_t off = 0;
        while (p && off < n) {
            ssize_t w = write(fd, p + off, n - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        close(fd);
        static const char msg[] = "\n==qformat-fuzz== input written to ";
        ssize_t r = write(2, msg, sizeof msg - 1);
        r = write(2, path, k);
        r = write(2, "\n", 1);
        (void)r;
    }
}

static void on_death(void) { dump_current("crash"); }

/* UBSan's fatal path (-fno-sanitize-recover) exits without ASan's death callback: make it abort,
 * so the SIGABRT handler writes the input.  Environment variables still override these. */
const char *__ubsan_default_options(void);
const char *__ubsan_default_options(void) { return "abort_on_error=1:print_stacktrace=1:halt_on_error=1"; }

static void on_signal(int sig)
{
    dump_current(sig == SIGALRM ? "timeout" : "crash");
    signal(sig, SIG_DFL);
    if (sig == SIGALRM)
        _exit(70);
    raise(sig);
}

static void write_file_plain(const char *path, const uint8_t *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n)
            fwrite(p, 1, n, f);
        fclose(f);
    }
}

/* ------------------------------------------------------------------ feature set */
static uint64_t *seen;
static size_t seen_cap = 1 << 16, nseen;

static int feature_is_new(uint64_t v)
{
    if (!v)
        v = 1;
    if (2 * (nseen + 1) > seen_cap)
        return 0; /* table full: stop growing the corpus */
    size_t i = (size_t)(v * 0x9e3779b97f4a7c15ull) & (seen_cap - 1);
    while (seen[i]) {
        if (seen[i] == v)
            return 0;
        i = (i + 1) & (seen_cap - 1);
    }
    seen[i] = v;
    nseen++;
    return 1;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run_one(const uint8_t *p, size_t n, unsigned timeout)
{
    /* exact-size heap copy, so reading one byte past the input is an ASan report */
    uint8_t *copy = xrealloc(NULL, n);
    if (n)
        memcpy(copy, p, n);
    cur_data = copy;
    cur_size = n;
    if (timeout)
        alarm(timeout);
    LLVMFuzzerTestOneInput(copy, n);
    if (timeout)
        alarm(0);
    cur_data = NULL;
    cur_size = 0;
    free(copy);
}

static int leak_check(void)
{
#ifdef QF_HAVE_ASAN
    return __lsan_do_recoverable_leak_check();
#else
    return 0;
#endif
}

static int flag(const char *arg, const char *name, const char **val)
{
    size_t l = strlen(name);
    if (strncmp(arg, name, l) == 0 && arg[l] == '=') {
        *val = arg + l + 1;
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    long long runs = 100000;
    double max_time = 0;
    unsigned timeout = 20;
    int save_every = 0;
    long long leak_every = 20000, print_every = 100000;
    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    const char **dirs = NULL, **files = NULL;
    size_t ndirs = 0, nfiles = 0;
    dirs = xrealloc(NULL, (size_t)argc * sizeof *dirs);
    files = xrealloc(NULL, (size_t)argc * sizeof *files);
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (flag(argv[i], "-seed", &v))
            seed = strtoull(v, NULL, 10);
        else if (flag(argv[i], "-runs", &v))
            runs = strtoll(v, NULL, 10);
        else if (flag(argv[i], "-max_total_time", &v))
            max_time = strtod(v, NULL);
        else if (flag(argv[i], "-max_len", &v))
            max_len = (size_t)strtoull(v, NULL, 10);
        else if (flag(argv[i], "-timeout", &v))
            timeout = (unsigned)strtoul(v, NULL, 10);
        else if (flag(argv[i], "-artifact_prefix", &v))
            artifact_prefix = v;
        else if (flag(argv[i], "-save_every_input", &v))
            save_every = atoi(v);
        else if (flag(argv[i], "-leak_check_every", &v))
            leak_every = strtoll(v, NULL, 10);
        else if (flag(argv[i], "-print_every", &v))
            print_every = strtoll(v, NULL, 10);
        else if (argv[i][0] == '-') {
            fprintf(stderr, "qformat-fuzz: unknown flag %s (see the comment at the top of fuzz/driver.c)\n", argv[i]);
            free(dirs);
            free(files);
            return 2;
        } else {
            struct stat st;
            if (stat(argv[i], &st) != 0) {
                fprintf(stderr, "qformat-fuzz: cannot stat %s: %s\n", argv[i], strerror(errno));
                free(dirs);
                free(files);
                return 2;
            }
            if (S_ISDIR(st.st_mode))
                dirs[ndirs++] = argv[i];
            else
                files[nfiles++] = argv[i];
        }
    }

#ifdef QF_HAVE_ASAN
    __sanitizer_set_death_callback(on_death);
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGALRM};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);

    if (nfiles && !ndirs) { /* reproduce: the input is a file already, write no artifact */
        dumping = 1;
        buf b = {0};
        for (size_t i = 0; i < nfiles; i++) {
            if (read_file(files[i], &b) != 0) {
                fprintf(stderr, "qformat-fuzz: cannot read %s\n", files[i]);
                return 2;
            }
            fprintf(stderr, "Running: %s (%zu bytes)\n", files[i], b.n);
            run_one(b.p, b.n, timeout);
            fprintf(stderr, "Executed %s\n", files[i]);
        }
        free(b.p);
        free(dirs);
        free(files);
        return leak_check() ? 1 : 0;
    }

    if (ndirs == 0)
        load_dir(QF_DEFAULT_SEED_DIR, ".safetensors", 0);
    for (size_t i = 0; i < ndirs; i++)
        load_dir(dirs[i], NULL, 0);
    {
        buf b = {0};
        for (size_t i = 0; i < nfiles; i++)
            if (read_file(files[i], &b) == 0)
                corpus_add(b.p, b.n);
        free(b.p);
    }
    nseeds = ncorpus;
    if (!ncorpus) {
        fprintf(stderr, "qformat-fuzz: no seed inputs (default seeds: *.safetensors under %s)\n", QF_DEFAULT_SEED_DIR);
        corpus_add((const uint8_t *)"", 0);
    }
    for (size_t i = 0; i < ncorpus; i++)
        harvest_tokens(&corpus[i]);
    seen = calloc(seen_cap, sizeof *seen);
    if (!seen)
        return 3;

    char current_path[4096];
    snprintf(current_path, sizeof current_path, "%scurrent-input", artifact_prefix);
    fprintf(stderr, "INFO: Seed: %llu\nINFO: %zu seed inputs, %zu dictionary tokens, max_len %zu\n",
            (unsigned long long)seed, nseeds, ndict, max_len);
    rng_state = seed;

    double t0 = now();
    /* every seed once, unmutated */
    for (size_t i = 0; i < nseeds; i++) {
        run_one(corpus[i].p, corpus[i].n, timeout);
        feature_is_new(qf_fuzz_feature);
    }
    fprintf(stderr, "#%zu\tINITED corp: %zu features: %zu\n", nseeds, ncorpus, nseen);

    buf b = {0};
    long long done = 0;
    int status = 0;
    while (runs < 0 || done < runs) {
        if (max_time > 0 && (done & 63) == 0 && now() - t0 >= max_time)
            break;
        const entry *base = &corpus[below(ncorpus)];
        set_bytes(&b, base->p, base->n);
        size_t k = 1 + below(below(2) ? 2 : 6);
        for (size_t i = 0; i < k; i++)
            mutate_once(&b);
        if (save_every)
            write_file_plain(current_path, b.p, b.n);
        run_one(b.p, b.n, timeout);
        done++;
        if (feature_is_new(qf_fuzz_feature) && ncorpus < 50000)
            corpus_add(b.p, b.n);
        if (leak_every > 0 && done % leak_every == 0 && leak_check()) {
            cur_data = b.p; /* the culprit when -leak_check_every=1 */
            cur_size = b.n;
            dump_current("leak");
            fprintf(stderr, "qformat-fuzz: LeakSanitizer found leaks within the last %lld executions (input not isolated: rerun them with -leak_check_every=1)\n", leak_every);
            status = 1;
            break;
        }
        if (print_every > 0 && done % print_every == 0) {
            double dt = now() - t0;
            fprintf(stderr, "#%lld\tpulse corp: %zu features: %zu exec/s: %.0f\n", done, ncorpus, nseen, dt > 0 ? done / dt : 0.0);
        }
    }
    double dt = now() - t0;
    if (!status && leak_check()) {
        fprintf(stderr, "qformat-fuzz: LeakSanitizer found leaks\n");
        status = 1;
    }
    fprintf(stderr, "Done %lld runs in %.1f second(s); exec/s: %.0f; corpus %zu (%zu seeds); features %zu; findings %d\n",
            done, dt, dt > 0 ? done / dt : 0.0, ncorpus, nseeds, nseen, status);
    for (size_t i = 0; i < ncorpus; i++)
        free(corpus[i].p);
    free(corpus);
    for (size_t i = 0; i < ndict; i++)
        free(dict[i]);
    free(dict);
    free(seen);
    free(b.p);
    free(dirs);
    free(files);
    return status;
}
