/* One unary gRPC call over HTTP/2 cleartext with prior knowledge (h2c), as the masters serve
 * their API (docs/protocol.md, "Cluster map from the masters"). Just enough of HTTP/2 for a
 * request and its answer on a fresh connection: no TLS, no HPACK state (requests use literal
 * fields only and response headers are not decoded: a call is answered when its one gRPC
 * message arrives, and failed when the stream ends without one, as an error status does). */
#ifndef GC_GRPC_H
#define GC_GRPC_H

#include <stddef.h>
#include <stdint.h>

#define GC_GRPC_MAX_REPLY (16u << 20)

/* Calls path (e.g. "/gcache.master.Master/GetClusterMap") on address with the serialized
 * request; the reply message in *reply (malloc'd, *reply_len bytes). metadata_key/value: one
 * extra header (the token), or NULL. 0, or a GCACHE_MISS_* code. */
int gc_grpc_call(const char *address, const char *path, const char *metadata_key,
                 const char *metadata_value, const uint8_t *request, size_t request_len,
                 double timeout_s, uint8_t **reply, size_t *reply_len);

#endif
