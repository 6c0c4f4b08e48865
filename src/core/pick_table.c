#include "pick_table.h"

#include "mem.h"

#include <stdlib.h>
#include <string.h>

void exr_pick_table_init(exr_pick_table *t) { memset(t, 0, sizeof *t); }

void exr_pick_table_free(exr_pick_table *t)
{
    free(t->v);
    exr_pick_table_init(t);
}

size_t exr_pick_table_huge_bytes(size_t bytes, size_t full)
{
    const size_t page = (size_t)2 << 20;
    size_t used = full < bytes / sizeof(exr_pick) ? full * sizeof(exr_pick) : bytes;
    size_t up = (used + page - 1) & ~(page - 1);
    return up - used <= used / 8 ? up : used & ~(page - 1);
}

exr_status exr_pick_table_reserve(exr_pick_table *t, size_t n, size_t full)
{
    if (n <= t->cap)
        return EXR_OK;
    if (n > (size_t)UINT32_MAX - 1)
        return EXR_EOVERFLOW;
    size_t cap = t->cap ? t->cap : 256;
    while (cap < n)
        cap = cap > SIZE_MAX / 4 ? n : cap * 2;
    if (cap > (size_t)UINT32_MAX - 1)
        cap = (size_t)UINT32_MAX - 1;
    size_t bytes;
    if (!exr_mul_size(cap, sizeof(exr_pick), &bytes))
        return EXR_EOVERFLOW;
    exr_pick *v;
    if (bytes < EXR_PICK_TABLE_HUGE) {
        v = realloc(t->v, bytes);
    } else if ((v = exr_huge_prefix_alloc(bytes, exr_pick_table_huge_bytes(bytes, full)))) {
        if (t->n)
            memcpy(v, t->v, t->n * sizeof *v);
        free(t->v);
    }
    if (!v)
        return EXR_ENOMEM;
    t->v = v;
    t->cap = cap;
    return EXR_OK;
}
