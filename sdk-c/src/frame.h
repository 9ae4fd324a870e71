/* The data-plane frame codec (docs/protocol.md, "Framing"): a fixed 64-byte little-endian
 * header, then key_len bytes of key, then payload_len bytes of payload. Decoding validates
 * every field a peer controls before anything is read or allocated for what it announces. */
#ifndef GC_FRAME_H
#define GC_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define GC_MAGIC 0x564B4347u     /* "GCKV" read as a little-endian u32 */
#define GC_VERSION 2
#define GC_HEADER_SIZE 64
#define GC_MAX_KEY 1024
#define GC_BATCH_MAX 4096        /* keys per request (the wire allows 65535) */

enum gc_op {
    GC_PUT = 1, GC_GET = 2, GC_ALLOC = 3, GC_WRITE = 4, GC_COMMIT = 5, GC_LEASE = 6,
    GC_READ = 7, GC_RELEASE = 8, GC_EXISTS = 9, GC_DELETE = 10, GC_STAT = 11,
    GC_BATCH_GET = 12, GC_BATCH_PUT = 13, GC_HELLO = 14, GC_BATCH_LEASE = 15, GC_AUTH = 16,
    GC_LIST = 17, GC_PREFETCH = 18, GC_OP_LAST = 18    /* PREFETCH: never sent, decoded */
};

enum gc_status {
    GC_ST_OK = 0, GC_ST_NOT_FOUND = 1, GC_ST_BAD_REQUEST = 2, GC_ST_NO_SPACE = 3,
    GC_ST_CHECKSUM_MISMATCH = 4, GC_ST_TOO_LARGE = 5, GC_ST_UNKNOWN_HANDLE = 6,
    GC_ST_INTERNAL = 7, GC_ST_AUTH_REQUIRED = 8, GC_ST_AUTH_FAILED = 9, GC_ST_LAST = 9
};

#define GC_FLAG_CHECKSUM_TRAILS 0x01u
#define GC_FLAG_NO_REPLY 0x02u
#define GC_FLAG_IN_PLACE 0x04u
#define GC_FLAG_CONTENT_ADDRESSED 0x08u
#define GC_FLAG_PINNED 0x10u
#define GC_FLAG_PARENT 0x20u
#define GC_FLAG_TENANT 0x40u             /* AUTH: a tenant's proof, then its name */

/* Table entries of batch payloads. */
#define GC_GET_ENTRY 17          /* BATCH_GET reply: u8 status, u64 length, u64 checksum */
#define GC_PUT_ENTRY 18          /* BATCH_PUT request: u16 key_len, u64 length, u64 checksum */
#define GC_LEASE_ENTRY 33        /* BATCH_LEASE reply: u8 status, u64 handle, offset, length,
                                  * checksum */

typedef struct gc_header {
    uint8_t op, flags, status;
    uint32_t request_id;
    uint16_t key_len, count;
    uint64_t payload_len, handle, offset, length, checksum, group;
} gc_header;

void gc_pack_header(const gc_header *h, uint8_t out[GC_HEADER_SIZE]);

/* 0, or GCACHE_MISS_PROTOCOL with why in *why: wrong magic or version, an unknown opcode or
 * status, key_len over 1024, payload_len over max_payload. */
int gc_unpack_header(const uint8_t in[GC_HEADER_SIZE], uint64_t max_payload, gc_header *h,
                     const char **why);

/* A status that answers a call (NOT_FOUND, NO_SPACE, CHECKSUM_MISMATCH) as the call's miss. */
int gc_status_miss(uint8_t status);
/* A status that fails an exchange as the miss it counts as: auth for AUTH_REQUIRED and
 * AUTH_FAILED, server_error for every other (docs/protocol.md, "What a client does with
 * failures"). */
int gc_failure_miss(uint8_t status);

/* Little-endian scalars. */
static inline void gc_put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void gc_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t gc_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static inline uint32_t gc_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static inline uint32_t gc_get32_be(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}
static inline uint64_t gc_get64(const uint8_t *p)
{
    return (uint64_t)gc_get32(p) | ((uint64_t)gc_get32(p + 4) << 32);
}

#endif
