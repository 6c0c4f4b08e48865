"""Small public types shared by the C buffer and the pure-Python reference,
and how a batch with shared next states is pickled."""

import enum

__all__ = ["PickSelectorClass"]


class PickSelectorClass(enum.IntEnum):
    """The kinds of pick selector (the paper's ``PickSelectorClass``).

    The values are the numbers ``new_pick_selector`` takes; ``docs/api.md``
    lists what each kind draws and which parameters it has.
    """

    Uniform = 0
    Prioritized = 1
    Rank = 2


def seq_views(seq):
    """(state, state_next) of a shared batch: the views [:, :-1] and [:, 1:]
    of its state_seq, or dicts of them for named state fields."""
    if isinstance(seq, dict):
        views = {k: seq_views(a) for k, a in seq.items()}
        return {k: v[0] for k, v in views.items()}, {k: v[1] for k, v in views.items()}
    return seq[:, :-1], seq[:, 1:]


def _shared_batch(cls, rest, named):
    """A Batch of get_batch(..., shared_next=True) back from pickle_batch's
    parts: state and state_next made the views of state_seq again."""
    state, state_next = seq_views(named["state_seq"])
    action, reward, *tail = rest
    return cls((state, action, reward, state_next, *tail), named)


def pickle_batch(batch):
    """copyreg reducer of exreplay.Batch. A shared batch is pickled as its
    state_seq without state and state_next, which are rebuilt as its views:
    pickled as they are, the two views would be copied out in full, more
    bytes than a default batch's. Any other batch pickles as before."""
    cls, (fields, named) = batch.__reduce__()
    if named.get("state_seq") is None:
        return cls, (fields, named)
    return _shared_batch, (cls, (fields[1], fields[2], *fields[4:]), named)
