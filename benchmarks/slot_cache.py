"""Whether get_batch(32, out=) at N = 1M waits for the episode slots: the same
N, table and rows in episodes of E1 records (many slots, mostly out of cache)
and of E2 (few slots, always in cache), two buffers timed in turn.

    OPENBLAS_NUM_THREADS=1 python benchmarks/slot_cache.py [ROUNDS [E1 E2]]

Prints each buffer's median and best µs a call over ROUNDS rounds of 2,000
calls (default 30; E1 = 100, E2 = 2,000) and the median of the paired ratios
E2 / E1: near 1 when the slots are not what the call waits for."""
import statistics
import sys
import time

import harness


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    eps = (int(sys.argv[2]), int(sys.argv[3])) if len(sys.argv) > 3 else (100, 2000)
    n = 1_000_000
    bufs = []
    for e in eps:
        buf = harness.impl_class("exreplay")(state_shape=harness.SMALL_SHAPE, capacity=n, pick_len=1,
                                             seed=1)
        ps = harness.uniform(buf)
        harness.fill(buf, n, e, with_priorities=False)
        bufs.append((buf, ps, buf.get_batch(32, ps)))
    times = [[], []]
    for _ in range(rounds):
        for k, (buf, ps, out) in enumerate(bufs):
            get = buf.get_batch
            t = time.perf_counter()
            for _ in range(2000):
                get(32, ps, out=out)
            times[k].append((time.perf_counter() - t) / 2000 * 1e6)
    for e, ts in zip(eps, times):
        print(f"episodes of {e:>6} records ({n // e:>6} slots): median {statistics.median(ts):.3f} µs, "
              f"best {min(ts):.3f} µs")
    print(f"paired {eps[1]} / {eps[0]}: {statistics.median(b / a for a, b in zip(*times)):.3f}")


if __name__ == "__main__":
    main()
