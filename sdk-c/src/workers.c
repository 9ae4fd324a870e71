/* One queue, one lock. Completions broadcast "done" to the waiters; a waiter on an IO thread
 * also wakes for new work and runs it (see workers.h for why). */
#include "workers.h"

#include <stdlib.h>

struct gc_workers {
    pthread_mutex_t lock;
    pthread_cond_t work;          /* a job was queued, or stop */
    pthread_cond_t done;          /* a counted job finished, or a job was queued (helpers) */
    gc_job *head, *tail;
    int stop;
    int helpers;                  /* IO threads waiting inside a job */
    unsigned n_threads;
    pthread_t *threads;
};

static _Thread_local gc_workers *on_thread;   /* the pool this IO thread belongs to */

static gc_job *pop(gc_workers *w)
{
    gc_job *job = w->head;
    if (job) {
        w->head = job->next;
        if (!w->head) w->tail = NULL;
    }
    return job;
}

/* Run job with the lock released; count it done. Called and returns with the lock held. */
static void run_locked(gc_workers *w, gc_job *job)
{
    gc_wait *wait = job->wait;    /* the job may be freed by its own run */
    pthread_mutex_unlock(&w->lock);
    job->run(job);
    pthread_mutex_lock(&w->lock);
    if (wait) {
        wait->pending--;
        pthread_cond_broadcast(&w->done);
    }
}

static void *thread_main(void *arg)
{
    gc_workers *w = arg;
    on_thread = w;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        gc_job *job = pop(w);
        if (job) {
            run_locked(w, job);
            continue;
        }
        if (w->stop) break;
        pthread_cond_wait(&w->work, &w->lock);
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

gc_workers *gc_workers_new(unsigned threads)
{
    gc_workers *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->threads = calloc(threads, sizeof *w->threads);
    if (!w->threads) {
        free(w);
        return NULL;
    }
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    pthread_cond_init(&w->done, NULL);
    for (unsigned i = 0; i < threads; i++) {
        if (pthread_create(&w->threads[i], NULL, thread_main, w)) break;
        w->n_threads++;
    }
    if (!w->n_threads) {
        gc_workers_free(w);
        return NULL;
    }
    return w;
}

void gc_workers_free(gc_workers *w)
{
    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
    for (unsigned i = 0; i < w->n_threads; i++) pthread_join(w->threads[i], NULL);
    pthread_cond_destroy(&w->work);
    pthread_cond_destroy(&w->done);
    pthread_mutex_destroy(&w->lock);
    free(w->threads);
    free(w);
}

void gc_submit(gc_workers *w, gc_job *job)
{
    job->next = NULL;
    pthread_mutex_lock(&w->lock);
    if (job->wait) job->wait->pending++;
    if (w->tail) w->tail->next = job;
    else w->head = job;
    w->tail = job;
    pthread_cond_signal(&w->work);
    if (w->helpers) pthread_cond_broadcast(&w->done);
    pthread_mutex_unlock(&w->lock);
}

void gc_wait_for(gc_workers *w, gc_wait *wait)
{
    int helping = on_thread == w;
    pthread_mutex_lock(&w->lock);
    while (wait->pending > 0) {
        gc_job *job = helping ? pop(w) : NULL;
        if (job) {
            run_locked(w, job);
            continue;
        }
        w->helpers += helping;
        pthread_cond_wait(&w->done, &w->lock);
        w->helpers -= helping;
    }
    pthread_mutex_unlock(&w->lock);
}
