#include "floor.h"

#include <string.h>

void exr_floor_gather(const void *rows, size_t row_bytes, const int64_t *starts, size_t count,
                      size_t L, void *out_state, void *out_next)
{
    const unsigned char *src = rows;
    unsigned char *st = out_state, *nx = out_next;
    size_t run = L * row_bytes;
    for (size_t i = 0; i < count; i++) {
        const unsigned char *r = src + (size_t)starts[i] * row_bytes;
        memcpy(st + i * run, r, run);
        memcpy(nx + i * run, r + row_bytes, run);
    }
}

void exr_floor_gather_cols(size_t ncols, const void *const *cols, const size_t *widths,
                           const int64_t *starts, size_t count, size_t L, void *const *out,
                           void *const *next)
{
    for (size_t i = 0; i < count; i++) {
        for (size_t c = 0; c < ncols; c++) {
            size_t w = widths[c], run = L * w;
            const unsigned char *r = (const unsigned char *)cols[c] + (size_t)starts[i] * w;
            memcpy((unsigned char *)out[c] + i * run, r, run);
            if (next[c])
                memcpy((unsigned char *)next[c] + i * run, r + w, run);
        }
    }
}
