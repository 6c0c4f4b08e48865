"""new_episode without the storage lock (docs/design.md, "Locking and the
GIL"): new_episode reserves a handle and an empty body under a short mutex,
and the next call that takes the storage lock exclusively makes the reserved
episodes live, in handle order, before it does anything else. The first
new_episode of a buffer takes the lock (it makes room for the reservations);
the ones after it reserve. These tests reach a reserved episode with each
call that can see episodes and compare with the reference, which has no
reservations.
"""

import pickle
import threading

import numpy as np
import pytest

from exreplay import ExperienceLog, ExperienceReplay, PickSelectorClass
from exreplay.reference import ReferenceReplay

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized


def rollout(buf, T, tag, h=None, end=False):
    s = np.full((T, 2), tag, np.float32)
    s[:, 1] = np.arange(T)
    return buf.record_many(h, s, np.arange(T), np.ones(T, np.float32),
                           final_state=np.full(2, tag, np.float32) if end else None,
                           priorities=np.full(T, 2.0))


def pair(**cfg):
    """The same buffer and the reference, each with one episode of 5 steps
    and one made by the locked new_episode (the one that makes room)."""
    bufs = []
    for cls in (ExperienceReplay, ReferenceReplay):
        b = cls((2,), pick_len=2, seed=3, **cfg)
        SEL[id(b)] = b.new_pick_selector(P, alpha=1.0, beta=0.0)
        rollout(b, 5, 1)
        b.new_episode()
        bufs.append(b)
    return bufs


SEL = {}  # each buffer's prioritized selector


def view(buf):
    """Everything a caller can see of the episodes."""
    out = [len(buf), buf.num_episodes, buf.num_picks, list(buf._handles())]
    for h in buf._handles():
        ep = buf.episode(int(h))
        out.append((int(h), ep.state.tolist(), ep.action.tolist(), ep.final_state is None))
    return out


OBSERVERS = {
    "num_episodes": lambda b, h: b.num_episodes,
    "len": lambda b, h: len(b),
    "num_picks": lambda b, h: b.num_picks,
    "episode": lambda b, h: (b.episode(h).state.shape, b.episode(h).terminated),
    "handles": lambda b, h: list(b._handles()),
    "check": lambda b, h: b._check(),
    "remove_episode": lambda b, h: (b.remove_episode(h), list(b._handles())),
    "record_into": lambda b, h: (b.record(h, np.zeros(2, np.float32), 0, 0.0), view(b)),
    "record_none": lambda b, h: (b.record(None, np.zeros(2, np.float32), 0, 0.0), view(b)),
    "set_priority": lambda b, h: b.set_priority(SEL[id(b)], [h], [0], 1.0),
    "new_selector": lambda b, h: (b.new_pick_selector(U).handle, b.num_picks),
    "stored_priorities": lambda b, h: b.stored_priorities(SEL[id(b)], [h], [0]),
    "pickle": lambda b, h: view(pickle.loads(pickle.dumps(b))),
    # empty: refused as such (not as a handle never made); with a step, ended
    "end_episode": lambda b, h: (_error(lambda: b.end_episode(h, terminated=True)),
                                 b.record(h, np.zeros(2, np.float32), 0, 0.0),
                                 b.end_episode(h, terminated=True), view(b)),
}


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - compared between the two buffers
        return type(e).__name__, str(e)
    return None


@pytest.mark.parametrize("name", sorted(OBSERVERS))
def test_each_call_sees_a_reserved_episode(name):
    c, r = pair(capacity=None)
    hc, hr = c.new_episode(), r.new_episode()  # c: reserved
    assert hc == hr == 2
    obs = OBSERVERS[name]
    if name == "stored_priorities":
        # the reference has none: the same error as for episode 1, empty
        # and made under the lock (the message names the pick's handle)
        msgs = []
        for h in (1, hc):
            with pytest.raises(ValueError) as ei:
                obs(c, h)
            msgs.append(str(ei.value).replace(f"({h}, 0)", "(h, 0)"))
        assert msgs[0] == msgs[1] and "(h, 0)" in msgs[0]
        obs = OBSERVERS["handles"]
    try:
        want = obs(r, hr)
    except Exception as e:  # noqa: BLE001 - the same error on both
        with pytest.raises(type(e)):
            obs(c, hc)
    else:
        assert obs(c, hc) == want
    assert view(c) == view(r)
    c._check()
    assert c.new_episode() == r.new_episode()


def test_serialize_and_save_carry_reserved_episodes(tmp_path):
    c, r = pair(capacity=None)
    hs = [c.new_episode() for _ in range(3)]
    for _ in range(3):
        r.new_episode()
    copy = ExperienceReplay.unserialize(c.serialize())
    assert view(copy) == view(r) == view(c)
    copy._check()
    assert copy.new_episode() == hs[-1] + 1
    hs.append(c.new_episode())
    c.save(tmp_path / "b.exr")
    loaded = ExperienceReplay.load(tmp_path / "b.exr")
    r.new_episode()
    assert view(loaded) == view(r) == view(c)
    assert loaded.new_episode() == c.new_episode() == hs[-1] + 1


@pytest.mark.parametrize("eviction", ["fifo", "second_chance"])
def test_eviction_order_with_reservations(eviction):
    """Random new_episode / record / record_many / remove_episode against the
    reference, at a small capacity: the same handles, in the same order,
    evicted in the same order."""
    c = ExperienceReplay((2,), capacity=40, pick_len=2, eviction=eviction, seed=1)
    r = ReferenceReplay((2,), capacity=40, pick_len=2, eviction=eviction, seed=1)
    for b in (c, r):
        b.new_pick_selector(U)
    rng = np.random.default_rng(7)
    mine = []
    for i in range(600):
        op = rng.integers(6)
        if op <= 1 or not mine:
            hh = [b.new_episode() for b in (c, r)]
            assert hh[0] == hh[1]
            mine.append(hh[0])
        elif op == 2:
            h = mine[rng.integers(len(mine))]
            T, end = int(rng.integers(1, 15)), bool(rng.integers(2))
            assert rollout(c, T, i, h, end=end) == rollout(r, T, i, h, end=end)
        elif op == 3:
            h = mine[rng.integers(len(mine))]
            assert c.record(h, np.full(2, i, np.float32), i, 1.0) == r.record(
                h, np.full(2, i, np.float32), i, 1.0)
        elif op == 4:
            h = mine.pop(rng.integers(len(mine)))
            errs = []
            for b in (c, r):
                try:
                    b.remove_episode(h)
                    errs.append(None)
                except ValueError as e:
                    errs.append(type(e))
            assert errs[0] == errs[1]
        else:
            assert c.record(None, np.zeros(2, np.float32), 0, 0.0) == r.record(
                None, np.zeros(2, np.float32), 0, 0.0)
        if i % 25 == 0:
            assert view(c) == view(r)
            c._check()
    assert view(c) == view(r)
    c._check()


def test_a_failed_call_after_a_reservation_changes_nothing():
    c, r = pair(capacity=20)
    h = c.new_episode()
    r.new_episode()
    before = c.serialize()
    with pytest.raises(ValueError):
        c.record_many(h, np.zeros((3, 5), np.float32), [0, 1, 2], [0.0, 0.0, 0.0])
    with pytest.raises(TypeError):
        c.record(h, "x", 0, 0.0)
    assert view(c) == view(r)
    assert c.serialize() == before
    c._check()
    assert c.new_episode() == r.new_episode()


def test_new_episode_from_many_threads_then_record():
    # Unbounded: with eviction, a reserved episode still empty can be evicted
    # before its thread records into it, and record_many then starts another
    # episode with a handle of its own (docs/api.md, record); the handles
    # would not all come from new_episode. Reservations under eviction are
    # checked against the reference above.
    buf = ExperienceReplay((2,), capacity=None, pick_len=2, seed=0)
    ps = buf.new_pick_selector(P)
    stop = threading.Event()
    got = [[] for _ in range(6)]
    errors = []

    def writer(k):
        try:
            for i in range(300):
                h = buf.new_episode()
                got[k].append(h)
                if i % 3:
                    out = rollout(buf, 1 + i % 7, k * 1000 + i, h, end=i % 2 == 0)
                    assert out == h
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        while not stop.is_set():
            b = buf.get_batch(16, ps)
            buf.set_priority(ps, b.pick_epi, b.pick_pos, 1.0)
            ExperienceReplay.unserialize(buf.serialize())._check()

    ths = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
    rd = threading.Thread(target=reader)
    rollout(buf, 10, -1)
    rd.start()
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    stop.set()
    rd.join()
    assert not errors
    for hs in got:
        assert hs == sorted(hs)
    every = sorted(h for hs in got for h in hs)
    assert every == list(range(1, 1 + 6 * 300))  # each handle once, none skipped
    handles = list(buf._handles())
    assert handles == sorted(handles)
    buf._check()
    assert buf.new_episode() == 6 * 300 + 1


def test_log_of_reserved_episodes(tmp_path):
    """A log attached sees the steps recorded into reserved episodes as into
    any other: the buffer rebuilt from it has the same steps."""
    buf = ExperienceReplay((2,), capacity=None, pick_len=1)
    lg = ExperienceLog(tmp_path / "r.log")
    buf.attach_log(lg)
    buf.new_episode()
    hs = [buf.new_episode() for _ in range(4)]
    for i, h in enumerate(hs):
        rollout(buf, 3 + i, i, h, end=i % 2 == 0)
    buf.detach_log()
    lg.close()
    back = ExperienceReplay.from_log(tmp_path / "r.log")
    got = {int(h): back.episode(int(h)).state.tolist() for h in back._handles()}
    for h in hs:
        assert buf.episode(h).state.tolist() in got.values()
