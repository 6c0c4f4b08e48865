/*
 * draw.c - the prioritized draw alone: exr_sumtree_sample of B = 256 draws
 * from a sum tree of N leaves (0.05..1.05, the phases harness's priorities),
 * in ns per draw, next to nothing else (no buffer, no lock, no weights).
 *
 *     make bench-draw            (build/bench-draw N CALLS REPS)
 *
 * Prints the best, the median and the worst of REPS timings of CALLS calls:
 * on a shared machine the best is the least disturbed by other processes.
 * For instruction counts that no load disturbs, a build without LTO (which
 * would inline the draw into main) and without -g (which would credit the
 * inlined intrinsics and rng.h to other files):
 *     gcc -std=c11 -O3 -Isrc/core -o build/draw-cg benchmarks/c/draw.c \
 *         src/core/sumtree.c src/core/rng.c src/core/mem.c -lm
 *     valgrind --tool=callgrind build/draw-cg 1000000 20 7
 * then exr_sumtree_sample's count (callgrind_annotate) / (20 * 7 * 256).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "rng.h"
#include "sumtree.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    enum { B = 256 };
    size_t n = argc > 1 ? (size_t)atol(argv[1]) : 1000000;
    size_t calls = argc > 2 ? (size_t)atol(argv[2]) : 2000;
    size_t reps = argc > 3 ? (size_t)atol(argv[3]) : 15;
    if (n < 1 || calls < 1 || reps < 1 || reps > 1000)
        return 2;
    exr_sumtree t;
    exr_sumtree_init(&t);
    if (exr_sumtree_reserve(&t, n) != EXR_OK)
        return 1;
    for (size_t i = 0; i < n; i++)
        t.leaf[i] = 0.05f + (float)((i * 7919) % 1000) / 1000.0f;
    exr_sumtree_rebuild(&t);
    exr_rng r;
    exr_rng_seed(&r, 1, 0);
    static size_t out[B];
    static double scratch[B];
    double ns[1000];
    size_t acc = 0;
    for (size_t rep = 0; rep < reps; rep++) {
        double t0 = now();
        for (size_t c = 0; c < calls; c++) {
            exr_sumtree_sample(&t, &r, B, out, scratch);
            acc += out[c % B];
        }
        ns[rep] = (now() - t0) / (double)calls / B * 1e9;
    }
    qsort(ns, reps, sizeof *ns, cmp);
    printf("sum-tree draw N=%zu B=%d | ns/draw: best %.2f median %.2f worst %.2f (check %zu)\n", n, B,
           ns[0], ns[reps / 2], ns[reps - 1], acc % 7);
    exr_sumtree_free(&t);
    return 0;
}
