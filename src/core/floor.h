/*
 * floor.h - the physical floor for get_batch: a plain gather from one
 * contiguous array of rows, with nothing to look up. Benchmarks time it in
 * the same run as get_batch and report get_batch / floor.
 *
 *   rows: [r0 r1 r2 ... ]  (row_bytes each)
 *   for each start s: out_state <- rows[s .. s+L), out_next <- rows[s+1 .. s+L+1)
 */
#ifndef EXR_FLOOR_H
#define EXR_FLOOR_H

#include "exr.h"

/* starts[i] + L < nrows must hold (the caller checks). O(count * L). */
void exr_floor_gather(const void *rows, size_t row_bytes, const int64_t *starts, size_t count,
                      size_t L, void *out_state, void *out_next);

/* The floor for named fields: ncols columns, each its own contiguous array
 * of items (widths[c] bytes), gathered pick by pick as get_batch fills a
 * field at a time: out[c] <- cols[c][s .. s+L), and next[c] (NULL: not
 * wanted) <- cols[c][s+1 .. s+L+1). */
void exr_floor_gather_cols(size_t ncols, const void *const *cols, const size_t *widths,
                           const int64_t *starts, size_t count, size_t L, void *const *out,
                           void *const *next);

#endif
