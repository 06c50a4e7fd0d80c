/* SHA-256 as specified in FIPS 180-4 (sections 4.1.2, 4.2.2, 5.1.1, 5.3.3, 6.2). */
#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u,
};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define BSIG0(x) (ROTR(x, 2) ^ ROTR(x, 13) ^ ROTR(x, 22))
#define BSIG1(x) (ROTR(x, 6) ^ ROTR(x, 11) ^ ROTR(x, 25))
#define SSIG0(x) (ROTR(x, 7) ^ ROTR(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (ROTR(x, 17) ^ ROTR(x, 19) ^ ((x) >> 10))

static uint32_t load_be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void store_be32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

/* Process one 512-bit block (FIPS 180-4 section 6.2.2). */
static void compress(uint32_t H[8], const unsigned char *block)
{
    uint32_t W[64];
    for (int t = 0; t < 16; t++)
        W[t] = load_be32(block + 4 * t);
    for (int t = 16; t < 64; t++)
        W[t] = SSIG1(W[t - 2]) + W[t - 7] + SSIG0(W[t - 15]) + W[t - 16];

    uint32_t a = H[0], b = H[1], c = H[2], d = H[3], e = H[4], f = H[5], g = H[6], h = H[7];
    for (int t = 0; t < 64; t++) {
        uint32_t T1 = h + BSIG1(e) + CH(e, f, g) + K[t] + W[t];
        uint32_t T2 = BSIG0(a) + MAJ(a, b, c);
        h = g;
        g = f;
        f = e;
        e = d + T1;
        d = c;
        c = b;
        b = a;
        a = T1 + T2;
    }
    H[0] += a;
    H[1] += b;
    H[2] += c;
    H[3] += d;
    H[4] += e;
    H[5] += f;
    H[6] += g;
    H[7] += h;
}

void qf_sha256_init(qf_sha256_ctx *ctx)
{
    /* FIPS 180-4 section 5.3.3 */
    static const uint32_t H0[8] = {
        0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
        0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u,
    };
    memcpy(ctx->state, H0, sizeof H0);
    ctx->total = 0;
    ctx->buflen = 0;
}

void qf_sha256_update(qf_sha256_ctx *ctx, const void *data, size_t n)
{
    const unsigned char *p = (const unsigned char *)data;
    if (n == 0)
        return;
    ctx->total += (uint64_t)n;
    if (ctx->buflen) {
        size_t take = QF_SHA256_BLOCK_SIZE - ctx->buflen;
        if (take > n)
            take = n;
        memcpy(ctx->buf + ctx->buflen, p, take);
        ctx->buflen += take;
        p += take;
        n -= take;
        if (ctx->buflen < QF_SHA256_BLOCK_SIZE)
            return;
        compress(ctx->state, ctx->buf);
        ctx->buflen = 0;
    }
    while (n >= QF_SHA256_BLOCK_SIZE) {
        compress(ctx->state, p);
        p += QF_SHA256_BLOCK_SIZE;
        n -= QF_SHA256_BLOCK_SIZE;
    }
    if (n) {
        memcpy(ctx->buf, p, n);
        ctx->buflen = n;
    }
}

void qf_sha256_final(qf_sha256_ctx *ctx, unsigned char out[QF_SHA256_DIGEST_SIZE])
{
    /* Padding (section 5.1.1): a 1 bit, zeros, then the 64-bit big-endian length in bits. */
    uint64_t bits = ctx->total << 3;
    size_t i = ctx->buflen;
    ctx->buf[i++] = 0x80;
    if (i > 56) {
        memset(ctx->buf + i, 0, QF_SHA256_BLOCK_SIZE - i);
        compress(ctx->state, ctx->buf);
        i = 0;
    }
    memset(ctx->buf + i, 0, 56 - i);
    for (int k = 0; k < 8; k++)
        ctx->buf[56 + k] = (unsigned char)(bits >> (56 - 8 * k));
    compress(ctx->state, ctx->buf);
    for (int k = 0; k < 8; k++)
        store_be32(out + 4 * k, ctx->state[k]);
    memset(ctx, 0, sizeof *ctx);
}

void qf_sha256(const void *data, size_t n, unsigned char out[QF_SHA256_DIGEST_SIZE])
{
    qf_sha256_ctx ctx;
    qf_sha256_init(&ctx);
    qf_sha256_update(&ctx, data, n);
    qf_sha256_final(&ctx, out);
}
