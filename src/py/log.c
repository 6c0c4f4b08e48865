/*
 * log.c - ExperienceLog: the Python face of the experience log writer
 * (src/core/log.h, docs/log.md), and what ExperienceReplay needs to log
 * into one (attach_log, detach_log, from_log, ingest).
 */
#include "binding.h"

#include <errno.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "log.h"
#include "named.h"

typedef struct {
    PyObject_HEAD
    exr_log *lg;
    PyObject *path;
    PyArray_Descr *state_descr, *action_descr, *reward_descr; /* NULL until the schema */
    int state_nd, action_nd;
    npy_intp state_shape[NPY_MAXDIMS], action_shape[NPY_MAXDIMS];
    PyObject *owner; /* the ExperienceReplay attached to (borrowed), or NULL */
    PyObject *leaving; /* the one being detached without the GIL (borrowed), or NULL */
    PyObject *fields; /* (state_spec, extras_spec) of the buffer it took its schema from */
} LogObject;

static PyTypeObject *log_type(PyObject *any)
{
    exr_modstate *st = exr_state_of_type(Py_TYPE(any));
    return st ? st->log_type : NULL;
}

/* A failed log operation op on the log at path (EXR_EIO: errno says why). */
static PyObject *log_error(exr_status st, const char *op, PyObject *path)
{
    return exr_raise_status(st, &(exr_errctx){.op = op, .handle = -1, .path = path});
}

/* EXR_EINVAL of a log that was closed (or given another layout) meanwhile. */
static PyObject *log_state_error(exr_status st, const char *op, const char *expected,
                                 const char *got)
{
    return exr_raise_status(st, &(exr_errctx){.op = op, .arg = "log", .expected = expected,
                                              .got = got, .handle = -1});
}

/* ---- schema ---------------------------------------------------------------- */

static size_t nbytes_of(PyArray_Descr *d, int nd, const npy_intp *shape)
{
    size_t v = (size_t)PyDataType_ELSIZE(d);
    for (int i = 0; i < nd; i++)
        if (!exr_mul_size(v, (size_t)shape[i], &v) || v > ((size_t)1 << 40))
            return 0;
    return v;
}

/* {"state": {"dtype": "<f4", "shape": [4]}, "action": ..., "reward": ...} */
static int field_json(char *buf, size_t cap, size_t *len, const char *name, PyArray_Descr *d,
                      int nd, const npy_intp *shape, int last)
{
    PyObject *s = PyObject_GetAttrString((PyObject *)d, "str");
    if (!s)
        return -1;
    const char *ds = PyUnicode_AsUTF8(s);
    if (!ds) {
        Py_DECREF(s);
        return -1;
    }
    int w = snprintf(buf + *len, cap - *len, "\"%s\": {\"dtype\": \"%s\", \"shape\": [", name, ds);
    Py_DECREF(s);
    if (w < 0 || (size_t)w >= cap - *len)
        goto full;
    *len += (size_t)w;
    for (int i = 0; i < nd; i++) {
        w = snprintf(buf + *len, cap - *len, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (w < 0 || (size_t)w >= cap - *len)
            goto full;
        *len += (size_t)w;
    }
    w = snprintf(buf + *len, cap - *len, "]}%s", last ? "}" : ", ");
    if (w < 0 || (size_t)w >= cap - *len)
        goto full;
    *len += (size_t)w;
    return 0;
full:
    PyErr_SetString(PyExc_ValueError, "schema: too long");
    return -1;
}

/* Fixes the log's schema (descrs are borrowed and get new references). */
/* ', "state_fields": [...], "extras": [...]' of a buffer's field sets
 * (either may be NULL), JSON by Python's json module (names are any str):
 * each field's name, dtype, shape and offset in its part of the row. */
static int fields_json(const exr_fieldset *sf, const exr_fieldset *xf, char *buf, size_t cap,
                       size_t *len)
{
    PyObject *d = PyDict_New(), *js = NULL;
    const exr_fieldset *sets[2] = {sf, xf};
    const char *keys[2] = {"state_fields", "extras"}, *specs[2] = {"state_spec", "extras_spec"};
    for (int k = 0; d && k < 2; k++) {
        if (!sets[k])
            continue;
        PyObject *lst = PyList_New(0);
        for (int i = 0; lst && i < sets[k]->n; i++) {
            const exr_named *f = &sets[k]->f[i];
            if (f->nd > EXR_LOG_MAX_DIMS) {
                PyErr_Format(PyExc_ValueError, "%s[%R]: expected at most %d dimensions in a log "
                             "(what its readers take), got %d", specs[k], f->name,
                             EXR_LOG_MAX_DIMS, f->nd);
                Py_CLEAR(lst);
                break;
            }
            PyObject *shape = PyList_New(f->nd);
            for (int j = 0; shape && j < f->nd; j++)
                PyList_SET_ITEM(shape, j, PyLong_FromSsize_t(f->shape[j]));
            PyObject *ds = PyObject_GetAttrString((PyObject *)f->descr, "str");
            PyObject *e = shape && ds ? Py_BuildValue("{sOsOsOsn}", "name", f->name, "dtype", ds,
                                                      "shape", shape, "offset", (Py_ssize_t)f->off)
                                      : NULL;
            Py_XDECREF(shape);
            Py_XDECREF(ds);
            if (!e || PyList_Append(lst, e) < 0)
                Py_CLEAR(lst);
            Py_XDECREF(e);
        }
        if (!lst || PyDict_SetItemString(d, keys[k], lst) < 0)
            Py_CLEAR(d);
        Py_XDECREF(lst);
    }
    PyObject *json = d ? PyImport_ImportModule("json") : NULL;
    if (json)
        js = PyObject_CallMethod(json, "dumps", "O", d);
    Py_XDECREF(json);
    Py_XDECREF(d);
    Py_ssize_t n;
    const char *u = js ? PyUnicode_AsUTF8AndSize(js, &n) : NULL;
    int ok = u && n >= 2 && (size_t)n + 1 <= cap - *len; /* '{...}' -> ', ...}' */
    if (ok) {
        memcpy(buf + *len, ", ", 2);
        memcpy(buf + *len + 2, u + 1, (size_t)n - 1);
        *len += (size_t)n + 1;
    } else if (u) {
        PyErr_SetString(PyExc_ValueError, "schema: the fields' description is too long for a log");
    }
    Py_XDECREF(js);
    return ok ? 0 : -1;
}

typedef struct {
    char js[EXR_LOG_MAX_SCHEMA];
    size_t len, sb, ab, rb, xb;
} schema_t;

/* A record layout's sizes, checked, and its schema (docs/log.md), into *o:
 * everything set_schema does but write. */
static int schema_of(PyArray_Descr *sd, int snd, const npy_intp *ss, PyArray_Descr *ad, int and_,
                     const npy_intp *as, PyArray_Descr *rd, const exr_fieldset *sf,
                     const exr_fieldset *xf, schema_t *o)
{
    if (snd > EXR_LOG_MAX_DIMS || and_ > EXR_LOG_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most %d dimensions in a log (what its "
                     "readers take), got %d", snd > EXR_LOG_MAX_DIMS ? "state_shape" : "action_shape",
                     EXR_LOG_MAX_DIMS, snd > EXR_LOG_MAX_DIMS ? snd : and_);
        return -1;
    }
    size_t sb = nbytes_of(sd, snd, ss), ab = nbytes_of(ad, and_, as),
           rb = (size_t)PyDataType_ELSIZE(rd);
    if (!sb || (!ab && PyDataType_ELSIZE(ad))) {
        PyErr_SetString(PyExc_ValueError, "state_shape: one item would take more than 1 TiB");
        return -1;
    }
    size_t xb = xf ? xf->bytes : 0;
    if (!exr_log_row_fits(sb, ab, rb, xb)) {
        PyErr_Format(PyExc_ValueError,
                     "state_shape: expected a record that a log chunk holds with its final "
                     "state (2 * state + action + reward + extras <= %zu bytes), got a state "
                     "of %zu bytes, an action of %zu, a reward of %zu and extras of %zu",
                     (size_t)(EXR_LOG_MAX_CHUNK - EXR_LOG_META_BYTES), sb, ab, rb, xb);
        return -1;
    }
    char *js = o->js;
    size_t len = 0;
    js[len++] = '{';
    if (field_json(js, sizeof o->js, &len, "state", sd, snd, ss, 0) < 0 ||
        field_json(js, sizeof o->js, &len, "action", ad, and_, as, 0) < 0 ||
        field_json(js, sizeof o->js, &len, "reward", rd, 0, NULL, 1) < 0)
        return -1;
    if (sf || xf) {
        len--; /* reopen the object for the fields */
        if (fields_json(sf, xf, js, sizeof o->js, &len) < 0)
            return -1;
    }
    o->len = len;
    o->sb = sb;
    o->ab = ab;
    o->rb = rb;
    o->xb = xb;
    return 0;
}

static int set_schema(LogObject *self, PyArray_Descr *sd, int snd, const npy_intp *ss,
                      PyArray_Descr *ad, int and_, const npy_intp *as, PyArray_Descr *rd,
                      const exr_fieldset *sf, const exr_fieldset *xf)
{
    schema_t m;
    if (schema_of(sd, snd, ss, ad, and_, as, rd, sf, xf, &m) < 0)
        return -1;
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_log_set_schema(self->lg, m.js, m.len, m.sb, m.ab, m.rb, m.xb);
    EXR_NOGIL_END
    if (st != EXR_OK) {
        if (st == EXR_EINVAL)
            log_state_error(st, "log", "an open log whose record layout is this one or unset",
                            "one closed, or with another record layout");
        else
            log_error(st, "log", self->path);
        return -1;
    }
    /* XSETREF: two attaches of one log in two threads may both get here
     * (the GIL is let go above), with the same layout */
    Py_XSETREF(self->state_descr, (PyArray_Descr *)Py_NewRef(sd));
    Py_XSETREF(self->action_descr, (PyArray_Descr *)Py_NewRef(ad));
    Py_XSETREF(self->reward_descr, (PyArray_Descr *)Py_NewRef(rd));
    self->state_nd = snd;
    self->action_nd = and_;
    memcpy(self->state_shape, ss, (size_t)snd * sizeof *ss);
    memcpy(self->action_shape, as, (size_t)and_ * sizeof *as);
    return 0;
}

/* ---- the type ---------------------------------------------------------------- */

/* An int in [lo, hi] (the binding's one integer helper, args.h). */
static int bounded_size(PyObject *o, const char *name, size_t lo, size_t hi, size_t *out)
{
    char want[96];
    snprintf(want, sizeof want, "an int from %zu to %zu", lo, hi);
    uint64_t v;
    if (exr_uint_arg(o, name, want, hi, &v) < 0)
        return -1;
    if (v < lo) {
        PyErr_Format(PyExc_ValueError, "%s: expected %s, got %llu", name, want,
                     (unsigned long long)v);
        return -1;
    }
    *out = (size_t)v;
    return 0;
}

/* flush_interval: None (never on a timer), absent (1 s) or seconds in (0, 1e6]. */
static int flush_arg(PyObject *o_flush, uint64_t *flush_ns)
{
    if (!o_flush)
        return 0;
    if (o_flush == Py_None) {
        *flush_ns = 0;
        return 0;
    }
    double f;
    if (exr_real_arg(o_flush, "flush_interval", &f) < 0) /* bools refused, huge ints ValueError */
        return -1;
    if (!(f > 0) || f > 1e6) {
        PyErr_Format(PyExc_ValueError,
                     "flush_interval: expected seconds in (0, 1e6] or None, got %R", o_flush);
        return -1;
    }
    *flush_ns = (uint64_t)(f * 1e9);
    if (!*flush_ns)
        *flush_ns = 1;
    return 0;
}

/* source, level, chunk_bytes, max_backlog and flush_interval into o. */
static int log_opts_args(PyObject *o_source, PyObject *o_level, PyObject *o_chunk,
                         PyObject *o_max, PyObject *o_flush, exr_log_opts *o)
{
    size_t v;
    if (o_source) {
        if (bounded_size(o_source, "source", 0, UINT32_MAX - 1, &v) < 0)
            return -1;
        o->source = (uint32_t)v;
    }
    if (o_level) {
        if (bounded_size(o_level, "level", 0, 9, &v) < 0)
            return -1;
        o->level = (int)v;
    }
    if (o_chunk && bounded_size(o_chunk, "chunk_bytes", 1, EXR_LOG_MAX_CHUNK, &o->chunk_bytes) < 0)
        return -1;
    if (o_max && bounded_size(o_max, "max_backlog", 0, (size_t)1 << 48, &o->max_backlog) < 0)
        return -1;
    return flush_arg(o_flush, &o->flush_ns);
}

/* Opens the log file at o_path into self (self->path set: o_path's
 * __fspath__ is asked once, and the file opened is the one it named). */
static int log_open_path(LogObject *self, PyObject *o_path, const exr_log_opts *o, int overwrite)
{
    PyObject *fspath = NULL;
    self->path = PyOS_FSPath(o_path);
    if (!self->path) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            char got[192];
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "path: expected a path (str, bytes or os.PathLike), "
                         "got %s", exr_type_str(o_path, got, sizeof got));
        }
        return -1;
    }
    if (exr_path_arg(self->path, "path", &fspath) < 0)
        return -1;
    exr_status st;
    const char *cpath = PyBytes_AS_STRING(fspath);
    EXR_NOGIL_BEGIN
    st = exr_log_open(cpath, o, overwrite != 0, &self->lg);
    EXR_NOGIL_END
    Py_DECREF(fspath);
    if (st == EXR_OK)
        return 0;
    if (st == EXR_EIO && errno == EEXIST)
        exr_raise_status(st, &(exr_errctx){.op = "ExperienceLog", .arg = "path",
                                           .expected = "a path that does not exist (or "
                                                       "overwrite=True to replace it)",
                                           .got = "one that exists", .handle = -1,
                                           .err = EEXIST, .path = self->path});
    else if (st == EXR_EIO && errno == EBUSY)
        exr_raise_status(st, &(exr_errctx){.op = "ExperienceLog", .arg = "path",
                                           .expected = "a file no other log is writing",
                                           .got = "one that another ExperienceLog has open "
                                                  "(close it first)",
                                           .handle = -1, .err = EBUSY, .path = self->path});
    else
        log_error(st, "ExperienceLog", self->path);
    return -1;
}

/* The schema given to the constructor (state_shape not None). */
/* self NULL: only checked (before the file is opened: a refused layout
 * must not cost an existing file given with overwrite=True). */
static int schema_args(LogObject *self, PyObject *o_sshape, PyObject *o_sdtype,
                       PyObject *o_ashape, PyObject *o_adtype, PyObject *o_rdtype)
{
    int snd = 0, and_ = 0;
    npy_intp ss[NPY_MAXDIMS], as[NPY_MAXDIMS];
    PyArray_Descr *sd = NULL, *ad = NULL, *rd = NULL;
    PyObject *tmp = NULL;
    int ok = exr_shape_arg(o_sshape, "state_shape", NULL, &snd, ss) == 0 &&
             (!o_ashape || exr_shape_arg(o_ashape, "action_shape", NULL, &and_, as) == 0);
    if (ok) {
        if (!o_sdtype)
            o_sdtype = tmp = PyUnicode_FromString("float32");
        sd = o_sdtype ? exr_dtype_arg(o_sdtype, "state_dtype", 0) : NULL;
        Py_XDECREF(tmp);
        ad = !sd ? NULL
             : o_adtype ? exr_dtype_arg(o_adtype, "action_dtype", 0)
                        : PyArray_DescrFromType(NPY_INT64);
        rd = !ad ? NULL
             : o_rdtype ? exr_dtype_arg(o_rdtype, "reward_dtype", 1)
                        : PyArray_DescrFromType(NPY_FLOAT32);
        schema_t m;
        ok = rd && (self ? set_schema(self, sd, snd, ss, ad, and_, as, rd, NULL, NULL)
                         : schema_of(sd, snd, ss, ad, and_, as, rd, NULL, NULL, &m)) == 0;
    }
    Py_XDECREF(sd);
    Py_XDECREF(ad);
    Py_XDECREF(rd);
    return ok ? 0 : -1;
}

static PyObject *log_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"path",         "source",       "level",        "chunk_bytes",
                             "flush_interval", "fsync",      "max_backlog",  "overwrite",
                             "state_shape",  "state_dtype",  "action_shape", "action_dtype",
                             "reward_dtype", NULL};
    PyObject *o_path, *o_source = NULL, *o_level = NULL, *o_chunk = NULL, *o_flush = NULL;
    PyObject *o_max = NULL, *o_sshape = Py_None, *o_sdtype = NULL, *o_ashape = NULL;
    PyObject *o_adtype = NULL, *o_rdtype = NULL;
    PyObject *o_fsync = NULL, *o_over = NULL;
    bool do_fsync = false, overwrite = false;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$OOOOOOOOOOOO:ExperienceLog", kwlist, &o_path,
                                     &o_source, &o_level, &o_chunk, &o_flush, &o_fsync, &o_max,
                                     &o_over, &o_sshape, &o_sdtype, &o_ashape, &o_adtype,
                                     &o_rdtype) ||
        truth_arg(o_fsync, "fsync", &do_fsync) < 0 ||
        truth_arg(o_over, "overwrite", &overwrite) < 0)
        return NULL;
    /* every argument checked before the file is opened (or replaced) */
    if (o_sshape == Py_None && (o_sdtype || o_ashape || o_adtype || o_rdtype))
        return PyErr_Format(PyExc_ValueError,
                            "state_shape: needed with state_dtype, action_shape, action_dtype "
                            "or reward_dtype, got None");
    if (o_sshape != Py_None && schema_args(NULL, o_sshape, o_sdtype, o_ashape, o_adtype,
                                           o_rdtype) < 0)
        return NULL;
    exr_log_opts o = {.source = 0,
                      .level = 1,
                      .chunk_bytes = (size_t)1 << 20,
                      .flush_ns = 1000000000u,
                      .fsync = do_fsync != 0,
                      .max_backlog = (size_t)256 << 20};
    if (log_opts_args(o_source, o_level, o_chunk, o_max, o_flush, &o) < 0)
        return NULL;
    LogObject *self = (LogObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    /* the file's path, once this call created it: overwrite=True may have
     * truncated one that exists (a symlink's target, a device), not to be
     * removed by a failure */
    PyObject *created = NULL;
    if (log_open_path(self, o_path, &o, overwrite) < 0 ||
        (exr_log_created(self->lg) && !PyUnicode_FSConverter(self->path, &created)))
        goto error;
    if (o_sshape != Py_None &&
        schema_args(self, o_sshape, o_sdtype, o_ashape, o_adtype, o_rdtype) < 0)
        goto error;
    Py_XDECREF(created);
    return (PyObject *)self;
error:
    Py_DECREF(self); /* closes the file */
    if (created) { /* a failed constructor leaves no file behind */
        (void)unlink(PyBytes_AS_STRING(created));
        Py_DECREF(created);
    }
    return NULL;
}

static void log_dealloc(LogObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->lg) {
        EXR_NOGIL_BEGIN
        exr_log_free(self->lg);
        EXR_NOGIL_END
    }
    Py_XDECREF(self->path);
    Py_XDECREF(self->fields);
    Py_XDECREF(self->state_descr);
    Py_XDECREF(self->action_descr);
    Py_XDECREF(self->reward_descr);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* Why a closed log is closed: in a child made by fork, the parent's logs are
 * closed (docs/log.md, "Logs and fork"). */
static const char *closed_words(exr_log *lg)
{
    return exr_log_forked(lg) ? "the log is closed in this process: it belongs to the process "
                                "that opened it, and this one was made by fork (open a new "
                                "ExperienceLog here)"
                              : "the log is closed";
}

static int need_open(LogObject *self, const char *what)
{
    if (exr_log_closed(self->lg)) {
        PyErr_Format(PyExc_ValueError, "%s: %s", what, closed_words(self->lg));
        return -1;
    }
    if (!self->state_descr) {
        PyErr_Format(PyExc_ValueError,
                     "%s: the log has no record layout yet: pass state_shape (and dtypes) to "
                     "ExperienceLog, or attach it to an ExperienceReplay",
                     what);
        return -1;
    }
    return 0;
}


/* append_many(h, pos, states, actions, rewards, final_state=None, terminated=False) and the
 * one-step append(h, pos, state, action, reward, ...): many = 0 or 1. */
/* append's arrays: states, actions, rewards (T of each when many, one
 * otherwise: *T = 1), final_state or NULL, into arr[0..4). */
static int append_arrays(LogObject *self, PyObject *const *a, const char *const *names, int many,
                         npy_intp *T, PyArrayObject **arr)
{
    int nlead = many ? 1 : 0;
    npy_intp *lead = many ? T : NULL;
    arr[0] = exr_as_array(a[2], self->state_descr, nlead, lead, self->state_nd,
                          self->state_shape, names[2]);
    if (!arr[0])
        return -1;
    if (many && *T == 0) {
        PyErr_SetString(PyExc_ValueError, "states: expected at least one step, got 0");
        return -1;
    }
    arr[1] = exr_as_array(a[3], self->action_descr, nlead, lead, self->action_nd,
                          self->action_shape, names[3]);
    if (!arr[1] || !(arr[2] = exr_as_array(a[4], self->reward_descr, nlead, lead, 0, NULL,
                                           names[4])))
        return -1;
    if (a[5] && a[5] != Py_None &&
        !(arr[3] = exr_as_array(a[5], self->state_descr, 0, NULL, self->state_nd,
                                self->state_shape, "final_state")))
        return -1;
    if (!many)
        *T = 1;
    return 0;
}

/* T steps of episode h from position pos into the log, the GIL released. */
static exr_status append_steps(LogObject *self, int64_t h, size_t pos, npy_intp T,
                               PyArrayObject **arr, int terminated)
{
    const unsigned char *sp = PyArray_DATA(arr[0]), *ap = PyArray_DATA(arr[1]);
    const unsigned char *rp = PyArray_DATA(arr[2]);
    PyArrayObject *fin = arr[3];
    const void *fp = fin ? PyArray_DATA(fin) : NULL;
    unsigned endfl = (fin || terminated ? EXR_LOG_END : 0) | (terminated ? EXR_LOG_TERMINATED : 0) |
                     (fin ? EXR_LOG_FINAL : 0);
    exr_status st = EXR_OK;
    exr_log *lg = self->lg;
    EXR_NOGIL_BEGIN
    exr_log_throttle(lg);
    st = exr_log_append_many(lg, h, pos, sp, ap, rp, (size_t)T, fp, endfl);
    EXR_NOGIL_END
    return st;
}

/* From save()'s progress callback of the buffer the log is attached to:
 * that thread holds the buffer's lock, which the log's writer needs to let
 * go of the rows it copied, so waiting for the writer there (flush, close,
 * an append past max_backlog) would never end. The same holds while another
 * thread detaches the log from that buffer: the detach waits for the lock,
 * and the writer still pins the buffer's rows until it ends. */
static int owner_saving_here(LogObject *self, const char *what)
{
    ReplayObject *rb = (ReplayObject *)self->owner;
    ReplayObject *gone = (ReplayObject *)self->leaving;
    if (!(rb && exr_busy_here(rb)) && !(gone && exr_busy_here(gone)))
        return 0;
    PyErr_Format(PyExc_RuntimeError,
                 "%s: the buffer this log is attached to is locked by save() in this thread: "
                 "its progress callback must not use the log",
                 what);
    return -1;
}

/* append on a log whose rows carry extras: there is no argument for them */
static int no_extras(LogObject *self, const char *what)
{
    if (!exr_log_has_extras(self->lg))
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: expected a log without per-step extras (a log with extras takes its "
                 "steps from its buffer only), got one whose rows carry extras",
                 what);
    return -1;
}

static PyObject *log_append_impl(LogObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames, int many)
{
    static const char *const n1[] = {"h", "pos", "state", "action", "reward", "final_state",
                                     "terminated"};
    static const char *const nm[] = {"h", "pos", "states", "actions", "rewards", "final_state",
                                     "terminated"};
    const char *fname = many ? "append_many" : "append";
    const char *const *names = many ? nm : n1;
    PyObject *a[7];
    int64_t h;
    size_t pos;
    bool terminated;
    if (exr_parse_args(args, nargs, kwnames, fname, names, 5, 7, a) < 0 ||
        need_open(self, fname) < 0 || no_extras(self, fname) < 0 ||
        owner_saving_here(self, fname) < 0 ||
        exr_int_arg(a[0], "h", "an int64 episode handle", INT64_MIN, INT64_MAX, &h) < 0 ||
        bounded_size(a[1], "pos", 0, (size_t)INT64_MAX / 2, &pos) < 0 ||
        truth_arg(a[6], "terminated", &terminated) < 0)
        return NULL;
    PyArrayObject *arr[4] = {NULL, NULL, NULL, NULL};
    npy_intp T = -1;
    exr_status st = EXR_OK;
    int ok = append_arrays(self, a, names, many, &T, arr) == 0;
    if (ok)
        st = append_steps(self, h, pos, T, arr, terminated);
    for (int i = 0; i < 4; i++)
        Py_XDECREF(arr[i]);
    if (!ok)
        return NULL;
    if (st == EXR_EINVAL)
        return log_state_error(st, fname, "an open log", "one closed meanwhile");
    if (st != EXR_OK)
        return exr_raise(st, fname);
    Py_RETURN_NONE;
}

static PyObject *log_append(LogObject *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames)
{
    return log_append_impl(self, args, nargs, kwnames, 0);
}

static PyObject *log_append_many(LogObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    return log_append_impl(self, args, nargs, kwnames, 1);
}

/* end_episode's final_state: None (*fin NULL) or one state, converted as
 * append converts it. */
static int end_final_arg(LogObject *self, PyObject *o, PyArrayObject **fin)
{
    *fin = NULL;
    if (!o || o == Py_None)
        return 0;
    *fin = exr_as_array(o, self->state_descr, 0, NULL, self->state_nd, self->state_shape,
                        "final_state");
    return *fin ? 0 : -1;
}

/* end_episode(h, pos, final_state=None, terminated=False): the end of
 * episode h after its pos steps, without a step (docs/log.md, "Ends without
 * a step"): the record ExperienceReplay.end_episode logs. */
static PyObject *log_end_episode(LogObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames)
{
    static const char *const names[] = {"h", "pos", "final_state", "terminated"};
    PyObject *a[4];
    int64_t h;
    size_t pos;
    bool terminated;
    PyArrayObject *fin;
    if (exr_parse_args(args, nargs, kwnames, "end_episode", names, 2, 4, a) < 0 ||
        need_open(self, "end_episode") < 0 || owner_saving_here(self, "end_episode") < 0 ||
        exr_int_arg(a[0], "h", "an int64 episode handle", INT64_MIN, INT64_MAX, &h) < 0 ||
        bounded_size(a[1], "pos", 1, (size_t)INT64_MAX / 2, &pos) < 0 ||
        truth_arg(a[3], "terminated", &terminated) < 0 || end_final_arg(self, a[2], &fin) < 0)
        return NULL;
    if (!fin && !terminated) {
        PyErr_SetString(PyExc_ValueError,
                        "final_state: expected a state, or terminated=True (an episode ends with "
                        "its last step's next state or as terminal), got None and "
                        "terminated=False");
        return NULL;
    }
    const void *fp = fin ? PyArray_DATA(fin) : NULL;
    exr_status st;
    exr_log *lg = self->lg;
    EXR_NOGIL_BEGIN
    exr_log_throttle(lg);
    st = exr_log_end(lg, h, pos, fp, terminated != 0);
    EXR_NOGIL_END
    Py_XDECREF(fin);
    if (st == EXR_EINVAL)
        return log_state_error(st, "end_episode", "an open log", "one closed meanwhile");
    if (st != EXR_OK)
        return exr_raise(st, "end_episode");
    Py_RETURN_NONE;
}

static PyObject *log_flush(LogObject *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    static const char *const names[] = {"sync"};
    PyObject *a[1];
    if (exr_parse_args(args, nargs, kwnames, "flush", names, 0, 1, a) < 0)
        return NULL;
    bool sync;
    if (truth_arg(a[0], "sync", &sync) < 0 || owner_saving_here(self, "flush") < 0)
        return NULL;
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_log_flush(self->lg, sync != 0);
    EXR_NOGIL_END
    if (st != EXR_OK)
        return log_error(st, "flush", self->path);
    Py_RETURN_NONE;
}

static PyObject *log_close(LogObject *self, PyObject *unused)
{
    (void)unused;
    if (owner_saving_here(self, "close") < 0)
        return NULL;
    if (self->owner) {
        /* the buffer lets go of the log first; held meanwhile, as another
         * thread may drop it */
        PyObject *rb = Py_NewRef(self->owner);
        exr_replay_detach_log((ReplayObject *)rb);
        Py_DECREF(rb);
    }
    exr_status st;
    EXR_NOGIL_BEGIN
    st = exr_log_close(self->lg);
    EXR_NOGIL_END
    if (st != EXR_OK)
        return log_error(st, "close", self->path);
    Py_RETURN_NONE;
}

static PyObject *log_enter(LogObject *self, PyObject *unused)
{
    (void)unused;
    return Py_NewRef(self);
}

static PyObject *log_exit(LogObject *self, PyObject *args)
{
    (void)args;
    PyObject *r = log_close(self, NULL);
    if (!r)
        return NULL;
    Py_DECREF(r);
    Py_RETURN_FALSE;
}

static PyObject *log_stats(LogObject *self, void *c)
{
    (void)c;
    exr_log_stats s;
    exr_log_get_stats(self->lg, &s);
    /* records: steps; ends: ends without a step (exreplay.log.info's counts) */
    return Py_BuildValue("{sKsKsKsKsKsKsKsdsKsisd}", "records", (unsigned long long)s.records,
                         "ends", (unsigned long long)s.ends, "chunks",
                         (unsigned long long)s.chunks, "file_bytes",
                         (unsigned long long)s.file_bytes, "raw_bytes",
                         (unsigned long long)s.raw_bytes, "backlog",
                         (unsigned long long)s.backlog, "throttled",
                         (unsigned long long)s.throttled, "throttle_seconds",
                         (double)s.throttle_ns / 1e9, "dropped", (unsigned long long)s.dropped,
                         "errno", s.error, "writer_seconds", (double)s.writer_ns / 1e9);
}

static PyObject *log_get_path(LogObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->path);
}
static PyObject *log_get_source(LogObject *self, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(exr_log_options(self->lg)->source);
}
static PyObject *log_get_level(LogObject *self, void *c)
{
    (void)c;
    return PyLong_FromLong(exr_log_options(self->lg)->level);
}
static PyObject *log_get_closed(LogObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(exr_log_closed(self->lg));
}
static PyObject *log_get_attached(LogObject *self, void *c)
{
    (void)c;
    return PyBool_FromLong(self->owner != NULL);
}

static PyObject *log_repr(LogObject *self)
{
    return PyUnicode_FromFormat("ExperienceLog(%R, source=%u, level=%d%s)", self->path,
                                (unsigned)exr_log_options(self->lg)->source,
                                exr_log_options(self->lg)->level,
                                exr_log_closed(self->lg) ? ", closed" : "");
}

static PyMethodDef log_methods[] = {
    {"append", (PyCFunction)(void (*)(void))log_append, METH_FASTCALL | METH_KEYWORDS,
     "append($self, h, pos, state, action, reward, final_state=None, terminated=False)\n--\n\n"
     "Logs one step of episode h at position pos, without a buffer. final_state\n"
     "or terminated=True marks it as its episode's last step. Needs a record\n"
     "layout (state_shape=... at construction). Releases the GIL."},
    {"append_many", (PyCFunction)(void (*)(void))log_append_many, METH_FASTCALL | METH_KEYWORDS,
     "append_many($self, h, pos, states, actions, rewards, final_state=None, terminated=False)\n"
     "--\n\nLogs T steps of episode h at positions pos .. pos + T - 1; the last one\n"
     "carries final_state and terminated."},
    {"end_episode", (PyCFunction)(void (*)(void))log_end_episode, METH_FASTCALL | METH_KEYWORDS,
     "end_episode($self, h, pos, final_state=None, terminated=False)\n--\n\n"
     "Logs the end of episode h after its pos steps (pos >= 1), without a step:\n"
     "the record ExperienceReplay.end_episode logs, byte for byte. final_state or\n"
     "terminated=True is needed. Needs a record layout. Releases the GIL."},
    {"flush", (PyCFunction)(void (*)(void))log_flush, METH_FASTCALL | METH_KEYWORDS,
     "flush($self, sync=False)\n--\n\n"
     "Returns once every step logged before it is written to the file (a kill -9\n"
     "afterwards loses none of it); with sync=True (or fsync=True at construction)\n"
     "also fsyncs. Releases the GIL."},
    {"close", (PyCFunction)log_close, METH_NOARGS,
     "close($self, /)\n--\n\nDetaches from its buffer, flushes, writes the end marker and "
     "closes the file."},
    {"__enter__", (PyCFunction)log_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)log_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef log_getset[] = {
    {"stats", (getter)log_stats, NULL,
     "dict: records (steps) and ends (ends without a step), chunks, file_bytes,\n"
     "raw_bytes written; backlog (bytes not yet written); throttled,\n"
     "throttle_seconds (waits for the writer); dropped; errno;\n"
     "writer_seconds (the writer thread's time building, compressing and writing chunks)",
     NULL},
    {"path", (getter)log_get_path, NULL, "the log's file", NULL},
    {"source", (getter)log_get_source, NULL, "the source id written with every record", NULL},
    {"level", (getter)log_get_level, NULL, "zlib level (0: stored)", NULL},
    {"closed", (getter)log_get_closed, NULL, "whether close() was called", NULL},
    {"attached", (getter)log_get_attached, NULL, "whether a buffer logs into it", NULL},
    {NULL},
};

static PyType_Slot log_slots[] = {
    {Py_tp_new, log_new},
    {Py_tp_dealloc, log_dealloc},
    {Py_tp_methods, log_methods},
    {Py_tp_getset, log_getset},
    {Py_tp_repr, log_repr},
    {Py_tp_doc,
     "ExperienceLog(path, *, source=0, level=1, chunk_bytes=1048576, flush_interval=1.0,\n"
     "fsync=False, max_backlog=268435456, overwrite=False, state_shape=None,\n"
     "state_dtype='float32', action_shape=(), action_dtype='int64', reward_dtype='float32')\n"
     "--\n\n"
     "An append-only, chunked, zlib-compressed file of experience (docs/log.md),\n"
     "written by a thread of its own. Attach it to an ExperienceReplay (log= or\n"
     "attach_log) to log every recorded step, or append steps directly."},
    {0, NULL},
};

static PyType_Spec log_spec = {
    .name = "exreplay._core.ExperienceLog",
    .basicsize = sizeof(LogObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = log_slots,
};

int exr_log_merge_init_type(PyObject *m); /* log_merge.c: the merge's private type */

int exr_log_init_type(PyObject *m, exr_modstate *st)
{
    st->log_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &log_spec, NULL);
    if (!st->log_type)
        return -1;
    if (PyModule_AddObjectRef(m, "ExperienceLog", (PyObject *)st->log_type) < 0)
        return -1;
    return exr_log_merge_init_type(m);
}

/* ---- ExperienceReplay's side -------------------------------------------------- */

static int same_descr(PyArray_Descr *a, PyArray_Descr *b) { return PyArray_EquivTypes(a, b); }

/* (state_spec, extras_spec) of a buffer: (None, None) without fields. */
static PyObject *buffer_fields(ReplayObject *self)
{
    PyObject *s = self->sfields ? exr_fieldset_spec(self->sfields) : Py_NewRef(Py_None);
    PyObject *x = self->xfields ? exr_fieldset_spec(self->xfields) : Py_NewRef(Py_None);
    PyObject *t = s && x ? PyTuple_Pack(2, s, x) : NULL;
    Py_XDECREF(s);
    Py_XDECREF(x);
    return t;
}

/* A record layout as a message shows it: "state float32 (4,), action
 * int64 (), reward float32"; named fields as "state_spec {...}" in the
 * state's place, extras as ", extras_spec {...}" after (fields: the
 * layout's (state_spec, extras_spec), or NULL for neither). */
static PyObject *layout_str(PyArray_Descr *sd, int snd, const npy_intp *ss, PyArray_Descr *ad,
                            int and_, const npy_intp *as, PyArray_Descr *rd, PyObject *fields)
{
    int two = fields && PyTuple_Check(fields) && PyTuple_GET_SIZE(fields) == 2;
    PyObject *sspec = two ? PyTuple_GET_ITEM(fields, 0) : Py_None;
    PyObject *xspec = two ? PyTuple_GET_ITEM(fields, 1) : Py_None;
    PyObject *st = PyArray_IntTupleFromIntp(snd, ss), *at = PyArray_IntTupleFromIntp(and_, as);
    PyObject *state = !st ? NULL
                      : sspec != Py_None ? PyUnicode_FromFormat("state_spec %R", sspec)
                                         : PyUnicode_FromFormat("state %S %S", (PyObject *)sd, st);
    PyObject *r = state && at ? PyUnicode_FromFormat("%U, action %S %S, reward %S", state,
                                                     (PyObject *)ad, at, (PyObject *)rd)
                              : NULL;
    Py_XDECREF(st);
    Py_XDECREF(at);
    Py_XDECREF(state);
    if (r && xspec != Py_None)
        Py_SETREF(r, PyUnicode_FromFormat("%U, extras_spec %R", r, xspec));
    return r;
}

/* The ValueError for a log whose layout is not the buffer's, both shown. */
static int layout_differs(LogObject *lo, ReplayObject *self, PyObject *fields)
{
    PyObject *mine = layout_str(self->state_descr, self->state_nd, self->state_shape,
                                self->action_descr, self->action_nd, self->action_shape,
                                self->reward_descr, fields);
    PyObject *its = mine ? layout_str(lo->state_descr, lo->state_nd, lo->state_shape,
                                      lo->action_descr, lo->action_nd, lo->action_shape,
                                      lo->reward_descr, lo->fields)
                         : NULL;
    if (its)
        PyErr_Format(PyExc_ValueError, "log: expected a log of this buffer's record layout (%U), "
                     "got one of %U", mine, its);
    Py_XDECREF(mine);
    Py_XDECREF(its);
    return -1;
}

/* The log's record layout made self's (its first buffer) or checked equal
 * to it: shapes, dtypes, named fields and extras. */
static int take_layout(LogObject *lo, ReplayObject *self, PyObject *fields)
{
    if (!lo->state_descr)
        return set_schema(lo, self->state_descr, self->state_nd, self->state_shape,
                          self->action_descr, self->action_nd, self->action_shape,
                          self->reward_descr, self->sfields, self->xfields);
    /* a standalone schema (lo->fields NULL) has no named fields or extras */
    int same = lo->fields ? PyObject_RichCompareBool(lo->fields, fields, Py_EQ)
                          : !self->sfields && !self->xfields;
    if (same < 0)
        return -1;
    if (!same || !same_descr(lo->state_descr, self->state_descr) ||
        !same_descr(lo->action_descr, self->action_descr) ||
        !same_descr(lo->reward_descr, self->reward_descr) || lo->state_nd != self->state_nd ||
        lo->action_nd != self->action_nd ||
        memcmp(lo->state_shape, self->state_shape, (size_t)self->state_nd * sizeof(npy_intp)) ||
        memcmp(lo->action_shape, self->action_shape, (size_t)self->action_nd * sizeof(npy_intp)))
        return layout_differs(lo, self, fields);
    return 0;
}

int exr_replay_attach_log(ReplayObject *self, PyObject *o)
{
    PyTypeObject *lt = log_type((PyObject *)self);
    if (!lt || !PyObject_TypeCheck(o, lt)) {
        PyErr_Format(PyExc_TypeError, "log: expected an ExperienceLog, got %s",
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    LogObject *lo = (LogObject *)o;
    if (self->log) {
        PyErr_SetString(PyExc_ValueError,
                        "log: this buffer already logs into an ExperienceLog (detach_log() first)");
        return -1;
    }
    if (lo->owner) {
        PyErr_SetString(PyExc_ValueError, "log: already attached to another buffer");
        return -1;
    }
    if (exr_log_closed(lo->lg)) {
        PyErr_Format(PyExc_ValueError, "log: %s", closed_words(lo->lg));
        return -1;
    }
    PyObject *fields = buffer_fields(self);
    if (!fields || take_layout(lo, self, fields) < 0) {
        Py_XDECREF(fields);
        return -1;
    }
    Py_XSETREF(lo->fields, fields);
    exr_lock_with_gil(self->buf);
    /* the GIL may have been let go since the checks above (the schema, the
     * lock): another attach may have come first */
    exr_status st = self->log || lo->owner ? EXR_EINVAL : exr_log_attach_locked(lo->lg, self->buf);
    exr_buffer_unlock(self->buf);
    if (st != EXR_OK) {
        log_state_error(st, "attach_log", "an open log not attached to another buffer",
                        "one closed or attached elsewhere");
        return -1;
    }
    lo->owner = (PyObject *)self;
    self->log = Py_NewRef(o);
    return 0;
}

/* The pair is taken apart with the GIL held, before it is let go, so that a
 * detach racing this one (log.close() and the buffer's dealloc or
 * detach_log() in two threads) finds nothing to do. The caller holds self
 * (log_close takes a reference), so the buffer outlives the flush that
 * lets the log's writer go of its rows. */
void exr_replay_detach_log(ReplayObject *self)
{
    if (!self->log)
        return;
    LogObject *lo = (LogObject *)self->log;
    self->log = NULL;
    lo->owner = NULL;
    exr_log *lg = lo->lg;
    exr_buffer *b = self->buf;
    exr_log_detach_begin(lg); /* a close in another thread now waits for this detach */
    lo->leaving = (PyObject *)self;
    EXR_NOGIL_BEGIN
    exr_log_detach(lg, b);
    EXR_NOGIL_END
    lo->leaving = NULL;
    Py_DECREF(lo);
}

int exr_replay_log_check(ReplayObject *self, const char *what)
{
    if (!self->log || !exr_log_forked(((LogObject *)self->log)->lg))
        return 0;
    PyErr_Format(PyExc_ValueError,
                 "%s: this buffer's log belongs to the process that opened it, and this one was "
                 "made by fork (detach_log() to record here without it, or attach a new "
                 "ExperienceLog)",
                 what);
    return -1;
}

exr_log *exr_replay_log(ReplayObject *self)
{
    return self->log ? ((LogObject *)self->log)->lg : NULL;
}

PyObject *exr_replay_attach_log_py(ReplayObject *self, PyObject *o)
{
    EXR_GUARD(self, NULL);
    if (exr_replay_attach_log(self, o) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyObject *exr_replay_detach_log_py(ReplayObject *self, PyObject *unused)
{
    (void)unused;
    EXR_GUARD(self, NULL);
    PyObject *r = self->log ? Py_NewRef(self->log) : Py_NewRef(Py_None);
    exr_replay_detach_log(self);
    return r;
}

PyObject *exr_replay_get_log(ReplayObject *self, void *c)
{
    (void)c;
    return Py_NewRef(self->log ? self->log : Py_None);
}

/* from_log and ingest live in exreplay/log.py (they only read and record). */
static PyObject *call_py(const char *fn, PyObject *first, PyObject *args, PyObject *kw)
{
    return exr_call_python("exreplay.log", fn, first, args, kw);
}

PyObject *exr_replay_from_log(PyObject *cls, PyObject *args, PyObject *kw)
{
    return call_py("_from_log", cls, args, kw);
}

PyObject *exr_replay_ingest(ReplayObject *self, PyObject *args, PyObject *kw)
{
    return call_py("_ingest", (PyObject *)self, args, kw);
}
