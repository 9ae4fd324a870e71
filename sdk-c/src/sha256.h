/* SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104): the AUTH proof (docs/protocol.md,
 * "Connecting and authenticating") and the host id (same-host detection). Written here
 * because the library depends on nothing beyond libc, pthreads and xxhash. */
#ifndef GC_SHA256_H
#define GC_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct gc_sha256 {
    uint32_t state[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t fill;
} gc_sha256;

void gc_sha256_init(gc_sha256 *s);
void gc_sha256_update(gc_sha256 *s, const void *data, size_t len);
void gc_sha256_final(gc_sha256 *s, uint8_t digest[32]);

void gc_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                    uint8_t mac[32]);

/* The AUTH payload: HMAC-SHA256(key = token, message = nonce || "gcache-data-plane-v1"). */
void gc_auth_proof(const char *token, const uint8_t *nonce, size_t nonce_len, uint8_t proof[32]);

/* The length of the tenant name a tenant token "<name>.<secret>" starts with (a lowercase
 * letter, then up to 31 of [a-z0-9_-]; a secret of 43 URL-safe base64 characters), or 0 when
 * token is not one (a cluster token): gcache/tenant_token.py's rule. */
size_t gc_tenant_name_len(const char *token);

/* A tenant's AUTH proof: HMAC-SHA256(key = SHA-256(token), message = nonce ||
 * "gcache-tenant-v1" || name), name being the token's first name_len bytes. */
void gc_tenant_proof(const char *token, size_t name_len, const uint8_t *nonce, size_t nonce_len,
                     uint8_t proof[32]);

#endif
