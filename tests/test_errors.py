"""Bad inputs on every public method of the C buffer and its constructor.

Each must raise the documented TypeError/ValueError, name the offending
argument in the message, and leave the buffer exactly as it was
(docs/semantics.md, "All validation happens before anything changes").
"""

import math
import re

import numpy as np
import pytest

import exreplay
from exreplay import ExperienceReplay, PickSelectorClass

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized


# ---- the buffer under test and its snapshot ---------------------------------


def populated(**kw):
    """A buffer with open, ended, terminated and empty episodes, a uniform and
    two prioritized selectors (with varied priorities), and some sampled."""
    cfg = dict(state_shape=(4,), seed=7, capacity=200, pick_len=2, allow_short=True,
               eviction="second_chance")
    cfg.update(kw)
    buf = ExperienceReplay(**cfg)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.6, beta=0.4)
    pr2 = buf.new_pick_selector(P, alpha=1.0, beta=1.0)
    rng = np.random.default_rng(0)
    for i in range(6):
        T = 3 + i
        S = rng.normal(size=(T,) + buf.state_shape).astype(buf.state_dtype)
        A = np.arange(T).astype(buf.action_dtype)
        R = rng.normal(size=T)
        buf.record_many(None, S, A, R, final_state=S[0] if i % 3 == 1 else None,
                        terminated=i % 3 == 2, priorities=rng.uniform(0, 3, T) if i % 2 else None)
    h_open = buf.record_many(None, np.ones((3, 4)), [1, 2, 3], [0, 0, 0])
    buf.new_episode()
    e, p = buf._picks()
    buf.set_priority(pr, e[::2], p[::2], np.linspace(0.1, 4, len(e[::2])))
    buf.get_batch(5, u)
    return buf, u, pr, pr2, h_open


def snapshot(buf):
    hs = buf._handles()
    eps = []
    for h in hs:
        ep = buf.episode(h)
        eps.append((h, ep.state.tobytes(), ep.action.tobytes(), ep.reward.tobytes(),
                    None if ep.final_state is None else ep.final_state.tobytes(),
                    ep.ended, ep.terminated))
    e, p = buf._picks()
    picks = sorted(zip(e.tolist(), p.tolist()))
    return dict(len=len(buf), num_episodes=buf.num_episodes, num_picks=buf.num_picks,
                handles=hs, picks=picks, episodes=eps)


def full_snapshot(buf, prio_selectors):
    snap = snapshot(buf)
    if snap["picks"]:
        ee, pp = (np.array(x) for x in zip(*snap["picks"]))
        snap["priorities"] = [buf._priority(ps, ee, pp).tolist() for ps in prio_selectors]
        snap["params"] = [(ps.alpha, ps.beta) for ps in prio_selectors]
    return snap


@pytest.fixture
def env():
    buf, u, pr, pr2, h_open = populated()
    other = ExperienceReplay((4,), seed=1)
    other_ps = other.new_pick_selector(U)
    other.record(None, np.zeros(4), 0, 0.0, terminated=True)
    removed = buf.new_pick_selector(P)
    buf.remove_pick_selector(removed)
    return dict(buf=buf, u=u, pr=pr, pr2=pr2, h=h_open, other_ps=other_ps, removed=removed,
                other=other)


def expect_error(env, exc, argname, fn, *args, **kwargs):
    buf = env["buf"]
    prio = [env["pr"], env["pr2"]]
    before = full_snapshot(buf, prio)
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    msg = str(info.value)
    if argname is not None:
        names = argname if isinstance(argname, tuple) else (argname,)
        assert any(n in msg for n in names), f"{names!r} not named in {msg!r}"
    after = full_snapshot(buf, prio)
    assert after == before, "the buffer changed on a failed call"
    buf._check()
    return info.value


S4 = np.zeros(4, np.float32)


# ---- record -----------------------------------------------------------------

RECORD_CASES = [
    # (id, exception, argname, args, kwargs); "H" is replaced by the open handle
    ("h_str", TypeError, "h", ("x", S4, 0, 0.0), {}),
    ("h_float", TypeError, "h", (1.0, S4, 0, 0.0), {}),
    ("h_bool", TypeError, "h", (True, S4, 0, 0.0), {}),
    ("h_list", TypeError, "h", ([0], S4, 0, 0.0), {}),
    ("state_short", ValueError, "state", ("H", np.zeros(3), 0, 0.0), {}),
    ("state_2d", ValueError, "state", ("H", np.zeros((1, 4)), 0, 0.0), {}),
    ("state_scalar", ValueError, "state", ("H", 1.0, 0, 0.0), {}),
    ("state_list_long", ValueError, "state", ("H", [1, 2, 3, 4, 5], 0, 0.0), {}),
    ("state_ragged", ValueError, "state", ("H", [[1, 2], [3]], 0, 0.0), {}),
    ("state_complex", TypeError, "state", ("H", np.zeros(4, np.complex128), 0, 0.0), {}),
    ("state_complex_list", TypeError, "state", ("H", [1j, 0, 0, 0], 0, 0.0), {}),
    ("state_str", TypeError, "state", ("H", np.array(["a", "b", "c", "d"]), 0, 0.0), {}),
    ("state_object", TypeError, "state", ("H", np.array([object()] * 4), 0, 0.0), {}),
    ("state_none", TypeError, "state", ("H", None, 0, 0.0), {}),
    ("action_float", TypeError, "action", ("H", S4, 1.5, 0.0), {}),
    ("action_float_array", TypeError, "action", ("H", S4, np.float32(1), 0.0), {}),
    ("action_complex", TypeError, "action", ("H", S4, 1j, 0.0), {}),
    ("action_shape", ValueError, "action", ("H", S4, [1, 2], 0.0), {}),
    ("action_str", TypeError, "action", ("H", S4, "a", 0.0), {}),
    ("action_none", TypeError, "action", ("H", S4, None, 0.0), {}),
    ("reward_complex", TypeError, "reward", ("H", S4, 0, 1j), {}),
    ("reward_complex_np", TypeError, "reward", ("H", S4, 0, np.complex64(1)), {}),
    ("reward_str", TypeError, "reward", ("H", S4, 0, "1.0"), {}),
    ("reward_shape", ValueError, "reward", ("H", S4, 0, [1.0, 2.0]), {}),
    ("reward_none", TypeError, "reward", ("H", S4, 0, None), {}),
    ("final_shape", ValueError, "final_state", ("H", S4, 0, 0.0), {"final_state": np.zeros(5)}),
    ("final_complex", TypeError, "final_state", ("H", S4, 0, 0.0),
     {"final_state": np.zeros(4, complex)}),
    ("prio_neg", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": -1.0}),
    ("prio_neg_tiny", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": -1e-300}),
    ("prio_nan", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": float("nan")}),
    ("prio_inf", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": math.inf}),
    ("prio_ninf", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": -math.inf}),
    ("prio_np_nan", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": np.float32("nan")}),
    ("prio_neg_int", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": -3}),
    ("prio_str", TypeError, "priority", ("H", S4, 0, 0.0), {"priority": "1"}),
    ("prio_complex", TypeError, "priority", ("H", S4, 0, 0.0), {"priority": 1j}),
    ("prio_0d_bool", TypeError, "priority", ("H", S4, 0, 0.0), {"priority": np.array(True)}),
    ("prio_0d_complex", TypeError, "priority", ("H", S4, 0, 0.0),
     {"priority": np.array(0.5 + 1j)}),
    ("prio_list", ValueError, "priority", ("H", S4, 0, 0.0), {"priority": [1.0, 2.0]}),
    ("missing_reward", TypeError, "reward", ("H", S4, 0), {}),
    ("unknown_kw", TypeError, "bogus", ("H", S4, 0, 0.0), {"bogus": 1}),
    ("dup_kw", TypeError, "state", ("H", S4, 0, 0.0), {"state": S4}),
]


def _fill_h(args, env):
    return tuple(env["h"] if isinstance(a, str) and a == "H" else a for a in args)


@pytest.mark.parametrize("case", RECORD_CASES, ids=[c[0] for c in RECORD_CASES])
def test_record_errors(env, case):
    _, exc, arg, args, kwargs = case
    expect_error(env, exc, arg, env["buf"].record, *_fill_h(args, env), **kwargs)
    # the open episode is still usable with its handle
    assert env["buf"].record(env["h"], S4, 0, 0.0) == env["h"]


@pytest.mark.parametrize("case", RECORD_CASES[4:], ids=[c[0] for c in RECORD_CASES[4:]])
def test_record_errors_new_episode(env, case):
    """Starting a new episode consumes no handle on failure."""
    _, exc, arg, args, kwargs = case
    args = (None,) + args[1:]
    nxt = env["buf"].new_episode() + 1
    expect_error(env, exc, arg, env["buf"].record, *args, **kwargs)
    assert env["buf"].record(None, S4, 0, 0.0) == nxt


def test_record_int_out_of_range_for_uint8_state():
    buf = ExperienceReplay((2,), state_dtype="uint8", seed=0)
    e = {"buf": buf, "pr": buf.new_pick_selector(P), "pr2": buf.new_pick_selector(P)}
    expect_error(e, ValueError, "state", buf.record, None, [1, 256], 0, 0.0)
    expect_error(e, ValueError, "state", buf.record, None, [-1, 2], 0, 0.0)
    expect_error(e, TypeError, "state", buf.record, None, np.array([1, 2], np.int64), 0, 0.0)
    expect_error(e, TypeError, "state", buf.record, None, [1.0, 2.0], 0, 0.0)
    assert buf.record(None, [1, 255], 0, 0.0) == 0


# ---- record_many ------------------------------------------------------------

S34 = np.zeros((3, 4), np.float32)
A3 = np.zeros(3, np.int64)
R3 = np.zeros(3, np.float32)

RECORD_MANY_CASES = [
    ("h_str", TypeError, "h", ("x", S34, A3, R3), {}),
    ("h_bool", TypeError, "h", (False, S34, A3, R3), {}),
    ("states_trailing", ValueError, "states", ("H", np.zeros((3, 5)), A3, R3), {}),
    ("states_1d", ValueError, "states", ("H", np.zeros(4), A3, R3), {}),
    ("states_3d", ValueError, "states", ("H", np.zeros((3, 4, 1)), A3, R3), {}),
    ("states_complex", TypeError, "states", ("H", S34.astype(complex), A3, R3), {}),
    ("T0", ValueError, "states", ("H", np.zeros((0, 4)), np.zeros(0, np.int64),
                                  np.zeros(0, np.float32)), {}),
    ("T0_lists", ValueError, "states", ("H", [], [], []), {}),
    ("actions_len", ValueError, "actions", ("H", S34, np.zeros(2, np.int64), R3), {}),
    ("actions_len_long", ValueError, "actions", ("H", S34, np.zeros(4, np.int64), R3), {}),
    ("actions_float", TypeError, "actions", ("H", S34, np.zeros(3), R3), {}),
    ("actions_2d", ValueError, "actions", ("H", S34, np.zeros((3, 1), np.int64), R3), {}),
    ("rewards_len", ValueError, "rewards", ("H", S34, A3, np.zeros(2)), {}),
    ("rewards_complex", TypeError, "rewards", ("H", S34, A3, np.zeros(3, complex)), {}),
    ("rewards_scalar", ValueError, "rewards", ("H", S34, A3, 0.0), {}),
    ("prios_len", ValueError, "priorities", ("H", S34, A3, R3), {"priorities": [1.0, 2.0]}),
    ("prios_one_nan", ValueError, "priorities", ("H", S34, A3, R3),
     {"priorities": [1.0, float("nan"), 2.0]}),
    ("prios_one_neg", ValueError, "priorities", ("H", S34, A3, R3),
     {"priorities": np.array([1.0, 2.0, -0.5])}),
    ("prios_first_inf", ValueError, "priorities", ("H", S34, A3, R3),
     {"priorities": [math.inf, 2.0, 1.0]}),
    ("prios_last_ninf", ValueError, "priorities", ("H", S34, A3, R3),
     {"priorities": [0.0, 2.0, -math.inf]}),
    ("prios_complex", TypeError, "priorities", ("H", S34, A3, R3), {"priorities": [1j, 1, 1]}),
    ("prios_scalar", ValueError, "priorities", ("H", S34, A3, R3), {"priorities": 1.0}),
    ("final_shape", ValueError, "final_state", ("H", S34, A3, R3), {"final_state": S34}),
    ("final_complex", TypeError, "final_state", ("H", S34, A3, R3),
     {"final_state": np.zeros(4, complex)}),
]


@pytest.mark.parametrize("case", RECORD_MANY_CASES, ids=[c[0] for c in RECORD_MANY_CASES])
@pytest.mark.parametrize("h", ["open", "new"])
def test_record_many_errors(env, case, h):
    _, exc, arg, args, kwargs = case
    args = _fill_h(args, env)
    if h == "new" and args[0] is env["h"]:
        args = (None,) + args[1:]
    expect_error(env, exc, arg, env["buf"].record_many, *args, **kwargs)


def test_record_many_bad_priority_records_nothing_even_with_eviction():
    """One bad priority at the end: not even the steps before it (which would
    have evicted episodes) are recorded."""
    buf, u, pr, pr2, h = populated(capacity=len(populated()[0]) + 1)
    e = dict(buf=buf, pr=pr, pr2=pr2)
    T = 50
    S = np.ones((T, 4))
    pri = np.ones(T)
    pri[-1] = np.nan
    expect_error(e, ValueError, "priorities", buf.record_many, None, S, np.zeros(T, np.int64),
                 np.zeros(T), priorities=pri)
    expect_error(e, ValueError, "priorities", buf.record_many, h, S, np.zeros(T, np.int64),
                 np.zeros(T), priorities=pri)


# ---- get_batch --------------------------------------------------------------


def test_get_batch_batch_size(env):
    buf = env["buf"]
    for bs, exc in [(0, ValueError), (-1, ValueError), (-(2**70), ValueError),
                    (1.0, TypeError), (2.5, TypeError), ("3", TypeError), (None, TypeError),
                    (True, TypeError), ([3], TypeError)]:
        expect_error(env, exc, "batch_size", buf.get_batch, bs, env["u"])
        expect_error(env, exc, "batch_size", buf.get_batch, bs, env["pr"])
    # np integers are ints
    assert len(buf.get_batch(np.int32(3), env["u"]).pick_epi) == 3


def test_get_batch_overflowing_batch_size(env):
    # docs/semantics.md: sizes that overflow are a MemoryError, and the message names the argument
    expect_error(env, MemoryError, "batch_size", env["buf"].get_batch, 2**62, env["u"])


def test_get_batch_overflowing_batch_size_leaves_buffer(env):
    expect_error(env, (MemoryError, ValueError), None, env["buf"].get_batch, 2**62, env["u"])
    expect_error(env, (MemoryError, ValueError), None, env["buf"].get_batch, 2**63 - 1,
                 env["pr"])


def test_get_batch_bad_selector(env):
    buf = env["buf"]
    for ps in (99, -1, 2**70, env["removed"], int(env["removed"]), env["other_ps"]):
        expect_error(env, ValueError, "ps", buf.get_batch, 4, ps)
    for ps in ("0", 0.0, None, True, [0], object()):
        expect_error(env, TypeError, "ps", buf.get_batch, 4, ps)


def test_get_batch_selector_of_another_buffer_with_same_handle(env):
    """A PickSelector belongs to its buffer even if the other has that handle."""
    buf, other = env["buf"], env["other"]
    assert int(env["other_ps"]) == int(env["u"])
    expect_error(env, ValueError, "ps", buf.get_batch, 2, env["other_ps"])
    with pytest.raises(ValueError, match="ps"):
        other.get_batch(2, env["u"])


def test_get_batch_empty_buffer():
    for prepare in (lambda b: None, lambda b: b.new_episode(),
                    lambda b: b.record(None, S4, 0, 0.0)):
        buf = ExperienceReplay((4,), seed=0, pick_len=3)
        u = buf.new_pick_selector(U)
        pr = buf.new_pick_selector(P)
        prepare(buf)
        e = dict(buf=buf, pr=pr, pr2=pr)
        expect_error(e, ValueError, None, buf.get_batch, 1, u)
        expect_error(e, ValueError, None, buf.get_batch, 8, pr)


def test_get_batch_all_priorities_zero():
    buf = ExperienceReplay((4,), seed=0)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P)
    buf.record_many(None, np.zeros((5, 4)), np.zeros(5, np.int64), np.zeros(5),
                    priorities=np.zeros(5), terminated=True)
    e = dict(buf=buf, pr=pr, pr2=pr)
    expect_error(e, ValueError, None, buf.get_batch, 3, pr)
    # a failed draw does not advance the generator: same picks as a twin
    twin = ExperienceReplay((4,), seed=0)
    twin.new_pick_selector(U)
    tpr = twin.new_pick_selector(P)
    twin.record_many(None, np.zeros((5, 4)), np.zeros(5, np.int64), np.zeros(5),
                     priorities=np.zeros(5), terminated=True)
    buf.set_priority(pr, [0, 0], [1, 3], [1.0, 2.0])
    twin.set_priority(tpr, [0, 0], [1, 3], [1.0, 2.0])
    assert buf.get_batch(50, pr).pick_pos.tolist() == twin.get_batch(50, tpr).pick_pos.tolist()
    assert len(buf.get_batch(3, u).pick_epi) == 3


def _batch_fields(b):
    return [b.state, b.action, b.reward, b.state_next, b.seq_len, b.seq_len_next, b.pick_epi,
            b.pick_pos, b.weight]


def _make_batch(fields):
    return exreplay.Batch(fields)


def test_get_batch_bad_out(env):
    buf, u, pr = env["buf"], env["u"], env["pr"]
    good = buf.get_batch(8, u)
    ref = [a.copy() for a in _batch_fields(good)]
    # wrong batch size
    expect_error(env, ValueError, "out", buf.get_batch, 4, u, out=good)
    expect_error(env, ValueError, "out", buf.get_batch, 9, pr, out=good)
    # a batch of another configuration
    other = ExperienceReplay((5,), seed=0, pick_len=2, allow_short=True)
    other.record(None, np.zeros(5), 0, 0.0, terminated=True)
    ob = other.get_batch(8, other.new_pick_selector(U))
    expect_error(env, ValueError, "out", buf.get_batch, 8, u, out=ob)
    # not a Batch
    for bad in (tuple(_batch_fields(good)), list(_batch_fields(good)), good.state, 5, "out"):
        expect_error(env, TypeError, "out", buf.get_batch, 8, u, out=bad)
    # one field of the wrong dtype / shape / layout / writability
    for f in range(9):
        fields = [a.copy() for a in _batch_fields(good)]
        a = fields[f]
        variants = []
        wrong_dtype = np.float64 if a.dtype != np.float64 else np.float32
        variants.append(a.astype(wrong_dtype))
        variants.append(np.zeros(a.shape[:-1] + (a.shape[-1] + 1,), a.dtype))
        if a.ndim > 1:
            variants.append(a.reshape(-1))
        if a.ndim >= 1:
            variants.append(np.repeat(a, 2, axis=0)[::2])  # right shape, not contiguous
        ro = a.copy()
        ro.flags.writeable = False
        variants.append(ro)
        for v in variants:
            fields[f] = v
            bad = _make_batch(fields)
            snap = [x.copy() for x in _batch_fields(bad)]
            expect_error(env, ValueError, "out", buf.get_batch, 8, u, out=bad)
            # the out arrays were not touched either
            for x, y in zip(_batch_fields(bad), snap):
                assert np.array_equal(x, y)
    # extras of a buffer without an extras_spec: {} as made (or None), not stale arrays
    good.extras["logp"] = np.zeros((8, 2), np.float32)
    expect_error(env, ValueError, "out", buf.get_batch, 8, u, out=good)
    del good.extras["logp"]
    for extras in ([], "x"):
        bad = exreplay.Batch(tuple(good[:8]) + (good.weight, good.pick_index), {"extras": extras})
        expect_error(env, TypeError, "out", buf.get_batch, 8, u, out=bad)
    # good still works, and was not modified by the failures
    for x, y in zip(_batch_fields(good), ref):
        assert np.array_equal(x, y)
    assert buf.get_batch(8, u, out=good) is good


def test_get_batch_out_arrays_that_share_memory(env):
    """Two fields of out= over the same memory would have get_batch write one
    over the other: refused, naming both, with nothing written."""
    buf, u = env["buf"], env["u"]
    b = buf.get_batch(8, u)
    names = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
             "pick_epi", "pick_pos", "weight", "pick_index")

    def batch(**swap):
        return exreplay.Batch(tuple(swap.get(n, getattr(b, n)) for n in names))

    spare = np.zeros(16, np.int64)
    st = b.state.copy()
    cases = [
        # get_batch's own arrays, one given twice
        (batch(state_next=b.state), "out.state and out.state_next"),
        (batch(pick_pos=b.pick_epi), "out.pick_epi and out.pick_pos"),
        (batch(pick_index=b.seq_len), "out.seq_len and out.pick_index"),
        # views of one array, overlapping in part only
        (batch(pick_epi=spare[:8], pick_pos=spare[7:15]), "out.pick_epi and out.pick_pos"),
        # arrays of the caller's own
        (batch(state=st, state_next=st), "out.state and out.state_next"),
    ]
    for out, both in cases:
        snap = [getattr(out, n).copy() for n in names]
        err = expect_error(env, ValueError, "out", buf.get_batch, 8, u, out=out)
        assert f"out: expected arrays that share no memory, got {both} sharing memory" == str(err)
        for n, x in zip(names, snap):
            assert np.array_equal(getattr(out, n), x), n
    # adjacent views of one array are fine, and get_batch's own batch still is
    ok = batch(pick_epi=spare[:8], pick_pos=spare[8:])
    assert buf.get_batch(8, u, out=ok) is ok
    assert buf.get_batch(8, u, out=b) is b


# ---- set_priority -----------------------------------------------------------


def test_set_priority_errors(env):
    buf, pr, u = env["buf"], env["pr"], env["pr2"]
    e, p = buf._picks()
    e, p = e[:6], p[:6]
    ok = np.ones(6)
    cases = [
        (ValueError, "pick_pos", (pr, e, p[:5], ok)),
        (ValueError, ("pick_epi", "pick_pos"), (pr, e[:5], p, ok)),
        (ValueError, "priorities", (pr, e, p, ok[:5])),
        (ValueError, "priorities", (pr, e, p, np.ones(7))),
        (ValueError, "priorities", (pr, e, p, np.ones((6, 1)))),
        (ValueError, "pick_epi", (pr, e.reshape(2, 3), p.reshape(2, 3), ok.reshape(2, 3))),
        (ValueError, "pick_epi", (pr, 0, 0, 1.0)),
        (TypeError, "pick_epi", (pr, e.astype(float), p, ok)),
        (TypeError, "pick_pos", (pr, e, p.astype(float), ok)),
        (TypeError, "pick_epi", (pr, ["a"] * 6, p, ok)),
        (TypeError, "priorities", (pr, e, p, ok.astype(complex))),
        (TypeError, "priorities", (pr, e, p, "1.0")),
        (ValueError, "priorities", (pr, e, p, -1.0)),
        (ValueError, "priorities", (pr, e, p, math.nan)),
        (ValueError, "priorities", (pr, e, p, math.inf)),
        (ValueError, "priorities", (pr, e, p, np.array([1, 1, 1, 1, 1, -1e-9]))),
        (ValueError, "priorities", (pr, e, p, [1, 1, math.nan, 1, 1, 1])),
        (ValueError, "priorities", (pr, e, p, [math.inf, 1, 1, 1, 1, 1])),
        (ValueError, "priorities", (pr, e, p, [1, 1, 1, 1, 1, -math.inf])),
        (ValueError, "ps", (99, e, p, ok)),
        (ValueError, "ps", (env["removed"], e, p, ok)),
        (ValueError, "ps", (env["other_ps"], e, p, ok)),
        (TypeError, "ps", ("pr", e, p, ok)),
        (TypeError, "ps", (1.0, e, p, ok)),
        (TypeError, "ps", (None, e, p, ok)),
    ]
    for exc, arg, args in cases:
        expect_error(env, exc, arg, buf.set_priority, *args)
    # bad values are rejected on a uniform selector too (validation first)
    for exc, arg, args in cases[:19]:
        expect_error(env, exc, arg, buf.set_priority, env["u"], *args[1:])
    expect_error(env, TypeError, None, buf.set_priority, pr, e, p)
    expect_error(env, TypeError, "bogus", buf.set_priority, pr, e, p, ok, bogus=1)


_I64_RANGE = "[-9223372036854775808, 9223372036854775807]"


def _bools_refused(name):
    return (TypeError, f"{name}: expected int64 (or an integer dtype that casts to it under "
                       "same_kind), got bool")


def _beyond_int64(name, v):
    return (ValueError, f"{name}: expected values that fit int64, in {_I64_RANGE}, got {v}")


def test_set_priority_picks_are_ints(env):
    """pick_epi, pick_pos and pick_index are int64 handles, positions and
    table indices: bools are refused as a bool handle is (the cast would
    read them as picks 0 and 1), and a uint64 value beyond int64 as the same
    Python int is (the cast would wrap it to a negative handle), in every
    form of the call and in stored_priorities and _gather, which take the
    same arrays (docs/api.md, "Input conversion")."""
    buf, pr = env["buf"], env["pr"]
    e, p = buf._picks()
    e, p = e[:6], p[:6]
    ok = np.ones(6)
    big = e.astype(np.uint64)
    big[4] = 2**64 - 1
    pbig = p.astype(np.uint64)
    pbig[2] = 2**63
    bools = np.ones(6, bool)
    b = buf.get_batch(6, pr)

    def with_fields(**kw):
        f = {n: getattr(b, n) for n in exreplay.Batch.__match_args__[:8]}
        f.update(weight=b.weight, pick_index=b.pick_index, extras=b.extras, state_seq=b.state_seq)
        f.update(kw)
        return exreplay.Batch(tuple(f.values()))

    cases = [
        (_bools_refused("pick_epi"), buf.set_priority, (pr, bools, p, ok), {}),
        (_bools_refused("pick_epi"), buf.set_priority, (pr, [True] * 6, p, ok), {}),
        (_bools_refused("pick_epi"), buf.set_priority, (pr, np.zeros(0, bool), [], ok[:0]), {}),
        (_bools_refused("pick_pos"), buf.set_priority, (pr, e, bools, ok), {}),
        # a bool among ints: NumPy would read the list as ints, picks 1 and 0
        (_bools_refused("pick_epi"), buf.set_priority, (pr, [int(x) for x in e[:5]] + [True], p, ok), {}),
        (_bools_refused("pick_pos"), buf.set_priority, (pr, e, (False,) + tuple(int(x) for x in p[1:]), ok), {}),
        (_bools_refused("pick_pos"), buf.set_priority, (pr, e, [np.True_] + list(p[1:]), ok), {}),
        (_bools_refused("pick_index"), buf.set_priority, (pr, e, p, ok),
         {"pick_index": list(b.pick_index[:5]) + [np.array(True)]}),
        (_bools_refused("pick_epi"), buf.stored_priorities, (pr, [True] + list(e[1:]), p), {}),
        (_bools_refused("pick_index"), buf.set_priority, (pr, e, p, ok), {"pick_index": bools}),
        (_beyond_int64("pick_epi", 2**64 - 1), buf.set_priority, (pr, big, p, ok), {}),
        (_beyond_int64("pick_epi", 2**64 - 1), buf.set_priority, (pr, big[::-1], p, ok), {}),
        (_beyond_int64("pick_pos", 2**63), buf.set_priority, (pr, e, pbig, ok), {}),
        (_beyond_int64("pick_index", 2**64 - 1), buf.set_priority, (pr, e, p, ok),
         {"pick_index": big}),
        (_bools_refused("batch.pick_epi"), buf.set_priority,
         (pr, with_fields(pick_epi=bools), ok), {}),
        (_bools_refused("batch.pick_pos"), buf.set_priority,
         (pr, with_fields(pick_pos=bools), ok), {}),
        (_bools_refused("batch.pick_index"), buf.set_priority,
         (pr, with_fields(pick_index=bools), ok), {}),
        (_beyond_int64("batch.pick_epi", 2**64 - 1), buf.set_priority,
         (pr, with_fields(pick_epi=big), ok), {}),
        (_beyond_int64("batch.pick_index", 2**64 - 1), buf.set_priority,
         (pr, with_fields(pick_index=big), ok), {}),
        (_bools_refused("pick_epi"), buf.stored_priorities, (pr, bools, p), {}),
        (_beyond_int64("pick_pos", 2**63), buf.stored_priorities, (pr, e, pbig), {}),
        (_bools_refused("pick_pos"), buf._gather, (pr, e, bools), {}),
        (_beyond_int64("pick_epi", 2**64 - 1), buf._gather, (pr, big, p), {}),
    ]
    uniform = "ps: expected a prioritized or rank pick selector, got a uniform one (handle %d)"
    for (exc, msg), fn, args, kwargs in cases:
        for ps in (pr, env["u"]):  # refused on a uniform selector too
            if fn == buf.stored_priorities and ps is env["u"]:  # which it checks first
                exc, msg = ValueError, uniform % ps.handle
            err = expect_error(env, exc, None, fn, ps, *args[1:], **kwargs)
            assert str(err) == msg
    # uint64 values within int64 are handles and positions like any other
    assert buf.set_priority(pr, e.astype(np.uint64), p.astype(np.uint64), ok,
                            pick_index=b.pick_index.astype(np.uint64)) == 6


@pytest.mark.parametrize("bad", [math.nan, -math.nan, math.inf, -math.inf, -1.0, -5e-324])
def test_bad_priority_named_by_index_in_long_arrays(env, bad):
    """The priorities are checked several at a time: a bad one anywhere in a
    long array (the first of two, wherever it falls among the checks) is the
    one the message names, and nothing changes; -0.0, subnormals and the
    largest double are priorities like any other."""
    buf, pr = env["buf"], env["pr"]
    e, p = buf._picks()
    n = len(e)
    assert n >= 20
    ok = np.tile([0.0, -0.0, 5e-324, 1.7976931348623157e308, 0.5], n)[:n]
    for at in sorted({0, 1, 7, 8, 9, 15, 16, 17, n - 2, n - 1}):
        pri = ok.copy()
        pri[at] = bad
        pri[-1] = bad if at < n - 1 else pri[-1]
        err = expect_error(env, ValueError, "priorities", buf.set_priority, pr, e, p, pri)
        assert f"at index {at}" in str(err), str(err)
        T = 20 if at < 20 else 0
        if T:
            pri = ok[:T].copy()
            pri[at] = bad
            err = expect_error(env, ValueError, "priorities", buf.record_many, None,
                               np.ones((T, 4)), np.zeros(T, np.int64), np.zeros(T), priorities=pri)
            assert f"at index {at}" in str(err), str(err)


def test_set_priority_negative_scalar_with_no_picks(env):
    empty = np.zeros(0, np.int64)
    expect_error(env, ValueError, "priorities", env["buf"].set_priority, env["pr"], empty, empty,
                 -1.0)


# ---- selectors --------------------------------------------------------------


def test_new_pick_selector_errors(env):
    buf = env["buf"]
    next_handle = int(buf.new_pick_selector(U)) + 1
    cases = [
        (ValueError, "kind", (5,), {}),
        (ValueError, "kind", (-1,), {}),
        (ValueError, "kind", (2**70,), {}),
        (TypeError, "kind", ("uniform",), {}),
        (TypeError, "kind", (1.0,), {}),
        (TypeError, "kind", (None,), {}),
        (TypeError, "kind", (True,), {}),
        (TypeError, None, (), {}),
        (TypeError, None, (U, P), {}),
        (TypeError, "gamma", (P,), {"gamma": 1.0}),
        (TypeError, "alpha", (U,), {"alpha": 0.5}),
        (TypeError, "beta", (U,), {"beta": 0.5}),
        (ValueError, "alpha", (P,), {"alpha": -1}),
        (ValueError, "alpha", (P,), {"alpha": -0.1}),
        (ValueError, "alpha", (P,), {"alpha": math.nan}),
        (ValueError, "alpha", (P,), {"alpha": math.inf}),
        (ValueError, "beta", (P,), {"beta": -1.0}),
        (ValueError, "beta", (P,), {"beta": math.nan}),
        (ValueError, "beta", (P,), {"beta": math.inf}),
        (ValueError, "beta", (P,), {"alpha": 0.5, "beta": -2}),
        (TypeError, "alpha", (P,), {"alpha": "0.5"}),
        (TypeError, "alpha", (P,), {"alpha": 1j}),
        (TypeError, "alpha", (P,), {"alpha": None}),
    ]
    for exc, arg, args, kw in cases:
        expect_error(env, exc, arg, buf.new_pick_selector,
                     *args, **kw)
    # no selector handle was consumed by the failures
    assert int(buf.new_pick_selector(P, alpha=0.0, beta=0.0)) == next_handle


def test_new_pick_selector_list_beta_type(env):
    """A list is not a scalar: a ValueError naming the argument (args.c, as the reference)."""
    with pytest.raises(ValueError, match="^beta: expected a scalar, got a list$"):
        env["buf"].new_pick_selector(P, beta=[0.4])


def test_remove_pick_selector_errors(env):
    buf = env["buf"]
    for ps in (99, -1, env["removed"], int(env["removed"]), env["other_ps"]):
        expect_error(env, ValueError, "ps", buf.remove_pick_selector, ps)
    for ps in ("0", 0.5, None, True):
        expect_error(env, TypeError, "ps", buf.remove_pick_selector, ps)
    # the selectors are all still there
    for ps in (env["u"], env["pr"], env["pr2"]):
        assert len(buf.get_batch(2, ps).pick_epi) == 2


def test_pick_selector_errors(env):
    """pick_selector refuses as remove_pick_selector does, naming ps, and
    changes nothing; a restored buffer refuses the original's objects."""
    buf = env["buf"]
    for ps in (99, -1, 2**70, env["removed"], int(env["removed"]), env["other_ps"]):
        expect_error(env, ValueError, "ps", buf.pick_selector, ps)
    for ps in ("0", 0.5, None, True, np.array([0]), [0]):
        expect_error(env, TypeError, "ps", buf.pick_selector, ps)
    expect_error(env, TypeError, None, buf.pick_selectors, 0)
    copy = ExperienceReplay.unserialize(buf.serialize(0))
    with pytest.raises(ValueError, match="^ps: expected a pick selector of this buffer, got one of "
                                         "another buffer$"):
        copy.pick_selector(env["pr"])
    assert copy.pick_selector(int(env["pr"])).beta == env["pr"].beta


def test_selector_param_errors(env):
    buf, pr, u = env["buf"], env["pr"], env["u"]
    for v, exc in [(-1.0, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                   ("0.5", TypeError), (None, TypeError), ([0.5], (TypeError, ValueError))]:
        with pytest.raises(exc, match="beta"):
            pr.beta = v
        assert pr.beta == pytest.approx(0.4)
    with pytest.raises(AttributeError, match="^alpha is fixed when the selector is created$"):
        pr.alpha = 0.5
    for name in ("alpha", "beta"):  # beta is settable: that it cannot be deleted is what stops it
        with pytest.raises(AttributeError, match=f"^{name} cannot be deleted: a selector always has one$"):
            delattr(pr, name)
    assert pr.alpha == pytest.approx(0.6) and pr.beta == pytest.approx(0.4)
    with pytest.raises(AttributeError):
        u.beta = 0.5
    with pytest.raises(ValueError):
        env["removed"].beta = 0.5
    with pytest.raises(TypeError):
        exreplay.PickSelector()
    buf._check()


def test_selector_beta_complex_names_beta(env):
    with pytest.raises(TypeError, match="beta"):
        env["pr"].beta = 1j
    assert env["pr"].beta == pytest.approx(0.4)


def test_selector_beta_bool_rejected(env):
    with pytest.raises(TypeError, match="beta"):
        env["pr"].beta = True
    assert env["pr"].beta == pytest.approx(0.4)


def test_new_pick_selector_bool_param_rejected(env):
    expect_error(env, TypeError, "beta", env["buf"].new_pick_selector, P, beta=True)


def _refused_as_a_real_number(env, v, want):
    """v is refused, with message `want`, as beta (set), alpha and beta (a
    new selector's) and priority, and nothing changes."""
    with pytest.raises(TypeError, match=r"^beta: " + re.escape(want) + "$"):
        env["pr"].beta = v
    assert env["pr"].beta == pytest.approx(0.4)
    for kw in ("alpha", "beta"):
        err = expect_error(env, TypeError, kw, env["buf"].new_pick_selector, P, **{kw: v})
        assert str(err) == f"{kw}: {want}"
    err = expect_error(env, TypeError, "priority", env["buf"].record, env["h"], S4, 0, 0.0,
                       priority=v)
    assert str(err) == f"priority: {want}"


@pytest.mark.parametrize("v,dtype", [(np.array(True), "bool"), (np.array(0.5 + 1j), "complex128"),
                                     (np.array(1 + 0j, np.complex64), "complex64"),
                                     (np.array("1.5"), "<U3"), (np.array(b"2"), "|S1"),
                                     (np.array(1.5, dtype=object), "object"),
                                     (np.array(np.timedelta64(1)), "timedelta64")])
def test_0d_arrays_of_no_real_dtype_are_no_real_numbers(env, v, dtype):
    """A 0-d array is a real number only with an integer or float dtype:
    bools and complex numbers are refused as their scalars are (float()
    reads True as 1.0), and strings, bytes, objects and times too (float()
    read "1.5" as 1.5, where set_priority's array refused it)."""
    _refused_as_a_real_number(env, v, f"expected a real number, got numpy.ndarray of dtype {dtype} "
                                      f"and shape ()")
    # a 0-d real array still is one
    env["pr"].beta = np.array(0.25)
    assert env["pr"].beta == 0.25


@pytest.mark.parametrize("v", [np.timedelta64(3), np.datetime64(1, "s")])
def test_numpy_times_are_no_real_numbers(env, v):
    """A NumPy time is refused where a real number is expected (a timedelta
    is an integer to NumPy, and float() read it as its count of units), and a
    timedelta where a flag is."""
    _refused_as_a_real_number(env, v, f"expected a real number, got numpy.{type(v).__name__}")
    if isinstance(v, np.timedelta64):
        err = expect_error(env, TypeError, "terminated", env["buf"].record, env["h"], S4, 0, 0.0,
                           terminated=v)
        assert str(err) == "terminated: expected a bool or an int, got numpy.timedelta64"


# ---- episode ----------------------------------------------------------------


def test_episode_errors(env):
    buf = env["buf"]
    for h in (999, -1, 2**70):
        expect_error(env, ValueError, "h", buf.episode, h)
    for h in (None, "0", 0.0, True):
        expect_error(env, TypeError, "h", buf.episode, h)


def test_new_episode_takes_no_arguments(env):
    with pytest.raises(TypeError):
        env["buf"].new_episode(3)


# ---- test hooks reject bad picks without side effects -----------------------


def test_gather_unknown_pick(env):
    buf = env["buf"]
    expect_error(env, ValueError, None, buf._gather, env["u"], [999], [0])
    expect_error(env, ValueError, None, buf._gather, env["u"], [env["h"]], [50])
    expect_error(env, ValueError, "ps", buf._gather, 99, [env["h"]], [0])


# ---- constructor ------------------------------------------------------------

CTOR_CASES = [
    ("shape_zero", ValueError, "state_shape", ((0,),), {}),
    ("shape_neg", ValueError, "state_shape", ((4, -1),), {}),
    ("shape_int_zero", ValueError, "state_shape", (0,), {}),
    ("shape_float", TypeError, "state_shape", ((4.0,),), {}),
    ("shape_float_scalar", TypeError, "state_shape", (4.0,), {}),
    ("shape_str", TypeError, "state_shape", ("abc",), {}),
    ("shape_none", TypeError, "state_shape", (None,), {}),
    ("shape_bool", TypeError, "state_shape", ((True,),), {}),
    ("shape_nested", TypeError, "state_shape", (((2, 2),),), {}),
    ("ashape_zero", ValueError, "action_shape", ((4,),), {"action_shape": (0,)}),
    ("ashape_float", TypeError, "action_shape", ((4,),), {"action_shape": (1.5,)}),
    ("sdtype_complex", TypeError, "state_dtype", ((4,),), {"state_dtype": "complex64"}),
    ("sdtype_object", TypeError, "state_dtype", ((4,),), {"state_dtype": object}),
    ("sdtype_str", TypeError, "state_dtype", ((4,),), {"state_dtype": "U4"}),
    ("sdtype_none", TypeError, "state_dtype", ((4,),), {"state_dtype": None}),
    ("sdtype_bogus", TypeError, "state_dtype", ((4,),), {"state_dtype": "notadtype"}),
    ("sdtype_struct", TypeError, "state_dtype", ((4,),),
     {"state_dtype": np.dtype([("a", "f4"), ("b", "i4")])}),
    ("sdtype_datetime", TypeError, "state_dtype", ((4,),), {"state_dtype": "M8[s]"}),
    ("adtype_complex", TypeError, "action_dtype", ((4,),), {"action_dtype": "complex128"}),
    ("adtype_void", TypeError, "action_dtype", ((4,),), {"action_dtype": "V8"}),
    ("rdtype_int", TypeError, "reward_dtype", ((4,),), {"reward_dtype": "int32"}),
    ("rdtype_bool", TypeError, "reward_dtype", ((4,),), {"reward_dtype": bool}),
    ("rdtype_complex", TypeError, "reward_dtype", ((4,),), {"reward_dtype": "complex64"}),
    ("rdtype_longdouble", TypeError, "reward_dtype", ((4,),), {"reward_dtype": np.longdouble}),
    ("capacity_zero", ValueError, "capacity", ((4,),), {"capacity": 0}),
    ("capacity_neg", ValueError, "capacity", ((4,),), {"capacity": -5}),
    ("capacity_float", TypeError, "capacity", ((4,),), {"capacity": 1.5}),
    ("capacity_str", TypeError, "capacity", ((4,),), {"capacity": "10"}),
    ("capacity_bool", TypeError, "capacity", ((4,),), {"capacity": True}),
    ("pick_len_zero", ValueError, "pick_len", ((4,),), {"pick_len": 0}),
    ("pick_len_neg", ValueError, "pick_len", ((4,),), {"pick_len": -1}),
    ("pick_len_float", TypeError, "pick_len", ((4,),), {"pick_len": 2.0}),
    ("pick_len_str", TypeError, "pick_len", ((4,),), {"pick_len": "2"}),
    ("pick_len_none", TypeError, "pick_len", ((4,),), {"pick_len": None}),
    ("pick_len_huge", ValueError, "pick_len", ((4,),), {"pick_len": 2**21}),
    ("shape_huge", ValueError, "state_shape", ((2**31, 2**31, 2**31),), {}),
    ("eviction_lru", ValueError, "eviction", ((4,),), {"eviction": "lru"}),
    ("eviction_case", ValueError, "eviction", ((4,),), {"eviction": "FIFO"}),
    ("eviction_empty", ValueError, "eviction", ((4,),), {"eviction": ""}),
    ("seed_neg", ValueError, "seed", ((4,),), {"seed": -1}),
    ("seed_big", ValueError, "seed", ((4,),), {"seed": 2**64}),
    ("seed_float", TypeError, "seed", ((4,),), {"seed": 1.5}),
    ("seed_str", TypeError, "seed", ((4,),), {"seed": "1"}),
    ("seed_bool", TypeError, "seed", ((4,),), {"seed": True}),
    ("unknown_kw", TypeError, "bogus", ((4,),), {"bogus": 1}),
    ("no_args", TypeError, "state_shape", (), {}),
]


@pytest.mark.parametrize("case", CTOR_CASES, ids=[c[0] for c in CTOR_CASES])
def test_constructor_errors(case):
    _, exc, arg, args, kwargs = case
    with pytest.raises(exc) as info:
        ExperienceReplay(*args, **kwargs)
    assert arg in str(info.value), str(info.value)


def test_constructor_eviction_non_string():
    """A non-string eviction is a wrong value like an unknown string: ValueError, naming it."""
    with pytest.raises(ValueError, match="^eviction: expected 'fifo' or 'second_chance', got 1$"):
        ExperienceReplay((4,), eviction=1)


def test_constructor_boundaries_accepted():
    ExperienceReplay((1,), capacity=1, pick_len=1, seed=0)
    ExperienceReplay((1,), seed=2**64 - 1)
    ExperienceReplay((1,), capacity=2**63 - 1)
    ExperienceReplay((), state_dtype=bool, action_dtype="uint64", reward_dtype="float16")


def test_capacity_one_and_huge_record():
    buf = ExperienceReplay((2,), capacity=1, seed=0)
    h = buf.record(None, [1, 2], 0, 0.0)
    assert len(buf) == 1
    h = buf.record(h, [1, 2], 0, 0.0)
    assert len(buf) == 0 and buf._handles() == []
    buf._check()


# ---- the attributes are read-only -------------------------------------------


@pytest.mark.parametrize("attr", ["state_shape", "state_dtype", "action_shape", "action_dtype",
                                  "reward_dtype", "capacity", "pick_len", "allow_short",
                                  "eviction", "seed", "num_episodes", "num_picks"])
def test_attributes_read_only(env, attr):
    buf = env["buf"]
    before = getattr(buf, attr)
    with pytest.raises(AttributeError):
        setattr(buf, attr, before)
    assert getattr(buf, attr) == before
