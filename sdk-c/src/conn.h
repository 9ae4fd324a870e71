/* One stream connection to a server (TCP, or its Unix socket): blocking IO with a per-IO
 * timeout and an optional deadline for the whole exchange, writes gathered into sendmsg calls
 * of at most io_size bytes, reads through a small read-ahead buffer (a header and a small
 * reply cost one recv) or, for large reads, straight into the destination in io_size pieces,
 * hashed as they land. Not thread-safe: one user at a time (the pool hands links out).
 *
 * Every function returns 0 or a miss code: GCACHE_MISS_TIMEOUT (an IO waited timeout_s, or the
 * deadline passed), GCACHE_MISS_CONNECTION_LOST (closed, reset), GCACHE_MISS_UNREACHABLE
 * (connect failed). After any failure the connection is out of sync and must be closed. */
#ifndef GC_CONN_H
#define GC_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>
#include "xxh.h"

#define GC_READ_AHEAD 16384
#define GC_DIRECT_MIN 4096        /* reads at least this large skip the read-ahead buffer */
#define GC_MIN_RATE 1048576.0     /* bytes/s a transfer may not fall under (docs/protocol.md) */

typedef struct gc_conn {
    int fd;
    char peer[128];
    size_t io_size;
    double timeout_s;
    double deadline;              /* gc_now() instant the exchange must end by; 0: none */
    uint32_t next_id;             /* request ids */
    size_t rpos, rend;
    uint8_t rbuf[GC_READ_AHEAD];
} gc_conn;

double gc_now(void);              /* CLOCK_MONOTONIC seconds */

/* Connect to HOST:PORT (IPv6 hosts in brackets) within timeout_s, with TCP_NODELAY, 4 MiB
 * buffers, TCP_USER_TIMEOUT of timeout_s (a peer cut off mid-transfer ends the connection in
 * one timeout, not several) and SO_RCVTIMEO / SO_SNDTIMEO of timeout_s. */
int gc_conn_tcp(gc_conn *c, const char *address, double timeout_s, size_t io_size);
int gc_conn_unix(gc_conn *c, const char *path, double timeout_s, size_t io_size);
/* Wrap an open socket (the fuzz target's socketpair). */
void gc_conn_wrap(gc_conn *c, int fd, const char *peer, double timeout_s, size_t io_size);
void gc_conn_close(gc_conn *c);

/* Bound the exchange that starts now: timeout_s of grace plus bytes at GC_MIN_RATE, so a
 * peer trickling a byte at a time cannot hold the caller for ever. */
void gc_conn_expect(gc_conn *c, uint64_t bytes);

int gc_conn_sendv(gc_conn *c, const struct iovec *iov, int count);
int gc_conn_send(gc_conn *c, const void *data, size_t len);
/* Fill buf[0..len); with hasher, feed it each piece as it lands. */
int gc_conn_recv(gc_conn *c, void *buf, size_t len, XXH3_state_t *hasher);
/* Receive exactly len bytes and the descriptors (SCM_RIGHTS) sent with the first of them;
 * *fd is -1 when none came. More than one descriptor is a protocol error (all closed). */
int gc_conn_recv_fd(gc_conn *c, void *buf, size_t len, int *fd);
/* Zero-wait polls: whether bytes (or the end) are there to read; whether the peer is gone. */
int gc_conn_readable(gc_conn *c);
int gc_conn_peer_closed(gc_conn *c);

#endif
