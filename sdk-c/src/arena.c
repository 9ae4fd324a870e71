/* Arena mappings. MAP_POPULATE: no page fault lands on a read later. */
#include "arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gcache.h"

int gc_arena_map(int fd, uint64_t size, const char *arena_id, uint64_t lease_ttl_ms,
                 gc_arena **out)
{
    struct stat st;
    if (fstat(fd, &st) || (uint64_t)st.st_size < size || size == 0 || size > SIZE_MAX) {
        close(fd);
        return GCACHE_MISS_PROTOCOL;
    }
    gc_arena *a = calloc(1, sizeof *a);
    if (!a) {
        close(fd);
        return GCACHE_ERR_NO_MEMORY;
    }
    void *base = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        free(a);
        return GCACHE_MISS_CONNECTION_LOST;
    }
    a->base = base;
    a->size = size;
    snprintf(a->arena_id, sizeof a->arena_id, "%s", arena_id);
    a->lease_window_s = (double)lease_ttl_ms / 1000.0 / 2.0;
    atomic_init(&a->refs, 1);
    *out = a;
    return 0;
}

void gc_arena_ref(gc_arena *a) { atomic_fetch_add(&a->refs, 1); }

void gc_arena_unref(gc_arena *a)
{
    if (a && atomic_fetch_sub(&a->refs, 1) == 1) {
        munmap(a->base, (size_t)a->size);
        free(a);
    }
}

int gc_arena_holds(const gc_arena *a, uint64_t offset, uint64_t length)
{
    return offset <= a->size && length <= a->size - offset;
}
