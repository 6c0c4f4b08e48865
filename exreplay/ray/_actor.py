"""The Ray actor classes (imported only when Ray is used; see exreplay.ray)."""

import inspect
import os
import threading
from collections.abc import Mapping

import ray

from exreplay._args import int_arg, type_name
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


def _group_keys(arg: str, d, groups) -> None:
    """The keys of d (arg, a dict {group: ...}): group names (str), and with
    groups (the known ones) one of them."""
    among = "" if groups is None else f", among {sorted(groups)}"
    for g in d:
        if not isinstance(g, str):
            raise TypeError(f"{arg}: expected group names (str) as keys{among}, got a key of type "
                            f"{type_name(g)}")
        if groups is not None and g not in groups:
            raise ValueError(f"{arg}: expected group names (str) as keys{among}, got {g!r}")


def _class_args(cls, default_group, concurrency_groups, name, group_nice):
    """replay_actor_class's arguments checked before a class is built:
    (groups {name: threads}, nice {name: levels}). A wrong type is a
    TypeError naming the argument (the key or value) and the type, a wrong
    value a ValueError: group_nice={"writers": 2.5}, [("writers", 3)] or
    "writers" were ValueErrors showing the value, or taken as a dict."""
    if not (isinstance(cls, type) and issubclass(cls, ReplayServer)):
        got = f"the class {cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else type_name(cls)
        raise TypeError(f"cls: expected ReplayServer or a subclass of it, got {got}")
    if concurrency_groups is None:
        groups = dict(CONCURRENCY_GROUPS)
    else:
        if not isinstance(concurrency_groups, Mapping):
            raise TypeError(f"concurrency_groups: expected None or a dict {{group: threads}}, got "
                            f"{type_name(concurrency_groups)}")
        _group_keys("concurrency_groups", concurrency_groups, None)
        groups = {g: int_arg(f"concurrency_groups[{g!r}]", k, 1, None, "an int >= 1 (threads)")
                  for g, k in concurrency_groups.items()}
    if not isinstance(default_group, str):
        raise TypeError(f"default_group: expected one of {sorted(groups)}, got {type_name(default_group)}")
    if default_group not in groups:
        raise ValueError(f"default_group: expected one of {sorted(groups)}, got {default_group!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name: expected None or a class name (str), got {type_name(name)}")
    if name == "":
        raise ValueError("name: expected None or a class name (str), got ''")
    if group_nice is None:
        return groups, {}
    if not isinstance(group_nice, Mapping):
        raise TypeError(f"group_nice: expected None or a dict {{group: nice levels}}, got "
                        f"{type_name(group_nice)}")
    _group_keys("group_nice", group_nice, groups)
    return groups, {g: int_arg(f"group_nice[{g!r}]", n, 0, 39, "an int in [0, 39] (nice levels)")
                    for g, n in group_nice.items()}


def replay_actor_class(cls=ReplayServer, default_group: str = "learner", concurrency_groups=None,
                       name: str | None = None, group_nice=None):
    """cls (ReplayServer or a subclass of it) as a threaded Ray actor class.

    ReplayServer's methods run in their concurrency groups ("writers":
    record_*; "learner": get_batch, set_priority, priority_stats; "control":
    the rest); the public methods that a subclass adds run in `default_group`.
    concurrency_groups: {group: threads (an int >= 1)}, default
    CONCURRENCY_GROUPS. name: the class's name (None: cls's).
    group_nice: None or a dict {group: n}, n an int in [0, 39]: the threads
    of that group lower their own CPU priority by n nice levels (at most to
    19) at their first call, e.g. {"writers": 10} so that on a busy machine
    the scheduler favours the learner's thread over the record calls
    (docs/ray.md, "CPU priority").

    Every argument is checked before the class is built: a wrong type (a
    list of pairs for a dict, a float or a bool for a count, a key that is
    no str) is a TypeError naming the argument, or its key as
    group_nice['writers'], and the type; a wrong value (an unknown group, a
    count out of range) a ValueError.
    """
    groups, nice = _class_args(cls, default_group, concurrency_groups, name, group_nice)
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
