/*
 * timing.c - the per-thread counts of timing.h (-DEXR_TIMING builds only).
 */
#include "timing.h"

#include <string.h>

#ifdef EXR_TIMING
static _Thread_local exr_timing counts;
static _Thread_local uint64_t held_since; /* 0: rw not held by this thread */

void exr_tm_add(exr_tm_part p, uint64_t ns)
{
    counts.ns[p] += ns;
    counts.count[p]++;
}

void exr_tm_held(void) { held_since = exr_now_ns(); }

void exr_tm_released(bool exclusive)
{
    if (held_since)
        exr_tm_add(exclusive ? EXR_TM_RW_EXCL : EXR_TM_RW_SHARED, exr_now_ns() - held_since);
    held_since = 0;
}

void exr_timing_take(exr_timing *out)
{
    *out = counts;
    memset(&counts, 0, sizeof counts);
}
#else
void exr_timing_take(exr_timing *out) { memset(out, 0, sizeof *out); }
#endif
