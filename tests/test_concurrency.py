"""Recording that copies without the lock, and priority updates by pick index.

record_many reserves its rows under the buffer's lock, copies large rollouts
with no lock held, then publishes them (docs/design.md, "Locking"); a batch
carries its picks' table indices so that set_priority(ps, batch, p) can skip
the handle lookup while they still hold (docs/semantics.md). These tests
check the semantics single-threaded (against both implementations where the
API is shared), then the same paths from many threads, each test ending in
the buffer's invariant check.
"""

import random
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from exreplay import ExperienceReplay, PickSelectorClass
from threadrun import Runner

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized


def _frames(tag, t0, T):
    """84x84 uint8 frames (rows of 7 KB: record_many copies them without the
    lock); every byte a function of (tag, step)."""
    t = np.arange(t0, t0 + T)
    f = np.empty((T, 84, 84), np.uint8)
    f[:] = ((tag * 31 + t * 7) % 251).astype(np.uint8)[:, None, None]
    f[:, 0, 0] = t & 255
    f[:, 0, 1] = (t >> 8) & 255
    f[:, 0, 2] = tag & 255
    f[:, 0, 3] = (tag >> 8) & 255
    return f


def _frame_ok(x):
    """Whole frames: every byte agrees with the (tag, step) in its corner."""
    t = x[..., 0, 0].astype(np.int64) + (x[..., 0, 1].astype(np.int64) << 8)
    tag = x[..., 0, 2].astype(np.int64) + (x[..., 0, 3].astype(np.int64) << 8)
    body = ((tag * 31 + t * 7) % 251).astype(np.uint8)
    return (x[..., 1:, :] == body[..., None, None]).all(axis=(-2, -1)), t, tag


# ---- single thread: the batch form of set_priority ---------------------------


def _filled(make_buffer, capacity=None, eviction="fifo"):
    buf = make_buffer((2,), state_dtype="float32", capacity=capacity, pick_len=2,
                      eviction=eviction, seed=3)
    pr = buf.new_pick_selector(P, alpha=1.0, beta=0.5)
    for i in range(6):
        s = np.stack([np.full(10, i), np.arange(10)], axis=1).astype(np.float32)
        buf.record_many(None, s, np.arange(10), np.ones(10, np.float32),
                        final_state=np.zeros(2, np.float32))
    return buf, pr


def test_set_priority_batch_form_same_as_handles(make_buffer):
    a, pa = _filled(make_buffer)
    b, pb = _filled(make_buffer)
    ba, bb = a.get_batch(40, pa), b.get_batch(40, pb)
    assert np.array_equal(ba.pick_epi, bb.pick_epi) and np.array_equal(ba.pick_pos, bb.pick_pos)
    p = np.linspace(0.5, 9.0, 40)
    assert a.set_priority(pa, ba, p) == b.set_priority(pb, bb.pick_epi, bb.pick_pos, p) == 40
    e, q = a._picks()
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))
    # keyword priorities and a broadcast scalar
    assert a.set_priority(pa, ba, priorities=2.0) == b.set_priority(pb, bb.pick_epi, bb.pick_pos, 2.0)
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))
    a._check()


def _twins_drawn_then_evicted(make_buffer, size=64):
    """Two equal buffers of capacity 60, a batch of `size` drawn from each,
    then three more episodes recorded into both, which evicts the oldest:
    some of the batches' picks leave the table and others move in it."""
    a, pa = _filled(make_buffer, capacity=60)
    b, pb = _filled(make_buffer, capacity=60)
    ba, bb = a.get_batch(size, pa), b.get_batch(size, pb)
    for buf in (a, b):
        for i in range(3):
            s = np.stack([np.full(10, 10 + i), np.arange(10)], axis=1).astype(np.float32)
            buf.record_many(None, s, np.arange(10), np.ones(10, np.float32))
    return a, pa, ba, b, pb, bb


def test_set_priority_batch_form_after_eviction(make_buffer):
    """Picks that moved in the table (swap-removal after an eviction) or left
    it: the batch's indices no longer hold, the handles decide."""
    a, pa, ba, b, pb, bb = _twins_drawn_then_evicted(make_buffer)
    p = np.random.default_rng(1).uniform(0.1, 5.0, 64)
    n = a.set_priority(pa, ba, p)
    assert n == b.set_priority(pb, bb.pick_epi, bb.pick_pos, p)
    assert 0 < n < 64  # some picks are gone
    e, q = a._picks()
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))
    a._check()


def test_set_priority_handle_form_takes_its_batchs_indices():
    """The handle form given a batch's own pick_epi and pick_pos arrays uses
    the batch's pick_index as hints (_core._block_hints counts the calls),
    with the result of the call without them: after evictions moved and
    removed picks, and with indices tampered with. Copies, slices and
    another batch's arrays are not taken for it. Batches of more than
    1,024 picks: a smaller one's own arrays go by its draw's notes first
    (test_set_priority_by_the_draws_notes)."""
    from exreplay import _core

    B = 1100
    a, pa, ba, b, pb, _ = _twins_drawn_then_evicted(ExperienceReplay, B)
    ba.pick_index[:4] = [-5, 10**9, 0, ba.pick_index[5]]
    p = np.random.default_rng(1).uniform(0.1, 5.0, B)
    h0, g0 = _core._block_hints(), _core._drawn_given()
    n = a.set_priority(pa, ba.pick_epi, ba.pick_pos, p)
    assert _core._block_hints() == h0 + 1 and _core._drawn_given() == g0
    assert n == b.set_priority(pb, ba.pick_epi.copy(), ba.pick_pos.copy(), p)
    assert 0 < n < B
    e, q = a._picks()
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))
    other = a.get_batch(B, pa)
    for epi, pos in ((ba.pick_epi[:8], ba.pick_pos[:8]), (ba.pick_epi, other.pick_pos),
                     (ba.pick_epi.copy(), ba.pick_pos)):
        a.set_priority(pa, epi, pos, 1.0)
    assert _core._block_hints() == h0 + 1
    # a batch refilled through out=: its arrays carry the new draw's indices
    a.get_batch(B, pa, out=other)
    assert a.set_priority(pa, other.pick_epi, other.pick_pos, 3.0) == B
    assert _core._block_hints() == h0 + 2
    assert np.allclose(a._priority(pa, other.pick_epi, other.pick_pos), 3.0)
    a._check()


def _same_priorities(a, pa, b, pb):
    e, q = a._picks()
    eb, qb = b._picks()
    assert sorted(zip(e.tolist(), q.tolist())) == sorted(zip(eb.tolist(), qb.tolist()))
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))


def _record_episode(buf, tag):
    s = np.stack([np.full(10, tag), np.arange(10)], axis=1).astype(np.float32)
    buf.record_many(None, s, np.arange(10), np.ones(10, np.float32))


def test_set_priority_by_the_draws_notes():
    """A batch's draw notes its picks and their table indices where the
    arrays cannot reach them; set_priority given a pick_epi array of its
    block (the batch form, or the handle form with the batch's own
    pick_epi) hands them to the core (_core._drawn_given counts it), which
    compares each pick given with them and takes a noted pick's index as
    it is while nothing has moved in the table since, and checks it once
    something has. Every result equals a twin's update by handle: with the
    batch's pick_index overwritten, after recording that evicts nothing,
    after an eviction, with a pick_epi changed or another batch's pick_pos
    (the notes given, those picks looked up), after out= and a recycled
    batch refilled, and for a batch too large to keep notes."""
    from exreplay import _core

    a, pa = _filled(ExperienceReplay, capacity=60)
    b, pb = _filled(ExperienceReplay, capacity=60)
    rng = np.random.default_rng(5)

    def both(update, ba, expect_given):
        g0 = _core._drawn_given()
        p = rng.uniform(0.1, 5.0, len(ba.pick_epi))
        n = update(a, pa, ba, p)
        assert _core._drawn_given() == g0 + expect_given
        assert n == b.set_priority(pb, ba.pick_epi.copy(), ba.pick_pos.copy(), p)
        _same_priorities(a, pa, b, pb)
        a._check()
        return n

    batch_form = lambda buf, ps, bt, p: buf.set_priority(ps, bt, p)
    own_arrays = lambda buf, ps, bt, p: buf.set_priority(ps, bt.pick_epi, bt.pick_pos, p)
    ba = a.get_batch(64, pa)
    assert both(batch_form, ba, 1) == 64
    assert both(own_arrays, ba, 1) == 64
    ba.pick_index[:] = 0  # the public indices are not what the notes go by
    assert both(batch_form, ba, 1) == 64
    # equal arrays in another block of the same draw's picks: no notes found
    assert both(lambda buf, ps, bt, p: buf.set_priority(ps, bt.pick_epi.copy(), bt.pick_pos, p),
                ba, 0) == 64
    # a pick changed in the batch: the notes are given, that pick is
    # found by its handle
    saved = ba.pick_epi[3]
    ba.pick_epi[3] = ba.pick_epi[0] if ba.pick_epi[0] != saved else -1
    both(batch_form, ba, 1)
    ba.pick_epi[3] = saved
    # the batch's pick_epi with another draw's pick_pos: notes given, each
    # pick compared
    other = a.get_batch(64, pa)
    p = rng.uniform(0.1, 5.0, 64)
    g0 = _core._drawn_given()
    n = a.set_priority(pa, ba.pick_epi, other.pick_pos, p)
    assert _core._drawn_given() == g0 + 1
    assert n == b.set_priority(pb, ba.pick_epi.copy(), other.pick_pos.copy(), p)
    _same_priorities(a, pa, b, pb)
    a._check()
    del other
    # recording that evicts nothing (capacity 60, 60 records) keeps them
    # in place: 10 more records evict one episode, so first a bigger buffer
    c, pc = _filled(ExperienceReplay, capacity=200)
    d, pd = _filled(ExperienceReplay, capacity=200)
    bc = c.get_batch(64, pc)
    for buf in (c, d):
        _record_episode(buf, 20)
    p = rng.uniform(0.1, 5.0, 64)
    g0 = _core._drawn_given()
    assert c.set_priority(pc, bc, p) == d.set_priority(pd, bc.pick_epi.copy(), bc.pick_pos.copy(), p) == 64
    assert _core._drawn_given() == g0 + 1
    _same_priorities(c, pc, d, pd)
    # an eviction moves and removes picks: the notes are given, and checked
    for buf in (a, b):
        _record_episode(buf, 30)
    n = both(batch_form, ba, 1)
    assert 0 < n < 64
    # out= refills the notes with the new draw's
    ba2 = a.get_batch(64, pa, out=ba)
    assert ba2 is ba
    assert both(own_arrays, ba, 1) == 64
    # a dropped small batch's arrays come back refilled, with their notes
    del ba, ba2
    for _ in range(3):
        bt = a.get_batch(64, pa)
        assert both(batch_form, bt, 1) == 64
    # past the notes' size: the batch's pick_index as hints, as before
    big = a.get_batch(1500, pa)
    assert both(batch_form, big, 0) == 1500
    assert both(own_arrays, big, 0) == 1500


def test_set_priority_batch_form_stale_indices_fall_back():
    """A batch whose indices were tampered with still reaches its picks."""
    buf, pr = _filled(ExperienceReplay)
    twin, tpr = _filled(ExperienceReplay)
    b = buf.get_batch(30, pr)
    bt = twin.get_batch(30, tpr)
    b.pick_index[:] = b.pick_index[::-1]
    b.pick_index[:3] = [-5, 10**9, 0]
    p = np.linspace(1, 3, 30)
    assert buf.set_priority(pr, b, p) == twin.set_priority(tpr, bt.pick_epi, bt.pick_pos, p) == 30
    e, q = buf._picks()
    assert np.array_equal(buf._priority(pr, e, q), twin._priority(tpr, e, q))
    buf._check()


@pytest.mark.parametrize("stale_first", [True, False])
def test_set_priority_batch_form_duplicate_with_stale_index(stale_first):
    """One pick twice in a batch, once with its true index and once with a
    stale one (found through the map instead): the later one in the call
    still wins, as in the handle form."""
    buf, pr = _filled(ExperienceReplay)
    twin, tpr = _filled(ExperienceReplay)
    b = buf.get_batch(6, pr)
    bt = twin.get_batch(6, tpr)
    for arr in (b.pick_epi, b.pick_pos, b.pick_index, bt.pick_epi, bt.pick_pos):
        arr[3] = arr[1]
    stale = 1 if stale_first else 3
    b.pick_index[stale] = (b.pick_index[stale] + 7) % buf.num_picks  # another pick's slot
    p = np.array([1.0, 5.0, 2.0, 7.0, 3.0, 4.0])
    assert buf.set_priority(pr, b, p) == twin.set_priority(tpr, bt.pick_epi, bt.pick_pos, p) == 6
    e, q = buf._picks()
    assert np.array_equal(buf._priority(pr, e, q), twin._priority(tpr, e, q))
    assert buf._priority(pr, b.pick_epi[1:2], b.pick_pos[1:2])[0] == 7.0  # alpha 1
    buf._check()


def test_set_priority_batch_form_after_selector_churn():
    """Selectors created and removed between the draw and the update: the
    indices are the table's, shared by every selector, and stay valid."""
    buf, pr = _filled(ExperienceReplay)
    b = buf.get_batch(16, pr)
    extra = [buf.new_pick_selector(P) for _ in range(3)]
    buf.remove_pick_selector(extra[1])
    assert buf.set_priority(extra[0], b, 4.0) == 16
    assert np.allclose(buf._priority(extra[0], b.pick_epi, b.pick_pos), 4.0 ** 0.6)  # p^alpha
    buf.remove_pick_selector(extra[0])
    with pytest.raises(ValueError, match="ps"):
        buf.set_priority(extra[0], b, 1.0)
    assert buf.set_priority(pr, b, 1.0) == 16
    buf._check()


def test_set_priority_batch_form_errors():
    buf, pr = _filled(ExperienceReplay)
    b = buf.get_batch(4, pr)
    with pytest.raises(ValueError, match="priorities"):
        buf.set_priority(pr, b, [1.0, -1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="priorities"):
        buf.set_priority(pr, b, [1.0, 2.0])
    with pytest.raises(TypeError):
        buf.set_priority(pr, b, 1.0, 2.0)
    with pytest.raises(TypeError):
        buf.set_priority(pr, b.pick_epi, b.pick_pos)  # the handle form needs four
    buf._check()


def test_set_priority_pick_index_same_as_without(make_buffer):
    """The handle form with pick_index= (what a learner in another process
    sends back): true, moved (after evictions) and tampered indices all give
    the result of the call without them."""
    a, pa = _filled(make_buffer, capacity=60)
    b, pb = _filled(make_buffer, capacity=60)
    ba, bb = a.get_batch(64, pa), b.get_batch(64, pb)
    p = np.random.default_rng(2).uniform(0.1, 5.0, 64)
    ia = ba.pick_index  # both implementations' batches have it
    assert a.set_priority(pa, ba.pick_epi, ba.pick_pos, p, pick_index=ia) == \
        b.set_priority(pb, bb.pick_epi, bb.pick_pos, p) == 64
    for buf in (a, b):  # picks leave and move
        for i in range(3):
            s = np.stack([np.full(10, 10 + i), np.arange(10)], axis=1).astype(np.float32)
            buf.record_many(None, s, np.arange(10), np.ones(10, np.float32))
    idx = ia.copy()
    idx[:4] = [-1, 2**62, 0, idx[5]]
    n = a.set_priority(pa, ba.pick_epi, ba.pick_pos, p[::-1], idx.astype(np.int32))
    assert n == b.set_priority(pb, bb.pick_epi, bb.pick_pos, p[::-1], None)
    assert 0 < n < 64
    e, q = a._picks()
    assert np.array_equal(a._priority(pa, e, q), b._priority(pb, e, q))
    a._check()


def test_set_priority_pick_index_errors(make_buffer):
    buf, pr = _filled(make_buffer)
    b = buf.get_batch(4, pr)
    e, q = buf._picks()
    before = buf._priority(pr, e, q)
    with pytest.raises(ValueError, match=r"pick_index: expected shape \(4,\), got \(3,\)"):
        buf.set_priority(pr, b.pick_epi, b.pick_pos, 2.0, pick_index=b.pick_index[:3])
    with pytest.raises(TypeError, match="pick_index"):
        buf.set_priority(pr, b.pick_epi, b.pick_pos, 2.0, pick_index=np.zeros(4))
    with pytest.raises(TypeError):  # the batch form has its own indices
        buf.set_priority(pr, b, 2.0, pick_index=b.pick_index)
    assert np.array_equal(buf._priority(pr, e, q), before)
    buf._check()


def test_batch_pick_index_is_hidden_from_unpacking():
    buf, pr = _filled(ExperienceReplay)
    b = buf.get_batch(5, pr)
    assert len(tuple(b)) == 8
    assert b.pick_index.dtype == np.int64 and b.pick_index.shape == (5,)
    e, q = buf._picks()
    assert np.array_equal(e[b.pick_index], b.pick_epi) and np.array_equal(q[b.pick_index], b.pick_pos)


# ---- single thread: large rollouts (copied without the lock) -----------------


def test_large_record_many_round_trips_and_evicts_itself():
    """A rollout longer than the capacity: the episode recorded into is
    evicted by its own call, the rest goes into a new one, as single records
    would do it."""
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=50, pick_len=1, seed=0)
    ps = buf.new_pick_selector(U)
    h = buf.record_many(None, _frames(1, 0, 120), np.arange(120), np.zeros(120))
    assert len(buf) <= 50 and buf.num_episodes >= 1
    ep = buf.episode(h)
    ok, t, tag = _frame_ok(ep.state)
    assert ok.all() and (tag == 1).all() and (np.diff(t) == 1).all() and t[-1] == 119
    b = buf.get_batch(64, ps)
    assert _frame_ok(b.state)[0].all()
    buf._check()


# ---- calls from several threads, one at a time -------------------------------


def _calls_from(threaded):
    """The batches a fixed sequence of calls gives, with the record calls
    made by another thread (one call at a time, as an actor thread makes
    them beside a learner) or all by this one."""
    pool = ThreadPoolExecutor(max_workers=1)
    buf = ExperienceReplay((1,), capacity=300, seed=7)
    ps = buf.new_pick_selector(P, alpha=0.7, beta=0.5)
    rng = np.random.default_rng(2)
    drawn = []
    for i in range(12):
        T = int(rng.integers(20, 60))
        args = (None, np.zeros((T, 1), np.float32), np.zeros(T, np.int64),
                np.zeros(T, np.float32))
        kw = dict(priorities=rng.exponential(1.0, T), terminated=True)
        if threaded:
            pool.submit(buf.record_many, *args, **kw).result()
        else:
            buf.record_many(*args, **kw)
        b = buf.get_batch(int(rng.integers(65, 300)), ps)  # not the small, locked draw
        drawn.append((b.pick_epi.tolist(), b.pick_pos.tolist(), b.weight.tolist()))
        buf.set_priority(ps, b, rng.exponential(1.0, len(b.pick_epi)))
    buf._check()
    pool.shutdown()
    return drawn


def test_same_calls_from_other_threads_same_batches():
    """A draw after another thread's record calls is made without the
    storage lock, with a few extra draws to replace picks evicted meanwhile
    (docs/design.md, "A draw without the storage lock"). The extras come
    from a generator of their own: the selector's advances by the batch's
    draws alone, so the same seed and the same calls give the same batches
    whichever threads make them."""
    assert _calls_from(threaded=True) == _calls_from(threaded=False)


# ---- many threads ------------------------------------------------------------


@pytest.mark.parametrize("eviction", ["fifo", "second_chance"])
def test_reserve_copy_publish_from_many_threads(eviction):
    """Writers record large rollouts (copied without the lock) into their own
    episodes and into one shared episode; samplers check that no batch shows
    a row that is reserved but not yet copied (a torn or zero frame), updaters
    use the batch form of set_priority while eviction moves picks, a churner
    adds and removes selectors, an inspector reads episodes and serializes."""
    L = 4
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=1200, pick_len=L,
                           allow_short=True, eviction=eviction, seed=4)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.7, beta=0.5)
    buf.record_many(None, _frames(0, 0, 50), np.arange(50), np.zeros(50))
    run = Runner()
    shared = {"h": buf.new_episode()}
    shared_mu = threading.Lock()
    tags = iter(range(1, 60000))
    tag_mu = threading.Lock()

    def next_tag():
        with tag_mu:
            return next(tags)

    def writer(seed):
        rng = random.Random(seed)
        own = None
        while not run.stop.is_set():
            tag = next_tag()
            T = rng.randint(1, 60)
            f = _frames(tag, 0, T)
            if rng.random() < 0.4:
                with shared_mu:
                    h = shared["h"]
                out = buf.record_many(h, f, np.arange(T), np.full(T, tag, np.float32))
                with shared_mu:
                    if shared["h"] == h:
                        shared["h"] = out
            else:
                end = rng.random() < 0.3
                own = buf.record_many(own, f, np.arange(T), np.full(T, tag, np.float32),
                                      terminated=end)
                if end:
                    own = None
            run.counts["records"] += T

    def sampler(seed, ps):
        rng = random.Random(seed)
        while not run.stop.is_set():
            b = buf.get_batch(rng.choice([16, 64]), ps)
            valid = np.arange(L)[None, :] < b.seq_len[:, None]
            ok, t, tag = _frame_ok(b.state)
            assert (ok | ~valid).all(), "a torn or unpublished row in a batch"
            # along a pick: the same rollout, one step apart, or a new rollout from step 0
            same = tag[:, 1:] == tag[:, :-1]
            nxt = np.where(same, t[:, 1:] == t[:, :-1] + 1, t[:, 1:] == 0)
            assert (nxt | ~valid[:, 1:]).all(), "a rollout is not contiguous in its episode"
            assert (b.action[valid] == t[valid]).all() and (b.reward[valid] == tag[valid]).all()
            run.counts["batches"] += 1

    def updater(seed):
        rng = np.random.default_rng(seed)
        while not run.stop.is_set():
            b = buf.get_batch(64, pr)
            p = rng.uniform(0.01, 5.0, 64)
            n = buf.set_priority(pr, b, p)
            assert 0 <= n <= 64
            run.counts["applied"] += n
            # nobody else sets pr's priorities and a pick never comes back:
            # a pick still held reads back the last priority given to it
            last = {(e, q): k for k, (e, q) in enumerate(zip(b.pick_epi, b.pick_pos))}
            for (e, q), k in list(last.items())[:8]:
                try:
                    got = buf._priority(pr, [e], [q])[0]
                except ValueError:
                    continue  # evicted meanwhile
                assert got == pytest.approx(p[k] ** 0.7, rel=1e-6), (e, q, got, p[k])
                run.counts["read back"] += 1

    def churner(seed):
        rng = random.Random(seed)
        while not run.stop.is_set():
            ps = buf.new_pick_selector(rng.choice([U, P]))
            b = buf.get_batch(8, ps)
            assert _frame_ok(b.state)[0][np.arange(L)[None, :] < b.seq_len[:, None]].all()
            buf.set_priority(ps, b, 2.0)
            buf.remove_pick_selector(ps)
            run.counts["churn"] += 1

    def inspector(seed):
        rng = random.Random(seed)
        while not run.stop.is_set():
            hs = buf._handles()
            if hs:
                try:
                    ep = buf.episode(rng.choice(hs))
                except ValueError:
                    pass  # evicted meanwhile
                else:
                    ok, t, tag = _frame_ok(ep.state)
                    assert ok.all(), "episode() shows a row not yet published"
            if rng.random() < 0.1:
                copy = ExperienceReplay.unserialize(buf.serialize())
                copy._check()
                for h in copy._handles()[:5]:
                    assert _frame_ok(copy.episode(h).state)[0].all()
                run.counts["snapshots"] += 1
            run.stop.wait(0.002)

    # one batch refilled (out=) and updated by two threads at once: its
    # draw's notes are written by one get_batch at a time and only when no
    # update is reading them, and read by an update only when no get_batch
    # is writing them (the core compares each pick with them); the updates
    # race with the refills, so only the invariants are checked
    # (on a selector of their own: the updater reads pr's priorities back)
    shared_batch = buf.get_batch(64, u)
    pr_race = buf.new_pick_selector(P, alpha=0.5, beta=0.5)

    def racer(seed):
        rng = random.Random(seed)
        while not run.stop.is_set():
            if rng.random() < 0.5:
                buf.get_batch(64, rng.choice([u, pr_race]), out=shared_batch)
            else:
                n = buf.set_priority(pr_race, shared_batch, rng.uniform(0.1, 3.0))
                assert 0 <= n <= 64
            run.counts["races"] += 1

    for w in range(3):
        run.spawn(f"writer{w}", writer, 10 + w)
    run.spawn("sampler_u", sampler, 1, u)
    run.spawn("sampler_p", sampler, 2, pr)
    run.spawn("updater", updater, 3)
    run.spawn("churner", churner, 4)
    run.spawn("inspector", inspector, 5)
    run.spawn("racer0", racer, 6)
    run.spawn("racer1", racer, 7)
    c = run.counts
    def reached():
        return c["records"] > buf.capacity and all(
            c[k] > 0 for k in ("batches", "applied", "churn", "read back", "races"))

    run.run(2.0, until=reached)
    buf._check()
    assert reached(), c
    # every episode: rollouts contiguous and in order
    for h in buf._handles():
        ok, t, tag = _frame_ok(buf.episode(h).state)
        assert ok.all()
        same = tag[1:] == tag[:-1]
        assert np.where(same, t[1:] == t[:-1] + 1, t[1:] == 0).all()


def test_priorities_written_by_another_thread_during_set_priority():
    """set_priority reads the caller's priorities once, into its own copy, and
    checks and applies only that: another thread writing NaNs into the array
    during the call gets a ValueError or the values it checked, never a NaN
    leaf in the tree (where a NaN is a pending add's tag)."""
    buf = ExperienceReplay((2,), capacity=4000, pick_len=1, seed=3)
    ps = buf.new_pick_selector(P)
    for e in range(40):
        buf.record_many(None, np.zeros((100, 2), np.float32), np.zeros(100, np.int64),
                        np.zeros(100, np.float32))
    b = buf.get_batch(256, ps)
    epi, pos = b.pick_epi.copy(), b.pick_pos.copy()
    pr = np.ones(256)
    stop = threading.Event()

    def flipper():
        k = 0
        while not stop.is_set():
            pr[k % 256] = np.nan if k % 2 else 1.0 + (k % 7)
            k += 1

    t = threading.Thread(target=flipper)
    t.start()
    try:
        bad = 0
        for _ in range(3000):
            try:
                buf.set_priority(ps, epi, pos, pr)
            except ValueError:
                bad += 1
            buf.get_batch(64, ps)
    finally:
        stop.set()
        t.join()
    buf._check()
    stored = buf._priority(ps, epi, pos)
    assert np.isfinite(stored).all()


def test_set_priority_with_pick_index_another_thread_rewrites():
    """pick_index is the caller's array, which set_priority reads with the
    GIL let go: another thread writing out-of-range, negative and stale
    indices into it meanwhile changes which picks are found fast, never
    which picks exist. Each hint is read once and checked where it is kept,
    so no call reaches outside the table (the indices of a draw's notes are
    copied before they are checked). A guard: with a compiler that read a
    checked hint again, this is where it would show."""
    buf = ExperienceReplay((4,), capacity=4096, pick_len=1, seed=3)
    ps = buf.new_pick_selector(PickSelectorClass.Prioritized)
    for _ in range(40):
        buf.record_many(None, np.zeros((100, 4), np.float32), np.zeros(100, np.int64),
                        np.zeros(100, np.float32), final_state=np.zeros(4, np.float32))
    b = buf.get_batch(256, ps)
    idx = b.pick_index.copy()
    good = idx.copy()
    stop = threading.Event()

    def scribble():
        vals = (np.int64(2**62), np.int64(-1), np.int64(10**9))
        k = 0
        while not stop.is_set():
            idx[:] = vals[k % 3] if k % 4 else good
            k += 1

    t = threading.Thread(target=scribble)
    # a call that returns while the scribbler holds the GIL waits for the
    # switch interval: on a busy machine, 5 ms a call at the default
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    t.start()
    try:
        p = np.linspace(0.5, 2.0, 256)
        for _ in range(3000):
            assert buf.set_priority(ps, b.pick_epi, b.pick_pos, p, pick_index=idx) == 256
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    buf._check()
    last = {}  # the last value given wins for a pick given twice
    for e, q, v in zip(b.pick_epi.tolist(), b.pick_pos.tolist(), p.tolist()):
        last[e, q] = v
    got = buf._priority(ps, b.pick_epi, b.pick_pos)  # the stored p ** alpha
    want = [last[e, q] ** 0.6 for e, q in zip(b.pick_epi.tolist(), b.pick_pos.tolist())]
    np.testing.assert_allclose(got, want, rtol=1e-6)
