/*
 * episode.h - the episode table: live episodes by handle, in handle order.
 *
 *   map: handle -> slot (open addressing, linear probing, backward-shift delete)
 *   slab[slot]: exr_episode { handle, n, m, aux, flags, seg0, prev/next, body }
 *                                            |           |                |
 *        body->aux, copied into the slot <---+           |                |
 *        segs[0], copied into the slot <-----------------+                |
 *   body: { final_state, aux[n], nsegs, segs[0..nsegs) } <----------------+
 *                                       (store.h segments)
 *
 *   live list (prev/next slots), oldest first:  head <-> ... <-> tail
 *
 * Handles grow from 0 and are never reused; slots are reused through a free
 * list, so a pick can name its episode in 4 bytes. The body is a separate
 * allocation so that an evicted episode's storage can be parked (pinned by a
 * concurrent get_batch copy) while its slot is already reused.
 *
 * Costs: find, insert, remove O(1) expected; iteration in handle order O(1)
 * a step.
 */
#ifndef EXR_EPISODE_H
#define EXR_EPISODE_H

#include <stdbool.h>

#include "exr.h"

typedef struct exr_body {
    struct exr_body *next_dead; /* graveyard link (buffer_graveyard.c) */
    uint64_t epoch;             /* when it was buried */
    unsigned char *final_state; /* NULL if none */
    uint32_t *aux;              /* per record: pending priority (float) or pick index */
    uint64_t aux_cap;
    uint64_t n_pub, m_pub;      /* while its episode is busy: records and picks published */
    uint32_t last_rows;         /* rows allocated in segs[nsegs - 1]: at most its nominal size */
    uint32_t nsegs, cap;
    unsigned char *segs[];
} exr_body;

typedef struct {
    _Alignas(64) int64_t handle; /* a slot is one 64-byte line (the slab is line-aligned) */
    uint32_t n;                 /* records: at most 2^32 - 2 (record and load refuse more) */
    uint32_t m;                 /* picks: positions [0, m) */
    /* body->aux, NULL while there is no body: a pick's table index is
     * found from the slot (set_priority by handle and position) without
     * reading the body. Kept by exr_episode_sync wherever the body or its
     * aux array is set or moved; _check verifies it */
    uint32_t *aux;
    uint8_t ended, terminated, sampled;
    uint8_t busy;               /* a record call is copying into it (buffer_record.c) */
    uint8_t sim;                /* marks of an eviction dry run (evict.c); 0 outside one */
    /* body->segs[0], NULL while the body holds no segment: get_batch's plan
     * reaches the rows of a pick in segment 0 (every pick of an episode
     * shorter than segment 0) from the slot, without reading the body.
     * Kept by exr_episode_sync wherever segment 0 is set or moved;
     * _check verifies it */
    unsigned char *seg0;
    uint32_t prev, next;        /* live list, EXR_NIL at the ends; free list uses next */
    exr_body *body;
    uint64_t fill;              /* exr_episodes.seq when it was inserted */
} exr_episode;

/* Copies the body's first segment pointer and aux array into the slot
 * (exr_episode.seg0, exr_episode.aux). */
static inline void exr_episode_sync(exr_episode *e)
{
    e->seg0 = e->body && e->body->nsegs ? e->body->segs[0] : NULL;
    e->aux = e->body ? e->body->aux : NULL;
}

/* A cell of the map: a lookup reads one line for the key and its slot. */
typedef struct {
    int64_t key;
    uint32_t val;
} exr_map_cell;

typedef struct {
    /* written only when the table grows (a sampler reads these at every
     * call: a line of their own, away from the counters below) */
    exr_episode *slab;
    uint32_t cap, hwm;
    exr_map_cell *map;          /* handle -> slot; key -1 = empty */
    /* direct[h & (map_cap - 1)]: the slot of the live handle h last
     * inserted with those low bits, or EXR_NIL: handles are dense, so a
     * batch's lookups mostly end here, in 4 bytes a handle, before the map
     * (an answer counts only where the slot's handle is h) */
    uint32_t *direct;
    size_t map_cap;
    /* written by every record call that inserts or evicts */
    EXR_LINE uint32_t free_head;
    uint32_t head, tail;        /* oldest and newest live episode */
    uint64_t count;
    size_t map_used;
    uint32_t hint;              /* the slot last inserted or recorded into: tried before the map */
    /* The number of the exclusive hold under way (the buffer counts them:
     * took_exclusive), given to the episodes it inserts (exr_episode.fill):
     * a slot filled at or before hold k holds the episode it held then. */
    uint64_t seq;
} exr_episodes;

void exr_episodes_init(exr_episodes *t);
/* Frees the table and every live episode's body. */
void exr_episodes_free(exr_episodes *t);

/* Slot of a live episode, EXR_NIL if none. The hint slot is tried first:
 * it holds the episode when its handle matches, since handles are never
 * reused and a freed slot's handle is -1. A record call sets the hint
 * (exr_episodes_hint) to the episode it recorded into, so that an actor's
 * next step skips the map's keyed hash. */
uint32_t exr_episodes_find(const exr_episodes *t, int64_t handle);
/* slots[i] = exr_episodes_find(t, handles[i]) for i < n, found in passes
 * whose misses overlap: faster for a batch of scattered handles. */
void exr_episodes_find_many(const exr_episodes *t, size_t n, const int64_t *handles,
                            size_t *slots);
/* Makes slot s (live) the hint. Changes the table: exclusive lock. */
static inline void exr_episodes_hint(exr_episodes *t, uint32_t s) { t->hint = s; }

/* How far live handles sit from their home slot in the map (linear
 * probing): the mean and the largest distance, i.e. the probes a lookup
 * takes beyond the first. O(map size); a test hook against chosen keys. */
void exr_episodes_probe_stats(const exr_episodes *t, double *mean, uint64_t *max);

/* Room for one more episode (slab and map); afterwards insert cannot fail. */
exr_status exr_episodes_reserve(exr_episodes *t);
/* Room for n more; EXR_EOVERFLOW past the table's limit. */
exr_status exr_episodes_reserve_n(exr_episodes *t, uint64_t n);
/* How many episodes can be inserted without a reserve. */
uint64_t exr_episodes_room(const exr_episodes *t);
/* A new live episode with this handle (larger than any before) and body;
 * returns its slot. Requires a successful reserve. */
uint32_t exr_episodes_insert(exr_episodes *t, int64_t handle, exr_body *body);
/* Unlinks the episode; its body is the caller's to free or park. */
void exr_episodes_remove(exr_episodes *t, uint32_t slot);

/* An empty body with room for `cap` segment pointers. */
exr_body *exr_body_new(uint32_t cap);
/* body with room for at least cap segments (may move it); NULL on failure,
 * the old body then intact. */
exr_body *exr_body_grow(exr_body *b, uint32_t cap);
void exr_body_free(exr_body *b);

#endif
