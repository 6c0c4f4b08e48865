/*
 * block.c - the memory behind a batch's arrays: one allocation for all ten,
 * kept for reuse when the batch dies.
 *
 *   get_batch --> Block (one 64-byte-aligned allocation)
 *                  |-- state | action | reward | state_next | seq_len | ... | weight | notes
 *                  each a NumPy array viewing its part, with the Block as its base;
 *                  notes (exr_drawn, batches of at most EXR_DRAWN_MAX picks): what
 *                  the draw knew of its picks' places, which no array views
 *   last array freed --> Block dealloc --> cache (up to 8 blocks, 256 MiB)
 *
 * A training loop draws batches of one size over and over. Fresh memory for
 * each would come from mmap (a batch is larger than glibc's mmap threshold)
 * and be page-faulted in again every time, which costs more than filling it;
 * a recycled block is already mapped and warm. A block of 4 MiB or more is
 * advised for huge pages (src/core/mem.c). The cache lives in the module
 * state and is used with the GIL held.
 */
#include "binding.h"
#include "mem.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    PyObject_HEAD
    void *mem;
    size_t size;
    /* a get_batch batch's pick_epi, pick_pos and pick_index in mem, and
     * their length (exr_block_mark_picks); NULL otherwise */
    const int64_t *epi, *pos, *index;
    npy_intp picks;
    /* in mem: what the last draw into this block noted of its picks
     * (exr_drawn, room for drawn_cap), NULL if none; filling: a get_batch
     * is writing it (exr_block_claim_drawn), with the GIL let go; reading:
     * how many set_priority calls are reading it so (exr_block_drawn_take).
     * Either keeps the other off: a get_batch that finds it being read
     * leaves the notes as they were, still true of the draw that wrote
     * them (the core compares each pick with them) */
    exr_drawn *drawn;
    npy_intp drawn_cap;
    int filling, reading;
} BlockObject;

static size_t round_line(size_t n) { return (n + 63) & ~(size_t)63; }

static void block_dealloc(BlockObject *b)
{
    PyTypeObject *tp = Py_TYPE(b);
    exr_modstate *st = exr_state_of_type(tp);
    if (b->mem) {
        if (st && b->size <= EXR_BLOCK_CACHE_BYTES) {
            /* make room, oldest first, then keep it */
            while (st->ncached == EXR_BLOCK_CACHE_N ||
                   st->cached_bytes + b->size > EXR_BLOCK_CACHE_BYTES) {
                free(st->cached[0].mem);
                st->cached_bytes -= st->cached[0].size;
                memmove(st->cached, st->cached + 1, (size_t)(--st->ncached) * sizeof st->cached[0]);
            }
            st->cached[st->ncached].mem = b->mem;
            st->cached[st->ncached].size = b->size;
            st->ncached++;
            st->cached_bytes += b->size;
        } else {
            free(b->mem);
        }
    }
    tp->tp_free(b);
    Py_DECREF(tp);
}

PyObject *exr_block_new(exr_modstate *st, size_t size)
{
    size = round_line(size ? size : 64);
    BlockObject *b = PyObject_New(BlockObject, st->block_type);
    if (!b)
        return NULL;
    b->epi = b->pos = b->index = NULL;
    b->drawn = NULL;
    b->drawn_cap = 0;
    b->filling = b->reading = 0;
    b->picks = 0;
    /* the smallest cached block that fits without wasting more than half */
    int best = -1;
    for (int i = 0; i < st->ncached; i++)
        if (st->cached[i].size >= size && st->cached[i].size / 2 <= size &&
            (best < 0 || st->cached[i].size < st->cached[best].size))
            best = i;
    if (best >= 0) {
        b->mem = st->cached[best].mem;
        b->size = st->cached[best].size;
        st->cached_bytes -= b->size;
        memmove(st->cached + best, st->cached + best + 1,
                (size_t)(st->ncached - best - 1) * sizeof st->cached[0]);
        st->ncached--;
    } else {
        b->mem = exr_big_alloc(size);
        b->size = size;
        if (!b->mem) {
            b->size = 0;
            Py_DECREF(b);
            return PyErr_Format(PyExc_MemoryError, "get_batch: out of memory (a batch of %zu bytes)",
                                size);
        }
    }
    return (PyObject *)b;
}

void *exr_block_data(PyObject *block) { return ((BlockObject *)block)->mem; }

void exr_block_mark_picks(PyObject *block, const void *epi, const void *pos, const void *index,
                          npy_intp n)
{
    BlockObject *b = (BlockObject *)block;
    b->epi = epi;
    b->pos = pos;
    b->index = index;
    b->picks = n;
}

size_t exr_block_drawn_bytes(npy_intp n)
{
    if (n > EXR_DRAWN_MAX)
        return 0;
    return round_line(sizeof(exr_drawn) + 4 * (size_t)n * sizeof(int64_t));
}

void exr_block_set_drawn(PyObject *block, size_t at, npy_intp cap)
{
    BlockObject *b = (BlockObject *)block;
    b->drawn = (exr_drawn *)((char *)b->mem + at);
    b->drawn->serial = 0; /* nothing noted yet (the memory may be recycled) */
    b->drawn->count = 0;
    b->drawn_cap = cap;
}

/* The block of a (its base), if a is an array of one. */
static BlockObject *block_of(exr_modstate *st, PyObject *a)
{
    if (!a || !PyArray_Check(a))
        return NULL;
    PyObject *base = PyArray_BASE((PyArrayObject *)a);
    return base && Py_IS_TYPE(base, st->block_type) ? (BlockObject *)base : NULL;
}

PyObject *exr_block_claim_drawn(exr_modstate *st, PyObject *epi, npy_intp n, exr_drawn **d)
{
    BlockObject *b = block_of(st, epi);
    *d = NULL;
    if (!b || !b->drawn || b->drawn_cap < n || b->filling || b->reading)
        return NULL;
    b->filling = 1;
    *d = b->drawn;
    return Py_NewRef((PyObject *)b); /* held while the core writes it, without the GIL */
}

void exr_block_release_drawn(PyObject *block)
{
    if (block) {
        ((BlockObject *)block)->filling = 0;
        Py_DECREF(block);
    }
}

const exr_drawn *exr_block_drawn_take(exr_modstate *st, PyArrayObject *epi, npy_intp n,
                                     PyObject **block)
{
    BlockObject *b = block_of(st, (PyObject *)epi);
    *block = NULL;
    if (!b || !b->drawn || b->filling || !b->drawn->serial || b->drawn->count != (uint64_t)n)
        return NULL;
    b->reading++;
    *block = Py_NewRef((PyObject *)b); /* held while the core reads it, without the GIL */
    exr_drawn_given++;
    return b->drawn;
}

void exr_block_drawn_release(PyObject *block)
{
    if (block) {
        ((BlockObject *)block)->reading--;
        Py_DECREF(block);
    }
}

const int64_t *exr_block_pick_hints(exr_modstate *st, PyArrayObject *epi, PyArrayObject *pos,
                                    npy_intp n)
{
    const BlockObject *b = block_of(st, (PyObject *)epi);
    if (!b || PyArray_BASE(pos) != (PyObject *)b)
        return NULL;
    if (!b->index || b->picks != n || b->epi != PyArray_DATA(epi) || b->pos != PyArray_DATA(pos))
        return NULL;
    exr_block_hints++;
    return b->index;
}

PyObject *exr_block_array(PyObject *block, size_t at, PyArray_Descr *d, int nd, const npy_intp *dims)
{
    Py_INCREF(d); /* NewFromDescr steals it, even when it fails */
    PyObject *a = PyArray_NewFromDescr(&PyArray_Type, d, nd, (npy_intp *)dims, NULL,
                                       (char *)exr_block_data(block) + at, NPY_ARRAY_CARRAY, NULL);
    if (!a)
        return NULL;
    Py_INCREF(block); /* SetBaseObject steals it, even when it fails */
    if (PyArray_SetBaseObject((PyArrayObject *)a, block) < 0) {
        Py_DECREF(a);
        return NULL;
    }
    return a;
}

void exr_block_cache_clear(exr_modstate *st)
{
    for (int i = 0; i < st->ncached; i++)
        free(st->cached[i].mem);
    st->ncached = 0;
    st->cached_bytes = 0;
}

static PyType_Slot block_slots[] = {
    {Py_tp_dealloc, block_dealloc},
    {Py_tp_doc, "Memory shared by the arrays of one batch (their .base)."},
    {0, NULL},
};

static PyType_Spec block_spec = {
    .name = "exreplay._core._BatchMemory",
    .basicsize = sizeof(BlockObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = block_slots,
};

int exr_block_init_type(PyObject *m, exr_modstate *st)
{
    st->block_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &block_spec, NULL);
    return st->block_type ? 0 : -1;
}
