/*
 * zheap.h - zlib allocating through the core's own malloc and free.
 *
 * zlib's default allocator calls malloc from inside libz, out of reach of
 * anything that watches the core's allocations; routed through these, an
 * allocation that zlib makes counts as one of the core's, so the
 * allocation-failure test build (docs/fuzzing.md) fails zlib's allocations
 * too, and each one ends in EXR_ENOMEM like any other.
 */
#ifndef EXR_ZHEAP_H
#define EXR_ZHEAP_H

#include <stddef.h>
#include <zlib.h>

#include "exr.h"

/* Zeroes z and points its allocator at the core's; call before
 * deflateInit/inflateInit. */
void exr_zstream_init(z_stream *z);

#endif
