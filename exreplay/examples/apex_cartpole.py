"""Ape-X DQN on CartPole-v1, on Ray core, with exreplay as the replay.

    python -m exreplay.examples.apex_cartpole            # make demo
    python -m exreplay.examples.apex_cartpole --seed 1 --actors 4 --time-limit 300
    python -m exreplay.examples.apex_cartpole --replay reference   # the pure-Python buffer

The architecture of Ape-X (Horgan et al. 2018) as in the Ray article this
project follows (docs/ray.md):

- K actors (Ray actors), actor i exploring with eps_i = 0.4 ** (1 + 7 i / (K - 1)).
  Each keeps a local copy of the Q-network, steps gymnasium's CartPole-v1 for
  100 steps, computes the initial priority of each step from its own 3-step
  TD error, and sends the rollout to the replay (``record_rollout``, one
  ``record_many`` per episode piece). It takes new weights every 400 steps.
- One replay: an ``exreplay.ray.ReplayActor`` (or a ``ShardedReplay`` with
  ``--shards``), holding picks of ``pick_len=3`` steps with
  ``allow_short=True``: a pick is the n=3 steps that an n-step target needs,
  shorter where an episode ends.
- One learner (a Ray actor) that takes 16 minibatches per cycle (one
  ``get_batch`` call, prefetched while it trains), does double DQN with a
  target network and Adam, in NumPy, sends the new priorities back with
  ``set_priority``, and publishes its weights with ``ray.put`` every few cycles.
- The driver, as in the article, keeps everyone busy with ``ray.wait``, throttles
  the actors to a fixed ratio of learner updates to environment steps (on a
  2-core machine they would otherwise starve the learner), evaluates the
  greedy policy (20 episodes) every few seconds, prints a progress line, and
  stops when the mean evaluation return reaches the goal (475) or at the time
  limit.

n-step targets from a pick (docs/ray.md): with L = seq_len and
Ln = seq_len_next (L - 1 when the pick ends on a terminal step),
G = sum_{t<L} gamma^t r_t + [Ln == L] gamma^L Q_target(s', argmax_a Q(s', a)),
with s' = state_next[L - 1]: the state after the pick's last step (the final
state of a truncated episode, which is bootstrapped from).

Everything is seeded from --seed (networks, environments, exploration, the
replay's selectors); Ray's scheduling still interleaves actors and learner
differently from run to run, so runs with one seed are close, not identical.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from collections import deque

import numpy as np

N_STEP = 3
GAMMA = 0.99
ROLLOUT = 100
OBS_DIM = 4
N_ACTIONS = 2


# --- a small NumPy MLP with Adam ------------------------------------------------------


def init_params(rng, hidden=(64, 64)):
    sizes = (OBS_DIM, *hidden, N_ACTIONS)
    params = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        scale = np.sqrt(2.0 / m) if i < len(sizes) - 2 else np.sqrt(1.0 / m) * 0.1
        params.append((rng.standard_normal((m, n)) * scale).astype(np.float32))
        params.append(np.zeros(n, dtype=np.float32))
    return params


def q_values(params, x):
    h = np.asarray(x, dtype=np.float32)
    n_layers = len(params) // 2
    for i in range(n_layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n_layers - 1:
            np.maximum(h, 0.0, out=h)
    return h


def forward_cache(params, x):
    acts = [np.asarray(x, dtype=np.float32)]
    n_layers = len(params) // 2
    h = acts[0]
    for i in range(n_layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < n_layers - 1:
            h = np.maximum(h, 0.0)
        acts.append(h)
    return acts


def backward(params, acts, dout):
    grads = [None] * len(params)
    n_layers = len(params) // 2
    d = dout
    for i in reversed(range(n_layers)):
        grads[2 * i] = acts[i].T @ d
        grads[2 * i + 1] = d.sum(axis=0)
        if i > 0:
            d = (d @ params[2 * i].T) * (acts[i] > 0)
    return grads


class Adam:
    def __init__(self, params, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, b1, b2, eps
        self.m = [np.zeros_like(p) for p in params]
        self.v = [np.zeros_like(p) for p in params]
        self.t = 0

    def step(self, params, grads, clip=10.0):
        norm = np.sqrt(sum(float((g * g).sum()) for g in grads))
        scale = min(1.0, clip / (norm + 1e-12))
        self.t += 1
        a = self.lr * np.sqrt(1 - self.b2**self.t) / (1 - self.b1**self.t)
        for p, g, m, v in zip(params, grads, self.m, self.v):
            g = g * scale
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            p -= a * m / (np.sqrt(v) + self.eps)


def nstep_targets(online, target, batch, gamma=GAMMA):
    """Double-DQN n-step targets of a batch of picks (pick_len = n)."""
    L = batch.seq_len
    Ln = batch.seq_len_next
    B, n = batch.reward.shape
    disc = gamma ** np.arange(n, dtype=np.float64)
    G = (batch.reward.astype(np.float64) * disc).sum(axis=1)  # rows past seq_len are zero
    s_boot = batch.state_next[np.arange(B), np.maximum(L - 1, 0)]
    a_star = q_values(online, s_boot).argmax(axis=1)
    q_boot = q_values(target, s_boot)[np.arange(B), a_star].astype(np.float64)
    boot = (Ln == L)
    G = G + np.where(boot, gamma ** L.astype(np.float64) * q_boot, 0.0)
    return G


def td_update(online, target, opt, batch):
    """One double-DQN step on a batch; returns |TD errors| (for set_priority) and the loss."""
    G = nstep_targets(online, target, batch)
    B = len(G)
    s0 = batch.state[:, 0]
    a0 = batch.action[:, 0]
    acts = forward_cache(online, s0)
    q = acts[-1]
    qa = q[np.arange(B), a0].astype(np.float64)
    delta = qa - G
    w = batch.weight.astype(np.float64)
    huber = np.where(np.abs(delta) <= 1.0, 0.5 * delta**2, np.abs(delta) - 0.5)
    loss = float((w * huber).mean())
    dq = np.zeros_like(q)
    dq[np.arange(B), a0] = (w * np.clip(delta, -1.0, 1.0) / B).astype(np.float32)
    grads = backward(online, acts, dq)
    opt.step(online, grads)
    return np.abs(delta), loss


# --- rollouts and initial priorities -------------------------------------------------


def initial_priorities(params, states, actions, rewards, next_states, ends_terminated, gamma=GAMMA, n=N_STEP):
    """|n-step TD error| of each step of one episode piece, with the actor's local net.

    states (m, 4), actions (m,), rewards (m,): the steps to send; next_states
    (m + k, 4): s_1 ... (the states after each step, k >= 0 more known beyond);
    a window that runs past the known states is cut there: the caller only
    sends steps whose window is complete or ends the episode.
    ends_terminated: None if the piece's episode goes on, else whether its last
    step is terminal.
    """
    m = len(states)
    q_all = q_values(params, np.concatenate([states, next_states]))
    q_s = q_all[:m]
    q_next = q_all[m:]
    td = np.empty(m)
    for t in range(m):
        L = min(n, m - t)
        G = sum(gamma**k * float(rewards[t + k]) for k in range(L))
        last = t + L - 1  # index of the window's last step
        terminal = ends_terminated is True and last == m - 1
        if not terminal:
            G += gamma**L * float(q_next[last].max())
        td[t] = abs(float(q_s[t, actions[t]]) - G)
    return td + 1e-3


def epsilon(i, K, base=0.4, alpha=7.0):
    if K == 1:
        return base
    return base ** (1 + alpha * i / (K - 1))


# --- Ray actors ---------------------------------------------------------------------


class _Actor:
    """One Ape-X actor: epsilon-greedy rollouts of ROLLOUT steps into the replay."""

    def __init__(self, i, K, replay, seed, sync_every=400):
        import gymnasium as gym

        self.i = i
        self.eps = epsilon(i, K)
        self.replay = replay
        self.env = gym.make("CartPole-v1")
        self.rng = np.random.default_rng([seed, 1, i])
        self.obs, _ = self.env.reset(seed=int(seed * 1000 + i))
        self.params = None
        self.sync_every = sync_every
        self.steps = 0
        self.since_sync = sync_every  # sync at the first rollout
        self.ep_return = 0.0
        # steps of the open episode not sent yet (their 3-step window is incomplete)
        self.pend_s, self.pend_a, self.pend_r = [], [], []
        self.seq = 0

    def wants_weights(self):
        return self.since_sync >= self.sync_every

    def _act(self, obs):
        if self.rng.random() < self.eps:
            return int(self.rng.integers(N_ACTIONS))
        return int(q_values(self.params, obs[None])[0].argmax())

    def _play(self):
        """ROLLOUT steps after the pending ones: arrays S, A, R and the episodes that ended
        (their end indices, final states, terminated flags, returns)."""
        states, actions, rewards = list(self.pend_s), list(self.pend_a), list(self.pend_r)
        ends, finals, terms, returns = [], [], [], []
        obs = self.obs
        for _ in range(ROLLOUT):
            a = self._act(obs)
            nobs, r, term, trunc, _ = self.env.step(a)
            states.append(obs)
            actions.append(a)
            rewards.append(r)
            self.ep_return += r
            obs = nobs
            if term or trunc:
                ends.append(len(states))
                finals.append(nobs)
                terms.append(bool(term))
                returns.append(self.ep_return)
                self.ep_return = 0.0
                obs, _ = self.env.reset(seed=int(self.rng.integers(2**31)))
        self.obs = obs
        self.steps += ROLLOUT
        self.since_sync += ROLLOUT
        S = np.asarray(states, dtype=np.float32)
        A = np.asarray(actions, dtype=np.int64)
        R = np.asarray(rewards, dtype=np.float32)
        return S, A, R, ends, finals, terms, returns

    def _priorities(self, S, A, R, ends, finals, terms, start_open, send):
        """Initial priorities of the first `send` steps, piece by piece, from the local network."""
        pri = np.empty(send)
        piece_start = 0
        for j, b_ in enumerate(ends):
            a_ = piece_start
            nxt = np.concatenate([S[a_ + 1:b_], np.asarray(finals[j], np.float32)[None]])
            pri[a_:b_] = initial_priorities(self.params, S[a_:b_], A[a_:b_], R[a_:b_], nxt, terms[j])
            piece_start = b_
        if start_open < send:  # the open episode: steps whose 3-step window is complete
            a_ = start_open
            nxt = np.concatenate([S[a_ + 1:], self.obs[None].astype(np.float32)])
            pri[a_:send] = _open_priorities(self.params, S[a_:], A[a_:], R[a_:], nxt, send - a_)
        return pri

    def rollout(self, weights):
        from exreplay.ray import Rollout

        if weights is not None:
            self.params = [np.array(w) for w in weights]
            self.since_sync = 0
        S, A, R, ends, finals, terms, returns = self._play()
        # The open tail: keep its last n-1 steps back (their window needs states to come).
        start_open = ends[-1] if ends else 0
        keep = min(N_STEP - 1, len(S) - start_open)
        send = len(S) - keep
        self.pend_s = [S[j] for j in range(send, len(S))]
        self.pend_a = list(A[send:])
        self.pend_r = list(R[send:])
        if send == 0:
            return ROLLOUT, returns
        pri = self._priorities(S, A, R, ends, finals, terms, start_open, send)
        roll = Rollout(S[:send], A[:send], R[:send], pri, ends=ends,
                       final_states=np.asarray(finals, np.float32).reshape(len(finals), OBS_DIM),
                       terminated=terms)
        self.replay.record_rollout(self.i, roll)
        return ROLLOUT, returns


class _Learner:
    """The Ape-X learner: k minibatches per cycle from one prefetched get_batch call."""

    def __init__(self, replay, ps, seed, batch_size=64, minibatches=16, lr=1e-3,
                 target_every=500, hidden=(64, 64)):
        self.replay = replay
        self.ps = ps
        rng = np.random.default_rng([seed, 2])
        self.online = init_params(rng, hidden)
        self.target = [p.copy() for p in self.online]
        self.opt = Adam(self.online, lr=lr)
        self.B = batch_size
        self.k = minibatches
        self.target_every = target_every
        self.updates = 0
        self.losses = deque(maxlen=50)
        self._q = queue.Queue(maxsize=1)
        self._stop = False
        self._fetcher = None

    def weights(self):
        return [p.copy() for p in self.online]

    def _fetch_loop(self):
        while not self._stop:
            try:
                bs = self.replay.get_batch(self.B, self.ps, self.k)
            except Exception as e:  # noqa: BLE001 - handed to cycle()
                bs = e
            while not self._stop:
                try:
                    self._q.put(bs, timeout=0.2)
                    break
                except queue.Full:
                    continue

    def cycle(self, publish=False):
        """Train on k minibatches (one get_batch call, prefetched); send priorities."""
        import ray

        if self._fetcher is None:
            self._fetcher = threading.Thread(target=self._fetch_loop, daemon=True)
            self._fetcher.start()
        batches = self._q.get()
        if isinstance(batches, Exception):
            raise batches
        epi, pos, idx, pri = [], [], [], []
        for b in batches:
            td, loss = td_update(self.online, self.target, self.opt, b)
            self.losses.append(loss)
            self.updates += 1
            if self.updates % self.target_every == 0:
                self.target = [p.copy() for p in self.online]
            epi.append(b.pick_epi)
            pos.append(b.pick_pos)
            idx.append(getattr(b, "pick_index", None))  # None: a Batch built without it
            pri.append(td + 1e-3)
        # pick_index (the table indices the batches carry) lets the buffer
        # skip the lookup by handle for the picks that have not moved
        idx = None if any(x is None for x in idx) else np.concatenate(idx)
        self.replay.set_priority(self.ps, np.concatenate(epi), np.concatenate(pos), np.concatenate(pri),
                                 pick_index=idx)
        ref = ray.put([p.copy() for p in self.online]) if publish else None
        return self.updates, float(np.mean(self.losses)), [ref]

    def stop(self):
        self._stop = True


class _Evaluator:
    """Greedy evaluation episodes run in lockstep."""

    def __init__(self, seed, episodes=20):
        import gymnasium as gym

        self.envs = [gym.make("CartPole-v1") for _ in range(episodes)]
        self.seed = seed
        self.calls = 0

    def evaluate(self, weights):
        """Mean greedy return over the episodes (run in lockstep, batched forward)."""
        params = [np.asarray(w) for w in weights]
        self.calls += 1
        obs = np.stack([e.reset(seed=int(self.seed * 100_000 + self.calls * 100 + j))[0]
                        for j, e in enumerate(self.envs)])
        alive = np.ones(len(self.envs), bool)
        ret = np.zeros(len(self.envs))
        while alive.any():
            acts = q_values(params, obs).argmax(axis=1)
            for j in np.flatnonzero(alive):
                o, r, term, trunc, _ = self.envs[j].step(int(acts[j]))
                obs[j] = o
                ret[j] += r
                if term or trunc:
                    alive[j] = False
        return float(ret.mean()), ret.tolist()


def build_remote_classes(ray):
    """The actor, learner and evaluator as Ray actor classes (no CPU reserved each)."""
    return tuple(ray.remote(num_cpus=0)(cls) for cls in (_Actor, _Learner, _Evaluator))


def _open_priorities(params, S, A, R, nxt, m):
    """Priorities of the first m steps of an open piece whose n-step windows are complete."""
    q_all = q_values(params, np.concatenate([S, nxt]))
    q_s, q_n = q_all[: len(S)], q_all[len(S):]
    td = np.empty(m)
    for t in range(m):
        G = sum(GAMMA**k * float(R[t + k]) for k in range(N_STEP))
        G += GAMMA**N_STEP * float(q_n[t + N_STEP - 1].max())
        td[t] = abs(float(q_s[t, A[t]]) - G)
    return td + 1e-3


# --- the driver --------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m exreplay.examples.apex_cartpole", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--actors", type=int, default=4, help="K actors (default 4)")
    p.add_argument("--shards", type=int, default=1, help="replay shards (ShardedReplay); 1 = one ReplayActor")
    p.add_argument("--replay", choices=["c", "reference"], default="c",
                   help="c: exreplay.ExperienceReplay; reference: the pure-Python buffer")
    p.add_argument("--goal", type=float, default=475.0, help="mean greedy return over the evaluation episodes")
    p.add_argument("--eval-episodes", type=int, default=20)
    p.add_argument("--eval-every", type=float, default=3.0, help="seconds between evaluations")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds of training at most")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--minibatches", type=int, default=16, help="minibatches per learner cycle")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--capacity", type=int, default=100_000)
    p.add_argument("--warmup", type=int, default=2_000, help="env steps before the learner starts")
    p.add_argument("--steps-per-update", type=float, default=2.0,
                   help="env steps allowed per learner update (throttles the actors)")
    p.add_argument("--publish-every", type=int, default=2, help="learner cycles between ray.put of the weights")
    p.add_argument("--progress-every", type=float, default=5.0, help="seconds between progress lines")
    p.add_argument("--num-cpus", type=int, default=2, help="CPUs of the local Ray cluster (if one is started)")
    p.add_argument("--json", default=None, help="write the summary to this JSON file")
    p.add_argument("--log", default=None, metavar="DIR",
                   help="log every experience (each replay shard writes DIR/replay-<shard>.xlog on "
                        "its node) and merge the logs into DIR/merged.xlog at the end (docs/log.md)")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


class _Driver:
    """The training loop's state: the Ray actors, their jobs, the counters and the results."""

    def __init__(self, ray, args, log, replay, actors, learner, evaluator, weights_ref):
        self.ray, self.args, self.log, self.replay = ray, args, log, replay
        self.actors, self.learner, self.evaluator = actors, learner, evaluator
        self.weights_ref = weights_ref
        self.K = len(actors)
        self.t0 = time.perf_counter()
        self.env_steps = self.updates = self.cycles = 0
        self.loss = float("nan")
        self.since_sync = {a: 400 for a in range(self.K)}
        self.jobs = {}
        self.idle = list(range(self.K))
        self.learner_job = self.eval_job = None
        self.eval_weights_updates = 0
        self.last_eval = -1e9
        self.evals = []
        self.best = (-1.0, 0.0)
        self.recent = deque(maxlen=20)
        self.last_progress = self.t0
        self.goal_at = None
        self.progress = []

    def launch(self, i):
        w = self.weights_ref if self.since_sync[i] >= 400 else None
        if w is not None:
            self.since_sync[i] = 0
        self.since_sync[i] += ROLLOUT
        self.jobs[self.actors[i].rollout.remote(w)] = i

    def start_jobs(self, now):
        """Idle actors while the throttle allows, a learner cycle, an evaluation when due."""
        args = self.args
        budget = args.warmup + args.steps_per_update * self.updates
        while self.idle and self.env_steps + ROLLOUT * len(self.jobs) < budget:
            self.launch(self.idle.pop(0))
        if self.learner_job is None and self.env_steps >= min(args.warmup, 500):
            self.cycles += 1
            self.learner_job = self.learner.cycle.remote(self.cycles % args.publish_every == 0)
        if self.eval_job is None and now - self.last_eval >= args.eval_every and self.updates > 0:
            self.eval_job = self.evaluator.evaluate.remote(self.weights_ref)
            self.eval_weights_updates = self.updates
            self.last_eval = now

    def evaluated(self, mean, rets):
        self.eval_job = None
        at = time.perf_counter() - self.t0
        self.evals.append((round(at, 2), mean))
        if mean > self.best[0]:
            self.best = (mean, at)
        if mean >= self.args.goal:
            self.goal_at = time.perf_counter() - self.t0
            self.log(f"[{self.goal_at:6.1f}s] goal reached: mean greedy return {mean:.1f} over "
                     f"{len(rets)} episodes (weights after {self.eval_weights_updates} updates)")

    def collect(self):
        """Waits up to 0.2 s for a job and takes what is done."""
        ray = self.ray
        waiting = list(self.jobs) + [j for j in (self.learner_job, self.eval_job) if j is not None]
        ready, _ = ray.wait(waiting, num_returns=1, timeout=0.2)
        for ref in ready:
            if ref in self.jobs:
                i = self.jobs.pop(ref)
                n, rets = ray.get(ref)
                self.env_steps += n
                self.recent.extend(rets)
                self.idle.append(i)
            elif ref == self.learner_job:
                self.updates, self.loss, (wref,) = ray.get(ref)
                if wref is not None:
                    self.weights_ref = wref
                self.learner_job = None
            elif ref == self.eval_job:
                self.evaluated(*ray.get(ref))

    def report_progress(self, elapsed):
        stats = self.replay.stats()
        evals, loss = self.evals, self.loss
        line = dict(t=round(elapsed, 1), env_steps=self.env_steps, updates=self.updates,
                    actor_return=float(np.mean(self.recent)) if self.recent else 0.0,
                    eval_return=evals[-1][1] if evals else None,
                    inserts_per_s=stats["inserts_per_s"], samples_per_s=stats["samples_per_s"],
                    loss=loss)
        self.progress.append(line)
        self.log(f"[{elapsed:6.1f}s] steps {self.env_steps:7d}  updates {self.updates:6d}  "
                 f"return: actors {line['actor_return']:6.1f} greedy "
                 f"{'   n/a' if line['eval_return'] is None else format(line['eval_return'], '6.1f')}  "
                 f"replay {stats['held_records']:6d} rec, {stats['inserts_per_s']:7.0f} inserts/s, "
                 f"{stats['samples_per_s']:8.0f} samples/s  loss {loss:.3f}")

    def train(self):
        """Until the goal or the time limit; returns the wall time."""
        while True:
            now = time.perf_counter()
            elapsed = now - self.t0
            if elapsed > self.args.time_limit:
                break
            self.start_jobs(now)
            self.collect()
            if self.goal_at is not None:
                break
            if now - self.last_progress >= self.args.progress_every:
                self.last_progress = now
                self.report_progress(elapsed)
        return time.perf_counter() - self.t0

    def summary(self, wall, setup_s):
        args, K, best, goal_at = self.args, self.K, self.best, self.goal_at
        final_stats = self.replay.stats()
        summary = dict(
            seed=args.seed, actors=K, shards=args.shards, replay=args.replay, goal=args.goal,
            reached=goal_at is not None, time_to_goal_s=None if goal_at is None else round(goal_at, 2),
            wall_s=round(wall, 2), setup_s=round(setup_s, 2), env_steps=self.env_steps,
            updates=self.updates, picks_sampled=final_stats["picks_sampled"],
            records=final_stats["records"],
            mean_inserts_per_s=final_stats["records"] / max(wall, 1e-9),
            mean_samples_per_s=final_stats["picks_sampled"] / max(wall, 1e-9),
            best_eval=round(best[0], 1), evals=self.evals, progress=self.progress,
            epsilons=[round(epsilon(i, K), 4) for i in range(K)],
        )
        self.log(
            f"summary: {'reached' if summary['reached'] else 'did NOT reach'} mean greedy return "
            f">= {args.goal:g} over {args.eval_episodes} episodes"
            + (f" in {goal_at:.1f} s" if goal_at is not None else f" (best {best[0]:.1f}) in {wall:.1f} s")
            + f" (seed {args.seed}, {K} actors, replay={args.replay}, shards={args.shards}); "
            f"{self.env_steps} env steps, {self.updates} updates of {args.batch_size}; replay: "
            f"{summary['mean_inserts_per_s']:.0f} inserts/s, {summary['mean_samples_per_s']:.0f} samples/s "
            f"on average; Ray setup {setup_s:.1f} s"
        )
        return summary

    def merge_logs(self, summary):
        t_merge = time.perf_counter()
        merged = self.replay.gather_logs(self.args.log)
        summary["log"] = dict(merged, merge_s=round(time.perf_counter() - t_merge, 2))
        self.log(f"log: {merged['records']} experiences from sources {merged['sources']} merged in "
                 f"timestamp order into {merged['path']} ({merged['bytes'] / 1e6:.1f} MB, "
                 f"{merged['chunks']} chunks, {summary['log']['merge_s']:.2f} s); "
                 f"python -m exreplay.log info|tail {merged['path']}")


def _start(ray, args):
    """The replay, K actors, the learner and the evaluator, ready; the first weights."""
    from exreplay.ray import ShardedReplay

    Actor, Learner, Evaluator = build_remote_classes(ray)
    replay = ShardedReplay(
        args.shards, impl=args.replay, state_shape=(OBS_DIM,), capacity=args.capacity,
        pick_len=N_STEP, allow_short=True, seed=args.seed,
        selectors=[("prioritized", {"alpha": 0.6, "beta": 0.4})],
        actor_options={"num_cpus": 0}, log_dir=args.log,
    )
    replay.wait_ready()
    K = args.actors
    actors = [Actor.remote(i, K, replay, args.seed) for i in range(K)]
    learner = Learner.remote(replay, 0, args.seed, batch_size=args.batch_size,
                             minibatches=args.minibatches, lr=args.lr)
    evaluator = Evaluator.remote(args.seed, args.eval_episodes)
    weights_ref = ray.put(ray.get(learner.weights.remote()))
    ray.get([a.wants_weights.remote() for a in actors] + [evaluator.__ray_ready__.remote()])
    return replay, actors, learner, evaluator, weights_ref


def run(args, log=print):
    """Train; returns the summary dict. Uses the running Ray (or starts a local one)."""
    import ray

    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=True)
        started = True
    t_setup = time.perf_counter()
    try:
        replay, actors, learner, evaluator, weights_ref = _start(ray, args)
        setup_s = time.perf_counter() - t_setup
        d = _Driver(ray, args, log, replay, actors, learner, evaluator, weights_ref)
        wall = d.train()
        ray.get(learner.stop.remote())
        summary = d.summary(wall, setup_s)
        for a in actors + [learner, evaluator]:
            ray.kill(a)
        if args.log:
            d.merge_logs(summary)
        replay.shutdown()
        return summary
    finally:
        if started:
            ray.shutdown()


def main(argv=None):
    args = parse_args(argv)
    log = (lambda *a, **k: None) if args.quiet else (lambda *a, **k: print(*a, **k, flush=True))
    summary = run(args, log)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if summary["reached"] else 1


if __name__ == "__main__":
    sys.exit(main())
