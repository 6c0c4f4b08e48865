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

/* Room for `extra` more picks in the table and every selector. */
exr_status reserve_picks(exr_buffer *b, size_t extra)
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
void enter_picks_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
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
    if (target > e->m)
        b->sel_dirty = true;
    e->m = target;
}

void remove_pick_locked(exr_buffer *b, size_t i)
{
    EXR_ASSERT_EXCLUSIVE(b);
    size_t last = b->picks.n - 1;
    if (i != last) {
        exr_pick moved = b->picks.v[last];
        b->picks.v[i] = moved;
        *exr_aux_at(&b->eps.slab[moved.slot], moved.pos) = (uint32_t)i;
    }
    b->picks.n--;
    b->sel_dirty = true;
    for (size_t s = 0; s < b->nsels; s++)
        b->sels[s].sel->vt->remove(b->sels[s].sel, i, last);
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

/* Index of pick (epi, pos) in the table, or SIZE_MAX. */
size_t pick_index_locked(const exr_buffer *b, int64_t epi, int64_t pos)
{
    EXR_ASSERT_LOCKED(b);
    const uint32_t *aux = pick_aux_locked(b, epi, pos);
    return aux ? *aux : SIZE_MAX;
}
