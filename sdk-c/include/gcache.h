/* libgcache: the C SDK of GCache, a distributed KV-cache.
 *
 * Written from docs/protocol.md and held to the same conformance vectors as the Python SDK
 * (tests/vectors/): the same key lands on the same server from either SDK, and a value put by
 * one is read byte-identical by the other, over TCP and over same-host shared memory.
 *
 * Rules every call follows:
 * - A miss of any cause (absent, evicted, no space, dead server, timeout, checksum mismatch,
 *   wrong token, a lying server) is a negative GCACHE_MISS_* result, never a crash or a hang,
 *   and costs at most about one timeout_s: a server whose IO failed is skipped (a fast
 *   GCACHE_MISS_SUSPECT) for suspect_s afterwards.
 * - Bad arguments are GCACHE_ERR_* results, checked before any IO, except an out buffer too
 *   small for the value (GCACHE_ERR_TOO_SMALL), which is known only after the lookup.
 * - Every IO runs on the library's own IO threads (io_threads of them); a synchronous call
 *   waits for its job. Values move in io_size socket IOs. Every value read over TCP is checked
 *   against its xxh3_64 before the call reports a hit.
 * - Thread-safe: one gcache handle may be used from any number of threads at once.
 */
#ifndef GCACHE_H
#define GCACHE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The library is built with hidden visibility; only what this header declares is exported. */
#define GCACHE_API __attribute__((visibility("default")))

/* Results. >= 0: success (a length, a count, 1/0 for yes/no). The miss reasons carry the
 * Python SDK's names (gcache_strerror), so counters of both SDKs read alike. */
enum {
    GCACHE_OK = 0,
    GCACHE_MISS_ABSENT = -1,          /* the server does not hold the key */
    GCACHE_MISS_NO_SPACE = -2,        /* put: no room; read: on the server's disk, no room now */
    GCACHE_MISS_CHECKSUM = -3,        /* the bytes did not hash to the value's checksum */
    GCACHE_MISS_NO_SERVER = -4,       /* no server is known (empty map) */
    GCACHE_MISS_SUSPECT = -5,         /* the owner failed within the last suspect_s */
    GCACHE_MISS_UNREACHABLE = -6,     /* connect failed, or transport shm to a remote server */
    GCACHE_MISS_TIMEOUT = -7,         /* an IO took longer than timeout_s */
    GCACHE_MISS_CONNECTION_LOST = -8, /* the server closed or reset the connection */
    GCACHE_MISS_PROTOCOL = -9,        /* the server sent something the protocol rules out */
    GCACHE_MISS_AUTH = -10,           /* the server wants a token we lack, or refused ours */
    GCACHE_MISS_SERVER_ERROR = -11,   /* the server answered an error status */
    GCACHE_MISS_LAST = -11,
    GCACHE_ERR_INVALID = -100,        /* a bad argument; nothing was sent */
    GCACHE_ERR_TOO_SMALL = -101,      /* out is smaller than the value */
    GCACHE_ERR_NO_MEMORY = -102,
    GCACHE_PENDING = -200             /* gcache_op_wait: not done within its timeout */
};
#define GCACHE_IS_MISS(result) ((result) <= -1 && (result) >= GCACHE_MISS_LAST)

typedef enum gcache_transport {
    GCACHE_TRANSPORT_AUTO = 0,   /* shm for servers on this host, TCP for the others */
    GCACHE_TRANSPORT_TCP = 1,
    GCACHE_TRANSPORT_SHM = 2     /* a server not on this host is unreachable */
} gcache_transport;

/* Put flags (docs/protocol.md, PUT): */
#define GCACHE_CONTENT_ADDRESSED 0x08u  /* the key names its value (a KV page's hash) */
#define GCACHE_PINNED 0x10u             /* keep in memory until deleted (within the pin budget) */

typedef void (*gcache_log_fn)(void *user, const char *line);

typedef struct gcache_options {
    const char *token;          /* cluster token, a tenant's ("<name>.<secret>"), or NULL */
    double timeout_s;           /* one IO at most this long (0.2) */
    size_t io_size;             /* bytes one socket IO moves at most (1 MiB; 4 KiB..64 MiB) */
    unsigned io_threads;        /* library threads doing all IO (4; 1..256) */
    gcache_transport transport; /* GCACHE_TRANSPORT_AUTO */
    double suspect_s;           /* a failed server is skipped this long (1.0) */
    uint64_t max_value_size;    /* larger values are refused, and never accepted (1 GiB) */
    unsigned vnodes;            /* ring points per server; with masters the map's wins (256) */
    unsigned group_width;       /* servers a group is striped over; the map's wins (2) */
    int verify_arena_reads;     /* also hash values copied out of a mapped arena (0) */
    double map_refresh_s;       /* with masters: seconds between map checks (1.0) */
    gcache_log_fn log;          /* one line per event (route, miss, map); NULL: silent */
    void *log_user;
} gcache_options;

typedef struct gcache gcache;

/* Fills *options with the defaults above. */
GCACHE_API void gcache_options_init(gcache_options *options);

/* Opens a client of static servers ("HOST:PORT,HOST:PORT") or of the servers the masters'
 * cluster map lists (master "HOST:PORT[,HOST:PORT]"); exactly one of the two. options may be
 * NULL (defaults). Returns GCACHE_OK and *client, or GCACHE_ERR_INVALID / _NO_MEMORY with a
 * message naming the bad value in error (if error_len > 0). With masters it waits up to 5 s
 * for a first map; without one every request misses (no_server) until a master answers. */
GCACHE_API int gcache_open(const char *servers, const char *master, const gcache_options *options,
                gcache **client, char *error, size_t error_len);

/* Waits for the IO threads to finish queued work, closes connections and unmaps arenas. */
GCACHE_API void gcache_close(gcache *client);

/* A placement group (docs/protocol.md, "Placement"): keys of one group live on group_width
 * servers. NULL: the key is placed by itself. */
typedef struct gcache_group {
    const void *data;
    size_t len;                 /* 1..1024 */
} gcache_group;

/* Single-key operations. Keys are 1..1024 bytes. */

/* GCACHE_OK when stored, else a miss (GCACHE_MISS_NO_SPACE, ...) or GCACHE_ERR_*. flags:
 * GCACHE_CONTENT_ADDRESSED | GCACHE_PINNED. */
GCACHE_API int gcache_put(gcache *client, const void *key, size_t key_len, const void *value,
               size_t value_len, const gcache_group *group, unsigned flags);

/* Reads the value into out; its length (>= 1), a miss, or GCACHE_ERR_TOO_SMALL. */
GCACHE_API int64_t gcache_get_into(gcache *client, const void *key, size_t key_len, void *out,
                        size_t out_len, const gcache_group *group);

/* 1 present, 0 absent, or a miss of another cause. */
GCACHE_API int gcache_exists(gcache *client, const void *key, size_t key_len, const gcache_group *group);

/* 1 deleted, 0 was absent, or a miss of another cause. */
GCACHE_API int gcache_delete(gcache *client, const void *key, size_t key_len, const gcache_group *group);

/* Batches: one request per server, servers in parallel on the IO threads; over shared memory
 * the copies run on the IO threads in parallel too. Each item's result is what the single
 * call would return. The call returns how many items succeeded (stored, read, present), or a
 * GCACHE_ERR_* (bad argument: nothing done, no result set) . */
typedef struct gcache_item {
    const void *key;
    size_t key_len;
    void *buf;                  /* put: the value (only read); get_into: the out buffer */
    size_t len;                 /* put: the value's length; get_into: out's size */
    const gcache_group *group;  /* this key's group, or NULL */
    int64_t result;             /* set by the call */
} gcache_item;

GCACHE_API int64_t gcache_batch_put(gcache *client, gcache_item *items, size_t count, unsigned flags);
GCACHE_API int64_t gcache_batch_get_into(gcache *client, gcache_item *items, size_t count);
GCACHE_API int64_t gcache_batch_exists(gcache *client, gcache_item *items, size_t count);

/* Asynchronous forms: the operation runs on an IO thread. Its completion is told three ways,
 * use any: the callback (on the IO thread; may be NULL), gcache_op_fd (readable once done,
 * for poll/epoll), gcache_op_wait. Keys and groups are copied; values, out buffers and items
 * must stay valid until the operation is done. A bad argument completes the operation at once
 * with GCACHE_ERR_INVALID (the callback then runs in the calling thread). NULL only when out
 * of memory. Every op must be freed with gcache_op_free, done or not. */
typedef struct gcache_op gcache_op;
typedef void (*gcache_callback)(void *user, int64_t result);

GCACHE_API gcache_op *gcache_put_async(gcache *client, const void *key, size_t key_len, const void *value,
                            size_t value_len, const gcache_group *group, unsigned flags,
                            gcache_callback callback, void *user);
GCACHE_API gcache_op *gcache_get_into_async(gcache *client, const void *key, size_t key_len, void *out,
                                 size_t out_len, const gcache_group *group,
                                 gcache_callback callback, void *user);
GCACHE_API gcache_op *gcache_exists_async(gcache *client, const void *key, size_t key_len,
                               const gcache_group *group, gcache_callback callback, void *user);
GCACHE_API gcache_op *gcache_delete_async(gcache *client, const void *key, size_t key_len,
                               const gcache_group *group, gcache_callback callback, void *user);
GCACHE_API gcache_op *gcache_batch_put_async(gcache *client, gcache_item *items, size_t count,
                                  unsigned flags, gcache_callback callback, void *user);
GCACHE_API gcache_op *gcache_batch_get_into_async(gcache *client, gcache_item *items, size_t count,
                                       gcache_callback callback, void *user);

/* A descriptor that becomes readable when the operation is done (do not read or close it). */
GCACHE_API int gcache_op_fd(gcache_op *op);
/* 1 when done, else 0. */
GCACHE_API int gcache_op_done(gcache_op *op);
/* The result, waiting at most timeout_s (< 0: as long as it takes); GCACHE_PENDING if not
 * done by then. */
GCACHE_API int64_t gcache_op_wait(gcache_op *op, double timeout_s);
/* Frees op; one still running is freed when it ends (its callback still runs). */
GCACHE_API void gcache_op_free(gcache_op *op);

/* Counters of this client. */
typedef struct gcache_stats {
    uint64_t requests;          /* keys asked for or put */
    uint64_t hits, hit_bytes;   /* reads that found their value */
    uint64_t stored, stored_bytes;
    uint64_t misses;            /* every miss, of any reason */
    uint64_t misses_by_reason[-GCACHE_MISS_LAST + 1];  /* index: -GCACHE_MISS_* */
} gcache_stats;
GCACHE_API void gcache_get_stats(gcache *client, gcache_stats *stats);

/* The reason's name ("absent", "timeout", ...; the Python SDK's) or the error's. */
GCACHE_API const char *gcache_strerror(int64_t result);

/* The HOST:PORT that key (placed by group) goes to under the current map, copied into
 * address; GCACHE_OK, GCACHE_MISS_NO_SERVER or GCACHE_ERR_INVALID. */
GCACHE_API int gcache_owner(gcache *client, const void *key, size_t key_len, const gcache_group *group,
                 char *address, size_t address_len);

/* "tcp" or "shm" for a server this client has reached; NULL before the first contact. */
GCACHE_API const char *gcache_transport_of(gcache *client, const char *address);

#ifdef __cplusplus
}
#endif
#endif
