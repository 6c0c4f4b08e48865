"""get_batch with shared next states against the default layout and the two
floors, one build, in one process (docs/benchmarks.md, addendum "Shared next
states").

    python benchmarks/shared_next.py [repetitions] [--only=TEXT ...]

For each case the four calls are timed in turn, in an order that rotates
every repetition, on the same buffer and the same floor rows:
- default: get_batch(B, ps), state and state_next as two arrays;
- shared: get_batch(B, ps, shared_next=True), one (B, L + 1) state array;
- floor: `_floor_gather(rows, starts, L)`, rows[s:s+L] and rows[s+1:s+L+1] of
  fresh random starts from one contiguous array (what the default layout's
  states cost at the least);
- floor_shared: `_floor_gather(rows, starts, L, True)`, rows[s:s+L+1] as one
  array (the same for the shared layout).
Prints the medians and the medians of the paired ratios shared/default,
shared/floor_shared, default/floor and shared/floor. With out=, both layouts
refill a batch of their own."""
import gc
import statistics
import sys

import numpy as np

from ab_common import Floor, filled, paired, timed
from exreplay import _core

rng = np.random.default_rng(0)


def case(n, ep, shape, dtype, L, B, calls, out=False):
    def make():
        b, s = filled(_core, shape, dtype, n, ep, L, rng=rng)
        if out:
            o1, o2 = b.get_batch(B, s), b.get_batch(B, s, shared_next=True)
            default = lambda: b.get_batch(B, s, out=o1)  # noqa: E731
            shared = lambda: b.get_batch(B, s, out=o2, shared_next=True)  # noqa: E731
        else:
            default = lambda: b.get_batch(B, s)  # noqa: E731
            shared = lambda: b.get_batch(B, s, shared_next=True)  # noqa: E731
        return {"default": default, "shared": shared,
                "floor": Floor(_core, n, shape, dtype, L, B, rng),
                "floor_shared": Floor(_core, n, shape, dtype, L, B, rng, shared=True)}, calls
    return make


CASES = {
    "get_5000 N=2048": case(2048, 64, (4,), np.float32, 8, 5000, 3),
    "get_5000 N=65536": case(65536, 512, (4,), np.float32, 8, 5000, 3),
    "get_5000 N=1048576": case(1048576, 512, (4,), np.float32, 8, 5000, 3),
    "get_batch(32) L=1 N=1M": case(1048576, 100, (4,), np.float32, 1, 32, 200),
    "get_batch(32, out=) L=1 N=1M": case(1048576, 100, (4,), np.float32, 1, 32, 200, out=True),
    "R2D2 B=32 L=80 84x84": case(100_000, 500, (84, 84), np.uint8, 80, 32, 1),
    "Atari B=512 L=1 84x84": case(100_000, 500, (84, 84), np.uint8, 1, 512, 2),
}


def run(name, fns, calls, reps):
    keys = list(fns)
    res = {k: [] for k in keys}
    for fn in fns.values():
        fn()
    for rep in range(reps):
        for k in keys[rep % 4:] + keys[:rep % 4]:
            res[k].append(timed(fns[k], calls))
    med = {k: statistics.median(v) * 1e6 for k, v in res.items()}
    print(f"{name:30s} default {med['default']:9.2f} us  shared {med['shared']:9.2f} us  "
          f"floor {med['floor']:9.2f} us  floor_shared {med['floor_shared']:9.2f} us  |  "
          f"shared/default {paired(res['shared'], res['default']):.3f}  "
          f"shared/floor_shared {paired(res['shared'], res['floor_shared']):.2f}x  "
          f"default/floor {paired(res['default'], res['floor']):.2f}x  "
          f"shared/floor {paired(res['shared'], res['floor']):.2f}x", flush=True)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    reps = int(args[0]) if args else 11
    only = [a[len("--only="):] for a in sys.argv if a.startswith("--only=")]
    for name, make in CASES.items():
        if only and not any(o in name for o in only):
            continue
        gc.collect()
        run(name, *make(), reps)


if __name__ == "__main__":
    main()
