"""In-process A/B of get_batch between two builds of exreplay._core, next to
the floor, alternating builds every repetition so that both see the same
machine load (docs/benchmarks.md, "get_batch against the floor: A/B").

    python benchmarks/ab_get_batch.py BASE_TREE AFTER_TREE [repetitions] [--no-cpprb] [--only=TEXT ...]

Each tree holds a built exreplay/_core*.so. Cases (state (4,) float32 unless
said): the paper's get_5000 (B = 5000, L = 8) at N = 2,048 / 65,536 /
1,048,576, with the states floor (`_floor_gather` of fresh random starts from
one contiguous array, its outputs from the recycled blocks get_batch's come
from: NumPy's fresh arrays had the floor page-fault its 1.3 MB of output in
at every call, 250 faults and 650 us against 27 us at N = 2,048); get_batch(32), L = 1, N = 1,000,000 (and with out=)
against cpprb's sample(32); prioritized get_batch(256) at N = 1,000,000
against cpprb's prioritized sample(256); R2D2 (B = 32, L = 80, 84x84 uint8,
N = 100,000) against its floor. Prints per case the median time of each build
and of the floor/cpprb, the median of the paired after/base ratios, and
after / floor (or cpprb / after). --only=TEXT runs the cases whose name
contains TEXT."""
import gc
import statistics
import sys

import numpy as np

from ab_common import Floor, cpprb_buffer, filled, load_pair, paired, timed

rng = np.random.default_rng(0)


def paper(mods, n, ep):
    bufs = {k: filled(m, (4,), np.float32, n, ep, 8, rng=rng) for k, m in mods.items()}
    fns = {k: (lambda b=b, s=s: b.get_batch(5000, s)) for k, (b, s) in bufs.items()}
    return fns, Floor(mods["after"], n, (4,), np.float32, 8, 5000, rng), 3, "floor"


def small(mods, out, use_cpprb):
    n = 1_000_000
    bufs = {k: filled(m, (4,), np.float32, n, 100, 1, rng=rng) for k, m in mods.items()}
    rb = cpprb_buffer(n, False, rng) if use_cpprb else None
    if out:
        outs = {k: b.get_batch(32, s) for k, (b, s) in bufs.items()}
        fns = {k: (lambda b=b, s=s, o=outs[k]: b.get_batch(32, s, out=o)) for k, (b, s) in bufs.items()}
    else:
        fns = {k: (lambda b=b, s=s: b.get_batch(32, s)) for k, (b, s) in bufs.items()}
    return fns, rb and (lambda: rb.sample(32)), 200, "cpprb"


def prioritized(mods, use_cpprb):
    n = 1_000_000
    bufs = {k: filled(m, (4,), np.float32, n, 100, 1, kind=1, rng=rng) for k, m in mods.items()}
    rb = cpprb_buffer(n, True, rng) if use_cpprb else None
    fns = {k: (lambda b=b, s=s: b.get_batch(256, s)) for k, (b, s) in bufs.items()}
    return fns, rb and (lambda: rb.sample(256, beta=0.4)), 20, "cpprb"


def r2d2(mods):
    bufs = {k: filled(m, (84, 84), np.uint8, 100_000, 500, 80, rng=rng) for k, m in mods.items()}
    fns = {k: (lambda b=b, s=s: b.get_batch(32, s)) for k, (b, s) in bufs.items()}
    return fns, Floor(mods["after"], 100_000, (84, 84), np.uint8, 80, 32, rng), 1, "floor"


CASES = {
    "get_5000 N=2048": lambda mods, c: paper(mods, 2048, 64),
    "get_5000 N=65536": lambda mods, c: paper(mods, 65536, 512),
    "get_5000 N=1048576": lambda mods, c: paper(mods, 1048576, 512),
    "get_batch(32) L=1 N=1M": lambda mods, c: small(mods, False, c),
    "get_batch(32, out=) L=1 N=1M": lambda mods, c: small(mods, True, c),
    "prioritized get_batch(256) N=1M": prioritized,
    "R2D2 B=32 L=80 84x84": lambda mods, c: r2d2(mods),
}


def run_case(name, fns, ref, calls, rkind, reps):
    res = {"base": [], "after": [], "ref": []}
    for fn in list(fns.values()) + ([ref] if ref else []):
        fn()
    for rep in range(reps):
        order = ("base", "after") if rep % 2 == 0 else ("after", "base")
        for k in order:
            if ref:
                ref()
            res[k].append(timed(fns[k], calls))
        if ref:
            res["ref"].append(timed(ref, calls))
    b = statistics.median(res["base"])
    a = statistics.median(res["after"])
    line = (f"{name:34s} base {b*1e6:9.2f} us  after {a*1e6:9.2f} us  "
            f"paired after/base {paired(res['after'], res['base']):.3f}")
    if ref:
        r = statistics.median(res["ref"])
        if rkind == "floor":
            line += f"  floor {r*1e6:9.2f} us  base/floor {b/r:.2f}x  after/floor {a/r:.2f}x"
        else:
            line += f"  cpprb {r*1e6:9.2f} us  cpprb/base {r/b:.2f}x  cpprb/after {r/a:.2f}x"
    print(line, flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    reps = int(args[2]) if len(args) > 2 else 11
    use_cpprb = "--no-cpprb" not in sys.argv
    only = [a[len("--only="):] for a in sys.argv if a.startswith("--only=")]
    mods = load_pair(args[0], args[1])
    for name, make in CASES.items():
        if only and not any(o in name for o in only):
            continue
        gc.collect()
        run_case(name, *make(mods, use_cpprb), reps)


if __name__ == "__main__":
    main()
