"""Paired A/B of two builds of the C Ape-X pair (benchmarks/c/pair.c), one
process at a time, the builds taking turns, so that both see the same
machine (single runs here swing by +-30%; docs/benchmarks.md, addendum
"The Ape-X pair without the interpreter, and with nothing shared").

    python benchmarks/ab_pair.py BASE_BIN AFTER_BIN [pairs] [seconds] [phase]

Each BIN is a `bench-pair` built from one tree (`make build/bench-pair`,
then copied aside). Each pair of runs is `BIN 1 SECONDS PHASE` of each
build, in alternating order (phase: shared, the default; separate; writer;
learner). Prints each run's calls per second and, per side, the median of
the paired after/base ratios."""
import re
import statistics
import subprocess
import sys


def run(binary, seconds, phase):
    """(writer/s, learner/s) of one run of `binary` in one phase."""
    out = subprocess.run([binary, "1", str(seconds), phase], check=True, capture_output=True,
                         text=True).stdout
    m = re.search(r"writer ([0-9.]+)/s learner ([0-9.]+)/s", out)
    if not m:
        raise SystemExit(f"{binary}: unexpected output {out!r}")
    return float(m.group(1)), float(m.group(2))


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    base, after = sys.argv[1], sys.argv[2]
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 0.5
    phase = sys.argv[5] if len(sys.argv) > 5 else "shared"
    ratios = {"writer": [], "learner": []}
    for i in range(pairs):
        got = {}
        for k in (("base", "after") if i % 2 == 0 else ("after", "base")):
            got[k] = run(base if k == "base" else after, seconds, phase)
        for j, side in enumerate(("writer", "learner")):
            if got["base"][j] > 0:  # a phase without this side prints 0
                ratios[side].append(got["after"][j] / got["base"][j])
        print(f"pair {i}: base writer {got['base'][0]:.0f}/s learner {got['base'][1]:.0f}/s | "
              f"after writer {got['after'][0]:.0f}/s learner {got['after'][1]:.0f}/s", flush=True)
    for side, r in ratios.items():
        if r:
            print(f"{side}: after/base median {statistics.median(r):.3f} over {len(r)} pairs "
                  f"(range {min(r):.3f}-{max(r):.3f})")


if __name__ == "__main__":
    main()
