"""Memory held beyond the payload, measured in a fresh process (RSS from /proc/self/statm).

    python benchmarks/memory_probe.py IMPL N PICK_LEN     -> one JSON line on stdout

IMPL is exreplay or reference.  The probe makes the episode arrays first, reads
RSS, builds a buffer with one uniform selector and fills it with N records
(state (4,) float32, int64 action, float32 reward = 28 bytes of payload; episodes
of 1000 steps, record_many), reads RSS again, then adds one prioritized selector
and reads RSS a third time.  A fresh process keeps freed heap of earlier
benchmarks from hiding growth.  The C buffer's memory is invisible to
tracemalloc, hence RSS.
"""

import json
import os
import sys

import numpy as np

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def main(impl: str, n: int, pick_len: int) -> dict:
    import exreplay

    if impl == "exreplay":
        cls = exreplay.ExperienceReplay
    else:
        from exreplay.reference import ReferenceReplay as cls

    ep = 1000
    rng = np.random.default_rng(0)
    states = rng.standard_normal((ep, 4)).astype(np.float32)
    actions = np.zeros(ep, np.int64)
    rewards = np.ones(ep, np.float32)
    final = states[0].copy()
    payload = 4 * 4 + 8 + 4

    r0 = rss()
    buf = cls(state_shape=(4,), capacity=n, pick_len=pick_len, seed=0)
    buf.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    full, rest = divmod(n, ep)
    for _ in range(full):
        buf.record_many(buf.new_episode(), states, actions, rewards, final_state=final)
    if rest:
        buf.record_many(buf.new_episode(), states[:rest], actions[:rest], rewards[:rest], final_state=final)
    r1 = rss()
    buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    r2 = rss()
    records, picks, episodes = len(buf), buf.num_picks, buf.num_episodes
    return {
        "impl": impl,
        "N": records,
        "pick_len": pick_len,
        "picks": picks,
        "episodes": episodes,
        "payload_bytes_per_record": payload,
        "rss_growth_bytes": r1 - r0,
        "rss_per_record": (r1 - r0) / records,
        "overhead_per_record": (r1 - r0 - payload * records) / records,
        "prioritized_rss_growth_bytes": r2 - r1,
        "prioritized_per_pick": (r2 - r1) / picks,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
