/* Asynchronous operations: a gcache_op is a job on the IO threads plus its completion, told
 * three ways: the callback (run first, on the IO thread), an eventfd made readable, and a
 * condition gcache_op_wait waits on. gcache_op_free of a running op only marks it; the IO
 * thread frees it once done, so freeing never races the completion. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "frame.h"
#include "single.h"

struct gcache_op {
    gc_single single;             /* first: the job is the op */
    int batch;                    /* run gc_run_batch over items instead */
    gcache_item *items;
    size_t count;
    gcache_callback callback;
    void *user;
    int efd;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int done, freed;
    int64_t result;
    uint8_t key[GC_MAX_KEY];      /* a copy: the caller's may go once the call returns (of a
                                   * group only its hash is kept) */
};

static void destroy(gcache_op *op)
{
    close(op->efd);
    pthread_cond_destroy(&op->cond);
    pthread_mutex_destroy(&op->lock);
    free(op);
}

static void complete(gcache_op *op, int64_t result)
{
    if (op->callback) op->callback(op->user, result);
    pthread_mutex_lock(&op->lock);
    op->result = result;
    op->done = 1;
    uint64_t one = 1;
    ssize_t wrote = write(op->efd, &one, sizeof one);
    (void)wrote;                  /* an eventfd counter never overflows on one write */
    pthread_cond_broadcast(&op->cond);
    int freed = op->freed;
    pthread_mutex_unlock(&op->lock);
    if (freed) destroy(op);
}

static void run_op(gc_job *job)
{
    gcache_op *op = (gcache_op *)job;
    gc_single *s = &op->single;
    int64_t result = op->batch ? gc_run_batch(s->client, op->items, op->count, s->kind, s->flags)
                               : gc_run_single(s);
    complete(op, result);
}

static gcache_op *make(gcache *c, enum gc_kind kind, gcache_callback callback, void *user)
{
    gcache_op *op = calloc(1, sizeof *op);
    if (!op) return NULL;
    op->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (op->efd < 0) {
        free(op);
        return NULL;
    }
    pthread_mutex_init(&op->lock, NULL);
    pthread_cond_init(&op->cond, NULL);
    op->single.client = c;
    op->single.kind = kind;
    op->callback = callback;
    op->user = user;
    return op;
}

/* Queue op, or complete it at once with error (a bad argument). */
static gcache_op *start(gcache_op *op, int error)
{
    if (!op) return NULL;
    if (error) {
        complete(op, error);
        return op;
    }
    op->single.job.run = run_op;
    op->single.job.wait = NULL;
    gc_submit(op->single.client->workers, &op->single.job);
    return op;
}

/* The op's own copies of key and group, checked. */
static int keep_key(gcache_op *op, const void *key, size_t key_len, const gcache_group *group)
{
    if (gc_check_key(key, key_len) || gc_check_group(group, &op->single.group))
        return GCACHE_ERR_INVALID;
    memcpy(op->key, key, key_len);
    op->single.key = (gc_key){op->key, key_len};
    return GCACHE_OK;
}

gcache_op *gcache_put_async(gcache *c, const void *key, size_t key_len, const void *value,
                            size_t value_len, const gcache_group *group, unsigned flags,
                            gcache_callback callback, void *user)
{
    gcache_op *op = c ? make(c, GC_KIND_PUT, callback, user) : NULL;
    if (!op) return NULL;
    op->single.value = value;
    op->single.len = value_len;
    op->single.flags = flags;
    int bad = keep_key(op, key, key_len, group) || !value || value_len < 1 ||
              value_len > c->opt.max_value_size ||
              (flags & ~(unsigned)(GCACHE_CONTENT_ADDRESSED | GCACHE_PINNED));
    return start(op, bad ? GCACHE_ERR_INVALID : 0);
}

gcache_op *gcache_get_into_async(gcache *c, const void *key, size_t key_len, void *out,
                                 size_t out_len, const gcache_group *group,
                                 gcache_callback callback, void *user)
{
    gcache_op *op = c ? make(c, GC_KIND_GET, callback, user) : NULL;
    if (!op) return NULL;
    op->single.out = out;
    op->single.len = out_len;
    int bad = keep_key(op, key, key_len, group) || (!out && out_len);
    return start(op, bad ? GCACHE_ERR_INVALID : 0);
}

gcache_op *gcache_exists_async(gcache *c, const void *key, size_t key_len,
                               const gcache_group *group, gcache_callback callback, void *user)
{
    gcache_op *op = c ? make(c, GC_KIND_EXISTS, callback, user) : NULL;
    return op ? start(op, keep_key(op, key, key_len, group)) : NULL;
}

gcache_op *gcache_delete_async(gcache *c, const void *key, size_t key_len,
                               const gcache_group *group, gcache_callback callback, void *user)
{
    gcache_op *op = c ? make(c, GC_KIND_DELETE, callback, user) : NULL;
    return op ? start(op, keep_key(op, key, key_len, group)) : NULL;
}

static gcache_op *batch_async(gcache *c, gcache_item *items, size_t count, enum gc_kind kind,
                              unsigned flags, gcache_callback callback, void *user)
{
    gcache_op *op = c ? make(c, kind, callback, user) : NULL;
    if (!op) return NULL;
    op->batch = 1;
    op->items = items;
    op->count = count;
    op->single.flags = flags;
    return start(op, gc_check_items(c, items, count, kind, flags));
}

gcache_op *gcache_batch_put_async(gcache *c, gcache_item *items, size_t count, unsigned flags,
                                  gcache_callback callback, void *user)
{
    return batch_async(c, items, count, GC_KIND_PUT, flags, callback, user);
}

gcache_op *gcache_batch_get_into_async(gcache *c, gcache_item *items, size_t count,
                                       gcache_callback callback, void *user)
{
    return batch_async(c, items, count, GC_KIND_GET, 0, callback, user);
}

int gcache_op_fd(gcache_op *op) { return op->efd; }

int gcache_op_done(gcache_op *op)
{
    pthread_mutex_lock(&op->lock);
    int done = op->done;
    pthread_mutex_unlock(&op->lock);
    return done;
}

int64_t gcache_op_wait(gcache_op *op, double timeout_s)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    if (timeout_s >= 0) {
        long long ns = until.tv_nsec + (long long)((timeout_s - (double)(long long)timeout_s) * 1e9);
        until.tv_sec += (time_t)timeout_s + (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
    }
    pthread_mutex_lock(&op->lock);
    while (!op->done) {
        if (timeout_s < 0) pthread_cond_wait(&op->cond, &op->lock);
        else if (pthread_cond_timedwait(&op->cond, &op->lock, &until) == ETIMEDOUT) break;
    }
    int64_t result = op->done ? op->result : GCACHE_PENDING;
    pthread_mutex_unlock(&op->lock);
    return result;
}

void gcache_op_free(gcache_op *op)
{
    if (!op) return;
    pthread_mutex_lock(&op->lock);
    int done = op->done;
    op->freed = 1;
    pthread_mutex_unlock(&op->lock);
    if (done) destroy(op);
}
