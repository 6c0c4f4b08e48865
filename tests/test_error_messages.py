"""Every status of the core becomes one exception type with a specific
message (src/py/errors.c): it names the argument, what was expected and
what came; none is empty."""

import errno
import os

import numpy as np
import pytest

import exreplay
from exreplay import _core

# exr_status (src/core/exr.h): status -> the exception the binding raises
STATUSES = {
    1: MemoryError,  # EXR_ENOMEM
    2: ValueError,  # EXR_EINVAL
    3: ValueError,  # EXR_ENOTFOUND
    4: ValueError,  # EXR_EEMPTY
    5: MemoryError,  # EXR_EOVERFLOW
    6: ValueError,  # EXR_ECORRUPT
    7: OSError,  # EXR_EIO
    8: RuntimeError,  # EXR_EABORTED
}


@pytest.mark.parametrize("status", sorted(STATUSES))
def test_every_status_has_one_type_and_a_specific_message(status):
    with pytest.raises(STATUSES[status]) as e:
        _core._raise_status(status, "record", "h")
    msg = str(e.value)
    assert msg and msg not in ("record", "h", "record: ", "h: ")
    if status != 7:
        # the argument when there is one (the progress abort names the operation)
        assert msg.startswith("record: " if status == 8 else "h: "), msg
    else:
        assert e.value.errno == errno.EIO


def test_the_status_hook_refuses_unknown_statuses():
    with pytest.raises(ValueError, match="status: expected 1 to 8, got 0"):
        _core._raise_status(0, "record")


def _buffer():
    b = exreplay.ExperienceReplay((2,), seed=0)
    ps = b.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    return b, ps


def test_a_huge_batch_is_a_memory_error_that_says_so():
    b, ps = _buffer()
    b.record_many(None, np.zeros((3, 2)), [0, 0, 0], [0.0, 0.0, 0.0], terminated=True)
    with pytest.raises(MemoryError) as e:
        b.get_batch(2**40, ps)
    msg = str(e.value)
    assert "out of memory" in msg or "would not fit in memory" in msg
    assert msg.split(":")[0] in ("get_batch", "batch_size"), msg


def test_unknown_selector_names_ps_and_the_handle():
    b, ps = _buffer()
    b.remove_pick_selector(ps)
    with pytest.raises(ValueError, match=r"^ps: expected a pick selector of this buffer, "
                                         r"got unknown handle 0$"):
        b.get_batch(1, 0)


def test_a_parameter_of_a_removed_selector():
    b = exreplay.ExperienceReplay((2,), seed=0)
    ps = b.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    b.remove_pick_selector(ps)
    with pytest.raises(ValueError, match=r"^ps: expected a pick selector of its buffer, got pick "
                                         r"selector 0, which was removed from it$"):
        ps.beta = 0.5


def test_unknown_episode_names_h():
    b, _ = _buffer()
    with pytest.raises(ValueError, match=r"^h: expected the handle of an episode held, got 7 "
                                         r"\(evicted or never created\)$"):
        b.episode(7)


def test_gather_of_a_missing_pick():
    b, ps = _buffer()
    b.record_many(None, np.zeros((3, 2)), [0, 0, 0], [0.0, 0.0, 0.0], terminated=True)
    with pytest.raises(ValueError, match=r"^pick_epi, pick_pos: expected picks that exist, got "
                                         r"one that does not$"):
        b._gather(ps, [0], [99])


def test_nothing_to_draw_says_why():
    b, ps = _buffer()
    with pytest.raises(ValueError, match=r"^get_batch: no pick can be drawn: the buffer is empty"):
        b.get_batch(1, ps)


@pytest.mark.parametrize("data", [b"", b"EXREPLAY" + bytes(40), bytes(100)])
def test_invalid_serialized_buffer_has_one_spelling(data):
    with pytest.raises(ValueError, match=r"^data: invalid serialized buffer$"):
        exreplay.ExperienceReplay.unserialize(data)


def test_a_damaged_file_has_the_same_spelling(tmp_path):
    b, _ = _buffer()
    p = tmp_path / "b.exr"
    b.save(p)
    raw = bytearray(p.read_bytes())
    raw[-1] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match=r"^path: invalid serialized buffer$"):
        exreplay.ExperienceReplay.load(p)


def test_a_missing_file_is_os_error_with_its_name(tmp_path):
    p = tmp_path / "missing.exr"
    with pytest.raises(FileNotFoundError) as e:
        exreplay.ExperienceReplay.load(p)
    assert str(e.value.filename) == str(p) and e.value.errno == errno.ENOENT


def test_save_into_a_missing_directory(tmp_path):
    b, _ = _buffer()
    with pytest.raises(OSError) as e:
        b.save(tmp_path / "no" / "such" / "dir" / "b.exr")
    assert e.value.errno and str(e.value)


def test_a_progress_callback_that_raises_aborts_with_its_own_exception(tmp_path):
    b = exreplay.ExperienceReplay((1 << 18,), capacity=None, seed=0)
    b.record_many(None, np.zeros((80, 1 << 18), np.float32), np.zeros(80, np.int64),
                  np.zeros(80, np.float32), terminated=True)

    class Stop(Exception):
        pass

    def progress(done, total):
        raise Stop(done)

    with pytest.raises(Stop):
        b.save(tmp_path / "b.exr", level=0, progress=progress)
    assert not (tmp_path / "b.exr").exists()


def test_an_existing_log_path(tmp_path):
    p = tmp_path / "x.xlog"
    exreplay.ExperienceLog(p, state_shape=(2,)).close()
    with pytest.raises(FileExistsError) as e:
        exreplay.ExperienceLog(p, state_shape=(2,))
    assert "path: expected a path that does not exist (or overwrite=True to replace it), " \
           "got one that exists" in str(e.value)
    assert str(e.value.filename) == str(p)


def test_unpickling_garbage_is_the_same_value_error():
    b, _ = _buffer()
    fn, args = b.__reduce_ex__(2)[:2]
    data = bytearray(args[0])
    data[-1] ^= 0xFF
    with pytest.raises(ValueError, match=r"^data: invalid serialized buffer$"):
        fn(bytes(data))


def _filled():
    b, ps = _buffer()
    b.record_many(None, np.zeros((3, 2)), [0, 0, 0], [0.0, 0.0, 0.0], terminated=True)
    return b, ps


# An array where an int is expected: every ndarray has __index__, and NumPy's
# own error for one that cannot answer it names no argument.
ARRAY_AS_INT = [
    (lambda b, ps: exreplay.ExperienceReplay(state_shape=np.array([84, 84])),
     "state_shape: expected an int or a tuple of ints, got numpy.ndarray of dtype int64 and "
     "shape (2,)"),
    (lambda b, ps: exreplay.ExperienceReplay(state_shape=(np.array([2]), 3)),
     "state_shape: expected a tuple of ints, got a numpy.ndarray of dtype int64 and shape (1,) "
     "at index 0"),
    (lambda b, ps: exreplay.ExperienceReplay(state_spec={"a": (np.array([2]), "f4")}),
     "state_spec['a']: expected a shape (an int or a tuple of ints), got numpy.ndarray of dtype "
     "int64 and shape (1,)"),
    (lambda b, ps: exreplay.ExperienceReplay(2, capacity=np.array([5])),
     "capacity: expected an int in [1, 2**63 - 1] or None, got numpy.ndarray of dtype int64 and "
     "shape (1,)"),
    (lambda b, ps: exreplay.ExperienceReplay(2, seed=np.array(5.0)),
     "seed: expected an int in [0, 2**64) or None, got numpy.ndarray of dtype float64 and "
     "shape ()"),
    (lambda b, ps: b.get_batch(np.array([32]), ps),
     "batch_size: expected an int in [1, 2**63 - 1], got numpy.ndarray of dtype int64 and "
     "shape (1,)"),
    (lambda b, ps: b.get_batch(1, np.array([0])),
     "ps: expected a PickSelector or an int handle, got numpy.ndarray of dtype int64 and "
     "shape (1,)"),
    (lambda b, ps: b.episode(np.array([0])),
     "h: expected an int episode handle, got numpy.ndarray of dtype int64 and shape (1,)"),
    (lambda b, ps: b.episode(np.array(True)),
     "h: expected an int episode handle, got numpy.ndarray of dtype bool and shape ()"),
    (lambda b, ps: b.record(np.array([0]), np.zeros(2), 0, 0.0),
     "h: expected an int episode handle or None, got numpy.ndarray of dtype int64 and "
     "shape (1,)"),
]


@pytest.mark.parametrize("call,msg", ARRAY_AS_INT)
def test_an_array_where_an_int_is_expected_names_the_argument(call, msg):
    b, ps = _filled()
    with pytest.raises(TypeError) as e:
        call(b, ps)
    assert str(e.value) == msg


def test_a_0d_integer_array_is_an_int():
    b, ps = _filled()
    assert exreplay.ExperienceReplay(state_shape=np.array(3)).state_shape == (3,)
    assert exreplay.ExperienceReplay(2, seed=np.array(2**64 - 1, np.uint64)).seed == 2**64 - 1
    assert b.get_batch(np.array(2, np.int32), np.array(0)).state.shape == (2, 1, 2)
    assert b.episode(np.array(0, np.uint8)).ended


SEL = "ps: expected a pick selector of this buffer, got unknown handle "
EPI = "h: expected the handle of an episode held, got {} (evicted or never created)"
END = "h: expected the handle of an episode of this buffer, got {}, which no episode has had"
# Handles beyond int64 (which no selector or episode has) and negative ones:
# the message shows the value given.
UNKNOWN_HANDLES = [
    (lambda b, ps: b.get_batch(1, 2**70), SEL + str(2**70)),
    (lambda b, ps: b.get_batch(1, -1), SEL + "-1"),
    (lambda b, ps: b.get_batch(1, -(2**63)), SEL + str(-(2**63))),
    (lambda b, ps: b.priority_stats(-(2**70)), SEL + str(-(2**70))),
    (lambda b, ps: b.remove_pick_selector(np.uint64(2**64 - 1)), SEL + str(2**64 - 1)),
    (lambda b, ps: b.set_priority(2**64, [0], [0], [1.0]), SEL + str(2**64)),
    (lambda b, ps: b.episode(2**70), EPI.format(2**70)),
    (lambda b, ps: b.episode(-(2**70)), EPI.format(-(2**70))),
    (lambda b, ps: b.episode(np.uint64(2**64 - 1)), EPI.format(2**64 - 1)),
    (lambda b, ps: b.episode(-1), EPI.format(-1)),
    (lambda b, ps: b.remove_episode(2**63), EPI.format(2**63)),
    (lambda b, ps: b.end_episode(2**70, terminated=True), END.format(2**70)),
    (lambda b, ps: b.end_episode(-(2**70), terminated=True), END.format(-(2**70))),
    (lambda b, ps: b.end_episode(np.uint64(2**64 - 1), terminated=True), END.format(2**64 - 1)),
]


@pytest.mark.parametrize("call,msg", UNKNOWN_HANDLES)
def test_an_unknown_handle_is_shown_as_given(call, msg):
    b, ps = _filled()
    with pytest.raises(ValueError) as e:
        call(b, ps)
    assert str(e.value) == msg
    assert len(b) == 3 and b.num_episodes == 1


def test_record_into_a_handle_beyond_int64_starts_an_episode():
    b, ps = _filled()
    h = b.record(2**70, np.zeros(2), 0, 0.0)
    assert h == 1 and b.num_episodes == 2


# A dimension is shown as given: one outside Py_ssize_t's range was shown
# clipped to it. The buffer, a named field and the log read shapes alike
# (the log took a non-int dimension as a ValueError).
SHAPES = [
    (lambda: exreplay.ExperienceReplay(state_shape=(-2**70,)), ValueError,
     "state_shape: expected dimensions from 1 to 2**40, got -1180591620717411303424 at index 0"),
    (lambda: exreplay.ExperienceReplay(state_shape=(3, 2**64)), ValueError,
     "state_shape: expected dimensions from 1 to 2**40, got 18446744073709551616 at index 1"),
    (lambda: exreplay.ExperienceReplay(2, action_shape=(2**40 + 1,)), ValueError,
     "action_shape: expected dimensions from 1 to 2**40, got 1099511627777 at index 0"),
    (lambda: exreplay.ExperienceReplay(state_spec={"a": ((0,), "f4")}), ValueError,
     "state_spec['a']: expected dimensions from 1 to 2**40, got 0 at index 0"),
    (lambda: exreplay.ExperienceLog(os.devnull + "/x", state_shape=(-2**70,)), ValueError,
     "state_shape: expected dimensions from 1 to 2**40, got -1180591620717411303424 at index 0"),
    (lambda: exreplay.ExperienceLog(os.devnull + "/x", state_shape=(2, "a")), TypeError,
     "state_shape: expected a tuple of ints, got a str at index 1"),
    (lambda: exreplay.ExperienceLog(os.devnull + "/x", state_shape=(2,), action_shape="a"),
     TypeError, "action_shape: expected an int or a tuple of ints, got str"),
]


@pytest.mark.parametrize("call,exc,msg", SHAPES)
def test_shape_dimensions_shown_as_given(call, exc, msg):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value) == msg


@pytest.mark.parametrize("call,exc,msg", SHAPES[:4])
def test_shape_dimensions_reference_agrees(call, exc, msg, monkeypatch):
    import exreplay.reference as ref

    monkeypatch.setattr(exreplay, "ExperienceReplay", ref.ReferenceReplay)
    with pytest.raises(exc) as e:
        call()
    assert str(e.value) == msg


# What numpy.dtype() refuses is shown by its type (an array's or an object's
# repr told nothing, and an object's showed its address); a string NumPy does
# not know, as given.
DTYPES = [
    (lambda: exreplay.ExperienceReplay(2, state_dtype=[1]),
     "state_dtype: expected a NumPy dtype, got list"),
    (lambda: exreplay.ExperienceReplay(2, action_dtype=np.array([1.0])),
     "action_dtype: expected a NumPy dtype, got numpy.ndarray of dtype float64 and shape (1,)"),
    (lambda: exreplay.ExperienceReplay(2, reward_dtype=None),
     "reward_dtype: expected a NumPy dtype, got NoneType"),
    (lambda: exreplay.ExperienceReplay(2, state_dtype="x8"),
     "state_dtype: expected a NumPy dtype, got 'x8'"),
    (lambda: exreplay.ExperienceReplay(state_spec={"a": (2, 1.5)}),
     "state_spec['a'] dtype: expected a NumPy dtype, got float"),
    (lambda: exreplay.ExperienceLog(os.devnull + "/x", state_shape=(2,), state_dtype=object()),
     "state_dtype: expected a NumPy dtype, got object"),
]


@pytest.mark.parametrize("call,msg", DTYPES)
def test_a_dtype_numpy_refuses_is_shown_by_its_type(call, msg):
    with pytest.raises(TypeError) as e:
        call()
    assert str(e.value) == msg


# A type or dtype name after an article takes the one its sound asks for:
# "an object", "an int16 array", but "a uint8 array", "a list", "a uniform
# selector" (src/py/args.c, exr_article; exreplay._args.article, the same
# rule for the reference and the Python layers).
def _out_with_action(b, ps, action):
    """get_batch(2, ps, out=o), o a batch of b whose action is replaced."""
    o = b.get_batch(2, ps)
    names = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next", "pick_epi",
             "pick_pos", "weight", "pick_index", "extras", "state_seq")
    f = {n: getattr(o, n) for n in names}
    f["action"] = action
    if isinstance(o, exreplay.Batch):
        return b.get_batch(2, ps, out=exreplay.Batch(tuple(f.values())))
    return b.get_batch(2, ps, out=type(o)(*(f[n] for n in names[:8]), weight=f["weight"],
                                          extras=f["extras"], state_seq=f["state_seq"],
                                          pick_index=f["pick_index"]))


ARTICLES = [
    (lambda cls, b, ps: cls(state_shape=(2, object())), TypeError,
     "state_shape: expected a tuple of ints, got an object at index 1"),
    (lambda cls, b, ps: cls(state_shape=(2, ...)), TypeError,
     "state_shape: expected a tuple of ints, got an ellipsis at index 1"),
    (lambda cls, b, ps: cls(state_shape=(2, "a")), TypeError,
     "state_shape: expected a tuple of ints, got a str at index 1"),
    (lambda cls, b, ps: b.record(None, np.zeros(2), 0, 0.0, extras=object()), ValueError,
     "extras: expected None (this buffer has no extras_spec), got an object"),
    (lambda cls, b, ps: _out_with_action(b, ps, np.zeros((2, 1), np.int16)), ValueError,
     "out: expected out.action to be a writeable C-contiguous int64 array of shape (2, 1), got "
     "an int16 array of shape (2, 1)"),
    (lambda cls, b, ps: _out_with_action(b, ps, np.zeros((2, 1), np.uint8)), ValueError,
     "out: expected out.action to be a writeable C-contiguous int64 array of shape (2, 1), got "
     "a uint8 array of shape (2, 1)"),
    (lambda cls, b, ps: b.new_pick_selector(exreplay.PickSelectorClass.Uniform, beta=0.5),
     TypeError, "new_pick_selector(): a uniform selector takes no parameter 'beta'"),
    (lambda cls, b, ps: b.new_pick_selector(exreplay.PickSelectorClass.Rank, alpha=[1]),
     ValueError, "alpha: expected a scalar, got a list"),
]


@pytest.mark.parametrize("impl", ["c", "reference"])
@pytest.mark.parametrize("call,exc,msg", ARTICLES)
def test_the_article_fits_the_name(call, exc, msg, impl):
    from exreplay.reference import ReferenceReplay

    cls = exreplay.ExperienceReplay if impl == "c" else ReferenceReplay
    b = cls((2,), seed=0)
    ps = b.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    b.record_many(None, np.zeros((3, 2)), [0, 0, 0], [0.0, 0.0, 0.0], terminated=True)
    with pytest.raises(exc) as e:
        call(cls, b, ps)
    assert str(e.value) == msg


WORDS = {"int": "an", "ndarray": "an", "object": "an", "int64": "an", "ellipsis": "an",
         "_Opaque": "an", "unknown": "an", "Item": "an", "float": "a", "uint8": "a",
         "uniform": "a", "numpy.ndarray": "a", "list": "a", "NoneType": "a", "<U1": "a",
         "rank": "a", "Name": "a", "": "a"}


@pytest.mark.parametrize("word", sorted(WORDS))
def test_one_article_rule_in_c_and_python(word):
    """exr_article and exreplay._args.article give the same article: the C
    one read from a message naming a class of that name (a class defined
    in Python is named by its bare name)."""
    from exreplay._args import article

    assert article(word) == WORDS[word]
    if not word.isidentifier():
        return
    with pytest.raises(TypeError) as e:
        exreplay.ExperienceReplay(state_shape=(2, type(word, (), {})()))
    want = f"state_shape: expected a tuple of ints, got {WORDS[word]} {word} at index 1"
    assert str(e.value) == want


class _RaisingArray:
    """An array-like whose conversion raises `exc`."""

    def __init__(self, exc):
        self.exc = exc

    def __array__(self, dtype=None, copy=None):
        raise self.exc


class _NotAnArray:
    def __array__(self, dtype=None, copy=None):
        return None


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_an_array_like_whose_conversion_fails_is_quoted_not_called_ragged(impl):
    """A ValueError or TypeError from converting an array-like names the
    argument and quotes what the conversion raised (chained as the cause):
    it was "got a ragged _RaisingArray", the array-like's own words lost.
    Only a list or tuple NumPy refuses is ragged; any other exception passes
    through as it is; the buffer records nothing."""
    from exreplay.reference import ReferenceReplay

    buf = (exreplay.ExperienceReplay if impl == "c" else ReferenceReplay)((2,), seed=0)
    head = "state: expected an array-like of float32, got "
    cases = [
        (_RaisingArray(ValueError("sensor offline")), ValueError,
         "_RaisingArray (converting it raised ValueError: sensor offline)"),
        (_RaisingArray(TypeError("wrong kind")), TypeError,
         "_RaisingArray (converting it raised TypeError: wrong kind)"),
        (_NotAnArray(), ValueError, "_NotAnArray (converting it raised ValueError: "),
        ([[1, 2], [3]], ValueError, "a ragged list"),
        (([1, 2], [3]), ValueError, "a ragged tuple"),
    ]
    for x, kind, tail in cases:
        with pytest.raises(kind) as e:
            buf.record(None, x, 0, 0.0)
        assert str(e.value).startswith(head + tail), str(e.value)
        assert isinstance(e.value.__cause__, (ValueError, TypeError))
    boom = RuntimeError("boom")
    with pytest.raises(RuntimeError) as e:
        buf.record(None, _RaisingArray(boom), 0, 0.0)
    assert e.value is boom
    assert len(buf) == 0


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_stored_priorities_names_the_selector_kind_and_the_missing_pick(impl):
    """stored_priorities (the hook _priority in both implementations) checks
    ps before the pick arrays, as set_priority does; a uniform selector is
    called one, and a missing pick is named with its index (it said "pick 1
    does not exist", the index alone, and "expected a prioritized pick
    selector of this buffer, got handle 0" for a uniform selector)."""
    from exreplay.reference import ReferenceReplay

    b = (exreplay.ExperienceReplay if impl == "c" else ReferenceReplay)((2,), seed=0)
    u, ps = b.new_pick_selector(0), b.new_pick_selector(1)
    h = b.record_many(None, np.zeros((3, 2)), [0] * 3, [0.0] * 3, terminated=True)
    with pytest.raises(ValueError, match=r"^ps: expected a pick selector of this buffer, got unknown handle 99$"):
        b._priority(99, "x", [0])
    with pytest.raises(ValueError, match=r"^ps: expected a prioritized or rank pick selector, got a "
                                         r"uniform one \(handle 0\)$"):
        b._priority(u, [h], [0])
    with pytest.raises(ValueError, match=r"^pick_epi, pick_pos: expected picks that exist, got "
                                         r"\(0, 99\) at index 1, which does not$"):
        b._priority(ps, [h, h], [0, 99])
    if impl == "c":
        with pytest.raises(TypeError, match=r"^stored_priorities\(\) takes 3 arguments \(ps, "
                                            r"pick_epi, pick_pos\), got 1$"):
            b.stored_priorities(ps)
        assert b.stored_priorities(ps, [h], [0]).tolist() == [1.0]


class _Float:
    """A number whose __float__ raises `exc`."""

    def __init__(self, exc):
        self.exc = exc

    def __float__(self):
        raise self.exc


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_a_real_number_whose_float_fails(impl):
    """A TypeError or ValueError from __float__ says the object is no real
    number (the argument's TypeError); any other exception is the caller's
    own and passes through (the C buffer turned it into a TypeError too)."""
    from exreplay.reference import ReferenceReplay

    b = (exreplay.ExperienceReplay if impl == "c" else ReferenceReplay)((2,), seed=0)
    b.new_pick_selector(1)
    for exc in (ValueError("v"), TypeError("t")):
        with pytest.raises(TypeError, match=r"^priority: expected a real number, got _Float$"):
            b.record(None, np.zeros(2), 0, 0.0, priority=_Float(exc))
    boom = RuntimeError("boom")
    with pytest.raises(RuntimeError) as e:
        b.record(None, np.zeros(2), 0, 0.0, priority=_Float(boom))
    assert e.value is boom
    assert len(b) == 0


@pytest.mark.parametrize("impl", ["c", "reference"])
def test_a_batch_too_large_is_a_memory_error_before_any_draw(impl):
    """Both implementations refuse a batch they cannot hold before drawing
    anything, with the same words: the reference drew 2**40 picks in a
    Python loop, growing, where the C buffer refused at once."""
    from exreplay.reference import ReferenceReplay

    b = (exreplay.ExperienceReplay if impl == "c" else ReferenceReplay)((3,), seed=0)
    ps = b.new_pick_selector(0)
    for filled in (False, True):
        if filled:
            b.record_many(None, np.zeros((3, 3)), [0] * 3, [0.0] * 3, terminated=True)
        with pytest.raises(MemoryError, match=r"^get_batch: out of memory \(a batch of "
                                              r"87960930222080 bytes\)$"):
            b.get_batch(2**40, ps)
        with pytest.raises(MemoryError, match=r"^batch_size: a batch of 4611686018427387904 picks "
                                              r"would not fit in memory$"):
            b.get_batch(2**62, ps)
    assert len(b) == 3 and len(b.get_batch(4, ps).pick_epi) == 4
