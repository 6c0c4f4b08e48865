"""pick_index through exreplay.ray with the pure-Python buffer, in one
process (no Ray): ReplayServer(impl="reference") and a ShardedReplay over
such servers, answered at once by stand-ins for their actors. The calls
docs/ray.md shows, set_priority(..., pick_index=b.pick_index), work with
impl="reference" as with the C buffer, and give the update without it."""

import numpy as np
import pytest

import exreplay.ray as xray
from exreplay.ray import ReplayServer
from fake_ray import FakeRay as _FakeRay
from fake_ray import Local as _Local

KW = dict(state_shape=(4,), pick_len=2, allow_short=True, capacity=None)
SEL = [("prioritized", {"alpha": 1.0, "beta": 0.4})]


def _episodes(servers, n=24, seed=0):
    """The same n episodes into each of `servers` (lists of ReplayServers
    that together hold them: round robin within each list)."""
    rng = np.random.default_rng(seed)
    for k in range(n):
        T = int(rng.integers(2, 9))
        s = np.zeros((T, 4), np.float32)
        s[:, 0], s[:, 1] = k, np.arange(T)
        p = np.exp(rng.uniform(np.log(0.05), np.log(5.0), size=T))
        for group in servers:
            group[k % len(group)].record_many(None, s, np.zeros(T, np.int64), np.ones(T),
                                              terminated=True, priorities=p)


def _stored(server):
    epi, pos = server.buf._picks()
    order = np.lexsort((pos, epi))
    return epi[order], pos[order], server.buf._priority(0, epi[order], pos[order])


def test_replay_server_reference_takes_the_batch_pick_index():
    srv, twin = (ReplayServer(impl="reference", selectors=SEL, seed=3, **KW) for _ in range(2))
    _episodes([[srv], [twin]])
    b, tb = srv.get_batch(32, 0), twin.get_batch(32, 0)
    assert b.pick_index.dtype == np.int64 and b.pick_index.shape == (32,)
    for h in (2, 5):  # picks move about the table before the update
        srv.buf.remove_episode(h)
        twin.buf.remove_episode(h)
    pr = np.linspace(0.5, 4.0, 32)
    n = srv.set_priority(0, b.pick_epi, b.pick_pos, pr, b.pick_index)
    assert n == twin.set_priority(0, tb.pick_epi, tb.pick_pos, pr)
    for x, y in zip(_stored(srv), _stored(twin)):
        np.testing.assert_array_equal(x, y)
    # the n batches of one draw: views, each with its part of pick_index
    bs = srv.get_batch(8, 0, n_batches=3)
    whole = srv.buf._gather(0, np.concatenate([x.pick_epi for x in bs]),
                            np.concatenate([x.pick_pos for x in bs]))
    np.testing.assert_array_equal(np.concatenate([x.pick_index for x in bs]), whole.pick_index)


@pytest.mark.parametrize("impl", ["reference", "c"])
def test_sharded_replay_routes_pick_index(monkeypatch, impl):
    """A sharded batch's pick_index holds each pick's index in its own
    shard's table; set_priority(..., pick_index=b.pick_index) sends each
    shard its part and applies what the call without it applies."""
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    servers = [ReplayServer(impl=impl, selectors=SEL, seed=10 + i, **KW) for i in range(3)]
    twins = [ReplayServer(impl=impl, selectors=SEL, seed=10 + i, **KW) for i in range(3)]
    _episodes([servers, twins])
    sh = xray.ShardedReplay(actors=[_Local(s) for s in servers], seed=1)
    tw = xray.ShardedReplay(actors=[_Local(s) for s in twins], seed=1)
    b, tb = sh.get_batch(64, 0), tw.get_batch(64, 0)
    np.testing.assert_array_equal(b.pick_epi, tb.pick_epi)
    assert b.pick_index.dtype == np.int64 and b.pick_index.shape == (64,)
    shard, local = sh.decode(b.pick_epi)
    assert len(set(shard.tolist())) > 1
    for s in set(shard.tolist()):  # each index is its shard's own
        m = shard == s
        g = servers[s].buf._gather(0, local[m], b.pick_pos[m])
        np.testing.assert_array_equal(b.pick_index[m], g.pick_index)
    for k in (0, 1):  # picks move about the shards' tables
        servers[k].buf.remove_episode(0)
        twins[k].buf.remove_episode(0)
    pr = np.linspace(0.5, 7.0, 64)
    n = sh.set_priority(0, b.pick_epi, b.pick_pos, pr, wait=True, pick_index=b.pick_index)
    assert n == tw.set_priority(0, tb.pick_epi, tb.pick_pos, pr, wait=True)
    for x, y in zip(servers, twins):
        for u, v in zip(_stored(x), _stored(y)):
            np.testing.assert_array_equal(u, v)


def test_sharded_set_priority_checks_pick_index_before_any_shard(monkeypatch):
    """A pick_index that does not fit the picks is refused, naming it, before
    any shard is sent anything (cut by the routing, a float array truncated
    or one of another length would reach some shards and not others)."""
    monkeypatch.setattr(xray, "_ray", lambda: _FakeRay)
    servers = [ReplayServer(impl="reference", selectors=SEL, seed=i, **KW) for i in range(2)]
    _episodes([servers])
    sh = xray.ShardedReplay(actors=[_Local(s) for s in servers], seed=1)
    b = sh.get_batch(16, 0)
    before = [_stored(s) for s in servers]
    for bad, exc, what in ((b.pick_index.astype(np.float64), TypeError, "float64"),
                           (b.pick_index[:15], ValueError, r"shape \(16,\), got \(15,\)"),  # the buffer's words
                           (b.pick_index[:, None], ValueError, r"got \(16, 1\)")):
        with pytest.raises(exc, match=rf"^pick_index: expected .*{what}"):
            sh.set_priority(0, b.pick_epi, b.pick_pos, 2.0, wait=True, pick_index=bad)
    for s, was in zip(servers, before):
        for u, v in zip(_stored(s), was):
            np.testing.assert_array_equal(u, v)
