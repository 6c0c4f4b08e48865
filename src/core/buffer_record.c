/*
 * buffer_record.c - recording: new episodes, and record calls that reserve their rows
 * under the lock, copy them (under the lock or without it) and publish.
 */
#include <assert.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"
#include "timing.h"
#include "mem.h"
#include "powa.h"
#include "selector.h"

static float prio_to_float(double p)
{
    if (isnan(p))
        return NAN;
    return p > FLT_MAX ? FLT_MAX : (float)p;
}

/* ---- the priorities' stored forms, before the lock ----------------------
 *
 * A prioritized selector stores p ** alpha (powa.h) for each pick; a record
 * call brings them computed (exr_leaves) with the power the first
 * prioritized selector had at the last record call, so that the powers,
 * about a tenth of the Ape-X writer's exclusive hold, run before the lock is
 * taken. Under the lock each selector whose power is that one takes them
 * (enter_picks_stored_locked); a wrong guess only costs the powers computed there
 * as before, and the next call guesses right. */

static double record_power_guess(const exr_buffer *b)
{
    uint64_t u = atomic_load_explicit(&b->rec_pow_a, memory_order_relaxed);
    double a;
    memcpy(&a, &u, sizeof a);
    return a;
}

/* The guess for the next call: the first prioritized selector's power. */
static void note_record_power_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    double a = NAN;
    for (size_t i = 0; i < b->nsels && isnan(a); i++) {
        const exr_selector *s = b->sels[i].sel;
        if (s->vt->add_stored && s->vt->stored_power)
            a = s->vt->stored_power(s);
    }
    uint64_t u;
    memcpy(&u, &a, sizeof u);
    if (atomic_load_explicit(&b->rec_pow_a, memory_order_relaxed) != u)
        atomic_store_explicit(&b->rec_pow_a, u, memory_order_relaxed);
}

void exr_leaves_prepare(const exr_buffer *b, const exr_steps *in, exr_leaves *lv)
{
    lv->v = NULL;
    lv->heap = NULL;
    double a = record_power_guess(b);
    size_t bytes;
    if (!in->priorities || isnan(a) || !exr_mul_size(in->T, sizeof(float), &bytes))
        return;
    float *out = in->T <= EXR_LEAVES_SMALL ? lv->small : (lv->heap = malloc(bytes));
    if (!out)
        return;
    enum { CHUNK = 64 };
    double q[CHUNK];
    for (size_t t0 = 0; t0 < in->T; t0 += CHUNK) {
        size_t n = in->T - t0 < CHUNK ? in->T - t0 : CHUNK;
        int nan = 0;
        for (size_t k = 0; k < n; k++) { /* prio_to_float, branch-free */
            double p = in->priorities[t0 + k];
            float f = p > FLT_MAX ? FLT_MAX : (float)p;
            nan |= f != f;
            q[k] = f == f ? f : 0.0; /* a NaN's leaf: add() computes it */
        }
        exr_pow_leaves(q, 1, n, a, out + t0);
        for (size_t k = 0; nan && k < n; k++)
            if (isnan(in->priorities[t0 + k]))
                out[t0 + k] = NAN;
    }
    lv->v = out;
    lv->power = a;
}

void exr_leaves_release(exr_leaves *lv)
{
    if (lv->heap)
        free(lv->heap);
    lv->heap = NULL;
    lv->v = NULL;
}

/* The prepare step of a new episode: a handle is left and its body and
 * slot are allocated. Nothing visible changes. */
static exr_status prepare_episode_locked(exr_buffer *b, exr_body **body)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (b->next_handle >= EXR_MAX_HANDLE)
        return EXR_EOVERFLOW;
    exr_status st = exr_episodes_reserve(&b->eps);
    if (st != EXR_OK)
        return st;
    *body = exr_body_new(4);
    return *body ? EXR_OK : EXR_ENOMEM;
}

/* Its commit step: the episode gets its handle and goes live. */
static uint32_t commit_episode_locked(exr_buffer *b, exr_body *body, int64_t *h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    *h = b->next_handle++;
    return insert_episode_locked(b, *h, body);
}

exr_status exr_buffer_new_episode_locked(exr_buffer *b, int64_t *h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    reserve_grow_locked(b); /* room for the next ones to go without rw */
    exr_body *body;
    exr_status st = prepare_episode_locked(b, &body);
    if (st == EXR_OK)
        commit_episode_locked(b, body, h);
    return st;
}

/* Rows a new last segment k starts with. Segment k > 0 has the nominal size
 * right away: that is about the rows the episode already holds, so it never
 * more than doubles what the episode takes, and allocating it once avoids
 * the copies (and the heap churn) of growing it. Segment 0's nominal size
 * follows pick_len and the row's size (at least 4 KiB: store.c), not the
 * episode, so it starts at 16 rows and doubles. */
static size_t first_rows(const exr_store_layout *L, size_t k)
{
    size_t cap = exr_store_seg_cap(L, k);
    return k > 0 || cap < 16 ? cap : 16;
}

/* After an episode ends: its last segment and aux shrink to what they hold,
 * when that frees at least 1 KiB. Best effort: on failure nothing changes. */
static void shrink_ended_locked(exr_buffer *b, exr_episode *e)
{
    EXR_ASSERT_EXCLUSIVE(b);
    const exr_store_layout *L = &b->lay;
    exr_body *body = e->body;
    if (e->n && e->n < body->aux_cap) {
        uint32_t *aux = realloc(body->aux, e->n * sizeof *aux);
        if (aux) {
            body->aux = aux;
            body->aux_cap = e->n;
            exr_episode_sync(e);
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
        exr_seg_free(seg);
        free(node);
        return;
    }
    memcpy(seg, body->segs[k], used * L->row_bytes);
    bury_segment(b, body->segs[k], node);
    body->segs[k] = seg;
    body->last_rows = (uint32_t)used;
    exr_episode_sync(e);
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
    /* a handle no longer held (buffer_evict.c's ring) that this new
     * episode continues: its first step's state ends that one in the log
     * (end_continued_locked); -1 if none */
    int64_t cont;
    unsigned char *segs_small[4];
} rec_prep;

static void prep_free(rec_prep *pr)
{
    for (size_t j = 0; pr->segs && j < pr->nnew; j++)
        exr_seg_free(pr->segs[j]);
    if (pr->segs != pr->segs_small)
        free(pr->segs);
    exr_seg_free(pr->grown);
    free(pr->node);
    free(pr->fin);
    exr_body_free(pr->fresh);
}

/* Room in aux for `end` records: aux is read only under the lock, so it may
 * move. An episode that ends here gets exactly what the end would shrink
 * it to. */
static exr_status grow_aux(exr_body *body, uint64_t end, bool ends)
{
    if (end <= body->aux_cap)
        return EXR_OK;
    uint64_t cap = body->aux_cap ? body->aux_cap : 16;
    while (cap < end)
        cap *= 2;
    if (ends)
        cap = end;
    uint32_t *aux = realloc(body->aux, cap * sizeof *aux);
    if (!aux)
        return EXR_ENOMEM;
    body->aux = aux;
    body->aux_cap = cap;
    return EXR_OK;
}

/* Room in the segment table for segment k_last (same content, maybe a
 * new place: the body is updated where the episode or pr holds it). */
static exr_status grow_seg_table(exr_buffer *b, uint32_t slot, rec_prep *pr, exr_body **body,
                                 size_t k_last)
{
    if (k_last < (*body)->cap)
        return EXR_OK;
    uint32_t c = (*body)->cap;
    while (c <= k_last)
        c *= 2;
    exr_body *g = exr_body_grow(*body, c);
    if (!g)
        return EXR_ENOMEM;
    *body = g;
    if (pr->fresh)
        pr->fresh = g;
    else {
        b->eps.slab[slot].body = g;
        exr_episode_sync(&b->eps.slab[slot]);
    }
    return EXR_OK;
}

/* The segments the rows up to (k_last, off_last) need: a larger copy of
 * the last one if it was allocated smaller than it must now hold, and the
 * new ones after it. */
static exr_status prepare_segments(exr_buffer *b, const exr_body *body, size_t k_last,
                                   size_t off_last, bool ends, rec_prep *pr)
{
    const exr_store_layout *L = &b->lay;
    if (body->nsegs) {
        size_t k = body->nsegs - 1;
        size_t need = k < k_last ? exr_store_seg_cap(L, k) : off_last + 1;
        if (need > body->last_rows) {
            pr->grown_rows = exact_rows(L, grown_rows(L, k, body->last_rows, need), need,
                                        ends && k == k_last);
            if (!(pr->node = malloc(sizeof *pr->node)))
                return EXR_ENOMEM;
            if (!(pr->grown = seg_alloc_locked(b, pr->grown_rows)))
                return EXR_ENOMEM;
        }
    }
    if (k_last + 1 <= body->nsegs)
        return EXR_OK;
    pr->nnew = k_last + 1 - body->nsegs;
    pr->segs = pr->nnew <= 4 ? pr->segs_small : calloc(pr->nnew, sizeof *pr->segs);
    if (!pr->segs)
        return EXR_ENOMEM;
    for (size_t j = 0; j < pr->nnew; j++) {
        size_t k = body->nsegs + j;
        size_t rows = k < k_last ? exr_store_seg_cap(L, k)
                                 : exact_rows(L, grown_rows(L, k, first_rows(L, k), off_last + 1),
                                              off_last + 1, ends);
        if (!(pr->segs[j] = seg_alloc_locked(b, rows)))
            return EXR_ENOMEM;
        pr->new_last_rows = rows;
    }
    return EXR_OK;
}

/* The prepare step of recording T steps into episode slot (EXR_NIL: a new
 * one, prepared as exr_buffer_new_episode_locked prepares it): everything
 * it allocates. On failure the buffer is as it was (an existing episode's
 * aux or segment table may have grown: room, not content). */
static exr_status prepare_locked(exr_buffer *b, uint32_t slot, size_t T, bool ends, bool want_fin,
                                 rec_prep *pr)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_status st;
    memset(pr, 0, sizeof *pr);
    pr->cont = -1;
    exr_body *body;
    uint64_t n = 0;
    if (slot == EXR_NIL) {
        if ((st = prepare_episode_locked(b, &pr->fresh)))
            return st;
        body = pr->fresh;
    } else {
        body = b->eps.slab[slot].body;
        n = b->eps.slab[slot].n;
    }
    size_t k_last, off_last, extra;
    if (n > (uint64_t)UINT32_MAX - 1 || T > (uint64_t)UINT32_MAX - 1 - n ||
        !exr_add_size(T, b->cfg.pick_len, &extra)) {
        st = EXR_EOVERFLOW;
        goto fail;
    }
    exr_store_locate(&b->lay, n + T - 1, &k_last, &off_last);
    st = grow_aux(body, n + T, ends);
    if (slot != EXR_NIL) /* the array may have moved, even if what follows fails */
        exr_episode_sync(&b->eps.slab[slot]);
    if (st || (st = grow_seg_table(b, slot, pr, &body, k_last)) ||
        (st = prepare_segments(b, body, k_last, off_last, ends, pr)))
        goto fail;
    if (want_fin && !(pr->fin = malloc(b->lay.state_bytes))) {
        st = EXR_ENOMEM;
        goto fail;
    }
    if ((st = reserve_picks(b, extra)) == EXR_OK)
        return EXR_OK;
fail:
    prep_free(pr);
    return st;
}

/* Puts the prepared segments (and a new episode) in place; cannot fail. */
static uint32_t commit_prep_locked(exr_buffer *b, uint32_t slot, rec_prep *pr, int64_t *h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    const exr_store_layout *L = &b->lay;
    if (pr->fresh) {
        slot = commit_episode_locked(b, pr->fresh, h);
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
    exr_episode_sync(e);
    if (pr->segs != pr->segs_small)
        free(pr->segs);
    pr->segs = NULL;
    pr->nnew = 0;
    return slot;
}

/* A state or field of a recorded step into its row: a frame-sized one
 * (EXR_ROW_STREAM_MIN) with non-temporal stores. Nobody reads a row soon
 * after it is recorded (a draw finds it among all the others), and
 * ordinary stores would first read every line of the destination, which
 * evicted segments left cold, and push the readers' lines out of the
 * cache: 100 84x84 frames took 0.59x the time (docs/benchmarks.md). The
 * caller fences (rows_fence) before the rows can be published. */
static inline void copy_part(unsigned char *d, const unsigned char *s, size_t n)
{
    if (n >= EXR_ROW_STREAM_MIN)
        exr_copy_stream(d, s, n);
    else
        exr_copy_short(d, s, n);
}

/* After rows of in were written: orders their streamed stores (copy_part)
 * before the stores that publish them (the lock's release, or busy's). */
static void rows_fence(const exr_store_layout *L, const exr_steps *in)
{
    bool streamed = !in->fields && L->state_bytes >= EXR_ROW_STREAM_MIN;
    for (size_t f = 0; in->fields && f < in->nfields; f++)
        streamed |= in->fields[f].bytes >= EXR_ROW_STREAM_MIN;
    if (streamed)
        exr_stream_fence();
}

/* Copies step t of in into row: its state (or named fields, each straight
 * from its own array, fields.h), action and reward. */
static inline __attribute__((always_inline)) void fill_row(const exr_store_layout *L,
                                                           unsigned char *row,
                                                           const exr_steps *in, size_t t)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes;
    if (in->fields) {
        for (size_t f = 0; f < in->nfields; f++) {
            const exr_field_src *fs = &in->fields[f];
            copy_part(row + fs->off, fs->src + t * fs->stride, fs->bytes);
        }
    } else {
        copy_part(row, in->states + t * sb, sb);
    }
    exr_copy_short(row + sb, in->actions + t * ab, ab);
    exr_copy_short(row + sb + ab, in->rewards + t * rb, rb);
}

#define COPY_ITEMS(N)                                                                              \
    for (size_t r = 0; r < count; r++)                                                             \
        memcpy(d + r * ds, s + r * ss, N);                                                         \
    break

/* count items of `bytes` each from s (ss apart) to d (ds apart): one column
 * of a run of rows, the common item sizes as single moves (a frame-sized
 * one streamed: copy_part). */
static void copy_column(unsigned char *d, size_t ds, const unsigned char *s, size_t ss,
                        size_t bytes, size_t count)
{
    switch (bytes) {
    case 4:
        COPY_ITEMS(4);
    case 8:
        COPY_ITEMS(8);
    case 16:
        COPY_ITEMS(16);
    default:
        for (size_t r = 0; r < count; r++)
            copy_part(d + r * ds, s + r * ss, bytes);
    }
}

/* Steps [t, t + count) of in into the count rows from row on (fill_row's
 * copies, column by column). */
static void fill_rows(const exr_store_layout *L, unsigned char *row, const exr_steps *in, size_t t,
                      size_t count)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes, w = L->row_bytes;
    if (in->fields) {
        for (size_t f = 0; f < in->nfields; f++) {
            const exr_field_src *fs = &in->fields[f];
            copy_column(row + fs->off, w, fs->src + t * fs->stride, fs->stride, fs->bytes, count);
        }
    } else {
        copy_column(row, w, (const unsigned char *)in->states + t * sb, sb, sb, count);
    }
    copy_column(row + sb, w, (const unsigned char *)in->actions + t * ab, ab, ab, count);
    copy_column(row + sb + ab, w, (const unsigned char *)in->rewards + t * rb, rb, rb, count);
}

/* Copies steps [t0, t0 + count) of in into rows [pos, pos + count) of body. */
static void copy_rows(const exr_store_layout *L, exr_body *body, uint64_t pos, const exr_steps *in,
                      size_t t0, size_t count)
{
    for (size_t i = 0; i < count;) {
        size_t k, off;
        exr_store_locate(L, pos + i, &k, &off);
        size_t run = exr_store_seg_cap(L, k) - off;
        if (run > count - i)
            run = count - i;
        fill_rows(L, exr_seg_row(L, body->segs[k], off), in, t0 + i, run);
        i += run;
    }
    rows_fence(L, in);
}

/* Pick p of episode slot (e) entered at table index idx: the table, its
 * aux entry and every selector (add, or replace into a place when rep). */
static inline __attribute__((always_inline)) void
enter_pick_at_locked(exr_buffer *b, uint32_t slot, exr_episode *e, uint64_t p, size_t idx,
                     bool rep)
{
    uint32_t *aux = exr_aux_at(e, p);
    float rp;
    memcpy(&rp, aux, sizeof rp); /* the recorded priority, until now */
    b->picks.v[idx] = (exr_pick){slot, (uint32_t)p};
    *aux = (uint32_t)idx;
    for (size_t i = 0; i < b->nsels; i++) {
        exr_selector *s = b->sels[i].sel;
        (rep ? s->vt->replace : s->vt->add)(s, idx, rp);
    }
}

/* Enters the picks that episode slot has gained: into the places the
 * record call keeps, then at the end of the table (take_places_locked).
 * Needs reserve_picks. A record call's picks one by one
 * (enter_picks_stored_locked: in chunks). With no place kept (most calls)
 * a loop of its own, which adds only: the runs of places cost a single
 * record call 2-3% (benchmarks/ab_record.py). */
static inline __attribute__((always_inline)) void enter_picks_locked(exr_buffer *b,
                                                                     uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    uint64_t target = exr_picks_target(b, e);
    if (b->holes_first == b->holes_n) {
        size_t idx0 = b->picks.n;
        for (uint64_t p = e->m; p < target; p++)
            enter_pick_at_locked(b, slot, e, p, b->picks.n++, false);
        if (target > e->m)
            note_idents_locked(b, idx0, b->picks.n - idx0);
    } else
        for (uint64_t p = e->m; p < target;) {
            size_t i0;
            bool rep;
            size_t m = take_places_locked(b, (size_t)(target - p), &i0, &rep);
            for (size_t k = 0; k < m; k++)
                enter_pick_at_locked(b, slot, e, p + k, i0 + k, rep);
            note_idents_locked(b, i0, m);
            p += m;
        }
    if (target > e->m)
        b->sel_dirty = true;
    e->m = (uint32_t)target;
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

/* The end of episode h, no longer held: logged, at the step count it had,
 * if it went open with a log attached (its steps are in the log), and
 * taken back so that it ends once; the buffer does not change. first: the
 * hook's first_of_call (false inside a record call that logged a step). */
static void end_gone_locked(exr_buffer *b, int64_t h, const void *final_state, bool terminated,
                            bool first)
{
    uint64_t n;
    if (take_gone_open_locked(b, h, &n) && b->hook)
        b->hook(b->hook_ctx, b, h, n, NULL, final_state, true, terminated, first);
}

/* A new episode's first step continues pr->cont, an episode no longer
 * held: that one ends (if it went open under a log), logged if a log is
 * attached now, with this step's state as its final state, not
 * terminated: the transition from its last step is whole in the log
 * (docs/log.md). row: the step's row, whose first state_bytes are its
 * state (not copied yet if there is no log: then it is not read). */
static void end_continued_locked(exr_buffer *b, rec_prep *pr, const unsigned char *row)
{
    if (pr->cont >= 0)
        end_gone_locked(b, pr->cont, row, false, false);
    pr->cont = -1;
}

/* Commits step t of in as record n of episode slot (handle h): its
 * priority, counts, end, the log's hook, its picks, eviction. The row
 * itself is copied here unless defer. true if the episode was evicted. */
static bool record_step_locked(exr_buffer *b, uint32_t slot, int64_t h, const exr_steps *in,
                               size_t t, bool defer, rec_prep *pr, const exr_pick_leaves *pl)
{
    EXR_ASSERT_EXCLUSIVE(b);
    const exr_store_layout *L = &b->lay;
    exr_episode *e = &b->eps.slab[slot];
    exr_body *body = e->body;
    uint64_t n = e->n;
    bool last = t + 1 == in->T, ends = last && in->end;
    size_t k, off;
    exr_store_locate(L, n, &k, &off);
    unsigned char *row = exr_seg_row(L, body->segs[k], off);
    if (!defer) {
        fill_row(L, row, in, t);
        rows_fence(L, in);
    }
    float rp = prio_to_float(in->priorities ? in->priorities[t] : NAN);
    memcpy(&body->aux[n], &rp, sizeof rp);
    e->n = (uint32_t)(n + 1);
    b->n_records++;
    const unsigned char *fin = NULL;
    if (ends) {
        e->ended = 1;
        e->terminated = in->terminated;
        if (pr->fin) {
            memcpy(pr->fin, in->final_state, L->state_bytes);
            body->final_state = pr->fin;
            fin = pr->fin;
            pr->fin = NULL;
        }
    }
    if (b->hook) /* the row is in place: never deferred with a hook */
        b->hook(b->hook_ctx, b, h, n, row, fin, ends, ends && in->terminated, t == 0);
    end_continued_locked(b, pr, row); /* the row is read only by a hook */
    EXR_TM_NOW(te);
    if (!pl || !enter_picks_stored_locked(b, slot, pl))
        enter_picks_locked(b, slot);
    EXR_TM_SINCE(EXR_TM_REC_ENTER, te);
    if (ends)
        shrink_ended_locked(b, e);
    EXR_TM_NOW(tv);
    evict_over_capacity_locked(b);
    EXR_TM_SINCE(EXR_TM_REC_EVICT, tv);
    return b->eps.slab[slot].handle != h;
}

/* How many steps from step t on may go as one run (record_run_locked):
 * none of them ends the episode, none takes the records over capacity (so
 * none evicts) and no hook reads them one at a time. */
static size_t run_len(const exr_buffer *b, const exr_steps *in, size_t t)
{
    if (b->hook)
        return 0;
    size_t r = in->T - t - (in->end ? 1 : 0);
    if (b->cfg.capacity) {
        uint64_t room = b->n_records < b->cfg.capacity ? b->cfg.capacity - b->n_records : 0;
        r = room < r ? (size_t)room : r;
    }
    return r;
}

/* Steps [t, t + r) of in, r from run_len, as records of episode slot:
 * what r record_step_locked calls would do, in the same order (the picks
 * enter the table and the selectors in position order; nothing is evicted
 * and nothing ends in between), with the per-step work done once. */
static void record_run_locked(exr_buffer *b, uint32_t slot, const exr_steps *in, size_t t,
                              size_t r, bool defer, const exr_pick_leaves *pl)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    uint64_t n = e->n;
    if (!defer)
        copy_rows(&b->lay, e->body, n, in, t, r);
    uint32_t *aux = e->body->aux + n;
    for (size_t k = 0; k < r; k++) {
        float rp = prio_to_float(in->priorities ? in->priorities[t + k] : NAN);
        memcpy(&aux[k], &rp, sizeof rp);
    }
    e->n = (uint32_t)(n + r);
    b->n_records += r;
    EXR_TM_NOW(te);
    if (!pl || !enter_picks_stored_locked(b, slot, pl))
        enter_picks_locked(b, slot);
    EXR_TM_SINCE(EXR_TM_REC_ENTER, te);
}

/* Records steps from t on into episode slot (handle h) until the steps
 * end or one evicts the episode; returns the step after the last one
 * recorded and sets *evicted. lv: the call's stored forms, or NULL. */
static size_t record_pass_locked(exr_buffer *b, uint32_t slot, int64_t h, const exr_steps *in,
                                 size_t t, bool defer, rec_prep *p, const exr_leaves *lv,
                                 bool *evicted)
{
    uint64_t first = b->eps.slab[slot].n;
    exr_pick_leaves pl = {lv ? lv->v + t : NULL, first, first + (in->T - t), lv ? lv->power : 0};
    const exr_pick_leaves *plp = pl.v ? &pl : NULL;
    *evicted = false;
    while (t < in->T && !*evicted) {
        size_t r = run_len(b, in, t);
        if (r >= 2) {
            record_run_locked(b, slot, in, t, r, defer, plp);
            t += r;
        } else {
            *evicted = record_step_locked(b, slot, h, in, t++, defer, p, plp);
        }
    }
    return t;
}

/* Allocates, before anything visible changes, all that recording the steps
 * of `in` into episode slot (EXR_NIL: a new one) needs: pr[0] for that
 * episode and pr[1..*np) for each new episode that the rollout starts after
 * evicting the one it records into (the eviction dry run of evict.c says
 * where). *pr is a caller's array of `small` entries or, if that is too few,
 * one allocated here (free it with free_preps). */
static exr_status prepare_all_locked(exr_buffer *b, uint32_t slot, const exr_steps *in,
                                     rec_prep **pr, size_t small, size_t *np)
{
    size_t starts_small[8], *starts = starts_small;
    long fresh = 0;
    *np = 0;
    if (b->cfg.capacity && (b->n_records >= b->cfg.capacity ||
                            in->T > b->cfg.capacity - b->n_records)) {
        exr_evict_state es = {b->cfg.eviction, b->hand, b->n_records, b->cfg.capacity};
        fresh = exr_evict_dry_run(&b->eps, &es, slot, in->T, starts, 8);
        if (fresh > 8) {
            if (!(starts = malloc((size_t)fresh * sizeof *starts)))
                return EXR_ENOMEM;
            fresh = exr_evict_dry_run(&b->eps, &es, slot, in->T, starts, (size_t)fresh);
        }
        if (fresh < 0) {
            if (starts != starts_small)
                free(starts);
            return EXR_ENOMEM;
        }
    }
    exr_status st = EXR_OK;
    size_t want = (size_t)fresh + 1;
    uint64_t handles = (uint64_t)fresh + (slot == EXR_NIL);
    if (handles > (uint64_t)(EXR_MAX_HANDLE - b->next_handle))
        st = EXR_EOVERFLOW;
    else if (want > small && !(*pr = calloc(want, sizeof **pr)))
        st = EXR_ENOMEM;
    for (size_t k = 0; st == EXR_OK && k < want; k++) {
        size_t t = k ? starts[k - 1] : 0;
        st = prepare_locked(b, k ? EXR_NIL : slot, in->T - t, in->end, in->end && in->final_state,
                            &(*pr)[k]);
        if (st == EXR_OK)
            *np = k + 1;
    }
    if (starts != starts_small)
        free(starts);
    return st;
}

/* Frees what the record call did not use of preps pr[from, n), and pr
 * itself unless it is the caller's array. */
static void free_preps(rec_prep *pr, size_t from, size_t n, const rec_prep *small)
{
    for (size_t k = from; k < n; k++)
        prep_free(&pr[k]);
    if (pr != small)
        free(pr);
}

/* The end of record_steps_locked, whose evictions kept their picks'
 * places for the picks the call entered after them (buffer_picks.c,
 * "places"): those left over leave now. Returns st. */
static inline exr_status end_steps_locked(exr_buffer *b, exr_status st)
{
    b->keep_holes = false;
    if (b->holes_n) /* some eviction came */
        close_holes_locked(b);
    return st;
}

/* The steps recorded as T single records would be. defer: the rows' bytes
 * are left for the caller to copy (the episode is marked busy); else they
 * are copied here. Everything the call allocates is allocated first, so a
 * failure leaves the buffer as it was, also when the rollout evicts the
 * episode it records into and goes on in a new one. */
static exr_status record_steps_locked(exr_buffer *b, int64_t h, const exr_steps *in,
                                      const exr_leaves *lv, bool defer, rec_plan *plan,
                                      int64_t *out_h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    b->keep_holes = true; /* until end_steps_locked */
    if (in->priorities) /* only calls with priorities use the guess */
        note_record_power_locked(b);
    uint32_t slot = exr_episodes_find(&b->eps, h);
    bool gone = slot == EXR_NIL; /* not held: perhaps in the gone-open ring */
    if (slot != EXR_NIL && b->eps.slab[slot].ended)
        slot = EXR_NIL;
    rec_prep small[2], *pr = small, extra;
    size_t np, t = 0;
    exr_status st = prepare_all_locked(b, slot, in, &pr, 2, &np);
    for (size_t k = 0; st == EXR_OK; k++) {
        /* one pass per episode recorded into */
        size_t t0 = t;
        assert(k < np); /* the dry run foresaw every episode */
        if (k >= np) /* kept safe in release builds */
            st = prepare_locked(b, EXR_NIL, in->T - t, in->end, in->end && in->final_state, &extra);
        if (st != EXR_OK)
            break;
        rec_prep *p = k < np ? &pr[k] : &extra;
        /* a handle not held (no longer): its episode may be due an end,
         * made here (logged if a log is attached: end_gone_locked) */
        if (slot == EXR_NIL && h >= 0 && (gone || k > 0))
            p->cont = h;
        slot = commit_prep_locked(b, slot, p, &h);
        exr_episodes_hint(&b->eps, slot);
        exr_episode *e = &b->eps.slab[slot];
        uint64_t first = e->n;
        if (defer) {
            e->busy = 1;
            e->body->n_pub = e->n;
            e->body->m_pub = e->m;
        }
        bool evicted;
        t = record_pass_locked(b, slot, h, in, t, defer, p, lv && lv->v ? lv : NULL, &evicted);
        free(p->fin); /* unused when the episode was evicted before the end */
        p->fin = NULL;
        if (t < in->T) {
            slot = EXR_NIL; /* the rest starts a new episode */
            continue;
        }
        assert(k + 1 == np);
        free_preps(pr, k + 1, np, small);
        *out_h = h;
        *plan = (rec_plan){evicted ? -1 : h, slot, first, t0, in->T - t0};
        return end_steps_locked(b, EXR_OK);
    }
    free_preps(pr, 0, np, small);
    return end_steps_locked(b, st);
}

/* Whether a record call is copying into episode h. */
static bool busy_locked(const exr_buffer *b, int64_t h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    uint32_t s = exr_episodes_find(&b->eps, h);
    return s != EXR_NIL && b->eps.slab[s].busy;
}

/* Waits (the lock released meanwhile) until no record call copies into
 * episode h, so that rollouts into one episode stay contiguous and in order. */
static void wait_not_busy_locked(exr_buffer *b, int64_t h)
{
    while (busy_locked(b, h))
        wait_publish(b, false);
}

void exr_buffer_quiesce_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    while (__atomic_load_n(&b->writers, __ATOMIC_RELAXED))
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
    EXR_ASSERT_EXCLUSIVE(b);
    if (!steps_ok(b, in))
        return EXR_EINVAL;
    wait_not_busy_locked(b, h);
    rec_plan plan;
    return record_steps_locked(b, h, in, NULL, false, &plan, out_h);
}

/* ---- ending an episode without a step ------------------------------------
 *
 * The last record call of an episode may not have known that it was the
 * last (an RLlib fragment that ends exactly at the previous one's last
 * observation, a stream whose episode ends with an empty rollout). Ending
 * it afterwards does what that call's end would have done: the flags and
 * the final state, the picks that needed the last step's next state (with
 * the priorities recorded for them, still in aux), the log's record of the
 * end, and the cut of the last segment. No record is added, so nothing is
 * evicted. */

/* What episode h is to exr_buffer_end_episode_locked; *slot its slot. */
static exr_end_outcome end_outcome_locked(const exr_buffer *b, int64_t h, uint32_t *slot)
{
    *slot = exr_episodes_find(&b->eps, h);
    if (*slot == EXR_NIL)
        return h >= 0 && h < b->next_handle ? EXR_END_GONE : EXR_END_UNKNOWN;
    const exr_episode *e = &b->eps.slab[*slot];
    if (e->ended)
        return EXR_END_ENDED;
    return e->n ? EXR_END_DONE : EXR_END_EMPTY;
}

/* The picks episode e gains by ending: its picks once ended, less those it has. */
static uint64_t end_new_picks(const exr_buffer *b, const exr_episode *e)
{
    exr_episode ended = *e;
    ended.ended = 1;
    return exr_picks_target(b, &ended) - e->m;
}

exr_status exr_buffer_end_episode_locked(exr_buffer *b, int64_t h, const void *final_state,
                                         bool terminated, exr_end_outcome *out)
{
    EXR_ASSERT_EXCLUSIVE(b);
    *out = EXR_END_NO_END;
    if (!final_state && !terminated)
        return EXR_EINVAL;
    wait_not_busy_locked(b, h); /* ordered after a record call copying into h */
    uint32_t slot;
    *out = end_outcome_locked(b, h, &slot);
    if (*out == EXR_END_GONE) {
        end_gone_locked(b, h, final_state, terminated, true);
        return EXR_OK;
    }
    if (*out != EXR_END_DONE)
        return *out == EXR_END_UNKNOWN ? EXR_ENOTFOUND : EXR_EINVAL;
    exr_episode *e = &b->eps.slab[slot];
    unsigned char *fin = NULL;
    if (final_state && !(fin = malloc(b->lay.state_bytes)))
        return EXR_ENOMEM;
    exr_status st = reserve_picks(b, (size_t)end_new_picks(b, e));
    if (st != EXR_OK) {
        free(fin);
        return st;
    }
    /* nothing fails from here on */
    e->ended = 1;
    e->terminated = terminated;
    if (fin) {
        memcpy(fin, final_state, b->lay.state_bytes);
        e->body->final_state = fin;
    }
    if (b->hook)
        b->hook(b->hook_ctx, b, h, e->n, NULL, fin, true, terminated, true);
    enter_picks_locked(b, slot);
    shrink_ended_locked(b, e);
    return EXR_OK;
}

/* The rows of plan copied with no lock held (the body pinned, the episode
 * busy), then published under the shared lock. THE publish point of a
 * record call that copies unlocked (one that copies under its exclusive
 * hold publishes when it lets go of it): its rows are visible to
 * get_batch, episode() and serialize from the store of busy = 0 on, which
 * orders the copy before it for the samplers that read busy (acquire)
 * under the shared lock, and for everyone else through rw. Clearing busy and taking
 * the call off `writers` only changes what samplers skip, and they read
 * both with atomics; everything else that reads them holds rw exclusively.
 * Called holding rw exclusively; returns with no lock held. */
static void copy_unlocked_publish(exr_buffer *b, const rec_plan *plan, const exr_steps *in)
{
    exr_reader me;
    exr_body *body = b->eps.slab[plan->slot].body;
    pin_locked(b, &me);
    __atomic_add_fetch(&b->writers, 1, __ATOMIC_RELAXED);
    exr_buffer_unlock(b);
    copy_rows(&b->lay, body, plan->first, in, plan->step, plan->count);
    unpin(b, &me);
    lock_shared(b);
    uint32_t s = exr_episodes_find(&b->eps, plan->h);
    if (s != EXR_NIL) /* else evicted meanwhile: nothing to publish */
        __atomic_store_n(&b->eps.slab[s].busy, 0, __ATOMIC_RELEASE);
    __atomic_sub_fetch(&b->writers, 1, __ATOMIC_RELEASE);
    signal_publish(b); /* waiters on a busy episode, serialize and get_batch look again */
    exr_buffer_unlock(b);
}

/* Whether a record call of `bytes` copies its rows with the lock let go:
 * a large one always; a smaller one when others wait for the lock (or it
 * waited), since then the copy under an exclusive hold keeps them out,
 * while alone the extra shared hold and the pin cost more than they save.
 * Never with a log attached: its hook reads each row as it is committed. */
static bool defer_copy(const exr_buffer *b, bool big, bool contended, size_t bytes)
{
    return !b->hook && (big || (contended && bytes >= EXR_COPY_UNLOCKED_CONTENDED));
}

/* Whether in's rows take EXR_COPY_UNLOCKED bytes or more (*bytes: how
 * many, when that fits in a size_t). */
static bool rollout_big(const exr_buffer *b, const exr_steps *in, size_t *bytes)
{
    return !exr_mul_size(in->T, b->lay.row_bytes, bytes) || *bytes >= EXR_COPY_UNLOCKED;
}

exr_status exr_buffer_record(exr_buffer *b, int64_t h, const exr_steps *in, const exr_leaves *lv,
                             int64_t *out_h)
{
    if (!steps_ok(b, in))
        return EXR_EINVAL;
    size_t bytes;
    bool big = rollout_big(b, in, &bytes);
    bool defer = defer_copy(b, big, exr_buffer_lock_contended(b), bytes);
    wait_not_busy_locked(b, h);
    /* the wait lets go of rw: a log may have been attached meanwhile, whose
     * hook reads each row as it is committed, so the copy is not deferred */
    defer = defer && !b->hook;
    rec_plan plan;
    exr_status st = record_steps_locked(b, h, in, lv, defer, &plan, out_h);
    if (st == EXR_OK && defer && plan.h >= 0) {
        copy_unlocked_publish(b, &plan, in);
        return st;
    }
    if (defer) /* its episode evicted by its own call: nothing to copy */
        signal_publish(b);
    exr_buffer_unlock(b);
    return st;
}

exr_status exr_buffer_record_nowait(exr_buffer *b, int64_t h, const exr_steps *in,
                                    const exr_leaves *lv, int64_t *out_h, bool *done)
{
    *done = false;
    size_t bytes;
    if (!steps_ok(b, in) || rollout_big(b, in, &bytes) || !exr_buffer_trylock(b))
        return EXR_OK;
    /* a log's hook may wait for its writer thread (the binding throttles
     * first, without the GIL), and a busy episode for its copy */
    if (b->hook || busy_locked(b, h)) {
        exr_buffer_unlock(b);
        return EXR_OK;
    }
    *done = true;
    rec_plan plan;
    exr_status st = record_steps_locked(b, h, in, lv, false, &plan, out_h);
    exr_buffer_unlock(b); /* copied under the hold: published when it goes */
    return st;
}

void exr_buffer_unset_hook_locked(exr_buffer *b, void *ctx)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (b->hook_ctx == ctx)
        exr_buffer_set_hook_locked(b, NULL, NULL);
}

void exr_buffer_set_hook_locked(exr_buffer *b, exr_step_hook fn, void *ctx)
{
    EXR_ASSERT_EXCLUSIVE(b);
    b->hook = fn;
    b->hook_ctx = fn ? ctx : NULL;
}
