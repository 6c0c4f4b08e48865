"""Write failures and odd paths for save()/load(), the experience log's
writer and merge's output: a file-size limit reached mid-write (EFBIG, with
SIGXFSZ ignored, in a child process), a FIFO or a symlink at the path, names
as long as a file system allows. What the caller gets (an OSError naming the
path, never a hang) and what is left on disk (docs/format.md "Writing",
docs/log.md)."""

import os
import subprocess
import sys

import numpy as np
import pytest

import exreplay
from exreplay import ExperienceReplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(exreplay.__file__)))


def run_child(src, *args, timeout=30):
    """Runs src in a fresh interpreter on this tree; a hang is a TimeoutExpired."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", src, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env)


def small(n=50):
    b = ExperienceReplay((8,), "float32", capacity=None, seed=3)
    for i in range(n):
        b.record(0, np.full(8, i, np.float32), i, 1.0)
    return b


# ---- save / load -----------------------------------------------------------------


def test_load_of_a_fifo_is_a_value_error_not_a_wait_for_a_writer(tmp_path):
    """load() opened the path for reading before it checked it was a
    regular file: a FIFO with no writer blocked it for ever."""
    p = tmp_path / "fifo"
    os.mkfifo(p)
    try:
        r = run_child("import sys\nfrom exreplay import ExperienceReplay as E\n"
                      "try:\n    E.load(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n",
                      p, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("load() of a FIFO waited for a writer")
    assert r.returncode == 0, r.stderr
    assert "path: invalid serialized buffer" in r.stdout
