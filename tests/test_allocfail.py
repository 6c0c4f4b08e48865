"""Allocation-failure testing, as SQLite does it (`make allocfail`).

A test build of the extension (tests/allocfail/: the product's sources plus
a malloc family, wrapped at link time, that fails the Nth call once armed)
runs each public operation with its 1st allocation failing, then its 2nd,
and so on, until the operation completes without reaching the Nth. Every
failure must be a MemoryError with a message, and must change nothing: the
buffer serializes to the same bytes as before and passes _check(); save
leaves the old file and no temp file; load and unserialize give no buffer.

Only the extension's own allocations (src/core, src/py) fail; CPython's,
NumPy's and zlib's internal ones are in other libraries and are not wrapped.
`make allocfail` builds the variant and sets EXREPLAY_ALLOCFAIL_SO.
"""

import ctypes
import importlib.machinery
import importlib.util
import os

import numpy as np
import pytest

SO = os.environ.get("EXREPLAY_ALLOCFAIL_SO")
pytestmark = pytest.mark.skipif(not SO, reason="needs the allocation-failure build: make allocfail")

MAX_N = 5000  # a bound on the allocations of one operation, as a hang guard
COUNTS = {}  # operation -> most allocations seen in one call (printed at the end)


@pytest.fixture(scope="module")
def core():
    loader = importlib.machinery.ExtensionFileLoader("exreplay_allocfail._core", SO)
    spec = importlib.util.spec_from_file_location("exreplay_allocfail._core", SO, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lib = ctypes.CDLL(SO)
    lib.exr_allocfail_arm.argtypes = [ctypes.c_long]
    lib.exr_allocfail_disarm.restype = ctypes.c_long
    lib.exr_allocfail_calls.restype = ctypes.c_long
    mod.lib = lib
    return mod


STATE = (3,)


def populated(core, eviction="fifo", capacity=40, prioritized=True, pick_len=2):
    b = core.ExperienceReplay(STATE, state_dtype="float32", capacity=capacity, pick_len=pick_len,
                              eviction=eviction, seed=5)
    sels = [b.new_pick_selector(core.uniform)]
    if prioritized:
        sels.append(b.new_pick_selector(core.rank, alpha=0.7, beta=0.5))
        sels.append(b.new_pick_selector(core.prioritized, alpha=0.6, beta=0.4))
    rng = np.random.default_rng(1)
    for e in range(4):
        T = 5 + e
        h = b.record_many(None, rng.standard_normal((T,) + STATE, dtype=np.float32),
                          np.arange(T), np.ones(T, np.float32), terminated=e % 2 == 0)
    b.record(h, np.zeros(STATE, np.float32), 1, 0.5)  # an open episode
    batch = b.get_batch(4, sels[-1])
    if prioritized:
        b.set_priority(sels[-1], batch.pick_epi, batch.pick_pos, np.arange(1.0, 5.0))
    b._check()
    return b, sels, h


def run_every_n(core, make, op, check_unchanged=True, what="", check_after=None):
    """op(state) with allocation n failing, for n = 1, 2, ... Returns the
    number of allocations the operation makes. check_after(state, err,
    fired),
    if given, checks each run once the allocator is disarmed."""
    lib = core.lib
    for n in range(1, MAX_N):
        state = make()
        buf = state[0] if isinstance(state, tuple) else None
        before = buf.serialize(0) if (buf is not None and check_unchanged) else None
        lib.exr_allocfail_arm(n)
        err = None
        try:
            op(state)
        except MemoryError as e:
            err = e
        finally:
            fired = lib.exr_allocfail_disarm()
        if check_after is not None:
            check_after(state, err, fired)
        if not fired:
            assert err is None, f"{what}: MemoryError with no failed allocation: {err}"
            COUNTS[what] = max(COUNTS.get(what, 0), n - 1)
            return n - 1
        if err is None:
            # the failure was absorbed (a cache, a fallback path): the
            # operation must then have done its work correctly
            if buf is not None:
                buf._check()
            continue
        msg = str(err)
        assert "out of memory" in msg and not msg.startswith(":"), f"{what}: n={n}: {msg!r}"
        if before is not None:
            after = buf.serialize(0)
            assert after == before, f"{what}: allocation {n} failed and the buffer changed"
            buf._check()
    raise AssertionError(f"{what}: more than {MAX_N} allocations")


CONFIGS = [
    pytest.param(dict(eviction="fifo"), id="fifo"),
    pytest.param(dict(eviction="second_chance"), id="second_chance"),
    pytest.param(dict(eviction="fifo", capacity=None, prioritized=False), id="unbounded-uniform"),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_record(core, cfg):
    s = np.ones(STATE, np.float32)
    # into the open episode, a new one, and one that ends (evicting: capacity 40)
    for kw in ({}, {"terminated": True}, {"final_state": s, "priority": 2.0}):
        n = run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].record(st[2], s, 1, 0.5, **kw),
                        what=f"record {kw}")
        n_new = run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].record(None, s, 1, 0.5, **kw),
                            what=f"record(None) {kw}")
        assert n + n_new > 0


@pytest.mark.parametrize("cfg", CONFIGS)
def test_end_episode(core, cfg):
    """Ending the open episode without a step: the final state's copy and
    the room for its new picks are allocated before anything changes (the
    last segment's cut after it is best effort)."""
    s = np.ones(STATE, np.float32)
    for kw in ({"final_state": s}, {"terminated": True}, {"final_state": s, "terminated": True}):
        run_every_n(core, lambda: populated(core, **cfg),
                    lambda st: st[0].end_episode(st[2], **kw), what=f"end_episode {sorted(kw)}")

    def long_open():  # picks of pick_len 2 wait for the end, past the table's room
        st = populated(core, **cfg)
        st[0].record_many(st[2], np.ones((20,) + STATE, np.float32), np.arange(20),
                          np.ones(20, np.float32), priorities=np.linspace(1, 2, 20))
        return st

    run_every_n(core, long_open, lambda st: st[0].end_episode(st[2], final_state=s),
                what="end_episode long")


@pytest.mark.parametrize("cfg", CONFIGS)
def test_new_episode(core, cfg):
    """Under the lock (the first one of a buffer, which also makes room for
    reservations: best effort) and reserved without it (the ones after)."""
    def reserving():
        st = populated(core, **cfg)
        st[0].new_episode()
        return st

    run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].new_episode(),
                what="new_episode (locked)")
    run_every_n(core, reserving, lambda st: st[0].new_episode(), what="new_episode (reserved)")
    # a record call failing after a reservation: the reserved episode stays
    s = np.ones(STATE, np.float32)

    def into_reserved(st):
        h = st[0].new_episode()
        st[0].record_many(h, np.stack([s] * 5), np.ones(5, np.int64), np.ones(5, np.float32))

    def after(st, err, fired):
        st[0]._check()
        if err is not None:
            last = int(st[0]._handles()[-1])
            assert len(st[0].episode(last).state) == 0

    run_every_n(core, reserving, into_reserved, check_unchanged=False, check_after=after,
                what="new_episode+record_many")


EVICTS_ITSELF = set()


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("T", [1, 7, 40, 100])  # 100: over capacity, several episodes
def test_record_many(core, cfg, T):
    """Every allocation of a record_many call is made before anything
    changes, also when the rollout evicts the episode it records into and
    goes on in new ones: a failure leaves the buffer exactly as it was."""
    rng = np.random.default_rng(T)
    st_ = rng.standard_normal((T,) + STATE, dtype=np.float32)
    pr = np.linspace(0.5, 3.0, T)
    acts, rews = np.arange(T), np.ones(T, np.float32)

    def evicts_itself(into_open, **kw):
        b, _, h = populated(core, **cfg)
        n0 = len(b.episode(h).action) if into_open else 0
        out = b.record_many(h if into_open else None, st_, acts, rews, **kw)
        return out not in b._handles() or len(b.episode(out).action) != n0 + T

    for into_open, kw in ((True, {"priorities": pr}), (False, {"terminated": True})):
        if evicts_itself(into_open, **kw):
            EVICTS_ITSELF.add((cfg.get("eviction"), T, into_open))
        run_every_n(core, lambda: populated(core, **cfg),
                    lambda st: st[0].record_many(st[2] if into_open else None, st_, acts, rews, **kw),
                    what=f"record_many T={T} into_open={into_open}")


def test_record_many_covered_self_eviction():
    """The cases above include rollouts that evict their own episode, under
    both policies (else the all-or-nothing promise would go untested)."""
    if not EVICTS_ITSELF:
        pytest.skip("runs after test_record_many")
    assert {e for e, _, _ in EVICTS_ITSELF} == {"fifo", "second_chance"}, EVICTS_ITSELF


@pytest.mark.parametrize("cfg", CONFIGS)
def test_get_batch(core, cfg):
    for k in (0, -1):
        run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].get_batch(300, st[1][k]),
                    what="get_batch")


@pytest.mark.parametrize("cfg", CONFIGS[:2])
@pytest.mark.parametrize("B", [8, 300])  # 300: beyond the scratch kept on the stack
@pytest.mark.parametrize("k", [1, 2])  # the rank and the prioritized selector
def test_set_priority(core, cfg, B, k):
    def make():
        b, sels, h = populated(core, **cfg)
        return b, sels, b.get_batch(B, sels[0])  # the picks to name, drawn unarmed

    def by_handles(st):
        b, sels, batch = st
        b.set_priority(sels[k], batch.pick_epi, batch.pick_pos, np.linspace(0.1, 9.0, B))

    def by_batch(st):
        b, sels, batch = st
        b.set_priority(sels[k], batch, np.linspace(0.1, 9.0, B))

    assert run_every_n(core, make, by_handles, what="set_priority") >= 0
    assert run_every_n(core, make, by_batch, what="set_priority(batch)") >= 0


@pytest.mark.parametrize("cfg", CONFIGS)
def test_new_pick_selector(core, cfg):
    run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].new_pick_selector(core.prioritized),
                what="new_pick_selector(prioritized)")
    run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].new_pick_selector(core.uniform),
                what="new_pick_selector(uniform)")
    run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].new_pick_selector(core.rank),
                what="new_pick_selector(rank)")


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("level", [0, 6])
def test_serialize(core, cfg, level):
    run_every_n(core, lambda: populated(core, **cfg), lambda st: st[0].serialize(level), what="serialize")


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("level", [0, 6])
def test_unserialize(core, cfg, level):
    data = populated(core, **cfg)[0].serialize(level)

    def op(_):
        r = core.ExperienceReplay.unserialize(data)
        r._check()

    assert run_every_n(core, lambda: None, op, what="unserialize") > 0


@pytest.mark.parametrize("cfg", CONFIGS)
def test_save(core, cfg, tmp_path):
    path = tmp_path / "r.exr"
    old = populated(core, eviction="fifo", capacity=None, prioritized=False)[0]
    old.save(path)
    old_bytes = path.read_bytes()

    def op(st):
        try:
            st[0].save(path, level=1)
        except MemoryError:
            assert path.read_bytes() == old_bytes
            assert os.listdir(tmp_path) == ["r.exr"]
            raise
        path.write_bytes(old_bytes)

    run_every_n(core, lambda: populated(core, **cfg), op, what="save")


@pytest.mark.parametrize("cfg", CONFIGS)
def test_load(core, cfg, tmp_path):
    path = tmp_path / "r.exr"
    populated(core, **cfg)[0].save(path, level=6)

    def op(_):
        core.ExperienceReplay.load(path)._check()

    assert run_every_n(core, lambda: None, op, what="load") > 0


# ---- the experience log ----------------------------------------------------


def _log(core, path, **kw):
    return core.ExperienceLog(str(path), state_shape=STATE, state_dtype="float32",
                              flush_interval=None, **kw)


def _log_actions(path):
    """The actions a log file holds, read back by the package's reader."""
    import exreplay.log as xlog

    with xlog.open(path) as r:
        return [int(a) for c in r for a in c.actions]


def _steps(T, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((T,) + STATE, dtype=np.float32), np.arange(100, 100 + T),
            np.ones(T, np.float32))


def test_log_new(core, tmp_path):
    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))

    def make():
        return (None, next(paths))

    def op(st):
        _log(core, st[1]).close()

    def after(st, err, fired):
        if err is not None:
            assert not st[1].exists(), "a log that failed to open left its file"
        else:
            assert _log_actions(st[1]) == []

    assert run_every_n(core, make, op, what="log_new", check_after=after) > 0


def test_log_append_many(core, tmp_path):
    """A standalone append_many either logs all its steps or none."""
    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))
    S, A, R = _steps(300)  # more than the open chunk has room for

    def make():
        path = next(paths)
        lg = _log(core, path)
        lg.append_many(0, 0, S[:3], A[:3], R[:3])
        return (None, lg, path)

    def op(st):
        st[1].append_many(0, 3, S, A, R)

    def after(st, err, fired):
        st[1].close()
        want = [int(a) for a in A[:3]] + ([] if err is not None else [int(a) for a in A])
        assert _log_actions(st[2]) == want

    assert run_every_n(core, make, op, what="log_append_many", check_after=after) > 0


def test_log_end_episode(core, tmp_path):
    """A standalone end without a step is logged whole or not at all: its
    record with its final state, or nothing (the steps before it stay)."""
    import exreplay.log as xlog

    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))
    S, A, R = _steps(3)

    def make():
        path = next(paths)
        lg = _log(core, path)
        lg.append_many(0, 0, S, A, R)
        return (None, lg, path)

    def op(st):
        st[1].end_episode(0, 3, final_state=S[0], terminated=True)

    def after(st, err, fired):
        st[1].close()
        with xlog.open(st[2]) as r:
            cs = list(r)
        flags = [int(f) for c in cs for f in c.flags]
        fins = [c.final_states for c in cs if len(c.final_states)]
        assert _log_actions(st[2])[:3] == [int(a) for a in A]
        if err is not None:
            assert flags == [0, 0, 0] and not fins
        else:
            assert flags == [0, 0, 0, xlog.FLAG_END | xlog.FLAG_TERMINATED | xlog.FLAG_FINAL
                             | xlog.FLAG_NO_STEP]
            assert np.array_equal(fins[0][0], S[0])

    assert run_every_n(core, make, op, what="log_end_episode", check_after=after) > 0


def test_log_merge(core, tmp_path, monkeypatch):
    """The merge's C core (src/core/log_merge.c) failing to allocate, on
    the calling thread (threads=0, so that the Nth allocation is the same
    one every time): MemoryError, and no output file is left."""
    import exreplay
    import exreplay.log as xlog

    ins = []
    for k in range(3):
        p = tmp_path / f"in{k}.xlog"
        lg = _log(core, p, source=k, chunk_bytes=200)
        S, A, R = _steps(30, seed=k)
        for t in range(0, 30, 5):
            lg.append_many(k, t, S[t:t + 5], A[t:t + 5], R[t:t + 5],
                           final_state=S[t] if t % 10 == 0 else None)
        lg.close()
        ins.append(p)
    outs = iter(tmp_path / f"o{i}.xlog" for i in range(MAX_N))
    monkeypatch.setattr(exreplay, "_core", core)

    def make():
        return (None, next(outs))

    def op(st):
        xlog.merge(ins, st[1], chunk_bytes=300, threads=0, progress=False)

    def after(st, err, fired):
        if err is not None:
            assert not st[1].exists(), "a merge that failed left its output"
        else:
            assert len(_log_actions(st[1])) == 90

    assert run_every_n(core, make, op, what="log_merge", check_after=after) > 0


def test_log_flush(core, tmp_path):
    """The writer thread failing to allocate: flush raises MemoryError, the
    chunk it was writing is lost, the file stays readable (what is in it is
    whole) and every later flush and close says so."""
    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))
    S, A, R = _steps(5)

    def make():
        path = next(paths)
        lg = _log(core, path, level=6)
        lg.append_many(0, 0, S, A, R)
        return (None, lg, path)

    def after(st, err, fired):
        lg, path = st[1], st[2]
        if err is None:
            lg.close()
            assert _log_actions(path) == [int(a) for a in A]
            return
        assert lg.stats["errno"] != 0
        with pytest.raises(MemoryError):
            lg.close()
        assert _log_actions(path) == []

    assert run_every_n(core, make, lambda st: st[1].flush(), what="log_flush", check_after=after) > 0


@pytest.mark.parametrize("cfg", CONFIGS[:2])
def test_log_attached_record_many(core, cfg, tmp_path):
    """Recording into a buffer with a log attached: a failure in the
    buffer's part leaves buffer and log as they were; the log's own part
    cannot fail the record (it already happened), so a step it cannot
    take is counted in stats["dropped"] and the rest is logged."""
    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))
    S, A, R = _steps(7)

    def make():
        b, sels, h = populated(core, **cfg)
        path = next(paths)
        lg = _log(core, path)
        b.attach_log(lg)
        b.record(h, S[0], 99, 0.0)
        return (b, lg, path, h)

    def op(st):
        st[0].record_many(st[3], S, A, R)

    def after(st, err, fired):
        b, lg, path = st[0], st[1], st[2]
        dropped = lg.stats["dropped"]
        lg.close()
        got = _log_actions(path)
        if err is not None:
            assert dropped == 0 and got == [99]
        else:
            assert got[0] == 99 and len(got) == 1 + 7 - dropped
            assert dropped == 0 or fired

    assert run_every_n(core, make, op, what="log_record_many", check_after=after) > 0


def test_log_attached_end_of_an_evicted_episode(core, tmp_path):
    """end_episode on an episode evicted while open, with a log attached:
    the buffer does not change and the call cannot fail (it returns False);
    the log's part either logs the end, at the step count, or counts it in
    stats["dropped"]."""
    import exreplay.log as xlog

    paths = iter(tmp_path / f"{i}.xlog" for i in range(MAX_N))
    S, A, R = _steps(6)

    def make():
        b = core.ExperienceReplay(STATE, state_dtype="float32", capacity=4, pick_len=1, seed=5)
        path = next(paths)
        lg = _log(core, path)
        b.attach_log(lg)
        h = b.record_many(None, S[:3], A[:3], R[:3])
        b.record_many(None, S[3:], A[3:], R[3:])  # evicts h
        return (b, lg, path, h)

    def op(st):
        assert st[0].end_episode(st[3], final_state=S[5]) is False

    def after(st, err, fired):
        dropped = st[1].stats["dropped"]
        st[1].close()
        with xlog.open(st[2]) as r:
            ends = [(int(c.handles[i]), int(c.positions[i])) for c in r
                    for i in range(len(c.flags)) if c.flags[i] & xlog.FLAG_NO_STEP]
        assert err is None and ends == ([] if dropped else [(st[3], 3)])
        assert dropped == 0 or fired

    assert run_every_n(core, make, op, what="log_end_evicted", check_after=after) > 0


# ---- named fields and extras ------------------------------------------------

FSPEC = {"img": ((2, 3), "uint8"), "vec": ((2,), "float32")}
XSPEC = {"h": ((4,), "float32")}


def populated_fields(core):
    """A buffer of named state fields and extras (docs/api.md)."""
    b = core.ExperienceReplay(state_spec=FSPEC, extras_spec=XSPEC, capacity=30, pick_len=2, seed=5)
    sels = [b.new_pick_selector(core.uniform), b.new_pick_selector(core.prioritized)]
    h = None
    for e in range(4):
        T = 5 + e
        h = b.record_many(None, _fields(T), np.arange(T), np.ones(T, np.float32),
                          terminated=e % 2 == 0, extras={"h": np.ones((T, 4), np.float32)})
    b._check()
    return b, sels, h


def _fields(T):
    return {"img": np.full((T, 2, 3), T, np.uint8), "vec": np.full((T, 2), T, np.float32)}


@pytest.mark.parametrize("T", [1, 40])
def test_fields(core, T):
    one = {k: v[0] for k, v in _fields(1).items()}
    x1 = {"h": np.zeros(4, np.float32)}
    run_every_n(core, lambda: populated_fields(core),
                lambda st: st[0].record(st[2], one, 1, 0.5, final_state=one, extras=x1),
                what="record fields")
    # T = 40 > capacity 30: the rollout evicts its own episode, all or nothing too
    run_every_n(core, lambda: populated_fields(core),
                lambda st: st[0].record_many(None, _fields(T), np.arange(T), np.ones(T),
                                             extras={"h": np.ones((T, 4))}),
                what=f"record_many fields T={T}")
    run_every_n(core, lambda: populated_fields(core), lambda st: st[0].get_batch(300, st[1][1]),
                what="get_batch fields")
    run_every_n(core, lambda: populated_fields(core), lambda st: st[0].episode(st[0]._handles()[-1]),
                what="episode fields")
    data = populated_fields(core)[0].serialize(6)
    run_every_n(core, lambda: None, lambda _: core.ExperienceReplay.unserialize(data)._check(),
                what="unserialize fields")


def test_every_operation_was_failed_somewhere(core):
    """Runs last (file order): each public operation reached at least one
    allocation, so each was really run with failures injected."""
    print("\nallocations per call (most seen):", dict(sorted(COUNTS.items())))
    for op in ("record", "record_many", "new_episode", "end_episode", "get_batch", "set_priority",
               "new_pick_selector",
               "serialize", "unserialize", "save", "load", "log_new", "log_append_many",
               "log_end_episode", "log_flush", "log_record_many"):
        assert any(k.split(" ")[0].split("(")[0] == op and v > 0 for k, v in COUNTS.items()), op
