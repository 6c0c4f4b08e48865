/*
 * fields.h - records with several named fields (docs/design.md, "Named
 * fields and extras"). The core does not know names or dtypes: a row is
 * still bytes,
 *
 *   row: | state (state_bytes) | action | reward | extras (extra_bytes) |
 *          f0 | f1 | ...                            x0 | x1 | ...
 *
 * and the binding, which knows where each named field sits in the row,
 * hands record and get_batch a "field copy plan": one entry per field with
 * its offset and width in the row and where its bytes come from or go to.
 * The core copies each field straight between the caller's array and the
 * row, so nothing is packed or unpacked on the way.
 */
#ifndef EXR_FIELDS_H
#define EXR_FIELDS_H

#include "exr.h"

/* record: field bytes at [off, off + bytes) of row t come from
 * src + t * stride. */
typedef struct {
    size_t off, bytes;
    const unsigned char *src;
    size_t stride;
} exr_field_src;

/* get_batch: field [off, off + bytes) of each pick's steps goes to dst, an
 * array of count * pick_len items of `bytes` (steps past the pick's length
 * zeroed). A state field (next not NULL) also fills next with the field of
 * the next states, as state_next is filled. A state field with seq set
 * (next NULL) has pick_len + 1 items a pick in dst instead: the pick's
 * steps, then the field of its last next state, then zeros. */
typedef struct {
    size_t off, bytes;
    unsigned char *dst, *next;
    bool seq;
} exr_field_dst;

#endif
