/* A small strict JSON (RFC 8259) reader for what servers send: HELLO facts and STAT. The
 * input is untrusted, so depth and size are bounded and every byte is checked; the tests read
 * their vector files with it too. Values live in one allocation freed by gc_json_free. */
#ifndef GC_JSON_H
#define GC_JSON_H

#include <stddef.h>
#include <stdint.h>

enum gc_json_kind { GC_JSON_NULL, GC_JSON_BOOL, GC_JSON_NUMBER, GC_JSON_STRING, GC_JSON_ARRAY,
                    GC_JSON_OBJECT };

typedef struct gc_json gc_json;
struct gc_json {
    enum gc_json_kind kind;
    int boolean;
    int is_int;                 /* a number written without fraction or exponent that fits */
    int64_t integer;
    double number;
    char *string;               /* NUL-terminated (GC_JSON_STRING; also an object member's key) */
    size_t string_len;
    char *key;                  /* this value's name inside its object */
    gc_json *child;             /* first element or member */
    gc_json *next;              /* next sibling */
    size_t count;               /* elements or members */
};

#define GC_JSON_MAX_DEPTH 32

/* Parses text[0..len); NULL on any error (why says what). */
gc_json *gc_json_parse(const char *text, size_t len, const char **why);
void gc_json_free(gc_json *root);

/* The member named key of an object, or NULL. */
const gc_json *gc_json_get(const gc_json *object, const char *key);

#endif
