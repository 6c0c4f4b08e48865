/*
 * buffer_locks.h - the buffer's locks (buffer_impl.h says what each guards).
 * Only buffer.c (the storage lock and publish waits), buffer_reserve.c
 * (res_mu) and buffer_graveyard.c (pin_mu) take them directly; both define _GNU_SOURCE for the rwlock.
 */
#ifndef EXR_BUFFER_LOCKS_H
#define EXR_BUFFER_LOCKS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "exr.h"

/* Each lock (with what is read and written along with it) on cache lines of
 * its own: one thread's take of one lock does not move the line of another
 * that another thread is taking (EXR_LINE, exr.h). */
struct exr_locks {
    /* taken before waiting for rw exclusive, let go after rw: the threads
     * that want rw exclusively and do not get it at once queue here,
     * asleep, so that at most one of them waits for rw at a time
     * (docs/design.md, "Locking and the GIL") */
    EXR_LINE pthread_mutex_t wmu;
    /* rw is held exclusively; written by that holder, read by it and, as
     * a hint, by exclusive takers spinning for rw (spin_rw) */
    EXR_LINE _Atomic bool excl;
    bool excl_wmu; /* ... and wmu with it (it had to wait); the same */
    pthread_rwlock_t rw;
    /* shared takers of rw that did not get it at once and wait for it: a
     * record call that finds some copies its rows with rw let go
     * (exr_buffer_lock_contended) */
    EXR_LINE _Atomic int rd_waiting;
    /* new_episode's reservations (buffer_reserve.c); taken after rw, or
     * alone by new_episode; no other lock is taken while it is held */
    EXR_LINE pthread_mutex_t res_mu;
    EXR_LINE pthread_mutex_t pin_mu; /* the readers' pins (buffer_graveyard.c) */
    EXR_LINE pthread_mutex_t wait_mu;
    pthread_cond_t published; /* signalled when a record call publishes */
    /* publishes so far: bumped under wait_mu before `published` is
     * signalled, so that a waiter that looked under the shared lock (which
     * a publisher may hold too) misses none (wait_publish_since) */
    _Atomic uint64_t pub_seq;
#ifdef EXR_DEBUG_LOCKS
    /* who holds rw (EXR_ASSERT_LOCKED, buffer_impl.h): the exclusive
     * holder's thread mark, and how many hold it shared */
    _Atomic uintptr_t owner;
    _Atomic int shared;
#endif
};

#endif
