/*
 * mem.h - large allocations that the kernel may back with 2 MiB pages,
 * when a batch is large enough to bypass the cache (docs/design.md, "Large
 * batches"), and the inline copy of short runs of bytes.
 */
#ifndef EXR_MEM_H
#define EXR_MEM_H

#include <stddef.h>
#include <string.h>

/* From this size on, exr_big_alloc asks for huge pages (NumPy uses the
 * same threshold for its arrays). */
#define EXR_HUGE_MIN ((size_t)4 << 20)

/* bytes of memory aligned to 64 bytes (to 2 MiB, and advised for
 * transparent huge pages, from EXR_HUGE_MIN on), or NULL. Release with
 * free(). */
void *exr_big_alloc(size_t bytes);

/* bytes of memory aligned to 2 MiB, of which only the first `huge` bytes
 * (at most `bytes`) are advised for transparent huge pages; or NULL.
 * Release with free(). exr_big_alloc advises all of it; an array that fills
 * from its start and is read at random places (the pick table) is advised
 * in whole 2 MiB pages only as far as it expects to fill: a huge page that
 * is only partly used is still resident whole (docs/design.md, "Large
 * batches"). */
void *exr_huge_prefix_alloc(size_t bytes, size_t huge);

/* Advises the whole 2 MiB pages inside [p, p + bytes) for transparent huge
 * pages: memory allocated elsewhere (a Python bytes object's) and not yet
 * written, so that its first writes fault in 2 MiB pages, not 4 KiB ones.
 * Advice only: nothing happens where the kernel does not take it. */
void exr_advise_huge(void *p, size_t bytes);

/* bytes of zeroed memory aligned to a cache line (EXR_LINE_BYTES), for a
 * struct with EXR_LINE members (exr.h), or NULL. Release with free(). */
void *exr_line_calloc(size_t bytes);

/* A batch whose arrays take at least this many bytes is written with
 * non-temporal stores (batch_copy.c): 16 MiB unless a test sets it. */
size_t exr_stream_min(void);
/* For tests: set it (0: back to the default); returns the value before. */
size_t exr_set_stream_min(size_t bytes);

/* The bytes of one core's L2 cache (sysconf, read once; 1 MiB where the
 * system does not say, or says something below 64 KiB or above 64 MiB).
 * get_batch's plan prefetches a large batch's rows only when they fit in
 * a share of it (buffer_batch.c, rows_now). */
size_t exr_l2_bytes(void);

/* memcpy with non-temporal stores: the destination's lines go to memory
 * without being read first (no read-for-ownership) and without evicting
 * the cache, for bytes nobody reads soon (a batch larger than the cache,
 * docs/design.md "Large batches"; a recorded frame). The stores are weakly
 * ordered: exr_stream_fence before anything that publishes them. */
void exr_copy_stream(unsigned char *d, const unsigned char *s, size_t n);
void exr_stream_fence(void);

/* A recorded state (or named field) of at least this many bytes is written
 * into its row with exr_copy_stream (buffer_record.c). */
#define EXR_ROW_STREAM_MIN ((size_t)4 << 10)

/* memcpy for the short runs that a pick or a recorded step is made of (a
 * few rows, or one field of one row): inline 16-byte moves with an
 * overlapping last move, instead of a call into libc's size dispatch. */
static inline void exr_copy_short(unsigned char *d, const unsigned char *s, size_t n)
{
    if (n > 256) {
        memcpy(d, s, n);
    } else if (n >= 16) {
        size_t i = 0;
        for (; i + 16 <= n; i += 16)
            memcpy(d + i, s + i, 16);
        if (i < n)
            memcpy(d + n - 16, s + n - 16, 16);
    } else if (n >= 8) {
        memcpy(d, s, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (n >= 4) {
        memcpy(d, s, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else {
        for (size_t i = 0; i < n; i++)
            d[i] = s[i];
    }
}

#endif
