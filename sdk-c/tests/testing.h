/* A few helpers for the C test programs: CHECK counts and reports failures (the program goes
 * on, so one run lists every broken case), hex decoding, files read whole. */
#ifndef GC_TESTING_H
#define GC_TESTING_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xxh.h"

#include "gcache.h"

static int checks, failures;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        checks++;                                                                             \
        if (!(cond)) {                                                                        \
            failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                   \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
        }                                                                                     \
    } while (0)

static inline int finish(const char *what)
{
    printf("%s: %d checks, %d failed\n", what, checks, failures);
    return failures ? 1 : 0;
}

/* Decodes hex into a malloc'd buffer (*len bytes); NULL on bad hex. */
static inline uint8_t *from_hex(const char *hex, size_t *len)
{
    size_t n = strlen(hex) / 2;
    uint8_t *out = malloc(n ? n : 1);
    for (size_t i = 0; out && i < n; i++) {
        unsigned v;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            free(out);
            return NULL;
        }
        out[i] = (uint8_t)v;
    }
    *len = n;
    return out;
}

static inline uint64_t hex64(const char *hex) { return strtoull(hex, NULL, 16); }

static inline char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    *len = (size_t)n;
    return buf;
}

/* The bytes (i * multiplier + offset) & 0xFF, as the vectors' "pattern" describes. */
static inline uint8_t *pattern(size_t length, uint64_t multiplier, uint64_t offset)
{
    uint8_t *out = malloc(length ? length : 1);
    for (size_t i = 0; out && i < length; i++) out[i] = (uint8_t)((i * multiplier + offset) & 0xFF);
    return out;
}


/* The value every test puts under key (both languages make the same bytes: test_sdk_c.py's
 * value_of): byte j is (seed + 7 j + (j >> 8)) & 0xFF, seed the key's xxh3_64 low byte. */
static inline void value_of(const char *key, uint8_t *out, size_t size)
{
    uint64_t seed = XXH3_64bits(key, strlen(key)) & 0xFF;
    for (size_t j = 0; j < size; j++) out[j] = (uint8_t)((seed + 7 * j + (j >> 8)) & 0xFF);
}

/* The size of the i-th value of a cross-language run. */
static inline size_t size_of(size_t i)
{
    static const size_t sizes[] = {1, 100, 4095, 4096, 65537, 1 << 20, (1 << 20) + 3, 3 << 20};
    return sizes[i % (sizeof sizes / sizeof *sizes)];
}

/* Options from "--servers A,B --master M --transport tcp|shm|auto --token T --timeout S". */
typedef struct test_args {
    const char *servers, *master;
    gcache_options options;
} test_args;

static inline void log_line(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "libgcache: %s\n", line);
}

static inline void parse_args(int argc, char **argv, int from, test_args *a)
{
    memset(a, 0, sizeof *a);
    gcache_options_init(&a->options);
    a->options.timeout_s = 2.0;
    a->options.log = log_line;          /* on stderr: shown when a test fails */
    for (int i = from; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--servers")) a->servers = argv[i + 1];
        else if (!strcmp(argv[i], "--master")) a->master = argv[i + 1];
        else if (!strcmp(argv[i], "--token")) a->options.token = argv[i + 1];
        else if (!strcmp(argv[i], "--timeout")) a->options.timeout_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--suspect")) a->options.suspect_s = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--transport"))
            a->options.transport = !strcmp(argv[i + 1], "tcp") ? GCACHE_TRANSPORT_TCP
                                 : !strcmp(argv[i + 1], "shm") ? GCACHE_TRANSPORT_SHM
                                                                : GCACHE_TRANSPORT_AUTO;
    }
}

static inline gcache *open_or_die(test_args *a)
{
    gcache *c;
    char error[256];
    int rc = gcache_open(a->servers, a->master, &a->options, &c, error, sizeof error);
    if (rc) {
        fprintf(stderr, "gcache_open: %s (%s)\n", gcache_strerror(rc), error);
        exit(2);
    }
    return c;
}

#endif
