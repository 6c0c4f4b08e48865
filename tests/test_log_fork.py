"""Logs across fork (docs/log.md, "Logs and fork").

A child made by fork shares its parent's open files. The log's lock (flock)
belongs to the open file, so a forked child kept the parent's log file
locked for as long as it lived: the parent could not open the file again
after closing its log. A child that wrote through its copy of the log
waited for ever for a writer thread that only the parent has. Now the
parent's logs are closed in the child: every write refuses with a message
that says so, close, flush, detach and dealloc return at once, and the file
is the parent's alone.

Each scenario runs in a fresh interpreter (run_child), so that the fork
happens in a process of known threads, and a hang is a TimeoutExpired."""

import json
import subprocess

import pytest

from childrun import run_child

CHILD_STAYS_PARENT_REOPENS = r"""
import json, os, sys, time
import numpy as np
from exreplay import ExperienceLog, ExperienceReplay
import exreplay.log as xlog
p = sys.argv[1]
lg = ExperienceLog(p, overwrite=True, flush_interval=60.0)
b = ExperienceReplay((2,), "float32", capacity=1000, log=lg)
h = b.record_many(None, np.zeros((300, 2), np.float32), np.zeros(300, np.int64),
                  np.zeros(300, np.float32))
spare = ExperienceLog(sys.argv[2] + ".spare", state_shape=(2,))  # open, attached to nothing
go_r, go_w = os.pipe()
out_r, out_w = os.pipe()
pid = os.fork()
if pid == 0:  # the child: waits for the parent to reopen the file, then tries its copy
    os.close(go_w)
    os.read(go_r, 1)
    res = {}
    before = (len(b), b.num_episodes, b.serialize(level=0))
    for name, call in [
        ("record", lambda: b.record(h, np.ones(2, np.float32), 1, 1.0)),
        ("record_many", lambda: b.record_many(h, np.ones((2, 2), np.float32), [1, 1], [1.0, 1.0])),
        ("end_episode", lambda: b.end_episode(h, terminated=True)),
        ("append", lambda: lg.append(7, 0, np.ones(2, np.float32), 1, 1.0)),
        ("attach", lambda: ExperienceReplay((2,), "float32", capacity=10, log=spare)),
    ]:
        try:
            call()
            res[name] = None
        except ValueError as e:
            res[name] = str(e)
    b._check()
    res["unchanged"] = (len(b), b.num_episodes, b.serialize(level=0)) == before
    res["closed"] = lg.closed
    lg.flush()
    b.detach_log()
    b.record(h, np.ones(2, np.float32), 1, 1.0)  # the child's copy records without the log
    res["after_detach"] = len(b)
    lg.close()
    del b, lg
    own = ExperienceLog(sys.argv[2], state_shape=(2,), overwrite=True)  # a log of its own works
    own.append(1, 0, [0.0, 0.0], 0, 0.0)
    own.close()
    os.write(out_w, json.dumps(res).encode())
    os._exit(0)
os.close(go_r)
os.close(out_w)
lg.close()
spare.close()
t0 = time.monotonic()
again = ExperienceLog(p, state_shape=(2,), overwrite=True)  # the child still lives
waited = time.monotonic() - t0
again.append(1, 0, [5.0, 5.0], 0, 0.0)
again.close()
os.write(go_w, b"x")
child = json.loads(os.read(out_r, 1 << 16).decode())
_, status = os.waitpid(pid, 0)
print(json.dumps({"waited": waited, "status": status, "child": child,
                  "info": {k: xlog.info(p)[k] for k in ("records", "ended")},
                  "own": xlog.info(sys.argv[2])["records"]}))
"""


def test_a_forked_child_neither_holds_nor_writes_the_parents_log(tmp_path):
    try:
        r = run_child(CHILD_STAYS_PARENT_REOPENS, tmp_path / "a.xlog", tmp_path / "own.xlog",
                      timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("a forked child's use of its parent's log hung")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # the parent reopened its file while the child lived, without the 2 s wait for the lock
    assert out["waited"] < 1.0
    assert out["status"] == 0
    child = out["child"]
    fork_words = "belongs to the process that opened it, and this one was made by fork"
    for name in ("record", "record_many", "end_episode"):
        assert child[name] is not None and child[name].startswith(f"{name}: this buffer's log")
        assert fork_words in child[name] and "detach_log()" in child[name]
    assert child["append"].startswith("append: the log is closed in this process")
    assert child["attach"].startswith("log: the log is closed in this process")
    assert fork_words in child["append"] and fork_words in child["attach"]
    assert child["unchanged"] and child["closed"] and child["after_detach"] == 301
    # the file holds what the parent wrote after reopening it, and nothing of the child's
    assert out["info"] == {"records": 1, "ended": True}
    assert out["own"] == 1


PENDING_AT_FORK = r"""
import gc, json, os, sys
import numpy as np
from exreplay import ExperienceLog, ExperienceReplay
import exreplay.log as xlog
p = sys.argv[1]
# a slow log (level 9, small chunks) with steps still queued when the fork comes
lg = ExperienceLog(p, overwrite=True, level=9, chunk_bytes=4096, flush_interval=60.0)
b = ExperienceReplay((256,), "uint8", capacity=50_000, log=lg)
s = np.random.default_rng(0).integers(0, 255, (20_000, 256), dtype=np.uint8)
b.record_many(None, s, np.zeros(20_000, np.int64), np.zeros(20_000, np.float32))
pid = os.fork()
if pid == 0:  # dropped without a close: the dealloc must not wait for the parent's writer
    code = 0
    try:
        b.record_many(None, s[:10], np.zeros(10, np.int64), np.zeros(10, np.float32))
        code = 3
    except ValueError:
        pass
    del b
    gc.collect()
    lg.close()
    del lg
    gc.collect()
    os._exit(code)
_, status = os.waitpid(pid, 0)
lg.close()
print(json.dumps({"status": status, "records": xlog.info(p)["records"]}))
"""


def test_a_log_with_steps_queued_at_the_fork_is_let_go_in_the_child(tmp_path):
    try:
        r = run_child(PENDING_AT_FORK, tmp_path / "b.xlog", timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a forked child waited for its parent's log writer")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"status": 0, "records": 20_000}


def test_two_logs_may_write_one_device(tmp_path):
    """Only regular files are locked: a device or a FIFO has nothing to
    empty, and two logs into /dev/null are both taken."""
    from exreplay import ExperienceLog

    a = ExperienceLog("/dev/null", state_shape=(2,), overwrite=True)
    b = ExperienceLog("/dev/null", state_shape=(2,), overwrite=True)
    a.append(1, 0, [0.0, 0.0], 0, 0.0)
    b.append(1, 0, [0.0, 0.0], 0, 0.0)
    a.close()
    b.close()


FORKS_WHILE_WRITING = r"""
import os, signal, sys
import numpy as np
from exreplay import ExperienceLog, ExperienceReplay
lg = ExperienceLog(sys.argv[1], overwrite=True, level=0, chunk_bytes=65536)
b = ExperienceReplay((1024,), "uint8", capacity=20_000, log=lg)
s = np.zeros((50, 1024), np.uint8)
failed = 0
for i in range(100):
    h = b.record_many(None, s, np.zeros(50, np.int64), np.zeros(50, np.float32))
    b.end_episode(h, terminated=True)
    pid = os.fork()  # the writer thread is likely inside a chunk's write
    if pid == 0:
        signal.alarm(10)  # a hang ends the child with SIGALRM
        b.detach_log()
        for _ in range(3):
            b.record_many(None, s, np.zeros(50, np.int64), np.zeros(50, np.float32))
        b._check()
        lg.close()
        os._exit(0)
    failed += os.waitpid(pid, 0)[1] != 0
lg.close()
print(failed)
"""


def test_forks_while_the_writer_is_writing(tmp_path):
    """The writer unpinned a written chunk under the buffer's lock: a fork
    at that moment left the child a buffer locked for good (its detach_log
    hung in about 1 of 75 forks). It unpins under the log's own lock now,
    which the fork holds, and a chunk being written at the fork goes back
    on the child's queue, to be unpinned by the detach."""
    r = run_child(FORKS_WHILE_WRITING, tmp_path / "c.xlog", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "0"
