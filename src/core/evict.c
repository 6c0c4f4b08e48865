#include "evict.h"

static uint32_t next_wrapping(const exr_episodes *t, uint32_t s)
{
    uint32_t n = t->slab[s].next;
    return n != EXR_NIL ? n : t->head;
}

uint32_t exr_evict_choose(exr_episodes *t, int policy, uint32_t *hand)
{
    if (policy == EXR_EVICT_FIFO)
        return t->head;
    uint32_t s = *hand != EXR_NIL ? *hand : t->head;
    /* at most one full lap clears every mark, so this ends */
    while (t->slab[s].sampled) {
        t->slab[s].sampled = 0;
        s = next_wrapping(t, s);
    }
    uint32_t after = next_wrapping(t, s);
    *hand = after != s ? after : EXR_NIL;
    return s;
}
