"""In-process A/B of set_priority(ps, batch, p) between two builds of
exreplay._core, next to cpprb's update_priorities, at N = 1,000,000 and
B = 256 ((4,) float32, alpha 0.6), in alternating blocks of 200 calls so that
all three see the same machine load (docs/benchmarks.md, "Addendum: per-call
overhead ...").

    python benchmarks/ab_set_priority.py BASE_TREE AFTER_TREE [repetitions]

Two workloads: "same" writes one set of priorities at every call (after the
first call no leaf changes: what test_prioritized[*-update] times), "alt"
alternates two sets (every call changes every leaf: a learner's case; the
suite's test_update_by_batch_paired). Prints the medians per call and the
medians of the paired ratios."""
import glob, importlib.util, statistics, sys, time, gc
import numpy as np
def load(name, d):
    p = glob.glob(d + "/exreplay/_core*.so")[0]
    spec = importlib.util.spec_from_file_location(name + "._core", p)
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); return m
mods = {"base": load("basepkg", sys.argv[1]), "after": load("afterpkg", sys.argv[2])}
REPS = int(sys.argv[3]) if len(sys.argv) > 3 else 21
rng = np.random.default_rng(0)
N = 1_000_000; EP = 100
def filled(m):
    b = m.ExperienceReplay((4,), capacity=N, pick_len=1, seed=1)
    s = b.new_pick_selector(1)
    st = rng.random((EP, 4)).astype(np.float32); ac = np.zeros(EP, np.int64); rw = np.ones(EP, np.float32)
    pr = rng.random(EP) + 0.05
    for _ in range(N // EP):
        b.record_many(None, st, ac, rw, final_state=st[0], terminated=False, priorities=pr)
    return b, s
import cpprb
SPEC = {"obs": {"shape": (4,), "dtype": np.float32}, "act": {"shape": 1, "dtype": np.int64},
        "rew": {}, "next_obs": {"shape": (4,), "dtype": np.float32}, "done": {}}
rb = cpprb.PrioritizedReplayBuffer(N, SPEC, alpha=0.6)
rb.add(obs=rng.random((N, 4), np.float32), act=np.zeros((N, 1), np.int64), rew=np.ones(N, np.float32),
       next_obs=rng.random((N, 4), np.float32), done=np.zeros(N, np.float32), priorities=rng.random(N) + 0.05)
idx = rb.sample(256, beta=0.4)["indexes"]
p1 = rng.random(256) + 0.05; p2 = rng.random(256) + 0.05
fns = {}
for k, m in mods.items():
    b, s = filled(m); bb = b.get_batch(256, s)
    fns[k + " same"] = (lambda b=b, s=s, bb=bb: b.set_priority(s, bb, p1))
    fns[k + " alt"] = (lambda b=b, s=s, bb=bb: (b.set_priority(s, bb, p1), b.set_priority(s, bb, p2)))
fns["cpprb same"] = lambda: rb.update_priorities(idx, p1)
fns["cpprb alt"] = lambda: (rb.update_priorities(idx, p1), rb.update_priorities(idx, p2))
gc.collect()
def timed(fn, n):
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n
res = {k: [] for k in fns}
for rep in range(REPS):
    keys = list(fns) if rep % 2 == 0 else list(reversed(fns))
    for k in keys:
        res[k].append(timed(fns[k], 200) / (2 if "alt" in k else 1))
for v in ("same", "alt"):
    b = res["base " + v]; a = res["after " + v]; c = res["cpprb " + v]
    print(f"{v:5s} base {statistics.median(b)*1e6:6.2f} us after {statistics.median(a)*1e6:6.2f} us cpprb {statistics.median(c)*1e6:6.2f} us | "
          f"after/base {statistics.median([x/y for x,y in zip(a,b)]):.3f} cpprb/base {statistics.median([x/y for x,y in zip(c,b)]):.2f}x cpprb/after {statistics.median([x/y for x,y in zip(c,a)]):.2f}x")
