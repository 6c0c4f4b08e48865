"""Where the learner inside a replay actor loses its time when writers' calls
arrive: a probe for the "learner inside the replay actor" design of
benchmarks/test_bench_ray_cpprb.py, with the same load (4 writer actors, 100-step
rollouts with priorities, 2 in flight each; a learner drawing get_batch(64, 0, 16)
and sending set_priority of 1024 with local calls).

    OPENBLAS_NUM_THREADS=1 python benchmarks/ray_learner_share.py [--rounds N] [--seconds D]
        [--pace F] [--shape small|atari] [--variants base,nice4,nice10+sw500]

Variants (replay actors compared in the same run, their order alternating
between rounds): base = replay_actor_class(Probe); niceN = the same with
group_nice={"writers": N}; swU = sys.setswitchinterval(U microseconds) in the
actor during the learn loop. Each round and variant has four phases: writers
alone (free), learner alone, both, and both with the writers paced at F (0.5)
of their records/s alone. Per phase it prints the rates, the learner thread's
time on a CPU, waiting in the run queue (/proc/self/task/TID/schedstat) and
blocked (the rest: the GIL or a lock), and the cores used by the replay actor's
process, the writer processes, the rest of Ray ("ray" in the command line:
also another cluster on the machine) and everything else (/proc/PID/stat).
Start Ray with RAY_worker_niceness=0 in the environment to run its workers
at nice 0 instead of Ray's default 15.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import ray

T = 100
WRITERS = 4
BATCH = 64
K = 16


def _threads_cpu():
    """{thread name: CPU seconds} of this process (utime + stime from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name = s[s.index("(") + 1:s.rindex(")")]
        fields = s[s.rindex(")") + 2:].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def _machine():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v), v[3] + v[4]  # total, idle + iowait


def _procs():
    """{pid: (CPU seconds, command name)} of every process on the machine."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read(300).replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = st[st.rindex(")") + 2:].split()
        out[int(d)] = ((int(fields[11]) + int(fields[12])) / tick, cmd)
    return out


def _share(p0, p1, wall, actor, writers, me):
    """CPU cores used during a phase by: the replay actor, the writer actors,
    the rest of Ray (raylet, GCS, driver, idle workers) and everything else."""
    cats = {"actor": 0.0, "writers": 0.0, "ray": 0.0, "other": 0.0}
    for pid, (c1, cmd) in p1.items():
        d = c1 - p0.get(pid, (0.0, ""))[0]
        if pid == actor:
            cats["actor"] += d
        elif pid in writers:
            cats["writers"] += d
        elif pid == me or "ray" in cmd:
            cats["ray"] += d
        else:
            cats["other"] += d
    return {k: v / wall for k, v in cats.items()}


def make_classes():
    from exreplay.ray import ReplayServer, replay_actor_class

    class Probe(ReplayServer):
        def pid(self):
            return os.getpid()

        def learn(self, batch, k, seconds, switch=None):
            import sys

            old = sys.getswitchinterval()
            if switch:
                sys.setswitchinterval(switch)
            import threading

            sched = f"/proc/self/task/{threading.get_native_id()}/schedstat"
            s0 = [int(x) for x in open(sched).read().split()]
            th0 = _threads_cpu()
            m0 = _machine()
            c0 = time.thread_time()
            t0 = time.perf_counter()
            t_end = t0 + seconds
            n = 0
            p = np.full(batch * k, 0.5)
            while time.perf_counter() < t_end:
                bs = self.get_batch(batch, 0, k)
                epi = np.concatenate([b.pick_epi for b in bs])
                pos = np.concatenate([b.pick_pos for b in bs])
                idx = np.concatenate([b.pick_index for b in bs])
                self.set_priority(0, epi, pos, p, idx)
                n += k
            wall = time.perf_counter() - t0
            cpu = time.thread_time() - c0
            s1 = [int(x) for x in open(sched).read().split()]
            th1 = _threads_cpu()
            m1 = _machine()
            sys.setswitchinterval(old)
            threads = {k_: (th1.get(k_, 0) - th0.get(k_, 0)) / wall for k_ in th1}
            busy = 1 - (m1[1] - m0[1]) / max(m1[0] - m0[0], 1)
            return dict(n=n, wall=wall, learner_cpu=cpu / wall, runq=(s1[1] - s0[1]) / 1e9 / wall,
                        switches=(s1[2] - s0[2]) / wall, threads=threads, machine_busy=busy)

    @ray.remote(num_cpus=0)
    class Writer:
        def __init__(self, w, shape, dtype):
            rng = np.random.default_rng(w)
            self.s = (rng.integers(0, 256, (T, *shape), dtype=dtype) if np.dtype(dtype).kind == "u"
                      else rng.standard_normal((T, *shape)).astype(dtype))
            self.fin = self.s[0].copy()
            self.a = rng.integers(0, 2, T)
            self.r = np.ones(T, np.float32)
            self.p = rng.random(T) + 0.01
            self.w = w
            self.seq = {}  # per replay actor

        def pid(self):
            return os.getpid()

        def run(self, actor, seconds, rate):
            from exreplay.ray import Rollout

            t0 = time.perf_counter()
            c0 = time.process_time()
            inflight, n, sent = [], 0, 0
            while time.perf_counter() < t0 + seconds:
                ahead = t0 + sent / rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
                sent += T
                if len(inflight) >= 2:
                    done, inflight = ray.wait(inflight, num_returns=1)
                    n += sum(ray.get(done))
                ro = Rollout(self.s, self.a, self.r, self.p, ends=[T - 1], final_states=self.fin[None],
                             terminated=[False])
                key = actor._actor_id.hex()
                seq = self.seq.get(key, 0)
                inflight.append(actor.record_rollout.remote(self.w, ro, seq))
                self.seq[key] = seq + 1
            n += sum(ray.get(inflight))
            return n, (time.process_time() - c0) / (time.perf_counter() - t0)

    return Probe, Writer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pace", type=float, default=0.5, help="paced phase: the writers offer this fraction of "
                    "the records/s they got alone in the round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--switch", type=float, default=None)
    ap.add_argument("--variants", default="base,nice10", help="replay actors to compare in the same run: "
                    "base = replay_actor_class(Probe); niceN = the same with group_nice={'writers': N}; "
                    "swU = switch interval U us in "
                    "the actor during learn; combine with +, e.g. nice4+sw500")
    ap.add_argument("--shape", default="small")
    ap.add_argument("--capacity", type=int, default=20_000)
    a = ap.parse_args()
    shape, dtype = {"small": ((4,), "float32"), "atari": ((84, 84), "uint8")}[a.shape]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    from exreplay.ray import replay_actor_class

    Probe, Writer = make_classes()
    actors = {}
    switch = {}
    for v in a.variants.split(","):
        parts = dict((x.rstrip("0123456789"), x[len(x.rstrip("0123456789")):]) for x in v.split("+"))
        gn = {"writers": int(parts["nice"])} if "nice" in parts else None
        switch[v] = int(parts["sw"]) * 1e-6 if "sw" in parts else a.switch
        actors[v] = replay_actor_class(Probe, group_nice=gn, name=f"Probe_{v}").options(num_cpus=0).remote(
            state_shape=shape, state_dtype=dtype, capacity=a.capacity, pick_len=1, seed=0,
            selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})])
    writers = [Writer.remote(w, shape, dtype) for w in range(WRITERS)]
    wpids = set(ray.get([w.pid.remote() for w in writers]))
    for v, actor in actors.items():
        ray.get([w.run.remote(actor, 1.0, 1e9) for w in writers])  # fill
        ray.get(actor.learn.remote(BATCH, K, 0.5))
    D = a.seconds
    rows = {v: [] for v in actors}
    for rnd in range(a.rounds):
        for v in (list(actors) if rnd % 2 == 0 else list(actors)[::-1]):
            _round(a, rnd, v, actors[v], writers, wpids, rows[v], D, switch[v])
    for v, rs in rows.items():
        m = np.median(np.array(rs), axis=0)
        print(f"{v}: median over {a.rounds} rounds: together/alone records {m[0]:.2f}x, minibatches {m[1]:.2f}x; "
              f"paced minibatches {m[2]:.2f}x; load {os.getloadavg()[0]:.1f}", flush=True)
    ray.shutdown()


def _round(a, rnd, v, actor, writers, wpids, rows, D, switch):
    apid = ray.get(actor.pid.remote())

    def phase(rate, learn):
        p0 = _procs()
        t0 = time.perf_counter()
        jobs = [] if rate == 0 else [w.run.remote(actor, D, rate / WRITERS) for w in writers]
        lr = ray.get(actor.learn.remote(BATCH, K, D, switch)) if learn else None
        wout = ray.get(jobs)
        wall = time.perf_counter() - t0
        cpu = _share(p0, _procs(), wall, apid, wpids, os.getpid())
        return dict(rec=sum(x[0] for x in wout) / wall, mb=None if lr is None else lr["n"] / lr["wall"],
                    learner=lr, cpu=cpu)

    def show(name, r):
        c = r["cpu"]
        msg = f"  {name:9s} records {r['rec']:9,.0f}/s"
        if r["mb"] is not None:
            lr = r["learner"]
            msg += (f" minibatches {r['mb']:8,.0f}/s (learner thread: cpu {lr['learner_cpu']:.2f}, runqueue "
                    f"{lr['runq']:.2f}, other {1 - lr['learner_cpu'] - lr['runq']:.2f})")
        msg += (f"; cores: actor {c['actor']:.2f} writers {c['writers']:.2f} ray {c['ray']:.2f} "
                f"other {c['other']:.2f}")
        print(msg, flush=True)

    w = phase(1e9, False)
    lo = phase(0, True)
    both = phase(1e9, True)
    paced = phase(a.pace * w["rec"], True)
    print(f"{v} round {rnd} (load {os.getloadavg()[0]:.1f}): together/alone records {both['rec'] / w['rec']:.2f}x, "
          f"minibatches {both['mb'] / lo['mb']:.2f}x; paced at {a.pace:g}: records got "
          f"{paced['rec'] / (a.pace * w['rec']):.2f} of offered, minibatches {paced['mb'] / lo['mb']:.2f}x")
    for name, r in (("writers", w), ("learner", lo), ("together", both), ("paced", paced)):
        show(name, r)
    rows.append((both["rec"] / w["rec"], both["mb"] / lo["mb"], paced["mb"] / lo["mb"]))


if __name__ == "__main__":
    main()
