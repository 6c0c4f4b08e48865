"""The paper's record loop (test_bench_paper.py's record_100: one `record`
call a step into a buffer filled from empty, (4,) float32 states, pick_len 8,
one uniform selector, an episode of E steps ending with final_state=) for
several builds in one process, the builds taking turns every repetition.
Prints each build's median µs per record call and the median of its paired
ratios to the first build. For finding when a commit changed the cost of a
single record, e.g. against a commit from before a change:

    git worktree add /tmp/old <commit> && (cd /tmp/old && python setup.py build_ext --inplace)
    python benchmarks/ab_record.py /tmp/old,. [repetitions] [N]

Each tree holds a built exreplay/_core*.so. A tree named twice (`.,.`) is
timed against a copy of itself: the noise of the comparison (ab_common.py)."""
import statistics
import sys
import time

import numpy as np

from ab_common import load_build

E = 100


def per_record(m, rows, fin, n):
    """Median over the episodes of µs per record call while n records fill a new buffer."""
    buf = m.ExperienceReplay(state_shape=(4,), state_dtype="float32", capacity=n, pick_len=8, seed=1)
    buf.new_pick_selector(0)
    rec = buf.record
    h = buf.new_episode()
    times = []
    for _ in range(n // E):
        t = time.perf_counter()
        for st in rows[:-1]:
            h = rec(h, st, 1, 0.5)
        h = rec(h, rows[-1], 1, 0.5, final_state=fin)
        times.append(time.perf_counter() - t)
    return statistics.median(times) / E * 1e6


def main():
    trees = sys.argv[1].split(",")
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    builds = [(f"{t} [{i}]", load_build(f"build{i}", t)) for i, t in enumerate(trees)]
    rng = np.random.default_rng(0)
    rows = [rng.random(4).astype(np.float32) for _ in range(E)]
    fin = rng.random(4).astype(np.float32)
    res = {t: [] for t, _ in builds}
    for r in range(reps):
        for t, m in builds if r % 2 == 0 else builds[::-1]:
            res[t].append(per_record(m, rows, fin, n))
    first = builds[0][0]
    for t, _ in builds:
        ratio = statistics.median(a / b for a, b in zip(res[t], res[first]))
        print(f"{t:30s} {statistics.median(res[t]):.4f} µs a record   paired ÷ first {ratio:.3f}")


if __name__ == "__main__":
    main()
