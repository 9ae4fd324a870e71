/* Same-host exchanges: small frames on the Unix socket, the value copied once between the
 * caller's buffer and the server's mapped arena (docs/protocol.md, LEASE / ALLOC).
 *
 * Read: LEASE -> copy out -> RELEASE without a reply. The copy is not hashed again unless
 * verify_arena_reads: the server hashed those bytes at COMMIT and, while the lease holds, they
 * cannot move or change. What stands in for the hash is checking that the lease did hold: the
 * server's end of the connection is still open after the copy (a server that died meanwhile
 * may have restarted on the same arena and reused the extent), and a copy that ended past the
 * lease window (half the lease TTL after the LEASE was sent) is hashed after all.
 *
 * Write: ALLOC, hashing the value while the reply is on its way -> copy in 1 MiB chunks, each
 * 256 KiB piece hashed just before it is copied (still in cache for the copy), announcing each
 * landed chunk with an in-place WRITE (no reply) so the server hashes it meanwhile -> COMMIT,
 * whose answer says whether the server's hash of the arena bytes matched ours. Copying stops
 * once the write window (half the TTL after the ALLOC was sent) has passed: later bytes could
 * land in memory the server has handed to another value. */
#include <stdlib.h>
#include <string.h>

#include "ops.h"
#include "wire.h"

#define HASH_PIECE (256u << 10)
#define COPY_CHUNK (1u << 20)
#define PIPELINE_WINDOW 32        /* requests in flight before a reply is read: unbounded
                                   * pipelining deadlocks once both sockets' buffers fill */

typedef struct ahead {
    XXH3_state_t st;
    size_t hashed;
} ahead;

static void hash_through(ahead *a, const uint8_t *value, size_t end)
{
    while (a->hashed < end) {
        size_t step = end - a->hashed < HASH_PIECE ? end - a->hashed : HASH_PIECE;
        XXH3_64bits_update(&a->st, value + a->hashed, step);
        a->hashed += step;
    }
}

/* An extent the server named: inside the arena, of a length we accept. */
static int check_extent(const gc_link *l, uint64_t offset, uint64_t length, uint64_t max_value)
{
    if (length == 0 || length > max_value || !gc_arena_holds(l->arena, offset, length))
        return GCACHE_MISS_PROTOCOL;
    return 0;
}

int64_t gc_copy_out(gc_link *l, const gc_extent *e, void *out, int verify)
{
    const uint8_t *src = l->arena->base + e->offset;
    uint8_t *dst = out;
    size_t len = (size_t)e->length;
    if (verify) {
        XXH3_state_t st;
        XXH3_64bits_reset(&st);
        for (size_t off = 0; off < len; off += HASH_PIECE) {
            size_t n = len - off < HASH_PIECE ? len - off : HASH_PIECE;
            XXH3_64bits_update(&st, src + off, n);
            memcpy(dst + off, src + off, n);
        }
        return XXH3_64bits_digest(&st) == e->checksum ? (int64_t)len : GCACHE_MISS_CHECKSUM;
    }
    memcpy(dst, src, len);          /* whole: glibc's large-copy path is the fast one */
    if (gc_conn_peer_closed(&l->conn)) return GCACHE_MISS_CONNECTION_LOST;
    if (gc_now() > e->until && XXH3_64bits(dst, len) != e->checksum) return GCACHE_MISS_CHECKSUM;
    return (int64_t)len;
}

static int release_one(gc_conn *c, uint64_t handle)
{
    gc_conn_expect(c, 0);           /* the copy before it may have used the last deadline up */
    gc_header h = {.op = GC_RELEASE, .flags = GC_FLAG_NO_REPLY, .handle = handle};
    return gc_request(c, &h, NULL, 0, NULL, 0);
}

int gc_shm_get(gc_link *l, gc_key key, void *out, size_t out_len, uint64_t max_value,
               int verify, int64_t *answer)
{
    gc_conn *c = &l->conn;
    gc_header h = {.op = GC_LEASE}, reply;
    double until = gc_now() + l->arena->lease_window_s;
    gc_conn_expect(c, key.len);
    int rc = gc_request(c, &h, key.data, key.len, NULL, 0);
    if (!rc) rc = gc_reply(c, &h, 0, &reply);
    if (!rc) rc = gc_answer(GC_LEASE, reply.status);
    if (rc) return rc;
    if (reply.status != GC_ST_OK) {
        *answer = gc_status_miss(reply.status);
        return 0;
    }
    rc = check_extent(l, reply.offset, reply.length, max_value);
    if (rc) return rc;
    gc_extent e = {reply.handle, reply.offset, reply.length, reply.checksum, until};
    if (reply.length > out_len) {
        *answer = GCACHE_ERR_TOO_SMALL;
        return release_one(c, e.handle);
    }
    int64_t got = gc_copy_out(l, &e, out, verify);
    rc = release_one(c, e.handle);
    if (got == GCACHE_MISS_CONNECTION_LOST) return got;
    *answer = got;
    return rc;
}

/* gc_copy_in, finishing a hash begun ahead of the copy (a prefix of the value). */
static int copy_in(gc_link *l, const gc_extent *e, const void *value,
                   pthread_mutex_t *notice_lock, ahead *a, uint64_t *digest)
{
    const uint8_t *v = value;
    uint8_t *dst = l->arena->base + e->offset;
    size_t len = (size_t)e->length;
    int rc = 0;
    for (size_t start = 0; !rc && start < len; start += COPY_CHUNK) {
        if (gc_now() > e->until) return GCACHE_MISS_TIMEOUT;
        size_t end = len - start < COPY_CHUNK ? len : start + COPY_CHUNK;
        if (a->hashed >= end) {
            memcpy(dst + start, v + start, end - start);
        } else {
            for (size_t piece = start; piece < end; piece += HASH_PIECE) {
                size_t stop = end - piece < HASH_PIECE ? end : piece + HASH_PIECE;
                hash_through(a, v, stop);
                memcpy(dst + piece, v + piece, stop - piece);
            }
        }
        gc_header h = {.op = GC_WRITE, .flags = GC_FLAG_IN_PLACE | GC_FLAG_NO_REPLY,
                       .handle = e->handle, .offset = start, .length = end - start};
        if (notice_lock) pthread_mutex_lock(notice_lock);
        gc_conn_expect(&l->conn, 0);
        rc = gc_request(&l->conn, &h, NULL, 0, NULL, 0);
        if (notice_lock) pthread_mutex_unlock(notice_lock);
    }
    hash_through(a, v, len);
    *digest = XXH3_64bits_digest(&a->st);
    return rc;
}

int gc_copy_in(gc_link *l, const gc_extent *e, const void *value, pthread_mutex_t *notice_lock,
               uint64_t *digest)
{
    ahead fresh;
    fresh.hashed = 0;
    XXH3_64bits_reset(&fresh.st);
    return copy_in(l, e, value, notice_lock, &fresh, digest);
}

/* One ALLOC reply: the extent (answer 0), or the put's answer. */
static int allocated(gc_link *l, const gc_header *reply, size_t asked, double until,
                     gc_extent *e, int *answer)
{
    int rc = gc_answer(GC_ALLOC, reply->status);
    if (rc) return rc;
    if (reply->status != GC_ST_OK) {
        *answer = gc_status_miss(reply->status);
        return 0;
    }
    if (reply->length != asked || !gc_arena_holds(l->arena, reply->offset, reply->length))
        return GCACHE_MISS_PROTOCOL;
    *e = (gc_extent){reply->handle, reply->offset, reply->length, 0, until};
    *answer = 0;
    return 0;
}

static int commit_answer(const gc_header *reply, int *answer)
{
    int rc = gc_answer(GC_COMMIT, reply->status);
    if (!rc) *answer = reply->status == GC_ST_OK ? GCACHE_OK : gc_status_miss(reply->status);
    return rc;
}

int gc_shm_put(gc_link *l, gc_key key, const void *value, size_t len, uint64_t group,
               unsigned flags, int *answer)
{
    gc_conn *c = &l->conn;
    ahead a = {.hashed = 0};
    XXH3_64bits_reset(&a.st);
    gc_header h = {.op = GC_ALLOC, .length = len, .group = group, .flags = (uint8_t)flags}, reply;
    double until = gc_now() + l->arena->lease_window_s;
    gc_conn_expect(c, key.len);
    int rc = gc_request(c, &h, key.data, key.len, NULL, 0);
    if (rc) return rc;
    /* the round trip costs no time of its own: hash while the server allocates */
    while (a.hashed < len && !gc_conn_readable(c))
        hash_through(&a, value, len - a.hashed < HASH_PIECE ? len : a.hashed + HASH_PIECE);
    gc_extent e;
    rc = gc_reply(c, &h, 0, &reply);
    if (!rc) rc = allocated(l, &reply, len, until, &e, answer);
    if (rc || *answer) return rc;
    uint64_t digest;
    rc = copy_in(l, &e, value, NULL, &a, &digest);
    if (rc) return rc;
    gc_header commit = {.op = GC_COMMIT, .handle = e.handle, .checksum = digest};
    gc_conn_expect(c, len);         /* the server may hash the whole value before answering */
    rc = gc_request(c, &commit, NULL, 0, NULL, 0);
    if (!rc) rc = gc_reply(c, &commit, 0, &reply);
    if (!rc) rc = commit_answer(&reply, answer);
    return rc;
}

int gc_lease_many(gc_link *l, const gc_key *keys, size_t n, uint64_t max_value,
                  gc_extent *extents, int64_t *answers)
{
    gc_conn *c = &l->conn;
    size_t len;
    uint8_t *payload = gc_encode_keys(keys, n, &len);
    uint8_t *table = malloc(n * GC_LEASE_ENTRY);
    if (!payload || !table) {
        free(payload);
        free(table);
        return GCACHE_ERR_NO_MEMORY;
    }
    gc_header h = {.op = GC_BATCH_LEASE, .count = (uint16_t)n}, reply;
    double until = gc_now() + l->arena->lease_window_s;
    gc_conn_expect(c, len);
    int rc = gc_request(c, &h, NULL, 0, payload, len);
    if (!rc) rc = gc_reply(c, &h, n * GC_LEASE_ENTRY, &reply);
    if (!rc && reply.status != GC_ST_OK) rc = gc_failure_miss(reply.status);
    if (!rc && reply.payload_len != n * GC_LEASE_ENTRY) rc = GCACHE_MISS_PROTOCOL;
    if (!rc) rc = gc_conn_recv(c, table, n * GC_LEASE_ENTRY, NULL);
    for (size_t i = 0; !rc && i < n; i++) {
        const uint8_t *t = table + i * GC_LEASE_ENTRY;
        extents[i] = (gc_extent){gc_get64(t + 1), gc_get64(t + 9), gc_get64(t + 17),
                                 gc_get64(t + 25), until};
        answers[i] = 0;
        if (t[0] == GC_ST_OK) rc = check_extent(l, extents[i].offset, extents[i].length, max_value);
        else if (t[0] == GC_ST_NOT_FOUND || t[0] == GC_ST_NO_SPACE) answers[i] = gc_status_miss(t[0]);
        else rc = GCACHE_MISS_PROTOCOL;
    }
    free(payload);
    free(table);
    return rc;
}

int gc_release_many(gc_link *l, const uint64_t *handles, size_t n)
{
    if (n == 0) return 0;
    if (n == 1) return release_one(&l->conn, handles[0]);
    int rc = 0;
    uint8_t payload[8 * 256];
    gc_conn_expect(&l->conn, 0);
    for (size_t start = 0; !rc && start < n; start += 256) {   /* a bounded payload each */
        size_t m = n - start < 256 ? n - start : 256;
        for (size_t i = 0; i < m; i++) gc_put64(payload + 8 * i, handles[start + i]);
        gc_header h = {.op = GC_RELEASE, .flags = GC_FLAG_NO_REPLY, .count = (uint16_t)m};
        rc = gc_request(&l->conn, &h, NULL, 0, payload, 8 * m);
    }
    return rc;
}

int gc_alloc_many(gc_link *l, const gc_key *keys, const size_t *lens, size_t n, uint64_t group,
                  unsigned flags, gc_extent *extents, int *answers)
{
    gc_conn *c = &l->conn;
    gc_header sent[PIPELINE_WINDOW], reply;
    double until = gc_now() + l->arena->lease_window_s;
    size_t next = 0, done = 0;
    int rc = 0;
    while (!rc && done < n) {
        gc_conn_expect(c, 0);       /* each request and reply within one timeout */
        if (next < n && next - done < PIPELINE_WINDOW) {
            gc_header *h = &sent[next % PIPELINE_WINDOW];
            *h = (gc_header){.op = GC_ALLOC, .length = lens[next], .group = group,
                             .flags = (uint8_t)flags};
            rc = gc_request(c, h, keys[next].data, keys[next].len, NULL, 0);
            next++;
            continue;
        }
        rc = gc_reply(c, &sent[done % PIPELINE_WINDOW], 0, &reply);
        if (!rc) rc = allocated(l, &reply, lens[done], until, &extents[done], &answers[done]);
        done++;
    }
    return rc;
}

int gc_commit_many(gc_link *l, const uint64_t *handles, const uint64_t *digests, size_t n,
                   int *answers)
{
    gc_conn *c = &l->conn;
    gc_header sent[PIPELINE_WINDOW], reply;
    size_t next = 0, done = 0;
    int rc = 0;
    while (!rc && done < n) {
        gc_conn_expect(c, 0);       /* each request and reply within one timeout */
        if (next < n && next - done < PIPELINE_WINDOW) {
            gc_header *h = &sent[next % PIPELINE_WINDOW];
            *h = (gc_header){.op = GC_COMMIT, .handle = handles[next], .checksum = digests[next]};
            rc = gc_request(c, h, NULL, 0, NULL, 0);
            next++;
            continue;
        }
        rc = gc_reply(c, &sent[done % PIPELINE_WINDOW], 0, &reply);
        if (!rc) rc = commit_answer(&reply, &answers[done]);
        done++;
    }
    return rc;
}
