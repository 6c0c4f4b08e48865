/*
 * store.h - chunked record storage. Every episode keeps its records in its
 * own segments; a segment holds consecutive records as rows:
 *
 *   segment k: positions [start_k, start_k + cap_k), cap_k = 2^min(base_shift + k, max_shift)
 *   +------------------------------------------------------------+
 *   | row 0: state|action|reward[|extras]  row 1: ...  (cap_k rows) |
 *   +------------------------------------------------------------+
 *   (a row is sb + ab + rb + eb bytes; eb = 0 without extras, fields.h)
 *
 * Rows rather than one column per field: a pick of L steps and its next
 * state are one run of L + 1 rows, so get_batch reads one stream of
 * adjacent lines from memory instead of three (the stream is what the
 * hardware prefetcher follows, and what misses cost at large N). And a
 * segment's layout does not depend on how many rows it has room for, so
 * the last segment of an episode can be allocated smaller than cap_k and
 * grown (buffer_record.c): a short episode never holds the room of a long one.
 *
 * Segments double in size up to about 1 MiB, then stay that size: a short
 * episode wastes little, and a long one never reallocates what it holds
 * (no giant realloc, docs/semantics.md). Every segment holds at least pick_len + 1
 * records, so a pick and its next states span at most two segments: one or
 * two memcpy per column.
 *
 * cap_k is a segment's nominal size: every segment but an episode's last has
 * exactly that many rows.
 */
#ifndef EXR_STORE_H
#define EXR_STORE_H

#include "exr.h"
#include "seg_heap.h"

typedef struct {
    size_t state_bytes, action_bytes, reward_bytes;
    size_t extra_bytes; /* per-step extras after the reward (fields.h); 0: none */
    size_t row_bytes; /* state_bytes + action_bytes + reward_bytes + extra_bytes */
    unsigned base_shift, max_shift;
} exr_store_layout;

/* Fills the layout; EXR_EOVERFLOW if a segment's size would not fit. */
exr_status exr_store_layout_init(exr_store_layout *L, size_t state_bytes, size_t action_bytes,
                                 size_t reward_bytes, size_t extra_bytes, uint32_t pick_len);

static inline unsigned exr_store_shift(const exr_store_layout *L, size_t k)
{
    size_t s = L->base_shift + k;
    return s < L->max_shift ? (unsigned)s : L->max_shift;
}

/* Segment k and offset within it of record position p. O(1). */
static inline void exr_store_locate(const exr_store_layout *L, uint64_t p, size_t *k, size_t *off)
{
    unsigned B = L->base_shift, G = L->max_shift - L->base_shift;
    uint64_t grow_end = (((uint64_t)1 << G) - 1) << B; /* records in the growing segments */
    if (p < grow_end) {
        uint64_t q = (p >> B) + 1;
        unsigned kk = 63u - (unsigned)__builtin_clzll(q);
        *k = kk;
        *off = (size_t)(p - ((((uint64_t)1 << kk) - 1) << B));
    } else {
        uint64_t r = p - grow_end;
        *k = G + (size_t)(r >> L->max_shift);
        *off = (size_t)(r & (((uint64_t)1 << L->max_shift) - 1));
    }
}

static inline size_t exr_store_seg_cap(const exr_store_layout *L, size_t k)
{
    return (size_t)1 << exr_store_shift(L, k);
}

/* A segment of `rows` rows (uninitialised data). NULL when out of memory.
 * Freed with exr_seg_free (seg_heap.h), never free(). */
unsigned char *exr_store_seg_alloc(const exr_store_layout *L, size_t rows);

/* Row off of a segment: its state, then action, then reward. */
static inline unsigned char *exr_seg_row(const exr_store_layout *L, unsigned char *seg, size_t off)
{
    return seg + off * L->row_bytes;
}
static inline unsigned char *exr_seg_state(const exr_store_layout *L, unsigned char *seg,
                                           size_t off)
{
    return exr_seg_row(L, seg, off);
}
static inline unsigned char *exr_seg_action(const exr_store_layout *L, unsigned char *seg,
                                            size_t off)
{
    return exr_seg_row(L, seg, off) + L->state_bytes;
}
static inline unsigned char *exr_seg_reward(const exr_store_layout *L, unsigned char *seg,
                                            size_t off)
{
    return exr_seg_row(L, seg, off) + L->state_bytes + L->action_bytes;
}
#endif
