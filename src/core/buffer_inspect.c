/*
 * buffer_inspect.c - introspection: an episode's records, the live handles and picks.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

exr_status exr_buffer_episode_info_locked(const exr_buffer *b, int64_t h, uint64_t *n,
                                          bool *ended, bool *terminated, bool *has_final)
{
    EXR_ASSERT_LOCKED(b);
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot == EXR_NIL)
        return EXR_ENOTFOUND;
    const exr_episode *e = &b->eps.slab[slot];
    /* a busy episode shows what it held before the call copying into it,
     * which had not ended it (an ended episode takes no more records) */
    *n = e->busy ? e->body->n_pub : e->n;
    *ended = e->ended && !e->busy;
    *terminated = e->terminated && !e->busy;
    *has_final = e->body->final_state != NULL && !e->busy;
    return EXR_OK;
}

exr_status exr_buffer_episode_copy_locked(const exr_buffer *b, int64_t h, void *state,
                                          void *action, void *reward, void *final)
{
    EXR_ASSERT_LOCKED(b);
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot == EXR_NIL)
        return EXR_ENOTFOUND;
    const exr_store_layout *L = &b->lay;
    const exr_episode *e = &b->eps.slab[slot];
    unsigned char *st = state, *ac = action, *rw = reward;
    uint64_t p = 0, n = e->busy ? e->body->n_pub : e->n;
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

exr_status exr_buffer_episode_rows_locked(const exr_buffer *b, int64_t h, void *rows, void *final)
{
    uint32_t slot = exr_episodes_find(&b->eps, h);
    if (slot == EXR_NIL)
        return EXR_ENOTFOUND;
    const exr_store_layout *L = &b->lay;
    const exr_episode *e = &b->eps.slab[slot];
    unsigned char *dst = rows;
    uint64_t p = 0, n = e->busy ? e->body->n_pub : e->n;
    for (uint32_t k = 0; p < n; k++) {
        size_t cnt = exr_store_seg_cap(L, k);
        if (cnt > n - p)
            cnt = (size_t)(n - p);
        memcpy(dst + p * L->row_bytes, exr_seg_row(L, e->body->segs[k], 0), cnt * L->row_bytes);
        p += cnt;
    }
    if (final && e->body->final_state && !e->busy)
        memcpy(final, e->body->final_state, L->state_bytes);
    return EXR_OK;
}

void exr_buffer_handles_locked(const exr_buffer *b, int64_t *out)
{
    EXR_ASSERT_LOCKED(b);
    size_t i = 0;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        out[i++] = b->eps.slab[s].handle;
}

void exr_buffer_map_probes_locked(const exr_buffer *b, double *mean, uint64_t *max)
{
    EXR_ASSERT_LOCKED(b);
    exr_episodes_probe_stats(&b->eps, mean, max);
}

void exr_buffer_picks_locked(const exr_buffer *b, int64_t *epi, int64_t *pos)
{
    EXR_ASSERT_LOCKED(b);
    for (size_t i = 0; i < b->picks.n; i++) {
        epi[i] = b->eps.slab[b->picks.v[i].slot].handle;
        pos[i] = b->picks.v[i].pos;
    }
}
