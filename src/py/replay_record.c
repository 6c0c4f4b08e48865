/*
 * replay_record.c - record, record_many and new_episode: the steps converted from
 * Python (scalars written straight into place when they can be), recorded
 * with the GIL released.
 */
#include "binding.h"

#include <math.h>

#include "args.h"
#include "named.h"
#include "replay_impl.h"

/* An episode handle: None (-1: start a new episode) or an integer. */
static int handle_arg(PyObject *o, int64_t *h)
{
    if (o == Py_None) {
        *h = -1;
        return 0;
    }
    /* one beyond int64 (-1) is unknown: a new episode, as for any other */
    return exr_handle_arg(o, "h", "an int episode handle or None", h) < 0 ? -1 : 0;
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

/* The arrays a record call holds until the core has copied them, and its
 * named fields and extras (named.c) when the buffer has them. */
enum { HELD_STATE, HELD_ACTION, HELD_REWARD, HELD_FINAL, HELD_PRIO, NHELD };
typedef struct {
    PyArrayObject *v[NHELD];
    int named; /* fi holds parsed fields */
    exr_fields_in fi;
} held_arrays;

/* Only the array slots and the flag: fi (2.8 KB) is filled by
 * exr_fields_in_parse when the call takes named fields, and zeroing it on
 * every call was a sixth of a single record's instructions. */
static void held_init(held_arrays *held)
{
    for (int i = 0; i < NHELD; i++)
        held->v[i] = NULL;
    held->named = 0;
}

static void release_arrays(ReplayObject *self, held_arrays *held)
{
    for (int i = 0; i < NHELD; i++)
        Py_CLEAR(held->v[i]);
    if (held->named)
        exr_fields_in_release(self, &held->fi);
    held->named = 0;
}

/* Whether a call takes its state (and final state) as named fields: the
 * buffer has fields or extras, or the call passes extras (then refused). */
static int takes_fields(ReplayObject *self, PyObject *extras)
{
    return self->sfields || self->xfields || (extras && extras != Py_None);
}

/* The state column: named fields (with final state and extras) or one
 * array of `lead` leading steps (*T; NULL for one step). */
static int state_args(ReplayObject *self, PyObject *const *a, npy_intp *T, held_arrays *held)
{
    if (takes_fields(self, a[7])) {
        if (exr_fields_in_parse(self, a[1], a[4], a[7], T, &held->fi) < 0)
            return -1;
        held->named = 1;
        return 0;
    }
    held->v[HELD_STATE] = exr_as_array(a[1], self->state_descr, T ? 1 : 0, T, self->state_nd,
                                       self->state_shape, T ? "states" : "state");
    if (!held->v[HELD_STATE])
        return -1;
    if (!a[4] || a[4] == Py_None)
        return 0;
    held->v[HELD_FINAL] = exr_as_array(a[4], self->state_descr, 0, NULL, self->state_nd,
                                       self->state_shape, "final_state");
    return held->v[HELD_FINAL] ? 0 : -1;
}

/* The core's steps from what state_args held: states, final state, fields. */
static void steps_state(const held_arrays *held, exr_steps *in, bool terminated)
{
    const void *fp = held->named            ? (const void *)held->fi.fin
                     : held->v[HELD_FINAL] ? PyArray_DATA(held->v[HELD_FINAL])
                                           : NULL;
    in->states = held->named ? NULL : PyArray_DATA(held->v[HELD_STATE]);
    in->final_state = fp;
    in->end = fp != NULL || terminated;
    in->terminated = terminated;
    in->fields = held->named ? held->fi.plan : NULL;
    in->nfields = held->named ? held->fi.nplan : 0;
}

/* The core's record, then the held arrays released. The new handle or NULL.
 * A small call that needs no waiting keeps the GIL (its work is shorter
 * than releasing and taking back the GIL, and in a program whose other
 * threads want the GIL, taking it back can wait for one of them); any other
 * runs with the GIL released, after the log's back-pressure. */
static PyObject *record_steps(ReplayObject *self, int64_t h, const exr_steps *in,
                              held_arrays *held)
{
    exr_status st = EXR_OK;
    bool done = false;
    /* the log object held across the GIL's release: another thread may
     * detach the log and drop it meanwhile */
    PyObject *logobj = Py_XNewRef(self->log);
    struct exr_log *lg = exr_replay_log(self);
    exr_leaves lv; /* the priorities' p ** alpha, before the lock */
    const exr_leaves *lvp = in->priorities ? &lv : NULL;
    bool nowait = !lg && !exr_nogil_calls;
    if (nowait) { /* with the GIL, which the call keeps anyway if it goes */
        if (lvp)
            exr_leaves_prepare(self->buf, in, &lv);
        st = exr_buffer_record_nowait(self->buf, h, in, lvp, &h, &done);
    }
    if (!done) {
        EXR_NOGIL_BEGIN
        if (lvp && !nowait) /* without the GIL: another thread may want it */
            exr_leaves_prepare(self->buf, in, &lv);
        if (lg)
            exr_log_throttle(lg);
        st = exr_buffer_record(self->buf, h, in, lvp, &h);
        EXR_NOGIL_END
    } else {
        exr_gil_kept++;
    }
    if (lvp)
        exr_leaves_release(&lv);
    Py_XDECREF(logobj);
    release_arrays(self, held);
    exr_collapse_queued();
    return record_status(st, h);
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
                                        "final_state", "terminated", "priority", "extras"};
    PyObject *a[8];
    held_arrays held;
    held_init(&held);
    unsigned char abuf[16], rbuf[16];
    if (exr_parse_args(args, nargs, kwnames, "record", names, 4, 8, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    double prio;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0 ||
        priority_arg(a[6], &prio) < 0)
        return NULL;
    const void *ap = NULL, *rp = NULL;
    if (state_args(self, a, NULL, &held) < 0 ||
        !(ap = column_value(a[2], self->action_descr, self->action_nd, self->action_shape,
                            "action", abuf, &held.v[HELD_ACTION])) ||
        !(rp = column_value(a[3], self->reward_descr, 0, NULL, "reward", rbuf,
                            &held.v[HELD_REWARD]))) {
        release_arrays(self, &held);
        return NULL;
    }
    exr_steps in = {
        .actions = ap,
        .rewards = rp,
        .priorities = isnan(prio) ? NULL : &prio,
        .T = 1,
    };
    steps_state(&held, &in, terminated);
    if (self->log && exr_replay_log_check(self, "record") < 0) {
        release_arrays(self, &held);
        return NULL;
    }
    return record_steps(self, h, &in, &held);
}

/* states (or fields), actions and rewards: T steps each (T >= 1). */
static int steps_args(ReplayObject *self, PyObject *const *a, npy_intp *T, held_arrays *held)
{
    if (state_args(self, a, T, held) < 0)
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
                                        "final_state", "terminated", "priorities", "extras"};
    PyObject *a[8];
    held_arrays held;
    held_init(&held);
    if (exr_parse_args(args, nargs, kwnames, "record_many", names, 4, 8, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    if (handle_arg(a[0], &h) < 0 || truth_arg(a[5], "terminated", &terminated) < 0)
        return NULL;
    npy_intp T = -1;
    if (steps_args(self, a, &T, &held) < 0 || priorities_arg(a[6], &T, &held.v[HELD_PRIO]) < 0) {
        release_arrays(self, &held);
        return NULL;
    }
    PyArrayObject *prios = held.v[HELD_PRIO];
    exr_steps in = {
        .actions = PyArray_DATA(held.v[HELD_ACTION]),
        .rewards = PyArray_DATA(held.v[HELD_REWARD]),
        .priorities = prios ? PyArray_DATA(prios) : NULL,
        .T = (size_t)T,
    };
    steps_state(&held, &in, terminated);
    if (self->log && exr_replay_log_check(self, "record_many") < 0) {
        release_arrays(self, &held);
        return NULL;
    }
    return record_steps(self, h, &in, &held);
}

/* ---- end_episode -------------------------------------------------------- */

/* end_episode's final_state: None (*fp NULL) or one state, converted as
 * record converts it (named fields packed); held keeps it until released. */
static int end_final_arg(ReplayObject *self, PyObject *o, held_arrays *held, const void **fp)
{
    *fp = NULL;
    if (!o || o == Py_None)
        return 0;
    if (self->sfields) {
        if (exr_fields_in_final(self, o, &held->fi) < 0)
            return -1;
        held->named = 1;
        *fp = held->fi.fin;
        return 0;
    }
    held->v[HELD_FINAL] = exr_as_array(o, self->state_descr, 0, NULL, self->state_nd,
                                       self->state_shape, "final_state");
    if (!held->v[HELD_FINAL])
        return -1;
    *fp = PyArray_DATA(held->v[HELD_FINAL]);
    return 0;
}

/* The core's end, with the GIL released for the whole call: it may wait for
 * the log's writer (back-pressure, before the lock, as record does) and for a
 * record call copying into h (docs/design.md, "Locking and the GIL"). */
static exr_status end_nogil(ReplayObject *self, int64_t h, const void *fp, bool terminated,
                            exr_end_outcome *out)
{
    /* the log object held across the GIL's release, as record holds it */
    PyObject *logobj = Py_XNewRef(self->log);
    struct exr_log *lg = exr_replay_log(self);
    exr_status st;
    EXR_NOGIL_BEGIN
    if (lg)
        exr_log_throttle(lg);
    exr_buffer_lock(self->buf);
    st = exr_buffer_end_episode_locked(self->buf, h, fp, terminated, out);
    exr_buffer_unlock(self->buf);
    exr_collapse_queued_nogil(); /* the end's cut of the last segment, as after record */
    EXR_NOGIL_END
    Py_XDECREF(logobj);
    return st;
}

/* What end_episode returns or raises for the core's status and outcome; ho
 * is h as given (shown in messages, also beyond int64). */
static PyObject *end_result(exr_status st, exr_end_outcome out, PyObject *ho)
{
    if (st == EXR_OK)
        return PyBool_FromLong(out == EXR_END_DONE);
    if (st != EXR_ENOTFOUND && st != EXR_EINVAL)
        return exr_raise(st, "end_episode");
    PyObject *v = PyNumber_Index(ho);
    if (!v)
        return NULL;
    if (out == EXR_END_UNKNOWN)
        PyErr_Format(PyExc_ValueError,
                     "h: expected the handle of an episode of this buffer, got %S, which no "
                     "episode has had",
                     v);
    else if (out == EXR_END_ENDED)
        PyErr_Format(PyExc_ValueError,
                     "h: expected an open episode, got episode %S, which has ended", v);
    else
        PyErr_Format(PyExc_ValueError,
                     "h: expected an episode with a step to end (final_state is its last "
                     "step's next state), got episode %S, which has none",
                     v);
    Py_DECREF(v);
    return NULL;
}

PyObject *replay_end_episode(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"h", "final_state", "terminated"};
    PyObject *a[3];
    if (exr_parse_args(args, nargs, kwnames, "end_episode", names, 1, 3, a) < 0)
        return NULL;
    int64_t h;
    bool terminated;
    if (exr_handle_arg(a[0], "h", "an int episode handle", &h) < 0 ||
        truth_arg(a[2], "terminated", &terminated) < 0)
        return NULL;
    held_arrays held;
    held_init(&held);
    const void *fp;
    if (end_final_arg(self, a[1], &held, &fp) < 0) {
        release_arrays(self, &held);
        return NULL;
    }
    if (!fp && !terminated) { /* the core refuses it too (EXR_END_NO_END) */
        PyErr_SetString(PyExc_ValueError,
                        "final_state: expected a state, or terminated=True (an episode ends with "
                        "its last step's next state or as terminal), got None and "
                        "terminated=False");
        return NULL;
    }
    if (exr_replay_log_check(self, "end_episode") < 0) {
        release_arrays(self, &held);
        return NULL;
    }
    exr_end_outcome out = EXR_END_DONE;
    exr_status st = end_nogil(self, h, fp, terminated, &out);
    release_arrays(self, &held);
    return end_result(st, out, a[0]);
}

PyObject *replay_new_episode(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    int64_t h;
    bool done;
    /* a reservation under a short mutex; the storage lock only when one
     * cannot be made (docs/design.md, "Locking and the GIL") */
    exr_status st = exr_buffer_new_episode(self->buf, &h, &done);
    if (!done) {
        exr_lock_with_gil(self->buf);
        st = exr_buffer_new_episode_locked(self->buf, &h);
        exr_buffer_unlock(self->buf);
    }
    if (st != EXR_OK)
        return exr_raise(st, "new_episode");
    return PyLong_FromLongLong(h);
}

PyObject *replay_remove_episode(ReplayObject *self, PyObject *ho)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    int r = exr_handle_arg(ho, "h", "an int episode handle", &h);
    if (r)
        return r > 0 ? exr_unknown_episode(h, ho) : NULL;
    exr_status st;
    EXR_NOGIL_BEGIN
    exr_buffer_lock(self->buf);
    st = exr_buffer_remove_episode_locked(self->buf, h);
    exr_buffer_unlock(self->buf);
    EXR_NOGIL_END
    if (st == EXR_ENOTFOUND)
        return exr_unknown_episode(h, NULL);
    if (st != EXR_OK)
        return exr_raise(st, "remove_episode");
    Py_RETURN_NONE;
}
