#include "sumtree.h"

#include "mem.h"
#include "powa.h"

#include <math.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAN 8

/* Line-aligned; from EXR_HUGE_MIN on on 2 MiB pages (mem.h): a draw reads
 * one random line of the leaves and of each large level, and with 4 KiB
 * pages each of those costs a TLB miss as well. */
static void *alloc_line(size_t bytes) { return exr_big_alloc(bytes); }

void exr_sumtree_init(exr_sumtree *t) { memset(t, 0, sizeof *t); }

static void free_levels(float *leaf, double **sum, float **mn, double **drift, int nlev)
{
    free(leaf);
    for (int k = 0; k < nlev; k++) {
        free(sum[k]);
        free(mn[k]);
        free(drift[k]);
    }
}

void exr_sumtree_free(exr_sumtree *t)
{
    free_levels(t->leaf, t->sum, t->mn, t->drift, t->nlev);
    free(t->dmark);
    exr_sumtree_init(t);
}

/* A node from its 8 children: the sum pairwise, three additions deep
 * instead of eight (every update sums its level-0 node again, and the
 * additions' latency was the cost), and the smallest positive child (+inf if
 * none). Level 0 adds ((c0 + c2) + (c4 + c6)) + ((c1 + c3) + (c5 + c7)), the
 * order SSE2 adds two lanes in; the scalar code keeps it, so both give the
 * same bits. */
#if !defined(__SSE2__)
static inline float min_pos(float a, float b)
{
    a = a > 0 ? a : INFINITY;
    b = b > 0 ? b : INFINITY;
    return a < b ? a : b;
}
#endif

static inline float min2(float a, float b) { return a < b ? a : b; }

#if defined(__SSE2__)
static inline void node_from_leaf_vectors(__m128 lo, __m128 hi, double *s, float *m)
{
    __m128d a = _mm_add_pd(_mm_cvtps_pd(lo), _mm_cvtps_pd(_mm_movehl_ps(lo, lo))); /* c0+c2, c1+c3 */
    __m128d b = _mm_add_pd(_mm_cvtps_pd(hi), _mm_cvtps_pd(_mm_movehl_ps(hi, hi))); /* c4+c6, c5+c7 */
    __m128d t = _mm_add_pd(a, b);
    *s = _mm_cvtsd_f64(_mm_add_sd(t, _mm_unpackhi_pd(t, t)));
    const __m128 inf = _mm_set1_ps(INFINITY);
    __m128 ml = _mm_cmpgt_ps(lo, _mm_setzero_ps()), mh = _mm_cmpgt_ps(hi, _mm_setzero_ps());
    lo = _mm_or_ps(_mm_and_ps(ml, lo), _mm_andnot_ps(ml, inf));
    hi = _mm_or_ps(_mm_and_ps(mh, hi), _mm_andnot_ps(mh, inf));
    __m128 v = _mm_min_ps(lo, hi);
    v = _mm_min_ps(v, _mm_movehl_ps(v, v));
    v = _mm_min_ss(v, _mm_shuffle_ps(v, v, 1));
    *m = _mm_cvtss_f32(v);
}
#endif

static inline void node_from_leaves(const float *c, double *s, float *m)
{
#if defined(__SSE2__)
    node_from_leaf_vectors(_mm_loadu_ps(c), _mm_loadu_ps(c + 4), s, m);
#else
    double a = (double)c[0] + (double)c[2], b = (double)c[1] + (double)c[3];
    double d = (double)c[4] + (double)c[6], e = (double)c[5] + (double)c[7];
    *s = (a + d) + (b + e);
    *m = min2(min2(min_pos(c[0], c[1]), min_pos(c[2], c[3])),
              min2(min_pos(c[4], c[5]), min_pos(c[6], c[7])));
#endif
}

/* leaf[i] = v and its level-0 node's sum and min. With SSE2 the node is
 * computed from the 8 leaves as loaded before the store, with v put into its
 * lane in a register: a 16-byte load right after a 4-byte store into it
 * cannot be forwarded and would wait for the store. */
static inline void set_leaf(exr_sumtree *t, size_t i, float v, double *s, float *m)
{
    const float *c = t->leaf + (i & ~(size_t)(FAN - 1));
#if defined(__SSE2__)
    __m128 lo = _mm_loadu_ps(c), hi = _mm_loadu_ps(c + 4);
    __m128i r = _mm_set1_epi32((int)(i % FAN));
    __m128 sl = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_set_epi32(3, 2, 1, 0), r));
    __m128 sh = _mm_castsi128_ps(_mm_cmpeq_epi32(_mm_set_epi32(7, 6, 5, 4), r));
    __m128 vv = _mm_set1_ps(v);
    lo = _mm_or_ps(_mm_and_ps(sl, vv), _mm_andnot_ps(sl, lo));
    hi = _mm_or_ps(_mm_and_ps(sh, vv), _mm_andnot_ps(sh, hi));
    t->leaf[i] = v;
    node_from_leaf_vectors(lo, hi, s, m);
#else
    t->leaf[i] = v;
    node_from_leaves(c, s, m);
#endif
}

static inline double sum_of_nodes(const double *cs)
{
    return ((cs[0] + cs[1]) + (cs[2] + cs[3])) + ((cs[4] + cs[5]) + (cs[6] + cs[7]));
}

static inline float min_of_nodes(const float *cm)
{
    return min2(min2(min2(cm[0], cm[1]), min2(cm[2], cm[3])),
                min2(min2(cm[4], cm[5]), min2(cm[6], cm[7])));
}

static inline void node_from_nodes(const double *cs, const float *cm, double *s, float *m)
{
    *s = sum_of_nodes(cs);
    *m = min_of_nodes(cm);
}

/* The rounding of a sum of 8 children, pairwise (3 additions deep): at most
 * 3 * 2^-53 of it for children >= 0; a node just summed from its children
 * starts with this as its drift bound. */
#define SUM_ROUNDING(s) (4 * 0x1p-53 * (s))

/* Levels [from, nlev) summed from their children. */
static void rebuild_from(exr_sumtree *t, int from)
{
    for (int k = from; k < t->nlev; k++)
        for (size_t j = 0; j < t->len[k]; j++) {
            node_from_nodes(t->sum[k - 1] + FAN * j, t->mn[k - 1] + FAN * j, &t->sum[k][j],
                            &t->mn[k][j]);
            t->drift[k][j] = SUM_ROUNDING(t->sum[k][j]);
        }
}

/* Forgets the pending puts' marks (their nodes are being recomputed). */
static void clear_dirty(exr_sumtree *t)
{
    for (size_t k = 0; k < t->ndirty; k++)
        t->dmark[t->dirty[k] / 64] = 0;
    t->ndirty = 0;
}

void exr_sumtree_rebuild(exr_sumtree *t)
{
    if (!t->nlev)
        return;
    clear_dirty(t);
    for (size_t j = 0; j < t->len[0]; j++) {
        node_from_leaves(t->leaf + FAN * j, &t->sum[0][j], &t->mn[0][j]);
    }
    rebuild_from(t, 1);
}

/* The number of internal levels over cap leaves, and their nodes in
 * len[]; -1 if more than EXR_ST_MAXLEV. */
static int level_lens(size_t cap, size_t *len)
{
    int nlev = 0;
    size_t below = cap;
    do {
        if (nlev == EXR_ST_MAXLEV)
            return -1;
        below = (below + FAN - 1) / FAN;
        len[nlev++] = below;
    } while (below > 1);
    return nlev;
}

exr_status exr_sumtree_reserve(exr_sumtree *t, size_t n)
{
    if (n <= t->cap)
        return EXR_OK;
    size_t cap = t->cap ? t->cap : 64;
    while (cap < n) {
        if (cap > SIZE_MAX / 2 / sizeof(double))
            return EXR_EOVERFLOW;
        cap *= 2;
    }
    size_t len[EXR_ST_MAXLEV];
    int nlev = level_lens(cap, len);
    if (nlev < 0)
        return EXR_EOVERFLOW;

    float *leaf = alloc_line(cap * sizeof(float));
    uint64_t *dmark = calloc(len[0] / 64 + 1, sizeof *dmark);
    double *sum[EXR_ST_MAXLEV] = {0};
    float *mn[EXR_ST_MAXLEV] = {0};
    double *drift[EXR_ST_MAXLEV] = {0};
    int ok = leaf != NULL && dmark != NULL;
    for (int k = 0; ok && k < nlev; k++) {
        /* a level is read 8 children at a time by its parent: pad it */
        size_t slots = k + 1 < nlev ? FAN * len[k + 1] : 1;
        sum[k] = alloc_line(slots * sizeof(double));
        mn[k] = alloc_line(slots * sizeof(float));
        /* level 0 is always exact (summed from its leaves): no drift */
        drift[k] = k ? calloc(slots, sizeof(double)) : NULL;
        ok = sum[k] && mn[k] && (!k || drift[k]);
        if (ok) {
            memset(sum[k], 0, slots * sizeof(double));
            for (size_t j = 0; j < slots; j++)
                mn[k][j] = INFINITY;
        }
    }
    if (!ok) {
        free_levels(leaf, sum, mn, drift, nlev);
        free(dmark);
        return EXR_ENOMEM;
    }
    memset(leaf, 0, cap * sizeof(float));
    if (t->cap)
        memcpy(leaf, t->leaf, t->cap * sizeof(float));
    free_levels(t->leaf, t->sum, t->mn, t->drift, t->nlev);
    free(t->dmark);
    t->dmark = dmark;
    t->ndirty = 0; /* the rebuild below recomputes every node */
    t->cap = cap;
    t->nlev = nlev;
    t->leaf = leaf;
    for (int k = 0; k < EXR_ST_MAXLEV; k++) {
        t->sum[k] = k < nlev ? sum[k] : NULL;
        t->mn[k] = k < nlev ? mn[k] : NULL;
        t->drift[k] = k < nlev ? drift[k] : NULL;
        t->len[k] = k < nlev ? len[k] : 0;
    }
    exr_sumtree_rebuild(t);
    return EXR_OK;
}

#define TWO_M53 0x1p-53
#define TWO_M40 0x1p-40

/* Level-0 node j's new sum s and min m, then levels [1, top) by delta
 * (sumtree.h: the drift bound and when a node is summed again) and the min
 * as far up as it changes. */
static inline void propagate(exr_sumtree *t, size_t j, double s, float m, int top)
{
    double d = s - t->sum[0][j];
    int mchg = m != t->mn[0][j];
    t->sum[0][j] = s;
    t->mn[0][j] = m;
    for (int lv = 1; lv < top && (d != 0 || mchg); lv++) {
        j /= FAN;
        double old = t->sum[lv][j];
        double nw = old + d;
        double dr = t->drift[lv][j] + (fabs(nw) + fabs(d)) * TWO_M53;
        /* a subtree that has just become all zero is caught here too: its
         * sum is then within its drift bound of 0 */
        if (!(nw > 0) || dr > nw * TWO_M40) {
            nw = sum_of_nodes(t->sum[lv - 1] + FAN * j);
            dr = SUM_ROUNDING(nw);
        }
        d = nw - old;
        t->sum[lv][j] = nw;
        t->drift[lv][j] = dr;
        if (mchg) {
            m = min_of_nodes(t->mn[lv - 1] + FAN * j);
            mchg = m != t->mn[lv][j];
            t->mn[lv][j] = m;
        }
    }
}

/* leaf[i] = v, its level-0 node from its leaves, then levels [1, top). */
static inline void set_path(exr_sumtree *t, size_t i, float v, int top)
{
    double s;
    float m;
    set_leaf(t, i, v, &s, &m);
    propagate(t, i / FAN, s, m, top);
}

/* The first level summed from its children after a batch of count
 * changes: levels from it up have fewer nodes than half the batch. */
static int top_for(const exr_sumtree *t, size_t count)
{
    int top = 1;
    while (top < t->nlev && 2 * t->len[top] > count)
        top++;
    return top;
}

void exr_sumtree_put(exr_sumtree *t, size_t i, float v)
{
    size_t j = i / FAN;
    t->leaf[i] = v;
    uint64_t bit = (uint64_t)1 << (j % 64);
    if (t->dmark[j / 64] & bit)
        return;
    if (t->ndirty == EXR_ST_MAXDIRTY)
        exr_sumtree_flush(t);
    t->dmark[j / 64] |= bit;
    t->dirty[t->ndirty++] = j;
}

void exr_sumtree_flush(exr_sumtree *t)
{
    size_t count = t->ndirty;
    if (!count)
        return;
    int top = top_for(t, count);
    for (size_t k = 0; k < count; k++) {
        if (k + 4 < count)
            __builtin_prefetch(t->sum[0] + t->dirty[k + 4], 1);
        size_t j = t->dirty[k];
        double s;
        float m;
        node_from_leaves(t->leaf + FAN * j, &s, &m);
        propagate(t, j, s, m, top);
    }
    clear_dirty(t);
    rebuild_from(t, top);
}

void exr_sumtree_set(exr_sumtree *t, size_t i, float v)
{
    exr_sumtree_flush(t);
    set_path(t, i, v, t->nlev);
}

/* Whether leaf i already holds v, bit for bit: then writing it changes no
 * node (a level-0 sum is recomputed from its leaves in one fixed order, and
 * every node above only takes its child's change), so its path is skipped. */
static inline int leaf_holds(const exr_sumtree *t, size_t i, float v)
{
    uint32_t a, b;
    memcpy(&a, &t->leaf[i], sizeof a);
    memcpy(&b, &v, sizeof b);
    return a == b;
}

void exr_sumtree_set_many(exr_sumtree *t, size_t count, const size_t *idx, const float *v,
                          size_t *scratch)
{
    enum { D = 8 };
    (void)scratch;
    exr_sumtree_flush(t);
    /* levels from top up have fewer nodes than half the batch: summed once
     * each from their children at the end instead of taking count deltas */
    int top = top_for(t, count);
    int changed = 0;
    for (size_t k = 0; k < count && k < 2 * D; k++)
        __builtin_prefetch(t->leaf + idx[k], 1);
    for (size_t k = 0; k < count; k++) {
        if (k + 2 * D < count)
            __builtin_prefetch(t->leaf + idx[k + 2 * D], 1);
        /* a level-0 node is fetched only for a leaf that changes (its leaf
         * line, asked for D picks ago, tells) */
        if (k + D < count && !leaf_holds(t, idx[k + D], v[k + D])) {
            __builtin_prefetch(t->sum[0] + idx[k + D] / FAN, 1);
            __builtin_prefetch(t->mn[0] + idx[k + D] / FAN, 1);
        }
        if (leaf_holds(t, idx[k], v[k]))
            continue;
        set_path(t, idx[k], v[k], top);
        changed = 1;
    }
    /* with no leaf changed every node above is as it was: still within its
     * drift bound of its children */
    if (changed)
        rebuild_from(t, top);
}

double exr_sumtree_total(const exr_sumtree *t) { return t->nlev ? t->sum[t->nlev - 1][0] : 0.0; }

float exr_sumtree_min(const exr_sumtree *t) { return t->nlev ? t->mn[t->nlev - 1][0] : INFINITY; }

/* Which of 8 children holds offset *x; *x becomes the offset inside it.
 * Branch-free: the child is the number of prefix sums <= x. No sum is ever
 * negative, so the prefix sums never decrease and a zero child can never be
 * it (its prefix equals the one before). The parent's sum is the children's
 * only within its drift bound and rounding (sumtree.h), so x can be at or
 * past the last prefix: then the last positive child is taken. */
#define CHOOSE(c, x, s)                                                                            \
    do {                                                                                           \
        double pre_ = 0, base_ = 0;                                                                \
        int n_ = 0;                                                                                \
        for (int i_ = 0; i_ < FAN; i_++) {                                                         \
            pre_ += (double)(c)[i_];                                                               \
            int le_ = pre_ <= (x);                                                                 \
            n_ += le_;                                                                             \
            base_ = le_ ? pre_ : base_;                                                            \
        }                                                                                          \
        if (n_ < FAN) {                                                                            \
            (s) = n_;                                                                              \
            (x) -= base_;                                                                          \
        } else {                                                                                   \
            (s) = FAN - 1;                                                                         \
            while ((s) > 0 && !((c)[s] > 0))                                                       \
                (s)--;                                                                             \
            (x) = (double)(c)[s] > 0 ? nextafter((double)(c)[s], 0.0) : 0.0;                       \
        }                                                                                          \
    } while (0)

/* 1 and *y -= h if *y >= h, else 0: without a branch (GCC turns the
 * conditional subtraction of a double into one, and a draw's halving steps
 * go either way at random). */
static inline int step_past(double *y, double h)
{
#if defined(__SSE2__)
    __m128d yv = _mm_set_sd(*y), hv = _mm_set_sd(h);
    __m128d m = _mm_cmple_sd(hv, yv); /* low lane only; cmpge_sd would also shuffle */
    *y = _mm_cvtsd_f64(_mm_sub_sd(yv, _mm_and_pd(m, hv)));
    return _mm_movemask_pd(m) & 1;
#else
    int r = *y >= h;
    *y -= (double)r * h;
    return r;
#endif
}

/* The same choice as CHOOSE in three halving steps: the left half's sum
 * (three additions) decides 0-3 or 4-7, a pair's sum decides between the two
 * pairs, one child between the last two; x becomes the offset inside the
 * child. About half of CHOOSE's instructions, and the selects are
 * comparisons turned into masks, not branches. Its sums round differently
 * from CHOOSE's prefix sums, so x can come out at or past the chosen child's
 * sum (a zero child, or x past the node's total): then CHOOSE is done on the
 * original x, which keeps the guarantee that a zero child is never taken. */
#define DESCEND(c, x, s)                                                                           \
    do {                                                                                           \
        double x0_ = (x);                                                                          \
        double h_ = ((double)(c)[0] + (double)(c)[1]) + ((double)(c)[2] + (double)(c)[3]);         \
        double y_ = x0_;                                                                           \
        int b_ = 4 * step_past(&y_, h_);                                                           \
        b_ += 2 * step_past(&y_, (double)(c)[b_] + (double)(c)[b_ + 1]);                           \
        b_ += step_past(&y_, (double)(c)[b_]);                                                     \
        if (__builtin_expect(!(y_ < (double)(c)[b_]), 0)) {                                        \
            CHOOSE(c, x0_, b_);                                                                    \
            y_ = x0_;                                                                              \
        }                                                                                          \
        (s) = b_;                                                                                  \
        (x) = y_;                                                                                  \
    } while (0)

#if defined(__SSE2__)
/* Two draws at a time, one in each lane of a vector (draw A low, B high):
 * DESCEND's operations in DESCEND's order on each lane, so the same bits
 * and the same children, for about half the instructions of two DESCENDs. */

/* [*a, *b] */
static inline __m128d lanes_d(const double *a, const double *b)
{
    return _mm_loadh_pd(_mm_load_sd(a), b);
}

static inline __m128d lanes_f(const float *a, const float *b)
{
    return _mm_cvtps_pd(_mm_unpacklo_ps(_mm_load_ss(a), _mm_load_ss(b)));
}

/* y -= h in the lanes where y >= h; those lanes as bits (1: A, 2: B). */
static inline int step2(__m128d *y, __m128d h)
{
    __m128d m = _mm_cmple_pd(h, *y);
    *y = _mm_sub_pd(*y, _mm_and_pd(m, h));
    return _mm_movemask_pd(m);
}

/* The halving steps from the four first children c0..c3 of both nodes;
 * then each lane's check, and CHOOSE on its original x where it fails. */
#define DESCEND2(ca, cb, c0, c1, c2, c3, LANES, xa, xb, sa, sb)                                   \
    do {                                                                                           \
        __m128d y_ = _mm_set_pd((xb), (xa));                                                       \
        int m_ = step2(&y_, _mm_add_pd(_mm_add_pd(c0, c1), _mm_add_pd(c2, c3)));                   \
        int ia_ = 4 * (m_ & 1), ib_ = 2 * (m_ & 2);                                                \
        m_ = step2(&y_, _mm_add_pd(LANES(ca + ia_, cb + ib_), LANES(ca + ia_ + 1, cb + ib_ + 1))); \
        ia_ += 2 * (m_ & 1), ib_ += m_ & 2;                                                        \
        m_ = step2(&y_, LANES(ca + ia_, cb + ib_));                                                \
        ia_ += m_ & 1, ib_ += m_ >> 1;                                                             \
        int ok_ = _mm_movemask_pd(_mm_cmplt_pd(y_, LANES(ca + ia_, cb + ib_)));                    \
        double ya_ = _mm_cvtsd_f64(y_), yb_ = _mm_cvtsd_f64(_mm_unpackhi_pd(y_, y_));              \
        if (__builtin_expect(!(ok_ & 1), 0)) {                                                     \
            ya_ = (xa);                                                                            \
            CHOOSE(ca, ya_, ia_);                                                                  \
        }                                                                                          \
        if (__builtin_expect(!(ok_ & 2), 0)) {                                                     \
            yb_ = (xb);                                                                            \
            CHOOSE(cb, yb_, ib_);                                                                  \
        }                                                                                          \
        (xa) = ya_, (xb) = yb_, (sa) = ia_, (sb) = ib_;                                            \
    } while (0)

static inline void descend2_d(const double *ca, const double *cb, double *xa, double *xb,
                              int *sa, int *sb)
{
    __m128d a01 = _mm_loadu_pd(ca), b01 = _mm_loadu_pd(cb);
    __m128d a23 = _mm_loadu_pd(ca + 2), b23 = _mm_loadu_pd(cb + 2);
    __m128d c0 = _mm_unpacklo_pd(a01, b01), c1 = _mm_unpackhi_pd(a01, b01);
    __m128d c2 = _mm_unpacklo_pd(a23, b23), c3 = _mm_unpackhi_pd(a23, b23);
    DESCEND2(ca, cb, c0, c1, c2, c3, lanes_d, *xa, *xb, *sa, *sb);
}

static inline void descend2_f(const float *ca, const float *cb, double *xa, double *xb, int *sa,
                              int *sb)
{
    __m128 fa = _mm_loadu_ps(ca), fb = _mm_loadu_ps(cb);
    __m128 lo = _mm_unpacklo_ps(fa, fb), hi = _mm_unpackhi_ps(fa, fb); /* a0 b0 a1 b1, a2 b2 a3 b3 */
    __m128d c0 = _mm_cvtps_pd(lo), c1 = _mm_cvtps_pd(_mm_movehl_ps(lo, lo));
    __m128d c2 = _mm_cvtps_pd(hi), c3 = _mm_cvtps_pd(_mm_movehl_ps(hi, hi));
    DESCEND2(ca, cb, c0, c1, c2, c3, lanes_f, *xa, *xb, *sa, *sb);
}
#define PAIRS 1
#else
#define PAIRS 0
#endif

/* Four draws at a time (x86-64 with AVX2, chosen at run time): the four
 * nodes' children transposed so that vector c[i] holds child i of each
 * (lane q: draw q), then DESCEND's three halving steps on all four lanes at
 * once, the values they subtract picked by masks from sums of all eight
 * children instead of loaded per lane: the same additions on the same
 * operands, so the same bits and the same children (the pair sums are
 * c0 + c1 and c4 + c5, the left half (c0 + c1) + (c2 + c3), as DESCEND
 * adds them). A lane whose check fails takes CHOOSE on its own x, as in
 * DESCEND. About a third of the pairs' instructions per draw. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__SSE2__)
#include <immintrin.h>
#define QUADS 1
#define AVX2_FN __attribute__((target("avx2")))

/* the CPU's AVX2, asked once (powa.h) */
static int exr_sumtree_quads(void) { return exr_have_avx2(); }

/* c[0..3] from rows r0..r3 of 4 doubles each (a 4x4 transpose) */
AVX2_FN static inline void transpose4(__m256d r0, __m256d r1, __m256d r2, __m256d r3, __m256d *c)
{
    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1); /* a0 b0 a2 b2, a1 b1 a3 b3 */
    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);
    c[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    c[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    c[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    c[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

AVX2_FN static inline void kids4_d(const double *const *n, __m256d *c)
{
    transpose4(_mm256_loadu_pd(n[0]), _mm256_loadu_pd(n[1]), _mm256_loadu_pd(n[2]),
               _mm256_loadu_pd(n[3]), c);
    transpose4(_mm256_loadu_pd(n[0] + 4), _mm256_loadu_pd(n[1] + 4), _mm256_loadu_pd(n[2] + 4),
               _mm256_loadu_pd(n[3] + 4), c + 4);
}

AVX2_FN static inline void kids4_f(const float *const *n, __m256d *c)
{
    __m256 r0 = _mm256_loadu_ps(n[0]), r1 = _mm256_loadu_ps(n[1]);
    __m256 r2 = _mm256_loadu_ps(n[2]), r3 = _mm256_loadu_ps(n[3]);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1); /* a0 b0 a1 b1 | a4 b4 a5 b5 */
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 k[4] = {_mm256_shuffle_ps(t0, t2, 0x44), _mm256_shuffle_ps(t0, t2, 0xEE),
                   _mm256_shuffle_ps(t1, t3, 0x44), _mm256_shuffle_ps(t1, t3, 0xEE)};
    for (int i = 0; i < 4; i++) { /* k[i]: child i of a..d | child i + 4 */
        c[i] = _mm256_cvtps_pd(_mm256_castps256_ps128(k[i]));
        c[i + 4] = _mm256_cvtps_pd(_mm256_extractf128_ps(k[i], 1));
    }
}

/* y -= h in the lanes where h <= y; those lanes' masks. */
AVX2_FN static inline __m256d step4(__m256d *y, __m256d h)
{
    __m256d m = _mm256_cmp_pd(h, *y, _CMP_LE_OQ);
    *y = _mm256_sub_pd(*y, _mm256_and_pd(m, h));
    return m;
}

/* The halving steps of four draws (DESCEND's), *y their offsets; the chosen
 * children in *s; returns the lanes whose offset is below their child's
 * sum (bit q: lane q), the others need CHOOSE. */
AVX2_FN static inline int descend4(const __m256d *c, __m256d *y, __m256i *s)
{
    __m256d p01 = _mm256_add_pd(c[0], c[1]), p45 = _mm256_add_pd(c[4], c[5]);
    __m256d m1 = step4(y, _mm256_add_pd(p01, _mm256_add_pd(c[2], c[3])));
    __m256d m2 = step4(y, _mm256_blendv_pd(p01, p45, m1));
    __m256d even = _mm256_blendv_pd(_mm256_blendv_pd(c[0], c[2], m2),
                                    _mm256_blendv_pd(c[4], c[6], m2), m1);
    __m256d m3 = step4(y, even);
    __m256d odd = _mm256_blendv_pd(_mm256_blendv_pd(c[1], c[3], m2),
                                   _mm256_blendv_pd(c[5], c[7], m2), m1);
    __m256d chosen = _mm256_blendv_pd(even, odd, m3);
    __m256i b = _mm256_and_si256(_mm256_castpd_si256(m1), _mm256_set1_epi64x(4));
    b = _mm256_add_epi64(b, _mm256_and_si256(_mm256_castpd_si256(m2), _mm256_set1_epi64x(2)));
    *s = _mm256_sub_epi64(b, _mm256_castpd_si256(m3)); /* a true mask is -1 */
    return _mm256_movemask_pd(_mm256_cmp_pd(*y, chosen, _CMP_LT_OQ));
}

/* Draws [0, count - count % 4) of one internal level: their nodes' children
 * in ch, the line of each chosen node in `below` prefetched. Returns the
 * draws done. */
AVX2_FN static size_t quads_level(const double *ch, const void *below, size_t line, size_t count,
                                  size_t *out, double *u)
{
    size_t b = 0;
    for (; b + 4 <= count; b += 4) {
        const double *n[4];
        for (int q = 0; q < 4; q++)
            n[q] = ch + FAN * out[b + q];
        __m256d c[FAN], y = _mm256_loadu_pd(u + b);
        __m256i s;
        kids4_d(n, c);
        int ok = descend4(c, &y, &s);
        __m256i j = _mm256_slli_epi64(_mm256_loadu_si256((const __m256i *)(out + b)), 3);
        _mm256_storeu_si256((__m256i *)(out + b), _mm256_add_epi64(j, s));
        double x0[4];
        memcpy(x0, u + b, sizeof x0);
        _mm256_storeu_pd(u + b, y);
        for (int q = 0; __builtin_expect(ok != 15, 0) && q < 4; q++)
            if (!(ok >> q & 1)) {
                int sq;
                CHOOSE(n[q], x0[q], sq);
                out[b + q] = FAN * (out[b + q] / FAN) + (size_t)sq;
                u[b + q] = x0[q];
            }
        for (int q = 0; q < 4; q++)
            __builtin_prefetch((const char *)below + line * out[b + q], 0, 2);
    }
    return b;
}

/* The leaf level of draws [0, count - count % 4). Returns the draws done. */
AVX2_FN static size_t quads_leaves(const float *leaf, size_t count, size_t *out, double *u)
{
    size_t b = 0;
    for (; b + 4 <= count; b += 4) {
        const float *n[4];
        for (int q = 0; q < 4; q++)
            n[q] = leaf + FAN * out[b + q];
        __m256d c[FAN], y = _mm256_loadu_pd(u + b);
        __m256i s;
        kids4_f(n, c);
        int ok = descend4(c, &y, &s);
        __m256i j = _mm256_slli_epi64(_mm256_loadu_si256((const __m256i *)(out + b)), 3);
        _mm256_storeu_si256((__m256i *)(out + b), _mm256_add_epi64(j, s));
        for (int q = 0; __builtin_expect(ok != 15, 0) && q < 4; q++)
            if (!(ok >> q & 1)) {
                double x = u[b + q];
                int sq;
                CHOOSE(n[q], x, sq);
                out[b + q] = FAN * (out[b + q] / FAN) + (size_t)sq;
            }
    }
    return b;
}

/* Eight draws at a time (x86-64 with AVX-512F, chosen at run time): the
 * quads' descent on eight lanes of a 512-bit vector, its comparisons into
 * mask registers, so that each conditional subtraction is one masked
 * subtraction and each select one masked blend (AVX2's blendv is three
 * micro-ops on recent cores, and the quads' descent spent most of its time
 * in them and in the transposes). The eight nodes' children are transposed
 * as an 8x8 block (each node's eight double children are one 64-byte line,
 * one load). The same additions on the same operands as DESCEND, so the same
 * bits and the same children. */
#define AVX512_FN __attribute__((target("avx512f")))

/* the CPU's AVX-512F, asked once (powa.h) */
static int have_avx512f(void) { return exr_have_avx512f(); }

/* c[i] = child i of the eight nodes whose children are rows r[0..8) */
AVX512_FN static inline void transpose8(const __m512d *r, __m512d *c)
{
    static const int64_t lo_i[8] = {0, 1, 8, 9, 4, 5, 12, 13}, hi_i[8] = {2, 3, 10, 11, 6, 7, 14, 15};
    const __m512i lo = _mm512_loadu_si512(lo_i), hi = _mm512_loadu_si512(hi_i);
    __m512d t[8], u[8];
    for (int q = 0; q < 8; q += 2) { /* t[q]: even children of rows q, q+1; t[q+1]: odd */
        t[q] = _mm512_unpacklo_pd(r[q], r[q + 1]);
        t[q + 1] = _mm512_unpackhi_pd(r[q], r[q + 1]);
    }
    /* u[4g + 2e + h]: rows 4g..4g+3, children (2h + e) and (2h + e) + 4 */
    for (int g = 0; g < 2; g++)
        for (int e = 0; e < 2; e++) {
            __m512d a = t[4 * g + e], b = t[4 * g + 2 + e];
            u[4 * g + 2 * e] = _mm512_permutex2var_pd(a, lo, b);
            u[4 * g + 2 * e + 1] = _mm512_permutex2var_pd(a, hi, b);
        }
    for (int e = 0; e < 2; e++)
        for (int h = 0; h < 2; h++) {
            int i = 2 * h + e;
            c[i] = _mm512_shuffle_f64x2(u[2 * e + h], u[4 + 2 * e + h], 0x44);
            c[i + 4] = _mm512_shuffle_f64x2(u[2 * e + h], u[4 + 2 * e + h], 0xEE);
        }
}

/* y -= h in the lanes where h <= y; those lanes */
AVX512_FN static inline __mmask8 step8(__m512d *y, __m512d h)
{
    __mmask8 m = _mm512_cmp_pd_mask(h, *y, _CMP_LE_OQ);
    *y = _mm512_mask_sub_pd(*y, m, *y, h);
    return m;
}

/* descend4's steps on eight lanes: the chosen children in *s, the lanes
 * whose offset is below their child's sum returned */
AVX512_FN static inline __mmask8 descend8(const __m512d *c, __m512d *y, __m512i *s)
{
    __m512d p01 = _mm512_add_pd(c[0], c[1]), p45 = _mm512_add_pd(c[4], c[5]);
    __mmask8 m1 = step8(y, _mm512_add_pd(p01, _mm512_add_pd(c[2], c[3])));
    __mmask8 m2 = step8(y, _mm512_mask_blend_pd(m1, p01, p45));
    __m512d even = _mm512_mask_blend_pd(m1, _mm512_mask_blend_pd(m2, c[0], c[2]),
                                        _mm512_mask_blend_pd(m2, c[4], c[6]));
    __mmask8 m3 = step8(y, even);
    __m512d odd = _mm512_mask_blend_pd(m1, _mm512_mask_blend_pd(m2, c[1], c[3]),
                                       _mm512_mask_blend_pd(m2, c[5], c[7]));
    __m512d chosen = _mm512_mask_blend_pd(m3, even, odd);
    __m512i b = _mm512_maskz_mov_epi64(m1, _mm512_set1_epi64(4));
    b = _mm512_mask_add_epi64(b, m2, b, _mm512_set1_epi64(2));
    *s = _mm512_mask_add_epi64(b, m3, b, _mm512_set1_epi64(1));
    return _mm512_cmp_pd_mask(*y, chosen, _CMP_LT_OQ);
}

/* quads_level for eight draws at a time: draws [0, count - count % 8) */
AVX512_FN static size_t octs_level(const double *ch, const void *below, size_t line, size_t count,
                                  size_t *out, double *u)
{
    size_t b = 0;
    for (; b + 8 <= count; b += 8) {
        /* the nodes' indices read from out, not taken out of a vector's
         * lanes: an extraction from the upper lanes costs two shuffles, a
         * load none (the extractions took a third of this loop's time) */
        const double *n[8];
        for (int q = 0; q < 8; q++)
            n[q] = ch + FAN * out[b + q];
        __m512d r[8], c[FAN], y = _mm512_loadu_pd(u + b);
        for (int q = 0; q < 8; q++)
            r[q] = _mm512_loadu_pd(n[q]);
        transpose8(r, c);
        __m512i sv;
        __mmask8 ok = descend8(c, &y, &sv);
        __m512i o = _mm512_loadu_si512(out + b);
        _mm512_storeu_si512(out + b, _mm512_add_epi64(_mm512_slli_epi64(o, 3), sv));
        double x0[8];
        memcpy(x0, u + b, sizeof x0);
        _mm512_storeu_pd(u + b, y);
        for (int q = 0; __builtin_expect(ok != 0xFF, 0) && q < 8; q++)
            if (!(ok >> q & 1)) {
                int sq;
                CHOOSE(n[q], x0[q], sq);
                out[b + q] = (size_t)(n[q] - ch) + (size_t)sq;
                u[b + q] = x0[q];
            }
        for (int q = 0; q < 8; q++) /* from out again, for the same reason */
            __builtin_prefetch((const char *)below + line * out[b + q], 0, 2);
    }
    return b;
}

/* quads_leaves for eight draws at a time */
AVX512_FN static size_t octs_leaves(const float *leaf, size_t count, size_t *out, double *u)
{
    size_t b = 0;
    for (; b + 8 <= count; b += 8) {
        const float *n[8]; /* read from out, as in octs_level */
        for (int q = 0; q < 8; q++)
            n[q] = leaf + FAN * out[b + q];
        __m512d r[8], c[FAN], y = _mm512_loadu_pd(u + b);
        for (int q = 0; q < 8; q++)
            r[q] = _mm512_cvtps_pd(_mm256_loadu_ps(n[q]));
        transpose8(r, c);
        __m512i sv;
        __mmask8 ok = descend8(c, &y, &sv);
        __m512i o = _mm512_loadu_si512(out + b);
        _mm512_storeu_si512(out + b, _mm512_add_epi64(_mm512_slli_epi64(o, 3), sv));
        for (int q = 0; __builtin_expect(ok != 0xFF, 0) && q < 8; q++)
            if (!(ok >> q & 1)) {
                double x = u[b + q];
                int sq;
                CHOOSE(n[q], x, sq);
                out[b + q] = (size_t)(n[q] - leaf) + (size_t)sq;
            }
    }
    return b;
}
#else
#define QUADS 0
static int exr_sumtree_quads(void) { return 0; }
static int have_avx512f(void) { return 0; }
#endif

/* Draws [b, count) of one internal level k: from their nodes' children in
 * sum[k - 1] to a node of level k - 1, whose line below is prefetched into
 * L2 (locality 2: an L1 prefetch holds one of the core's few L1 miss
 * buffers until its line arrives, which capped the batch's misses in
 * flight; prioritized get_batch(256) at N = 1M took 0.8x the time with L2). */
static void sample_level(const exr_sumtree *t, int k, size_t count, size_t *out, double *u,
                         int quads)
{
    const double *ch = t->sum[k - 1];
    const void *below = k >= 2 ? (const void *)t->sum[k - 2] : (const void *)t->leaf;
    size_t line = k >= 2 ? FAN * sizeof(double) : FAN * sizeof(float);
    size_t b = 0;
#if QUADS
    if (quads == 2)
        b = octs_level(ch, below, line, count, out, u);
    if (quads)
        b += quads_level(ch, below, line, count - b, out + b, u + b);
#else
    (void)quads;
#endif
#if PAIRS
    for (; b + 2 <= count; b += 2) {
        int sa, sb;
        descend2_d(ch + FAN * out[b], ch + FAN * out[b + 1], &u[b], &u[b + 1], &sa, &sb);
        out[b] = FAN * out[b] + (size_t)sa;
        out[b + 1] = FAN * out[b + 1] + (size_t)sb;
        __builtin_prefetch((const char *)below + line * out[b], 0, 2);
        __builtin_prefetch((const char *)below + line * out[b + 1], 0, 2);
    }
#endif
    for (; b < count; b++) {
        const double *c = ch + FAN * out[b];
        double x = u[b];
        int s;
        DESCEND(c, x, s);
        size_t j = FAN * out[b] + (size_t)s;
        out[b] = j;
        u[b] = x;
        __builtin_prefetch((const char *)below + line * j, 0, 2);
    }
}

void exr_sumtree_sample_lanes(const exr_sumtree *t, exr_rng *r, size_t count, size_t *out,
                              double *u, int quads)
{
    quads = !quads || !exr_sumtree_quads() ? 0 : quads >= 2 && have_avx512f() ? 2 : 1;
    double total = exr_sumtree_total(t);
    /* the generator's state in a local: out[] (size_t) may alias its
     * uint64_t words, which would keep it in memory through the loop */
    exr_rng g = *r;
    for (size_t b = 0; b < count; b++) {
        u[b] = exr_rng_double(&g) * total;
        out[b] = 0;
    }
    *r = g;
    /* One level for the whole batch at a time: the line each draw needs next
     * is prefetched while the other draws are worked on. */
    for (int k = t->nlev - 1; k >= 1; k--)
        sample_level(t, k, count, out, u, quads);
    size_t b = 0;
#if QUADS
    if (quads == 2)
        b = octs_leaves(t->leaf, count, out, u);
    if (quads)
        b += quads_leaves(t->leaf, count - b, out + b, u + b);
#endif
#if PAIRS
    for (; b + 2 <= count; b += 2) {
        int sa, sb;
        descend2_f(t->leaf + FAN * out[b], t->leaf + FAN * out[b + 1], &u[b], &u[b + 1], &sa, &sb);
        out[b] = FAN * out[b] + (size_t)sa;
        out[b + 1] = FAN * out[b + 1] + (size_t)sb;
    }
#endif
    for (; b < count; b++) {
        const float *c = t->leaf + FAN * out[b];
        double x = u[b];
        int s;
        DESCEND(c, x, s);
        out[b] = FAN * out[b] + (size_t)s;
    }
}

void exr_sumtree_sample(const exr_sumtree *t, exr_rng *r, size_t count, size_t *out,
                        double *u)
{
    exr_sumtree_sample_lanes(t, r, count, out, u, 2);
}

int exr_sumtree_check(const exr_sumtree *t, size_t n, char *msg, size_t msglen)
{
    if (n > t->cap) {
        snprintf(msg, msglen, "sum tree: %zu picks but room for %zu", n, t->cap);
        return 1;
    }
    for (size_t i = 0; i < t->cap; i++) {
        float v = t->leaf[i];
        if (!(v >= 0) || isinf(v) || (i >= n && v != 0)) {
            snprintf(msg, msglen, "sum tree: leaf %zu (of %zu picks) holds %g", i, n, (double)v);
            return 1;
        }
    }
    for (int k = 0; k < t->nlev; k++) {
        for (size_t j = 0; j < t->len[k]; j++) {
            double s, dr = k ? t->drift[k][j] : 0;
            float m;
            if (k == 0)
                node_from_leaves(t->leaf + FAN * j, &s, &m);
            else
                node_from_nodes(t->sum[k - 1] + FAN * j, t->mn[k - 1] + FAN * j, &s, &m);
            double have = t->sum[k][j];
            /* the drift bound, plus the rounding of the sum just done */
            int bad = k == 0 ? have != s : fabs(have - s) > dr + SUM_ROUNDING(s);
            bad = bad || !(have >= 0) || (s == 0) != (have == 0) || !(dr >= 0) ||
                  dr > have * TWO_M40 || m != t->mn[k][j];
            if (bad) {
                snprintf(msg, msglen,
                         "sum tree: node %zu of level %d holds (%g, %g, drift %g), children give (%g, %g)",
                         j, k, have, (double)t->mn[k][j], dr, s, (double)m);
                return 1;
            }
        }
    }
    return 0;
}
