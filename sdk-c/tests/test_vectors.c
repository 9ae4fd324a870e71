/* The shared conformance vectors (tests/vectors/ (JSON), which the Python SDK's test checks
 * too), against libgcache's frame codec, batch tables, checksums, AUTH proofs, HELLO facts and
 * ring. Usage: test_vectors VECTOR_DIR. */
#include "xxh.h"

#include "frame.h"
#include "hello.h"
#include "json.h"
#include "ops.h"
#include "ring.h"
#include "sha256.h"
#include "testing.h"

static gc_json *load(const char *dir, const char *name)
{
    char path[512];
    size_t len;
    const char *why = "";
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = read_file(path, &len);
    gc_json *root = text ? gc_json_parse(text, len, &why) : NULL;
    free(text);
    if (!root) {
        fprintf(stderr, "cannot read %s: %s\n", path, text ? why : "no such file");
        exit(2);
    }
    return root;
}

static const char *str(const gc_json *o, const char *key)
{
    const gc_json *v = gc_json_get(o, key);
    return v && v->kind == GC_JSON_STRING ? v->string : "";
}

static int64_t num(const gc_json *o, const char *key)
{
    const gc_json *v = gc_json_get(o, key);
    return v && v->kind == GC_JSON_NUMBER ? v->integer : -1;
}

static void frames(const gc_json *doc)
{
    uint64_t max_payload = (uint64_t)num(doc, "max_payload");
    for (const gc_json *v = gc_json_get(doc, "good")->child; v; v = v->next) {
        const gc_json *f = gc_json_get(v, "fields");
        gc_header h = {.op = (uint8_t)num(f, "op"), .flags = (uint8_t)num(f, "flags"),
                       .status = (uint8_t)num(f, "status"),
                       .request_id = (uint32_t)num(f, "request_id"),
                       .key_len = (uint16_t)num(f, "key_len"), .count = (uint16_t)num(f, "count"),
                       .payload_len = hex64(str(f, "payload_len")), .handle = hex64(str(f, "handle")),
                       .offset = hex64(str(f, "offset")), .length = hex64(str(f, "length")),
                       .checksum = hex64(str(f, "checksum")), .group = hex64(str(f, "group"))};
        uint8_t packed[GC_HEADER_SIZE];
        gc_pack_header(&h, packed);
        size_t len;
        uint8_t *want = from_hex(str(v, "header"), &len);
        CHECK(len == GC_HEADER_SIZE && !memcmp(packed, want, len), "pack %s", str(v, "name"));
        gc_header back;
        const char *why = "";
        CHECK(!gc_unpack_header(want, max_payload, &back, &why), "unpack %s: %s", str(v, "name"), why);
        CHECK(!memcmp(&back, &h, sizeof h) || (back.op == h.op && back.flags == h.flags &&
              back.status == h.status && back.request_id == h.request_id &&
              back.key_len == h.key_len && back.count == h.count &&
              back.payload_len == h.payload_len && back.handle == h.handle &&
              back.offset == h.offset && back.length == h.length &&
              back.checksum == h.checksum && back.group == h.group), "fields %s", str(v, "name"));
        free(want);
    }
    for (const gc_json *v = gc_json_get(doc, "bad")->child; v; v = v->next) {
        size_t len;
        uint8_t *raw = from_hex(str(v, "header"), &len);
        gc_header h;
        const char *why = "";
        CHECK(gc_unpack_header(raw, max_payload, &h, &why) == GCACHE_MISS_PROTOCOL,
              "refuse %s", str(v, "name"));
        free(raw);
    }
}

static void tables(const gc_json *t)
{
    const gc_json *k = gc_json_get(t, "keys");
    gc_key keys[8];
    uint8_t *owned[8];
    size_t n = 0, len, want_len;
    for (const gc_json *v = gc_json_get(k, "keys")->child; v && n < 8; v = v->next, n++) {
        owned[n] = from_hex(v->string, &len);
        keys[n] = (gc_key){owned[n], len};
    }
    uint8_t *encoded = gc_encode_keys(keys, n, &len);
    uint8_t *want = from_hex(str(k, "encoded"), &want_len);
    CHECK(len == want_len && !memcmp(encoded, want, len), "key list encoding");
    free(encoded);
    free(want);
    for (size_t i = 0; i < n; i++) free(owned[i]);
    for (const gc_json *e = gc_json_get(t, "get_entries")->child; e; e = e->next) {
        uint8_t *raw = from_hex(str(e, "encoded"), &len);
        CHECK(len == GC_GET_ENTRY && raw[0] == num(e, "status") &&
              gc_get64(raw + 1) == hex64(str(e, "length")) &&
              gc_get64(raw + 9) == hex64(str(e, "checksum")), "BATCH_GET entry");
        free(raw);
    }
    for (const gc_json *e = gc_json_get(t, "put_entries")->child; e; e = e->next) {
        uint8_t *raw = from_hex(str(e, "encoded"), &len), mine[GC_PUT_ENTRY];
        gc_put16(mine, (uint16_t)num(e, "key_len"));
        gc_put64(mine + 2, hex64(str(e, "length")));
        gc_put64(mine + 10, hex64(str(e, "checksum")));
        CHECK(len == GC_PUT_ENTRY && !memcmp(raw, mine, len), "BATCH_PUT entry");
        free(raw);
    }
    for (const gc_json *e = gc_json_get(t, "lease_entries")->child; e; e = e->next) {
        uint8_t *raw = from_hex(str(e, "encoded"), &len);
        CHECK(len == GC_LEASE_ENTRY && raw[0] == num(e, "status") &&
              gc_get64(raw + 1) == hex64(str(e, "handle")) &&
              gc_get64(raw + 9) == hex64(str(e, "offset")) &&
              gc_get64(raw + 17) == hex64(str(e, "length")) &&
              gc_get64(raw + 25) == hex64(str(e, "checksum")), "BATCH_LEASE entry");
        free(raw);
    }
}

static void checksums(const gc_json *doc)
{
    for (const gc_json *v = doc->child; v; v = v->next) {
        size_t len;
        uint8_t *data;
        const gc_json *p = gc_json_get(v, "pattern");
        if (p) {
            len = (size_t)num(p, "length");
            data = pattern(len, (uint64_t)num(p, "multiplier"), (uint64_t)num(p, "offset"));
        } else {
            data = from_hex(str(v, "data"), &len);
        }
        CHECK(XXH3_64bits(data, len) == hex64(str(v, "xxh3_64")), "xxh3_64 of %zu bytes", len);
        free(data);
    }
}

static void handshake(const gc_json *doc)
{
    for (const gc_json *v = doc->child; v; v = v->next) {
        size_t nonce_len, proof_len;
        uint8_t *nonce = from_hex(str(v, "nonce"), &nonce_len);
        uint8_t *want = from_hex(str(v, "proof"), &proof_len), proof[32];
        gc_auth_proof(str(v, "token"), nonce, nonce_len, proof);
        CHECK(proof_len == 32 && !memcmp(proof, want, 32), "AUTH proof for token '%s'",
              str(v, "token"));
        free(nonce);
        free(want);
    }
}

static void facts(const gc_json *doc)
{
    const char *kinds[] = {"good", "bad"};
    for (int good = 1; good >= 0; good--) {
        for (const gc_json *v = gc_json_get(doc, kinds[!good])->child; v; v = v->next) {
            size_t len;
            uint8_t *payload = from_hex(v->string, &len);
            gc_facts f;
            const char *why = "";
            int rc = gc_parse_facts((const char *)payload, len, &f, &why);
            CHECK(good ? rc == 0 : rc == GCACHE_MISS_PROTOCOL, "%s facts %.*s (%s)",
                  good ? "accept" : "refuse", (int)len, (const char *)payload, why);
            free(payload);
        }
    }
}

static const char *address_of(const gc_ring *r, uint32_t m)
{
    return m == GC_NO_OWNER ? NULL : (const char *)r->members[m].user;
}

static void placement(const gc_json *doc)
{
    for (const gc_json *c = doc->child; c; c = c->next) {
        gc_member members[16];
        size_t n = 0;
        for (const gc_json *m = gc_json_get(c, "members")->child; m && n < 16; m = m->next, n++)
            members[n] = (gc_member){.id = str(m, "id"), .weight = gc_json_get(m, "weight")->number,
                                     .live = gc_json_get(m, "live")->boolean,
                                     .user = (void *)str(m, "address")};
        gc_ring *r = gc_ring_new(members, n, (unsigned)num(c, "vnodes"), (unsigned)num(c, "group_width"));
        int wrong = 0, total = 0;
        for (const gc_json *l = gc_json_get(c, "lookups")->child; l; l = l->next, total++) {
            size_t klen, glen = 0;
            uint8_t *key = from_hex(str(l, "key"), &klen), *group = NULL;
            const gc_json *g = gc_json_get(l, "group");
            if (g->kind == GC_JSON_STRING) group = from_hex(g->string, &glen);
            uint32_t m = gc_ring_owner(r, key, klen, group ? gc_key_hash(group, glen) : 0);
            const gc_json *want = gc_json_get(l, "owner");
            const char *got = address_of(r, m);
            int same = want->kind == GC_JSON_NULL ? got == NULL : got && !strcmp(got, want->string);
            if (!same) {
                wrong++;
                fprintf(stderr, "  %s: key %s owner %s, want %s\n", str(c, "name"), str(l, "key"),
                        got ? got : "none", want->kind == GC_JSON_NULL ? "none" : want->string);
            }
            free(key);
            free(group);
        }
        CHECK(!wrong, "%s: %d of %d keys placed elsewhere", str(c, "name"), wrong, total);
        for (const gc_json *s = gc_json_get(c, "slots")->child; s; s = s->next) {
            size_t glen;
            uint8_t *group = from_hex(str(s, "group"), &glen);
            uint32_t slots[16];
            gc_ring_slot_owners(r, gc_key_hash(group, glen), slots);
            size_t j = 0;
            for (const gc_json *o = gc_json_get(s, "owners")->child; o; o = o->next, j++) {
                const char *got = address_of(r, slots[j]);
                CHECK(o->kind == GC_JSON_NULL ? got == NULL : got && !strcmp(got, o->string),
                      "%s: slot %zu of group %s", str(c, "name"), j, str(s, "group"));
            }
            free(group);
        }
        gc_ring_free(r);
    }
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "../tests/vectors";
    gc_json *doc = load(dir, "frames.json");
    frames(doc);
    tables(gc_json_get(doc, "tables"));
    gc_json_free(doc);
    const char *names[] = {"checksums.json", "handshake.json", "facts.json", "placement.json"};
    void (*checks_of[])(const gc_json *) = {checksums, handshake, facts, placement};
    for (int i = 0; i < 4; i++) {
        doc = load(dir, names[i]);
        checks_of[i](doc);
        gc_json_free(doc);
    }
    return finish("vectors");
}
