"""The Ray actor classes (imported only when Ray is used; see exreplay.ray)."""

import ray

from exreplay.ray import _GROUP_OF, CONCURRENCY_GROUPS, ReplayServer


def _forward(base, name, group):
    def method(self, *args, **kwargs):
        return getattr(base, name)(self, *args, **kwargs)

    method.__name__ = name
    method.__doc__ = getattr(base, name).__doc__
    return ray.method(concurrency_group=group)(method)


def replay_actor_class(cls=ReplayServer, default_group: str = "learner", concurrency_groups=None,
                       name: str | None = None):
    """cls (ReplayServer or a subclass of it) as a threaded Ray actor class.

    ReplayServer's methods run in their concurrency groups ("writers":
    record_*; "learner": get_batch, set_priority, priority_stats; "control":
    the rest); the public methods that a subclass adds run in `default_group`.
    concurrency_groups: {group: threads}, default CONCURRENCY_GROUPS.
    """
    if not (isinstance(cls, type) and issubclass(cls, ReplayServer)):
        raise TypeError(f"cls: expected ReplayServer or a subclass of it, got {cls!r}")
    groups = dict(CONCURRENCY_GROUPS if concurrency_groups is None else concurrency_groups)
    if default_group not in groups:
        raise ValueError(f"default_group: expected one of {sorted(groups)}, got {default_group!r}")
    names = dict(_GROUP_OF)
    for klass in cls.__mro__:
        if klass is ReplayServer or not issubclass(klass, ReplayServer):
            continue
        for m, v in vars(klass).items():
            if callable(v) and not m.startswith("_") and m not in names:
                names[m] = default_group
    body = {"__doc__": cls.__doc__, "__module__": cls.__module__}
    for m, group in names.items():
        if group not in groups:
            raise ValueError(f"concurrency_groups: expected a group {group!r} (for {m}), got {sorted(groups)}")
        # Ray assigns a concurrency group by the methods defined on the class
        # it wraps, hence an explicit forwarder per method.
        body[m] = _forward(cls, m, group)
    actor = ray.remote(concurrency_groups=groups)(type(name or cls.__name__, (cls,), body))
    actor.__doc__ = cls.__doc__
    return actor


ReplayActor = replay_actor_class(ReplayServer, name="ReplayActor")
