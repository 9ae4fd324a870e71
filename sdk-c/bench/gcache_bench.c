/* libgcache's figures for bench/dataplane.py: one thread putting and reading (get_into) 16
 * distinct values round robin, the best of --repeat runs of --ops operations each, as the
 * Python SDK's rows are timed (bench/timing.py). Prints one JSON line of GB/s.
 * Usage: gcache_bench --servers HOST:PORT --transport tcp|shm --size BYTES --ops N --repeat R */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gcache.h"

#define KEYS 16

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    const char *servers = NULL, *transport = "tcp";
    size_t size = 1 << 20;
    long ops = 64, repeat = 3;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers")) servers = argv[i + 1];
        else if (!strcmp(argv[i], "--transport")) transport = argv[i + 1];
        else if (!strcmp(argv[i], "--size")) size = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--ops")) ops = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--repeat")) repeat = atol(argv[i + 1]);
    }
    gcache_options o;
    gcache_options_init(&o);
    o.timeout_s = 5.0;
    o.transport = !strcmp(transport, "shm") ? GCACHE_TRANSPORT_SHM : GCACHE_TRANSPORT_TCP;
    gcache *c;
    char error[256];
    if (!servers || gcache_open(servers, NULL, &o, &c, error, sizeof error)) {
        fprintf(stderr, "gcache_bench: cannot open %s: %s\n", servers ? servers : "(no --servers)", error);
        return 2;
    }
    uint8_t *value = malloc(size), *out = malloc(size);
    srand((unsigned)size);
    for (size_t i = 0; i < size; i++) value[i] = (uint8_t)rand();
    char keys[KEYS][64];
    for (int k = 0; k < KEYS; k++) {
        snprintf(keys[k], sizeof keys[k], "cbench/%zu/%d", size, k);
        if (gcache_put(c, keys[k], strlen(keys[k]), value, size, NULL, 0) != GCACHE_OK) {
            fprintf(stderr, "gcache_bench: put of %s failed\n", keys[k]);
            return 1;
        }
    }
    double best_put = 0, best_get = 0;
    for (long r = 0; r < repeat; r++) {
        double start = now();
        for (long i = 0; i < ops; i++) {
            const char *key = keys[i % KEYS];
            if (gcache_put(c, key, strlen(key), value, size, NULL, 0) != GCACHE_OK) return 1;
        }
        double put = (double)ops * (double)size / (now() - start) / 1e9;
        start = now();
        for (long i = 0; i < ops; i++) {
            const char *key = keys[i % KEYS];
            if (gcache_get_into(c, key, strlen(key), out, size, NULL) != (int64_t)size) return 1;
        }
        double get = (double)ops * (double)size / (now() - start) / 1e9;
        best_put = put > best_put ? put : best_put;
        best_get = get > best_get ? get : best_get;
    }
    const char *used = gcache_transport_of(c, servers);
    printf("{\"transport\": \"%s\", \"put_t1\": %.4f, \"get_into_t1\": %.4f}\n", used ? used : "",
           best_put, best_get);
    free(value);
    free(out);
    gcache_close(c);
    return 0;
}
