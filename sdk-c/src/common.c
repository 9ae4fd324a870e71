/* The exchanges that move no value and are the same on every route: EXISTS and DELETE. */
#include <stdlib.h>

#include "ops.h"
#include "wire.h"

int gc_exists(gc_link *l, const gc_key *keys, size_t n, uint8_t *present)
{
    gc_conn *c = &l->conn;
    size_t len;
    uint8_t *payload = gc_encode_keys(keys, n, &len);
    if (!payload) return GCACHE_ERR_NO_MEMORY;
    gc_header h = {.op = GC_EXISTS, .count = (uint16_t)n}, reply;
    gc_conn_expect(c, len);
    int rc = gc_request(c, &h, NULL, 0, payload, len);
    free(payload);
    if (!rc) rc = gc_reply(c, &h, n, &reply);
    if (!rc && reply.status != GC_ST_OK) rc = gc_failure_miss(reply.status);
    if (!rc && reply.payload_len != n) rc = GCACHE_MISS_PROTOCOL;
    if (!rc) rc = gc_conn_recv(c, present, n, NULL);
    for (size_t i = 0; !rc && i < n; i++)
        if (present[i] > 1) rc = GCACHE_MISS_PROTOCOL;
    return rc;
}

int gc_delete(gc_link *l, gc_key key, int *answer)
{
    gc_conn *c = &l->conn;
    gc_header h = {.op = GC_DELETE}, reply;
    gc_conn_expect(c, key.len);
    int rc = gc_request(c, &h, key.data, key.len, NULL, 0);
    if (!rc) rc = gc_reply(c, &h, 0, &reply);
    if (!rc && reply.status != GC_ST_OK && reply.status != GC_ST_NOT_FOUND)
        rc = gc_failure_miss(reply.status);
    if (!rc) *answer = reply.status == GC_ST_OK;
    return rc;
}
