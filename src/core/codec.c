/*
 * codec.c - the serialized form's layout (docs/format.md) that writer and
 * reader share: the payload's size, the bound of the output, the header.
 */
#include "codec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "buffer_impl.h"
#include "codec_impl.h"

/* ---- CONFIG: one table of (offset, width) that writer and reader share -- */

static const struct {
    uint8_t off, width;
} config_layout[CF_N] = {
    [CF_STATE_BYTES] = {0, 8}, [CF_ACTION_BYTES] = {8, 8}, [CF_REWARD_BYTES] = {16, 8},
    [CF_CAPACITY] = {24, 8},   [CF_PICK_LEN] = {32, 4},    [CF_ALLOW_SHORT] = {36, 1},
    [CF_EVICTION] = {37, 1},   [CF_SEED] = {40, 8},        [CF_NEXT_HANDLE] = {48, 8},
    [CF_NEXT_SEL] = {56, 8},   [CF_HAND] = {64, 8},         [CF_EXTRA_BYTES] = {72, 8},
};

void config_pack(const uint64_t v[CF_N], unsigned char out[CONFIG_BYTES])
{
    memset(out, 0, CONFIG_BYTES); /* the bytes no field covers are reserved: 0 */
    for (int f = 0; f < CF_N; f++) {
        uint64_t x = v[f];
        memcpy(out + config_layout[f].off, &x, config_layout[f].width); /* little-endian */
    }
}

int config_unpack(const unsigned char in[CONFIG_BYTES], uint64_t v[CF_N])
{
    unsigned char covered[CONFIG_BYTES] = {0};
    for (int f = 0; f < CF_N; f++) {
        uint64_t x = 0;
        memcpy(&x, in + config_layout[f].off, config_layout[f].width);
        v[f] = x;
        memset(covered + config_layout[f].off, 1, config_layout[f].width);
    }
    for (size_t i = 0; i < CONFIG_BYTES; i++)
        if (!covered[i] && in[i])
            return 0;
    return 1;
}

/* ---- an episode's and a selector's head --------------------------------- */

void episode_head_pack(const episode_head *h, unsigned char out[EPISODE_HEAD])
{
    memset(out, 0, EPISODE_HEAD);
    put64(out, (uint64_t)h->handle);
    put64(out + 8, h->n);
    out[16] = h->ended;
    out[17] = h->terminated;
    out[18] = h->sampled;
    out[19] = h->has_final;
}

int episode_head_unpack(const unsigned char in[EPISODE_HEAD], episode_head *h)
{
    h->handle = (int64_t)get64(in);
    h->n = get64(in + 8);
    h->ended = in[16];
    h->terminated = in[17];
    h->sampled = in[18];
    h->has_final = in[19];
    return get32(in + 20) == 0;
}

void selector_head_pack(const selector_head *h, unsigned char out[SELECTOR_HEAD])
{
    put64(out, (uint64_t)h->handle);
    put32(out + 8, h->kind);
    put32(out + 12, h->nparams);
    memcpy(out + 16, h->rng, 32);
    memset(out + 48, 0, 8);
}

int selector_head_unpack(const unsigned char in[SELECTOR_HEAD], selector_head *h)
{
    h->handle = (int64_t)get64(in);
    h->kind = get32(in + 8);
    h->nparams = get32(in + 12);
    memcpy(h->rng, in + 16, 32);
    return get64(in + 48) == 0;
}

/* ---- section sizes: the one formula the writer and exr_codec_raw_size use */

uint64_t episode_bytes(const exr_buffer *b, const exr_episode *e)
{
    const exr_store_layout *L = &b->lay;
    uint64_t row = L->row_bytes;
    return EPISODE_HEAD + (e->body->final_state ? L->state_bytes : 0) + e->n * row +
           4 * (e->n - e->m);
}

uint64_t episodes_len(const exr_buffer *b)
{
    uint64_t len = 8;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        len += episode_bytes(b, &b->eps.slab[s]);
    return len;
}

uint64_t picks_len(uint64_t n) { return 8 + 8 * n; }

uint64_t selector_bytes(const exr_selector *s, size_t npicks)
{
    return SELECTOR_HEAD + 8 * (uint64_t)s->vt->nparams + 8 + s->vt->state_size(s, npicks);
}

uint64_t selectors_len(const exr_buffer *b)
{
    uint64_t len = 8;
    for (size_t i = 0; i < b->nsels; i++)
        len += selector_bytes(b->sels[i].sel, b->picks.n);
    return len;
}

uint64_t exr_codec_raw_size_locked(const exr_buffer *b, size_t meta_len)
{
    EXR_ASSERT_LOCKED(b);
    /* every section is a 16-byte head and its content; END has none */
    return 16 + CONFIG_BYTES + 16 + meta_len + 16 + episodes_len(b) + 16 +
           picks_len(b->picks.n) + 16 + selectors_len(b) + 16;
}

uint64_t exr_codec_bound(uint64_t raw, int level)
{
    uint64_t body = level == 0 ? raw : raw + raw / 1000 + (raw >> 12) + (raw >> 14) + (raw >> 25) + 64;
    return EXR_HEADER_BYTES + body;
}

exr_status exr_codec_check_header(const unsigned char header[EXR_HEADER_BYTES],
                                  uint64_t input_len, exr_codec_header *out)
{
    unsigned char h[EXR_HEADER_BYTES];
    memcpy(h, header, sizeof h); /* the only read of the caller's bytes */
    uint32_t version = get32(h + 8), codec = get32(h + 12);
    if (memcmp(h, MAGIC, 8) != 0 || version < VERSION_MIN || version > VERSION || codec > 1)
        return EXR_ECORRUPT;
    if (get32(h + 36) != crc_update((uint32_t)crc32(0, Z_NULL, 0), h, 36))
        return EXR_ECORRUPT;
    uint64_t raw = get64(h + 16), body = get64(h + 24);
    if (input_len != UINT64_MAX && body != input_len - EXR_HEADER_BYTES)
        return EXR_ECORRUPT;
    if (codec == 0 ? raw != body : raw / ZLIB_MAX_RATIO > body)
        return EXR_ECORRUPT;
    *out = (exr_codec_header){.version = version, .codec = codec, .payload_crc = get32(h + 32),
                              .raw_len = raw, .body_len = body};
    return EXR_OK;
}
