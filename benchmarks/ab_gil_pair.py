"""Two builds of exreplay._core, in one process, on a writer thread and a
learner thread sharing one buffer, for the binding's GIL rules: the no-wait
paths of small calls (docs/design.md, "The binding's one idiom").

    OPENBLAS_NUM_THREADS=1 python benchmarks/ab_gil_pair.py BASE_TREE AFTER_TREE [rounds] [B] [two]

The writer `record_many`s 100-step rollouts of (4,) float32 states into a
200k buffer (copied under the lock: under 8 KiB), the learner draws
`get_batch(B)` (default 32: a small batch) from a uniform selector. Each
round measures, per build, each side's calls per second alone and then
both at once (0.6 s each), and prints each side's share (together / alone)
per build: 1.0 is full speed. The builds take turns every round, so both
see the same machine. Each tree holds a built exreplay/_core*.so.

With `two` the learner works on a second buffer of its own, as an Ape-X
learner next to another buffer's writer: prioritized `get_batch(B)` (use
B = 256: it releases the GIL) then `set_priority(ps, batch, p)`, while the
writer's small rollouts, on the first buffer, may keep the GIL."""
import statistics
import sys

import numpy as np

from ab_common import load_pair, rates

EP, CAP, D = 100, 200_000, 0.6
rng = np.random.default_rng(0)
ST = rng.random((EP, 4), dtype=np.float32)
AC = np.zeros(EP, np.int64)
RW = np.ones(EP, np.float32)
FIN = np.zeros(4, np.float32)


def filled(m, kind):
    buf = m.ExperienceReplay((4,), capacity=CAP, pick_len=1, seed=1)
    ps = buf.new_pick_selector(kind)
    for _ in range(CAP // EP):
        buf.record_many(None, ST, AC, RW, final_state=FIN)
    return buf, ps


def pair(m, batch, two):
    buf, ps = filled(m, 0)

    def rec():
        buf.record_many(buf.new_episode(), ST, AC, RW, final_state=FIN)

    def samp():
        buf.get_batch(batch, ps)

    if not two:
        return rec, samp
    other, pr = filled(m, 1)
    new_p = np.random.default_rng(5).random(batch) + 0.05

    def learn():
        other.set_priority(pr, other.get_batch(batch, pr), new_p)

    return rec, learn


def one_round(rec, samp):
    r = rates([("r", rec, 0)], D)["r"]
    s = rates([("s", samp, 0)], D)["s"]
    both = rates([("r", rec, 0), ("s", samp, 0)], D)
    return both["r"] / r, both["s"] / s


def main():
    mods = load_pair(sys.argv[1], sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 32
    two = len(sys.argv) > 5 and sys.argv[5] == "two"
    work = {k: pair(m, batch, two) for k, m in mods.items()}
    got = {k: [] for k in mods}
    for i in range(rounds):
        for k in (("base", "after") if i % 2 == 0 else ("after", "base")):
            got[k].append(one_round(*work[k]))
        print(f"round {i}: " + "; ".join(
            f"{k} writer {got[k][-1][0]:.2f} learner {got[k][-1][1]:.2f}" for k in mods), flush=True)
    for k in mods:
        w = statistics.median(x[0] for x in got[k])
        s = statistics.median(x[1] for x in got[k])
        what = f"prioritized get_batch({batch}) + set_priority on a second buffer" if two else f"get_batch({batch})"
        print(f"{k}: writer {w:.2f} + learner {s:.2f} of their rates alone (medians), {what}")


main()
