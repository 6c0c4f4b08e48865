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
