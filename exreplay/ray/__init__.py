"""exreplay on Ray: a replay actor, a sharded replay, and the rollout format.

Importing this module needs only NumPy; Ray is imported when a Ray object is
first used (``ReplayActor``, ``ShardedReplay``), and its absence is then an
``ImportError`` that says what to install (``pip install ray gymnasium``, or
``pip install -e '.[ray]'`` in a checkout).

    import ray
    from exreplay.ray import ReplayActor, ShardedReplay

    replay = ReplayActor.remote(state_shape=(4,), capacity=100_000, pick_len=3,
                                allow_short=True, selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})])
    ray.get(replay.record_many.remote(None, states, actions, rewards, terminated=True, priorities=p))
    b = ray.get(replay.get_batch.remote(64, 0))                # an exreplay.Batch
    replay.set_priority.remote(0, b.pick_epi, b.pick_pos, td + 1e-3, b.pick_index)

    shards = ShardedReplay(4, state_shape=(4,), capacity=400_000, ...)   # the same calls, over 4 actors

docs/ray.md explains the design: threads and concurrency groups inside the
actor, what crosses Ray by copy and what does not, how the sharded replay
draws so that its batches follow a single buffer's distribution, and the
Ape-X example (``python -m exreplay.examples.apex_cartpole``).
"""

from __future__ import annotations

import reprlib
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Hashable, Sequence

import numpy as np

import exreplay
from exreplay import PickSelectorClass
from exreplay._args import index_arg, int_arg, path_arg, truth_arg, type_name
from exreplay._types import seq_views

__all__ = [
    "ReplayActor",
    "ReplayServer",
    "replay_actor_class",
    "ShardedReplay",
    "Rollout",
    "split_batch",
    "concat_batches",
    "gather_logs",
]

_KINDS = {
    "uniform": PickSelectorClass.Uniform,
    "prioritized": PickSelectorClass.Prioritized,
    "rank": PickSelectorClass.Rank,
}

# Concurrency groups of the ReplayActor: writers (record_*), the learner
# (get_batch, set_priority, priority_stats) and everything else (stats, save,
# ...), each with its own threads, so that a slow writer never holds up the
# learner and stats() answers while both are busy. replay_actor_class takes
# other counts (docs/ray.md, "Threads per group").
CONCURRENCY_GROUPS = {"writers": 2, "learner": 2, "control": 1}


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "exreplay.ray needs Ray: pip install ray gymnasium "
            "(or, in an exreplay checkout, pip install -e '.[ray]')"
        ) from e
    return ray


_KIND = f"a PickSelectorClass (0 to {len(PickSelectorClass) - 1}) or one of {sorted(_KINDS)}"


def _kind(kind, name: str = "kind") -> PickSelectorClass:
    """kind (a PickSelectorClass, its int value or its name in any case) as
    a PickSelectorClass. Anything else, a float, a bool or None included, is
    the TypeError naming `name` and the type (int() truncated 1.7 to
    Prioritized and took True as 1), an unknown name or value a ValueError."""
    if isinstance(kind, str):
        try:
            return _KINDS[kind.lower()]
        except KeyError:
            raise ValueError(f"{name}: expected {_KIND}, got {kind!r}") from None
    return PickSelectorClass(int_arg(name, kind, 0, len(PickSelectorClass) - 1, _KIND))


def _list_arg(name: str, v, expected: str) -> list:
    """v (any iterable) as a list; anything else a TypeError naming name,
    what was expected and v's type."""
    try:
        return list(v)
    except TypeError:
        raise TypeError(f"{name}: expected {expected}, got {type_name(v)}") from None


_SELECTORS = "None or a list of selector kinds and (kind, params) pairs"


def _selector_specs(selectors):
    """ReplayServer's selectors as [(PickSelectorClass, params dict)], or
    None (the default): checked whole before a buffer is built or asked.
    Each entry is a kind (_kind) or a (kind, params) pair with params a
    dict of str keys (alpha, beta). A pair of another length was an
    IndexError or dropped its extra items, params that is no dict a
    TypeError of dict() (a list of pairs was taken as one), and neither
    named the entry."""
    if selectors is None:
        return None
    if isinstance(selectors, (str, bytes, Mapping)):
        raise TypeError(f"selectors: expected {_SELECTORS}, got {type_name(selectors)}")
    entries = _list_arg("selectors", selectors, _SELECTORS)
    specs = []
    for i, s in enumerate(entries):
        if not isinstance(s, (tuple, list)):
            specs.append((_kind(s, f"selectors[{i}]"), {}))
            continue
        if len(s) != 2:
            raise ValueError(f"selectors[{i}]: expected a kind or a (kind, params) pair, "
                             f"got {reprlib.repr(s)}")
        kind = _kind(s[0], f"selectors[{i}][0]")
        params = s[1]
        if not isinstance(params, Mapping):
            raise TypeError(f"selectors[{i}][1]: expected a dict of the selector's parameters "
                            f"(alpha, beta), got {type_name(params)}")
        for k in params:
            if not isinstance(k, str):
                raise TypeError(f"selectors[{i}][1]: expected parameter names (str) as keys, got a "
                                f"key of type {type_name(k)}")
        specs.append((kind, dict(params)))
    return specs


_LOG = "None or a dict {'dir': DIR, 'source': k, ...} (ExperienceLog's options)"


def _log_arg(log, c: bool):
    """ReplayServer's log, None or a dict with str keys and a 'dir' (a
    path), as a dict with dir a str; c: whether the buffer is the C one
    (the experience log needs it). Checked before a buffer is built or a
    directory made: a log that was no dict, or had no 'dir', failed in
    the call of _open_log, naming nothing."""
    import os

    if log is None:
        return None
    if not isinstance(log, Mapping):
        raise TypeError(f"log: expected {_LOG}, got {type_name(log)}")
    for k in log:
        if not isinstance(k, str):
            raise TypeError(f"log: expected {_LOG} with str keys, got a key of type {type_name(k)}")
    if "dir" not in log:
        raise ValueError(f"log: expected {_LOG} with a 'dir' key, got the keys {sorted(log)}")
    if not c:
        raise ValueError(f"log: expected None with impl='reference' (the experience log needs "
                         f"impl='c'), got {dict(log)!r}")
    return dict(log, dir=os.fsdecode(path_arg("log['dir']", log["dir"])))


def _given_buffer(buffer, impl, buffer_kwargs) -> type:
    """The class of ReplayServer's buffer=: an ExperienceReplay or a
    ReferenceReplay (TypeError naming buffer otherwise), with impl, if
    given, its own, and no buffer argument beside it (a ValueError naming
    the first one: they were ignored)."""
    from exreplay.reference import ReferenceReplay

    if not isinstance(buffer, (exreplay.ExperienceReplay, ReferenceReplay)):
        raise TypeError(f"buffer: expected None, an ExperienceReplay or a ReferenceReplay, got "
                        f"{type_name(buffer)}")
    if impl != "c" and _buffer_class(impl) is not type(buffer):
        raise ValueError(f"impl: expected 'c' (the default) or the given buffer's own, got {impl!r} "
                         f"with a buffer of {type_name(buffer)}")
    why = "with buffer= (it is not used: the buffer is built already)"
    for name, v in buffer_kwargs.items():
        raise ValueError(f"{name}: expected no {name} {why}, got {reprlib.repr(v)}")
    return type(buffer)


def _buffer_class(impl):
    """The buffer class of ReplayServer's impl ("c" or "reference")."""
    if impl == "c":
        return exreplay.ExperienceReplay
    if impl == "reference":
        from exreplay.reference import ReferenceReplay

        return ReferenceReplay
    if isinstance(impl, str):
        raise ValueError(f"impl: expected 'c' or 'reference', got {impl!r}")
    raise TypeError(f"impl: expected 'c' or 'reference', got {type_name(impl)}")


def _batch_fields(b):
    """The batch's 8 fields, weight, and extras (a dict, {} if none). A state
    (and state_next) may be a dict of named fields (docs/api.md)."""
    return (*b, b.weight, getattr(b, "extras", None) or {})


def _map(f, x):
    """f of an array, or of each array of a dict of named fields."""
    return {k: f(v) for k, v in x.items()} if isinstance(x, dict) else f(x)


def _cat(parts):
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return np.concatenate(parts)


def _rows(x) -> int:
    return len(next(iter(x.values()))) if isinstance(x, dict) else len(x)


def make_batch(like, arrays, pick_index=None, state_seq=None):
    """A Batch of the same class as `like` (C or reference) from 9 arrays (the
    8 fields and weight) and, optionally, a 10th entry: the extras dict.
    pick_index: the picks' table indices (both implementations' batches
    carry them), or None. state_seq: None, or the (B, pick_len + 1, ...)
    states of a batch in the layout of get_batch(..., shared_next=True) (a
    dict of them with a state_spec): the batch's state and state_next are
    then made its views [:, :-1] and [:, 1:], and the entries 0 and 3 of
    `arrays` are not used (None will do)."""
    arrays = list(arrays)
    extras = arrays[9] if len(arrays) > 9 else {}
    if state_seq is not None:
        arrays[0], arrays[3] = seq_views(state_seq)
    cls = type(like)
    if cls is exreplay.Batch:
        return exreplay.Batch(tuple(arrays[:9]) + (pick_index, extras, state_seq))
    return cls(*arrays[:9], extras=extras, pick_index=pick_index, state_seq=state_seq)


def _state_seq(b):
    """b.state_seq (a batch of get_batch(..., shared_next=True)), or None."""
    return getattr(b, "state_seq", None)


def _cat_state_seq(batches):
    """The batches' state_seq one after the other (a new C-contiguous array
    per field), or None if none has one: batches of both layouts are a
    ValueError (their state and state_next cannot be put together as either)."""
    seqs = [_state_seq(b) for b in batches]
    have = sum(x is not None for x in seqs)
    if have == 0:
        return None
    if have < len(seqs):
        raise ValueError(f"batches: expected batches of one layout, all of get_batch(..., "
                         f"shared_next=True) (state_seq set) or none, got {have} of {len(seqs)} "
                         f"with state_seq")
    return _cat(seqs)


def _own(a):
    """a, a slice of a shared batch's state_seq, as an array of its own over
    the same memory (based on a memoryview of it), so that the views made of
    it have it as their base, as get_batch's views have its state_seq (NumPy
    gives a view of a plain slice the sliced array as its base)."""
    try:
        return np.asarray(memoryview(a))
    except (TypeError, ValueError, BufferError):  # pragma: no cover - no buffer of this dtype
        return a


def _batch_counts(batch_size, n_batches):
    """(batch_size, n) of a get_batch of n_batches (None: one batch) of
    batch_size picks, checked before anything is drawn, with the buffer's
    rule for batch_size (an int, bool refused, from 1; "batch_size: expected
    an int in [1, 2**63 - 1], got 0"): a float is not truncated, and
    n_batches=0 is refused naming n_batches, not batch_size."""
    top = (1 << 63) - 1
    batch_size = int_arg("batch_size", batch_size, 1, top, "an int in [1, 2**63 - 1]")
    if n_batches is None:
        return batch_size, 1
    n = int_arg("n_batches", n_batches, 1, top, "None or an int in [1, 2**63 - 1]")
    if batch_size * n > top:
        raise ValueError(f"n_batches: expected batch_size * n_batches at most 2**63 - 1, got "
                         f"{batch_size} * {n}")
    return batch_size, n


def _pick_index(b):
    """b.pick_index (the picks' table indices), or None (a Batch built
    without them)."""
    return getattr(b, "pick_index", None)


# An empty C buffer with a selector of each kind (uniform, prioritized,
# rank, in PickSelectorClass order), made on first use: its set_priority
# checks every argument as for any selector, and then applies nothing
# (docs/api.md, set_priority), and its selectors' beta takes a value as a
# shard's does. ShardedReplay.set_priority and set_beta have it check their
# arguments before any shard is sent anything.
_checker = None
_checker_mu = threading.Lock()


def _checker_selectors():
    """The checker buffer and its selectors, one per PickSelectorClass."""
    global _checker
    with _checker_mu:
        if _checker is None:
            buf = exreplay.ExperienceReplay(state_shape=(), capacity=1)
            _checker = (buf, [buf.new_pick_selector(k) for k in PickSelectorClass])
    return _checker


def _beta_arg(kind: str, beta) -> float:
    """beta for a selector of kind (a name, "prioritized"), checked as the
    buffer's PickSelector.beta takes it, with its errors (a finite real
    number >= 0; a uniform selector has none): set on the checker's
    selector of that kind, and read back as the buffer keeps it."""
    _buf, sels = _checker_selectors()
    sel = sels[_KINDS[kind]]
    with _checker_mu:  # the value read back is this call's
        sel.beta = beta
        return float(sel.beta)


def _priority_update(pick_epi, pick_pos, priorities, pick_index):
    """The arrays of a set_priority call, checked with the buffer's own rules
    and messages (1-D pick_epi and pick_pos of one length that cast to int64
    under same_kind, neither bools nor uint64 values beyond int64,
    priorities a real scalar or of that shape, finite and >= 0, pick_index
    None or int64-castable of that shape, with the same exceptions) before
    any part of them is routed: as int64, int64, float64 of pick_epi's
    shape, and int64 or None. Cast unchecked, float handles would be truncated, and a bad
    priority would be refused by its shard after the others had applied
    theirs."""
    buf, sels = _checker_selectors()
    buf.set_priority(sels[PickSelectorClass.Uniform], pick_epi, pick_pos, priorities, pick_index=pick_index)
    epi = np.asarray(pick_epi).astype(np.int64, copy=False)
    pos = np.asarray(pick_pos).astype(np.int64, copy=False)
    pri = np.broadcast_to(np.asarray(priorities).astype(np.float64, copy=False), epi.shape)
    idx = None if pick_index is None else np.asarray(pick_index).astype(np.int64, copy=False)
    return epi, pos, pri, idx


def _handle_arg(ps, known) -> int:
    """ps as an int handle, one of `known` (the shards' selectors), with the
    buffer's errors: a TypeError for a type that is no handle, a ValueError
    for an unknown one."""
    h = index_arg("ps", ps, "a PickSelector or an int handle")
    if h not in known:
        raise ValueError(f"ps: expected a pick selector of the shards, {sorted(known)}, got unknown handle {h}")
    return h


def _check_priorities(p) -> None:
    """A rollout's priorities (float64 or None): finite and >= 0, as
    record_many requires, else the ValueError naming the first bad one."""
    if p is None:
        return
    bad = np.flatnonzero(~(np.isfinite(p) & (p >= 0)))
    if len(bad):
        raise ValueError(f"priorities: expected finite numbers >= 0, got {p[bad[0]]} at index {bad[0]}")


def _cat_pick_index(batches):
    """The batches' pick_index one after the other, or None if one has none."""
    idx = [_pick_index(b) for b in batches]
    return None if any(x is None for x in idx) else np.concatenate(idx)


def split_batch(b, n: int) -> list:
    """Split a batch of n*B picks into n batches of B (views, no copy).

    A batch of get_batch(..., shared_next=True) splits into batches of that
    layout: each one's state_seq is its rows of b.state_seq, and its state
    and state_next are views of that (docs/api.md, "Shared next states").
    n is an int (NumPy's too) >= 1 that divides the batch size: a float or
    a bool is a TypeError naming n (True made one batch, 2.0 failed in
    slicing), another value a ValueError."""
    fields = _batch_fields(b)
    total = len(fields[6])
    want = f"an int >= 1 that divides the batch size {total}"
    n = int_arg("n", n, 1, None, want)
    if total % n:
        raise ValueError(f"n: expected {want}, got {n}")
    size = total // n
    idx = _pick_index(b)
    seq = _state_seq(b)
    parts = []
    for i in range(n):
        def cut(a, i=i):
            return a[i * size:(i + 1) * size]

        if seq is None:
            parts.append(make_batch(b, [_map(cut, f) for f in fields], None if idx is None else cut(idx)))
        else:
            arrays = [None if k in (0, 3) else _map(cut, f) for k, f in enumerate(fields)]
            parts.append(make_batch(b, arrays, None if idx is None else cut(idx),
                                    state_seq=_map(lambda a: _own(cut(a)), seq)))
    return parts


class _Batches(list):
    """The n batches of one get_batch(B, ps, n): views of one batch of n*B
    picks. It pickles as that one batch (9 buffers, not 9n) and is split
    again where it is unpickled, so a Ray return carries one block."""

    __slots__ = ("whole",)

    def __init__(self, whole, n: int):
        super().__init__(split_batch(whole, n))
        self.whole = whole

    def __reduce__(self):
        return (split_batch, (self.whole, len(self)))


def concat_batches(batches: Sequence) -> Any:
    """One batch from several (a copy: np.concatenate of each field).

    Batches of get_batch(..., shared_next=True) give one of that layout:
    their state_seq are concatenated and state and state_next made views of
    the result. Batches of both layouts are a ValueError, and so is no
    batch (an IndexError before); batches that is no sequence a TypeError."""
    if not isinstance(batches, (list, tuple)):
        batches = _list_arg("batches", batches, "a list of batches")
    if not batches:
        raise ValueError("batches: expected at least one batch, got none")
    if len(batches) == 1:
        return batches[0]
    seq = _cat_state_seq(batches)
    cols = list(zip(*(_batch_fields(b) for b in batches)))
    arrays = [None if seq is not None and k in (0, 3) else _cat(c) for k, c in enumerate(cols)]
    return make_batch(batches[0], arrays, _cat_pick_index(batches), state_seq=seq)


# --- rollouts ----------------------------------------------------------------------


def _rollout_priorities(p) -> np.ndarray:
    """A Rollout's priorities as float64, converted by the buffer's rule
    (same_kind; a bool is no priority), with its TypeError: strings were
    parsed ("1.5") and bools taken as 0 and 1."""
    a = np.asarray(p)
    if a.dtype == np.bool_:
        raise TypeError("priorities: expected real numbers, got bool")
    if not np.can_cast(a.dtype, np.float64, "same_kind"):
        raise TypeError(f"priorities: expected float64 (or a dtype that casts to it under "
                        f"same_kind), got {a.dtype}")
    return a.astype(np.float64, copy=False)


def _rollout_ends(ends) -> np.ndarray:
    """A Rollout's ends as int64: integers (an empty sequence is none); a
    float index is a TypeError (it was truncated)."""
    a = np.asarray(ends)
    if a.size and a.dtype.kind not in "iu":
        raise TypeError(f"ends: expected row indices (integers), got {a.dtype}")
    return a.astype(np.int64).reshape(-1)


def _rollout_terminated(t, n_ends: int) -> np.ndarray:
    """A Rollout's terminated as a bool array: None (every end terminated),
    a bool or integer array (nonzero: terminated, as a list of its items
    would be read), or a list or tuple of flags, each one taken as the buffer
    takes its own terminated (truth_arg: a bool, a NumPy bool, an int or a
    NumPy integer; an array, a string, a float or None is a TypeError naming
    its row, where bool() took "no" and 0.5 as True)."""
    if t is None:
        return np.ones(n_ends, dtype=bool)
    if isinstance(t, np.ndarray):
        if t.dtype.kind not in "biu":
            raise TypeError(f"terminated: expected None, a bool or integer array or a list of flags "
                            f"(one per end), got {type_name(t)}")
        if t.ndim != 1:
            raise ValueError(f"terminated: expected shape ({n_ends},) (one flag per end), got {t.shape}")
        return t if t.dtype == np.bool_ else t != 0
    if not isinstance(t, (list, tuple)):
        raise TypeError(f"terminated: expected None, a bool or integer array or a list of flags "
                        f"(one per end), got {type_name(t)}")
    return np.array([truth_arg(f"terminated[{j}]", x) for j, x in enumerate(t)], dtype=bool)


class Rollout:
    """T consecutive steps of one sender, possibly spanning several episodes.

    The columns have T rows: ``states`` (T, *state_shape), ``actions``
    (T, *action_shape), ``rewards`` (T,), ``priorities`` (T,) or None,
    ``extras`` None or a dict {name: (T, *shape)} for a buffer with an
    extras_spec. With a state_spec, ``states`` (and ``final_states``) are
    dicts {name: (T, *shape)} (and (E, *shape)).
    ``ends`` (E,) lists the exclusive row index after which an episode ends
    (strictly increasing, each in 1..T), with its ``final_states`` (E, *state_shape)
    (or None, when every ended episode is terminated) and ``terminated`` (E,) bool
    (None: all True; each flag as the buffer's terminated, a string or a float refused).
    Rows after the last end belong to an episode left open: the sender's next
    rollout continues it (the replay keeps one open episode per *stream*).
    A rollout of no rows with ``ends=[0]`` ends that open episode, left by the
    stream's previous rollout, without a step (its last step's next state
    became known only after that rollout was sent: ExperienceReplay.end_episode).

    A Rollout is a plain container of arrays: it pickles as a handful of
    out-of-band NumPy buffers.
    """

    __slots__ = ("states", "actions", "rewards", "priorities", "ends", "final_states", "terminated",
                 "extras")

    def __init__(self, states, actions, rewards, priorities=None, ends=(), final_states=None, terminated=None,
                 extras=None):
        self.states = _map(np.asarray, dict(states) if isinstance(states, dict) else states)
        if extras is not None and not isinstance(extras, Mapping):
            raise TypeError(f"extras: expected None or a dict {{name: (T, *shape) array}}, got "
                            f"{type_name(extras)}")
        self.extras = None if extras is None else {k: np.asarray(v) for k, v in extras.items()}
        self.actions = np.asarray(actions)
        self.rewards = np.asarray(rewards)
        self.priorities = None if priorities is None else _rollout_priorities(priorities)
        self.ends = _rollout_ends(ends)
        self.final_states = None if final_states is None else _map(
            np.asarray, dict(final_states) if isinstance(final_states, dict) else final_states)
        self.terminated = _rollout_terminated(terminated, len(self.ends))
        T = _rows(self.states)
        E = len(self.ends)
        if (T < 1 and not (E == 1 and self.ends[0] == 0)) or len(self.actions) != T or \
                len(self.rewards) != T:
            raise ValueError(f"rollout: expected T >= 1 rows in states, actions, rewards (or T = 0 "
                             f"with ends=[0]: an end without a step), got {T}, "
                             f"{len(self.actions)}, {len(self.rewards)}")
        lo = 0 if T == 0 else 1  # an end at 0 only in a rollout of no rows
        if self.extras is not None and any(len(v) != T for v in self.extras.values()):
            raise ValueError(f"extras: expected {T} rows in every field, got "
                             f"{ {k: len(v) for k, v in self.extras.items()} }")
        if self.priorities is not None and len(self.priorities) != T:
            raise ValueError(f"priorities: expected {T} rows, got {len(self.priorities)}")
        if len(self.terminated) != E or (self.final_states is not None and _rows(self.final_states) != E):
            raise ValueError(f"ends, final_states, terminated: expected {E} rows each")
        if E and (self.ends[0] < lo or self.ends[-1] > T or np.any(np.diff(self.ends) <= 0)):
            raise ValueError(f"ends: expected strictly increasing indices in {lo}..{T} (an end at 0 "
                             f"only in a rollout of no rows), got {self.ends}")
        if self.final_states is None and not bool(np.all(self.terminated)):
            raise ValueError("final_states: required where an episode ends without terminated=True")

    def __len__(self):
        return _rows(self.states)

    def __reduce__(self):
        return (Rollout, (self.states, self.actions, self.rewards, self.priorities, self.ends,
                          self.final_states, self.terminated, self.extras))

    @property
    def open_tail(self) -> bool:
        """Whether the last rows are an episode left open."""
        return len(self.ends) == 0 or int(self.ends[-1]) < len(self)

    def pieces(self):
        """(start, stop, end_index or None) per episode piece, in order; a
        rollout of no rows is the one piece (0, 0, 0), which ends the stream's
        open episode without a step."""
        start = 0
        for j, e in enumerate(self.ends):
            yield start, int(e), j
            start = int(e)
        if start < len(self):
            yield start, len(self), None

    def take(self, pieces) -> "Rollout":
        """A rollout of some of this one's pieces (rows copied, in the given order)."""
        rows = [np.arange(a, b) for a, b, _ in pieces]
        idx = np.concatenate(rows)
        lens = np.array([b - a for a, b, _ in pieces], dtype=np.int64)
        ends_j = [j for _, _, j in pieces if j is not None]
        n_ended = len(ends_j)
        ends = np.cumsum(lens)[:n_ended]
        return Rollout(
            _map(lambda x: x[idx], self.states), self.actions[idx], self.rewards[idx],
            None if self.priorities is None else self.priorities[idx],
            ends,
            None if self.final_states is None else _map(lambda x: x[ends_j], self.final_states),
            self.terminated[ends_j],
            None if self.extras is None else _map(lambda x: x[idx], self.extras),
        )

    def piece(self, a: int, b: int, j):
        """(states, extras, final_state) of rows [a, b) ending with end j (or None)."""
        fs = None
        if j is not None and self.final_states is not None:
            fs = _map(lambda x: x[j], self.final_states)
        return (_map(lambda x: x[a:b], self.states),
                None if self.extras is None else _map(lambda x: x[a:b], self.extras), fs)


# --- the replay server: the actor's body, usable without Ray ------------------------


class _Meter:
    """Counters and the rates since the previous read."""

    def __init__(self):
        self.lock = threading.Lock()
        self.t0 = self.t_last = time.perf_counter()
        self.c = dict(records=0, rollouts=0, picks_sampled=0, batches=0, priority_updates=0)
        self.last = dict(self.c)
        # Time during which a writer and a sampler were both inside the buffer.
        self.active = {"w": 0, "s": 0}
        self.overlap_since = None
        self.overlap_s = 0.0
        self.busy_s = {"w": 0.0, "s": 0.0}

    def enter(self, side):
        now = time.perf_counter()
        with self.lock:
            self.active[side] += 1
            if self.overlap_since is None and self.active["w"] and self.active["s"]:
                self.overlap_since = now
        return now

    def leave(self, side, t_enter, **counts):
        now = time.perf_counter()
        with self.lock:
            self.active[side] -= 1
            self.busy_s[side] += now - t_enter
            if self.overlap_since is not None and not (self.active["w"] and self.active["s"]):
                self.overlap_s += now - self.overlap_since
                self.overlap_since = None
            for k, v in counts.items():
                self.c[k] += v

    def read(self):
        now = time.perf_counter()
        with self.lock:
            dt = max(now - self.t_last, 1e-9)
            rates = {
                "inserts_per_s": (self.c["records"] - self.last["records"]) / dt,
                "samples_per_s": (self.c["picks_sampled"] - self.last["picks_sampled"]) / dt,
                "batches_per_s": (self.c["batches"] - self.last["batches"]) / dt,
            }
            overlap = self.overlap_s + (now - self.overlap_since if self.overlap_since is not None else 0.0)
            out = dict(self.c, **rates, interval_s=dt, uptime_s=now - self.t0, overlap_s=overlap,
                       write_busy_s=self.busy_s["w"], sample_busy_s=self.busy_s["s"])
            self.last = dict(self.c)
            self.t_last = now
            return out


class _Stream:
    """One stream's bookkeeping in a ReplayServer, read and changed under the
    server's _streams_mu (h under lock). end_stream takes it out of the server
    and marks it ended; a call works on the object it found when it came, so
    nothing it does afterwards reaches a stream started under the same key."""

    __slots__ = ("seq", "held", "draining", "lock", "h", "ended")

    def __init__(self):
        self.seq = 0  # the next number to record
        self.held: dict[int, Rollout] = {}  # rollouts ahead of their turn, by number
        self.draining = False  # a call is recording the held rollouts in order now
        self.lock = threading.Lock()  # held while one of its rollouts is being recorded
        self.h = None  # the open episode's handle, or None
        self.ended = False  # end_stream has forgotten it


class ReplayServer:
    """One replay buffer behind a thread-safe, Ray-friendly interface.

    This is the body of ``ReplayActor`` (``ReplayActor = ray.remote(ReplayServer)``
    with concurrency groups); it also works as a plain object in one process.

    impl: ``"c"`` for ``exreplay.ExperienceReplay`` (default) or ``"reference"``
    for the pure-Python ``ReferenceReplay`` (the benchmarks' baseline).
    selectors: pick selectors to create, in order (handles 0, 1, ...): each a
    kind (``"uniform"``, ``"prioritized"`` or a PickSelectorClass) or
    ``(kind, params)`` with params a dict (``{"alpha": 0.6}``). Default
    (None): one prioritized selector (alpha=0.6, beta=0.4). Every entry is
    checked, and named (``selectors[1][1]``), before a buffer is built.
    buffer: an existing buffer (e.g. from ``ray.put``/``unserialize``) to serve
    instead of building one, an ExperienceReplay or a ReferenceReplay given
    with no buffer keyword argument and impl left out or its own; its
    selectors are then taken as they are, with their handles and current
    parameters (``buffer.pick_selectors()``), and
    ``set_beta`` anneals them too. ``selectors``, if given, must list the
    buffer's selectors' kinds in handle order (ValueError otherwise); its
    parameters are not applied.
    log: ``{"dir": DIR, "source": k, "level": 1, ...}`` attaches an experience
    log (docs/log.md) written on this actor's node to ``DIR/replay-<k>.xlog``:
    every step recorded here is logged by the buffer's own writer thread, and
    nothing extra crosses Ray per append. ``gather_logs`` merges the logs.
    A buffer that logs already is a ValueError before the file is opened. If
    attach_log refuses the new log (a layout of its own that differs), its
    error is raised, with the new log closed and the file it created removed.
    The other keyword arguments go to the buffer's constructor.
    """

    def __init__(self, *, impl: str = "c", selectors=None, buffer=None, log=None, **buffer_kwargs):
        # the selectors, impl and log are checked (and named) before a buffer
        # is built or asked, or a directory made
        specs = _selector_specs(selectors)
        cls = _buffer_class(impl) if buffer is None else _given_buffer(buffer, impl, buffer_kwargs)
        log = _log_arg(log, cls is exreplay.ExperienceReplay)
        if buffer is not None:
            # A restored buffer keeps its selectors, which the server reads
            # from it (pick_selector, pick_selectors) whenever it needs them.
            self.buf = buffer
            if specs is not None:
                self._check_selectors(specs)
        else:
            self.buf = cls(**buffer_kwargs)
            for kind, params in (specs if specs is not None else [("prioritized", {})]):
                self.new_pick_selector(kind, **params)
        self.impl = "c" if isinstance(self.buf, exreplay.ExperienceReplay) else "reference"
        self._log = None
        if log is not None:
            self._open_log(**log)
        self._meter = _Meter()
        self._streams: dict[Hashable, _Stream] = {}
        self._streams_mu = threading.Lock()

    # -- configuration -------------------------------------------------------------

    def new_pick_selector(self, kind, **params) -> int:
        """Add a pick selector (kind, **params); returns its int handle."""
        return int(self.buf.new_pick_selector(_kind(kind), **params))

    def _check_selectors(self, specs) -> None:
        """selectors= given with buffer=: the kinds of the buffer's selectors,
        in handle order."""
        have = [_kind(ps.kind).name.lower() for ps in self.buf.pick_selectors()]
        given = [_kind(kind).name.lower() for kind, _ in specs]
        if given != have:
            raise ValueError(f"selectors: expected the kinds of the buffer's selectors in handle "
                             f"order, {have}, got {given}")

    def selectors(self) -> dict:
        """{handle: (kind name, alpha, beta)} of every selector the buffer holds,
        read now (alpha, beta None for uniform)."""
        out = {}
        for ps in self.buf.pick_selectors():
            k = _kind(ps.kind)
            if k != PickSelectorClass.Uniform:
                out[int(ps)] = (k.name.lower(), float(ps.alpha), float(ps.beta))
            else:
                out[int(ps)] = ("uniform", None, None)
        return out

    def set_beta(self, ps: int, beta: float) -> None:
        """Anneal beta of selector ps (a handle; a restored buffer's selectors
        too): the buffer's PickSelector.beta, with its errors."""
        self.buf.pick_selector(ps).beta = beta

    def config(self) -> dict:
        b = self.buf
        spec = lambda d: None if d is None else {k: (s, str(t)) for k, (s, t) in d.items()}  # noqa: E731
        return dict(state_shape=b.state_shape, state_dtype=None if b.state_dtype is None else str(b.state_dtype),
                    state_spec=spec(b.state_spec), extras_spec=spec(b.extras_spec),
                    action_shape=b.action_shape,
                    action_dtype=str(b.action_dtype), reward_dtype=str(b.reward_dtype), capacity=b.capacity,
                    pick_len=b.pick_len, allow_short=b.allow_short, eviction=b.eviction, impl=self.impl,
                    selectors=self.selectors())

    # -- writers ---------------------------------------------------------------------

    def record_many(self, h, states, actions, rewards, final_state=None, terminated=False, priorities=None,
                    extras=None):
        """``ExperienceReplay.record_many``: returns the handle recorded into last."""
        t = self._meter.enter("w")
        counts = {}  # counted only once the call has succeeded
        try:
            h = self.buf.record_many(h, states, actions, rewards, final_state=final_state,
                                     terminated=terminated, priorities=priorities, extras=extras)
            counts = dict(records=np.shape(actions)[0], rollouts=1)
        finally:
            self._meter.leave("w", t, **counts)
        return h

    def end_episode(self, h, final_state=None, terminated=False) -> bool:
        """``ExperienceReplay.end_episode``: ends open episode h (a handle
        record_many returned) without a step; False if it was evicted."""
        t = self._meter.enter("w")
        try:
            return self.buf.end_episode(h, final_state=final_state, terminated=terminated)
        finally:
            self._meter.leave("w", t)

    def record_rollout(self, stream: Hashable, rollout: Rollout, seq: int | None = None) -> int:
        """Record a `Rollout` of sender `stream`; returns the records accepted.

        The first piece continues the stream's open episode (if any); each end
        closes an episode; rows after the last end stay open for the stream's
        next rollout. seq (0, 1, 2, ... per stream) keeps a stream's rollouts in
        order when a threaded actor receives them out of order: a rollout that
        arrives before its predecessor is held (no thread waits) and recorded,
        in order, by the call that brings the missing one. None skips that.
        seq is an int (NumPy's integer scalars too) >= 0: a float, a string or
        a bool is a TypeError naming seq and the type, a negative one a
        ValueError, before anything is held or recorded. stream is any
        hashable id (else a TypeError naming it).
        """
        _stream_arg(stream)
        if not isinstance(rollout, Rollout):
            raise TypeError(f"rollout: expected a Rollout, got {type_name(rollout)}")
        if seq is None:
            with self._streams_mu:
                st = self._streams.get(stream)
                if st is None:
                    st = self._streams[stream] = _Stream()
            with st.lock:
                self._record_rollout(st, rollout)
            return len(rollout)
        seq = int_arg("seq", seq, 0, None, "an int >= 0 or None")
        with self._streams_mu:
            st = self._streams.get(stream)
            nxt = 0 if st is None else st.seq
            if seq < nxt or (st is not None and seq in st.held):
                raise ValueError(f"seq: expected a number not sent before on stream {stream!r} "
                                 f"(next {nxt}), got {seq}")
            if st is None:  # a stream is kept only once a call of it is accepted
                st = self._streams[stream] = _Stream()
            st.held[seq] = rollout
            if st.draining or st.seq not in st.held:
                return len(rollout)  # recorded by the call that holds its predecessor
            st.draining = True
        # This call records every held rollout of the stream that is next in line.
        # Taking the next one and leaving the drain are one step under
        # _streams_mu, so a rollout that arrives meanwhile is never left behind.
        # Its number is used up as it is taken: while it is being recorded, a
        # second call with the same seq is refused (seq < next). The drain works
        # on st only, and stops once end_stream has ended it. An error it does
        # not catch (KeyboardInterrupt) leaves it at once; the stream's next
        # call then finds the next rollout held and no drain, and takes over.
        # If end_stream comes before this call's own rollout is taken, the
        # rollout is dropped with the stream, and the call returns 0.
        err = None
        taken = owns = False
        try:
            owns = True
            while True:
                with self._streams_mu:
                    r = None if st.ended else st.held.pop(st.seq, None)
                    if r is None:
                        st.draining = owns = False
                        break
                    taken = taken or st.seq == seq
                    st.seq += 1
                try:
                    with st.lock:
                        self._record_rollout(st, r)
                except Exception as e:  # the rest of the stream still goes in; the first error is raised
                    err = err or e
        except BaseException:
            if owns:  # not once the drain was handed back (draining may be another call's now)
                with self._streams_mu:
                    st.draining = False
            raise
        if err is not None:
            raise err
        return len(rollout) if taken else 0

    def _check_rollout(self, r: Rollout) -> None:
        """What record_many would check only at a later piece of r, checked
        before anything is recorded: every priority and every final state.
        (The other columns are one array each, which the first piece checks.)"""
        _check_priorities(r.priorities)
        fs = r.final_states
        if fs is None:
            return
        spec = self.buf.state_spec
        if spec is None:
            if isinstance(fs, dict):
                raise ValueError(f"final_states: expected an array, got the fields {sorted(fs)}")
            fields = [("final_states", fs, self.buf.state_shape, self.buf.state_dtype)]
        else:
            if not isinstance(fs, dict) or set(fs) != set(spec):
                got = f"the fields {sorted(fs)}" if isinstance(fs, dict) else "an array"
                raise ValueError(f"final_states: expected the fields {sorted(spec)}, got {got}")
            fields = [(f"final_states[{k!r}]", fs[k], *spec[k]) for k in spec]
        for name, x, shape, dtype in fields:
            if x.shape[1:] != tuple(shape):
                raise ValueError(f"{name}: expected shape {(len(x), *shape)}, got {x.shape}")
            if not np.can_cast(x.dtype, dtype, "same_kind"):
                raise TypeError(f"{name}: expected a dtype that casts to {np.dtype(dtype)} under same_kind, "
                                f"got {x.dtype}")

    def _record_rollout(self, stream: _Stream, r: Rollout) -> None:
        """r into the stream's open episode; the caller holds stream.lock."""
        h = stream.h
        t = self._meter.enter("w")
        counts = {"records": 0}
        try:
            self._check_rollout(r)
            for a, b, j in r.pieces():
                pr = None if r.priorities is None else r.priorities[a:b]
                st, ex, fs = r.piece(a, b, j)
                if a == b:  # a rollout of no rows: the open episode ends without a step
                    if h is not None:  # none (a new stream, or one whose episode was lost): nothing to end
                        self.buf.end_episode(h, final_state=fs, terminated=bool(r.terminated[j]))
                    h = None
                    continue
                if j is None:
                    h = self.buf.record_many(h, st, r.actions[a:b], r.rewards[a:b], priorities=pr, extras=ex)
                else:
                    self.buf.record_many(h, st, r.actions[a:b], r.rewards[a:b], final_state=fs,
                                         terminated=bool(r.terminated[j]), priorities=pr, extras=ex)
                    h = None
                counts["records"] += b - a
            counts["rollouts"] = 1
            stream.h = h
        except BaseException:
            # The rollout is not (wholly) in: the stream's next piece starts a
            # new episode rather than joining the open one across the gap.
            stream.h = None
            raise
        finally:
            self._meter.leave("w", t, **counts)

    def end_stream(self, stream: Hashable) -> None:
        """Forget a stream at once. Its open episode stays, unended, until
        evicted; a rollout of it being recorded now finishes into that episode;
        its held rollouts are dropped. A stream started afterwards under the
        same key begins anew: seq 0, and a new episode."""
        _stream_arg(stream)
        with self._streams_mu:
            st = self._streams.pop(stream, None)
            if st is not None:
                st.ended = True
                st.held.clear()

    # -- learner ---------------------------------------------------------------------

    def get_batch(self, batch_size: int, ps: int = 0, n_batches: int | None = None, with_stats: bool = False,
                  *, shared_next: bool = False):
        """A Batch of batch_size picks; with n_batches, a list of that many.

        The n batches are one draw of n*batch_size picks, split into views (one
        memory block; 9 buffers cross Ray, not 9n). With with_stats, returns
        (batch(es), priority_stats) read right after the draw (with_stats a
        flag as shared_next is). shared_next
        (keyword-only, a flag as the buffer's get_batch takes it): batches in
        the layout of get_batch(..., shared_next=True), each one's state and
        state_next views of its own state_seq, which alone crosses Ray
        (docs/api.md, "Shared next states").
        """
        with_stats = truth_arg("with_stats", with_stats)
        shared_next = truth_arg("shared_next", shared_next)
        batch_size, n = _batch_counts(batch_size, n_batches)
        t = self._meter.enter("s")
        counts = {}  # counted only once the call has succeeded
        try:
            b = self.buf.get_batch(batch_size * n, ps, shared_next=shared_next)
            st = self.priority_stats(ps) if with_stats else None
            counts = dict(picks_sampled=batch_size * n, batches=n)
        finally:
            self._meter.leave("s", t, **counts)
        out = b if n_batches is None else _Batches(b, n)
        return (out, st) if with_stats else out

    def set_priority(self, ps: int, pick_epi, pick_pos, priorities, pick_index=None) -> int:
        """ExperienceReplay.set_priority's handle form; pass the batch's
        pick_index too (it crosses Ray with the batch) for the shortcut that
        skips the lookup by handle while the indices still hold."""
        t = self._meter.enter("s")
        counts = {}  # counted only once the call has succeeded
        try:
            n = self.buf.set_priority(ps, pick_epi, pick_pos, priorities, pick_index=pick_index)
            counts = dict(priority_updates=int(np.size(pick_epi)))
        finally:
            self._meter.leave("s", t, **counts)
        return n

    def priority_stats(self, ps: int = 0):
        """(total p**alpha, smallest positive p**alpha, picks) of selector ps.

        Uniform: (picks, 1.0, picks). Uses ExperienceReplay.priority_stats (O(1))
        where the buffer has it; otherwise (the pure-Python reference) computes
        it from the test hooks _picks/_priority in O(N).
        """
        f = getattr(self.buf, "priority_stats", None)
        if f is not None:
            total, mn, n = f(ps)
            return float(total), float(mn), int(n)
        sel = self.buf.pick_selector(ps)
        kind = _kind(sel.kind)
        epi, pos = self.buf._picks()
        n = len(epi)
        if kind == PickSelectorClass.Uniform:
            return float(n), (1.0 if n else float("inf")), n
        if kind == PickSelectorClass.Rank:  # draw weights r**-alpha, r = 1..n
            alpha = float(sel.alpha)
            w = np.arange(1, n + 1, dtype=np.float64) ** -alpha
            return float(w.sum()), (float(w[-1]) if n else float("inf")), n
        pa = np.asarray(self.buf._priority(ps, epi, pos), dtype=np.float64) if n else np.zeros(0)
        pos_pa = pa[pa > 0]
        return float(pa.sum()), (float(pos_pa.min()) if len(pos_pa) else float("inf")), n

    # -- control ---------------------------------------------------------------------

    def stats(self) -> dict:
        """records, picks, episodes held; counters; rates since the previous stats()."""
        out = self._meter.read()
        out.update(held_records=len(self.buf), held_picks=self.buf.num_picks, episodes=self.buf.num_episodes)
        return out

    def buffer(self):
        """The whole buffer (pickled through serialize; protocol 5 out of band)."""
        return self.buf

    def serialize(self, level: int = 0):
        return self.buf.serialize(level=level)

    def save(self, path: str, level: int = 6) -> None:
        self.buf.save(path, level=level)

    def call(self, name: str, *args, **kwargs):
        """Any other buffer method, e.g. call("episode", h). name is a str
        (else a TypeError naming it and its type, before the buffer is asked)."""
        if not isinstance(name, str):
            raise TypeError(f"name: expected a str (the name of a buffer method), got {type_name(name)}")
        return getattr(self.buf, name)(*args, **kwargs)

    def ping(self) -> bool:
        return True

    # -- the experience log (docs/log.md) ----------------------------------------------

    def _open_log(self, dir: str, source: int = 0, **log_kwargs) -> None:
        """Opens the log (_log_arg checked its form) and attaches it. The
        directory is made only once ExperienceLog has checked every other
        argument: it checks them all before it opens the file, so the first
        try refuses a bad one, and fails to open only for want of the
        directory."""
        import os

        attached = self.buf.log
        if attached is not None:
            # Refused before the file is opened: with overwrite, opening it would
            # empty the file that this log may be writing now.
            raise ValueError(f"log: expected a buffer that logs nothing, got one that logs into "
                             f"{attached.path!r} (detach_log() first)")
        path = os.path.join(dir, f"replay-{source}.xlog")
        log_kwargs.setdefault("overwrite", True)
        existed = os.path.lexists(path)
        try:
            log = exreplay.ExperienceLog(path, source=source, **log_kwargs)
        except FileNotFoundError:
            if os.path.isdir(dir):
                raise
            os.makedirs(dir, exist_ok=True)
            log = exreplay.ExperienceLog(path, source=source, **log_kwargs)
        try:
            self.buf.attach_log(log)
        except BaseException:
            # Refused (a layout of its own that differs; another thread attached
            # a log meanwhile): the new log is closed, the file it created goes,
            # and the server keeps the log it had. The error raised is attach_log's.
            try:
                log.close()
            except Exception:
                pass
            if not existed:
                try:
                    os.unlink(path)
                except OSError:
                    pass
            raise
        self._log = log

    def log_info(self) -> dict | None:
        """Where this actor's log is (path, node id, host) and its writer's stats."""
        if self._log is None:
            return None
        import os
        import socket

        node = None
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:  # pragma: no cover - a plain ReplayServer without Ray
            pass
        return dict(path=self._log.path, source=self._log.source, node_id=node,
                    host=socket.gethostname(), closed=self._log.closed,
                    bytes=os.path.getsize(self._log.path), stats=self._log.stats)

    def log_close(self) -> dict | None:
        """Stops logging and closes the log (flushed, end marker); returns log_info()."""
        if self._log is None:
            return None
        if not self._log.closed:
            self._log.close()
        return self.log_info()

    def log_read(self, offset: int, size: int) -> bytes:
        """size bytes of the log file from offset (fewer at its end, none
        beyond it; at most 64 MiB a call): how gather_logs ships a log from
        another node, piece by piece. offset is an int in [0, 2**63 - 1] and
        size an int >= 1 (NumPy's integer scalars too), checked before
        anything is read: a float, a string or a bool is a TypeError naming
        the argument, a value out of range a ValueError (size=-1 read the
        whole file, and offset=True read from byte 1). A replay without a
        log is a ValueError."""
        offset = int_arg("offset", offset, 0, (1 << 63) - 1, "an int in [0, 2**63 - 1] (a byte offset)")
        size = int_arg("size", size, 1, None, "an int >= 1 (bytes)")
        if self._log is None:
            raise ValueError("log_read: expected a replay with a log (built with log=), got one without")
        with open(self._log.path, "rb") as f:
            f.seek(offset)
            return f.read(min(size, 64 << 20))



# --- the Ray actor ------------------------------------------------------------------

_GROUP_OF = {
    "record_many": "writers",
    "end_episode": "writers",
    "record_rollout": "writers",
    "end_stream": "writers",
    "get_batch": "learner",
    "set_priority": "learner",
    "priority_stats": "learner",
    "new_pick_selector": "control",
    "selectors": "control",
    "set_beta": "control",
    "config": "control",
    "stats": "control",
    "buffer": "control",
    "serialize": "control",
    "save": "control",
    "call": "control",
    "ping": "control",
    "log_info": "control",
    "log_close": "control",
    "log_read": "control",
}


def _make_actor_class():
    """ReplayServer as a threaded Ray actor with concurrency groups (imports Ray)."""
    _ray()
    from exreplay.ray._actor import ReplayActor

    return ReplayActor


def __getattr__(name):
    # ReplayActor and replay_actor_class are built (and Ray imported) on first use.
    if name == "ReplayActor":
        return _make_actor_class()
    if name == "replay_actor_class":
        _ray()
        from exreplay.ray._actor import replay_actor_class

        return replay_actor_class
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# --- the sharded replay ---------------------------------------------------------------


def _stable_hash(x) -> int:
    import zlib

    return zlib.crc32(repr(x).encode())


def _stream_arg(stream) -> None:
    """A TypeError naming `stream` unless it can be a dict key."""
    try:
        hash(stream)
    except TypeError:
        raise TypeError(f"stream: expected a hashable id, got {type_name(stream)}") from None


_PICK_EPI = "an integer array, a list of ints or an int, in [0, 2**63 - 1] (a sharded batch's pick_epi)"


def _pick_epi_arg(v):
    """v, a sharded batch's pick_epi, as int64 (an array, or a scalar for an
    int): an array of an integer dtype, a list or tuple of ints (NumPy's
    integer scalars too), or one such int. Nothing else is converted: a
    float would be truncated, a string parsed and a bool taken as 0 or 1,
    hence a TypeError. A sharded pick_epi is epi * n_shards + shard, with
    epi a buffer's handle (0, 1, 2, ...), so a value below 0 or beyond int64
    is a ValueError."""
    top = np.iinfo(np.int64).max
    if isinstance(v, np.ndarray) and v.ndim:
        if v.dtype.kind not in "iu":
            raise TypeError(f"pick_epi: expected {_PICK_EPI}, got {type_name(v)}")
        bad = np.flatnonzero(v > top if v.dtype == np.uint64 else v < 0)
        if len(bad):
            at = np.unravel_index(bad[0], v.shape)
            at = int(at[0]) if v.ndim == 1 else tuple(int(i) for i in at)
            raise ValueError(f"pick_epi: expected {_PICK_EPI}, got {v.flat[bad[0]]} at index {at}")
        return v.astype(np.int64, copy=False)
    if isinstance(v, (list, tuple)):
        return np.array([int_arg(f"pick_epi[{i}]", x, 0, top, "an int in [0, 2**63 - 1]")
                         for i, x in enumerate(v)], dtype=np.int64)
    return np.int64(int_arg("pick_epi", v, 0, top, _PICK_EPI))


# ShardedReplay's arguments that only shape the shards it starts, with
# their defaults: with actors= none of them is used.
_SHARD_DEFAULTS = dict(selectors=(("prioritized", {}),), capacity=1_000_000, actor_options=None,
                       impl="c", log_dir=None, log_options=None)


def _at_default(v, default) -> bool:
    """Whether v is the default itself or equal to it and of its type."""
    if v is default:
        return True
    try:
        return type(v) is type(default) and bool(v == default)
    except Exception:  # a comparison that does not give one truth value
        return False


def _unused_with_actors(given: dict, buffer_kwargs: dict) -> None:
    """With actors=, the arguments that only shape the shards ShardedReplay
    starts (given: {name: value} of _SHARD_DEFAULTS' names) must be left at
    their defaults, and no buffer argument given: a ValueError naming the
    first one otherwise (they were ignored)."""
    why = "with actors= (it is not used: the actors' buffers are built already)"
    for name, v in given.items():
        default = _SHARD_DEFAULTS[name]
        if not _at_default(v, default):
            raise ValueError(f"{name}: expected the default, {default!r}, {why}, got {reprlib.repr(v)}")
    for name, v in buffer_kwargs.items():
        raise ValueError(f"{name}: expected no {name} {why}, got {reprlib.repr(v)}")


def _sharded_args(n_shards, actors, seed, capacity, actor_options, log_options, unused):
    """ShardedReplay's arguments, checked before any actor is started or
    called: (n_shards, actors as a list or None, seed, capacity). n_shards
    an int >= 1 (None with actors=, or len(actors)); seed None or an int
    that every shard's buffer takes as seed + i (the buffer's [0, 2**64));
    capacity None or the buffer's int in [1, 2**63 - 1]; actor_options and
    log_options None or dicts. A float was truncated or reached range() or
    the shards' buffers only after they were started, a bool counted as 0
    or 1, and a string failed in a comparison naming nothing. With actors=,
    unused (the arguments of _SHARD_DEFAULTS, and the buffer arguments)
    must be at their defaults: they were ignored."""
    if actors is None:
        n = int_arg("n_shards", n_shards, 1, None, "an int >= 1 (the shards to start; or actors=)")
        n_shards = n
    else:
        actors = _list_arg("actors", actors, "a list of ReplayActors")
        if not actors:
            raise ValueError("actors: expected at least one ReplayActor, got an empty list")
        _unused_with_actors(*unused)
        n = len(actors)
        if n_shards is not None:
            want = f"None or len(actors), {n}"
            k = int_arg("n_shards", n_shards, 1, None, want)
            if k != n:
                raise ValueError(f"n_shards: expected {want}, got {k}")
            n_shards = n
    if seed is not None:
        # shard i's buffer takes seed + i (started here), which must be a seed too
        hi = (1 << 64) - (n if actors is None else 1)
        seed = int_arg("seed", seed, 0, hi, f"an int in [0, 2**64 - {n if actors is None else 1}] or None")
    if capacity is not None:
        capacity = int_arg("capacity", capacity, 1, (1 << 63) - 1, "an int in [1, 2**63 - 1] or None")
    for name, v in (("actor_options", actor_options), ("log_options", log_options)):
        if v is not None and not isinstance(v, Mapping):
            raise TypeError(f"{name}: expected None or a dict, got {type_name(v)}")
    return n_shards, actors, seed, capacity


def _shard_check(impl, selectors, capacity, seed, log_dir, log_options, buffer_kwargs) -> None:
    """What every shard that ShardedReplay starts checks as it starts
    (ReplayServer: the selectors, impl, the form of its log, the buffer's
    arguments, the selectors' parameters), checked here first with the
    same errors, by building shard 0's buffer and selectors in this
    process; the others differ only in their seed, which _sharded_args
    checked. A buffer allocates no storage when built (it stores each
    episode as it comes), so this takes microseconds whatever the capacity
    and the state shape. Before, a bad argument showed up as shards that
    died as they started. log and buffer are ReplayServer's own keywords,
    which ShardedReplay sets (log_dir=) or does not take. log_dir is a
    path, and log_options, used only with it, ExperienceLog's options but
    dir and source, which ShardedReplay sets (they were overridden)."""
    for name, instead in (("log", "ShardedReplay takes log_dir= and log_options="),
                          ("buffer", "every shard builds its own; actors= serves existing ones")):
        if name in buffer_kwargs:
            raise TypeError(f"{name}: expected no {name}= ({instead}), got "
                            f"{type_name(buffer_kwargs[name])}")
    specs = _selector_specs(selectors)
    cls = _buffer_class(impl)
    if log_dir is None:
        if log_options is not None:
            raise ValueError(f"log_options: expected None without log_dir= (it is not used), got "
                             f"{reprlib.repr(log_options)}")
    else:
        path_arg("log_dir", log_dir)
        for k in log_options or {}:
            if not isinstance(k, str):
                raise TypeError(f"log_options: expected ExperienceLog's options (str keys), got a key "
                                f"of type {type_name(k)}")
            if k in ("dir", "source"):
                raise ValueError(f"log_options: expected ExperienceLog's options but dir and source "
                                 f"(ShardedReplay sets them: log_dir=, and each shard's number), got "
                                 f"{k!r}")
        if cls is not exreplay.ExperienceReplay:
            raise ValueError(f"log_dir: expected None with impl='reference' (the experience log needs "
                             f"impl='c'), got {log_dir!r}")
    buf = cls(capacity=capacity, seed=seed, **buffer_kwargs)
    for kind, params in (specs if specs is not None else [(PickSelectorClass.Prioritized, {})]):
        buf.new_pick_selector(kind, **params)
    if log_dir is not None:
        _probe_log(buf, log_options)


def _probe_log(buf, log_options) -> None:
    """What each shard does with log_options as it starts (ExperienceLog's
    checks of every option, then attach_log's of the log's record layout
    against the buffer's), done first on a log in a temporary directory,
    gone afterwards, with the same errors: a bad option or a layout that
    differs is refused before any shard starts, instead of by shards that
    die as they start."""
    import os
    import tempfile

    with tempfile.TemporaryDirectory(prefix="exreplay-log-check-") as d:
        log = exreplay.ExperienceLog(os.path.join(d, "replay-0.xlog"), source=0,
                                     **dict(log_options or {}))
        try:
            buf.attach_log(log)
            buf.detach_log()
        finally:
            log.close()


class _EpisodesStream:
    """The stream id under which ShardedReplay.record_episode sends whole
    episodes: equal only to itself (across pickling too), so that no
    sender's own stream id can share its bookkeeping on a shard."""

    def __eq__(self, other):
        return isinstance(other, _EpisodesStream)

    def __hash__(self):
        return hash(_EpisodesStream.__qualname__)

    def __repr__(self):
        return "<record_episode's stream>"


_EPISODES = _EpisodesStream()


# A stream's record calls not yet known to be done are kept in its routing
# state (end_stream waits for them). Once there are this many, the finished
# ones are pruned (ray.wait with timeout 0), and again once the rest has
# doubled, so that a sender pays for a prune about once per this many calls.
_PRUNE_AT = 64


class ShardedReplay:
    """Several ReplayActors used as one replay.

    n_shards: how many ReplayActors to start (``actor_options`` go to
    ``ReplayActor.options``; by default ``scheduling_strategy="SPREAD"`` so
    that Ray places them on different nodes where it can), with
    ``capacity`` split evenly and buffer seeds ``seed + i``. Or ``actors=``:
    existing ReplayActors built with the same selectors (n_shards then None
    or their number). n_shards, seed and capacity are checked before any
    actor is started, each as an int (a bool or a float a TypeError naming
    it): n_shards >= 1, seed None or in [0, 2**64 - n_shards] (every
    shard's seed is one the buffer takes), capacity None or the buffer's
    [1, 2**63 - 1]. With actors=, the arguments that only shape the shards
    started here (selectors, capacity, actor_options, impl, log_dir,
    log_options, the buffer's arguments) must be left at their defaults: a
    ValueError naming the first one otherwise (they were ignored).

    - Inserts (``record_rollout``, ``record_episode``) go to the shards round
      robin by episode: an episode is never split; the piece that continues a
      sender's open episode goes where that episode is.
    - ``get_batch`` splits the batch across shards by a multinomial draw with
      probabilities proportional to each shard's total draw weight (picks for
      uniform, sum of p**alpha for prioritized), lets each shard draw its
      share, shuffles the rows together and renormalises the importance
      weights with the smallest positive p**alpha over *all* shards: the
      result has the distribution and the weights of one buffer holding the
      union of the shards.
    - A batch's ``pick_epi`` encodes the shard: ``pick_epi = epi * n_shards + shard``
      (``decode`` inverts it); ``set_priority`` routes each update to its shard.

    - ``end_stream(stream)`` waits for this copy's record calls of the
      stream, makes every shard forget it, and drops its routing state; the
      stream id can then start anew (seq 0, a new episode), from this copy or
      from another one.

    The object is picklable (it holds actor handles) and can be handed to
    Ray tasks and actors; each copy keeps its own per-stream routing state, so
    give each sender its own stream id. A copy takes the routing state as it
    is, but not the record calls in flight: those only the copy that sent
    them waits for.
    """

    def __init__(self, n_shards: int | None = None, *, actors=None, seed: int | None = None,
                 selectors=_SHARD_DEFAULTS["selectors"], capacity: int | None = 1_000_000,
                 actor_options: dict | None = None, impl: str = "c", log_dir: str | None = None,
                 log_options: dict | None = None, **buffer_kwargs):
        unused = (dict(selectors=selectors, capacity=capacity, actor_options=actor_options, impl=impl,
                       log_dir=log_dir, log_options=log_options), buffer_kwargs)
        n_shards, actors, seed, capacity = _sharded_args(n_shards, actors, seed, capacity, actor_options,
                                                         log_options, unused)
        if actors is None:
            cap = None if capacity is None else -(-capacity // n_shards)
            _shard_check(impl, selectors, cap, seed, log_dir, log_options, buffer_kwargs)
        ray = _ray()
        if actors is None:
            opts = {"scheduling_strategy": "SPREAD"} if n_shards > 1 else {}
            opts.update(actor_options or {})
            Actor = _make_actor_class()
            actors = [
                Actor.options(**opts).remote(
                    impl=impl, selectors=selectors, capacity=cap,
                    seed=None if seed is None else seed + i,
                    log=None if log_dir is None else dict(log_options or {}, dir=log_dir, source=i),
                    **buffer_kwargs)
                for i in range(n_shards)
            ]
        self.shards = list(actors)
        self.n = len(self.shards)
        self._selectors = ray.get(self.shards[0].selectors.remote())
        self._rng = np.random.default_rng(seed)
        self._streams: dict[Hashable, dict] = {}
        self._last_stats: dict[int, list] = {}
        # The routing state (_streams), for threads sharing this copy; never
        # held while waiting for a call. get_batch needs none: it makes single
        # dict operations on _last_stats, and _rng has a lock of its own.
        self._mu = threading.Lock()

    # -- helpers ---------------------------------------------------------------------

    def decode(self, pick_epi):
        """(shard, epi) arrays from a sharded batch's pick_epi (an integer
        array, a list of ints, an int or a NumPy integer scalar; a scalar
        gives two scalars). Anything else, a bool or a float included, is a
        TypeError, and a value no batch holds (below 0, or beyond int64) a
        ValueError, both naming pick_epi."""
        e = _pick_epi_arg(pick_epi)
        return e % self.n, e // self.n

    def wait_ready(self, timeout: float = 60.0) -> None:
        _ray().get([s.ping.remote() for s in self.shards], timeout=timeout)

    def __getstate__(self):
        # A copy continues the routing (open shard, seq, turn) but starts with
        # none of this copy's calls in flight and none of their errors.
        with self._mu:
            state = dict(self.__dict__)
            del state["_mu"]
            state["_streams"] = {
                k: dict(v, seq=None if v["seq"] is None else list(v["seq"]), pending=[],
                        prune_at=_PRUNE_AT, error=None)
                for k, v in self._streams.items()}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._mu = threading.Lock()

    # -- writers ---------------------------------------------------------------------

    def record_rollout(self, stream: Hashable, rollout: Rollout, wait: bool = False):
        """Send a Rollout of sender `stream`; returns the ObjectRefs (or, with
        wait=True, the number of records added, once every shard's call is
        done; an error is raised only then). end_stream ends the stream.
        wait is a flag as the buffer takes its own (a bool, an int, a NumPy
        bool or integer; anything else, a TypeError before anything is
        sent)."""
        _stream_arg(stream)
        if not isinstance(rollout, Rollout):
            raise TypeError(f"rollout: expected a Rollout, got {type_name(rollout)}")
        wait = truth_arg("wait", wait)
        return self._send(stream, rollout, wait, numbered=True)

    def _send(self, stream: Hashable, rollout: Rollout, wait: bool, numbered: bool):
        """record_rollout; numbered=False sends no seq (whole episodes, which
        need no order and may come from every copy of this object at once)
        and keeps none of its calls. The priorities are checked before
        anything is routed: each shard checks only its own pieces', so a bad
        one would be refused by its shard after the others had recorded
        theirs."""
        ray = _ray()
        _check_priorities(rollout.priorities)
        with self._mu:
            st = self._streams.get(stream)
            if st is None:
                st = self._streams[stream] = {
                    "open": None, "seq": [0] * self.n if numbered else None,
                    "rr": _stable_hash(stream) % self.n, "pending": [], "prune_at": _PRUNE_AT,
                    "error": None}
            refs = self._route(stream, st, rollout)
            keep = st["seq"] is not None  # a numbered stream's calls, for end_stream
            if not wait:
                if keep:
                    self._keep(st, refs)
                return refs
        settled = False
        try:
            n = sum(ray.get(refs))
            settled = True
            return n
        except Exception:
            # ray.get raises at the first error it finds, maybe while the
            # other shards' calls still run: raise once all of them are done.
            ray.wait(refs, num_returns=len(refs))
            settled = True
            raise
        finally:
            if not settled and keep:  # interrupted: end_stream waits for them
                with self._mu:
                    self._keep(st, refs)

    def _route(self, stream: Hashable, st: dict, rollout: Rollout) -> list:
        """Sends the rollout's pieces to their shards, numbered in st (which
        it advances); returns the calls' ObjectRefs. _mu held."""
        groups: dict[int, list] = {}
        for a, b, j in rollout.pieces():
            if a == b and st["open"] is None:
                continue  # a rollout of no rows, no episode open on any shard: nothing to end
            if a == 0 and st["open"] is not None:
                shard = st["open"]
            else:
                shard = st["rr"]
                st["rr"] = (shard + 1) % self.n
            groups.setdefault(shard, []).append((a, b, j))
            st["open"] = shard if j is None else None
        refs = []
        for shard, pieces in groups.items():
            sub = rollout if len(groups) == 1 else rollout.take(pieces)
            if st["seq"] is None:
                refs.append(self.shards[shard].record_rollout.remote(stream, sub, None))
            else:
                refs.append(self.shards[shard].record_rollout.remote(stream, sub, st["seq"][shard]))
                st["seq"][shard] += 1
        return refs

    def _keep(self, st: dict, refs: list) -> None:
        """Keep a stream's record calls for end_stream; past st["prune_at"]
        of them, drop the finished ones (ray.wait with no timeout: it does
        not wait), noting the first error among them. _mu held."""
        p = st["pending"]
        p.extend(refs)
        if len(p) < st["prune_at"]:
            return
        ray = _ray()
        done, rest = ray.wait(p, num_returns=len(p), timeout=0)
        if done and st["error"] is None:
            try:
                ray.get(done)
            except Exception as e:
                st["error"] = e
        st["pending"] = rest
        st["prune_at"] = max(_PRUNE_AT, 2 * len(rest))

    def end_stream(self, stream: Hashable) -> None:
        """End sender `stream`: the same id can then start anew (seq 0, and a
        new episode), from this copy or from another one.

        In order: waits until every record call of the stream that this copy
        sent is done (so a rollout sent with wait=False just before is
        recorded, not dropped); then has every shard forget the stream
        (ReplayServer.end_stream: its open episode stays, unended) and waits
        for that; then drops this copy's routing state of it. If one of those
        calls raised (a rollout refused, a shard lost), the stream is still
        ended on every shard that answers and forgotten here, and then one
        error is raised: the first found among the stream's record calls
        sent with wait=False, else a shard's end_stream error. (A wait=True
        call raised its own error and is not raised again.)

        Calls of the stream sent by other copies of this object are not
        waited for (each copy keeps its own routing state): end a stream
        from a fresh copy, as a restarted sender does, only once the old
        sender's calls are over, and give each live sender its own stream id.
        Returns None.
        """
        _stream_arg(stream)
        ray = _ray()
        with self._mu:
            st = self._streams.get(stream)
            err = None if st is None else st["error"]
            pending = [] if st is None else list(st["pending"])
        if st is not None:
            if pending:
                # A call whose rollout comes before its predecessor returns
                # with the rollout held, unrecorded; but once every call of the
                # stream has returned, every rollout of it is recorded.
                # ReplayServer.record_rollout: a call holds its rollout and, if
                # no drain runs and the next number is held, drains; a drain
                # records the next one while it is held and stops, under
                # _streams_mu, only when it is not; a call that holds the next
                # number while no drain runs starts one. So whenever no drain
                # runs, the next number is not held, and a drain's call returns
                # only after its last recording. With all calls returned (none
                # draining) and this copy's numbers 0..k on each shard all sent,
                # each shard's next number is k + 1: every one was recorded (or
                # failed, and its error is raised by the call that drained it).
                # (A KeyboardInterrupt inside a drain leaves the held rollouts
                # to the stream's next call; end_stream then drops them.)
                ray.wait(pending, num_returns=len(pending))
                if err is None:
                    try:
                        ray.get(pending)
                    except Exception as e:
                        err = e
        ends = [s.end_stream.remote(stream) for s in self.shards]
        if ends:
            ray.wait(ends, num_returns=len(ends))
            try:
                ray.get(ends)
            except Exception as e:
                err = e if err is None else err
        with self._mu:
            if self._streams.get(stream) is st:
                self._streams.pop(stream, None)
        if err is not None:
            raise err

    def record_episode(self, states, actions, rewards, final_state=None, terminated=True,
                       priorities=None, wait: bool = False, extras=None):
        """One whole episode (ended), to the next shard in turn. It is sent
        without a seq: every copy of this object may record episodes at once.
        terminated and wait are flags as the buffer takes its own (a bool, a
        NumPy bool, an int or a NumPy integer; anything else, an array
        included, a TypeError before anything is sent)."""
        terminated = truth_arg("terminated", terminated)
        wait = truth_arg("wait", wait)
        fs = None if final_state is None else _map(lambda x: np.asarray(x)[None], final_state)
        T = len(actions)
        if T < 1:  # a rollout of no rows would end another episode of the stream: none here
            raise ValueError(f"rollout: expected T >= 1 rows in states, actions, rewards, got {T}")
        r = Rollout(states, actions, rewards, priorities, ends=[T], final_states=fs,
                    terminated=[terminated], extras=extras)
        return self._send(_EPISODES, r, wait, numbered=False)

    # -- learner ---------------------------------------------------------------------

    def priority_stats(self, ps: int = 0):
        """(total, min_positive, picks) over all shards; ps checked against
        the shards' selectors first, as get_batch checks it."""
        ps = _handle_arg(ps, self._selectors)
        st = _ray().get([s.priority_stats.remote(ps) for s in self.shards])
        return (float(sum(s[0] for s in st)), float(min(s[1] for s in st)), int(sum(s[2] for s in st)))

    def get_batch(self, batch_size: int, ps: int = 0, n_batches: int | None = None, fresh_stats: bool = True,
                  *, shared_next: bool = False):
        """A Batch (or n_batches of them) drawn across all shards as from one buffer.

        fresh_stats=True reads every shard's priority_stats first (two round
        trips per call, exact). fresh_stats=False splits by the stats that the
        previous call brought back (one round trip; the split lags one call).
        fresh_stats is a flag as shared_next is (the buffer's rule).
        shared_next (keyword-only): batches in the layout of
        get_batch(..., shared_next=True); the shards' state_seq are put
        together (not state and state_next), and each batch's state and
        state_next are views of its own state_seq.
        """
        ray = _ray()
        ps = _handle_arg(ps, self._selectors)
        fresh_stats = truth_arg("fresh_stats", fresh_stats)
        shared_next = truth_arg("shared_next", shared_next)
        batch_size, n = _batch_counts(batch_size, n_batches)
        if self.n == 1:
            return ray.get(self.shards[0].get_batch.remote(batch_size, ps, n_batches, shared_next=shared_next))
        kind, _alpha, beta = self._selectors[ps]
        total_n = batch_size * n
        stats = self._last_stats.get(int(ps)) if not fresh_stats else None
        if stats is None:
            stats = ray.get([s.priority_stats.remote(ps) for s in self.shards])
        totals = np.array([s[0] for s in stats], dtype=np.float64)
        if not totals.sum() > 0:
            self._last_stats.pop(int(ps), None)
            raise ValueError("get_batch: expected at least one pick with a positive priority in some shard, got none")
        counts = self._rng.multinomial(total_n, totals / totals.sum())
        drawn = [i for i in range(self.n) if counts[i] > 0]
        try:
            res = ray.get([self.shards[i].get_batch.remote(int(counts[i]), ps, None, True, shared_next=shared_next)
                           for i in drawn])
        except Exception:
            self._last_stats.pop(int(ps), None)  # stale: the next call reads fresh stats
            raise
        stats = list(stats)
        for i, (_b, st) in zip(drawn, res):
            stats[i] = st
        self._last_stats[int(ps)] = stats
        cols = [[] for _ in range(10)]
        gmin = min(s[1] for s in stats)
        for i, (b, st) in zip(drawn, res):
            f = _batch_fields(b)
            for k in range(10):
                cols[k].append(f[k])
            cols[6][-1] = f[6] * self.n + i
            if kind == "prioritized" and beta and st[1] != gmin:
                cols[8][-1] = (f[8].astype(np.float64) * (gmin / st[1]) ** beta).astype(np.float32)
        perm = self._rng.permutation(total_n)
        idx = _cat_pick_index([b for b, _st in res])
        idx = None if idx is None else idx[perm]
        # shared next states: the shards' state_seq put together, and state
        # and state_next made its views (make_batch), not copied apart
        seq = _cat_state_seq([b for b, _st in res])
        seq = None if seq is None else _map(lambda a: a[perm], seq)
        arrays = [None if seq is not None and k in (0, 3) else _map(lambda a: a[perm], _cat(c))
                  for k, c in enumerate(cols)]
        out = make_batch(res[0][0], arrays, idx, state_seq=seq)
        return out if n_batches is None else split_batch(out, n)

    def set_priority(self, ps: int, pick_epi, pick_pos, priorities, wait: bool = False, pick_index=None):
        """Route each update to its shard; returns the ObjectRefs (or, with
        wait=True, how many were applied). pick_index: the batch's (each
        shard's own table indices), passed on with each shard's picks.

        Every argument is checked first, with the buffer's set_priority rules
        and messages (docs/api.md, set_priority), ps against the shards'
        selectors, and wait as a flag as the buffer takes its own (a bool, a
        NumPy bool, an int or a NumPy integer): a refused call raises here and sends nothing,
        so no shard applies a part of it."""
        ray = _ray()
        ps = _handle_arg(ps, self._selectors)
        epi, pos, pri, idx = _priority_update(pick_epi, pick_pos, priorities, pick_index)
        wait = truth_arg("wait", wait)
        if self.n == 1:
            refs = [self.shards[0].set_priority.remote(ps, epi, pos, np.ascontiguousarray(pri), idx)]
        else:
            shard, local = epi % self.n, epi // self.n
            refs = []
            for i in np.unique(shard):
                m = shard == i
                refs.append(self.shards[int(i)].set_priority.remote(
                    ps, local[m], pos[m], np.ascontiguousarray(pri[m]), None if idx is None else idx[m]))
        return sum(ray.get(refs)) if wait else refs

    def set_beta(self, ps: int, beta: float) -> None:
        """Set beta of selector ps on every shard (annealing). ps is checked
        against the shards' selectors and beta as the buffer's
        PickSelector.beta takes it, with its errors (a finite real number
        >= 0, "beta: expected a finite number >= 0, got -1"; a uniform
        selector has none), before any shard is sent anything."""
        ps = _handle_arg(ps, self._selectors)
        kind, alpha, _ = self._selectors[ps]
        beta = _beta_arg(kind, beta)
        _ray().get([s.set_beta.remote(ps, beta) for s in self.shards])
        self._selectors[ps] = (kind, alpha, beta)

    # -- control ---------------------------------------------------------------------

    def stats(self) -> dict:
        """Summed counters and rates over the shards, plus "shards": each one's stats."""
        per = _ray().get([s.stats.remote() for s in self.shards])
        out = {}
        for k in per[0]:
            if k in ("interval_s", "uptime_s"):
                out[k] = max(p[k] for p in per)
            else:
                out[k] = sum(p[k] for p in per)
        out["shards"] = per
        return out

    def buffers(self) -> list:
        """Every shard's whole buffer (through the object store)."""
        return _ray().get([s.buffer.remote() for s in self.shards])

    def gather_logs(self, dest_dir: str, output: str | None = None, **kwargs) -> dict:
        """gather_logs over the shards (see the module function)."""
        return gather_logs(self.shards, dest_dir, output, **kwargs)

    def shutdown(self) -> None:
        ray = _ray()
        for s in self.shards:
            ray.kill(s)
        self.shards = []


# --- the experience log on Ray ------------------------------------------------------


def _gather_replays(replays, ray) -> tuple[list, list]:
    """gather_logs' replays as a list, with each one's log_info: a non-empty
    list of ReplayActors, every one with a log of its own source (a record's
    source names its writer, and a shipped log is named by it), or the error
    naming replays, before any log is closed."""
    if isinstance(replays, (str, bytes)) or not isinstance(replays, Iterable):
        raise TypeError(f"replays: expected a list of ReplayActors, got {type_name(replays)}")
    replays = list(replays)
    if not replays:
        raise ValueError("replays: expected at least one ReplayActor, got none")
    odd = [k for k, r in enumerate(replays) if not hasattr(r, "log_info")]
    if odd:
        raise TypeError(f"replays: expected ReplayActors, got {type_name(replays[odd[0]])} at "
                        f"position {odd[0]}")
    before = ray.get([r.log_info.remote() for r in replays])
    missing = [k for k, i in enumerate(before) if i is None]
    if missing:
        raise ValueError(f"replays: expected ReplayActors with a log (built with log=), "
                         f"got replays without one at positions {missing}")
    by_source: dict = {}
    for k, i in enumerate(before):
        by_source.setdefault(i["source"], []).append(k)
    twice = sorted((s, ks) for s, ks in by_source.items() if len(ks) > 1)
    if twice:
        s, ks = twice[0]
        raise ValueError(f"replays: expected logs of distinct sources (a record's source names "
                         f"its writer), got source {s} at positions {ks}")
    return replays, before


def gather_logs(replays, dest_dir: str, output: str | None = None, *, force_ship: bool = False,
                piece_bytes: int = 8 << 20, level: int = 1, progress=None) -> dict:
    """Closes the experience logs of ReplayActors (built with ``log=`` or a
    ShardedReplay with ``log_dir=``) and merges them into ``output``
    (default ``dest_dir/merged.xlog``) in timestamp order; returns
    ``exreplay.log.info`` of it. An existing ``output`` is replaced, as
    ``exreplay.log.merge(..., overwrite=True)`` replaces it: in one rename
    once the merged log is complete and on disk, so that a gather that fails
    or is killed meanwhile leaves the old file as it was (docs/ray.md,
    "The experience log on Ray").

    A log on this process's node is read where it is; one on another node
    (or every one, with ``force_ship``) is copied into ``dest_dir`` through
    Ray in pieces of ``piece_bytes``, one at a time, so neither side holds
    more than a piece. Logs are merged in source order, so records with
    equal timestamps keep it. If one of the replays has no log, two have
    logs of one source, or an
    argument is refused (a TypeError or ValueError naming it), no log is
    closed and no file is touched.
    """
    import os

    import exreplay.log as xlog
    from exreplay._args import int_arg, path_arg

    dest_dir = os.fsdecode(path_arg("dest_dir", dest_dir))
    output, level, _, progress, _ = xlog._check_merge_options(
        os.path.join(dest_dir, "merged.xlog") if output is None else output, level, 1, progress,
        None)
    output = os.fsdecode(output)
    force_ship = truth_arg("force_ship", force_ship)
    piece_bytes = int_arg("piece_bytes", piece_bytes, 1, None, "an int >= 1")
    ray = _ray()
    replays, before = _gather_replays(replays, ray)
    # output is replaced: it must not be one of the files merged
    inputs = [i["path"] for i in before] + [os.path.join(dest_dir, f"shipped-{i['source']}.xlog")
                                            for i in before]
    same = [p for p in inputs if os.path.realpath(p) == os.path.realpath(output)]
    if same:
        raise ValueError(f"output: expected a path other than the logs merged (it is replaced), "
                         f"got {output!r}, which is {same[0]!r}")
    infos = ray.get([r.log_close.remote() for r in replays])
    here = ray.get_runtime_context().get_node_id()
    os.makedirs(dest_dir, exist_ok=True)
    local = []
    shipped = 0
    for r, info in sorted(zip(replays, infos), key=lambda x: x[1]["source"]):
        path = info["path"]
        if not force_ship and info["node_id"] == here and os.path.exists(path):
            local.append(path)
            continue
        dst = os.path.join(dest_dir, f"shipped-{info['source']}.xlog")
        with open(dst, "wb") as f:
            off = 0
            while off < info["bytes"]:
                piece = ray.get(r.log_read.remote(off, piece_bytes))
                if not piece:
                    break
                f.write(piece)
                off += len(piece)
                shipped += len(piece)
        local.append(dst)
    # an existing output stays as it was until the merged log replaces it in
    # one rename, complete (merge's overwrite, as save replaces its file)
    out = xlog.merge(local, output, level=level, progress=progress, overwrite=True)
    out["inputs"] = local
    out["shipped_bytes"] = shipped
    out["writers"] = [i["stats"] for i in infos]
    return out

