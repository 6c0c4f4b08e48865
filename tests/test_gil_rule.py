"""The binding's GIL rule (docs/design.md, "The binding's one idiom"): a small
record or get_batch does its work with the GIL held only while its thread is
the only Python thread and no exreplay call, on this buffer or any other, is
out without the GIL; otherwise it lets go of the GIL like any other call.
`_core._gil_kept()` counts the small calls that kept it.

Whether this process has other threads depends on what ran before (a test
that started Ray leaves threads behind), so the checks that need the calling
thread alone run in a new interpreter (`alone`)."""
import subprocess
import sys
import textwrap
import threading

import numpy as np

from exreplay import ExperienceReplay, PickSelectorClass, _core


def small_buffer():
    b = ExperienceReplay((4,), capacity=1000, seed=3)
    ps = b.new_pick_selector(PickSelectorClass.Uniform)
    b.record_many(None, np.ones((20, 4), np.float32), np.zeros(20, np.int64),
                  np.zeros(20, np.float32))
    return b, ps


def small_calls(b, ps):
    """One small get_batch and one small record; returns how many kept the GIL."""
    k = _core._gil_kept()
    batch = b.get_batch(4, ps)
    assert batch.state.shape == (4, 1, 4)
    b.record(None, np.full(4, 2.0, np.float32), 1, 0.5)
    return _core._gil_kept() - k


def big_buffer():
    """Over 64 MiB of payload, so that save() calls its progress callback."""
    b = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=4)
    zeros = np.zeros((1000, 84, 84), np.uint8)
    for _ in range(10):
        b.record_many(None, zeros, np.zeros(1000, np.int64), np.zeros(1000, np.float32))
    return b


def alone(body):
    """Runs `body` (this module's helpers in scope) in a new interpreter
    whose only thread is its main thread, and fails with its output if it
    raises."""
    code = "import sys\nsys.path.insert(0, %r)\nfrom test_gil_rule import *\n" % __file__.rsplit("/", 1)[0]
    code += "import threading\nassert threading.active_count() == 1, threading.enumerate()\n"
    r = subprocess.run([sys.executable, "-c", code + textwrap.dedent(body)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_small_calls_keep_the_gil_when_no_call_is_out():
    alone("""
        b, ps = small_buffer()
        assert small_calls(b, ps) == 2
    """)


def test_another_python_thread_makes_small_calls_let_go_of_the_gil():
    """A thread that waits with the GIL released outside exreplay (here on
    an Event, as one in NumPy, PyTorch or I/O does) wants the GIL back when
    it wakes; a loop of small calls keeping the GIL would leave it waiting
    for the switch interval each time. While it exists, small calls let go
    of the GIL; once it has ended, they keep it again."""
    alone("""
        b, ps = small_buffer()
        go = threading.Event()
        th = threading.Thread(target=go.wait)
        th.start()
        try:
            assert small_calls(b, ps) == 0
        finally:
            go.set()
            th.join()
        assert small_calls(b, ps) == 2
        assert len(b) == 22
        b._check()
    """)


def drive(with_thread):
    """A small buffer's batches and records, with another thread alive or
    not; returns the batches' states and how many calls kept the GIL."""
    b, ps = small_buffer()
    go = threading.Event()
    th = threading.Thread(target=go.wait) if with_thread else None
    if th:
        th.start()
    k = _core._gil_kept()
    try:
        out = [b.get_batch(4, ps).state.copy() for _ in range(5)]
        for i in range(5):
            b.record(None, np.full(4, float(i), np.float32), i, 0.5)
        out.append(b.get_batch(8, ps).state.copy())
    finally:
        go.set()
        if th:
            th.join()
    b._check()
    return out, _core._gil_kept() - k


def test_small_calls_give_the_same_results_either_way():
    """Kept or let go of, the GIL does not change what a small call does:
    two buffers of one seed, the second driven while another thread exists."""
    alone("""
        kept, n_kept = drive(False)
        freed, n_freed = drive(True)
        assert (n_kept, n_freed) == (11, 0)
        for x, y in zip(kept, freed):
            np.testing.assert_array_equal(x, y)
    """)


def test_a_call_out_on_another_buffer_makes_small_calls_let_go_of_the_gil():
    """save() runs its progress callback while its own call is out without the
    GIL (it takes the GIL back just for the callback): small calls on a second
    buffer made from the callback must not keep the GIL, since a thread coming
    back from a call on any buffer would wait for it."""
    alone("""
        import tempfile, pathlib
        a, ps = small_buffer()
        big = big_buffer()
        kept = []
        with tempfile.TemporaryDirectory() as d:
            big.save(pathlib.Path(d) / "big.exr", level=0,
                     progress=lambda done, total: kept.append(small_calls(a, ps)))
        assert kept, "progress was never called"
        assert kept == [0] * len(kept)
        # nothing out any more: the small calls keep the GIL again
        assert small_calls(a, ps) == 2
        assert len(a) == 20 + len(kept) + 1
        a._check()
    """)
