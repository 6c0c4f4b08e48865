"""Write failures and odd paths for save()/load(), the experience log's
writer and merge's output: a file-size limit reached mid-write (EFBIG, with
SIGXFSZ ignored, in a child process), a FIFO or a symlink at the path, names
as long as a file system allows, a failed fsync of the directory (the test
hook _core._set_sync_dir_errno), a merge killed half way. What the caller
gets (an OSError naming the path, never a hang) and what is left on disk
(docs/format.md "Writing", docs/log.md "Merging")."""

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys

import numpy as np
import pytest

import exreplay
import exreplay.log as xlog
from childrun import ROOT, run_child
from exreplay import ExperienceReplay


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


def _loads_as(path, buf):
    return ExperienceReplay.load(path).serialize(0) == buf.serialize(0)


def test_save_through_a_symlink_writes_the_file_it_leads_to(tmp_path):
    """save() renamed its temp file over the path itself: a symlink there
    became a regular file holding the buffer, and the file it pointed to
    kept the old bytes. The link is now followed (through a chain of links,
    a relative one from its own directory, into another directory), the temp
    file made next to the target, and the link stays."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "data" / "ckpt.exr"
    small(5).save(target)
    os.chmod(target, 0o640)
    os.symlink("../data/ckpt.exr", tmp_path / "links" / "one")
    os.symlink("one", tmp_path / "links" / "two")
    a = small(9)
    a.save(tmp_path / "links" / "two")
    assert os.readlink(tmp_path / "links" / "two") == "one"
    assert os.readlink(tmp_path / "links" / "one") == "../data/ckpt.exr"
    assert _loads_as(target, a)
    assert stat.S_IMODE(os.lstat(target).st_mode) == 0o640  # the target's permissions kept
    assert sorted(os.listdir(tmp_path / "links")) == ["one", "two"]
    assert os.listdir(tmp_path / "data") == ["ckpt.exr"]


def test_save_through_a_dangling_symlink_creates_the_file_it_names(tmp_path):
    """A link to a name nothing has yet: the file it names is created (as
    open(path, "w") would), the link stays; a link into a directory that
    does not exist is a FileNotFoundError naming the path, and a loop of
    links an OSError (ELOOP): nothing changes."""
    link = tmp_path / "latest.exr"
    os.symlink("run1.exr", link)
    a = small(4)
    a.save(link)
    assert os.readlink(link) == "run1.exr" and _loads_as(tmp_path / "run1.exr", a)
    bad = tmp_path / "bad.exr"
    os.symlink("no/such/dir/x.exr", bad)
    with pytest.raises(FileNotFoundError) as ei:
        a.save(bad)
    assert os.fspath(ei.value.filename) == str(bad)
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    with pytest.raises(OSError) as ei:
        a.save(tmp_path / "loop1")
    assert ei.value.errno == errno.ELOOP
    assert os.fspath(ei.value.filename) == str(tmp_path / "loop1")
    assert sorted(os.listdir(tmp_path)) == ["bad.exr", "latest.exr", "loop1", "loop2",
                                            "run1.exr"]
    assert os.readlink(bad) == "no/such/dir/x.exr"


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named temp"])
def test_a_failed_fsync_of_the_directory_is_an_oserror(tmp_path, unnamed):
    """The directory's fsync after the rename was made and its result
    ignored: a save whose new name might not survive a power loss returned
    as if it would. It is now an OSError naming the path (the new file is
    in place: the rename came first). EINVAL (a file system that cannot
    sync a directory) is no failure."""
    p = tmp_path / "b.exr"
    small(3).save(p)
    a = small(8)
    was = exreplay._core._set_unnamed_temp(unnamed)
    old = exreplay._core._set_sync_dir_errno(errno.EIO)
    try:
        with pytest.raises(OSError) as ei:
            a.save(p)
        exreplay._core._set_sync_dir_errno(errno.EINVAL)
        a.save(tmp_path / "c.exr")
    finally:
        exreplay._core._set_sync_dir_errno(old)
        exreplay._core._set_unnamed_temp(was)
    assert ei.value.errno == errno.EIO and os.fspath(ei.value.filename) == str(p)
    assert _loads_as(p, a) and _loads_as(tmp_path / "c.exr", a)
    assert sorted(os.listdir(tmp_path)) == ["b.exr", "c.exr"]


# ---- the experience log's writer ---------------------------------------------------


def test_log_over_a_fifo_without_a_reader_is_an_oserror_not_a_wait(tmp_path):
    """ExperienceLog(fifo, overwrite=True) opened the FIFO for writing and
    waited for ever for a reader; it is now ENXIO, naming the path."""
    p = tmp_path / "fifo"
    os.mkfifo(p)
    try:
        r = run_child("import sys, exreplay\n"
                      "try:\n    exreplay.ExperienceLog(sys.argv[1], overwrite=True)\n"
                      "except OSError as e:\n    print(e.errno, e.filename)\n", p, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("ExperienceLog of a FIFO without a reader waited for one")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(errno.ENXIO), str(p)]
    assert stat.S_ISFIFO(os.stat(p).st_mode)


def test_log_into_a_fifo_with_a_reader_streams_a_whole_log(tmp_path):
    """With a reader, a FIFO takes the log as a stream; its writes block
    again once it is open (a full pipe is waited on, not a failed write)."""
    import exreplay.log as xlog

    p = tmp_path / "fifo"
    os.mkfifo(p)
    rfd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with exreplay.ExperienceLog(p, overwrite=True, state_shape=(4,), level=0) as lg:
            for i in range(20):
                lg.append(0, i, np.full(4, i, np.float32), i, 0.0)
        data = os.read(rfd, 1 << 20)
    finally:
        os.close(rfd)
    out = tmp_path / "copy.xlog"
    out.write_bytes(data)
    info = xlog.info(out)
    assert info["records"] == 20 and info["ended"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_failed_constructor_removes_only_a_file_it_made(tmp_path):
    """A constructor whose header write failed unlinked the path whatever
    was there: with overwrite=True, a symlink to the file it truncated, or a
    device node (as root, /dev/full itself). It now removes only a file it
    created."""
    link = tmp_path / "full.xlog"
    os.symlink("/dev/full", link)
    with pytest.raises(OSError) as ei:
        exreplay.ExperienceLog(link, overwrite=True, state_shape=(4,))
    assert ei.value.errno == errno.ENOSPC and ei.value.filename == str(link)
    assert os.readlink(link) == "/dev/full"


FSIZE_HEADER_CHILD = r"""
import json, os, resource, signal, sys
import numpy as np
import exreplay, exreplay.log as xlog
d = sys.argv[1]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
def limit(n):
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, resource.RLIM_INFINITY))
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return [e.errno, e.filename]
out = {}
# a header cut by the limit, then written again once there is room
p = os.path.join(d, "a.xlog")
log = exreplay.ExperienceLog(p, flush_interval=None)
buf = exreplay.ExperienceReplay((4,), "float32", capacity=None)
limit(30)
out["attach"] = attempt(lambda: buf.attach_log(log))
limit(resource.RLIM_INFINITY)
out["size_after"] = os.path.getsize(p)
out["attach2"] = attempt(lambda: buf.attach_log(log))
buf.record(0, np.ones(4, np.float32), 1, 0.0, terminated=True)
log.close()
i = xlog.info(p)
out["info"] = [i["records"], i["ended"]]
# overwrite=True of a file: it stays, empty, not with a cut header
q = os.path.join(d, "old.xlog")
with open(q, "wb") as f:
    f.write(b"old log")
limit(30)
out["ctor_over"] = attempt(lambda: exreplay.ExperienceLog(q, overwrite=True, state_shape=(4,)))
out["ctor_new"] = attempt(lambda: exreplay.ExperienceLog(os.path.join(d, "n.xlog"),
                                                         state_shape=(4,)))
limit(resource.RLIM_INFINITY)
out["old_size"] = os.path.getsize(q)
out["listing"] = sorted(os.listdir(d))
print(json.dumps(out))
"""


def test_a_header_write_cut_short_is_taken_back(tmp_path):
    """A file header cut short by a failed write stayed in the file, and an
    attach_log that succeeded later wrote a second header after it: a log
    that no reader could open, after every call had returned without an
    error. The cut header is now truncated away."""
    r = run_child(FSIZE_HEADER_CHILD, tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    a = str(tmp_path / "a.xlog")
    assert got["attach"] == [errno.EFBIG, a]
    assert got["size_after"] == 0
    assert got["attach2"] == "ok"
    assert got["info"] == [1, True]
    assert got["ctor_over"] == [errno.EFBIG, str(tmp_path / "old.xlog")]
    assert got["ctor_new"] == [errno.EFBIG, str(tmp_path / "n.xlog")]
    assert got["old_size"] == 0
    assert got["listing"] == ["a.xlog", "old.xlog"]


def test_a_header_write_that_cannot_be_taken_back_fails_the_log(tmp_path):
    """Into a FIFO whose reader went away (EPIPE), a failed header cannot
    be truncated away: the log stays failed, and every later attach, flush
    and close says so, naming the path."""
    p = tmp_path / "fifo"
    os.mkfifo(p)
    rfd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
    log = exreplay.ExperienceLog(p, overwrite=True)
    os.close(rfd)
    buf = ExperienceReplay((4,), "float32")
    for _ in range(2):
        with pytest.raises(BrokenPipeError) as ei:
            buf.attach_log(log)
        assert ei.value.filename == str(p)
    assert log.stats["errno"] == errno.EPIPE
    with pytest.raises(BrokenPipeError):
        log.flush()
    with pytest.raises(BrokenPipeError):
        log.close()


# ---- merge's output ----------------------------------------------------------------

MERGE_FSIZE_CHILD = r"""
import json, os, resource, signal, sys
import numpy as np
import exreplay, exreplay.log as xlog
d = sys.argv[1]
ins = []
for k in range(2):
    q = os.path.join(d, "in%d.xlog" % k)
    with exreplay.ExperienceLog(q, source=k, state_shape=(16,), level=0) as lg:
        for i in range(200):
            lg.append(0, i, np.full(16, i, np.float32), i, 0.0)
    ins.append(q)
full = xlog.merge(ins, os.path.join(d, "full.xlog"), level=0, chunk_bytes=2000)["bytes"]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
out = []
for where, n in (("header", 40), ("chunks", full // 2), ("end marker", full - 20)):
    o = os.path.join(d, "out.xlog")
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, resource.RLIM_INFINITY))
    try:
        xlog.merge(ins, o, level=0, chunk_bytes=2000, threads=0)
        r = "ok"
    except OSError as e:
        r = [e.errno, e.filename]
    resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY,) * 2)
    out.append([where, r, os.path.exists(o)])
print(json.dumps(out))
"""


def test_a_failed_write_of_merge_output_names_the_output(tmp_path):
    """A merge whose output could not be written raised an OSError without
    a file name (os.write's, os.fsync's and the merge engine's name none);
    it now names the output, wherever the write failed."""
    r = run_child(MERGE_FSIZE_CHILD, tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr
    out = str(tmp_path / "out.xlog")
    assert json.loads(r.stdout) == [[w, [errno.EFBIG, out], False]
                                    for w in ("header", "chunks", "end marker")]


def _merge_inputs(d):
    """Two logs of 400 records in chunks of about 2 KB, timestamps interleaved."""
    ins = []
    for k in range(2):
        q = d / ("in%d.xlog" % k)
        with exreplay.ExperienceLog(q, source=k, state_shape=(16,), level=0,
                                    chunk_bytes=2000) as lg:
            for i in range(400):
                lg.append(0, 2 * i + k, np.full(16, i, np.float32), i, 0.0)
        ins.append(str(q))
    return ins


def _merge_reference(tmp_path):
    """The inputs (_merge_inputs, in tmp_path / "in"), their merge
    whole.xlog there made uninterrupted, and the progress calls that merge
    made (the kill tests stop a merge at the middle one)."""
    (tmp_path / "in").mkdir()
    ins = _merge_inputs(tmp_path / "in")
    ref = tmp_path / "in" / "whole.xlog"
    calls = []
    xlog.merge(ins, ref, level=0, chunk_bytes=2000, threads=0,
               progress=lambda done, total: calls.append(done))
    return ins, ref, calls


MERGE_KILL_CHILD = r"""
import os, signal, sys
import exreplay.log as xlog
from exreplay import _core
out, kill_at = sys.argv[1], int(sys.argv[2])
unnamed, overwrite = sys.argv[3] == "1", sys.argv[4] == "1"
ins = sys.argv[5:]
if not unnamed:
    _core._set_unnamed_temp(False)
calls = 0
def progress(done, total):
    global calls
    calls += 1
    if calls == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
xlog.merge(ins, out, level=0, chunk_bytes=2000, threads=0, progress=progress,
           overwrite=overwrite)
"""


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named temp"])
def test_a_merge_killed_midway_leaves_no_output_and_runs_again(tmp_path, unnamed):
    """A merge killed (SIGKILL) half way through left its output under its
    name, cut short, and the same merge run again raised FileExistsError.
    The output is now written into an unnamed file (or, where the file
    system has none, a temp file .<name>.<pid>.XXXXXX) and named only once
    complete: a kill leaves nothing, or that temp file, which the next
    merge to the name removes; the merge run again gives the same bytes as
    one never interrupted. The kill is at the middle progress call of the
    merge (on one thread: the same calls every run)."""
    ins, ref, calls = _merge_reference(tmp_path)
    assert len(calls) > 20
    d = tmp_path / "out"
    d.mkdir()
    out = d / "all.xlog"
    r = run_child(MERGE_KILL_CHILD, out, len(calls) // 2, int(unnamed), 0, *ins)
    assert r.returncode == -signal.SIGKILL, r.stderr
    left = os.listdir(d)
    if unnamed:
        assert left == []
    else:
        assert len(left) == 1 and re.fullmatch(r"\.all\.xlog\.[0-9]+\.[A-Za-z0-9]{6}", left[0])
        assert 200 < os.path.getsize(d / left[0]) < ref.stat().st_size  # cut mid-way
    info = xlog.merge(ins, out, level=0, chunk_bytes=2000, threads=0)
    assert info["records"] == 800 and info["ended"]
    assert out.read_bytes() == ref.read_bytes()
    assert os.listdir(d) == ["all.xlog"]


def test_a_failed_fsync_of_merge_outputs_directory_leaves_no_output(tmp_path):
    """The directory's fsync after the output gets its name fails: an OSError
    naming the output, and no output (its name is taken back), so the merge
    can be run again. An output that exists is refused before anything is
    written, a symbolic link too, dangling or not (FileExistsError)."""
    ins = _merge_inputs(tmp_path)
    out = tmp_path / "all.xlog"
    old = exreplay._core._set_sync_dir_errno(errno.EIO)
    try:
        with pytest.raises(OSError) as ei:
            xlog.merge(ins, out)
    finally:
        exreplay._core._set_sync_dir_errno(old)
    assert ei.value.errno == errno.EIO and ei.value.filename == str(out)
    assert sorted(os.listdir(tmp_path)) == ["in0.xlog", "in1.xlog"]
    assert xlog.merge(ins, out)["records"] == 800
    os.symlink("nothing.xlog", tmp_path / "link.xlog")
    for p in (out, tmp_path / "link.xlog"):
        with pytest.raises(FileExistsError) as ei:
            xlog.merge(ins, p)
        assert ei.value.filename == str(p)
    assert sorted(os.listdir(tmp_path)) == ["all.xlog", "in0.xlog", "in1.xlog", "link.xlog"]


def _corrupt_a_late_chunk(src, dst):
    """dst: src with one byte of its last records chunk's body flipped (its
    headers and trailers intact), which a merge finds only when it gets to
    that chunk, after most of its output is written."""
    blob = bytearray(open(src, "rb").read())
    with xlog.open(src) as r:
        off, h, _ = list(r._headers(False))[-1]
    blob[off + xlog.HDR + h.body_len // 2] ^= 0xFF
    open(dst, "wb").write(bytes(blob))


@pytest.mark.parametrize("unnamed", [True, False], ids=["O_TMPFILE", "named temp"])
def test_merge_overwrite_keeps_the_old_output_until_the_new_one_is_complete(tmp_path, unnamed):
    """merge(..., overwrite=True) replaces an existing output as save()
    replaces its file: the merged log is written under a temp name (or
    none) and renamed over the output once complete. A merge that fails
    half way (an input invalid in its last chunk, a progress callback that
    raises) leaves the old output byte for byte, with its permission bits,
    and no temp file; one that succeeds replaces it (the permission bits
    kept). Without overwrite, an existing output is a FileExistsError that
    says what to pass."""
    ins, ref, calls = _merge_reference(tmp_path)
    bad = str(tmp_path / "in" / "late.xlog")
    _corrupt_a_late_chunk(ins[1], bad)
    d = tmp_path / "out"
    d.mkdir()
    out = d / "all.xlog"
    old_bytes = b"an earlier output, not even a log"
    out.write_bytes(old_bytes)
    os.chmod(out, 0o640)

    class Stop(Exception):
        pass

    def stop_midway(done, total):
        calls.append(done)
        if len(calls) == 3 * n // 2:
            raise Stop

    n = len(calls)
    assert n > 20
    prev = exreplay._core._set_unnamed_temp(unnamed)
    try:
        seen = []
        with pytest.raises(ValueError, match="late.xlog: not a valid experience log at byte"):
            xlog.merge([ins[0], bad], out, level=0, chunk_bytes=2000, threads=0, overwrite=True,
                       progress=lambda done, total: seen.append(done))
        assert len(seen) > n // 2  # found late: most of the output was written by then
        assert out.read_bytes() == old_bytes and os.listdir(d) == ["all.xlog"]
        with pytest.raises(Stop):
            xlog.merge(ins, out, level=0, chunk_bytes=2000, threads=0, overwrite=True,
                       progress=stop_midway)
        assert out.read_bytes() == old_bytes and os.listdir(d) == ["all.xlog"]
        assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
        with pytest.raises(FileExistsError) as ei:
            xlog.merge(ins, out)
        assert ei.value.filename == str(out) and (
            "output: expected a path that does not exist (or overwrite=True to replace it), "
            "got one that exists" in str(ei.value))
        with pytest.raises(TypeError) as ei:
            xlog.merge(ins, out, overwrite=None)
        assert str(ei.value) == "overwrite: expected a bool or an int, got NoneType"
        assert out.read_bytes() == old_bytes
        info = xlog.merge(ins, out, level=0, chunk_bytes=2000, threads=0, overwrite=np.int64(1))
    finally:
        exreplay._core._set_unnamed_temp(prev)
    assert info["records"] == 800 and info["ended"]
    assert out.read_bytes() == ref.read_bytes()
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640
    assert os.listdir(d) == ["all.xlog"]
    # overwrite=True with nothing there: a new file, as without it
    assert xlog.merge(ins, d / "new.xlog", overwrite=True)["records"] == 800
    assert sorted(os.listdir(d)) == ["all.xlog", "new.xlog"]


def test_merge_overwrite_follows_a_symbolic_link_and_takes_an_input_as_output(tmp_path):
    """overwrite=True follows a symbolic link at the output as save() does:
    the file it leads to is replaced and the link stays; a dangling link gets
    the file it names. An output that is one of the inputs is read whole
    before the new log takes its name."""
    ins = _merge_inputs(tmp_path)
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "all.xlog"
    target.write_bytes(b"old")
    link = tmp_path / "link.xlog"
    os.symlink(target, link)
    assert xlog.merge(ins, link, overwrite=True)["records"] == 800
    assert os.path.islink(link) and os.readlink(link) == str(target)
    assert xlog.info(target)["records"] == 800
    os.symlink("real/later.xlog", tmp_path / "dangling.xlog")
    assert xlog.merge(ins, tmp_path / "dangling.xlog", overwrite=True)["records"] == 800
    assert os.path.islink(tmp_path / "dangling.xlog")
    assert (tmp_path / "real" / "later.xlog").exists()
    assert sorted(os.listdir(tmp_path / "real")) == ["all.xlog", "later.xlog"]
    # the accumulated log and a new one, into the accumulated one
    acc = tmp_path / "acc.xlog"
    xlog.merge([ins[0]], acc)
    d = xlog.merge([str(acc), ins[1]], acc, overwrite=True)
    assert d["records"] == 800 and d["sources"] == [0, 1]
    ts = np.concatenate([c.timestamps for c in xlog.open(acc)])
    assert np.all(np.diff(ts) >= 0) and len(ts) == 800


def test_a_merge_overwriting_killed_midway_leaves_the_old_output(tmp_path):
    """A merge with overwrite=True killed (SIGKILL) half way leaves the old
    output byte for byte (and at most its temp file, which the next merge to
    the name removes); run again, it replaces the output with the same bytes
    as a merge never interrupted."""
    ins, ref, calls = _merge_reference(tmp_path)
    d = tmp_path / "out"
    d.mkdir()
    out = d / "all.xlog"
    out.write_bytes(b"the previous merge's output")
    for unnamed in (1, 0):
        r = run_child(MERGE_KILL_CHILD, out, len(calls) // 2, unnamed, 1, *ins)
        assert r.returncode == -signal.SIGKILL, r.stderr
        assert out.read_bytes() == b"the previous merge's output"
        left = sorted(os.listdir(d))
        if unnamed:
            assert left == ["all.xlog"]
        else:
            assert len(left) == 2 and re.fullmatch(r"\.all\.xlog\.[0-9]+\.[A-Za-z0-9]{6}", left[0])
    info = xlog.merge(ins, out, level=0, chunk_bytes=2000, threads=0, overwrite=True)
    assert info["records"] == 800 and out.read_bytes() == ref.read_bytes()
    assert os.listdir(d) == ["all.xlog"]


# ---- the log's readers ---------------------------------------------------------------

READ_FIFO_CHILD = r"""
import sys
import exreplay, exreplay.log as xlog
p, out = sys.argv[1], sys.argv[2]
calls = [("open", lambda: list(xlog.open(p))), ("info", lambda: xlog.info(p)),
         ("tail", lambda: xlog.tail(p, 3)),
         ("from_log", lambda: exreplay.ExperienceReplay.from_log(p)),
         ("merge", lambda: xlog.merge([p], out))]
for name, fn in calls:
    try:
        fn()
        print(name, "ok")
    except ValueError as e:
        print(name, e)
"""


def test_the_log_readers_refuse_a_fifo_instead_of_waiting_for_a_writer(tmp_path):
    """open, info, tail, from_log and merge opened a FIFO for reading, which
    waits for a writer for ever; it is now a ValueError naming the path."""
    p = tmp_path / "fifo"
    os.mkfifo(p)
    try:
        r = run_child(READ_FIFO_CHILD, p, tmp_path / "out.xlog", timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("a log reader waited for a writer of a FIFO")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [ln.split()[0] for ln in lines] == ["open", "info", "tail", "from_log", "merge"]
    for ln in lines:
        assert ln.endswith("%s: not a valid experience log at byte 0: a FIFO or socket, not a "
                           "file" % p), ln
    assert os.listdir(tmp_path) == ["fifo"]
