/*
 * errors.c - the binding's one way from a core status to a Python
 * exception (exr_raise_status): the exception type follows the status, the
 * message names the argument, what was expected and what came.
 *
 *   EXR_ENOMEM     MemoryError   "<arg>: out of memory (<got>)"
 *   EXR_EOVERFLOW  MemoryError   "<arg>: a size limit was reached (...)"
 *   EXR_EINVAL     ValueError    "<arg>: expected <expected>, got <got>"
 *   EXR_ENOTFOUND  ValueError    "<arg>: expected <expected>, got <got>"
 *   EXR_EEMPTY     ValueError    "<arg>: no pick can be drawn: <got>"
 *   EXR_ECORRUPT   ValueError    "<arg>: invalid serialized buffer"
 *   EXR_EIO        OSError       errno (ctx->err) and the file name (ctx->path)
 *   EXR_EABORTED   RuntimeError  "<op>: aborted by its progress callback"
 */
#include "binding.h"

#include <errno.h>

/* "unknown handle 7" when the context has a handle and no got. */
static const char *got_text(const exr_errctx *c, char *buf, size_t len)
{
    if (c->got)
        return c->got;
    if (c->has_handle) {
        snprintf(buf, len, "unknown handle %lld", (long long)c->handle);
        return buf;
    }
    return NULL;
}

static PyObject *raise_expected(const char *who, const exr_errctx *c, const char *got,
                                const char *default_expected)
{
    const char *expected = c->expected ? c->expected : default_expected;
    if (got)
        return PyErr_Format(PyExc_ValueError, "%s: expected %s, got %s", who, expected, got);
    return PyErr_Format(PyExc_ValueError, "%s: expected %s", who, expected);
}

/* OSError (the subclass its errno picks) with strerror, or with the
 * context's own message when it names what was expected. */
static PyObject *raise_os(const exr_errctx *c, const char *who, const char *got)
{
    int err = c->err ? c->err : errno ? errno : EIO;
    if (!c->expected || !got) {
        errno = err;
        if (c->path)
            return PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, c->path);
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *msg = PyUnicode_FromFormat("%s: expected %s, got %s", who, c->expected, got);
    PyObject *exc = msg ? PyObject_CallFunction(PyExc_OSError, "iOO", err, msg,
                                                c->path ? c->path : Py_None)
                        : NULL;
    Py_XDECREF(msg);
    if (exc) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *exr_raise_status(exr_status st, const exr_errctx *c)
{
    const char *op = c->op && *c->op ? c->op : "exreplay";
    const char *who = c->arg ? c->arg : op;
    char buf[64];
    const char *got = got_text(c, buf, sizeof buf);
    switch (st) {
    case EXR_ENOMEM:
        if (got)
            return PyErr_Format(PyExc_MemoryError, "%s: out of memory (%s)", who, got);
        return PyErr_Format(PyExc_MemoryError, "%s: out of memory", who);
    case EXR_EOVERFLOW:
        return PyErr_Format(PyExc_MemoryError,
                            "%s: a size limit was reached (at most 2**32 - 2 picks, 2**32 - 2 "
                            "records an episode, 2**62 handles) or a size computation overflowed",
                            who);
    case EXR_ECORRUPT:
        return PyErr_Format(PyExc_ValueError, "%s: invalid serialized buffer", who);
    case EXR_EEMPTY:
        return PyErr_Format(PyExc_ValueError, "%s: no pick can be drawn: %s", who,
                            got ? got : "there is nothing to draw from");
    case EXR_EIO:
        return raise_os(c, who, got);
    case EXR_EABORTED:
        return PyErr_Format(PyExc_RuntimeError, "%s: aborted by its progress callback", op);
    case EXR_ENOTFOUND:
        return raise_expected(who, c, got, "one that exists");
    case EXR_EINVAL:
        return raise_expected(who, c, got, "a value in range");
    case EXR_OK:
        break;
    }
    return PyErr_Format(PyExc_SystemError, "%s: unexpected status %d", op, (int)st);
}

PyObject *exr_raise(exr_status st, const char *op)
{
    return exr_raise_status(st, &(exr_errctx){.op = op, .handle = -1});
}

PyObject *exr_unknown_selector(int64_t h)
{
    exr_errctx c = {.arg = "ps", .expected = "a pick selector of this buffer", .has_handle = true,
                    .handle = h};
    return exr_raise_status(EXR_ENOTFOUND, &c);
}

PyObject *exr_unknown_selector_int(PyObject *o)
{
    PyObject *v = PyNumber_Index(o);
    PyObject *got = v ? PyUnicode_FromFormat("unknown handle %S", v) : NULL;
    const char *g = got ? PyUnicode_AsUTF8(got) : NULL;
    if (g)
        exr_raise_status(EXR_ENOTFOUND, &(exr_errctx){.arg = "ps",
                                                      .expected = "a pick selector of this buffer",
                                                      .got = g});
    Py_XDECREF(got);
    Py_XDECREF(v);
    return NULL;
}

PyObject *exr_unknown_episode(int64_t h, PyObject *o)
{
    PyObject *v = o ? PyNumber_Index(o) : PyLong_FromLongLong((long long)h);
    if (v)
        PyErr_Format(PyExc_ValueError,
                     "h: expected the handle of an episode held, got %S (evicted or never "
                     "created)",
                     v);
    Py_XDECREF(v);
    return NULL;
}

/* _core._raise_status(status, op, arg=None): the exception exr_raise_status
 * raises for a status (a test hook: every status gets a specific message). */
PyObject *exr_raise_status_py(PyObject *module, PyObject *args)
{
    (void)module;
    int st;
    const char *op, *arg = NULL;
    if (!PyArg_ParseTuple(args, "is|z:_raise_status", &st, &op, &arg))
        return NULL;
    if (st <= EXR_OK || st > EXR_EABORTED)
        return PyErr_Format(PyExc_ValueError, "status: expected 1 to %d, got %d", EXR_EABORTED, st);
    return exr_raise_status((exr_status)st, &(exr_errctx){.op = op, .arg = arg, .handle = -1,
                                                          .err = EIO});
}
