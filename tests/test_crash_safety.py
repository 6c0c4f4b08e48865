"""save() is crash safe (SPEC §6): a process killed at any moment during
save() leaves the file holding either the old or the new buffer, complete.

A child process saves two distinguishable buffers alternately to one path in
a loop; the parent kills it with SIGKILL at random moments (a fixed RNG seed,
so the run is reproducible) and after each kill loads the file and checks it
is exactly one of the two buffers.

What a kill may leave behind: save() writes into a temp file
"<dir>/.<name>.XXXXXX" (mkstemp) and renames it over <name> only once it is
complete and fsync'ed. A process killed before the rename leaves that temp
file in the directory (nobody is left to unlink it). Such stray files are
harmless: they never carry the target's name, later saves make their own
unique temp file, and a later save to the same path works. The tests check
that, and that stray files only ever have that name pattern.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import exreplay
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
TEMP_RE = re.compile(r"^\.replay\.exr\.[A-Za-z0-9]{6}$")


def _env():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(exreplay.__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return env


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
    strays = [n for n in os.listdir(tmp_path) if n != "replay.exr"]
    assert len(strays) <= KILLS

    # stray temp files do not break later saves and loads of the same path
    buf = ExperienceReplay.load(path)
    other = ExperienceReplay.unserialize(expected[3 - fingerprint(buf)[1]])
    other.save(path, level=0)
    assert ExperienceReplay.load(path).serialize(0) == other.serialize(0)
    assert set(os.listdir(tmp_path)) == {"replay.exr", *strays}  # no new leftovers
    # and they are what they look like: unfinished saves, not buffers
    for name in strays:
        try:
            ExperienceReplay.load(tmp_path / name)
        except ValueError:
            pass  # partial (the header is written last)
        else:
            pass  # complete but killed before the rename: still a valid buffer
        os.unlink(tmp_path / name)


def test_stray_temp_file_with_colliding_pattern_is_not_reused(tmp_path):
    """A leftover temp file from an earlier crash is never opened again:
    mkstemp creates a new unique name (O_EXCL)."""
    path = tmp_path / "replay.exr"
    stray = tmp_path / ".replay.exr.AAAAAA"
    stray.write_bytes(b"partial")
    buf = ExperienceReplay((2,), seed=1)
    buf.record(None, [1, 2], 0, 0.0)
    for _ in range(20):
        buf.save(path)
    assert stray.read_bytes() == b"partial"
    assert sorted(os.listdir(tmp_path)) == [".replay.exr.AAAAAA", "replay.exr"]
    assert len(ExperienceReplay.load(path)) == 1
