"""The benchmark floor `_core._floor_gather` (src/core/floor.c): what it
gathers, and that its outputs come from get_batch's recycled blocks (so the
benchmarks time both with the same kind of output memory)."""
import numpy as np
import pytest

from childrun import run_child
from exreplay import _core


def test_floor_gather_values():
    rng = np.random.default_rng(3)
    rows = rng.random((100, 4)).astype(np.float32)
    starts = rng.integers(0, 100 - 8 - 1, 50)
    st, nx = _core._floor_gather(rows, starts, 8)
    assert st.shape == nx.shape == (50, 8, 4) and st.dtype == np.float32
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(st[i], rows[s:s + 8])
        np.testing.assert_array_equal(nx[i], rows[s + 1:s + 9])
    assert st.flags.c_contiguous and nx.flags.c_contiguous and st.flags.writeable
    assert not np.shares_memory(st, nx)


def test_floor_gather_shared_values():
    """shared=True: the floor of get_batch(..., shared_next=True), the L + 1
    rows of each pick as one array."""
    rng = np.random.default_rng(4)
    rows = rng.random((100, 3, 2)).astype(np.float64)
    starts = rng.integers(0, 100 - 8 - 1, 40)
    seq = _core._floor_gather(rows, starts, 8, True)
    assert seq.shape == (40, 9, 3, 2) and seq.dtype == np.float64 and seq.flags.c_contiguous
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(seq[i], rows[s:s + 9])
    assert type(seq.base).__name__ == "_BatchMemory"
    st, nx = _core._floor_gather(rows, starts, 8, False)
    np.testing.assert_array_equal(st, seq[:, :8])


def test_floor_gather_outputs_are_recycled_blocks():
    rows = np.arange(2000 * 4, dtype=np.float32).reshape(2000, 4)
    starts = np.arange(0, 1000, dtype=np.int64)
    st, nx = _core._floor_gather(rows, starts, 8)
    assert type(st.base).__name__ == "_BatchMemory" and st.base is nx.base
    addr = st.__array_interface__["data"][0]
    del st, nx
    st2, nx2 = _core._floor_gather(rows, starts, 8)
    # the block just freed is handed out again: no fresh memory per call
    assert st2.__array_interface__["data"][0] == addr
    np.testing.assert_array_equal(nx2[5], rows[6:14])


@pytest.mark.parametrize("starts, err", [([0, 92], ValueError), ([-1], ValueError),
                                         ([2**63 - 4], ValueError), ([2**63 - 1], ValueError)])
def test_floor_gather_bad_starts(starts, err):
    rows = np.zeros((100, 4), np.float32)
    with pytest.raises(err, match="starts"):
        _core._floor_gather(rows, np.array(starts, np.int64), 8)


def test_floor_gather_refuses_object_rows():
    with pytest.raises(TypeError, match="rows"):
        _core._floor_gather(np.empty((10, 2), object), np.zeros(1, np.int64), 2)


def _records(n, sb, ab, rb, seed=4):
    """n records packed as get_batch's storage keeps them: (n, sb + ab + rb) bytes."""
    return np.random.default_rng(seed).integers(0, 256, (n, sb + ab + rb), dtype=np.uint8)


# (4,) float32 | int64 | float32: the paper's records, the bound's fixed-size
# path; and odd widths, its general one
@pytest.mark.parametrize("sb, ab, rb", [(16, 8, 4), (3, 2, 1), (16, 8, 8)])
def test_floor_gather_batch_values(sb, ab, rb):
    n, L, ep = 400, 8, 64
    rec = _records(n, sb, ab, rb)
    starts = np.random.default_rng(5).integers(0, n - L - 1, 40)
    starts[:2] = [0, n - L - 1]  # the first and the last start that fit
    out = _core._floor_gather_batch(rec, starts, L, ep, sb, ab)
    st, ac, rw, nx, sl, sln, epi, pos, idx, w = out
    assert [a.shape for a in out[:4]] == [(40, L, sb), (40, L, ab), (40, L, rb), (40, L, sb)]
    for i, s in enumerate(starts):
        np.testing.assert_array_equal(st[i], rec[s:s + L, :sb])
        np.testing.assert_array_equal(ac[i], rec[s:s + L, sb:sb + ab])
        np.testing.assert_array_equal(rw[i], rec[s:s + L, sb + ab:])
        np.testing.assert_array_equal(nx[i], rec[s + 1:s + L + 1, :sb])
    np.testing.assert_array_equal(sl, L)
    np.testing.assert_array_equal(sln, L)
    np.testing.assert_array_equal(epi, starts // ep)
    np.testing.assert_array_equal(pos, starts % ep)
    np.testing.assert_array_equal(idx, starts)
    assert w.dtype == np.float32 and (w == 1).all()
    # one recycled block, as get_batch's ten arrays
    assert all(a.base is st.base for a in out) and type(st.base).__name__ == "_BatchMemory"
    assert all(a.__array_interface__["data"][0] % 64 == 0 for a in out)


@pytest.mark.parametrize("args, err, what", [
    (([0, 392],), ValueError, "starts"),
    (([-1],), ValueError, "starts"),
    (([0], 0), ValueError, "L"),
    (([0], 8, 0), ValueError, "ep"),
    (([0], 8, 64, 16, 12), ValueError, "action_bytes"),  # no byte left for the reward
])
def test_floor_gather_batch_bad_args(args, err, what):
    full = list(args) + [8, 64, 16, 8][len(args) - 1:]
    full[0] = np.array(full[0], np.int64)
    with pytest.raises(err, match=what):
        _core._floor_gather_batch(_records(400, 16, 8, 4), *full)


def test_floor_gather_batch_refuses_object_records():
    with pytest.raises(TypeError, match="records"):
        _core._floor_gather_batch(np.empty((10, 2), object), np.zeros(1, np.int64), 2, 5, 1, 1)


def test_crosscore_probe():
    """The machine probe beside the floors (src/core/crosscore.c): a round
    trip of one cache line between two threads, in nanoseconds. Bounds only:
    its value is the machine's (tens of ns between cores of one L3, hundreds
    across, milliseconds when the two threads share a core)."""
    ns = _core._crosscore_ns(0.05)
    assert isinstance(ns, float) and 1 < ns < 1e9


@pytest.mark.parametrize("secs, err, match", [(0, ValueError, r"seconds: expected a number in \(0, 10\], got 0"),
                                              (11.0, ValueError, "got 11.0"),
                                              (float("nan"), ValueError, "got nan"),
                                              ("1", TypeError, "seconds: expected a number, got str")])
def test_crosscore_probe_bad_seconds(secs, err, match):
    with pytest.raises(err, match=match):
        _core._crosscore_ns(secs)


def test_floor_gather_cols_refuses_empty_columns():
    """A column of no rows has no row width (it was a division by zero)."""
    with pytest.raises(TypeError, match="cols"):
        _core._floor_gather_cols([np.zeros((0, 4), np.float32)], np.zeros(1, np.int64), 1, 0)


# Converting starts (an __array__) or L (an __index__) runs Python code,
# which may empty the list of columns or reshape rows in place. The floors
# read those after it and hold the arrays they use without the GIL; they
# read them before (freed columns, or rows measured before a reshape that
# sized the outputs after it: a write past them). A child, as it crashed.
FLOOR_CHILD = r"""
import numpy as np
from exreplay import _core

class Starts:
    def __init__(self, fn):
        self.fn = fn
    def __array__(self, dtype=None, copy=None):
        self.fn()
        return np.array([0, 5, 10, 40], np.int64)

class Index:
    def __init__(self, v, fn):
        self.v, self.fn = v, fn
    def __index__(self):
        self.fn()
        return self.v

def refused(f):
    try:
        f()
    except (TypeError, ValueError) as e:
        return type(e).__name__
    return "ok"

cols = [np.arange(1000.0), np.arange(1000, dtype=np.float32)]
print(refused(lambda: _core._floor_gather_cols(cols, Starts(cols.clear), 4, 1)))
cols = [np.arange(1000.0)] * 8
outs = _core._floor_gather_cols(cols, np.zeros(4, np.int64), 4, 8)
again = [np.arange(1000.0)] * 8
# out= emptied: refused (its arrays are held while the gather writes them)
print(refused(lambda: _core._floor_gather_cols(again, Starts(outs[0].clear), 4, 8, outs)))
rows = np.arange(50 * 40.0).reshape(50, 40)
def flatten():
    rows.shape = (2000, 1)
st, nx = _core._floor_gather(rows, Starts(flatten), 4)
print(st.shape, bool((st[:, :, 0] == rows[[0, 5, 10, 40]][:, 0:1] + np.arange(4)).all()))
rec = np.zeros((50, 40), np.uint8)
def narrow():
    rec.shape = (2000, 1)
print(refused(lambda: _core._floor_gather_batch(rec, np.zeros(4, np.int64), Index(4, narrow),
                                                  5, 16, 8)))
print("done")
"""


def test_floor_gathers_read_their_arguments_after_the_python_code_they_run():
    r = run_child(FLOOR_CHILD, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n") == ["ValueError", "TypeError", "(4, 4, 1) True", "ValueError", "done", ""]
