"""A short version of the paper's experiment: exreplay against the pure-Python buffer.

    python -m exreplay.demo            # or: make demo  (well under a minute)

For a few (k, s): 2^k episodes of 2^s records (N = 2^(k+s)), state (4,)
float32, pick_len 8.  Each buffer is filled from empty by N `record` calls
with pre-made arrays (record_100 = time per 100 calls: median over episodes),
then `get_batch(5000)` is timed (get_5000: median of several calls).  The full
grid, cpprb and the physical floor are in benchmarks/ (`make bench`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

import exreplay
from exreplay.reference import ReferenceReplay

POINTS = [(5, 6), (7, 7), (7, 9), (9, 8)]
PICK_LEN = 8
BATCH = 5000


def _measure(cls, k, s, get_reps):
    ep_len, n_ep = 2**s, 2**k
    buf = cls(state_shape=(4,), capacity=n_ep * ep_len, pick_len=PICK_LEN, seed=0)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    rng = np.random.default_rng(k * 100 + s)
    rows = [r.copy() for r in rng.standard_normal((ep_len, 4)).astype(np.float32)]
    final = rng.standard_normal(4).astype(np.float32)
    body, last = rows[:-1], rows[-1]
    rec = buf.record
    per_ep = []
    h = buf.new_episode()
    for _ in range(n_ep):
        t0 = time.perf_counter()
        for st in body:
            h = rec(h, st, 1, 0.5)
        h = rec(h, last, 1, 0.5, final_state=final)
        per_ep.append(time.perf_counter() - t0)
    record_100 = statistics.median(per_ep) / ep_len * 100
    buf.get_batch(BATCH, ps)  # warm-up
    gets = []
    for _ in range(get_reps):
        t0 = time.perf_counter()
        buf.get_batch(BATCH, ps)
        gets.append(time.perf_counter() - t0)
    return len(buf), record_100, statistics.median(gets)


def _fmt(sec):
    u = sec * 1e6
    return f"{u / 1000:,.1f} ms" if u >= 10_000 else f"{u:,.1f} µs"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", default=None, help="k:s pairs, e.g. 5:6,7:9 (default: %s)"
                    % ",".join(f"{k}:{s}" for k, s in POINTS))
    args = ap.parse_args(argv)
    points = POINTS
    if args.points:
        points = [tuple(int(x) for x in p.split(":")) for p in args.points.split(",")]

    print("exreplay demo: the paper's experiment (its §4), short version")
    print(f"state (4,) float32, pick_len {PICK_LEN}; record_100 = time of 100 record calls, "
          f"get_5000 = one get_batch({BATCH}); medians")
    print()
    head = (f"{'k':>2} {'s':>2} {'N':>8} | {'record_100 C':>13} {'Python':>11} {'ratio':>7} | "
            f"{'get_5000 C':>11} {'Python':>10} {'ratio':>7}")
    print(head)
    print("-" * len(head))
    t_start = time.perf_counter()
    rec_ratios, get_ratios = [], []
    for k, s in points:
        n, rc, gc_ = _measure(exreplay.ExperienceReplay, k, s, get_reps=25)
        _, rp, gp = _measure(ReferenceReplay, k, s, get_reps=3)
        rec_ratios.append(rp / rc)
        get_ratios.append(gp / gc_)
        print(f"{k:>2} {s:>2} {n:>8,} | {_fmt(rc):>13} {_fmt(rp):>11} {rp / rc:>6.1f}× | "
              f"{_fmt(gc_):>11} {_fmt(gp):>10} {gp / gc_:>6.0f}×", flush=True)
    print()
    print(f"exreplay is {min(rec_ratios):.1f}–{max(rec_ratios):.1f}× faster at record and "
          f"{min(get_ratios):.0f}–{max(get_ratios):.0f}× faster at get_batch(5000) than the pure-Python buffer "
          f"(ratios of medians, same run, {time.perf_counter() - t_start:.0f} s).")
    print("The paper: record_100 ≈ 700 µs (C++) and ≈ 500 µs (Python); get_5000 < 800 µs (C++) and ≈ 33 ms (Python).")
    print("Full results with the floor and cpprb: docs/benchmarks.md (make bench).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
