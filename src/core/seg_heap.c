/*
 * seg_heap.c - storage segments on 2 MiB pages (docs/design.md, "Large
 * batches").
 *
 * A pick's rows are read from a random place in storage, so with 4 KiB pages
 * every 4 KiB of a pick costs a TLB miss and a page walk, which a gather from
 * a NumPy array (advised for huge pages) does not pay. glibc's malloc gives
 * a segment of about 1 MiB ordinary pages, and a segment is too small to be
 * a huge page itself. So segments of a power-of-two number of rows and at
 * least EXR_SEG_HEAP_MIN bytes (the nominal sizes of store.h, which repeat)
 * come from regions instead:
 *
 *   region: one 2 MiB-aligned anonymous mapping of at least 16 MiB, advised
 *           MADV_HUGEPAGE but for its last 2 MiB when a tail is left there,
 *           cut into nslots equal slots of one size (at least 16)
 *   +--------+--------+--------+-- ... --+--------+------+
 *   | slot 0 | slot 1 | slot 2 |         | slot n-1| tail |
 *   +--------+--------+--------+-- ... --+--------+------+
 *   free slots: a stack of indices; slots never handed out: [fresh, nslots)
 *
 * Everything else (an ended episode's last segment cut to its size, odd
 * sizes, small rows) still comes from malloc, and exr_seg_free tells the two
 * apart by address. A region whose slots are all free is unmapped, except
 * the last one emptied, kept for the next allocation of its size. One mutex
 * guards the regions of the whole process; it is taken once per segment
 * allocated or freed, under the buffer's own lock.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, madvise */
#include "seg_heap.h"

#include "seg_collapse.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE_PAGE ((size_t)2 << 20)
#define MIN_SLOTS 16
#define REGION_MIN ((size_t)16 << 20)

typedef struct {
    unsigned char *base;
    size_t bytes;        /* the mapping's length, a multiple of HUGE_PAGE */
    size_t slot;         /* bytes of each slot */
    uint32_t nslots, used, fresh, nfree;
    uint32_t *free_idx;  /* nfree indices of slots handed back */
} region;

static pthread_mutex_t heap_mu = PTHREAD_MUTEX_INITIALIZER;
static region *regs; /* sorted by base */
static size_t nregs, capregs;

/* A fresh region of nslots slots of `slot` bytes, 2 MiB-aligned; 0 on
 * success. The mapping is made HUGE_PAGE longer and trimmed to alignment. */
static int region_map(region *r, size_t slot)
{
    size_t want = slot * MIN_SLOTS > REGION_MIN ? slot * MIN_SLOTS : REGION_MIN;
    size_t bytes = (want + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    size_t nslots = bytes / slot;
    uint32_t *idx = malloc(nslots * sizeof *idx);
    if (!idx)
        return -1;
    unsigned char *m = mmap(NULL, bytes + HUGE_PAGE, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        free(idx);
        return -1;
    }
    size_t head = (size_t)(-(uintptr_t)m & (HUGE_PAGE - 1));
    if (head)
        munmap(m, head);
    munmap(m + head + bytes, HUGE_PAGE - head);
    unsigned char *base = m + head;
#ifdef MADV_HUGEPAGE
    /* advice only. The last huge page holds the tail past the last slot:
     * left on small pages, the tail is never touched, so never resident. */
    size_t tail = bytes - nslots * slot;
    (void)madvise(base, tail ? bytes - HUGE_PAGE : bytes, MADV_HUGEPAGE);
#endif
    POISON(base, bytes);
    *r = (region){base, bytes, slot, (uint32_t)nslots, 0, 0, 0, idx};
    return 0;
}

static void region_unmap(region *r)
{
    UNPOISON(r->base, r->bytes); /* the next mapping here starts clean */
    munmap(r->base, r->bytes);
    free(r->free_idx);
}

/* Index of the region holding p, or nregs. */
static size_t region_of(const void *p)
{
    const unsigned char *q = p;
    size_t lo = 0, hi = nregs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (q < regs[mid].base)
            hi = mid;
        else if (q >= regs[mid].base + regs[mid].bytes)
            lo = mid + 1;
        else
            return mid;
    }
    return nregs;
}

/* Inserts a new region of `slot`-byte slots; its index, or nregs on failure. */
static size_t region_add(size_t slot)
{
    if (nregs == capregs) {
        size_t cap = capregs ? capregs * 2 : 8;
        region *nr = realloc(regs, cap * sizeof *nr);
        if (!nr)
            return nregs;
        regs = nr;
        capregs = cap;
    }
    region r;
    if (region_map(&r, slot))
        return nregs;
    size_t at = 0;
    while (at < nregs && regs[at].base < r.base)
        at++;
    memmove(regs + at + 1, regs + at, (nregs - at) * sizeof *regs);
    regs[at] = r;
    nregs++;
    return at;
}

static void *slot_take(region *r)
{
    uint32_t i = r->nfree ? r->free_idx[--r->nfree] : r->fresh++;
    r->used++;
    unsigned char *p = r->base + (size_t)i * r->slot;
    UNPOISON(p, r->slot);
    return p;
}

bool exr_seg_heap_takes(size_t rows, size_t bytes)
{
    return bytes >= EXR_SEG_HEAP_MIN && bytes <= EXR_SEG_HEAP_MAX && rows &&
           !(rows & (rows - 1));
}

void *exr_seg_heap_alloc(size_t bytes)
{
    pthread_mutex_lock(&heap_mu);
    /* a slot handed back first (its pages are mapped and warm), then one
     * never used, then a new region */
    size_t k = 0;
    while (k < nregs && !(regs[k].slot == bytes && regs[k].nfree))
        k++;
    if (k == nregs)
        for (k = 0; k < nregs && !(regs[k].slot == bytes && regs[k].fresh < regs[k].nslots);)
            k++;
    if (k == nregs)
        k = region_add(bytes);
    void *p = k < nregs ? slot_take(&regs[k]) : NULL;
    pthread_mutex_unlock(&heap_mu);
    return p;
}

/* Unmaps every empty region but `keep`. heap_mu held. */
static void drop_empty(size_t keep)
{
    size_t j = 0;
    for (size_t k = 0; k < nregs; k++) {
        if (regs[k].used || k == keep)
            regs[j++] = regs[k];
        else
            region_unmap(&regs[k]);
    }
    nregs = j;
}

void exr_seg_free(void *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&heap_mu);
    size_t k = region_of(p);
    if (k == nregs) {
        pthread_mutex_unlock(&heap_mu);
        exr_seg_track(p, false);
        free(p);
        return;
    }
    region *r = &regs[k];
    size_t i = (size_t)((unsigned char *)p - r->base) / r->slot;
    POISON(r->base + i * r->slot, r->slot);
    r->free_idx[r->nfree++] = (uint32_t)i;
    if (--r->used == 0)
        drop_empty(k);
    pthread_mutex_unlock(&heap_mu);
}

size_t exr_seg_heap_used(void)
{
    pthread_mutex_lock(&heap_mu);
    size_t total = 0;
    for (size_t k = 0; k < nregs; k++)
        total += (size_t)regs[k].used * regs[k].slot;
    pthread_mutex_unlock(&heap_mu);
    return total;
}

size_t exr_seg_heap_mapped(void)
{
    pthread_mutex_lock(&heap_mu);
    size_t total = 0;
    for (size_t k = 0; k < nregs; k++)
        total += regs[k].bytes;
    pthread_mutex_unlock(&heap_mu);
    return total;
}
