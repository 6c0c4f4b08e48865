"""Persistence: serialize / unserialize throughput against zlib and memcpy, and the
peak memory of save() (docs/format.md: save streams, no second full copy).

The buffer: 84x84 uint8 frames (int64 actions, float32 rewards) in episodes of
500 steps, filled by harness.fill (random frames: zlib's worst case), with a
uniform and a prioritized selector; ~256 MB of raw payload (quick mode: ~16 MB).
The raw payload is serialize(level=0)[40:].

- level 1: serialize(level=1) against zlib.compress(raw, 1) of the same bytes;
  unserialize of that buffer against zlib.decompress of its body;
- level 0: serialize(level=0) and unserialize, in GB/s of raw payload (goal:
  >= 1 GB/s), against a plain copy of the same bytes (bytearray(raw)).

Each pair is timed in alternation in the same run: pytest-benchmark times the
exreplay call, and the pedantic setup before each round times the counterpart
(zlib or the copy) with time.perf_counter. Ratios are of the two medians.

Full mode only: the peak extra memory of save() of a ~2 GB buffer (level 0 and
level 1), in a fresh process: VmHWM (reset through /proc/self/clear_refs just
before the save) minus VmRSS before it; ru_maxrss is reported alongside.

report.py does not know this suite: the numbers go to the JSON as custom
records (kind "persistence") and to benchmarks/results/persistence.json
(quick mode: build/bench-quick/persistence.json; EXREPLAY_BENCH_PERSISTENCE_JSON
overrides). Nothing asserts on a time.
"""

import json
import os
import statistics
import subprocess
import sys
import time
import zlib

import pytest

import harness

EP = 500
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS: dict = {}
_CACHE: dict = {}


def _target_bytes():
    return (16 if harness.quick() else 256) << 20


def _records(nbytes):
    return max(EP, nbytes // harness.payload_bytes(harness.ATARI_SHAPE, harness.ATARI_DTYPE))


def _data():
    if not _CACHE:
        harness.collect()
        n = _records(_target_bytes())
        buf = harness.impl_class("exreplay")(state_shape=harness.ATARI_SHAPE, state_dtype="uint8",
                                             capacity=None, seed=1)
        harness.uniform(buf)
        harness.prioritized(buf)
        harness.fill(buf, n, EP, harness.ATARI_SHAPE, harness.ATARI_DTYPE)
        s0 = buf.serialize(level=0)
        s1 = buf.serialize(level=1)
        _CACHE.update(buf=buf, n=n, s0=s0, raw=s0[40:], s1=s1, body1=s1[40:])
    return _CACHE


def _out_path():
    p = os.environ.get("EXREPLAY_BENCH_PERSISTENCE_JSON")
    if p:
        return p
    if harness.quick():
        return os.path.join(ROOT, "build", "bench-quick", "persistence.json")
    return os.path.join(ROOT, "benchmarks", "results", "persistence.json")


def _write_results():
    path = _out_path()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"mode": "quick" if harness.quick() else "full", "results": RESULTS}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)


def _pair(benchmark, name, fn, ref_name, ref_fn, rounds):
    """Times fn with pytest-benchmark and ref_fn before each of its rounds."""
    d = _data()
    ref_times = []

    def setup():
        harness.collect()
        t = time.perf_counter()
        ref_fn()
        ref_times.append(time.perf_counter() - t)
        harness.collect()

    benchmark.pedantic(fn, setup=setup, rounds=rounds, warmup_rounds=1)
    t_ex = benchmark.stats.stats.median
    t_ref = statistics.median(ref_times)
    raw = len(d["raw"])
    rec = {
        "raw_bytes": raw, "records": d["n"], "rounds": rounds,
        "exreplay_s": t_ex, "ref": ref_name, "ref_s": t_ref,
        "exreplay_GBps": raw / t_ex / 1e9, "ref_GBps": raw / t_ref / 1e9,
        "ref_over_exreplay": t_ref / t_ex,
        "level1_body_bytes": len(d["body1"]),
    }
    RESULTS[name] = rec
    harness.add_custom("persistence", case=name, **rec)
    _write_results()
    print(f"\n{name}: exreplay {rec['exreplay_GBps']:.3f} GB/s ({t_ex * 1e3:.1f} ms), {ref_name} "
          f"{rec['ref_GBps']:.3f} GB/s ({t_ref * 1e3:.1f} ms); {ref_name} time / exreplay time = "
          f"{rec['ref_over_exreplay']:.3f} ({raw / 1e6:.0f} MB raw)")
    return rec


def _rounds():
    return harness.rounds(7, 3)


def test_serialize_level1(benchmark):
    d = _data()
    harness.tag(benchmark, "persistence", suite="persistence", case="serialize_l1",
                impl="exreplay", N=d["n"])
    _pair(benchmark, "serialize_l1", lambda: d["buf"].serialize(level=1),
          "zlib.compress(raw, 1)", lambda: zlib.compress(d["raw"], 1), harness.rounds(3, 3))


def test_unserialize_level1(benchmark):
    d = _data()
    harness.tag(benchmark, "persistence", suite="persistence", case="unserialize_l1",
                impl="exreplay", N=d["n"])
    ER = type(d["buf"])
    _pair(benchmark, "unserialize_l1", lambda: ER.unserialize(d["s1"]),
          "zlib.decompress(body)", lambda: zlib.decompress(d["body1"]), _rounds())


def test_serialize_level0(benchmark):
    d = _data()
    harness.tag(benchmark, "persistence", suite="persistence", case="serialize_l0",
                impl="exreplay", N=d["n"])
    rec = _pair(benchmark, "serialize_l0", lambda: d["buf"].serialize(level=0),
                "bytearray(raw) copy", lambda: bytearray(d["raw"]), _rounds())
    rec["goal_GBps"] = 1.0
    rec["goal_met"] = rec["exreplay_GBps"] >= 1.0
    _write_results()


def test_unserialize_level0(benchmark):
    d = _data()
    harness.tag(benchmark, "persistence", suite="persistence", case="unserialize_l0",
                impl="exreplay", N=d["n"])
    ER = type(d["buf"])
    rec = _pair(benchmark, "unserialize_l0", lambda: ER.unserialize(d["s0"]),
                "bytearray(raw) copy", lambda: bytearray(d["raw"]), _rounds())
    rec["goal_GBps"] = 1.0
    rec["goal_met"] = rec["exreplay_GBps"] >= 1.0
    _write_results()
    _CACHE.clear()  # frees ~1 GB before the next suite
    harness.collect()


# ---- peak memory of save() of a ~2 GB buffer (full mode only) ---------------------------

_SAVE_PROBE = r"""
import json, os, resource, sys, tempfile, time
sys.path.insert(0, {bench!r})
import harness
n, level, d = {n}, {level}, {tmpdir!r}

def status(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return int(line.split()[1]) * 1024

buf = harness.impl_class('exreplay')(state_shape=harness.ATARI_SHAPE, state_dtype='uint8',
                                     capacity=None, seed=1)
harness.uniform(buf)
harness.prioritized(buf)
harness.fill(buf, n, {ep}, harness.ATARI_SHAPE, harness.ATARI_DTYPE)
harness.collect()
path = os.path.join(d, 'persist-bench.exr')
rss0 = status('VmRSS')
maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open('/proc/self/clear_refs', 'w') as f:   # resets VmHWM to the current RSS
    f.write('5')
hwm0 = status('VmHWM')
t = time.perf_counter()
buf.save(path, level=level)
dt = time.perf_counter() - t
hwm1 = status('VmHWM')
maxrss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
size = os.path.getsize(path)
os.unlink(path)
print(json.dumps(dict(records=n, level=level, file_bytes=size, rss_before=rss0,
                      hwm_reset_to=hwm0, hwm_after=hwm1, peak_extra_bytes=hwm1 - rss0,
                      maxrss_before=maxrss0, maxrss_after=maxrss1,
                      maxrss_growth=maxrss1 - maxrss0, save_s=dt)))
"""


@pytest.mark.skipif(harness.quick(), reason="full mode only: fills a ~2 GB buffer")
@pytest.mark.parametrize("level", [0, 1])
def test_save_peak_memory(level, tmp_path):
    n = _records(2 * 10**9)
    code = _SAVE_PROBE.format(bench=os.path.dirname(os.path.abspath(__file__)), n=n, level=level,
                              tmpdir=str(tmp_path), ep=EP)
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=ROOT, timeout=1200, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    RESULTS[f"save_peak_memory_l{level}"] = res
    harness.add_custom("persistence", case=f"save_peak_memory_l{level}", **res)
    _write_results()
    print(f"\nsave(level={level}) of {res['file_bytes'] / 1e9:.2f} GB: peak extra memory "
          f"{res['peak_extra_bytes'] / 2**20:.1f} MiB (VmHWM - VmRSS before), ru_maxrss grew "
          f"{res['maxrss_growth'] / 2**20:.1f} MiB, {res['save_s']:.1f} s")
