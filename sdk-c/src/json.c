/* Recursive-descent JSON reader. Nodes and decoded strings come from one growing pool per
 * document (a linked list of blocks), so a hostile document costs at most a few times its own
 * size and a failed parse frees everything at once. */
#include "json.h"

#include <stdlib.h>
#include <string.h>

typedef struct block {
    struct block *next;
    size_t used, size;
    _Alignas(16) unsigned char data[];
} block;

typedef struct parser {
    const char *p, *end;
    block *pool;
    const char *why;
    int depth;
} parser;

/* The pool pointer is kept in front of the root so gc_json_free finds it. */
typedef struct document {
    block *pool;
    gc_json root;
} document;

static void *take(parser *ps, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!ps->pool || ps->pool->size - ps->pool->used < n) {
        size_t size = n > 4096 ? n : 4096;
        block *b = malloc(sizeof(block) + size);
        if (!b) {
            ps->why = "out of memory";
            return NULL;
        }
        b->next = ps->pool;
        b->used = 0;
        b->size = size;
        ps->pool = b;
    }
    void *out = ps->pool->data + ps->pool->used;
    ps->pool->used += n;
    memset(out, 0, n);
    return out;
}

static void skip_space(parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int fail(parser *ps, const char *why)
{
    if (!ps->why) ps->why = why;
    return -1;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *out, unsigned cp)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string at ps->p (the opening quote); decoded into the pool. Escapes never lengthen it
 * (a 6-byte \u escape decodes to at most 3 bytes, a 12-byte pair to 4). */
static int parse_string(parser *ps, char **out, size_t *out_len)
{
    const char *start = ++ps->p;
    while (ps->p < ps->end && *ps->p != '"') {
        if (*ps->p == '\\' && ps->end - ps->p > 1) ps->p++;
        ps->p++;
    }
    if (ps->p >= ps->end) return fail(ps, "unterminated string");
    size_t raw = (size_t)(ps->p - start);
    char *s = take(ps, raw + 1);
    if (!s) return -1;
    size_t n = 0;
    for (const char *q = start; q < ps->p;) {
        unsigned char c = (unsigned char)*q;
        if (c < 0x20) return fail(ps, "control character in string");
        if (c != '\\') {
            s[n++] = (char)c;
            q++;
            continue;
        }
        q++;
        switch (*q) {
        case '"': s[n++] = '"'; q++; break;
        case '\\': s[n++] = '\\'; q++; break;
        case '/': s[n++] = '/'; q++; break;
        case 'b': s[n++] = '\b'; q++; break;
        case 'f': s[n++] = '\f'; q++; break;
        case 'n': s[n++] = '\n'; q++; break;
        case 'r': s[n++] = '\r'; q++; break;
        case 't': s[n++] = '\t'; q++; break;
        case 'u': {
            unsigned cp, low;
            if (ps->p - q < 5 || hex4(q + 1, &cp)) return fail(ps, "bad \\u escape");
            q += 5;
            if (cp >= 0xD800 && cp < 0xDC00 && ps->p - q >= 6 && q[0] == '\\' && q[1] == 'u' &&
                !hex4(q + 2, &low) && low >= 0xDC00 && low < 0xE000) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                q += 6;
            }
            n += put_utf8(s + n, cp);
            break;
        }
        default: return fail(ps, "bad escape");
        }
    }
    s[n] = 0;
    ps->p++;                                   /* the closing quote */
    *out = s;
    *out_len = n;
    return 0;
}

static int parse_number(parser *ps, gc_json *v)
{
    const char *start = ps->p;
    int integral = 1;
    if (ps->p < ps->end && *ps->p == '-') ps->p++;
    if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad number");
    if (*ps->p == '0') ps->p++;
    else while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    if (ps->p < ps->end && *ps->p == '.') {
        integral = 0;
        ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad fraction");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        integral = 0;
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) ps->p++;
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9') return fail(ps, "bad exponent");
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') ps->p++;
    }
    size_t n = (size_t)(ps->p - start);
    char text[64];
    if (n >= sizeof text) {                 /* too many digits for any field we read */
        v->kind = GC_JSON_NUMBER;
        v->number = 0;
        return 0;
    }
    memcpy(text, start, n);
    text[n] = 0;
    v->kind = GC_JSON_NUMBER;
    v->number = strtod(text, NULL);
    if (integral && n <= 18) {              /* 18 digits always fit an int64 */
        v->is_int = 1;
        v->integer = strtoll(text, NULL, 10);
    }
    return 0;
}

static int parse_value(parser *ps, gc_json *v);

static int parse_members(parser *ps, gc_json *v, int object)
{
    char close = object ? '}' : ']';
    gc_json **tail = &v->child;
    ps->p++;
    skip_space(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        gc_json *item = take(ps, sizeof *item);
        if (!item) return -1;
        skip_space(ps);
        if (object) {
            size_t klen;
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, "object key is not a string");
            if (parse_string(ps, &item->key, &klen)) return -1;
            skip_space(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, "missing ':'");
            ps->p++;
        }
        if (parse_value(ps, item)) return -1;
        *tail = item;
        tail = &item->next;
        v->count++;
        skip_space(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            return 0;
        }
        return fail(ps, object ? "missing ',' or '}'" : "missing ',' or ']'");
    }
}

static int literal(parser *ps, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n)) return fail(ps, "bad literal");
    ps->p += n;
    return 0;
}

static int parse_value(parser *ps, gc_json *v)
{
    skip_space(ps);
    if (ps->p >= ps->end) return fail(ps, "unexpected end");
    switch (*ps->p) {
    case '{':
    case '[': {
        if (++ps->depth > GC_JSON_MAX_DEPTH) return fail(ps, "nested too deep");
        v->kind = *ps->p == '{' ? GC_JSON_OBJECT : GC_JSON_ARRAY;
        int rc = parse_members(ps, v, v->kind == GC_JSON_OBJECT);
        ps->depth--;
        return rc;
    }
    case '"':
        v->kind = GC_JSON_STRING;
        return parse_string(ps, &v->string, &v->string_len);
    case 't':
        v->kind = GC_JSON_BOOL;
        v->boolean = 1;
        return literal(ps, "true");
    case 'f':
        v->kind = GC_JSON_BOOL;
        return literal(ps, "false");
    case 'n':
        v->kind = GC_JSON_NULL;
        return literal(ps, "null");
    default:
        return parse_number(ps, v);
    }
}

static void free_pool(block *b)
{
    while (b) {
        block *next = b->next;
        free(b);
        b = next;
    }
}

gc_json *gc_json_parse(const char *text, size_t len, const char **why)
{
    parser ps = {.p = text, .end = text + len};
    document *doc = take(&ps, sizeof *doc);
    if (!doc || parse_value(&ps, &doc->root)) goto failed;
    skip_space(&ps);
    if (ps.p != ps.end) {
        fail(&ps, "trailing bytes after the value");
        goto failed;
    }
    doc->pool = ps.pool;
    return &doc->root;
failed:
    *why = ps.why ? ps.why : "bad JSON";
    free_pool(ps.pool);
    return NULL;
}

void gc_json_free(gc_json *root)
{
    if (!root) return;
    document *doc = (document *)((char *)root - offsetof(document, root));
    free_pool(doc->pool);
}

const gc_json *gc_json_get(const gc_json *object, const char *key)
{
    if (!object || object->kind != GC_JSON_OBJECT) return NULL;
    const gc_json *found = NULL;
    for (const gc_json *m = object->child; m; m = m->next)
        if (!strcmp(m->key, key)) found = m;     /* the last of repeated names, as Python's */
    return found;
}
