"""Memory: bytes per record held beyond the payload, and per pick for a prioritized
selector (docs/design.md: targets <= 16 and <= 16).  Each measurement runs
benchmarks/memory_probe.py in a fresh process (RSS before/after filling)."""

import json
import os
import subprocess
import sys

import pytest

import harness

PROBE = os.path.join(os.path.dirname(__file__), "memory_probe.py")


def _cases():
    n, nref = harness.memory_size(), harness.memory_reference_size()
    return [("exreplay", n, 1), ("exreplay", n, 8), ("reference", nref, 1)]


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-N{c[1]}-L{c[2]}")
def test_memory(case):
    impl, n, pick_len = case
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, PROBE, impl, str(n), str(pick_len)],
        capture_output=True, text=True, env=env, cwd=root, timeout=600, check=True,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    harness.add_custom("memory", **res)
    print(f"\nmemory {impl} N={res['N']} pick_len={pick_len}: {res['rss_per_record']:.1f} B/record RSS, "
          f"{res['overhead_per_record']:.1f} B/record beyond the payload, "
          f"prioritized selector {res['prioritized_per_pick']:.1f} B/pick")
    assert res["N"] == n
