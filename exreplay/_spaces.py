"""Buffer layouts from gymnasium spaces (``ExperienceReplay.for_spaces``).

gymnasium is not imported here: spaces are recognised by their class name
and attributes, so this module works with any gymnasium version (and
without gymnasium installed, for callers that pass none of its spaces).
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

_SUPPORTED = "Box, Discrete, MultiDiscrete or MultiBinary"


def _space_kind(space) -> str:
    for klass in type(space).__mro__:
        if klass.__name__ in ("Box", "Discrete", "MultiDiscrete", "MultiBinary", "Dict"):
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
        if 0 in shape:  # the buffer's own error would name state_shape or action_shape
            raise ValueError("%s: expected a space of at least one value, got a %s space of shape "
                             "%s" % (name, kind, shape))
        return shape, dtype
    if kind == "Discrete":
        return (), np.dtype(np.int64)
    raise ValueError(
        "%s: exreplay stores fixed-shape arrays, so a %s space is expected; got %r "
        "(Dict, Tuple, Text, Graph and other composite spaces are not supported here: "
        "flatten them first, e.g. with gymnasium.wrappers.FlattenObservation; "
        "ExperienceReplay.for_spaces takes a Dict observation space of such spaces "
        "as named state fields)"
        % (name, _SUPPORTED, space)
    )


def state_spec_for_space(space, name: str = "observation_space") -> Dict[str, Any]:
    """The state_spec {field: (shape, dtype)} of a gymnasium ``Dict`` space,
    in the space's own key order.  Each entry must be a Box, Discrete,
    MultiDiscrete or MultiBinary space (a nested Dict is a ValueError: flatten
    it, or name its leaves yourself)."""
    if _space_kind(space) != "Dict":
        raise ValueError("%s: expected a Dict space, got %r" % (name, space))
    spec = {}
    for key, sub in space.spaces.items():
        if _space_kind(sub) == "Dict":
            raise ValueError("%s[%r]: nested Dict spaces are not supported (one level of "
                             "named fields); got %r" % (name, key, sub))
        spec[key] = _layout(sub, "%s[%r]" % (name, key))
    return spec


def spec_for_spaces(observation_space, action_space, dict_spaces: bool = False) -> Dict[str, Any]:
    """The state and action arguments for a pair of spaces.

    Box and MultiDiscrete (and MultiBinary) keep their shape and dtype;
    Discrete actions or observations are scalar int64.  With dict_spaces, a
    Dict observation space becomes ``state_spec`` (one named field per
    entry); callers that handle only one state array (the RLlib adapter)
    leave it off and get the ValueError.  Any other space is a ValueError
    naming it.
    """
    action_shape, action_dtype = _layout(action_space, "action_space")
    out: Dict[str, Any] = dict(action_shape=action_shape, action_dtype=action_dtype)
    if dict_spaces and _space_kind(observation_space) == "Dict":
        out["state_spec"] = state_spec_for_space(observation_space)
    else:
        out["state_shape"], out["state_dtype"] = _layout(observation_space, "observation_space")
    return out


def for_spaces(cls, observation_space, action_space, **kwargs):
    """``cls(**spec_for_spaces(observation_space, action_space), **kwargs)``."""
    clash = {"state_shape", "state_dtype", "state_spec", "action_shape", "action_dtype"} & set(kwargs)
    if clash:
        raise TypeError("for_spaces: %s come from the spaces and cannot also be given"
                        % ", ".join(sorted(clash)))
    return cls(**spec_for_spaces(observation_space, action_space, dict_spaces=True), **kwargs)
