/*
 * buffer_selectors.c - the buffer's selectors: adding, removing, finding one by handle,
 * listing them, setting a parameter.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buffer_impl.h"

sel_entry *find_sel(const exr_buffer *b, int64_t h)
{
    for (size_t i = 0; i < b->nsels; i++)
        if (b->sels[i].handle == h)
            return &b->sels[i];
    return NULL;
}

exr_status exr_buffer_reserve_selector_locked(exr_buffer *b)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (b->nsels < b->sels_cap)
        return EXR_OK;
    size_t ncap = b->sels_cap ? b->sels_cap * 2 : 4;
    sel_entry *ns = realloc(b->sels, ncap * sizeof *ns);
    if (!ns)
        return EXR_ENOMEM;
    b->sels = ns;
    b->sels_cap = ncap;
    return EXR_OK;
}

exr_status exr_buffer_add_selector_locked(exr_buffer *b, int kind, const double *params,
                                          int64_t *h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    if (kind < 0 || kind >= exr_selector_nkinds)
        return EXR_EINVAL;
    const exr_selector_vtable *vt = exr_selector_kinds[kind];
    for (int k = 0; k < vt->nparams; k++)
        if (!vt->param_ok(k, params[k]))
            return EXR_EINVAL;
    if (b->nsels >= EXR_MAX_SELECTORS)
        return EXR_EINVAL;
    if (b->next_sel_handle >= EXR_MAX_HANDLE)
        return EXR_EOVERFLOW;
    exr_status st = exr_buffer_reserve_selector_locked(b);
    if (st != EXR_OK)
        return st;
    exr_selector *s;
    st = vt->create(&s, params, b->picks.n);
    if (st != EXR_OK)
        return st;
    if (pthread_mutex_init(&s->mu, NULL) != 0) {
        vt->destroy(s);
        return EXR_ENOMEM;
    }
    int64_t handle = b->next_sel_handle++;
    exr_rng_seed(&s->rng, b->cfg.seed, (uint64_t)handle);
    /* Existing picks start at the selector's maximum so far: their recorded
     * priorities are gone once they became picks (docs/semantics.md). */
    for (size_t i = 0; i < b->picks.n; i++)
        vt->add(s, i, NAN);
    if (vt->flush)
        vt->flush(s);
    b->sels[b->nsels++] = (sel_entry){handle, s};
    *h = handle;
    return EXR_OK;
}

exr_status exr_buffer_remove_selector_locked(exr_buffer *b, int64_t h)
{
    EXR_ASSERT_EXCLUSIVE(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    /* a draw or an update without the storage lock, or a record call
     * applying its notes, may still hold mu (buffer_batch.c,
     * buffer_priority.c, buffer.c); none can take it again now. This hold
     * may hold it itself (selector.h, held). */
    if (e->sel->held)
        e->sel->held = false;
    else
        pthread_mutex_lock(&e->sel->mu);
    pthread_mutex_unlock(&e->sel->mu);
    pthread_mutex_destroy(&e->sel->mu);
    e->sel->vt->destroy(e->sel);
    size_t i = (size_t)(e - b->sels);
    memmove(b->sels + i, b->sels + i + 1, (b->nsels - i - 1) * sizeof *b->sels);
    b->nsels--;
    return EXR_OK;
}

exr_selector *exr_buffer_selector_locked(exr_buffer *b, int64_t h)
{
    EXR_ASSERT_LOCKED(b);
    sel_entry *e = find_sel(b, h);
    return e ? e->sel : NULL;
}

size_t exr_buffer_selectors_locked(const exr_buffer *b, int64_t *handles, int *kinds)
{
    EXR_ASSERT_LOCKED(b);
    /* b->sels is in ascending handle order: entries are appended with a
     * new, larger handle (a restored buffer's too: codec_read.c refuses
     * handles out of order) and removal keeps the order of the rest */
    for (size_t i = 0; i < b->nsels; i++) {
        handles[i] = b->sels[i].handle;
        kinds[i] = exr_selector_kind(b->sels[i].sel);
    }
    return b->nsels;
}

exr_status exr_buffer_set_param_locked(exr_buffer *b, int64_t h, int k, double v)
{
    EXR_ASSERT_EXCLUSIVE(b);
    sel_entry *e = find_sel(b, h);
    if (!e)
        return EXR_ENOTFOUND;
    const exr_selector_vtable *vt = e->sel->vt;
    if (k < vt->settable_from || k >= vt->nparams || !vt->param_ok(k, v))
        return EXR_EINVAL;
    exr_sel_lock(e->sel); /* a draw without the storage lock reads beta */
    vt->set_param(e->sel, k, v);
    exr_sel_unlock(e->sel);
    return EXR_OK;
}
