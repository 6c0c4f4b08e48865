"""The Ape-X thread workloads of benchmarks/test_bench_threads.py, each
side's calls per second alone and together, and the share of the wall time
each thread spent on the CPU (time.thread_time). A thread that makes fewer
calls together while staying on the CPU waits by spinning (the storage
lock's spin, docs/design.md); one that leaves the CPU sleeps (the GIL, a
lock after its spin) or was preempted by another thread.

    OPENBLAS_NUM_THREADS=1 python benchmarks/pair_cpu.py [seconds] [--writers K]

Without --writers: the pair (one writer, one learner) run flat out, then
each side alone. With --writers K: the learner alone, then with K writer
threads each busy 1/8 of the time as in the suite's 4 writers + 1 learner
(the writers' calls and CPU summed), three rounds.

Run from the tree whose build it should use (the tree's root first on
sys.path)."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import harness  # noqa: E402
from test_bench_threads import WRITER_DUTY, _apex  # noqa: E402


def run(sides, seconds):
    """{name: (calls per second, CPU share of the wall time)} of the sides
    [(name, fn, pause)] run together in their own threads for `seconds`,
    each calling fn in a loop with `pause` seconds between calls (0: none)."""
    stop = threading.Event()
    got = {}

    def loop(name, fn, pause):
        n, c0, t0 = 0, time.thread_time(), time.perf_counter()
        while not stop.is_set():
            fn()
            n += 1
            if pause:
                stop.wait(pause)
        wall = time.perf_counter() - t0
        got[name] = (n / wall, (time.thread_time() - c0) / wall)

    threads = [threading.Thread(target=loop, args=side) for side in sides]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return got


def pair(rec, samp, seconds):
    sides = [("writer", rec, 0), ("learner", samp, 0)]
    alone = {side[0]: run([side], seconds)[side[0]] for side in sides}
    both = run(sides, seconds)
    share = 0.0
    for name, _, _ in sides:
        (r, c), (ra, ca) = both[name], alone[name]
        share += r / ra
        print(f"{name}: {r:,.0f} calls/s in the pair ({r / ra:.2f} of {ra:,.0f} alone), "
              f"on the CPU {c:.2f} of the wall time ({ca:.2f} alone)")
    print(f"pair share {share:.2f}")


def writers_and_learner(rec, samp, seconds, k):
    pause = harness.median_time(rec, 21) * (1 / WRITER_DUTY - 1)
    for _ in range(3):
        (ra, ca) = run([("learner", samp, 0)], seconds)["learner"]
        got = run([("learner", samp, 0)] + [(f"w{i}", rec, pause) for i in range(k)], seconds)
        r, c = got.pop("learner")
        print(f"learner alone {ra:,.0f}/s (CPU {ca:.2f}), with {k} writers {r:,.0f}/s "
              f"({r / ra:.2f}x, CPU {c:.2f}); writers {sum(v[0] for v in got.values()):,.0f} calls/s, "
              f"CPU {sum(v[1] for v in got.values()):.2f}")


def main():
    args = sys.argv[1:]
    k = 0
    if "--writers" in args:
        i = args.index("--writers")
        k = int(args[i + 1])
        del args[i:i + 2]
    seconds = float(args[0]) if args else 3.0
    _, rec, samp, _ = _apex()
    if k:
        writers_and_learner(rec, samp, seconds, k)
    else:
        pair(rec, samp, seconds)


if __name__ == "__main__":
    main()
