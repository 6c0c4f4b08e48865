/*
 * binding.h - what the binding's files share: module state, the object
 * layouts, and the helpers that turn core statuses and Python arguments into
 * each other. No algorithm lives in src/py; it only converts and locks.
 */
#ifndef EXR_BINDING_H
#define EXR_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_21_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL exreplay_ARRAY_API
#ifndef EXR_IMPORT_ARRAY_HERE
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>

#include "buffer.h"

typedef struct {
    PyTypeObject *replay_type;
    PyTypeObject *selector_type;
    PyTypeObject *batch_type;
    PyTypeObject *episode_type;
} exr_modstate;

typedef struct {
    PyObject_HEAD
    exr_buffer *buf;
    PyArray_Descr *state_descr, *action_descr, *reward_descr;
    int state_nd, action_nd;
    npy_intp state_shape[NPY_MAXDIMS], action_shape[NPY_MAXDIMS];
    PyObject *capacity;   /* int or None */
    PyObject *seed;       /* int or None */
    int eviction;
    PyObject *weakreflist;
} ReplayObject;

typedef struct {
    PyObject_HEAD
    ReplayObject *owner;  /* strong reference */
    int64_t handle;
    int kind;
} SelectorObject;

extern PyModuleDef exr_module_def;

exr_modstate *exr_state_of_type(PyTypeObject *tp);

/* Raises the Python exception for a core status; what names the operation
 * and argument ("ps: ..."). Always returns NULL. */
PyObject *exr_raise(exr_status st, const char *what);

/* Takes the buffer's lock; if another thread holds it, waits without the GIL. */
void exr_lock_with_gil(exr_buffer *b);

/* An ndarray of exactly descr, C-contiguous and aligned, of shape
 * (lead..., shape...) where lead has nlead leading dims (-1: any length).
 * Other dtypes are cast under the same_kind rule. NULL with TypeError or
 * ValueError naming arg. A new reference. */
PyArrayObject *exr_as_array(PyObject *obj, PyArray_Descr *descr, int nlead, npy_intp *lead,
                            int nd, const npy_intp *shape, const char *arg);

/* Shape as "(84, 84)" into buf. */
void exr_shape_str(char *buf, size_t len, int nd, const npy_intp *shape);

int exr_replay_init_type(PyObject *module, exr_modstate *st);
int exr_selector_init_type(PyObject *module, exr_modstate *st);

/* A new PickSelector for handle h of owner. */
PyObject *exr_selector_new(ReplayObject *owner, int64_t h, int kind);

/* _core._floor_gather (floor.c). */
PyObject *exr_floor_gather_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* Accepts a PickSelector of this buffer or an integer handle. -1 with an
 * exception on error. */
int exr_selector_handle(ReplayObject *self, PyObject *ps, int64_t *h);

#endif
