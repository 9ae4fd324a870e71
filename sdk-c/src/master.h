/* Dynamic membership: the cluster map from the masters (docs/protocol.md, "Cluster map"),
 * fetched at open and refreshed every map_refresh_s by a thread of its own. */
#ifndef GC_MASTER_H
#define GC_MASTER_H

#include <stddef.h>

#include "client.h"

/* Parse masters ("HOST:PORT[,HOST:PORT]"), start the follower and wait up to 5 s for a first
 * map. GCACHE_ERR_INVALID (with a message) for a bad address list. */
int gc_master_start(gcache *c, const char *masters, char *error, size_t error_len);
void gc_master_stop(gc_master *m);

#endif
