/*
 * replay_record.c - record, record_many and new_episode: the steps converted from
 * Python (scalars written straight into place when they can be), recorded
 * with the GIL released.
 */
#include "binding.h"

#include <math.h>

#include "args.h"
#include "replay_impl.h"

/* An episode handle: None (-1: start a new episode) or an integer. */
static int handle_arg(PyObject *o, int64_t *h)
{
    if (o == Py_None) {
        *h = -1;
        return 0;
    }
    return exr_handle_arg(o, "h", "an int episode handle or None", h);
}

/* Writes a Python int or float straight into a scalar column of dtype d, the
 * common cases of action and reward; 0 when the generic path must be taken. */
static int scalar_fast(PyArray_Descr *d, PyObject *o, void *out)
{
    int t = d->type_num;
    if (PyFloat_CheckExact(o)) {
        double v = PyFloat_AS_DOUBLE(o);
        if (t == NPY_FLOAT32) {
            float f = (float)v;
            memcpy(out, &f, sizeof f);
            return 1;
        }
        if (t == NPY_FLOAT64) {
            memcpy(out, &v, sizeof v);
            return 1;
        }
        return 0;
    }
    if (PyLong_CheckExact(o)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (overflow || (x == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (t == NPY_INT64) {
            int64_t v = x;
            memcpy(out, &v, sizeof v);
            return 1;
        }
        if (t == NPY_FLOAT32) {
            float f = (float)x;
            memcpy(out, &f, sizeof f);
            return 1;
        }
        if (t == NPY_FLOAT64) {
            double v = (double)x;
            memcpy(out, &v, sizeof v);
            return 1;
        }
    }
    return 0;
}

/* One scalar-or-array column value: either written to tmp (fast) or held in
 * *arr. Returns the data pointer, NULL with an exception. */
static const void *column_value(PyObject *o, PyArray_Descr *d, int nd, const npy_intp *shape,
                                const char *name, unsigned char *tmp, PyArrayObject **arr)
{
    if (nd == 0 && scalar_fast(d, o, tmp))
        return tmp;
    *arr = exr_as_array(o, d, 0, NULL, nd, shape, name);
    return *arr ? PyArray_DATA(*arr) : NULL;
}

static PyObject *record_status(exr_status st, int64_t h)
{
    if (st != EXR_OK)
        return exr_raise(st, "record");
    return PyLong_FromLongLong(h);
}

PyObject *replay_record(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"h", "state", "action", "reward",
                                        "final_state", "terminated", "priority"};
    PyObject *a[7];
    PyArrayObject *state = NULL, *action = NULL, *reward = NULL, *fin = NULL;
    unsigned char abuf[16], rbuf[16];
    if (exr_parse_args(args, nargs, kwnames, "record", names, 4, 7, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    double prio = NAN;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0)
        return NULL;
    if (a[6] && a[6] != Py_None) {
        if (exr_real_arg(a[6], "priority", &prio) < 0)
            return NULL;
        if (!priority_ok(prio))
            return PyErr_Format(PyExc_ValueError,
                                "priority: expected a finite number >= 0 or None, got %R", a[6]);
    }
    state = exr_as_array(a[1], self->state_descr, 0, NULL, self->state_nd, self->state_shape,
                         "state");
    if (!state)
        goto error;
    const void *ap = column_value(a[2], self->action_descr, self->action_nd, self->action_shape,
                                  "action", abuf, &action);
    if (!ap)
        goto error;
    const void *rp = column_value(a[3], self->reward_descr, 0, NULL, "reward", rbuf, &reward);
    if (!rp)
        goto error;
    if (a[4] && a[4] != Py_None) {
        fin = exr_as_array(a[4], self->state_descr, 0, NULL, self->state_nd, self->state_shape,
                           "final_state");
        if (!fin)
            goto error;
    }
    exr_steps in = {
        .states = PyArray_DATA(state),
        .actions = ap,
        .rewards = rp,
        .priorities = isnan(prio) ? NULL : &prio,
        .T = 1,
        .final_state = fin ? PyArray_DATA(fin) : NULL,
        .end = fin != NULL || terminated,
        .terminated = terminated,
    };
    exr_status st;
    struct exr_log *lg = exr_replay_log(self);
    Py_BEGIN_ALLOW_THREADS
    if (lg)
        exr_log_throttle(lg); /* the log's back-pressure, before any lock */
    st = exr_buffer_record(self->buf, h, &in, &h);
    Py_END_ALLOW_THREADS
    Py_DECREF(state);
    Py_XDECREF(action);
    Py_XDECREF(reward);
    Py_XDECREF(fin);
    return record_status(st, h);
error:
    Py_XDECREF(state);
    Py_XDECREF(action);
    Py_XDECREF(reward);
    Py_XDECREF(fin);
    return NULL;
}

PyObject *replay_record_many(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                                    PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"h", "states", "actions", "rewards",
                                        "final_state", "terminated", "priorities"};
    PyObject *a[7];
    PyArrayObject *states = NULL, *actions = NULL, *rewards = NULL, *fin = NULL, *prios = NULL;
    if (exr_parse_args(args, nargs, kwnames, "record_many", names, 4, 7, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0)
        return NULL;
    npy_intp T = -1;
    states = exr_as_array(a[1], self->state_descr, 1, &T, self->state_nd, self->state_shape,
                          "states");
    if (!states)
        goto error;
    if (T == 0) {
        PyErr_SetString(PyExc_ValueError, "states: expected at least one step, got 0");
        goto error;
    }
    actions = exr_as_array(a[2], self->action_descr, 1, &T, self->action_nd, self->action_shape,
                           "actions");
    if (!actions)
        goto error;
    rewards = exr_as_array(a[3], self->reward_descr, 1, &T, 0, NULL, "rewards");
    if (!rewards)
        goto error;
    if (a[6] && a[6] != Py_None) {
        if (exr_refuse_bools(a[6], "priorities") < 0)
            goto error;
        PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
        prios = exr_as_array(a[6], f64, 1, &T, 0, NULL, "priorities");
        Py_DECREF(f64);
        if (!prios)
            goto error;
        const double *p = PyArray_DATA(prios);
        for (npy_intp i = 0; i < T; i++) {
            if (!priority_ok(p[i])) {
                PyObject *bad = PyFloat_FromDouble(p[i]);
                if (bad)
                    PyErr_Format(PyExc_ValueError,
                                 "priorities: expected finite numbers >= 0, got %R at index %zd",
                                 bad, (Py_ssize_t)i);
                Py_XDECREF(bad);
                goto error;
            }
        }
    }
    if (a[4] && a[4] != Py_None) {
        fin = exr_as_array(a[4], self->state_descr, 0, NULL, self->state_nd, self->state_shape,
                           "final_state");
        if (!fin)
            goto error;
    }
    exr_steps in = {
        .states = PyArray_DATA(states),
        .actions = PyArray_DATA(actions),
        .rewards = PyArray_DATA(rewards),
        .priorities = prios ? PyArray_DATA(prios) : NULL,
        .T = (size_t)T,
        .final_state = fin ? PyArray_DATA(fin) : NULL,
        .end = fin != NULL || terminated,
        .terminated = terminated,
    };
    exr_status st;
    struct exr_log *lg = exr_replay_log(self);
    Py_BEGIN_ALLOW_THREADS
    if (lg)
        exr_log_throttle(lg); /* the log's back-pressure, before any lock */
    st = exr_buffer_record(self->buf, h, &in, &h);
    Py_END_ALLOW_THREADS
    Py_DECREF(states);
    Py_DECREF(actions);
    Py_DECREF(rewards);
    Py_XDECREF(prios);
    Py_XDECREF(fin);
    return record_status(st, h);
error:
    Py_XDECREF(states);
    Py_XDECREF(actions);
    Py_XDECREF(rewards);
    Py_XDECREF(prios);
    Py_XDECREF(fin);
    return NULL;
}

PyObject *replay_new_episode(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    int64_t h;
    exr_lock_with_gil(self->buf);
    exr_status st = exr_buffer_new_episode_locked(self->buf, &h);
    exr_buffer_unlock(self->buf);
    if (st != EXR_OK)
        return exr_raise(st, "new_episode");
    return PyLong_FromLongLong(h);
}

PyObject *replay_remove_episode(ReplayObject *self, PyObject *ho)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    if (exr_handle_arg(ho, "h", "an int episode handle", &h) < 0)
        return NULL;
    exr_status st;
    Py_BEGIN_ALLOW_THREADS
    exr_buffer_lock(self->buf);
    st = exr_buffer_remove_episode_locked(self->buf, h);
    exr_buffer_unlock(self->buf);
    Py_END_ALLOW_THREADS
    if (st == EXR_ENOTFOUND)
        return PyErr_Format(PyExc_ValueError,
                            "h: expected the handle of an episode held, got %lld (evicted or "
                            "never created)",
                            (long long)h);
    if (st != EXR_OK)
        return exr_raise(st, "remove_episode");
    Py_RETURN_NONE;
}
