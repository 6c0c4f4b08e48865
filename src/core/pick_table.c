#include "pick_table.h"

#include <stdlib.h>
#include <string.h>

void exr_pick_table_init(exr_pick_table *t) { memset(t, 0, sizeof *t); }

void exr_pick_table_free(exr_pick_table *t)
{
    free(t->v);
    exr_pick_table_init(t);
}

exr_status exr_pick_table_reserve(exr_pick_table *t, size_t n)
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
    exr_pick *v = realloc(t->v, bytes);
    if (!v)
        return EXR_ENOMEM;
    t->v = v;
    t->cap = cap;
    return EXR_OK;
}
