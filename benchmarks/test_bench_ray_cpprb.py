"""Ray: exreplay's ReplayActor against what an Ape-X user would write otherwise.

The actors below on one local Ray cluster (ray.init(num_cpus=2)), the same load,
the same run, one after the other:

- "exreplay_local" (and "exreplay_local_nice", the same with
  group_nice={"writers": 4}): the learner inside the replay actor;
- "exreplay": exreplay.ray.ReplayActor (writers and learner in their own
  concurrency groups; the buffer records and samples with the GIL released);
- "cpprb": a plain Ray actor (one thread) holding cpprb's
  PrioritizedReplayBuffer (next_of="obs" for frames, as cpprb recommends);
- "floor": an actor that receives the same rollouts and returns ready-made
  batches of the same shapes, with no replay at all: what Ray's per-call cost
  alone allows (the "Ray floor").

Load: 4 writer actors send 100-step rollouts with priorities (2 in flight
each); one learner task draws 16 minibatches of 64 per call and sends their
1024 priorities back in one call (2 in flight). Two state shapes: (4,)
float32 and 84x84 uint8 frames. pick_len 1 (cpprb stores 1-step transitions).
Each round has four phases per actor: writers alone, learner alone, both at
full speed, and both with the writers paced at PACE (half) of the records/s
they got alone in that round, as actors bound by their environments would
send. Each phase runs D seconds (3 s; quick 0.3 s); the rates are what the
writers and the learner got acknowledged (client side, the same count for
every actor). Nothing asserts on a time.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
import pytest

import harness

if os.environ.get("EXREPLAY_ASAN"):
    pytest.skip("Ray benchmarks do not run under ASan", allow_module_level=True)

ray = pytest.importorskip("ray")
cpprb = pytest.importorskip("cpprb")

T = 100
WRITERS = 4
BATCH = 64
K = 16
SHAPES = {"small": ((4,), "float32"), "atari": ((84, 84), "uint8")}
# The section this module writes at the end of docs/benchmarks_ray.md
# (test_bench_ray.py writes the file's head and keeps this section).
SECTION = "## Against a cpprb actor and the Ray floor"
# The paced phase offers the writers this fraction of the records/s they got
# alone in the same round.
PACE = float(os.environ.get("EXREPLAY_RAY_PACE", "0.5"))
RESULTS: dict = {}
NAMES = {"exreplay_local": "exreplay, learner inside the replay actor",
         "exreplay_local_nice": "exreplay, learner inside the replay actor, writers group at +4 nice",
         "exreplay": "exreplay ReplayActor, learner in its own process",
         "cpprb": "cpprb PrioritizedReplayBuffer in a plain actor", "floor": "Ray floor (no replay)"}


def _capacity(shape):
    if harness.quick():
        return 2_000
    return 200_000 if shape == "small" else 20_000


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def _actors():
    """Actor classes (defined here so that Ray pickles them by value)."""

    @ray.remote(num_cpus=0)
    class CpprbActor:
        def __init__(self, shape, dtype, capacity):
            import cpprb as _cpprb

            env = {"obs": {"shape": shape, "dtype": np.dtype(dtype)}, "act": {"dtype": np.int64},
                   "rew": {}, "done": {}}
            kw = dict(next_of="obs") if len(shape) > 1 else {}
            if not kw:
                env["next_obs"] = {"shape": shape, "dtype": np.dtype(dtype)}
            self.rb = _cpprb.PrioritizedReplayBuffer(capacity, env, alpha=0.6, **kw)
            self.frames = len(shape) > 1

        def record(self, w, states, actions, rewards, prios, final):
            if self.frames:
                self.rb.add(obs=states, act=actions, rew=rewards, next_obs=np.concatenate([states[1:], final[None]]),
                            done=np.zeros(len(states)), priorities=prios)
                self.rb.on_episode_end()
            else:
                self.rb.add(obs=states, act=actions, rew=rewards, next_obs=np.concatenate([states[1:], final[None]]),
                            done=np.zeros(len(states)), priorities=prios)
            return len(states)

        def sample(self, batch, k):
            # One dict of batch*k rows (one block per field); the learner splits it.
            return self.rb.sample(batch * k, beta=0.4)

        def update(self, idx, prios):
            self.rb.update_priorities(idx, prios)
            return len(idx)

        def size(self):
            return self.rb.get_stored_size()

    @ray.remote(num_cpus=0)
    class FloorActor:
        """Receives rollouts, returns ready-made batches: no replay."""

        def __init__(self, shape, dtype, capacity):
            rng = np.random.default_rng(0)
            B = BATCH * K
            if np.dtype(dtype).kind == "u":
                st = rng.integers(0, 256, (B, 1, *shape), dtype=dtype)
            else:
                st = rng.standard_normal((B, 1, *shape)).astype(dtype)
            self.fields = dict(state=st, action=np.zeros((B, 1), np.int64), reward=np.zeros((B, 1), np.float32),
                               state_next=st.copy(), seq_len=np.ones(B, np.int64), seq_len_next=np.ones(B, np.int64),
                               pick_epi=np.arange(B), pick_pos=np.zeros(B, np.int64), weight=np.ones(B, np.float32))

        def record(self, w, states, actions, rewards, prios, final):
            return len(states)

        def sample(self, batch, k):
            return self.fields

        def update(self, idx, prios):
            return len(idx)

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, w, shape, dtype):
            rng = np.random.default_rng(w)
            if np.dtype(dtype).kind == "u":
                self.s = rng.integers(0, 256, (T, *shape), dtype=dtype)
                self.fin = rng.integers(0, 256, shape, dtype=dtype)
            else:
                self.s = rng.standard_normal((T, *shape)).astype(dtype)
                self.fin = rng.standard_normal(shape).astype(dtype)
            self.a = rng.integers(0, 2, T)
            self.r = np.ones(T, np.float32)
            self.p = rng.random(T) + 0.01
            self.w = w
            self.seq = {}  # per replay (each exreplay actor numbers this stream's rollouts itself)

        def run(self, kind, actor, seconds, rate=None):
            """Sends rollouts for `seconds`: as fast as acknowledged (2 in
            flight), or, with `rate` (records/s), no faster than that pace."""
            from exreplay.ray import Rollout

            t0 = time.perf_counter()
            t_end = t0 + seconds
            inflight, n, sent = [], 0, 0
            while time.perf_counter() < t_end:
                if rate is not None:
                    ahead = t0 + sent / rate - time.perf_counter()
                    if ahead > 0:
                        time.sleep(ahead)
                    sent += T
                if len(inflight) >= 2:
                    done, inflight = ray.wait(inflight, num_returns=1)
                    n += sum(ray.get(done))
                if kind.startswith("exreplay"):
                    ro = Rollout(self.s, self.a, self.r, self.p, ends=[T - 1], final_states=self.fin[None],
                                 terminated=[False])
                    seq = self.seq.get(kind, 0)
                    inflight.append(actor.record_rollout.remote(self.w, ro, seq))
                    self.seq[kind] = seq + 1
                else:
                    inflight.append(actor.record.remote(self.w, self.s, self.a, self.r, self.p, self.fin))
            n += sum(ray.get(inflight))
            return n

    @ray.remote(num_cpus=0)
    def learner(kind, actor, seconds):
        if kind.startswith("exreplay_local"):
            return ray.get(actor.learn.remote(BATCH, K, seconds))
        t_end = time.perf_counter() + seconds
        n, pending = 0, []
        p = np.full(BATCH * K, 0.5)
        while time.perf_counter() < t_end:
            if kind == "exreplay":
                bs = ray.get(actor.get_batch.remote(BATCH, 0, K))
                epi = np.concatenate([b.pick_epi for b in bs])
                pos = np.concatenate([b.pick_pos for b in bs])
                idx = np.concatenate([b.pick_index for b in bs])
                pending.append(actor.set_priority.remote(0, epi, pos, p, idx))
            else:
                s = ray.get(actor.sample.remote(BATCH, K))
                bs = [{f: v[i * BATCH:(i + 1) * BATCH] for f, v in s.items()} for i in range(K)]
                idx = np.concatenate([b["indexes"] for b in bs]) if "indexes" in bs[0] else \
                    np.concatenate([b["pick_epi"] for b in bs])
                pending.append(actor.update.remote(idx, p))
            if len(pending) > 2:
                ray.get(pending.pop(0))
            n += K
        ray.get(pending)
        return n

    from exreplay.ray import ReplayServer, replay_actor_class

    class LocalLearner(ReplayServer):
        """The learner inside the replay's process: it draws with local calls
        while the writers' record_rollout calls arrive in their concurrency group."""

        def learn(self, batch, k, seconds):
            t_end = time.perf_counter() + seconds
            n = 0
            p = np.full(batch * k, 0.5)
            while time.perf_counter() < t_end:
                bs = self.get_batch(batch, 0, k)
                epi = np.concatenate([b.pick_epi for b in bs])
                pos = np.concatenate([b.pick_pos for b in bs])
                idx = np.concatenate([b.pick_index for b in bs])
                self.set_priority(0, epi, pos, p, idx)
                n += k
            return n

    # The same learner with the "writers" group's threads 4 nice levels below
    # the learner's (docs/ray.md, "CPU priority").
    nice = replay_actor_class(LocalLearner, group_nice={"writers": 4}, name="LocalLearnerNice")
    return CpprbActor, FloorActor, Writer, learner, replay_actor_class(LocalLearner), nice


def _fill(kind, actor, writers, cap):
    """Records until the buffer is full (so that recording evicts)."""
    n = 0
    while n < cap:
        n += sum(ray.get([w.run.remote(kind, actor, 0.2) for w in writers]))


@pytest.mark.parametrize("shape", ["small", "atari"])
def test_replay_actor_vs_cpprb_actor(cluster, shape):
    if harness.quick() and shape == "atari":
        pytest.skip("the frames run in the full benchmark only (the quick run keeps the small shape as a smoke test)")
    from exreplay.ray import ReplayActor

    CpprbActor, FloorActor, Writer, learner, LocalLearner, LocalLearnerNice = _actors()
    st_shape, dtype = SHAPES[shape]
    cap = _capacity(shape)
    D = 0.3 if harness.quick() else 3.0
    actors = {
        "exreplay": ReplayActor.options(num_cpus=0).remote(
            state_shape=st_shape, state_dtype=dtype, capacity=cap, pick_len=1, seed=0,
            selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})]),
        "exreplay_local": LocalLearner.options(num_cpus=0).remote(
            state_shape=st_shape, state_dtype=dtype, capacity=cap, pick_len=1, seed=0,
            selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})]),
        "exreplay_local_nice": LocalLearnerNice.options(num_cpus=0).remote(
            state_shape=st_shape, state_dtype=dtype, capacity=cap, pick_len=1, seed=0,
            selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})]),
        "cpprb": CpprbActor.remote(st_shape, dtype, cap),
        "floor": FloorActor.remote(st_shape, dtype, cap),
    }
    writers = [Writer.remote(w, st_shape, dtype) for w in range(WRITERS)]
    ray.get([w.__ray_ready__.remote() for w in writers])
    for kind, actor in actors.items():
        _fill(kind, actor, writers, cap)
        ray.get(learner.remote(kind, actor, 0.2))  # warm-up
    rounds = 1 if harness.quick() else int(os.environ.get("EXREPLAY_RAY_ROUNDS", "3"))
    runs = {kind: [] for kind in actors}
    order = list(actors)
    for rnd in range(rounds):
        # Alternate the order so that a slow spell of the shared machine does not
        # fall on one actor only; each quoted figure is the median over the rounds.
        for kind in (order if rnd % 2 == 0 else order[::-1]):
            actor = actors[kind]
            t0 = time.perf_counter()
            rec_alone = sum(ray.get([w.run.remote(kind, actor, D) for w in writers])) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            mb_alone = ray.get(learner.remote(kind, actor, D)) / (time.perf_counter() - t0)
            t0 = time.perf_counter()
            jobs = [w.run.remote(kind, actor, D) for w in writers] + [learner.remote(kind, actor, D)]
            out = ray.get(jobs)
            dt = time.perf_counter() - t0
            # The writers paced at PACE of what they got alone (actors bound by
            # their environments, not by the replay), with the learner running.
            offered = PACE * rec_alone
            t0 = time.perf_counter()
            jobs = [w.run.remote(kind, actor, D, offered / WRITERS) for w in writers] + [learner.remote(kind, actor, D)]
            paced = ray.get(jobs)
            dtp = time.perf_counter() - t0
            runs[kind].append(dict(records_alone=rec_alone, minibatches_alone=mb_alone,
                                   records=sum(out[:-1]) / dt, minibatches=out[-1] / dt, offered=offered,
                                   records_paced=sum(paced[:-1]) / dtp, minibatches_paced=paced[-1] / dtp))
    for w in writers:
        ray.kill(w)
    for actor in actors.values():
        ray.kill(actor)
    load = os.getloadavg()[0]
    RESULTS[shape] = dict(capacity=cap, phase_s=D, rounds=rounds, load_avg=load, runs=runs)
    res = {kind: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for kind, rs in runs.items()}
    for kind, r in res.items():
        print(f"\n{shape} {kind:14s}: paced writers offered {r['offered']:,.0f} records/s got {r['records_paced']:,.0f}; "
              f"learner {r['minibatches_paced']:,.0f} minibatches/s ({r['minibatches_paced'] / r['minibatches_alone']:.2f}x alone)")
        harness.add_custom("ray_vs_cpprb", shape=shape, actor=kind, capacity=cap, phase_s=D, rounds=rounds,
                           load_avg=load, **r)
        print(f"\n{shape} {kind:14s}: alone {r['records_alone']:,.0f} records/s, {r['minibatches_alone']:,.0f} "
              f"minibatches/s; together {r['records']:,.0f} records/s + {r['minibatches']:,.0f} minibatches/s")
    e, c, f = res["exreplay"], res["cpprb"], res["floor"]
    lo = res["exreplay_local"]
    print(f"{shape} (medians of {rounds} rounds, load average {load:.1f}):")
    print(f"{shape}: exreplay_local/cpprb records {lo['records'] / c['records']:.2f}x, minibatches "
          f"{lo['minibatches'] / c['minibatches']:.2f}x; together/alone records "
          f"{lo['records'] / lo['records_alone']:.2f}x, minibatches {lo['minibatches'] / lo['minibatches_alone']:.2f}x")
    print(f"{shape}: exreplay/cpprb records {e['records'] / c['records']:.2f}x, minibatches "
          f"{e['minibatches'] / c['minibatches']:.2f}x; floor/exreplay minibatches "
          f"{f['minibatches'] / e['minibatches']:.2f}x, records {f['records'] / e['records']:.2f}x; "
          f"exreplay together/alone records {e['records'] / e['records_alone']:.2f}x, minibatches "
          f"{e['minibatches'] / e['minibatches_alone']:.2f}x")


def _section(results):
    L = [SECTION, "",
         "Written by `benchmarks/test_bench_ray_cpprb.py`. The same load for every actor, in the same run: 4 "
         "writer actors send 100-step rollouts with priorities (2 calls in flight each); one learner draws 16 "
         "minibatches of 64 per call and sends their 1024 priorities back in one call. Prioritized selection "
         "(alpha 0.6, beta 0.4), pick_len 1, buffer filled to capacity first (so every record evicts). Each "
         "round measures every actor in turn (writers alone, learner alone, both; the order alternates between "
         "rounds), then both again with the writers paced at half of their records/s alone; the figures are "
         "medians over the rounds.",
         "",
         "- *exreplay, learner inside the replay actor*: `replay_actor_class(Learner)`, a `ReplayServer` "
         "subclass whose `learn` method (concurrency group \"learner\") draws with local `get_batch(64, 0, 16)` "
         "and `set_priority` calls while the writers' `record_rollout` calls run in the \"writers\" group.",
         "- *... writers group at +4 nice*: the same actor built with `group_nice={\"writers\": 4}`: the "
         "writers group's threads run 4 nice levels below the learner's (docs/ray.md, \"CPU priority\").",
         "- *exreplay ReplayActor*: the learner is a separate Ray task that calls `get_batch.remote(64, 0, 16)`, "
         "then `set_priority.remote`.",
         "- *cpprb*: a plain (single-threaded) Ray actor holding `cpprb.PrioritizedReplayBuffer` "
         "(`next_of=\"obs\"` for frames); its `sample` returns one `sample(1024)` dict, split into 16 views "
         "by the learner.",
         "- *Ray floor*: an actor that takes the same rollouts and returns a ready-made batch of the same "
         "arrays, with no replay: what Ray's per-call cost alone allows a separate learner.",
         ""]
    for shape, r in results.items():
        st, dt = SHAPES[shape]
        med = {k: {f: float(np.median([x[f] for x in rs])) for f in rs[0]} for k, rs in r["runs"].items()}
        L += [f"**{st} {dt}**, capacity {r['capacity']:,}, {r['rounds']} rounds of {r['phase_s']} s phases, "
              f"load average {r['load_avg']:.1f} at the end (2 CPUs, shared).", "",
              "| actor | records/s alone | minibatches/s alone | records/s together | minibatches/s together "
              "| together / alone (records, minibatches) |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for k, m in med.items():
            L.append(f"| {NAMES.get(k, k)} | {m['records_alone']:,.0f} | {m['minibatches_alone']:,.0f} | "
                     f"{m['records']:,.0f} | {m['minibatches']:,.0f} | {m['records'] / m['records_alone']:.2f}x, "
                     f"{m['minibatches'] / m['minibatches_alone']:.2f}x |")
        L += ["", f"The same actors with the writers paced at {PACE:g} of their records/s alone (offered per round; "
              "the learner unpaced):", "",
              "| actor | records/s offered | records/s got | minibatches/s | minibatches/s with the paced writers / alone |",
              "| --- | ---: | ---: | ---: | ---: |"]
        for k, m in med.items():
            if "offered" in m:
                L.append(f"| {NAMES.get(k, k)} | {m['offered']:,.0f} | {m['records_paced']:,.0f} | "
                         f"{m['minibatches_paced']:,.0f} | {m['minibatches_paced'] / m['minibatches_alone']:.2f}x |")
        c, f = med["cpprb"], med["floor"]
        L.append("")
        for k in ("exreplay_local", "exreplay_local_nice", "exreplay"):
            if k in med:
                m = med[k]
                L.append(f"- {NAMES[k]} against cpprb, together: {m['records'] / c['records']:.2f}x the records/s, "
                         f"{m['minibatches'] / c['minibatches']:.2f}x the minibatches/s; the Ray floor gets "
                         f"{f['minibatches'] / m['minibatches']:.2f}x its minibatches/s.")
        L.append("")
    return "\n".join(L)


def test_write_ray_cpprb_section():
    """Writes ray_cpprb.json and the section of benchmarks_ray.md (runs last in this module)."""
    if not RESULTS:
        pytest.skip("nothing measured")
    out_json, out_md = harness.ray_report_paths("ray_cpprb.json")
    with open(out_json, "w") as fh:
        json.dump(dict(RESULTS, ray=ray.__version__), fh, indent=1)
    text = open(out_md).read() if os.path.exists(out_md) else "# Ray benchmarks (exreplay.ray)\n"
    i = text.find(SECTION)
    head = (text[:i] if i >= 0 else text).rstrip("\n")
    with open(out_md, "w") as fh:
        fh.write(head + "\n\n" + _section(RESULTS))
