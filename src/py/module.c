/*
 * module.c - the exreplay._core module: multi-phase init (PEP 489), module
 * state holding the heap types, and the one place where a core status becomes
 * a Python exception.
 */
#define EXR_IMPORT_ARRAY_HERE
#include "binding.h"
#include "file.h"
#include "mem.h"

#include "args.h"

#include <math.h>
#include <structseq.h>

int exr_nogil_calls;
unsigned long long exr_gil_kept;
unsigned long long exr_block_hints;
unsigned long long exr_drawn_given;

void exr_lock_with_gil(exr_buffer *b)
{
    if (exr_buffer_trylock(b))
        return;
    EXR_NOGIL_BEGIN
    exr_buffer_lock(b);
    EXR_NOGIL_END
}

void exr_lock_published_with_gil(exr_buffer *b)
{
    exr_lock_with_gil(b);
    EXR_NOGIL_BEGIN
    exr_buffer_quiesce_locked(b);
    EXR_NOGIL_END
}

void exr_shape_str(char *buf, size_t len, int nd, const npy_intp *shape)
{
    size_t used = 0;
    used += (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < nd && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %ld" : "%ld", (long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, nd == 1 ? ",)" : ")");
}

static void want_str(char *buf, size_t len, int nlead, const npy_intp *lead, int nd,
                     const npy_intp *shape)
{
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < nlead + nd && used < len; i++) {
        npy_intp d = i < nlead ? lead[i] : shape[i - nlead];
        const char *sep = i ? ", " : "";
        if (d < 0)
            used += (size_t)snprintf(buf + used, len - used, "%sT", sep);
        else
            used += (size_t)snprintf(buf + used, len - used, "%s%ld", sep, (long)d);
    }
    if (used < len)
        snprintf(buf + used, len - used, nlead + nd == 1 ? ",)" : ")");
}

/* The ValueError or TypeError that converting obj raised, replaced by one
 * of the same kind that names arg and quotes it (chained to it as its
 * cause): a list or tuple that NumPy refused with a ValueError is ragged.
 * Any other exception is left as it is. */
static void conversion_error(PyObject *obj, PyArray_Descr *descr, const char *arg)
{
    PyObject *t, *v, *tb, *t2, *v2, *tb2;
    int value = PyErr_ExceptionMatches(PyExc_ValueError);
    if (!value && !PyErr_ExceptionMatches(PyExc_TypeError))
        return;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (tb)
        PyException_SetTraceback(v, tb);
    if (value && (PyList_Check(obj) || PyTuple_Check(obj)))
        PyErr_Format(PyExc_ValueError, "%s: expected an array-like of %S, got a ragged %s", arg,
                     (PyObject *)descr, Py_TYPE(obj)->tp_name);
    else
        PyErr_Format(value ? PyExc_ValueError : PyExc_TypeError,
                     "%s: expected an array-like of %S, got %s (converting it raised %s: %S)", arg,
                     (PyObject *)descr, Py_TYPE(obj)->tp_name, Py_TYPE(v)->tp_name, v);
    PyErr_Fetch(&t2, &v2, &tb2);
    PyErr_NormalizeException(&t2, &v2, &tb2);
    if (v2)
        PyException_SetCause(v2, Py_NewRef(v));
    PyErr_Restore(t2, v2, tb2);
    Py_DECREF(t);
    Py_DECREF(v);
    Py_XDECREF(tb);
}

/* obj as an ndarray of any dtype (a new reference), or NULL with a
 * TypeError or ValueError naming arg. */
static PyArrayObject *any_ndarray(PyObject *obj, PyArray_Descr *descr, const char *arg)
{
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: expected an array-like of %S, got None", arg,
                     (PyObject *)descr);
        return NULL;
    }
    if (PyArray_Check(obj))
        return (PyArrayObject *)Py_NewRef(obj);
    PyArrayObject *arr = (PyArrayObject *)PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
    if (!arr)
        conversion_error(obj, descr, arg);
    return arr;
}

static PyObject *cast_error(PyArray_Descr *have, PyArray_Descr *descr, const char *arg)
{
    return PyErr_Format(PyExc_TypeError,
                        "%s: expected %S (or a dtype that casts to it under same_kind), got %S",
                        arg, (PyObject *)descr, (PyObject *)have);
}

/* Python ints beyond uint64 (which NumPy holds only as objects, alone or
 * with floats) headed for a float column: *arr replaced by their float64
 * values, judged by value (args.c; a ValueError for an int too large for a
 * float). Anything else there keeps its dtype's TypeError. */
static int reals_by_value(PyArrayObject **arr, PyArray_Descr *descr, const char *arg,
                          int *equiv)
{
    int not_reals;
    PyArrayObject *conv = exr_reals_by_value(*arr, arg, &not_reals);
    if (!conv) {
        if (not_reals)
            cast_error(PyArray_DESCR(*arr), descr, arg);
        return -1;
    }
    Py_SETREF(*arr, conv);
    *equiv = PyArray_EquivTypes(PyArray_DESCR(conv), descr);
    return 0;
}

/* The dtype question, decided before the shape: *arr is kept, replaced by
 * Python ints converted by value (*equiv set), or refused (-1). NumPy
 * arrays and scalars carry a dtype; Python numbers and sequences do not,
 * so for them only the kind counts (NEP 50): Python ints go into any
 * integer dtype if they fit, and into a float column by value.
 * *weak_int: such ints, to convert by value. */
static int check_dtype(PyObject *obj, PyArrayObject **arr, PyArray_Descr *descr, const char *arg,
                       int *equiv, int *weak_int)
{
    int typed = PyArray_Check(obj) || PyArray_IsScalar(obj, Generic);
    PyArray_Descr *have = PyArray_DESCR(*arr);
    *equiv = PyArray_EquivTypes(have, descr);
    char hk = have->kind, wk = descr->kind;
    *weak_int = !typed && (hk == 'i' || hk == 'u') && (wk == 'i' || wk == 'u');
    /* Python ints beyond int64 make NumPy promote to float64 or object;
     * whether they fit the column is decided by their values (args.c) */
    int maybe_ints = !typed && (wk == 'i' || wk == 'u') && (hk == 'f' || hk == 'O');
    if (!typed && wk == 'f' && hk == 'O' && PyArray_SIZE(*arr) > 0)
        return reals_by_value(arr, descr, arg, equiv);
    int weak_ok = !typed && (PyArray_SIZE(*arr) == 0 || *weak_int || maybe_ints);
    int castable = PyArray_CanCastTypeTo(have, descr, NPY_SAME_KIND_CASTING);
    if (!*equiv && !weak_ok && !castable) {
        cast_error(have, descr, arg);
        return -1;
    }
    if (!maybe_ints)
        return 0;
    /* Python ints are converted by value (ValueError if one does not fit),
     * anything else must cast under same_kind (TypeError) */
    int not_ints;
    PyArrayObject *conv = exr_ints_by_value(obj, *arr, descr, arg, &not_ints);
    if (!conv && !not_ints)
        return -1;
    if (!conv && !castable) {
        cast_error(have, descr, arg);
        return -1;
    }
    if (conv) {
        Py_SETREF(*arr, conv);
        *equiv = 1;
    }
    return 0;
}

/* 0 if arr has shape (lead..., shape...) (lead[i] < 0: any length, filled
 * in), else -1 with a ValueError naming arg. */
static int check_shape(PyArrayObject *arr, int nlead, npy_intp *lead, int nd,
                       const npy_intp *shape, const char *arg)
{
    int ok = PyArray_NDIM(arr) == nlead + nd;
    for (int i = 0; ok && i < nlead; i++)
        ok = lead[i] < 0 || PyArray_DIM(arr, i) == lead[i];
    for (int i = 0; ok && i < nd; i++)
        ok = PyArray_DIM(arr, nlead + i) == shape[i];
    if (!ok) {
        char want[256], got[256];
        want_str(want, sizeof want, nlead, lead, nd, shape);
        exr_shape_str(got, sizeof got, PyArray_NDIM(arr), PyArray_DIMS(arr));
        PyErr_Format(PyExc_ValueError, "%s: expected shape %s, got %s", arg, want, got);
        return -1;
    }
    for (int i = 0; i < nlead; i++)
        if (lead[i] < 0)
            lead[i] = PyArray_DIM(arr, i);
    return 0;
}

/* Whether obj is an ndarray that exr_as_array would return as it is: of
 * this very descr (so equivalent, and typed: no value conversion), the
 * shape asked for, C-contiguous and aligned. Then the dtype checks'
 * EquivTypes and CanCastTypeTo, a large part of a small call, are spared.
 * Fills lead[] like check_shape. */
static int as_is(PyObject *obj, PyArray_Descr *descr, int nlead, npy_intp *lead, int nd,
                 const npy_intp *shape)
{
    if (!PyArray_Check(obj))
        return 0;
    PyArrayObject *a = (PyArrayObject *)obj;
    const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED;
    if (PyArray_DESCR(a) != descr || PyArray_NDIM(a) != nlead + nd ||
        (PyArray_FLAGS(a) & need) != need)
        return 0;
    for (int i = 0; i < nlead; i++)
        if (lead[i] >= 0 && PyArray_DIM(a, i) != lead[i])
            return 0;
    for (int i = 0; i < nd; i++)
        if (PyArray_DIM(a, nlead + i) != shape[i])
            return 0;
    for (int i = 0; i < nlead; i++)
        lead[i] = PyArray_DIM(a, i);
    return 1;
}

/* exr_as_array, and with ints_only set an array of bools refused (a
 * TypeError naming its dtype, before anything else is checked of it) */
static PyArrayObject *as_array(PyObject *obj, PyArray_Descr *descr, int nlead, npy_intp *lead,
                               int nd, const npy_intp *shape, const char *arg, int ints_only)
{
    if (as_is(obj, descr, nlead, lead, nd, shape))
        return (PyArrayObject *)Py_NewRef(obj);
    PyArrayObject *arr = any_ndarray(obj, descr, arg);
    int equiv, weak_int;
    if (!arr)
        return NULL;
    /* a list mixing bools with ints converts to ints: its items tell */
    if (ints_only && (PyArray_DESCR(arr)->kind == 'b' || exr_seq_has_bool(obj))) {
        PyErr_Format(PyExc_TypeError,
                     "%s: expected %S (or an integer dtype that casts to it under same_kind), "
                     "got bool",
                     arg, (PyObject *)descr);
        Py_DECREF(arr);
        return NULL;
    }
    if (check_dtype(obj, &arr, descr, arg, &equiv, &weak_int) < 0 ||
        check_shape(arr, nlead, lead, nd, shape, arg) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    if (equiv && PyArray_IS_C_CONTIGUOUS(arr) && PyArray_ISALIGNED(arr))
        return arr; /* read in place: no copy */
    if (weak_int && !equiv) {
        int not_ints;
        PyArrayObject *out = exr_ints_by_value(obj, arr, descr, arg, &not_ints);
        if (out || !not_ints) {
            Py_DECREF(arr);
            return out;
        }
    }
    Py_INCREF(descr);
    PyArrayObject *out = (PyArrayObject *)PyArray_FromArray(
        arr, descr, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST);
    Py_DECREF(arr);
    return out;
}

PyArrayObject *exr_as_array(PyObject *obj, PyArray_Descr *descr, int nlead, npy_intp *lead,
                            int nd, const npy_intp *shape, const char *arg)
{
    return as_array(obj, descr, nlead, lead, nd, shape, arg, 0);
}

PyArrayObject *exr_as_index_array(PyObject *obj, npy_intp *n, const char *arg)
{
    PyArray_Descr *i64 = PyArray_DescrFromType(NPY_INT64);
    PyArrayObject *a = as_array(obj, i64, 1, n, 0, NULL, arg, 1);
    /* a NumPy uint64 array casts to int64 under same_kind, wrapping the
     * values beyond int64 to negative ones: those are refused as the same
     * Python ints are (Python ints and other untyped input are converted
     * by value already) */
    int wide_unsigned = PyArray_Check(obj) && PyArray_DESCR((PyArrayObject *)obj)->kind == 'u' &&
                        PyArray_ITEMSIZE((PyArrayObject *)obj) == 8;
    if (a && wide_unsigned && exr_refuse_wrapped(a, i64, arg) < 0)
        Py_CLEAR(a);
    Py_DECREF(i64);
    return a;
}

PyObject *exr_call_python(const char *module, const char *fn, PyObject *first, PyObject *args,
                          PyObject *kw)
{
    PyObject *mod = PyImport_ImportModule(module);
    if (!mod)
        return NULL;
    PyObject *f = PyObject_GetAttrString(mod, fn);
    Py_DECREF(mod);
    if (!f)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(args);
    PyObject *all = PyTuple_New(n + 1);
    if (!all) {
        Py_DECREF(f);
        return NULL;
    }
    PyTuple_SET_ITEM(all, 0, Py_NewRef(first));
    for (Py_ssize_t i = 0; i < n; i++)
        PyTuple_SET_ITEM(all, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
    PyObject *r = PyObject_Call(f, all, kw);
    Py_DECREF(all);
    Py_DECREF(f);
    return r;
}

exr_modstate *exr_state_of_type(PyTypeObject *tp)
{
    return (exr_modstate *)PyModule_GetState(PyType_GetModule(tp));
}

static PyStructSequence_Field batch_fields[] = {
    {"state", "(B, pick_len, *state_shape) states"},
    {"action", "(B, pick_len, *action_shape) actions"},
    {"reward", "(B, pick_len) rewards"},
    {"state_next", "(B, pick_len, *state_shape) next states (final state at the end)"},
    {"seq_len", "(B,) int64 steps in each pick"},
    {"seq_len_next", "(B,) int64 steps whose next state can be bootstrapped from"},
    {"pick_epi", "(B,) int64 episode handle of each pick"},
    {"pick_pos", "(B,) int64 position of each pick's first step"},
    {"weight", "(B,) float32 importance-sampling weights (ones for uniform)"},
    {"pick_index", "(B,) int64 where each pick was in the pick table when drawn: lets\n"
                   "set_priority(ps, batch, p) skip the handle lookup while it still holds"},
    {"extras", "{name: (B, pick_len, *shape) array} of the per-step extras (empty without\n"
               "an extras_spec)"},
    {"state_seq", "with get_batch(..., shared_next=True): (B, pick_len + 1, *state_shape)\n"
                  "states, of which state and state_next are the views [:, :-1] and [:, 1:];\n"
                  "else None"},
    {NULL, NULL},
};

static PyStructSequence_Desc batch_desc = {
    "exreplay._core.Batch",
    "A batch of picks: (state, action, reward, state_next, seq_len, seq_len_next,\n"
    "pick_epi, pick_pos), plus weight and pick_index.\n\n"
    "Unpacks as the paper's 8-tuple. B picks of L = pick_len steps: state,\n"
    "state_next (B, L, *state_shape); action (B, L, *action_shape); reward (B, L);\n"
    "seq_len, seq_len_next, pick_epi, pick_pos (B,) int64; weight (B,) float32\n"
    "importance-sampling weights (ones for uniform); pick_index (B,) int64, which\n"
    "lets set_priority(ps, batch, p) skip the handle lookup. Steps past seq_len are\n"
    "zero. The arrays are views of one memory block that they keep alive (filled\n"
    "once, never copied after); pass the batch back as get_batch(..., out=batch)\n"
    "to refill them in place.",
    batch_fields,
    8,
};

static PyStructSequence_Field episode_fields[] = {
    {"state", "(n, *state_shape) states"},
    {"action", "(n, *action_shape) actions"},
    {"reward", "(n,) rewards"},
    {"final_state", "the state after the last step, or None"},
    {"ended", "whether the episode has ended"},
    {"terminated", "whether it ended on a terminal state"},
    {"extras", "{name: (n, *shape) array} of the per-step extras (empty without an\n"
               "extras_spec)"},
    {NULL, NULL},
};

static PyStructSequence_Desc episode_desc = {
    "exreplay._core.EpisodeData",
    "A copy of one episode's steps: (state, action, reward, final_state, ended,\n"
    "terminated), as ExperienceReplay.episode(h) returns it.\n\n"
    "The arrays are new (n steps each; the buffer keeps its own rows), final_state\n"
    "is None where the episode has none, and ended/terminated are bools.",
    episode_fields,
    6,
};

static int module_exec(PyObject *m)
{
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    exr_modstate *st = PyModule_GetState(m);
    st->f32_descr = PyArray_DescrFromType(NPY_FLOAT32);
    st->i64_descr = PyArray_DescrFromType(NPY_INT64);
    if (!st->f32_descr || !st->i64_descr)
        return -1;
    st->batch_type = PyStructSequence_NewType(&batch_desc);
    if (!st->batch_type || PyModule_AddObjectRef(m, "Batch", (PyObject *)st->batch_type) < 0)
        return -1;
    st->episode_type = PyStructSequence_NewType(&episode_desc);
    if (!st->episode_type ||
        PyModule_AddObjectRef(m, "EpisodeData", (PyObject *)st->episode_type) < 0)
        return -1;
    if (exr_install_reprs(st) < 0)
        return -1;
    if (exr_block_init_type(m, st) < 0 || exr_selector_init_type(m, st) < 0 ||
        exr_replay_init_type(m, st) < 0 || exr_log_init_type(m, st) < 0)
        return -1;
    for (int k = 0; k < exr_selector_nkinds; k++)
        if (PyModule_AddIntConstant(m, exr_selector_kinds[k]->name, k) < 0)
            return -1;
    if (PyModule_AddIntConstant(m, "MAX_PICK_LEN", EXR_MAX_PICK_LEN) < 0)
        return -1;
    if (PyModule_AddIntConstant(m, "MAX_SELECTORS", EXR_MAX_SELECTORS) < 0)
        return -1;
    return 0;
}

static int module_traverse(PyObject *m, visitproc visit, void *arg)
{
    exr_modstate *st = PyModule_GetState(m);
    Py_VISIT(st->replay_type);
    Py_VISIT(st->selector_type);
    Py_VISIT(st->batch_type);
    Py_VISIT(st->episode_type);
    Py_VISIT(st->block_type);
    Py_VISIT(st->log_type);
    return 0;
}

static int module_clear(PyObject *m)
{
    exr_modstate *st = PyModule_GetState(m);
    Py_CLEAR(st->replay_type);
    Py_CLEAR(st->selector_type);
    Py_CLEAR(st->batch_type);
    Py_CLEAR(st->episode_type);
    Py_CLEAR(st->block_type);
    Py_CLEAR(st->log_type);
    Py_CLEAR(st->f32_descr);
    Py_CLEAR(st->i64_descr);
    return 0;
}

static void module_free(void *m)
{
    module_clear((PyObject *)m);
    exr_block_cache_clear(PyModule_GetState((PyObject *)m));
}

/* _core._set_stream_min(bytes): the test hook of exr_set_stream_min. */
static PyObject *set_stream_min_py(PyObject *module, PyObject *arg)
{
    (void)module;
    size_t n = PyLong_AsSize_t(arg);
    if (n == (size_t)-1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromSize_t(exr_set_stream_min(n));
}

/* _core._set_copy_simd(on): the test hook of exr_set_copy_simd. */
static PyObject *set_copy_simd_py(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(exr_set_copy_simd(on));
}

/* _core._set_unnamed_temp(on): the test hook of exr_file_set_unnamed. */
static PyObject *set_unnamed_temp_py(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(exr_file_set_unnamed(on));
}

/* _core._set_sync_dir_errno(errnum): the test hook of exr_file_set_sync_dir_errno. */
static PyObject *set_sync_dir_errno_py(PyObject *module, PyObject *arg)
{
    (void)module;
    if (!PyLong_Check(arg))
        return PyErr_Format(PyExc_TypeError, "errnum: expected an int, got %s",
                            Py_TYPE(arg)->tp_name);
    int overflow;
    long e = PyLong_AsLongAndOverflow(arg, &overflow);
    if (e == -1 && PyErr_Occurred())
        return NULL;
    if (overflow || e < 0 || e > 4095)
        return PyErr_Format(PyExc_ValueError, "errnum: expected 0 or an errno (1 to 4095), got %S",
                            arg);
    return PyLong_FromLong(exr_file_set_sync_dir_errno((int)e));
}

/* _core._gil_kept(): the test hook reading exr_gil_kept. */
static PyObject *gil_kept_py(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(exr_gil_kept);
}

/* _core._block_hints(): the test hook reading exr_block_hints. */
static PyObject *block_hints_py(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(exr_block_hints);
}

/* _core._drawn_given(): the test hook reading exr_drawn_given. */
static PyObject *drawn_given_py(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    return PyLong_FromUnsignedLongLong(exr_drawn_given);
}

/* _core._seg_collapse_stats(): the test hook of exr_seg_collapse_get_stats. */
static PyObject *seg_collapse_stats_py(PyObject *module, PyObject *unused)
{
    (void)module;
    (void)unused;
    exr_seg_collapse_stats s;
    exr_seg_collapse_get_stats(&s);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "chunks", (Py_ssize_t)s.chunks, "queued",
                         (Py_ssize_t)s.queued, "collapsed", (Py_ssize_t)s.collapsed, "failed",
                         (Py_ssize_t)s.failed);
}

/* _core._seg_collapse_enable(on): the test hook of exr_seg_collapse_enable. */
static PyObject *seg_collapse_enable_py(PyObject *module, PyObject *arg)
{
    (void)module;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(exr_seg_collapse_enable(on));
}

static PyMethodDef module_methods[] = {
    {"_seg_collapse_stats", seg_collapse_stats_py, METH_NOARGS,
     "_seg_collapse_stats()\n--\n\n"
     "Test hook: the counts of the 2 MiB chunks that malloc'd storage segments\n"
     "fill (docs/design.md, \"Huge pages for small segments\"): chunks counted now,\n"
     "chunks ever queued for a collapse, collapses that succeeded and that failed."},
    {"_seg_collapse_enable", seg_collapse_enable_py, METH_O,
     "_seg_collapse_enable(on, /)\n--\n\n"
     "Test hook: whether new segments are counted and their chunks queued for a\n"
     "collapse onto a huge page (the default). Returns the setting before."},
    {"_drawn_given", drawn_given_py, METH_NOARGS,
     "_drawn_given()\n--\n\n"
     "Test hook: how many set_priority calls so far gave the core the table\n"
     "indices their batch's draw noted (taken as they are if nothing has moved\n"
     "in the table since, checked otherwise)."},
    {"_block_hints", block_hints_py, METH_NOARGS,
     "_block_hints()\n--\n\n"
     "Test hook: how many set_priority calls of the handle form so far were given a\n"
     "batch's own pick_epi and pick_pos arrays and used its pick_index."},
    {"_gil_kept", gil_kept_py, METH_NOARGS,
     "_gil_kept()\n--\n\n"
     "Test hook: how many small record and get_batch calls so far did all their work\n"
     "with the GIL held (docs/design.md, \"The binding's one idiom\")."},
    {"_set_stream_min", set_stream_min_py, METH_O,
     "_set_stream_min(bytes, /)\n--\n\n"
     "Test hook: batches of at least `bytes` are written with non-temporal stores\n"
     "(0: the default, 16 MiB). Returns the value before."},
    {"_set_unnamed_temp", set_unnamed_temp_py, METH_O,
     "_set_unnamed_temp(on, /)\n--\n\n"
     "Test hook: whether save() and log merge() may write into an unnamed file\n"
     "(O_TMPFILE, the default); off, they write a named temp file\n"
     "<dir>/.<name>.<pid>.XXXXXX from the start, as on a file system without it\n"
     "(docs/format.md, \"Writing\"). Returns the setting before."},
    {"_set_sync_dir_errno", set_sync_dir_errno_py, METH_O,
     "_set_sync_dir_errno(errnum, /)\n--\n\n"
     "Test hook: the fsync of the directory that save() and log merge() make\n"
     "after naming their file fails with this errno (0: it does not, the\n"
     "default). Returns the value before."},
    {"_set_copy_simd", set_copy_simd_py, METH_O,
     "_set_copy_simd(on, /)\n--\n\n"
     "Test hook: whether get_batch may copy (4,) float32 | int64 | float32 rows with\n"
     "AVX-512, and plan its picks eight at a time with AVX-512 or four with AVX2,\n"
     "where the machine has it (the default). Returns the setting before."},
    {"_floor_gather", (PyCFunction)(void (*)(void))exr_floor_gather_py, METH_FASTCALL,
     "_floor_gather(rows, starts, L, shared=False, /)\n--\n\n"
     "Benchmark floor: (rows[s:s+L], rows[s+1:s+L+1]) for each s in starts, gathered\n"
     "from one contiguous array by a plain C loop; with shared true, rows[s:s+L+1]\n"
     "for each s as one (len(starts), L + 1, ...) array (the floor of\n"
     "get_batch(..., shared_next=True))."},
    {"_crosscore_ns", (PyCFunction)exr_crosscore_py, METH_O,
     "_crosscore_ns(seconds, /)\n--\n\n"
     "Benchmark probe of the machine: the median nanoseconds one cache line takes\n"
     "to go from this thread's core to a second thread's and back, measured for\n"
     "about `seconds` (0 < seconds <= 10) with the GIL released."},
    {"_raise_status", (PyCFunction)exr_raise_status_py, METH_VARARGS,
     "_raise_status(status, op, arg=None, /)\n--\n\n"
     "Test hook: raises the exception the binding raises for core status `status`."},
    {"_floor_gather_cols", (PyCFunction)(void (*)(void))exr_floor_gather_cols_py, METH_FASTCALL,
     "_floor_gather_cols(cols, starts, L, nnext, out=None, /)\n--\n\n"
     "Benchmark floor for named fields: each column (its own contiguous array)\n"
     "gathered as col[s:s+L] for each s in starts, and col[s+1:s+L+1] for the first\n"
     "nnext columns, by a plain C loop. Returns (outs, nexts): out itself, refilled,\n"
     "when given."},
    {"_floor_gather_batch", (PyCFunction)(void (*)(void))exr_floor_gather_batch_py, METH_FASTCALL,
     "_floor_gather_batch(records, starts, L, ep, state_bytes, action_bytes, /)\n--\n\n"
     "Benchmark bound: everything get_batch writes for picks starting at each s in\n"
     "starts (state, action, reward, state_next as uint8 rows, then seq_len,\n"
     "seq_len_next, pick_epi = s // ep, pick_pos = s % ep, pick_index = s, weight = 1),\n"
     "from records packed as get_batch's storage keeps them, by a plain C loop\n"
     "that prefetches the rows 16 picks ahead. Returns the ten arrays."},
    {"unserialize", (PyCFunction)exr_unserialize, METH_O,
     "unserialize(data, /)\n--\n\n"
     "ExperienceReplay.unserialize(data) (also what unpickling calls)."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
    {0, NULL},
};

PyModuleDef exr_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "exreplay._core",
    .m_doc = "exreplay's C core: ExperienceReplay and PickSelector.",
    .m_size = sizeof(exr_modstate),
    .m_methods = module_methods,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&exr_module_def); }

PyObject *exr_shape_tuple(int nd, const npy_intp *shape)
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
