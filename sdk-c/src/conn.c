/* Socket IO for the data plane. Timeouts are per IO, kept in the kernel (SO_RCVTIMEO /
 * SO_SNDTIMEO, set once per connection: the client's timeout never changes), so a round trip
 * costs a send and a recv and no poll. A whole exchange is also bounded by its deadline
 * (gc_conn_expect), checked before each IO: a blocked IO can overshoot it by one timeout. */
#include "conn.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "gcache.h"

#define SOCKET_BUFFER_BYTES (4 << 20)

double gc_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_timeouts(int fd, double timeout_s)
{
    struct timeval tv = {.tv_sec = (time_t)timeout_s,
                         .tv_usec = (suseconds_t)((timeout_s - (double)(time_t)timeout_s) * 1e6)};
    if (tv.tv_sec == 0 && tv.tv_usec == 0) tv.tv_usec = 1;   /* 0 would mean "never" */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void gc_conn_wrap(gc_conn *c, int fd, const char *peer, double timeout_s, size_t io_size)
{
    c->fd = fd;
    snprintf(c->peer, sizeof c->peer, "%s", peer);
    c->io_size = io_size;
    c->timeout_s = timeout_s;
    c->deadline = 0;
    c->next_id = 0;
    c->rpos = c->rend = 0;
    set_timeouts(fd, timeout_s);
}

/* Connect a non-blocking socket and wait at most timeout_s for it to complete. */
static int connect_within(int fd, const struct sockaddr *addr, socklen_t len, double timeout_s)
{
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = connect(fd, addr, len);
    if (rc < 0 && errno == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int ms = (int)(timeout_s * 1000) + 1;
        do rc = poll(&p, 1, ms);
        while (rc < 0 && errno == EINTR);
        int err = 0;
        socklen_t elen = sizeof err;
        if (rc <= 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) || err) return -1;
        rc = 0;
    }
    fcntl(fd, F_SETFL, flags);
    return rc;
}

/* HOST:PORT -> host and port; IPv6 hosts may be bracketed. */
static int split_address(const char *address, char *host, size_t host_len, char *port,
                         size_t port_len)
{
    const char *colon = strrchr(address, ':');
    if (!colon || colon == address || !colon[1] || strlen(colon + 1) >= port_len) return -1;
    const char *start = address, *stop = colon;
    if (*start == '[' && stop[-1] == ']') {
        start++;
        stop--;
    }
    if (stop <= start || (size_t)(stop - start) >= host_len) return -1;
    memcpy(host, start, (size_t)(stop - start));
    host[stop - start] = 0;
    strcpy(port, colon + 1);
    for (const char *p = port; *p; p++)
        if (*p < '0' || *p > '9') return -1;
    return 0;
}

int gc_conn_tcp(gc_conn *c, const char *address, double timeout_s, size_t io_size)
{
    char host[256], port[16];
    if (split_address(address, host, sizeof host, port, sizeof port))
        return GCACHE_MISS_UNREACHABLE;
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *found;
    if (getaddrinfo(host, port, &hints, &found)) return GCACHE_MISS_UNREACHABLE;
    int fd = -1;
    for (struct addrinfo *ai = found; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) continue;
        if (!connect_within(fd, ai->ai_addr, ai->ai_addrlen, timeout_s)) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(found);
    if (fd < 0) return GCACHE_MISS_UNREACHABLE;
    int one = 1, buffer = SOCKET_BUFFER_BYTES;
    unsigned user_timeout_ms = timeout_s * 1000 < 1 ? 1 : (unsigned)(timeout_s * 1000);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    gc_conn_wrap(c, fd, address, timeout_s, io_size);
    return 0;
}

int gc_conn_unix(gc_conn *c, const char *path, double timeout_s, size_t io_size)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return GCACHE_MISS_UNREACHABLE;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return GCACHE_MISS_UNREACHABLE;
    if (connect_within(fd, (struct sockaddr *)&addr, sizeof addr, timeout_s)) {
        close(fd);
        return GCACHE_MISS_UNREACHABLE;
    }
    char peer[128];
    snprintf(peer, sizeof peer, "unix:%s", path);
    gc_conn_wrap(c, fd, peer, timeout_s, io_size);
    return 0;
}

void gc_conn_close(gc_conn *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
}

void gc_conn_expect(gc_conn *c, uint64_t bytes)
{
    c->deadline = gc_now() + c->timeout_s + (double)bytes / GC_MIN_RATE;
}

static int io_error(void)
{
    return errno == EAGAIN || errno == EWOULDBLOCK ? GCACHE_MISS_TIMEOUT
                                                   : GCACHE_MISS_CONNECTION_LOST;
}

static int past_deadline(const gc_conn *c)
{
    return c->deadline > 0 && gc_now() > c->deadline;
}

int gc_conn_sendv(gc_conn *c, const struct iovec *iov, int count)
{
    struct iovec batch[16];
    int i = 0;
    size_t skip = 0;                /* bytes of iov[i] already sent */
    while (i < count) {
        if (past_deadline(c)) return GCACHE_MISS_TIMEOUT;
        /* gather at most io_size bytes from the remaining pieces into one sendmsg */
        int n = 0;
        size_t total = 0;
        for (int j = i; j < count && n < 16 && total < c->io_size; j++) {
            size_t off = j == i ? skip : 0, len = iov[j].iov_len - off;
            if (len > c->io_size - total) len = c->io_size - total;
            if (!len) continue;
            batch[n].iov_base = (char *)iov[j].iov_base + off;
            batch[n].iov_len = len;
            total += len;
            n++;
        }
        if (!n) break;
        struct msghdr msg = {.msg_iov = batch, .msg_iovlen = (size_t)n};
        ssize_t sent = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
        if (sent < 0) {
            if (errno == EINTR) continue;
            return io_error();
        }
        size_t left = (size_t)sent;
        while (i < count && left >= iov[i].iov_len - skip) {
            left -= iov[i].iov_len - skip;
            skip = 0;
            i++;
        }
        skip += left;
    }
    return 0;
}

int gc_conn_send(gc_conn *c, const void *data, size_t len)
{
    struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
    return gc_conn_sendv(c, &iov, 1);
}

int gc_conn_recv(gc_conn *c, void *buf, size_t len, XXH3_state_t *hasher)
{
    uint8_t *out = buf;
    size_t got = 0;
    while (got < len) {
        if (past_deadline(c)) return GCACHE_MISS_TIMEOUT;
        size_t n;
        if (c->rpos < c->rend) {                    /* bytes already read ahead */
            n = c->rend - c->rpos < len - got ? c->rend - c->rpos : len - got;
            memcpy(out + got, c->rbuf + c->rpos, n);
            c->rpos += n;
        } else if (len - got >= GC_DIRECT_MIN) {    /* large: straight into the destination */
            size_t want = len - got < c->io_size ? len - got : c->io_size;
            ssize_t r = recv(c->fd, out + got, want, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return r == 0 ? GCACHE_MISS_CONNECTION_LOST : io_error();
            n = (size_t)r;
        } else {                                    /* small: one recv, maybe more than asked */
            ssize_t r = recv(c->fd, c->rbuf, sizeof c->rbuf, 0);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return r == 0 ? GCACHE_MISS_CONNECTION_LOST : io_error();
            c->rpos = 0;
            c->rend = (size_t)r;
            continue;
        }
        if (hasher) XXH3_64bits_update(hasher, out + got, n);
        got += n;
    }
    return 0;
}

int gc_conn_recv_fd(gc_conn *c, void *buf, size_t len, int *fd)
{
    *fd = -1;
    if (c->rpos < c->rend) return GCACHE_MISS_PROTOCOL;   /* descriptors come at a frame start */
    union {
        struct cmsghdr align;
        char space[CMSG_SPACE(4 * sizeof(int))];
    } control;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.space,
                         .msg_controllen = sizeof control.space};
    ssize_t r;
    do r = recvmsg(c->fd, &msg, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    int fds[4], n_fds = 0;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t k = 0; k < n && n_fds < 4; k++) memcpy(&fds[n_fds++], CMSG_DATA(cm) + k * sizeof(int), sizeof(int));
    }
    int rc = 0;
    if (r <= 0) rc = r == 0 ? GCACHE_MISS_CONNECTION_LOST : io_error();
    else if (n_fds > 1 || (msg.msg_flags & MSG_CTRUNC)) rc = GCACHE_MISS_PROTOCOL;
    if (rc) {
        for (int k = 0; k < n_fds; k++) close(fds[k]);
        return rc;
    }
    if (n_fds == 1) *fd = fds[0];
    if ((size_t)r < len) rc = gc_conn_recv(c, (uint8_t *)buf + r, len - (size_t)r, NULL);
    if (rc && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

static int poll_now(gc_conn *c, short events)
{
    struct pollfd p = {.fd = c->fd, .events = events};
    int rc = poll(&p, 1, 0);
    return rc != 0;                 /* an error counts as "yes": the caller stops waiting */
}

int gc_conn_readable(gc_conn *c)
{
    return c->rpos < c->rend || poll_now(c, POLLIN | POLLRDHUP);
}

int gc_conn_peer_closed(gc_conn *c)
{
    return poll_now(c, POLLRDHUP);
}
