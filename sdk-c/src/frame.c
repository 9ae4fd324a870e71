/* Frame header packing and validation. The wire order of the first 8 bytes is magic, version,
 * opcode, flags, status (docs/protocol.md, "Framing"); the rest is the header's fields in
 * order. Decoding refuses before the payload is read, so a lying header costs 64 bytes. */
#include "frame.h"

#include "gcache.h"

void gc_pack_header(const gc_header *h, uint8_t out[GC_HEADER_SIZE])
{
    out[0] = (uint8_t)GC_MAGIC;
    out[1] = (uint8_t)(GC_MAGIC >> 8);
    out[2] = (uint8_t)(GC_MAGIC >> 16);
    out[3] = (uint8_t)(GC_MAGIC >> 24);
    out[4] = GC_VERSION;
    out[5] = h->op;
    out[6] = h->flags;
    out[7] = h->status;
    for (int i = 0; i < 4; i++) out[8 + i] = (uint8_t)(h->request_id >> (8 * i));
    gc_put16(out + 12, h->key_len);
    gc_put16(out + 14, h->count);
    gc_put64(out + 16, h->payload_len);
    gc_put64(out + 24, h->handle);
    gc_put64(out + 32, h->offset);
    gc_put64(out + 40, h->length);
    gc_put64(out + 48, h->checksum);
    gc_put64(out + 56, h->group);
}

int gc_unpack_header(const uint8_t in[GC_HEADER_SIZE], uint64_t max_payload, gc_header *h,
                     const char **why)
{
    if (gc_get32(in) != GC_MAGIC) {
        *why = "wrong magic";
        return GCACHE_MISS_PROTOCOL;
    }
    if (in[4] != GC_VERSION) {
        *why = "wrong protocol version";
        return GCACHE_MISS_PROTOCOL;
    }
    h->op = in[5];
    h->flags = in[6];
    h->status = in[7];
    h->request_id = gc_get32(in + 8);
    h->key_len = gc_get16(in + 12);
    h->count = gc_get16(in + 14);
    h->payload_len = gc_get64(in + 16);
    h->handle = gc_get64(in + 24);
    h->offset = gc_get64(in + 32);
    h->length = gc_get64(in + 40);
    h->checksum = gc_get64(in + 48);
    h->group = gc_get64(in + 56);
    if (h->op < 1 || h->op > GC_OP_LAST || h->status > GC_ST_LAST) {
        *why = "unknown opcode or status";
        return GCACHE_MISS_PROTOCOL;
    }
    if (h->key_len > GC_MAX_KEY) {
        *why = "key_len over 1024";
        return GCACHE_MISS_PROTOCOL;
    }
    if (h->payload_len > max_payload) {
        *why = "payload_len over what the reply can hold";
        return GCACHE_MISS_PROTOCOL;
    }
    return 0;
}

int gc_status_miss(uint8_t status)
{
    switch (status) {
    case GC_ST_NOT_FOUND: return GCACHE_MISS_ABSENT;
    case GC_ST_NO_SPACE: return GCACHE_MISS_NO_SPACE;
    case GC_ST_CHECKSUM_MISMATCH: return GCACHE_MISS_CHECKSUM;
    case GC_ST_AUTH_REQUIRED:
    case GC_ST_AUTH_FAILED: return GCACHE_MISS_AUTH;
    default: return GCACHE_MISS_SERVER_ERROR;
    }
}

int gc_failure_miss(uint8_t status)
{
    return status == GC_ST_AUTH_REQUIRED || status == GC_ST_AUTH_FAILED ? GCACHE_MISS_AUTH
                                                                        : GCACHE_MISS_SERVER_ERROR;
}
