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

/* The arrays a record call holds until the core has copied them. */
enum { HELD_STATE, HELD_ACTION, HELD_REWARD, HELD_FINAL, HELD_PRIO, NHELD };
typedef struct {
    PyArrayObject *v[NHELD];
} held_arrays;

static void release_arrays(held_arrays *held)
{
    for (int i = 0; i < NHELD; i++)
        Py_CLEAR(held->v[i]);
}

/* The core's record with the GIL released (after the log's back-pressure,
 * before any lock), then the held arrays released. The new handle or NULL. */
static PyObject *record_steps(ReplayObject *self, int64_t h, const exr_steps *in,
                              held_arrays *held)
{
    exr_status st;
    struct exr_log *lg = exr_replay_log(self);
    Py_BEGIN_ALLOW_THREADS
    if (lg)
        exr_log_throttle(lg);
    st = exr_buffer_record(self->buf, h, in, &h);
    Py_END_ALLOW_THREADS
    release_arrays(held);
    return record_status(st, h);
}

/* final_state: None/absent or one state. */
static int final_state_arg(ReplayObject *self, PyObject *o, PyArrayObject **fin)
{
    if (!o || o == Py_None)
        return 0;
    *fin = exr_as_array(o, self->state_descr, 0, NULL, self->state_nd, self->state_shape,
                        "final_state");
    return *fin ? 0 : -1;
}

/* record's priority: None/absent (NAN) or a finite real >= 0. */
static int priority_arg(PyObject *o, double *prio)
{
    *prio = NAN;
    if (!o || o == Py_None)
        return 0;
    if (exr_real_arg(o, "priority", prio) < 0)
        return -1;
    if (!priority_ok(*prio)) {
        PyErr_Format(PyExc_ValueError, "priority: expected a finite number >= 0 or None, got %R",
                     o);
        return -1;
    }
    return 0;
}

/* record_many's priorities: None/absent or T finite reals >= 0. */
static int priorities_arg(PyObject *o, npy_intp *T, PyArrayObject **prios)
{
    if (!o || o == Py_None)
        return 0;
    if (exr_refuse_bools(o, "priorities") < 0)
        return -1;
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    *prios = exr_as_array(o, f64, 1, T, 0, NULL, "priorities");
    Py_DECREF(f64);
    if (!*prios)
        return -1;
    return exr_check_priorities(PyArray_DATA(*prios), *T);
}

PyObject *replay_record(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"h", "state", "action", "reward",
                                        "final_state", "terminated", "priority"};
    PyObject *a[7];
    held_arrays held = {{0}};
    unsigned char abuf[16], rbuf[16];
    if (exr_parse_args(args, nargs, kwnames, "record", names, 4, 7, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    double prio;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0 ||
        priority_arg(a[6], &prio) < 0)
        return NULL;
    held.v[HELD_STATE] = exr_as_array(a[1], self->state_descr, 0, NULL, self->state_nd,
                                      self->state_shape, "state");
    const void *ap = NULL, *rp = NULL;
    if (!held.v[HELD_STATE] ||
        !(ap = column_value(a[2], self->action_descr, self->action_nd, self->action_shape,
                            "action", abuf, &held.v[HELD_ACTION])) ||
        !(rp = column_value(a[3], self->reward_descr, 0, NULL, "reward", rbuf,
                            &held.v[HELD_REWARD])) ||
        final_state_arg(self, a[4], &held.v[HELD_FINAL]) < 0) {
        release_arrays(&held);
        return NULL;
    }
    PyArrayObject *fin = held.v[HELD_FINAL];
    exr_steps in = {
        .states = PyArray_DATA(held.v[HELD_STATE]),
        .actions = ap,
        .rewards = rp,
        .priorities = isnan(prio) ? NULL : &prio,
        .T = 1,
        .final_state = fin ? PyArray_DATA(fin) : NULL,
        .end = fin != NULL || terminated,
        .terminated = terminated,
    };
    return record_steps(self, h, &in, &held);
}

/* states, actions and rewards: T steps each (T >= 1). */
static int steps_args(ReplayObject *self, PyObject *const *a, npy_intp *T, held_arrays *held)
{
    held->v[HELD_STATE] = exr_as_array(a[1], self->state_descr, 1, T, self->state_nd,
                                       self->state_shape, "states");
    if (!held->v[HELD_STATE])
        return -1;
    if (*T == 0) {
        PyErr_SetString(PyExc_ValueError, "states: expected at least one step, got 0");
        return -1;
    }
    held->v[HELD_ACTION] = exr_as_array(a[2], self->action_descr, 1, T, self->action_nd,
                                        self->action_shape, "actions");
    if (!held->v[HELD_ACTION])
        return -1;
    held->v[HELD_REWARD] = exr_as_array(a[3], self->reward_descr, 1, T, 0, NULL, "rewards");
    return held->v[HELD_REWARD] ? 0 : -1;
}

PyObject *replay_record_many(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"h", "states", "actions", "rewards",
                                        "final_state", "terminated", "priorities"};
    PyObject *a[7];
    held_arrays held = {{0}};
    if (exr_parse_args(args, nargs, kwnames, "record_many", names, 4, 7, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0)
        return NULL;
    npy_intp T = -1;
    if (steps_args(self, a, &T, &held) < 0 || priorities_arg(a[6], &T, &held.v[HELD_PRIO]) < 0 ||
        final_state_arg(self, a[4], &held.v[HELD_FINAL]) < 0) {
        release_arrays(&held);
        return NULL;
    }
    PyArrayObject *fin = held.v[HELD_FINAL], *prios = held.v[HELD_PRIO];
    exr_steps in = {
        .states = PyArray_DATA(held.v[HELD_STATE]),
        .actions = PyArray_DATA(held.v[HELD_ACTION]),
        .rewards = PyArray_DATA(held.v[HELD_REWARD]),
        .priorities = prios ? PyArray_DATA(prios) : NULL,
        .T = (size_t)T,
        .final_state = fin ? PyArray_DATA(fin) : NULL,
        .end = fin != NULL || terminated,
        .terminated = terminated,
    };
    return record_steps(self, h, &in, &held);
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
