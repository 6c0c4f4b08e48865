"""Prioritized importance-sampling weights against (min_leaf / leaf) ** beta
computed in double and rounded to float32 (docs/semantics.md, "Weights"):
leaves spread over float32's whole range, betas from 0 to far past 1, and
the zero-leaf weight of _gather."""

import numpy as np
import pytest

from exreplay import _core


def _gathered(beta, priorities):
    buf = _core.ExperienceReplay((1,), capacity=100_000, pick_len=1, seed=1)
    ps = buf.new_pick_selector(_core.prioritized, alpha=1.0, beta=beta)
    n = len(priorities)
    h = buf.record_many(None, np.zeros((n, 1), np.float32), np.zeros(n, np.int64),
                        np.ones(n, np.float32), terminated=True, priorities=priorities)
    epi = np.full(n, h, np.int64)
    batch = buf._gather(ps, epi, np.arange(n))
    leaves = buf._priority(ps, epi, np.arange(n)).astype(np.float64)
    return batch.weight, leaves


def _expected(leaves, beta):
    lo = leaves[leaves > 0].min()
    with np.errstate(divide="ignore", over="ignore", under="ignore"):
        w = (lo / np.where(leaves > 0, leaves, 1.0)) ** beta
    return np.where(leaves > 0, w, np.inf if beta > 0 else 1.0).astype(np.float32)


@pytest.mark.parametrize("beta", [0.0, 1e-50, 0.4, 0.5, 1.0, 3.7, 40.0, 1e300])
def test_weights_match_double_power(beta):
    rng = np.random.default_rng(5)
    pri = np.concatenate([10.0 ** rng.uniform(-40, 38, 3000), [0.0, 1.0, 3e38]])
    w, leaves = _gathered(beta, pri)
    want = _expected(leaves, beta)
    assert w.dtype == np.float32
    same = w == want
    # the series is within ~1e-14 of the power: only a power lying that close
    # to a float32 rounding boundary may round the other way (1 ulp)
    assert same.mean() >= 0.999, f"{(~same).sum()} of {len(w)} differ"
    ulps = np.abs(w[~same].view(np.int32).astype(np.int64) - want[~same].view(np.int32))
    assert (ulps <= 1).all()
    # a zero leaf: (N * 0) ** -beta
    assert w[-3] == (np.inf if beta > 0 else 1.0)


def test_weights_of_get_batch_are_those_of_gather():
    rng = np.random.default_rng(7)
    pri = 10.0 ** rng.uniform(-20, 20, 2000)
    buf = _core.ExperienceReplay((1,), capacity=10_000, pick_len=1, seed=3)
    ps = buf.new_pick_selector(_core.prioritized, alpha=0.7, beta=0.6)
    n = len(pri)
    buf.record_many(None, np.zeros((n, 1), np.float32), np.zeros(n, np.int64),
                    np.ones(n, np.float32), terminated=True, priorities=pri)
    b = buf.get_batch(300, ps)
    g = buf._gather(ps, b.pick_epi, b.pick_pos)
    assert np.array_equal(b.weight, g.weight)
    leaves = buf._priority(ps, b.pick_epi, b.pick_pos).astype(np.float64)
    lo = buf._priority(ps, *[np.full(n, b.pick_epi[0]), np.arange(n)]).astype(np.float64).min()
    want = ((lo / leaves) ** 0.6).astype(np.float32)
    assert (b.weight == want).mean() >= 0.99
