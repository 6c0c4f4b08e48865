/*
 * log_merge.c - _core._LogMerge, the Python face of the k-way merge of
 * experience logs (src/core/log_merge.h), and _core._NewFile, the file it
 * writes (src/core/file.h). Private: exreplay/log.py's merge reads and
 * checks the inputs' chunk headers, pushes them, and runs it.
 */
#include "binding.h"

#include <errno.h>

#include "file.h"
#include "log.h"
#include "log_merge.h"

typedef struct {
    PyObject_HEAD
    exr_merge *m;
    int busy; /* run() is merging without the GIL: no other call meanwhile */
} MergeObject;

static int check_idle(MergeObject *self)
{
    if (!self->m) {
        PyErr_SetString(PyExc_ValueError, "_LogMerge: closed");
        return -1;
    }
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_LogMerge: run() is in progress in another thread");
        return -1;
    }
    return 0;
}

static PyObject *merge_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"inputs", "row", "state_bytes", "chunk_bytes", "level", "fd",
                             "threads", NULL};
    Py_ssize_t nin, row, sb, chunk;
    int level, fd, threads;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "nnnniii:_LogMerge", kwlist, &nin, &row, &sb,
                                     &chunk, &level, &fd, &threads))
        return NULL;
    if (nin < 1 || row < 1 || sb < 1 || sb > row || chunk < 1 || level < 0 || level > 9 ||
        fd < 0 || threads < 0 || threads > EXR_MERGE_MAX_THREADS) {
        PyErr_Format(PyExc_ValueError,
                     "_LogMerge: expected inputs >= 1, 1 <= state_bytes <= row, chunk_bytes >= 1, "
                     "level 0-9, fd >= 0, threads 0-%d", EXR_MERGE_MAX_THREADS);
        return NULL;
    }
    MergeObject *self = (MergeObject *)tp->tp_alloc(tp, 0);
    if (!self)
        return NULL;
    exr_status st = exr_merge_new((size_t)nin, (size_t)row, (size_t)sb, (size_t)chunk, level, fd,
                                  threads, &self->m);
    if (st != EXR_OK) {
        Py_DECREF(self);
        return exr_raise(st, "_LogMerge");
    }
    return (PyObject *)self;
}

/* Frees the core merge (its worker threads are joined without the GIL). */
static void merge_release(MergeObject *self)
{
    if (self->m) {
        exr_merge *m = self->m;
        self->m = NULL;
        EXR_NOGIL_BEGIN
        exr_merge_free(m);
        EXR_NOGIL_END
    }
}

static void merge_dealloc(MergeObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    merge_release(self);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static PyObject *merge_close(MergeObject *self, PyObject *unused)
{
    (void)unused;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "_LogMerge: run() is in progress in another thread");
        return NULL;
    }
    merge_release(self);
    Py_RETURN_NONE;
}

/* push(i, fd, body_off, tag, codec, count, source, body_crc, first, last, raw_len, body_len,
 *      kind=1) */
static PyObject *merge_push(MergeObject *self, PyObject *args)
{
    Py_ssize_t i;
    exr_merge_chunk c;
    unsigned long long off, tag, raw, blen;
    unsigned int codec, count, source, crc, kind = EXR_LOG_KIND_RECORDS;
    long long first, last;
    if (!PyArg_ParseTuple(args, "niKKIIIILLKK|I:push", &i, &c.fd, &off, &tag, &codec, &count,
                          &source, &crc, &first, &last, &raw, &blen, &kind))
        return NULL;
    c.kind = kind;
    if (check_idle(self) < 0)
        return NULL;
    c.body_off = off;
    c.tag = tag;
    c.codec = codec;
    c.count = count;
    c.source = source;
    c.body_crc = crc;
    c.first = first;
    c.last = last;
    c.raw_len = raw;
    c.body_len = blen;
    if (i < 0 || exr_merge_push(self->m, (size_t)i, &c) != EXR_OK) {
        PyErr_SetString(PyExc_ValueError,
                        "push: expected an input with room for a chunk, and a chunk of >= 1 "
                        "records whose raw and body lengths fit its count and codec "
                        "(docs/log.md), got another");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *merge_end(MergeObject *self, PyObject *arg)
{
    Py_ssize_t i = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (check_idle(self) < 0)
        return NULL;
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "end: expected an input index >= 0");
        return NULL;
    }
    exr_merge_end(self->m, (size_t)i);
    Py_RETURN_NONE;
}

/* run() -> index of the input that needs a chunk, -1 when done, or -2
 * when an input's chunk is invalid (error() says which and why). */
static PyObject *merge_run(MergeObject *self, PyObject *unused)
{
    (void)unused;
    if (check_idle(self) < 0)
        return NULL;
    long need = -1;
    exr_status st;
    self->busy = 1;
    EXR_NOGIL_BEGIN
    st = exr_merge_run(self->m, &need);
    EXR_NOGIL_END
    self->busy = 0;
    if (st == EXR_ECORRUPT)
        return PyLong_FromLong(-2);
    if (st != EXR_OK) {
        const exr_merge_error *e = exr_merge_last_error(self->m);
        return exr_raise_status(st, &(exr_errctx){.op = "merge", .handle = -1, .err = e->errnum});
    }
    return PyLong_FromLong(need);
}

/* error() -> (input, tag, what) of the failure, or None; input is -1 for
 * a failed write of the output. */
static PyObject *merge_error(MergeObject *self, PyObject *unused)
{
    (void)unused;
    if (check_idle(self) < 0)
        return NULL;
    const exr_merge_error *e = exr_merge_last_error(self->m);
    if (e->st == EXR_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("nKs", (Py_ssize_t)e->input, (unsigned long long)e->tag, e->what);
}

/* result() -> (records, chunks, last timestamp) written. */
static PyObject *merge_result(MergeObject *self, PyObject *unused)
{
    (void)unused;
    if (check_idle(self) < 0)
        return NULL;
    uint64_t r, c;
    int64_t t;
    exr_merge_result(self->m, &r, &c, &t);
    return Py_BuildValue("KKL", (unsigned long long)r, (unsigned long long)c, (long long)t);
}

static PyMethodDef merge_methods[] = {
    {"push", (PyCFunction)merge_push, METH_VARARGS, "Queues a checked chunk of an input."},
    {"end", (PyCFunction)merge_end, METH_O, "The input has no more chunks."},
    {"run", (PyCFunction)merge_run, METH_NOARGS,
     "Merges (without the GIL) until an input needs a chunk (its index), all is written (-1)\n"
     "or an input's chunk is invalid (-2, see error())."},
    {"error", (PyCFunction)merge_error, METH_NOARGS, "(input, tag, what) of an invalid chunk."},
    {"result", (PyCFunction)merge_result, METH_NOARGS, "(records, chunks, last timestamp)."},
    {"close", (PyCFunction)merge_close, METH_NOARGS, "Stops the threads and frees."},
    {NULL},
};

static PyType_Slot merge_slots[] = {
    {Py_tp_new, merge_new},
    {Py_tp_dealloc, merge_dealloc},
    {Py_tp_methods, merge_methods},
    {Py_tp_doc,
     "_LogMerge(inputs, row, state_bytes, chunk_bytes, level, fd, threads)\n--\n\n"
     "The k-way merge of experience logs behind exreplay.log.merge (docs/log.md)."},
    {0, NULL},
};

static PyType_Spec merge_spec = {
    .name = "exreplay._core._LogMerge",
    .basicsize = sizeof(MergeObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = merge_slots,
};

/* ---- _NewFile: a new file, named only once complete ----------------------- */

typedef struct {
    PyObject_HEAD
    exr_tmpfile t;
    int open;       /* neither published nor discarded */
    PyObject *path; /* as given: the OSErrors name it */
} NewFileObject;

static PyObject *newfile_raise(NewFileObject *self, exr_status st, int err)
{
    return exr_raise_status(st, &(exr_errctx){.op = "merge", .arg = "output", .handle = -1,
                                              .err = err, .path = self->path});
}

static PyObject *newfile_new(PyTypeObject *tp, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path", "replace", NULL};
    PyObject *pathobj, *bytes = NULL;
    int replace = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|p:_NewFile", kwlist, &pathobj, &replace) ||
        !PyUnicode_FSConverter(pathobj, &bytes))
        return NULL;
    NewFileObject *self = (NewFileObject *)tp->tp_alloc(tp, 0);
    if (!self) {
        Py_DECREF(bytes);
        return NULL;
    }
    self->t.fd = -1;
    self->path = Py_NewRef(pathobj);
    int err = 0;
    exr_status st;
    const char *path = PyBytes_AS_STRING(bytes);
    EXR_NOGIL_BEGIN /* it sweeps the directory */
    st = exr_tmpfile_open(&self->t, path, replace != 0, &err);
    EXR_NOGIL_END
    Py_DECREF(bytes);
    if (st == EXR_EIO && err == EEXIST && !replace)
        exr_raise_status(st, &(exr_errctx){.op = "merge", .arg = "output",
                                           .expected = "a path that does not exist (or "
                                                       "overwrite=True to replace it)",
                                           .got = "one that exists", .handle = -1,
                                           .err = EEXIST, .path = self->path});
    else if (st != EXR_OK)
        newfile_raise(self, st, err);
    if (st != EXR_OK) {
        Py_DECREF(self);
        return NULL;
    }
    self->open = 1;
    return (PyObject *)self;
}

static void newfile_dealloc(NewFileObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->open)
        exr_tmpfile_discard(&self->t);
    Py_XDECREF(self->path);
    tp->tp_free((PyObject *)self);
    Py_DECREF(tp);
}

static int newfile_check_open(NewFileObject *self)
{
    if (self->open)
        return 0;
    PyErr_SetString(PyExc_ValueError, "_NewFile: published or discarded already");
    return -1;
}

static PyObject *newfile_fileno(NewFileObject *self, PyObject *unused)
{
    (void)unused;
    return newfile_check_open(self) < 0 ? NULL : PyLong_FromLong(self->t.fd);
}

static PyObject *newfile_publish(NewFileObject *self, PyObject *unused)
{
    (void)unused;
    if (newfile_check_open(self) < 0)
        return NULL;
    self->open = 0;
    int err = 0;
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_tmpfile_publish(&self->t, &err);
    EXR_NOGIL_END
    if (st != EXR_OK)
        return newfile_raise(self, st, err);
    Py_RETURN_NONE;
}

static PyObject *newfile_discard(NewFileObject *self, PyObject *unused)
{
    (void)unused;
    if (self->open) {
        self->open = 0;
        exr_tmpfile_discard(&self->t);
    }
    Py_RETURN_NONE;
}

static PyMethodDef newfile_methods[] = {
    {"fileno", (PyCFunction)newfile_fileno, METH_NOARGS, "The descriptor to write the file with."},
    {"publish", (PyCFunction)newfile_publish, METH_NOARGS,
     "fsync, then the file gets its name (FileExistsError if something has it by now; with\n"
     "replace, a rename over what is there), then fsync of the directory; on an OSError\n"
     "nothing is left at the name or in its place (with replace, the old file stays, unless\n"
     "only the directory's fsync failed: the new file is then in place)."},
    {"discard", (PyCFunction)newfile_discard, METH_NOARGS,
     "Closes and removes the file (nothing if published or discarded already)."},
    {NULL},
};

static PyType_Slot newfile_slots[] = {
    {Py_tp_new, newfile_new},
    {Py_tp_dealloc, newfile_dealloc},
    {Py_tp_methods, newfile_methods},
    {Py_tp_doc,
     "_NewFile(path, replace=False)\n--\n\n"
     "A new file for path (FileExistsError if something is there), written under a temp name\n"
     "in path's directory, or none (O_TMPFILE), and named path by publish() once complete\n"
     "(docs/log.md, \"Merging\"); discard() or dropping it unpublished removes it.\n"
     "replace=True: what is at path is replaced as save() replaces it (its symbolic links\n"
     "followed, the temp file in the target's directory, a rename over the target)."},
    {0, NULL},
};

static PyType_Spec newfile_spec = {
    .name = "exreplay._core._NewFile",
    .basicsize = sizeof(NewFileObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = newfile_slots,
};

/* _adler32(data, value=1): exr_adler32, for the tests (against zlib.adler32). */
static PyObject *adler32_py(PyObject *mod, PyObject *args)
{
    (void)mod;
    Py_buffer b;
    unsigned int v = 1;
    if (!PyArg_ParseTuple(args, "y*|I:_adler32", &b, &v))
        return NULL;
    uint32_t r;
    EXR_NOGIL_BEGIN
    r = exr_adler32(v, b.buf, (size_t)b.len);
    EXR_NOGIL_END
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLong(r);
}

static PyMethodDef merge_functions[] = {
    {"_adler32", adler32_py, METH_VARARGS, "Adler-32 as the log merge computes it (a test hook)."},
    {NULL},
};

static int add_type(PyObject *m, PyType_Spec *spec, const char *name)
{
    PyObject *t = PyType_FromModuleAndSpec(m, spec, NULL);
    if (!t)
        return -1;
    int r = PyModule_AddObjectRef(m, name, t);
    Py_DECREF(t);
    return r;
}

int exr_log_merge_init_type(PyObject *m)
{
    if (PyModule_AddFunctions(m, merge_functions) < 0 ||
        add_type(m, &newfile_spec, "_NewFile") < 0)
        return -1;
    return add_type(m, &merge_spec, "_LogMerge");
}
