/*
 * codec.h - the serialized form of a buffer (docs/format.md) and the byte
 * streams it is written to and read from.
 *
 *   header (40 B, never compressed)   body: the payload, stored or zlib
 *   +--------+-----+-----+-----+-----+-----+-----+   +-----------------------+
 *   | magic  | ver | cdc | raw | len | crc | hcrc|   | CONFIG META EPISODES  |
 *   +--------+-----+-----+-----+-----+-----+-----+   | PICKS SELECTORS END   |
 *                                                    +-----------------------+
 *
 * Writing streams the payload through zlib into a sink in chunks: no second
 * full copy. Reading pulls the body from a source in chunks and validates
 * every field before it allocates for it: a declared size must fit in what
 * the input can still deliver (for zlib, 1032 raw bytes a compressed byte at
 * most), so hostile input is refused with EXR_ECORRUPT and never makes the
 * reader allocate far beyond what its length justifies.
 */
#ifndef EXR_CODEC_H
#define EXR_CODEC_H

#include "buffer.h"

#define EXR_HEADER_BYTES 40
#define EXR_META_MAX 4096

/* Where written bytes go: returns EXR_OK or an error that aborts the write. */
typedef exr_status (*exr_sink_fn)(void *ctx, const void *p, size_t n);
/* Where read bytes come from: up to cap bytes into p, *got = 0 at the end. */
typedef exr_status (*exr_source_fn)(void *ctx, void *p, size_t cap, size_t *got);

/* Called every EXR_PROGRESS_EVERY payload bytes with the bytes done and the
 * payload's size; a non-zero return aborts the write (EXR_EABORTED). */
typedef int (*exr_progress_fn)(void *ctx, uint64_t done, uint64_t total);
#define EXR_PROGRESS_EVERY ((uint64_t)64 << 20)

typedef struct exr_out exr_out;
typedef struct exr_in exr_in;

/* A sink into a caller's buffer of cap bytes (used: how many are written):
 * exr_mem_sink_write is an exr_sink_fn, EXR_EOVERFLOW once the buffer is
 * full. For serializing into a buffer sized by exr_codec_bound. */
typedef struct {
    unsigned char *p;
    size_t cap, used;
} exr_mem_sink;
exr_status exr_mem_sink_write(void *ctx, const void *p, size_t n);

/* Payload streams, for the selectors' save/load hooks. */
exr_status exr_out_write(exr_out *o, const void *p, size_t n);
exr_status exr_in_read(exr_in *in, void *p, size_t n); /* EXR_ECORRUPT if short */

/* Exact size of the payload (before compression) for meta_len bytes of
 * binding metadata. Lock held. */
uint64_t exr_codec_raw_size_locked(const exr_buffer *b, size_t meta_len);

/* Upper bound of header + body for a payload of raw bytes at this level. */
uint64_t exr_codec_bound(uint64_t raw, int level);

/* Streams the body through sink (the caller keeps the first
 * EXR_HEADER_BYTES of its output free) and fills header[] for them.
 * level: 0 stores, 1-9 zlib. progress may be NULL. Lock held. O(size). */
exr_status exr_codec_write_locked(const exr_buffer *b, const void *meta, size_t meta_len,
                                  int level, exr_sink_fn sink, void *ctx,
                                  exr_progress_fn progress, void *progress_ctx,
                                  unsigned char header[EXR_HEADER_BYTES]);

/* A header's fields, checked (docs/format.md, "Header checks"). */
typedef struct {
    uint32_t version, codec, payload_crc;
    uint64_t raw_len, body_len; /* body_len: the bytes that must follow the header */
} exr_codec_header;

/* Copies the header's bytes once, checks the copy and fills *out from it:
 * the caller's bytes are never read again, so another thread writing them
 * meanwhile (a bytearray that unserialize reads without the GIL) cannot
 * make the fields read differ from the fields checked. input_len is the
 * size of the whole input if known (UINT64_MAX if not). */
exr_status exr_codec_check_header(const unsigned char header[EXR_HEADER_BYTES],
                                  uint64_t input_len, exr_codec_header *out);

/* Reads a body after a header checked by exr_codec_check_header into a new
 * buffer. meta receives up to EXR_META_MAX bytes of binding metadata.
 * EXR_ECORRUPT for anything invalid (nothing is leaked), EXR_ENOMEM if
 * memory runs out. */
exr_status exr_codec_read(const exr_codec_header *h, exr_source_fn src, void *ctx,
                          exr_buffer **out, unsigned char *meta, size_t *meta_len);

#endif
