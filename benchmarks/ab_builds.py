"""In-process A/B of two builds of exreplay._core, alternating every
repetition so that both see the same machine load (a shared, noisy machine
makes two separate benchmark runs incomparable). Prints each operation's
median time per build and the median of the paired after/base ratios.

    git worktree add /tmp/base <commit> && (cd /tmp/base && python setup.py build_ext --inplace)
    python benchmarks/ab_builds.py /tmp/base . [repetitions]

Each argument is a source tree holding a built exreplay/_core*.so."""
import statistics
import sys

import numpy as np

from ab_common import load_pair, paired, timed

mods = load_pair(sys.argv[1], sys.argv[2])
S4 = np.zeros(4, np.float32)
SS = np.zeros((100, 4), np.float32); A = np.zeros(100, np.int64); R = np.zeros(100, np.float32)
F = np.zeros((100, 84, 84), np.uint8)

def setup(m):
    small = m.ExperienceReplay((4,), capacity=10000, seed=0)
    su = small.new_pick_selector(0); sp = small.new_pick_selector(1)
    for _ in range(100):
        small.record_many(None, SS, A, R, terminated=True)
    big = m.ExperienceReplay((84, 84), state_dtype="uint8", capacity=20000, pick_len=4, seed=0)
    bu = big.new_pick_selector(0)
    for _ in range(50):
        big.record_many(None, F, A, R, terminated=True)
    return dict(small=small, su=su, sp=sp, big=big, bu=bu, h=None, data=small.serialize(0))

def ops(m, s):
    def rec1():
        s["h"] = s["small"].record(s["h"], S4, 0, 0.0)
    b32 = s["small"].get_batch(32, s["sp"])
    return {
        "record (1 step)": (rec1, 2000),
        "record_many (100 steps)": (lambda: s["small"].record_many(None, SS, A, R, terminated=True), 200),
        "get_batch B=32 uniform": (lambda: s["small"].get_batch(32, s["su"]), 2000),
        "get_batch B=256 prioritized": (lambda: s["small"].get_batch(256, s["sp"]), 500),
        "set_priority B=32 (batch form)": (lambda: s["small"].set_priority(s["sp"], b32, 1.5), 2000),
        "get_batch B=32 84x84 L=4": (lambda: s["big"].get_batch(32, s["bu"]), 200),
        "serialize level 0": (lambda: s["small"].serialize(0), 20),
        "unserialize level 0": (lambda: m.ExperienceReplay.unserialize(s["data"]), 20),
    }

state = {k: setup(m) for k, m in mods.items()}
names = list(ops(mods["base"], state["base"]))
res = {(k, n): [] for k in mods for n in names}
for rep in range(int(sys.argv[3]) if len(sys.argv) > 3 else 15):
    order = ("base", "after") if rep % 2 == 0 else ("after", "base")
    for n in names:
        for k in order:
            fn, reps = ops(mods[k], state[k])[n]
            res[(k, n)].append(timed(fn, reps))
for n in names:
    b = statistics.median(res[("base", n)]); a = statistics.median(res[("after", n)])
    pr = paired(res[("after", n)], res[("base", n)])
    print(f"{n:34s} base {b*1e6:10.2f} us   after {a*1e6:10.2f} us   paired after/base {pr:.3f}")
