/*
 * test_selectors.c - every selector kind through its vtable alone, without a
 * buffer: add, swap-removal, update, update_many, sample, weights, stats and
 * check. A new selector listed in exr_selector_kinds is covered by adding
 * nothing here. Built and run under ASan+UBSan by `make ctest`.
 */
#define _DEFAULT_SOURCE
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "selector.h"

#include "check.h"

static char g_msg[256];

enum { N = 300, B = 4000 };

static exr_selector *make(const exr_selector_vtable *vt, size_t room)
{
    exr_selector *s = NULL;
    if (vt->create(&s, vt->param_defaults, room) != EXR_OK)
        return NULL;
    exr_rng_seed(&s->rng, 7, 0);
    return s;
}

/* Every selector made with its defaults draws only picks that exist, gives
 * weights in (0, 1] for a drawn pick, and weights() agrees with sample(). */
static void sample_is_consistent(const exr_selector_vtable *vt)
{
    exr_selector *s = make(vt, N);
    size_t *idx = malloc(B * sizeof *idx);
    float *w = malloc(B * sizeof *w), *w2 = malloc(B * sizeof *w2);
    double *scratch = malloc(B * sizeof *scratch);
    CHECK(s && idx && w && w2 && scratch);
    CHECK(vt->sample(s, 0, 1, idx, w, scratch) == EXR_EEMPTY);
    CHECK(vt->reserve(s, N) == EXR_OK);
    for (size_t i = 0; i < N; i++)
        vt->add(s, i, i % 7 == 0 ? NAN : 0.5 + (double)(i % 11));
    CHECK(vt->check(s, N, g_msg, sizeof g_msg) == 0);
    CHECK(vt->sample(s, N, B, idx, w, scratch) == EXR_OK);
    for (size_t b = 0; b < B; b++) {
        CHECK(idx[b] < N);
        CHECK(w[b] > 0.0f && w[b] <= 1.0f);
    }
    vt->weights(s, N, B, idx, w2);
    for (size_t b = 0; b < B; b++)
        CHECK(fabsf(w[b] - w2[b]) <= 1e-6f * w[b]);
    double total, min_pos;
    vt->stats(s, N, &total, &min_pos);
    CHECK(total > 0 && min_pos > 0 && min_pos <= total);
done:
    if (s)
        vt->destroy(s);
    free(idx);
    free(w);
    free(w2);
    free(scratch);
}

/* PER's weights are w_i = (N P(i))^-beta / max w, so with beta = 1 a pick's
 * draw probability is proportional to 1 / w_i: draw frequencies must follow
 * the weights that weights() reports, for every kind (a selector without a
 * settable beta has weights 1: uniform). Pick 0 has priority 0. */
static void frequencies_follow_weights(const exr_selector_vtable *vt)
{
    enum { n = 8, draws = 200000 };
    exr_selector *s = make(vt, n);
    size_t *idx = malloc(draws * sizeof *idx);
    float *w = malloc(draws * sizeof *w);
    double *scratch = malloc(draws * sizeof *scratch);
    CHECK(s && idx && w && scratch);
    for (int k = vt->settable_from; k < vt->nparams; k++)
        if (strcmp(vt->param_names[k], "beta") == 0)
            vt->set_param(s, k, 1.0);
    CHECK(vt->reserve(s, n) == EXR_OK);
    for (size_t i = 0; i < n; i++)
        vt->add(s, i, (double)(i * i));
    CHECK(vt->sample(s, n, draws, idx, w, scratch) == EXR_OK);
    long count[n] = {0};
    for (size_t b = 0; b < draws; b++)
        count[idx[b]]++;
    size_t all[n];
    float wt[n];
    double inv_sum = 0;
    for (size_t i = 0; i < n; i++)
        all[i] = i;
    vt->weights(s, n, n, all, wt);
    for (size_t i = 0; i < n; i++)
        inv_sum += 1.0 / wt[i];
    for (size_t i = 0; i < n; i++) {
        double expect = draws * (1.0 / wt[i]) / inv_sum;
        /* five standard deviations of a binomial count */
        CHECK(fabs((double)count[i] - expect) <= 5.0 * sqrt(expect) + 1.0);
    }
done:
    if (s)
        vt->destroy(s);
    free(idx);
    free(w);
    free(scratch);
}

/* remove(i, last) moves the last pick's state into i; update and update_many
 * agree; nothing can be drawn exactly when the draw weights sum to zero. */
static void remove_and_update(const exr_selector_vtable *vt)
{
    enum { n = 64 };
    exr_selector *s = make(vt, n), *t = make(vt, n);
    size_t idx[n], scratch_idx[n];
    double prio[n], stored_before[n];
    CHECK(s && t);
    CHECK(vt->reserve(s, n) == EXR_OK && vt->reserve(t, n) == EXR_OK);
    for (size_t i = 0; i < n; i++) {
        vt->add(s, i, 1.0 + (double)i);
        vt->add(t, i, 1.0 + (double)i);
    }
    for (size_t i = 0; i < n; i++)
        stored_before[i] = vt->stored(s, i);
    /* remove pick 5: pick n-1 takes its place */
    vt->remove(s, 5, n - 1);
    CHECK(vt->check(s, n - 1, g_msg, sizeof g_msg) == 0);
    if (!isnan(stored_before[n - 1]))
        CHECK(vt->stored(s, 5) == stored_before[n - 1]);
    /* remove the last pick itself */
    vt->remove(s, n - 2, n - 2);
    CHECK(vt->check(s, n - 2, g_msg, sizeof g_msg) == 0);

    /* update_many == the same update() calls in order, duplicates included */
    for (size_t k = 0; k < n; k++) {
        idx[k] = (k * 7) % 13;
        prio[k] = (double)(k % 5);
    }
    vt->update_many(t, n, idx, prio, scratch_idx);
    exr_selector *u = make(vt, n);
    CHECK(u && vt->reserve(u, n) == EXR_OK);
    for (size_t i = 0; i < n; i++)
        vt->add(u, i, 1.0 + (double)i);
    for (size_t k = 0; k < n; k++)
        vt->update(u, idx[k], prio[k]);
    for (size_t i = 0; i < n; i++) {
        double a = vt->stored(t, i), b = vt->stored(u, i);
        CHECK((isnan(a) && isnan(b)) || a == b);
    }
    CHECK(vt->check(t, n, g_msg, sizeof g_msg) == 0);
    vt->destroy(u);

    /* nothing to draw exactly when the draw weights sum to zero */
    for (size_t i = 0; i < n; i++)
        vt->update(t, i, 0.0);
    {
        double total, min_pos;
        size_t out[1];
        float w[1];
        double scr[1];
        vt->stats(t, n, &total, &min_pos);
        CHECK((vt->sample(t, n, 1, out, w, scr) == EXR_EEMPTY) == (total == 0));
    }
done:
    if (s)
        vt->destroy(s);
    if (t)
        vt->destroy(t);
}

/* Parameters: defaults are allowed, settable ones can be set and read back,
 * create() refuses what param_ok refuses. */
static void parameters(const exr_selector_vtable *vt)
{
    exr_selector *s = make(vt, 1);
    CHECK(s);
    CHECK(vt->nparams >= 0 && vt->nparams <= EXR_SEL_MAXPARAMS);
    for (int k = 0; k < vt->nparams; k++) {
        CHECK(vt->param_names[k] != NULL);
        CHECK(vt->param_ok(k, vt->param_defaults[k]));
        CHECK(vt->get_param(s, k) == vt->param_defaults[k]);
        CHECK(!vt->param_ok(k, NAN));
        double bad[EXR_SEL_MAXPARAMS];
        memcpy(bad, vt->param_defaults, sizeof bad);
        bad[k] = NAN;
        exr_selector *x = NULL;
        CHECK(vt->create(&x, bad, 1) == EXR_EINVAL && x == NULL);
        if (k >= vt->settable_from) {
            vt->set_param(s, k, vt->param_defaults[k] + 0.25);
            CHECK(vt->get_param(s, k) == vt->param_defaults[k] + 0.25);
        }
    }
done:
    if (s)
        vt->destroy(s);
}

int main(void)
{
    struct {
        const char *name;
        void (*fn)(const exr_selector_vtable *);
    } tests[] = {
        {"sample_is_consistent", sample_is_consistent},
        {"frequencies_follow_weights", frequencies_follow_weights},
        {"remove_and_update", remove_and_update},
        {"parameters", parameters},
    };
    int n = (int)(sizeof tests / sizeof tests[0]);
    for (int k = 0; k < exr_selector_nkinds; k++) {
        const exr_selector_vtable *vt = exr_selector_kinds[k];
        for (int i = 0; i < n; i++) {
            int before = g_failed_checks;
            tests[i].fn(vt);
            check_report(before, vt->name, tests[i].name);
        }
    }
    return check_summary();
}
