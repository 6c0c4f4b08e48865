"""The experience log's costs (docs/log.md), each against its counterpart in the
same run. Nothing asserts on a time: every result is printed and written to
benchmarks/results/log.json (quick mode: build/bench-quick/log.json;
EXREPLAY_BENCH_LOG_JSON overrides), and docs/benchmarks.md quotes it.

- writer: Atari-like 84x84 uint8 frames recorded into a buffer with a log
  attached, time from the first record_many to flush() returning, in raw MB/s
  of log body, at level 1 against zlib.compress(raw, 1) of the very same
  chunk bodies, and at level 0 (stored) in GB/s;
- paced: a record_many loop paced at 50,000 frames/s for a few seconds; the
  recording thread's CPU time (time.thread_time) with a level-0 log against
  without, alternating; the backlog sampled through the run (keeps up = no
  growth); the same at level 1 (how fast it keeps up, or how much it was
  throttled);
- apex: an Ape-X-shaped replay loop in one process (an actor thread
  record_many's CartPole-sized steps with priorities, the learner thread
  get_batch(256) + set_priority), records/s and minibatches/s with a log on
  every step against the same loop without, alternating rounds;
- tail: tail(n=100) of a big log (full: 10 GB stored; quick: 64 MB);
- merge: merge of 8 logs written concurrently (interleaved timestamps) against
  decompressing and recompressing (level 1) the same chunks, with the same
  number of threads on both sides: merge(threads=0) against a loop on one
  thread, merge(threads=cores) against a pool of as many threads.
"""

import json
import os
import statistics
import threading
import time
import zlib

import numpy as np
import pytest

import exreplay
import exreplay.log as xlog
import harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS: dict = {}
FRAME = (84, 84)


def _json_path():
    p = os.environ.get("EXREPLAY_BENCH_LOG_JSON")
    if p:
        return p
    if harness.quick():
        return os.path.join(ROOT, "build", "bench-quick", "log.json")
    return os.path.join(ROOT, "benchmarks", "results", "log.json")


@pytest.fixture(scope="module", autouse=True)
def _write_results():
    yield
    p = _json_path()
    os.makedirs(os.path.dirname(p), exist_ok=True)
    with open(p, "w") as f:
        json.dump(RESULTS, f, indent=2, sort_keys=True)
    print("\nlog benchmark results -> %s\n%s" % (p, json.dumps(RESULTS, indent=2)))


def atari_frames(n, seed=0):
    """Frames that compress about as Atari's do: a fixed background, a few
    moving sprites and a noisy score band."""
    rng = np.random.default_rng(seed)
    bg = np.repeat(np.repeat(rng.integers(0, 4, (12, 12), dtype=np.uint8) * 40, 7, 0), 7, 1)
    out = np.empty((n,) + FRAME, np.uint8)
    for i in range(n):
        f = bg.copy()
        for s in range(4):
            y, x = (i * (s + 1) * 3 + s * 17) % 76, (i * (s + 2) + s * 29) % 76
            f[y:y + 8, x:x + 8] = 200 + s * 10
        f[:6, :] = rng.integers(0, 255, (6, 84), dtype=np.uint8)
        out[i] = f
    return out


# ---- writer throughput -----------------------------------------------------------


def _log_run(path, level, frames, reps):
    if os.path.exists(path):
        os.unlink(path)
    lg = exreplay.ExperienceLog(path, level=level, chunk_bytes=1 << 20, max_backlog=1 << 40,
                                flush_interval=None)
    buf = exreplay.ExperienceReplay(FRAME, "uint8", capacity=len(frames) * reps, log=lg)
    a = np.zeros(len(frames), np.int64)
    r = np.zeros(len(frames), np.float32)
    step = 256
    t0 = time.perf_counter()
    h = None
    for _ in range(reps):
        for i in range(0, len(frames), step):
            h = buf.record_many(h, frames[i:i + step], a[i:i + step], r[i:i + step])
    lg.flush()
    t = time.perf_counter() - t0
    raw = lg.stats["raw_bytes"]
    busy = lg.stats["writer_seconds"]
    lg.close()
    del buf
    return t, raw, busy


def _bodies(path):
    """The raw bodies of a stored (level 0) log's chunks."""
    with xlog.open(path) as r:
        return [body for _, h, body in r._headers(True)]


def test_writer_throughput(tmp_path):
    """Level 1 and level 0 into a file under tmp_path (the page cache; tmpfs
    is slower than that on this VM). The writer's own time
    (stats["writer_seconds"]: building, compressing and writing chunks, on
    its thread) gives its throughput; wall is first record to flush()."""
    n = 2000 if harness.quick() else 8000
    reps = 1 if harness.quick() else 4
    frames = atari_frames(n)
    p0, p1 = str(tmp_path / "l0.xlog"), str(tmp_path / "l1.xlog")
    rounds = 2 if harness.quick() else 5
    t0s, b0s, t1s, b1s, zs, cps = [], [], [], [], [], []
    bodies = None
    for _ in range(rounds):
        t, raw0, b = _log_run(p0, 0, frames, reps)
        t0s.append(t)
        b0s.append(b)
        if bodies is None:
            bodies = _bodies(p0)
        t, raw1, b = _log_run(p1, 1, frames, reps)
        t1s.append(t)
        b1s.append(b)
        s = time.perf_counter()
        for body in bodies:
            zlib.compress(body, 1)
        zs.append(time.perf_counter() - s)
        s = time.perf_counter()
        for body in bodies:
            bytearray(body)
        cps.append(time.perf_counter() - s)
    raw = sum(len(b) for b in bodies)
    assert raw == raw0 == raw1
    size1 = os.path.getsize(p1)
    for p in (p0, p1):
        os.unlink(p)
    med = statistics.median
    RESULTS["writer"] = {
        "frames": n * reps, "raw_bytes": raw, "rounds": rounds,
        "level0_writer_GBps": raw / med(b0s) / 1e9, "level0_wall_GBps": raw / med(t0s) / 1e9,
        "level1_writer_MBps": raw / med(b1s) / 1e6, "level1_wall_MBps": raw / med(t1s) / 1e6,
        "zlib_compress_1_MBps": raw / med(zs) / 1e6,
        "level1_writer_vs_zlib": med(zs) / med(b1s), "level1_wall_vs_zlib": med(zs) / med(t1s),
        "copy_GBps": raw / med(cps) / 1e9, "level0_writer_vs_copy": med(cps) / med(b0s),
        "level1_ratio": size1 / raw,
    }


# ---- paced Atari recording -----------------------------------------------------------


def _paced(frames, level, seconds, path, rate=50_000, batch=50):
    """record_many of `batch` frames every batch/rate s; returns the recording
    thread's CPU seconds, the frames recorded, the backlog samples."""
    lg = None
    if level is not None:
        if os.path.exists(path):
            os.unlink(path)
        lg = exreplay.ExperienceLog(path, level=level, max_backlog=256 << 20)
    buf = exreplay.ExperienceReplay(FRAME, "uint8", capacity=100_000, log=lg)
    a = np.zeros(batch, np.int64)
    r = np.zeros(batch, np.float32)
    period = batch / rate
    n_batches = int(seconds / period)
    backlog = []
    cpu = 0.0
    h = None
    start = time.perf_counter()
    late = 0
    for k in range(n_batches):
        due = start + k * period
        now = time.perf_counter()
        if now < due:
            time.sleep(due - now)
        elif now - due > 0.05:
            late += 1
        i = (k * batch) % (len(frames) - batch)
        c0 = time.thread_time()
        h = buf.record_many(h, frames[i:i + batch], a, r)
        cpu += time.thread_time() - c0
        if lg is not None and k % 100 == 0:
            backlog.append(lg.stats["backlog"])
    wall = time.perf_counter() - start
    out = {"cpu_s": cpu, "frames": n_batches * batch, "wall_s": wall,
           "rate": n_batches * batch / wall, "late_batches": late}
    if lg is not None:
        t = time.perf_counter()
        lg.flush()
        out["drain_s"] = time.perf_counter() - t
        st = lg.stats
        out.update(backlog_max=max(backlog), backlog_last=backlog[-1],
                   backlog_first_half_mean=statistics.mean(backlog[:len(backlog) // 2]),
                   backlog_second_half_mean=statistics.mean(backlog[len(backlog) // 2:]),
                   throttled=st["throttled"], throttle_s=st["throttle_seconds"],
                   file_bytes=st["file_bytes"], raw_bytes=st["raw_bytes"],
                   writer_s=st["writer_seconds"])
        lg.close()
    del buf
    return out


def test_paced_atari_recording(tmp_path):
    seconds = 1.0 if harness.quick() else 4.0
    rounds = 1 if harness.quick() else 4
    frames = atari_frames(4000)
    p = str(tmp_path / "paced.xlog")
    off, on = [], []
    for _ in range(rounds):
        off.append(_paced(frames, None, seconds, p))
        on.append(_paced(frames, 0, seconds, p))
    l1 = _paced(frames, 1, seconds, p)
    cpu_off = statistics.median(x["cpu_s"] for x in off)
    cpu_on = statistics.median(x["cpu_s"] for x in on)
    RESULTS["paced"] = {
        "rate_goal": 50_000, "seconds": seconds, "rounds": rounds,
        "cpu_off_s": cpu_off, "cpu_level0_s": cpu_on,
        "cpu_overhead_level0": cpu_on / cpu_off - 1,
        "cpu_off_rounds": [x["cpu_s"] for x in off],
        "cpu_level0_rounds": [x["cpu_s"] for x in on],
        "rate_off": statistics.median(x["rate"] for x in off),
        "level0": on[len(on) // 2], "level1": l1,
    }


# ---- Ape-X-shaped replay loop --------------------------------------------------------


def _apex(path, seconds, with_log):
    lg = None
    if with_log:
        if os.path.exists(path):
            os.unlink(path)
        lg = exreplay.ExperienceLog(path, level=1)
    buf = exreplay.ExperienceReplay((4,), capacity=100_000, pick_len=1, log=lg, seed=1)
    ps = buf.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    rng = np.random.default_rng(0)
    T = 50
    st = rng.normal(size=(T, 4)).astype(np.float32)
    ac = rng.integers(0, 2, T)
    rw = np.ones(T, np.float32)
    pr = rng.random(T) + 0.1
    stop = threading.Event()
    counts = {"records": 0, "batches": 0}

    def actor():
        h = None
        n = 0
        k = 0
        while not stop.is_set():
            k += 1
            h = buf.record_many(h, st, ac, rw, priorities=pr, terminated=(k % 4 == 0))
            n += T
        counts["records"] = n

    def learner():
        while buf.num_picks < 1000 and not stop.is_set():
            time.sleep(0.001)
        b = 0
        prios = np.ones(256)
        while not stop.is_set():
            batch = buf.get_batch(256, ps)
            buf.set_priority(ps, batch.pick_epi, batch.pick_pos, prios)
            b += 1
        counts["batches"] = b

    ts = [threading.Thread(target=actor), threading.Thread(target=learner)]
    for t in ts:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in ts:
        t.join()
    if lg is not None:
        lg.close()
    return counts["records"] / seconds, counts["batches"] / seconds


def test_apex_replay_loop(tmp_path):
    seconds = 0.5 if harness.quick() else 3.0
    rounds = 1 if harness.quick() else 6
    p = str(tmp_path / "apex.xlog")
    off, on = [], []
    for _ in range(rounds):
        off.append(_apex(p, seconds, False))
        on.append(_apex(p, seconds, True))
    rec_off = statistics.median(x[0] for x in off)
    rec_on = statistics.median(x[0] for x in on)
    mb_off = statistics.median(x[1] for x in off)
    mb_on = statistics.median(x[1] for x in on)
    RESULTS["apex_loop"] = {
        "seconds": seconds, "rounds": rounds,
        "records_per_s_off": rec_off, "records_per_s_log": rec_on,
        "minibatches_per_s_off": mb_off, "minibatches_per_s_log": mb_on,
        "records_ratio": rec_on / rec_off, "minibatches_ratio": mb_on / mb_off,
        "rounds_off": off, "rounds_log": on,
    }


# ---- tail ------------------------------------------------------------------------------


def test_tail_of_a_big_log(tmp_path):
    target = (64 << 20) if harness.quick() else (10 << 30)
    p = str(tmp_path / "big.xlog")
    lg = exreplay.ExperienceLog(p, level=0, chunk_bytes=4 << 20, max_backlog=256 << 20,
                                state_shape=FRAME, state_dtype="uint8")
    frames = atari_frames(1000)
    a = np.zeros(1000, np.int64)
    r = np.zeros(1000, np.float32)
    t0 = time.perf_counter()
    pos = 0
    while lg.stats["file_bytes"] + lg.stats["backlog"] < target:
        lg.append_many(pos // 10_000, pos % 10_000, frames, a, r)
        pos += 1000
    lg.close()
    write_s = time.perf_counter() - t0
    size = os.path.getsize(p)
    times = []
    for _ in range(21):
        s = time.perf_counter()
        t = xlog.tail(p, 100)
        times.append(time.perf_counter() - s)
    assert len(t.timestamps) == 100
    RESULTS["tail"] = {"file_bytes": size, "write_s": write_s,
                       "tail100_median_ms": statistics.median(times) * 1e3,
                       "tail100_max_ms": max(times) * 1e3}
    os.unlink(p)


# ---- merge -----------------------------------------------------------------------------


def test_merge_8_logs(tmp_path):
    per = (2 << 20) if harness.quick() else (48 << 20)  # raw bytes per input
    paths = [str(tmp_path / ("in%d.xlog" % k)) for k in range(8)]
    logs = [exreplay.ExperienceLog(p, source=k, level=1, state_shape=FRAME, state_dtype="uint8")
            for k, p in enumerate(paths)]
    frames = atari_frames(800, seed=3)
    a = np.zeros(50, np.int64)
    r = np.zeros(50, np.float32)
    n = per // (84 * 84)
    for i in range(0, n, 50):
        for k, lg in enumerate(logs):  # interleaved: the merge really merges
            j = (i + 97 * k) % 750
            lg.append_many(0, i, frames[j:j + 50], a, r)
    for lg in logs:
        lg.close()
    bodies = []
    for p in paths:
        with xlog.open(p) as rd:
            bodies.extend(body for _, h, body in rd._headers(True))
    # The baseline: every input chunk decompressed and recompressed at the
    # merge's level, from memory (no file reading, no CRC, no checks), on as
    # many threads as the merge has: serially against merge(threads=0), on
    # a pool of `par` threads (zlib releases the GIL) against
    # merge(threads=par). Each round times the four back to back.
    par = os.cpu_count() or 1
    rounds = 1 if harness.quick() else int(os.environ.get("EXREPLAY_BENCH_MERGE_ROUNDS", "5"))
    out = str(tmp_path / "merged.xlog")

    def recompress(b):
        return len(zlib.compress(zlib.decompress(b), 1))

    def timed_merge(threads):
        if os.path.exists(out):
            os.unlink(out)
        s = time.perf_counter()
        d = xlog.merge(paths, out, level=1, progress=False, threads=threads)
        return time.perf_counter() - s, d

    from concurrent.futures import ThreadPoolExecutor

    t = {"merge_serial": [], "base_serial": [], "merge_par": [], "base_par": []}
    with ThreadPoolExecutor(par) as pool:
        for _ in range(rounds):
            dt, d = timed_merge(0)
            t["merge_serial"].append(dt)
            s = time.perf_counter()
            for b in bodies:
                recompress(b)
            t["base_serial"].append(time.perf_counter() - s)
            dt, d = timed_merge(par)
            t["merge_par"].append(dt)
            s = time.perf_counter()
            list(pool.map(recompress, bodies))
            t["base_par"].append(time.perf_counter() - s)
    total = sum(xlog.info(p)["records"] for p in paths)
    assert d["records"] == total
    in_bytes = sum(os.path.getsize(p) for p in paths)
    med = {k: statistics.median(v) for k, v in t.items()}
    res = {"inputs": 8, "records": total, "input_bytes": in_bytes, "chunks": len(bodies),
           "threads": par, "rounds": rounds, "times": t, "median_s": med}
    for mode in ("serial", "par"):
        m, b = med["merge_" + mode], med["base_" + mode]
        paired = [y / x for x, y in zip(t["merge_" + mode], t["base_" + mode])]
        res[mode] = {"merge_s": m, "recompress_s": b, "merge_vs_recompress": b / m,
                     "paired_median": statistics.median(paired), "paired": paired,
                     "merge_MBps_in": in_bytes / m / 1e6}
    # the headline (section 8's goal row): the parallel pair, both sides on
    # the machine's cores
    res.update(merge_s=med["merge_par"], recompress_s=med["base_par"],
               merge_vs_recompress=med["base_par"] / med["merge_par"])
    RESULTS["merge"] = res
    print("\nmerge of 8 logs: serial %.3fx (%.2f s vs %.2f s), %d threads %.3fx (%.2f s vs %.2f s)"
          % (res["serial"]["merge_vs_recompress"], med["merge_serial"], med["base_serial"], par,
             res["par"]["merge_vs_recompress"], med["merge_par"], med["base_par"]))


# ---- the Ape-X example with and without --log ------------------------------------------


def test_apex_example_with_log(tmp_path):
    """python -m exreplay.examples.apex_cartpole for a fixed time (goal out of
    reach, so every run trains as long), alternating without and with --log:
    mean inserts/s and samples/s of the replay."""
    ray = pytest.importorskip("ray")
    from exreplay.examples import apex_cartpole as apex

    seconds = 4 if harness.quick() else 20
    rounds = 1 if harness.quick() else int(os.environ.get("EXREPLAY_BENCH_APEX_ROUNDS", "3"))
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    runs = {"off": [], "log": []}
    try:
        for r in range(rounds):
            for mode in ("off", "log"):
                argv = ["--seed", str(r), "--time-limit", str(seconds), "--goal", "1e9",
                        "--eval-every", "1e9", "--quiet"]
                if mode == "log":
                    argv += ["--log", str(tmp_path / ("apex%d" % r))]
                s = apex.run(apex.parse_args(argv), log=lambda *a: None)
                runs[mode].append({"inserts_per_s": s["mean_inserts_per_s"],
                                   "samples_per_s": s["mean_samples_per_s"],
                                   "records": s["records"],
                                   "log_records": s.get("log", {}).get("records"),
                                   "merge_s": s.get("log", {}).get("merge_s"),
                                   "writer_s": sum(w["writer_seconds"] for w in
                                                   s.get("log", {}).get("writers", []))})
    finally:
        if started:
            ray.shutdown()
    med = {m: {k: statistics.median(x[k] for x in v) for k in ("inserts_per_s", "samples_per_s")}
           for m, v in runs.items()}
    RESULTS["apex_example"] = {
        "seconds": seconds, "rounds": rounds, "runs": runs, "median": med,
        "inserts_ratio": med["log"]["inserts_per_s"] / med["off"]["inserts_per_s"],
        "samples_ratio": med["log"]["samples_per_s"] / med["off"]["samples_per_s"],
    }
    # each round runs without and then with the log back to back: the
    # ratio within a round cancels the machine's slow drifts
    for k in ("inserts_per_s", "samples_per_s"):
        paired = [b[k] / a[k] for a, b in zip(runs["off"], runs["log"])]
        RESULTS["apex_example"]["paired_" + k] = {
            "median": statistics.median(paired), "ratios": paired,
            "bootstrap_90": _bootstrap_median(paired)}


def _bootstrap_median(xs, n=2000, seed=0):
    """A 90 % bootstrap interval of the median of xs."""
    rng = np.random.default_rng(seed)
    a = np.asarray(xs, float)
    meds = np.median(rng.choice(a, size=(n, len(a))), axis=1)
    return [float(np.quantile(meds, 0.05)), float(np.quantile(meds, 0.95))]
