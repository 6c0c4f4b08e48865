/*
 * buffer_priority.c - priority updates, the stored priorities and their totals.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

/* Table index of pick (epi, pos) when hint still holds it: a batch's index
 * is only a hint, since picks move by swap-removal after it was drawn. The
 * table holds live picks only, and handles are never reused, so an entry
 * naming this episode's handle and this position is this pick. */
static inline int hint_holds(const exr_buffer *b, int64_t hint, int64_t epi, int64_t pos)
{
    if (hint < 0 || (uint64_t)hint >= b->picks.n)
        return 0;
    const exr_pick *pk = &b->picks.v[hint];
    return (int64_t)pk->pos == pos && b->eps.slab[pk->slot].handle == epi;
}

#define PRIO_SMALL 256

static exr_status set_priority_impl(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                    const int64_t *pos, const int64_t *hint, const double *prio,
                                    size_t prio_stride, size_t *applied)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    for (size_t i = 0; i < count; i++) {
        double p = prio[i * prio_stride];
        if (!isfinite(p) || p < 0)
            return EXR_EINVAL;
    }
    size_t done = 0;
    if (e->sel->vt->prioritized && count) {
        size_t small_idx[PRIO_SMALL], small_scratch[PRIO_SMALL];
        double small_kept[PRIO_SMALL];
        uint32_t *small_aux[PRIO_SMALL];
        size_t *idx = small_idx, *scratch = small_scratch;
        double *kept = small_kept;
        uint32_t **aux = small_aux;
        if (count > PRIO_SMALL) {
            size_t bytes;
            if (!exr_mul_size(count, sizeof(size_t), &bytes))
                return EXR_EOVERFLOW;
            idx = malloc(bytes);
            scratch = malloc(bytes);
            kept = malloc(count * sizeof *kept);
            aux = malloc(count * sizeof *aux);
            if (!idx || !scratch || !kept || !aux) {
                free(idx);
                free(scratch);
                free(kept);
                free(aux);
                return EXR_ENOMEM;
            }
        }
        /* Pass 1 prefetches what pass 2 reads: the hinted table entry, or
         * the pick's aux entry found through the map (kept in aux[i]; NULL:
         * no such pick; `unresolved`: hinted, not looked up). Pass 2
         * resolves. The dependent misses of different picks overlap. */
        static uint32_t unresolved_;
        uint32_t *const unresolved = &unresolved_;
        for (size_t i = 0; i < count; i++) {
            if (hint && hint[i] >= 0 && (uint64_t)hint[i] < b->picks.n) {
                __builtin_prefetch(&b->picks.v[hint[i]]);
                aux[i] = unresolved;
            } else {
                aux[i] = pick_aux_locked(b, epi[i], pos[i]);
                if (aux[i])
                    __builtin_prefetch(aux[i]);
            }
        }
        for (size_t i = 0; i < count; i++) {
            size_t j;
            if (aux[i] == unresolved && hint_holds(b, hint[i], epi[i], pos[i])) {
                j = (size_t)hint[i];
            } else {
                const uint32_t *a = aux[i] == unresolved ? pick_aux_locked(b, epi[i], pos[i]) : aux[i];
                if (!a)
                    continue;
                j = *a;
            }
            idx[done] = j;
            kept[done] = prio[i * prio_stride];
            done++;
        }
        pthread_mutex_lock(&e->sel->mu);
        e->sel->vt->update_many(e->sel, done, idx, kept, scratch);
        pthread_mutex_unlock(&e->sel->mu);
        if (idx != small_idx) {
            free(idx);
            free(scratch);
            free(kept);
            free(aux);
        }
    }
    *applied = done;
    return EXR_OK;
}

exr_status exr_buffer_set_priority_locked(exr_buffer *b, int64_t h, size_t count,
                                          const int64_t *epi, const int64_t *pos,
                                          const double *prio, size_t prio_stride,
                                          size_t *applied)
{
    return set_priority_impl(b, h, count, epi, pos, NULL, prio, prio_stride, applied);
}

exr_status exr_buffer_set_priority(exr_buffer *b, int64_t h, size_t count, const int64_t *epi,
                                   const int64_t *pos, const int64_t *hint, const double *prio,
                                   size_t prio_stride, size_t *applied)
{
    lock_shared(b);
    exr_status st = set_priority_impl(b, h, count, epi, pos, hint, prio, prio_stride, applied);
    exr_buffer_unlock(b);
    return st;
}

exr_status exr_buffer_priority_stats_locked(const exr_buffer *b, int64_t h, double *total,
                                            double *min_pos, uint64_t *n)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    e->sel->vt->stats(e->sel, b->picks.n, total, min_pos);
    *n = b->picks.n;
    return EXR_OK;
}

exr_status exr_buffer_stored_priority_locked(const exr_buffer *b, int64_t h, size_t count,
                                             const int64_t *epi, const int64_t *pos, double *out)
{
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    for (size_t i = 0; i < count; i++) {
        size_t idx = pick_index_locked(b, epi[i], pos[i]);
        out[i] = idx == SIZE_MAX ? NAN : e->sel->vt->stored(e->sel, idx);
    }
    return EXR_OK;
}
