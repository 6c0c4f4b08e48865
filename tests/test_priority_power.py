"""The stored form of a priority, p ** alpha as float32 (docs/semantics.md,
"Stored priorities"): the C buffer and the pure-Python reference give the
same bits for every priority and alpha, and both are within one float32 ulp
of the correctly rounded p ** alpha (equal to it for all but a rare few)."""
import math
import random

import numpy as np
import pytest

import exreplay
from exreplay.reference import _leaf

P = exreplay.PickSelectorClass.Prioritized

SPECIALS = [
    0.0, 5e-324, 1e-310, 2.2250738585072014e-308, 2.225073858507201e-308, 1e-45, 1e-39,
    0.5, 1.0, 2.0, 4.0, 0.7071067811865475, 0.7071067811865476, 1.4142135623730951,
    3.4028234663852886e38, 3.5e38, 1e300, 1.7976931348623157e308,
]
ALPHAS = [0.6, 0.7, 0.4, 0.0, 1.0, 0.5, 1e-9, 3.0, 17.5, 1e5, 1e300, 2.5e-300]


def _stored(alpha, values):
    buf = exreplay.ExperienceReplay((1,), capacity=len(values) + 10, pick_len=1, seed=0)
    pr = buf.new_pick_selector(P, alpha=alpha)
    n = len(values)
    h = buf.record_many(None, np.zeros((n, 1), np.float32), np.zeros(n, np.int64),
                        np.zeros(n, np.float32), terminated=True)
    epi, pos = np.full(n, h), np.arange(n)
    # in C: 16 at a time (AVX2), 8 at a time (SSE2) and one by one (record's
    # path), each checked against the reference
    assert buf.set_priority(pr, epi, pos, np.asarray(values, np.float64)) == n
    batch = buf._priority(pr, epi, pos)
    for start in range(0, n - 22, 15):  # 15 per call: 8 in SSE2, 7 one by one
        buf.set_priority(pr, epi[start:start + 15], pos[start:start + 15],
                         np.asarray(values[start + 7:start + 22], np.float64))
    shifted = buf._priority(pr, epi, pos)
    for start in range(0, n - 22, 15):
        want = [_leaf(v, alpha) for v in values[start + 7:start + 22]]
        assert shifted[start:start + 15].tolist() == want
    for i in range(0, n, 97):
        buf.set_priority(pr, [h], [i], values[i])
        assert buf._priority(pr, [h], [i])[0] == _leaf(values[i], alpha)
    buf._check()
    return batch


@pytest.mark.parametrize("alpha", ALPHAS)
def test_c_and_reference_store_the_same_bits(alpha):
    rng = random.Random(hash(alpha) & 0xFFFF)
    values = SPECIALS + [math.exp(rng.uniform(-745, 709)) for _ in range(1500)]
    values += [rng.random() * 10 for _ in range(1500)]
    batch = _stored(alpha, values)
    want = np.array([_leaf(v, alpha) for v in values])
    assert np.array_equal(batch, want), np.flatnonzero(batch != want)[:10]


def test_close_to_the_correctly_rounded_power():
    rng = random.Random(4)
    values = [math.exp(rng.uniform(-60, 60)) for _ in range(20000)]
    for alpha in (0.6, 0.7, 0.4, 2.3):
        got = np.array([_leaf(v, alpha) for v in values], np.float32)
        want = np.array([min(v**alpha, 3.4028234663852886e38) for v in values]).astype(np.float32)
        ulps = np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32))
        assert ulps.max() <= 1
        assert np.count_nonzero(ulps) <= len(values) // 1000


def test_zero_and_exact_alphas():
    assert _leaf(0.0, 0.0) == 0.0 and _leaf(0.0, 0.6) == 0.0  # never drawn
    assert _leaf(3.0, 0.0) == 1.0
    assert _leaf(3.0, 1.0) == float(np.float32(3.0))
    assert _leaf(9.0, 0.5) == 3.0
    assert _leaf(4.0, 1.5) == 8.0  # a power of two: log2 is exact, so is 2^3
    assert _leaf(1.0, 0.6) == 1.0 and _leaf(1.0, 1e300) == 1.0  # log2(1) is exactly 0
    assert _leaf(1e300, 0.6) == float(np.finfo(np.float32).max)  # saturates
    assert _leaf(1e-300, 0.6) == 0.0  # underflows float32


def test_selectors_of_different_alphas_taking_turns():
    """set_priority computes p ** alpha before it takes the lock, with the
    alpha of the prioritized selector it last updated (a guess, checked
    under the lock): selectors of different alphas taking turns, a uniform
    one among them and a scalar priority, each store their own alpha's bits."""
    rng = np.random.default_rng(7)
    buf = exreplay.ExperienceReplay((1,), capacity=400, pick_len=1, seed=0)
    sels = [(buf.new_pick_selector(P, alpha=a), a) for a in (0.6, 0.7, 0.6, 2.5)]
    uni = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    n = 300
    h = buf.record_many(None, np.zeros((n, 1), np.float32), np.zeros(n, np.int64),
                        np.zeros(n, np.float32), terminated=True)
    for rnd in range(12):
        pr, alpha = sels[(rnd * 3) % len(sels)]
        pos = rng.permutation(n)[:rng.integers(1, 280)]
        p = rng.random(len(pos)) * 5
        assert buf.set_priority(pr, np.full(len(pos), h), pos, p) == len(pos)
        assert buf._priority(pr, np.full(len(pos), h), pos).tolist() == [_leaf(v, alpha) for v in p]
        assert buf.set_priority(uni, [h], [0], 1.0) == 0
        buf.set_priority(pr, np.full(len(pos), h), pos, 0.25)  # one priority for every pick
        assert buf._priority(pr, np.full(len(pos), h), pos).tolist() == [_leaf(0.25, alpha)] * len(pos)
    buf._check()


def test_recorded_priorities_under_selectors_of_different_alphas():
    """A record call computes its priorities' p ** alpha before it takes the
    lock, with the alpha the first prioritized selector had at the last call
    (a guess, checked against each selector under the lock): every
    selector still stores its own alpha's bits of the recorded float32."""
    rng = np.random.default_rng(3)
    buf = exreplay.ExperienceReplay((1,), capacity=10_000, pick_len=1, seed=0)
    sels = [(buf.new_pick_selector(P, alpha=0.6), 0.6)]
    for rnd in range(8):
        if rnd == 3:
            sels.append((buf.new_pick_selector(P, alpha=2.5), 2.5))
            buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
        if rnd == 5:  # the first selector is now of another alpha
            buf.remove_pick_selector(sels.pop(0)[0])
        n = int(rng.integers(1, 300))
        p = np.exp(rng.uniform(-30, 30, n))
        h = buf.record_many(None, np.zeros((n, 1), np.float32), np.zeros(n, np.int64),
                            np.zeros(n, np.float32), terminated=True,
                            priorities=None if rnd == 4 else p)
        for sel, alpha in sels:
            got = buf._priority(sel, np.full(n, h), np.arange(n)).tolist()
            if rnd != 4:
                assert got == [_leaf(float(np.float32(min(v, 3.4028234663852886e38))), alpha)
                               for v in p]
    buf._check()
