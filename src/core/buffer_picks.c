/*
 * buffer_picks.c - the pick table: which picks an episode has, entering them into the
 * table and every selector, removing one by swap, finding one by (episode, position).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

uint64_t exr_picks_target(const exr_buffer *b, const exr_episode *e)
{
    uint64_t c = complete_steps(e), L = b->cfg.pick_len;
    if (e->ended && b->cfg.allow_short)
        return c;
    return c >= L ? c - L + 1 : 0;
}

/* How many picks the table holds at most once the buffer is full: one per
 * record of its capacity (exr_pick_table_reserve). */
size_t full_picks(const exr_buffer *b)
{
    return b->cfg.capacity && b->cfg.capacity < SIZE_MAX ? (size_t)b->cfg.capacity : SIZE_MAX;
}

/* Room for `extra` more picks in the table and every selector. */
exr_status reserve_picks(exr_buffer *b, size_t extra)
{
    size_t need;
    if (!exr_add_size(b->picks.n, extra, &need))
        return EXR_EOVERFLOW;
    exr_status st = exr_pick_table_reserve(&b->picks, need, full_picks(b));
    for (size_t i = 0; st == EXR_OK && i < b->nsels; i++)
        st = b->sels[i].sel->vt->reserve(b->sels[i].sel, need);
    return st;
}

/* Bit i: selector i (i < 64) takes the stored forms of pl (add_stored). */
static uint64_t stored_users(const exr_buffer *b, const exr_pick_leaves *pl)
{
    uint64_t use = 0;
    for (size_t i = 0; pl && i < b->nsels && i < 64; i++) {
        const exr_selector *s = b->sels[i].sel;
        if (s->vt->add_stored && s->vt->stored_power && s->vt->stored_power(s) == pl->power)
            use |= (uint64_t)1 << i;
    }
    return use;
}

void note_idents_locked(exr_buffer *b, size_t i0, size_t n)
{
    EXR_ASSERT_EXCLUSIVE(b);
    for (size_t i = 0; n && i < b->nsels; i++) {
        exr_selector *s = b->sels[i].sel;
        if (s->vt->idents)
            s->vt->idents(s, i0, n, b->picks.v[i0]);
    }
}

#define ENTER_CHUNK 64
#define REMOVE_CHUNK 64

/* m new picks of episode slot, positions p, p + 1, ..., at table indices
 * i0, i0 + 1, ... (places when rep: selector.h, replace): each selector
 * gets them in that order (selector by selector: each keeps its own
 * state, so this leaves every one as entering them pick by pick would),
 * then the table and aux. rp: their recorded priorities; lf: their stored
 * forms, for the selectors in use. */
static void enter_run(exr_buffer *b, uint32_t slot, uint64_t p, size_t i0, size_t m,
                      const float *rp, const float *lf, uint64_t use, bool rep, uint32_t *aux)
{
    for (size_t i = 0; i < b->nsels; i++) {
        exr_selector *s = b->sels[i].sel;
        const exr_selector_vtable *vt = s->vt;
        void (*run)(exr_selector *, size_t, size_t, const float *, const float *) =
            rep ? vt->replace_stored : vt->add_stored;
        if (i < 64 && (use >> i & 1) && run)
            run(s, i0, m, rp, lf);
        else
            for (size_t k = 0; k < m; k++)
                (rep ? vt->replace : vt->add)(s, i0 + k, rp[k]);
    }
    for (size_t k = 0; k < m; k++) {
        b->picks.v[i0 + k] = (exr_pick){slot, (uint32_t)(p + k)};
        aux[k] = (uint32_t)(i0 + k);
    }
    note_idents_locked(b, i0, m);
}

/* Enters the n picks of episode slot at positions p0, p0 + 1, ...: into
 * the places kept (take_places_locked), then at the end of the table. */
static void enter_chunk(exr_buffer *b, uint32_t slot, uint64_t p0, size_t n,
                        const exr_pick_leaves *pl, uint64_t use)
{
    exr_episode *e = &b->eps.slab[slot];
    uint32_t *aux = e->body->aux + p0;
    float rp[ENTER_CHUNK], lf[ENTER_CHUNK];
    memcpy(rp, aux, n * sizeof *rp); /* the recorded priorities, as float */
    for (size_t k = 0; use && k < n; k++)
        lf[k] = p0 + k >= pl->first && p0 + k < pl->end ? pl->v[p0 + k - pl->first] : NAN;
    for (size_t k = 0; k < n;) {
        size_t i0;
        bool rep;
        size_t m = take_places_locked(b, n - k, &i0, &rep);
        enter_run(b, slot, p0 + k, i0, m, rp + k, lf + k, use, rep, aux + k);
        k += m;
    }
}

bool enter_picks_stored_locked(exr_buffer *b, uint32_t slot, const exr_pick_leaves *pl)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    uint64_t target = exr_picks_target(b, e);
    uint64_t use = target > e->m ? stored_users(b, pl) : 0;
    if (!use)
        return false;
    for (uint64_t p = e->m; p < target; p += ENTER_CHUNK) {
        size_t n = target - p < ENTER_CHUNK ? (size_t)(target - p) : ENTER_CHUNK;
        enter_chunk(b, slot, p, n, pl, use);
    }
    b->sel_dirty = true;
    e->m = target;
    return true;
}

/* Removes n picks from the table, one after another, each by swap (the
 * last pick moves into its place): those of episode e at positions p0,
 * p0 + 1, ... (their indices read from aux as each one's turn comes), or
 * at the indices list[0..n) (no later one at or above the table's last
 * index when an earlier one leaves: close_holes_locked); then from each
 * selector in the same order (selector by selector: each keeps its own
 * state, so this leaves every one as removing them pick by pick would). */
static void remove_chunk(exr_buffer *b, const exr_episode *e, uint64_t p0, const uint32_t *list,
                         size_t n)
{
    size_t gone[REMOVE_CHUNK], last0 = b->picks.n - 1;
    b->moves++;
    /* the holes are at random places in the table (earlier swaps moved
     * the episode's picks around): their lines fetched for writing all at
     * once, so that the stores' misses overlap */
    for (size_t k = 0; k < n; k++)
        __builtin_prefetch(&b->picks.v[list ? list[k] : *exr_aux_at(e, p0 + k)], 1);
    for (size_t k = 0; k < n; k++) {
        size_t i = list ? list[k] : *exr_aux_at(e, p0 + k), last = b->picks.n - 1;
        if (i != last) {
            exr_pick moved = b->picks.v[last];
            b->picks.v[i] = moved;
            *exr_aux_at(&b->eps.slab[moved.slot], moved.pos) = (uint32_t)i;
        }
        b->picks.n--;
        gone[k] = i;
    }
    b->low[b->moves % EXR_LOWS] = b->picks.n; /* every last moved was at or past it */
    for (size_t s = 0; s < b->nsels; s++) {
        exr_selector *sel = b->sels[s].sel;
        if (sel->vt->remove_many)
            sel->vt->remove_many(sel, n, gone, last0);
        else
            for (size_t k = 0; k < n; k++)
                sel->vt->remove(sel, gone[k], last0 - k);
    }
}

/* Room for k more places; false if it cannot be had. */
static bool holes_room(exr_buffer *b, size_t k)
{
    if (b->holes_first == b->holes_n)
        b->holes_first = b->holes_n = 0;
    size_t need, cap = b->holes_cap, bytes;
    if (!exr_add_size(b->holes_n, k, &need))
        return false;
    if (need <= cap)
        return true;
    cap = cap < 256 ? 256 : cap;
    while (cap < need)
        if (!exr_mul_size(cap, 2, &cap))
            return false;
    if (!exr_mul_size(cap, sizeof *b->holes, &bytes))
        return false;
    uint32_t *h = realloc(b->holes, bytes);
    if (!h)
        return false;
    b->holes = h;
    b->holes_cap = cap;
    return true;
}

static int index_above(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, c = *(const uint32_t *)y;
    return a > c ? -1 : a < c;
}

void close_holes_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    size_t f = b->holes_first, c = b->holes_n - f;
    b->holes_first = b->holes_n = 0;
    if (!c)
        return;
    uint32_t *h = b->holes + f;
    /* from the highest index down: the table's last entry is then never a
     * place still to close (those above it are closed, it is below). An
     * evicted episode's places usually come in ascending order (its picks
     * entered at the end, or into the places of an episode before it):
     * then reversed, else sorted */
    size_t up = 1;
    while (up < c && h[up] > h[up - 1])
        up++;
    if (up == c)
        for (size_t k = 0; k < c / 2; k++) {
            uint32_t t = h[k];
            h[k] = h[c - 1 - k];
            h[c - 1 - k] = t;
        }
    else
        qsort(h, c, sizeof *h, index_above);
    for (size_t k = 0; k < c; k += REMOVE_CHUNK)
        remove_chunk(b, NULL, 0, h + k, c - k < REMOVE_CHUNK ? c - k : REMOVE_CHUNK);
    b->sel_dirty = true;
}

void remove_picks_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    const exr_episode *e = &b->eps.slab[slot];
    if (!e->m)
        return;
    if (b->keep_holes && holes_room(b, e->m)) {
        /* the picks stay in the table and the selectors until the call's
         * new picks take their places or close_holes_locked removes them;
         * a move for the draws' notes all the same (resolve_noted: an
         * index below low may have been given to another pick since) */
        for (uint64_t p = 0; p < e->m; p++)
            b->holes[b->holes_n++] = *exr_aux_at(e, p);
        b->moves++;
        b->low[b->moves % EXR_LOWS] = b->picks.n;
        return;
    }
    close_holes_locked(b); /* without room for more: the places kept leave first */
    for (uint64_t p = 0; p < e->m; p += REMOVE_CHUNK) {
        size_t n = e->m - p < REMOVE_CHUNK ? (size_t)(e->m - p) : REMOVE_CHUNK;
        remove_chunk(b, e, p, NULL, n);
    }
    b->sel_dirty = true;
}

/* The aux entry (holding the table index) of pick (epi, pos), or NULL if
 * there is no such pick. */
uint32_t *pick_aux_locked(const exr_buffer *b, int64_t epi, int64_t pos)
{
    EXR_ASSERT_LOCKED(b);
    uint32_t slot = exr_episodes_find(&b->eps, epi);
    if (slot == EXR_NIL || pos < 0)
        return NULL;
    const exr_episode *e = &b->eps.slab[slot];
    if ((uint64_t)pos >= e->m)
        return NULL;
    return exr_aux_at(e, (uint64_t)pos);
}

/* aux[i] = pick_aux_locked(b, epi[i], pos[i]) for i < count, in passes
 * over the whole batch (map cell, slot, aux entry) so that the picks'
 * chains of dependent misses overlap, the entries prefetched for the
 * caller; slots: count words of scratch. */
void pick_aux_many_locked(const exr_buffer *b, size_t count, const int64_t *epi,
                          const int64_t *pos, size_t *slots, uint32_t **aux)
{
    EXR_ASSERT_LOCKED(b);
    exr_episodes_find_many(&b->eps, count, epi, slots);
    for (size_t i = 0; i < count; i++) {
        const exr_episode *e = slots[i] == EXR_NIL ? NULL : &b->eps.slab[slots[i]];
        /* read once: pos may be the caller's memory, written by another
         * thread meanwhile (set_priority runs without the GIL); the value
         * checked is the value used */
        int64_t p = __atomic_load_n(&pos[i], __ATOMIC_RELAXED);
        aux[i] = e && p >= 0 && (uint64_t)p < e->m ? exr_aux_at(e, (uint64_t)p) : NULL;
        if (aux[i])
            __builtin_prefetch(aux[i]);
    }
}

/* Index of pick (epi, pos) in the table, or SIZE_MAX. */
size_t pick_index_locked(const exr_buffer *b, int64_t epi, int64_t pos)
{
    EXR_ASSERT_LOCKED(b);
    const uint32_t *aux = pick_aux_locked(b, epi, pos);
    return aux ? *aux : SIZE_MAX;
}
