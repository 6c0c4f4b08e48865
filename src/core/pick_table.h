/*
 * pick_table.h - every pick that can be drawn, in one dense array
 * (paper §3.1: availability is decided at record time, never at get_batch).
 *
 *   v: [ {slot, pos} {slot, pos} ... ]   n used, cap allocated
 *        |                             8 bytes a pick
 *        +-> episode slab slot; the episode's aux[pos] holds the index back
 *
 * Order is irrelevant, so removal swaps the last
 * pick into the hole: O(1), and evicting an episode of n records is O(n)
 * (paper §3.2). Indices fit in uint32: at most 2^32 - 2 picks.
 */
#ifndef EXR_PICK_TABLE_H
#define EXR_PICK_TABLE_H

#include "exr.h"

typedef struct {
    uint32_t slot;
    uint32_t pos;
} exr_pick;

typedef struct {
    exr_pick *v;
    size_t n, cap;
} exr_pick_table;

void exr_pick_table_init(exr_pick_table *t);
void exr_pick_table_free(exr_pick_table *t);
/* Room for n picks: EXR_ENOMEM / EXR_EOVERFLOW leave t unchanged. Amortised O(1). */
exr_status exr_pick_table_reserve(exr_pick_table *t, size_t n);

#endif
