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

/* NumPy 2 headers define PyDataType_ELSIZE (and make it work on 1.x at run
 * time); building against NumPy 1.x headers needs the field access. */
#if !defined(PyDataType_ELSIZE) && NPY_ABI_VERSION < 0x02000000
#define PyDataType_ELSIZE(descr) ((npy_intp)(descr)->elsize)
#endif

#include "buffer.h"
#include "seg_collapse.h"

#define EXR_BLOCK_CACHE_N 8
#define EXR_BLOCK_CACHE_BYTES ((size_t)256 << 20)

typedef struct {
    PyTypeObject *replay_type;
    PyTypeObject *selector_type;
    PyTypeObject *batch_type;
    PyTypeObject *episode_type;
    PyTypeObject *block_type;
    PyTypeObject *log_type;
    /* NumPy's float32 and int64 descrs: what get_batch makes its weight and
     * index arrays with, so an out= array is checked by pointer (arrays.c) */
    PyArray_Descr *f32_descr, *i64_descr;
    /* batch memory kept for reuse (block.c); used with the GIL held */
    struct {
        void *mem;
        size_t size;
    } cached[EXR_BLOCK_CACHE_N];
    int ncached;
    size_t cached_bytes;
} exr_modstate;

/* a batch's array fields: all but extras (replay_impl.h, F_EXTRAS) */
#define EXR_SPARE_ARRAYS 10

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
    unsigned long busy_thread; /* the thread inside save()'s progress callback */
    PyObject *log;             /* the ExperienceLog attached (log.c), or NULL */
    /* named fields (named.h): NULL for one state array / no extras. With
     * sfields, state_descr/state_shape describe the packed bytes (uint8). */
    struct exr_fieldset *sfields, *xfields;
    /* the arrays (all but extras) of the last two small batches returned
     * without out=, refilled by a later get_batch once nothing else holds
     * them (arrays.c, "spare arrays"). Used with the GIL held. */
    PyObject *spare[2][EXR_SPARE_ARRAYS];
    int spare_next;
} ReplayObject;

/* exreplay calls now out without the GIL, in the whole process (as the GIL
 * is): each will want the GIL back, so a small call that could keep the GIL
 * does not while this is not 0 (docs/design.md, "The binding's one idiom").
 * Changed and read only with the GIL held, so a plain int. */
extern int exr_nogil_calls;
/* small calls that did all their work with the GIL held (the test hook
 * _core._gil_kept reads it); changed only with the GIL held */
extern unsigned long long exr_gil_kept;
/* set_priority calls of the handle form that found their batch's
 * pick_index through its arrays (exr_block_pick_hints; the test hook
 * _core._block_hints reads it); changed only with the GIL held */
extern unsigned long long exr_block_hints;
/* set_priority calls that gave the core what their batch's draw noted
 * (exr_block_drawn_take; the core compares each pick with it; the test
 * hook _core._drawn_given reads it); changed only with the GIL held */
extern unsigned long long exr_drawn_given;

/* Py_BEGIN/END_ALLOW_THREADS counted in exr_nogil_calls: every place where
 * the binding lets go of the GIL uses these. */
#define EXR_NOGIL_BEGIN                                                                            \
    {                                                                                              \
        exr_nogil_calls++;                                                                         \
        Py_BEGIN_ALLOW_THREADS
#define EXR_NOGIL_END                                                                              \
        Py_END_ALLOW_THREADS                                                                       \
        exr_nogil_calls--;                                                                         \
    }

/* The storage chunks that the calls before filled with segments, moved onto
 * huge pages (seg_collapse.h): about a millisecond each, so only where the
 * GIL is released and no buffer lock held. Record calls queue a chunk once
 * per 1 MiB or more of new segments. */
static inline void exr_collapse_queued_nogil(void)
{
    if (exr_seg_collapse_wanted())
        exr_seg_collapse_pending();
}

/* As exr_collapse_queued_nogil, from code that holds the GIL. */
static inline void exr_collapse_queued(void)
{
    if (exr_seg_collapse_wanted()) {
        EXR_NOGIL_BEGIN
        exr_seg_collapse_pending();
        EXR_NOGIL_END
    }
}

/* Whether this thread is inside r's save() progress callback (and so holds
 * r's lock). */
static inline bool exr_busy_here(const ReplayObject *r)
{
    return r->busy_thread && r->busy_thread == PyThread_get_thread_ident();
}

/* save() calls its progress callback with the buffer locked: a call back
 * into the buffer from that callback would deadlock, so it raises instead. */
#define EXR_GUARD(self, fail)                                                                      \
    do {                                                                                           \
        if (exr_busy_here(self)) {                                                                 \
            PyErr_SetString(PyExc_RuntimeError,                                                    \
                            "the buffer is locked by save() in this thread: its progress "         \
                            "callback must not use the buffer");                                   \
            return fail;                                                                           \
        }                                                                                          \
    } while (0)

typedef struct {
    PyObject_HEAD
    ReplayObject *owner;  /* strong reference */
    int64_t handle;
    int kind;
} SelectorObject;

extern PyModuleDef exr_module_def;

exr_modstate *exr_state_of_type(PyTypeObject *tp);

/* What a failed core call was about, for its exception (errors.c). */
typedef struct {
    const char *op;       /* the operation: "get_batch" */
    const char *arg;      /* the argument the status is about, or NULL (then op) */
    const char *expected; /* what that argument should have been, or NULL */
    const char *got;      /* what came, or NULL */
    bool has_handle;      /* handle came (when got is NULL): "unknown handle 7" */
    int64_t handle;
    int err;              /* errno of an EXR_EIO (0: errno itself) */
    PyObject *path;       /* the file of an EXR_EIO, or NULL */
} exr_errctx;

/* The binding's one way from a core status to a Python exception: the
 * type follows the status (errors.c lists them), the message names the
 * argument, what was expected and what came. Always returns NULL. */
PyObject *exr_raise_status(exr_status st, const exr_errctx *ctx);
/* _core._raise_status (a test hook). */
PyObject *exr_raise_status_py(PyObject *module, PyObject *args);
/* exr_raise_status with only the operation known. */
PyObject *exr_raise(exr_status st, const char *op);
/* ENOTFOUND for selector handle h: "ps: expected a pick selector of this
 * buffer, got unknown handle h". */
PyObject *exr_unknown_selector(int64_t h);
/* The same for a handle given as an int beyond int64 (o, a Python int or
 * an object with __index__), which no selector has. */
PyObject *exr_unknown_selector_int(PyObject *o);
/* The ValueError for an episode handle the buffer does not hold: "h:
 * expected the handle of an episode held, got 7 (evicted or never
 * created)", of h, or of o (not NULL) when the int given is beyond int64. */
PyObject *exr_unknown_episode(int64_t h, PyObject *o);

/* The binding's one way to hold the buffer's lock: called with the GIL,
 * takes the lock (waiting without the GIL if another thread holds it);
 * release with exr_buffer_unlock. Work that takes long under the lock
 * (serialize, save) releases the GIL inside, never the other way round:
 * no thread ever waits for the lock while holding the GIL. Calls that copy
 * rows (record, get_batch, set_priority) take the lock themselves inside
 * the core and are made with the GIL released, never through this. */
void exr_lock_with_gil(exr_buffer *b);
/* The same, then waits (without the GIL) until every recorded row is
 * published: what serialize and save need. */
void exr_lock_published_with_gil(exr_buffer *b);

/* An ndarray of exactly descr, C-contiguous and aligned, of shape
 * (lead..., shape...) where lead has nlead leading dims (-1: any length).
 * Other dtypes are cast under the same_kind rule. NULL with TypeError or
 * ValueError naming arg. A new reference. */
PyArrayObject *exr_as_array(PyObject *obj, PyArray_Descr *descr, int nlead, npy_intp *lead,
                            int nd, const npy_intp *shape, const char *arg);

/* An array of int64 handles, positions or table indices (set_priority's
 * pick_epi, pick_pos and pick_index, and the same of _gather and
 * stored_priorities): exr_as_array into int64 of shape (*n,) (*n < 0: any
 * length, filled in), except that these are ints, so an array of bools is
 * a TypeError (as a bool handle is) and a uint64 value beyond int64 a
 * ValueError (as the same Python int is), where the cast would take the
 * first as 0 and 1 and wrap the second to a negative value. */
PyArrayObject *exr_as_index_array(PyObject *obj, npy_intp *n, const char *arg);

/* Shape as "(84, 84)" into buf. */
void exr_shape_str(char *buf, size_t len, int nd, const npy_intp *shape);
/* A shape as a tuple of ints (a new reference, NULL with an exception). */
PyObject *exr_shape_tuple(int nd, const npy_intp *shape);

int exr_replay_init_type(PyObject *module, exr_modstate *st);

/* A dtype argument checked as the constructor checks it (reward: float only). */
PyArray_Descr *exr_dtype_arg(PyObject *o, const char *name, int reward);

/* persist.c: serialize, unserialize, save, load, pickling. */
PyObject *exr_replay_serialize(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                               PyObject *kwnames);
PyObject *exr_replay_unserialize_cls(PyObject *cls, PyObject *data);
PyObject *exr_replay_save(ReplayObject *self, PyObject *const *args, Py_ssize_t nargs,
                          PyObject *kwnames);
PyObject *exr_replay_load_cls(PyObject *cls, PyObject *path);
PyObject *exr_replay_reduce_ex(ReplayObject *self, PyObject *protocol);
PyObject *exr_unserialize(PyObject *module, PyObject *data);

/* Shared argument parsing (args.c). */
int exr_parse_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, const char *fname,
                   const char *const *names, int nreq, int nmax, PyObject **out);
int exr_selector_init_type(PyObject *module, exr_modstate *st);

/* block.c: one allocation for a batch's arrays, recycled. */
int exr_block_init_type(PyObject *module, exr_modstate *st);
PyObject *exr_block_new(exr_modstate *st, size_t size);
void *exr_block_data(PyObject *block);
/* Notes that block holds a batch of n picks whose pick_epi, pick_pos and
 * pick_index arrays start at epi, pos and index. */
void exr_block_mark_picks(PyObject *block, const void *epi, const void *pos, const void *index,
                          npy_intp n);
/* The batch's pick_index, when epi and pos (n each) are that batch's own
 * pick_epi and pick_pos arrays (views of its block, where the block put
 * them); else NULL. Only a hint for set_priority: any values are safe
 * (docs/design.md, "Priority updates"). Counted in exr_block_hints. */
const int64_t *exr_block_pick_hints(exr_modstate *st, PyArrayObject *epi, PyArrayObject *pos,
                                    npy_intp n);
/* What a draw notes of its picks (exr_drawn) is kept in the block of a
 * batch of at most EXR_DRAWN_MAX picks: set_priority given that batch's
 * picks then goes to their table indices while nothing has moved in the
 * table since (docs/design.md, "A draw's notes"). Larger batches are
 * updated through their hints, checked pick by pick. */
#define EXR_DRAWN_MAX 1024
/* Bytes of the notes of n picks, a multiple of 64; 0 past EXR_DRAWN_MAX. */
size_t exr_block_drawn_bytes(npy_intp n);
/* The notes of block start `at` bytes into it, with room for cap picks,
 * none noted yet. */
void exr_block_set_drawn(PyObject *block, size_t at, npy_intp cap);
/* The notes of the block of epi (a batch's pick_epi array about to be
 * filled with n picks) into *d, for the core to write while the GIL is let
 * go: the block (borrowed), marked as being filled until
 * exr_block_release_drawn. NULL (and *d NULL) when epi has no block, its
 * block no room for n, or another get_batch is filling it. */
PyObject *exr_block_claim_drawn(exr_modstate *st, PyObject *epi, npy_intp n, exr_drawn **d);
void exr_block_release_drawn(PyObject *block);
/* The notes of the last draw into epi's block (a batch's pick_epi array
 * of n picks; a set_priority about to be given them), for the core to
 * read with the GIL let go: marked as being read (a get_batch into the
 * block meanwhile leaves them alone) until exr_block_drawn_release (with
 * *block, borrowed). NULL (and *block NULL) when epi has no block, no
 * notes of n picks, or a get_batch is filling them. The core compares
 * each pick given with the notes (docs/design.md, "A draw's notes").
 * Counted in exr_drawn_given. */
const exr_drawn *exr_block_drawn_take(exr_modstate *st, PyArrayObject *epi, npy_intp n,
                                     PyObject **block);
void exr_block_drawn_release(PyObject *block);
/* A C-contiguous array `at` bytes into block, of descr d (borrowed) and
 * shape dims, with the block as its base (its reference taken). */
PyObject *exr_block_array(PyObject *block, size_t at, PyArray_Descr *d, int nd, const npy_intp *dims);
void exr_block_cache_clear(exr_modstate *st);

/* A new PickSelector for handle h of owner. */
PyObject *exr_selector_new(ReplayObject *owner, int64_t h, int kind);

/* _core._floor_gather (floor.c). */
PyObject *exr_floor_gather_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *exr_floor_gather_cols_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *exr_floor_gather_batch_py(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *exr_crosscore_py(PyObject *module, PyObject *arg);

/* Accepts a PickSelector of this buffer or an integer handle. -1 with an
 * exception on error. */
int exr_selector_handle(ReplayObject *self, PyObject *ps, int64_t *h);

/* log.c: ExperienceLog, and attaching one to a buffer. */
struct exr_log;
int exr_log_init_type(PyObject *module, exr_modstate *st);
int exr_replay_attach_log(ReplayObject *self, PyObject *log);
void exr_replay_detach_log(ReplayObject *self); /* no-op without a log */
struct exr_log *exr_replay_log(ReplayObject *self); /* NULL without a log */
/* -1 with a ValueError naming what if the buffer's log is one a fork left
 * closed in this process (docs/log.md, "Logs and fork"), else 0. */
int exr_replay_log_check(ReplayObject *self, const char *what);
PyObject *exr_replay_attach_log_py(ReplayObject *self, PyObject *log);
PyObject *exr_replay_detach_log_py(ReplayObject *self, PyObject *unused);
PyObject *exr_replay_get_log(ReplayObject *self, void *c);
PyObject *exr_replay_from_log(PyObject *cls, PyObject *args, PyObject *kw);
PyObject *exr_replay_ingest(ReplayObject *self, PyObject *args, PyObject *kw);
/* Waits while the log's backlog is full (log.h); call without the GIL. */
void exr_log_throttle(struct exr_log *lg);
/* module.c: module.fn(first, *args, **kw), for methods written in Python
 * (for_spaces, from_log, ingest). NULL with an exception on failure. */
PyObject *exr_call_python(const char *module, const char *fn, PyObject *first, PyObject *args,
                          PyObject *kw);
/* diag.c: reprs, the empty get_batch error, for_spaces. */
PyObject *exr_replay_repr(PyObject *self);
int exr_install_reprs(exr_modstate *st);
PyObject *exr_empty_batch_error(ReplayObject *self, int64_t h);
PyObject *exr_describe_value(PyObject *o);
/* arrays.c: whether a can be refilled as a batch array of descr d and
 * shape dims (nd of them): an ndarray of an equivalent dtype, writeable,
 * C-contiguous and aligned; and the ValueError that says it cannot, naming
 * it by label (a new reference, consumed; NULL: its error stands). -1. */
int exr_out_array_ok(PyObject *a, PyArray_Descr *d, int nd, const npy_intp *dims);
int exr_out_array_refused(PyObject *label, PyArray_Descr *d, int nd, const npy_intp *dims,
                          PyObject *a);
PyObject *exr_for_spaces_cls(PyObject *cls, PyObject *args, PyObject *kwargs);

/* named.c: the constructor's state_shape/state_dtype vs state_spec and
 * extras_spec (sets sfields, xfields), and their attributes. */
int exr_replay_specs(ReplayObject *self, PyObject *sshape, PyObject *sdtype, PyObject *sspec,
                     PyObject *xspec);
PyObject *exr_replay_state_spec(ReplayObject *self, void *c);
PyObject *exr_replay_extras_spec(ReplayObject *self, void *c);
struct exr_fieldset;
void exr_fieldset_free(struct exr_fieldset *fs);

#endif
