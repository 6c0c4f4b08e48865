"""The paper's get_5000 over its whole grid, two builds of exreplay._core
and the states floor in one process (docs/benchmarks.md, addendum "get_5000
planned eight picks at a time").

    python benchmarks/ab_paper_grid.py BASE_TREE AFTER_TREE [repetitions] [--k=K ...]

For each point of test_bench_paper.py's grid (2^k episodes of round(2^s)
records, N = 2^k * round(2^s); (4,) float32 states, pick_len 8, capacity N),
both builds' buffers are filled the same way, then `repetitions` rounds each
time get_5000 of both builds (in alternating order) and the floor
(`_floor_gather` of 5000 fresh random starts from one contiguous array of the
N states), every timed call preceded by one untimed call of another of the
three, as the suite does. Prints per point the medians, each build's
get_5000 / floor and the median of the paired after/base ratios; then, per
build, the median of get_5000 / floor over the points and how many points
are at most 1.5x. --k=K keeps only the points of that k (repeatable)."""
import gc
import statistics
import sys

import numpy as np

import harness
from ab_common import load_pair, paired, timed

BATCH, PICK_LEN = 5000, 8


def point(mods, k, s, reps):
    n_ep, ep = 2**k, int(round(2**s))
    n = n_ep * ep
    bufs = {}
    for key, m in mods.items():
        b = m.ExperienceReplay((4,), state_dtype="float32", capacity=n, pick_len=PICK_LEN, seed=1)
        bufs[key] = (harness.fill(b, n, ep), b.new_pick_selector(0))
    rows = harness.floor_rows(n)
    pool = harness.StartPool(n, PICK_LEN, BATCH)
    floor_m = mods["after"]
    fns = {key: (lambda b=b, u=u: b.get_batch(BATCH, u)) for key, (b, u) in bufs.items()}

    def floor():
        return floor_m._floor_gather(rows, pool.next(), PICK_LEN)

    res = {"base": [], "after": [], "floor": []}
    for fn in (fns["base"], fns["after"], floor):
        fn()
    for rep in range(reps):
        order = ("base", "after") if rep % 2 == 0 else ("after", "base")
        for key in order:
            floor()
            res[key].append(timed(fns[key], 1))
        fns[order[-1]]()
        res["floor"].append(timed(floor, 1))
    med = {key: statistics.median(v) for key, v in res.items()}
    return n, med, paired(res["after"], res["base"])


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    reps = int(args[2]) if len(args) > 2 else 15
    only_k = {int(a[len("--k="):]) for a in sys.argv if a.startswith("--k=")}
    mods = load_pair(args[0], args[1])
    ratios = {"base": [], "after": []}
    for k, s in sorted(harness.paper_grid(), key=lambda p: 2**p[0] * round(2**p[1])):
        if only_k and k not in only_k:
            continue
        gc.collect()
        n, med, pr = point(mods, k, s, reps)
        for key in ratios:
            ratios[key].append(med[key] / med["floor"])
        print(f"k{k:<2} s{s:<4g} N={n:<8d} base {med['base']*1e6:8.1f} us  after {med['after']*1e6:8.1f} us  "
              f"floor {med['floor']*1e6:8.1f} us  base/floor {ratios['base'][-1]:.2f}x  "
              f"after/floor {ratios['after'][-1]:.2f}x  paired after/base {pr:.3f}", flush=True)
    for key, v in ratios.items():
        print(f"{key}: get_5000 / floor median {statistics.median(v):.2f}x over {len(v)} points, "
              f"<= 1.5x at {sum(r <= 1.5 for r in v)}, max {max(v):.2f}x")


if __name__ == "__main__":
    main()
