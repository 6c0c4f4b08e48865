/*
 * args.c - argument conversion shared by the binding (args.h).
 */
#include "args.h"

#include <float.h>
#include <ctype.h>
#include <inttypes.h>
#include <string.h>

#include "replay_impl.h"

int exr_is_int(PyObject *o)
{
    if (PyBool_Check(o) || !PyIndex_Check(o))
        return 0;
    /* every ndarray has __index__, which only a 0-d integer one can answer */
    if (PyArray_Check(o)) {
        PyArrayObject *a = (PyArrayObject *)o;
        char k = PyArray_DESCR(a)->kind;
        return PyArray_NDIM(a) == 0 && (k == 'i' || k == 'u');
    }
    return 1;
}

/* Dimension i of a shape, d, into *v; the error names it as `who`. */
static int dim_arg(PyObject *d, PyObject *who, Py_ssize_t i, npy_intp *v)
{
    char got[192];
    if (!exr_is_int(d)) {
        const char *t = exr_type_str(d, got, sizeof got);
        PyErr_Format(PyExc_TypeError, "%U: expected a tuple of ints, got %s %s at index %zd", who,
                     exr_article(t), t, i);
        return -1;
    }
    Py_ssize_t x = PyNumber_AsSsize_t(d, NULL); /* clipped: d is shown, not x */
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (x < 1 || x > ((Py_ssize_t)1 << 40)) {
        PyErr_Format(PyExc_ValueError,
                     "%U: expected dimensions from 1 to 2**40, got %R at index %zd", who, d, i);
        return -1;
    }
    *v = (npy_intp)x;
    return 0;
}

int exr_shape_arg(PyObject *o, const char *name, PyObject *key, int *nd, npy_intp *shape)
{
    PyObject *who = key ? PyUnicode_FromFormat("%s[%R]", name, key) : PyUnicode_FromString(name);
    if (!who)
        return -1;
    PyObject *seq = NULL;
    char got[192];
    if (exr_is_int(o))
        seq = PyTuple_Pack(1, o);
    else if (PyTuple_Check(o) || PyList_Check(o))
        seq = PySequence_Tuple(o);
    else
        PyErr_Format(PyExc_TypeError, "%U: expected %s, got %s", who,
                     key ? "a shape (an int or a tuple of ints)" : "an int or a tuple of ints",
                     exr_type_str(o, got, sizeof got));
    Py_ssize_t n = seq ? PyTuple_GET_SIZE(seq) : 0;
    int r = seq ? 0 : -1;
    if (seq && n > NPY_MAXDIMS - 2) {
        PyErr_Format(PyExc_ValueError, "%U: expected at most %d dimensions, got %zd", who,
                     NPY_MAXDIMS - 2, n);
        r = -1;
    }
    for (Py_ssize_t i = 0; r == 0 && i < n; i++)
        r = dim_arg(PyTuple_GET_ITEM(seq, i), who, i, &shape[i]);
    if (r == 0)
        *nd = (int)n;
    Py_XDECREF(seq);
    Py_DECREF(who);
    return r;
}

const char *exr_article(const char *word)
{
    while (*word && !isalpha((unsigned char)*word))
        word++;
    int c = tolower((unsigned char)word[0]);
    int d = c ? tolower((unsigned char)word[1]) : 0;
    int e = d ? tolower((unsigned char)word[2]) : 0;
    int vowel = c == 'a' || c == 'e' || c == 'i' || c == 'o' ||
                (c == 'u' && d == 'n' && e != 'i') || /* "an unknown", "a uniform" */
                (c == 'n' && isalpha(d) && !strchr("aeiouy", d)); /* "an ndarray" */
    return vowel ? "an" : "a";
}

const char *exr_type_str(PyObject *o, char *buf, size_t len)
{
    if (!PyArray_Check(o))
        return Py_TYPE(o)->tp_name;
    PyArrayObject *a = (PyArrayObject *)o;
    char shape[128];
    exr_shape_str(shape, sizeof shape, PyArray_NDIM(a), PyArray_DIMS(a));
    /* the dtype's name (str(dtype): "bool", "int64" in NumPy 1.x and 2.x;
     * its scalar type's name is numpy.bool_ in 1.x) */
    PyObject *ds = PyObject_Str((PyObject *)PyArray_DESCR(a));
    const char *dt = ds ? PyUnicode_AsUTF8(ds) : NULL;
    if (!dt)
        PyErr_Clear();
    snprintf(buf, len, "%s of dtype %s and shape %s", Py_TYPE(o)->tp_name, dt ? dt : "?", shape);
    Py_XDECREF(ds);
    return buf;
}

/* One Python int as its sign and magnitude: 1 if it fits 64 bits, 0 if not. */
static int int_value(PyObject *o, int *neg, uint64_t *mag)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (x == -1 && PyErr_Occurred())
        return -1;
    if (!overflow) {
        *neg = x < 0;
        *mag = x < 0 ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
        return 1;
    }
    if (overflow < 0)
        return 0;
    unsigned long long u = PyLong_AsUnsignedLongLong(o);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    *neg = 0;
    *mag = u;
    return 1;
}

/* o as a Python int (new reference), or NULL with the TypeError. */
static PyObject *index_of(PyObject *o, const char *name, const char *want)
{
    if (!exr_is_int(o)) {
        char got[192];
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", name, want,
                     exr_type_str(o, got, sizeof got));
        return NULL;
    }
    return PyNumber_Index(o);
}

/* What an int argument expects: `expected`, or its range. Formatted only
 * on the error path (a snprintf per call cost ~50 ns of get_batch). */
static void int_want(char *want, size_t len, const char *expected, int64_t lo, uint64_t hi,
                     int signed_range)
{
    if (expected)
        snprintf(want, len, "%s", expected);
    else if (signed_range)
        snprintf(want, len, "an int in [%" PRId64 ", %" PRId64 "]", lo, (int64_t)hi);
    else
        snprintf(want, len, "an int in [0, %" PRIu64 "]", hi);
}

int exr_int_arg(PyObject *o, const char *name, const char *expected, int64_t lo, int64_t hi,
                int64_t *out)
{
    char want[128];
    if (PyLong_CheckExact(o)) {
        /* the common case, without PyNumber_Index's new reference; anything
         * else (out of range included) takes the path below and its error */
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (!overflow && x >= lo && x <= hi) {
            *out = (int64_t)x;
            return 0;
        }
    }
    if (!exr_is_int(o)) {
        char got[192];
        int_want(want, sizeof want, expected, lo, (uint64_t)hi, 1);
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", name, want,
                     exr_type_str(o, got, sizeof got));
        return -1;
    }
    PyObject *v = PyNumber_Index(o);
    if (!v)
        return -1;
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        Py_DECREF(v);
        return -1;
    }
    if (overflow || x < lo || x > hi) {
        int_want(want, sizeof want, expected, lo, (uint64_t)hi, 1);
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got %R", name, want, v);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    *out = (int64_t)x;
    return 0;
}

int exr_uint_arg(PyObject *o, const char *name, const char *expected, uint64_t hi, uint64_t *out)
{
    char want[128];
    if (!exr_is_int(o)) {
        char got[192];
        int_want(want, sizeof want, expected, 0, hi, 0);
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %s", name, want,
                     exr_type_str(o, got, sizeof got));
        return -1;
    }
    PyObject *v = PyNumber_Index(o);
    if (!v)
        return -1;
    int neg;
    uint64_t mag;
    int r = int_value(v, &neg, &mag);
    if (r < 0) {
        Py_DECREF(v);
        return -1;
    }
    if (r == 0 || neg || mag > hi) {
        int_want(want, sizeof want, expected, 0, hi, 0);
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got %R", name, want, v);
        Py_DECREF(v);
        return -1;
    }
    Py_DECREF(v);
    *out = mag;
    return 0;
}

int exr_real_arg(PyObject *o, const char *name, double *out)
{
    if (PyFloat_CheckExact(o)) {
        *out = PyFloat_AS_DOUBLE(o);
        return 0;
    }
    int seq = PyArray_Check(o) ? PyArray_NDIM((PyArrayObject *)o) > 0
                               : PySequence_Check(o) && !PyUnicode_Check(o) && !PyBytes_Check(o);
    if (seq) {
        PyErr_Format(PyExc_ValueError, "%s: expected a scalar, got %s %s", name,
                     exr_article(Py_TYPE(o)->tp_name), Py_TYPE(o)->tp_name);
        return -1;
    }
    /* a 0-d array holds a real number only with an integer or float dtype
     * (float() would read True as 1.0 and "1.5" as 1.5, and older NumPy
     * drops an imaginary part); bools, complex numbers and NumPy's times
     * are refused as scalars too */
    char k = PyArray_Check(o) ? PyArray_DESCR((PyArrayObject *)o)->kind : 'f';
    char got[192];
    if (PyBool_Check(o) || PyArray_IsScalar(o, Bool) || PyComplex_Check(o) ||
        PyArray_IsScalar(o, ComplexFloating) || PyArray_IsScalar(o, Timedelta) ||
        PyArray_IsScalar(o, Datetime) || (k != 'i' && k != 'u' && k != 'f') ||
        !(PyFloat_Check(o) || PyLong_Check(o) || PyNumber_Check(o))) {
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %s", name,
                     exr_type_str(o, got, sizeof got));
        return -1;
    }
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            const char *t = PyLong_Check(o) ? "int" : Py_TYPE(o)->tp_name;
            PyErr_Format(PyExc_ValueError,
                         "%s: expected a real number within float's range, got %s %s too "
                         "large for a float",
                         name, exr_article(t), t);
            return -1;
        }
        /* its own __float__ failed: a TypeError or ValueError says it is no
         * real number; anything else (a RuntimeError, a KeyboardInterrupt)
         * passes through, as in the reference */
        if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a real number, got %s", name,
                     exr_type_str(o, got, sizeof got));
        return -1;
    }
    *out = v;
    return 0;
}

/* ---- Python ints into an integer column ----------------------------------- */

/* The range of an integer dtype of 1, 2, 4 or 8 bytes. */
static void int_range(PyArray_Descr *d, int64_t *lo, uint64_t *hi)
{
    int bits = (int)PyDataType_ELSIZE(d) * 8;
    if (d->kind == 'i') {
        *hi = ((uint64_t)1 << (bits - 1)) - 1;
        *lo = -(int64_t)*hi - 1;
    } else {
        *lo = 0;
        *hi = bits == 64 ? UINT64_MAX : ((uint64_t)1 << bits) - 1;
    }
}

static void store_int(void *p, int size, uint64_t bits)
{
    switch (size) {
    case 1: { uint8_t v = (uint8_t)bits; memcpy(p, &v, 1); break; }
    case 2: { uint16_t v = (uint16_t)bits; memcpy(p, &v, 2); break; }
    case 4: { uint32_t v = (uint32_t)bits; memcpy(p, &v, 4); break; }
    default: memcpy(p, &bits, 8); break;
    }
}

/* The ValueError for a value that does not fit descr (range [lo, hi]):
 * item, or the int of sign neg and magnitude mag. NULL. */
static PyObject *range_error(const char *arg, PyArray_Descr *descr, int64_t lo, uint64_t hi,
                             PyObject *item, int neg, uint64_t mag)
{
    if (!item) {
        item = neg ? PyLong_FromLongLong(-(long long)(mag - 1) - 1)
                   : PyLong_FromUnsignedLongLong(mag);
        if (!item)
            return NULL;
    } else {
        Py_INCREF(item);
    }
    char range[96];
    if (lo < 0)
        snprintf(range, sizeof range, "[%" PRId64 ", %" PRIu64 "]", lo, hi);
    else
        snprintf(range, sizeof range, "[0, %" PRIu64 "]", hi);
    PyErr_Format(PyExc_ValueError, "%s: expected values that fit %S, in %s, got %R", arg,
                 (PyObject *)descr, range, item);
    Py_DECREF(item);
    return NULL;
}

/* Value i as sign and magnitude: from the Python int or NumPy integer
 * itself (objs, an object array: NumPy promotes a list that mixes them, or
 * its uint64 and int64 scalars, to float64) or from arr's int64/uint64. 1,
 * 0 if it is no int that fits 64 bits (*item set for a Python int; a NumPy
 * integer's value is shown as an int), -1 on error (*not_ints: it is no
 * int). */
static int int_at(PyArrayObject *objs, PyArrayObject *arr, npy_intp i, int *neg, uint64_t *mag,
                  PyObject **item, int *not_ints)
{
    *item = NULL;
    if (objs) {
        PyObject *o = ((PyObject **)PyArray_DATA(objs))[i];
        if (PyLong_Check(o) && !PyBool_Check(o)) {
            *item = o;
            return int_value(o, neg, mag);
        }
        if (!PyArray_IsScalar(o, Integer) || PyArray_IsScalar(o, Timedelta)) {
            *not_ints = 1;
            return -1;
        }
        PyObject *v = PyNumber_Index(o);
        if (!v)
            return -1;
        int r = int_value(v, neg, mag);
        Py_DECREF(v);
        return r;
    }
    if (PyArray_DESCR(arr)->kind == 'i') {
        int64_t x;
        memcpy(&x, PyArray_BYTES(arr) + i * 8, 8);
        *neg = x < 0;
        *mag = *neg ? (uint64_t)0 - (uint64_t)x : (uint64_t)x;
    } else {
        memcpy(mag, PyArray_BYTES(arr) + i * 8, 8);
        *neg = 0;
    }
    return 1;
}

/* The values as an object array shaped like arr (*objs), unless arr's own
 * int64/uint64 can be read in order (C-contiguous, aligned, native: *objs
 * NULL). When NumPy promoted Python ints to float64 or object, the ints
 * themselves; other integers from arr, which need not be laid out so (an
 * __array__ or a buffer gives strided or byte-swapped ones). -1 on error
 * (*not_ints: obj is not shaped like arr). */
static int promoted_ints(PyObject *obj, PyArrayObject *arr, PyArrayObject **objs, int *not_ints)
{
    char hk = PyArray_DESCR(arr)->kind;
    int ints = hk == 'i' || hk == 'u';
    *objs = NULL;
    if (ints && PyDataType_ELSIZE(PyArray_DESCR(arr)) == 8 && PyArray_ISCARRAY_RO(arr) &&
        PyArray_ISNOTSWAPPED(arr))
        return 0;
    PyArray_Descr *od = PyArray_DescrFromType(NPY_OBJECT);
    *objs = (PyArrayObject *)PyArray_FromAny(ints ? (PyObject *)arr : obj, od, 0, 0,
                                             NPY_ARRAY_C_CONTIGUOUS, NULL);
    if (!*objs)
        return -1;
    if (!PyArray_SAMESHAPE(*objs, arr)) {
        *not_ints = 1;
        Py_CLEAR(*objs);
        return -1;
    }
    return 0;
}

PyArrayObject *exr_ints_by_value(PyObject *obj, PyArrayObject *arr, PyArray_Descr *descr,
                                 const char *arg, int *not_ints)
{
    *not_ints = 0;
    int64_t lo;
    uint64_t hi;
    int_range(descr, &lo, &hi);
    int size = (int)PyDataType_ELSIZE(descr);
    Py_INCREF(descr);
    PyArrayObject *out = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, descr, PyArray_NDIM(arr), PyArray_DIMS(arr), NULL, NULL, 0, NULL);
    if (!out)
        return NULL;
    npy_intp n = PyArray_SIZE(arr);
    char *dst = PyArray_DATA(out);
    PyArrayObject *objs = NULL;
    if (promoted_ints(obj, arr, &objs, not_ints) < 0)
        goto error;
    for (npy_intp i = 0; i < n; i++) {
        int neg = 0;
        uint64_t mag = 0;
        PyObject *item;
        int r = int_at(objs, arr, i, &neg, &mag, &item, not_ints);
        if (r < 0)
            goto error;
        if (r == 0 || (neg ? mag > (uint64_t)0 - (uint64_t)lo : mag > hi)) {
            range_error(arg, descr, lo, hi, item, neg, mag);
            goto error;
        }
        store_int(dst + i * size, size, neg ? (uint64_t)0 - mag : mag);
    }
    Py_XDECREF(objs);
    return out;
error:
    Py_XDECREF(objs);
    Py_DECREF(out);
    return NULL;
}

int exr_refuse_wrapped(PyArrayObject *a, PyArray_Descr *descr, const char *arg)
{
    const int64_t *v = PyArray_DATA(a);
    npy_intp n = PyArray_SIZE(a);
    for (npy_intp i = 0; i < n; i++) {
        if (v[i] < 0) {
            range_error(arg, descr, INT64_MIN, INT64_MAX, NULL, 0, (uint64_t)v[i]);
            return -1;
        }
    }
    return 0;
}

/* ---- Python numbers into a float column --------------------------------- */

/* Item i of objs (Python numbers) as a double into *v: 1, 0 if it is no
 * int or float (bools included), -1 with the ValueError for an int too
 * large for a double. */
static int real_at(PyObject *item, const char *arg, double *v)
{
    if (PyFloat_Check(item)) {
        *v = PyFloat_AS_DOUBLE(item);
        return 1;
    }
    if (!PyLong_Check(item) || PyBool_Check(item))
        return 0;
    *v = PyLong_AsDouble(item);
    if (*v == -1.0 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError,
                         "%s: expected real numbers within float's range, got an int too large "
                         "for a float",
                         arg);
        }
        return -1;
    }
    return 1;
}

PyArrayObject *exr_reals_by_value(PyArrayObject *objs, const char *arg, int *not_reals)
{
    *not_reals = 0;
    PyArray_Descr *od = PyArray_DescrFromType(NPY_OBJECT);
    PyArrayObject *src = (PyArrayObject *)PyArray_FromArray(objs, od, NPY_ARRAY_C_CONTIGUOUS);
    if (!src)
        return NULL;
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    PyArrayObject *out = (PyArrayObject *)PyArray_NewFromDescr(
        &PyArray_Type, f64, PyArray_NDIM(src), PyArray_DIMS(src), NULL, NULL, 0, NULL);
    npy_intp n = PyArray_SIZE(src);
    PyObject *const *items = PyArray_DATA(src);
    double *dst = out ? PyArray_DATA(out) : NULL;
    for (npy_intp i = 0; out && i < n; i++) {
        int r = real_at(items[i], arg, &dst[i]);
        if (r <= 0) {
            *not_reals = r == 0;
            Py_CLEAR(out);
        }
    }
    Py_DECREF(src);
    return out;
}

/* Whether item is a bool: Python's, NumPy's scalar, or an array of them. */
static int is_bool_item(PyObject *item)
{
    return PyBool_Check(item) || PyArray_IsScalar(item, Bool) ||
           (PyArray_Check(item) && PyArray_DESCR((PyArrayObject *)item)->kind == 'b');
}

int exr_seq_has_bool(PyObject *o)
{
    if (!PyList_Check(o) && !PyTuple_Check(o))
        return 0;
    /* the checks below run no Python code: the list cannot change under
     * the loop */
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < n; i++)
        if (is_bool_item(items[i]))
            return 1;
    return 0;
}

int exr_refuse_bools(PyObject *o, const char *arg)
{
    int is_bool;
    if (is_bool_item(o) || exr_seq_has_bool(o)) {
        is_bool = 1;
    } else if (PyList_Check(o) || PyTuple_Check(o)) {
        PyArrayObject *a = (PyArrayObject *)PyArray_FromAny(o, NULL, 0, 0, 0, NULL);
        if (!a) {
            PyErr_Clear(); /* the caller's conversion reports what is wrong */
            return 0;
        }
        is_bool = PyArray_DESCR(a)->kind == 'b' && PyArray_SIZE(a) > 0;
        Py_DECREF(a);
    } else {
        return 0;
    }
    if (is_bool) {
        PyErr_Format(PyExc_TypeError, "%s: expected real numbers, got bool", arg);
        return -1;
    }
    return 0;
}

int exr_handle_arg(PyObject *o, const char *name, const char *expected, int64_t *h)
{
    int overflow;
    if (PyLong_CheckExact(o)) { /* the common case, without PyNumber_Index's new reference */
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        *h = overflow ? -1 : (int64_t)x;
        return overflow != 0;
    }
    PyObject *v = index_of(o, name, expected);
    if (!v)
        return -1;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (x == -1 && PyErr_Occurred())
        return -1;
    *h = overflow ? -1 : (int64_t)x;
    return overflow != 0;
}

/* Whether keyword name key is the ASCII string name. Keyword names are
 * compact ASCII strings (identifiers of the caller's code): compared as
 * bytes, without PyUnicode_CompareWithASCIIString's strlen and call. */
static int kw_is(PyObject *key, const char *name)
{
    if (PyUnicode_IS_COMPACT_ASCII(key)) {
        Py_ssize_t n = PyUnicode_GET_LENGTH(key);
        const char *k = (const char *)PyUnicode_DATA(key);
        Py_ssize_t i = 0;
        while (i < n && name[i] && name[i] == k[i])
            i++;
        return i == n && name[i] == '\0';
    }
    return PyUnicode_CompareWithASCIIString(key, name) == 0;
}

/* Fills out[0..nmax) from positional args and keywords (NULL where absent).
 * The first nreq are required. */
int exr_parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                   const char *fname, const char *const *names, int nreq, int nmax,
                   PyObject **out)
{
    for (int i = 0; i < nmax; i++)
        out[i] = NULL;
    if (nargs > nmax) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional arguments (%zd given)",
                     fname, nmax, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t j = 0; j < nkw; j++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, j);
        int i = 0;
        while (i < nmax && !kw_is(key, names[i]))
            i++;
        if (i == nmax) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname,
                         key);
            return -1;
        }
        if (out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", fname,
                         names[i]);
            return -1;
        }
        out[i] = args[nargs + j];
    }
    for (int i = 0; i < nreq; i++) {
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname,
                         names[i]);
            return -1;
        }
    }
    return 0;
}
PyArray_Descr *exr_dtype_arg(PyObject *o, const char *name, int reward)
{
    PyArray_Descr *d = NULL;
    if (o == Py_None || !PyArray_DescrConverter(o, &d)) {
        PyErr_Clear();
        /* a string NumPy does not know is shown as given ("x8"); anything
         * else by its type, not its repr (an array's, an object's address) */
        char got[192];
        if (PyUnicode_Check(o))
            PyErr_Format(PyExc_TypeError, "%s: expected a NumPy dtype, got %R", name, o);
        else
            PyErr_Format(PyExc_TypeError, "%s: expected a NumPy dtype, got %s", name,
                         exr_type_str(o, got, sizeof got));
        return NULL;
    }
    char k = d->kind;
    int ok = reward ? (k == 'f' && (PyDataType_ELSIZE(d) == 2 || PyDataType_ELSIZE(d) == 4 ||
                                    PyDataType_ELSIZE(d) == 8))
                    : (k == 'b' || k == 'i' || k == 'u' || k == 'f');
    if (!ok || PyDataType_HASFIELDS(d) || PyDataType_HASSUBARRAY(d)) {
        PyErr_Format(PyExc_TypeError, "%s: expected %s, got %S", name,
                     reward ? "float16, float32 or float64"
                            : "a bool, integer or floating dtype",
                     (PyObject *)d);
        Py_DECREF(d);
        return NULL;
    }
    if (!PyArray_ISNBO(d->byteorder)) {
        PyArray_Descr *n = PyArray_DescrNewByteorder(d, NPY_NATIVE);
        Py_DECREF(d);
        d = n;
    }
    return d;
}

int exr_path_arg(PyObject *o, const char *name, PyObject **out)
{
    *out = NULL;
    if (PyUnicode_FSConverter(o, out))
        return 0;
    char got[192];
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a path (str, bytes or os.PathLike), got %s",
                     name, exr_type_str(o, got, sizeof got));
    } else if (PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
        /* a ValueError too: tested first */
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError,
                     "%s: expected a path the file system encoding can encode, got %R", name, o);
    } else if (PyErr_ExceptionMatches(PyExc_ValueError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: expected a path without a NUL character, got %R",
                     name, o);
    }
    return -1;
}

int truth_arg(PyObject *o, const char *name, bool *out)
{
    if (!o) {
        *out = false;
        return 0;
    }
    if (!PyBool_Check(o) && !PyArray_IsScalar(o, Bool) && !PyLong_Check(o) &&
        !(PyArray_IsScalar(o, Integer) && !PyArray_IsScalar(o, Timedelta))) {
        PyErr_Format(PyExc_TypeError, "%s: expected a bool or an int, got %s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    int t = PyObject_IsTrue(o);
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

int exr_check_priorities(const double *p, npy_intp n)
{
    size_t i = exr_first_bad_priority(p, (size_t)n); /* several at a time */
    if (i == (size_t)n)
        return 0;
    PyObject *bad = PyFloat_FromDouble(p[i]);
    if (bad)
        PyErr_Format(PyExc_ValueError, "priorities: expected finite numbers >= 0, got %R at index %zd",
                     bad, (Py_ssize_t)i);
    Py_XDECREF(bad);
    return -1;
}
