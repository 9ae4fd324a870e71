/* Every operation of libgcache against real gcache-servers (started by test_sdk_c.py):
 * single, batch and async calls, groups and flags, misses by reason, bad arguments, an out
 * buffer too small, values sliced into many io_size IOs, concurrent callers.
 * Usage: test_client --servers A,B --transport tcp|shm. */
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>

#include "testing.h"

#define BIG ((3u << 20) + 5)

static gcache *c;
static const char *want_transport;

static void single_ops(void)
{
    uint8_t *value = malloc(BIG), *out = malloc(BIG);
    value_of("ops/big", value, BIG);
    CHECK(gcache_put(c, "ops/big", 7, value, BIG, NULL, 0) == GCACHE_OK, "put of 3 MiB");
    memset(out, 0, BIG);
    CHECK(gcache_get_into(c, "ops/big", 7, out, BIG, NULL) == BIG && !memcmp(out, value, BIG),
          "get_into of 3 MiB in 64 KiB IOs");
    CHECK(gcache_get_into(c, "ops/absent", 10, out, BIG, NULL) == GCACHE_MISS_ABSENT, "absent");
    CHECK(gcache_exists(c, "ops/big", 7, NULL) == 1, "exists");
    CHECK(gcache_exists(c, "ops/absent", 10, NULL) == 0, "not exists");
    CHECK(gcache_get_into(c, "ops/big", 7, out, 100, NULL) == GCACHE_ERR_TOO_SMALL, "out too small");
    CHECK(gcache_get_into(c, "ops/big", 7, out, BIG, NULL) == BIG, "a hit after a too-small out");
    CHECK(gcache_delete(c, "ops/big", 7, NULL) == 1, "delete");
    CHECK(gcache_delete(c, "ops/big", 7, NULL) == 0, "delete of an absent key");
    CHECK(gcache_get_into(c, "ops/big", 7, out, BIG, NULL) == GCACHE_MISS_ABSENT, "deleted");
    CHECK(gcache_put(c, "ops/flags", 9, value, 4096, NULL, GCACHE_CONTENT_ADDRESSED) == GCACHE_OK,
          "content-addressed put");
    CHECK(gcache_put(c, "ops/pinned", 10, value, 4096, NULL, GCACHE_PINNED) == GCACHE_OK, "pinned put");
    CHECK(gcache_delete(c, "ops/pinned", 10, NULL) == 1, "delete of a pinned value");

    gcache_group group = {"conversation-1", 14};
    for (int i = 0; i < 20; i++) {
        char key[32];
        snprintf(key, sizeof key, "ops/grouped/%d", i);
        value_of(key, value, 1000);
        CHECK(gcache_put(c, key, strlen(key), value, 1000 + (size_t)i, &group, 0) == GCACHE_OK,
              "grouped put %d", i);
        CHECK(gcache_get_into(c, key, strlen(key), out, BIG, &group) == 1000 + i &&
              !memcmp(out, value, 1000), "grouped get %d", i);
    }
    /* bad arguments: refused before any IO */
    char key1025[1025];
    memset(key1025, 'k', sizeof key1025);
    gcache_group empty = {"", 0};
    CHECK(gcache_put(c, "", 0, value, 1, NULL, 0) == GCACHE_ERR_INVALID, "empty key");
    CHECK(gcache_put(c, key1025, 1025, value, 1, NULL, 0) == GCACHE_ERR_INVALID, "1025-byte key");
    CHECK(gcache_put(c, "k", 1, value, 0, NULL, 0) == GCACHE_ERR_INVALID, "empty value");
    CHECK(gcache_put(c, "k", 1, value, 1, &empty, 0) == GCACHE_ERR_INVALID, "empty group");
    CHECK(gcache_put(c, "k", 1, value, 1, NULL, 0x100) == GCACHE_ERR_INVALID, "unknown flag");
    CHECK(gcache_get_into(c, "k", 1, NULL, 5, NULL) == GCACHE_ERR_INVALID, "NULL out");
    CHECK(gcache_put(c, key1025, 1024, value, 1, NULL, 0) == GCACHE_OK, "1024-byte key");
    CHECK(gcache_get_into(c, key1025, 1024, out, 1, NULL) == 1, "1024-byte key read");
    free(value);
    free(out);
}

static void batches(void)
{
    enum { N = 40 };
    gcache_item items[N];
    char keys[N][32];
    uint8_t *values[N], *outs[N];
    gcache_group group = {"batch-group", 11};
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof keys[i], "batch/%d", i);
        size_t size = size_of((size_t)i);
        values[i] = malloc(size);
        outs[i] = malloc(size);
        value_of(keys[i], values[i], size);
        items[i] = (gcache_item){keys[i], strlen(keys[i]), values[i], size, i % 3 ? NULL : &group, 0};
    }
    CHECK(gcache_batch_put(c, items, N, 0) == N, "batch_put of %d", N);
    for (int i = 0; i < N; i++) CHECK(items[i].result == GCACHE_OK, "batch_put item %d: %lld", i, (long long)items[i].result);
    for (int i = 0; i < N; i++) {
        items[i].buf = outs[i];
        memset(outs[i], 0, items[i].len);
    }
    items[N - 1].len = 0;                                   /* out too small */
    snprintf(keys[N - 2], sizeof keys[N - 2], "batch/absent");  /* absent */
    items[N - 2].key_len = strlen(keys[N - 2]);
    CHECK(gcache_batch_get_into(c, items, N) == N - 2, "batch_get_into hits");
    for (int i = 0; i < N - 2; i++)
        CHECK(items[i].result == (int64_t)size_of((size_t)i) &&
              !memcmp(outs[i], values[i], size_of((size_t)i)), "batch_get_into item %d", i);
    CHECK(items[N - 2].result == GCACHE_MISS_ABSENT, "batch absent: %lld", (long long)items[N - 2].result);
    CHECK(items[N - 1].result == GCACHE_ERR_TOO_SMALL, "batch too small: %lld", (long long)items[N - 1].result);
    CHECK(gcache_batch_exists(c, items, N) == N - 1, "batch_exists");
    CHECK(items[N - 2].result == 0 && items[0].result == 1, "batch_exists results");
    CHECK(gcache_batch_put(c, items, 0, 0) == 0, "an empty batch");
    items[3].key_len = 0;
    CHECK(gcache_batch_get_into(c, items, N) == GCACHE_ERR_INVALID, "a batch with a bad key");
    for (int i = 0; i < N; i++) {
        free(values[i]);
        free(outs[i]);
    }
}

static atomic_int callbacks;
static void count_callback(void *user, int64_t result)
{
    (void)user;
    if (result >= 0) atomic_fetch_add(&callbacks, 1);
}

static void async_ops(void)
{
    size_t n = 1 << 20;
    uint8_t *value = malloc(n), *out = malloc(n);
    value_of("async/a", value, n);
    gcache_op *put = gcache_put_async(c, "async/a", 7, value, n, NULL, 0, count_callback, NULL);
    CHECK(gcache_op_wait(put, -1) == GCACHE_OK, "put_async");
    gcache_op_free(put);
    gcache_op *get = gcache_get_into_async(c, "async/a", 7, out, n, NULL, count_callback, NULL);
    struct pollfd p = {.fd = gcache_op_fd(get), .events = POLLIN};
    CHECK(poll(&p, 1, 10000) == 1, "the op's fd became readable");
    CHECK(gcache_op_done(get) && gcache_op_wait(get, 0) == (int64_t)n && !memcmp(out, value, n),
          "get_into_async");
    gcache_op_free(get);
    gcache_op *ex = gcache_exists_async(c, "async/a", 7, NULL, NULL, NULL);
    CHECK(gcache_op_wait(ex, 10) == 1, "exists_async");
    gcache_op_free(ex);
    gcache_op *bad = gcache_put_async(c, "", 0, value, n, NULL, 0, NULL, NULL);
    CHECK(gcache_op_done(bad) && gcache_op_wait(bad, 0) == GCACHE_ERR_INVALID, "bad async args");
    gcache_op_free(bad);
    /* freed before it is done: the IO thread frees it */
    gcache_op_free(gcache_put_async(c, "async/b", 7, value, n, NULL, 0, NULL, NULL));
    gcache_item items[2] = {{"async/a", 7, out, n, NULL, 0}, {"async/none", 10, out, n, NULL, 0}};
    gcache_op *batch = gcache_batch_get_into_async(c, items, 2, count_callback, NULL);
    CHECK(gcache_op_wait(batch, -1) == 1 && items[1].result == GCACHE_MISS_ABSENT, "batch async");
    gcache_op_free(batch);
    gcache_item puts[1] = {{"async/c", 7, value, 100, NULL, 0}};
    gcache_op *bput = gcache_batch_put_async(c, puts, 1, 0, NULL, NULL);
    CHECK(gcache_op_wait(bput, -1) == 1, "batch_put_async");
    gcache_op_free(bput);
    gcache_op *del = gcache_delete_async(c, "async/c", 7, NULL, NULL, NULL);
    CHECK(gcache_op_wait(del, -1) == 1, "delete_async");
    gcache_op_free(del);
    CHECK(atomic_load(&callbacks) == 3, "callbacks ran: %d", atomic_load(&callbacks));
    free(value);
    free(out);
}

static void *caller(void *arg)
{
    int t = (int)(intptr_t)arg, bad = 0;
    uint8_t value[70000], out[70000];
    for (int i = 0; i < 50; i++) {
        char key[48];
        snprintf(key, sizeof key, "threads/%d/%d", t, i);
        size_t size = 1 + (size_t)(i * 1399) % sizeof value;
        value_of(key, value, size);
        bad += gcache_put(c, key, strlen(key), value, size, NULL, 0) != GCACHE_OK;
        bad += gcache_get_into(c, key, strlen(key), out, sizeof out, NULL) != (int64_t)size ||
               memcmp(out, value, size);
    }
    return (void *)(intptr_t)bad;
}

static void concurrent_callers(void)
{
    pthread_t threads[4];
    for (int t = 0; t < 4; t++) pthread_create(&threads[t], NULL, caller, (void *)(intptr_t)t);
    for (int t = 0; t < 4; t++) {
        void *bad;
        pthread_join(threads[t], &bad);
        CHECK(!bad, "caller thread %d: %ld failures", t, (long)(intptr_t)bad);
    }
}

int main(int argc, char **argv)
{
    test_args a;
    parse_args(argc, argv, 1, &a);
    a.options.io_size = 65536;
    a.options.max_value_size = 8u << 20;
    want_transport = a.options.transport == GCACHE_TRANSPORT_SHM ? "shm" : "tcp";
    c = open_or_die(&a);
    single_ops();
    batches();
    async_ops();
    concurrent_callers();
    uint8_t *nine = calloc(9u << 20, 1);
    CHECK(gcache_put(c, "too/big", 7, nine, 9u << 20, NULL, 0) == GCACHE_ERR_INVALID,
          "a value over max_value_size");
    free(nine);
    char servers[512];
    snprintf(servers, sizeof servers, "%s", a.servers);
    for (char *s = strtok(servers, ","); s; s = strtok(NULL, ",")) {
        const char *t = gcache_transport_of(c, s);
        CHECK(t && !strcmp(t, want_transport), "%s reached over %s", s, t ? t : "nothing");
    }
    gcache_stats st;
    gcache_get_stats(c, &st);
    CHECK(st.hits > 0 && st.stored > 0 && st.misses_by_reason[-GCACHE_MISS_ABSENT] >= 3 &&
          st.misses == st.misses_by_reason[-GCACHE_MISS_ABSENT], "stats: %llu hits, %llu misses",
          (unsigned long long)st.hits, (unsigned long long)st.misses);
    gcache_close(c);
    return finish("client");
}
