"""The CPU's speed over time, beside the time of a `record` call.

    OPENBLAS_NUM_THREADS=1 python benchmarks/speed_probe_trace.py [SECONDS [PAUSE]]

Every PAUSE seconds (default 1.5, for SECONDS, default 60): the speed probe
the suite takes before and after every benchmark (harness.speed_probe_us:
the best of 20 `zlib.crc32` of 64 KiB in cache), the median of five timed
loops of 2,000 `record` calls (µs a call, (4,) float32 states into a buffer
of 2^20 records), and the probe again. On the development VM the probe
reads 14.7 µs at the fast speed and 18-46 µs otherwise, changing from one
line to the next, and `record` mostly follows it (docs/benchmarks.md,
addendum "A speed probe beside every benchmark"). The last line gives the share of lines
whose two probes were both at the fast speed as report.py reads it (within
SPEED_FAST_WITHIN of the fastest), and the median
`record` time of those lines and of the others.
"""

import statistics
import sys
import time

import numpy as np

import harness
import exreplay
from report import SPEED_FAST_WITHIN  # the fast speed, as the report reads it


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 60.0
    pause = float(sys.argv[2]) if len(sys.argv) > 2 else 1.5
    buf = exreplay.ExperienceReplay((4,), capacity=1 << 20, pick_len=8, seed=1)
    buf.new_pick_selector(0)
    s = np.zeros(4, np.float32)

    def record_us():
        h = None
        t0 = time.perf_counter()
        for _ in range(2000):
            h = buf.record(h, s, 0, 1.0)
        return (time.perf_counter() - t0) / 2000 * 1e6

    lines = []
    t0 = time.time()
    while time.time() - t0 < secs:
        a = harness.speed_probe_us()
        r = statistics.median(record_us() for _ in range(5))
        b = harness.speed_probe_us()
        lines.append((a, b, r))
        print(f"{time.time() - t0:6.1f} s  probe {a:6.2f} {b:6.2f} us  record {r:.3f} us a call", flush=True)
        time.sleep(pause)
    fastest = min(min(a, b) for a, b, _ in lines)
    fast = [r for a, b, r in lines if max(a, b) <= fastest * SPEED_FAST_WITHIN]
    slow = [r for a, b, r in lines if max(a, b) > fastest * SPEED_FAST_WITHIN]
    med = lambda xs: f"{statistics.median(xs):.3f} us" if xs else "-"  # noqa: E731
    print(f"fastest probe {fastest:.2f} us; fast lines {len(fast)}/{len(lines)}: record {med(fast)}; "
          f"the others: record {med(slow)}")


if __name__ == "__main__":
    main()
