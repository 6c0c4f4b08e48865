/*
 * diag.c - what a user sees when printing or misusing the binding's objects:
 * the reprs of ExperienceReplay, Batch and EpisodeData (configuration and
 * counts; shapes and dtypes instead of array contents), the get_batch error
 * that says why no pick can be drawn, the description of a wrong out= array,
 * and ExperienceReplay.for_spaces (which lives in exreplay/_spaces.py).
 */
#include "binding.h"

#include "args.h"

#include <string.h>
#include <structmember.h>

/* Records, episodes and picks, read at one moment. From save()'s progress
 * callback this thread holds rw already (the counts cannot change under
 * it): taking it again would deadlock. */
static void repr_counts(ReplayObject *r, unsigned long long *n, unsigned long long *e,
                        unsigned long long *p)
{
    bool mine = exr_busy_here(r);
    if (!mine)
        exr_lock_with_gil(r->buf);
    *n = exr_buffer_len_locked(r->buf);
    *e = exr_buffer_num_episodes_locked(r->buf);
    *p = exr_buffer_num_picks_locked(r->buf);
    if (!mine)
        exr_buffer_unlock(r->buf);
}

/* repr(ExperienceReplay): the constructor's arguments, then the counts. */
PyObject *exr_replay_repr(PyObject *self)
{
    static const char *const attrs[] = {"state_shape", "state_dtype", "action_shape",
                                        "action_dtype", "reward_dtype", "capacity",
                                        "pick_len", "allow_short", "eviction", "seed"};
    enum { NATTR = sizeof attrs / sizeof attrs[0] };
    PyObject *v[NATTR] = {0};
    PyObject *res = NULL;
    for (int i = 0; i < NATTR; i++) {
        PyObject *a = PyObject_GetAttrString(self, attrs[i]);
        if (!a)
            goto done;
        /* dtypes as their names: float32, not dtype('float32'); None (a
         * capacity, a seed, the state of a buffer with named fields) kept,
         * shown by %R as None, not 'None' */
        if (PyArray_DescrCheck(a)) {
            v[i] = PyObject_Str(a);
            Py_DECREF(a);
            if (!v[i])
                goto done;
        } else {
            v[i] = a;
        }
    }
    ReplayObject *r = (ReplayObject *)self;
    unsigned long long n, e, p;
    repr_counts(r, &n, &e, &p);
    if (r->sfields || r->xfields) {
        /* named fields (named.c): the specs in place of the state's shape and dtype */
        PyObject *ss = PyObject_GetAttrString(self, "state_spec");
        PyObject *xs = ss ? PyObject_GetAttrString(self, "extras_spec") : NULL;
        if (xs) {
            PyObject *state = r->sfields ? PyUnicode_FromFormat("state_spec=%R", ss)
                                         : PyUnicode_FromFormat("state_shape=%R, state_dtype=%U",
                                                                v[0], v[1]);
            if (state)
                res = PyUnicode_FromFormat(
                    "ExperienceReplay(%U, extras_spec=%R, action_shape=%R, action_dtype=%U, "
                    "reward_dtype=%U, capacity=%R, pick_len=%R, allow_short=%R, eviction=%R, "
                    "seed=%R; %llu records in %llu episodes, %llu picks)",
                    state, xs, v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], n, e, p);
            Py_XDECREF(state);
        }
        Py_XDECREF(ss);
        Py_XDECREF(xs);
        goto done;
    }
    res = PyUnicode_FromFormat(
        "ExperienceReplay(state_shape=%R, state_dtype=%U, action_shape=%R, action_dtype=%U, "
        "reward_dtype=%U, capacity=%R, pick_len=%R, allow_short=%R, eviction=%R, seed=%R; "
        "%llu records in %llu episodes, %llu picks)",
        v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7], v[8], v[9], n, e, p);
done:
    for (int i = 0; i < NATTR; i++)
        Py_XDECREF(v[i]);
    return res;
}

static PyObject *value_summary(PyObject *o, int top);

/* {'img': uint8(32, 1, 84, 84), ...} for a dict of named fields. Read from
 * a list of its items of our own: a value's repr runs Python code, which
 * may change the dict and drop the key and value it gave (they were used
 * after it as borrowed references). */
static PyObject *dict_summary(PyObject *o)
{
    PyObject *items = PyDict_Items(o), *parts = items ? PyList_New(0) : NULL, *res = NULL;
    if (!parts) {
        Py_XDECREF(items);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
        PyObject *kv = PyList_GET_ITEM(items, i);
        PyObject *s = value_summary(PyTuple_GET_ITEM(kv, 1), 0);
        PyObject *item = s ? PyUnicode_FromFormat("%R: %U", PyTuple_GET_ITEM(kv, 0), s) : NULL;
        Py_XDECREF(s);
        if (!item || PyList_Append(parts, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    PyObject *body = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
    if (body)
        res = PyUnicode_FromFormat("{%U}", body);
    Py_XDECREF(body);
done:
    Py_DECREF(items);
    Py_DECREF(parts);
    return res;
}

/* "float32 (32, 4, 4)" for an array, repr() for anything else. Only a
 * field's own dict (top) is summarised: a dict put inside it is repr()'d,
 * which stops at a dict holding itself and at Python's recursion limit
 * (summarised too, one that held itself recursed until the C stack ran
 * out: a crash). */
static PyObject *value_summary(PyObject *o, int top)
{
    if (top && PyDict_CheckExact(o))
        return dict_summary(o);
    if (!PyArray_Check(o))
        return PyObject_Repr(o);
    PyArrayObject *a = (PyArrayObject *)o;
    char shape[256];
    exr_shape_str(shape, sizeof shape, PyArray_NDIM(a), PyArray_DIMS(a));
    PyObject *dt = PyObject_Str((PyObject *)PyArray_DESCR(a));
    if (!dt)
        return NULL;
    PyObject *s = PyUnicode_FromFormat("%U%s", dt, shape);
    Py_DECREF(dt);
    return s;
}

/* "Batch" of exreplay._core.Batch. */
static const char *short_name(PyTypeObject *tp)
{
    const char *name = strrchr(tp->tp_name, '.');
    return name ? name + 1 : tp->tp_name;
}

/* "state=uint8(32, 1, 84, 84), ..." of a Batch or an EpisodeData: every
 * field (the hidden weight too) but empty extras and a state_seq of None. */
static PyObject *struct_body(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject *parts = PyList_New(0), *res = NULL;
    if (!parts)
        return NULL;
    /* n_fields counts the fields reachable by name only (weight) too */
    PyObject *nf = PyObject_GetAttrString((PyObject *)tp, "n_fields");
    Py_ssize_t n = nf ? PyLong_AsSsize_t(nf) : -1;
    Py_XDECREF(nf);
    if (n < 0)
        goto done;
    for (Py_ssize_t i = 0; i < n && tp->tp_members[i].name; i++) {
        PyObject *val = PyStructSequence_GetItem(self, i);
        /* no extras (the buffer has no extras_spec), or no shared next
         * states: not shown */
        if (val && strcmp(tp->tp_members[i].name, "extras") == 0 &&
            (val == Py_None || (PyDict_CheckExact(val) && PyDict_GET_SIZE(val) == 0)))
            continue;
        if (val == Py_None && strcmp(tp->tp_members[i].name, "state_seq") == 0)
            continue;
        PyObject *s = val ? value_summary(val, 1) : NULL;
        PyObject *item = s ? PyUnicode_FromFormat("%s=%U", tp->tp_members[i].name, s) : NULL;
        Py_XDECREF(s);
        if (!item || PyList_Append(parts, item) < 0) {
            Py_XDECREF(item);
            goto done;
        }
        Py_DECREF(item);
    }
    PyObject *sep = PyUnicode_FromString(", ");
    res = sep ? PyUnicode_Join(sep, parts) : NULL;
    Py_XDECREF(sep);
done:
    Py_DECREF(parts);
    return res;
}

/* repr of a Batch or an EpisodeData, arrays summarised as dtype(shape);
 * "Batch(...)" for one inside its own fields (its extras). */
static PyObject *struct_repr(PyObject *self)
{
    int inside = Py_ReprEnter(self);
    if (inside)
        return inside < 0 ? NULL : PyUnicode_FromFormat("%s(...)", short_name(Py_TYPE(self)));
    PyObject *body = struct_body(self), *res = NULL;
    Py_ReprLeave(self);
    if (body)
        res = PyUnicode_FromFormat("%s(%U)", short_name(Py_TYPE(self)), body);
    Py_XDECREF(body);
    return res;
}

int exr_install_reprs(exr_modstate *st)
{
    st->batch_type->tp_repr = struct_repr;
    st->episode_type->tp_repr = struct_repr;
    PyType_Modified(st->batch_type);
    PyType_Modified(st->episode_type);
    return 0;
}

/* The ValueError of get_batch when selector h has nothing to draw: says
 * which of the usual causes it is. Always NULL. */
/* Why no pick of selector h can be drawn, into buf. */
static void empty_reason(ReplayObject *self, int64_t h, char *buf, size_t len)
{
    exr_lock_with_gil(self->buf);
    unsigned long long n = exr_buffer_len_locked(self->buf);
    unsigned long long e = exr_buffer_num_episodes_locked(self->buf);
    unsigned long long p = exr_buffer_num_picks_locked(self->buf);
    exr_buffer_unlock(self->buf);
    unsigned long long L = exr_buffer_config(self->buf)->pick_len;
    if (n == 0)
        snprintf(buf, len, "the buffer is empty (%llu episodes, 0 records)", e);
    else if (p > 0)
        snprintf(buf, len, "every priority of selector %lld is zero (%llu picks held)",
                 (long long)h, p);
    else if (n == e && n > 1)
        snprintf(buf, len,
                 "each of the %llu records is in an episode of its own, so no episode has the "
                 "pick_len=%llu complete steps a pick needs. record() returns the handle to "
                 "continue the episode with: pass it back (h = buf.record(h, ...))",
                 n, L);
    else
        snprintf(buf, len,
                 "the %llu records are in %llu episodes, all shorter than a pick (pick_len=%llu "
                 "complete steps; an open episode's last step is complete only once the next "
                 "record or the episode's end arrives)%s",
                 n, e, L,
                 exr_buffer_config(self->buf)->allow_short
                     ? ""
                     : "; allow_short=True also makes shorter picks at the end of ended episodes");
}

PyObject *exr_empty_batch_error(ReplayObject *self, int64_t h)
{
    char reason[512];
    empty_reason(self, h, reason, sizeof reason);
    return exr_raise_status(EXR_EEMPTY, &(exr_errctx){.op = "get_batch", .got = reason,
                                                      .handle = h});
}

/* "a float32 array of shape (3, 4), not C-contiguous" or "a list". */
PyObject *exr_describe_value(PyObject *o)
{
    if (!PyArray_Check(o))
        return PyUnicode_FromFormat("%s %s", exr_article(Py_TYPE(o)->tp_name),
                                    Py_TYPE(o)->tp_name);
    PyArrayObject *a = (PyArrayObject *)o;
    char shape[256];
    exr_shape_str(shape, sizeof shape, PyArray_NDIM(a), PyArray_DIMS(a));
    PyObject *dt = PyObject_Str((PyObject *)PyArray_DESCR(a));
    const char *dts = dt ? PyUnicode_AsUTF8(dt) : NULL;
    if (!dts) {
        Py_XDECREF(dt);
        return NULL;
    }
    PyObject *s = PyUnicode_FromFormat(
        "%s %U array of shape %s%s%s%s", exr_article(dts), dt, shape,
        PyArray_IS_C_CONTIGUOUS(a) ? "" : ", not C-contiguous",
        PyArray_ISALIGNED(a) ? "" : ", not aligned",
        PyArray_ISWRITEABLE(a) ? "" : ", read-only");
    Py_DECREF(dt);
    return s;
}

/* ExperienceReplay.for_spaces(observation_space, action_space, **kwargs). */
PyObject *exr_for_spaces_cls(PyObject *cls, PyObject *args, PyObject *kwargs)
{
    return exr_call_python("exreplay._spaces", "for_spaces", cls, args, kwargs);
}
