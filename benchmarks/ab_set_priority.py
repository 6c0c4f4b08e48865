"""In-process A/B of set_priority(ps, batch, p) between two builds of
exreplay._core, next to cpprb's update_priorities, at N = 1,000,000 and
B = 256 ((4,) float32, alpha 0.6), in alternating blocks of 200 calls so that
all three see the same machine load (docs/benchmarks.md, "Addendum: per-call
overhead ...").

    python benchmarks/ab_set_priority.py BASE_TREE AFTER_TREE [repetitions]

Two workloads: "same" writes one set of priorities at every call (after the
first call no leaf changes: what test_prioritized[*-update] times), "alt"
alternates two sets (every call changes every leaf: a learner's case; the
suite's test_update_by_batch_paired), "lookup" writes one set through the
handle form given copies of the batch's arrays and no pick_index (every pick
found through the episode map: test_prioritized[exreplay_lookup-update]),
"index" the same given the batch's pick_index too (each hint checked:
test_prioritized[exreplay_index-update]).
Prints the medians per call and the medians of the paired ratios."""
import gc
import statistics
import sys

import numpy as np

from ab_common import cpprb_buffer, filled, load_pair, paired, timed

mods = load_pair(sys.argv[1], sys.argv[2])
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 21
rng = np.random.default_rng(0)
N = 1_000_000
rb = cpprb_buffer(N, True, rng)
idx = rb.sample(256, beta=0.4)["indexes"]
p1 = rng.random(256) + 0.05; p2 = rng.random(256) + 0.05
fns = {}
for k, m in mods.items():
    b, s = filled(m, (4,), np.float32, N, 100, 1, kind=1, rng=rng)
    bb = b.get_batch(256, s)
    fns[k + " same"] = (lambda b=b, s=s, bb=bb: b.set_priority(s, bb, p1))
    fns[k + " alt"] = (lambda b=b, s=s, bb=bb: (b.set_priority(s, bb, p1), b.set_priority(s, bb, p2)))
    fns[k + " lookup"] = (lambda b=b, s=s, e=bb.pick_epi.copy(), q=bb.pick_pos.copy():
                          b.set_priority(s, e, q, p1))
    fns[k + " index"] = (lambda b=b, s=s, e=bb.pick_epi.copy(), q=bb.pick_pos.copy(), i=bb.pick_index.copy():
                         b.set_priority(s, e, q, p1, i))
fns["cpprb same"] = lambda: rb.update_priorities(idx, p1)
fns["cpprb alt"] = lambda: (rb.update_priorities(idx, p1), rb.update_priorities(idx, p2))
fns["cpprb lookup"] = fns["cpprb same"]
fns["cpprb index"] = fns["cpprb same"]
gc.collect()
res = {k: [] for k in fns}
for rep in range(REPS):
    keys = list(fns) if rep % 2 == 0 else list(reversed(fns))
    for k in keys:
        res[k].append(timed(fns[k], 200) / (2 if "alt" in k else 1))
for v in ("same", "alt", "lookup", "index"):
    b = res["base " + v]; a = res["after " + v]; c = res["cpprb " + v]
    print(f"{v:5s} base {statistics.median(b)*1e6:6.2f} us after {statistics.median(a)*1e6:6.2f} us cpprb {statistics.median(c)*1e6:6.2f} us | "
          f"after/base {paired(a, b):.3f} cpprb/base {paired(c, b):.2f}x cpprb/after {paired(c, a):.2f}x")
