"""save() is crash safe (docs/format.md): a process killed at any moment during
save() leaves the file holding either the old or the new buffer, complete.

A child process saves two distinguishable buffers alternately to one path in
a loop; the parent kills it with SIGKILL at random moments (a fixed RNG seed,
so the run is reproducible) and after each kill loads the file and checks it
is exactly one of the two buffers.

What a kill may leave behind: save() writes into an unnamed file
(O_TMPFILE) in the target's directory, and gives it a temp name
"<dir>/.<name>.<pid>.XXXXXX" only once it is complete and fsync'ed, just
before the rename over <name>. A kill leaves nothing, or (in the instant
between the two) that temp file. Where the file system has no O_TMPFILE the
temp file is named from the start. Either way every save first removes the
temp files of that name whose writer's pid is no longer running, so crashed
saves never pile up. The tests check that, and that stray files only ever
have that name pattern.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

from childrun import child_env
from exreplay import ExperienceReplay

# Shared by the parent and the child: the two buffers, built deterministically.
BUILD = r"""
import numpy as np
from exreplay import ExperienceReplay

def build(marker):
    # marker 1: 250 frames; marker 2: 400 frames (about 2 and 3 MB of 84x84 uint8)
    n = 250 if marker == 1 else 400
    rng = np.random.default_rng(marker)
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, pick_len=4, seed=marker)
    ps = buf.new_pick_selector(1)
    # the marker episode: every state byte is the marker
    buf.record_many(None, np.full((5, 84, 84), marker, np.uint8), np.full(5, marker),
                    np.full(5, marker, np.float32), final_state=np.full((84, 84), marker, np.uint8))
    frames = rng.integers(0, 256, (n, 84, 84), dtype=np.uint8)
    buf.record_many(None, frames, np.arange(n), np.zeros(n, np.float32),
                    priorities=rng.random(n), final_state=frames[0])
    buf.get_batch(16, ps)
    return buf
"""

CHILD = BUILD + r"""
import sys
path = sys.argv[1]
bufs = [build(1), build(2)]
i = 0
print("ready", flush=True)
while True:
    bufs[i % 2].save(path, level=1)
    i += 1
    print("saved", i, flush=True)
"""

KILLS = 20
TEMP_RE = re.compile(r"^\.replay\.exr\.[0-9]+\.[A-Za-z0-9]{6}$")


_env = child_env


def _build():
    ns = {}
    exec(BUILD, ns)
    return ns["build"]


def fingerprint(buf):
    """(records, marker): the marker episode's state value, and its checks."""
    h0 = buf._handles()[0]
    ep = buf.episode(h0)
    marker = int(ep.state[0, 0, 0])
    assert (ep.state == marker).all() and (ep.final_state == marker).all()
    return len(buf), marker


def test_sigkill_during_save_leaves_old_or_new_file(tmp_path):
    build = _build()
    expected = {m: build(m).serialize(0) for m in (1, 2)}
    fps = {m: fingerprint(ExperienceReplay.unserialize(expected[m])) for m in (1, 2)}
    assert fps[1] != fps[2]
    path = tmp_path / "replay.exr"
    ExperienceReplay.unserialize(expected[1]).save(path, level=1)

    rng = random.Random(20240611)
    seen = {1: 0, 2: 0}
    t_end = time.monotonic() + 180  # a hang guard, not a timing check
    for k in range(KILLS):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(path)], env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            line = child.stdout.readline()
            assert line.strip() == b"ready", child.stderr.read().decode()[-2000:]
            # let it complete 1-3 saves (so the file holds either buffer, at
            # whatever speed the machine runs), then kill it at a random
            # moment within the next save
            t0 = time.monotonic()
            n_saves = rng.randint(1, 3)
            for _ in range(n_saves):
                line = child.stdout.readline()
                assert line.startswith(b"saved"), child.stderr.read().decode()[-2000:]
            per_save = (time.monotonic() - t0) / n_saves
            time.sleep(rng.uniform(0.0, 1.2 * per_save))
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
        assert child.returncode == -signal.SIGKILL

        # the file is one of the two buffers, complete: same bytes once reloaded
        buf = ExperienceReplay.load(path)
        fp = fingerprint(buf)
        assert fp in fps.values(), fp
        marker = fp[1]
        assert buf.serialize(0) == expected[marker], f"kill {k}: buffer {marker} differs"
        assert buf._check() is None
        seen[marker] += 1
        # only the file and (maybe) stray temp files of save()
        for name in os.listdir(tmp_path):
            assert name == "replay.exr" or TEMP_RE.match(name), name
        assert time.monotonic() < t_end, "the kill loop is too slow"

    # both buffers were found at some point: the kills landed across saves
    assert seen[1] and seen[2], seen
    # every save sweeps the temp files of dead writers: at most the last
    # kill's can be left (and with O_TMPFILE, almost always none)
    strays = [n for n in os.listdir(tmp_path) if n != "replay.exr"]
    assert len(strays) <= 1, strays

    # a later save of the same path works, and removes what is left
    buf = ExperienceReplay.load(path)
    other = ExperienceReplay.unserialize(expected[3 - fingerprint(buf)[1]])
    other.save(path, level=0)
    assert ExperienceReplay.load(path).serialize(0) == other.serialize(0)
    assert os.listdir(tmp_path) == ["replay.exr"]


def _dead_pid():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_save_sweeps_temp_files_of_dead_writers_only(tmp_path):
    """Temp files of killed saves (their pid gone) are removed by the next
    save of that name; those of running writers, other names and other
    patterns are left alone."""
    path = tmp_path / "replay.exr"
    dead = _dead_pid()
    stale = [tmp_path / f".replay.exr.{dead}.AbC123", tmp_path / f".replay.exr.{dead}.zzzzzz"]
    keep = [
        tmp_path / f".replay.exr.{os.getpid()}.AbC123",  # a live writer (this process)
        tmp_path / f".replay.exr.1.AbC123",  # pid 1 runs
        tmp_path / f".other.exr.{dead}.AbC123",  # another name
        tmp_path / f".replay.exr.{dead}.AbC12",  # not the pattern
        tmp_path / f".replay.exr.{dead}x.AbC123",
        tmp_path / ".replay.exr.AAAAAA",  # the old pattern: no pid, so no way to tell
    ]
    for f in stale + keep:
        f.write_bytes(b"partial")
    os.mkdir(tmp_path / f".replay.exr.{dead}.dir123")  # not a regular file
    keep.append(tmp_path / f".replay.exr.{dead}.dir123")
    buf = ExperienceReplay((2,), seed=1)
    buf.record(None, [1, 2], 0, 0.0)
    buf.save(path)
    assert sorted(os.listdir(tmp_path)) == sorted(["replay.exr"] + [f.name for f in keep])
    assert len(ExperienceReplay.load(path)) == 1


def test_sigkill_mid_write_leaves_nothing_after_the_next_save(tmp_path):
    """20 kills in the middle of writing a 4 MB buffer: the directory never
    collects temp files (before: one per kill, 137 MB after 60)."""
    path = tmp_path / "big.exr"
    child_src = (
        "import sys, numpy as np\n"
        "from exreplay import ExperienceReplay\n"
        "b = ExperienceReplay((1024,), state_dtype='uint8', capacity=None)\n"
        "b.record_many(None, np.ones((4000, 1024), np.uint8), np.zeros(4000, np.int64), np.zeros(4000, np.float32))\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    b.save(sys.argv[1], level=0)\n"
    )
    rng = random.Random(7)
    for k in range(20):
        child = subprocess.Popen([sys.executable, "-c", child_src, str(path)], env=_env(),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert child.stdout.readline().strip() == b"ready", child.stderr.read()[-2000:]
            time.sleep(rng.uniform(0.0, 0.05))
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            child.stdout.close()
            child.stderr.close()
        names = os.listdir(tmp_path)
        assert all(n == "big.exr" or re.match(r"^\.big\.exr\.[0-9]+\.[A-Za-z0-9]{6}$", n)
                   for n in names), names
        assert len(names) <= 2, names  # the file, and at most the last kill's temp file
    ExperienceReplay.load(path)._check()
    ExperienceReplay((1,)).save(path)
    assert os.listdir(tmp_path) == ["big.exr"]


def test_stray_temp_file_with_colliding_pattern_is_not_reused(tmp_path):
    """A leftover temp file from an earlier crash is never opened again:
    every save makes a new unique name (O_EXCL or linkat)."""
    path = tmp_path / "replay.exr"
    stray = tmp_path / ".replay.exr.AAAAAA"
    live = tmp_path / f".replay.exr.{os.getpid()}.AAAAAA"
    stray.write_bytes(b"partial")
    live.write_bytes(b"partial")
    buf = ExperienceReplay((2,), seed=1)
    buf.record(None, [1, 2], 0, 0.0)
    for _ in range(20):
        buf.save(path)
    assert stray.read_bytes() == b"partial"
    assert live.read_bytes() == b"partial"
    assert sorted(os.listdir(tmp_path)) == sorted([stray.name, live.name, "replay.exr"])
    assert len(ExperienceReplay.load(path)) == 1
