/* Batches: one request per server (and, for puts, per placement group: a put request carries
 * one group), at most GC_BATCH_MAX keys each, servers in parallel on the IO threads. Over
 * shared memory each request then runs its copies as jobs of their own, so two IO threads move
 * two values at once, and ends on the link it held throughout (a server drops what a
 * connection leased or allocated when that connection closes): RELEASE for reads, COMMIT for
 * writes. Puts go PUT_CHUNK keys at a time, so the first ALLOCs' write windows cannot pass
 * while thousands more are allocated. Afterwards a read the server answered NO_SPACE (on its
 * disk, no room in memory) is asked once more on its own, now that the batch's leases, often
 * what pinned the memory, are released; a copy whose write window passed is put again. */
#include <stdlib.h>
#include <string.h>

#include "frame.h"

#define PUT_CHUNK 256
#define LATE 1                    /* a copy refused for its passed window: put it again */

#include "batch.h"

typedef struct copy {
    gc_job job;
    gc_link *link;
    gc_extent extent;
    gcache_item *item;
    int verify;
    pthread_mutex_t *notice_lock; /* writes: the link's in-place notices, one at a time */
    int64_t result;
    uint64_t digest;
} copy;

static void retry_later(batch *b, size_t i)
{
    pthread_mutex_lock(&b->lock);
    b->again[b->n_again++] = i;
    pthread_mutex_unlock(&b->lock);
}

/* An item's answer as its result, counted as the single call counts it. */
static void settle(batch *b, size_t i, int64_t answer)
{
    gcache *c = b->c;
    gcache_item *it = &b->items[i];
    it->result = answer;
    if (b->kind == GC_KIND_PUT && answer == GCACHE_OK) {
        atomic_fetch_add(&c->stored, 1);
        atomic_fetch_add(&c->stored_bytes, it->len);
    } else if (b->kind == GC_KIND_GET && answer >= 0) {
        atomic_fetch_add(&c->hits, 1);
        atomic_fetch_add(&c->hit_bytes, (uint64_t)answer);
    } else if (GCACHE_IS_MISS(answer)) {
        gc_count_miss(c, (int)answer, 1);
    }
}

/* Items of r not settled yet get the link's failure (counted once, in gc_fail's count). */
static size_t unsettled(request *r)
{
    size_t n = 0;
    for (size_t k = 0; k < r->n; k++) n += r->b->items[r->idx[k]].result == GCACHE_PENDING;
    return n;
}

static void fail_rest(request *r, int rc)
{
    for (size_t k = 0; k < r->n; k++)
        if (r->b->items[r->idx[k]].result == GCACHE_PENDING) r->b->items[r->idx[k]].result = rc;
}

static void run_copy(gc_job *job)
{
    copy *cp = (copy *)job;
    if (cp->notice_lock) {
        int rc = gc_copy_in(cp->link, &cp->extent, cp->item->buf, cp->notice_lock, &cp->digest);
        cp->result = rc == GCACHE_MISS_TIMEOUT ? LATE : rc;
    } else {
        cp->result = gc_copy_out(cp->link, &cp->extent, cp->item->buf, cp->verify);
    }
}

/* Run the copies (n of them) on the IO threads and wait. */
static void run_copies(gcache *c, copy *copies, size_t n)
{
    gc_wait wait = {0};
    for (size_t k = 0; k < n; k++) {
        copies[k].job.run = run_copy;
        copies[k].job.wait = &wait;
        gc_submit(c->workers, &copies[k].job);
    }
    gc_wait_for(c->workers, &wait);
}

static int shm_reads(request *r, gc_link *l, const gc_key *keys)
{
    batch *b = r->b;
    gc_extent *extents = calloc(r->n, sizeof *extents);
    int64_t *answers = calloc(r->n, sizeof *answers);
    copy *copies = calloc(r->n, sizeof *copies);
    uint64_t *handles = calloc(r->n, sizeof *handles);
    int rc = extents && answers && copies && handles ? 0 : GCACHE_ERR_NO_MEMORY;
    if (!rc) rc = gc_lease_many(l, keys, r->n, b->c->opt.max_value_size, extents, answers);
    size_t n_copies = 0, n_handles = 0;
    for (size_t k = 0; !rc && k < r->n; k++) {
        gcache_item *it = &b->items[r->idx[k]];
        if (answers[k]) continue;
        handles[n_handles++] = extents[k].handle;
        if (extents[k].length > it->len) {
            answers[k] = GCACHE_ERR_TOO_SMALL;
            continue;
        }
        copies[n_copies++] = (copy){.link = l, .extent = extents[k], .item = it,
                                    .verify = b->c->opt.verify_arena_reads};
        answers[k] = 1;            /* settled from its copy */
    }
    if (rc) goto out;                /* nothing leased: the caller fails every key */
    run_copies(b->c, copies, n_copies);
    rc = gc_release_many(l, handles, n_handles);
    for (size_t k = 0, j = 0; k < r->n; k++) {
        size_t i = r->idx[k];
        if (answers[k] == GCACHE_MISS_NO_SPACE) {
            retry_later(b, i);
        } else if (answers[k] == 1) {
            int64_t got = copies[j++].result;
            if (got == GCACHE_MISS_CONNECTION_LOST) {
                /* the server went during the copy; its route is asked again next time */
                pthread_mutex_lock(&r->server->lock);
                r->server->route = GC_ROUTE_UNKNOWN;
                pthread_mutex_unlock(&r->server->lock);
            }
            settle(b, i, got);
        } else {
            settle(b, i, answers[k]);
        }
    }
out:
    free(extents);
    free(answers);
    free(copies);
    free(handles);
    return rc;
}

static int shm_writes(request *r, gc_link *l, const gc_key *keys, const size_t *lens)
{
    batch *b = r->b;
    gc_extent *extents = calloc(r->n, sizeof *extents);
    int *answers = calloc(r->n, sizeof *answers), *committed = calloc(r->n, sizeof *committed);
    copy *copies = calloc(r->n, sizeof *copies);
    uint64_t *handles = calloc(r->n, sizeof *handles), *digests = calloc(r->n, sizeof *digests);
    pthread_mutex_t notice_lock = PTHREAD_MUTEX_INITIALIZER;
    int rc = extents && answers && committed && copies && handles && digests ? 0
                                                                             : GCACHE_ERR_NO_MEMORY;
    if (!rc) rc = gc_alloc_many(l, keys, lens, r->n, r->group, b->flags, extents, answers);
    size_t n_copies = 0;
    for (size_t k = 0; !rc && k < r->n; k++)
        if (!answers[k])
            copies[n_copies++] = (copy){.link = l, .extent = extents[k],
                                        .item = &b->items[r->idx[k]], .notice_lock = &notice_lock};
    if (!rc) run_copies(b->c, copies, n_copies);
    size_t n_commits = 0;
    for (size_t k = 0; !rc && k < n_copies; k++) {
        if (copies[k].result < 0) rc = (int)copies[k].result;   /* a notice found the link gone */
        else if (copies[k].result == 0) {
            handles[n_commits] = copies[k].extent.handle;
            digests[n_commits++] = copies[k].digest;
        }
    }
    if (!rc) rc = gc_commit_many(l, handles, digests, n_commits, committed);
    for (size_t k = 0, j = 0, m = 0; !rc && k < r->n; k++) {
        size_t i = r->idx[k];
        if (answers[k]) settle(b, i, answers[k]);
        else if (copies[j++].result == LATE) retry_later(b, i);   /* its extent lapses unused */
        else settle(b, i, committed[m++]);
    }
    pthread_mutex_destroy(&notice_lock);
    free(extents);
    free(answers);
    free(committed);
    free(copies);
    free(handles);
    free(digests);
    return rc;
}

static int tcp_exchange(request *r, gc_link *l, const gc_key *keys)
{
    batch *b = r->b;
    void **bufs = calloc(r->n, sizeof *bufs);
    size_t *lens = calloc(r->n, sizeof *lens);
    int64_t *answers = calloc(r->n, sizeof *answers);
    int *put_answers = calloc(r->n, sizeof *put_answers);
    uint8_t *present = calloc(r->n, 1);
    int rc = bufs && lens && answers && put_answers && present ? 0 : GCACHE_ERR_NO_MEMORY;
    for (size_t k = 0; !rc && k < r->n; k++) {
        bufs[k] = b->items[r->idx[k]].buf;
        lens[k] = b->items[r->idx[k]].len;
    }
    if (rc) {
    } else if (b->kind == GC_KIND_EXISTS) {
        rc = gc_exists(l, keys, r->n, present);
        for (size_t k = 0; !rc && k < r->n; k++) settle(b, r->idx[k], present[k]);
    } else if (b->kind == GC_KIND_PUT) {
        rc = l->arena ? shm_writes(r, l, keys, lens)
                      : gc_tcp_batch_put(l, keys, (const void *const *)bufs, lens, r->n, r->group,
                                         b->flags, put_answers);
        for (size_t k = 0; !rc && !l->arena && k < r->n; k++) settle(b, r->idx[k], put_answers[k]);
    } else if (l->arena) {
        rc = shm_reads(r, l, keys);
    } else {
        rc = gc_tcp_batch_get(l, keys, bufs, lens, r->n, b->c->opt.max_value_size, answers);
        for (size_t k = 0; !rc && k < r->n; k++) {
            if (answers[k] == GCACHE_MISS_NO_SPACE) retry_later(b, r->idx[k]);
            else settle(b, r->idx[k], answers[k]);
        }
    }
    free(bufs);
    free(lens);
    free(answers);
    free(put_answers);
    free(present);
    return rc;
}

static void run_request(gc_job *job)
{
    request *r = (request *)job;
    gcache *c = r->b->c;
    atomic_fetch_add(&c->requests, r->n);
    gc_link *l = NULL;
    int rc = r->server ? gc_acquire(c, r->server, &l) : GCACHE_MISS_NO_SERVER;
    gc_key *keys = rc ? NULL : malloc(r->n * sizeof *keys);
    if (!rc && !keys) rc = GCACHE_ERR_NO_MEMORY;
    for (size_t k = 0; !rc && k < r->n; k++)
        keys[k] = (gc_key){r->b->items[r->idx[k]].key, r->b->items[r->idx[k]].key_len};
    if (!rc) rc = tcp_exchange(r, l, keys);
    free(keys);
    if (!rc) {
        gc_release(c, l);
        return;
    }
    size_t n = unsettled(r);
    if (l && GCACHE_IS_MISS(rc)) gc_fail(c, r->server, l, rc, n);
    else if (rc == GCACHE_MISS_NO_SERVER || rc == GCACHE_MISS_SUSPECT) gc_count_miss(c, rc, n);
    else if (GCACHE_IS_MISS(rc)) gc_fail(c, r->server, NULL, rc, n);
    else gc_link_close(l);
    fail_rest(r, rc);
}

/* Each item retried on its own (NO_SPACE reads, late puts), in parallel. */
static void run_again(batch *b)
{
    if (!b->n_again) return;
    gc_single *ops = calloc(b->n_again, sizeof *ops);
    if (!ops) {
        for (size_t k = 0; k < b->n_again; k++) settle(b, b->again[k], GCACHE_MISS_NO_SPACE);
        return;
    }
    gc_wait wait = {0};
    for (size_t k = 0; k < b->n_again; k++) {
        gcache_item *it = &b->items[b->again[k]];
        ops[k] = (gc_single){.client = b->c, .kind = b->kind, .key = {it->key, it->key_len},
                             .group = b->groups[b->again[k]], .value = it->buf, .out = it->buf,
                             .len = it->len, .flags = b->flags};
        ops[k].job.run = gc_single_job;
        ops[k].job.wait = &wait;
        gc_submit(b->c->workers, &ops[k].job);
    }
    gc_wait_for(b->c->workers, &wait);
    for (size_t k = 0; k < b->n_again; k++) b->items[b->again[k]].result = ops[k].result;
    free(ops);
}

int64_t gc_run_batch(gcache *c, gcache_item *items, size_t count, enum gc_kind kind,
                     unsigned flags)
{
    batch b = {.c = c, .items = items, .kind = kind, .flags = flags};
    b.groups = malloc((count ? count : 1) * sizeof *b.groups);
    b.again = malloc((count ? count : 1) * sizeof *b.again);
    if (!b.groups || !b.again) {
        free(b.groups);
        free(b.again);
        return GCACHE_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&b.lock, NULL);
    for (size_t i = 0; i < count; i++) {
        gc_check_group(items[i].group, &b.groups[i]);
        items[i].result = GCACHE_PENDING;
    }
    size_t chunk = kind == GC_KIND_PUT ? PUT_CHUNK : count;
    int64_t rc = 0;
    for (size_t from = 0; from < count && !rc; from += chunk) {
        size_t to = count - from < chunk ? count : from + chunk;
        int failed;
        request *head = gc_plan(&b, from, to, &failed);
        if (failed) {
            rc = GCACHE_ERR_NO_MEMORY;
            break;
        }
        gc_wait wait = {0};
        for (request *r = head; r; r = r->next) {
            r->job.run = run_request;
            r->job.wait = &wait;
            gc_submit(c->workers, &r->job);
        }
        gc_wait_for(c->workers, &wait);
        gc_free_requests(head);
    }
    if (!rc) run_again(&b);
    int64_t ok = 0;
    for (size_t i = 0; i < count && !rc; i++) {
        int64_t r = items[i].result;
        ok += kind == GC_KIND_GET ? r >= 0 : kind == GC_KIND_EXISTS ? r == 1 : r == GCACHE_OK;
    }
    pthread_mutex_destroy(&b.lock);
    free(b.groups);
    free(b.again);
    return rc ? rc : ok;
}
