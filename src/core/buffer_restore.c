/*
 * buffer_restore.c - what the codec (codec_write.c, codec_read.c) needs of
 * the buffer beyond reading its tables: the counters it saves, and the
 * operations that put a read buffer back together. The codec never writes
 * struct exr_buffer's fields itself.
 */
#include <pthread.h>
#include <stdlib.h>

#include "buffer_impl.h"

void exr_buffer_counters_locked(const exr_buffer *b, exr_counters *c)
{
    EXR_ASSERT_LOCKED(b);
    c->next_handle = b->next_handle;
    c->next_sel_handle = b->next_sel_handle;
    c->hand = b->hand == EXR_NIL ? -1 : b->eps.slab[b->hand].handle;
}

void exr_buffer_restore_handles_locked(exr_buffer *b, int64_t next_handle, int64_t next_sel)
{
    EXR_ASSERT_EXCLUSIVE(b);
    b->next_handle = next_handle;
    b->next_sel_handle = next_sel;
}

exr_status exr_buffer_restore_hand_locked(exr_buffer *b, int64_t hand)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (hand < 0)
        return EXR_OK;
    b->hand = exr_episodes_find(&b->eps, hand);
    return b->hand == EXR_NIL ? EXR_ENOTFOUND : EXR_OK;
}

exr_status exr_buffer_restore_new_episode_locked(exr_buffer *b, int64_t handle, uint32_t nsegs,
                                                 bool ended, bool terminated, bool sampled,
                                                 uint32_t *slot, exr_episode **e)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_status st = exr_episodes_reserve(&b->eps);
    if (st != EXR_OK)
        return st;
    exr_body *body = exr_body_new(nsegs > 4 ? nsegs : 4);
    if (!body)
        return EXR_ENOMEM;
    *slot = insert_episode_locked(b, handle, body);
    *e = &b->eps.slab[*slot];
    (*e)->ended = ended;
    (*e)->terminated = terminated;
    (*e)->sampled = sampled;
    return EXR_OK;
}

uint64_t exr_buffer_restore_picks_declared_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    uint64_t n = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        n += b->eps.slab[s].m;
    return n;
}

exr_status exr_buffer_restore_reserve_picks_locked(exr_buffer *b, size_t count)
{
    EXR_ASSERT_EXCLUSIVE(b);
    return exr_pick_table_reserve(&b->picks, count ? count : 1, full_picks(b));
}

bool exr_buffer_restore_over_capacity_locked(const exr_buffer *b)
{
    EXR_ASSERT_LOCKED(b);
    return b->cfg.capacity && b->n_records > b->cfg.capacity;
}

void exr_buffer_restore_episode_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    e->m = (uint32_t)exr_picks_target(b, e);
    b->n_records += e->n;
    for (uint64_t p = 0; p < e->m; p++)
        *exr_aux_at(e, p) = UINT32_MAX; /* "no pick yet": filled by exr_buffer_restore_pick */
}

exr_status exr_buffer_restore_pick_locked(exr_buffer *b, uint32_t slot, uint32_t pos)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    if (pos >= e->m)
        return EXR_ECORRUPT;
    uint32_t *aux = exr_aux_at(e, pos);
    if (*aux != UINT32_MAX)
        return EXR_ECORRUPT; /* the same pick twice */
    size_t i = b->picks.n;
    *aux = (uint32_t)i;
    b->picks.v[i] = (exr_pick){slot, pos};
    b->picks.n = i + 1;
    return EXR_OK;
}

exr_status exr_buffer_restore_selector_locked(exr_buffer *b, int64_t h,
                                              const exr_selector_vtable *vt, const double *params,
                                              exr_selector **out)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_status st = exr_buffer_reserve_selector_locked(b);
    if (st != EXR_OK)
        return st;
    exr_selector *s;
    if ((st = vt->create(&s, params, b->picks.n)))
        return st;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        vt->destroy(s);
        return EXR_ENOMEM;
    }
    b->sels[b->nsels++] = (sel_entry){h, s};
    *out = s;
    return EXR_OK;
}
