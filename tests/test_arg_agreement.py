"""The C buffer and the reference accept and refuse the same arguments.

For every argument of every public method, a set of odd values (bools, NumPy
scalars, huge ints, floats, strings, None, sequences, arrays) is passed to
both implementations built the same way.  Each call must end the same way in
both: success, or the same exception type.  After a success the two buffers
must hold the same records and picks; after a failure each must be exactly as
it was (docs/semantics.md, "Inputs and errors").

This is what keeps docs/semantics.md's argument rules true of both
implementations: a new argument rule in one of them shows up here as a
disagreement.
"""

import math

import numpy as np
import pytest

import exreplay
from exreplay import PickSelectorClass
from exreplay.reference import ReferenceReplay

IMPLS = (ReferenceReplay, exreplay.ExperienceReplay)


class _Opaque:
    """An object with no numeric, sequence or truth protocol of its own."""


class _OpaqueArray(np.ndarray):
    """An ndarray subclass defined in Python."""


# Values whose handling differs most between "anything numpy.asarray takes"
# and a strict argument parser.
ODD = {
    "True": True,
    "False": False,
    "0": 0,
    "1": 1,
    "-1": -1,
    "3": 3,
    "2**31": 2**31,
    "2**62": 2**62,
    "2**63": 2**63,
    "-2**63-1": -(2**63) - 1,
    "2**64": 2**64,
    "-2**64": -(2**64),
    "2**1024": 2**1024,
    "1.0": 1.0,
    "1.5": 1.5,
    "nan": math.nan,
    "inf": math.inf,
    "1j": 1j,
    "str": "x",
    "bytes": b"x",
    "None": None,
    "[]": [],
    "[1]": [1],
    "[1, 2]": [1, 2],
    "[1, True]": [1, True],
    "[1.0, np.True_]": [1.0, np.True_],
    "np.int64(1)": np.int64(1),
    "np.uint8(1)": np.uint8(1),
    "np.bool_(True)": np.bool_(True),
    "np.float32(1)": np.float32(1.0),
    "np.array(1)": np.array(1),
    "np.array(1.0)": np.array(1.0),
    "np.array(True)": np.array(True),
    "np.array(1+1j)": np.array(1 + 1j),
    "np.array([1])": np.array([1]),
    "np.array([1.0])": np.array([1.0]),
    "object": _Opaque(),
}


def outcome(fn):
    """None on success, else the exception's type."""
    try:
        fn()
    except Exception as ex:  # the type is what is compared
        return type(ex)
    return None


def contents(buf):
    """Everything observable about a buffer's records and picks."""
    eps = []
    for h in buf._handles():
        d = buf.episode(h)
        fs = None if d.final_state is None else d.final_state.tobytes()
        eps.append((h, d.state.tobytes(), d.action.tobytes(), d.reward.tobytes(), fs,
                    d.ended, d.terminated))
    epi, pos = buf._picks()
    return len(buf), eps, sorted(zip(epi.tolist(), pos.tolist()))


def filled(cls, **kw):
    """A buffer with two episodes (one ended), a uniform and a prioritized selector."""
    cfg = dict(state_shape=(2,), capacity=100, pick_len=2, seed=0)
    cfg.update(kw)
    buf = cls(**cfg)
    h = None
    for t in range(5):
        h = buf.record(h, np.full(2, t, np.float32), t, 1.0)
    buf.record(h, np.zeros(2, np.float32), 0, 0.0, final_state=np.ones(2, np.float32))
    h = None
    for t in range(3):
        h = buf.record(h, np.full(2, -t, np.float32), t, 0.5)
    u = buf.new_pick_selector(PickSelectorClass.Uniform)
    p = buf.new_pick_selector(PickSelectorClass.Prioritized, alpha=0.6, beta=0.4)
    return buf, h, u, p


def agree(call, values=ODD):
    """Runs call(buf, h, u, p, value) on both implementations for each value."""
    disagreements = {}
    for name, v in values.items():
        results = []
        for cls in IMPLS:
            buf, h, u, p = filled(cls)
            before = contents(buf)
            out = outcome(lambda: call(buf, h, u, p, v))
            after = contents(buf)
            if out is not None:
                assert after == before, f"{cls.__name__} changed after {out.__name__} for {name}"
            results.append((out, after))
        (ro, rc), (co, cc) = results
        if ro != co:
            disagreements[name] = (getattr(ro, "__name__", "ok"), getattr(co, "__name__", "ok"))
        elif ro is None and rc != cc:
            disagreements[name] = ("ok, different contents", "")
    assert not disagreements, f"reference vs C: {disagreements}"


S = np.zeros(2, np.float32)
S2 = np.zeros((2, 2), np.float32)

RECORD_ARGS = {
    "h": lambda b, h, u, p, v: b.record(v, S, 0, 0.0),
    "state": lambda b, h, u, p, v: b.record(h, v, 0, 0.0),
    "action": lambda b, h, u, p, v: b.record(h, S, v, 0.0),
    "reward": lambda b, h, u, p, v: b.record(h, S, 0, v),
    "final_state": lambda b, h, u, p, v: b.record(h, S, 0, 0.0, final_state=v),
    "terminated": lambda b, h, u, p, v: b.record(h, S, 0, 0.0, terminated=v),
    "priority": lambda b, h, u, p, v: b.record(h, S, 0, 0.0, priority=v),
}

RECORD_MANY_ARGS = {
    "h": lambda b, h, u, p, v: b.record_many(v, S2, [0, 1], [0.0, 0.0]),
    "states": lambda b, h, u, p, v: b.record_many(h, v, [0, 1], [0.0, 0.0]),
    "actions": lambda b, h, u, p, v: b.record_many(h, S2, v, [0.0, 0.0]),
    "rewards": lambda b, h, u, p, v: b.record_many(h, S2, [0, 1], v),
    "final_state": lambda b, h, u, p, v: b.record_many(h, S2, [0, 1], [0.0, 0.0], final_state=v),
    "terminated": lambda b, h, u, p, v: b.record_many(h, S2, [0, 1], [0.0, 0.0], terminated=v),
    "priorities": lambda b, h, u, p, v: b.record_many(h, S2, [0, 1], [0.0, 0.0], priorities=v),
}

# h is the open episode; episode 0 has ended, and handles from 2 on were never made
END_EPISODE_ARGS = {
    "h": lambda b, h, u, p, v: b.end_episode(v, terminated=True),
    "final_state": lambda b, h, u, p, v: b.end_episode(h, final_state=v),
    "terminated": lambda b, h, u, p, v: b.end_episode(h, terminated=v),
    "terminated with final_state": lambda b, h, u, p, v: b.end_episode(h, S, terminated=v),
}

SELECTOR_ARGS = {
    "kind": lambda b, h, u, p, v: b.new_pick_selector(v),
    "alpha": lambda b, h, u, p, v: b.new_pick_selector(PickSelectorClass.Prioritized, alpha=v),
    "beta": lambda b, h, u, p, v: b.new_pick_selector(PickSelectorClass.Prioritized, beta=v),
    "beta=": lambda b, h, u, p, v: setattr(p, "beta", v),
    "remove": lambda b, h, u, p, v: b.remove_pick_selector(v),
    "pick_selector": lambda b, h, u, p, v: b.pick_selector(v),
    "pick_selector.beta=": lambda b, h, u, p, v: setattr(b.pick_selector(int(p)), "beta", v),
}

BATCH_ARGS = {
    "batch_size": lambda b, h, u, p, v: b.get_batch(v, u),
    "ps": lambda b, h, u, p, v: b.get_batch(2, v),
    "out": lambda b, h, u, p, v: b.get_batch(2, u, out=v),
    "episode": lambda b, h, u, p, v: b.episode(v),
    "remove_episode": lambda b, h, u, p, v: b.remove_episode(v),
}

SET_PRIORITY_ARGS = {
    "ps": lambda b, h, u, p, v: b.set_priority(v, [0], [0], [1.0]),
    "pick_epi": lambda b, h, u, p, v: b.set_priority(p, v, [0], [1.0]),
    "pick_pos": lambda b, h, u, p, v: b.set_priority(p, [0], v, [1.0]),
    "priorities": lambda b, h, u, p, v: b.set_priority(p, [0], [0], v),
}


@pytest.mark.parametrize("arg", sorted(RECORD_ARGS))
def test_record_arguments_agree(arg):
    agree(RECORD_ARGS[arg])


@pytest.mark.parametrize("arg", sorted(RECORD_MANY_ARGS))
def test_record_many_arguments_agree(arg):
    agree(RECORD_MANY_ARGS[arg])


@pytest.mark.parametrize("arg", sorted(END_EPISODE_ARGS))
def test_end_episode_arguments_agree(arg):
    agree(END_EPISODE_ARGS[arg])


@pytest.mark.parametrize("arg", sorted(SELECTOR_ARGS))
def test_selector_arguments_agree(arg):
    agree(SELECTOR_ARGS[arg])


# A batch of 2**31 picks or more is a MemoryError in C but tries to allocate
# in the reference: those sizes are tested against the C buffer alone
# (tests/test_errors.py).
SMALL = {k: v for k, v in ODD.items() if not (isinstance(v, int) and abs(v) >= 2**31)}


@pytest.mark.parametrize("arg", sorted(BATCH_ARGS))
def test_batch_and_episode_arguments_agree(arg):
    agree(BATCH_ARGS[arg], SMALL if arg == "batch_size" else ODD)


@pytest.mark.parametrize("arg", sorted(SET_PRIORITY_ARGS))
def test_set_priority_arguments_agree(arg):
    agree(SET_PRIORITY_ARGS[arg])


def _gone(b, p):
    """p, after it was removed from b: a handle that names no selector."""
    b.remove_pick_selector(p)
    return p


# An argument after ps that is refused as well: the arguments are checked in
# order, so both say that ps names no selector.
AFTER_GONE_PS = {
    "out": lambda b, h, u, p, v: b.get_batch(2, _gone(b, p), out=v),
    "pick_epi": lambda b, h, u, p, v: b.set_priority(_gone(b, p), v, [0], [1.0]),
    "pick_pos": lambda b, h, u, p, v: b.set_priority(_gone(b, p), [0], v, [1.0]),
    "priorities": lambda b, h, u, p, v: b.set_priority(_gone(b, p), [0], [0], v),
    "pick_index": lambda b, h, u, p, v: b.set_priority(_gone(b, p), [0], [0], [1.0], pick_index=v),
}


@pytest.mark.parametrize("arg", sorted(AFTER_GONE_PS))
def test_a_removed_selector_is_named_before_the_arguments_after_it(arg):
    bad = {"str": "x", "object": _Opaque(), "[1, 2]": [1, 2], "1j": 1j}
    agree(AFTER_GONE_PS[arg], bad)
    for cls in IMPLS:
        for v in bad.values():
            buf, h, u, p = filled(cls)
            with pytest.raises(ValueError, match="^ps: expected a pick selector"):
                AFTER_GONE_PS[arg](buf, h, u, p, v)


CONSTRUCTOR_ARGS = (
    "state_shape",
    "state_dtype",
    "action_shape",
    "action_dtype",
    "reward_dtype",
    "capacity",
    "pick_len",
    "allow_short",
    "eviction",
    "seed",
)


@pytest.mark.parametrize("arg", CONSTRUCTOR_ARGS)
def test_constructor_arguments_agree(arg):
    disagreements = {}
    for name, v in ODD.items():
        outs = [outcome(lambda: cls(state_shape=(2,), **{arg: v})) for cls in IMPLS]
        if outs[0] != outs[1]:
            disagreements[name] = tuple(getattr(o, "__name__", "ok") for o in outs)
    assert not disagreements, f"reference vs C: {disagreements}"


def _error(fn):
    """(type, message) of the error fn() raises, or None."""
    try:
        fn()
    except Exception as ex:
        return type(ex), str(ex)
    return None


# A class defined in Python ("object", _Opaque) is shown by its bare name,
# its tp_name, by both.
@pytest.mark.parametrize("name", sorted(ODD))
def test_selector_kind_errors_read_the_same(name):
    """new_pick_selector's kind is refused with one message by both: a
    wrong type shows its type, not the value (the reference showed the
    value's repr, "expected an int, got 1.5 (float)"), and a value out of
    range the value."""
    v = ODD[name]
    errs = [_error(lambda: cls(state_shape=(2,)).new_pick_selector(v)) for cls in IMPLS]
    assert errs[0] == errs[1], name
    if errs[1] is not None:
        assert errs[1][1].startswith("kind: expected a PickSelectorClass (0 to 2), got "), errs[1]


# Every argument's errors read the same in both: the exception's type and
# its message.  The reference showed a wrong value's repr ("pick_len:
# expected an int, got 1.5 (float)") where the C buffer shows its type, and
# worded many expectations its own way.  A class defined in Python is shown
# by its bare name, as CPython's own messages show it (tp_name), by both.
MESSAGE_VALUES = dict(ODD)
MESSAGE_VALUES.update({
    "-1.0": -1.0,
    "np.int64(-1)": np.int64(-1),
    "np.float64(-1.0)": np.float64(-1.0),
    "'float32'": "float32",
    "'x8'": "x8",
    "'complex64'": "complex64",
    "{}": {},
    "()": (),
    "int": int,
    "np.dtype(object)": np.dtype(object),
    "np.zeros((2, 2))": np.zeros((2, 2)),
    "np.ones(1, bool)": np.ones(1, bool),
    # a C type made by PyType_FromSpec is shown by its dotted tp_name
    # ("exreplay._core.ExperienceReplay"), a class defined in Python by its bare one
    "ExperienceReplay": exreplay.ExperienceReplay(2),
    "_Opaque[]": [_Opaque()],
    "_OpaqueArray": np.zeros(2).view(_OpaqueArray),
    "np.array([2**64 - 1], np.uint64)": np.array([2**64 - 1], np.uint64),
})

MESSAGE_CALLS = {
    **{f"record {k}": f for k, f in RECORD_ARGS.items()},
    **{f"record_many {k}": f for k, f in RECORD_MANY_ARGS.items()},
    **{f"end_episode {k}": f for k, f in END_EPISODE_ARGS.items()},
    **{f"selector {k}": f for k, f in SELECTOR_ARGS.items()},
    **{f"get_batch {k}": f for k, f in BATCH_ARGS.items()},
    **{f"set_priority {k}": f for k, f in SET_PRIORITY_ARGS.items()},
    "get_batch shared_next": lambda b, h, u, p, v: b.get_batch(2, u, shared_next=v),
    "set_priority pick_index": lambda b, h, u, p, v: b.set_priority(p, [0], [0], [1.0],
                                                                    pick_index=v),
    "Rank alpha": lambda b, h, u, p, v: b.new_pick_selector(PickSelectorClass.Rank, alpha=v),
    "Rank beta": lambda b, h, u, p, v: b.new_pick_selector(PickSelectorClass.Rank, beta=v),
    **{f"constructor {a}": (lambda a: lambda b, h, u, p, v: type(b)(state_shape=(2,), **{a: v}))(a)
       for a in CONSTRUCTOR_ARGS if a != "state_shape"},
    "constructor state_shape": lambda b, h, u, p, v: type(b)(state_shape=v),
    "constructor state_spec": lambda b, h, u, p, v: type(b)(state_spec=v),
    "constructor state_spec shape": lambda b, h, u, p, v: type(b)(state_spec={"a": (v, "f4")}),
    "constructor state_spec dtype": lambda b, h, u, p, v: type(b)(state_spec={"a": (2, v)}),
    "constructor extras_spec": lambda b, h, u, p, v: type(b)(state_shape=(2,), extras_spec=v),
}


def _error_and_unchanged(cls, call, v):
    """(type, message) of the error call raises on a filled buffer of cls, or
    None; the buffer must be as it was after an error."""
    buf, h, u, p = filled(cls)
    before = contents(buf)
    err = _error(lambda: call(buf, h, u, p, v))
    assert err is None or contents(buf) == before, f"{cls.__name__} changed after {err}"
    return err


@pytest.mark.parametrize("call", sorted(MESSAGE_CALLS))
def test_argument_errors_read_the_same(call):
    disagreements = {}
    for name, v in MESSAGE_VALUES.items():
        if call == "get_batch batch_size" and name not in SMALL:
            continue  # a batch of 2**31 picks or more is not drawn by the reference
        errs = [_error_and_unchanged(cls, MESSAGE_CALLS[call], v) for cls in IMPLS]
        if errs[0] != errs[1]:
            disagreements[name] = errs
    assert not disagreements, f"reference vs C: {disagreements}"


def _emptied(b, h, u, p):
    for e in b._handles():
        b.remove_episode(e)
    return b.get_batch(1, u)


def _shorts(b, h, u, p):
    for e in b._handles():
        b.remove_episode(e)
    b.record(None, S, 0, 0.0)
    b.record(None, S, 0, 0.0)
    return b.get_batch(1, u)


BATCH_FIELDS = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next", "pick_epi",
                "pick_pos", "weight", "pick_index", "extras", "state_seq")


def _swapped(b, u, shared_next=False, **swap):
    """A batch of 2 picks of b with the fields in swap replaced (a callable
    is given the batch's fields by name)."""
    o = b.get_batch(2, u, shared_next=shared_next)
    f = {n: getattr(o, n) for n in BATCH_FIELDS}
    f.update({n: v(dict(f)) if callable(v) else v for n, v in swap.items()})
    if isinstance(b, ReferenceReplay):
        out = type(o)(*(f[n] for n in BATCH_FIELDS[:8]), weight=f["weight"], extras=f["extras"],
                      state_seq=f["state_seq"], pick_index=f["pick_index"])
    else:
        out = type(o)(tuple(f[n] for n in BATCH_FIELDS))
    return out


def _out(b, u, shared_next=False, **swap):
    """get_batch(2, u, out=o) for o, _swapped(b, u, shared_next, **swap)."""
    return b.get_batch(2, u, out=_swapped(b, u, shared_next, **swap), shared_next=shared_next)


BEYOND = np.array([0, 2**64 - 1], np.uint64)  # a uint64 value the cast to int64 would wrap


# Errors of the same calls that no odd value above reaches.
MESSAGE_CASES = {
    "new_pick_selector() unknown parameter": lambda b, h, u, p: b.new_pick_selector(
        PickSelectorClass.Prioritized, beta=0.5, gamma=1, zeta=2),
    "new_pick_selector() parameter of a Uniform": lambda b, h, u, p: b.new_pick_selector(
        PickSelectorClass.Uniform, alpha=0.5),
    "new_pick_selector() parameters in order": lambda b, h, u, p: b.new_pick_selector(
        PickSelectorClass.Rank, beta=-1, alpha="x"),
    "new_pick_selector() no kind": lambda b, h, u, p: b.new_pick_selector(),
    "new_pick_selector() kind by keyword": lambda b, h, u, p: b.new_pick_selector(kind=1),
    "new_pick_selector() two positionals": lambda b, h, u, p: b.new_pick_selector(1, 0.5),
    "alpha=": lambda b, h, u, p: setattr(p, "alpha", 0.5),
    "Uniform beta=": lambda b, h, u, p: setattr(u, "beta", 0.5),
    "del beta": lambda b, h, u, p: delattr(p, "beta"),
    "removed selector's beta=": lambda b, h, u, p: (b.remove_pick_selector(p),
                                                    setattr(p, "beta", np.int64(-1))),
    "get_batch of an empty buffer": _emptied,
    "get_batch with only short episodes": _shorts,
    "get_batch with every priority 0": lambda b, h, u, p: (
        b.set_priority(p, *b._picks(), 0.0), b.get_batch(1, p)),
    "record_many of no step": lambda b, h, u, p: b.record_many(h, np.zeros((0, 2)), [], []),
    "record extras without an extras_spec": lambda b, h, u, p: b.record(h, S, 0, 0.0,
                                                                       extras={}),
    "record_many extras without an extras_spec": lambda b, h, u, p: b.record_many(
        h, S2, [0, 1], [0.0, 0.0], extras=np.zeros(3)),
    "set_priority a scalar nan and no pick": lambda b, h, u, p: b.set_priority(p, [], [],
                                                                              math.nan),
    "set_priority(ps, batch, p, q)": lambda b, h, u, p: b.set_priority(
        p, b.get_batch(2, u), [1.0, 1.0], [1.0, 1.0]),
    "set_priority() no priorities": lambda b, h, u, p: b.set_priority(p, [0], [0]),
    "_gather of a missing pick": lambda b, h, u, p: b._gather(u, [0], [99]),
    # handles, positions and table indices are ints: no bools, no uint64
    # value beyond int64 (docs/api.md, "Input conversion")
    "set_priority bool pick_epi": lambda b, h, u, p: b.set_priority(p, np.ones(2, bool), [0, 0],
                                                                    1.0),
    "set_priority bool pick_pos": lambda b, h, u, p: b.set_priority(p, [0, 0], [False, True],
                                                                    1.0),
    "set_priority bool pick_index": lambda b, h, u, p: b.set_priority(
        p, [0, 0], [0, 1], 1.0, pick_index=np.zeros(2, bool)),
    # a bool among ints or numbers: NumPy alone would read it as 1
    "set_priority pick_epi with a bool": lambda b, h, u, p: b.set_priority(p, [0, True], [0, 0],
                                                                           1.0),
    "set_priority pick_pos with np.bool_": lambda b, h, u, p: b.set_priority(
        p, [0, 0], (0, np.True_), 1.0),
    "set_priority pick_index with a bool": lambda b, h, u, p: b.set_priority(
        p, [0, 0], [0, 1], 1.0, pick_index=[0, True]),
    "set_priority priorities with a bool": lambda b, h, u, p: b.set_priority(p, [0, 0], [0, 1],
                                                                             [2.0, True]),
    "set_priority uint64 pick_epi": lambda b, h, u, p: b.set_priority(p, BEYOND, [0, 0], 1.0),
    "set_priority uint64 pick_pos": lambda b, h, u, p: b.set_priority(p, [0, 0], BEYOND, 1.0),
    "set_priority uint64 pick_index": lambda b, h, u, p: b.set_priority(
        p, [0, 0], [0, 1], 1.0, pick_index=BEYOND),
    "set_priority batch.pick_epi bool": lambda b, h, u, p: b.set_priority(
        p, _swapped(b, u, pick_epi=np.zeros(2, bool)), 1.0),
    "set_priority batch.pick_pos uint64": lambda b, h, u, p: b.set_priority(
        p, _swapped(b, u, pick_pos=BEYOND), 1.0),
    "set_priority batch.pick_index uint64": lambda b, h, u, p: b.set_priority(
        p, _swapped(b, u, pick_index=BEYOND), 1.0),
    "_gather bool pick_epi": lambda b, h, u, p: b._gather(u, np.zeros(1, bool), [0]),
    "_gather uint64 pick_pos": lambda b, h, u, p: b._gather(u, [0, 0], BEYOND),
    "out.action of another dtype": lambda b, h, u, p: _out(
        b, u, action=np.zeros((2, 2), np.float32)),
    "out.weight not C-contiguous": lambda b, h, u, p: _out(
        b, u, weight=np.zeros(4, np.float32)[::2]),
    "out.pick_index None": lambda b, h, u, p: _out(b, u, pick_index=None),
    # a buffer without an extras_spec: out.extras is the {} get_batch made
    "out.extras not a dict": lambda b, h, u, p: _out(b, u, extras=[]),
    "out.extras stale": lambda b, h, u, p: _out(b, u, extras={"logp": np.zeros((2, 2))}),
    "out.state not state_seq's view": lambda b, h, u, p: _out(
        b, u, True, state=lambda f: f["state"].copy()),
    "out.reward over out.state_seq": lambda b, h, u, p: _out(
        b, u, True, reward=lambda f: f["state_seq"].reshape(-1)[:4].reshape(2, 2)),
    "episode(h=)": lambda b, h, u, p: b.episode(h=h),
    "reward_dtype int64": lambda b, h, u, p: type(b)(2, reward_dtype="int64"),
    "state_dtype structured": lambda b, h, u, p: type(b)(2, state_dtype=[("a", "f4")]),
    "state_shape float dimension": lambda b, h, u, p: type(b)((2, 1.5)),
    "state_shape NumPy dimension": lambda b, h, u, p: type(b)((2, np.int64(-3))),
}


@pytest.mark.parametrize("case", sorted(MESSAGE_CASES))
def test_other_errors_read_the_same(case):
    errs = [_error(lambda: MESSAGE_CASES[case](*filled(cls))) for cls in IMPLS]
    assert errs[1] is not None, errs
    if case == "episode(h=)":  # each names its own class: only the type is compared
        assert errs[0][0] is errs[1][0] is TypeError, errs
        return
    assert errs[0] == errs[1]
