/*
 * phases.c - where get_batch's time goes, phase by phase, next to the floor.
 * A C program linked against src/core (no Python): `make bench-phases`.
 *
 * For each case it fills a buffer of N records (state (4,) float32 = 16 B,
 * or 84x84 uint8 for R2D2; action 8 B, reward 4 B) with whole episodes of
 * E records,
 * then alternates, REPS times:
 *
 *   floor     exr_floor_gather (src/core/floor.c): B random runs of L state
 *             rows and their next rows from one contiguous array of N state
 *             rows (2 MiB-aligned, MADV_HUGEPAGE: what NumPy gives the floor
 *             array of the Python benchmarks), fresh random starts each time
 *   get_batch exr_buffer_get_batch_phases: the same call as get_batch, timed
 *             in its phases (buffer_impl.h):
 *               draw  scratch, lock, the selector's draws
 *               plan  each pick resolved to its rows (pick table -> episode
 *                     -> segment), pin, unlock
 *               copy  rows into the batch, unpin
 *
 * and, for the paper's cases (16-byte states, runs of 8 steps), two bounds
 * on any get_batch: what is left of it when the picks' starts are given
 * (no draw, no plan, no lock): every output array written from records
 *
 *   ideal rec  packed as get_batch's storage keeps them (28-byte rows:
 *              state, action, reward), one fixed-size move per item: the
 *              paper suite's bound, exr_floor_gather_batch (floor.c)
 *   ideal col  kept as three arrays (states, actions, rewards), each run of
 *              a pick copied in one memcpy
 *
 * and prints the medians in ns per pick (and per call), and get_batch / floor.
 * Output arrays are allocated once and reused (as the binding's recycled
 * blocks are). Usage: phases [REPS [CASE]]  (default 31 repetitions, every
 * case; CASE: run only that one, numbered from 0 as listed in main).
 */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "buffer.h"
#include "buffer_impl.h"
#include "floor.h"
#include "rng.h"
#include "batch_out.h"

typedef struct {
    const char *name;
    size_t n, ep, L, B, calls; /* calls: get_batch calls per timed sample */
    size_t sb;                 /* state bytes */
    int kind;                  /* selector: 0 uniform, 1 prioritized (alpha 0.6, beta 0.4) */
} bench_case;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void *big_alloc(size_t bytes)
{
    void *p = NULL;
    size_t align = (size_t)2 << 20;
    bytes = (bytes + align - 1) / align * align;
    if (posix_memalign(&p, align, bytes) != 0) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    madvise(p, bytes, MADV_HUGEPAGE);
    memset(p, 0, bytes);
    return p;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double median(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return n % 2 ? (double)v[n / 2] : 0.5 * ((double)v[n / 2 - 1] + (double)v[n / 2]);
}

static exr_buffer *filled(const bench_case *c, int64_t *sel)
{
    size_t sb = c->sb;
    exr_config cfg = {.state_bytes = sb, .action_bytes = 8, .reward_bytes = 4,
                      .capacity = c->n, .pick_len = (uint32_t)c->L, .seed = 1};
    exr_buffer *b;
    if (exr_buffer_new(&cfg, &b) != EXR_OK)
        exit(1);
    exr_buffer_lock(b);
    const double params[2] = {0.6, 0.4};
    if (exr_buffer_add_selector_locked(b, c->kind, params, sel) != EXR_OK)
        exit(1);
    exr_buffer_unlock(b);
    unsigned char *st = malloc(c->ep * sb);
    int64_t *ac = malloc(c->ep * 8);
    float *rw = malloc(c->ep * 4);
    double *pri = malloc(c->ep * sizeof *pri);
    unsigned char *fin = calloc(1, sb);
    for (size_t i = 0; i < c->ep * sb; i++)
        st[i] = (unsigned char)i;
    for (size_t i = 0; i < c->ep; i++) {
        ac[i] = (int64_t)i;
        rw[i] = 0.5f;
        pri[i] = 0.05 + (double)((i * 7919) % 1000) / 1000.0;
    }
    exr_steps in = {.states = st, .actions = ac, .rewards = rw, .T = c->ep,
                    .priorities = c->kind ? pri : NULL,
                    .final_state = fin, .end = true};
    for (size_t done = 0; done < c->n; done += c->ep) {
        int64_t h;
        if (exr_buffer_record(b, -1, &in, NULL, &h) != EXR_OK)
            exit(1);
    }
    free(st);
    free(ac);
    free(rw);
    free(fin);
    free(pri);
    return b;
}

/* The records of a bound: n + 1 steps of 16-byte states, int64 actions and
 * float32 rewards, packed (rec: 28-byte rows) and as columns. */
typedef struct {
    unsigned char *rec, *st, *ac, *rw;
} ideal_rows;

enum { REC = 28 };

/* The lines of a pick's columns starting at step s0 (and its next state). */
static inline void ideal_prefetch(const ideal_rows *r, size_t s0, size_t L)
{
    for (size_t b = 0; b < (L + 1) * 16; b += 64)
        __builtin_prefetch(r->st + s0 * 16 + b);
    __builtin_prefetch(r->st + (s0 + L + 1) * 16 - 1);
    __builtin_prefetch(r->ac + s0 * 8);
    __builtin_prefetch(r->ac + (s0 + L) * 8 - 1);
    __builtin_prefetch(r->rw + s0 * 4);
    __builtin_prefetch(r->rw + (s0 + L) * 4 - 1);
}

/* Every output of a get_batch whose picks start at starts[0..B) (runs of L
 * steps, all whole): state, action, reward, next state, the per-pick
 * arrays and the weights, from the rows packed (cols false: the suite's
 * bound, exr_floor_gather_batch) or as columns. */
static void ideal_gather(const ideal_rows *r, bool cols, const int64_t *starts, size_t B,
                         size_t L, size_t ep, exr_batch_out *o)
{
    if (!cols) {
        exr_floor_gather_batch(r->rec, 16, 8, 4, starts, B, L, ep, o);
        return;
    }
    unsigned char *st = o->state, *nx = o->state_next, *ac = o->action, *rw = o->reward;
    enum { AHEAD = 16 }; /* picks whose rows are on their way: their misses overlap */
    for (size_t i = 0; i < B; i++) {
        size_t s0 = (size_t)starts[i];
        if (i + AHEAD < B)
            ideal_prefetch(r, (size_t)starts[i + AHEAD], L);
        memcpy(st + i * L * 16, r->st + s0 * 16, L * 16);
        memcpy(nx + i * L * 16, r->st + (s0 + 1) * 16, L * 16);
        memcpy(ac + i * L * 8, r->ac + s0 * 8, L * 8);
        memcpy(rw + i * L * 4, r->rw + s0 * 4, L * 4);
        exr_floor_pick_meta(o, i, s0, L, ep);
    }
}

static ideal_rows ideal_rows_new(size_t n)
{
    ideal_rows r = {big_alloc((n + 1) * REC), big_alloc((n + 1) * 16), big_alloc((n + 1) * 8),
                    big_alloc((n + 1) * 4)};
    for (size_t i = 0; i < (n + 1) * REC; i++)
        r.rec[i] = (unsigned char)i;
    memset(r.st, 1, (n + 1) * 16);
    memset(r.ac, 2, (n + 1) * 8);
    memset(r.rw, 3, (n + 1) * 4);
    return r;
}

/* Medians of the two bounds' times (ns per call of `calls` gathers), each
 * timed right after a floor call, as get_batch is in run_case. */
static void ideal_times(const bench_case *c, size_t reps, const int64_t *starts, size_t pool,
                        const unsigned char *rows, void *fst, void *fnx, double out[2])
{
    ideal_rows r = ideal_rows_new(c->n);
    exr_batch_out o = {0};
    batch_out_alloc(&o, c->B, c->L, 16, big_alloc);
    uint64_t *t = bench_zalloc(2 * reps * sizeof *t);
    for (size_t k = 0; k < reps + 2; k++)
        for (int cols = 0; cols < 2; cols++) {
            const int64_t *sv = starts + (k % pool) * c->B;
            exr_floor_gather(rows, 16, sv, c->B, c->L, fst, fnx);
            uint64_t t0 = now_ns();
            for (size_t j = 0; j < c->calls; j++)
                ideal_gather(&r, cols, sv, c->B, c->L, c->ep, &o);
            if (k >= 2)
                t[cols * reps + k - 2] = now_ns() - t0;
        }
    out[0] = median(t, reps);
    out[1] = median(t + reps, reps);
    free(t);
    /* the big_alloc'ed arrays are left to the process's end */
}

static void run_case(const bench_case *c, size_t reps)
{
    int64_t sel;
    exr_buffer *b = filled(c, &sel);
    size_t B = c->B, L = c->L, n = c->n, sb = c->sb;
    exr_batch_out o = {0};
    batch_out_alloc(&o, B, L, sb, big_alloc);
    unsigned char *rows = big_alloc(n * sb);
    void *fst = big_alloc(B * L * sb), *fnx = big_alloc(B * L * sb);
    enum { POOL = 8 };
    int64_t *starts = malloc(POOL * B * sizeof *starts);
    exr_rng rng;
    exr_rng_seed(&rng, 7, 0);
    for (size_t i = 0; i < POOL * B; i++)
        starts[i] = (int64_t)exr_rng_below(&rng, n - L - 1);
    uint64_t *draw = calloc(reps, 8), *plan = calloc(reps, 8), *copy = calloc(reps, 8),
             *tot = calloc(reps, 8), *flo = calloc(reps, 8);
    for (size_t r = 0; r < reps + 2; r++) {
        uint64_t t0 = now_ns();
        for (size_t k = 0; k < c->calls; k++)
            exr_floor_gather(rows, sb, starts + ((r * c->calls + k) % POOL) * B, B, L, fst, fnx);
        uint64_t t1 = now_ns();
        exr_batch_phases ph, sum = {0, 0, 0};
        uint64_t t2 = now_ns();
        for (size_t k = 0; k < c->calls; k++) {
            if (exr_buffer_get_batch_phases(b, sel, B, &o, &ph) != EXR_OK)
                exit(1);
            sum.draw_ns += ph.draw_ns;
            sum.plan_ns += ph.plan_ns;
            sum.copy_ns += ph.copy_ns;
        }
        uint64_t t3 = now_ns();
        if (r < 2)
            continue; /* warm-up */
        draw[r - 2] = sum.draw_ns;
        plan[r - 2] = sum.plan_ns;
        copy[r - 2] = sum.copy_ns;
        tot[r - 2] = t3 - t2;
        flo[r - 2] = t1 - t0;
    }
    double per = (double)(B * c->calls), calls = (double)c->calls;
    double md = median(draw, reps), mp = median(plan, reps), mc = median(copy, reps),
           mt = median(tot, reps), mf = median(flo, reps);
    printf("%-22s N=%-8zu E=%-4zu L=%-2zu B=%-5zu | ns/pick: draw %6.2f plan %6.2f copy %6.2f "
           "total %6.2f floor %6.2f | per call: total %8.2f us floor %8.2f us | /floor %.2fx\n",
           c->name, n, c->ep, L, B, md / per, mp / per, mc / per, mt / per, mf / per,
           mt / calls / 1000, mf / calls / 1000, mt / mf);
    if (sb == 16 && L > 1) {
        double id[2];
        ideal_times(c, reps, starts, POOL, rows, fst, fnx, id);
        printf("%-22s %*s | bounds, the starts given: ideal rec %8.2f us (/floor %.2fx), "
               "ideal col %8.2f us (/floor %.2fx)\n", "", 37, "", id[0] / calls / 1000,
               id[0] / mf, id[1] / calls / 1000, id[1] / mf);
    }
    free(draw);
    free(plan);
    free(copy);
    free(tot);
    free(flo);
    free(starts);
    exr_buffer_free(b);
    /* the big_alloc'ed arrays are left to the process's end */
}

int main(int argc, char **argv)
{
    size_t reps = argc > 1 ? (size_t)atol(argv[1]) : 31;
    const bench_case cases[] = {
        /* the paper's get_5000 (benchmarks/test_bench_paper.py) at a small N and at N = 1M */
        {"paper get_5000", 2048, 64, 8, 5000, 1, 16, 0},
        {"paper get_5000", 65536, 512, 8, 5000, 1, 16, 0},
        {"paper get_5000", 1048576, 512, 8, 5000, 1, 16, 0},
        /* the cpprb comparison's uniform sample (test_bench_cpprb.py): L = 1, episodes of 100 */
        {"cpprb sample(32)", 100000, 100, 1, 32, 200, 16, 0},
        {"cpprb sample(32)", 1000000, 100, 1, 32, 200, 16, 0},
        {"cpprb sample(1024)", 1000000, 100, 1, 1024, 10, 16, 0},
        /* prioritized get_batch(256) (test_bench_cpprb.py) */
        {"prioritized (256)", 1000000, 100, 1, 256, 20, 16, 1},
        /* R2D2 (test_bench_shapes.py): 84x84 uint8, episodes of 500 */
        {"R2D2", 100000, 500, 80, 32, 1, 84 * 84, 0},
    };
    long only = argc > 2 ? atol(argv[2]) : -1;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (only < 0 || (size_t)only == i)
            run_case(&cases[i], reps);
    return 0;
}
