"""Python ints are converted by their value, not through NumPy's float
promotion; every integer argument has one range, named in its ValueError;
no out-of-range float-to-int cast is left (the ASan run builds with
-fsanitize=float-cast-overflow as well)."""

import re

import numpy as np
import pytest

import exreplay
from exreplay import ExperienceReplay, PickSelectorClass
from exreplay.reference import ReferenceReplay

S1 = np.zeros(1, np.float32)
I64 = "[-9223372036854775808, 9223372036854775807]"


def unchanged(buf, exc, match, fn, *args, **kw):
    before = buf.serialize(level=0)
    with pytest.raises(exc, match=match):
        fn(*args, **kw)
    assert buf.serialize(level=0) == before
    buf._check()


def test_uint64_column_takes_python_ints_that_fit():
    b = ExperienceReplay(state_shape=(1,), action_dtype="uint64")
    h = b.record_many(None, np.zeros((3, 1), np.float32), [1, 2**63, 2**64 - 1], [0.0, 0.0, 0.0])
    b.record(h, S1, 2**64 - 1, 0.0)
    assert b.episode(h).action.tolist() == [1, 2**63, 2**64 - 1, 2**64 - 1]
    unchanged(b, ValueError, r"actions: .*uint64, in \[0, 18446744073709551615\], got 18446744073709551616",
              b.record_many, h, np.zeros((2, 1), np.float32), [1, 2**64], [0.0, 0.0])
    unchanged(b, ValueError, r"actions: .*uint64.*got -1", b.record_many, h,
              np.zeros((2, 1), np.float32), [-1, 2**63], [0.0, 0.0])


@pytest.mark.parametrize(
    "call, arg, bad",
    [
        (lambda b: b.record(None, S1, 2**63, 0.0), "action", "9223372036854775808"),
        (lambda b: b.record(None, S1, -(2**63) - 1, 0.0), "action", "-9223372036854775809"),
        (lambda b: b.record_many(None, np.zeros((1, 1), np.float32), [2**64], [0.0]), "actions",
         "18446744073709551616"),
        (lambda b: b.record_many(None, np.zeros((2, 1), np.float32), [1, 2**63], [0.0, 0.0]),
         "actions", "9223372036854775808"),
        (lambda b: b.record_many(None, np.zeros((2, 1), np.float32), [[2**200], [1]], [0.0, 0.0]),
         "actions", None),
    ],
)
def test_int64_column_out_of_range_is_valueerror_with_the_range(call, arg, bad):
    b = ExperienceReplay(state_shape=(1,))
    b.record(None, S1, 5, 0.0)
    before = b.serialize(level=0)
    with pytest.raises(ValueError) as info:
        call(b)
    msg = str(info.value)
    assert msg.startswith(arg + ":"), msg
    if bad is not None:
        assert I64 in msg and msg.endswith("got " + bad), msg
    assert "+" not in msg  # no value read through an out-of-range cast
    assert b.serialize(level=0) == before
    b._check()


def test_small_int_column_by_value():
    b = ExperienceReplay(state_shape=(1,), action_dtype="int8")
    b.record_many(None, np.zeros((2, 1), np.float32), [-128, 127], [0.0, 0.0])
    unchanged(b, ValueError, r"actions: expected values that fit int8, in \[-128, 127\], got 200",
              b.record_many, None, np.zeros((2, 1), np.float32), [1, 200], [0.0, 0.0])
    unchanged(b, ValueError, r"action: .*int8.*got -129", b.record, None, S1, -129, 0.0)


class _ArrayOf:
    """An object that NumPy reads through __array__, as it is."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


_INTS = np.arange(12, dtype=np.int64) * 10
LAID_OUT = {  # integers held other than as a C-contiguous native int64 array
    "strided": _ArrayOf(_INTS[::2]),
    "reversed": _ArrayOf(_INTS[::-2]),
    "buffer, strided": memoryview(_INTS[::2]),
    "byte-swapped": _ArrayOf(_INTS[:6].astype(">i8")),
    "byte-swapped unsigned": _ArrayOf(_INTS[:6].astype(">u8")),
    "Fortran order": _ArrayOf(np.asfortranarray(_INTS[:6].reshape(2, 3))),
    "int16 reversed": _ArrayOf(_INTS[:6].astype(np.int16)[::-1]),
}


@pytest.mark.parametrize("cls", [ExperienceReplay, ReferenceReplay])
@pytest.mark.parametrize("dtype", ["uint8", "int32", "int64", "uint64"])
@pytest.mark.parametrize("how", sorted(LAID_OUT))
def test_ints_judged_by_value_are_read_in_their_order(cls, dtype, how):
    """Integers of no NumPy type of their own (an __array__, a buffer) headed
    for an integer column of another dtype are judged by value: each value
    as the array holds it, whatever its strides or byte order (the values'
    memory was read as contiguous native int64: other values, some from
    outside the array, or a ValueError naming a value never given)."""
    v = LAID_OUT[how]
    want = np.asarray(v)
    b = cls(state_shape=want.shape, state_dtype=dtype, action_shape=want.shape,
            action_dtype=dtype, pick_len=1)
    h = b.record(None, v, v, 0.0)
    h = b.record_many(h, [v, v], [v, v], [0.0, 0.0])
    d = b.episode(h)
    for got in (*d.state, *d.action):
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("cls", [ExperienceReplay, ReferenceReplay])
@pytest.mark.parametrize("how, v, bad", [
    ("NumPy ints in a list", [np.int64(1), np.int64(300)], "300"),
    ("a mixed tuple", (1, np.int64(-1)), "-1"),
    ("__array__", _ArrayOf(np.array([1, 300])), "300"),
    ("a memoryview", memoryview(np.array([-1, 2])), "-1"),
])
def test_ints_of_no_numpy_type_out_of_range_are_valueerror(cls, how, v, bad):
    """Such ints are judged by value in both buffers (the reference cast
    them, wrapping 300 into 44 and -1 into 255, where the C buffer refused)."""
    b = cls(state_shape=(2,), state_dtype="uint8", pick_len=1)
    b.record(None, [1, 2], 0, 0.0)
    with pytest.raises(ValueError) as e:
        b.record(None, v, 0, 0.0)
    assert str(e.value) == f"state: expected values that fit uint8, in [0, 255], got {bad}"
    assert len(b) == 1 and b.episode(0).state.tolist() == [[1, 2]]


def test_floats_into_int_column_stay_typeerror():
    b = ExperienceReplay(state_shape=(1,))
    unchanged(b, TypeError, "actions: expected int64", b.record_many, None,
              np.zeros((2, 1), np.float32), [1, 2.5], [0.0, 0.0])


def test_bool_priorities_refused_everywhere():
    b = ExperienceReplay(state_shape=(1,))
    ps = b.new_pick_selector(PickSelectorClass.Prioritized)
    h = b.record_many(None, np.zeros((3, 1), np.float32), [0, 0, 0], [0.0, 0.0, 0.0])
    unchanged(b, TypeError, "priority: expected a real number, got bool", b.record, h, S1, 0, 0.0,
              priority=True)
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.set_priority, ps,
              [h], [0], True)
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.set_priority, ps,
              [h, h], [0, 1], [True, False])
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.set_priority, ps,
              [h], [0], np.array([True]))
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.record_many, h,
              np.zeros((1, 1), np.float32), [0], [0.0], priorities=[True])
    # a bool among numbers: NumPy would read it as 1.0
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.set_priority, ps,
              [h, h], [0, 1], [2.0, True])
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.set_priority, ps,
              [h, h], [0, 1], (np.False_, 3))
    unchanged(b, TypeError, "priorities: expected real numbers, got bool", b.record_many, h,
              np.zeros((2, 1), np.float32), [0, 0], [0.0, 0.0], priorities=[1.5, True])
    b.set_priority(ps, [h], [0], 1)  # an int is a real number


def test_huge_int_as_a_real_number_is_valueerror():
    b = ExperienceReplay(state_shape=(1,))
    unchanged(b, ValueError, "priority: expected a real number within float's range, got an int",
              b.record, None, S1, 0, 0.0, priority=2**2000)
    unchanged(b, ValueError, "alpha: expected a real number within float's range", b.new_pick_selector,
              PickSelectorClass.Prioritized, alpha=2**2000)
    ps = b.new_pick_selector(PickSelectorClass.Prioritized)
    with pytest.raises(ValueError, match="beta: expected a real number within float's range"):
        ps.beta = 2**2000


def _contents(b, ps):
    e, p = b._picks()
    return (len(b), [b.episode(h).reward.tolist() for h in b._handles()], e.tolist(), p.tolist(),
            b._priority(ps, e, p).tolist())


@pytest.mark.parametrize("cls", [ExperienceReplay, ReferenceReplay])
def test_python_ints_beyond_uint64_into_float_columns_by_value(cls):
    """NumPy holds such ints only as objects (its dtype then "object", a
    TypeError): a float column takes them by value, and one too large for a
    float is a ValueError."""
    b = cls(state_shape=(1,), reward_dtype="float64", seed=0)
    ps = b.new_pick_selector(PickSelectorClass.Prioritized, alpha=1.0)
    h = b.record(None, S1, 0, 2**64)
    h = b.record_many(h, np.zeros((3, 1), np.float32), [0, 0, 0], [-(2**70), 1.5, 2**64 + 1],
                      priorities=[2**64, 1, 0.5])
    assert b.episode(h).reward.tolist() == [2.0**64, -(2.0**70), 1.5, 2.0**64]
    e, p = b._picks()
    assert b.set_priority(ps, e, p, 2**64) == len(e)
    assert b.set_priority(ps, e[:2], p[:2], [2**65, 3]) == 2
    assert b._priority(ps, e[:2], p[:2]).tolist() == [float(np.float32(2.0**65)), 3.0]
    f32 = cls(state_shape=(1,), seed=0)
    f32.record(None, S1, 0, 2**100)
    assert f32.episode(0).reward.tolist() == [float(np.float32(2.0**100))]
    for call, arg in [(lambda: b.record(h, S1, 0, 2**1024), "reward"),
                      (lambda: b.record_many(h, np.zeros((2, 1)), [0, 0], [1.0, -(2**1100)]),
                       "rewards"),
                      (lambda: b.set_priority(ps, e[:1], p[:1], [2**1024]), "priorities"),
                      (lambda: b.set_priority(ps, e, p, 2**1024), "priorities"),
                      (lambda: b.record(h, S1, 0, [2**64, None]), None),
                      (lambda: b.set_priority(ps, e[:2], p[:2], [2**64, 1j]), None)]:
        before = _contents(b, ps)
        # objects that are not real numbers stay a TypeError
        with pytest.raises(ValueError if arg else TypeError) as err:
            call()
        if arg:
            assert str(err.value) == (f"{arg}: expected real numbers within float's range, "
                                      "got an int too large for a float")
        assert _contents(b, ps) == before


@pytest.mark.parametrize("cap", [2**63, 2**64, 2**200])
def test_capacity_beyond_int64_is_valueerror(cap):
    with pytest.raises(ValueError, match=r"capacity: expected an int in \[1, 2\*\*63 - 1\] or None"):
        ExperienceReplay(state_shape=(1,), capacity=cap)


def test_largest_capacity_reads_back_the_same():
    b = ExperienceReplay(state_shape=(1,), capacity=2**63 - 1)
    b.record(None, S1, 0, 0.0)
    assert b.capacity == 2**63 - 1
    assert ExperienceReplay.unserialize(b.serialize()).capacity == 2**63 - 1


@pytest.mark.parametrize(
    "kw, arg",
    [({"pick_len": 2**64}, "pick_len"), ({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"),
     ({"pick_len": 0}, "pick_len")],
)
def test_constructor_int_ranges_named(kw, arg):
    with pytest.raises(ValueError, match=rf"^{arg}: expected .*\[.*, got "):
        ExperienceReplay(state_shape=(1,), **kw)


def test_other_int_arguments_name_their_range():
    b = ExperienceReplay(state_shape=(1,))
    b.record(None, S1, 0, 0.0, terminated=True)
    ps = b.new_pick_selector(PickSelectorClass.Uniform)
    unchanged(b, ValueError, r"level: expected an int from 0 to 9, got 10", b.serialize, 10)
    unchanged(b, ValueError, r"level: expected an int from 0 to 9, got 18446744073709551616",
              b.serialize, 2**64)
    unchanged(b, ValueError, r"batch_size: expected an int in \[1, 2\*\*63 - 1\], got 0",
              b.get_batch, 0, ps)
    unchanged(b, ValueError, r"batch_size: .*got 36893488147419103232", b.get_batch, 2**65, ps)
    unchanged(b, ValueError, r"kind: expected a PickSelectorClass \(0 to 2\), got 3",
              b.new_pick_selector, 3)
    unchanged(b, TypeError, r"level: expected an int from 0 to 9, got bool", b.serialize, True)


def test_huge_beta_gives_sane_weights():
    b = ExperienceReplay(state_shape=(1,), seed=1)
    b.record_many(None, np.zeros((8, 1), np.float32), list(range(8)), [0.0] * 8, terminated=True)
    ps = b.new_pick_selector(PickSelectorClass.Prioritized, alpha=1.0, beta=3.5e38)
    batch = b.get_batch(4, ps)
    b.set_priority(ps, batch.pick_epi, batch.pick_pos, [1.0, 2.0, 3.0, 4.0])
    for beta in (3.4e38, 3.5e38, 1.7e308):
        ps.beta = beta
        w = b.get_batch(16, ps).weight
        assert np.all((w >= 0) & (w <= 1)), w
    b._check()


@pytest.mark.parametrize("cls", [ExperienceReplay, ReferenceReplay])
def test_lists_of_numpy_integers_promoted_to_float_are_taken_by_value(cls):
    """NumPy promotes a list that mixes uint64 and int64 scalars (and Python
    ints) to float64: an integer column still takes them by value, as it
    takes Python ints, and one out of range is the range's ValueError, not a
    float64 TypeError. A NumPy time among them is no integer."""
    b = cls(state_shape=(1,), seed=0)
    ps = b.new_pick_selector(PickSelectorClass.Prioritized)
    h = b.record_many(None, np.zeros((3, 1), np.float32), [np.uint64(5), np.int64(-1), 2],
                      [0.0, 0.0, 0.0])
    assert b.episode(h).action.tolist() == [5, -1, 2]
    b.record_many(None, np.zeros((2, 1), np.float32), [np.uint64(2**63 - 1), np.int8(3)], [0.0, 0.0])
    assert b.episode(h + 1).action.tolist() == [2**63 - 1, 3]
    before = _contents(b, ps)
    with pytest.raises(ValueError, match=r"^actions: expected values that fit int64, in " +
                       re.escape(I64) + r", got 9223372036854775808$"):
        b.record_many(None, np.zeros((3, 1), np.float32), [1, 2, np.uint64(2**63)], [0.0] * 3)
    with pytest.raises(TypeError, match=r"^actions: expected int64"):
        b.record_many(None, np.zeros((3, 1), np.float32),
                      [np.uint64(3), np.int8(-1), np.timedelta64(1)], [0.0] * 3)
    assert _contents(b, ps) == before
    # the pick arrays of set_priority likewise
    assert b.set_priority(ps, [np.uint64(h), np.int64(h)], [np.uint64(0), np.int64(1)], 2.0) == 2
    assert b._priority(ps, [h, h], [0, 1]).tolist() == [float(np.float32(2.0 ** 0.6))] * 2
