/* The ring (docs/protocol.md, "Placement"). Each member gets max(1, round_half_even(vnodes *
 * weight / mean weight)) points at xxh3_64("<id>#<i>"); points sort by (hash, id). A key's
 * owner is the first live member at or clockwise of xxh3_64(key). A group's slot j is anchored
 * at xxh3_64(u64 group_hash || u16 j) and given the first member clockwise not already given
 * an earlier slot (any member, live or not, so a departure moves only its own slots); a slot
 * whose member is not live falls to the first live member clockwise of its anchor. A key of
 * the group goes to slot xxh3_64(key) mod group_width. */
#include "ring.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "xxh.h"

#include "frame.h"

uint64_t gc_key_hash(const void *data, size_t len) { return XXH3_64bits(data, len); }

typedef struct point {
    uint64_t hash;
    uint32_t member;
    const char *id;               /* ties on hash are broken by id, as the reference sorts */
} point;

static int by_point(const void *a, const void *b)
{
    const point *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return strcmp(x->id, y->id);
}

static int by_id(const void *a, const void *b)
{
    return strcmp(((const gc_member *)a)->id, ((const gc_member *)b)->id);
}

void gc_ring_free(gc_ring *ring)
{
    if (!ring) return;
    for (size_t i = 0; i < ring->n_members; i++) free((char *)ring->members[i].id);
    free(ring->members);
    free(ring->points);
    free(ring->owner);
    free(ring->live_owner);
    free(ring);
}

/* round() of the reference: halves go to the even neighbour (the default FP rounding mode). */
static long points_of(unsigned vnodes, double weight, double mean)
{
    double n = nearbyint((double)vnodes * weight / mean);
    return n >= 1 && n <= 1e9 ? (long)n : 1;   /* (a zero mean, a NaN: one point, no UB) */
}

gc_ring *gc_ring_new(const gc_member *members, size_t count, unsigned vnodes,
                     unsigned group_width)
{
    gc_ring *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->vnodes = vnodes;
    r->group_width = group_width ? group_width : 1;
    double sum = 0;
    for (size_t i = 0; i < count; i++) sum += members[i].weight;
    double mean = count ? sum / (double)count : 1.0;
    r->members = calloc(count ? count : 1, sizeof *r->members);
    if (!r->members) goto failed;
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
        r->members[i] = members[i];
        r->members[i].id = strdup(members[i].id);
        r->n_members++;
        if (!r->members[i].id) goto failed;
        total += (size_t)points_of(vnodes, members[i].weight, mean);
    }
    /* the points' member indices refer to the sorted members */
    qsort(r->members, count, sizeof *r->members, by_id);
    point *pts = malloc((total ? total : 1) * sizeof *pts);
    r->points = malloc((total ? total : 1) * sizeof *r->points);
    r->owner = malloc((total ? total : 1) * sizeof *r->owner);
    r->live_owner = malloc((total ? total : 1) * sizeof *r->live_owner);
    if (!pts || !r->points || !r->owner || !r->live_owner) {
        free(pts);
        goto failed;
    }
    char name[1100];
    for (size_t m = 0; m < count; m++) {
        long n = points_of(vnodes, r->members[m].weight, mean);
        for (long i = 0; i < n; i++) {
            int len = snprintf(name, sizeof name, "%s#%ld", r->members[m].id, i);
            pts[r->n_points].hash = gc_key_hash(name, (size_t)len < sizeof name ? (size_t)len : sizeof name - 1);
            pts[r->n_points].id = r->members[m].id;
            pts[r->n_points++].member = (uint32_t)m;
        }
    }
    qsort(pts, r->n_points, sizeof *pts, by_point);
    for (size_t i = 0; i < r->n_points; i++) {
        r->points[i] = pts[i].hash;
        r->owner[i] = pts[i].member;
    }
    free(pts);
    /* the first live member at or after each point; past the last point the ring wraps */
    uint32_t after = GC_NO_OWNER;
    for (size_t i = 0; i < r->n_points && after == GC_NO_OWNER; i++)
        if (r->members[r->owner[i]].live) after = r->owner[i];
    for (size_t i = r->n_points; i-- > 0;) {
        if (r->members[r->owner[i]].live) after = r->owner[i];
        r->live_owner[i] = after;
    }
    return r;
failed:
    gc_ring_free(r);
    return NULL;
}

/* The index of the first point >= hash (n_points when none). */
static size_t bisect_left(const gc_ring *r, uint64_t hash)
{
    size_t lo = 0, hi = r->n_points;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->points[mid] < hash) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static uint32_t first_live(const gc_ring *r, uint64_t hash)
{
    if (!r->n_points) return GC_NO_OWNER;
    return r->live_owner[bisect_left(r, hash) % r->n_points];
}

/* The first member clockwise of hash not in taken[] (GC_NO_OWNER when every member is). */
static uint32_t first_untaken(const gc_ring *r, uint64_t hash, const uint8_t *taken)
{
    size_t start = bisect_left(r, hash);
    for (size_t step = 0; step < r->n_points; step++) {
        uint32_t m = r->owner[(start + step) % r->n_points];
        if (!taken[m]) return m;
    }
    return GC_NO_OWNER;
}

void gc_ring_slot_owners(const gc_ring *r, uint64_t group_hash, uint32_t *slots)
{
    uint8_t *taken = calloc(r->n_members ? r->n_members : 1, 1);
    for (unsigned j = 0; j < r->group_width; j++) {
        uint8_t packed[10];
        gc_put64(packed, group_hash);
        gc_put16(packed + 8, (uint16_t)j);
        uint64_t anchor = gc_key_hash(packed, sizeof packed);
        uint32_t m = GC_NO_OWNER;
        if (taken) m = first_untaken(r, anchor, taken);
        if (m == GC_NO_OWNER && r->n_points)      /* fewer members than slots */
            m = r->owner[bisect_left(r, anchor) % r->n_points];
        if (m != GC_NO_OWNER && taken) taken[m] = 1;
        slots[j] = m != GC_NO_OWNER && r->members[m].live ? m : first_live(r, anchor);
    }
    free(taken);
}

uint32_t gc_ring_owner(const gc_ring *r, const void *key, size_t key_len, uint64_t group_hash)
{
    uint64_t h = gc_key_hash(key, key_len);
    if (!group_hash) return first_live(r, h);
    uint32_t stack[16], *slots = r->group_width <= 16 ? stack : malloc(r->group_width * sizeof *slots);
    if (!slots) return GC_NO_OWNER;
    gc_ring_slot_owners(r, group_hash, slots);
    uint32_t owner = slots[h % r->group_width];
    if (slots != stack) free(slots);
    return owner;
}
