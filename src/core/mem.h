/*
 * mem.h - large allocations that the kernel may back with 2 MiB pages, and
 * when a batch is large enough to bypass the cache (docs/design.md, "Large
 * batches").
 */
#ifndef EXR_MEM_H
#define EXR_MEM_H

#include <stddef.h>

/* From this size on, exr_big_alloc asks for huge pages (NumPy uses the
 * same threshold for its arrays). */
#define EXR_HUGE_MIN ((size_t)4 << 20)

/* bytes of memory aligned to 64 bytes (to 2 MiB, and advised for
 * transparent huge pages, from EXR_HUGE_MIN on), or NULL. Release with
 * free(). */
void *exr_big_alloc(size_t bytes);

/* A batch whose arrays take at least this many bytes is written with
 * non-temporal stores (batch_copy.c): 16 MiB unless a test sets it. */
size_t exr_stream_min(void);
/* For tests: set it (0: back to the default); returns the value before. */
size_t exr_set_stream_min(size_t bytes);

#endif
