/*
 * buffer_priority.c - priority updates, the stored priorities and their totals.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"
#include "powa.h"
#include "timing.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Table index of pick (epi, pos) when hint still holds it: a batch's index
 * is only a hint, since picks move by swap-removal after it was drawn. The
 * table holds live picks only, and handles are never reused, so an entry
 * naming this episode's handle and this position is this pick. */
/* *p read once: the hints and notes may be the caller's memory, which
 * another thread can write while set_priority runs without the GIL, so a
 * value checked is a value kept, never read again (a plain load may be
 * repeated by the compiler). */
static inline int64_t load_once(const int64_t *p)
{
    return __atomic_load_n(p, __ATOMIC_RELAXED);
}

_Static_assert(sizeof(size_t) == sizeof(int64_t), "hints are copied into size_t indices");

static inline int hint_holds(const exr_buffer *b, int64_t hint, int64_t epi, int64_t pos)
{
    if (hint < 0 || (uint64_t)hint >= b->picks.n)
        return 0;
    const exr_pick *pk = &b->picks.v[hint];
    return (int64_t)pk->pos == pos && b->eps.slab[pk->slot].handle == epi;
}

#define PRIO_SMALL 256

/* Per-call scratch of set_priority: on the stack up to PRIO_SMALL picks.
 * stored: the priorities' p ** a, computed before the lock (pow_guess). */
typedef struct {
    size_t *idx, *scratch;
    double *kept;
    uint32_t **aux;
    float *stored;
    size_t small_idx[PRIO_SMALL], small_scratch[PRIO_SMALL];
    double small_kept[PRIO_SMALL];
    uint32_t *small_aux[PRIO_SMALL];
    float small_stored[PRIO_SMALL];
} prio_scratch;

static exr_status prio_scratch_alloc(prio_scratch *s, size_t count)
{
    s->idx = s->small_idx;
    s->scratch = s->small_scratch;
    s->kept = s->small_kept;
    s->aux = s->small_aux;
    s->stored = s->small_stored;
    if (count <= PRIO_SMALL)
        return EXR_OK;
    size_t bytes;
    if (!exr_mul_size(count, sizeof(size_t), &bytes))
        return EXR_EOVERFLOW;
    s->idx = malloc(bytes);
    s->scratch = malloc(bytes);
    s->kept = malloc(count * sizeof *s->kept);
    s->aux = malloc(count * sizeof *s->aux);
    s->stored = malloc(count * sizeof *s->stored);
    if (!s->idx || !s->scratch || !s->kept || !s->aux || !s->stored) {
        free(s->idx);
        free(s->scratch);
        free(s->kept);
        free(s->aux);
        free(s->stored);
        return EXR_ENOMEM;
    }
    return EXR_OK;
}

static void prio_scratch_free(prio_scratch *s)
{
    if (s->idx == s->small_idx)
        return;
    free(s->idx);
    free(s->scratch);
    free(s->kept);
    free(s->aux);
    free(s->stored);
}

/* Pick i's table index j (SIZE_MAX: no such pick) into s->idx[done], with
 * its priority into s->kept[done] and, when pre, its precomputed stored
 * form; returns the new count. */
static inline size_t keep_pick(prio_scratch *s, size_t done, size_t i, size_t j,
                               const double *prio, size_t prio_stride, bool pre)
{
    if (j == SIZE_MAX)
        return done;
    s->idx[done] = j;
    s->kept[done] = prio[i * prio_stride];
    if (pre)
        s->stored[done] = s->stored[i];
    return done + 1;
}

/* Hints (the batch form), checked in one software-pipelined pass: pick i
 * is checked while the table entry of pick i + 2 PF and, through the
 * entry of pick i + PF (by then in cache), its episode's slab entry are
 * prefetched, so the check's two dependent loads of different picks
 * overlap. A hint that does not hold falls back to the map. */
static size_t resolve_hinted(const exr_buffer *b, size_t count, const int64_t *epi,
                             const int64_t *pos, const int64_t *hint, const double *prio,
                             size_t prio_stride, bool pre, prio_scratch *s)
{
    enum { PF = 8 };
    size_t done = 0, n = b->picks.n;
    for (size_t i = 0; i < count; i++) {
        int64_t h2 = i + 2 * PF < count ? load_once(&hint[i + 2 * PF]) : -1;
        int64_t h1 = i + PF < count ? load_once(&hint[i + PF]) : -1;
        if ((uint64_t)h2 < n)
            __builtin_prefetch(&b->picks.v[h2]);
        if ((uint64_t)h1 < n)
            __builtin_prefetch(&b->eps.slab[b->picks.v[h1].slot]);
        int64_t h = load_once(&hint[i]), ep = load_once(&epi[i]), po = load_once(&pos[i]);
        size_t j = hint_holds(b, h, ep, po) ? (size_t)h : pick_index_locked(b, ep, po);
        done = keep_pick(s, done, i, j, prio, prio_stride, pre);
    }
    return done;
}

/* The smallest size the table had after the moves since the count
 * `moves` (exr_buffer.low), and has now: no entry below it was moved
 * since, only overwritten when its pick was removed. 0 when those moves
 * are more than the ring keeps (or the count is not one this buffer has
 * reached). */
static size_t low_since_locked(const exr_buffer *b, uint64_t moves)
{
    if (moves > b->moves || b->moves - moves > EXR_LOWS)
        return 0;
    uint64_t low = b->picks.n;
    for (uint64_t m = moves + 1; m <= b->moves; m++)
        low = b->low[m % EXR_LOWS] < low ? b->low[m % EXR_LOWS] : low;
    return (size_t)low;
}

#ifdef EXR_DEBUG_LOCKS
_Atomic uint64_t exr_debug_since_kept;
#define NOTED_KEPT(moved) ((void)((moved) && exr_debug_since_kept++))
#else
#define NOTED_KEPT(moved) ((void)0)
#endif

/* Whether every pick i < count is the noted one, its index idx[i] (the
 * hints, copied) below low: one pass without branches, which the compiler
 * vectorizes. */
static bool all_noted(size_t count, const int64_t *epi, const int64_t *pos, const size_t *idx,
                      const int64_t *he, const int64_t *hp, size_t low)
{
    uint64_t bad = 0;
    for (size_t i = 0; i < count; i++)
        bad |= (uint64_t)(epi[i] ^ he[i]) | (uint64_t)(pos[i] ^ hp[i]) |
               (uint64_t)(idx[i] >= low);
    return bad == 0;
}

/* A draw's notes d, count picks (hint: its indices), given pick by pick
 * with the picks (epi[i], pos[i]): pick i is the noted one when it is
 * noted's handle and position. It is then still at hint[i] when that is
 * below `low`: the table's size when nothing has moved since the notes
 * (moved false), else the smallest size after every move since
 * (low_since_locked: no swap moved it) with the pick's episode still in
 * the slot it was drawn from (its picks leave only with it, and handles
 * are never reused), which the draw's plan read. The table is not read.
 * Any other pick is checked as a hint (hint_holds), else looked up. */
static size_t resolve_noted(const exr_buffer *b, const exr_drawn *d, size_t low, bool moved,
                            size_t count, const int64_t *epi, const int64_t *pos,
                            const int64_t *hint, const double *prio, size_t prio_stride, bool pre,
                            prio_scratch *s)
{
    enum { PF = 8 };
    size_t done = 0, hwm = b->eps.hwm;
    const int64_t *slot = d->v + count, *he = d->v + 2 * count, *hp = d->v + 3 * count;
    const exr_episode *slab = b->eps.slab;
    if (!moved) {
        /* the common case: the hints copied (one read each), then
         * checked in the copy */
        memcpy(s->idx, hint, count * sizeof *hint);
        if (all_noted(count, epi, pos, s->idx, he, hp, low)) {
            for (size_t i = 0; i < count; i++)
                s->kept[i] = prio[i * prio_stride];
            return count; /* s->stored[i] stays where it is */
        }
    }
    for (size_t i = 0; i < count; i++) {
        int64_t sl = moved ? load_once(&slot[i]) : 0, h = load_once(&hint[i]);
        int64_t ep = load_once(&epi[i]), po = load_once(&pos[i]);
        if (moved && i + PF < count && (uint64_t)slot[i + PF] < hwm)
            __builtin_prefetch(&slab[slot[i + PF]]); /* a prefetch never faults */
        bool ok = ep == he[i] && po == hp[i] && (uint64_t)h < low;
        if (ok && moved)
            ok = (uint64_t)sl < hwm && slab[sl].handle == ep;
        size_t j;
        if (ok) {
            j = (size_t)h;
            NOTED_KEPT(moved);
        } else {
            j = hint_holds(b, h, ep, po) ? (size_t)h : pick_index_locked(b, ep, po);
        }
        done = keep_pick(s, done, i, j, prio, prio_stride, pre);
    }
    return done;
}

/* The table indices of the picks (epi[i], pos[i]) that exist, into
 * s->idx, with their priorities into s->kept (and, when pre, their
 * precomputed s->stored[i] moved to s->stored[done]); returns how many.
 * With a draw's notes (gen) of this buffer, at most EXR_LOWS moves old:
 * the noted picks by what the notes and the table's sizes say
 * (resolve_noted). Other hints are checked (resolve_hinted). Without:
 * each pick's aux entry is found through the map in passes over the whole
 * batch (pick_aux_many_locked; aux[i] NULL: no such pick), then read. */
static size_t resolve_picks_locked(const exr_buffer *b, size_t count, const int64_t *epi,
                                   const int64_t *pos, const int64_t *hint, const exr_drawn *gen,
                                   const double *prio, size_t prio_stride, bool pre,
                                   prio_scratch *s)
{
    EXR_ASSERT_LOCKED(b);
    bool noted = hint && gen && gen->serial == b->serial && gen->count == count;
    size_t low = noted ? low_since_locked(b, gen->moves) : 0;
    if (low)
        return resolve_noted(b, gen, low, gen->moves != b->moves, count, epi, pos, hint, prio,
                             prio_stride, pre, s);
    if (hint)
        return resolve_hinted(b, count, epi, pos, hint, prio, prio_stride, pre, s);
    uint32_t **aux = s->aux;
    pick_aux_many_locked(b, count, epi, pos, s->scratch, aux);
    size_t done = 0;
    for (size_t i = 0; i < count; i++)
        if (aux[i])
            done = keep_pick(s, done, i, *aux[i], prio, prio_stride, pre);
    return done;
}

size_t exr_first_bad_priority(const double *p, size_t n)
{
    size_t i = 0;
#if defined(__SSE2__)
    /* bad: p < 0, or not p <= DBL_MAX (infinite or NaN: unordered) */
    const __m128d zero = _mm_setzero_pd(), top = _mm_set1_pd(DBL_MAX);
    for (; i + 8 <= n; i += 8) {
        __m128d bad = zero;
        for (size_t k = 0; k < 8; k += 2) {
            __m128d v = _mm_loadu_pd(p + i + k);
            bad = _mm_or_pd(bad, _mm_or_pd(_mm_cmplt_pd(v, zero), _mm_cmpnle_pd(v, top)));
        }
        if (_mm_movemask_pd(bad))
            break; /* the scalar loop finds which */
    }
#endif
    for (; i < n; i++)
        if (!(p[i] >= 0 && p[i] <= DBL_MAX))
            return i;
    return n;
}

/* 1 if some priority is not finite and >= 0 (stride 0: prio[0] for all). */
static int priorities_bad(size_t count, const double *prio, size_t prio_stride)
{
    if (!prio_stride)
        return count && exr_first_bad_priority(prio, 1) == 0;
    return exr_first_bad_priority(prio, count) != count;
}

/* The exponent selector h last had (pow_h, pow_a), or NaN. */
static double pow_guess(const exr_buffer *b, int64_t h)
{
    if (atomic_load_explicit(&b->pow_h, memory_order_relaxed) != h)
        return NAN;
    uint64_t u = atomic_load_explicit(&b->pow_a, memory_order_relaxed);
    double a;
    memcpy(&a, &u, sizeof a);
    return a;
}

/* Selector e's picks s->idx[0..done) get priorities s->kept, with the
 * stored forms s->stored when they were computed with its power (a).
 * When let_go (the lock held shared) and the selector can be updated
 * without the lock while another thread records (selector.h,
 * exr_sel_detach), the lock is let go as soon as mu is held and the notes
 * of the holds before are marked: the tree work runs without it, on
 * exactly those notes. Returns whether it let go. */
static bool update_locked(exr_buffer *b, sel_entry *e, size_t done, double a, prio_scratch *s,
                          bool let_go)
{
    EXR_ASSERT_LOCKED(b);
    exr_selector *sel = e->sel;
    double sa = sel->vt->stored_power ? sel->vt->stored_power(sel) : NAN;
    bool use = !isnan(sa) && a == sa;
    if (!isnan(sa) && !use) { /* a guess for the next call */
        uint64_t u;
        memcpy(&u, &sa, sizeof u);
        atomic_store_explicit(&b->pow_a, u, memory_order_relaxed);
        atomic_store_explicit(&b->pow_h, e->handle, memory_order_relaxed);
    }
    let_go = let_go && exr_sel_detach(sel, b->excl_owner, b->eps.seq);
    EXR_TM_NOW(t0);
    if (let_go)
        exr_sel_take(sel);
    else
        exr_sel_lock(sel);
    if (let_go && !exr_sel_start_detached(sel, b->picks.n, b->picks.v, b->eps.seq))
        let_go = false; /* no memory to keep its picks: under the lock */
    EXR_TM_SINCE(EXR_TM_UPD_MU, t0);
    EXR_TM_NOW(t1);
    if (sel->vt->settle) {
        /* the indices are the table's now: the selector's notes up to now
         * are applied, none after (a hold may end once the lock is let go) */
        size_t mark = let_go ? sel->vt->log_mark(sel) : EXR_SETTLE_ALL;
        if (let_go)
            exr_buffer_unlock(b);
#ifdef EXR_DEBUG_LOCKS
        if (let_go && exr_debug_detached) /* a test's holds, before the notes are applied */
            exr_debug_detached(b, 2);
#endif
        sel->vt->settle(sel, mark);
    }
    EXR_TM_SINCE(EXR_TM_UPD_SETTLE, t1);
    EXR_TM_NOW(t2);
    if (use)
        sel->vt->update_many_stored(sel, done, s->idx, s->kept, s->stored, s->scratch);
    else
        sel->vt->update_many(sel, done, s->idx, s->kept, s->scratch);
    EXR_TM_SINCE(EXR_TM_UPD_TREE, t2);
    exr_sel_unlock(sel);
    return let_go;
}

/* a: the power s->stored was computed with (NaN: not computed); bad: what
 * priorities_bad said. */
static exr_status set_priority_impl(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                    const int64_t *pos, const int64_t *hint,
                                    const exr_drawn *hint_gen, const double *prio,
                                    size_t prio_stride, int bad, double a, prio_scratch *s,
                                    size_t *applied, bool *let_go)
{
    bool want = *let_go;
    *let_go = false;
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    if (bad)
        return EXR_EINVAL;
    size_t done = 0;
    if (e->sel->vt->prioritized && count) {
        EXR_TM_NOW(t0);
        done = resolve_picks_locked(b, count, epi, pos, hint, hint_gen, prio, prio_stride,
                                    !isnan(a), s);
        EXR_TM_SINCE(EXR_TM_UPD_RESOLVE, t0);
        *let_go = update_locked(b, e, done, a, s, want);
    }
    *applied = done;
    return EXR_OK;
}

exr_status exr_buffer_set_priority_locked(exr_buffer *b, int64_t h, size_t count,
                                          const int64_t *epi, const int64_t *pos,
                                          const double *prio, size_t prio_stride,
                                          size_t *applied)
{
    EXR_ASSERT_LOCKED(b);
    prio_scratch s;
    exr_status st = prio_scratch_alloc(&s, count);
    if (st != EXR_OK)
        return st;
    bool let_go = false;
    st = set_priority_impl(b, h, count, epi, pos, NULL, NULL, prio, prio_stride,
                           priorities_bad(count, prio, prio_stride), NAN, &s, applied, &let_go);
    prio_scratch_free(&s);
    return st;
}

/* stored[k] = the stored form of prio[k * stride] ** a, for k < count: one
 * power for a scalar (stride 0), the vector loop otherwise. */
static void stored_forms(const double *prio, size_t stride, size_t count, double a, float *stored)
{
    if (stride) {
        exr_pow_leaves(prio, stride, count, a, stored);
        return;
    }
    float v = exr_pow_leaf(prio[0], a);
    for (size_t k = 0; k < count; k++)
        stored[k] = v;
}

/* What needs no lock is done before it is taken: the priorities checked,
 * the scratch allocated and, when selector h's power is known (pow_guess),
 * each priority's stored form p ** a, the same bits as under the lock. */
exr_status exr_buffer_set_priority(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                   const int64_t *pos, const int64_t *hint,
                                   const exr_drawn *hint_gen, const double *prio,
                                   size_t prio_stride, size_t *applied)
{
    prio_scratch s;
    exr_status st = prio_scratch_alloc(&s, count);
    if (st != EXR_OK)
        return st;
    /* The caller's priorities read once, into the scratch, and only that
     * copy checked and applied: another thread writing into the caller's
     * array meanwhile cannot slip a NaN past the check into the tree, where
     * a NaN leaf is a pending add's tag. kept[] is then compacted in place
     * (keep_pick: done <= i). */
    double one = count ? prio[0] : 0.0;
    if (prio_stride == 1 && count) {
        memcpy(s.kept, prio, count * sizeof *prio);
        prio = s.kept;
    } else if (prio_stride && count) {
        for (size_t i = 0; i < count; i++)
            s.kept[i] = prio[i * prio_stride];
        prio = s.kept;
        prio_stride = 1;
    } else {
        prio = &one;
    }
    int bad = priorities_bad(count, prio, prio_stride);
    double a = bad ? NAN : pow_guess(b, h);
    if (!isnan(a))
        stored_forms(prio, prio_stride, count, a, s.stored);
    lock_shared(b);
    bool let_go = true;
    st = set_priority_impl(b, h, count, epi, pos, hint, hint_gen, prio, prio_stride, bad, a, &s,
                           applied, &let_go);
    if (!let_go)
        exr_buffer_unlock(b);
    prio_scratch_free(&s);
    return st;
}

exr_status exr_buffer_priority_stats_locked(const exr_buffer *b, int64_t h, double *total,
                                            double *min_pos, uint64_t *n)
{
    EXR_ASSERT_LOCKED(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    exr_sel_lock(e->sel);
    e->sel->vt->stats(e->sel, b->picks.n, total, min_pos);
    exr_sel_unlock(e->sel);
    *n = b->picks.n;
    return EXR_OK;
}

exr_status exr_buffer_stored_priority_locked(const exr_buffer *b, int64_t h, size_t count,
                                             const int64_t *epi, const int64_t *pos, double *out)
{
    EXR_ASSERT_LOCKED(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    exr_sel_lock(e->sel);
    for (size_t i = 0; i < count; i++) {
        size_t idx = pick_index_locked(b, load_once(&epi[i]), load_once(&pos[i]));
        out[i] = idx == SIZE_MAX ? NAN : e->sel->vt->stored(e->sel, idx);
    }
    exr_sel_unlock(e->sel);
    return EXR_OK;
}
