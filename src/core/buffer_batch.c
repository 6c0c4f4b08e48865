/*
 * buffer_batch.c - get_batch and gather: picks drawn by a selector (or named), their
 * rows located under the lock, then copied (batch_copy.c) without it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

static void plan_pick_locked(exr_buffer *b, const exr_pick *pk, plan_t *pl, int64_t *epi,
                             int64_t *pos, int64_t *len, int64_t *len_next)
{
    EXR_ASSERT_LOCKED(b);
    const exr_store_layout *L = &b->lay;
    exr_episode *e = &b->eps.slab[pk->slot];
    /* only written when it changes: the line stays clean. Atomic: samplers
     * plan under the shared lock; eviction reads it under the exclusive one */
    if (!__atomic_load_n(&e->sampled, __ATOMIC_RELAXED))
        __atomic_store_n(&e->sampled, 1, __ATOMIC_RELAXED);
    uint64_t p = pk->pos, c = complete_steps(e);
    uint64_t l = c - p < b->cfg.pick_len ? c - p : b->cfg.pick_len;
    size_t k, off;
    exr_store_locate(L, p, &k, &off);
    exr_body *body = e->body;
    size_t na = exr_store_seg_cap(L, k) - off;
    pl->a = exr_seg_row(L, body->segs[k], off);
    pl->na = (uint32_t)(na < l + 1 ? na : l + 1);
    pl->b = k + 1 < body->nsegs && na < l + 1 ? body->segs[k + 1] : NULL;
    pl->len = (uint32_t)l;
    pl->next_stored = p + l < e->n;
    pl->final = body->final_state;
    *epi = e->handle;
    *pos = (int64_t)p;
    *len = (int64_t)l;
    *len_next = (int64_t)l - (e->terminated && p + l == e->n);
}

/* Resolves the chosen picks idx[0..count) into plans and metadata, and marks
 * their episodes sampled. Lock held. */
static void plan_batch_locked(exr_buffer *b, size_t count, const size_t *idx, plan_t *plans,
                              exr_batch_out *out)
{
    EXR_ASSERT_LOCKED(b);
    /* First pass touches the pick table and prefetches the episode slots;
     * second resolves: the misses of different picks overlap. */
    enum { D = 8 };
    for (size_t i = 0; i < count && i < D; i++)
        __builtin_prefetch(&b->picks.v[idx[i]]);
    for (size_t i = 0; i < count; i++) {
        if (i + D < count)
            __builtin_prefetch(&b->picks.v[idx[i + D]]);
        __builtin_prefetch(&b->eps.slab[b->picks.v[idx[i]].slot]);
    }
    for (size_t i = 0; i < count; i++)
        plan_pick_locked(b, &b->picks.v[idx[i]], &plans[i], &out->pick_epi[i],
                         &out->pick_pos[i], &out->seq_len[i], &out->seq_len_next[i]);
    if (out->pick_index)
        for (size_t i = 0; i < count; i++)
            out->pick_index[i] = (int64_t)idx[i];
}

/* Whether the pick at table index i is published: not entered by a record
 * call still copying its rows. */
static inline bool pick_visible_locked(const exr_buffer *b, size_t i)
{
    EXR_ASSERT_LOCKED(b);
    const exr_pick *pk = &b->picks.v[i];
    const exr_episode *e = &b->eps.slab[pk->slot];
    return !e->busy || pk->pos < e->m_pub;
}

/* Draws again, one at a time, every pick of idx that is not published yet
 * (a draw conditioned on the published picks). 0 if some pick still is not
 * after 64 draws, or the selector cannot draw. */
static int redraw_unpublished_locked(exr_buffer *b, exr_selector *s, size_t count, size_t *idx,
                                     float *w, double *scratch)
{
    EXR_ASSERT_LOCKED(b);
    for (size_t i = 0; i < count; i++)
        for (int tries = 0; !pick_visible_locked(b, idx[i]); tries++)
            if (tries == 64 || s->vt->sample(s, b->picks.n, 1, &idx[i], &w[i], scratch) != EXR_OK)
                return 0;
    return 1;
}

/* Per-call scratch: on the stack for small batches (most calls), on the
 * heap beyond. */
#define SMALL_BATCH 64
typedef struct {
    size_t *idx;
    plan_t *plans;
    double *scratch;
    size_t small_idx[SMALL_BATCH];
    plan_t small_plans[SMALL_BATCH];
    double small_scratch[SMALL_BATCH];
} batch_scratch;

static exr_status scratch_alloc(batch_scratch *s, size_t count)
{
    if (count <= SMALL_BATCH) {
        s->idx = s->small_idx;
        s->plans = s->small_plans;
        s->scratch = s->small_scratch;
        return EXR_OK;
    }
    size_t a, p;
    if (!exr_mul_size(count, sizeof(size_t), &a) || !exr_mul_size(count, sizeof(plan_t), &p))
        return EXR_EOVERFLOW;
    s->idx = malloc(a);
    s->plans = malloc(p);
    s->scratch = malloc(count * sizeof(double));
    if (!s->idx || !s->plans || !s->scratch) {
        free(s->idx);
        free(s->plans);
        free(s->scratch);
        return EXR_ENOMEM;
    }
    return EXR_OK;
}

static void scratch_free(batch_scratch *s)
{
    if (s->idx == s->small_idx)
        return;
    free(s->idx);
    free(s->plans);
    free(s->scratch);
}

/* Plans under the lock, copies without it. */
static exr_status finish_batch(exr_buffer *b, size_t count, batch_scratch *sc,
                               exr_batch_out *out)
{
    exr_reader me;
    plan_batch_locked(b, count, sc->idx, sc->plans, out);
    pin_locked(b, &me);
    exr_buffer_unlock(b);
    copy_batch(b, count, sc->plans, out);
    unpin(b, &me);
    scratch_free(sc);
    return EXR_OK;
}

/* A field plan stays in the state and extras parts of a row (a state field,
 * with next states, in the state part), and a buffer with extras needs one. */
static bool out_ok(const exr_buffer *b, const exr_batch_out *out)
{
    const exr_store_layout *L = &b->lay;
    if (L->extra_bytes && !out->fields)
        return false;
    size_t xs = L->state_bytes + L->action_bytes + L->reward_bytes;
    for (size_t f = 0; out->fields && f < out->nfields; f++) {
        const exr_field_dst *fd = &out->fields[f];
        size_t end;
        if (!exr_add_size(fd->off, fd->bytes, &end) ||
            !(end <= L->state_bytes || (!fd->next && fd->off >= xs && end <= L->row_bytes)))
            return false;
    }
    return true;
}

exr_status exr_buffer_get_batch(exr_buffer *b, int64_t h, size_t count, exr_batch_out *out)
{
    if (!out_ok(b, out))
        return EXR_EINVAL;
    batch_scratch sc;
    exr_status st = scratch_alloc(&sc, count);
    if (st != EXR_OK)
        return st;
    lock_shared(b);
    for (;;) {
        sel_entry *e = find_sel(b, h);
        if (!e) {
            st = EXR_ENOTFOUND;
            break;
        }
        pthread_mutex_lock(&e->sel->mu);
        st = e->sel->vt->sample(e->sel, b->picks.n, count, sc.idx, out->weight, sc.scratch);
        int done = st != EXR_OK || !b->writers ||
                   redraw_unpublished_locked(b, e->sel, count, sc.idx, out->weight, sc.scratch);
        pthread_mutex_unlock(&e->sel->mu);
        if (done)
            break;
        /* (nearly) every pick drawn is still being copied: wait for a publish */
        wait_publish(b, true);
    }
    if (st != EXR_OK) {
        exr_buffer_unlock(b);
        scratch_free(&sc);
        return st;
    }
    return finish_batch(b, count, &sc, out);
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
    pthread_mutex_lock(&e->sel->mu);
    e->sel->vt->weights(e->sel, b->picks.n, count, sc.idx, out->weight);
    pthread_mutex_unlock(&e->sel->mu);
    return finish_batch(b, count, &sc, out);
}
