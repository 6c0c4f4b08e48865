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


def _vm_flags(addr):
    """The VmFlags of the mapping of this process holding address addr, or
    None where /proc/self/smaps cannot say."""
    try:
        with open("/proc/self/smaps") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    inside = False
    for line in lines:
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= addr < hi
        elif inside and line.startswith("VmFlags:"):
            return line.split()[1:]
    return None


def test_a_large_serialize_output_is_advised_for_huge_pages():
    """serialize's bytes object of 32 MiB or more is advised for huge pages
    before it is written (docs/format.md, "Writing"): its first writes
    fault in 2 MiB pages where the kernel takes the advice. The mapping's
    VmFlags say so ("hg")."""
    import pytest

    b = exreplay.ExperienceReplay((84, 84), state_dtype=np.uint8, capacity=None, seed=1)
    b.new_pick_selector(0)
    st = np.ones((500, 84, 84), np.uint8)
    for _ in range(12):  # 12 x 500 x 7 KiB: 42 MB
        b.record_many(None, st, np.zeros(500, np.int64), np.zeros(500, np.float32),
                      terminated=True)
    big = b.serialize(level=0)
    at = np.frombuffer(big, np.uint8).ctypes.data
    flags = _vm_flags(at + len(big) // 2)
    if flags is None:
        pytest.skip("no /proc/self/smaps")
    assert "hg" in flags, flags
    assert b.serialize(level=0) == big  # the advice changes no byte
