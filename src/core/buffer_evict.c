/*
 * buffer_evict.c - where an episode is evicted: its picks leave the table and the
 * selectors, its records the count, its body the buffer (evict.c chooses
 * which episode), and where one is removed on request.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

static void evict_episode_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    remove_picks_locked(b, slot);
    b->n_records -= e->n;
    exr_body *body = e->body;
    exr_episodes_remove(&b->eps, slot);
    bury_or_free(b, body);
}

void evict_over_capacity_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    while (b->cfg.capacity && b->n_records > b->cfg.capacity && b->eps.count) {
        uint32_t victim = exr_evict_choose(&b->eps, b->cfg.eviction, &b->hand);
        evict_episode_locked(b, victim);
    }
}

exr_status exr_buffer_remove_episode_locked(exr_buffer *b, int64_t h)
{
    /* a record call copying into h publishes first, as a record into h waits */
    uint32_t s;
    while ((s = exr_episodes_find(&b->eps, h)) != EXR_NIL && b->eps.slab[s].busy)
        wait_publish(b, false);
    if (s == EXR_NIL)
        return EXR_ENOTFOUND;
    if (b->hand == s) { /* the second-chance hand moves on, as if it had passed h */
        uint32_t after = b->eps.slab[s].next != EXR_NIL ? b->eps.slab[s].next : b->eps.head;
        b->hand = after != s ? after : EXR_NIL;
    }
    evict_episode_locked(b, s);
    return EXR_OK;
}
