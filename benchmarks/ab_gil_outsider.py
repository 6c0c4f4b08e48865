"""Small calls and the threads around them, for two builds of exreplay._core:
what a thread that releases the GIL outside exreplay gets beside a loop of
small calls, what several threads of small calls get together, and what a
small call costs beside an idle thread (docs/design.md, "The binding's one
idiom"; docs/benchmarks.md, addendum "Small calls and threads outside
exreplay").

    OPENBLAS_NUM_THREADS=1 python benchmarks/ab_gil_outsider.py BASE_TREE OTHER_TREE [rounds]

Each tree holds a built exreplay/_core*.so. Buffer: (4,) float32, capacity
200,000 (100,000 for the several-threads part; 10,000 beside the idle
thread), filled with 100-step episodes (ab_common.filled). Loops: `record_many` of 100 steps, `get_batch(32)` (uniform) and
`record` of one step.

1. Beside NumPy (one process per build): each loop, a thread running
   np.sin over 16k doubles (GIL released in the ufunc), each alone and then
   both at once, 0.5 s each, `rounds` rounds; prints each side's rate
   together over its rate alone (medians).
2. Several threads (one process per build): each loop on 1 thread and on 4
   threads at once; prints the calls per second of all threads together.
3. Beside an idle thread (both builds in one process, alternating, a
   thread blocked on an Event the whole time): microseconds per call, and
   the median of the paired other/base ratios."""
import statistics
import subprocess
import sys
import threading

import numpy as np

from ab_common import filled, load_build, load_pair, rates, timed

T = 100
ST = np.ones((T, 4), np.float32)
AC = np.zeros(T, np.int64)
RW = np.zeros(T, np.float32)
FIN = np.ones(4, np.float32)
S4 = np.zeros(4, np.float32)


def loops(m, cap):
    """The three loops on a filled buffer of build m."""
    b, ps = filled(m, (4,), np.float32, cap, T, 1)
    return {"record_many(100)": lambda: b.record_many(None, ST, AC, RW, final_state=FIN),
            "get_batch(32)": lambda: b.get_batch(32, ps),
            "record(1 step)": lambda: b.record(None, S4, 0, 0.0)}


def beside_numpy(tree, rounds):
    fns = loops(load_build("m", tree), 200_000)
    x = np.random.default_rng(7).random(1 << 14)
    y = np.empty_like(x)
    sin = lambda: np.sin(x, out=y)
    got = {}
    for _ in range(rounds):
        got.setdefault("sin", []).append(rates([("s", sin, 0)], 0.5)["s"])
        for name, fn in fns.items():
            got.setdefault(name, []).append(rates([("f", fn, 0)], 0.5)["f"])
            both = rates([("f", fn, 0), ("s", sin, 0)], 0.5)
            got.setdefault((name, "f"), []).append(both["f"])
            got.setdefault((name, "s"), []).append(both["s"])
    med = {k: statistics.median(v) for k, v in got.items()}
    for name in fns:
        print(f"  {name:17s} beside NumPy: loop {med[(name, 'f')] / med[name]:.2f} of alone, "
              f"NumPy {med[(name, 's')] / med['sin']:.2f} of alone")


def several(tree, rounds):
    fns = loops(load_build("m", tree), 100_000)
    for name, fn in fns.items():
        out = []
        for n in (1, 4):
            v = [sum(rates([(i, fn, 0) for i in range(n)], 0.5).values()) for _ in range(rounds)]
            out.append(f"{n} thread{'s' if n > 1 else ''} {statistics.median(v) / 1e3:8.0f}k calls/s")
        print(f"  {name:17s} " + ", ".join(out))


def beside_idle(base, other, rounds):
    mods = load_pair(base, other)
    fns = {k: loops(m, 10_000) for k, m in mods.items()}
    go = threading.Event()
    th = threading.Thread(target=go.wait)
    th.start()
    try:
        for name in fns["base"]:
            t, ratios = {"base": [], "after": []}, []
            for i in range(rounds):
                for k in (("base", "after") if i % 2 else ("after", "base")):
                    t[k].append(timed(fns[k][name], 20000))
                ratios.append(t["after"][-1] / t["base"][-1])
            print(f"  {name:17s} base {statistics.median(t['base']) * 1e6:.3f} us, "
                  f"other {statistics.median(t['after']) * 1e6:.3f} us, paired other/base "
                  f"{statistics.median(ratios):.3f}")
    finally:
        go.set()
        th.join()


def main():
    if sys.argv[1] == "--child":
        {"numpy": beside_numpy, "several": several}[sys.argv[2]](sys.argv[3], int(sys.argv[4]))
        return
    base, other = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    for part, title in (("numpy", "1. beside a NumPy thread"), ("several", "2. several threads of small calls")):
        print(title)
        for tree in (base, other):
            print(f" {tree}:", flush=True)
            subprocess.run([sys.executable, __file__, "--child", part, tree, str(rounds)], check=True)
    print("3. beside an idle thread (paired, 3 * rounds)")
    beside_idle(base, other, 3 * rounds)


if __name__ == "__main__":
    main()
