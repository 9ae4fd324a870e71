/* The public client: options, open and close, placement, the single-key calls, counters. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "hello.h"
#include "master.h"
#include "single.h"

void gcache_options_init(gcache_options *o)
{
    memset(o, 0, sizeof *o);
    o->timeout_s = 0.2;
    o->io_size = 1u << 20;
    o->io_threads = 4;
    o->transport = GCACHE_TRANSPORT_AUTO;
    o->suspect_s = 1.0;
    o->max_value_size = 1ull << 30;
    o->vnodes = 256;
    o->group_width = 2;
    o->map_refresh_s = 1.0;
}

static int invalid(char *error, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int invalid(char *error, size_t len, const char *fmt, ...)
{
    if (error && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(error, len, fmt, ap);
        va_end(ap);
    }
    return GCACHE_ERR_INVALID;
}

/* Each option's rule, as ClientConfig's (a message names the value and the rule). */
static int check_options(const gcache_options *o, char *error, size_t len)
{
    if (!(o->timeout_s > 0))
        return invalid(error, len, "timeout_s is %g; must be positive", o->timeout_s);
    if (o->io_size < 4096 || o->io_size > (64u << 20))
        return invalid(error, len, "io_size is %zu; must be between 4KiB and 64MiB", o->io_size);
    if (o->io_threads < 1 || o->io_threads > 256)
        return invalid(error, len, "io_threads is %u; must be between 1 and 256", o->io_threads);
    if (o->transport > GCACHE_TRANSPORT_SHM)
        return invalid(error, len, "transport is %d; must be auto, tcp or shm", (int)o->transport);
    if (!(o->suspect_s >= 0))
        return invalid(error, len, "suspect_s is %g; must not be negative", o->suspect_s);
    if (o->max_value_size < 1)
        return invalid(error, len, "max_value_size is 0; must be positive");
    if (o->vnodes < 1 || o->vnodes > 4096)
        return invalid(error, len, "vnodes is %u; must be between 1 and 4096", o->vnodes);
    if (o->group_width < 1 || o->group_width > 65535)
        return invalid(error, len, "group_width is %u; must be between 1 and 65535", o->group_width);
    if (!(o->map_refresh_s > 0))
        return invalid(error, len, "map_refresh_s is %g; must be positive", o->map_refresh_s);
    return GCACHE_OK;
}

/* "HOST:PORT,HOST:PORT" as a ring over those addresses, each of weight 1. */
static int static_servers(gcache *c, const char *servers, char *error, size_t len)
{
    gc_member members[256];
    size_t n = 0;
    char *copy = strdup(servers), *save = NULL;
    if (!copy) return GCACHE_ERR_NO_MEMORY;
    int rc = GCACHE_OK;
    for (char *a = strtok_r(copy, ",", &save); a && !rc; a = strtok_r(NULL, ",", &save)) {
        const char *colon = strrchr(a, ':');
        if (!colon || colon == a || !colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1) ||
            strlen(a) >= sizeof c->servers->address)
            rc = invalid(error, len, "server '%s' must be HOST:PORT", a);
        for (size_t i = 0; !rc && i < n; i++)
            if (!strcmp(members[i].id, a)) rc = invalid(error, len, "server '%s' is given twice", a);
        if (!rc && n == sizeof members / sizeof *members)
            rc = invalid(error, len, "more than %zu servers", n);
        if (rc) break;
        gc_server *s = gc_server_of(c, a);
        if (!s) {
            rc = GCACHE_ERR_NO_MEMORY;
            break;
        }
        members[n++] = (gc_member){.id = s->address, .weight = 1.0, .live = 1, .user = s};
    }
    if (!rc && !n) rc = invalid(error, len, "servers is empty; give HOST:PORT[,HOST:PORT...]");
    if (!rc) {
        gc_ring *ring = gc_ring_new(members, n, c->opt.vnodes, c->opt.group_width);
        if (ring) gc_place(c, ring, 0);
        else rc = GCACHE_ERR_NO_MEMORY;
    }
    free(copy);
    return rc;
}

int gcache_open(const char *servers, const char *master, const gcache_options *options,
                gcache **client, char *error, size_t error_len)
{
    gcache_options defaults;
    gcache_options_init(&defaults);
    const gcache_options *o = options ? options : &defaults;
    if (error && error_len) error[0] = 0;
    if (client) *client = NULL;
    if (!client || (servers && *servers) == (master && *master))
        return invalid(error, error_len, "give either servers \"HOST:PORT,...\" or master "
                       "\"HOST:PORT,...\", not both or neither");
    int rc = check_options(o, error, error_len);
    if (rc) return rc;
    gcache *c = calloc(1, sizeof *c);
    if (!c) return GCACHE_ERR_NO_MEMORY;
    c->opt = *o;
    c->opt.token = NULL;
    if (o->token && !(c->token = strdup(o->token))) {
        free(c);
        return GCACHE_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&c->lock, NULL);
    gc_host_id(c->host_id);
    c->workers = gc_workers_new(o->io_threads);
    if (!c->workers) rc = GCACHE_ERR_NO_MEMORY;
    else if (servers && *servers) rc = static_servers(c, servers, error, error_len);
    else rc = gc_master_start(c, master, error, error_len);
    if (rc) {
        gcache_close(c);
        return rc;
    }
    *client = c;
    return GCACHE_OK;
}

void gcache_close(gcache *c)
{
    if (!c) return;
    if (c->master) gc_master_stop(c->master);
    if (c->workers) gc_workers_free(c->workers);   /* queued work runs first */
    gc_ring_free(c->ring);
    while (c->servers) {
        gc_server *next = c->servers->next;
        gc_server_drop(c->servers);
        free(c->servers);
        c->servers = next;
    }
    pthread_mutex_destroy(&c->lock);
    free(c->token);
    free(c);
}

void gc_place(gcache *c, gc_ring *ring, uint64_t epoch)
{
    pthread_mutex_lock(&c->lock);
    gc_ring *old = c->ring;
    c->ring = ring;
    c->epoch = epoch;
    pthread_mutex_unlock(&c->lock);
    gc_ring_free(old);
}

gc_server *gc_owner_locked(gcache *c, const void *key, size_t key_len, uint64_t group_hash)
{
    if (!c->ring) return NULL;
    uint32_t m = gc_ring_owner(c->ring, key, key_len, group_hash);
    return m == GC_NO_OWNER ? NULL : c->ring->members[m].user;
}

void gc_count_miss(gcache *c, int reason, size_t n)
{
    if (!GCACHE_IS_MISS(reason) || !n) return;
    atomic_fetch_add(&c->misses, n);
    atomic_fetch_add(&c->by_reason[-reason], n);
}

void gc_log(gcache *c, const char *fmt, ...)
{
    if (!c->opt.log) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    c->opt.log(c->opt.log_user, line);
}

const char *gcache_strerror(int64_t r)
{
    static const char *const misses[] = {"ok", "absent", "no_space", "checksum", "no_server",
                                         "suspect", "unreachable", "timeout", "connection_lost",
                                         "protocol", "auth", "server_error"};
    if (r >= 0) return "ok";
    if (r >= GCACHE_MISS_LAST) return misses[-r];
    switch (r) {
    case GCACHE_ERR_INVALID: return "invalid argument";
    case GCACHE_ERR_TOO_SMALL: return "out is smaller than the value";
    case GCACHE_ERR_NO_MEMORY: return "out of memory";
    case GCACHE_PENDING: return "pending";
    default: return "unknown";
    }
}

void gcache_get_stats(gcache *c, gcache_stats *s)
{
    memset(s, 0, sizeof *s);
    s->requests = atomic_load(&c->requests);
    s->hits = atomic_load(&c->hits);
    s->hit_bytes = atomic_load(&c->hit_bytes);
    s->stored = atomic_load(&c->stored);
    s->stored_bytes = atomic_load(&c->stored_bytes);
    s->misses = atomic_load(&c->misses);
    for (int i = 0; i <= -GCACHE_MISS_LAST; i++) s->misses_by_reason[i] = atomic_load(&c->by_reason[i]);
}

int gcache_owner(gcache *c, const void *key, size_t key_len, const gcache_group *group,
                 char *address, size_t address_len)
{
    uint64_t g;
    if (gc_check_key(key, key_len) || gc_check_group(group, &g) || !address || !address_len)
        return GCACHE_ERR_INVALID;
    pthread_mutex_lock(&c->lock);
    gc_server *s = gc_owner_locked(c, key, key_len, g);
    if (s) snprintf(address, address_len, "%s", s->address);
    pthread_mutex_unlock(&c->lock);
    return s ? GCACHE_OK : GCACHE_MISS_NO_SERVER;
}

const char *gcache_transport_of(gcache *c, const char *address)
{
    const char *out = NULL;
    pthread_mutex_lock(&c->lock);
    for (gc_server *s = c->servers; s; s = s->next) {
        if (strcmp(s->address, address)) continue;
        pthread_mutex_lock(&s->lock);
        if (c->opt.transport == GCACHE_TRANSPORT_TCP || s->route == GC_ROUTE_TCP) out = "tcp";
        else if (s->route == GC_ROUTE_SHM) out = "shm";
        pthread_mutex_unlock(&s->lock);
    }
    pthread_mutex_unlock(&c->lock);
    return out;
}

/* ---- single-key calls ------------------------------------------------------------------ */

int gcache_put(gcache *c, const void *key, size_t key_len, const void *value, size_t value_len,
               const gcache_group *group, unsigned flags)
{
    gc_single op = {.client = c, .kind = GC_KIND_PUT, .key = {key, key_len}, .value = value,
                    .len = value_len, .flags = flags};
    if (!c || gc_check_key(key, key_len) || gc_check_group(group, &op.group) || !value ||
        value_len < 1 || value_len > c->opt.max_value_size ||
        (flags & ~(unsigned)(GCACHE_CONTENT_ADDRESSED | GCACHE_PINNED)))
        return GCACHE_ERR_INVALID;
    return (int)gc_call_single(&op);
}

int64_t gcache_get_into(gcache *c, const void *key, size_t key_len, void *out, size_t out_len,
                        const gcache_group *group)
{
    gc_single op = {.client = c, .kind = GC_KIND_GET, .key = {key, key_len}, .out = out,
                    .len = out_len};
    if (!c || gc_check_key(key, key_len) || gc_check_group(group, &op.group) || (!out && out_len))
        return GCACHE_ERR_INVALID;
    return gc_call_single(&op);
}

int gcache_exists(gcache *c, const void *key, size_t key_len, const gcache_group *group)
{
    gc_single op = {.client = c, .kind = GC_KIND_EXISTS, .key = {key, key_len}};
    if (!c || gc_check_key(key, key_len) || gc_check_group(group, &op.group))
        return GCACHE_ERR_INVALID;
    return (int)gc_call_single(&op);
}

int gcache_delete(gcache *c, const void *key, size_t key_len, const gcache_group *group)
{
    gc_single op = {.client = c, .kind = GC_KIND_DELETE, .key = {key, key_len}};
    if (!c || gc_check_key(key, key_len) || gc_check_group(group, &op.group))
        return GCACHE_ERR_INVALID;
    return (int)gc_call_single(&op);
}
