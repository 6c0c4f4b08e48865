/*
 * named.c - named fields in the binding (named.h).
 */
#include "named.h"

#include "replay_impl.h"

#include "args.h"

#include <stdlib.h>

/* ---- specs ---------------------------------------------------------------- */

static int field_bytes(exr_named *f, const char *arg)
{
    size_t v = (size_t)PyDataType_ELSIZE(f->descr);
    for (int i = 0; i < f->nd; i++) {
        if (!exr_mul_size(v, (size_t)f->shape[i], &v) || v > ((size_t)1 << 40)) {
            PyErr_Format(PyExc_ValueError, "%s[%R]: one item would take more than 1 TiB", arg,
                         f->name);
            return -1;
        }
    }
    f->bytes = v;
    return 0;
}

static exr_fieldset *fieldset_alloc(void)
{
    exr_fieldset *fs = PyMem_Calloc(1, sizeof *fs);
    if (!fs)
        PyErr_NoMemory();
    return fs;
}

void exr_fieldset_free(exr_fieldset *fs)
{
    if (!fs)
        return;
    for (int i = 0; i < fs->n; i++) {
        Py_XDECREF(fs->f[i].name);
        Py_XDECREF(fs->f[i].descr);
    }
    Py_XDECREF(fs->names);
    PyMem_Free(fs);
}

/* name, the next field of fs: a str of 1 to EXR_FIELD_NAME_MAX bytes that
 * no field before has (a Mapping of its own may give one name twice). */
static int name_ok(const exr_fieldset *fs, PyObject *name, const char *arg)
{
    if (!PyUnicode_Check(name)) {
        PyErr_Format(PyExc_TypeError, "%s: expected str field names, got %R", arg, name);
        return -1;
    }
    Py_ssize_t len;
    if (!PyUnicode_AsUTF8AndSize(name, &len)) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
            return -1;
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "%s: expected field names that UTF-8 can encode, got %R",
                     arg, name);
        return -1;
    }
    if (len < 1 || len > EXR_FIELD_NAME_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: expected field names of 1 to %d bytes, got %R", arg,
                     EXR_FIELD_NAME_MAX, name);
        return -1;
    }
    for (int i = 0; i < fs->n; i++) {
        if (PyUnicode_Compare(fs->f[i].name, name) == 0) {
            PyErr_Format(PyExc_ValueError, "%s: expected unique field names, got %R twice", arg,
                         name);
            return -1;
        }
    }
    return 0;
}

/* Offsets and the names string, once every field is in. */
static int fieldset_finish(exr_fieldset *fs, const char *arg)
{
    size_t off = 0;
    for (int i = 0; i < fs->n; i++) {
        fs->f[i].off = off;
        if (!exr_add_size(off, fs->f[i].bytes, &off) || off > ((size_t)1 << 40)) {
            PyErr_Format(PyExc_ValueError, "%s: one record's fields would take more than 1 TiB",
                         arg);
            return -1;
        }
    }
    fs->bytes = off;
    PyObject *parts = PyList_New(fs->n);
    if (!parts)
        return -1;
    for (int i = 0; i < fs->n; i++) {
        PyObject *r = PyObject_Repr(fs->f[i].name);
        if (!r) {
            Py_DECREF(parts);
            return -1;
        }
        PyList_SET_ITEM(parts, i, r);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    fs->names = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(parts);
    return fs->names ? 0 : -1;
}

/* A Mapping's items() entry as (name, value): its own items() may give
 * anything, a dict's gives tuples. */
static int item_pair(PyObject *kv, const char *arg, PyObject **name, PyObject **val)
{
    if (!PyTuple_Check(kv) || PyTuple_GET_SIZE(kv) != 2) {
        PyErr_Format(PyExc_TypeError, "%s: expected items() to give (name, value) pairs, got %R",
                     arg, kv);
        return -1;
    }
    *name = PyTuple_GET_ITEM(kv, 0);
    *val = PyTuple_GET_ITEM(kv, 1);
    return 0;
}

/* The next field of fs from a spec's items() entry kv: (name, (shape, dtype)). */
static int field_from_item(exr_fieldset *fs, PyObject *kv, const char *arg)
{
    PyObject *name, *val;
    if (item_pair(kv, arg, &name, &val) < 0 || name_ok(fs, name, arg) < 0)
        return -1;
    exr_named *f = &fs->f[fs->n];
    /* a str of its own: a subclass's __hash__ and __eq__ would run at
     * every lookup in the batch's dicts, and need not find what they put */
    if (!(f->name = PyUnicode_FromObject(name)))
        return -1;
    fs->n++;
    if (!(PyTuple_Check(val) || PyList_Check(val)) || PySequence_Size(val) != 2) {
        PyErr_Format(PyExc_TypeError, "%s[%R]: expected a pair (shape, dtype), got %R", arg,
                     name, val);
        return -1;
    }
    PyObject *shp = PySequence_GetItem(val, 0), *dt = PySequence_GetItem(val, 1);
    int ok = shp && dt && exr_shape_arg(shp, arg, name, &f->nd, f->shape) == 0;
    if (ok) {
        PyObject *what = PyUnicode_FromFormat("%s[%R] dtype", arg, name);
        const char *w = what ? PyUnicode_AsUTF8(what) : NULL;
        f->descr = w ? exr_dtype_arg(dt, w, 0) : NULL;
        Py_XDECREF(what);
        ok = f->descr && field_bytes(f, arg) == 0;
    }
    Py_XDECREF(shp);
    Py_XDECREF(dt);
    return ok ? 0 : -1;
}

exr_fieldset *exr_fieldset_from_spec(PyObject *spec, const char *arg)
{
    if (!PyDict_Check(spec)) {
        /* a Mapping (a gymnasium Dict's .spaces is a dict; others have items()) */
        if (PyUnicode_Check(spec) || !PyMapping_Check(spec) ||
            !PyObject_HasAttrString(spec, "items")) {
            PyErr_Format(PyExc_TypeError,
                         "%s: expected a dict {name: (shape, dtype)}, got %s", arg,
                         Py_TYPE(spec)->tp_name);
            return NULL;
        }
    }
    PyObject *items = PyMapping_Items(spec);
    if (!items)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    exr_fieldset *fs = NULL;
    if (n == 0 || n > EXR_MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "%s: expected 1 to %d fields, got %zd", arg,
                     EXR_MAX_FIELDS, n);
        goto error;
    }
    if (!(fs = fieldset_alloc()))
        goto error;
    for (Py_ssize_t i = 0; i < n; i++)
        if (field_from_item(fs, PyList_GET_ITEM(items, i), arg) < 0)
            goto error;
    if (fieldset_finish(fs, arg) < 0)
        goto error;
    Py_DECREF(items);
    return fs;
error:
    Py_DECREF(items);
    exr_fieldset_free(fs);
    return NULL;
}

PyObject *exr_fieldset_spec(const exr_fieldset *fs)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < fs->n; i++) {
        PyObject *shp = exr_shape_tuple(fs->f[i].nd, fs->f[i].shape);
        PyObject *pair = shp ? PyTuple_Pack(2, shp, (PyObject *)fs->f[i].descr) : NULL;
        Py_XDECREF(shp);
        if (!pair || PyDict_SetItem(d, fs->f[i].name, pair) < 0)
            Py_CLEAR(d);
        Py_XDECREF(pair);
    }
    return d;
}

/* ---- dict arguments ---------------------------------------------------------- */

/* obj[name] (a new reference), NULL without exception if absent. A dict's
 * own subclass may define __getitem__: only a dict itself is read directly. */
static PyObject *get_item(PyObject *obj, PyObject *name)
{
    if (PyDict_CheckExact(obj)) {
        PyObject *v = PyDict_GetItemWithError(obj, name);
        return v ? Py_NewRef(v) : NULL;
    }
    PyObject *v = PyObject_GetItem(obj, name);
    if (!v && PyErr_ExceptionMatches(PyExc_KeyError))
        PyErr_Clear();
    return v;
}

static int is_field(const exr_fieldset *fs, PyObject *key)
{
    for (int i = 0; i < fs->n; i++) {
        int eq = PyObject_RichCompareBool(key, fs->f[i].name, Py_EQ);
        if (eq != 0)
            return eq;
    }
    return 0;
}

void exr_fieldset_release(const exr_fieldset *fs, PyArrayObject **arrs)
{
    for (int i = 0; i < fs->n; i++)
        Py_CLEAR(arrs[i]);
}

/* 0 when every key of obj names a field, else -1 with an exception. */
static int keys_known(const exr_fieldset *fs, PyObject *obj, const char *arg)
{
    PyObject *keys = PyMapping_Keys(obj);
    if (!keys)
        return -1;
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(keys); k++) {
        PyObject *key = PyList_GET_ITEM(keys, k);
        int known = is_field(fs, key);
        if (!known)
            PyErr_Format(PyExc_ValueError,
                         "%s: expected the fields %U, got an unknown field %R", arg, fs->names,
                         key);
        if (known <= 0) {
            Py_DECREF(keys);
            return -1;
        }
    }
    Py_DECREF(keys);
    return 0;
}

/* obj[field i] (a new reference), or NULL with an exception: the
 * ValueError naming the field when obj has none. */
static PyObject *field_value(const exr_fieldset *fs, PyObject *obj, const char *arg, int i)
{
    PyObject *v = get_item(obj, fs->f[i].name);
    if (!v && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "%s: expected the fields %U, got no %R", arg, fs->names,
                     fs->f[i].name);
    return v;
}

int exr_fieldset_arrays(const exr_fieldset *fs, PyObject *obj, const char *arg, int nlead,
                        npy_intp *lead, PyArrayObject **out)
{
    for (int i = 0; i < fs->n; i++)
        out[i] = NULL;
    if (PyArray_Check(obj) || PyUnicode_Check(obj) || !PyMapping_Check(obj) ||
        !PyObject_HasAttrString(obj, "keys")) {
        PyErr_Format(PyExc_TypeError, "%s: expected a dict of arrays with the fields %U, got %s",
                     arg, fs->names, Py_TYPE(obj)->tp_name);
        return -1;
    }
    /* names first (every name, before any value is looked at) */
    if (keys_known(fs, obj, arg) < 0)
        return -1;
    for (int i = 0; i < fs->n; i++) {
        /* `name in obj`, as the reference asks: obj[name] would run a
         * defaultdict's __missing__, which puts a value into it */
        int has = PySequence_Contains(obj, fs->f[i].name);
        if (has == 0)
            PyErr_Format(PyExc_ValueError, "%s: expected the fields %U, got no %R", arg,
                         fs->names, fs->f[i].name);
        if (has <= 0)
            return -1;
    }
    /* looked up again: a Mapping (or a key's __eq__) need not give the
     * same answer twice */
    for (int i = 0; i < fs->n; i++) {
        PyObject *v = field_value(fs, obj, arg, i);
        PyObject *what = v ? PyUnicode_FromFormat("%s[%R]", arg, fs->f[i].name) : NULL;
        const char *w = what ? PyUnicode_AsUTF8(what) : NULL;
        out[i] = w ? exr_as_array(v, fs->f[i].descr, nlead, lead, fs->f[i].nd, fs->f[i].shape, w)
                   : NULL;
        Py_XDECREF(what);
        Py_XDECREF(v);
        if (!out[i]) {
            exr_fieldset_release(fs, out);
            return -1;
        }
    }
    return 0;
}

void exr_fieldset_src_plan(const exr_fieldset *fs, size_t base, PyArrayObject **arrs,
                           exr_field_src *plan)
{
    for (int i = 0; i < fs->n; i++)
        plan[i] = (exr_field_src){base + fs->f[i].off, fs->f[i].bytes, PyArray_DATA(arrs[i]),
                                  fs->f[i].bytes};
}

void exr_fieldset_pack(const exr_fieldset *fs, PyArrayObject **arrs, unsigned char *dst)
{
    for (int i = 0; i < fs->n; i++)
        memcpy(dst + fs->f[i].off, PyArray_DATA(arrs[i]), fs->f[i].bytes);
}

/* ---- batches ----------------------------------------------------------------- */

static int batch_dims(const exr_named *f, npy_intp B, npy_intp L, npy_intp *dims)
{
    dims[0] = B;
    dims[1] = L;
    memcpy(dims + 2, f->shape, sizeof(npy_intp) * (size_t)f->nd);
    return 2 + f->nd;
}

int exr_fieldset_batch_new(const exr_fieldset *fs, exr_modstate *st, npy_intp B, npy_intp L,
                           PyObject **dict, PyObject **next)
{
    int parts = next ? 2 : 1;
    size_t total = 0, bytes;
    *dict = NULL;
    if (next)
        *next = NULL;
    for (int i = 0; i < fs->n; i++) {
        if (!exr_mul_size((size_t)B, (size_t)L, &bytes) ||
            !exr_mul_size(bytes, fs->f[i].bytes, &bytes) || !exr_add_size(bytes, 63, &bytes) ||
            !exr_mul_size(bytes & ~(size_t)63, (size_t)parts, &bytes) ||
            !exr_add_size(total, bytes, &total) || total > (size_t)PY_SSIZE_T_MAX) {
            PyErr_Format(PyExc_MemoryError,
                         "batch_size: a batch of %zd picks would not fit in memory", (Py_ssize_t)B);
            return -1;
        }
    }
    PyObject *block = exr_block_new(st, total);
    if (!block)
        return -1;
    size_t at = 0;
    PyObject *ds[2] = {PyDict_New(), next ? PyDict_New() : NULL};
    if (!ds[0] || (next && !ds[1]))
        goto fail;
    for (int i = 0; i < fs->n; i++) {
        npy_intp dims[NPY_MAXDIMS];
        int nd = batch_dims(&fs->f[i], B, L, dims);
        size_t sz = ((size_t)B * (size_t)L * fs->f[i].bytes + 63) & ~(size_t)63;
        for (int p = 0; p < parts; p++) {
            PyObject *a = exr_block_array(block, at, fs->f[i].descr, nd, dims);
            at += sz;
            if (!a)
                goto fail;
            if (PyDict_SetItem(ds[p], fs->f[i].name, a) < 0) {
                Py_DECREF(a);
                goto fail;
            }
            Py_DECREF(a);
        }
    }
    Py_DECREF(block);
    *dict = ds[0];
    if (next)
        *next = ds[1];
    return 0;
fail:
    Py_XDECREF(ds[0]);
    Py_XDECREF(ds[1]);
    Py_DECREF(block);
    return -1;
}

int exr_fieldset_batch_check(const exr_fieldset *fs, PyObject *dict, npy_intp B, npy_intp L,
                             const char *what, PyObject **held)
{
    *held = NULL;
    if (!PyDict_Check(dict)) {
        PyErr_Format(PyExc_TypeError, "out: expected %s to be a dict with the fields %U, got %s",
                     what, fs->names, Py_TYPE(dict)->tp_name);
        return -1;
    }
    if (PyDict_GET_SIZE(dict) != fs->n) {
        PyErr_Format(PyExc_ValueError, "out: expected %s to hold the fields %U, got %zd entries",
                     what, fs->names, PyDict_GET_SIZE(dict));
        return -1;
    }
    /* each array taken as it is checked: a key's __eq__, run by a later
     * lookup, may change the dict */
    if (!(*held = PyDict_New()))
        return -1;
    for (int i = 0; i < fs->n; i++) {
        const exr_named *f = &fs->f[i];
        PyObject *a = PyDict_GetItemWithError(dict, f->name);
        if (!a) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "out: expected %s to hold the fields %U, got no %R",
                             what, fs->names, f->name);
            goto error;
        }
        npy_intp dims[NPY_MAXDIMS];
        int nd = batch_dims(f, B, L, dims);
        if (exr_out_array_ok(a, f->descr, nd, dims)) {
            if (PyDict_SetItem(*held, f->name, a) < 0)
                goto error;
            continue;
        }
        exr_out_array_refused(PyUnicode_FromFormat("%s[%R]", what, f->name), f->descr, nd, dims,
                              a);
        goto error;
    }
    return 0;
error:
    Py_CLEAR(*held);
    return -1;
}

void exr_fieldset_dst_plan(const exr_fieldset *fs, size_t base, PyObject *dict,
                           PyObject *next_dict, bool seq, exr_field_dst *plan)
{
    for (int i = 0; i < fs->n; i++) {
        PyObject *a = PyDict_GetItem(dict, fs->f[i].name);
        PyObject *nx = next_dict ? PyDict_GetItem(next_dict, fs->f[i].name) : NULL;
        plan[i] = (exr_field_dst){base + fs->f[i].off, fs->f[i].bytes,
                                  PyArray_DATA((PyArrayObject *)a),
                                  nx ? PyArray_DATA((PyArrayObject *)nx) : NULL, seq};
    }
}

/* ---- episodes ---------------------------------------------------------------- */

PyObject *exr_fieldset_split(const exr_fieldset *fs, const unsigned char *rows, size_t row_bytes,
                             size_t base, npy_intp n, int lead)
{
    PyObject *d = PyDict_New();
    for (int i = 0; d && i < fs->n; i++) {
        const exr_named *f = &fs->f[i];
        npy_intp dims[NPY_MAXDIMS];
        int k = 0;
        if (lead >= 0)
            dims[k++] = n;
        memcpy(dims + k, f->shape, sizeof(npy_intp) * (size_t)f->nd);
        Py_INCREF(f->descr);
        PyObject *a = PyArray_NewFromDescr(&PyArray_Type, f->descr, k + f->nd, dims, NULL, NULL,
                                           0, NULL);
        if (!a) {
            Py_CLEAR(d);
            break;
        }
        unsigned char *dst = PyArray_DATA((PyArrayObject *)a);
        for (npy_intp r = 0; r < n; r++)
            memcpy(dst + (size_t)r * f->bytes, rows + (size_t)r * row_bytes + base + f->off,
                   f->bytes);
        if (PyDict_SetItem(d, f->name, a) < 0)
            Py_CLEAR(d);
        Py_DECREF(a);
    }
    return d;
}

/* ---- metadata ---------------------------------------------------------------- */

static int put(unsigned char *buf, size_t cap, size_t *used, const void *p, size_t n)
{
    if (*used + n > cap)
        return -1;
    memcpy(buf + *used, p, n);
    *used += n;
    return 0;
}

int exr_fieldset_meta_put(const exr_fieldset *fs, unsigned char *buf, size_t cap, size_t *used)
{
    unsigned char c = (unsigned char)fs->n;
    if (put(buf, cap, used, &c, 1) < 0)
        goto too_big;
    for (int i = 0; i < fs->n; i++) {
        const exr_named *f = &fs->f[i];
        Py_ssize_t len;
        const char *name = PyUnicode_AsUTF8AndSize(f->name, &len);
        if (!name)
            return -1;
        c = (unsigned char)len;
        if (put(buf, cap, used, &c, 1) < 0 || put(buf, cap, used, name, (size_t)len) < 0)
            goto too_big;
        c = (unsigned char)f->nd;
        if (put(buf, cap, used, &c, 1) < 0)
            goto too_big;
        for (int k = 0; k < f->nd; k++) {
            int64_t d = f->shape[k];
            if (put(buf, cap, used, &d, 8) < 0)
                goto too_big;
        }
        PyObject *str = PyObject_GetAttrString((PyObject *)f->descr, "str");
        if (!str)
            return -1;
        const char *s = PyUnicode_AsUTF8AndSize(str, &len);
        int bad = !s || len >= 32;
        c = (unsigned char)len;
        if (!bad)
            bad = put(buf, cap, used, &c, 1) < 0 || put(buf, cap, used, s, (size_t)len) < 0;
        Py_DECREF(str);
        if (bad) {
            if (PyErr_Occurred())
                return -1;
            goto too_big;
        }
    }
    return 0;
too_big:
    PyErr_SetString(PyExc_ValueError, "configuration too large to serialize (field specs)");
    return -1;
}

static int take(const unsigned char **p, size_t *left, void *out, size_t n)
{
    if (*left < n)
        return -1;
    memcpy(out, *p, n);
    *p += n;
    *left -= n;
    return 0;
}

exr_fieldset *exr_fieldset_meta_read(const unsigned char **p, size_t *left)
{
    unsigned char n;
    if (take(p, left, &n, 1) < 0 || n < 1 || n > EXR_MAX_FIELDS)
        return NULL;
    exr_fieldset *fs = PyMem_Calloc(1, sizeof *fs);
    if (!fs)
        return NULL;
    for (int i = 0; i < n; i++) {
        exr_named *f = &fs->f[i];
        unsigned char len, nd;
        char name[EXR_FIELD_NAME_MAX + 1], code[33];
        if (take(p, left, &len, 1) < 0 || len < 1 || len > EXR_FIELD_NAME_MAX ||
            take(p, left, name, len) < 0)
            goto bad;
        f->name = PyUnicode_DecodeUTF8(name, len, "strict");
        if (!f->name)
            goto bad;
        fs->n++;
        for (int j = 0; j < i; j++)
            if (PyUnicode_Compare(fs->f[j].name, f->name) == 0)
                goto bad; /* names are unique */
        if (take(p, left, &nd, 1) < 0 || nd > NPY_MAXDIMS - 2)
            goto bad;
        f->nd = nd;
        for (int k = 0; k < nd; k++) {
            int64_t d;
            if (take(p, left, &d, 8) < 0 || d < 1 || d > ((int64_t)1 << 40))
                goto bad;
            f->shape[k] = (npy_intp)d;
        }
        if (take(p, left, &len, 1) < 0 || len == 0 || len > 31 || take(p, left, code, len) < 0)
            goto bad;
        code[len] = 0;
        if (!strchr("<>|=", code[0]))
            goto bad;
        for (int k = 1; k < len; k++)
            if (!(code[k] >= '0' && code[k] <= '9') && !(code[k] >= 'a' && code[k] <= 'z'))
                goto bad;
        PyObject *s = PyUnicode_FromString(code);
        f->descr = s ? exr_dtype_arg(s, "dtype", 0) : NULL;
        Py_XDECREF(s);
        if (!f->descr)
            goto bad;
        size_t v = (size_t)PyDataType_ELSIZE(f->descr);
        for (int k = 0; k < nd; k++)
            if (!exr_mul_size(v, (size_t)f->shape[k], &v) || v > ((size_t)1 << 40))
                goto bad;
        f->bytes = v;
    }
    if (fieldset_finish(fs, "fields") < 0)
        goto bad;
    return fs;
bad:
    PyErr_Clear();
    exr_fieldset_free(fs);
    return NULL;
}

/* ---- the buffer's specs ------------------------------------------------------ */

int exr_replay_specs(ReplayObject *self, PyObject *sshape, PyObject *sdtype, PyObject *sspec,
                     PyObject *xspec)
{
    if (sspec != Py_None) {
        if ((sshape && sshape != Py_None) || sdtype) {
            PyErr_SetString(PyExc_TypeError, "state_spec: expected either state_spec or "
                                             "state_shape/state_dtype, got both");
            return -1;
        }
        if (!(self->sfields = exr_fieldset_from_spec(sspec, "state_spec")))
            return -1;
    } else if (!sshape || sshape == Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "state_shape: expected an int or a tuple of ints (or a state_spec), got None");
        return -1;
    } else if (PyDict_Check(sshape)) {
        PyErr_SetString(PyExc_TypeError,
                        "state_shape: expected an int or a tuple of ints, got dict (named fields "
                        "go in state_spec={name: (shape, dtype)})");
        return -1;
    }
    if (xspec != Py_None && !(self->xfields = exr_fieldset_from_spec(xspec, "extras_spec")))
        return -1;
    return 0;
}

PyObject *exr_replay_state_spec(ReplayObject *self, void *c)
{
    (void)c;
    if (!self->sfields)
        Py_RETURN_NONE;
    return exr_fieldset_spec(self->sfields);
}

PyObject *exr_replay_extras_spec(ReplayObject *self, void *c)
{
    (void)c;
    if (!self->xfields)
        Py_RETURN_NONE;
    return exr_fieldset_spec(self->xfields);
}

/* ---- record arguments -------------------------------------------------------- */

void exr_fields_in_release(ReplayObject *self, exr_fields_in *fi)
{
    (void)self;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < EXR_MAX_FIELDS; i++)
            Py_CLEAR(fi->arr[k][i]);
    PyMem_Free(fi->fin);
    fi->fin = NULL;
}

/* The state (fields or one array, nlead leading steps) into fi's plan. */
static int state_in(ReplayObject *self, PyObject *state, const char *sarg, int nlead, npy_intp *T,
                    exr_fields_in *fi)
{
    const exr_config *cfg = exr_buffer_config(self->buf);
    if (self->sfields) {
        if (exr_fieldset_arrays(self->sfields, state, sarg, nlead, T, fi->arr[0]) < 0)
            return -1;
        exr_fieldset_src_plan(self->sfields, 0, fi->arr[0], fi->plan);
        fi->nplan = (size_t)self->sfields->n;
        return 0;
    }
    fi->arr[0][0] = exr_as_array(state, self->state_descr, nlead, T, self->state_nd,
                                 self->state_shape, sarg);
    if (!fi->arr[0][0])
        return -1;
    fi->plan[0] = (exr_field_src){0, cfg->state_bytes, PyArray_DATA(fi->arr[0][0]),
                                  cfg->state_bytes};
    fi->nplan = 1;
    return 0;
}

/* final_state, packed into fi->fin. */
static int final_in(ReplayObject *self, PyObject *fin, exr_fields_in *fi)
{
    const exr_config *cfg = exr_buffer_config(self->buf);
    if (!(fi->fin = PyMem_Malloc(cfg->state_bytes))) {
        PyErr_NoMemory();
        return -1;
    }
    if (self->sfields) {
        if (exr_fieldset_arrays(self->sfields, fin, "final_state", 0, NULL, fi->arr[1]) < 0)
            return -1;
        exr_fieldset_pack(self->sfields, fi->arr[1], fi->fin);
        return 0;
    }
    fi->arr[1][0] = exr_as_array(fin, self->state_descr, 0, NULL, self->state_nd,
                                 self->state_shape, "final_state");
    if (!fi->arr[1][0])
        return -1;
    memcpy(fi->fin, PyArray_DATA(fi->arr[1][0]), cfg->state_bytes);
    return 0;
}

/* extras: None without an extras_spec, else the fields, into fi's plan. */
static int extras_in(ReplayObject *self, PyObject *extras, int nlead, npy_intp *T,
                     exr_fields_in *fi)
{
    int none = !extras || extras == Py_None;
    if (!self->xfields && none)
        return 0;
    if (!self->xfields) {
        PyObject *got = exr_describe_value(extras);
        if (got)
            PyErr_Format(PyExc_ValueError,
                         "extras: expected None (this buffer has no extras_spec), got %U", got);
        Py_XDECREF(got);
        return -1;
    }
    if (none) {
        PyErr_Format(PyExc_ValueError,
                     "extras: expected a dict of arrays with the fields %U, got None",
                     self->xfields->names);
        return -1;
    }
    if (exr_fieldset_arrays(self->xfields, extras, "extras", nlead, T, fi->arr[2]) < 0)
        return -1;
    const exr_config *cfg = exr_buffer_config(self->buf);
    size_t base = cfg->state_bytes + cfg->action_bytes + cfg->reward_bytes;
    exr_fieldset_src_plan(self->xfields, base, fi->arr[2], fi->plan + fi->nplan);
    fi->nplan += (size_t)self->xfields->n;
    return 0;
}

int exr_fields_in_parse(ReplayObject *self, PyObject *state, PyObject *fin, PyObject *extras,
                        npy_intp *T, exr_fields_in *fi)
{
    memset(fi, 0, sizeof *fi);
    int nlead = T ? 1 : 0;
    if (!self->xfields && extras && extras != Py_None)
        return extras_in(self, extras, nlead, T, fi); /* the error, before anything */
    if (state_in(self, state, T ? "states" : "state", nlead, T, fi) < 0)
        goto error;
    if (T && *T == 0) {
        PyErr_SetString(PyExc_ValueError, "states: expected at least one step, got 0");
        goto error;
    }
    if ((fin && fin != Py_None && final_in(self, fin, fi) < 0) ||
        extras_in(self, extras, nlead, T, fi) < 0)
        goto error;
    return 0;
error:
    exr_fields_in_release(self, fi);
    return -1;
}

int exr_fields_in_final(ReplayObject *self, PyObject *fin, exr_fields_in *fi)
{
    memset(fi, 0, sizeof *fi);
    if (final_in(self, fin, fi) == 0)
        return 0;
    exr_fields_in_release(self, fi);
    return -1;
}

/* ---- episode(h) ---------------------------------------------------------------- */

/* A copy of episode h's rows (and final state) taken under one lock hold,
 * with its counts; the caller frees rows and fin (PyMem_RawFree). */
typedef struct {
    unsigned char *rows, *fin;
    uint64_t n;
    bool ended, term, has_final;
} episode_copy;

static int episode_rows(ReplayObject *self, int64_t h, size_t row, episode_copy *ec)
{
    const exr_config *c = exr_buffer_config(self->buf);
    for (;;) {
        exr_lock_with_gil(self->buf);
        exr_status st = exr_buffer_episode_info_locked(self->buf, h, &ec->n, &ec->ended, &ec->term,
                                                       &ec->has_final);
        exr_buffer_unlock(self->buf);
        if (st != EXR_OK) {
            exr_unknown_episode(h, NULL);
            return -1;
        }
        size_t bytes;
        ec->rows = exr_mul_size((size_t)ec->n, row, &bytes) ? PyMem_RawMalloc(bytes ? bytes : 1)
                                                             : NULL;
        ec->fin = PyMem_RawMalloc(c->state_bytes);
        if (!ec->rows || !ec->fin) {
            PyMem_RawFree(ec->rows);
            PyMem_RawFree(ec->fin);
            PyErr_NoMemory();
            return -1;
        }
        /* copy under one lock hold, if the episode is still as measured */
        uint64_t n2;
        bool f2;
        exr_lock_with_gil(self->buf);
        st = exr_buffer_episode_info_locked(self->buf, h, &n2, &ec->ended, &ec->term, &f2);
        int same = st == EXR_OK && n2 == ec->n && f2 == ec->has_final;
        if (same)
            exr_buffer_episode_rows_locked(self->buf, h, ec->rows, ec->has_final ? ec->fin : NULL);
        exr_buffer_unlock(self->buf);
        if (same)
            return 0;
        PyMem_RawFree(ec->rows);
        PyMem_RawFree(ec->fin);
    }
}

/* Column [off, off + bytes) of n rows of `row` bytes into a new array. */
static PyObject *column_of(const unsigned char *rows, size_t row, size_t off, size_t bytes,
                           PyArray_Descr *d, npy_intp n, int nd, const npy_intp *shape)
{
    PyObject *a = new_array(d, n < 0 ? -1 : n, nd, shape);
    if (!a)
        return NULL;
    unsigned char *dst = PyArray_DATA((PyArrayObject *)a);
    for (npy_intp r = 0; r < (n < 0 ? 1 : n); r++)
        memcpy(dst + (size_t)r * bytes, rows + (size_t)r * row + off, bytes);
    return a;
}

/* EpisodeData of a copied episode: dicts where the buffer has fields. */
static PyObject *episode_data(ReplayObject *self, const episode_copy *ec, size_t row)
{
    const exr_config *c = exr_buffer_config(self->buf);
    size_t sb = c->state_bytes, ab = c->action_bytes, rb = c->reward_bytes;
    npy_intp nn = (npy_intp)ec->n;
    PyObject *v[7] = {NULL};
    if (self->sfields) {
        v[0] = exr_fieldset_split(self->sfields, ec->rows, row, 0, nn, 0);
        v[3] = ec->has_final ? exr_fieldset_split(self->sfields, ec->fin, sb, 0, 1, -1)
                             : Py_NewRef(Py_None);
    } else {
        v[0] = column_of(ec->rows, row, 0, sb, self->state_descr, nn, self->state_nd,
                         self->state_shape);
        v[3] = ec->has_final ? column_of(ec->fin, sb, 0, sb, self->state_descr, -1,
                                         self->state_nd, self->state_shape)
                             : Py_NewRef(Py_None);
    }
    v[1] = column_of(ec->rows, row, sb, ab, self->action_descr, nn, self->action_nd,
                     self->action_shape);
    v[2] = column_of(ec->rows, row, sb + ab, rb, self->reward_descr, nn, 0, NULL);
    v[4] = PyBool_FromLong(ec->ended);
    v[5] = PyBool_FromLong(ec->term);
    v[6] = self->xfields ? exr_fieldset_split(self->xfields, ec->rows, row, sb + ab + rb, nn, 0)
                         : PyDict_New();
    PyObject *r = NULL;
    int ok = 1;
    for (int i = 0; i < 7; i++)
        ok = ok && v[i];
    if (ok)
        r = PyStructSequence_New(mstate(self)->episode_type);
    for (int i = 0; i < 7; i++) {
        if (r)
            PyStructSequence_SET_ITEM(r, i, v[i]);
        else
            Py_XDECREF(v[i]);
    }
    return r;
}

PyObject *exr_replay_episode_fields(ReplayObject *self, int64_t h)
{
    const exr_config *c = exr_buffer_config(self->buf);
    size_t row = c->state_bytes + c->action_bytes + c->reward_bytes + c->extra_bytes;
    episode_copy ec;
    if (episode_rows(self, h, row, &ec) < 0)
        return NULL;
    PyObject *r = episode_data(self, &ec, row);
    PyMem_RawFree(ec.rows);
    PyMem_RawFree(ec.fin);
    return r;
}
