/*
 * buffer_graveyard.c - memory that copies without the lock may still read: pins, the
 * graveyard of bodies and segments freed once no pinned copy can read them,
 * and the spare segments kept for reuse.
 */
#define _GNU_SOURCE /* pthread_rwlock_t in buffer_locks.h */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"
#include "buffer_locks.h"

/* A segment of `rows` rows: a spare one of that size if there is one. */
unsigned char *seg_alloc_locked(exr_buffer *b, size_t rows)
{
    EXR_ASSERT_LOCKED(b);
    unsigned char *seg = NULL;
    pthread_mutex_lock(&b->lk->pin_mu);
    for (size_t i = 0; i < b->nspare; i++) {
        if (b->spare[i].rows == rows) {
            seg = b->spare[i].seg;
            b->spare_bytes -= rows * b->lay.row_bytes;
            b->spare[i] = b->spare[--b->nspare];
            break;
        }
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
    return seg ? seg : exr_store_seg_alloc(&b->lay, rows);
}

/* pin_mu held */
static void seg_free_locked(exr_buffer *b, unsigned char *seg, size_t rows)
{
    size_t bytes = rows * b->lay.row_bytes;
    if (seg && b->nspare < EXR_SPARE_SEGS && bytes <= EXR_SPARE_BYTES - b->spare_bytes) {
        b->spare[b->nspare].seg = seg;
        b->spare[b->nspare++].rows = rows;
        b->spare_bytes += bytes;
    } else {
        exr_seg_free(seg);
    }
}

/* Frees an evicted episode's body, its segments kept as spares. pin_mu held. */
static void body_free_locked(exr_buffer *b, exr_body *body)
{
    for (uint32_t k = 0; k < body->nsegs; k++) {
        seg_free_locked(b, body->segs[k],
                        k + 1 < body->nsegs ? exr_store_seg_cap(&b->lay, k) : body->last_rows);
        body->segs[k] = NULL;
    }
    exr_body_free(body);
}

void free_graveyard_upto(exr_buffer *b, uint64_t epoch)
{
    while (b->grave_head && b->grave_head->epoch <= epoch) {
        exr_body *d = b->grave_head;
        b->grave_head = d->next_dead;
        body_free_locked(b, d);
    }
    if (!b->grave_head)
        b->grave_tail = NULL;
    while (b->dead_head && b->dead_head->epoch <= epoch) {
        exr_dead *d = b->dead_head;
        b->dead_head = d->next;
        exr_seg_free(d->seg);
        free(d);
    }
    if (!b->dead_head)
        b->dead_tail = NULL;
}
void bury_or_free(exr_buffer *b, exr_body *body)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (!b->readers) {
        body_free_locked(b, body);
    } else {
        body->epoch = ++b->epoch;
        body->next_dead = NULL;
        if (b->grave_tail)
            b->grave_tail->next_dead = body;
        else
            b->grave_head = body;
        b->grave_tail = body;
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
}

/* A segment that a copy running without the lock may still read: freed now
 * if none runs, else parked with node (allocated beforehand) until they end. */
void bury_segment(exr_buffer *b, unsigned char *seg, exr_dead *node)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (!b->readers) {
        exr_seg_free(seg);
        free(node);
    } else {
        node->seg = seg;
        node->epoch = ++b->epoch;
        node->next = NULL;
        if (b->dead_tail)
            b->dead_tail->next = node;
        else
            b->dead_head = node;
        b->dead_tail = node;
    }
    pthread_mutex_unlock(&b->lk->pin_mu);
}
/* rw held (shared or exclusive): nothing can be buried meanwhile */
void pin_locked(exr_buffer *b, exr_reader *r)
{
    EXR_ASSERT_LOCKED(b);
    pthread_mutex_lock(&b->lk->pin_mu);
    r->epoch = b->epoch;
    r->prev = NULL;
    r->next = b->readers;
    if (b->readers)
        b->readers->prev = r;
    b->readers = r;
    pthread_mutex_unlock(&b->lk->pin_mu);
}

/* No other lock needed (takes pin_mu). */
void unpin(exr_buffer *b, exr_reader *r)
{
    pthread_mutex_lock(&b->lk->pin_mu);
    if (r->prev)
        r->prev->next = r->next;
    else
        b->readers = r->next;
    if (r->next)
        r->next->prev = r->prev;
    uint64_t lo = UINT64_MAX;
    for (exr_reader *o = b->readers; o; o = o->next)
        if (o->epoch < lo)
            lo = o->epoch;
    /* a body buried at epoch e was visible to readers pinned before e */
    free_graveyard_upto(b, lo);
    pthread_mutex_unlock(&b->lk->pin_mu);
}
void exr_buffer_pin_locked(exr_buffer *b, exr_reader *r) { pin_locked(b, r); }
void exr_buffer_unpin_locked(exr_buffer *b, exr_reader *r) { unpin(b, r); }
