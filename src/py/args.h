/*
 * args.h - argument conversion shared by the binding's methods: one helper
 * for integer arguments (a name and a range), one for real-number scalars,
 * and the by-value check of Python ints headed for an integer column.
 *
 * Every error names the argument, what was expected and what came:
 * TypeError for the wrong kind of object, ValueError for a value out of
 * range. Python ints are judged by their value, never through a float.
 */
#ifndef EXR_ARGS_H
#define EXR_ARGS_H

#include "binding.h"

/* An integer argument: an object with __index__ that is not a bool; of
 * arrays (every ndarray has __index__), only a 0-d integer one. */
int exr_is_int(PyObject *o);

/* A shape argument (an int, or a tuple or list of ints) into *nd and
 * shape (room for NPY_MAXDIMS - 2), each dimension 1 .. 2**40 (an item
 * takes at most 1 TiB, so none is larger). Errors name it as NAME, or
 * NAME[KEY] when key is not NULL (a field of a spec). */
int exr_shape_arg(PyObject *o, const char *name, PyObject *key, int *nd, npy_intp *shape);

/* The article for word in a message, "an" where it starts with a vowel
 * sound, else "a": "an int", "an ndarray", "an object", "an int64 array",
 * "a float", "a uint8 array", "a uniform selector". Leading characters
 * that are no letter ('_', '<') are skipped. A vowel sound is a, e, i, o;
 * u in "un" but not "uni" (u read as in "uint" otherwise); n before another
 * consonant (read "en", as in "ndarray"). exreplay._args.article is the
 * same rule. */
const char *exr_article(const char *word);

/* The type of o for a TypeError: its name, and for an ndarray its dtype and
 * shape too ("numpy.ndarray of dtype int64 and shape (1,)", in buf). */
const char *exr_type_str(PyObject *o, char *buf, size_t len);

/* An integer argument in [lo, hi] into *out. TypeError "NAME: expected
 * EXPECTED, got TYPE" for a non-int (bools too), ValueError "NAME: expected
 * EXPECTED, got VALUE" outside the range. expected NULL says "an int in
 * [lo, hi]". */
int exr_int_arg(PyObject *o, const char *name, const char *expected, int64_t lo, int64_t hi,
                int64_t *out);

/* A handle (of an episode or a selector): an int argument, as int64: 0,
 * or 1 for one beyond int64, which no episode or selector has (*h is then
 * -1, as unknown as any other; a message about it shows o itself: what an
 * unknown handle means is the caller's). -1 with TypeError for a non-int. */
int exr_handle_arg(PyObject *o, const char *name, const char *expected, int64_t *h);

/* The same for [0, hi] of the unsigned 64-bit range. */
int exr_uint_arg(PyObject *o, const char *name, const char *expected, uint64_t hi, uint64_t *out);

/* A real-number scalar: a float, an int, or anything with __float__ except
 * bool, complex, NumPy's times and a 0-d array of any dtype but an integer
 * or float one. TypeError for other types, ValueError for a sequence or an
 * int too large for a double. */
int exr_real_arg(PyObject *o, const char *name, double *out);

/* Path argument `name` as bytes for the file system (*out, a new
 * reference), PyUnicode_FSConverter's; its TypeError and its ValueError for
 * a NUL inside name the argument: "path: expected a path (str, bytes or
 * os.PathLike), got int". 0, or -1 with the exception set. */
int exr_path_arg(PyObject *o, const char *name, PyObject **out);

/* TypeError when o is a bool, an array or list of bools, or a list or tuple
 * with a bool among its items (NumPy would read [1.0, True] as [1.0, 1.0]):
 * priorities are real numbers, and True is not one (as exr_real_arg says
 * for a scalar). */
int exr_refuse_bools(PyObject *o, const char *arg);

/* Whether o is a list or tuple with a bool (Python's, NumPy's scalar, or a
 * bool array) among its items. */
int exr_seq_has_bool(PyObject *o);

/* Python ints (obj: a list or scalar that holds no dtype of its own; arr:
 * what NumPy made of it) converted by value into a new C-contiguous array of
 * descr, an integer dtype. Returns NULL and sets *not_ints when some element is not
 * a Python int (the caller then reports the dtype it got); NULL with
 * ValueError naming arg and descr's range when a value does not fit. */
PyArrayObject *exr_ints_by_value(PyObject *obj, PyArrayObject *arr, PyArray_Descr *descr,
                                 const char *arg, int *not_ints);

/* a, int64 values cast from a uint64 array: -1 with the ValueError of
 * exr_ints_by_value (naming arg and descr's range, int64's) for the first
 * value beyond int64 (negative in a: the cast wrapped it), else 0. */
int exr_refuse_wrapped(PyArrayObject *a, PyArray_Descr *descr, const char *arg);

/* Python numbers that NumPy could hold only as objects (objs: ints beyond
 * uint64, alone or with floats), headed for a float column: a new
 * C-contiguous float64 array of objs's shape, each int converted by value.
 * NULL with *not_reals set when an element is no int or float (a bool
 * included: the caller then reports the dtype it got); NULL with a
 * ValueError naming arg for an int too large for a double. */
PyArrayObject *exr_reals_by_value(PyArrayObject *objs, const char *arg, int *not_reals);

/* A flag argument of the buffer's and the log's (terminated, allow_short,
 * shared_next, fsync, overwrite, sync): a bool, numpy.bool_, a Python int or
 * a NumPy integer scalar (any nonzero int is true; a timedelta64 is not
 * one), else a TypeError naming it; absent is false. */
int truth_arg(PyObject *o, const char *name, bool *out);

#endif
