"""API tests of the C buffer ``exreplay.ExperienceReplay``.

Every statement of docs/api.md and docs/semantics.md that can be observed
from Python, checked against the C class only (the reference and the
differential tests live elsewhere). Expected batch contents are computed
here from ``episode(h)``, never from another implementation.
"""

import operator
import random

import numpy as np
import pytest

import exreplay
from exreplay import ExperienceReplay, PickSelectorClass

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized


# ---- helpers ----------------------------------------------------------------


def make(state_shape=(4,), seed=0, **kw):
    return ExperienceReplay(state_shape, seed=seed, **kw)


def state_rows(buf, start, T, salt=0):
    """T distinct states of buf's shape/dtype; row t encodes start + t."""
    shape = buf.state_shape
    size = int(np.prod(shape)) if shape else 1
    base = np.arange(start, start + T, dtype=np.int64)[:, None] * 7 + np.arange(size)[None, :] + salt
    kind = buf.state_dtype.kind
    if kind == "u":
        base = base % 256 if buf.state_dtype.itemsize == 1 else base
    elif kind == "b":
        base = base % 2
    elif kind == "i" and buf.state_dtype.itemsize == 1:
        base = base % 128
    return base.astype(buf.state_dtype).reshape((T,) + shape)


def action_rows(buf, start, T):
    shape = buf.action_shape
    size = int(np.prod(shape)) if shape else 1
    a = (np.arange(start, start + T)[:, None] * 3 + np.arange(size)[None, :]) % 100
    return a.astype(buf.action_dtype).reshape((T,) + shape)


def reward_rows(buf, start, T):
    return (np.arange(start, start + T) * 0.5 - 3).astype(buf.reward_dtype)


def fill(buf, T, h=None, start=0, ended=False, final=True, terminated=False, priorities=None):
    """record_many T steps; final_state (if ended and final) is state start+T."""
    fs = state_rows(buf, start + T, 1)[0] if (ended and final) else None
    return buf.record_many(
        h,
        state_rows(buf, start, T),
        action_rows(buf, start, T),
        reward_rows(buf, start, T),
        final_state=fs,
        terminated=bool(ended and terminated),
        priorities=priorities,
    )


def complete(ep):
    n = len(ep.reward)
    return n if ep.ended else max(n - 1, 0)


def expected_picks(buf):
    L, short = buf.pick_len, buf.allow_short
    out = set()
    for h in buf._handles():
        ep = buf.episode(h)
        c = complete(ep)
        m = c if (ep.ended and short) else max(c - L + 1, 0)
        out |= {(h, p) for p in range(m)}
    return out


def picks_set(buf):
    e, p = buf._picks()
    assert e.dtype == np.int64 and p.dtype == np.int64
    s = set(zip(e.tolist(), p.tolist()))
    assert len(s) == len(e), "duplicate picks"
    return s


def check_counts(buf):
    hs = buf._handles()
    assert hs == sorted(hs) and len(set(hs)) == len(hs)
    assert buf.num_episodes == len(hs)
    assert len(buf) == sum(len(buf.episode(h).reward) for h in hs)
    assert picks_set(buf) == expected_picks(buf)
    assert buf.num_picks == len(expected_picks(buf))
    buf._check()


def _bcast(mask, nd):
    return mask.reshape(mask.shape + (1,) * nd)


def check_rows(buf, ep, batch, sel):
    """Batch rows sel all belong to episode ep: compare with its content."""
    L = buf.pick_len
    n = len(ep.reward)
    c = complete(ep)
    p = batch.pick_pos[sel]
    assert (p >= 0).all() and (p < c).all()
    ln = np.minimum(L, c - p)
    if not buf.allow_short or not ep.ended:
        assert (ln == L).all()
    assert np.array_equal(batch.seq_len[sel], ln)
    term_end = bool(ep.terminated) & (p + ln == n)
    assert np.array_equal(batch.seq_len_next[sel], ln - term_end)
    t = np.arange(L)
    valid = t[None, :] < ln[:, None]
    idx = np.where(valid, p[:, None] + t[None, :], 0)
    sn = len(buf.state_shape)
    an = len(buf.action_shape)
    fin = ep.final_state if ep.final_state is not None else np.zeros(buf.state_shape, buf.state_dtype)
    S = ep.state
    Snext = np.concatenate([S[1:], fin[None]], axis=0)
    exp_state = np.where(_bcast(valid, sn), S[idx], 0).astype(buf.state_dtype)
    exp_next = np.where(_bcast(valid, sn), Snext[idx], 0).astype(buf.state_dtype)
    exp_action = np.where(_bcast(valid, an), ep.action[idx], 0).astype(buf.action_dtype)
    exp_reward = np.where(valid, ep.reward[idx], 0).astype(buf.reward_dtype)
    assert np.array_equal(batch.state[sel], exp_state)
    assert np.array_equal(batch.state_next[sel], exp_next)
    assert np.array_equal(batch.action[sel], exp_action)
    assert np.array_equal(batch.reward[sel], exp_reward)


def check_batch(buf, batch, B=None):
    """Shapes, dtypes and every row's content against episode()."""
    L = buf.pick_len
    if B is None:
        B = len(batch.pick_epi)
    assert isinstance(batch, exreplay.Batch)
    assert batch.state.shape == (B, L) + buf.state_shape
    assert batch.state_next.shape == (B, L) + buf.state_shape
    assert batch.action.shape == (B, L) + buf.action_shape
    assert batch.reward.shape == (B, L)
    for f in ("seq_len", "seq_len_next", "pick_epi", "pick_pos"):
        a = getattr(batch, f)
        assert a.shape == (B,) and a.dtype == np.int64, f
    assert batch.weight.shape == (B,) and batch.weight.dtype == np.float32
    assert batch.state.dtype == buf.state_dtype
    assert batch.state_next.dtype == buf.state_dtype
    assert batch.action.dtype == buf.action_dtype
    assert batch.reward.dtype == buf.reward_dtype
    live = picks_set(buf)
    for e, p in zip(batch.pick_epi.tolist(), batch.pick_pos.tolist()):
        assert (e, p) in live
    for e in np.unique(batch.pick_epi):
        ep = buf.episode(int(e))
        check_rows(buf, ep, batch, np.nonzero(batch.pick_epi == e)[0])


def gather_all(buf, ps, chunk=None):
    """_gather every pick of the buffer (in chunks) and check each."""
    e, p = buf._picks()
    order = np.lexsort((p, e))
    e, p = e[order], p[order]
    chunk = chunk or len(e)
    for i in range(0, len(e), chunk):
        b = buf._gather(ps, e[i : i + chunk], p[i : i + chunk])
        assert np.array_equal(b.pick_epi, e[i : i + chunk])
        assert np.array_equal(b.pick_pos, p[i : i + chunk])
        check_batch(buf, b)
    return len(e)


def all_stored(buf, ps):
    e, p = buf._picks()
    return e, p, buf._priority(ps, e, p)


def f32pow(x, a):
    return float(np.float32(float(x) ** a))


# ---- construction -----------------------------------------------------------


def test_constructor_defaults():
    buf = ExperienceReplay((4,))
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
    assert buf._handles() == []
    e, p = buf._picks()
    assert len(e) == len(p) == 0
    buf._check()


def test_constructor_attributes_read_back():
    buf = ExperienceReplay(
        state_shape=[84, 84],
        state_dtype="uint8",
        action_shape=3,
        action_dtype=np.float32,
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
    assert isinstance(buf.action_dtype, np.dtype) and buf.action_dtype == np.float32
    assert isinstance(buf.reward_dtype, np.dtype) and buf.reward_dtype == np.float64
    assert buf.capacity is None
    assert buf.pick_len == 8
    assert buf.allow_short is True
    assert buf.eviction == "second_chance"
    assert buf.seed == 2**64 - 1


@pytest.mark.parametrize("shape,expect", [(4, (4,)), ((), ()), ((2, 3, 1), (2, 3, 1)), ([5], (5,))])
def test_constructor_shapes(shape, expect):
    buf = ExperienceReplay(shape, action_shape=shape, seed=0)
    assert buf.state_shape == expect
    assert buf.action_shape == expect
    h = buf.record(None, np.ones(expect), np.ones(expect, np.int64), 1.0, final_state=np.zeros(expect))
    assert buf.num_picks == 1
    b = buf.get_batch(3, buf.new_pick_selector(U))
    check_batch(buf, b)


@pytest.mark.parametrize("dt", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                                "uint32", "uint64", "float16", "float32", "float64"])
def test_constructor_state_and_action_dtypes(dt):
    buf = ExperienceReplay((3,), state_dtype=dt, action_dtype=dt, seed=0)
    assert buf.state_dtype == np.dtype(dt) and buf.action_dtype == np.dtype(dt)
    fill(buf, 5, ended=True)
    b = buf.get_batch(8, buf.new_pick_selector(U))
    check_batch(buf, b)
    ep = buf.episode(0)
    assert ep.state.dtype == np.dtype(dt)
    assert np.array_equal(ep.state, state_rows(buf, 0, 5))


@pytest.mark.parametrize("dt", ["float16", "float32", "float64"])
def test_constructor_reward_dtypes(dt):
    buf = ExperienceReplay(2, reward_dtype=dt, seed=0)
    assert buf.reward_dtype == np.dtype(dt)
    buf.record(None, [1, 2], 0, 1.5, terminated=True)
    assert buf.episode(0).reward.dtype == np.dtype(dt)
    assert buf.episode(0).reward[0] == 1.5


def test_constructor_non_native_byte_order_is_stored_native():
    buf = ExperienceReplay(2, state_dtype=">f4", action_dtype=">i4", seed=0)
    assert buf.state_dtype == np.dtype("float32") and buf.state_dtype.isnative
    assert buf.action_dtype == np.dtype("int32") and buf.action_dtype.isnative
    h = buf.record(None, np.array([1.5, 2.5], ">f4"), np.int32(3), 0.0, terminated=True)
    ep = buf.episode(h)
    assert ep.state.dtype.isnative and ep.state.tolist() == [[1.5, 2.5]]
    assert ep.action.tolist() == [3]


def test_seed_int_like_and_none():
    assert ExperienceReplay(2, seed=np.uint64(7)).seed == 7
    assert ExperienceReplay(2, seed=0).seed == 0
    assert ExperienceReplay(2).seed is None


# ---- episodes and handles ---------------------------------------------------


def test_handles_from_zero_increasing():
    buf = make()
    assert buf.new_episode() == 0
    assert buf.new_episode() == 1
    h = buf.record(None, np.zeros(4), 0, 0.0)
    assert h == 2
    assert isinstance(h, int)
    assert buf._handles() == [0, 1, 2]
    assert buf.num_episodes == 3
    # empty episodes count but hold nothing
    assert len(buf) == 1 and buf.num_picks == 0
    ep = buf.episode(0)
    assert len(ep.reward) == 0 and ep.state.shape == (0, 4)
    assert ep.final_state is None and ep.ended is False and ep.terminated is False
    check_counts(buf)


def test_record_into_empty_episode_uses_it():
    buf = make()
    h0 = buf.new_episode()
    h1 = buf.new_episode()
    assert buf.record(h0, np.zeros(4), 0, 0.0) == h0
    assert buf.record(h1, np.zeros(4), 0, 0.0) == h1
    assert buf.record(np.int64(h0), np.ones(4), 1, 0.0) == h0
    assert len(buf.episode(h0).reward) == 2
    check_counts(buf)


def test_record_into_none_unknown_ended_starts_new_episode():
    buf = make()
    h = buf.record(None, np.zeros(4), 0, 0.0)
    assert h == 0
    assert buf.record(None, np.zeros(4), 0, 0.0) == 1
    # unknown handles: never created, negative, huge
    assert buf.record(57, np.zeros(4), 0, 0.0) == 2
    assert buf.record(-3, np.zeros(4), 0, 0.0) == 3
    assert buf.record(2**70, np.zeros(4), 0, 0.0) == 4
    assert 57 not in buf._handles()
    # ended (final_state) episode
    assert buf.record(0, np.zeros(4), 0, 0.0, final_state=np.ones(4)) == 0
    assert buf.episode(0).ended
    assert buf.record(0, np.zeros(4), 0, 0.0) == 5
    # ended with terminated only
    assert buf.record(5, np.zeros(4), 0, 0.0, terminated=True) == 5
    ep = buf.episode(5)
    assert ep.ended and ep.terminated and ep.final_state is None
    assert buf.record(5, np.zeros(4), 0, 0.0) == 6
    assert buf._handles() == [0, 1, 2, 3, 4, 5, 6]
    assert len(buf.episode(0).reward) == 2
    check_counts(buf)


def test_handles_never_reused_after_eviction():
    buf = make(capacity=3)
    seen = []
    h = None
    for i in range(40):
        h = buf.record(h if i % 3 else None, np.full(4, i), i, 0.0)
        if not seen or seen[-1] != h:
            seen.append(h)
    assert seen == list(range(len(seen)))
    assert buf.new_episode() == seen[-1] + 1
    check_counts(buf)


def test_episode_data_fields():
    buf = make(action_shape=(2,), action_dtype="float32", reward_dtype="float64")
    h = fill(buf, 3, ended=True, final=True, terminated=True)
    ep = buf.episode(h)
    assert isinstance(ep, exreplay.EpisodeData)
    state, action, reward, final_state, ended, terminated = ep
    assert np.array_equal(state, state_rows(buf, 0, 3))
    assert np.array_equal(action, action_rows(buf, 0, 3))
    assert np.array_equal(reward, reward_rows(buf, 0, 3))
    assert np.array_equal(final_state, state_rows(buf, 3, 1)[0])
    assert ended is True and terminated is True
    # episode() returns new arrays: modifying them does not touch the buffer
    state[:] = -1
    assert np.array_equal(buf.episode(h).state, state_rows(buf, 0, 3))
    h2 = fill(buf, 2)
    ep2 = buf.episode(h2)
    assert ep2.final_state is None and not ep2.ended and not ep2.terminated
    h3 = fill(buf, 2, ended=True, final=True, terminated=False)
    ep3 = buf.episode(h3)
    assert ep3.ended and not ep3.terminated and ep3.final_state is not None


# ---- picks (docs/semantics.md) ------------------------------------------------------


@pytest.mark.parametrize("pick_len", [1, 2, 3, 5])
@pytest.mark.parametrize("allow_short", [False, True])
def test_pick_existence_incremental(pick_len, allow_short):
    buf = make(pick_len=pick_len, allow_short=allow_short)
    rng = random.Random(pick_len * 10 + allow_short)
    for n in range(0, 8):
        for how in ("open", "final", "terminated", "final_terminated"):
            h = buf.new_episode()
            for t in range(n):
                last = t == n - 1
                kw = {}
                if last and how != "open":
                    if "final" in how:
                        kw["final_state"] = np.full(4, 1000 + t)
                    if "terminated" in how:
                        kw["terminated"] = True
                assert buf.record(h, np.full(4, t, np.float32), t, 0.0, **kw) == h
                # picks are entered at record time, right after the record
                got = {p for (e, p) in picks_set(buf) if e == h}
                ended = last and how != "open"
                c = t + 1 if ended else t
                if ended and allow_short:
                    m = c
                else:
                    m = max(c - pick_len + 1, 0)
                assert got == set(range(m)), (n, how, t)
            if rng.random() < 0.5:
                check_counts(buf)
    check_counts(buf)


def test_pick_existence_open_episode_needs_next_state():
    buf = make(pick_len=1)
    h = buf.record(None, np.zeros(4), 0, 0.0)
    assert buf.num_picks == 0  # the only step has no next state yet
    buf.record(h, np.ones(4), 0, 0.0)
    assert picks_set(buf) == {(h, 0)}
    buf.record(h, np.ones(4), 0, 0.0, final_state=np.ones(4))
    assert picks_set(buf) == {(h, 0), (h, 1), (h, 2)}


def test_allow_short_only_applies_to_ended_episodes():
    buf = make(pick_len=4, allow_short=True)
    h = fill(buf, 3)  # open: c = 2 < 4, no pick even with allow_short
    assert buf.num_picks == 0
    buf.record(h, np.zeros(4), 0, 0.0, terminated=True)  # ended, c = 4
    assert picks_set(buf) == {(h, 0), (h, 1), (h, 2), (h, 3)}
    buf2 = make(pick_len=4, allow_short=False)
    h = fill(buf2, 3, ended=True)
    assert buf2.num_picks == 0
    check_counts(buf2)


# ---- batches ----------------------------------------------------------------

CONFIGS = {
    "cartpole": dict(state_shape=(4,)),
    "atari8": dict(state_shape=(84, 84), state_dtype="uint8", pick_len=8),
    "r2d2": dict(state_shape=(84, 84), state_dtype="uint8", pick_len=80, allow_short=True),
    "continuous": dict(state_shape=(5,), action_shape=(3,), action_dtype="float32",
                       reward_dtype="float64", pick_len=3, allow_short=True),
    "scalar_state": dict(state_shape=(), state_dtype="int16", pick_len=2),
}


def populate(buf, rng, n_eps=8, max_len=None):
    L = buf.pick_len
    max_len = max_len or 3 * L + 5
    start = 0
    for i in range(n_eps):
        T = rng.randint(1, max_len)
        kind = i % 4
        fill(buf, T, start=start, ended=kind != 0, final=kind in (1, 2), terminated=kind in (2, 3))
        start += T + 1


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_batch_shapes_dtypes_contents(name):
    cfg = dict(CONFIGS[name])
    buf = ExperienceReplay(seed=3, **cfg)
    rng = random.Random(1)
    populate(buf, rng, n_eps=8 if name != "r2d2" else 6, max_len=None if name != "r2d2" else 200)
    if buf.num_picks == 0:
        fill(buf, buf.pick_len + 1, ended=True)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P)
    for ps in (u, pr, int(u)):
        for B in (1, 7, 32):
            b = buf.get_batch(B, ps)
            check_batch(buf, b, B)
            if ps is not pr:
                assert (b.weight == 1.0).all()
    # the paper's 8-tuple
    b = buf.get_batch(4, u)
    assert len(b) == 8
    state, action, reward, state_next, seq_len, seq_len_next, pick_epi, pick_pos = b
    assert state is b.state and pick_pos is b.pick_pos and reward is b.reward
    assert action is b.action and state_next is b.state_next and seq_len is b.seq_len
    assert seq_len_next is b.seq_len_next and pick_epi is b.pick_epi
    assert b.weight.shape == (4,)
    check_counts(buf)


def test_batch_arrays_own_their_memory():
    # docs/design.md: the arrays own the memory get_batch filled (no second copy). All
    # nine share one block as their base, which lives until the last of them.
    buf = make()
    fill(buf, 10, ended=True)
    u = buf.new_pick_selector(U)
    b = buf.get_batch(5, u)
    names = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
             "pick_epi", "pick_pos", "weight")
    bases = {id(getattr(b, f).base) for f in names}
    assert len(bases) == 1
    for f in names:
        a = getattr(b, f)
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned, f
        assert a.base is not None and not isinstance(a.base, np.ndarray), f
    # an array kept alone outlives its batch and its buffer, and its memory is
    # not handed to later batches while it lives
    kept, want = b.state, b.state.copy()
    del b, buf
    other = make()
    fill(other, 10, ended=True)
    v = other.new_pick_selector(U)
    for _ in range(20):
        x = other.get_batch(5, v)
        x.state[...] = -1.0
        del x
    assert np.array_equal(kept, want)


def test_terminal_step_contents():
    buf = make(pick_len=2, allow_short=True)
    u = buf.new_pick_selector(U)
    S = np.arange(12, dtype=np.float32).reshape(3, 4) + 1
    # terminated without final state: zeros at the terminal step's next state
    h0 = buf.record_many(None, S, [1, 2, 3], [0.5, 1.5, 2.5], terminated=True)
    # terminated with a final state: it appears as the last next state
    h1 = buf.record_many(None, S, [1, 2, 3], [0.5, 1.5, 2.5], final_state=np.full(4, 99.0),
                         terminated=True)
    # truncated (final state, not terminal): bootstrappable
    h2 = buf.record_many(None, S, [1, 2, 3], [0.5, 1.5, 2.5], final_state=np.full(4, 77.0))
    # open
    h3 = buf.record_many(None, S, [1, 2, 3], [0.5, 1.5, 2.5])
    assert picks_set(buf) == {(h, p) for h in (h0, h1, h2) for p in range(3)} | {(h3, 0)}

    def g(h, p):
        return buf._gather(u, [h], [p])

    b = g(h0, 1)
    assert b.seq_len.tolist() == [2] and b.seq_len_next.tolist() == [1]
    assert np.array_equal(b.state[0], S[1:3])
    assert np.array_equal(b.state_next[0], np.stack([S[2], np.zeros(4)]))
    b = g(h0, 2)  # short pick at the end, padded with zeros
    assert b.seq_len.tolist() == [1] and b.seq_len_next.tolist() == [0]
    assert np.array_equal(b.state[0], np.stack([S[2], np.zeros(4)]))
    assert np.array_equal(b.state_next[0], np.zeros((2, 4)))
    assert b.action[0].tolist() == [3, 0] and b.reward[0].tolist() == [2.5, 0.0]
    b = g(h1, 1)
    assert b.seq_len_next.tolist() == [1]
    assert np.array_equal(b.state_next[0], np.stack([S[2], np.full(4, 99.0)]))
    b = g(h1, 0)
    assert b.seq_len.tolist() == [2] and b.seq_len_next.tolist() == [2]
    assert np.array_equal(b.state_next[0], S[1:3])
    b = g(h2, 1)
    assert b.seq_len_next.tolist() == [2]
    assert np.array_equal(b.state_next[0], np.stack([S[2], np.full(4, 77.0)]))
    b = g(h2, 2)
    assert b.seq_len.tolist() == [1] and b.seq_len_next.tolist() == [1]
    assert np.array_equal(b.state_next[0], np.stack([np.full(4, 77.0), np.zeros(4)]))
    b = g(h3, 0)
    assert b.seq_len.tolist() == [2] and b.seq_len_next.tolist() == [2]
    assert np.array_equal(b.state_next[0], S[1:3])
    check_batch(buf, buf._gather(u, *buf._picks()))


def test_open_episode_last_pick_uses_stored_next_state():
    buf = make(pick_len=3)
    u = buf.new_pick_selector(U)
    h = fill(buf, 10)  # open: c = 9, picks 0..6
    assert picks_set(buf) == {(h, p) for p in range(7)}
    b = buf._gather(u, [h], [6])
    assert np.array_equal(b.state_next[0], state_rows(buf, 7, 3))
    assert b.seq_len_next.tolist() == [3]


@pytest.mark.parametrize("record_singly", [False, True])
def test_long_episode_every_pick_small_states(record_singly):
    """5000 steps with pick_len 8: picks straddle every segment boundary
    (segments start at 16 records and double)."""
    buf = make(pick_len=8, capacity=None)
    u = buf.new_pick_selector(U)
    T = 5000
    S = state_rows(buf, 0, T)
    A = action_rows(buf, 0, T)
    R = reward_rows(buf, 0, T)
    fin = state_rows(buf, T, 1)[0]
    if record_singly:
        h = None
        for t in range(T):
            h = buf.record(h, S[t], A[t], R[t], final_state=fin if t == T - 1 else None)
    else:
        h = None
        cuts = [0, 1, 17, 100, 1001, 2500, 4999, T]
        for a, b in zip(cuts, cuts[1:]):
            h = buf.record_many(h, S[a:b], A[a:b], R[a:b], final_state=fin if b == T else None)
    # and an open long episode next to it
    h2 = fill(buf, 3001, start=T + 10)
    ep = buf.episode(h)
    assert np.array_equal(ep.state, S) and np.array_equal(ep.action, A)
    assert np.array_equal(ep.reward, R) and np.array_equal(ep.final_state, fin)
    assert buf.num_picks == (T - 7) + (3000 - 7)
    assert gather_all(buf, u) == buf.num_picks
    check_counts(buf)


def test_long_episode_beyond_growing_segments():
    """Enough records that small-state segments stop growing (about 2^15
    records): picks across the fixed-size segments too."""
    buf = make(state_shape=(3,), pick_len=8, allow_short=True, capacity=None)
    u = buf.new_pick_selector(U)
    T = 70000
    h = fill(buf, T, ended=True, terminated=True, final=False)
    assert buf.num_picks == T
    assert gather_all(buf, u, chunk=20000) == T
    check_counts(buf)


@pytest.mark.parametrize("pick_len,T", [(8, 400), (80, 500)])
def test_long_episode_every_pick_atari(pick_len, T):
    buf = make(state_shape=(84, 84), state_dtype="uint8", pick_len=pick_len, allow_short=True)
    u = buf.new_pick_selector(U)
    h = fill(buf, T // 3)
    h = fill(buf, T - T // 3, h=h, start=T // 3, ended=True)
    assert buf.num_picks == T
    assert gather_all(buf, u, chunk=max(4, 4000 // pick_len)) == T
    check_counts(buf)


def test_many_episodes_random_batches_contents():
    buf = make(pick_len=4, allow_short=True, capacity=3000, state_shape=(2, 3),
               state_dtype="int32", action_shape=(2,), action_dtype="int16")
    rng = random.Random(5)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.7, beta=0.5)
    start = 0
    for i in range(120):
        T = rng.randint(1, 60)
        fill(buf, T, start=start, ended=rng.random() < 0.7, final=rng.random() < 0.5,
             terminated=rng.random() < 0.5,
             priorities=[rng.random() * 3 for _ in range(T)] if rng.random() < 0.5 else None)
        start += T + 1
        if i % 10 == 0 and buf.num_picks:
            check_batch(buf, buf.get_batch(64, u))
            check_batch(buf, buf.get_batch(64, pr))
    check_counts(buf)


def test_out_refills_in_place():
    buf = make(pick_len=3, allow_short=True, action_shape=(2,), action_dtype="float32")
    populate(buf, random.Random(3), n_eps=10)
    for kind in (U, P):
        ps = buf.new_pick_selector(kind)
        b = buf.get_batch(16, ps)
        arrays = [getattr(b, f) for f in ("state", "action", "reward", "state_next", "seq_len",
                                          "seq_len_next", "pick_epi", "pick_pos", "weight")]
        ptrs = [a.ctypes.data for a in arrays]
        for rep in range(5):
            for a in arrays:
                a[...] = 99  # garbage, including the padding past seq_len
            b2 = buf.get_batch(16, ps, out=b)
            assert b2 is b
            now = [getattr(b, f) for f in ("state", "action", "reward", "state_next", "seq_len",
                                           "seq_len_next", "pick_epi", "pick_pos", "weight")]
            assert all(x is y for x, y in zip(now, arrays))
            assert [a.ctypes.data for a in now] == ptrs
            check_batch(buf, b, 16)
        # out=None behaves as no out
        check_batch(buf, buf.get_batch(16, ps, out=None), 16)
        b3 = buf.get_batch(batch_size=16, ps=ps, out=b)
        assert b3 is b


def test_out_refill_matches_fresh_batch():
    bufs = [make(seed=11, pick_len=2) for _ in range(2)]
    for buf in bufs:
        populate(buf, random.Random(9))
    ps = [buf.new_pick_selector(P) for buf in bufs]
    out = bufs[1].get_batch(10, ps[1])
    bufs[0].get_batch(10, ps[0])
    for _ in range(3):
        fresh = bufs[0].get_batch(10, ps[0])
        bufs[1].get_batch(10, ps[1], out=out)
        for x, y in zip(list(fresh) + [fresh.weight], list(out) + [out.weight]):
            assert np.array_equal(x, y)


# ---- weights ----------------------------------------------------------------


def test_uniform_weights_are_one():
    buf = make()
    fill(buf, 50, ended=True)
    b = buf.get_batch(100, buf.new_pick_selector(U))
    assert b.weight.dtype == np.float32 and (b.weight == 1.0).all()


@pytest.mark.parametrize("alpha,beta", [(0.6, 0.4), (1.0, 1.0), (0.3, 0.0), (0.0, 0.7)])
def test_prioritized_weights(alpha, beta):
    buf = make(pick_len=2)
    pr = buf.new_pick_selector(P, alpha=alpha, beta=beta)
    rng = np.random.default_rng(0)
    for i in range(6):
        T = 10 + i
        fill(buf, T, ended=True, priorities=rng.uniform(0, 5, T) * (rng.random(T) > 0.2))
    e, p, stored = all_stored(buf, pr)
    assert (stored >= 0).all()
    lo = stored[stored > 0].min()
    b = buf.get_batch(500, pr)
    s = buf._priority(pr, b.pick_epi, b.pick_pos)
    assert (s > 0).all()  # zero priorities are never drawn
    expect = (lo / s) ** beta
    np.testing.assert_allclose(b.weight, expect, rtol=2e-5)
    assert b.weight.max() <= 1.0 + 1e-6
    # _gather gives the same weights for the same picks
    g = buf._gather(pr, b.pick_epi, b.pick_pos)
    np.testing.assert_allclose(g.weight, b.weight, rtol=1e-6)
    # beta is settable: weights follow it
    pr.beta = 2 * beta + 0.5
    assert pr.beta == pytest.approx(2 * beta + 0.5)
    b = buf.get_batch(200, pr)
    s = buf._priority(pr, b.pick_epi, b.pick_pos)
    np.testing.assert_allclose(b.weight, (lo / s) ** pr.beta, rtol=2e-5)


def test_prioritized_weight_follows_smallest_positive_priority():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0, beta=1.0)
    fill(buf, 4, ended=True, priorities=[4.0, 2.0, 8.0, 0.0])
    b = buf._gather(pr, [0, 0, 0], [0, 1, 2])
    np.testing.assert_allclose(b.weight, [0.5, 1.0, 0.25], rtol=1e-6)
    buf.set_priority(pr, [0], [1], 16.0)  # min positive is now 4
    b = buf._gather(pr, [0, 0, 0], [0, 1, 2])
    np.testing.assert_allclose(b.weight, [1.0, 0.25, 0.5], rtol=1e-6)


# ---- record_many ------------------------------------------------------------


def snapshot(buf, prios=()):
    hs = buf._handles()
    eps = {}
    for h in hs:
        ep = buf.episode(h)
        eps[h] = (ep.state.tobytes(), ep.action.tobytes(), ep.reward.tobytes(),
                  None if ep.final_state is None else ep.final_state.tobytes(),
                  ep.ended, ep.terminated)
    e, p = buf._picks()
    picks = sorted(zip(e.tolist(), p.tolist()))
    pr = []
    for ps in prios:
        if picks:
            ee, pp = np.array(picks).T
            pr.append(buf._priority(ps, ee, pp).tolist())
    return (len(buf), buf.num_episodes, buf.num_picks, hs, picks, eps, pr)


@pytest.mark.parametrize("capacity", [None, 40, 7, 3])
@pytest.mark.parametrize("pick_len,allow_short", [(1, False), (3, True), (4, False)])
def test_record_many_equals_single_records(capacity, pick_len, allow_short):
    kw = dict(seed=21, capacity=capacity, pick_len=pick_len, allow_short=allow_short,
              action_shape=(2,), action_dtype="float32", eviction="fifo")
    a, b = make(**kw), make(**kw)
    sa = [a.new_pick_selector(P, alpha=0.5), a.new_pick_selector(U)]
    sb = [b.new_pick_selector(P, alpha=0.5), b.new_pick_selector(U)]
    rng = random.Random(capacity or 0)
    ha = hb = None
    start = 0
    for i in range(40):
        T = rng.randint(1, 12)
        S, A, R = state_rows(a, start, T), action_rows(a, start, T), reward_rows(a, start, T)
        pri = [rng.choice([0.0, 0.5, 2.0, 3.5]) for _ in range(T)] if rng.random() < 0.6 else None
        end = rng.random()
        fin = state_rows(a, start + T, 1)[0] if end < 0.3 else None
        term = 0.2 < end < 0.5
        if rng.random() < 0.3:
            ha = hb = rng.choice([None, 10**6, -1] + a._handles()[-2:])
        ha = a.record_many(ha, S, A, R, final_state=fin, terminated=term, priorities=pri)
        for t in range(T):
            last = t == T - 1
            hb = b.record(hb, S[t], A[t], R[t], final_state=fin if last else None,
                          terminated=term and last, priority=None if pri is None else pri[t])
        assert ha == hb
        assert snapshot(a, sa[:1]) == snapshot(b, sb[:1])
        start += T + 1
    # every pick the same, with the same priority and weight, and the same
    # batch gathered for it; where a pick stands in the table differs once
    # evictions came: a record_many call gives the places of the picks it
    # evicts to the picks it enters after them (docs/design.md, "Places"),
    # which T record calls, each evicting on its own, cannot. Without
    # evictions the tables, and so the draws, are the same
    if a.num_picks:
        e, p = (np.array(x, np.int64) for x in zip(*sorted(zip(*a._picks()))))
        for ka, kb in zip(sa, sb):  # the 8 arrays; pick_index is not one of them
            for x, y in zip(a._gather(ka, e, p), b._gather(kb, e, p)):
                assert np.array_equal(x, y)
    if capacity is None:
        assert a._picks()[0].tolist() == b._picks()[0].tolist()  # same table order
        if a.num_picks:
            if (all_stored(a, sa[0])[2] > 0).any():
                for x, y in zip(a.get_batch(20, sa[0]), b.get_batch(20, sb[0])):
                    assert np.array_equal(x, y)
            for x, y in zip(a.get_batch(20, sa[1]), b.get_batch(20, sb[1])):
                assert np.array_equal(x, y)
    a._check()
    b._check()


def test_record_many_T1_and_scalar_state_shape():
    buf = make(state_shape=())
    h = buf.record_many(None, [1.5], [2], [0.25], final_state=3.5, terminated=True)
    ep = buf.episode(h)
    assert ep.state.tolist() == [1.5] and ep.final_state == 3.5 and ep.terminated


# ---- eviction ---------------------------------------------------------------


def test_fifo_eviction_order():
    buf = make(capacity=10, eviction="fifo")
    u = buf.new_pick_selector(U)
    h0 = fill(buf, 4, ended=True)
    h1 = fill(buf, 4, ended=True)
    h2 = fill(buf, 2)
    assert buf._handles() == [h0, h1, h2] and len(buf) == 10
    buf._gather(u, [h0], [0])  # sampled marks are ignored by fifo
    h2 = buf.record(h2, np.zeros(4), 0, 0.0)
    assert buf._handles() == [h1, h2] and len(buf) == 7
    assert all(e != h0 for e, _ in picks_set(buf))
    with pytest.raises(ValueError):
        buf.episode(h0)
    fill(buf, 4, h=h2)
    assert buf._handles() == [h2] and len(buf) == 7
    check_counts(buf)


def test_evicting_the_episode_being_recorded_into():
    buf = make(capacity=3)
    h = None
    for t in range(3):
        h = buf.record(h, np.full(4, t), t, 0.0)
    assert h == 0 and len(buf) == 3
    r = buf.record(h, np.full(4, 3), 3, 0.0)
    assert r == 0  # the (now unknown) handle recorded into
    assert buf._handles() == [] and len(buf) == 0 and buf.num_picks == 0
    with pytest.raises(ValueError):
        buf.episode(0)
    assert buf.record(r, np.zeros(4), 0, 0.0) == 1
    assert buf._handles() == [1]
    check_counts(buf)


def test_empty_episode_is_evicted_like_any_other():
    buf = make(capacity=4)
    h0 = buf.new_episode()
    h1 = fill(buf, 4)
    assert buf._handles() == [h0, h1]
    h1 = buf.record(h1, np.zeros(4), 0, 0.0)
    # the empty oldest goes first, then the recorded-into one
    assert buf._handles() == []
    check_counts(buf)


def test_record_many_evicting_itself_continues_in_new_episode():
    buf = make(capacity=5)
    h = fill(buf, 8)
    assert h == 1
    assert buf._handles() == [1] and len(buf) == 2
    assert np.array_equal(buf.episode(1).state, state_rows(buf, 6, 2))
    check_counts(buf)


def test_second_chance_order():
    buf = make(capacity=8, eviction="second_chance")
    u = buf.new_pick_selector(U)
    hs = [fill(buf, 2, ended=True) for _ in range(4)]
    assert hs == [0, 1, 2, 3] and len(buf) == 8
    buf._gather(u, [0, 2], [0, 1])  # marks 0 and 2
    h4 = buf.record(None, np.zeros(4), 0, 0.0)
    # 9 > 8: hand at 0 (marked: cleared), 1 unmarked: evicted; hand -> 2
    assert buf._handles() == [0, 2, 3, 4] and len(buf) == 7
    h4 = buf.record(h4, np.zeros(4), 0, 0.0, terminated=True)
    assert buf._handles() == [0, 2, 3, 4] and len(buf) == 8
    h5 = buf.record(None, np.zeros(4), 0, 0.0)
    # hand at 2 (marked: cleared), 3 evicted; hand -> 4
    assert buf._handles() == [0, 2, 4, 5] and len(buf) == 7
    h5 = fill(buf, 2, h=h5)
    # 9 > 8 at the second: hand at 4 (unmarked): evicted; hand -> 5
    assert buf._handles() == [0, 2, 5] and len(buf) == 7
    r = fill(buf, 2, h=h5)
    # 9 > 8: hand at 5, the episode being recorded into: evicted; hand wraps to 0
    assert r == h5 and buf._handles() == [0, 2] and len(buf) == 4
    h6 = fill(buf, 5)
    # marks of 0 and 2 were cleared when the hand passed them: 0 goes
    assert buf._handles() == [2, h6] and h6 == 6
    check_counts(buf)


def test_second_chance_get_batch_marks_sampled():
    buf = make(capacity=4, eviction="second_chance", pick_len=1)
    u = buf.new_pick_selector(U)
    h0 = fill(buf, 2, ended=True)  # the only picks
    h1 = buf.record(None, np.zeros(4), 0, 0.0)  # open, 1 record: no pick
    assert {e for e, _ in picks_set(buf)} == {h0}
    b = buf.get_batch(3, u)
    assert set(b.pick_epi.tolist()) == {h0}
    buf.record(h1, np.zeros(4), 0, 0.0)
    buf.record(None, np.zeros(4), 0, 0.0)  # 5 > 4: h0 marked, so h1 goes
    assert buf._handles() == [h0, 2]
    check_counts(buf)


def test_fifo_ignores_sampled():
    buf = make(capacity=4, eviction="fifo")
    u = buf.new_pick_selector(U)
    h0 = fill(buf, 2, ended=True)
    h1 = buf.record(None, np.zeros(4), 0, 0.0)
    buf.get_batch(3, u)
    buf.record(h1, np.zeros(4), 0, 0.0)
    buf.record(None, np.zeros(4), 0, 0.0)
    assert buf._handles() == [h1, 2]


class EvictionModel:
    """Episodes, handles and eviction order as docs/semantics.md words them."""

    def __init__(self, capacity, policy):
        self.cap, self.policy = capacity, policy
        self.eps = {}  # handle -> [n, ended]
        self.marked = set()
        self.next = 0
        self.hand = None  # handle under the hand, None = the oldest

    def live(self):
        return sorted(self.eps)

    def new(self):
        h = self.next
        self.next += 1
        self.eps[h] = [0, False]
        return h

    def record(self, h, end):
        if h not in self.eps or self.eps[h][1]:
            h = self.new()
        self.eps[h][0] += 1
        if end:
            self.eps[h][1] = True
        while sum(v[0] for v in self.eps.values()) > self.cap and self.eps:
            self.evict_one()
        return h

    def evict_one(self):
        live = self.live()
        if self.policy == "fifo":
            victim = live[0]
        else:
            cur = self.hand if self.hand in self.eps else live[0]
            while cur in self.marked:
                self.marked.discard(cur)
                later = [x for x in live if x > cur]
                cur = later[0] if later else live[0]
            victim = cur
            later = [x for x in live if x > victim]
            after = later[0] if later else live[0]
            self.hand = None if after == victim else after
        del self.eps[victim]
        self.marked.discard(victim)


@pytest.mark.parametrize("policy", ["fifo", "second_chance"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_eviction_against_model(policy, seed):
    rng = random.Random(seed)
    cap = rng.choice([5, 12, 30])
    buf = make(capacity=cap, eviction=policy, pick_len=1, allow_short=True)
    u = buf.new_pick_selector(U)
    model = EvictionModel(cap, policy)
    open_hs = []
    for step in range(600):
        r = rng.random()
        if r < 0.05:
            h = buf.new_episode()
            assert h == model.new()
            open_hs.append(h)
        elif r < 0.75:
            h = rng.choice(open_hs + [None]) if open_hs else None
            end = rng.random() < 0.2
            got = buf.record(h, np.full(4, step), step, 0.0, terminated=end)
            exp = model.record(h, end)
            assert got == exp
            if got not in open_hs:
                open_hs.append(got)
        elif r < 0.9 and buf.num_picks:
            b = buf.get_batch(rng.randint(1, 3), u)
            model.marked |= set(b.pick_epi.tolist())
        elif buf.num_picks:
            e, p = buf._picks()
            i = rng.randrange(len(e))
            buf._gather(u, e[i : i + 1], p[i : i + 1])
            model.marked.add(int(e[i]))
        open_hs = [h for h in open_hs if h in model.eps and not model.eps[h][1]][-6:]
        assert buf._handles() == model.live(), step
        assert len(buf) == sum(v[0] for v in model.eps.values())
    check_counts(buf)


# ---- priorities -------------------------------------------------------------


def test_recorded_priority_and_max_so_far():
    buf = make(pick_len=1)
    a = 0.5
    pr = buf.new_pick_selector(P, alpha=a)
    h = buf.record(None, np.zeros(4), 0, 0.0, priority=4.0)
    assert buf.num_picks == 0
    h = buf.record(h, np.zeros(4), 0, 0.0)  # pick 0 enters: its first step's 4.0
    assert buf._priority(pr, [h], [0]).tolist() == [f32pow(4.0, a)]
    h = buf.record(h, np.zeros(4), 0, 0.0, priority=0.25)  # pick 1: no priority: max so far 4
    assert buf._priority(pr, [h], [1]).tolist() == pytest.approx([f32pow(4.0, a)], rel=1e-6)
    h = buf.record(h, np.zeros(4), 0, 0.0)  # pick 2: 0.25
    assert buf._priority(pr, [h], [2]).tolist() == [f32pow(0.25, a)]
    h = buf.record(h, np.zeros(4), 0, 0.0, final_state=np.ones(4))  # picks 3 (max), 4 (max)
    assert buf._priority(pr, [h, h], [3, 4]) == pytest.approx([f32pow(4.0, a)] * 2, rel=1e-6)
    # stored as float32
    st = buf._priority(pr, [h], [2])
    assert st.dtype == np.float64 and float(np.float32(st[0])) == st[0]


def test_max_so_far_starts_at_one_and_is_not_lowered():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0)
    fill(buf, 3, ended=True, priorities=[0.5, 0.25, 0.1])
    fill(buf, 2, ended=True)
    e, p, s = all_stored(buf, pr)
    got = dict(zip(zip(e.tolist(), p.tolist()), s.tolist()))
    assert got[(0, 0)] == pytest.approx(0.5) and got[(0, 1)] == pytest.approx(0.25)
    assert got[(1, 0)] == 1.0 and got[(1, 1)] == 1.0


def test_first_step_priority_with_longer_picks():
    buf = make(pick_len=3)
    pr = buf.new_pick_selector(P, alpha=1.0)
    h = fill(buf, 6, priorities=[9.0, 2.0, 0.0, 3.0, 0.5, 7.0])  # open: c=5, picks 0..2
    e, p, s = all_stored(buf, pr)
    got = dict(zip(p.tolist(), s.tolist()))
    assert got == {0: 9.0, 1: 2.0, 2: 0.0}
    buf.record(h, np.zeros(4), 0, 0.0, terminated=True)  # pick 3 (3.0), 4 (0.5)
    e, p, s = all_stored(buf, pr)
    got = dict(zip(p.tolist(), s.tolist()))
    assert got == {0: 9.0, 1: 2.0, 2: 0.0, 3: 3.0, 4: 0.5}


def test_set_priority_raises_max_so_far():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0)
    h = fill(buf, 2)
    assert buf.set_priority(pr, [h], [0], [16.0]) == 1
    assert buf._priority(pr, [h], [0]).tolist() == [16.0]
    # a missing pick does not reach anything, so it does not raise the maximum
    assert buf.set_priority(pr, [h, 999], [5, 0], [50.0, 60.0]) == 0
    h = buf.record(h, np.zeros(4), 0, 0.0)
    assert buf._priority(pr, [h], [1]).tolist() == [16.0]


def test_zero_priority_never_drawn_and_all_zero_raises():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=0.6)
    u = buf.new_pick_selector(U)
    fill(buf, 10, ended=True, priorities=[0.0] * 4 + [2.0] + [0.0] * 5)
    b = buf.get_batch(2000, pr)
    assert set(b.pick_pos.tolist()) == {4}
    np.testing.assert_array_equal(b.weight, 1.0)
    e, p = buf._picks()
    assert buf.set_priority(pr, e, p, 0.0) == 10
    with pytest.raises(ValueError):
        buf.get_batch(1, pr)
    assert buf.get_batch(5, u).pick_epi.tolist() == [0] * 5  # uniform unaffected
    # alpha = 0 keeps zero at zero
    pr0 = buf.new_pick_selector(P, alpha=0.0)
    buf.set_priority(pr0, e, p, [0.0] * 9 + [5.0])
    s = buf._priority(pr0, e, p)
    assert sorted(s.tolist()) == [0.0] * 9 + [1.0]
    b = buf.get_batch(100, pr0)
    assert set(b.pick_pos.tolist()) == {int(p[np.argmax(s)])}


def test_set_priority_count_skip_missing_and_last_wins():
    buf = make(capacity=6)
    pr = buf.new_pick_selector(P, alpha=1.0)
    u = buf.new_pick_selector(U)
    h0 = fill(buf, 3, ended=True)
    h1 = fill(buf, 3, ended=True)
    h2 = buf.record(None, np.zeros(4), 0, 0.0, terminated=True)  # evicts h0
    assert buf._handles() == [h1, h2]
    n = buf.set_priority(pr, [h0, h1, h1, h2, h1, h1, 77], [0, 0, 1, 0, 9, 0, 0],
                         [5.0, 2.0, 3.0, 4.0, 6.0, 7.0, 8.0])
    assert n == 4  # (h1,0) twice, (h1,1), (h2,0); h0 evicted, (h1,9), 77 missing
    assert buf._priority(pr, [h1, h1, h1, h2], [0, 1, 2, 0]).tolist() == [7.0, 3.0, 1.0, 4.0]
    assert (h0, 0) not in picks_set(buf)
    # uniform selector: accepted and ignored
    assert buf.set_priority(u, [h1], [0], [1.0]) == 0
    # keyword arguments; any int sequences
    assert buf.set_priority(ps=pr, pick_epi=(h1,), pick_pos=np.array([2], np.int32),
                            priorities=np.array([0.5], np.float32)) == 1
    assert buf._priority(pr, [h1], [2]).tolist() == [0.5]


@pytest.mark.parametrize("scalar", [3.0, 3, np.float64(3.0), np.array(3.0), np.float32(3.0),
                                    np.int64(3), np.array(3, np.int32)])
def test_set_priority_scalar_broadcast(scalar):
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0)
    fill(buf, 6, ended=True)
    e, p = buf._picks()
    assert buf.set_priority(pr, e, p, scalar) == 6
    assert buf._priority(pr, e, p).tolist() == [3.0] * 6


def test_set_priority_with_batch_from_get_batch():
    buf = make(pick_len=2)
    pr = buf.new_pick_selector(P, alpha=1.0, beta=1.0)
    fill(buf, 20, ended=True)
    b = buf.get_batch(8, pr)
    td = np.arange(1, 9, dtype=np.float32)
    assert buf.set_priority(pr, b.pick_epi, b.pick_pos, td) == 8
    # duplicates in one call: last wins
    last = {}
    for e, p, v in zip(b.pick_epi.tolist(), b.pick_pos.tolist(), td.tolist()):
        last[(e, p)] = v
    for (e, p), v in last.items():
        assert buf._priority(pr, [e], [p]).tolist() == [v]


def test_set_priority_batch_form_with_a_batch_of_8_arrays():
    """A Batch built from the 8 arrays (pick_index None) is the handle form
    without pick_index: same result, same return value, same errors."""
    bufs = [make(pick_len=2, seed=5) for _ in range(2)]
    prs = []
    for buf in bufs:
        prs.append(buf.new_pick_selector(P, alpha=1.0, beta=1.0))
        fill(buf, 20, ended=True)
    b = bufs[0].get_batch(8, prs[0])
    b8 = exreplay.Batch(tuple(b))
    assert b8.pick_index is None and b8.weight is None
    td = np.arange(1, 9, dtype=np.float64)
    assert bufs[0].set_priority(prs[0], b8, td) == 8
    assert bufs[1].set_priority(prs[1], b.pick_epi, b.pick_pos, td, pick_index=None) == 8
    e, p = bufs[0]._picks()
    np.testing.assert_array_equal(bufs[0]._priority(prs[0], e, p), bufs[1]._priority(prs[1], e, p))
    for bad, exc in (([-1.0] * 8, ValueError), ([1.0] * 7, ValueError), ("x", TypeError)):
        with pytest.raises(exc) as by_batch:
            bufs[0].set_priority(prs[0], b8, bad)
        with pytest.raises(exc) as by_handle:
            bufs[0].set_priority(prs[0], b.pick_epi, b.pick_pos, bad)
        assert str(by_batch.value) == str(by_handle.value)


def test_prioritized_draw_proportions():
    buf = make(seed=4)
    pr = buf.new_pick_selector(P, alpha=1.0)
    fill(buf, 4, ended=True, priorities=[1.0, 0.0, 3.0, 6.0])
    b = buf.get_batch(40000, pr)
    freq = np.bincount(b.pick_pos, minlength=4) / 40000
    np.testing.assert_allclose(freq, [0.1, 0.0, 0.3, 0.6], atol=0.015)
    pa = buf.new_pick_selector(P, alpha=0.5)
    assert buf.set_priority(pa, [0, 0, 0, 0], [0, 1, 2, 3], [1.0, 0.0, 3.0, 6.0]) == 4
    b = buf.get_batch(40000, pa)
    w = np.array([1.0, 0.0, 3.0, 6.0]) ** 0.5
    freq = np.bincount(b.pick_pos, minlength=4) / 40000
    np.testing.assert_allclose(freq, w / w.sum(), atol=0.015)


def test_prioritized_large_tree_growth_and_eviction():
    """Tens of thousands of picks: the sum tree grows level by level and
    eviction swap-removes picks; stored priorities and draws stay right."""
    buf = make(state_shape=(1,), capacity=60000, seed=6)
    pr = buf.new_pick_selector(P, alpha=1.0, beta=1.0)
    rng = np.random.default_rng(1)
    for i in range(12):
        T = 9000
        buf.record_many(None, np.full((T, 1), i, np.float32), np.arange(T), np.zeros(T),
                        terminated=True, priorities=rng.uniform(0.5, 1.5, T))
    assert len(buf) <= 60000 and buf.num_episodes == 6
    buf._check()
    e, p = buf._picks()
    vals = rng.uniform(0.5, 2.0, len(e))
    assert buf.set_priority(pr, e, p, vals) == len(e)
    np.testing.assert_allclose(buf._priority(pr, e, p), vals.astype(np.float32), rtol=1e-7)
    # one pick holds half the total mass
    big = int(np.argmax(vals))
    buf.set_priority(pr, e[big : big + 1], p[big : big + 1], [vals.sum() - vals[big]])
    b = buf.get_batch(20000, pr)
    hit = np.mean((b.pick_epi == e[big]) & (b.pick_pos == p[big]))
    assert abs(hit - 0.5) < 0.02
    # evict two more episodes: the survivors keep their priorities
    for i in range(2):
        buf.record_many(None, np.zeros((9000, 1)), np.zeros(9000, np.int64), np.zeros(9000),
                        terminated=True, priorities=np.full(9000, 3.0))
    e2, p2 = buf._picks()
    old = dict(zip(zip(e.tolist(), p.tolist()), np.float32(vals).tolist()))
    old[(int(e[big]), int(p[big]))] = float(np.float32(vals.sum() - vals[big]))
    got = buf._priority(pr, e2, p2)
    for k, (x, y) in enumerate(zip(e2.tolist(), p2.tolist())):
        if (x, y) in old:
            assert got[k] == old[(x, y)]
        else:
            assert got[k] == 3.0
    lo = got[got > 0].min()
    b = buf.get_batch(1000, pr)
    s = buf._priority(pr, b.pick_epi, b.pick_pos)
    np.testing.assert_allclose(b.weight, lo / s, rtol=2e-5)
    buf._check()


def test_uniform_draw_proportions():
    buf = make(seed=5)
    u = buf.new_pick_selector(U)
    fill(buf, 3, ended=True)
    fill(buf, 2, ended=True, priorities=[0.0, 0.0])
    b = buf.get_batch(50000, u)
    keys = b.pick_epi * 10 + b.pick_pos
    _, counts = np.unique(keys, return_counts=True)
    assert len(counts) == 5
    np.testing.assert_allclose(counts / 50000, 0.2, atol=0.012)


def test_selectors_are_independent():
    buf = make()
    a = buf.new_pick_selector(P, alpha=1.0)
    b = buf.new_pick_selector(P, alpha=1.0)
    fill(buf, 4, ended=True)
    buf.set_priority(a, [0, 0], [0, 1], [5.0, 0.0])
    assert buf._priority(a, [0, 0, 0], [0, 1, 2]).tolist() == [5.0, 0.0, 1.0]
    assert buf._priority(b, [0, 0, 0], [0, 1, 2]).tolist() == [1.0, 1.0, 1.0]


def test_new_selector_over_existing_picks():
    """docs/semantics.md: recorded priorities are not kept once their pick is
    entered; a new selector starts every existing pick at its maximum so far,
    1.0. Priorities recorded for picks not yet entered still count."""
    buf = make(pick_len=1)
    old = buf.new_pick_selector(P, alpha=1.0)
    fill(buf, 4, ended=True)  # no recorded priorities
    h = buf.new_episode()
    for t, pri in enumerate([2.0, None, 0.5, None, 0.0]):
        buf.record(h, np.zeros(4), t, 0.0, priority=pri, terminated=t == 4)
    buf.set_priority(old, [h], [1], [100.0])
    assert buf._priority(old, [h] * 5, range(5)).tolist() == [2.0, 100.0, 0.5, 2.0, 0.0]
    new = buf.new_pick_selector(P, alpha=1.0)
    assert buf._priority(new, [h] * 5, range(5)).tolist() == [1.0] * 5
    assert buf._priority(new, [0] * 4, range(4)).tolist() == [1.0] * 4
    # its maximum so far starts at 1.0 (not the other selector's 100)
    h2 = fill(buf, 2)
    assert buf._priority(new, [h2], [0]).tolist() == [1.0]
    assert buf._priority(old, [h2], [0]).tolist() == [100.0]
    # a priority recorded for a step whose pick is not entered yet counts
    h3 = buf.record(None, np.zeros(4), 0, 0.0, priority=9.0)
    late = buf.new_pick_selector(P, alpha=0.5)
    buf.record(h3, np.zeros(4), 0, 0.0)
    assert buf._priority(late, [h3], [0]).tolist() == [f32pow(9.0, 0.5)]
    assert buf._priority(new, [h3], [0]).tolist() == [9.0]
    assert buf._priority(old, [h3], [0]).tolist() == [9.0]
    # ... and raises that selector's maximum so far
    h4 = fill(buf, 2)
    assert buf._priority(late, [h4], [0]).tolist() == [f32pow(9.0, 0.5)]
    check_batch(buf, buf.get_batch(10, new))
    check_batch(buf, buf.get_batch(10, late))
    buf._check()


def test_new_selector_on_empty_buffer_then_records():
    buf = make()
    fill(buf, 3)
    u = buf.new_pick_selector(U)
    fill(buf, 3, ended=True)
    assert buf.num_picks == 5
    check_batch(buf, buf.get_batch(16, u))


# ---- selectors --------------------------------------------------------------


def test_pick_selector_object():
    buf = make()
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P)
    pr2 = buf.new_pick_selector(int(P), alpha=0.9, beta=0.1)
    assert isinstance(u, exreplay.PickSelector)
    assert int(u) == 0 and int(pr) == 1 and int(pr2) == 2
    assert operator.index(pr) == 1
    assert ["a", "b", "c"][pr2] == "c"
    assert u == 0 and pr == 1 and 1 == pr and pr != 0 and pr != pr2 and u != "0"
    assert hash(pr) == hash(1) and hash(u) == hash(0)
    assert {pr: "x"}[1] == "x"
    assert pr.handle == 1 and pr.kind == int(P) and u.kind == int(U)
    assert pr.buffer is buf
    r = repr(pr)
    assert "1" in r and "prioritized" in r.lower()
    assert "uniform" in repr(u).lower()
    assert pr.alpha == pytest.approx(0.6) and pr.beta == pytest.approx(0.4)
    assert pr2.alpha == pytest.approx(0.9) and pr2.beta == pytest.approx(0.1)
    pr.beta = 1.0
    assert pr.beta == 1.0
    pr.beta = 0
    assert pr.beta == 0.0
    with pytest.raises(AttributeError):
        pr.alpha = 0.5
    assert pr.alpha == pytest.approx(0.6)
    fill(buf, 5, ended=True)
    # an int handle works wherever a selector does
    for ps in (u, 0, np.int64(0), pr, 1):
        check_batch(buf, buf.get_batch(3, ps))


def test_selector_handles_never_reused_and_remove():
    buf = make()
    fill(buf, 5, ended=True)
    a = buf.new_pick_selector(U)
    b = buf.new_pick_selector(P)
    buf.remove_pick_selector(a)
    with pytest.raises(ValueError):
        buf.get_batch(1, a)
    with pytest.raises(ValueError):
        buf.get_batch(1, 0)
    c = buf.new_pick_selector(U)
    assert int(c) == 2
    check_batch(buf, buf.get_batch(4, b))
    check_batch(buf, buf.get_batch(4, c))
    buf.remove_pick_selector(int(b))
    with pytest.raises(ValueError):
        buf.set_priority(b, [0], [0], [1.0])
    with pytest.raises(ValueError):
        buf.remove_pick_selector(b)
    assert "removed" in repr(b)
    check_batch(buf, buf.get_batch(4, c))
    # records keep working with selectors removed
    fill(buf, 5, ended=True)
    check_counts(buf)


def test_remove_selector_then_records_and_evictions():
    buf = make(capacity=20, pick_len=2)
    sels = [buf.new_pick_selector(P if i % 2 else U) for i in range(5)]
    rng = random.Random(0)
    for i in range(30):
        T = rng.randint(1, 8)
        fill(buf, T, ended=rng.random() < 0.5, priorities=None if i % 2 else [1.0] * T)
        if i % 6 == 0 and sels:
            buf.remove_pick_selector(sels.pop(rng.randrange(len(sels))))
            buf._check()
    for s in sels:
        if buf.num_picks:
            check_batch(buf, buf.get_batch(8, s))
    check_counts(buf)


# ---- inputs -----------------------------------------------------------------


def test_read_only_inputs():
    buf = make(action_shape=(2,), action_dtype="float32", pick_len=2)
    pr = buf.new_pick_selector(P)

    def ro(a):
        a = np.array(a)
        a.flags.writeable = False
        return a

    h = buf.record(None, ro(np.ones(4, np.float32)), ro([1.0, 2.0]), ro(np.float32(0.5)),
                   priority=2.0)
    h = buf.record(h, ro(np.ones(4, np.float64)), ro([1.0, 2.0]), ro(0.5))
    h = buf.record_many(h, ro(np.zeros((3, 4), np.float32)), ro(np.zeros((3, 2), np.float32)),
                        ro(np.zeros(3, np.float32)), final_state=ro(np.ones(4, np.float32)),
                        priorities=ro(np.ones(3)))
    e, p = buf._picks()
    assert buf.set_priority(pr, ro(e), ro(p), ro(np.full(len(e), 2.0))) == len(e)
    assert len(buf) == 5 and buf.num_picks == 4
    check_batch(buf, buf.get_batch(4, pr))


def test_list_and_scalar_inputs():
    buf = make(action_shape=(2,), action_dtype="int32", reward_dtype="float64")
    h = buf.record(None, [1, 2, 3, 4], [5, 6], 7)
    h = buf.record(h, (1.5, 2.5, 3.5, 4.5), (7, 8), 0.25, final_state=[0, 0, 0, 1])
    ep = buf.episode(h)
    assert ep.state.tolist() == [[1, 2, 3, 4], [1.5, 2.5, 3.5, 4.5]]
    assert ep.action.tolist() == [[5, 6], [7, 8]]
    assert ep.reward.tolist() == [7.0, 0.25]
    assert ep.final_state.tolist() == [0, 0, 0, 1]
    h2 = buf.record_many(None, [[0] * 4, [1] * 4], [[1, 1], [2, 2]], [0.5, 1], priorities=[1, 2])
    assert buf.episode(h2).action.tolist() == [[1, 1], [2, 2]]


def test_same_kind_casting_accepted():
    buf = make(state_dtype="float32", action_dtype="int64", reward_dtype="float32")
    # float64 -> float32, int -> float, bool -> int: all same_kind or safe
    h = buf.record(None, np.arange(4, dtype=np.float64) + 0.5, np.int8(3), np.float64(0.5))
    h = buf.record(h, np.arange(4, dtype=np.int16), True, 1)
    h = buf.record(h, np.arange(4, dtype=np.uint8), np.uint32(9), np.float16(2.0))
    ep = buf.episode(h)
    assert ep.state.tolist() == [[0.5, 1.5, 2.5, 3.5], [0, 1, 2, 3], [0, 1, 2, 3]]
    assert ep.action.tolist() == [3, 1, 9]
    assert ep.reward.tolist() == [0.5, 1.0, 2.0]
    i8 = make(state_dtype="int8", action_dtype="int16")
    h = i8.record(None, [1, -2, 3, 4], np.int64(5), 0.0)  # int64 list into int8: same_kind
    h = i8.record(h, np.array([1, 2, 3, 4], np.int64), 300, 0.0)
    assert i8.episode(h).state.tolist() == [[1, -2, 3, 4], [1, 2, 3, 4]]
    assert i8.episode(h).action.tolist() == [5, 300]


def test_unsigned_state_from_unsigned_arrays():
    buf = make(state_shape=(2, 2), state_dtype="uint8")
    h = buf.record(None, np.array([[1, 2], [3, 4]], np.uint8), 0, 0.0)
    h = buf.record(h, np.array([[1, 2], [3, 4]], np.uint16), 0, 0.0)
    h = buf.record(h, np.array([[True, False], [True, True]]), 0, 0.0)
    assert buf.episode(h).state[2].tolist() == [[1, 0], [1, 1]]


def test_int_list_into_uint8_state():
    """Python ints have no dtype of their own: they go into any integer dtype."""
    buf = make(state_shape=(2, 2), state_dtype="uint8")
    h = buf.record(None, [[1, 2], [3, 255]], 0, 0.0)
    assert buf.episode(h).state.tolist() == [[[1, 2], [3, 255]]]
    h = buf.record_many(h, [[[1, 2], [3, 4]]] * 2, [0, 0], [0.0, 0.0], final_state=[[0, 0], [0, 1]])
    assert len(buf) == 3


@pytest.mark.parametrize("ro", [False, True])
def test_zero_d_array_priority(ro):
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0)
    x = np.array(2.0)
    x.flags.writeable = not ro
    h = buf.record(None, np.zeros(4), 0, 0.0, priority=x)
    buf.record(h, np.zeros(4), 0, 0.0)
    assert buf._priority(pr, [h], [0]).tolist() == [2.0]


def test_scalar_priority_kinds():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=1.0)
    h = None
    vals = [2.0, 3, np.float32(4.0), np.float64(5.0), np.int64(6), 0]
    for v in vals:
        h = buf.record(h, np.zeros(4), 0, 0.0, priority=v)
    buf.record(h, np.zeros(4), 0, 0.0, terminated=True)
    assert buf._priority(pr, [h] * 6, range(6)).tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 0.0]


def test_unsafe_casts_raise_type_error():
    buf = make()
    before = snapshot(buf)
    with pytest.raises(TypeError):
        buf.record(None, np.zeros(4), 1.5, 0.0)  # float into int64 action
    with pytest.raises(TypeError):
        buf.record(None, np.zeros(4), np.array(1.0), 0.0)
    with pytest.raises(TypeError):
        buf.record(None, np.zeros(4, np.complex64), 1, 0.0)  # complex into float
    with pytest.raises(TypeError):
        buf.record(None, np.zeros(4), 1, 1j)
    assert snapshot(buf) == before


def test_non_contiguous_inputs():
    buf = make(state_shape=(3, 2), action_shape=(2,), action_dtype="float32", pick_len=2)
    big = np.arange(200, dtype=np.float32).reshape(10, 2, 10)
    S = big[:, :, ::4].transpose(0, 2, 1)  # (10, 3, 2) strided, not C-contiguous
    assert S.shape == (10, 3, 2) and not S.flags.c_contiguous
    A = np.asfortranarray(np.arange(20, dtype=np.float32).reshape(10, 2))
    R = np.arange(40, dtype=np.float32)[::4]
    P_ = np.linspace(0.5, 2, 20)[::2]
    h = buf.record_many(None, S, A, R, final_state=np.asfortranarray(S[0] + 100), priorities=P_)
    ep = buf.episode(h)
    assert np.array_equal(ep.state, S) and np.array_equal(ep.action, A)
    assert np.array_equal(ep.reward, R) and np.array_equal(ep.final_state, S[0] + 100)
    h2 = buf.record(None, S[3].T.T[::1], A[::-1][0], R[::-1][0])
    assert np.array_equal(buf.episode(h2).state[0], S[3])
    # non-contiguous pick arrays in set_priority
    pr = buf.new_pick_selector(P, alpha=1.0)
    e, p = buf._picks()
    ee = np.repeat(e, 2)[::2]
    pp = np.repeat(p, 2)[::2]
    assert buf.set_priority(pr, ee, pp, np.full(2 * len(e), 3.0)[::2]) == len(e)
    check_batch(buf, buf.get_batch(10, pr))


def test_record_keywords_and_positional():
    buf = make()
    h = buf.record(h=None, state=np.zeros(4), action=1, reward=0.5, final_state=None,
                   terminated=False, priority=None)
    h = buf.record(h, np.zeros(4), 1, 0.5, None, True, 2.0)
    assert buf.episode(h).terminated
    h = buf.record_many(h=None, states=np.zeros((2, 4)), actions=[1, 2], rewards=[0, 0],
                        final_state=np.zeros(4), terminated=True, priorities=[1.0, 2.0])
    assert buf.episode(h).ended


def test_len_and_counts_consistent_over_random_ops():
    rng = random.Random(8)
    buf = make(capacity=50, pick_len=3, allow_short=True, eviction="second_chance")
    u = buf.new_pick_selector(U)
    h = None
    for i in range(300):
        r = rng.random()
        if r < 0.6:
            h = buf.record(h, np.full(4, i), i, 0.0, terminated=rng.random() < 0.1)
        elif r < 0.8:
            h = fill(buf, rng.randint(1, 9), h=h, start=i, ended=rng.random() < 0.4)
        elif r < 0.85:
            h = buf.new_episode()
        elif buf.num_picks:
            check_batch(buf, buf.get_batch(5, u))
        if i % 25 == 0:
            check_counts(buf)
    check_counts(buf)


# ---- reproducibility --------------------------------------------------------


def _run(seed):
    buf = make(seed=seed, pick_len=2, capacity=60, eviction="second_chance")
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.7, beta=0.5)
    rng = random.Random(1)
    out = []
    for i in range(40):
        T = rng.randint(1, 8)
        fill(buf, T, start=i, ended=rng.random() < 0.5,
             priorities=[rng.random() for _ in range(T)] if i % 2 else None)
        if buf.num_picks:
            for ps in (u, pr):
                b = buf.get_batch(6, ps)
                out.append([x.copy() for x in b] + [b.weight.copy()])
            b = out[-1]
            buf.set_priority(pr, b[6], b[7], np.arange(1, 7) * 0.5)
    return out, snapshot(buf, [pr])


def test_same_seed_same_batches():
    a, sa = _run(123)
    b, sb = _run(123)
    assert len(a) == len(b) > 10
    for x, y in zip(a, b):
        for xa, ya in zip(x, y):
            assert np.array_equal(xa, ya)
    assert sa == sb
    c, _ = _run(124)
    assert any(not np.array_equal(x[6], y[6]) or not np.array_equal(x[7], y[7])
               for x, y in zip(a, c))


def test_priority_stats_and_stored_priorities():
    buf = make()
    pr = buf.new_pick_selector(P, alpha=0.5)
    u = buf.new_pick_selector(U)
    h = None
    for i, p in enumerate([4.0, 0.0, 9.0, 1.0, 2.25, 16.0]):
        h = buf.record(h, np.full(4, i, np.float32), i, 0.0, priority=p)
    e, q = buf._picks()
    stored = buf.stored_priorities(pr, e, q)
    assert np.array_equal(stored, buf._priority(pr, e, q))
    total, lo, n = buf.priority_stats(pr)
    assert n == buf.num_picks == 5
    assert total == pytest.approx(stored.sum())
    assert lo == stored[stored > 0].min() == 1.0  # 1.0 ** 0.5; the 0.0 pick is skipped
    assert buf.priority_stats(u) == (5.0, 1.0, 5)
    buf.set_priority(pr, e, q, 0.0)
    total, lo, n = buf.priority_stats(pr)
    assert total == 0.0 and lo == float("inf") and n == 5
    with pytest.raises(ValueError, match="ps"):
        buf.priority_stats(99)
    with pytest.raises(ValueError):
        buf.stored_priorities(u, e, q)
    with pytest.raises(ValueError):
        buf.stored_priorities(pr, [h], [99])


def test_set_priority_with_no_picks():
    # empty arrays of each kind, and a broadcast scalar, apply to nothing;
    # (once an empty priorities array was read past its end: ASan found it)
    buf = make()
    pr = buf.new_pick_selector(P)
    for prios in (np.zeros(0), [], np.zeros(0, np.float32), 2.0, np.float32(2.0)):
        assert buf.set_priority(pr, np.zeros(0, np.int64), [], prios) == 0
    with pytest.raises(ValueError, match="priorities"):
        buf.set_priority(pr, [], [], -1.0)
    buf._check()
