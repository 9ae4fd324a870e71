/* HELLO / AUTH, HELLO facts and the host id. A client trusts nothing beyond what it asked:
 * facts that are not a JSON object, a fact it acts on with the wrong type or a negative
 * number, more than one descriptor, or a descriptor it did not ask for, end the connection
 * (docs/protocol.md, "Connecting and authenticating"). */
#include "hello.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "frame.h"
#include "gcache.h"
#include "json.h"
#include "sha256.h"
#include "wire.h"

#define MAX_NONCE 256             /* a server's nonce is 16 bytes */

static int copy_string(const gc_json *v, char *out, size_t size)
{
    if (v->string_len >= size || strlen(v->string) != v->string_len) return -1;
    memcpy(out, v->string, v->string_len + 1);
    return 0;
}

int gc_parse_facts(const char *json, size_t len, gc_facts *facts, const char **why)
{
    memset(facts, 0, sizeof *facts);
    facts->lease_ttl_ms = 5000;
    gc_json *root = gc_json_parse(json, len, why);
    if (!root) return GCACHE_MISS_PROTOCOL;
    int rc = GCACHE_MISS_PROTOCOL;
    if (root->kind != GC_JSON_OBJECT) {
        *why = "HELLO facts are not a JSON object";
        goto done;
    }
    /* string facts: absent or null means "not given" */
    static const char *const strings[] = {"host_id", "unix_socket", "arena_id"};
    char *targets[] = {facts->host_id, facts->unix_socket, facts->arena_id};
    size_t sizes[] = {sizeof facts->host_id, sizeof facts->unix_socket, sizeof facts->arena_id};
    for (int i = 0; i < 3; i++) {
        const gc_json *v = gc_json_get(root, strings[i]);
        if (!v || v->kind == GC_JSON_NULL) continue;
        if (v->kind != GC_JSON_STRING || copy_string(v, targets[i], sizes[i])) {
            *why = "a HELLO string fact is not a string (or too long)";
            goto done;
        }
    }
    static const char *const ints[] = {"arena_bytes", "lease_ttl_ms"};
    uint64_t *values[] = {&facts->arena_bytes, &facts->lease_ttl_ms};
    int given[2] = {0, 0};
    for (int i = 0; i < 2; i++) {
        const gc_json *v = gc_json_get(root, ints[i]);
        if (!v || v->kind == GC_JSON_NULL) continue;
        if (v->kind != GC_JSON_NUMBER || !v->is_int || v->integer < 0) {
            *why = "a HELLO integer fact is not a non-negative integer";
            goto done;
        }
        *values[i] = (uint64_t)v->integer;
        given[i] = 1;
    }
    const gc_json *parents = gc_json_get(root, "parents");
    facts->parents = parents && parents->kind == GC_JSON_BOOL && parents->boolean;
    facts->has_arena = given[0] && facts->arena_id[0];
    rc = 0;
done:
    gc_json_free(root);
    return rc;
}

/* One round of the handshake: send op (with flags and payload), read its reply and payload. */
static int round_trip(gc_conn *c, uint8_t op, uint8_t flags, const void *payload,
                      size_t payload_len, int want_fd, gc_header *reply, char **body, int *fd)
{
    gc_header req = {.op = op, .flags = flags};
    uint8_t raw[GC_HEADER_SIZE];
    const char *why;
    int rc = gc_request(c, &req, NULL, 0, payload, payload_len);
    if (rc) return rc;
    rc = want_fd ? gc_conn_recv_fd(c, raw, sizeof raw, fd) : gc_conn_recv(c, raw, sizeof raw, NULL);
    if (rc) return rc;
    if (gc_unpack_header(raw, GC_MAX_HELLO, reply, &why) || reply->op != op ||
        reply->request_id != req.request_id || reply->key_len) {
        rc = GCACHE_MISS_PROTOCOL;
        goto failed;
    }
    *body = malloc(reply->payload_len + 1);
    if (!*body) {
        rc = GCACHE_MISS_PROTOCOL;
        goto failed;
    }
    rc = gc_conn_recv(c, *body, (size_t)reply->payload_len, NULL);
    if (rc) {
        free(*body);
        *body = NULL;
        goto failed;
    }
    (*body)[reply->payload_len] = 0;
    return 0;
failed:
    if (want_fd && *fd >= 0) {
        close(*fd);
        *fd = -1;
    }
    return rc;
}

int gc_hello(gc_conn *c, const char *token, int want_fd, gc_facts *facts, int *fd)
{
    gc_header reply;
    char *body = NULL;
    int got_fd = -1;
    const char *why;
    gc_conn_expect(c, GC_MAX_HELLO);
    int rc = round_trip(c, GC_HELLO, 0, NULL, 0, want_fd, &reply, &body, &got_fd);
    /* a tenant token ("<name>.<secret>"): the tenant's proof, then its name (flag TENANT) */
    size_t tenant = token ? gc_tenant_name_len(token) : 0;
    if (!rc && reply.status == GC_ST_AUTH_REQUIRED) {
        if (got_fd >= 0) close(got_fd);     /* a descriptor before AUTH was never asked for */
        got_fd = -1;
        if (!token) rc = GCACHE_MISS_AUTH;
        else if (reply.payload_len > MAX_NONCE) rc = GCACHE_MISS_PROTOCOL;
        else {
            uint8_t proof[32 + 32];
            size_t len = 32;
            if (tenant) {
                gc_tenant_proof(token, tenant, (const uint8_t *)body,
                                (size_t)reply.payload_len, proof);
                memcpy(proof + 32, token, tenant);
                len += tenant;
            } else {
                gc_auth_proof(token, (const uint8_t *)body, (size_t)reply.payload_len, proof);
            }
            free(body);
            body = NULL;
            rc = round_trip(c, GC_AUTH, tenant ? GC_FLAG_TENANT : 0, proof, len, want_fd,
                            &reply, &body, &got_fd);
        }
    } else if (!rc && tenant) {
        /* a server that asks for no token cannot keep a tenant's keys apart: not used */
        rc = GCACHE_MISS_AUTH;
    }
    if (!rc && reply.status != GC_ST_OK)
        rc = reply.status == GC_ST_AUTH_FAILED || reply.status == GC_ST_AUTH_REQUIRED
                 ? GCACHE_MISS_AUTH : gc_failure_miss(reply.status);
    if (!rc) rc = gc_parse_facts(body, (size_t)reply.payload_len, facts, &why);
    free(body);
    c->deadline = 0;
    if (rc && got_fd >= 0) {
        close(got_fd);
        got_fd = -1;
    }
    if (want_fd) *fd = got_fd;
    else if (got_fd >= 0) close(got_fd);
    return rc;
}

/* The first line of a file, stripped of surrounding whitespace ("" when unreadable). */
static void read_stripped(const char *path, char *out, size_t size)
{
    out[0] = 0;
    FILE *f = fopen(path, "re");
    if (!f) return;
    size_t n = fread(out, 1, size - 1, f);
    fclose(f);
    out[n] = 0;
    char *start = out;
    while (*start == ' ' || *start == '\n' || *start == '\t' || *start == '\r') start++;
    char *end = start + strlen(start);
    while (end > start && (end[-1] == ' ' || end[-1] == '\n' || end[-1] == '\t' || end[-1] == '\r'))
        end--;
    *end = 0;
    memmove(out, start, (size_t)(end - start) + 1);
}

void gc_host_id(char out[17])
{
    char machine[128], boot[128], host[256] = "", ns[32] = "", joined[600];
    struct stat st;
    read_stripped("/etc/machine-id", machine, sizeof machine);
    read_stripped("/proc/sys/kernel/random/boot_id", boot, sizeof boot);
    gethostname(host, sizeof host - 1);
    if (!stat("/proc/self/ns/net", &st)) snprintf(ns, sizeof ns, "%llu", (unsigned long long)st.st_ino);
    int n = snprintf(joined, sizeof joined, "%s|%s|%s|%s", machine, boot, host, ns);
    uint8_t digest[32];
    gc_sha256 s;
    gc_sha256_init(&s);
    gc_sha256_update(&s, joined, (size_t)n < sizeof joined ? (size_t)n : sizeof joined - 1);
    gc_sha256_final(&s, digest);
    for (int i = 0; i < 8; i++) snprintf(out + 2 * i, 3, "%02x", digest[i]);
}
