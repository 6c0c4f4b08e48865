/*
 * batch_out.h - the output arrays of a get_batch of B picks of L steps
 * (state and next state sb bytes a step, int64 actions, float32 rewards),
 * for the C harnesses of benchmarks/c/, each from `alloc` (which exits
 * when out of memory); and what those harnesses share besides: their
 * allocator and their comparison for medians. Include after buffer.h.
 */
#ifndef EXR_BENCH_BATCH_OUT_H
#define EXR_BENCH_BATCH_OUT_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

/* qsort's comparison of doubles, ascending: the harnesses' medians (not
 * ab_core.c's driver, which loads the cores without this header). */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Zeroed memory, or the program exits: the harnesses' allocator. */
static inline void *bench_zalloc(size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

static inline void batch_out_alloc(exr_batch_out *o, size_t B, size_t L, size_t sb,
                                   void *(*alloc)(size_t))
{
    o->state = alloc(B * L * sb);
    o->state_next = alloc(B * L * sb);
    o->action = alloc(B * L * 8);
    o->reward = alloc(B * L * 4);
    o->seq_len = alloc(B * 8);
    o->seq_len_next = alloc(B * 8);
    o->pick_epi = alloc(B * 8);
    o->pick_pos = alloc(B * 8);
    o->weight = alloc(B * 4);
    o->pick_index = alloc(B * 8);
    o->drawn = NULL;
    o->shared_next = false;
}

#endif
