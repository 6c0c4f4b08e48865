"""The experience log: writer (ExperienceLog), reader (exreplay.log), merge,
tail, ingest, crash safety (kill -9), back-pressure, bad input."""

import errno
import io
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import numpy as np
import pytest

import exreplay
import exreplay.log as xlog
from exreplay import ExperienceLog, ExperienceReplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read_all(path):
    """Every record of a log, concatenated, in log order."""
    with xlog.open(path) as r:
        cs = list(r)
        torn, ended = r.torn, r.ended
    if not cs:
        return None, torn, ended
    cat = xlog.Chunk(*(np.concatenate([getattr(c, f) for c in cs]) for f in xlog.Chunk._fields
                       if f != "extras"))
    return cat, torn, ended


def record_script(buf, rng, steps, frame=(3, 2), end_every=7):
    """Records a random mix of record/record_many; returns what went in, in order:
    list of (state, action, reward, end, terminated, final)."""
    out = []
    h = None
    t = 0
    while t < steps:
        k = int(rng.integers(1, 6))
        s = rng.integers(0, 255, (k,) + frame, dtype=np.uint8)
        a = rng.normal(size=(k, 2)).astype(np.float32)
        r = rng.normal(size=k).astype(np.float32)
        end = rng.random() < 1 / end_every
        term = end and rng.random() < 0.5
        fin = rng.integers(0, 255, frame, dtype=np.uint8) if end and not term else None
        if k == 1 and rng.random() < 0.5:
            h = buf.record(h, s[0], a[0], r[0], final_state=fin, terminated=term)
        else:
            h = buf.record_many(h, s, a, r, final_state=fin, terminated=term)
        for i in range(k):
            last = i == k - 1
            out.append((s[i], a[i], r[i], last and end, last and term, fin if last else None))
        t += k
    return out


def check_against(cat, rec):
    """The log's steps are rec's, in order; its ends without a step (of
    episodes that capacity evicted open and the script went on with: each
    right after the step that went on) end them, not terminated, with that
    step's state. Returns the number of such ends."""
    step = (cat.flags & xlog.FLAG_NO_STEP) == 0
    idx = np.flatnonzero(step)
    assert len(idx) == len(rec)
    fin_at = np.cumsum((cat.flags & xlog.FLAG_FINAL) != 0) - 1
    for i, (s, a, r, end, term, fin) in zip(idx, rec):
        assert np.array_equal(cat.states[i], s)
        assert np.array_equal(cat.actions[i], a)
        assert cat.rewards[i] == r
        fl = int(cat.flags[i])
        assert bool(fl & xlog.FLAG_END) == bool(end)
        assert bool(fl & xlog.FLAG_TERMINATED) == bool(term)
        assert bool(fl & xlog.FLAG_FINAL) == (fin is not None)
        if fin is not None:
            assert np.array_equal(cat.final_states[fin_at[i]], fin)
    for i in np.flatnonzero(~step):
        assert int(cat.flags[i]) == xlog.FLAG_NO_STEP | xlog.FLAG_END | xlog.FLAG_FINAL
        assert step[i - 1] and cat.positions[i - 1] == 0 and cat.handles[i - 1] != cat.handles[i]
        assert np.array_equal(cat.final_states[fin_at[i]], cat.states[i - 1])
        assert cat.positions[i] == np.count_nonzero(step & (cat.handles == cat.handles[i]))
    assert len(cat.final_states) == fin_at[-1] + 1
    assert np.all(np.diff(cat.timestamps) >= 0)
    return int(np.count_nonzero(~step))


@pytest.mark.parametrize("level", [0, 1, 6])
def test_round_trip_with_eviction(tmp_path, level):
    p = tmp_path / "a.log"
    lg = ExperienceLog(p, source=3, level=level, chunk_bytes=500)
    buf = ExperienceReplay((3, 2), "uint8", (2,), "float32", capacity=40, log=lg)
    assert buf.log is lg and lg.attached
    rng = np.random.default_rng(1)
    t0 = time.time_ns()
    rec = record_script(buf, rng, 400)
    N = len(rec)
    lg.close()
    assert not lg.attached and buf.log is None
    cat, torn, ended = read_all(p)
    assert torn == 0 and ended
    # evicted steps (capacity 40 of 400) are all there, and the episodes
    # evicted open that the script went on with are ended
    ends = check_against(cat, rec)
    assert ends > 0
    assert len(buf) <= 40
    assert np.all(cat.sources == 3)
    assert t0 <= cat.timestamps[0] and cat.timestamps[-1] <= time.time_ns()
    # handles and positions: consecutive positions within an episode
    for h in np.unique(cat.handles):
        pos = cat.positions[(cat.handles == h) & ((cat.flags & xlog.FLAG_NO_STEP) == 0)]
        assert np.array_equal(pos, np.arange(len(pos)))
    d = xlog.info(p)
    assert d["records"] == N and d["ends"] == ends and d["sources"] == [3] and d["chunks"] > 5
    assert d["ended"] and d["torn"] == 0 and d["bytes"] == os.path.getsize(p)
    assert d["state_shape"] == (3, 2) and d["action_shape"] == (2,)
    st = lg.stats
    assert st["records"] == N and st["backlog"] == 0 and st["dropped"] == 0


def test_live_buffer_episodes_match_log(tmp_path):
    p = tmp_path / "b.log"
    lg = ExperienceLog(p, chunk_bytes=300)
    buf = ExperienceReplay(4, capacity=None)
    buf.attach_log(lg)
    rng = np.random.default_rng(2)
    h = None
    for i in range(60):
        h = buf.record_many(h, rng.normal(size=(3, 4)).astype(np.float32), [1, 2, 3],
                            [0.5, 0.25, 0.0], terminated=(i % 5 == 4))
    lg.flush()
    cat, torn, ended = read_all(p)
    assert not ended and torn == 0
    for hh in buf._handles():
        ep = buf.episode(int(hh))
        sel = cat.handles == hh
        assert np.array_equal(cat.states[sel], ep.state)
        assert np.array_equal(cat.actions[sel], ep.action)
    assert buf.detach_log() is lg
    buf.record(None, np.zeros(4, np.float32), 0, 0.0)  # not logged any more
    lg.close()
    assert xlog.info(p)["records"] == 180


def test_from_log_and_ingest(tmp_path):
    p = tmp_path / "c.log"
    lg = ExperienceLog(p, source=1)
    buf = ExperienceReplay((2,), capacity=None, log=lg, pick_len=2)
    rng = np.random.default_rng(3)
    rec = record_script_flat(buf, rng)
    lg.close()
    b2 = ExperienceReplay.from_log(p, capacity=None, pick_len=2)
    assert len(b2) == len(buf) and b2.num_episodes == buf.num_episodes
    assert b2.num_picks == buf.num_picks
    for h1, h2 in zip(buf._handles(), b2._handles()):
        e1, e2 = buf.episode(int(h1)), b2.episode(int(h2))
        for f in ("state", "action", "reward"):
            assert np.array_equal(getattr(e1, f), getattr(e2, f))
        assert (e1.ended, e1.terminated) == (e2.ended, e2.terminated)
        if e1.final_state is not None:
            assert np.array_equal(e1.final_state, e2.final_state)
    b3 = ExperienceReplay((2,), capacity=None)
    assert b3.ingest(p) == len(rec)
    b2._check()
    with pytest.raises(ValueError, match="layout"):
        ExperienceReplay((3,)).ingest(p)
    with pytest.raises(TypeError, match="state_shape"):
        ExperienceReplay.from_log(p, state_shape=(2,))


def record_script_flat(buf, rng):
    rec = []
    h = None
    for i in range(50):
        k = int(rng.integers(1, 4))
        s = rng.normal(size=(k, 2)).astype(np.float32)
        fin = rng.normal(size=2).astype(np.float32) if i % 6 == 5 else None
        h = buf.record_many(h, s, np.arange(k), np.ones(k, np.float32), final_state=fin,
                            terminated=i % 9 == 8)
        rec.extend(s)
    return rec


def test_standalone_append(tmp_path):
    p = tmp_path / "d.log"
    with ExperienceLog(p, source=9, state_shape=(2,), state_dtype="int16",
                       action_shape=(), action_dtype="int32", reward_dtype="float64") as lg:
        lg.append(5, 0, [1, 2], 3, 0.5)
        lg.append_many(5, 1, [[3, 4], [5, 6]], [7, 8], [0.25, 1.0], final_state=[9, 9])
        lg.append(6, 0, [0, 0], 0, 0.0, terminated=True)
        assert "source=9" in repr(lg)
    assert lg.closed
    c = xlog.tail(p, 100)
    assert c.states.dtype == np.int16 and c.actions.dtype == np.int32
    assert c.rewards.dtype == np.float64
    assert c.states.tolist() == [[1, 2], [3, 4], [5, 6], [0, 0]]
    assert c.handles.tolist() == [5, 5, 5, 6] and c.positions.tolist() == [0, 1, 2, 0]
    assert c.flags.tolist() == [0, 0, xlog.FLAG_END | xlog.FLAG_FINAL,
                                xlog.FLAG_END | xlog.FLAG_TERMINATED]
    assert c.final_states.tolist() == [[9, 9]]
    assert c.sources.tolist() == [9] * 4


def test_writer_errors(tmp_path):
    p = tmp_path / "e.log"
    lg = ExperienceLog(p)
    with pytest.raises(ValueError, match="no record layout"):
        lg.append(0, 0, [1.0], 0, 0.0)
    with pytest.raises(FileExistsError, match="overwrite"):
        ExperienceLog(p)
    for kw, exc in [({"source": -1}, ValueError), ({"level": 10}, ValueError),
                    ({"level": "1"}, TypeError), ({"chunk_bytes": 0}, ValueError),
                    ({"flush_interval": -1}, ValueError), ({"flush_interval": "x"}, TypeError),
                    ({"state_dtype": "float32"}, ValueError),
                    ({"state_shape": (0,)}, ValueError),
                    ({"state_shape": 2, "state_dtype": object}, TypeError)]:
        with pytest.raises(exc):
            ExperienceLog(tmp_path / "x.log", overwrite=True, **kw)
    buf = ExperienceReplay((4,), log=lg)
    with pytest.raises(ValueError, match="already"):
        buf.attach_log(ExperienceLog(tmp_path / "f.log"))
    with pytest.raises(ValueError, match="another buffer"):
        ExperienceReplay((4,)).attach_log(lg)
    with pytest.raises(TypeError, match="ExperienceLog"):
        ExperienceReplay((4,), log=3)
    g = ExperienceLog(tmp_path / "g.log", state_shape=(5,))
    with pytest.raises(ValueError, match="layout"):
        ExperienceReplay((4,), log=g)
    with pytest.raises(ValueError, match="state"):
        lg.append(0, 0, [1.0, 2.0], 0, 0.0)  # wrong shape, nothing logged
    with pytest.raises(TypeError, match="h:"):
        lg.append("x", 0, [1.0] * 4, 0, 0.0)
    with pytest.raises(ValueError, match="pos"):
        lg.append(0, -1, [1.0] * 4, 0, 0.0)
    lg.close()
    with pytest.raises(ValueError, match="closed"):
        lg.append(0, 0, [1.0] * 4, 0, 0.0)
    with pytest.raises(ValueError, match="closed"):
        ExperienceReplay((4,), log=lg)
    buf.record(None, np.zeros(4, np.float32), 0, 0.0)  # the buffer is detached: fine
    assert xlog.info(p)["records"] == 0


def test_buffer_dropped_before_log(tmp_path):
    p = tmp_path / "h.log"
    lg = ExperienceLog(p, chunk_bytes=1 << 20)
    buf = ExperienceReplay((4,), capacity=10, log=lg)
    for i in range(100):
        buf.record(None, np.full(4, i, np.float32), i, 0.0, terminated=True)
    del buf  # detaches: the log lets go of the buffer's rows first
    lg.close()
    cat, _, _ = read_all(p)
    assert cat.actions.tolist() == list(range(100))
    assert np.array_equal(cat.states[:, 0], np.arange(100))


def test_flush_interval_writes_on_its_own(tmp_path):
    p = tmp_path / "i.log"
    lg = ExperienceLog(p, flush_interval=0.05)
    buf = ExperienceReplay((4,), log=lg)
    buf.record(None, np.zeros(4, np.float32), 0, 0.0)
    deadline = time.monotonic() + 10
    while xlog.info(p)["records"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert xlog.info(p)["records"] == 1
    lg2 = ExperienceLog(tmp_path / "j.log", flush_interval=None, state_shape=4)
    lg2.append(0, 0, np.zeros(4), 0, 0.0)
    time.sleep(0.2)
    assert xlog.info(tmp_path / "j.log")["records"] == 0
    lg2.flush(sync=True)
    assert xlog.info(tmp_path / "j.log")["records"] == 1


def test_back_pressure_bounds_the_backlog(tmp_path):
    p = tmp_path / "k.log"
    frame = 84 * 84
    lg = ExperienceLog(p, level=9, chunk_bytes=64 << 10, max_backlog=256 << 10)
    buf = ExperienceReplay((84, 84), "uint8", capacity=2000, log=lg)
    rng = np.random.default_rng(4)
    frames = rng.integers(0, 255, (32, 84, 84), dtype=np.uint8)
    peak = 0
    h = None
    for i in range(60):
        h = buf.record_many(h, frames, np.zeros(32, np.int64), np.zeros(32, np.float32))
        peak = max(peak, lg.stats["backlog"])
    st = lg.stats
    # at most max_backlog plus one call's steps are ever waiting
    assert peak <= (256 << 10) + 32 * (frame + 8 + 4 + 29)
    assert st["throttled"] > 0
    lg.close()
    assert xlog.info(p)["records"] == 60 * 32


def test_threads_record_and_sample_with_log(tmp_path):
    p = tmp_path / "t.log"
    lg = ExperienceLog(p, chunk_bytes=4096, max_backlog=64 << 10)
    buf = ExperienceReplay((8,), capacity=500, pick_len=2, log=lg)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    n_threads, per = 6, 300
    counts = []
    errors = []

    def actor(k):
        rng = np.random.default_rng(k)
        h = None
        n = 0
        try:
            for i in range(per):
                T = int(rng.integers(1, 5))
                st = np.full((T, 8), k, np.float32)
                h = buf.record_many(h, st, np.full(T, k), np.zeros(T, np.float32),
                                    terminated=rng.random() < 0.2)
                n += T
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        counts.append(n)

    def learner():
        for _ in range(300):
            if buf.num_picks:
                buf.get_batch(32, ps)

    ts = [threading.Thread(target=actor, args=(k,)) for k in range(n_threads)]
    ts.append(threading.Thread(target=learner))
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    buf._check()
    lg.close()
    cat, _, _ = read_all(p)
    ends = (cat.flags & xlog.FLAG_NO_STEP) != 0  # open episodes evicted, then gone on with
    assert np.count_nonzero(~ends) == sum(counts)
    assert np.all(np.diff(cat.timestamps) >= 0)
    # every row is whole: a thread's steps carry its id in state and action
    assert np.all(cat.states[~ends] == cat.actions[~ends, None].astype(np.float32))
    got = np.bincount(cat.actions[~ends], minlength=n_threads)
    assert sorted(got.tolist()) == sorted(counts)
    # an end follows the step that went on with its episode, in the same hold
    fin_at = np.cumsum((cat.flags & xlog.FLAG_FINAL) != 0) - 1
    for i in np.flatnonzero(ends):
        assert not ends[i - 1] and np.array_equal(cat.final_states[fin_at[i]], cat.states[i - 1])


# ---- tail -------------------------------------------------------------------------


def test_tail_across_chunks(tmp_path):
    p = tmp_path / "tail.log"
    lg = ExperienceLog(p, chunk_bytes=200, state_shape=(3,))
    for i in range(500):
        lg.append(i // 10, i % 10, [i, i, i], i, float(i),
                  final_state=[-i, 0, 0] if i % 10 == 9 else None)
    lg.close()
    cat, _, _ = read_all(p)
    assert xlog.info(p)["chunks"] > 20
    for n in [0, 1, 2, 3, 7, 99, 100, 101, 250, 499, 500, 10000]:
        t = xlog.tail(p, n)
        k = min(n, 500)
        assert t.actions.tolist() == list(range(500 - k, 500))
        assert np.array_equal(t.timestamps, cat.timestamps[500 - k:])
        nf = int(np.count_nonzero(t.flags & xlog.FLAG_FINAL))
        assert np.array_equal(t.final_states, cat.final_states[len(cat.final_states) - nf:]
                              if nf else cat.final_states[:0])
    assert xlog.tail(p).actions.tolist() == list(range(400, 500))
    with pytest.raises(ValueError, match="n:"):
        xlog.tail(p, -1)
    with pytest.raises(TypeError, match="n:"):
        xlog.tail(p, 1.5)


def test_torn_tail_every_cut(tmp_path):
    p = tmp_path / "torn.log"
    lg = ExperienceLog(p, chunk_bytes=300, state_shape=(2,), level=1)
    for i in range(60):
        lg.append(0, i, [i, i], i, 0.0)
    lg.close()
    data = p.read_bytes()
    whole = read_all(p)[0]
    with xlog.open(p) as r:
        heads = [(off, h.count) for off, h, _ in r._headers(False)]
        hl = r.schema.header_len
    end_marker = len(data) - xlog.HDR - xlog.TRL
    ends = [o for o, _ in heads[1:]] + [end_marker]  # where each records chunk ends
    q = tmp_path / "cut.log"
    step = max(1, (len(data) - hl) // 250)
    for cut in sorted(set(list(range(hl, len(data), step)) + [len(data) - 1, len(data) - 17,
                                                               end_marker])):
        q.write_bytes(data[:cut])
        done = [k for k, e in enumerate(ends) if e <= cut]
        n = sum(heads[k][1] for k in done)
        last_end = ends[done[-1]] if done else hl
        cat, torn, ended = read_all(q)
        got = 0 if cat is None else len(cat.timestamps)
        assert got == n, cut
        assert cat is None or np.array_equal(cat.actions, whole.actions[:n])
        assert torn == cut - last_end and not ended
        t = xlog.tail(q, 7)
        assert t.actions.tolist() == whole.actions[max(0, n - 7):n].tolist()
        d = xlog.info(q)
        assert d["records"] == n and d["torn"] == cut - last_end


# ---- merge --------------------------------------------------------------------------


def write_log(path, ts, source, handles=None, chunk=None):
    """A log with given timestamps (through the Python writer)."""
    n = len(ts)
    schema = xlog._Schema(4, 8, 4, {"state": (np.dtype("<f4"), (1,)),
                                    "action": (np.dtype("<i8"), ()),
                                    "reward": (np.dtype("<f4"), ()), "sources": None}, 0)
    w = xlog._Writer(path, schema, 1, [source])
    rows = np.zeros((n, 16), np.uint8)
    rows[:, :4] = np.arange(n, dtype="<f4").view(np.uint8).reshape(n, 4)
    rows[:, 4:12] = np.full(n, source, "<i8").view(np.uint8).reshape(n, 8)
    chunk = chunk or n
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        w.write(xlog._Raw(np.asarray(ts[a:b], np.int64),
                          np.asarray(handles[a:b] if handles is not None else np.zeros(b - a),
                                     np.int64),
                          np.arange(a, b, dtype=np.int64), np.full(b - a, source, np.uint32),
                          np.zeros(b - a, np.uint8), rows[a:b], np.zeros((0, 4), np.uint8)))
    w.close(int(ts[-1]))


def test_merge_order_and_stability(tmp_path):
    rng = np.random.default_rng(5)
    paths, expect = [], []
    for k in range(5):
        n = int(rng.integers(50, 300))
        ts = np.sort(rng.integers(0, 60, n))  # many equal timestamps, within and across
        p = tmp_path / ("in%d.log" % k)
        write_log(p, ts, source=10 + k, chunk=int(rng.integers(1, 40)))
        paths.append(p)
        expect.extend((int(t), k, i) for i, t in enumerate(ts))
    expect.sort(key=lambda e: (e[0], e[1]))  # stable: input order, then log order
    out = tmp_path / "merged.log"
    seen = []
    d = xlog.merge(paths, out, chunk_bytes=500, progress=lambda done, total: seen.append(done))
    assert seen and seen[-1] == sum(os.path.getsize(p) for p in paths)
    cat, torn, ended = read_all(out)
    assert ended and torn == 0
    got = list(zip(cat.timestamps.tolist(), (cat.sources - 10).tolist(),
                   cat.states[:, 0].astype(int).tolist()))
    assert got == expect
    assert d["records"] == len(expect) and d["sources"] == [10, 11, 12, 13, 14]
    # a merged log is a log: tail, merge again, from_log
    assert np.array_equal(xlog.tail(out, 30).timestamps, cat.timestamps[-30:])
    out2 = tmp_path / "merged2.log"
    xlog.merge([out], out2)
    assert np.array_equal(read_all(out2)[0].timestamps, cat.timestamps)
    with pytest.raises(FileExistsError):
        xlog.merge(paths, out)


def test_merge_real_writers_and_final_states(tmp_path):
    paths = []
    bufs = []
    for k in range(3):
        p = tmp_path / ("a%d.log" % k)
        lg = ExperienceLog(p, source=k, chunk_bytes=256)
        b = ExperienceReplay((2,), capacity=None, log=lg)
        bufs.append((b, lg))
        paths.append(p)
    rng = np.random.default_rng(6)
    hs = [None] * 3
    for i in range(300):
        k = int(rng.integers(0, 3))
        b, _ = bufs[k]
        end = rng.random() < 0.15
        hs[k] = b.record(hs[k], np.full(2, i, np.float32), i, float(k),
                         final_state=np.full(2, -i, np.float32) if end else None)
    for _, lg in bufs:
        lg.close()
    out = tmp_path / "m.log"
    xlog.merge(paths, out)
    cat, _, _ = read_all(out)
    assert cat.actions.tolist() == list(range(300))  # recorded in this order
    assert np.array_equal(cat.sources, cat.rewards.astype(np.uint32))
    fin_rows = cat.actions[(cat.flags & xlog.FLAG_FINAL) != 0]
    assert np.array_equal(cat.final_states[:, 0], -fin_rows.astype(np.float32))
    b2 = ExperienceReplay.from_log(out, capacity=None)
    assert len(b2) == 300
    assert b2.num_episodes == sum(b.num_episodes for b, _ in bufs)


def tiny_logs(tmp_path, n, source0=0):
    """n one-record logs of sources source0 .. source0 + n - 1."""
    paths = []
    for i in range(n):
        p = tmp_path / ("s%05d.xlog" % i)
        with ExperienceLog(p, state_shape=(1,), source=source0 + i) as lg:
            lg.append(0, 0, [float(i)], i, 0.0, terminated=True)
        paths.append(p)
    return paths


def test_merge_of_a_thousand_sources(tmp_path):
    """The merged header lists every source: past a few hundred of them
    (about 330 ids of 10 digits, 800 of 3) the list no longer fit the 4096
    bytes of a writer's schema, and the merge failed with "schema: longer
    than 4096 bytes"."""
    paths = tiny_logs(tmp_path, 1000, source0=2**32 - 1001)  # ids of 10 digits
    out = tmp_path / "merged.xlog"
    d = xlog.merge(paths, out)
    assert d["records"] == 1000 and d["sources"] == list(range(2**32 - 1001, 2**32 - 1))
    cat, torn, ended = read_all(out)
    assert ended and not torn and sorted(cat.actions.tolist()) == list(range(1000))
    d2 = xlog.merge([out], tmp_path / "again.xlog")  # a merged log is an input too
    assert d2["sources"] == d["sources"] and d2["records"] == 1000
    assert ExperienceReplay.from_log(out, capacity=None).num_episodes == 1000


def test_the_largest_merged_header_reads_back():
    schema = xlog._Schema(4, 8, 4, {"state": (np.dtype("<f4"), (1,)),
                                    "action": (np.dtype("<i8"), ()),
                                    "reward": (np.dtype("<f4"), ()), "sources": None}, 0)
    top = 2**32 - 1  # MIXED_SOURCE, one past the largest id
    ids = list(range(top - xlog.MAX_MERGE_SOURCES, top))
    s = xlog._read_schema(io.BytesIO(schema.header_bytes({"sources": ids})), "x")
    assert s.sources == ids


def test_merge_of_too_many_sources_is_refused_before_the_output_exists(tmp_path, monkeypatch):
    paths = tiny_logs(tmp_path, 6)
    monkeypatch.setattr(xlog, "MAX_MERGE_SOURCES", 5)
    out = tmp_path / "merged.xlog"
    with pytest.raises(ValueError) as e:
        xlog.merge(paths, out)
    assert str(e.value) == ("inputs: expected logs of at most 5 distinct sources in all (a "
                            "merged log's header lists each), got 6 sources in 6 inputs; split "
                            "the inputs among several merged logs")
    assert not out.exists()
    assert xlog.merge(paths[:5], out)["sources"] == [0, 1, 2, 3, 4]


MERGE_UNDER_A_FILE_LIMIT = textwrap.dedent("""
    import resource, sys
    import exreplay.log as xlog
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    try:
        xlog.merge(sys.argv[2:], sys.argv[1])
    except OSError as e:
        print(e.errno, e)
""")


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is POSIX")
def test_merge_of_more_inputs_than_open_files_says_what_to_do(tmp_path):
    """A merge keeps every input open: past the process's limit of open
    files it failed with a bare "Too many open files" naming one input."""
    paths = tiny_logs(tmp_path, 100)
    out = tmp_path / "merged.xlog"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", MERGE_UNDER_A_FILE_LIMIT, str(out)]
                       + [str(p) for p in paths], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("%d [Errno %d] inputs: a merge keeps every input open, and 100 "
                               "inputs are more files than this process may open at once (its "
                               "limit is 64, ulimit -n): raise the limit (resource.setrlimit), or "
                               "merge consecutive groups of the inputs, then the groups' outputs "
                               "in the same order" % (errno.EMFILE, errno.EMFILE)), r.stdout
    assert not out.exists()
    # the advice holds: groups of consecutive inputs, then their outputs, in order
    groups = [xlog.merge(paths[i:i + 40], tmp_path / ("g%d.xlog" % i))["path"]
              for i in range(0, 100, 40)]
    xlog.merge(groups, out)
    xlog.merge(paths, tmp_path / "direct.xlog")
    a, b = read_all(out)[0], read_all(tmp_path / "direct.xlog")[0]
    assert all(np.array_equal(getattr(a, f), getattr(b, f)) for f in xlog.Chunk._fields
               if f != "extras")


def test_merge_rejects_mixed_layouts(tmp_path):
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    ExperienceLog(a, state_shape=(2,)).close()
    ExperienceLog(b, state_shape=(3,)).close()
    with pytest.raises(ValueError, match="layout"):
        xlog.merge([a, b], tmp_path / "o.log")
    with pytest.raises(ValueError, match="inputs"):
        xlog.merge([], tmp_path / "o.log")
    with pytest.raises(ValueError, match="level"):
        xlog.merge([a], tmp_path / "o.log", level=11)
    assert not (tmp_path / "o.log").exists()


# (call, exception, message) with a one-record log "a.log" in the directory
# and "o.log" the output: a wrong type is a TypeError, a wrong value of the
# right type a ValueError; each names its argument, what was expected and
# what came.
BAD_LOG_ARGS = [
    (lambda d: xlog.merge(d / "a.log", d / "o.log"), TypeError,
     "inputs: expected a sequence of log paths (a list or tuple: its order breaks timestamp "
     "ties), got PosixPath"),
    (lambda d: xlog.merge(None, d / "o.log"), TypeError,
     "inputs: expected a sequence of log paths (a list or tuple: its order breaks timestamp "
     "ties), got NoneType"),
    (lambda d: xlog.merge({d / "a.log"}, d / "o.log"), TypeError,
     "inputs: expected a sequence of log paths (a list or tuple: its order breaks timestamp "
     "ties), got set"),
    (lambda d: xlog.merge((p for p in [d / "a.log"]), d / "o.log"), TypeError,
     "inputs: expected a sequence of log paths (a list or tuple: its order breaks timestamp "
     "ties), got generator"),
    (lambda d: xlog.merge([], d / "o.log"), ValueError,
     "inputs: expected at least one log path, got an empty list"),
    (lambda d: xlog.merge([d / "a.log", None], d / "o.log"), TypeError,
     "inputs[1]: expected a path (str, bytes or os.PathLike), got NoneType"),
    (lambda d: xlog.merge([d / "a.log"], 3), TypeError,
     "output: expected a path (str, bytes or os.PathLike), got int"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", level="1"), TypeError,
     "level: expected an int from 0 to 9, got str"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", level=1.0), TypeError,
     "level: expected an int from 0 to 9, got float"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", level=True), TypeError,
     "level: expected an int from 0 to 9, got bool"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", level=None), TypeError,
     "level: expected an int from 0 to 9, got NoneType"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", level=10), ValueError,
     "level: expected an int from 0 to 9, got 10"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", chunk_bytes=1e6), TypeError,
     "chunk_bytes: expected an int from 1 to 2**30, got float"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", chunk_bytes=[1]), TypeError,
     "chunk_bytes: expected an int from 1 to 2**30, got list"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", chunk_bytes=0), ValueError,
     "chunk_bytes: expected an int from 1 to 2**30, got 0"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", threads="2"), TypeError,
     "threads: expected None or an int from 0 to 64, got str"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", threads=np.array([2])), TypeError,
     "threads: expected None or an int from 0 to 64, got numpy.ndarray of dtype int64 and "
     "shape (1,)"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", threads=65), ValueError,
     "threads: expected None or an int from 0 to 64, got 65"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", progress="yes"), TypeError,
     "progress: expected None, a bool or a callable(bytes_done, bytes_total), got str"),
    (lambda d: xlog.merge([d / "a.log"], d / "o.log", progress=[]), TypeError,
     "progress: expected None, a bool or a callable(bytes_done, bytes_total), got list"),
    (lambda d: xlog.open(None), TypeError,
     "path: expected a path (str, bytes or os.PathLike), got NoneType"),
    (lambda d: xlog.info([d / "a.log"]), TypeError,
     "path: expected a path (str, bytes or os.PathLike), got list"),
    (lambda d: xlog.tail(3), TypeError,
     "path: expected a path (str, bytes or os.PathLike), got int"),
    (lambda d: xlog.tail(d / "a.log", "5"), TypeError, "n: expected an int >= 0, got str"),
    (lambda d: xlog.tail(d / "a.log", True), TypeError, "n: expected an int >= 0, got bool"),
    (lambda d: xlog.tail(d / "a.log", -1), ValueError, "n: expected an int >= 0, got -1"),
    (lambda d: ExperienceReplay.from_log(None), TypeError,
     "path: expected a path (str, bytes or os.PathLike), got NoneType"),
    (lambda d: xlog.main("info"), TypeError,
     "argv: expected None or a sequence of str (the arguments after the program name), "
     "got str"),
    (lambda d: xlog.main(["info", d / "a.log"]), TypeError,
     "argv[1]: expected a str, got PosixPath"),
]


@pytest.mark.parametrize("case", range(len(BAD_LOG_ARGS)))
def test_bad_arguments_of_the_log_module(tmp_path, case):
    call, exc, msg = BAD_LOG_ARGS[case]
    with ExperienceLog(tmp_path / "a.log", state_shape=(1,)) as lg:
        lg.append(0, 0, [0.0], 0, 0.0)
    with pytest.raises(exc) as e:
        call(tmp_path)
    assert type(e.value) is exc and str(e.value) == msg
    assert sorted(os.listdir(tmp_path)) == ["a.log"]


def test_merge_takes_numpy_ints_and_int_flags(tmp_path):
    with ExperienceLog(tmp_path / "a.log", state_shape=(1,)) as lg:
        lg.append(0, 0, [0.0], 0, 0.0)
    d = xlog.merge((tmp_path / "a.log",), tmp_path / "o.log", level=np.int64(0),
                   chunk_bytes=np.array(100), threads=np.uint8(1), progress=0)
    assert d["records"] == 1
    assert len(xlog.tail(tmp_path / "o.log", np.int32(5)).timestamps) == 1


def test_merge_threads_give_the_same_bytes(tmp_path):
    """The merge's worker threads change when chunks are decoded and
    compressed, never what is written: threads=0 (all on the caller's
    thread), 1, 3 and the default give byte-identical files, at level 0 and
    1, with final states and output chunks of every size."""
    rng = np.random.default_rng(11)
    paths = []
    for k in range(4):
        p = tmp_path / ("t%d.log" % k)
        lg = ExperienceLog(p, source=k, chunk_bytes=int(rng.integers(100, 2000)))
        b = ExperienceReplay((5,), capacity=None, log=lg)
        h = None
        for i in range(400):
            end = rng.random() < 0.1
            h = b.record(h, np.full(5, i, np.float32), i, float(k),
                         final_state=np.full(5, -i, np.float32) if end and i % 2 else None,
                         terminated=end and not i % 2)
            h = None if end else h
        lg.close()
        paths.append(p)
    for level in (0, 1, 6):
        for cb in (50, 700, 1 << 20):
            blobs = []
            for threads in (0, 1, 3, None):
                out = tmp_path / ("m_%d_%d_%s.log" % (level, cb, threads))
                d = xlog.merge(paths, out, level=level, chunk_bytes=cb, threads=threads)
                assert d["records"] == 1600
                blobs.append(out.read_bytes())
            assert all(b == blobs[0] for b in blobs[1:]), (level, cb)
            cat, torn, ended = read_all(out)
            assert ended and not torn and np.all(np.diff(cat.timestamps) >= 0)
            # every chunk decompresses with zlib itself (its own Adler-32 check)
            for _, h, body in xlog.open(out)._headers(True):
                if h.codec == xlog.CODEC_ZLIB:
                    assert len(zlib.decompress(body)) == h.raw_len
    with pytest.raises(ValueError, match="threads"):
        xlog.merge(paths, tmp_path / "x.log", threads=-1)
    with pytest.raises(TypeError, match="threads"):
        xlog.merge(paths, tmp_path / "x.log", threads=1.5)
    assert not (tmp_path / "x.log").exists()


def test_adler32_matches_zlib():
    """The merge's Adler-32 (SSSE3 where the CPU has it) against zlib's, at
    the lengths around its block (32 bytes) and its reduction span (5552),
    with all-0xFF bytes (the largest sums) and random ones."""
    from exreplay import _core

    rng = np.random.default_rng(3)
    lengths = list(range(0, 130)) + [5551, 5552, 5553, 5552 * 32 - 1, 5552 * 32 + 33,
                                     (1 << 20) + 7, 3 * 5552 * 32]
    for n in lengths:
        for b in (b"\xff" * n, rng.integers(0, 256, n, dtype=np.uint8).tobytes()):
            for start in (1, 0xFFF0FFF0, 0x12345678 % 65521):
                assert _core._adler32(b, start) == zlib.adler32(b, start), (n, start)


def _one_chunk_log(path, body_of):
    """A valid one-chunk log whose zlib body is replaced by body_of(raw), CRCs fixed."""
    import log_fuzz

    blob = log_fuzz.make_seed(str(path), chunk_bytes=1 << 20, n=20)
    head, chunks, tail = log_fuzz.parse(blob)
    c = chunks[0]
    body = body_of(c["raw"])
    hb = struct.pack("<4sHHIIqqQQI", xlog.CHUNK_MAGIC, c["kind"], c["codec"], c["count"],
                     c["source"], c["first"], c["last"], len(c["raw"]), len(body),
                     zlib.crc32(body))
    hcrc = zlib.crc32(hb)
    start = len(log_fuzz.serialize(head, []))
    path.write_bytes(blob[:start] + hb + struct.pack("<I", hcrc) + body
                     + xlog._TRL.pack(xlog.HDR + len(body) + xlog.TRL, hcrc, xlog.TRAILER_MAGIC)
                     + log_fuzz.serialize(head, chunks[1:])[start:])


@pytest.mark.parametrize("what,body_of", [
    ("data check", lambda raw: zlib.compress(raw)[:-1] + bytes([zlib.compress(raw)[-1] ^ 1])),
    ("header check", lambda raw: b"\x79" + zlib.compress(raw)[1:]),
    ("dictionary", lambda raw: bytes([0x78, 0x20 + (31 - (0x7820 % 31))]) + zlib.compress(raw)[2:]),
    ("inflate", lambda raw: zlib.compress(raw) + b"\0"),
    ("inflate", lambda raw: zlib.compress(raw)[:-6] + zlib.compress(raw)[-4:]),
    ("inflate", lambda raw: zlib.compress(raw + b"x")),
    ("body", lambda raw: zlib.compress(raw)[:2] + b"\xff" * 40 + zlib.compress(raw)[-4:]),
    # shorter than the zlib wrapper: the merge engine refused it when pushed,
    # with its own internal message naming no file (found by fuzz_log_merge)
    ("header check", lambda raw: zlib.compress(raw)[:2]),
    ("header check", lambda raw: zlib.compress(raw)[:5]),
])
def test_merge_refuses_bad_zlib_bodies(tmp_path, what, body_of):
    """Bodies whose CRC checks out but whose zlib stream does not: the merge
    (which reads the zlib wrapper and the Adler-32 itself) refuses each as
    the reader does, with ValueError naming the file, and leaves no output."""
    p = tmp_path / "bad.log"
    _one_chunk_log(p, body_of)
    with pytest.raises(ValueError, match="not a valid experience log"):
        read_all(p)
    for threads in (0, 2):
        with pytest.raises(ValueError, match="bad.log: not a valid experience log at byte"):
            xlog.merge([p], tmp_path / "o.log", threads=threads)
        assert not (tmp_path / "o.log").exists()


# ---- command line --------------------------------------------------------------------


def test_command_line(tmp_path, capsys):
    p = tmp_path / "cli.log"
    with ExperienceLog(p, source=2, state_shape=(2,)) as lg:
        for i in range(20):
            lg.append(0, i, [i, 0], i, 1.0, terminated=i == 19)
    assert xlog.main(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "records 20 (steps), 0 ends without a step, in 1 chunks" in out
    assert "sources [2]" in out and "closed" in out
    assert xlog.main(["tail", "-n", "3", str(p)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "pos=19 ET" in lines[-1]
    assert xlog.main(["cat", str(p)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 20
    o = tmp_path / "o.log"
    assert xlog.main(["merge", "-o", str(o), str(p), str(p)]) == 0
    assert "40 records" in capsys.readouterr().out
    bad = tmp_path / "bad.log"
    bad.write_bytes(b"not a log at all")
    assert xlog.main(["info", str(bad)]) == 1
    assert "not a valid experience log" in capsys.readouterr().err
    r = subprocess.run([sys.executable, "-m", "exreplay.log", "info", "--json", str(p)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0 and '"records": 20' in r.stdout


def test_command_line_merge_overwrite(tmp_path, capsys):
    """merge --overwrite replaces an existing output (merge(..., overwrite=True));
    without it an existing output is an error, status 1, that names the
    option as the command line spells it and leaves the file as it was."""
    p = tmp_path / "cli.log"
    with ExperienceLog(p, source=2, state_shape=(2,)) as lg:
        for i in range(20):
            lg.append(0, i, [i, 0], i, 1.0)
    o = tmp_path / "o.log"
    assert xlog.main(["merge", "--no-progress", "-o", str(o), str(p)]) == 0
    capsys.readouterr()
    old = o.read_bytes()
    assert xlog.main(["merge", "-o", str(o), str(p), str(p)]) == 1
    err = capsys.readouterr().err
    assert "error:" in err and "--overwrite" in err and "overwrite=True" not in err
    assert o.read_bytes() == old
    assert xlog.main(["merge", "--overwrite", "-o", str(o), str(p), str(p)]) == 0
    assert "40 records" in capsys.readouterr().out
    assert xlog.info(o)["records"] == 40
    # the output among the inputs: the old file is read, the new one takes its name
    assert xlog.main(["merge", "-o", str(o), "--overwrite", str(o), str(p)]) == 0
    assert "60 records" in capsys.readouterr().out
    assert xlog.info(o)["records"] == 60
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith(".")] == []  # no temp file


def test_cat_into_a_pipe_closed_early(tmp_path):
    """`python -m exreplay.log cat FILE | head`: the reader goes away after a
    line; the command ends quietly, with status 0 and nothing on stderr."""
    p = tmp_path / "big.log"
    with ExperienceLog(p, source=0, state_shape=(2,)) as lg:
        for i in range(20_000):  # ~1 MB of text: far more than a pipe holds
            lg.append(0, i, [i, 0], i, 1.0)
    proc = subprocess.Popen([sys.executable, "-m", "exreplay.log", "cat", str(p)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(timeout=60) == 0 and err == b""


def test_reader_iterates_again(tmp_path):
    p = tmp_path / "again.log"
    with ExperienceLog(p, source=0, state_shape=(2,), chunk_bytes=256) as lg:
        for i in range(50):
            lg.append(0, i, [i, 0], i, 1.0)
    with xlog.open(p) as r:
        first = [c.actions.tolist() for c in r]
        assert r.ended and r.torn == 0 and len(first) > 1
        second = [c.actions.tolist() for c in r]  # the end marker is not "data after" it
        assert second == first and r.ended and r.torn == 0
    data = p.read_bytes()
    q = tmp_path / "torn.log"
    q.write_bytes(data[:len(data) // 2 + 7])  # no end marker, some chunks cut off
    with xlog.open(q) as r:
        passes = [(sum(len(c.actions) for c in r), r.torn, r.ended) for _ in range(2)]
    assert passes[0] == passes[1] and 0 < passes[0][0] < 50 and not passes[0][2]


# ---- bad input ----------------------------------------------------------------------


def test_bad_files(tmp_path):
    p = tmp_path / "ok.log"
    with ExperienceLog(p, state_shape=(2,), chunk_bytes=100) as lg:
        for i in range(30):
            lg.append(0, i, [i, 0], i, 1.0)
    data = p.read_bytes()
    cases = {
        "empty": b"",
        "magic": b"XXXXXXXX" + data[8:],
        "version": data[:8] + struct.pack("<I", 2) + data[12:],
        "header crc": data[:20] + b"\xff" + data[21:],
        "garbage after": data + b"\x00" * 100,
        "flipped body": data[:200] + bytes([data[200] ^ 1]) + data[201:],
    }
    for name, blob in cases.items():
        q = tmp_path / "bad.log"
        q.write_bytes(blob)
        with pytest.raises(ValueError, match="not a valid experience log"):
            read_all(q)
            xlog.info(q)
            xlog.tail(q)
    with pytest.raises(FileNotFoundError):
        xlog.open(tmp_path / "missing.log")


KILL_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from exreplay import ExperienceLog, ExperienceReplay
    path, seed = sys.argv[1], int(sys.argv[2])
    lg = ExperienceLog(path, source=1, chunk_bytes=int(sys.argv[3]), flush_interval=0.01)
    buf = ExperienceReplay((16,), "uint8", capacity=1000, log=lg)
    n = 0
    h = None
    rng = np.random.default_rng(seed)
    while True:
        T = int(rng.integers(1, 20))
        st = (np.arange(n, n + T)[:, None] + np.arange(16)).astype(np.uint8)
        h = buf.record_many(h, st, np.arange(n, n + T), np.zeros(T, np.float32))
        n += T
        if rng.random() < 0.2:
            lg.flush()
            print(n, flush=True)
""")


@pytest.mark.parametrize("chunk_bytes", [256, 64 << 10])
def test_kill_9_loses_nothing_flushed(tmp_path, chunk_bytes):
    script = tmp_path / "child.py"
    script.write_text(KILL_CHILD)
    rng = np.random.default_rng(chunk_bytes)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rounds = 12
    for r in range(rounds):
        p = tmp_path / ("k%d.log" % r)
        proc = subprocess.Popen([sys.executable, str(script), str(p), str(r), str(chunk_bytes)],
                                stdout=subprocess.PIPE, text=True, env=env)
        flushed = 0
        want = int(rng.integers(3, 60))
        for _ in range(want):
            line = proc.stdout.readline()
            if not line:
                break
            flushed = int(line)
        time.sleep(float(rng.random()) * 0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        assert flushed > 0
        cat, torn, ended = read_all(p)
        assert not ended
        # the steps, and the ends of the parts of the one trajectory that
        # capacity evicted open (each ended by the step that went on)
        step = (cat.flags & xlog.FLAG_NO_STEP) == 0
        n = int(np.count_nonzero(step))
        assert n >= flushed  # nothing flushed is lost
        assert cat.actions[step].tolist() == list(range(n))  # and what is there is a prefix
        want_states = (np.arange(n)[:, None] + np.arange(16)).astype(np.uint8)
        assert np.array_equal(cat.states[step], want_states)
        t = xlog.tail(p, 5)
        assert t.actions.tolist() == cat.actions[-5:].tolist()
        assert t.flags.tolist() == cat.flags[-5:].tolist()


def test_failed_constructor_leaves_no_file(tmp_path):
    """A constructor that fails after creating its file removes it again."""
    path = tmp_path / "x.xlog"
    with pytest.raises((ValueError, TypeError)):
        exreplay.ExperienceLog(path, state_shape=(3, -1))
    assert not path.exists()
    with pytest.raises(ValueError):
        exreplay.ExperienceLog(path, state_dtype="float32")
    assert not path.exists()
    exreplay.ExperienceLog(path, state_shape=(3,)).close()
    assert path.exists()


def test_record_layout_must_fit_a_chunk(tmp_path):
    """One step with its final state and 29 bytes of metadata must fit the
    2**30-byte chunk; a larger layout is refused when the log takes it, and
    the log stays without one."""
    limit = 2**30 - 29  # 2 * state + action (int64) + reward (float32)
    ok = (limit - 12) // 2
    with ExperienceLog(tmp_path / "ok.log", state_shape=(ok,), state_dtype="uint8") as lg:
        assert lg.stats["records"] == 0
    p = tmp_path / "big.log"
    with pytest.raises(ValueError, match=r"state_shape: expected a record .* got a state of "
                                         r"%d bytes" % (ok + 1)):
        ExperienceLog(p, state_shape=(ok + 1,), state_dtype="uint8")
    assert not p.exists()
    lg = ExperienceLog(p)
    buf = ExperienceReplay((ok + 1,), state_dtype="uint8", capacity=4)
    with pytest.raises(ValueError, match="state_shape: expected a record"):
        buf.attach_log(lg)
    with pytest.raises(ValueError, match="no record layout"):
        lg.append(0, 0, np.zeros(ok + 1, np.uint8), 0, 0.0)
    lg.close()


@pytest.mark.slow
def test_step_past_the_chunk_limit_starts_a_chunk(tmp_path):
    """Two steps of 256 MiB leave room for a third without a final state,
    not for one with: that step goes to a chunk of its own (no throttle,
    which would seal the chunk at each step). (It used to
    join the chunk, which passed 2**30 raw bytes and was dropped unwritten,
    with no error.)"""
    n = 2**28
    s = np.zeros(n, np.uint8)
    p = tmp_path / "big.log"
    with ExperienceLog(p, chunk_bytes=2**30, flush_interval=None, max_backlog=2**32,
                       state_shape=(n,), state_dtype="uint8") as lg:
        lg.append(1, 0, s, 0, 0.0)
        lg.append(1, 1, s, 0, 0.0)
        lg.append(1, 2, s, 0, 0.0, final_state=s)
        lg.flush()
        st = lg.stats
        assert st["errno"] == 0 and st["records"] == 3 and st["chunks"] == 2
    i = xlog.info(p)
    assert (i["records"], i["chunks"], i["ended"], i["torn"]) == (3, 2, True, 0)


def test_merge_engine_checks_chunk_lengths_itself(tmp_path):
    """The C merge engine repeats the chunk length rules of the Python reader:
    a chunk pushed with lengths that do not fit its count and codec is a
    ValueError before anything is read (a stored chunk's body shorter than
    its raw length used to be read past its end)."""
    from exreplay import _core
    row, sb = 4 + 8 + 4, 4  # state (1,) float32, int64 action, float32 reward
    with open(tmp_path / "out.log", "wb") as out, open(tmp_path / "in.log", "wb") as inp:
        inp.write(b"\0" * 4096)
        inp.flush()
        eng = _core._LogMerge(1, row, sb, 1 << 20, 1, out.fileno(), 0)
        try:
            good = 3 * (29 + row)
            bad = [(0, 3, good, good - 1),          # stored: body != raw
                   (0, 3, good - 1, good - 1),      # raw below the records' fixed part
                   (0, 3, good + 3, good + 3),      # not a whole final state
                   (0, 3, good + 4 * sb, good + 4 * sb),  # more final states than records
                   (0, 0, 0, 0),                    # no records
                   (1, 3, 2**31, 100),              # 1032:1 exceeded
                   (1, 3, 2**31 + good, 2**31),     # past 2**31 raw bytes
                   (2, 3, good, good)]              # unknown codec
            for codec, count, raw, blen in bad:
                with pytest.raises(ValueError, match="push: expected .* raw and body lengths"):
                    eng.push(0, inp.fileno(), 0, 0, codec, count, 0, 0, 0, 0, raw, blen)
            # kind 3 (records without a row may come): between the metadata
            # alone and a row and a final state for each record; kind 4 unknown
            for kind, raw in ((3, 3 * 29 - 1), (3, 3 * (29 + row + sb) + 1), (4, good)):
                with pytest.raises(ValueError, match="push: expected .* raw and body lengths"):
                    eng.push(0, inp.fileno(), 0, 0, 0, 3, 0, 0, 0, 0, raw, raw, kind)
            eng.push(0, inp.fileno(), 0, 0, 0, 3, 0, 0, 0, 0, 3 * 29 + sb, 3 * 29 + sb, 3)
            eng.push(0, inp.fileno(), 0, 0, 0, 3, 0, 0, 0, 0, good, good)  # accepted
        finally:
            eng.close()


def test_constructor_checks_everything_before_it_replaces_a_file(tmp_path):
    """overwrite=True replaces an existing log only once every argument is
    checked: a refused record layout or flag leaves the old file whole."""
    p = tmp_path / "actor0.xlog"
    with ExperienceLog(p, state_shape=(2,)) as lg:
        lg.append(1, 0, [1.0, 2.0], 0, 0.0)
    before = p.read_bytes()
    bad = [dict(state_shape=(4,), reward_dtype="int32"),         # a reward dtype refused
           dict(state_shape=(2**29,), state_dtype="uint8"),      # a record too large for a chunk
           dict(state_shape="x"),                                # not a shape
           dict(state_dtype="uint8"),                            # a dtype without state_shape
           dict(state_shape=(2,), overwrite="no"),               # a flag that is not a bool
           dict(state_shape=(2,), fsync=[1])]
    for kw in bad:
        kw.setdefault("overwrite", True)
        with pytest.raises((TypeError, ValueError)):
            ExperienceLog(p, **kw)
        assert p.read_bytes() == before, kw
    assert xlog.info(p)["records"] == 1


def test_append_arguments_out_of_range_or_of_the_wrong_kind(tmp_path):
    with ExperienceLog(tmp_path / "h.log", state_shape=(2,)) as lg:
        for h in (2**63, 2**64, -2**63 - 1):  # were all logged as episode -1
            with pytest.raises(ValueError, match=r"h: expected an int64 episode handle, got"):
                lg.append(h, 0, [0.0, 0.0], 0, 0.0)
        with pytest.raises(TypeError, match="terminated: expected a bool or an int, got numpy.ndarray"):
            lg.append(1, 0, [0.0, 0.0], 0, 0.0, terminated=np.array([True, False]))
        with pytest.raises(TypeError, match="sync: expected a bool"):
            lg.flush(sync=np.array([1, 2]))
        assert lg.stats["records"] == 0
    with pytest.raises(TypeError, match="flush_interval"):
        ExperienceLog(tmp_path / "i.log", flush_interval=True)
    with pytest.raises(ValueError, match="flush_interval"):
        ExperienceLog(tmp_path / "j.log", flush_interval=2**2000)


def test_ingest_of_a_damaged_log_leaves_the_buffer_as_it_was(tmp_path):
    p = tmp_path / "d.xlog"
    with ExperienceLog(p, chunk_bytes=200, state_shape=(3,)) as lg:
        for i in range(40):
            lg.append(7, i, [float(i)] * 3, 0, 0.0)
    assert xlog.info(p)["chunks"] > 3
    data = bytearray(p.read_bytes())
    data[-200] ^= 0xFF  # a byte of a late chunk's body: its CRC no longer holds
    p.write_bytes(bytes(data))
    buf = ExperienceReplay((3,), capacity=100)
    buf.record(None, [9.0, 9.0, 9.0], 0, 0.0)
    before = buf.serialize(level=0)
    with pytest.raises(ValueError):
        buf.ingest(p)
    assert buf.serialize(level=0) == before


# ---- ends without a step (ExperienceReplay.end_episode) ---------------------------


def _chunk_kinds(path):
    with xlog.open(path) as r:
        return [h.kind for _, h, _ in r._headers(False)]


def end_script(buf, rng, episodes=30, named=False):
    """Episodes of 1-6 steps in 1-3 record_many calls each; most are ended by
    end_episode after their last step (a final state, terminated, or both),
    the rest by their last record_many. Returns the handles in order."""
    hs = []
    for e in range(episodes):
        h = None
        for k in range(int(rng.integers(1, 4))):
            T = int(rng.integers(1, 3))
            st = {"img": rng.integers(0, 255, (T, 2, 2), dtype=np.uint8),
                  "v": rng.normal(size=(T, 3)).astype(np.float32)} if named else \
                rng.normal(size=(T, 3)).astype(np.float32)
            kw = {"extras": {"logp": rng.normal(size=T).astype(np.float32)}} if named else {}
            h = buf.record_many(h, st, rng.integers(0, 4, T), rng.normal(size=T), **kw)
        fin = ({"img": np.full((2, 2), e, np.uint8), "v": np.full(3, e, np.float32)} if named
               else np.full(3, e, np.float32))
        how = e % 4
        if how == 3:
            buf.record_many(h, fin[None] if not named else {k: v[None] for k, v in fin.items()},
                            [0], [0.0], final_state=fin, terminated=True,
                            **({"extras": {"logp": np.zeros(1, np.float32)}} if named else {}))
        else:
            assert buf.end_episode(h, final_state=fin if how != 1 else None,
                                   terminated=how != 0) is True
        hs.append(h)
    return hs


@pytest.mark.parametrize("level", [0, 1])
@pytest.mark.parametrize("named", [False, True])
def test_an_end_without_a_step_is_logged_and_rebuilt(tmp_path, level, named):
    """end_episode writes one record without a row (FLAG_NO_STEP, at the
    episode's step count, with its final state and terminated flag) in a
    chunk of kind 3; every reader reads it; from_log and ingest rebuild a
    buffer that serializes to the same bytes as the one logged."""
    p = tmp_path / "e.log"
    lg = ExperienceLog(p, source=5, level=level, chunk_bytes=600)
    spec = dict(state_spec={"img": ((2, 2), "uint8"), "v": ((3,), "float32")},
                extras_spec={"logp": ((), "float32")}) if named else dict(state_shape=(3,))
    cfg = dict(capacity=None, pick_len=2, allow_short=True, seed=3, **spec)
    buf = ExperienceReplay(log=lg, **cfg)
    buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    hs = end_script(buf, np.random.default_rng(level), named=named)
    lg.close()
    kinds = _chunk_kinds(p)
    assert xlog.KIND_NOSTEP in kinds and set(kinds) <= {xlog.KIND_RECORDS, xlog.KIND_NOSTEP}
    chunks = list(xlog.open(p))
    fl = np.concatenate([c.flags for c in chunks])
    pos = np.concatenate([c.positions for c in chunks])
    hh = np.concatenate([c.handles for c in chunks])
    nostep = (fl & xlog.FLAG_NO_STEP) != 0
    assert nostep.sum() == sum(1 for e in range(len(hs)) if e % 4 != 3)
    assert np.all(fl[nostep] & xlog.FLAG_END)
    for h in hs:
        mine = hh == h
        n = len(buf.episode(h).reward)
        assert np.array_equal(pos[mine & ~nostep], np.arange(n))
        if (mine & nostep).any():
            assert pos[mine & nostep].tolist() == [n]
    for c in chunks:  # a record without a step reads as zeros
        x = c.states["img"] if named else c.states
        assert not x[(c.flags & xlog.FLAG_NO_STEP) != 0].any()
        assert len(c.final_states["v"] if named else c.final_states) == np.count_nonzero(
            c.flags & xlog.FLAG_FINAL)
    d = xlog.info(p)
    assert (d["records"], d["ends"]) == (np.count_nonzero(~nostep), np.count_nonzero(nostep))
    t = xlog.tail(p, 7)
    assert np.array_equal(t.flags, fl[-7:])
    rebuilt = ExperienceReplay.from_log(p, **{k: v for k, v in cfg.items() if k not in spec})
    rebuilt.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    assert rebuilt.serialize(0) == buf.serialize(0)
    again = ExperienceReplay(**cfg)
    again.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    assert again.ingest(p) == len(buf)
    assert again.serialize(0) == buf.serialize(0)
    rebuilt._check()


def test_a_log_without_ends_without_a_step_keeps_kind_1(tmp_path):
    """A log whose buffer never ends an episode without a step holds only
    chunks of kind 1: readers of logs before kind 3 read it as before."""
    p = tmp_path / "plain.log"
    lg = ExperienceLog(p, chunk_bytes=300)
    buf = ExperienceReplay((3, 2), "uint8", (2,), "float32", capacity=None, log=lg)
    record_script(buf, np.random.default_rng(4), 200)
    lg.close()
    assert set(_chunk_kinds(p)) == {xlog.KIND_RECORDS}


def test_ends_without_a_step_merge(tmp_path):
    """Logs with ends without a step merge (kind 3 where an output chunk holds
    one, the same bytes whatever the threads), and the merged log rebuilds
    what ingesting each input does."""
    rng = np.random.default_rng(8)
    paths, bufs = [], []
    for k in range(3):
        p = tmp_path / ("in%d.log" % k)
        lg = ExperienceLog(p, source=k, level=k % 2, chunk_bytes=int(rng.integers(150, 900)))
        b = ExperienceReplay((3,), capacity=None, log=lg)
        end_script(b, rng, episodes=25)
        lg.close()
        paths.append(p)
        bufs.append(b)
    total = [sum(xlog.info(p)[k] for p in paths) for k in ("records", "ends")]
    for level in (0, 1):
        for cb in (60, 700, 1 << 20):
            blobs = []
            for threads in (0, 2):
                out = tmp_path / ("m%d_%d_%d.log" % (level, cb, threads))
                d = xlog.merge(paths, out, level=level, chunk_bytes=cb, threads=threads)
                assert [d["records"], d["ends"]] == total
                blobs.append(out.read_bytes())
            assert blobs[0] == blobs[1]
            assert xlog.KIND_NOSTEP in _chunk_kinds(out)
    merged = ExperienceReplay((3,), capacity=None)
    merged.ingest(out)
    assert len(merged) == sum(len(b) for b in bufs)
    assert merged.num_picks == sum(b.num_picks for b in bufs)
    ends = sorted((bool(e.terminated), [] if e.final_state is None else e.final_state.tolist(),
                   len(e.reward)) for e in (merged.episode(h) for h in merged._handles()))
    want = sorted((bool(e.terminated), [] if e.final_state is None else e.final_state.tolist(),
                   len(e.reward)) for b in bufs for e in (b.episode(h) for h in b._handles()))
    assert ends == want and all(merged.episode(h).ended for h in merged._handles())
    # the Python writer (the tests' second writer of the format) writes them too
    with xlog.open(paths[0]) as r:
        raws = list(r.raw_chunks())
        w = xlog._Writer(tmp_path / "py.log", r.schema, 1, [0])
    for raw in raws:
        w.write(raw)
    w.close(int(raws[-1].ts[-1]))
    got = [c.flags.tolist() for c in xlog.open(tmp_path / "py.log")]
    assert got == [r.fl.tolist() for r in raws]
    assert _chunk_kinds(tmp_path / "py.log") == _chunk_kinds(paths[0])


def test_readers_refuse_misplaced_no_step_records(tmp_path):
    """FLAG_NO_STEP in a chunk of kind 1, without FLAG_END, or without a
    final state or terminated flag (an end needs one), is refused by the
    reader and by the merge, with the CRCs right."""
    import log_fuzz as lf

    p = tmp_path / "e.log"
    lg = ExperienceLog(p, source=1, chunk_bytes=1 << 20)
    b = ExperienceReplay((3,), capacity=None, log=lg)
    h = b.record_many(None, np.zeros((2, 3), np.float32), [0, 1], [0.0, 0.0])
    b.end_episode(h, terminated=True)
    lg.close()
    blob = p.read_bytes()
    head, chunks, tail = lf.parse(blob)
    assert [c["kind"] for c in chunks] == [xlog.KIND_NOSTEP, xlog.KIND_END]
    n = chunks[0]["count"]

    def with_flag(v, kind=xlog.KIND_NOSTEP):
        h2, c2, t2 = lf.parse(blob)
        raw = bytearray(c2[0]["raw"])
        raw[28 * n + n - 1] = v
        c2[0]["raw"], c2[0]["kind"] = bytes(raw), kind
        return lf.serialize(h2, c2, t2)

    for bad in (with_flag(xlog.FLAG_END | xlog.FLAG_TERMINATED | xlog.FLAG_NO_STEP, 1),
                with_flag(xlog.FLAG_NO_STEP | xlog.FLAG_TERMINATED),
                with_flag(xlog.FLAG_NO_STEP | xlog.FLAG_END)):
        q = tmp_path / "bad.log"
        q.write_bytes(bad)
        with pytest.raises(ValueError):
            list(xlog.open(q))
        with pytest.raises(ValueError, match="flags|length|raw bytes"):
            xlog.merge([q], tmp_path / "out.log", progress=False)
        assert not (tmp_path / "out.log").exists()
    lf.check_input(with_flag(xlog.FLAG_END | xlog.FLAG_TERMINATED | xlog.FLAG_NO_STEP),
                   str(tmp_path))


def _raw_records(path):
    """(kinds, [(handles, positions, sources, flags, rows, finals)]) of a log:
    every byte of its records but the timestamps."""
    with xlog.open(path) as r:
        raws = [(x.h.tolist(), x.pos.tolist(), x.src.tolist(), x.fl.tolist(), x.rows.tobytes(),
                 x.fins.tobytes()) for x in r.raw_chunks()]
    return _chunk_kinds(path), raws


@pytest.mark.parametrize("level", [0, 1])
def test_a_standalone_end_writes_what_a_buffer_end_writes(tmp_path, level):
    """ExperienceLog.end_episode(h, pos, ...) logs the record that a buffer's
    end_episode logs (no row, FLAG_NO_STEP, kind 3): a standalone log that
    appends the buffer's steps and ends holds the same records, bytes but
    timestamps, and reads, merges and rebuilds the same."""
    a, b = tmp_path / "buf.log", tmp_path / "alone.log"
    la = ExperienceLog(a, source=4, level=level, chunk_bytes=500)
    buf = ExperienceReplay((3,), capacity=None, pick_len=2, seed=1, log=la)
    hs = end_script(buf, np.random.default_rng(21), episodes=20)
    la.close()
    with ExperienceLog(b, source=4, level=level, chunk_bytes=500, state_shape=(3,)) as lb:
        for h in hs:
            e = buf.episode(h)
            n = len(e.reward)
            with xlog.open(a) as r:  # how the buffer's log ended h: by a step or not
                fl = [int(f) for c in r for f, hh in zip(c.flags, c.handles) if hh == h][-1]
            stepped = not fl & xlog.FLAG_NO_STEP
            end = dict(final_state=e.final_state, terminated=bool(e.terminated))
            lb.append_many(h, 0, e.state, e.action, e.reward, **(end if stepped else {}))
            if not stepped:
                lb.end_episode(h, n, **end)
    assert _raw_records(a) == _raw_records(b)
    assert xlog.KIND_NOSTEP in _chunk_kinds(b)
    cfg = dict(capacity=None, pick_len=2, seed=1)
    assert (ExperienceReplay.from_log(a, **cfg).serialize(0)
            == ExperienceReplay.from_log(b, **cfg).serialize(0) == buf.serialize(0))
    for x in (a, b):
        xlog.merge([x], tmp_path / ("m_" + x.name), chunk_bytes=300, progress=False)
    assert _raw_records(tmp_path / "m_buf.log") == _raw_records(tmp_path / "m_alone.log")


def test_a_standalone_end_refuses_bad_input_and_writes_nothing(tmp_path):
    """Each bad argument of ExperienceLog.end_episode is a TypeError or
    ValueError that names it, says what was expected and what came; the log
    is left as it was (nothing written, nothing pending)."""
    p = tmp_path / "bad.log"
    lg = ExperienceLog(p, state_shape=(3,), state_dtype="float32", flush_interval=None)
    good = np.ones(3, np.float32)
    cases = [
        (TypeError, "^h: expected an int64 episode handle, got float",
         dict(h=1.0, pos=2, terminated=True)),
        (TypeError, "^h: expected an int64 episode handle, got NoneType",
         dict(h=None, pos=2, terminated=True)),
        (TypeError, "^pos: expected an int from 1 to", dict(h=1, pos="2", terminated=True)),
        (ValueError, "^pos: expected an int from 1 to .*, got 0", dict(h=1, pos=0, terminated=True)),
        (TypeError, "^terminated: expected a bool or an int, got NoneType",
         dict(h=1, pos=2, final_state=good, terminated=None)),
        (ValueError, r"^final_state: expected shape \(3,\), got \(2,\)",
         dict(h=1, pos=2, final_state=np.ones(2, np.float32))),
        (TypeError, "^final_state: expected float32 .*, got complex128",
         dict(h=1, pos=2, final_state=np.ones(3, complex))),
        (ValueError, "^final_state: expected a state, or terminated=True .*got None and "
         "terminated=False", dict(h=1, pos=2)),
        (ValueError, "^final_state: expected a state, or terminated=True",
         dict(h=1, pos=2, final_state=None, terminated=0)),
    ]
    for exc, msg, kw in cases:
        with pytest.raises(exc, match=msg):
            lg.end_episode(**kw)
    with pytest.raises(TypeError, match="end_episode"):
        lg.end_episode(1)  # pos is required: the log cannot know it
    assert lg.stats["backlog"] == 0
    lg.flush()
    assert lg.stats["records"] == 0 and lg.stats["file_bytes"] == p.stat().st_size
    lg.close()
    assert xlog.info(p)["records"] == 0 and list(xlog.open(p)) == []
    with pytest.raises(ValueError, match="^end_episode: the log is closed"):
        lg.end_episode(1, 2, terminated=True)
    with ExperienceLog(tmp_path / "no_layout.log") as bare:
        with pytest.raises(ValueError, match="^end_episode: the log has no record layout"):
            bare.end_episode(1, 2, terminated=True)


@pytest.mark.parametrize("level", [0, 1])
def test_records_count_steps_and_ends_count_ends_without_a_step(tmp_path, capsys, level):
    """A log's "records" are its steps: the ends without a step (records with
    FLAG_NO_STEP, no row) are counted apart as "ends", alike by the writer's
    stats, info, merge and the command line (text and JSON)."""
    p = tmp_path / "c.log"
    lg = ExperienceLog(p, source=3, level=level, chunk_bytes=400)
    buf = ExperienceReplay((3,), capacity=None, log=lg)
    end_script(buf, np.random.default_rng(5), episodes=30)
    lg.close()
    chunks = list(xlog.open(p))
    fl = np.concatenate([c.flags for c in chunks])
    ends = int(np.count_nonzero(fl & xlog.FLAG_NO_STEP))
    steps = len(fl) - ends
    assert steps == len(buf) and ends == sum(1 for e in range(30) if e % 4 != 3)
    assert (lg.stats["records"], lg.stats["ends"]) == (steps, ends)
    d = xlog.info(p)
    assert (d["records"], d["ends"], d["chunks"]) == (steps, ends, len(chunks))
    m = xlog.merge([p, p], tmp_path / "m.log", chunk_bytes=700, progress=False)
    assert (m["records"], m["ends"]) == (2 * steps, 2 * ends)
    assert xlog.main(["info", str(p)]) == 0
    assert ("records %d (steps), %d ends without a step, in %d chunks"
            % (steps, ends, len(chunks))) in capsys.readouterr().out
    assert xlog.main(["merge", "-o", str(tmp_path / "m2.log"), str(p)]) == 0
    assert ("%d records (steps), %d ends without a step" % (steps, ends)
            in capsys.readouterr().out)
    assert xlog.main(["info", "--json", str(p)]) == 0
    js = __import__("json").loads(capsys.readouterr().out)
    assert (js["records"], js["ends"]) == (steps, ends)
    # a standalone log counts its own ends the same way
    q = tmp_path / "alone.log"
    with ExperienceLog(q, level=level, state_shape=(3,)) as alone:
        alone.append_many(0, 0, np.zeros((2, 3), np.float32), [0, 1], [0.0, 0.0])
        alone.end_episode(0, 2, terminated=True)
        alone.flush()
        assert (alone.stats["records"], alone.stats["ends"]) == (2, 1)
    assert (xlog.info(q)["records"], xlog.info(q)["ends"]) == (2, 1)


def test_info_checks_the_flags_it_counts(tmp_path):
    """info reads the flags column of a chunk of kind 3 (only that part of
    its body) and refuses flags that the reader refuses, naming the file."""
    import log_fuzz as lf

    p = tmp_path / "e.log"
    lg = ExperienceLog(p, source=1, level=1)
    b = ExperienceReplay((3,), capacity=None, log=lg)
    h = b.record_many(None, np.zeros((2, 3), np.float32), [0, 1], [0.0, 0.0])
    b.end_episode(h, terminated=True)
    lg.close()
    head, chunks, tail = lf.parse(p.read_bytes())
    n = chunks[0]["count"]
    raw = bytearray(chunks[0]["raw"])
    raw[28 * n + n - 1] = xlog.FLAG_NO_STEP | xlog.FLAG_END  # no how: refused
    chunks[0]["raw"] = bytes(raw)
    q = tmp_path / "bad.log"
    q.write_bytes(lf.serialize(head, chunks, tail))
    with pytest.raises(ValueError, match="bad.log.*record flags"):
        xlog.info(q)


def test_a_file_another_log_is_writing_is_refused_not_emptied(tmp_path):
    """Two logs on one file: the second (overwrite=True, which empties a
    file it may replace) is refused with an OSError naming the path, and the
    first's file keeps every byte; once the first is closed the file can be
    replaced. The lock is the file's (flock), so it holds across processes
    too."""
    p = tmp_path / "x.log"
    first = ExperienceLog(p, state_shape=(2,))
    first.append(1, 0, [0.0, 0.0], 0, 0.0)
    first.flush()
    size = p.stat().st_size
    with pytest.raises(OSError, match="path: expected a file no other log is writing") as e:
        ExperienceLog(p, state_shape=(2,), overwrite=True)
    assert e.value.errno == errno.EBUSY
    code = ("import sys; from exreplay import ExperienceLog\n"
            "try:\n    ExperienceLog(sys.argv[1], state_shape=(2,), overwrite=True)\n"
            "except OSError as e:\n    print(e.errno)\n")
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == str(errno.EBUSY)
    assert p.stat().st_size == size
    first.append(1, 1, [1.0, 1.0], 0, 0.0)
    first.close()
    assert xlog.info(p)["records"] == 2
    ExperienceLog(p, state_shape=(2,), overwrite=True).close()
    assert xlog.info(p)["records"] == 0


def test_the_path_is_asked_for_once(tmp_path):
    """The constructor calls the path's __fspath__ once and opens, names
    (.path) and, on a failure, removes the file it named: it called it three
    times, so a path object that answered differently (or raised on the
    third call) left its first file behind under another .path."""
    calls = []

    class Moving:
        def __fspath__(self):
            calls.append(1)
            return str(tmp_path / f"p{len(calls)}.log")

    lg = ExperienceLog(Moving(), state_shape=(2,))
    assert len(calls) == 1 and lg.path == str(tmp_path / "p1.log")
    lg.close()
    assert sorted(os.listdir(tmp_path)) == ["p1.log"]


def _chunk_bytes_of(path):
    """(header bytes, [each records chunk's bytes], end marker bytes) of a log."""
    data = open(path, "rb").read()
    with xlog.open(path) as r:
        spans = [(off, off + xlog.HDR + h.body_len + xlog.TRL) for off, h, _ in r._headers(False)]
        hl = r.schema.header_len
    return data[:hl], [data[a:b] for a, b in spans], data[spans[-1][1]:]


def test_tail_checks_the_chunks_it_reads_as_the_other_readers_do(tmp_path):
    """tail walks the chunks from the end; it returned the records of a log
    whose chunks were out of order, or held a chunk after the end marker,
    where every forward reader raises. Now it raises the same ValueError."""
    p = tmp_path / "a.log"
    lg = ExperienceLog(p, state_shape=(2,))
    for k in range(3):
        lg.append(1, k, [k, k], 0, 0.0)
        lg.flush()
    lg.close()
    head, chunks, end = _chunk_bytes_of(p)
    assert len(chunks) == 3 and len(xlog.tail(p, 10).timestamps) == 3
    cases = {
        "swapped.log": (head + chunks[0] + chunks[2] + chunks[1] + end,
                        "chunk starts before the previous one ends"),
        "after_end.log": (head + chunks[0] + chunks[1] + end + chunks[2],
                          "data after the end marker"),
        "two_ends.log": (head + chunks[0] + end + chunks[1] + chunks[2] + end,
                         "data after the end marker"),
        # bytes that are no whole chunk after the end marker: tail took them
        # for a torn tail and skipped them
        "junk_after_end.log": (head + chunks[0] + chunks[1] + chunks[2] + end + b"0123456789",
                               "data after the end marker"),
    }
    for name, (data, why) in cases.items():
        q = tmp_path / name
        q.write_bytes(data)
        with pytest.raises(ValueError) as forward:
            xlog.info(q)
        with pytest.raises(ValueError) as back:
            xlog.tail(q, 10)
        assert why in str(forward.value) and str(back.value) == str(forward.value), name


def test_a_log_refuses_shapes_its_readers_do_not_take(tmp_path):
    """The writer took shapes of up to 62 dimensions (the buffer's limit),
    which every reader then refused ("schema state shape ..."): a log's
    shapes have at most 30, checked before the file is opened or the log
    attached; 30 round-trip."""
    with pytest.raises(ValueError, match=r"^state_shape: expected at most 30 dimensions in a log "
                                         r"\(what its readers take\), got 31$"):
        ExperienceLog(tmp_path / "a.log", state_shape=(1,) * 31)
    with pytest.raises(ValueError, match=r"^action_shape: .* got 31$"):
        ExperienceLog(tmp_path / "b.log", state_shape=(2,), action_shape=(1,) * 31)
    assert os.listdir(tmp_path) == []
    buf = ExperienceReplay((1,) * 33, capacity=10)
    lg = ExperienceLog(tmp_path / "c.log")
    with pytest.raises(ValueError, match=r"^state_shape: .* got 33$"):
        buf.attach_log(lg)
    assert buf.log is None
    named = ExperienceReplay(state_spec={"x": ((1,) * 31, "f4")}, capacity=10)
    with pytest.raises(ValueError, match=r"^state_spec\['x'\]: expected at most 30 dimensions"):
        named.attach_log(lg)
    lg.close()
    ok = ExperienceLog(tmp_path / "d.log", state_shape=(1,) * 30)
    ok.append(1, 0, np.ones((1,) * 30), 0, 0.0)
    ok.close()
    assert xlog.tail(tmp_path / "d.log", 1).states.shape == (1,) + (1,) * 30


def test_a_schema_dtype_numpy_cannot_parse_is_the_readers_value_error(tmp_path):
    """A schema dtype such as "<f4(2," made NumPy raise its own bare
    ValueError ("format number 1 ... is not recognized"), naming neither the
    file nor the offset; now it is the reader's "not a valid experience log"."""
    import json
    import struct
    import zlib as _zlib

    blob = json.dumps({"state": {"dtype": "<f4(2,", "shape": [2]},
                       "action": {"dtype": "<i8", "shape": []},
                       "reward": {"dtype": "<f4", "shape": []}}).encode()
    head = xlog.FILE_MAGIC + struct.pack("<IIQQQ", 1, 40 + 4 + len(blob) + 4, 8, 8, 4)
    head += struct.pack("<I", len(blob)) + blob
    p = tmp_path / "bad.log"
    p.write_bytes(head + struct.pack("<I", _zlib.crc32(head)))
    for read in (xlog.info, lambda q: xlog.tail(q, 1)):
        with pytest.raises(ValueError, match=r"not a valid experience log at byte 0: schema state "
                                             r"dtype '<f4\(2,'"):
            read(p)
