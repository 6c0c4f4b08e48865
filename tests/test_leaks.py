"""Leak checking in the ASan run (`make asan`): LeakSanitizer is on, with
.ci/lsan.supp suppressing only what libpython and NumPy allocate themselves.
These tests prove both directions in subprocesses that inherit the run's
sanitizer environment: a leak of exreplay's kind (memory a C function other
than libpython's or NumPy's allocated) fails the process, and exercising
every operation of the buffer leaks nothing."""

import os
import subprocess
import sys
import textwrap

import pytest

ASAN = os.environ.get("EXREPLAY_ASAN") == "1"
pytestmark = pytest.mark.skipif(not ASAN, reason="LeakSanitizer runs in the ASan build: make asan")


def run(src):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(src)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


def test_a_leak_outside_python_and_numpy_is_reported():
    r = run(
        """
        import ctypes
        import exreplay
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        p = libc.malloc(4000)
        p = None  # the only pointer is gone
        """
    )
    assert r.returncode != 0, r.stderr[-3000:]
    assert "LeakSanitizer: detected memory leaks" in r.stderr, r.stderr[-3000:]
    assert "4000 byte(s) leaked" in r.stderr, r.stderr[-3000:]


def test_every_operation_leaks_nothing(tmp_path):
    r = run(
        f"""
        import numpy as np
        import exreplay
        from exreplay import ExperienceReplay, PickSelectorClass
        path = {str(tmp_path / "r.exr")!r}
        for eviction in ("fifo", "second_chance"):
            b = ExperienceReplay((4,), capacity=300, pick_len=3, eviction=eviction, seed=1)
            u = b.new_pick_selector(PickSelectorClass.Uniform)
            p = b.new_pick_selector(PickSelectorClass.Prioritized)
            for e in range(40):
                h = b.record_many(None, np.ones((20, 4), np.float32), np.arange(20),
                                  np.zeros(20, np.float32), terminated=e % 2 == 0)
                b.record(h, np.ones(4, np.float32), 1, 0.5)
                batch = b.get_batch(16, p)
                b.set_priority(p, batch.pick_epi, batch.pick_pos, np.ones(16))
                b.get_batch(16, u)
            extra = b.new_pick_selector(PickSelectorClass.Prioritized)
            b.remove_pick_selector(extra)
            data = b.serialize(6)
            c = ExperienceReplay.unserialize(data)
            c._check()
            c.pick_selector(1).beta = 0.7
            assert [int(s) for s in c.pick_selectors()] == [0, 1]
            for bad in (extra, 99, "x"):
                try:
                    c.pick_selector(bad)
                except (TypeError, ValueError):
                    pass
            b.save(path)
            d = ExperienceReplay.load(path)
            d.get_batch(8, 1)
            for bad in (data[:-1], data[:100], b"x" * 100):
                try:
                    ExperienceReplay.unserialize(bad)
                except ValueError:
                    pass
            del b, c, d
        """
    )
    assert r.returncode == 0, r.stderr[-5000:]
    assert "LeakSanitizer" not in r.stderr, r.stderr[-5000:]
