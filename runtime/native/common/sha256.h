/* SHA-256 (FIPS 180-4), streaming; public-domain style, no dependencies. */
#ifndef MHA_SHA256_H
#define MHA_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint32_t state[8];
    uint64_t length;     /* bytes hashed so far */
    uint8_t block[64];
    size_t used;         /* bytes waiting in block */
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const void *data, size_t n);
void sha256_final(Sha256 *s, uint8_t digest[32]);
/* The digest of data[0:n] as 64 lowercase hex digits and a NUL. */
void sha256_hex(const void *data, size_t n, char hex[65]);

#ifdef __cplusplus
}
#endif
#endif
