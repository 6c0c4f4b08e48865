/*
 * codec_impl.h - what the codec's writer (codec_write.c), reader
 * (codec_read.c) and shared layout (codec.c) have in common: the constants
 * of docs/format.md and its little-endian fields.
 */
#ifndef EXR_CODEC_IMPL_H
#define EXR_CODEC_IMPL_H

#include <stdint.h>
#include <string.h>
#include <zlib.h>

#include "buffer_impl.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the serialized form is little-endian and written from memory as is"
#endif

#define MAGIC "EXREPLAY"
/* Version 2 adds per-step extras (CONFIG's extra_bytes, rows that long);
 * the writer writes 1 for a buffer without extras, so that those files stay
 * readable by a version-1 reader, and the reader reads both. */
#define VERSION 2u
#define VERSION_MIN 1u
#define CHUNK ((size_t)1 << 18)
#define CONFIG_BYTES 80u
#define EPISODE_HEAD 24u
#define SELECTOR_HEAD 56u /* handle, kind, nparams, rng[4] */
/* zlib never expands a payload by more than 1032:1 (RFC 1951's longest
 * match per the shortest code), so a body of c bytes holds at most this: */
#define ZLIB_MAX_RATIO 1032u

enum { SEC_CONFIG = 1, SEC_META, SEC_EPISODES, SEC_PICKS, SEC_SELECTORS, SEC_END };

/* ---- little-endian fields ----------------------------------------------- */

static inline void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint32_t get32(const unsigned char *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static inline uint64_t get64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static inline uint32_t crc_update(uint32_t crc, const void *p, size_t n)
{
    const unsigned char *c = p;
    while (n) {
        uInt part = n > (1u << 30) ? (1u << 30) : (uInt)n;
        crc = (uint32_t)crc32(crc, c, part);
        c += part;
        n -= part;
    }
    return crc;
}

/* codec.c: the bytes episode e takes in the EPISODES section. */
uint64_t episode_bytes(const exr_buffer *b, const exr_episode *e);

#endif
