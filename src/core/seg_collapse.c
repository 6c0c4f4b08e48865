/*
 * seg_collapse.c - malloc'd storage segments moved onto 2 MiB pages once
 * they fill most of one (docs/design.md, "Large batches": huge pages for
 * small segments).
 *
 * Segments that the segment heap does not take (seg_heap.c: under 64 KiB,
 * or not a power of two of rows, such as a rollout's exact segment or an
 * ended episode's cut one) come from glibc's malloc, on 4 KiB pages. At
 * N = 1M records of 28 bytes that is 7,000 pages of rows, and every pick of
 * a draw pays a TLB miss and a page walk for its rows besides their cache
 * miss. malloc takes no request for huge pages, but Linux (6.1 on) turns an
 * aligned 2 MiB range of ordinary pages into one huge page when asked
 * (madvise MADV_COLLAPSE), with the same contents at the same addresses. So
 * this file counts, per 2 MiB-aligned range of the address space (a
 * "chunk"), the bytes of live malloc'd segments in it. A chunk that they
 * fill at least half of is queued once a segment is counted in the chunk
 * after it (the heap grows upwards, and the kernel collapses only a range
 * that is mapped whole, which the chunk at the heap's top is not yet), and
 * a record call collapses the queued chunks after it has let go of the
 * buffer's lock and the GIL (exr_seg_collapse_pending). A chunk is tried
 * once while it holds counted segments (up to TRIES_MAX times if the
 * kernel refuses): malloc keeps its memory mapped, so a collapsed chunk
 * stays a huge page as segments come and go in it. The other half of a
 * chunk holds the buffer's bodies and aux arrays, or anything else of the
 * process: a collapse changes no byte of it, and memory below the heap's
 * top has mostly been handed out and written before, so the collapse makes
 * little more of it resident (docs/design.md gives what was measured).
 *
 *   chunks: open addressing on the chunk number (address >> 21), linear
 *           probing, at most half full, backward-shift deletion when a
 *           chunk's count falls to 0
 *   +------------------------------+-----------------+-------+
 *   | chunk number (0: empty slot) | bytes (uint32)  | state | ...
 *   +------------------------------+-----------------+-------+
 *   pending: up to PENDING_MAX queued chunk numbers
 *
 * One mutex guards both, for the whole process (the heap is the
 * process's). It is a leaf: nothing else is taken while it is held, so it
 * can be taken under a buffer's lock. Counting is best effort: a chunk that
 * cannot be entered (no memory for the table) is left out, a count never
 * goes below 0, and a collapse that fails (THP off, an older kernel, no huge
 * page free) only leaves the chunk on small pages; nothing but speed
 * depends on it. Where MADV_COLLAPSE or malloc_usable_size is not known,
 * nothing is counted.
 */
#define _GNU_SOURCE /* malloc_usable_size, MADV_COLLAPSE */
#include "seg_collapse.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__) && defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels refuse it with EINVAL */
#endif
#define COLLAPSE_SUPPORTED 1
#else
#define COLLAPSE_SUPPORTED 0
#endif

#define CHUNK_SHIFT 21
#define PENDING_MAX 64

enum { CHUNK_COUNTING, CHUNK_QUEUED, CHUNK_TRIED };

#define TRIES_MAX 3

typedef struct {
    uintptr_t chunk; /* chunk number; 0 marks an empty slot (address 0 holds no heap) */
    uint32_t bytes;
    uint8_t state, tries;
} chunk_ent;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static chunk_ent *tab;
static size_t tab_cap, tab_n; /* cap: a power of two, or 0 */
static uintptr_t pending[PENDING_MAX];
static size_t npending;
static exr_seg_collapse_stats stats;
static atomic_bool want, enabled = true;

static size_t slot_of(uintptr_t chunk, size_t cap)
{
    return (size_t)((chunk * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

/* The slot of chunk, or of the empty slot where it would go. tab_cap > 0. */
static size_t find(uintptr_t chunk)
{
    size_t i = slot_of(chunk, tab_cap);
    while (tab[i].chunk && tab[i].chunk != chunk)
        i = (i + 1) & (tab_cap - 1);
    return i;
}

/* Room for one more chunk (at most half full); false without memory. */
static bool room(void)
{
    if (2 * (tab_n + 1) <= tab_cap)
        return true;
    size_t ncap = tab_cap ? 2 * tab_cap : 64;
    chunk_ent *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return false;
    chunk_ent *old = tab;
    size_t ocap = tab_cap;
    tab = nt;
    tab_cap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].chunk)
            tab[find(old[i].chunk)] = old[i];
    free(old);
    return true;
}

/* Removes slot i, shifting back the entries of its probe run. */
static void remove_at(size_t i)
{
    size_t j = i;
    for (;;) {
        j = (j + 1) & (tab_cap - 1);
        if (!tab[j].chunk)
            break;
        size_t home = slot_of(tab[j].chunk, tab_cap);
        /* j's entry moves into the hole when the hole lies on its probe
         * path: no farther from j than its home is */
        if (((j - i) & (tab_cap - 1)) <= ((j - home) & (tab_cap - 1))) {
            tab[i] = tab[j];
            i = j;
        }
    }
    tab[i].chunk = 0;
    tab_n--;
}

/* Queues chunk c if it is counted, full enough and not tried yet. mu held. */
static void queue(uintptr_t c)
{
    if (!tab_cap || npending == PENDING_MAX)
        return;
    chunk_ent *e = &tab[find(c)];
    if (e->chunk && e->state == CHUNK_COUNTING && e->bytes >= EXR_CHUNK_QUEUE_BYTES) {
        e->state = CHUNK_QUEUED;
        pending[npending++] = c;
        stats.queued++;
        atomic_store_explicit(&want, true, memory_order_relaxed);
    }
}

/* Adds (add) or takes out n bytes of segment in chunk c. mu held. A chunk
 * is queued when a segment is counted in the chunk after it: malloc's heap
 * grows upwards, and a collapse needs the whole 2 MiB mapped, which the
 * chunk at the heap's top is not yet (the kernel refuses it: ENOMEM). */
static void count(uintptr_t c, size_t n, bool add)
{
    if (!tab_cap && !add)
        return;
    if (add && !room())
        return;
    size_t i = find(c);
    chunk_ent *e = &tab[i];
    if (!e->chunk) {
        if (!add)
            return;
        *e = (chunk_ent){c, 0, CHUNK_COUNTING, 0};
        tab_n++;
    }
    if (!add) {
        e->bytes = e->bytes > n ? e->bytes - (uint32_t)n : 0;
        if (!e->bytes)
            remove_at(i);
        return;
    }
    e->bytes = e->bytes + n < EXR_CHUNK_BYTES ? e->bytes + (uint32_t)n : (uint32_t)EXR_CHUNK_BYTES;
    queue(c - 1);
}

void exr_seg_track_range(uintptr_t a, size_t n, bool add)
{
    if (!a || (add && !atomic_load_explicit(&enabled, memory_order_relaxed)))
        return;
    if (n > UINTPTR_MAX - a)
        n = UINTPTR_MAX - a;
    pthread_mutex_lock(&mu);
    while (n) {
        uintptr_t c = a >> CHUNK_SHIFT;
        size_t in = (size_t)(((c + 1) << CHUNK_SHIFT) - a); /* this chunk's bytes from a on */
        size_t part = n < in || !in ? n : in;
        count(c, part, add);
        a += part;
        n -= part;
    }
    pthread_mutex_unlock(&mu);
}

void exr_seg_track(const void *p, bool add)
{
#if COLLAPSE_SUPPORTED
    if (p)
        exr_seg_track_range((uintptr_t)p, malloc_usable_size((void *)p), add);
#else
    (void)p, (void)add;
#endif
}

bool exr_seg_collapse_wanted(void) { return atomic_load_explicit(&want, memory_order_relaxed); }

size_t exr_seg_collapse_pending(void)
{
    uintptr_t todo[PENDING_MAX];
    pthread_mutex_lock(&mu);
    size_t n = npending;
    memcpy(todo, pending, n * sizeof *todo);
    npending = 0;
    atomic_store_explicit(&want, false, memory_order_relaxed);
    pthread_mutex_unlock(&mu);
    size_t ok = 0;
    for (size_t k = 0; k < n; k++) {
        bool done = false;
#if COLLAPSE_SUPPORTED
        /* the chunk's memory may have been freed or reused since: a
         * collapse of it changes nothing but its pages either way */
        done = madvise((void *)(todo[k] << CHUNK_SHIFT), EXR_CHUNK_BYTES, MADV_COLLAPSE) == 0;
#endif
        ok += done;
        pthread_mutex_lock(&mu);
        if (tab_cap) {
            chunk_ent *e = &tab[find(todo[k])];
            /* a failure is tried again (at most TRIES_MAX times) when a
             * later segment is counted after the chunk */
            if (e->chunk)
                e->state = done || ++e->tries == TRIES_MAX ? CHUNK_TRIED : CHUNK_COUNTING;
        }
        stats.collapsed += done;
        stats.failed += !done;
        pthread_mutex_unlock(&mu);
    }
    return ok;
}

void exr_seg_collapse_get_stats(exr_seg_collapse_stats *s)
{
    pthread_mutex_lock(&mu);
    *s = stats;
    s->chunks = tab_n;
    pthread_mutex_unlock(&mu);
}

size_t exr_seg_chunk_bytes(const void *p)
{
    pthread_mutex_lock(&mu);
    size_t b = 0;
    if (tab_cap) {
        size_t i = find((uintptr_t)p >> CHUNK_SHIFT);
        b = tab[i].chunk ? tab[i].bytes : 0;
    }
    pthread_mutex_unlock(&mu);
    return b;
}

bool exr_seg_collapse_enable(bool on)
{
    return atomic_exchange_explicit(&enabled, on, memory_order_relaxed);
}
