"""Type stubs for exreplay._core, the C extension (src/py/*.c over src/core/).

The reference for behaviour is docs/api.md; the precise rules are in
docs/semantics.md.
"""

import os
from collections.abc import Callable, Sequence
from collections.abc import Mapping
from typing import Any, Final, Literal, NoReturn, SupportsIndex, TypeAlias, final, overload

import numpy as np
from _typeshed import structseq
from numpy.typing import ArrayLike, DTypeLike, NDArray

from exreplay._types import PickSelectorClass

# Selector kinds by their public number (also exreplay.PickSelectorClass).
uniform: Final[int]
prioritized: Final[int]
rank: Final[int]
# Largest pick_len a buffer accepts: 2**20.
MAX_PICK_LEN: Final[int]
# Most selectors one buffer holds at once: 1024.
MAX_SELECTORS: Final[int]

# Named fields (docs/api.md, "Named fields and extras"): {name: (shape, dtype)}
# in, {name: array} per field where a buffer has them.
FieldSpec: TypeAlias = Mapping[str, tuple[SupportsIndex | Sequence[SupportsIndex], DTypeLike]]
Fields: TypeAlias = dict[str, NDArray[Any]]

@final
class Batch(
    structseq[Any],
    tuple[
        NDArray[Any],
        NDArray[Any],
        NDArray[Any],
        NDArray[Any],
        NDArray[np.int64],
        NDArray[np.int64],
        NDArray[np.int64],
        NDArray[np.int64],
    ],
):
    """A batch of picks: unpacks as the paper's 8-tuple; `weight`,
    `pick_index`, `extras` and `state_seq` are named-only fields. With a
    state_spec, state and state_next are dicts {name: (B, pick_len, *shape) array}."""

    __match_args__: Final = (
        "state",
        "action",
        "reward",
        "state_next",
        "seq_len",
        "seq_len_next",
        "pick_epi",
        "pick_pos",
    )
    @property
    def state(self) -> NDArray[Any] | Fields: ...
    """(B, pick_len, *state_shape), state_dtype; a dict of fields with a state_spec"""
    @property
    def action(self) -> NDArray[Any]: ...
    """(B, pick_len, *action_shape), action_dtype"""
    @property
    def reward(self) -> NDArray[np.floating[Any]]: ...
    """(B, pick_len), reward_dtype"""
    @property
    def state_next(self) -> NDArray[Any] | Fields: ...
    """(B, pick_len, *state_shape), state_dtype; a dict of fields with a state_spec"""
    @property
    def seq_len(self) -> NDArray[np.int64]: ...
    @property
    def seq_len_next(self) -> NDArray[np.int64]: ...
    @property
    def pick_epi(self) -> NDArray[np.int64]: ...
    @property
    def pick_pos(self) -> NDArray[np.int64]: ...
    @property
    def weight(self) -> NDArray[np.float32]: ...
    @property
    def pick_index(self) -> NDArray[np.int64]: ...
    """(B,) where each pick was in the pick table when drawn (set_priority's batch form)"""
    @property
    def extras(self) -> Fields: ...
    """{name: (B, pick_len, *shape)} per-step extras ({} without an extras_spec)"""
    @property
    def state_seq(self) -> NDArray[Any] | Fields | None: ...
    """(B, pick_len + 1, *state_shape), state_dtype, whose views [:, :pick_len] and [:, 1:]
    are state and state_next (get_batch(shared_next=True)); a dict of fields with a
    state_spec; None in a default batch"""

@final
class EpisodeData(
    structseq[Any],
    tuple[
        NDArray[Any] | Fields,
        NDArray[Any],
        NDArray[np.floating[Any]],
        NDArray[Any] | Fields | None,
        bool,
        bool,
    ],
):
    """A copy of one episode's n steps (from ExperienceReplay.episode); extras
    is a named-only field."""

    __match_args__: Final = ("state", "action", "reward", "final_state", "ended", "terminated")
    @property
    def state(self) -> NDArray[Any] | Fields: ...
    @property
    def action(self) -> NDArray[Any]: ...
    @property
    def reward(self) -> NDArray[np.floating[Any]]: ...
    @property
    def final_state(self) -> NDArray[Any] | Fields | None: ...
    @property
    def ended(self) -> bool: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def extras(self) -> Fields: ...

@final
class PickSelector:
    """A pick selector of an ExperienceReplay; behaves as its int handle.

    Made by ExperienceReplay.new_pick_selector, pick_selector and
    pick_selectors (not instantiable), a new object at every call: objects of
    one selector of one buffer are equal and share its alpha and beta."""

    @property
    def handle(self) -> int: ...
    # an IntEnum member: equal to its int value (docs/api.md, "PickSelector")
    @property
    def kind(self) -> PickSelectorClass: ...
    @property
    def buffer(self) -> ExperienceReplay: ...
    # None on a Uniform selector. alpha is fixed at creation; beta is settable
    # (finite, >= 0) on a Prioritized or Rank selector, for annealing.
    @property
    def alpha(self) -> float | None: ...
    @property
    def beta(self) -> float | None: ...
    @beta.setter
    def beta(self, value: float, /) -> None: ...
    def __index__(self) -> int: ...
    def __int__(self) -> int: ...
    def __hash__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __ne__(self, other: object, /) -> bool: ...

@final
class ExperienceReplay:
    """An experience replay buffer of episodes, drawn from as fixed-length picks."""

    def __new__(
        cls,
        state_shape: SupportsIndex | Sequence[SupportsIndex] | None = None,
        state_dtype: DTypeLike = "float32",
        action_shape: SupportsIndex | Sequence[SupportsIndex] = (),
        action_dtype: DTypeLike = "int64",
        reward_dtype: DTypeLike = "float32",
        capacity: SupportsIndex | None = 1000000,
        pick_len: SupportsIndex = 1,
        allow_short: bool = False,
        eviction: str = "fifo",
        seed: SupportsIndex | None = None,
        log: ExperienceLog | None = None,
        state_spec: FieldSpec | None = None,
        extras_spec: FieldSpec | None = None,
    ) -> ExperienceReplay: ...
    @classmethod
    def for_spaces(
        cls,
        observation_space: Any,
        action_space: Any,
        *,
        reward_dtype: DTypeLike = "float32",
        capacity: SupportsIndex | None = 1000000,
        pick_len: SupportsIndex = 1,
        allow_short: bool = False,
        eviction: str = "fifo",
        seed: SupportsIndex | None = None,
        log: ExperienceLog | None = None,
        extras_spec: FieldSpec | None = None,
    ) -> ExperienceReplay: ...

    # --- the experience log (docs/log.md) ---
    def attach_log(self, log: ExperienceLog, /) -> None: ...
    def detach_log(self) -> ExperienceLog | None: ...
    @property
    def log(self) -> ExperienceLog | None: ...
    @classmethod
    def from_log(cls, path: str | os.PathLike[str], **kwargs: Any) -> ExperienceReplay: ...
    def ingest(self, path: str | os.PathLike[str]) -> int: ...

    # --- recording (GIL released) ---
    def new_episode(self) -> int: ...
    def remove_episode(self, h: SupportsIndex, /) -> None: ...
    def record(
        self,
        h: SupportsIndex | None,
        state: ArrayLike | Mapping[str, ArrayLike],
        action: ArrayLike,
        reward: ArrayLike,
        final_state: ArrayLike | Mapping[str, ArrayLike] | None = None,
        terminated: bool = False,
        priority: float | None = None,
        extras: Mapping[str, ArrayLike] | None = None,
    ) -> int: ...
    def record_many(
        self,
        h: SupportsIndex | None,
        states: ArrayLike | Mapping[str, ArrayLike],
        actions: ArrayLike,
        rewards: ArrayLike,
        final_state: ArrayLike | Mapping[str, ArrayLike] | None = None,
        terminated: bool = False,
        priorities: ArrayLike | None = None,
        extras: Mapping[str, ArrayLike] | None = None,
    ) -> int: ...
    # ends open episode h without a step; False: h was evicted or removed
    def end_episode(
        self,
        h: SupportsIndex,
        final_state: ArrayLike | Mapping[str, ArrayLike] | None = None,
        terminated: bool = False,
    ) -> bool: ...

    # --- selectors ---
    def new_pick_selector(self, kind: SupportsIndex, /, **params: float) -> PickSelector: ...
    def remove_pick_selector(self, ps: SupportsIndex, /) -> None: ...
    # a PickSelector for a selector the buffer holds (a restored buffer's too)
    def pick_selector(self, ps: SupportsIndex, /) -> PickSelector: ...
    def pick_selectors(self) -> list[PickSelector]: ...

    # --- sampling (GIL released) ---
    def get_batch(
        self,
        batch_size: SupportsIndex,
        ps: SupportsIndex,
        out: Batch | None = None,
        *,
        shared_next: bool = False,
    ) -> Batch: ...
    @overload
    def set_priority(
        self,
        ps: SupportsIndex,
        pick_epi: ArrayLike,
        pick_pos: ArrayLike,
        priorities: ArrayLike,
        pick_index: ArrayLike | None = None,
    ) -> int: ...
    @overload
    def set_priority(self, ps: SupportsIndex, batch: Batch, priorities: ArrayLike) -> int: ...

    def priority_stats(self, ps: SupportsIndex, /) -> tuple[float, float, int]: ...
    def stored_priorities(
        self, ps: SupportsIndex, pick_epi: ArrayLike, pick_pos: ArrayLike, /
    ) -> NDArray[np.float64]: ...

    # --- persistence (docs/format.md) ---
    def serialize(self, level: SupportsIndex = 6) -> bytes: ...
    @classmethod
    def unserialize(cls, data: Any, /) -> ExperienceReplay: ...
    def save(
        self,
        path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
        level: SupportsIndex = 6,
        progress: Callable[[int, int], object] | None = None,
    ) -> None: ...
    @classmethod
    def load(
        cls, path: str | bytes | os.PathLike[str] | os.PathLike[bytes], /
    ) -> ExperienceReplay: ...

    # --- introspection ---
    def episode(self, h: SupportsIndex, /) -> EpisodeData: ...
    def __len__(self) -> int: ...
    @property
    def num_episodes(self) -> int: ...
    @property
    def num_picks(self) -> int: ...
    @property
    def state_shape(self) -> tuple[int, ...] | None: ...
    """None with a state_spec"""
    @property
    def state_dtype(self) -> np.dtype[Any] | None: ...
    """None with a state_spec"""
    @property
    def state_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]] | None: ...
    @property
    def extras_spec(self) -> dict[str, tuple[tuple[int, ...], np.dtype[Any]]] | None: ...
    @property
    def action_shape(self) -> tuple[int, ...]: ...
    @property
    def action_dtype(self) -> np.dtype[Any]: ...
    @property
    def reward_dtype(self) -> np.dtype[Any]: ...
    @property
    def capacity(self) -> int | None: ...
    @property
    def pick_len(self) -> int: ...
    @property
    def allow_short(self) -> bool: ...
    @property
    def eviction(self) -> str: ...
    @property
    def seed(self) -> int | None: ...

    # --- test hooks (private; docs/semantics.md "Test hooks") ---
    def _handles(self) -> list[int]: ...
    def _map_probes(self) -> tuple[float, int]: ...
    def _picks(self) -> tuple[NDArray[np.int64], NDArray[np.int64]]: ...
    def _gather(self, ps: SupportsIndex, pick_epi: ArrayLike, pick_pos: ArrayLike, /) -> Batch: ...
    def _priority(
        self, ps: SupportsIndex, pick_epi: ArrayLike, pick_pos: ArrayLike, /
    ) -> NDArray[np.float64]: ...
    def _check(self) -> None: ...

# ExperienceReplay.unserialize (what unpickling calls)
def unserialize(data: Any, /) -> ExperienceReplay: ...

def _raise_status(status: int, op: str, arg: str | None = None, /) -> NoReturn: ...
def _gil_kept() -> int: ...
def _block_hints() -> int: ...
def _drawn_given() -> int: ...
def _set_copy_simd(on: object, /) -> bool: ...
def _crosscore_ns(seconds: float, /) -> float: ...
def _set_stream_min(bytes: SupportsIndex, /) -> int: ...
def _set_unnamed_temp(on: object, /) -> bool: ...
def _set_sync_dir_errno(errnum: int, /) -> int: ...
def _seg_collapse_stats() -> dict[str, int]: ...
def _seg_collapse_enable(on: object, /) -> bool: ...

@overload
def _floor_gather(
    rows: NDArray[Any], starts: ArrayLike, L: SupportsIndex, shared: Literal[False] = ..., /
) -> tuple[NDArray[Any], NDArray[Any]]: ...
@overload
def _floor_gather(
    rows: NDArray[Any], starts: ArrayLike, L: SupportsIndex, shared: Literal[True], /
) -> NDArray[Any]: ...
def _floor_gather_cols(
    cols: list[NDArray[Any]],
    starts: ArrayLike,
    L: SupportsIndex,
    nnext: SupportsIndex,
    out: tuple[list[NDArray[Any]], list[NDArray[Any]]] | None = ...,
    /,
) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]: ...
def _floor_gather_batch(
    records: NDArray[Any],
    starts: ArrayLike,
    L: SupportsIndex,
    ep: SupportsIndex,
    state_bytes: SupportsIndex,
    action_bytes: SupportsIndex,
    /,
) -> tuple[NDArray[Any], ...]: ...
def _adler32(data: bytes | bytearray | memoryview, value: int = ..., /) -> int: ...

@final
class _LogMerge:
    """The k-way merge of experience logs behind exreplay.log.merge (docs/log.md)."""

    def __new__(
        cls,
        inputs: int,
        row: int,
        state_bytes: int,
        chunk_bytes: int,
        level: int,
        fd: int,
        threads: int,
    ) -> _LogMerge: ...
    def push(
        self,
        input: int,
        fd: int,
        body_off: int,
        tag: int,
        codec: int,
        count: int,
        source: int,
        crc: int,
        first: int,
        last: int,
        raw_len: int,
        body_len: int,
        kind: int = 1,
        /,
    ) -> None: ...
    def end(self, input: SupportsIndex, /) -> None: ...
    # index of the input that needs a chunk, -1 when done, -2 on an invalid chunk
    def run(self) -> int: ...
    # (input, tag, what) of an invalid chunk
    def error(self) -> tuple[int, int, str] | None: ...
    # (records, chunks, last timestamp) written
    def result(self) -> tuple[int, int, int]: ...
    def close(self) -> None: ...

@final
class _NewFile:
    """A new file for path, named path by publish() once complete (docs/log.md, "Merging");
    replace=True: over what is at path, as save() replaces its file."""

    def __new__(cls, path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
                replace: bool = False) -> _NewFile: ...
    def fileno(self) -> int: ...
    def publish(self) -> None: ...
    def discard(self) -> None: ...


class ExperienceLog:
    """An append-only, chunked, zlib-compressed file of experience (docs/log.md)."""

    def __new__(
        cls,
        path: str | os.PathLike[str],
        *,
        source: SupportsIndex = 0,
        level: SupportsIndex = 1,
        chunk_bytes: SupportsIndex = 1048576,
        flush_interval: float | None = 1.0,
        fsync: bool = False,
        max_backlog: SupportsIndex = 268435456,
        overwrite: bool = False,
        state_shape: SupportsIndex | Sequence[SupportsIndex] | None = None,
        state_dtype: DTypeLike = "float32",
        action_shape: SupportsIndex | Sequence[SupportsIndex] = (),
        action_dtype: DTypeLike = "int64",
        reward_dtype: DTypeLike = "float32",
    ) -> ExperienceLog: ...
    def append(
        self,
        h: SupportsIndex,
        pos: SupportsIndex,
        state: ArrayLike,
        action: ArrayLike,
        reward: ArrayLike,
        final_state: ArrayLike | None = None,
        terminated: bool = False,
    ) -> None: ...
    def append_many(
        self,
        h: SupportsIndex,
        pos: SupportsIndex,
        states: ArrayLike,
        actions: ArrayLike,
        rewards: ArrayLike,
        final_state: ArrayLike | None = None,
        terminated: bool = False,
    ) -> None: ...
    def end_episode(
        self,
        h: SupportsIndex,
        pos: SupportsIndex,
        final_state: ArrayLike | None = None,
        terminated: bool = False,
    ) -> None: ...
    def flush(self, sync: bool = False) -> None: ...
    def close(self) -> None: ...
    def __enter__(self) -> ExperienceLog: ...
    def __exit__(self, *exc: object) -> bool: ...
    @property
    def stats(self) -> dict[str, Any]: ...
    @property
    def path(self) -> str: ...
    @property
    def source(self) -> int: ...
    @property
    def level(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def attached(self) -> bool: ...
