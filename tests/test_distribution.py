"""Statistical tests of selection (docs/semantics.md, "Priorities").

With fixed seeds, ~200k draws per check:

- uniform selection draws each of N picks with probability 1/N;
- prioritized selection draws pick i with P(i) = p_i^a / sum_j p_j^a, never a
  pick of priority 0 (chi-square goodness of fit, p > 1e-4);
- importance weights are w_i = (N P(i))^-beta / max_j w_j over the picks with
  p_j > 0, computed here in float64 from the raw priorities (rtol 1e-5);
- the distribution still holds after set_priority and after evictions (which
  swap-remove picks and move others around in the pick table);
- the same seed gives the same batches; the selectors of one buffer draw
  from generators of their own.

Every test runs against the C buffer and the pure-Python reference.
"""

import os

import numpy as np
import pytest
from scipy import stats

import exreplay
from exreplay.reference import PickSelectorClass, ReferenceReplay

Uniform = PickSelectorClass.Uniform
Prioritized = PickSelectorClass.Prioritized
Rank = PickSelectorClass.Rank

IMPLS = {"c": exreplay.ExperienceReplay, "reference": ReferenceReplay}

# Fewer draws under AddressSanitizer (EXREPLAY_ASAN=1), which is ~5x slower.
DRAWS = 50_000 if os.environ.get("EXREPLAY_ASAN") == "1" else 200_000
CHUNK = 20_000
P_MIN = 1e-4

# Diverse priorities, zeros included (never drawn).
PRIORITIES = [0.0, 0.05, 0.3, 1.0, 1.0, 2.5, 0.0, 7.0, 0.8, 12.0, 0.01, 3.3, 0.0, 0.6, 5.0]


@pytest.fixture(params=sorted(IMPLS))
def impl(request):
    return IMPLS[request.param]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def make_buffer(impl, *, episodes=6, steps=5, capacity=None, seed=1234, **kw):
    """A buffer of `episodes` terminated episodes of `steps` records each,
    pick_len 1: one pick per record, (epi, pos) for pos < steps."""
    buf = impl(state_shape=(2,), capacity=capacity, pick_len=1, seed=seed, **kw)
    for _ in range(episodes):
        add_episode(buf, steps)
    return buf


def add_episode(buf, steps, priorities=None):
    i = len(buf)
    states = np.arange(2 * steps, dtype=np.float32).reshape(steps, 2) + 100 * i
    actions = np.arange(steps, dtype=np.int64) + i
    rewards = np.arange(steps, dtype=np.float32)
    return buf.record_many(
        None, states, actions, rewards, terminated=True, priorities=priorities
    )


def picks_of(buf):
    epi, pos = buf._picks()
    order = np.lexsort((pos, epi))
    return epi[order], pos[order]


def draw_counts(buf, ps, epi, pos, draws=DRAWS):
    """How often each pick (epi[k], pos[k]) is drawn in `draws` draws, and
    every weight seen per pick (which must be the same for all its draws)."""
    key = epi * 1_000_003 + pos
    assert np.all(np.diff(key) > 0), "picks must be sorted and unique"
    counts = np.zeros(len(key), np.int64)
    weights = np.full(len(key), np.nan)
    done = 0
    while done < draws:
        n = min(CHUNK, draws - done)
        b = buf.get_batch(n, ps)
        k = np.searchsorted(key, b.pick_epi * 1_000_003 + b.pick_pos)
        assert np.all(key[k] == b.pick_epi * 1_000_003 + b.pick_pos), "drew an unknown pick"
        counts += np.bincount(k, minlength=len(key))
        # Weights: one value per pick.
        w = b.weight.astype(np.float64)
        first = np.full(len(key), np.nan)
        first[k] = w  # any one of the draws of each pick
        seen = ~np.isnan(first)
        np.testing.assert_array_equal(w, first[k], err_msg="one pick, two weights")
        prev = ~np.isnan(weights) & seen
        np.testing.assert_array_equal(weights[prev], first[prev])
        weights[seen] = first[seen]
        done += n
    return counts, weights


def expected_probabilities(raw, alpha):
    """P(i) = p_i^alpha / sum p^alpha in float64; a zero priority stays 0."""
    raw = np.asarray(raw, np.float64)
    lv = np.where(raw > 0, raw**alpha, 0.0)
    return lv / lv.sum()


def expected_weights(raw, alpha, beta):
    """PER: w_i = (N P(i))^-beta / max_j w_j over p_j > 0 (NaN where p_i = 0)."""
    P = expected_probabilities(raw, alpha)
    N = len(P)
    pos = P > 0
    w = np.full(N, np.nan)
    w[pos] = (N * P[pos]) ** -beta
    return w / np.nanmax(w)


def assert_matches(counts, P, what):
    """Chi-square goodness of fit on the picks with P > 0; none of the others
    is ever drawn."""
    P = np.asarray(P, np.float64)
    zero = P == 0
    assert counts[zero].sum() == 0, f"{what}: drew a pick of probability 0: {counts[zero]}"
    obs = counts[~zero]
    exp = P[~zero] * counts.sum()
    chi2, p = stats.chisquare(obs, exp)
    assert p > P_MIN, f"{what}: chi2 = {chi2:.1f} over {len(obs)} picks, p = {p:.3g}"


def set_all(buf, ps, epi, pos, raw):
    n = buf.set_priority(ps, epi, pos, np.asarray(raw, np.float64))
    assert n == len(epi)


# --------------------------------------------------------------------------
# rank
# --------------------------------------------------------------------------


def exact_ranks(raw):
    """1-based ranks by priority (descending), ties by pick order: what a Rank
    selector's heap holds right after it sorts itself (docs/semantics.md)."""
    order = sorted(range(len(raw)), key=lambda i: (-raw[i], i))
    ranks = np.empty(len(raw), np.int64)
    ranks[order] = np.arange(1, len(raw) + 1)
    return ranks


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_rank_frequencies_and_weights(impl, alpha, beta):
    buf = make_buffer(impl, episodes=3, steps=5, seed=3)
    ps = buf.new_pick_selector(Rank, alpha=alpha, beta=beta)
    epi, pos = picks_of(buf)
    N = len(epi)
    raw = PRIORITIES[:N]
    # 15 adds and then 15 changes a round: the heap sorts itself after its
    # 64th change, and rounds of the same values after that move nothing
    for _ in range(5):
        set_all(buf, ps, epi, pos, raw)
    # (the picks of make_buffer are in table order when sorted by (epi, pos))
    r = exact_ranks(raw)
    P = r.astype(np.float64) ** -alpha
    P /= P.sum()
    counts, weights = draw_counts(buf, ps, epi, pos)
    assert_matches(counts, P, f"rank, alpha={alpha}")  # zeros are drawn too
    np.testing.assert_allclose(weights, (r / N) ** (alpha * beta), rtol=1e-6)


def test_rank_ignores_priority_magnitudes(impl):
    """Only the order counts: scaling every priority changes no draw."""
    a, b = (make_buffer(impl, episodes=2, steps=5, seed=5) for _ in range(2))
    pa, pb = (x.new_pick_selector(Rank) for x in (a, b))
    epi, pos = picks_of(a)
    raw = np.asarray(PRIORITIES[: len(epi)])
    for _ in range(8):
        set_all(a, pa, epi, pos, raw)
        set_all(b, pb, epi, pos, raw * 1000.0 + 1.0)  # the same order
    for _ in range(5):
        x, y = a.get_batch(64, pa), b.get_batch(64, pb)
        np.testing.assert_array_equal(x.pick_pos, y.pick_pos)
        np.testing.assert_array_equal(x.weight, y.weight)


# --------------------------------------------------------------------------
# uniform
# --------------------------------------------------------------------------


def test_uniform_frequencies(impl):
    buf = make_buffer(impl, episodes=8, steps=5)
    ps = buf.new_pick_selector(Uniform)
    epi, pos = picks_of(buf)
    N = len(epi)
    assert N == buf.num_picks == 40
    counts, weights = draw_counts(buf, ps, epi, pos)
    assert counts.sum() == DRAWS
    assert_matches(counts, np.full(N, 1.0 / N), "uniform")
    np.testing.assert_array_equal(weights, 1.0)


def test_uniform_over_episodes_of_many_lengths(impl):
    """Episodes of 1 to 600 picks, one still open and growing between
    draws, after a removal (its picks swapped out of the table): every pick
    equally likely, so each episode drawn in proportion to its picks, and
    each position of the longest episode alike."""
    rng = np.random.default_rng(3)
    buf = impl(state_shape=(2,), capacity=2_000, pick_len=1, seed=9)
    ps = buf.new_pick_selector(Uniform)
    for steps in [600, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 90, 70]:
        add_episode(buf, steps)
    buf.remove_episode(buf._handles()[3])
    h = None
    for i in range(40):  # an open episode, grown between draws
        h = buf.record(h, rng.random(2).astype(np.float32), 0, 0.0)
        if i % 10 == 0:
            buf.get_batch(8, ps)
    buf._check()
    epi, pos = picks_of(buf)
    N = len(epi)
    counts, _ = draw_counts(buf, ps, epi, pos)
    handles, first = np.unique(epi, return_index=True)
    per_episode = np.add.reduceat(counts, first)
    sizes = np.diff(np.append(first, N))
    assert_matches(per_episode, sizes / N, "uniform by episode")
    longest = np.flatnonzero(epi == handles[np.argmax(sizes)])
    assert_matches(counts[longest], np.full(len(longest), 1.0 / len(longest)), "uniform within one")


# --------------------------------------------------------------------------
# prioritized
# --------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_prioritized_frequencies(impl, alpha):
    buf = make_buffer(impl, episodes=3, steps=5)
    ps = buf.new_pick_selector(Prioritized, alpha=alpha, beta=0.4)
    epi, pos = picks_of(buf)
    raw = PRIORITIES[: len(epi)]
    set_all(buf, ps, epi, pos, raw)
    counts, _ = draw_counts(buf, ps, epi, pos)
    assert_matches(counts, expected_probabilities(raw, alpha), f"alpha={alpha}")


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_prioritized_recorded_priorities(impl, alpha):
    """Priorities given at record time, zeros included, select alike."""
    buf = impl(state_shape=(2,), capacity=None, pick_len=1, seed=99)
    ps = buf.new_pick_selector(Prioritized, alpha=alpha)
    raw = PRIORITIES
    add_episode(buf, 8, priorities=raw[:8])
    add_episode(buf, 7, priorities=raw[8:])
    epi, pos = picks_of(buf)
    assert len(epi) == len(raw)  # sorted by (epi, pos): the order recorded
    counts, _ = draw_counts(buf, ps, epi, pos)
    assert_matches(counts, expected_probabilities(raw, alpha), f"recorded, alpha={alpha}")


@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_importance_weights(impl, alpha, beta):
    buf = make_buffer(impl, episodes=3, steps=5, seed=7)
    ps = buf.new_pick_selector(Prioritized, alpha=alpha, beta=beta)
    epi, pos = picks_of(buf)
    raw = PRIORITIES[: len(epi)]
    set_all(buf, ps, epi, pos, raw)
    # Enough draws that every pick of positive priority shows up.
    _, weights = draw_counts(buf, ps, epi, pos, draws=40_000)
    want = expected_weights(raw, alpha, beta)
    positive = np.asarray(raw) > 0
    assert np.isnan(weights[~positive]).all()  # never drawn
    assert not np.isnan(weights[positive]).any(), "a pick of positive priority never drawn"
    np.testing.assert_allclose(weights[positive], want[positive], rtol=1e-5)
    assert weights[positive].max() == pytest.approx(1.0, rel=1e-6)
    # beta is settable: the weights follow at once.
    ps.beta = 1.0 - beta
    _, weights = draw_counts(buf, ps, epi, pos, draws=40_000)
    want = expected_weights(raw, alpha, 1.0 - beta)
    np.testing.assert_allclose(weights[positive], want[positive], rtol=1e-5)


def test_weights_follow_smallest_positive_priority(impl):
    """The normalising maximum is over every pick held with p > 0 (not only
    over the batch), so it follows the smallest positive priority."""
    buf = make_buffer(impl, episodes=2, steps=5, seed=3)
    ps = buf.new_pick_selector(Prioritized, alpha=1.0, beta=1.0)
    epi, pos = picks_of(buf)
    raw = np.array([5.0] * len(epi))
    raw[3] = 0.0
    raw[7] = 1e-3  # drawn with probability ~2e-5
    set_all(buf, ps, epi, pos, raw)
    b = buf.get_batch(64, ps)
    # w = (min positive / p_i) ** beta = 1e-3 / 5 for every pick of 5.0.
    five = ~((b.pick_epi == epi[7]) & (b.pick_pos == pos[7]))
    assert five.sum() > 0
    np.testing.assert_allclose(b.weight[five], 2e-4, rtol=1e-5)
    # Once the smallest positive priority is gone, the maximum follows the next.
    set_all(buf, ps, epi[7:8], pos[7:8], [0.0])
    b = buf.get_batch(64, ps)
    np.testing.assert_allclose(b.weight, 1.0, rtol=1e-6)


def test_all_zero_priorities(impl):
    buf = make_buffer(impl, episodes=2, steps=3)
    ps = buf.new_pick_selector(Prioritized, alpha=0.5)
    epi, pos = picks_of(buf)
    set_all(buf, ps, epi, pos, np.zeros(len(epi)))
    with pytest.raises(ValueError):
        buf.get_batch(4, ps)
    set_all(buf, ps, epi[2:3], pos[2:3], [0.25])
    b = buf.get_batch(1000, ps)
    assert (b.pick_epi == epi[2]).all() and (b.pick_pos == pos[2]).all()
    np.testing.assert_array_equal(b.weight, 1.0)


# --------------------------------------------------------------------------
# after set_priority and after evictions
# --------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.5, 1.0])
def test_after_set_priority(impl, alpha):
    buf = make_buffer(impl, episodes=3, steps=5, seed=11)
    ps = buf.new_pick_selector(Prioritized, alpha=alpha, beta=0.7)
    epi, pos = picks_of(buf)
    raw = np.array(PRIORITIES[: len(epi)])
    set_all(buf, ps, epi, pos, raw)
    buf.get_batch(1000, ps)
    # Zero some, revive zeros, raise one a lot, lower others; with
    # duplicates in one call (the last value wins).
    rng = np.random.default_rng(5)
    k = rng.permutation(len(epi))[:8]
    new = np.array([0.0, 4.0, 0.02, 50.0, 0.0, 1.5, 9.0, 0.4])
    raw[k] = new
    e = np.concatenate([epi[k[:2]], epi[k]])
    p = np.concatenate([pos[k[:2]], pos[k]])
    v = np.concatenate([[123.0, 0.0], new])
    assert buf.set_priority(ps, e, p, v) == len(e)
    counts, weights = draw_counts(buf, ps, epi, pos)
    assert_matches(counts, expected_probabilities(raw, alpha), "after set_priority")
    drawn = counts > 0
    np.testing.assert_allclose(
        weights[drawn], expected_weights(raw, alpha, 0.7)[drawn], rtol=1e-5
    )


@pytest.mark.parametrize("eviction", ["fifo", "second_chance"])
@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_after_evictions(impl, kind, eviction):
    """Evictions swap-remove picks from the middle of the pick table; the
    selection must still follow the priorities of the picks that remain."""
    rng = np.random.default_rng(17)
    buf = impl(state_shape=(2,), capacity=40, pick_len=1, eviction=eviction, seed=21)
    params = {"alpha": 0.8, "beta": 0.5} if kind == Prioritized else {}
    ps = buf.new_pick_selector(kind, **params)
    prio = {}  # (epi, pos) -> raw priority
    for i in range(30):
        steps = int(rng.integers(1, 9))
        raw = rng.choice([0.0, 0.1, 0.5, 1.0, 2.0, 6.0], size=steps)
        h = add_episode(buf, steps, priorities=raw)
        for t in range(steps):
            prio[(h, t)] = raw[t]
        if i % 3 == 2:  # mark some episodes sampled (second chance)
            positive = kind == Uniform or any(
                prio[(e, p)] > 0 for e, p in zip(*map(np.ndarray.tolist, buf._picks()))
            )
            if buf.num_picks and positive:
                buf.get_batch(4, ps)
        if i == 20 and kind == Prioritized:  # and update some priorities
            epi, pos = picks_of(buf)
            new = rng.choice([0.0, 0.3, 3.0], size=len(epi))
            set_all(buf, ps, epi, pos, new)
            prio.update({(e, p): v for e, p, v in zip(epi.tolist(), pos.tolist(), new)})
    assert buf.num_episodes < 30  # evictions happened
    buf._check()
    epi, pos = picks_of(buf)
    raw = np.array([prio[(e, p)] for e, p in zip(epi.tolist(), pos.tolist())])
    if kind == Prioritized:
        np.testing.assert_allclose(
            buf._priority(ps, epi, pos), np.where(raw > 0, raw**0.8, 0.0), rtol=1e-6
        )
        P = expected_probabilities(raw, 0.8)
    else:
        P = np.full(len(epi), 1.0 / len(epi))
    counts, weights = draw_counts(buf, ps, epi, pos)
    assert_matches(counts, P, f"after evictions ({eviction})")
    drawn = counts > 0
    if kind == Prioritized:
        np.testing.assert_allclose(
            weights[drawn], expected_weights(raw, 0.8, 0.5)[drawn], rtol=1e-5
        )
    else:
        np.testing.assert_array_equal(weights[drawn], 1.0)


def test_after_removing_a_selector(impl):
    """Removing one selector leaves the others' priorities and draws alone."""
    buf = make_buffer(impl, episodes=3, steps=5, seed=8)
    a = buf.new_pick_selector(Prioritized, alpha=1.0)
    b = buf.new_pick_selector(Prioritized, alpha=0.5)
    epi, pos = picks_of(buf)
    raw = np.array(PRIORITIES[: len(epi)])
    set_all(buf, a, epi, pos, raw[::-1])
    set_all(buf, b, epi, pos, raw)
    buf.remove_pick_selector(a)
    counts, _ = draw_counts(buf, b, epi, pos)
    assert_matches(counts, expected_probabilities(raw, 0.5), "after removing a selector")


# --------------------------------------------------------------------------
# seeds and generators
# --------------------------------------------------------------------------


def _batches(buf, ps, n=5, size=64):
    return [buf.get_batch(size, ps) for _ in range(n)]


def _same(b1, b2):
    return all(np.array_equal(x, y) for x, y in zip((*b1, b1.weight), (*b2, b2.weight)))


@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_same_seed_same_batches(impl, kind):
    def build(seed):
        buf = make_buffer(impl, episodes=5, steps=6, seed=seed)
        ps = buf.new_pick_selector(kind)
        if kind == Prioritized:
            epi, pos = picks_of(buf)
            set_all(buf, ps, epi, pos, np.linspace(0.0, 3.0, len(epi)))
        return buf, ps

    (b1, p1), (b2, p2), (b3, p3) = build(42), build(42), build(43)
    s1, s2, s3 = _batches(b1, p1), _batches(b2, p2), _batches(b3, p3)
    assert all(_same(x, y) for x, y in zip(s1, s2))
    assert not all(np.array_equal(x.pick_epi * 100 + x.pick_pos, y.pick_epi * 100 + y.pick_pos)
                   for x, y in zip(s1, s3))


@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_selectors_draw_independently(impl, kind):
    def build():
        buf = make_buffer(impl, episodes=5, steps=6, seed=5)
        a = buf.new_pick_selector(kind)
        b = buf.new_pick_selector(kind)
        return buf, a, b

    def keys(batches):
        return np.concatenate([x.pick_epi * 100 + x.pick_pos for x in batches])

    buf, a, b = build()
    ka, kb = keys(_batches(buf, a)), keys(_batches(buf, b))
    # Two selectors of one buffer with the same parameters: different sequences.
    assert not np.array_equal(ka, kb)
    # Each has a generator of its own: drawing from one does not move the other.
    buf2, a2, b2 = build()
    assert np.array_equal(keys(_batches(buf2, b2)), kb)
    assert np.array_equal(keys(_batches(buf2, a2)), ka)
    # And both are uniform/prioritized draws, not copies shifted in time.
    assert not np.array_equal(ka[1:], kb[:-1])


# --------------------------------------------------------------------------
# named fields and extras: the same distribution, every field from its pick
# --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [Uniform, Prioritized])
def test_fields_buffer_draws_the_same_distribution(impl, kind):
    spec = {"img": ((2, 2), "uint8"), "v": ((), "float64")}
    buf = impl(state_spec=spec, extras_spec={"x": ((3,), "int32")}, capacity=None, pick_len=1,
               seed=77)
    for e in range(3):  # 15 picks, one per PRIORITIES entry
        t = np.arange(5) + 10 * e
        buf.record_many(None, {"img": np.repeat(t, 4).reshape(5, 2, 2).astype(np.uint8),
                               "v": t.astype(np.float64)}, t, np.zeros(5), terminated=True,
                        extras={"x": np.repeat(t, 3).reshape(5, 3).astype(np.int32)})
    ps = buf.new_pick_selector(kind, **({"alpha": 1.0, "beta": 0.4} if kind == Prioritized else {}))
    epi, pos = picks_of(buf)
    raw = PRIORITIES[: len(epi)]
    if kind == Prioritized:
        set_all(buf, ps, epi, pos, raw)
    counts, _ = draw_counts(buf, ps, epi, pos)
    P = expected_probabilities(raw, 1.0) if kind == Prioritized else np.full(len(epi), 1 / len(epi))
    assert_matches(counts, P, f"fields {kind}")
    b = buf.get_batch(256, ps)
    # every field of a drawn pick comes from that pick's step
    step = b.pick_epi * 10 + b.pick_pos
    np.testing.assert_array_equal(b.state["v"][:, 0], step)
    np.testing.assert_array_equal(b.state["img"][:, 0, 1, 1], step)
    np.testing.assert_array_equal(b.extras["x"][:, 0, 2], step)
    np.testing.assert_array_equal(b.action[:, 0], step)
