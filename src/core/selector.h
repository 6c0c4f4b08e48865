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
#include <stdatomic.h>
#include <stdbool.h>

#include "exr.h"
#include "pick_table.h"
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
#define EXR_SETTLE_ALL SIZE_MAX
#define EXR_SETTLE_LOG (SIZE_MAX - 1)

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

    /* Room for n picks; after OK, add() up to n cannot fail. Called under
     * the exclusive lock without mu (a selector with sample_detached takes
     * it itself when it must grow). */
    exr_status (*reserve)(exr_selector *s, size_t n);
    /* A pick entered at index i with recorded priority prio (NaN: none). */
    void (*add)(exr_selector *s, size_t i, double prio);
    /* The pick at i leaves; the pick at last (>= i) moves into i. */
    void (*remove)(exr_selector *s, size_t i, size_t last);
    /* The pick at i leaves and a new pick takes its index, with recorded
     * priority prio (NaN: none), nothing else moving: a record call's new
     * pick in the place of a pick it evicted (buffer_picks.c, "places"). */
    void (*replace)(exr_selector *s, size_t i, double prio);
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
    /* Optional (NULL: replace() is used): the same for count replace()
     * calls in order, of the picks at i0, i0 + 1, ... */
    void (*replace_stored)(exr_selector *s, size_t i0, size_t count, const float *prio,
                           const float *stored);
    /* Optional (NULL: remove() is used): count remove() calls in order,
     * remove(i[k], last0 - k) (an evicted episode's picks). */
    void (*remove_many)(exr_selector *s, size_t count, const size_t *i, size_t last0);

    /* Optional, all or none (NULL: the selector is drawn only under the
     * storage lock): a selector that can be drawn without it
     * (docs/design.md, "A draw without the storage lock"). Once it has
     * been (detached), its add, add_stored, remove, remove_many, idents and
     * flush note what they would change (or, when a hold's notes fill up,
     * apply them holding mu: held); the notes are applied, in order, by
     * whoever next holds mu (settle, sample_detached, or any other entry
     * point, which settle first; update and update_many do not: settle
     * before them). So every entry point but those six needs mu, under the
     * exclusive lock too (exr_sel_lock). */
    /* The picks at i0, i0 + 1, ..., i0 + count - 1 are {first.slot,
     * first.pos + k}: one episode's, in position order (after add). */
    void (*idents)(exr_selector *s, size_t i0, size_t count, exr_pick first);
    /* The picks at 0 .. n - 1 are table[0..n), kept from now on (before the
     * first draw without the storage lock: exr_sel_start_detached; mu and
     * the storage lock held). EXR_ENOMEM leaves it as it was. */
    exr_status (*set_idents)(exr_selector *s, size_t n, const exr_pick *table);
    /* 0 if the picks it holds are table[0..n), else 1 with msg. */
    int (*check_idents)(const exr_selector *s, size_t n, const exr_pick *table, char *msg,
                        size_t msglen);
    /* How many notes of ended holds wait to be applied (storage lock held). */
    size_t (*log_mark)(exr_selector *s);
    /* Applies the first upto of them (mu held): EXR_SETTLE_LOG, all of
     * them; EXR_SETTLE_ALL, every note, a hold's own too (storage lock held
     * as well). */
    void (*settle)(exr_selector *s, size_t upto);
    /* sample_post() of what every ended hold left (mu held, the storage lock
     * maybe not), with ids[k] the pick that idx[k] stood for then; n is
     * not known: EXR_EEMPTY when the total is 0. count + extra draws: the
     * extra ones from a generator split off the selector's (exr_rng_split),
     * which advances by the count draws alone, as sample's draws advance
     * it: which path a draw takes changes none of the draws after it. */
    exr_status (*sample_detached)(exr_selector *s, size_t count, size_t extra, size_t *idx,
                                  exr_pick *ids, float *w, double *scratch, exr_wpost *post);
    /* Back to changes in place (mu and the storage lock held exclusively,
     * no hold's notes under way): every note applied, the picks no longer
     * kept, detached cleared. A later draw without the storage lock starts
     * again (exr_sel_start_detached). */
    void (*reattach)(exr_selector *s);
} exr_selector_vtable;

struct exr_selector {
    const exr_selector_vtable *vt;
    exr_rng rng;
    /* a draw or an update (buffer_batch.c); see sample_detached. On a line
     * of its own: record calls take it after their holds (exr.h, EXR_LINE);
     * the selector's kind allocates it with exr_line_calloc (mem.h) */
    EXR_LINE pthread_mutex_t mu;
    /* mu is held by the exclusive hold under way, which changes the
     * selector in place (sel_prioritized.c): written and read only by
     * the exclusive holder (false whenever the storage lock is not held
     * exclusively). exr_sel_lock takes mu unless so. */
    bool held;
    /* A draw or an update has run on it without the storage lock (set under
     * the shared lock and mu: exr_sel_start_detached): from then on an
     * exclusive holder notes its changes (or takes mu), instead of changing
     * the selector in place with the storage lock alone; cleared again
     * (reattach, by an exclusive holder with mu) once none has run for
     * EXR_REATTACH_HOLDS holds. */
    atomic_bool detached;
    /* The buffer's pick table, set (mu held) before each draw of get_batch;
     * NULL: none. sample() prefetches the 8-byte entry of each pick as it
     * draws it (exr_sel_prefetch): the batch reads those entries next, and
     * their misses then overlap the rest of the draw. */
    const void *entries;
    /* The buffer's count of exclusive holds at this selector's last draw
     * (buffer_batch.c; written under mu, read as a hint without it): a
     * draw or update that finds it unchanged has no writer beside it to
     * overlap, and keeps the storage lock (exr_sel_detach). */
    _Atomic uint64_t seen_seq;
    /* The buffer's count of exclusive holds at the selector's last draw or
     * update without the storage lock (written under mu, at each of them;
     * read by exclusive holders): a selector that none has been for
     * EXR_REATTACH_HOLDS holds goes back to changes in place (reattach). */
    _Atomic uint64_t detached_seq;
};

/* Exclusive holds without a draw or update that let go of the storage lock,
 * after which a detached selector is changed in place again: a writer alone
 * pays about a fifth more a record call for noting its changes (docs/design.md,
 * "A draw without the storage lock"), and starting again costs one copy of
 * the pick table. */
#define EXR_REATTACH_HOLDS 4096u
#ifdef EXR_DEBUG_LOCKS
extern uint64_t exr_reattach_holds; /* EXR_REATTACH_HOLDS; the stress test lowers it */
#define EXR_REATTACH_AFTER exr_reattach_holds
#else
#define EXR_REATTACH_AFTER ((uint64_t)EXR_REATTACH_HOLDS)
#endif

/* Prefetches (into L2) the pick-table entry of pick i, when s->entries is
 * set. Always inlined: GCC may delete calls of a function that only
 * prefetches (batch_copy.c). */
static inline __attribute__((always_inline)) void exr_sel_prefetch(const exr_selector *s, size_t i)
{
    if (s->entries)
        __builtin_prefetch((const char *)s->entries + 8 * i, 0, 2);
}

/* mu for a caller that holds the storage lock (exclusively or shared),
 * unless the exclusive hold under way has it already (held). */
static inline void exr_sel_lock(exr_selector *s)
{
    if (!s->held)
        pthread_mutex_lock(&s->mu);
}

static inline void exr_sel_unlock(exr_selector *s)
{
    if (!s->held)
        pthread_mutex_unlock(&s->mu);
}

/* Whether a draw or an update on s, by a caller holding the storage lock
 * shared, would let go of it for the selector's work: when s can
 * (sample_detached), another thread than this one did the last exclusive
 * hold (the caller's excl_owner: its own last writes need no overlap), and
 * an exclusive hold came since s was last drawn (seq, the buffer's count
 * of them, moved past seen_seq: a writer is at work beside it). A learner
 * alone keeps the lock, whose path is the cheaper one without a writer. */
static inline bool exr_sel_detach(const exr_selector *s, uint64_t excl_owner, uint64_t seq)
{
    return s->vt->sample_detached && excl_owner != exr_thread_id() &&
           atomic_load_explicit(&s->seen_seq, memory_order_relaxed) != seq;
}

/* Notes that s is drawn at the buffer's count of exclusive holds seq
 * (mu held); written only when it changes. */
static inline void exr_sel_seen(exr_selector *s, uint64_t seq)
{
    if (atomic_load_explicit(&s->seen_seq, memory_order_relaxed) != seq)
        atomic_store_explicit(&s->seen_seq, seq, memory_order_relaxed);
}

/* Before each such draw or update, at the buffer's count of exclusive
 * holds seq (mu and the storage lock held): noted as the last one; before
 * the first (or the first since s went back to changes in place), s keeps
 * the picks its leaves stand for from the table's n entries, and is marked
 * detached. false (nothing changed) if that cannot be allocated. */
static inline bool exr_sel_start_detached(exr_selector *s, size_t n, const exr_pick *table,
                                          uint64_t seq)
{
    if (atomic_load_explicit(&s->detached_seq, memory_order_relaxed) != seq)
        atomic_store_explicit(&s->detached_seq, seq, memory_order_relaxed);
    if (atomic_load_explicit(&s->detached, memory_order_relaxed))
        return true;
    if (s->vt->set_idents(s, n, table) != EXR_OK)
        return false;
    atomic_store_explicit(&s->detached, true, memory_order_relaxed);
    return true;
}

/* Selector kinds by their public number (PickSelectorClass). */
extern const exr_selector_vtable *const exr_selector_kinds[];
extern const int exr_selector_nkinds;
/* s's kind: its vtable's index in exr_selector_kinds (its public number). */
int exr_selector_kind(const exr_selector *s);

extern const exr_selector_vtable exr_sel_uniform;
extern const exr_selector_vtable exr_sel_prioritized;
extern const exr_selector_vtable exr_sel_rank;

#endif
