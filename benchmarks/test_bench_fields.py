"""Named state fields and extras: get_batch against the gather floor of the same bytes.

A buffer with state_spec = {"img": (84, 84) uint8, "vec": (4,) float32} and
one extras field (the R2D2 case: "h", the recurrent state, (2, 256) float32;
the Atari case: "logp", a float32 scalar), filled with N records in episodes
of 500, uniform selection:

- "R2D2":  get_batch(32) of pick_len = 80 sequences;
- "Atari": get_batch(512) of pick_len = 1 transitions;

against the floor: `_core._floor_gather_cols` gathering the same fields
(img and vec with their next states, the extras field without) from one
contiguous (N, ...) array per field, pick by pick, in a plain C loop, into
output arrays made once and refilled (get_batch's batch memory is recycled
too, so neither pays for fresh pages; 40 MB of fresh outputs a call would
make the floor page-fault and look slower than it is). As in
test_bench_shapes.py (the single-array floor), the floor copies the fields'
bytes, not the action and reward columns get_batch fills too. The two are
timed one after the other in the same run, in alternation; report.py
divides their medians. test_fields_paired times them call by call in
alternation and keeps the median of the per-round ratios, the measure the
report's paired goal row is judged on.
"""

import numpy as np
import pytest

import harness
from exreplay import _core

EP = 500
CASES = [("r2d2", 32, 80, {"h": ((2, 256), np.float32)}), ("atari", 512, 1, {"logp": ((), np.float32)})]
STATE_SPEC = {"img": ((84, 84), np.uint8), "vec": ((4,), np.float32)}

_CACHE: dict = {}


def _cols(n, spec, rng):
    """One contiguous array per field, every page touched."""
    out = {}
    for k, (shape, dt) in spec.items():
        if np.dtype(dt).kind == "u":
            out[k] = rng.integers(0, 256, size=(n, *shape), dtype=dt)
        else:
            out[k] = rng.standard_normal((n, *shape)).astype(dt)
    return out


def _get(n, L, xspec):
    """The exreplay buffer and the floor's columns of one case (kept together)."""
    key = (n, L, tuple(xspec))
    if key not in _CACHE:
        _CACHE.clear()
        harness.collect()
        rng = np.random.default_rng(1)
        buf = harness.impl_class("exreplay")(
            state_spec=STATE_SPEC, extras_spec=xspec, capacity=n, pick_len=L, seed=1
        )
        ps = harness.uniform(buf)
        ep_s, ep_x = _cols(EP, STATE_SPEC, rng), _cols(EP, xspec, rng)
        actions = rng.integers(0, 4, size=EP).astype(np.int64)
        rewards = np.ones(EP, np.float32)
        fin = {k: v[0] for k, v in ep_s.items()}
        for start in range(0, n, EP):
            T = min(EP, n - start)
            buf.record_many(
                None, {k: v[:T] for k, v in ep_s.items()}, actions[:T], rewards[:T],
                final_state=fin, extras={k: v[:T] for k, v in ep_x.items()},
            )
        cols = _cols(n, STATE_SPEC, rng)
        cols.update(_cols(n, xspec, rng))
        cols = [cols["img"], cols["vec"], *(cols[k] for k in xspec)]
        _CACHE[key] = (buf, ps, cols, {})
    return _CACHE[key]


def _read(arrays):
    """Reads every byte of the arrays (a max over 8-byte words): what a
    learner does with its batch next."""
    for a in arrays:
        a.reshape(-1).view(np.uint64).max()


@pytest.mark.parametrize("read", [False, True], ids=["", "then-read"])
@pytest.mark.parametrize("impl", ["exreplay", "floor"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fields_batch(benchmark, case, impl, read):
    """Each timed round is preceded by one untimed call of the counterpart
    (floor before get_batch, get_batch before floor): both see the same
    allocator and cache history. With `then-read`, the timed call also
    reads the batch's two image arrays (state and next state) once: a batch
    written past the cache (docs/design.md, "Large batches") must not just
    move the cost to its reader."""
    name, batch, L, xspec = case
    n = harness.atari_size()
    r = harness.rounds(30 if L > 1 else 60, 3)
    what = f"fields {name} batch B={batch} L={L}" + (" then read" if read else "")
    harness.tag(benchmark, what, suite="fields", case=name + ("-read" if read else ""),
                impl=impl, N=n, B=batch, L=L)
    buf, ps, cols, outs = _get(n, L, xspec)
    pool = harness.StartPool(n, L, batch)
    if batch not in outs:
        outs[batch] = _core._floor_gather_cols(cols, pool.next(), L, 2)
    out = outs[batch]
    if impl == "exreplay":
        def call():
            b = buf.get_batch(batch, ps)
            if read:
                _read((b.state["img"], b.state_next["img"]))
            return b

        b = benchmark.pedantic(
            call, setup=lambda: _core._floor_gather_cols(cols, pool.next(), L, 2, out) and None,
            rounds=r, warmup_rounds=2,
        )
        assert b.state["img"].shape == (batch, L, 84, 84)
        assert b.extras[next(iter(xspec))].shape == (batch, L, *next(iter(xspec.values()))[0])
    else:
        def setup():
            buf.get_batch(batch, ps)
            return (cols, pool.next(), L, 2, out), {}

        def call(*args):
            res = _core._floor_gather_cols(*args)
            if read:
                _read((res[0][0], res[1][0]))
            return res

        outs, nexts = benchmark.pedantic(call, setup=setup, rounds=r, warmup_rounds=2)
        assert outs[0].shape == (batch, L, 84, 84) and len(nexts) == 2


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fields_paired(benchmark, case):
    """get_batch and the floor of test_fields_batch timed in alternation,
    one call each a round, the order swapped every round, so that both see
    the same machine; reports the median of the paired get_batch / floor
    ratios (report.py judges the paired goal row on it). Why: the unpaired
    rows, medians of rounds taken seconds apart, read from 1.09x to 2.08x
    for the Atari case over this project's runs on the development VM, whose
    CPU runs at one of two speeds from one minute to the next. Each timed
    call follows an untimed one of the other side, as in the unpaired test.
    The pytest-benchmark timing is of get_batch alone."""
    import statistics
    import time

    name, batch, L, xspec = case
    n = harness.atari_size()
    buf, ps, cols, outs = _get(n, L, xspec)
    pool = harness.StartPool(n, L, batch)
    if batch not in outs:
        outs[batch] = _core._floor_gather_cols(cols, pool.next(), L, 2)
    out = outs[batch]

    def get():
        buf.get_batch(batch, ps)

    def floor():
        _core._floor_gather_cols(cols, pool.next(), L, 2, out)

    def timed(fn):
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    get()
    floor()
    ratio, f, g = harness.alternate(floor, get, timed, harness.rounds(30 if L > 1 else 60, 3))
    print(f"\nfields {name} paired: get_batch {statistics.median(g) * 1e6:.0f} us, "
          f"floor {statistics.median(f) * 1e6:.0f} us, paired ratio {ratio:.2f}x")
    harness.tag(benchmark, f"fields {name} paired B={batch} L={L}", suite="fields_paired", case=name,
                impl="exreplay", N=n, B=batch, L=L, paired_floor_ratio=ratio,
                exreplay_median_s=statistics.median(g), floor_median_s=statistics.median(f))
    benchmark.pedantic(get, setup=floor, rounds=harness.rounds(10, 2), warmup_rounds=1)
