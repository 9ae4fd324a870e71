/* The client's copy of the cluster map, kept current from the masters (docs/protocol.md,
 * "Cluster map from the masters"). A thread asks GetClusterMap(since_epoch) every
 * map_refresh_s (jittered); an unchanged map costs a few bytes. A new map rebuilds the ring
 * over every server the map knows, keyed by server id and weighted by capacity, with the alive
 * and suspect ones owning keys, under the map's placement parameters (the client's own when
 * the map sends none). A map older than the one held is never applied (a lagging member).
 * When no master answers, keys keep their places on the cached map: a master outage never
 * stalls IO. Masters are tried in turn, starting with the last that answered. */
#include "master.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grpc.h"

#define FIRST_FETCH_S 5.0         /* open waits this long for a first map */
#define MAX_MASTERS 16
#define MAX_SERVERS 4096
#define PATH "/gcache.master.Master/GetClusterMap"

enum { ALIVE = 1, SUSPECT = 2 };

struct gc_master {
    gcache *client;
    char addresses[MAX_MASTERS][264];
    size_t n, preferred;
    uint64_t epoch;
    int have_map;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stop, fetched;            /* fetched: a master answered at least once */
};

/* ---- protobuf (proto3 wire format): just the ClusterMap ---- */

typedef struct reader {
    const uint8_t *p, *end;
    int bad;
} reader;

static uint64_t varint(reader *r)
{
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->p >= r->end) break;
        uint8_t b = *r->p++;
        v |= (uint64_t)(b & 0x7F) << shift;
        if (!(b & 0x80)) return v;
    }
    r->bad = 1;
    return 0;
}

/* The next field's number and wire type; 0 at the end. */
static unsigned next_field(reader *r, unsigned *type)
{
    if (r->p >= r->end || r->bad) return 0;
    uint64_t tag = varint(r);
    *type = (unsigned)(tag & 7);
    return (unsigned)(tag >> 3);
}

static reader sub(reader *r)
{
    uint64_t len = varint(r);
    reader s = {r->p, r->p, 1};
    if (r->bad || len > (uint64_t)(r->end - r->p)) {
        r->bad = 1;
        return s;
    }
    s.end = r->p + len;
    s.bad = 0;
    r->p += len;
    return s;
}

static void skip(reader *r, unsigned type)
{
    if (type == 0) varint(r);
    else if (type == 2) sub(r);
    else if ((type == 1 || type == 5) && r->end - r->p >= (type == 1 ? 8 : 4)) r->p += type == 1 ? 8 : 4;
    else r->bad = 1;
}

static void copy_text(reader *r, char *out, size_t size)
{
    reader s = sub(r);
    size_t n = (size_t)(s.end - s.p);
    if (s.bad || n >= size || memchr(s.p, 0, n)) {
        r->bad = 1;
        return;
    }
    memcpy(out, s.p, n);
    out[n] = 0;
}

static void parse_server(reader *r, server_entry *e)
{
    unsigned f, t;
    while ((f = next_field(r, &t))) {
        if (f == 1 && t == 2) copy_text(r, e->id, sizeof e->id);
        else if (f == 2 && t == 2) copy_text(r, e->address, sizeof e->address);
        else if (f == 4 && t == 0) e->capacity = varint(r);
        else if (f == 5 && t == 0) e->state = (unsigned)varint(r);
        else skip(r, t);
    }
}

int gc_map_decode(const uint8_t *data, size_t len, cluster_map *m)
{
    reader r = {data, data + len, 0};
    unsigned f, t;
    size_t cap = 0;
    memset(m, 0, sizeof *m);
    while ((f = next_field(&r, &t))) {
        if (f == 1 && t == 0) m->epoch = varint(&r);
        else if (f == 2 && t == 0) m->changed = varint(&r) != 0;
        else if (f == 3 && t == 2 && m->n < MAX_SERVERS) {
            if (m->n == cap) {            /* grown as servers arrive, never to a declared size */
                cap = cap ? 2 * cap : 16;
                server_entry *grown = realloc(m->servers, cap * sizeof *grown);
                if (!grown) return GCACHE_ERR_NO_MEMORY;
                m->servers = grown;
            }
            memset(&m->servers[m->n], 0, sizeof *m->servers);
            reader s = sub(&r);
            parse_server(&s, &m->servers[m->n++]);
            r.bad |= s.bad;
        } else if (f == 4 && t == 2) {
            reader s = sub(&r);
            unsigned g, u;
            while ((g = next_field(&s, &u))) {
                if (g == 1 && u == 0) m->vnodes = (unsigned)varint(&s);
                else if (g == 2 && u == 0) m->group_width = (unsigned)varint(&s);
                else skip(&s, u);
            }
            r.bad |= s.bad;
        } else skip(&r, t);
    }
    return r.bad ? GCACHE_MISS_PROTOCOL : 0;
}

/* ---- the follower ---- */

/* The map as a ring; NULL when it cannot place (a server of zero capacity, as the reference's
 * ring refuses; or out of memory): the caller keeps the map it has. */
static gc_ring *ring_of(gcache *c, const cluster_map *m)
{
    gc_member *members = calloc(m->n ? m->n : 1, sizeof *members);
    if (!members) return NULL;
    size_t n = 0;
    pthread_mutex_lock(&c->lock);
    for (size_t i = 0; i < m->n; i++) {
        const server_entry *e = &m->servers[i];
        gc_server *s = gc_server_of(c, e->address);
        if (!s || !e->capacity) {
            n = 0;
            break;
        }
        members[n++] = (gc_member){.id = e->id, .weight = (double)e->capacity,
                                   .live = e->state == ALIVE || e->state == SUSPECT, .user = s};
    }
    pthread_mutex_unlock(&c->lock);
    unsigned vnodes = m->vnodes && m->group_width ? m->vnodes : c->opt.vnodes;
    unsigned width = m->vnodes && m->group_width ? m->group_width : c->opt.group_width;
    gc_ring *ring = n == m->n ? gc_ring_new(members, n, vnodes, width) : NULL;
    free(members);
    return ring;
}

/* One GetClusterMap, master after master. 0 when one answered. */
static int refresh(gc_master *g)
{
    gcache *c = g->client;
    uint8_t request[11], *reply = NULL;
    size_t request_len = 0, reply_len;
    if (g->epoch) {                      /* field 1 (since_epoch), a varint */
        uint64_t v = g->epoch;
        request[request_len++] = 0x08;
        while (v >= 0x80) {
            request[request_len++] = (uint8_t)(v | 0x80);
            v >>= 7;
        }
        request[request_len++] = (uint8_t)v;
    }
    int rc = GCACHE_MISS_UNREACHABLE;
    for (size_t k = 0; k < g->n && rc; k++) {
        size_t i = (g->preferred + k) % g->n;
        rc = gc_grpc_call(g->addresses[i], PATH, c->token ? "gcache-token" : NULL, c->token,
                          request, request_len, c->opt.timeout_s > 2.0 ? c->opt.timeout_s : 2.0,
                          &reply, &reply_len);
        if (!rc) g->preferred = i;
    }
    if (rc) {
        gc_log(c, "map.refresh_failed epoch=%llu reason=%s", (unsigned long long)g->epoch,
               gcache_strerror(rc));
        return rc;
    }
    cluster_map m;
    rc = gc_map_decode(reply, reply_len, &m);
    free(reply);
    if (!rc && m.changed && m.epoch >= g->epoch) {   /* never back to an older map */
        gc_ring *ring = ring_of(c, &m);
        if (ring) {
            gc_place(c, ring, m.epoch);
            g->epoch = m.epoch;
            g->have_map = 1;
            gc_log(c, "map.updated epoch=%llu servers=%zu", (unsigned long long)m.epoch, m.n);
        }
    }
    free(m.servers);
    return rc;
}

static void *follow(void *arg)
{
    gc_master *g = arg;
    unsigned seed = (unsigned)(uintptr_t)g;
    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        pthread_mutex_unlock(&g->lock);
        int rc = refresh(g);
        pthread_mutex_lock(&g->lock);
        if (!rc && !g->fetched) {
            g->fetched = 1;
            pthread_cond_broadcast(&g->wake);
        }
        /* jittered +-20%, so many clients do not ask at once */
        double wait_s = g->client->opt.map_refresh_s * (0.8 + 0.4 * (double)(rand_r(&seed) % 1000) / 1000.0);
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        long long ns = until.tv_nsec + (long long)(wait_s * 1e9);
        until.tv_sec += (time_t)(ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        if (!g->stop) pthread_cond_timedwait(&g->wake, &g->lock, &until);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

int gc_master_start(gcache *c, const char *masters, char *error, size_t error_len)
{
    gc_master *g = calloc(1, sizeof *g);
    char *copy = strdup(masters), *save = NULL;
    if (!g || !copy) {
        free(g);
        free(copy);
        return GCACHE_ERR_NO_MEMORY;
    }
    int rc = 0;
    for (char *a = strtok_r(copy, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(a, ':');
        if (!colon || colon == a || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
            strlen(a) >= sizeof g->addresses[0] || g->n == MAX_MASTERS) {
            snprintf(error, error_len, "master '%s' must be HOST:PORT (at most %d of them)", a,
                     MAX_MASTERS);
            rc = GCACHE_ERR_INVALID;
        } else {
            strcpy(g->addresses[g->n++], a);
        }
    }
    free(copy);
    if (rc) {
        free(g);
        return rc;
    }
    g->client = c;
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->wake, NULL);
    if (pthread_create(&g->thread, NULL, follow, g)) {
        pthread_mutex_destroy(&g->lock);
        pthread_cond_destroy(&g->wake);
        free(g);
        return GCACHE_ERR_NO_MEMORY;
    }
    c->master = g;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)FIRST_FETCH_S;
    pthread_mutex_lock(&g->lock);
    while (!g->fetched && pthread_cond_timedwait(&g->wake, &g->lock, &until) == 0) {
    }
    int fetched = g->fetched;
    pthread_mutex_unlock(&g->lock);
    if (!fetched) gc_log(c, "map.none_yet masters=%s: every request misses until one answers", masters);
    return GCACHE_OK;
}

void gc_master_stop(gc_master *g)
{
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_broadcast(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->thread, NULL);
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}
