/*
 * evict.h - which episode leaves when the buffer is over capacity (docs/semantics.md).
 *
 *   fifo:           head of the live list (smallest handle)
 *   second_chance:  a hand walks the live list in handle order, wrapping:
 *                   sampled -> clear the mark, move on; unmarked -> victim
 *
 * Cost: fifo O(1); second chance O(1) amortised (each step past an episode
 * clears a mark that a get_batch had to set).
 */
#ifndef EXR_EVICT_H
#define EXR_EVICT_H

#include "episode.h"

enum { EXR_EVICT_FIFO = 0, EXR_EVICT_SECOND_CHANCE = 1 };

/* The slot to evict (the table must not be empty). *hand is the second-chance
 * hand, EXR_NIL for "start at the oldest"; it is left on the episode after
 * the victim, so the caller may remove the victim right away. */
uint32_t exr_evict_choose(exr_episodes *t, int policy, uint32_t *hand);

/* What recording T steps one at a time into episode `slot` (EXR_NIL: a new
 * one) does to episode boundaries, worked out without changing anything: the
 * steps evict over capacity after each one, and when that evicts the episode
 * being recorded into, the next step starts a new episode. Fills starts[0..)
 * with the step at which each such new episode starts (at most `max` of
 * them) and returns how many there are. Returns -1 if it cannot allocate its scratch.
 * Requires n_records and count to be the buffer's. */
typedef struct {
    int policy;
    uint32_t hand;
    uint64_t n_records, capacity;
} exr_evict_state;

long exr_evict_dry_run(exr_episodes *t, const exr_evict_state *st, uint32_t slot, size_t T,
                       size_t *starts, size_t max);

#endif
