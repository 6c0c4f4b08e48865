"""The Ape-X learner (prioritized get_batch(256) and set_priority(256) by
(epi, pos), N = 200,000, (4,) float32) on a thread of its own, alone and
beside one other thread that shares no buffer with it, in alternating
rounds so that every neighbour sees the same machine load. The neighbours
differ in how often they hand the GIL over (docs/benchmarks.md, addendum
"Where the Ape-X learner's time goes beside writers"):

  sha256 8MB         hashlib over 8 MiB: C work without the GIL, streaming memory
  np.sin 16k / 1k    a NumPy ufunc that lets go of the GIL for its loop
  time.sleep(0)      a system call that lets go of the GIL
  writer, 2nd buffer the suite's Ape-X writer on a buffer of its own

    OPENBLAS_NUM_THREADS=1 python benchmarks/learner_neighbors.py [TREE] [ROUNDS]

TREE holds a built exreplay/_core*.so (default: this tree). Prints the
learner's step (median), its paired ratio to the learner alone, and the
neighbour's calls per second."""
import hashlib
import statistics
import sys
import time

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else ".")
import numpy as np  # noqa: E402

from ab_common import rates  # noqa: E402
from exreplay import ExperienceReplay  # noqa: E402

CAP, EP = 200_000, 100
rng = np.random.default_rng(0)
ST = rng.random((EP, 4), dtype=np.float32)
AC = np.zeros(EP, np.int64)
RW = np.ones(EP, np.float32)
FIN = np.zeros(4, np.float32)
PRI = rng.random(EP) + 0.05
NEW_P = np.random.default_rng(5).random(256) + 0.05


def filled(seed):
    b = ExperienceReplay((4,), capacity=CAP, pick_len=1, seed=seed)
    p = b.new_pick_selector(1)
    for _ in range(CAP // EP):
        b.record_many(None, ST, AC, RW, final_state=FIN, priorities=PRI)
    return b, p


buf, pr = filled(1)
wbuf, _ = filled(2)
BIG = bytes(8 << 20)
X = np.random.default_rng(1).random(16384)
X1 = X[:1024].copy()
NEIGHBOURS = {
    "none": None,
    "sha256 8MB": lambda: hashlib.sha256(BIG).digest(),
    "np.sin 16k": lambda: np.sin(X),
    "np.sin 1k": lambda: np.sin(X1),
    "time.sleep(0)": lambda: time.sleep(0),
    "writer, 2nd buffer": lambda: wbuf.record_many(wbuf.new_episode(), ST, AC, RW, final_state=FIN,
                                                   priorities=PRI),
}


def learner_step():
    b = buf.get_batch(256, pr)
    buf.set_priority(pr, b.pick_epi, b.pick_pos, NEW_P)


def one(neighbour, seconds=1.5):
    """(learner µs a step, neighbour calls a second) over `seconds`."""
    fns = [("learner", learner_step, 0)] + ([("other", neighbour, 0)] if neighbour else [])
    got = rates(fns, seconds)
    return 1e6 / got["learner"], got.get("other", 0.0)


def main():
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    got = {k: [] for k in NEIGHBOURS}
    for _ in range(rounds):
        for k, f in NEIGHBOURS.items():
            got[k].append(one(f))
    alone = [s for s, _ in got["none"]]
    for k, v in got.items():
        steps = [s for s, _ in v]
        ratio = statistics.median([a / b for a, b in zip(steps, alone)])
        print(f"{k:20s} learner {statistics.median(steps):6.1f} us a step, paired / alone {ratio:.2f}; "
              f"neighbour {statistics.median([o for _, o in v]):,.0f} calls/s")


main()
