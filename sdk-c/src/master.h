/* Dynamic membership: the cluster map from the masters (docs/protocol.md, "Cluster map"),
 * fetched at open and refreshed every map_refresh_s by a thread of its own. */
#ifndef GC_MASTER_H
#define GC_MASTER_H

#include <stddef.h>
#include <stdint.h>

#include "client.h"

/* A decoded ClusterMap (gcache/proto/master.proto). */
typedef struct server_entry {
    char id[256], address[264];
    uint64_t capacity;
    unsigned state;
} server_entry;

typedef struct cluster_map {
    uint64_t epoch;
    int changed;
    unsigned vnodes, group_width;
    size_t n;
    server_entry *servers;
} cluster_map;

/* Decodes a ClusterMap message (servers malloc'd; free them): 0 or GCACHE_MISS_PROTOCOL. */
int gc_map_decode(const uint8_t *data, size_t len, cluster_map *m);

/* Parse masters ("HOST:PORT[,HOST:PORT]"), start the follower and wait up to 5 s for a first
 * map. GCACHE_ERR_INVALID (with a message) for a bad address list. */
int gc_master_start(gcache *c, const char *masters, char *error, size_t error_len);
void gc_master_stop(gc_master *m);

#endif
