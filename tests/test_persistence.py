"""Persistence of the C buffer: serialize / unserialize, save / load, pickling
(docs/format.md).

- Round trips at every level for several configurations: the copy answers
  every query as the original does, draws the same batches, and stays
  identical under the same further calls (records, evictions, new selectors).
- Pickling (protocols 2-5, out-of-band PickleBuffer at 5, deepcopy).
- Files: save/load, progress callback, atomic replace, errors.
- Hostile input: truncations, byte flips, and crafted payloads whose
  checksums are fixed up, so that only field validation can refuse them.
- The GIL is released while serializing and saving.
"""

import copy
import json
import math
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest

import exreplay
import exreplay.log
import memwatch
from childrun import run_child
from exreplay import ExperienceReplay

U, P, R = 0, 1, 2  # PickSelectorClass: Uniform, Prioritized, Rank
HEADER = 40


# ---- building buffers --------------------------------------------------------

CONFIGS = {
    # CartPole-like: unbounded, int seed
    "cartpole": dict(state_shape=(4,), capacity=None, seed=0),
    # Atari-like frames, R2D2-style sequences, second-chance eviction, OS seed
    "atari": dict(
        state_shape=(84, 84),
        state_dtype="uint8",
        pick_len=8,
        allow_short=True,
        capacity=300,
        eviction="second_chance",
        seed=None,
    ),
    # continuous control: vector float actions, float64 rewards, fifo eviction
    "continuous": dict(
        state_shape=(3,),
        state_dtype="float64",
        action_shape=(2,),
        action_dtype="float32",
        reward_dtype="float64",
        capacity=150,
        eviction="fifo",
        seed=12345,
    ),
    # scalar int16 states, uint8 actions, float16 rewards, the largest seed
    "half": dict(
        state_shape=(),
        state_dtype="int16",
        action_dtype="uint8",
        reward_dtype="float16",
        pick_len=3,
        capacity=60,
        eviction="second_chance",
        seed=2**64 - 1,
    ),
    # bool states, sequences without short picks, unbounded, OS seed
    "seq": dict(
        state_shape=(2, 3),
        state_dtype="bool",
        action_dtype="int8",
        pick_len=4,
        allow_short=False,
        capacity=None,
        seed=None,
    ),
}


def states(buf, rng, T):
    shape = (T,) + buf.state_shape
    dt = buf.state_dtype
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(dt)
    if dt == np.uint8:
        return rng.integers(0, 8, shape, dtype=np.uint8)  # compressible, fast
    if dt.kind in "iu":
        return rng.integers(-100 if dt.kind == "i" else 0, 100, shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)


def actions(buf, rng, T):
    shape = (T,) + buf.action_shape
    dt = buf.action_dtype
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return rng.integers(0, 6, shape).astype(dt)


def rewards(buf, rng, T):
    return rng.standard_normal(T).astype(buf.reward_dtype)


def episode_ops(buf, rng, sels, n_eps, open_eps, max_len):
    """Records n_eps episodes of every kind; returns the handles returned."""
    out = []
    for i in range(n_eps):
        kind = int(rng.integers(0, 5))
        if kind == 4 and open_eps:
            # continue an episode left open earlier (it may have been evicted:
            # then a new one starts, and both buffers must agree on that)
            h = open_eps.pop(int(rng.integers(0, len(open_eps))))
        else:
            h = None
        T = int(rng.integers(1, max_len + 1))
        pr = None
        if rng.random() < 0.5:
            pr = rng.exponential(1.0, T)
            pr[rng.random(T) < 0.2] = 0.0  # zero priorities are allowed
        fs, term = None, False
        if kind == 0:  # ended with a final state
            fs = states(buf, rng, 1)[0]
        elif kind == 1:  # terminated without a final state
            term = True
        elif kind == 2:  # terminated with a final state
            fs, term = states(buf, rng, 1)[0], True
        h = buf.record_many(
            h, states(buf, rng, T), actions(buf, rng, T), rewards(buf, rng, T),
            final_state=fs, terminated=term, priorities=pr,
        )
        out.append(h)
        if kind in (3, 4):
            open_eps.append(h)
        if rng.random() < 0.15:
            out.append(buf.new_episode())  # an empty episode
        if rng.random() < 0.4:
            out.append(sample_ops(buf, rng, sels))
    return out


def sample_ops(buf, rng, sels):
    """get_batch (marks episodes sampled, advances generators) and set_priority."""
    log = []
    for h, kind in sels.items():
        if kind is None:
            continue
        try:
            b = buf.get_batch(int(rng.integers(1, 9)), h)
        except ValueError as e:
            log.append(("empty", h, str(e)))
            continue
        log.append((h, b.pick_epi.tolist(), b.pick_pos.tolist()))
        if kind in (P, R):
            pr = rng.exponential(2.0, len(b.pick_epi))
            log.append(buf.set_priority(h, b.pick_epi, b.pick_pos, pr))
    return log


def build(name, rng_seed=1):
    """A buffer of configuration name after a deterministic history; returns
    (buf, sels, open_eps) where sels maps every selector handle ever made to
    its kind (None once removed)."""
    cfg = CONFIGS[name]
    buf = ExperienceReplay(**cfg)
    rng = np.random.default_rng(rng_seed)
    sels = {}
    buf.new_episode()  # an empty first episode (evicted early where bounded)
    s0 = buf.new_pick_selector(U)
    s1 = buf.new_pick_selector(P)
    s2 = buf.new_pick_selector(P, alpha=0.5, beta=1.0)
    s3 = buf.new_pick_selector(U)
    sels.update({int(s0): U, int(s1): P, int(s2): P, int(s3): U})
    buf.remove_pick_selector(s1)  # a gap in the selector handles
    sels[int(s1)] = None
    s2.beta = 0.7  # annealed
    max_len = 12 if name == "atari" else 25
    open_eps = []
    episode_ops(buf, rng, sels, 12, open_eps, max_len)
    s4 = buf.new_pick_selector(P, alpha=1.0, beta=0.0)
    sels[int(s4)] = P
    s5 = buf.new_pick_selector(R, alpha=0.8, beta=0.3)
    sels[int(s5)] = R
    buf.remove_pick_selector(s3)
    sels[int(s3)] = None
    episode_ops(buf, rng, sels, 10, open_eps, max_len)
    buf.new_episode()  # an empty last episode
    return buf, sels, open_eps


def live(sels):
    return {h: k for h, k in sels.items() if k is not None}


# ---- comparing buffers ---------------------------------------------------------

ATTRS = ["state_shape", "state_dtype", "action_shape", "action_dtype", "reward_dtype",
         "capacity", "pick_len", "allow_short", "eviction", "seed"]


def assert_arrays_equal(a, b, what):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    # bytewise: NaN (float states) compare equal to themselves
    assert a.tobytes() == b.tobytes(), what


def assert_same(a, b, sels):
    for name in ATTRS:
        va, vb = getattr(a, name), getattr(b, name)
        assert va == vb and type(va) is type(vb), name
    assert len(a) == len(b)
    assert a.num_episodes == b.num_episodes
    assert a.num_picks == b.num_picks
    assert a._handles() == b._handles()
    ea, pa = a._picks()
    eb, pb = b._picks()
    # the pick table order itself is restored (batches depend on it) ...
    assert_arrays_equal(ea, eb, "pick_epi")
    assert_arrays_equal(pa, pb, "pick_pos")
    # ... so the sorted picks agree too
    assert sorted(zip(ea.tolist(), pa.tolist())) == sorted(zip(eb.tolist(), pb.tolist()))
    for h in a._handles():
        x, y = a.episode(h), b.episode(h)
        for f in ("state", "action", "reward"):
            assert_arrays_equal(getattr(x, f), getattr(y, f), f"episode {h} {f}")
        assert (x.final_state is None) == (y.final_state is None), h
        if x.final_state is not None:
            assert_arrays_equal(x.final_state, y.final_state, f"episode {h} final_state")
        assert x.ended == y.ended and x.terminated == y.terminated, h
    # the selectors, with their handles, kinds and parameters (beta as set last)
    assert [(int(p), p.kind, p.alpha, p.beta) for p in b.pick_selectors()] == \
        [(int(p), p.kind, p.alpha, p.beta) for p in a.pick_selectors()]
    for h, kind in sels.items():
        if kind in (P, R) and len(ea):
            assert_arrays_equal(a._priority(h, ea, pa), b._priority(h, ea, pa), f"priority {h}")
        if kind is None:
            for buf in (a, b):
                with pytest.raises(ValueError):
                    buf.get_batch(1, h)
    assert b._check() is None


def batch_or_error(buf, n, h):
    try:
        return buf.get_batch(n, h)
    except ValueError as e:
        return Refused(str(e))


class Refused(str):
    """get_batch raised ValueError with this message."""


def assert_same_batches(a, b, sels, rounds=3, n=16):
    for _ in range(rounds):
        for h in live(sels):
            x, y = batch_or_error(a, n, h), batch_or_error(b, n, h)
            if isinstance(x, Refused) or isinstance(y, Refused):
                assert x == y
                continue
            for f in ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
                      "pick_epi", "pick_pos", "weight"):
                assert_arrays_equal(getattr(x, f), getattr(y, f), f"selector {h} batch {f}")


def assert_same_future(a, b, sels, open_a, open_b):
    """The same further calls on both give the same results and states."""
    assert open_a == open_b
    sels_a, sels_b = dict(sels), dict(sels)
    # new selectors: same handles, same generator seeding (seed, handle)
    for kind, kw in ((U, {}), (P, {"alpha": 0.8, "beta": 0.3})):
        ha, hb = a.new_pick_selector(kind, **kw), b.new_pick_selector(kind, **kw)
        assert int(ha) == int(hb)
        sels_a[int(ha)] = sels_b[int(hb)] = kind
    assert_same_batches(a, b, sels_a, rounds=2)
    assert a.new_episode() == b.new_episode()
    log_a = episode_ops(a, np.random.default_rng(99), sels_a, 15, list(open_a), 20)
    log_b = episode_ops(b, np.random.default_rng(99), sels_b, 15, list(open_b), 20)
    assert log_a == log_b
    assert_same(a, b, sels_a)
    assert_same_batches(a, b, sels_a, rounds=2)
    assert a.new_episode() == b.new_episode()


# ---- round trips ---------------------------------------------------------------


@pytest.mark.parametrize("level", range(10))
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip(name, level):
    a, sels, open_eps = build(name)
    data = a.serialize(level=level)
    assert isinstance(data, bytes)
    b = ExperienceReplay.unserialize(data)
    assert type(b) is ExperienceReplay
    assert_same(a, b, sels)
    # serializing the copy gives the same bytes (the whole state is captured)
    assert b.serialize(level=level) == data
    assert_same_batches(a, b, sels)
    assert_same_future(a, b, sels, open_eps, list(open_eps))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_twin_histories(name):
    """Built twice from the same history (an int seed or not): a copy of one
    matches the other wherever the seed is given."""
    a, sels, _ = build(name)
    c = ExperienceReplay.unserialize(exreplay._core.unserialize(a.serialize(0)).serialize(9))
    assert_same(a, c, sels)
    assert_same_batches(a, c, sels)


def test_seed_none_vs_int_restored():
    a = ExperienceReplay((2,), seed=None)
    b = ExperienceReplay((2,), seed=0)
    c = ExperienceReplay((2,), seed=2**64 - 1)
    assert ExperienceReplay.unserialize(a.serialize()).seed is None
    assert ExperienceReplay.unserialize(b.serialize()).seed == 0
    assert ExperienceReplay.unserialize(c.serialize()).seed == 2**64 - 1


def test_empty_buffer_round_trip():
    for cfg in CONFIGS.values():
        for level in (0, 6):
            a = ExperienceReplay(**cfg)
            b = ExperienceReplay.unserialize(a.serialize(level))
            assert_same(a, b, {})
            assert a.new_episode() == b.new_episode() == 0
            assert int(a.new_pick_selector(U)) == int(b.new_pick_selector(U)) == 0


def test_second_chance_hand_and_sampled_flags_restored():
    """Eviction order after a restore follows the restored hand and flags."""
    a = ExperienceReplay((1,), capacity=40, eviction="second_chance", seed=5)
    ps = a.new_pick_selector(U)
    rng = np.random.default_rng(3)
    for i in range(30):
        a.record_many(None, rng.standard_normal((4, 1)), np.zeros(4, np.int64),
                      np.zeros(4, np.float32), final_state=np.zeros(1))
        if i % 3 == 0:
            a.get_batch(3, ps)
    b = ExperienceReplay.unserialize(a.serialize())
    for i in range(40):
        ha = a.record_many(None, np.full((3, 1), i), np.zeros(3, np.int64),
                           np.zeros(3, np.float32), final_state=np.zeros(1))
        hb = b.record_many(None, np.full((3, 1), i), np.zeros(3, np.int64),
                           np.zeros(3, np.float32), final_state=np.zeros(1))
        assert ha == hb
        assert a._handles() == b._handles(), i
        if i % 4 == 0:
            assert_arrays_equal(a.get_batch(5, ps).pick_epi, b.get_batch(5, int(ps)).pick_epi,
                                "epi")


def test_pending_priorities_restored():
    """A priority recorded with a step whose pick does not exist yet (open
    episode, pick_len > 1) is kept in the payload and applied later."""
    a = ExperienceReplay((1,), pick_len=4, capacity=None, seed=1)
    ps = a.new_pick_selector(P, alpha=1.0, beta=0.5)
    h = a.record_many(None, np.zeros((3, 1)), np.zeros(3, np.int64), np.zeros(3, np.float32),
                      priorities=[5.0, 0.0, 7.0])
    assert a.num_picks == 0
    b = ExperienceReplay.unserialize(a.serialize())
    for x in (a, b):
        x.record_many(h, np.zeros((4, 1)), np.zeros(4, np.int64), np.zeros(4, np.float32),
                      final_state=np.zeros(1))
    e, p = a._picks()
    assert_arrays_equal(a._priority(ps, e, p), b._priority(int(ps), e, p), "priorities")
    assert a._priority(ps, [h], [0])[0] == 5.0
    assert a._priority(ps, [h], [1])[0] == 0.0


def test_checkpoint_from_another_thread_draws_the_same():
    """A buffer saved by a thread other than its learner's: the learner's
    next draw on the original is made without the storage lock (another
    thread's hold came since its last draw), the copy's under it; both give
    the same batches, that one and every one after."""
    a = ExperienceReplay((1,), capacity=None, seed=3)
    ps = a.new_pick_selector(P)
    a.record_many(None, np.zeros((50, 1), np.float32), np.zeros(50, np.int64),
                  np.zeros(50, np.float32), priorities=np.arange(1, 51.0), terminated=True)
    saved = []
    t = threading.Thread(target=lambda: saved.append(a.serialize()))
    t.start()
    t.join()
    b = ExperienceReplay.unserialize(saved[0])
    for _ in range(4):
        x, y = a.get_batch(100, ps), b.get_batch(100, int(ps))
        for f in ("pick_epi", "pick_pos", "pick_index", "weight"):
            assert_arrays_equal(getattr(x, f), getattr(y, f), f)


# ---- pickling ---------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_pickle_protocols(protocol):
    a, sels, open_eps = build("continuous")
    s = pickle.dumps(a, protocol=protocol)
    b = pickle.loads(s)
    assert type(b) is ExperienceReplay
    assert_same(a, b, sels)
    assert_same_batches(a, b, sels)
    assert_same_future(a, b, sels, open_eps, list(open_eps))


def test_reduce_ex_goes_through_core_unserialize():
    a, _, _ = build("cartpole")
    for proto in (2, 4):
        fn, args = a.__reduce_ex__(proto)
        assert fn is exreplay._core.unserialize
        assert len(args) == 1 and isinstance(args[0], bytes)
        assert args[0] == a.serialize(level=0)  # stored, not compressed
    fn, args = a.__reduce_ex__(5)
    assert fn is exreplay._core.unserialize
    assert isinstance(args[0], pickle.PickleBuffer)
    assert bytes(args[0].raw()) == a.serialize(level=0)


def test_deepcopy_and_copy():
    a, sels, open_eps = build("half")
    for b in (copy.deepcopy(a), copy.copy(a)):
        assert b is not a
        assert_same(a, b, sels)
    b = copy.deepcopy(a)
    assert_same_batches(a, b, sels)
    assert_same_future(a, b, sels, open_eps, list(open_eps))


def test_pickle_protocol5_out_of_band():
    a, sels, _ = build("atari")
    size = len(a.serialize(level=0))
    bufs = []
    s = pickle.dumps(a, protocol=5, buffer_callback=bufs.append)
    assert len(bufs) == 1
    assert isinstance(bufs[0], pickle.PickleBuffer)
    assert abs(bufs[0].raw().nbytes - size) <= 64
    assert len(s) < 256  # only the reference to unserialize and the buffer marker
    b = pickle.loads(s, buffers=bufs)
    assert_same(a, b, sels)
    assert_same_batches(a, b, sels)
    # out-of-band buffers handed over as plain bytes / bytearray also work
    b2 = pickle.loads(s, buffers=[bytearray(bufs[0].raw())])
    assert_same(a, b2, sels)
    # in band at protocol 5 without a callback
    s_in = pickle.dumps(a, protocol=5)
    assert len(s_in) >= size
    assert_same(a, pickle.loads(s_in), sels)


def _restored(a, how, tmp_path):
    if how.startswith("unserialize"):
        return ExperienceReplay.unserialize(a.serialize(level=int(how[-1])))
    if how == "load":
        a.save(tmp_path / "buf.exr")
        return ExperienceReplay.load(tmp_path / "buf.exr")
    if how == "pickle5":
        bufs = []
        s = pickle.dumps(a, protocol=5, buffer_callback=bufs.append)
        return pickle.loads(s, buffers=bufs)
    return copy.deepcopy(a) if how == "deepcopy" else copy.copy(a)


@pytest.mark.parametrize("how", ["unserialize0", "unserialize6", "load", "pickle5", "deepcopy",
                                 "copy"])
def test_restored_selectors_have_objects_to_anneal_beta(how, tmp_path):
    """docs/api.md, Persistence: the restored buffer's pick_selector and
    pick_selectors give PickSelector objects for the selectors it restored
    (the handles with their gaps, kinds, alpha, the beta annealed before the
    checkpoint), and setting beta through them changes the weights exactly as
    on the original; the original's objects stay the original's."""
    a, sels, _ = build("cartpole")
    b = _restored(a, how, tmp_path)
    objs = b.pick_selectors()
    assert [int(p) for p in objs] == sorted(live(sels)) == [0, 2, 4, 5]
    assert all(type(p) is exreplay.PickSelector and p.buffer is b for p in objs)
    assert [p.kind for p in objs] == [U, P, P, R]
    assert [(p.alpha, p.beta) for p in objs] == [(None, None), (0.5, 0.7), (1.0, 0.0), (0.8, 0.3)]
    epi, pos = a._picks()
    for h in (2, 4, 5):
        pa, pb = a.pick_selector(h), b.pick_selector(h)
        assert repr(pa) == repr(pb) and pa != pb and pb == h == pa
        with pytest.raises(ValueError, match="^ps: expected a pick selector of this buffer, got "
                                             "one of another buffer"):
            b.pick_selector(pa)
        w0 = b._gather(pb, epi, pos).weight
        for beta in (0.25, 1.0):
            pa.beta = pb.beta = beta
            assert b.pick_selector(h).beta == beta and pb.beta == beta
            w = b._gather(pb, epi, pos).weight
            assert_arrays_equal(w, a._gather(pa, epi, pos).weight, f"weight {h} beta {beta}")
            assert not np.array_equal(w, w0)
    assert_same_batches(a, b, sels, rounds=1)
    pb.beta = 0.05
    assert pa.beta == 1.0
    for h in (1, 3, 6, -1):  # removed, removed, never made
        with pytest.raises(ValueError, match=f"^ps: expected a pick selector of this buffer, got "
                                             f"unknown handle {h}$"):
            b.pick_selector(h)
    with pytest.raises(TypeError, match="^ps: expected a PickSelector or an int handle, got str$"):
        b.pick_selector("2")
    b.remove_pick_selector(b.pick_selector(2))
    assert [int(p) for p in b.pick_selectors()] == [0, 4, 5]
    assert [int(p) for p in a.pick_selectors()] == [0, 2, 4, 5]


def test_unserialize_accepts_bytes_like():
    a, sels, _ = build("cartpole")
    data = a.serialize()
    for obj in (data, bytearray(data), memoryview(data), pickle.PickleBuffer(data),
                memoryview(bytearray(data)), np.frombuffer(data, np.uint8)):
        for fn in (ExperienceReplay.unserialize, exreplay._core.unserialize):
            assert_same(a, fn(obj), sels)


@pytest.mark.parametrize("bad", ["text", 3, None, 1.5, [1, 2], object()])
def test_unserialize_bad_type(bad):
    for fn in (ExperienceReplay.unserialize, exreplay._core.unserialize):
        with pytest.raises(TypeError, match="^data: expected a bytes-like object, got "):
            fn(bad)


def test_unserialize_of_a_strided_buffer_says_contiguous():
    data = ExperienceReplay((2,)).serialize()
    for bad in (memoryview(data)[::2], np.frombuffer(data, np.uint8)[::2]):
        for fn in (ExperienceReplay.unserialize, exreplay._core.unserialize):
            with pytest.raises(TypeError, match="^data: expected a C-contiguous bytes-like object, "
                                                "got a non-contiguous "):
                fn(bad)


@pytest.mark.parametrize("level", [-1, 10, 100, -(2**70), 2**70])
def test_level_out_of_range(level, tmp_path):
    a = ExperienceReplay((2,))
    with pytest.raises(ValueError, match="^level: expected an int from 0 to 9, got "):
        a.serialize(level=level)
    with pytest.raises(ValueError, match="^level: expected an int from 0 to 9, got "):
        a.save(tmp_path / "x.exr", level=level)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("level", [1.5, "6", True, b"1", 6.0])
def test_level_wrong_type(level, tmp_path):
    a = ExperienceReplay((2,))
    with pytest.raises(TypeError, match="level"):
        a.serialize(level=level)
    with pytest.raises(TypeError, match="level"):
        a.serialize(level)
    with pytest.raises(TypeError, match="level"):
        a.save(tmp_path / "x.exr", level=level)
    assert os.listdir(tmp_path) == []


def test_level_accepts_index_types():
    a = ExperienceReplay((2,))
    assert a.serialize(level=np.int64(3)) == a.serialize(level=3)
    assert a.serialize(0) == a.serialize(level=0)


# ---- save / load -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["str", "path"])
def test_save_load_round_trip(tmp_path, kind):
    a, sels, open_eps = build("atari")
    p = tmp_path / "replay.exr"
    path = str(p) if kind == "str" else p
    a.save(path)
    assert os.listdir(tmp_path) == ["replay.exr"]
    # the file holds exactly what serialize() gives
    assert p.read_bytes() == a.serialize()
    b = ExperienceReplay.load(path)
    assert_same(a, b, sels)
    assert_same_batches(a, b, sels)
    assert_same_future(a, b, sels, open_eps, list(open_eps))
    for level in (0, 1, 9):
        a.save(path, level=level)
        assert p.read_bytes() == a.serialize(level)
        assert_same(a, ExperienceReplay.load(path), sels)


def test_save_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    a, sels, _ = build("cartpole")
    a.save("rel.exr")
    assert_same(a, ExperienceReplay.load("rel.exr"), sels)
    os.mkdir("sub")
    a.save(os.path.join("sub", "x.exr"), level=0)
    assert os.listdir("sub") == ["x.exr"]
    assert_same(a, ExperienceReplay.load(pathlib.Path("sub/x.exr")), sels)


def big_frames_buffer(n_frames=10_000, marker=0):
    """~70 MB of 84x84 uint8 frames (over the 64 MiB progress interval)."""
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=4)
    frames = np.random.default_rng(marker).integers(0, 256, (1000, 84, 84), dtype=np.uint8)
    for i in range(n_frames // 1000):
        buf.record_many(None, frames, np.full(1000, marker, np.int64), np.zeros(1000, np.float32),
                        final_state=frames[i])
    return buf


@pytest.fixture(scope="module")
def big_buffer():
    return big_frames_buffer()


def small_marked(marker):
    b = ExperienceReplay((3,), capacity=None, seed=1)
    b.record_many(None, np.full((marker + 1, 3), marker, np.float32), np.zeros(marker + 1, np.int64),
                  np.zeros(marker + 1, np.float32))
    return b


def marker_of(buf):
    return int(buf.episode(buf._handles()[0]).state[0, 0])


def test_save_progress_callback(tmp_path, big_buffer):
    p = tmp_path / "big.exr"
    small_marked(7).save(p)  # an old file to be replaced
    old_ino = os.stat(p).st_ino
    calls = []

    def progress(done, total):
        calls.append((done, total))
        # mid-save: the path still holds the old buffer, complete, and the
        # new bytes go to a temp file in the same directory
        assert marker_of(ExperienceReplay.load(p)) == 7
        names = os.listdir(tmp_path)
        assert "big.exr" in names
        assert all(n == "big.exr" or n.startswith(".big.exr.") for n in names), names
        assert save_temp_open(tmp_path, "big.exr"), "no temp file open in the directory"

    big_buffer.save(p, level=0, progress=progress)
    assert calls, "progress was never called for a payload over 64 MiB"
    total = calls[0][1]
    assert all(t == total for _, t in calls)
    assert all(type(d) is int and type(t) is int for d, t in calls)
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and all(0 < d <= total for d in dones)
    # total is the payload size: the file is the 40-byte header plus it
    assert os.path.getsize(p) == HEADER + total
    assert os.listdir(tmp_path) == ["big.exr"]
    assert os.stat(p).st_ino != old_ino  # replaced by rename, not rewritten
    b = ExperienceReplay.load(p)
    assert len(b) == len(big_buffer) and b._handles() == big_buffer._handles()
    h = big_buffer._handles()[-1]
    assert_arrays_equal(b.episode(h).state, big_buffer.episode(h).state, "state")
    # progress=None is accepted
    big_buffer.save(p, level=0, progress=None)


def test_save_progress_counts_payload_bytes_when_compressed(tmp_path):
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=4)
    zeros = np.zeros((1000, 84, 84), np.uint8)
    for _ in range(10):  # 70 MB of zero frames: deflates about 1000:1
        buf.record_many(None, zeros, np.zeros(1000, np.int64), np.zeros(1000, np.float32))
    calls = []
    buf.save(tmp_path / "z.exr", level=1, progress=lambda d, t: calls.append((d, t)))
    assert calls, "no progress call while saving 70 MB at level 1"
    assert calls[-1][0] >= calls[-1][1] // 2


def test_save_progress_exception_aborts(tmp_path, big_buffer):
    p = tmp_path / "big.exr"
    small_marked(3).save(p)
    before = p.read_bytes()

    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop(done)

    with pytest.raises(Stop):
        big_buffer.save(p, level=0, progress=progress)
    assert p.read_bytes() == before  # old file intact
    assert marker_of(ExperienceReplay.load(p)) == 3
    assert os.listdir(tmp_path) == ["big.exr"]  # no temp file left
    # the buffer is still usable, and a later save works
    big_buffer.save(p, level=0)
    assert len(ExperienceReplay.load(p)) == len(big_buffer)


def test_save_progress_not_callable(tmp_path):
    with pytest.raises(TypeError, match="progress"):
        ExperienceReplay((2,)).save(tmp_path / "x", progress=3)
    assert os.listdir(tmp_path) == []


REENTRY_SCRIPT = r"""
import json, pickle, sys
import numpy as np
import exreplay
from exreplay import ExperienceReplay
buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=1)
ps = buf.new_pick_selector(1)
f = np.zeros((1000, 84, 84), np.uint8)
for i in range(10):
    h = buf.record_many(None, f, np.zeros(1000, np.int64), np.zeros(1000, np.float32),
                        final_state=f[0])
log = exreplay.ExperienceLog(sys.argv[1] + ".xlog")
buf.attach_log(log)
results = {}
calls = [0]
def attempt(name, fn):
    try:
        fn()
        results[name] = "ok"
    except RuntimeError as e:
        results[name] = "RuntimeError"
    except Exception as e:
        results[name] = type(e).__name__ + ": " + str(e)
    sys.stdout.flush()
def progress(done, total):
    calls[0] += 1
    if calls[0] > 1:
        return
    attempt("len", lambda: len(buf))
    attempt("num_episodes", lambda: buf.num_episodes)
    attempt("num_picks", lambda: buf.num_picks)
    attempt("record", lambda: buf.record(None, f[0], 0, 0.0))
    attempt("record_many", lambda: buf.record_many(None, f[:2], [0, 0], [0.0, 0.0]))
    attempt("new_episode", lambda: buf.new_episode())
    attempt("get_batch", lambda: buf.get_batch(2, ps))
    attempt("set_priority", lambda: buf.set_priority(ps, [h], [0], [1.0]))
    attempt("episode", lambda: buf.episode(h))
    attempt("serialize", lambda: buf.serialize(0))
    attempt("save", lambda: buf.save(sys.argv[1] + ".other"))
    attempt("pickle", lambda: pickle.dumps(buf))
    attempt("new_pick_selector", lambda: buf.new_pick_selector(0))
    attempt("remove_pick_selector", lambda: buf.remove_pick_selector(ps))
    attempt("pick_selector", lambda: buf.pick_selector(ps))
    attempt("pick_selectors", lambda: buf.pick_selectors())
    attempt("beta_get", lambda: ps.beta)
    attempt("beta_set", lambda: setattr(ps, "beta", 0.5))
    attempt("alpha", lambda: ps.alpha)
    attempt("_handles", lambda: buf._handles())
    attempt("_picks", lambda: buf._picks())
    attempt("_priority", lambda: buf._priority(ps, [h], [0]))
    attempt("_gather", lambda: buf._gather(ps, [h], [0]))
    attempt("_check", lambda: buf._check())
    attempt("state_shape", lambda: buf.state_shape)
    attempt("repr", lambda: results.__setitem__("repr_text", repr(buf)))
    attempt("log_flush", lambda: log.flush())
    attempt("log_append", lambda: log.append(1, 0, f[0], 0, 0.0))
    attempt("log_close", lambda: log.close())
    attempt("detach_log", lambda: buf.detach_log())
    # another buffer is fine
    other = ExperienceReplay((2,))
    attempt("other_buffer", lambda: other.record(None, [0, 0], 0, 0.0))
buf.save(sys.argv[1], level=0, progress=progress)
# after the save, the buffer works again
assert len(buf) == 10000 and buf.get_batch(2, ps) is not None
assert buf.log is log and not log.closed
log.close()
print(json.dumps({"calls": calls[0], "results": results}))
"""


run_script = run_child


def test_progress_callback_reentry_raises_not_deadlocks(tmp_path):
    try:
        r = run_script(REENTRY_SCRIPT, str(tmp_path / "re.exr"), timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a call back into the buffer from save()'s progress callback deadlocked")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["calls"] >= 1
    res = out["results"]
    must_raise = ["len", "num_episodes", "num_picks", "record", "record_many", "new_episode",
                  "get_batch", "set_priority", "episode", "serialize", "save", "pickle",
                  "new_pick_selector", "remove_pick_selector", "pick_selector",
                  "pick_selectors", "beta_get", "beta_set",
                  "_handles", "_picks", "_priority", "_gather", "_check", "log_flush",
                  "log_append", "log_close", "detach_log"]
    bad = {k: res[k] for k in must_raise if res[k] != "RuntimeError"}
    assert not bad, bad
    assert res["state_shape"] == "ok"  # fixed attributes need no lock
    # repr reads the counts under the save's own hold (it used to take the
    # lock again: a hang, or a release of the save's hold)
    assert res["repr"] == "ok" and res["repr_text"].startswith("ExperienceReplay("), res
    assert res["other_buffer"] == "ok"
    assert res["alpha"] in ("ok", "RuntimeError")
    assert not os.path.exists(tmp_path / "re.exr.other")


def test_save_replaces_atomically_old_inode_readable(tmp_path):
    p = tmp_path / "r.exr"
    old = small_marked(1)
    old.save(p)
    fd = os.open(p, os.O_RDONLY)
    try:
        new = small_marked(2)
        new.save(p)
        # the old inode is untouched: its content is still the old buffer
        old_bytes = b""
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            old_bytes += chunk
    finally:
        os.close(fd)
    assert marker_of(ExperienceReplay.unserialize(old_bytes)) == 1
    assert marker_of(ExperienceReplay.load(p)) == 2
    assert os.listdir(tmp_path) == ["r.exr"]


def test_save_over_readonly_file_in_writable_dir(tmp_path):
    # rename replaces the name regardless of the old file's mode
    p = tmp_path / "ro.exr"
    small_marked(1).save(p)
    os.chmod(p, 0o444)
    small_marked(2).save(p)
    assert marker_of(ExperienceReplay.load(p)) == 2


def test_save_into_missing_directory(tmp_path):
    a = small_marked(1)
    with pytest.raises(FileNotFoundError) as ei:
        a.save(tmp_path / "nope" / "x.exr")
    assert isinstance(ei.value, OSError)
    assert "nope" in str(ei.value)
    assert not (tmp_path / "nope").exists()


def test_save_onto_a_directory(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(OSError):
        small_marked(1).save(tmp_path / "d")
    assert os.listdir(tmp_path) == ["d"]  # the temp file was removed


def test_load_missing(tmp_path):
    with pytest.raises(FileNotFoundError):
        ExperienceReplay.load(tmp_path / "missing.exr")
    with pytest.raises(FileNotFoundError):
        ExperienceReplay.load(str(tmp_path / "missing.exr"))


def test_load_directory(tmp_path):
    with pytest.raises(ValueError):
        ExperienceReplay.load(tmp_path)


@pytest.mark.parametrize("content", [b"", b"x", b"EXREPLAY", b"\0" * 40, b"\0" * 4096,
                                     b"not a replay buffer at all" * 100])
def test_load_garbage(tmp_path, content):
    p = tmp_path / "g.exr"
    p.write_bytes(content)
    with pytest.raises(ValueError):
        ExperienceReplay.load(p)


def test_load_truncated_and_extended_file(tmp_path):
    a, _, _ = build("cartpole")
    data = a.serialize(level=1)
    p = tmp_path / "t.exr"
    for cut in (len(data) - 1, len(data) // 2, HEADER + 1, HEADER, HEADER - 1, 1):
        p.write_bytes(data[:cut])
        with pytest.raises(ValueError):
            ExperienceReplay.load(p)
    p.write_bytes(data + b"\0")
    with pytest.raises(ValueError):
        ExperienceReplay.load(p)


def test_load_path_types():
    """A path that is none, or holds a NUL, is refused naming `path` (they
    were os.fsencode's bare "expected str, bytes or os.PathLike object, not
    int" and "embedded null byte"), and the log's path the same way."""
    want = r"^path: expected a path \(str, bytes or os.PathLike\), got "
    with pytest.raises(TypeError, match=want + "int$"):
        ExperienceReplay.load(3)
    with pytest.raises(TypeError, match=want + "NoneType$"):
        ExperienceReplay((2,)).save(None)
    with pytest.raises(TypeError, match=want + "int$"):
        exreplay.ExperienceLog(3, state_shape=(2,))
    nul = r"^path: expected a path without a NUL character, got 'a\\x00b'$"
    with pytest.raises(ValueError, match=nul):
        ExperienceReplay.load("a\0b")
    with pytest.raises(ValueError, match=nul):
        ExperienceReplay((2,)).save("a\0b")
    with pytest.raises(ValueError, match=nul):
        exreplay.ExperienceLog("a\0b", state_shape=(2,))
    with pytest.raises(ValueError, match=nul):  # the readers name it too
        exreplay.log.info("a\0b")
    # a lone surrogate was called a NUL (UnicodeEncodeError is a ValueError)
    enc = r"^path: expected a path the file system encoding can encode, got 'a\\ud800b'$"
    for call in (ExperienceReplay.load, ExperienceReplay((2,)).save, exreplay.log.info,
                 lambda p: exreplay.ExperienceLog(p, state_shape=(2,))):
        with pytest.raises(ValueError, match=enc):
            call("a\ud800b")


# ---- hostile input: truncation and byte flips ----------------------------------


def small_buffer():
    """A small buffer that still has every section populated."""
    b = ExperienceReplay((2,), state_dtype="float32", capacity=40, eviction="second_chance",
                         pick_len=2, allow_short=True, seed=3)
    u = b.new_pick_selector(U)
    pr = b.new_pick_selector(P)
    b.record_many(None, np.ones((3, 2)), [1, 2, 3], [0.5, 0.5, 0.5], final_state=[9, 9])
    b.new_episode()
    b.record_many(None, np.ones((4, 2)), [1, 2, 3, 4], [1, 2, 3, 4], priorities=[1, 2, 0, 3])
    b.get_batch(2, u)
    b.get_batch(2, pr)
    return b


def test_every_truncation_is_refused():
    b = small_buffer()
    for level in (0, 6):
        data = b.serialize(level)
        for n in range(len(data)):
            with pytest.raises(ValueError):
                ExperienceReplay.unserialize(data[:n])


def test_every_byte_flip_is_refused_by_the_checksums():
    data = small_buffer().serialize(0)
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            m = bytearray(data)
            m[i] ^= mask
            with pytest.raises(ValueError):
                ExperienceReplay.unserialize(bytes(m))


def fix_crcs(m):
    """Recomputes the payload crc32 (header 32..35) and the header crc
    (36..39, of bytes 0..35) of a level-0 buffer, in place."""
    struct.pack_into("<I", m, 32, zlib.crc32(bytes(m[HEADER:])))
    struct.pack_into("<I", m, 36, zlib.crc32(bytes(m[:36])))
    return bytes(m)


def exercise(buf):
    """Whatever a hostile input yields must be a consistent buffer."""
    assert buf._check() is None
    len(buf), buf.num_picks
    for h in buf._handles():
        buf.episode(h)
    e, p = buf._picks()
    for h in range(8):
        try:
            buf.get_batch(4, h)
        except ValueError:
            pass
    buf.record(None, np.zeros(buf.state_shape, buf.state_dtype),
               np.zeros(buf.action_shape, buf.action_dtype), 0.0)
    buf.serialize(0)


def test_every_byte_flip_with_checksums_fixed():
    b = small_buffer()
    data = b.serialize(0)
    accepted = 0
    for i in range(len(data)):
        if i in range(32, 40):
            continue  # the checksums themselves
        for mask in (0x01, 0x80, 0xFF):
            m = bytearray(data)
            m[i] ^= mask
            try:
                c = ExperienceReplay.unserialize(fix_crcs(m))
            except ValueError:
                continue
            accepted += 1
            assert i >= HEADER  # the header has no free bits
            exercise(c)
    # data bytes (states, rewards, ...) may change without breaking anything
    assert accepted > 0


# ---- hostile input: crafted payloads with the checksums fixed up ------------------

SEC_CONFIG, SEC_META, SEC_EPISODES, SEC_PICKS, SEC_SELECTORS, SEC_END = range(1, 7)


class Layout:
    """Offsets (in the whole level-0 buffer) of every field: see docs/format.md."""

    def __init__(self, data):
        d = self.d = bytes(data)
        assert d[:8] == b"EXREPLAY" and struct.unpack_from("<I", d, 12)[0] == 0
        o = HEADER
        self.sections = {}
        for tag in range(1, 7):
            t, z, ln = struct.unpack_from("<IIQ", d, o)
            assert t == tag and z == 0
            self.sections[tag] = (o, o + 16, ln)
            o += 16 + ln
        assert o == len(d)
        self.cfg = self.sections[SEC_CONFIG][1]
        sb, ab, rb, cap, L = struct.unpack_from("<QQQQI", d, self.cfg)
        short = d[self.cfg + 36]
        self.state_bytes = sb
        self.next_handle = struct.unpack_from("<q", d, self.cfg + 48)[0]
        self.next_sel = struct.unpack_from("<q", d, self.cfg + 56)[0]
        self.hand = struct.unpack_from("<q", d, self.cfg + 64)[0]
        self.meta = self.sections[SEC_META][1]
        o = self.sections[SEC_EPISODES][1]
        (count,) = struct.unpack_from("<Q", d, o)
        self.ep_count_at = o
        o += 8
        self.episodes = []  # dicts of offsets
        for _ in range(count):
            h, n = struct.unpack_from("<qQ", d, o)
            ended, term, sampled, has_final = d[o + 16:o + 20]
            c = n if ended else max(n - 1, 0)
            m = c if (ended and short) else max(c - L + 1, 0)
            e = dict(at=o, handle=h, n=n, m=m, ended=ended, final=has_final)
            o += 24
            e["final_at"] = o
            o += sb if has_final else 0
            # n rows of state|action|reward; the *_at offsets are row 0's fields
            e["rows_at"] = e["states_at"] = o
            e["actions_at"] = o + sb
            e["rewards_at"] = o + sb + ab
            o += n * (sb + ab + rb)
            e["aux_at"] = o
            o += 4 * (n - m)
            self.episodes.append(e)
        assert o == self.sections[SEC_PICKS][0]
        o = self.sections[SEC_PICKS][1]
        (npicks,) = struct.unpack_from("<Q", d, o)
        self.pick_count_at = o
        self.picks_at = o + 8
        self.picks = [struct.unpack_from("<II", d, o + 8 + 8 * i) for i in range(npicks)]
        o = self.sections[SEC_SELECTORS][1]
        (nsel,) = struct.unpack_from("<Q", d, o)
        self.sel_count_at = o
        o += 8
        self.sels = []
        for _ in range(nsel):
            h, kind, np_ = struct.unpack_from("<qII", d, o)
            s = dict(at=o, handle=h, kind=kind, nparams=np_, rng_at=o + 16, params_at=o + 56)
            o += 56 + 8 * np_
            s["slen_at"] = o
            (slen,) = struct.unpack_from("<Q", d, o)
            o += 8
            s["state_at"] = o
            s["slen"] = slen
            o += slen
            self.sels.append(s)
        assert o == self.sections[SEC_END][0]

    def sel_of_kind(self, kind):
        return next(s for s in self.sels if s["kind"] == kind)


def crafted_source():
    """A level-0 buffer with every kind of content: a second-chance hand,
    empty and ended episodes, pending priorities, both selector kinds."""
    b = ExperienceReplay((2,), capacity=30, eviction="second_chance", pick_len=2, seed=3)
    u = b.new_pick_selector(U)
    pr = b.new_pick_selector(P)
    b.remove_pick_selector(b.new_pick_selector(U))
    b.new_pick_selector(P, alpha=0.5)
    for i in range(8):
        b.record_many(None, np.full((4, 2), i), [1, 2, 3, 4], [1, 2, 3, 4],
                      final_state=[i, i] if i % 2 else None, terminated=i % 3 == 0,
                      priorities=[1, 2, 0, 3])
        b.get_batch(2, u)
        b.get_batch(2, pr)
    b.new_episode()
    b.record_many(None, np.ones((3, 2)), [1, 2, 3], [1, 2, 3], priorities=[4, 5, 6])  # open
    return b


@pytest.fixture(scope="module")
def src():
    b = crafted_source()
    data = b.serialize(0)
    lay = Layout(data)
    # the source must exercise what the cases patch
    assert lay.hand >= 0 and lay.episodes and lay.picks and len(lay.sels) == 3
    assert any(e["n"] == 0 for e in lay.episodes)
    assert any(e["n"] > e["m"] for e in lay.episodes)
    assert any(e["final"] for e in lay.episodes)
    return b, data, lay


def patched(data, patches, *, resize=True):
    """patches: (offset, bytes) or (offset, bytes, delete_len) applied in
    order of decreasing offset; header lengths and both CRCs are fixed up."""
    m = bytearray(data)
    for p in sorted(patches, key=lambda p: -p[0]):
        off, new = p[0], p[1]
        dl = p[2] if len(p) > 2 else len(new)
        m[off:off + dl] = new
    if resize:
        n = len(m) - HEADER
        struct.pack_into("<QQ", m, 16, n, n)
    return fix_crcs(m)


def q(v):
    return struct.pack("<q", v) if v < 2**63 else struct.pack("<Q", v)


def u64(v):
    return struct.pack("<Q", v)


def u32(v):
    return struct.pack("<I", v)


def f64(v):
    return struct.pack("<d", v)


def f32(v):
    return struct.pack("<f", v)


def meta_bytes(state_shape=(2,), action_shape=(), dtypes=("<f4", "<i8", "<f4"), seed_none=0,
               version=1, extra=b""):
    out = bytes([version])
    for shape in (state_shape, action_shape):
        out += bytes([len(shape)]) + b"".join(q(d) for d in shape)
    for dt in dtypes:
        dt = dt.encode() if isinstance(dt, str) else dt
        out += bytes([len(dt)]) + dt
    return out + bytes([seed_none]) + extra


def with_meta(data, lay, meta):
    o, c, ln = lay.sections[SEC_META]
    return patched(data, [(o + 8, u64(len(meta))), (c, meta, ln)])


def sec_len(lay, tag, delta):
    o, c, ln = lay.sections[tag]
    return [(o + 8, u64(ln + delta))]


def cases(data, lay):
    """name -> crafted bytes; every one must be refused with ValueError."""
    e0, e1 = lay.episodes[0], lay.episodes[1]
    last = lay.episodes[-1]
    ep_m = next(e for e in lay.episodes if e["m"] > 0)
    ep_aux = next(e for e in lay.episodes if e["n"] > e["m"])
    ps = lay.sel_of_kind(P)
    us = lay.sel_of_kind(U)
    cfg, o_cfg = lay.cfg, lay.sections[SEC_CONFIG][0]
    live = {e["handle"] for e in lay.episodes}
    dead = next(h for h in range(lay.next_handle) if h not in live)
    ord_m = lay.episodes.index(ep_m)
    c = {}
    # header
    c["magic"] = patched(data, [(0, b"EXREPLAX")])
    c["version 3"] = patched(data, [(8, u32(3))])
    c["version 0"] = patched(data, [(8, u32(0))])
    c["codec 2"] = patched(data, [(12, u32(2))])
    c["codec zlib on stored body"] = patched(data, [(12, u32(1))])
    c["raw_len != body_len stored"] = patched(data, [(16, u64(len(data) - HEADER + 8))], resize=False)
    c["body_len too small"] = patched(data, [(24, u64(len(data) - HEADER - 1))], resize=False)
    c["body_len huge"] = patched(data, [(24, u64(2**63))], resize=False)
    c["trailing bytes"] = patched(data, [(len(data), b"\0" * 8)])
    c["trailing END-like section"] = patched(data, [(len(data), u32(6) + u32(0) + u64(0))])
    c["payload shorter than raw_len"] = patched(data, [(16, u64(len(data) - HEADER + 16))],
                                                resize=False) + b""
    # section framing
    c["section reserved"] = patched(data, [(o_cfg + 4, u32(1))])
    c["section tag"] = patched(data, [(o_cfg, u32(SEC_META))])
    c["config len 72"] = patched(data, sec_len(lay, SEC_CONFIG, -8))
    c["meta len huge"] = patched(data, sec_len(lay, SEC_META, 2**62))
    c["meta len 4097"] = patched(data, [(lay.sections[SEC_META][0] + 8, u64(4097))])
    c["episodes len +8"] = patched(data, sec_len(lay, SEC_EPISODES, 8))
    c["episodes len -8"] = patched(data, sec_len(lay, SEC_EPISODES, -8))
    c["episodes len huge"] = patched(data, sec_len(lay, SEC_EPISODES, 2**62))
    c["picks len +8"] = patched(data, sec_len(lay, SEC_PICKS, 8))
    c["selectors len +8"] = patched(data, sec_len(lay, SEC_SELECTORS, 8))
    c["selectors len -8"] = patched(data, sec_len(lay, SEC_SELECTORS, -8))
    c["end len 8"] = patched(data, [(lay.sections[SEC_END][0] + 8, u64(8)), (len(data), u64(0))])
    c["end tag 7"] = patched(data, [(lay.sections[SEC_END][0], u32(7))])
    c["end missing"] = patched(data, [(lay.sections[SEC_END][0], b"", 16)])
    c["sections swapped"] = patched(
        data, [(lay.sections[SEC_PICKS][0], b"", lay.sections[SEC_SELECTORS][0] -
                lay.sections[SEC_PICKS][0]),
               (lay.sections[SEC_END][0], data[lay.sections[SEC_PICKS][0]:
                                               lay.sections[SEC_SELECTORS][0]])])
    # config
    c["state_bytes 0"] = patched(data, [(cfg, u64(0))])
    c["state_bytes huge"] = patched(data, [(cfg, u64(2**41))])
    c["state_bytes 2**64-1"] = patched(data, [(cfg, u64(2**64 - 1))])
    c["action_bytes huge"] = patched(data, [(cfg + 8, u64(2**41))])
    c["reward_bytes 3"] = patched(data, [(cfg + 16, u64(3))])
    c["reward_bytes 0"] = patched(data, [(cfg + 16, u64(0))])
    c["capacity below records"] = patched(data, [(cfg + 24, u64(5))])
    c["pick_len 0"] = patched(data, [(cfg + 32, u32(0))])
    c["pick_len 2**20+1"] = patched(data, [(cfg + 32, u32(2**20 + 1))])
    c["allow_short 2"] = patched(data, [(cfg + 36, b"\x02")])
    c["eviction 2"] = patched(data, [(cfg + 37, b"\x02")])
    c["eviction 255"] = patched(data, [(cfg + 37, b"\xff")])
    c["config reserved 38"] = patched(data, [(cfg + 38, b"\x01")])
    c["config reserved 39"] = patched(data, [(cfg + 39, b"\x80")])
    c["config reserved 72"] = patched(data, [(cfg + 72, u64(1))])
    c["config reserved 79"] = patched(data, [(cfg + 79, b"\x01")])
    c["next_handle negative"] = patched(data, [(cfg + 48, q(-1))])
    c["next_handle = last handle"] = patched(data, [(cfg + 48, q(last["handle"]))])
    c["next_sel negative"] = patched(data, [(cfg + 56, q(-5))])
    c["next_sel = last selector"] = patched(data, [(cfg + 56, q(lay.sels[-1]["handle"]))])
    c["hand not live"] = patched(data, [(cfg + 64, q(dead))])
    c["hand >= next_handle"] = patched(data, [(cfg + 64, q(lay.next_handle))])
    c["hand -2"] = patched(data, [(cfg + 64, q(-2))])
    c["hand int64 min"] = patched(data, [(cfg + 64, q(-(2**63)))])
    # episodes
    c["episode count huge"] = patched(data, [(lay.ep_count_at, u64(2**62))])
    c["episode count 2**64-1"] = patched(data, [(lay.ep_count_at, u64(2**64 - 1))])
    c["episode count +1"] = patched(data, [(lay.ep_count_at, u64(len(lay.episodes) + 1))])
    c["episode count -1"] = patched(data, [(lay.ep_count_at, u64(len(lay.episodes) - 1))])
    c["episode n huge"] = patched(data, [(e0["at"] + 8, u64(2**40))])
    c["episode n 2**64-1"] = patched(data, [(e0["at"] + 8, u64(2**64 - 1))])
    c["episode n 2**32-2"] = patched(data, [(e0["at"] + 8, u64(2**32 - 2))])  # too long for the bytes
    c["episode n 2**32-1"] = patched(data, [(e0["at"] + 8, u64(2**32 - 1))])
    c["episode n +1"] = patched(data, [(ep_m["at"] + 8, u64(ep_m["n"] + 1))])
    c["handles not increasing"] = patched(data, [(e1["at"], q(e0["handle"]))])
    c["handles decreasing"] = patched(data, [(e1["at"], q(e0["handle"] - 1))])
    c["handle negative"] = patched(data, [(e0["at"], q(-1))])
    c["handle >= next_handle"] = patched(data, [(last["at"], q(lay.next_handle))])
    c["handle int64 max"] = patched(data, [(last["at"], q(2**63 - 1))])
    c["ended 2"] = patched(data, [(e0["at"] + 16, b"\x02")])
    c["terminated 2"] = patched(data, [(e0["at"] + 17, b"\x02")])
    c["sampled 2"] = patched(data, [(e0["at"] + 18, b"\x02")])
    c["has_final 2"] = patched(data, [(e0["at"] + 19, b"\x02")])
    c["open but terminated"] = patched(data, [(last["at"] + 16, b"\x00\x01")])
    op = next(e for e in lay.episodes if not e["ended"])
    c["open with final"] = patched(data, [(op["at"] + 19, b"\x01"),
                                          (op["final_at"], b"\0" * lay.state_bytes, 0)])
    c["episode reserved"] = patched(data, [(e0["at"] + 20, b"\x01")])
    c["episode reserved 23"] = patched(data, [(e0["at"] + 23, b"\x01")])
    c["pending priority negative"] = patched(data, [(ep_aux["aux_at"], f32(-1.0))])
    c["pending priority inf"] = patched(data, [(ep_aux["aux_at"], f32(math.inf))])
    c["pending priority -inf"] = patched(data, [(ep_aux["aux_at"], f32(-math.inf))])
    # picks
    c["pick count +1"] = patched(data, [(lay.pick_count_at, u64(len(lay.picks) + 1))])
    c["pick count +1, len +8"] = patched(
        data, sec_len(lay, SEC_PICKS, 8) + [(lay.pick_count_at, u64(len(lay.picks) + 1)),
                                            (lay.sections[SEC_SELECTORS][0], lay.picks[0] and
                                             struct.pack("<II", *lay.picks[0]), 0)])
    c["pick count -1"] = patched(data, [(lay.pick_count_at, u64(len(lay.picks) - 1))])
    c["pick count -1, len -8"] = patched(
        data, sec_len(lay, SEC_PICKS, -8) + [(lay.pick_count_at, u64(len(lay.picks) - 1)),
                                             (lay.picks_at, b"", 8)])
    c["pick count huge"] = patched(data, [(lay.pick_count_at, u64(2**61))])
    c["pick episode ordinal out of range"] = patched(data, [(lay.picks_at, u32(len(lay.episodes)))])
    c["pick episode ordinal 2**32-1"] = patched(data, [(lay.picks_at, u32(2**32 - 1))])
    c["duplicate pick"] = patched(data, [(lay.picks_at + 8, struct.pack("<II", *lay.picks[0]))])
    c["pick pos >= m"] = patched(data, [(lay.picks_at, struct.pack("<II", ord_m, ep_m["m"]))])
    c["pick pos 2**32-1"] = patched(data, [(lay.picks_at + 4, u32(2**32 - 1))])
    c["pick to empty episode"] = patched(
        data, [(lay.picks_at, struct.pack("<II", next(i for i, e in enumerate(lay.episodes)
                                                      if e["n"] == 0), 0))])
    # selectors
    c["selector count huge"] = patched(data, [(lay.sel_count_at, u64(2**60))])
    c["selector count +1"] = patched(data, [(lay.sel_count_at, u64(len(lay.sels) + 1))])
    c["selector count -1"] = patched(data, [(lay.sel_count_at, u64(len(lay.sels) - 1))])
    c["selector handles not increasing"] = patched(data, [(lay.sels[1]["at"], q(lay.sels[0]["handle"]))])
    c["selector handle >= next_sel"] = patched(data, [(lay.sels[-1]["at"], q(lay.next_sel))])
    c["selector handle negative"] = patched(data, [(lay.sels[0]["at"], q(-1))])
    c["unknown selector kind 2"] = patched(data, [(us["at"] + 8, u32(2))])
    c["unknown selector kind 2**32-1"] = patched(data, [(ps["at"] + 8, u32(2**32 - 1))])
    c["uniform as prioritized"] = patched(data, [(us["at"] + 8, u32(P))])
    c["prioritized as uniform"] = patched(data, [(ps["at"] + 8, u32(U))])
    c["nparams 0 for prioritized"] = patched(data, [(ps["at"] + 12, u32(0))])
    c["nparams 3 for prioritized"] = patched(data, [(ps["at"] + 12, u32(3))])
    c["nparams 2 for uniform"] = patched(data, [(us["at"] + 12, u32(2))])
    c["nparams huge"] = patched(data, [(ps["at"] + 12, u32(2**32 - 1))])
    c["rng all zero"] = patched(data, [(ps["rng_at"], b"\0" * 32)])
    c["rng all zero (uniform)"] = patched(data, [(us["rng_at"], b"\0" * 32)])
    c["selector reserved"] = patched(data, [(ps["at"] + 48, u64(1))])
    c["selector reserved 55"] = patched(data, [(us["at"] + 55, b"\x01")])
    for v, nm in ((-0.5, "negative"), (math.nan, "NaN"), (math.inf, "inf"), (-math.inf, "-inf")):
        c[f"alpha {nm}"] = patched(data, [(ps["params_at"], f64(v))])
        c[f"beta {nm}"] = patched(data, [(ps["params_at"] + 8, f64(v))])
    c["state len +4"] = patched(data, [(ps["slen_at"], u64(ps["slen"] + 4))])
    c["state len -4"] = patched(data, [(ps["slen_at"], u64(ps["slen"] - 4))])
    c["state len huge"] = patched(data, [(ps["slen_at"], u64(2**62))])
    c["uniform state len 8"] = patched(data, [(us["slen_at"], u64(8)), (us["state_at"], u64(0), 0)])
    for v, nm in ((0.5, "0.5"), (0.0, "0"), (-1.0, "-1"), (math.nan, "NaN"), (math.inf, "inf")):
        c[f"max_prio {nm}"] = patched(data, [(ps["state_at"], f64(v))])
    for v, nm in ((math.nan, "NaN"), (-1.0, "negative"), (-0.0 - 1e-30, "tiny negative"),
                  (math.inf, "inf"), (-math.inf, "-inf")):
        c[f"leaf {nm}"] = patched(data, [(ps["state_at"] + 8, f32(v))])
        c[f"last leaf {nm}"] = patched(data, [(ps["state_at"] + ps["slen"] - 4, f32(v))])
    # metadata (the binding's META section)
    base_meta = dict(state_shape=(2,), action_shape=(), dtypes=("<f4", "<i8", "<f4"))
    assert meta_bytes(**base_meta) == data[lay.meta:lay.meta + lay.sections[SEC_META][2]]
    c["meta state dtype O"] = with_meta(data, lay, meta_bytes((1,), (), ("|O", "<i8", "<f4")))
    c["meta state dtype O8"] = with_meta(data, lay, meta_bytes((1,), (), ("|O8", "<i8", "<f4")))
    c["meta state dtype c16"] = with_meta(data, lay, meta_bytes((), (), ("<c16", "<i8", "<f4")))
    c["meta state dtype c8"] = with_meta(data, lay, meta_bytes((1,), (), ("<c8", "<i8", "<f4")))
    c["meta state dtype m8"] = with_meta(data, lay, meta_bytes((1,), (), ("<m8", "<i8", "<f4")))
    c["meta state dtype M8"] = with_meta(data, lay, meta_bytes((1,), (), ("<M8", "<i8", "<f4")))
    c["meta state dtype S8"] = with_meta(data, lay, meta_bytes((1,), (), ("|S8", "<i8", "<f4")))
    c["meta state dtype V8"] = with_meta(data, lay, meta_bytes((1,), (), ("|V8", "<i8", "<f4")))
    c["meta state dtype U2"] = with_meta(data, lay, meta_bytes((1,), (), ("<U2", "<i8", "<f4")))
    c["meta state dtype struct"] = with_meta(
        data, lay, meta_bytes((1,), (), ("[('a','<f4'),('b','<f4')]", "<i8", "<f4")))
    c["meta state dtype name"] = with_meta(data, lay, meta_bytes(**{**base_meta, "dtypes": (
        "float32", "<i8", "<f4")}))
    c["meta state dtype empty"] = with_meta(data, lay, meta_bytes(**{**base_meta, "dtypes": (
        "", "<i8", "<f4")}))
    c["meta state dtype code"] = with_meta(data, lay, meta_bytes(**{**base_meta, "dtypes": (
        "<f4,__import__('os').system('true')", "<i8", "<f4")}))
    c["meta reward dtype i4"] = with_meta(data, lay, meta_bytes(**{**base_meta, "dtypes": (
        "<f4", "<i8", "<i4")}))
    c["meta reward dtype f8 (size mismatch)"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "dtypes": ("<f4", "<i8", "<f8")}))
    c["meta action dtype f4 (size mismatch)"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "dtypes": ("<f4", "<f4", "<f4")}))
    c["meta state shape mismatch"] = with_meta(data, lay, meta_bytes(**{**base_meta,
                                                                        "state_shape": (3,)}))
    c["meta state shape 0"] = with_meta(data, lay, meta_bytes(**{**base_meta,
                                                                 "state_shape": (2, 0)}))
    c["meta state shape negative"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "state_shape": (-2, -1)}))
    c["meta state shape overflow"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "state_shape": (2**40, 2**40, 2**40, 2**40, 2)}))
    c["meta state nd 200"] = with_meta(data, lay, bytes([1, 200]) + b"\x02" * 100)
    c["meta state nd 63"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "state_shape": (2,) + (1,) * 62}))
    c["meta action shape mismatch"] = with_meta(data, lay, meta_bytes(**{
        **base_meta, "action_shape": (2,)}))
    c["meta version 2"] = with_meta(data, lay, meta_bytes(**base_meta, version=2))
    c["meta seed_none 2"] = with_meta(data, lay, meta_bytes(**base_meta, seed_none=2))
    c["meta trailing byte"] = with_meta(data, lay, meta_bytes(**base_meta, extra=b"\0"))
    c["meta truncated"] = with_meta(data, lay, meta_bytes(**base_meta)[:-1])
    c["meta empty"] = with_meta(data, lay, b"")
    return c


# What refusing a crafted payload may make the process hold at its peak:
# the input is a few KB; anything near what its fields claim (up to 2**64
# bytes) would be far above this.
CRAFTED_PEAK_BYTES = 32 << 20


def test_crafted_payloads_are_refused(src):
    b, data, lay = src
    # sanity: the helpers reproduce the input exactly when nothing changes
    assert patched(data, []) == data
    assert_same(b, ExperienceReplay.unserialize(patched(data, [])), {0: U, 1: P, 3: P})
    # and a harmless edit of a data byte is accepted (so the CRC fix-up works)
    e = next(e for e in lay.episodes if e["n"])
    ok = ExperienceReplay.unserialize(patched(data, [(e["rewards_at"], f32(42.0))]))
    assert ok.episode(e["handle"]).reward[0] == 42.0
    failures = {}
    for name, bad in cases(data, lay).items():
        grew, ex = memwatch.peak_growth(lambda: ExperienceReplay.unserialize(bad))
        if ex is None:
            failures[name] = "accepted"
        elif not isinstance(ex, ValueError):  # MemoryError, SystemError, ...
            failures[name] = repr(ex)
        # refused before allocating for what the input only claims
        if grew is not None and grew > CRAFTED_PEAK_BYTES:
            failures[name] = f"resident memory peaked {grew / 2**20:.0f} MiB higher"
    assert not failures, failures


def test_crafted_payloads_through_load(src, tmp_path):
    """The file reader applies the same validation."""
    _, data, lay = src
    p = tmp_path / "c.exr"
    for name, bad in list(cases(data, lay).items())[::5]:
        p.write_bytes(bad)
        with pytest.raises(ValueError):
            ExperienceReplay.load(p)


def test_decompression_bomb_is_refused_without_inflating_it():
    """Refused with ValueError, the resident memory never rising anywhere
    near what the header claims (bounds on bytes, not seconds)."""
    b = small_buffer()
    data = bytearray(b.serialize(6))
    body = len(data) - HEADER
    for raw in (2**60, 2**64 - 1, 1032 * body + 1, 1032 * body, 1032 * body - 1, 2**40):
        m = bytearray(data)
        struct.pack_into("<Q", m, 16, raw)
        struct.pack_into("<I", m, 36, zlib.crc32(bytes(m[:36])))
        grew, ex = memwatch.peak_growth(lambda: ExperienceReplay.unserialize(bytes(m)))
        assert isinstance(ex, ValueError), repr(ex)
        assert grew is None or grew <= CRAFTED_PEAK_BYTES, (raw, grew)
    # a real bomb: a tiny zlib body that inflates to 256 MiB of zeros, with
    # raw_len claiming exactly that and the payload crc right
    zeros = zlib.compressobj(9)
    comp = b""
    crc = 0
    chunk = b"\0" * (1 << 20)
    for _ in range(256):
        comp += zeros.compress(chunk)
        crc = zlib.crc32(chunk, crc)
    comp += zeros.flush()
    raw = 256 << 20
    hdr = bytearray(b"EXREPLAY" + u32(1) + u32(1) + u64(raw) + u64(len(comp)) + u32(crc) + u32(0))
    struct.pack_into("<I", hdr, 36, zlib.crc32(bytes(hdr[:36])))
    grew, ex = memwatch.peak_growth(lambda: ExperienceReplay.unserialize(bytes(hdr) + comp))
    assert isinstance(ex, ValueError), repr(ex)
    assert grew is None or grew <= CRAFTED_PEAK_BYTES, grew  # not the 256 MiB it claims


def test_compressed_crafted_payloads_are_refused(src):
    """The same crafted payloads, deflated and with a correct zlib header:
    the zlib reader must validate exactly like the stored one."""
    _, data, lay = src
    failures = {}
    for name, bad in list(cases(data, lay).items()):
        if struct.unpack_from("<I", bad, 12)[0] != 0 or struct.unpack_from("<Q", bad, 16)[0] != \
                len(bad) - HEADER or struct.unpack_from("<Q", bad, 24)[0] != len(bad) - HEADER:
            continue  # header cases
        payload = bad[HEADER:]
        comp = zlib.compress(payload, 6)
        hdr = bytearray(bad[:HEADER])
        struct.pack_into("<IQQ", hdr, 12, 1, len(payload), len(comp))
        struct.pack_into("<I", hdr, 36, zlib.crc32(bytes(hdr[:36])))
        try:
            ExperienceReplay.unserialize(bytes(hdr) + comp)
            failures[name] = "accepted"
        except ValueError:
            pass
        except BaseException as ex:
            failures[name] = repr(ex)
    assert not failures, failures


def test_zlib_stream_edge_cases(src):
    b, data, _ = src
    payload = data[HEADER:]

    def wrap(comp, raw_len=len(payload), crc=None):
        hdr = bytearray(data[:HEADER])
        struct.pack_into("<IQQ", hdr, 12, 1, raw_len, len(comp))
        if crc is not None:
            struct.pack_into("<I", hdr, 32, crc)
        struct.pack_into("<I", hdr, 36, zlib.crc32(bytes(hdr[:36])))
        return bytes(hdr) + comp

    good = zlib.compress(payload, 6)
    assert_same(b, ExperienceReplay.unserialize(wrap(good)), {0: U, 1: P, 3: P})
    bad = {
        "garbage after stream": wrap(good + b"\0"),
        "second stream": wrap(good + zlib.compress(b"x")),
        "stream with more payload": wrap(zlib.compress(payload + b"\0" * 16)),
        "stream with less payload": wrap(zlib.compress(payload[:-1])),
        "raw_len too small": wrap(good, raw_len=len(payload) - 1),
        "raw_len too large": wrap(good, raw_len=len(payload) + 1),
        "raw deflate (no zlib header)": wrap(good[2:-4]),
        "bad adler": wrap(good[:-1] + bytes([good[-1] ^ 1])),
        "no end of stream": wrap(zlib.compressobj(6).compress(payload) +
                                 zlib.compressobj(6).flush(zlib.Z_SYNC_FLUSH)),
        "empty body": wrap(b"", raw_len=0),
        "crc wrong": wrap(good, crc=zlib.crc32(payload) ^ 1),
    }
    for name, d in bad.items():
        with pytest.raises(ValueError):
            ExperienceReplay.unserialize(d)


def test_next_handles_at_int64_limits_after_load(src):
    """A payload may declare next_handle / next_sel up to 2**63 - 1: a buffer
    loaded from it must refuse to hand out a handle it cannot represent
    rather than overflow (signed overflow is undefined behaviour)."""
    _, data, lay = src
    cfg = lay.cfg
    for off in (48, 56):
        try:
            buf = ExperienceReplay.unserialize(patched(data, [(cfg + off, q(2**63 - 1))]))
        except ValueError:
            continue  # refusing such a payload is fine too
        if off == 48:
            handles = []
            for _ in range(2):
                try:
                    handles.append(buf.new_episode())
                except (OverflowError, MemoryError, ValueError):
                    break
            assert all(h >= 0 for h in handles), handles
        else:
            sels = []
            for _ in range(2):
                try:
                    sels.append(int(buf.new_pick_selector(U)))
                except (OverflowError, MemoryError, ValueError):
                    break
            assert all(h >= 0 for h in sels), sels


def test_ended_episode_without_final_state_nor_terminal_is_refused():
    b = ExperienceReplay((2,), seed=0, capacity=None)
    b.record_many(None, np.ones((3, 2)), [1, 2, 3], [1, 2, 3], final_state=[5, 5])
    data = b.serialize(0)
    lay = Layout(data)
    e = lay.episodes[0]
    assert e["ended"] and e["final"]
    bad = patched(data, sec_len(lay, SEC_EPISODES, -lay.state_bytes) +
                  [(e["at"] + 19, b"\x00"), (e["final_at"], b"", lay.state_bytes)])
    with pytest.raises(ValueError):
        ExperienceReplay.unserialize(bad)


# ---- the GIL -----------------------------------------------------------------------


def _count_while(fn):
    """Runs fn() while another thread spins; returns (result, iterations the
    spinner made while fn was running)."""
    stop = threading.Event()
    inside = [False]
    count = [0]

    def spin():
        while not stop.is_set():
            if inside[0]:
                count[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    time.sleep(0.01)  # let the spinner start and reach its loop
    inside[0] = True
    try:
        result = fn()
    finally:
        inside[0] = False
        stop.set()
        t.join()
    return result, count[0]


@pytest.fixture(scope="module")
def medium_buffer():
    """~20 MB of random frames: about 0.3 s to deflate at level 1."""
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=4)
    frames = np.random.default_rng(0).integers(0, 256, (1000, 84, 84), dtype=np.uint8)
    for i in range(3):
        buf.record_many(None, frames, np.zeros(1000, np.int64), np.zeros(1000, np.float32))
    return buf


def test_gil_released_during_serialize_save_load(medium_buffer, tmp_path):
    buf = medium_buffer
    data, n = _count_while(lambda: buf.serialize(level=1))
    assert n > 0, "serialize held the GIL throughout"
    _, n = _count_while(lambda: ExperienceReplay.unserialize(data))
    assert n > 0, "unserialize held the GIL throughout"
    p = tmp_path / "g.exr"
    _, n = _count_while(lambda: buf.save(p, level=1))
    assert n > 0, "save held the GIL throughout"
    _, n = _count_while(lambda: ExperienceReplay.load(p))
    assert n > 0, "load held the GIL throughout"


def save_temp_open(directory, name):
    """Whether this process holds a file open in directory other than name:
    save()'s temp file, unnamed (O_TMPFILE: "dir/#123 (deleted)") or named
    ".name.PID.XXXXXX" where the file system has no O_TMPFILE."""
    prefix = os.path.realpath(directory) + "/"
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix) and target[len(prefix):] != name:
            return True
    return False


def test_other_thread_runs_during_save(medium_buffer, tmp_path):
    """Stronger than counting: the other thread sees save()'s temp file
    open, which it is only while save() runs."""
    seen = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            if save_temp_open(tmp_path, "w.exr"):
                seen.append(os.listdir(tmp_path))
                return

    t = threading.Thread(target=watch)
    t.start()
    try:
        medium_buffer.save(tmp_path / "w.exr", level=1)
    finally:
        stop.set()
        t.join()
    assert seen, "no other thread ran while save() wrote its temp file"
    assert os.listdir(tmp_path) == ["w.exr"]


def test_serialize_concurrent_with_record():
    """serialize in one thread while others record and sample: every
    snapshot is a consistent buffer."""
    buf = ExperienceReplay((16,), capacity=5000, seed=0, eviction="second_chance")
    ps = buf.new_pick_selector(P)
    stop = threading.Event()
    errors = []

    def writer(k):
        rng = np.random.default_rng(k)
        try:
            while not stop.is_set():
                h = buf.record_many(None, rng.standard_normal((50, 16)), np.zeros(50, np.int64),
                                    np.zeros(50, np.float32), final_state=np.zeros(16))
                try:
                    b = buf.get_batch(8, ps)
                    buf.set_priority(ps, b.pick_epi, b.pick_pos, rng.random(8))
                except ValueError:
                    pass
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    for t in ts:
        t.start()
    try:
        for i in range(20):
            c = ExperienceReplay.unserialize(buf.serialize(level=i % 2))
            assert c._check() is None
            assert len(c) <= 5000
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert not errors
