/*
 * buffer_locks.h - the buffer's locks (buffer_impl.h says what each guards).
 * Only buffer.c (the storage lock and publish waits) and buffer_graveyard.c
 * (pin_mu) take them directly; both define _GNU_SOURCE for the rwlock.
 */
#ifndef EXR_BUFFER_LOCKS_H
#define EXR_BUFFER_LOCKS_H

#include <pthread.h>

struct exr_locks {
    pthread_rwlock_t rw;
    pthread_mutex_t pin_mu;
    pthread_mutex_t wait_mu;
    pthread_cond_t published; /* signalled when a record call publishes */
};

#endif
