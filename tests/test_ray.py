"""exreplay.ray on a real local Ray cluster (no mocks): the replay actor, the
sharded replay, pickling through the object store, and the Ape-X example.

One cluster (ray.init(num_cpus=2)) serves the whole module. Skipped when Ray
is not installed, and under the ASan run (Ray's workers would load the
sanitized extension without the preloaded runtime).
"""

import os
import pickle
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

if os.environ.get("EXREPLAY_ASAN"):
    pytest.skip("Ray tests do not run under ASan", allow_module_level=True)

ray = pytest.importorskip("ray")

import exreplay  # noqa: E402
from exreplay.ray import _EPISODES, ReplayServer, Rollout, ShardedReplay, concat_batches, split_batch  # noqa: E402
from exreplay.reference import ReferenceReplay  # noqa: E402

PRI = exreplay.PickSelectorClass.Prioritized
UNI = exreplay.PickSelectorClass.Uniform


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _actor(**kw):
    from exreplay.ray import ReplayActor

    return ReplayActor.remote(**kw)


def _episode(T, k=0, rng=None):
    """An episode whose states encode (k, position) in columns 0 and 1."""
    s = np.zeros((T, 4), np.float32)
    s[:, 0] = k
    s[:, 1] = np.arange(T)
    a = np.arange(T, dtype=np.int64) % 2
    r = np.ones(T, np.float32)
    return s, a, r


def test_import_needs_no_ray():
    code = "import sys, exreplay.ray as r; assert 'ray' not in sys.modules; print(r.Rollout.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Rollout"


def test_actor_round_trip_matches_local_buffer(cluster):
    kw = dict(state_shape=(4,), capacity=10_000, pick_len=3, allow_short=True, seed=7)
    sel = ["uniform", ("prioritized", {"alpha": 0.6, "beta": 0.4})]
    actor = _actor(selectors=sel, **kw)
    local = exreplay.ExperienceReplay(**kw)
    local.new_pick_selector(UNI)
    local.new_pick_selector(PRI, alpha=0.6, beta=0.4)
    rng = np.random.default_rng(0)
    for k in range(5):
        s, a, r = _episode(20 + k, k)
        p = rng.random(len(s)) + 0.1
        h1 = ray.get(actor.record_many.remote(None, s, a, r, terminated=True, priorities=p))
        h2 = local.record_many(None, s, a, r, terminated=True, priorities=p)
        assert h1 == h2
    cfg = ray.get(actor.config.remote())
    assert cfg["pick_len"] == 3 and cfg["selectors"][1] == ("prioritized", 0.6, 0.4)
    for ps in (0, 1):
        b1 = ray.get(actor.get_batch.remote(32, ps))
        b2 = local.get_batch(32, ps)
        assert isinstance(b1, exreplay.Batch)
        for x, y in zip((*b1, b1.weight), (*b2, b2.weight)):
            np.testing.assert_array_equal(x, y)
    # set_priority straight from the (read-only) arrays Ray handed back
    assert not b1.pick_epi.flags.writeable
    n1 = ray.get(actor.set_priority.remote(1, b1.pick_epi, b1.pick_pos, np.full(32, 3.0)))
    n2 = local.set_priority(1, b2.pick_epi, b2.pick_pos, np.full(32, 3.0))
    assert n1 == n2 == 32
    # several batches in one call: views of one draw
    bs = ray.get(actor.get_batch.remote(16, 1, 4))
    ref = split_batch(local.get_batch(64, 1), 4)
    assert len(bs) == 4
    for x, y in zip(bs, ref):
        np.testing.assert_array_equal(x.pick_epi, y.pick_epi)
        np.testing.assert_array_equal(x.weight, y.weight)
        np.testing.assert_array_equal(x.pick_index, y.pick_index)  # crosses Ray with the views
    # the learner's update with the indices the batches carried
    epi = np.concatenate([x.pick_epi for x in bs])
    pos = np.concatenate([x.pick_pos for x in bs])
    idx = np.concatenate([x.pick_index for x in bs])
    p = np.linspace(0.5, 4.0, 64)
    assert ray.get(actor.set_priority.remote(1, epi, pos, p, idx)) == local.set_priority(1, epi, pos, p) == 64
    e, q = local._picks()
    np.testing.assert_array_equal(ray.get(actor.call.remote("_priority", 1, e, q)), local._priority(1, e, q))
    # with_stats: the stats at the draw
    b, st = ray.get(actor.get_batch.remote(8, 1, None, True))
    assert st == local.priority_stats(1) if hasattr(local, "priority_stats") else st[2] == local.num_picks
    stats = ray.get(actor.stats.remote())
    assert stats["records"] == len(local) and stats["held_picks"] == local.num_picks
    assert stats["episodes"] == local.num_episodes
    assert stats["picks_sampled"] == 64 + 64 + 8 and stats["batches"] == 2 + 4 + 1
    assert {"inserts_per_s", "samples_per_s", "overlap_s"} <= set(stats)
    ray.kill(actor)


def test_read_only_inputs_are_accepted(cluster):
    s, a, r = _episode(50)
    p = np.linspace(0.1, 2.0, 50)
    s, a, r, p, fin = ray.get(ray.put((s, a, r, p, np.ones(4, np.float32))))
    assert not any(x.flags.writeable for x in (s, a, r, p, fin))
    for cls in (exreplay.ExperienceReplay, ReferenceReplay):
        buf = cls(state_shape=(4,), pick_len=2, allow_short=True, seed=0)
        ps = buf.new_pick_selector(PRI)
        buf.record_many(None, s, a, r, final_state=fin, priorities=p)
        buf.record(None, s[0], a[0], r[0], final_state=fin, priority=p[0])
        assert len(buf) == 51
        b = ray.get(ray.put(buf.get_batch(8, ps)))
        assert not b.pick_epi.flags.writeable
        assert buf.set_priority(ps, b.pick_epi, b.pick_pos, b.weight.astype(np.float64) + 1) == 8
        buf._check()


def test_split_and_concat_keep_pick_index():
    """Views of a batch and batches put back together keep the picks' table
    indices (set_priority's shortcut), the pure-Python buffer's too."""
    s, a, r = _episode(40)
    for cls in (exreplay.ExperienceReplay, ReferenceReplay):
        buf = cls(state_shape=(4,), pick_len=2, allow_short=True, seed=0)
        ps = buf.new_pick_selector(PRI)
        buf.record_many(None, s, a, r, terminated=True)
        b = buf.get_batch(12, ps)
        parts = split_batch(b, 3)
        whole = concat_batches(parts)
        np.testing.assert_array_equal(whole.pick_epi, b.pick_epi)
        assert type(whole) is type(b)
        for i, x in enumerate(parts):
            np.testing.assert_array_equal(x.pick_index, b.pick_index[4 * i:4 * i + 4])
        np.testing.assert_array_equal(whole.pick_index, b.pick_index)


def test_rollouts_keep_episodes_whole_and_streams_apart():
    # ReplayServer without Ray: the stream bookkeeping of record_rollout.
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=3, allow_short=True, seed=0)
    s, a, r = _episode(10, 1)
    fin = np.full((1, 4), 9, np.float32)
    # stream A: 4 open steps, then 6 steps ending the episode after 3, then an open tail
    srv.record_rollout("A", Rollout(s[:4], a[:4], r[:4], np.ones(4)), seq=0)
    srv.record_rollout("B", Rollout(s[:2], a[:2], r[:2]), seq=0)
    srv.record_rollout("A", Rollout(s[4:], a[4:], r[4:], np.ones(6), ends=[3], final_states=fin,
                                    terminated=[False]), seq=1)
    buf = srv.buf
    eps = [buf.episode(h) for h in buf._handles()]
    lens = sorted((len(e.state), e.ended) for e in eps)
    assert lens == [(2, False), (3, False), (7, True)]
    whole = [e for e in eps if e.ended][0]
    np.testing.assert_array_equal(whole.state[:, 1], np.arange(7))
    np.testing.assert_array_equal(whole.final_state, fin[0])
    assert not whole.terminated
    st = srv.stats()
    assert st["records"] == 12 and st["rollouts"] == 3


def _end_only(fin, terminated=True):
    """A rollout of no rows that ends the stream's open episode without a step."""
    return Rollout(np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32),
                   ends=[0], final_states=None if fin is None else np.asarray(fin)[None],
                   terminated=[terminated])


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_a_rollout_of_no_rows_ends_the_streams_open_episode(impl):
    """The episode a stream left open ends without a step (end_episode): its
    final state and end flag are the empty rollout's, its last steps' picks
    exist, and the buffer is what one rollout ending it would have left.
    Before, a stream's episode that ended with an empty rollout stayed open."""
    def server():
        srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=3, allow_short=True, seed=0,
                           impl=impl)
        return srv

    s, a, r = _episode(8, 1)
    fin = np.full(4, 9, np.float32)
    srv, twin = server(), server()
    assert srv.record_rollout("A", Rollout(s[:5], a[:5], r[:5], np.arange(1.0, 6.0)), seq=0) == 5
    # held until its predecessor comes, then recorded in order
    assert srv.record_rollout("A", _end_only(fin, False), seq=2) == 0
    assert srv.record_rollout("A", Rollout(s[5:], a[5:], r[5:], np.arange(6.0, 9.0)), seq=1) == 3
    twin.record_rollout("A", Rollout(s, a, r, np.arange(1.0, 9.0), ends=[8], final_states=fin[None],
                                     terminated=[False]))
    (h,) = srv.buf._handles()
    e = srv.buf.episode(h)
    assert e.ended and not e.terminated and np.array_equal(e.final_state, fin)
    assert srv.buf.num_picks == twin.buf.num_picks == 8
    if impl == "c":
        assert srv.buf.serialize(0) == twin.buf.serialize(0)
    st = srv.stats()
    assert st["records"] == 8 and st["rollouts"] == 3
    # the stream's next rollout starts a new episode; an empty one with none
    # open (a new stream, or after an end) ends nothing
    assert srv.record_rollout("A", _end_only(None), seq=3) == 0
    assert srv.record_rollout("B", _end_only(fin)) == 0
    srv.record_rollout("A", Rollout(s[:2], a[:2], r[:2]), seq=4)
    assert srv.record_rollout("A", _end_only(None)) == 0
    eps = [srv.buf.episode(h) for h in srv.buf._handles()]
    assert [(len(x.reward), bool(x.ended), bool(x.terminated)) for x in eps] == [
        (8, True, False), (2, True, True)]
    srv.buf._check()


def test_actor_end_episode_ends_a_handle_of_record_many(cluster):
    """The actor's end_episode (writers' group) ends an episode that its
    record_many left open; False for one evicted."""
    actor = _actor(state_shape=(4,), capacity=12, pick_len=2, seed=0, selectors=["uniform"])
    s, a, r = _episode(5, 2)
    h = ray.get(actor.record_many.remote(None, s, a, r))
    assert ray.get(actor.end_episode.remote(h, final_state=s[0], terminated=True)) is True
    h2 = ray.get(actor.record_many.remote(None, s, a, r))
    ray.get(actor.record_many.remote(None, s, a, r))
    ray.get(actor.record_many.remote(None, s, a, r))  # capacity 12: h, then h2 evicted
    assert ray.get(actor.end_episode.remote(h2, terminated=True)) is False
    with pytest.raises(ValueError, match="h: expected"):
        ray.get(actor.end_episode.remote(h2 + 10, terminated=True))
    buf = ray.get(actor.buffer.remote())
    assert all(buf.episode(x).ended is False for x in buf._handles())
    assert ray.get(actor.stats.remote())["records"] == 20
    ray.kill(actor)


def test_rollouts_of_no_rows_are_refused_unless_they_end():
    s, a, r = _episode(3, 1)
    z = (np.zeros((0, 4), np.float32), np.zeros(0, np.int64), np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="rollout: expected T >= 1 rows .* got 0, 0, 0"):
        Rollout(*z)
    with pytest.raises(ValueError, match=r"ends: expected strictly increasing indices in 1..3"):
        Rollout(s, a, r, ends=[0, 3])
    with pytest.raises(ValueError, match="final_states: required"):
        Rollout(*z, ends=[0], terminated=[False])
    with pytest.raises(ValueError, match="rollout: expected T >= 1 rows"):
        Rollout(*z, ends=[0, 0])
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)
    srv.record_rollout("A", Rollout(s, a, r))
    before = srv.buf.serialize(0)
    with pytest.raises(ValueError, match=r"final_states: expected shape \(1, 4\), got \(1, 3\)"):
        srv.record_rollout("A", Rollout(*z, ends=[0], final_states=np.zeros((1, 3), np.float32),
                                        terminated=[False]))
    assert srv.buf.serialize(0) == before  # refused before anything
    srv.record_rollout("A", Rollout(s, a, r))  # the stream's next rollout starts anew
    assert srv.buf.num_episodes == 2


def test_rollouts_out_of_order_are_held_not_waited_for():
    # A threaded actor may run a stream's rollouts out of order, even with one
    # thread in the writers' group: a rollout ahead of its turn is held (no
    # thread blocks) and recorded, in order, by the call that brings its predecessor.
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)
    s, a, r = _episode(12, 1)
    parts = [Rollout(s[i:i + 3], a[i:i + 3], r[i:i + 3]) for i in range(0, 12, 3)]
    assert srv.record_rollout("A", parts[2], seq=2) == 3
    assert srv.record_rollout("A", parts[1], seq=1) == 3
    assert len(srv.buf) == 0 and srv.stats()["records"] == 0  # both held
    with pytest.raises(ValueError, match="seq: expected a number not sent before"):
        srv.record_rollout("A", parts[1], seq=1)
    srv.record_rollout("A", parts[0], seq=0)  # records 0, 1, 2
    srv.record_rollout("A", parts[3], seq=3)
    eps = [srv.buf.episode(h) for h in srv.buf._handles()]
    assert len(eps) == 1 and not eps[0].ended  # one open episode, in order
    np.testing.assert_array_equal(eps[0].state[:, 1], np.arange(12))
    with pytest.raises(ValueError, match="seq: expected"):
        srv.record_rollout("A", parts[0], seq=0)
    assert srv.stats()["records"] == 12


def test_failed_rollout_records_nothing_and_resets_its_stream():
    # A rollout refused for its inputs records none of its pieces, and the
    # stream's next rollout starts a new episode instead of joining the open
    # one across the rows that did not go in.
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)
    s, a, r = _episode(20, 1)
    srv.record_rollout("A", Rollout(s[:4], a[:4], r[:4]), seq=0)  # an open episode of 4 steps
    bad_p = np.ones(6)
    bad_p[4] = np.nan  # in the second piece
    with pytest.raises(ValueError, match="priorities: expected finite numbers >= 0, got nan at index 4"):
        srv.record_rollout("A", Rollout(s[4:10], a[4:10], r[4:10], bad_p, ends=[3]), seq=1)
    fin = np.zeros((1, 3), np.float32)  # a final state of the wrong shape, in the second piece
    with pytest.raises(ValueError, match=r"final_states: expected shape \(1, 4\), got \(1, 3\)"):
        srv.record_rollout("A", Rollout(s[4:10], a[4:10], r[4:10], ends=[5], final_states=fin,
                                        terminated=[False]), seq=2)
    with pytest.raises(TypeError, match="final_states: expected a dtype that casts to float32"):
        srv.record_rollout("A", Rollout(s[4:10], a[4:10], r[4:10], ends=[5], terminated=[False],
                                        final_states=np.zeros((1, 4), np.complex64)), seq=3)
    assert len(srv.buf) == 4 and srv.stats()["records"] == 4  # nothing of the three went in
    srv.record_rollout("A", Rollout(s[10:13], a[10:13], r[10:13]), seq=4)
    eps = sorted((srv.buf.episode(h) for h in srv.buf._handles()), key=lambda e: e.state[0, 1])
    assert [e.state[:, 1].tolist() for e in eps] == [[0, 1, 2, 3], [10, 11, 12]]
    assert not any(e.ended for e in eps)
    # the same without seq, failing in its first (open) piece: a new episode after it
    bad_p = np.ones(2)
    bad_p[1] = -1.0
    with pytest.raises(ValueError, match="priorities: expected finite numbers >= 0, got -1.0 at index 1"):
        srv.record_rollout("A", Rollout(s[13:15], a[13:15], r[13:15], bad_p))
    srv.record_rollout("A", Rollout(s[15:17], a[15:17], r[15:17]))
    assert sorted(srv.buf.episode(h).state[:, 1].tolist() for h in srv.buf._handles()) == [
        [0, 1, 2, 3], [10, 11, 12], [15, 16]]
    # named fields: a final state without one of them
    fsrv = ReplayServer(state_spec=FSPEC, extras_spec=XSPEC, capacity=None, pick_len=2, seed=0,
                        selectors=[("uniform", {})])
    ro = _field_rollout(5, 0, ends=[2, 5])
    del ro.final_states["k"]
    with pytest.raises(ValueError, match=r"final_states: expected the fields \['k', 'obs'\], got the fields"):
        fsrv.record_rollout("A", ro)
    assert len(fsrv.buf) == 0
    st = srv.stats()
    assert st["records"] == 9 and st["rollouts"] == 3
    srv.buf._check()


@pytest.mark.parametrize("impl, how", [("c", "pickle"), ("c", "unserialize"), ("c", "deepcopy"),
                                       ("reference", "pickle"), ("reference", "deepcopy")])
def test_server_of_a_restored_buffer_anneals_its_selectors(impl, how):
    # ReplayServer without Ray: a server of a restored buffer (buffer=) takes
    # the selectors the buffer holds, with the beta set before the checkpoint,
    # and set_beta anneals them as on the original server (it was a KeyError:
    # only selectors the server had created had objects).
    import copy

    srv = ReplayServer(impl=impl, state_shape=(4,), capacity=None, pick_len=1, seed=3,
                       selectors=["uniform", ("prioritized", {"alpha": 0.7, "beta": 0.4}),
                                  ("rank", {"alpha": 0.8, "beta": 0.5})])
    s, a, r = _episode(40)
    srv.record_many(None, s, a, r, terminated=True, priorities=np.arange(1, 41.0) % 9 + 0.5)
    srv.set_beta(1, 0.6)
    buf = srv.buffer()
    restored = {"pickle": lambda: pickle.loads(pickle.dumps(buf)),
                "unserialize": lambda: type(buf).unserialize(buf.serialize(level=1)),
                "deepcopy": lambda: copy.deepcopy(buf)}[how]()
    srv2 = ReplayServer(buffer=restored)
    assert srv2.impl == impl
    assert srv2.selectors() == srv.selectors() == {
        0: ("uniform", None, None), 1: ("prioritized", 0.7, 0.6), 2: ("rank", 0.8, 0.5)}
    epi, pos = buf._picks()
    for h in (1, 2):
        w0 = srv2.buf._gather(h, epi, pos).weight
        for beta in (0.9, 1.0):
            srv.set_beta(h, beta)
            srv2.set_beta(h, beta)
            assert srv2.selectors()[h][2] == beta and srv2.buf.pick_selector(h).beta == beta
            w = srv2.buf._gather(h, epi, pos).weight
            np.testing.assert_array_equal(w, srv.buf._gather(h, epi, pos).weight)
            assert not np.array_equal(w, w0)
            x, y = srv.get_batch(8, h), srv2.get_batch(8, h)
            np.testing.assert_array_equal(x.pick_epi, y.pick_epi)
            np.testing.assert_array_equal(x.weight, y.weight)
    assert srv2.priority_stats(2) == pytest.approx(srv.priority_stats(2))
    # a selector added to the served buffer afterwards, and errors as the buffer's own
    assert srv2.new_pick_selector("prioritized", beta=0.2) == 3
    srv2.set_beta(3, 0.3)
    assert srv2.selectors()[3] == ("prioritized", 0.6, 0.3)
    with pytest.raises(ValueError, match="^ps: expected a pick selector of this buffer"):
        srv2.set_beta(7, 1.0)
    with pytest.raises(TypeError, match="^ps: expected"):
        srv2.set_beta("1", 1.0)
    with pytest.raises(ValueError, match="^beta: expected a finite number >= 0"):
        srv2.set_beta(1, -1.0)
    with pytest.raises(AttributeError):
        srv2.set_beta(0, 1.0)  # a uniform selector has no beta


def test_server_of_a_restored_buffer_checks_the_selectors_given():
    # selectors= with buffer= must list the kinds of the buffer's selectors
    # in handle order; its parameters are not applied (the buffer's are kept).
    src = ReplayServer(state_shape=(4,), capacity=None, seed=0,
                       selectors=["uniform", ("prioritized", {"alpha": 0.7, "beta": 0.5})])
    buf = pickle.loads(pickle.dumps(src.buffer()))
    srv = ReplayServer(buffer=buf, selectors=["uniform", ("prioritized", {"beta": 0.9})])
    assert srv.selectors() == {0: ("uniform", None, None), 1: ("prioritized", 0.7, 0.5)}
    for bad in (["prioritized"], ["uniform", "rank"], ["uniform", "prioritized", "uniform"]):
        with pytest.raises(ValueError, match=r"^selectors: expected the kinds of the buffer's "
                                             r"selectors in handle order, \['uniform', "
                                             r"'prioritized'\], got \["):
            ReplayServer(buffer=buf, selectors=bad)
    assert ReplayServer(buffer=buf).selectors() == srv.selectors()


def test_failed_calls_raise_the_buffers_error_and_count_nothing():
    srv = ReplayServer(state_shape=(4,), capacity=None, pick_len=1, seed=0)
    s, a, r = _episode(5)
    with pytest.raises(TypeError, match="actions: expected an array-like of int64, got None"):
        srv.record_many(None, s, None, r)
    with pytest.raises(ValueError, match="priorities: expected finite numbers >= 0"):
        srv.record_many(None, s, a, r, priorities=[1, 1, np.nan, 1, 1])
    with pytest.raises(ValueError, match="get_batch: no pick can be drawn"):
        srv.get_batch(8, 0)
    with pytest.raises(ValueError, match=r"pick_epi: expected shape \(T,\), got \(\)"):
        srv.set_priority(0, 5, 5, 1.0)
    counters = ("records", "rollouts", "picks_sampled", "batches", "priority_updates")
    st = srv.stats()
    assert [st[k] for k in counters] == [0] * 5
    assert st["write_busy_s"] > 0 and st["sample_busy_s"] > 0  # the time still counts
    assert len(srv.buf) == 0
    srv.record_many(None, s, a, r, terminated=True)
    b = srv.get_batch(4, 0)
    srv.set_priority(0, b.pick_epi, b.pick_pos, 2.0)
    st = srv.stats()
    assert [st[k] for k in counters] == [5, 1, 4, 1, 4]


def test_concurrent_writers_and_learner(cluster):
    """3 Ray actors record_rollout into one ReplayActor while a learner samples and
    updates priorities; the buffer stays consistent, every episode whole, and
    inserts and sampling overlap inside the actor."""
    replay = ShardedReplay(1, state_shape=(4,), capacity=None, pick_len=3, allow_short=True, seed=3,
                           selectors=[("prioritized", {})], actor_options={"num_cpus": 0})
    replay.wait_ready()
    W, R, T = 3, 40, 100

    @ray.remote(num_cpus=0)
    def writer(w, replay):
        rng = np.random.default_rng(w)
        step = 0
        refs = []
        for _ in range(R):
            s = np.zeros((T, 4), np.float32)
            s[:, 0] = w
            s[:, 1] = np.arange(step, step + T)
            ends = np.sort(rng.choice(np.arange(1, T + 1), size=2, replace=False))
            ro = Rollout(s, np.zeros(T, np.int64), np.ones(T, np.float32), rng.random(T) + 0.01,
                         ends=ends, final_states=np.zeros((2, 4), np.float32), terminated=[True, False])
            refs += replay.record_rollout(w, ro)
            step += T
        ray.get(refs)
        return step

    @ray.remote(num_cpus=0)
    class LearnerLoop:
        def __init__(self):
            self.stop = False

        def run(self, replay):
            n = 0
            while not self.stop:
                try:
                    b = replay.get_batch(64, 0)
                except Exception:  # noqa: BLE001 - nothing recorded yet
                    time.sleep(0.001)
                    continue
                replay.set_priority(0, b.pick_epi, b.pick_pos, np.abs(b.weight) + 0.5, wait=True)
                n += 1
            return n

        def halt(self):
            self.stop = True

    learner = LearnerLoop.options(max_concurrency=2).remote()
    job = learner.run.remote(replay)
    steps = ray.get([writer.remote(w, replay) for w in range(W)])
    time.sleep(0.2)
    ray.get(learner.halt.remote())
    n_batches = ray.get(job)
    assert steps == [R * T] * W and n_batches > 0
    st = replay.stats()
    assert st["records"] == W * R * T == st["held_records"]
    assert st["batches"] >= n_batches
    buf = replay.buffers()[0]
    buf._check()
    # every episode is a run of consecutive steps of one writer
    total = 0
    for h in buf._handles():
        e = buf.episode(h)
        assert len(np.unique(e.state[:, 0])) == 1
        np.testing.assert_array_equal(np.diff(e.state[:, 1]), 1)
        total += len(e.state)
    assert total == W * R * T
    replay.shutdown()


def test_inserts_and_sampling_overlap(cluster):
    """Writers (concurrency group "writers") and the learner ("learner") run in
    the actor at the same time: with 84x84 frames, each call copies enough for
    the meter to catch a writer and a sampler inside the buffer at once."""
    actor = _actor(state_shape=(84, 84), state_dtype="uint8", capacity=20_000, seed=0, selectors=["uniform"])
    T = 100
    frames = np.random.default_rng(0).integers(0, 256, size=(T, 84, 84), dtype=np.uint8)
    fref = ray.put(frames)
    ray.get(actor.record_many.remote(None, fref, np.zeros(T, np.int64), np.ones(T, np.float32)))

    @ray.remote(num_cpus=0)
    def writer(actor, frames, n):
        ray.get([actor.record_many.remote(None, frames, np.zeros(T, np.int64), np.ones(T, np.float32))
                 for _ in range(n)])

    @ray.remote(num_cpus=0)
    def sampler(actor, seconds):
        t_end = time.time() + seconds
        n = 0
        while time.time() < t_end:
            ray.get([actor.get_batch.remote(256, 0) for _ in range(4)])
            n += 4
        return n

    deadline = time.time() + 30
    st = {}
    while time.time() < deadline:
        job = sampler.remote(actor, 2.0)
        ray.get([writer.remote(actor, fref, 40) for _ in range(2)])
        ray.get(job)
        st = ray.get(actor.stats.remote())
        if st["overlap_s"] > 0:
            break
    assert st["overlap_s"] > 0, st
    assert st["records"] >= 81 * T
    ray.kill(actor)


def test_learner_inside_the_replay_actor(cluster):
    """replay_actor_class: a ReplayServer subclass whose own method (a learner
    loop drawing with local calls) runs in the "learner" group while writers'
    record_rollout calls land in the "writers" group and stats() answers in
    "control"; every drawn row is one that a writer recorded."""
    from exreplay.ray import replay_actor_class

    class Learner(ReplayServer):
        def learn(self, seconds):
            t_end = time.time() + seconds
            n, bad = 0, 0
            while time.time() < t_end:
                bs = self.get_batch(8, 0, 4)
                for b in bs:
                    st = b.state.reshape(len(b.pick_epi), -1, 4)[:, 0]
                    bad += int(np.sum(st[:, 2] != st[:, 0] * 1000 + st[:, 1]))
                epi = np.concatenate([b.pick_epi for b in bs])
                pos = np.concatenate([b.pick_pos for b in bs])
                self.set_priority(0, epi, pos, np.full(len(epi), 2.0))
                n += len(bs)
            return n, bad

    with pytest.raises(TypeError, match="cls: expected ReplayServer"):
        replay_actor_class(object)
    with pytest.raises(ValueError, match="default_group"):
        replay_actor_class(Learner, default_group="nope")
    actor = replay_actor_class(Learner).remote(state_shape=(4,), capacity=5_000, pick_len=2, seed=0,
                                               selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})])
    T = 50

    def rollout(k):
        s, a, r = _episode(T, k)
        s[:, 2] = s[:, 0] * 1000 + s[:, 1]
        return Rollout(s, a, r, np.ones(T), ends=[T], terminated=[True])

    ray.get(actor.record_rollout.remote("w", rollout(0), 0))
    job = actor.learn.remote(4.0)
    seq = 1
    t0 = time.time()
    while time.time() - t0 < 2.0:  # the learner's call is running: writers and control still answer
        ray.get(actor.record_rollout.remote("w", rollout(seq), seq))
        seq += 1
    st = ray.get(actor.stats.remote())
    assert ray.wait([job], timeout=0)[0] == []  # the learner's call has not returned yet
    n, bad = ray.get(job)
    assert n > 0 and bad == 0
    assert st["records"] == seq * T
    assert ray.get(actor.stats.remote())["priority_updates"] == n * 8
    ray.kill(actor)


def test_actor_class_leaves_static_and_class_methods_alone(cluster):
    """replay_actor_class forwards the subclass's plain methods only: its
    staticmethods, classmethods and nested classes work as in the class."""
    from exreplay.ray import replay_actor_class

    class Tools(ReplayServer):
        class Note:
            def __init__(self, text):
                self.text = text

        @staticmethod
        def twice(x):
            return 2 * x

        @classmethod
        def name(cls):
            return cls.__name__

        def use(self, x):
            return self.twice(x), Tools.twice(x), self.name(), self.Note("hi").text

    actor = replay_actor_class(Tools, name="Tools").options(num_cpus=0).remote(
        state_shape=(4,), capacity=100, pick_len=1, seed=0)
    try:
        assert ray.get(actor.use.remote(3)) == (6, 6, "Tools", "hi")
    finally:
        ray.kill(actor)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's")
def test_group_nice_lowers_only_that_groups_threads(cluster):
    """replay_actor_class(group_nice={"writers": n}): the writers group's
    threads run n nice levels below the others (capped at 19), the learner's
    and control's threads keep theirs (also when they call a writers' method
    locally), and the writers still record."""
    from exreplay.ray import replay_actor_class

    def nice():
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    class W(ReplayServer):
        def writer_nice(self):
            return nice()

    class L(ReplayServer):
        def learner_nice(self):
            # a local call into a "writers" method
            self.record_many(None, np.zeros((5, 4), np.float32), np.zeros(5, np.int64), np.ones(5, np.float32),
                             terminated=True)
            return nice()

    with pytest.raises(ValueError, match="group_nice"):
        replay_actor_class(W, group_nice={"nope": 3})
    with pytest.raises(ValueError, match="group_nice"):
        replay_actor_class(W, group_nice={"writers": -1})
    kw = dict(state_shape=(4,), capacity=1_000, pick_len=1, seed=0)
    base = ray.get(replay_actor_class(L, name="L0").remote(**kw).learner_nice.remote())
    w = replay_actor_class(W, default_group="writers", group_nice={"writers": 3}, name="W3").remote(**kw)
    got = set(ray.get([w.writer_nice.remote() for _ in range(8)]))  # both writer threads, once or more
    assert got == {min(19, base + 3)}
    assert ray.get(w.writer_nice.remote()) == min(19, base + 3)  # once per thread, not once per call
    lr = replay_actor_class(L, group_nice={"writers": 3}, name="L3").remote(**kw)
    s, a, r = _episode(20)
    assert ray.get(lr.record_rollout.remote("w", Rollout(s, a, r, ends=[20]), 0)) == 20
    assert ray.get(lr.learner_nice.remote()) == base
    assert len(ray.get(lr.get_batch.remote(4, 0)).pick_epi) == 4


_NICE = "an int in [0, 39] (nice levels)"
_GROUPS = "['control', 'learner', 'writers']"


def test_replay_actor_class_checks_its_arguments():
    """Every argument of replay_actor_class is checked before a class is
    built (no cluster needed): a wrong type is a TypeError naming the
    argument, or its key, and the type (not the value's repr), a wrong value
    a ValueError. group_nice of a wrong type was a ValueError showing the
    value, and a list of pairs was taken as a dict."""
    from exreplay.ray import replay_actor_class

    class W(ReplayServer):
        def work(self):
            return 1

    for kwargs, exc, msg in (
            (dict(group_nice=[("writers", 3)]), TypeError,
             "group_nice: expected None or a dict {group: nice levels}, got list"),
            (dict(group_nice="writers"), TypeError,
             "group_nice: expected None or a dict {group: nice levels}, got str"),
            (dict(group_nice=4), TypeError, "group_nice: expected None or a dict {group: nice levels}, got int"),
            (dict(group_nice={"writers": 2.5}), TypeError, f"group_nice['writers']: expected {_NICE}, got float"),
            (dict(group_nice={"writers": "3"}), TypeError, f"group_nice['writers']: expected {_NICE}, got str"),
            (dict(group_nice={"writers": True}), TypeError, f"group_nice['writers']: expected {_NICE}, got bool"),
            (dict(group_nice={"writers": None}), TypeError,
             f"group_nice['writers']: expected {_NICE}, got NoneType"),
            (dict(group_nice={1: 3}), TypeError,
             f"group_nice: expected group names (str) as keys, among {_GROUPS}, got a key of type int"),
            (dict(group_nice={"writers": -1}), ValueError, f"group_nice['writers']: expected {_NICE}, got -1"),
            (dict(group_nice={"writers": 40}), ValueError, f"group_nice['writers']: expected {_NICE}, got 40"),
            (dict(group_nice={"nope": 3}), ValueError,
             f"group_nice: expected group names (str) as keys, among {_GROUPS}, got 'nope'"),
            (dict(concurrency_groups=[("writers", 1)]), TypeError,
             "concurrency_groups: expected None or a dict {group: threads}, got list"),
            (dict(concurrency_groups={"writers": 1.5, "learner": 1, "control": 1}), TypeError,
             "concurrency_groups['writers']: expected an int >= 1 (threads), got float"),
            (dict(concurrency_groups={"writers": 0, "learner": 1, "control": 1}), ValueError,
             "concurrency_groups['writers']: expected an int >= 1 (threads), got 0"),
            (dict(concurrency_groups={("writers",): 1}), TypeError,
             "concurrency_groups: expected group names (str) as keys, got a key of type tuple"),
            (dict(default_group=0), TypeError, f"default_group: expected one of {_GROUPS}, got int"),
            (dict(default_group="nope"), ValueError, f"default_group: expected one of {_GROUPS}, got 'nope'"),
            (dict(name=5), TypeError, "name: expected None or a class name (str), got int"),
            (dict(name=""), ValueError, "name: expected None or a class name (str), got ''")):
        with pytest.raises(exc) as got:
            replay_actor_class(W, **kwargs)
        assert str(got.value) == msg, kwargs
    for cls, msg in ((5, "int"), ("W", "str"), (object, "the class builtins.object")):
        with pytest.raises(TypeError) as got:
            replay_actor_class(cls)
        assert str(got.value) == f"cls: expected ReplayServer or a subclass of it, got {msg}"
    # taken: ints (NumPy's too), an empty dict or None for no nice
    for nice in (None, {}, {"writers": np.int64(4), "control": 0}):
        assert replay_actor_class(W, group_nice=nice, name="W") is not None
    assert replay_actor_class(W, concurrency_groups={"writers": np.int32(1), "learner": 1, "control": 1})


def test_pickling_through_the_object_store(cluster):
    buf = exreplay.ExperienceReplay(state_shape=(4,), capacity=1000, pick_len=2, seed=11)
    ps = buf.new_pick_selector(PRI, alpha=0.7, beta=0.5)
    for k in range(8):
        s, a, r = _episode(30, k)
        buf.record_many(None, s, a, r, terminated=True, priorities=np.arange(1, 31.0))
    ref = ray.put(buf)
    buf2 = ray.get(ref)
    assert buf2.serialize(level=0) == buf.serialize(level=0)
    np.testing.assert_array_equal(buf2.get_batch(16, int(ps)).pick_pos, buf.get_batch(16, ps).pick_pos)
    # a whole buffer into an actor (an argument resolved from the object store) and back
    actor = _actor(buffer=ref, selectors=[("prioritized", {"alpha": 0.7, "beta": 0.5})])
    back = ray.get(actor.buffer.remote())
    assert len(back) == len(buf) == 240 and back.num_picks == buf.num_picks
    b = ray.get(actor.get_batch.remote(16, 0))
    assert b.state.shape == (16, 2, 4)
    assert ray.get(actor.priority_stats.remote(0)) == pytest.approx(buf.priority_stats(ps)) \
        if hasattr(buf, "priority_stats") else True
    ray.kill(actor)


def test_reference_buffer_in_an_actor(cluster):
    actor = _actor(impl="reference", state_shape=(4,), pick_len=2, allow_short=True, seed=0,
                   selectors=["uniform", "prioritized"])
    s, a, r = _episode(20)
    ray.get(actor.record_many.remote(None, s, a, r, terminated=True, priorities=np.arange(1, 21.0)))
    b = ray.get(actor.get_batch.remote(8, 1))
    assert b.weight.shape == (8,)
    total, mn, n = ray.get(actor.priority_stats.remote(1))
    assert n == 20 and mn == pytest.approx(1.0) and total == pytest.approx(np.sum(np.arange(1, 21.0) ** 0.6), rel=1e-5)
    assert ray.get(actor.priority_stats.remote(0)) == (20.0, 1.0, 20)
    ray.kill(actor)


def _views_of_seq(b):
    """Whether b's state and state_next are the views [:, :-1] and [:, 1:] of
    its C-contiguous state_seq: the same memory at the same strides."""
    seq, st, nx = b.state_seq, b.state, b.state_next
    return (seq is not None and seq.flags.c_contiguous and np.shares_memory(st, seq)
            and st.strides == nx.strides == seq.strides and st.ctypes.data == seq.ctypes.data
            and nx.ctypes.data == seq.ctypes.data + seq.strides[1])


def _oob_bytes(x):
    """What x costs pickled as Ray pickles it: protocol 5, buffers out of band."""
    bufs = []
    data = pickle.dumps(x, protocol=5, buffer_callback=bufs.append)
    return len(data) + sum(memoryview(b).nbytes for b in bufs)


def test_shared_next_through_the_object_store(cluster):
    """get_batch(..., shared_next=True) of a ReplayActor and of a
    ShardedReplay: the learner gets the buffer's own shared batches for the
    same seed through Ray, each batch's state and state_next views of its own
    state_seq, pick_index kept, in fewer bytes than default batches."""
    kw = dict(state_shape=(16, 16), state_dtype=np.uint8, pick_len=8, allow_short=True, seed=4)
    sel = [("prioritized", {"alpha": 0.6, "beta": 0.4})]
    actor = _actor(selectors=sel, capacity=10_000, **kw)
    local = exreplay.ExperienceReplay(capacity=10_000, **kw)
    local.new_pick_selector(PRI, alpha=0.6, beta=0.4)
    sh = ShardedReplay(2, selectors=sel, capacity=None, actor_options={"num_cpus": 0}, **kw)
    rng = np.random.default_rng(0)
    for k in range(8):
        T = int(rng.integers(3, 20))
        s = ((k * 31 + np.arange(T)) % 250 + 1).astype(np.uint8)[:, None, None] * np.ones((1, 16, 16), np.uint8)
        a, r, p = np.zeros(T, np.int64), np.ones(T, np.float32), rng.random(T) + 0.1
        fin = s[-1] + 1 if k % 2 else None
        ray.get(actor.record_many.remote(None, s, a, r, final_state=fin, terminated=k % 2 == 0, priorities=p))
        local.record_many(None, s, a, r, final_state=fin, terminated=k % 2 == 0, priorities=p)
        sh.record_episode(s, a, r, final_state=fin, terminated=k % 2 == 0, priorities=p, wait=True)
    bs = ray.get(actor.get_batch.remote(16, 0, 4, shared_next=True))
    want = split_batch(local.get_batch(64, 0, shared_next=True), 4)
    for x, y in zip(bs, want):
        assert isinstance(x, exreplay.Batch) and _views_of_seq(x)
        assert x.state.base is x.state_seq and x.state_next.base is x.state_seq
        for name in ("state_seq", "state", "state_next", "action", "reward", "seq_len", "pick_epi",
                     "pick_pos", "weight", "pick_index"):
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)
    b = ray.get(actor.get_batch.remote(32, 0, shared_next=True))
    y = local.get_batch(32, 0, shared_next=True)
    assert _views_of_seq(b)
    np.testing.assert_array_equal(b.state_seq, y.state_seq)
    np.testing.assert_array_equal(b.pick_index, y.pick_index)
    d = ray.get(actor.get_batch.remote(32, 0))
    assert d.state_seq is None and _oob_bytes(b) < 0.7 * _oob_bytes(d)
    # across shards: state_seq put together, each batch with views of its own
    for x in [sh.get_batch(24, 0, shared_next=True)] + sh.get_batch(8, 0, n_batches=3, shared_next=True):
        assert _views_of_seq(x) and x.state.base is x.state_seq
        shard, epi = sh.decode(x.pick_epi)
        for i in np.unique(shard):  # the rows are those picks' in their shard
            m = shard == i
            g = ray.get(sh.shards[int(i)].call.remote("_gather", 0, epi[m], x.pick_pos[m]))
            np.testing.assert_array_equal(x.state_next[m], g.state_next)
            np.testing.assert_array_equal(x.state_seq[m][:, :-1][g.seq_len == 8], g.state[g.seq_len == 8])
            np.testing.assert_array_equal(x.pick_index[m], g.pick_index)
    sh.shutdown()
    ray.kill(actor)


def _fill_pair(n_shards, seed, kinds):
    """A ShardedReplay and one local buffer holding the same episodes."""
    sel = [(k, {"alpha": 0.6, "beta": 0.4} if k == "prioritized" else {}) for k in kinds]
    kw = dict(state_shape=(4,), capacity=None, pick_len=2, allow_short=True)
    sh = ShardedReplay(n_shards, selectors=sel, seed=seed, actor_options={"num_cpus": 0}, **kw)
    single = ReplayServer(selectors=sel, seed=seed, **kw)
    rng = np.random.default_rng(seed)
    for k in range(24):
        T = int(rng.integers(2, 9))
        s, a, r = _episode(T, k)
        # priorities span two decades; shard minima differ
        p = np.exp(rng.uniform(np.log(0.05), np.log(5.0), size=T))
        sh.record_episode(s, a, r, terminated=True, priorities=p, wait=True)
        single.record_many(None, s, a, r, terminated=True, priorities=p)
    return sh, single


def _key(b):
    st = b.state[:, 0, :2].astype(np.int64)
    return st[:, 0] * 100 + st[:, 1]


@pytest.mark.parametrize("kind", ["prioritized", "uniform"])
def test_sharded_selection_matches_one_buffer(cluster, kind):
    from scipy import stats as sps

    sh, single = _fill_pair(3, 5, [kind])
    buf = single.buf
    epi, pos = buf._picks()
    allb = buf._gather(0, epi, pos)
    keys = _key(allb)
    if kind == "prioritized":
        pa = buf.stored_priorities(0, epi, pos) if hasattr(buf, "stored_priorities") else buf._priority(0, epi, pos)
        p_single = pa / pa.sum()
    else:
        p_single = np.full(len(keys), 1.0 / len(keys))
    weight_of = dict(zip(keys.tolist(), allb.weight.tolist()))
    # the shards together hold what the single buffer holds
    tot_s, min_s, n_s = sh.priority_stats(0)
    tot_1, min_1, n_1 = single.priority_stats(0)
    assert n_s == n_1 == len(keys)
    assert tot_s == pytest.approx(tot_1, rel=1e-6) and min_s == pytest.approx(min_1, rel=1e-6)
    shard_mins = [s[1] for s in ray.get([a.priority_stats.remote(0) for a in sh.shards])]
    if kind == "prioritized":
        assert len(set(shard_mins)) > 1  # global renormalisation really matters here
    counts = dict.fromkeys(keys.tolist(), 0)
    draws = 0
    for i in range(40):
        b = sh.get_batch(500, 0, fresh_stats=(i % 2 == 0))
        k = _key(b)
        for key in k.tolist():
            counts[key] += 1
        draws += len(k)
        # weights: what the single buffer gives the same picks
        np.testing.assert_allclose(b.weight, [weight_of[x] for x in k.tolist()], rtol=2e-5)
        shard, local = sh.decode(b.pick_epi)
        assert set(shard.tolist()) <= {0, 1, 2}
    obs = np.array([counts[x] for x in keys.tolist()])
    chi = sps.chisquare(obs, p_single * draws)
    assert chi.pvalue > 1e-4, (chi, obs[:10], (p_single * draws)[:10])
    sh.shutdown()


def test_sharded_set_priority_routes_updates(cluster):
    sh, _ = _fill_pair(3, 9, ["prioritized"])
    b = sh.get_batch(64, 0)
    new = np.linspace(0.5, 7.0, 64)
    shard, local = sh.decode(b.pick_epi)
    for s in np.unique(shard):  # each pick_index is its shard's own table index
        m = shard == s
        e, q = ray.get(sh.shards[int(s)].call.remote("_picks"))
        np.testing.assert_array_equal(e[b.pick_index[m]], local[m])
        np.testing.assert_array_equal(q[b.pick_index[m]], b.pick_pos[m])
    applied = sh.set_priority(0, b.pick_epi, b.pick_pos, new, wait=True, pick_index=b.pick_index)
    assert applied == 64
    last = {}
    for i in range(64):  # the last value wins where a pick repeats
        last[(int(shard[i]), int(local[i]), int(b.pick_pos[i]))] = new[i]
    for (s, e, p), v in last.items():
        got = ray.get(sh.shards[s].call.remote("stored_priorities", 0, np.array([e]), np.array([p])))
        assert got[0] == pytest.approx(v**0.6, rel=1e-6)
    # n batches across shards, shuffled together
    bs = sh.get_batch(32, 0, n_batches=3)
    assert len(bs) == 3 and all(x.pick_epi.shape == (32,) for x in bs)
    sh.shutdown()


def test_sharded_record_episode_from_two_copies(cluster):
    """Copies of one ShardedReplay (as Ray tasks and actors hold them) record
    whole episodes at once: none is refused or lost."""
    import pickle

    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    try:
        copies = [pickle.loads(pickle.dumps(sh)) for _ in range(2)]
        for k in range(3):
            for c, cp in enumerate(copies):
                s, a, r = _episode(5, 10 * c + k)
                assert cp.record_episode(s, a, r, wait=True) == 5
        refs = []
        for c, cp in enumerate(copies):  # and without waiting: every one goes in
            s, a, r = _episode(4, 100 + c)
            refs += cp.record_episode(s, a, r)
        assert sum(ray.get(refs)) == 8
        for cp in copies:  # episodes need no end_stream: a copy keeps none of their calls
            assert list(cp._streams) == [_EPISODES] and cp._streams[_EPISODES]["pending"] == []
        bufs = sh.buffers()
        keys = sorted(int(b.episode(h).state[0, 0]) for b in bufs for h in b._handles())
        assert keys == [0, 1, 2, 10, 11, 12, 100, 101]
        assert all(b.episode(h).ended for b in bufs for h in b._handles())
    finally:
        sh.shutdown()


def test_record_episode_and_a_stream_named_like_it_stay_apart(cluster):
    """record_episode's whole episodes go under a stream id of their own,
    equal to nothing a sender can name: a sender's stream called
    "__episodes__" (the id they used to share, which appended the whole
    episode to the sender's open one) keeps its open episode."""
    sh = ShardedReplay(1, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    try:
        s, a, r = _episode(5)
        assert sh.record_rollout("__episodes__", Rollout(s, a, r), wait=True) == 5  # left open
        s2, a2, r2 = _episode(5, 100)
        assert sh.record_episode(s2, a2, r2, wait=True) == 5
        # not a Rollout: a TypeError naming it, no routing kept (an AttributeError before)
        with pytest.raises(TypeError, match=r"^rollout: expected a Rollout, got tuple$"):
            sh.record_rollout("w", (s, a, r))
        assert "w" not in sh._streams
        (b,) = sh.buffers()
        eps = [b.episode(h) for h in b._handles()]
        assert sorted((len(e.action), e.ended) for e in eps) == [(5, False), (5, True)]
    finally:
        sh.shutdown()
    assert pickle.loads(pickle.dumps(_EPISODES)) == _EPISODES and _EPISODES != "__episodes__"

def test_sharded_get_batch_after_a_failed_draw(cluster):
    """get_batch(fresh_stats=False) splits by the previous call's stats; a
    draw that fails on them (a shard left with nothing to draw) drops them,
    so the next call reads fresh stats instead of failing the same way."""
    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})], actor_options={"num_cpus": 0})
    try:
        for k in range(2):  # one episode on each shard
            s, a, r = _episode(10, k)
            sh.record_episode(s, a, r, wait=True)
        sh.get_batch(32, 0, fresh_stats=False)
        e, q = ray.get(sh.shards[0].call.remote("_picks"))
        assert ray.get(sh.shards[0].set_priority.remote(0, e, q, 0.0)) == 10  # shard 0: nothing to draw
        with pytest.raises(ValueError, match="get_batch"):
            sh.get_batch(32, 0, fresh_stats=False)  # split by the stale stats: shard 0 refuses
        for _ in range(2):
            b = sh.get_batch(32, 0, fresh_stats=False)
            assert set(sh.decode(b.pick_epi)[0].tolist()) == {1}
    finally:
        sh.shutdown()


def test_sharded_rollouts_spread_and_stay_whole(cluster):
    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=3, allow_short=True, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    step = 0
    refs = []
    for _ in range(30):
        s = np.zeros((50, 4), np.float32)
        s[:, 1] = np.arange(step, step + 50)
        refs += sh.record_rollout("w", Rollout(s, np.zeros(50, np.int64), np.ones(50, np.float32),
                                               ends=[17, 40], terminated=[True, True]))
        step += 50
    ray.get(refs)
    bufs = sh.buffers()
    sizes = [len(b) for b in bufs]
    assert sum(sizes) == 1500 and min(sizes) > 400
    for b in bufs:
        b._check()
        for h in b._handles():
            e = b.episode(h)
            np.testing.assert_array_equal(np.diff(e.state[:, 1]), 1)
    sh.shutdown()


def test_sharded_rollout_of_no_rows_ends_the_open_episode_on_its_shard(cluster):
    """An empty rollout goes to the shard that holds the stream's open
    episode and ends it there; with no episode open it is not sent at all."""
    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=2, allow_short=True, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    s, a, r = _episode(6, 3)
    fin = np.full(4, 7, np.float32)
    for k in range(3):  # open episodes on both shards, each ended by an empty rollout
        sh.record_rollout("w", Rollout(s[:3], a[:3], r[:3], ends=[1], terminated=[True]), wait=True)
        sh.record_rollout("w", Rollout(s[3:], a[3:], r[3:]), wait=True)
        assert sh.record_rollout("w", _end_only(fin, bool(k % 2)), wait=True) == 0
    assert sh.record_rollout("w", _end_only(fin), wait=True) == 0  # nothing open: not sent
    assert sh.record_rollout("x", _end_only(fin), wait=False) == []
    eps = [(b, b.episode(h)) for b in sh.buffers() for h in b._handles()]
    assert len(eps) == 6 and all(e.ended for _, e in eps)
    ended_empty = [e for _, e in eps if len(e.reward) == 5]
    assert len(ended_empty) == 3 and all(np.array_equal(e.final_state, fin) for e in ended_empty)
    assert sorted(bool(e.terminated) for e in ended_empty) == [False, False, True]
    for b, _ in eps:
        b._check()
    sh.end_stream("w")
    sh.shutdown()


def _chained_rollouts(n, marker, T=50):
    """n rollouts of one sender, T steps each, that continue one another:
    each ends episodes after rows 17 and 40 and leaves its last rows open for
    the next one. States: column 0 = marker, column 1 = the step (0, 1, ...)."""
    out = []
    for i in range(n):
        s = np.zeros((T, 4), np.float32)
        s[:, 0] = marker
        s[:, 1] = np.arange(i * T, (i + 1) * T)
        out.append(Rollout(s, np.zeros(T, np.int64), np.ones(T, np.float32), ends=[17, 40],
                           terminated=[True, True]))
    return out


def _chained_episodes(n, T=50):
    """(first step, length, ended) of the episodes that _chained_rollouts(n) make."""
    cuts = [0] + [i * T + e for i in range(n) for e in (17, 40)] + [n * T]
    return sorted((a, b - a, k < len(cuts) - 2) for k, (a, b) in enumerate(zip(cuts, cuts[1:])))


def _episodes_by_marker(sh):
    """{marker: sorted (first step, length, ended)} over every shard's
    episodes, each checked to be of one marker and in step order."""
    out = {}
    for b in sh.buffers():
        b._check()
        for h in b._handles():
            e = b.episode(h)
            m = np.unique(e.state[:, 0])
            assert len(m) == 1, f"an episode mixes markers {m}"
            np.testing.assert_array_equal(np.diff(e.state[:, 1]), 1)
            out.setdefault(int(m[0]), []).append((int(e.state[0, 1]), len(e.state), bool(e.ended)))
    return {k: sorted(v) for k, v in out.items()}


def test_sharded_end_stream_waits_for_its_calls_then_the_stream_restarts(cluster):
    """end_stream right after rollouts sent with wait=False: every one of them
    is recorded (none in flight, none held and dropped), the routing state
    goes, and the stream id starts anew (seq 0, a new episode) from a new copy
    and then again from this one."""
    import pickle

    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    try:
        sh.wait_ready()
        for r in _chained_rollouts(20, 0):  # the last one leaves an episode open
            sh.record_rollout("w", r)
        assert sh.end_stream("w") is None
        assert "w" not in sh._streams
        assert sum(len(b) for b in sh.buffers()) == 1000
        assert _episodes_by_marker(sh) == {0: _chained_episodes(20)}

        fresh = pickle.loads(pickle.dumps(sh))
        assert "w" not in fresh._streams
        first, *rest = _chained_rollouts(3, 1)
        fresh.record_rollout("w", first, wait=True)
        # accepted and recorded (a seq other than 0 would be held, unrecorded),
        # as a new episode: the old stream's open episode is left as it was
        eps = _episodes_by_marker(sh)
        assert eps[0] == _chained_episodes(20)
        assert eps[1] == [(0, 17, True), (17, 23, True), (40, 10, False)]
        for r in rest:
            fresh.record_rollout("w", r)
        fresh.end_stream("w")
        assert _episodes_by_marker(sh)[1] == _chained_episodes(3)

        for r in _chained_rollouts(4, 2):  # and anew from the first copy
            sh.record_rollout("w", r)
        sh.end_stream("w")
        eps = _episodes_by_marker(sh)
        assert eps == {0: _chained_episodes(20), 1: _chained_episodes(3), 2: _chained_episodes(4)}
        assert sum(len(b) for b in sh.buffers()) == 50 * (20 + 3 + 4)
    finally:
        sh.shutdown()


def test_sharded_restarted_sender_reuses_its_stream_after_end_stream(cluster):
    """A sender restarted with a fresh copy (its routing state at seq 0) that
    reuses its stream id is refused by the shards, which remember the old
    stream; end_stream from that copy lets it start over."""
    sh = ShardedReplay(2, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    try:
        for r in _chained_rollouts(3, 0):
            assert sh.record_rollout("w", r, wait=True) == 50
        fresh = ShardedReplay(actors=sh.shards)
        r = _chained_rollouts(1, 1)[0]
        with pytest.raises(ValueError, match="seq: expected a number not sent before on stream 'w'"):
            fresh.record_rollout("w", r, wait=True)
        assert _episodes_by_marker(sh) == {0: _chained_episodes(3)}  # the refused rollout: nothing
        with pytest.raises(TypeError, match="stream: expected a hashable id, got list"):
            fresh.end_stream(["w"])
        fresh.end_stream("w")
        assert "w" not in fresh._streams
        assert fresh.record_rollout("w", r, wait=True) == 50
        assert _episodes_by_marker(sh) == {0: _chained_episodes(3), 1: _chained_episodes(1)}
        assert sum(len(b) for b in sh.buffers()) == 200
    finally:
        sh.shutdown()


@pytest.mark.parametrize("pruned", [False, True])
def test_sharded_end_stream_ends_the_stream_and_raises_a_failed_rollout(cluster, pruned):
    """A rollout refused on its shard (states of the wrong shape) in a stream
    sent with wait=False: end_stream still waits for every call, ends the
    stream on the shards and here, and then raises that error, whether the
    call was still in flight or had already been pruned from the routing
    state as done. (A NaN priority no longer reaches a shard: the sharded
    replay refuses it before routing; tests/test_ray_sharded_checks.py.)"""
    import pickle

    from exreplay.ray import _PRUNE_AT

    sh = ShardedReplay(1, state_shape=(4,), capacity=None, pick_len=1, seed=0,
                       selectors=["uniform"], actor_options={"num_cpus": 0})
    try:
        rs = _chained_rollouts(_PRUNE_AT if pruned else 4, 0)
        b = rs[1]
        rs[1] = Rollout(np.zeros((50, 5), np.float32), b.actions, b.rewards, None, b.ends, None, b.terminated)
        first = [ref for r in rs[:4] for ref in sh.record_rollout("w", r)]
        if pruned:
            ray.wait(first, num_returns=len(first))
            for r in rs[4:]:  # the 64th call prunes the finished ones, noting the error
                sh.record_rollout("w", r)
            assert not set(first) & set(sh._streams["w"]["pending"])
            assert isinstance(sh._streams["w"]["error"], ValueError)
        cp = pickle.loads(pickle.dumps(sh))  # a copy takes the routing, not the calls
        assert cp._streams["w"]["seq"] == sh._streams["w"]["seq"]
        assert cp._streams["w"]["pending"] == [] and cp._streams["w"]["error"] is None
        with pytest.raises(ValueError, match=r"states: expected shape \(T, 4\), got \(17, 5\)"):  # its first piece
            sh.end_stream("w")
        assert "w" not in sh._streams
        assert sum(len(b) for b in sh.buffers()) == 50 * (len(rs) - 1)  # all but the refused one
        assert sh.record_rollout("w", _chained_rollouts(1, 1)[0], wait=True) == 50  # seq 0 again
        assert _episodes_by_marker(sh)[1] == _chained_episodes(1)
    finally:
        sh.shutdown()


def test_gather_logs_checks_every_replay_before_closing_any(cluster, tmp_path):
    """gather_logs over replays one of which has no log: a ValueError, and the
    logs of the others stay open (their replays go on logging)."""
    from exreplay.ray import ReplayActor, gather_logs

    kw = dict(state_shape=(4,), capacity=100, pick_len=1, seed=0, selectors=["uniform"])
    logged = ReplayActor.options(num_cpus=0).remote(log={"dir": str(tmp_path / "logs"), "source": 0}, **kw)
    plain = ReplayActor.options(num_cpus=0).remote(**kw)
    try:
        s, a, r = _episode(5)
        ray.get(logged.record_many.remote(None, s, a, r, terminated=True))
        with pytest.raises(ValueError, match=r"replays: expected ReplayActors with a log .*positions \[1\]"):
            gather_logs([logged, plain], str(tmp_path / "out"))
        assert not ray.get(logged.log_info.remote())["closed"]
        ray.get(logged.record_many.remote(None, s, a, r, terminated=True))  # still logged
        assert gather_logs([logged], str(tmp_path / "out"))["records"] == 10
    finally:
        ray.kill(logged)
        ray.kill(plain)


def _apex_args(**kw):
    from exreplay.examples import apex_cartpole as apex

    argv = []
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    return apex, apex.parse_args(argv + ["--quiet"])


def test_apex_smoke(cluster):
    """A few seconds of the Ape-X example: actors, replay, learner and evaluator all run."""
    apex, args = _apex_args(seed=0, actors=2, time_limit=6, warmup=300, eval_every=1.5, progress_every=2,
                            goal=10_000)
    lines = []
    s = apex.run(args, log=lines.append)
    assert s["env_steps"] >= 300 and s["updates"] > 0 and s["records"] > 0 and s["picks_sampled"] > 0
    assert not s["reached"] and s["evals"] and s["progress"]
    assert any("inserts/s" in x for x in lines) and lines[-1].startswith("summary:")


def test_apex_sharded_smoke(cluster):
    apex, args = _apex_args(seed=1, actors=2, shards=2, time_limit=4, warmup=300, eval_every=10,
                            goal=10_000)
    s = apex.run(args, log=lambda *a: None)
    assert s["updates"] > 0 and s["records"] > 0


@pytest.mark.slow
def test_apex_reaches_the_goal(cluster):
    """The learning loop reaches mean greedy return >= 475 over 20 episodes (seed 0: ~10 s here)."""
    apex, args = _apex_args(seed=0, actors=4, time_limit=240, progress_every=30)
    s = apex.run(args, log=lambda *a: None)
    assert s["reached"], s["best_eval"]


# ---- named fields and extras ---------------------------------------------------------

FSPEC = {"obs": ((3,), "float32"), "k": ((), "int64")}
XSPEC = {"h": ((2, 4), "float32"), "logp": ((), "float32")}


def _field_rollout(T, t0, ends=(), final=True):
    t = np.arange(t0, t0 + T)
    states = {"obs": np.repeat(t[:, None], 3, 1).astype(np.float32), "k": t.astype(np.int64)}
    extras = {"h": (t[:, None, None] + np.zeros((1, 2, 4))).astype(np.float32),
              "logp": (-t).astype(np.float32)}
    E = len(ends)
    fs = {"obs": np.full((E, 3), 99, np.float32), "k": np.full(E, 99, np.int64)} if final and E else None
    return Rollout(states, np.zeros(T, np.int64), np.ones(T, np.float32), ends=ends, final_states=fs,
                   terminated=[not final] * E, extras=extras)


def test_rollouts_with_named_fields_and_extras():
    # ReplayServer without Ray: every piece's fields and extras land in their episode
    srv = ReplayServer(state_spec=FSPEC, extras_spec=XSPEC, capacity=None, pick_len=2, seed=0,
                       selectors=[("uniform", {})])
    srv.record_rollout("A", _field_rollout(5, 0, ends=[2]), seq=0)
    srv.record_rollout("A", _field_rollout(4, 5, ends=[4]), seq=1)
    buf = srv.buf
    eps = [buf.episode(h) for h in buf._handles()]
    assert [len(e.action) for e in eps] == [2, 7]
    np.testing.assert_array_equal(eps[1].state["k"], np.arange(2, 9))
    np.testing.assert_array_equal(eps[1].extras["logp"], -np.arange(2, 9))
    assert eps[0].final_state["k"] == 99
    b = srv.get_batch(8, 0)
    np.testing.assert_array_equal(b.extras["h"][:, 0, 1, 3], b.state["k"][:, 0])
    parts = split_batch(b, 2)
    assert parts[1].extras["h"].shape == (4, 2, 2, 4) and parts[1].state["obs"].shape == (4, 2, 3)
    np.testing.assert_array_equal(parts[1].state["k"], b.state["k"][4:])
    assert srv.config()["extras_spec"] == {"h": ((2, 4), "float32"), "logp": ((), "float32")}
    buf._check()


def test_sharded_rollouts_with_extras(cluster):
    sh = ShardedReplay(2, state_spec=FSPEC, extras_spec=XSPEC, capacity=None, pick_len=2, seed=1,
                       selectors=[("uniform", {})], actor_options={"num_cpus": 0})
    try:
        sh.wait_ready()
        sh.record_rollout("w", _field_rollout(6, 0, ends=[3, 6]), wait=True)
        sh.record_episode(*[_field_rollout(4, 100).__getattribute__(a) for a in ("states", "actions", "rewards")],
                          final_state={"obs": np.zeros(3, np.float32), "k": 7}, terminated=False,
                          extras=_field_rollout(4, 100).extras, wait=True)
        b = sh.get_batch(16, 0)
        assert set(b.extras) == {"h", "logp"} and b.extras["h"].shape == (16, 2, 2, 4)
        # each pick's extras and states come from the same steps
        np.testing.assert_array_equal(b.extras["logp"][:, 0], -b.state["k"][:, 0])
    finally:
        sh.shutdown()
