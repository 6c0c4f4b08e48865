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

/* Enters the n picks of episode slot at positions p0, p0 + 1, ... at table
 * indices picks.n, picks.n + 1, ...: each selector gets them in that order
 * (selector by selector: each keeps its own state, so this leaves every
 * one as adding them pick by pick would), then the table and aux. */
static void enter_chunk(exr_buffer *b, uint32_t slot, uint64_t p0, size_t n,
                        const exr_pick_leaves *pl, uint64_t use)
{
    exr_episode *e = &b->eps.slab[slot];
    uint32_t *aux = e->body->aux + p0;
    float rp[ENTER_CHUNK], lf[ENTER_CHUNK];
    memcpy(rp, aux, n * sizeof *rp); /* the recorded priorities, as float */
    for (size_t k = 0; use && k < n; k++)
        lf[k] = p0 + k >= pl->first && p0 + k < pl->end ? pl->v[p0 + k - pl->first] : NAN;
    size_t idx0 = b->picks.n;
    for (size_t i = 0; i < b->nsels; i++) {
        exr_selector *s = b->sels[i].sel;
        if (i < 64 && (use >> i & 1))
            s->vt->add_stored(s, idx0, n, rp, lf);
        else
            for (size_t k = 0; k < n; k++)
                s->vt->add(s, idx0 + k, rp[k]);
    }
    for (size_t k = 0; k < n; k++) {
        b->picks.v[idx0 + k] = (exr_pick){slot, (uint32_t)(p0 + k)};
        aux[k] = (uint32_t)(idx0 + k);
    }
    b->picks.n = idx0 + n;
    note_idents_locked(b, idx0, n);
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

/* Removes the n picks of episode e at positions p0, p0 + 1, ... from the
 * table, in that order, each by swap (the last pick moves into its place),
 * and then from each selector in the same order (selector by selector:
 * each keeps its own state, so this leaves every one as removing them
 * pick by pick would). */
static void remove_chunk(exr_buffer *b, const exr_episode *e, uint64_t p0, size_t n)
{
    size_t gone[REMOVE_CHUNK], last0 = b->picks.n - 1;
    b->moves++;
    /* the holes are at random places in the table (earlier swaps moved
     * the episode's picks around): their lines fetched for writing all at
     * once, so that the stores' misses overlap */
    for (size_t k = 0; k < n; k++)
        __builtin_prefetch(&b->picks.v[*exr_aux_at(e, p0 + k)], 1);
    for (size_t k = 0; k < n; k++) {
        size_t i = *exr_aux_at(e, p0 + k), last = b->picks.n - 1;
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

void remove_picks_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    const exr_episode *e = &b->eps.slab[slot];
    for (uint64_t p = 0; p < e->m; p += REMOVE_CHUNK) {
        size_t n = e->m - p < REMOVE_CHUNK ? (size_t)(e->m - p) : REMOVE_CHUNK;
        remove_chunk(b, e, p, n);
    }
    if (e->m)
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
