"""In-process A/B of two builds of exreplay._core on the Ape-X thread pair and
4 writers + 1 learner of benchmarks/test_bench_threads.py, alternating the
builds every round so that both see the same machine load.

    OPENBLAS_NUM_THREADS=1 python benchmarks/ab_threads.py BASE_TREE AFTER_TREE [rounds]

Each tree holds a built exreplay/_core*.so (see benchmarks/ab_builds.py).
pair share: each side's calls/s together over its calls/s alone (measured
in the same round), summed: 2.0 is both at full speed (each side's part is
printed too: the suite's fixed-work speedup follows the slower side). 4w+1l: the learner's
calls/s with 4 writers (each busy 1/8 of the time) over its calls/s alone.
Prints each round (with the machine's cross-core round trip measured before
it, when either build has the probe: docs/benchmarks.md, "Two machines in
one") and the medians, then each side's calls per second alone,
in the pair and (the learner) with 4 writers, with the median of the paired
after/base ratios: a build that makes a side faster alone lowers its share
unless the side gains as much together."""
import statistics, sys

from ab_common import apex_pair, load_pair, rates as run, timed

def apex(m):
    _, rec, samp = apex_pair(m)
    return rec, samp


def one_round(rec, samp, pause, D=0.8):
    r = run([("r", rec, 0)], D)["r"]; s = run([("s", samp, 0)], D)["s"]
    both = run([("r", rec, 0), ("s", samp, 0)], D)
    w = run([("s", samp, 0)] + [(f"w{i}", rec, pause) for i in range(4)], D)
    return (both["r"] / r + both["s"] / s, w["s"] / s, both["r"] / r, both["s"] / s,
            r, s, both["r"], both["s"], w["s"])

def main():
    mods = load_pair(sys.argv[1], sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    work = {k: apex(m) for k, m in mods.items()}
    t = {}
    for k, (rec, _) in work.items():
        t[k] = timed(rec, 200)
    pause = {k: v * 7 for k, v in t.items()}  # busy 1/8 of the time
    got = {k: tuple([] for _ in range(9)) for k in mods}
    probe = next((m._crosscore_ns for m in mods.values() if hasattr(m, "_crosscore_ns")), None)
    for i in range(rounds):
        xc = f"; cross-core {probe(0.1):.0f} ns" if probe else ""
        for k in (("base", "after") if i % 2 == 0 else ("after", "base")):
            for j, v in enumerate(one_round(*work[k], pause[k])):
                got[k][j].append(v)
        print(f"round {i}: pair share base {got['base'][0][-1]:.2f} after {got['after'][0][-1]:.2f}; "
              f"4w+1l base {got['base'][1][-1]:.2f}x after {got['after'][1][-1]:.2f}x{xc}", flush=True)
    for k in mods:
        print(f"{k}: pair share median {statistics.median(got[k][0]):.2f} (writer "
              f"{statistics.median(got[k][2]):.2f} + learner {statistics.median(got[k][3]):.2f}), "
              f"4w+1l learner median {statistics.median(got[k][1]):.2f}x")
    for j, name in [(4, "writer alone"), (5, "learner alone"), (6, "writer in the pair"),
                    (7, "learner in the pair"), (8, "learner with 4 writers")]:
        r = [a / b for a, b in zip(got["after"][j], got["base"][j])]
        print(f"{name}: base {statistics.median(got['base'][j]):,.0f}/s after "
              f"{statistics.median(got['after'][j]):,.0f}/s, paired after/base {statistics.median(r):.3f}")
    ratio = [a / b for a, b in zip(got["after"][0], got["base"][0])]
    print(f"paired after/base pair share: median {statistics.median(ratio):.2f}")

main()
