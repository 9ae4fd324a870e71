/* The IO threads: every operation, synchronous or not, runs as a job on them; a synchronous
 * call submits its job and waits. A job that waits for jobs of its own (a batch waiting for
 * its per-server requests, a request for its copies) runs queued jobs meanwhile, so a batch
 * on one IO thread never deadlocks waiting for threads that are all waiting too. */
#ifndef GC_WORKERS_H
#define GC_WORKERS_H

#include <pthread.h>

typedef struct gc_wait gc_wait;
typedef struct gc_job gc_job;

struct gc_job {
    void (*run)(gc_job *job);
    gc_wait *wait;                /* counted down when the job has run; may be NULL */
    gc_job *next;
};

/* A count of jobs still to run; gc_wait_for returns when it is zero. */
struct gc_wait {
    int pending;
};

typedef struct gc_workers gc_workers;

gc_workers *gc_workers_new(unsigned threads);
/* Runs every queued job, then ends the threads. */
void gc_workers_free(gc_workers *w);

/* Queue job (counted in job->wait, if any). The job's memory must live until it has run. */
void gc_submit(gc_workers *w, gc_job *job);
/* Wait for every job counted in wait; on an IO thread, run queued jobs meanwhile. */
void gc_wait_for(gc_workers *w, gc_wait *wait);

#endif
