"""Argument checks of the Python-side entry points (exreplay.log, exreplay.rllib),
spelled as the C binding spells its own (src/py/args.c): a wrong type is a
TypeError, a wrong value of the right type a ValueError, and both read
"name: expected ..., got ...". A TypeError shows the type that came (an
array with its dtype and shape), a ValueError the value."""

from __future__ import annotations

import operator
import os

import numpy as np


def article(word: str) -> str:
    """The article for word in a message, "an" where it starts with a vowel
    sound, else "a" (src/py/args.c, exr_article, the same rule): "an int",
    "an ndarray", "an object", "an int64 array", but "a float", "a uint8
    array", "a uniform selector". Leading characters that are no letter
    ("_", "<") are skipped. A vowel sound is a, e, i, o; u in "un" but not
    "uni"; n before another consonant (read "en", as in "ndarray")."""
    def letter(ch):
        return ch.isascii() and ch.isalpha()

    i = 0
    while i < len(word) and not letter(word[i]):
        i += 1
    c, d, e = (word[i:i + 3].lower() + "\0\0\0")[:3]
    vowel = (c in "aeio" or (c == "u" and d == "n" and e != "i")  # "an unknown", "a uniform"
             or (c == "n" and letter(d) and d not in "aeiouy"))  # "an ndarray"
    return "an" if vowel else "a"


def with_article(word: str) -> str:
    """word after its article, as messages name a type: "an int", "a float"."""
    return "%s %s" % (article(word), word)


def type_name(o) -> str:
    """The type of o as a message shows it: "str", "numpy.float64", "numpy.ndarray
    of dtype int64 and shape (1,)", a class defined in Python by its bare
    name ("Thing"): tp_name(o), with an array's dtype and shape, as the C
    binding's exr_type_str shows it."""
    name = tp_name(o)
    if isinstance(o, np.ndarray):
        name += " of dtype %s and shape %s" % (o.dtype, o.shape)
    return name


def _is_bool(v) -> bool:
    return isinstance(v, (bool, np.bool_)) or (isinstance(v, np.ndarray) and v.dtype.kind == "b")


def index_arg(name: str, v, expected: str) -> int:
    """v as an int, of any size: anything with __index__ (NumPy's integer
    scalars and 0-d integer arrays too) but a bool; else the TypeError
    "name: expected <expected>, got <its type>"."""
    try:
        if _is_bool(v):
            raise TypeError
        return operator.index(v)
    except TypeError:
        raise TypeError("%s: expected %s, got %s" % (name, expected, type_name(v))) from None


def int_arg(name: str, v, lo: int, hi, expected: str) -> int:
    """v as an int in [lo, hi] (hi None: no upper bound), by index_arg's
    rule."""
    i = index_arg(name, v, expected)
    if i < lo or (hi is not None and i > hi):
        raise ValueError("%s: expected %s, got %d" % (name, expected, i))
    return i


def truth_arg(name: str, v) -> bool:
    """v as the buffer takes its flags (terminated, allow_short, shared_next:
    docs/api.md, "Errors"): a bool, a NumPy bool, a Python int or
    a NumPy integer scalar (any nonzero int is true, as in ``if``); anything
    else, an array, None or a float included, is a TypeError worded as the
    buffer's, "shared_next: expected a bool or an int, got NoneType"."""
    if not isinstance(v, (bool, np.bool_, int, np.integer)) or isinstance(v, np.timedelta64):
        raise TypeError("%s: expected a bool or an int, got %s" % (name, tp_name(v)))
    return bool(v)


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made at run time
_WRAPPER = "<method-wrapper '__str__' of "


def tp_name(o) -> str:
    """The type of o as the binding and CPython's own messages show it (the
    C type's tp_name): "float", "numpy.int64", "numpy.ndarray" (no dtype or
    shape), "exreplay._core.ExperienceReplay", and a class defined in Python
    by its bare name ("Thing")."""
    t = type(o)
    if not t.__flags__ & _HEAPTYPE:  # a static C type: module.name, or the name in builtins
        return t.__name__ if t.__module__ == "builtins" else "%s.%s" % (t.__module__, t.__name__)
    # A class statement's tp_name is its bare name, an extension type's made
    # by PyType_FromSpec its dotted name: only the type knows which, and a
    # method-wrapper's repr shows it (without running any code of o's).
    r = repr(object.__str__.__get__(o))
    return r[len(_WRAPPER):r.rindex(" object at ")]


def nonneg_real_arg(name: str, v, expected: str) -> float:
    """v as a finite float >= 0: an int or a float (NumPy's scalars and 0-d
    arrays too), not a bool nor a complex number."""
    if isinstance(v, np.ndarray) and v.ndim == 0 and v.dtype.kind in "iuf":
        v = v[()]
    if (_is_bool(v) or isinstance(v, (complex, np.complexfloating, str, bytes,
                                      np.timedelta64, np.datetime64))
            or not isinstance(v, (int, float, np.integer, np.floating))):
        raise TypeError("%s: expected %s, got %s" % (name, expected, type_name(v)))
    try:
        x = float(v)
    except OverflowError:
        raise ValueError("%s: expected %s, got an int too large for a float"
                         % (name, expected)) from None
    if not (np.isfinite(x) and x >= 0):
        raise ValueError("%s: expected %s, got %r" % (
            name, expected, int(v) if isinstance(v, (int, np.integer)) else x))
    return x


def path_arg(name: str, p):
    """os.fspath(p), refused naming the argument (as the C binding's paths
    are) if it is no path, cannot be encoded or holds a NUL."""
    try:
        path = os.fspath(p)
    except TypeError:
        raise TypeError("%s: expected a path (str, bytes or os.PathLike), got %s"
                        % (name, type_name(p))) from None
    try:
        raw = os.fsencode(path)
    except UnicodeEncodeError:
        raise ValueError("%s: expected a path the file system encoding can encode, got %r"
                         % (name, p)) from None
    if b"\0" in raw:
        raise ValueError("%s: expected a path without a NUL character, got %r" % (name, p))
    return path
