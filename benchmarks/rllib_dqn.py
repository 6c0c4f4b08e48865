"""exreplay's RLlib buffer against RLlib's own, in RLlib's DQN and alone (make bench-rllib).

Two parts, both written to benchmarks/results/rllib.json and summarised by
benchmarks/report.py in docs/benchmarks.md (section "RLlib"):

1. Learning.  ``exreplay.examples.rllib_dqn.run`` trains RLlib's DQN on
   CartPole-v1 (RLlib's tuned configuration) once per (buffer, seed), each
   run in its own process, with ``exreplay.rllib.PrioritizedEpisodeReplayBuffer``
   and with RLlib's ``PrioritizedEpisodeReplayBuffer``: same seeds, same
   budget (30,000 environment steps, no early stop, by default).  Recorded per run: the mean return after each
   training iteration against environment steps, and the time spent in the
   buffer's ``add``, ``sample`` and ``update_priorities`` per iteration.

2. Replay calls alone, on the same episodes: both buffers hold the same
   CartPole-shaped episodes (observations (4,) float32, 200-step episodes,
   capacity 50,000); each call of DQN's pattern (``sample(32, n_step=(2, 5),
   beta=0.4)``, ``update_priorities``, ``add`` of a 5-step fragment) is
   timed many times, medians reported.  The floor: RLlib wants a list of
   32 ``SingleAgentEpisode`` objects back from ``sample``, so building those
   objects from ready arrays (exactly what the adapter builds, nothing
   else) is timed on its own; no buffer can sample faster than that.

    python benchmarks/rllib_dqn.py                       # seeds 0-4, 30k env steps each, both parts (about an hour here)
    python benchmarks/rllib_dqn.py --seeds 0 --skip-learning
    python benchmarks/rllib_dqn.py --reuse DIR           # take learning runs from DIR/{exreplay,rllib}_S.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BUFFERS = ("exreplay", "rllib")


# --------------------------------------------------------------- learning


def learning_run(buffer, seed, goal, max_steps, out_json):
    cmd = [sys.executable, "-m", "exreplay.examples.rllib_dqn", "--buffer", buffer, "--seed", str(seed),
           "--goal", str(goal), "--max-steps", str(max_steps), "--json", out_json]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=False)
    with open(out_json) as f:
        return json.load(f)


def summarise_run(r):
    curve = r["curve"]
    per_iter = [row["add_s"] + row["sample_s"] + row["update_priorities_s"] for row in curve]
    learn_iters = [p for p, row in zip(per_iter, curve) if row["sample_s"] > 0]
    return {
        "buffer": r["buffer"],
        "seed": r["seed"],
        "reached_at_env_steps": r["reached_at_env_steps"],
        "iterations": r["iterations"],
        "wall_s": r["wall_s"],
        "buffer_s": r["buffer_s"],
        "buffer_calls": r["buffer_calls"],
        "replay_ms_per_iter_median": 1000 * statistics.median(learn_iters) if learn_iters else None,
        "iter_s_median": statistics.median(row["iter_s"] for row in curve),
        "curve": [(row["env_steps"], row["return_mean"]) for row in curve],
    }


def _first_at(curve, target):
    """Environment steps at the first iteration whose mean return reached target (None: never)."""
    for steps, ret in curve:
        if ret == ret and ret >= target:
            return steps
    return None


def _mean_std(v):
    v = [x for x in v if x is not None]
    if not v:
        return None, None, 0
    return statistics.mean(v), (statistics.stdev(v) if len(v) > 1 else 0.0), len(v)


def _permutation_p(a, b):
    """Two-sided exact permutation test of the difference of means of a and b."""
    from itertools import combinations

    pooled = list(a) + list(b)
    k = len(a)
    obs = abs(statistics.mean(a) - statistics.mean(b))
    total = hits = 0
    for idx in combinations(range(len(pooled)), k):
        sa = [pooled[i] for i in idx]
        sb = [pooled[i] for i in range(len(pooled)) if i not in idx]
        total += 1
        hits += abs(statistics.mean(sa) - statistics.mean(sb)) >= obs - 1e-12
    return hits / total


def learning_summary(runs, target):
    """Per buffer over its seeds: the return curve (mean, std) at every 5,000 env steps,
    the mean return over the whole run (area under the curve, per run), the first
    env steps at which the target was reached; and the permutation test of the
    difference in mean return between the buffers."""
    out = {"target": target, "buffers": {}}
    by = {}
    for r in runs:
        by.setdefault(r["buffer"], []).append(r)
    budget = min(r["curve"][-1][0] for r in runs) if runs else 0
    marks = list(range(5000, budget + 1, 5000))
    for name, rs in by.items():
        curves = [dict(r["curve"]) for r in rs]
        auc = [statistics.mean(ret for st, ret in r["curve"] if st <= budget) for r in rs]
        first = [_first_at(r["curve"], target) for r in rs]
        out["buffers"][name] = {
            "seeds": [r["seed"] for r in rs],
            "curve": [(m,) + _mean_std([c.get(m) for c in curves])[:2] for m in marks],
            "auc": auc,
            "auc_mean_std": _mean_std(auc)[:2],
            "first_at_target": first,
            "first_mean_std_n": _mean_std(first),
        }
    if len(by) == 2:
        a, b = (out["buffers"][k]["auc"] for k in BUFFERS)
        out["auc_diff"] = statistics.mean(a) - statistics.mean(b)
        out["auc_p"] = _permutation_p(a, b)
    out["budget"] = budget
    return out


# ------------------------------------------------------------ calls alone


def _cartpole_episodes(rng, count, length=200, start_id=0):
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    out = []
    for i in range(count):
        obs = rng.standard_normal((length + 1, 4)).astype(np.float32)
        e = SingleAgentEpisode(
            id_="e%d" % (start_id + i),
            observations=list(obs),
            actions=list(rng.integers(0, 2, length)),
            rewards=list(np.ones(length, np.float32)),
            terminated=True,
            len_lookback_buffer=0,
        )
        out.append(e.to_numpy())
    return out


def _median_us(fn, repeats, setup=None):
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def calls_alone(repeats=300, seed=0):
    from ray.rllib.utils.replay_buffers.prioritized_episode_buffer import PrioritizedEpisodeReplayBuffer as RLlibPER

    import exreplay.rllib as xr

    rng = np.random.default_rng(seed)
    episodes = _cartpole_episodes(rng, 250)  # 50,000 steps
    ours = xr.PrioritizedEpisodeReplayBuffer(capacity=50_000, alpha=0.6, n_step=(2, 5), seed=seed)
    theirs = RLlibPER(capacity=50_000, alpha=0.6)
    t0 = time.perf_counter()
    ours.add(episodes)
    fill_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    theirs.add(episodes)
    fill_theirs = time.perf_counter() - t0
    B = 32
    td = rng.random(B) + 0.01
    res = {"batch": B, "held_timesteps": ours.get_num_timesteps(), "fill_s": {"exreplay": fill_ours, "rllib": fill_theirs}}

    # The floor's inputs: ready arrays of the shapes the adapter builds from.
    b = ours.exreplay_buffer.get_batch(B, 0)
    obs0 = b.state[:, 0].copy()
    obs_n = b.state_next[:, 1].copy()
    act0 = b.action[:, 0].copy()
    ret = rng.random(B)
    term = np.zeros(B, bool)
    w = rng.random(B)
    n = np.full(B, 2)
    pos = b.pick_pos.copy()

    def floor():
        xr._episodes_from_arrays(obs0, obs_n, act0, ret, term, term, w, n, pos, False)

    # Round robin: each repeat times every call once, so that the machine's
    # load (shared, noisy) falls on all of them alike.
    frags = {k: iter(_cartpole_episodes(rng, repeats + 1, length=5, start_id=10_000_000 * (i + 1)))
             for i, k in enumerate(("exreplay", "rllib"))}
    bufs = {"exreplay": ours, "rllib": theirs}
    t = {k: [] for k in ("floor", "metrics", "metrics.rllib", "exreplay.sample", "exreplay.update", "exreplay.add",
                         "rllib.sample", "rllib.update", "rllib.add")}
    clock = time.perf_counter
    for _ in range(repeats):
        t0 = clock()
        floor()
        t["floor"].append(clock() - t0)
        t0 = clock()
        ours._log_sample_metrics(B, B, B, 3.0, 0)  # RLlib's metrics bookkeeping, as sample() does it
        t["metrics"].append(clock() - t0)
        t0 = clock()
        ours._rllib_sample_metrics(B, B, B, 3.0, 0)  # the same through RLlib's own method
        t["metrics.rllib"].append(clock() - t0)
        for name, buf in bufs.items():
            t0 = clock()
            buf.sample(num_items=B, n_step=(2, 5), beta=0.4, gamma=0.99)
            t1 = clock()
            buf.update_priorities(td)
            t2 = clock()
            buf.add([next(frags[name])])
            t3 = clock()
            t[name + ".sample"].append(t1 - t0)
            t[name + ".update"].append(t2 - t1)
            t[name + ".add"].append(t3 - t2)
    med = {k: 1e6 * statistics.median(v) for k, v in t.items()}
    for name in bufs:
        res[name] = {"sample_us": med[name + ".sample"], "update_priorities_us": med[name + ".update"],
                     "add_us": med[name + ".add"]}
    res["floor_us"] = med["floor"]
    res["metrics_us"] = med["metrics"]
    res["metrics_rllib_us"] = med["metrics.rllib"]
    # exreplay's sample over the floor, per repeat (the same moment), median
    res["sample_over_floor_median"] = statistics.median(
        a / f for a, f in zip(t["exreplay.sample"], t["floor"]))
    return res


# -------------------------------------------------------------- markdown


def _fmt_steps(v):
    return "%s" % format(v, ",") if v else "not reached"


def markdown_section(d):
    """docs/benchmarks.md's RLlib section from rllib.json (report.py calls this)."""
    L = ["## 9. RLlib (exreplay.rllib)", ""]
    L.append(
        "`make bench-rllib` (`benchmarks/rllib_dqn.py`; %s, Ray %s, %s). RLlib's DQN on CartPole-v1 with RLlib's "
        "tuned configuration (dueling, double Q, n-step drawn from 2..4, batch 32, capacity 50,000, alpha 0.6, "
        "beta 0.4; learner and environment runner local, torch on 1 thread), once with "
        "`exreplay.rllib.PrioritizedEpisodeReplayBuffer` (by its dotted name) and once with RLlib's own "
        "`PrioritizedEpisodeReplayBuffer`, same seeds, %s, budget %s environment steps. "
        "Replay time is the time spent in the buffer's `add`, `sample` and `update_priorities` (the same "
        "wrapper times both buffers); per iteration = 1,000 environment steps and about 200 sample/update pairs. "
        "The machine was shared with other jobs during these runs, so compare the two columns of one run, and the "
        "ratios, not absolute times."
        % (d.get("machine", "?"), d.get("ray", "?"), d.get("date", "?"),
           "stopping at a mean return >= %g" % d.get("goal", 450) if d.get("goal", 450) <= 500
           else "no early stop (CartPole's return is at most 500)",
           format(d.get("max_steps", 0), ","))
    )
    L.append("")
    runs = d.get("runs") or []
    ls = learning_summary(runs, d.get("target", 450.0)) if runs else None
    if ls and all(len(v["seeds"]) >= 3 for v in ls["buffers"].values()) and len(ls["buffers"]) == 2:
        bx, br = ls["buffers"]["exreplay"], ls["buffers"]["rllib"]
        L.append("### Learning over %d seeds" % len(bx["seeds"]))
        L.append("")
        L.append(
            "Seeds %s for each buffer, %s environment steps each (a fixed budget, no early stop), mean ± standard "
            "deviation over the seeds of RLlib's smoothed mean episode return:"
            % (", ".join(map(str, bx["seeds"])), format(ls["budget"], ","))
        )
        L.append("")
        L.append("| env steps | exreplay | RLlib's buffer |")
        L.append("| --- | --- | --- |")
        for (m, mx, sx), (_, mr, sr) in zip(bx["curve"], br["curve"]):
            L.append("| %s | %.0f ± %.0f | %.0f ± %.0f |" % (format(m, ","), mx, sx, mr, sr))
        fx, fr = bx["first_mean_std_n"], br["first_mean_std_n"]

        def _first(f, v):
            reached = "%d of %d seeds" % (f[2], len(v["seeds"]))
            if f[2]:
                reached += ", at %s ± %s env steps" % (format(round(f[0]), ","), format(round(f[1]), ","))
            return reached

        L.append("")
        L.append(
            "Mean return over the whole run (per run, then over seeds): exreplay %.0f ± %.0f, RLlib's buffer "
            "%.0f ± %.0f; difference %.0f, exact permutation test over the %d + %d runs p = %.2f. Reached a "
            "mean return of %g within the budget: exreplay %s; RLlib's buffer %s."
            % (bx["auc_mean_std"][0], bx["auc_mean_std"][1], br["auc_mean_std"][0], br["auc_mean_std"][1],
               ls["auc_diff"], len(bx["seeds"]), len(br["seeds"]), ls["auc_p"], ls["target"],
               _first(fx, bx), _first(fr, br))
        )
        L.append("")
    if runs:
        target = d.get("target", d.get("goal", 450))
        L.append("| buffer | seed | mean return %g first at (env steps) | iterations | replay time, median per "
                 "iteration | of which sample | median iteration wall time |" % target)
        L.append("| --- | --- | --- | --- | --- | --- | --- |")
        by = {}
        for r in runs:
            by.setdefault(r["seed"], {})[r["buffer"]] = r
            calls = max(r["buffer_calls"].get("sample", 0), 1)
            share = r["buffer_s"]["sample"] / max(sum(r["buffer_s"].values()), 1e-12)
            L.append("| %s | %d | %s | %d | %.1f ms | %.0f%% (%.2f ms per call) | %.2f s |" % (
                r["buffer"], r["seed"], _fmt_steps(_first_at(r["curve"], target)), r["iterations"],
                r["replay_ms_per_iter_median"] or float("nan"), 100 * share,
                1000 * r["buffer_s"]["sample"] / calls, r["iter_s_median"]))
        L.append("")
        ratios = ["seed %d: %.1fx" % (s_, v["rllib"]["replay_ms_per_iter_median"] / v["exreplay"]["replay_ms_per_iter_median"])
                  for s_, v in sorted(by.items()) if "rllib" in v and "exreplay" in v]
        if ratios:
            L.append("Replay time per iteration, RLlib's buffer ÷ exreplay's (medians over the iterations that "
                     "learn): " + ", ".join(ratios) + ".")
            L.append("")
        # learning curves at common env-step marks
        marks = sorted({st for r in runs for st, _ in r["curve"] if st % 10000 == 0})
        if marks:
            hdr = ["env steps"] + ["%s s%d" % (r["buffer"], r["seed"]) for r in runs]
            L.append("Mean episode return (RLlib's smoothing window) against environment steps:")
            L.append("")
            L.append("| " + " | ".join(hdr) + " |")
            L.append("| " + " | ".join("---" for _ in hdr) + " |")
            for m in marks:
                row = [format(m, ",")]
                for r in runs:
                    v = dict(r["curve"]).get(m)
                    row.append("%.0f" % v if v is not None and v == v else "")
                L.append("| " + " | ".join(row) + " |")
            L.append("")
    c = d.get("calls")
    if c:
        x, r = c["exreplay"], c["rllib"]
        tx = x["sample_us"] + x["update_priorities_us"] + x["add_us"]
        tr = r["sample_us"] + r["update_priorities_us"] + r["add_us"]
        L.append("### The replay calls alone, and the floor")
        L.append("")
        L.append(
            "Both buffers hold the same %s timesteps of CartPole-shaped episodes (observations (4,) float32); "
            "each call as DQN makes it (sample, update_priorities, add), %s, medians. The floor is building the %d `SingleAgentEpisode` "
            "objects that RLlib requires back from `sample`, from ready arrays (`exreplay.rllib._episodes_from_arrays`, "
            "exactly what the adapter builds): no buffer that returns RLlib's episode list can sample faster."
            % (format(c["held_timesteps"], ","), "timed round robin with the floor so that the machine's load falls on all alike",
               c["batch"])
        )
        L.append("")
        L.append("| call | exreplay | RLlib's buffer | RLlib ÷ exreplay |")
        L.append("| --- | --- | --- | --- |")
        for k, name in (("sample_us", "sample(32, n_step=(2, 5), beta=0.4)"),
                        ("update_priorities_us", "update_priorities(32 TD errors)"),
                        ("add_us", "add(one 5-step fragment)")):
            L.append("| `%s` | %.0f µs | %.0f µs | %.1fx |" % (name, x[k], r[k], r[k] / x[k]))
        L.append("| one DQN step (the three) | %.0f µs | %.0f µs | %.1fx |" % (tx, tr, tr / tx))
        L.append("| floor: 32 episode objects from ready arrays | %.0f µs | %.0f µs | – |" % (c["floor_us"], c["floor_us"]))
        L.append("")
        m = c.get("metrics_us", 0.0)
        L.append(
            "exreplay's `sample` is %.2fx the floor (%.0f of its %.0f µs are the episode objects; the median of "
            "the per-repeat ratio is %.2fx). `sample` must also feed RLlib's metrics logger "
            "(the values of `_update_sample_metrics`, read by `get_metrics` after every DQN sample): %.0f µs per "
            "call here as exreplay does it (pushed straight into RLlib's Stats objects after the first call; "
            "RLlib's own method takes %s µs). Counting that with the episode objects, the floor is %.0f µs and "
            "exreplay's `sample` is %.2fx it."
            % (x["sample_us"] / c["floor_us"], c["floor_us"], x["sample_us"],
               c.get("sample_over_floor_median", float("nan")), m,
               "%.0f" % c["metrics_rllib_us"] if "metrics_rllib_us" in c else "?", c["floor_us"] + m,
               x["sample_us"] / (c["floor_us"] + m))
        )
        L.append("")
        need = tr / 5
        left = need - c["floor_us"] - m
        L.append(
            "RLlib's buffer spends %.0f µs on one DQN step's replay work, %.1fx exreplay's %.0f µs. 5x would need "
            "exreplay's whole step (sample, update_priorities, add) within %.0f µs; the episode objects and the "
            "metrics alone take %.0f µs of that, %s"
            % (tr, tr / tx, tx, need, c["floor_us"] + m,
               "leaving %.0f µs for the draw, the weights, the n-step returns, the priorities and the add "
               "(they take %.0f µs here)." % (left, tx - c["floor_us"] - m) if left > 0 else
               "more than all of it: 5x is out of reach for any buffer that returns RLlib's episode list.")
        )
        L.append("")
        L.append("Filling 50,000 timesteps in one `add`: exreplay %.3f s, RLlib's buffer %.3f s." % (
            c["fill_s"]["exreplay"], c["fill_s"]["rllib"]))
        L.append("")
    return L


# ------------------------------------------------------------------ main


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--goal", type=float, default=float("inf"),
                    help="stop a run at this mean return (default: never, a fixed budget)")
    ap.add_argument("--max-steps", type=int, default=30_000)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--target", type=float, default=450.0,
                    help="the return whose first crossing the learning summary reports")
    ap.add_argument("--skip-learning", action="store_true")
    ap.add_argument("--reuse", default=None, help="directory with {buffer}_{seed}.json runs to reuse")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "rllib.json"))
    a = ap.parse_args(argv)

    import ray

    out = {
        "target": "make bench-rllib",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": "%s, %d CPUs, Python %s" % (platform.machine(), os.cpu_count(), platform.python_version()),
        "ray": ray.__version__,
        "seeds": a.seeds,
        "goal": a.goal,
        "max_steps": a.max_steps,
        "target": a.target,
        "runs": [],
    }
    if not a.skip_learning:
        tmp = a.reuse or os.path.join(ROOT, "build", "bench-rllib")
        os.makedirs(tmp, exist_ok=True)
        for seed in a.seeds:
            for buffer in BUFFERS:
                path = os.path.join(tmp, "%s_%d.json" % (buffer, seed))
                if a.reuse and os.path.exists(path):
                    with open(path) as f:
                        r = json.load(f)
                else:
                    r = learning_run(buffer, seed, a.goal, a.max_steps, path)
                out["runs"].append(summarise_run(r))
    out["calls"] = calls_alone(a.repeats)
    c = out["calls"]
    print(json.dumps({k: v for k, v in c.items()}, indent=1))
    for r in out["runs"]:
        print("%(buffer)s seed %(seed)d: goal at %(reached_at_env_steps)s env steps, "
              "replay %(replay_ms_per_iter_median).1f ms per iteration (median)" % r)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
