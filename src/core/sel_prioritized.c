/*
 * sel_prioritized.c - proportional prioritized selection (PER, Schaul et al.):
 * P(i) = p_i^alpha / sum_j p_j^alpha, weights w_i = (N P(i))^-beta / max_j w_j.
 *
 * The leaves of a sum tree hold p^alpha as float32 (powa.h computes it): 4
 * bytes a pick, plus about 2.9 bytes of internal nodes (sum, min, drift). The max weight belongs to the smallest
 * positive leaf, which the tree's min half gives in O(1), so
 * w_i = (min_leaf / leaf_i)^beta: N cancels out.
 *
 * Costs: add, remove, update O(log8 N); a batch of B draws O(B log8 N).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "powa.h"
#include "selector.h"
#include "sumtree.h"

enum { P_ALPHA = 0, P_BETA = 1 };

/* Picks entered but whose p^alpha is not computed yet (p_add): converted
 * PENDING at a time, sixteen per step with AVX2, instead of one by one. */
#define PENDING 128

typedef struct {
    exr_selector base;
    double alpha, beta;
    double max_prio; /* largest priority entered so far, >= 1 */
    exr_sumtree tree;
    /* Pending adds: entry k is the pick now at table index pidx[k] (SIZE_MAX:
     * removed since) with priority pprio[k]; its leaf meanwhile holds a NaN
     * whose payload is k (a real leaf is never NaN), so that remove() can
     * follow it when the pick moves. */
    size_t npend;
    size_t pidx[PENDING];
    double pprio[PENDING];
} prio_sel;

#define PEND_TAG 0x7fc00000u

static float pend_leaf(size_t k)
{
    uint32_t u = PEND_TAG | (uint32_t)k;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}

static size_t pend_slot(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & ~PEND_TAG;
}

/* The pending adds' leaves, computed together and written. Each is written
 * straight into its slot: the tag got there by exr_sumtree_put (p_add, or
 * p_remove moving it), which marked the slot's level-0 node dirty, and no
 * tree flush runs while adds are pending (make_room, sync). */
static void materialize(prio_sel *s)
{
    if (!s->npend)
        return;
    float leaves[PENDING];
    exr_pow_leaves(s->pprio, 1, s->npend, s->alpha, leaves);
    for (size_t k = 0; k < s->npend; k++)
        if (s->pidx[k] != SIZE_MAX)
            s->tree.leaf[s->pidx[k]] = leaves[k];
    s->npend = 0;
}

static float to_leaf(const prio_sel *s, double prio) { return exr_pow_leaf(prio, s->alpha); }

static int p_param_ok(int k, double v)
{
    (void)k;
    return isfinite(v) && v >= 0;
}

static exr_status p_create(exr_selector **out, const double *params, size_t n)
{
    if (!p_param_ok(P_ALPHA, params[P_ALPHA]) || !p_param_ok(P_BETA, params[P_BETA]))
        return EXR_EINVAL;
    prio_sel *s = calloc(1, sizeof *s);
    if (!s)
        return EXR_ENOMEM;
    s->base.vt = &exr_sel_prioritized;
    s->alpha = params[P_ALPHA];
    s->beta = params[P_BETA];
    s->max_prio = 1.0;
    exr_sumtree_init(&s->tree);
    exr_status st = exr_sumtree_reserve(&s->tree, n ? n : 1);
    if (st != EXR_OK) {
        free(s);
        return st;
    }
    *out = &s->base;
    return EXR_OK;
}

static void p_destroy(exr_selector *b)
{
    prio_sel *s = (prio_sel *)b;
    exr_sumtree_free(&s->tree);
    free(s);
}

static double p_get_param(const exr_selector *b, int k)
{
    const prio_sel *s = (const prio_sel *)b;
    return k == P_ALPHA ? s->alpha : s->beta;
}

static void p_set_param(exr_selector *b, int k, double v)
{
    prio_sel *s = (prio_sel *)b;
    if (k == P_BETA)
        s->beta = v;
}

static exr_status p_reserve(exr_selector *b, size_t n)
{
    materialize((prio_sel *)b); /* growing rebuilds the tree from the leaves */
    return exr_sumtree_reserve(&((prio_sel *)b)->tree, n);
}

/* Record calls add and remove picks by leaf writes only (exr_sumtree_put);
 * the tree above them is fixed once, by flush, before the storage lock is
 * let go (exr_buffer_unlock) or before anything here reads the sums. In a
 * shared-lock reader no write is ever pending, so the flushes below that
 * cast a const selector away are no-ops there. */
static void sync(const prio_sel *cs)
{
    prio_sel *s = (prio_sel *)cs;
    materialize(s);
    if (exr_sumtree_pending(&s->tree))
        exr_sumtree_flush(&s->tree);
}

static void p_flush(exr_selector *b) { sync((prio_sel *)b); }

/* Room for one add or remove: the pending adds (each one more dirty node
 * when materialized) and the step's own two leaves fit the tree's dirty
 * list, so exr_sumtree_put never flushes over a pending (NaN) leaf. */
static void make_room(prio_sel *s)
{
    if (s->tree.ndirty + s->npend + 2 > EXR_ST_MAXDIRTY || s->npend == PENDING)
        sync(s);
}

static void p_add(exr_selector *b, size_t i, double prio)
{
    prio_sel *s = (prio_sel *)b;
    make_room(s);
    if (isnan(prio))
        prio = s->max_prio;
    else if (prio > s->max_prio)
        s->max_prio = prio;
    size_t k = s->npend++;
    s->pidx[k] = i;
    s->pprio[k] = prio;
    exr_sumtree_put(&s->tree, i, pend_leaf(k));
}

/* Whether count adds with their leaves computed (no NaN among them) can
 * go as one: then none of them would sync (make_room: the pending adds
 * stay as they are, and the tree's dirty list has room for every level-0
 * node the leaves i0 .. i0 + count - 1 lie in), so writing them all and
 * marking their nodes after leaves the tree as the single adds would. */
static int add_run_ok(const prio_sel *s, size_t i0, size_t count, const float *stored)
{
    int nan = 0;
    for (size_t k = 0; k < count; k++)
        nan |= isnan(stored[k]);
    size_t nodes = (i0 + count - 1) / 8 - i0 / 8 + 1;
    return !nan && s->npend < PENDING && s->tree.ndirty + s->npend + nodes + 2 <= EXR_ST_MAXDIRTY;
}

/* p_add for each pick, those with their leaf computed already writing it
 * at once instead of leaving it pending. */
static void p_add_stored(exr_selector *b, size_t i0, size_t count, const float *prio,
                         const float *stored)
{
    prio_sel *s = (prio_sel *)b;
    if (count && add_run_ok(s, i0, count, stored)) {
        double mp = s->max_prio;
        for (size_t k = 0; k < count; k++)
            mp = prio[k] > mp ? prio[k] : mp;
        s->max_prio = mp;
        memcpy(s->tree.leaf + i0, stored, count * sizeof *stored);
        for (size_t i = i0; i < i0 + count; i += 8)
            exr_sumtree_put(&s->tree, i, stored[i - i0]); /* marks the node */
        exr_sumtree_put(&s->tree, i0 + count - 1, stored[count - 1]);
        return;
    }
    for (size_t k = 0; k < count; k++) {
        if (isnan(stored[k])) {
            p_add(b, i0 + k, prio[k]);
            continue;
        }
        make_room(s);
        if (prio[k] > s->max_prio)
            s->max_prio = prio[k];
        exr_sumtree_put(&s->tree, i0 + k, stored[k]);
    }
}

static void p_remove(exr_selector *b, size_t i, size_t last)
{
    prio_sel *s = (prio_sel *)b;
    make_room(s);
    float gone = exr_sumtree_get(&s->tree, i);
    if (isnan(gone))
        s->pidx[pend_slot(gone)] = SIZE_MAX;
    if (i != last) {
        float moved = exr_sumtree_get(&s->tree, last);
        if (isnan(moved))
            s->pidx[pend_slot(moved)] = i;
        exr_sumtree_put(&s->tree, i, moved);
    }
    exr_sumtree_put(&s->tree, last, 0.0f);
}

/* With no add pending no leaf is a tag to follow, and when the dirty list
 * has room for every leaf written (two a removal) no removal would sync:
 * then the removals are the leaf moves alone. */
static void p_remove_many(exr_selector *b, size_t count, const size_t *i, size_t last0)
{
    prio_sel *s = (prio_sel *)b;
    if (s->npend || s->tree.ndirty + 2 * count + 2 > EXR_ST_MAXDIRTY) {
        for (size_t k = 0; k < count; k++)
            p_remove(b, i[k], last0 - k);
        return;
    }
    exr_sumtree *t = &s->tree;
    for (size_t k = 0; k < count; k++) {
        size_t last = last0 - k;
        if (i[k] != last)
            exr_sumtree_put(t, i[k], exr_sumtree_get(t, last));
        exr_sumtree_put(t, last, 0.0f);
    }
}

static void p_update(exr_selector *b, size_t i, double prio)
{
    prio_sel *s = (prio_sel *)b;
    sync(s);
    if (prio > s->max_prio)
        s->max_prio = prio;
    exr_sumtree_set(&s->tree, i, to_leaf(s, prio));
}

/* update_many with the new leaves given (stored: p_update_many_stored) or
 * computed here (NULL). */
static void update_many_with(prio_sel *s, size_t count, const size_t *idx, const double *prio,
                             const float *stored, size_t *scratch)
{
    sync(s);
    float small[256] = {0}; /* zeroed only to quiet a false maybe-uninitialized warning */
    float *leaves = stored || count <= 256 ? small : malloc(count * sizeof(float));
    if (!leaves) {
        for (size_t k = 0; k < count; k++)
            p_update(&s->base, idx[k], prio[k]);
        return;
    }
    /* four running maxima: one would be a chain of count dependent steps */
    double mp[4] = {s->max_prio, s->max_prio, s->max_prio, s->max_prio};
    size_t k = 0;
    for (; k + 4 <= count; k += 4)
        for (int q = 0; q < 4; q++)
            mp[q] = prio[k + q] > mp[q] ? prio[k + q] : mp[q];
    for (; k < count; k++)
        mp[0] = prio[k] > mp[0] ? prio[k] : mp[0];
    mp[0] = mp[0] > mp[1] ? mp[0] : mp[1];
    mp[2] = mp[2] > mp[3] ? mp[2] : mp[3];
    s->max_prio = mp[0] > mp[2] ? mp[0] : mp[2];
    if (!stored)
        exr_pow_leaves(prio, 1, count, s->alpha, leaves);
    exr_sumtree_set_many(&s->tree, count, idx, stored ? stored : leaves, scratch);
    if (leaves != small)
        free(leaves);
}

static void p_update_many(exr_selector *b, size_t count, const size_t *idx, const double *prio,
                          size_t *scratch)
{
    update_many_with((prio_sel *)b, count, idx, prio, NULL, scratch);
}

static double p_stored_power(const exr_selector *b) { return ((const prio_sel *)b)->alpha; }

static void p_update_many_stored(exr_selector *b, size_t count, const size_t *idx,
                                 const double *prio, const float *stored, size_t *scratch)
{
    update_many_with((prio_sel *)b, count, idx, prio, stored, scratch);
}

/* w = (min_leaf / leaf) ** beta for the leaves leaf[0..count) (the picks'
 * stored p^alpha: float32, exact in double), the ratio in double and the
 * power by powa.h's series (16 at a time with AVX2): within ~1e-14 of the
 * exact power before the float32 rounding, where libm's powf per pick took
 * ~10% of a prioritized get_batch. A zero leaf (reachable only through
 * _gather) gets (N * 0)^-beta: +inf, or 1 for beta 0. w may be leaf. */
static void weights_from_leaves(double lo, double beta, size_t count, const float *leaf, float *w)
{
    enum { CHUNK = 256 };
    double ratio[CHUNK];
    float kept[CHUNK]; /* the leaves of a chunk with a zero one: w may overwrite them */
    for (size_t b0 = 0; b0 < count; b0 += CHUNK) {
        size_t n = count - b0 < CHUNK ? count - b0 : CHUNK;
        int zero = 0;
        for (size_t b = 0; b < n; b++) {
            double l = leaf[b0 + b];
            zero |= !(l > 0);
            ratio[b] = l > 0 ? lo / l : 1.0;
        }
        if (zero)
            memcpy(kept, leaf + b0, n * sizeof *kept);
        /* the ratio is in [2^-277, 1]: a normal double, its power in [0, 1] */
        exr_pow_leaves(ratio, 1, n, beta, w + b0);
        for (size_t b = 0; zero && b < n; b++)
            if (!(kept[b] > 0))
                w[b0 + b] = beta == 0 ? 1.0f : INFINITY;
    }
}

static void weights_of(const prio_sel *s, size_t count, const size_t *idx, float *w)
{
    sync(s);
    for (size_t b = 0; b < count; b++)
        w[b] = exr_sumtree_get(&s->tree, idx[b]);
    weights_from_leaves(exr_sumtree_min(&s->tree), s->beta, count, w, w);
}

static void weights_post(const exr_wpost *p, size_t count, float *w)
{
    weights_from_leaves(p->lo, p->beta, count, w, w);
}

static exr_status p_sample_post(exr_selector *b, size_t n, size_t count, size_t *idx, float *w,
                                double *scratch, exr_wpost *post)
{
    prio_sel *s = (prio_sel *)b;
    sync(s);
    if (n == 0 || !(exr_sumtree_total(&s->tree) > 0))
        return EXR_EEMPTY;
    exr_sumtree_sample(&s->tree, &b->rng, count, idx, scratch);
    for (size_t k = 0; k < count; k++) {
        exr_sel_prefetch(b, idx[k]);
        w[k] = exr_sumtree_get(&s->tree, idx[k]);
    }
    *post = (exr_wpost){weights_post, exr_sumtree_min(&s->tree), s->beta};
    return EXR_OK;
}

static exr_status p_sample(exr_selector *b, size_t n, size_t count, size_t *idx, float *w,
                           double *scratch)
{
    exr_wpost post;
    exr_status st = p_sample_post(b, n, count, idx, w, scratch, &post);
    if (st == EXR_OK)
        weights_post(&post, count, w);
    return st;
}

static void p_weights(const exr_selector *b, size_t n, size_t count, const size_t *idx, float *w)
{
    (void)n;
    weights_of((const prio_sel *)b, count, idx, w);
}

static void p_stats(const exr_selector *b, size_t n, double *total, double *min_pos)
{
    const prio_sel *s = (const prio_sel *)b;
    (void)n;
    sync(s);
    *total = exr_sumtree_total(&s->tree);
    *min_pos = exr_sumtree_min(&s->tree);
}

static double p_stored(const exr_selector *b, size_t i)
{
    sync((const prio_sel *)b);
    return exr_sumtree_get(&((const prio_sel *)b)->tree, i);
}

/* State: f64 max_prio, then the n leaves (float32) in pick-table order. */
static uint64_t p_state_size(const exr_selector *b, size_t n)
{
    (void)b;
    return 8 + 4 * (uint64_t)n;
}

static exr_status p_save(const exr_selector *b, size_t n, struct exr_out *o)
{
    const prio_sel *s = (const prio_sel *)b;
    sync(s);
    exr_status st = exr_out_write(o, &s->max_prio, 8);
    if (st == EXR_OK && n)
        st = exr_out_write(o, s->tree.leaf, n * sizeof(float));
    return st;
}

static exr_status p_load(exr_selector *b, size_t n, struct exr_in *in)
{
    prio_sel *s = (prio_sel *)b;
    double mp;
    exr_status st = exr_in_read(in, &mp, 8);
    if (st != EXR_OK)
        return st;
    if (!isfinite(mp) || mp < 1.0)
        return EXR_ECORRUPT;
    s->max_prio = mp;
    st = exr_sumtree_reserve(&s->tree, n ? n : 1);
    if (st != EXR_OK)
        return st;
    if (n) {
        st = exr_in_read(in, s->tree.leaf, n * sizeof(float));
        if (st != EXR_OK)
            return st;
    }
    for (size_t i = 0; i < n; i++) {
        float v = s->tree.leaf[i];
        if (!(v >= 0) || isinf(v))
            return EXR_ECORRUPT;
    }
    exr_sumtree_rebuild(&s->tree);
    return EXR_OK;
}

static int p_check(const exr_selector *b, size_t n, char *msg, size_t len)
{
    const prio_sel *s = (const prio_sel *)b;
    sync(s);
    if (!(s->max_prio >= 1.0) || !isfinite(s->max_prio)) {
        snprintf(msg, len, "prioritized selector: maximum so far is %g", s->max_prio);
        return 1;
    }
    return exr_sumtree_check(&s->tree, n, msg, len);
}

const exr_selector_vtable exr_sel_prioritized = {
    .name = "prioritized",
    .nparams = 2,
    .param_names = {"alpha", "beta"},
    .param_defaults = {0.6, 0.4},
    .prioritized = true,
    .create = p_create,
    .destroy = p_destroy,
    .param_ok = p_param_ok,
    .get_param = p_get_param,
    .settable_from = P_BETA,
    .set_param = p_set_param,
    .reserve = p_reserve,
    .add = p_add,
    .add_stored = p_add_stored,
    .remove = p_remove,
    .remove_many = p_remove_many,
    .flush = p_flush,
    .update = p_update,
    .update_many = p_update_many,
    .stored_power = p_stored_power,
    .update_many_stored = p_update_many_stored,
    .sample = p_sample,
    .sample_post = p_sample_post,
    .weights = p_weights,
    .stats = p_stats,
    .stored = p_stored,
    .state_size = p_state_size,
    .save = p_save,
    .load = p_load,
    .check = p_check,
};
