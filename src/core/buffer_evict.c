/*
 * buffer_evict.c - where an episode is evicted: its picks leave the table and the
 * selectors, its records the count, its body the buffer (evict.c chooses
 * which episode), and where one is removed on request.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

/* Notes open episode h of n steps, going while a log's hook is set: its
 * steps are in the log, and so will its end be (take_gone_open_locked). */
static void note_gone_open_locked(exr_buffer *b, int64_t h, uint64_t n)
{
    b->gone[b->gone_next].h = h;
    b->gone[b->gone_next].n = n;
    b->gone_next = (b->gone_next + 1) % EXR_GONE_OPEN;
    if (b->gone_count < EXR_GONE_OPEN)
        b->gone_count++;
}

bool take_gone_open_locked(exr_buffer *b, int64_t h, uint64_t *n)
{
    EXR_ASSERT_EXCLUSIVE(b);
    for (uint32_t k = 1; k <= b->gone_count; k++) { /* the newest first */
        uint32_t i = (b->gone_next + EXR_GONE_OPEN - k) % EXR_GONE_OPEN;
        if (b->gone[i].h == h) {
            *n = b->gone[i].n;
            b->gone[i].h = -1; /* an episode ends once */
            return true;
        }
    }
    return false;
}

static void evict_episode_locked(exr_buffer *b, uint32_t slot)
{
    EXR_ASSERT_EXCLUSIVE(b);
    exr_episode *e = &b->eps.slab[slot];
    if (b->hook && !e->ended && e->n)
        note_gone_open_locked(b, e->handle, e->n);
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
