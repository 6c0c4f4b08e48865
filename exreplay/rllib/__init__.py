"""exreplay as the replay buffer of RLlib (new API stack).

Two classes that subclass RLlib's own episode buffers and keep their
contract, each backed by one :class:`exreplay.ExperienceReplay`::

    config.training(replay_buffer_config={
        "type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer",
        "capacity": 50_000, "alpha": 0.6, "beta": 0.4,
        "n_step": 3,          # the largest n-step that `sample` will be asked for
    })

Pass the class by its dotted name: RLlib's DQN tests the type with a
substring check, which a class object fails.  Importing this module imports
RLlib; ``import exreplay`` alone does not.  docs/rllib.md describes what is
supported and how it differs from RLlib's buffers.
"""

from __future__ import annotations

import operator
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

try:
    from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import (
        EpisodeReplayBuffer as _RLlibEpisodeReplayBuffer,
    )
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import (
        PrioritizedEpisodeReplayBuffer as _RLlibPrioritizedEpisodeReplayBuffer,
    )
    from ray.rllib.utils.replay_buffers.replay_buffer import StorageUnit as _StorageUnit
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "exreplay.rllib needs RLlib, gymnasium and torch: "
        "pip install 'ray[rllib]' gymnasium torch, or from an exreplay checkout "
        "pip install -e '.[rllib]'  (import failed: %s)" % e
    ) from e

import exreplay
from exreplay._args import int_arg, nonneg_real_arg, truth_arg, type_name, with_article
from exreplay._core import MAX_PICK_LEN
from exreplay._spaces import spec_for_spaces

__all__ = [
    "EpisodeReplayBuffer",
    "PrioritizedEpisodeReplayBuffer",
    "DQN",
    "ReplayBufferCheckpoints",
]

# get_state() format version (the dict's "exreplay_state_version"). 2: the
# ExperienceReplay is unbounded and the adapter evicts (RLlib's capacity rule).
_STATE_VERSION = 2
# Redraw rounds for rows whose pick is shorter than the n-step drawn for it.
_MAX_REDRAW_ROUNDS = 1000


def _n_step_bounds(n_step) -> Tuple[int, int, bool]:
    """(lowest n, highest n, random) for an `n_step` of RLlib's forms.

    An int is a fixed n-step; a tuple/list ``(lo, hi)`` is a range that
    ``sample`` draws from per row as RLlib's buffer does, with
    ``rng.integers(lo, hi)``: lo <= n < hi.
    """
    if n_step is None:
        return 1, 1, False
    # n steps and the one after them are one pick of the buffer (its
    # pick_len), at most MAX_PICK_LEN: checked here, so that the error names
    # n_step and not the buffer's pick_len
    if isinstance(n_step, (tuple, list)):
        if len(n_step) != 2:
            raise ValueError("n_step: expected an int in [1, %d] or a (low, high) pair of ints, got "
                             "%s of length %d" % (MAX_PICK_LEN, with_article(type_name(n_step)),
                                                  len(n_step)))
        for i, v in enumerate(n_step):
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TypeError("n_step: expected a (low, high) pair of ints, got %s at index %d"
                                % (type_name(v), i))
        lo, hi = int(n_step[0]), int(n_step[1])
        if lo < 1 or hi <= lo or hi - 1 > MAX_PICK_LEN:
            raise ValueError(
                "n_step: expected a range (low, high) with 1 <= low < high <= %d "
                "(n is drawn from low .. high-1, as RLlib does), got %r" % (MAX_PICK_LEN + 1, (lo, hi))
            )
        return lo, hi - 1, True
    n = int_arg("n_step", n_step, 1, MAX_PICK_LEN,
                "an int in [1, %d] or a (low, high) pair of ints" % MAX_PICK_LEN)
    return n, n, False


# The keys of replay_buffer_config that are RLlib's own: RLlib passes every
# key, and exreplay's buffers take these only with the values that mean what
# they do (see _rllib_keys).
_RLLIB_KEYS = ("beta", "storage_unit", "replay_sequence_length", "type")


def _rllib_keys(kwargs, prioritized: bool) -> None:
    """Checks the keyword arguments beyond the constructor's own: RLlib's keys
    (beta is given to every sample() call; a storage unit other than timesteps
    would change what capacity means) and no others."""
    unknown = set(kwargs) - set(_RLLIB_KEYS)
    if unknown:
        raise TypeError(
            "unexpected argument(s) %s; exreplay's %s takes capacity, batch_size_B, "
            "batch_length_T, %smetrics_num_episodes_for_smoothing, n_step, seed, "
            "observation_space, action_space and RLlib's %s"
            % (", ".join(sorted(map(repr, unknown))),
               "PrioritizedEpisodeReplayBuffer" if prioritized else "EpisodeReplayBuffer",
               "alpha, " if prioritized else "", ", ".join(_RLLIB_KEYS))
        )
    if kwargs.get("beta") is not None:
        nonneg_real_arg("beta", kwargs["beta"], "None or a finite number >= 0")
    unit = kwargs.get("storage_unit")
    if unit is not None:
        if isinstance(unit, _StorageUnit):
            unit = unit.value
        if not isinstance(unit, str):
            raise TypeError("storage_unit: expected 'timesteps' (a str or RLlib's StorageUnit), "
                            "got %s" % type_name(kwargs["storage_unit"]))
        if unit != "timesteps":
            raise ValueError("storage_unit: expected 'timesteps' (capacity counts timesteps; "
                             "whole episodes are evicted), got %r" % (unit,))
    if kwargs.get("replay_sequence_length") is not None:
        int_arg("replay_sequence_length", kwargs["replay_sequence_length"], -(2**63), 1,
                "None or an int <= 1 (exreplay's RLlib buffers sample single transitions)")


class _ProbeLogger:
    """Stands in for a MetricsLogger: records what is logged."""

    def __init__(self):
        self.calls = []

    def log_value(self, key, value, **kwargs):
        self.calls.append((key, value))


# Distinct probe values for (B, episodes, steps, mean n, resamples); steps / B is the sixth source.
_PROBE = (1009, 1013, 1019, 1021.5, 1031)


def _metrics_plan(buf):
    """[(key, source)] of the values RLlib's _update_sample_metrics logs, in order.

    Learned by calling it with probe values on a recording logger; source
    indexes (B, n_eps, n_steps, mean_n, resamples, n_steps / B).  None if a
    logged value is none of those (the fast path is then not used).
    """
    real = buf.metrics
    probe = _ProbeLogger()
    buf.metrics = probe
    try:
        buf._rllib_sample_metrics(*_PROBE)
    except Exception:  # noqa: BLE001 - anything unexpected: no fast path
        return None
    finally:
        buf.metrics = real
    B, e, st, mn, rs = _PROBE
    sources = {B: 0, e: 1, st: 2, mn: 3, rs: 4, st / B: 5}
    plan = []
    for key, value in probe.calls:
        src = sources.get(value) if isinstance(value, (int, float)) else None
        if src is None:
            return None
        plan.append((key, src))
    return plan


class _Running:
    """An episode that is still open: its handle, steps held, last observation
    and the t its next fragment starts at (None: not known, from a state
    saved before it was kept)."""

    __slots__ = ("h", "length", "last_obs", "t")

    def __init__(self, h, length, last_obs, t=None):
        self.h = h
        self.length = length
        self.last_obs = last_obs
        self.t = t


# A fragment's episode as add's checks see it: held and ended (open ones are
# (next t, last observation) pairs; unknown ids are absent).
_ENDED = object()


def _same_observation(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f" == b.dtype.kind)


def _observation_text(o, last) -> str:
    """o, against the episode's last observation, for a message (small ones
    in full)."""
    if np.size(o) <= 8 and np.size(last) <= 8:
        return "%r (the episode's last: %r)" % (np.asarray(o).tolist(), np.asarray(last).tolist())
    return "another one"


_FAILED_ADD_NOTE = ("exreplay.rllib add: the episodes before index %d were added (and count in "
                    "the counters and metrics); the one at index %d and those after it were not")

_EPISODES_EXPECTED = ("episodes: expected a SingleAgentEpisode or a list of them (multi-agent "
                      "episodes are not supported), got %s")


def _episode_list(episodes):
    """add's argument as a list of SingleAgentEpisode (TypeError otherwise)."""
    if isinstance(episodes, SingleAgentEpisode):
        return [episodes]
    if isinstance(episodes, (str, bytes, dict)) or not hasattr(episodes, "__iter__"):
        raise TypeError(_EPISODES_EXPECTED % type_name(episodes))
    episodes = list(episodes)
    for i, eps in enumerate(episodes):
        if not isinstance(eps, SingleAgentEpisode):
            raise TypeError(_EPISODES_EXPECTED % ("a list holding %s at index %d"
                                                  % (type_name(eps), i)))
    return episodes


def _where(i, eps) -> str:
    return " (the episode at index %d, id_ %r)" % (i, eps.id_)


def _episode_array(values, what, i, eps) -> np.ndarray:
    """An episode's observations, actions or rewards as one array."""
    try:
        return np.asarray(values)
    except (TypeError, ValueError) as e:
        raise ValueError("episodes: expected %s that stack into one array, got ones NumPy "
                         "cannot stack (%s)%s" % (what, e, _where(i, eps))) from None


def _fit(a, rows, shape, dtype, what, i, eps) -> np.ndarray:
    """a as `rows` rows of `shape` and `dtype`, checked as record_many checks
    an array (a dtype that casts under same_kind, then the exact shape)."""
    if a.dtype != dtype and not np.can_cast(a.dtype, dtype, "same_kind"):
        raise TypeError("episodes: expected %s of dtype %s (or one that casts to it under "
                        "same_kind), got %s%s" % (what, dtype, a.dtype, _where(i, eps)))
    if a.shape[1:] != shape:
        raise ValueError("episodes: expected %s of shape %s per step (the buffer's), got %s%s"
                         % (what, shape, a.shape[1:], _where(i, eps)))
    if a.shape[0] != rows:
        raise ValueError("episodes: expected %d %s for its %d steps, got %d%s"
                         % (rows, what, len(eps), a.shape[0], _where(i, eps)))
    return np.ascontiguousarray(a, dtype)


class _CheckedState(dict):
    """check_state's result, the only thing apply_state takes."""


class _ExreplayEpisodeBuffer:
    """The implementation shared by both classes (a mixin placed first in the MRO)."""

    _prioritized = False

    # ---------------------------------------------------------------- set-up
    def _exr_init(
        self,
        capacity,
        batch_size_B,
        batch_length_T,
        metrics_num_episodes_for_smoothing,
        n_step,
        alpha,
        seed,
        observation_space,
        action_space,
        kwargs,
    ):
        # every argument is checked before anything is set
        capacity = int_arg("capacity", capacity, 1, None, "an int >= 1 (timesteps)")
        batch_size_B = int_arg("batch_size_B", batch_size_B, 1, None, "an int >= 1")
        if batch_length_T is not None:
            batch_length_T = int_arg(
                "batch_length_T", batch_length_T, 0, 1,
                "None, 0 or 1 (exreplay's RLlib buffers sample single transitions, as DQN does)")
        if metrics_num_episodes_for_smoothing is not None:
            metrics_num_episodes_for_smoothing = int_arg(
                "metrics_num_episodes_for_smoothing", metrics_num_episodes_for_smoothing, 1,
                None, "None or an int >= 1")
        _, hi, _ = _n_step_bounds(n_step)
        alpha = nonneg_real_arg("alpha", alpha, "a finite number >= 0")
        if seed is not None:
            seed = int_arg("seed", seed, 0, 2**64 - 1, "None or an int in [0, 2**64)")
        _rllib_keys(kwargs, self._prioritized)
        spec = self._spec_from_spaces(observation_space, action_space)
        _RLlibEpisodeReplayBuffer.__init__(
            self,
            capacity=capacity,
            batch_size_B=batch_size_B,
            batch_length_T=1 if batch_length_T is None else max(batch_length_T, 1),
            metrics_num_episodes_for_smoothing=metrics_num_episodes_for_smoothing,
        )
        self._alpha = alpha
        self._n_max = hi
        self._seed = seed
        self.rng = np.random.default_rng(seed)
        self._buf = None
        self._sel = None
        self._running: Dict[Any, _Running] = {}
        self._h_id: Dict[int, Any] = {}
        self._id_count: Dict[Any, int] = {}  # id_ -> episodes held with it
        self._h_min = 0  # smallest live handle: FIFO evicts in handle order
        self._next_h = 0  # one past the largest handle recorded into
        self._end_len = np.full(64, -1, np.int64)  # per handle: length once ended
        self._last_epi = np.empty(0, np.int64)
        self._last_pos = np.empty(0, np.int64)
        self._last_idx = None  # the last sample's pick_index: set_priority's shortcut
        self._gamma_pows = None
        self._metrics_fast = None  # see _log_sample_metrics
        if spec is not None:
            self._build(spec)

    @staticmethod
    def _spec_from_spaces(observation_space, action_space) -> Optional[Dict[str, Any]]:
        """The buffer's layout from the constructor's spaces (None without)."""
        import gymnasium

        for name, sp in (("observation_space", observation_space), ("action_space", action_space)):
            if sp is not None and not isinstance(sp, gymnasium.spaces.Space):
                raise TypeError("%s: expected None or a gymnasium space (Box, Discrete, "
                                "MultiDiscrete or MultiBinary), got %s" % (name, type_name(sp)))
        if (observation_space is None) != (action_space is None):
            raise ValueError("observation_space and action_space: expected both or neither, got "
                             "only %s" % ("observation_space" if action_space is None
                                          else "action_space"))
        if observation_space is None:
            return None
        return spec_for_spaces(observation_space, action_space)

    def _build(self, spec: Dict[str, Any]) -> None:
        # Unbounded: the adapter evicts whole episodes itself with
        # remove_episode, by RLlib's rule (see add), which lets the newest
        # episode exceed the capacity until the next add.
        # both made before either is set: a failure leaves the buffer unbuilt
        buf = exreplay.ExperienceReplay(
            reward_dtype="float64",
            capacity=None,
            pick_len=self._n_max,
            allow_short=self._n_max > 1,
            eviction="fifo",
            seed=self._seed,
            **spec,
        )
        if self._prioritized:
            sel = buf.new_pick_selector(
                exreplay.PickSelectorClass.Prioritized, alpha=self._alpha, beta=0.0
            )
        else:
            sel = buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
        self._buf, self._sel = buf, sel

    def _spec_from_episode(self, eps, obs, act, i=0) -> Dict[str, Any]:
        spaces = (getattr(eps, "observation_space", None), getattr(eps, "action_space", None))
        if spaces[0] is not None and spaces[1] is not None:
            return spec_for_spaces(*spaces)
        for name, a in (("observations", obs), ("actions", act)):
            if a.dtype.kind not in "biuf":
                raise TypeError(
                    "episodes: exreplay stores %s as NumPy arrays of bool, int or float "
                    "(Box, Discrete, MultiDiscrete spaces), got dtype %s; Dict, Tuple and "
                    "other structured spaces are not supported%s" % (name, a.dtype, _where(i, eps))
                )
        return dict(
            state_shape=obs.shape[1:],
            state_dtype=obs.dtype,
            action_shape=act.shape[1:],
            action_dtype=act.dtype,
        )

    # ------------------------------------------------------------- episodes
    @property
    def episodes(self) -> List[SingleAgentEpisode]:
        """The episodes held, oldest first, rebuilt from the buffer (a copy)."""
        if self._buf is None:
            return []
        self._refresh_evicted()
        out = []
        for h in range(self._h_min, self._next_h):
            if h not in self._h_id:
                continue
            d = self._buf.episode(h)
            id_ = self._h_id[h]
            run = self._running.get(id_)
            if d.ended:
                last = d.final_state if d.final_state is not None else np.zeros_like(d.state[:1])[0]
            else:
                last = run.last_obs if run is not None else None
            obs = list(d.state) + ([last] if last is not None else [])
            n = len(obs) - 1
            out.append(
                SingleAgentEpisode(
                    id_=id_,
                    observations=obs,
                    actions=list(d.action[:n]),
                    rewards=list(d.reward[:n]),
                    terminated=bool(d.terminated),
                    truncated=bool(d.ended and not d.terminated),
                    len_lookback_buffer=0,
                )
            )
        return out

    @episodes.setter
    def episodes(self, value) -> None:
        # RLlib's __init__ assigns an empty deque; anything else is a misuse.
        if not hasattr(value, "__len__") or isinstance(value, (str, bytes)) or len(value):
            raise AttributeError("episodes: read-only on exreplay's RLlib buffers (rebuilt from "
                                 "the buffer; add and set_state change it), got %s"
                                 % type_name(value))

    def _refresh_evicted(self) -> int:
        """Drops the bookkeeping of evicted episodes; returns how many were evicted."""
        if self._buf is None:
            return 0
        h_min = self._next_h - self._buf.num_episodes
        evicted = h_min - self._h_min
        if evicted > 0:
            for h in range(self._h_min, h_min):
                id_ = self._h_id.pop(h, None)
                self._forget_id(id_)
                run = self._running.get(id_)
                if run is not None and run.h == h:
                    del self._running[id_]
            self._h_min = h_min
        return evicted

    def _evict_oldest(self) -> int:
        """Removes the oldest episode held (the smallest handle); returns its timesteps."""
        h = self._h_min
        before = len(self._buf)
        self._buf.remove_episode(h)
        id_ = self._h_id.pop(h, None)
        self._forget_id(id_)
        run = self._running.get(id_)
        if run is not None and run.h == h:
            del self._running[id_]
        self._h_min = h + 1
        return before - len(self._buf)

    def _forget_id(self, id_) -> None:
        c = self._id_count.get(id_, 0)
        if c > 1:
            self._id_count[id_] = c - 1
        elif c:
            del self._id_count[id_]

    def _evict_before_add(self, frags) -> set:
        """RLlib's prioritized buffer's eviction, done before the fragments are recorded.

        The new fragments' timesteps count from the start; the oldest
        episodes held are evicted while over capacity and more than one
        episode (held or new, by id) would remain.  Returns the ids of the
        evicted episodes, whose fragments in this add are then dropped
        (their timesteps uncounted), as RLlib drops them.  Where RLlib would
        pop from an empty deque (several new episodes over capacity and
        nothing older to evict), the new episodes are all kept until the
        next add.
        """
        if self._buf is None:
            return set()
        ts = len(self._buf) + sum(f[1] for f in frags)
        if ts <= self.capacity:
            return set()
        new_len = {}
        for f in frags:
            new_len.setdefault(f[0].id_, f[1])  # RLlib subtracts the first fragment's length
        # |held ids ∪ new ids|, less one per id evicted (O(1) per add while nothing is evicted)
        remaining = len(self._id_count) + sum(1 for i in new_len if i not in self._id_count)
        evicted = set()
        while ts > self.capacity and remaining != 1 and self._buf.num_episodes:
            id_ = self._h_id.get(self._h_min)
            ts -= self._evict_oldest()
            if id_ not in evicted:
                evicted.add(id_)
                remaining -= 1
            if id_ in new_len:
                ts -= new_len[id_]
        return evicted

    def _grow_end_len(self, n: int) -> None:
        """Makes room in the table of end lengths for handles below n."""
        if n > len(self._end_len):
            grown = np.full(max(2 * len(self._end_len), n), -1, np.int64)
            grown[: len(self._end_len)] = self._end_len
            self._end_len = grown

    def _set_end(self, h: int, length: int) -> None:
        self._grow_end_len(h + 1)
        self._end_len[h] = length

    # ------------------------------------------------------------------ add
    def add(
        self,
        episodes: Union[List[SingleAgentEpisode], SingleAgentEpisode],
        weight: Optional[float] = None,
    ) -> None:
        """Records episodes (or fragments of running ones, matched by ``id_``).

        Each fragment goes in with one ``record_many``; a fragment whose
        ``id_`` names an episode still held and open continues it.  The
        steps get priority ``weight`` (``None``: the selector's maximum so
        far).  Whole episodes are evicted, oldest first, by RLlib's rule for
        the class (docs/rllib.md, "Capacity"): the uniform buffer after each
        fragment, while more than ``capacity`` timesteps are held and more
        than one episode; the prioritized one before recording, counting the
        new timesteps, while over capacity and more than one episode would
        remain (a fragment of an episode evicted then is dropped).  Either
        way the newest episode is never evicted, so one longer than the
        capacity stays whole until the next add.

        Every argument is checked, and every episode converted, before
        anything is recorded or evicted; a refused add changes nothing.  A
        TypeError or ValueError names ``episodes`` (with the index and
        ``id_`` of the episode) for what is not a SingleAgentEpisode, for
        observations, actions or rewards the buffer cannot hold, and for a
        fragment with the ``id_`` of an episode held that it does not
        continue (the episode has ended, or the fragment's ``t_started`` or
        first observation is not where the open episode stopped: RLlib's
        concat_episode asserts the same); it names ``weight`` for a weight
        that is not one finite number >= 0 (RLlib's contract: one priority
        for every new step).

        A failure while recording (a MemoryError from record_many, which
        records all of one fragment or nothing) stops the add at the
        fragment it hit: the fragments before it stay recorded, kept track
        of and counted, with the evictions made for the add; it and those
        after it are not recorded (docs/rllib.md, "What each call does").
        """
        episodes = _episode_list(episodes)
        if weight is not None:
            weight = nonneg_real_arg("weight", weight,
                                     "None or a finite number >= 0 (the new steps' priority)")
        self._refresh_evicted()
        frags, spec = self._check_fragments(episodes)
        # everything is checked: from here on nothing is refused
        if spec is not None:
            self._build(spec)
        len_before = len(self._buf) if self._buf is not None else 0
        h_min_before = self._h_min
        done = [0, 0, 0]  # fragments taken (recorded or dropped), steps and episodes recorded
        try:
            self._record_fragments(frags, weight, done)
        except BaseException as e:
            # A failure (a MemoryError from record_many) stops the add at the
            # fragment it hit: the ones before it stay recorded, with their
            # bookkeeping, and are counted as added; it and the rest are not.
            if done != [0, 0, 0] or self._h_min != h_min_before:
                self._count_add(done, len_before, h_min_before)
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(_FAILED_ADD_NOTE % (done[0], done[0]) if done[0] else
                           "exreplay.rllib add: no episode of this add was added")
            raise
        self._count_add(done, len_before, h_min_before)

    def _record_fragments(self, frags, weight, done) -> None:
        """add's fragments recorded in order, with the evictions of RLlib's
        rule; done ([fragments, steps, episodes]) follows each one, so that
        add knows how far a failure let it go. Each fragment's bookkeeping is
        updated with its record_many, which records all of it or nothing."""
        dropped = self._evict_before_add(frags) if self._prioritized else ()
        for frag in frags:
            if frag[0].id_ not in dropped:
                steps, new = self._add_fragment(frag, weight)
                done[1] += steps
                done[2] += new
            done[0] += 1
            if not self._prioritized and self._buf is not None:  # None: no steps yet
                while len(self._buf) > self.capacity and self._buf.num_episodes > 1:
                    self._evict_oldest()

    def _count_add(self, done, len_before, h_min_before) -> None:
        """The counters and RLlib's add metrics for what add recorded and evicted."""
        steps_added = done[1]
        self._num_timesteps_added += steps_added
        n_evicted = self._h_min - h_min_before
        steps_evicted = len_before + steps_added - (len(self._buf) if self._buf is not None else 0)
        self._report_add(done[2], steps_added, n_evicted, steps_evicted)

    def _check_fragments(self, episodes):
        """add's episodes checked and converted to the buffer's layout, before
        anything changes: ([(episode, steps, observations, actions,
        rewards)], the layout of the buffer to build, or None)."""
        spec = None
        layout = None
        if self._buf is not None:
            layout = (self._buf.state_shape, self._buf.state_dtype,
                      self._buf.action_shape, self._buf.action_dtype)
        frags = []
        seen = {}  # id_ -> _ENDED or (next t, last observation), after the fragments before
        for i, eps in enumerate(episodes):
            T = len(eps)
            prev = self._continues(eps, i, seen)
            if T == 0:
                obs = None
                if eps.is_done and prev is not None:  # ends the open episode: its final state
                    obs = self._closing_observation(eps, i, prev, layout)
                    seen[eps.id_] = _ENDED
                frags.append((eps, 0, obs, None, None))
                continue
            obs = _episode_array(eps.get_observations(), "observations", i, eps)
            act = _episode_array(eps.get_actions(), "actions", i, eps)
            rew = _episode_array(eps.get_rewards(), "rewards", i, eps)
            if layout is None:  # the first add: the layout of its first episode
                spec = self._spec_from_episode(eps, obs, act, i)
                layout = (tuple(spec["state_shape"]), np.dtype(spec["state_dtype"]),
                          tuple(spec["action_shape"]), np.dtype(spec["action_dtype"]))
            obs = _fit(obs, T + 1, layout[0], layout[1], "observations", i, eps)
            act = _fit(act, T, layout[2], layout[3], "actions", i, eps)
            if rew.dtype.kind not in "biuf":
                raise TypeError("episodes: expected rewards of real numbers (bool, int or float), "
                                "got %s%s" % (rew.dtype, _where(i, eps)))
            if rew.shape != (T,):
                raise ValueError("episodes: expected rewards of shape (%d,) (one per step), got "
                                 "%s%s" % (T, rew.shape, _where(i, eps)))
            if prev is not None and prev[1] is not None and not _same_observation(obs[0], prev[1]):
                raise ValueError("episodes: expected a first observation equal to the last one of "
                                 "the open episode with this id_ (the fragment continues it), got "
                                 "%s%s" % (_observation_text(obs[0], prev[1]), _where(i, eps)))
            seen[eps.id_] = _ENDED if eps.is_done else (eps.t, obs[-1])
            frags.append((eps, T, obs, act, rew.astype(np.float64, copy=False)))
        return frags, spec

    @staticmethod
    def _closing_observation(eps, i, prev, layout) -> np.ndarray:
        """The one observation of a fragment of no steps that ends the open
        episode it continues: the episode's final state, checked as a
        fragment's observations are (the buffer's layout, and equal to the
        episode's last observation, which it is)."""
        obs = _episode_array(eps.get_observations(), "observations", i, eps)
        obs = _fit(obs, 1, layout[0], layout[1], "observations", i, eps)
        if prev[1] is not None and not _same_observation(obs[0], prev[1]):
            raise ValueError("episodes: expected a first observation equal to the last one of "
                             "the open episode with this id_ (the fragment continues it), got "
                             "%s%s" % (_observation_text(obs[0], prev[1]), _where(i, eps)))
        return obs[0]

    def _continues(self, eps, i, seen):
        """(next t, last observation) of the open episode a fragment
        continues, None for a new one; a ValueError if it cannot continue
        the episode of its id_ (ended, or another t), as RLlib's
        concat_episode asserts."""
        prev = seen.get(eps.id_)
        if prev is None:
            run = self._running.get(eps.id_)
            if run is not None:
                prev = (run.t, run.last_obs)
            elif eps.id_ in self._id_count:
                prev = _ENDED
        if prev is _ENDED:
            raise ValueError("episodes: expected a new id_ or the next fragment of an open episode, "
                             "got the id_ of an episode held that has ended%s" % _where(i, eps))
        if prev is not None and prev[0] is not None and eps.t_started != prev[0]:
            raise ValueError("episodes: expected t_started %d (where the open episode with this "
                             "id_ stopped), got %r%s" % (prev[0], eps.t_started, _where(i, eps)))
        return prev

    def _add_fragment(self, frag, weight):
        """One fragment recorded (continuing its episode if held and open):
        (steps recorded, 1 if it started an episode in the buffer else 0)."""
        eps, T, obs, act, rew = frag
        run = self._running.get(eps.id_)
        if T == 0:
            if eps.is_done and run is not None:
                self._end_open(eps, run, obs)
            return 0, 0
        h = run.h if run is not None and self._h_min <= run.h else None
        done = bool(eps.is_done)
        prios = None if weight is None else np.full(T, weight)
        # the arrays the bookkeeping keeps are made before the steps are
        # recorded (a new episode's handle is _next_h), so that a failure
        # leaves the fragment either recorded and kept track of, or neither
        last_obs = None if done else obs[-1].copy()
        self._grow_end_len(max(self._next_h, -1 if h is None else h) + 1)
        h2 = self._buf.record_many(h, obs[:-1], act, rew, final_state=obs[-1] if done else None,
                                   terminated=bool(eps.is_terminated), priorities=prios)
        self._next_h = max(self._next_h, h2 + 1)
        if h2 not in self._h_id:
            self._id_count[eps.id_] = self._id_count.get(eps.id_, 0) + 1
        self._h_id[h2] = eps.id_
        if h2 == h:
            length = run.length + T
        elif h is None:
            length = T
        else:  # the open episode was evicted while recording: continued in h2
            length = len(self._buf.episode(h2).reward)
        if done:
            self._running.pop(eps.id_, None)
            self._set_end(h2, length)
        else:
            self._running[eps.id_] = _Running(h2, length, last_obs, eps.t)
        return T, int(h2 != h)

    def _end_open(self, eps, run, final_obs) -> None:
        """A done fragment of no steps (its one observation the open
        episode's last, where the episode ends exactly at a fragment
        boundary) ends the open episode without a step: end_episode, with
        that observation as the final state. Its last steps' picks then
        exist and the end flags are the fragment's; the id_ leaves the open
        episodes as at any end. Done before the bookkeeping, so that a
        failure (MemoryError) leaves the episode open and the fragment can be
        added again."""
        self._grow_end_len(run.h + 1)
        if self._buf.end_episode(run.h, final_state=final_obs,
                                 terminated=bool(eps.is_terminated)):
            self._set_end(run.h, run.length)
        del self._running[eps.id_]

    def _report_add(self, episodes_added, steps_added, n_evicted, steps_evicted):
        """RLlib's add metrics, as its own buffer reports them."""
        self._update_add_metrics(
            num_episodes_added=episodes_added,
            num_env_steps_added=steps_added,
            num_episodes_evicted=n_evicted,
            num_env_steps_evicted=steps_evicted,
            agent_to_num_episodes_added={DEFAULT_AGENT_ID: episodes_added},
            agent_to_num_steps_added={DEFAULT_AGENT_ID: steps_added},
            agent_to_num_episodes_evicted={DEFAULT_AGENT_ID: n_evicted},
            agent_to_num_steps_evicted={DEFAULT_AGENT_ID: steps_evicted},
            module_to_num_steps_added={DEFAULT_MODULE_ID: steps_added},
            module_to_num_episodes_added={DEFAULT_MODULE_ID: episodes_added},
            module_to_num_episodes_evicted={DEFAULT_MODULE_ID: n_evicted},
            module_to_num_steps_evicted={DEFAULT_MODULE_ID: steps_evicted},
        )

    # --------------------------------------------------------------- sample
    def sample(
        self,
        num_items: Optional[int] = None,
        *,
        batch_size_B: Optional[int] = None,
        batch_length_T: Optional[int] = None,
        n_step: Optional[Union[int, Tuple[int, int]]] = None,
        beta: float = 0.0,
        gamma: float = 0.99,
        include_infos: bool = False,
        include_extra_model_outputs: bool = False,
        to_numpy: bool = False,
        sample_episodes: Optional[bool] = True,
        lookback: int = 0,
        min_batch_length_T: int = 0,
        **kwargs,
    ) -> List[SingleAgentEpisode]:
        """Draws transitions and returns them as one-step SingleAgentEpisodes.

        Each returned episode has ``observations=[o_t, o_{t+n}]``,
        ``actions=[a_t]``, ``rewards=[sum_k gamma**k r_{t+k}]`` (k < n),
        ``terminated``/``truncated`` set only when t+n is the episode's end,
        ``extra_model_outputs={"weights": [w], "n_step": [n]}`` and
        ``t_started=t``.  The n-step returns and next observations are
        computed from the batch arrays with NumPy, no loop per step.

        ``n_step`` is an int or a range ``(lo, hi)`` drawn per row
        (lo <= n < hi), at most the ``n_step`` the buffer was built with.
        Weights are ``(p_min / p_i) ** beta`` over every item held, as RLlib
        normalises them (1.0 at ``beta=0`` and for the uniform buffer).

        Raises ValueError for ``include_infos``/``include_extra_model_outputs``
        (not stored), sequences (``batch_length_T`` > 1, ``lookback`` > 1,
        ``min_batch_length_T`` > 0, ``sample_episodes=False``), an ``n_step``
        over the buffer's, or an empty buffer; TypeError for an argument of
        the wrong type (a str, a float or None where an int is expected),
        each before anything is drawn.  ``num_items`` 0 or None is the
        buffer's ``batch_size_B``, as in RLlib's buffers.
        """
        to_numpy = truth_arg("to_numpy", to_numpy)
        B, lo, hi, random_n, beta, gamma = self._sample_args(
            num_items, batch_size_B, batch_length_T, n_step, beta, gamma, include_infos,
            include_extra_model_outputs, sample_episodes, lookback, min_batch_length_T)
        state, action, reward, state_next, seq_len, seq_len_next, epi, pos, idx, n, resamples = (
            self._draw(B, lo, hi, random_n, n_step)
        )
        weight = self._weights(epi, pos, beta, B)
        ret = self._n_step_returns(reward, n, gamma, B)
        obs0 = state[:, 0]
        obs_n = state_next[np.arange(B), n - 1]
        act0 = action[:, 0]
        terminated = (n == seq_len) & (seq_len_next < seq_len)
        if len(self._end_len) < self._next_h:
            self._set_end(self._next_h - 1, -1)  # grows the table to every handle
        truncated = ~terminated & (self._end_len[epi] == pos + n)

        out = _episodes_from_arrays(
            obs0, obs_n, act0, ret, terminated, truncated, weight, n, pos, to_numpy
        )
        self._last_epi, self._last_pos, self._last_idx = epi, pos, idx
        self.sampled_timesteps += B

        el, pl = epi.tolist(), pos.tolist()
        self._log_sample_metrics(B, len(set(el)), len(set(zip(el, pl))), float(n.sum()) / B, resamples)
        return out

    def _sample_args(self, num_items, batch_size_B, batch_length_T, n_step, beta, gamma,
                     include_infos, include_extra_model_outputs, sample_episodes, lookback,
                     min_batch_length_T):
        """sample's arguments checked, before anything is drawn: (B, lo, hi,
        random_n, beta, gamma)."""
        for name, v in (("batch_length_T", batch_length_T), ("lookback", lookback),
                        ("min_batch_length_T", min_batch_length_T)):
            if v is not None:
                int_arg(name, v, -(2**63), None, "None or an int")
        if (truth_arg("include_infos", include_infos)
                | truth_arg("include_extra_model_outputs", include_extra_model_outputs)):
            raise ValueError(
                "include_infos/include_extra_model_outputs: exreplay's RLlib buffers store "
                "observations, actions and rewards only; infos and extra model outputs "
                "are not kept (docs/rllib.md)"
            )
        if (batch_length_T or 0) > 1 or (lookback or 0) > 1 or (min_batch_length_T or 0) > 0:
            raise ValueError(
                "batch_length_T/lookback/min_batch_length_T: exreplay's RLlib buffers sample "
                "single transitions (DQN without a stateful module); got batch_length_T=%r, "
                "lookback=%r, min_batch_length_T=%r" % (batch_length_T, lookback, min_batch_length_T)
            )
        # None is RLlib's "the buffer's default", which is episodes here
        if sample_episodes is not None and not truth_arg("sample_episodes", sample_episodes):
            raise ValueError(
                "sample_episodes: exreplay's RLlib buffers return a list of one-step "
                "SingleAgentEpisodes (sample_episodes=True or None), got %r" % (sample_episodes,)
            )
        name = "batch_size_B"
        if num_items is not None:
            if batch_size_B is not None:
                raise ValueError("num_items and batch_size_B: give one, not both")
            name, batch_size_B = "num_items", num_items
        # None or 0: the buffer's batch_size_B, as RLlib's buffers take them
        B = (None if batch_size_B is None else int_arg(
            name, batch_size_B, 0, None, "None or an int >= 0 (None and 0: the buffer's "
            "batch_size_B)")) or self.batch_size_B
        gamma = nonneg_real_arg("gamma", gamma, "a finite number >= 0")
        lo, hi, random_n = _n_step_bounds(n_step)
        if hi > self._n_max:
            raise ValueError(
                "n_step: %r asks for up to %d steps, but this buffer was built for at most "
                "n_step=%d; set replay_buffer_config['n_step'] to the algorithm's n_step"
                % (n_step, hi, self._n_max)
            )
        if self._buf is None or self._buf.num_picks == 0:
            raise ValueError(
                "sample: nothing to sample yet (%d timesteps held; a step can be drawn once "
                "the step after it, or the episode's end, has been added)"
                % (0 if self._buf is None else len(self._buf))
            )
        if beta is not None:
            beta = nonneg_real_arg("beta", beta, "None or a finite number >= 0")
        return B, lo, hi, random_n, 0.0 if beta is None else beta, gamma

    def _weights(self, epi, pos, beta, B):
        """Importance weights as RLlib computes them: (N P(i))**-beta over the
        largest such weight, (N P_min)**-beta, which is (leaf_min / leaf_i)**beta
        with leaf = p**alpha as stored (the selector's own beta stays 0)."""
        if self._prioritized and beta > 0.0:
            _, min_leaf, _ = self._buf.priority_stats(self._sel)
            return (min_leaf / self._buf.stored_priorities(self._sel, epi, pos)) ** beta
        return np.ones(B)

    def _n_step_returns(self, reward, n, gamma, B):
        """sum_k gamma**k r_{t+k} (k < n) of each row, from a table of discounts."""
        L = reward.shape[1]
        g = self._gamma_pows
        if g is None or g[0] != gamma or g[1].shape[1] != L:
            # row k: gamma**j for j < k, else 0 (the discounts of a k-step return)
            j = np.arange(L)
            table = np.where(j[None, :] < np.arange(L + 1)[:, None], float(gamma) ** j, 0.0)
            g = self._gamma_pows = (gamma, table)
        if L == 1:
            return reward[:, 0].astype(np.float64)
        return (reward * g[1][n]).sum(axis=1)

    def _draw(self, B, lo, hi, random_n, n_step):
        """B transitions: (state, action, reward, state_next, seq_len, seq_len_next,
        pick_epi, pick_pos, pick_index) arrays of B rows, the n of each row, and the
        rejected draws.

        A row whose pick is shorter than the n drawn for it (near an
        episode's end) is rejected, as RLlib rejects and redraws it.  Each
        draw takes a few rows more than it needs and keeps the first ones
        that fit, so a rejection rarely costs a second draw: the rows kept
        are the first B acceptances of a sequence of independent (pick, n)
        draws, which is what redrawing each rejected row gives too.
        """
        check = self._n_max > 1  # with picks of one step every row fits
        extra = max(2, B >> 3) if check else 0
        parts = []
        have = 0
        resamples = 0
        for _ in range(_MAX_REDRAW_ROUNDS):
            want = B - have
            m = want + extra
            r = self._buf.get_batch(m, self._sel)
            n = self.rng.integers(lo, hi + 1, size=m) if random_n else np.full(m, lo, np.int64)
            if not check:
                parts.append((r, slice(0, want), n[:want]))
                break
            ok = r.seq_len >= n
            if ok[:want].all():
                parts.append((r, slice(0, want), n[:want]))
                break
            idx = np.flatnonzero(ok)
            if idx.size >= want:
                resamples += int(idx[want - 1]) + 1 - want
                idx = idx[:want]
            else:
                resamples += m - idx.size
            if idx.size:
                parts.append((r, idx, n[idx]))
                have += idx.size
            if have == B:
                break
        else:
            raise ValueError(
                "sample: no transition with n_step=%r found in %d draws: the episodes held "
                "are shorter than the n-step" % (n_step, resamples)
            )
        fields = ("state", "action", "reward", "state_next", "seq_len", "seq_len_next",
                  "pick_epi", "pick_pos", "pick_index")
        if len(parts) == 1:
            r, rows, n = parts[0]
            return tuple(getattr(r, f)[rows] for f in fields) + (n, resamples)
        cols = tuple(np.concatenate([getattr(r, f)[rows] for r, rows, _ in parts]) for f in fields)
        return cols + (np.concatenate([nn for _, _, nn in parts]), resamples)

    def _log_sample_metrics(self, B, n_eps, n_steps, mean_n, resamples):
        """RLlib's sample metrics (get_metrics), under the keys RLlib's buffer uses.

        RLlib's ``_update_sample_metrics`` logs about twenty values, each
        through ``MetricsLogger.log_value`` (a key lookup and a lock), which
        costs about as much as a fifth of the episode objects ``sample``
        must return.  The first call goes through it; the values it logs
        are then matched to their sources (see _metrics_plan), and later
        calls push the same values into the same Stats objects directly.
        Anything unexpected (another Ray version logging other values, a
        logger reset or restored) falls back to RLlib's own call.
        """
        fast = self._metrics_fast
        st = self.metrics.stats
        if fast is not None and fast[0] is st and fast[1] == len(st):
            vals = (B, n_eps, n_steps, mean_n, resamples, n_steps / B)
            for push, src in fast[2]:
                push(vals[src])
            return
        self._rllib_sample_metrics(B, n_eps, n_steps, mean_n, resamples)
        self._metrics_fast = None
        plan = _metrics_plan(self)
        if plan is not None:
            try:
                pushes = [(self.metrics._get_key(key).push, src) for key, src in plan]
            except Exception:  # noqa: BLE001 - a logger without the private lookup: slow path
                return
            self._metrics_fast = (st, len(st), pushes)

    def _rllib_sample_metrics(self, B, n_eps, n_steps, mean_n, resamples):
        self._update_sample_metrics(
            num_env_steps_sampled=B,
            num_episodes_per_sample=n_eps,
            num_env_steps_per_sample=n_steps,
            sampled_n_step=mean_n,
            num_resamples=resamples,
            agent_to_num_steps_sampled={DEFAULT_AGENT_ID: B},
            agent_to_num_episodes_per_sample={DEFAULT_AGENT_ID: n_eps},
            agent_to_num_steps_per_sample={DEFAULT_AGENT_ID: n_steps},
            agent_to_sampled_n_step={DEFAULT_AGENT_ID: mean_n},
            agent_to_num_resamples={DEFAULT_AGENT_ID: resamples},
            module_to_num_steps_sampled={DEFAULT_MODULE_ID: B},
            module_to_num_episodes_per_sample={DEFAULT_MODULE_ID: n_eps},
            module_to_num_steps_per_sample={DEFAULT_MODULE_ID: n_steps},
            module_to_sampled_n_step={DEFAULT_MODULE_ID: mean_n},
            module_to_num_resamples={DEFAULT_MODULE_ID: resamples},
        )

    # -------------------------------------------------------------- counts
    def get_num_episodes(self, module_id=None) -> int:
        """Episodes held (open ones included)."""
        return 0 if self._buf is None else self._buf.num_episodes

    def get_num_episodes_evicted(self, module_id=None) -> int:
        """Episodes evicted since the buffer was created."""
        self._refresh_evicted()
        return self._h_min

    def get_num_timesteps(self, module_id=None) -> int:
        """Timesteps held."""
        return 0 if self._buf is None else len(self._buf)

    def get_added_timesteps(self, module_id=None) -> int:
        """Timesteps added since the buffer was created."""
        return self._num_timesteps_added

    def get_sampled_timesteps(self, module_id=None) -> int:
        """Transitions sampled since the buffer was created."""
        return self.sampled_timesteps

    def __len__(self) -> int:
        return self.get_num_timesteps()

    @property
    def exreplay_buffer(self) -> Optional["exreplay.ExperienceReplay"]:
        """The ExperienceReplay behind this buffer (None before the first add)."""
        return self._buf

    @property
    def last_sampled(self) -> Tuple[np.ndarray, np.ndarray]:
        """(pick_epi, pick_pos) of the last sample's items, pending update_priorities."""
        return self._last_epi, self._last_pos

    # --------------------------------------------------------------- state
    def get_state(self) -> Dict[str, Any]:
        """A picklable dict holding the whole buffer (``serialize`` bytes) and counters."""
        self._refresh_evicted()
        held = np.arange(self._h_min, self._next_h)
        return {
            "exreplay_state_version": _STATE_VERSION,
            "prioritized": self._prioritized,
            "buffer": None if self._buf is None else self._buf.serialize(level=1),
            "selector": None if self._sel is None else int(self._sel),
            "alpha": self._alpha,
            "capacity": self.capacity,
            "n_max": self._n_max,
            "h_min": self._h_min,
            "next_h": self._next_h,
            "h_id": list(self._h_id.items()),
            "running": [(k, r.h, r.length, r.last_obs) for k, r in self._running.items()],
            "running_t": [(k, r.t) for k, r in self._running.items()],
            "end_len": (held, self._end_len[held[held < len(self._end_len)]]) if held.size else None,
            "last_sampled": (self._last_epi, self._last_pos),
            "_num_timesteps_added": self._num_timesteps_added,
            "sampled_timesteps": self.sampled_timesteps,
            "rng": self.rng.bit_generator.state,
        }

    def set_state(self, state: Dict[str, Any]) -> None:
        """Restores a ``get_state`` dict (the buffer draws as the saved one
        would). A state that is refused (ValueError) changes nothing."""
        self.apply_state(self.check_state(state))

    def check_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """What ``set_state(state)`` would set, every part of it checked and
        decoded (the buffer unserialized), without changing this buffer: a
        ValueError if any part is refused. ``apply_state`` of the result then
        cannot fail. (The checkpoint mixin checks the buffer's state this way
        before it restores the algorithm's.)"""
        if not isinstance(state, dict):
            raise TypeError("state: expected a dict from get_state() of exreplay's RLlib buffer, "
                            "got %s" % type_name(state))
        if state.get("exreplay_state_version") != _STATE_VERSION:
            raise ValueError(
                "state: expected a dict from get_state() of exreplay's RLlib buffer "
                "(exreplay_state_version %d), got one with exreplay_state_version %r"
                % (_STATE_VERSION, state.get("exreplay_state_version"))
            )
        if bool(state.get("prioritized")) != self._prioritized:
            raise ValueError(
                "state: saved by a %s buffer, restoring into a %s one"
                % (
                    "prioritized" if state.get("prioritized") else "uniform",
                    "prioritized" if self._prioritized else "uniform",
                )
            )
        try:
            return _CheckedState(self._decode_state(state))
        except (KeyError, TypeError, ValueError, IndexError, OverflowError) as e:
            raise ValueError(
                "state: expected a dict from get_state() of exreplay's RLlib buffer, got one "
                "whose %s" % (("key %s is missing" % e) if isinstance(e, KeyError) else
                              "parts do not fit together (%s: %s)" % (type(e).__name__, e))
            ) from e

    def _decode_state(self, state: Dict[str, Any]) -> Dict[str, Any]:
        buf = None if state["buffer"] is None else exreplay.ExperienceReplay.unserialize(state["buffer"])
        sel = state["selector"]
        if buf is not None:  # its PickSelector, as a new buffer has (a ValueError if it has none)
            sel = buf.pick_selector(sel)
        h_id = dict(state["h_id"])
        id_count: Dict[Any, int] = {}
        for id_ in h_id.values():
            id_count[id_] = id_count.get(id_, 0) + 1
        next_h = operator.index(state["next_h"])
        end_len = np.full(max(64, next_h), -1, np.int64)
        if state["end_len"] is not None:
            held, vals = state["end_len"]
            end_len[np.asarray(held)[: len(vals)]] = vals
        last_epi, last_pos = state["last_sampled"]
        rng = np.random.Generator(type(self.rng.bit_generator)())
        rng.bit_generator.state = state["rng"]
        # the open episodes' next t (absent from states saved before it was kept)
        running_t = {k: None if t is None else operator.index(t)
                     for k, t in state.get("running_t") or ()}
        return dict(
            _buf=buf, _sel=sel, _alpha=float(state["alpha"]),
            _n_max=operator.index(state["n_max"]), _h_min=operator.index(state["h_min"]),
            _next_h=next_h, _h_id=h_id, _id_count=id_count,
            # each last observation in the buffer's dtype, as add compares it
            # (a state saved before add kept them cast held them as they came)
            _running={k: _Running(h, n, o if o is None or buf is None else
                                  np.asarray(o, buf.state_dtype)[()], running_t.get(k))
                      for k, h, n, o in state["running"]},
            _end_len=end_len, _last_epi=last_epi, _last_pos=last_pos, _last_idx=None,
            _num_timesteps_added=operator.index(state["_num_timesteps_added"]),
            sampled_timesteps=operator.index(state["sampled_timesteps"]), rng=rng,
            capacity=operator.index(state["capacity"]),
        )

    def apply_state(self, checked: Dict[str, Any]) -> None:
        """Sets what ``check_state`` returned (nothing here can fail); anything
        else, a ``get_state()`` dict among them, is a TypeError and changes
        nothing."""
        if type(checked) is not _CheckedState:
            raise TypeError("checked: expected what check_state() returned (set_state(state) "
                            "checks a get_state() dict and applies it), got %s"
                            % type_name(checked))
        for k, v in checked.items():
            setattr(self, k, v)

    def __repr__(self) -> str:
        return "<%s capacity=%d n_step<=%d timesteps=%d episodes=%d%s>" % (
            type(self).__name__,
            self.capacity,
            self._n_max,
            self.get_num_timesteps(),
            self.get_num_episodes(),
            " alpha=%g" % self._alpha if self._prioritized else "",
        )


def _episodes_from_arrays(obs0, obs_n, act0, ret, terminated, truncated, weight, n, pos, to_numpy):
    """The list of one-step SingleAgentEpisodes RLlib's sample() returns.

    This is the per-item cost RLlib imposes (one object per transition);
    everything it is built from was computed vectorised.
    """
    out = []
    append = out.append
    w = weight.tolist()
    nl = n.tolist()
    tl = pos.tolist()
    rl = ret.tolist()
    term = terminated.tolist()
    trunc = truncated.tolist()
    for i in range(len(nl)):
        e = SingleAgentEpisode(
            observations=[obs0[i], obs_n[i]],
            actions=[act0[i]],
            rewards=[rl[i]],
            terminated=term[i],
            truncated=trunc[i],
            extra_model_outputs={"weights": [w[i]], "n_step": [nl[i]]},
            len_lookback_buffer=0,
            t_started=tl[i],
        )
        if to_numpy:
            e.to_numpy()
        append(e)
    return out


class EpisodeReplayBuffer(_ExreplayEpisodeBuffer, _RLlibEpisodeReplayBuffer):
    """RLlib's ``EpisodeReplayBuffer`` contract on an exreplay buffer, uniform sampling.

    Args:
        capacity: timesteps held; whole episodes are evicted, oldest first,
            while more are held.
        batch_size_B: default batch size of ``sample``.
        batch_length_T: 0 or 1 (single transitions only).
        n_step: the largest n-step ``sample`` will be asked for: an int, or
            a range ``(lo, hi)`` as DQN's ``n_step`` (then n < hi).  The
            buffer stores picks of that many steps.
        seed: seeds the exreplay buffer and the n-step draws (None: OS entropy).
        observation_space, action_space: build the buffer now from gymnasium
            spaces (Box, Discrete, MultiDiscrete; others are a ValueError);
            otherwise it is built from the first episode added.

    Raises:
        ValueError/TypeError for a bad argument or an unsupported space.
    """

    def __init__(
        self,
        capacity: int = 10000,
        *,
        batch_size_B: int = 16,
        batch_length_T: int = 1,
        metrics_num_episodes_for_smoothing: int = 100,
        n_step: Union[int, Tuple[int, int]] = 1,
        seed: Optional[int] = None,
        observation_space=None,
        action_space=None,
        **kwargs,
    ):
        self._exr_init(
            capacity, batch_size_B, batch_length_T, metrics_num_episodes_for_smoothing,
            n_step, 1.0, seed, observation_space, action_space, kwargs,
        )


_PRIORITIES_EXPECTED = ("priorities: expected an array of real numbers, one per item of the last "
                        "sample, got %s")


class PrioritizedEpisodeReplayBuffer(_ExreplayEpisodeBuffer, _RLlibPrioritizedEpisodeReplayBuffer):
    """RLlib's ``PrioritizedEpisodeReplayBuffer`` contract on an exreplay buffer.

    Proportional prioritization: item i is drawn with probability
    p_i**alpha / sum p**alpha; new steps get the largest priority so far
    (1.0 at first) unless ``add(..., weight=)`` gives one.  Arguments are
    those of :class:`EpisodeReplayBuffer` plus ``alpha`` (>= 0).
    ``update_priorities`` sets the priorities of the last ``sample``'s items.
    """

    _prioritized = True

    def __init__(
        self,
        capacity: int = 10000,
        *,
        batch_size_B: int = 16,
        batch_length_T: int = 1,
        alpha: float = 1.0,
        metrics_num_episodes_for_smoothing: int = 100,
        n_step: Union[int, Tuple[int, int]] = 1,
        seed: Optional[int] = None,
        observation_space=None,
        action_space=None,
        **kwargs,
    ):
        self._exr_init(
            capacity, batch_size_B, batch_length_T, metrics_num_episodes_for_smoothing,
            n_step, alpha, seed, observation_space, action_space, kwargs,
        )

    def update_priorities(self, priorities, module_id=None) -> None:
        """Sets the priorities of the last ``sample``'s items (in its order).

        ``priorities`` is an array (or a list, or a column of shape (N, 1))
        of ints or floats.  Each priority is clipped below at 1e-12 as RLlib
        does (a negative one too), stored as ``p**alpha`` and raises the
        maximum priority given to new steps.  Items evicted since the sample
        are skipped.  An empty update with no sample awaiting priorities does
        nothing, as in RLlib.  Raises TypeError for anything but real
        numbers (str, bool, complex, None, a scalar), ValueError for another
        shape or length than the last sample's (values when no sample awaits
        them: none was drawn since the last update) and for NaN or
        infinite values (RLlib stores those); nothing changes then.
        Releases the GIL while the priorities are applied.
        """
        want = self._last_epi.size
        p = priorities
        if not isinstance(p, np.ndarray):
            try:
                p = np.asarray(p)
            except (TypeError, ValueError, RuntimeError):  # ragged, a GPU tensor, ...
                raise TypeError(_PRIORITIES_EXPECTED % type_name(priorities)) from None
        if p.dtype.kind not in "iuf" or p.ndim == 0:
            raise TypeError(_PRIORITIES_EXPECTED % (
                type_name(priorities) if p is priorities or p.ndim == 0 else
                "%s (as an array: dtype %s, shape %s)" % (type_name(priorities), p.dtype, p.shape)))
        if p.ndim == 2 and p.shape[1] == 1:
            p = p[:, 0]  # a column, as a learner may give it
        if p.ndim != 1:
            raise ValueError("priorities: expected a 1-D array of %d values (one per item of the "
                             "last sample), got shape %s" % (want, p.shape))
        if p.size != want:
            if want == 0:
                raise ValueError("priorities: expected no values (no sample awaits priorities: "
                                 "none was drawn since the last update_priorities), got %d"
                                 % p.size)
            raise ValueError(
                "priorities: expected %d values (one per item of the last sample), got %d"
                % (want, p.size)
            )
        if want == 0:
            return
        p = np.maximum(p, 1e-12)
        self._buf.set_priority(self._sel, self._last_epi, self._last_pos, p, pick_index=self._last_idx)
        self._last_epi = np.empty(0, np.int64)
        self._last_pos = np.empty(0, np.int64)
        self._last_idx = None


# Checkpoints that hold the buffer (imported last: it imports RLlib's DQN).
from exreplay.rllib.checkpoint import DQN, ReplayBufferCheckpoints  # noqa: E402
