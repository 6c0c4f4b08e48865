"""Paired in-process A/B of small get_batch calls between two builds, with
the load order cancelled out (docs/benchmarks.md, addendum "Small get_batch
calls").

    python benchmarks/ab_small.py BASE_TREE AFTER_TREE [repetitions] [N]

Each tree holds a built exreplay/_core*.so. Cases, state (4,) float32,
pick_len 1, 100-step episodes, N records (default 1,000,000):
get_batch(32, out=), get_batch(32), prioritized get_batch(256). One process
loads both builds, fills one buffer with each, and times them in
alternating warm blocks (each block's calls run once untimed first);
after / base is the median of the paired ratios.

At N = 1M the two buffers of such a process are not equal: with two
copies of one build, the one filled first came out 2-4% faster in some
runs (up to 0.96 in others the other way, and 0.98-1.02 in most). So the
script runs two processes, base filled first and after filled first, and
reports sqrt(r1 * r2), r1 being after / base in the first and r2 in the
second: an effect of the order divides out. It also prints r1 and r2."""
import math
import statistics
import subprocess
import sys
import time

import numpy as np

from ab_common import filled, load_build

CASES = (("get_batch(32, out=)", 32, "out"), ("get_batch(32)", 32, "new"),
         ("prioritized get_batch(256)", 256, "prio"))


def call_of(m, n, batch, mode):
    b, s = filled(m, (4,), np.float32, n, 100, 1, kind=1 if mode == "prio" else 0)
    if mode == "out":
        o = b.get_batch(batch, s)
        return lambda: b.get_batch(batch, s, out=o)
    return lambda: b.get_batch(batch, s)


def child(first, second, reps, n, case):
    """One process: `first` filled first; prints the median of second/first."""
    _, batch, mode = CASES[case]
    calls = [call_of(load_build(f"m{i}", d), n, batch, mode) for i, d in enumerate((first, second))]
    k = max(20, 32000 // batch)

    def block(fn):
        for _ in range(k):
            fn()
        t = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t) / k

    ratios, times = [], ([], [])
    for r in range(reps):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        t = [0.0, 0.0]
        for i in order:
            t[i] = block(calls[i])
        times[0].append(t[0])
        times[1].append(t[1])
        ratios.append(t[1] / t[0])
    print(statistics.median(ratios), statistics.median(times[0]), statistics.median(times[1]))


def main():
    if sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
        return
    base, after = sys.argv[1], sys.argv[2]
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 31
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000_000
    for case, (name, _, _) in enumerate(CASES):
        out = []
        for first, second in ((base, after), (after, base)):
            r = subprocess.run([sys.executable, __file__, "--child", first, second, str(reps), str(n),
                                str(case)], check=True, capture_output=True, text=True).stdout.split()
            out.append([float(x) for x in r])
        (r1, b1, a1), (r2_, a2, b2) = out
        r2 = 1 / r2_  # the second process printed base / after
        g = math.sqrt(r1 * r2)
        print(f"{name:28s} N={n:<9,} after/base {g:.3f}  (base filled first: {r1:.3f}, "
              f"after first: {r2:.3f}; base {statistics.median([b1, b2]) * 1e6:.2f} us, "
              f"after {statistics.median([a1, a2]) * 1e6:.2f} us)")


if __name__ == "__main__":
    main()
