/*
 * arrays.c - where the binding makes NumPy arrays: a batch's arrays carved from
 * one block (block.c) or checked when the caller passes out=, the Batch that
 * holds them, and the arrays of episode() and the test hooks.
 */
#include "binding.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "args.h"
#include "replay_impl.h"
#include "named.h"

static const char *const field_names[NFIELDS] = {"state", "action", "reward", "state_next",
                                                 "seq_len", "seq_len_next", "pick_epi",
                                                 "pick_pos", "weight", "pick_index", "extras",
                                                 "state_seq"};

/* Batch fields that are dicts of arrays (named.c) rather than one array:
 * state, state_next and state_seq with a state_spec, extras always. */
static int dict_field(const ReplayObject *self, int f)
{
    return f == F_EXTRAS || (self->sfields && (f == F_STATE || f == F_NEXT || f == F_SEQ));
}

/* Whether field f is an array of its own, carved from the batch's block:
 * not a dict, and with shared next states (shared) state_seq rather than
 * state and state_next (its views). */
static int plain_field(const ReplayObject *self, int f, bool shared)
{
    if (dict_field(self, f))
        return 0;
    if (f == F_SEQ)
        return shared;
    return !(shared && (f == F_STATE || f == F_NEXT));
}

/* The dict fields of a new batch (the arrays of the named fields carved
 * from their own block): with shared next states, the state fields'
 * (B, L + 1) arrays in arrays[F_SEQ] (their views made after). */
static int new_dict_fields(ReplayObject *self, npy_intp B, bool shared, PyObject **arrays)
{
    npy_intp L = exr_buffer_config(self->buf)->pick_len;
    if (self->sfields &&
        (shared ? exr_fieldset_batch_new(self->sfields, mstate(self), B, L + 1, &arrays[F_SEQ],
                                         NULL)
                : exr_fieldset_batch_new(self->sfields, mstate(self), B, L, &arrays[F_STATE],
                                         &arrays[F_NEXT])) < 0)
        return -1;
    if (self->xfields)
        return exr_fieldset_batch_new(self->xfields, mstate(self), B, L, &arrays[F_EXTRAS], NULL);
    arrays[F_EXTRAS] = PyDict_New();
    return arrays[F_EXTRAS] ? 0 : -1;
}

/* Expected dtype and shape of batch field f for B picks. */
static PyArray_Descr *field_spec(ReplayObject *self, int f, npy_intp B, int *nd, npy_intp *dims)
{
    npy_intp L = exr_buffer_config(self->buf)->pick_len;
    dims[0] = B;
    *nd = 1;
    switch (f) {
    case F_STATE:
    case F_NEXT:
    case F_SEQ:
        dims[1] = f == F_SEQ ? L + 1 : L;
        memcpy(dims + 2, self->state_shape, sizeof(npy_intp) * (size_t)self->state_nd);
        *nd = 2 + self->state_nd;
        Py_INCREF(self->state_descr);
        return self->state_descr;
    case F_ACTION:
        dims[1] = L;
        memcpy(dims + 2, self->action_shape, sizeof(npy_intp) * (size_t)self->action_nd);
        *nd = 2 + self->action_nd;
        Py_INCREF(self->action_descr);
        return self->action_descr;
    case F_REWARD:
        dims[1] = L;
        *nd = 2;
        Py_INCREF(self->reward_descr);
        return self->reward_descr;
    case F_WEIGHT:
        return PyArray_DescrFromType(NPY_FLOAT32);
    default:
        return PyArray_DescrFromType(NPY_INT64);
    }
}

/* The arrays of a new batch of B picks, carved from one block (block.c). */
/* Each plain field's descr, dims and offset in one block of *total bytes
 * (64-byte aligned). -1 with an exception (MemoryError naming batch_size
 * when the batch cannot fit); descrs[] are then released. */
static int batch_layout(ReplayObject *self, npy_intp B, bool shared, int *nds,
                        npy_intp (*dims)[NPY_MAXDIMS], PyArray_Descr **descrs, size_t *offs,
                        size_t *total)
{
    *total = 0;
    for (int f = 0; f < NFIELDS; f++) {
        offs[f] = *total;
        if (!plain_field(self, f, shared))
            continue;
        descrs[f] = field_spec(self, f, B, &nds[f], dims[f]);
        if (!descrs[f])
            goto fail;
        size_t bytes = (size_t)PyDataType_ELSIZE(descrs[f]);
        for (int i = 0; i < nds[f]; i++)
            if (!exr_mul_size(bytes, (size_t)dims[f][i], &bytes))
                goto too_big;
        if (!exr_add_size(*total, bytes + 63, total) || *total > (size_t)PY_SSIZE_T_MAX)
            goto too_big;
        *total &= ~(size_t)63;
    }
    return 0;
too_big:
    PyErr_Format(PyExc_MemoryError, "batch_size: a batch of %zd picks would not fit in memory",
                 (Py_ssize_t)B);
fail:
    for (int f = 0; f < NFIELDS; f++)
        Py_CLEAR(descrs[f]);
    return -1;
}

static int new_batch_arrays(ReplayObject *self, npy_intp B, bool shared, PyObject **arrays)
{
    int nds[NFIELDS];
    npy_intp dims[NFIELDS][NPY_MAXDIMS];
    PyArray_Descr *descrs[NFIELDS] = {0};
    size_t offs[NFIELDS], total;
    PyObject *block = NULL;
    if (batch_layout(self, B, shared, nds, dims, descrs, offs, &total) < 0)
        return -1;
    size_t drawn_at = total, drawn_bytes = exr_block_drawn_bytes(B);
    total += drawn_bytes; /* no overflow: batch_layout kept total <= PY_SSIZE_T_MAX */
    block = exr_block_new(mstate(self), total);
    if (!block)
        goto fail;
    for (int f = 0; f < NFIELDS; f++) {
        if (!plain_field(self, f, shared))
            continue;
        arrays[f] = exr_block_array(block, offs[f], descrs[f], nds[f], dims[f]);
        Py_CLEAR(descrs[f]);
        if (!arrays[f])
            goto fail;
    }
    char *mem = exr_block_data(block);
    exr_block_mark_picks(block, mem + offs[F_EPI], mem + offs[F_POS], mem + offs[F_INDEX], B);
    if (drawn_bytes)
        exr_block_set_drawn(block, drawn_at, B);
    Py_DECREF(block);
    if (!shared)
        arrays[F_SEQ] = Py_NewRef(Py_None);
    if (new_dict_fields(self, B, shared, arrays) < 0 ||
        (shared && exr_seq_views(self, arrays) < 0)) {
        for (int f = 0; f < NFIELDS; f++)
            Py_CLEAR(arrays[f]);
        return -1;
    }
    return 0;
fail:
    for (int f = 0; f < NFIELDS; f++) {
        Py_CLEAR(arrays[f]);
        Py_XDECREF(descrs[f]);
    }
    Py_XDECREF(block);
    return -1;
}

int exr_out_array_ok(PyObject *a, PyArray_Descr *d, int nd, const npy_intp *dims)
{
    const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    if (!PyArray_Check(a))
        return 0;
    PyArrayObject *x = (PyArrayObject *)a;
    /* an out= from get_batch holds the very descrs field_spec gives: the
     * pointer test spares EquivTypes' cast lookup on every call */
    if ((PyArray_DESCR(x) != d && !PyArray_EquivTypes(PyArray_DESCR(x), d)) ||
        PyArray_NDIM(x) != nd || (PyArray_FLAGS(x) & need) != need)
        return 0;
    for (int i = 0; i < nd; i++)
        if (PyArray_DIM(x, i) != dims[i])
            return 0;
    return 1;
}

int exr_out_array_refused(PyObject *label, PyArray_Descr *d, int nd, const npy_intp *dims,
                          PyObject *a)
{
    char want[256];
    exr_shape_str(want, sizeof want, nd, dims);
    PyObject *got = label ? exr_describe_value(a) : NULL;
    if (got)
        PyErr_Format(PyExc_ValueError,
                     "out: expected %U to be a writeable C-contiguous %S array of shape %s, "
                     "got %U",
                     label, (PyObject *)d, want, got);
    Py_XDECREF(got);
    Py_XDECREF(label);
    return -1;
}

/* Whether out.f is what get_batch itself makes for field f of B picks:
 * an ndarray of that very descr (by pointer), its shape, writeable,
 * C-contiguous and aligned. Enough for exr_out_array_ok, without building the
 * expected descr and shape. */
/* (always inlined: a call costs ~25 instructions a field, and it is made for
 * every array of every out= and spare set) */
static inline __attribute__((always_inline)) int
out_field_as_made(ReplayObject *self, exr_modstate *st, PyObject *a, int f, npy_intp B, npy_intp L)
{
    const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_WRITEABLE;
    PyArray_Descr *d = f == F_WEIGHT ? st->f32_descr : st->i64_descr;
    const npy_intp *tail = NULL;
    int nd = 1;
    if (f == F_STATE || f == F_NEXT || f == F_SEQ)
        d = self->state_descr, tail = self->state_shape, nd = 2 + self->state_nd;
    else if (f == F_ACTION)
        d = self->action_descr, tail = self->action_shape, nd = 2 + self->action_nd;
    else if (f == F_REWARD)
        d = self->reward_descr, nd = 2;
    if (!a || !PyArray_Check(a))
        return 0;
    PyArrayObject *x = (PyArrayObject *)a;
    if (PyArray_DESCR(x) != d || PyArray_NDIM(x) != nd || (PyArray_FLAGS(x) & need) != need)
        return 0;
    const npy_intp *dims = PyArray_DIMS(x);
    if (dims[0] != B || (nd > 1 && dims[1] != L))
        return 0;
    for (int i = 2; i < nd; i++)
        if (dims[i] != tail[i - 2])
            return 0;
    return 1;
}

/* Bytes of a row of plain field f (as get_batch makes it: B rows) in a
 * buffer without named fields. */
static inline size_t field_row_bytes(const exr_config *c, int f)
{
    switch (f) {
    case F_STATE:
    case F_NEXT:
        return c->state_bytes * c->pick_len;
    case F_SEQ:
        return c->state_bytes * (c->pick_len + 1);
    case F_ACTION:
        return c->action_bytes * c->pick_len;
    case F_REWARD:
        return c->reward_bytes * c->pick_len;
    case F_WEIGHT:
        return 4;
    default:
        return 8;
    }
}

/* out's arrays (new references) when every one is as get_batch makes them
 * (out_field_as_made), each ending before the next field's begins (as
 * get_batch lays them out in their block: in field order, so they share no
 * memory), and the buffer has no named fields: one pass of comparisons.
 * With shared next states (shared) the arrays checked so are state_seq's in
 * place of state's and state_next's, which must be its views as get_batch
 * makes them (seq.c). 0 otherwise: batch_arrays then checks field by field,
 * with its errors, and whether any two arrays overlap (out_disjoint). */
static int out_as_made(ReplayObject *self, exr_modstate *st, PyObject *out, npy_intp B,
                       bool shared, PyObject **arrays)
{
    if (self->sfields || self->xfields)
        return 0;
    const exr_config *c = exr_buffer_config(self->buf);
    npy_intp L = c->pick_len;
    uintptr_t end = 0;
    for (int f = 0; f < NFIELDS; f++) {
        if (!plain_field(self, f, shared))
            continue;
        PyObject *a = PyStructSequence_GET_ITEM(out, f);
        if (!out_field_as_made(self, st, a, f, B, f == F_SEQ ? L + 1 : L))
            return 0;
        uintptr_t at = (uintptr_t)PyArray_DATA((PyArrayObject *)a);
        if (at < end)
            return 0;
        end = at + (size_t)B * field_row_bytes(c, f);
    }
    PyObject *seq = PyStructSequence_GET_ITEM(out, F_SEQ);
    if (shared ? !exr_seq_views_ok(PyStructSequence_GET_ITEM(out, F_STATE),
                                   PyStructSequence_GET_ITEM(out, F_NEXT), seq, L)
               : seq != Py_None)
        return 0;
    PyObject *x = PyStructSequence_GET_ITEM(out, F_EXTRAS); /* {} as made: else checked */
    if (x && x != Py_None && (!PyDict_CheckExact(x) || PyDict_GET_SIZE(x)))
        return 0;
    for (int f = 0; f < NFIELDS; f++) {
        PyObject *a = PyStructSequence_GET_ITEM(out, f);
        arrays[f] = Py_NewRef(a ? a : Py_None);
    }
    return 1;
}

/* ---- spare arrays ----
 * Without out=, get_batch makes 9 arrays and a Batch: about 5,500
 * instructions, half of a get_batch(32)'s own. So the arrays of the last
 * two small batches made are kept (a strong reference each). When a later
 * call finds every array of one set held by nothing else (reference count
 * 1: the batch, its arrays, and every view, tensor or buffer export of them
 * are gone) and still as get_batch made them (out_field_as_made, read from
 * the arrays at every call), it refills them and returns them in a new
 * Batch, with a new extras dict. Two sets, because in
 * `batch = rb.get_batch(...)` the previous batch is still bound while the
 * next one is drawn. Nothing can tell the difference from fresh arrays but
 * their id() and an array's weakref, which lives until the set is replaced
 * (a set with a weakref is never refilled). A set of shared next states
 * holds state and state_next, the views of state_seq, which is held by
 * those two alone (reference count 2) when the set is free. */
#define SPARE_MAX_BYTES ((size_t)1 << 20)

_Static_assert(EXR_SPARE_ARRAYS == F_EXTRAS && F_EXTRAS == NFIELDS - 2 && F_SEQ == NFIELDS - 1,
               "the spare arrays are every field before extras and state_seq, the last two");

/* An array of a spare set held by nothing else (held refs: the set's or
 * the views') and still a view of `base`, with no weakref. */
static inline int spare_alone(PyObject *a, PyObject *base, Py_ssize_t held)
{
    return Py_REFCNT(a) == held && !((PyArrayObject_fields *)a)->weakreflist &&
           PyArray_BASE((PyArrayObject *)a) == base;
}

/* Whether spare set s is free for B picks in the layout asked (shared:
 * shared next states); its state_seq in *seq (shared only). */
static int spare_free(ReplayObject *self, exr_modstate *st, PyObject *const *s, npy_intp B,
                      npy_intp L, bool shared, PyObject **seq)
{
    if (!s[0])
        return 0;
    /* every array still a view of the set's block: __setstate__ (or, in older
     * NumPy, setting .data) retargets an array at another object */
    PyObject *block = PyArray_BASE((PyArrayObject *)s[F_ACTION]);
    if (!block || !Py_IS_TYPE(block, st->block_type))
        return 0;
    /* the set's arrays in the block (with shared next states all but the
     * views; state_seq is held by them, not by the set) */
    for (int f = 0; f < EXR_SPARE_ARRAYS; f++)
        if (!(shared && (f == F_STATE || f == F_NEXT)) &&
            (!spare_alone(s[f], block, 1) || !out_field_as_made(self, st, s[f], f, B, L)))
            return 0;
    if (!shared)
        return 1;
    *seq = PyArray_BASE((PyArrayObject *)s[F_STATE]);
    return *seq && PyArray_Check(*seq) && spare_alone(*seq, block, 2) &&
           out_field_as_made(self, st, *seq, F_SEQ, B, L + 1) && spare_alone(s[F_STATE], *seq, 1) &&
           spare_alone(s[F_NEXT], *seq, 1) && exr_seq_views_ok(s[F_STATE], s[F_NEXT], *seq, L);
}

/* A free spare set for B picks in arrays[] (new references) with a new
 * extras dict: 1. 0 if there is none, -1 with an exception. */
static int spare_take(ReplayObject *self, exr_modstate *st, npy_intp B, bool shared,
                      PyObject **arrays)
{
    if (self->sfields || self->xfields)
        return 0;
    npy_intp L = exr_buffer_config(self->buf)->pick_len;
    for (int j = 0; j < 2; j++) {
        PyObject *const *s = self->spare[j], *seq = NULL;
        if (!spare_free(self, st, s, B, L, shared, &seq))
            continue;
        /* taken before PyDict_New: a collection it runs can call a
         * finalizer whose get_batch would find this set free too */
        for (int f = 0; f < EXR_SPARE_ARRAYS; f++)
            arrays[f] = Py_NewRef(s[f]);
        arrays[F_SEQ] = Py_NewRef(shared ? seq : Py_None);
        if (!(arrays[F_EXTRAS] = PyDict_New())) {
            for (int f = 0; f < NFIELDS; f++)
                Py_CLEAR(arrays[f]);
            return -1;
        }
        return 1;
    }
    return 0;
}

/* The arrays of a new batch kept as a spare set, in place of the older
 * set, when the batch is small (a large one's copy dwarfs making arrays). */
static void spare_keep(ReplayObject *self, PyObject *const *arrays)
{
    if (self->sfields || self->xfields)
        return;
    bool shared = arrays[F_SEQ] != Py_None;
    size_t bytes = 0;
    for (int f = 0; f < NFIELDS; f++)
        if (plain_field(self, f, shared))
            bytes += (size_t)PyArray_NBYTES((PyArrayObject *)arrays[f]);
    if (bytes > SPARE_MAX_BYTES)
        return;
    PyObject **s = self->spare[self->spare_next];
    self->spare_next ^= 1;
    for (int f = 0; f < EXR_SPARE_ARRAYS; f++)
        Py_XSETREF(s[f], Py_NewRef(arrays[f]));
}

void exr_spare_clear(ReplayObject *self)
{
    for (int j = 0; j < 2; j++)
        for (int f = 0; f < EXR_SPARE_ARRAYS; f++)
            Py_CLEAR(self->spare[j][f]);
}

/* The arrays of a batch without out=: a free spare set, or new ones. */
static int fresh_arrays(ReplayObject *self, exr_modstate *st, npy_intp B, bool shared,
                        PyObject **arrays)
{
    int r = spare_take(self, st, B, shared, arrays);
    if (r)
        return r < 0 ? -1 : 0;
    if (new_batch_arrays(self, B, shared, arrays) < 0)
        return -1;
    spare_keep(self, arrays);
    return 0;
}

/* ---- out= arrays that share memory ----
 * get_batch writes every array of out= without reading any: two that
 * overlap (one array given as two fields, views of one memory) would have
 * one field written over another, so they are refused. Every array is
 * C-contiguous (checked before), so its memory is [data, data + nbytes). */
typedef struct {
    uintptr_t lo, hi;
    int f;         /* the field */
    PyObject *key; /* the named field's name (borrowed), or NULL */
} out_span;

static int span_order(const void *a, const void *b)
{
    const out_span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static void add_span(out_span *s, int *n, PyObject *a, int f, PyObject *key)
{
    uintptr_t lo = (uintptr_t)PyArray_DATA((PyArrayObject *)a);
    size_t bytes = (size_t)PyArray_NBYTES((PyArrayObject *)a);
    if (bytes)
        s[(*n)++] = (out_span){lo, lo + bytes, f, key};
}

/* The arrays of field f (a dict of named fields' arrays, or one array). */
static void add_field_spans(ReplayObject *self, PyObject **arrays, int f, out_span *s, int *n)
{
    const exr_fieldset *fs = f == F_EXTRAS                                ? self->xfields
                             : f == F_STATE || f == F_NEXT || f == F_SEQ ? self->sfields
                                                                         : NULL;
    if (f == F_EXTRAS && !fs)
        return; /* no extras: nothing is written there */
    if (!fs) {
        add_span(s, n, arrays[f], f, NULL);
        return;
    }
    for (int i = 0; i < fs->n; i++)
        add_span(s, n, PyDict_GetItem(arrays[f], fs->f[i].name), f, fs->f[i].name);
}

static PyObject *span_name(const out_span *s)
{
    if (s->key)
        return PyUnicode_FromFormat("out.%s[%R]", field_names[s->f], s->key);
    return PyUnicode_FromFormat("out.%s", field_names[s->f]);
}

/* 0 when no two arrays of out= (checked, in arrays[]) share memory, else
 * -1 with a ValueError naming two that do. With shared next states the
 * arrays written are state_seq's (state and state_next are its views). */
static int out_disjoint(ReplayObject *self, PyObject **arrays)
{
    out_span s[NFIELDS + 3 * EXR_MAX_FIELDS];
    int n = 0;
    bool shared = arrays[F_SEQ] != Py_None;
    for (int f = 0; f < NFIELDS; f++)
        if (f == F_SEQ ? shared : !(shared && (f == F_STATE || f == F_NEXT)))
            add_field_spans(self, arrays, f, s, &n);
    qsort(s, (size_t)n, sizeof *s, span_order);
    int far = 0; /* of the spans so far, the one reaching furthest */
    for (int i = 1; i < n; i++) {
        if (s[i].lo < s[far].hi) {
            const out_span *x = &s[far], *y = &s[i];
            if (y->f < x->f) /* named in field order */
                x = &s[i], y = &s[far];
            PyObject *a = span_name(x), *b = a ? span_name(y) : NULL;
            if (b)
                PyErr_Format(PyExc_ValueError,
                             "out: expected arrays that share no memory, got %U and %U sharing "
                             "memory",
                             a, b);
            Py_XDECREF(a);
            Py_XDECREF(b);
            return -1;
        }
        if (s[i].hi > s[far].hi)
            far = i;
    }
    return 0;
}

/* arrays[f] borrowed from `out` after checking them, or new arrays. */
/* Field f of out= (a dict field), checked into arrays[f]. */
static int out_dict_field(ReplayObject *self, PyObject *out, int f, npy_intp B, PyObject **arrays)
{
    npy_intp L = exr_buffer_config(self->buf)->pick_len;
    PyObject *d = PyStructSequence_GetItem(out, f);
    const exr_fieldset *fs = f == F_EXTRAS ? self->xfields : self->sfields;
    /* a dict of its own holds the field arrays checked for the call, whose
     * copy writes into them without the GIL, whatever another thread (or a
     * key's __eq__) puts into out's dict */
    if (fs)
        return exr_fieldset_batch_check(fs, d ? d : Py_None, B, f == F_SEQ ? L + 1 : L,
                                        f == F_STATE  ? "out.state"
                                        : f == F_NEXT ? "out.state_next"
                                        : f == F_SEQ  ? "out.state_seq"
                                                      : "out.extras",
                                        &arrays[f]);
    /* extras of a buffer without any: not written; empty as get_batch made them, or None
     * in a Batch built without them */
    if (!d || d == Py_None) {
        arrays[f] = Py_NewRef(Py_None);
        return 0;
    }
    if (!PyDict_Check(d)) {
        PyErr_Format(PyExc_TypeError,
                     "out.extras: expected an empty dict or None (this buffer has no "
                     "extras_spec), got %s",
                     Py_TYPE(d)->tp_name);
        return -1;
    }
    if (PyDict_GET_SIZE(d)) {
        PyObject *keys = PyDict_Keys(d);
        if (keys)
            PyErr_Format(PyExc_ValueError,
                         "out.extras: expected an empty dict or None (this buffer has no "
                         "extras_spec), got a dict with keys %R",
                         keys);
        Py_XDECREF(keys);
        return -1;
    }
    arrays[f] = Py_NewRef(d);
    return 0;
}

/* Field f of out= (one array), checked into arrays[f]. */
static int out_plain_field(ReplayObject *self, PyObject *out, int f, npy_intp B, PyObject **arrays)
{
    int nd;
    npy_intp dims[NPY_MAXDIMS];
    PyArray_Descr *d = field_spec(self, f, B, &nd, dims);
    if (!d)
        return -1;
    PyObject *a = PyStructSequence_GetItem(out, f);
    if (!exr_out_array_ok(a, d, nd, dims)) {
        exr_out_array_refused(PyUnicode_FromFormat("out.%s", field_names[f]), d, nd, dims, a);
        Py_DECREF(d);
        return -1;
    }
    Py_DECREF(d);
    arrays[f] = Py_NewRef(a);
    return 0;
}

int batch_arrays(ReplayObject *self, npy_intp B, PyObject *out, bool shared, PyObject **arrays)
{
    exr_modstate *st = mstate(self);
    if (out && !Py_IS_TYPE(out, st->batch_type)) {
        PyErr_Format(PyExc_TypeError, "out: expected a Batch from get_batch, got %s",
                     Py_TYPE(out)->tp_name);
        return -1;
    }
    if (!out)
        return fresh_arrays(self, st, B, shared, arrays);
    if (out_as_made(self, st, out, B, shared, arrays))
        return 0;
    if (!shared && PyStructSequence_GetItem(out, F_SEQ) != Py_None) {
        PyErr_SetString(PyExc_ValueError,
                        "out: expected a batch of get_batch(..., shared_next=False), got one with "
                        "state_seq set (shared_next=True): pass shared_next=True to refill it");
        return -1;
    }
    for (int f = 0; f < NFIELDS; f++) {
        if (f == F_SEQ && !shared)
            arrays[f] = Py_NewRef(Py_None); /* not written, whatever out holds */
        else if (shared && (f == F_STATE || f == F_NEXT))
            continue; /* state_seq's views: checked after it */
        else if ((dict_field(self, f) ? out_dict_field(self, out, f, B, arrays)
                                      : out_plain_field(self, out, f, B, arrays)) < 0)
            goto error;
    }
    if ((shared && exr_seq_out_check(self, out, arrays) < 0) || out_disjoint(self, arrays) < 0)
        goto error;
    return 0;
error:
    for (int f = 0; f < NFIELDS; f++)
        Py_CLEAR(arrays[f]);
    return -1;
}

void batch_out_of(ReplayObject *self, PyObject **arrays, exr_batch_out *o, exr_field_dst *plan)
{
#define DATA(f) PyArray_DATA((PyArrayObject *)arrays[f])
    /* with shared next states every state goes to state_seq's memory */
    bool shared = arrays[F_SEQ] != Py_None;
    o->shared_next = shared;
    o->fields = NULL;
    o->nfields = 0;
    o->state = o->state_next = NULL; /* named state fields: unused */
    if (!self->sfields) {
        o->state = DATA(shared ? F_SEQ : F_STATE);
        o->state_next = shared ? NULL : DATA(F_NEXT);
    }
    if (self->sfields || self->xfields) {
        /* every field straight into its own array (named.c) */
        const exr_config *c = exr_buffer_config(self->buf);
        size_t n = 0;
        if (self->sfields) {
            exr_fieldset_dst_plan(self->sfields, 0, arrays[shared ? F_SEQ : F_STATE],
                                  shared ? NULL : arrays[F_NEXT], shared, plan);
            n = (size_t)self->sfields->n;
        } else {
            plan[0] = (exr_field_dst){0, c->state_bytes, o->state, o->state_next, shared};
            n = 1;
        }
        if (self->xfields) {
            exr_fieldset_dst_plan(self->xfields, c->state_bytes + c->action_bytes + c->reward_bytes,
                                  arrays[F_EXTRAS], NULL, false, plan + n);
            n += (size_t)self->xfields->n;
        }
        o->fields = plan;
        o->nfields = n;
    }
    o->action = DATA(F_ACTION);
    o->reward = DATA(F_REWARD);
    o->seq_len = DATA(F_LEN);
    o->seq_len_next = DATA(F_LEN_NEXT);
    o->pick_epi = DATA(F_EPI);
    o->pick_pos = DATA(F_POS);
    o->weight = DATA(F_WEIGHT);
    o->pick_index = DATA(F_INDEX);
    o->drawn = NULL; /* exr_block_claim_drawn */
#undef DATA
}

/* The Batch holding arrays (stolen), or out refilled. */
PyObject *batch_result(ReplayObject *self, PyObject **arrays, PyObject *out)
{
    if (out) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return Py_NewRef(out);
    }
    PyObject *b = PyStructSequence_New(mstate(self)->batch_type);
    if (!b) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return NULL;
    }
    for (int f = 0; f < NFIELDS; f++)
        PyStructSequence_SET_ITEM(b, f, arrays[f]);
    return b;
}

PyObject *new_array(PyArray_Descr *d, npy_intp lead, int nd, const npy_intp *shape)
{
    npy_intp dims[NPY_MAXDIMS];
    int k = 0;
    if (lead >= 0)
        dims[k++] = lead;
    for (int i = 0; i < nd; i++)
        dims[k++] = shape[i];
    Py_INCREF(d);
    return PyArray_NewFromDescr(&PyArray_Type, d, k, dims, NULL, NULL, 0, NULL);
}
