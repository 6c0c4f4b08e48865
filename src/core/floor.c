#include "floor.h"

#include <string.h>

void exr_floor_gather(const void *rows, size_t row_bytes, const int64_t *starts, size_t count,
                      size_t L, void *out_state, void *out_next)
{
    const unsigned char *src = rows;
    unsigned char *st = out_state, *nx = out_next;
    size_t run = L * row_bytes;
    if (!nx) { /* shared next states: rows[s .. s+L] in one run */
        for (size_t i = 0; i < count; i++)
            memcpy(st + i * (run + row_bytes), src + (size_t)starts[i] * row_bytes,
                   run + row_bytes);
        return;
    }
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

/* The rows of the pick starting at row s (and its next state): every line. */
static inline void prefetch_rows(const unsigned char *src, size_t row, size_t s, size_t L)
{
    const unsigned char *r = src + s * row;
    size_t bytes = (L + 1) * row;
    for (size_t off = 0; off < bytes; off += 64)
        __builtin_prefetch(r + off);
    __builtin_prefetch(r + bytes - 1);
}

/* One step of one pick: its state, action and reward, and its next state
 * (the next row's state). Always inlined, so that the sizes of the paper's
 * records (16, 8, 4) are constants where the caller passes them. */
static inline __attribute__((always_inline)) void
batch_step(const unsigned char *r, size_t sb, size_t ab, size_t rb, size_t k, unsigned char *st,
           unsigned char *ac, unsigned char *rw, unsigned char *nx)
{
    size_t row = sb + ab + rb;
    memcpy(st + k * sb, r, sb);
    memcpy(ac + k * ab, r + sb, ab);
    memcpy(rw + k * rb, r + sb + ab, rb);
    memcpy(nx + k * sb, r + row, sb);
}

static inline __attribute__((always_inline)) void
batch_picks(const unsigned char *src, size_t sb, size_t ab, size_t rb, const int64_t *starts,
            size_t count, size_t L, size_t ep, const exr_batch_out *o)
{
    enum { AHEAD = 16 };
    size_t row = sb + ab + rb;
    for (size_t i = 0; i < count && i < AHEAD; i++)
        prefetch_rows(src, row, (size_t)starts[i], L);
    for (size_t i = 0; i < count; i++) {
        if (i + AHEAD < count)
            prefetch_rows(src, row, (size_t)starts[i + AHEAD], L);
        size_t s = (size_t)starts[i];
        const unsigned char *r = src + s * row;
        for (size_t t = 0; t < L; t++, r += row)
            batch_step(r, sb, ab, rb, i * L + t, o->state, o->action, o->reward, o->state_next);
        exr_floor_pick_meta(o, i, s, L, ep);
    }
}

void exr_floor_gather_batch(const void *rows, size_t sb, size_t ab, size_t rb,
                            const int64_t *starts, size_t count, size_t L, size_t ep,
                            const exr_batch_out *out)
{
    if (sb == 16 && ab == 8 && rb == 4) /* the paper's records: constant sizes */
        batch_picks(rows, 16, 8, 4, starts, count, L, ep, out);
    else
        batch_picks(rows, sb, ab, rb, starts, count, L, ep, out);
}
