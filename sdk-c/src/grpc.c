/* A minimal HTTP/2 (RFC 9113) client for one gRPC unary call per connection. The client sends
 * the preface, its SETTINGS (a 16 MiB initial stream window and a connection WINDOW_UPDATE to
 * match, so a large cluster map never waits on flow control), one HEADERS frame of literal
 * fields without indexing (RFC 7541, so no table state is shared), and one DATA frame holding
 * the gRPC message (u8 compressed = 0, u32 big-endian length, bytes). It answers SETTINGS and
 * PING, ignores HEADERS (response headers and trailers), and collects stream 1's DATA until
 * END_STREAM. RST_STREAM, GOAWAY, a compressed message or a stream ending without a message
 * fail the call. */
#include "grpc.h"

#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "frame.h"
#include "gcache.h"

#define WINDOW (16u << 20)
enum { DATA = 0, HEADERS = 1, RST_STREAM = 3, SETTINGS = 4, PING = 6, GOAWAY = 7,
       WINDOW_UPDATE = 8 };
enum { END_STREAM = 1, ACK = 1, END_HEADERS = 4, PADDED = 8 };

static size_t frame_header(uint8_t *p, size_t len, uint8_t type, uint8_t flags, uint32_t stream)
{
    p[0] = (uint8_t)(len >> 16);
    p[1] = (uint8_t)(len >> 8);
    p[2] = (uint8_t)len;
    p[3] = type;
    p[4] = flags;
    p[5] = (uint8_t)(stream >> 24);
    p[6] = (uint8_t)(stream >> 16);
    p[7] = (uint8_t)(stream >> 8);
    p[8] = (uint8_t)stream;
    return 9;
}

/* An HPACK integer with an n-bit prefix (RFC 7541 5.1) after the first byte's high bits. */
static size_t hpack_int(uint8_t *p, uint8_t high, int n, size_t value)
{
    size_t max = ((size_t)1 << n) - 1, i = 0;
    if (value < max) {
        p[i++] = (uint8_t)(high | value);
        return i;
    }
    p[i++] = (uint8_t)(high | max);
    value -= max;
    while (value >= 128) {
        p[i++] = (uint8_t)(0x80 | (value & 0x7F));
        value >>= 7;
    }
    p[i++] = (uint8_t)value;
    return i;
}

static size_t hpack_string(uint8_t *p, const char *s)
{
    size_t len = strlen(s), i = hpack_int(p, 0, 7, len);   /* H = 0: no Huffman coding */
    memcpy(p + i, s, len);
    return i + len;
}

/* A literal field without indexing: by static-table name index, or with a new name. */
static size_t field(uint8_t *p, int name_index, const char *name, const char *value)
{
    size_t i = hpack_int(p, 0x00, 4, (size_t)name_index);
    if (!name_index) i += hpack_string(p + i, name);
    return i + hpack_string(p + i, value);
}

static int send_request(gc_conn *c, const char *address, const char *path, const char *key,
                        const char *value, const uint8_t *request, size_t request_len)
{
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    size_t extra = key && value ? strlen(key) + strlen(value) : 0;
    size_t cap = 256 + strlen(path) + strlen(address) + extra + request_len;
    uint8_t *buf = malloc(cap), *p = buf;
    if (!buf) return GCACHE_ERR_NO_MEMORY;
    memcpy(p, preface, sizeof preface - 1);
    p += sizeof preface - 1;
    p += frame_header(p, 6, SETTINGS, 0, 0);            /* SETTINGS_INITIAL_WINDOW_SIZE */
    p[0] = 0, p[1] = 4, p[2] = WINDOW >> 24, p[3] = (WINDOW >> 16) & 0xFF, p[4] = 0, p[5] = 0;
    p += 6;
    p += frame_header(p, 4, WINDOW_UPDATE, 0, 0);
    uint32_t more = WINDOW - 65535;
    p[0] = (uint8_t)(more >> 24), p[1] = (uint8_t)(more >> 16), p[2] = (uint8_t)(more >> 8),
    p[3] = (uint8_t)more;
    p += 4;
    uint8_t *headers = p + 9, *h = headers;
    *h++ = 0x83;                                       /* :method POST (static index 3) */
    *h++ = 0x86;                                       /* :scheme http (static index 6) */
    h += field(h, 4, NULL, path);                      /* :path */
    h += field(h, 1, NULL, address);                   /* :authority */
    h += field(h, 31, NULL, "application/grpc");       /* content-type */
    h += field(h, 0, "te", "trailers");
    if (key && value) h += field(h, 0, key, value);
    frame_header(p, (size_t)(h - headers), HEADERS, END_HEADERS, 1);
    p = h;
    p += frame_header(p, 5 + request_len, DATA, END_STREAM, 1);
    *p++ = 0;
    p[0] = (uint8_t)(request_len >> 24), p[1] = (uint8_t)(request_len >> 16),
    p[2] = (uint8_t)(request_len >> 8), p[3] = (uint8_t)request_len;
    p += 4;
    if (request_len) memcpy(p, request, request_len);
    p += request_len;
    int rc = gc_conn_send(c, buf, (size_t)(p - buf));
    free(buf);
    return rc;
}

/* Frames until stream 1 ends; its DATA bytes appended to *body. */
static int read_reply(gc_conn *c, uint8_t **body, size_t *body_len)
{
    uint8_t head[9], *payload = malloc(16384);
    size_t cap = 0;
    int rc = payload ? 0 : GCACHE_ERR_NO_MEMORY, ended = 0;
    size_t payload_cap = 16384;
    while (!rc && !ended) {
        rc = gc_conn_recv(c, head, sizeof head, NULL);
        if (rc) break;
        size_t len = ((size_t)head[0] << 16) | ((size_t)head[1] << 8) | head[2];
        uint8_t type = head[3], flags = head[4];
        uint32_t stream = gc_get32_be(head + 5) & 0x7FFFFFFF;
        if (len > payload_cap) {          /* a frame over our 16 KiB SETTINGS_MAX_FRAME_SIZE */
            rc = GCACHE_MISS_PROTOCOL;
            break;
        }
        rc = gc_conn_recv(c, payload, len, NULL);
        if (rc) break;
        if (type == SETTINGS && !(flags & ACK)) {
            uint8_t ack[9];
            rc = gc_conn_send(c, ack, frame_header(ack, 0, SETTINGS, ACK, 0));
        } else if (type == PING && !(flags & ACK) && len == 8) {
            uint8_t pong[17];
            frame_header(pong, 8, PING, ACK, 0);
            memcpy(pong + 9, payload, 8);
            rc = gc_conn_send(c, pong, sizeof pong);
        } else if (type == GOAWAY || (type == RST_STREAM && stream == 1)) {
            rc = GCACHE_MISS_CONNECTION_LOST;
        } else if (type == DATA && stream == 1) {
            size_t pad = flags & PADDED ? (size_t)payload[0] + 1 : 0;
            if (pad > len || *body_len + len - pad > GC_GRPC_MAX_REPLY) {
                rc = GCACHE_MISS_PROTOCOL;
                break;
            }
            size_t n = len - pad;
            if (*body_len + n > cap) {
                cap = (*body_len + n) * 2;
                uint8_t *grown = realloc(*body, cap);
                if (!grown) {
                    rc = GCACHE_ERR_NO_MEMORY;
                    break;
                }
                *body = grown;
            }
            memcpy(*body + *body_len, payload + (flags & PADDED ? 1 : 0), n);
            *body_len += n;
        }
        if (stream == 1 && (type == DATA || type == HEADERS) && (flags & END_STREAM)) ended = 1;
    }
    free(payload);
    return rc;
}

int gc_grpc_call(const char *address, const char *path, const char *metadata_key,
                 const char *metadata_value, const uint8_t *request, size_t request_len,
                 double timeout_s, uint8_t **reply, size_t *reply_len)
{
    gc_conn c;
    uint8_t *body = NULL;
    size_t body_len = 0;
    *reply = NULL;
    int rc = gc_conn_tcp(&c, address, timeout_s, 1u << 20);
    if (rc) return rc;
    c.deadline = gc_now() + timeout_s;
    rc = send_request(&c, address, path, metadata_key, metadata_value, request, request_len);
    if (!rc) rc = read_reply(&c, &body, &body_len);
    gc_conn_close(&c);
    /* one uncompressed message, exactly: anything else (an error status sends none) fails */
    if (!rc && (body_len < 5 || body[0] != 0 || gc_get32_be(body + 1) != body_len - 5))
        rc = GCACHE_MISS_PROTOCOL;
    if (rc) {
        free(body);
        return rc;
    }
    memmove(body, body + 5, body_len - 5);
    *reply = body;
    *reply_len = body_len - 5;
    return 0;
}
