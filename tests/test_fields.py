"""Named state fields (state_spec) and per-step extras (extras_spec).

The C buffer and the reference are held to the same behaviour here; the
hypothesis machines of test_differential.py compare them step by step with
random field specs.  This file pins the API: shapes and dtypes of what comes
out, zero-copy-friendly output arrays, out= refill, episode(h), errors that
name the argument and leave the buffer unchanged, persistence (format
version 2 and version 1 still read), pickling, threads, gymnasium Dict spaces.
"""

import pickle
import struct
import threading

import numpy as np
import pytest

import exreplay
from childrun import run_child
from exreplay.reference import ReferenceReplay

IMPLS = [exreplay.ExperienceReplay, ReferenceReplay]
SPEC = {"img": ((4, 4), "uint8"), "vec": ((3,), "float32")}
XSPEC = {"logp": ((), "float32"), "h": ((2, 5), "float32"), "mask": ((3,), "bool")}


def make(cls=exreplay.ExperienceReplay, **kw):
    cfg = dict(state_spec=SPEC, extras_spec=XSPEC, pick_len=4, capacity=None, seed=3)
    cfg.update(kw)
    return cls(**cfg)


def rollout(T, t0=0):
    """T steps whose every value encodes its step number t0 + t."""
    t = np.arange(t0, t0 + T)
    states = {
        "img": (t[:, None, None] + np.zeros((1, 4, 4))).astype(np.uint8),
        "vec": (t[:, None] + np.array([0.0, 0.25, 0.5])).astype(np.float32),
    }
    extras = {
        "logp": (-t / 8).astype(np.float32),
        "h": (t[:, None, None] + np.zeros((1, 2, 5))).astype(np.float32),
        "mask": (t[:, None] % np.array([1, 2, 3]) == 0),
    }
    return states, t.astype(np.int64), (t / 2).astype(np.float32), extras


def one(d, i):
    return {k: v[i] for k, v in d.items()}


def assert_same_batch(b, rb):
    """Batch b (C) holds what the reference's batch rb of the same picks holds."""
    for name in ("state", "state_next", "extras"):
        for k in getattr(rb, name):
            np.testing.assert_array_equal(getattr(b, name)[k], getattr(rb, name)[k], err_msg=name + k)
    for name in ("action", "reward", "seq_len", "seq_len_next"):
        np.testing.assert_array_equal(getattr(b, name), getattr(rb, name))


@pytest.mark.parametrize("cls", IMPLS)
def test_batch_holds_every_field_with_the_batch_dimensions(cls):
    buf = make(cls)
    S, A, R, X = rollout(10)
    fin = one(rollout(1, 10)[0], 0)
    h = buf.record_many(None, S, A, R, final_state=fin, extras=X)
    assert buf.state_spec == {k: (s, np.dtype(d)) for k, (s, d) in SPEC.items()}
    assert buf.extras_spec == {k: (s, np.dtype(d)) for k, (s, d) in XSPEC.items()}
    assert buf.state_shape is None and buf.state_dtype is None
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    b = buf.get_batch(16, ps) if cls is exreplay.ExperienceReplay else None
    if b is None:
        b = buf._gather(ps, [h] * 7, list(range(7)))
    B = len(b.pick_pos)
    assert set(b.state) == set(b.state_next) == {"img", "vec"}
    assert set(b.extras) == {"logp", "h", "mask"}
    for name, (shape, dtype) in SPEC.items():
        for d in (b.state, b.state_next):
            a = d[name]
            assert a.shape == (B, 4, *shape) and a.dtype == dtype
            assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
    for name, (shape, dtype) in XSPEC.items():
        a = b.extras[name]
        assert a.shape == (B, 4, *shape) and a.dtype == dtype and a.flags.c_contiguous
    for i, p in enumerate(b.pick_pos):
        L = int(b.seq_len[i])
        steps = np.arange(p, p + L)
        np.testing.assert_array_equal(b.state["img"][i, :L, 0, 0], steps)
        np.testing.assert_array_equal(b.state["vec"][i, :L, 1], steps + 0.25)
        np.testing.assert_array_equal(b.state_next["img"][i, :L, 2, 3], steps + 1)
        np.testing.assert_array_equal(b.extras["logp"][i, :L], -steps / 8)
        np.testing.assert_array_equal(b.extras["h"][i, :L, 1, 4], steps)
        np.testing.assert_array_equal(b.extras["mask"][i, :L, 1], steps % 2 == 0)
        np.testing.assert_array_equal(b.action[i, :L], steps)
    # R2D2: the recurrent state at each pick's first step
    np.testing.assert_array_equal(b.extras["h"][:, 0, 0, 0], b.pick_pos)


def test_named_fields_agree_with_the_reference_pick_by_pick():
    c, r = make(), make(ReferenceReplay)
    rng = np.random.default_rng(0)
    h = hc = None
    t0 = 0
    for k in range(12):
        T = int(rng.integers(1, 7))
        S, A, R, X = rollout(T, t0)
        t0 += T
        end = k % 3 == 2
        kw = dict(final_state=one(rollout(1, 900 + k)[0], 0)) if end and k % 2 else {}
        if end and not kw:
            kw["terminated"] = True
        hc = c.record_many(hc, S, A, R, extras=X, **kw)
        h = r.record_many(h, S, A, R, extras=X, **kw)
        assert hc == h
        hc = c.record(hc, one(S, 0), 1, 0.5, extras=one(X, 0))
        h = r.record(h, one(S, 0), 1, 0.5, extras=one(X, 0))
        assert hc == h
    ps_c = c.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    ps_r = r.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    out = None
    for _ in range(5):
        b = c.get_batch(33, ps_c, out=out)
        assert_same_batch(b, r._gather(ps_r, b.pick_epi, b.pick_pos))
        out = b
    for h in c._handles():
        ec, er = c.episode(h), r.episode(h)
        for k in SPEC:
            np.testing.assert_array_equal(ec.state[k], er.state[k])
        for k in XSPEC:
            np.testing.assert_array_equal(ec.extras[k], er.extras[k])
        assert (ec.final_state is None) == (er.final_state is None)
        if ec.final_state is not None:
            for k in SPEC:
                np.testing.assert_array_equal(ec.final_state[k], er.final_state[k])
    c._check()


def test_out_refills_the_same_arrays():
    buf = make()
    S, A, R, X = rollout(30)
    buf.record_many(None, S, A, R, extras=X)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    b = buf.get_batch(8, ps)
    ids = {k: v.ctypes.data for k, v in {**b.state, **b.extras}.items()}
    b2 = buf.get_batch(8, ps, out=b)
    assert b2 is b
    assert ids == {k: v.ctypes.data for k, v in {**b.state, **b.extras}.items()}
    np.testing.assert_array_equal(b.extras["h"][:, 0, 0, 0], b.pick_pos)
    np.testing.assert_array_equal(b.state["img"][:, 0, 0, 0], b.pick_pos)


@pytest.mark.parametrize("cls", IMPLS)
def test_out_fields_that_share_memory_are_refused(cls):
    """A named field's array given twice (or over a plain field's memory)
    would have get_batch write one over the other."""
    buf = make(cls)
    S, A, R, X = rollout(30)
    buf.record_many(None, S, A, R, extras=X)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    b = buf.get_batch(4, ps)
    cases = [
        ("state_next", "vec", b.state["vec"], "out.state['vec'] and out.state_next['vec']"),
        ("extras", "logp", b.reward, "out.reward and out.extras['logp']"),
        ("state", "img", b.state_next["img"], "out.state['img'] and out.state_next['img']"),
    ]
    for part, key, shared, both in cases:
        d = getattr(b, part)
        own, d[key] = d[key], shared
        snap = {k: v.copy() for k, v in {**b.state, **b.extras}.items()}
        with pytest.raises(ValueError) as e:
            buf.get_batch(4, ps, out=b)
        assert str(e.value) == f"out: expected arrays that share no memory, got {both} sharing memory"
        for k, v in {**b.state, **b.extras}.items():
            np.testing.assert_array_equal(v, snap[k])
        d[key] = own
    assert buf.get_batch(4, ps, out=b) is b


def test_torch_takes_the_fields_without_a_copy():
    torch = pytest.importorskip("torch")
    buf = make()
    S, A, R, X = rollout(30)
    buf.record_many(None, S, A, R, extras=X)
    b = buf.get_batch(4, buf.new_pick_selector(exreplay.PickSelectorClass.Uniform))
    for a in (*b.state.values(), *b.extras.values()):
        t = torch.as_tensor(a)
        assert t.data_ptr() == a.ctypes.data


def test_extras_with_one_state_array_and_fields_without_extras():
    a = exreplay.ExperienceReplay(state_shape=(2,), extras_spec={"logp": ((), "float64")}, pick_len=2)
    h = a.record_many(None, np.ones((5, 2)), np.arange(5), np.zeros(5), extras={"logp": np.arange(5.0)})
    b = a._gather(a.new_pick_selector(0), [h, h], [0, 2])
    assert b.state.shape == (2, 2, 2) and b.extras["logp"].tolist() == [[0, 1], [2, 3]]
    np.testing.assert_array_equal(a.episode(h).extras["logp"], np.arange(5.0))
    f = exreplay.ExperienceReplay(state_spec={"o": ((2,), "int16")}, pick_len=1)
    h = f.record(None, {"o": [1, 2]}, 0, 0.0, final_state={"o": [3, 4]})
    b = f._gather(f.new_pick_selector(0), [h], [0])
    assert b.extras == {} and b.state["o"].tolist() == [[[1, 2]]] and b.state_next["o"].tolist() == [[[3, 4]]]
    assert f.episode(h).extras == {}
    # a plain buffer's batches and episodes have empty extras
    p = exreplay.ExperienceReplay(state_shape=2)
    h = p.record(None, [1, 2], 0, 0.0, terminated=True)
    assert p._gather(p.new_pick_selector(0), [h], [0]).extras == {}
    assert p.episode(h).extras == {} and "extras" not in repr(p.episode(h))


# --------------------------------------------------------------------------
# errors: named, precise, and the buffer unchanged
# --------------------------------------------------------------------------


def _state_of(buf):
    return bytes(buf.serialize(0)[40:]) if isinstance(buf, exreplay.ExperienceReplay) else (
        len(buf), buf._handles(), [len(buf.episode(h).action) for h in buf._handles()])


BAD_CALLS = [
    # (what, call, exception, message fragment)
    ("state not a dict", lambda b, S, X: b.record(None, S["img"][0], 0, 0.0, extras=one(X, 0)),
     TypeError, "state: expected a dict of arrays with the fields 'img', 'vec', got"),
    ("missing field", lambda b, S, X: b.record(None, {"img": S["img"][0]}, 0, 0.0, extras=one(X, 0)),
     ValueError, "state: expected the fields 'img', 'vec', got no 'vec'"),
    ("unknown field", lambda b, S, X: b.record(None, {**one(S, 0), "rgb": 1}, 0, 0.0, extras=one(X, 0)),
     ValueError, "state: expected the fields 'img', 'vec', got an unknown field 'rgb'"),
    ("wrong shape", lambda b, S, X: b.record(None, {**one(S, 0), "vec": np.zeros(4)}, 0, 0.0, extras=one(X, 0)),
     ValueError, "state['vec']: expected shape (3,), got (4,)"),
    ("wrong dtype", lambda b, S, X: b.record(None, {**one(S, 0), "img": np.zeros((4, 4))}, 0, 0.0, extras=one(X, 0)),
     TypeError, "state['img']: expected"),
    ("extras missing", lambda b, S, X: b.record(None, one(S, 0), 0, 0.0),
     ValueError, "extras: expected a dict of arrays with the fields 'logp', 'h', 'mask', got None"),
    ("extras field missing", lambda b, S, X: b.record(None, one(S, 0), 0, 0.0, extras={"logp": 0.0, "h": np.zeros((2, 5))}),
     ValueError, "extras: expected the fields 'logp', 'h', 'mask', got no 'mask'"),
    ("extras shape", lambda b, S, X: b.record(None, one(S, 0), 0, 0.0, extras={**one(X, 0), "h": np.zeros(10)}),
     ValueError, "extras['h']: expected shape (2, 5), got (10,)"),
    ("final_state field", lambda b, S, X: b.record(None, one(S, 0), 0, 0.0, final_state={"img": S["img"][0]}, extras=one(X, 0)),
     ValueError, "final_state: expected the fields 'img', 'vec', got no 'vec'"),
    ("many: field length", lambda b, S, X: b.record_many(None, {**S, "vec": S["vec"][:2]}, np.arange(3), np.zeros(3), extras=X),
     ValueError, "states['vec']: expected shape"),
    ("many: extras length", lambda b, S, X: b.record_many(None, S, np.arange(3), np.zeros(3), extras={**X, "logp": X["logp"][:1]}),
     ValueError, "extras['logp']: expected shape"),
    ("many: actions length", lambda b, S, X: b.record_many(None, S, np.arange(2), np.zeros(3), extras=X),
     ValueError, "actions: expected shape"),
]


@pytest.mark.parametrize("cls", IMPLS)
@pytest.mark.parametrize("what, call, exc, msg", BAD_CALLS, ids=[c[0] for c in BAD_CALLS])
def test_bad_fields_raise_and_change_nothing(cls, what, call, exc, msg):
    buf = make(cls)
    S, A, R, X = rollout(3)
    buf.record_many(None, S, A, R, extras=X)
    before = _state_of(buf)
    with pytest.raises(exc) as e:
        call(buf, S, X)
    if cls is exreplay.ExperienceReplay or "expected shape (" in msg or "got None" in msg:
        assert msg in str(e.value), str(e.value)
    assert _state_of(buf) == before


@pytest.mark.parametrize("cls", IMPLS)
def test_extras_given_to_a_buffer_without_an_extras_spec(cls):
    buf = cls(state_shape=(2,), seed=0)
    buf.record(None, [1, 2], 0, 0.0)
    before = _state_of(buf)
    for call in (lambda: buf.record(None, [1, 2], 0, 0.0, extras={"logp": 1.0}),
                 lambda: buf.record_many(None, [[1, 2]], [0], [0.0], extras={"logp": [1.0]})):
        with pytest.raises(ValueError, match=r"extras: expected None \(this buffer has no extras_spec\), got"):
            call()
    assert _state_of(buf) == before
    buf.record(None, [1, 2], 0, 0.0, extras=None)  # None is no extras


@pytest.mark.parametrize("cls", IMPLS)
@pytest.mark.parametrize("kw, exc, msg", [
    (dict(state_spec=SPEC, state_shape=(2,)), TypeError, "state_spec: expected either state_spec or state_shape/state_dtype, got both"),
    (dict(state_spec=SPEC, state_dtype="uint8"), TypeError, "got both"),
    (dict(), TypeError, "state_shape: expected an int or a tuple of ints (or a state_spec), got None"),
    (dict(state_shape={"img": (84, 84)}), TypeError, "named fields go in state_spec={name: (shape, dtype)}"),
    (dict(state_spec=[("img", (2,), "uint8")]), TypeError, "state_spec: expected a dict {name: (shape, dtype)}, got list"),
    (dict(state_spec={}), ValueError, "state_spec: expected 1 to 32 fields, got 0"),
    (dict(state_spec={"a": (2,)}), TypeError, "state_spec['a']: expected a pair (shape, dtype), got (2,)"),
    (dict(state_spec={"a": ((0,), "f4")}), ValueError, "state_spec['a']"),
    (dict(state_spec={"a": ((2,), "U4")}), TypeError, "state_spec['a'] dtype"),
    (dict(state_spec={1: ((2,), "f4")}), TypeError, "state_spec: expected str field names, got 1"),
    (dict(state_spec={"": ((2,), "f4")}), ValueError, "state_spec: expected field names of 1 to 64 bytes"),
    (dict(state_spec={"\udc80": ((2,), "f4")}), ValueError,
     "state_spec: expected field names that UTF-8 can encode, got '\\udc80'"),
    (dict(state_shape=2, extras_spec={"h": ((2, "x"), "f4")}), TypeError, "extras_spec['h']"),
])
def test_bad_specs(cls, kw, exc, msg):
    with pytest.raises(exc) as e:
        cls(**kw)
    assert msg in str(e.value), str(e.value)


def test_bad_out_dicts():
    buf = make()
    S, A, R, X = rollout(20)
    buf.record_many(None, S, A, R, extras=X)
    ps = buf.new_pick_selector(0)
    b = buf.get_batch(4, ps)
    good = b.state["vec"].copy()
    b.state["vec"] = np.zeros((4, 4, 2), np.float32)
    with pytest.raises(ValueError, match=r"out: expected out.state\['vec'\] to be a writeable C-contiguous float32 array of shape \(4, 4, 3\)"):
        buf.get_batch(4, ps, out=b)
    b.state["vec"] = good
    del b.extras["mask"]
    with pytest.raises(ValueError, match="out: expected out.extras to hold the fields 'logp', 'h', 'mask'"):
        buf.get_batch(4, ps, out=b)
    plain = exreplay.ExperienceReplay(state_shape=(2,))
    plain.record_many(None, np.ones((3, 2)), [0, 0, 0], [0, 0, 0])
    pb = plain.get_batch(4, plain.new_pick_selector(0))
    with pytest.raises(TypeError, match="out: expected out.state to be a dict"):
        buf.get_batch(4, ps, out=pb)


@pytest.mark.parametrize("cls", IMPLS)
def test_a_field_there_when_checked_and_gone_when_read(cls):
    """A Mapping that has a field when asked whether it has it and not when
    its value is read: a ValueError naming the field, nothing recorded (the
    C buffer returned an error without an exception: a SystemError)."""
    import collections.abc

    class Fickle(collections.abc.Mapping):
        def __init__(self):
            self.asked = 0

        def __getitem__(self, k):
            if k == "vec":
                self.asked += 1
                if self.asked > 1:
                    raise KeyError(k)
                return np.zeros(3, np.float32)
            if k == "img":
                return np.zeros((4, 4), np.uint8)
            raise KeyError(k)

        def __iter__(self):
            return iter(["img", "vec"])

        def __len__(self):
            return 2

    buf = make(cls)
    S, A, R, X = rollout(3)
    buf.record_many(None, S, A, R, extras=X)
    before = _state_of(buf)
    with pytest.raises(ValueError) as e:
        buf.record(None, Fickle(), 0, 0.0, extras=one(X, 0))
    assert str(e.value) == "state: expected the fields 'img', 'vec', got no 'vec'"
    assert _state_of(buf) == before


@pytest.mark.parametrize("cls", IMPLS)
def test_a_dict_subclass_is_read_through_its_own_getitem(cls):
    """A dict subclass's __getitem__ gives the values, as it does to the
    reference (the C buffer read the dict's stored values, here callables:
    a TypeError); a defaultdict without a field is refused as missing it,
    and gets no value put into it."""
    import collections

    class Lazy(dict):
        def __getitem__(self, k):
            return dict.__getitem__(self, k)()

    buf = make(cls)
    S, A, R, X = rollout(3)
    h = buf.record_many(None, S, A, R, extras=X)
    state = Lazy({k: (lambda v=v: v[2]) for k, v in S.items()})
    extras = Lazy({k: (lambda v=v: v[2]) for k, v in X.items()})
    h = buf.record(h, state, 2, 1.0, extras=extras, final_state=state)
    d = buf.episode(h)
    for k, v in S.items():
        np.testing.assert_array_equal(d.state[k][3], v[2])
        np.testing.assert_array_equal(d.final_state[k], v[2])
    for k, v in X.items():
        np.testing.assert_array_equal(d.extras[k][3], v[2])
    before = _state_of(buf)
    partial = collections.defaultdict(lambda: np.zeros(3, np.float32), img=S["img"][0])
    with pytest.raises(ValueError) as e:
        buf.record(None, partial, 0, 0.0, extras=one(X, 0))
    assert str(e.value) == "state: expected the fields 'img', 'vec', got no 'vec'"
    assert list(partial) == ["img"] and _state_of(buf) == before


_A_NAME_WHOSE_HASH_CHANGES = """
import numpy as np, exreplay

class Name(str):
    calls = 0
    changing = False

    def __hash__(self):
        Name.calls += 1
        return str.__hash__(self) + (Name.calls if Name.changing else 0)

buf = exreplay.ExperienceReplay(state_spec={Name("vec"): ((2,), "float32")},
                                extras_spec={Name("h"): ((), "float32")}, pick_len=1, seed=0)
buf.record_many(None, {"vec": np.ones((3, 2), np.float32)}, [0, 1, 2], [0.0, 0.0, 0.0],
                extras={"h": np.ones(3, np.float32)})
ps = buf.new_pick_selector(0)
Name.changing = True
b = buf.get_batch(2, ps)
assert [type(k) for k in (*buf.state_spec, *buf.extras_spec)] == [str, str]
assert buf.get_batch(2, ps, out=b) is b
assert (b.state["vec"] == 1).all() and (b.extras["h"] == 1).all()
assert list(buf.episode(0).state) == ["vec"]
print("ok")
"""


def test_a_field_name_of_a_str_subclass_is_held_as_a_str():
    """A spec's name of a str subclass whose hash changes from call to call:
    the buffer holds the name as a str of its own (the batch's dicts were
    keyed by the subclass, and get_batch looked up a field it did not find
    there and used it as an array: a crash)."""
    r = run_child(_A_NAME_WHOSE_HASH_CHANGES, timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr[-2000:])


_OUT_DICT_CHANGED_BY_A_KEY = """
import numpy as np, exreplay
buf = exreplay.ExperienceReplay(state_spec={"img": ((2,), "uint8"), "vec": ((3,), "float32")},
                                pick_len=2, seed=0)
buf.record_many(None, {"img": np.ones((6, 2), np.uint8), "vec": np.ones((6, 3), np.float32)},
                np.arange(6), np.zeros(6))
ps = buf.new_pick_selector(0)
b = buf.get_batch(4, ps)
d = b.state
img = d["img"]

class Key:  # equal to "vec"; comparing it replaces the checked "img" array
    def __hash__(self):
        return hash("vec")

    def __eq__(self, other):
        if other == "vec" and d.get("img") is img:
            d["img"] = "not an array"
        return other == "vec"

d[Key()] = d.pop("vec")
img[...] = 0
assert buf.get_batch(4, ps, out=b) is b
assert (img == 1).all() and d["img"] == "not an array"
print("ok")
"""


def test_an_out_dict_changed_while_it_is_checked():
    """A key of out.state whose __eq__ (run by the check's lookups) puts
    something else into the dict: the call refills the arrays it checked
    (it read the dict again after the check, and took a str as an array)."""
    r = run_child(_OUT_DICT_CHANGED_BY_A_KEY, timeout=120)
    assert r.returncode == 0 and r.stdout == "ok\n", (r.returncode, r.stderr[-2000:])


# --------------------------------------------------------------------------
# persistence, pickling, threads, spaces
# --------------------------------------------------------------------------


def _same(a, b):
    assert len(a) == len(b) and a._handles() == b._handles()
    assert a.state_spec == b.state_spec and a.extras_spec == b.extras_spec
    for h in a._handles():
        ea, eb = a.episode(h), b.episode(h)
        for part in ("state", "extras"):
            x, y = getattr(ea, part), getattr(eb, part)
            if isinstance(x, dict):
                assert list(x) == list(y)
                for k in x:
                    np.testing.assert_array_equal(x[k], y[k])
            else:
                np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(ea.action, eb.action)
        assert (ea.final_state is None) == (eb.final_state is None)


@pytest.mark.parametrize("kw", [
    dict(),
    dict(extras_spec=None),
    dict(state_spec=None, state_shape=(3,), state_dtype="float64"),
])
@pytest.mark.parametrize("level", [0, 6])
def test_serialize_pickle_save_load_roundtrip(tmp_path, kw, level):
    buf = make(**kw)
    S, A, R, X = rollout(12)
    if buf.state_spec is None:
        S = np.arange(36.0).reshape(12, 3)
    ex = dict(extras=X) if buf.extras_spec else {}
    h = buf.record_many(None, S, A, R, terminated=True, **ex)
    buf.record_many(None, S, A, R, **ex)
    data = buf.serialize(level)
    version = struct.unpack_from("<I", data, 8)[0]
    assert version == (2 if buf.extras_spec else 1)
    for other in (exreplay.ExperienceReplay.unserialize(data), pickle.loads(pickle.dumps(buf))):
        _same(buf, other)
    buf.save(str(tmp_path / "b.exr"), level)
    loaded = exreplay.ExperienceReplay.load(str(tmp_path / "b.exr"))
    _same(buf, loaded)
    # the restored buffer records and samples as the original
    ps = loaded.new_pick_selector(0)
    loaded.record_many(h, S, A, R, **ex)
    loaded.get_batch(5, ps)
    loaded._check()


def test_truncated_and_patched_version_2_is_refused():
    buf = make()
    S, A, R, X = rollout(6)
    buf.record_many(None, S, A, R, extras=X, terminated=True)
    data = bytearray(buf.serialize(0))
    for cut in (41, 100, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError):
            exreplay.ExperienceReplay.unserialize(bytes(data[:cut]))
    # version 1 with extra_bytes set: refused (the header CRC is fixed up, so
    # it is the version rule that refuses it)
    import zlib
    v1 = bytearray(data)
    struct.pack_into("<I", v1, 8, 1)
    struct.pack_into("<I", v1, 36, zlib.crc32(bytes(v1[:36])))
    with pytest.raises(ValueError):
        exreplay.ExperienceReplay.unserialize(bytes(v1))


@pytest.mark.parametrize("cls", IMPLS)
def test_reference_and_c_pickle_fields(cls):
    buf = make(cls)
    S, A, R, X = rollout(5)
    buf.record_many(None, S, A, R, extras=X)
    other = pickle.loads(pickle.dumps(buf))
    _same(buf, other)


def test_threads_record_fields_while_others_sample():
    buf = make(capacity=400)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    errors = []

    def writer(k):
        try:
            h = None
            for i in range(60):
                S, A, R, X = rollout(int(3 + (i + k) % 40), 1000 * k)  # some copy without the lock
                h = buf.record_many(h, S, A, R, extras=X, terminated=i % 5 == 4)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def reader():
        try:
            out = None
            for _ in range(150):
                if buf.num_picks:
                    out = buf.get_batch(16, ps, out=out)
                    L = out.seq_len
                    # every field of a pick comes from the same steps
                    for i in range(16):
                        n = int(L[i])
                        np.testing.assert_array_equal(
                            out.state["img"][i, :n, 0, 0].astype(np.int64) % 256,
                            (out.extras["h"][i, :n, 0, 0].astype(np.int64)) % 256)
                        np.testing.assert_array_equal(out.action[i, :n], out.extras["h"][i, :n, 1, 4])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(3)]
    ts += [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    buf._check()


def test_for_spaces_with_a_dict_observation_space():
    gym = pytest.importorskip("gymnasium")
    S = gym.spaces
    obs = S.Dict({"img": S.Box(0, 255, (4, 4), np.uint8), "vec": S.Box(-1, 1, (3,)), "k": S.Discrete(5)})
    buf = exreplay.ExperienceReplay.for_spaces(obs, S.Discrete(2), pick_len=2, extras_spec={"logp": ((), "float32")})
    assert list(buf.state_spec) == list(obs.spaces)
    assert buf.state_spec["k"] == ((), np.int64) and buf.state_spec["img"] == ((4, 4), np.uint8)
    o = obs.sample()
    h = buf.record(None, o, 1, 0.0, extras={"logp": -0.5})
    buf.record(h, obs.sample(), 0, 1.0, final_state=obs.sample(), extras={"logp": -0.1})
    b = buf.get_batch(3, buf.new_pick_selector(0))
    assert b.state["img"].shape == (3, 2, 4, 4) and b.extras["logp"].shape == (3, 2)
    with pytest.raises(TypeError, match="state_spec"):
        exreplay.ExperienceReplay.for_spaces(obs, S.Discrete(2), state_spec={"a": ((1,), "f4")})


def _steps_of(buf):
    """{handle: EpisodeData} of every episode buf holds."""
    return {h: buf.episode(h) for h in buf._handles()}


def test_the_log_of_a_buffer_with_fields_holds_every_field(tmp_path):
    """Every step, its named state fields, final state and extras, comes back
    from the log (docs/log.md), also steps evicted since; from_log rebuilds
    the buffer; tail, info and merge keep the fields."""
    import exreplay.log as xlog

    path = tmp_path / "f.xlog"
    log = exreplay.ExperienceLog(path, level=1)
    buf = make(capacity=20, log=log)
    hs, n = [], 0
    for e in range(4):
        S, A, R, X = rollout(7 + e, t0=n)
        fin = one(S, 0) if e % 2 else None
        hs.append(buf.record_many(None, S, A, R, extras=X, final_state=fin, terminated=e == 0))
        n += 7 + e
    log.close()
    with open(path, "rb") as f:
        assert f.read(12)[8:12] == struct.pack("<I", 2)  # rows with extras: version 2
    with xlog.open(path) as r:
        chunks = list(r)
    states = {k: np.concatenate([c.states[k] for c in chunks]) for k in SPEC}
    extras = {k: np.concatenate([c.extras[k] for c in chunks]) for k in XSPEC}
    S, A, R, X = rollout(n)
    for k in SPEC:
        np.testing.assert_array_equal(states[k], S[k])
    for k in XSPEC:
        np.testing.assert_array_equal(extras[k], X[k])
        assert extras[k].dtype == np.dtype(XSPEC[k][1])
    fins = [c.final_states for c in chunks if len(c.final_states["vec"])]
    assert sum(len(f["vec"]) for f in fins) == 2
    assert n > len(buf)  # some steps were evicted from the buffer, none from the log
    again = exreplay.ExperienceReplay.from_log(path, capacity=20, pick_len=4)
    for (h1, e1), (h2, e2) in zip(_steps_of(buf).items(), _steps_of(again).items()):
        for k in SPEC:
            np.testing.assert_array_equal(e1.state[k], e2.state[k])
        for k in XSPEC:
            np.testing.assert_array_equal(e1.extras[k], e2.extras[k])
        np.testing.assert_array_equal(e1.action, e2.action)
    t = xlog.tail(path, n=3)
    np.testing.assert_array_equal(t.extras["h"], X["h"][-3:])
    np.testing.assert_array_equal(t.states["img"], S["img"][-3:])
    d = xlog.info(path)
    assert d["records"] == n and set(d["state_spec"]) == set(SPEC) and set(d["extras_spec"]) == set(XSPEC)
    xlog.merge([path], tmp_path / "m.xlog")
    np.testing.assert_array_equal(xlog.tail(tmp_path / "m.xlog", n=2).extras["mask"], X["mask"][-2:])


def test_named_state_fields_without_extras_log_as_version_1(tmp_path):
    import exreplay.log as xlog

    path = tmp_path / "s.xlog"
    log = exreplay.ExperienceLog(path)
    buf = make(extras_spec=None, log=log)
    S, A, R, _ = rollout(5)
    buf.record_many(None, S, A, R)
    log.close()
    with open(path, "rb") as f:
        assert f.read(12)[8:12] == struct.pack("<I", 1)
    c = xlog.tail(path, n=5)
    assert c.extras is None
    np.testing.assert_array_equal(c.states["vec"], S["vec"])


def test_a_log_takes_only_the_field_layout_it_was_made_with(tmp_path):
    log = exreplay.ExperienceLog(tmp_path / "a.xlog")
    buf = make(log=log)
    buf.detach_log()
    other = make(extras_spec={"logp": ((), "float64")})
    with pytest.raises(ValueError, match=r"^log: expected a log of this buffer's record layout \(state_spec "
                                         r"\{.*extras_spec \{'logp': \(\(\), dtype\('float64'\)\)\}\), got one of "
                                         r"state_spec \{"):
        other.attach_log(log)
    assert other.log is None
    # its steps come from the buffer: the extras have no argument
    with pytest.raises(ValueError, match="append: expected a log without per-step extras"):
        log.append(0, 0, np.zeros(SPEC_BYTES, np.uint8), 0, 0.0)
    with pytest.raises(ValueError, match="append_many: expected a log without per-step extras"):
        log.append_many(0, 0, np.zeros((2, SPEC_BYTES), np.uint8), [0, 0], [0.0, 0.0])
    log.close()
    plain = exreplay.ExperienceLog(tmp_path / "b.xlog", state_shape=(SPEC_BYTES,), state_dtype="uint8")
    with pytest.raises(ValueError, match=r"log: expected a log of this buffer's record layout \(state_spec "
                                         r"\{.*\), got one of state uint8 \(\d+,\), action"):
        make(extras_spec=None).attach_log(plain)
    plain.close()


SPEC_BYTES = 4 * 4 + 3 * 4


def test_repr_shows_the_specs():
    b = make()
    r = repr(b)
    assert r.startswith("ExperienceReplay(state_spec={'img': ((4, 4), dtype('uint8')), ")
    assert "extras_spec={'logp': ((), dtype('float32'))" in r and "0 records" in r
    x = exreplay.ExperienceReplay(state_shape=(2,), extras_spec={"h": ((3,), "float32")})
    assert repr(x).startswith("ExperienceReplay(state_shape=(2,), state_dtype=float32, extras_spec=")
    S, A, R, X = rollout(5)
    b.record_many(None, S, A, R, extras=X)
    g = b._gather(b.new_pick_selector(0), [0], [0])
    assert "state={'img': uint8(1, 4, 4, 4), 'vec': float32(1, 4, 3)}" in repr(g)
    assert "extras={'logp': float32(1, 4), 'h': float32(1, 4, 2, 5), 'mask': bool(1, 4, 3)}" in repr(g)


def test_ingesting_a_log_of_another_layout_is_refused(tmp_path):
    """A log of one state array into a buffer with fields: the layouts differ."""
    path = str(tmp_path / "l.xlog")
    src = exreplay.ExperienceReplay(state_shape=(2,))
    log = exreplay.ExperienceLog(path)
    src.attach_log(log)
    src.record_many(None, np.zeros((3, 2), np.float32), [0, 0, 0], [0, 0, 0], terminated=True)
    src.detach_log()
    log.close()
    buf = make()
    with pytest.raises(ValueError, match="record layout differs from the buffer's"):
        buf.ingest(path)
    assert len(buf) == 0


@pytest.fixture
def streamed():
    """Every batch written with non-temporal stores (the path of batches
    over 16 MiB), whatever its size."""
    old = exreplay._core._set_stream_min(1)
    yield
    exreplay._core._set_stream_min(old)


@pytest.mark.parametrize("pick_len", [1, 5])
def test_streamed_batches_agree_with_the_reference(streamed, pick_len):
    """Fields of 1 KiB and more (the streamed copies: odd widths, so that
    rows start at every offset within a cache line), short episodes padded,
    final states, truncations: the batch is byte for byte the reference's."""
    spec = {"img": ((33, 47), "uint8"), "vec": ((3,), "float32")}
    xspec = {"h": ((2, 300), "float32"), "logp": ((), "float32")}
    c, r = (cls(state_spec=spec, extras_spec=xspec, pick_len=pick_len, capacity=None, seed=5)
            for cls in IMPLS)
    rng = np.random.default_rng(1)

    def fields(T, sp):
        return {k: rng.standard_normal((T, *s)).astype(d) if d == "float32"
                else rng.integers(0, 256, (T, *s)).astype(d) for k, (s, d) in sp.items()}

    for k in range(9):
        T = int(rng.integers(1, 9))
        S, X = fields(T, spec), fields(T, xspec)
        A, R = rng.integers(0, 5, T), rng.standard_normal(T).astype(np.float32)
        kw = [{}, {"terminated": True}, {"final_state": one(fields(1, spec), 0)}][k % 3]
        assert c.record_many(None, S, A, R, extras=X, **kw) == r.record_many(None, S, A, R, extras=X, **kw)
    ps_c = c.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    ps_r = r.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    for _ in range(4):
        b = c.get_batch(40, ps_c)
        assert_same_batch(b, r._gather(ps_r, b.pick_epi, b.pick_pos))
    c._check()


@pytest.mark.parametrize("pick_len", [1, 6])
def test_streamed_batches_of_one_state_array_agree_with_the_reference(streamed, pick_len):
    """A buffer without fields takes the streamed path too when its batch
    is large: the same bytes as the reference's, padding and final states
    included."""
    c, r = (cls((29, 53), state_dtype="uint8", pick_len=pick_len, capacity=None, seed=2) for cls in IMPLS)
    rng = np.random.default_rng(3)
    for k in range(9):
        T = int(rng.integers(1, 10))
        S = rng.integers(0, 256, (T, 29, 53)).astype(np.uint8)
        A, R = rng.integers(0, 5, T), rng.standard_normal(T).astype(np.float32)
        kw = [{}, {"terminated": True}, {"final_state": rng.integers(0, 256, (29, 53)).astype(np.uint8)}][k % 3]
        assert c.record_many(None, S, A, R, **kw) == r.record_many(None, S, A, R, **kw)
    ps_c = c.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    ps_r = r.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    for _ in range(4):
        b = c.get_batch(40, ps_c)
        rb = r._gather(ps_r, b.pick_epi, b.pick_pos)
        for name in ("state", "state_next", "action", "reward", "seq_len", "seq_len_next"):
            np.testing.assert_array_equal(getattr(b, name), getattr(rb, name), err_msg=name)
    c._check()


def test_a_mapping_whose_items_are_not_pairs():
    """A Mapping's own items() may give anything: each must be a (name,
    value) tuple (a list there was read as a tuple, out of its bounds)."""
    import collections.abc

    class ListItems(collections.abc.Mapping):
        def __getitem__(self, k):
            return ((2,), "f4")

        def __iter__(self):
            return iter(["a"])

        def __len__(self):
            return 1

        def items(self):
            return [["a", ((2,), "f4")]]

    with pytest.raises(TypeError, match=r"state_spec: expected items\(\) to give \(name, value\) "
                                        r"pairs, got \['a'"):
        exreplay.ExperienceReplay(state_spec=ListItems())


@pytest.mark.parametrize("cls", IMPLS)
@pytest.mark.parametrize("arg", ["state_spec", "extras_spec"])
def test_a_mapping_that_gives_a_name_twice(cls, arg):
    """A Mapping's own items() may give one name twice: refused (the buffer
    would otherwise hold two fields of one name, and fail to pickle)."""
    import collections.abc

    class Twice(collections.abc.Mapping):
        def __getitem__(self, k):
            return ((2,), "f4")

        def __iter__(self):
            return iter(["a", "b"])

        def __len__(self):
            return 3

        def items(self):
            return [("a", ((2,), "f4")), ("b", ((), "u1")), ("a", ((3,), "f8"))]

    kw = {arg: Twice()}
    if arg == "extras_spec":
        kw["state_shape"] = 2
    with pytest.raises(ValueError) as e:
        cls(**kw)
    assert str(e.value) == f"{arg}: expected unique field names, got 'a' twice"
