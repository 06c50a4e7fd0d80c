/* Test driver for src/sha256.c (run by tests/test_libqformat.py, which compares with hashlib).
 *
 *   test_sha256                 built-in FIPS 180-4 / NIST vectors; exit 0 when all match
 *   test_sha256 stdin [CHUNK]   hash standard input; prints the hex digest.  With CHUNK (a
 *                               seed), the input is fed through qf_sha256_update in pseudo-random
 *                               pieces of 0..130 bytes, else through the one-shot qf_sha256
 *   test_sha256 zeros N [STEP]  hash N zero bytes incrementally (STEP bytes per update, default
 *                               1 MiB), for lengths past 4 GiB without holding them in memory
 */
#include "sha256.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void hex(const unsigned char d[32], char out[65])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        out[2 * i] = digits[d[i] >> 4];
        out[2 * i + 1] = digits[d[i] & 15];
    }
    out[64] = 0;
}

static int check(const char *label, const unsigned char d[32], const char *want)
{
    char got[65];
    hex(d, got);
    if (strcmp(got, want) != 0) {
        printf("FAIL %s: got %s want %s\n", label, got, want);
        return 1;
    }
    printf("ok   %s\n", label);
    return 0;
}

static int builtin(void)
{
    int bad = 0;
    unsigned char d[32];
    static const struct { const char *msg; const char *want; } v[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        qf_sha256(v[i].msg, strlen(v[i].msg), d);
        bad += check(v[i].msg[0] ? v[i].msg : "(empty)", d, v[i].want);
        /* the same message one byte at a time */
        qf_sha256_ctx c;
        qf_sha256_init(&c);
        for (size_t k = 0; v[i].msg[k]; k++)
            qf_sha256_update(&c, v[i].msg + k, 1);
        qf_sha256_final(&c, d);
        bad += check("bytewise", d, v[i].want);
    }
    /* one million 'a' (FIPS 180-2 appendix B.3) */
    {
        char *a = malloc(1000000);
        if (!a)
            return 1;
        memset(a, 'a', 1000000);
        qf_sha256(a, 1000000, d);
        bad += check("million a", d, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
        free(a);
    }
    /* NIST long message: "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno" x 16777216 (1 GiB)
     * is too slow for a unit test; the zeros mode covers lengths past 4 GiB instead. */
    return bad ? 1 : 0;
}

static unsigned long long xorshift(unsigned long long *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

int main(int argc, char **argv)
{
    unsigned char d[32];
    char h[65];
    if (argc == 1)
        return builtin();
    if (strcmp(argv[1], "stdin") == 0) {
        size_t cap = 1 << 16, n = 0;
        unsigned char *buf = malloc(cap);
        if (!buf)
            return 2;
        for (;;) {
            if (n == cap) {
                unsigned char *nb = realloc(buf, cap *= 2);
                if (!nb)
                    return 2;
                buf = nb;
            }
            size_t r = fread(buf + n, 1, cap - n, stdin);
            if (r == 0)
                break;
            n += r;
        }
        if (argc > 2) {
            unsigned long long s = strtoull(argv[2], NULL, 10) * 2654435761ull + 1;
            qf_sha256_ctx c;
            qf_sha256_init(&c);
            size_t off = 0;
            while (off < n) {
                size_t k = (size_t)(xorshift(&s) % 131);
                if (k > n - off)
                    k = n - off;
                qf_sha256_update(&c, buf + off, k);
                off += k;
            }
            qf_sha256_update(&c, buf, 0);
            qf_sha256_final(&c, d);
        } else {
            qf_sha256(buf, n, d);
        }
        free(buf);
        hex(d, h);
        printf("%s\n", h);
        return 0;
    }
    if (strcmp(argv[1], "zeros") == 0 && argc >= 3) {
        unsigned long long n = strtoull(argv[2], NULL, 10);
        size_t step = argc > 3 ? (size_t)strtoull(argv[3], NULL, 10) : (size_t)1 << 20;
        unsigned char *z = calloc(step ? step : 1, 1);
        if (!z)
            return 2;
        qf_sha256_ctx c;
        qf_sha256_init(&c);
        while (n) {
            size_t k = n < step ? (size_t)n : step;
            qf_sha256_update(&c, z, k);
            n -= k;
        }
        qf_sha256_final(&c, d);
        free(z);
        hex(d, h);
        printf("%s\n", h);
        return 0;
    }
    fprintf(stderr, "usage: test_sha256 [stdin [SEED] | zeros N [STEP]]\n");
    return 2;
}
