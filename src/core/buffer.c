#include "buffer.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

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
    if (pthread_mutex_init(&b->mu, NULL) != 0) {
        free(b);
        return EXR_ENOMEM;
    }
    exr_episodes_init(&b->eps);
    exr_pick_table_init(&b->picks);
    b->hand = EXR_NIL;
    *out = b;
    return EXR_OK;
}

static void free_graveyard_upto(exr_buffer *b, uint64_t epoch)
{
    while (b->grave_head && b->grave_head->epoch <= epoch) {
        exr_body *d = b->grave_head;
        b->grave_head = d->next_dead;
        exr_body_free(d);
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
    exr_episodes_free(&b->eps);
    exr_pick_table_free(&b->picks);
    for (size_t i = 0; i < b->nsels; i++)
        b->sels[i].sel->vt->destroy(b->sels[i].sel);
    free(b->sels);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

const exr_config *exr_buffer_config(const exr_buffer *b) { return &b->cfg; }

void exr_buffer_lock(exr_buffer *b) { pthread_mutex_lock(&b->mu); }
int exr_buffer_trylock(exr_buffer *b) { return pthread_mutex_trylock(&b->mu) == 0; }
void exr_buffer_unlock(exr_buffer *b) { pthread_mutex_unlock(&b->mu); }

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
    if (!b->readers) {
        exr_body_free(body);
        return;
    }
    body->epoch = ++b->epoch;
    body->next_dead = NULL;
    if (b->grave_tail)
        b->grave_tail->next_dead = body;
    else
        b->grave_head = body;
    b->grave_tail = body;
}

/* A segment that a copy running without the lock may still read: freed now
 * if none runs, else parked with node (allocated beforehand) until they end. */
static void bury_segment(exr_buffer *b, unsigned char *seg, exr_dead *node)
{
    if (!b->readers) {
        free(seg);
        free(node);
        return;
    }
    node->seg = seg;
    node->epoch = ++b->epoch;
    node->next = NULL;
    if (b->dead_tail)
        b->dead_tail->next = node;
    else
        b->dead_head = node;
    b->dead_tail = node;
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
    exr_dead *node = b->readers ? malloc(sizeof *node) : NULL;
    if (!seg || (b->readers && !node)) {
        free(seg);
        free(node);
        return;
    }
    memcpy(seg, body->segs[k], used * L->row_bytes);
    bury_segment(b, body->segs[k], node);
    body->segs[k] = seg;
    body->last_rows = (uint32_t)used;
}

static exr_status record_one_locked(exr_buffer *b, int64_t h, const void *state,
                                    const void *action, const void *reward, double priority,
                                    const void *final_state, bool end, bool terminated,
                                    int64_t *out_h)
{
    const exr_store_layout *L = &b->lay;
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot != EXR_NIL && b->eps.slab[slot].ended)
        slot = EXR_NIL;
    bool fresh = slot == EXR_NIL;
    exr_body *body = NULL, *fresh_body = NULL;
    unsigned char *newseg = NULL, *fin = NULL;
    exr_dead *node = NULL;
    size_t new_rows = 0;
    exr_status st = EXR_OK;
    uint64_t n = 0;

    /* Phase 1: every allocation this step needs; nothing visible changes. */
    if (fresh && b->next_handle >= EXR_MAX_HANDLE)
        return EXR_EOVERFLOW;
    if (fresh) {
        st = exr_episodes_reserve(&b->eps);
        if (st != EXR_OK)
            return st;
        fresh_body = body = exr_body_new(4);
        if (!body)
            return EXR_ENOMEM;
    } else {
        body = b->eps.slab[slot].body;
        n = b->eps.slab[slot].n;
        if (n >= (uint64_t)UINT32_MAX - 1)
            return EXR_EOVERFLOW;
    }
    if (n + 1 > body->aux_cap) {
        /* aux is read only under the lock, so it may move */
        uint64_t cap = body->aux_cap ? body->aux_cap * 2 : 16;
        uint32_t *aux = realloc(body->aux, cap * sizeof *aux);
        if (!aux) {
            st = EXR_ENOMEM;
            goto fail;
        }
        body->aux = aux;
        body->aux_cap = cap;
    }
    size_t k, off;
    exr_store_locate(L, n, &k, &off);
    if (k >= body->nsegs) {
        /* a new segment: room for a few rows at first */
        if (k >= body->cap) {
            exr_body *grown = exr_body_grow(body, body->cap * 2);
            if (!grown) {
                st = EXR_ENOMEM;
                goto fail;
            }
            body = grown;
            if (fresh)
                fresh_body = grown;
            else
                b->eps.slab[slot].body = grown; /* same content, new place */
        }
        new_rows = first_rows(L, k);
    } else if (off == body->last_rows) {
        /* the last segment is full before its nominal size: double it; the
         * old copy is parked while a get_batch may still be reading it */
        new_rows = (size_t)body->last_rows * 2;
        if (new_rows > exr_store_seg_cap(L, k))
            new_rows = exr_store_seg_cap(L, k);
        if (b->readers && !(node = malloc(sizeof *node))) {
            st = EXR_ENOMEM;
            goto fail;
        }
    }
    if (new_rows && !(newseg = exr_store_seg_alloc(L, new_rows))) {
        st = EXR_ENOMEM;
        goto fail;
    }
    if (end && final_state) {
        fin = malloc(L->state_bytes);
        if (!fin) {
            st = EXR_ENOMEM;
            goto fail;
        }
    }
    st = reserve_picks(b, (size_t)b->cfg.pick_len + 1);
    if (st != EXR_OK)
        goto fail;

    /* Phase 2: commit; nothing below can fail. */
    if (fresh) {
        *out_h = b->next_handle++;
        slot = exr_episodes_insert(&b->eps, *out_h, body);
    } else {
        *out_h = h;
    }
    exr_episode *e = &b->eps.slab[slot];
    if (newseg && k >= body->nsegs) {
        body->segs[body->nsegs++] = newseg;
    } else if (newseg) {
        memcpy(newseg, body->segs[k], off * L->row_bytes);
        bury_segment(b, body->segs[k], node);
        body->segs[k] = newseg;
    }
    if (newseg)
        body->last_rows = (uint32_t)new_rows;
    unsigned char *seg = body->segs[k];
    memcpy(exr_seg_state(L, seg, off), state, L->state_bytes);
    memcpy(exr_seg_action(L, seg, off), action, L->action_bytes);
    memcpy(exr_seg_reward(L, seg, off), reward, L->reward_bytes);
    float rp = prio_to_float(priority);
    memcpy(&body->aux[n], &rp, sizeof rp);
    e->n = n + 1;
    b->n_records++;
    if (end) {
        e->ended = 1;
        e->terminated = terminated;
        if (fin) {
            memcpy(fin, final_state, L->state_bytes);
            body->final_state = fin;
        }
    }
    enter_picks_locked(b, slot);
    if (end)
        shrink_ended_locked(b, e);
    evict_over_capacity_locked(b);
    return EXR_OK;

fail:
    free(newseg);
    free(fin);
    free(node);
    exr_body_free(fresh_body);
    return st;
}

exr_status exr_buffer_record_locked(exr_buffer *b, int64_t h, const exr_steps *in,
                                    int64_t *out_h)
{
    if (in->T == 0)
        return EXR_EINVAL;
    const exr_store_layout *L = &b->lay;
    const unsigned char *st = in->states, *ac = in->actions, *rw = in->rewards;
    for (size_t t = 0; t < in->T; t++) {
        bool last = t + 1 == in->T;
        exr_status r = record_one_locked(
            b, h, st + t * L->state_bytes, ac + t * L->action_bytes, rw + t * L->reward_bytes,
            in->priorities ? in->priorities[t] : NAN, last ? in->final_state : NULL,
            last && in->end, last && in->terminated, &h);
        if (r != EXR_OK)
            return r;
    }
    *out_h = h;
    return EXR_OK;
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
    if (!e->sampled)
        e->sampled = 1; /* only written when it changes: the line stays clean */
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
     * written, so each stored state is read once (SPEC §4). */
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

static void pin_locked(exr_buffer *b, exr_reader *r)
{
    r->epoch = b->epoch;
    r->prev = NULL;
    r->next = b->readers;
    if (b->readers)
        b->readers->prev = r;
    b->readers = r;
}

static void unpin_locked(exr_buffer *b, exr_reader *r)
{
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
    exr_buffer_lock(b);
    unpin_locked(b, &me);
    exr_buffer_unlock(b);
    scratch_free(sc);
    return EXR_OK;
}

exr_status exr_buffer_get_batch(exr_buffer *b, int64_t h, size_t count, exr_batch_out *out)
{
    batch_scratch sc;
    exr_status st = scratch_alloc(&sc, count);
    if (st != EXR_OK)
        return st;
    exr_buffer_lock(b);
    sel_entry *e = find_sel(b, h);
    st = !e ? EXR_ENOTFOUND
            : e->sel->vt->sample(e->sel, b->picks.n, count, sc.idx, out->weight, sc.scratch);
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
    exr_buffer_lock(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        st = EXR_ENOTFOUND;
    for (size_t i = 0; st == EXR_OK && i < count; i++) {
        sc.idx[i] = pick_index_locked(b, epi[i], pos[i]);
        if (sc.idx[i] == SIZE_MAX)
            st = EXR_ENOTFOUND;
    }
    if (st != EXR_OK) {
        exr_buffer_unlock(b);
        scratch_free(&sc);
        return st;
    }
    e->sel->vt->weights(e->sel, b->picks.n, count, sc.idx, out->weight);
    return finish_batch(b, count, &sc, out);
}

/* ---- priorities -------------------------------------------------------- */

exr_status exr_buffer_set_priority_locked(exr_buffer *b, int64_t h, size_t count,
                                          const int64_t *epi, const int64_t *pos,
                                          const double *prio, size_t prio_stride,
                                          size_t *applied)
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
        /* Pass 1 finds each pick's episode and prefetches its aux entry;
         * pass 2 reads the pick indices; then the selector updates all of
         * them at once. Dependent misses of different picks overlap. */
        size_t *idx = malloc(count * sizeof *idx), *scratch = malloc(count * sizeof *scratch);
        uint32_t **aux = malloc(count * sizeof *aux);
        double *kept = malloc(count * sizeof *kept);
        if (!idx || !scratch || !aux || !kept) {
            free(idx);
            free(scratch);
            free(aux);
            free(kept);
            return EXR_ENOMEM;
        }
        for (size_t i = 0; i < count; i++) {
            aux[i] = pick_aux_locked(b, epi[i], pos[i]);
            if (aux[i])
                __builtin_prefetch(aux[i]);
        }
        for (size_t i = 0; i < count; i++) {
            if (!aux[i])
                continue;
            idx[done] = *aux[i];
            kept[done] = prio[i * prio_stride];
            done++;
        }
        e->sel->vt->update_many(e->sel, done, idx, kept, scratch);
        free(idx);
        free(scratch);
        free(aux);
        free(kept);
    }
    *applied = done;
    return EXR_OK;
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
    *n = e->n;
    *ended = e->ended;
    *terminated = e->terminated;
    *has_final = e->body->final_state != NULL;
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
    uint64_t p = 0;
    for (uint32_t k = 0; p < e->n; k++) {
        size_t cnt = exr_store_seg_cap(L, k);
        if (cnt > e->n - p)
            cnt = (size_t)(e->n - p);
        unsigned char *seg = e->body->segs[k];
        for (size_t r = 0; r < cnt; r++) {
            memcpy(st + (p + r) * L->state_bytes, exr_seg_state(L, seg, r), L->state_bytes);
            memcpy(ac + (p + r) * L->action_bytes, exr_seg_action(L, seg, r), L->action_bytes);
            memcpy(rw + (p + r) * L->reward_bytes, exr_seg_reward(L, seg, r), L->reward_bytes);
        }
        p += cnt;
    }
    if (final && e->body->final_state)
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
