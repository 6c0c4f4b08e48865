"""Storage segments from malloc moved onto 2 MiB pages once they fill most of
one (docs/design.md, "Huge pages for small segments"): record calls and
unserialize queue and collapse the chunks, and nothing a buffer holds or
returns changes. Whether the kernel grants a collapse depends on the machine
(THP mode, kernel version, free huge pages), so the tests ask that every
queued chunk was tried, not that it succeeded."""
import numpy as np

import exreplay
from exreplay import _core

EP = 100


def _filled(n_eps, seed=5, kind=1):
    """A buffer of (4,) float32 rows: n_eps rollouts of EP steps, each its
    own malloc'd segment of 2,816 bytes."""
    rng = np.random.default_rng(seed)
    b = exreplay.ExperienceReplay((4,), state_dtype=np.float32, capacity=n_eps * EP, seed=seed)
    ps = b.new_pick_selector(kind)
    for _ in range(n_eps):
        st = rng.standard_normal((EP, 4)).astype(np.float32)
        b.record_many(None, st, rng.integers(0, 9, EP), rng.random(EP).astype(np.float32),
                      terminated=True, priorities=rng.random(EP) + 0.1)
    return b, ps


def _stats():
    """The counts, after a record call has tried whatever an earlier test
    left queued (the counts are the process's)."""
    b = exreplay.ExperienceReplay((4,), state_dtype=np.float32, capacity=10)
    b.record(None, np.zeros(4, np.float32), 0, 0.0)
    return _core._seg_collapse_stats()


def _same_batches(a, pa, b, pb, draws=5):
    for _ in range(draws):
        x, y = a.get_batch(256, pa), b.get_batch(256, pb)
        for f in ("state", "action", "reward", "state_next", "pick_epi", "pick_pos", "weight"):
            assert np.array_equal(getattr(x, f), getattr(y, f)), f


def test_record_calls_queue_and_collapse_their_chunks():
    before = _stats()
    b, ps = _filled(4000)  # 11 MB of segments: several chunks filled past half
    after = _core._seg_collapse_stats()
    queued = after["queued"] - before["queued"]
    assert queued >= 2
    # every queued chunk was tried by a later record call: none waits
    tried = after["collapsed"] + after["failed"] - before["collapsed"] - before["failed"]
    assert tried == queued
    b._check()


def test_collapse_changes_nothing_a_buffer_returns():
    was = _core._seg_collapse_enable(False)
    try:
        plain, pp = _filled(3000, seed=9)
    finally:
        _core._seg_collapse_enable(was)
    before = _core._seg_collapse_stats()["queued"]
    huge, ph = _filled(3000, seed=9)
    assert _core._seg_collapse_stats()["queued"] > before
    _same_batches(plain, pp, huge, ph)
    for h in (0, 1234, 2999):
        x, y = plain.episode(h), huge.episode(h)
        assert np.array_equal(x.state, y.state) and np.array_equal(x.reward, y.reward)
    huge._check()


def test_unserialize_collapses_what_it_read():
    b, ps = _filled(3000, seed=11)
    data = b.serialize()
    before = _stats()
    c = exreplay.ExperienceReplay.unserialize(data)
    after = _core._seg_collapse_stats()
    assert after["queued"] > before["queued"]
    assert after["collapsed"] + after["failed"] - before["collapsed"] - before["failed"] == (
        after["queued"] - before["queued"])
    c._check()
    assert c.serialize() == data


def test_freed_segments_leave_the_counts():
    before = _core._seg_collapse_stats()["chunks"]
    b, ps = _filled(2000, seed=13)
    assert _core._seg_collapse_stats()["chunks"] > before
    del b, ps
    assert _core._seg_collapse_stats()["chunks"] <= before
