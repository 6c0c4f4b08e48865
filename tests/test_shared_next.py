"""get_batch(..., shared_next=True): one (B, pick_len + 1) state array.

The batch's ``state_seq`` holds each pick's states and, after its last step,
the next state (the next record's, else the episode's final state, else
zeros), and ``state`` / ``state_next`` are its views ``[:, :pick_len]`` and
``[:, 1:]`` (per field with a state_spec).  Everything else is as in the
default layout, and so are the picks drawn: each test compares a buffer with
a twin recorded the same way with the same seed that draws default batches.

Every test that takes ``make_buffer`` runs on the reference and on the C
buffer (tests/conftest.py); ``test_c_agrees_with_pure_python``
compares the two on the same picks (their generators differ, so the
reference builds the C buffer's picks with ``_gather``).
"""

import pickle
import re

import numpy as np
import pytest

import exreplay
from exreplay.reference import Batch as ReferenceBatch
from exreplay.reference import PickSelectorClass, ReferenceReplay
from test_differential import assert_same_arrays

Uniform = PickSelectorClass.Uniform
Prioritized = PickSelectorClass.Prioritized

FIELDS = ReferenceBatch._fields  # the 8 fields a Batch unpacks as
SPEC = {"img": ((8, 8), "uint8"), "vec": ((3,), "float32")}
XSPEC = {"logp": ((), "float32"), "h": ((2,), "float32")}
CONFIGS = {
    "atari": dict(state_shape=(84, 84), state_dtype=np.uint8),
    "vec4": dict(state_shape=(4,), state_dtype=np.float32),
    "f64-extras": dict(state_shape=(3,), state_dtype=np.float64, extras_spec={"logp": ((), "f4")}),
    "named": dict(state_spec=SPEC, extras_spec=XSPEC),
}
# (length, how it ends): every way a pick's next state can come, with short
# picks at the end of every ended episode (allow_short=True) and full ones
EPISODES = [
    (11, "final"), (3, "terminated"), (9, "terminated"), (5, "terminated+final"),
    (2, "final"), (12, "open"), (7, "terminated"), (6, "final"), (1, "terminated"),
    (1, "final"), (10, "open"),
]
SENTINEL = 7


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def state_of(cfg, code):
    """A state all of whose values encode code (1 to 255): never zero."""
    if "state_spec" in cfg:
        return {"img": np.full((8, 8), code, np.uint8),
                "vec": (code + np.array([0.0, 0.25, 0.5])).astype(np.float32)}
    shape, dtype = cfg["state_shape"], np.dtype(cfg["state_dtype"])
    s = np.full(shape, code, dtype)
    if dtype.kind == "f":
        s += (np.arange(s.size).reshape(shape) / 8).astype(dtype)
    return s


def stack(items):
    if isinstance(items[0], dict):
        return {k: np.stack([x[k] for x in items]) for k in items[0]}
    return np.stack(items)


def build(cls, config="vec4", pick_len=8, kind=Uniform, seed=5):
    """A buffer of EPISODES (every record's values encode a number of its
    own, final states too) and its selector, priorities set unevenly."""
    cfg = CONFIGS[config]
    buf = cls(pick_len=pick_len, allow_short=True, capacity=None, seed=seed, **cfg)
    ps = buf.new_pick_selector(kind)
    code = 1
    for e, (n, end) in enumerate(EPISODES):
        codes = np.arange(code, code + n)
        code += n
        kw = {}
        if "final" in end:
            kw["final_state"] = state_of(cfg, 200 + e)
        if "terminated" in end:
            kw["terminated"] = True
        if "extras_spec" in cfg:
            kw["extras"] = {k: np.stack([np.full(shape, c / 4, dtype) for c in codes])
                            for k, (shape, dtype) in cfg["extras_spec"].items()}
        buf.record_many(None, stack([state_of(cfg, c) for c in codes]), codes, codes / 2, **kw)
    if kind != Uniform:
        epi, pos = buf._picks()
        buf.set_priority(ps, epi, pos, 1.0 + (7 * epi + 3 * pos) % 11)
    return buf, ps


def items(x):
    """(key, array) of an array (key None) or of a dict of named fields."""
    return sorted(x.items()) if isinstance(x, dict) else [(None, x)]


def at(x, key):
    return x if key is None else x[key]


def expected_seq_from_episodes(buf, b):
    """state_seq as the spec defines it, from buf.episode(h) of each pick."""
    want = {k: np.zeros_like(a) for k, a in items(b.state_seq)}
    cases = set()
    for i, (h, p, n) in enumerate(zip(b.pick_epi.tolist(), b.pick_pos.tolist(),
                                      b.seq_len.tolist())):
        ep = buf.episode(h)
        T = len(ep.action)
        for k, w in want.items():
            w[i, :n] = at(ep.state, k)[p:p + n]
            if p + n < T:
                w[i, n] = at(ep.state, k)[p + n]
            elif ep.final_state is not None:
                w[i, n] = at(ep.final_state, k)
        cases.add("next" if p + n < T else "final" if ep.final_state is not None else "zeros")
    return (want[None] if None in want else want), cases


def seq_of_default(d):
    """state_seq from a default batch d of the same picks, by the spec's rule."""
    out = {}
    for k, s in items(d.state):
        nxt = at(d.state_next, k)
        B, P = s.shape[:2]
        seq = np.zeros((B, P + 1, *s.shape[2:]), s.dtype)
        seq[:, :P] = s
        for i, n in enumerate(d.seq_len.tolist()):
            seq[i, n] = nxt[i, n - 1]
        out[k] = seq
    return out[None] if None in out else out


def assert_like_default(b, d, where):
    """Shared batch b and default batch d drew the same picks: every field but
    state is d's, state is d's but at t = seq_len < pick_len, state_seq the
    spec's."""
    assert d.state_seq is None and b.state_seq is not None, where
    for name in FIELDS:
        if name != "state":
            assert_same_arrays(getattr(b, name), getattr(d, name), name, where)
    assert_same_arrays(b.extras, d.extras, "extras", where)
    assert_same_arrays(b.weight, d.weight, "weight", where)
    assert_same_arrays(b.pick_index, d.pick_index, "pick_index", where)  # both implementations
    assert_same_arrays(b.state_seq, seq_of_default(d), "state_seq", where)
    P = b.action.shape[1]
    short = (b.seq_len < P).nonzero()[0]
    for k, s in items(b.state):
        ds = at(d.state, k)
        mask = np.ones(s.shape[:2], bool)
        mask[short, b.seq_len[short]] = False
        np.testing.assert_array_equal(s[mask], ds[mask], err_msg=f"{where}: state {k}")
        # there, the default layout has zeros and the shared one the next state
        np.testing.assert_array_equal(s[~mask], at(d.state_next, k)[short, b.seq_len[short] - 1])
        assert not ds[~mask].any(), where


def all_arrays(b):
    """(name, array) of every array of a Batch, state_seq's fields included."""
    out = []
    for name in FIELDS + ("weight", "pick_index", "state_seq", "extras"):
        x = getattr(b, name, None)
        if x is not None:
            out += [(f"{name}[{k!r}]" if k else name, a) for k, a in items(x)]
    return out


def fill_sentinel(b):
    """Fill b's arrays with SENTINEL (get_batch would write other values);
    returns copies of them (some arrays may be views of others)."""
    for _, a in all_arrays(b):
        if a.flags.writeable:
            a[...] = SENTINEL
    return [(name, a.copy()) for name, a in all_arrays(b)]


def assert_unwritten(b, before, where):
    for (name, a), (_, was) in zip(all_arrays(b), before):
        assert np.array_equal(a, was), f"{where}: out.{name} was written"


def rebuild(b, **swap):
    """A Batch of b's class with b's arrays, those named in swap replaced."""
    fields = tuple(swap.get(n, getattr(b, n)) for n in FIELDS)
    named = {n: swap.get(n, getattr(b, n, None))
             for n in ("weight", "extras", "state_seq", "pick_index")}
    if isinstance(b, ReferenceBatch):
        return ReferenceBatch(*fields, **named)
    return type(b)(fields, named)  # a struct sequence: named-only fields by name


def views(seq, cut):
    return {k: a[cut] for k, a in seq.items()} if isinstance(seq, dict) else seq[cut]


def plain_state(msg, name):
    """msg names out.<name> itself (not out.state_seq when name is state)."""
    return re.search(rf"out\.{name}(?![_a-z])", msg) is not None


# --------------------------------------------------------------------------
# values
# --------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["atari", "vec4", "named"])
@pytest.mark.parametrize("kind", [Uniform, Prioritized])
@pytest.mark.parametrize("pick_len", [1, 8])
def test_values_are_the_default_layouts(make_buffer, config, kind, pick_len):
    buf, ps = build(make_buffer, config, pick_len, kind)
    twin, tps = build(make_buffer, config, pick_len, kind)
    cases, lens = set(), set()
    # shared, default, shared draws against three default ones: the draw
    # does not depend on the layout, nor does the generator's state after it
    for k, shared in enumerate((True, False, True)):
        b = buf.get_batch(96, ps, shared_next=shared)
        d = twin.get_batch(96, tps)
        where = f"draw {k}"
        if not shared:
            for name in FIELDS:
                assert_same_arrays(getattr(b, name), getattr(d, name), name, where)
            assert b.state_seq is None
            continue
        assert_like_default(b, d, where)
        want, c = expected_seq_from_episodes(buf, b)
        assert_same_arrays(b.state_seq, want, "state_seq", where)
        cases |= c
        lens |= set(b.seq_len.tolist())
    assert cases == {"next", "final", "zeros"}
    if pick_len == 8:
        assert 8 in lens and len(lens) > 3, lens  # full picks and short ones


@pytest.mark.parametrize("config", ["atari", "f64-extras", "named"])
def test_c_agrees_with_pure_python(config):
    c, cps = build(exreplay.ExperienceReplay, config, 8, Prioritized)
    r, rps = build(ReferenceReplay, config, 8, Prioritized)
    b = c.get_batch(64, cps, shared_next=True)
    d = r._gather(rps, b.pick_epi, b.pick_pos)  # the reference's default batch
    for name in FIELDS[1:]:
        assert_same_arrays(getattr(b, name), getattr(d, name), name, "C vs reference")
    assert_same_arrays(b.extras, d.extras, "extras", "C vs reference")
    np.testing.assert_allclose(b.weight, d.weight, rtol=1e-6)
    assert_same_arrays(b.state_seq, seq_of_default(d), "state_seq", "C vs reference")
    assert_same_arrays(b.state_seq, expected_seq_from_episodes(r, b)[0], "state_seq", "episodes")


# --------------------------------------------------------------------------
# layout
# --------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["atari", "vec4", "f64-extras", "named"])
@pytest.mark.parametrize("pick_len", [1, 8])
def test_state_and_state_next_are_views_of_state_seq(make_buffer, config, pick_len):
    buf, ps = build(make_buffer, config, pick_len)
    B, P = 6, pick_len
    b = buf.get_batch(B, ps, shared_next=True)
    d = buf.get_batch(B, ps)
    assert d.state_seq is None
    if "state_spec" in CONFIGS[config]:
        assert isinstance(b.state_seq, dict) and isinstance(b.state, dict)
        assert list(b.state_seq) == list(b.state) == list(b.state_next) == list(SPEC)
        shapes = {k: (s, np.dtype(t)) for k, (s, t) in SPEC.items()}
    else:
        assert isinstance(b.state_seq, np.ndarray)
        cfg = CONFIGS[config]
        shapes = {None: (cfg["state_shape"], np.dtype(cfg["state_dtype"]))}
    for k, (shape, dtype) in shapes.items():
        seq, s, n = at(b.state_seq, k), at(b.state, k), at(b.state_next, k)
        assert seq.shape == (B, P + 1, *shape) and seq.dtype == dtype
        assert seq.flags.c_contiguous and seq.flags.writeable and seq.flags.aligned
        assert s.shape == n.shape == at(d.state, k).shape == (B, P, *shape)
        assert s.dtype == n.dtype == dtype
        assert s.strides == n.strides == seq.strides
        assert s.ctypes.data == seq.ctypes.data
        assert n.ctypes.data == seq.ctypes.data + seq.strides[1]
        assert not s.flags.c_contiguous and not n.flags.c_contiguous  # B > 1
        assert np.shares_memory(s, seq) and np.shares_memory(n, seq)
        # with pick_len 1, state and state_next are the rows 0 and 1: apart
        assert np.shares_memory(s, n) == (P > 1)
        # written through one, read through the others
        seq[1, 1] = 3
        assert (n[1, 0] == 3).all()
        if P > 1:
            assert (s[1, 1] == 3).all()
    assert b.action.flags.c_contiguous and b.reward.flags.c_contiguous
    for name in ("seq_len", "seq_len_next", "pick_epi", "pick_pos"):
        assert getattr(b, name).dtype == np.int64
    assert b.weight.dtype == np.float32
    r = repr(b)
    assert "state_seq=" in r and r.index("state_seq=") > r.index("weight=")
    assert r.index("state_seq=") > r.find("pick_index=")  # the C batch's last field before
    assert "state_seq" not in repr(d)


@pytest.mark.parametrize("config", ["vec4", "named"])
def test_pickling_keeps_state_seq(make_buffer, config):
    buf, ps = build(make_buffer, config, 8)
    b = buf.get_batch(16, ps, shared_next=True)
    c = pickle.loads(pickle.dumps(b))
    assert type(c) is type(b)
    assert_same_arrays(c.state_seq, b.state_seq, "state_seq", config)
    for name in FIELDS:
        assert_same_arrays(getattr(c, name), getattr(b, name), name, config)
    assert_same_arrays(c.extras, b.extras, "extras", config)
    assert_same_arrays(c.weight, b.weight, "weight", config)
    assert pickle.loads(pickle.dumps(buf.get_batch(4, ps))).state_seq is None


@pytest.mark.parametrize("config", ["vec4", "named"])
def test_pickled_once_and_views_again(make_buffer, config):
    """A shared batch pickles its states once: state and state_next come back
    as the views of state_seq, so the pickle is smaller than a default
    batch's, and the batch refills as out= with shared_next=True."""
    buf, ps = build(make_buffer, config, 8)
    b = buf.get_batch(64, ps, shared_next=True)
    data = pickle.dumps(b)
    c = pickle.loads(data)
    for key, seq in items(c.state_seq):
        st, nx = at(c.state, key), at(c.state_next, key)
        assert np.shares_memory(st, seq) and np.shares_memory(nx, seq)
        assert st.strides == seq.strides and nx.strides == seq.strides
        np.testing.assert_array_equal(st, at(b.state, key))
        np.testing.assert_array_equal(nx, at(b.state_next, key))
    # states of 9 rows a pick where the default pickles 16
    assert len(data) < 0.85 * len(pickle.dumps(buf.get_batch(64, ps)))
    assert buf.get_batch(64, ps, out=c, shared_next=True) is c


# --------------------------------------------------------------------------
# out=
# --------------------------------------------------------------------------


@pytest.mark.parametrize("config", ["vec4", "named"])
def test_out_is_refilled_in_place(make_buffer, config):
    buf, ps = build(make_buffer, config, 8)
    twin, tps = build(make_buffer, config, 8)
    b = buf.get_batch(32, ps, shared_next=True)
    twin.get_batch(32, tps)
    before = {name: a for name, a in all_arrays(b)}
    old = {name: a.copy() for name, a in before.items()}
    r = buf.get_batch(32, ps, out=b, shared_next=True)
    assert r is b
    for name, a in all_arrays(b):
        assert a is before[name], name  # the same array objects
    assert not np.array_equal(old["pick_pos"], b.pick_pos)  # new picks, new states
    assert any(not np.array_equal(old[n], a) for n, a in all_arrays(b) if "state_seq" in n)
    assert_like_default(b, twin.get_batch(32, tps), "refill")
    # the views are still the views
    for k, seq in items(b.state_seq):
        assert at(b.state, k).ctypes.data == seq.ctypes.data
        assert at(b.state_next, k).ctypes.data == seq.ctypes.data + seq.strides[1]


def _refusals(donor, ps, B):
    """(what, out, shared_next, exception, check(message)) for every out= the
    spec refuses, made of batches drawn from donor."""
    named = isinstance(donor.state_spec, dict)
    fresh = lambda: donor.get_batch(B, ps, shared_next=True)  # noqa: E731
    P = donor.pick_len

    def with_seq(make):
        """A shared batch whose state_seq is make(state_seq) (of each field),
        its state and state_next the views [:, :P] and [:, 1:P + 1] of it."""
        b = fresh()
        seq = {k: make(a) for k, a in b.state_seq.items()} if named else make(b.state_seq)
        return rebuild(b, state_seq=seq, state=views(seq, np.s_[:, :P]),
                       state_next=views(seq, np.s_[:, 1:P + 1]))

    def with_view(name, make):
        """A shared batch whose out.<name> (each field's) is make(b, key)."""
        b = fresh()
        if named:
            return rebuild(b, **{name: {k: make(b, k) for k in SPEC}})
        return rebuild(b, **{name: make(b, None)})

    def read_only(a):
        a = np.full_like(a, SENTINEL)
        a.flags.writeable = False
        return a

    def over_reward():
        """state_seq and reward in one float32 array, overlapping by one value."""
        b = fresh()
        big = np.zeros(B * (P + 1) * 4 + B * P, np.float32)
        seq = big[:B * (P + 1) * 4].reshape(B, P + 1, 4)
        return rebuild(b, state_seq=seq, state=seq[:, :P], state_next=seq[:, 1:],
                       reward=big[-B * P - 1:-1].reshape(B, P))

    # with named fields, the first field ('img', uint8 (8, 8)) is the one named
    seq_dtype, seq_shape = ("uint8", (B, P + 1, 8, 8)) if named else ("float32", (B, P + 1, 4))

    def names_seq(m):
        return "out.state_seq" in m and (not named or "'img'" in m)

    def view_of(name):
        return lambda m: plain_state(m, name) and "view of out.state_seq" in m

    as_int = {1: np.int8, 4: np.int32, 8: np.int64}
    refusals = [
        # with named fields a state_seq that is not a dict is a TypeError, as
        # any out field of fields that is not a dict
        ("a default batch with shared_next", donor.get_batch(B, ps), True,
         TypeError if named else ValueError, lambda m: "out.state_seq" in m),
        ("a shared batch without shared_next", fresh(), False, ValueError,
         lambda m: "state_seq set" in m and "pass shared_next=True" in m),
        ("state_seq one step too long",
         with_seq(lambda a: np.zeros((B, P + 2, *a.shape[2:]), a.dtype)), True, ValueError,
         lambda m: names_seq(m) and str(seq_shape) in m),
        ("state_seq of another batch size",
         with_seq(lambda a: np.zeros((B + 1, *a.shape[1:]), a.dtype)), True, ValueError,
         lambda m: names_seq(m) and str(seq_shape) in m),
        ("state_seq of another dtype", with_seq(lambda a: a.astype(np.float64)), True,
         ValueError, lambda m: names_seq(m) and seq_dtype in m and "float64" in m),
        ("state_seq not C-contiguous", with_seq(lambda a: np.repeat(a, 2, axis=0)[::2]), True,
         ValueError, lambda m: names_seq(m) and "C-contiguous" in m),
        ("state_seq read-only", with_seq(read_only), True, ValueError,
         lambda m: names_seq(m) and "writeable" in m),
        ("state a copy of its view", with_view("state", lambda b, k: at(b.state, k).copy()),
         True, ValueError, view_of("state")),
        ("state_next a copy of its view",
         with_view("state_next", lambda b, k: at(b.state_next, k).copy()), True, ValueError,
         view_of("state_next")),
        ("state the view state_next is", with_view("state", lambda b, k: at(b.state_next, k)),
         True, ValueError, view_of("state")),
        ("state_next the view state is", with_view("state_next", lambda b, k: at(b.state, k)),
         True, ValueError, view_of("state_next")),
        ("state its view as another dtype", with_view(
            "state", lambda b, k: at(b.state, k).view(as_int[at(b.state, k).itemsize])),
         True, ValueError, view_of("state")),
        ("a tuple", tuple(fresh()), True, TypeError, lambda m: m.startswith("out: ")),
        ("an array", fresh().state_seq, True, TypeError, lambda m: m.startswith("out: ")),
        ("an int", 5, True, TypeError, lambda m: m.startswith("out: ")),
    ]
    if not named:
        refusals.append(("state_seq over reward's memory", over_reward(), True, ValueError,
                         lambda m: "out.state_seq" in m and "out.reward" in m))
    return refusals


@pytest.mark.parametrize("config", ["vec4", "named"])
def test_out_refusals(make_buffer, config):
    buf, ps = build(make_buffer, config, 8)
    twin, tps = build(make_buffer, config, 8)
    donor, dps = build(make_buffer, config, 8)
    B = 8
    for what, out, shared, exc, check in _refusals(donor, dps, B):
        batch = isinstance(out, (exreplay.Batch, ReferenceBatch))
        before = fill_sentinel(out) if batch else None
        with pytest.raises(exc) as e:
            buf.get_batch(B, ps, out=out, shared_next=shared)
        assert check(str(e.value)), f"{what}: {e.value}"
        if batch:
            assert_unwritten(out, before, what)
    # and nothing drawn: buf's first batch is the twin's
    assert_like_default(buf.get_batch(B, ps, shared_next=True), twin.get_batch(B, tps), "after")


# --------------------------------------------------------------------------
# arguments
# --------------------------------------------------------------------------


@pytest.mark.parametrize("value", [True, False, 1, 0, 2, np.bool_(True), np.bool_(False),
                                   "yes", "", 1.5, 0.0, None, b"x", [True], np.array(True),
                                   np.int64(1), object()])
def test_shared_next_is_parsed_as_terminated_is(make_buffer, value):
    """shared_next takes what record's terminated takes (a bool, a NumPy bool,
    an int or a NumPy integer), with the same message for anything else."""
    buf, ps = build(make_buffer, "vec4", 2)
    try:
        buf.record(None, np.zeros(4, np.float32), 0, 0.0, terminated=value)
        want = None
    except TypeError as e:
        want = str(e).replace("terminated", "shared_next")
    if want is None:
        b = buf.get_batch(4, ps, shared_next=value)
        assert (b.state_seq is not None) == bool(value)
    else:
        with pytest.raises(TypeError) as e:
            buf.get_batch(4, ps, shared_next=value)
        assert str(e.value) == want
        assert want.startswith("shared_next: expected a bool or an int, got ")
    if isinstance(value, (str, float)) or value is None:
        assert want is not None and type(value).__name__ in want


@pytest.mark.parametrize("value", [np.int64(1), np.int8(0), np.uint64(7), np.intc(-1)])
def test_flags_take_numpy_integers_as_ints(make_buffer, value):
    """Every flag of the buffer (allow_short, record's and end_episode's
    terminated, get_batch's shared_next) takes a NumPy integer scalar as it
    takes a Python int: by its truth value. A 0-d integer array stays a
    TypeError, as any array does."""
    want = bool(value)
    buf = make_buffer((4,), pick_len=3, allow_short=value, seed=0)
    assert buf.allow_short is want
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    h = buf.record(None, np.zeros(4, np.float32), 0, 0.0)
    h = buf.record(h, np.ones(4, np.float32), 0, 0.0, final_state=np.ones(4, np.float32),
                   terminated=value)
    assert buf.episode(h).terminated is want
    h2 = buf.record_many(None, np.zeros((3, 4), np.float32), [0] * 3, [0.0] * 3)
    buf.end_episode(h2, final_state=np.zeros(4, np.float32), terminated=value)
    assert buf.episode(h2).terminated is want
    b = buf.get_batch(4, ps, shared_next=value)
    assert (b.state_seq is not None) is want
    for bad in (np.array(1), np.array([1])):
        with pytest.raises(TypeError, match="^terminated: expected a bool or an int, got numpy.ndarray$"):
            buf.record(None, np.zeros(4, np.float32), 0, 0.0, terminated=bad)
    assert len(buf) == 5


def test_shared_next_is_keyword_only(make_buffer):
    buf, ps = build(make_buffer, "vec4", 2)
    twin, tps = build(make_buffer, "vec4", 2)
    with pytest.raises(TypeError, match="positional"):
        buf.get_batch(4, ps, None, True)
    with pytest.raises(TypeError, match="positional"):
        buf.get_batch(4, ps, None, False)
    # the refused calls drew nothing
    assert_like_default(buf.get_batch(4, ps, shared_next=True), twin.get_batch(4, tps), "after")


@pytest.mark.parametrize("config", ["vec4", "named"])
def test_set_priority_takes_a_shared_batch(make_buffer, config):
    buf, ps = build(make_buffer, config, 8, Prioritized)
    twin, tps = build(make_buffer, config, 8, Prioritized)
    b = buf.get_batch(32, ps, shared_next=True)
    d = twin.get_batch(32, tps)
    p = np.linspace(0.5, 9.0, 32)
    n = buf.set_priority(ps, b, p)
    assert n == twin.set_priority(tps, d, p) == 32
    np.testing.assert_array_equal(buf._priority(ps, b.pick_epi, b.pick_pos),
                                  twin._priority(tps, d.pick_epi, d.pick_pos))
    # the same priorities: the same next picks and weights
    assert_like_default(buf.get_batch(32, ps, shared_next=True), twin.get_batch(32, tps), "after")
