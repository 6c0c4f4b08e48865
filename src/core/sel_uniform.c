/*
 * sel_uniform.c - every pick with probability 1/n, weights 1. No per-pick
 * state: add, remove and update cost nothing; a draw is one generator call.
 */
#include <stdlib.h>

#include "selector.h"
#include "mem.h"

static exr_status u_create(exr_selector **out, const double *params, size_t n)
{
    (void)params;
    (void)n;
    exr_selector *s = exr_line_calloc(sizeof *s);
    if (!s)
        return EXR_ENOMEM;
    s->vt = &exr_sel_uniform;
    *out = s;
    return EXR_OK;
}

static void u_destroy(exr_selector *s) { free(s); }
static int u_param_ok(int k, double v) { (void)k; (void)v; return 0; }
static double u_get_param(const exr_selector *s, int k) { (void)s; (void)k; return NAN; }
static void u_set_param(exr_selector *s, int k, double v) { (void)s; (void)k; (void)v; }
static exr_status u_reserve(exr_selector *s, size_t n) { (void)s; (void)n; return EXR_OK; }
static void u_add(exr_selector *s, size_t i, double p) { (void)s; (void)i; (void)p; }
static void u_remove(exr_selector *s, size_t i, size_t last) { (void)s; (void)i; (void)last; }
static void u_update(exr_selector *s, size_t i, double p) { (void)s; (void)i; (void)p; }

static void u_update_many(exr_selector *s, size_t count, const size_t *idx, const double *prio,
                          size_t *scratch)
{
    (void)s; (void)count; (void)idx; (void)prio; (void)scratch;
}

static exr_status u_sample(exr_selector *s, size_t n, size_t count, size_t *idx, float *w,
                           double *scratch)
{
    (void)scratch;
    if (n == 0)
        return EXR_EEMPTY;
    /* the generator's state in a local: idx[] (size_t) may alias its
     * uint64_t words, which would keep it in memory through the loop */
    exr_rng g = s->rng;
    for (size_t b = 0; b < count; b++) {
        idx[b] = (size_t)exr_rng_below(&g, n);
        exr_sel_prefetch(s, idx[b]);
        w[b] = 1.0f;
    }
    s->rng = g;
    return EXR_OK;
}

static void u_weights(const exr_selector *s, size_t n, size_t count, const size_t *idx, float *w)
{
    (void)s;
    (void)n;
    (void)idx;
    for (size_t b = 0; b < count; b++)
        w[b] = 1.0f;
}

static void u_stats(const exr_selector *s, size_t n, double *total, double *min_pos)
{
    (void)s;
    *total = (double)n;
    *min_pos = n ? 1.0 : INFINITY;
}

static double u_stored(const exr_selector *s, size_t i) { (void)s; (void)i; return NAN; }

static uint64_t u_state_size(const exr_selector *s, size_t n)
{
    (void)s;
    (void)n;
    return 0;
}

static exr_status u_save(const exr_selector *s, size_t n, struct exr_out *o)
{
    (void)s; (void)n; (void)o;
    return EXR_OK;
}

static exr_status u_load(exr_selector *s, size_t n, struct exr_in *in)
{
    (void)s; (void)n; (void)in;
    return EXR_OK;
}

static int u_check(const exr_selector *s, size_t n, char *msg, size_t len)
{
    (void)s; (void)n; (void)msg; (void)len;
    return 0;
}

const exr_selector_vtable exr_sel_uniform = {
    .name = "uniform",
    .nparams = 0,
    .prioritized = false,
    .create = u_create,
    .destroy = u_destroy,
    .param_ok = u_param_ok,
    .get_param = u_get_param,
    .settable_from = 0,
    .set_param = u_set_param,
    .reserve = u_reserve,
    .add = u_add,
    .remove = u_remove,
    .replace = u_add, /* nothing kept per pick */
    .update = u_update,
    .update_many = u_update_many,
    .sample = u_sample,
    .weights = u_weights,
    .stats = u_stats,
    .stored = u_stored,
    .state_size = u_state_size,
    .save = u_save,
    .load = u_load,
    .check = u_check,
};
