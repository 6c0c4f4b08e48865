"""Fuzzing ExperienceReplay.unserialize (docs/format.md): arbitrary bytes give a buffer or
ValueError; never a crash, a hang, MemoryError, or an allocation far beyond
what the input's length justifies -- also when the checksums are fixed up.

test_mutation_fuzz runs tests/fuzz_worker.py in subprocesses (one per core, at
most 2), so a segfault, an abort (ASan/UBSan) or a hang fails this test
instead of killing pytest. It runs EXREPLAY_FUZZ_INPUTS inputs (default
100,000; ~10 s here) in the normal build and the same 100,000 under the ASan
build (``make asan``; ~1-2 min there: the inputs are small). In the normal
run each worker has RLIMIT_AS = 2 GiB, so an input that makes unserialize
reserve gigabytes fails as MemoryError; under ASan there is no such limit (its
shadow memory needs terabytes of address space) and allocation failures
return NULL (allocator_may_return_null=1), so the same input still shows as
MemoryError.

On a failure the test prints the failing input's index, mutation, error and
hex, and keeps the input as a file (the path is in the message). Re-run it
with ``python tests/fuzz_worker.py --replay FILE`` or
``python tests/fuzz_worker.py --seed S --only INDEX``.

The bugs the fuzzer found are fixed; their smallest inputs stay at the end as
regression tests.
"""

import json
import os
import struct
import subprocess
import sys
import time
import zlib

import numpy as np
import pytest

import exreplay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fuzz_worker as fw  # noqa: E402
import memwatch  # noqa: E402

ER = exreplay.ExperienceReplay
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_worker.py")
ASAN = os.environ.get("EXREPLAY_ASAN", "") not in ("", "0")
N_INPUTS = int(os.environ.get("EXREPLAY_FUZZ_INPUTS", "100000"))
FUZZ_SEED = int(os.environ.get("EXREPLAY_FUZZ_SEED", "20240611"))
RLIMIT_AS = 0 if ASAN else 2 << 30
TIMEOUT = 1500 if ASAN else 300


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(exreplay.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run_python(code, timeout=120, rlimit_as=RLIMIT_AS):
    """Runs code in a fresh interpreter (an abort there fails a test, not pytest)."""
    pre = ""
    if rlimit_as:
        pre = f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({rlimit_as}, {rlimit_as}))\n"
    return subprocess.run([sys.executable, "-c", pre + code], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


# ---- the mutation fuzzer ------------------------------------------------------------


def test_mutation_fuzz(tmp_path):
    shards = max(1, min(2, os.cpu_count() or 1))
    t0 = time.perf_counter()
    procs = []
    for k in range(shards):
        cmd = [sys.executable, WORKER, "--count", str(N_INPUTS), "--seed", str(FUZZ_SEED),
               "--shard", str(k), "--shards", str(shards), "--out", str(tmp_path),
               "--rlimit-as", str(RLIMIT_AS), "--batch", "1000",
               "--watchdog", "300" if ASAN else "60",
               "--max-input-seconds", "10" if ASAN else "2"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=_env()))
    deadline = time.monotonic() + TIMEOUT
    results = []
    for k, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            err += f"\n[test_fuzz: worker {k} killed after {TIMEOUT} s]"
        results.append((k, p.returncode, out, err))
    wall = time.perf_counter() - t0

    total = {"inputs": 0, "accepted": 0, "rejected": 0, "batches": 0, "bytes_total": 0,
             "noncanonical": 0, "max_input_s": 0.0}
    modes = {}
    problems = []
    for k, rc, out, err in results:
        lines = [ln for ln in out.splitlines() if ln.startswith("FUZZ-SUMMARY ")]
        summary = json.loads(lines[-1][len("FUZZ-SUMMARY "):]) if lines else None
        if summary is None:
            # died: a crash, an abort or a hang; current-K.bin names the input
            index, data = fw.CurrentInput.read(os.path.join(tmp_path, f"current-{k}.bin"))
            msg = f"worker {k} died (exit code {rc}) with no summary"
            if data is not None:
                path = os.path.join(tmp_path, f"crash-{k}.bin")
                with open(path, "wb") as f:
                    f.write(data)
                msg += (f"; the input it was running: index {index} (seed {FUZZ_SEED}), "
                        f"{len(data)} bytes, saved as {path}\nhex: {data.hex()}")
            problems.append(msg + "\nstderr (tail):\n" + err[-6000:])
            continue
        if rc != 0 or summary["failures"]:
            f = summary.get("failure") or {}
            problems.append(f"worker {k} exit code {rc}: input {f.get('index')} "
                            f"({f.get('mode')}, {f.get('seed_input')}, {f.get('mutations')}): "
                            f"{f.get('error')}\nsaved as {f.get('file')}\nhex: {f.get('hex')}")
            continue
        for key in total:
            if key == "max_input_s":
                total[key] = max(total[key], summary.get(key, 0.0))
            else:
                total[key] += summary.get(key, 0)
        for m, c in summary["modes"].items():
            modes[m] = modes.get(m, 0) + c
    print(f"\nfuzz: {total['inputs']} inputs in {wall:.1f} s ({shards} workers, "
          f"{'ASan' if ASAN else 'RLIMIT_AS=2GiB'}): {total['accepted']} accepted, "
          f"{total['rejected']} ValueError, {total['batches']} batches drawn, "
          f"modes {modes}, slowest input {total['max_input_s'] * 1e3:.1f} ms, "
          f"accepted but not canonical {total['noncanonical']}")
    assert not problems, "\n\n".join(problems)
    assert total["inputs"] == N_INPUTS
    # the run reached every kind of input, and fixed-up inputs got past the
    # checksums: some were accepted, and most were rejected by a field check
    assert set(modes) == {"fixed", "raw", "zbody", "bomb"}
    assert total["accepted"] >= N_INPUTS // 100
    assert total["rejected"] >= N_INPUTS // 2


# ---- deterministic cases ------------------------------------------------------------


def test_seeds_are_accepted():
    for name, level, data in fw.seed_inputs():
        assert fw.check_input(data) == "accepted", name
        fields, info = fw.parse_payload(fw.unpack(data)[1])
        assert fields and info["selectors"] is not None


def test_every_truncation_is_refused():
    for name, level, data in fw.seed_inputs():
        for n in range(len(data)):
            with pytest.raises(ValueError):
                ER.unserialize(data[:n])
        with pytest.raises(ValueError):
            ER.unserialize(data + b"\0")


def test_every_truncation_with_fixed_header_is_refused():
    """A payload cut short, with crc and lengths made consistent again."""
    for name, level, data in fw.seed_inputs():
        _, payload = fw.unpack(data)
        for n in range(0, len(payload), 3 if level == 0 else 7):
            with pytest.raises(ValueError):
                ER.unserialize(fw.pack(payload[:n], level))


def test_compression_bombs_are_refused_without_inflating_them():
    body = zlib.compress(bytes(1 << 20), 9)  # 1 MiB of zeros in ~1 KB
    cases = []
    for raw_len in (len(body) * fw.ZLIB_MAX_RATIO, len(body) * fw.ZLIB_MAX_RATIO + 1,
                    1 << 20, 2**32, 2**63, 2**64 - 1):
        cases.append(bytes(fw.make_header(raw_len, len(body), 1, fw.crc(bytes(1 << 20)))) + body)
    # a real buffer (one 16 MiB state) whose header declares the most raw bytes
    # its body may hold: the payload ends early, found after inflating 16 MiB
    b = ER(state_shape=(4096, 4096), state_dtype="uint8", capacity=None, seed=0)
    b.record(b.new_episode(), np.zeros((4096, 4096), np.uint8), 0, 0.0)
    real = bytearray(b.serialize(level=9))
    fw._put_int(real, 16, 8, (len(real) - fw.HEADER) * fw.ZLIB_MAX_RATIO)
    fw.fix_header_crc(real)
    cases.append(bytes(real))
    for data in cases:
        grew, ex = memwatch.peak_growth(lambda: ER.unserialize(data))
        assert isinstance(ex, ValueError), repr(ex)
        # storage grows as the bytes really inflate (at most about three
        # times them): the 16 MiB state, never the 2**64 bytes declared
        assert grew is None or grew <= 80 << 20, grew


def test_header_fields_with_boundary_values():
    _, _, data = fw.seed_inputs()[0]
    for off, size in ((8, 4), (12, 4), (16, 8), (24, 8), (32, 4)):
        for v in (fw.U64_VALUES if size == 8 else fw.U32_VALUES):
            b = bytearray(data)
            fw._put_int(b, off, size, v)
            fw.fix_header_crc(b)
            if bytes(b) == data:
                continue
            if off == 8 and v in (1, 2):
                # a version-1 payload (no extras) is a valid version-2 one too
                assert len(ER.unserialize(bytes(b))) == len(ER.unserialize(data))
                continue
            with pytest.raises(ValueError):
                ER.unserialize(bytes(b))


# ---- once bugs: the smallest inputs the fuzzer found, now regression tests --------------


def repro_next_handle_overflow(field_offset=48):
    """A 264-byte buffer (no episodes) whose config declares next_handle
    (field_offset 48) or next_sel_handle (56) = 2**63 - 1."""
    b = ER(state_shape=(1,), state_dtype="uint8", action_dtype="uint8", capacity=None, seed=0)
    p = bytearray(fw.unpack(b.serialize(level=0))[1])
    p[16 + field_offset:16 + field_offset + 8] = struct.pack("<q", 2**63 - 1)
    return fw.pack(bytes(p), 0)


def repro_segment_overallocation():
    """201 bytes (zlib): one open episode of one 64 KiB state, pick_len 2**20.
    Restoring it allocates a first segment of 2**21 rows = 128 GiB."""
    b = ER(state_shape=(65536,), state_dtype="uint8", action_dtype="uint8",
           reward_dtype="float16", capacity=None, seed=0)
    b.record(b.new_episode(), np.zeros(65536, np.uint8), 0, 0.0)
    p = bytearray(fw.unpack(b.serialize(level=0))[1])
    p[16 + 32:16 + 36] = struct.pack("<I", 2**20)
    return fw.pack(bytes(p), 9)


def repro_segment_overallocation_many():
    """8,456 bytes stored: 256 open one-step episodes of 1-byte states, pick_len
    2**20. Restoring it reserves 256 x 16 MiB = 4 GiB (VmSize), 500,000 times
    the input's length."""
    b = ER(state_shape=(1,), state_dtype="uint8", action_dtype="uint8", reward_dtype="float16",
           capacity=None, seed=0)
    for _ in range(256):
        b.record(b.new_episode(), np.zeros(1, np.uint8), 0, 0.0)
    p = bytearray(fw.unpack(b.serialize(level=0))[1])
    p[16 + 32:16 + 36] = struct.pack("<I", 2**20)
    return fw.pack(bytes(p), 0)


# Once a bug: a payload could declare next handles of 2**63 - 1, and the next
# new episode or selector wrapped to -2**63. unserialize now refuses them.
@pytest.mark.parametrize("what", ["episode", "selector"])
def test_next_handles_at_the_int64_limit_are_refused(what):
    data = repro_next_handle_overflow(48 if what == "episode" else 56)
    code = f"""
import exreplay
data = bytes.fromhex({data.hex()!r})
try:
    b = exreplay.ExperienceReplay.unserialize(data)
except ValueError:
    raise SystemExit(0)   # refused: fixed
if {what!r} == 'episode':
    h1, h2 = b.new_episode(), b.new_episode()
else:
    K = exreplay.PickSelectorClass.Uniform
    h1, h2 = int(b.new_pick_selector(K)), int(b.new_pick_selector(K))
assert 0 <= h1 < h2, (h1, h2)
b._check()
"""
    r = _run_python(code)
    assert r.returncode == 0, r.stderr[-3000:]


# Once a bug: restored episodes took whole segments sized for pick_len, so a
# 201-byte input asked for 128 GiB. Segments are now restored at the size of
# what they hold.
@pytest.mark.parametrize("which", ["big", "many"])
def test_short_input_with_large_segments_allocates_little(which):
    data = repro_segment_overallocation() if which == "big" else repro_segment_overallocation_many()
    code = f"""
import exreplay

def vm_peak():
    for line in open('/proc/self/status'):
        if line.startswith('VmPeak:'):
            return int(line.split()[1]) * 1024

data = bytes.fromhex({data.hex()!r})
before = vm_peak()
try:
    exreplay.ExperienceReplay.unserialize(data)._check()
except ValueError:
    pass
grew = vm_peak() - before
assert grew < 512 << 20, f"unserialize of {{len(data)}} bytes reserved {{grew / 2**30:.2f}} GiB"
"""
    # normal build: RLIMIT_AS = 2 GiB (MemoryError); ASan: no limit possible,
    # the 128 GiB request fails (MemoryError) and VmPeak shows the 4 GiB one
    r = _run_python(code, rlimit_as=0 if ASAN else 2 << 30)
    assert r.returncode == 0, r.stderr[-3000:]
