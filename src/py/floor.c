/*
 * floor.c - _core._floor_gather(rows, starts, L): the benchmark floor
 * (src/core/floor.h) made callable, with the same call overhead shape as
 * get_batch: output arrays made with the GIL (from get_batch's recycled
 * blocks, block.c), filled without it.
 */
#include "binding.h"

#include "crosscore.h"
#include "floor.h"

/* The shape (n, L, *a's row shape) into dims: its length, or -1 with the
 * ValueError naming arg. */
static int pick_dims(PyArrayObject *a, npy_intp n, npy_intp L, const char *arg, npy_intp *dims)
{
    int nd = PyArray_NDIM(a) + 1;
    if (nd > NPY_MAXDIMS) {
        PyErr_Format(PyExc_ValueError, "%s: too many dimensions", arg);
        return -1;
    }
    dims[0] = n;
    dims[1] = L;
    for (int i = 1; i < PyArray_NDIM(a); i++)
        dims[i + 1] = PyArray_DIM(a, i);
    return nd;
}

enum { NB_MAX = 10 }; /* the most arrays a floor returns (_floor_gather_batch) */

/* starts as an int64 array of *n row indices (a new reference), or NULL
 * with the error naming it. Converting it may run Python code (an
 * __array__, a sequence's items), which may drop or reshape the other
 * arguments: the callers take those (their arrays held, their shapes read)
 * only after it, and after every __index__ of theirs. */
static PyArrayObject *starts_arg(PyObject *o, npy_intp *n)
{
    *n = -1;
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    PyArrayObject *starts = exr_as_array(o, i64, 1, n, 0, NULL, "starts");
    Py_DECREF(i64);
    return starts;
}

/* 0 when each s of starts (n of them) has s + L < nrows (the runs read
 * rows s .. s + L), else -1 with the ValueError naming it. The callers
 * have 1 <= L < nrows, so s < nrows - L says it
 * without the overflow of s + L for a huge s. */
static int starts_within(PyArrayObject *starts, npy_intp n, npy_intp L, npy_intp nrows)
{
    const int64_t *sv = PyArray_DATA(starts);
    for (npy_intp i = 0; i < n; i++) {
        if (sv[i] < 0 || sv[i] >= nrows - L) {
            PyErr_Format(PyExc_ValueError, "starts: index %zd out of range", (Py_ssize_t)i);
            return -1;
        }
    }
    return 0;
}

/* k arrays (descr d[i], nd[i] dims dims[i]) carved one after another,
 * each 64-byte aligned, from one block of the cache get_batch's batches come
 * from (block.c): the floors get their memory as get_batch does, recycled
 * and already mapped, not fresh from malloc (which may hand back pages the
 * kernel must fault in again at every call). k <= NB_MAX. New references
 * in outs; -1 with an exception (a MemoryError naming `what` when the sizes
 * overflow). */
static int carve_arrays(PyObject *module, const char *what, int k, PyArray_Descr *const *d,
                        const int *nd, npy_intp (*dims)[NPY_MAXDIMS], PyObject **outs)
{
    size_t at[NB_MAX], total = 0;
    bool fits = k <= NB_MAX;
    for (int i = 0; fits && i < k; i++) {
        size_t bytes = (size_t)PyDataType_ELSIZE(d[i]);
        at[i] = total;
        for (int j = 0; fits && j < nd[i]; j++)
            fits = exr_mul_size(bytes, (size_t)dims[i][j], &bytes);
        fits = fits && exr_add_size(bytes, 63, &bytes) && exr_add_size(total, bytes, &total);
        total &= ~(size_t)63;
    }
    if (!fits) {
        PyErr_Format(PyExc_MemoryError, "%s: output too large", what);
        return -1;
    }
    PyObject *block = exr_block_new(PyModule_GetState(module), total);
    if (!block)
        return -1;
    int r = 0;
    for (int i = 0; i < k; i++) {
        outs[i] = r < 0 ? NULL : exr_block_array(block, at[i], d[i], nd[i], dims[i]);
        if (!outs[i])
            r = -1;
    }
    Py_DECREF(block);
    for (int i = 0; r < 0 && i < k; i++)
        Py_CLEAR(outs[i]);
    return r;
}

/* The floor's two outputs, (n, L, *row shape) each (carve_arrays); with
 * nx NULL (shared next states) one, (n, L + 1, *row shape). -1 with an
 * exception. */
static int floor_outs(PyObject *module, PyArrayObject *rows, npy_intp n, Py_ssize_t L,
                      PyObject **st, PyObject **nx)
{
    npy_intp dims[2][NPY_MAXDIMS];
    int nd = pick_dims(rows, n, nx ? L : L + 1, "rows", dims[0]);
    if (nd < 0)
        return -1;
    memcpy(dims[1], dims[0], sizeof dims[0]);
    PyArray_Descr *d[2] = {PyArray_DESCR(rows), PyArray_DESCR(rows)};
    int nds[2] = {nd, nd};
    PyObject *outs[2] = {NULL, NULL};
    if (carve_arrays(module, "_floor_gather", nx ? 2 : 1, d, nds, dims, outs) < 0)
        return -1;
    *st = outs[0];
    if (nx)
        *nx = outs[1];
    return 0;
}

PyObject *exr_floor_gather_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 && nargs != 4)
        return PyErr_Format(PyExc_TypeError, "_floor_gather(rows, starts, L, shared=False)");
    int shared = nargs == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (shared < 0)
        return NULL;
    PyArrayObject *rows = (PyArrayObject *)args[0];
    Py_ssize_t L = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    if (L == -1 && PyErr_Occurred())
        return NULL;
    npy_intp n;
    PyArrayObject *starts = starts_arg(args[1], &n); /* rows is read after it (starts_arg) */
    if (!starts)
        return NULL;
    if (!PyArray_Check(args[0]) || PyArray_NDIM(rows) < 1 || !PyArray_IS_C_CONTIGUOUS(rows) ||
        PyDataType_REFCHK(PyArray_DESCR(rows))) {
        Py_DECREF(starts);
        return PyErr_Format(PyExc_TypeError, "rows: expected a C-contiguous ndarray of plain data");
    }
    npy_intp nrows = PyArray_DIM(rows, 0);
    if (L < 1 || L >= nrows) {
        Py_DECREF(starts);
        return PyErr_Format(PyExc_ValueError, "L: expected 1 <= L < %zd, got %zd",
                            (Py_ssize_t)nrows, L);
    }
    if (starts_within(starts, n, L, nrows) < 0) {
        Py_DECREF(starts);
        return NULL;
    }
    const int64_t *sv = PyArray_DATA(starts);
    PyObject *st, *nx = NULL;
    if (floor_outs(module, rows, n, L, &st, shared ? NULL : &nx) < 0) {
        Py_DECREF(starts);
        return NULL;
    }
    size_t row_bytes = (size_t)PyArray_NBYTES(rows) / (size_t)nrows;
    EXR_NOGIL_BEGIN
    exr_floor_gather(PyArray_DATA(rows), row_bytes, sv, (size_t)n, (size_t)L,
                     PyArray_DATA((PyArrayObject *)st),
                     nx ? PyArray_DATA((PyArrayObject *)nx) : NULL);
    EXR_NOGIL_END
    Py_DECREF(starts);
    return nx ? Py_BuildValue("(NN)", st, nx) : st;
}

/* _core._floor_gather_cols(cols, starts, L, nnext[, out]): the floor for
 * named fields (exr_floor_gather_cols). cols: C-contiguous arrays of one
 * length N (each a field's items); the first nnext also get next items.
 * Returns (outs, nexts): lists of (count, L, ...) arrays (nexts: nnext of
 * them). out: such a pair from an earlier call of the same sizes, refilled
 * (so that the floor, like get_batch's recycled blocks, writes into memory
 * that is already mapped). */
enum { MAXC = 16 };

/* The columns of _floor_gather_cols: data, row bytes, row count. */
typedef struct {
    Py_ssize_t nc, nn, L;
    const void *cols[MAXC];
    size_t widths[MAXC];
    void *outs[MAXC], *nexts[MAXC];
    npy_intp nrows;
} cols_t;

/* cols (a tuple of the call's own: the list may be emptied while the
 * gather runs without the GIL) checked, its data pointers into c. */
static int cols_arg(PyObject *cols, cols_t *c)
{
    c->nc = PyTuple_GET_SIZE(cols);
    if (c->nc < 1 || c->nc > MAXC || c->nn < 0 || c->nn > c->nc) {
        PyErr_Format(PyExc_ValueError, "cols: expected 1 to %d columns and nnext <= that", MAXC);
        return -1;
    }
    c->nrows = -1;
    for (Py_ssize_t i = 0; i < c->nc; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(cols, i);
        if (!PyArray_Check((PyObject *)a) || PyArray_NDIM(a) < 1 || !PyArray_IS_C_CONTIGUOUS(a) ||
            PyArray_DIM(a, 0) < 1 || (c->nrows >= 0 && PyArray_DIM(a, 0) != c->nrows)) {
            PyErr_SetString(PyExc_TypeError,
                            "cols: expected C-contiguous ndarrays of one length, 1 or more");
            return -1;
        }
        c->nrows = PyArray_DIM(a, 0);
        c->cols[i] = PyArray_DATA(a);
        c->widths[i] = (size_t)PyArray_NBYTES(a) / (size_t)c->nrows;
    }
    if (c->L < 1 || c->L >= c->nrows) {
        PyErr_Format(PyExc_ValueError, "L: expected 1 <= L < %zd, got %zd", (Py_ssize_t)c->nrows,
                     c->L);
        return -1;
    }
    return 0;
}

/* out=(outs, nexts) of an earlier call: its two lists as tuples of the
 * call's own (held[0], held[1]: its arrays held while they are written
 * without the GIL), their data pointers into c. */
static int outs_arg(PyObject *o, cols_t *c, npy_intp n, PyObject **held)
{
    if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2 || !PyList_Check(PyTuple_GET_ITEM(o, 0)) ||
        !PyList_Check(PyTuple_GET_ITEM(o, 1)) || PyList_GET_SIZE(PyTuple_GET_ITEM(o, 0)) != c->nc ||
        PyList_GET_SIZE(PyTuple_GET_ITEM(o, 1)) != c->nn) {
        PyErr_SetString(PyExc_TypeError, "out: expected (outs, nexts) of an earlier call");
        return -1;
    }
    for (int k = 0; k < 2; k++)
        if (!(held[k] = PyList_AsTuple(PyTuple_GET_ITEM(o, k))))
            return -1;
    for (Py_ssize_t i = 0; i < c->nc; i++) {
        c->nexts[i] = NULL;
        for (int k = 0; k < (i < c->nn ? 2 : 1); k++) {
            PyArrayObject *x = (PyArrayObject *)PyTuple_GET_ITEM(held[k], i);
            if (!PyArray_Check((PyObject *)x) || !PyArray_IS_C_CONTIGUOUS(x) ||
                (size_t)PyArray_NBYTES(x) != (size_t)n * (size_t)c->L * c->widths[i]) {
                PyErr_SetString(PyExc_ValueError, "out: arrays of other sizes");
                return -1;
            }
            *(k == 0 ? &c->outs[i] : &c->nexts[i]) = PyArray_DATA(x);
        }
    }
    return 0;
}

/* New (outs, nexts) lists of arrays (n, L, *row shape) into lo, ln. */
static int new_outs(PyObject *cols, cols_t *c, npy_intp n, PyObject *lo, PyObject *ln)
{
    for (Py_ssize_t i = 0; i < c->nc; i++) {
        PyArrayObject *a = (PyArrayObject *)PyTuple_GET_ITEM(cols, i);
        npy_intp dims[NPY_MAXDIMS];
        int nd = pick_dims(a, n, c->L, "cols", dims);
        if (nd < 0)
            return -1;
        c->nexts[i] = NULL;
        for (int k = 0; k < (i < c->nn ? 2 : 1); k++) {
            PyArray_Descr *d = PyArray_DESCR(a);
            Py_INCREF(d);
            PyObject *o = PyArray_NewFromDescr(&PyArray_Type, d, nd, dims, NULL, NULL, 0, NULL);
            if (!o)
                return -1;
            PyList_SET_ITEM(k == 0 ? lo : ln, i, o);
            *(k == 0 ? &c->outs[i] : &c->nexts[i]) = PyArray_DATA((PyArrayObject *)o);
        }
    }
    return 0;
}

/* The outputs: out (args[4]) refilled, or new lists. A new reference or NULL. */
static PyObject *cols_outs(PyObject *const *args, Py_ssize_t nargs, PyObject *cols, cols_t *c,
                           npy_intp n, PyObject **held)
{
    if (nargs == 5)
        return outs_arg(args[4], c, n, held) == 0 ? Py_NewRef(args[4]) : NULL;
    PyObject *res = NULL, *lo = PyList_New(c->nc), *ln = lo ? PyList_New(c->nn) : NULL;
    if (ln && new_outs(cols, c, n, lo, ln) == 0)
        res = Py_BuildValue("(OO)", lo, ln);
    Py_XDECREF(lo);
    Py_XDECREF(ln);
    return res;
}

PyObject *exr_floor_gather_cols_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if ((nargs != 4 && nargs != 5) || !PyList_Check(args[0]))
        return PyErr_Format(PyExc_TypeError,
                            "_floor_gather_cols(cols: list, starts, L, nnext[, out])");
    cols_t c = {0};
    c.L = PyNumber_AsSsize_t(args[2], PyExc_OverflowError);
    c.nn = PyNumber_AsSsize_t(args[3], PyExc_OverflowError);
    if ((c.L == -1 || c.nn == -1) && PyErr_Occurred())
        return NULL;
    npy_intp n;
    PyArrayObject *starts = starts_arg(args[1], &n); /* the lists are read after it */
    if (!starts)
        return NULL;
    PyObject *cols = PyList_AsTuple(args[0]), *held[2] = {NULL, NULL}, *res = NULL;
    if (cols && cols_arg(cols, &c) == 0 && starts_within(starts, n, c.L, c.nrows) == 0)
        res = cols_outs(args, nargs, cols, &c, n, held);
    if (res) {
        const int64_t *sv = PyArray_DATA(starts);
        EXR_NOGIL_BEGIN
        exr_floor_gather_cols((size_t)c.nc, c.cols, c.widths, sv, (size_t)n, (size_t)c.L, c.outs,
                              c.nexts);
        EXR_NOGIL_END
    }
    Py_XDECREF(cols);
    Py_XDECREF(held[0]);
    Py_XDECREF(held[1]);
    Py_DECREF(starts);
    return res;
}

/* _core._floor_gather_batch(records, starts, L, ep, state_bytes,
 * action_bytes): the bound exr_floor_gather_batch, everything a get_batch
 * writes with the picks' starts given. records: (N, row) plain data, each
 * row a state, an action and a reward of state_bytes, action_bytes and the
 * rest. Returns the batch's ten arrays, all from one recycled block as
 * get_batch's: state, action, reward, state_next (count, L, their bytes:
 * uint8), seq_len, seq_len_next, pick_epi, pick_pos, pick_index (int64)
 * and weight (float32). */
enum { NB = NB_MAX };

/* The ten arrays into outs (new references) and their data into o. -1
 * with an exception. */
static int batch_arrays(PyObject *module, npy_intp n, npy_intp L, const size_t *w,
                        PyObject **outs, exr_batch_out *o)
{
    PyArray_Descr *d[NB];
    int nds[NB];
    npy_intp dims[NB][NPY_MAXDIMS];
    for (int i = 0; i < NB; i++) {
        int big = i < 4;
        d[i] = PyArray_DescrFromType(big ? NPY_UINT8 : i == NB - 1 ? NPY_FLOAT32 : NPY_INT64);
        nds[i] = big ? 3 : 1;
        dims[i][0] = n;
        dims[i][1] = L;
        dims[i][2] = big ? (npy_intp)w[i == 3 ? 0 : i] : 0;
    }
    int r = carve_arrays(module, "_floor_gather_batch", NB, d, nds, dims, outs);
    for (int i = 0; i < NB; i++)
        Py_DECREF(d[i]);
    if (r < 0)
        return -1;
    void *p[NB];
    for (int i = 0; i < NB; i++)
        p[i] = PyArray_DATA((PyArrayObject *)outs[i]);
    *o = (exr_batch_out){.state = p[0], .action = p[1], .reward = p[2], .state_next = p[3],
                         .seq_len = p[4], .seq_len_next = p[5], .pick_epi = p[6],
                         .pick_pos = p[7], .pick_index = p[8], .weight = p[9]};
    return 0;
}

/* records and the four numbers after starts (L, ep, state_bytes,
 * action_bytes, converted into v before: their __index__ may change
 * records) checked: the records' row bytes, or 0 with an exception. */
static size_t batch_args(PyObject *const *args, const Py_ssize_t *v)
{
    PyArrayObject *rec = (PyArrayObject *)args[0];
    if (!PyArray_Check(args[0]) || PyArray_NDIM(rec) < 1 || !PyArray_IS_C_CONTIGUOUS(rec) ||
        PyDataType_REFCHK(PyArray_DESCR(rec)) || PyArray_DIM(rec, 0) < 2) {
        PyErr_SetString(PyExc_TypeError,
                        "records: expected a C-contiguous ndarray of plain data, 2 rows or more");
        return 0;
    }
    npy_intp nrows = PyArray_DIM(rec, 0);
    size_t row = (size_t)PyArray_NBYTES(rec) / (size_t)nrows;
    if (v[0] < 1 || v[0] >= nrows) {
        PyErr_Format(PyExc_ValueError, "L: expected 1 <= L < %zd, got %zd", (Py_ssize_t)nrows, v[0]);
        return 0;
    }
    if (v[1] < 1 || v[2] < 1 || v[3] < 1 || (size_t)v[2] + (size_t)v[3] >= row) {
        PyErr_Format(PyExc_ValueError,
                     "ep, state_bytes, action_bytes: expected >= 1 each, the two byte counts "
                     "below the row's %zu bytes, got %zd, %zd, %zd",
                     row, v[1], v[2], v[3]);
        return 0;
    }
    return row;
}

PyObject *exr_floor_gather_batch_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6)
        return PyErr_Format(PyExc_TypeError,
                            "_floor_gather_batch(records, starts, L, ep, state_bytes, action_bytes)");
    Py_ssize_t v[4];
    for (int i = 0; i < 4; i++) {
        v[i] = PyNumber_AsSsize_t(args[2 + i], PyExc_OverflowError);
        if (v[i] == -1 && PyErr_Occurred())
            return NULL;
    }
    npy_intp n;
    PyArrayObject *starts = starts_arg(args[1], &n); /* records is read after it */
    if (!starts)
        return NULL;
    size_t row = batch_args(args, v);
    PyArrayObject *rec = (PyArrayObject *)args[0];
    if (!row || starts_within(starts, n, v[0], PyArray_DIM(rec, 0)) < 0) {
        Py_DECREF(starts);
        return NULL;
    }
    const int64_t *sv = PyArray_DATA(starts);
    size_t w[3] = {(size_t)v[2], (size_t)v[3], row - (size_t)v[2] - (size_t)v[3]};
    PyObject *outs[NB];
    exr_batch_out o;
    if (batch_arrays(module, n, v[0], w, outs, &o) < 0) {
        Py_DECREF(starts);
        return NULL;
    }
    EXR_NOGIL_BEGIN
    exr_floor_gather_batch(PyArray_DATA(rec), w[0], w[1], w[2], sv, (size_t)n, (size_t)v[0],
                           (size_t)v[1], &o);
    EXR_NOGIL_END
    Py_DECREF(starts);
    PyObject *t = PyTuple_New(NB);
    if (!t) {
        for (int i = 0; i < NB; i++)
            Py_DECREF(outs[i]);
        return NULL;
    }
    for (int i = 0; i < NB; i++)
        PyTuple_SET_ITEM(t, i, outs[i]);
    return t;
}

/* _core._crosscore_ns(seconds): the machine's cross-core round trip of one
 * cache line (src/core/crosscore.h), measured for about `seconds` with the
 * GIL let go. */
PyObject *exr_crosscore_py(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyFloat_Check(arg) && !PyLong_Check(arg))
        return PyErr_Format(PyExc_TypeError, "seconds: expected a number, got %s",
                            Py_TYPE(arg)->tp_name);
    double secs = PyFloat_AsDouble(arg);
    if (secs == -1.0 && PyErr_Occurred())
        return NULL;
    if (!(secs > 0 && secs <= 10))
        return PyErr_Format(PyExc_ValueError, "seconds: expected a number in (0, 10], got %R", arg);
    double ns;
    EXR_NOGIL_BEGIN
    ns = exr_crosscore_ns(secs);
    EXR_NOGIL_END
    if (ns < 0)
        return PyErr_NoMemory(); /* no second thread, or no memory for the probe */
    return PyFloat_FromDouble(ns);
}
