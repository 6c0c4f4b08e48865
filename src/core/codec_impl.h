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
#include "le.h"

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

/* little-endian fields: put32/put64/get32/get64 (le.h) */

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

/* ---- the layout's one description (codec.c): writer and reader both go
 * through these, so an offset or a size is written down once. */

/* CONFIG's fields, in the order of docs/format.md. */
enum {
    CF_STATE_BYTES, CF_ACTION_BYTES, CF_REWARD_BYTES, CF_CAPACITY, CF_PICK_LEN, CF_ALLOW_SHORT,
    CF_EVICTION, CF_SEED, CF_NEXT_HANDLE, CF_NEXT_SEL, CF_HAND, CF_EXTRA_BYTES, CF_N
};
void config_pack(const uint64_t v[CF_N], unsigned char out[CONFIG_BYTES]);
/* 0 if a reserved byte is not 0. */
int config_unpack(const unsigned char in[CONFIG_BYTES], uint64_t v[CF_N]);

typedef struct {
    int64_t handle;
    uint64_t n;
    uint8_t ended, terminated, sampled, has_final;
} episode_head;
void episode_head_pack(const episode_head *h, unsigned char out[EPISODE_HEAD]);
/* 0 if the reserved bytes are not 0 (as selector_head_unpack) */
int episode_head_unpack(const unsigned char in[EPISODE_HEAD], episode_head *h);

typedef struct {
    int64_t handle;
    uint32_t kind, nparams;
    uint64_t rng[4];
} selector_head;
void selector_head_pack(const selector_head *h, unsigned char out[SELECTOR_HEAD]);
int selector_head_unpack(const unsigned char in[SELECTOR_HEAD], selector_head *h);

/* Section contents' sizes (without the 16-byte section head). */
uint64_t episode_bytes(const exr_buffer *b, const exr_episode *e);
uint64_t episodes_len(const exr_buffer *b);
uint64_t picks_len(uint64_t n);
uint64_t selector_bytes(const exr_selector *s, size_t npicks);
uint64_t selectors_len(const exr_buffer *b);

#endif
