"""The statements of docs/semantics.md, as tests.

They use only the public API and the test hooks (`_handles`, `_picks`,
`_gather`, `_priority`, `_check`), through the `make_buffer` fixture, so the
same tests run against the C buffer once conftest.IMPLS lists it.
"""

import math
import pickle
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exreplay.reference import Batch as ReferenceBatch
from exreplay.reference import PickSelectorClass

Uniform = PickSelectorClass.Uniform
Prioritized = PickSelectorClass.Prioritized

f32 = lambda x: float(np.float32(x))  # noqa: E731


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def st_of(i, shape=(2,)):
    """A distinct state for record number i."""
    tenths = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) / 10
    return np.full(shape, i, dtype=np.float32) + tenths


def fill(buf, h, n, start=0, **last):
    """Record n steps (states st_of(start + t), action start + t, reward
    start + t + 0.5) into h; the last one carries **last."""
    for t in range(n):
        i = start + t
        kw = last if t == n - 1 else {}
        h = buf.record(h, st_of(i, buf.state_shape), i, i + 0.5, **kw)
    return h


def picks(buf):
    epi, pos = buf._picks()
    assert epi.dtype == np.int64 and pos.dtype == np.int64
    return sorted(zip(epi.tolist(), pos.tolist()))


def expected_num_picks(n, pick_len, allow_short, ended):
    c = n if ended else max(n - 1, 0)
    if ended and allow_short:
        return c
    return max(c - pick_len + 1, 0)


def snapshot(buf, selectors=()):
    """Everything observable about a buffer's contents."""
    handles = buf._handles()
    eps = []
    for h in handles:
        e = buf.episode(h)
        eps.append(
            (
                h,
                e.state.tobytes(),
                e.action.tobytes(),
                e.reward.tobytes(),
                None if e.final_state is None else e.final_state.tobytes(),
                e.ended,
                e.terminated,
            )
        )
    pk = picks(buf)
    prios = []
    for ps in selectors:
        if ps.kind == Prioritized and pk:
            epi = np.array([e for e, _ in pk], np.int64)
            pos = np.array([p for _, p in pk], np.int64)
            prios.append(buf._priority(ps, epi, pos).tolist())
    return (handles, eps, pk, prios, len(buf), buf.num_episodes, buf.num_picks)


def gather(buf, ps, pick_list):
    epi = np.array([e for e, _ in pick_list], np.int64)
    pos = np.array([p for _, p in pick_list], np.int64)
    return buf._gather(ps, epi, pos)


def prio_of(buf, ps, pick_list):
    epi = np.array([e for e, _ in pick_list], np.int64)
    pos = np.array([p for _, p in pick_list], np.int64)
    return buf._priority(ps, epi, pos).tolist()


# --------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------


def test_defaults_are_readable(make_buffer):
    buf = make_buffer(state_shape=(4,))
    assert buf.state_shape == (4,)
    assert buf.state_dtype == np.dtype("float32")
    assert buf.action_shape == ()
    assert buf.action_dtype == np.dtype("int64")
    assert buf.reward_dtype == np.dtype("float32")
    assert buf.capacity == 1_000_000
    assert buf.pick_len == 1
    assert buf.allow_short is False
    assert buf.eviction == "fifo"
    assert buf.seed is None
    assert len(buf) == 0 and buf.num_episodes == 0 and buf.num_picks == 0
    buf._check()


def test_parameters_read_back(make_buffer):
    buf = make_buffer(
        state_shape=[84, 84],
        state_dtype=np.uint8,
        action_shape=3,
        action_dtype="float32",
        reward_dtype="float64",
        capacity=None,
        pick_len=8,
        allow_short=True,
        eviction="second_chance",
        seed=2**64 - 1,
    )
    assert buf.state_shape == (84, 84) and isinstance(buf.state_shape, tuple)
    assert buf.action_shape == (3,) and isinstance(buf.action_shape, tuple)
    assert isinstance(buf.state_dtype, np.dtype) and buf.state_dtype == np.uint8
    assert buf.action_dtype == np.float32 and buf.reward_dtype == np.float64
    assert buf.capacity is None and buf.pick_len == 8 and buf.allow_short is True
    assert buf.eviction == "second_chance" and buf.seed == 2**64 - 1


def test_dtypes_are_stored_native(make_buffer):
    buf = make_buffer(state_shape=(2,), state_dtype=">f4", action_dtype=">i2")
    assert buf.state_dtype == np.dtype("float32") and buf.state_dtype.isnative
    assert buf.action_dtype == np.dtype("int16") and buf.action_dtype.isnative
    assert make_buffer(state_shape=(), state_dtype=bool).state_dtype == np.bool_


@pytest.mark.parametrize(
    "kwargs, exc, argname",
    [
        (dict(state_shape=(0,)), ValueError, "state_shape"),
        (dict(state_shape=(4, -1)), ValueError, "state_shape"),
        (dict(state_shape=("a",)), TypeError, "state_shape"),
        (dict(state_shape=(2.0,)), TypeError, "state_shape"),
        (dict(state_shape="4"), TypeError, "state_shape"),
        (dict(state_shape=(4,), action_shape=(0,)), ValueError, "action_shape"),
        (dict(state_shape=(4,), state_dtype="complex64"), TypeError, "state_dtype"),
        (dict(state_shape=(4,), state_dtype=object), TypeError, "state_dtype"),
        (dict(state_shape=(4,), state_dtype="U4"), TypeError, "state_dtype"),
        (dict(state_shape=(4,), state_dtype="not a dtype"), TypeError, "state_dtype"),
        (dict(state_shape=(4,), action_dtype="datetime64[s]"), TypeError, "action_dtype"),
        (dict(state_shape=(4,), reward_dtype="int32"), TypeError, "reward_dtype"),
        (dict(state_shape=(4,), reward_dtype="complex128"), TypeError, "reward_dtype"),
        (dict(state_shape=(4,), capacity=0), ValueError, "capacity"),
        (dict(state_shape=(4,), capacity=-5), ValueError, "capacity"),
        (dict(state_shape=(4,), capacity=1.5), TypeError, "capacity"),
        (dict(state_shape=(4,), capacity="10"), TypeError, "capacity"),
        (dict(state_shape=(4,), pick_len=0), ValueError, "pick_len"),
        (dict(state_shape=(4,), pick_len=2.0), TypeError, "pick_len"),
        (dict(state_shape=(4,), eviction="lru"), ValueError, "eviction"),
        (dict(state_shape=(4,), seed=-1), ValueError, "seed"),
        (dict(state_shape=(4,), seed=2**64), ValueError, "seed"),
        (dict(state_shape=(4,), seed="x"), TypeError, "seed"),
        (dict(state_shape=(4,), seed=1.0), TypeError, "seed"),
    ],
)
def test_bad_constructor_arguments(make_buffer, kwargs, exc, argname):
    with pytest.raises(exc, match=argname):
        make_buffer(**kwargs)


def test_scalar_state_shape(make_buffer):
    buf = make_buffer(state_shape=(), state_dtype="int32")
    h = buf.record(None, 7, 1, 0.0)
    h = buf.record(h, 8, 1, 0.0, final_state=9)
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 0), (h, 1)])
    assert b.state.shape == (2, 1)
    assert b.state[:, 0].tolist() == [7, 8] and b.state_next[:, 0].tolist() == [8, 9]


# --------------------------------------------------------------------------
# episodes and handles
# --------------------------------------------------------------------------


def test_handles_count_up_from_zero(make_buffer):
    buf = make_buffer(state_shape=(2,))
    assert [buf.new_episode() for _ in range(3)] == [0, 1, 2]
    assert buf.record(None, st_of(0), 0, 0.0) == 3
    assert buf.num_episodes == 4 and len(buf) == 1
    assert buf._handles() == [0, 1, 2, 3]


def test_empty_episode(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = buf.new_episode()
    assert buf.num_episodes == 1 and len(buf) == 0 and buf.num_picks == 0
    e = buf.episode(h)
    assert e.state.shape == (0, 2) and e.action.shape == (0,) and e.reward.shape == (0,)
    assert e.final_state is None and e.ended is False and e.terminated is False
    buf._check()


def test_record_into_open_episode_keeps_its_handle(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = buf.new_episode()
    assert fill(buf, h, 5) == h
    assert buf.num_episodes == 1 and len(buf) == 5
    e = buf.episode(h)
    assert e.action.tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(e.state, np.stack([st_of(i) for i in range(5)]))
    np.testing.assert_array_equal(e.reward, np.arange(5) + 0.5)


def test_record_into_ended_episode_starts_a_new_one(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = fill(buf, None, 3, final_state=st_of(99))
    assert buf.episode(h).ended
    h2 = buf.record(h, st_of(5), 5, 0.0)
    assert h2 == h + 1
    assert len(buf.episode(h).action) == 3 and len(buf.episode(h2).action) == 1
    # terminated=True without a final state also ends it
    h3 = buf.record(h2, st_of(6), 6, 0.0, terminated=True)
    assert h3 == h2
    e = buf.episode(h2)
    assert e.ended and e.terminated and e.final_state is None
    assert buf.record(h2, st_of(7), 7, 0.0) == h2 + 1


def test_record_into_unknown_handle_starts_a_new_one(make_buffer):
    buf = make_buffer(state_shape=(2,))
    buf.new_episode()
    assert buf.record(999, st_of(0), 0, 0.0) == 1
    assert buf.record(-3, st_of(0), 0, 0.0) == 2
    assert buf.record(np.int64(1), st_of(0), 0, 0.0) == 1  # numpy ints are ints
    assert buf._handles() == [0, 1, 2]


@pytest.mark.parametrize("h", ["0", 1.0, [0], object()])
def test_record_handle_must_be_int_or_none(make_buffer, h):
    buf = make_buffer(state_shape=(2,))
    buf.new_episode()
    before = snapshot(buf)
    with pytest.raises(TypeError, match="h"):
        buf.record(h, st_of(0), 0, 0.0)
    assert snapshot(buf) == before


def test_handles_are_never_reused(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=4)
    seen = []
    h = None
    for i in range(20):
        h = buf.record(h, st_of(i), i, 0.0, terminated=(i % 3 == 2))
        if h not in seen:
            seen.append(h)
    assert seen == sorted(seen) and len(set(seen)) == len(seen)
    assert buf.new_episode() == seen[-1] + 1
    buf._check()


def test_episode_unknown_handle(make_buffer):
    buf = make_buffer(state_shape=(2,))
    with pytest.raises(ValueError, match="h"):
        buf.episode(0)
    with pytest.raises(TypeError):
        buf.episode("0")


def test_episode_returns_copies(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = fill(buf, None, 2, final_state=st_of(9))
    e = buf.episode(h)
    e.state[...] = -1
    e.final_state[...] = -1
    e2 = buf.episode(h)
    np.testing.assert_array_equal(e2.state[0], st_of(0))
    np.testing.assert_array_equal(e2.final_state, st_of(9))


def test_stored_state_is_a_copy_of_the_input(make_buffer):
    buf = make_buffer(state_shape=(2,))
    s = st_of(1).copy()
    h = buf.record(None, s, 0, 0.0)
    s[...] = 42
    np.testing.assert_array_equal(buf.episode(h).state[0], st_of(1))


# --------------------------------------------------------------------------
# when a pick exists (docs/semantics.md)
# --------------------------------------------------------------------------


def test_open_episode_picks_trail_by_one(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = buf.record(None, st_of(0), 0, 0.0)
    assert picks(buf) == []  # its next state is unknown
    fill(buf, h, 1, start=1)
    assert picks(buf) == [(h, 0)]
    fill(buf, h, 1, start=2)
    assert picks(buf) == [(h, 0), (h, 1)]
    fill(buf, h, 1, start=3, final_state=st_of(4))
    assert picks(buf) == [(h, 0), (h, 1), (h, 2), (h, 3)]


@pytest.mark.parametrize("pick_len", [1, 2, 3, 5])
@pytest.mark.parametrize("allow_short", [False, True])
@pytest.mark.parametrize("end", ["open", "final", "terminated", "both"])
def test_pick_existence_rule(make_buffer, pick_len, allow_short, end):
    last = {
        "open": {},
        "final": dict(final_state=st_of(100)),
        "terminated": dict(terminated=True),
        "both": dict(final_state=st_of(100), terminated=True),
    }[end]
    ended = end != "open"
    for n in range(0, 8):
        buf = make_buffer(state_shape=(2,), pick_len=pick_len, allow_short=allow_short)
        h = buf.new_episode()
        if n:
            h = fill(buf, h, n, **last)
        m = expected_num_picks(n, pick_len, allow_short, ended and n > 0)
        assert picks(buf) == [(h, p) for p in range(m)], (n, pick_len, allow_short, end)
        assert buf.num_picks == m
        buf._check()


def test_pick_len_3_examples(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=3)
    h = fill(buf, None, 4)  # c = 3
    assert picks(buf) == [(h, 0)]
    fill(buf, h, 1, start=4)  # c = 4
    assert picks(buf) == [(h, 0), (h, 1)]
    fill(buf, h, 1, start=5, terminated=True)  # ended: c = 6
    assert picks(buf) == [(h, p) for p in range(4)]
    # too short an episode has no pick without allow_short
    h2 = fill(buf, None, 2, final_state=st_of(9))
    assert [p for p in picks(buf) if p[0] == h2] == []


def test_allow_short_only_applies_to_ended_episodes(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=4, allow_short=True)
    h = fill(buf, None, 3)
    assert picks(buf) == []  # open: no short picks
    fill(buf, h, 1, start=3, final_state=st_of(4))
    assert picks(buf) == [(h, 0), (h, 1), (h, 2), (h, 3)]
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 0), (h, 1), (h, 3)])
    assert b.seq_len.tolist() == [4, 3, 1]


# --------------------------------------------------------------------------
# batch contents
# --------------------------------------------------------------------------


def test_batch_shapes_and_dtypes(make_buffer):
    buf = make_buffer(
        state_shape=(2, 3),
        state_dtype="uint8",
        action_shape=(2,),
        action_dtype="float32",
        reward_dtype="float64",
        pick_len=3,
        seed=1,
    )
    h = None
    for i in range(6):
        h = buf.record(h, np.full((2, 3), i, np.uint8), [i, -i], float(i))
    ps = buf.new_pick_selector(Uniform)
    b = buf.get_batch(5, ps)
    state, action, reward, state_next, seq_len, seq_len_next, pick_epi, pick_pos = b
    assert state.shape == state_next.shape == (5, 3, 2, 3)
    assert state.dtype == state_next.dtype == np.uint8
    assert action.shape == (5, 3, 2) and action.dtype == np.float32
    assert reward.shape == (5, 3) and reward.dtype == np.float64
    for a in (seq_len, seq_len_next, pick_epi, pick_pos):
        assert a.shape == (5,) and a.dtype == np.int64
    assert b.weight.shape == (5,) and b.weight.dtype == np.float32
    assert b.state is state and b.action is action and b.reward is reward
    assert b.state_next is state_next and b.seq_len is seq_len
    assert b.seq_len_next is seq_len_next and b.pick_epi is pick_epi and b.pick_pos is pick_pos
    assert len(tuple(b)) == 8
    assert set(zip(pick_epi.tolist(), pick_pos.tolist())) <= set(picks(buf))


def test_batch_contents_inside_an_open_episode(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=3)
    h = fill(buf, None, 6)
    ps = buf.new_pick_selector(Uniform)
    b = gather(buf, ps, [(h, 0), (h, 2)])
    for row, p in enumerate([0, 2]):
        for t in range(3):
            np.testing.assert_array_equal(b.state[row, t], st_of(p + t))
            np.testing.assert_array_equal(b.state_next[row, t], st_of(p + t + 1))
            assert b.action[row, t] == p + t
            assert b.reward[row, t] == np.float32(p + t + 0.5)
    assert b.seq_len.tolist() == [3, 3] and b.seq_len_next.tolist() == [3, 3]
    assert b.pick_epi.tolist() == [h, h] and b.pick_pos.tolist() == [0, 2]
    assert b.weight.tolist() == [1.0, 1.0]


def test_state_next_at_the_end_is_the_final_state(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=2)
    h = fill(buf, None, 3, final_state=st_of(50))  # truncated: not terminated
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 1)])
    np.testing.assert_array_equal(b.state_next[0, 0], st_of(2))
    np.testing.assert_array_equal(b.state_next[0, 1], st_of(50))
    assert b.seq_len.tolist() == [2] and b.seq_len_next.tolist() == [2]


def test_terminal_with_final_state(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=2)
    h = fill(buf, None, 3, final_state=st_of(50), terminated=True)
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 1), (h, 0)])
    np.testing.assert_array_equal(b.state_next[0, 1], st_of(50))
    assert b.seq_len.tolist() == [2, 2]
    assert b.seq_len_next.tolist() == [1, 2]  # only the pick ending on the terminal step


def test_terminal_without_final_state_gives_zeros(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=1)
    h = fill(buf, None, 2, terminated=True)
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 1), (h, 0)])
    np.testing.assert_array_equal(b.state_next[0, 0], [0, 0])
    np.testing.assert_array_equal(b.state_next[1, 0], st_of(1))
    assert b.seq_len.tolist() == [1, 1] and b.seq_len_next.tolist() == [0, 1]
    e = buf.episode(h)
    assert e.final_state is None and e.ended and e.terminated


def test_short_picks_are_zero_padded(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=4, allow_short=True, action_shape=(2,))
    h = None
    for i in range(3):
        h = buf.record(h, st_of(i) + 1, [i + 1, i + 1], i + 1.0, terminated=(i == 2))
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 1)])
    assert b.seq_len.tolist() == [2] and b.seq_len_next.tolist() == [1]
    np.testing.assert_array_equal(b.state[0, :2], [st_of(1) + 1, st_of(2) + 1])
    np.testing.assert_array_equal(b.state_next[0, 0], st_of(2) + 1)
    np.testing.assert_array_equal(b.state_next[0, 1], [0, 0])  # terminal, no final state
    for a in (b.state, b.state_next, b.action, b.reward):
        assert not a[0, 2:].any()


def test_short_pick_truncated_episode(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=3, allow_short=True)
    h = fill(buf, None, 2, final_state=st_of(7))
    b = gather(buf, buf.new_pick_selector(Uniform), [(h, 0), (h, 1)])
    assert b.seq_len.tolist() == [2, 1] and b.seq_len_next.tolist() == [2, 1]
    np.testing.assert_array_equal(b.state_next[0, 1], st_of(7))
    np.testing.assert_array_equal(b.state_next[1, 0], st_of(7))
    assert not b.state[0, 2:].any() and not b.state[1, 1:].any()


def test_get_batch_returns_existing_picks(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=2, seed=3)
    h1 = fill(buf, None, 5, terminated=True)
    h2 = fill(buf, None, 4, start=10)
    for kind in (Uniform, Prioritized):
        ps = buf.new_pick_selector(kind)
        b = buf.get_batch(64, ps)
        drawn = list(zip(b.pick_epi.tolist(), b.pick_pos.tolist()))
        assert set(drawn) <= set(picks(buf))
        # the contents are exactly those of _gather for the same picks
        g = gather(buf, ps, drawn)
        for x, y in zip((*b, b.weight), (*g, g.weight)):
            np.testing.assert_array_equal(x, y)
    assert {h1, h2} >= set(buf._handles())


def test_get_batch_out_refills_in_place(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=2, seed=0)
    fill(buf, None, 5, final_state=st_of(9))
    ps = buf.new_pick_selector(Prioritized)
    b = buf.get_batch(8, ps)
    ids = [id(a) for a in (*b, b.weight)]
    for a in (*b, b.weight):
        a[...] = 77
    b2 = buf.get_batch(8, ps, out=b)
    assert b2 is b
    assert [id(a) for a in (*b2, b2.weight)] == ids
    g = gather(buf, ps, list(zip(b.pick_epi.tolist(), b.pick_pos.tolist())))
    for x, y in zip((*b, b.weight), (*g, g.weight)):
        np.testing.assert_array_equal(x, y)


def rebuild_batch(b, **changes):
    """A copy of Batch b with some fields replaced, built the way its type is:
    the reference Batch takes keywords, the C one is a struct sequence."""
    names = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
             "pick_epi", "pick_pos")
    fields = {n: getattr(b, n) for n in names + ("weight", "pick_index")}
    fields.update(changes)
    if isinstance(b, ReferenceBatch):
        return type(b)(**fields)
    return type(b)(tuple(fields[n] for n in names),
                   {"weight": fields["weight"], "pick_index": fields["pick_index"]})


def test_get_batch_out_wrong_shapes(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=0)
    fill(buf, None, 5)
    ps = buf.new_pick_selector(Uniform)
    b = buf.get_batch(8, ps)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="out"):
        buf.get_batch(4, ps, out=b)  # sized for 8
    bad = rebuild_batch(b, state=b.state.astype(np.float64))
    with pytest.raises(ValueError, match="out"):
        buf.get_batch(8, ps, out=bad)
    ro = b.weight.copy()
    ro.flags.writeable = False
    bad = rebuild_batch(b, weight=ro)
    with pytest.raises(ValueError, match="out"):
        buf.get_batch(8, ps, out=bad)
    assert snapshot(buf) == before


def test_get_batch_errors(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=0)
    ps = buf.new_pick_selector(Uniform)
    with pytest.raises(ValueError):
        buf.get_batch(4, ps)  # no picks yet
    fill(buf, None, 3)
    with pytest.raises(ValueError, match="batch_size"):
        buf.get_batch(0, ps)
    with pytest.raises(ValueError, match="batch_size"):
        buf.get_batch(-1, ps)
    with pytest.raises(TypeError, match="batch_size"):
        buf.get_batch(2.0, ps)
    with pytest.raises(ValueError, match="ps"):
        buf.get_batch(4, 17)
    with pytest.raises(TypeError, match="ps"):
        buf.get_batch(4, "0")
    assert buf.get_batch(1, ps).seq_len.shape == (1,)


def test_batch_is_picklable(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=0)
    fill(buf, None, 3)
    b = buf.get_batch(4, buf.new_pick_selector(Prioritized))
    b2 = pickle.loads(pickle.dumps(b))
    for x, y in zip((*b, b.weight), (*b2, b2.weight)):
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------
# selection
# --------------------------------------------------------------------------


def test_same_seed_same_batches(make_buffer):
    def run(seed):
        buf = make_buffer(state_shape=(2,), pick_len=2, seed=seed)
        u = buf.new_pick_selector(Uniform)
        p = buf.new_pick_selector(Prioritized, alpha=0.7)
        h = None
        for i in range(40):
            h = buf.record(h, st_of(i), i, 0.0, priority=(i % 7) + 0.1, terminated=i % 9 == 8)
        out = []
        for _ in range(3):
            for ps in (u, p):
                b = buf.get_batch(16, ps)
                out.append((b.pick_epi.tolist(), b.pick_pos.tolist()))
        return out

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_failed_get_batch_does_not_advance_the_generator(make_buffer):
    def make():
        buf = make_buffer(state_shape=(2,), seed=9)
        ps = buf.new_pick_selector(Prioritized)
        fill(buf, None, 10)
        return buf, ps

    a, pa = make()
    b, pb = make()
    with pytest.raises(ValueError):
        a.get_batch(0, pa)
    with pytest.raises(ValueError):
        a.get_batch(4, pa, out=b.get_batch(3, pb))  # b draws too: compare from here
    a.get_batch(3, pa)
    x, y = a.get_batch(32, pa), b.get_batch(32, pb)
    assert x.pick_pos.tolist() == y.pick_pos.tolist()


def test_uniform_selection_is_uniform(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=123)
    h = fill(buf, None, 5)  # 4 picks
    ps = buf.new_pick_selector(Uniform)
    b = buf.get_batch(8000, ps)
    counts = np.bincount(b.pick_pos, minlength=4)
    assert b.pick_epi.tolist() == [h] * 8000
    sigma = math.sqrt(8000 * 0.25 * 0.75)
    assert np.all(np.abs(counts - 2000) < 5 * sigma), counts
    assert np.all(b.weight == 1.0)


def test_prioritized_selection_is_proportional(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=321)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0, beta=0.0)
    h = None
    for i, p in enumerate([1.0, 3.0, 0.0, 4.0, 5.0]):
        h = buf.record(h, st_of(i), i, 0.0, priority=p)
    # picks 0..3 with priorities 1, 3, 0, 4
    b = buf.get_batch(16000, ps)
    counts = np.bincount(b.pick_pos, minlength=4)
    assert counts[2] == 0  # priority zero: never drawn
    for pos, p in [(0, 1 / 8), (1, 3 / 8), (3, 4 / 8)]:
        sigma = math.sqrt(16000 * p * (1 - p))
        assert abs(counts[pos] - 16000 * p) < 5 * sigma, counts
    assert np.all(b.weight == 1.0)  # beta = 0


def test_prioritized_alpha_flattens(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=4)
    ps = buf.new_pick_selector(Prioritized, alpha=0.0)
    h = None
    for i, p in enumerate([1.0, 100.0, 1.0]):
        h = buf.record(h, st_of(i), i, 0.0, priority=p)
    assert prio_of(buf, ps, [(h, 0), (h, 1)]) == [1.0, 1.0]
    counts = np.bincount(buf.get_batch(4000, ps).pick_pos, minlength=2)
    assert abs(counts[0] - 2000) < 5 * math.sqrt(1000)


def test_all_zero_priorities_is_an_error(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=1)
    ps = buf.new_pick_selector(Prioritized)
    h = fill(buf, None, 3)
    assert buf.set_priority(ps, [h, h], [0, 1], [0.0, 0.0]) == 2
    with pytest.raises(ValueError):
        buf.get_batch(4, ps)
    u = buf.new_pick_selector(Uniform)
    assert buf.get_batch(4, u).seq_len.tolist() == [1] * 4  # other selectors unaffected


# --------------------------------------------------------------------------
# priorities
# --------------------------------------------------------------------------


def test_recorded_priority_and_max_so_far(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=0.5)
    h = buf.record(None, st_of(0), 0, 0.0, priority=4.0)
    h = buf.record(h, st_of(1), 1, 0.0)  # pick 0 enters: recorded 4.0
    h = buf.record(h, st_of(2), 2, 0.0, priority=0.25)  # pick 1 enters: max so far 4.0
    h = buf.record(h, st_of(3), 3, 0.0)  # pick 2 enters: recorded 0.25
    assert prio_of(buf, ps, [(h, 0), (h, 1), (h, 2)]) == [f32(2.0), f32(2.0), f32(0.5)]


def test_default_priority_is_one(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=0.6)
    h = fill(buf, None, 4)
    assert prio_of(buf, ps, [(h, 0), (h, 1), (h, 2)]) == [1.0, 1.0, 1.0]


def test_recorded_priority_is_stored_as_float32_power(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=0.6)
    h = None
    values = [0.3, 1.7, 2.2, 1e-3, 0.0]
    for i, p in enumerate(values):
        h = buf.record(h, st_of(i), i, 0.0, priority=p, terminated=i == len(values) - 1)
    got = prio_of(buf, ps, [(h, i) for i in range(5)])
    # a recorded priority is itself kept as float32 until its pick is entered
    assert got == [f32(f32(p) ** 0.6) for p in values[:4]] + [0.0]


def test_priority_of_a_pick_is_that_of_its_first_step(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=3)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = None
    for i, p in enumerate([2.0, 3.0, 5.0, 7.0, 11.0]):
        h = buf.record(h, st_of(i), i, 0.0, priority=p)
    # c = 4: picks 0 and 1, from steps 0 and 1
    assert prio_of(buf, ps, [(h, 0), (h, 1)]) == [2.0, 3.0]


def test_set_priority_raises_max_so_far(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = fill(buf, None, 2)
    assert buf.set_priority(ps, [h], [0], [9.0]) == 1
    fill(buf, h, 1, start=2)  # pick 1 enters with the maximum so far
    assert prio_of(buf, ps, [(h, 0), (h, 1)]) == [9.0, 9.0]
    buf.set_priority(ps, [h], [0], [0.5])  # the maximum never goes down
    fill(buf, h, 1, start=3)
    assert prio_of(buf, ps, [(h, 2)]) == [9.0]


def test_max_so_far_is_per_selector(make_buffer):
    buf = make_buffer(state_shape=(2,))
    a = buf.new_pick_selector(Prioritized, alpha=1.0)
    b = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = fill(buf, None, 2)
    buf.set_priority(a, [h], [0], [6.0])
    fill(buf, h, 1, start=2)
    assert prio_of(buf, a, [(h, 1)]) == [6.0]
    assert prio_of(buf, b, [(h, 0), (h, 1)]) == [1.0, 1.0]


def test_recorded_priority_raises_max_for_every_selector(make_buffer):
    buf = make_buffer(state_shape=(2,))
    a = buf.new_pick_selector(Prioritized, alpha=1.0)
    b = buf.new_pick_selector(Prioritized, alpha=0.5)
    h = buf.record(None, st_of(0), 0, 0.0, priority=16.0)
    h = fill(buf, h, 2, start=1)
    assert prio_of(buf, a, [(h, 0), (h, 1)]) == [16.0, 16.0]
    assert prio_of(buf, b, [(h, 0), (h, 1)]) == [4.0, 4.0]


def test_new_selector_over_existing_picks(make_buffer):
    buf = make_buffer(state_shape=(2,))
    old = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = None
    for i, p in enumerate([3.0, None, 0.5, None]):
        h = buf.record(h, st_of(i), i, 0.0, priority=p)
    buf.set_priority(old, [h], [1], [50.0])  # not seen by a new selector
    new = buf.new_pick_selector(Prioritized, alpha=1.0)
    # picks that existed before the selector start at its maximum so far, 1.0,
    # whatever was recorded with them or set in another selector
    assert prio_of(buf, new, [(h, 0), (h, 1), (h, 2)]) == [1.0, 1.0, 1.0]
    h = fill(buf, h, 1, start=4)  # pick 3 (no priority) -> the new selector's max so far
    assert prio_of(buf, new, [(h, 3)]) == [1.0]
    assert prio_of(buf, old, [(h, 3)]) == [50.0]
    h = buf.record(h, st_of(5), 5, 0.0, priority=7.0)  # enters pick 4 (step 4: no priority)
    h = fill(buf, h, 2, start=6)  # enters pick 5 (recorded 7.0) and pick 6 (none: max 7.0)
    assert prio_of(buf, new, [(h, 4), (h, 5), (h, 6)]) == [1.0, 7.0, 7.0]


def test_new_selector_over_picks_without_priorities_starts_at_one(make_buffer):
    buf = make_buffer(state_shape=(2,))
    h = fill(buf, None, 3)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    assert prio_of(buf, ps, [(h, 0), (h, 1)]) == [1.0, 1.0]


def test_set_priority_skips_missing_picks_and_counts(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=4)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h0 = fill(buf, None, 2, terminated=True)
    h1 = fill(buf, None, 2, terminated=True)
    h2 = fill(buf, None, 2, terminated=True)  # evicts h0
    assert buf._handles() == [h1, h2]
    n = buf.set_priority(
        ps,
        np.array([h0, h1, h1, h2, 99, h2], np.int64),
        np.array([0, 1, 5, 0, 0, -1], np.int64),
        np.array([2.0, 3.0, 4.0, 5.0, 6.0, 7.0]),
    )
    assert n == 2
    assert prio_of(buf, ps, [(h1, 0), (h1, 1), (h2, 0), (h2, 1)]) == [1.0, 3.0, 5.0, 1.0]
    assert buf.set_priority(ps, [], [], []) == 0


def test_set_priority_last_value_wins_and_scalar_broadcasts(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = fill(buf, None, 4)
    assert buf.set_priority(ps, [h, h, h], [1, 0, 1], [2.0, 3.0, 8.0]) == 3
    assert prio_of(buf, ps, [(h, 0), (h, 1)]) == [3.0, 8.0]
    assert buf.set_priority(ps, [h, h], [0, 2], 0.5) == 2
    assert prio_of(buf, ps, [(h, 0), (h, 1), (h, 2)]) == [0.5, 8.0, 0.5]
    # ints are priorities too (same_kind into float)
    assert buf.set_priority(ps, [h], [0], [2]) == 1
    assert prio_of(buf, ps, [(h, 0)]) == [2.0]


def test_set_priority_with_batch_arrays(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=2)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    fill(buf, None, 9)
    b = buf.get_batch(5, ps)
    assert buf.set_priority(ps, b.pick_epi, b.pick_pos, np.full(5, 2.5, np.float32)) == 5
    assert prio_of(buf, ps, list(zip(b.pick_epi.tolist(), b.pick_pos.tolist()))) == [2.5] * 5


def test_set_priority_on_uniform_is_ignored(make_buffer):
    buf = make_buffer(state_shape=(2,))
    u = buf.new_pick_selector(Uniform)
    h = fill(buf, None, 3)
    assert buf.set_priority(u, [h, h], [0, 1], [5.0, 6.0]) == 0


@pytest.mark.parametrize(
    "args, exc",
    [
        (([0, 0], [0, 1], [1.0, -1.0]), ValueError),
        (([0, 0], [0, 1], [1.0, float("nan")]), ValueError),
        (([0, 0], [0, 1], [float("inf"), 1.0]), ValueError),
        (([0, 0], [0, 1], -2.0), ValueError),
        (([0, 0], [0, 1], [1.0, 2.0, 3.0]), ValueError),
        (([0, 0], [0], [1.0, 2.0]), ValueError),
        (([[0, 0]], [[0, 1]], [[1.0, 2.0]]), ValueError),
        (([0, 0], [0, 1], [1 + 1j, 2.0]), TypeError),
        (([0, 0], [0, 1], ["a", "b"]), TypeError),
        (([0.0, 0.0], [0, 1], [1.0, 2.0]), TypeError),
        (([0, 0], [0.5, 1], [1.0, 2.0]), TypeError),
    ],
)
def test_set_priority_bad_inputs_change_nothing(make_buffer, args, exc):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    fill(buf, None, 4)
    buf.set_priority(ps, [0, 0, 0], [0, 1, 2], [2.0, 3.0, 4.0])
    before = snapshot(buf, [ps])
    with pytest.raises(exc):
        buf.set_priority(ps, *args)
    assert snapshot(buf, [ps]) == before
    # and the maximum so far was not raised either
    fill(buf, 0, 1, start=10)
    assert prio_of(buf, ps, [(0, 3)]) == [4.0]


def test_set_priority_unknown_selector(make_buffer):
    buf = make_buffer(state_shape=(2,))
    fill(buf, None, 3)
    with pytest.raises(ValueError, match="ps"):
        buf.set_priority(5, [0], [0], [1.0])


# --------------------------------------------------------------------------
# pick_index: where a batch's picks were in the pick table (docs/api.md,
# "set_priority", "In the reference")
# --------------------------------------------------------------------------


def churned(make_buffer, seed=4, kind=Prioritized):
    """A buffer with a batch drawn before evictions and a removal moved picks
    about the table: (buf, ps, the batch, the picks held now)."""
    buf = make_buffer(state_shape=(2,), pick_len=2, capacity=60, seed=seed)
    ps = buf.new_pick_selector(kind, alpha=1.0) if kind != Uniform else buf.new_pick_selector(kind)
    for k in range(6):  # 54 records, 48 picks
        fill(buf, None, 9, start=10 * k, terminated=True)
    b = buf.get_batch(48, ps)
    # episode 1 removed: the newest picks (episode 5's) swapped into its
    # places; then past capacity 60, episode 0 evicted by one of episode
    # 7's single record calls, which enters no pick after it: its places
    # leave from the highest index down, each by swap
    buf.remove_episode(1)
    for k in range(6, 8):
        fill(buf, None, 9, start=10 * k, terminated=True)
    assert buf._handles() == [2, 3, 4, 5, 6, 7]
    return buf, ps, b, set(picks(buf))


def test_batch_pick_index_is_where_each_pick_is_in_the_table(make_buffer):
    buf, ps, b, _ = churned(make_buffer)
    assert b.pick_index.dtype == np.int64 and b.pick_index.shape == (48,)
    fresh = buf.get_batch(64, ps)
    g = buf._gather(ps, fresh.pick_epi, fresh.pick_pos)
    np.testing.assert_array_equal(fresh.pick_index, g.pick_index)
    assert ((fresh.pick_index >= 0) & (fresh.pick_index < buf.num_picks)).all()
    # one index per pick: the same pick, the same index; two picks, two
    seen = {}
    for e, p, i in zip(fresh.pick_epi.tolist(), fresh.pick_pos.tolist(),
                       fresh.pick_index.tolist()):
        assert seen.setdefault((e, p), i) == i
    assert len(set(seen.values())) == len(seen)


def table(buf):
    """The pick table in its order: [(episode, position)]."""
    epi, pos = buf._picks()
    return list(zip(epi.tolist(), pos.tolist()))


def closed(t, places):
    """Table t once the places leave, from the highest index down, each by
    swap (the last entry moves into it)."""
    t = list(t)
    for i in sorted(places, reverse=True):
        last = t.pop()
        if i < len(t):
            t[i] = last
    return t


@pytest.mark.parametrize("kind", [Prioritized, PickSelectorClass.Rank])
def test_a_record_call_puts_its_new_picks_in_the_places_it_evicted(make_buffer, kind):
    """A record call that evicts an episode gives its picks' places, in
    position order, to the picks the call enters after; the places left
    over leave at the end of the call, from the highest index down, each
    by swap (docs/design.md, "Places")."""
    buf = make_buffer(state_shape=(2,), pick_len=1, capacity=30, seed=1)
    ps = buf.new_pick_selector(kind)
    for k in range(3):
        fill(buf, None, 10, start=10 * k, terminated=True)
    zeros = lambda T: (np.zeros((T, 2), np.float32), np.zeros(T, np.int64), np.zeros(T))  # noqa: E731
    # as many new picks as the evicted episode had: exactly its places
    before, old = table(buf), buf._handles()[0]
    recorded = 2.0 + 0.1 * np.arange(10)
    h = h_first = buf.record_many(None, *zeros(10), priorities=recorded, terminated=True)
    after = table(buf)
    assert old not in buf._handles() and len(after) == 30
    assert [after.index((h, p)) for p in range(10)] == [before.index((old, p)) for p in range(10)]
    # fewer: the first four places taken, the other six closed
    old = buf._handles()[0]
    places = [after.index((old, p)) for p in range(10)]
    h = buf.record_many(None, *zeros(4), terminated=True)
    want = list(after)
    for p, i in enumerate(places[:4]):
        want[i] = (h, p)
    assert table(buf) == closed(want, places[4:])
    # a single record call that evicts and enters no pick: every place closed
    buf.record_many(None, *zeros(6), terminated=True)  # full again, nothing evicted
    before, old = table(buf), buf._handles()[0]
    buf.record(None, np.zeros(2, np.float32), 0, 0.0)
    assert table(buf) == closed(before, [before.index((old, p)) for p in range(10)])
    # the selector's leaves went with the picks: each pick of the first
    # rollout has its own recorded priority, wherever it stands now
    e, p = (np.array(a, np.int64) for a in zip(*table(buf)))
    first = e == h_first
    assert first.sum() == 10
    want = recorded[p[first]] ** (0.6 if kind == Prioritized else 1.0)  # rank: the priority
    np.testing.assert_allclose(buf._priority(ps, e[first], p[first]), want, rtol=1e-6)
    # and draws from it stay within the picks held, every one of them
    b = buf.get_batch(4000, ps)
    assert set(zip(b.pick_epi.tolist(), b.pick_pos.tolist())) == set(table(buf))
    buf._check()


def test_pick_index_the_same_in_both_implementations():
    """The reference numbers its table as the C buffer does (entered at the
    end in position order, or into the places of the picks the same record
    call evicted; removed in position order by swap), so the same calls
    give the same indices: after evictions, a removal, rollouts longer than
    64 picks and both eviction policies."""
    import exreplay
    from exreplay.reference import ReferenceReplay

    for eviction in ("fifo", "second_chance"):
        bufs = [cls(state_shape=(2,), pick_len=3, allow_short=True, capacity=400,
                    eviction=eviction, seed=7) for cls in (exreplay.ExperienceReplay,
                                                            ReferenceReplay)]
        sels = [buf.new_pick_selector(Prioritized) for buf in bufs]
        rng = np.random.default_rng(3)
        hs = [None, None]
        for step in range(60):
            T = int(rng.integers(1, 150))
            end = bool(rng.random() < 0.6)
            s = rng.random((T, 2), dtype=np.float32)
            for k, buf in enumerate(bufs):
                hs[k] = buf.record_many(hs[k], s, np.zeros(T, np.int64), np.ones(T),
                                        terminated=end)
            if step % 7 == 3:
                h = bufs[1]._handles()[len(bufs[1]._handles()) // 2]
                for buf in bufs:
                    buf.remove_episode(h)
            cb = bufs[0].get_batch(32, sels[0])
            rb = bufs[1]._gather(sels[1], cb.pick_epi, cb.pick_pos)  # marks the same episodes
            np.testing.assert_array_equal(cb.pick_index, rb.pick_index, err_msg=f"step {step}")
        assert bufs[0].num_picks == bufs[1].num_picks


@pytest.mark.parametrize("form", ["pick_index", "batch", "stale", "foreign"])
def test_set_priority_with_pick_index_after_evictions(make_buffer, form):
    """The batch's pick_index, stale after evictions and a removal, gives the
    update without it: the same count applied, the same priorities (and a
    wrong or foreign index any int64 costs the lookup, nothing else)."""
    (buf, ps, b, held), (twin, tps, tb, _) = churned(make_buffer), churned(make_buffer)
    np.testing.assert_array_equal(b.pick_epi, tb.pick_epi)
    alive = [(e, p) in held for e, p in zip(b.pick_epi.tolist(), b.pick_pos.tolist())]
    assert 0 < sum(alive) < len(alive)  # some picks left, some stay
    now = buf._gather(ps, b.pick_epi[alive], b.pick_pos[alive]).pick_index
    assert (now != b.pick_index[alive]).any()  # and some of those moved
    pr = np.linspace(0.5, 9.0, 48)
    if form == "batch":
        n = buf.set_priority(ps, b, pr)
    else:
        idx = {"pick_index": b.pick_index,
               "stale": np.roll(b.pick_index, 1),
               "foreign": np.array([-1, 2**63 - 1, 10**9] * 16, np.int64)}[form]
        n = buf.set_priority(ps, b.pick_epi, b.pick_pos, pr, pick_index=idx)
    assert n == twin.set_priority(tps, tb.pick_epi.copy(), tb.pick_pos.copy(), pr) == sum(alive)
    assert snapshot(buf, [ps]) == snapshot(twin, [tps])
    buf._check()


def test_set_priority_pick_index_errors_change_nothing(make_buffer):
    buf, ps, b, _ = churned(make_buffer)
    before = snapshot(buf, [ps])
    pr = np.ones(48)
    for bad, exc, what in (
        (b.pick_index.astype(np.float64), TypeError, "float64"),
        ("x", TypeError, "<U1"),
        (b.pick_index[:47], ValueError, r"\(48,\), got \(47,\)"),
        (b.pick_index.reshape(6, 8), ValueError, r"\(48,\), got \(6, 8\)"),
    ):
        with pytest.raises(exc, match=rf"^pick_index: expected .*{what}"):
            buf.set_priority(ps, b.pick_epi, b.pick_pos, pr, pick_index=bad)
        # the batch form checks the batch's own, named as the batch's
        swapped = rebuild_batch(b, pick_index=bad)
        with pytest.raises(exc, match=rf"^batch\.pick_index: expected .*{what}"):
            buf.set_priority(ps, swapped, pr)
    with pytest.raises(TypeError, match="pick_index"):
        buf.set_priority(ps, b, pr, pick_index=b.pick_index)
    assert snapshot(buf, [ps]) == before
    # a batch built without pick_index is the call without it
    plain = rebuild_batch(b, pick_index=None)
    assert plain.pick_index is None
    assert buf.set_priority(ps, plain, pr) == buf.set_priority(ps, b.pick_epi, b.pick_pos, pr)


def test_pick_index_through_out_pickling_and_shared_next(make_buffer):
    buf, ps, b, _ = churned(make_buffer, kind=Uniform)
    # out= refills pick_index as it refills the rest
    b.pick_index[...] = -5
    assert buf.get_batch(48, ps, out=b) is b
    np.testing.assert_array_equal(b.pick_index, buf._gather(ps, b.pick_epi, b.pick_pos).pick_index)
    before = snapshot(buf)
    for bad in (None, b.pick_index.astype(np.int32), np.zeros(47, np.int64), b.seq_len):
        out = rebuild_batch(b, pick_index=bad)
        kept = [a.copy() for a in (*out, out.weight)]
        with pytest.raises(ValueError, match=r"out\.pick_index"):
            buf.get_batch(48, ps, out=out)
        for x, y in zip((*out, out.weight), kept):
            np.testing.assert_array_equal(x, y)
    assert snapshot(buf) == before
    # pickling keeps it, in both layouts
    s = buf.get_batch(48, ps, shared_next=True)
    for x in (b, s):
        y = pickle.loads(pickle.dumps(x))
        assert y.pick_index.dtype == np.int64
        np.testing.assert_array_equal(y.pick_index, x.pick_index)
        if x is s:
            assert y.state_seq is not None and y.pick_index is not y.state_seq
    # a shared batch refilled through out= too
    s.pick_index[...] = -5
    assert buf.get_batch(48, ps, out=s, shared_next=True) is s
    np.testing.assert_array_equal(s.pick_index, buf._gather(ps, s.pick_epi, s.pick_pos).pick_index)


def test_weights_formula(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=8)
    ps = buf.new_pick_selector(Prioritized, alpha=0.5, beta=0.7)
    h = None
    prios = [1.0, 4.0, 0.0, 9.0, 16.0]
    for i, p in enumerate(prios):
        h = buf.record(h, st_of(i), i, 0.0, priority=p, terminated=(i == 4))
    leaves = [f32(p**0.5) if p else 0.0 for p in prios]
    assert prio_of(buf, ps, [(h, i) for i in range(5)]) == leaves
    min_leaf = min(v for v in leaves if v > 0)
    want = [f32((min_leaf / leaves[i]) ** 0.7) for i in (0, 1, 3, 4)]
    g = gather(buf, ps, [(h, 0), (h, 1), (h, 3), (h, 4)])
    np.testing.assert_allclose(g.weight, want, rtol=1e-6)
    assert g.weight.dtype == np.float32 and g.weight[0] == 1.0
    # PER's form: (N P(i))^-beta / max_j w_j
    N = 5
    P = np.array(leaves) / sum(leaves)
    w = np.array([(N * P[i]) ** -0.7 if P[i] > 0 else 0 for i in range(5)])
    np.testing.assert_allclose(g.weight, w[[0, 1, 3, 4]] / w.max(), rtol=1e-5)
    # get_batch weights agree with _gather's
    b = buf.get_batch(50, ps)
    for pos, wt in zip(b.pick_pos.tolist(), b.weight.tolist()):
        assert wt == pytest.approx(want[[0, 1, 3, 4].index(pos)], rel=1e-6)


def test_weights_follow_the_smallest_positive_priority(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0, beta=1.0)
    h = fill(buf, None, 4)  # three picks at 1.0
    buf.set_priority(ps, [h, h, h], [0, 1, 2], [2.0, 8.0, 4.0])
    np.testing.assert_allclose(gather(buf, ps, [(h, 1)]).weight, [0.25])
    buf.set_priority(ps, [h], [0], [0.5])
    np.testing.assert_allclose(gather(buf, ps, [(h, 1)]).weight, [0.0625])
    buf.set_priority(ps, [h], [0], [0.0])  # zero does not count
    np.testing.assert_allclose(gather(buf, ps, [(h, 1)]).weight, [0.5])


def test_beta_is_settable_and_used(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0, beta=0.0)
    h = fill(buf, None, 3)
    buf.set_priority(ps, [h, h], [0, 1], [1.0, 4.0])
    assert gather(buf, ps, [(h, 1)]).weight.tolist() == [1.0]
    ps.beta = 0.5
    assert ps.beta == 0.5
    assert gather(buf, ps, [(h, 1)]).weight.tolist() == [0.5]
    bad_values = [
        (-0.1, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        ("1", TypeError),
    ]
    for bad, exc in bad_values:
        with pytest.raises(exc, match="beta"):
            ps.beta = bad
    assert ps.beta == 0.5


# --------------------------------------------------------------------------
# selectors
# --------------------------------------------------------------------------


def test_selector_objects(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=0)
    u = buf.new_pick_selector(Uniform)
    p = buf.new_pick_selector(Prioritized)
    q = buf.new_pick_selector(1, alpha=0.9, beta=0.1)
    assert [int(u), int(p), int(q)] == [0, 1, 2]
    assert [u.__index__(), p.handle] == [0, 1]
    assert u.kind == Uniform and p.kind == Prioritized and q.kind == Prioritized
    assert (p.alpha, p.beta) == (0.6, 0.4) and (q.alpha, q.beta) == (0.9, 0.1)
    assert p == 1 and hash(p) == hash(1) and p != u
    assert isinstance(repr(p), str)
    fill(buf, None, 4)
    # the handle style works as well as the object style
    a = buf.get_batch(4, 1)
    assert a.seq_len.tolist() == [1] * 4
    assert buf.set_priority(1, [0], [0], [2.0]) == 1


def test_selector_handles_are_never_reused(make_buffer):
    buf = make_buffer(state_shape=(2,))
    a = buf.new_pick_selector(Uniform)
    b = buf.new_pick_selector(Prioritized)
    buf.remove_pick_selector(a)
    c = buf.new_pick_selector(Uniform)
    assert int(c) == 2
    fill(buf, None, 3)
    with pytest.raises(ValueError, match="ps"):
        buf.get_batch(2, a)
    with pytest.raises(ValueError, match="ps"):
        buf.remove_pick_selector(a)
    buf.remove_pick_selector(int(b))
    with pytest.raises(ValueError, match="ps"):
        buf.set_priority(b, [0], [0], [1.0])
    assert buf.get_batch(2, c).seq_len.tolist() == [1, 1]
    buf._check()


def test_removed_selector_parameters(make_buffer):
    """docs/api.md, PickSelector: after removal a Prioritized or Rank
    selector's alpha and beta are a ValueError to read, and so is a valid
    beta to set; an invalid one is refused as before. A Uniform one's read
    None, and its beta stays an AttributeError to set. The repr says so."""
    buf = make_buffer(state_shape=(2,))
    u = buf.new_pick_selector(Uniform)
    p = buf.new_pick_selector(Prioritized, alpha=0.5, beta=0.3)
    r = buf.new_pick_selector(PickSelectorClass.Rank)
    for ps in (u, p, r):
        buf.remove_pick_selector(ps)
        assert "removed" in repr(ps)
    assert (u.alpha, u.beta) == (None, None)
    with pytest.raises(AttributeError):
        u.beta = 1.0
    for ps in (p, r):
        for name in ("alpha", "beta"):
            with pytest.raises(ValueError, match="^ps: pick selector .* was removed"):
                getattr(ps, name)
        with pytest.raises(ValueError, match="^ps: expected a pick selector of its buffer"):
            ps.beta = 0.7
        with pytest.raises(ValueError, match="^beta: expected a finite number >= 0"):
            ps.beta = -1.0
    q = buf.new_pick_selector(Prioritized, alpha=0.5, beta=0.3)  # a live one is unaffected
    q.beta = 0.9
    assert (q.alpha, q.beta) == (0.5, 0.9) and "removed" not in repr(q)


def test_selector_kind_is_the_enum_in_both(make_buffer):
    """docs/api.md, PickSelector: kind is the PickSelectorClass member in
    both implementations (the C buffer's was a plain int): it equals its int
    value and the enum, hashes as the int, and has a name. Looked-up and
    removed selectors keep it."""
    buf = make_buffer(state_shape=(2,))
    made = [buf.new_pick_selector(k) for k in (0, Prioritized, PickSelectorClass.Rank)]
    for ps in made + buf.pick_selectors() + [buf.pick_selector(1)]:
        k = ps.kind
        assert type(k) is PickSelectorClass and k is PickSelectorClass(int(ps) % 3)
        assert k == int(k) and isinstance(k, int) and hash(k) == hash(int(k))
    assert [p.kind.name for p in made] == ["Uniform", "Prioritized", "Rank"]
    assert [p.kind for p in made] == [0, 1, 2]
    buf.remove_pick_selector(made[1])
    assert made[1].kind is Prioritized


def test_unknown_selector_handle_message(make_buffer):
    """docs/api.md, Errors: a handle that names no selector (never made,
    removed, negative, beyond int64) is the same ValueError in both
    implementations, showing the handle as given; a ps of another type the
    same TypeError (the reference said "(handles [0, 2]), got 1" and "expected
    an int, got 1.0 (float)")."""
    buf = make_buffer(state_shape=(2,))
    a = buf.new_pick_selector(Uniform)
    b = buf.new_pick_selector(Prioritized)
    buf.new_pick_selector(Uniform)
    fill(buf, None, 3)
    buf.remove_pick_selector(b)
    calls = [lambda ps: buf.get_batch(1, ps), lambda ps: buf.set_priority(ps, [0], [0], [1.0]),
             lambda ps: buf.remove_pick_selector(ps), lambda ps: buf.pick_selector(ps)]
    for ps, shown in ((b, "1"), (1, "1"), (7, "7"), (-1, "-1"), (2**70, str(2**70)),
                      (np.int64(5), "5")):
        for call in calls:
            with pytest.raises(ValueError) as e:
                call(ps)
            assert str(e.value) == "ps: expected a pick selector of this buffer, got unknown " \
                                   "handle " + shown
    for ps, got in ((1.0, "float"), (True, "bool"), ("0", "str"), (None, "NoneType"),
                    (np.array([0]), "numpy.ndarray of dtype int64 and shape (1,)")):
        for call in calls:
            with pytest.raises(TypeError) as e:
                call(ps)
            assert str(e.value) == "ps: expected a PickSelector or an int handle, got " + got
    assert buf.get_batch(1, np.array(0)).seq_len.tolist() == [1] and int(a) == 0


def test_reprs_have_one_format(make_buffer):
    """docs/api.md, "repr": the buffer, its selectors, batches and episodes
    show the same text in both implementations but for the class names (the
    reference's had a format of its own: "records=3, episodes=1",
    "state=<float32 (2, 1, 2)>", kind=prioritized in the C selector's)."""
    buf = make_buffer(state_shape=(2,), capacity=100, pick_len=2, seed=3)
    name = type(buf).__name__
    sel = "PickSelector" if name == "ExperienceReplay" else "RefPickSelector"
    u = buf.new_pick_selector(Uniform)
    p = buf.new_pick_selector(Prioritized, alpha=0.5, beta=0.25)
    h = fill(buf, None, 3, terminated=True)
    assert repr(buf) == (f"{name}(state_shape=(2,), state_dtype=float32, action_shape=(), "
                         "action_dtype=int64, reward_dtype=float32, capacity=100, pick_len=2, "
                         "allow_short=False, eviction='fifo', seed=3; 3 records in 1 episodes, "
                         "2 picks)")
    assert repr(u) == f"{sel}(handle=0, kind=PickSelectorClass.Uniform)"
    assert repr(p) == f"{sel}(handle=1, kind=PickSelectorClass.Prioritized, alpha=0.5, beta=0.25)"
    b = buf.get_batch(4, p)
    fields = ("state=float32(4, 2, 2), action=int64(4, 2), reward=float32(4, 2), "
              "state_next=float32(4, 2, 2), seq_len=int64(4,), seq_len_next=int64(4,), "
              "pick_epi=int64(4,), pick_pos=int64(4,), weight=float32(4,)")
    idx = ", pick_index=int64(4,)"  # both implementations' batches have it
    assert repr(b) == f"Batch({fields}{idx})"
    b.extras["me"] = b
    assert repr(b) == f"Batch({fields}{idx}, extras={{'me': Batch(...)}})"
    s = buf.get_batch(4, p, shared_next=True)
    assert repr(s) == f"Batch({fields}{idx}, state_seq=float32(4, 3, 2))"
    assert repr(buf.episode(h)) == ("EpisodeData(state=float32(3, 2), action=int64(3,), "
                                    "reward=float32(3,), final_state=None, ended=True, "
                                    "terminated=True)")
    buf.remove_pick_selector(p)
    assert repr(p) == f"{sel}(handle=1, kind=PickSelectorClass.Prioritized, removed)"


def test_reprs_agree_with_named_fields_and_extras():
    """The C buffer and the reference built and filled alike give the same
    reprs (but for the class names), named state
    fields and extras included: a dict of fields item by item, never the
    arrays' contents (the reference's showed them in full)."""
    import exreplay
    from exreplay.reference import ReferenceReplay

    def reprs(cls):
        spec = {"img": ((2, 2), "uint8"), "v": (3, "float32")}
        buf = cls(state_spec=spec, extras_spec={"logp": ((), "float32")}, pick_len=2, seed=1)
        ps = buf.new_pick_selector(PickSelectorClass.Rank, alpha=0.75, beta=0.5)
        states = {"img": np.zeros((5, 2, 2), np.uint8), "v": np.zeros((5, 3), np.float32)}
        h = buf.record_many(None, states, np.zeros(5, np.int64), np.ones(5),
                            extras={"logp": np.zeros(5, np.float32)},
                            final_state={k: v[0] for k, v in states.items()})
        out = [buf, ps, buf.get_batch(2, ps), buf.get_batch(2, ps, shared_next=True),
               buf.episode(h), cls(state_shape=3, extras_spec={"m": ((2,), "bool")}, capacity=None),
               cls(state_shape=(), state_dtype="uint8", action_shape=(2,), action_dtype="float32",
                   reward_dtype="float64", allow_short=True, eviction="second_chance")]
        return [repr(x).replace("ReferenceReplay(", "ExperienceReplay(")
                .replace("RefPickSelector(", "PickSelector(") for x in out]

    c, ref = reprs(exreplay.ExperienceReplay), reprs(ReferenceReplay)
    assert c == ref
    assert "state={'img': uint8(2, 2, 2, 2), 'v': float32(2, 2, 3)}" in c[2]
    assert "extras={'logp': float32(2, 2)}" in c[2] and "array(" not in "".join(c)


def test_pick_selector_gives_an_object_of_a_held_selector(make_buffer):
    """docs/api.md, "pick_selector and pick_selectors": an object as
    new_pick_selector returned it, but a new one at every call; objects of one
    selector are equal, hash alike and share its alpha and beta."""
    buf = make_buffer(state_shape=(2,), seed=3)
    assert buf.pick_selectors() == []
    u = buf.new_pick_selector(Uniform)
    p = buf.new_pick_selector(Prioritized, alpha=0.5, beta=0.3)
    gone = buf.new_pick_selector(Prioritized)
    r = buf.new_pick_selector(PickSelectorClass.Rank)
    buf.remove_pick_selector(gone)
    h = fill(buf, None, 6, terminated=True)
    for orig in (u, p, r):
        for q in (buf.pick_selector(int(orig)), buf.pick_selector(orig)):
            assert q is not orig and q is not buf.pick_selector(int(orig))
            assert q == orig and q == int(orig) and hash(q) == hash(orig) == hash(int(orig))
            assert (q.handle, q.kind, q.alpha, q.beta) == (orig.handle, orig.kind, orig.alpha, orig.beta)
            assert repr(q) == repr(orig) and q.buffer is orig.buffer is buf
    assert u.alpha is None and buf.pick_selector(0).beta is None
    assert p != buf.pick_selector(int(r)) and p != u
    listed = buf.pick_selectors()
    assert listed == [u, p, r] and [int(x) for x in listed] == [0, 1, 3]
    assert [x.kind for x in listed] == [Uniform, Prioritized, PickSelectorClass.Rank]
    assert all(x is not y for x, y in zip(listed, buf.pick_selectors()))
    # every object of the selector reads and sets the same beta
    q = buf.pick_selector(1)
    q.beta = 0.9
    assert p.beta == 0.9 and buf.pick_selectors()[1].beta == 0.9
    p.beta = 0.2
    assert q.beta == 0.2 and (q.alpha, p.alpha) == (0.5, 0.5)
    # and it works wherever a selector does
    assert buf.set_priority(q, [h, h], [0, 1], [4.0, 2.0]) == 2
    assert prio_of(buf, p, [(h, 0), (h, 1)]) == pytest.approx([4.0**0.5, 2.0**0.5], rel=1e-6)
    assert buf.get_batch(3, q).weight.shape == (3,)
    assert buf.get_batch(2, buf.pick_selector(3)).seq_len.tolist() == [1, 1]
    # removed through a looked-up object: every object of it reports it
    buf.remove_pick_selector(buf.pick_selector(3))
    assert "removed" in repr(r) and [int(x) for x in buf.pick_selectors()] == [0, 1]
    with pytest.raises(ValueError, match="^ps: pick selector 3 was removed"):
        r.beta
    buf._check()


def test_pick_selector_refuses_what_names_no_selector(make_buffer):
    """Unknown and removed handles are a ValueError, anything but an int or a
    selector object a TypeError, each naming ps, what was expected and what
    came; a selector object of another buffer is a ValueError."""
    buf = make_buffer(state_shape=(2,))
    other = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized)
    removed = buf.new_pick_selector(Uniform)
    buf.remove_pick_selector(removed)
    for bad in (int(removed), removed, 2, -1, 2**63, 2**70):
        with pytest.raises(ValueError, match="^ps: expected a pick selector of this buffer.*, got"):
            buf.pick_selector(bad)
    for bad in ("0", b"0", 1.0, None, True, np.array([0]), [0]):
        with pytest.raises(TypeError, match="^ps: expected .*int.*, got"):
            buf.pick_selector(bad)
    with pytest.raises(ValueError, match="^ps: expected a pick selector of this buffer, got one "
                                         "of another buffer"):
        other.pick_selector(ps)
    with pytest.raises(TypeError):
        buf.pick_selectors(0)
    assert buf.pick_selector(np.int64(0)) == ps == buf.pick_selector(np.array(0))


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_restored_selectors_anneal_as_the_original(make_buffer, how):
    """A copy's selectors come back with their parameters (the beta set
    last included); pick_selector gives objects for them, through which
    beta anneals as it does on the original: the same weights at every
    beta, and other weights than before. The copy's and the original's
    selectors are apart: a beta set on one is not the other's."""
    import copy

    buf = make_buffer(state_shape=(2,), capacity=40, pick_len=2, seed=7)
    u = buf.new_pick_selector(Uniform)
    ps = buf.new_pick_selector(Prioritized, alpha=0.7, beta=0.4)
    rk = buf.new_pick_selector(PickSelectorClass.Rank, alpha=0.8, beta=0.2)
    h = None
    for i in range(30):
        h = buf.record(h, st_of(i), i, 0.0, priority=i % 7 + 0.5, terminated=i % 10 == 9)
    ps.beta = 0.55  # annealed before the checkpoint
    buf2 = pickle.loads(pickle.dumps(buf)) if how == "pickle" else copy.deepcopy(buf)
    buf2._check()
    with pytest.raises(ValueError, match="another buffer"):
        buf2.pick_selector(ps)  # the original's object
    restored = buf2.pick_selectors()
    assert restored == [0, 1, 2] and all(x.buffer is buf2 for x in restored)
    assert all(x != y for x, y in zip(restored, (u, ps, rk)))  # of another buffer
    ps2, rk2 = buf2.pick_selector(int(ps)), buf2.pick_selector(int(rk))
    assert (ps2.kind, ps2.alpha, ps2.beta) == (Prioritized, 0.7, 0.55)
    assert (rk2.kind, rk2.alpha, rk2.beta) == (PickSelectorClass.Rank, 0.8, 0.2)
    assert buf2.pick_selector(int(u)).kind == Uniform
    epi, pos = buf._picks()
    for a, b in ((ps, ps2), (rk, rk2)):
        w0 = buf2._gather(b, epi, pos).weight
        np.testing.assert_array_equal(w0, buf._gather(a, epi, pos).weight)
        for beta in (0.8, 1.0):
            a.beta = beta
            b.beta = beta
            assert b.beta == beta and buf2.pick_selector(int(b)).beta == beta
            w = buf2._gather(b, epi, pos).weight
            np.testing.assert_array_equal(w, buf._gather(a, epi, pos).weight)
            assert not np.array_equal(w, w0)
            x, y = buf.get_batch(16, a), buf2.get_batch(16, b)
            np.testing.assert_array_equal(x.pick_epi, y.pick_epi)
            np.testing.assert_array_equal(x.weight, y.weight)
    ps2.beta = 0.1
    assert ps.beta == 1.0 and ps2.beta == 0.1
    buf2.remove_pick_selector(rk2)
    assert buf2.pick_selectors() == [0, 1] and buf.pick_selectors() == [u, ps, rk]


def test_selector_sees_picks_across_removal(make_buffer):
    buf = make_buffer(state_shape=(2,), seed=1)
    a = buf.new_pick_selector(Prioritized, alpha=1.0)
    b = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = fill(buf, None, 5)
    buf.set_priority(b, [h, h], [0, 1], [3.0, 5.0])
    buf.remove_pick_selector(a)
    fill(buf, h, 2, start=5)
    assert prio_of(buf, b, [(h, i) for i in range(6)]) == [3.0, 5.0, 1.0, 1.0, 5.0, 5.0]
    buf._check()


@pytest.mark.parametrize(
    "args, kwargs, exc",
    [
        ((Uniform,), dict(alpha=0.5), TypeError),
        ((Prioritized,), dict(gamma=0.5), TypeError),
        ((Prioritized,), dict(alpha=-0.5), ValueError),
        ((Prioritized,), dict(alpha=float("nan")), ValueError),
        ((Prioritized,), dict(beta=float("inf")), ValueError),
        ((Prioritized,), dict(alpha="0.5"), TypeError),
        ((7,), {}, ValueError),
        (("Uniform",), {}, TypeError),
        ((1.0,), {}, TypeError),
    ],
)
def test_new_pick_selector_bad_arguments(make_buffer, args, kwargs, exc):
    buf = make_buffer(state_shape=(2,))
    with pytest.raises(exc):
        buf.new_pick_selector(*args, **kwargs)
    # a failed call takes no handle
    assert int(buf.new_pick_selector(Uniform)) == 0


def test_selector_generators_are_independent(make_buffer):
    def draws(extra):
        buf = make_buffer(state_shape=(2,), seed=11)
        a = buf.new_pick_selector(Uniform)
        b = buf.new_pick_selector(Uniform)
        fill(buf, None, 30)
        if extra:
            buf.get_batch(100, b)
        return buf.get_batch(20, a).pick_pos.tolist()

    assert draws(False) == draws(True)


# --------------------------------------------------------------------------
# eviction (docs/semantics.md)
# --------------------------------------------------------------------------


def test_unbounded_capacity(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=None)
    fill(buf, None, 500)
    assert len(buf) == 500 and buf.num_episodes == 1


def test_fifo_evicts_the_oldest(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=6, eviction="fifo")
    u = buf.new_pick_selector(Uniform)
    hs = [fill(buf, None, 2, start=10 * k, terminated=True) for k in range(3)]
    assert buf._handles() == hs and len(buf) == 6
    gather(buf, u, [(hs[0], 0)])  # sampled: fifo does not care
    h3 = buf.record(None, st_of(30), 30, 0.0)
    assert buf._handles() == [hs[1], hs[2], h3] and len(buf) == 5
    assert all(e != hs[0] for e, _ in picks(buf))
    h3 = fill(buf, h3, 2, start=31)
    assert buf._handles() == [hs[2], h3] and len(buf) == 5
    buf._check()


def test_fifo_evicts_the_episode_being_recorded_into(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=3)
    h = fill(buf, None, 3)
    assert len(buf) == 3 and buf.num_picks == 2
    h_again = buf.record(h, st_of(3), 3, 0.0)
    assert h_again == h  # the handle recorded into, now gone
    assert buf._handles() == [] and len(buf) == 0 and buf.num_picks == 0
    with pytest.raises(ValueError):
        buf.episode(h)
    h2 = buf.record(h, st_of(4), 4, 0.0)
    assert h2 == h + 1 and buf._handles() == [h2]
    buf._check()


def test_fifo_evicts_empty_episodes_in_turn(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=4)
    e = buf.new_episode()
    h1 = fill(buf, None, 2, terminated=True)
    h2 = fill(buf, None, 2, terminated=True)
    assert buf._handles() == [e, h1, h2]
    h3 = buf.record(None, st_of(9), 9, 0.0)
    # the empty episode goes first (frees nothing), then h1
    assert buf._handles() == [h2, h3] and len(buf) == 3
    buf._check()


def test_record_many_straddling_eviction_starts_new_episodes(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=3)
    states = np.stack([st_of(i) for i in range(5)])
    h = buf.record_many(None, states, np.arange(5), np.zeros(5))
    # steps 0..3 went into episode 0, which the 4th step evicted; step 4
    # then started episode 1
    assert h == 1 and buf._handles() == [1] and len(buf) == 1
    np.testing.assert_array_equal(buf.episode(1).state[0], st_of(4))
    buf._check()


def test_second_chance_order(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=6, eviction="second_chance")
    u = buf.new_pick_selector(Uniform)
    h0, h1, h2 = [fill(buf, None, 2, start=10 * k, final_state=st_of(0)) for k in range(3)]
    gather(buf, u, [(h0, 0)])  # mark h0
    # the hand is at h0: it is marked, so the mark is cleared and h1 goes
    h3 = buf.record(None, st_of(30), 30, 0.0)
    assert buf._handles() == [h0, h2, h3]
    h3 = buf.record(h3, st_of(31), 31, 0.0, terminated=True)
    # the hand moved on to h2
    h4 = buf.record(None, st_of(40), 40, 0.0)
    assert buf._handles() == [h0, h3, h4]
    h4 = buf.record(h4, st_of(41), 41, 0.0, terminated=True)
    gather(buf, u, [(h3, 0), (h4, 1)])  # mark h3 and h4
    # hand at h3 (marked, cleared), h4 (marked, cleared), then h5: the
    # episode being recorded into is evicted
    h5 = buf.record(None, st_of(50), 50, 0.0)
    assert buf._handles() == [h0, h3, h4] and len(buf) == 6
    # the hand wrapped round to the oldest: h0, whose mark was cleared
    h6 = buf.record(h5, st_of(60), 60, 0.0)
    assert h6 == h5 + 1
    assert buf._handles() == [h3, h4, h6]
    buf._check()


def test_second_chance_all_marked_wraps(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=4, eviction="second_chance")
    u = buf.new_pick_selector(Uniform)
    h0 = fill(buf, None, 2, terminated=True)
    h1 = fill(buf, None, 2, terminated=True)
    gather(buf, u, [(h0, 0), (h1, 0)])
    # every episode is marked; once the hand has cleared the marks and
    # wrapped, the new (unmarked) episode under recording is reached first
    h2 = buf.record(None, st_of(9), 9, 0.0)
    assert buf._handles() == [h0, h1] and len(buf) == 4
    # now the hand is back at h0, unmarked
    h3 = buf.record(None, st_of(10), 10, 0.0)
    assert h3 == h2 + 1 and buf._handles() == [h1, h3]
    buf._check()


def test_get_batch_marks_episodes_for_second_chance(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=4, eviction="second_chance", seed=0)
    u = buf.new_pick_selector(Uniform)
    h0 = fill(buf, None, 2, terminated=True)
    buf.get_batch(8, u)  # only h0 has picks: it is marked
    h1 = fill(buf, None, 2, terminated=True)
    h2 = buf.record(None, st_of(9), 9, 0.0)
    assert buf._handles() == [h0, h2]  # h0 spared once, h1 evicted
    assert h1 not in buf._handles()


def test_eviction_with_fifo_vs_second_chance_differs(make_buffer):
    result = {}
    for ev in ("fifo", "second_chance"):
        buf = make_buffer(state_shape=(2,), capacity=4, eviction=ev)
        u = buf.new_pick_selector(Uniform)
        h0 = fill(buf, None, 2, terminated=True)
        fill(buf, None, 2, terminated=True)
        gather(buf, u, [(h0, 1)])
        fill(buf, None, 2, terminated=True)
        result[ev] = buf._handles()
    assert result == {"fifo": [1, 2], "second_chance": [0, 2]}


def test_eviction_removes_picks_and_priorities(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=10, pick_len=2, seed=0)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = None
    for i in range(40):
        h = buf.record(h, st_of(i), i, 0.0, priority=float(i + 1), terminated=i % 4 == 3)
        buf._check()
    pk = picks(buf)
    for e, p in pk:
        # pick (e, p) of episode e = the 4 steps 4e .. 4e+3; priority of step 4e + p
        assert prio_of(buf, ps, [(e, p)]) == [float(4 * e + p + 1)]
    b = buf.get_batch(100, ps)
    assert set(zip(b.pick_epi.tolist(), b.pick_pos.tolist())) <= set(pk)


# --------------------------------------------------------------------------
# record_many
# --------------------------------------------------------------------------


def test_record_many_equals_record_calls(make_buffer):
    def build(many):
        buf = make_buffer(state_shape=(3,), pick_len=2, capacity=20, allow_short=True, seed=1)
        ps = buf.new_pick_selector(Prioritized, alpha=0.8)
        h = None
        rng = np.random.default_rng(0)
        for k in range(6):
            T = int(rng.integers(1, 7))
            states = rng.standard_normal((T, 3)).astype(np.float32)
            actions = rng.integers(0, 4, T)
            rewards = rng.standard_normal(T)
            prios = rng.random(T) * 3 if k % 2 else None
            final = rng.standard_normal(3) if k % 3 == 0 else None
            term = k % 3 == 1
            if many:
                h = buf.record_many(h, states, actions, rewards, final, term, prios)
            else:
                for t in range(T):
                    last = t == T - 1
                    h = buf.record(
                        h,
                        states[t],
                        actions[t],
                        rewards[t],
                        final_state=final if last else None,
                        terminated=term if last else False,
                        priority=None if prios is None else prios[t],
                    )
        buf._check()
        return snapshot(buf, [ps]), h

    assert build(True) == build(False)


def test_record_many_ends_only_with_the_last_step(make_buffer):
    buf = make_buffer(state_shape=(2,))
    states = np.stack([st_of(i) for i in range(3)])
    h = buf.record_many(None, states, [0, 1, 2], [0.0, 0.0, 0.0], final_state=st_of(3))
    e = buf.episode(h)
    assert e.ended and not e.terminated and len(e.action) == 3
    np.testing.assert_array_equal(e.final_state, st_of(3))
    assert picks(buf) == [(h, 0), (h, 1), (h, 2)]
    h2 = buf.record_many(h, states, [0, 1, 2], [0.0] * 3, terminated=True)
    assert h2 == h + 1 and buf.episode(h2).terminated


@pytest.mark.parametrize(
    "kwargs, exc, argname",
    [
        (dict(states=np.zeros((0, 2))), ValueError, "states"),
        (dict(states=np.zeros((3, 3))), ValueError, "states"),
        (dict(states=np.zeros(2)), ValueError, "states"),
        (dict(states=np.zeros((3, 2), complex)), TypeError, "states"),
        (dict(actions=[0, 1]), ValueError, "actions"),
        (dict(actions=[0.0, 1.0, 2.0]), TypeError, "actions"),
        (dict(rewards=[0.0, 1.0]), ValueError, "rewards"),
        (dict(rewards=0.0), ValueError, "rewards"),
        (dict(priorities=[1.0, -1.0, 1.0]), ValueError, "priorities"),
        (dict(priorities=[1.0, 1.0, float("nan")]), ValueError, "priorities"),
        (dict(priorities=[1.0, 1.0]), ValueError, "priorities"),
        (dict(final_state=[1.0]), ValueError, "final_state"),
        (dict(final_state=[1 + 1j, 0]), TypeError, "final_state"),
        (dict(h="x"), TypeError, "h"),
    ],
)
def test_record_many_bad_inputs_change_nothing(make_buffer, kwargs, exc, argname):
    buf = make_buffer(state_shape=(2,), capacity=8)
    ps = buf.new_pick_selector(Prioritized)
    h = fill(buf, None, 4)
    args = dict(
        h=h,
        states=np.stack([st_of(i) for i in range(3)]),
        actions=[0, 1, 2],
        rewards=[0.0, 1.0, 2.0],
    )
    args.update(kwargs)
    before = snapshot(buf, [ps])
    with pytest.raises(exc, match=argname):
        buf.record_many(**args)
    assert snapshot(buf, [ps]) == before
    assert buf.new_episode() == h + 1  # no handle was taken
    buf._check()


# --------------------------------------------------------------------------
# record: inputs, casting and errors (docs/semantics.md)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, argname",
    [
        (dict(state=[1.0, 2.0, 3.0]), ValueError, "state"),
        (dict(state=[[1.0, 2.0]]), ValueError, "state"),
        (dict(state=[1 + 2j, 0]), TypeError, "state"),
        (dict(state="ab"), TypeError, "state"),
        (dict(state=None), TypeError, "state"),
        (dict(state=[[1.0], [2.0, 3.0]]), ValueError, "state"),
        (dict(action=1.5), TypeError, "action"),
        (dict(action=[1, 2]), ValueError, "action"),
        (dict(action="a"), TypeError, "action"),
        (dict(reward=[1.0, 2.0]), ValueError, "reward"),
        (dict(reward=1j), TypeError, "reward"),
        (dict(reward="1"), TypeError, "reward"),
        (dict(priority=-1.0), ValueError, "priority"),
        (dict(priority=float("nan")), ValueError, "priority"),
        (dict(priority=float("inf")), ValueError, "priority"),
        (dict(priority=[1.0, 2.0]), ValueError, "priority"),
        (dict(priority="high"), TypeError, "priority"),
        (dict(final_state=[1.0]), ValueError, "final_state"),
        (dict(final_state=[1 + 1j, 0]), TypeError, "final_state"),
        (dict(terminated=np.array([True, False])), TypeError, "terminated"),
        (dict(h=1.0), TypeError, "h"),
    ],
)
def test_record_bad_inputs_change_nothing(make_buffer, kwargs, exc, argname):
    buf = make_buffer(state_shape=(2,), capacity=5)
    ps = buf.new_pick_selector(Prioritized)
    h = fill(buf, None, 5)  # full: a successful record would evict
    args = dict(h=h, state=st_of(5), action=5, reward=0.5)
    args.update(kwargs)
    before = snapshot(buf, [ps])
    with pytest.raises(exc, match=argname):
        buf.record(**args)
    assert snapshot(buf, [ps]) == before
    assert buf.new_episode() == h + 1  # no handle was taken
    buf._check()


def test_priority_error_message_names_what_came(make_buffer):
    buf = make_buffer(state_shape=(2,))
    with pytest.raises(ValueError, match=r"priority.*-1\.0"):
        buf.record(None, st_of(0), 0, 0.0, priority=-1.0)


def test_float_into_int_state_is_a_type_error(make_buffer):
    buf = make_buffer(state_shape=(2,), state_dtype="int32")
    with pytest.raises(TypeError, match="state"):
        buf.record(None, [1.5, 2.0], 0, 0.0)
    with pytest.raises(TypeError, match="state"):
        buf.record(None, np.array([1, 2], np.float32), 0, 0.0)
    assert len(buf) == 0 and buf.num_episodes == 0


def test_int_list_into_uint8_state_is_fine(make_buffer):
    # Python ints carry no dtype of their own: only their kind counts (NEP 50)
    buf = make_buffer(state_shape=(3,), state_dtype="uint8")
    h = buf.record(None, [1, 2, 255], 0, 0.0)
    e = buf.episode(h)
    assert e.state.dtype == np.uint8 and e.state[0].tolist() == [1, 2, 255]
    h = buf.record(h, np.array([3, 4, 5], np.uint8), 0, 0.0)
    assert buf.episode(h).state[1].tolist() == [3, 4, 5]
    # ... but a value that does not fit is a ValueError
    before = snapshot(buf)
    with pytest.raises(ValueError, match="state"):
        buf.record(h, [1, 2, 256], 0, 0.0)
    with pytest.raises(ValueError, match="state"):
        buf.record(h, [-1, 2, 3], 0, 0.0)
    assert snapshot(buf) == before


def test_int64_array_into_uint8_state_follows_same_kind(make_buffer):
    # a NumPy array has a dtype, and int64 -> uint8 is not a same_kind cast
    buf = make_buffer(state_shape=(3,), state_dtype="uint8")
    with pytest.raises(TypeError, match="state"):
        buf.record(None, np.array([3, 4, 5], np.int64), 0, 0.0)
    assert len(buf) == 0 and buf.num_episodes == 0


@pytest.mark.parametrize(
    "state_dtype, value, ok",
    [
        ("float32", np.array([1, 2], np.float64), True),
        ("float32", [1, 2], True),
        ("float16", [0.5, 1e3], True),
        ("float64", np.array([1, 2], np.complex64), False),
        ("int8", np.array([1, 2], np.int64), True),
        ("int8", np.array([1, 2], np.uint64), True),  # u -> i is same_kind, i -> u is not
        ("uint8", np.array([1, 2], np.int8), False),
        ("uint8", np.array([1, 2], np.uint16), True),
        ("uint8", [1, 2], True),
        ("int16", [1.0, 2.0], False),
        ("int64", np.array([1, 2], np.uint64), True),
        ("uint16", [True, False], True),
        ("int16", np.array([1, 2], np.float16), False),
        ("bool", [True, False], True),
        ("bool", [1, 0], False),
        ("bool", [1.0, 0.0], False),
    ],
)
def test_same_kind_casting(make_buffer, state_dtype, value, ok):
    buf = make_buffer(state_shape=(2,), state_dtype=state_dtype)
    if ok:
        h = buf.record(None, value, 0, 0.0)
        got = buf.episode(h).state[0]
        assert got.dtype == np.dtype(state_dtype)
        np.testing.assert_array_equal(got, np.asarray(value).astype(state_dtype))
    else:
        with pytest.raises(TypeError, match="state"):
            buf.record(None, value, 0, 0.0)
        assert len(buf) == 0


def test_action_and_reward_casting(make_buffer):
    buf = make_buffer(
        state_shape=(2,), action_shape=(2,), action_dtype="float32", reward_dtype="float64"
    )
    h = buf.record(None, st_of(0), [1, 2], 3)  # ints into float: fine
    e = buf.episode(h)
    assert e.action.dtype == np.float32 and e.action[0].tolist() == [1.0, 2.0]
    assert e.reward.dtype == np.float64 and e.reward.tolist() == [3.0]
    buf2 = make_buffer(state_shape=(2,))
    with pytest.raises(TypeError, match="action"):
        buf2.record(None, st_of(0), np.float32(1), 0.0)
    buf2.record(None, st_of(0), np.uint8(1), np.float64(0.5))
    buf2.record(None, st_of(0), np.array(2, np.int16), np.array(0.5))


def test_read_only_inputs_are_accepted(make_buffer):
    buf = make_buffer(state_shape=(2,))
    s = st_of(3)
    s.flags.writeable = False
    a = np.array(1)
    a.flags.writeable = False
    h = buf.record(None, s, a, 0.0, final_state=s)
    np.testing.assert_array_equal(buf.episode(h).state[0], st_of(3))


def test_non_contiguous_inputs(make_buffer):
    buf = make_buffer(state_shape=(2, 2), state_dtype="int16")
    big = np.arange(16, dtype=np.int64).reshape(4, 4)
    h = buf.record(None, big[::2, ::2], 0, 0.0)
    assert buf.episode(h).state[0].tolist() == [[0, 2], [8, 10]]


def test_priority_accepts_numpy_and_int_scalars(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized, alpha=1.0)
    h = buf.record(None, st_of(0), 0, 0.0, priority=np.float32(2.0))
    h = buf.record(h, st_of(1), 1, 0.0, priority=3)
    h = buf.record(h, st_of(2), 2, 0.0, priority=np.array(0.0), terminated=True)
    assert prio_of(buf, ps, [(h, 0), (h, 1), (h, 2)]) == [2.0, 3.0, 0.0]


# --------------------------------------------------------------------------
# test hooks
# --------------------------------------------------------------------------


def test_gather_and_priority_reject_missing_picks(make_buffer):
    buf = make_buffer(state_shape=(2,))
    ps = buf.new_pick_selector(Prioritized)
    h = fill(buf, None, 3)
    with pytest.raises(ValueError):
        gather(buf, ps, [(h, 0), (h, 2)])  # (h, 2): not complete yet
    with pytest.raises(ValueError):
        prio_of(buf, ps, [(h + 1, 0)])
    with pytest.raises(ValueError, match="ps"):
        gather(buf, 9, [(h, 0)])


def test_picks_hook_lists_every_pick_once(make_buffer):
    buf = make_buffer(state_shape=(2,), pick_len=2, capacity=30)
    h = None
    for i in range(100):
        h = buf.record(h, st_of(i), i, 0.0, terminated=i % 7 == 6)
    epi, pos = buf._picks()
    pairs = list(zip(epi.tolist(), pos.tolist()))
    assert len(pairs) == len(set(pairs)) == buf.num_picks
    want = []
    for e in buf._handles():
        d = buf.episode(e)
        m = expected_num_picks(len(d.action), 2, False, d.ended)
        want += [(e, p) for p in range(m)]
    assert sorted(pairs) == sorted(want)
    assert len(buf) == sum(len(buf.episode(e).action) for e in buf._handles())


# --------------------------------------------------------------------------
# pickling and threads
# --------------------------------------------------------------------------


def test_pickle_round_trip_behaves_the_same(make_buffer):
    buf = make_buffer(state_shape=(2,), capacity=20, pick_len=2, seed=5, eviction="second_chance")
    ps = buf.new_pick_selector(Prioritized, alpha=0.7, beta=0.3)
    u = buf.new_pick_selector(Uniform)
    h = None
    for i in range(30):
        h = buf.record(h, st_of(i), i, 0.0, priority=i % 5 + 0.5, terminated=i % 6 == 5)
    buf.get_batch(3, u)
    buf2 = pickle.loads(pickle.dumps(buf))
    buf2._check()
    # the copy has the same selector handles; its selector objects are its own
    with pytest.raises(ValueError, match="another buffer"):
        buf2.get_batch(1, ps)
    assert snapshot(buf2) == snapshot(buf)
    epi, pos = buf._picks()
    assert buf2._priority(int(ps), epi, pos).tolist() == buf._priority(ps, epi, pos).tolist()
    for sel in (ps, u):
        a, b = buf.get_batch(16, sel), buf2.get_batch(16, int(sel))
        for x, y in zip((*a, a.weight), (*b, b.weight)):
            np.testing.assert_array_equal(x, y)
    for i in range(10):  # same eviction state
        h = buf.record(h, st_of(i), i, 0.0)
        buf2.record(h, st_of(i), i, 0.0)
    assert buf._handles() == buf2._handles()


def test_concurrent_use(make_buffer):
    buf = make_buffer(state_shape=(4,), capacity=500, pick_len=2, seed=0)
    ps = buf.new_pick_selector(Prioritized)
    u = buf.new_pick_selector(Uniform)
    errors = []

    def actor(k):
        try:
            h = None
            rng = np.random.default_rng(k)
            for i in range(300):
                h = buf.record(
                    h,
                    rng.standard_normal(4),
                    int(rng.integers(0, 3)),
                    1.0,
                    priority=float(rng.random()),
                    terminated=i % 25 == 24,
                )
        except Exception as e:  # pragma: no cover
            errors.append(e)

    def learner():
        try:
            for _ in range(100):
                if buf.num_picks:
                    b = buf.get_batch(16, ps)
                    buf.set_priority(ps, b.pick_epi, b.pick_pos, np.abs(b.reward[:, 0]) + 0.1)
                    buf.get_batch(8, u)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=actor, args=(k,)) for k in range(4)]
    threads += [threading.Thread(target=learner) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(buf) <= 500
    buf._check()


# --------------------------------------------------------------------------
# random operations against an independent model
# --------------------------------------------------------------------------


class Model:
    """A second, deliberately plain statement of docs/semantics.md: episodes
    in a dict, picks as a dict (h, pos) -> leaf, the second-chance hand as a
    handle value."""

    def __init__(self, capacity, pick_len, allow_short, eviction, alpha):
        self.capacity, self.L, self.short, self.ev, self.alpha = (
            capacity,
            pick_len,
            allow_short,
            eviction,
            alpha,
        )
        self.eps = {}  # h -> dict(states, prios, ended, terminated, final, marked)
        self.next = 0
        self.hand = 0
        self.leaves = {}
        self.maxp = 1.0

    def leaf(self, p):
        return 0.0 if p == 0 else f32(min(p**self.alpha, float(np.finfo(np.float32).max)))

    def m(self, e):
        return expected_num_picks(len(e["states"]), self.L, self.short, e["ended"])

    def new(self):
        h = self.next
        self.next += 1
        self.eps[h] = dict(
            states=[], prios=[], ended=False, terminated=False, final=None, marked=False
        )
        return h

    def size(self):
        return sum(len(e["states"]) for e in self.eps.values())

    def record(self, h, s, prio, final, term):
        if h not in self.eps or self.eps[h]["ended"]:
            h = self.new()
        e = self.eps[h]
        old = self.m(e)
        e["states"].append(s)
        e["prios"].append(prio)
        if final is not None or term:
            e["ended"], e["final"], e["terminated"] = True, final, term
        for pos in range(old, self.m(e)):
            p = e["prios"][pos]
            p = self.maxp if p is None else p
            self.leaves[(h, pos)] = self.leaf(p)
            self.maxp = max(self.maxp, p)
        while self.capacity is not None and self.size() > self.capacity:
            self.evict()
        return h

    def under_hand(self):
        live = sorted(self.eps)
        after = [x for x in live if x >= self.hand]
        return after[0] if after else live[0]

    def move_hand_past(self, h):
        live = sorted(x for x in self.eps if x != h)
        after = [x for x in live if x > h]
        self.hand = after[0] if after else (live[0] if live else self.next)

    def evict(self):
        if self.ev == "fifo":
            victim = min(self.eps)
        else:
            while True:
                h = self.under_hand()
                if self.eps[h]["marked"]:
                    self.eps[h]["marked"] = False
                    self.move_hand_past(h)
                else:
                    victim = h
                    self.move_hand_past(h)
                    break
        del self.eps[victim]
        self.leaves = {k: v for k, v in self.leaves.items() if k[0] != victim}

    def set_priority(self, epi, pos, vals):
        n = 0
        for e, p, v in zip(epi, pos, vals):
            if (e, p) in self.leaves:
                self.leaves[(e, p)] = self.leaf(v)
                self.maxp = max(self.maxp, v)
                n += 1
        return n


op = st.one_of(
    st.tuples(
        st.just("record"),
        st.sampled_from(["same", "none", "old", "new"]),
        st.sampled_from(["open", "final", "terminated", "both"]),
        st.one_of(st.none(), st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.5, 100.0])),
    ),
    st.tuples(st.just("new_episode")),
    st.tuples(st.just("get_batch"), st.integers(1, 5)),
    st.tuples(
        st.just("set_priority"),
        st.lists(
            st.tuples(
                st.integers(0, 12), st.integers(-1, 6), st.sampled_from([0.0, 0.3, 3.0, 12.0])
            ),
            max_size=5,
        ),
    ),
)


# make_buffer only hands out a class, so sharing it across examples is safe
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    capacity=st.one_of(st.none(), st.integers(1, 12)),
    pick_len=st.integers(1, 3),
    allow_short=st.booleans(),
    eviction=st.sampled_from(["fifo", "second_chance"]),
    alpha=st.sampled_from([0.0, 0.5, 1.0]),
    ops=st.lists(op, max_size=60),
    seed=st.integers(0, 2**64 - 1),
)
def test_random_operations_match_the_model(
    make_buffer, capacity, pick_len, allow_short, eviction, alpha, ops, seed
):
    buf = make_buffer(
        state_shape=(1,),
        state_dtype="int64",
        capacity=capacity,
        pick_len=pick_len,
        allow_short=allow_short,
        eviction=eviction,
        seed=seed,
    )
    ps = buf.new_pick_selector(Prioritized, alpha=alpha, beta=0.5)
    u = buf.new_pick_selector(Uniform)
    model = Model(capacity, pick_len, allow_short, eviction, alpha)
    h = None
    counter = 0
    for o in ops:
        if o[0] == "record":
            _, which, end, prio = o
            target = {"same": h, "none": None, "old": 0, "new": model.next + 3}[which]
            counter += 1
            final = [-counter] if end in ("final", "both") else None
            term = end in ("terminated", "both")
            h = buf.record(
                target, [counter], counter, 0.0, final_state=final, terminated=term, priority=prio
            )
            want = model.record(target, counter, prio, None if final is None else -counter, term)
            assert h == want
        elif o[0] == "new_episode":
            assert buf.new_episode() == model.new()
        elif o[0] == "get_batch":
            sel = u if o[1] % 2 else ps
            if not model.leaves or (sel is ps and not any(model.leaves.values())):
                with pytest.raises(ValueError):
                    buf.get_batch(o[1], sel)
            else:
                b = buf.get_batch(o[1], sel)
                for e, p, w in zip(b.pick_epi.tolist(), b.pick_pos.tolist(), b.weight.tolist()):
                    assert (e, p) in model.leaves
                    model.eps[e]["marked"] = True
                    if sel is ps:
                        assert model.leaves[(e, p)] > 0
                        lo = min(v for v in model.leaves.values() if v > 0)
                        assert w == pytest.approx((lo / model.leaves[(e, p)]) ** 0.5, rel=1e-6)
        else:
            items = o[1]
            epi = [e for e, _, _ in items]
            pos = [p for _, p, _ in items]
            vals = [v for _, _, v in items]
            assert buf.set_priority(ps, epi, pos, vals) == model.set_priority(epi, pos, vals)

        buf._check()
        assert buf._handles() == sorted(model.eps)
        assert len(buf) == model.size()
        assert picks(buf) == sorted(model.leaves)
        if model.leaves:
            keys = sorted(model.leaves)
            assert prio_of(buf, ps, keys) == [model.leaves[k] for k in keys]
        for e, d in model.eps.items():
            got = buf.episode(e)
            assert got.state[:, 0].tolist() == d["states"]
            assert got.ended == d["ended"] and got.terminated == d["terminated"]
            assert (None if got.final_state is None else int(got.final_state[0])) == d["final"]
