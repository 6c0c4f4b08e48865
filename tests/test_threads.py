"""Concurrency stress of the C buffer (docs/design.md: every method is safe to call
from many threads at once, and the GIL is released inside record,
record_many, get_batch and set_priority).

Writers encode in every state the episode-local step index, so that each
batch drawn while eviction runs can be checked for self-consistency: along
a pick the index grows by one, the next state of step t is the state of
step t + 1, and nothing past seq_len is non-zero. No timing is asserted.
"""

import collections
import os
import random

import numpy as np
import pytest

from exreplay import ExperienceReplay, PickSelectorClass
from threadrun import Gate, Runner

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized

ASAN = os.environ.get("EXREPLAY_ASAN") == "1"
DURATION = 1.0 if ASAN else 3.0


# ---- small states: encode (step, writer, serial) ----------------------------

W = 6  # state width: [step, writer, serial, step*2, 7, step % 5]


def states_for(wid, serial, t0, T):
    t = np.arange(t0, t0 + T, dtype=np.float64)
    s = np.empty((T, W), np.float64)
    s[:, 0] = t
    s[:, 1] = wid
    s[:, 2] = serial
    s[:, 3] = 2 * t
    s[:, 4] = 7
    s[:, 5] = t % 5
    return s


def check_small_batch(b, L):
    """Self-consistency of one batch of encoded states."""
    B = len(b.seq_len)
    assert b.state.shape == (B, L, W)
    ln = b.seq_len
    assert ((ln >= 1) & (ln <= L)).all()
    assert ((b.seq_len_next == ln) | (b.seq_len_next == ln - 1)).all()
    t = np.arange(L)
    valid = t[None, :] < ln[:, None]
    st = b.state
    # padding is zero
    assert (st[~valid] == 0).all()
    assert (b.state_next[~valid] == 0).all()
    assert (b.action[~valid] == 0).all()
    assert (b.reward[~valid] == 0).all()
    t0 = st[:, 0, 0]
    steps = t0[:, None] + t[None, :]
    # the step index increases by one along the pick; the rest follows from it
    assert (np.where(valid, st[:, :, 0], steps) == steps).all()
    for col, val in ((1, st[:, 0, 1]), (2, st[:, 0, 2]), (4, np.full(B, 7.0))):
        assert (np.where(valid, st[:, :, col], val[:, None]) == val[:, None]).all()
    assert (np.where(valid, st[:, :, 3], 2 * steps) == 2 * steps).all()
    assert (np.where(valid, st[:, :, 5], steps % 5) == steps % 5).all()
    # actions and rewards were recorded from the same step index
    assert (np.where(valid, b.action, steps) == steps).all()
    assert (np.where(valid, b.reward, steps * 0.5) == steps * 0.5).all()
    # next state of t is state of t + 1 inside the pick
    inner = t[None, :] < (ln - 1)[:, None]
    assert (b.state_next[:, :-1][inner[:, :-1]] == st[:, 1:][inner[:, :-1]]).all()
    # the last next state: the following step (stored or final) or zeros
    last = b.state_next[np.arange(B), ln - 1]
    terminal = b.seq_len_next == ln - 1
    exp = st[np.arange(B), ln - 1].copy()
    exp[:, 0] += 1
    exp[:, 3] += 2
    exp[:, 5] = (exp[:, 0]) % 5
    ok_follow = (last == exp).all(axis=1)
    ok_zero = (last == 0).all(axis=1)
    # a terminal step has a final state (the following step) or zeros;
    # a non-terminal one always has the following step
    assert (ok_follow | (terminal & ok_zero)).all()
    # seq_len < L only where an ended episode runs out: then no next pick row
    assert (b.weight > 0).all() and np.isfinite(b.weight).all()


def writer(run, buf, wid, seed):
    rng = random.Random(seed)
    serial = 0
    while not run.stop.is_set():
        serial += 1
        T = rng.randint(1, 70)
        h = None if rng.random() < 0.5 else buf.new_episode()
        t = 0
        end = rng.random()
        while t < T and not run.stop.is_set():
            n = rng.randint(1, 12) if rng.random() < 0.6 else 1
            n = min(n, T - t)
            last = t + n == T
            S = states_for(wid, serial, t, n)
            fin = states_for(wid, serial, T, 1)[0] if last and end < 0.4 else None
            term = last and 0.3 < end < 0.7
            steps = np.arange(t, t + n)
            if n == 1 and rng.random() < 0.5:
                pri = rng.uniform(0.05, 5.0) if rng.random() < 0.7 else None
                with run.gate:
                    h2 = buf.record(h, S[0], int(steps[0]), float(steps[0]) * 0.5, final_state=fin,
                                    terminated=term, priority=pri)
            else:
                pri = np.array([rng.uniform(0.05, 5.0) for _ in range(n)]) \
                    if rng.random() < 0.7 else None
                with run.gate:
                    h2 = buf.record_many(h, S, steps, steps * 0.5, final_state=fin, terminated=term,
                                         priorities=pri)
            assert isinstance(h2, int) and h2 >= 0
            if h is not None and h2 != h:
                # the episode was evicted (or h was unknown): a new one began
                run.counts["restarts"] += 1
            h = h2
            t += n
            run.counts["records"] += n
        # end < 0.7: ended; otherwise abandoned open


def sampler(run, buf, selectors, recent, L, use_out, seed):
    rng = random.Random(seed)
    outs = {}
    while not run.stop.is_set():
        ps = rng.choice(selectors)
        B = rng.choice([1, 16, 64, 256])
        try:
            if use_out and rng.random() < 0.8:
                key = (int(ps), B)
                if key in outs:
                    b = buf.get_batch(B, ps, out=outs[key])
                    assert b is outs[key]
                else:
                    b = outs[key] = buf.get_batch(B, ps)
            else:
                b = buf.get_batch(B, ps)
        except ValueError as e:
            # legitimate only when nothing can be drawn at that instant
            assert not str(e).startswith(("ps:", "batch_size:", "out:")), str(e)
            run.counts["empty"] += 1
            continue
        check_small_batch(b, L)
        if ps.kind == int(U):
            assert (b.weight == 1).all()
        else:
            assert (b.weight <= 1.0 + 1e-6).all()
        recent.append((b.pick_epi.copy(), b.pick_pos.copy()))
        run.counts["batches"] += 1


def updater(run, buf, pr, recent, seed):
    rng = np.random.default_rng(seed)
    while not run.stop.is_set():
        try:
            e, p = recent.popleft()
        except IndexError:
            run.stop.wait(0.001)
            continue
        n = buf.set_priority(pr, e, p, rng.uniform(0.01, 10.0, len(e)))
        assert 0 <= n <= len(e)
        if rng.random() < 0.3:
            n = buf.set_priority(pr, e, p, float(rng.uniform(0.5, 2.0)))
            assert 0 <= n <= len(e)
        run.counts["applied"] += n
        run.counts["asked"] += len(e)


def churner(run, buf, L, seed, max_mine=None):
    rng = random.Random(seed)
    mine = []
    while not run.stop.is_set():
        r = rng.random()
        if max_mine is not None and len(mine) >= max_mine:
            r = 0.5  # remove one: a soak must not grow its live selectors without bound
        if r < 0.35 or not mine:
            kind = rng.choice([U, P])
            kw = dict(alpha=rng.uniform(0, 1), beta=rng.uniform(0, 1)) if kind == P else {}
            mine.append(buf.new_pick_selector(kind, **kw))
        elif r < 0.6:
            buf.remove_pick_selector(mine.pop(rng.randrange(len(mine))))
        elif r < 0.9:
            ps = rng.choice(mine)
            if ps.kind == int(P):
                ps.beta = rng.uniform(0, 1)
            try:
                check_small_batch(buf.get_batch(rng.randint(1, 32), ps), L)
            except ValueError as e:
                assert not str(e).startswith(("ps:", "batch_size:", "out:")), str(e)
        else:
            buf._check()
        run.counts["churn"] += 1
    for ps in mine:
        buf.remove_pick_selector(ps)


def now_and_then(run, buf, seed, newest, pause, act):
    """act(h) every `pause` seconds on an episode held, the newest (the one
    a writer is most likely copying into) with probability `newest`, any
    other else, until run stops."""
    rng = random.Random(seed)
    while not run.stop.is_set():
        hs = buf._handles()
        if hs:
            act(hs[-1] if rng.random() < newest else rng.choice(hs))
        run.stop.wait(pause)


def remover(run, buf, seed, newest=0.5, pause=0.001):
    """Removes episodes now and then, often the newest; losing a race to
    eviction is a ValueError."""
    def remove(h):
        try:
            buf.remove_episode(h)
            run.counts["removed"] += 1
        except ValueError as e:
            assert str(e).startswith("h: expected the handle of an episode held"), str(e)

    now_and_then(run, buf, seed, newest, pause, remove)


def ender(run, buf, seed, newest=0.5, pause=0.001):
    """Ends episodes without a step now and then (end_episode, terminated,
    so that the last next state is zeros as check_small_batch allows), often
    the newest (the one a writer is most likely copying into: the end waits
    for that copy). An episode ended, empty or evicted meanwhile is a
    ValueError or False."""
    def end(h):
        try:
            if buf.end_episode(h, terminated=True):
                run.counts["ended"] += 1
        except ValueError as e:
            assert str(e).startswith(("h: expected an open episode",
                                      "h: expected an episode with a step")), str(e)

    now_and_then(run, buf, seed, newest, pause, end)


def inspector(run, buf, seed):
    """Readers of the introspection API, racing the writers."""
    rng = random.Random(seed)
    while not run.stop.is_set():
        n = len(buf)
        assert 0 <= n <= buf.capacity
        assert buf.num_picks >= 0 and buf.num_episodes >= 0
        hs = buf._handles()
        assert hs == sorted(hs)
        if hs:
            h = rng.choice(hs)
            try:
                ep = buf.episode(h)
            except ValueError:
                pass  # evicted between the two calls
            else:
                k = len(ep.reward)
                if k:
                    s = ep.state[:, 0]
                    assert (np.diff(s) == 1).all()
                    assert (ep.action == s).all()
        e, p = buf._picks()
        assert len(e) == len(p)
        run.stop.wait(0.002)


@pytest.mark.parametrize("eviction", ["fifo", "second_chance"])
def test_stress_record_sample_update_churn(eviction):
    L = 4
    buf = ExperienceReplay((W,), state_dtype="float64", action_dtype="int64",
                           reward_dtype="float64", capacity=1500, pick_len=L, allow_short=True,
                           eviction=eviction, seed=1)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.6, beta=0.4)
    pr2 = buf.new_pick_selector(P, alpha=1.0, beta=1.0)
    # something to draw from at the start
    for i in range(20):
        buf.record_many(None, states_for(9, i, 0, 10), np.arange(10), np.arange(10) * 0.5,
                        final_state=states_for(9, i, 10, 1)[0])
    run = Runner()
    recent = collections.deque(maxlen=64)
    for w in range(4):
        run.spawn(f"writer{w}", writer, run, buf, w, 100 + w)
    run.spawn("sampler0", sampler, run, buf, [u, pr, pr2], recent, L, False, 1)
    run.spawn("sampler1", sampler, run, buf, [u, pr, pr2], recent, L, True, 2)
    run.spawn("updater", updater, run, buf, pr, recent, 3)
    run.spawn("churner", churner, run, buf, L, 4)
    run.spawn("inspector", inspector, run, buf, 5)
    run.spawn("remover", remover, run, buf, 6, 0.5, 0.005)
    run.spawn("ender", ender, run, buf, 7, 0.5, 0.003)
    c = run.counts

    def reached():  # eviction really ran, and every other thread did its part
        return c["records"] > buf.capacity and all(
            c[k] > 0 for k in ("batches", "asked", "churn", "removed", "ended"))

    run.run(DURATION, until=reached)
    buf._check()
    print(dict(c))
    assert reached(), c
    assert len(buf) <= buf.capacity
    # still fully usable afterwards
    for ps in (u, pr, pr2):
        check_small_batch(buf.get_batch(256, ps), L)
    e, p = buf._picks()
    assert buf.set_priority(pr, e, p, 1.0) == len(e)
    assert int(buf.new_pick_selector(U)) > int(pr2)
    buf._check()


def prefilled_prioritized(L, capacity, seed, **params):
    """A float64 buffer and a prioritized selector with params, holding ten
    ended 30-step rollouts of writer 9, rollout i with priority 1 + i."""
    buf = ExperienceReplay((W,), state_dtype="float64", action_dtype="int64",
                           reward_dtype="float64", capacity=capacity, pick_len=L, seed=seed)
    pr = buf.new_pick_selector(P, **params)
    for i in range(10):
        buf.record_many(None, states_for(9, i, 0, 30), np.arange(30), np.arange(30) * 0.5,
                        final_state=states_for(9, i, 30, 1)[0], priorities=np.full(30, 1.0 + i))
    return buf, pr


def test_prioritized_draws_race_eviction_and_selector_churn():
    """Prioritized draws racing with eviction and with selector churn: a small
    capacity (every rollout evicts), writers recording rollouts with
    priorities, samplers drawing from a fixed selector and from the selectors a
    churn thread adds and removes (a selector removed meanwhile is a
    ValueError). Every batch is checked row by row (check_small_batch: a
    pick's rows are consecutive steps of one rollout), every weight is in
    (0, 1], and the invariants hold afterwards."""
    L = 2
    buf, pr = prefilled_prioritized(L, 400, 3, alpha=0.7, beta=0.5)
    live = []  # the churn thread's selectors (some already removed when drawn)
    run = Runner()

    def churn():
        rng = random.Random(8)
        while not run.stop.is_set():
            live.append(buf.new_pick_selector(P, alpha=rng.uniform(0, 1), beta=rng.uniform(0, 1)))
            if len(live) > 3:
                buf.remove_pick_selector(live.pop(0))
            run.counts["churn"] += 1

    def draw(seed):
        rng = random.Random(seed)
        while not run.stop.is_set():
            ps = pr if rng.random() < 0.5 or not live else rng.choice(live)
            try:
                b = buf.get_batch(rng.choice([1, 7, 64, 256]), ps)
            except ValueError as e:  # removed by the churn thread meanwhile
                assert ps is not pr, str(e)
                run.counts["gone"] += 1
                continue
            check_small_batch(b, L)
            assert ((b.weight > 0) & (b.weight <= 1)).all()
            run.counts["batches"] += 1

    for w in range(3):
        run.spawn(f"writer{w}", writer, run, buf, w, 40 + w)
    run.spawn("churn", churn)
    for k in range(2):
        run.spawn(f"draw{k}", draw, 50 + k)
    c = run.counts
    def reached():
        return c["records"] > 3 * buf.capacity and c["batches"] > 0 and c["churn"] > 0

    run.run(DURATION, until=reached)
    buf._check()
    assert reached(), c
    for ps in [pr] + live:
        check_small_batch(buf.get_batch(256, ps), L)
    buf._check()


def test_learner_updates_land_while_writers_record():
    """A learner thread draws prioritized batches and sets their priorities
    while writers record and evict: its draws and updates let go of the
    storage lock for the sum-tree work and the writers' changes reach the
    selector as notes (docs/design.md, "A draw without the storage lock").
    Right after each update, every pick of the batch still there holds the
    priority given to it last (the learner is the only updater; writers only
    add and evict picks), every batch's rows are whole, every weight is in
    (0, 1], and the invariants hold afterwards. The check of each batch runs
    with the writers held at the gate (its draw and its update still race
    with them): without it a slow learner (ASan, a loaded machine) found
    every pick evicted before it looked, batch after batch, and checked
    nothing."""
    L = 2
    buf, pr = prefilled_prioritized(L, 600, 5, alpha=1.0, beta=0.4)
    run = Runner()
    run.gate = Gate()

    def learner():
        rng = np.random.default_rng(9)
        while not run.stop.is_set():
            b = buf.get_batch(64, pr)
            check_small_batch(b, L)
            assert ((b.weight > 0) & (b.weight <= 1)).all()
            p = rng.uniform(0.1, 10.0, 64)
            last = {(int(e), int(q)): v for e, q, v in zip(b.pick_epi, b.pick_pos, p)}
            buf.set_priority(pr, b, p)
            with run.gate.alone():
                for (e, q), v in last.items():
                    try:
                        got = buf.stored_priorities(pr, np.array([e]), np.array([q]))[0]
                    except ValueError:  # evicted meanwhile
                        run.counts["gone"] += 1
                        continue
                    assert got == np.float32(v), (e, q, got, v)
                    run.counts["checked"] += 1

    for w in range(2):
        run.spawn(f"writer{w}", writer, run, buf, w, 60 + w)
    run.spawn("learner", learner)
    c = run.counts
    def reached():
        return c["records"] > 2 * buf.capacity and c["checked"] > 0

    run.run(DURATION, until=reached)
    buf._check()
    assert reached(), c


def test_record_many_same_episode_from_many_threads():
    """Threads appending to one shared handle: records of one call stay in
    order and contiguous; the counts add up."""
    buf = ExperienceReplay((2,), state_dtype="float64", capacity=None, pick_len=1, seed=0)
    h = buf.new_episode()
    run = Runner()
    per = collections.Counter()

    def w(wid):
        for i in range(300):
            n = 1 + (i % 7)
            base = wid * 1_000_000 + i * 100
            s = np.stack([np.arange(base, base + n), np.full(n, wid)], axis=1).astype(float)
            assert buf.record_many(h, s, np.zeros(n, np.int64), np.zeros(n)) == h
            per[wid] += n

    for wid in range(4):
        run.spawn(f"w{wid}", w, wid)
    run.run_to_completion()
    ep = buf.episode(h)
    assert len(ep.reward) == sum(per.values()) == len(buf)
    # each call's run of states is contiguous and in order
    s = ep.state[:, 0]
    i = 0
    while i < len(s):
        j = i + 1
        while j < len(s) and s[j] == s[j - 1] + 1 and ep.state[j, 1] == ep.state[i, 1]:
            j += 1
        assert (j - i) in range(1, 8)
        assert s[i] % 100 == 0
        i = j
    assert buf.num_picks == len(s) - 1
    buf._check()


def test_writers_queue_and_learner_runs():
    """4 writers and 1 learner (the Ape-X shape, small capacity so every call
    evicts): the writers queue for the storage lock on the writers' mutex
    (new_episode through the try-then-wait idiom, record_many of small
    rollouts copied under the lock) while the learner draws and updates.
    The writers also append rollouts over 8 KiB to one episode of a second
    buffer that they share: a call that finds it busy waits for the publish
    and must let go of the writers' mutex meanwhile, or the publisher could
    never take it. Every thread makes progress, every batch is consistent,
    each shared-episode rollout stays contiguous and in order, and both
    buffers check out."""
    buf = ExperienceReplay((W,), state_dtype="float64", capacity=3000, pick_len=2, seed=3)
    pr = buf.new_pick_selector(P, alpha=0.6, beta=0.4)
    sh = ExperienceReplay((2,), state_dtype="float64", capacity=None, pick_len=1, seed=0)
    shared = sh.new_episode()
    run = Runner()
    BIG = 600  # 600 x 2 float64 = 9.6 KB: reserved, copied unlocked, published

    def writer(wid):
        rng = np.random.default_rng(wid)
        serial = 0
        while not run.stop.is_set():
            serial += 1
            T = int(rng.integers(1, 40))
            steps = np.arange(T)
            st = states_for(wid, serial, 0, T)
            h = buf.record_many(buf.new_episode(), st, steps, steps * 0.5, terminated=True,
                                priorities=rng.random(T) + 0.01)
            assert h >= 0
            base = wid * 10_000_000 + serial * 1000
            big = np.stack([np.arange(base, base + BIG), np.full(BIG, wid)], axis=1).astype(float)
            assert sh.record_many(shared, big, np.zeros(BIG, np.int64), np.zeros(BIG)) == shared
            run.counts[f"w{wid}"] += 1

    def learner():
        p = np.random.default_rng(9).random(64) + 0.05
        while not run.stop.is_set():
            if buf.num_picks == 0:
                continue
            b = buf.get_batch(64, pr)
            check_small_batch(b, 2)
            buf.set_priority(pr, b.pick_epi, b.pick_pos, p)
            run.counts["learner"] += 1

    for wid in range(4):
        run.spawn(f"w{wid}", writer, wid)
    run.spawn("learner", learner)
    def reached():
        return all(run.counts[k] > 0 for k in ("w0", "w1", "w2", "w3", "learner"))

    run.run(DURATION, until=reached)
    assert reached(), run.counts
    buf._check()
    s = sh.episode(shared).state
    assert len(s) == BIG * sum(run.counts[f"w{wid}"] for wid in range(4)) == len(sh)
    for i in range(0, len(s), BIG):  # each call's rows: one writer, contiguous, in order
        run_ = s[i:i + BIG]
        assert run_[0, 0] % 1000 == 0
        assert (np.diff(run_[:, 0]) == 1).all() and (run_[:, 1] == run_[0, 1]).all()
    sh._check()


# ---- large frames: get_batch copies without the lock while eviction runs ----


def frames(wid, serial, t0, T):
    """84x84 uint8 frames: row 0 holds step (3 bytes), writer and serial;
    the rest is (7 * step + serial) % 256."""
    t = np.arange(t0, t0 + T)
    f = ((7 * t + serial) % 256).astype(np.uint8)[:, None, None] * np.ones((1, 84, 84), np.uint8)
    f[:, 0, 0] = t & 255
    f[:, 0, 1] = (t >> 8) & 255
    f[:, 0, 2] = (t >> 16) & 255
    f[:, 0, 3] = wid
    f[:, 0, 4] = serial % 256
    return f


def _step(x):
    h = x[..., 0, :3].astype(np.int64)
    return h[..., 0] + (h[..., 1] << 8) + (h[..., 2] << 16)


def check_frames(b, L):
    B = len(b.seq_len)
    ln = b.seq_len
    t = np.arange(L)
    valid = t[None, :] < ln[:, None]
    X = b.state
    step = _step(X)
    serial = X[:, :, 0, 4].astype(np.int64)
    exp_step = step[:, :1] + t[None, :]
    assert (np.where(valid, step, exp_step) == exp_step).all()
    assert (np.where(valid, serial, serial[:, :1]) == serial[:, :1]).all()
    body = ((7 * step + serial) % 256).astype(np.uint8)
    ok = (X[:, :, 1:, :] == body[:, :, None, None]).all(axis=(2, 3))
    ok &= (X[:, :, 0, 5:] == body[:, :, None]).all(axis=2)
    assert (ok | ~valid).all(), "torn or stale frame in a batch"
    assert not X[~valid].any() and not b.state_next[~valid].any()
    inner = t[None, :] < (ln - 1)[:, None]
    assert np.array_equal(b.state_next[:, :-1][inner[:, :-1]], X[:, 1:][inner[:, :-1]])
    last = b.state_next[np.arange(B), ln - 1]
    follow = _step(last) == step[np.arange(B), ln - 1] + 1
    lstep = _step(last)
    lbody = ((7 * lstep + last[:, 0, 4].astype(np.int64)) % 256).astype(np.uint8)
    follow &= (last[:, 1:, :] == lbody[:, None, None]).all(axis=(1, 2))
    zero = ~last.reshape(B, -1).any(axis=1)
    assert (follow | ((b.seq_len_next == ln - 1) & zero)).all()
    assert np.array_equal(b.action, np.where(valid, step, 0))


def test_get_batch_with_big_frames_concurrent_with_record():
    L = 8
    buf = ExperienceReplay((84, 84), state_dtype="uint8", capacity=3000, pick_len=L,
                           allow_short=True, seed=2)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P)
    for i in range(10):
        buf.record_many(None, frames(9, i, 0, 40), np.arange(40), np.zeros(40),
                        final_state=frames(9, i, 40, 1)[0])
    run = Runner()

    def w(wid):
        rng = random.Random(wid)
        serial = 0
        while not run.stop.is_set():
            serial += 1
            T = rng.randint(5, 120)
            h = None
            t = 0
            while t < T and not run.stop.is_set():
                n = min(rng.randint(1, 30), T - t)
                last = t + n == T
                fin = frames(wid, serial, T, 1)[0] if last and serial % 2 else None
                h = buf.record_many(h, frames(wid, serial, t, n), np.arange(t, t + n),
                                    np.zeros(n), final_state=fin,
                                    terminated=last and serial % 3 == 0)
                t += n
                run.counts["records"] += n

    def s(seed, ps):
        rng = random.Random(seed)
        out = None
        while not run.stop.is_set():
            B = rng.choice([32, 128, 256])
            if out is not None and len(out.seq_len) == B and rng.random() < 0.5:
                b = buf.get_batch(B, ps, out=out)
            else:
                b = out = buf.get_batch(B, ps)
            check_frames(b, L)
            run.counts["batches"] += 1

    run.spawn("w0", w, 0)
    run.spawn("w1", w, 1)
    run.spawn("s0", s, 10, u)
    run.spawn("s1", s, 11, pr)
    # removes the newest episode most of the time: one a writer copies into
    run.spawn("r", remover, run, buf, 12, 0.9, 0.002)
    c = run.counts
    def reached():
        return c["records"] > buf.capacity and c["batches"] > 0 and c["removed"] > 0

    run.run(DURATION, until=reached)
    print(dict(c))
    assert reached(), c
    buf._check()
    check_frames(buf.get_batch(64, u), L)


# ---- soak: everything at once, for a configurable time ------------------------
#
# EXREPLAY_SOAK_SECONDS (default 4; `make soak` runs an hour) of writers,
# samplers, an updater, a selector churner, an inspector and a persister
# (serialize / unserialize / save / load) against one buffer under eviction.
# At the end _check() passes and the resident set has stayed flat: after a
# warm-up (the first quarter) the RSS of the last quarter must not exceed the
# warm-up's peak by more than 25 % + 48 MiB. A leak of even a few KiB per
# operation shows over an hour; over seconds the test checks the mechanics.

SOAK_SECONDS = float(os.environ.get("EXREPLAY_SOAK_SECONDS", "2" if ASAN else "4"))


def rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def persister(run, buf, directory, seed):
    rng = random.Random(seed)
    k = 0
    while not run.stop.is_set():
        k += 1
        level = rng.choice([0, 1, 6])
        data = buf.serialize(level)
        c = ExperienceReplay.unserialize(data)
        c._check()
        path = os.path.join(directory, f"soak{k % 2}.exr")
        buf.save(path, level=rng.choice([0, 1]))
        d = ExperienceReplay.load(path)
        d._check()
        assert len(d) <= buf.capacity
        del c, d, data
        run.counts["persisted"] += 1
        run.stop.wait(0.05)


@pytest.mark.parametrize("eviction", ["second_chance"])
def test_soak(eviction, tmp_path):
    L = 4
    buf = ExperienceReplay((W,), state_dtype="float64", action_dtype="int64",
                           reward_dtype="float64", capacity=3000, pick_len=L, allow_short=True,
                           eviction=eviction, seed=2)
    u = buf.new_pick_selector(U)
    pr = buf.new_pick_selector(P, alpha=0.6, beta=0.4)
    for i in range(20):
        buf.record_many(None, states_for(9, i, 0, 10), np.arange(10), np.arange(10) * 0.5,
                        final_state=states_for(9, i, 10, 1)[0])
    run = Runner()
    recent = collections.deque(maxlen=64)
    for w in range(3):
        run.spawn(f"writer{w}", writer, run, buf, w, 200 + w)
    run.spawn("sampler", sampler, run, buf, [u, pr], recent, L, True, 21)
    run.spawn("updater", updater, run, buf, pr, recent, 22)
    run.spawn("churner", churner, run, buf, L, 23, 8)
    run.spawn("inspector", inspector, run, buf, 24)
    run.spawn("persister", persister, run, buf, str(tmp_path), 25)
    samples = []  # (seconds since start, RSS)
    t0 = __import__("time").monotonic()
    for t in run.threads:
        t.start()
    samples.append((0.0, rss_bytes()))
    while not run.stop.wait(0.1):
        now = __import__("time").monotonic() - t0
        samples.append((now, rss_bytes()))
        if now >= SOAK_SECONDS:
            break
    run.stop.set()
    for t in run.threads:
        t.join(60)
        assert not t.is_alive(), f"thread {t.name} hangs"
    assert not run.errors, "\n".join(run.errors)
    buf._check()
    c = run.counts
    print(f"soak {SOAK_SECONDS:g} s: {dict(c)}")
    assert c["records"] > buf.capacity and c["batches"] and c["persisted"] and c["churn"], c
    if not ASAN:  # ASan's quarantine holds freed memory back on purpose
        q = SOAK_SECONDS / 4
        warm = max(r for t, r in samples if t <= q or t == samples[1 if len(samples) > 1 else 0][0])
        late = [r for t, r in samples if t >= 3 * q] or [samples[-1][1]]
        quarters = [max([r for t, r in samples if k * q <= t < (k + 1) * q] or [0]) / 2**20
                    for k in range(4)]
        print(f"RSS: warm-up peak {warm / 2**20:.1f} MiB, last quarter max "
              f"{max(late) / 2**20:.1f} MiB; peak per quarter "
              f"{', '.join(f'{x:.1f}' for x in quarters)} MiB; {len(samples)} samples")
        assert max(late) <= warm * 1.25 + (48 << 20), (warm, max(late))
