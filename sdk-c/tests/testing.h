/* A few helpers for the C test programs: CHECK counts and reports failures (the program goes
 * on, so one run lists every broken case), hex decoding, files read whole. */
#ifndef GC_TESTING_H
#define GC_TESTING_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
