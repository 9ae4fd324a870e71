/* The client's internals shared by its modules: the server records (one per address ever
 * placed on, kept until close), the links to them, the ring, the IO threads and counters. */
#ifndef GC_CLIENT_H
#define GC_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "arena.h"
#include "conn.h"
#include "gcache.h"
#include "ring.h"
#include "workers.h"

enum gc_route { GC_ROUTE_UNKNOWN = 0, GC_ROUTE_TCP, GC_ROUTE_SHM };

typedef struct gc_server gc_server;

/* One connection to a server, past its handshake, and how values move on it. */
typedef struct gc_link {
    gc_conn conn;
    gc_server *server;
    gc_arena *arena;              /* shm: values through this mapping (a reference); else NULL */
    struct gc_link *next;         /* in the server's idle list */
} gc_link;

struct gc_server {
    char address[264];            /* HOST:PORT of its data plane */
    pthread_mutex_t lock;         /* everything below */
    gc_link *idle;
    unsigned n_idle;
    double suspect_until;         /* gc_now() instant; requests miss at once before it */
    enum gc_route route;          /* decided at first contact, forgotten on failure */
    char unix_path[108];
    gc_arena *arena;              /* the current mapping of its arena (shm) */
    int takes_parents;
    enum gc_route logged;         /* the route last logged, so each is logged once */
    gc_server *next;              /* in the client's registry */
};

typedef struct gc_master gc_master;

struct gcache {
    gcache_options opt;
    char *token;
    char host_id[17];
    pthread_mutex_t lock;         /* servers and ring */
    gc_server *servers;
    gc_ring *ring;                /* members' user pointers are gc_server records */
    uint64_t epoch;
    gc_workers *workers;
    gc_master *master;
    atomic_uint_fast64_t requests, hits, hit_bytes, stored, stored_bytes, misses;
    atomic_uint_fast64_t by_reason[-GCACHE_MISS_LAST + 1];
};

/* The record of address, made on first use; NULL when out of memory. Caller holds c->lock. */
gc_server *gc_server_of(gcache *c, const char *address);

/* Pool (pool.c): a link to server, idle or new. GCACHE_MISS_SUSPECT while it is suspect. */
int gc_acquire(gcache *c, gc_server *s, gc_link **link);
void gc_release(gcache *c, gc_link *link);
/* A failed exchange: the link (may be NULL) is closed, the server suspect for suspect_s, its
 * idle links dropped and its route forgotten; n_keys misses of reason are counted. */
void gc_fail(gcache *c, gc_server *s, gc_link *link, int reason, size_t n_keys);
void gc_link_close(gc_link *link);
void gc_server_drop(gc_server *s);        /* at close: idle links and the arena */

/* Routes (route.c): a new link to s over the route for it, discovered at first contact. */
int gc_connect(gcache *c, gc_server *s, gc_link **link);

/* Counters and the log. */
void gc_count_miss(gcache *c, int reason, size_t n);
void gc_log(gcache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Placement under the current ring: the owner of key, or NULL (no server). */
gc_server *gc_owner_locked(gcache *c, const void *key, size_t key_len, uint64_t group_hash);
void gc_place(gcache *c, gc_ring *ring, uint64_t epoch);   /* takes ring */

#endif
