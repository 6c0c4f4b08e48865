/*
 * replay.c - the ExperienceReplay type: its constructor, configuration
 * attributes and method table (the methods: replay_record.c, replay_batch.c,
 * replay_inspect.c, selector.c, persist.c, log.c). Each method converts its
 * arguments while holding the GIL (output arrays are made then too), then
 * releases the GIL for the core call that does the work, and converts the
 * result back.
 */
#include "binding.h"
#include "docstrings.h"

#include <math.h>

#include "args.h"
#include <structmember.h>

#include "named.h"
#include "replay_impl.h"

/* ---- construction ------------------------------------------------------- */

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

/* state_shape, the dtypes and action_shape into self, their sizes into cfg. */
static int spaces_args(ReplayObject *self, PyObject *o_sshape, PyObject *o_sdtype,
                       PyObject *o_ashape, PyObject *o_adtype, PyObject *o_rdtype,
                       exr_config *cfg)
{
    PyObject *tmp = NULL;
    if (self->sfields) {
        /* named fields (named.c): the state as packed bytes for the core */
        self->state_nd = 1;
        self->state_shape[0] = (npy_intp)self->sfields->bytes;
        o_sdtype = tmp = PyUnicode_FromString("uint8");
        if (!tmp)
            return -1;
    } else if (exr_shape_arg(o_sshape, "state_shape", NULL, &self->state_nd,
                             self->state_shape) < 0) {
        return -1;
    }
    if (o_ashape && exr_shape_arg(o_ashape, "action_shape", NULL, &self->action_nd,
                                  self->action_shape) < 0)
        return -1;
    if (!o_sdtype && !tmp)
        o_sdtype = tmp = PyUnicode_FromString("float32");
    self->state_descr = o_sdtype ? exr_dtype_arg(o_sdtype, "state_dtype", 0) : NULL;
    Py_CLEAR(tmp);
    if (!self->state_descr)
        return -1;
    self->action_descr = o_adtype ? exr_dtype_arg(o_adtype, "action_dtype", 0)
                                  : PyArray_DescrFromType(NPY_INT64);
    if (!self->action_descr)
        return -1;
    self->reward_descr = o_rdtype ? exr_dtype_arg(o_rdtype, "reward_dtype", 1)
                                  : PyArray_DescrFromType(NPY_FLOAT32);
    if (!self->reward_descr)
        return -1;
    if (bytes_of("state_shape", self->state_descr, self->state_nd, self->state_shape,
                 &cfg->state_bytes) < 0 ||
        bytes_of("action_shape", self->action_descr, self->action_nd, self->action_shape,
                 &cfg->action_bytes) < 0)
        return -1;
    cfg->reward_bytes = (size_t)PyDataType_ELSIZE(self->reward_descr);
    cfg->extra_bytes = self->xfields ? self->xfields->bytes : 0;
    return 0;
}

/* capacity: absent (10**6), None (no limit) or an int. */
static int capacity_arg(ReplayObject *self, PyObject *o_cap, exr_config *cfg)
{
    if (!o_cap) {
        cfg->capacity = 1000000;
        self->capacity = PyLong_FromLong(1000000);
    } else if (o_cap == Py_None) {
        cfg->capacity = 0;
        self->capacity = Py_NewRef(Py_None);
    } else {
        /* the file stores it as a u64 that restores as an int64: one range */
        int64_t c;
        if (exr_int_arg(o_cap, "capacity", "an int in [1, 2**63 - 1] or None", 1, INT64_MAX,
                        &c) < 0)
            return -1;
        self->capacity = PyLong_FromLongLong(c);
        cfg->capacity = (uint64_t)c;
    }
    return self->capacity ? 0 : -1;
}

/* pick_len, allow_short and eviction into cfg. */
static int pick_args(PyObject *o_plen, PyObject *o_short, PyObject *o_evict, exr_config *cfg)
{
    cfg->pick_len = 1;
    if (o_plen) {
        int64_t v;
        if (exr_int_arg(o_plen, "pick_len", NULL, 1, EXR_MAX_PICK_LEN, &v) < 0)
            return -1;
        cfg->pick_len = (uint32_t)v;
    }
    if (o_short) {
        bool v;
        if (truth_arg(o_short, "allow_short", &v) < 0)
            return -1;
        cfg->allow_short = v;
    }
    cfg->eviction = EXR_EVICT_FIFO;
    if (!o_evict)
        return 0;
    if (PyUnicode_Check(o_evict) && PyUnicode_CompareWithASCIIString(o_evict, "fifo") == 0)
        cfg->eviction = EXR_EVICT_FIFO;
    else if (PyUnicode_Check(o_evict) &&
             PyUnicode_CompareWithASCIIString(o_evict, "second_chance") == 0)
        cfg->eviction = EXR_EVICT_SECOND_CHANCE;
    else {
        PyErr_Format(PyExc_ValueError, "eviction: expected 'fifo' or 'second_chance', got %R",
                     o_evict);
        return -1;
    }
    return 0;
}

/* seed: None (fresh entropy) or an int. */
static int seed_arg(ReplayObject *self, PyObject *o_seed, exr_config *cfg)
{
    if (o_seed == Py_None) {
        cfg->seed = exr_rng_entropy();
        self->seed = Py_NewRef(Py_None);
        return 0;
    }
    uint64_t s;
    if (exr_uint_arg(o_seed, "seed", "an int in [0, 2**64) or None", UINT64_MAX, &s) < 0)
        return -1;
    self->seed = PyLong_FromUnsignedLongLong(s);
    cfg->seed = s;
    return self->seed ? 0 : -1;
}

static PyObject *replay_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"state_shape", "state_dtype", "action_shape", "action_dtype",
                             "reward_dtype", "capacity", "pick_len", "allow_short",
                             "eviction", "seed", "log", "state_spec", "extras_spec", NULL};
    PyObject *o_sshape = NULL, *o_sdtype = NULL, *o_ashape = NULL, *o_adtype = NULL;
    PyObject *o_rdtype = NULL, *o_cap = NULL, *o_plen = NULL, *o_short = NULL, *o_evict = NULL;
    PyObject *o_seed = Py_None, *o_log = Py_None, *o_sspec = Py_None, *o_xspec = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOOOOOOOOOOOO:ExperienceReplay", kwlist,
                                     &o_sshape, &o_sdtype, &o_ashape, &o_adtype, &o_rdtype, &o_cap,
                                     &o_plen, &o_short, &o_evict, &o_seed, &o_log, &o_sspec,
                                     &o_xspec))
        return NULL;
    ReplayObject *self = (ReplayObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    exr_config cfg = {0};
    if (exr_replay_specs(self, o_sshape, o_sdtype, o_sspec, o_xspec) < 0 ||
        spaces_args(self, o_sshape, o_sdtype, o_ashape, o_adtype, o_rdtype, &cfg) < 0 ||
        capacity_arg(self, o_cap, &cfg) < 0 || pick_args(o_plen, o_short, o_evict, &cfg) < 0)
        goto error;
    self->eviction = cfg.eviction;
    if (seed_arg(self, o_seed, &cfg) < 0)
        goto error;
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
    exr_spare_clear(self);
    exr_buffer_free(self->buf);
    Py_XDECREF(self->state_descr);
    Py_XDECREF(self->action_descr);
    Py_XDECREF(self->reward_descr);
    Py_XDECREF(self->capacity);
    Py_XDECREF(self->seed);
    exr_fieldset_free(self->sfields);
    exr_fieldset_free(self->xfields);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyObject *get_state_shape(ReplayObject *s, void *c)
{
    (void)c;
    if (s->sfields)
        Py_RETURN_NONE;
    return exr_shape_tuple(s->state_nd, s->state_shape);
}
static PyObject *get_action_shape(ReplayObject *s, void *c)
{
    (void)c;
    return exr_shape_tuple(s->action_nd, s->action_shape);
}
static PyObject *get_state_dtype(ReplayObject *s, void *c)
{
    (void)c;
    if (s->sfields)
        Py_RETURN_NONE;
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
    {"pick_selector", (PyCFunction)replay_pick_selector, METH_O, exr_doc_pick_selector},
    {"pick_selectors", (PyCFunction)replay_pick_selectors, METH_NOARGS, exr_doc_pick_selectors},
    {"get_batch", (PyCFunction)(void (*)(void))replay_get_batch, METH_FASTCALL | METH_KEYWORDS,
     exr_doc_get_batch},
    {"set_priority", (PyCFunction)(void (*)(void))replay_set_priority,
     METH_FASTCALL | METH_KEYWORDS,
     exr_doc_set_priority},
    {"episode", (PyCFunction)replay_episode, METH_O,
     exr_doc_episode},
    {"remove_episode", (PyCFunction)replay_remove_episode, METH_O,
     exr_doc_remove_episode},
    {"end_episode", (PyCFunction)(void (*)(void))replay_end_episode,
     METH_FASTCALL | METH_KEYWORDS,
     exr_doc_end_episode},
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
     "from_log(path, **kwargs)\n--\n\nA new buffer holding every step of "
     "the log at path\n(docs/log.md), with the log's record layout; kwargs are the other\n"
     "constructor arguments, with the constructor's defaults (capacity=1000000, ...)."},
    {"ingest", (PyCFunction)(void (*)(void))exr_replay_ingest, METH_VARARGS | METH_KEYWORDS,
     "ingest($self, path)\n--\n\nRecords every step of the log at path into this buffer;\n"
     "returns the number of steps."},
    {"_handles", (PyCFunction)replay_handles, METH_NOARGS, "test hook: live handles, ascending"},
    {"_map_probes", (PyCFunction)replay_map_probes, METH_NOARGS,
     "test hook: (mean, max) distance of live handles from their home slot in the episode map"},
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
    {"state_spec", (getter)exr_replay_state_spec, NULL,
     "{name: (shape, dtype)} of the named state fields, or None", NULL},
    {"extras_spec", (getter)exr_replay_extras_spec, NULL,
     "{name: (shape, dtype)} of the per-step extras, or None", NULL},
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
