#include "sumtree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAN 8

static void *alloc_line(size_t bytes)
{
    /* aligned_alloc wants a multiple of the alignment. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    return p;
}

void exr_sumtree_init(exr_sumtree *t) { memset(t, 0, sizeof *t); }

static void free_levels(float *leaf, double **sum, float **mn, int nlev)
{
    free(leaf);
    for (int k = 0; k < nlev; k++) {
        free(sum[k]);
        free(mn[k]);
    }
}

void exr_sumtree_free(exr_sumtree *t)
{
    free_levels(t->leaf, t->sum, t->mn, t->nlev);
    exr_sumtree_init(t);
}

static void node_from_leaves(const float *c, double *s, float *m)
{
    double acc = 0;
    float lo = INFINITY;
    for (int i = 0; i < FAN; i++) {
        acc += c[i];
        if (c[i] > 0 && c[i] < lo)
            lo = c[i];
    }
    *s = acc;
    *m = lo;
}

static void node_from_nodes(const double *cs, const float *cm, double *s, float *m)
{
    double acc = 0;
    float lo = INFINITY;
    for (int i = 0; i < FAN; i++) {
        acc += cs[i];
        if (cm[i] < lo)
            lo = cm[i];
    }
    *s = acc;
    *m = lo;
}

void exr_sumtree_rebuild(exr_sumtree *t)
{
    for (size_t j = 0; j < t->len[0]; j++)
        node_from_leaves(t->leaf + FAN * j, &t->sum[0][j], &t->mn[0][j]);
    for (int k = 1; k < t->nlev; k++)
        for (size_t j = 0; j < t->len[k]; j++)
            node_from_nodes(t->sum[k - 1] + FAN * j, t->mn[k - 1] + FAN * j, &t->sum[k][j],
                            &t->mn[k][j]);
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
    int nlev = 0;
    size_t below = cap;
    do {
        if (nlev == EXR_ST_MAXLEV)
            return EXR_EOVERFLOW;
        below = (below + FAN - 1) / FAN;
        len[nlev++] = below;
    } while (below > 1);

    float *leaf = alloc_line(cap * sizeof(float));
    double *sum[EXR_ST_MAXLEV] = {0};
    float *mn[EXR_ST_MAXLEV] = {0};
    int ok = leaf != NULL;
    for (int k = 0; ok && k < nlev; k++) {
        /* a level is read 8 children at a time by its parent: pad it */
        size_t slots = k + 1 < nlev ? FAN * len[k + 1] : 1;
        sum[k] = alloc_line(slots * sizeof(double));
        mn[k] = alloc_line(slots * sizeof(float));
        ok = sum[k] && mn[k];
        if (ok) {
            memset(sum[k], 0, slots * sizeof(double));
            for (size_t j = 0; j < slots; j++)
                mn[k][j] = INFINITY;
        }
    }
    if (!ok) {
        free_levels(leaf, sum, mn, nlev);
        return EXR_ENOMEM;
    }
    memset(leaf, 0, cap * sizeof(float));
    if (t->cap)
        memcpy(leaf, t->leaf, t->cap * sizeof(float));
    free_levels(t->leaf, t->sum, t->mn, t->nlev);
    t->cap = cap;
    t->nlev = nlev;
    t->leaf = leaf;
    for (int k = 0; k < EXR_ST_MAXLEV; k++) {
        t->sum[k] = k < nlev ? sum[k] : NULL;
        t->mn[k] = k < nlev ? mn[k] : NULL;
        t->len[k] = k < nlev ? len[k] : 0;
    }
    exr_sumtree_rebuild(t);
    return EXR_OK;
}

void exr_sumtree_set(exr_sumtree *t, size_t i, float v)
{
    t->leaf[i] = v;
    size_t j = i / FAN;
    node_from_leaves(t->leaf + FAN * j, &t->sum[0][j], &t->mn[0][j]);
    for (int k = 1; k < t->nlev; k++) {
        j /= FAN;
        node_from_nodes(t->sum[k - 1] + FAN * j, t->mn[k - 1] + FAN * j, &t->sum[k][j],
                        &t->mn[k][j]);
    }
}

void exr_sumtree_set_many(exr_sumtree *t, size_t count, const size_t *idx, const float *v,
                          size_t *node)
{
    enum { D = 8 };
    for (size_t k = 0; k < count && k < D; k++)
        __builtin_prefetch(t->leaf + idx[k], 1);
    for (size_t k = 0; k < count; k++) {
        if (k + D < count)
            __builtin_prefetch(t->leaf + idx[k + D], 1);
        t->leaf[idx[k]] = v[k]; /* in order: the last value for a leaf wins */
        node[k] = idx[k] / FAN;
    }
    /* Each level once for the whole batch: a node is recomputed from its 8
     * children, all already final, so duplicates and order do not matter. */
    for (size_t k = 0; k < count; k++) {
        if (k + D < count)
            __builtin_prefetch(t->sum[0] + node[k + D], 1);
        node_from_leaves(t->leaf + FAN * node[k], &t->sum[0][node[k]], &t->mn[0][node[k]]);
    }
    for (int lv = 1; lv < t->nlev; lv++) {
        for (size_t k = 0; k < count; k++)
            node[k] /= FAN;
        for (size_t k = 0; k < count; k++) {
            if (k + D < count)
                __builtin_prefetch(t->sum[lv] + node[k + D], 1);
            size_t j = node[k];
            node_from_nodes(t->sum[lv - 1] + FAN * j, t->mn[lv - 1] + FAN * j, &t->sum[lv][j],
                            &t->mn[lv][j]);
        }
    }
}

double exr_sumtree_total(const exr_sumtree *t) { return t->nlev ? t->sum[t->nlev - 1][0] : 0.0; }

float exr_sumtree_min(const exr_sumtree *t) { return t->nlev ? t->mn[t->nlev - 1][0] : INFINITY; }

/* Which of 8 children holds offset *x; *x becomes the offset inside it.
 * Branch-free: the child is the number of prefix sums <= x (prefix sums are
 * summed in the same order as the parent's, so x < parent means a hit), and
 * a zero child can never be it (its prefix equals the one before). Rounding
 * can leave x at or past the end only when the parent's sum was rounded
 * differently: then the last positive child is taken. */
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

void exr_sumtree_sample(const exr_sumtree *t, exr_rng *r, size_t count, size_t *out,
                        double *u)
{
    double total = exr_sumtree_total(t);
    for (size_t b = 0; b < count; b++) {
        u[b] = exr_rng_double(r) * total;
        out[b] = 0;
    }
    /* One level for the whole batch at a time: the line each draw needs next
     * is prefetched while the other draws are worked on. */
    for (int k = t->nlev - 1; k >= 1; k--) {
        const double *ch = t->sum[k - 1];
        for (size_t b = 0; b < count; b++) {
            const double *c = ch + FAN * out[b];
            double x = u[b];
            int s;
            CHOOSE(c, x, s);
            size_t j = FAN * out[b] + (size_t)s;
            out[b] = j;
            u[b] = x;
            if (k >= 2)
                __builtin_prefetch(t->sum[k - 2] + FAN * j);
            else
                __builtin_prefetch(t->leaf + FAN * j);
        }
    }
    for (size_t b = 0; b < count; b++) {
        const float *c = t->leaf + FAN * out[b];
        double x = u[b];
        int s;
        CHOOSE(c, x, s);
        out[b] = FAN * out[b] + (size_t)s;
    }
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
            double s;
            float m;
            if (k == 0)
                node_from_leaves(t->leaf + FAN * j, &s, &m);
            else
                node_from_nodes(t->sum[k - 1] + FAN * j, t->mn[k - 1] + FAN * j, &s, &m);
            if (fabs(s - t->sum[k][j]) > 1e-9 * fabs(s) || m != t->mn[k][j]) {
                snprintf(msg, msglen, "sum tree: node %zu of level %d holds (%g, %g), children give (%g, %g)",
                         j, k, t->sum[k][j], (double)t->mn[k][j], s, (double)m);
                return 1;
            }
        }
    }
    return 0;
}
