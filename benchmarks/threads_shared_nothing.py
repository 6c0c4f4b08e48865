"""The Ape-X thread workloads of benchmarks/test_bench_threads.py with the
writers on the learner's buffer, and with the writers on a second buffer of the
same shape and fill (the two threads then share nothing of exreplay: no lock,
no memory they write): what the interpreter and the machine leave, next to
what sharing the buffer leaves, in the same rounds.

    OPENBLAS_NUM_THREADS=1 python benchmarks/threads_shared_nothing.py [rounds]

- pair: one writer (new_episode + record_many of 100 (4,) float32 steps with
  priorities) and one sampler (prioritized get_batch(256) + set_priority(256))
  flat out; "share" = each side's calls/s together divided by its calls/s
  alone, summed (2.0: both at full speed; the suite's speedup is about this);
- 4w+1l: the learner flat out, 4 writers each busy WRITER_DUTY of the time;
  the learner's calls/s with the writers over its calls/s alone.

Prints each round and the medians."""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import test_bench_threads as T  # noqa: E402
from ab_common import rates  # noqa: E402


def pair(rec, samp, rec_other, D=1.2):
    alone_r = rates([("r", rec, 0)], D)["r"]
    alone_s = rates([("s", samp, 0)], D)["s"]
    res = {}
    for name, w in (("same", rec), ("other", rec_other)):
        o = rates([("r", w, 0), ("s", samp, 0)], D)
        res[name] = o["r"] / alone_r + o["s"] / alone_s
    return res


def writers_learner(rec, samp, rec_other, pause, D=1.5):
    alone = rates([("l", samp, 0)], D)["l"]
    res = {}
    for name, w in (("same", rec), ("other", rec_other)):
        o = rates([("l", samp, 0)] + [(f"w{i}", w, pause) for i in range(T.WRITERS)], D)
        res[name] = o["l"] / alone
    return res


def main(rounds):
    _, rec, samp, _ = T._apex()
    _, rec_other, _, _ = T._apex()
    pause = harness.median_time(rec, 21) * (1 / T.WRITER_DUTY - 1)
    got = {k: [] for k in ("pair same", "pair other", "4w+1l same", "4w+1l other")}
    for r in range(rounds):
        p = pair(rec, samp, rec_other)
        w = writers_learner(rec, samp, rec_other, pause)
        for k, v in (("pair same", p["same"]), ("pair other", p["other"]),
                     ("4w+1l same", w["same"]), ("4w+1l other", w["other"])):
            got[k].append(v)
        print(f"round {r}: pair share {p['same']:.2f} (one buffer) {p['other']:.2f} (two buffers); "
              f"4w+1l learner {w['same']:.2f}x (one buffer) {w['other']:.2f}x (two buffers)", flush=True)
    print("medians: " + ", ".join(f"{k} {np.median(v):.2f}" for k, v in got.items()))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
