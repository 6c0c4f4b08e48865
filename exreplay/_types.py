"""Small public types shared by the C buffer and the pure-Python reference."""

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
