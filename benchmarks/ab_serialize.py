"""Paired in-process A/B of serialize(level=0) of a large buffer between two
builds (docs/format.md, "Writing"): one process loads both builds, fills a
buffer of about 256 MB of 84x84 uint8 frames in each, and times one
serialize of each in turn, the order swapped every repetition; after / base
is the median of the paired time ratios.

    python benchmarks/ab_serialize.py BASE_TREE AFTER_TREE [repetitions]

Each tree holds a built exreplay/_core*.so."""
import gc
import statistics
import sys
import time

import numpy as np

from ab_common import load_pair

SHAPE, EP, TARGET = (84, 84), 500, 256 << 20


def filled(m):
    b = m.ExperienceReplay(state_shape=SHAPE, state_dtype="uint8", capacity=None, seed=1)
    b.new_pick_selector(0)
    b.new_pick_selector(1)
    st = np.zeros((EP, *SHAPE), np.uint8)
    a, r = np.zeros(EP, np.int64), np.zeros(EP, np.float32)
    for k in range(TARGET // (EP * st[0].nbytes)):
        st[:] = k % 251
        b.record_many(None, st, a, r, terminated=True)
    return b


def main():
    mods = load_pair(sys.argv[1], sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 11
    bufs = [filled(mods["base"]), filled(mods["after"])]
    raw = len(bufs[0].serialize(0)) - 40
    times, ratios = ([], []), []
    for rep in range(reps):
        got = {}
        for i in ((0, 1) if rep % 2 == 0 else (1, 0)):
            gc.collect()
            t = time.perf_counter()
            s = bufs[i].serialize(level=0)
            got[i] = time.perf_counter() - t
            del s
        times[0].append(got[0])
        times[1].append(got[1])
        ratios.append(got[1] / got[0])
    gbps = [raw / statistics.median(t) / 1e9 for t in times]
    print(f"serialize(level=0) of {raw / 1e6:.0f} MB: base {gbps[0]:.2f} GB/s, after {gbps[1]:.2f} "
          f"GB/s, after / base time {statistics.median(ratios):.3f} (median of {reps} pairs)")


if __name__ == "__main__":
    main()
