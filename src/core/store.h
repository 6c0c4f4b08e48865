/*
 * store.h - chunked record storage. Every episode keeps its records in its
 * own segments; a segment holds `cap` consecutive records as rows, then the
 * aux column:
 *
 *   segment k  (cap_k = 2^min(base_shift + k, max_shift) records)
 *   +-------------------------------------------------------+-----------+
 *   | row 0: state|action|reward  row 1: ...   (cap rows)   | aux cap*4 |
 *   +-------------------------------------------------------+-----------+
 *   (a row is sb + ab + rb bytes; aux starts on a 64-byte boundary)
 *
 * Rows rather than one column per field: a pick of L steps and its next
 * state are one run of L + 1 rows, so get_batch reads one stream of
 * adjacent lines from memory instead of three (the stream is what the
 * hardware prefetcher follows, and what misses cost at large N).
 *
 * Segments double in size up to about 1 MiB, then stay that size: a short
 * episode wastes little, and a long one never reallocates what it holds
 * (no giant realloc, SPEC §5). Every segment holds at least pick_len + 1
 * records, so a pick and its next states span at most two segments: one or
 * two memcpy per column.
 *
 * aux[p] holds, before the pick at p exists, the priority recorded with step
 * p (float, NaN for none); afterwards, the pick's index in the pick table.
 */
#ifndef EXR_STORE_H
#define EXR_STORE_H

#include "exr.h"

typedef struct {
    size_t state_bytes, action_bytes, reward_bytes;
    size_t row_bytes; /* state_bytes + action_bytes + reward_bytes */
    unsigned base_shift, max_shift;
    /* aux offset and total size of a segment of 2^shift records, per shift */
    size_t off_aux[64], seg_bytes[64];
} exr_store_layout;

/* Fills the layout; EXR_EOVERFLOW if a segment's size would not fit. */
exr_status exr_store_layout_init(exr_store_layout *L, size_t state_bytes, size_t action_bytes,
                                 size_t reward_bytes, uint32_t pick_len);

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

/* New segment k (uninitialised data). NULL when out of memory. */
unsigned char *exr_store_seg_alloc(const exr_store_layout *L, size_t k);

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
static inline uint32_t *exr_seg_aux(const exr_store_layout *L, unsigned char *seg, size_t k,
                                    size_t off)
{
    return (uint32_t *)(void *)(seg + L->off_aux[exr_store_shift(L, k)]) + off;
}

#endif
