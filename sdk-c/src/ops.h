/* The exchanges on one link (docs/protocol.md, "Operations"). Each returns 0 when the link is
 * back in sync with its answer in an out-parameter, or a miss code when it failed (the caller
 * then closes the link and marks the server suspect). GCACHE_ERR_TOO_SMALL returned (not
 * answered) means the link is mid-reply: close it, but the server did nothing wrong.
 *
 * Answers: a put's is GCACHE_OK, GCACHE_MISS_NO_SPACE or GCACHE_MISS_CHECKSUM; a read's the
 * value's length, GCACHE_MISS_ABSENT, GCACHE_MISS_NO_SPACE, GCACHE_MISS_CHECKSUM or (when
 * answered, over shm, where the link stays in sync) GCACHE_ERR_TOO_SMALL. */
#ifndef GC_OPS_H
#define GC_OPS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "client.h"

typedef struct gc_key {
    const void *data;
    size_t len;
} gc_key;

/* A leased or allocated value in the arena, usable until `until` (gc_now()): half the
 * server's lease TTL after the request was sent, after which the server may hand its memory
 * to another value. */
typedef struct gc_extent {
    uint64_t handle, offset, length, checksum;
    double until;
} gc_extent;

/* tcp_ops.c: values inside the frames. */
int gc_tcp_put(gc_link *l, gc_key key, const void *value, size_t len, uint64_t group,
               unsigned flags, int *answer);
int gc_tcp_get(gc_link *l, gc_key key, void *out, size_t out_len, uint64_t max_value,
               int64_t *answer);
/* BATCH_GET of n keys into outs (out_lens); answers[i] as for a read. */
int gc_tcp_batch_get(gc_link *l, const gc_key *keys, void *const *outs, const size_t *out_lens,
                     size_t n, uint64_t max_value, int64_t *answers);
/* BATCH_PUT of n values of one group; answers[i] as for a put. */
int gc_tcp_batch_put(gc_link *l, const gc_key *keys, const void *const *values,
                     const size_t *lens, size_t n, uint64_t group, unsigned flags, int *answers);

/* Keys as "u16 length + bytes" each (EXISTS, BATCH_GET, BATCH_LEASE payloads); malloc'd. */
uint8_t *gc_encode_keys(const gc_key *keys, size_t n, size_t *len);

/* common.c: the same on either route. present[i] 1/0; *answer 1 deleted, 0 absent. */
int gc_exists(gc_link *l, const gc_key *keys, size_t n, uint8_t *present);
int gc_delete(gc_link *l, gc_key key, int *answer);

/* shm_ops.c: values through the mapped arena. */
int gc_shm_get(gc_link *l, gc_key key, void *out, size_t out_len, uint64_t max_value,
               int verify, int64_t *answer);
int gc_shm_put(gc_link *l, gc_key key, const void *value, size_t len, uint64_t group,
               unsigned flags, int *answer);
/* BATCH_LEASE: extents[i] when answers[i] is 0, else answers[i] is the key's miss. */
int gc_lease_many(gc_link *l, const gc_key *keys, size_t n, uint64_t max_value,
                  gc_extent *extents, int64_t *answers);
/* Lets go of leases, without a reply. */
int gc_release_many(gc_link *l, const uint64_t *handles, size_t n);
/* One leased value into out (out_len >= extent length): its length or GCACHE_MISS_CHECKSUM;
 * GCACHE_MISS_CONNECTION_LOST when the server went during the copy. Thread-safe. */
int64_t gc_copy_out(gc_link *l, const gc_extent *e, void *out, int verify);
/* Pipelined ALLOCs (answers[i] 0 with extents[i], or the put's answer) and COMMITs. */
int gc_alloc_many(gc_link *l, const gc_key *keys, const size_t *lens, size_t n, uint64_t group,
                  unsigned flags, gc_extent *extents, int *answers);
int gc_commit_many(gc_link *l, const uint64_t *handles, const uint64_t *digests, size_t n,
                   int *answers);
/* One value into its allocated extent, announcing each landed piece (in-place WRITE, no
 * reply) under notice_lock; *digest its xxh3_64. GCACHE_MISS_TIMEOUT once the write window
 * has passed. Thread-safe given the lock. */
int gc_copy_in(gc_link *l, const gc_extent *e, const void *value, pthread_mutex_t *notice_lock,
               uint64_t *digest);

#endif
