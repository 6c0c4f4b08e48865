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

#endif
