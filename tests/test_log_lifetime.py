"""A log and its buffer taken apart from two threads at once, and the
objects' lifetimes across the calls that let the GIL go (docs/log.md,
"Attached to a buffer").

Each race below used freed memory before the binding held what it uses
across the GIL's release: the buffer freed while the log's writer still
pinned its rows, a log freed under a record call's back-pressure wait, or
two attaches of one buffer both succeeding."""

import json
import subprocess
import threading

import numpy as np
import pytest

from exreplay import ExperienceLog, ExperienceReplay
from test_persistence import run_script


def _logged_buffer(path, steps=20_000, **log_kw):
    log = ExperienceLog(path, overwrite=True, **log_kw)
    rb = ExperienceReplay((64,), state_dtype="uint8", capacity=steps, log=log)
    s = np.zeros((steps, 64), np.uint8)
    rb.record_many(None, s, np.zeros(steps, np.int64), np.zeros(steps, np.float32))
    return log, rb


def test_close_in_one_thread_while_the_buffer_is_dropped_in_another(tmp_path):
    for i in range(20):
        log, rb = _logged_buffer(tmp_path / "a.xlog")
        t = threading.Thread(target=log.close)
        t.start()
        del rb  # its last reference, while close() may be flushing without the GIL
        t.join()
        assert log.closed
        info = __import__("exreplay.log", fromlist=["info"]).info(tmp_path / "a.xlog")
        assert info["records"] == 20_000 and info["ended"]


def test_detach_and_close_race(tmp_path):
    for i in range(20):
        log, rb = _logged_buffer(tmp_path / "b.xlog")
        t = threading.Thread(target=log.close)
        t.start()
        rb.detach_log()
        del rb
        t.join()
        assert log.closed


def test_a_log_dropped_while_a_record_call_waits_for_its_writer(tmp_path):
    # max_backlog small: the record calls wait for the writer (without the GIL)
    log = ExperienceLog(tmp_path / "c.xlog", max_backlog=4096, level=9)
    rb = ExperienceReplay((256,), state_dtype="uint8", capacity=10_000, log=log)
    del log
    s = np.random.default_rng(0).integers(0, 255, (200, 256), dtype=np.uint8)
    stop = threading.Event()

    def actor():
        while not stop.is_set():
            rb.record_many(None, s, np.zeros(200, np.int64), np.zeros(200, np.float32))

    t = threading.Thread(target=actor)
    t.start()
    try:
        for _ in range(50):
            old = rb.detach_log()  # its last reference dropped at once
            del old
            # the dropped log may still hold the file (a record call in it
            # closes it when it ends): the new one waits for its lock
            rb.attach_log(ExperienceLog(tmp_path / "c.xlog", max_backlog=4096, level=9,
                                        overwrite=True))
    finally:
        stop.set()
        t.join()
    rb.detach_log().close()
    rb._check()


def test_two_attaches_of_one_buffer_in_two_threads(tmp_path):
    for i in range(30):
        rb = ExperienceReplay((4,))
        logs = [ExperienceLog(tmp_path / ("d%d.xlog" % k), overwrite=True) for k in range(2)]
        errs = []

        def attach(lg):
            try:
                rb.attach_log(lg)
            except ValueError as e:
                errs.append(str(e))

        ts = [threading.Thread(target=attach, args=(lg,)) for lg in logs]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(errs) == 1, errs
        attached = [lg for lg in logs if lg.attached]
        assert len(attached) == 1 and rb.log is attached[0]
        rb.record(None, np.zeros(4, np.float32), 0, 0.0)
        assert rb.detach_log() is attached[0]
        for lg in logs:
            lg.close()


def test_two_closes_at_once_write_one_end(tmp_path):
    """A second close (here from another thread at the same moment) waits for
    the first: one end marker, one join of the writer, the file whole."""
    import exreplay.log as xlog

    for i in range(20):
        p = tmp_path / "e.xlog"
        lg = ExperienceLog(p, overwrite=True, state_shape=(256,), state_dtype="uint8")
        s = np.zeros((2000, 256), np.uint8)
        lg.append_many(1, 0, s, np.zeros(2000, np.int64), np.zeros(2000, np.float32))
        ts = [threading.Thread(target=lg.close) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        info = xlog.info(p)  # raises on data after the end marker
        assert info["records"] == 2000 and info["ended"] and info["torn"] == 0
        assert sum(1 for _ in xlog.open(p)) >= 1


DETACH_DURING_SAVE_SCRIPT = r"""
import json, sys, threading, time
import numpy as np
import exreplay
buf = exreplay.ExperienceReplay((84, 84), state_dtype="uint8", capacity=None)
log = exreplay.ExperienceLog(sys.argv[1] + ".xlog")
buf.attach_log(log)
f = np.zeros((1000, 84, 84), np.uint8)
for i in range(10):
    buf.record_many(None, f, np.zeros(1000, np.int64), np.zeros(1000, np.float32), final_state=f[0])
results, calls, detacher = {}, [0], []
def attempt(name, fn):
    try:
        fn()
        results[name] = "ok"
    except RuntimeError:
        results[name] = "RuntimeError"
def progress(done, total):
    calls[0] += 1
    if calls[0] > 1:
        return
    t = threading.Thread(target=buf.detach_log)
    t.start()
    detacher.append(t)
    while buf.log is not None:  # the detach has let go of the GIL, and waits for the lock
        time.sleep(0.001)
    time.sleep(0.05)
    attempt("flush", lambda: log.flush())
    attempt("flush_sync", lambda: log.flush(sync=True))
    attempt("close", lambda: log.close())
buf.save(sys.argv[1], level=0, progress=progress)
detacher[0].join()
assert buf.log is None and log.attached is False and not log.closed
log.close()
info = __import__("exreplay.log", fromlist=["info"]).info(sys.argv[1] + ".xlog")
print(json.dumps({"results": results, "records": info["records"], "ended": info["ended"]}))
"""


def test_log_used_from_save_callback_while_another_thread_detaches_it(tmp_path):
    """save()'s progress callback holds the buffer's lock; a detach_log() in
    another thread waits for that lock and, until it ends, the log's writer
    still pins the buffer's rows: a flush or close of the log from the
    callback then raises, as it does while the log is attached, instead of
    waiting for ever."""
    try:
        r = run_script(DETACH_DURING_SAVE_SCRIPT, str(tmp_path / "s.exr"), timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a flush or close of the log from save()'s callback deadlocked with a detach")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["results"] == {"flush": "RuntimeError", "flush_sync": "RuntimeError",
                              "close": "RuntimeError"}, out
    assert out["records"] == 10_000 and out["ended"]

