/*
 * buffer_reserve.c - new_episode without the storage lock.
 *
 * new_episode reserves: under res_mu alone it takes the next handle, queues
 * an empty body and returns. The next thread that takes rw exclusively makes
 * the queued episodes live, in handle order, before it does anything else
 * (reserve_close_locked). Every call that can see an episode takes rw
 * exclusively, except get_batch and set_priority, which reach episodes only
 * through picks (an empty episode has none); so every call sees a reserved
 * episode exactly as if new_episode had created it under rw.
 *
 * Two rules keep it exact (docs/design.md, "Locking and the GIL"):
 * - No reservation is made while rw is held exclusively. The taker sets
 *   res_closed, then reads res_pending; new_episode counts itself into
 *   res_pending, then reads res_closed (all sequentially consistent, so at
 *   least one of the two sees the other). One that finds rw taken backs out
 *   and takes rw itself, as new_episode always did. So while rw is held
 *   exclusively no episode appears, next_handle and res_budget are the
 *   holder's, and handles stay in the order the episodes go live in.
 * - Making a reservation live cannot fail: the episode table keeps room for
 *   every reservation made and every one res_budget still allows.
 */
#define _GNU_SOURCE /* pthread_rwlock_t in buffer_locks.h */
#include <stdlib.h>

#include "buffer_impl.h"
#include "buffer_locks.h"

/* Room made for reservations when they ran out (reserve_grow_locked). */
#define RES_ROOM 64

/* The queued episodes made live in handle order. rw exclusive and res_mu. */
static void make_live_held(exr_buffer *b)
{
    uint64_t n = atomic_load_explicit(&b->res_pending, memory_order_relaxed);
    int64_t h = b->next_handle - (int64_t)n;
    for (exr_body *body = b->res_head; body;) {
        exr_body *next = body->next_dead;
        body->next_dead = NULL;
        exr_episodes_insert(&b->eps, h++, body);
        body = next;
    }
    b->res_head = b->res_tail = NULL;
    atomic_store_explicit(&b->res_pending, 0, memory_order_relaxed);
    b->res_budget = exr_episodes_room(&b->eps);
}

void reserve_close_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    atomic_store(&b->res_closed, 1);
    if (!atomic_load(&b->res_pending))
        return;
    pthread_mutex_lock(&b->lk->res_mu);
    make_live_held(b);
    pthread_mutex_unlock(&b->lk->res_mu);
}

void reserve_open_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    atomic_store_explicit(&b->res_closed, 0, memory_order_release);
}

uint32_t insert_episode_locked(exr_buffer *b, int64_t h, exr_body *body)
{
    EXR_ASSERT_EXCLUSIVE(b);
    uint32_t slot = exr_episodes_insert(&b->eps, h, body);
    uint64_t room = exr_episodes_room(&b->eps);
    if (b->res_budget > room) /* no reservation is pending: closed */
        b->res_budget = room;
    return slot;
}

void reserve_grow_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (b->res_budget < RES_ROOM / 2 && exr_episodes_reserve_n(&b->eps, RES_ROOM) == EXR_OK)
        b->res_budget = exr_episodes_room(&b->eps);
}

void reserve_free(exr_buffer *b)
{
    while (b->res_head) {
        exr_body *next = b->res_head->next_dead;
        exr_body_free(b->res_head);
        b->res_head = next;
    }
    b->res_tail = NULL;
}

/* Queues body as the next episode if rw is not held exclusively and the
 * budget allows; *h its handle. res_mu held. */
static bool reserve_held(exr_buffer *b, exr_body *body, int64_t *h)
{
    uint64_t n = atomic_load_explicit(&b->res_pending, memory_order_relaxed);
    atomic_store(&b->res_pending, n + 1);
    if (atomic_load(&b->res_closed) || !b->res_budget || b->next_handle >= EXR_MAX_HANDLE) {
        atomic_store_explicit(&b->res_pending, n, memory_order_relaxed);
        return false;
    }
    body->next_dead = NULL;
    if (b->res_tail)
        b->res_tail->next_dead = body;
    else
        b->res_head = body;
    b->res_tail = body;
    b->res_budget--;
    *h = b->next_handle++;
    return true;
}

exr_status exr_buffer_new_episode(exr_buffer *b, int64_t *h, bool *done)
{
    exr_body *body = exr_body_new(4);
    *done = body == NULL;
    if (!body)
        return EXR_ENOMEM;
    pthread_mutex_lock(&b->lk->res_mu);
    *done = reserve_held(b, body, h);
    pthread_mutex_unlock(&b->lk->res_mu);
    if (!*done)
        exr_body_free(body);
    return EXR_OK;
}
