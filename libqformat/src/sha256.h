/* SHA-256 (FIPS 180-4), self-contained, C11.  Internal to libqformat: these symbols are not
 * part of the public API (they have hidden visibility in the shared library). */
#ifndef QF_SHA256_H
#define QF_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define QF_SHA256_DIGEST_SIZE 32
#define QF_SHA256_BLOCK_SIZE 64

typedef struct qf_sha256_ctx {
    uint32_t state[8];
    uint64_t total;              /* bytes hashed so far (the message length is mod 2^64 bits) */
    unsigned char buf[QF_SHA256_BLOCK_SIZE];
    size_t buflen;               /* bytes waiting in buf, always < 64 */
} qf_sha256_ctx;

void qf_sha256_init(qf_sha256_ctx *ctx);
void qf_sha256_update(qf_sha256_ctx *ctx, const void *data, size_t n);
void qf_sha256_final(qf_sha256_ctx *ctx, unsigned char out[QF_SHA256_DIGEST_SIZE]);

/* One-shot: out = SHA-256(data[0..n)). */
void qf_sha256(const void *data, size_t n, unsigned char out[QF_SHA256_DIGEST_SIZE]);

#ifdef __cplusplus
}
#endif

#endif
