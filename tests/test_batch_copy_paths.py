"""get_batch's copy paths against episode(), pick by pick.

The single-array copy has one loop per common width combination (states of
4 to 64 bytes, int32/int64 actions, float32/float64 rewards: `fuse_batch` in
src/core/batch_copy.c) and a field-by-field copy for the rest. The planner
(src/core/buffer_batch.c) and the fused copy choose a pick's rows with
selects rather than branches: the segment a pick runs into, the last next
state (a stored row, the final state or zeros), the padding of a short pick.
These tests record episodes whose lengths put picks across the first
segment boundaries (16, 48, 112 rows), at the end of ended, terminated and
open episodes, and compare every pick of the buffer (with `_gather`) and a
large random batch (with `get_batch`) with the recorded steps.
"""
import numpy as np
import pytest

from exreplay import ExperienceReplay, _core

# (state shape, state dtype, action dtype, reward dtype): every fused
# combination's state widths, both action and reward widths, and layouts
# that take the field-by-field copy.
LAYOUTS = [
    ((1,), "float32", "int64", "float32"),
    ((4,), "float32", "int64", "float32"),
    ((2,), "float32", "int32", "float32"),
    ((4,), "float64", "int64", "float64"),
    ((8,), "float32", "int32", "float64"),
    ((16,), "float32", "int64", "float32"),
    ((8,), "float64", "int32", "float32"),
    ((3,), "float32", "int64", "float32"),  # 12-byte states: not fused
    ((4,), "float32", "uint8", "float32"),  # 1-byte actions: not fused
]

LENGTHS = [1, 5, 9, 15, 16, 17, 31, 47, 48, 49, 63, 113, 200]


def _fill(buf, rng):
    """Episodes of LENGTHS, ended with a final state, terminated, or left open."""
    for i, T in enumerate(LENGTHS):
        st = (rng.random((T, *buf.state_shape)) * 100 + 1).astype(buf.state_dtype)
        ac = rng.integers(1, 100, T).astype(buf.action_dtype)
        rw = (rng.random(T) + 1).astype(buf.reward_dtype)
        how = i % 3
        if how == 0:
            fin = (rng.random(buf.state_shape) * 100 + 1).astype(buf.state_dtype)
            buf.record_many(None, st, ac, rw, final_state=fin, terminated=False)
        elif how == 1:
            buf.record_many(None, st, ac, rw, terminated=True)
        else:
            buf.record_many(None, st, ac, rw)


def _expected(buf, h, p):
    """One pick's state, next state, action, reward, seq_len, seq_len_next."""
    ep = buf.episode(int(h))
    L, n = buf.pick_len, len(ep.reward)
    c = n if ep.ended else n - 1
    ln = min(L, c - p)
    zero_s = np.zeros(buf.state_shape, buf.state_dtype)
    fin = ep.final_state if ep.final_state is not None else zero_s
    st = np.zeros((L, *buf.state_shape), buf.state_dtype)
    nx = np.zeros_like(st)
    ac = np.zeros(L, buf.action_dtype)
    rw = np.zeros(L, buf.reward_dtype)
    for r in range(ln):
        st[r], ac[r], rw[r] = ep.state[p + r], ep.action[p + r], ep.reward[p + r]
        nx[r] = ep.state[p + r + 1] if p + r + 1 < n else fin
    return st, nx, ac, rw, ln, ln - int(bool(ep.terminated) and p + ln == n)


def _check(buf, b):
    for i, (h, p) in enumerate(zip(b.pick_epi.tolist(), b.pick_pos.tolist())):
        st, nx, ac, rw, ln, lnn = _expected(buf, h, p)
        assert np.array_equal(b.state[i], st), (h, p)
        assert np.array_equal(b.state_next[i], nx), (h, p)
        assert np.array_equal(b.action[i], ac), (h, p)
        assert np.array_equal(b.reward[i], rw), (h, p)
        assert (b.seq_len[i], b.seq_len_next[i]) == (ln, lnn), (h, p)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("pick_len,allow_short", [(1, False), (3, True), (8, True), (8, False), (17, True)])
def test_every_pick(layout, pick_len, allow_short):
    shape, sd, ad, rd = layout
    buf = ExperienceReplay(shape, state_dtype=sd, action_dtype=ad, reward_dtype=rd,
                           capacity=None, pick_len=pick_len, allow_short=allow_short, seed=3)
    _fill(buf, np.random.default_rng(pick_len))
    u = buf.new_pick_selector(0)
    e, p = buf._picks()
    assert len(e) > 0
    _check(buf, buf._gather(u, e, p))
    _check(buf, buf.get_batch(2000, u))


@pytest.mark.parametrize("layout", LAYOUTS[1:2] + LAYOUTS[-2:-1], ids=lambda x: "-".join(map(str, x)))
def test_cold_buffer(layout):
    """A buffer of more than 8 MiB of rows and picks: the plan's chain walk and row
    prefetches and the copy's prefetches run (batch_heat_locked)."""
    shape, sd, ad, rd = layout
    buf = ExperienceReplay(shape, state_dtype=sd, action_dtype=ad, reward_dtype=rd,
                           capacity=None, pick_len=8, allow_short=True, seed=5)
    rng = np.random.default_rng(9)
    for i in range(1600):
        T = 150 + i % 101
        st = np.ones((T, *shape), sd)
        st[:, 0] = np.arange(T)
        buf.record_many(None, st, np.arange(T).astype(ad), np.ones(T, rd), terminated=bool(i % 2))
    _fill(buf, rng)
    u = buf.new_pick_selector(0)
    for _ in range(3):
        _check(buf, buf.get_batch(3000, u))
    for n in (1, 32, 45, 64):
        _check(buf, buf.get_batch(n, u))


@pytest.mark.parametrize("simd", [True, False], ids=["simd", "scalar"])
@pytest.mark.parametrize("pick_len,allow_short", [(4, False), (8, True), (12, True), (16, False)])
def test_rows4_copy(simd, pick_len, allow_short):
    """(4,) float32 | int64 | float32 rows with pick_len a multiple of 4 are copied
    four rows at a time with AVX-512 where the machine has it (batch_copy.c,
    rows4_batch; picks across a segment boundary with masked loads), else by
    the fused copy: both give the same batches."""
    old = _core._set_copy_simd(simd)
    try:
        buf = ExperienceReplay((4,), state_dtype="float32", action_dtype="int64", reward_dtype="float32",
                               capacity=None, pick_len=pick_len, allow_short=allow_short, seed=3)
        _fill(buf, np.random.default_rng(pick_len))
        u = buf.new_pick_selector(0)
        e, p = buf._picks()
        _check(buf, buf._gather(u, e, p))
        _check(buf, buf.get_batch(2000, u))
    finally:
        _core._set_copy_simd(old)


# (state shape, state dtype, pick_len, episode lengths): layouts whose segments
# grow to their largest size early (1 KiB rows: 16, 32, ... 256 rows, then
# fixed 512-row segments from position 496 on; 36 KiB rows: every segment of
# 16 rows) and picks longer than the first segment (pick_len 17: 32-row segments).
PLAN_LANES = [
    ((4,), "float32", 8, LENGTHS),
    ((256,), "float32", 8, [600, 300, 9, 17]),
    ((96, 96), "float32", 3, [5, 17, 6]),
    ((4,), "float32", 17, LENGTHS),
    ((2,), "float64", 1, LENGTHS),
]


# batch sizes: small ones (eight- or four-pick groups and a tail, or only a tail), large ones
SIZES = (1, 7, 32, 45, 64, 65, 72, 1003)


@pytest.mark.parametrize("shape,dtype,pick_len,lengths", PLAN_LANES, ids=lambda x: str(x))
def test_plan_lanes(shape, dtype, pick_len, lengths):
    """A batch from a buffer that stays in cache is planned eight picks at a time
    with AVX-512, or four with AVX2, where the machine has it (plan_simd.c; the
    picks past the last group pick by pick), else pick by pick: both give the same batches (and the
    recorded steps), small ones (at most 64 picks, copied under the shared hold)
    and large ones, for
    picks in fixed-size segments, across segment boundaries, and at the end of
    ended, terminated and open episodes (the mark a drawn episode gets included:
    evicting with second chance then takes the same episodes)."""
    out = {}
    for simd in (True, False):
        old = _core._set_copy_simd(simd)
        try:
            buf = ExperienceReplay(shape, state_dtype=dtype, capacity=sum(lengths), pick_len=pick_len,
                                   allow_short=True, seed=11, eviction="second_chance")
            rng = np.random.default_rng(4)
            for i, T in enumerate(lengths):
                st = (rng.random((T, *shape)) * 100 + 1).astype(dtype)
                ac, rw = rng.integers(1, 9, T), rng.random(T).astype("float32")
                if i % 3 == 0:
                    buf.record_many(None, st, ac, rw, final_state=st[0], terminated=False)
                else:
                    buf.record_many(None, st, ac, rw, terminated=i % 3 == 1)
            u = buf.new_pick_selector(0)
            out[simd] = [buf.get_batch(n, u) for n in SIZES]
            if simd:
                for b in out[simd]:
                    _check(buf, b)
            # evicts by second chance, which reads the marks the draws left
            buf.record_many(None, st[: len(st) // 2 + 1], ac[: len(st) // 2 + 1], rw[: len(st) // 2 + 1])
            out[simd].append(sorted(set(buf._picks()[0].tolist())))
        finally:
            _core._set_copy_simd(old)
    for x, y in zip(out[True][:-1], out[False][:-1]):
        for name in ("state", "state_next", "action", "reward", "seq_len", "seq_len_next",
                     "pick_epi", "pick_pos", "weight"):
            assert np.array_equal(getattr(x, name), getattr(y, name)), name
    assert out[True][-1] == out[False][-1]
