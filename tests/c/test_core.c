/*
 * test_core.c - unit tests of the pure-C core, without Python. Built and run
 * under ASan+UBSan by `make ctest`. Prints "N passed, M failed".
 */
#define _DEFAULT_SOURCE
#include <float.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buffer.h"
#include "buffer_impl.h"
#include "buffer_locks.h"
#include "episode.h"
#include "powa.h"
#include "rng.h"
#include "store.h"
#include "sumtree.h"

#include "check.h"

/* ---- rng ---------------------------------------------------------------- */

static void test_rng(void)
{
    exr_rng a, b, c;
    exr_rng_seed(&a, 42, 0);
    exr_rng_seed(&b, 42, 0);
    exr_rng_seed(&c, 42, 1);
    int same = 1, differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = exr_rng_next(&a), y = exr_rng_next(&b), z = exr_rng_next(&c);
        same &= x == y;
        differ |= x != z;
    }
    CHECK_RET(same);
    CHECK_RET(differ);
    long counts[7] = {0};
    for (int i = 0; i < 70000; i++) {
        uint64_t v = exr_rng_below(&a, 7);
        CHECK_RET(v < 7);
        counts[v]++;
    }
    for (int i = 0; i < 7; i++)
        CHECK_RET(counts[i] > 9000 && counts[i] < 11000);
    for (int i = 0; i < 1000; i++) {
        double d = exr_rng_double(&a);
        CHECK_RET(d >= 0 && d < 1);
    }
}

/* ---- store layout ------------------------------------------------------- */

static void test_store_locate(void)
{
    uint32_t lens[] = {1, 8, 15, 16, 80, 200};
    size_t widths[] = {1, 16, 7056};
    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
        for (size_t wi = 0; wi < 3; wi++) {
            exr_store_layout L;
            CHECK_RET(exr_store_layout_init(&L, widths[wi], 8, 4, 0, lens[li]) == EXR_OK);
            CHECK_RET(((size_t)1 << L.base_shift) >= (size_t)lens[li] + 1);
            CHECK_RET(L.max_shift >= L.base_shift);
            size_t pk = 0, poff = 0;
            for (uint64_t p = 0; p < 300000; p++) {
                size_t k, off;
                exr_store_locate(&L, p, &k, &off);
                CHECK_RET(off < exr_store_seg_cap(&L, k));
                if (p > 0) {
                    /* positions run through segments in order, without gaps */
                    if (k == pk)
                        CHECK_RET(off == poff + 1);
                    else
                        CHECK_RET(k == pk + 1 && off == 0 && poff == exr_store_seg_cap(&L, pk) - 1);
                } else {
                    CHECK_RET(k == 0 && off == 0);
                }
                pk = k;
                poff = off;
            }
            /* a row is the three fields back to back; a segment of any size
             * keeps its rows where they are */
            CHECK_RET(L.row_bytes == widths[wi] + 8 + 4);
            unsigned char *seg = exr_store_seg_alloc(&L, 3);
            CHECK_RET(seg != NULL);
            CHECK_RET(exr_seg_action(&L, seg, 2) == seg + 2 * L.row_bytes + widths[wi]);
            CHECK_RET(exr_seg_reward(&L, seg, 2) == seg + 2 * L.row_bytes + widths[wi] + 8);
            free(seg);
        }
    }
}

/* ---- sum tree ----------------------------------------------------------- */

static void test_sumtree(void)
{
    exr_sumtree t;
    exr_sumtree_init(&t);
    CHECK_RET(exr_sumtree_reserve(&t, 10) == EXR_OK);
    char msg[256];
    size_t n = 3000;
    CHECK_RET(exr_sumtree_reserve(&t, n) == EXR_OK); /* grows, keeps leaves */
    double want = 0;
    for (size_t i = 0; i < n; i++) {
        float v = (i % 3 == 0) ? 0.0f : (float)(i % 7 + 1);
        exr_sumtree_set(&t, i, v);
        want += v;
    }
    CHECK_RET(fabs(exr_sumtree_total(&t) - want) < 1e-6 * want);
    CHECK_RET(exr_sumtree_min(&t) == 1.0f);
    CHECK_RET(exr_sumtree_check(&t, n, msg, sizeof msg) == 0);
    exr_rng r;
    exr_rng_seed(&r, 7, 0);
    size_t idx[4096];
    double scratch[4096];
    long hits[7] = {0};
    for (int rep = 0; rep < 50; rep++) {
        exr_sumtree_sample(&t, &r, 4096, idx, scratch);
        for (int b = 0; b < 4096; b++) {
            CHECK_RET(idx[b] < n);
            CHECK_RET(t.leaf[idx[b]] > 0); /* a zero leaf is never drawn */
            hits[idx[b] % 7]++;
        }
    }
    /* leaf value is i%7+1 for i%3 != 0: P(i%7 == j) is proportional to j+1 */
    double total = 0;
    for (int j = 0; j < 7; j++)
        total += hits[j];
    for (int j = 0; j < 7; j++) {
        double expect = (double)(j + 1) / 28.0;
        CHECK_RET(fabs(hits[j] / total - expect) < 0.01);
    }
    /* growing again keeps the sums */
    CHECK_RET(exr_sumtree_reserve(&t, 100000) == EXR_OK);
    CHECK_RET(fabs(exr_sumtree_total(&t) - want) < 1e-6 * want);
    CHECK_RET(exr_sumtree_check(&t, n, msg, sizeof msg) == 0);
    /* all zero: min is +inf, total 0 */
    for (size_t i = 0; i < n; i++)
        exr_sumtree_set(&t, i, 0.0f);
    CHECK_RET(exr_sumtree_total(&t) == 0);
    CHECK_RET(isinf(exr_sumtree_min(&t)));
    /* a corrupted node is reported */
    exr_sumtree_set(&t, 5, 2.0f);
    t.sum[0][0] += 1.0;
    CHECK_RET(exr_sumtree_check(&t, n, msg, sizeof msg) == 1);
    exr_sumtree_free(&t);
}

/* Delta updates under hostile magnitudes: leaves jump between 0 and float's
 * whole range, in batches and one at a time, with gradual drops (each less
 * than the 2^-40 drift trigger would catch at once). After every round the
 * tree must pass its check (every node within its drift bound of its
 * children, that bound within 2^-40 of its sum, no negative sum, a zero sum
 * exactly where the leaves are all zero), the total must be within 1e-9 of
 * the exact leaf sum, and a draw must never return a zero leaf. */
static void test_sumtree_drift(void)
{
    exr_sumtree t;
    exr_sumtree_init(&t);
    enum { N = 5000, B = 300 };
    CHECK_RET(exr_sumtree_reserve(&t, N) == EXR_OK);
    exr_rng r;
    exr_rng_seed(&r, 11, 3);
    char msg[256];
    static size_t idx[B], scratch[B], out[B];
    static float v[B];
    static double dscratch[B];
    for (int round = 0; round < 400; round++) {
        size_t count = round % 3 == 0 ? 1 : (size_t)exr_rng_below(&r, B) + 1;
        /* a few hot leaves so that the same nodes see many deltas */
        size_t span = round % 2 ? 40 : N;
        for (size_t k = 0; k < count; k++) {
            idx[k] = (size_t)exr_rng_below(&r, span);
            int kind = (int)exr_rng_below(&r, 6);
            double e = exr_rng_double(&r);
            if (kind == 0)
                v[k] = 0.0f;
            else if (kind == 1)
                v[k] = (float)pow(10.0, -44.0 + 82.0 * e); /* float's whole range */
            else if (kind == 2) /* a gradual drop of what is there */
                v[k] = t.leaf[idx[k]] * (float)(1e-3 + 0.5 * e);
            else
                v[k] = (float)(0.01 + e);
        }
        if (round % 5 == 4) {
            /* deferred writes: more distinct level-0 nodes than the dirty
             * list holds (a flush on the way), then this batch, one flush */
            for (int k = 0; k < 700; k++)
                exr_sumtree_put(&t, (size_t)exr_rng_below(&r, N), (float)exr_rng_double(&r));
            for (size_t k = 0; k < count; k++)
                exr_sumtree_put(&t, idx[k], v[k]);
            CHECK_RET(exr_sumtree_pending(&t));
            exr_sumtree_flush(&t);
            CHECK_RET(!exr_sumtree_pending(&t));
        } else if (count == 1)
            exr_sumtree_set(&t, idx[0], v[0]);
        else
            exr_sumtree_set_many(&t, count, idx, v, scratch);
        CHECK_RET(exr_sumtree_check(&t, N, msg, sizeof msg) == 0);
        double exact = 0;
        for (size_t i = 0; i < N; i++)
            exact += t.leaf[i];
        double total = exr_sumtree_total(&t);
        CHECK_RET(exact == 0 ? total == 0 : fabs(total - exact) <= 1e-9 * exact);
        if (total > 0) {
            exr_sumtree_sample(&t, &r, B, out, dscratch);
            for (size_t b = 0; b < B; b++)
                CHECK_RET(out[b] < N && t.leaf[out[b]] > 0);
        }
    }
    /* everything to zero: exactly zero, and +inf as the min */
    for (size_t i = 0; i < N; i++)
        exr_sumtree_set(&t, i, 0.0f);
    CHECK_RET(exr_sumtree_total(&t) == 0 && isinf(exr_sumtree_min(&t)));
    CHECK_RET(exr_sumtree_check(&t, N, msg, sizeof msg) == 0);
    /* a drift bound that is wrong is reported */
    exr_sumtree_set(&t, 5, 2.0f);
    t.sum[1][0] *= 1.0 + 1e-9;
    CHECK_RET(exr_sumtree_check(&t, N, msg, sizeof msg) == 1);
    exr_sumtree_free(&t);
}

/* Every node's bytes (sums, mins, drift bounds) at levels [0, nlev). */
static int sumtree_nodes_equal(const exr_sumtree *a, const exr_sumtree *b)
{
    for (int k = 0; k < a->nlev; k++) {
        size_t slots = k + 1 < a->nlev ? 8 * a->len[k + 1] : 1;
        if (memcmp(a->sum[k], b->sum[k], slots * sizeof(double)) ||
            memcmp(a->mn[k], b->mn[k], slots * sizeof(float)) ||
            (k && memcmp(a->drift[k], b->drift[k], slots * sizeof(double))))
            return 0;
    }
    return memcmp(a->leaf, b->leaf, a->cap * sizeof(float)) == 0;
}

/* A batch that writes every leaf its own value again changes no node (the
 * update skips those leaves' paths and the top levels' resum); a batch
 * that changes a leaf and then writes its old value back within the same
 * batch leaves the old value, and the tree consistent. */
static void test_sumtree_unchanged(void)
{
    enum { N = 3000, B = 256 };
    exr_sumtree t, u;
    exr_sumtree_init(&t);
    exr_sumtree_init(&u);
    CHECK_RET(exr_sumtree_reserve(&t, N) == EXR_OK && exr_sumtree_reserve(&u, N) == EXR_OK);
    exr_rng r;
    exr_rng_seed(&r, 17, 2);
    static size_t idx[B], scratch[B];
    static float v[B];
    char msg[256];
    for (size_t i = 0; i < N; i++)
        exr_sumtree_set(&t, i, (float)(0.05 + exr_rng_double(&r)));
    for (int round = 0; round < 50; round++) {
        /* single updates first: nodes at every level then carry deltas
         * (drift bounds that a resum from their children would reset) */
        for (int k = 0; k < 5; k++)
            exr_sumtree_set(&t, (size_t)exr_rng_below(&r, N), (float)(0.05 + exr_rng_double(&r)));
        for (size_t k = 0; k < B; k++) {
            idx[k] = (size_t)exr_rng_below(&r, N);
            v[k] = round % 2 ? t.leaf[idx[k]] : (float)exr_rng_double(&r);
        }
        /* u: a copy of t's nodes, to compare with after the batch */
        for (int k = 0; k < t.nlev; k++) {
            size_t slots = k + 1 < t.nlev ? 8 * t.len[k + 1] : 1;
            memcpy(u.sum[k], t.sum[k], slots * sizeof(double));
            memcpy(u.mn[k], t.mn[k], slots * sizeof(float));
            if (k)
                memcpy(u.drift[k], t.drift[k], slots * sizeof(double));
        }
        memcpy(u.leaf, t.leaf, t.cap * sizeof(float));
        exr_sumtree_set_many(&t, B, idx, v, scratch);
        CHECK_RET(exr_sumtree_check(&t, N, msg, sizeof msg) == 0);
        if (round % 2)
            CHECK_RET(sumtree_nodes_equal(&t, &u));
    }
    /* leaf 7 changed, then its old value written back, in one batch */
    float old = t.leaf[7];
    size_t two[2] = {7, 7};
    float back[2] = {old * 3 + 1, old};
    exr_sumtree_set_many(&t, 2, two, back, scratch);
    CHECK_RET(t.leaf[7] == old && exr_sumtree_check(&t, N, msg, sizeof msg) == 0);
    exr_sumtree_free(&t);
    exr_sumtree_free(&u);
}

/* The batch draw takes two draws at a time (one per vector lane, SSE2);
 * each must land where the one-draw descent lands: the same rng stream
 * drawn as one batch of 257 (pairs and an odd one) and as 257 batches of
 * one. Leaves with zeros and float's range, and a second round with every
 * node inflated (the fallback in some lanes and not in the other). */
static void test_sumtree_pairs(void)
{
    enum { N = 20000, B = 257 };
    exr_sumtree t;
    exr_sumtree_init(&t);
    CHECK_RET(exr_sumtree_reserve(&t, N) == EXR_OK);
    exr_rng r, r1, r2;
    exr_rng_seed(&r, 23, 4);
    for (size_t i = 0; i < N; i++) {
        int kind = (int)exr_rng_below(&r, 5);
        double e = exr_rng_double(&r);
        exr_sumtree_set(&t, i, kind == 0 ? 0.0f : kind == 1 ? (float)pow(10.0, -30.0 + 60.0 * e)
                                                            : (float)(0.01 + e));
    }
    static size_t many[B], one[1];
    static double scratch[B];
    for (int round = 0; round < 2; round++) {
        if (round == 1)
            for (int k = 0; k < t.nlev; k++)
                for (size_t j = 0; j < t.len[k]; j++)
                    t.sum[k][j] *= 1.0 + 0.3 * (double)(j % 3);
        for (int rep = 0; rep < 20; rep++) {
            exr_rng_seed(&r1, 100 + (uint64_t)rep, 1);
            exr_rng_seed(&r2, 100 + (uint64_t)rep, 1);
            exr_sumtree_sample(&t, &r1, B, many, scratch);
            for (size_t b = 0; b < B; b++) {
                exr_sumtree_sample(&t, &r2, 1, one, scratch);
                CHECK_RET(one[0] == many[b] && t.leaf[many[b]] > 0);
            }
        }
    }
    exr_sumtree_free(&t);
}

/* The four-lane AVX2 descent and the eight-lane AVX-512 one (where the
 * machine has them) against the pairs and the one-draw descent: the same rng
 * stream drawn with each must give the same leaves bit for bit, for every
 * batch size mod 4 and mod 8,
 * on trees of one to eight levels, with zero leaves, float's range, and
 * every internal node inflated in the last round (CHOOSE in some lanes of
 * a vector and not in the others). */
static void test_sumtree_quads(void)
{
    static const size_t sizes[] = {1, 9, 64, 1000, 70000, 2100000};
    static size_t on[300], off[300], oct[300];
    static double scratch[300];
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        exr_sumtree t;
        exr_sumtree_init(&t);
        CHECK_RET(exr_sumtree_reserve(&t, sizes[z]) == EXR_OK);
        exr_rng r, r1, r2, r3;
        exr_rng_seed(&r, 31, (uint64_t)z);
        for (size_t i = 0; i < sizes[z]; i++) {
            int kind = (int)exr_rng_below(&r, 4);
            double e = exr_rng_double(&r);
            t.leaf[i] = kind == 0 && i ? 0.0f : kind == 1 ? (float)pow(10.0, -30.0 + 60.0 * e)
                                                          : (float)(0.01 + e);
        }
        exr_sumtree_rebuild(&t);
        for (int round = 0; round < 3; round++) {
            if (round == 2)
                for (int k = 0; k < t.nlev; k++)
                    for (size_t j = 0; j < t.len[k]; j++)
                        t.sum[k][j] *= 1.0 + 0.4 * (double)(j % 3);
            for (size_t count = 1; count <= 300; count += count < 12 ? 1 : 41) {
                exr_rng_seed(&r1, 7 + count, (uint64_t)round);
                exr_rng_seed(&r2, 7 + count, (uint64_t)round);
                exr_rng_seed(&r3, 7 + count, (uint64_t)round);
                exr_sumtree_sample_lanes(&t, &r1, count, on, scratch, 1);
                exr_sumtree_sample_lanes(&t, &r2, count, off, scratch, 0);
                exr_sumtree_sample_lanes(&t, &r3, count, oct, scratch, 2);
                for (size_t b = 0; b < count; b++)
                    CHECK_RET(on[b] == off[b] && oct[b] == off[b] && on[b] < sizes[z] &&
                              t.leaf[on[b]] > 0);
            }
        }
        exr_sumtree_free(&t);
    }
}

/* The stored form of priorities (powa.h) with each width of lanes: AVX-512's
 * 8, AVX2's 4 and SSE2's 2 (where the machine has them) and one at a time
 * (exr_pow_one) must give the same bits, for priorities across double's
 * range (subnormal, zero, around 1, large) in every position of a batch of
 * every length mod 32, and for several alphas. A batch holding a zero or a
 * subnormal priority goes one at a time in the lanes' chunk that holds it;
 * the others stay in the lanes. */
static void test_pow_lanes(void)
{
    static const double alphas[] = {0.6, 0.7, 0.4, 1.3, 3.9, 1e-3};
    enum { MAX = 300 };
    static double p[MAX];
    static float w[3][MAX];
    exr_rng r;
    exr_rng_seed(&r, 41, 0);
    for (size_t a = 0; a < sizeof alphas / sizeof alphas[0]; a++)
        for (size_t count = 1; count <= MAX; count += count < 40 ? 1 : 37) {
            for (size_t k = 0; k < count; k++) {
                int kind = (int)exr_rng_below(&r, 16);
                double e = exr_rng_double(&r);
                p[k] = kind == 0   ? 0.0
                       : kind == 1 ? 1e-310 * (0.5 + e) /* subnormal */
                       : kind == 2 ? pow(10.0, -300.0 + 600.0 * e)
                                   : 0.01 + 10.0 * e;
            }
            for (int lanes = 0; lanes <= 2; lanes++)
                exr_pow_leaves_lanes(p, 1, count, alphas[a], w[lanes], lanes);
            for (size_t k = 0; k < count; k++) {
                float one = exr_pow_one(p[k], alphas[a]);
                CHECK_RET(memcmp(&w[0][k], &one, sizeof one) == 0);
                CHECK_RET(memcmp(&w[1][k], &one, sizeof one) == 0);
                CHECK_RET(memcmp(&w[2][k], &one, sizeof one) == 0);
            }
        }
}

/* A draw whose offset lands at or past the sum of a node's children (the
 * node's sum is within rounding of theirs, not equal): the halving descent
 * then falls back to the prefix scan, which takes the last positive child.
 * Here every internal node is inflated by half so that a third of the draws
 * take that path at some level; none may return a zero leaf, and draws
 * below the children's sums must keep their proportions. */
static void test_sumtree_past_total(void)
{
    exr_sumtree t;
    exr_sumtree_init(&t);
    enum { N = 512, B = 4096 };
    CHECK_RET(exr_sumtree_reserve(&t, N) == EXR_OK);
    for (size_t i = 0; i < N; i++)
        exr_sumtree_set(&t, i, i % 8 == 3 || i % 8 == 5 ? (float)(i % 8) : 0.0f);
    for (int k = 0; k < t.nlev; k++)
        for (size_t j = 0; j < t.len[k]; j++)
            t.sum[k][j] *= 1.5;
    exr_rng r;
    exr_rng_seed(&r, 5, 1);
    static size_t out[B];
    static double scratch[B];
    long hits[8] = {0};
    for (int rep = 0; rep < 20; rep++) {
        exr_sumtree_sample(&t, &r, B, out, scratch);
        for (size_t b = 0; b < B; b++) {
            CHECK_RET(out[b] < N && t.leaf[out[b]] > 0);
            hits[out[b] % 8]++;
        }
    }
    /* both positive kinds are drawn; the fallback favours the last (5) */
    CHECK_RET(hits[3] > 0 && hits[5] > hits[3]);
    exr_sumtree_free(&t);
}

/* ---- episode table ------------------------------------------------------ */

/* exr_episodes_find and exr_episodes_find_many give every handle's slot
 * (EXR_NIL for the removed ones, a negative and one never inserted). */
static int find_many_agrees(const exr_episodes *t, int64_t n, const uint32_t *slot_of,
                            const char *live)
{
    static int64_t handles[5002];
    if (n + 2 > 5002)
        return 0;
    static size_t slots[5002];
    for (int64_t g = 0; g < n; g++)
        handles[g] = n - 1 - g; /* scattered over the map's cells as any batch */
    handles[n] = -5;
    handles[n + 1] = n + 10;
    exr_episodes_find_many(t, (size_t)n + 2, handles, slots);
    for (int64_t g = 0; g < n + 2; g++) {
        int64_t h = handles[g];
        uint32_t want = h >= 0 && h < n && live[h] ? slot_of[h] : EXR_NIL;
        if (exr_episodes_find(t, h) != want || slots[g] != want)
            return 0;
    }
    return 1;
}

static void test_episodes(void)
{
    exr_episodes t;
    exr_episodes_init(&t);
    enum { N = 5000 };
    static uint32_t slot_of[N];
    static char live[N];
    for (int64_t h = 0; h < N; h++) {
        CHECK_RET(exr_episodes_reserve(&t) == EXR_OK);
        exr_body *b = exr_body_new(1);
        CHECK_RET(b);
        slot_of[h] = exr_episodes_insert(&t, h, b);
        live[h] = 1;
    }
    exr_rng r;
    exr_rng_seed(&r, 1, 2);
    /* remove a random two thirds, checking every lookup as we go */
    for (int i = 0; i < 2 * N; i++) {
        int64_t h = (int64_t)exr_rng_below(&r, N);
        if (!live[h])
            continue;
        exr_body_free(t.slab[slot_of[h]].body);
        exr_episodes_remove(&t, slot_of[h]);
        live[h] = 0;
        if (i % 97 == 0)
            CHECK_RET(find_many_agrees(&t, N, slot_of, live));
    }
    uint64_t count = 0;
    int64_t prev = -1;
    for (uint32_t s = t.head; s != EXR_NIL; s = t.slab[s].next) {
        CHECK_RET(t.slab[s].handle > prev);
        CHECK_RET(live[t.slab[s].handle]);
        prev = t.slab[s].handle;
        count++;
    }
    CHECK_RET(count == t.count);
    CHECK_RET(find_many_agrees(&t, N, slot_of, live));
    exr_episodes_free(&t);
}

/* The hint slot answers only for its own handle: after its episode is
 * removed, and after the slot is reused by another episode, lookups of the
 * old handle miss and every other handle still goes through the map. */
static void test_episodes_hint(void)
{
    exr_episodes t;
    exr_episodes_init(&t);
    uint32_t s[4];
    for (int64_t h = 0; h < 3; h++) {
        CHECK(exr_episodes_reserve(&t) == EXR_OK);
        exr_body *b = exr_body_new(1);
        CHECK(b);
        s[h] = exr_episodes_insert(&t, h, b);
        CHECK(t.hint == s[h]);
    }
    CHECK(exr_episodes_find(&t, 2) == s[2]);
    CHECK(exr_episodes_find(&t, 0) == s[0] && exr_episodes_find(&t, 1) == s[1]);
    exr_episodes_hint(&t, s[0]);
    CHECK(exr_episodes_find(&t, 1) == s[1] && exr_episodes_find(&t, 2) == s[2]);
    exr_episodes_hint(&t, s[2]);
    exr_body_free(t.slab[s[2]].body);
    exr_episodes_remove(&t, s[2]);
    CHECK(exr_episodes_find(&t, 2) == EXR_NIL); /* hint on a freed slot */
    CHECK(exr_episodes_reserve(&t) == EXR_OK);
    exr_body *b = exr_body_new(1);
    CHECK(b);
    s[3] = exr_episodes_insert(&t, 3, b);
    CHECK(s[3] == s[2]); /* the freed slot, reused */
    CHECK(exr_episodes_find(&t, 2) == EXR_NIL); /* hint on the slot, another handle */
    CHECK(exr_episodes_find(&t, 3) == s[3]);
    CHECK(exr_episodes_find(&t, 0) == s[0] && exr_episodes_find(&t, 1) == s[1]);
done:
    exr_episodes_free(&t);
}

/* Handles whose low bits collide in the direct table (gaps of 1,000 to
 * 5,000 between them, so that many share an entry whatever the map's
 * size), a random half removed, then more inserted: every handle, live,
 * removed or never inserted, is found by exr_episodes_find and
 * exr_episodes_find_many exactly where the truth says, through the direct
 * table or the map behind it. */
static void test_episodes_direct(void)
{
    enum { N = 3000 };
    static int64_t handles[2 * N];
    static uint32_t slot[2 * N];
    static size_t got[2 * N];
    exr_episodes t;
    exr_episodes_init(&t);
    exr_rng r;
    exr_rng_seed(&r, 5, 6);
    int64_t h = 7;
    for (int k = 0; k < N; k++) {
        h += 1000 + (int64_t)exr_rng_below(&r, 4000);
        handles[k] = h;
        CHECK_RET(exr_episodes_reserve(&t) == EXR_OK);
        exr_body *b = exr_body_new(1);
        CHECK_RET(b);
        slot[k] = exr_episodes_insert(&t, h, b);
    }
    for (int k = 0; k < N; k++)
        if (exr_rng_below(&r, 2)) {
            exr_body_free(t.slab[slot[k]].body);
            exr_episodes_remove(&t, slot[k]);
            slot[k] = EXR_NIL;
        }
    for (int k = N; k < 2 * N; k++) { /* reuse the freed slots; half never inserted */
        h += 1 + (int64_t)exr_rng_below(&r, 3);
        handles[k] = h;
        slot[k] = EXR_NIL;
        if (k % 2)
            continue;
        CHECK_RET(exr_episodes_reserve(&t) == EXR_OK);
        exr_body *b = exr_body_new(1);
        CHECK_RET(b);
        slot[k] = exr_episodes_insert(&t, h, b);
    }
    exr_episodes_find_many(&t, 2 * N, handles, got);
    for (int k = 0; k < 2 * N; k++) {
        CHECK_RET(exr_episodes_find(&t, handles[k]) == slot[k]);
        CHECK_RET(got[k] == slot[k]);
    }
    exr_episodes_free(&t);
}

/* ---- buffer ------------------------------------------------------------- */

typedef struct {
    float state[2];
    int64_t action;
    float reward;
} step_t;

static exr_buffer *make_buffer(uint32_t pick_len, bool allow_short, uint64_t capacity, int evict)
{
    exr_config cfg = {
        .state_bytes = 2 * sizeof(float),
        .action_bytes = sizeof(int64_t),
        .reward_bytes = sizeof(float),
        .capacity = capacity,
        .pick_len = pick_len,
        .allow_short = allow_short,
        .eviction = evict,
        .seed = 123,
    };
    exr_buffer *b = NULL;
    return exr_buffer_new(&cfg, &b) == EXR_OK ? b : NULL;
}

/* b (from make_buffer, NULL passed on) with a prioritized selector of
 * alpha and beta (*sel); NULL, b freed, if it cannot be added. */
static exr_buffer *with_prio_selector(exr_buffer *b, double alpha, double beta, int64_t *sel)
{
    double params[2] = {alpha, beta};
    if (!b)
        return NULL;
    exr_buffer_lock(b);
    exr_status st = exr_buffer_add_selector_locked(b, 1, params, sel);
    exr_buffer_unlock(b);
    if (st == EXR_OK)
        return b;
    exr_buffer_free(b);
    return NULL;
}

/* Records T steps whose state encodes (tag, t). */
static int64_t record_steps(exr_buffer *b, int64_t h, int tag, int t0, size_t T, bool end,
                            bool terminated, bool with_final)
{
    float st[4096][2], fin[2] = {(float)tag, -1.0f};
    int64_t ac[4096];
    float rw[4096];
    for (size_t t = 0; t < T; t++) {
        st[t][0] = (float)tag;
        st[t][1] = (float)(t0 + (int)t);
        ac[t] = tag * 1000 + t0 + (int64_t)t;
        rw[t] = (float)(t0 + (int)t) * 0.5f;
    }
    exr_steps in = {st, ac, rw, NULL, T, with_final ? fin : NULL, end, terminated, NULL, 0};
    int64_t out = -1;
    exr_buffer_lock(b);
    exr_status s = exr_buffer_record_locked(b, h, &in, &out);
    exr_buffer_unlock(b);
    return s == EXR_OK ? out : -100;
}

static int check_ok(exr_buffer *b)
{
    char msg[512];
    exr_buffer_lock(b);
    int bad = exr_buffer_check_locked(b, msg, sizeof msg);
    exr_buffer_unlock(b);
    if (bad)
        fprintf(stderr, "invariant: %s\n", msg);
    return !bad;
}

static void test_picks_and_batch(void)
{
    exr_buffer *b = make_buffer(3, true, 0, EXR_EVICT_FIFO);
    CHECK_RET(b);
    int64_t h = record_steps(b, -1, 7, 0, 10, false, false, false);
    CHECK_RET(h == 0);
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_num_picks_locked(b) == 7); /* c = 9 complete steps: p + 3 <= 9 */
    exr_buffer_unlock(b);
    CHECK_RET(record_steps(b, h, 7, 10, 1, true, true, false) == h); /* ends: c = 11 */
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_num_picks_locked(b) == 11); /* allow_short: every p < 11 */
    CHECK_RET(exr_buffer_len_locked(b) == 11);
    exr_buffer_unlock(b);
    CHECK_RET(check_ok(b));

    int64_t uh;
    double none[1] = {0};
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 0, none, &uh) == EXR_OK);
    exr_buffer_unlock(b);
    /* gather every pick and check its contents */
    enum { B = 11, L = 3 };
    int64_t epi[B], pos[B], len[B], lnx[B];
    float st[B][L][2], nx[B][L][2], rw[B][L], w[B];
    int64_t ac[B][L];
    for (int i = 0; i < B; i++) {
        epi[i] = h;
        pos[i] = i;
    }
    exr_batch_out o = {st, ac, rw, nx, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, false};
    int64_t qe[B], qp[B];
    memcpy(qe, epi, sizeof qe);
    memcpy(qp, pos, sizeof qp);
    CHECK_RET(exr_buffer_gather(b, uh, B, qe, qp, &o) == EXR_OK);
    for (int i = 0; i < B; i++) {
        int64_t l = i + L <= 11 ? L : 11 - i;
        CHECK_RET(len[i] == l);
        CHECK_RET(lnx[i] == (i + l == 11 ? l - 1 : l)); /* terminal at the last step */
        CHECK_RET(w[i] == 1.0f);
        for (int t = 0; t < L; t++) {
            if (t < l) {
                CHECK_RET(st[i][t][1] == (float)(i + t));
                CHECK_RET(ac[i][t] == 7000 + i + t);
                CHECK_RET(rw[i][t] == (float)(i + t) * 0.5f);
                if (i + t + 1 < 11)
                    CHECK_RET(nx[i][t][1] == (float)(i + t + 1));
                else
                    CHECK_RET(nx[i][t][0] == 0 && nx[i][t][1] == 0); /* terminal, no final */
            } else {
                CHECK_RET(st[i][t][0] == 0 && st[i][t][1] == 0 && ac[i][t] == 0 && rw[i][t] == 0);
                CHECK_RET(nx[i][t][0] == 0 && nx[i][t][1] == 0);
            }
        }
    }
    /* shared next states: the pick's states, its last next state, zeros */
    float seq[B][L + 1][2];
    memset(seq, 0xff, sizeof seq);
    exr_batch_out so = {seq, ac, rw, NULL, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, true};
    CHECK_RET(exr_buffer_gather(b, uh, B, qe, qp, &so) == EXR_OK);
    for (int i = 0; i < B; i++) {
        int64_t l = len[i];
        CHECK_RET(memcmp(seq[i], st[i], (size_t)l * sizeof st[i][0]) == 0);
        CHECK_RET(memcmp(seq[i][l], nx[i][l - 1], sizeof nx[i][0]) == 0);
        for (int64_t t = l + 1; t <= L; t++)
            CHECK_RET(seq[i][t][0] == 0 && seq[i][t][1] == 0);
    }
    /* a pick that does not exist */
    int64_t be = h, bp = 11;
    CHECK_RET(exr_buffer_gather(b, uh, 1, &be, &bp, &o) == EXR_ENOTFOUND);
    CHECK_RET(exr_buffer_gather(b, uh + 5, 1, &be, &bp, &o) == EXR_ENOTFOUND);
    /* recording into the ended episode starts a new one */
    CHECK_RET(record_steps(b, h, 8, 0, 2, false, false, false) == 1);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

static void test_long_episode_segments(void)
{
    /* picks that straddle segment boundaries, with a final state */
    exr_buffer *b = make_buffer(8, false, 0, EXR_EVICT_FIFO);
    CHECK_RET(b);
    int64_t h = -1;
    for (int t0 = 0; t0 < 5000; t0 += 1000)
        h = record_steps(b, h, 3, t0, 1000, t0 == 4000, false, true);
    CHECK_RET(h == 0);
    CHECK_RET(check_ok(b));
    int64_t sel;
    double none[1] = {0};
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 0, none, &sel) == EXR_OK);
    uint64_t np = exr_buffer_num_picks_locked(b);
    exr_buffer_unlock(b);
    CHECK_RET(np == 5000 - 8 + 1);
    enum { B = 4993 };
    static int64_t epi[B], pos[B], len[B], lnx[B], ac[B][8];
    static float st[B][8][2], nx[B][8][2], rw[B][8], w[B];
    for (int i = 0; i < B; i++) {
        epi[i] = h;
        pos[i] = i;
    }
    exr_batch_out o = {st, ac, rw, nx, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, false};
    CHECK_RET(exr_buffer_gather(b, sel, B, epi, pos, &o) == EXR_OK);
    for (int i = 0; i < B; i++) {
        CHECK_RET(len[i] == 8 && lnx[i] == 8);
        for (int t = 0; t < 8; t++) {
            CHECK_RET(st[i][t][1] == (float)(i + t));
            CHECK_RET(ac[i][t] == 3000 + i + t);
            if (i + t + 1 < 5000)
                CHECK_RET(nx[i][t][1] == (float)(i + t + 1));
            else
                CHECK_RET(nx[i][t][0] == 3 && nx[i][t][1] == -1); /* the final state */
        }
    }
    /* shared next states: each pick's 8 states, then its last next state */
    static float seq[B][9][2];
    exr_batch_out so = {seq, ac, rw, NULL, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, true};
    CHECK_RET(exr_buffer_gather(b, sel, B, epi, pos, &so) == EXR_OK);
    for (int i = 0; i < B; i++)
        CHECK_RET(memcmp(seq[i], st[i], sizeof st[i]) == 0 &&
                  memcmp(seq[i][8], nx[i][7], sizeof nx[i][7]) == 0);
    exr_buffer_free(b);
}

static void test_eviction(void)
{
    /* fifo: capacity 25, episodes of 10 */
    exr_buffer *b = make_buffer(1, false, 25, EXR_EVICT_FIFO);
    CHECK_RET(b);
    for (int e = 0; e < 5; e++)
        CHECK_RET(record_steps(b, -1, e, 0, 10, true, true, false) == e);
    int64_t hs[8];
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_len_locked(b) == 20 && exr_buffer_num_episodes_locked(b) == 2);
    exr_buffer_handles_locked(b, hs);
    exr_buffer_unlock(b);
    CHECK_RET(hs[0] == 3 && hs[1] == 4);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);

    /* an episode longer than capacity evicts itself */
    b = make_buffer(1, false, 5, EXR_EVICT_FIFO);
    CHECK_RET(b);
    int64_t h = record_steps(b, -1, 0, 0, 5, false, false, false);
    CHECK_RET(h == 0);
    CHECK_RET(record_steps(b, h, 0, 5, 1, false, false, false) == 0); /* returns the evicted handle */
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_len_locked(b) == 0 && exr_buffer_num_episodes_locked(b) == 0);
    exr_buffer_unlock(b);
    CHECK_RET(record_steps(b, 0, 0, 6, 1, false, false, false) == 1); /* new episode */
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);

    /* second chance: a sampled episode is skipped once */
    b = make_buffer(1, false, 30, EXR_EVICT_SECOND_CHANCE);
    CHECK_RET(b);
    for (int e = 0; e < 3; e++)
        CHECK_RET(record_steps(b, -1, e, 0, 10, true, false, true) == e);
    int64_t sel;
    double none[1] = {0};
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 0, none, &sel) == EXR_OK);
    exr_buffer_unlock(b);
    /* mark episode 0 sampled */
    int64_t epi = 0, pos = 0, len, lnx, ac[1];
    float st[2], nx[2], rw[1], w[1];
    exr_batch_out o = {st, ac, rw, nx, &len, &lnx, &epi, &pos, w, NULL, NULL, 0, NULL, false};
    CHECK_RET(exr_buffer_gather(b, sel, 1, &epi, &pos, &o) == EXR_OK);
    CHECK_RET(record_steps(b, -1, 3, 0, 10, true, false, true) == 3); /* evicts 1, not 0 */
    exr_buffer_lock(b);
    exr_buffer_handles_locked(b, hs);
    exr_buffer_unlock(b);
    CHECK_RET(hs[0] == 0 && hs[1] == 2 && hs[2] == 3);
    CHECK_RET(record_steps(b, -1, 4, 0, 10, true, false, true) == 4); /* hand moves on: evicts 2 */
    exr_buffer_lock(b);
    exr_buffer_handles_locked(b, hs);
    exr_buffer_unlock(b);
    CHECK_RET(hs[0] == 0 && hs[1] == 3 && hs[2] == 4);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

/* exr_first_bad_priority against the rule one value at a time (finite and
 * >= 0, -0.0 included), for every length up to 40 and a bad value at every
 * place, so that the two-at-a-time checks, the branch every eight and the
 * scalar tail each see one. */
static void test_first_bad_priority(void)
{
    const double good[] = {0.0, -0.0, 1.0, DBL_MAX, DBL_MIN, 4.9e-324, 1e-300, 3.5};
    const double bad[] = {NAN, -NAN, INFINITY, -INFINITY, -1.0, -DBL_MIN, -4.9e-324, -DBL_MAX};
    enum { N = 40 };
    double p[N];
    for (size_t n = 0; n <= N; n++) {
        for (size_t i = 0; i < n; i++)
            p[i] = good[i % (sizeof good / sizeof good[0])];
        CHECK_RET(exr_first_bad_priority(p, n) == n);
        for (size_t at = 0; at < n; at++)
            for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
                double keep = p[at];
                p[at] = bad[k];
                CHECK_RET(exr_first_bad_priority(p, n) == at);
                if (at + 1 < n) { /* a second bad value later: still the first */
                    double keep2 = p[n - 1];
                    p[n - 1] = bad[(k + 1) % (sizeof bad / sizeof bad[0])];
                    CHECK_RET(exr_first_bad_priority(p, n) == at);
                    p[n - 1] = keep2;
                }
                p[at] = keep;
            }
    }
}

static void test_priorities(void)
{
    exr_buffer *b = make_buffer(1, false, 0, EXR_EVICT_FIFO);
    CHECK_RET(b);
    int64_t sel;
    double params[2] = {1.0, 1.0};
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 1, params, &sel) == EXR_OK);
    double bad[2] = {-1.0, 0.4};
    int64_t sel2;
    CHECK_RET(exr_buffer_add_selector_locked(b, 1, bad, &sel2) == EXR_EINVAL);
    CHECK_RET(exr_buffer_add_selector_locked(b, 9, params, &sel2) == EXR_EINVAL);
    exr_buffer_unlock(b);
    /* 4 picks with priorities 0, 1, 2, 3 (the first step's recorded priority) */
    float st[5][2] = {{0}};
    int64_t ac[5] = {0};
    float rw[5] = {0};
    double pr[5] = {0, 1, 2, 3, 9};
    exr_steps in = {st, ac, rw, pr, 5, NULL, true, true, NULL, 0};
    int64_t h;
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_record_locked(b, -1, &in, &h) == EXR_OK);
    exr_buffer_unlock(b);
    enum { B = 60000 };
    static int64_t epi[B], pos[B], len[B], lnx[B], acs[B];
    static float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, false};
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK);
    long hits[5] = {0};
    for (int i = 0; i < B; i++) {
        CHECK_RET(pos[i] >= 1 && pos[i] <= 4); /* priority 0 is never drawn */
        hits[pos[i]]++;
        /* w = (min / p)^beta with min 1 */
        CHECK_RET(fabsf(w[i] - 1.0f / (float)pr[pos[i]]) < 1e-6f);
    }
    for (int p = 1; p <= 4; p++)
        CHECK_RET(fabs(hits[p] / (double)B - pr[p] / 15.0) < 0.01);
    /* set_priority: skip missing picks, reject bad values before any change */
    int64_t qe[3] = {h, h, 99}, qp[3] = {1, 2, 0};
    double np[3] = {5, 5, 5}, badp[3] = {5, NAN, 5};
    size_t applied = 0;
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_set_priority_locked(b, sel, 3, qe, qp, badp, 1, &applied) == EXR_EINVAL);
    CHECK_RET(exr_buffer_set_priority_locked(b, sel, 3, qe, qp, np, 1, &applied) == EXR_OK);
    CHECK_RET(applied == 2);
    double got[2];
    CHECK_RET(exr_buffer_stored_priority_locked(b, sel, 2, qe, qp, got) == EXR_OK);
    CHECK_RET(got[0] == 5 && got[1] == 5);
    /* a later selector starts existing picks at its maximum so far, 1 */
    double p2[2] = {1.0, 0.0};
    CHECK_RET(exr_buffer_add_selector_locked(b, 1, p2, &sel2) == EXR_OK);
    int64_t ae[5] = {h, h, h, h, h}, ap[5] = {0, 1, 2, 3, 4};
    double g2[4];
    CHECK_RET(exr_buffer_stored_priority_locked(b, sel2, 4, ae, ap, g2) == EXR_OK);
    CHECK_RET(g2[0] == 1 && g2[1] == 1 && g2[2] == 1 && g2[3] == 1);
    CHECK_RET(exr_buffer_remove_selector_locked(b, sel2) == EXR_OK);
    CHECK_RET(exr_buffer_remove_selector_locked(b, sel2) == EXR_ENOTFOUND);
    /* all priorities zero: nothing can be drawn */
    double zero = 0;
    CHECK_RET(exr_buffer_set_priority_locked(b, sel, 5, ae, ap, &zero, 0, &applied) == EXR_OK);
    CHECK_RET(applied == 5);
    exr_buffer_unlock(b);
    CHECK_RET(exr_buffer_get_batch(b, sel, 1, &o) == EXR_EEMPTY);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

static void test_random_ops(void)
{
    /* random records, endings, evictions, selectors and priorities, with the
     * invariant check after every operation */
    exr_rng r;
    exr_rng_seed(&r, 99, 0);
    for (int evict = 0; evict < 2; evict++) {
        exr_buffer *b = make_buffer(1 + (uint32_t)evict * 3, evict == 1, 300, evict);
        CHECK_RET(b);
        int64_t hs[8] = {-1, -1, -1, -1, -1, -1, -1, -1};
        int64_t sels[4];
        int nsel = 0;
        for (int op = 0; op < 4000; op++) {
            uint64_t what = exr_rng_below(&r, 100);
            int slot = (int)exr_rng_below(&r, 8);
            if (what < 70) {
                size_t T = 1 + (size_t)exr_rng_below(&r, 20);
                bool end = exr_rng_below(&r, 4) == 0;
                hs[slot] = record_steps(b, hs[slot], slot, 0, T, end, exr_rng_below(&r, 2),
                                        exr_rng_below(&r, 2));
                CHECK_RET(hs[slot] >= 0);
            } else if (what < 75 && nsel < 4) {
                double p[2] = {0.7, 0.5};
                exr_buffer_lock(b);
                CHECK_RET(exr_buffer_add_selector_locked(b, (int)(op & 1), p, &sels[nsel]) == EXR_OK);
                exr_buffer_unlock(b);
                nsel++;
            } else if (what < 78 && nsel > 0) {
                exr_buffer_lock(b);
                CHECK_RET(exr_buffer_remove_selector_locked(b, sels[--nsel]) == EXR_OK);
                exr_buffer_unlock(b);
            } else if (nsel > 0) {
                enum { B = 16 };
                int64_t epi[B], pos[B], len[B], lnx[B], ac[B * 4];
                float st[B * 4][2], nx[B * 4][2], rw[B * 4], w[B];
                exr_batch_out o = {st, ac, rw, nx, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, false};
                int64_t s = sels[exr_rng_below(&r, (uint64_t)nsel)];
                exr_status gs = exr_buffer_get_batch(b, s, B, &o);
                CHECK_RET(gs == EXR_OK || gs == EXR_EEMPTY);
                if (gs == EXR_OK) {
                    double np[B];
                    for (int i = 0; i < B; i++)
                        np[i] = (double)exr_rng_below(&r, 5);
                    size_t applied;
                    exr_buffer_lock(b);
                    CHECK_RET(exr_buffer_set_priority_locked(b, s, B, epi, pos, np, 1, &applied) ==
                          EXR_OK);
                    exr_buffer_unlock(b);
                }
            }
            CHECK_RET(check_ok(b));
        }
        exr_buffer_free(b);
    }
}

static void test_segments_grow_and_shrink(void)
{
    /* rows of 20 bytes make the first segment's nominal size 256 rows (at
     * least 4 KiB): a 3-step episode must not take them, and an ended
     * episode keeps only what it uses */
    exr_buffer *b = make_buffer(100, true, 0, EXR_EVICT_FIFO);
    CHECK_RET(b);
    CHECK_RET(b->lay.base_shift == 8);
    int64_t h = record_steps(b, -1, 1, 0, 3, false, false, false);
    const exr_episode *e = &b->eps.slab[exr_episodes_find(&b->eps, h)];
    CHECK_RET(e->body->nsegs == 1 && e->body->last_rows == 16); /* not 256 */
    CHECK_RET(e->seg0 == e->body->segs[0]);
    h = record_steps(b, h, 1, 3, 997, true, true, false);
    e = &b->eps.slab[exr_episodes_find(&b->eps, h)];
    /* nominal segments of 256, 512, 1024 rows (segment 0 grown from 16,
     * the others allocated whole): record 1000 is row 231 of the third,
     * whose 792 spare rows (15 KiB) the end spared */
    CHECK_RET(e->body->nsegs == 3 && e->body->last_rows == 232);
    CHECK_RET(e->body->aux_cap == 1000 && e->seg0 == e->body->segs[0]);
    /* 905 records: 137 rows of the third used, the spare cut too */
    int64_t h2 = record_steps(b, -1, 2, 0, 905, true, true, false);
    const exr_body *body = b->eps.slab[exr_episodes_find(&b->eps, h2)].body;
    CHECK_RET(body->nsegs == 3 && body->last_rows == 137 && body->aux_cap == 905);
    /* 4 records into segment 0 of a new episode: 16 rows, 12 spare = 240
     * bytes, under the 1 KiB worth a copy */
    int64_t h3 = record_steps(b, -1, 3, 0, 4, true, true, false);
    body = b->eps.slab[exr_episodes_find(&b->eps, h3)].body;
    CHECK_RET(body->nsegs == 1 && body->last_rows == 16);
    /* 150 records into an open episode (segment 0 grown to 256 rows), then
     * its end: the cut moves segment 0, and the slot's copy follows */
    int64_t h4 = record_steps(b, -1, 4, 0, 150, false, false, false);
    e = &b->eps.slab[exr_episodes_find(&b->eps, h4)];
    const unsigned char *before = e->seg0;
    CHECK_RET(e->body->last_rows == 256 && before == e->body->segs[0]);
    CHECK_RET(record_steps(b, h4, 4, 150, 1, true, true, false) == h4);
    CHECK_RET(e->body->last_rows == 151 && e->seg0 != before && e->seg0 == e->body->segs[0]);
    CHECK_RET(check_ok(b));
    /* contents survive the moves */
    enum { B = 50 };
    int64_t epi[B], pos[B], len[B], lnx[B], ac[B * 100];
    static float st[B * 100][2], nx[B * 100][2];
    float rw[B * 100], w[B];
    int64_t sel;
    double none[1] = {0};
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 0, none, &sel) == EXR_OK);
    exr_buffer_unlock(b);
    for (int i = 0; i < B; i++) {
        epi[i] = h;
        pos[i] = i * 19;
    }
    exr_batch_out o = {st, ac, rw, nx, len, lnx, epi, pos, w, NULL, NULL, 0, NULL, false};
    int64_t qe[B], qp[B];
    memcpy(qe, epi, sizeof qe);
    memcpy(qp, pos, sizeof qp);
    CHECK_RET(exr_buffer_gather(b, sel, B, qe, qp, &o) == EXR_OK);
    for (int i = 0; i < B; i++)
        for (int t = 0; t < len[i]; t++)
            CHECK_RET(st[i * 100 + t][1] == (float)(pos[i] + t) && ac[i * 100 + t] == 1000 + pos[i] + t);
    exr_buffer_free(b);
}

static void test_bad_config(void)
{
    exr_config cfg = {.state_bytes = 0, .action_bytes = 8, .reward_bytes = 4, .pick_len = 1};
    exr_buffer *b = NULL;
    CHECK_RET(exr_buffer_new(&cfg, &b) == EXR_EINVAL);
    cfg.state_bytes = 4;
    cfg.pick_len = 0;
    CHECK_RET(exr_buffer_new(&cfg, &b) == EXR_EINVAL);
    cfg.pick_len = 1;
    cfg.eviction = 7;
    CHECK_RET(exr_buffer_new(&cfg, &b) == EXR_EINVAL);
    cfg.eviction = EXR_EVICT_FIFO;
    CHECK_RET(exr_buffer_new(&cfg, &b) == EXR_OK);
    exr_steps none = {0};
    int64_t h;
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_record_locked(b, -1, &none, &h) == EXR_EINVAL); /* T = 0 */
    CHECK_RET(exr_buffer_len_locked(b) == 0);
    exr_buffer_unlock(b);
    exr_buffer_free(b);
}

/* ---- lock assertions (EXR_DEBUG_LOCKS) -------------------------------------- */

/* A *_locked function called without the lock aborts in debug builds; with
 * the lock it runs. Checked in a child process, which must die of SIGABRT. */
static void test_lock_assertion(void)
{
#ifdef EXR_DEBUG_LOCKS
    exr_config cfg = {.state_bytes = 4, .action_bytes = 1, .reward_bytes = 4, .pick_len = 1,
                      .eviction = EXR_EVICT_FIFO, .seed = 1};
    exr_buffer *b = NULL;
    CHECK_RET(exr_buffer_new(&cfg, &b) == EXR_OK);
    exr_buffer_lock(b);
    uint64_t n = exr_buffer_len_locked(b);
    exr_buffer_unlock(b);
    CHECK_RET(n == 0);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        freopen("/dev/null", "w", stderr);
        int64_t h;
        exr_buffer_new_episode_locked(b, &h); /* no lock: must abort */
        _exit(0);
    }
    int status = 0;
    CHECK_RET(pid > 0 && waitpid(pid, &status, 0) == pid);
    CHECK_RET(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    exr_buffer_free(b);
#endif
}

/* ---- ending an episode without a step ------------------------------------ */

/* T steps (tag, t0 + t) into h with priorities 1 + t, ending with the last
 * (a final state (tag, -1) and terminated) when end. Its handle, or -100. */
static int64_t record_prio_run(exr_buffer *b, int64_t h, int tag, int t0, size_t T, bool end)
{
    float st[16][2], fin[2] = {(float)tag, -1.0f}, rw[16] = {0};
    int64_t ac[16];
    double pr[16];
    if (T > 16)
        return -100;
    for (size_t t = 0; t < T; t++) {
        st[t][0] = (float)tag;
        st[t][1] = (float)(t0 + (int)t);
        ac[t] = t0 + (int64_t)t;
        pr[t] = 1.0 + (double)(t0 + (int)t);
    }
    exr_steps in = {st, ac, rw, pr, T, end ? fin : NULL, end, end, NULL, 0};
    int64_t out = -1;
    exr_buffer_lock(b);
    exr_status s = exr_buffer_record_locked(b, h, &in, &out);
    exr_buffer_unlock(b);
    return s == EXR_OK ? out : -100;
}

static exr_status end_episode(exr_buffer *b, int64_t h, const float *fin, bool term,
                              exr_end_outcome *out)
{
    exr_buffer_lock(b);
    exr_status s = exr_buffer_end_episode_locked(b, h, fin, term, out);
    exr_buffer_unlock(b);
    return s;
}

/* The hook's calls: how many, and the last one's arguments. */
static struct {
    int calls;
    int64_t h;
    uint64_t pos;
    const unsigned char *row;
    float fin[2];
    bool end, term, first;
} g_hook;

static void count_hook(void *ctx, exr_buffer *b, int64_t h, uint64_t pos, const unsigned char *row,
                       const unsigned char *fin, bool end, bool terminated, bool first)
{
    (void)ctx;
    (void)b;
    g_hook.calls++;
    g_hook.h = h;
    g_hook.pos = pos;
    g_hook.row = row;
    if (fin)
        memcpy(g_hook.fin, fin, sizeof g_hook.fin);
    g_hook.end = end;
    g_hook.term = terminated;
    g_hook.first = first;
}

/* A buffer (pick_len 3, allow_short as given) with a prioritized selector
 * of alpha 1 (*sel), or NULL. */
static exr_buffer *end_buffer(bool allow_short, int64_t *sel)
{
    return with_prio_selector(make_buffer(3, allow_short, 0, EXR_EVICT_FIFO), 1.0, 0.5, sel);
}

/* Whether a and b hold the same picks in the same table order, with the
 * same stored priorities for selectors sa and sb. */
static int same_table(exr_buffer *a, int64_t sa, exr_buffer *b, int64_t sb)
{
    int64_t e[2][64], p[2][64];
    double q[2][64];
    uint64_t n[2];
    exr_buffer *bs[2] = {a, b};
    int64_t ss[2] = {sa, sb};
    for (int k = 0; k < 2; k++) {
        exr_buffer_lock(bs[k]);
        n[k] = exr_buffer_num_picks_locked(bs[k]);
        if (n[k] <= 64) {
            exr_buffer_picks_locked(bs[k], e[k], p[k]);
            exr_buffer_stored_priority_locked(bs[k], ss[k], n[k], e[k], p[k], q[k]);
        }
        exr_buffer_unlock(bs[k]);
    }
    size_t m = (size_t)n[0];
    return n[0] == n[1] && m <= 64 && !memcmp(e[0], e[1], m * 8) && !memcmp(p[0], p[1], m * 8) &&
           !memcmp(q[0], q[1], m * 8);
}

/* An episode ended by exr_buffer_end_episode_locked against its twin,
 * whose last record call carried the end: the same picks in the same
 * order, with the priorities recorded at record time. */
static void end_like_record(bool allow_short)
{
    int64_t s1, s2;
    exr_buffer *b = end_buffer(allow_short, &s1), *twin = end_buffer(allow_short, &s2);
    exr_end_outcome o;
    float fin[2] = {5.0f, -1.0f};
    CHECK(b && twin);
    CHECK(record_prio_run(b, -1, 5, 0, 4, false) == 0 &&
          record_prio_run(b, 0, 5, 4, 3, false) == 0);
    CHECK(record_prio_run(twin, -1, 5, 0, 4, false) == 0);
    CHECK(record_prio_run(twin, 0, 5, 4, 3, true) == 0);
    exr_buffer_lock(b);
    exr_buffer_set_hook_locked(b, count_hook, NULL);
    exr_buffer_unlock(b);
    memset(&g_hook, 0, sizeof g_hook);
    CHECK(end_episode(b, 0, fin, true, &o) == EXR_OK && o == EXR_END_DONE);
    CHECK(g_hook.calls == 1 && g_hook.h == 0 && g_hook.pos == 7 && !g_hook.row && g_hook.end &&
          g_hook.term && g_hook.first && g_hook.fin[0] == 5.0f && g_hook.fin[1] == -1.0f);
    CHECK(same_table(b, s1, twin, s2) && check_ok(b));
    uint64_t n;
    bool ended, term, has_final;
    exr_buffer_lock(b);
    CHECK_OR(exr_buffer_episode_info_locked(b, 0, &n, &ended, &term, &has_final) == EXR_OK &&
                 n == 7 && ended && term && has_final,
             exr_buffer_unlock(b);
             goto done);
    CHECK_OR(exr_buffer_num_picks_locked(b) == (allow_short ? 7u : 5u), exr_buffer_unlock(b);
             goto done);
    exr_buffer_unlock(b);
done:
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

static void test_end_episode(void)
{
    end_like_record(false);
    end_like_record(true);
    int64_t sel;
    exr_buffer *b = end_buffer(false, &sel);
    exr_end_outcome o = EXR_END_DONE;
    int64_t e;
    CHECK_RET(b);
    CHECK(record_prio_run(b, -1, 1, 0, 2, false) == 0);
    CHECK(end_episode(b, 0, NULL, false, &o) == EXR_EINVAL && o == EXR_END_NO_END);
    CHECK(end_episode(b, 0, NULL, true, &o) == EXR_OK && o == EXR_END_DONE);
    CHECK(end_episode(b, 0, NULL, true, &o) == EXR_EINVAL && o == EXR_END_ENDED);
    CHECK(end_episode(b, 1, NULL, true, &o) == EXR_ENOTFOUND && o == EXR_END_UNKNOWN);
    CHECK(end_episode(b, -1, NULL, true, &o) == EXR_ENOTFOUND && o == EXR_END_UNKNOWN);
    exr_buffer_lock(b);
    CHECK_OR(exr_buffer_new_episode_locked(b, &e) == EXR_OK && e == 1, exr_buffer_unlock(b);
             goto done);
    exr_buffer_unlock(b);
    CHECK(end_episode(b, 1, NULL, true, &o) == EXR_EINVAL && o == EXR_END_EMPTY);
    CHECK(record_prio_run(b, 1, 2, 0, 3, false) == 1);
    exr_buffer_lock(b);
    CHECK_OR(exr_buffer_remove_episode_locked(b, 1) == EXR_OK, exr_buffer_unlock(b); goto done);
    exr_buffer_unlock(b);
    CHECK(end_episode(b, 1, NULL, true, &o) == EXR_OK && o == EXR_END_GONE); /* nothing to end */
    CHECK(check_ok(b));
done:
    exr_buffer_free(b);
}

/* end_episode on an episode not held: the hook hears of it, at the step
 * count the episode had, only if it went open (with steps) while the hook
 * was set, once, and only for the last EXR_GONE_OPEN such episodes. */
/* A buffer of capacity 3 with count_hook set, holding episode 1 (two
 * steps), after episode 0 (two steps) went open; g_hook cleared. NULL if
 * it could not be made. */
static exr_buffer *one_gone_buffer(void)
{
    exr_buffer *b = make_buffer(1, false, 3, EXR_EVICT_FIFO);
    if (!b)
        return NULL;
    exr_buffer_lock(b);
    exr_buffer_set_hook_locked(b, count_hook, NULL);
    exr_buffer_unlock(b);
    CHECK_OR(record_prio_run(b, -1, 1, 0, 2, false) == 0 &&
                 record_prio_run(b, -1, 2, 0, 2, false) == 1, /* evicts 0 */
             exr_buffer_free(b);
             return NULL);
    memset(&g_hook, 0, sizeof g_hook);
    return b;
}

static void test_end_gone(void)
{
    exr_buffer *b = one_gone_buffer();
    exr_end_outcome o;
    float fin[2] = {3.0f, 4.0f};
    CHECK_RET(b);
    CHECK(end_episode(b, 0, fin, false, &o) == EXR_OK && o == EXR_END_GONE);
    CHECK(g_hook.calls == 1 && g_hook.h == 0 && g_hook.pos == 2 && !g_hook.row && g_hook.end &&
          !g_hook.term && g_hook.fin[0] == 3.0f && g_hook.fin[1] == 4.0f);
    CHECK(end_episode(b, 0, NULL, true, &o) == EXR_OK && o == EXR_END_GONE);
    CHECK(g_hook.calls == 1); /* an episode ends once */
    exr_buffer_lock(b);
    CHECK_OR(exr_buffer_remove_episode_locked(b, 1) == EXR_OK, exr_buffer_unlock(b); goto done);
    exr_buffer_unlock(b);
    CHECK(end_episode(b, 1, NULL, true, &o) == EXR_OK && o == EXR_END_GONE);
    CHECK(g_hook.calls == 2 && g_hook.h == 1 && g_hook.pos == 2 && g_hook.term);
    /* three-step episodes, each evicting the one before: the oldest forgotten */
    int64_t first = 2;
    for (int64_t k = 0; k < EXR_GONE_OPEN + 3; k++)
        CHECK(record_prio_run(b, -1, 3, 0, 3, false) == first + k);
    memset(&g_hook, 0, sizeof g_hook); /* the steps' calls */
    CHECK(end_episode(b, first + 1, NULL, true, &o) == EXR_OK && g_hook.calls == 0);
    CHECK(end_episode(b, first + 2, NULL, true, &o) == EXR_OK && g_hook.calls == 1 &&
          g_hook.h == first + 2 && g_hook.pos == 3);
    CHECK(check_ok(b));
done:
    exr_buffer_free(b);
}

/* A record into a handle not held, with the hook set: the new episode's
 * first step is heard, then the old one's end (if it went open while the
 * hook was set), not terminated, its final state that step's state; once.
 * So for a rollout that evicts the episode it goes into. */
static void test_end_continued(void)
{
    exr_buffer *b = one_gone_buffer();
    exr_end_outcome o;
    CHECK_RET(b);
    CHECK(record_prio_run(b, 0, 7, 5, 1, false) == 2);
    CHECK(g_hook.calls == 2 && g_hook.h == 0 && g_hook.pos == 2 && !g_hook.row && g_hook.end &&
          !g_hook.term && !g_hook.first && g_hook.fin[0] == 7.0f && g_hook.fin[1] == 5.0f);
    CHECK(end_episode(b, 0, NULL, true, &o) == EXR_OK && o == EXR_END_GONE && g_hook.calls == 2);
    CHECK(record_prio_run(b, 0, 8, 0, 1, false) == 3 && g_hook.calls == 3); /* once */
    /* 2 and 3 held, a step each (1 went): a rollout of 4 steps into 3
     * evicts 2, then 3 at its third step; the fourth goes on in 4 */
    CHECK(record_prio_run(b, 3, 9, 0, 4, false) == 4);
    CHECK(g_hook.calls == 8 && g_hook.h == 3 && g_hook.pos == 4 && g_hook.end && !g_hook.term &&
          g_hook.fin[0] == 9.0f && g_hook.fin[1] == 3.0f);
    CHECK(check_ok(b));
done:
    exr_buffer_free(b);
}

/* ---- a draw without the storage lock, and holds that come meanwhile ------ */

/* T steps (tag, t) of priority prio as a new episode; the lock held. Its
 * handle, or -100. */
static int64_t record_prio_steps_locked(exr_buffer *b, int tag, double prio, size_t T)
{
    float st[40][2];
    int64_t ac[40];
    float rw[40] = {0};
    double pr[40];
    if (T > 40)
        return -100;
    for (int t = 0; t < (int)T; t++) {
        st[t][0] = (float)tag;
        st[t][1] = (float)t;
        ac[t] = tag * 1000 + t;
        pr[t] = prio;
    }
    exr_steps in = {st, ac, rw, pr, T, NULL, true, true, NULL, 0};
    int64_t h = -1;
    exr_status s = exr_buffer_record_locked(b, -1, &in, &h);
    return s == EXR_OK ? h : -100;
}

static int64_t record_prio_steps(exr_buffer *b, int tag, double prio, size_t T)
{
    exr_buffer_lock(b);
    int64_t h = record_prio_steps_locked(b, tag, prio, T);
    exr_buffer_unlock(b);
    return h;
}

/* Records 20 ended steps of tag into a new episode, every step with
 * priority prio. */
static int64_t record_prio_episode(exr_buffer *b, int tag, double prio)
{
    return record_prio_steps(b, tag, prio, 20);
}

/* n episodes of priority prio, tagged tag0, tag0 + 1, ...; with check,
 * their handles must be their tags. NULL if all went well, else b. */
static void *record_episodes(exr_buffer *b, int n, int tag0, double prio, bool check)
{
    for (int k = 0; k < n; k++) {
        int64_t h = record_prio_episode(b, tag0 + k, prio);
        if (h < 0 || (check && h != tag0 + k))
            return b;
    }
    return NULL;
}

static void *record_ten(void *arg) { return record_episodes(arg, 10, 0, 1.0, true); }

/* Nine episodes of priority 0, which evict the nine oldest (FIFO, capacity
 * 200) and take their slots again. */
static void *evict_nine(void *arg) { return record_episodes(arg, 9, 100, 0.0, false); }

/* fn(b) on a thread of its own, joined: 1 if it went well (fn returned
 * NULL). Holds made so are another thread's (exr_sel_detach). */
static int on_another_thread(void *(*fn)(void *), exr_buffer *b)
{
    pthread_t th;
    void *failed = b;
    return pthread_create(&th, NULL, fn, b) == 0 && pthread_join(th, &failed) == 0 &&
           failed == NULL;
}

/* An exclusive hold that changes nothing: from another thread, it makes
 * the next draw or update let go of the storage lock (exr_sel_detach). */
static void *empty_hold(void *arg)
{
    exr_buffer_lock(arg);
    exr_buffer_unlock(arg);
    return NULL;
}

/* When the test's holds come: while the selector draws (mu held: they
 * note their changes, from another thread) or after it (mu free: they
 * change it in place). */
static int g_detached_phase;

static void holds_meanwhile(exr_buffer *b, int phase)
{
    if (phase != g_detached_phase)
        return;
    exr_debug_detached = NULL;
    if (phase == 1) {
        evict_nine(b);
        return;
    }
    if (!on_another_thread(evict_nine, b))
        g_failed_checks++;
}

/* A buffer of capacity 200 (FIFO, pick_len 1) with a prioritized selector
 * of alpha 1 and beta 1 (*sel), or NULL. */
static exr_buffer *prio_buffer(int64_t *sel)
{
    return with_prio_selector(make_buffer(1, false, 200, EXR_EVICT_FIFO), 1.0, 1.0, sel);
}

/* record_ten from another thread, so that this one's draws and updates
 * let go of the storage lock (exr_sel_detach). 1 if it went well. */
static int record_ten_elsewhere(exr_buffer *b) { return on_another_thread(record_ten, b); }

/* Whether b's selector sel and twin's tsel hold the same stored priority
 * (NaN for none) for each of positions 0..np-1 of episodes e0..e0+ne-1,
 * and the same total, smallest leaf and number of picks. */
static int same_picks_as_twin(exr_buffer *b, int64_t sel, exr_buffer *twin, int64_t tsel, int e0,
                              int ne, int np)
{
    enum { MAXP = 200 * 40 };
    static int64_t ae[MAXP], ap[MAXP];
    static double got[2][MAXP];
    if (ne * np > MAXP)
        return 0;
    for (int k = 0; k < ne * np; k++) {
        ae[k] = e0 + k / np;
        ap[k] = k % np;
    }
    double tot[2], mn[2];
    uint64_t n[2];
    exr_buffer *bs[2] = {b, twin};
    int64_t ss[2] = {sel, tsel};
    for (int k = 0; k < 2; k++) {
        exr_buffer_lock(bs[k]);
        exr_status s1 =
            exr_buffer_stored_priority_locked(bs[k], ss[k], (size_t)(ne * np), ae, ap, got[k]);
        exr_status s2 = exr_buffer_priority_stats_locked(bs[k], ss[k], &tot[k], &mn[k], &n[k]);
        exr_buffer_unlock(bs[k]);
        if (s1 != EXR_OK || s2 != EXR_OK)
            return 0;
    }
    return memcmp(got[0], got[1], (size_t)(ne * np) * sizeof(double)) == 0 && tot[0] == tot[1] &&
           mn[0] == mn[1] && n[0] == n[1];
}

/* The same for every pick of episodes 9 .. 18 (20 picks each). */
static int same_as_twin(exr_buffer *b, int64_t sel, exr_buffer *twin, int64_t tsel)
{
    return same_picks_as_twin(b, sel, twin, tsel, 9, 10, 20);
}

/* Whether the draw's notes are batch o's count picks and indices. */
static int drawn_is_batch(const exr_batch_out *o, size_t count)
{
    const exr_drawn *d = o->drawn;
    if (d->count != count)
        return 0;
    for (size_t i = 0; i < count; i++)
        if (d->v[i] != o->pick_index[i] || d->v[2 * count + i] != o->pick_epi[i] ||
            d->v[3 * count + i] != o->pick_pos[i])
            return 0;
    return 1;
}

static void detached_draw_at(int phase)
{
    /* Another thread records (so that this one's draw lets go of the
     * storage lock), then the holds of evict_nine come while or after the
     * selector draws. Every pick drawn from an evicted episode must be
     * drawn again, and the slots' new episodes, whose positions are the
     * old ones', hold only priority-0 picks: a batch that has one took a
     * gone pick for its slot's new tenant. */
    int64_t sel;
    exr_buffer *b = prio_buffer(&sel);
    CHECK_RET(b);
    CHECK_RET(record_ten_elsewhere(b));
    enum { B = 64 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    int64_t room[3 + 4 * B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0,
                       (exr_drawn *)room, false};
    g_detached_phase = phase;
    exr_debug_detached = holds_meanwhile;
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK);
    CHECK_RET(exr_debug_detached == NULL); /* the draw let go of the lock */
    /* holds came after the draw: its notes keep the count of moves before
     * them (the selector's indices are from a moment after it) */
    CHECK_RET(o.drawn->serial != 0 && drawn_is_batch(&o, B));
    for (int i = 0; i < B; i++) {
        CHECK_RET(epi[i] == 9); /* the one episode left of the first ten */
        CHECK_RET(sts[i][0] == 9.0f && sts[i][1] == (float)pos[i] && w[i] == 1.0f);
    }
    /* set_priority reaches every pick, as hints and by the notes */
    double np = 2.0;
    size_t applied = 0;
    CHECK_RET(exr_buffer_set_priority(b, sel, B, epi, pos, idx, NULL, &np, 0, &applied) == EXR_OK);
    CHECK_RET(applied == B);
    CHECK_RET(exr_buffer_set_priority(b, sel, B, epi, pos, o.drawn->v, o.drawn, &np, 0,
                                      &applied) == EXR_OK);
    CHECK_RET(applied == B);
    CHECK_RET(check_ok(b)); /* the selector's picks are the table's */
    /* the notes, applied later, left every leaf and the sums as changes in
     * place do: a twin buffer, the same calls from one thread, no draw */
    int64_t tsel;
    exr_buffer *twin = prio_buffer(&tsel);
    CHECK_RET(twin);
    CHECK_RET(record_ten(twin) == NULL && evict_nine(twin) == NULL);
    CHECK_RET(exr_buffer_set_priority(twin, tsel, B, epi, pos, NULL, NULL, &np, 0, &applied) == EXR_OK);
    int same = same_as_twin(b, sel, twin, tsel);
    exr_buffer_free(twin);
    CHECK_RET(same);
    /* nothing left to draw but priority 0: the redraw says so */
    double zero = 0;
    int64_t e9[20], p9[20];
    for (int t = 0; t < 20; t++) {
        e9[t] = 9;
        p9[t] = t;
    }
    CHECK_RET(exr_buffer_set_priority(b, sel, 20, e9, p9, NULL, NULL, &zero, 0, &applied) == EXR_OK);
    CHECK_RET(applied == 20);
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_EEMPTY);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

static void detached_update(void)
{
    /* An update that lets go of the storage lock applies exactly the notes
     * of the holds before it: holds that come after (evict_nine, from
     * another thread while the update holds mu) move the picks it resolved,
     * so applying their notes first would put its priorities on other
     * leaves. Compared with a twin changed in place in the same order:
     * the update, then the holds. */
    int64_t sel, tsel;
    exr_buffer *b = prio_buffer(&sel), *twin = prio_buffer(&tsel);
    CHECK_RET(b && twin);
    CHECK_RET(record_ten_elsewhere(b));
    CHECK_RET(record_ten(twin) == NULL);
    enum { B = 64 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0, NULL, false};
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK); /* marks it detached */
    double p[B];
    for (int i = 0; i < B; i++)
        p[i] = 2.0 + i;
    size_t applied = 0;
    CHECK_RET(on_another_thread(empty_hold, b)); /* a writer at work since the draw */
    g_detached_phase = 2;
    exr_debug_detached = holds_meanwhile;
    CHECK_RET(exr_buffer_set_priority(b, sel, B, epi, pos, idx, NULL, p, 1, &applied) == EXR_OK);
    CHECK_RET(exr_debug_detached == NULL && applied == B);
    CHECK_RET(exr_buffer_set_priority(twin, tsel, B, epi, pos, NULL, NULL, p, 1, &applied) == EXR_OK);
    CHECK_RET(evict_nine(twin) == NULL);
    CHECK_RET(same_as_twin(b, sel, twin, tsel));
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

/* What a draw notes of its picks (exr_drawn) and set_priority given them:
 * exact after a draw under the lock (serial set); the noted indices taken
 * as they are while nothing has moved, checked once something has (nine
 * episodes evicted: drawn picks gone, and picks of the tenth moved into
 * their places), and a note from another buffer checked too. Each step
 * compared with a twin updated by handle. */
static void test_drawn_notes(void)
{
    int64_t sel, tsel;
    exr_buffer *b = prio_buffer(&sel), *twin = prio_buffer(&tsel);
    CHECK_RET(b && twin);
    CHECK_RET(record_ten(b) == NULL && record_ten(twin) == NULL);
    enum { B = 64 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B], room[3 + 4 * B], troom[3 + 4 * B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0,
                       (exr_drawn *)room, false};
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK);
    const exr_drawn *d = o.drawn;
    CHECK_RET(d->serial != 0 && drawn_is_batch(&o, B));
    double p[B];
    size_t applied = 0, tapplied = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < B; i++)
            p[i] = 2.0 + i + 100.0 * round;
        CHECK_RET(exr_buffer_set_priority(b, sel, B, d->v + 2 * B, d->v + 3 * B, d->v, d, p, 1,
                                          &applied) == EXR_OK);
        CHECK_RET(exr_buffer_set_priority(twin, tsel, B, d->v + 2 * B, d->v + 3 * B, NULL, NULL, p, 1,
                                          &tapplied) == EXR_OK);
        CHECK_RET(applied == tapplied && (round == 1 || applied == B));
        CHECK_RET(same_as_twin(b, sel, twin, tsel));
        CHECK_RET(check_ok(b));
        /* then the nine oldest episodes go, and the notes are stale */
        if (round == 0)
            CHECK_RET(evict_nine(b) == NULL && evict_nine(twin) == NULL);
    }
    CHECK_RET(applied < B); /* some drawn picks left with their episodes */
    /* notes of another buffer (its serial) at b's count of moves, with
     * indices that are wrong for b: checked, so nothing is misapplied */
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK && d->serial != 0);
    exr_drawn *od = (exr_drawn *)troom;
    memcpy(od, d, sizeof troom);
    od->serial = d->serial + 1000;
    for (int i = 0; i < B; i++)
        od->v[i] = d->v[(i + 1) % B] != d->v[i] ? d->v[(i + 1) % B] : d->v[i] ^ 1;
    for (int i = 0; i < B; i++)
        p[i] = 7.0 + i;
    CHECK_RET(exr_buffer_set_priority(b, sel, B, od->v + 2 * B, od->v + 3 * B, od->v, od, p, 1,
                                      &applied) == EXR_OK);
    CHECK_RET(exr_buffer_set_priority(twin, tsel, B, od->v + 2 * B, od->v + 3 * B, NULL, NULL, p, 1,
                                      &tapplied) == EXR_OK);
    CHECK_RET(applied == tapplied && applied == B && same_as_twin(b, sel, twin, tsel));
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

/* For test_drawn_notes_since, on b and its twin alike: episode 0 removed
 * (its 20 picks' holes take the table's last 20: episode 9's), a 30-step
 * episode recorded, then `churn` one-step episodes each recorded and
 * removed (a move apiece, after which the table is back at its size). */
static int moves_after_draw(exr_buffer *b, int churn)
{
    exr_buffer_lock(b);
    exr_status st = exr_buffer_remove_episode_locked(b, 0);
    exr_buffer_unlock(b);
    if (st != EXR_OK || record_prio_steps(b, 10, 3.0, 30) != 10)
        return 0;
    for (int k = 0; k < churn; k++) {
        int64_t h = record_prio_steps(b, 11 + k, 5.0, 1);
        exr_buffer_lock(b);
        st = h < 0 ? EXR_EINVAL : exr_buffer_remove_episode_locked(b, h);
        exr_buffer_unlock(b);
        if (st != EXR_OK)
            return 0;
    }
    return 1;
}

/* A draw's notes after moves (buffer_priority.c, resolve_noted). A batch
 * drawn under the lock from episodes 0, 5 and 9 (the rest at priority 0)
 * is updated through its notes after moves_after_draw: episode 0's picks
 * are gone; episode 5's are where they were, below every size the table
 * had since, and are taken at their noted indices without reading the
 * table; episode 9's moved into episode 0's place and their old indices
 * now hold the 30-step episode's picks, so they must be looked up. With 10
 * one-step churns the moves are within what the buffer keeps of its
 * sizes; with 150 they are not (only the newest 128 sizes are kept, all of
 * them past the old indices), and every pick is checked as a hint. Each
 * compared with a twin updated by handle. */
static void drawn_notes_since(int churn)
{
    int64_t sel, tsel;
    exr_buffer *bs[2] = {make_buffer(1, false, 400, EXR_EVICT_FIFO),
                         make_buffer(1, false, 400, EXR_EVICT_FIFO)};
    int64_t *ss[2] = {&sel, &tsel};
    double params[2] = {1.0, 1.0}, zero = 0.0;
    int64_t ze[140], zp[140];
    for (int k = 0; k < 140; k++) {
        ze[k] = k < 80 ? 1 + k / 20 : 6 + (k - 80) / 20; /* episodes 1-4, 6-8 */
        zp[k] = k % 20;
    }
    size_t applied = 0, tapplied = 0;
    for (int k = 0; k < 2; k++) {
        CHECK_RET(bs[k]);
        exr_buffer_lock(bs[k]);
        CHECK_RET(exr_buffer_add_selector_locked(bs[k], 1, params, ss[k]) == EXR_OK);
        exr_buffer_unlock(bs[k]);
        CHECK_RET(record_ten(bs[k]) == NULL);
        CHECK_RET(exr_buffer_set_priority(bs[k], *ss[k], 140, ze, zp, NULL, NULL, &zero, 0,
                                          &applied) == EXR_OK && applied == 140);
    }
    exr_buffer *b = bs[0], *twin = bs[1];
    enum { B = 64 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B], room[3 + 4 * B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0,
                       (exr_drawn *)room, false};
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK && drawn_is_batch(&o, B));
    int seen[10] = {0};
    for (int i = 0; i < B; i++)
        seen[epi[i]]++;
    CHECK_RET(seen[0] && seen[5] && seen[9] && seen[0] + seen[5] + seen[9] == B);
    CHECK_RET(moves_after_draw(b, churn) && moves_after_draw(twin, churn));
    double p[B];
    for (int i = 0; i < B; i++)
        p[i] = 2.0 + i;
    uint64_t kept = exr_debug_since_kept;
    CHECK_RET(exr_buffer_set_priority(b, sel, B, epi, pos, o.drawn->v, o.drawn, p, 1, &applied) ==
              EXR_OK);
    CHECK_RET(exr_buffer_set_priority(twin, tsel, B, epi, pos, NULL, NULL, p, 1, &tapplied) ==
              EXR_OK);
    CHECK_RET(applied == tapplied && applied == (size_t)(seen[5] + seen[9]));
    /* within the ring (one removal and churn moves), episode 5's picks went by
     * the notes alone */
    CHECK_RET(exr_debug_since_kept - kept == (1 + churn <= EXR_LOWS ? (uint64_t)seen[5] : 0));
    CHECK_RET(same_picks_as_twin(b, sel, twin, tsel, 0, 11, 40));
    CHECK_RET(check_ok(b) && check_ok(twin));
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

static void test_drawn_notes_since(void)
{
    drawn_notes_since(10);
    drawn_notes_since(150);
}

/* A draw's notes given with picks that are partly others (the first
 * eight of the batch replaced by picks of episode 9, the next eight by
 * picks of episodes that are not there): each pick is compared with the
 * notes, so those go by lookup and the rest by the notes, before and after
 * evictions. Compared with a twin updated by handle. */
static void test_drawn_notes_mixed(void)
{
    int64_t sel, tsel;
    exr_buffer *b = prio_buffer(&sel), *twin = prio_buffer(&tsel);
    CHECK_RET(b && twin);
    CHECK_RET(record_ten(b) == NULL && record_ten(twin) == NULL);
    enum { B = 64 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B], room[3 + 4 * B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0,
                       (exr_drawn *)room, false};
    CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK && drawn_is_batch(&o, B));
    int64_t e2[B], p2[B];
    memcpy(e2, epi, sizeof e2);
    memcpy(p2, pos, sizeof p2);
    for (int i = 0; i < 8; i++) {
        e2[i] = 9;
        p2[i] = pos[i] == 19 - i ? 0 : 19 - i;
        e2[8 + i] = 500 + i;
    }
    double p[B];
    size_t applied = 0, tapplied = 0;
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < B; i++)
            p[i] = 3.0 + i + 100.0 * round;
        CHECK_RET(exr_buffer_set_priority(b, sel, B, e2, p2, o.drawn->v, o.drawn, p, 1, &applied) ==
                  EXR_OK);
        CHECK_RET(exr_buffer_set_priority(twin, tsel, B, e2, p2, NULL, NULL, p, 1, &tapplied) ==
                  EXR_OK);
        CHECK_RET(applied == tapplied && (round == 1 || applied == B - 8));
        CHECK_RET(same_picks_as_twin(b, sel, twin, tsel, 0, 19, 40));
        CHECK_RET(check_ok(b));
        if (round == 0) /* then the notes are past evictions */
            CHECK_RET(evict_nine(b) == NULL && evict_nine(twin) == NULL);
    }
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

/* For test_notes_left: a draw of 16 picks made on a thread of its own. */
typedef struct {
    exr_buffer *b;
    int64_t sel, epi[16], pos[16];
    exr_status st;
} draw_arg;

static void *draw_elsewhere(void *p)
{
    draw_arg *a = p;
    int64_t len[16], lnx[16], acs[16], idx[16];
    float sts[16][2], nx[16][2], rws[16], w[16];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, a->epi, a->pos, w, idx, NULL, 0, NULL, false};
    a->st = exr_buffer_get_batch(a->b, a->sel, 16, &o);
    return NULL;
}

/* A hold that ends while a draw waits for the storage lock leaves its
 * notes to that draw (buffer.c, flush_selectors), which applies them
 * before it draws: the hold (nine episodes of priority 0 evicting the
 * nine oldest) leaves only episode 9 to draw, and the selector ends as a
 * twin's that recorded the same from one thread. */
static void test_notes_left(void)
{
    int64_t sel, tsel;
    exr_buffer *b = prio_buffer(&sel), *twin = prio_buffer(&tsel);
    CHECK_RET(b && twin);
    CHECK_RET(record_ten_elsewhere(b) && record_ten(twin) == NULL);
    draw_arg a = {.b = b, .sel = sel, .st = EXR_EINVAL};
    draw_elsewhere(&a); /* detached: another thread made the holds */
    CHECK_RET(a.st == EXR_OK);
    uint64_t left = exr_debug_notes_left;
    exr_buffer_lock(b);
    pthread_t th;
    CHECK_RET(pthread_create(&th, NULL, draw_elsewhere, &a) == 0);
    while (!atomic_load_explicit(&b->lk->rd_waiting, memory_order_relaxed))
        sched_yield();
    int64_t h = 0;
    for (int k = 0; k < 9 && h >= 0; k++)
        h = record_prio_steps_locked(b, 100 + k, 0.0, 20);
    exr_buffer_unlock(b);
    CHECK_RET(pthread_join(th, NULL) == 0 && h >= 0);
    CHECK_RET(a.st == EXR_OK && exr_debug_notes_left > left);
    for (int i = 0; i < 16; i++)
        CHECK_RET(a.epi[i] == 9);
    CHECK_RET(evict_nine(twin) == NULL);
    CHECK_RET(same_as_twin(b, sel, twin, tsel));
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

/* For test_extra_draws: a hundred episodes of priority 1 (handles 0-99). */
static void *record_hundred(void *arg) { return record_episodes(arg, 100, 0, 1.0, true); }

/* The next five episodes, of priority 2, from another thread (so that
 * draws stay detached): they evict the five oldest. */
static void *record_five(void *arg) { return record_episodes(arg, 5, 200, 2.0, false); }

static void evict_five_meanwhile(exr_buffer *b, int phase)
{
    if (phase != g_detached_phase)
        return;
    exr_debug_detached = NULL;
    if (!on_another_thread(record_five, b))
        g_failed_checks++;
}

/* Extra draws (buffer_batch.c, check_drawn_locked): between a detached
 * draw of 256 picks and its check, the five oldest of 100 episodes are
 * evicted (priority 1) by five new ones (priority 2); the drawn picks they
 * held are replaced by extra draws of the same tree that are still there,
 * or, those used up, drawn again from the tree as it is then. Over 18
 * rounds extras are used, no batch holds a pick of an evicted episode, and
 * each pick's weight is its own: 1 for the old episodes, 0.5 for the new
 * ones (an extra taken unchecked, 5% of them an evicted pick, would bring
 * a new tenant's rows with the evicted pick's weight). */
static void test_extra_draws(void)
{
    exr_buffer *b = make_buffer(1, false, 2000, EXR_EVICT_FIFO);
    CHECK_RET(b);
    double params[2] = {1.0, 1.0};
    int64_t sel;
    exr_buffer_lock(b);
    CHECK_RET(exr_buffer_add_selector_locked(b, 1, params, &sel) == EXR_OK);
    exr_buffer_unlock(b);
    CHECK_RET(on_another_thread(record_hundred, b));
    enum { B = 256 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0, NULL, false};
    uint64_t used = exr_debug_extras_used;
    for (int64_t round = 0; round < 18; round++) {
        g_detached_phase = 1;
        exr_debug_detached = evict_five_meanwhile;
        CHECK_RET(exr_buffer_get_batch(b, sel, B, &o) == EXR_OK);
        CHECK_RET(exr_debug_detached == NULL); /* the draw let go of the lock */
        /* episodes up to 5 round + 4 went before the check */
        for (int i = 0; i < B; i++)
            CHECK_RET(epi[i] > 5 * round + 4 && sts[i][1] == (float)pos[i] &&
                      w[i] == (epi[i] >= 100 ? 0.5f : 1.0f));
    }
    CHECK_RET(exr_debug_extras_used > used);
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

/* For test_thread_after_writer: draws a batch of 8 from the buffer's
 * selector g_draw_sel on the calling thread, recording one episode first
 * when g_record_first. */
static int g_saw_detached, g_record_first;
static int64_t g_draw_sel;

static void saw_detached(exr_buffer *b, int phase)
{
    (void)b;
    if (phase == 0)
        g_saw_detached = 1;
}

static void *draw_eight(void *arg)
{
    exr_buffer *b = arg;
    if (g_record_first && record_prio_episode(b, 50, 1.0) < 0)
        return b;
    enum { B = 8 };
    int64_t epi[B], pos[B], len[B], lnx[B], acs[B], idx[B];
    float sts[B][2], nx[B][2], rws[B], w[B];
    exr_batch_out o = {sts, acs, rws, nx, len, lnx, epi, pos, w, idx, NULL, 0, NULL, false};
    return exr_buffer_get_batch(b, g_draw_sel, B, &o) == EXR_OK ? NULL : b;
}

/* A thread started after the writer has exited is another thread, even
 * where the C library hands it the writer's pthread_t again: its draw lets
 * go of the storage lock (excl_owner is an exr_thread_id, which no two
 * threads get). A thread that draws after its own record call does not. */
static void test_thread_after_writer(void)
{
    exr_buffer *b = prio_buffer(&g_draw_sel);
    CHECK_RET(b);
    exr_debug_detached = saw_detached;
    for (int k = 0; k < 3; k++) {
        g_saw_detached = 0;
        g_record_first = 0;
        CHECK_RET(on_another_thread(record_five, b)); /* records, then exits */
        CHECK_RET(on_another_thread(draw_eight, b) && g_saw_detached);
        g_saw_detached = 0;
        g_record_first = 1;
        CHECK_RET(on_another_thread(draw_eight, b) && !g_saw_detached);
    }
    exr_debug_detached = NULL;
    CHECK_RET(check_ok(b));
    exr_buffer_free(b);
}

/* Whether b's selector h draws and is changed through notes (detached). */
static int sel_detached(exr_buffer *b, int64_t h)
{
    exr_buffer_lock(b);
    sel_entry *e = find_sel(b, h);
    int d = e && atomic_load_explicit(&e->sel->detached, memory_order_relaxed);
    exr_buffer_unlock(b);
    return d;
}

/* A draw of 8 picks from b's selector h; 1 if it went well. */
static int draw8(exr_buffer *b, int64_t h)
{
    g_draw_sel = h;
    g_record_first = 0;
    return draw_eight(b) == NULL;
}

/* A selector drawn without the storage lock goes back to changes in place
 * once exr_reattach_holds exclusive holds came without such a draw, with
 * every note applied: its leaves and sums then are a twin's, changed in
 * place from one thread all along. The next draw that lets go of the lock
 * starts again from the table (check_ok compares the picks it keeps). */
static void test_reattach(void)
{
    int64_t sel, tsel;
    exr_buffer *b = prio_buffer(&sel), *twin = prio_buffer(&tsel);
    CHECK_RET(b && twin);
    CHECK_RET(record_ten_elsewhere(b) && record_ten(twin) == NULL);
    exr_debug_detached = saw_detached;
    g_saw_detached = 0;
    CHECK_RET(draw8(b, sel) && g_saw_detached && sel_detached(b, sel));
    uint64_t holds = 64, seq0 = b->eps.seq, saved = exr_reattach_holds;
    exr_reattach_holds = holds;
    int64_t h = -1;
    for (int k = 0; k < 200 && sel_detached(b, sel); k++) {
        if (b->eps.seq - seq0 >= holds) /* not before */
            break;
        h = record_prio_episode(b, 20 + k, 1.0 + k % 3);
        if (h < 0 || record_prio_episode(twin, 20 + k, 1.0 + k % 3) != h)
            break;
    }
    exr_reattach_holds = saved;
    CHECK_RET(!sel_detached(b, sel) && b->eps.seq - seq0 >= holds);
    CHECK_RET(check_ok(b) && same_picks_as_twin(b, sel, twin, tsel, (int)h - 9, 10, 20));
    /* in place again: a draw after another thread's hold detaches anew */
    CHECK_RET(on_another_thread(record_five, b) && record_five(twin) == NULL);
    g_saw_detached = 0;
    CHECK_RET(draw8(b, sel) && g_saw_detached && sel_detached(b, sel));
    CHECK_RET(on_another_thread(evict_nine, b) && evict_nine(twin) == NULL);
    g_saw_detached = 0;
    CHECK_RET(draw8(b, sel) && g_saw_detached);
    exr_debug_detached = NULL;
    CHECK_RET(check_ok(b) && same_picks_as_twin(b, sel, twin, tsel, (int)h + 5, 10, 20));
    exr_buffer_free(b);
    exr_buffer_free(twin);
}

static void test_detached_draw(void)
{
    detached_draw_at(0);
    detached_draw_at(1);
    detached_update();
}

int main(void)
{
    static const check_test tests[] = {
        {"rng", test_rng},
        {"store_locate", test_store_locate},
        {"sumtree", test_sumtree},
        {"sumtree_drift", test_sumtree_drift},
        {"sumtree_past_total", test_sumtree_past_total},
        {"sumtree_unchanged", test_sumtree_unchanged},
        {"sumtree_pairs", test_sumtree_pairs},
        {"sumtree_quads", test_sumtree_quads},
        {"pow_lanes", test_pow_lanes},
        {"episodes", test_episodes},
        {"episodes_hint", test_episodes_hint},
        {"episodes_direct", test_episodes_direct},
        {"picks_and_batch", test_picks_and_batch},
        {"long_episode_segments", test_long_episode_segments},
        {"eviction", test_eviction},
        {"first_bad_priority", test_first_bad_priority},
        {"priorities", test_priorities},
        {"end_episode", test_end_episode},
        {"end_gone", test_end_gone},
        {"end_continued", test_end_continued},
        {"random_ops", test_random_ops},
        {"segments_grow_and_shrink", test_segments_grow_and_shrink},
        {"bad_config", test_bad_config},
        {"lock_assertion", test_lock_assertion},
        {"detached_draw", test_detached_draw},
        {"drawn_notes", test_drawn_notes},
        {"drawn_notes_since", test_drawn_notes_since},
        {"drawn_notes_mixed", test_drawn_notes_mixed},
        {"notes_left", test_notes_left},
        {"extra_draws", test_extra_draws},
        {"thread_after_writer", test_thread_after_writer},
        {"reattach", test_reattach},
    };
    return check_run_all(tests, (int)(sizeof tests / sizeof tests[0]));
}
