"""Buffer layouts from gymnasium spaces (``ExperienceReplay.for_spaces``).

gymnasium is not imported here: spaces are recognised by their class name
and attributes, so this module works with any gymnasium version (and
without gymnasium installed, for callers that pass none of its spaces).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

_SUPPORTED = "Box, Discrete or MultiDiscrete"


def _space_kind(space) -> str:
    for klass in type(space).__mro__:
        if klass.__name__ in ("Box", "Discrete", "MultiDiscrete", "MultiBinary"):
            return klass.__name__
    return ""


def _layout(space, name: str):
    kind = _space_kind(space)
    if kind in ("Box", "MultiDiscrete", "MultiBinary"):
        shape = tuple(int(d) for d in space.shape)
        dtype = np.dtype(space.dtype)
        if dtype.kind not in "biuf":
            raise ValueError("%s: a %s space of dtype %s cannot be stored (bool, int or float only)"
                             % (name, kind, dtype))
        return shape, dtype
    if kind == "Discrete":
        return (), np.dtype(np.int64)
    raise ValueError(
        "%s: exreplay stores fixed-shape arrays, so a %s space is expected; got %r "
        "(Dict, Tuple, Text, Graph and other composite spaces are not supported: "
        "flatten them first, e.g. with gymnasium.wrappers.FlattenObservation)"
        % (name, _SUPPORTED, space)
    )


def spec_for_spaces(observation_space, action_space) -> Dict[str, Any]:
    """The state_/action_ shape and dtype arguments for a pair of spaces.

    Box and MultiDiscrete (and MultiBinary) keep their shape and dtype;
    Discrete actions or observations are scalar int64.  Any other space is a
    ValueError naming it.
    """
    state_shape, state_dtype = _layout(observation_space, "observation_space")
    action_shape, action_dtype = _layout(action_space, "action_space")
    return dict(state_shape=state_shape, state_dtype=state_dtype,
                action_shape=action_shape, action_dtype=action_dtype)


def for_spaces(cls, observation_space, action_space, **kwargs):
    """``cls(**spec_for_spaces(observation_space, action_space), **kwargs)``."""
    clash = {"state_shape", "state_dtype", "action_shape", "action_dtype"} & set(kwargs)
    if clash:
        raise TypeError("for_spaces: %s come from the spaces and cannot also be given"
                        % ", ".join(sorted(clash)))
    return cls(**spec_for_spaces(observation_space, action_space), **kwargs)
