"""get_batch without out= refills the arrays of a dropped batch (the spare
arrays, docs/design.md "Batch memory"): a batch, or any array, view or
export of one still held, is never written by a later call; a dropped one
is, whatever was done to it."""
import threading
import weakref

import numpy as np
import pytest

import exreplay

EP = 50


def _buffer(pick_len=1, kind=0):
    b = exreplay.ExperienceReplay((4,), state_dtype=np.float32, capacity=20 * EP, pick_len=pick_len, seed=3)
    ps = b.new_pick_selector(kind)
    for e in range(20):
        st = np.zeros((EP, 4), np.float32)
        st[:, 0] = e
        st[:, 1] = np.arange(EP)
        pr = np.full(EP, 1.0) if kind else None
        b.record_many(None, st, np.arange(EP, dtype=np.int64), np.ones(EP, np.float32),
                      final_state=st[0], terminated=False, priorities=pr)
    return b, ps


def _consistent(b, batch):
    """Each pick's rows are the ones its pick_epi/pick_pos name."""
    for i in range(len(batch.pick_epi)):
        h, p = int(batch.pick_epi[i]), int(batch.pick_pos[i])
        ep = b.episode(h)
        n = int(batch.seq_len[i])
        assert np.array_equal(batch.state[i, :n], ep.state[p:p + n])
        assert np.array_equal(batch.action[i, :n], ep.action[p:p + n])
    assert batch.extras == {}


FIELDS = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next", "pick_epi",
          "pick_pos", "weight", "pick_index")


def _snapshot(batch):
    return {f: np.array(getattr(batch, f), copy=True) for f in FIELDS}


def _same(batch, snap):
    return all(np.array_equal(getattr(batch, f), snap[f]) for f in FIELDS)


@pytest.mark.parametrize("hold", ["batch", "state", "view", "memoryview", "reward"])
def test_held_never_written(hold):
    b, ps = _buffer()
    x = b.get_batch(16, ps)
    snap = _snapshot(x)
    held = {"batch": x, "state": x.state, "view": x.weight[2:], "memoryview": memoryview(x.pick_pos),
            "reward": x.reward}[hold]
    keep_state = np.array(x.state, copy=True)
    if hold != "batch":
        del x
    for _ in range(20):
        y = b.get_batch(16, ps)
        _consistent(b, y)
        del y
    if hold == "batch":
        assert _same(held, snap)
    elif hold == "state":
        assert np.array_equal(held, keep_state)
    elif hold == "view":
        assert np.array_equal(held, snap['weight'][2:])
    elif hold == "memoryview":
        assert np.array_equal(np.asarray(held), snap['pick_pos'])
    else:
        assert np.array_equal(held, snap['reward'])


def test_dropped_is_refilled():
    b, ps = _buffer()
    ids = set()
    for _ in range(10):
        batch = b.get_batch(16, ps)  # the one before is bound until this returns
        ids.add(id(batch.state))
        _consistent(b, batch)
    assert len(ids) <= 3  # two sets alternate once the first is dropped


def test_changed_in_place_then_dropped():
    b, ps = _buffer()
    x = b.get_batch(8, ps)
    x.state.shape = (8, 4, 1)
    x.extras["junk"] = 1
    del x
    y = b.get_batch(8, ps)
    z = b.get_batch(8, ps)
    r = b.get_batch(8, ps)
    r.reward.flags.writeable = False
    del r
    for batch in (y, z, b.get_batch(8, ps), b.get_batch(8, ps)):
        assert batch.state.shape == (8, 1, 4) and batch.reward.flags.writeable
        _consistent(b, batch)


def test_other_batch_size_and_weakref():
    b, ps = _buffer()
    x = b.get_batch(8, ps)
    w = weakref.ref(x.state)
    del x
    for B in (8, 5, 8, 9, 8):
        batch = b.get_batch(B, ps)
        assert batch.state.shape == (B, 1, 4)
        assert batch.state is not w()
        _consistent(b, batch)


def test_pick_len_and_prioritized():
    b, ps = _buffer(pick_len=4, kind=1)
    held = []
    for k in range(30):
        batch = b.get_batch(12, ps)
        _consistent(b, batch)
        if k % 7 == 0:
            held.append((batch, _snapshot(batch)))
    for batch, snap in held:
        assert _same(batch, snap)


def test_threads_hold_their_batches():
    b, ps = _buffer()
    errors = []

    def run():
        try:
            mine = []
            for k in range(300):
                batch = b.get_batch(16, ps)
                if k % 3 == 0:
                    mine.append((batch, _snapshot(batch)))
                if len(mine) > 4:
                    old, snap = mine.pop(0)
                    assert _same(old, snap)
                    _consistent(b, old)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=run) for _ in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors[0]


def test_finalizer_in_the_extras_dict_allocation():
    """A collection run by the allocation of the new batch's extras dict (on
    3.11 it runs at once) can call a finalizer that takes a batch of its own:
    it must not be given the set this call is about to refill."""
    import gc

    b, ps = _buffer()
    stash = []

    class Trigger:
        def __del__(self):
            batch = b.get_batch(16, ps)
            stash.append((batch, _snapshot(batch)))

    x = b.get_batch(16, ps)
    del x  # a free spare set
    gc.collect()
    old = gc.get_threshold()
    gc.disable()
    try:
        t = Trigger()
        t.self = t
        del t  # cyclic garbage with a finalizer
        hold = [{} for _ in range(200)]  # no free dicts left: the next one is a GC allocation
        gc.set_threshold(1)
        gc.enable()
        y = b.get_batch(16, ps)
        inside = bool(stash)
    finally:
        gc.set_threshold(*old)
        gc.enable()
    del hold
    gc.collect()
    if not inside:  # Python 3.12+ defers a collection to the next bytecode boundary
        pytest.skip("no collection ran inside get_batch on this Python")
    inner, snap = stash[0]
    assert inner.state is not y.state
    assert _same(inner, snap)


def test_array_retargeted_by_setstate():
    """ndarray.__setstate__ with a bytes object of over 1,000 bytes makes
    the array a writeable view of that bytes object (its new base): a
    dropped batch array so retargeted must not be refilled, or get_batch
    writes into the caller's (immutable) bytes."""
    b, ps = _buffer()
    x = b.get_batch(100, ps)
    st = x.state
    raw = bytes(st.nbytes)
    st.__setstate__((1, st.shape, st.dtype, False, raw))
    del x, st
    for _ in range(3):
        y = b.get_batch(100, ps)
        _consistent(b, y)
    assert raw == bytes(len(raw))


_SB = [("float32", 1), ("float32", 2), ("float32", 4), ("float32", 8), ("float32", 16),
       ("float64", 1), ("float64", 8), ("float32", 3)]


@pytest.mark.parametrize("state", _SB, ids=[f"{d}x{n}" for d, n in _SB])
def test_refill_rewrites_every_byte(state):
    """Every width combination of the fused copy (state 4..64 bytes, int64 or
    int32 actions, float32 or float64 rewards) and one it does not have, with
    short picks, open, ended and terminated episodes: each field of a refilled
    set, first filled with junk by its last holder, is what the reference
    buffer gives for the same picks."""
    from exreplay.reference import ReferenceReplay

    sdt, sn = state
    for adt in ("int64", "int32"):
        for rdt in ("float32", "float64"):
            for L, short, kind in ((1, False, 0), (3, True, 0), (4, True, 1)):
                kw = dict(state_shape=(sn,), state_dtype=sdt, action_dtype=adt, reward_dtype=rdt,
                          capacity=None, pick_len=L, allow_short=short, seed=5)
                c, r = exreplay.ExperienceReplay(**kw), ReferenceReplay(**kw)
                pc, pr = c.new_pick_selector(kind), r.new_pick_selector(kind)
                rng = np.random.default_rng(1)
                for e in range(10):
                    n = int(rng.integers(1, 8))
                    st = (rng.normal(size=(n, sn)) * 100).astype(sdt)
                    ac = rng.integers(-1000, 1000, n).astype(adt)
                    rw = rng.normal(size=n).astype(rdt)
                    fin = rng.normal(size=sn).astype(sdt) if e % 3 else None
                    pri = rng.uniform(0.1, 2, n) if kind else None
                    for buf in (c, r):
                        h = buf.new_episode()
                        for t in range(n):
                            last = t == n - 1 and e % 4 != 3  # e % 4 == 3: left open
                            buf.record(h, st[t], ac[t], rw[t],
                                       priority=None if pri is None else pri[t],
                                       final_state=fin if last else None,
                                       terminated=last and e % 3 == 1)
                ids = set()
                for _ in range(12):
                    x = c.get_batch(7, pc)
                    ids.add(id(x.state))
                    y = r._gather(pr, x.pick_epi, x.pick_pos)
                    for f in FIELDS[:-1]:  # pick_index: the C table's order
                        assert np.array_equal(getattr(x, f), getattr(y, f)), (adt, rdt, L, f)
                    for f in FIELDS:
                        getattr(x, f).view(np.uint8)[...] = 0xAB
                    del x
                assert len(ids) <= 2  # the set was refilled


# ---- shared next states (get_batch(..., shared_next=True)) ----
# A shared set's state and state_next are views of its state_seq, which only
# they hold once the batch is dropped.

SEQ_FIELDS = FIELDS + ("state_seq",)


def _seq_snapshot(batch):
    return {f: np.array(getattr(batch, f), copy=True) for f in SEQ_FIELDS}


def _seq_consistent(b, batch):
    _consistent(b, batch)
    assert np.shares_memory(batch.state, batch.state_seq)
    assert np.array_equal(batch.state, batch.state_seq[:, :-1])
    assert np.array_equal(batch.state_next, batch.state_seq[:, 1:])


def test_shared_dropped_is_refilled():
    b, ps = _buffer(pick_len=4)
    ids = set()
    for _ in range(10):
        batch = b.get_batch(16, ps, shared_next=True)
        ids.add(id(batch.state_seq))
        _seq_consistent(b, batch)
    assert len(ids) <= 3  # two sets alternate once the first is dropped


@pytest.mark.parametrize("hold", ["state_seq", "state", "state_next", "seq_view", "batch"])
def test_shared_held_never_written(hold):
    b, ps = _buffer(pick_len=4)
    x = b.get_batch(16, ps, shared_next=True)
    snap = _seq_snapshot(x)
    held = {"state_seq": x.state_seq, "state": x.state, "state_next": x.state_next,
            "seq_view": x.state_seq[3:], "batch": x}[hold]
    keep = np.array(held if hold != "batch" else x.state_seq, copy=True)
    if hold != "batch":
        del x
    for _ in range(20):
        y = b.get_batch(16, ps, shared_next=True)
        _seq_consistent(b, y)
        del y
    if hold == "batch":
        assert all(np.array_equal(getattr(held, f), snap[f]) for f in SEQ_FIELDS)
    else:
        assert np.array_equal(held, keep)


def test_layouts_take_their_own_sets():
    """Default and shared calls in turn: each gets arrays of its own layout
    (a set of the other layout is never refilled as this one's)."""
    b, ps = _buffer(pick_len=4)
    for k in range(12):
        shared = k % 3 != 0
        batch = b.get_batch(16, ps, shared_next=shared)
        if shared:
            _seq_consistent(b, batch)
            assert not batch.state.flags.c_contiguous
        else:
            _consistent(b, batch)
            assert batch.state_seq is None and batch.state.flags.c_contiguous
        del batch


def test_shared_set_is_the_dropped_batch_s():
    """The arrays of a dropped shared batch come back, not new ones: arrays
    made after the drop take any memory freed by it, so equal ids mean the
    very same objects."""
    b, ps = _buffer(pick_len=4)
    x = b.get_batch(16, ps, shared_next=True)
    old = (id(x.state_seq), id(x.state), id(x.state_next), id(x.action))
    del x
    fillers = [np.empty(0) for _ in range(1000)]  # noqa: F841 (kept alive)
    y = b.get_batch(16, ps, shared_next=True)
    assert (id(y.state_seq), id(y.state), id(y.state_next), id(y.action)) == old
    _seq_consistent(b, y)
