"""Atari and R2D2 shapes: 84x84 uint8 states, uniform selection.

- "R2D2":  get_batch(32) of pick_len = 80 sequences;
- "Atari": get_batch(512) of pick_len = 1 transitions;

each from a buffer of N records (episodes of 500 steps), against the floor
(`_core._floor_gather` of the same B x L from one contiguous (N, 84, 84)
uint8 array), timed one after the other in the same run, in alternation.

Each case is timed in both layouts of get_batch's states:
- "exreplay" against "floor": the default layout, state and state_next as
  two (B, L, 84, 84) arrays; the floor copies rows[s:s+L] and
  rows[s+1:s+L+1];
- "exreplay_shared" against "floor_shared": get_batch(..., shared_next=True),
  one (B, L + 1, 84, 84) state_seq (state and state_next its views); the
  floor copies rows[s:s+L+1] into one such array
  (`_core._floor_gather(rows, starts, L, True)`).
"""

import pytest

import harness
from exreplay import _core

EP = 500
CASES = [("r2d2", 32, 80), ("atari", 512, 1)]

_CACHE: dict = {}


def _get(n, L):
    """The exreplay buffer and the floor rows of one case (kept together)."""
    key = (n, L)
    if key not in _CACHE:
        _CACHE.clear()
        harness.collect()
        buf = harness.impl_class("exreplay")(
            state_shape=harness.ATARI_SHAPE, state_dtype="uint8", capacity=n, pick_len=L, seed=1
        )
        ps = harness.uniform(buf)
        harness.fill(buf, n, EP, harness.ATARI_SHAPE, harness.ATARI_DTYPE)
        rows = harness.floor_rows(n, harness.ATARI_SHAPE, harness.ATARI_DTYPE)
        _CACHE[key] = (buf, ps, rows)
    return _CACHE[key]


@pytest.mark.parametrize("impl", ["exreplay", "floor", "exreplay_shared", "floor_shared"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_shape_batch(benchmark, case, impl):
    """Each timed round is preceded by one untimed call of the counterpart
    (floor before get_batch, get_batch before floor; in the shared layout the
    shared floor before a shared get_batch, a shared get_batch before the
    shared floor): both see the same allocator and cache history."""
    name, batch, L = case
    n = harness.atari_size()
    r = harness.rounds(30 if L > 1 else 60, 3)
    harness.tag(benchmark, f"{name} batch B={batch} L={L}", suite="shapes", case=name, impl=impl, N=n, B=batch, L=L)
    buf, ps, rows = _get(n, L)
    pool = harness.StartPool(n, L, batch)
    if impl == "exreplay":
        b = benchmark.pedantic(
            buf.get_batch, args=(batch, ps), setup=lambda: _core._floor_gather(rows, pool.next(), L) and None,
            rounds=r, warmup_rounds=2,
        )
        assert b.state.shape == (batch, L, 84, 84)
    elif impl == "floor":
        def setup():
            buf.get_batch(batch, ps)
            return (rows, pool.next(), L), {}

        st, nx = benchmark.pedantic(_core._floor_gather, setup=setup, rounds=r, warmup_rounds=2)
        assert st.shape == (batch, L, 84, 84)
    elif impl == "exreplay_shared":
        def setup():
            _core._floor_gather(rows, pool.next(), L, True)

        b = benchmark.pedantic(
            buf.get_batch, args=(batch, ps), kwargs={"shared_next": True}, setup=setup, rounds=r, warmup_rounds=2,
        )
        assert b.state_seq.shape == (batch, L + 1, 84, 84) and b.state.shape == (batch, L, 84, 84)
    else:
        def setup():
            buf.get_batch(batch, ps, shared_next=True)
            return (rows, pool.next(), L, True), {}

        seq = benchmark.pedantic(_core._floor_gather, setup=setup, rounds=r, warmup_rounds=2)
        assert seq.shape == (batch, L + 1, 84, 84)
