/* The scenarios test_sdk_c.py drives across processes and languages:
 *   xput PREFIX N / xget PREFIX N   values keyed PREFIX/i (every third in group PREFIX-group)
 *                                   put from C / read from C and checked byte for byte
 *   dead ADDRESS N                  keys dead/i: those on the killed ADDRESS miss (then fast,
 *                                   as suspect), the others hit, singly and in a batch
 *   auth good|bad|none              against a server with a token
 *   hostile                         every call against a lying server is a miss
 *   owners N                        "key -> owner" lines, for Python to compare
 *   expect get|put KEY REASON SIZE  the call's result is the miss named REASON (or "ok")
 *   hostid                          this host's id as libgcache computes it
 * followed by --servers A,B | --master M, --transport, --token, --timeout. */
#include <pthread.h>

#include "hello.h"
#include "testing.h"

#define MAX_SIZE ((3u << 20) + 8)

static void key_of(char *key, size_t size, const char *prefix, long i)
{
    snprintf(key, size, "%s/%ld", prefix, i);
}

static const gcache_group *group_of(const char *prefix, long i, gcache_group *g, char *name)
{
    if (i % 3) return NULL;
    snprintf(name, 64, "%s-group", prefix);
    *g = (gcache_group){name, strlen(name)};
    return g;
}

static void xput(gcache *c, const char *prefix, long n)
{
    uint8_t *value = malloc(MAX_SIZE);
    for (long i = 0; i < n; i++) {
        char key[128], name[64];
        gcache_group g;
        key_of(key, sizeof key, prefix, i);
        value_of(key, value, size_of((size_t)i));
        int rc = gcache_put(c, key, strlen(key), value, size_of((size_t)i), group_of(prefix, i, &g, name), 0);
        CHECK(rc == GCACHE_OK, "put %s: %s", key, gcache_strerror(rc));
    }
    free(value);
}

static void xget(gcache *c, const char *prefix, long n)
{
    uint8_t *value = malloc(MAX_SIZE), *out = malloc(MAX_SIZE);
    gcache_item *items = calloc((size_t)n, sizeof *items);
    char (*keys)[128] = calloc((size_t)n, 128), (*names)[64] = calloc((size_t)n, 64);
    gcache_group *groups = calloc((size_t)n, sizeof *groups);
    for (long i = 0; i < n; i++) {
        key_of(keys[i], 128, prefix, i);
        size_t size = size_of((size_t)i);
        value_of(keys[i], value, size);
        const gcache_group *g = group_of(prefix, i, &groups[i], names[i]);
        int64_t got = gcache_get_into(c, keys[i], strlen(keys[i]), out, MAX_SIZE, g);
        CHECK(got == (int64_t)size && !memcmp(out, value, size), "get %s: %lld (%s)", keys[i],
              (long long)got, gcache_strerror(got));
        items[i] = (gcache_item){keys[i], strlen(keys[i]), malloc(size), size, g, 0};
    }
    CHECK(gcache_batch_get_into(c, items, (size_t)n) == n, "batch_get_into of the same keys");
    for (long i = 0; i < n; i++) {
        value_of(keys[i], value, items[i].len);
        CHECK(items[i].result == (int64_t)items[i].len && !memcmp(items[i].buf, value, items[i].len),
              "batch item %s: %lld", keys[i], (long long)items[i].result);
        free(items[i].buf);
    }
    CHECK(gcache_get_into(c, "xget/never-put", 14, out, MAX_SIZE, NULL) == GCACHE_MISS_ABSENT,
          "a key never put");
    free(value);
    free(out);
    free(items);
    free(keys);
    free(names);
    free(groups);
}

static int is_down_miss(int64_t r)
{
    return r == GCACHE_MISS_UNREACHABLE || r == GCACHE_MISS_CONNECTION_LOST ||
           r == GCACHE_MISS_TIMEOUT;
}

static void dead(gcache *c, const char *address, long n)
{
    uint8_t *value = malloc(1 << 16), *out = malloc(1 << 16);
    int on_dead = 0, first = 1;
    for (long i = 0; i < n; i++) {
        char key[64], owner[300];
        key_of(key, sizeof key, "dead", i);
        gcache_owner(c, key, strlen(key), NULL, owner, sizeof owner);
        int64_t got = gcache_get_into(c, key, strlen(key), out, 1 << 16, NULL);
        if (!strcmp(owner, address)) {
            on_dead++;
            /* the first request finds the server gone; later ones miss at once (suspect) */
            CHECK(first ? is_down_miss(got) : got == GCACHE_MISS_SUSPECT, "dead key %s: %s", key,
                  gcache_strerror(got));
            first = 0;
        } else {
            value_of(key, value, 4096);
            CHECK(got == 4096 && !memcmp(out, value, 4096), "live key %s: %s", key, gcache_strerror(got));
        }
        CHECK(gcache_put(c, key, strlen(key), value, 4096, NULL, 0) ==
              (strcmp(owner, address) ? GCACHE_OK : GCACHE_MISS_SUSPECT), "put %s", key);
    }
    CHECK(on_dead > 0 && on_dead < n, "%d of %ld keys were on the dead server", on_dead, n);
    gcache_stats st;
    gcache_get_stats(c, &st);
    CHECK(st.misses_by_reason[-GCACHE_MISS_SUSPECT] >= (uint64_t)on_dead, "suspect misses counted");
    free(value);
    free(out);
}

static void auth(gcache *c, const char *mode)
{
    uint8_t value[100] = {1}, out[100];
    int put = gcache_put(c, "auth/k", 6, value, sizeof value, NULL, 0);
    int64_t got = gcache_get_into(c, "auth/k", 6, out, sizeof out, NULL);
    if (!strcmp(mode, "good")) {
        CHECK(put == GCACHE_OK && got == (int64_t)sizeof value, "with the right token: %s %s",
              gcache_strerror(put), gcache_strerror(got));
    } else {
        CHECK(put == GCACHE_MISS_AUTH, "put without the right token: %s", gcache_strerror(put));
        /* the server is suspect after the refusal: the next call misses at once */
        CHECK(got == GCACHE_MISS_SUSPECT || got == GCACHE_MISS_AUTH, "get: %s", gcache_strerror(got));
        gcache_stats st;
        gcache_get_stats(c, &st);
        CHECK(st.misses_by_reason[-GCACHE_MISS_AUTH] >= 1, "auth misses counted");
    }
}

static void hostile(gcache *c)
{
    uint8_t value[5000] = {0}, out[5000];
    int64_t got = gcache_get_into(c, "h/a", 3, out, sizeof out, NULL);
    CHECK(GCACHE_IS_MISS(got), "get from a lying server: %lld", (long long)got);
    int put = gcache_put(c, "h/b", 3, value, sizeof value, NULL, 0);
    CHECK(GCACHE_IS_MISS(put), "put to a lying server: %d", put);
    gcache_item items[2] = {{"h/c", 3, out, sizeof out, NULL, 0}, {"h/d", 3, out, sizeof out, NULL, 0}};
    CHECK(gcache_batch_get_into(c, items, 2) == 0 && GCACHE_IS_MISS(items[0].result),
          "batch from a lying server");
    CHECK(gcache_exists(c, "h/e", 3, NULL) < 0 || gcache_exists(c, "h/e", 3, NULL) < 0,
          "exists from a lying server");
}

static void expect(gcache *c, const char *op, const char *key, const char *reason, size_t size)
{
    uint8_t *buf = calloc(size ? size : 1, 1);
    int64_t got = !strcmp(op, "put") ? gcache_put(c, key, strlen(key), buf, size, NULL, 0)
                                     : gcache_get_into(c, key, strlen(key), buf, size, NULL);
    CHECK(!strcmp(gcache_strerror(got), reason), "%s %s: %s, expected %s", op, key,
          gcache_strerror(got), reason);
    gcache_stats st;
    gcache_get_stats(c, &st);
    CHECK(got >= 0 || st.misses_by_reason[-got] == 1, "the miss counted under its reason");
    free(buf);
}

static void owners(gcache *c, long n)
{
    for (long i = 0; i < n; i++) {
        char key[64], owner[300], name[64];
        gcache_group g;
        key_of(key, sizeof key, "owners", i);
        int rc = gcache_owner(c, key, strlen(key), group_of("owners", i, &g, name), owner, sizeof owner);
        printf("%s %s\n", key, rc ? "-" : owner);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) return 2;
    const char *what = argv[1];
    if (!strcmp(what, "hostid")) {
        char id[17];
        gc_host_id(id);
        printf("%s\n", id);
        return 0;
    }
    int takes = !strcmp(what, "xput") || !strcmp(what, "xget") || !strcmp(what, "dead") ? 2
              : !strcmp(what, "auth") || !strcmp(what, "owners") ? 1
              : !strcmp(what, "expect") ? 4 : 0;
    test_args a;
    parse_args(argc, argv, 2 + takes, &a);
    gcache *c = open_or_die(&a);
    if (!strcmp(what, "xput")) xput(c, argv[2], atol(argv[3]));
    else if (!strcmp(what, "xget")) xget(c, argv[2], atol(argv[3]));
    else if (!strcmp(what, "dead")) dead(c, argv[2], atol(argv[3]));
    else if (!strcmp(what, "auth")) auth(c, argv[2]);
    else if (!strcmp(what, "hostile")) hostile(c);
    else if (!strcmp(what, "owners")) owners(c, atol(argv[2]));
    else if (!strcmp(what, "expect")) expect(c, argv[2], argv[3], argv[4], (size_t)atol(argv[5]));
    else {
        fprintf(stderr, "unknown scenario %s\n", what);
        return 2;
    }
    gcache_close(c);
    if (!strcmp(what, "owners")) return failures ? 1 : 0;
    return finish(what);
}
