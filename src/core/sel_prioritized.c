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
 *
 * It can be drawn and updated without the storage lock, under its mu
 * alone (selector.h, sample_detached; docs/design.md, "A draw without the
 * storage lock"): then each leaf also knows its pick (8 bytes), and record
 * calls note their changes for whoever holds mu next.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "codec.h"
#include "pick_table.h"
#include "powa.h"
#include "selector.h"
#include "mem.h"
#include "sumtree.h"
#include "timing.h"

enum { P_ALPHA = 0, P_BETA = 1 };

/* Picks entered but whose p^alpha is not computed yet (t_add): converted
 * PENDING at a time, sixteen per step with AVX2, instead of one by one. */
#define PENDING 128

/* The deferred changes (docs/design.md, "A draw without the storage
 * lock"): what add, add_stored, remove, remove_many, idents and flush
 * would do to the tree, as entries applied later under mu in the same
 * order, by the same functions (t_*). A run's head entry says how many
 * picks follow it, packed as 32-bit words in the entries after it: two
 * words a pick for adds (the priority and its stored form, as float), one
 * for removals (the index); L_ID's op carries a count of picks in its
 * high bits, the picks (x, y), (x, y + 1), ... of one episode. */
enum { L_ADD = 1, L_ADDS_RUN, L_REM, L_REMS_RUN, L_ID, L_FLUSH };
typedef struct {
    uint32_t op, i, x, y;
} lent;
#define HOLD 1024
#define LOG 8192

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
    /* The pick each leaf stands for (ident_cap >= tree.cap entries): what
     * a draw made without the storage lock returns (sample_detached). Kept
     * only from the first such draw on (set_idents; NULL before) until the
     * selector goes back to changes in place (p_reattach): 8 bytes a leaf
     * that a selector only drawn under the lock does not pay. */
    exr_pick *ident;
    size_t ident_cap;
    /* The selector's changes of the exclusive hold under way, when it
     * notes them (noting; base.held: it applies them to the tree as they
     * come, holding mu): only its holder touches them (HOLD entries before
     * it applies them itself). */
    EXR_LINE bool noting;
    size_t hold_n;
    lent hold[HOLD];
    /* The changes of ended holds not yet applied, in order (log_mu; LOG
     * entries, allocated at the first hold that needs it). */
    EXR_LINE pthread_mutex_t log_mu;
    lent *log;
    size_t log_n;
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

/* ident with as many entries as the tree has leaf slots. */
static exr_status ident_fit(prio_sel *s)
{
    exr_pick *v = realloc(s->ident, s->tree.cap * sizeof *v);
    if (!v)
        return EXR_ENOMEM;
    s->ident = v;
    s->ident_cap = s->tree.cap;
    return EXR_OK;
}

static exr_status p_create(exr_selector **out, const double *params, size_t n)
{
    if (!p_param_ok(P_ALPHA, params[P_ALPHA]) || !p_param_ok(P_BETA, params[P_BETA]))
        return EXR_EINVAL;
    prio_sel *s = exr_line_calloc(sizeof *s);
    if (!s)
        return EXR_ENOMEM;
    s->base.vt = &exr_sel_prioritized;
    s->alpha = params[P_ALPHA];
    s->beta = params[P_BETA];
    s->max_prio = 1.0;
    exr_sumtree_init(&s->tree);
    exr_status st = exr_sumtree_reserve(&s->tree, n ? n : 1);
    if (st == EXR_OK && pthread_mutex_init(&s->log_mu, NULL) != 0) {
        exr_sumtree_free(&s->tree);
        st = EXR_ENOMEM;
    }
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
    pthread_mutex_destroy(&s->log_mu);
    free(s->log);
    free(s->ident);
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

static void settle_all(const prio_sel *cs);

/* Under the exclusive lock, without mu: only growing (the tree is rebuilt
 * from its leaves, every note applied first) needs it. Most calls have
 * room already, and then wait for no draw. */
static exr_status p_reserve(exr_selector *b, size_t n)
{
    prio_sel *s = (prio_sel *)b;
    if (n <= s->tree.cap && (!s->ident || n <= s->ident_cap))
        return EXR_OK;
    if (!b->held)
        pthread_mutex_lock(&b->mu);
    settle_all(s);
    exr_status st = exr_sumtree_reserve(&s->tree, n);
    if (st == EXR_OK && s->ident)
        st = ident_fit(s);
    if (!b->held)
        pthread_mutex_unlock(&b->mu);
    return st;
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


/* Room for one add or remove: the pending adds (each one more dirty node
 * when materialized) and the step's own two leaves fit the tree's dirty
 * list, so exr_sumtree_put never flushes over a pending (NaN) leaf. */
static void make_room(prio_sel *s)
{
    if (s->tree.ndirty + s->npend + 2 > EXR_ST_MAXDIRTY || s->npend == PENDING)
        sync(s);
}

/* New picks at i0 .. i0 + count - 1: where one takes the place of a pick
 * that left (selector.h, replace) with its add still pending, that add is
 * dropped (else it would write the old pick's leaf over the new one's). */
static void drop_pending_at(prio_sel *s, size_t i0, size_t count)
{
    for (size_t i = i0; s->npend && i < i0 + count; i++) {
        float v = exr_sumtree_get(&s->tree, i);
        if (isnan(v))
            s->pidx[pend_slot(v)] = SIZE_MAX;
    }
}

static void t_add(prio_sel *s, size_t i, double prio)
{
    make_room(s);
    drop_pending_at(s, i, 1);
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

/* t_add for each pick, those with their leaf computed already writing it
 * at once instead of leaving it pending. */
static void t_add_stored(prio_sel *s, size_t i0, size_t count, const float *prio,
                         const float *stored)
{
    drop_pending_at(s, i0, count);
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
            t_add(s, i0 + k, prio[k]);
            continue;
        }
        make_room(s);
        if (prio[k] > s->max_prio)
            s->max_prio = prio[k];
        exr_sumtree_put(&s->tree, i0 + k, stored[k]);
    }
}

static void t_remove(prio_sel *s, size_t i, size_t last)
{
    if (s->ident)
        s->ident[i] = s->ident[last];
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
/* The removals' leaves and idents are read and written at random: their
 * lines are asked for first, so that their misses overlap. */
static void t_remove_many(prio_sel *s, size_t count, const size_t *i, size_t last0)
{
    for (size_t k = 0; s->ident && k < count; k++) {
        __builtin_prefetch(&s->ident[i[k]], 1);
        __builtin_prefetch(&s->tree.leaf[i[k]], 1);
    }
    if (s->npend || s->tree.ndirty + 2 * count + 2 > EXR_ST_MAXDIRTY) {
        for (size_t k = 0; k < count; k++)
            t_remove(s, i[k], last0 - k);
        return;
    }
    exr_sumtree *t = &s->tree;
    for (size_t k = 0; k < count; k++) {
        size_t last = last0 - k;
        if (s->ident)
            s->ident[i[k]] = s->ident[last];
        if (i[k] != last)
            exr_sumtree_put(t, i[k], exr_sumtree_get(t, last));
        exr_sumtree_put(t, last, 0.0f);
    }
}

/* The deferred changes. Entries of a run follow its head: */
#define RUN 64

/* The entries a run of n picks takes after its head, w words a pick. */
static size_t run_entries(size_t n, size_t w) { return (n * w + 3) / 4; }

static void replay_adds(prio_sel *s, const lent *head, const lent *e)
{
    float prio[RUN], stored[RUN];
    const unsigned char *d = (const unsigned char *)e;
    for (size_t k = 0; k < head->x; k++) {
        memcpy(&prio[k], d + 8 * k, sizeof(float));
        memcpy(&stored[k], d + 8 * k + 4, sizeof(float));
    }
    t_add_stored(s, head->i, head->x, prio, stored);
}

static void replay_removes(prio_sel *s, const lent *head, const lent *e)
{
    size_t gone[RUN];
    const unsigned char *d = (const unsigned char *)e;
    for (size_t k = 0; k < head->x; k++) {
        uint32_t w;
        memcpy(&w, d + 4 * k, sizeof w);
        gone[k] = w;
    }
    t_remove_many(s, head->x, gone, head->y);
}

/* Applies the changes e[0..n), in order. mu held. */
static void replay(prio_sel *s, const lent *e, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        const lent *x = &e[k];
        double p;
        uint64_t u = (uint64_t)x->y << 32 | x->x;
        switch (x->op & 0xff) {
        case L_ADD:
            memcpy(&p, &u, sizeof p);
            t_add(s, x->i, p);
            break;
        case L_ADDS_RUN: {
            EXR_TM_NOW(t0);
            replay_adds(s, x, x + 1);
            EXR_TM_SINCE(EXR_TM_NOTES_ADD, t0);
            k += run_entries(x->x, 2);
            break;
        }
        case L_REM:
            t_remove(s, x->i, x->x);
            break;
        case L_REMS_RUN: {
            EXR_TM_NOW(t0);
            replay_removes(s, x, x + 1);
            EXR_TM_SINCE(EXR_TM_NOTES_REM, t0);
            k += run_entries(x->x, 1);
            break;
        }
        case L_ID: /* noted only when ident is kept */
            for (uint32_t j = 0; j < x->op >> 8; j++)
                s->ident[x->i + j] = (exr_pick){x->x, x->y + j};
            break;
        default: { /* L_FLUSH: where the hold let go of the storage lock */
            EXR_TM_NOW(t0);
            sync(s);
            EXR_TM_SINCE(EXR_TM_NOTES_FLUSH, t0);
        }
        }
    }
}

/* Applies the log's first upto entries (all of them, if fewer). mu held.
 * Ended holds append after log_n meanwhile, which this does not read. */
static void apply_log(prio_sel *s, size_t upto)
{
    pthread_mutex_lock(&s->log_mu);
    size_t n = s->log_n < upto ? s->log_n : upto;
    pthread_mutex_unlock(&s->log_mu);
    if (!n)
        return;
    replay(s, s->log, n);
    pthread_mutex_lock(&s->log_mu);
    memmove(s->log, s->log + n, (s->log_n - n) * sizeof *s->log);
    s->log_n -= n;
    pthread_mutex_unlock(&s->log_mu);
}

/* Every change made so far applied: the log's, then the hold's own. mu
 * held, and the storage lock (shared: no hold is under way; exclusive:
 * the hold is the caller's). */
static void settle_all(const prio_sel *cs)
{
    prio_sel *s = (prio_sel *)cs;
    apply_log(s, SIZE_MAX);
    replay(s, s->hold, s->hold_n);
    s->hold_n = 0;
    sync(s);
}

/* The hold's changes go straight to the tree from now on: mu has been
 * taken (and is kept until flush), and every note so far is applied. */
static void go_direct(prio_sel *s)
{
    s->base.held = true;
    s->noting = false;
    settle_all(s);
}

/* Whether the exclusive holder changes the tree in place: while nobody has
 * drawn the selector without the storage lock (then that lock is all it
 * needs, as for any selector), or once its hold's notes have filled up
 * (held: it waited for mu, which it keeps until flush). Otherwise it notes
 * its changes: the hold applies them itself once it has let go of the
 * storage lock, if mu is free then (exr_buffer_unlock), else whoever takes
 * mu next does. */
static bool direct(prio_sel *s)
{
    if (s->base.held || s->noting)
        return s->base.held;
    if (!atomic_load_explicit(&s->base.detached, memory_order_relaxed))
        return true; /* nobody draws it without the storage lock: in place */
    s->noting = true;
    return false;
}

/* Room for k more entries in the hold's list; when it is full, the hold
 * waits for mu and goes direct (no entry then). */
static lent *hold_room(prio_sel *s, size_t k)
{
    if (s->hold_n + k <= HOLD) {
        lent *e = s->hold + s->hold_n;
        s->hold_n += k;
        return e;
    }
    pthread_mutex_lock(&s->base.mu);
    go_direct(s);
    return NULL;
}

static void p_add(exr_selector *b, size_t i, double prio)
{
    prio_sel *s = (prio_sel *)b;
    uint64_t u;
    memcpy(&u, &prio, sizeof u);
    lent *e = direct(s) ? NULL : hold_room(s, 1);
    if (e)
        *e = (lent){L_ADD, (uint32_t)i, (uint32_t)u, (uint32_t)(u >> 32)};
    else
        t_add(s, i, prio);
}

static void note_adds(prio_sel *s, size_t i0, size_t count, const float *prio,
                      const float *stored)
{
    for (size_t k0 = 0; k0 < count; k0 += RUN) {
        size_t n = count - k0 < RUN ? count - k0 : RUN;
        lent *e = s->base.held ? NULL : hold_room(s, 1 + run_entries(n, 2));
        if (!e) {
            t_add_stored(s, i0 + k0, n, prio + k0, stored + k0);
            continue;
        }
        e[0] = (lent){L_ADDS_RUN, (uint32_t)(i0 + k0), (uint32_t)n, 0};
        /* written in place: through a zeroed array and a copy, two
         * rep-string runs took three quarters of this function's time */
        unsigned char *d = (unsigned char *)(e + 1);
        for (size_t k = 0; k < n; k++) {
            memcpy(d + 8 * k, prio + k0 + k, sizeof(float));
            memcpy(d + 8 * k + 4, stored + k0 + k, sizeof(float));
        }
        if (n % 2) /* the last entry's unused half */
            memset(d + 8 * n, 0, 8);
    }
}

static void p_add_stored(exr_selector *b, size_t i0, size_t count, const float *prio,
                         const float *stored)
{
    prio_sel *s = (prio_sel *)b;
    if (direct(s))
        t_add_stored(s, i0, count, prio, stored);
    else
        note_adds(s, i0, count, prio, stored);
}

static void p_remove(exr_selector *b, size_t i, size_t last)
{
    prio_sel *s = (prio_sel *)b;
    lent *e = direct(s) ? NULL : hold_room(s, 1);
    if (e)
        *e = (lent){L_REM, (uint32_t)i, (uint32_t)last, 0};
    else
        t_remove(s, i, last);
}

static void note_removes(prio_sel *s, size_t count, const size_t *i, size_t last0)
{
    for (size_t k0 = 0; k0 < count; k0 += RUN) {
        size_t n = count - k0 < RUN ? count - k0 : RUN;
        lent *e = s->base.held ? NULL : hold_room(s, 1 + run_entries(n, 1));
        if (!e) {
            t_remove_many(s, n, i + k0, last0 - k0);
            continue;
        }
        e[0] = (lent){L_REMS_RUN, 0, (uint32_t)n, (uint32_t)(last0 - k0)};
        unsigned char *d = (unsigned char *)(e + 1); /* in place, as note_adds */
        for (size_t k = 0; k < n; k++) {
            uint32_t w = (uint32_t)i[k0 + k];
            memcpy(d + 4 * k, &w, sizeof w);
        }
        memset(d + 4 * n, 0, run_entries(n, 1) * sizeof *e - 4 * n);
    }
}

static void p_remove_many(exr_selector *b, size_t count, const size_t *i, size_t last0)
{
    prio_sel *s = (prio_sel *)b;
    if (direct(s))
        t_remove_many(s, count, i, last0);
    else
        note_removes(s, count, i, last0);
}

static void p_idents(exr_selector *b, size_t i0, size_t count, exr_pick first)
{
    prio_sel *s = (prio_sel *)b;
    for (size_t k = 0; s->ident && k < count;) {
        size_t n = count - k < 0xffffff ? count - k : 0xffffff;
        lent *e = direct(s) ? NULL : hold_room(s, 1);
        if (e)
            *e = (lent){L_ID | (uint32_t)n << 8, (uint32_t)(i0 + k), first.slot,
                        first.pos + (uint32_t)k};
        for (size_t j = 0; !e && j < n; j++)
            s->ident[i0 + k + j] = (exr_pick){first.slot, first.pos + (uint32_t)(k + j)};
        k += n;
    }
}

/* mu and the storage lock held: ident kept from now on. */
static exr_status p_set_idents(exr_selector *b, size_t n, const exr_pick *table)
{
    prio_sel *s = (prio_sel *)b;
    if (!s->ident && ident_fit(s) != EXR_OK)
        return EXR_ENOMEM;
    if (n)
        memcpy(s->ident, table, n * sizeof *table);
    return EXR_OK;
}

/* The end of a hold. In place: the tree completed (and mu let go if held).
 * Noting: the list goes to the log (or, when the log cannot take it, is
 * applied at once under mu); exr_buffer_unlock applies the log once the
 * storage lock is let go, if mu is free. */
static void p_flush(exr_selector *b)
{
    prio_sel *s = (prio_sel *)b;
    if (!s->noting) {
        /* in place (no mu) only while no draw runs without the storage
         * lock; else a hold that did not change it has nothing pending */
        if (s->base.held || !atomic_load_explicit(&b->detached, memory_order_relaxed))
            sync(s);
        if (s->base.held) {
            s->base.held = false;
            pthread_mutex_unlock(&b->mu);
        }
        return;
    }
    lent *e = hold_room(s, 1);
    if (!e) { /* the list was full: gone direct */
        sync(s);
        s->base.held = false;
        pthread_mutex_unlock(&b->mu);
        return;
    }
    *e = (lent){L_FLUSH, 0, 0, 0};
    s->noting = false;
    pthread_mutex_lock(&s->log_mu);
    if (!s->log)
        s->log = malloc(LOG * sizeof *s->log);
    bool fits = s->log && s->log_n + s->hold_n <= LOG;
    if (fits) {
        memcpy(s->log + s->log_n, s->hold, s->hold_n * sizeof *s->hold);
        s->log_n += s->hold_n;
        s->hold_n = 0;
    }
    pthread_mutex_unlock(&s->log_mu);
    if (fits)
        return;
    pthread_mutex_lock(&b->mu);
    settle_all(s);
    pthread_mutex_unlock(&b->mu);
}

static size_t p_log_mark(exr_selector *b)
{
    prio_sel *s = (prio_sel *)b;
    pthread_mutex_lock(&s->log_mu);
    size_t n = s->log_n;
    pthread_mutex_unlock(&s->log_mu);
    return n;
}

static void p_settle(exr_selector *b, size_t upto)
{
    if (upto == EXR_SETTLE_ALL) {
        settle_all((prio_sel *)b);
        return;
    }
    apply_log((prio_sel *)b, upto);
    sync((prio_sel *)b);
}

/* Back to changes in place (selector.h, reattach): with every note
 * applied, nothing needs the picks the leaves stand for any more, and
 * record calls stop keeping them (t_remove, p_idents). */
static void p_reattach(exr_selector *b)
{
    prio_sel *s = (prio_sel *)b;
    settle_all(s);
    free(s->ident);
    s->ident = NULL;
    s->ident_cap = 0;
    atomic_store_explicit(&b->detached, false, memory_order_relaxed);
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
 * power by powa.h's series (32 at a time with AVX-512F, 16 with AVX2): within ~1e-14 of the
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
    settle_all(s);
    for (size_t b = 0; b < count; b++)
        w[b] = exr_sumtree_get(&s->tree, idx[b]);
    weights_from_leaves(exr_sumtree_min(&s->tree), s->beta, count, w, w);
}

static void weights_post(const exr_wpost *p, size_t count, float *w)
{
    weights_from_leaves(p->lo, p->beta, count, w, w);
}

/* count + extra draws from the complete tree, the extra ones from a
 * generator split off the selector's (selector.h, sample_detached), whose
 * own advances by count draws whatever extra is; ids (NULL: not wanted)
 * gets the picks the leaves stand for, and then the table's entries are
 * not prefetched: this draw may run without the storage lock. */
static exr_status draw(prio_sel *s, size_t count, size_t extra, size_t *idx, exr_pick *ids,
                       float *w, double *scratch, exr_wpost *post)
{
    if (!(exr_sumtree_total(&s->tree) > 0))
        return EXR_EEMPTY;
    exr_sumtree_sample(&s->tree, &s->base.rng, count, idx, scratch);
    if (extra) {
        exr_rng g = exr_rng_split(&s->base.rng);
        exr_sumtree_sample(&s->tree, &g, extra, idx + count, scratch);
        count += extra;
    }
    for (size_t k = 0; !ids && k < count; k++)
        exr_sel_prefetch(&s->base, idx[k]);
    for (size_t k = 0; ids && k < count; k++)
        __builtin_prefetch(&s->ident[idx[k]]);
    for (size_t k = 0; k < count; k++)
        w[k] = exr_sumtree_get(&s->tree, idx[k]);
    for (size_t k = 0; ids && k < count; k++)
        ids[k] = s->ident[idx[k]];
    *post = (exr_wpost){weights_post, exr_sumtree_min(&s->tree), s->beta};
    return EXR_OK;
}

static exr_status p_sample_post(exr_selector *b, size_t n, size_t count, size_t *idx, float *w,
                                double *scratch, exr_wpost *post)
{
    prio_sel *s = (prio_sel *)b;
    settle_all(s);
    return n ? draw(s, count, 0, idx, NULL, w, scratch, post) : EXR_EEMPTY;
}

/* mu held, the storage lock maybe not: only the log is applied (a hold
 * under way keeps its own list). */
static exr_status p_sample_detached(exr_selector *b, size_t count, size_t extra, size_t *idx,
                                    exr_pick *ids, float *w, double *scratch, exr_wpost *post)
{
    prio_sel *s = (prio_sel *)b;
    EXR_TM_NOW(t0);
    apply_log(s, SIZE_MAX);
    sync(s);
    EXR_TM_SINCE(EXR_TM_DRAW_NOTES, t0);
    return draw(s, count, extra, idx, ids, w, scratch, post);
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
    settle_all(s);
    *total = exr_sumtree_total(&s->tree);
    *min_pos = exr_sumtree_min(&s->tree);
}

static double p_stored(const exr_selector *b, size_t i)
{
    settle_all((const prio_sel *)b);
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
    settle_all(s);
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
    settle_all(s);
    if (!(s->max_prio >= 1.0) || !isfinite(s->max_prio)) {
        snprintf(msg, len, "prioritized selector: maximum so far is %g", s->max_prio);
        return 1;
    }
    return exr_sumtree_check(&s->tree, n, msg, len);
}

static int p_check_idents(const exr_selector *b, size_t n, const exr_pick *table, char *msg,
                          size_t len)
{
    const prio_sel *s = (const prio_sel *)b;
    settle_all(s);
    for (size_t i = 0; s->ident && i < n; i++)
        if (s->ident[i].slot != table[i].slot || s->ident[i].pos != table[i].pos) {
            snprintf(msg, len,
                     "prioritized selector: leaf %zu stands for (%u, %u), the table has (%u, %u)", i,
                     s->ident[i].slot, s->ident[i].pos, table[i].slot, table[i].pos);
            return 1;
        }
    return 0;
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
    /* a leaf says nothing of the pick that had it before: writing it anew
     * is an add at that index */
    .replace = p_add,
    .replace_stored = p_add_stored,
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
    .idents = p_idents,
    .set_idents = p_set_idents,
    .check_idents = p_check_idents,
    .log_mark = p_log_mark,
    .settle = p_settle,
    .sample_detached = p_sample_detached,
    .reattach = p_reattach,
};
