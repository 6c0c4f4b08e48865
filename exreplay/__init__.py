"""exreplay: a fast experience replay for reinforcement learning.

Episodes of (state, action, reward) steps go in with ``record``; training
batches of fixed-length picks come out with ``get_batch``, drawn uniformly or
by priority. The buffer is written in C, releases the GIL while it works, and
is safe to share between threads.

    >>> import exreplay
    >>> buf = exreplay.ExperienceReplay(state_shape=(4,), capacity=100_000)
    >>> ps = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)

``exreplay.reference.ReferenceReplay`` is the same API in pure Python: the
executable specification and the benchmark baseline.
"""

import copyreg

from exreplay._core import Batch, EpisodeData, ExperienceLog, ExperienceReplay, PickSelector
from exreplay._types import PickSelectorClass, pickle_batch

# a shared batch pickles its state_seq once (exreplay._types.pickle_batch)
copyreg.pickle(Batch, pickle_batch)

__all__ = [
    "Batch",
    "EpisodeData",
    "ExperienceLog",
    "ExperienceReplay",
    "PickSelector",
    "PickSelectorClass",
]
__version__ = "0.1.0"
