#include "store.h"

#include <stdlib.h>

#include "seg_collapse.h"
#include "seg_heap.h"

#define SEG_TARGET_BYTES ((size_t)1 << 20)
/* Segment 0 holds at least a page: an episode of small rows (up to 256
 * steps of 28-byte rows, the power of two past 4 KiB) then lies in it
 * whole, and get_batch's plan reaches such rows from the episode's slot
 * (exr_episode.seg0) */
#define SEG0_MIN_BYTES ((size_t)4 << 10)

static int round_line(size_t *x)
{
    size_t r;
    if (!exr_add_size(*x, 63, &r))
        return 0;
    *x = r & ~(size_t)63;
    return 1;
}

exr_status exr_store_layout_init(exr_store_layout *L, size_t state_bytes, size_t action_bytes,
                                 size_t reward_bytes, size_t extra_bytes, uint32_t pick_len)
{
    L->state_bytes = state_bytes;
    L->action_bytes = action_bytes;
    L->reward_bytes = reward_bytes;
    L->extra_bytes = extra_bytes;
    size_t row;
    if (!exr_add_size(state_bytes, action_bytes, &row) || !exr_add_size(row, reward_bytes, &row) ||
        !exr_add_size(row, extra_bytes, &row))
        return EXR_EOVERFLOW;
    L->row_bytes = row;
    unsigned base = 4; /* 16 records */
    while (((uint64_t)1 << base) < (uint64_t)pick_len + 1)
        base++;
    while (base < 20 && ((size_t)1 << base) * row < SEG0_MIN_BYTES)
        base++;
    unsigned top = base;
    while (top < 20 && ((size_t)2 << top) * row <= SEG_TARGET_BYTES)
        top++;
    if (base > 40)
        return EXR_EOVERFLOW;
    L->base_shift = base;
    L->max_shift = top;
    /* the largest segment's bytes must fit comfortably */
    size_t x;
    if (!exr_mul_size((size_t)1 << top, row, &x) || x > ((size_t)1 << 46))
        return EXR_EOVERFLOW;
    return EXR_OK;
}

unsigned char *exr_store_seg_alloc(const exr_store_layout *L, size_t rows)
{
    size_t bytes;
    if (!exr_mul_size(rows ? rows : 1, L->row_bytes, &bytes) || !round_line(&bytes))
        return NULL;
    if (exr_seg_heap_takes(rows, bytes))
        return exr_seg_heap_alloc(bytes);
    unsigned char *seg = aligned_alloc(64, bytes);
    exr_seg_track(seg, true); /* onto a huge page once its chunk fills (seg_collapse.c) */
    return seg;
}
