"""What a new user sees: reprs, the no-pick errors, out= errors, for_spaces, help()."""

import textwrap

import numpy as np
import pytest

import exreplay
from childrun import run_child


def test_repr_shows_configuration_and_counts():
    buf = exreplay.ExperienceReplay(state_shape=(4,), capacity=100, pick_len=2, seed=3)
    h = None
    for t in range(3):
        h = buf.record(h, np.zeros(4), 0, 1.0, terminated=t == 2)
    r = repr(buf)
    assert r.startswith("ExperienceReplay(state_shape=(4,), state_dtype=float32, action_shape=()")
    assert "capacity=100, pick_len=2, allow_short=False, eviction='fifo', seed=3" in r
    assert r.endswith("3 records in 1 episodes, 2 picks)")


def test_repr_shows_none_arguments_as_none():
    # capacity=None and seed=None are shown as the constructor takes them,
    # not as the string 'None'
    r = repr(exreplay.ExperienceReplay(state_shape=2, capacity=None))
    assert "capacity=None, " in r and "seed=None;" in r
    r = repr(exreplay.ExperienceReplay(state_spec={"a": (2, "uint8")}, capacity=None))
    assert "capacity=None, " in r and "seed=None;" in r


def test_batch_and_episode_reprs_summarise():
    buf = exreplay.ExperienceReplay(state_shape=(84, 84), state_dtype="uint8", capacity=1000)
    h = buf.record_many(None, np.zeros((50, 84, 84), np.uint8), np.zeros(50, np.int64), np.ones(50))
    b = buf.get_batch(32, buf.new_pick_selector(0))
    r = repr(b)
    assert r == ("Batch(state=uint8(32, 1, 84, 84), action=int64(32, 1), reward=float32(32, 1), "
                 "state_next=uint8(32, 1, 84, 84), seq_len=int64(32,), seq_len_next=int64(32,), "
                 "pick_epi=int64(32,), pick_pos=int64(32,), weight=float32(32,), "
                 "pick_index=int64(32,))")
    e = repr(buf.episode(h))
    assert e == ("EpisodeData(state=uint8(50, 84, 84), action=int64(50,), reward=float32(50,), "
                 "final_state=None, ended=False, terminated=False)")
    assert len(r) < 400 and len(e) < 400


# A Batch's fields are the user's to change: repr reads its dicts while
# their values' reprs (Python code) run, and must neither use a key or value
# that code dropped nor recurse without bound. Run in a child: either
# defect crashed the process.
REPR_CHILD = textwrap.dedent("""
    import numpy as np
    import exreplay

    buf = exreplay.ExperienceReplay(state_shape=(3,), capacity=100, pick_len=2, seed=0)
    ps = buf.new_pick_selector(0)
    buf.record_many(None, np.zeros((10, 3), np.float32), np.zeros(10, np.int64), np.ones(10))
    b = buf.get_batch(4, ps)

    class ClearsTheDict:
        def __repr__(self):
            b.extras.clear()  # drops the key, held by the dict only
            global junk       # strings of the key's size, which take its memory
            junk = ["".join(["z"] * 9) for _ in range(64)]
            return "v"

    b.extras["".join(["k"] * 9)] = ClearsTheDict()
    print(repr(b).split("extras=")[1])
    loop = {}
    loop["me"] = loop
    deep = {}
    for _ in range(100_000):
        deep = {"d": deep}
    b.extras.update(loop=loop, deep=deep, batch=b)
    try:
        r = repr(b)
    except RecursionError:
        r = "RecursionError"
    print(r if r == "RecursionError" else r.split("extras=")[1][:60])
    b.extras.clear()
    b.extras.update(loop=loop, batch=b)
    print(repr(b).split("extras=")[1])
""")


def test_batch_repr_survives_fields_changed_by_the_reprs_it_runs():
    r = run_child(REPR_CHILD, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "{'kkkkkkkkk': v})"  # the key as it was, not the memory reused
    assert lines[1] == "RecursionError"  # a deep nesting: Python's limit, not the C stack's
    assert lines[2] == "{'loop': {'me': {...}}, 'batch': Batch(...)})"


def test_no_pick_because_handle_not_passed_back():
    buf = exreplay.ExperienceReplay(state_shape=(2,), pick_len=4)
    ps = buf.new_pick_selector(0)
    for _ in range(10):
        buf.record(None, np.zeros(2), 0, 1.0)  # the handle is dropped every time
    with pytest.raises(ValueError, match=r"each of the 10 records is in an episode of its own.*"
                                         r"pass it back \(h = buf.record\(h"):
        buf.get_batch(4, ps)


def test_no_pick_because_episodes_too_short():
    buf = exreplay.ExperienceReplay(state_shape=(2,), pick_len=8)
    ps = buf.new_pick_selector(0)
    for _ in range(3):
        buf.record_many(None, np.zeros((5, 2)), np.zeros(5, np.int64), np.ones(5), terminated=True)
    with pytest.raises(ValueError, match=r"15 records are in 3 episodes, all shorter than a pick "
                                         r"\(pick_len=8.*allow_short=True"):
        buf.get_batch(4, ps)
    empty = exreplay.ExperienceReplay(state_shape=(2,))
    with pytest.raises(ValueError, match="the buffer is empty"):
        empty.get_batch(1, empty.new_pick_selector(0))


def test_no_pick_because_priorities_zero():
    buf = exreplay.ExperienceReplay(state_shape=(2,))
    ps = buf.new_pick_selector(1)
    buf.record_many(None, np.zeros((3, 2)), np.zeros(3, np.int64), np.ones(3), terminated=True)
    b = buf.get_batch(8, ps)
    buf.set_priority(ps, b.pick_epi, b.pick_pos, 0.0)
    buf.set_priority(ps, [0, 0, 0], [0, 1, 2], 0.0)
    with pytest.raises(ValueError, match="every priority of selector 0 is zero"):
        buf.get_batch(1, ps)


def test_wrong_out_names_the_shape_it_got():
    buf = exreplay.ExperienceReplay(state_shape=(3,), pick_len=2)
    buf.record_many(None, np.zeros((9, 3)), np.zeros(9, np.int64), np.ones(9), terminated=True)
    ps = buf.new_pick_selector(0)
    b16 = buf.get_batch(16, ps)
    with pytest.raises(ValueError, match=r"out.state .* of shape \(8, 2, 3\), got a float32 array of shape \(16, 2, 3\)"):
        buf.get_batch(8, ps, out=b16)
    parts = list(b16) + [b16.weight]
    parts[0] = np.zeros((16, 3, 2), np.float32).transpose(0, 2, 1)
    bad = exreplay.Batch(parts)
    with pytest.raises(ValueError, match=r"got a float32 array of shape \(16, 2, 3\), not C-contiguous"):
        buf.get_batch(16, ps, out=bad)


def test_for_spaces():
    gym = pytest.importorskip("gymnasium")
    S = gym.spaces
    buf = exreplay.ExperienceReplay.for_spaces(S.Box(0, 255, (84, 84, 4), np.uint8), S.Discrete(6),
                                               capacity=10, pick_len=3)
    assert (buf.state_shape, buf.state_dtype, buf.action_shape, buf.action_dtype) == (
        (84, 84, 4), np.uint8, (), np.int64)
    assert buf.capacity == 10 and buf.pick_len == 3
    buf = exreplay.ExperienceReplay.for_spaces(S.Box(-1, 1, (3,), np.float64), S.MultiDiscrete([3, 4]))
    assert (buf.state_shape, buf.state_dtype, buf.action_shape) == ((3,), np.float64, (2,))
    buf = exreplay.ExperienceReplay.for_spaces(S.Discrete(16), S.Box(-2, 2, (2,)))
    assert (buf.state_shape, buf.state_dtype, buf.action_shape, buf.action_dtype) == (
        (), np.int64, (2,), np.float32)
    env = gym.make("CartPole-v1")
    buf = exreplay.ExperienceReplay.for_spaces(env.observation_space, env.action_space)
    obs, _ = env.reset(seed=0)
    h = buf.record(None, obs, env.action_space.sample(), 1.0)
    assert len(buf) == 1 and h == 0
    for bad, name in ((S.Dict({"a": S.Dict({"b": S.Discrete(2)})}), "observation_space"),
                      (S.Tuple((S.Discrete(2),)), "observation_space")):
        with pytest.raises(ValueError, match=name + ".*not supported"):
            exreplay.ExperienceReplay.for_spaces(bad, S.Discrete(2))
    with pytest.raises(ValueError, match="action_space"):
        exreplay.ExperienceReplay.for_spaces(S.Discrete(2), S.Text(5))
    # the message lists every space it takes, MultiBinary included
    with pytest.raises(ValueError, match="a Box, Discrete, MultiDiscrete or MultiBinary space"):
        exreplay.ExperienceReplay.for_spaces(S.Discrete(2), S.Text(5))
    with pytest.raises(TypeError, match="state_shape"):
        exreplay.ExperienceReplay.for_spaces(S.Discrete(2), S.Discrete(2), state_shape=(3,))


@pytest.mark.parametrize("name", ["record", "record_many", "get_batch", "set_priority",
                                  "new_pick_selector", "serialize", "save", "load", "unserialize",
                                  "episode", "for_spaces"])
def test_docstrings_carry_arguments_returns_errors_and_gil(name):
    doc = getattr(exreplay.ExperienceReplay, name).__doc__
    assert doc and len(doc) > 200, name
    assert "Returns" in doc or "returns" in doc, name
    assert "Raises" in doc or "raises" in doc, name
    assert "GIL" in doc, name


@pytest.mark.parametrize(
    "cls, words",
    [
        (exreplay.Batch, ("pick_len", "weight", "pick_index", "out=", "int64")),
        (exreplay.EpisodeData, ("episode(h)", "final_state", "None")),
        (exreplay.PickSelector, ("handle", "kind", "alpha", "beta", "ValueError", "Rank")),
    ],
)
def test_types_say_what_they_hold(cls, words):
    doc = cls.__doc__
    assert doc and len(doc) > 150, cls
    for w in words:
        assert w in doc, (cls, w)
