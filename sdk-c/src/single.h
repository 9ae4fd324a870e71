/* Single-key operations as jobs: the synchronous calls, the asynchronous ones and a batch's
 * retries all run one of these on an IO thread. */
#ifndef GC_SINGLE_H
#define GC_SINGLE_H

#include "client.h"
#include "ops.h"

enum gc_kind { GC_KIND_PUT, GC_KIND_GET, GC_KIND_EXISTS, GC_KIND_DELETE };

typedef struct gc_single {
    gc_job job;
    gcache *client;
    enum gc_kind kind;
    gc_key key;
    uint64_t group;               /* placement hash; 0: by itself */
    const void *value;            /* put */
    void *out;                    /* get */
    size_t len;                   /* the value's or out's size */
    unsigned flags;               /* put */
    int64_t result;
} gc_single;

/* The operation itself, in the calling thread (the job's body). */
int64_t gc_run_single(gc_single *op);
/* A gc_single's job body: gc_run_single into op->result. */
void gc_single_job(gc_job *job);
/* Submit op and wait for it (the synchronous calls). */
int64_t gc_call_single(gc_single *op);

/* A batch (batch.c), run from the calling thread, which only plans and waits: the number of
 * items that succeeded, or GCACHE_ERR_NO_MEMORY. Arguments are checked already. */
int64_t gc_run_batch(gcache *c, gcache_item *items, size_t count, enum gc_kind kind,
                     unsigned flags);
/* Argument checks shared by every entry point: GCACHE_OK or GCACHE_ERR_INVALID. */
int gc_check_key(const void *key, size_t len);
int gc_check_group(const gcache_group *group, uint64_t *hash);
int gc_check_items(gcache *c, const gcache_item *items, size_t count, enum gc_kind kind,
                   unsigned flags);

#endif
