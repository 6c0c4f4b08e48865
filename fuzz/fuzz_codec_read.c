/*
 * fuzz_codec_read.c - libFuzzer harness for the serialized-buffer reader
 * (exr_codec_check_header + exr_codec_read, the path under unserialize and
 * load). Built with ASan + UBSan by `make fuzz` (docs/fuzzing.md).
 *
 * The first byte of an input says what the rest is:
 *   0 (and 3..255)  a whole serialized buffer, read as it is: this reaches
 *                   the header checks and the CRCs;
 *   1               a payload: the harness wraps it in a stored (codec 0,
 *                   format version 2, which reads every version-1 payload too)
 *                   body with a correct header and payload CRC;
 *   2               a payload, wrapped in a zlib body (level 1).
 * Modes 1 and 2 let mutations reach the section parsers instead of dying at
 * the CRC check (libFuzzer cannot fix a CRC up itself).
 *
 * Every input must either be refused with EXR_ECORRUPT (or EXR_ENOMEM) or
 * give a buffer that passes exr_buffer_check_locked and serializes at
 * level 0 to bytes that read back and serialize to the same bytes again.
 * Anything else aborts, which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "buffer.h"
#include "codec.h"
#include "le.h"


/* A serialized buffer (docs/format.md, Header) around payload; malloc'd. */
static unsigned char *wrap_payload(const uint8_t *payload, size_t n, int zlib_body, size_t *len)
{
    uLongf body = zlib_body ? compressBound((uLong)n) : (uLongf)n;
    unsigned char *out = malloc(EXR_HEADER_BYTES + (size_t)body + 1);
    if (!out)
        return NULL;
    if (zlib_body) {
        if (compress2(out + EXR_HEADER_BYTES, &body, payload, (uLong)n, 1) != Z_OK) {
            free(out);
            return NULL;
        }
    } else if (n) {
        memcpy(out + EXR_HEADER_BYTES, payload, n);
    }
    memcpy(out, "EXREPLAY", 8);
    put32(out + 8, 2); /* the current version: reads every payload version 1 can hold */
    put32(out + 12, zlib_body ? 1 : 0);
    put64(out + 16, n);
    put64(out + 24, body);
    put32(out + 32, (uint32_t)crc32(crc32(0, Z_NULL, 0), payload, (uInt)n));
    put32(out + 36, (uint32_t)crc32(crc32(0, Z_NULL, 0), out, 36));
    *len = EXR_HEADER_BYTES + (size_t)body;
    return out;
}

typedef struct {
    const unsigned char *p;
    size_t left;
} mem_source;

static exr_status source_mem(void *ctx, void *p, size_t cap, size_t *got)
{
    mem_source *m = ctx;
    size_t n = cap < m->left ? cap : m->left;
    if (n)
        memcpy(p, m->p, n);
    m->p += n;
    m->left -= n;
    *got = n;
    return EXR_OK;
}

static void fail(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz_codec_read: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    abort();
}

/* Reads data into *out; returns the status. */
static exr_status read_buffer(const uint8_t *data, size_t size, exr_buffer **out,
                              unsigned char *meta, size_t *meta_len)
{
    exr_codec_header h;
    if (size < EXR_HEADER_BYTES)
        return EXR_ECORRUPT;
    exr_status st = exr_codec_check_header(data, (uint64_t)size, &h);
    if (st != EXR_OK)
        return st;
    mem_source src = {data + EXR_HEADER_BYTES, size - EXR_HEADER_BYTES};
    return exr_codec_read(&h, source_mem, &src, out, meta, meta_len);
}

/* Serializes b at level 0 into a new malloc'd array; NULL if memory ran out. */
static unsigned char *write_buffer(exr_buffer *b, const unsigned char *meta, size_t meta_len,
                                   size_t *len)
{
    exr_buffer_lock(b);
    uint64_t bound = exr_codec_bound(exr_codec_raw_size_locked(b, meta_len), 0);
    unsigned char *out = bound <= SIZE_MAX ? malloc((size_t)bound) : NULL;
    exr_status st = EXR_ENOMEM;
    exr_mem_sink m = {out + EXR_HEADER_BYTES, (size_t)bound - EXR_HEADER_BYTES, 0};
    if (out)
        st = exr_codec_write_locked(b, meta, meta_len, 0, exr_mem_sink_write, &m, NULL, NULL, out);
    exr_buffer_unlock(b);
    if (st != EXR_OK) {
        if (st != EXR_ENOMEM)
            fail("serialize of a restored buffer failed", NULL);
        free(out);
        return NULL;
    }
    *len = EXR_HEADER_BYTES + m.used;
    return out;
}

static int one_input(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (data[0] != 1 && data[0] != 2)
        return one_input(data + 1, size - 1);
    size_t len;
    unsigned char *wrapped = wrap_payload(data + 1, size - 1, data[0] == 2, &len);
    if (!wrapped)
        return 0;
    one_input(wrapped, len);
    free(wrapped);
    return 0;
}

static int one_input(const uint8_t *data, size_t size)
{
    static unsigned char meta[EXR_META_MAX], meta2[EXR_META_MAX];
    size_t meta_len = 0, meta2_len = 0;
    exr_buffer *b = NULL;
    exr_status st = read_buffer(data, size, &b, meta, &meta_len);
    if (st != EXR_OK) {
        if (st != EXR_ECORRUPT && st != EXR_ENOMEM)
            fail("the reader returned a status other than ECORRUPT/ENOMEM", NULL);
        if (b)
            fail("a refused input left a buffer", NULL);
        return 0;
    }
    char msg[256];
    exr_buffer_lock(b);
    int broken = exr_buffer_check_locked(b, msg, sizeof msg);
    exr_buffer_unlock(b);
    if (broken)
        fail("a restored buffer fails its invariant check", msg);

    /* round trip: what the writer makes of it, the reader must take, and
     * writing that again gives the same bytes */
    size_t n1 = 0, n2 = 0;
    unsigned char *s1 = write_buffer(b, meta, meta_len, &n1);
    exr_buffer_free(b);
    if (!s1)
        return 0;
    exr_buffer *b2 = NULL;
    st = read_buffer(s1, n1, &b2, meta2, &meta2_len);
    if (st == EXR_ENOMEM) {
        free(s1);
        return 0;
    }
    if (st != EXR_OK)
        fail("the reader refuses what the writer wrote", NULL);
    if (meta2_len != meta_len || memcmp(meta, meta2, meta_len) != 0)
        fail("metadata changed in a round trip", NULL);
    unsigned char *s2 = write_buffer(b2, meta2, meta2_len, &n2);
    exr_buffer_free(b2);
    if (s2 && (n1 != n2 || memcmp(s1, s2, n1) != 0))
        fail("a round trip changed the serialized bytes", NULL);
    free(s1);
    free(s2);
    return 0;
}
