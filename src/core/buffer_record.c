/*
 * buffer_record.c - recording: new episodes, and record calls that reserve their rows
 * under the lock, copy them (under the lock or without it) and publish.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

static float prio_to_float(double p)
{
    if (isnan(p))
        return NAN;
    return p > FLT_MAX ? FLT_MAX : (float)p;
}

exr_status exr_buffer_new_episode_locked(exr_buffer *b, int64_t *h)
{
    if (b->next_handle >= EXR_MAX_HANDLE)
        return EXR_EOVERFLOW;
    exr_status st = exr_episodes_reserve(&b->eps);
    if (st != EXR_OK)
        return st;
    exr_body *body = exr_body_new(4);
    if (!body)
        return EXR_ENOMEM;
    *h = b->next_handle++;
    exr_episodes_insert(&b->eps, *h, body);
    return EXR_OK;
}

/* Rows a new last segment k starts with. Segment k > 0 has the nominal size
 * right away: that is about the rows the episode already holds, so it never
 * more than doubles what the episode takes, and allocating it once avoids
 * the copies (and the heap churn) of growing it. Segment 0's nominal size
 * follows pick_len, not the episode, so it starts at 16 rows and doubles. */
static size_t first_rows(const exr_store_layout *L, size_t k)
{
    size_t cap = exr_store_seg_cap(L, k);
    return k > 0 || cap < 16 ? cap : 16;
}

/* After an episode ends: its last segment and aux shrink to what they hold,
 * when that frees at least 1 KiB. Best effort: on failure nothing changes. */
static void shrink_ended_locked(exr_buffer *b, exr_episode *e)
{
    const exr_store_layout *L = &b->lay;
    exr_body *body = e->body;
    if (e->n && e->n < body->aux_cap) {
        uint32_t *aux = realloc(body->aux, e->n * sizeof *aux);
        if (aux) {
            body->aux = aux;
            body->aux_cap = e->n;
        }
    }
    if (!body->nsegs)
        return;
    size_t k, off;
    exr_store_locate(L, e->n - 1, &k, &off);
    size_t used = off + 1, spare = body->last_rows - used;
    if (spare * L->row_bytes < 1024)
        return;
    unsigned char *seg = exr_store_seg_alloc(L, used);
    exr_dead *node = malloc(sizeof *node);
    if (!seg || !node) {
        free(seg);
        free(node);
        return;
    }
    memcpy(seg, body->segs[k], used * L->row_bytes);
    bury_segment(b, body->segs[k], node);
    body->segs[k] = seg;
    body->last_rows = (uint32_t)used;
}

/* ---- recording: reserve, copy, publish ---------------------------------
 *
 * A record call reserves its rows under the lock: every allocation, the
 * records' bookkeeping (counts, flags, priorities, picks entered into the
 * table and the selectors) and the eviction it causes, step by step exactly
 * as single records would do it. The rows' bytes are copied after that. A
 * small call copies them under the same lock hold; a large one marks its
 * episode busy, pins what it writes into (as get_batch pins what it reads),
 * copies with no lock held, then publishes: clears busy under the lock.
 *
 * While an episode is busy, get_batch skips its picks entered by the call
 * (positions >= m_pub; they are drawn again), episode() shows its first
 * n_pub records, a second record call into it waits, and serialize waits.
 * Its eviction may go ahead: the body is parked until the copy ends. */

/* Rows a segment that must hold `need` rows grows to: doubling from `rows`,
 * as step-by-step growth does, at most its nominal size. */
static size_t grown_rows(const exr_store_layout *L, size_t k, size_t rows, size_t need)
{
    size_t cap = exr_store_seg_cap(L, k);
    while (rows < need && rows < cap)
        rows *= 2;
    return rows < cap ? rows : cap;
}

/* The rows a last segment of `rows` holding `used` gets when the call ends
 * the episode: `used` if the end would cut the spare (shrink_ended_locked),
 * so that the cut, a copy of every row, is not needed. */
static size_t exact_rows(const exr_store_layout *L, size_t rows, size_t used, bool ends)
{
    return ends && (rows - used) * L->row_bytes >= 1024 ? used : rows;
}

/* What recording T steps into one episode allocates, made before anything
 * visible changes. */
typedef struct {
    exr_body *fresh;          /* body of a new episode, or NULL */
    unsigned char **segs;     /* new segments, nnew of them */
    size_t nnew, new_last_rows;
    unsigned char *grown;     /* replaces the last segment, or NULL */
    size_t grown_rows;
    exr_dead *node;           /* parks the replaced segment */
    unsigned char *fin;       /* final state, or NULL */
    unsigned char *segs_small[4];
} rec_prep;

static void prep_free(rec_prep *pr)
{
    for (size_t j = 0; pr->segs && j < pr->nnew; j++)
        free(pr->segs[j]);
    if (pr->segs != pr->segs_small)
        free(pr->segs);
    free(pr->grown);
    free(pr->node);
    free(pr->fin);
    exr_body_free(pr->fresh);
}

/* Allocates everything that recording T steps into episode slot (EXR_NIL:
 * a new one) needs. On failure the buffer is as it was (an existing
 * episode's aux or segment table may have grown: room, not content). */
static exr_status prepare_locked(exr_buffer *b, uint32_t slot, size_t T, bool ends, bool want_fin,
                                 rec_prep *pr)
{
    const exr_store_layout *L = &b->lay;
    exr_status st = EXR_ENOMEM;
    memset(pr, 0, sizeof *pr);
    exr_body *body;
    uint64_t n = 0;
    if (slot == EXR_NIL) {
        if (b->next_handle >= EXR_MAX_HANDLE)
            return EXR_EOVERFLOW;
        st = exr_episodes_reserve(&b->eps);
        if (st != EXR_OK)
            return st;
        body = pr->fresh = exr_body_new(4);
        if (!body)
            return EXR_ENOMEM;
        st = EXR_ENOMEM;
    } else {
        body = b->eps.slab[slot].body;
        n = b->eps.slab[slot].n;
    }
    if (n > (uint64_t)UINT32_MAX - 1 || T > (uint64_t)UINT32_MAX - 1 - n) {
        st = EXR_EOVERFLOW;
        goto fail;
    }
    uint64_t end = n + T;
    if (end > body->aux_cap) {
        /* aux is read only under the lock, so it may move */
        uint64_t cap = body->aux_cap ? body->aux_cap : 16;
        while (cap < end)
            cap *= 2;
        if (ends)
            cap = end; /* what the end would shrink it to */
        uint32_t *aux = realloc(body->aux, cap * sizeof *aux);
        if (!aux)
            goto fail;
        body->aux = aux;
        body->aux_cap = cap;
    }
    size_t k_last, off_last;
    exr_store_locate(L, end - 1, &k_last, &off_last);
    if (k_last >= body->cap) {
        uint32_t c = body->cap;
        while (c <= k_last)
            c *= 2;
        exr_body *g = exr_body_grow(body, c);
        if (!g)
            goto fail;
        body = g;
        if (pr->fresh)
            pr->fresh = g;
        else
            b->eps.slab[slot].body = g; /* same content, new place */
    }
    if (body->nsegs) {
        /* the last segment, allocated smaller than it must now hold */
        size_t k = body->nsegs - 1;
        size_t need = k < k_last ? exr_store_seg_cap(L, k) : off_last + 1;
        if (need > body->last_rows) {
            pr->grown_rows = exact_rows(L, grown_rows(L, k, body->last_rows, need), need,
                                        ends && k == k_last);
            if (!(pr->node = malloc(sizeof *pr->node)))
                goto fail;
            if (!(pr->grown = seg_alloc_locked(b, pr->grown_rows)))
                goto fail;
        }
    }
    if (k_last + 1 > body->nsegs) {
        pr->nnew = k_last + 1 - body->nsegs;
        pr->segs = pr->nnew <= 4 ? pr->segs_small : calloc(pr->nnew, sizeof *pr->segs);
        if (!pr->segs)
            goto fail;
        for (size_t j = 0; j < pr->nnew; j++) {
            size_t k = body->nsegs + j;
            size_t rows = k < k_last ? exr_store_seg_cap(L, k)
                                     : exact_rows(L, grown_rows(L, k, first_rows(L, k), off_last + 1),
                                                  off_last + 1, ends);
            if (!(pr->segs[j] = seg_alloc_locked(b, rows)))
                goto fail;
            pr->new_last_rows = rows;
        }
    }
    if (want_fin && !(pr->fin = malloc(L->state_bytes)))
        goto fail;
    size_t extra;
    if (!exr_add_size(T, b->cfg.pick_len, &extra)) {
        st = EXR_EOVERFLOW;
        goto fail;
    }
    st = reserve_picks(b, extra);
    if (st != EXR_OK)
        goto fail;
    return EXR_OK;
fail:
    prep_free(pr);
    return st;
}

/* Puts the prepared segments (and a new episode) in place; cannot fail. */
static uint32_t commit_prep_locked(exr_buffer *b, uint32_t slot, rec_prep *pr, int64_t *h)
{
    const exr_store_layout *L = &b->lay;
    if (pr->fresh) {
        *h = b->next_handle++;
        slot = exr_episodes_insert(&b->eps, *h, pr->fresh);
        pr->fresh = NULL;
    }
    exr_episode *e = &b->eps.slab[slot];
    exr_body *body = e->body;
    if (pr->grown) {
        size_t k = body->nsegs - 1, kk, off, valid = 0;
        if (e->n) {
            exr_store_locate(L, e->n - 1, &kk, &off);
            valid = kk == k ? off + 1 : 0;
        }
        memcpy(pr->grown, body->segs[k], valid * L->row_bytes);
        bury_segment(b, body->segs[k], pr->node);
        body->segs[k] = pr->grown;
        body->last_rows = (uint32_t)pr->grown_rows;
        pr->grown = NULL;
        pr->node = NULL;
    }
    for (size_t j = 0; j < pr->nnew; j++)
        body->segs[body->nsegs++] = pr->segs[j];
    if (pr->nnew)
        body->last_rows = (uint32_t)pr->new_last_rows;
    if (pr->segs != pr->segs_small)
        free(pr->segs);
    pr->segs = NULL;
    pr->nnew = 0;
    return slot;
}

/* Copies steps [t0, t0 + count) of in into rows [pos, pos + count) of body. */
static void copy_rows(const exr_store_layout *L, exr_body *body, uint64_t pos, const exr_steps *in,
                      size_t t0, size_t count)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes;
    const unsigned char *st = in->states, *ac = in->actions, *rw = in->rewards;
    for (size_t i = 0; i < count;) {
        size_t k, off;
        exr_store_locate(L, pos + i, &k, &off);
        size_t run = exr_store_seg_cap(L, k) - off;
        if (run > count - i)
            run = count - i;
        unsigned char *row = exr_seg_row(L, body->segs[k], off);
        if (in->fields) {
            /* named fields: each straight from its own array (fields.h) */
            for (size_t r = 0; r < run; r++, row += L->row_bytes) {
                size_t t = t0 + i + r;
                for (size_t f = 0; f < in->nfields; f++) {
                    const exr_field_src *fs = &in->fields[f];
                    memcpy(row + fs->off, fs->src + t * fs->stride, fs->bytes);
                }
                memcpy(row + sb, ac + t * ab, ab);
                memcpy(row + sb + ab, rw + t * rb, rb);
            }
            i += run;
            continue;
        }
        for (size_t r = 0; r < run; r++, row += L->row_bytes) {
            size_t t = t0 + i + r;
            memcpy(row, st + t * sb, sb);
            memcpy(row + sb, ac + t * ab, ab);
            memcpy(row + sb + ab, rw + t * rb, rb);
        }
        i += run;
    }
}

/* What a record call leaves to copy and publish: steps [step, step + count)
 * of its input went to positions [first, first + count) of episode h (the
 * last one it recorded into; h = -1 if that one was evicted by the call). */
typedef struct {
    int64_t h;
    uint32_t slot;
    uint64_t first;
    size_t step, count;
} rec_plan;

/* The steps recorded as T single records would be. defer: the rows' bytes
 * are left for the caller to copy (the episode is marked busy); else they
 * are copied here. A failure leaves the buffer as it was, except after the
 * episode recorded into was itself evicted by this call: the steps before
 * the failing one then stay (the only case: it needs a second episode). */
static exr_status record_steps_locked(exr_buffer *b, int64_t h, const exr_steps *in, bool defer,
                                      rec_plan *plan, int64_t *out_h)
{
    const exr_store_layout *L = &b->lay;
    size_t t = 0;
    for (;;) {
        /* one pass per episode recorded into */
        uint32_t slot = exr_episodes_find(&b->eps, h);
        if (slot != EXR_NIL && b->eps.slab[slot].ended)
            slot = EXR_NIL;
        size_t t0 = t;
        rec_prep pr;
        exr_status st = prepare_locked(b, slot, in->T - t, in->end, in->end && in->final_state, &pr);
        if (st != EXR_OK)
            return st;
        slot = commit_prep_locked(b, slot, &pr, &h);
        exr_episode *e = &b->eps.slab[slot];
        uint64_t first = e->n;
        if (defer) {
            e->busy = 1;
            e->n_pub = e->n;
            e->m_pub = e->m;
        }
        bool evicted = false;
        while (t < in->T && !evicted) {
            exr_body *body = e->body;
            uint64_t n = e->n;
            bool last = t + 1 == in->T;
            if (!defer)
                copy_rows(L, body, n, in, t, 1);
            float rp = prio_to_float(in->priorities ? in->priorities[t] : NAN);
            memcpy(&body->aux[n], &rp, sizeof rp);
            e->n = n + 1;
            b->n_records++;
            const unsigned char *fin = NULL;
            if (last && in->end) {
                e->ended = 1;
                e->terminated = in->terminated;
                if (pr.fin) {
                    memcpy(pr.fin, in->final_state, L->state_bytes);
                    body->final_state = pr.fin;
                    fin = pr.fin;
                    pr.fin = NULL;
                }
            }
            if (b->hook) { /* the row is in place: never deferred with a hook */
                size_t k, off;
                exr_store_locate(L, n, &k, &off);
                b->hook(b->hook_ctx, b, h, n, exr_seg_row(L, body->segs[k], off), fin,
                        last && in->end, last && in->end && in->terminated);
            }
            enter_picks_locked(b, slot);
            if (last && in->end)
                shrink_ended_locked(b, e);
            evict_over_capacity_locked(b);
            evicted = b->eps.slab[slot].handle != h;
            t++;
        }
        free(pr.fin); /* unused when the episode was evicted before the end */
        if (t < in->T)
            continue; /* the rest starts a new episode */
        *out_h = h;
        *plan = (rec_plan){evicted ? -1 : h, slot, first, t0, in->T - t0};
        return EXR_OK;
    }
}

/* THE publish point of every record call: the rows of plan are visible to
 * get_batch, episode() and serialize from here on. Lock held. */
static void publish_locked(exr_buffer *b, const rec_plan *plan, bool deferred)
{
    if (deferred && plan->h >= 0) {
        uint32_t s = exr_episodes_find(&b->eps, plan->h);
        if (s != EXR_NIL)
            b->eps.slab[s].busy = 0;
    }
}

/* Waits (the lock released meanwhile) until no record call copies into
 * episode h, so that rollouts into one episode stay contiguous and in order. */
static void wait_not_busy_locked(exr_buffer *b, int64_t h)
{
    for (;;) {
        uint32_t s = exr_episodes_find(&b->eps, h);
        if (s == EXR_NIL || !b->eps.slab[s].busy)
            return;
        wait_publish(b, false);
    }
}

void exr_buffer_quiesce_locked(exr_buffer *b)
{
    while (b->writers)
        wait_publish(b, false);
}

/* A field copy plan must stay in the state and extras parts of a row, and
 * a buffer with extras must get one. */
static bool steps_ok(const exr_buffer *b, const exr_steps *in)
{
    const exr_store_layout *L = &b->lay;
    if (in->T == 0 || (L->extra_bytes && !in->fields))
        return false;
    size_t xs = L->state_bytes + L->action_bytes + L->reward_bytes;
    for (size_t f = 0; in->fields && f < in->nfields; f++) {
        const exr_field_src *fs = &in->fields[f];
        size_t end;
        if (!exr_add_size(fs->off, fs->bytes, &end) ||
            !(end <= L->state_bytes || (fs->off >= xs && end <= L->row_bytes)))
            return false;
    }
    return true;
}

exr_status exr_buffer_record_locked(exr_buffer *b, int64_t h, const exr_steps *in,
                                    int64_t *out_h)
{
    if (!steps_ok(b, in))
        return EXR_EINVAL;
    wait_not_busy_locked(b, h);
    rec_plan plan;
    exr_status st = record_steps_locked(b, h, in, false, &plan, out_h);
    if (st == EXR_OK)
        publish_locked(b, &plan, false);
    return st;
}

exr_status exr_buffer_record(exr_buffer *b, int64_t h, const exr_steps *in, int64_t *out_h)
{
    if (!steps_ok(b, in))
        return EXR_EINVAL;
    size_t bytes;
    bool defer = !exr_mul_size(in->T, b->lay.row_bytes, &bytes) || bytes >= EXR_COPY_UNLOCKED;
    exr_buffer_lock(b);
    /* The log's hook reads each row as it is committed, so a buffer with a
     * log attached copies under the lock (docs/design.md). */
    if (b->hook)
        defer = false;
    wait_not_busy_locked(b, h);
    rec_plan plan;
    exr_status st = record_steps_locked(b, h, in, defer, &plan, out_h);
    if (st == EXR_OK && defer && plan.h >= 0) {
        /* reserved: copy with no lock held, the body pinned */
        exr_reader me;
        exr_body *body = b->eps.slab[plan.slot].body;
        pin_locked(b, &me);
        b->writers++;
        exr_buffer_unlock(b);
        copy_rows(&b->lay, body, plan.first, in, plan.step, plan.count);
        exr_buffer_lock(b);
        b->writers--;
        unpin(b, &me);
    }
    if (st == EXR_OK)
        publish_locked(b, &plan, defer);
    if (defer) /* waiters on a busy episode, serialize and get_batch look again */
        signal_publish(b);
    exr_buffer_unlock(b);
    return st;
}

void exr_buffer_set_hook_locked(exr_buffer *b, exr_step_hook fn, void *ctx)
{
    b->hook = fn;
    b->hook_ctx = fn ? ctx : NULL;
}
