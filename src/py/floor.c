/*
 * floor.c - _core._floor_gather(rows, starts, L): the benchmark floor
 * (src/core/floor.h) made callable, with the same call overhead shape as
 * get_batch: output arrays allocated with the GIL, filled without it.
 */
#include "binding.h"

#include "floor.h"

PyObject *exr_floor_gather_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "_floor_gather(rows, starts, L)");
    PyArrayObject *rows = (PyArrayObject *)args[0];
    if (!PyArray_Check(args[0]) || PyArray_NDIM(rows) < 1 || !PyArray_IS_C_CONTIGUOUS(rows))
        return PyErr_Format(PyExc_TypeError, "rows: expected a C-contiguous ndarray");
    Py_ssize_t L = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (L == -1 && PyErr_Occurred())
        return NULL;
    npy_intp nrows = PyArray_DIM(rows, 0);
    if (L < 1 || L >= nrows)
        return PyErr_Format(PyExc_ValueError, "L: expected 1 <= L < %zd, got %zd", (Py_ssize_t)nrows, L);
    npy_intp n = -1;
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    PyArrayObject *starts = exr_as_array(args[1], i64, 1, &n, 0, NULL, "starts");
    Py_DECREF(i64);
    if (!starts)
        return NULL;
    const int64_t *sv = PyArray_DATA(starts);
    for (npy_intp i = 0; i < n; i++) {
        if (sv[i] < 0 || sv[i] + L >= nrows) {
            Py_DECREF(starts);
            return PyErr_Format(PyExc_ValueError, "starts: index %zd out of range", (Py_ssize_t)i);
        }
    }
    npy_intp dims[NPY_MAXDIMS];
    int nd = PyArray_NDIM(rows) + 1;
    if (nd > NPY_MAXDIMS) {
        Py_DECREF(starts);
        return PyErr_Format(PyExc_ValueError, "rows: too many dimensions");
    }
    dims[0] = n;
    dims[1] = L;
    for (int i = 1; i < PyArray_NDIM(rows); i++)
        dims[i + 1] = PyArray_DIM(rows, i);
    PyArray_Descr *d = PyArray_DESCR(rows);
    Py_INCREF(d);
    PyObject *st = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
    Py_INCREF(d);
    PyObject *nx = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
    if (!st || !nx) {
        Py_XDECREF(st);
        Py_XDECREF(nx);
        Py_DECREF(starts);
        return NULL;
    }
    size_t row_bytes = (size_t)PyArray_NBYTES(rows) / (size_t)nrows;
    Py_BEGIN_ALLOW_THREADS
    exr_floor_gather(PyArray_DATA(rows), row_bytes, sv, (size_t)n, (size_t)L,
                     PyArray_DATA((PyArrayObject *)st), PyArray_DATA((PyArrayObject *)nx));
    Py_END_ALLOW_THREADS
    Py_DECREF(starts);
    return Py_BuildValue("(NN)", st, nx);
}

/* _core._floor_gather_cols(cols, starts, L, nnext[, out]): the floor for
 * named fields (exr_floor_gather_cols). cols: C-contiguous arrays of one
 * length N (each a field's items); the first nnext also get next items.
 * Returns (outs, nexts): lists of (count, L, ...) arrays (nexts: nnext of
 * them). out: such a pair from an earlier call of the same sizes, refilled
 * (so that the floor, like get_batch's recycled blocks, writes into memory
 * that is already mapped). */
PyObject *exr_floor_gather_cols_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    enum { MAXC = 16 };
    if ((nargs != 4 && nargs != 5) || !PyList_Check(args[0]))
        return PyErr_Format(PyExc_TypeError,
                            "_floor_gather_cols(cols: list, starts, L, nnext[, out])");
    Py_ssize_t nc = PyList_GET_SIZE(args[0]);
    Py_ssize_t L = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    Py_ssize_t nn = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if ((L == -1 || nn == -1) && PyErr_Occurred())
        return NULL;
    if (nc < 1 || nc > MAXC || nn < 0 || nn > nc)
        return PyErr_Format(PyExc_ValueError, "cols: expected 1 to %d columns and nnext <= that",
                            MAXC);
    const void *cols[MAXC];
    size_t widths[MAXC];
    void *outs[MAXC], *nexts[MAXC];
    npy_intp nrows = -1;
    for (Py_ssize_t c = 0; c < nc; c++) {
        PyArrayObject *a = (PyArrayObject *)PyList_GET_ITEM(args[0], c);
        if (!PyArray_Check((PyObject *)a) || PyArray_NDIM(a) < 1 || !PyArray_IS_C_CONTIGUOUS(a) ||
            (nrows >= 0 && PyArray_DIM(a, 0) != nrows))
            return PyErr_Format(PyExc_TypeError,
                                "cols: expected C-contiguous ndarrays of one length");
        nrows = PyArray_DIM(a, 0);
        cols[c] = PyArray_DATA(a);
        widths[c] = (size_t)PyArray_NBYTES(a) / (size_t)nrows;
    }
    if (L < 1 || L >= nrows)
        return PyErr_Format(PyExc_ValueError, "L: expected 1 <= L < %zd, got %zd", (Py_ssize_t)nrows, L);
    npy_intp n = -1;
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    PyArrayObject *starts = exr_as_array(args[1], i64, 1, &n, 0, NULL, "starts");
    Py_DECREF(i64);
    if (!starts)
        return NULL;
    const int64_t *sv = PyArray_DATA(starts);
    for (npy_intp i = 0; i < n; i++) {
        if (sv[i] < 0 || sv[i] + L >= nrows) {
            Py_DECREF(starts);
            return PyErr_Format(PyExc_ValueError, "starts: index %zd out of range", (Py_ssize_t)i);
        }
    }
    PyObject *lo = NULL, *ln = NULL;
    if (nargs == 5) {
        PyObject *o = args[4];
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyList_Check(PyTuple_GET_ITEM(o, 0)) ||
            !PyList_Check(PyTuple_GET_ITEM(o, 1)) ||
            PyList_GET_SIZE(PyTuple_GET_ITEM(o, 0)) != nc ||
            PyList_GET_SIZE(PyTuple_GET_ITEM(o, 1)) != nn) {
            PyErr_SetString(PyExc_TypeError, "out: expected (outs, nexts) of an earlier call");
            goto fail;
        }
        for (Py_ssize_t c = 0; c < nc; c++) {
            for (int k = 0; k < (c < nn ? 2 : 1); k++) {
                PyArrayObject *x = (PyArrayObject *)PyList_GET_ITEM(PyTuple_GET_ITEM(o, k), c);
                if (!PyArray_Check((PyObject *)x) || !PyArray_IS_C_CONTIGUOUS(x) ||
                    (size_t)PyArray_NBYTES(x) != (size_t)n * (size_t)L * widths[c]) {
                    PyErr_SetString(PyExc_ValueError, "out: arrays of other sizes");
                    goto fail;
                }
                if (k == 0)
                    outs[c] = PyArray_DATA(x);
                else
                    nexts[c] = PyArray_DATA(x);
            }
            if (c >= nn)
                nexts[c] = NULL;
        }
        Py_BEGIN_ALLOW_THREADS
        exr_floor_gather_cols((size_t)nc, cols, widths, sv, (size_t)n, (size_t)L, outs, nexts);
        Py_END_ALLOW_THREADS
        Py_DECREF(starts);
        return Py_NewRef(o);
    }
    lo = PyList_New(nc);
    ln = PyList_New(nn);
    if (!lo || !ln)
        goto fail;
    for (Py_ssize_t c = 0; c < nc; c++) {
        PyArrayObject *a = (PyArrayObject *)PyList_GET_ITEM(args[0], c);
        npy_intp dims[NPY_MAXDIMS];
        int nd = PyArray_NDIM(a) + 1;
        if (nd > NPY_MAXDIMS) {
            PyErr_SetString(PyExc_ValueError, "cols: too many dimensions");
            goto fail;
        }
        dims[0] = n;
        dims[1] = L;
        for (int i = 1; i < PyArray_NDIM(a); i++)
            dims[i + 1] = PyArray_DIM(a, i);
        for (int k = 0; k < (c < nn ? 2 : 1); k++) {
            PyArray_Descr *d = PyArray_DESCR(a);
            Py_INCREF(d);
            PyObject *o = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
            if (!o)
                goto fail;
            if (k == 0) {
                PyList_SET_ITEM(lo, c, o);
                outs[c] = PyArray_DATA((PyArrayObject *)o);
                nexts[c] = NULL;
            } else {
                PyList_SET_ITEM(ln, c, o);
                nexts[c] = PyArray_DATA((PyArrayObject *)o);
            }
        }
    }
    Py_BEGIN_ALLOW_THREADS
    exr_floor_gather_cols((size_t)nc, cols, widths, sv, (size_t)n, (size_t)L, outs, nexts);
    Py_END_ALLOW_THREADS
    Py_DECREF(starts);
    return Py_BuildValue("(NN)", lo, ln);
fail:
    Py_XDECREF(lo);
    Py_XDECREF(ln);
    Py_DECREF(starts);
    return NULL;
}
