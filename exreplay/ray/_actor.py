"""The Ray actor class (imported only when Ray is used; see exreplay.ray)."""

import ray

from exreplay.ray import CONCURRENCY_GROUPS, ReplayServer


@ray.remote(concurrency_groups=dict(CONCURRENCY_GROUPS))
class ReplayActor(ReplayServer):
    # Each method runs in its concurrency group: "writers" (record_*),
    # "learner" (get_batch, set_priority, priority_stats), "control" (the rest).
    # Ray assigns groups by the methods defined on this class, hence the
    # explicit overrides.

    @ray.method(concurrency_group="writers")
    def record_many(self, *args, **kwargs):
        return ReplayServer.record_many(self, *args, **kwargs)

    @ray.method(concurrency_group="writers")
    def record_rollout(self, *args, **kwargs):
        return ReplayServer.record_rollout(self, *args, **kwargs)

    @ray.method(concurrency_group="writers")
    def end_stream(self, *args, **kwargs):
        return ReplayServer.end_stream(self, *args, **kwargs)

    @ray.method(concurrency_group="learner")
    def get_batch(self, *args, **kwargs):
        return ReplayServer.get_batch(self, *args, **kwargs)

    @ray.method(concurrency_group="learner")
    def set_priority(self, *args, **kwargs):
        return ReplayServer.set_priority(self, *args, **kwargs)

    @ray.method(concurrency_group="learner")
    def priority_stats(self, *args, **kwargs):
        return ReplayServer.priority_stats(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def new_pick_selector(self, *args, **kwargs):
        return ReplayServer.new_pick_selector(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def selectors(self, *args, **kwargs):
        return ReplayServer.selectors(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def set_beta(self, *args, **kwargs):
        return ReplayServer.set_beta(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def config(self, *args, **kwargs):
        return ReplayServer.config(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def stats(self, *args, **kwargs):
        return ReplayServer.stats(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def buffer(self, *args, **kwargs):
        return ReplayServer.buffer(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def serialize(self, *args, **kwargs):
        return ReplayServer.serialize(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def save(self, *args, **kwargs):
        return ReplayServer.save(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def call(self, *args, **kwargs):
        return ReplayServer.call(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def ping(self, *args, **kwargs):
        return ReplayServer.ping(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def log_info(self, *args, **kwargs):
        return ReplayServer.log_info(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def log_close(self, *args, **kwargs):
        return ReplayServer.log_close(self, *args, **kwargs)

    @ray.method(concurrency_group="control")
    def log_read(self, *args, **kwargs):
        return ReplayServer.log_read(self, *args, **kwargs)



ReplayActor.__doc__ = ReplayServer.__doc__
