"""ExperienceReplay.remove_episode: an eviction on request (docs/semantics.md).

The differential machines (tests/test_differential.py) compare it with the
reference under random call sequences, tests/test_arg_agreement.py its
argument handling, and tests/test_threads.py runs it against recording,
sampling and eviction threads; these are the direct checks.
"""

import threading
import time

import numpy as np
import pytest

from exreplay import ExperienceReplay, PickSelectorClass
from exreplay.reference import ReferenceReplay

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized
IMPLS = (ExperienceReplay, ReferenceReplay)


def rollout(buf, T, tag, h=None, end=True):
    s = np.full((T, 2), tag, np.float32)
    s[:, 1] = np.arange(T)
    return buf.record_many(h, s, np.arange(T), np.ones(T),
                           final_state=np.full(2, tag, np.float32) if end else None)


@pytest.mark.parametrize("cls", IMPLS)
def test_removal_takes_records_picks_and_priorities(cls):
    buf = cls((2,), capacity=None, pick_len=2)
    u = buf.new_pick_selector(U)
    p = buf.new_pick_selector(P, alpha=1.0, beta=0.0)
    a = rollout(buf, 10, 1)
    b = rollout(buf, 5, 2)
    buf.set_priority(p, [a] * 9, np.arange(9), 100.0)
    assert (len(buf), buf.num_episodes, buf.num_picks) == (15, 2, 9 + 4)
    assert buf.remove_episode(a) is None
    assert (len(buf), buf.num_episodes, buf.num_picks) == (5, 1, 4)
    assert buf._handles() == [b]
    for ps in (u, p):
        assert set(buf.get_batch(64, ps).pick_epi.tolist()) == {b}
    # the removed picks' priorities are gone from the prioritized selector's total
    if cls is ExperienceReplay:
        total, _, n = buf.priority_stats(p)
        assert n == 4 and total == pytest.approx(4.0)
    # their priorities can no longer be set (skipped like evicted picks)
    assert buf.set_priority(p, [a], [0], 1.0) == 0
    # a record into the removed handle starts a new episode
    h = buf.record(a, np.zeros(2, np.float32), 0, 0.0)
    assert h != a and h > b
    buf._check()


@pytest.mark.parametrize("cls", IMPLS)
def test_unknown_handles_are_errors_that_change_nothing(cls):
    buf = cls((2,), capacity=12, pick_len=1)
    buf.new_pick_selector(U)
    old = rollout(buf, 10, 1)
    rollout(buf, 5, 2)  # evicts old
    before = (len(buf), buf._handles(), buf._picks()[0].tolist())
    for h in (old, 99, -1, 2**63 - 1):
        with pytest.raises(ValueError, match=r"^h: expected the handle of an episode held, got"):
            buf.remove_episode(h)
    for h in (None, 1.0, "0", True):
        with pytest.raises(TypeError, match=r"^h: expected"):
            buf.remove_episode(h)
    assert (len(buf), buf._handles(), buf._picks()[0].tolist()) == before
    h = buf._handles()[0]
    buf.remove_episode(h)
    with pytest.raises(ValueError):
        buf.remove_episode(h)  # twice: the second is an unknown handle
    buf._check()


@pytest.mark.parametrize("cls", IMPLS)
def test_open_and_empty_episodes(cls):
    buf = cls((2,), capacity=None, pick_len=1)
    e = buf.new_episode()
    buf.remove_episode(e)
    assert buf.num_episodes == 0
    h = rollout(buf, 4, 1, end=False)
    assert buf.num_picks == 3  # the open episode's last step waits for its next state
    buf.remove_episode(h)
    assert (len(buf), buf.num_episodes, buf.num_picks) == (0, 0, 0)
    buf._check()


def test_second_chance_hand_moves_on_like_the_reference():
    """Removing the episode under the hand: the next eviction starts from the
    episode after it, in both implementations."""
    bufs = [cls((2,), capacity=40, pick_len=1, eviction="second_chance", seed=3)
            for cls in IMPLS]
    for buf in bufs:
        u = buf.new_pick_selector(U)
        hs = [rollout(buf, 8, i) for i in range(5)]  # 40 records, full
        buf.get_batch(4096, u)  # marks every episode sampled
        rollout(buf, 8, 9)  # the hand clears marks, evicts hs[0], stops after it
        buf.remove_episode(hs[1])  # the episode under the hand
        buf.remove_episode(hs[3])
        for t in range(20, 26):
            rollout(buf, 8, t)
        buf._check()
    assert bufs[0]._handles() == bufs[1]._handles()


def test_removal_waits_for_a_record_copying_into_the_episode():
    """A record_many that copies its rows without the lock, and a
    remove_episode of its episode from another thread: the removal waits for
    the copy (or comes before the record began); the buffer stays whole."""
    T = 1500
    frame = np.ones((T, 64, 64), np.uint8)  # 6 MB: copied with the lock released
    for _ in range(5):
        buf = ExperienceReplay((64, 64), "uint8", capacity=None, pick_len=1)
        u = buf.new_pick_selector(U)
        h = buf.new_episode()
        started = threading.Event()
        result = {}

        def writer():
            started.set()
            result["h"] = buf.record_many(h, frame, np.zeros(T, np.int64), np.zeros(T))

        t = threading.Thread(target=writer)
        t.start()
        started.wait()
        time.sleep(0.0005)
        buf.remove_episode(h)
        t.join()
        if result["h"] == h:  # removed during or after the copy: nothing of it stays
            assert (len(buf), buf.num_episodes, buf.num_picks) == (0, 0, 0)
            with pytest.raises(ValueError):
                buf.get_batch(1, u)
        else:  # removed before the record began: the record started a new episode
            assert (len(buf), buf.num_episodes) == (T, 1)
            assert buf.get_batch(1, u).state.shape == (1, 1, 64, 64)
        buf._check()


def test_serialize_after_removal():
    buf = ExperienceReplay((2,), capacity=100, pick_len=2, eviction="second_chance", seed=1)
    p = buf.new_pick_selector(P, alpha=0.6, beta=0.4)
    hs = [rollout(buf, 6, i) for i in range(6)]
    buf.get_batch(8, p)
    buf.remove_episode(hs[2])
    copy = ExperienceReplay.unserialize(buf.serialize())
    copy._check()
    assert copy._handles() == buf._handles()
    assert np.array_equal(copy.get_batch(16, int(p)).pick_epi, buf.get_batch(16, p).pick_epi)


def test_removal_is_not_logged(tmp_path):
    import exreplay
    import exreplay.log

    path = str(tmp_path / "a.xlog")
    log = exreplay.ExperienceLog(path)
    buf = ExperienceReplay((2,), capacity=None, pick_len=1, log=log)
    h = rollout(buf, 5, 1)
    buf.remove_episode(h)
    log.close()
    assert exreplay.log.info(path)["records"] == 5
