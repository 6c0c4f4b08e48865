"""A writer recording alone after a learner drew beside it (docs/benchmarks.md,
addendum "the thread rows' one-thread baselines"), for one or more builds:

    OPENBLAS_NUM_THREADS=1 python benchmarks/writer_after_pair.py TREE [TREE ...]

Each TREE holds a built exreplay/_core*.so (see ab_common.load_build). For
each build in turn: the suite's Ape-X buffer (200,000 (4,) float32 records,
one prioritized selector, full) and `record_many` of 100 steps with
priorities timed alone (5 x 4,000 calls, the median per call), then 1 s of a
learner thread drawing `get_batch(256)` and updating the priorities beside
the writer, then the writer alone again, then again after single-thread
draws. A selector that the learner drew without the storage lock makes
record calls note their changes; a build that puts it back to changes in
place (docs/design.md, "Back to changes in place") records alone as fast as
before the pair.
"""
import statistics
import sys
import threading
import time

from ab_common import apex_pair, load_build


def per_call(rec, n=20_000, parts=5):
    """Median microseconds a call over `parts` loops of n / parts calls."""
    t = []
    for _ in range(parts):
        t0 = time.perf_counter()
        for _ in range(n // parts):
            rec()
        t.append((time.perf_counter() - t0) / (n // parts))
    return statistics.median(t) * 1e6


def one_build(m):
    buf, rec, samp = apex_pair(m)
    out = [per_call(rec)]
    stop = threading.Event()

    def learner():
        while not stop.is_set():
            samp()

    t = threading.Thread(target=learner)
    t.start()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        rec()
    stop.set()
    t.join()
    out.append(per_call(rec))
    samp()
    out.append(per_call(rec))
    buf._check()
    return out


def main():
    trees = sys.argv[1:] or ["."]
    for k, tree in enumerate(trees):
        m = load_build(f"build{k}", tree)
        never, after, draws = one_build(m)
        print(f"{tree}: record_many(100) alone {never:.2f} us a call; after 1 s beside a learner "
              f"{after:.2f}; then after a single-thread draw {draws:.2f}")


if __name__ == "__main__":
    main()
