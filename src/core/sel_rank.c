/*
 * sel_rank.c - rank-based prioritized selection (the rank variant of PER,
 * Schaul et al.): a pick of rank r among N (rank 1 = highest priority) is
 * drawn with P(r) = r^-alpha / sum_{k<=N} k^-alpha, whatever the size of its
 * priority, so that outliers cannot dominate the draws. Weights follow PER:
 * w = (N P(r))^-beta / max_j w_j = (r / N)^(alpha beta).
 *
 * Ranks come, as in the PER paper's own implementation, from a binary
 * max-heap over the priorities: a pick's rank is its position in the heap
 * array, plus one. A heap orders each pick before its descendants only, so
 * after each n changes (adds, removals, updates) the array is sorted again,
 * by priority (descending) then pick index, which makes every position the
 * exact rank at that moment; a sorted array is a heap, so nothing else
 * changes.
 *
 *   heap[0..n)   pick index at each position          4 B a pick
 *   pos[i]       position of pick i                     4 B a pick
 *   key[i]       priority of pick i (float32)           4 B a pick
 *   cum[j]       sum of k^-alpha for k <= 8 j (double)   1 B a pick
 *
 * A draw finds its rank from cum[] (binary search) and at most 7 powers.
 * A zero priority ranks last but is still drawn: ranks ignore magnitudes.
 *
 * Costs: add, remove, update O(log N), plus O(N log N) every N changes;
 * a batch of B draws O(B log N).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "selector.h"
#include "mem.h"

enum { R_ALPHA = 0, R_BETA = 1 };
#define RANKS_PER_CUM 8
#define MIN_RESORT 64

typedef struct {
    exr_selector base;
    double alpha, beta;
    double max_prio; /* largest priority entered so far, >= 1 */
    uint32_t *heap, *pos;
    float *key;
    size_t n, cap;
    uint64_t changes; /* since the last sort */
    double *cum;      /* cum[j] = sum_{k <= 8 j} k^-alpha, j < ncum */
    size_t ncum;
} rank_sel;

static float to_key(double prio) { return prio > FLT_MAX ? FLT_MAX : (float)prio; }

static int r_param_ok(int k, double v)
{
    (void)k;
    return isfinite(v) && v >= 0;
}

/* The first capacity >= need doubling from have (from 16 if none). */
static size_t doubled_cap(size_t have, size_t need)
{
    size_t cap = have ? have : 16;
    while (cap < need)
        cap *= 2;
    return cap;
}

/* The array *pp points to (pp: the address of a T *) resized to n items of
 * elem bytes; on failure it is left as it was. */
static exr_status resize_array(void *pp, size_t n, size_t elem)
{
    void *p;
    memcpy(&p, pp, sizeof p);
    void *q = realloc(p, n * elem);
    if (!q)
        return EXR_ENOMEM;
    memcpy(pp, &q, sizeof q);
    return EXR_OK;
}

/* cum[] long enough for ranks up to n. */
static exr_status grow_cum(rank_sel *s, size_t n)
{
    size_t need = n / RANKS_PER_CUM + 1;
    if (need <= s->ncum)
        return EXR_OK;
    size_t cap = doubled_cap(s->ncum, need);
    if (resize_array(&s->cum, cap, sizeof *s->cum) != EXR_OK)
        return EXR_ENOMEM;
    double *c = s->cum;
    double acc = s->ncum ? c[s->ncum - 1] : 0.0;
    if (!s->ncum)
        c[s->ncum++] = 0.0;
    for (size_t j = s->ncum; j < cap; j++) {
        for (size_t r = (j - 1) * RANKS_PER_CUM + 1; r <= j * RANKS_PER_CUM; r++)
            acc += pow((double)r, -s->alpha);
        c[j] = acc;
    }
    s->ncum = cap;
    return EXR_OK;
}

static exr_status r_reserve(exr_selector *b, size_t n)
{
    rank_sel *s = (rank_sel *)b;
    if (n > UINT32_MAX)
        return EXR_EOVERFLOW;
    if (grow_cum(s, n) != EXR_OK)
        return EXR_ENOMEM;
    if (n <= s->cap)
        return EXR_OK;
    size_t cap = doubled_cap(s->cap, n);
    if (resize_array(&s->heap, cap, sizeof *s->heap) != EXR_OK ||
        resize_array(&s->pos, cap, sizeof *s->pos) != EXR_OK ||
        resize_array(&s->key, cap, sizeof *s->key) != EXR_OK)
        return EXR_ENOMEM;
    s->cap = cap;
    return EXR_OK;
}

static void r_destroy(exr_selector *b)
{
    rank_sel *s = (rank_sel *)b;
    free(s->heap);
    free(s->pos);
    free(s->key);
    free(s->cum);
    free(s);
}

static exr_status r_create(exr_selector **out, const double *params, size_t n)
{
    if (!r_param_ok(R_ALPHA, params[R_ALPHA]) || !r_param_ok(R_BETA, params[R_BETA]))
        return EXR_EINVAL;
    rank_sel *s = exr_line_calloc(sizeof *s);
    if (!s)
        return EXR_ENOMEM;
    s->base.vt = &exr_sel_rank;
    s->alpha = params[R_ALPHA];
    s->beta = params[R_BETA];
    s->max_prio = 1.0;
    if (r_reserve(&s->base, n ? n : 1) != EXR_OK) {
        r_destroy(&s->base);
        return EXR_ENOMEM;
    }
    *out = &s->base;
    return EXR_OK;
}

static double r_get_param(const exr_selector *b, int k)
{
    const rank_sel *s = (const rank_sel *)b;
    return k == R_ALPHA ? s->alpha : s->beta;
}

static void r_set_param(exr_selector *b, int k, double v)
{
    if (k == R_BETA)
        ((rank_sel *)b)->beta = v;
}

/* ---- the heap ------------------------------------------------------------ */

static void place(rank_sel *s, size_t at, uint32_t pick)
{
    s->heap[at] = pick;
    s->pos[pick] = (uint32_t)at;
}

static void sift_up(rank_sel *s, size_t at)
{
    uint32_t x = s->heap[at];
    while (at > 0) {
        size_t up = (at - 1) / 2;
        if (!(s->key[x] > s->key[s->heap[up]]))
            break;
        place(s, at, s->heap[up]);
        at = up;
    }
    place(s, at, x);
}

static void sift_down(rank_sel *s, size_t at)
{
    uint32_t x = s->heap[at];
    for (;;) {
        size_t c = 2 * at + 1;
        if (c >= s->n)
            break;
        if (c + 1 < s->n && s->key[s->heap[c + 1]] > s->key[s->heap[c]])
            c++;
        if (!(s->key[s->heap[c]] > s->key[x]))
            break;
        place(s, at, s->heap[c]);
        at = c;
    }
    place(s, at, x);
}

static void resift(rank_sel *s, size_t at)
{
    if (at > 0 && s->key[s->heap[at]] > s->key[s->heap[(at - 1) / 2]])
        sift_up(s, at);
    else
        sift_down(s, at);
}

/* a comes before b: higher priority, then lower pick index */
static int before(const rank_sel *s, uint32_t a, uint32_t b)
{
    return s->key[a] > s->key[b] || (s->key[a] == s->key[b] && a < b);
}

/* Sorts heap[0..n) by `before`, in place (heapsort on the reverse order). */
static void sort_heap(rank_sel *s)
{
    uint32_t *h = s->heap;
    size_t n = s->n;
    for (size_t len = n, i = n / 2; len > 1;) {
        if (i > 0)
            i--; /* building */
        else {
            len--; /* extracting: the last in order goes to the end */
            uint32_t t = h[0];
            h[0] = h[len];
            h[len] = t;
        }
        for (size_t at = i;;) {
            size_t c = 2 * at + 1;
            if (c >= len)
                break;
            if (c + 1 < len && before(s, h[c], h[c + 1]))
                c++;
            if (!before(s, h[at], h[c]))
                break;
            uint32_t t = h[at];
            h[at] = h[c];
            h[c] = t;
            at = c;
        }
    }
    for (size_t i = 0; i < n; i++)
        s->pos[h[i]] = (uint32_t)i;
}

static void changed(rank_sel *s)
{
    if (++s->changes >= (s->n > MIN_RESORT ? s->n : MIN_RESORT)) {
        sort_heap(s);
        s->changes = 0;
    }
}

/* ---- the vtable ---------------------------------------------------------- */

/* A new pick's key at index i, from its recorded priority (NaN: none, the
 * largest so far). */
static void enter_key(rank_sel *s, size_t i, double prio)
{
    if (isnan(prio))
        prio = s->max_prio;
    else if (prio > s->max_prio)
        s->max_prio = prio;
    s->key[i] = to_key(prio);
}

static void r_add(exr_selector *b, size_t i, double prio)
{
    rank_sel *s = (rank_sel *)b;
    enter_key(s, i, prio);
    s->n = i + 1;
    place(s, i, (uint32_t)i);
    sift_up(s, i);
    changed(s);
}

static void r_remove(exr_selector *b, size_t i, size_t last)
{
    rank_sel *s = (rank_sel *)b;
    size_t at = s->pos[i];
    s->n = last;
    if (at < last) {
        place(s, at, s->heap[last]);
        resift(s, at);
    }
    if (i != last) { /* pick `last` is called i from now on */
        s->key[i] = s->key[last];
        place(s, s->pos[last], (uint32_t)i);
    }
    changed(s);
}

/* The new pick keeps the heap entry of index i, with its own key. */
static void r_replace(exr_selector *b, size_t i, double prio)
{
    rank_sel *s = (rank_sel *)b;
    enter_key(s, i, prio);
    resift(s, s->pos[i]);
    changed(s);
}

static void r_update(exr_selector *b, size_t i, double prio)
{
    rank_sel *s = (rank_sel *)b;
    if (prio > s->max_prio)
        s->max_prio = prio;
    s->key[i] = to_key(prio);
    resift(s, s->pos[i]);
    changed(s);
}

static void r_update_many(exr_selector *b, size_t count, const size_t *idx, const double *prio,
                          size_t *scratch)
{
    (void)scratch;
    for (size_t k = 0; k < count; k++)
        r_update(b, idx[k], prio[k]);
}

/* sum_{k <= r} k^-alpha */
static double cum_to(const rank_sel *s, size_t r)
{
    size_t j = r / RANKS_PER_CUM;
    double acc = s->cum[j];
    for (size_t k = j * RANKS_PER_CUM + 1; k <= r; k++)
        acc += pow((double)k, -s->alpha);
    return acc;
}

/* The rank r in [1, n] with cum_to(r - 1) <= u < cum_to(r). */
static size_t rank_of(const rank_sel *s, size_t n, double u)
{
    size_t lo = 0, hi = n / RANKS_PER_CUM; /* cum[lo] <= u */
    while (lo < hi) {
        size_t mid = lo + (hi - lo + 1) / 2;
        if (s->cum[mid] <= u)
            lo = mid;
        else
            hi = mid - 1;
    }
    double acc = s->cum[lo];
    size_t r = lo * RANKS_PER_CUM;
    while (r < n) {
        acc += pow((double)(r + 1), -s->alpha);
        r++;
        if (u < acc)
            break;
    }
    return r ? r : 1;
}

static float weight_of(const rank_sel *s, size_t n, size_t rank)
{
    return (float)pow((double)rank / (double)n, s->alpha * s->beta);
}

static exr_status r_sample(exr_selector *b, size_t n, size_t count, size_t *idx, float *w,
                           double *scratch)
{
    rank_sel *s = (rank_sel *)b;
    (void)scratch;
    if (n == 0)
        return EXR_EEMPTY;
    double total = cum_to(s, n);
    for (size_t k = 0; k < count; k++) {
        size_t r = rank_of(s, n, exr_rng_double(&b->rng) * total);
        idx[k] = s->heap[r - 1];
        w[k] = weight_of(s, n, r);
    }
    return EXR_OK;
}

static void r_weights(const exr_selector *b, size_t n, size_t count, const size_t *idx, float *w)
{
    const rank_sel *s = (const rank_sel *)b;
    for (size_t k = 0; k < count; k++)
        w[k] = weight_of(s, n, (size_t)s->pos[idx[k]] + 1);
}

static void r_stats(const exr_selector *b, size_t n, double *total, double *min_pos)
{
    const rank_sel *s = (const rank_sel *)b;
    *total = n ? cum_to(s, n) : 0.0;
    *min_pos = n ? pow((double)n, -s->alpha) : INFINITY;
}

static double r_stored(const exr_selector *b, size_t i) { return ((const rank_sel *)b)->key[i]; }

/* State: f64 max_prio, u64 changes, then the n heap entries (u32 pick
 * indices, in heap order) and the n priorities (f32, in pick-table order). */
static uint64_t r_state_size(const exr_selector *b, size_t n)
{
    (void)b;
    return 16 + 8 * (uint64_t)n;
}

static exr_status r_save(const exr_selector *b, size_t n, struct exr_out *o)
{
    const rank_sel *s = (const rank_sel *)b;
    exr_status st = exr_out_write(o, &s->max_prio, 8);
    if (st == EXR_OK)
        st = exr_out_write(o, &s->changes, 8);
    if (st == EXR_OK && n)
        st = exr_out_write(o, s->heap, n * sizeof *s->heap);
    if (st == EXR_OK && n)
        st = exr_out_write(o, s->key, n * sizeof *s->key);
    return st;
}

static int r_check(const exr_selector *b, size_t n, char *msg, size_t len);

static exr_status r_load(exr_selector *b, size_t n, struct exr_in *in)
{
    rank_sel *s = (rank_sel *)b;
    exr_status st = r_reserve(b, n ? n : 1);
    if (st != EXR_OK)
        return st;
    if ((st = exr_in_read(in, &s->max_prio, 8)) != EXR_OK ||
        (st = exr_in_read(in, &s->changes, 8)) != EXR_OK)
        return st;
    if (n && ((st = exr_in_read(in, s->heap, n * sizeof *s->heap)) != EXR_OK ||
              (st = exr_in_read(in, s->key, n * sizeof *s->key)) != EXR_OK))
        return st;
    s->n = n;
    for (size_t i = 0; i < n; i++)
        s->pos[i] = UINT32_MAX;
    for (size_t at = 0; at < n; at++) {
        uint32_t p = s->heap[at];
        if (p >= n || s->pos[p] != UINT32_MAX)
            return EXR_ECORRUPT; /* not a permutation */
        s->pos[p] = (uint32_t)at;
    }
    char msg[8];
    return r_check(b, n, msg, sizeof msg) ? EXR_ECORRUPT : EXR_OK;
}

static int r_check(const exr_selector *b, size_t n, char *msg, size_t len)
{
    const rank_sel *s = (const rank_sel *)b;
    if (!(s->max_prio >= 1.0) || !isfinite(s->max_prio)) {
        snprintf(msg, len, "rank selector: maximum so far is %g", s->max_prio);
        return 1;
    }
    if (s->n != n || s->changes >= (n > MIN_RESORT ? n : MIN_RESORT)) {
        snprintf(msg, len, "rank selector: %zu picks (buffer: %zu), %llu changes", s->n, n,
                 (unsigned long long)s->changes);
        return 1;
    }
    for (size_t at = 0; at < n; at++) {
        uint32_t p = s->heap[at];
        if (p >= n || s->pos[p] != at) {
            snprintf(msg, len, "rank selector: heap position %zu and pick %u disagree", at, p);
            return 1;
        }
        float k = s->key[p];
        if (!(k >= 0) || isinf(k)) {
            snprintf(msg, len, "rank selector: pick %u has priority %g", p, (double)k);
            return 1;
        }
        if (at > 0 && s->key[s->heap[(at - 1) / 2]] < k) {
            snprintf(msg, len, "rank selector: heap order broken at position %zu", at);
            return 1;
        }
    }
    return 0;
}

const exr_selector_vtable exr_sel_rank = {
    .name = "rank",
    .nparams = 2,
    .param_names = {"alpha", "beta"},
    .param_defaults = {0.7, 0.5},
    .prioritized = true,
    .create = r_create,
    .destroy = r_destroy,
    .param_ok = r_param_ok,
    .get_param = r_get_param,
    .settable_from = R_BETA,
    .set_param = r_set_param,
    .reserve = r_reserve,
    .add = r_add,
    .remove = r_remove,
    .replace = r_replace,
    .update = r_update,
    .update_many = r_update_many,
    .sample = r_sample,
    .weights = r_weights,
    .stats = r_stats,
    .stored = r_stored,
    .state_size = r_state_size,
    .save = r_save,
    .load = r_load,
    .check = r_check,
};
