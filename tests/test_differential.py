"""Differential tests: the C buffer against the pure-Python reference.

Hypothesis state machines (``hypothesis.stateful``) drive
``exreplay.ExperienceReplay`` and ``exreplay.reference.ReferenceReplay`` with
the same operations and compare the two after every step (docs/semantics.md
is the definition both are held to; the test hooks ``_handles``, ``_picks``,
``_gather``, ``_priority`` and ``_check`` are described there).

The generators of the two implementations differ, so ``get_batch`` runs on
the C buffer only; the reference then builds the same batch with
``_gather(ps, pick_epi, pick_pos)`` from the picks the C buffer chose, which
also marks those episodes as sampled and keeps second-chance eviction of the
two in step.

One machine per configuration (pick_len, allow_short, capacity, eviction,
state and action shapes and dtypes, named state fields and per-step extras),
plus one that draws its configuration.
``EXREPLAY_ASAN=1`` runs fewer examples (AddressSanitizer is ~5x slower).
"""

import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import exreplay
from exreplay.reference import PickSelectorClass, ReferenceReplay

Uniform = PickSelectorClass.Uniform
Prioritized = PickSelectorClass.Prioritized
Rank = PickSelectorClass.Rank
# selectors that keep a priority per pick
PRIORITIZED = (Prioritized, Rank)

ASAN = os.environ.get("EXREPLAY_ASAN") == "1"

# Per machine class; there are 12 of them.  EXREPLAY_DIFF_EXAMPLES=n runs n
# examples per machine instead (a longer soak).
MAX_EXAMPLES = int(os.environ.get("EXREPLAY_DIFF_EXAMPLES", 8 if ASAN else 45))
STEP_COUNT = 30 if ASAN else 50

SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    stateful_step_count=STEP_COUNT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

BATCH_FIELDS = (
    "state",
    "action",
    "reward",
    "state_next",
    "seq_len",
    "seq_len_next",
    "pick_epi",
    "pick_pos",
)

# --------------------------------------------------------------------------
# strategies
# --------------------------------------------------------------------------

# Priorities: a mix of round values, zeros (never drawn), tiny ones (whose
# p ** alpha underflows float32 to 0 for alpha 1.7) and arbitrary floats.
# Two ranges where the C buffer is known to differ are tested apart below:
# p ** alpha beyond float32's range (test_saturation) and ratios of leaves
# that fall into float32's subnormal range (test_weight_subnormal_ratio).
priorities = st.one_of(
    st.sampled_from([0.0, 0.0, 0.5, 1.0, 2.0, 3.75, 10.0, 1e-3, 1e-30, 1e6]),
    st.floats(min_value=1e-10, max_value=1e4, allow_nan=False, allow_infinity=False),
)
opt_priority = st.one_of(st.none(), priorities)
alphas = st.sampled_from([0.0, 0.3, 0.6, 1.0, 1.7])
betas = st.sampled_from([0.0, 0.4, 1.0, 2.5])
seeds = st.integers(0, 2**32 - 1)


def _values(rng, shape, dtype):
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        # Few distinct values so that equal states are common; exactly
        # representable, so casts cannot differ.
        return (rng.integers(-64, 64, size=shape) / 4).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 256, size=shape).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def _items(x, name):
    """(name, array) pairs of an array or of a dict of named fields."""
    if isinstance(x, dict):
        return [(f"{name}[{k!r}]", v) for k, v in sorted(x.items())]
    return [(name, x)]


def assert_same_arrays(a, b, name, where):
    """a and b: arrays, or dicts of arrays with the same names."""
    assert isinstance(a, dict) == isinstance(b, dict), f"{where}: {name} {type(a)} vs {type(b)}"
    if isinstance(a, dict):
        assert list(a) == list(b), f"{where}: {name} fields {list(a)} != {list(b)}"
    for (n, x), (_, y) in zip(_items(a, name), _items(b, name)):
        assert x.shape == y.shape, f"{where}: {n} shape {x.shape} != {y.shape}"
        assert x.dtype == y.dtype, f"{where}: {n} dtype {x.dtype} != {y.dtype}"
        np.testing.assert_array_equal(x, y, err_msg=f"{where}: {n}")


def _as_bytes(x):
    if x is None:
        return None
    if isinstance(x, dict):
        return tuple((k, v.tobytes()) for k, v in x.items())
    return x.tobytes()


def assert_batches_equal(cb, rb, where):
    for name in BATCH_FIELDS:
        assert_same_arrays(getattr(cb, name), getattr(rb, name), name, where)
    assert_same_arrays(cb.extras, rb.extras, "extras", where)
    assert cb.weight.dtype == rb.weight.dtype == np.float32, where
    np.testing.assert_allclose(cb.weight, rb.weight, rtol=1e-6, err_msg=f"{where}: weight")


def snapshot(buf, selectors):
    """Everything observable about a buffer's contents (for 'unchanged')."""
    handles = buf._handles()
    eps = []
    for h in handles:
        e = buf.episode(h)
        eps.append(
            (
                h,
                _as_bytes(e.state),
                e.action.tobytes(),
                e.reward.tobytes(),
                _as_bytes(e.final_state),
                _as_bytes(e.extras),
                bool(e.ended),
                bool(e.terminated),
            )
        )
    epi, pos = buf._picks()
    pk = sorted(zip(epi.tolist(), pos.tolist()))
    prios = []
    for ps, kind in selectors:
        if kind in PRIORITIZED and pk:
            e = np.array([p[0] for p in pk], np.int64)
            q = np.array([p[1] for p in pk], np.int64)
            prios.append(buf._priority(ps, e, q).tolist())
        if kind in PRIORITIZED:
            prios.append(float(ps.beta))
    return (len(buf), buf.num_episodes, buf.num_picks, handles, eps, pk, prios)


# --------------------------------------------------------------------------
# the machine
# --------------------------------------------------------------------------


class DifferentialMachine(RuleBasedStateMachine):
    """Drive the C buffer and the reference in lock step."""

    # The configuration; subclasses override it (or CONFIG = None to draw it).
    CONFIG = dict(
        state_shape=(2,),
        state_dtype="float32",
        action_shape=(),
        action_dtype="int64",
        capacity=30,
        pick_len=3,
        allow_short=False,
        eviction="fifo",
    )

    def __init__(self):
        super().__init__()
        self.c = None
        self.r = None

    # -- setup -----------------------------------------------------------

    def _setup(self, config, seed, first=()):
        self.config = dict(config)
        self.c = exreplay.ExperienceReplay(**self.config, seed=seed)
        self.r = ReferenceReplay(**self.config, seed=seed)
        self.seen = []  # every episode handle either returned
        self.sels = []  # live selectors: (c_ps, r_ps, kind)
        self.removed = []  # removed selector handles
        self.sspec = self.config.get("state_spec")
        self.xspec = self.config.get("extras_spec")
        self.state_shape = None if self.sspec else tuple(self.config["state_shape"])
        self.action_shape = tuple(self.config["action_shape"])
        for kind, alpha, beta in first:
            self.new_pick_selector(kind, alpha, beta, as_int=False)

    # Most examples start with a selector or two, so that get_batch and
    # set_priority run from the first step (new_pick_selector adds more
    # later, when picks already exist).
    first_selectors = st.lists(
        st.tuples(st.sampled_from([Uniform, Prioritized, Rank]), alphas, betas), max_size=2
    )

    @initialize(seed=seeds, first=first_selectors)
    def init(self, seed, first):
        cfg = self.CONFIG
        if cfg is None:  # the drawing subclass sets itself up in init_random
            return
        self._setup(cfg, seed, first)

    # -- helpers ---------------------------------------------------------

    def _state(self, rng, T=None):
        if self.sspec:
            return self._fields(rng, self.sspec, T)
        shape = self.state_shape if T is None else (T, *self.state_shape)
        return _values(rng, shape, self.config["state_dtype"])

    def _fields(self, rng, spec, T=None):
        lead = () if T is None else (T,)
        return {k: _values(rng, (*lead, *shape), dt) for k, (shape, dt) in spec.items()}

    def _extras_kw(self, rng, T=None):
        """{"extras": ...} for a buffer with an extras_spec, else {}."""
        return {"extras": self._fields(rng, self.xspec, T)} if self.xspec else {}

    def _reshaped(self, s, make):
        """s with its (first field's) array replaced by make(array)."""
        if isinstance(s, dict):
            k = next(iter(s))
            return {**s, k: make(s[k])}
        return make(s)

    def _action(self, rng, T=None):
        shape = self.action_shape if T is None else (T, *self.action_shape)
        return _values(rng, shape, self.config["action_dtype"])

    def _draw_handle(self, data):
        """A live, ended/evicted, unknown or None handle."""
        live = self.r._handles()
        kind = data.draw(st.sampled_from(["live", "live", "seen", "unknown", "none"]))
        if kind == "live" and live:
            return data.draw(st.sampled_from(live))
        if kind == "seen" and self.seen:
            return data.draw(st.sampled_from(self.seen))
        if kind == "unknown":
            return data.draw(st.sampled_from([-1, -(2**62), 10**6, 2**62]))
        return None

    def _draw_selector(self, data):
        return data.draw(st.sampled_from(self.sels))

    def _selector_arg(self, data, c_ps, r_ps):
        """The selector object or its int handle (both styles work)."""
        if data.draw(st.booleans()):
            return c_ps, r_ps
        return int(c_ps), int(r_ps)

    def _all_picks(self):
        epi, pos = self.r._picks()
        return sorted(zip(epi.tolist(), pos.tolist()))

    def _snapshots(self):
        cs = [(c, k) for c, _, k in self.sels]
        rs = [(r, k) for _, r, k in self.sels]
        return snapshot(self.c, cs), snapshot(self.r, rs)

    def _same_error(self, what, fc, fr):
        """fc() on the C buffer, fr() on the reference: both must raise the
        same exception type and leave their buffer exactly as it was."""
        before_c, before_r = self._snapshots()
        errs = []
        for f in (fc, fr):
            try:
                f()
            except Exception as e:  # noqa: BLE001
                errs.append(e)
            else:
                errs.append(None)
        ec, er = errs
        assert ec is not None and er is not None, (
            f"{what}: expected both to raise, C raised {ec!r}, reference raised {er!r}"
        )
        assert type(ec) is type(er), (
            f"{what}: C raised {type(ec).__name__}({ec}), "
            f"reference raised {type(er).__name__}({er})"
        )
        after_c, after_r = self._snapshots()
        assert after_c == before_c, f"{what}: the C buffer changed after {ec!r}"
        assert after_r == before_r, f"{what}: the reference changed after {er!r}"
        return ec

    # -- rules: episodes and records -------------------------------------

    @precondition(lambda self: self.c is not None)
    @rule()
    def new_episode(self):
        hc = self.c.new_episode()
        hr = self.r.new_episode()
        assert hc == hr
        self.seen.append(hr)

    @precondition(lambda self: self.c is not None)
    @rule(
        data=st.data(),
        seed=seeds,
        priority=opt_priority,
        end=st.sampled_from(["open", "open", "final", "final_term", "term"]),
    )
    def record(self, data, seed, priority, end):
        h = self._draw_handle(data)
        rng = np.random.default_rng(seed)
        s = self._state(rng)
        a = self._action(rng)
        rew = float(rng.integers(-8, 8)) / 2
        kw = {}
        if priority is not None:
            kw["priority"] = priority
        if end in ("final", "final_term"):
            kw["final_state"] = self._state(rng)
        if end in ("final_term", "term"):
            kw["terminated"] = True
        kw.update(self._extras_kw(rng))
        hc = self.c.record(h, s, a, rew, **kw)
        hr = self.r.record(h, s, a, rew, **kw)
        assert hc == hr, f"record({h}): C returned {hc}, reference {hr}"
        if hr not in self.seen:
            self.seen.append(hr)

    @precondition(lambda self: self.c is not None)
    @rule(
        data=st.data(),
        seed=seeds,
        # now and then longer than the capacity: the rollout evicts its own
        # episode and goes on in new ones
        T=st.one_of(st.integers(1, 8), st.integers(1, 8), st.integers(9, 130)),
        with_prios=st.booleans(),
        end=st.sampled_from(["open", "open", "final", "final_term", "term"]),
        as_lists=st.booleans(),
    )
    def record_many(self, data, seed, T, with_prios, end, as_lists):
        h = self._draw_handle(data)
        rng = np.random.default_rng(seed)
        states = self._state(rng, T)
        actions = self._action(rng, T)
        rewards = (rng.integers(-8, 8, size=T) / 2).astype(np.float32)
        kw = {}
        if with_prios:
            kw["priorities"] = data.draw(st.lists(priorities, min_size=T, max_size=T))
            if not as_lists:
                kw["priorities"] = np.array(kw["priorities"], dtype=np.float64)
        if end in ("final", "final_term"):
            kw["final_state"] = self._state(rng)
        if end in ("final_term", "term"):
            kw["terminated"] = True
        kw.update(self._extras_kw(rng, T))
        if as_lists:
            tl = lambda x: {k: v.tolist() for k, v in x.items()} if isinstance(x, dict) else x.tolist()  # noqa: E731
            states, actions, rewards = tl(states), actions.tolist(), rewards.tolist()
            if "extras" in kw:
                kw["extras"] = tl(kw["extras"])
        hc = self.c.record_many(h, states, actions, rewards, **kw)
        hr = self.r.record_many(h, states, actions, rewards, **kw)
        assert hc == hr, f"record_many({h}, T={T}): C returned {hc}, reference {hr}"
        if hr not in self.seen:
            self.seen.append(hr)

    @precondition(lambda self: self.c is not None)
    @rule(
        data=st.data(),
        seed=seeds,
        end=st.sampled_from(["final", "final_term", "term", "term", "neither"]),
    )
    def end_episode(self, data, seed, end):
        # mostly an open episode with steps, else any handle _draw_handle
        # gives (live, ended, evicted, removed, unknown or None)
        open_ = [h for h in self.r._handles()
                 if not self.r.episode(h).ended and len(self.r.episode(h).reward)]
        if open_ and data.draw(st.integers(0, 2)):
            h = data.draw(st.sampled_from(open_))
        else:
            h = self._draw_handle(data)
        rng = np.random.default_rng(seed)
        kw = {}
        if end in ("final", "final_term"):
            kw["final_state"] = self._state(rng)
        if end in ("final_term", "term"):
            kw["terminated"] = True
        before_c, before_r = self._snapshots()
        try:
            rr = self.r.end_episode(h, **kw)
        except (TypeError, ValueError) as er:
            # refused: the C buffer refuses the same way, and neither changed
            with pytest.raises(type(er)):
                self.c.end_episode(h, **kw)
            assert self._snapshots() == (before_c, before_r), f"end_episode({h}) changed a buffer"
            return
        rc = self.c.end_episode(h, **kw)
        assert rc is rr, f"end_episode({h}): C returned {rc}, reference {rr}"

    # -- rules: selectors --------------------------------------------------

    @precondition(lambda self: self.c is not None and len(self.sels) < 5)
    @rule(
        kind=st.sampled_from([Uniform, Prioritized, Prioritized, Rank]),
        alpha=st.one_of(st.none(), alphas),
        beta=st.one_of(st.none(), betas),
        as_int=st.booleans(),
    )
    def new_pick_selector(self, kind, alpha, beta, as_int):
        params = {}
        if kind in PRIORITIZED:
            if alpha is not None:
                params["alpha"] = alpha
            if beta is not None:
                params["beta"] = beta
        k = int(kind) if as_int else kind
        c_ps = self.c.new_pick_selector(k, **params)
        r_ps = self.r.new_pick_selector(k, **params)
        assert int(c_ps) == int(r_ps), f"selector handles {int(c_ps)} != {int(r_ps)}"
        if kind in PRIORITIZED:
            assert c_ps.alpha == r_ps.alpha and c_ps.beta == r_ps.beta
        self.sels.append((c_ps, r_ps, kind))

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data())
    def remove_pick_selector(self, data):
        i = data.draw(st.integers(0, len(self.sels) - 1))
        c_ps, r_ps, _ = self.sels.pop(i)
        a, b = self._selector_arg(data, c_ps, r_ps)
        self.c.remove_pick_selector(a)
        self.r.remove_pick_selector(b)
        self.removed.append(int(c_ps))

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), listed=st.booleans())
    def pick_selector_again(self, data, listed):
        """A selector's objects replaced by those pick_selector(h) (or
        pick_selectors()) gives for it: equal to the old ones, with the
        same parameters, and the old ones still see what is set through
        the new ones."""
        i = data.draw(st.integers(0, len(self.sels) - 1))
        c_ps, r_ps, kind = self.sels[i]
        a, b = self._selector_arg(data, c_ps, r_ps)
        if listed:
            cn = [p for p in self.c.pick_selectors() if p == int(a)][0]
            rn = [p for p in self.r.pick_selectors() if p == int(b)][0]
        else:
            cn, rn = self.c.pick_selector(a), self.r.pick_selector(b)
        assert cn == c_ps and rn == r_ps and int(cn) == int(rn)
        assert cn.kind == rn.kind == kind
        assert (cn.alpha, cn.beta) == (rn.alpha, rn.beta) == (c_ps.alpha, c_ps.beta)
        if kind in PRIORITIZED:
            beta = data.draw(betas)
            cn.beta = beta
            rn.beta = beta
            assert c_ps.beta == r_ps.beta == beta
        self.sels[i] = (cn, rn, kind)

    @precondition(
        lambda self: self.c is not None and any(k in PRIORITIZED for _, _, k in self.sels)
    )
    @rule(data=st.data(), beta=betas)
    def set_beta(self, data, beta):
        pri = [s for s in self.sels if s[2] in PRIORITIZED]
        c_ps, r_ps, _ = data.draw(st.sampled_from(pri))
        c_ps.beta = beta
        r_ps.beta = beta
        assert c_ps.beta == r_ps.beta == beta

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), n=st.integers(0, 10), scalar=st.booleans())
    def set_priority(self, data, n, scalar):
        c_ps, r_ps, _ = self._draw_selector(data)
        existing = self._all_picks()
        missing = [(-1, 0), (10**6, 0), (0, -1), (0, 10**6)]
        missing += [(h, 0) for h in self.seen[-3:]]  # some of these no longer exist
        missing += [(e, p + 7) for e, p in existing[:2]]
        pool = existing + missing
        chosen = data.draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
        epi = np.array([e for e, _ in chosen], np.int64)
        pos = np.array([p for _, p in chosen], np.int64)
        if scalar:
            pr = data.draw(priorities)
        else:
            pr = np.array(data.draw(st.lists(priorities, min_size=n, max_size=n)), np.float64)
        a, b = self._selector_arg(data, c_ps, r_ps)
        nc = self.c.set_priority(a, epi, pos, pr)
        nr = self.r.set_priority(b, epi, pos, pr)
        assert nc == nr, f"set_priority applied {nc} in C, {nr} in the reference"

    # -- rules: batches ----------------------------------------------------

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), B=st.integers(1, 12), use_out=st.booleans())
    def get_batch(self, data, B, use_out):
        c_ps, r_ps, kind = self._draw_selector(data)
        a, b = self._selector_arg(data, c_ps, r_ps)
        if self.r.num_picks == 0:
            self._same_error(
                "get_batch with no picks",
                lambda: self.c.get_batch(B, a),
                lambda: self.r.get_batch(B, b),
            )
            return
        if kind == Prioritized:
            epi, pos = self.r._picks()
            if not (self.r._priority(b, epi, pos) > 0).any():
                self._same_error(
                    "get_batch with every priority 0",
                    lambda: self.c.get_batch(B, a),
                    lambda: self.r.get_batch(B, b),
                )
                return
        if use_out:
            # The first batch (which provides `out`) marks its episodes as
            # sampled too: the reference gathers it as well.
            out = self.c.get_batch(B, a)
            assert_batches_equal(out, self.r._gather(b, out.pick_epi, out.pick_pos), "first")
            cb = self.c.get_batch(B, a, out=out)
            assert cb is out
        else:
            cb = self.c.get_batch(B, a)
        assert cb.pick_epi.shape == (B,)
        if kind == Prioritized:
            drawn = self.c._priority(a, cb.pick_epi, cb.pick_pos)
            assert (drawn > 0).all(), "C drew a pick of priority 0"
        rb = self.r._gather(b, cb.pick_epi, cb.pick_pos)
        assert_batches_equal(cb, rb, f"get_batch({B}, {int(a)})")

    # Hypothesis spreads its choices over rules, not over what they do:
    # batches are what this file is about, so they get two more entries.
    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), B=st.integers(1, 12), use_out=st.booleans())
    def get_batch_again(self, data, B, use_out):
        self.get_batch(data, B, use_out)

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), B=st.integers(1, 12))
    def get_batch_then_set_priority(self, data, B):
        """The learner's loop: draw, then update the priorities just drawn."""
        c_ps, r_ps, kind = self._draw_selector(data)
        if self.r.num_picks == 0:
            return
        if kind == Prioritized:
            epi, pos = self.r._picks()
            if not (self.r._priority(r_ps, epi, pos) > 0).any():
                return
        cb = self.c.get_batch(B, c_ps)
        rb = self.r._gather(r_ps, cb.pick_epi, cb.pick_pos)
        assert_batches_equal(cb, rb, f"get_batch({B}, {int(c_ps)})")
        pr = np.array(data.draw(st.lists(priorities, min_size=B, max_size=B)), np.float64)
        nc = self.c.set_priority(c_ps, cb.pick_epi, cb.pick_pos, pr)
        nr = self.r.set_priority(r_ps, rb.pick_epi, rb.pick_pos, pr)
        assert nc == nr == (B if kind in PRIORITIZED else 0), (nc, nr)

    @precondition(lambda self: self.c is not None and self.sels)
    @rule(data=st.data(), n=st.integers(1, 8))
    def gather(self, data, n):
        c_ps, r_ps, _ = self._draw_selector(data)
        existing = self._all_picks()
        if not existing:
            return  # an empty _gather is test_gather_empty below
        chosen = data.draw(st.lists(st.sampled_from(existing), min_size=n, max_size=n))
        epi = np.array([e for e, _ in chosen], np.int64)
        pos = np.array([p for _, p in chosen], np.int64)
        a, b = self._selector_arg(data, c_ps, r_ps)
        cb = self.c._gather(a, epi, pos)
        rb = self.r._gather(b, epi, pos)
        assert_batches_equal(cb, rb, f"_gather({chosen})")

    @precondition(lambda self: self.c is not None)
    @rule(data=st.data())
    def remove_episode(self, data):
        h = self._draw_handle(data)
        if h is not None and h in self.r._handles():
            self.c.remove_episode(h)
            self.r.remove_episode(h)
        else:  # evicted, removed, never created, or None
            self._same_error("remove_episode(%r)" % (h,), lambda: self.c.remove_episode(h),
                             lambda: self.r.remove_episode(h))

    @precondition(lambda self: self.c is not None)
    @rule(data=st.data())
    def compare_episode(self, data):
        live = self.r._handles()
        if not live:
            return
        h = data.draw(st.sampled_from(live))
        ec = self.c.episode(h)
        er = self.r.episode(h)
        for name in ("state", "action", "reward", "extras"):
            x, y = getattr(ec, name), getattr(er, name)
            assert_same_arrays(x, y, name, f"episode({h})")
        assert (ec.final_state is None) == (er.final_state is None)
        if er.final_state is not None:
            assert_same_arrays(ec.final_state, er.final_state, "final_state", f"episode({h})")
        assert bool(ec.ended) == bool(er.ended)
        assert bool(ec.terminated) == bool(er.terminated)

    # -- rules: errors -----------------------------------------------------

    @precondition(lambda self: self.c is not None)
    @rule(
        data=st.data(),
        which=st.sampled_from(
            [
                "negative_priority",
                "nan_priority",
                "inf_priority",
                "state_shape",
                "action_shape",
                "float_into_int_action",
                "final_state_shape",
                "end_final_state_shape",
                "end_neither",
                "many_T0",
                "many_actions_T",
                "many_rewards_T",
                "many_negative_priority",
                "many_priorities_len",
                "set_priority_negative",
                "set_priority_nan",
                "set_priority_len",
                "set_priority_unknown_sel",
                "get_batch_unknown_sel",
                "get_batch_size0",
                "gather_missing",
                "gather_unknown_sel",
                "new_sel_negative_alpha",
                "new_sel_unknown_param",
                "new_sel_uniform_param",
                "new_sel_bad_kind",
                "remove_unknown_sel",
                "pick_selector_unknown",
                "pick_selector_type",
                "beta_negative",
                "handle_type",
                "priority_list",
                "complex_state",
                "get_batch_bad_out",
                "state_missing_field",
                "state_unknown_field",
                "state_not_a_dict",
                "extras_missing",
                "extras_unknown_field",
                "extras_shape",
                "extras_dtype",
                "many_extras_T",
            ]
        ),
        seed=seeds,
    )
    def bad_input(self, data, which, seed):
        c, r = self.c, self.r
        rng = np.random.default_rng(seed)
        h = self._draw_handle(data)
        s = self._state(rng)
        act = self._action(rng)
        S = self._state(rng, 3)
        A = self._action(rng, 3)
        R = np.zeros(3, np.float32)
        X = self._extras_kw(rng)  # what a valid record takes as extras=
        XS = self._extras_kw(rng, 3)
        live_sel = self.sels[0] if self.sels else None
        unknown_sel = data.draw(
            st.sampled_from(self.removed + [99, -1] if self.removed else [99, -1])
        )
        existing = self._all_picks()
        epi = np.array([e for e, _ in existing[:3]], np.int64)
        pos = np.array([p for _, p in existing[:3]], np.int64)

        def both(f):
            return lambda: f(c), lambda: f(r)

        if which == "negative_priority":
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, **X, priority=-0.5))
        elif which == "nan_priority":
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, **X, priority=math.nan))
        elif which == "inf_priority":
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, **X, priority=math.inf))
        elif which == "state_shape":
            bad = self._reshaped(s, lambda a: np.zeros((*a.shape, 2), a.dtype))
            fc, fr = both(lambda b: b.record(h, bad, act, 1.0, **X))
        elif which == "action_shape":
            bad = np.zeros((*self.action_shape, 3), act.dtype)
            fc, fr = both(lambda b: b.record(h, s, bad, 1.0, **X))
        elif which == "float_into_int_action":
            if act.dtype.kind == "f":
                bad = np.zeros(self.action_shape, np.complex128)
            else:
                bad = np.full(self.action_shape, 1.5, np.float64)
            fc, fr = both(lambda b: b.record(h, s, bad, 1.0, **X))
        elif which == "final_state_shape":
            bad = self._reshaped(s, lambda a: np.zeros((7,), a.dtype))
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, final_state=bad, terminated=True, **X))
        elif which == "end_final_state_shape":
            bad = self._reshaped(s, lambda a: np.zeros((7,), a.dtype))
            fc, fr = both(lambda b: b.end_episode(h, final_state=bad, terminated=True))
        elif which == "end_neither":
            fc, fr = both(lambda b: b.end_episode(h))
        elif which == "many_T0":
            fc, fr = both(lambda b: b.record_many(h, self._reshaped(S, lambda a: a[:0]), A[:0], R[:0], **self._extras_kw(rng, 0)))
        elif which == "many_actions_T":
            fc, fr = both(lambda b: b.record_many(h, S, A[:2], R, **XS))
        elif which == "many_rewards_T":
            fc, fr = both(lambda b: b.record_many(h, S, A, R[:1], **XS))
        elif which == "many_negative_priority":
            fc, fr = both(lambda b: b.record_many(h, S, A, R, **XS, priorities=[1.0, -1.0, 2.0]))
        elif which == "many_priorities_len":
            fc, fr = both(lambda b: b.record_many(h, S, A, R, **XS, priorities=[1.0, 2.0]))
        elif which.startswith("set_priority") and which != "set_priority_unknown_sel":
            if live_sel is None:
                return
            n = len(epi)
            if which == "set_priority_negative":
                pr = np.full(n + 1, 1.0)
                pr[-1] = -2.0
                e2 = np.append(epi, 0)
                p2 = np.append(pos, 0)
            elif which == "set_priority_nan":
                pr = np.full(n + 1, math.nan)
                e2 = np.append(epi, 0)
                p2 = np.append(pos, 0)
            else:  # length mismatch
                pr = np.ones(n + 2)
                e2, p2 = epi, pos
            fc = lambda: c.set_priority(live_sel[0], e2, p2, pr)  # noqa: E731
            fr = lambda: r.set_priority(live_sel[1], e2, p2, pr)  # noqa: E731
        elif which == "set_priority_unknown_sel":
            fc, fr = both(lambda b: b.set_priority(unknown_sel, epi, pos, np.ones(len(epi))))
        elif which == "get_batch_unknown_sel":
            fc, fr = both(lambda b: b.get_batch(4, unknown_sel))
        elif which == "get_batch_size0":
            if live_sel is None:
                return
            fc = lambda: c.get_batch(0, live_sel[0])  # noqa: E731
            fr = lambda: r.get_batch(0, live_sel[1])  # noqa: E731
        elif which == "gather_missing":
            if live_sel is None:
                return
            e2 = np.append(epi, data.draw(st.sampled_from([-1, 10**6] + self.seen[-2:])))
            p2 = np.append(pos, data.draw(st.sampled_from([0, 50, -1])))
            if (int(e2[-1]), int(p2[-1])) in existing:
                return
            fc = lambda: c._gather(live_sel[0], e2, p2)  # noqa: E731
            fr = lambda: r._gather(live_sel[1], e2, p2)  # noqa: E731
        elif which == "gather_unknown_sel":
            fc, fr = both(lambda b: b._gather(unknown_sel, epi, pos))
        elif which == "new_sel_negative_alpha":
            fc, fr = both(lambda b: b.new_pick_selector(Prioritized, alpha=-0.1))
        elif which == "new_sel_unknown_param":
            fc, fr = both(lambda b: b.new_pick_selector(Prioritized, alpha=0.5, gamma=1.0))
        elif which == "new_sel_uniform_param":
            fc, fr = both(lambda b: b.new_pick_selector(Uniform, alpha=0.5))
        elif which == "new_sel_bad_kind":
            fc, fr = both(lambda b: b.new_pick_selector(7))
        elif which == "remove_unknown_sel":
            fc, fr = both(lambda b: b.remove_pick_selector(unknown_sel))
        elif which == "pick_selector_unknown":
            fc, fr = both(lambda b: b.pick_selector(unknown_sel))
        elif which == "pick_selector_type":
            bad = data.draw(st.sampled_from([1.5, "0", None, True, [0]]))
            fc, fr = both(lambda b: b.pick_selector(bad))
        elif which == "beta_negative":
            pri = [x for x in self.sels if x[2] in PRIORITIZED]
            if not pri:
                return
            cp, rp, _ = pri[0]
            bad = data.draw(st.sampled_from([-0.1, math.nan, math.inf]))

            def fc():
                cp.beta = bad

            def fr():
                rp.beta = bad

        elif which == "handle_type":
            fc, fr = both(lambda b: b.record(1.5, s, act, 1.0, **X))
        elif which == "priority_list":
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, **X, priority=[1.0, 2.0]))
        elif which == "complex_state":
            bad = self._reshaped(s, lambda a: np.zeros(a.shape, np.complex64))
            fc, fr = both(lambda b: b.record(h, bad, act, 1.0, **X))
        elif which == "get_batch_bad_out":
            if live_sel is None or not existing:
                return
            # `out` of batch size 2, asked to hold 3 (made by _gather, which
            # marks the same episodes in both).
            e2, p2 = np.array([existing[0][0]] * 2), np.array([existing[0][1]] * 2)
            out_c = c._gather(live_sel[0], e2, p2)
            out_r = r._gather(live_sel[1], e2, p2)
            fc = lambda: c.get_batch(3, live_sel[0], out=out_c)  # noqa: E731
            fr = lambda: r.get_batch(3, live_sel[1], out=out_r)  # noqa: E731
        elif which == "state_missing_field":
            if not self.sspec:
                return
            bad = dict(list(s.items())[1:])
            fc, fr = both(lambda b: b.record(h, bad, act, 1.0, **X))
        elif which == "state_unknown_field":
            if not self.sspec:
                return
            bad = {**s, "zz": np.zeros(2)}
            fc, fr = both(lambda b: b.record(h, bad, act, 1.0, **X))
        elif which == "state_not_a_dict":
            if not self.sspec:
                return
            bad = next(iter(s.values()))
            fc, fr = both(lambda b: b.record(h, bad, act, 1.0, **X))
        elif which == "extras_missing":
            if self.xspec:
                fc, fr = both(lambda b: b.record(h, s, act, 1.0))
            else:  # extras given to a buffer without an extras_spec
                fc, fr = both(lambda b: b.record(h, s, act, 1.0, extras={"logp": 0.5}))
        elif which == "extras_unknown_field":
            if not self.xspec:
                return
            bad = {**X["extras"], "zz": 1.0}
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, extras=bad))
        elif which in ("extras_shape", "extras_dtype"):
            if not self.xspec:
                return
            if which == "extras_shape":
                bad = self._reshaped(X["extras"], lambda a: np.zeros((*a.shape, 2), a.dtype))
            else:
                bad = self._reshaped(X["extras"], lambda a: np.zeros(a.shape, np.complex64))
            fc, fr = both(lambda b: b.record(h, s, act, 1.0, extras=bad))
        elif which == "many_extras_T":
            if not self.xspec:
                return
            bad = self._reshaped(XS["extras"], lambda a: a[:2])
            fc, fr = both(lambda b: b.record_many(h, S, A, R, extras=bad))
        else:  # pragma: no cover
            raise AssertionError(which)
        self._same_error(which, fc, fr)

    # -- invariants ----------------------------------------------------------

    @invariant()
    def same_state(self):
        if self.c is None:
            return
        c, r = self.c, self.r
        assert len(c) == len(r), f"len: C {len(c)}, reference {len(r)}"
        assert c.num_episodes == r.num_episodes, (
            f"num_episodes: C {c.num_episodes}, reference {r.num_episodes}"
        )
        assert c.num_picks == r.num_picks, f"num_picks: C {c.num_picks}, reference {r.num_picks}"
        hc, hr = c._handles(), r._handles()
        assert hc == hr, f"_handles (eviction choices): C {hc}, reference {hr}"
        sc, sr = c.pick_selectors(), r.pick_selectors()
        want = sorted(int(x) for x, _, _ in self.sels)
        assert [int(x) for x in sc] == [int(x) for x in sr] == want, (
            f"pick_selectors: C {sc}, reference {sr}, live {want}"
        )
        assert [(x.kind, x.alpha, x.beta) for x in sc] == [(x.kind, x.alpha, x.beta) for x in sr]
        ce, cp = c._picks()
        re_, rp = r._picks()
        assert ce.dtype == cp.dtype == np.int64
        pc = sorted(zip(ce.tolist(), cp.tolist()))
        pr = sorted(zip(re_.tolist(), rp.tolist()))
        assert len(pc) == len(set(pc)), "C: duplicate picks"
        assert pc == pr, f"_picks: C {pc}, reference {pr}"
        if pr:
            epi = np.array([e for e, _ in pr], np.int64)
            pos = np.array([p for _, p in pr], np.int64)
            for c_ps, r_ps, kind in self.sels:
                if kind not in PRIORITIZED:
                    continue
                xc = c._priority(c_ps, epi, pos)
                xr = r._priority(r_ps, epi, pos)
                assert xc.dtype == np.float64
                np.testing.assert_allclose(
                    xc, xr, rtol=1e-6, err_msg=f"_priority of selector {int(c_ps)}"
                )
        c._check()
        r._check()


class RandomConfigMachine(DifferentialMachine):
    """Draws its configuration from every combination."""

    CONFIG = None

    @initialize(
        seed=seeds,
        pick_len=st.sampled_from([1, 3, 5]),
        allow_short=st.booleans(),
        capacity=st.one_of(st.none(), st.integers(12, 60)),
        eviction=st.sampled_from(["fifo", "second_chance"]),
        state=st.sampled_from([((2,), "float32"), ((3, 2), "uint8"), "spec", "spec1"]),
        action=st.sampled_from([((), "int64"), ((2,), "float32")]),
        extras=st.sampled_from([None, None, "x1", "x3"]),
        first=DifferentialMachine.first_selectors,
    )
    def init_random(
        self, seed, pick_len, allow_short, capacity, eviction, state, action, extras, first
    ):
        self._setup(
            _config(pick_len, allow_short, capacity, eviction, state, action, extras),
            seed,
            first,
        )


# Named state fields and per-step extras: a mix of widths (1, 2, 4, 8 bytes
# and odd sizes), scalar and shaped fields.
STATE_SPECS = {
    "spec": {"img": ((3, 2), "uint8"), "vec": ((2,), "float32"), "t": ((), "int64")},
    "spec1": {"obs": ((3,), "float64")},
}
EXTRAS_SPECS = {
    "x1": {"logp": ((), "float32")},
    "x3": {"logp": ((), "float32"), "h": ((2, 3), "float32"), "mask": ((3,), "bool")},
}


def _config(pick_len, allow_short, capacity, eviction, state, action, extras=None):
    cfg = dict(
        action_shape=action[0],
        action_dtype=action[1],
        capacity=capacity,
        pick_len=pick_len,
        allow_short=allow_short,
        eviction=eviction,
    )
    if isinstance(state, str):
        cfg["state_spec"] = STATE_SPECS[state]
    else:
        cfg["state_shape"], cfg["state_dtype"] = state
    if extras is not None:
        cfg["extras_spec"] = EXTRAS_SPECS[extras]
    return cfg


F32_2 = ((2,), "float32")
U8_32 = ((3, 2), "uint8")
I64 = ((), "int64")
F32A = ((2,), "float32")

# Hand-picked configurations: every value of every axis appears, small
# capacities evict constantly.
CONFIGS = {
    "L1_fifo_cap12": _config(1, False, 12, "fifo", F32_2, I64),
    "L1_short_sc_cap16_u8": _config(1, True, 16, "second_chance", U8_32, F32A),
    "L3_fifo_cap30": _config(3, False, 30, "fifo", F32_2, F32A),
    "L3_short_sc_cap20": _config(3, True, 20, "second_chance", F32_2, I64),
    "L3_short_unbounded_u8": _config(3, True, None, "fifo", U8_32, I64),
    "L5_sc_cap36_u8": _config(5, False, 36, "second_chance", U8_32, I64),
    "L5_short_fifo_cap12": _config(5, True, 12, "fifo", F32_2, F32A),
    "L5_unbounded_sc": _config(5, False, None, "second_chance", F32_2, I64),
    # named fields and extras
    "L3_fields_extras_sc_cap20": _config(3, True, 20, "second_chance", "spec", I64, "x3"),
    "L1_fields_fifo_cap12": _config(1, False, 12, "fifo", "spec1", F32A),
    "L5_extras_fifo_cap30": _config(5, False, 30, "fifo", U8_32, I64, "x1"),
}


def _machine(name, cfg):
    cls = type(f"Machine_{name}", (DifferentialMachine,), {"CONFIG": cfg})
    cls.TestCase.settings = SETTINGS
    return cls


_machines = {name: _machine(name, cfg) for name, cfg in CONFIGS.items()}
RandomConfigMachine.TestCase.settings = SETTINGS


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_differential(name):
    _machines[name].TestCase().runTest()


def test_differential_random_config():
    RandomConfigMachine.TestCase().runTest()


# --------------------------------------------------------------------------
# disagreements the machines found (now fixed), pinned as small tests
# --------------------------------------------------------------------------


def _pair(**kw):
    cfg = dict(state_shape=(1,), capacity=None, seed=0)
    cfg.update(kw)
    return exreplay.ExperienceReplay(**cfg), ReferenceReplay(**cfg)


@pytest.mark.parametrize(
    "priority, alpha",
    [(3.401e38, 1.0), (3e38, 1.7), (1e39, 1.0), (1e30, 2.0)],
)
def test_saturation(priority, alpha):
    bufs = _pair()
    got = []
    for buf in bufs:
        ps = buf.new_pick_selector(Prioritized, alpha=alpha)
        buf.record(None, [0.0], 0, 0.0, priority=priority, terminated=True)
        buf.record(None, [0.0], 0, 0.0, terminated=True)  # gets the maximum so far
        got.append(buf._priority(ps, [0, 1], [0, 0]))
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)


@pytest.mark.parametrize("priority", [3e38, 3.4e38, 1e39])
def test_saturation_draws(priority):
    """Leaves at the top of float32's range still draw and weigh alike."""
    c, r = _pair()
    cps = c.new_pick_selector(Prioritized, alpha=1.0, beta=1.0)
    rps = r.new_pick_selector(Prioritized, alpha=1.0, beta=1.0)
    for buf in (c, r):
        for i, p in enumerate([priority, priority, 1.0, 0.0, priority]):
            buf.record(None, [float(i)], i, 0.0, priority=p, terminated=True)
    b = c.get_batch(64, cps)
    assert not np.isin(b.pick_epi, [3]).any()
    assert np.isfinite(b.weight).all()
    rb = r._gather(rps, b.pick_epi, b.pick_pos)
    np.testing.assert_array_equal(b.pick_epi, rb.pick_epi)
    np.testing.assert_allclose(b.weight, rb.weight, rtol=1e-6)


def test_gather_empty():
    outcomes = []
    for buf in _pair():
        ps = buf.new_pick_selector(Uniform)
        buf.record(None, [0.0], 0, 0.0, terminated=True)
        empty = np.zeros(0, np.int64)
        try:
            b = buf._gather(ps, empty, empty)
        except ValueError:
            outcomes.append("ValueError")
        else:
            outcomes.append(("batch", b.state.shape, b.weight.shape))
    assert outcomes[0] == outcomes[1], outcomes


@pytest.mark.parametrize(
    "high, low",
    [(2.0, 1.401298464324817e-45), (1e6, 1e-38), (3e3, 1.3e-41), (1e10, 1e-30)],
)
def test_weight_subnormal_ratio(high, low):
    """Leaves high and low (alpha 1, beta 0.4): the weight of the pick of
    priority high is (low / high) ** 0.4, a normal float32, although
    low / high is below float32's normal range."""
    got = []
    for buf in _pair():
        ps = buf.new_pick_selector(Prioritized, alpha=1.0, beta=0.4)
        buf.record(None, [0.0], 0, 0.0, priority=high, terminated=True)
        buf.record(None, [1.0], 1, 0.0, priority=low, terminated=True)
        got.append(buf._gather(ps, [0, 1], [0, 0]).weight)
    expected = (float(np.float32(low)) / float(np.float32(high))) ** 0.4
    np.testing.assert_allclose(got[1][0], expected, rtol=1e-6)  # the reference
    np.testing.assert_allclose(got[0], got[1], rtol=1e-6)
