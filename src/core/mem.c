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

#include "exr.h"

#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>
#include <unistd.h>
#include <stdint.h>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define HUGE_PAGE ((size_t)2 << 20)

void *exr_big_alloc(size_t bytes)
{
    void *p = NULL;
    if (bytes < EXR_HUGE_MIN)
        return posix_memalign(&p, 64, bytes ? bytes : 1) ? NULL : p;
    return exr_huge_prefix_alloc(bytes, bytes);
}

void *exr_huge_prefix_alloc(size_t bytes, size_t huge)
{
    void *p = NULL;
    if (posix_memalign(&p, HUGE_PAGE, bytes ? bytes : 1))
        return NULL;
#ifdef MADV_HUGEPAGE
    if (huge) /* advice only: failure leaves small pages */
        (void)madvise(p, huge < bytes ? huge : bytes, MADV_HUGEPAGE);
#endif
    return p;
}

void exr_advise_huge(void *p, size_t bytes)
{
#ifdef MADV_HUGEPAGE
    uintptr_t a = ((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
    uintptr_t e = ((uintptr_t)p + bytes) & ~(uintptr_t)(HUGE_PAGE - 1);
    if (e > a)
        (void)madvise((void *)a, e - a, MADV_HUGEPAGE);
#else
    (void)p;
    (void)bytes;
#endif
}

void *exr_line_calloc(size_t bytes)
{
    void *p = NULL;
    if (posix_memalign(&p, EXR_LINE_BYTES, bytes ? bytes : 1) != 0)
        return NULL;
    memset(p, 0, bytes);
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

static _Atomic size_t l2_bytes;

/* Unlike L3's, the L2 size sysconf reports was right on both development
 * VMs (2 MiB a core on Sapphire Rapids, 512 KiB on Zen 3). */
size_t exr_l2_bytes(void)
{
    size_t v = atomic_load_explicit(&l2_bytes, memory_order_relaxed);
    if (!v) {
        long s = -1;
#ifdef _SC_LEVEL2_CACHE_SIZE
        s = sysconf(_SC_LEVEL2_CACHE_SIZE);
#endif
        v = s >= (64L << 10) && s <= (64L << 20) ? (size_t)s : (size_t)1 << 20;
        atomic_store_explicit(&l2_bytes, v, memory_order_relaxed);
    }
    return v;
}

size_t exr_set_stream_min(size_t bytes)
{
    size_t old = exr_stream_min();
    atomic_store_explicit(&stream_min, bytes ? bytes : default_stream_min(), memory_order_relaxed);
    return old;
}

void exr_copy_stream(unsigned char *d, const unsigned char *s, size_t n)
{
#if defined(__SSE2__)
    size_t head = (size_t)(-(uintptr_t)d & 63);
    if (head > n)
        head = n;
    exr_copy_short(d, s, head);
    d += head, s += head, n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i x0 = _mm_loadu_si128((const __m128i *)s);
        __m128i x1 = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i x2 = _mm_loadu_si128((const __m128i *)(s + 32));
        __m128i x3 = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, x0);
        _mm_stream_si128((__m128i *)(d + 16), x1);
        _mm_stream_si128((__m128i *)(d + 32), x2);
        _mm_stream_si128((__m128i *)(d + 48), x3);
    }
    exr_copy_short(d, s, n);
#else
    memcpy(d, s, n);
#endif
}

void exr_stream_fence(void)
{
#if defined(__SSE2__)
    _mm_sfence();
#endif
}
