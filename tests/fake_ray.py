"""Stand-ins for the parts of Ray that exreplay.ray's ShardedReplay and
ReplayServer callers use, for tests that run shards in this process with no
Ray cluster: replace `exreplay.ray._ray` with `lambda: FakeRay`, and give
ShardedReplay `Local(server)` objects (or objects of your own built from
Method and Ref) as its actors."""


class Ref:
    """A call's result, ready at once."""

    def __init__(self, value):
        self.value = value


class FakeRay:
    """What ShardedReplay asks of the ray module, for shards that answer at once."""

    @staticmethod
    def get(refs, timeout=None):
        return [r.value for r in refs] if isinstance(refs, list) else refs.value

    @staticmethod
    def wait(refs, num_returns=1, timeout=None):
        return list(refs), []


class Method:
    """An actor method: .remote(...) calls fn."""

    def __init__(self, fn):
        self.remote = fn


class Local:
    """A ReplayActor's stand-in: server.f(...) run at once for .f.remote(...)."""

    def __init__(self, server):
        self.server = server

    def __getattr__(self, name):
        f = getattr(self.server, name)
        return Method(lambda *a, **k: Ref(f(*a, **k)))
