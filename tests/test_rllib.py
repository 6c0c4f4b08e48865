"""exreplay.rllib: RLlib's episode-buffer contract on an ExperienceReplay.

The behaviours RLlib's own prioritized episode buffer is tested for, checked
on exreplay's classes through the public API (RLlib's private segment-tree
checks have exreplay equivalents: stored_priorities, the sampled items),
then exreplay's buffer against RLlib's own on the same episodes, the state
round trip, and a short DQN run that names the buffer by its dotted type.
"""

import copy
import pickle
import re

import numpy as np
import pytest

pytest.importorskip("ray.rllib", reason="needs the rllib extra")
pytest.importorskip("torch", reason="needs the rllib extra")

from ray.rllib.env.single_agent_episode import SingleAgentEpisode  # noqa: E402
from ray.rllib.utils.replay_buffers.episode_replay_buffer import (  # noqa: E402
    EpisodeReplayBuffer as RLlibEpisodeReplayBuffer,
)
from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (  # noqa: E402
    PrioritizedEpisodeReplayBuffer as RLlibPER,
)

from exreplay.rllib import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer  # noqa: E402


def make_episode(n, id_=None, base=0.0, terminated=True, truncated=False, start=0):
    """Observation t is base + start + t, action t is start + t, reward t is 0.1 (start + t + 1);
    the episode starts at t_started=start (a fragment that continues one)."""
    eps = SingleAgentEpisode(id_=id_, observations=[base + start], infos=[{}], t_started=start)
    for t in range(start, start + n):
        eps.add_env_step(observation=base + t + 1, action=int(t), reward=0.1 * (t + 1), infos={})
    eps.is_terminated = terminated
    eps.is_truncated = truncated and not terminated
    return eps


def random_episodes(rng, count, lo=1, hi=200):
    out = []
    for i in range(count):
        term = bool(rng.random() > 0.5)
        out.append(make_episode(int(rng.integers(lo, hi)), id_=str(i), terminated=term,
                                truncated=not term and bool(rng.random() > 0.2)))
    return out


def unpack(e):
    return (
        e.get_observations(0),
        e.get_actions(-1),
        e.get_rewards(-1),
        e.get_observations(-1),
        e.is_terminated,
        e.is_truncated,
        e.get_extra_model_outputs("weights", -1),
        e.get_extra_model_outputs("n_step", -1),
    )


# ----------------------------------------------------------------- contract


def test_subclasses_rllib_buffers():
    assert issubclass(PrioritizedEpisodeReplayBuffer, RLlibPER)
    assert issubclass(EpisodeReplayBuffer, RLlibEpisodeReplayBuffer)
    assert not issubclass(EpisodeReplayBuffer, RLlibPER)


def test_add_evicts_whole_episodes_by_timesteps():
    buf = PrioritizedEpisodeReplayBuffer(capacity=100)
    for id_, n, eps_held, ts in (("A", 50, 1, 50), ("B", 25, 2, 75), ("C", 25, 3, 100), ("D", 1, 3, 51)):
        buf.add(make_episode(n, id_))
        assert (buf.get_num_episodes(), buf.get_num_timesteps()) == (eps_held, ts)
    assert {e.id_ for e in buf.episodes} == {"B", "C", "D"}
    assert buf.get_num_episodes_evicted() == 1
    buf.add(make_episode(2, "F"))
    for i in range(10):
        buf.add(make_episode(10, str(i)))
    assert (buf.get_num_episodes(), buf.get_num_timesteps()) == (10, 100)
    buf.add(make_episode(21, "G"))
    assert (buf.get_num_episodes(), buf.get_num_timesteps()) == (8, 91)
    assert {e.id_ for e in buf.episodes} == {"3", "4", "5", "6", "7", "8", "9", "G"}
    assert buf.get_added_timesteps() == 50 + 25 + 25 + 1 + 2 + 100 + 21
    assert len(buf) == 91


def test_an_episode_longer_than_capacity_stays_whole_until_the_next_add():
    for cls in (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer):
        buf = cls(capacity=100)
        buf.add(make_episode(200, "E"))
        assert (buf.get_num_episodes(), buf.get_num_timesteps()) == (1, 200)
        assert [len(e) for e in buf.episodes] == [200]
        assert buf.exreplay_buffer.num_picks == 200  # every step of it can be drawn
        buf.add(make_episode(10, "F"))
        assert (buf.get_num_episodes(), buf.get_num_timesteps()) == (1, 10)
        assert [e.id_ for e in buf.episodes] == ["F"]
        assert buf.get_num_episodes_evicted() == 1
        buf.exreplay_buffer._check()


def fragment(id_, start, n, done):
    """Steps start .. start+n-1 of episode id_ (observation t = t), as an EnvRunner sends them."""
    eps = SingleAgentEpisode(id_=id_, observations=[float(start)], infos=[{}], t_started=start)
    for t in range(start, start + n):
        eps.add_env_step(observation=float(t + 1), action=int(t), reward=0.1 * (t + 1), infos={})
    eps.is_terminated = done
    return eps


@pytest.mark.parametrize("ours,theirs", [(PrioritizedEpisodeReplayBuffer, RLlibPER),
                                         (EpisodeReplayBuffer, RLlibEpisodeReplayBuffer)])
@pytest.mark.parametrize("seed", range(4))
def test_capacity_matches_rllib_on_random_fragments(ours, theirs, seed):
    """Adds of 1-3 fragments of interleaved running episodes, some longer than
    the capacity: the episodes held (ids and lengths, in order) and the counts
    stay RLlib's after every add."""
    rng = np.random.default_rng(seed)
    a, b = ours(capacity=100), theirs(capacity=100)
    running = {}  # id -> next t
    serial = 0
    compared = 0
    for step in range(150):
        plan, ids = [], set()
        for _ in range(int(rng.integers(1, 4))):
            if running and rng.random() < 0.7:
                id_ = str(rng.choice(sorted(running)))
            else:
                id_, serial = "e%d" % serial, serial + 1
            if id_ in ids:  # one fragment per episode per add, as an EnvRunner sends
                continue
            ids.add(id_)
            plan.append((id_, running.get(id_, 0), int(rng.choice([1, 5, 20, 60, 130])),
                         bool(rng.random() < 0.3)))
        # RLlib's own buffers raise IndexError in some adds (the prioritized
        # one pops from an empty deque when it has evicted all it held and
        # several new episodes still overflow; the uniform one indexes past
        # its list in some evictions): such an add is made with its first
        # fragment only, or skipped, on both
        for p in (plan, plan[:1], []):
            batch = [fragment(*f) for f in p]
            try:
                nb = copy.deepcopy(b)
                nb.add(batch)
                break
            except IndexError:
                continue
        if not p:
            continue
        for id_, t0, n, done in p:
            running[id_] = t0 + n
            if done:
                del running[id_]
        b = nb
        a.add(batch)
        held_a = [(e.id_, len(e)) for e in a.episodes]
        held_b = [(e.id_, len(e)) for e in b.episodes]
        assert held_a == held_b, "add %d" % step
        assert a.get_num_timesteps() == b.get_num_timesteps() == sum(n for _, n in held_b)
        assert a.get_num_episodes() == b.get_num_episodes()
        assert a.get_added_timesteps() == b.get_added_timesteps()
        compared += 1
    assert compared > 100
    a.exreplay_buffer._check()


def test_episodes_round_trip_their_data():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000)
    buf.add([make_episode(5, "a", terminated=True), make_episode(3, "b", terminated=False, truncated=True)])
    a, b = buf.episodes
    assert a.id_ == "a" and a.is_terminated and not a.is_truncated
    np.testing.assert_allclose(a.get_observations(), np.arange(6.0))
    np.testing.assert_array_equal(a.get_actions(), np.arange(5))
    np.testing.assert_allclose(a.get_rewards(), 0.1 * np.arange(1, 6))
    assert b.is_truncated and not b.is_terminated and len(b) == 3


@pytest.mark.slow  # many draws: skipped in the (several times slower) ASan run
@pytest.mark.parametrize("n_step", [1, 3])
def test_sample_n_step_rewards_and_next_observations(n_step):
    rng = np.random.default_rng(0)
    buf = PrioritizedEpisodeReplayBuffer(capacity=10000, n_step=n_step, seed=1)
    for e in random_episodes(rng, 200):
        buf.add(e)
    for i in range(100):
        sample = buf.sample(batch_size_B=16, n_step=n_step)
        assert buf.get_sampled_timesteps() == 16 * (i + 1)
        assert len(sample) == 16
        for e in sample:
            obs, action, reward, next_obs, term, trunc, weight, n = unpack(e)
            assert not (term and trunc)
            assert len(e) == 1 and e.t_started == action
            assert obs == pytest.approx(action, abs=1e-8)
            assert next_obs == pytest.approx(obs + n_step, abs=1e-8)
            direct = sum(0.99**k * 0.1 * (obs + k + 1) for k in range(n_step))
            assert reward == pytest.approx(direct, abs=1e-8)
            assert weight == pytest.approx(1.0, abs=1e-8)  # beta = 0
            assert n == n_step


def test_terminated_and_truncated_only_at_the_end():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000, n_step=2, seed=0)
    buf.add([make_episode(4, "t", terminated=True, base=0.0),
             make_episode(4, "u", terminated=False, truncated=True, base=100.0)])
    seen = set()
    for _ in range(50):
        for e in buf.sample(batch_size_B=16, n_step=2):
            obs = float(e.get_observations(0))
            at_end = e.t_started + 2 == 4
            seen.add((obs >= 100, e.t_started))
            assert e.is_terminated == (at_end and obs < 100)
            assert e.is_truncated == (at_end and obs >= 100)
    # every (episode, t) with t + n <= length is reachable, no other
    assert seen == {(u, t) for u in (False, True) for t in range(3)}


@pytest.mark.slow  # many draws: skipped in the (several times slower) ASan run
def test_sample_random_n_step_range():
    rng = np.random.default_rng(2)
    buf = PrioritizedEpisodeReplayBuffer(capacity=10000, n_step=(1, 5), seed=2)
    for e in random_episodes(rng, 200):
        buf.add(e)
    for _ in range(100):
        sample = buf.sample(batch_size_B=16, n_step=(1, 5))
        ns = [e.get_extra_model_outputs("n_step", -1) for e in sample]
        assert all(1 <= n <= 4 for n in ns)
        assert np.var(ns) > 0
        for e, n in zip(sample, ns):
            obs, next_obs = e.get_observations(0), e.get_observations(-1)
            assert next_obs == pytest.approx(obs + n)
            direct = sum(0.99**k * 0.1 * (obs + k + 1) for k in range(n))
            assert e.get_rewards(-1) == pytest.approx(direct, abs=1e-8)


def test_n_step_over_the_built_one_is_refused():
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=2)
    buf.add(make_episode(10, "a"))
    with pytest.raises(ValueError, match=r"n_step.*replay_buffer_config\['n_step'\]"):
        buf.sample(batch_size_B=4, n_step=3)
    with pytest.raises(ValueError, match="n_step"):
        buf.sample(batch_size_B=4, n_step=(1, 4))  # up to 3
    buf.sample(batch_size_B=4, n_step=(1, 3))  # up to 2: fine


def test_infos_and_extra_model_outputs_are_refused_clearly():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000)
    buf.add(make_episode(10, "a"))
    for kw in ({"include_infos": True}, {"include_extra_model_outputs": True}):
        with pytest.raises(ValueError, match="infos and extra model outputs are not kept"):
            buf.sample(batch_size_B=4, **kw)
    with pytest.raises(ValueError, match="single transitions"):
        buf.sample(batch_size_B=4, batch_length_T=8)


def test_sample_flags_are_read_as_flags():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000, seed=0)
    buf.add(make_episode(10, "a"))
    before = buf.sampled_timesteps
    # sample_episodes: a false value of any flag type is False, None the default
    for v in (False, 0, np.int64(0), np.bool_(False)):
        with pytest.raises(ValueError, match=r"^sample_episodes: .*got %s$" % re.escape(repr(v))):
            buf.sample(batch_size_B=4, sample_episodes=v)
    for name in ("sample_episodes", "include_infos", "include_extra_model_outputs", "to_numpy"):
        for v in ("no", 0.0, [0]):
            with pytest.raises(TypeError, match=r"^%s: expected a bool or an int, got %s$"
                                                % (name, type(v).__name__)):
                buf.sample(batch_size_B=4, **{name: v})
    assert buf.sampled_timesteps == before  # nothing was drawn
    for v in (True, 1, np.int64(2), None):
        assert len(buf.sample(batch_size_B=4, sample_episodes=v)) == 4
    assert len(buf.sample(batch_size_B=4, include_infos=0, include_extra_model_outputs=np.bool_(False),
                          to_numpy=np.int8(1))) == 4


def test_unsupported_spaces_refused_at_construction():
    gym = pytest.importorskip("gymnasium")
    obs = gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,))})
    with pytest.raises(ValueError, match="observation_space.*Dict"):
        PrioritizedEpisodeReplayBuffer(observation_space=obs, action_space=gym.spaces.Discrete(2))
    buf = PrioritizedEpisodeReplayBuffer(
        observation_space=gym.spaces.Box(0, 255, (3, 4), np.uint8), action_space=gym.spaces.Box(-1, 1, (2,))
    )
    rb = buf.exreplay_buffer
    assert rb.state_shape == (3, 4) and rb.state_dtype == np.uint8
    assert rb.action_shape == (2,) and rb.action_dtype == np.float32
    with pytest.raises(TypeError, match="unexpected argument"):
        PrioritizedEpisodeReplayBuffer(capacity=10, bogus=1)
    # a space of no value: the buffer's error named state_shape
    for kw, name in ((dict(observation_space=gym.spaces.Box(0, 1, (0,)),
                           action_space=gym.spaces.Discrete(2)), "observation_space"),
                     (dict(observation_space=gym.spaces.Box(0, 1, (2,)),
                           action_space=gym.spaces.Box(0, 1, (3, 0))), "action_space")):
        with pytest.raises(ValueError, match=rf"^{name}: expected a space of at least one value, "
                                             r"got a Box space of shape \("):
            PrioritizedEpisodeReplayBuffer(**kw)


# (keyword arguments, exception, message) of both classes' constructors: a
# wrong type is a TypeError, a wrong value of the right type a ValueError,
# each naming the argument, what was expected and what came (bools are not
# ints, as for ExperienceReplay).
BAD_CONSTRUCTOR_ARGS = [
    (dict(capacity="100"), TypeError, "capacity: expected an int >= 1 (timesteps), got str"),
    (dict(capacity=100.0), TypeError, "capacity: expected an int >= 1 (timesteps), got float"),
    (dict(capacity=None), TypeError, "capacity: expected an int >= 1 (timesteps), got NoneType"),
    (dict(capacity=True), TypeError, "capacity: expected an int >= 1 (timesteps), got bool"),
    (dict(capacity=[5]), TypeError, "capacity: expected an int >= 1 (timesteps), got list"),
    (dict(capacity=0), ValueError, "capacity: expected an int >= 1 (timesteps), got 0"),
    (dict(batch_size_B=1.5), TypeError, "batch_size_B: expected an int >= 1, got float"),
    (dict(batch_size_B="16"), TypeError, "batch_size_B: expected an int >= 1, got str"),
    (dict(batch_size_B=0), ValueError, "batch_size_B: expected an int >= 1, got 0"),
    (dict(batch_length_T="1"), TypeError,
     "batch_length_T: expected None, 0 or 1 (exreplay's RLlib buffers sample single "
     "transitions, as DQN does), got str"),
    (dict(batch_length_T=2), ValueError,
     "batch_length_T: expected None, 0 or 1 (exreplay's RLlib buffers sample single "
     "transitions, as DQN does), got 2"),
    (dict(batch_length_T=-1), ValueError,
     "batch_length_T: expected None, 0 or 1 (exreplay's RLlib buffers sample single "
     "transitions, as DQN does), got -1"),
    (dict(metrics_num_episodes_for_smoothing="x"), TypeError,
     "metrics_num_episodes_for_smoothing: expected None or an int >= 1, got str"),
    (dict(metrics_num_episodes_for_smoothing=0), ValueError,
     "metrics_num_episodes_for_smoothing: expected None or an int >= 1, got 0"),
    (dict(n_step="3"), TypeError,
     "n_step: expected an int in [1, 1048576] or a (low, high) pair of ints, got str"),
    (dict(n_step=True), TypeError,
     "n_step: expected an int in [1, 1048576] or a (low, high) pair of ints, got bool"),
    (dict(n_step=(True, 3)), TypeError,
     "n_step: expected a (low, high) pair of ints, got bool at index 0"),
    (dict(n_step=(1, 3.0)), TypeError,
     "n_step: expected a (low, high) pair of ints, got float at index 1"),
    (dict(n_step=(1, 2, 3)), ValueError,
     "n_step: expected an int in [1, 1048576] or a (low, high) pair of ints, got a tuple of length 3"),
    (dict(n_step=0), ValueError,
     "n_step: expected an int in [1, 1048576] or a (low, high) pair of ints, got 0"),
    # beyond the buffer's longest pick: it was the buffer's error, naming pick_len
    (dict(n_step=2**40), ValueError,
     "n_step: expected an int in [1, 1048576] or a (low, high) pair of ints, got 1099511627776"),
    (dict(n_step=(1, 2**21)), ValueError,
     "n_step: expected a range (low, high) with 1 <= low < high <= 1048577 (n is drawn from "
     "low .. high-1, as RLlib does), got (1, 2097152)"),
    (dict(seed="1"), TypeError, "seed: expected None or an int in [0, 2**64), got str"),
    (dict(seed=1.0), TypeError, "seed: expected None or an int in [0, 2**64), got float"),
    (dict(seed=True), TypeError, "seed: expected None or an int in [0, 2**64), got bool"),
    (dict(seed=-1), ValueError, "seed: expected None or an int in [0, 2**64), got -1"),
    (dict(seed=2**64), ValueError,
     "seed: expected None or an int in [0, 2**64), got %d" % 2**64),
    (dict(observation_space="Box", action_space="Discrete"), TypeError,
     "observation_space: expected None or a gymnasium space (Box, Discrete, MultiDiscrete or "
     "MultiBinary), got str"),
    (dict(beta="0.4"), TypeError, "beta: expected None or a finite number >= 0, got str"),
    (dict(beta=-1), ValueError, "beta: expected None or a finite number >= 0, got -1"),
    (dict(storage_unit=5), TypeError,
     "storage_unit: expected 'timesteps' (a str or RLlib's StorageUnit), got int"),
    (dict(storage_unit="episodes"), ValueError,
     "storage_unit: expected 'timesteps' (capacity counts timesteps; whole episodes are "
     "evicted), got 'episodes'"),
    (dict(replay_sequence_length="1"), TypeError,
     "replay_sequence_length: expected None or an int <= 1 (exreplay's RLlib buffers sample "
     "single transitions), got str"),
    (dict(replay_sequence_length=20), ValueError,
     "replay_sequence_length: expected None or an int <= 1 (exreplay's RLlib buffers sample "
     "single transitions), got 20"),
]
BAD_ALPHA = [
    (dict(alpha="0.6"), TypeError, "alpha: expected a finite number >= 0, got str"),
    (dict(alpha=None), TypeError, "alpha: expected a finite number >= 0, got NoneType"),
    (dict(alpha=True), TypeError, "alpha: expected a finite number >= 0, got bool"),
    (dict(alpha=[0.5]), TypeError, "alpha: expected a finite number >= 0, got list"),
    # a NumPy time is a NumPy integer to isinstance: it was read as its count
    (dict(alpha=np.timedelta64(5)), TypeError,
     "alpha: expected a finite number >= 0, got numpy.timedelta64"),
    (dict(alpha=-0.5), ValueError, "alpha: expected a finite number >= 0, got -0.5"),
    (dict(alpha=float("nan")), ValueError, "alpha: expected a finite number >= 0, got nan"),
    (dict(alpha=2**1100), ValueError,
     "alpha: expected a finite number >= 0, got an int too large for a float"),
]


@pytest.mark.parametrize("cls,kw,exc,msg", [
    (cls, kw, exc, msg) for cls in (EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer)
    for kw, exc, msg in BAD_CONSTRUCTOR_ARGS] + [
    (PrioritizedEpisodeReplayBuffer, kw, exc, msg) for kw, exc, msg in BAD_ALPHA])
def test_constructor_arguments_of_the_wrong_type_or_value(cls, kw, exc, msg):
    with pytest.raises(exc) as e:
        cls(**kw)
    assert type(e.value) is exc and str(e.value) == msg


def test_constructor_takes_numpy_numbers_and_rllib_keys():
    from ray.rllib.utils.replay_buffers.replay_buffer import StorageUnit

    buf = PrioritizedEpisodeReplayBuffer(
        capacity=np.int64(100), batch_size_B=np.int32(8), batch_length_T=0, alpha=np.float32(0.5),
        n_step=(np.int64(1), 3), seed=np.uint64(2**64 - 1), beta=0.4, type="x",
        storage_unit=StorageUnit.TIMESTEPS, replay_sequence_length=1,
        metrics_num_episodes_for_smoothing=None)
    assert buf.capacity == 100 and type(buf.capacity) is int and buf.batch_size_B == 8
    buf.add(make_episode(10, "a"))
    assert len(buf.sample()) == 8
    EpisodeReplayBuffer(storage_unit="timesteps", batch_length_T=None, n_step=[2, 4])
    # the uniform buffer has no alpha, and says so
    with pytest.raises(TypeError, match=r"^unexpected argument\(s\) 'alpha'; exreplay's "
                                        r"EpisodeReplayBuffer takes capacity, batch_size_B, "
                                        r"batch_length_T, metrics_num_episodes_for_smoothing, "):
        EpisodeReplayBuffer(alpha=0.6)


def test_dict_observations_refused_at_first_add():
    eps = SingleAgentEpisode(observations=[{"a": 0}])
    eps.add_env_step(observation={"a": 1}, action=0, reward=0.0)
    buf = PrioritizedEpisodeReplayBuffer(capacity=100)
    with pytest.raises(TypeError, match="Dict, Tuple and other structured spaces"):
        buf.add(eps)
    assert buf.get_num_timesteps() == 0


def test_episodes_without_steps_add_nothing():
    """An episode of no steps (only its reset observation, or nothing) adds
    nothing, also as the first add of either class (the uniform buffer's
    eviction used to read the length of the buffer not yet built: a bare
    TypeError)."""
    for cls in (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer):
        buf = cls(capacity=10)
        buf.add([SingleAgentEpisode(id_="x", observations=[0.0]), SingleAgentEpisode(id_="y")])
        assert buf.exreplay_buffer is None and len(buf) == 0 and buf.get_num_episodes() == 0
        buf.add([SingleAgentEpisode(id_="z", observations=[0.0]), make_episode(3, "a")])
        assert len(buf) == 3 and buf.get_num_episodes() == 1


def empty_end(id_, t, terminated=True):
    """A done fragment of no steps: its one observation (t) is the previous
    fragment's last, where the episode ended exactly at a fragment boundary."""
    eps = SingleAgentEpisode(id_=id_, observations=[float(t)], infos=[{}], t_started=t)
    eps.is_terminated = terminated
    eps.is_truncated = not terminated
    return eps


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
@pytest.mark.parametrize("terminated", [True, False])
@pytest.mark.parametrize("one_add", [False, True])
def test_a_done_fragment_of_no_steps_ends_the_open_episode(cls, terminated, one_add):
    """The episode ends (ExperienceReplay.end_episode): its final state is
    the fragment's observation, its end flag the fragment's, the picks of its
    last steps exist, its id_ is no longer open; the buffer then holds exactly
    what one fragment of all the steps, done, leaves (the same bytes, the same
    samples). Before, it stayed open for ever: the last n_max steps were never
    drawn and terminated was lost."""
    def twins():
        return [cls(capacity=100, n_step=3, seed=5) for _ in range(2)]

    a, b = twins()
    frags = [fragment("x", 0, 6, False), empty_end("x", 6, terminated)]
    if one_add:
        a.add(frags)
    else:
        for f in frags:
            a.add(f)
    whole = fragment("x", 0, 6, terminated)
    whole.is_truncated = not terminated
    b.add(whole)
    rb = a.exreplay_buffer
    (h,) = rb._handles()
    e = rb.episode(h)
    assert e.ended and bool(e.terminated) == terminated and e.final_state == 6.0
    assert rb.num_picks == 6  # every step of the ended episode has a pick
    assert rb.serialize(0) == b.exreplay_buffer.serialize(0)
    assert (a.get_num_episodes(), a.get_num_timesteps(), a.get_added_timesteps()) == (1, 6, 6)
    assert [(x.id_, len(x), x.is_terminated, x.is_truncated) for x in a.episodes] == [
        ("x", 6, terminated, not terminated)]
    for n in (1, 3):
        sa, sb = a.sample(64, n_step=n), b.sample(64, n_step=n)
        assert [unpack(x)[:6] for x in sa] == [unpack(x)[:6] for x in sb]
        last = [x for x in sa if x.t_started + n == 6]
        assert last and all(x.is_terminated == terminated and x.is_truncated != terminated
                            for x in last)
        assert all(x.get_observations(-1) == 6.0 for x in last)
    # the id_ has ended: a further fragment of it is refused, as after any end
    with pytest.raises(ValueError, match="got the id_ of an episode held that has ended"):
        a.add(fragment("x", 6, 2, True))
    rb._check()


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
def test_a_done_fragment_of_no_steps_is_checked_first(cls):
    """Its observation must be the open episode's last (it is the same one)
    and fit the buffer; otherwise a ValueError naming episodes, and nothing
    changes. A done fragment of no steps for an id_ not held adds nothing."""
    buf = _filled(cls)  # "open": t 0..5, open, last observation 5.0
    before = _snapshot(buf)
    bad = empty_end("open", 5)
    bad.observations = type(bad.observations)([7.0])
    for eps, msg in [(bad, "expected a first observation equal to the last one of the open "
                           "episode with this id_ (the fragment continues it), got 7.0 (the "
                           "episode's last: 5.0)"),
                     (empty_end("open", 4), "expected t_started 5 (where the open episode with "
                                            "this id_ stopped), got 4")]:
        with pytest.raises(ValueError) as e:
            buf.add([make_episode(10, "new", base=500.0), eps])
        assert str(e.value) == "episodes: " + msg + _AT1 % "open"
        assert _snapshot(buf) == before
    buf.add(empty_end("never seen", 3))
    assert buf.get_num_episodes() == 3
    buf.add(empty_end("open", 5))
    assert all(buf.exreplay_buffer.episode(h).ended for h in buf.exreplay_buffer._handles())


class _FailingEnd:
    """An ExperienceReplay whose end_episode raises MemoryError, as an
    allocation failure does (nothing ended)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __len__(self):
        return len(self.real)

    def end_episode(self, *args, **kwargs):
        raise MemoryError("end_episode: injected")


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
def test_a_failed_end_leaves_the_episode_open(cls):
    """A MemoryError from end_episode stops the add there: the episode is
    still open, and adding the fragment again ends it."""
    def filled():
        buf = cls(capacity=1000, n_step=2, seed=1)
        buf.add(fragment("open", 0, 4, False))
        return buf

    buf, twin = filled(), filled()
    real = buf.exreplay_buffer
    buf._buf = _FailingEnd(real)
    try:
        with pytest.raises(MemoryError):
            buf.add([make_episode(5, "x", base=100.0), empty_end("open", 4)])
    finally:
        buf._buf = real
    twin.add(make_episode(5, "x", base=100.0))
    assert _snapshot(buf) == _snapshot(twin)
    buf.add(empty_end("open", 4))
    twin.add(empty_end("open", 4))
    assert pickle.dumps(buf.get_state()) == pickle.dumps(twin.get_state())
    assert all(real.episode(h).ended for h in real._handles())


# ------------------------------------------- a refused add changes nothing


def _snapshot(buf):
    """What a refused call must leave as it was: the whole state (the buffer's
    bytes, counters, id maps, open episodes, last sample, generator) and the
    metrics."""
    return pickle.dumps(buf.get_state()), pickle.dumps(buf.metrics.get_state())


def _episode(obs, actions, rewards=None, id_="bad", terminated=True):
    """An episode built from lists: observations obs[0..T], actions[0..T-1]."""
    return SingleAgentEpisode(id_=id_, observations=list(obs), actions=list(actions),
                              rewards=list(np.ones(len(actions)) if rewards is None else rewards),
                              terminated=terminated, len_lookback_buffer=0)


def _filled(cls):
    """A buffer close to its capacity (the next add evicts), with an open
    episode, a sample awaiting priorities and metrics logged."""
    buf = cls(capacity=30, n_step=2, seed=1)
    buf.add([make_episode(10, "a"), make_episode(5, "open", terminated=False),
             make_episode(10, "b", base=100.0)])
    buf.sample(4)
    return buf


_WHERE = r" \(the episode at index 1, id_ 'bad'\)$"
# (second episode of an add, exception, message): the first episode of the
# add is good, and would have been recorded (and made the buffer evict)
BAD_EPISODES = [
    (_episode(np.zeros((4, 2)), [0, 0, 0]), ValueError,
     r"^episodes: expected observations of shape \(\) per step \(the buffer's\), got \(2,\)" + _WHERE),
    (_episode(["w", "x", "y", "z"], [0, 0, 0]), TypeError,
     r"^episodes: expected observations of dtype float64 \(or one that casts to it under "
     r"same_kind\), got <U1" + _WHERE),
    (_episode([{"k": 1.0}] * 4, [0, 0, 0]), TypeError,
     r"^episodes: expected observations of dtype float64 .*, got object" + _WHERE),
    (_episode([1.0, 2.0, 3.0, 4.0], [0.5, 0.5, 0.5]), TypeError,
     r"^episodes: expected actions of dtype int64 \(or one that casts to it under same_kind\), "
     r"got float64" + _WHERE),
    (_episode([1.0, 2.0, 3.0, 4.0], [[0, 1], [0, 1], [0, 1]]), ValueError,
     r"^episodes: expected actions of shape \(\) per step \(the buffer's\), got \(2,\)" + _WHERE),
    (_episode([1.0, 2.0, 3.0, 4.0], [0, 0, 0], rewards=["1", "1", "1"]), TypeError,
     r"^episodes: expected rewards of real numbers \(bool, int or float\), got <U1" + _WHERE),
    (5, TypeError,
     r"^episodes: expected a SingleAgentEpisode or a list of them \(multi-agent episodes are "
     r"not supported\), got a list holding int at index 1$"),
]


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
@pytest.mark.parametrize("bad,exc,msg", BAD_EPISODES)
def test_a_refused_add_changes_nothing(cls, bad, exc, msg):
    """Every episode of an add is checked before anything is recorded or
    evicted: the good episode before a bad one is not added (it used to be,
    and the prioritized buffer evicted for it first), and the error names
    episodes, what was expected and what came."""
    buf = _filled(cls)
    before = _snapshot(buf)
    with pytest.raises(exc, match=msg) as e:
        buf.add([make_episode(10, "new", base=500.0), bad])
    assert type(e.value) is exc
    assert _snapshot(buf) == before
    twin = _filled(cls)
    a, b = buf.sample(8), twin.sample(8)  # and it draws as before
    assert [unpack(x) for x in a] == [unpack(y) for y in b]


def test_a_refused_first_add_builds_nothing():
    """The first add takes the layout from its first episode; a later
    episode of the same add that does not fit it leaves the buffer unbuilt."""
    for cls in (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer):
        buf = cls(capacity=100)
        with pytest.raises(ValueError, match=r"^episodes: expected observations of shape \(\)"):
            buf.add([make_episode(5, "good"), _episode(np.zeros((4, 3)), [0, 0, 0])])
        assert buf.exreplay_buffer is None and buf.get_num_timesteps() == 0
        assert buf.get_added_timesteps() == 0 and buf.episodes == []
        buf.add(_episode(np.zeros((4, 3)), [0, 0, 0], id_="c"))  # a fresh layout is fine
        assert buf.exreplay_buffer.state_shape == (3,)


# ------------------------------------- a failed add: what it leaves, counted


class _FailingRecord:
    """An ExperienceReplay whose record_many raises MemoryError at its nth
    call (from 1) without recording, as an allocation failure does."""

    def __init__(self, real, nth):
        self.real, self.nth, self.calls = real, nth, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def __len__(self):
        return len(self.real)

    def record_many(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.nth:
            raise MemoryError("record_many: injected")
        return self.real.record_many(*args, **kwargs)


def _failing_add(buf, episodes, nth):
    """buf.add(episodes) with its nth record_many failing; the error."""
    real = buf.exreplay_buffer
    buf._buf = _FailingRecord(real, nth)
    try:
        with pytest.raises(MemoryError) as e:
            buf.add(episodes)
    finally:
        buf._buf = real
    return e.value


def _three_fragments():
    """A new episode, the open one's end and another new one."""
    return [make_episode(5, "x", base=100.0), fragment("open", 4, 3, True),
            make_episode(2, "y", base=200.0)]


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
@pytest.mark.parametrize("nth", [1, 2, 3])
def test_a_failed_add_leaves_the_fragments_before_it_recorded_and_counted(cls, nth):
    """An add stopped by a failure of its nth record_many (which records all
    of a fragment or nothing) leaves exactly what an add of the fragments
    before that one leaves: recorded, kept track of and counted (the added
    timesteps and the metrics; they were not counted, while the buffer held
    them); the failing fragment and those after it can be added again."""
    def filled():
        buf = cls(capacity=1000, n_step=2, seed=1)
        buf.add(fragment("open", 0, 4, False))
        return buf

    buf, twin = filled(), filled()
    err = _failing_add(buf, _three_fragments(), nth)
    if nth > 1:
        twin.add(_three_fragments()[: nth - 1])
    assert buf.get_added_timesteps() == 4 + (0, 5, 8)[nth - 1]
    assert _snapshot(buf) == _snapshot(twin)
    assert [(e.id_, len(e)) for e in buf.episodes] == [
        [("open", 4)], [("open", 4), ("x", 5)], [("open", 7), ("x", 5)]][nth - 1]
    if hasattr(err, "add_note"):  # Python 3.11+
        note = ("exreplay.rllib add: the episodes before index %d were added (and count in the "
                "counters and metrics); the one at index %d and those after it were not"
                % (nth - 1, nth - 1))
        assert err.__notes__ == [note if nth > 1 else
                                 "exreplay.rllib add: no episode of this add was added"]
    buf.add(_three_fragments()[nth - 1:])
    twin.add(_three_fragments()[nth - 1:])
    assert pickle.dumps(buf.get_state()) == pickle.dumps(twin.get_state())
    buf.exreplay_buffer._check()


def test_a_failed_add_keeps_its_evictions_counted():
    """The prioritized buffer evicts for a whole add before it records: a
    failure after that leaves the evictions made, counted like the steps
    recorded, and the episodes it holds are the ExperienceReplay's."""
    buf = PrioritizedEpisodeReplayBuffer(capacity=18, seed=1)
    buf.add([make_episode(8, "a"), make_episode(8, "b", base=50.0)])
    # 16 + 12 steps: "a" and "b" are evicted, then "c" is recorded and "d" fails
    _failing_add(buf, [make_episode(6, "c", base=100.0), make_episode(6, "d", base=200.0)], 2)
    assert [(e.id_, len(e)) for e in buf.episodes] == [("c", 6)]
    assert len(buf.exreplay_buffer) == buf.get_num_timesteps() == 6
    assert buf.get_num_episodes() == buf.exreplay_buffer.num_episodes == 1
    assert buf.get_num_episodes_evicted() == 2 and buf.get_added_timesteps() == 22
    m = buf.get_metrics()
    assert m["num_episodes_evicted_lifetime"] == 2 and m["num_env_steps_added_lifetime"] == 22
    buf.add(make_episode(6, "d", base=200.0))
    assert [(e.id_, len(e)) for e in buf.episodes] == [("c", 6), ("d", 6)]
    buf.exreplay_buffer._check()


def test_a_failed_first_add_builds_nothing(monkeypatch):
    """The first add builds the ExperienceReplay and its selector: a failure
    in either leaves the buffer unbuilt (it kept an ExperienceReplay without
    a selector, which the next add took as built)."""
    import exreplay

    real = exreplay.ExperienceReplay

    class NoSelector:
        def __init__(self, *args, **kwargs):
            self.real = real(*args, **kwargs)

        def __getattr__(self, name):
            return getattr(self.real, name)

        def new_pick_selector(self, *args, **kwargs):
            raise MemoryError("new_pick_selector: injected")

    for cls in (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer):
        buf = cls(capacity=100)
        monkeypatch.setattr(exreplay, "ExperienceReplay", NoSelector)
        with pytest.raises(MemoryError):
            buf.add(make_episode(5, "a"))
        monkeypatch.setattr(exreplay, "ExperienceReplay", real)
        assert buf.exreplay_buffer is None and buf.get_added_timesteps() == 0
        buf.add(make_episode(5, "a"))
        assert len(buf.sample(4)) == 4


@pytest.mark.parametrize("episodes,msg", [
    (5, "got int"), (None, "got NoneType"), ("abc", "got str"),
    ([make_episode(3, "a"), "x"], "got a list holding str at index 1"),
])
def test_add_refuses_what_is_not_episodes(episodes, msg):
    buf = PrioritizedEpisodeReplayBuffer(capacity=100)
    with pytest.raises(TypeError) as e:
        buf.add(episodes)
    assert type(e.value) is TypeError and str(e.value) == (
        "episodes: expected a SingleAgentEpisode or a list of them (multi-agent episodes "
        "are not supported), %s" % msg)
    assert buf.exreplay_buffer is None


_WEIGHT = "weight: expected None or a finite number >= 0 (the new steps' priority), got "


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
@pytest.mark.parametrize("weight,exc,got", [
    ("0.5", TypeError, "str"), (True, TypeError, "bool"), ([1.0, 2.0], TypeError, "list"),
    (np.ones(3), TypeError, "numpy.ndarray of dtype float64 and shape (3,)"),
    (1 + 2j, TypeError, "complex"), (float("nan"), ValueError, "nan"),
    (float("inf"), ValueError, "inf"), (-1.0, ValueError, "-1.0"), (-2, ValueError, "-2"),
])
def test_add_weight_of_the_wrong_type_or_value(cls, weight, exc, got):
    """add's weight is one priority for every new step, as RLlib's: checked
    once, before anything (a str that parses as a number was taken; NaN came
    back from record_many as priorities, after the prioritized buffer had
    evicted for the add)."""
    buf = _filled(cls)
    before = _snapshot(buf)
    with pytest.raises(exc) as e:
        buf.add([make_episode(10, "new", base=500.0)], weight=weight)
    assert type(e.value) is exc and str(e.value) == _WEIGHT + got
    assert _snapshot(buf) == before


def test_add_weight_is_the_new_steps_priority():
    for w in (0, 0.25, np.float32(0.5), np.int64(2), np.array(3.0)):
        buf = PrioritizedEpisodeReplayBuffer(capacity=100, alpha=0.5)
        buf.add(make_episode(10, "a"), weight=w)
        rb = buf.exreplay_buffer
        np.testing.assert_allclose(rb.stored_priorities(0, *rb._picks()), float(w) ** 0.5, rtol=1e-6)


_AT1 = " (the episode at index 1, id_ %r)"


@pytest.mark.parametrize("cls", [PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer])
@pytest.mark.parametrize("bad,msg", [
    (fragment("open", 9, 3, False),
     "episodes: expected t_started 5 (where the open episode with this id_ stopped), got 9"),
    (fragment("open", 0, 3, True),
     "episodes: expected t_started 5 (where the open episode with this id_ stopped), got 0"),
    (make_episode(3, "open", start=5, base=7.0),
     "episodes: expected a first observation equal to the last one of the open episode with "
     "this id_ (the fragment continues it), got 12.0 (the episode's last: 5.0)"),
    (make_episode(3, "a", start=10),
     "episodes: expected a new id_ or the next fragment of an open episode, got the id_ of an "
     "episode held that has ended"),
    (make_episode(10, "a"),
     "episodes: expected a new id_ or the next fragment of an open episode, got the id_ of an "
     "episode held that has ended"),
    (SingleAgentEpisode(id_="open", observations=[7.0], t_started=7, terminated=True),
     "episodes: expected t_started 5 (where the open episode with this id_ stopped), got 7"),
], ids=["later t", "t 0", "other observation", "ended", "ended, added again", "no steps"])
def test_a_fragment_that_does_not_continue_its_episode_is_refused(cls, bad, msg):
    """A fragment whose id_ is that of an episode held must continue it, as
    RLlib's concat_episode asserts: the episode open, the fragment starting
    at its t (t_started) with its last observation. Otherwise a ValueError
    naming episodes, and nothing changes (the fragment was recorded: a second
    episode with the id_ of an ended one, or steps appended at the wrong t)."""
    buf = _filled(cls)  # "a" (10 steps, ended), "open" (t 0..5, open), "b"
    before = _snapshot(buf)
    with pytest.raises(ValueError) as e:
        buf.add([make_episode(10, "new", base=500.0), bad])
    assert type(e.value) is ValueError and str(e.value) == msg + _AT1 % bad.id_
    assert _snapshot(buf) == before
    buf.add([make_episode(10, "new", base=500.0), fragment("open", 5, 3, True)])  # the good one


def test_fragments_of_one_add_continue_each_other():
    """Several fragments of an episode in one add are checked in order, each
    against the ones before it."""
    for cls in (PrioritizedEpisodeReplayBuffer, EpisodeReplayBuffer):
        buf = cls(capacity=100, n_step=2)
        buf.add([fragment("x", 0, 3, False), fragment("x", 3, 2, True)])
        assert [(e.id_, len(e)) for e in buf.episodes] == [("x", 5)]
        before = _snapshot(buf)
        for frags, msg in [
            ([fragment("y", 0, 3, False), fragment("y", 4, 2, True)],
             "expected t_started 3 (where the open episode with this id_ stopped), got 4"),
            ([fragment("y", 0, 3, True), fragment("y", 3, 2, True)],
             "expected a new id_ or the next fragment of an open episode, got the id_ of an "
             "episode held that has ended"),
        ]:
            with pytest.raises(ValueError) as e:
                buf.add(frags)
            assert str(e.value) == "episodes: " + msg + _AT1 % "y"
            assert _snapshot(buf) == before


def test_the_open_episodes_next_t_survives_the_state_round_trip():
    buf = _filled(PrioritizedEpisodeReplayBuffer)
    other = PrioritizedEpisodeReplayBuffer(capacity=30, n_step=2)
    other.set_state(pickle.loads(pickle.dumps(buf.get_state())))
    with pytest.raises(ValueError, match="^episodes: expected t_started 5 "):
        other.add(fragment("open", 6, 2, True))
    other.add(fragment("open", 5, 2, True))
    # a state without the open episodes' next t (saved before it was kept)
    # restores; their next fragment is then taken at any t_started
    state = buf.get_state()
    del state["running_t"]
    other.set_state(state)
    other.add(make_episode(2, "open", base=-1.0, start=6))  # t_started 6, observation 5.0


def test_a_state_with_last_observations_in_the_episode_s_dtype_continues():
    """A state saved before add compared observations in the buffer's dtype
    holds the open episodes' last observations as they came (float64 under a
    float32 Box): restored, they are cast, so the episode's next fragment
    (cast too) is taken, not refused as not continuing it."""
    import gymnasium as gym

    spaces = dict(observation_space=gym.spaces.Box(-10, 10, (1,), np.float32),
                  action_space=gym.spaces.Discrete(2))
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=1, **spaces)
    eps = SingleAgentEpisode(id_="o", observations=[np.array([0.3])], infos=[{}])
    for t in range(3):
        eps.add_env_step(observation=np.array([1.3 + t]), action=0, reward=1.0, infos={})
    buf.add(eps)
    state = buf.get_state()
    del state["running_t"]
    state["running"] = [(k, h, n, np.array([3.3])) for k, h, n, _ in state["running"]]
    other = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=1, **spaces)
    other.set_state(state)
    cont = SingleAgentEpisode(id_="o", observations=[np.array([3.3])], infos=[{}], t_started=3)
    cont.add_env_step(observation=np.array([4.3]), action=1, reward=1.0, infos={},
                      terminated=True)
    other.add(cont)
    assert other.get_num_timesteps() == 4 and other.get_num_episodes() == 1


def test_episodes_is_read_only():
    """episodes is rebuilt from the buffer: assigning it is an AttributeError
    that names it, whatever the value (None or a number was a bare TypeError
    from len()), except the empty deque RLlib's constructor assigns."""
    buf = _filled(PrioritizedEpisodeReplayBuffer)
    before = _snapshot(buf)
    for v, got in ((None, "NoneType"), (5, "int"), ([make_episode(3, "x")], "list")):
        with pytest.raises(AttributeError) as e:
            buf.episodes = v
        assert str(e.value) == ("episodes: read-only on exreplay's RLlib buffers (rebuilt from "
                                "the buffer; add and set_state change it), got %s" % got)
    buf.episodes = []
    assert _snapshot(buf) == before


def test_fragments_continue_their_episode():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000, n_step=3, seed=0)
    # one 12-step episode in three fragments (as EnvRunners send them)
    for k, (start, n) in enumerate(((0, 5), (5, 4), (9, 3))):
        frag = make_episode(n, "run", terminated=k == 2, start=start)
        buf.add(frag)
        assert buf.get_num_episodes() == 1
    assert buf.get_num_timesteps() == 12
    (ep,) = buf.episodes
    np.testing.assert_allclose(ep.get_observations(), np.arange(13.0))
    # items across the fragment borders have the right 3-step returns
    ts = set()
    for _ in range(100):
        for e in buf.sample(batch_size_B=8, n_step=3):
            o = float(e.get_observations(0))
            ts.add(e.t_started)
            assert e.get_observations(-1) == pytest.approx(o + 3)
            assert e.get_rewards(-1) == pytest.approx(sum(0.99**k * 0.1 * (o + k + 1) for k in range(3)))
            assert e.is_terminated == (e.t_started == 9)
    assert ts == set(range(10))


@pytest.mark.slow  # many draws: skipped in the (several times slower) ASan run
def test_sample_arguments_of_the_wrong_type_are_refused_before_drawing():
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=2, seed=1)
    buf.add(make_episode(10, "a"))
    rng = copy.deepcopy(buf.rng.bit_generator.state)
    B = "None or an int >= 0 (None and 0: the buffer's batch_size_B)"
    for kw, exc, msg in [
        (dict(num_items="4"), TypeError, "num_items: expected %s, got str" % B),
        (dict(num_items=True), TypeError, "num_items: expected %s, got bool" % B),
        (dict(batch_size_B=2.5), TypeError, "batch_size_B: expected %s, got float" % B),
        (dict(num_items=-3), ValueError, "num_items: expected %s, got -3" % B),
        (dict(gamma=None), TypeError, "gamma: expected a finite number >= 0, got NoneType"),
        (dict(gamma="0.99"), TypeError, "gamma: expected a finite number >= 0, got str"),
        (dict(gamma=float("nan")), ValueError, "gamma: expected a finite number >= 0, got nan"),
        (dict(beta="0.4"), TypeError, "beta: expected None or a finite number >= 0, got str"),
        (dict(beta=True), TypeError, "beta: expected None or a finite number >= 0, got bool"),
        (dict(batch_length_T="1"), TypeError, "batch_length_T: expected None or an int, got str"),
        (dict(lookback=0.5), TypeError, "lookback: expected None or an int, got float"),
    ]:
        with pytest.raises(exc) as e:
            buf.sample(**kw)
        assert type(e.value) is exc and str(e.value) == msg, kw
        assert buf.rng.bit_generator.state == rng and buf.get_sampled_timesteps() == 0, kw
    assert len(buf.sample(num_items=0)) == buf.batch_size_B  # RLlib's rule: 0 is the default
    assert len(buf.sample(num_items=np.int64(3), gamma=np.float32(0.9), beta=None)) == 3


def test_update_priorities_applies_to_last_sample():
    rng = np.random.default_rng(3)
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, alpha=1.0, seed=3)
    for e in random_episodes(rng, 200):
        buf.add(e)
    sample = buf.sample(batch_size_B=16, n_step=1)
    weights = np.array([e.get_extra_model_outputs("weights", -1) for e in sample])
    assert np.all(np.abs(weights - 1) < 1e-5)
    epi, pos = (a.copy() for a in buf.last_sampled)
    buf.update_priorities(np.full(16, 0.01))
    rb = buf.exreplay_buffer
    np.testing.assert_allclose(rb.stored_priorities(0, epi, pos), 0.01, rtol=1e-6)
    keys = set(zip(epi.tolist(), pos.tolist()))
    hits = 0
    for _ in range(400):
        buf.sample(batch_size_B=16, n_step=1)
        e2, p2 = buf.last_sampled
        hits += any((a, b) in keys for a, b in zip(e2.tolist(), p2.tolist()))
    assert hits / 400 < 0.15
    with pytest.raises(ValueError, match="expected 16 values"):
        buf.update_priorities(np.ones(3))


_PRIORITIES = ("priorities: expected an array of real numbers, one per item of the last sample, "
               "got ")


@pytest.mark.parametrize("p,exc,msg", [
    ("abcd", TypeError, _PRIORITIES + "str"),
    (["1", "2", "3", "4"], TypeError, _PRIORITIES + "list (as an array: dtype <U1, shape (4,))"),
    ([object()] * 4, TypeError, _PRIORITIES + "list (as an array: dtype object, shape (4,))"),
    (None, TypeError, _PRIORITIES + "NoneType"),
    ({"a": 1.0}, TypeError, _PRIORITIES + "dict"),
    (1.0, TypeError, _PRIORITIES + "float"),
    (np.ones(4) * 1j, TypeError, _PRIORITIES + "numpy.ndarray of dtype complex128 and shape (4,)"),
    (np.ones(4, bool), TypeError, _PRIORITIES + "numpy.ndarray of dtype bool and shape (4,)"),
    (np.ones((2, 2)), ValueError,
     "priorities: expected a 1-D array of 4 values (one per item of the last sample), got "
     "shape (2, 2)"),
    (np.ones(3), ValueError, "priorities: expected 4 values (one per item of the last sample), got 3"),
    ([1.0, float("nan"), 1.0, 1.0], ValueError,
     "priorities: expected finite numbers >= 0, got nan at index 1"),
    ([1.0, 1.0, float("inf"), 1.0], ValueError,
     "priorities: expected finite numbers >= 0, got inf at index 2"),
], ids=["str", "strs", "objects", "None", "dict", "float", "complex", "bool", "2-D", "length",
        "nan", "inf"])
def test_refused_priorities_change_nothing(p, exc, msg):
    """update_priorities takes an array of real numbers of the last sample's
    length: a wrong type is a TypeError (strings that parse as numbers,
    bools and complex numbers were taken, as float64), a wrong shape or
    value a ValueError, each naming priorities, and nothing changes: the
    sample still awaits its priorities."""
    buf = _filled(PrioritizedEpisodeReplayBuffer)  # a sample of 4 awaits priorities
    before = _snapshot(buf)
    with pytest.raises(exc) as e:
        buf.update_priorities(p)
    assert type(e.value) is exc and str(e.value) == msg
    assert _snapshot(buf) == before
    buf.update_priorities(np.full(4, 0.5))


def test_priorities_rllib_takes():
    """What RLlib's update_priorities takes: any real numbers (ints, float32,
    a column), each clipped below at 1e-12, negative ones too."""
    for p in (np.arange(4), np.ones(4, np.float32), np.ones((4, 1)), [-1.0, 0.0, 2.0, 3.0]):
        buf = _filled(PrioritizedEpisodeReplayBuffer)
        epi, pos = (a.copy() for a in buf.last_sampled)
        buf.update_priorities(p)
        want = np.maximum(np.asarray(p, np.float64).reshape(-1), 1e-12)
        np.testing.assert_allclose(buf.exreplay_buffer.stored_priorities(0, epi, pos), want, rtol=1e-6)


def test_update_priorities_without_a_sample_awaiting_them():
    """An empty update with no sample awaiting priorities does nothing, as in
    RLlib; values then, before any sample or for a sample already updated,
    are a ValueError that says so (RLlib asserts the lengths match)."""
    msg = ("priorities: expected no values (no sample awaits priorities: none was drawn since "
           "the last update_priorities), got 4")
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, seed=0)
    buf.update_priorities([])
    buf.add(make_episode(10, "a"))
    for sampled in (False, True):
        if sampled:
            buf.sample(4)
            buf.update_priorities(np.full(4, 2.0))
        before = _snapshot(buf)
        with pytest.raises(ValueError) as e:
            buf.update_priorities(np.ones(4))
        assert str(e.value) == msg
        assert _snapshot(buf) == before
        buf.update_priorities(np.ones(0))


@pytest.mark.slow  # many draws: skipped in the (several times slower) ASan run
def test_one_high_priority_item_dominates():
    buf = PrioritizedEpisodeReplayBuffer(capacity=10, alpha=1.0, seed=4)
    buf.add(make_episode(10, "a"))
    rb = buf.exreplay_buffer
    (h,) = rb._handles()
    rb.set_priority(0, [h], [1], [np.random.default_rng(4).random() + 0.2])
    rb.set_priority(0, [h] * 9, [0, 2, 3, 4, 5, 6, 7, 8, 9], 0.01)
    for _ in range(10):
        buf.sample(1000)
        assert np.mean(buf.last_sampled[1] == 1) > 0.8


def test_weights_follow_rllib_normalisation():
    buf = PrioritizedEpisodeReplayBuffer(capacity=1000, alpha=0.6, seed=5)
    buf.add(make_episode(50, "a"))
    buf.sample(batch_size_B=50)
    prios = np.linspace(0.1, 3.0, 50)
    buf.update_priorities(prios)
    sample = buf.sample(batch_size_B=64, beta=0.4)
    epi, pos = buf.last_sampled
    stored = buf.exreplay_buffer.stored_priorities(0, epi, pos)
    leaves = buf.exreplay_buffer.stored_priorities(0, *buf.exreplay_buffer._picks())
    # RLlib: w = (N P(i))**-beta / max_j (N P(j))**-beta = (min_leaf / leaf_i) ** beta
    want = (leaves.min() / stored) ** 0.4
    got = np.array([e.get_extra_model_outputs("weights", -1) for e in sample])
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert np.all((got > 0) & (got <= 1))


def test_uniform_buffer_weights_are_one():
    buf = EpisodeReplayBuffer(capacity=1000, n_step=2, seed=6)
    buf.add([make_episode(20, "a"), make_episode(7, "b", base=50.0)])
    sample = buf.sample(batch_size_B=32, n_step=2, beta=0.7)
    assert all(e.get_extra_model_outputs("weights", -1) == 1.0 for e in sample)
    # DQN sends priorities only to an isinstance(PrioritizedEpisodeReplayBuffer)
    assert not isinstance(buf, RLlibPER)


# ----------------------------------------------------------- state round trip


def test_get_state_set_state_round_trip():
    rng = np.random.default_rng(7)
    buf = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=(1, 4), alpha=0.6, seed=7)
    for e in random_episodes(rng, 200):
        buf.add(e)
    buf.add(make_episode(5, "open", terminated=False))
    buf.sample(batch_size_B=16, n_step=(1, 4))
    buf.update_priorities(rng.random(16) + 0.1)
    buf.sample(batch_size_B=16, n_step=(1, 4))
    state = pickle.loads(pickle.dumps(buf.get_state()))
    buf2 = PrioritizedEpisodeReplayBuffer(capacity=100, n_step=(1, 4), alpha=0.6)
    buf2.set_state(state)
    for f in ("get_num_episodes", "get_num_episodes_evicted", "get_num_timesteps",
              "get_added_timesteps", "get_sampled_timesteps"):
        assert getattr(buf, f)() == getattr(buf2, f)(), f
    assert [e.id_ for e in buf.episodes] == [e.id_ for e in buf2.episodes]
    np.testing.assert_array_equal(buf.last_sampled[0], buf2.last_sampled[0])
    # the same next draws, priorities and continuation of the open episode
    buf.update_priorities(np.full(16, 2.0))
    buf2.update_priorities(np.full(16, 2.0))
    cont = make_episode(3, "open", terminated=True, start=5)
    buf.add(cont)
    buf2.add(cont)
    a = buf.sample(batch_size_B=32, n_step=(1, 4), beta=0.5)
    b = buf2.sample(batch_size_B=32, n_step=(1, 4), beta=0.5)
    for x, y in zip(a, b):
        assert unpack(x) == pytest.approx(unpack(y))
    np.testing.assert_array_equal(np.asarray(buf.episodes[-1].get_observations()), np.asarray(buf2.episodes[-1].get_observations()))
    with pytest.raises(ValueError, match="get_state"):
        buf2.set_state({"episodes": []})
    with pytest.raises(ValueError, match="prioritized"):
        EpisodeReplayBuffer().set_state(state)


def _state_parts(buf):
    return (buf.get_num_episodes(), buf.get_num_timesteps(), buf.get_sampled_timesteps(),
            [e.id_ for e in buf.episodes], buf.rng.bit_generator.state["state"])


@pytest.mark.parametrize("damage", ["buffer bytes", "missing key", "rng", "end_len", "running",
                                    "selector"])
def test_a_refused_state_changes_nothing(damage):
    """set_state checks and decodes every part of a state before it sets any:
    a state refused in a late part (it used to have replaced the buffer and
    several counters by then) leaves the buffer as it was."""
    rng = np.random.default_rng(3)
    src = PrioritizedEpisodeReplayBuffer(capacity=200, n_step=(1, 3), seed=3)
    for e in random_episodes(rng, 40):
        src.add(e)
    state = pickle.loads(pickle.dumps(src.get_state()))
    if damage == "buffer bytes":
        b = bytearray(state["buffer"])
        b[len(b) // 2] ^= 0xFF
        state["buffer"] = bytes(b)
    elif damage == "missing key":
        del state["sampled_timesteps"]
    elif damage == "rng":
        state["rng"] = {"bit_generator": "nonsense"}
    elif damage == "end_len":
        state["end_len"] = (np.array([10**9]), np.array([3]))
    elif damage == "selector":  # a handle the buffer's bytes hold no selector for
        state["selector"] = 7
    else:
        state["running"] = [(1, 2)]
    dst = PrioritizedEpisodeReplayBuffer(capacity=200, n_step=(1, 3), seed=5)
    for e in random_episodes(np.random.default_rng(5), 10):
        dst.add(e)
    before = _state_parts(dst)
    with pytest.raises(ValueError, match="^state: "):
        dst.set_state(state)
    assert _state_parts(dst) == before
    dst.sample(batch_size_B=8, n_step=(1, 3))  # still works


def test_apply_state_takes_only_what_check_state_returned():
    """apply_state assigns without checking (check_state has): given anything
    but check_state's result, a get_state() dict for instance, it is a
    TypeError before anything is assigned (it set the dict's keys as
    attributes, the capacity among them, until one failed, or all silently)."""
    buf = _filled(PrioritizedEpisodeReplayBuffer)
    src = _filled(PrioritizedEpisodeReplayBuffer)
    src.add(make_episode(3, "more"))
    before = _snapshot(buf)
    for bad, got in [(src.get_state(), "dict"), ({"capacity": 5}, "dict"), (None, "NoneType"),
                     (dict(buf.check_state(src.get_state())), "dict")]:
        with pytest.raises(TypeError) as e:
            buf.apply_state(bad)
        assert str(e.value) == (
            "checked: expected what check_state() returned (set_state(state) checks a "
            "get_state() dict and applies it), got " + got)
        assert _snapshot(buf) == before and buf.capacity == 30
    buf.apply_state(buf.check_state(src.get_state()))
    assert _snapshot(buf)[0] == _snapshot(src)[0]


def _mixin_algo(local_replay_buffer=None):
    """An algorithm with ReplayBufferCheckpoints mixed in, whose own set_state
    keeps the state it is given in .restored (None until then)."""
    from exreplay.rllib.checkpoint import ReplayBufferCheckpoints

    class Algo:
        restored = None
        config = None

        def set_state(self, state):
            self.restored = state

    class WithBuffer(ReplayBufferCheckpoints, Algo):
        pass

    algo = WithBuffer()
    algo.local_replay_buffer = local_replay_buffer
    return algo

def test_checkpoint_mixin_checks_the_buffer_state_before_the_algorithm_s():
    """With exreplay's buffer, the mixin checks the buffer's state before it
    restores the algorithm's: a refused one leaves both as they were."""
    from exreplay.rllib.checkpoint import BUFFER_STATE_KEY

    rng = np.random.default_rng(4)
    src = PrioritizedEpisodeReplayBuffer(capacity=200, n_step=(1, 3), seed=4)
    for e in random_episodes(rng, 20):
        src.add(e)
    good = src.get_state()
    bad = dict(good, buffer=b"not a buffer")
    algo = _mixin_algo(PrioritizedEpisodeReplayBuffer(capacity=200, n_step=(1, 3)))
    with pytest.raises(ValueError, match="^state: "):
        algo.set_state({"learner_group": 1, BUFFER_STATE_KEY: bad})
    assert algo.restored is None and algo.local_replay_buffer.get_num_episodes() == 0
    algo.set_state({"learner_group": 2, BUFFER_STATE_KEY: good})
    assert algo.restored["learner_group"] == 2
    assert algo.local_replay_buffer.get_num_timesteps() == src.get_num_timesteps()


# ------------------------------------------------ against RLlib's own buffer


@pytest.mark.slow  # many draws: skipped in the (several times slower) ASan run
def test_against_rllib_buffer_same_episodes():
    rng = np.random.default_rng(8)
    eps = []
    for i in range(30):
        e = make_episode(int(rng.integers(3, 40)), id_="e%d" % i, base=1000.0 * i,
                         terminated=bool(i % 2))
        e.is_truncated = not e.is_terminated
        eps.append(e)
    ours = PrioritizedEpisodeReplayBuffer(capacity=10000, alpha=0.6, n_step=3, seed=8)
    theirs = RLlibPER(capacity=10000, alpha=0.6)
    ours.add(eps)
    theirs.add(eps)
    assert ours.get_num_timesteps() == theirs.get_num_timesteps()
    assert ours.get_num_episodes() == theirs.get_num_episodes()

    def items(buf, draws):
        got = {}
        for _ in range(draws):
            for e in buf.sample(batch_size_B=64, n_step=3, gamma=0.9):
                key = (float(e.get_observations(0)), e.t_started)
                got[key] = (float(e.get_observations(-1)), float(e.get_rewards(-1)),
                            e.is_terminated, e.is_truncated)
            if type(buf) is RLlibPER:
                buf._last_sampled_indices.clear()
        return got

    a, b = items(ours, 250), items(theirs, 250)
    # the same items reachable: every (episode, t) with t + 3 <= its length
    want = {(1000.0 * i + t, t) for i, e in enumerate(eps) for t in range(len(e) - 2)}
    assert set(a) == set(b) == want
    for k in a:
        assert a[k][0] == b[k][0] and a[k][2:] == b[k][2:], k
        assert a[k][1] == pytest.approx(b[k][1], rel=1e-12), k
        o = k[0]
        assert a[k][1] == pytest.approx(sum(0.9**j * 0.1 * ((o % 1000) + j + 1) for j in range(3)))

    # priorities go to the items of the last sample: give each item a
    # priority derived from its observation, read them back by item
    sample = ours.sample(batch_size_B=64, n_step=3)
    pri = np.array([1.0 + (float(e.get_observations(0)) % 7) for e in sample])
    ours.update_priorities(pri)
    rb = ours.exreplay_buffer
    handles = rb._handles()
    by_obs = {}
    for h in handles:
        d = rb.episode(h)
        for p in range(len(d.reward)):
            by_obs[float(d.state[p])] = (h, p)
    epi = np.array([by_obs[float(e.get_observations(0))][0] for e in sample])
    pos = np.array([by_obs[float(e.get_observations(0))][1] for e in sample])
    np.testing.assert_allclose(rb.stored_priorities(0, epi, pos), pri**0.6, rtol=1e-6)


# ------------------------------------------------------------ a short DQN run


@pytest.mark.slow
def test_dqn_trains_through_dotted_type_string():
    import ray
    from ray.rllib.algorithms.dqn import DQNConfig

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        config = (
            DQNConfig()
            .environment("CartPole-v1")
            .env_runners(num_env_runners=0)
            .learners(num_learners=0)
            .debugging(seed=0)
            .reporting(min_sample_timesteps_per_iteration=64)
            .training(
                train_batch_size_per_learner=16,
                num_steps_sampled_before_learning_starts=32,
                n_step=(1, 3),
                replay_buffer_config={
                    "type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer",
                    "capacity": 2000, "alpha": 0.6, "beta": 0.4, "n_step": (1, 3),
                },
            )
        )
        algo = config.build_algo()
        try:
            buf = algo.local_replay_buffer
            assert isinstance(buf, PrioritizedEpisodeReplayBuffer)
            for _ in range(2):
                algo.train()
            assert buf.get_num_timesteps() > 32
            assert buf.get_sampled_timesteps() > 0
            assert buf.last_sampled[0].size == 0  # DQN sent the priorities back
            state = pickle.loads(pickle.dumps(buf.get_state()))
            restored = PrioritizedEpisodeReplayBuffer(capacity=2000, alpha=0.6, n_step=(1, 3))
            restored.set_state(state)
            assert restored.get_num_timesteps() == buf.get_num_timesteps()
            assert restored.get_sampled_timesteps() == buf.get_sampled_timesteps()
        finally:
            algo.stop()
    finally:
        ray.shutdown()


def _small_dqn_config(algo_class=None, store=True):
    from ray.rllib.algorithms.dqn import DQNConfig

    return (
        DQNConfig(algo_class=algo_class)
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .learners(num_learners=0)
        .debugging(seed=0)
        .reporting(min_sample_timesteps_per_iteration=64)
        .training(
            train_batch_size_per_learner=16,
            num_steps_sampled_before_learning_starts=32,
            n_step=(1, 3),
            store_buffer_in_checkpoints=store,
            replay_buffer_config={
                "type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer",
                "capacity": 2000, "alpha": 0.6, "beta": 0.4, "n_step": (1, 3), "seed": 0,
            },
        )
    )


@pytest.mark.slow
def test_checkpoint_holds_the_buffer(tmp_path):
    """algo.save_to_path / Algorithm.from_checkpoint: RLlib's DQN drops the
    buffer even with store_buffer_in_checkpoints=True; exreplay.rllib.DQN
    carries it, and the restored buffer draws what the saved one would."""
    import ray
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.dqn import DQN as RLlibDQN

    import exreplay.rllib

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    try:
        for cls in (RLlibDQN, exreplay.rllib.DQN):
            algo = _small_dqn_config(cls).build_algo()
            try:
                algo.train()
                buf = algo.local_replay_buffer
                held = buf.get_num_timesteps()
                assert held > 32
                path = str(tmp_path / cls.__module__)
                algo.save_to_path(path)
                data = buf.exreplay_buffer.serialize(level=0)
                expect = [unpack(e) for e in buf.sample(num_items=8, n_step=(1, 3), beta=0.4)]
            finally:
                algo.stop()
            algo2 = Algorithm.from_checkpoint(path)
            try:
                assert type(algo2) is cls
                buf2 = algo2.local_replay_buffer
                if cls is RLlibDQN:  # what RLlib itself does in this version
                    assert buf2.get_num_timesteps() == 0
                    continue
                assert buf2.get_num_timesteps() == held
                assert buf2.get_sampled_timesteps() == buf.get_sampled_timesteps() - 8
                assert buf2.exreplay_buffer.serialize(level=0) == data
                got = [unpack(e) for e in buf2.sample(num_items=8, n_step=(1, 3), beta=0.4)]
                for x, y in zip(got, expect):
                    for u, v in zip(x, y):
                        np.testing.assert_array_equal(u, v)
                algo2.train()  # and it goes on learning from it
                assert buf2.get_num_timesteps() > held
            finally:
                algo2.stop()
    finally:
        ray.shutdown()


def test_checkpoint_state_refused_before_anything_is_restored():
    """ReplayBufferCheckpoints.set_state with a buffer's state but no local
    replay buffer: a ValueError, and the algorithm's own state is untouched."""
    from exreplay.rllib.checkpoint import BUFFER_STATE_KEY

    algo = _mixin_algo()
    with pytest.raises(ValueError, match="state: expected no 'local_replay_buffer'"):
        algo.set_state({"learner_group": 1, BUFFER_STATE_KEY: {}})
    assert algo.restored is None
    algo.set_state({"learner_group": 1})
    assert algo.restored == {"learner_group": 1}
    restored = []
    algo.local_replay_buffer = type("Buf", (), {"set_state": lambda self, s: restored.append(s)})()
    algo.set_state({"learner_group": 2, BUFFER_STATE_KEY: {"x": 1}})
    assert algo.restored["learner_group"] == 2 and restored == [{"x": 1}]


def test_sample_metrics_are_rllib_s():
    """sample feeds RLlib's metrics through a fast path after its first call:
    get_metrics gives what RLlib's own _update_sample_metrics would (compared
    by repr: the reduced Stats hold NaN for keys never logged)."""
    rng = np.random.default_rng(11)
    eps = random_episodes(rng, 30, lo=3, hi=40)
    fast = PrioritizedEpisodeReplayBuffer(capacity=10000, n_step=(1, 4), seed=11)
    slow = PrioritizedEpisodeReplayBuffer(capacity=10000, n_step=(1, 4), seed=11)
    slow._log_sample_metrics = slow._rllib_sample_metrics  # RLlib's call every time
    for buf in (fast, slow):
        buf.add(eps)
    for i in range(25):
        for buf in (fast, slow):
            buf.sample(num_items=16, n_step=(1, 4), beta=0.4)
        assert fast._metrics_fast is not None  # set up by the first call
        if i % 7 == 3:
            assert repr(fast.get_metrics()) == repr(slow.get_metrics())
    assert fast._metrics_fast is not None
    assert repr(fast.get_metrics()) == repr(slow.get_metrics())
    fast.metrics.reset()  # a reset logger: back through RLlib's call, then fast again
    slow.metrics.reset()
    for buf in (fast, slow):
        buf.sample(num_items=16, n_step=(1, 4), beta=0.4)
        buf.sample(num_items=16, n_step=(1, 4), beta=0.4)
    assert repr(fast.get_metrics()) == repr(slow.get_metrics())
