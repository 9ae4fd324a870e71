/* Placement (docs/protocol.md, "Placement"): the consistent-hash ring every party builds the
 * same way, so a key goes to the same server from either SDK and from a draining server.
 * Immutable once built; a new map builds a new ring (readers hold a reference). */
#ifndef GC_RING_H
#define GC_RING_H

#include <stddef.h>
#include <stdint.h>

#define GC_NO_OWNER UINT32_MAX

typedef struct gc_member {
    const char *id;               /* the ring's name for it: its id (masters) or its address */
    double weight;                /* capacity weight, any positive unit */
    int live;                     /* owns keys */
    void *user;                   /* the client's server record */
} gc_member;

typedef struct gc_ring {
    size_t n_members;
    gc_member *members;           /* sorted by id */
    size_t n_points;
    uint64_t *points;             /* sorted */
    uint32_t *owner;              /* member index of each point */
    uint32_t *live_owner;         /* first live member at or clockwise of each point */
    unsigned vnodes, group_width;
} gc_ring;

/* A ring over members (copied; ids are copied too). Weights are summed in the order given
 * (the map's order), as the reference does. NULL when out of memory. */
gc_ring *gc_ring_new(const gc_member *members, size_t count, unsigned vnodes,
                     unsigned group_width);
void gc_ring_free(gc_ring *ring);

/* The member index owning key (group_hash 0: placed by itself), or GC_NO_OWNER. */
uint32_t gc_ring_owner(const gc_ring *ring, const void *key, size_t key_len, uint64_t group_hash);

/* The live owner of each of a group's group_width slots (compute once, place many keys). */
void gc_ring_slot_owners(const gc_ring *ring, uint64_t group_hash, uint32_t *slots);

uint64_t gc_key_hash(const void *data, size_t len);  /* xxh3_64, seed 0 */

#endif
