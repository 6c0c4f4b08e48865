/*
 * sumtree.h - an 8-ary sum tree (with a min tree alongside) over float leaves,
 * for proportional prioritized selection.
 *
 *   level nlev-1            [ root ]                 one node: the total
 *                          /   ...   \
 *   level 1        [s0 s1 s2 s3 s4 s5 s6 s7] ...     each node sums 8 children
 *   level 0        [s0 ... s7] [s0 ... s7]  ...      (double sums, float mins)
 *   leaves        p^a p^a p^a p^a ...                 float, 0 = empty slot
 *   (each node: double sum, float min, double drift bound)
 *
 * Eight double children fill one 64-byte cache line, so a descent touches one
 * line per level: log8(N) lines (7 at N = 1M) instead of log2(N).
 * sum[k][j] is the sum of node j's subtree; mn[k][j] the smallest positive leaf
 * under it (+inf if none), which gives PER's max weight without a scan.
 *
 * Updates are deltas: a leaf's level-0 node is recomputed from its 8 leaves
 * (exact), and each node above gets the change of its child added, instead
 * of summing its 8 children again. A node's rounding drift is bounded, not
 * left to grow: drift[k][j] is an upper bound on |sum - (sum of its 8
 * children)| accumulated since the node was last summed from its children
 * (each delta addition adds 2^-53 (|new sum| + |delta|), the most the two
 * roundings can be off). The node is summed from its children again when
 *   - the bound passes 2^-40 of its sum (a large drop, whose cancellation
 *     would have exposed old rounding, always trips it; so does a subtree
 *     that has just become all zero, whose sum is then within its bound of
 *     0), or
 *   - its sum would be <= 0.
 * So a sum is never negative, a subtree whose leaves are all 0 sums to exactly
 * 0 (a draw never enters it), and every node is within about 2^-40 of the
 * sum of its children (7 levels: within ~1e-11 of the exact leaf sum). The
 * smallest positive leaf goes up only as far as it changes (exact).
 * A batch of updates does the levels with fewer nodes than half the batch
 * (the top of the tree) once, from their children, after all the deltas.
 *
 * Costs: set O(log8 N) additions; sample of B draws O(B log8 N), done level
 * by level over the whole batch with prefetching so that cache misses of
 * different draws overlap (eight draws at a time in the lanes of an AVX-512
 * vector where the machine has AVX-512F, else four in AVX2's, else two in
 * SSE2's); reserve O(N) when it grows (capacity doubles),
 * amortised O(1).
 */
#ifndef EXR_SUMTREE_H
#define EXR_SUMTREE_H

#include <stdint.h>

#include "exr.h"
#include "rng.h"

#define EXR_ST_MAXLEV 24
#define EXR_ST_MAXDIRTY 512

typedef struct {
    size_t cap;                 /* leaf slots: a power of two >= 64 */
    int nlev;                   /* internal levels; level nlev-1 is the root */
    float *leaf;                /* cap leaves */
    double *sum[EXR_ST_MAXLEV]; /* sum[k] has 8 * len[k+1] slots (padding is 0) */
    float *mn[EXR_ST_MAXLEV];
    double *drift[EXR_ST_MAXLEV]; /* bound on |sum - sum of children|; NULL at level 0 (exact) */
    size_t len[EXR_ST_MAXLEV];  /* nodes in use at level k */
    /* Deferred leaf writes (exr_sumtree_put): the level-0 nodes whose
     * leaves changed since the last flush, once each (dmark: one bit per
     * level-0 node). The nodes above them are stale until exr_sumtree_flush. */
    uint64_t *dmark;
    size_t ndirty;
    size_t dirty[EXR_ST_MAXDIRTY];
} exr_sumtree;

void exr_sumtree_init(exr_sumtree *t);
void exr_sumtree_free(exr_sumtree *t);

/* Room for leaves [0, n). EXR_ENOMEM or EXR_EOVERFLOW leaves t unchanged. */
exr_status exr_sumtree_reserve(exr_sumtree *t, size_t n);

/* Recomputes every internal node from the leaves (after writing leaf[]
 * directly). O(cap). */
void exr_sumtree_rebuild(exr_sumtree *t);

/* leaf[i] = v (v >= 0, i < cap), then fixes its ancestors. */
void exr_sumtree_set(exr_sumtree *t, size_t i, float v);

/* leaf[idx[k]] = v[k] for k < count, in order (the last value for a leaf
 * wins), each followed by its ancestors' deltas; the top levels (fewer nodes
 * than count / 2) once at the end. A leaf that already holds its value (bit
 * for bit) is skipped, and the top levels too when no leaf changed.
 * scratch holds count size_t. */
void exr_sumtree_set_many(exr_sumtree *t, size_t count, const size_t *idx, const float *v,
                          size_t *scratch);

/* leaf[i] = v without fixing its ancestors: many puts, then one flush,
 * cost a tree pass per distinct level-0 node touched (the top levels once)
 * instead of one per write. Until the flush only exr_sumtree_get (and more
 * puts) may be used; every other function here flushes first or expects
 * no write pending (sample, total, min, check: flush before them). */
void exr_sumtree_put(exr_sumtree *t, size_t i, float v);
/* Fixes the ancestors of every put since the last flush. */
void exr_sumtree_flush(exr_sumtree *t);
static inline int exr_sumtree_pending(const exr_sumtree *t) { return t->ndirty != 0; }

static inline float exr_sumtree_get(const exr_sumtree *t, size_t i) { return t->leaf[i]; }
double exr_sumtree_total(const exr_sumtree *t);
/* Smallest positive leaf, +inf if every leaf is 0. */
float exr_sumtree_min(const exr_sumtree *t);

/* count independent draws proportional to the leaves into out[]; scratch
 * holds count doubles. The total must be > 0. Never returns a zero leaf. */
void exr_sumtree_sample(const exr_sumtree *t, exr_rng *r, size_t count, size_t *out,
                        double *scratch);
/* The same draws with the lanes chosen: quads 0 the SSE2 pairs (or one at a
 * time), 1 the four-lane AVX2 descent where the machine has AVX2, 2 the
 * eight-lane AVX-512 descent where it has AVX-512F (else as 1).
 * exr_sumtree_sample takes the widest the machine has; the tests compare
 * them, which must agree bit for bit. */
void exr_sumtree_sample_lanes(const exr_sumtree *t, exr_rng *r, size_t count, size_t *out,
                              double *scratch, int quads);

/* 0 if every internal node matches its children (a level-0 sum within 1e-12
 * of its leaves' sum, a higher one within its drift bound and that bound
 * within 2^-40 of its sum; every min exact), else 1 with a description in
 * msg. */
int exr_sumtree_check(const exr_sumtree *t, size_t n, char *msg, size_t msglen);

#endif
