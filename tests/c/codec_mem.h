/*
 * codec_mem.h - the C tests' serialized form in memory: a sink that grows an
 * array, a source that reads it back, and serialize/unserialize of a whole
 * buffer through them (header then body), as the binding does.
 */
#ifndef EXR_TEST_CODEC_MEM_H
#define EXR_TEST_CODEC_MEM_H

#include <stdlib.h>
#include <string.h>

#include "buffer.h"
#include "codec.h"

typedef struct {
    unsigned char *p;
    size_t n, cap, at;
} mem;

static exr_status mem_sink(void *ctx, const void *p, size_t n)
{
    mem *m = ctx;
    if (m->n + n > m->cap) {
        size_t cap = (m->n + n) * 2;
        unsigned char *q = realloc(m->p, cap);
        if (!q)
            return EXR_ENOMEM;
        m->p = q;
        m->cap = cap;
    }
    memcpy(m->p + m->n, p, n);
    m->n += n;
    return EXR_OK;
}

static exr_status mem_source(void *ctx, void *p, size_t cap, size_t *got)
{
    mem *m = ctx;
    size_t k = m->n - m->at < cap ? m->n - m->at : cap;
    memcpy(p, m->p + m->at, k);
    m->at += k;
    *got = k;
    return EXR_OK;
}

/* The whole serialized form: header then body. */
static exr_status serialize(exr_buffer *b, int level, mem *out)
{
    static const unsigned char meta[] = "meta";
    unsigned char hdr[EXR_HEADER_BYTES] = {0};
    memset(out, 0, sizeof *out);
    exr_status st = mem_sink(out, hdr, sizeof hdr); /* room for the header */
    if (st != EXR_OK)
        return st;
    exr_buffer_lock(b);
    st = exr_codec_write_locked(b, meta, sizeof meta, level, mem_sink, out, NULL, NULL, hdr);
    exr_buffer_unlock(b);
    if (st == EXR_OK)
        memcpy(out->p, hdr, sizeof hdr);
    return st;
}

static exr_status unserialize(const unsigned char *p, size_t n, exr_buffer **out)
{
    exr_codec_header h;
    if (n < EXR_HEADER_BYTES)
        return EXR_ECORRUPT;
    exr_status st = exr_codec_check_header(p, n, &h);
    if (st != EXR_OK)
        return st;
    mem src = {(unsigned char *)p + EXR_HEADER_BYTES, n - EXR_HEADER_BYTES, 0, 0};
    unsigned char meta[EXR_META_MAX];
    size_t meta_len = 0;
    return exr_codec_read(&h, mem_source, &src, out, meta, &meta_len);
}

#endif
