/*
 * buffer_impl.h - the layout of exr_buffer, shared by buffer.c and codec.c
 * (the serialized form reads and writes it directly). Nothing outside the
 * core includes this.
 */
#ifndef EXR_BUFFER_IMPL_H
#define EXR_BUFFER_IMPL_H

#include <pthread.h>

#include "buffer.h"
#include "episode.h"
#include "evict.h"
#include "pick_table.h"
#include "store.h"

typedef struct {
    int64_t handle;
    exr_selector *sel;
} sel_entry;

/* A segment replaced while a copy may still read it (buffer.c). */
typedef struct exr_dead {
    struct exr_dead *next;
    uint64_t epoch;
    unsigned char *seg;
} exr_dead;

typedef struct exr_reader {
    struct exr_reader *prev, *next;
    uint64_t epoch;
} exr_reader;

struct exr_buffer {
    pthread_mutex_t mu;
    exr_config cfg;
    exr_store_layout lay;
    exr_episodes eps;
    exr_pick_table picks;
    sel_entry *sels;
    size_t nsels, sels_cap;
    int64_t next_handle, next_sel_handle;
    uint64_t n_records;
    uint32_t hand;
    /* copies running without the lock, and what they may still read */
    exr_reader *readers;
    uint64_t epoch;
    exr_body *grave_head, *grave_tail;
    exr_dead *dead_head, *dead_tail;
    /* the experience log's hook (buffer.h) */
    exr_step_hook hook;
    void *hook_ctx;
};

/* Room for one more entry in b->sels. */
exr_status exr_buffer_reserve_selector_locked(exr_buffer *b);

/* Picks episode e should have: positions [0, target). */
uint64_t exr_picks_target(const exr_buffer *b, const exr_episode *e);
/* aux[p] of episode e: its pending priority (float) or its pick's index.
 * Lives in the episode's body, not in its segments, and is only touched
 * with the lock held. */
static inline uint32_t *exr_aux_at(const exr_episode *e, uint64_t p)
{
    return &e->body->aux[p];
}

#endif
