#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include "buffer.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

struct exr_locks {
    pthread_rwlock_t rw;
    pthread_mutex_t pin_mu;
    pthread_mutex_t wait_mu;
    pthread_cond_t published; /* signalled when a record call publishes */
};

/* ---- small helpers ---------------------------------------------------- */

static float prio_to_float(double p)
{
    if (isnan(p))
        return NAN;
    return p > FLT_MAX ? FLT_MAX : (float)p;
}

static uint64_t complete_steps(const exr_episode *e)
{
    return e->ended ? e->n : (e->n ? e->n - 1 : 0);
}

uint64_t exr_picks_target(const exr_buffer *b, const exr_episode *e)
{
    uint64_t c = complete_steps(e), L = b->cfg.pick_len;
    if (e->ended && b->cfg.allow_short)
        return c;
    return c >= L ? c - L + 1 : 0;
}

static sel_entry *find_sel(const exr_buffer *b, int64_t h)
{
    for (size_t i = 0; i < b->nsels; i++)
        if (b->sels[i].handle == h)
            return &b->sels[i];
    return NULL;
}

/* ---- lifecycle --------------------------------------------------------- */

exr_status exr_buffer_new(const exr_config *cfg, exr_buffer **out)
{
    if (cfg->state_bytes == 0 || cfg->pick_len < 1 || cfg->pick_len > EXR_MAX_PICK_LEN ||
        (cfg->eviction != EXR_EVICT_FIFO && cfg->eviction != EXR_EVICT_SECOND_CHANCE))
        return EXR_EINVAL;
    exr_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return EXR_ENOMEM;
    b->cfg = *cfg;
    exr_status st = exr_store_layout_init(&b->lay, cfg->state_bytes, cfg->action_bytes,
                                          cfg->reward_bytes, cfg->pick_len);
    if (st != EXR_OK) {
        free(b);
        return st;
    }
    if (!(b->lk = malloc(sizeof *b->lk))) {
        free(b);
        return EXR_ENOMEM;
    }
    /* writers first: a stream of overlapping get_batch calls must not
     * keep a record call out */
    pthread_rwlockattr_t ra;
    int ok = pthread_rwlockattr_init(&ra) == 0;
    if (ok) {
        pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
        ok = pthread_rwlock_init(&b->lk->rw, &ra) == 0;
        pthread_rwlockattr_destroy(&ra);
    }
    if (!ok) {
        free(b->lk);
        free(b);
        return EXR_ENOMEM;
    }
    if (pthread_mutex_init(&b->lk->pin_mu, NULL) != 0) {
        pthread_rwlock_destroy(&b->lk->rw);
        free(b->lk);
        free(b);
        return EXR_ENOMEM;
    }
    if (pthread_mutex_init(&b->lk->wait_mu, NULL) != 0) {
        pthread_mutex_destroy(&b->lk->pin_mu);
        pthread_rwlock_destroy(&b->lk->rw);
        free(b->lk);
        free(b);
        return EXR_ENOMEM;
    }
    if (pthread_cond_init(&b->lk->published, NULL) != 0) {
        pthread_mutex_destroy(&b->lk->wait_mu);
        pthread_mutex_destroy(&b->lk->pin_mu);
        pthread_rwlock_destroy(&b->lk->rw);
        free(b->lk);
        free(b);
        return EXR_ENOMEM;
    }
    exr_episodes_init(&b->eps);
    exr_pick_table_init(&b->picks);
    b->hand = EXR_NIL;
    *out = b;
    return EXR_OK;
}

/* A segment of `rows` rows: a spare one of that size if there is one. */
static unsigned char *seg_alloc_locked(exr_buffer *b, size_t rows)
{
    unsigned char *seg = NULL;
    pthread_mutex_lock(&b->lk->pin_mu);
    for (size_t i = 0; i < b->nspare; i++) {
        if (b->spare[i].rows == rows) {
            seg = b->spare[i].seg;
            b->spare_bytes -= rows * b->lay.row_bytes;
            b->spare[i] = b->spare[--b->nspare];
            break;
        }
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
    return seg ? seg : exr_store_seg_alloc(&b->lay, rows);
}

/* pin_mu held */
static void seg_free_locked(exr_buffer *b, unsigned char *seg, size_t rows)
{
    size_t bytes = rows * b->lay.row_bytes;
    if (seg && b->nspare < EXR_SPARE_SEGS && bytes <= EXR_SPARE_BYTES - b->spare_bytes) {
        b->spare[b->nspare].seg = seg;
        b->spare[b->nspare++].rows = rows;
        b->spare_bytes += bytes;
    } else {
        free(seg);
    }
}

/* Frees an evicted episode's body, its segments kept as spares. pin_mu held. */
static void body_free_locked(exr_buffer *b, exr_body *body)
{
    for (uint32_t k = 0; k < body->nsegs; k++) {
        seg_free_locked(b, body->segs[k],
                        k + 1 < body->nsegs ? exr_store_seg_cap(&b->lay, k) : body->last_rows);
        body->segs[k] = NULL;
    }
    exr_body_free(body);
}

static void free_graveyard_upto(exr_buffer *b, uint64_t epoch)
{
    while (b->grave_head && b->grave_head->epoch <= epoch) {
        exr_body *d = b->grave_head;
        b->grave_head = d->next_dead;
        body_free_locked(b, d);
    }
    if (!b->grave_head)
        b->grave_tail = NULL;
    while (b->dead_head && b->dead_head->epoch <= epoch) {
        exr_dead *d = b->dead_head;
        b->dead_head = d->next;
        free(d->seg);
        free(d);
    }
    if (!b->dead_head)
        b->dead_tail = NULL;
}

void exr_buffer_free(exr_buffer *b)
{
    if (!b)
        return;
    free_graveyard_upto(b, UINT64_MAX);
    for (size_t i = 0; i < b->nspare; i++)
        free(b->spare[i].seg);
    exr_episodes_free(&b->eps);
    exr_pick_table_free(&b->picks);
    for (size_t i = 0; i < b->nsels; i++) {
        pthread_mutex_destroy(&b->sels[i].sel->mu);
        b->sels[i].sel->vt->destroy(b->sels[i].sel);
    }
    free(b->sels);
    pthread_cond_destroy(&b->lk->published);
    pthread_mutex_destroy(&b->lk->wait_mu);
    pthread_mutex_destroy(&b->lk->pin_mu);
    pthread_rwlock_destroy(&b->lk->rw);
    free(b->lk);
    free(b);
}

const exr_config *exr_buffer_config(const exr_buffer *b) { return &b->cfg; }

/* The storage lock is held for microseconds at a time, less than a futex
 * sleep and wake-up cost: a thread that finds it taken retries for a short
 * while before it sleeps, so that a writer and a sampler taking turns do not
 * hand the lock over through the scheduler at every call. */
#define LOCK_SPINS 1000

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void exr_buffer_lock(exr_buffer *b)
{
    for (int i = 0; i < LOCK_SPINS; i++) {
        if (pthread_rwlock_trywrlock(&b->lk->rw) == 0)
            return;
        cpu_relax();
    }
    pthread_rwlock_wrlock(&b->lk->rw);
}
int exr_buffer_trylock(exr_buffer *b) { return pthread_rwlock_trywrlock(&b->lk->rw) == 0; }
void exr_buffer_unlock(exr_buffer *b) { pthread_rwlock_unlock(&b->lk->rw); }
static void lock_shared(exr_buffer *b)
{
    for (int i = 0; i < LOCK_SPINS; i++) {
        if (pthread_rwlock_tryrdlock(&b->lk->rw) == 0)
            return;
        cpu_relax();
    }
    pthread_rwlock_rdlock(&b->lk->rw);
}

/* Waits for the next publish with the storage lock released meanwhile, and
 * takes it again as it was (exclusive or shared). The publisher signals
 * holding the lock exclusively, so taking wait_mu before letting go of rw
 * means no publish can slip in between. */
static void wait_publish(exr_buffer *b, bool shared)
{
    pthread_mutex_lock(&b->lk->wait_mu);
    pthread_rwlock_unlock(&b->lk->rw);
    pthread_cond_wait(&b->lk->published, &b->lk->wait_mu);
    pthread_mutex_unlock(&b->lk->wait_mu);
    if (shared)
        lock_shared(b);
    else
        exr_buffer_lock(b);
}

static void signal_publish(exr_buffer *b)
{
    pthread_mutex_lock(&b->lk->wait_mu);
    pthread_cond_broadcast(&b->lk->published);
    pthread_mutex_unlock(&b->lk->wait_mu);
}

uint64_t exr_buffer_len_locked(const exr_buffer *b) { return b->n_records; }
uint64_t exr_buffer_num_episodes_locked(const exr_buffer *b) { return b->eps.count; }
uint64_t exr_buffer_num_picks_locked(const exr_buffer *b) { return b->picks.n; }

/* ---- picks ------------------------------------------------------------- */

/* Room for `extra` more picks in the table and every selector. */
static exr_status reserve_picks(exr_buffer *b, size_t extra)
{
    size_t need;
    if (!exr_add_size(b->picks.n, extra, &need))
        return EXR_EOVERFLOW;
    exr_status st = exr_pick_table_reserve(&b->picks, need);
    for (size_t i = 0; st == EXR_OK && i < b->nsels; i++)
        st = b->sels[i].sel->vt->reserve(b->sels[i].sel, need);
    return st;
}

/* Enters the picks that episode slot has gained. Needs reserve_picks. */
static void enter_picks_locked(exr_buffer *b, uint32_t slot)
{
    exr_episode *e = &b->eps.slab[slot];
    uint64_t target = exr_picks_target(b, e);
    for (uint64_t p = e->m; p < target; p++) {
        uint32_t *aux = exr_aux_at(e, p);
        float rp;
        memcpy(&rp, aux, sizeof rp);
        size_t idx = b->picks.n++;
        b->picks.v[idx] = (exr_pick){slot, (uint32_t)p};
        *aux = (uint32_t)idx;
        for (size_t i = 0; i < b->nsels; i++)
            b->sels[i].sel->vt->add(b->sels[i].sel, idx, rp);
    }
    e->m = target;
}

static void remove_pick_locked(exr_buffer *b, size_t i)
{
    size_t last = b->picks.n - 1;
    if (i != last) {
        exr_pick moved = b->picks.v[last];
        b->picks.v[i] = moved;
        *exr_aux_at(&b->eps.slab[moved.slot], moved.pos) = (uint32_t)i;
    }
    b->picks.n--;
    for (size_t s = 0; s < b->nsels; s++)
        b->sels[s].sel->vt->remove(b->sels[s].sel, i, last);
}

/* ---- eviction ---------------------------------------------------------- */

static void bury_or_free(exr_buffer *b, exr_body *body)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (!b->readers) {
        body_free_locked(b, body);
    } else {
        body->epoch = ++b->epoch;
        body->next_dead = NULL;
        if (b->grave_tail)
            b->grave_tail->next_dead = body;
        else
            b->grave_head = body;
        b->grave_tail = body;
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
}

/* A segment that a copy running without the lock may still read: freed now
 * if none runs, else parked with node (allocated beforehand) until they end. */
static void bury_segment(exr_buffer *b, unsigned char *seg, exr_dead *node)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (!b->readers) {
        free(seg);
        free(node);
    } else {
        node->seg = seg;
        node->epoch = ++b->epoch;
        node->next = NULL;
        if (b->dead_tail)
            b->dead_tail->next = node;
        else
            b->dead_head = node;
        b->dead_tail = node;
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
}

static void evict_episode_locked(exr_buffer *b, uint32_t slot)
{
    exr_episode *e = &b->eps.slab[slot];
    for (uint64_t p = 0; p < e->m; p++)
        remove_pick_locked(b, *exr_aux_at(e, p));
    b->n_records -= e->n;
    exr_body *body = e->body;
    exr_episodes_remove(&b->eps, slot);
    bury_or_free(b, body);
}

static void evict_over_capacity_locked(exr_buffer *b)
{
    while (b->cfg.capacity && b->n_records > b->cfg.capacity && b->eps.count) {
        uint32_t victim = exr_evict_choose(&b->eps, b->cfg.eviction, &b->hand);
        evict_episode_locked(b, victim);
    }
}

/* ---- recording --------------------------------------------------------- */

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

exr_status exr_buffer_record_locked(exr_buffer *b, int64_t h, const exr_steps *in,
                                    int64_t *out_h)
{
    if (in->T == 0)
        return EXR_EINVAL;
    wait_not_busy_locked(b, h);
    rec_plan plan;
    exr_status st = record_steps_locked(b, h, in, false, &plan, out_h);
    if (st == EXR_OK)
        publish_locked(b, &plan, false);
    return st;
}

static void pin_locked(exr_buffer *b, exr_reader *r);
static void unpin(exr_buffer *b, exr_reader *r);

exr_status exr_buffer_record(exr_buffer *b, int64_t h, const exr_steps *in, int64_t *out_h)
{
    if (in->T == 0)
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

/* ---- selectors --------------------------------------------------------- */

exr_status exr_buffer_reserve_selector_locked(exr_buffer *b)
{
    if (b->nsels < b->sels_cap)
        return EXR_OK;
    size_t ncap = b->sels_cap ? b->sels_cap * 2 : 4;
    sel_entry *ns = realloc(b->sels, ncap * sizeof *ns);
    if (!ns)
        return EXR_ENOMEM;
    b->sels = ns;
    b->sels_cap = ncap;
    return EXR_OK;
}

exr_status exr_buffer_add_selector_locked(exr_buffer *b, int kind, const double *params,
                                          int64_t *h)
{
    if (kind < 0 || kind >= exr_selector_nkinds)
        return EXR_EINVAL;
    const exr_selector_vtable *vt = exr_selector_kinds[kind];
    for (int k = 0; k < vt->nparams; k++)
        if (!vt->param_ok(k, params[k]))
            return EXR_EINVAL;
    if (b->next_sel_handle >= EXR_MAX_HANDLE)
        return EXR_EOVERFLOW;
    exr_status st = exr_buffer_reserve_selector_locked(b);
    if (st != EXR_OK)
        return st;
    exr_selector *s;
    st = vt->create(&s, params, b->picks.n);
    if (st != EXR_OK)
        return st;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        vt->destroy(s);
        return EXR_ENOMEM;
    }
    int64_t handle = b->next_sel_handle++;
    exr_rng_seed(&s->rng, b->cfg.seed, (uint64_t)handle);
    /* Existing picks start at the selector's maximum so far: their recorded
     * priorities are gone once they became picks (docs/semantics.md). */
    for (size_t i = 0; i < b->picks.n; i++)
        vt->add(s, i, NAN);
    b->sels[b->nsels++] = (sel_entry){handle, s};
    *h = handle;
    return EXR_OK;
}

exr_status exr_buffer_remove_selector_locked(exr_buffer *b, int64_t h)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    pthread_mutex_destroy(&e->sel->mu);
    e->sel->vt->destroy(e->sel);
    size_t i = (size_t)(e - b->sels);
    memmove(b->sels + i, b->sels + i + 1, (b->nsels - i - 1) * sizeof *b->sels);
    b->nsels--;
    return EXR_OK;
}

exr_selector *exr_buffer_selector_locked(exr_buffer *b, int64_t h)
{
    sel_entry *e = find_sel(b, h);
    return e ? e->sel : NULL;
}

exr_status exr_buffer_set_param_locked(exr_buffer *b, int64_t h, int k, double v)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    const exr_selector_vtable *vt = e->sel->vt;
    if (k < vt->settable_from || k >= vt->nparams || !vt->param_ok(k, v))
        return EXR_EINVAL;
    vt->set_param(e->sel, k, v);
    return EXR_OK;
}

/* ---- get_batch ----------------------------------------------------------- */

/* Where one pick's rows live, resolved under the lock. Rows [0, na) are in
 * segment A from the pick's offset, the rest in segment B from its start. */
typedef struct {
    const unsigned char *a, *b; /* row 0 of the pick in A; row 0 of B (NULL if unused) */
    const unsigned char *final; /* final state, if row len is not stored */
    uint32_t na, len;
    uint32_t next_stored;       /* row len (the last next state) is a record */
} plan_t;

static void plan_pick_locked(exr_buffer *b, const exr_pick *pk, plan_t *pl, int64_t *epi,
                             int64_t *pos, int64_t *len, int64_t *len_next)
{
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

/* memcpy for the short runs a pick is made of (a few rows of a few bytes):
 * inline 16-byte moves, with an overlapping last move, beat a call into
 * libc's size dispatch. */
static inline void copy_bytes(unsigned char *d, const unsigned char *s, size_t n)
{
    if (n > 256) {
        memcpy(d, s, n);
    } else if (n >= 16) {
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            memcpy(d + i, s + i, 16);
        if (i < n)
            memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(d, s, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    }
}

/* One field (at byte `at` of each row, `w` bytes wide) of cnt rows from
 * src (rows `stride` apart) into dst (packed). The common widths get a
 * fixed-size move the compiler inlines. */
static inline void gather_field(unsigned char *dst, const unsigned char *src, size_t cnt,
                                size_t stride, size_t w)
{
#define GATHER(W)                                                                                  \
    for (size_t r_ = 0; r_ < cnt; r_++)                                                            \
        memcpy(dst + r_ * (W), src + r_ * stride, (W));                                            \
    return
    switch (w) {
    case 0:
        return;
    case 1:
        GATHER(1);
    case 2:
        GATHER(2);
    case 4:
        GATHER(4);
    case 8:
        GATHER(8);
    case 16:
        GATHER(16);
    case 32:
        GATHER(32);
    default:
        for (size_t r = 0; r < cnt; r++)
            copy_bytes(dst + r * w, src + r * stride, w);
    }
#undef GATHER
}

/* Rows [0, cnt) of a pick, split between A and B. */
static void gather_rows(unsigned char *dst, const plan_t *pl, size_t cnt, size_t at,
                        const exr_store_layout *L, size_t w)
{
    size_t first = cnt < pl->na ? cnt : pl->na;
    gather_field(dst, pl->a + at, first, L->row_bytes, w);
    if (cnt > first)
        gather_field(dst + first * w, pl->b + at, cnt - first, L->row_bytes, w);
}

static void copy_pick(const exr_store_layout *L, const plan_t *pl, size_t pick_len,
                      unsigned char *st, unsigned char *ac, unsigned char *rw, unsigned char *nx)
{
    size_t sb = L->state_bytes, ab = L->action_bytes, rb = L->reward_bytes, l = pl->len;
    gather_rows(st, pl, l, 0, L, sb);
    gather_rows(ac, pl, l, sb, L, ab);
    gather_rows(rw, pl, l, sb + ab, L, rb);
    /* Next states 0..l-2 are states 1..l-1: take them from the output just
     * written, so each stored state is read once (docs/design.md). */
    if (l > 1)
        copy_bytes(nx, st + sb, (l - 1) * sb);
    unsigned char *last = nx + (l - 1) * sb;
    if (pl->next_stored)
        copy_bytes(last, l < pl->na ? pl->a + l * L->row_bytes : pl->b + (l - pl->na) * L->row_bytes,
                   sb);
    else if (pl->final)
        copy_bytes(last, pl->final, sb);
    else
        memset(last, 0, sb);
    if (l < pick_len) {
        size_t pad = pick_len - l;
        memset(st + l * sb, 0, pad * sb);
        memset(nx + l * sb, 0, pad * sb);
        memset(ac + l * ab, 0, pad * ab);
        memset(rw + l * rb, 0, pad * rb);
    }
}

/* Resolves the chosen picks idx[0..count) into plans and metadata, and marks
 * their episodes sampled. Lock held. */
static void plan_batch_locked(exr_buffer *b, size_t count, const size_t *idx, plan_t *plans,
                              exr_batch_out *out)
{
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

static inline void prefetch_range(const unsigned char *p, size_t n)
{
    if (!p)
        return;
    for (size_t off = 0; off < n; off += 64)
        __builtin_prefetch(p + off);
    __builtin_prefetch(p + n - 1);
}

/* Every line pick pl will read, so that the misses of the picks ahead
 * overlap with the copying of this one. */
static inline void prefetch_pick(const exr_store_layout *L, const plan_t *pl)
{
    size_t rows = pl->len + pl->next_stored;
    size_t a = rows < pl->na ? rows : pl->na;
    prefetch_range(pl->a, a * L->row_bytes);
    if (rows > a)
        prefetch_range(pl->b, (rows - a) * L->row_bytes);
}

static void copy_batch(const exr_buffer *b, size_t count, const plan_t *plans,
                       exr_batch_out *out)
{
    const exr_store_layout *L = &b->lay;
    size_t P = b->cfg.pick_len;
    size_t ss = P * L->state_bytes, as = P * L->action_bytes, rs = P * L->reward_bytes;
    unsigned char *st = out->state, *ac = out->action, *rw = out->reward, *nx = out->state_next;
    /* how many picks ahead to prefetch: enough lines in flight to cover a
     * DRAM miss (the core tracks a few dozen), capped for huge picks */
    size_t lines = (P + 1) * L->row_bytes / 64 + 2;
    size_t ahead = lines >= 48 ? 1 : 48 / lines;
    for (size_t i = 0; i < count && i < ahead; i++)
        prefetch_pick(L, &plans[i]);
    for (size_t i = 0; i < count; i++) {
        if (i + ahead < count)
            prefetch_pick(L, &plans[i + ahead]);
        copy_pick(L, &plans[i], P, st + i * ss, ac + i * as, rw + i * rs, nx + i * ss);
    }
}

/* rw held (shared or exclusive): nothing can be buried meanwhile */
static void pin_locked(exr_buffer *b, exr_reader *r)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    r->epoch = b->epoch;
    r->prev = NULL;
    r->next = b->readers;
    if (b->readers)
        b->readers->prev = r;
    b->readers = r;
    pthread_mutex_unlock(&b->lk->pin_mu);
}

/* No other lock needed (takes pin_mu). */
static void unpin(exr_buffer *b, exr_reader *r)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        b->readers = r->next;
    if (r->next)
        r->next->prev = r->prev;
    uint64_t lo = UINT64_MAX;
    for (exr_reader *o = b->readers; o; o = o->next)
        if (o->epoch < lo)
            lo = o->epoch;
    /* a body buried at epoch e was visible to readers pinned before e */
    free_graveyard_upto(b, lo);
    pthread_mutex_unlock(&b->lk->pin_mu);
}

/* Whether the pick at table index i is published: not entered by a record
 * call still copying its rows. */
static inline bool pick_visible_locked(const exr_buffer *b, size_t i)
{
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
    for (size_t i = 0; i < count; i++)
        for (int tries = 0; !pick_visible_locked(b, idx[i]); tries++)
            if (tries == 64 || s->vt->sample(s, b->picks.n, 1, &idx[i], &w[i], scratch) != EXR_OK)
                return 0;
    return 1;
}

void exr_buffer_set_hook_locked(exr_buffer *b, exr_step_hook fn, void *ctx)
{
    b->hook = fn;
    b->hook_ctx = fn ? ctx : NULL;
}

void exr_buffer_pin_locked(exr_buffer *b, exr_reader *r) { pin_locked(b, r); }
void exr_buffer_unpin_locked(exr_buffer *b, exr_reader *r) { unpin(b, r); }

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

exr_status exr_buffer_get_batch(exr_buffer *b, int64_t h, size_t count, exr_batch_out *out)
{
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

/* The aux entry (holding the table index) of pick (epi, pos), or NULL if
 * there is no such pick. */
static uint32_t *pick_aux_locked(const exr_buffer *b, int64_t epi, int64_t pos)
{
    uint32_t slot = exr_episodes_find(&b->eps, epi);
    if (slot == EXR_NIL || pos < 0)
        return NULL;
    const exr_episode *e = &b->eps.slab[slot];
    if ((uint64_t)pos >= e->m)
        return NULL;
    return exr_aux_at(e, (uint64_t)pos);
}

/* Index of pick (epi, pos) in the table, or SIZE_MAX. */
static size_t pick_index_locked(const exr_buffer *b, int64_t epi, int64_t pos)
{
    const uint32_t *aux = pick_aux_locked(b, epi, pos);
    return aux ? *aux : SIZE_MAX;
}

exr_status exr_buffer_gather(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                             const int64_t *pos, exr_batch_out *out)
{
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

/* ---- priorities -------------------------------------------------------- */

/* Table index of pick (epi, pos) when hint still holds it: a batch's index
 * is only a hint, since picks move by swap-removal after it was drawn. The
 * table holds live picks only, and handles are never reused, so an entry
 * naming this episode's handle and this position is this pick. */
static inline int hint_holds(const exr_buffer *b, int64_t hint, int64_t epi, int64_t pos)
{
    if (hint < 0 || (uint64_t)hint >= b->picks.n)
        return 0;
    const exr_pick *pk = &b->picks.v[hint];
    return (int64_t)pk->pos == pos && b->eps.slab[pk->slot].handle == epi;
}

#define PRIO_SMALL 256

static exr_status set_priority_impl(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                    const int64_t *pos, const int64_t *hint, const double *prio,
                                    size_t prio_stride, size_t *applied)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    for (size_t i = 0; i < count; i++) {
        double p = prio[i * prio_stride];
        if (!isfinite(p) || p < 0)
            return EXR_EINVAL;
    }
    size_t done = 0;
    if (e->sel->vt->prioritized && count) {
        size_t small_idx[PRIO_SMALL], small_scratch[PRIO_SMALL];
        double small_kept[PRIO_SMALL];
        uint32_t *small_aux[PRIO_SMALL];
        size_t *idx = small_idx, *scratch = small_scratch;
        double *kept = small_kept;
        uint32_t **aux = small_aux;
        if (count > PRIO_SMALL) {
            size_t bytes;
            if (!exr_mul_size(count, sizeof(size_t), &bytes))
                return EXR_EOVERFLOW;
            idx = malloc(bytes);
            scratch = malloc(bytes);
            kept = malloc(count * sizeof *kept);
            aux = malloc(count * sizeof *aux);
            if (!idx || !scratch || !kept || !aux) {
                free(idx);
                free(scratch);
                free(kept);
                free(aux);
                return EXR_ENOMEM;
            }
        }
        /* Pass 1 prefetches what pass 2 reads: the hinted table entry, or
         * the pick's aux entry found through the map (kept in aux[i]; NULL:
         * no such pick; `unresolved`: hinted, not looked up). Pass 2
         * resolves. The dependent misses of different picks overlap. */
        static uint32_t unresolved_;
        uint32_t *const unresolved = &unresolved_;
        for (size_t i = 0; i < count; i++) {
            if (hint && hint[i] >= 0 && (uint64_t)hint[i] < b->picks.n) {
                __builtin_prefetch(&b->picks.v[hint[i]]);
                aux[i] = unresolved;
            } else {
                aux[i] = pick_aux_locked(b, epi[i], pos[i]);
                if (aux[i])
                    __builtin_prefetch(aux[i]);
            }
        }
        for (size_t i = 0; i < count; i++) {
            size_t j;
            if (aux[i] == unresolved && hint_holds(b, hint[i], epi[i], pos[i])) {
                j = (size_t)hint[i];
            } else {
                const uint32_t *a = aux[i] == unresolved ? pick_aux_locked(b, epi[i], pos[i]) : aux[i];
                if (!a)
                    continue;
                j = *a;
            }
            idx[done] = j;
            kept[done] = prio[i * prio_stride];
            done++;
        }
        pthread_mutex_lock(&e->sel->mu);
        e->sel->vt->update_many(e->sel, done, idx, kept, scratch);
        pthread_mutex_unlock(&e->sel->mu);
        if (idx != small_idx) {
            free(idx);
            free(scratch);
            free(kept);
            free(aux);
        }
    }
    *applied = done;
    return EXR_OK;
}

exr_status exr_buffer_set_priority_locked(exr_buffer *b, int64_t h, size_t count,
                                          const int64_t *epi, const int64_t *pos,
                                          const double *prio, size_t prio_stride,
                                          size_t *applied)
{
    return set_priority_impl(b, h, count, epi, pos, NULL, prio, prio_stride, applied);
}

exr_status exr_buffer_set_priority(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                   const int64_t *pos, const int64_t *hint, const double *prio,
                                   size_t prio_stride, size_t *applied)
{
    lock_shared(b);
    exr_status st = set_priority_impl(b, h, count, epi, pos, hint, prio, prio_stride, applied);
    exr_buffer_unlock(b);
    return st;
}

exr_status exr_buffer_priority_stats_locked(const exr_buffer *b, int64_t h, double *total,
                                            double *min_pos, uint64_t *n)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    e->sel->vt->stats(e->sel, b->picks.n, total, min_pos);
    *n = b->picks.n;
    return EXR_OK;
}

/* ---- introspection ----------------------------------------------------- */

exr_status exr_buffer_episode_info_locked(const exr_buffer *b, int64_t h, uint64_t *n,
                                          bool *ended, bool *terminated, bool *has_final)
{
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot == EXR_NIL)
        return EXR_ENOTFOUND;
    const exr_episode *e = &b->eps.slab[slot];
    /* a busy episode shows what it held before the call copying into it,
     * which had not ended it (an ended episode takes no more records) */
    *n = e->busy ? e->n_pub : e->n;
    *ended = e->ended && !e->busy;
    *terminated = e->terminated && !e->busy;
    *has_final = e->body->final_state != NULL && !e->busy;
    return EXR_OK;
}

exr_status exr_buffer_episode_copy_locked(const exr_buffer *b, int64_t h, void *state,
                                          void *action, void *reward, void *final)
{
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot == EXR_NIL)
        return EXR_ENOTFOUND;
    const exr_store_layout *L = &b->lay;
    const exr_episode *e = &b->eps.slab[slot];
    unsigned char *st = state, *ac = action, *rw = reward;
    uint64_t p = 0, n = e->busy ? e->n_pub : e->n;
    for (uint32_t k = 0; p < n; k++) {
        size_t cnt = exr_store_seg_cap(L, k);
        if (cnt > n - p)
            cnt = (size_t)(n - p);
        unsigned char *seg = e->body->segs[k];
        for (size_t r = 0; r < cnt; r++) {
            memcpy(st + (p + r) * L->state_bytes, exr_seg_state(L, seg, r), L->state_bytes);
            memcpy(ac + (p + r) * L->action_bytes, exr_seg_action(L, seg, r), L->action_bytes);
            memcpy(rw + (p + r) * L->reward_bytes, exr_seg_reward(L, seg, r), L->reward_bytes);
        }
        p += cnt;
    }
    if (final && e->body->final_state && !e->busy)
        memcpy(final, e->body->final_state, L->state_bytes);
    return EXR_OK;
}

void exr_buffer_handles_locked(const exr_buffer *b, int64_t *out)
{
    size_t i = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        out[i++] = b->eps.slab[s].handle;
}

void exr_buffer_picks_locked(const exr_buffer *b, int64_t *epi, int64_t *pos)
{
    for (size_t i = 0; i < b->picks.n; i++) {
        epi[i] = b->eps.slab[b->picks.v[i].slot].handle;
        pos[i] = b->picks.v[i].pos;
    }
}

exr_status exr_buffer_stored_priority_locked(const exr_buffer *b, int64_t h, size_t count,
                                             const int64_t *epi, const int64_t *pos, double *out)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    for (size_t i = 0; i < count; i++) {
        size_t idx = pick_index_locked(b, epi[i], pos[i]);
        out[i] = idx == SIZE_MAX ? NAN : e->sel->vt->stored(e->sel, idx);
    }
    return EXR_OK;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                        \
        return 1;                                                                                  \
    } while (0)

int exr_buffer_check_locked(const exr_buffer *b, char *msg, size_t msglen)
{
    const exr_episodes *t = &b->eps;
    uint64_t records = 0, picks = 0, count = 0;
    int64_t prev_handle = -1;
    uint32_t prev_slot = EXR_NIL;
    bool hand_seen = b->hand == EXR_NIL;
    if (b->cfg.eviction == EXR_EVICT_FIFO && b->hand != EXR_NIL)
        FAIL("a FIFO buffer has a second-chance hand (slot %u)", (unsigned)b->hand);
    for (uint32_t s = t->head; s != EXR_NIL; s = t->slab[s].next) {
        const exr_episode *e = &t->slab[s];
        if (++count > t->count)
            FAIL("live list is longer than the %llu episodes counted", (unsigned long long)t->count);
        if (e->prev != prev_slot)
            FAIL("episode %lld: prev link broken", (long long)e->handle);
        if (e->handle <= prev_handle || e->handle >= b->next_handle)
            FAIL("episode %lld out of handle order (after %lld, next %lld)", (long long)e->handle,
                 (long long)prev_handle, (long long)b->next_handle);
        if (exr_episodes_find(t, e->handle) != s)
            FAIL("episode %lld: map does not lead to its slot", (long long)e->handle);
        if (s == b->hand)
            hand_seen = true;
        if (e->m != exr_picks_target(b, e))
            FAIL("episode %lld: %llu picks, expected %llu", (long long)e->handle,
                 (unsigned long long)e->m, (unsigned long long)exr_picks_target(b, e));
        size_t k, off;
        exr_store_locate(&b->lay, e->n ? e->n - 1 : 0, &k, &off);
        if (e->n && k >= e->body->nsegs)
            FAIL("episode %lld: %llu records but %u segments", (long long)e->handle,
                 (unsigned long long)e->n, e->body->nsegs);
        if (e->n && (e->body->last_rows < off + 1 || e->body->last_rows > exr_store_seg_cap(&b->lay, k) ||
                      e->body->nsegs != k + 1))
            FAIL("episode %lld: last segment holds %u rows for offset %zu of segment %zu (%u segments)",
                 (long long)e->handle, e->body->last_rows, off, k, e->body->nsegs);
        if (e->body->aux_cap < e->n)
            FAIL("episode %lld: aux has room for %llu of %llu records", (long long)e->handle,
                 (unsigned long long)e->body->aux_cap, (unsigned long long)e->n);
        if (!e->ended && (e->terminated || e->body->final_state))
            FAIL("episode %lld: open but has a final state or terminal flag", (long long)e->handle);
        for (uint64_t p = 0; p < e->m; p++) {
            uint32_t idx = *exr_aux_at(e, p);
            if (idx >= b->picks.n || b->picks.v[idx].slot != s || b->picks.v[idx].pos != p)
                FAIL("episode %lld: pick %llu points at table entry %u, which does not point back",
                     (long long)e->handle, (unsigned long long)p, idx);
        }
        records += e->n;
        picks += e->m;
        prev_handle = e->handle;
        prev_slot = s;
    }
    if (prev_slot != t->tail)
        FAIL("tail link broken");
    if (count != t->count || count != t->map_used)
        FAIL("%llu live episodes, counted %llu, map holds %zu", (unsigned long long)count,
             (unsigned long long)t->count, t->map_used);
    if (records != b->n_records)
        FAIL("episodes hold %llu records, buffer counts %llu", (unsigned long long)records,
             (unsigned long long)b->n_records);
    if (picks != b->picks.n)
        FAIL("episodes hold %llu picks, table has %zu", (unsigned long long)picks, b->picks.n);
    if (b->cfg.capacity && b->n_records > b->cfg.capacity)
        FAIL("%llu records exceed capacity %llu", (unsigned long long)b->n_records,
             (unsigned long long)b->cfg.capacity);
    if (!hand_seen)
        FAIL("second-chance hand is not on a live episode");
    for (size_t i = 0; i < b->nsels; i++)
        if (b->sels[i].sel->vt->check(b->sels[i].sel, b->picks.n, msg, msglen))
            return 1;
    return 0;
}
