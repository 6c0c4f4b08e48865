"""What the in-process A/B scripts share (ab_builds.py, ab_get_batch.py,
ab_small.py, ab_set_priority.py): loading two builds of exreplay._core into
one process, timing a call, filling a buffer the same way in each build,
cpprb's buffers of the same records, the floor of a get_batch, and the
paired ratio that every script reports. Alternating the builds inside one process lets both see the same
machine load; a ratio of two separate runs on a shared machine measures the
load (docs/benchmarks.md)."""
import glob
import importlib.util
import os
import shutil
import statistics
import tempfile
import threading
import time

import numpy as np


class Floor:
    """The floor of a get_batch of B picks of L steps, as a call: module m's
    `_floor_gather` of fresh random starts (one of 8 arrays of them in turn)
    from n contiguous rows of `shape` and `dtype`; with shared, the floor of
    `shared_next=True` (rows[s:s+L+1] as one array)."""

    def __init__(self, m, n, shape, dtype, L, B, rng, shared=False):
        self.m, self.L, self.shared = m, L, shared
        self.rows = (rng.random((n, *shape)) * 100).astype(dtype)
        self.pool = [rng.integers(0, n - L - 1, B) for _ in range(8)]
        self.i = 0

    def __call__(self):
        self.i += 1
        # the default floor's three arguments: builds before the shared form take no fourth
        extra = (True,) if self.shared else ()
        return self.m._floor_gather(self.rows, self.pool[self.i % 8], self.L, *extra)


_loaded = set()


def load_build(name, tree):
    """The exreplay._core built in source tree `tree`, as module `name`._core.
    A tree loaded before in this process is loaded from a fresh copy of its
    library (the dynamic loader would hand back the same one): naming one
    tree twice times the same code in two places, which is what an A/B of
    identical builds measures. On this machine such a pair differs by up to
    4% in a record loop and 5-11% in a three-thread run, and the faster
    copy is not the same from one run to the next (docs/benchmarks.md)."""
    found = glob.glob(tree + "/exreplay/_core*.so")
    if not found:
        raise SystemExit(f"{tree}: no built exreplay/_core*.so (run setup.py build_ext --inplace there)")
    path = os.path.realpath(found[0])
    if path in _loaded:
        d = tempfile.mkdtemp(prefix="exr-ab-")
        path = shutil.copy(path, os.path.join(d, os.path.basename(path)))
    _loaded.add(path)
    spec = importlib.util.spec_from_file_location(name + "._core", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    if path != os.path.realpath(found[0]):
        shutil.rmtree(os.path.dirname(path))  # mapped now: the copy's file is not needed
    return m


def load_pair(base, after):
    """{"base": module, "after": module} from two source trees."""
    return {"base": load_build("basepkg", base), "after": load_build("afterpkg", after)}


def timed(fn, n):
    """Seconds per call of fn, over n calls."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def rates(fns, seconds):
    """Runs each (key, fn, pause) of fns on a thread of its own for `seconds`,
    all at once: fn called in a loop, with `pause` seconds between calls (0:
    flat out). Returns {key: calls per second}."""
    stop, out = threading.Event(), {}

    def go(key, fn, pause):
        n, t0 = 0, time.perf_counter()
        while not stop.is_set():
            fn()
            n += 1
            if pause:
                stop.wait(pause)
        out[key] = n / (time.perf_counter() - t0)

    ths = [threading.Thread(target=go, args=a) for a in fns]
    for th in ths:
        th.start()
    time.sleep(seconds)
    stop.set()
    for th in ths:
        th.join()
    return out


def apex_pair(m):
    """The suite's Ape-X pair (benchmarks/test_bench_threads.py) on build m:
    a full buffer of 200,000 (4,) float32 records with one prioritized
    selector, rec() (record_many of a 100-step rollout with priorities) and
    samp() (get_batch(256) and set_priority of its picks). (buf, rec, samp)."""
    cap, ep = 200_000, 100
    rng = np.random.default_rng(0)
    st, fin = rng.random((ep, 4), dtype=np.float32), np.zeros(4, np.float32)
    ac, rw, pri = np.zeros(ep, np.int64), np.ones(ep, np.float32), rng.random(ep) + 0.05
    new_p = np.random.default_rng(5).random(256) + 0.05
    buf = m.ExperienceReplay((4,), capacity=cap, pick_len=1, seed=1)
    pr = buf.new_pick_selector(1)
    for _ in range(cap // ep):
        buf.record_many(None, st, ac, rw, final_state=fin, priorities=pri)

    def rec():
        buf.record_many(buf.new_episode(), st, ac, rw, final_state=fin, priorities=pri)

    def samp():
        b = buf.get_batch(256, pr)
        buf.set_priority(pr, b.pick_epi, b.pick_pos, new_p)

    return buf, rec, samp


def paired(after, base):
    """The median of the paired after/base ratios of two equal-length lists."""
    return statistics.median([a / b for a, b in zip(after, base)])


def filled(m, shape, dtype, n, ep, pick_len, kind=0, rng=None):
    """A buffer of capacity n filled with n // ep episodes of ep records
    (each continued past its last record, so every record is a pick) and
    one selector of `kind` (0 uniform, 1 prioritized, priorities drawn
    anew for each episode)."""
    rng = rng if rng is not None else np.random.default_rng(0)
    b = m.ExperienceReplay(shape, state_dtype=dtype, capacity=n, pick_len=pick_len, seed=1)
    s = b.new_pick_selector(kind)
    st = (rng.random((ep, *shape)) * 100).astype(dtype)
    ac = np.zeros(ep, np.int64)
    rw = np.ones(ep, np.float32)
    for _ in range(n // ep):
        pr = rng.random(ep) + 0.05 if kind == 1 else None
        b.record_many(None, st, ac, rw, final_state=st[0], terminated=False, priorities=pr)
    return b, s


CPPRB_SPEC = {"obs": {"shape": (4,), "dtype": np.float32}, "act": {"shape": 1, "dtype": np.int64},
              "rew": {}, "next_obs": {"shape": (4,), "dtype": np.float32}, "done": {}}


def cpprb_buffer(n, prioritized, rng=None):
    """cpprb's (prioritized, alpha 0.6) buffer holding n (4,) float32
    transitions: the records the scripts' exreplay buffers hold."""
    import cpprb
    rng = rng if rng is not None else np.random.default_rng(0)
    rb = (cpprb.PrioritizedReplayBuffer(n, CPPRB_SPEC, alpha=0.6) if prioritized
          else cpprb.ReplayBuffer(n, CPPRB_SPEC))
    kw = dict(obs=rng.random((n, 4), np.float32), act=np.zeros((n, 1), np.int64), rew=np.ones(n, np.float32),
              next_obs=rng.random((n, 4), np.float32), done=np.zeros(n, np.float32))
    if prioritized:
        kw["priorities"] = rng.random(n) + 0.05
    rb.add(**kw)
    return rb
