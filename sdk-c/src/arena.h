/* A same-host server's arena, mapped from the descriptor its HELLO passed on the Unix socket
 * (docs/protocol.md, "Connecting and authenticating"). Shared by every link to that server
 * and freed when the last one lets go (a restarted server presents a new arena; links on the
 * old one finish with it). Every extent a server names is checked to lie inside it. */
#ifndef GC_ARENA_H
#define GC_ARENA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

typedef struct gc_arena {
    uint8_t *base;
    uint64_t size;
    char arena_id[72];
    double lease_window_s;        /* half the server's lease TTL (see shm_ops.c) */
    atomic_int refs;
} gc_arena;

/* Maps fd (always closed here) read-write and shared, populated up front. 0, or
 * GCACHE_MISS_PROTOCOL when the descriptor holds less than size bytes (mapping past a file's
 * end would make a read a SIGBUS, not an error), GCACHE_MISS_CONNECTION_LOST when mmap fails. */
int gc_arena_map(int fd, uint64_t size, const char *arena_id, uint64_t lease_ttl_ms,
                 gc_arena **out);
void gc_arena_ref(gc_arena *arena);
void gc_arena_unref(gc_arena *arena);

/* Whether [offset, offset + length) lies inside the arena. */
int gc_arena_holds(const gc_arena *arena, uint64_t offset, uint64_t length);

#endif
