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

uint64_t episode_bytes(const exr_buffer *b, const exr_episode *e)
{
    const exr_store_layout *L = &b->lay;
    uint64_t row = L->row_bytes;
    return EPISODE_HEAD + (e->body->final_state ? L->state_bytes : 0) + e->n * row +
           4 * (e->n - e->m);
}

uint64_t exr_codec_raw_size_locked(const exr_buffer *b, size_t meta_len)
{
    uint64_t size = 16 + CONFIG_BYTES + 16 + meta_len;
    size += 16 + 8;
    for (uint32_t s = b->eps.head; s != EXR_NIL; s = b->eps.slab[s].next)
        size += episode_bytes(b, &b->eps.slab[s]);
    size += 16 + 8 + 8 * (uint64_t)b->picks.n;
    size += 16 + 8;
    for (size_t i = 0; i < b->nsels; i++) {
        const exr_selector_vtable *vt = b->sels[i].sel->vt;
        size += SELECTOR_HEAD + 8 * (uint64_t)vt->nparams + 8 + vt->state_size(b->sels[i].sel, b->picks.n);
    }
    return size + 16;
}

uint64_t exr_codec_bound(uint64_t raw, int level)
{
    uint64_t body = level == 0 ? raw : raw + raw / 1000 + (raw >> 12) + (raw >> 14) + (raw >> 25) + 64;
    return EXR_HEADER_BYTES + body;
}

exr_status exr_codec_check_header(const unsigned char h[EXR_HEADER_BYTES], uint64_t input_len,
                                  uint64_t *body_len)
{
    if (memcmp(h, MAGIC, 8) != 0 || get32(h + 8) < VERSION_MIN || get32(h + 8) > VERSION ||
        get32(h + 12) > 1)
        return EXR_ECORRUPT;
    if (get32(h + 36) != crc_update((uint32_t)crc32(0, Z_NULL, 0), h, 36))
        return EXR_ECORRUPT;
    uint64_t raw = get64(h + 16), body = get64(h + 24);
    if (input_len != UINT64_MAX && body != input_len - EXR_HEADER_BYTES)
        return EXR_ECORRUPT;
    if (get32(h + 12) == 0 ? raw != body : raw / ZLIB_MAX_RATIO > body)
        return EXR_ECORRUPT;
    *body_len = body;
    return EXR_OK;
}
