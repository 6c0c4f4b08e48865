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


@pytest.mark.parametrize("length", [237, 246, 255])
def test_save_to_a_name_as_long_as_the_file_system_allows(tmp_path, length):
    """The temp file's name is the target's with a dot, the pid and six
    characters added: a name of 246 bytes or more made save() fail with
    ENAMETOOLONG although the name itself is valid. The temp name now takes
    a prefix of a long name."""
    p = tmp_path / ("n" * length)
    a = small()
    a.save(p)
    assert ExperienceReplay.load(p).serialize(0) == a.serialize(0)
    small(7).save(p)  # replacing it too
    assert len(ExperienceReplay.load(p)) == 7
    assert os.listdir(tmp_path) == [p.name]


def test_a_long_name_cut_inside_a_utf8_character_and_its_stale_temp_files(tmp_path):
    """A long name is cut before a UTF-8 continuation byte; temp files of a
    dead writer under the cut name are swept by the next save."""
    name = "é" * 127  # 254 bytes
    p = tmp_path / name
    small().save(p)
    stale_pid = 99999999  # beyond any pid_max: no such process
    cut = name.encode()[:236].decode()  # 118 characters, 236 bytes
    stale = tmp_path / (".%s.%d.AbC123" % (cut, stale_pid))
    stale.write_bytes(b"x")
    small(3).save(p)
    assert os.listdir(tmp_path) == [name]
    assert len(ExperienceReplay.load(p)) == 3
