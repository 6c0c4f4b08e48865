/*
 * persist.c - serialize / unserialize / save / load and pickling: the
 * binding's half of docs/format.md. The core (codec*.c, file.c) writes and
 * validates the format; this file adds the Python-level metadata (shapes,
 * dtypes, whether the seed was given) as the META section, and turns bytes,
 * paths and errors into Python objects.
 */
#include "binding.h"

#include "args.h"

#include "codec.h"
#include "file.h"
#include "mem.h"
#include "named.h"

/* ---- metadata: what the Python object adds to the core's config ---------- */

typedef struct {
    unsigned char b[EXR_META_MAX];
    size_t n;
} meta_buf;

static int meta_put(meta_buf *m, const void *p, size_t n)
{
    if (m->n + n > sizeof m->b)
        return -1;
    memcpy(m->b + m->n, p, n);
    m->n += n;
    return 0;
}

static int meta_shape(meta_buf *m, int nd, const npy_intp *shape)
{
    unsigned char c = (unsigned char)nd;
    if (meta_put(m, &c, 1) < 0)
        return -1;
    for (int i = 0; i < nd; i++) {
        int64_t d = shape[i];
        if (meta_put(m, &d, 8) < 0)
            return -1;
    }
    return 0;
}

static int meta_dtype(meta_buf *m, PyArray_Descr *d)
{
    PyObject *str = PyObject_GetAttrString((PyObject *)d, "str");
    if (!str)
        return -1;
    Py_ssize_t n;
    const char *c = PyUnicode_AsUTF8AndSize(str, &n);
    int r = -1;
    if (c && n < 32) {
        unsigned char len = (unsigned char)n;
        r = meta_put(m, &len, 1) < 0 || meta_put(m, c, (size_t)n) < 0 ? -1 : 0;
    }
    Py_DECREF(str);
    if (r < 0 && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "dtype description too long to serialize");
    return r;
}

static int meta_of(ReplayObject *self, meta_buf *m)
{
    m->n = 0;
    /* version 2: named fields follow (docs/format.md) */
    unsigned char version = self->sfields || self->xfields ? 2 : 1,
                  seed_none = self->seed == Py_None;
    if (meta_put(m, &version, 1) < 0 || meta_shape(m, self->state_nd, self->state_shape) < 0 ||
        meta_shape(m, self->action_nd, self->action_shape) < 0 ||
        meta_dtype(m, self->state_descr) < 0 || meta_dtype(m, self->action_descr) < 0 ||
        meta_dtype(m, self->reward_descr) < 0 || meta_put(m, &seed_none, 1) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "configuration too large to serialize");
        return -1;
    }
    if (version == 2) {
        unsigned char flags = (self->sfields ? 1 : 0) | (self->xfields ? 2 : 0);
        if (meta_put(m, &flags, 1) < 0) {
            PyErr_SetString(PyExc_ValueError, "configuration too large to serialize");
            return -1;
        }
        if ((self->sfields && exr_fieldset_meta_put(self->sfields, m->b, sizeof m->b, &m->n) < 0) ||
            (self->xfields && exr_fieldset_meta_put(self->xfields, m->b, sizeof m->b, &m->n) < 0))
            return -1;
    }
    return 0;
}

typedef struct {
    const unsigned char *p;
    size_t left;
} meta_reader;

static int mr_take(meta_reader *r, void *out, size_t n)
{
    if (n > r->left)
        return -1;
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return 0;
}

static int mr_shape(meta_reader *r, int *nd, npy_intp *shape)
{
    unsigned char c;
    if (mr_take(r, &c, 1) < 0 || c > NPY_MAXDIMS - 2)
        return -1;
    *nd = c;
    for (int i = 0; i < c; i++) {
        int64_t d;
        if (mr_take(r, &d, 8) < 0 || d < 1 || d > ((int64_t)1 << 40))
            return -1;
        shape[i] = (npy_intp)d;
    }
    return 0;
}

/* A dtype from its .str; only plain "<f4"-like codes are accepted. */
static PyArray_Descr *mr_dtype(meta_reader *r, int reward)
{
    unsigned char len;
    char code[33];
    if (mr_take(r, &len, 1) < 0 || len == 0 || len > 31 || mr_take(r, code, len) < 0)
        return NULL;
    code[len] = 0;
    if (!strchr("<>|=", code[0]))
        return NULL;
    for (int i = 1; i < len; i++)
        if (!(code[i] >= '0' && code[i] <= '9') && !(code[i] >= 'a' && code[i] <= 'z'))
            return NULL;
    PyObject *s = PyUnicode_FromString(code);
    if (!s)
        return NULL;
    PyArray_Descr *d = exr_dtype_arg(s, "dtype", reward);
    Py_DECREF(s);
    PyErr_Clear();
    return d;
}

/* A new ExperienceReplay around core buffer b (taken over, freed on error). */
static PyObject *replay_from_core(PyTypeObject *type, exr_buffer *b, const unsigned char *meta,
                                  size_t meta_len)
{
    ReplayObject *self = (ReplayObject *)type->tp_alloc(type, 0);
    if (!self) {
        exr_buffer_free(b);
        return NULL;
    }
    self->buf = b;
    meta_reader r = {meta, meta_len};
    unsigned char version = 0, seed_none = 0;
    const exr_config *c = exr_buffer_config(b);
    size_t sb = 0, ab = 0;
    int ok = mr_take(&r, &version, 1) == 0 && (version == 1 || version == 2) &&
             mr_shape(&r, &self->state_nd, self->state_shape) == 0 &&
             mr_shape(&r, &self->action_nd, self->action_shape) == 0 &&
             (self->state_descr = mr_dtype(&r, 0)) != NULL &&
             (self->action_descr = mr_dtype(&r, 0)) != NULL &&
             (self->reward_descr = mr_dtype(&r, 1)) != NULL && mr_take(&r, &seed_none, 1) == 0 &&
             seed_none <= 1;
    if (ok && version == 2) {
        /* named fields: the state as packed bytes, and the extras */
        unsigned char flags;
        ok = mr_take(&r, &flags, 1) == 0 && flags >= 1 && flags <= 3;
        if (ok && (flags & 1))
            ok = (self->sfields = exr_fieldset_meta_read(&r.p, &r.left)) != NULL &&
                 self->state_nd == 1 && self->state_descr->type_num == NPY_UINT8 &&
                 (size_t)self->state_shape[0] == self->sfields->bytes;
        if (ok && (flags & 2))
            ok = (self->xfields = exr_fieldset_meta_read(&r.p, &r.left)) != NULL &&
                 self->xfields->bytes == c->extra_bytes;
    }
    ok = ok && r.left == 0 && (self->xfields || c->extra_bytes == 0);
    if (ok) {
        /* the metadata must describe the stored item sizes exactly */
        sb = (size_t)PyDataType_ELSIZE(self->state_descr);
        for (int i = 0; ok && i < self->state_nd; i++)
            ok = exr_mul_size(sb, (size_t)self->state_shape[i], &sb);
        ab = (size_t)PyDataType_ELSIZE(self->action_descr);
        for (int i = 0; ok && i < self->action_nd; i++)
            ok = exr_mul_size(ab, (size_t)self->action_shape[i], &ab);
        ok = ok && sb == c->state_bytes && ab == c->action_bytes &&
             (size_t)PyDataType_ELSIZE(self->reward_descr) == c->reward_bytes;
    }
    if (!ok) {
        Py_DECREF(self);
        PyErr_SetString(PyExc_ValueError,
                        "data: invalid serialized buffer (its metadata does not describe it)");
        return NULL;
    }
    self->eviction = c->eviction;
    self->capacity = c->capacity ? PyLong_FromUnsignedLongLong(c->capacity) : Py_NewRef(Py_None);
    self->seed = seed_none ? Py_NewRef(Py_None) : PyLong_FromUnsignedLongLong(c->seed);
    if (!self->capacity || !self->seed) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* A failed unserialize/load: arg is "data" or "path". */
static PyObject *raise_read(exr_status st, int err, const char *op, const char *arg,
                            PyObject *path)
{
    return exr_raise_status(st, &(exr_errctx){.op = op, .arg = arg,
                                              .got = st == EXR_ENOMEM ? "while reading the serialized buffer" : NULL,
                                              .handle = -1, .err = err, .path = path});
}

/* ---- serialize / unserialize ---------------------------------------------- */

static int level_arg(PyObject *o, int *level)
{
    if (!o) {
        *level = 6;
        return 0;
    }
    int64_t v;
    if (exr_int_arg(o, "level", "an int from 0 to 9", 0, 9, &v) < 0)
        return -1;
    *level = (int)v;
    return 0;
}

/* bytes of serialize(level); the buffer's lock is held while it is made. */
static PyObject *serialize_bytes(ReplayObject *self, int level)
{
    meta_buf meta;
    if (meta_of(self, &meta) < 0)
        return NULL;
    exr_lock_published_with_gil(self->buf);
    uint64_t bound = exr_codec_bound(exr_codec_raw_size_locked(self->buf, meta.n), level);
    if (bound > (uint64_t)PY_SSIZE_T_MAX) {
        exr_buffer_unlock(self->buf);
        return PyErr_Format(PyExc_MemoryError,
                            "serialize: %llu bytes would exceed the largest bytes object",
                            (unsigned long long)bound);
    }
    /* made while the lock is held, so the size cannot change before writing */
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)bound);
    if (!bytes) {
        exr_buffer_unlock(self->buf);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(bytes);
    /* Not written yet: faulted in by the copy below, 2 MiB at a time if the
     * kernel takes the advice (docs/format.md, "Writing"). From 32 MiB
     * only, glibc's largest mmap threshold: such a bytes object has its
     * own mapping, so the advice never splits the heap's. */
    if (bound >= ((uint64_t)32 << 20))
        exr_advise_huge(out, (size_t)bound);
    exr_mem_sink m = {out + EXR_HEADER_BYTES, (size_t)bound - EXR_HEADER_BYTES, 0};
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_codec_write_locked(self->buf, meta.b, meta.n, level, exr_mem_sink_write, &m, NULL, NULL, out);
    exr_buffer_unlock(self->buf);
    EXR_NOGIL_END
    if (st != EXR_OK) {
        Py_DECREF(bytes);
        return exr_raise(st, "serialize");
    }
    if (_PyBytes_Resize(&bytes, (Py_ssize_t)(EXR_HEADER_BYTES + m.used)) < 0)
        return NULL;
    return bytes;
}

PyObject *exr_replay_serialize(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"level"};
    PyObject *a[1];
    int level;
    if (exr_parse_args(args, nargs, kwnames, "serialize", names, 0, 1, a) < 0 ||
        level_arg(a[0], &level) < 0)
        return NULL;
    return serialize_bytes(self, level);
}

typedef struct {
    const unsigned char *p;
    size_t left;
} mem_source;

static exr_status source_mem(void *ctx, void *p, size_t cap, size_t *got)
{
    mem_source *m = ctx;
    size_t n = cap < m->left ? cap : m->left;
    memcpy(p, m->p, n);
    m->p += n;
    m->left -= n;
    *got = n;
    return EXR_OK;
}

static PyObject *unserialize_as(PyTypeObject *type, PyObject *data)
{
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        /* a strided view (memoryview(b)[::2]) has a buffer, but no simple one */
        int strided = PyObject_CheckBuffer(data);
        return PyErr_Format(PyExc_TypeError, "data: expected a %sbytes-like object, got %s%s",
                            strided ? "C-contiguous " : "", strided ? "a non-contiguous " : "",
                            Py_TYPE(data)->tp_name);
    }
    exr_buffer *b = NULL;
    unsigned char *meta = PyMem_RawMalloc(EXR_META_MAX);
    size_t meta_len = 0;
    exr_status st = EXR_ENOMEM;
    if (meta) {
        EXR_NOGIL_BEGIN
        /* the caller's bytes may change meanwhile (a bytearray another thread
         * writes): the header is read once, into h, and only h is used */
        exr_codec_header h;
        const unsigned char *p = view.buf;
        if ((size_t)view.len < EXR_HEADER_BYTES) {
            st = EXR_ECORRUPT;
        } else {
            st = exr_codec_check_header(p, (uint64_t)view.len, &h);
            mem_source src = {p + EXR_HEADER_BYTES, (size_t)view.len - EXR_HEADER_BYTES};
            if (st == EXR_OK)
                st = exr_codec_read(&h, source_mem, &src, &b, meta, &meta_len);
        }
        exr_collapse_queued_nogil();
        EXR_NOGIL_END
    }
    PyBuffer_Release(&view);
    PyObject *r = st == EXR_OK ? replay_from_core(type, b, meta, meta_len)
                               : raise_read(st, 0, "unserialize", "data", NULL);
    PyMem_RawFree(meta);
    return r;
}

PyObject *exr_replay_unserialize_cls(PyObject *cls, PyObject *data)
{
    return unserialize_as((PyTypeObject *)cls, data);
}

PyObject *exr_unserialize(PyObject *module, PyObject *data)
{
    exr_modstate *st = PyModule_GetState(module);
    return unserialize_as(st->replay_type, data);
}

/* ---- save / load ---------------------------------------------------------- */

typedef struct {
    ReplayObject *self;
    PyObject *callback;
    int failed;
} progress_ctx;

static int progress_call(void *ctx, uint64_t done, uint64_t total)
{
    progress_ctx *p = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    p->self->busy_thread = PyThread_get_thread_ident();
    PyObject *r = PyObject_CallFunction(p->callback, "KK", (unsigned long long)done,
                                        (unsigned long long)total);
    p->self->busy_thread = 0;
    if (!r) {
        p->failed = 1; /* the exception stays set for the caller */
    } else {
        Py_DECREF(r);
    }
    PyGILState_Release(g);
    return p->failed;
}

PyObject *exr_replay_save(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"path", "level", "progress"};
    PyObject *a[3], *path = NULL;
    int level;
    if (exr_parse_args(args, nargs, kwnames, "save", names, 1, 3, a) < 0 ||
        level_arg(a[1], &level) < 0)
        return NULL;
    PyObject *cb = a[2] && a[2] != Py_None ? a[2] : NULL;
    if (cb && !PyCallable_Check(cb))
        return PyErr_Format(PyExc_TypeError, "progress: expected a callable or None, got %s",
                            Py_TYPE(cb)->tp_name);
    if (exr_path_arg(a[0], "path", &path) < 0)
        return NULL;
    meta_buf meta;
    if (meta_of(self, &meta) < 0) {
        Py_DECREF(path);
        return NULL;
    }
    progress_ctx pc = {self, cb, 0};
    int err = 0;
    exr_status st;
    const char *cpath = PyBytes_AS_STRING(path);
    exr_lock_published_with_gil(self->buf);
    EXR_NOGIL_BEGIN
    st = exr_file_save_locked(self->buf, meta.b, meta.n, level, cpath, cb ? progress_call : NULL,
                              &pc, &err);
    exr_buffer_unlock(self->buf);
    EXR_NOGIL_END
    if (pc.failed) {
        Py_DECREF(path);
        return NULL; /* the callback's exception */
    }
    Py_DECREF(path);
    if (st != EXR_OK)
        return exr_raise_status(st, &(exr_errctx){.op = "save", .handle = -1, .err = err,
                                                  .path = a[0]});
    Py_RETURN_NONE;
}

PyObject *exr_replay_load_cls(PyObject *cls, PyObject *pathobj)
{
    PyObject *path = NULL;
    if (exr_path_arg(pathobj, "path", &path) < 0)
        return NULL;
    unsigned char *meta = PyMem_RawMalloc(EXR_META_MAX);
    if (!meta) {
        Py_DECREF(path);
        return exr_raise(EXR_ENOMEM, "load");
    }
    exr_buffer *b = NULL;
    size_t meta_len = 0;
    int err = 0;
    exr_status st;
    const char *cpath = PyBytes_AS_STRING(path);
    EXR_NOGIL_BEGIN
    st = exr_file_load(cpath, &b, meta, &meta_len, &err);
    exr_collapse_queued_nogil();
    EXR_NOGIL_END
    Py_DECREF(path);
    PyObject *r = st == EXR_OK ? replay_from_core((PyTypeObject *)cls, b, meta, meta_len)
                               : raise_read(st, err, "load", "path", pathobj);
    PyMem_RawFree(meta);
    return r;
}

/* ---- pickling --------------------------------------------------------------- */

PyObject *exr_replay_reduce_ex(ReplayObject *self, PyObject *protocol)
{
    EXR_GUARD(self, NULL);
    long proto = PyLong_AsLong(protocol);
    if (proto == -1 && PyErr_Occurred())
        return NULL;
    /* stored, not compressed: pickling is for moving a buffer (Ray's object
     * store), where time matters more than bytes */
    PyObject *data = serialize_bytes(self, 0);
    if (!data)
        return NULL;
    if (proto >= 5) {
        PyObject *pb = PyPickleBuffer_FromObject(data);
        Py_DECREF(data);
        if (!pb)
            return NULL;
        data = pb;
    }
    PyObject *mod = PyType_GetModule(Py_TYPE(self));
    PyObject *fn = mod ? PyObject_GetAttrString(mod, "unserialize") : NULL;
    if (!fn) {
        Py_DECREF(data);
        return NULL;
    }
    return Py_BuildValue("(N(N))", fn, data);
}
