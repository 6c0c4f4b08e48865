"""pytest configuration of the benchmark suite.

    pytest benchmarks                      # full sizes (what `make bench` runs)
    pytest benchmarks --bench-quick        # a smoke run of seconds (`make bench-quick`)
    EXREPLAY_BENCH_QUICK=1 pytest benchmarks   # the same

With --benchmark-json=PATH the JSON also holds, under "exreplay_bench", the
machine, the mode, the command and the measurements that are not a single
timing (threads, memory); benchmarks/report.py turns it into docs/benchmarks.md.
"""

import os
import platform
import subprocess
import sys
import time

# NumPy's OpenBLAS starts a pool of threads that can spin on the second core
# of a 2-core machine and steal it from the thread benchmarks (no benchmark
# makes a BLAS call). Set before NumPy is first imported; Ray's workers
# inherit it. An explicit setting in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

_T0 = time.time()


def _loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return None


_LOAD0 = _loadavg()

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--bench-quick",
        action="store_true",
        default=False,
        help="exreplay benchmarks: a few small points of each benchmark (smoke run)",
    )


def pytest_configure(config):
    if config.getoption("--bench-quick"):
        os.environ["EXREPLAY_BENCH_QUICK"] = "1"


@pytest.fixture(autouse=True)
def _speed_probe(request):
    """Every benchmark's extra_info gets "speed_probe_us": the CPU's speed
    probe (harness.speed_probe_us) right before the test and right after
    it, so that report.py can tell which measurements ran at the machine's
    fast speed. Outside the timed part; about 2 ms a test."""
    if "benchmark" not in request.fixturenames:
        yield
        return
    import harness

    bm = request.getfixturevalue("benchmark")
    before = harness.speed_probe_us()
    yield
    bm.extra_info["speed_probe_us"] = [round(before, 2), round(harness.speed_probe_us(), 2)]


def _run(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except Exception:  # noqa: BLE001 - informational only
        return ""


def machine_info():
    import numpy

    info = {
        "python": sys.version.split()[0],
        "python_impl": platform.python_implementation(),
        "numpy": numpy.__version__,
        "platform": platform.platform(),
        "cpus_online": os.cpu_count(),
    }
    lscpu = _run(["lscpu"])
    for line in lscpu.splitlines():
        key, _, val = line.partition(":")
        val = val.strip()
        if key == "Model name":
            info["cpu_model"] = val
        elif key == "CPU(s)":
            info["cpus"] = val
        elif key == "Thread(s) per core":
            info["threads_per_core"] = val
        elif key == "Hypervisor vendor":
            info["hypervisor"] = val
        elif key in ("L2 cache", "L3 cache"):
            info[key.lower().replace(" ", "_")] = val
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    info["ram_gib"] = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    try:
        import cpprb  # noqa: F401
        from importlib.metadata import version

        info["cpprb"] = version("cpprb")
    except Exception:  # noqa: BLE001
        info["cpprb"] = None
    try:
        from importlib.metadata import version

        info["pytest_benchmark"] = version("pytest-benchmark")
    except Exception:  # noqa: BLE001
        pass
    commit = _run(["git", "rev-parse", "--short", "HEAD"]).strip()
    if commit:
        dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"]).strip()
        info["git"] = commit + ("+dirty" if dirty else "")
    return info


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    import harness

    # Per-round raw data (thousands of numbers for the record rounds) would
    # make the JSON megabytes; the report uses the summary statistics.
    for b in output_json.get("benchmarks", []):
        b.get("stats", {}).pop("data", None)
    output_json["exreplay_bench"] = {
        "duration_s": round(time.time() - _T0, 1),
        "loadavg_start": _LOAD0,
        "loadavg_end": _loadavg(),
        "mode": "quick" if harness.quick() else "full",
        "command": "pytest " + " ".join(config.invocation_params.args),
        "make_target": os.environ.get("EXREPLAY_BENCH_TARGET", ""),
        "machine": machine_info(),
        "custom": harness.CUSTOM,
    }
