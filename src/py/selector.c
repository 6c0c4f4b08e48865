/*
 * selector.c - the PickSelector type: a handle to one of a buffer's pick
 * selectors. It works wherever an int handle does (__index__), and exposes
 * the selector's parameters (beta is settable, for annealing). The objects
 * are not kept: new_pick_selector, pick_selector and pick_selectors each
 * make a new one, which reads and sets the buffer's own selector.
 */
#include "binding.h"

#include "args.h"

#include <structmember.h>

#include "replay_impl.h"

PyObject *exr_selector_new(ReplayObject *owner, int64_t h, int kind)
{
    exr_modstate *st = exr_state_of_type(Py_TYPE(owner));
    SelectorObject *s = PyObject_New(SelectorObject, st->selector_type);
    if (!s)
        return NULL;
    Py_INCREF(owner);
    s->owner = owner;
    s->handle = h;
    s->kind = kind;
    return (PyObject *)s;
}

int exr_selector_handle(ReplayObject *self, PyObject *ps, int64_t *h)
{
    exr_modstate *st = exr_state_of_type(Py_TYPE(self));
    if (Py_IS_TYPE(ps, st->selector_type)) {
        SelectorObject *s = (SelectorObject *)ps;
        if (s->owner != self) {
            PyErr_Format(PyExc_ValueError,
                         "ps: expected a pick selector of this buffer, got one of another buffer");
            return -1;
        }
        *h = s->handle;
        return 0;
    }
    int r = exr_handle_arg(ps, "ps", "a PickSelector or an int handle", h);
    if (r > 0) /* beyond int64: unknown, and said so with the value given */
        exr_unknown_selector_int(ps);
    return r ? -1 : 0;
}

static void sel_dealloc(SelectorObject *s)
{
    PyTypeObject *tp = Py_TYPE(s);
    Py_XDECREF(s->owner);
    tp->tp_free(s);
    Py_DECREF(tp);
}

static PyObject *sel_index(SelectorObject *s) { return PyLong_FromLongLong(s->handle); }

static Py_hash_t sel_hash(SelectorObject *s)
{
    Py_hash_t h = (Py_hash_t)s->handle;
    return h == -1 ? -2 : h;
}

static PyObject *sel_richcompare(SelectorObject *s, PyObject *o, int op)
{
    if (op != Py_EQ && op != Py_NE)
        Py_RETURN_NOTIMPLEMENTED;
    int eq;
    if (Py_IS_TYPE(o, Py_TYPE(s))) {
        SelectorObject *t = (SelectorObject *)o;
        eq = t->owner == s->owner && t->handle == s->handle;
    } else if (PyLong_Check(o) && !PyBool_Check(o)) {
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
        if (x == -1 && PyErr_Occurred())
            return NULL;
        eq = !overflow && x == s->handle;
    } else {
        Py_RETURN_NOTIMPLEMENTED;
    }
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

/* Parameter k of this selector, or -1 with AttributeError. */
static int param_index(SelectorObject *s, const char *name)
{
    const exr_selector_vtable *vt = exr_selector_kinds[s->kind];
    for (int k = 0; k < vt->nparams; k++)
        if (strcmp(vt->param_names[k], name) == 0)
            return k;
    PyErr_Format(PyExc_AttributeError, "%s %s pick selector has no parameter '%s'",
                 exr_article(vt->name), vt->name, name);
    return -1;
}

static PyObject *sel_get_param(SelectorObject *s, void *closure)
{
    EXR_GUARD(s->owner, NULL);
    const exr_selector_vtable *vt = exr_selector_kinds[s->kind];
    int k = 0;
    while (k < vt->nparams && strcmp(vt->param_names[k], (const char *)closure) != 0)
        k++;
    if (k == vt->nparams)
        Py_RETURN_NONE; /* a parameter other kinds have: None, as for a uniform selector's beta */
    exr_lock_with_gil(s->owner->buf);
    exr_selector *sel = exr_buffer_selector_locked(s->owner->buf, s->handle);
    double v = sel ? sel->vt->get_param(sel, k) : 0;
    exr_buffer_unlock(s->owner->buf);
    if (!sel)
        return PyErr_Format(PyExc_ValueError, "ps: pick selector %lld was removed from its buffer",
                            (long long)s->handle);
    return PyFloat_FromDouble(v);
}

static int sel_set_param(SelectorObject *s, PyObject *value, void *closure)
{
    EXR_GUARD(s->owner, -1);
    const char *name = closure;
    int k = param_index(s, name);
    if (k < 0)
        return -1;
    const exr_selector_vtable *vt = exr_selector_kinds[s->kind];
    if (!value) {
        PyErr_Format(PyExc_AttributeError, "%s cannot be deleted: a selector always has one",
                     name);
        return -1;
    }
    if (k < vt->settable_from) {
        PyErr_Format(PyExc_AttributeError, "%s is fixed when the selector is created", name);
        return -1;
    }
    double v;
    if (exr_real_arg(value, name, &v) < 0)
        return -1;
    if (!vt->param_ok(k, v)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a finite number >= 0, got %R", name, value);
        return -1;
    }
    exr_lock_with_gil(s->owner->buf);
    exr_status st = exr_buffer_set_param_locked(s->owner->buf, s->handle, k, v);
    exr_buffer_unlock(s->owner->buf);
    if (st != EXR_OK) {
        char got[64];
        snprintf(got, sizeof got, "pick selector %lld, which was removed from it",
                 (long long)s->handle);
        exr_raise_status(st, &(exr_errctx){.op = name, .arg = "ps",
                                           .expected = "a pick selector of its buffer",
                                           .got = got, .handle = s->handle});
        return -1;
    }
    return 0;
}

static PyObject *sel_get_handle(SelectorObject *s, void *c)
{
    (void)c;
    return PyLong_FromLongLong(s->handle);
}

/* exreplay.PickSelectorClass(kind): the IntEnum the reference's selectors
 * give too (docs/api.md, "PickSelector"), so that kind compares equal to
 * its int and shows its name. */
static PyObject *kind_enum(int kind)
{
    PyObject *mod = PyImport_ImportModule("exreplay._types");
    PyObject *cls = mod ? PyObject_GetAttrString(mod, "PickSelectorClass") : NULL;
    Py_XDECREF(mod);
    if (!cls)
        return NULL;
    PyObject *r = PyObject_CallFunction(cls, "i", kind);
    Py_DECREF(cls);
    return r;
}

static PyObject *sel_get_kind(SelectorObject *s, void *c)
{
    (void)c;
    return kind_enum(s->kind);
}

static PyObject *sel_get_buffer(SelectorObject *s, void *c)
{
    (void)c;
    return Py_NewRef(s->owner);
}

/* "PickSelector(handle=1, kind=PickSelectorClass.Prioritized": the repr's
 * head, as the reference's (its class's name in front). */
static PyObject *sel_repr_head(SelectorObject *s)
{
    PyObject *kind = kind_enum(s->kind);
    PyObject *name = kind ? PyObject_GetAttrString(kind, "name") : NULL;
    Py_XDECREF(kind);
    if (!name)
        return NULL;
    PyObject *head = PyUnicode_FromFormat("PickSelector(handle=%lld, kind=PickSelectorClass.%S",
                                          (long long)s->handle, name);
    Py_DECREF(name);
    return head;
}

static PyObject *sel_repr(SelectorObject *s)
{
    EXR_GUARD(s->owner, NULL);
    const exr_selector_vtable *vt = exr_selector_kinds[s->kind];
    PyObject *parts = sel_repr_head(s);
    exr_lock_with_gil(s->owner->buf);
    exr_selector *sel = exr_buffer_selector_locked(s->owner->buf, s->handle);
    double vals[EXR_SEL_MAXPARAMS];
    for (int k = 0; sel && k < vt->nparams; k++)
        vals[k] = sel->vt->get_param(sel, k);
    exr_buffer_unlock(s->owner->buf);
    for (int k = 0; parts && k < vt->nparams; k++) {
        PyObject *num = sel ? PyFloat_FromDouble(vals[k]) : NULL;
        PyObject *more = sel && num ? PyUnicode_FromFormat("%U, %s=%R", parts, vt->param_names[k], num)
                                    : NULL;
        Py_XDECREF(num);
        if (!sel)
            break;
        Py_SETREF(parts, more);
    }
    if (!parts)
        return NULL;
    PyObject *r = PyUnicode_FromFormat(sel ? "%U)" : "%U, removed)", parts);
    Py_DECREF(parts);
    return r;
}

static PyGetSetDef sel_getset[] = {
    {"handle", (getter)sel_get_handle, NULL, "the selector's integer handle", NULL},
    {"kind", (getter)sel_get_kind, NULL,
     "the PickSelectorClass (an IntEnum: equal to its int value)", NULL},
    {"buffer", (getter)sel_get_buffer, NULL, "the ExperienceReplay it belongs to", NULL},
    {"alpha", (getter)sel_get_param, (setter)sel_set_param,
     "prioritization exponent (fixed at creation)", "alpha"},
    {"beta", (getter)sel_get_param, (setter)sel_set_param,
     "importance-weight exponent; settable for annealing", "beta"},
    {NULL},
};

static PyType_Slot sel_slots[] = {
    {Py_tp_dealloc, sel_dealloc},
    {Py_tp_repr, sel_repr},
    {Py_tp_hash, sel_hash},
    {Py_tp_richcompare, sel_richcompare},
    {Py_tp_getset, sel_getset},
    {Py_nb_index, sel_index},
    {Py_nb_int, sel_index},
    {Py_tp_doc, "A pick selector of an ExperienceReplay (from new_pick_selector,\n"
                "pick_selector or pick_selectors: a new object at every call; objects of\n"
                "one selector of one buffer are equal and share its alpha and beta).\n\n"
                "Behaves as its integer handle wherever a handle is expected (it has\n"
                "__index__ and compares equal to its handle); a selector object of another\n"
                "buffer is refused with ValueError (buf.pick_selector(int(ps)) gives this\n"
                "buffer's object for the same handle, e.g. after a restore).\n\n"
                "Attributes:\n"
                "  handle: its int handle (0, 1, ... per buffer, never reused).\n"
                "  kind: the PickSelectorClass (an IntEnum, equal to its int value:\n"
                "    Uniform 0, Prioritized 1, Rank 2).\n"
                "  buffer: the ExperienceReplay it belongs to.\n"
                "  alpha: the priority exponent, fixed at creation (None on Uniform).\n"
                "  beta: the importance-weight exponent (None on Uniform); settable on\n"
                "    Prioritized and Rank (finite, >= 0, else ValueError) for annealing,\n"
                "    taking effect at the next batch. Reading or setting it after\n"
                "    remove_pick_selector raises ValueError."},
    {0, NULL},
};

static PyType_Spec sel_spec = {
    .name = "exreplay._core.PickSelector",
    .basicsize = sizeof(SelectorObject),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_IMMUTABLETYPE | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    .slots = sel_slots,
};

int exr_selector_init_type(PyObject *m, exr_modstate *st)
{
    st->selector_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &sel_spec, NULL);
    if (!st->selector_type)
        return -1;
    return PyModule_AddObjectRef(m, "PickSelector", (PyObject *)st->selector_type);
}

/* ---- ExperienceReplay's methods that make and remove selectors ---------- */

PyObject *replay_new_pick_selector(ReplayObject *self, PyObject *args, PyObject *kw)
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
                                    "new_pick_selector(): %s %s selector takes no parameter %R",
                                    exr_article(vt->name), vt->name, key);
            const char *pname = vt->param_names[k];
            if (exr_real_arg(value, pname, &params[k]) < 0)
                return NULL;
            if (!vt->param_ok(k, params[k]))
                return PyErr_Format(PyExc_ValueError, "%s: expected a finite number >= 0, got %R",
                                    pname, value);
        }
    }
    /* the object first: once the core has the selector, nothing fails */
    PyObject *obj = exr_selector_new(self, -1, (int)kind);
    if (!obj)
        return NULL;
    int64_t h;
    exr_lock_with_gil(self->buf);
    exr_status st = exr_buffer_add_selector_locked(self->buf, (int)kind, params, &h);
    exr_buffer_unlock(self->buf);
    if (st != EXR_OK)
        Py_DECREF(obj);
    if (st == EXR_EINVAL) { /* kind and parameters were checked above: the count */
        char exp[96];
        snprintf(exp, sizeof exp, "a buffer holding fewer than %d selectors (remove_pick_selector "
                 "makes room)", EXR_MAX_SELECTORS);
        return exr_raise_status(st, &(exr_errctx){.op = "new_pick_selector", .expected = exp,
                                                  .got = "one holding that many", .handle = -1});
    }
    if (st != EXR_OK)
        return exr_raise(st, "new_pick_selector");
    ((SelectorObject *)obj)->handle = h;
    return obj;
}

PyObject *replay_remove_pick_selector(ReplayObject *self, PyObject *ps)
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

/* ---- PickSelector objects for the selectors a buffer holds -------------- */

PyObject *replay_pick_selector(ReplayObject *self, PyObject *ps)
{
    EXR_GUARD(self, NULL);
    int64_t h;
    if (exr_selector_handle(self, ps, &h) < 0)
        return NULL;
    exr_lock_with_gil(self->buf);
    exr_selector *s = exr_buffer_selector_locked(self->buf, h);
    int kind = s ? exr_selector_kind(s) : -1;
    exr_buffer_unlock(self->buf);
    return s ? exr_selector_new(self, h, kind) : unknown_selector(h);
}

PyObject *replay_pick_selectors(ReplayObject *self, PyObject *unused)
{
    EXR_GUARD(self, NULL);
    (void)unused;
    int64_t handles[EXR_MAX_SELECTORS];
    int kinds[EXR_MAX_SELECTORS];
    exr_lock_with_gil(self->buf);
    size_t n = exr_buffer_selectors_locked(self->buf, handles, kinds);
    exr_buffer_unlock(self->buf);
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        PyObject *s = exr_selector_new(self, handles[i], kinds[i]);
        if (!s)
            Py_CLEAR(l);
        else
            PyList_SET_ITEM(l, (Py_ssize_t)i, s);
    }
    return l;
}
