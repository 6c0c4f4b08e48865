"""The binding's GIL rule (docs/design.md, "The binding's one idiom"): a small
record or get_batch does its work with the GIL held only while no exreplay
call, on this buffer or any other, is out without the GIL; otherwise it lets
go of the GIL like any other call. `_core._gil_kept()` counts the small calls
that kept it."""
import numpy as np

from exreplay import ExperienceReplay, PickSelectorClass, _core


def small_buffer():
    b = ExperienceReplay((4,), capacity=1000, seed=3)
    ps = b.new_pick_selector(PickSelectorClass.Uniform)
    b.record_many(None, np.ones((20, 4), np.float32), np.zeros(20, np.int64),
                  np.zeros(20, np.float32))
    return b, ps


def small_calls(b, ps):
    """One small get_batch and one small record; returns how many kept the GIL."""
    k = _core._gil_kept()
    batch = b.get_batch(4, ps)
    assert batch.state.shape == (4, 1, 4)
    b.record(None, np.full(4, 2.0, np.float32), 1, 0.5)
    return _core._gil_kept() - k


def big_buffer():
    """Over 64 MiB of payload, so that save() calls its progress callback."""
    b = ExperienceReplay((84, 84), state_dtype="uint8", capacity=None, seed=4)
    zeros = np.zeros((1000, 84, 84), np.uint8)
    for _ in range(10):
        b.record_many(None, zeros, np.zeros(1000, np.int64), np.zeros(1000, np.float32))
    return b


def test_small_calls_keep_the_gil_when_no_call_is_out():
    b, ps = small_buffer()
    assert small_calls(b, ps) == 2


def test_a_call_out_on_another_buffer_makes_small_calls_let_go_of_the_gil(tmp_path):
    """save() runs its progress callback while its own call is out without the
    GIL (it takes the GIL back just for the callback): small calls on a second
    buffer made from the callback must not keep the GIL, since a thread coming
    back from a call on any buffer would wait for it."""
    a, ps = small_buffer()
    big = big_buffer()
    kept = []
    big.save(tmp_path / "big.exr", level=0, progress=lambda d, t: kept.append(small_calls(a, ps)))
    assert kept, "progress was never called"
    assert kept == [0] * len(kept)
    # nothing out any more: the small calls keep the GIL again
    assert small_calls(a, ps) == 2
    assert len(a) == 20 + len(kept) + 1
    a._check()
