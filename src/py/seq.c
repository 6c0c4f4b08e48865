/*
 * seq.c - a batch with shared next states (get_batch(..., shared_next=True)):
 * state and state_next as two views of one (B, pick_len + 1, *shape) array,
 * state_seq, per state field (docs/api.md, "Shared next states").
 */
#include "binding.h"

#include "replay_impl.h"
#include "named.h"

/* seq[:, k:k + L], a view that keeps seq alive. */
static PyObject *seq_view(PyObject *seq, npy_intp k, npy_intp L)
{
    PyArrayObject *s = (PyArrayObject *)seq;
    int nd = PyArray_NDIM(s);
    npy_intp dims[NPY_MAXDIMS];
    memcpy(dims, PyArray_DIMS(s), sizeof(npy_intp) * (size_t)nd);
    dims[1] = L;
    PyArray_Descr *d = PyArray_DESCR(s);
    Py_INCREF(d);
    PyObject *v = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, PyArray_STRIDES(s),
                                       PyArray_BYTES(s) + k * PyArray_STRIDE(s, 1),
                                       NPY_ARRAY_WRITEABLE, NULL);
    if (v && PyArray_SetBaseObject((PyArrayObject *)v, Py_NewRef(seq)) < 0)
        Py_CLEAR(v);
    return v;
}

/* Whether v is seq[:, k:k + L] as seq_view makes it: an ndarray of seq's
 * dtype over the same memory with seq's strides, writeable. */
static int seq_view_ok(PyObject *v, PyObject *seq, npy_intp k, npy_intp L)
{
    if (!PyArray_Check(v))
        return 0;
    PyArrayObject *a = (PyArrayObject *)v, *s = (PyArrayObject *)seq;
    int nd = PyArray_NDIM(s);
    if (PyArray_NDIM(a) != nd || !PyArray_ISWRITEABLE(a) ||
        (PyArray_DESCR(a) != PyArray_DESCR(s) &&
         !PyArray_EquivTypes(PyArray_DESCR(a), PyArray_DESCR(s))) ||
        PyArray_BYTES(a) != PyArray_BYTES(s) + k * PyArray_STRIDE(s, 1))
        return 0;
    for (int i = 0; i < nd; i++)
        if (PyArray_DIM(a, i) != (i == 1 ? L : PyArray_DIM(s, i)) ||
            PyArray_STRIDE(a, i) != PyArray_STRIDE(s, i))
            return 0;
    return 1;
}

int exr_seq_views_ok(PyObject *state, PyObject *next, PyObject *seq, npy_intp L)
{
    return seq_view_ok(state, seq, 0, L) && seq_view_ok(next, seq, 1, L);
}

/* {name: view} of each field's array in dict seq. */
static PyObject *dict_views(const exr_fieldset *fs, PyObject *seq, npy_intp k, npy_intp L)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < fs->n; i++) {
        PyObject *v = seq_view(PyDict_GetItem(seq, fs->f[i].name), k, L);
        if (!v || PyDict_SetItem(d, fs->f[i].name, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(v);
    }
    return d;
}

int exr_seq_views(ReplayObject *self, PyObject **arrays)
{
    npy_intp L = (npy_intp)exr_buffer_config(self->buf)->pick_len;
    PyObject *seq = arrays[F_SEQ];
    if (self->sfields) {
        arrays[F_STATE] = dict_views(self->sfields, seq, 0, L);
        arrays[F_NEXT] = arrays[F_STATE] ? dict_views(self->sfields, seq, 1, L) : NULL;
    } else {
        arrays[F_STATE] = seq_view(seq, 0, L);
        arrays[F_NEXT] = arrays[F_STATE] ? seq_view(seq, 1, L) : NULL;
    }
    return arrays[F_NEXT] ? 0 : -1;
}

/* ValueError: out's `what` (out.state or out.state_next, and the field's
 * name) is not the view of out.state_seq it should be. */
static int not_a_view(const char *what, PyObject *name, const char *slice, PyObject *got)
{
    PyObject *desc = exr_describe_value(got);
    if (!desc)
        return -1;
    if (name)
        PyErr_Format(PyExc_ValueError,
                     "out: expected %s[%R] to be the view of out.state_seq[%R][%s] that "
                     "get_batch(..., shared_next=True) makes, got %U",
                     what, name, name, slice, desc);
    else
        PyErr_Format(PyExc_ValueError,
                     "out: expected %s to be the view of out.state_seq[%s] that get_batch(..., "
                     "shared_next=True) makes, got %U",
                     what, slice, desc);
    Py_DECREF(desc);
    return -1;
}

/* out's field f (F_STATE or F_NEXT, k = 0 or 1) checked against the state_seq
 * arrays already checked (seq: an array, or a dict of the fields'). */
static int view_checked(ReplayObject *self, PyObject *out, int f, PyObject *seq, npy_intp L)
{
    const char *what = f == F_STATE ? "out.state" : "out.state_next";
    const char *slice = f == F_STATE ? ":, :-1" : ":, 1:";
    npy_intp k = f == F_STATE ? 0 : 1;
    PyObject *got = PyStructSequence_GetItem(out, f);
    if (!self->sfields)
        return seq_view_ok(got, seq, k, L) ? 0 : not_a_view(what, NULL, slice, got);
    const exr_fieldset *fs = self->sfields;
    if (!PyDict_Check(got) || PyDict_GET_SIZE(got) != fs->n)
        return not_a_view(what, NULL, slice, got);
    for (int i = 0; i < fs->n; i++) {
        PyObject *v = PyDict_GetItemWithError(got, fs->f[i].name);
        if (!v && PyErr_Occurred())
            return -1;
        if (!v || !seq_view_ok(v, PyDict_GetItem(seq, fs->f[i].name), k, L))
            return not_a_view(what, fs->f[i].name, slice, v ? v : Py_None);
    }
    return 0;
}

int exr_seq_out_check(ReplayObject *self, PyObject *out, PyObject **arrays)
{
    npy_intp L = (npy_intp)exr_buffer_config(self->buf)->pick_len;
    const int views[] = {F_STATE, F_NEXT};
    for (int i = 0; i < 2; i++) {
        if (view_checked(self, out, views[i], arrays[F_SEQ], L) < 0)
            return -1;
        arrays[views[i]] = Py_NewRef(PyStructSequence_GetItem(out, views[i]));
    }
    return 0;
}
