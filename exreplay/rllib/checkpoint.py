"""Replay buffers in RLlib checkpoints (new API stack).

On RLlib's new API stack (the default for DQN in Ray 2.60) an algorithm's
checkpoint is ``Algorithm.get_state()`` plus its checkpointable components
(learner group, env runner); the local replay buffer is in neither, and
``store_buffer_in_checkpoints`` is read only by the old stack's
``__getstate__`` (docs/rllib.md, "Checkpoints").  So ``algo.save_to_path``
and ``Algorithm.from_checkpoint`` lose the buffer, whichever buffer it is.

:class:`ReplayBufferCheckpoints` is a mixin for an Algorithm class that adds
the buffer's ``get_state()`` to the algorithm's own state under
``"local_replay_buffer"`` when ``store_buffer_in_checkpoints`` is set, and
gives it back to the buffer's ``set_state`` on restore, so that RLlib's own
checkpoint path carries it (the state is pickled into the checkpoint's
``state.pkl``).  :class:`DQN` is RLlib's DQN with it::

    config = DQNConfig(algo_class=exreplay.rllib.DQN).training(
        store_buffer_in_checkpoints=True,
        replay_buffer_config={"type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer", ...})
    algo = config.build_algo()
    ...
    algo.save_to_path(path)
    algo2 = Algorithm.from_checkpoint(path)   # an exreplay.rllib.DQN, buffer restored

It works with any buffer that has ``get_state``/``set_state`` (RLlib's own
episode buffers too); exreplay's state is its ``serialize`` bytes, so it is
compact and restores exactly (the same next draws).
"""

from __future__ import annotations

import logging

from ray.rllib.algorithms.dqn import DQN as _RLlibDQN

__all__ = ["ReplayBufferCheckpoints", "DQN", "BUFFER_STATE_KEY"]

# The key RLlib's old API stack uses for the same thing.
BUFFER_STATE_KEY = "local_replay_buffer"

logger = logging.getLogger(__name__)


class ReplayBufferCheckpoints:
    """Mixin (before the Algorithm class): the replay buffer in get_state/set_state."""

    def _stores_buffer(self) -> bool:
        return bool(getattr(self.config, "store_buffer_in_checkpoints", False)) and (
            getattr(self, "local_replay_buffer", None) is not None
        )

    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._stores_buffer() and self._check_component(
            BUFFER_STATE_KEY, components, not_components
        ):
            state[BUFFER_STATE_KEY] = self.local_replay_buffer.get_state()
        return state

    def set_state(self, state) -> None:
        # Checked before anything is restored: a refused state changes nothing.
        if BUFFER_STATE_KEY in state and getattr(self, "local_replay_buffer", None) is None:
            raise ValueError(
                f"state: expected no {BUFFER_STATE_KEY!r} (this algorithm has no replay buffer "
                "to restore it into), got one"
            )
        if BUFFER_STATE_KEY not in state:
            super().set_state(state)
            if self._stores_buffer():
                logger.warning(
                    "store_buffer_in_checkpoints is set, but the state restored holds no "
                    "replay buffer: the buffer keeps what it holds"
                )
            return
        buf = self.local_replay_buffer
        if hasattr(buf, "check_state"):
            # exreplay's buffers: the buffer's state checked (and decoded)
            # before the algorithm's is restored, so that a refused one
            # changes neither; then applied, which cannot fail
            checked = buf.check_state(state[BUFFER_STATE_KEY])
            super().set_state(state)
            buf.apply_state(checked)
        else:
            super().set_state(state)
            buf.set_state(state[BUFFER_STATE_KEY])


class DQN(ReplayBufferCheckpoints, _RLlibDQN):
    """RLlib's DQN whose checkpoints hold the replay buffer when
    ``store_buffer_in_checkpoints=True`` (select it with
    ``DQNConfig(algo_class=exreplay.rllib.DQN)``)."""
