"""Shared sizes, data and helpers of the benchmark suite (benchmarks/test_bench_*.py).

Two modes:

- full (default): the sizes docs/benchmarks.md reports (``make bench``);
- quick: ``EXREPLAY_BENCH_QUICK=1`` or ``pytest benchmarks --bench-quick``: a few
  small points of every benchmark, a smoke run of seconds (``make bench-quick``,
  part of ``make test``).

Nothing here asserts on a time: a missed goal is reported, never a failure.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import zlib

import numpy as np

import exreplay


def quick() -> bool:
    return os.environ.get("EXREPLAY_BENCH_QUICK", "") not in ("", "0")


# Records that the pytest-benchmark JSON cannot hold as a timing of its own
# (threads, memory, machine).  conftest.py adds them to the JSON under
# "exreplay_bench".
CUSTOM: list[dict] = []


def add_custom(kind: str, **fields) -> dict:
    rec = {"kind": kind, **fields}
    CUSTOM.append(rec)
    return rec


# --- the state shapes ----------------------------------------------------------

# CartPole-like records: state (4,) float32, action int64 scalar, reward float32.
SMALL_SHAPE = (4,)
SMALL_DTYPE = np.float32
# Atari / R2D2 frames.
ATARI_SHAPE = (84, 84)
ATARI_DTYPE = np.uint8


def payload_bytes(shape, dtype) -> int:
    """Bytes of one record's own data: state + int64 action + float32 reward."""
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize + 8 + 4


def record_dtype(shape, dtype) -> np.dtype:
    """One packed row of the floor: state | action | reward (no padding)."""
    return np.dtype([("state", dtype, shape), ("action", np.int64), ("reward", np.float32)])


# --- sizes per mode --------------------------------------------------------------


def paper_grid():
    """(k, s) of the paper's grid: 2^k episodes of round(2^s) records."""
    if quick():
        return [(5, 6.0), (7, 8.0), (9, 9.5)]
    ks = range(5, 12)
    ss = [6 + 0.5 * i for i in range(13)]  # 6.0 ... 12.0
    return [(k, s) for k in ks for s in ss]


def paper_reference_points():
    """The subsampled grid of the pure-Python buffer (it fills at ~6 us a record)."""
    if quick():
        return {(5, 6.0), (7, 8.0)}
    return {(k, float(s)) for k in (5, 7, 9, 11) for s in range(6, 13) if k + s <= 20}


def rounds(full: int, quick_: int = 3) -> int:
    return quick_ if quick() else full


def cpprb_sizes():
    return [10_000] if quick() else [100_000, 1_000_000]


def prioritized_size():
    return 10_000 if quick() else 1_000_000


def atari_size():
    return 2_000 if quick() else 100_000


def thread_seconds():
    """Target length of each half (record / sample) of one threads round."""
    return 0.03 if quick() else 0.3


def memory_size():
    return 50_000 if quick() else 1_000_000


def memory_reference_size():
    return 20_000 if quick() else 100_000


# --- data ------------------------------------------------------------------------

_rng = np.random.default_rng(20240501)


def episode_arrays(n, shape=SMALL_SHAPE, dtype=SMALL_DTYPE, with_priorities=False):
    """Pre-made arrays for one episode of n steps (reused for every episode)."""
    if np.dtype(dtype).kind == "u":
        states = _rng.integers(0, 256, size=(n, *shape), dtype=dtype)
        final = _rng.integers(0, 256, size=shape, dtype=dtype)
    else:
        states = _rng.standard_normal((n, *shape)).astype(dtype)
        final = _rng.standard_normal(shape).astype(dtype)
    actions = _rng.integers(0, 2, size=n).astype(np.int64)
    rewards = np.ones(n, dtype=np.float32)
    pri = (_rng.random(n) + 0.01).astype(np.float64) if with_priorities else None
    return states, actions, rewards, final, pri


def fill(buf, n_records, ep_len, shape=SMALL_SHAPE, dtype=SMALL_DTYPE, with_priorities=False):
    """Fill `buf` with n_records records in episodes of ep_len (record_many, untimed)."""
    states, actions, rewards, final, pri = episode_arrays(ep_len, shape, dtype, with_priorities)
    full, rest = divmod(n_records, ep_len)
    for _ in range(full):
        h = buf.new_episode()
        buf.record_many(h, states, actions, rewards, final_state=final, priorities=pri)
    if rest:
        h = buf.new_episode()
        buf.record_many(
            h, states[:rest], actions[:rest], rewards[:rest],
            final_state=final, priorities=None if pri is None else pri[:rest],
        )
    return buf


def floor_rows(n_rows, shape=SMALL_SHAPE, dtype=SMALL_DTYPE, packed=False):
    """The floor's ONE contiguous array of n_rows rows, every page touched.

    packed=False: rows are states (shape, dtype): the floor copies states and
    next states, the bytes get_batch copies less its actions and rewards.
    packed=True: rows are whole records (state|action|reward, no padding).
    """
    rows = np.empty(n_rows, dtype=record_dtype(shape, dtype)) if packed else np.empty((n_rows, *shape), dtype)
    block = 4096
    st, ac, rw, _, _ = episode_arrays(block, shape, dtype)
    if packed:
        src = np.empty(block, dtype=rows.dtype)
        src["state"], src["action"], src["reward"] = st, ac, rw
    else:
        src = st
    for i in range(0, n_rows, block):
        j = min(n_rows, i + block)
        rows[i:j] = src[: j - i]
    return rows


class StartPool:
    """Pre-made random start arrays for the floor, handed out by a pedantic setup."""

    def __init__(self, n_rows, L, count, size=8):
        hi = n_rows - L - 1  # the floor reads rows[s : s + L + 1]
        self.pool = [_rng.integers(0, hi + 1, size=count, dtype=np.int64) for _ in range(size)]
        self.i = 0

    def next(self):
        a = self.pool[self.i % len(self.pool)]
        self.i += 1
        return a


def impl_class(name):
    if name == "exreplay":
        return exreplay.ExperienceReplay
    if name == "reference":
        from exreplay.reference import ReferenceReplay

        return ReferenceReplay
    raise ValueError(name)


def uniform(buf):
    return buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)


def prioritized(buf):
    return buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized, alpha=0.6, beta=0.4)


def collect():
    gc.collect()


def together(jobs) -> float:
    """Wall seconds for threads, one per (fn, n) of jobs, each calling fn()
    n times, started at once: from the moment a barrier lets them all go to
    the last one's end."""
    barrier = threading.Barrier(len(jobs) + 1)

    def worker(fn, n):
        barrier.wait()
        for _ in range(n):
            fn()

    threads = [threading.Thread(target=worker, args=job) for job in jobs]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    for th in threads:
        th.join()
    return time.perf_counter() - t0


def crosscore_ns(seconds: float = 0.1) -> float:
    """The machine's cross-core round trip of one cache line, in ns
    (`exreplay._core._crosscore_ns`, src/core/crosscore.h): what every line
    two threads sharing a buffer pass between them costs at that moment.
    The thread benchmarks record it beside each round (docs/benchmarks.md,
    "Two machines in one")."""
    from exreplay import _core
    return _core._crosscore_ns(seconds)


_PROBE_BYTES = bytes(range(256)) * 256  # 64 KiB: stays in L2


def speed_probe_us(reps: int = 20) -> float:
    """The CPU's speed at this moment: the best of `reps` timings of
    ``zlib.crc32`` over 64 KiB held in cache, in microseconds (about 1 ms in
    all). Pure computation in C, no memory traffic, no interpreter in the
    timed part. On the development VM it reads 14.7 us at the CPU's fast
    speed and 18-46 us otherwise, changing from one second to the next, and
    a `record` call mostly follows it (benchmarks/speed_probe_trace.py;
    docs/benchmarks.md, "A speed probe beside every benchmark"). conftest.py
    takes it before and after every benchmark; report.py says which ran at
    the fast speed."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        zlib.crc32(_PROBE_BYTES)
        best = min(best, time.perf_counter_ns() - t0)
    return best / 1e3


def median_time(fn, reps):
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def alternate(a_fn, b_fn, timed, rounds):
    """timed(a_fn) and timed(b_fn) in alternation, a_fn first in even rounds
    and b_fn first in odd ones, so that both see the same machine: (the
    median of the paired b/a time ratios, a's times, b's times)."""
    import statistics

    ratios, a, b = [], [], []
    for rep in range(rounds):
        order = (a_fn, b_fn) if rep % 2 == 0 else (b_fn, a_fn)
        t = {fn: timed(fn) for fn in order}
        a.append(t[a_fn])
        b.append(t[b_fn])
        ratios.append(b[-1] / a[-1])
    return statistics.median(ratios), a, b


def tag(benchmark, group, **info):
    """Name a pytest-benchmark measurement for report.py."""
    benchmark.group = group
    benchmark.extra_info.update(info)
    benchmark.extra_info["mode"] = "quick" if quick() else "full"


def ray_report_paths(json_name):
    """Where a Ray benchmark writes its JSON and docs/benchmarks_ray.md:
    build/bench-quick/ in quick mode (a smoke run must not touch docs/),
    else benchmarks/results/ and docs/. The directories exist on return."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if quick():
        out_json = os.path.join(root, "build", "bench-quick", json_name)
        out_md = os.path.join(root, "build", "bench-quick", "benchmarks_ray.md")
    else:
        out_json = os.path.join(root, "benchmarks", "results", json_name)
        out_md = os.path.join(root, "docs", "benchmarks_ray.md")
    os.makedirs(os.path.dirname(out_json), exist_ok=True)
    os.makedirs(os.path.dirname(out_md), exist_ok=True)
    return out_json, out_md
