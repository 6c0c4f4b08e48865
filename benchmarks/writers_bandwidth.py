"""The two-Atari-writers row of benchmarks/test_bench_threads.py in bytes per
second: what one and two record_many writers move, next to plain NumPy copies
of the same rollouts, in the same rounds.

    OPENBLAS_NUM_THREADS=1 python benchmarks/writers_bandwidth.py [rounds]
    OPENBLAS_NUM_THREADS=1 python benchmarks/writers_bandwidth.py --ab BASE_TREE AFTER_TREE [rounds]

Each writer records 100-step rollouts of (84, 84) uint8 frames (706 KB of
states a call) into a full buffer of 20,000 records (capacity, so every call
evicts), as the suite's writers do. The NumPy reference copies the same 100
frames with np.copyto into a 20,000-frame array of its own, at the next
position each time (the same bytes written to the same amount of memory).
Each round times, for a fixed number of calls a thread:

- exreplay: one writer, then two on one buffer, then two on two buffers;
- numpy: one thread, then two threads.

and prints GB/s of states written (calls x 706 KB / wall time) and each
pair's speedup over one thread doing both threads' calls, with the
machine's cross-core round trip measured before the round
(docs/benchmarks.md, "Two machines in one"). With --ab, two
builds of exreplay._core (each tree holding a built exreplay/_core*.so, as
for benchmarks/ab_builds.py) in one process instead, each round timing one
writer and two on one buffer in each build in turn. The suite's goal
row divides that speedup by its np.sin control's, which computes in cache:
where one writer alone already moves most of what the memory takes, two
cannot be near twice as fast, whatever they share.
"""
import itertools
import statistics
import sys

import numpy as np

import exreplay
from ab_common import load_pair
from harness import crosscore_ns, together

CAP, EP, SHAPE = 20_000, 100, (84, 84)
FRAME = SHAPE[0] * SHAPE[1]


def buffer(mod=exreplay):
    buf = mod.ExperienceReplay(SHAPE, state_dtype="uint8", capacity=CAP, pick_len=1, seed=1)
    buf.new_pick_selector(0)
    return buf


def arrays(seed):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 255, (EP,) + SHAPE, dtype=np.uint8), np.zeros(EP, np.int64),
            np.ones(EP, np.float32), np.zeros(SHAPE, np.uint8))


def recorder(buf, seed):
    st, ac, rw, fin = arrays(seed)
    while len(buf) < CAP:
        buf.record_many(buf.new_episode(), st, ac, rw, final_state=fin)

    def call():
        buf.record_many(buf.new_episode(), st, ac, rw, final_state=fin)
    return call


def copier(seed):
    src = arrays(seed)[0]
    dst = np.ones((CAP,) + SHAPE, np.uint8)
    calls = itertools.count()

    def call():
        p = (next(calls) * EP) % (CAP - EP)
        np.copyto(dst[p:p + EP], src)
    return call


def wall(calls, n):
    """Seconds for each of calls (one per thread) to run n times, together."""
    return together([(fn, n) for fn in calls])


def main_ab(base, after, rounds):
    mods = load_pair(base, after)
    rec = {k: recorder(buffer(m), 0) for k, m in mods.items()}
    n, gb = 1500, EP * FRAME / 1e9
    got = {k: ([], []) for k in rec}
    for r in range(rounds):
        for k, fn in rec.items():
            got[k][0].append(n * gb / wall([fn], n))
            got[k][1].append(2 * n * gb / wall([fn, fn], n))
        print(f"round {r}: " + "; ".join(f"{k} {v[0][-1]:.1f} GB/s alone, two {v[1][-1]:.1f}"
                                          for k, v in got.items()), flush=True)
    for k, (one, two) in got.items():
        o, t = statistics.median(one), statistics.median(two)
        print(f"{k}: one writer {o:.1f} GB/s, two on one buffer {t:.1f} GB/s ({t / o:.2f}x)")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--ab":
        return main_ab(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 7)
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    a, b = buffer(), buffer()
    ra, ra2, rb = recorder(a, 0), recorder(a, 1), recorder(b, 1)
    c1, c2 = copier(0), copier(1)
    n = 2000
    gb = EP * FRAME / 1e9
    rows = {k: [] for k in ("x1", "x_one", "x_two", "np1", "np2")}
    for r in range(rounds):
        xc = crosscore_ns()
        one = wall([ra], n)
        shared = wall([ra, ra2], n)
        apart = wall([ra, rb], n)
        np_one = wall([c1], n)
        np_two = wall([c1, c2], n)
        rows["x1"].append(n * gb / one)
        rows["x_one"].append(2 * n * gb / shared)
        rows["x_two"].append(2 * n * gb / apart)
        rows["np1"].append(n * gb / np_one)
        rows["np2"].append(2 * n * gb / np_two)
        print(f"round {r}: exreplay {rows['x1'][-1]:.1f} GB/s alone, two on one buffer "
              f"{rows['x_one'][-1]:.1f}, on two {rows['x_two'][-1]:.1f}; numpy "
              f"{rows['np1'][-1]:.1f} alone, two {rows['np2'][-1]:.1f}; cross-core {xc:.0f} ns", flush=True)
    m = {k: statistics.median(v) for k, v in rows.items()}
    print(f"medians over {rounds} rounds, GB/s of states written (speedup of the pair):")
    print(f"  exreplay record_many: one writer {m['x1']:.1f}; two on one buffer {m['x_one']:.1f} "
          f"({m['x_one'] / m['x1']:.2f}x); two on two buffers {m['x_two']:.1f} "
          f"({m['x_two'] / m['x1']:.2f}x)")
    print(f"  numpy copyto:         one thread {m['np1']:.1f}; two threads {m['np2']:.1f} "
          f"({m['np2'] / m['np1']:.2f}x)")


if __name__ == "__main__":
    main()
