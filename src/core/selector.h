/*
 * selector.h - the pick-selector interface: a struct of function pointers.
 *
 *   buffer --(pick table index i)--> selector->vt->add/remove/update/sample
 *
 * A selector sees picks only by their index in the pick table, [0, n). The
 * buffer calls add() for each pick appended at index n (the picks a record
 * call enters, in table order; a selector's calls may come before the table
 * or the other selectors get the picks: each keeps only its own state) and
 * remove() when a pick leaves by swap-removal (the last pick moves into its
 * slot).
 * The buffer never switches on a selector's kind: a new selector is one new
 * file with one vtable, listed in exr_selector_kinds (selector.c).
 */
#ifndef EXR_SELECTOR_H
#define EXR_SELECTOR_H

#include <math.h>
#include <pthread.h>
#include <stdbool.h>

#include "exr.h"
#include "rng.h"

typedef struct exr_selector exr_selector;
struct exr_out;
struct exr_in;

/* What turns the values a sample_post() draw left in w[] into its weights,
 * with no lock held: fn (NULL: w[] holds the weights already) and the
 * selector's numbers it needs, copied under the lock. */
typedef struct exr_wpost {
    void (*fn)(const struct exr_wpost *p, size_t count, float *w);
    double lo, beta;
} exr_wpost;

#define EXR_SEL_MAXPARAMS 4

typedef struct {
    const char *name;                   /* "uniform", "prioritized" */
    int nparams;
    const char *param_names[EXR_SEL_MAXPARAMS];
    double param_defaults[EXR_SEL_MAXPARAMS];
    bool prioritized;                   /* keeps a priority per pick */

    /* Validates params (EXR_EINVAL naming nothing: the binding checks ranges
     * through param_ok first) and allocates room for n picks. */
    exr_status (*create)(exr_selector **out, const double *params, size_t n);
    void (*destroy)(exr_selector *s);
    /* 1 if value is allowed for parameter k. */
    int (*param_ok)(int k, double value);
    double (*get_param)(const exr_selector *s, int k);
    /* Only parameters marked settable (k >= settable_from) may be set. */
    int settable_from;
    void (*set_param)(exr_selector *s, int k, double value);

    /* Room for n picks; after OK, add() up to n cannot fail. */
    exr_status (*reserve)(exr_selector *s, size_t n);
    /* A pick entered at index i with recorded priority prio (NaN: none). */
    void (*add)(exr_selector *s, size_t i, double prio);
    /* The pick at i leaves; the pick at last (>= i) moves into i. */
    void (*remove)(exr_selector *s, size_t i, size_t last);
    /* Optional (NULL: nothing to do): completes what add() and remove()
     * may have left pending (sel_prioritized.c: the sum tree above written
     * leaves). The buffer calls it before it lets go of the exclusive lock;
     * every other entry point works as if it had been called. */
    void (*flush)(exr_selector *s);
    /* A new priority (finite, >= 0) for the pick at i. */
    void (*update)(exr_selector *s, size_t i, double prio);
    /* New priorities prio[k] for the picks at idx[k], k < count, as count
     * update() calls in order would leave them. scratch holds count size_t. */
    void (*update_many)(exr_selector *s, size_t count, const size_t *idx, const double *prio,
                        size_t *scratch);
    /* Optional (NULL: none): the exponent a of the stored form p ** a
     * (powa.h) of this selector's priorities, fixed for its life; and
     * update_many() given stored[k] = exr_pow_leaf(prio[k], a) as well,
     * computed by the caller before it took the lock. */
    double (*stored_power)(const exr_selector *s);
    void (*update_many_stored)(exr_selector *s, size_t count, const size_t *idx,
                               const double *prio, const float *stored, size_t *scratch);
    /* count draws from n picks into idx[], weights into w[]. scratch holds
     * count doubles. EXR_EEMPTY when nothing can be drawn. */
    exr_status (*sample)(exr_selector *s, size_t n, size_t count, size_t *idx, float *w,
                         double *scratch);
    /* Optional (NULL: sample() is used): sample(), except that w[] may be
     * left holding values that post->fn, called later with no lock held,
     * turns into the weights sample() gives (post->fn = NULL: they are
     * weights already). Draws of one lock hold get the same *post. */
    exr_status (*sample_post)(exr_selector *s, size_t n, size_t count, size_t *idx, float *w,
                              double *scratch, exr_wpost *post);
    /* Weights of given picks, as sample() would give them. */
    void (*weights)(const exr_selector *s, size_t n, size_t count, const size_t *idx, float *w);
    /* Over n picks: *total = sum of the draw weights (p^alpha; n for uniform),
     * *min_pos = the smallest positive one (+inf if none; 1 for uniform). */
    void (*stats)(const exr_selector *s, size_t n, double *total, double *min_pos);
    /* The stored p^alpha of pick i (NaN for selectors without priorities). */
    double (*stored)(const exr_selector *s, size_t i);
    /* Bytes save() writes for n picks; save() writes them; load() restores
     * them into a selector just created with room for n picks, returning
     * EXR_ECORRUPT for any value save() could not have written. */
    uint64_t (*state_size)(const exr_selector *s, size_t n);
    exr_status (*save)(const exr_selector *s, size_t n, struct exr_out *o);
    exr_status (*load)(exr_selector *s, size_t n, struct exr_in *in);
    /* 0 if consistent for n picks, else 1 with msg. */
    int (*check)(const exr_selector *s, size_t n, char *msg, size_t msglen);
    /* For a record call's many picks at once (buffer_picks.c): */
    /* Optional (NULL: add() is used): count add() calls in order, of the
     * picks at i0, i0 + 1, ... with priorities prio[k], given the stored
     * forms stored[k] = exr_pow_leaf(prio[k], a) as well (a = stored_power(),
     * above), computed by the record call before it took the lock; where
     * stored[k] is NaN (prio[k] NaN, or no form brought), add() itself. */
    void (*add_stored)(exr_selector *s, size_t i0, size_t count, const float *prio,
                       const float *stored);
    /* Optional (NULL: remove() is used): count remove() calls in order,
     * remove(i[k], last0 - k) (an evicted episode's picks). */
    void (*remove_many)(exr_selector *s, size_t count, const size_t *i, size_t last0);
} exr_selector_vtable;

struct exr_selector {
    const exr_selector_vtable *vt;
    exr_rng rng;
    pthread_mutex_t mu; /* a draw or an update under the shared lock (buffer_batch.c) */
    /* The buffer's pick table, set (mu held) before each draw of get_batch;
     * NULL: none. sample() prefetches the 8-byte entry of each pick as it
     * draws it (exr_sel_prefetch): the batch reads those entries next, and
     * their misses then overlap the rest of the draw. */
    const void *entries;
};

/* Prefetches (into L2) the pick-table entry of pick i, when s->entries is
 * set. Always inlined: GCC may delete calls of a function that only
 * prefetches (batch_copy.c). */
static inline __attribute__((always_inline)) void exr_sel_prefetch(const exr_selector *s, size_t i)
{
    if (s->entries)
        __builtin_prefetch((const char *)s->entries + 8 * i, 0, 2);
}

/* Selector kinds by their public number (PickSelectorClass). */
extern const exr_selector_vtable *const exr_selector_kinds[];
extern const int exr_selector_nkinds;

extern const exr_selector_vtable exr_sel_uniform;
extern const exr_selector_vtable exr_sel_prioritized;
extern const exr_selector_vtable exr_sel_rank;

#endif
