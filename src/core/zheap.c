#include "zheap.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static voidpf zheap_alloc(voidpf opaque, uInt items, uInt size)
{
    (void)opaque;
    size_t n;
    if (!exr_mul_size(items, size, &n))
        return Z_NULL;
    return malloc(n);
}

static void zheap_free(voidpf opaque, voidpf p)
{
    (void)opaque;
    free(p);
}

void exr_zstream_init(z_stream *z)
{
    memset(z, 0, sizeof *z);
    z->zalloc = zheap_alloc;
    z->zfree = zheap_free;
    z->opaque = Z_NULL;
}

exr_status exr_zcompress(unsigned char *dst, size_t cap, size_t *out_len, const unsigned char *src,
                         size_t n, int level)
{
    if (n > UINT_MAX || cap > UINT_MAX)
        return EXR_EOVERFLOW;
    z_stream z;
    exr_zstream_init(&z);
    if (deflateInit(&z, level) != Z_OK)
        return EXR_ENOMEM;
    z.next_in = (Bytef *)src;
    z.avail_in = (uInt)n;
    z.next_out = dst;
    z.avail_out = (uInt)cap;
    int r = deflate(&z, Z_FINISH);
    *out_len = (size_t)z.total_out;
    deflateEnd(&z);
    return r == Z_STREAM_END ? EXR_OK : EXR_ENOMEM;
}
