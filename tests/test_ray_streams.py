"""ReplayServer's stream bookkeeping under concurrent calls, in one process
(no Ray): a thread is held inside the recording of a rollout while another
call lands in that window, so each race runs the same way every time."""

import threading

import numpy as np
import pytest

from exreplay.ray import ReplayServer, Rollout
from fake_ray import FakeRay as _FakeRay
from fake_ray import Method as _Method
from fake_ray import Ref as _Ref


def _steps(start, T):
    """Rollout columns of T steps whose states hold their step number start.. in column 1."""
    s = np.zeros((T, 4), np.float32)
    s[:, 1] = np.arange(start, start + T)
    return s, np.zeros(T, np.int64), np.ones(T, np.float32)


def _open(start, T, priorities=None):
    """T steps of an episode left open."""
    return Rollout(*_steps(start, T), priorities)


class _Hold:
    """Wraps srv._record_rollout: the first call waits, inside the recording,
    until release(); `entered` is set once it waits."""

    def __init__(self, srv):
        self.orig = srv._record_rollout
        self.entered = threading.Event()
        self.go = threading.Event()
        self.first = True
        srv._record_rollout = self

    def __call__(self, *args, **kwargs):
        if self.first:
            self.first = False
            self.entered.set()
            assert self.go.wait(30)
        return self.orig(*args, **kwargs)

    def release(self):
        self.go.set()


class _Call(threading.Thread):
    """f(*args) in a thread; join() returns its result or raises its error."""

    def __init__(self, f, *args):
        super().__init__(daemon=True)
        self.f, self.args, self.out, self.err = f, args, None, None
        self.start()

    def run(self):
        try:
            self.out = self.f(*self.args)
        except BaseException as e:  # handed to join()
            self.err = e

    def join(self, timeout=30):
        super().join(timeout)
        assert not self.is_alive()
        if self.err is not None:
            raise self.err
        return self.out


@pytest.fixture
def hold():
    """_Hold(srv) as a factory; whatever a failed test left waiting is released."""
    made = []

    def make(srv):
        made.append(_Hold(srv))
        return made[-1]

    yield make
    for h in made:
        h.release()


def _server():
    return ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)


def _episodes(srv):
    """Every episode's step numbers, in the order of their first step."""
    eps = sorted((srv.buf.episode(h) for h in srv.buf._handles()), key=lambda e: e.state[0, 1])
    return [e.state[:, 1].astype(int).tolist() for e in eps]


def test_a_seq_being_recorded_is_refused_again(hold):
    # While seq 0 is being recorded, the same seq again is a ValueError: it is
    # neither held (for ever: nothing would record it) nor recorded twice.
    srv = _server()
    hold = hold(srv)
    first = _Call(srv.record_rollout, "A", _open(0, 3), 0)
    assert hold.entered.wait(30)
    with pytest.raises(ValueError, match=r"seq: expected a number not sent before on stream 'A' \(next 1\), got 0"):
        srv.record_rollout("A", _open(100, 3), 0)
    hold.release()
    assert first.join() == 3
    srv.record_rollout("A", _open(3, 2), 1)
    assert _episodes(srv) == [[0, 1, 2, 3, 4]]
    assert srv.stats()["records"] == 5 and srv.stats()["rollouts"] == 2
    with pytest.raises(ValueError, match="seq: expected a number not sent before"):
        srv.record_rollout("A", _open(100, 3), 1)


def test_a_refused_seq_changes_nothing():
    # A seq that is not an int >= 0 is refused before the stream is looked up:
    # no trace of a stream not seen before is left behind, and 1.5 is not taken
    # as 1 nor True as 1. A wrong type's message names the type, not the value.
    srv = _server()
    with pytest.raises(ValueError) as got:
        srv.record_rollout("X", _open(0, 2), -1)
    assert str(got.value) == "seq: expected an int >= 0 or None, got -1"
    for bad, shown in ((1.5, "float"), ("1", "str"), (True, "bool"), (np.float64(0), "numpy.float64"),
                       (np.array([0]), "numpy.ndarray of dtype int64 and shape (1,)")):
        with pytest.raises(TypeError) as got:
            srv.record_rollout("X", _open(0, 2), bad)
        assert str(got.value) == f"seq: expected an int >= 0 or None, got {shown}"
    assert not [k for k, v in vars(srv).items() if isinstance(v, (dict, set)) and "X" in v]
    assert srv.record_rollout("X", _open(0, 2), np.int64(0)) == 2
    assert srv.record_rollout("X", _open(2, 2), 1) == 2
    assert _episodes(srv) == [[0, 1, 2, 3]]


def test_end_stream_during_a_drain_then_the_stream_restarts(hold):
    # end_stream while seq 0 is being recorded, with seq 1 and 3 held: seq 0
    # finishes into the old episode, the held ones are dropped, and the stream
    # started afterwards under the same key begins at seq 0, in a new episode.
    srv = _server()
    hold = hold(srv)
    first = _Call(srv.record_rollout, "A", _open(0, 3), 0)
    assert hold.entered.wait(30)
    assert srv.record_rollout("A", _open(3, 2), 1) == 2  # held: its predecessor is being recorded
    assert srv.record_rollout("A", _open(5, 2), 3) == 2  # held: ahead of its turn
    srv.end_stream("A")
    hold.release()
    assert first.join() == 3
    assert _episodes(srv) == [[0, 1, 2]]  # seq 1 and 3 were dropped
    assert srv.record_rollout("A", _open(100, 2), 0) == 2
    assert srv.record_rollout("A", _open(102, 2), 1) == 2
    assert _episodes(srv) == [[0, 1, 2], [100, 101, 102, 103]]
    assert srv.stats()["records"] == 7


def test_end_stream_during_a_drain_restarted_at_once(hold):
    # The stream is started again while the old one's seq 0 is still being
    # recorded: the new seq 0 is recorded at once (it does not wait behind the
    # old stream's drain), and the old rollout's open episode is not continued.
    srv = _server()
    hold = hold(srv)
    first = _Call(srv.record_rollout, "A", _open(0, 3), 0)
    assert hold.entered.wait(30)
    srv.end_stream("A")
    assert srv.record_rollout("A", _open(100, 2), 0) == 2
    assert _episodes(srv) == [[100, 101]]
    hold.release()
    assert first.join() == 3
    assert srv.record_rollout("A", _open(102, 2), 1) == 2
    with pytest.raises(ValueError, match=r"seq: expected a number not sent before on stream 'A' \(next 2\), got 1"):
        srv.record_rollout("A", _open(200, 2), 1)
    assert _episodes(srv) == [[0, 1, 2], [100, 101, 102, 103]]


@pytest.mark.parametrize("fails", [False, True])
def test_end_stream_during_a_rollout_without_seq(hold, fails):
    # Without seq: a rollout being recorded when end_stream comes finishes into
    # the old episode (or fails there); either way the stream started
    # afterwards keeps its own open episode.
    srv = _server()
    hold = hold(srv)
    p = np.array([1.0, np.nan, 1.0]) if fails else None
    first = _Call(srv.record_rollout, "A", _open(0, 3, p))
    assert hold.entered.wait(30)
    srv.end_stream("A")
    assert srv.record_rollout("A", _open(100, 2)) == 2
    hold.release()
    if fails:
        with pytest.raises(ValueError, match="priorities: expected finite numbers >= 0, got nan at index 1"):
            first.join()
    else:
        assert first.join() == 3
    assert srv.record_rollout("A", _open(102, 2)) == 2
    assert _episodes(srv) == ([] if fails else [[0, 1, 2]]) + [[100, 101, 102, 103]]


def test_end_stream_while_a_call_without_seq_waits_for_the_stream(hold):
    # A call without seq that already waits for the stream's previous call when
    # end_stream comes belongs to the old stream: it goes into the old episode
    # once that call is done, not into a stream started afterwards.
    srv = _server()
    hold = hold(srv)
    first = _Call(srv.record_rollout, "A", _open(0, 3))
    assert hold.entered.wait(30)
    st = srv._streams["A"]
    waiting = threading.Event()

    class Lock:  # the stream's lock, telling when the second call waits on it
        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            waiting.set()
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    st.lock = Lock(st.lock)
    second = _Call(srv.record_rollout, "A", _open(3, 2))
    assert waiting.wait(30)
    srv.end_stream("A")
    assert srv.record_rollout("A", _open(100, 2)) == 2
    hold.release()
    assert first.join() == 3 and second.join() == 2
    assert srv.record_rollout("A", _open(102, 2)) == 2
    assert _episodes(srv) == [[0, 1, 2, 3, 4], [100, 101, 102, 103]]


def test_a_drain_left_by_a_base_exception_is_taken_up_by_the_next_call(monkeypatch):
    # An error that the drain does not catch (KeyboardInterrupt in a server
    # used in one process) leaves it at once; the rollouts held behind it are
    # recorded by the stream's next call, not held for ever.
    srv = _server()
    orig = srv._record_rollout
    calls = []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return orig(*args)

    monkeypatch.setattr(srv, "_record_rollout", interrupted)
    assert srv.record_rollout("A", _open(3, 2), 1) == 2  # held
    with pytest.raises(KeyboardInterrupt):
        srv.record_rollout("A", _open(0, 3), 0)
    assert _episodes(srv) == []
    assert srv.record_rollout("A", _open(5, 2), 2) == 2  # records 1 and 2
    assert _episodes(srv) == [[3, 4, 5, 6]]
    with pytest.raises(ValueError, match=r"seq: expected a number not sent before on stream 'A' \(next 3\), got 0"):
        srv.record_rollout("A", _open(0, 3), 0)


@pytest.mark.parametrize("seq", [None, 1])
def test_a_rollout_that_is_not_one_changes_nothing(seq):
    # Refused before the stream is touched: it does not use up its seq, nor
    # close the stream's open episode, and the error names the argument.
    srv = _server()
    srv.record_rollout("A", _open(0, 2), None if seq is None else 0)
    with pytest.raises(TypeError, match="rollout: expected a Rollout, got tuple"):
        srv.record_rollout("A", _steps(2, 2), seq)
    srv.record_rollout("A", _open(2, 2), seq)
    assert _episodes(srv) == [[0, 1, 2, 3]]


@pytest.mark.parametrize("seq", [None, 0])
def test_a_stream_that_is_no_id_is_named(seq):
    # record_rollout and end_stream name `stream` and its type for an
    # unhashable id (the dict lookup's "unhashable type" named nothing), as
    # ShardedReplay does, and change nothing.
    srv = _server()
    srv.record_rollout("A", _open(0, 2), None if seq is None else 0)
    for bad, shown in (([1], "list"), ({"a": 1}, "dict"),
                       (np.zeros(2), "numpy.ndarray of dtype float64 and shape (2,)")):
        with pytest.raises(TypeError) as got:
            srv.record_rollout(bad, _open(2, 2), seq)
        assert str(got.value) == f"stream: expected a hashable id, got {shown}"
        with pytest.raises(TypeError) as got:
            srv.end_stream(bad)
        assert str(got.value) == f"stream: expected a hashable id, got {shown}"
    srv.record_rollout("A", _open(2, 2), None if seq is None else 1)
    assert _episodes(srv) == [[0, 1, 2, 3]]


def test_end_stream_before_a_call_records_its_own_rollout():
    """A call that holds its rollout and starts the stream's drain, with
    end_stream coming before the drain's first turn: the rollout is dropped
    with the stream, and the call returns 0, not the rollout's length (it
    reported records it never recorded)."""
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)
    real = srv._streams_mu

    class EndOnSecondTurn:
        turns = 0

        def __enter__(self):
            EndOnSecondTurn.turns += 1
            if EndOnSecondTurn.turns == 2:  # the drain's first turn
                srv.end_stream("A")
            return real.__enter__()

        def __exit__(self, *exc):
            return real.__exit__(*exc)

    srv._streams_mu = EndOnSecondTurn()
    assert srv.record_rollout("A", _open(0, 3), 0) == 0
    srv._streams_mu = real
    assert len(srv.buf) == 0 and "A" not in srv._streams
    assert srv.record_rollout("A", _open(0, 3), 0) == 3  # the stream starts anew
    assert len(srv.buf) == 3


class _Shard:
    """A ReplayActor that notes the seq of every rollout of every stream."""

    def __init__(self):
        self.seqs = {}
        self.selectors = _Method(lambda: _Ref({0: ("prioritized", 0.6, 0.4)}))
        self.record_rollout = _Method(self._record)
        self.end_stream = _Method(lambda stream: _Ref(self.seqs.pop(stream, None)))

    def _record(self, stream, rollout, seq):
        self.seqs.setdefault(stream, []).append(seq)
        return _Ref(len(rollout.actions))


def test_one_sharded_replay_shared_by_threads_numbers_every_call_once(monkeypatch):
    """Threads sending through one ShardedReplay copy, to one stream and to
    their own: each shard gets each stream's numbers 0, 1, ... once each,
    and end_stream waits for every call kept."""
    import sys

    import exreplay.ray as xray

    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    shards = [_Shard(), _Shard()]
    sr = xray.ShardedReplay(actors=shards)
    s, a, r = _steps(0, 2)
    episode = Rollout(s, a, r, ends=[2])
    per_thread = 5000
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        def send(stream):
            for _ in range(per_thread):
                sr.record_rollout(stream, episode)

        threads = [threading.Thread(target=send, args=(k,)) for k in ("shared", "shared", 1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    for stream, calls in (("shared", 2 * per_thread), (1, per_thread), (2, per_thread)):
        got = [sorted(sh.seqs[stream]) for sh in shards]
        assert [g == list(range(len(g))) for g in got] == [True, True], stream
        assert sum(len(g) for g in got) == calls, stream
        kept = sr._streams[stream]["pending"]
        sr.end_stream(stream)
        assert stream not in sr._streams
        assert len(kept) <= calls
