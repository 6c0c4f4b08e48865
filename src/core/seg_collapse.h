/*
 * seg_collapse.h - malloc'd storage segments moved onto 2 MiB pages once
 * they fill most of one (seg_collapse.c).
 */
#ifndef EXR_SEG_COLLAPSE_H
#define EXR_SEG_COLLAPSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The 2 MiB-aligned ranges ("chunks") that the kernel can back with one
 * huge page. */
#define EXR_CHUNK_BYTES ((size_t)2 << 20)
/* A chunk is queued for a collapse once this many of its bytes are live
 * malloc'd segments and a segment is counted in the chunk after it. */
#define EXR_CHUNK_QUEUE_BYTES (EXR_CHUNK_BYTES / 2)

/* Counts the malloc'd segment p (its usable size) into its chunks (add), or
 * out of them (!add, before it is freed). Best effort: what cannot be
 * counted (no memory for the table) is left out, and a count never goes
 * below 0. Takes the file's mutex, a leaf lock. */
void exr_seg_track(const void *p, bool add);

/* exr_seg_track's count of n bytes from address a: tests give it made-up
 * ranges. */
void exr_seg_track_range(uintptr_t a, size_t n, bool add);

/* Whether a chunk waits to be collapsed (one relaxed load). */
bool exr_seg_collapse_wanted(void);

/* Collapses the queued chunks (madvise MADV_COLLAPSE, each 2 MiB copied
 * into a huge page by the kernel: about a millisecond). Call it with no
 * buffer lock held, and without the GIL. Returns how many succeeded. */
size_t exr_seg_collapse_pending(void);

/* For tests and diagnostics. */
typedef struct {
    size_t chunks;          /* chunks with live segments counted */
    size_t queued;          /* chunks ever queued */
    size_t collapsed;       /* collapses that succeeded */
    size_t failed;          /* collapses the kernel refused */
} exr_seg_collapse_stats;
void exr_seg_collapse_get_stats(exr_seg_collapse_stats *s);
/* Bytes of live segments counted in the chunk holding p. */
size_t exr_seg_chunk_bytes(const void *p);
/* Turns counting on or off (on at start); returns the setting before. Off,
 * new segments are not counted (so nothing more is queued), and segments
 * freed are still taken out of the counts. */
bool exr_seg_collapse_enable(bool on);

#endif
