/* The opening exchange of every connection (docs/protocol.md, "Connecting and
 * authenticating"): HELLO, AUTH when the server asks for it, the server's facts, and on the
 * Unix socket the arena's descriptor. Also this host's id, which tells a same-host server. */
#ifndef GC_HELLO_H
#define GC_HELLO_H

#include <stddef.h>
#include <stdint.h>

#include "conn.h"

#define GC_MAX_HELLO (1u << 20)   /* a HELLO reply's payload at most */

/* The facts a client acts on; the others are informational and not kept. */
typedef struct gc_facts {
    char host_id[72];
    char unix_socket[108];        /* "" when the server has none */
    char arena_id[72];
    uint64_t arena_bytes;
    uint64_t lease_ttl_ms;        /* 5000 when not given */
    int has_arena;                /* arena_id and arena_bytes were both given */
    int parents;                  /* "parents": true */
} gc_facts;

/* HELLO (and AUTH with token when asked). With want_fd, *fd receives the descriptor sent
 * with the facts (-1 when none). Returns 0, GCACHE_MISS_AUTH (a token wanted and none given,
 * or refused), GCACHE_MISS_PROTOCOL (facts that are not a JSON object of the right types) or
 * the connection's miss. */
int gc_hello(gc_conn *c, const char *token, int want_fd, gc_facts *facts, int *fd);

/* The facts in a HELLO payload; GCACHE_MISS_PROTOCOL naming the wrong fact in *why. */
int gc_parse_facts(const char *json, size_t len, gc_facts *facts, const char **why);

/* This host's id as servers compute it (docs/protocol.md, "Same host"): 16 hex digits. */
void gc_host_id(char out[17]);

#endif
