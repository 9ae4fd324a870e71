/* A batch's pieces shared by its two modules: batch.c runs the requests, batch_plan.c groups
 * the items into them (one request per server, and for puts per group, at most GC_BATCH_MAX
 * keys each). */
#ifndef GC_BATCH_H
#define GC_BATCH_H

#include "single.h"

typedef struct batch batch;

/* One request: the items idx[0..n) of the batch, all going to server (and, for puts, all of
 * one group). */
typedef struct request {
    gc_job job;
    batch *b;
    gc_server *server;            /* NULL: no server owns these keys */
    uint64_t group;               /* puts: every key's group */
    size_t n, cap, *idx;
    struct request *next;
} request;

/* A batch call in progress. */
struct batch {
    gcache *c;
    gcache_item *items;
    enum gc_kind kind;
    unsigned flags;
    uint64_t *groups;             /* each item's placement hash */
    pthread_mutex_t lock;         /* again */
    size_t n_again, *again;       /* retried one by one at the end */
};

/* Items [from, to) grouped into requests (a list); NULL with *failed set when out of memory. */
request *gc_plan(batch *b, size_t from, size_t to, int *failed);
void gc_free_requests(request *r);

#endif
