/*
 * floor.h - the physical floor for get_batch: a plain gather from one
 * contiguous array of rows, with nothing to look up. Benchmarks time it in
 * the same run as get_batch and report get_batch / floor.
 *
 *   rows: [r0 r1 r2 ... ]  (row_bytes each)
 *   for each start s: out_state <- rows[s .. s+L), out_next <- rows[s+1 .. s+L+1)
 */
#ifndef EXR_FLOOR_H
#define EXR_FLOOR_H

#include "buffer.h"
#include "exr.h"

/* starts[i] + L < nrows must hold (the caller checks). O(count * L).
 * out_next NULL: the floor of shared next states (get_batch's shared_next),
 * out_state <- rows[s .. s+L], L + 1 rows a pick. */
void exr_floor_gather(const void *rows, size_t row_bytes, const int64_t *starts, size_t count,
                      size_t L, void *out_state, void *out_next);

/* The floor for named fields: ncols columns, each its own contiguous array
 * of items (widths[c] bytes), gathered pick by pick as get_batch fills a
 * field at a time: out[c] <- cols[c][s .. s+L), and next[c] (NULL: not
 * wanted) <- cols[c][s+1 .. s+L+1). */
void exr_floor_gather_cols(size_t ncols, const void *const *cols, const size_t *widths,
                           const int64_t *starts, size_t count, size_t L, void *const *out,
                           void *const *next);

/* A bound on any get_batch rather than a floor: everything a get_batch of
 * picks starting at starts[i] (whole runs of L steps) writes, with nothing
 * drawn, looked up or locked: from rows packed as get_batch's storage keeps
 * records (sb bytes of state, ab of action, rb of reward), the state,
 * action, reward and next state of each step, and each pick's seq_len and
 * seq_len_next (both L), pick_epi (s / ep), pick_pos (s % ep), pick_index
 * (s, which must not be NULL) and weight (1), into out (its fields and
 * drawn unused); the rows of the picks 16 ahead prefetched. starts[i] + L
 * < nrows must hold (the caller checks). O(count * L). */
void exr_floor_gather_batch(const void *rows, size_t sb, size_t ab, size_t rb,
                            const int64_t *starts, size_t count, size_t L, size_t ep,
                            const exr_batch_out *out);

/* Pick i's per-pick entries in a bound's batch, its run starting at row s
 * (episodes of ep rows): what exr_floor_gather_batch writes beside the rows. */
static inline void exr_floor_pick_meta(const exr_batch_out *o, size_t i, size_t s, size_t L,
                                       size_t ep)
{
    o->seq_len[i] = o->seq_len_next[i] = (int64_t)L;
    o->pick_epi[i] = (int64_t)(s / ep);
    o->pick_pos[i] = (int64_t)(s % ep);
    o->pick_index[i] = (int64_t)s;
    o->weight[i] = 1.0f;
}

#endif
