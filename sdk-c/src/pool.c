/* Links reused across requests, and which servers are suspect. A server whose IO failed is
 * suspect for suspect_s: its requests miss at once, with no connect attempt, so a dead server
 * costs the caller one timeout, not one per request; after that window one request probes it
 * again. Idle links are kept up to io_threads + 1 per server; a failed link is closed, never
 * returned. */
#include <stdlib.h>
#include <string.h>

#include "client.h"

gc_server *gc_server_of(gcache *c, const char *address)
{
    for (gc_server *s = c->servers; s; s = s->next)
        if (!strcmp(s->address, address)) return s;
    gc_server *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    strncpy(s->address, address, sizeof s->address - 1);
    pthread_mutex_init(&s->lock, NULL);
    s->next = c->servers;
    c->servers = s;
    return s;
}

void gc_link_close(gc_link *link)
{
    if (!link) return;
    gc_conn_close(&link->conn);
    gc_arena_unref(link->arena);
    free(link);
}

int gc_acquire(gcache *c, gc_server *s, gc_link **link)
{
    for (;;) {
        pthread_mutex_lock(&s->lock);
        if (s->suspect_until > gc_now()) {
            pthread_mutex_unlock(&s->lock);
            return GCACHE_MISS_SUSPECT;
        }
        gc_link *idle = s->idle;
        if (idle) {
            s->idle = idle->next;
            s->n_idle--;
        }
        pthread_mutex_unlock(&s->lock);
        if (!idle) return gc_connect(c, s, link);
        idle->next = NULL;
        /* an idle link has nothing to read: bytes or the end there mean the server closed it
         * (a restart, its idle limit), and a request on it would be a needless miss */
        if (!gc_conn_readable(&idle->conn)) {
            *link = idle;
            return 0;
        }
        gc_link_close(idle);
    }
}

void gc_release(gcache *c, gc_link *link)
{
    gc_server *s = link->server;
    link->conn.deadline = 0;
    pthread_mutex_lock(&s->lock);
    /* a link on an arena the server has since replaced is not kept */
    int keep = s->n_idle < c->opt.io_threads + 1 && (!link->arena || link->arena == s->arena);
    if (keep) {
        link->next = s->idle;
        s->idle = link;
        s->n_idle++;
    }
    pthread_mutex_unlock(&s->lock);
    if (!keep) gc_link_close(link);
}

void gc_fail(gcache *c, gc_server *s, gc_link *link, int reason, size_t n_keys)
{
    gc_link_close(link);
    pthread_mutex_lock(&s->lock);
    s->suspect_until = gc_now() + c->opt.suspect_s;
    gc_link *stale = s->idle;
    s->idle = NULL;
    s->n_idle = 0;
    s->route = GC_ROUTE_UNKNOWN;   /* a server that comes back is asked again */
    pthread_mutex_unlock(&s->lock);
    while (stale) {
        gc_link *next = stale->next;
        gc_link_close(stale);
        stale = next;
    }
    gc_count_miss(c, reason, n_keys);
    gc_log(c, "sdk.miss server=%s reason=%s keys=%zu", s->address, gcache_strerror(reason), n_keys);
}

void gc_server_drop(gc_server *s)
{
    while (s->idle) {
        gc_link *next = s->idle->next;
        gc_link_close(s->idle);
        s->idle = next;
    }
    gc_arena_unref(s->arena);
    s->arena = NULL;
    pthread_mutex_destroy(&s->lock);
}
