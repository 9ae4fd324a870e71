/* Grouping a batch's items into requests under one snapshot of the ring: each item's owner
 * (a group's slots are placed once and reused while items share the group, as a batch's keys
 * mostly do), then one request per (server, group for puts), split at GC_BATCH_MAX keys. */
#include <stdlib.h>

#include "batch.h"
#include "frame.h"

/* The owner of item i, reusing the slots of the last group placed (a batch's keys mostly
 * share one group). Caller holds c->lock. */
static gc_server *owner_of(batch *b, size_t i, uint64_t *last_group, uint32_t **slots)
{
    gcache *c = b->c;
    const gcache_item *it = &b->items[i];
    uint64_t g = b->groups[i];
    if (!c->ring) return NULL;
    if (!g) return gc_owner_locked(c, it->key, it->key_len, 0);
    if (!*slots || *last_group != g) {
        free(*slots);
        *slots = malloc(c->ring->group_width * sizeof **slots);
        if (!*slots) return NULL;
        gc_ring_slot_owners(c->ring, g, *slots);
        *last_group = g;
    }
    uint32_t m = (*slots)[gc_key_hash(it->key, it->key_len) % c->ring->group_width];
    return m == GC_NO_OWNER ? NULL : c->ring->members[m].user;
}

void gc_free_requests(request *r)
{
    while (r) {
        request *next = r->next;
        free(r->idx);
        free(r);
        r = next;
    }
}

/* Items [from, to) grouped into requests; NULL when out of memory. */
request *gc_plan(batch *b, size_t from, size_t to, int *failed)
{
    request *head = NULL;
    uint64_t last_group = 0;
    uint32_t *slots = NULL;
    *failed = 0;
    pthread_mutex_lock(&b->c->lock);
    for (size_t i = from; i < to && !*failed; i++) {
        gc_server *s = owner_of(b, i, &last_group, &slots);
        uint64_t g = b->kind == GC_KIND_PUT ? b->groups[i] : 0;
        request *r = head;
        while (r && (r->server != s || r->group != g || r->n == GC_BATCH_MAX)) r = r->next;
        if (!r && (r = calloc(1, sizeof *r))) {
            *r = (request){.b = b, .server = s, .group = g, .next = head};
            head = r;
        }
        if (r && r->n == r->cap) {
            size_t cap = r->cap ? 2 * r->cap : 16, *idx = realloc(r->idx, cap * sizeof *idx);
            if (idx) {
                r->idx = idx;
                r->cap = cap;
            }
        }
        if (!r || r->n == r->cap) *failed = 1;
        else r->idx[r->n++] = i;
    }
    pthread_mutex_unlock(&b->c->lock);
    free(slots);
    if (*failed) {
        gc_free_requests(head);
        return NULL;
    }
    return head;
}

