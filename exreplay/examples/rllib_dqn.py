"""RLlib's DQN on CartPole-v1 with exreplay's prioritized buffer.

    python -m exreplay.examples.rllib_dqn                  # exreplay, to a mean return of 450
    python -m exreplay.examples.rllib_dqn --buffer rllib   # RLlib's own PrioritizedEpisodeReplayBuffer
    python -m exreplay.examples.rllib_dqn --seed 1 --max-steps 100000 --json out.json

The buffer is given to RLlib by its dotted name, the only form RLlib's DQN
accepts for a buffer class outside RLlib::

    replay_buffer_config={"type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer",
                          "capacity": 50000, "alpha": 0.6, "beta": 0.4,
                          "n_step": N_STEP}

The rest of the configuration is RLlib's tuned DQN for CartPole (dueling,
double Q, n-step drawn from 2..4, epsilon annealed over 10k steps).  Every
training iteration adds the new episodes, samples, learns and updates the
priorities; the script times the buffer's ``add``, ``sample`` and
``update_priorities`` calls (wrapped on the buffer instance, the same
wrapping for either buffer) and prints their totals with the learning
curve.  It stops when the mean episode return over RLlib's smoothing window
reaches --goal, or after --max-steps environment steps.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

N_STEP = (2, 5)  # RLlib's tuned value: n drawn per transition from 2..4


def build_config(buffer: str, seed: int, lr: float = 0.0005):
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    if buffer == "exreplay":
        rb = {"type": "exreplay.rllib.PrioritizedEpisodeReplayBuffer", "n_step": N_STEP, "seed": seed}
    elif buffer == "rllib":
        rb = {"type": "PrioritizedEpisodeReplayBuffer"}
    else:
        raise ValueError("buffer: expected 'exreplay' or 'rllib', got %r" % (buffer,))
    rb.update({"capacity": 50000, "alpha": 0.6, "beta": 0.4})
    return (
        DQNConfig()
        .environment(env="CartPole-v1")
        .env_runners(num_env_runners=0)
        .learners(num_learners=0)
        .debugging(seed=seed)
        .training(
            lr=lr,
            train_batch_size_per_learner=32,
            replay_buffer_config=rb,
            n_step=N_STEP,
            double_q=True,
            dueling=True,
            epsilon=[(0, 1.0), (10000, 0.02)],
        )
        .rl_module(
            model_config=DefaultModelConfig(
                fcnet_hiddens=[256],
                fcnet_activation="tanh",
                fcnet_bias_initializer="zeros_",
                head_fcnet_bias_initializer="zeros_",
                head_fcnet_hiddens=[256],
            ),
        )
    )


class BufferTimer:
    """Wraps add/sample/update_priorities of one buffer instance with timers."""

    NAMES = ("add", "sample", "update_priorities")

    def __init__(self, buf):
        self.buf = buf
        self.total = {k: 0.0 for k in self.NAMES}
        self.calls = {k: 0 for k in self.NAMES}
        for name in self.NAMES:
            setattr(buf, name, self._wrap(name, getattr(buf, name)))

    def _wrap(self, name, fn):
        total, calls, clock = self.total, self.calls, time.perf_counter

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                total[name] += clock() - t0
                calls[name] += 1

        timed.__wrapped__ = fn
        return timed

    def snapshot(self):
        return dict(self.total)


def run(buffer="exreplay", seed=0, goal=450.0, max_steps=150_000, max_iters=None, verbose=True,
        torch_threads=1):
    """Trains to `goal` (or the budget); returns a dict with the curve and the buffer times.

    The learner and the environment runner are local (no Ray workers); torch
    runs on `torch_threads` threads: on a small shared machine its default
    (one thread per core) made each iteration about 10 times slower here.
    """
    import ray
    import torch

    torch.set_num_threads(torch_threads)
    from ray.rllib.utils.metrics import (
        ENV_RUNNER_RESULTS,
        EPISODE_RETURN_MEAN,
        NUM_ENV_STEPS_SAMPLED_LIFETIME,
    )

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    algo = build_config(buffer, seed).build_algo()
    timer = BufferTimer(algo.local_replay_buffer)
    curve = []
    t_start = time.perf_counter()
    reached = None
    it = 0
    try:
        while True:
            it += 1
            t_it = time.perf_counter()
            before = timer.snapshot()
            res = algo.train()
            after = timer.snapshot()
            env = res.get(ENV_RUNNER_RESULTS, {})
            steps = int(env.get(NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
            ret = env.get(EPISODE_RETURN_MEAN, float("nan"))
            row = {
                "iter": it,
                "env_steps": steps,
                "return_mean": float(ret),
                "iter_s": time.perf_counter() - t_it,
                **{k + "_s": after[k] - before[k] for k in BufferTimer.NAMES},
            }
            curve.append(row)
            if verbose and (it % 10 == 0 or ret >= goal):
                print(
                    "iter %4d  env steps %6d  return %6.1f  buffer %.3f s (add %.3f, sample %.3f, "
                    "update %.3f) of %.1f s"
                    % (it, steps, ret, sum(timer.total.values()), timer.total["add"],
                       timer.total["sample"], timer.total["update_priorities"],
                       time.perf_counter() - t_start),
                    flush=True,
                )
            if ret >= goal:
                reached = steps
                break
            if steps >= max_steps or (max_iters is not None and it >= max_iters):
                break
    finally:
        algo.stop()
    out = {
        "buffer": buffer,
        "seed": seed,
        "goal": goal,
        "reached_at_env_steps": reached,
        "iterations": it,
        "wall_s": time.perf_counter() - t_start,
        "buffer_s": dict(timer.total),
        "buffer_calls": dict(timer.calls),
        "curve": curve,
    }
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--buffer", choices=("exreplay", "rllib"), default="exreplay")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--goal", type=float, default=450.0)
    p.add_argument("--max-steps", type=int, default=150_000)
    p.add_argument("--max-iters", type=int, default=None)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the curve and timings here")
    a = p.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    r = run(a.buffer, a.seed, a.goal, a.max_steps, a.max_iters, torch_threads=a.torch_threads)
    tot = sum(r["buffer_s"].values())
    n = max(r["iterations"], 1)
    print(
        "%s buffer: %s at %s env steps, %d iterations in %.1f s; buffer time %.3f s "
        "(add %.3f, sample %.3f, update_priorities %.3f), %.2f ms per iteration"
        % (
            r["buffer"],
            "goal %.0f reached" % r["goal"] if r["reached_at_env_steps"] else "goal NOT reached",
            r["reached_at_env_steps"] or r["curve"][-1]["env_steps"],
            r["iterations"], r["wall_s"], tot, r["buffer_s"]["add"], r["buffer_s"]["sample"],
            r["buffer_s"]["update_priorities"], 1000 * tot / n,
        )
    )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f)
    return 0 if r["reached_at_env_steps"] else 1


if __name__ == "__main__":
    sys.exit(main())
