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
 * (paper §3.2); within a record call an evicted pick's index goes to the
 * call's next new pick instead (buffer_picks.c, places). Indices fit in
 * uint32: at most 2^32 - 2 picks.
 */
#ifndef EXR_PICK_TABLE_H
#define EXR_PICK_TABLE_H

#include "exr.h"

typedef struct {
    uint32_t slot;
    uint32_t pos;
} exr_pick;

/* From this size on the table is allocated by exr_huge_prefix_alloc (and
 * copied when it grows) instead of realloc'd. */
#define EXR_PICK_TABLE_HUGE ((size_t)4 << 20)

typedef struct {
    exr_pick *v;
    size_t n, cap;
} exr_pick_table;

void exr_pick_table_init(exr_pick_table *t);
void exr_pick_table_free(exr_pick_table *t);
/* Room for n picks: EXR_ENOMEM / EXR_EOVERFLOW leave t unchanged. Amortised O(1).
 * `full`: how many picks the table holds once its buffer is full (its
 * capacity in records; SIZE_MAX when unbounded). An array of at least
 * EXR_PICK_TABLE_HUGE bytes is put on 2 MiB pages up to `full` picks
 * (mem.h), the rest on ordinary pages: every draw reads the table at random
 * places, and with 4 KiB pages each of those reads is also a TLB miss. */
exr_status exr_pick_table_reserve(exr_pick_table *t, size_t n, size_t full);
/* The bytes of a table of `bytes` put on huge pages when it will hold `full`
 * picks: those picks' bytes, rounded up to whole 2 MiB pages if that leaves
 * at most an eighth of them unused (a partly used huge page is resident
 * whole), else rounded down. */
size_t exr_pick_table_huge_bytes(size_t bytes, size_t full);

#endif
