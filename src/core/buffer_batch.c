/*
 * buffer_batch.c - get_batch and gather: picks drawn by a selector (or named), their
 * rows located under the lock, then copied (batch_copy.c) without it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"
#include "mem.h"
#include "select.h"
#include "timing.h"

/* One pick resolved into its plan and metadata. L, slab and pick_len are the
 * batch's own copies (plan_batch_locked): the int64 metadata stores may alias
 * the buffer's size_t fields, so reading them from b would reload them after
 * every store. A pick that runs past its segment (a split) is not a branch:
 * which segment B is and how many rows A holds are selects (select.h), since
 * a split depends on the random draw and a branch on it mispredicts (about
 * one pick in four with 64-step episodes, callgrind). */
static inline __attribute__((always_inline)) void
plan_pick_locked(const exr_store_layout *L, exr_episode *slab, uint64_t pick_len, const exr_pick *pk,
                 plan_t *pl, int64_t *epi, int64_t *pos, int64_t *len, int64_t *len_next)
{
    exr_episode *e = &slab[pk->slot];
    /* only written when it changes: the line stays clean. Atomic: samplers
     * plan under the shared lock; eviction reads it under the exclusive one */
    if (!__atomic_load_n(&e->sampled, __ATOMIC_RELAXED))
        __atomic_store_n(&e->sampled, 1, __ATOMIC_RELAXED);
    uint64_t p = pk->pos, c = complete_steps(e), n = e->n;
    uint64_t l = c - p < pick_len ? c - p : pick_len;
    size_t k, off, next = p + l < n;
    exr_store_locate(L, p, &k, &off);
    size_t room = exr_store_seg_cap(L, k) - off;
    /* B is read only when the rows read (the pick's, and its next state's
     * if stored) run past A: those are stored, so segment k + 1 exists */
    size_t more = room < l + next;
    pl->na = (uint32_t)exr_sel_below(room, l + 1, room, l + 1);
    pl->len = (uint32_t)l;
    pl->next_stored = (uint32_t)next;
    /* The body is read only where needed: segment 0's pointer is the
     * slot's copy (seg0), segment B's only where the rows run past A, the
     * final state only at an episode's end (about one pick in its length).
     * Each is loaded through an address chosen by a select, the slot's
     * seg0 standing in where the body is not read: no branch on the random
     * draw, and a pick in segment 0 costs no miss on its body. */
    const exr_body *body = e->body;
    uintptr_t here = (uintptr_t)&e->seg0;
    unsigned char *const *pa = (unsigned char *const *)exr_sel_set(k, (uintptr_t)&body->segs[k], here);
    unsigned char *const *pb =
        (unsigned char *const *)exr_sel_set(more, (uintptr_t)&body->segs[k + 1], here);
    unsigned char *const *pf =
        (unsigned char *const *)exr_sel_set(next, here, (uintptr_t)&body->final_state);
    pl->a = exr_seg_row(L, *pa, off);
    pl->b = (const unsigned char *)exr_sel_set(more, (uintptr_t)*pb, 0);
    pl->final = (const unsigned char *)exr_sel_set(next, 0, (uintptr_t)*pf);
    *epi = e->handle;
    *pos = (int64_t)p;
    *len = (int64_t)l;
    *len_next = (int64_t)l - ((e->terminated != 0) & (p + l == n));
}

/* The next link of pick pk's chain after its slot (which must be loaded
 * already): where the segment pointer sits in its episode's body; or, if
 * rows (the plan prefetches rows) and its rows and next state are surely
 * in segment 0 (the plan then reads no body: plan_pick_locked), its first
 * row. A select, not a branch: in a buffer of longer episodes which one
 * it is follows the random draw. */
static inline const void *next_link(const exr_store_layout *L, const exr_episode *slab,
                                    uint64_t pick_len, const exr_pick *pk, bool rows)
{
    size_t k, off;
    exr_store_locate(L, pk->pos, &k, &off);
    const exr_episode *e = &slab[pk->slot];
    uint64_t end = (uint64_t)pk->pos + pick_len + 1; /* past the next state */
    uintptr_t in0 = rows & (k == 0) & (end < e->n) & (end <= exr_store_seg_cap(L, 0));
    return (const void *)exr_sel_set(in0, (uintptr_t)exr_seg_row(L, e->seg0, off),
                                     (uintptr_t)&e->body->segs[k]);
}

/* Resolves the chosen picks, their table entries ent[0..count) (gathered:
 * gather_entries_locked), into plans and metadata, and marks their
 * episodes sampled. Lock held.
 *
 * A pick is a chain of dependent loads: its table entry, its episode slot,
 * the segment pointer in the episode's body, its rows. The entries come
 * first: the draw prefetched each as it drew it (selector.h, entries), and
 * gather_entries_locked loads them all before any is used. The batch then
 * goes through the rest of the chain in chunks of C picks, one link at a
 * time for the whole chunk (prefetch every slot, then every segment
 * pointer, then resolve), so the misses of a chunk's picks overlap instead
 * of following one another. A pick whose rows and next state lie in its
 * episode's segment 0 skips the body: the slot holds that segment's
 * pointer (exr_episode.seg0), so its chain is entry, slot, rows, and the
 * segment pointers' pass prefetches its first row instead when the plan
 * prefetches rows at all (below). This walk is for a buffer whose tables and
 * rows do not stay in cache (heat > WARM, batch_heat_locked): in a small
 * one every link is a cache hit, and the two extra passes only cost
 * instructions (~1.7 of get_5000's 11 ns a pick of planning at N = 2048,
 * benchmarks/c/phases.c).
 *
 * The rows of a pick are prefetched as soon as they are known when the
 * buffer is not in cache and the batch is small (its copy follows at once
 * and finds them in cache), or the buffer is FAR (larger than a share of
 * L3) and the batch's rows fit in three quarters of a core's L2: then the
 * row misses overlap with the rest of the walk, and the copy (which
 * prefetches a few picks ahead too, batch_copy.c) finds the rows in L2
 * instead of memory (get_5000 at N = 1M, 1.26 MB of rows, on a machine
 * with 2 MiB of L2: about 0.92x the time). Rows that do not fit are
 * pushed out of L2 before the copy reads them, and the walk has only
 * stalled on its prefetches: the copy's own prefetches, which overlap the
 * misses with its writes, do better (the same get_5000 with 512 KiB of
 * L2: 0.80-0.82x the time without the plan's). For a buffer that fits in
 * L3 the copy's own prefetches suffice, and these would only add
 * instructions (~5 ns a pick at N = 65,536).
 *
 * The entries and the rows, the two links that mostly come from memory,
 * are prefetched into L2 (locality 2), the slots and segment pointers into
 * L1: a prefetch into L1 holds one of the core's few L1 miss buffers until
 * its line arrives, and with a batch's worth of them in flight the walk
 * stalled on the prefetches themselves (perf: a third of the plan's
 * samples); the loads that follow find the lines in L2. All four into L2,
 * or only one of the two, was slower (docs/benchmarks.md, "Small get_batch
 * calls, continued"). */
typedef enum { WARM, COLD, FAR } batch_heat;

/* Whether the batch's rows (with their next rows) take at most 64 KiB: the
 * plan then prefetches them all, and the copy, which follows at once, does
 * not again (its prefetches only cost instructions: 0.97-0.98x the time of
 * get_batch(32) at N = 1M, ab_small). */
static bool small_rows(const exr_buffer *b, size_t count)
{
    size_t bytes;
    return exr_mul_size(count, (b->cfg.pick_len + 1) * b->lay.row_bytes, &bytes) &&
           bytes <= ((size_t)64 << 10);
}

/* Whether the plan prefetches each pick's rows as soon as it has them
 * (see above), the buffer not being in cache (the walk asks that first: a
 * WARM buffer's rows are cache hits, and the prefetches only cost
 * instructions, 1/0.83-1/0.88 the time of get_batch(32) from 1,000
 * records): a small batch, or a buffer far from the core and a batch
 * whose rows fit in L2 (exr_l2_bytes). (A pick of more than 48 lines is a
 * stream the hardware follows: the copy's rule, batch_copy.c.) */
static bool rows_now(const exr_buffer *b, size_t count, batch_heat heat)
{
    size_t pick_bytes = (b->cfg.pick_len + 1) * b->lay.row_bytes, rows;
    return small_rows(b, count) ||
           (heat == FAR && pick_bytes <= 46 * 64 && exr_mul_size(count, pick_bytes, &rows) &&
            rows <= exr_l2_bytes() / 4 * 3);
}

/* The plan's walk over chunks of C picks, eight or four picks at a time
 * (lanes: plan_simd.c) or one at a time. Always inlined, so that each caller gets
 * a loop of its own. */
static inline __attribute__((always_inline)) void
plan_walk_locked(exr_buffer *b, size_t count, const exr_pick *ent, bool lanes, plan_t *plans,
                 exr_batch_out *out, batch_heat heat)
{
    enum { C = 32 };
    const exr_store_layout lay = b->lay, *L = &lay;
    const uint64_t pick_len = b->cfg.pick_len;
    exr_episode *slab = b->eps.slab;
    int64_t *epi = out->pick_epi, *pos = out->pick_pos, *len = out->seq_len,
            *len_next = out->seq_len_next;
    bool cold = heat != WARM, now = cold && rows_now(b, count, heat);
    for (size_t c0 = 0; c0 < count; c0 += C) {
        size_t c1 = c0 + C < count ? c0 + C : count;
        for (size_t i = c0; cold && i < c1; i++)
            __builtin_prefetch(&slab[ent[i].slot]);
        for (size_t i = c0; cold && !now && i < c1; i++)
            __builtin_prefetch(next_link(L, slab, pick_len, &ent[i], false));
        for (size_t i = c0; now && i < c1; i++) /* into L2, as the rows */
            __builtin_prefetch(next_link(L, slab, pick_len, &ent[i], true), 0, 2);
        size_t i = lanes ? plan_lanes_locked(b, c0, c1, ent, plans, out, now) : c0;
        for (; i < c1; i++) {
            plan_pick_locked(L, slab, pick_len, &ent[i], &plans[i], &epi[i], &pos[i], &len[i],
                             &len_next[i]);
            if (now)
                prefetch_plan(L, &plans[i]);
        }
    }
}

/* The batch's picks' table entries, in draw order, into ent: loads that do
 * not depend on one another, so that their misses (the table is read at
 * random) overlap as far as the core allows; the walk then reads them in
 * order. Planning from the table directly, each entry's load heads a
 * pick's chain of dependent loads, and a chain waits for it. */
static void gather_entries_locked(const exr_buffer *b, size_t count, const size_t *idx,
                                  exr_pick *ent)
{
    EXR_ASSERT_LOCKED(b);
    const exr_pick *pv = b->picks.v;
    for (size_t i = 0; i < count; i++)
        ent[i] = pv[idx[i]];
}

/* ent: room for count entries (gather_entries_locked). Eight picks at a
 * time (AVX-512) or four (AVX2) where the machine can (plan_simd.c), a
 * small batch's too: with eight, a get_batch(32) from 1,000 records (in
 * cache) took 0.79-0.88x the time planned from the table pick by pick,
 * and at N = 1M, both with the draw's prefetches, 0.94-0.98x
 * (benchmarks/c/, paired). */
static void plan_batch_locked(exr_buffer *b, size_t count, const size_t *idx, exr_pick *ent,
                              bool have_ents, plan_t *plans, exr_batch_out *out, batch_heat heat)
{
    EXR_ASSERT_LOCKED(b);
    if (!have_ents)
        gather_entries_locked(b, count, idx, ent);
    if (plan_lanes_usable())
        plan_walk_locked(b, count, ent, true, plans, out, heat);
    else
        plan_walk_locked(b, count, ent, false, plans, out, heat);
    if (out->pick_index)
        for (size_t i = 0; i < count; i++)
            out->pick_index[i] = (int64_t)idx[i];
}

/* What the draw knew of its picks' places, into out->drawn (if wanted,
 * and if some selector has priorities to update: else the notes, which
 * only set_priority reads, are left as they were, still true of the draw
 * that wrote them). exact when idx[i] is the table's index of entry ent[i]
 * now, under this hold (a draw under the lock, or a detached one that no
 * hold came between: draw_detached); else it was at a moment after the
 * buffer's count of moves was moves0 (a detached draw's picks still there
 * keep the indices the selector had then, with the holds up to its draw
 * applied), which is noted instead. */
static void note_drawn_locked(const exr_buffer *b, size_t count, const size_t *idx,
                              const exr_pick *ent, bool exact, uint64_t moves0,
                              exr_batch_out *out)
{
    EXR_ASSERT_LOCKED(b);
    exr_drawn *d = out->drawn;
    bool any = false;
    for (size_t k = 0; d && k < b->nsels; k++)
        any |= b->sels[k].sel->vt->prioritized;
    if (!any)
        return;
    const exr_episode *slab = b->eps.slab;
    d->serial = b->serial;
    d->moves = exact ? b->moves : moves0;
    d->count = count;
    int64_t *di = d->v, *ds = d->v + count, *de = d->v + 2 * count, *dp = d->v + 3 * count;
    for (size_t i = 0; i < count; i++) {
        di[i] = (int64_t)idx[i];
        ds[i] = ent[i].slot;
        de[i] = slab[ent[i].slot].handle; /* the plan's line */
        dp[i] = ent[i].pos;
    }
}

/* Whether pick pk (a live table entry) is published: not entered by a
 * record call still copying its rows. */
static inline bool ent_visible_locked(const exr_buffer *b, exr_pick pk)
{
    EXR_ASSERT_LOCKED(b);
    const exr_episode *e = &b->eps.slab[pk.slot];
    /* atomic: a record call publishes (clears busy) under the shared lock */
    return !__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) || pk.pos < e->body->m_pub;
}

/* The same for the pick at table index i. */
static inline bool pick_visible_locked(const exr_buffer *b, size_t i)
{
    return ent_visible_locked(b, b->picks.v[i]);
}

/* count draws of selector s: the weights, or what post->fn turns into them
 * once the lock is let go (sample_post: selector.h). s->mu held; the draw
 * prefetches the drawn picks' table entries (selector.h, entries). */
static inline exr_status sample_locked(exr_buffer *b, exr_selector *s, size_t count, size_t *idx,
                                       float *w, double *scratch, exr_wpost *post)
{
    EXR_ASSERT_LOCKED(b);
    _Static_assert(sizeof(exr_pick) == 8, "selector.h's entries are 8 bytes each");
    s->entries = b->picks.v;
    if (s->vt->sample_post)
        return s->vt->sample_post(s, b->picks.n, count, idx, w, scratch, post);
    post->fn = NULL;
    return s->vt->sample(s, b->picks.n, count, idx, w, scratch);
}

/* Draws pick *idx again, one draw at a time, until it is published (a
 * draw conditioned on the published picks); SIZE_MAX (gone) is never.
 * s->mu held. 1: done; 0: still not after 64 draws; -1: the selector
 * cannot draw (*st says why). */
static int redraw_pick_locked(exr_buffer *b, exr_selector *s, size_t *idx, float *w,
                              double *scratch, exr_wpost *post, exr_status *st)
{
    EXR_ASSERT_LOCKED(b);
    for (int tries = 0; *idx == SIZE_MAX || !pick_visible_locked(b, *idx); tries++) {
        if (tries == 64)
            return 0;
        if ((*st = sample_locked(b, s, 1, idx, w, scratch, post)) != EXR_OK)
            return -1;
    }
    return 1;
}

/* Draws again every pick of idx that is not published yet. 0 if some pick
 * still is not after 64 draws, or the selector cannot draw. */
static int redraw_unpublished_locked(exr_buffer *b, exr_selector *s, size_t count, size_t *idx,
                                     float *w, double *scratch, exr_wpost *post)
{
    exr_status st;
    for (size_t i = 0; i < count; i++)
        if (redraw_pick_locked(b, s, &idx[i], &w[i], scratch, post, &st) != 1)
            return 0;
    return 1;
}

/* A draw without the storage lock (draw_detached, made only when
 * exclusive holds came since the selector's last draw: exr_sel_detach)
 * makes this many draws beyond the batch's, from the same tree: a drawn
 * pick found gone at the check is replaced by the next extra one still
 * there, instead of being drawn again under the lock and mu. */
#define EXTRA_MAX 16
static size_t extra_draws(size_t count)
{
    size_t k = 1 + count / 64;
    return k < EXTRA_MAX ? k : EXTRA_MAX;
}

/* Per-call scratch: on the stack for small batches (most calls), on the
 * heap beyond. idx, scratch, ents and w have room for EXTRA_MAX more; a
 * heap w is allocated by the detached draw, the only one that uses it. */
#define SMALL_BATCH 64
typedef struct {
    size_t *idx;
    plan_t *plans;
    double *scratch;
    exr_pick *ents; /* the drawn picks' entries (gather_entries_locked) */
    float *w;       /* a detached draw's weights (or leaves), extras included; NULL: not yet */
    bool have_ents; /* ents filled by the draw already (draw_detached) */
    bool exact;     /* idx are the table's indices of ents now (note_drawn_locked) */
    uint64_t moves0; /* else they were after this count of moves */
    exr_wpost post; /* the weights' last step, after the lock (sample_locked) */
    size_t small_idx[SMALL_BATCH + EXTRA_MAX];
    plan_t small_plans[SMALL_BATCH];
    double small_scratch[SMALL_BATCH + EXTRA_MAX];
    exr_pick small_ents[SMALL_BATCH + EXTRA_MAX];
    float small_w[SMALL_BATCH + EXTRA_MAX];
} batch_scratch;

static void scratch_free(batch_scratch *s)
{
    if (s->idx == s->small_idx)
        return;
    free(s->idx);
    free(s->plans);
    free(s->scratch);
    free(s->ents);
    free(s->w);
}

static exr_status scratch_alloc(batch_scratch *s, size_t count)
{
    s->post.fn = NULL;
    s->have_ents = false;
    s->exact = true;
    s->moves0 = 0;
    if (count <= SMALL_BATCH) {
        s->idx = s->small_idx;
        s->plans = s->small_plans;
        s->scratch = s->small_scratch;
        s->ents = s->small_ents;
        s->w = s->small_w;
        return EXR_OK;
    }
    size_t n = count + EXTRA_MAX, a, p;
    if (n < count || !exr_mul_size(n, sizeof(size_t), &a) ||
        !exr_mul_size(count, sizeof(plan_t), &p))
        return EXR_EOVERFLOW;
    s->idx = malloc(a);
    s->plans = malloc(p);
    s->scratch = malloc(n * sizeof(double));
    s->ents = malloc(n * sizeof(exr_pick));
    s->w = NULL;
    if (!s->idx || !s->plans || !s->scratch || !s->ents) {
        scratch_free(s); /* s->idx is not the stack's: each is freed */
        return EXR_ENOMEM;
    }
    return EXR_OK;
}

/* Whether a batch's rows must come from beyond L2: COLD when the rows and
 * the pick table together exceed about half of a core's L2 (the batch's
 * output shares it), FAR when they exceed 8 MiB (a share of L3: the rows
 * mostly come from memory). When cold the plan walks its chain with
 * prefetches and the copy prefetches the rows of the picks ahead; when far
 * the plan prefetches the rows too. Below, those prefetches find everything
 * in cache and only cost instructions (benchmarks/c/phases.c: ~4 ns a pick
 * in the copy and ~1.7 in the plan at N = 2048). */
static batch_heat batch_heat_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    uint64_t bytes = b->n_records * b->lay.row_bytes + b->picks.n * sizeof(exr_pick);
    return bytes > ((uint64_t)8 << 20) ? FAR : bytes > ((uint64_t)1 << 20) ? COLD : WARM;
}

/* A batch of at most SMALL_BATCH picks whose rows come to at most this
 * many bytes is copied under the shared hold in which it was planned: a
 * pin and an unpin (pin_mu twice, the readers' list, the graveyard's epoch)
 * cost more than such a copy, which keeps writers out for less than a
 * microsecond (32 picks of 28-byte rows, pick_len 1: 1.8 KiB). Larger
 * batches copy without the lock, pinned. */
#define HOLD_COPY_BYTES ((size_t)16 << 10)

static bool copy_under_hold(const exr_buffer *b, size_t count)
{
    size_t rows = count * (b->cfg.pick_len + 1); /* count <= 64: fits */
    return count <= SMALL_BATCH && (!rows || b->lay.row_bytes <= HOLD_COPY_BYTES / rows);
}

/* The weights' last step, when the draw left one (sample_locked): with
 * the lock let go. */
static void weights_after_lock(const batch_scratch *sc, size_t count, exr_batch_out *out)
{
    if (sc->post.fn)
        sc->post.fn(&sc->post, count, out->weight);
}

/* Plans under the lock, copies under it (copy_under_hold) or without it,
 * and lets go of it. ph (NULL: not wanted) gets the time of each phase. */
static exr_status finish_batch(exr_buffer *b, size_t count, batch_scratch *sc,
                               exr_batch_out *out, exr_batch_phases *ph)
{
    exr_reader me;
    uint64_t t0 = ph ? exr_now_ns() : 0;
    batch_heat heat = batch_heat_locked(b);
    plan_batch_locked(b, count, sc->idx, sc->ents, sc->have_ents, sc->plans, out, heat);
    note_drawn_locked(b, count, sc->idx, sc->ents, sc->exact, sc->moves0, out);
    bool hold = copy_under_hold(b, count);
    if (!hold) {
        pin_locked(b, &me);
        exr_buffer_unlock(b);
        weights_after_lock(sc, count, out);
    }
    uint64_t t1 = ph ? exr_now_ns() : 0;
    copy_batch(b, count, sc->plans, out, heat != WARM && !small_rows(b, count));
    if (hold) {
        exr_buffer_unlock(b);
        weights_after_lock(sc, count, out);
    } else {
        unpin(b, &me);
    }
    scratch_free(sc);
    if (ph) {
        uint64_t t2 = exr_now_ns();
        ph->plan_ns = t1 - t0;
        ph->copy_ns = t2 - t1;
    }
    return EXR_OK;
}

/* A field plan stays in the state and extras parts of a row (a state field,
 * with next states or shared ones, in the state part), and a buffer with
 * extras needs one. */
static bool out_ok(const exr_buffer *b, const exr_batch_out *out)
{
    const exr_store_layout *L = &b->lay;
    if (L->extra_bytes && !out->fields)
        return false;
    size_t xs = L->state_bytes + L->action_bytes + L->reward_bytes;
    for (size_t f = 0; out->fields && f < out->nfields; f++) {
        const exr_field_dst *fd = &out->fields[f];
        size_t end;
        if (!exr_add_size(fd->off, fd->bytes, &end) || (fd->seq && fd->next) ||
            !(end <= L->state_bytes ||
              (!fd->next && !fd->seq && fd->off >= xs && end <= L->row_bytes)))
            return false;
    }
    return true;
}

/* Selector e's draws into sc->idx and out->weight (or what sc->post turns
 * into the weights after the lock: sample_locked), a pick not published
 * yet drawn again. Lock held shared. 1: drawn, *st the status; 0: (nearly)
 * every pick drawn is still being copied in (wait for a publish, draw
 * again); -1 (only if nowait): the selector's mutex is taken, nothing drawn. */
static int draw_locked(exr_buffer *b, sel_entry *e, size_t count, batch_scratch *sc,
                       exr_batch_out *out, bool nowait, exr_status *st)
{
    pthread_mutex_t *mu = &e->sel->mu;
    if (!nowait)
        exr_sel_take(e->sel);
    else if (pthread_mutex_trylock(mu) != 0)
        return -1;
    sc->have_ents = false;
    sc->exact = true;
    exr_sel_seen(e->sel, b->eps.seq);
    *st = sample_locked(b, e->sel, count, sc->idx, out->weight, sc->scratch, &sc->post);
    int done = *st != EXR_OK || !__atomic_load_n(&b->writers, __ATOMIC_ACQUIRE) ||
               redraw_unpublished_locked(b, e->sel, count, sc->idx, out->weight, sc->scratch,
                                         &sc->post);
    pthread_mutex_unlock(mu);
    return done;
}

/* Whether pick id, drawn from a selector with every hold up to number r0
 * applied (draw_detached), is in the table and published now. Its slot
 * holds the episode it held then if that was filled at or before hold r0
 * (exr_episode.fill): the picks of any episode before it there had left
 * the selector by then. Lock held. */
static inline bool still_there_locked(const exr_buffer *b, exr_pick id, uint64_t r0)
{
    EXR_ASSERT_LOCKED(b);
    if (id.slot >= b->eps.hwm)
        return false;
    const exr_episode *e = &b->eps.slab[id.slot];
    if (e->handle < 0 || e->fill > r0 || id.pos >= e->m)
        return false;
    return !__atomic_load_n(&e->busy, __ATOMIC_ACQUIRE) || id.pos < e->body->m_pub;
}

/* Draws again, one at a time, each pick whose index is SIZE_MAX (gone, or
 * not published), until it is published (a draw conditioned on the
 * published picks), and takes its entry from the table. The weights'
 * floor (post->lo: the smallest leaf) is the smaller of the two draws'.
 * Lock held shared. Returns as draw_locked: 0 if some pick still is not
 * published after 64 draws; 1 with *st EXR_EEMPTY if nothing can be drawn
 * any more. */
static int redraw_gone_locked(exr_buffer *b, exr_selector *s, size_t count, batch_scratch *sc,
                              float *w, exr_status *st)
{
    exr_wpost first = sc->post;
    int r = 1;
    exr_sel_take(s);
    for (size_t i = 0; i < count; i++) {
        if (sc->idx[i] != SIZE_MAX)
            continue; /* there, and published */
        int got = redraw_pick_locked(b, s, &sc->idx[i], &w[i], sc->scratch, &sc->post, st);
        if (got != 1) {
            r = got == 0 ? 0 : 1; /* -1: *st says why nothing can be drawn */
            break;
        }
        sc->ents[i] = b->picks.v[sc->idx[i]];
    }
    pthread_mutex_unlock(&s->mu);
    if (first.fn && sc->post.fn && first.lo < sc->post.lo)
        sc->post.lo = first.lo;
    return r;
}

#ifdef EXR_DEBUG_LOCKS
void (*exr_debug_detached)(exr_buffer *b, int phase);
_Atomic uint64_t exr_debug_extras_used;
#endif

/* Prefetches the episode slot of drawn pick ents[i], if i < count and the
 * slot is within the slab (draw_detached). */
static inline void prefetch_slot(const exr_buffer *b, const exr_pick *ents, size_t i,
                                 size_t count)
{
    if (i < count && ents[i].slot < b->eps.hwm)
        __builtin_prefetch(&b->eps.slab[ents[i].slot]);
}

/* Whether drawn pick id is in the table and published now: same, no hold
 * since the draw (it is the table's entry at its index); else drawn from
 * a selector with every hold up to number r0 applied (still_there_locked). */
static inline bool drawn_ok_locked(const exr_buffer *b, exr_pick id, bool same, uint64_t r0)
{
    return same ? ent_visible_locked(b, id) : still_there_locked(b, id, r0);
}

/* The check of a detached draw's count picks, made with `extra` more:
 * each pick gone is replaced by the next extra one still there (a draw
 * of the same tree, conditioned as the batch's are on being there), or,
 * the extras used up, marked SIZE_MAX; their weights (or leaves) w. Each
 * pick's slot is read at random (and was likely written by a record call
 * on another core since): prefetched PF picks ahead, so that the misses
 * overlap rather than come one after another. Returns how many are
 * marked. Lock held. */
static size_t check_drawn_locked(const exr_buffer *b, batch_scratch *sc, size_t count,
                                 size_t extra, bool same, uint64_t r0)
{
    enum { PF = 16 };
    size_t gone = 0, next = count, n = count + extra;
    for (size_t i = 0; i < PF; i++)
        prefetch_slot(b, sc->ents, i, count);
    for (size_t i = 0; i < count; i++) {
        prefetch_slot(b, sc->ents, i + PF, count);
#ifdef EXR_DEBUG_LOCKS
        /* same: no hold since the draw, so each drawn pick is the table's
         * entry at its index (its slot already in ents) */
        if (same && (sc->idx[i] >= b->picks.n || b->picks.v[sc->idx[i]].slot != sc->ents[i].slot ||
                     b->picks.v[sc->idx[i]].pos != sc->ents[i].pos)) {
            fprintf(stderr, "draw_detached: pick %zu is not the table's entry\n", sc->idx[i]);
            abort();
        }
#endif
        if (drawn_ok_locked(b, sc->ents[i], same, r0))
            continue;
        while (next < n && !drawn_ok_locked(b, sc->ents[next], same, r0))
            next++;
        if (next == n) {
            sc->idx[i] = SIZE_MAX;
            gone++;
            continue;
        }
        sc->idx[i] = sc->idx[next];
        sc->ents[i] = sc->ents[next];
        sc->w[i] = sc->w[next++];
#ifdef EXR_DEBUG_LOCKS
        exr_debug_extras_used++;
#endif
    }
    return gone;
}

/* Selector e's draws, as draw_locked, but with the storage lock let go
 * while the selector draws (selector.h, sample_detached): mu is taken
 * under the lock, which is let go, and taken again (shared) after the
 * draw. If no exclusive hold came in between, the draws are the table's
 * picks; else each is checked (check_drawn_locked), replaced by an extra
 * draw if it has gone, or drawn again if those run out. A pick still there
 * keeps the index it had in the selector (pick_index: a hint, which
 * set_priority checks). Lock held shared on entry and on return. */
static int draw_detached(exr_buffer *b, int64_t h, sel_entry *e, size_t count,
                         batch_scratch *sc, exr_batch_out *out, exr_status *st)
{
    exr_selector *s = e->sel;
    /* count + EXTRA_MAX fits: scratch_alloc checked it */
    if (!sc->w && !(sc->w = malloc((count + EXTRA_MAX) * sizeof *sc->w))) {
        *st = EXR_ENOMEM;
        return 1;
    }
    EXR_TM_NOW(t0);
    exr_sel_take(s);
    EXR_TM_SINCE(EXR_TM_DRAW_MU, t0);
    if (!exr_sel_start_detached(s, b->picks.n, b->picks.v, b->eps.seq)) {
        pthread_mutex_unlock(&s->mu); /* no memory to keep its picks: under the lock */
        return draw_locked(b, e, count, sc, out, false, st);
    }
    uint64_t r0 = b->eps.seq;
    sc->moves0 = b->moves; /* the selector, drawn below, is at or past it */
    bool any = b->picks.n != 0;
    /* a hold came since the last draw (exr_sel_detach): a writer is at work */
    size_t extra = extra_draws(count);
    exr_sel_seen(s, r0);
    exr_buffer_unlock(b);
    EXR_TM_NOW(t1);
    *st = any ? s->vt->sample_detached(s, count, extra, sc->idx, sc->ents, sc->w, sc->scratch,
                                       &sc->post)
              : EXR_EEMPTY;
    EXR_TM_SINCE(EXR_TM_DRAW_SAMPLE, t1);
#ifdef EXR_DEBUG_LOCKS
    if (exr_debug_detached) /* a test's holds, while the selector is drawn */
        exr_debug_detached(b, 0);
#endif
    pthread_mutex_unlock(&s->mu);
#ifdef EXR_DEBUG_LOCKS
    if (exr_debug_detached) /* and between the draw and its check */
        exr_debug_detached(b, 1);
#endif
    EXR_TM_NOW(t2);
    lock_shared(b);
    EXR_TM_SINCE(EXR_TM_DRAW_RELOCK, t2);
    if (*st == EXR_OK && !find_sel(b, h))
        *st = EXR_ENOTFOUND; /* removed meanwhile: s is gone */
    if (*st != EXR_OK)
        return 1;
    sc->have_ents = true;
    bool same = b->eps.seq == r0;
    sc->exact = same; /* else a pick still there keeps its old index: a hint */
    EXR_TM_NOW(t3);
    bool look = !same || __atomic_load_n(&b->writers, __ATOMIC_ACQUIRE);
    size_t gone = look ? check_drawn_locked(b, sc, count, extra, same, r0) : 0;
    memcpy(out->weight, sc->w, count * sizeof *out->weight);
    int r = gone ? redraw_gone_locked(b, s, count, sc, out->weight, st) : 1;
    EXR_TM_SINCE(EXR_TM_DRAW_CHECK, t3);
    return r;
}

exr_status exr_buffer_get_batch_phases(exr_buffer *b, int64_t h, size_t count,
                                       exr_batch_out *out, exr_batch_phases *ph)
{
    if (!out_ok(b, out))
        return EXR_EINVAL;
    uint64_t t0 = ph ? exr_now_ns() : 0;
    batch_scratch sc;
    exr_status st = scratch_alloc(&sc, count);
    if (st != EXR_OK)
        return st;
    lock_shared(b);
    for (;;) {
        uint64_t seq = publish_seq(b); /* before the draw looks at busy */
        sel_entry *e = find_sel(b, h);
        if (!e) {
            st = EXR_ENOTFOUND;
            break;
        }
        int r = exr_sel_detach(e->sel, b->excl_owner, b->eps.seq)
                    ? draw_detached(b, h, e, count, &sc, out, &st)
                    : draw_locked(b, e, count, &sc, out, false, &st);
        if (r == 1)
            break;
        wait_publish_since(b, true, seq);
    }
    if (st != EXR_OK) {
        exr_buffer_unlock(b);
        scratch_free(&sc);
        return st;
    }
    if (ph)
        ph->draw_ns = exr_now_ns() - t0;
    return finish_batch(b, count, &sc, out, ph);
}

exr_status exr_buffer_get_batch(exr_buffer *b, int64_t h, size_t count, exr_batch_out *out)
{
    return exr_buffer_get_batch_phases(b, h, count, out, NULL);
}

exr_status exr_buffer_get_batch_nowait(exr_buffer *b, int64_t h, size_t count,
                                       exr_batch_out *out, bool *done)
{
    *done = false;
    if (!copy_under_hold(b, count) || !out_ok(b, out) || !try_lock_shared(b))
        return EXR_OK;
    batch_scratch sc;
    (void)scratch_alloc(&sc, count); /* on the stack: cannot fail */
    exr_status st = EXR_ENOTFOUND;
    sel_entry *e = find_sel(b, h);
    int r = e ? draw_locked(b, e, count, &sc, out, true, &st) : 1;
    if (r != 1 || st != EXR_OK) {
        exr_buffer_unlock(b);
        *done = r == 1;
        return r == 1 ? st : EXR_OK;
    }
    *done = true;
    return finish_batch(b, count, &sc, out, NULL);
}

exr_status exr_buffer_gather(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                             const int64_t *pos, exr_batch_out *out)
{
    if (!out_ok(b, out))
        return EXR_EINVAL;
    batch_scratch sc;
    exr_status st = scratch_alloc(&sc, count);
    if (st != EXR_OK)
        return st;
    lock_shared(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        st = EXR_ENOTFOUND;
    for (size_t i = 0; st == EXR_OK && i < count; i++) {
        sc.idx[i] = pick_index_locked(b, epi[i], pos[i]);
        if (sc.idx[i] == SIZE_MAX || !pick_visible_locked(b, sc.idx[i]))
            st = EXR_ENOTFOUND;
    }
    if (st != EXR_OK) {
        exr_buffer_unlock(b);
        scratch_free(&sc);
        return st;
    }
    exr_sel_take(e->sel);
    e->sel->vt->weights(e->sel, b->picks.n, count, sc.idx, out->weight);
    pthread_mutex_unlock(&e->sel->mu);
    return finish_batch(b, count, &sc, out, NULL);
}
