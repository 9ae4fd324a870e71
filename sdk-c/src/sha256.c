/* SHA-256 (FIPS 180-4) and HMAC (RFC 2104). Small inputs only (proofs, host facts), so the
 * plain round function is fast enough; checked against the standard's test vectors and the
 * Python SDK's proofs in tests/vectors/handshake.json. */
#include "sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void compress(uint32_t st[8], const uint8_t block[64])
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)block[4 * i] << 24) | ((uint32_t)block[4 * i + 1] << 16) |
               ((uint32_t)block[4 * i + 2] << 8) | (uint32_t)block[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6],
             h = st[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] +
                      w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    st[0] += a; st[1] += b; st[2] += c; st[3] += d;
    st[4] += e; st[5] += f; st[6] += g; st[7] += h;
}

void gc_sha256_init(gc_sha256 *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->state, iv, sizeof iv);
    s->bytes = 0;
    s->fill = 0;
}

void gc_sha256_update(gc_sha256 *s, const void *data, size_t len)
{
    const uint8_t *p = data;
    s->bytes += len;
    while (len) {
        size_t n = 64 - s->fill < len ? 64 - s->fill : len;
        memcpy(s->block + s->fill, p, n);
        s->fill += n;
        p += n;
        len -= n;
        if (s->fill == 64) {
            compress(s->state, s->block);
            s->fill = 0;
        }
    }
}

void gc_sha256_final(gc_sha256 *s, uint8_t digest[32])
{
    uint64_t bits = s->bytes * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    gc_sha256_update(s, &pad, 1);
    while (s->fill != 56) gc_sha256_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    gc_sha256_update(s, len, 8);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(s->state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(s->state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(s->state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)s->state[i];
    }
}

void gc_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t msg_len,
                    uint8_t mac[32])
{
    uint8_t k[64] = {0}, pad[64], inner[32];
    gc_sha256 s;
    if (key_len > 64) {             /* a long key is replaced by its digest (RFC 2104) */
        gc_sha256_init(&s);
        gc_sha256_update(&s, key, key_len);
        gc_sha256_final(&s, k);
    } else if (key_len) {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    gc_sha256_init(&s);
    gc_sha256_update(&s, pad, 64);
    gc_sha256_update(&s, msg, msg_len);
    gc_sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    gc_sha256_init(&s);
    gc_sha256_update(&s, pad, 64);
    gc_sha256_update(&s, inner, 32);
    gc_sha256_final(&s, mac);
}

void gc_auth_proof(const char *token, const uint8_t *nonce, size_t nonce_len, uint8_t proof[32])
{
    static const char context[] = "gcache-data-plane-v1";
    uint8_t msg[256 + sizeof context];
    /* a nonce is 16 bytes; a longer one (a lying server) is cut, and the proof then fails */
    size_t n = nonce_len > 256 ? 256 : nonce_len;
    if (n) memcpy(msg, nonce, n);
    memcpy(msg + n, context, sizeof context - 1);
    gc_hmac_sha256(token, strlen(token), msg, n + sizeof context - 1, proof);
}

static int is_name_char(char ch, int first)
{
    if (ch >= 'a' && ch <= 'z') return 1;
    return !first && ((ch >= '0' && ch <= '9') || ch == '_' || ch == '-');
}

static int is_secret_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           ch == '_' || ch == '-';
}

size_t gc_tenant_name_len(const char *token)
{
    size_t n = 0;
    while (n < 32 && token[n] && is_name_char(token[n], n == 0)) n++;
    if (n == 0 || token[n] != '.') return 0;
    size_t secret = 0;
    while (token[n + 1 + secret] && is_secret_char(token[n + 1 + secret])) secret++;
    return secret == 43 && token[n + 1 + secret] == 0 ? n : 0;
}

void gc_tenant_proof(const char *token, size_t name_len, const uint8_t *nonce, size_t nonce_len,
                     uint8_t proof[32])
{
    static const char context[] = "gcache-tenant-v1";
    uint8_t hashed[32], msg[256 + sizeof context + 32];
    gc_sha256 s;
    gc_sha256_init(&s);
    gc_sha256_update(&s, token, strlen(token));
    gc_sha256_final(&s, hashed);
    /* a nonce is 16 bytes; a longer one (a lying server) is cut, and the proof then fails */
    size_t n = nonce_len > 256 ? 256 : nonce_len;
    if (n) memcpy(msg, nonce, n);
    memcpy(msg + n, context, sizeof context - 1);
    memcpy(msg + n + sizeof context - 1, token, name_len);
    gc_hmac_sha256(hashed, sizeof hashed, msg, n + sizeof context - 1 + name_len, proof);
}
