/*
 * seg_heap.h - storage segments on 2 MiB pages (seg_heap.c).
 */
#ifndef EXR_SEG_HEAP_H
#define EXR_SEG_HEAP_H

#include <stdbool.h>
#include <stddef.h>

/* Segments from this size up to EXR_SEG_HEAP_MAX, of a power-of-two number
 * of rows, come from the segment heap. */
#define EXR_SEG_HEAP_MIN ((size_t)64 << 10)
#define EXR_SEG_HEAP_MAX ((size_t)64 << 20)

/* Whether a segment of `rows` rows taking `bytes` bytes (a multiple of 64)
 * comes from the segment heap. */
bool exr_seg_heap_takes(size_t rows, size_t bytes);

/* A slot of `bytes` bytes (2 MiB pages where the kernel gives them), or NULL. */
void *exr_seg_heap_alloc(size_t bytes);

/* Frees a segment, from the segment heap or from malloc (NULL: nothing). */
void exr_seg_free(void *p);

/* Bytes the segment heap has mapped (for tests). */
size_t exr_seg_heap_mapped(void);
/* Bytes of the slots handed out and not freed (for tests). */
size_t exr_seg_heap_used(void);

#endif
