"""The Ape-X thread pair of benchmarks/test_bench_threads.py, run flat out:
each side's calls per second alone and with the other side running, and
the share of the wall time each thread spent on the CPU (time.thread_time).
A thread that makes fewer calls in the pair while staying on the CPU waits
by spinning (the storage lock's spin, docs/design.md); one that leaves the
CPU sleeps (the GIL, or a lock after its spin).

    OPENBLAS_NUM_THREADS=1 python benchmarks/pair_cpu.py [seconds]

Run from the tree whose build it should use (the tree's root first on
sys.path). Prints the pair, then each side alone."""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from test_bench_threads import _apex  # noqa: E402


def run(sides, seconds):
    """{name: (calls per second, CPU share of the wall time)} of the sides
    [(name, fn)] run together in their own threads for `seconds`."""
    stop = time.perf_counter() + seconds
    got = {}

    def loop(name, fn):
        n, c0 = 0, time.thread_time()
        while time.perf_counter() < stop:
            for _ in range(20):
                fn()
            n += 20
        got[name] = (n, time.thread_time() - c0)

    threads = [threading.Thread(target=loop, args=side) for side in sides]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {name: (n / wall, cpu / wall) for name, (n, cpu) in got.items()}


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    _, rec, samp, _ = _apex()
    sides = [("writer", rec), ("learner", samp)]
    alone = {name: run([(name, fn)], seconds)[name] for name, fn in sides}
    pair = run(sides, seconds)
    share = 0.0
    for name, _ in sides:
        (r, c), (ra, ca) = pair[name], alone[name]
        share += r / ra
        print(f"{name}: {r:,.0f} calls/s in the pair ({r / ra:.2f} of {ra:,.0f} alone), "
              f"on the CPU {c:.2f} of the wall time ({ca:.2f} alone)")
    print(f"pair share {share:.2f}")


if __name__ == "__main__":
    main()
