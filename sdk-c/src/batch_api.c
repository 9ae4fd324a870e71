/* The public batch calls: every item checked before any IO (a bad one is GCACHE_ERR_INVALID
 * for the whole call, nothing sent), then gc_run_batch from the calling thread. */
#include "single.h"

int gc_check_items(gcache *c, const gcache_item *items, size_t count, enum gc_kind kind,
                   unsigned flags)
{
    uint64_t g;
    if (!c || (count && !items) || (flags & ~(unsigned)(GCACHE_CONTENT_ADDRESSED | GCACHE_PINNED)))
        return GCACHE_ERR_INVALID;
    for (size_t i = 0; i < count; i++) {
        const gcache_item *it = &items[i];
        if (gc_check_key(it->key, it->key_len) || gc_check_group(it->group, &g))
            return GCACHE_ERR_INVALID;
        if (kind == GC_KIND_PUT && (!it->buf || it->len < 1 || it->len > c->opt.max_value_size))
            return GCACHE_ERR_INVALID;
        if (kind == GC_KIND_GET && !it->buf && it->len) return GCACHE_ERR_INVALID;
    }
    return GCACHE_OK;
}

static int64_t call(gcache *c, gcache_item *items, size_t count, enum gc_kind kind, unsigned flags)
{
    int rc = gc_check_items(c, items, count, kind, flags);
    return rc ? rc : gc_run_batch(c, items, count, kind, flags);
}

int64_t gcache_batch_put(gcache *c, gcache_item *items, size_t count, unsigned flags)
{
    return call(c, items, count, GC_KIND_PUT, flags);
}

int64_t gcache_batch_get_into(gcache *c, gcache_item *items, size_t count)
{
    return call(c, items, count, GC_KIND_GET, 0);
}

int64_t gcache_batch_exists(gcache *c, gcache_item *items, size_t count)
{
    return call(c, items, count, GC_KIND_EXISTS, 0);
}
