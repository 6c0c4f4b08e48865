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


def run_every_n(core, make, op, check_unchanged=True, what="", allowed=None):
    """op(state) with allocation n failing, for n = 1, 2, ... Returns the
    number of allocations the operation makes. allowed: the serializations
    a failed call may leave besides the one before it (record_many keeps
    the steps recorded before the failing one, as docs/api.md says)."""
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
            ok = after == before or (allowed is not None and after in allowed)
            assert ok, f"{what}: allocation {n} failed and the buffer changed"
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
@pytest.mark.parametrize("T", [1, 7, 40])
def test_record_many(core, cfg, T):
    rng = np.random.default_rng(T)
    st_ = rng.standard_normal((T,) + STATE, dtype=np.float32)
    pr = np.linspace(0.5, 3.0, T)
    acts, rews = np.arange(T), np.ones(T, np.float32)

    def prefixes(into_open, **kw):
        """serialize() after the first k < T steps, for each k: what a
        record_many that fails at step k + 1 leaves (docs/api.md)."""
        out = set()
        for k in range(1, T):
            b, _, h = populated(core, **cfg)
            extra = {"priorities": pr[:k]} if "priorities" in kw else {}
            b.record_many(h if into_open else None, st_[:k], acts[:k], rews[:k], **extra)
            out.add(b.serialize(0))
        return out

    def evicts_itself(into_open, **kw):
        """Whether the call, run without a failure, evicts the episode it
        records into and goes on in a new one (docs/api.md): only then may
        a failure leave the steps recorded before it. Otherwise every
        allocation is made before anything changes, and a failure must
        leave the buffer exactly as it was."""
        b, _, h = populated(core, **cfg)
        n0 = len(b.episode(h).action) if into_open else 0
        out = b.record_many(h if into_open else None, st_, acts, rews, **kw)
        return out not in b._handles() or len(b.episode(out).action) != n0 + T

    own = evicts_itself(True, priorities=pr)
    run_every_n(core, lambda: populated(core, **cfg),
                lambda st: st[0].record_many(st[2], st_, acts, rews, priorities=pr),
                what=f"record_many T={T}",
                allowed=prefixes(True, priorities=True) if own else None)
    own = evicts_itself(False, terminated=True)
    run_every_n(core, lambda: populated(core, **cfg),
                lambda st: st[0].record_many(None, st_, acts, rews, terminated=True),
                what=f"record_many(None) T={T}", allowed=prefixes(False) if own else None)


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
    if T == 40:  # a rollout that evicts its own episode may keep its first steps
        run_every_n(core, lambda: populated_fields(core),
                    lambda st: st[0].record_many(None, _fields(T), np.arange(T), np.ones(T),
                                                 extras={"h": np.ones((T, 4))}),
                    what=f"record_many fields T={T}", check_unchanged=False)
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
    for op in ("record", "record_many", "get_batch", "set_priority", "new_pick_selector",
               "serialize", "unserialize", "save", "load"):
        assert any(k.split(" ")[0].split("(")[0] == op and v > 0 for k, v in COUNTS.items()), op
