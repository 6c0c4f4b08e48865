"""The experience log on Ray: each replay shard logs on its node, gather_logs
merges (reading local files in place, or shipping them through Ray piece by
piece), and the Ape-X example's --log. Real local cluster, no mocks; skipped
without Ray and under ASan (as tests/test_ray.py)."""

import os

import numpy as np
import pytest

if os.environ.get("EXREPLAY_ASAN"):
    pytest.skip("Ray tests do not run under ASan", allow_module_level=True)

ray = pytest.importorskip("ray")

import exreplay  # noqa: E402
import exreplay.log as xlog  # noqa: E402
from exreplay.ray import ReplayServer, ShardedReplay  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def test_replay_server_logs_locally(tmp_path):
    srv = ReplayServer(state_shape=(4,), capacity=50, log={"dir": str(tmp_path), "source": 7})
    for k in range(20):
        srv.record_many(None, np.full((10, 4), k, np.float32), np.arange(10),
                        np.ones(10, np.float32), terminated=True)
    info = srv.log_close()
    assert info["source"] == 7 and info["closed"] and info["path"].endswith("replay-7.xlog")
    d = xlog.info(info["path"])
    assert d["records"] == 200 and d["sources"] == [7] and d["ended"]  # evicted ones too
    assert len(srv.buf) <= 50
    assert srv.log_read(0, 8) == b"EXRPLOG\n"
    with pytest.raises(ValueError, match="impl"):
        ReplayServer(impl="reference", state_shape=(4,), log={"dir": str(tmp_path)})


def test_two_replay_servers_on_one_log_file(tmp_path):
    """A second server given the dir and source of a live one is refused
    (the log's OSError naming the path) and the first's log keeps what it
    wrote: it was emptied by the second's overwrite, which made both files'
    writes collide into a log no reader could read."""
    a = ReplayServer(state_shape=(3,), capacity=100, log={"dir": str(tmp_path)})
    a.record_many(None, np.ones((50, 3), np.float32), np.arange(50), np.ones(50), terminated=True)
    with pytest.raises(OSError, match="another ExperienceLog has open"):
        ReplayServer(state_shape=(3,), capacity=100, log={"dir": str(tmp_path)})
    a.record_many(None, np.ones((7, 3), np.float32), np.arange(7), np.ones(7), terminated=True)
    assert xlog.info(a.log_close()["path"])["records"] == 57
    b = ReplayServer(state_shape=(3,), capacity=100, log={"dir": str(tmp_path)})
    assert xlog.info(b.log_close()["path"])["records"] == 0


def test_replay_server_log_read_checks_offset_and_size(tmp_path, monkeypatch):
    """log_read's offset and size are ints (NumPy's too; a bool, a float or
    a string a TypeError naming the argument and its type), offset >= 0 and
    size >= 1, checked before the file is opened. size=-1 read the whole
    file past the 64 MiB a call, a float reached seek or read unnamed, and
    offset=True read from byte 1."""
    import builtins

    srv = ReplayServer(state_shape=(4,), capacity=50, log={"dir": str(tmp_path), "source": 1})
    srv.record_many(None, np.zeros((10, 4), np.float32), np.arange(10), np.ones(10, np.float32),
                    terminated=True)
    path = srv.log_close()["path"]
    data = open(path, "rb").read()
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(f) or real_open(f, *a, **k))
    off_exp, size_exp = "an int in [0, 2**63 - 1] (a byte offset)", "an int >= 1 (bytes)"
    for args, exc, msg in (
            ((1.0, 8), TypeError, f"offset: expected {off_exp}, got float"),
            (("0", 8), TypeError, f"offset: expected {off_exp}, got str"),
            ((True, 8), TypeError, f"offset: expected {off_exp}, got bool"),
            ((None, 8), TypeError, f"offset: expected {off_exp}, got NoneType"),
            ((-1, 8), ValueError, f"offset: expected {off_exp}, got -1"),
            ((2**63, 8), ValueError, f"offset: expected {off_exp}, got {2**63}"),
            ((0, 8.0), TypeError, f"size: expected {size_exp}, got float"),
            ((0, "8"), TypeError, f"size: expected {size_exp}, got str"),
            ((0, False), TypeError, f"size: expected {size_exp}, got bool"),
            ((0, np.float32(8)), TypeError, f"size: expected {size_exp}, got numpy.float32"),
            ((0, -1), ValueError, f"size: expected {size_exp}, got -1"),
            ((0, 0), ValueError, f"size: expected {size_exp}, got 0")):
        with pytest.raises(exc) as got:
            srv.log_read(*args)
        assert str(got.value) == msg, args
    assert opened == []
    assert srv.log_read(np.int64(8), np.uint32(4)) == data[8:12]
    assert srv.log_read(len(data) - 3, 2**70) == data[-3:]
    assert srv.log_read(len(data) + 5, 1) == b""
    with pytest.raises(TypeError, match="^size: "):  # before the missing log is noticed
        ReplayServer(state_shape=(4,), capacity=10).log_read(0, 1.5)


_LOG = "None or a dict {'dir': DIR, 'source': k, ...} (ExperienceLog's options)"


def test_replay_server_checks_log_before_making_its_directory(tmp_path):
    """log= that is no dict, has a key that is no str or no 'dir', or a
    dir that is no path, is an error naming log before a buffer is built
    (it failed in the call of _open_log, naming nothing); ExperienceLog's
    own checks (source, level, an unknown option) come before its
    directory is made (os.makedirs ran first and left it behind)."""
    new = tmp_path / "new"
    kw = dict(state_shape=(4,), capacity=50)
    for log, exc, msg in (
            (str(new), TypeError, f"log: expected {_LOG}, got str"),
            ([("dir", str(new))], TypeError, f"log: expected {_LOG}, got list"),
            ({"source": 1}, ValueError,
             f"log: expected {_LOG} with a 'dir' key, got the keys ['source']"),
            ({"dir": str(new), 1: 2}, TypeError,
             f"log: expected {_LOG} with str keys, got a key of type int"),
            ({"dir": 5}, TypeError, "log['dir']: expected a path (str, bytes or os.PathLike), got int")):
        with pytest.raises(exc) as got:
            ReplayServer(log=log, **kw)
        assert str(got.value) == msg, log
    with pytest.raises(ValueError) as got:
        ReplayServer(impl="reference", log={"dir": str(new)}, **kw)
    assert str(got.value) == ("log: expected None with impl='reference' (the experience log needs "
                              f"impl='c'), got {{'dir': {str(new)!r}}}")
    for opts in ({"source": "a"}, {"source": 1.5}, {"level": 99}, {"chunk_bytes": 0}, {"nonsense": 1},
                 {"fsync": "yes"}):
        want = None
        try:
            exreplay.ExperienceLog(str(tmp_path / "x.xlog"), **opts)
        except (TypeError, ValueError) as e:
            want = (type(e), str(e))
        assert want is not None, opts
        with pytest.raises(want[0]) as got:
            ReplayServer(log=dict(opts, dir=str(new / "deeper")), **kw)
        assert str(got.value) == want[1], opts
        assert not new.exists(), opts
    # a good log: the directory is made, with its parents
    srv = ReplayServer(log={"dir": new / "deeper", "source": 3}, **kw)
    assert srv.log_info()["path"] == str(new / "deeper" / "replay-3.xlog")
    srv.log_close()


def test_replay_server_log_read_without_a_log():
    """log_read on a replay without a log: a ValueError in the form
    "name: expected ..., got ..." ("this replay has no log" before), once
    offset and size are found good."""
    srv = ReplayServer(state_shape=(4,), capacity=50)
    with pytest.raises(ValueError) as got:
        srv.log_read(0, 8)
    assert str(got.value) == "log_read: expected a replay with a log (built with log=), got one without"
    with pytest.raises(TypeError, match="^offset: "):
        srv.log_read(0.5, 8)


def test_replay_server_log_that_cannot_attach_is_closed_and_removed(tmp_path, monkeypatch):
    # attach_log refuses the new log: it is closed, the file it created is
    # removed again, and the server keeps the log it had (or none).
    made = []
    orig = exreplay.ExperienceLog

    def log(*args, **kwargs):
        made.append(orig(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(exreplay, "ExperienceLog", log)
    s, a, r = np.zeros((3, 4), np.float32), np.arange(3), np.ones(3, np.float32)
    # a layout that differs from the buffer's
    with pytest.raises(ValueError, match=r"log: expected a log of this buffer's record layout \(state float32 \(4,\), .*\), got one of state float32 \(3,\), "):
        ReplayServer(state_shape=(4,), capacity=50, log={"dir": str(tmp_path / "a"), "state_shape": (3,)})
    assert len(made) == 1 and made[0].closed
    assert os.listdir(tmp_path / "a") == []
    # a file that was there before is not removed
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "replay-2.xlog").write_bytes(b"")
    with pytest.raises(ValueError, match=r"log: expected a log of this buffer's record layout \(state float32 \(4,\), .*\), got one of state float32 \(3,\), "):
        ReplayServer(state_shape=(4,), capacity=50, log={"dir": str(tmp_path / "d"), "source": 2,
                                                         "state_shape": (3,)})
    assert len(made) == 2 and made[1].closed
    assert os.listdir(tmp_path / "d") == ["replay-2.xlog"]
    # a second log on a server that logs already
    srv = ReplayServer(state_shape=(4,), capacity=50, log={"dir": str(tmp_path / "b"), "source": 0})
    first = srv._log
    srv.record_many(None, s, a, r, terminated=True)
    with pytest.raises(ValueError, match=r"log: .*\(detach_log\(\) first\)"):
        srv._open_log(dir=str(tmp_path / "c"), source=1)
    assert srv._log is first and not first.closed
    assert not (tmp_path / "c" / "replay-1.xlog").exists()
    assert all(x.closed for x in made if x is not first)
    srv.record_many(None, s, a, r, terminated=True)  # still logged, into the first log
    assert xlog.info(srv.log_close()["path"])["records"] == 6


def test_replay_server_leaves_the_log_of_a_buffer_that_logs_already(tmp_path):
    # A buffer that logs into DIR/replay-0.xlog, served with log={"dir": DIR}:
    # refused before the file is opened, so the buffer's own log goes on intact.
    buf = exreplay.ExperienceReplay(state_shape=(4,), capacity=50)
    path = str(tmp_path / "replay-0.xlog")
    own = exreplay.ExperienceLog(path)
    buf.attach_log(own)
    s, a, r = np.zeros((3, 4), np.float32), np.arange(3), np.ones(3, np.float32)
    buf.record_many(None, s, a, r, terminated=True)
    own.flush()
    with pytest.raises(ValueError, match=r"log: .*\(detach_log\(\) first\)"):
        ReplayServer(buffer=buf, log={"dir": str(tmp_path), "source": 0})
    assert buf.log is own
    buf.record_many(None, s, a, r, terminated=True)
    own.close()
    assert xlog.info(path)["records"] == 6


@pytest.mark.parametrize("force_ship", [False, True])
def test_sharded_logs_gather(cluster, tmp_path, force_ship):
    logs = tmp_path / "logs"
    sh = ShardedReplay(2, state_shape=(4,), capacity=1000, log_dir=str(logs),
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    sh.wait_ready()
    n = 0
    for k in range(30):
        T = 5 + k % 7
        s = np.zeros((T, 4), np.float32)
        s[:, 0] = k
        ray.get(sh.shards[k % 2].record_many.remote(None, s, np.arange(T), np.ones(T, np.float32),
                                                    terminated=True))
        n += T
    out = tmp_path / "gathered" / "all.xlog"
    d = sh.gather_logs(str(tmp_path / "gathered"), str(out), force_ship=force_ship,
                       piece_bytes=100)
    assert d["records"] == n and d["sources"] == [0, 1]
    assert (d["shipped_bytes"] > 0) == force_ship
    with xlog.open(out) as r:
        cs = list(r)
    ts = np.concatenate([c.timestamps for c in cs])
    assert np.all(np.diff(ts) >= 0)
    eps = np.concatenate([c.states[:, 0] for c in cs])
    assert sorted(set(eps.astype(int).tolist())) == list(range(30))
    sh.shutdown()


def test_gather_logs_refuses_bad_arguments_before_closing_any_log(cluster, tmp_path):
    """Every argument is checked first: a level or piece_bytes refused by the
    merge used to come after every log was closed and shipped, and the old
    output removed; piece_bytes=0 shipped empty files."""
    sh = ShardedReplay(2, state_shape=(4,), capacity=100, log_dir=str(tmp_path / "logs"),
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    sh.wait_ready()
    for k in range(2):
        ray.get(sh.shards[k].record_many.remote(None, np.zeros((3, 4), np.float32), np.arange(3),
                                                np.ones(3, np.float32), terminated=True))
    dest = tmp_path / "gathered"
    old = tmp_path / "old.xlog"
    old.write_bytes(b"an earlier output")
    for kw, exc, msg in [
        (dict(level="1"), TypeError, "level: expected an int from 0 to 9, got str"),
        (dict(level=10), ValueError, "level: expected an int from 0 to 9, got 10"),
        (dict(piece_bytes=0), ValueError, "piece_bytes: expected an int >= 1, got 0"),
        (dict(piece_bytes=1.5), TypeError, "piece_bytes: expected an int >= 1, got float"),
        (dict(force_ship="yes"), TypeError, "force_ship: expected a bool or an int, got str"),
        # the output is replaced: one of the logs merged was deleted, after every log was closed
        (dict(output=str(tmp_path / "logs" / "replay-0.xlog")), ValueError,
         "output: expected a path other than the logs merged (it is replaced), got %r, which is %r"
         % (str(tmp_path / "logs" / "replay-0.xlog"), str(tmp_path / "logs" / "replay-0.xlog"))),
        (dict(progress="yes"), TypeError, "progress: expected None, a bool or a "
                                          "callable(bytes_done, bytes_total), got str"),
        (dict(dest_dir=None), TypeError,
         "dest_dir: expected a path (str, bytes or os.PathLike), got NoneType"),
        (dict(output=5), TypeError, "output: expected a path (str, bytes or os.PathLike), got int"),
    ]:
        args = {"dest_dir": str(dest), "output": str(old), **kw}
        with pytest.raises(exc) as e:
            sh.gather_logs(args.pop("dest_dir"), args.pop("output"), **args)
        assert type(e.value) is exc and str(e.value) == msg, kw
        assert not any(i["closed"] for i in ray.get([s.log_info.remote() for s in sh.shards]))
        assert not dest.exists() and old.read_bytes() == b"an earlier output"
    # a dest_dir given as bytes (a bare TypeError from os.path.join, after every log was closed)
    d = sh.gather_logs(os.fsencode(dest), str(old), force_ship=1, piece_bytes=np.int64(64),
                       level=0)
    assert d["records"] == 6 and d["sources"] == [0, 1]
    sh.shutdown()


def test_gather_logs_replaces_an_existing_output_only_once_the_merge_is_complete(cluster,
                                                                                   tmp_path):
    """gather_logs removed an existing output before it merged: a merge that
    failed half way (here a progress callback that raises, after part of the
    merged log is written) lost the old output. It now merges with
    overwrite=True: the old output stays byte for byte until the merged log
    replaces it in one rename, and no temp file is left either way."""
    sh = ShardedReplay(2, state_shape=(4,), capacity=1000, log_dir=str(tmp_path / "logs"),
                       log_options={"chunk_bytes": 200, "level": 0}, selectors=["uniform"],
                       actor_options={"num_cpus": 0})
    sh.wait_ready()
    for k in range(40):
        ray.get(sh.shards[k % 2].record_many.remote(None, np.full((5, 4), k, np.float32),
                                                    np.arange(5), np.ones(5, np.float32),
                                                    terminated=True))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "merged.xlog"
    out.write_bytes(b"the previous run's merged log")
    calls = []

    def fail_midway(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise KeyboardInterrupt

    for force_ship in (False, True):
        calls.clear()
        with pytest.raises(KeyboardInterrupt):
            sh.gather_logs(str(tmp_path / "gathered"), str(out), force_ship=force_ship,
                           progress=fail_midway)
        assert len(calls) == 3
        assert out.read_bytes() == b"the previous run's merged log"
        assert os.listdir(out_dir) == ["merged.xlog"]
    d = sh.gather_logs(str(tmp_path / "gathered"), str(out))
    assert d["records"] == 200 and d["sources"] == [0, 1] and d["ended"]
    assert xlog.info(out)["records"] == 200 and os.listdir(out_dir) == ["merged.xlog"]
    sh.shutdown()


def test_apex_with_log(cluster, tmp_path):
    from exreplay.examples import apex_cartpole as apex

    d = tmp_path / "apexlog"
    args = apex.parse_args(["--seed", "1", "--actors", "2", "--shards", "2", "--time-limit", "4",
                            "--warmup", "300", "--eval-every", "10", "--goal", "10000",
                            "--log", str(d), "--quiet"])
    lines = []
    s = apex.run(args, log=lines.append)
    lg = s["log"]
    assert lg["records"] >= s["records"] > 0 and lg["sources"] == [0, 1]
    assert os.path.exists(d / "merged.xlog") and any(x.startswith("log:") for x in lines)
    t = xlog.tail(d / "merged.xlog", 100)
    assert len(t.timestamps) == 100 and t.states.shape == (100, 4)
