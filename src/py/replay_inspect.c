/*
 * replay_inspect.c - introspection: episode(), len(), the counts, and the test hooks
 * (handles, picks, priorities, the invariant check).
 */
#include "binding.h"

#include <math.h>

#include "args.h"
#include "replay_impl.h"
#include "named.h"

/* The EpisodeData of arrays a[0..4) (stolen once it succeeds) and the
 * flags; no extras (an empty dict). */
static PyObject *episode_data(ReplayObject *self, PyObject **a, bool ended, bool terminated)
{
    PyObject *x = PyDict_New();
    PyObject *r = x ? PyStructSequence_New(mstate(self)->episode_type) : NULL;
    if (!r) {
        Py_XDECREF(x);
        return NULL;
    }
    for (int i = 0; i < 4; i++)
        PyStructSequence_SET_ITEM(r, i, a[i]);
    PyStructSequence_SET_ITEM(r, 4, PyBool_FromLong(ended));
    PyStructSequence_SET_ITEM(r, 5, PyBool_FromLong(terminated));
    PyStructSequence_SET_ITEM(r, 6, x);
    return r;
}

PyObject *replay_episode(ReplayObject *self, PyObject *ho)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    int r = exr_handle_arg(ho, "h", "an int episode handle", &h);
    if (r)
        return r > 0 ? exr_unknown_episode(h, ho) : NULL;
    if (self->sfields || self->xfields)
        return exr_replay_episode_fields(self, h);
    PyObject *a[4] = {NULL, NULL, NULL, NULL}; /* state, action, reward, final state */
    for (;;) {
        uint64_t n;
        bool ended, term, has_final;
        exr_lock_with_gil(self->buf);
        exr_status st = exr_buffer_episode_info_locked(self->buf, h, &n, &ended, &term, &has_final);
        exr_buffer_unlock(self->buf);
        if (st != EXR_OK)
            return exr_unknown_episode(h, NULL);
        a[0] = new_array(self->state_descr, (npy_intp)n, self->state_nd, self->state_shape);
        a[1] = new_array(self->action_descr, (npy_intp)n, self->action_nd, self->action_shape);
        a[2] = new_array(self->reward_descr, (npy_intp)n, 0, NULL);
        a[3] = has_final ? new_array(self->state_descr, -1, self->state_nd, self->state_shape)
                         : Py_NewRef(Py_None);
        if (!a[0] || !a[1] || !a[2] || !a[3])
            break;
        /* copy under one lock hold, if the episode is still as measured */
        uint64_t n2;
        bool e2, t2, f2;
        exr_lock_with_gil(self->buf);
        st = exr_buffer_episode_info_locked(self->buf, h, &n2, &e2, &t2, &f2);
        int same = st == EXR_OK && n2 == n && f2 == has_final;
        if (same)
            exr_buffer_episode_copy_locked(
                self->buf, h, PyArray_DATA((PyArrayObject *)a[0]),
                PyArray_DATA((PyArrayObject *)a[1]), PyArray_DATA((PyArrayObject *)a[2]),
                has_final ? PyArray_DATA((PyArrayObject *)a[3]) : NULL);
        exr_buffer_unlock(self->buf);
        if (same) {
            PyObject *r = episode_data(self, a, e2, t2);
            if (r)
                return r;
            break;
        }
        for (int i = 0; i < 4; i++)
            Py_CLEAR(a[i]);
    }
    for (int i = 0; i < 4; i++)
        Py_XDECREF(a[i]);
    return NULL;
}

Py_ssize_t replay_len(ReplayObject *self)
{
    EXR_GUARD(self, -1);
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_len_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return (Py_ssize_t)n;
}

PyObject *get_num_episodes(ReplayObject *self, void *c)
{
    EXR_GUARD(self, NULL);
    (void)c;
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_num_episodes_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return PyLong_FromUnsignedLongLong(n);
}

PyObject *get_num_picks(ReplayObject *self, void *c)
{
    EXR_GUARD(self, NULL);
    (void)c;
    exr_lock_with_gil(self->buf);
    uint64_t n = exr_buffer_num_picks_locked(self->buf);
    exr_buffer_unlock(self->buf);
    return PyLong_FromUnsignedLongLong(n);
}

/* ---- test hooks --------------------------------------------------------- */

PyObject *replay_map_probes(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    double mean;
    uint64_t max;
    exr_lock_with_gil(self->buf);
    exr_buffer_map_probes_locked(self->buf, &mean, &max);
    exr_buffer_unlock(self->buf);
    return Py_BuildValue("(dK)", mean, (unsigned long long)max);
}

PyObject *replay_handles(ReplayObject *self, PyObject *unused)
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

PyObject *replay_picks(ReplayObject *self, PyObject *unused)
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

/* Selector h's kind for stored_priorities: 1 if it draws by priority, 0
 * (with the ValueError) if it is uniform or unknown. */
static int stored_selector_ok(ReplayObject *self, int64_t h)
{
    exr_lock_with_gil(self->buf);
    exr_selector *sel = exr_buffer_selector_locked(self->buf, h);
    int known = sel != NULL, prioritized = sel && sel->vt->prioritized;
    exr_buffer_unlock(self->buf);
    if (!known) {
        exr_unknown_selector(h);
        return 0;
    }
    if (!prioritized)
        PyErr_Format(PyExc_ValueError,
                     "ps: expected a prioritized or rank pick selector, got a uniform one "
                     "(handle %lld)", (long long)h);
    return prioritized;
}

/* The ValueError for pick i of e, p (NaN in the stored priorities): it
 * does not exist. NULL. */
static PyObject *missing_pick(PyArrayObject *e, PyArrayObject *p, npy_intp i)
{
    const int64_t *ev = PyArray_DATA(e), *pv = PyArray_DATA(p);
    return PyErr_Format(PyExc_ValueError,
                        "pick_epi, pick_pos: expected picks that exist, got (%lld, %lld) at index "
                        "%zd, which does not", (long long)ev[i], (long long)pv[i], (Py_ssize_t)i);
}

PyObject *replay_priority(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    EXR_GUARD(self, NULL);
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError,
                            "stored_priorities() takes 3 arguments (ps, pick_epi, pick_pos), "
                            "got %zd", nargs);
    int64_t h;
    PyArrayObject *e, *p;
    npy_intp n;
    if (exr_selector_handle(self, args[0], &h) < 0 || !stored_selector_ok(self, h) ||
        pick_arrays(args[1], args[2], &e, &p, &n) < 0)
        return NULL;
    PyArray_Descr *f64 = PyArray_DescrFromType(NPY_FLOAT64);
    PyObject *out = new_array(f64, n, 0, NULL);
    Py_DECREF(f64);
    exr_status st = EXR_OK;
    if (out) {
        exr_lock_with_gil(self->buf);
        st = exr_buffer_stored_priority_locked(self->buf, h, (size_t)n, PyArray_DATA(e),
                                               PyArray_DATA(p), PyArray_DATA((PyArrayObject *)out));
        exr_buffer_unlock(self->buf);
    }
    const double *v = out ? PyArray_DATA((PyArrayObject *)out) : NULL;
    npy_intp i = 0;
    while (out && st == EXR_OK && i < n && !isnan(v[i]))
        i++;
    if (out && st != EXR_OK) /* the selector went meanwhile (another thread) */
        exr_unknown_selector(h);
    else if (out && i < n)
        missing_pick(e, p, i);
    if (out && (st != EXR_OK || i < n))
        Py_CLEAR(out);
    Py_DECREF(e);
    Py_DECREF(p);
    return out;
}

PyObject *replay_priority_stats(ReplayObject *self, PyObject *ps)
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

PyObject *replay_check(ReplayObject *self, PyObject *unused)
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
