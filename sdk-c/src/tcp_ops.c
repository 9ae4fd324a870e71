/* Exchanges whose values travel inside the frames: PUT / GET and BATCH_PUT / BATCH_GET, one
 * round trip each whatever the size, the value streamed in io_size IOs. (The split
 * ALLOC/WRITE/COMMIT and LEASE/READ/RELEASE exchanges would cost extra round trips on one
 * ordered stream; they serve the paths where the client touches the arena itself.) */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "wire.h"

#define HASH_PIECE (256u << 10)   /* hashed just before it is sent: still in cache for send */

/* A reply without a payload (where one is not expected). */
static int bare_reply(gc_conn *c, const gc_header *req, gc_header *reply)
{
    return gc_reply(c, req, 0, reply);
}

int gc_tcp_put(gc_link *l, gc_key key, const void *value, size_t len, uint64_t group,
               unsigned flags, int *answer)
{
    gc_conn *c = &l->conn;
    const uint8_t *v = value;
    size_t step = c->io_size < HASH_PIECE ? c->io_size : HASH_PIECE;
    size_t first = len < step ? len : step;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    XXH3_64bits_update(&st, v, first);
    /* one PUT whose checksum trails the value: each piece is hashed just before it is sent,
     * so neither side makes a second pass over the value */
    gc_header h = {.op = GC_PUT, .flags = (uint8_t)(GC_FLAG_CHECKSUM_TRAILS | flags), .group = group};
    uint8_t raw[GC_HEADER_SIZE];
    h.request_id = ++c->next_id;
    h.key_len = (uint16_t)key.len;
    h.payload_len = len + 8;
    gc_pack_header(&h, raw);
    gc_conn_expect(c, len);
    struct iovec iov[3] = {{raw, sizeof raw}, {(void *)key.data, key.len}, {(void *)v, first}};
    int rc = gc_conn_sendv(c, iov, 3);
    for (size_t off = first; !rc && off < len; off += step) {
        size_t n = len - off < step ? len - off : step;
        XXH3_64bits_update(&st, v + off, n);
        rc = gc_conn_send(c, v + off, n);
    }
    uint8_t trailer[8];
    gc_put64(trailer, XXH3_64bits_digest(&st));
    if (!rc) rc = gc_conn_send(c, trailer, sizeof trailer);
    gc_header reply;
    if (!rc) rc = bare_reply(c, &h, &reply);
    if (!rc) rc = gc_answer(GC_PUT, reply.status);
    if (!rc) *answer = reply.status == GC_ST_OK ? GCACHE_OK : gc_status_miss(reply.status);
    return rc;
}

int gc_tcp_get(gc_link *l, gc_key key, void *out, size_t out_len, uint64_t max_value,
               int64_t *answer)
{
    gc_conn *c = &l->conn;
    gc_header h = {.op = GC_GET}, reply;
    gc_conn_expect(c, 0);
    int rc = gc_request(c, &h, key.data, key.len, NULL, 0);
    if (!rc) rc = gc_reply(c, &h, max_value, &reply);
    if (!rc) rc = gc_answer(GC_GET, reply.status);
    if (rc) return rc;
    if (reply.status != GC_ST_OK) {
        *answer = gc_status_miss(reply.status);
        return reply.payload_len ? GCACHE_MISS_PROTOCOL : 0;
    }
    if (reply.payload_len == 0) return GCACHE_MISS_PROTOCOL;     /* values are 1+ bytes */
    if (reply.payload_len > out_len) return GCACHE_ERR_TOO_SMALL;
    XXH3_state_t st;
    XXH3_64bits_reset(&st);
    gc_conn_expect(c, reply.payload_len);
    rc = gc_conn_recv(c, out, (size_t)reply.payload_len, &st);
    if (rc) return rc;
    *answer = XXH3_64bits_digest(&st) == reply.checksum ? (int64_t)reply.payload_len
                                                         : GCACHE_MISS_CHECKSUM;
    return 0;
}

/* "u16 length + bytes" per key (EXISTS, BATCH_GET, BATCH_LEASE payloads); malloc'd. */
uint8_t *gc_encode_keys(const gc_key *keys, size_t n, size_t *len)
{
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += 2 + keys[i].len;
    uint8_t *buf = malloc(total ? total : 1), *p = buf;
    if (!buf) return NULL;
    for (size_t i = 0; i < n; i++) {
        gc_put16(p, (uint16_t)keys[i].len);
        memcpy(p + 2, keys[i].data, keys[i].len);
        p += 2 + keys[i].len;
    }
    *len = total;
    return buf;
}

/* Consume n bytes that no destination takes, keeping the stream in sync. */
static int drain(gc_conn *c, uint64_t n)
{
    uint8_t scratch[16384];
    while (n) {
        size_t step = n < sizeof scratch ? (size_t)n : sizeof scratch;
        int rc = gc_conn_recv(c, scratch, step, NULL);
        if (rc) return rc;
        n -= step;
    }
    return 0;
}

/* The BATCH_GET table: every length within max_value, statuses 0, 1 or 3, and the present
 * values adding up, with the table, to the frame's payload_len. */
static int check_table(const uint8_t *table, size_t n, uint64_t max_value, uint64_t payload_len)
{
    uint64_t total = (uint64_t)n * GC_GET_ENTRY;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *e = table + i * GC_GET_ENTRY;
        if (e[0] == GC_ST_OK) {
            uint64_t length = gc_get64(e + 1);
            if (length == 0 || length > max_value) return GCACHE_MISS_PROTOCOL;
            total += length;
        } else if (e[0] != GC_ST_NOT_FOUND && e[0] != GC_ST_NO_SPACE) {
            return GCACHE_MISS_PROTOCOL;
        }
    }
    return total == payload_len ? 0 : GCACHE_MISS_PROTOCOL;
}

int gc_tcp_batch_get(gc_link *l, const gc_key *keys, void *const *outs, const size_t *out_lens,
                     size_t n, uint64_t max_value, int64_t *answers)
{
    gc_conn *c = &l->conn;
    size_t klen;
    uint8_t *payload = gc_encode_keys(keys, n, &klen);
    uint8_t *table = malloc(n * GC_GET_ENTRY);
    if (!payload || !table) {
        free(payload);
        free(table);
        return GCACHE_ERR_NO_MEMORY;
    }
    gc_header h = {.op = GC_BATCH_GET, .count = (uint16_t)n}, reply;
    /* the most a truthful reply can hold: the table and n values of max_value each */
    uint64_t limit = max_value > (UINT64_MAX - n * GC_GET_ENTRY) / (n ? n : 1)
                         ? UINT64_MAX : n * GC_GET_ENTRY + n * max_value;
    gc_conn_expect(c, klen);
    int rc = gc_request(c, &h, NULL, 0, payload, klen);
    if (!rc) rc = gc_reply(c, &h, limit, &reply);
    if (!rc && reply.status != GC_ST_OK) rc = gc_failure_miss(reply.status);
    if (!rc && reply.payload_len < n * GC_GET_ENTRY) rc = GCACHE_MISS_PROTOCOL;
    if (!rc) rc = gc_conn_recv(c, table, n * GC_GET_ENTRY, NULL);
    if (!rc) rc = check_table(table, n, max_value, reply.payload_len);
    if (!rc) gc_conn_expect(c, reply.payload_len);
    for (size_t i = 0; !rc && i < n; i++) {
        const uint8_t *e = table + i * GC_GET_ENTRY;
        uint64_t length = gc_get64(e + 1);
        if (e[0] != GC_ST_OK) {
            answers[i] = gc_status_miss(e[0]);
        } else if (length > out_lens[i]) {
            answers[i] = GCACHE_ERR_TOO_SMALL;
            rc = drain(c, length);
        } else {
            XXH3_state_t st;
            XXH3_64bits_reset(&st);
            rc = gc_conn_recv(c, outs[i], (size_t)length, &st);
            answers[i] = XXH3_64bits_digest(&st) == gc_get64(e + 9) ? (int64_t)length
                                                                     : GCACHE_MISS_CHECKSUM;
        }
    }
    free(payload);
    free(table);
    return rc;
}

int gc_tcp_batch_put(gc_link *l, const gc_key *keys, const void *const *values,
                     const size_t *lens, size_t n, uint64_t group, unsigned flags, int *answers)
{
    gc_conn *c = &l->conn;
    size_t keys_len = 0;
    uint64_t values_len = 0;
    for (size_t i = 0; i < n; i++) {
        keys_len += keys[i].len;
        values_len += lens[i];
    }
    uint8_t *table = malloc(n * GC_PUT_ENTRY + keys_len), statuses[GC_BATCH_MAX];
    struct iovec *iov = malloc((n + 3) * sizeof *iov);
    if (!table || !iov) {
        free(table);
        free(iov);
        return GCACHE_ERR_NO_MEMORY;
    }
    uint8_t *k = table + n * GC_PUT_ENTRY;
    for (size_t i = 0; i < n; i++) {
        uint8_t *e = table + i * GC_PUT_ENTRY;
        gc_put16(e, (uint16_t)keys[i].len);
        gc_put64(e + 2, lens[i]);
        gc_put64(e + 10, XXH3_64bits(values[i], lens[i]));
        memcpy(k, keys[i].data, keys[i].len);
        k += keys[i].len;
    }
    gc_header h = {.op = GC_BATCH_PUT, .count = (uint16_t)n, .group = group, .flags = (uint8_t)flags};
    uint8_t raw[GC_HEADER_SIZE];
    h.request_id = ++c->next_id;
    h.payload_len = n * GC_PUT_ENTRY + keys_len + values_len;
    gc_pack_header(&h, raw);
    iov[0] = (struct iovec){raw, sizeof raw};
    iov[1] = (struct iovec){table, n * GC_PUT_ENTRY + keys_len};
    for (size_t i = 0; i < n; i++) iov[2 + i] = (struct iovec){(void *)values[i], lens[i]};
    gc_conn_expect(c, h.payload_len);
    gc_header reply;
    int rc = gc_conn_sendv(c, iov, (int)n + 2);
    if (!rc) rc = gc_reply(c, &h, n, &reply);
    if (!rc && reply.status != GC_ST_OK) rc = gc_failure_miss(reply.status);
    if (!rc && reply.payload_len != n) rc = GCACHE_MISS_PROTOCOL;
    if (!rc) rc = gc_conn_recv(c, statuses, n, NULL);
    for (size_t i = 0; !rc && i < n; i++) {
        if (statuses[i] != GC_ST_OK && statuses[i] != GC_ST_NO_SPACE &&
            statuses[i] != GC_ST_CHECKSUM_MISMATCH)
            rc = GCACHE_MISS_PROTOCOL;
        else answers[i] = statuses[i] == GC_ST_OK ? GCACHE_OK : gc_status_miss(statuses[i]);
    }
    free(table);
    free(iov);
    return rc;
}
