/*
 * replay.c - the ExperienceReplay type. Each method converts its arguments
 * while holding the GIL (output arrays are made here too), then releases the
 * GIL for the core call that does the work, and converts the result back.
 */
#include "binding.h"
#include "docstrings.h"

#include <math.h>

#include "args.h"
#include <structmember.h>

/* ---- argument helpers --------------------------------------------------- */

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
        while (i < nmax && PyUnicode_CompareWithASCIIString(key, names[i]) != 0)
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

/* An episode handle: None (-1: start a new episode) or an integer. */
static int handle_arg(PyObject *o, int64_t *h)
{
    if (o == Py_None) {
        *h = -1;
        return 0;
    }
    return exr_handle_arg(o, "h", "an int episode handle or None", h);
}

static int priority_ok(double p) { return isfinite(p) && p >= 0; }

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

static int truth_arg(PyObject *o, const char *name, bool *out)
{
    if (!o) {
        *out = false;
        return 0;
    }
    if (!PyBool_Check(o) && !PyArray_IsScalar(o, Bool) && !PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s: expected a bool, got %s", name, Py_TYPE(o)->tp_name);
        return -1;
    }
    int t = PyObject_IsTrue(o);
    if (t < 0)
        return -1;
    *out = t;
    return 0;
}

/* The ValueError for a selector handle this buffer does not have. NULL. */
static PyObject *unknown_selector(int64_t h)
{
    return PyErr_Format(PyExc_ValueError,
                        "ps: expected a pick selector of this buffer, got unknown handle %lld",
                        (long long)h);
}

static exr_modstate *mstate(ReplayObject *self) { return exr_state_of_type(Py_TYPE(self)); }

/* ---- construction ------------------------------------------------------- */

static int shape_arg(PyObject *o, const char *name, int maxnd, int *nd, npy_intp *shape)
{
    PyObject *seq;
    if (exr_is_int(o)) {
        seq = PyTuple_Pack(1, o);
    } else if (PyTuple_Check(o) || PyList_Check(o)) {
        seq = PySequence_Tuple(o);
    } else {
        PyErr_Format(PyExc_TypeError, "%s: expected an int or a tuple of ints, got %s", name,
                     Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!seq)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(seq);
    if (n > maxnd) {
        PyErr_Format(PyExc_ValueError, "%s: expected at most %d dimensions, got %zd", name, maxnd,
                     n);
        Py_DECREF(seq);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyTuple_GET_ITEM(seq, i);
        if (!exr_is_int(d)) {
            PyErr_Format(PyExc_TypeError, "%s: expected a tuple of ints, got a %s at index %zd",
                         name, Py_TYPE(d)->tp_name, i);
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t v = PyNumber_AsSsize_t(d, NULL);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v < 1) {
            PyErr_Format(PyExc_ValueError, "%s: expected dimensions >= 1, got %zd at index %zd",
                         name, v, i);
            Py_DECREF(seq);
            return -1;
        }
        shape[i] = v;
    }
    *nd = (int)n;
    Py_DECREF(seq);
    return 0;
}

PyArray_Descr *exr_dtype_arg(PyObject *o, const char *name, int reward)
{
    PyArray_Descr *d = NULL;
    if (o == Py_None || !PyArray_DescrConverter(o, &d)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "%s: expected a NumPy dtype, got %R", name, o);
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

static int bytes_of(const char *name, PyArray_Descr *d, int nd, const npy_intp *shape,
                    size_t *out)
{
    size_t v = (size_t)PyDataType_ELSIZE(d);
    for (int i = 0; i < nd; i++) {
        if (!exr_mul_size(v, (size_t)shape[i], &v) || v > ((size_t)1 << 40)) {
            PyErr_Format(PyExc_ValueError, "%s: one item would take more than 1 TiB", name);
            return -1;
        }
    }
    *out = v;
    return 0;
}

static PyObject *replay_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"state_shape", "state_dtype", "action_shape", "action_dtype",
                             "reward_dtype", "capacity", "pick_len", "allow_short",
                             "eviction", "seed", "log", NULL};
    PyObject *o_sshape, *o_sdtype = NULL, *o_ashape = NULL, *o_adtype = NULL, *o_rdtype = NULL;
    PyObject *o_cap = NULL, *o_plen = NULL, *o_short = NULL, *o_evict = NULL, *o_seed = Py_None;
    PyObject *o_log = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OOOOOOOOOO:ExperienceReplay", kwlist, &o_sshape,
                                     &o_sdtype, &o_ashape, &o_adtype, &o_rdtype, &o_cap, &o_plen,
                                     &o_short, &o_evict, &o_seed, &o_log))
        return NULL;
    ReplayObject *self = (ReplayObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    exr_config cfg = {0};
    PyObject *tmp = NULL;
    if (shape_arg(o_sshape, "state_shape", NPY_MAXDIMS - 2, &self->state_nd, self->state_shape) < 0)
        goto error;
    if (o_ashape && shape_arg(o_ashape, "action_shape", NPY_MAXDIMS - 2, &self->action_nd,
                              self->action_shape) < 0)
        goto error;
    if (!o_sdtype)
        o_sdtype = tmp = PyUnicode_FromString("float32");
    self->state_descr = o_sdtype ? exr_dtype_arg(o_sdtype, "state_dtype", 0) : NULL;
    Py_CLEAR(tmp);
    if (!self->state_descr)
        goto error;
    self->action_descr = o_adtype ? exr_dtype_arg(o_adtype, "action_dtype", 0)
                                  : PyArray_DescrFromType(NPY_INT64);
    if (!self->action_descr)
        goto error;
    self->reward_descr = o_rdtype ? exr_dtype_arg(o_rdtype, "reward_dtype", 1)
                                  : PyArray_DescrFromType(NPY_FLOAT32);
    if (!self->reward_descr)
        goto error;
    if (bytes_of("state_shape", self->state_descr, self->state_nd, self->state_shape,
                 &cfg.state_bytes) < 0 ||
        bytes_of("action_shape", self->action_descr, self->action_nd, self->action_shape,
                 &cfg.action_bytes) < 0)
        goto error;
    cfg.reward_bytes = (size_t)PyDataType_ELSIZE(self->reward_descr);

    if (!o_cap) {
        cfg.capacity = 1000000;
        self->capacity = PyLong_FromLong(1000000);
    } else if (o_cap == Py_None) {
        cfg.capacity = 0;
        self->capacity = Py_NewRef(Py_None);
    } else {
        /* the file stores it as a u64 that restores as an int64: one range */
        int64_t c;
        if (exr_int_arg(o_cap, "capacity", "an int in [1, 2**63 - 1] or None", 1, INT64_MAX,
                        &c) < 0)
            goto error;
        self->capacity = PyLong_FromLongLong(c);
        cfg.capacity = (uint64_t)c;
    }
    if (!self->capacity)
        goto error;
    cfg.pick_len = 1;
    if (o_plen) {
        int64_t v;
        if (exr_int_arg(o_plen, "pick_len", NULL, 1, EXR_MAX_PICK_LEN, &v) < 0)
            goto error;
        cfg.pick_len = (uint32_t)v;
    }
    if (o_short) {
        bool v;
        if (truth_arg(o_short, "allow_short", &v) < 0)
            goto error;
        cfg.allow_short = v;
    }
    cfg.eviction = EXR_EVICT_FIFO;
    if (o_evict) {
        if (PyUnicode_Check(o_evict) && PyUnicode_CompareWithASCIIString(o_evict, "fifo") == 0)
            cfg.eviction = EXR_EVICT_FIFO;
        else if (PyUnicode_Check(o_evict) &&
                 PyUnicode_CompareWithASCIIString(o_evict, "second_chance") == 0)
            cfg.eviction = EXR_EVICT_SECOND_CHANCE;
        else {
            PyErr_Format(PyExc_ValueError, "eviction: expected 'fifo' or 'second_chance', got %R",
                         o_evict);
            goto error;
        }
    }
    self->eviction = cfg.eviction;
    if (o_seed == Py_None) {
        cfg.seed = exr_rng_entropy();
        self->seed = Py_NewRef(Py_None);
    } else {
        uint64_t s;
        if (exr_uint_arg(o_seed, "seed", "an int in [0, 2**64) or None", UINT64_MAX, &s) < 0)
            goto error;
        self->seed = PyLong_FromUnsignedLongLong(s);
        if (!self->seed)
            goto error;
        cfg.seed = s;
    }
    exr_status st = exr_buffer_new(&cfg, &self->buf);
    if (st != EXR_OK) {
        exr_raise(st, "ExperienceReplay");
        goto error;
    }
    if (o_log != Py_None && exr_replay_attach_log(self, o_log) < 0)
        goto error;
    return (PyObject *)self;
error:
    Py_DECREF(self);
    return NULL;
}

static void replay_dealloc(ReplayObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    if (self->weakreflist)
        PyObject_ClearWeakRefs((PyObject *)self);
    if (self->buf)
        exr_replay_detach_log(self);
    exr_buffer_free(self->buf);
    Py_XDECREF(self->state_descr);
    Py_XDECREF(self->action_descr);
    Py_XDECREF(self->reward_descr);
    Py_XDECREF(self->capacity);
    Py_XDECREF(self->seed);
    tp->tp_free(self);
    Py_DECREF(tp);
}

/* ---- recording ---------------------------------------------------------- */

static PyObject *record_status(exr_status st, int64_t h)
{
    if (st != EXR_OK)
        return exr_raise(st, "record");
    return PyLong_FromLongLong(h);
}

static PyObject *replay_record(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
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

static PyObject *replay_record_many(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
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

static PyObject *replay_new_episode(ReplayObject *self, PyObject *unused)
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

/* ---- selectors ---------------------------------------------------------- */

static PyObject *replay_new_pick_selector(ReplayObject *self, PyObject *args, PyObject *kw)
{
    EXR_GUARD(self, NULL);
    if (PyTuple_GET_SIZE(args) != 1)
        return PyErr_Format(PyExc_TypeError,
                            "new_pick_selector() takes exactly one positional argument, the "
                            "PickSelectorClass (%zd given)",
                            PyTuple_GET_SIZE(args));
    PyObject *o = PyTuple_GET_ITEM(args, 0);
    char want[64];
    snprintf(want, sizeof want, "a PickSelectorClass (0 to %d)", exr_selector_nkinds - 1);
    int64_t kind;
    if (exr_int_arg(o, "kind", want, 0, exr_selector_nkinds - 1, &kind) < 0)
        return NULL;
    const exr_selector_vtable *vt = exr_selector_kinds[kind];
    double params[EXR_SEL_MAXPARAMS];
    for (int k = 0; k < vt->nparams; k++)
        params[k] = vt->param_defaults[k];
    if (kw) {
        PyObject *key, *value;
        Py_ssize_t pos = 0;
        while (PyDict_Next(kw, &pos, &key, &value)) {
            int k = 0;
            while (k < vt->nparams &&
                   PyUnicode_CompareWithASCIIString(key, vt->param_names[k]) != 0)
                k++;
            if (k == vt->nparams)
                return PyErr_Format(PyExc_TypeError,
                                    "new_pick_selector(): a %s selector takes no parameter %R",
                                    vt->name, key);
            const char *pname = vt->param_names[k];
            if (exr_real_arg(value, pname, &params[k]) < 0)
                return NULL;
            if (!vt->param_ok(k, params[k]))
                return PyErr_Format(PyExc_ValueError, "%s: expected a finite number >= 0, got %R",
                                    pname, value);
        }
    }
    int64_t h;
    exr_lock_with_gil(self->buf);
    exr_status st = exr_buffer_add_selector_locked(self->buf, (int)kind, params, &h);
    exr_buffer_unlock(self->buf);
    if (st != EXR_OK)
        return exr_raise(st, "new_pick_selector");
    return exr_selector_new(self, h, (int)kind);
}

static PyObject *replay_remove_pick_selector(ReplayObject *self, PyObject *ps)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    if (exr_selector_handle(self, ps, &h) < 0)
        return NULL;
    exr_lock_with_gil(self->buf);
    exr_status st = exr_buffer_remove_selector_locked(self->buf, h);
    exr_buffer_unlock(self->buf);
    if (st == EXR_ENOTFOUND)
        return unknown_selector(h);
    Py_RETURN_NONE;
}

/* ---- batches ------------------------------------------------------------ */

enum { F_STATE, F_ACTION, F_REWARD, F_NEXT, F_LEN, F_LEN_NEXT, F_EPI, F_POS, F_WEIGHT, F_INDEX,
       NFIELDS };
static const char *const field_names[NFIELDS] = {"state", "action", "reward", "state_next",
                                                 "seq_len", "seq_len_next", "pick_epi",
                                                 "pick_pos", "weight", "pick_index"};

/* Expected dtype and shape of batch field f for B picks. */
static PyArray_Descr *field_spec(ReplayObject *self, int f, npy_intp B, int *nd, npy_intp *dims)
{
    npy_intp L = exr_buffer_config(self->buf)->pick_len;
    dims[0] = B;
    *nd = 1;
    switch (f) {
    case F_STATE:
    case F_NEXT:
        dims[1] = L;
        memcpy(dims + 2, self->state_shape, sizeof(npy_intp) * (size_t)self->state_nd);
        *nd = 2 + self->state_nd;
        Py_INCREF(self->state_descr);
        return self->state_descr;
    case F_ACTION:
        dims[1] = L;
        memcpy(dims + 2, self->action_shape, sizeof(npy_intp) * (size_t)self->action_nd);
        *nd = 2 + self->action_nd;
        Py_INCREF(self->action_descr);
        return self->action_descr;
    case F_REWARD:
        dims[1] = L;
        *nd = 2;
        Py_INCREF(self->reward_descr);
        return self->reward_descr;
    case F_WEIGHT:
        return PyArray_DescrFromType(NPY_FLOAT32);
    default:
        return PyArray_DescrFromType(NPY_INT64);
    }
}

/* The arrays of a new batch of B picks, carved from one block (block.c). */
static int new_batch_arrays(ReplayObject *self, npy_intp B, PyObject **arrays)
{
    int nds[NFIELDS];
    npy_intp dims[NFIELDS][NPY_MAXDIMS];
    PyArray_Descr *descrs[NFIELDS] = {0};
    size_t offs[NFIELDS], total = 0;
    PyObject *block = NULL;
    for (int f = 0; f < NFIELDS; f++) {
        descrs[f] = field_spec(self, f, B, &nds[f], dims[f]);
        if (!descrs[f])
            goto fail;
        size_t bytes = (size_t)PyDataType_ELSIZE(descrs[f]);
        for (int i = 0; i < nds[f]; i++)
            if (!exr_mul_size(bytes, (size_t)dims[f][i], &bytes))
                goto too_big;
        offs[f] = total;
        if (!exr_add_size(total, bytes + 63, &total) || total > (size_t)PY_SSIZE_T_MAX)
            goto too_big;
        total &= ~(size_t)63;
    }
    block = exr_block_new(mstate(self), total);
    if (!block)
        goto fail;
    char *mem = exr_block_data(block);
    for (int f = 0; f < NFIELDS; f++) {
        /* NewFromDescr steals the descr, SetBaseObject the block reference,
         * both even when they fail */
        PyArray_Descr *d = descrs[f];
        descrs[f] = NULL;
        arrays[f] = PyArray_NewFromDescr(&PyArray_Type, d, nds[f], dims[f], NULL, mem + offs[f],
                                         NPY_ARRAY_CARRAY, NULL);
        if (!arrays[f])
            goto fail;
        Py_INCREF(block);
        if (PyArray_SetBaseObject((PyArrayObject *)arrays[f], block) < 0)
            goto fail;
    }
    Py_DECREF(block);
    return 0;
too_big:
    PyErr_Format(PyExc_MemoryError, "batch_size: a batch of %zd picks would not fit in memory",
                 (Py_ssize_t)B);
fail:
    for (int f = 0; f < NFIELDS; f++) {
        Py_CLEAR(arrays[f]);
        Py_XDECREF(descrs[f]);
    }
    Py_XDECREF(block);
    return -1;
}

/* arrays[f] borrowed from `out` after checking them, or new arrays. */
static int batch_arrays(ReplayObject *self, npy_intp B, PyObject *out, PyObject **arrays)
{
    exr_modstate *st = mstate(self);
    if (out && !Py_IS_TYPE(out, st->batch_type)) {
        PyErr_Format(PyExc_TypeError, "out: expected a Batch from get_batch, got %s",
                     Py_TYPE(out)->tp_name);
        return -1;
    }
    if (!out)
        return new_batch_arrays(self, B, arrays);
    for (int f = 0; f < NFIELDS; f++) {
        int nd;
        npy_intp dims[NPY_MAXDIMS];
        PyArray_Descr *d = field_spec(self, f, B, &nd, dims);
        if (!d)
            goto error;
        PyObject *a = PyStructSequence_GetItem(out, f);
        int ok = PyArray_Check(a) && PyArray_EquivTypes(PyArray_DESCR((PyArrayObject *)a), d) &&
                 PyArray_NDIM((PyArrayObject *)a) == nd &&
                 PyArray_IS_C_CONTIGUOUS((PyArrayObject *)a) &&
                 PyArray_ISALIGNED((PyArrayObject *)a) && PyArray_ISWRITEABLE((PyArrayObject *)a);
        for (int i = 0; ok && i < nd; i++)
            ok = PyArray_DIM((PyArrayObject *)a, i) == dims[i];
        if (!ok) {
            char want[256];
            exr_shape_str(want, sizeof want, nd, dims);
            PyObject *got = exr_describe_value(a);
            if (got)
                PyErr_Format(PyExc_ValueError,
                             "out: expected out.%s to be a writeable C-contiguous %S array of "
                             "shape %s, got %U",
                             field_names[f], (PyObject *)d, want, got);
            Py_XDECREF(got);
            Py_DECREF(d);
            goto error;
        }
        Py_DECREF(d);
        arrays[f] = Py_NewRef(a);
    }
    return 0;
error:
    for (int f = 0; f < NFIELDS; f++)
        Py_CLEAR(arrays[f]);
    return -1;
}

static void batch_out_of(PyObject **arrays, exr_batch_out *o)
{
#define DATA(f) PyArray_DATA((PyArrayObject *)arrays[f])
    o->state = DATA(F_STATE);
    o->action = DATA(F_ACTION);
    o->reward = DATA(F_REWARD);
    o->state_next = DATA(F_NEXT);
    o->seq_len = DATA(F_LEN);
    o->seq_len_next = DATA(F_LEN_NEXT);
    o->pick_epi = DATA(F_EPI);
    o->pick_pos = DATA(F_POS);
    o->weight = DATA(F_WEIGHT);
    o->pick_index = DATA(F_INDEX);
#undef DATA
}

/* The Batch holding arrays (stolen), or out refilled. */
static PyObject *batch_result(ReplayObject *self, PyObject **arrays, PyObject *out)
{
    if (out) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return Py_NewRef(out);
    }
    PyObject *b = PyStructSequence_New(mstate(self)->batch_type);
    if (!b) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return NULL;
    }
    for (int f = 0; f < NFIELDS; f++)
        PyStructSequence_SET_ITEM(b, f, arrays[f]);
    return b;
}

static PyObject *batch_error(ReplayObject *self, exr_status st, int64_t h, PyObject **arrays)
{
    for (int f = 0; f < NFIELDS; f++)
        Py_XDECREF(arrays[f]);
    if (st == EXR_ENOTFOUND)
        return unknown_selector(h);
    if (st == EXR_EEMPTY)
        return exr_empty_batch_error(self, h);
    return exr_raise(st, "get_batch");
}

static int batch_size_arg(PyObject *o, npy_intp *B)
{
    int64_t v;
    if (exr_int_arg(o, "batch_size", "an int in [1, 2**63 - 1]", 1, PY_SSIZE_T_MAX, &v) < 0)
        return -1;
    *B = (npy_intp)v;
    return 0;
}

static PyObject *replay_get_batch(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"batch_size", "ps", "out"};
    PyObject *a[3], *arrays[NFIELDS] = {0};
    if (exr_parse_args(args, nargs, kwnames, "get_batch", names, 2, 3, a) < 0)
        return NULL;
    npy_intp B;
    int64_t h;
    if (batch_size_arg(a[0], &B) < 0 || exr_selector_handle(self, a[1], &h) < 0)
        return NULL;
    PyObject *out = a[2] == Py_None ? NULL : a[2];
    /* the largest output array must be addressable */
    const exr_config *cfg = exr_buffer_config(self->buf);
    size_t widest = cfg->state_bytes > cfg->action_bytes ? cfg->state_bytes : cfg->action_bytes;
    size_t bytes;
    if (widest < 8)
        widest = 8;
    if (!exr_mul_size((size_t)B, cfg->pick_len, &bytes) || !exr_mul_size(bytes, widest, &bytes) ||
        bytes > (size_t)PY_SSIZE_T_MAX)
        return PyErr_Format(PyExc_MemoryError,
                            "batch_size: a batch of %zd picks would not fit in memory", (Py_ssize_t)B);
    if (batch_arrays(self, B, out, arrays) < 0)
        return NULL;
    exr_batch_out o;
    batch_out_of(arrays, &o);
    exr_status st;
    Py_BEGIN_ALLOW_THREADS
    st = exr_buffer_get_batch(self->buf, h, (size_t)B, &o);
    Py_END_ALLOW_THREADS
    if (st != EXR_OK)
        return batch_error(self, st, h, arrays);
    return batch_result(self, arrays, out);
}

/* pick_epi and pick_pos as int64 arrays of one length n. */
static int pick_arrays(PyObject *epi, PyObject *pos, PyArrayObject **e, PyArrayObject **p,
                       npy_intp *n)
{
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    *n = -1;
    *e = exr_as_array(epi, i64, 1, n, 0, NULL, "pick_epi");
    *p = *e ? exr_as_array(pos, i64, 1, n, 0, NULL, "pick_pos") : NULL;
    Py_DECREF(i64);
    if (!*p) {
        Py_CLEAR(*e);
        return -1;
    }
    return 0;
}

static PyObject *replay_gather(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    EXR_GUARD(self, NULL);
    PyObject *arrays[NFIELDS] = {0};
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "_gather(ps, pick_epi, pick_pos)");
    int64_t h;
    PyArrayObject *e, *p;
    npy_intp n;
    if (exr_selector_handle(self, args[0], &h) < 0)
        return NULL;
    exr_lock_with_gil(self->buf);
    int known = exr_buffer_selector_locked(self->buf, h) != NULL;
    exr_buffer_unlock(self->buf);
    if (!known)
        return unknown_selector(h);
    if (pick_arrays(args[1], args[2], &e, &p, &n) < 0)
        return NULL;
    if (batch_arrays(self, n, NULL, arrays) < 0) {
        Py_DECREF(e);
        Py_DECREF(p);
        return NULL;
    }
    exr_batch_out o;
    batch_out_of(arrays, &o);
    exr_status st;
    Py_BEGIN_ALLOW_THREADS
    st = exr_buffer_gather(self->buf, h, (size_t)n, PyArray_DATA(e), PyArray_DATA(p), &o);
    Py_END_ALLOW_THREADS
    Py_DECREF(e);
    Py_DECREF(p);
    if (st == EXR_ENOTFOUND) {
        for (int f = 0; f < NFIELDS; f++)
            Py_DECREF(arrays[f]);
        return PyErr_Format(PyExc_ValueError,
                            "pick_epi, pick_pos: expected picks that exist, got one that does not");
    }
    if (st != EXR_OK)
        return batch_error(self, st, h, arrays);
    return batch_result(self, arrays, NULL);
}

/* set_priority(ps, batch, priorities): the batch's picks, reached through
 * the table indices it carries where they still hold. */
static int batch_pick_arrays(ReplayObject *self, PyObject *batch, PyArrayObject **e,
                             PyArrayObject **p, PyArrayObject **x, npy_intp *n)
{
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    *n = -1;
    *e = exr_as_array(PyStructSequence_GetItem(batch, F_EPI), i64, 1, n, 0, NULL, "batch.pick_epi");
    *p = *e ? exr_as_array(PyStructSequence_GetItem(batch, F_POS), i64, 1, n, 0, NULL,
                           "batch.pick_pos")
            : NULL;
    *x = *p ? exr_as_array(PyStructSequence_GetItem(batch, F_INDEX), i64, 1, n, 0, NULL,
                           "batch.pick_index")
            : NULL;
    Py_DECREF(i64);
    (void)self;
    if (!*x) {
        Py_CLEAR(*e);
        Py_CLEAR(*p);
        return -1;
    }
    return 0;
}

static PyObject *replay_set_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames)
{
    EXR_GUARD(self, NULL);
    static const char *const names[] = {"ps", "pick_epi", "pick_pos", "priorities"};
    static const char *const bnames[] = {"ps", "batch", "priorities"};
    PyObject *a[4];
    int fast = nargs >= 2 && Py_IS_TYPE(args[1], mstate(self)->batch_type);
    if (fast) {
        if (exr_parse_args(args, nargs, kwnames, "set_priority", bnames, 3, 3, a) < 0)
            return NULL;
        a[3] = a[2];
    } else if (exr_parse_args(args, nargs, kwnames, "set_priority", names, 4, 4, a) < 0) {
        return NULL;
    }
    int64_t h;
    if (exr_selector_handle(self, a[0], &h) < 0)
        return NULL;
    PyArrayObject *e, *p, *x = NULL, *pr = NULL;
    npy_intp n;
    if (fast ? batch_pick_arrays(self, a[1], &e, &p, &x, &n) < 0
             : pick_arrays(a[1], a[2], &e, &p, &n) < 0)
        return NULL;
    if (exr_refuse_bools(a[3], "priorities") < 0) {
        Py_DECREF(e);
        Py_DECREF(p);
        return NULL;
    }
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    npy_intp m = n;
    /* one priority for every pick, or one each */
    int scalar = PyArray_Check(a[3]) ? PyArray_NDIM((PyArrayObject *)a[3]) == 0
                                     : (PyFloat_Check(a[3]) || PyLong_Check(a[3]) ||
                                        PyArray_IsScalar(a[3], Generic));
    if (scalar)
        pr = exr_as_array(a[3], f64, 0, NULL, 0, NULL, "priorities");
    else
        pr = exr_as_array(a[3], f64, 1, &m, 0, NULL, "priorities");
    Py_DECREF(f64);
    if (!pr)
        goto error;
    const double *pv = PyArray_DATA(pr);
    size_t stride = scalar ? 0 : 1;
    /* a broadcast scalar is checked even when there is no pick to apply it to */
    for (npy_intp i = 0; i < (scalar ? 1 : n); i++) {
        if (!priority_ok(pv[i])) {
            PyObject *bad = PyFloat_FromDouble(pv[i]);
            if (bad)
                PyErr_Format(PyExc_ValueError,
                             "priorities: expected finite numbers >= 0, got %R at index %zd", bad,
                             (Py_ssize_t)i);
            Py_XDECREF(bad);
            goto error;
        }
    }
    exr_status st;
    size_t applied = 0;
    const int64_t *hint = x ? PyArray_DATA(x) : NULL;
    Py_BEGIN_ALLOW_THREADS
    st = exr_buffer_set_priority(self->buf, h, (size_t)n, PyArray_DATA(e), PyArray_DATA(p), hint,
                                 pv, stride, &applied);
    Py_END_ALLOW_THREADS
    Py_DECREF(e);
    Py_DECREF(p);
    Py_XDECREF(x);
    Py_DECREF(pr);
    if (st == EXR_ENOTFOUND)
        return unknown_selector(h);
    if (st != EXR_OK)
        return exr_raise(st, "set_priority");
    return PyLong_FromSize_t(applied);
error:
    Py_DECREF(e);
    Py_DECREF(p);
    Py_XDECREF(x);
    Py_XDECREF(pr);
    return NULL;
}

/* ---- introspection ------------------------------------------------------ */

static PyObject *new_array(PyArray_Descr *d, npy_intp lead, int nd, const npy_intp *shape)
{
    npy_intp dims[NPY_MAXDIMS];
    int k = 0;
    if (lead >= 0)
        dims[k++] = lead;
    for (int i = 0; i < nd; i++)
        dims[k++] = shape[i];
    Py_INCREF(d);
    return PyArray_NewFromDescr(&PyArray_Type, d, k, dims, NULL, NULL, 0, NULL);
}

static PyObject *replay_episode(ReplayObject *self, PyObject *ho)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    if (exr_handle_arg(ho, "h", "an int episode handle", &h) < 0)
        return NULL;
    PyObject *st_a = NULL, *ac_a = NULL, *rw_a = NULL, *fin = NULL;
    for (;;) {
        uint64_t n;
        bool ended, term, has_final;
        exr_lock_with_gil(self->buf);
        exr_status st = exr_buffer_episode_info_locked(self->buf, h, &n, &ended, &term, &has_final);
        exr_buffer_unlock(self->buf);
        if (st != EXR_OK)
            return PyErr_Format(PyExc_ValueError,
                                "h: expected the handle of an episode held, got %lld (evicted or "
                                "never created)",
                                (long long)h);
        st_a = new_array(self->state_descr, (npy_intp)n, self->state_nd, self->state_shape);
        ac_a = new_array(self->action_descr, (npy_intp)n, self->action_nd, self->action_shape);
        rw_a = new_array(self->reward_descr, (npy_intp)n, 0, NULL);
        fin = has_final ? new_array(self->state_descr, -1, self->state_nd, self->state_shape)
                        : Py_NewRef(Py_None);
        if (!st_a || !ac_a || !rw_a || !fin)
            goto error;
        /* copy under one lock hold, if the episode is still as measured */
        uint64_t n2;
        bool e2, t2, f2;
        exr_lock_with_gil(self->buf);
        st = exr_buffer_episode_info_locked(self->buf, h, &n2, &e2, &t2, &f2);
        if (st == EXR_OK && n2 == n && f2 == has_final)
            exr_buffer_episode_copy_locked(
                self->buf, h, PyArray_DATA((PyArrayObject *)st_a),
                PyArray_DATA((PyArrayObject *)ac_a), PyArray_DATA((PyArrayObject *)rw_a),
                has_final ? PyArray_DATA((PyArrayObject *)fin) : NULL);
        exr_buffer_unlock(self->buf);
        if (st == EXR_OK && n2 == n && f2 == has_final) {
            PyObject *r = PyStructSequence_New(mstate(self)->episode_type);
            if (!r)
                goto error;
            PyStructSequence_SET_ITEM(r, 0, st_a);
            PyStructSequence_SET_ITEM(r, 1, ac_a);
            PyStructSequence_SET_ITEM(r, 2, rw_a);
            PyStructSequence_SET_ITEM(r, 3, fin);
            PyStructSequence_SET_ITEM(r, 4, PyBool_FromLong(e2));
            PyStructSequence_SET_ITEM(r, 5, PyBool_FromLong(t2));
            return r;
        }
        Py_CLEAR(st_a);
        Py_CLEAR(ac_a);
        Py_CLEAR(rw_a);
        Py_CLEAR(fin);
    }
error:
    Py_XDECREF(st_a);
    Py_XDECREF(ac_a);
    Py_XDECREF(rw_a);
    Py_XDECREF(fin);
    return NULL;
}

static Py_ssize_t replay_len(ReplayObject *self)
{
    EXR_GUARD(self, -1);
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_len_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return (Py_ssize_t)n;
}

static PyObject *get_num_episodes(ReplayObject *self, void *c)
{
    EXR_GUARD(self, NULL);
    (void)c;
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_num_episodes_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *get_num_picks(ReplayObject *self, void *c)
{
    EXR_GUARD(self, NULL);
    (void)c;
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_num_picks_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *shape_tuple(int nd, const npy_intp *shape)
{
    PyObject *t = PyTuple_New(nd);
    for (int i = 0; t && i < nd; i++) {
        PyObject *v = PyLong_FromSsize_t(shape[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyObject *get_state_shape(ReplayObject *s, void *c)
{
    (void)c;
    return shape_tuple(s->state_nd, s->state_shape);
}
static PyObject *get_action_shape(ReplayObject *s, void *c)
{
    (void)c;
    return shape_tuple(s->action_nd, s->action_shape);
}
static PyObject *get_state_dtype(ReplayObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->state_descr);
}
static PyObject *get_action_dtype(ReplayObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->action_descr);
}
static PyObject *get_reward_dtype(ReplayObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->reward_descr);
}
static PyObject *get_capacity(ReplayObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->capacity);
}
static PyObject *get_seed(ReplayObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->seed);
}
static PyObject *get_pick_len(ReplayObject *s, void *c)
{
    (void)c;
    return PyLong_FromUnsignedLong(exr_buffer_config(s->buf)->pick_len);
}
static PyObject *get_allow_short(ReplayObject *s, void *c)
{
    (void)c;
    return PyBool_FromLong(exr_buffer_config(s->buf)->allow_short);
}
static PyObject *get_eviction(ReplayObject *s, void *c)
{
    (void)c;
    return PyUnicode_FromString(s->eviction == EXR_EVICT_FIFO ? "fifo" : "second_chance");
}

/* ---- test hooks --------------------------------------------------------- */

static PyObject *replay_handles(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_num_episodes_locked(self->buf);
    int64_t *v = malloc((n ? n : 1) * sizeof *v);
    if (v)
        exr_buffer_handles_locked(self->buf, v);
    exr_buffer_unlock(self->buf);
    if (!v)
        return PyErr_Format(PyExc_MemoryError, "_handles: out of memory");
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (uint64_t i = 0; l && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, x);
    }
    free(v);
    return l;
}

static PyObject *replay_picks(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    for (;;) {
        exr_lock_with_gil(self->buf);
        npy_intp n = (npy_intp)exr_buffer_num_picks_locked(self->buf);
        exr_buffer_unlock(self->buf);
        PyObject *e = new_array(i64, n, 0, NULL), *p = new_array(i64, n, 0, NULL);
        if (!e || !p) {
            Py_XDECREF(e);
            Py_XDECREF(p);
            Py_DECREF(i64);
            return NULL;
        }
        exr_lock_with_gil(self->buf);
        int same = (npy_intp)exr_buffer_num_picks_locked(self->buf) == n;
        if (same)
            exr_buffer_picks_locked(self->buf, PyArray_DATA((PyArrayObject *)e),
                                    PyArray_DATA((PyArrayObject *)p));
        exr_buffer_unlock(self->buf);
        if (same) {
            Py_DECREF(i64);
            return Py_BuildValue("(NN)", e, p);
        }
        Py_DECREF(e);
        Py_DECREF(p);
    }
}

static PyObject *replay_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    EXR_GUARD(self, NULL);
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "_priority(ps, pick_epi, pick_pos)");
    int64_t h;
    PyArrayObject *e, *p;
    npy_intp n;
    if (exr_selector_handle(self, args[0], &h) < 0 || pick_arrays(args[1], args[2], &e, &p, &n) < 0)
        return NULL;
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    PyObject *out = new_array(f64, n, 0, NULL);
    Py_DECREF(f64);
    exr_status st = EXR_OK;
    int prioritized = 0;
    if (out) {
        exr_lock_with_gil(self->buf);
        exr_selector *sel = exr_buffer_selector_locked(self->buf, h);
        prioritized = sel && sel->vt->prioritized;
        st = exr_buffer_stored_priority_locked(self->buf, h, (size_t)n, PyArray_DATA(e),
                                               PyArray_DATA(p), PyArray_DATA((PyArrayObject *)out));
        exr_buffer_unlock(self->buf);
    }
    Py_DECREF(e);
    Py_DECREF(p);
    if (!out)
        return NULL;
    if (st != EXR_OK || !prioritized) {
        Py_DECREF(out);
        return PyErr_Format(PyExc_ValueError, "ps: expected a prioritized pick selector of this "
                            "buffer, got handle %lld", (long long)h);
    }
    const double *v = PyArray_DATA((PyArrayObject *)out);
    for (npy_intp i = 0; i < n; i++) {
        if (isnan(v[i])) {
            Py_DECREF(out);
            return PyErr_Format(PyExc_ValueError, "pick_epi, pick_pos: pick %zd does not exist",
                                (Py_ssize_t)i);
        }
    }
    return out;
}

static PyObject *replay_priority_stats(ReplayObject *self, PyObject *ps)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    if (exr_selector_handle(self, ps, &h) < 0)
        return NULL;
    double total, min_pos;
    uint64_t n;
    exr_lock_with_gil(self->buf);
    exr_status st = exr_buffer_priority_stats_locked(self->buf, h, &total, &min_pos, &n);
    exr_buffer_unlock(self->buf);
    if (st != EXR_OK)
        return unknown_selector(h);
    return Py_BuildValue("(ddK)", total, min_pos, (unsigned long long)n);
}

static PyObject *replay_check(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    char msg[512];
    exr_lock_with_gil(self->buf);
    int bad = exr_buffer_check_locked(self->buf, msg, sizeof msg);
    exr_buffer_unlock(self->buf);
    if (bad)
        return PyErr_Format(PyExc_AssertionError, "%s", msg);
    Py_RETURN_NONE;
}

/* ---- the type ----------------------------------------------------------- */

static PyMethodDef replay_methods[] = {
    {"new_episode", (PyCFunction)replay_new_episode, METH_NOARGS,
     exr_doc_new_episode},
    {"record", (PyCFunction)(void (*)(void))replay_record, METH_FASTCALL | METH_KEYWORDS,
     exr_doc_record},
    {"record_many", (PyCFunction)(void (*)(void))replay_record_many,
     METH_FASTCALL | METH_KEYWORDS,
     exr_doc_record_many},
    {"new_pick_selector", (PyCFunction)(void (*)(void))replay_new_pick_selector,
     METH_VARARGS | METH_KEYWORDS,
     exr_doc_new_pick_selector},
    {"remove_pick_selector", (PyCFunction)replay_remove_pick_selector, METH_O,
     exr_doc_remove_pick_selector},
    {"get_batch", (PyCFunction)(void (*)(void))replay_get_batch, METH_FASTCALL | METH_KEYWORDS,
     exr_doc_get_batch},
    {"set_priority", (PyCFunction)(void (*)(void))replay_set_priority,
     METH_FASTCALL | METH_KEYWORDS,
     exr_doc_set_priority},
    {"episode", (PyCFunction)replay_episode, METH_O,
     exr_doc_episode},
    {"serialize", (PyCFunction)(void (*)(void))exr_replay_serialize,
     METH_FASTCALL | METH_KEYWORDS,
     exr_doc_serialize},
    {"unserialize", (PyCFunction)exr_replay_unserialize_cls, METH_O | METH_CLASS,
     exr_doc_unserialize},
    {"save", (PyCFunction)(void (*)(void))exr_replay_save, METH_FASTCALL | METH_KEYWORDS,
     exr_doc_save},
    {"load", (PyCFunction)exr_replay_load_cls, METH_O | METH_CLASS,
     exr_doc_load},
    {"__reduce_ex__", (PyCFunction)exr_replay_reduce_ex, METH_O,
     "Pickles through serialize(level=0); with protocol 5 the payload goes out\n"
     "of band as a PickleBuffer."},
    {"for_spaces", (PyCFunction)(void (*)(void))exr_for_spaces_cls,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     exr_doc_for_spaces},
    {"priority_stats", (PyCFunction)replay_priority_stats, METH_O,
     exr_doc_priority_stats},
    {"stored_priorities", (PyCFunction)(void (*)(void))replay_priority, METH_FASTCALL,
     exr_doc_stored_priorities},
    {"attach_log", (PyCFunction)exr_replay_attach_log_py, METH_O,
     "attach_log($self, log, /)\n--\n\nEvery step recorded from now on is also written to log\n"
     "(an ExperienceLog; docs/log.md)."},
    {"detach_log", (PyCFunction)exr_replay_detach_log_py, METH_NOARGS,
     "detach_log($self, /)\n--\n\nStops logging; returns the log (or None)."},
    {"from_log", (PyCFunction)(void (*)(void))exr_replay_from_log,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "from_log(path, *, capacity=None, **kwargs)\n--\n\nA new buffer holding every step of "
     "the log at path\n(docs/log.md)."},
    {"ingest", (PyCFunction)(void (*)(void))exr_replay_ingest, METH_VARARGS | METH_KEYWORDS,
     "ingest($self, path)\n--\n\nRecords every step of the log at path into this buffer;\n"
     "returns the number of steps."},
    {"_handles", (PyCFunction)replay_handles, METH_NOARGS, "test hook: live handles, ascending"},
    {"_picks", (PyCFunction)replay_picks, METH_NOARGS, "test hook: (pick_epi, pick_pos)"},
    {"_gather", (PyCFunction)(void (*)(void))replay_gather, METH_FASTCALL,
     "test hook: the Batch for given picks"},
    {"_priority", (PyCFunction)(void (*)(void))replay_priority, METH_FASTCALL,
     "test hook: stored p**alpha of given picks"},
    {"_check", (PyCFunction)replay_check, METH_NOARGS,
     "test hook: raises AssertionError if an internal invariant is broken"},
    {NULL},
};

static PyGetSetDef replay_getset[] = {
    {"num_episodes", (getter)get_num_episodes, NULL, "episodes held", NULL},
    {"num_picks", (getter)get_num_picks, NULL, "picks that can be drawn", NULL},
    {"state_shape", (getter)get_state_shape, NULL, "shape of one state", NULL},
    {"state_dtype", (getter)get_state_dtype, NULL, "dtype of states", NULL},
    {"action_shape", (getter)get_action_shape, NULL, "shape of one action", NULL},
    {"action_dtype", (getter)get_action_dtype, NULL, "dtype of actions", NULL},
    {"reward_dtype", (getter)get_reward_dtype, NULL, "dtype of rewards", NULL},
    {"capacity", (getter)get_capacity, NULL, "max records held (None: unbounded)", NULL},
    {"pick_len", (getter)get_pick_len, NULL, "steps in a pick", NULL},
    {"allow_short", (getter)get_allow_short, NULL, "whether shorter picks at episode ends exist",
     NULL},
    {"eviction", (getter)get_eviction, NULL, "'fifo' or 'second_chance'", NULL},
    {"seed", (getter)get_seed, NULL, "the seed given (None: from the OS)", NULL},
    {"log", (getter)exr_replay_get_log, NULL, "the ExperienceLog attached, or None", NULL},
    {NULL},
};

static PyMemberDef replay_members[] = {
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ReplayObject, weakreflist), READONLY, NULL},
    {NULL},
};

static PyType_Slot replay_slots[] = {
    {Py_tp_new, replay_new},
    {Py_tp_dealloc, replay_dealloc},
    {Py_tp_methods, replay_methods},
    {Py_tp_getset, replay_getset},
    {Py_tp_members, replay_members},
    {Py_sq_length, replay_len},
    {Py_tp_repr, exr_replay_repr},
    {Py_tp_doc, (void *)exr_doc_replay},
    {0, NULL},
};

static PyType_Spec replay_spec = {
    .name = "exreplay._core.ExperienceReplay",
    .basicsize = sizeof(ReplayObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE,
    .slots = replay_slots,
};

int exr_replay_init_type(PyObject *m, exr_modstate *st)
{
    st->replay_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &replay_spec, NULL);
    if (!st->replay_type)
        return -1;
    return PyModule_AddObjectRef(m, "ExperienceReplay", (PyObject *)st->replay_type);
}
