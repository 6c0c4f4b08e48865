/*
 * replay_batch.c - get_batch, gather and set_priority: the selector and batch
 * arguments converted, the core called with the GIL released, the batch or
 * the error returned.
 */
#include "binding.h"

#include <math.h>

#include "args.h"
#include "replay_impl.h"
#include "named.h"

static PyObject *batch_error(ReplayObject *self, exr_status st, int64_t h, PyObject **arrays)
{
    for (int f = 0; f < NFIELDS; f++)
        Py_XDECREF(arrays[f]);
    if (st == EXR_ENOTFOUND)
        return unknown_selector(h);
    if (st == EXR_EEMPTY)
        return exr_empty_batch_error(self, h);
    return exr_raise_status(st, &(exr_errctx){.op = "get_batch", .arg = "batch_size",
                                              .got = "the batch's scratch", .handle = -1});
}

/* Whether h names a selector of the buffer now (takes the storage lock). */
static int selector_known(ReplayObject *self, int64_t h)
{
    exr_lock_with_gil(self->buf);
    int known = exr_buffer_selector_locked(self->buf, h) != NULL;
    exr_buffer_unlock(self->buf);
    return known;
}

/* An argument after ps was refused (the error is set): when ps names no
 * selector of the buffer, that is the error raised instead, as the
 * arguments are checked in order. Looked up on this error path only, so
 * that a call that goes through pays nothing for it. */
static PyObject *after_ps_refused(ReplayObject *self, int64_t h)
{
    if (selector_known(self, h))
        return NULL;
    PyErr_Clear();
    return unknown_selector(h);
}

static int batch_size_arg(PyObject *o, npy_intp *B)
{
    int64_t v;
    if (exr_int_arg(o, "batch_size", "an int in [1, 2**63 - 1]", 1, PY_SSIZE_T_MAX, &v) < 0)
        return -1;
    *B = (npy_intp)v;
    return 0;
}

/* The core's get_batch: a small batch that needs no waiting with the GIL
 * held (releasing and taking back the GIL costs more than its copy, and
 * in a program whose other threads want the GIL, taking it back can wait
 * for one of them), any other with the GIL released. */
static exr_status draw_and_copy(ReplayObject *self, int64_t h, size_t B, exr_batch_out *o)
{
    bool done = false;
    exr_status st = EXR_OK;
    if (!exr_nogil_calls)
        st = exr_buffer_get_batch_nowait(self->buf, h, B, o, &done);
    if (done) {
        exr_gil_kept++;
        return st;
    }
    EXR_NOGIL_BEGIN
    st = exr_buffer_get_batch(self->buf, h, B, o);
    EXR_NOGIL_END
    return st;
}

PyObject *replay_get_batch(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"batch_size", "ps", "out", "shared_next"};
    PyObject *a[4], *arrays[NFIELDS] = {0};
    if (nargs > 3) { /* shared_next is keyword-only */
        PyErr_Format(PyExc_TypeError,
                     "get_batch() takes at most 3 positional arguments (%zd given)", nargs);
        return NULL;
    }
    if (exr_parse_args(args, nargs, kwnames, "get_batch", names, 2, 4, a) < 0)
        return NULL;
    npy_intp B;
    int64_t h;
    if (batch_size_arg(a[0], &B) < 0 || exr_selector_handle(self, a[1], &h) < 0)
        return NULL;
    PyObject *out = a[2] == Py_None ? NULL : a[2];
    bool shared;
    if (truth_arg(a[3], "shared_next", &shared) < 0)
        return after_ps_refused(self, h);
    /* the largest output array must be addressable (pick_len + 1 rows with
     * shared next states) */
    const exr_config *cfg = exr_buffer_config(self->buf);
    size_t widest = cfg->state_bytes > cfg->action_bytes ? cfg->state_bytes : cfg->action_bytes;
    size_t bytes;
    if (widest < 8)
        widest = 8;
    if (!exr_mul_size((size_t)B, cfg->pick_len + 1, &bytes) ||
        !exr_mul_size(bytes, widest, &bytes) ||
        bytes > (size_t)PY_SSIZE_T_MAX) {
        PyErr_Format(PyExc_MemoryError, "batch_size: a batch of %zd picks would not fit in memory",
                     (Py_ssize_t)B);
        return after_ps_refused(self, h);
    }
    if (batch_arrays(self, B, out, shared, arrays) < 0)
        return after_ps_refused(self, h);
    exr_batch_out o;
    exr_field_dst plan[2 * EXR_MAX_FIELDS];
    batch_out_of(self, arrays, &o, plan);
    PyObject *block = exr_block_claim_drawn(mstate(self), arrays[F_EPI], B, &o.drawn);
    exr_status st = draw_and_copy(self, h, (size_t)B, &o);
    exr_block_release_drawn(block);
    if (st != EXR_OK)
        return batch_error(self, st, h, arrays);
    return batch_result(self, arrays, out);
}

/* pick_epi and pick_pos as int64 arrays of one length n. */
int pick_arrays(PyObject *epi, PyObject *pos, PyArrayObject **e, PyArrayObject **p,
                       npy_intp *n)
{
    *n = -1;
    *e = exr_as_index_array(epi, n, "pick_epi");
    *p = *e ? exr_as_index_array(pos, n, "pick_pos") : NULL;
    if (!*p) {
        Py_CLEAR(*e);
        return -1;
    }
    return 0;
}

PyObject *replay_gather(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    EXR_GUARD(self, NULL);
    PyObject *arrays[NFIELDS] = {0};
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "_gather(ps, pick_epi, pick_pos)");
    int64_t h;
    PyArrayObject *e, *p;
    npy_intp n;
    if (exr_selector_handle(self, args[0], &h) < 0)
        return NULL;
    if (!selector_known(self, h))
        return unknown_selector(h);
    if (pick_arrays(args[1], args[2], &e, &p, &n) < 0)
        return NULL;
    if (batch_arrays(self, n, NULL, false, arrays) < 0) {
        Py_DECREF(e);
        Py_DECREF(p);
        return NULL;
    }
    exr_batch_out o;
    exr_field_dst plan[2 * EXR_MAX_FIELDS];
    batch_out_of(self, arrays, &o, plan);
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_buffer_gather(self->buf, h, (size_t)n, PyArray_DATA(e), PyArray_DATA(p), &o);
    EXR_NOGIL_END
    Py_DECREF(e);
    Py_DECREF(p);
    if (st == EXR_ENOTFOUND) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return exr_raise_status(st, &(exr_errctx){.op = "gather", .arg = "pick_epi, pick_pos",
                                                  .expected = "picks that exist",
                                                  .got = "one that does not", .handle = -1});
    }
    if (st != EXR_OK)
        return batch_error(self, st, h, arrays);
    return batch_result(self, arrays, NULL);
}

/* set_priority's arguments into a[5] (ps, pick_epi, pick_pos, priorities,
 * pick_index or NULL). The batch form set_priority(ps, batch, priorities)
 * puts the batch's pick_epi, pick_pos and pick_index there (borrowed from
 * the batch), with *from_batch set: the update then goes through the table
 * indices where they still hold, as the handle form's pick_index does. A
 * batch without pick_index (a Batch built from 8 arrays) is the handle form
 * without it, as pick_index=None is. */
static int set_priority_args(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames, PyObject **a, int *from_batch)
{
    static const char *const names[] = {"ps", "pick_epi", "pick_pos", "priorities",
                                        "pick_index"};
    static const char *const bnames[] = {"ps", "batch", "priorities"};
    *from_batch = nargs >= 2 && Py_IS_TYPE(args[1], mstate(self)->batch_type);
    if (!*from_batch) {
        if (exr_parse_args(args, nargs, kwnames, "set_priority", names, 4, 5, a) < 0)
            return -1;
        if (a[4] == Py_None)
            a[4] = NULL;
        return 0;
    }
    if (exr_parse_args(args, nargs, kwnames, "set_priority", bnames, 3, 3, a) < 0)
        return -1;
    PyObject *batch = a[1];
    a[3] = a[2];
    a[1] = PyStructSequence_GetItem(batch, F_EPI);
    a[2] = PyStructSequence_GetItem(batch, F_POS);
    a[4] = PyStructSequence_GetItem(batch, F_INDEX);
    if (a[4] == Py_None)
        a[4] = NULL;
    return 0;
}

/* set_priority's picks a[1] (pick_epi), a[2] (pick_pos) and, unless a[4]
 * is NULL, a[4] (pick_index) as int64 arrays of one length n, named in
 * errors as the form named them; *x is NULL without pick_index. */
static int set_priority_picks(PyObject *const *a, int from_batch, PyArrayObject **e,
                              PyArrayObject **p, PyArrayObject **x, npy_intp *n)
{
    static const char *const names[2][3] = {
        {"pick_epi", "pick_pos", "pick_index"},
        {"batch.pick_epi", "batch.pick_pos", "batch.pick_index"},
    };
    const char *const *nm = names[from_batch != 0];
    *n = -1;
    *e = exr_as_index_array(a[1], n, nm[0]);
    *p = *e ? exr_as_index_array(a[2], n, nm[1]) : NULL;
    *x = *p && a[4] ? exr_as_index_array(a[4], n, nm[2]) : NULL;
    if (*p && (*x || !a[4]))
        return 0;
    Py_CLEAR(*e);
    Py_CLEAR(*p);
    return -1;
}

/* priorities: one for every pick (a scalar: *stride 0) or one each of n,
 * as float64, all finite and >= 0. A new reference or NULL. */
static PyArrayObject *priorities_values(PyObject *o, npy_intp n, size_t *stride)
{
    if (exr_refuse_bools(o, "priorities") < 0)
        return NULL;
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    npy_intp m = n;
    int scalar = PyArray_Check(o) ? PyArray_NDIM((PyArrayObject *)o) == 0
                                  : (PyFloat_Check(o) || PyLong_Check(o) ||
                                     PyArray_IsScalar(o, Generic));
    PyArrayObject *pr = scalar ? exr_as_array(o, f64, 0, NULL, 0, NULL, "priorities")
                               : exr_as_array(o, f64, 1, &m, 0, NULL, "priorities");
    Py_DECREF(f64);
    *stride = scalar ? 0 : 1;
    /* a broadcast scalar is checked even when there is no pick to apply it to */
    if (pr && exr_check_priorities(PyArray_DATA(pr), scalar ? 1 : n) < 0)
        Py_CLEAR(pr);
    return pr;
}

PyObject *replay_set_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    PyObject *a[5];
    int from_batch;
    int64_t h;
    if (set_priority_args(self, args, nargs, kwnames, a, &from_batch) < 0 ||
        exr_selector_handle(self, a[0], &h) < 0)
        return NULL;
    PyArrayObject *e, *p, *x = NULL, *pr;
    npy_intp n;
    if (set_priority_picks(a, from_batch, &e, &p, &x, &n) < 0)
        return after_ps_refused(self, h);
    size_t stride, applied = 0;
    exr_status st = EXR_OK;
    if ((pr = priorities_values(a[3], n, &stride))) {
        /* the batch form, or the handle form without pick_index=: the
         * notes of the last draw into the block of the pick_epi given,
         * which the core compares pick by pick with the picks given; else
         * the batch's pick_index, or the handle form's batch's own when
         * given its own arrays */
        PyObject *block = NULL;
        const exr_drawn *noted = (!x || from_batch) && n <= EXR_DRAWN_MAX
                                     ? exr_block_drawn_take(mstate(self), e, n, &block)
                                     : NULL;
        const int64_t *hint = noted ? noted->v
                              : x   ? PyArray_DATA(x)
                                    : exr_block_pick_hints(mstate(self), e, p, n);
        const double *pv = PyArray_DATA(pr);
        EXR_NOGIL_BEGIN
        st = exr_buffer_set_priority(self->buf, h, (size_t)n, PyArray_DATA(e), PyArray_DATA(p),
                                     hint, noted, pv, stride, &applied);
        EXR_NOGIL_END
        exr_block_drawn_release(block);
    }
    Py_DECREF(e);
    Py_DECREF(p);
    Py_XDECREF(x);
    if (!pr)
        return after_ps_refused(self, h);
    Py_DECREF(pr);
    if (st == EXR_ENOTFOUND)
        return unknown_selector(h);
    if (st != EXR_OK)
        return exr_raise_status(st, &(exr_errctx){.op = "set_priority", .arg = "priorities",
                                                  .got = "the update's scratch", .handle = -1});
    return PyLong_FromSize_t(applied);
}
