/* Fuzz target for what a hostile server can send: the reply decoder of every exchange (TCP and
 * same-host, single and batch, the handshake), HELLO facts and the masters' ClusterMap. The
 * input's first byte picks the exchange; the rest is the server's whole byte stream, written
 * into a socketpair whose end is then shut, so every exchange ends (an answer, or a miss at
 * the stream's end) without waiting on a timeout. Same-host exchanges get a 64 KiB memfd as
 * the "arena". The library must neither crash (ASan/UBSan) nor answer out of bounds.
 *
 * Built two ways: with clang's libFuzzer (-DGC_LIBFUZZER, `make fuzz` where clang exists), or
 * (make test) with the bounded deterministic driver below: valid replies for each exchange,
 * then seeded mutations of them (byte and bit flips, truncation, length fields set to edge
 * values), FUZZ_RUNS of them. */
#include <stdint.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "xxh.h"

#include "frame.h"
#include "hello.h"
#include "json.h"
#include "master.h"
#include "ops.h"
#include "testing.h"

#define ARENA 65536
#define VALUE 3000
#define N_KEYS 3
enum { TCP_GET, TCP_PUT, TCP_BATCH_GET, TCP_BATCH_PUT, EXISTS, DELETE, HELLO, SHM_GET, SHM_PUT,
       LEASE_MANY, ALLOC_COMMIT, FACTS, CLUSTER_MAP, N_KINDS };

static gc_arena arena;
static int last_rc;                /* the last exchange's, for the seeds' check */
static uint8_t value[VALUE], outs[N_KEYS][VALUE];
static const gc_key keys[N_KEYS] = {{"k0", 2}, {"key1", 4}, {"k2", 2}};

static int valid_result(int64_t r)
{
    return r == 0 || GCACHE_IS_MISS(r) || r == GCACHE_ERR_TOO_SMALL || r == GCACHE_ERR_NO_MEMORY;
}

static void exchange(int kind, gc_link *l)
{
    int64_t answer = 0, answers[N_KEYS];
    int put = 0, puts[N_KEYS];
    uint8_t present[N_KEYS];
    void *out_ptrs[N_KEYS] = {outs[0], outs[1], outs[2]};
    size_t lens[N_KEYS] = {VALUE, 10, VALUE};
    const void *vals[N_KEYS] = {value, value, value};
    gc_extent extents[N_KEYS];
    gc_facts facts;
    int fd = -1, rc = 0;
    switch (kind) {
    case TCP_GET:
        rc = gc_tcp_get(l, keys[0], outs[0], VALUE, 1 << 20, &answer);
        CHECK(rc || answer <= VALUE, "get answered %lld bytes into %d", (long long)answer, VALUE);
        break;
    case TCP_PUT: rc = gc_tcp_put(l, keys[0], value, VALUE, 0, 0, &put); break;
    case TCP_BATCH_GET:
        rc = gc_tcp_batch_get(l, keys, out_ptrs, lens, N_KEYS, 1 << 20, answers);
        for (int i = 0; !rc && i < N_KEYS; i++)
            CHECK(answers[i] <= (int64_t)lens[i], "batch get answered %lld", (long long)answers[i]);
        break;
    case TCP_BATCH_PUT: rc = gc_tcp_batch_put(l, keys, vals, lens, N_KEYS, 0, 0, puts); break;
    case EXISTS: rc = gc_exists(l, keys, N_KEYS, present); break;
    case DELETE: rc = gc_delete(l, keys[1], &put); break;
    case HELLO:
        rc = gc_hello(&l->conn, "token", 0, &facts, &fd);
        break;
    case SHM_GET:
        rc = gc_shm_get(l, keys[0], outs[0], VALUE, 1 << 20, l->conn.io_size & 1, &answer);
        CHECK(rc || answer <= VALUE, "shm get answered %lld bytes", (long long)answer);
        break;
    case SHM_PUT: rc = gc_shm_put(l, keys[0], value, VALUE, 0, 0, &put); break;
    case LEASE_MANY: {
        rc = gc_lease_many(l, keys, N_KEYS, 1 << 20, extents, answers);
        for (int i = 0; !rc && i < N_KEYS; i++) {
            if (answers[i]) continue;
            CHECK(gc_arena_holds(l->arena, extents[i].offset, extents[i].length),
                  "leased extent outside the arena");
            if (extents[i].length <= VALUE) gc_copy_out(l, &extents[i], outs[i], 1);
        }
        break;
    }
    case ALLOC_COMMIT: {
        uint64_t handles[N_KEYS], digests[N_KEYS];
        size_t n = 0;
        rc = gc_alloc_many(l, keys, lens, N_KEYS, 0, 0, extents, puts);
        for (int i = 0; !rc && i < N_KEYS; i++) {
            if (puts[i]) continue;
            CHECK(gc_arena_holds(l->arena, extents[i].offset, extents[i].length) &&
                  extents[i].length == lens[i], "allocated extent outside the arena");
            rc = gc_copy_in(l, &extents[i], value, NULL, &digests[n]);
            handles[n++] = extents[i].handle;
        }
        if (!rc) rc = gc_commit_many(l, handles, digests, n, puts);
        break;
    }
    }
    CHECK(valid_result(rc), "exchange %d returned %d", kind, rc);
    last_rc = rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 60000) return 0;
    int kind = data[0] % N_KINDS;
    data++, size--;
    if (kind == FACTS) {
        gc_facts f;
        const char *why;
        last_rc = gc_parse_facts((const char *)data, size, &f, &why);
        return 0;
    }
    if (kind == CLUSTER_MAP) {
        cluster_map m;
        last_rc = gc_map_decode(data, size, &m);
        free(m.servers);
        return 0;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return 0;
    int big = 1 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof big);
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    if (size && write(sv[0], data, size) != (ssize_t)size) {
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    shutdown(sv[0], SHUT_WR);
    gc_link link = {.arena = kind >= SHM_GET ? &arena : NULL};
    /* io_size's low bit picks verify for shm reads: both paths fuzzed */
    gc_conn_wrap(&link.conn, sv[1], "fuzz", 0.05, 4096 + (size & 1));
    exchange(kind, &link);
    gc_conn_close(&link.conn);
    close(sv[0]);
    return 0;
}

#ifndef GC_LIBFUZZER
/* ---- the deterministic driver ---- */

typedef struct stream {
    uint8_t buf[60000];
    size_t len;
} stream;

static void put_reply(stream *s, gc_header h, const void *payload, size_t len)
{
    h.payload_len = len;
    gc_pack_header(&h, s->buf + s->len);
    s->len += GC_HEADER_SIZE;
    if (len) memcpy(s->buf + s->len, payload, len);
    s->len += len;
}

/* A valid server stream for each exchange (request ids count from 1 on a fresh link). */
static void seed(int kind, stream *s)
{
    uint64_t sum = XXH3_64bits(value, VALUE);
    uint8_t table[N_KEYS * GC_LEASE_ENTRY + 3 * VALUE];
    memset(s, 0, sizeof *s);
    s->buf[0] = (uint8_t)kind;
    s->len = 1;
    switch (kind) {
    case TCP_GET:
        put_reply(s, (gc_header){.op = GC_GET, .request_id = 1, .length = VALUE, .checksum = sum},
                  value, VALUE);
        break;
    case TCP_PUT: put_reply(s, (gc_header){.op = GC_PUT, .request_id = 1}, NULL, 0); break;
    case TCP_BATCH_GET: {
        uint8_t *t = table, *v = table + N_KEYS * GC_GET_ENTRY;
        for (int i = 0; i < N_KEYS; i++, t += GC_GET_ENTRY) {
            t[0] = i == 1 ? GC_ST_NOT_FOUND : GC_ST_OK;
            gc_put64(t + 1, i == 1 ? 0 : 100);
            gc_put64(t + 9, i == 1 ? 0 : XXH3_64bits(value, 100));
            if (i != 1) {
                memcpy(v, value, 100);
                v += 100;
            }
        }
        put_reply(s, (gc_header){.op = GC_BATCH_GET, .request_id = 1, .count = N_KEYS}, table,
                  (size_t)(v - table));
        break;
    }
    case TCP_BATCH_PUT:
    case EXISTS: {
        uint8_t st[N_KEYS] = {0, kind == EXISTS ? 1 : 4, kind == EXISTS ? 1 : 3};
        put_reply(s, (gc_header){.op = kind == EXISTS ? GC_EXISTS : GC_BATCH_PUT, .request_id = 1},
                  st, N_KEYS);
        break;
    }
    case DELETE: put_reply(s, (gc_header){.op = GC_DELETE, .request_id = 1}, NULL, 0); break;
    case HELLO: {
        static const char facts[] = "{\"host_id\": \"abc\", \"unix_socket\": \"/tmp/x.sock\", "
                                    "\"arena_bytes\": 65536, \"arena_id\": \"a\", \"parents\": true}";
        uint8_t nonce[16] = {1, 2, 3};
        put_reply(s, (gc_header){.op = GC_HELLO, .request_id = 1, .status = GC_ST_AUTH_REQUIRED},
                  nonce, sizeof nonce);
        put_reply(s, (gc_header){.op = GC_AUTH, .request_id = 2}, facts, sizeof facts - 1);
        break;
    }
    case SHM_GET:
        memcpy(arena.base + 1000, value, VALUE);
        put_reply(s, (gc_header){.op = GC_LEASE, .request_id = 1, .handle = 5, .offset = 1000,
                                 .length = VALUE, .checksum = sum}, NULL, 0);
        break;
    case SHM_PUT:
        put_reply(s, (gc_header){.op = GC_ALLOC, .request_id = 1, .handle = 5, .offset = 8192,
                                 .length = VALUE}, NULL, 0);
        put_reply(s, (gc_header){.op = GC_COMMIT, .request_id = 3}, NULL, 0);   /* 2: a notice */
        break;
    case LEASE_MANY:
        for (int i = 0; i < N_KEYS; i++) {
            uint8_t *t = table + i * GC_LEASE_ENTRY;
            memset(t, 0, GC_LEASE_ENTRY);
            t[0] = i == 2 ? GC_ST_NO_SPACE : GC_ST_OK;
            gc_put64(t + 1, (uint64_t)i + 1);
            gc_put64(t + 9, (uint64_t)i * 4096);
            gc_put64(t + 17, i == 2 ? 0 : VALUE);
            gc_put64(t + 25, sum);
        }
        put_reply(s, (gc_header){.op = GC_BATCH_LEASE, .request_id = 1, .count = N_KEYS}, table,
                  N_KEYS * GC_LEASE_ENTRY);
        break;
    case ALLOC_COMMIT: {
        size_t lens[N_KEYS] = {VALUE, 10, VALUE};
        for (int i = 0; i < N_KEYS; i++)
            put_reply(s, (gc_header){.op = GC_ALLOC, .request_id = (uint32_t)i + 1,
                                     .handle = (uint64_t)i + 1, .offset = (uint64_t)i * 8192,
                                     .length = lens[i]}, NULL, 0);
        for (int i = 0; i < N_KEYS; i++)      /* ids 4..6 went to the in-place notices */
            put_reply(s, (gc_header){.op = GC_COMMIT, .request_id = (uint32_t)i + 7}, NULL, 0);
        break;
    }
    case FACTS: {
        static const char facts[] = "{\"host_id\": \"abc\", \"arena_bytes\": 65536, \"x\": [1, "
                                    "{\"y\": null}, \"\\u00e9\"], \"lease_ttl_ms\": 5000}";
        memcpy(s->buf + 1, facts, sizeof facts - 1);
        s->len += sizeof facts - 1;
        break;
    }
    case CLUSTER_MAP: {
        static const uint8_t map[] = {0x08, 0x05, 0x10, 0x01, 0x1a, 0x0f, 0x0a, 0x01, 'a', 0x12,
                                      0x05, 'h', ':', '7', '0', '0', 0x20, 0x80, 0x08, 0x28, 0x01,
                                      0x22, 0x04, 0x08, 0x40, 0x10, 0x02};
        memcpy(s->buf + 1, map, sizeof map);
        s->len += sizeof map;
        break;
    }
    }
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_random(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One mutation of s (past its kind byte): a byte or a bit, a truncation, or a u64 or u16
 * set to an edge value at a random place (lengths, offsets, counts). */
static void mutate(stream *s)
{
    static const uint64_t edges[] = {0, 1, 2, 63, 64, 4095, 4096, VALUE - 1, VALUE, VALUE + 1,
                                     ARENA - 1, ARENA, ARENA + 1, 1u << 20, (1ull << 32) - 1,
                                     1ull << 32, 1ull << 63, UINT64_MAX, UINT64_MAX - 4095};
    if (s->len < 2) return;
    size_t at = 1 + next_random() % (s->len - 1);
    switch (next_random() % 6) {
    case 0: s->buf[at] = (uint8_t)next_random(); break;
    case 1: s->buf[at] ^= (uint8_t)(1u << (next_random() % 8)); break;
    case 2: s->len = at; break;
    case 3:
        if (at + 8 <= s->len) gc_put64(s->buf + at, edges[next_random() % (sizeof edges / 8)]);
        break;
    case 4:
        if (at + 2 <= s->len) gc_put16(s->buf + at, (uint16_t)edges[next_random() % (sizeof edges / 8)]);
        break;
    default:                          /* a field of a header at a frame boundary */
        if (s->len > 65) {
            size_t frame = 1 + GC_HEADER_SIZE * (next_random() % ((s->len - 1) / GC_HEADER_SIZE));
            size_t field = 12 + 2 * (next_random() % 2) + 8 * (next_random() % 7);
            if (frame + field + 8 <= s->len)
                gc_put64(s->buf + frame + field, edges[next_random() % (sizeof edges / 8)]);
        }
    }
}

int main(int argc, char **argv)
{
    long runs = argc > 1 ? atol(argv[1]) : 2000;   /* per exchange */
    int fd = memfd_create("gcache-fuzz-arena", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, ARENA)) return 2;
    arena.base = mmap(NULL, ARENA, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    arena.size = ARENA;
    arena.lease_window_s = 10;
    close(fd);
    for (int i = 0; i < VALUE; i++) value[i] = (uint8_t)(i * 13 + 1);
    static stream s;
    long total = 0;
    for (int kind = 0; kind < N_KINDS; kind++) {
        seed(kind, &s);
        LLVMFuzzerTestOneInput(s.buf, s.len);       /* the valid stream itself */
        /* (an unhashed shm copy then sees the shut stream as the server gone: a miss) */
        CHECK(last_rc == 0 || (kind == SHM_GET && last_rc == GCACHE_MISS_CONNECTION_LOST),
              "the valid stream of exchange %d failed with %d", kind, last_rc);
        for (long n = 0; n < runs; n++, total++) {
            seed(kind, &s);
            int mutations = 1 + (int)(next_random() % 4);
            for (int m = 0; m < mutations; m++) mutate(&s);
            LLVMFuzzerTestOneInput(s.buf, s.len);
        }
    }
    munmap(arena.base, ARENA);
    printf("fuzz: %ld mutated server streams over %d exchanges\n", total, N_KINDS);
    return finish("fuzz");
}
#endif
