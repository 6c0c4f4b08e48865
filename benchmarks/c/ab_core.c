/*
 * ab_core.c - get_batch of two builds of src/core in one process, in C (no
 * Python), alternating: the paired A/B of benchmarks/ab_get_batch.py
 * without the binding, for changes whose effect is smaller than the
 * machine's swings between runs.
 *
 * Built twice from one file: with -DAB_CORE_LIB, against a tree's
 * src/core, as a shared library (`make build/ab-core.so` in each tree);
 * without, as the driver (`make build/ab-core`), which loads two such
 * libraries (their symbols kept apart: RTLD_LOCAL) and runs
 *
 *   build/ab-core A.so B.so N B REPS [KIND]
 *
 * (two paths: dlopen loads a path once, so an A/A check needs a copy).
 * Each library fills a buffer of N records (state 16 bytes, action 8,
 * reward 4, pick_len 1, episodes of 100 records ended with a final state;
 * KIND 0 uniform, 1 prioritized, 2 rank), both with the same seed, then
 * the driver times REPS blocks of get_batch(B) calls of each, in turn (the
 * order alternating), and prints each library's median ns a call, the
 * median of the paired B/A ratios and its quartiles. The outputs of the
 * two libraries' last calls are compared first (the same draws, the same
 * batch: a check that both builds do the same thing, not only as fast).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef AB_CORE_LIB
#include "buffer.h"
#include "batch_out.h"

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static exr_buffer *g_buf;
static int64_t g_sel;
static exr_batch_out g_out;
static size_t g_B;
enum { EP = 100, SB = 16 };

static void fill(size_t n, int kind)
{
    unsigned char st[EP * SB], fin[SB] = {0};
    int64_t ac[EP];
    float rw[EP];
    double pri[EP];
    for (size_t i = 0; i < sizeof st; i++)
        st[i] = (unsigned char)i;
    for (size_t i = 0; i < EP; i++) {
        ac[i] = (int64_t)i;
        rw[i] = 0.5f;
        pri[i] = 0.05 + (double)((i * 7919) % 1000) / 1000.0;
    }
    exr_steps in = {.states = st, .actions = ac, .rewards = rw, .T = EP, .priorities = kind ? pri : NULL,
                    .final_state = fin, .end = true};
    for (size_t done = 0; done + EP <= n; done += EP) {
        int64_t h;
        if (exr_buffer_record(g_buf, -1, &in, NULL, &h) != EXR_OK)
            exit(1);
    }
}

void ab_setup(size_t n, size_t B, int kind)
{
    exr_config cfg = {.state_bytes = SB, .action_bytes = 8, .reward_bytes = 4, .capacity = n,
                      .pick_len = 1, .seed = 1};
    const double params[2] = {0.6, 0.4};
    if (exr_buffer_new(&cfg, &g_buf) != EXR_OK)
        exit(1);
    exr_buffer_lock(g_buf);
    if (exr_buffer_add_selector_locked(g_buf, kind, params, &g_sel) != EXR_OK)
        exit(1);
    exr_buffer_unlock(g_buf);
    fill(n, kind);
    g_B = B;
    batch_out_alloc(&g_out, B, 1, SB, bench_zalloc);
}

/* ns a call, over `calls` calls */
double ab_time(size_t calls)
{
    uint64_t t0 = now_ns();
    for (size_t k = 0; k < calls; k++)
        if (exr_buffer_get_batch(g_buf, g_sel, g_B, &g_out) != EXR_OK)
            exit(1);
    return (double)(now_ns() - t0) / (double)calls;
}

/* FNV-1a of the last batch's arrays */
uint64_t ab_digest(void)
{
    const void *a[] = {g_out.state,    g_out.state_next, g_out.action,
                       g_out.reward,   g_out.seq_len,    g_out.seq_len_next,
                       g_out.pick_epi, g_out.pick_pos,   g_out.weight, g_out.pick_index};
    const size_t w[] = {SB, SB, 8, 4, 8, 8, 8, 8, 4, 8};
    uint64_t h = 1469598103934665603u;
    for (size_t f = 0; f < sizeof a / sizeof *a; f++)
        for (size_t i = 0; i < g_B * w[f]; i++)
            h = (h ^ ((const unsigned char *)a[f])[i]) * 1099511628211u;
    return h;
}
#else
#include <dlfcn.h>

typedef struct {
    void (*setup)(size_t, size_t, int);
    double (*time)(size_t);
    uint64_t (*digest)(void);
} lib;

static lib load(const char *path)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "%s\n", dlerror());
        exit(2);
    }
    lib l = {(void (*)(size_t, size_t, int))dlsym(h, "ab_setup"),
             (double (*)(size_t))dlsym(h, "ab_time"), (uint64_t (*)(void))dlsym(h, "ab_digest")};
    if (!l.setup || !l.time || !l.digest) {
        fprintf(stderr, "%s: not an ab-core library\n", path);
        exit(2);
    }
    return l;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 6) {
        fprintf(stderr, "usage: %s A.so B.so N B REPS [KIND]\n", argv[0]);
        return 2;
    }
    size_t n = (size_t)atol(argv[3]), B = (size_t)atol(argv[4]);
    size_t reps = (size_t)atol(argv[5]);
    int kind = argc > 6 ? atoi(argv[6]) : 0;
    size_t calls = B < 1000 ? 200000 / B : 200;
    if (!reps || !B) {
        fprintf(stderr, "REPS and B must be positive\n");
        return 2;
    }
    lib l[2] = {load(argv[1]), load(argv[2])};
    for (int i = 0; i < 2; i++) {
        l[i].setup(n, B, kind);
        l[i].time(calls);
    }
    int same = l[0].digest() == l[1].digest();
    double *t[2] = {calloc(reps, sizeof(double)), calloc(reps, sizeof(double))};
    double *r = calloc(reps, sizeof(double));
    if (!t[0] || !t[1] || !r)
        return 1;
    for (size_t k = 0; k < reps; k++) {
        int first = (int)(k & 1);
        t[first][k] = l[first].time(calls);
        t[!first][k] = l[!first].time(calls);
        r[k] = t[1][k] / t[0][k];
    }
    qsort(t[0], reps, sizeof(double), cmp_d);
    qsort(t[1], reps, sizeof(double), cmp_d);
    qsort(r, reps, sizeof(double), cmp_d);
    printf("N=%zu B=%zu kind=%d: A %.1f ns  B %.1f ns  paired B/A %.3f [quartiles %.3f %.3f]"
           "  same batches: %s\n",
           n, B, kind, t[0][reps / 2], t[1][reps / 2], r[reps / 2], r[reps / 4], r[3 * reps / 4],
           same ? "yes" : "NO");
    return same ? 0 : 1;
}
#endif
