"""ShardedReplay refuses bad input before routing any of it (no Ray: stand-in
shards that answer at once, note every call they are sent, and, as Ray does,
hand back a call's error only when its result is fetched).

A call that the replay routes in parts (set_priority: each shard its picks;
record_rollout: each shard its episode pieces) must not be refused by one
shard after another has applied its part: bad input is a clear error
(naming the argument, what was expected, what came) raised before anything
is sent, and every shard stays as it was. set_priority's arguments follow
the buffer's own rules and messages (docs/api.md, set_priority)."""

import math
import os
import re

import numpy as np
import pytest

import exreplay
import exreplay.ray as xray
from exreplay._args import type_name
from exreplay.ray import ReplayServer, Rollout
from exreplay.reference import ReferenceReplay
from fake_ray import FakeRay as _FakeRay
from fake_ray import Local as _Local
from fake_ray import Method as _Method
from test_ray_pick_index import KW, SEL, _episodes, _stored


class _Ref:
    """A call's result, or its error, raised when fetched (ray.get)."""

    def __init__(self, f, args, kwargs):
        try:
            self._value, self._error = f(*args, **kwargs), None
        except Exception as e:
            self._value, self._error = None, e

    @property
    def value(self):
        if self._error is not None:
            raise self._error
        return self._value


class _Noting:
    """A ReplayActor's stand-in: server.f(...) run at once for .f.remote(...),
    each call noted in `calls` as (method name, shard)."""

    def __init__(self, server, k, calls):
        self.server, self.k, self.calls = server, k, calls

    def __getattr__(self, name):
        f = getattr(self.server, name)

        def remote(*args, **kwargs):
            self.calls.append((name, self.k))
            return _Ref(f, args, kwargs)

        return _Method(remote)


def _sharded(monkeypatch, impl, n=3, seed=0):
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    servers = [ReplayServer(impl=impl, selectors=SEL, seed=seed + i, **KW) for i in range(n)]
    _episodes([servers])
    calls = []
    sh = xray.ShardedReplay(actors=[_Noting(s, i, calls) for i, s in enumerate(servers)], seed=1)
    return sh, servers, calls


def _state(servers):
    """Everything a refused call must leave as it was on each shard: its
    picks, their stored priorities, the records held."""
    return [(*_stored(s), len(s.buf), s.buf.num_episodes) for s in servers]


def _assert_same(before, after):
    for k, (x, y) in enumerate(zip(before, after)):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v, err_msg=f"shard {k}")


def _buffer_error(args, kwargs):
    """The error (type, message) of the C buffer's own set_priority."""
    buf = exreplay.ExperienceReplay(**KW)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized, alpha=1.0, beta=0.4)
    try:
        buf.set_priority(ps, *args, **kwargs)
    except (TypeError, ValueError) as e:
        return type(e), str(e)
    raise AssertionError(f"the buffer takes {args!r}")


def _bad_updates(b, last):
    """(what, pick_epi, pick_pos, priorities, pick_index) the buffer refuses;
    a bad priority sits at row `last`, a pick of the shard sent its part last."""
    epi, pos, idx, B = b.pick_epi, b.pick_pos, b.pick_index, len(b.pick_epi)
    good = np.linspace(0.5, 3.0, B)

    def at_last(v):
        p = good.copy()
        p[last] = v
        return p

    def wrapping(a):  # a uint64 copy of a whose value at `last` int64 cannot hold
        a = a.astype(np.uint64)
        a[last] = 2**64 - 1
        return a

    return [
        ("float pick_epi", epi.astype(np.float64), pos, good, None),  # was truncated
        ("list of floats pick_epi", [float(e) for e in epi], pos, good, None),
        ("float pick_pos", epi, pos.astype(np.float32), good, None),
        ("2-D pick_epi", epi[None], pos[None], good, None),
        ("scalar pick_epi", int(epi[0]), int(pos[0]), 1.0, None),
        ("pick_pos of another length", epi, pos[:-1], good, None),
        ("pick_epi None", None, pos, good, None),
        ("bool pick_epi", np.ones(B, bool), pos, good, None),  # was read as handles 0 and 1
        ("bool pick_pos", epi, pos.astype(bool), good, None),
        ("uint64 pick_epi beyond int64", wrapping(epi), pos, good, None),  # was wrapped
        ("uint64 pick_pos beyond int64", epi, wrapping(pos), good, None),
        ("NaN priority", epi, pos, at_last(math.nan), None),  # was refused by one shard only
        ("negative priority", epi, pos, at_last(-1.0), None),
        ("infinite priority", epi, pos, at_last(math.inf), None),
        ("NaN scalar", epi, pos, math.nan, None),
        ("negative scalar", epi, pos, -2, None),
        ("priorities of another length", epi, pos, good[:-1], None),
        ("2-D priorities", epi, pos, good[:, None], None),
        ("bool priorities", epi, pos, True, None),
        ("bool array priorities", epi, pos, np.ones(B, bool), None),
        ("str priorities", epi, pos, "1.5", None),  # was cast to 1.5
        ("complex priorities", epi, pos, good + 0j, None),
        ("priorities None", epi, pos, None, None),
        ("float pick_index", epi, pos, good, idx.astype(np.float64)),
        ("pick_index of another length", epi, pos, good, idx[:-1]),
        ("bool pick_index", epi, pos, good, idx.astype(bool)),
        ("uint64 pick_index beyond int64", epi, pos, good, wrapping(idx)),
    ]


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_set_priority_refuses_bad_input_before_any_shard(monkeypatch, impl):
    sh, servers, calls = _sharded(monkeypatch, impl)
    b = sh.get_batch(48, 0)
    shard, _ = sh.decode(b.pick_epi)
    assert len(set(shard.tolist())) == 3
    last = int(np.flatnonzero(shard == shard.max())[0])
    before = _state(servers)
    for what, epi, pos, pri, idx in _bad_updates(b, last):
        kwargs = {} if idx is None else {"pick_index": idx}
        exc, msg = _buffer_error((epi, pos, pri), kwargs)
        for wait in (True, False):
            calls.clear()
            with pytest.raises(exc) as got:
                sh.set_priority(0, epi, pos, pri, wait=wait, **kwargs)
            assert str(got.value) == msg, what
            assert calls == [], what
            _assert_same(before, _state(servers))
    # ps: no handle (the buffer's TypeError), or none of the shards' selectors
    for ps, exc, msg in ((0.0, TypeError, "ps: expected a PickSelector or an int handle, got float"),
                         (True, TypeError, "ps: expected a PickSelector or an int handle, got bool"),
                         (3, ValueError, "ps: expected a pick selector of the shards, [0], got unknown handle 3")):
        calls.clear()
        with pytest.raises(exc) as got:
            sh.set_priority(ps, b.pick_epi, b.pick_pos, 1.0, wait=True)
        assert str(got.value) == msg
        assert calls == []
        _assert_same(before, _state(servers))


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_set_priority_takes_what_the_buffer_takes(monkeypatch, impl):
    """Lists of Python ints, any int and float dtype castable under
    same_kind, a scalar, a 0-d array: applied as the int64 and float64
    arrays are, on every shard."""
    sh, servers, _ = _sharded(monkeypatch, impl)
    tw, twins, _ = _sharded(monkeypatch, impl)
    b, tb = sh.get_batch(32, 0), tw.get_batch(32, 0)
    np.testing.assert_array_equal(b.pick_epi, tb.pick_epi)
    p = np.linspace(0.5, 3.0, 32)
    for args, twin_args in (
            ((b.pick_epi.tolist(), b.pick_pos.astype(np.int32), p.astype(np.float32).tolist()),
             (tb.pick_epi, tb.pick_pos, p.astype(np.float32).astype(np.float64))),
            ((b.pick_epi.astype(np.uint32), b.pick_pos.tolist(), 2), (tb.pick_epi, tb.pick_pos, 2.0)),
            ((b.pick_epi, b.pick_pos, np.array(0.75)), (tb.pick_epi, tb.pick_pos, 0.75))):
        n = sh.set_priority(0, *args, wait=True, pick_index=b.pick_index.tolist())
        assert n == tw.set_priority(0, *twin_args, wait=True) == 32
        _assert_same(_state(servers), _state(twins))


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_record_rollout_refuses_a_bad_priority_before_any_shard(monkeypatch, impl):
    """A rollout whose pieces go to two shards, with a NaN priority in the
    second one's: refused before either is sent anything (the second shard
    alone would refuse it, after the first had recorded its piece); the
    stream's routing and numbering are untouched, so the rollout sent again
    with good priorities goes in whole."""
    sh, servers, calls = _sharded(monkeypatch, impl, n=2)
    T = 10
    s = np.zeros((T, 4), np.float32)
    s[:, 0], s[:, 1] = 99, np.arange(T)
    good = np.linspace(0.5, 2.0, T)
    bad = good.copy()
    bad[7] = math.nan
    before = _state(servers)
    records = [x.stats()["records"] for x in servers]
    for pr, what in ((bad, "nan at index 7"), (-good, "-0.5 at index 0")):
        r = Rollout(s, np.zeros(T, np.int64), np.ones(T), pr, ends=[5], terminated=[True])
        for wait in (True, False):
            calls.clear()
            with pytest.raises(ValueError, match=rf"^priorities: expected finite numbers >= 0, got {what}$"):
                sh.record_rollout("w", r, wait=wait)
            assert calls == []
            _assert_same(before, _state(servers))
        calls.clear()
        with pytest.raises(ValueError, match=rf"^priorities: expected finite numbers >= 0, got {what}$"):
            sh.record_episode(s, np.zeros(T, np.int64), np.ones(T), terminated=True, priorities=pr, wait=True)
        assert calls == []
        _assert_same(before, _state(servers))
    assert [x.stats()["records"] for x in servers] == records
    r = Rollout(s, np.zeros(T, np.int64), np.ones(T), good, ends=[5], terminated=[True])
    assert sh.record_rollout("w", r, wait=True) == T  # seq 0 on each shard: none was used
    assert sorted(k for _, k in calls) == [0, 1]
    assert sum(len(x.buf) for x in servers) == sum(x[3] for x in before) + T


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_get_batch_and_set_beta_check_ps_first(monkeypatch, impl):
    """ps that is no handle, or none of the shards' selectors, is refused
    before any shard is asked (int(ps) truncated a float handle);
    priority_stats too (it asked every shard)."""
    sh, servers, calls = _sharded(monkeypatch, impl)
    for ps, exc in ((0.5, TypeError), (1, ValueError), (None, TypeError)):
        for call in (lambda: sh.get_batch(8, ps), lambda: sh.set_beta(ps, 0.5),
                     lambda: sh.priority_stats(ps)):
            calls.clear()
            with pytest.raises(exc, match="^ps: expected "):
                call()
            assert calls == []
    assert sh._selectors[0][2] == 0.4  # set_beta changed nothing


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_set_beta_checks_beta_before_any_shard(monkeypatch, impl):
    """set_beta's beta is checked as the buffer's PickSelector.beta takes
    it, with the C buffer's error, before any shard is sent anything (it was
    sent unchecked, so every shard refused it, or the reference's shards
    with messages of their own); a uniform selector has no beta. A beta
    taken reaches every shard as the float the buffer keeps."""
    sh, servers, calls = _sharded(monkeypatch, impl)
    buf = exreplay.ExperienceReplay(**KW)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    for bad in (-1, -0.5, math.nan, math.inf, "0.5", None, True, np.bool_(False), 1j,
                np.array([0.5]), 2**2000, [0.5]):
        want = _own_error(lambda: setattr(ps, "beta", bad))
        calls.clear()
        with pytest.raises(want[0]) as got:
            sh.set_beta(0, bad)
        assert str(got.value) == want[1], repr(bad)
        assert calls == [], repr(bad)
        assert [s.selectors()[0][2] for s in servers] == [0.4] * 3
    assert sh._selectors[0][2] == 0.4
    sh.set_beta(0, np.float32(0.75))
    assert sh._selectors[0][2] == 0.75 and [s.selectors()[0][2] for s in servers] == [0.75] * 3
    # a uniform selector: the buffer's error, and no shard asked
    servers = [ReplayServer(impl=impl, selectors=["uniform"], **KW) for _ in range(2)]
    calls = []
    sh = xray.ShardedReplay(actors=[_Noting(s, i, calls) for i, s in enumerate(servers)])
    calls.clear()
    want = _own_error(lambda: setattr(buf.new_pick_selector(0), "beta", 0.5))
    with pytest.raises(want[0]) as got:
        sh.set_beta(0, 0.5)
    assert str(got.value) == want[1] and calls == []


_BAD_COUNTS = [  # (batch_size, n_batches, error, message start)
    (2.5, None, TypeError, "batch_size: expected an int in [1, 2**63 - 1], got float"),
    (0, None, ValueError, "batch_size: expected an int in [1, 2**63 - 1], got 0"),
    (True, None, TypeError, "batch_size: expected an int in [1, 2**63 - 1], got bool"),
    (8, 2.5, TypeError, "n_batches: expected None or an int in [1, 2**63 - 1], got float"),
    (8, 0, ValueError, "n_batches: expected None or an int in [1, 2**63 - 1], got 0"),
    (8, -2, ValueError, "n_batches: expected None or an int in [1, 2**63 - 1], got -2"),
    (1 << 40, 1 << 30, ValueError, "n_batches: expected batch_size * n_batches at most"),
]


@pytest.mark.parametrize("impl", ["c", "reference"])
@pytest.mark.parametrize("case", _BAD_COUNTS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_get_batch_counts_checked_before_any_draw(monkeypatch, impl, case):
    """ReplayServer.get_batch and ShardedReplay.get_batch check batch_size
    and n_batches before anything is drawn: a float is refused (it was
    truncated: n_batches=2.5 drew 2 batches), n_batches=0 is named as
    n_batches (it was reported as batch_size), and the selectors' generators
    are left where they were: the next batch is the one a twin that never
    got the call draws."""
    batch_size, n_batches, err, msg = case
    srv, twin = (ReplayServer(impl=impl, selectors=SEL, seed=3, **KW) for _ in range(2))
    _episodes([[srv], [twin]])
    with pytest.raises(err) as e:
        srv.get_batch(batch_size, 0, n_batches)
    assert str(e.value).startswith(msg), str(e.value)
    np.testing.assert_array_equal(srv.get_batch(16, 0).pick_epi, twin.get_batch(16, 0).pick_epi)
    sh, servers, calls = _sharded(monkeypatch, impl)
    tw, _, _ = _sharded(monkeypatch, impl)
    with pytest.raises(err) as e:
        sh.get_batch(batch_size, 0, n_batches)
    assert str(e.value).startswith(msg), str(e.value)
    assert not [c for c in calls if c[0] == "get_batch"]  # no shard drew
    np.testing.assert_array_equal(sh.get_batch(16, 0).pick_epi, tw.get_batch(16, 0).pick_epi)


def test_rollout_converts_priorities_and_ends_by_the_buffers_rule():
    """Rollout's priorities are converted as record_many converts them
    (strings were parsed, bools taken as 0 and 1), and its ends must be
    integers (a float index was truncated): the buffer's TypeErrors, at
    construction, before anything is sent."""
    s, a, r = np.zeros((2, 4), np.float32), np.zeros(2, np.int64), np.zeros(2, np.float32)
    buf = exreplay.ExperienceReplay((4,), capacity=100)
    for p in (np.array(["1", "2"]), ["1.5", "2"], np.array([1 + 1j, 2]), np.array([True, False])):
        with pytest.raises(TypeError) as mine:
            Rollout(s, a, r, priorities=p)
        with pytest.raises(TypeError) as theirs:
            buf.record_many(None, s, a, r, priorities=p)
        assert str(mine.value) == str(theirs.value)
    with pytest.raises(TypeError, match=r"ends: expected row indices \(integers\), got float64"):
        Rollout(s, a, r, ends=[1.5], terminated=[True])
    ok = Rollout(s, a, r, priorities=np.array([1, 2], np.int32), ends=np.array([2], np.uint8),
                 terminated=[True])
    assert ok.priorities.dtype == np.float64 and ok.ends.tolist() == [2]
    assert Rollout(s, a, r, ends=[]).ends.dtype == np.int64


_DECODE_EXPECTED = "an integer array, a list of ints or an int, in [0, 2**63 - 1] (a sharded batch's pick_epi)"


def test_decode_takes_integers_only(monkeypatch):
    """decode takes what a sharded batch gives (its integer pick_epi, as an
    array of any integer dtype, a list of ints, one int or NumPy integer)
    and refuses the rest naming pick_epi: a float was truncated, a string
    parsed and a bool taken as 0 or 1. A sharded pick_epi is epi * n + shard
    with epi a handle (0, 1, 2, ...), never below 0: a ValueError."""
    sh, _, calls = _sharded(monkeypatch, "c")
    b = sh.get_batch(48, 0)
    e = b.pick_epi
    shard, epi = e % 3, e // 3
    for v in (e, e.astype(np.int32), e.astype(np.uint64), e.tolist(), tuple(e.tolist()),
              [np.int64(x) for x in e]):
        got = sh.decode(v)
        np.testing.assert_array_equal(got[0], shard)
        np.testing.assert_array_equal(got[1], epi)
        assert got[0].dtype == got[1].dtype == np.int64
    for v in (int(e[0]), e[0], np.uint8(e[0]), np.array(e[0])):
        assert sh.decode(v) == (shard[0], epi[0])
    assert [x.tolist() for x in sh.decode([])] == [[], []]
    calls.clear()
    for v, exc, msg in (
            (e.astype(np.float64), TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got numpy.ndarray "
                                              f"of dtype float64 and shape (48,)"),
            (np.ones(3, bool), TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got numpy.ndarray "
                                          f"of dtype bool and shape (3,)"),
            (np.array(["4"]), TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got numpy.ndarray "
                                         f"of dtype <U1 and shape (1,)"),
            ([4.0, 5.0], TypeError, "pick_epi[0]: expected an int in [0, 2**63 - 1], got float"),
            ([4, True], TypeError, "pick_epi[1]: expected an int in [0, 2**63 - 1], got bool"),
            (["4"], TypeError, "pick_epi[0]: expected an int in [0, 2**63 - 1], got str"),
            (4.7, TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got float"),
            (np.float64(4.0), TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got numpy.float64"),
            ("4", TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got str"),
            (True, TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got bool"),
            (np.True_, TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got {type_name(np.True_)}"),
            (None, TypeError, f"pick_epi: expected {_DECODE_EXPECTED}, got NoneType"),
            (-1, ValueError, f"pick_epi: expected {_DECODE_EXPECTED}, got -1"),
            (np.array([3, -2]), ValueError, f"pick_epi: expected {_DECODE_EXPECTED}, got -2 at index 1"),
            (np.array([2**63], np.uint64), ValueError,
             f"pick_epi: expected {_DECODE_EXPECTED}, got 9223372036854775808 at index 0"),
            ([3, -2], ValueError, "pick_epi[1]: expected an int in [0, 2**63 - 1], got -2"),
            ([2**70], ValueError, f"pick_epi[0]: expected an int in [0, 2**63 - 1], got {2**70}")):
        with pytest.raises(exc) as got:
            sh.decode(v)
        assert str(got.value) == msg, repr(v)
    assert calls == []


def test_rollout_terminated_flags_by_the_buffers_rule():
    """Rollout's terminated flags are taken as the buffer takes its own
    terminated (a bool, a NumPy bool, an int or a NumPy integer), at construction: a string
    or a float was cast by bool() ("no" and 0.5 ended the episode as
    terminated) and is now the buffer's TypeError, naming its row."""
    s, a, r = np.zeros((4, 4), np.float32), np.zeros(4, np.int64), np.zeros(4, np.float32)
    fin = np.zeros((2, 4), np.float32)
    buf = exreplay.ExperienceReplay((4,), capacity=100)
    for bad in ("no", 0.5, None, np.array(1)):
        with pytest.raises(TypeError) as mine:
            Rollout(s, a, r, ends=[2, 4], final_states=fin, terminated=[True, bad])
        with pytest.raises(TypeError) as theirs:
            buf.record_many(None, s, a, r, final_state=fin[0], terminated=bad)
        assert str(mine.value) == str(theirs.value).replace("terminated", "terminated[1]", 1)
    for bad, what in ((np.array([1.0, 0.0]), "numpy.ndarray of dtype float64 and shape (2,)"),
                      (np.array([1, 0], "m8[s]"), "numpy.ndarray of dtype timedelta64[s] and shape (2,)"),
                      (True, "bool"), ("no", "str")):
        with pytest.raises(TypeError, match=r"^terminated: expected None, a bool or integer array or a "
                                            rf"list of flags \(one per end\), got {re.escape(what)}$"):
            Rollout(s, a, r, ends=[2, 4], final_states=fin, terminated=bad)
    with pytest.raises(ValueError, match=r"^terminated: expected shape \(2,\) \(one flag per end\), got \(2, 1\)$"):
        Rollout(s, a, r, ends=[2, 4], final_states=fin, terminated=np.ones((2, 1), bool))
    for ok, want in (([True, 0], [True, False]), ((np.False_, 2), [False, True]),
                     ((np.int64(1), np.uint8(0)), [True, False]),
                     (np.array([False, True]), [False, True]), (None, [True, True]),
                     # an integer array as the list of its items (it was refused)
                     (np.array([0, 3]), [False, True]), (np.array([1, 0], np.uint8), [True, False])):
        got = Rollout(s, a, r, ends=[2, 4], final_states=fin, terminated=ok).terminated
        assert got.dtype == np.bool_ and got.tolist() == want


_BAD_FLAGS = ("no", "", 0.5, None, np.array(1), np.array([True]))


def _flag_error(name, bad):
    """The buffer's own TypeError for a flag (record_many's terminated),
    worded for `name`."""
    buf = exreplay.ExperienceReplay(**KW)
    with pytest.raises(TypeError) as e:
        buf.record_many(None, np.zeros((1, 4), np.float32), [0], [0.0], terminated=bad)
    assert str(e.value).startswith("terminated: ")
    return name + str(e.value)[len("terminated"):]


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_sharded_flags_checked_before_anything_is_sent(monkeypatch, impl):
    """wait (record_rollout, record_episode, set_priority), record_episode's
    terminated and get_batch's fresh_stats are flags as the buffer takes its
    own (a bool, a NumPy bool, an int or a NumPy integer): anything else is the
    buffer's TypeError naming the argument, raised before any shard is sent
    anything, with the stream's routing and the replay's generator as they
    were. They were used as truth values: wait="no" waited, and a string
    terminated ended the episode as terminated."""
    sh, servers, calls = _sharded(monkeypatch, impl, n=2)
    tw, _, _ = _sharded(monkeypatch, impl, n=2)
    b, _ = sh.get_batch(16, 0), tw.get_batch(16, 0)
    T = 6
    s = np.zeros((T, 4), np.float32)
    s[:, 0] = 99
    a, rew = np.zeros(T, np.int64), np.ones(T)
    r = Rollout(s, a, rew, ends=[3], terminated=[True])
    before = _state(servers)
    for bad in _BAD_FLAGS:
        for name, call in (
                ("wait", lambda: sh.record_rollout("w", r, wait=bad)),
                ("wait", lambda: sh.record_episode(s, a, rew, wait=bad)),
                ("terminated", lambda: sh.record_episode(s, a, rew, terminated=bad, wait=True)),
                ("wait", lambda: sh.set_priority(0, b.pick_epi, b.pick_pos, 2.0, wait=bad)),
                ("fresh_stats", lambda: sh.get_batch(8, 0, fresh_stats=bad))):
            calls.clear()
            with pytest.raises(TypeError) as got:
                call()
            assert str(got.value) == _flag_error(name, bad), (name, bad)
            assert calls == [], (name, bad)
            _assert_same(before, _state(servers))
    assert sh._streams == {}  # no stream was routed
    np.testing.assert_array_equal(sh.get_batch(16, 0).pick_epi, tw.get_batch(16, 0).pick_epi)
    # what the buffer takes: a bool, a NumPy bool, an int, a NumPy integer
    assert sh.record_rollout("w", r, wait=np.int64(1)) == T
    assert isinstance(sh.record_rollout("w", r, wait=0), list)
    assert sh.record_episode(s, a, rew, final_state=s[0], terminated=0, wait=1) == T
    assert isinstance(sh.set_priority(0, b.pick_epi, b.pick_pos, 2.0, wait=np.False_), list)
    assert sh.set_priority(0, b.pick_epi, b.pick_pos, 2.0, wait=np.True_) == 16
    assert len(sh.get_batch(8, 0, fresh_stats=0).pick_epi) == 8
    eps = [x.buf.episode(h) for x in servers for h in x.buf._handles()]
    ended = [e for e in eps if len(e.state) and e.state[0, 0] == 99 and e.ended]
    assert sorted(bool(e.terminated) for e in ended) == [False, True, True]


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_replay_server_with_stats_is_a_flag(impl):
    """ReplayServer.get_batch's with_stats is a flag as its shared_next is:
    a string, a float, None or an array is the buffer's TypeError
    before anything is drawn (with_stats="no" returned the stats)."""
    srv, twin = (ReplayServer(impl=impl, selectors=SEL, seed=3, **KW) for _ in range(2))
    _episodes([[srv], [twin]])
    for bad in _BAD_FLAGS:
        with pytest.raises(TypeError) as got:
            srv.get_batch(8, 0, None, bad)
        assert str(got.value) == _flag_error("with_stats", bad)
    np.testing.assert_array_equal(srv.get_batch(16, 0).pick_epi, twin.get_batch(16, 0).pick_epi)
    b, st = srv.get_batch(8, 0, None, np.True_)
    assert len(b.pick_epi) == 8 and st == srv.priority_stats(0)
    assert len(srv.get_batch(8, 0, None, 0).pick_epi) == 8


class _Starter:
    """ReplayActor's stand-in for ShardedReplay to start: every .options()
    and .remote() noted in `started`; .remote() builds a ReplayServer here."""

    def __init__(self, started):
        self.started = started

    def options(self, **opts):
        self.started.append(("options", opts))
        return self

    def remote(self, **kw):
        self.started.append(("remote", kw))
        return _Local(ReplayServer(**kw))


_SEED = "an int in [0, 2**64 - {}] or None"
_CAPACITY = "an int in [1, 2**63 - 1] or None"
_N_SHARDS = "an int >= 1 (the shards to start; or actors=)"


def test_sharded_constructor_checks_its_numbers_before_starting_any_actor(monkeypatch):
    """n_shards, seed and capacity are ints (a bool, a float or a string a
    TypeError naming the argument and its type), n_shards >= 1, seed such
    that every shard's seed + i is a buffer's seed, capacity the buffer's:
    checked before any actor is started. n_shards=2.5 reached range(), a
    string a comparison, a float capacity or seed the started shards'
    buffers; a bool counted as 0 or 1."""
    started = []
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    monkeypatch.setattr(xray, "_make_actor_class", lambda: started.append("class") or _Starter(started))
    kw = dict(state_shape=(4,), pick_len=1)
    cases = [
        (dict(n_shards=2.5), TypeError, f"n_shards: expected {_N_SHARDS}, got float"),
        (dict(n_shards="2"), TypeError, f"n_shards: expected {_N_SHARDS}, got str"),
        (dict(n_shards=True), TypeError, f"n_shards: expected {_N_SHARDS}, got bool"),
        (dict(n_shards=np.float64(2)), TypeError, f"n_shards: expected {_N_SHARDS}, got numpy.float64"),
        (dict(n_shards=None), TypeError, f"n_shards: expected {_N_SHARDS}, got NoneType"),
        (dict(n_shards=0), ValueError, f"n_shards: expected {_N_SHARDS}, got 0"),
        (dict(n_shards=-3), ValueError, f"n_shards: expected {_N_SHARDS}, got -3"),
        (dict(n_shards=2, seed=1.5), TypeError, f"seed: expected {_SEED.format(2)}, got float"),
        (dict(n_shards=2, seed="1"), TypeError, f"seed: expected {_SEED.format(2)}, got str"),
        (dict(n_shards=2, seed=False), TypeError, f"seed: expected {_SEED.format(2)}, got bool"),
        (dict(n_shards=2, seed=-1), ValueError, f"seed: expected {_SEED.format(2)}, got -1"),
        (dict(n_shards=3, seed=2**64 - 2), ValueError,  # the third shard's seed + 2 is 2**64
         f"seed: expected {_SEED.format(3)}, got {2**64 - 2}"),
        (dict(n_shards=2, capacity=1000.0), TypeError, f"capacity: expected {_CAPACITY}, got float"),
        (dict(n_shards=2, capacity="1000"), TypeError, f"capacity: expected {_CAPACITY}, got str"),
        (dict(n_shards=2, capacity=True), TypeError, f"capacity: expected {_CAPACITY}, got bool"),
        (dict(n_shards=2, capacity=0), ValueError, f"capacity: expected {_CAPACITY}, got 0"),
        (dict(n_shards=2, capacity=2**63), ValueError, f"capacity: expected {_CAPACITY}, got {2**63}"),
        (dict(n_shards=2, actor_options=[("num_cpus", 0)]), TypeError,
         "actor_options: expected None or a dict, got list"),
        (dict(n_shards=2, log_dir="x", log_options="level=1"), TypeError,
         "log_options: expected None or a dict, got str"),
    ]
    for kwargs, exc, msg in cases:
        with pytest.raises(exc) as got:
            xray.ShardedReplay(**kwargs, **kw)
        assert str(got.value) == msg, kwargs
        assert started == [], kwargs
    # what is taken: ints (NumPy's too), None for seed and capacity
    sh = xray.ShardedReplay(np.int64(2), seed=np.uint64(2**64 - 2), capacity=101, **kw)
    assert sh.n == 2 and started[0] == "class"
    made = [c[1] for c in started if c[0] == "remote"]
    assert [m["seed"] for m in made] == [2**64 - 2, 2**64 - 1]
    assert [m["capacity"] for m in made] == [51, 51]
    assert all(type(m["capacity"]) is int for m in made)
    started.clear()
    assert xray.ShardedReplay(1, seed=None, capacity=None, **kw).n == 1
    assert [c[1]["capacity"] for c in started if c[0] == "remote"] == [None]


def _own_error(f):
    """(type, message) of the error f() raises."""
    try:
        f()
    except Exception as e:
        return type(e), str(e)
    raise AssertionError("no error")


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_sharded_constructor_checks_the_buffer_arguments_before_starting_any_actor(monkeypatch, impl):
    """The arguments every shard's buffer is built with (the buffer's own,
    capacity / n_shards, seed), the selectors and their parameters, and
    impl are checked in this process before any actor is started, with the
    error the shards would raise as they start: the buffer's own, the one
    a buffer built here with the same bad argument raises. Before, each
    shard refused them as it started, and the replay was left with dead
    actors. log= and buffer= (ReplayServer's own, which ShardedReplay sets
    or does not take) are a TypeError naming them."""
    started = []
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    monkeypatch.setattr(xray, "_make_actor_class", lambda: started.append("class") or _Starter(started))
    cls = exreplay.ExperienceReplay if impl == "c" else ReferenceReplay
    kw = dict(state_shape=(4,), pick_len=2)
    for bad in (dict(state_shape="4"), dict(state_shape=(0,)), dict(state_dtype=None),
                dict(state_dtype="complex64"), dict(action_shape=(1.5,)), dict(reward_dtype="int32"),
                dict(pick_len=0), dict(pick_len=2.5), dict(allow_short="no"), dict(eviction="lifo"),
                dict(eviction=1), dict(nonsense=1), dict(state_spec={"a": 5}),
                dict(extras_spec={"x": ((2,), "complex128")})):
        args = dict(kw, **bad)
        want = _own_error(lambda: cls(capacity=50, seed=7, **args))
        with pytest.raises(want[0]) as got:
            xray.ShardedReplay(2, impl=impl, capacity=100, seed=7, **args)
        assert str(got.value) == want[1], bad
        assert started == [], bad
    # the selectors' parameters, as the buffer's new_pick_selector refuses them
    for sel, kind, params in (([("prioritized", {"alpha": -1.0})], 1, {"alpha": -1.0}),
                              ([("rank", {"beta": "x"})], 2, {"beta": "x"}),
                              (["uniform", ("uniform", {"alpha": 1.0})], 0, {"alpha": 1.0}),
                              ([("prioritized", {"gamma": 1.0})], 1, {"gamma": 1.0})):
        want = _own_error(lambda: cls(**kw).new_pick_selector(kind, **params))
        with pytest.raises(want[0]) as got:
            xray.ShardedReplay(2, impl=impl, selectors=sel, **kw)
        assert str(got.value) == want[1], sel
        assert started == [], sel
    for kwargs, exc, msg in (
            (dict(impl="cpp"), ValueError, "impl: expected 'c' or 'reference', got 'cpp'"),
            (dict(impl=None), TypeError, "impl: expected 'c' or 'reference', got NoneType"),
            (dict(selectors=[("prioritized",)]), ValueError,
             "selectors[0]: expected a kind or a (kind, params) pair, got ('prioritized',)"),
            (dict(log={"dir": "x"}), TypeError,
             "log: expected no log= (ShardedReplay takes log_dir= and log_options=), got dict"),
            (dict(buffer=exreplay.ExperienceReplay(**kw)), TypeError,
             "buffer: expected no buffer= (every shard builds its own; actors= serves existing ones), "
             "got exreplay._core.ExperienceReplay")):
        with pytest.raises(exc) as got:
            xray.ShardedReplay(2, **dict(dict(impl=impl), **kwargs), **kw)
        assert str(got.value) == msg, kwargs
        assert started == [], kwargs
    sh = xray.ShardedReplay(2, impl=impl, capacity=100, seed=7, selectors=SEL, **kw)
    assert sh.n == 2 and [c[1]["seed"] for c in started if c[0] == "remote"] == [7, 8]


def test_sharded_constructor_checks_the_log_arguments_before_starting_any_actor(monkeypatch,
                                                                                 tmp_path):
    """log_dir is a path; log_options, used only with log_dir, are
    ExperienceLog's options with str keys but dir and source, which the
    replay sets for each shard (they were overridden); impl="reference"
    has no log: each refused naming the argument before any actor is
    started (the started shards refused a bad log_dir or impl). So are
    the options ExperienceLog refuses and a log layout that differs from
    the buffer's, with the errors each shard would raise, and no directory
    is made (the shards died as they started, with the directory made)."""
    started = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    monkeypatch.setattr(xray, "_make_actor_class", lambda: started.append("class") or _Starter(started))
    kw = dict(state_shape=(4,), pick_len=1)
    opts = ("ExperienceLog's options but dir and source (ShardedReplay sets them: log_dir=, and each "
            "shard's number)")
    for kwargs, exc, msg in (
            (dict(log_dir=5), TypeError, "log_dir: expected a path (str, bytes or os.PathLike), got int"),
            (dict(log_dir="logs", log_options={"source": 1}), ValueError,
             f"log_options: expected {opts}, got 'source'"),
            (dict(log_dir="logs", log_options={"dir": "x"}), ValueError,
             f"log_options: expected {opts}, got 'dir'"),
            (dict(log_dir="logs", log_options={1: 2}), TypeError,
             "log_options: expected ExperienceLog's options (str keys), got a key of type int"),
            (dict(log_options={"level": 3}), ValueError,
             "log_options: expected None without log_dir= (it is not used), got {'level': 3}"),
            (dict(log_dir="logs", impl="reference"), ValueError,
             "log_dir: expected None with impl='reference' (the experience log needs impl='c'), got 'logs'"),
            # ExperienceLog's own checks, and attach_log's, as each shard makes them
            (dict(log_dir="logs", log_options={"level": 12}), ValueError,
             "level: expected an int from 0 to 9, got 12"),
            (dict(log_dir="logs", log_options={"chunk_bytes": -1}), ValueError,
             "chunk_bytes: expected an int from 1 to 1073741824, got -1"),
            (dict(log_dir="logs", log_options={"levle": 1}), TypeError,
             "'levle' is an invalid keyword argument for ExperienceLog()"),
            (dict(log_dir="logs", log_options={"state_shape": (3,)}), ValueError,
             "log: expected a log of this buffer's record layout (state float32 (4,), action int64 (), "
             "reward float32), got one of state float32 (3,), action int64 (), reward float32")):
        with pytest.raises(exc) as got:
            xray.ShardedReplay(2, **kwargs, **kw)
        assert str(got.value) == msg, kwargs
        assert started == [], kwargs
    assert os.listdir(tmp_path) == []  # no log directory made, no file left


def test_sharded_constructor_checks_actors_and_n_shards_with_them(monkeypatch):
    """With actors=, n_shards is None or their number (it was ignored), and
    actors must be a non-empty sequence; checked before any shard is called."""
    sh, servers, calls = _sharded(monkeypatch, "c", n=2)
    actors = sh.shards
    calls.clear()
    for kwargs, exc, msg in (
            (dict(n_shards=3), ValueError, "n_shards: expected None or len(actors), 2, got 3"),
            (dict(n_shards=2.0), TypeError, "n_shards: expected None or len(actors), 2, got float"),
            (dict(n_shards=True), TypeError, "n_shards: expected None or len(actors), 2, got bool"),
            (dict(seed=0.5), TypeError, "seed: expected an int in [0, 2**64 - 1] or None, got float")):
        with pytest.raises(exc) as got:
            xray.ShardedReplay(actors=actors, **kwargs)
        assert str(got.value) == msg, kwargs
    for bad, exc, msg in ((5, TypeError, "actors: expected a list of ReplayActors, got int"),
                          ([], ValueError, "actors: expected at least one ReplayActor, got an empty list")):
        with pytest.raises(exc) as got:
            xray.ShardedReplay(actors=bad)
        assert str(got.value) == msg
    assert calls == []
    assert xray.ShardedReplay(2, actors=actors).n == 2


_UNUSED = "with actors= (it is not used: the actors' buffers are built already)"


def test_sharded_constructor_refuses_what_actors_do_not_use(monkeypatch):
    """With actors=, the arguments that only shape the shards ShardedReplay
    starts (selectors, capacity, actor_options, impl, log_dir, log_options
    and the buffer's own) were ignored: each is a ValueError naming it
    unless left at its default, raised before any shard is called."""
    sh, servers, calls = _sharded(monkeypatch, "c", n=2)
    actors = sh.shards
    calls.clear()
    for kwargs, msg in (
            (dict(capacity=5000), f"capacity: expected the default, 1000000, {_UNUSED}, got 5000"),
            (dict(capacity=None), f"capacity: expected the default, 1000000, {_UNUSED}, got None"),
            (dict(impl="reference"), f"impl: expected the default, 'c', {_UNUSED}, got 'reference'"),
            (dict(selectors=SEL), "selectors: expected the default, (('prioritized', {}),), "
                                  f"{_UNUSED}, got [('prioritized', {{'alpha': 1.0, 'beta': 0.4}})]"),
            (dict(log_dir="logs"), f"log_dir: expected the default, None, {_UNUSED}, got 'logs'"),
            (dict(log_options={"level": 3}), f"log_options: expected the default, None, {_UNUSED}, "
                                             "got {'level': 3}"),
            (dict(actor_options={"num_cpus": 0}), f"actor_options: expected the default, None, {_UNUSED}, "
                                                  "got {'num_cpus': 0}"),
            (dict(state_shape=(4,)), f"state_shape: expected no state_shape {_UNUSED}, got (4,)"),
            (dict(pick_len=2), f"pick_len: expected no pick_len {_UNUSED}, got 2")):
        with pytest.raises(ValueError) as got:
            xray.ShardedReplay(actors=actors, seed=1, **kwargs)
        assert str(got.value) == msg, kwargs
    assert calls == []
    # at their defaults they are taken (an equal value of the default's type too)
    sh = xray.ShardedReplay(actors=actors, selectors=(("prioritized", {}),), capacity=1_000_000, impl="c",
                            log_dir=None, log_options=None, actor_options=None)
    assert sh.n == 2


_KIND = "a PickSelectorClass (0 to 2) or one of ['prioritized', 'rank', 'uniform']"


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_selector_kinds_are_not_truncated(impl):
    """A selector's kind (new_pick_selector's kind, the entries of the
    constructor's selectors) is a PickSelectorClass, its int value or its
    name: a float, a bool or None is a TypeError naming the argument and its
    type (int() made 1.7 a prioritized selector and True one too), before
    any selector or buffer is made."""
    srv = ReplayServer(impl=impl, selectors=["uniform"], state_shape=(4,), capacity=10)
    for bad, exc, shown in ((1.7, TypeError, "float"), (True, TypeError, "bool"), (None, TypeError, "NoneType"),
                            (np.float64(1), TypeError, "numpy.float64"), (3, ValueError, "3"),
                            (-1, ValueError, "-1"), ("nope", ValueError, "'nope'")):
        with pytest.raises(exc) as got:
            srv.new_pick_selector(bad)
        assert str(got.value) == f"kind: expected {_KIND}, got {shown}"
        for selectors, name in (([bad], "selectors[0]"), (["uniform", (bad, {})], "selectors[1][0]")):
            with pytest.raises(exc) as got:
                ReplayServer(impl=impl, selectors=selectors, state_shape=(4,), capacity=10)
            assert str(got.value) == f"{name}: expected {_KIND}, got {shown}"
    assert list(srv.selectors()) == [0]  # nothing added
    assert srv.new_pick_selector(np.int64(2), alpha=0.5) == 1
    assert srv.new_pick_selector("Prioritized") == 2
    assert [k for k, _, _ in srv.selectors().values()] == ["uniform", "rank", "prioritized"]


def test_split_batch_takes_an_int_that_divides_the_batch():
    """split_batch's n is an int >= 1 dividing the batch size: a float or a
    bool is a TypeError naming n and its type (True gave one batch, 2.0
    failed in slicing naming nothing), 0 or a non-divisor a ValueError."""
    srv = ReplayServer(selectors=SEL, seed=3, **KW)
    _episodes([[srv]])
    b = srv.get_batch(12, 0)
    want = "n: expected an int >= 1 that divides the batch size 12, got"
    for n, exc, shown in ((2.0, TypeError, "float"), (True, TypeError, "bool"), ("3", TypeError, "str"),
                          (None, TypeError, "NoneType"), (0, ValueError, "0"), (-3, ValueError, "-3"),
                          (5, ValueError, "5")):
        with pytest.raises(exc) as got:
            xray.split_batch(b, n)
        assert str(got.value) == f"{want} {shown}", n
    parts = xray.split_batch(b, np.int64(3))
    assert [len(x.pick_epi) for x in parts] == [4, 4, 4]


def test_replay_server_impl_of_a_wrong_type_is_a_type_error():
    """impl that is not a str is a TypeError naming its type (it was a
    ValueError showing the value); an unknown name stays a ValueError."""
    for bad, exc, shown in ((1, TypeError, "int"), (None, TypeError, "NoneType"),
                            (b"c", TypeError, "bytes"), ("C++", ValueError, "'C++'")):
        with pytest.raises(exc) as got:
            ReplayServer(impl=bad, **KW)
        assert str(got.value) == f"impl: expected 'c' or 'reference', got {shown}"


_SELECTORS = "None or a list of selector kinds and (kind, params) pairs"


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_malformed_selector_entries_are_named(impl):
    """An entry of selectors that is a pair of another length, or whose
    params are no dict of str keys, is refused naming the entry before a
    buffer is built: a 1-tuple was an IndexError, a third item was
    dropped, a list of pairs was taken as a dict and a string as params
    failed in dict(), none naming anything; selectors itself that is no
    list (a string, a dict, an int) is named too. A list or tuple entry
    of two items with a dict of params is taken."""
    for selectors, exc, msg in (
            ([("prioritized",)], ValueError,
             "selectors[0]: expected a kind or a (kind, params) pair, got ('prioritized',)"),
            (["uniform", ("prioritized", {}, 3)], ValueError,
             "selectors[1]: expected a kind or a (kind, params) pair, got ('prioritized', {}, 3)"),
            ([("prioritized", [("alpha", 0.5)])], TypeError,
             "selectors[0][1]: expected a dict of the selector's parameters (alpha, beta), got list"),
            ([("prioritized", "alpha=0.5")], TypeError,
             "selectors[0][1]: expected a dict of the selector's parameters (alpha, beta), got str"),
            ([("prioritized", None)], TypeError,
             "selectors[0][1]: expected a dict of the selector's parameters (alpha, beta), got NoneType"),
            ([("prioritized", {1: 0.5})], TypeError,
             "selectors[0][1]: expected parameter names (str) as keys, got a key of type int"),
            ("uniform", TypeError, f"selectors: expected {_SELECTORS}, got str"),
            ({"uniform": {}}, TypeError, f"selectors: expected {_SELECTORS}, got dict"),
            (5, TypeError, f"selectors: expected {_SELECTORS}, got int")):
        with pytest.raises(exc) as got:
            ReplayServer(impl=impl, selectors=selectors, **KW)
        assert str(got.value) == msg, selectors
    srv = ReplayServer(impl=impl, selectors=[["uniform", {}], ("rank", {"alpha": 0.5})], **KW)
    assert srv.selectors()[1][:2] == ("rank", 0.5)


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_replay_server_call_names_a_name_that_is_no_str(impl):
    """call's name that is not a str is a TypeError naming it and its type
    (getattr's "attribute name must be string" named nothing)."""
    srv = ReplayServer(impl=impl, selectors=SEL, **KW)
    for bad, shown in ((5, "int"), (None, "NoneType"), (b"episode", "bytes"),
                       (len, "builtin_function_or_method")):
        with pytest.raises(TypeError) as got:
            srv.call(bad)
        assert str(got.value) == f"name: expected a str (the name of a buffer method), got {shown}"
    assert srv.call("_handles") == []  # a str still reaches the buffer


def test_concat_batches_and_rollout_extras_name_their_argument():
    """concat_batches of no batch is a ValueError naming batches (it was an
    IndexError), of something that is no sequence a TypeError; a Rollout's
    extras that is no dict a TypeError naming extras and its type (an
    AttributeError before)."""
    for bad, exc, msg in (([], ValueError, "batches: expected at least one batch, got none"),
                          ((), ValueError, "batches: expected at least one batch, got none"),
                          (iter([]), ValueError, "batches: expected at least one batch, got none"),
                          (5, TypeError, "batches: expected a list of batches, got int")):
        with pytest.raises(exc) as got:
            xray.concat_batches(bad)
        assert str(got.value) == msg
    srv = ReplayServer(selectors=SEL, seed=3, **KW)
    _episodes([[srv]])
    bs = srv.get_batch(4, 0, 3)
    assert len(xray.concat_batches(b for b in bs).pick_epi) == 12
    s, a, r = np.zeros((2, 4), np.float32), np.zeros(2, np.int64), np.zeros(2, np.float32)
    for bad, shown in (([np.zeros(2)], "list"), ("x", "str"),
                       (np.zeros(2), "numpy.ndarray of dtype float64 and shape (2,)")):
        with pytest.raises(TypeError) as got:
            Rollout(s, a, r, extras=bad)
        assert str(got.value) == f"extras: expected None or a dict {{name: (T, *shape) array}}, got {shown}"
    assert Rollout(s, a, r, extras={"x": [1, 2]}).extras["x"].tolist() == [1, 2]


def test_gather_logs_checks_the_replays_before_closing_any_log(monkeypatch, tmp_path):
    """replays is a list of ReplayActors with logs of distinct sources,
    checked before any log is closed or dest_dir made: two logs of one
    source were both shipped to dest_dir/shipped-<source>.xlog, the second
    over the first, and the merge read that one file twice (one replay's
    records lost, the other's doubled); None, [] and an object that is no
    actor gave errors that named no argument, [] after making dest_dir."""
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    a = ReplayServer(state_shape=(3,), capacity=100, log={"dir": str(tmp_path / "a")})
    b = ReplayServer(state_shape=(3,), capacity=100, log={"dir": str(tmp_path / "b")})
    dest = tmp_path / "gathered"
    for replays, exc, msg in [
        (None, TypeError, "replays: expected a list of ReplayActors, got NoneType"),
        ([], ValueError, "replays: expected at least one ReplayActor, got none"),
        ([_Local(a), object()], TypeError, "replays: expected ReplayActors, got object at position 1"),
        ([_Local(a), _Local(b)], ValueError, "replays: expected logs of distinct sources (a record's "
                                             "source names its writer), got source 0 at positions [0, 1]"),
    ]:
        with pytest.raises(exc) as e:
            xray.gather_logs(replays, str(dest))
        assert str(e.value) == msg
        assert not dest.exists()
        assert not a.log_info()["closed"] and not b.log_info()["closed"]
    a.log_close()
    b.log_close()


def test_replay_server_checks_a_given_buffer():
    """buffer= is an ExperienceReplay or a ReferenceReplay, with no buffer
    argument beside it and impl, if given, its own: the other arguments were
    ignored (capacity=5 served a buffer of capacity 10) and a string was
    taken, to fail at the first call with an AttributeError."""
    buf = exreplay.ExperienceReplay((3,), capacity=10)
    for kw, exc, msg in [
        (dict(buffer="junk"), TypeError,
         "buffer: expected None, an ExperienceReplay or a ReferenceReplay, got str"),
        (dict(buffer=buf, capacity=5), ValueError,
         "capacity: expected no capacity with buffer= (it is not used: the buffer is built "
         "already), got 5"),
        (dict(buffer=buf, impl="reference"), ValueError,
         "impl: expected 'c' (the default) or the given buffer's own, got 'reference' with a "
         "buffer of exreplay._core.ExperienceReplay"),
    ]:
        with pytest.raises(exc) as e:
            ReplayServer(**kw)
        assert str(e.value) == msg
    assert ReplayServer(buffer=ReferenceReplay((3,)), impl="reference").impl == "reference"
    assert ReplayServer(buffer=buf).buf is buf and buf.capacity == 10
