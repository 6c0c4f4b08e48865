/*
 * buffer_check.c - the invariant check that tests run after stress (exr_buffer_check_locked).
 */
#include <stdio.h>

#include "buffer_impl.h"

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(msg, msglen, __VA_ARGS__);                                                        \
        return 1;                                                                                  \
    } while (0)

/* One live episode (slot s): map, picks, segments, aux, end. */
static int check_episode(const exr_buffer *b, uint32_t s, char *msg, size_t msglen)
{
    const exr_episode *e = &b->eps.slab[s];
    if (exr_episodes_find(&b->eps, e->handle) != s)
        FAIL("episode %lld: map does not lead to its slot", (long long)e->handle);
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
    if (e->seg0 != (e->body->nsegs ? e->body->segs[0] : NULL))
        FAIL("episode %lld: the slot's segment 0 is not the body's", (long long)e->handle);
    if (e->aux != e->body->aux)
        FAIL("episode %lld: the slot's aux array is not the body's", (long long)e->handle);
    if (e->body->aux_cap < e->n)
        FAIL("episode %lld: aux has room for %llu of %llu records", (long long)e->handle,
             (unsigned long long)e->body->aux_cap, (unsigned long long)e->n);
    if (!e->ended && (e->terminated || e->body->final_state))
        FAIL("episode %lld: open but has a final state or terminal flag", (long long)e->handle);
    if (e->fill > b->eps.seq)
        FAIL("episode %lld: filled at hold %llu, after the current one (%llu)",
             (long long)e->handle, (unsigned long long)e->fill, (unsigned long long)b->eps.seq);
    for (uint64_t p = 0; p < e->m; p++) {
        uint32_t idx = *exr_aux_at(e, p);
        if (idx >= b->picks.n || b->picks.v[idx].slot != s || b->picks.v[idx].pos != p)
            FAIL("episode %lld: pick %llu points at table entry %u, which does not point back",
                 (long long)e->handle, (unsigned long long)p, idx);
    }
    return 0;
}

/* A selector's own state, and the picks it holds against the table. Under
 * its mu: a draw without the storage lock may be in it. */
static int check_selector(const exr_buffer *b, exr_selector *s, char *msg, size_t msglen)
{
    exr_sel_lock(s);
    int bad = s->vt->check(s, b->picks.n, msg, msglen) ||
              (s->vt->check_idents && s->vt->check_idents(s, b->picks.n, b->picks.v, msg, msglen));
    exr_sel_unlock(s);
    return bad;
}

int exr_buffer_check_locked(const exr_buffer *b, char *msg, size_t msglen)
{
    EXR_ASSERT_LOCKED(b);
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
        if (s == b->hand)
            hand_seen = true;
        if (check_episode(b, s, msg, msglen))
            return 1;
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
    for (size_t i = 0; i < b->nsels; i++) {
        if (i && b->sels[i].handle <= b->sels[i - 1].handle)
            FAIL("selector %lld listed after selector %lld (handles ascend)",
                 (long long)b->sels[i].handle, (long long)b->sels[i - 1].handle);
        if (check_selector(b, b->sels[i].sel, msg, msglen))
            return 1;
    }
    return 0;
}
