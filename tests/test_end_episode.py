"""ExperienceReplay.end_episode: an episode ended without a step
(docs/semantics.md, "Ending an episode without a step").

The differential machines (tests/test_differential.py) compare it with the
reference under random call sequences, tests/test_arg_agreement.py its
argument handling, tests/test_log.py its record in the experience log and
tests/test_threads.py runs it beside recording and sampling threads; these
are the direct checks.
"""

import copy
import pickle
import threading

import numpy as np
import pytest

from exreplay import ExperienceReplay, PickSelectorClass
from exreplay.reference import ReferenceReplay

U = PickSelectorClass.Uniform
P = PickSelectorClass.Prioritized
R = PickSelectorClass.Rank
IMPLS = (ExperienceReplay, ReferenceReplay)
SPEC = {"img": ((2, 2), "uint8"), "v": ((3,), "float32")}
XSPEC = {"logp": ((), "float32")}


def make(cls, pick_len=3, allow_short=False, named=False, **kw):
    cfg = dict(capacity=None, pick_len=pick_len, allow_short=allow_short, seed=11, **kw)
    if named:
        buf = cls(state_spec=SPEC, extras_spec=XSPEC, **cfg)
    else:
        buf = cls((2,), **cfg)
    sels = [buf.new_pick_selector(U), buf.new_pick_selector(P, alpha=0.7, beta=0.5),
            buf.new_pick_selector(R, alpha=0.7, beta=0.5)]
    return buf, sels


def states(T, tag, named=False):
    if named:
        return {"img": np.full((T, 2, 2), tag, np.uint8),
                "v": np.stack([np.arange(T, dtype=np.float32) + tag] * 3, 1)}
    s = np.full((T, 2), tag, np.float32)
    s[:, 1] = np.arange(T)
    return s


def one_state(tag, named=False):
    if named:
        return {"img": np.full((2, 2), tag, np.uint8), "v": np.full(3, tag, np.float32)}
    return np.full(2, tag, np.float32)


def rollout(buf, h, T, tag, named=False, prios=True, **kw):
    extra = {"extras": {"logp": np.full(T, -tag, np.float32)}} if named else {}
    pr = np.arange(1.0, T + 1) * (1 + tag) if prios else None
    return buf.record_many(h, states(T, tag, named), np.arange(T), np.ones(T) * tag,
                           priorities=pr, **extra, **kw)


def view(buf, sels):
    """What a caller sees: the records, ends, picks (in table order) and the
    stored priorities of every prioritized selector."""
    out = [len(buf), buf.num_episodes, buf.num_picks, buf._handles()]
    for h in buf._handles():
        e = buf.episode(h)
        fs = e.final_state
        out.append((h, _b(e.state), e.action.tobytes(), e.reward.tobytes(),
                    None if fs is None else _b(fs), bool(e.ended), bool(e.terminated)))
    epi, pos = buf._picks()
    out.append((epi.tolist(), pos.tolist()))
    for ps in sels[1:]:
        if len(epi):
            out.append(buf._priority(ps, epi, pos).tolist())
    return out


def _b(x):
    return b"".join(v.tobytes() for v in x.values()) if isinstance(x, dict) else x.tobytes()


def batch_bytes(b):
    return [_b(x) if isinstance(x, dict) else np.asarray(x).tobytes()
            for x in (b.state, b.action, b.reward, b.state_next, b.seq_len, b.seq_len_next,
                      b.pick_epi, b.pick_pos, b.weight)]


def ended_both_ways(cls, end_kw, **cfg):
    """Two buffers with the same calls, the last rollout ending with its
    record_many (a) or with end_episode after it (b)."""
    named = cfg.get("named", False)
    out = []
    for late in (False, True):
        buf, sels = make(cls, **cfg)
        h0 = rollout(buf, None, 5, 1, named, terminated=True)
        h = rollout(buf, None, 4, 2, named)
        if late:
            h = rollout(buf, h, 3, 3, named)
            assert buf.end_episode(h, **end_kw) is True
        else:
            h = rollout(buf, h, 3, 3, named, **end_kw)
        h2 = rollout(buf, None, 2, 4, named)
        out.append((buf, sels, (h0, h, h2)))
    return out


END_KWS = {
    "final": lambda named: {"final_state": one_state(9, named)},
    "final_terminated": lambda named: {"final_state": one_state(9, named), "terminated": True},
    "terminated": lambda named: {"terminated": True},
}


@pytest.mark.parametrize("cls", IMPLS)
@pytest.mark.parametrize("end", sorted(END_KWS))
@pytest.mark.parametrize("pick_len,allow_short", [(1, False), (3, False), (3, True), (8, True),
                                                  (8, False)])
@pytest.mark.parametrize("named", [False, True])
def test_the_same_as_the_last_record_carrying_the_end(cls, end, pick_len, allow_short, named):
    (a, sa, ha), (b, sb, hb) = ended_both_ways(cls, END_KWS[end](named), pick_len=pick_len,
                                               allow_short=allow_short, named=named)
    assert ha == hb
    assert view(a, sa) == view(b, sb)
    if cls is ExperienceReplay:
        assert a.serialize(0) == b.serialize(0)
    if a.num_picks:
        for ps_a, ps_b in zip(sa, sb):
            assert batch_bytes(a.get_batch(64, ps_a)) == batch_bytes(b.get_batch(64, ps_b))
    a._check()
    b._check()


@pytest.mark.parametrize("named", [False, True])
def test_c_and_reference_agree_after_an_end(named):
    """The episode's contents, and a batch the C buffer draws after the end
    against the reference's batch of the same picks (as the differential
    machines compare them)."""
    bufs = []
    for cls in IMPLS:
        buf, sels = make(cls, pick_len=2, allow_short=True, named=named)
        h = rollout(buf, None, 6, 1, named)
        assert buf.end_episode(h, final_state=one_state(7, named), terminated=True) is True
        rollout(buf, None, 3, 2, named, terminated=True)
        bufs.append((buf, sels))
    (c, cs), (r, rs) = bufs
    assert view(c, cs) == view(r, rs)
    ec, er = c.episode(h), r.episode(h)
    assert _b(ec.final_state) == _b(er.final_state) and ec.terminated and er.terminated
    for a, b in zip(cs, rs):
        cb = c.get_batch(64, a)
        rb = r._gather(b, cb.pick_epi, cb.pick_pos)
        assert batch_bytes(cb)[:-1] == batch_bytes(rb)[:-1]
        np.testing.assert_allclose(cb.weight, rb.weight, rtol=1e-6)
        assert (cb.pick_epi == h).any()


@pytest.mark.parametrize("cls", IMPLS)
def test_the_priorities_given_at_record_time_apply(cls):
    buf = cls((2,), capacity=None, pick_len=2, allow_short=True)
    p = buf.new_pick_selector(P, alpha=1.0, beta=0.0)
    rk = buf.new_pick_selector(R, alpha=0.7, beta=0.0)
    h = buf.record_many(None, np.zeros((4, 2), np.float32), [0] * 4, [0.0] * 4,
                        priorities=[1.0, 2.0, 3.0, 4.0])
    h = buf.record(h, np.zeros(2, np.float32), 0, 0.0, priority=5.0)
    assert buf.num_picks == 3  # positions 0..2: the last step has no next state yet
    assert buf.end_episode(h, terminated=True) is True
    assert buf.num_picks == 5  # 3 and 4 (short: allow_short) now exist
    got = buf._priority(p, np.full(5, h), np.arange(5))
    np.testing.assert_array_equal(got, [1.0, 2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(buf._priority(rk, np.full(5, h), np.arange(5)),
                                  [1.0, 2.0, 3.0, 4.0, 5.0])
    buf._check()


@pytest.mark.parametrize("cls", IMPLS)
def test_a_pending_maximum_is_the_maximum_at_the_end(cls):
    """A step recorded without a priority gets the selector's maximum so
    far when its pick comes to exist, as it would at a record's end."""
    buf = cls((2,), capacity=None, pick_len=1)
    p = buf.new_pick_selector(P, alpha=1.0, beta=0.0)
    h = buf.record_many(None, np.zeros((2, 2), np.float32), [0, 0], [0.0, 0.0])
    buf.record(None, np.zeros(2, np.float32), 0, 0.0, priority=6.0, terminated=True)
    assert buf.end_episode(h, terminated=True) is True
    np.testing.assert_array_equal(buf._priority(p, [h, h], [0, 1]), [1.0, 6.0])


def refusals(named):
    """(name, call) of end_episode calls that are refused, on a buffer whose
    episodes are 0 (ended), 1 (open, 3 steps) and 2 (open, empty)."""
    good = one_state(1, named)
    bad_shape = ({"img": np.zeros((2, 3), np.uint8), "v": np.zeros(3, np.float32)} if named
                 else np.zeros(3, np.float32))
    out = [
        ("ended", lambda b: b.end_episode(0, final_state=good)),
        ("no end", lambda b: b.end_episode(1)),
        ("no end (terminated=0)", lambda b: b.end_episode(1, final_state=None, terminated=0)),
        ("empty", lambda b: b.end_episode(2, terminated=True)),
        ("never created", lambda b: b.end_episode(3, terminated=True)),
        ("negative", lambda b: b.end_episode(-1, terminated=True)),
        ("beyond int64", lambda b: b.end_episode(2**70, terminated=True)),
        ("h None", lambda b: b.end_episode(None, terminated=True)),
        ("h float", lambda b: b.end_episode(1.0, terminated=True)),
        ("h bool", lambda b: b.end_episode(True, terminated=True)),
        ("terminated None", lambda b: b.end_episode(1, terminated=None)),
        ("terminated float", lambda b: b.end_episode(1, terminated=1.0)),
        ("final_state shape", lambda b: b.end_episode(1, final_state=bad_shape)),
        ("final_state complex", lambda b: b.end_episode(
            1, final_state={k: v.astype(np.complex64) for k, v in good.items()} if named
            else good.astype(np.complex64))),
        ("unknown keyword", lambda b: b.end_episode(1, final=good)),
        ("too many", lambda b: b.end_episode(1, good, True, 1.0)),
    ]
    if named:
        out.append(("final_state missing field", lambda b: b.end_episode(1, final_state={"img": good["img"]})))
        out.append(("final_state not a dict", lambda b: b.end_episode(1, final_state=np.zeros(2))))
    return out


def refusal_buffer(cls, named):
    buf, sels = make(cls, pick_len=2, named=named)
    rollout(buf, None, 3, 1, named, terminated=True)
    rollout(buf, None, 3, 2, named)
    assert buf.new_episode() == 2
    return buf, sels


@pytest.mark.parametrize("named", [False, True])
def test_every_refused_call_changes_nothing(named):
    kinds = {}
    for cls in IMPLS:
        for name, call in refusals(named):
            buf, sels = refusal_buffer(cls, named)
            before = view(buf, sels)
            raw = buf.serialize(0) if cls is ExperienceReplay else None
            with pytest.raises((TypeError, ValueError)) as e:
                call(buf)
            kinds.setdefault(name, []).append((type(e.value), str(e.value)))
            assert view(buf, sels) == before, name
            if raw is not None:
                assert buf.serialize(0) == raw, name
            buf._check()
    for name, got in kinds.items():
        assert got[0][0] is got[1][0], (name, got)
    # the messages name the argument, what was expected and what came
    msgs = {name: got[0][1] for name, got in kinds.items()}
    assert msgs["ended"] == "h: expected an open episode, got episode 0, which has ended"
    assert msgs["empty"] == ("h: expected an episode with a step to end (final_state is its last "
                             "step's next state), got episode 2, which has none")
    assert msgs["never created"] == ("h: expected the handle of an episode of this buffer, got 3, "
                                     "which no episode has had")
    assert msgs["beyond int64"].endswith("got %d, which no episode has had" % 2**70)
    assert msgs["final_state shape"].startswith("final_state")
    assert msgs["no end"] == ("final_state: expected a state, or terminated=True (an episode ends "
                              "with its last step's next state or as terminal), got None and "
                              "terminated=False")
    assert msgs["terminated None"].startswith("terminated: expected a bool")
    # the handle's own errors read the same in both
    for name in ("ended", "empty", "never created", "negative", "no end"):
        assert kinds[name][0][1] == kinds[name][1][1], name


@pytest.mark.parametrize("cls", IMPLS)
def test_an_evicted_or_removed_episode_has_nothing_to_end(cls):
    buf = cls((2,), capacity=6, pick_len=1)
    buf.new_pick_selector(U)
    h = buf.record_many(None, np.zeros((4, 2), np.float32), [0] * 4, [0.0] * 4)
    h2 = buf.record_many(None, np.zeros((4, 2), np.float32), [0] * 4, [0.0] * 4)
    assert h not in buf._handles()  # evicted by capacity
    before = view(buf, [None])
    assert buf.end_episode(h, final_state=np.ones(2, np.float32), terminated=True) is False
    assert view(buf, [None]) == before
    buf.remove_episode(h2)
    assert buf.end_episode(h2, terminated=True) is False
    # the argument checks come first, whatever the handle
    with pytest.raises(ValueError):
        buf.end_episode(h, final_state=np.ones(3, np.float32))
    with pytest.raises(ValueError, match="^final_state: expected a state, or terminated=True"):
        buf.end_episode(h)
    buf._check()


def _logged_ends(path):
    """{handle: (position, terminated, final state or None)} of the ends
    without a step in a log."""
    import exreplay.log as xlog

    out = {}
    for c in xlog.open(path):
        k = np.cumsum((c.flags & xlog.FLAG_FINAL) != 0) - 1
        for i in np.flatnonzero(c.flags & xlog.FLAG_NO_STEP):
            fin = c.final_states[k[i]].tolist() if c.flags[i] & xlog.FLAG_FINAL else None
            assert int(c.handles[i]) not in out, "an episode ended twice"
            out[int(c.handles[i])] = (int(c.positions[i]),
                                      bool(c.flags[i] & xlog.FLAG_TERMINATED), fin)
    return out


@pytest.mark.parametrize("level", [0, 1])
def test_the_end_of_an_evicted_episode_is_logged(tmp_path, level):
    """With a log attached, end_episode on an episode that capacity evicted
    while it was open returns False and changes nothing in the buffer, but
    logs the end it would have logged (at the episode's step count): the log
    holds the episode's steps, and a buffer rebuilt from it ends it as the
    caller said. So does an end of an episode removed while open."""
    from exreplay import ExperienceLog

    p = tmp_path / "ev.log"
    lg = ExperienceLog(p, level=level, chunk_bytes=200)
    buf = ExperienceReplay((2,), capacity=6, pick_len=1, log=lg)
    buf.new_pick_selector(U)
    h = buf.record_many(None, states(4, 1), np.arange(4), np.ones(4))
    h2 = buf.record_many(None, states(3, 2), np.arange(3), np.ones(3))  # evicts h, mid-way
    assert h not in buf._handles()
    before = buf.serialize(0)
    fin = np.array([7.0, -7.0], np.float32)
    assert buf.end_episode(h, final_state=fin, terminated=True) is False
    assert buf.serialize(0) == before
    assert buf.end_episode(h, terminated=True) is False  # an episode ends once
    buf.remove_episode(h2)
    assert buf.end_episode(h2, final_state=fin + 1) is False
    lg.close()
    assert _logged_ends(p) == {h: (4, True, fin.tolist()), h2: (3, False, (fin + 1).tolist())}
    big = ExperienceReplay.from_log(p, capacity=None, pick_len=1)
    eps = [big.episode(x) for x in big._handles()]
    assert [(len(e.reward), e.ended, e.terminated) for e in eps] == [(4, True, True),
                                                                     (3, True, False)]
    assert eps[0].final_state.tolist() == fin.tolist()
    assert eps[1].final_state.tolist() == (fin + 1).tolist()
    assert np.array_equal(eps[0].state, states(4, 1)) and np.array_equal(eps[1].state,
                                                                          states(3, 2))
    big._check()


def test_an_evicted_episode_that_had_ended_logs_no_second_end(tmp_path):
    """An episode that had ended before it went, or that went while no log
    was attached, or had no step, logs nothing: end_episode returns False."""
    from exreplay import ExperienceLog

    p = tmp_path / "ev.log"
    lg = ExperienceLog(p)
    buf = ExperienceReplay((2,), capacity=4, pick_len=1)
    quiet = buf.record_many(None, states(3, 0), np.arange(3), np.ones(3))
    other = buf.record_many(None, states(2, 1), [0, 1], [1.0, 1.0], terminated=True)
    assert quiet not in buf._handles()  # evicted open, no log attached
    buf.attach_log(lg)
    ended = buf.record_many(None, states(1, 2), [0], [1.0], terminated=True)
    empty = buf.new_episode()
    buf.record_many(None, states(4, 3), np.arange(4), np.ones(4))  # evicts other, ended
    buf.remove_episode(empty)
    assert not {quiet, other, ended, empty} & set(buf._handles())
    for x in (quiet, other, ended, empty):
        assert buf.end_episode(x, terminated=True) is False
    lg.close()
    assert _logged_ends(p) == {}


def _named_buf(log, capacity):
    return ExperienceReplay(state_spec={"img": ((2, 2), "uint8"), "v": ((3,), "float32")},
                            extras_spec=XSPEC, capacity=capacity, pick_len=1, log=log)


@pytest.mark.parametrize("named", [False, True])
def test_a_record_into_an_evicted_handle_ends_its_episode_in_the_log(tmp_path, named):
    """A record into a handle whose episode went open under a log continues
    that episode's trajectory in a new one: the log ends the old one, not
    terminated, with the new step's state as its final state, so that its
    last transition is whole; an end_episode on the handle afterwards logs
    nothing more, and a record with None ends nothing."""
    from exreplay import ExperienceLog

    p = tmp_path / "cont.log"
    lg = ExperienceLog(p, chunk_bytes=200)
    buf = _named_buf(lg, 6) if named else ExperienceReplay((2,), capacity=6, pick_len=1, log=lg)
    buf.new_pick_selector(U)
    h = rollout(buf, None, 4, 1, named, prios=False)
    rollout(buf, None, 3, 2, named, prios=False)  # evicts h, open, mid-way
    assert h not in buf._handles()
    nxt = one_state(9, named)
    extra = {"extras": {"logp": np.float32(0)}} if named else {}
    h3 = buf.record(h, nxt, 0, 1.0, **extra)
    assert h3 != h and buf.episode(h3).reward.tolist() == [1.0]
    assert buf.end_episode(h, terminated=True) is False  # its end came with the record
    buf.record(None, one_state(5, named), 0, 1.0, **extra)
    lg.close()
    if not named:
        assert _logged_ends(p) == {h: (4, False, nxt.tolist())}
    big = ExperienceReplay.from_log(p, capacity=None, pick_len=1)
    first = big.episode(big._handles()[0])
    assert (len(first.reward), first.ended, first.terminated) == (4, True, False)
    if named:  # the final state field by field
        assert {k: v.tolist() for k, v in first.final_state.items()} == {
            k: v.tolist() for k, v in nxt.items()}
    else:
        assert first.final_state.tolist() == nxt.tolist()
    assert [big.episode(x).ended for x in big._handles()[1:]] == [False, False, False]
    big._check()


def _gone_under_a_detached_log(path):
    """A buffer whose first episode (4 steps, handle h) went open under a
    log at path, which is then detached and closed: (buf, h, the states)."""
    from exreplay import ExperienceLog

    lg = ExperienceLog(path)
    buf = ExperienceReplay((2,), capacity=6, pick_len=1, log=lg)
    buf.new_pick_selector(U)
    s = states(7, 4)
    h = buf.record_many(None, s[:4], np.arange(4), np.ones(4))
    buf.record_many(None, s[4:7], np.arange(3), np.ones(3))  # evicts h, open
    assert h not in buf._handles()
    buf.detach_log()
    lg.close()
    return buf, h, s


def test_an_end_goes_to_the_log_attached_when_the_caller_goes_on(tmp_path):
    """Logs rotated (detach one, attach the next) while an episode that went
    open under the first is no longer held: a record into its handle under
    the second logs its end there (the end is part of the stream the caller
    records, whichever file takes it), so the second file alone skips it
    (ingest holds no such episode open) and the two merged rebuild the
    episode whole and ended."""
    import exreplay.log as xlog
    from exreplay import ExperienceLog

    pa, pb, pm = tmp_path / "a.log", tmp_path / "b.log", tmp_path / "m.log"
    buf, h, s = _gone_under_a_detached_log(pa)
    lb = ExperienceLog(pb)
    buf.attach_log(lb)
    nxt = states(1, 9)[0]
    buf.record(h, nxt, 0, 1.0)
    lb.close()
    assert _logged_ends(pa) == {}
    assert _logged_ends(pb) == {h: (4, False, nxt.tolist())}
    alone = ExperienceReplay.from_log(pb, capacity=None, pick_len=1)
    assert [len(alone.episode(x).reward) for x in alone._handles()] == [1]
    xlog.merge([pa, pb], pm)
    big = ExperienceReplay.from_log(pm, capacity=None, pick_len=1)
    first = big.episode(big._handles()[0])
    assert (len(first.reward), first.ended, first.terminated) == (4, True, False)
    assert first.final_state.tolist() == nxt.tolist()
    assert np.array_equal(first.state, s[:4])
    big._check()


def test_a_record_without_a_log_makes_the_end_a_later_log_would_log(tmp_path):
    """An episode that went open under a log, continued by a record into its
    handle while no log is attached: its end is made then (not logged), so
    a log attached afterwards logs no end for it, by end_episode or by
    another record into the handle."""
    from exreplay import ExperienceLog

    pa, pb = tmp_path / "a.log", tmp_path / "b.log"
    buf, h, _ = _gone_under_a_detached_log(pa)
    h2 = buf.record(h, states(1, 9)[0], 0, 1.0)  # goes on: the end is made, unlogged
    lb = ExperienceLog(pb)
    buf.attach_log(lb)
    assert buf.end_episode(h, terminated=True) is False
    buf.record(h, states(1, 8)[0], 0, 1.0)
    buf.end_episode(h2, terminated=True)
    lb.close()
    assert _logged_ends(pa) == {}
    assert set(_logged_ends(pb)) == {h2}
    buf._check()


def test_a_rollout_that_evicts_its_own_episode_ends_it_in_the_log(tmp_path):
    """record_many whose steps evict the episode they go into goes on in a
    new episode; under a log the evicted one ends there, not terminated,
    with the state of the step that went on, and a buffer rebuilt from the
    log holds both parts, the first ended."""
    from exreplay import ExperienceLog

    p = tmp_path / "self.log"
    lg = ExperienceLog(p)
    buf = ExperienceReplay((2,), capacity=4, pick_len=1, log=lg)
    buf.new_pick_selector(U)
    s = states(6, 3)
    h = buf.record_many(None, s[:3], np.arange(3), np.ones(3))
    h2 = buf.record_many(h, s[3:], np.arange(3), np.ones(3))  # evicts h at its 5th step
    assert h2 != h and h not in buf._handles()
    n_old = 6 - len(buf.episode(h2).reward)
    lg.close()
    assert _logged_ends(p) == {h: (n_old, False, s[n_old].tolist())}
    big = ExperienceReplay.from_log(p, capacity=None, pick_len=1)
    eps = [big.episode(x) for x in big._handles()]
    assert [(len(e.reward), e.ended) for e in eps] == [(n_old, True), (6 - n_old, False)]
    assert eps[0].final_state.tolist() == s[n_old].tolist()
    assert np.array_equal(np.concatenate([eps[0].state, eps[1].state]), s)
    big._check()


@pytest.mark.parametrize("cls", IMPLS)
def test_record_after_the_end_starts_a_new_episode(cls):
    buf = cls((2,), capacity=None, pick_len=1)
    h = buf.record(None, np.zeros(2, np.float32), 0, 0.0)
    assert buf.end_episode(h, terminated=True)
    h2 = buf.record(h, np.zeros(2, np.float32), 0, 0.0)
    assert h2 == h + 1 and buf.episode(h).ended and not buf.episode(h2).ended


@pytest.mark.parametrize("named", [False, True])
def test_persistence_round_trips(named):
    (a, sa, _), (b, sb, _) = ended_both_ways(
        ExperienceReplay, END_KWS["final_terminated"](named), pick_len=2, named=named)
    restored = [ExperienceReplay.unserialize(b.serialize(6)), pickle.loads(pickle.dumps(b)),
                copy.deepcopy(b)]
    for r in restored:
        rs = [r.pick_selector(int(ps)) for ps in sb]
        assert view(r, rs) == view(a, sa)
        assert r.serialize(0) == a.serialize(0)
        r._check()
    for r in restored:
        for ps_r, ps_a in zip([r.pick_selector(int(ps)) for ps in sb], sa):
            assert batch_bytes(r.get_batch(16, ps_r)) == batch_bytes(
                copy.deepcopy(a).get_batch(16, int(ps_a)))


def test_an_end_waits_for_a_record_copying_into_the_episode():
    """A large rollout copies its rows without the lock (its episode busy):
    an end_episode of that episode from another thread comes after it,
    never inside it (docs/design.md, "Locking and the GIL")."""
    buf = ExperienceReplay((64,), capacity=None, pick_len=4)
    buf.new_pick_selector(U)
    for _ in range(20):
        h = buf.record(None, np.zeros(64, np.float32), 0, 0.0)
        T = 4000  # 1 MB of rows: copied without the lock
        go = threading.Barrier(2)
        res = {}

        def writer():
            go.wait()
            buf.record_many(h, np.ones((T, 64), np.float32), np.arange(T), np.ones(T))

        def ender():
            go.wait()
            res["ended"] = buf.end_episode(h, terminated=True)

        ts = [threading.Thread(target=writer), threading.Thread(target=ender)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        e = buf.episode(h)
        assert res["ended"] is True and e.ended and e.terminated
        # either the rollout went first (and the end after it), or the end
        # went first and the rollout started a new episode
        assert len(e.action) in (1, T + 1)
        buf._check()
