/* Requests and replies on one connection: every request gets one reply with the same opcode
 * and request id (docs/protocol.md, "Framing"), except NO_REPLY ones. */
#ifndef GC_WIRE_H
#define GC_WIRE_H

#include "conn.h"
#include "frame.h"

/* Sends h (its request_id, key_len and payload_len set here), then key, then payload. */
int gc_request(gc_conn *c, gc_header *h, const void *key, size_t key_len, const void *payload,
               size_t payload_len);

/* Reads the reply to req: GCACHE_MISS_PROTOCOL when the header is malformed, announces more
 * than max_payload, or answers another request. */
int gc_reply(gc_conn *c, const gc_header *req, uint64_t max_payload, gc_header *reply);

/* 0 when status is an answer to op the caller reports (OK, NOT_FOUND everywhere; NO_SPACE to
 * the single-key reads and writes; CHECKSUM_MISMATCH to writes), else the miss it makes the
 * exchange (docs/protocol.md, "Statuses"): the connection is then closed. */
int gc_answer(uint8_t op, uint8_t status);

/* The small payload of a reply (at most limit bytes, else a protocol error) into buf. */
int gc_reply_payload(gc_conn *c, const gc_header *reply, void *buf, size_t limit);

#endif
