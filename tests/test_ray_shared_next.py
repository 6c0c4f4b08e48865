"""Shared next states through exreplay.ray, in one process (no Ray):
ReplayServer.get_batch(..., shared_next=True) and a ShardedReplay over
such servers, answered at once by stand-ins for their actors, with the C
buffer and the pure-Python reference.

What a learner receives is the layout of the buffer's own
get_batch(..., shared_next=True) (docs/api.md, "Shared next states"): one
C-contiguous state_seq per batch, whose views [:, :-1] and [:, 1:] are
state and state_next, with the buffer's values; the n batches of one call
and the rows drawn from several shards keep it (state_seq is cut or put
together, and the views made again); such a batch pickles smaller than a
default one; pick_index comes along."""

import pickle

import numpy as np
import pytest

import exreplay
import exreplay.ray as xray
from exreplay.ray import ReplayServer, concat_batches, split_batch
from test_differential import assert_same_arrays
from fake_ray import FakeRay as _FakeRay
from fake_ray import Local as _Local
from test_shared_next import FIELDS, assert_like_default, at, items

SEL = [("prioritized", {"alpha": 0.7, "beta": 0.5})]
CONFIGS = {
    "frames": dict(state_shape=(6, 6), state_dtype=np.uint8),
    "named": dict(state_spec={"img": ((6, 6), "uint8"), "vec": ((3,), "float32")},
                  extras_spec={"logp": ((), "float32")}),
}
L = 4  # pick_len


def _kw(config):
    return dict(pick_len=L, allow_short=True, capacity=None, **CONFIGS[config])


def _states(config, k, T):
    """T states of episode k, every value nonzero and telling (k, t) apart."""
    code = (k * 17 + np.arange(T)) % 250 + 1
    img = np.broadcast_to(code[:, None, None], (T, 6, 6)).astype(np.uint8)
    if config == "named":
        return {"img": img, "vec": (code[:, None] + np.array([0.0, 0.25, 0.5])).astype(np.float32)}
    return img


def _fill(groups, config, n=30, seed=0):
    """The same n episodes into each list of ReplayServers in `groups`
    (round robin within a list), short and ended in every way."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        T = int(rng.integers(1, 10))
        s = _states(config, k, T)
        p = np.exp(rng.uniform(np.log(0.05), np.log(5.0), size=T))
        end = k % 3  # a final state, terminated, or left open
        fin = None if end != 0 else (
            {f: v[-1] + 1 for f, v in s.items()} if isinstance(s, dict) else s[-1] + 1)
        ex = None if config != "named" else {"logp": np.arange(T, dtype=np.float32) + k}
        for group in groups:
            group[k % len(group)].record_many(None, s, np.zeros(T, np.int64), np.ones(T), final_state=fin,
                                              terminated=end == 1, priorities=p, extras=ex)


def assert_views_of_own_seq(b, where):
    """b in the shared layout: each state_seq C-contiguous, and state and
    state_next its views [:, :-1] and [:, 1:] (their base; the same memory,
    at the same strides), not copies."""
    assert b.state_seq is not None, where
    for k, seq in items(b.state_seq):
        st, nx = at(b.state, k), at(b.state_next, k)
        assert seq.flags.c_contiguous and seq.shape[1] == st.shape[1] + 1, where
        assert st.base is seq and nx.base is seq, where
        assert np.shares_memory(st, seq) and np.shares_memory(nx, seq), where
        assert st.strides == nx.strides == seq.strides, where
        assert st.ctypes.data == seq.ctypes.data, where
        assert nx.ctypes.data == seq.ctypes.data + seq.strides[1], where


def assert_same_batch(x, y, where):
    """Every field of x is y's (state_seq, extras, weight, pick_index too)."""
    for name in FIELDS + ("state_seq", "extras", "weight", "pick_index"):
        assert_same_arrays(getattr(x, name), getattr(y, name), name, where)


def _pickled(x):
    """The bytes of x pickled as Ray pickles it (protocol 5, buffers out of
    band): the pickle's own bytes plus every buffer's."""
    bufs = []
    data = pickle.dumps(x, protocol=5, buffer_callback=bufs.append)
    return len(data) + sum(memoryview(b).nbytes for b in bufs), data, bufs


@pytest.mark.parametrize("config", ["frames", "named"])
@pytest.mark.parametrize("impl", ["c", "reference"])
def test_replay_server_batches_in_the_shared_layout(impl, config):
    """get_batch(B, ps, n, shared_next=True) on a ReplayServer: the buffer's
    own shared batch of n*B picks for the same seed, in n batches each of
    which has its own state_seq with state and state_next its views; the
    list crosses pickling as that one batch and smaller than the default."""
    srv, twin, plain = (ReplayServer(impl=impl, selectors=SEL, seed=3, **_kw(config)) for _ in range(3))
    _fill([[srv], [twin], [plain]], config)
    whole = twin.buf.get_batch(24, 0, shared_next=True)  # the buffer's own
    bs = srv.get_batch(8, 0, 3, shared_next=True)
    assert len(bs) == 3
    for i, b in enumerate(bs):
        assert type(b) is type(whole)
        assert_views_of_own_seq(b, f"batch {i}")
        assert_same_batch(b, split_batch(whole, 3)[i], f"batch {i}")
        for k, seq in items(b.state_seq):  # rows of the draw's one block, not copies
            assert np.shares_memory(seq, at(bs.whole.state_seq, k))
    one = srv.get_batch(8, 0, shared_next=True)
    assert_same_batch(one, twin.buf.get_batch(8, 0, shared_next=True), "one batch")
    assert_views_of_own_seq(one, "one batch")
    # the default layout is as before, and drew the same picks
    d = plain.get_batch(8, 0, 3)
    for b, db in zip(bs, d):
        assert_like_default(b, db, config)
    # across pickling (as a Ray return): one state_seq, split again on arrival
    size, data, bufs = _pickled(bs)
    back = pickle.loads(data, buffers=bufs)
    for i, (b, c) in enumerate(zip(bs, back)):
        assert_views_of_own_seq(c, f"unpickled {i}")
        assert_same_batch(c, b, f"unpickled {i}")
    assert size < 0.8 * _pickled(d)[0]
    assert srv.stats()["batches"] == 4 and srv.stats()["picks_sampled"] == 32


@pytest.mark.parametrize("config", ["frames", "named"])
@pytest.mark.parametrize("impl", ["c", "reference"])
def test_sharded_batches_in_the_shared_layout(monkeypatch, impl, config):
    """ShardedReplay.get_batch(..., shared_next=True) puts the shards' state_seq
    together: each row is its shard's own shared draw for the same seed, the
    picks and weights are those of the default layout, state and state_next
    are views of the batch's own state_seq (of each of the n batches'), and
    pick_index is kept."""
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    kw = dict(impl=impl, selectors=SEL, **_kw(config))
    servers, twins, plain = ([ReplayServer(seed=10 + i, **kw) for i in range(3)] for _ in range(3))
    _fill([servers, twins, plain], config)
    sh = xray.ShardedReplay(actors=[_Local(s) for s in servers], seed=1)
    dp = xray.ShardedReplay(actors=[_Local(s) for s in plain], seed=1)
    b, d = sh.get_batch(48, 0, shared_next=True), dp.get_batch(48, 0)
    assert type(b) is type(d)
    assert_views_of_own_seq(b, "sharded")
    assert_like_default(b, d, config)  # same picks, weights, pick_index; state_seq by the rule
    shard, local = sh.decode(b.pick_epi)
    assert len(set(shard.tolist())) > 1
    for s in set(shard.tolist()):  # the rows of each shard: its buffer's own shared batch
        m = np.flatnonzero(shard == s)
        own = twins[s].buf.get_batch(len(m), 0, shared_next=True)
        rows = {(e, p): j for j, (e, p) in enumerate(zip(own.pick_epi.tolist(), own.pick_pos.tolist()))}
        assert sorted(zip(local[m].tolist(), b.pick_pos[m].tolist())) == \
            sorted(zip(own.pick_epi.tolist(), own.pick_pos.tolist()))
        j = [rows[(e, p)] for e, p in zip(local[m].tolist(), b.pick_pos[m].tolist())]
        for k, seq in items(b.state_seq):
            np.testing.assert_array_equal(seq[m], at(own.state_seq, k)[j])
        np.testing.assert_array_equal(b.pick_index[m], own.pick_index[j])
    # n batches: split along B, each with its own state_seq and views of it
    bs, ds = sh.get_batch(16, 0, 3, shared_next=True), dp.get_batch(16, 0, 3)
    for i, (x, y) in enumerate(zip(bs, ds)):
        assert_views_of_own_seq(x, f"batch {i}")
        assert_like_default(x, y, f"{config} batch {i}")
    # smaller to send on than the default batch
    assert _pickled(b)[0] < 0.8 * _pickled(d)[0]
    c = pickle.loads(pickle.dumps(b))
    assert_same_batch(c, b, "unpickled")
    # one shard: straight from the actor, in the layout asked for
    one = xray.ShardedReplay(actors=[_Local(servers[0])], seed=1)
    assert_views_of_own_seq(one.get_batch(8, 0, shared_next=True), "one shard")
    assert_views_of_own_seq(one.get_batch(4, 0, 2, shared_next=True)[1], "one shard, n batches")


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_split_and_concat_keep_the_shared_layout(impl):
    """split_batch cuts state_seq along B and concat_batches puts state_seq
    together; both make state and state_next its views again. A list of
    batches of both layouts is refused."""
    srv = ReplayServer(impl=impl, selectors=SEL, seed=0, **_kw("named"))
    _fill([[srv]], "named")
    b = srv.buf.get_batch(12, 0, shared_next=True)
    parts = split_batch(b, 4)
    for i, x in enumerate(parts):
        assert_views_of_own_seq(x, f"part {i}")
        for k, seq in items(x.state_seq):
            np.testing.assert_array_equal(seq, at(b.state_seq, k)[3 * i:3 * i + 3])
        np.testing.assert_array_equal(x.pick_index, b.pick_index[3 * i:3 * i + 3])
    whole = concat_batches(parts)
    assert type(whole) is type(b)
    assert_views_of_own_seq(whole, "concatenated")
    assert_same_batch(whole, b, "concatenated")
    with pytest.raises(ValueError, match=r"^batches: expected batches of one layout.* got 1 of 2 with state_seq"):
        concat_batches([parts[0], srv.buf.get_batch(3, 0)])


def test_learner_inside_the_actor_draws_shared_batches():
    """A learner method of a ReplayServer subclass (replay_actor_class runs
    it inside the actor) draws the shared layout with a local call."""

    class Learner(ReplayServer):
        def learn(self):
            return self.get_batch(4, 0, 2, shared_next=True)

    srv = Learner(selectors=SEL, seed=0, **_kw("frames"))
    _fill([[srv]], "frames")
    for i, b in enumerate(srv.learn()):
        assert_views_of_own_seq(b, f"batch {i}")


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_shared_next_is_parsed_as_the_buffers_flag(monkeypatch, impl):
    """shared_next takes what the buffer's get_batch takes (a bool, a NumPy
    bool, an int, a NumPy integer) and refuses the rest with the buffer's TypeError, before
    any shard is asked anything; it is keyword-only."""
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    servers = [ReplayServer(impl=impl, selectors=SEL, seed=i, **_kw("frames")) for i in range(2)]
    _fill([servers], "frames")
    asked = []

    class Counting(_Local):
        def __getattr__(self, name):
            asked.append(name)
            return super().__getattr__(name)

    sh = xray.ShardedReplay(actors=[Counting(s) for s in servers], seed=1)
    c_buf = exreplay.ExperienceReplay(**_kw("frames"))
    c_buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    drawn = [s.stats()["batches"] for s in servers]
    for value in (None, 1.5, np.array(1), "yes", np.array([True])):
        with pytest.raises(TypeError) as want:  # the C buffer's words
            c_buf.get_batch(4, 0, shared_next=value)
        asked.clear()
        for call in (lambda: sh.get_batch(4, 0, shared_next=value),
                     lambda: servers[1].get_batch(4, 0, shared_next=value)):
            with pytest.raises(TypeError) as got:
                call()
            assert str(got.value) == str(want.value)
        assert asked == []
    assert [s.stats()["batches"] for s in servers] == drawn
    for value in (True, np.bool_(True), 1):
        assert sh.get_batch(4, 0, shared_next=value).state_seq is not None
    for value in (False, np.bool_(False), 0):
        assert sh.get_batch(4, 0, shared_next=value).state_seq is None
    with pytest.raises(TypeError):
        servers[0].get_batch(4, 0, None, False, True)  # keyword-only
