/* How a server is reached: over its Unix socket with its arena mapped when it is on this host
 * (its HELLO host_id equals ours and it has a socket), else over TCP. GCACHE_TRANSPORT_TCP
 * forces TCP; GCACHE_TRANSPORT_SHM makes a server elsewhere unreachable. The route is decided
 * at first contact (a HELLO over TCP), kept until a failure forgets it, and logged once per
 * server and route. The arena is mapped once per server and again only when a restarted server
 * presents a new arena_id. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "hello.h"

static int new_link(gc_server *s, gc_link **out)
{
    gc_link *link = calloc(1, sizeof *link);
    if (!link) return GCACHE_ERR_NO_MEMORY;
    link->server = s;
    link->conn.fd = -1;
    *out = link;
    return 0;
}

static void note_facts(gc_server *s, const gc_facts *facts)
{
    pthread_mutex_lock(&s->lock);
    s->takes_parents = facts->parents;
    pthread_mutex_unlock(&s->lock);
}

static int tcp_link(gcache *c, gc_server *s, gc_link **out, gc_facts *facts)
{
    gc_link *link;
    int rc = new_link(s, &link);
    if (rc) return rc;
    rc = gc_conn_tcp(&link->conn, s->address, c->opt.timeout_s, c->opt.io_size);
    if (!rc) rc = gc_hello(&link->conn, c->token, 0, facts, NULL);
    if (rc) {
        gc_link_close(link);
        return rc;
    }
    note_facts(s, facts);
    *out = link;
    return 0;
}

/* The arena link: HELLO on the Unix socket brings the facts and the arena's descriptor. */
static int shm_link(gcache *c, gc_server *s, const char *path, gc_link **out)
{
    gc_link *link;
    gc_facts facts;
    int fd = -1, rc = new_link(s, &link);
    if (rc) return rc;
    rc = gc_conn_unix(&link->conn, path, c->opt.timeout_s, c->opt.io_size);
    if (!rc) rc = gc_hello(&link->conn, c->token, 1, &facts, &fd);
    if (!rc && (fd < 0 || !facts.has_arena)) rc = GCACHE_MISS_PROTOCOL;
    if (rc) {
        if (fd >= 0) close(fd);
        gc_link_close(link);
        return rc;
    }
    note_facts(s, &facts);
    pthread_mutex_lock(&s->lock);
    gc_arena *known = s->arena;
    if (known && !strcmp(known->arena_id, facts.arena_id)) gc_arena_ref(known);
    else known = NULL;
    pthread_mutex_unlock(&s->lock);
    if (known) {
        close(fd);
        link->arena = known;
    } else {
        gc_arena *fresh;
        rc = gc_arena_map(fd, facts.arena_bytes, facts.arena_id, facts.lease_ttl_ms, &fresh);
        if (rc) {
            gc_link_close(link);
            return rc;
        }
        gc_arena_ref(fresh);                     /* one for the server, one for the link */
        pthread_mutex_lock(&s->lock);
        gc_arena *old = s->arena;
        s->arena = fresh;
        pthread_mutex_unlock(&s->lock);
        gc_arena_unref(old);
        link->arena = fresh;
    }
    *out = link;
    return 0;
}

static void log_route(gcache *c, gc_server *s, enum gc_route route)
{
    pthread_mutex_lock(&s->lock);
    int first = s->logged != route;
    s->logged = route;
    pthread_mutex_unlock(&s->lock);
    if (first) gc_log(c, "sdk.route server=%s transport=%s", s->address,
                      route == GC_ROUTE_SHM ? "shm" : "tcp");
}

/* First contact: HELLO over TCP tells where the server is. */
static int discover(gcache *c, gc_server *s, gc_link **out)
{
    gc_link *link;
    gc_facts facts;
    int rc = tcp_link(c, s, &link, &facts);
    if (rc) return rc;
    int local = !strcmp(facts.host_id, c->host_id) && facts.unix_socket[0];
    if (c->opt.transport == GCACHE_TRANSPORT_SHM && !local) {
        gc_link_close(link);
        return GCACHE_MISS_UNREACHABLE;          /* not on this host, or no Unix socket */
    }
    enum gc_route route = local ? GC_ROUTE_SHM : GC_ROUTE_TCP;
    pthread_mutex_lock(&s->lock);
    s->route = route;
    strcpy(s->unix_path, facts.unix_socket);
    pthread_mutex_unlock(&s->lock);
    log_route(c, s, route);
    if (route == GC_ROUTE_TCP) {
        *out = link;
        return 0;
    }
    gc_link_close(link);
    return shm_link(c, s, facts.unix_socket, out);
}

int gc_connect(gcache *c, gc_server *s, gc_link **out)
{
    gc_facts facts;
    if (c->opt.transport == GCACHE_TRANSPORT_TCP) return tcp_link(c, s, out, &facts);
    pthread_mutex_lock(&s->lock);
    enum gc_route route = s->route;
    char path[sizeof s->unix_path];
    strcpy(path, s->unix_path);
    pthread_mutex_unlock(&s->lock);
    if (route == GC_ROUTE_UNKNOWN) return discover(c, s, out);
    if (route == GC_ROUTE_SHM) return shm_link(c, s, path, out);
    return tcp_link(c, s, out, &facts);
}
