"""Differential tests of selectors, priorities and persistence, in mixes that
tests/test_differential.py's machines do not make.

Its machines update priorities with the handle form only, with arrays of
their own or right after the draw. Here (a subclass of its machine, so every
rule of it runs too):

- batches are kept across later calls (records that evict, remove_episode,
  selectors removed and created, refills with out=) and only then given to
  set_priority, in every form: the batch form, the batch's own arrays (whose
  draw notes the binding finds), pick_index= with the batch's indices or
  wrong ones, copies, and the batch's arrays written into since the draw;
  from a batch of another selector too. The reference is given the picks
  alone, so the result must be that of the update by handle;
- the C buffer is replaced in the middle of the sequence by a copy made with
  serialize/unserialize (or pickle): before the switch the copy must draw
  exactly the batches the original draws, twice for each selector, and
  afterwards it goes on against the reference, given batches of the
  original too, with selector objects of its own (pick_selector,
  pick_selectors) whose beta is set as the reference's is;
- the same, with every call but get_batch and set_priority made by another
  thread, one call at a time (ThreadedWriterMachine): the learner's draws
  and updates then take the paths without the storage lock, on a selector
  that the record calls leave notes to, and the checkpoint is the other
  thread's.
"""

import itertools
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import exreplay
from exreplay.reference import PickSelectorClass
from test_differential import (
    PRIORITIZED,
    SETTINGS,
    DifferentialMachine,
    _config,
    assert_batches_equal,
    priorities,
    snapshot,
)

Prioritized = PickSelectorClass.Prioritized

KEEP = 6  # batches kept for later updates
# how the C buffer is copied: serialize at a zlib level, or pickled
RESTORE = dict(data=st.data(), how=st.sampled_from(["serialize", "pickle"]),
               level=st.sampled_from([0, 6]))


class SelectorMachine(DifferentialMachine):
    def _setup(self, config, seed, first=()):
        self.kept = []  # C batches kept for later: (batch, selector handle drawn with)
        super()._setup(config, seed, first)

    def _drawable(self, r_ps, kind):
        if self.r.num_picks == 0:
            return False
        if kind == Prioritized:
            epi, pos = self.r._picks()
            return bool((self.r._priority(r_ps, epi, pos) > 0).any())
        return True

    @precondition(lambda self: self.c is not None and self.sels)
    # past 64 picks a draw is not the small one copied under the lock
    @rule(data=st.data(), B=st.one_of(st.integers(1, 40), st.integers(65, 150)),
          refill=st.booleans())
    def draw_and_keep(self, data, B, refill):
        """A batch drawn now, updated later (or refilled with out=)."""
        c_ps, r_ps, kind = self._draw_selector(data)
        if not self._drawable(r_ps, kind):
            return
        same = [b for b, _ in self.kept if len(b.pick_epi) == B]
        out = same[0] if refill and same else None
        cb = self.c.get_batch(B, int(c_ps), out=out)
        assert out is None or cb is out
        rb = self.r._gather(int(r_ps), cb.pick_epi, cb.pick_pos)
        assert_batches_equal(cb, rb, f"get_batch({B}, {int(c_ps)})")
        if out is None:
            self.kept.append((cb, int(c_ps)))
            del self.kept[:-KEEP]

    @precondition(lambda self: self.c is not None and self.sels and self.kept)
    @rule(
        data=st.data(),
        form=st.sampled_from(
            ["batch", "own", "index", "bad_index", "copies", "written", "written_index"]
        ),
        scalar=st.booleans(),
    )
    def set_priority_kept(self, data, form, scalar):
        """set_priority from a batch drawn earlier, by any selector."""
        b, _ = data.draw(st.sampled_from(self.kept))
        c_ps, r_ps, _ = self._draw_selector(data)
        n = len(b.pick_epi)
        if form in ("written", "written_index"):
            # the batch's own arrays, changed since the draw: other picks
            # (existing or not) at some places, the notes no longer true
            pool = self._all_picks() + [(-1, 0), (b.pick_epi[0], 10**6)]
            for i in data.draw(st.lists(st.integers(0, n - 1), max_size=3)):
                e, p = data.draw(st.sampled_from(pool))
                b.pick_epi[i], b.pick_pos[i] = e, p
            if form == "written_index" and self.r.num_picks:
                i = data.draw(st.integers(0, n - 1))
                b.pick_index[i] = data.draw(st.integers(0, self.r.num_picks - 1))
        if scalar:
            pr = data.draw(priorities)
        else:
            pr = np.array(data.draw(st.lists(priorities, min_size=n, max_size=n)), np.float64)
        epi, pos = b.pick_epi.copy(), b.pick_pos.copy()
        c = self.c
        cps = c_ps if data.draw(st.booleans()) and not isinstance(c_ps, int) else int(c_ps)
        if form == "batch":
            nc = c.set_priority(cps, b, pr)
        elif form in ("own", "written", "written_index"):
            nc = c.set_priority(cps, b.pick_epi, b.pick_pos, pr)
        elif form == "index":
            nc = c.set_priority(cps, b.pick_epi, b.pick_pos, pr, pick_index=b.pick_index)
        elif form == "bad_index":
            top = max(self.r.num_picks, 1)
            bad = np.array(data.draw(st.lists(st.integers(-2, top + 2), min_size=n, max_size=n)),
                           np.int64)
            nc = c.set_priority(cps, b.pick_epi, b.pick_pos, pr, pick_index=bad)
        else:
            nc = c.set_priority(cps, epi.copy(), pos.copy(), pr)
        nr = self.r.set_priority(int(r_ps), epi, pos, pr)
        assert nc == nr, f"set_priority ({form}) applied {nc} in C, {nr} in the reference"

    @precondition(lambda self: self.c is not None)
    @rule(**RESTORE)
    def restore(self, data, how, level):
        """The C buffer is replaced by a copy of itself, which draws exactly
        as the original does, twice (a draw's path must not change the
        next); the selectors are then used through the copy's own objects
        (pick_selector, pick_selectors), beta annealed through them too."""
        old = self.c
        new = self._copy(how, level)
        new._check()
        assert new._handles() == old._handles()
        for (c_ps, r_ps, kind), _ in itertools.product(self.sels, range(2)):
            if not self._drawable(r_ps, kind):
                continue
            B = data.draw(st.one_of(st.integers(1, 16), st.integers(65, 130)))
            x, y = old.get_batch(B, int(c_ps)), new.get_batch(B, int(c_ps))
            for f in ("pick_epi", "pick_pos", "weight", "seq_len", "pick_index"):
                np.testing.assert_array_equal(getattr(x, f), getattr(y, f), err_msg=f)
            # the reference marks the same episodes sampled
            assert_batches_equal(y, self.r._gather(int(r_ps), y.pick_epi, y.pick_pos),
                                 "after restore")
            self.kept.append((x, int(c_ps)))  # a batch of the old buffer
        del self.kept[:-KEEP]
        self.c = self._wrap(new)
        # old PickSelector objects belong to the old buffer; the copy's own,
        # from pick_selector or pick_selectors, have the same handles, kinds
        # and parameters, and go on against the reference's (beta included)
        for c_ps, _, _ in self.sels:
            with pytest.raises(ValueError, match="another buffer"):
                new.pick_selector(c_ps)
        if data.draw(st.booleans()):
            objs = {int(p): p for p in new.pick_selectors()}
        else:
            objs = {int(c): new.pick_selector(int(c)) for c, _, _ in self.sels}
        assert sorted(objs) == sorted(int(c) for c, _, _ in self.sels)
        for c_ps, r_ps, kind in self.sels:
            p = objs[int(c_ps)]
            assert p.buffer is new and p.kind == kind
            assert (p.alpha, p.beta) == (r_ps.alpha, r_ps.beta) == (c_ps.alpha, c_ps.beta)
        self.sels = [(objs[int(c)], r, k) for c, r, k in self.sels]

    def _copy(self, how, level):
        if how == "serialize":
            return exreplay.ExperienceReplay.unserialize(self.c.serialize(level))
        return pickle.loads(pickle.dumps(self.c, protocol=5))

    def _wrap(self, buf):
        return buf


class _WriterThread:
    """The C buffer with every call but get_batch and set_priority made by
    one other thread, one call at a time, as an actor thread records beside
    a learner: a draw or an update that finds the buffer changed by that
    thread since it last looked lets go of the storage lock for its
    selector's work, and from then on the record calls leave their changes
    to the selector as notes that the next draw, update or record applies
    (docs/api.md, "Threads and the GIL"). Everything stays sequential, so
    the results are deterministic."""

    LEARNER = ("get_batch", "set_priority")

    def __init__(self, buf, pool):
        self._buf = buf
        self._pool = pool

    def call(self, f, *a, **kw):
        return self._pool.submit(f, *a, **kw).result()

    def __len__(self):
        return self.call(len, self._buf)

    def __getattr__(self, name):
        f = getattr(self._buf, name)
        if name in self.LEARNER or not callable(f):
            return f
        return lambda *a, **kw: self.call(f, *a, **kw)


class ThreadedWriterMachine(SelectorMachine):
    def _setup(self, config, seed, first=()):
        super()._setup(config, seed, first)
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.c = self._wrap(self.c)

    def teardown(self):
        if getattr(self, "pool", None) is not None:
            self.pool.shutdown()

    def _wrap(self, buf):
        return _WriterThread(buf, self.pool)

    def _copy(self, how, level):
        # the checkpoint is the writer thread's, the draws after it the
        # learner's: the original's next draw is made without the storage
        # lock (another thread's hold came since), the copy's under it
        if how == "serialize":
            return exreplay.ExperienceReplay.unserialize(self.c.serialize(level))
        return pickle.loads(self.c.call(pickle.dumps, self.c._buf, protocol=5))


F32_2 = ((2,), "float32")
I64 = ((), "int64")

CONFIGS = {
    "L1_fifo_cap20": _config(1, False, 20, "fifo", F32_2, I64),
    "L3_short_sc_cap24": _config(3, True, 24, "second_chance", F32_2, I64),
    "L2_sc_unbounded": _config(2, False, None, "second_chance", F32_2, I64),
}


# Fewer examples than test_differential.py's machines (these run all of
# their rules too): the six take about 10 s. EXREPLAY_DIFF_EXAMPLES=n runs n.
EXAMPLES = int(os.environ.get("EXREPLAY_DIFF_EXAMPLES", min(SETTINGS.max_examples, 25)))


def _machine(name, cfg, base, prefix):
    cls = type(f"{prefix}_{name}", (base,), {"CONFIG": cfg})
    cls.TestCase.settings = settings(SETTINGS, max_examples=EXAMPLES)
    return cls


_machines = {name: _machine(name, cfg, SelectorMachine, "SelMachine")
             for name, cfg in CONFIGS.items()}
_threaded = {name: _machine(name, cfg, ThreadedWriterMachine, "ThreadedWriter")
             for name, cfg in CONFIGS.items()}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_selector_differential(name):
    _machines[name].TestCase().runTest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_selector_differential_writer_thread(name):
    _threaded[name].TestCase().runTest()
