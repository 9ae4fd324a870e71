/* One key's operation on its owner: acquire a link, run the exchange of the link's route,
 * give the link back; a failed exchange is the one rule of gc_fail (link closed, server
 * suspect, misses counted). Hits, stores and answered misses are counted here. */
#include "single.h"

#include "frame.h"

int gc_check_key(const void *key, size_t len)
{
    return key && len >= 1 && len <= GC_MAX_KEY ? GCACHE_OK : GCACHE_ERR_INVALID;
}

int gc_check_group(const gcache_group *group, uint64_t *hash)
{
    *hash = 0;
    if (!group) return GCACHE_OK;
    if (gc_check_key(group->data, group->len)) return GCACHE_ERR_INVALID;
    *hash = gc_key_hash(group->data, group->len);
    return GCACHE_OK;
}

/* The answer of a finished exchange as the call's result, counted. */
static int64_t settle(gcache *c, enum gc_kind kind, int64_t answer, size_t len)
{
    if (kind == GC_KIND_PUT && answer == GCACHE_OK) {
        atomic_fetch_add(&c->stored, 1);
        atomic_fetch_add(&c->stored_bytes, len);
    } else if (kind == GC_KIND_GET && answer >= 0) {
        atomic_fetch_add(&c->hits, 1);
        atomic_fetch_add(&c->hit_bytes, (uint64_t)answer);
    } else if (GCACHE_IS_MISS(answer)) {
        gc_count_miss(c, (int)answer, 1);
    }
    return answer;
}

static int exchange(gc_single *op, gc_link *l, int64_t *answer)
{
    gcache *c = op->client;
    int put_answer = 0, rc;
    uint8_t present = 0;
    switch (op->kind) {
    case GC_KIND_PUT:
        rc = l->arena ? gc_shm_put(l, op->key, op->value, op->len, op->group, op->flags, &put_answer)
                      : gc_tcp_put(l, op->key, op->value, op->len, op->group, op->flags, &put_answer);
        *answer = put_answer;
        return rc;
    case GC_KIND_GET:
        return l->arena ? gc_shm_get(l, op->key, op->out, op->len, c->opt.max_value_size,
                                     c->opt.verify_arena_reads, answer)
                        : gc_tcp_get(l, op->key, op->out, op->len, c->opt.max_value_size, answer);
    case GC_KIND_EXISTS:
        rc = gc_exists(l, &op->key, 1, &present);
        *answer = present;
        return rc;
    case GC_KIND_DELETE:
        rc = gc_delete(l, op->key, &put_answer);
        *answer = put_answer;
        return rc;
    }
    return GCACHE_ERR_INVALID;
}

int64_t gc_run_single(gc_single *op)
{
    gcache *c = op->client;
    atomic_fetch_add(&c->requests, 1);
    pthread_mutex_lock(&c->lock);
    gc_server *s = gc_owner_locked(c, op->key.data, op->key.len, op->group);
    pthread_mutex_unlock(&c->lock);
    if (!s) {
        gc_count_miss(c, GCACHE_MISS_NO_SERVER, 1);
        return GCACHE_MISS_NO_SERVER;
    }
    gc_link *l;
    int rc = gc_acquire(c, s, &l);
    if (rc == GCACHE_MISS_SUSPECT) gc_count_miss(c, rc, 1);
    else if (GCACHE_IS_MISS(rc)) gc_fail(c, s, NULL, rc, 1);
    if (rc) return rc;
    int64_t answer = 0;
    rc = exchange(op, l, &answer);
    if (!rc) {
        gc_release(c, l);
        return settle(c, op->kind, answer, op->len);
    }
    if (GCACHE_IS_MISS(rc)) gc_fail(c, s, l, rc, 1);
    else gc_link_close(l);          /* mid-reply for want of room in out: not the server's fault */
    return rc;
}

void gc_single_job(gc_job *job)
{
    gc_single *op = (gc_single *)job;
    op->result = gc_run_single(op);
}

int64_t gc_call_single(gc_single *op)
{
    gc_wait wait = {0};
    op->job.run = gc_single_job;
    op->job.wait = &wait;
    gc_submit(op->client->workers, &op->job);
    gc_wait_for(op->client->workers, &wait);
    return op->result;
}
