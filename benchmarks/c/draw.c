/*
 * draw.c - the prioritized draw alone: exr_sumtree_sample of B = 256 draws
 * from a sum tree of N leaves (0.05..1.05, the phases harness's priorities),
 * in ns per draw, next to nothing else (no buffer, no lock, no weights).
 *
 *     make bench-draw            (build/bench-draw N CALLS REPS)
 *
 * Prints the best, the median and the worst of REPS timings of CALLS calls:
 * on a shared machine the best is the least disturbed by other processes.
 * Then the same draws with each narrower descent the machine has
 * (exr_sumtree_sample_lanes: 1 the AVX2 quads, 0 the SSE2 pairs), timed
 * in turn with the default one repetition by repetition, and the median of
 * the paired ratios (default / that one). Every width must draw the same
 * leaves: checked first.
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
    static size_t ref[B];
    for (int lanes = 1; lanes >= 0; lanes--) {
        exr_rng r1 = r, r2 = r;
        exr_sumtree_sample(&t, &r1, B, ref, scratch);
        exr_sumtree_sample_lanes(&t, &r2, B, out, scratch, lanes);
        for (size_t b = 0; b < B; b++)
            if (out[b] != ref[b]) {
                fprintf(stderr, "lanes %d drew leaf %zu where the default drew %zu\n", lanes,
                        out[b], ref[b]);
                return 1;
            }
        double mine[1000], ratio[1000];
        for (size_t rep = 0; rep < reps; rep++) {
            double t0 = now();
            for (size_t c = 0; c < calls; c++)
                exr_sumtree_sample(&t, &r, B, out, scratch);
            double t1 = now();
            for (size_t c = 0; c < calls; c++)
                exr_sumtree_sample_lanes(&t, &r, B, out, scratch, lanes);
            double t2 = now();
            mine[rep] = (t2 - t1) / (double)calls / B * 1e9;
            ratio[rep] = (t1 - t0) / (t2 - t1);
            acc += out[rep % B];
        }
        qsort(mine, reps, sizeof *mine, cmp);
        qsort(ratio, reps, sizeof *ratio, cmp);
        printf("  lanes=%d (%s): median %.2f ns/draw; default / this, paired: median %.3f\n", lanes,
               lanes ? "AVX2 quads" : "SSE2 pairs", mine[reps / 2], ratio[reps / 2]);
    }
    exr_sumtree_free(&t);
    return 0;
}
