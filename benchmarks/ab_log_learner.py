"""A prioritized learner (get_batch(256) + set_priority(256)) beside a writer
thread that records 100-step rollouts at a fixed rate into the same buffer,
with an experience log attached, for two or more builds in one process, the
builds taking turns every repetition. Prints each build's median learner batches/s
(and the writer's records/s) and the median of its paired ratios to the
first build's. For changes to how the log's writer thread meets the buffer's locks:

    python benchmarks/ab_log_learner.py /tmp/old,.[,...] [REPS [CHUNK_BYTES [RECORDS_PER_S [LOG]]]]

(defaults 12, 65536, 300000, 1; LOG 0 times the same without a log). Each
tree holds a built exreplay/_core*.so."""
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from ab_common import load_build

SECONDS = 1.0


def one(m, path, chunk_bytes, pace, use_log, arrays):
    st, ac, rw, pri, newp = arrays
    buf = m.ExperienceReplay(state_shape=(4,), capacity=100_000, pick_len=1, seed=1)
    ps = buf.new_pick_selector(1)
    for _ in range(1000):
        buf.record_many(None, st, ac, rw, final_state=st[0], priorities=pri)
    lg = m.ExperienceLog(path, chunk_bytes=chunk_bytes, overwrite=True)
    if use_log:
        buf.attach_log(lg)
    stop, calls = threading.Event(), [0]

    def writer():
        due = time.perf_counter()
        while not stop.is_set():
            buf.record_many(None, st, ac, rw, final_state=st[0], priorities=pri)
            calls[0] += 1
            due += pace
            left = due - time.perf_counter()
            if left > 0:
                time.sleep(left)

    th = threading.Thread(target=writer)
    th.start()
    n, t = 0, time.perf_counter()
    while time.perf_counter() - t < SECONDS:
        b = buf.get_batch(256, ps)
        buf.set_priority(ps, b.pick_epi, b.pick_pos, newp)
        n += 1
    el = time.perf_counter() - t
    stop.set()
    th.join()
    lg.close()
    os.unlink(path)
    return n / el, calls[0] * len(st) / el


def main():
    trees = sys.argv[1].split(",")
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
    chunk_bytes = int(sys.argv[3]) if len(sys.argv) > 3 else 65536
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 300_000
    use_log = int(sys.argv[5]) if len(sys.argv) > 5 else 1
    builds = [load_build(f"build{i}", t) for i, t in enumerate(trees)]
    rng = np.random.default_rng(0)
    arrays = (rng.random((100, 4)).astype(np.float32), np.arange(100), np.ones(100, np.float32),
              rng.random(100) + 0.1, rng.random(256) + 0.05)
    d = tempfile.mkdtemp()
    res = [[] for _ in trees]
    for r in range(reps):
        order = list(range(len(trees)))
        for i in order if r % 2 == 0 else order[::-1]:
            res[i].append(one(builds[i], os.path.join(d, "ab.log"), chunk_bytes, 100 / rate, use_log,
                              arrays))
    for t, rs in zip(trees, res):
        print(f"{t}: learner {statistics.median(x[0] for x in rs):,.0f} batches/s, "
              f"writer {statistics.median(x[1] for x in rs):,.0f} records/s")
    for t, rs in zip(trees[1:], res[1:]):
        ratio = statistics.median(b[0] / a[0] for a, b in zip(res[0], rs))
        print(f"{t}: learner paired ÷ first {ratio:.3f}")
    os.rmdir(d)


if __name__ == "__main__":
    main()
