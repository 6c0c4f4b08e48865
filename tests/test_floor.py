"""The benchmark floor `_core._floor_gather` (src/core/floor.c): what it
gathers, and that its outputs come from get_batch's recycled blocks (so the
benchmarks time both with the same kind of output memory)."""
import numpy as np
import pytest

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


@pytest.mark.parametrize("starts, err", [([0, 92], ValueError), ([-1], ValueError)])
def test_floor_gather_bad_starts(starts, err):
    rows = np.zeros((100, 4), np.float32)
    with pytest.raises(err, match="starts"):
        _core._floor_gather(rows, np.array(starts, np.int64), 8)


def test_floor_gather_refuses_object_rows():
    with pytest.raises(TypeError, match="rows"):
        _core._floor_gather(np.empty((10, 2), object), np.zeros(1, np.int64), 2)
