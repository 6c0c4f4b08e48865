#include <stdlib.h>
#include <string.h>

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

/* ---- dry run ------------------------------------------------------------
 *
 * The simulation marks episodes in the table itself (exr_episode.sim) and
 * takes the marks off before it returns. A new episode that the run starts
 * is not in the table: it is "virtual", at the tail of the live list, and
 * there is at most one at a time (the next one starts only once it is gone).
 */

enum { SIM_GONE = 1, SIM_CLEARED = 2 };
#define SIM_VIRT (EXR_NIL - 1)

typedef struct {
    exr_episodes *t;
    uint32_t head;          /* oldest real episode not gone, or EXR_NIL */
    int virt;               /* whether the virtual episode is live */
    uint64_t virt_n;
    uint32_t *touched;      /* slots marked, to unmark */
    size_t ntouched, cap;
    uint32_t small[32];
} sim_t;

static int sim_mark(sim_t *s, uint32_t slot, uint8_t mark)
{
    exr_episode *e = &s->t->slab[slot];
    if (!e->sim) {
        if (s->ntouched == s->cap) {
            size_t ncap = s->cap * 2;
            uint32_t *nt = malloc(ncap * sizeof *nt);
            if (!nt)
                return -1;
            memcpy(nt, s->touched, s->ntouched * sizeof *nt);
            if (s->touched != s->small)
                free(s->touched);
            s->touched = nt;
            s->cap = ncap;
        }
        s->touched[s->ntouched++] = slot;
    }
    e->sim |= mark;
    return 0;
}

static uint32_t sim_first(sim_t *s)
{
    while (s->head != EXR_NIL && (s->t->slab[s->head].sim & SIM_GONE))
        s->head = s->t->slab[s->head].next;
    if (s->head != EXR_NIL)
        return s->head;
    return s->virt ? SIM_VIRT : EXR_NIL;
}

/* The live episode after x in handle order, wrapping (x itself if alone). */
static uint32_t sim_next(sim_t *s, uint32_t x)
{
    if (x != SIM_VIRT) {
        uint32_t n = s->t->slab[x].next;
        while (n != EXR_NIL && (s->t->slab[n].sim & SIM_GONE))
            n = s->t->slab[n].next;
        if (n != EXR_NIL)
            return n;
        if (s->virt)
            return SIM_VIRT;
    }
    return sim_first(s);
}

static int sim_sampled(const sim_t *s, uint32_t x)
{
    if (x == SIM_VIRT)
        return 0; /* nothing samples while the lock is held */
    const exr_episode *e = &s->t->slab[x];
    return e->sampled && !(e->sim & SIM_CLEARED);
}

/* exr_evict_choose, on the simulated table. */
static long sim_choose(sim_t *s, int policy, uint32_t *hand, uint32_t *victim)
{
    if (policy == EXR_EVICT_FIFO) {
        *victim = sim_first(s);
        return 0;
    }
    uint32_t x = *hand != EXR_NIL ? *hand : sim_first(s);
    while (sim_sampled(s, x)) {
        if (sim_mark(s, x, SIM_CLEARED) < 0)
            return -1;
        x = sim_next(s, x);
    }
    uint32_t after = sim_next(s, x);
    *hand = after != x ? after : EXR_NIL;
    *victim = x;
    return 0;
}

static long sim_run(sim_t *s, const exr_evict_state *st, uint32_t slot, size_t T, size_t *starts,
                    size_t max)
{
    uint32_t hand = st->hand, cur = slot;
    uint64_t n_rec = st->n_records, count = s->t->count, cur_added = 0;
    long fresh = 0;
    int cur_gone = 0;
    if (cur == EXR_NIL) {
        cur = SIM_VIRT;
        s->virt = 1;
        s->virt_n = 0;
        count++;
    }
    for (size_t t = 0; t < T; t++) {
        if (cur_gone) {
            /* the rest starts a new episode */
            if ((size_t)fresh < max)
                starts[fresh] = t;
            fresh++;
            cur = SIM_VIRT;
            s->virt = 1;
            s->virt_n = 0;
            cur_gone = 0;
            count++;
        }
        n_rec++;
        if (cur == SIM_VIRT)
            s->virt_n++;
        else
            cur_added++;
        while (st->capacity && n_rec > st->capacity && count) {
            uint32_t v;
            if (sim_choose(s, st->policy, &hand, &v) < 0)
                return -1;
            if (v == SIM_VIRT) {
                n_rec -= s->virt_n;
                s->virt = 0;
            } else {
                n_rec -= s->t->slab[v].n + (v == cur ? cur_added : 0);
                if (sim_mark(s, v, SIM_GONE) < 0)
                    return -1;
            }
            count--;
            if (v == cur)
                cur_gone = 1;
        }
    }
    return fresh;
}

/* FIFO evicts the oldest first, so episode `slot` (EXR_NIL: a new one,
 * the newest) can only go once every episode before it has gone; from
 * then on only it and the ones after it hold records. If those and the T
 * new ones fit the capacity, no step evicts it and no new episode starts:
 * 1. Looks at no more than 8 episodes after it (0: cannot tell). */
static int fifo_keeps(const exr_episodes *t, const exr_evict_state *st, uint32_t slot, size_t T)
{
    if (st->policy != EXR_EVICT_FIFO)
        return 0;
    uint64_t held = 0;
    for (int k = 0; slot != EXR_NIL; k++, slot = t->slab[slot].next) {
        if (k == 8)
            return 0;
        held += t->slab[slot].n;
    }
    return held <= st->capacity && T <= st->capacity - held;
}

long exr_evict_dry_run(exr_episodes *t, const exr_evict_state *st, uint32_t slot, size_t T,
                       size_t *starts, size_t max)
{
    if (fifo_keeps(t, st, slot, T))
        return 0;
    sim_t s = {.t = t, .head = t->head, .touched = NULL, .cap = 32};
    s.touched = s.small;
    long r = sim_run(&s, st, slot, T, starts, max);
    for (size_t i = 0; i < s.ntouched; i++)
        t->slab[s.touched[i]].sim = 0;
    if (s.touched != s.small)
        free(s.touched);
    return r;
}
