/* Request and reply framing shared by every exchange. */
#include "wire.h"

#include "gcache.h"

int gc_request(gc_conn *c, gc_header *h, const void *key, size_t key_len, const void *payload,
               size_t payload_len)
{
    uint8_t raw[GC_HEADER_SIZE];
    h->request_id = ++c->next_id;
    h->key_len = (uint16_t)key_len;
    h->payload_len = payload_len;
    gc_pack_header(h, raw);
    struct iovec iov[3] = {{raw, sizeof raw}, {(void *)key, key_len}, {(void *)payload, payload_len}};
    return gc_conn_sendv(c, iov, 3);
}

int gc_reply(gc_conn *c, const gc_header *req, uint64_t max_payload, gc_header *reply)
{
    uint8_t raw[GC_HEADER_SIZE];
    const char *why;
    int rc = gc_conn_recv(c, raw, sizeof raw, NULL);
    if (rc) return rc;
    if (gc_unpack_header(raw, max_payload, reply, &why)) return GCACHE_MISS_PROTOCOL;
    if (reply->op != req->op || reply->request_id != req->request_id || reply->key_len)
        return GCACHE_MISS_PROTOCOL;
    return 0;
}

int gc_answer(uint8_t op, uint8_t status)
{
    if (status == GC_ST_OK || status == GC_ST_NOT_FOUND) return 0;
    int write = op == GC_PUT || op == GC_ALLOC || op == GC_COMMIT;
    if (status == GC_ST_NO_SPACE && (write || op == GC_GET || op == GC_LEASE)) return 0;
    if (status == GC_ST_CHECKSUM_MISMATCH && write) return 0;
    return gc_failure_miss(status);
}

int gc_reply_payload(gc_conn *c, const gc_header *reply, void *buf, size_t limit)
{
    if (reply->payload_len > limit) return GCACHE_MISS_PROTOCOL;
    return gc_conn_recv(c, buf, (size_t)reply->payload_len, NULL);
}
