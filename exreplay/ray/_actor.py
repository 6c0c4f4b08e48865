"""The Ray actor classes (imported only when Ray is used; see exreplay.ray)."""

import inspect
import os
import threading

import ray

from exreplay.ray import _GROUP_OF, CONCURRENCY_GROUPS, ReplayServer


_thread = threading.local()


def _enter(group: str, nice: int) -> None:
    """On a thread's first call: notes the group it serves (Ray runs each
    concurrency group on threads of its own, so the first method a thread
    runs is one of its group's) and, with nice, lowers the thread's CPU
    priority by that many nice levels (at most to 19). A local call from one
    method to another (a learner calling self.get_batch) leaves the thread
    as it is. Raising one's own niceness needs no privilege; on Linux
    setpriority(PRIO_PROCESS, tid) applies to that thread only."""
    if getattr(_thread, "group", None) is not None:
        return
    _thread.group = group
    if nice:
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except (AttributeError, OSError):  # pragma: no cover - not Linux/POSIX: priorities stay as they are
            pass


def _forward(base, name, group, nice=0):
    def method(self, *args, **kwargs):
        _enter(group, nice)
        return getattr(base, name)(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(base, name).__doc__
    return ray.method(concurrency_group=group)(method)


def replay_actor_class(cls=ReplayServer, default_group: str = "learner", concurrency_groups=None,
                       name: str | None = None, group_nice=None):
    """cls (ReplayServer or a subclass of it) as a threaded Ray actor class.

    ReplayServer's methods run in their concurrency groups ("writers":
    record_*; "learner": get_batch, set_priority, priority_stats; "control":
    the rest); the public methods that a subclass adds run in `default_group`.
    concurrency_groups: {group: threads}, default CONCURRENCY_GROUPS.
    group_nice: {group: n}: the threads of that group lower their own CPU
    priority by n nice levels (at most to 19) at their first call, e.g.
    {"writers": 10} so that on a busy machine the scheduler favours the
    learner's thread over the record calls (docs/ray.md, "CPU priority").
    """
    if not (isinstance(cls, type) and issubclass(cls, ReplayServer)):
        raise TypeError(f"cls: expected ReplayServer or a subclass of it, got {cls!r}")
    groups = dict(CONCURRENCY_GROUPS if concurrency_groups is None else concurrency_groups)
    if default_group not in groups:
        raise ValueError(f"default_group: expected one of {sorted(groups)}, got {default_group!r}")
    nice = dict(group_nice or {})
    for g, n in nice.items():
        if g not in groups or not isinstance(n, int) or isinstance(n, bool) or not 0 <= n <= 39:
            raise ValueError(f"group_nice: expected {{group in {sorted(groups)}: int 0..39}}, got {group_nice!r}")
    names = dict(_GROUP_OF)
    for klass in cls.__mro__:
        if klass is ReplayServer or not issubclass(klass, ReplayServer):
            continue
        for m, v in vars(klass).items():
            # Plain functions only: a staticmethod, classmethod or nested class
            # stays as it is (a forwarder would pass it self).
            if inspect.isfunction(v) and not m.startswith("_") and m not in names:
                names[m] = default_group
    body = {"__doc__": cls.__doc__, "__module__": cls.__module__}
    for m, group in names.items():
        if group not in groups:
            raise ValueError(f"concurrency_groups: expected a group {group!r} (for {m}), got {sorted(groups)}")
        # Ray assigns a concurrency group by the methods defined on the class
        # it wraps, hence an explicit forwarder per method.
        body[m] = _forward(cls, m, group, nice.get(group, 0))
    actor = ray.remote(concurrency_groups=groups)(type(name or cls.__name__, (cls,), body))
    actor.__doc__ = cls.__doc__
    return actor


ReplayActor = replay_actor_class(ReplayServer, name="ReplayActor")
