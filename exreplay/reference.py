"""The pure-Python reference buffer: exreplay's semantics, executable.

`ReferenceReplay` has the API of the C buffer ``exreplay.ExperienceReplay``
and behaves as ``docs/semantics.md`` says, decision by decision.  It is the
definition the C buffer is differential-tested against, and the pure-Python
baseline of the benchmarks (docs/benchmarks.md).  Clarity wins over speed everywhere:
plain lists and dicts, one ``random.Random`` per selector, and NumPy only to
accept inputs and to build output arrays.

Where the two disagree, ``docs/semantics.md`` says which one is wrong.

Choices made here where ``docs/semantics.md`` is silent (the C buffer should
make the same ones):

- Casting.  NumPy arrays and scalars follow ``numpy.can_cast(src, dst,
  "same_kind")`` strictly (an int64 array into a uint8 state is a TypeError).
  Plain Python numbers and sequences have no dtype of their own, so only
  their kind counts (NEP 50): Python ints go into any integer dtype, judged
  by their values (beyond int64 too), and a value that does not fit is a
  ValueError naming the range; into a float dtype by value too (beyond
  uint64 as well: an int too large for a float is a ValueError); Python
  floats into an integer dtype are a TypeError.  Ragged sequences are a ValueError.
- Real-number scalars (a recorded ``priority``, ``alpha``, ``beta``): a
  float, an int or anything with ``__float__`` (a 0-d array too), but not a
  bool or a complex, nor a 0-d array of either (TypeError); a sequence is a ValueError, and so is an int
  too large for a float.  Priorities are never bools: ``True``, a NumPy bool,
  an array or list of bools, or a list with a bool among its numbers, is a
  TypeError wherever priorities go.
- Arguments are checked in order, and for each its type (TypeError) before
  its shape (ValueError): ``state=None`` or ``state="ab"`` is a TypeError, a
  list given as ``priority`` a ValueError (a sequence, not a scalar).  An
  empty Python list is accepted wherever a sequence of any length is (as
  ``pick_epi``, ``pick_pos``, ``priorities`` of ``set_priority``).
- Integer arguments (handles, sizes, capacity, pick_len, seed, kind) take
  anything with ``__index__`` except bools (TypeError); of arrays, only a
  0-d integer one (NumPy's ``__index__`` refuses any other).  ``allow_short``,
  ``terminated`` and ``shared_next`` take a bool, a NumPy bool or an int (a
  float, a string, None or an array is a TypeError).  ``state_dtype=None`` is
  a TypeError (``numpy.dtype(None)`` would silently mean float64).  A
  non-string ``eviction`` is a ValueError, like any other wrong value.
- ``seed=None`` reads back as None; the entropy drawn for it stays internal.
- Errors are the C buffer's, message for message, for every argument
  (``tests/test_arg_agreement.py`` compares them; the integer and flag
  checks are ``exreplay._args``'s): a wrong type is shown by its type, a
  wrong value as given, a type by its tp_name as CPython's messages show it
  (a class defined in Python by its bare name).  Only Python's own errors
  for a call's signature read differently.
- Priority 0 is stored as 0 for every alpha, alpha = 0 included (not
  ``0 ** 0 = 1``), so a zero priority is never drawn.  ``p ** alpha`` beyond
  float32's range is stored as float32's largest finite value.
- The maximum so far is raised only by priorities that reach a pick: a
  recorded one when its pick is entered, and each ``set_priority`` entry that
  names an existing pick (duplicates each count as applied).  ``set_priority``
  validates its inputs even on a Uniform selector before returning 0.
- ``_gather`` of a pick with priority 0 gives it the weight (N * 0) ** -beta:
  inf, or 1.0 when beta is 0.  ``_priority`` on a Uniform selector is a
  ValueError.  Weights are computed in float64, then rounded to float32.
- A Uniform selector's ``alpha`` and ``beta`` read as None; setting its
  ``beta`` is an AttributeError.  A selector is looked up by its handle only.
- ``get_batch`` checks batch_size, ps, shared_next, out, then that a pick
  exists, then that some priority is positive; a failed call does not advance
  the generator.  ``out=`` that is not a `Batch` is a TypeError.  With
  ``shared_next=True``, an ``out.state_seq`` that is None is a ValueError (a
  TypeError with a state_spec, as for any out field that is not a dict), as is
  any ``out.state``/``out.state_next`` other than the views of it that
  get_batch makes; without it, an ``out`` whose ``state_seq`` is set is a
  ValueError.
- The second-chance hand moves eagerly: when it passes the newest episode it
  is at the oldest at once, so an episode created after that is reached last.
- Pickling works (by value); ``serialize``/``save`` and their format belong to
  the C buffer and are not provided here.

Layout (docs/semantics.md; the paper's design):

    _episodes   dict handle -> _Episode, in handle order.  An episode keeps
                per-record lists (state arrays, actions, rewards, first-step
                priorities), its final state, its flags and ``pick_index``,
                a dict pos -> index into the pick table.
    _table      the pick table: a list of (handle, pos); removal swaps the
                last entry into the hole, so it is O(1) per pick.  Within a
                record call an evicted pick's index is kept in ``_holes``
                (its place) for the next pick the call enters; places left
                at the end of the call are removed from the highest index
                down (docs/design.md, "Places").
    _selectors  dict selector handle -> _Selector.  A prioritized selector
                holds ``leaves``, a list parallel to ``_table`` with the
                stored ``p ** alpha`` of each pick (rounded to float32).
    _ahead, _behind
                the eviction order: live handles in cyclic order starting at
                the second-chance hand (``_ahead[0]`` is under the hand);
                ``_behind`` holds those the hand has passed.  For ``fifo``
                ``_behind`` stays empty and ``_ahead[0]`` is the oldest.
"""

import collections.abc
import math
import numbers
import operator
import os
import random
import reprlib
import threading
from bisect import bisect_right
from collections import deque
from itertools import accumulate
from typing import NamedTuple, Optional

import numpy as np

from exreplay._args import index_arg, int_arg, tp_name, truth_arg, type_name, with_article
from exreplay._types import PickSelectorClass, seq_views

__all__ = [
    "Batch",
    "EpisodeData",
    "PickSelectorClass",
    "RefPickSelector",
    "ReferenceReplay",
]

# Limits the C buffer shares (docs/semantics.md).
MAX_PICK_LEN = 1 << 20
MAX_SELECTORS = 1024  # selectors a buffer holds at once (docs/design.md, Limits)
MAX_ITEM_BYTES = 1 << 40

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_INT64 = np.dtype(np.int64)
_FLOAT64 = np.dtype(np.float64)
_FLOAT32 = np.dtype(np.float32)


# --------------------------------------------------------------------------
# Public small types
# --------------------------------------------------------------------------


_MISSING = object()  # an argument not given


def _summary(value, top=True):
    """A field as the C binding's reprs show it (docs/api.md, "repr"): an
    array as its dtype and shape, ``float32(32, 4)``; a field's own dict of
    named fields item by item the same way; anything else by its repr."""
    if top and type(value) is dict:
        return "{%s}" % ", ".join(f"{k!r}: {_summary(v, False)}" for k, v in list(value.items()))
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{value.shape}"
    return repr(value)


def _fields_repr(obj, names, values):
    """``Name(a=..., b=...)`` of a Batch or an EpisodeData: each field
    summarised, empty extras and a state_seq of None left out, as the C
    binding's struct sequences show theirs. A batch met again inside its
    own fields (its extras) is ``Batch(...)``."""
    parts = []
    for name, value in zip(names, values):
        if name == "extras" and (value is None or (type(value) is dict and not value)):
            continue
        if name == "state_seq" and value is None:
            continue
        parts.append(f"{name}={_summary(value)}")
    return f"{type(obj).__name__}({', '.join(parts)})"


class EpisodeData(tuple):
    """One episode as returned by ``episode(h)``: arrays of its n steps.

    Unpacks as ``(state, action, reward, final_state, ended, terminated)``;
    ``extras`` (a dict of (n, *shape) arrays, empty without an extras_spec)
    is an attribute outside the tuple.  With a state_spec, ``state`` and
    ``final_state`` are dicts of arrays, one per field.
    """

    _fields = ("state", "action", "reward", "final_state", "ended", "terminated")

    def __new__(cls, state, action, reward, final_state, ended, terminated, extras=None):
        self = tuple.__new__(cls, (state, action, reward, final_state, ended, terminated))
        self.extras = {} if extras is None else extras
        return self

    state = property(operator.itemgetter(0))
    action = property(operator.itemgetter(1))
    reward = property(operator.itemgetter(2))
    final_state = property(operator.itemgetter(3))
    ended = property(operator.itemgetter(4))
    terminated = property(operator.itemgetter(5))

    def __getnewargs__(self):
        return (*self, self.extras)

    @reprlib.recursive_repr("EpisodeData(...)")
    def __repr__(self):
        return _fields_repr(self, self._fields + ("extras",), (*self, self.extras))


class Batch(tuple):
    """A batch of picks.

    Unpacks as the paper's 8-tuple ``(state, action, reward, state_next,
    seq_len, seq_len_next, pick_epi, pick_pos)``; those names are also
    properties, and ``weight`` (importance-sampling weights, float32) is an
    extra attribute that is not part of the tuple.  So is ``pick_index``:
    (B,) int64, where each pick was in the pick table when drawn, the hint
    ``set_priority`` takes (numbered as the C buffer numbers its table, so
    the same calls give the C batch's values; docs/api.md, "set_priority"),
    or None in a Batch built without it.  So is ``state_seq``: None, except
    in a batch of ``get_batch(..., shared_next=True)``, where it is the
    (B, pick_len + 1, *state_shape) array (a dict of them with a
    state_spec) whose views ``[:, :pick_len]`` and ``[:, 1:]`` are ``state``
    and ``state_next``.
    """

    _fields = (
        "state",
        "action",
        "reward",
        "state_next",
        "seq_len",
        "seq_len_next",
        "pick_epi",
        "pick_pos",
    )

    def __new__(
        cls,
        state,
        action,
        reward,
        state_next,
        seq_len,
        seq_len_next,
        pick_epi,
        pick_pos,
        weight,
        extras=None,
        state_seq=None,
        pick_index=None,
    ):
        self = tuple.__new__(
            cls,
            (state, action, reward, state_next, seq_len, seq_len_next, pick_epi, pick_pos),
        )
        self.weight = weight
        self.pick_index = pick_index
        self.extras = {} if extras is None else extras
        self.state_seq = state_seq
        return self

    state = property(operator.itemgetter(0), doc="(B, pick_len, *state_shape) states")
    action = property(operator.itemgetter(1), doc="(B, pick_len, *action_shape) actions")
    reward = property(operator.itemgetter(2), doc="(B, pick_len) rewards")
    state_next = property(operator.itemgetter(3), doc="(B, pick_len, *state_shape) next states")
    seq_len = property(operator.itemgetter(4), doc="(B,) int64 length of each pick")
    seq_len_next = property(
        operator.itemgetter(5), doc="(B,) int64 steps whose next state can be bootstrapped from"
    )
    pick_epi = property(operator.itemgetter(6), doc="(B,) int64 episode handle of each pick")
    pick_pos = property(operator.itemgetter(7), doc="(B,) int64 position of each pick")

    def __getnewargs__(self):
        return (*self, self.weight, self.extras, self.state_seq, self.pick_index)

    def __reduce_ex__(self, protocol):
        if self.state_seq is None:
            return super().__reduce_ex__(protocol)
        # a shared batch: state_seq once, state and state_next rebuilt as its
        # views (as exreplay._types.pickle_batch does for the C Batch)
        return _shared_batch, (*self[1:3], *self[4:], self.weight, self.extras, self.state_seq,
                               self.pick_index)

    @reprlib.recursive_repr("Batch(...)")
    def __repr__(self):
        # the C Batch's fields, in its order
        return _fields_repr(self, self._fields + ("weight", "pick_index", "extras", "state_seq"),
                            (*self, self.weight, self.pick_index, self.extras, self.state_seq))


def _shared_batch(action, reward, seq_len, seq_len_next, pick_epi, pick_pos, weight, extras,
                  state_seq, pick_index=None):
    """A Batch of get_batch(..., shared_next=True) back from pickling (one
    pickled before batches had pick_index comes back with None)."""
    state, state_next = seq_views(state_seq)
    return Batch(state, action, reward, state_next, seq_len, seq_len_next, pick_epi, pick_pos,
                 weight, extras, state_seq, pick_index)


class RefPickSelector:
    """A pick selector of a `ReferenceReplay`; behaves as its integer handle.

    ``new_pick_selector``, ``pick_selector`` and ``pick_selectors`` make them,
    a new object at every call; every object of one selector reads and sets
    the parameters the buffer keeps for it.  ``handle``, ``kind``, ``buffer``
    and ``alpha`` are read-only; ``beta`` is settable (finite, >= 0) for
    annealing.  Uniform selectors have ``alpha`` and ``beta`` of ``None``.
    Once the selector is removed from its buffer, reading a Prioritized or
    Rank selector's ``alpha`` or ``beta``, or setting its ``beta`` (to a
    valid value), is a ValueError, and the repr says ``removed``
    (docs/api.md, "PickSelector").  Two objects are equal when they are of
    the same buffer and handle, and a selector equals its handle; it hashes
    as its handle.
    """

    __slots__ = ("_handle", "_kind", "_owner")

    def __init__(self, handle, kind, owner):
        self._handle = int(handle)
        self._owner = owner  # the buffer it is a selector of; another one refuses it
        self._kind = PickSelectorClass(kind)

    @property
    def handle(self):
        return self._handle

    @property
    def kind(self):
        return self._kind

    @property
    def buffer(self):
        """The ReferenceReplay it is a selector of."""
        return self._owner

    def _sel(self):
        """The buffer's _Selector for this handle, or None once removed."""
        return self._owner._selectors.get(self._handle)

    def _param(self, name):
        if self._kind == PickSelectorClass.Uniform:
            return None
        sel = self._sel()
        if sel is None:
            raise ValueError(f"ps: pick selector {self._handle} was removed from its buffer")
        return getattr(sel, name)

    def _settable(self, name, deleting=False):
        """The C selector's AttributeError for a parameter a uniform selector
        has not, that is fixed (alpha), or that is deleted."""
        if self._kind == PickSelectorClass.Uniform:
            raise AttributeError(f"a uniform pick selector has no parameter '{name}'")
        if deleting:
            raise AttributeError(f"{name} cannot be deleted: a selector always has one")
        if name == "alpha":
            raise AttributeError(f"{name} is fixed when the selector is created")

    @property
    def alpha(self):
        return self._param("alpha")

    @alpha.setter
    def alpha(self, value):
        self._settable("alpha")

    @alpha.deleter
    def alpha(self):
        self._settable("alpha", True)

    @property
    def beta(self):
        return self._param("beta")

    @beta.deleter
    def beta(self):
        self._settable("beta", True)

    @beta.setter
    def beta(self, value):
        self._settable("beta")
        value = _finite_nonneg("beta", value)
        with self._owner._lock:
            sel = self._sel()
            if sel is None:
                raise ValueError(
                    f"ps: expected a pick selector of its buffer, got pick selector "
                    f"{self._handle}, which was removed from it"
                )
            sel.beta = value

    def __index__(self):
        return self._handle

    def __int__(self):
        return self._handle

    def __eq__(self, other):
        if isinstance(other, RefPickSelector):
            return self._owner is other._owner and self._handle == other._handle
        if isinstance(other, numbers.Integral) and not isinstance(other, bool):
            return self._handle == int(other)
        return NotImplemented

    def __hash__(self):
        return hash(self._handle)

    def __repr__(self):
        head = f"RefPickSelector(handle={self._handle}, kind=PickSelectorClass.{self._kind.name}"
        sel = self._sel()
        if sel is None:
            return f"{head}, removed)"
        if self._kind != PickSelectorClass.Uniform:
            return f"{head}, alpha={sel.alpha!r}, beta={sel.beta!r})"
        return f"{head})"


# --------------------------------------------------------------------------
# Argument checking.  Every helper raises before anything is changed, with a
# message "<argument>: expected <what>, got <what came>".
# --------------------------------------------------------------------------


def _describe(x):
    """A value as the C buffer describes one that is not what was expected
    where it names no type alone: "a list", "a float32 array of shape (3, 4),
    not C-contiguous"."""
    if not isinstance(x, np.ndarray):
        return with_article(tp_name(x))
    return (f"{with_article(str(x.dtype))} array of shape {_shape_str(x.shape)}"
            f"{'' if x.flags.c_contiguous else ', not C-contiguous'}"
            f"{'' if x.flags.aligned else ', not aligned'}"
            f"{'' if x.flags.writeable else ', read-only'}")


# Integer arguments go through exreplay._args.index_arg and int_arg, flags
# through truth_arg: the C buffer's checks, with its messages.

_EPISODE_HANDLE = "an int episode handle"


def _real_arg(name, x):
    """A real-number scalar as a Python float: a float, an int, or anything
    with __float__, but not a bool or a complex (TypeError); a sequence or an
    array of one or more dimensions is a ValueError, and so is an int too
    large for a float (Python ints are judged by value)."""
    if type(x) is float:
        return x
    if isinstance(x, np.ndarray):
        seq = x.ndim > 0
    else:
        seq = isinstance(x, collections.abc.Sequence) and not isinstance(x, (str, bytes))
    if seq:
        raise ValueError(f"{name}: expected a scalar, got {with_article(tp_name(x))}")
    t = type(x)
    numeric = any(hasattr(t, m) for m in ("__float__", "__index__", "__int__"))
    # a 0-d array holds a real number only with an integer or float dtype
    # (float() would read "1.5" from a string array, 1.0 from a bool one)
    not_real_0d = isinstance(x, np.ndarray) and x.dtype.kind not in "iuf"
    not_real = (bool, np.bool_, complex, np.complexfloating, np.timedelta64, np.datetime64)
    if isinstance(x, not_real) or not_real_0d or not numeric:
        raise TypeError(f"{name}: expected a real number, got {type_name(x)}")
    try:
        return float(x)
    except OverflowError:
        what = with_article("int" if isinstance(x, int) else tp_name(x))
        raise ValueError(
            f"{name}: expected a real number within float's range, got {what} too large for a float"
        ) from None
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {type_name(x)}") from None


def _finite_nonneg(name, x, expected="a finite number >= 0"):
    """A real number (_real_arg), finite and >= 0, as a Python float; a
    ValueError shows x as given (its repr), as the C buffer does."""
    v = _real_arg(name, x)
    if not (math.isfinite(v) and v >= 0.0):
        raise ValueError(f"{name}: expected {expected}, got {x!r}")
    return v


def _is_bool_item(v):
    """Whether v is a bool: Python's, NumPy's scalar, or an array of them."""
    return isinstance(v, (bool, np.bool_)) or (isinstance(v, np.ndarray) and v.dtype.kind == "b")


def _seq_has_bool(x):
    """Whether x is a list or tuple with a bool among its items (NumPy
    would read [2, True] as ints and [2.0, True] as floats)."""
    return isinstance(x, (list, tuple)) and any(_is_bool_item(v) for v in x)


def _refuse_bools(name, x):
    """Priorities are real numbers: a bool, an array or list of bools, or a
    list or tuple with a bool among its items, is a TypeError before anything
    else is looked at."""
    if _is_bool_item(x) or _seq_has_bool(x):
        is_bool = True
    elif isinstance(x, (list, tuple)):
        try:
            a = np.asarray(x)
        except Exception:
            return  # the conversion that follows reports what is wrong
        is_bool = a.dtype.kind == "b" and a.size > 0
    else:
        return
    if is_bool:
        raise TypeError(f"{name}: expected real numbers, got bool")


def _python_ints(name, x, dtype):
    """x, a Python int or a (nested) sequence of them that NumPy could only
    hold as object or float64, converted by value into dtype (an integer
    dtype): a value outside dtype's range is a ValueError naming the range.
    None when x holds anything but ints."""
    try:
        objs = np.asarray(x, dtype=object)
    except Exception:
        return None
    flat = objs.reshape(-1).tolist()
    # NumPy integers too: NumPy promotes a list that mixes them with Python
    # ints, or its uint64 and int64 scalars, to float64
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.timedelta64))
               for v in flat):
        return None
    flat = [int(v) for v in flat]
    info = np.iinfo(dtype)
    for v in flat:
        if not info.min <= v <= info.max:
            raise ValueError(
                f"{name}: expected values that fit {dtype}, in [{info.min}, {info.max}], got {v}"
            )
    return np.array(flat, dtype=dtype).reshape(objs.shape)


def _check_int_range(name, a, dtype):
    """Integers without a NumPy type of their own (Python ints, NumPy ints in
    a list, an __array__ or a buffer), as NumPy read them into integer array
    a, are judged by value: one outside dtype's range is a ValueError (the
    cast alone would wrap it)."""
    if a.dtype == dtype or np.can_cast(a.dtype, dtype, "safe"):
        return  # every value a holds fits dtype
    info, own = np.iinfo(dtype), np.iinfo(a.dtype)
    lo, hi = max(info.min, own.min), min(info.max, own.max)  # within a's dtype
    bad = (a < a.dtype.type(lo)) | (a > a.dtype.type(hi))
    if bad.any():
        v = int(a[bad].flat[0])
        raise ValueError(
            f"{name}: expected values that fit {dtype}, in [{info.min}, {info.max}], got {v}"
        )


def _python_reals(name, objs):
    """objs, an object array NumPy made of Python numbers, as float64 values
    (a float column takes Python ints by value): an int too large for a
    float is a ValueError.  None when objs holds anything but ints and
    floats (bools included)."""
    flat = objs.reshape(-1).tolist()
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        return None
    try:
        vals = [float(v) for v in flat]
    except OverflowError:
        raise ValueError(
            f"{name}: expected real numbers within float's range, got an int too large for a float"
        ) from None
    return np.array(vals, dtype=np.float64).reshape(objs.shape)


def _is_int(x):
    """Whether x is an int as the C buffer takes one (exreplay._args.index_arg)."""
    try:
        index_arg("", x, "")
    except TypeError:
        return False
    return True


def _shape_arg(name, x, field=False):
    """A shape (an int or a tuple or list of ints), as the C buffer reads
    one, with its errors: a field's (field=True) says "a shape", and a
    dimension out of range is shown as given."""
    if _is_int(x):
        given = [x]
    elif isinstance(x, (tuple, list)):
        given = list(x)
    else:
        want = "a shape (an int or a tuple of ints)" if field else "an int or a tuple of ints"
        raise TypeError(f"{name}: expected {want}, got {type_name(x)}")
    dims = []
    for i, d in enumerate(given):
        if not _is_int(d):
            raise TypeError(f"{name}: expected a tuple of ints, got {with_article(type_name(d))} "
                            f"at index {i}")
        dims.append(operator.index(d))
        if not 1 <= dims[-1] <= 2**40:  # an item takes at most 1 TiB
            raise ValueError(f"{name}: expected dimensions from 1 to 2**40, got {d!r} at index {i}")
    return tuple(dims)


def _item_bytes(name, dtype, shape):
    """Bytes of one item; an item over MAX_ITEM_BYTES is a ValueError."""
    n = dtype.itemsize
    for d in shape:
        n *= d
        if n > MAX_ITEM_BYTES:
            raise ValueError(f"{name}: one item would take more than 1 TiB")
    return n


def _dtype_arg(name, x, reward=False):
    """A bool, integer or floating dtype (float16, float32 or float64 for a
    reward) in native byte order; anything else is a TypeError. What
    numpy.dtype() refuses (None too) is shown by its type, a string as
    given."""
    try:
        if x is None:
            raise TypeError
        dt = np.dtype(x)
    except Exception:
        got = repr(x) if isinstance(x, str) else type_name(x)
        raise TypeError(f"{name}: expected a NumPy dtype, got {got}") from None
    if reward:
        ok, want = dt.kind == "f" and dt.itemsize in (2, 4, 8), "float16, float32 or float64"
    else:
        ok, want = dt.kind in "biuf", "a bool, integer or floating dtype"
    if not ok or dt.fields is not None or dt.subdtype is not None:
        raise TypeError(f"{name}: expected {want}, got {dt}")
    return dt.newbyteorder("=")


MAX_FIELDS = 32
MAX_FIELD_NAME = 64


def _spec_arg(name, spec):
    """A state_spec / extras_spec {field: (shape, dtype)} as {field: (shape, dtype)}
    with shapes as tuples and dtypes in native byte order, in the order given."""
    if isinstance(spec, (str, bytes)) or not isinstance(spec, collections.abc.Mapping):
        raise TypeError(f"{name}: expected a dict {{name: (shape, dtype)}}, got {tp_name(spec)}")
    if not 1 <= len(spec) <= MAX_FIELDS:
        raise ValueError(f"{name}: expected 1 to {MAX_FIELDS} fields, got {len(spec)}")
    out = {}
    total = 0
    for k, v in spec.items():
        if not isinstance(k, str):
            raise TypeError(f"{name}: expected str field names, got {k!r}")
        k = str.__str__(k)  # a str of its own (of a subclass too), as the C buffer holds it
        try:
            encoded = k.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate
            raise ValueError(f"{name}: expected field names that UTF-8 can encode, got {k!r}") from None
        if not 1 <= len(encoded) <= MAX_FIELD_NAME:
            raise ValueError(f"{name}: expected field names of 1 to {MAX_FIELD_NAME} bytes, got {k!r}")
        if k in out:  # a Mapping of its own may give one name twice
            raise ValueError(f"{name}: expected unique field names, got {k!r} twice")
        if not isinstance(v, (tuple, list)) or len(v) != 2:
            raise TypeError(f"{name}[{k!r}]: expected a pair (shape, dtype), got {v!r}")
        shape = _shape_arg(f"{name}[{k!r}]", v[0], field=True)
        dtype = _dtype_arg(f"{name}[{k!r}] dtype", v[1])
        total += _item_bytes(f"{name}[{k!r}]", dtype, shape)
        if total > MAX_ITEM_BYTES:
            raise ValueError(f"{name}: one record's fields would take more than 1 TiB")
        out[k] = (shape, dtype)
    return out


# the fields of a Batch in the C buffer's order, state_seq (shared_next) last
_BATCH_ORDER = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
                "pick_epi", "pick_pos", "weight", "pick_index", "extras", "state_seq")


def _check_out_no_extras(a):
    """out.extras of a buffer without an extras_spec: an empty dict, as
    get_batch makes it, or None (a batch of another buffer would carry its
    stale extras out of the call)."""
    expected = "expected an empty dict or None (this buffer has no extras_spec)"
    if a is None:
        return
    if not isinstance(a, dict):
        raise TypeError(f"out.extras: {expected}, got {tp_name(a)}")
    if a:
        raise ValueError(f"out.extras: {expected}, got a dict with keys {list(a)!r}")


def _check_out_array(what, a, shape, dtype):
    """An array of out= that get_batch writes: of this dtype and shape,
    C-contiguous, aligned and writeable, else the C buffer's ValueError."""
    if not (isinstance(a, np.ndarray) and a.dtype == dtype and a.shape == shape
            and a.flags.c_contiguous and a.flags.aligned and a.flags.writeable):
        raise ValueError(f"out: expected {what} to be a writeable C-contiguous {dtype} array of "
                         f"shape {_shape_str(shape)}, got {_describe(a)}")


def _refuse_shared(arrays):
    """out= arrays (name, array) that share memory would have get_batch
    write one field over another: a ValueError naming two of them (in the
    batch's field order)."""
    arrays = sorted(arrays, key=lambda t: _BATCH_ORDER.index(t[0].split("[")[0]))
    for i, (x, a) in enumerate(arrays):
        for y, b in arrays[i + 1:]:
            if np.shares_memory(a, b):
                raise ValueError(
                    f"out: expected arrays that share no memory, got out.{x} and out.{y} "
                    "sharing memory"
                )


def _names(spec):
    return ", ".join(repr(k) for k in spec)


def _fields_arg(name, x, spec, lead=None):
    """A dict argument with exactly the fields of spec: {field: new array}.
    lead: None for one item, else the leading length shared by every field
    (-1: taken from the first field).  Names are checked before values."""
    if isinstance(x, (np.ndarray, str, bytes)) or not isinstance(x, collections.abc.Mapping):
        raise TypeError(
            f"{name}: expected a dict of arrays with the fields {_names(spec)}, got {tp_name(x)}"
        )
    for k in x:
        if k not in spec:
            raise ValueError(f"{name}: expected the fields {_names(spec)}, got an unknown field {k!r}")
    for k in spec:
        if k not in x:
            raise ValueError(f"{name}: expected the fields {_names(spec)}, got no {k!r}")
    out = {}
    for k, (shape, dtype) in spec.items():
        arg = f"{name}[{k!r}]"
        try:  # a Mapping of its own need not answer twice as it did
            v = x[k]
        except KeyError:
            raise ValueError(f"{name}: expected the fields {_names(spec)}, got no {k!r}") from None
        if lead is None:
            out[k] = _array_arg(arg, v, dtype, shape)
            continue
        out[k] = _array_arg(arg, v, dtype, (lead, *shape))
        lead = out[k].shape[0]
    return out


def _zeros(spec, lead):
    return {k: np.zeros((*lead, *shape), dtype) for k, (shape, dtype) in spec.items()}


def _put(dst, idx, value):
    """dst[idx] = value, field by field when dst is a dict."""
    if isinstance(dst, dict):
        for k, a in dst.items():
            a[idx] = value[k]
    else:
        dst[idx] = value


def _row(x, t):
    return {k: a[t] for k, a in x.items()} if isinstance(x, dict) else x[t]


def _state_seq(state, state_next, seq_len):
    """A default batch's state and state_next as get_batch(shared_next=True)
    holds them: one (B, L + 1, ...) array (a dict of them for named fields)
    whose row t < seq_len is state's, row seq_len the last of state_next's,
    and the rows after it zeros."""
    if isinstance(state, dict):
        return {k: _state_seq(a, state_next[k], seq_len) for k, a in state.items()}
    B, L = state.shape[:2]
    seq = np.zeros((B, L + 1, *state.shape[2:]), state.dtype)
    seq[:, :L] = state  # zeros from seq_len on
    for b, n in enumerate(seq_len.tolist()):
        seq[b, n] = state_next[b, n - 1]
    return seq


def _copy_item(v):
    return {k: a.copy() for k, a in v.items()} if isinstance(v, dict) else v.copy()


def _shape_str(shape):
    """A shape as the C buffer's messages show it, a length of -1 (any) as
    T: "(T, 2)", "(3,)", "()"."""
    dims = ["T" if d < 0 else str(d) for d in shape]
    return "(%s%s)" % (", ".join(dims), "," if len(dims) == 1 else "")


def _array_arg(name, x, dtype, shape=None, ints_only=False):
    """x as a new C-contiguous array of dtype, checked.

    The cast must be allowed by NumPy's same_kind rule from the dtype of the
    input's own data.  NumPy arrays and scalars have a dtype; plain Python
    numbers and sequences do not (``np.asarray`` would just pick int64 or
    float64), so for them only the kind counts, as in NEP 50: a list of
    Python ints goes into any integer dtype (uint8 included), a value that
    does not fit being a ValueError, while a Python float into an integer
    dtype is a TypeError as always.  ``shape`` is the shape expected, a
    length of -1 standing for any (shown as T), or None to leave it to the
    caller; it is checked after the dtype and before the values of Python
    ints, as the C buffer checks them.  ``ints_only``: an array of bools, or
    a list or tuple with a bool among its items, is a TypeError before
    anything else is checked of it (_index_array).
    """
    if x is None:
        raise TypeError(f"{name}: expected an array-like of {dtype}, got None")
    try:
        a = np.asarray(x)
    except (ValueError, TypeError) as e:
        # a list or tuple NumPy refuses with a ValueError is ragged; anything
        # else is quoted with what its conversion raised (other exceptions
        # pass through, as in the C buffer)
        if isinstance(e, ValueError) and isinstance(x, (list, tuple)):
            raise ValueError(f"{name}: expected an array-like of {dtype}, got a ragged "
                             f"{tp_name(x)}") from e
        kind = ValueError if isinstance(e, ValueError) else TypeError
        raise kind(f"{name}: expected an array-like of {dtype}, got {tp_name(x)} (converting it "
                   f"raised {tp_name(e)}: {e})") from e
    if ints_only and (a.dtype.kind == "b" or _seq_has_bool(x)):
        raise TypeError(f"{name}: expected {dtype} (or an integer dtype that casts to it under "
                        f"same_kind), got bool")
    typed = isinstance(x, (np.ndarray, np.generic))
    if not typed and dtype.kind in "iu" and a.dtype.kind in "fO":
        # Python ints beyond int64 made NumPy pick float64 or object: they
        # are judged by value, before the shape (types come first)
        ints = _python_ints(name, x, dtype)
        if ints is not None:
            a, x = ints, ints
            typed = True
    if not typed and dtype.kind == "f" and a.dtype.kind == "O" and a.size:
        # Python ints beyond uint64 (NumPy holds them as objects) go into a
        # float column by value
        reals = _python_reals(name, a)
        if reals is not None:
            a, x = reals, reals
            typed = True
    # An empty Python sequence has no dtype at all, so it is let through.
    weak_ok = not typed and (a.size == 0 or (a.dtype.kind in "iu" and dtype.kind in "iu"))
    if not weak_ok and not np.can_cast(a.dtype, dtype, "same_kind"):
        raise TypeError(
            f"{name}: expected {dtype} (or a dtype that casts to it under same_kind), "
            f"got {a.dtype}"
        )
    if shape is not None and (a.ndim != len(shape) or any(
            w >= 0 and d != w for d, w in zip(a.shape, shape))):
        raise ValueError(f"{name}: expected shape {_shape_str(shape)}, got {_shape_str(a.shape)}")
    if typed or a.size == 0:
        return np.array(a, dtype=dtype, copy=True, order="C")
    if a.dtype.kind in "iu" and dtype.kind in "iu":
        _check_int_range(name, a, dtype)
    try:  # Python ints are range-checked here (NEP 50)
        return np.array(x, dtype=dtype, order="C")
    except OverflowError as e:
        raise ValueError(f"{name}: expected values that fit {dtype}, got {e}") from None


def _index_array(name, x, shape):
    """set_priority's pick_epi, pick_pos and pick_index (and _gather's
    picks) as int64 arrays of shape: handles, positions and table indices
    are ints, so an array of bools is a TypeError (as a bool handle is), and
    a uint64 value beyond int64, which the cast would wrap to a negative
    one, is the ValueError the same Python int gets (docs/api.md, "Input
    conversion")."""
    a = _array_arg(name, x, _INT64, shape, ints_only=True)
    if isinstance(x, np.ndarray) and x.dtype.kind == "u" and x.dtype.itemsize == 8:
        _check_int_range(name, x, _INT64)
    return a


def _recorded(p):
    """A priority given at record time is kept as float32 until its pick is
    entered (the C buffer stores it in 4 bytes), saturating at float32's max."""
    return float(np.float32(min(p, float(np.finfo(np.float32).max))))


def _check_priorities(name, values):
    """values: 1-D float64 array; all finite and >= 0, else ValueError
    naming the first that is not."""
    bad = ~(np.isfinite(values) & (values >= 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"{name}: expected finite numbers >= 0, got {float(values[i])!r} at index {i}"
        )


# The series of _pow_general (docs/semantics.md, "Stored priorities"):
# log2(m) = s * sum_k K_k z^k with K_k = 2 / (ln 2 (2k + 1)), and
# 2^f = sum_k E_k f^k with E_k = (ln 2)^k / k!, each summed by Estrin's scheme.
_LOG2_K = (
    2.8853900817779268, 0.9617966939259756, 0.5770780163555853, 0.4121985831111324,
    0.3205988979753252, 0.2623081892525388, 0.22195308321368667, 0.19235933878519512,
)
_EXP2_E = (
    1.0, 0.6931471805599453, 0.24022650695910072, 0.05550410866482158,
    0.009618129107628477, 0.0013333558146428443, 0.0001540353039338161,
    1.5252733804059841e-05, 1.321548679014431e-06, 1.01780860092397e-07,
    7.054911620801123e-09, 4.4455382718708116e-10,
)
_ROUND = 6755399441055744.0  # 1.5 * 2**52: (y + _ROUND) - _ROUND rounds y half to even


def _pow_general(p, alpha):
    """2 ** (alpha * log2 p) for p > 0, alpha > 0, step by step as the C
    buffer computes it (src/core/powa.h), in float64 operations only; both
    series by Estrin's scheme, in the same order as the C code."""
    K, E = _LOG2_K, _EXP2_E
    m, e = math.frexp(p)
    if m < 0.7071067811865476:
        m, e = m + m, e - 1
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    z2 = z * z
    z4 = z2 * z2
    pz = ((K[0] + K[1] * z) + (K[2] + K[3] * z) * z2) + ((K[4] + K[5] * z) + (K[6] + K[7] * z) * z2) * z4
    y = alpha * (float(e) + s * pz)
    y = min(max(y, -160.0), 130.0)
    n = (y + _ROUND) - _ROUND
    f = y - n
    f2 = f * f
    f4 = f2 * f2
    f8 = f4 * f4
    d0 = (E[0] + E[1] * f) + (E[2] + E[3] * f) * f2
    d1 = (E[4] + E[5] * f) + (E[6] + E[7] * f) * f2
    d2 = (E[8] + E[9] * f) + (E[10] + E[11] * f) * f2
    r = (d0 + d1 * f4) + d2 * f8
    return math.ldexp(r, int(n))


def _leaf(p, alpha):
    """The stored form of priority p for a selector with exponent alpha.

    p ** alpha rounded to float32, as docs/semantics.md ("Stored
    priorities") defines it: exact for alpha 0, 1 and 0.5 (sqrt), else
    `_pow_general` (within about 1e-14 of p ** alpha before the rounding).
    A zero priority stays zero for every alpha (0 ** 0 would be 1), so that
    priority 0 is never drawn; values beyond float32's range are clamped to
    its largest finite value.
    """
    if p == 0.0:
        return 0.0
    if alpha == 0.0:
        v = 1.0
    elif alpha == 1.0:
        v = p
    elif alpha == 0.5:
        v = math.sqrt(p)
    else:
        v = _pow_general(p, alpha)
    return float(np.float32(min(v, _FLOAT32_MAX)))


class _Episode:
    __slots__ = (
        "handle",
        "states",  # list of arrays of state_dtype, shape state_shape (dicts with a state_spec)
        "extras",  # list of dicts of arrays (None without an extras_spec)
        "actions",  # list of arrays of action_dtype, shape action_shape
        "rewards",  # list of 0-d arrays of reward_dtype
        "priorities",  # list of float or None: the priority recorded with each step
        "final_state",  # array or None
        "ended",
        "terminated",
        "pick_index",  # dict pos -> index into the pick table
        "sampled",  # second-chance mark
    )

    def __init__(self, handle):
        self.handle = handle
        self.states = []
        self.extras = []
        self.actions = []
        self.rewards = []
        self.priorities = []
        self.final_state = None
        self.ended = False
        self.terminated = False
        self.pick_index = {}
        self.sampled = False


class _RankHeap:
    """A Rank selector's ordering of the picks, kept exactly as
    src/core/sel_rank.c keeps it, since a pick's rank is its position here.

    ``heap`` holds pick-table indices in a binary max-heap on ``key`` (the
    priorities as float32), ``pos`` is its inverse, and after every
    ``max(n, 64)`` changes the heap is sorted by (priority descending, pick
    index), which makes each position the exact rank at that moment.
    """

    __slots__ = ("heap", "pos", "key", "changes")

    def __init__(self):
        self.heap, self.pos, self.key, self.changes = [], [], [], 0

    def _place(self, at, pick):
        self.heap[at] = pick
        self.pos[pick] = at

    def _sift_up(self, at):
        x, key = self.heap[at], self.key
        while at > 0:
            up = (at - 1) // 2
            if not key[x] > key[self.heap[up]]:
                break
            self._place(at, self.heap[up])
            at = up
        self._place(at, x)

    def _sift_down(self, at):
        x, key, heap, n = self.heap[at], self.key, self.heap, len(self.heap)
        while True:
            c = 2 * at + 1
            if c >= n:
                break
            if c + 1 < n and key[heap[c + 1]] > key[heap[c]]:
                c += 1
            if not key[heap[c]] > key[x]:
                break
            self._place(at, heap[c])
            at = c
        self._place(at, x)

    def _resift(self, at):
        if at > 0 and self.key[self.heap[at]] > self.key[self.heap[(at - 1) // 2]]:
            self._sift_up(at)
        else:
            self._sift_down(at)

    def _changed(self):
        self.changes += 1
        if self.changes >= max(len(self.heap), 64):
            self.heap.sort(key=lambda p: (-self.key[p], p))
            for at, p in enumerate(self.heap):
                self.pos[p] = at
            self.changes = 0

    def add(self, key):
        i = len(self.key)
        self.key.append(key)
        self.heap.append(i)
        self.pos.append(i)
        self._sift_up(i)
        self._changed()

    def remove(self, i):
        """Pick i leaves; the last pick takes index i (swap-removal)."""
        last = len(self.key) - 1
        at = self.pos[i]
        moved = self.heap.pop()
        if at < last:
            self._place(at, moved)
            self._resift(at)
        if i != last:
            self.key[i] = self.key[last]
            self._place(self.pos[last], i)
        self.key.pop()
        self.pos.pop()
        self._changed()

    def update(self, i, key):
        self.key[i] = key
        self._resift(self.pos[i])
        self._changed()


def _rank_key(p):
    """A Rank selector's stored priority: p as float32, saturated."""
    return float(np.float32(min(p, _FLOAT32_MAX)))


class _Selector:
    __slots__ = ("handle", "kind", "alpha", "beta", "rng", "leaves", "max_priority", "rank")

    def __init__(self, handle, kind, alpha, beta, rng, leaves=None, max_priority=1.0, rank=None):
        self.handle = handle
        self.kind = kind  # a PickSelectorClass
        self.alpha = alpha  # None for Uniform; fixed
        self.beta = beta  # None for Uniform; set through any RefPickSelector of it
        self.rng = rng  # random.Random
        self.leaves = leaves  # list parallel to the pick table, or None
        self.max_priority = max_priority  # priority, not p ** alpha
        self.rank = rank  # a _RankHeap for a Rank selector, else None

    @property
    def prioritized(self):
        """Keeps a priority per pick (Prioritized or Rank)."""
        return self.leaves is not None or self.rank is not None

    def enter(self, p):
        """A new pick (at the end of the table) with priority p."""
        self.max_priority = max(self.max_priority, p)
        if self.rank is not None:
            self.rank.add(_rank_key(p))
        else:
            self.leaves.append(_leaf(p, self.alpha))

    def set(self, i, p):
        self.max_priority = max(self.max_priority, p)
        if self.rank is not None:
            self.rank.update(i, _rank_key(p))
        else:
            self.leaves[i] = _leaf(p, self.alpha)

    def stored(self, i):
        return self.rank.key[i] if self.rank is not None else self.leaves[i]


# --------------------------------------------------------------------------
# The buffer
# --------------------------------------------------------------------------


def _state_args(state_shape, state_dtype, state_spec):
    """The constructor's state: named fields (state_spec) or one array."""
    if state_spec is not None:
        if state_shape is not None or state_dtype is not _MISSING:
            raise TypeError(
                "state_spec: expected either state_spec or state_shape/state_dtype, got both"
            )
        return None, state_dtype, _spec_arg("state_spec", state_spec)
    if state_shape is None:
        raise TypeError(
            "state_shape: expected an int or a tuple of ints (or a state_spec), got None"
        )
    if isinstance(state_shape, collections.abc.Mapping):
        raise TypeError(
            "state_shape: expected an int or a tuple of ints, got dict (named fields "
            "go in state_spec={name: (shape, dtype)})"
        )
    state_shape = _shape_arg("state_shape", state_shape)
    state_dtype = _dtype_arg("state_dtype", "float32" if state_dtype is _MISSING else state_dtype)
    return state_shape, state_dtype, None


class ReferenceReplay:
    """Experience replay in pure Python: the executable specification.

    Same constructor, methods, attributes, errors and test hooks as
    ``exreplay.ExperienceReplay``; the behaviour is that of
    ``docs/semantics.md``, which this class exists to pin
    down.  Every public method holds one ``threading.RLock``, so the buffer
    may be shared between threads.

    Not provided here: ``serialize``/``unserialize``/``save``/``load`` (the
    byte format belongs to the C buffer).  Pickling works (by value).
    """

    def __init__(
        self,
        state_shape=None,
        state_dtype=_MISSING,
        action_shape=(),
        action_dtype="int64",
        reward_dtype="float32",
        capacity=1_000_000,
        pick_len=1,
        allow_short=False,
        eviction="fifo",
        seed=None,
        state_spec=None,
        extras_spec=None,
    ):
        state_shape, state_dtype, state_spec = _state_args(state_shape, state_dtype, state_spec)
        if extras_spec is not None:
            extras_spec = _spec_arg("extras_spec", extras_spec)
        action_shape = _shape_arg("action_shape", action_shape)
        action_dtype = _dtype_arg("action_dtype", action_dtype)
        reward_dtype = _dtype_arg("reward_dtype", reward_dtype, reward=True)
        if state_spec is None:
            _item_bytes("state_shape", state_dtype, state_shape)
        _item_bytes("action_shape", action_dtype, action_shape)
        if capacity is not None:
            capacity = int_arg("capacity", capacity, 1, 2**63 - 1,
                               "an int in [1, 2**63 - 1] or None")
        pick_len = int_arg("pick_len", pick_len, 1, MAX_PICK_LEN, f"an int in [1, {MAX_PICK_LEN}]")
        allow_short = truth_arg("allow_short", allow_short)
        if not (isinstance(eviction, str) and eviction in ("fifo", "second_chance")):
            raise ValueError(f"eviction: expected 'fifo' or 'second_chance', got {eviction!r}")
        if seed is not None:
            seed = int_arg("seed", seed, 0, 2**64 - 1, "an int in [0, 2**64) or None")

        self._state_shape = state_shape
        self._state_dtype = state_dtype if state_spec is None else None
        self._state_spec = state_spec
        self._extras_spec = extras_spec
        self._action_shape = action_shape
        self._action_dtype = action_dtype
        self._reward_dtype = reward_dtype
        self._capacity = capacity
        self._pick_len = pick_len
        self._allow_short = allow_short
        self._eviction = eviction
        self._seed = seed
        # What the selectors' generators are seeded from.
        self._seed_value = seed if seed is not None else int.from_bytes(os.urandom(8), "little")

        self._lock = threading.RLock()
        self._episodes = {}  # handle -> _Episode, ascending handles
        self._next_handle = 0
        self._size = 0  # records held
        self._table = []  # the pick table: [(handle, pos)]
        self._holes = deque()  # places a record call keeps (_add_pick_locked)
        self._keep_holes = False
        self._selectors = {}  # selector handle -> _Selector
        self._next_selector = 0
        self._ahead = deque()  # eviction order, see the module docstring
        self._behind = deque()

    # -- configuration -----------------------------------------------------

    state_shape = property(lambda self: self._state_shape)
    state_dtype = property(lambda self: self._state_dtype)
    state_spec = property(lambda self: None if self._state_spec is None else dict(self._state_spec))
    extras_spec = property(
        lambda self: None if self._extras_spec is None else dict(self._extras_spec)
    )
    action_shape = property(lambda self: self._action_shape)
    action_dtype = property(lambda self: self._action_dtype)
    reward_dtype = property(lambda self: self._reward_dtype)
    capacity = property(lambda self: self._capacity)
    pick_len = property(lambda self: self._pick_len)
    allow_short = property(lambda self: self._allow_short)
    eviction = property(lambda self: self._eviction)
    seed = property(lambda self: self._seed)

    # -- introspection -----------------------------------------------------

    def __len__(self):
        with self._lock:
            return self._size

    @property
    def num_episodes(self):
        with self._lock:
            return len(self._episodes)

    @property
    def num_picks(self):
        with self._lock:
            return len(self._table)

    def __repr__(self):
        # the C buffer's format (docs/api.md, "repr"): named fields' specs in
        # place of the state's shape and dtype, extras_spec only when set
        if self._state_spec is not None:
            state = f"state_spec={self.state_spec!r}"
        else:
            state = f"state_shape={self._state_shape!r}, state_dtype={self._state_dtype}"
        if self._state_spec is not None or self._extras_spec is not None:
            state += f", extras_spec={self.extras_spec!r}"
        with self._lock:
            counts = (f"{self._size} records in {len(self._episodes)} episodes, "
                      f"{len(self._table)} picks")
        return (
            f"{type(self).__name__}({state}, action_shape={self._action_shape!r}, "
            f"action_dtype={self._action_dtype}, reward_dtype={self._reward_dtype}, "
            f"capacity={self._capacity!r}, pick_len={self._pick_len!r}, "
            f"allow_short={self._allow_short!r}, eviction={self._eviction!r}, "
            f"seed={self._seed!r}; {counts})"
        )

    def episode(self, h, /):
        """EpisodeData(state, action, reward, final_state, ended, terminated)."""
        with self._lock:
            h = index_arg("h", h, _EPISODE_HANDLE)
            ep = self._episodes.get(h)
            if ep is None:
                raise ValueError(
                    f"h: expected the handle of an episode held, got {h} (evicted or never created)"
                )
            n = len(ep.states)
            state = self._state_zeros((n,))
            action = np.zeros((n, *self._action_shape), self._action_dtype)
            reward = np.zeros((n,), self._reward_dtype)
            extras = {} if self._extras_spec is None else _zeros(self._extras_spec, (n,))
            for i in range(n):
                _put(state, i, ep.states[i])
                action[i] = ep.actions[i]
                reward[i] = ep.rewards[i]
                if extras:
                    _put(extras, i, ep.extras[i])
            final = None if ep.final_state is None else _copy_item(ep.final_state)
            return EpisodeData(state, action, reward, final, ep.ended, ep.terminated, extras)

    def remove_episode(self, h, /):
        """Evict episode h now, as capacity would; ValueError if it is not held."""
        with self._lock:
            h = index_arg("h", h, _EPISODE_HANDLE)
            if h not in self._episodes:
                raise ValueError(
                    f"h: expected the handle of an episode held, got {h} (evicted or never created)"
                )
            self._remove_locked(h)

    def end_episode(self, h, final_state=None, terminated=False):
        """End open episode h without a step, as its last record call would
        have had it carried final_state and terminated (docs/semantics.md,
        "Ending an episode without a step").  True if it ended h; False if
        h is a handle of this buffer whose episode is no longer held (there
        is nothing to end).  ValueError if h has ended, has no step, or no
        episode has had it."""
        with self._lock:
            h = index_arg("h", h, _EPISODE_HANDLE)
            final, terminated = self._final_args(final_state, terminated)
            if final is None and not terminated:
                raise ValueError("final_state: expected a state, or terminated=True (an episode "
                                 "ends with its last step's next state or as terminal), got None "
                                 "and terminated=False")
            ep = self._episodes.get(h)
            if ep is None:
                if 0 <= h < self._next_handle:
                    return False
                raise ValueError(f"h: expected the handle of an episode of this buffer, got {h}, "
                                 "which no episode has had")
            if ep.ended:
                raise ValueError(f"h: expected an open episode, got episode {h}, which has ended")
            if not ep.states:
                raise ValueError("h: expected an episode with a step to end (final_state is its "
                                 f"last step's next state), got episode {h}, which has none")
            # Everything is valid; from here on nothing raises.
            ep.ended = True
            ep.final_state = final
            ep.terminated = terminated
            m = self._num_picks_for(len(ep.states), True)
            for pos in range(len(ep.pick_index), m):
                self._add_pick_locked(ep, pos)
            return True

    # -- episodes and records ----------------------------------------------

    def new_episode(self):
        """Create an empty episode and return its handle."""
        with self._lock:
            return self._new_episode_locked().handle

    def record(
        self, h, state, action, reward, final_state=None, terminated=False, priority=None,
        extras=None,
    ):
        """Append one step to episode h; return the handle recorded into.

        h that is None, unknown, evicted or ended starts a new episode.
        final_state= or terminated=True ends the episode.
        """
        with self._lock:
            h = self._handle_arg(h)
            if self._state_spec is not None:
                s = _fields_arg("state", state, self._state_spec)
            else:
                s = _array_arg("state", state, self._state_dtype, self._state_shape)
            a = _array_arg("action", action, self._action_dtype, self._action_shape)
            r = _array_arg("reward", reward, self._reward_dtype, ())
            final, terminated = self._final_args(final_state, terminated)
            if priority is None:
                p = None
            else:
                p = _recorded(_finite_nonneg("priority", priority, "a finite number >= 0 or None"))
            x = self._extras_arg("extras", extras, None)
            # Everything is valid; from here on nothing raises.
            self._keep_holes = True
            try:
                return self._record_locked(h, s, a, r, p, final, terminated, x)
            finally:
                self._close_holes_locked()

    def record_many(
        self, h, states, actions, rewards, final_state=None, terminated=False, priorities=None,
        extras=None,
    ):
        """Append T >= 1 steps; exactly T calls of `record`, the last of which
        carries final_state and terminated.  Returns the last handle."""
        with self._lock:
            h = self._handle_arg(h)
            if self._state_spec is not None:
                sa = _fields_arg("states", states, self._state_spec, -1)
                T = next(iter(sa.values())).shape[0]
            else:
                sa = _array_arg("states", states, self._state_dtype, (-1, *self._state_shape))
                T = sa.shape[0]
            if T == 0:
                raise ValueError("states: expected at least one step, got 0")
            aa = _array_arg("actions", actions, self._action_dtype, (T, *self._action_shape))
            ra = _array_arg("rewards", rewards, self._reward_dtype, (T,))
            final, terminated = self._final_args(final_state, terminated)
            if priorities is None:
                prios = [None] * T
            else:
                _refuse_bools("priorities", priorities)
                pa = _array_arg("priorities", priorities, _FLOAT64, (T,))
                _check_priorities("priorities", pa)
                prios = [_recorded(float(v)) for v in pa]
            xa = self._extras_arg("extras", extras, T)
            self._keep_holes = True
            try:
                return self._record_many_locked(h, sa, aa, ra, prios, final, terminated, xa, T)
            finally:
                self._close_holes_locked()

    def _record_many_locked(self, h, sa, aa, ra, prios, final, terminated, xa, T):
        """The T steps of record_many, checked, as T record calls."""
        for t in range(T):
            last = t == T - 1
            h = self._record_locked(
                h,
                _copy_item(_row(sa, t)),
                aa[t].copy(),
                ra[t].copy(),
                prios[t],
                final if last else None,
                terminated if last else False,
                None if xa is None else _copy_item(_row(xa, t)),
            )
        return h

    # -- selectors ---------------------------------------------------------

    def new_pick_selector(self, *args, **params):
        """new_pick_selector(kind, /, **params): add a selector: Uniform,
        Prioritized (alpha=0.6, beta=0.4) or Rank (alpha=0.7, beta=0.5)."""
        with self._lock:
            # the C buffer's errors: kind alone is positional; the type of a
            # kind that is no int, the value of one out of range; then each
            # parameter in the order given, its name before its value
            if len(args) != 1:
                raise TypeError("new_pick_selector() takes exactly one positional argument, the "
                                f"PickSelectorClass ({len(args)} given)")
            kind = PickSelectorClass(
                int_arg("kind", args[0], 0, len(PickSelectorClass) - 1,
                        f"a PickSelectorClass (0 to {len(PickSelectorClass) - 1})")
            )
            handle = self._next_selector
            names = () if kind == PickSelectorClass.Uniform else ("alpha", "beta")
            values = dict(zip(names, (0.7, 0.5) if kind == PickSelectorClass.Rank else (0.6, 0.4)))
            for name, value in params.items():
                if name not in names:
                    raise TypeError(f"new_pick_selector(): {with_article(kind.name.lower())} "
                                    f"selector takes no parameter {name!r}")
                values[name] = _finite_nonneg(name, value)
            if kind == PickSelectorClass.Uniform:
                sel = _Selector(handle, kind, None, None, self._make_rng(handle))
            else:
                alpha, beta = values["alpha"], values["beta"]
                rng = self._make_rng(handle)
                if kind == PickSelectorClass.Rank:
                    sel = _Selector(handle, kind, alpha, beta, rng, None, 1.0, _RankHeap())
                else:
                    sel = _Selector(handle, kind, alpha, beta, rng, [], 1.0)
                # Existing picks start at the new selector's maximum so far,
                # 1.0: a recorded priority is not kept once its pick exists
                # (the C buffer spends no memory on it).
                for _ in self._table:
                    sel.enter(1.0)
            if len(self._selectors) >= MAX_SELECTORS:
                raise ValueError(
                    f"new_pick_selector: expected a buffer holding fewer than {MAX_SELECTORS} "
                    f"selectors (remove_pick_selector makes room), got one holding that many"
                )
            self._selectors[handle] = sel
            self._next_selector += 1
            return RefPickSelector(handle, kind, self)

    def remove_pick_selector(self, ps):
        with self._lock:
            sel = self._selector_arg(ps)
            del self._selectors[sel.handle]

    def pick_selector(self, ps):
        """A new RefPickSelector for selector ps (an int handle, or a
        selector object of this buffer): for the selectors of a restored
        buffer, which come back without their objects."""
        with self._lock:
            sel = self._selector_arg(ps)
            return RefPickSelector(sel.handle, sel.kind, self)

    def pick_selectors(self):
        """A new RefPickSelector for every selector held, by ascending handle."""
        with self._lock:
            return [RefPickSelector(h, self._selectors[h].kind, self) for h in sorted(self._selectors)]

    def set_priority(self, ps, pick_epi, pick_pos=_MISSING, priorities=_MISSING, pick_index=None):
        """Set the priority of picks; returns how many were applied.

        Picks that no longer exist are skipped.  The last value wins for a
        pick given twice.  A uniform selector accepts and ignores the call.
        ``set_priority(ps, batch, priorities)`` names the picks of a Batch,
        and takes its ``pick_index`` as ``pick_index=``.  ``pick_index``
        (a batch's: where the picks were in the table when drawn) is checked
        as the C buffer checks it (int64-castable, pick_epi's shape), then
        used as hints: an index whose table entry still is that pick is
        taken, any other one (stale, out of range, of another buffer) falls
        back to the lookup by handle, so the result is that of the call
        without it (docs/api.md, "set_priority").
        """
        names = ("pick_epi", "pick_pos", "pick_index")
        if isinstance(pick_epi, Batch):
            if pick_index is not None:
                raise TypeError("set_priority() got an unexpected keyword argument 'pick_index'")
            if pick_pos is not _MISSING and priorities is not _MISSING:
                raise TypeError("set_priority() takes at most 3 positional arguments (4 given)")
            if pick_pos is not _MISSING:
                priorities = pick_pos
            if priorities is _MISSING:
                raise TypeError("set_priority() missing required argument 'priorities'")
            batch = pick_epi
            pick_epi, pick_pos, pick_index = batch.pick_epi, batch.pick_pos, batch.pick_index
            names = tuple("batch." + n for n in names)  # as the C buffer names them
        elif pick_pos is _MISSING or priorities is _MISSING:
            missing = "pick_pos" if pick_pos is _MISSING else "priorities"
            raise TypeError(f"set_priority() missing required argument '{missing}'")
        with self._lock:
            sel = self._selector_arg(ps)
            epi, pos = self._pick_arrays(pick_epi, pick_pos, *names[:2])
            hints = None
            if pick_index is not None:
                hints = _index_array(names[2], pick_index, epi.shape).tolist()
            _refuse_bools("priorities", priorities)
            # one priority for every pick (a Python or NumPy scalar, a 0-d
            # array), checked even with no pick to apply it to; else one each
            scalar = (np.ndim(priorities) == 0 if isinstance(priorities, np.ndarray)
                      else isinstance(priorities, (float, int, np.generic)))
            pa = _array_arg("priorities", priorities, _FLOAT64, () if scalar else epi.shape)
            _check_priorities("priorities", pa.reshape(-1))
            pa = np.broadcast_to(pa, epi.shape)
            if not sel.prioritized:
                return 0
            applied = 0
            for k, (e, p, v) in enumerate(zip(epi.tolist(), pos.tolist(), pa.tolist())):
                i = self._hinted_index(e, p, None if hints is None else hints[k])
                if i is None:
                    continue
                sel.set(i, v)
                applied += 1
            return applied

    # -- sampling ----------------------------------------------------------

    def _check_batch_fits(self, B, shared_next):
        """The C buffer's MemoryErrors for a batch too large, before anything
        is drawn (a Python loop of 2**40 draws ran on, growing, where the C
        buffer refused at once): batch_size past what its widest array can
        address, or a batch whose bytes cannot be allocated."""
        def spec_bytes(spec):
            return sum(_item_bytes("", dt, shape) for shape, dt in spec.values())

        L = self._pick_len
        sb = (spec_bytes(self._state_spec) if self._state_spec is not None
              else _item_bytes("", self._state_dtype, self._state_shape))
        ab = _item_bytes("", self._action_dtype, self._action_shape)
        if B * (L + 1) * max(sb, ab, 8) > 2**63 - 1:
            raise MemoryError(f"batch_size: a batch of {B} picks would not fit in memory")
        xb = spec_bytes(self._extras_spec) if self._extras_spec is not None else 0
        rows = L + 1 if shared_next else 2 * L
        nbytes = B * (rows * sb + L * (ab + self._reward_dtype.itemsize + xb) + 5 * 8 + 4)
        try:
            np.empty(nbytes, np.uint8)  # the pages are not touched
        except (MemoryError, ValueError):
            raise MemoryError(f"get_batch: out of memory (a batch of {nbytes} bytes)") from None

    def get_batch(self, batch_size, ps, out=None, *, shared_next=False):
        """Draw batch_size picks (with replacement) with selector ps.

        Returns a `Batch`; with out= a Batch of the right shapes, refills its
        arrays in place and returns it.  With shared_next=True, the batch's
        state_seq holds each pick's states and the state after its last step,
        (B, pick_len + 1, *state_shape), and state and state_next are its
        views [:, :pick_len] and [:, 1:] (an out= Batch must be one such).
        The picks drawn do not depend on shared_next.
        """
        with self._lock:
            B = int_arg("batch_size", batch_size, 1, 2**63 - 1, "an int in [1, 2**63 - 1]")
            sel = self._selector_arg(ps)
            shared_next = truth_arg("shared_next", shared_next)
            if out is not None:
                self._check_out(out, B, shared_next)
            else:
                self._check_batch_fits(B, shared_next)
            if not self._table:
                raise ValueError(f"get_batch: no pick can be drawn: {self._empty_reason()}")
            if sel.rank is not None:
                # rank r (1 = highest priority) with probability r^-alpha /
                # sum_k k^-alpha; the pick at heap position r - 1
                N = len(self._table)
                cum = list(accumulate(float(r) ** -sel.alpha for r in range(1, N + 1)))
                indices = []
                for _ in range(B):
                    r = min(bisect_right(cum, sel.rng.random() * cum[-1]), N - 1)
                    indices.append(sel.rank.heap[r])
            elif sel.prioritized:
                # The prefix sums of the leaves, built by one linear scan; a
                # draw u in [0, total) lands on the first leaf whose prefix
                # sum exceeds u, which is never a zero leaf.
                cum = list(accumulate(sel.leaves))
                total = cum[-1]
                if total <= 0.0:
                    raise ValueError(
                        f"get_batch: no pick can be drawn: every priority of selector "
                        f"{sel.handle} is zero ({len(cum)} picks held)"
                    )
                last_positive = max(i for i, v in enumerate(sel.leaves) if v > 0.0)
                indices = []
                for _ in range(B):
                    i = bisect_right(cum, sel.rng.random() * total)
                    indices.append(min(i, last_positive))
            else:
                N = len(self._table)
                indices = [sel.rng.randrange(N) for _ in range(B)]
            if shared_next:
                return self._shared_batch(self._build_batch_locked(sel, indices, None), out)
            return self._build_batch_locked(sel, indices, out)

    # -- eviction state & pickling ----------------------------------------

    def __getstate__(self):
        with self._lock:
            state = self.__dict__.copy()
            del state["_lock"]
            return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._lock = threading.RLock()

    # -- test hooks (private) ----------------------------------------------

    def _handles(self):
        """The live episode handles, ascending."""
        with self._lock:
            return list(self._episodes)

    def _picks(self):
        """(pick_epi, pick_pos): int64 arrays of every pick held, table order."""
        with self._lock:
            epi = np.array([e for e, _ in self._table], dtype=np.int64)
            pos = np.array([p for _, p in self._table], dtype=np.int64)
            return epi, pos

    def _gather(self, ps, pick_epi, pick_pos):
        """The Batch get_batch would return had it drawn exactly these picks."""
        with self._lock:
            sel = self._selector_arg(ps)
            indices = self._existing_indices(*self._pick_arrays(pick_epi, pick_pos))
            return self._build_batch_locked(sel, indices, None)

    def _priority(self, ps, pick_epi, pick_pos):
        """float64 array of the stored p ** alpha of each pick."""
        with self._lock:
            sel = self._selector_arg(ps)
            if not sel.prioritized:
                raise ValueError("ps: expected a prioritized or rank pick selector, got a uniform "
                                 f"one (handle {sel.handle})")
            indices = self._existing_indices(*self._pick_arrays(pick_epi, pick_pos), named=True)
            return np.array([sel.stored(i) for i in indices], dtype=np.float64)

    def _check_episode(self, h, ep):
        """_check's invariants of one episode; returns its number of picks."""
        n = len(ep.states)
        assert ep.handle == h, f"episode {h}: stored under the wrong handle"
        assert len(ep.actions) == len(ep.rewards) == len(ep.priorities) == n, (
            f"episode {h}: record lists of different lengths"
        )
        assert ep.ended == (ep.final_state is not None or ep.terminated), (
            f"episode {h}: ended flag does not match final_state/terminated"
        )
        assert not (ep.ended and n == 0), f"episode {h}: ended with no records"
        assert len(ep.extras) == n, f"episode {h}: extras list of another length"
        for s in ep.states:
            assert self._item_ok(s, self._state_spec, self._state_shape, self._state_dtype), (
                f"episode {h}: a state of the wrong shape or dtype"
            )
        for x in ep.extras:
            assert (x is None) == (self._extras_spec is None) and (
                x is None or self._item_ok(x, self._extras_spec, None, None)
            ), f"episode {h}: extras of the wrong fields, shape or dtype"
        for a in ep.actions:
            assert a.shape == self._action_shape and a.dtype == self._action_dtype, (
                f"episode {h}: an action of the wrong shape or dtype"
            )
        m = self._num_picks_for(n, ep.ended)
        assert sorted(ep.pick_index) == list(range(m)), (
            f"episode {h}: picks {sorted(ep.pick_index)} but expected positions 0..{m - 1}"
        )
        for pos, i in ep.pick_index.items():
            assert 0 <= i < len(self._table) and self._table[i] == (h, pos), (
                f"pick table: ({h}, {pos}) not at index {i}"
            )
        return m

    def _check(self):
        """Check every internal invariant; AssertionError names the first broken."""
        with self._lock:
            eps = self._episodes
            handles = list(eps)
            assert handles == sorted(handles), "episodes: handles not ascending"
            assert all(0 <= h < self._next_handle for h in handles), (
                "episodes: a handle not below the next handle"
            )
            size = 0
            npicks = 0
            for h, ep in eps.items():
                m = self._check_episode(h, ep)
                size += len(ep.states)
                npicks += m
            assert size == self._size, f"record count: held {size}, counted {self._size}"
            assert npicks == len(self._table), (
                f"pick table: {len(self._table)} entries, episodes have {npicks} picks"
            )
            assert len(set(self._table)) == len(self._table), "pick table: duplicate entries"
            if self._capacity is not None:
                assert self._size <= self._capacity, "capacity: more records held than capacity"
            order = list(self._behind) + list(self._ahead)
            assert sorted(order) == handles, "eviction order: not the live episodes"
            assert list(self._ahead) == sorted(self._ahead), "eviction order: ahead not ascending"
            assert list(self._behind) == sorted(self._behind), (
                "eviction order: behind not ascending"
            )
            assert not (self._behind and not self._ahead), "eviction order: hand not wrapped"
            if self._behind:
                assert self._behind[-1] < self._ahead[0], "eviction order: behind overlaps ahead"
            if self._eviction == "fifo":
                assert not self._behind, "eviction order: fifo with passed episodes"
            assert all(0 <= k < self._next_selector for k in self._selectors), (
                "selectors: a handle not below the next handle"
            )
            for k, sel in self._selectors.items():
                assert sel.handle == k, f"selector {k}: wrong handle"
                if sel.rank is not None:
                    self._check_rank(k, sel.rank)
                elif sel.prioritized:
                    assert len(sel.leaves) == len(self._table), (
                        f"selector {k}: {len(sel.leaves)} priorities for {len(self._table)} picks"
                    )
                    for v in sel.leaves:
                        assert 0.0 <= v <= _FLOAT32_MAX and float(np.float32(v)) == v, (
                            f"selector {k}: priority {v!r} not a finite float32 >= 0"
                        )
                if sel.prioritized:
                    assert math.isfinite(sel.max_priority) and sel.max_priority >= 1.0, (
                        f"selector {k}: maximum so far {sel.max_priority!r} below 1.0"
                    )

    def _check_rank(self, k, rk):
        n = len(self._table)
        assert len(rk.heap) == len(rk.pos) == len(rk.key) == n, f"selector {k}: {n} picks"
        assert 0 <= rk.changes < max(n, 64), f"selector {k}: {rk.changes} changes unsorted"
        for at, p in enumerate(rk.heap):
            assert rk.pos[p] == at, f"selector {k}: heap position {at} and pick {p} disagree"
            v = rk.key[p]
            assert 0.0 <= v <= _FLOAT32_MAX and float(np.float32(v)) == v, (
                f"selector {k}: priority {v!r} not a finite float32 >= 0"
            )
            assert at == 0 or rk.key[rk.heap[(at - 1) // 2]] >= v, (
                f"selector {k}: heap order broken at position {at}"
            )

    # -- internals (the lock is held) --------------------------------------

    def _empty_reason(self):
        """Why a buffer without picks has none, as the C buffer says it."""
        n, e, L = self._size, len(self._episodes), self._pick_len
        if n == 0:
            return f"the buffer is empty ({e} episodes, 0 records)"
        if n == e and n > 1:
            return (f"each of the {n} records is in an episode of its own, so no episode has the "
                    f"pick_len={L} complete steps a pick needs. record() returns the handle to "
                    "continue the episode with: pass it back (h = buf.record(h, ...))")
        return (f"the {n} records are in {e} episodes, all shorter than a pick (pick_len={L} "
                "complete steps; an open episode's last step is complete only once the next "
                "record or the episode's end arrives)"
                + ("" if self._allow_short else
                   "; allow_short=True also makes shorter picks at the end of ended episodes"))

    def _make_rng(self, selector_handle):
        # One generator per selector, from (buffer seed, selector handle).
        return random.Random((self._seed_value << 64) | selector_handle)

    def _handle_arg(self, h):
        if h is None:
            return None
        return index_arg("h", h, _EPISODE_HANDLE + " or None")

    def _final_args(self, final_state, terminated):
        terminated = truth_arg("terminated", terminated)
        if final_state is None:
            return None, terminated
        if self._state_spec is not None:
            return _fields_arg("final_state", final_state, self._state_spec), terminated
        fa = _array_arg("final_state", final_state, self._state_dtype, self._state_shape)
        return fa, terminated

    def _extras_arg(self, name, extras, lead):
        """extras= of record (lead None) or record_many (lead T): None when
        the buffer has no extras_spec."""
        if self._extras_spec is None:
            if extras is not None:
                raise ValueError(
                    f"{name}: expected None (this buffer has no extras_spec), got "
                    f"{_describe(extras)}"
                )
            return None
        if extras is None:
            raise ValueError(
                f"{name}: expected a dict of arrays with the fields {_names(self._extras_spec)}, "
                "got None"
            )
        return _fields_arg(name, extras, self._extras_spec, lead)

    @staticmethod
    def _item_ok(x, spec, shape, dtype):
        if spec is None:
            return x.shape == shape and x.dtype == dtype
        return list(x) == list(spec) and all(
            x[k].shape == sh and x[k].dtype == dt for k, (sh, dt) in spec.items()
        )

    def _state_zeros(self, lead):
        if self._state_spec is not None:
            return _zeros(self._state_spec, lead)
        return np.zeros((*lead, *self._state_shape), self._state_dtype)

    def _selector_arg(self, ps):
        if isinstance(ps, RefPickSelector) and ps._owner is not self:
            raise ValueError("ps: expected a pick selector of this buffer, got one of another buffer")
        k = index_arg("ps", ps, "a PickSelector or an int handle")
        sel = self._selectors.get(k)
        if sel is None:  # as the C buffer says it (docs/api.md, "Errors")
            raise ValueError(f"ps: expected a pick selector of this buffer, got unknown handle {k}")
        return sel

    def _pick_arrays(self, pick_epi, pick_pos, epi_name="pick_epi", pos_name="pick_pos"):
        epi = _index_array(epi_name, pick_epi, (-1,))
        pos = _index_array(pos_name, pick_pos, epi.shape)
        return epi, pos

    def _pick_index(self, e, p):
        """Index of pick (e, p) in the table, or None if it does not exist."""
        ep = self._episodes.get(e)
        if ep is None:
            return None
        return ep.pick_index.get(p)

    def _hinted_index(self, e, p, hint):
        """_pick_index(e, p), taking the table index `hint` (a batch's
        pick_index, any int or None) where the entry there still is that
        pick, as the C buffer does; otherwise the lookup by handle."""
        if hint is not None and 0 <= hint < len(self._table) and self._table[hint] == (e, p):
            return hint
        return self._pick_index(e, p)

    def _existing_indices(self, epi, pos, named=False):
        """The table indices of the picks; a missing one is a ValueError
        (naming it and its index if `named`, as stored_priorities does)."""
        indices = []
        for k, (e, p) in enumerate(zip(epi.tolist(), pos.tolist())):
            i = self._pick_index(e, p)
            if i is None:
                got = f"({e}, {p}) at index {k}, which does not" if named else "one that does not"
                raise ValueError(f"pick_epi, pick_pos: expected picks that exist, got {got}")
            indices.append(i)
        return indices

    def _num_picks_for(self, n, ended):
        """docs/semantics.md: the picks of an episode are positions 0 .. m-1."""
        c = n if ended else max(n - 1, 0)
        if ended and self._allow_short:
            return c
        return max(c - self._pick_len + 1, 0)

    def _new_episode_locked(self):
        ep = _Episode(self._next_handle)
        self._next_handle += 1
        self._episodes[ep.handle] = ep
        self._ahead.append(ep.handle)
        return ep

    def _record_locked(self, h, state, action, reward, priority, final, terminated, extras=None):
        """Append one validated step; never raises."""
        ep = None if h is None else self._episodes.get(h)
        if ep is None or ep.ended:
            ep = self._new_episode_locked()
        ep.states.append(state)
        ep.extras.append(extras)
        ep.actions.append(action)
        ep.rewards.append(reward)
        ep.priorities.append(priority)
        self._size += 1
        if final is not None or terminated:
            ep.ended = True
            ep.final_state = final
            ep.terminated = terminated
        m = self._num_picks_for(len(ep.states), ep.ended)
        for pos in range(len(ep.pick_index), m):
            self._add_pick_locked(ep, pos)
        if self._capacity is not None:
            while self._size > self._capacity:
                self._evict_one_locked()
        return ep.handle

    def _add_pick_locked(self, ep, pos):
        """A new pick: into the oldest place the record call keeps, else at
        the end of the table."""
        recorded = ep.priorities[pos]
        if self._holes:
            i = self._holes.popleft()
            ep.pick_index[pos] = i
            self._table[i] = (ep.handle, pos)
            for sel in self._selectors.values():
                if sel.prioritized:
                    sel.set(i, sel.max_priority if recorded is None else recorded)
            return
        ep.pick_index[pos] = len(self._table)
        self._table.append((ep.handle, pos))
        for sel in self._selectors.values():
            if sel.prioritized:
                sel.enter(sel.max_priority if recorded is None else recorded)

    def _close_holes_locked(self):
        """The end of a record call: the places no new pick took leave,
        from the highest index down, each by swap-removal."""
        self._keep_holes = False
        for i in sorted(self._holes, reverse=True):
            self._remove_pick_locked(i)
        self._holes.clear()

    def _remove_pick_locked(self, i):
        """Swap-remove entry i of the pick table (and of every selector)."""
        for sel in self._selectors.values():
            if sel.rank is not None:
                sel.rank.remove(i)
        last = self._table.pop()
        leaves = [sel.leaves.pop() if sel.leaves is not None else None
                  for sel in self._selectors.values()]
        if i < len(self._table):
            self._table[i] = last
            self._episodes[last[0]].pick_index[last[1]] = i
            for sel, leaf in zip(self._selectors.values(), leaves):
                if sel.leaves is not None:
                    sel.leaves[i] = leaf

    def _evict_one_locked(self):
        if self._eviction == "second_chance":
            while self._episodes[self._ahead[0]].sampled:
                self._episodes[self._ahead[0]].sampled = False
                self._behind.append(self._ahead.popleft())
                self._wrap_locked()
        self._remove_locked(self._ahead[0])

    def _remove_locked(self, h):
        # h leaves the eviction order; under the hand, the hand moves on to
        # the next episode (wrapping after the newest)
        if self._ahead and self._ahead[0] == h:
            self._ahead.popleft()
        elif h in self._ahead:
            self._ahead.remove(h)
        else:
            self._behind.remove(h)
        self._wrap_locked()
        ep = self._episodes[h]
        if self._keep_holes:
            # evicted by a record call: its picks' places are kept, in
            # position order, for the picks the call enters after
            self._holes.extend(ep.pick_index[pos] for pos in range(len(ep.pick_index)))
        else:
            for pos in range(len(ep.pick_index)):
                self._remove_pick_locked(ep.pick_index[pos])
        ep.pick_index.clear()
        self._size -= len(ep.states)
        del self._episodes[h]

    def _wrap_locked(self):
        # The hand passed the newest episode: it goes back to the oldest.
        if not self._ahead:
            self._ahead, self._behind = self._behind, deque()

    def _check_out(self, out, B, shared_next=False):
        """out= checked as the C buffer checks it, field by field in the
        batch's order, with its errors. Without an extras_spec out.extras
        must be empty ({} as get_batch makes it, or None), and is not
        written."""
        if not isinstance(out, Batch):
            raise TypeError(f"out: expected a Batch from get_batch, got {tp_name(out)}")
        if not shared_next and getattr(out, "state_seq", None) is not None:
            raise ValueError(
                "out: expected a batch of get_batch(..., shared_next=False), got one with "
                "state_seq set (shared_next=True): pass shared_next=True to refill it"
            )
        L = self._pick_len
        state = ((B, L, *(self._state_shape or ())), self._state_dtype, self._state_spec)
        fields = {
            "state": state,
            "action": ((B, L, *self._action_shape), self._action_dtype, None),
            "reward": ((B, L), self._reward_dtype, None),
            "state_next": state,
            "seq_len": ((B,), _INT64, None),
            "seq_len_next": ((B,), _INT64, None),
            "pick_epi": ((B,), _INT64, None),
            "pick_pos": ((B,), _INT64, None),
            "weight": ((B,), _FLOAT32, None),
            "pick_index": ((B,), _INT64, None),
            "extras": ((B, L), None, self._extras_spec),
            "state_seq": ((B, L + 1, *(self._state_shape or ())), self._state_dtype,
                          self._state_spec),
        }
        # with shared_next, state and state_next are written through state_seq
        # (checked as its views below); else state_seq is not looked at
        skip = ("state", "state_next") if shared_next else ("state_seq",)
        arrays = []
        for name, (shape, dtype, spec) in fields.items():
            if name in skip:
                continue
            a = getattr(out, name, None)
            if name == "extras" and not spec:
                _check_out_no_extras(a)
                continue
            if spec is None:
                _check_out_array(f"out.{name}", a, shape, dtype)
                arrays.append((name, a))
                continue
            if not isinstance(a, dict):
                raise TypeError(f"out: expected out.{name} to be a dict with the fields "
                                f"{_names(spec)}, got {tp_name(a)}")
            if len(a) != len(spec):
                raise ValueError(f"out: expected out.{name} to hold the fields {_names(spec)}, "
                                 f"got {len(a)} entries")
            for k, (fshape, fdtype) in spec.items():
                if k not in a:
                    raise ValueError(f"out: expected out.{name} to hold the fields "
                                     f"{_names(spec)}, got no {k!r}")
                _check_out_array(f"out.{name}[{k!r}]", a[k], (*shape[:2], *fshape), fdtype)
                arrays.append((f"{name}[{k!r}]", a[k]))
        if shared_next:
            self._check_out_views(out, L)
        _refuse_shared(arrays)

    def _check_out_views(self, out, L):
        """out.state and out.state_next must be exactly the views of (checked)
        out.state_seq that get_batch(shared_next=True) makes."""
        spec = self._state_spec
        for name, cut, shown in (("state", np.s_[:, :L], ":, :-1"),
                                 ("state_next", np.s_[:, 1:], ":, 1:")):
            views = getattr(out, name, None)
            if spec is None:
                pairs = [(f"out.{name}", "", views, out.state_seq)]
            elif isinstance(views, dict) and len(views) == len(spec):
                pairs = [(f"out.{name}[{k!r}]", f"[{k!r}]", views.get(k), a)
                         for k, a in out.state_seq.items()]
            else:
                raise ValueError(
                    f"out: expected out.{name} to be the view of out.state_seq[{shown}] that "
                    f"get_batch(..., shared_next=True) makes, got {_describe(views)}"
                )
            for what, key, a, seq in pairs:
                v = seq[cut]
                if not (isinstance(a, np.ndarray) and a.dtype == v.dtype and a.shape == v.shape
                        and a.strides == v.strides and a.ctypes.data == v.ctypes.data):
                    raise ValueError(
                        f"out: expected {what} to be the view of out.state_seq{key}[{shown}] "
                        f"that get_batch(..., shared_next=True) makes, got {_describe(a)}"
                    )

    def _build_batch_locked(self, sel, indices, out):
        """Fill a Batch with the picks at these pick-table indices."""
        B = len(indices)
        L = self._pick_len
        if out is None:
            batch = Batch(
                state=self._state_zeros((B, L)),
                action=np.zeros((B, L, *self._action_shape), self._action_dtype),
                reward=np.zeros((B, L), self._reward_dtype),
                state_next=self._state_zeros((B, L)),
                seq_len=np.zeros((B,), np.int64),
                seq_len_next=np.zeros((B,), np.int64),
                pick_epi=np.zeros((B,), np.int64),
                pick_pos=np.zeros((B,), np.int64),
                weight=np.zeros((B,), np.float32),
                extras=_zeros(self._extras_spec or {}, (B, L)),
                pick_index=np.zeros((B,), np.int64),
            )
        else:
            batch = out
            # out.extras is not written without an extras_spec (nor checked)
            held = (batch.extras,) if self._extras_spec else ()
            for a in (*batch, batch.weight, batch.pick_index, *held):
                for x in (a.values() if isinstance(a, dict) else (a,)):
                    x[...] = 0
        state, action, reward, state_next, seq_len, seq_len_next, pick_epi, pick_pos = batch
        extras = batch.extras if self._extras_spec else None

        for b, i in enumerate(indices):
            h, p = self._table[i]
            ep = self._episodes[h]
            n = len(ep.states)
            c = n if ep.ended else n - 1
            length = min(L, c - p)
            for t in range(length):
                _put(state, (b, t), ep.states[p + t])
                action[b, t] = ep.actions[p + t]
                reward[b, t] = ep.rewards[p + t]
                if extras:
                    _put(extras, (b, t), ep.extras[p + t])
                if p + t + 1 < n:
                    _put(state_next, (b, t), ep.states[p + t + 1])
                elif ep.final_state is not None:
                    _put(state_next, (b, t), ep.final_state)
                # else: a terminal step without a final state; stays zero
            seq_len[b] = length
            ends_terminal = p + length == n and ep.terminated
            seq_len_next[b] = length - 1 if ends_terminal else length
            pick_epi[b] = h
            pick_pos[b] = p
            batch.pick_index[b] = i  # the table index: set_priority's hint
            ep.sampled = True

        weight = batch.weight
        if sel.rank is not None:
            # w = (N P(r))^-beta / max_j w_j = (r / N) ** (alpha beta), r = rank
            N = len(self._table)
            ab = sel.alpha * sel.beta
            for b, i in enumerate(indices):
                weight[b] = ((sel.rank.pos[i] + 1) / N) ** ab
        elif sel.prioritized:
            # PER: w_i = (N P(i))^-beta / max_j w_j over p_j > 0
            #          = (min positive leaf / leaf_i) ** beta
            beta = sel.beta
            positive = [v for v in sel.leaves if v > 0.0]
            min_leaf = min(positive) if positive else 0.0
            for b, i in enumerate(indices):
                leaf = sel.leaves[i]
                if leaf > 0.0:
                    weight[b] = (min_leaf / leaf) ** beta
                else:  # only reachable through _gather: (N * 0) ** -beta
                    weight[b] = math.inf if beta > 0.0 else 1.0
        else:
            weight[...] = 1.0
        return batch

    def _shared_batch(self, batch, out):
        """The batch of get_batch(shared_next=True) that drew the picks of
        default batch `batch`: new arrays, or those of out (checked) refilled."""
        L = self._pick_len
        seq = _state_seq(batch.state, batch.state_next, batch.seq_len)
        if out is None:
            return Batch(
                _row(seq, np.s_[:, :L]), batch.action, batch.reward, _row(seq, np.s_[:, 1:]),
                *batch[4:], weight=batch.weight, extras=batch.extras, state_seq=seq,
                pick_index=batch.pick_index,
            )
        _put(out.state_seq, ..., seq)  # and so out.state and out.state_next
        held = ("extras",) if self._extras_spec else ()
        for name in Batch._fields[4:] + ("action", "reward", "weight", "pick_index", *held):
            _put(getattr(out, name), ..., getattr(batch, name))
        return out
