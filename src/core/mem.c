/*
 * mem.c - large allocations backed by transparent huge pages, and the size
 * from which a batch is streamed past the cache.
 *
 * A batch of Atari frames is tens of MB written in one pass, and the rows it
 * comes from are read once: with 4 KiB pages each 4 KiB costs a TLB miss and
 * a page walk, which is a tenth of the copy or more. NumPy advises its large
 * arrays for huge pages, so a gather into NumPy arrays (the benchmarks'
 * floor) gets them; exreplay's batch memory does the same. Where the kernel
 * has THP off or in "never" mode, madvise fails or is ignored and the memory
 * is ordinary.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "mem.h"

#include <stdlib.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

void *exr_big_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes < EXR_HUGE_MIN)
        return posix_memalign(&p, 64, bytes ? bytes : 1) ? NULL : p;
    if (posix_memalign(&p, HUGE_PAGE, bytes))
        return NULL;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advice only: failure leaves small pages */
#endif
    return p;
}

/* 0 until first asked; then the threshold in bytes. */
static _Atomic size_t stream_min;

/* Measured on the development VM (32 MiB L3): streaming loses for a 7 MiB
 * batch that the caller reads right after (it finds its batch in memory
 * instead of the cache), breaks even at 10 MiB and wins from 20 MiB on.
 * sysconf's cache sizes are not trusted: on that VM _SC_LEVEL3_CACHE_SIZE
 * says 320 MiB. */
static size_t default_stream_min(void) { return (size_t)16 << 20; }

size_t exr_stream_min(void)
{
    size_t v = atomic_load_explicit(&stream_min, memory_order_relaxed);
    if (!v) {
        v = default_stream_min();
        atomic_store_explicit(&stream_min, v, memory_order_relaxed);
    }
    return v;
}

size_t exr_set_stream_min(size_t bytes)
{
    size_t old = exr_stream_min();
    atomic_store_explicit(&stream_min, bytes ? bytes : default_stream_min(), memory_order_relaxed);
    return old;
}
