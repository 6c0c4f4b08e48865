#include "zheap.h"

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
