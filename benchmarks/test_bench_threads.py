"""Threads: one thread recording and one sampling, against the same work done
sequentially in one thread (docs/design.md: the GIL is released inside record_many,
get_batch and set_priority, and the buffer guards itself).

The workloads, each on a buffer filled to capacity first (so recording evicts):

- "apex": CartPole-like states (4,) float32, capacity 200k, one prioritized
  selector; the actor thread `record_many`s 100-step rollouts with initial
  priorities, the learner thread draws `get_batch(256)` and `set_priority`s
  the 256 picks (the Ape-X shape, docs/ray.md).
- "apex_two_buffers": the same two sides, the writer on a second buffer of the
  same shape and fill: nothing of exreplay is shared, so this is what the
  interpreter and the machine leave the "apex" row (a reference, not a goal).
- "atari": 84x84 uint8 states, capacity 20k, pick_len 1, uniform; the actor
  `record_many`s 100-step rollouts, the learner draws `get_batch(64)`.
- "apex_writer_numpy": apex's writer beside a thread doing NumPy work that
  releases the GIL (the control's np.sin, below), as a learner thread
  training with NumPy or PyTorch does. A reference, not a goal: the writer's
  rollouts are small calls, which keep the GIL while no exreplay call is
  out (docs/design.md, "The binding's one idiom"), so the NumPy thread can
  wait for it until the interpreter's switch interval; this row shows
  what that costs.
- "dqn_sampler_numpy": a thread drawing small batches (`get_batch(32)`,
  uniform, from apex's buffer) beside the same NumPy thread: the same
  reference for small batches.

The counts of each side are calibrated so that each side alone takes about
the same time T (0.3 s full), so the best possible speedup on 2 cores is 2.
One round: the sequential run (all records, then all samples) and the
concurrent run (both threads started together; wall time until both end).
speedup = median(sequential) / median(concurrent), over interleaved rounds.
A "control" workload (NumPy np.sin on both sides, no exreplay) measures
what two threads can get from the machine at that moment; every other
workload also runs a control round right before each of its own rounds and
reports the control's median speedup over those rounds (control_speedup),
so that its ratio to the control pairs moments when the machine was the same.
Timed with time.perf_counter (pytest-benchmark times one callable).
"""

import threading
import time

import numpy as np
import pytest

import harness

EP = 100


def _apex():
    cap = 20_000 if harness.quick() else 200_000
    buf = harness.impl_class("exreplay")(state_shape=harness.SMALL_SHAPE, capacity=cap, pick_len=1, seed=1)
    pr = harness.prioritized(buf)
    harness.fill(buf, cap, EP, with_priorities=True)
    st, ac, rw, fin, pri = harness.episode_arrays(EP, with_priorities=True)
    new_p = np.random.default_rng(5).random(256) + 0.05

    def rec():
        buf.record_many(buf.new_episode(), st, ac, rw, final_state=fin, priorities=pri)

    def samp():
        b = buf.get_batch(256, pr)
        buf.set_priority(pr, b.pick_epi, b.pick_pos, new_p)

    return buf, rec, samp, dict(state="(4,) float32", capacity=cap, record="record_many(100 steps, priorities)",
                                sample="get_batch(256, prioritized) + set_priority(256)")


def _apex_two_buffers():
    """The Ape-X pair with the writer on a second buffer of the same shape and
    fill: the two threads share nothing of exreplay (no lock, no memory either
    writes), only the interpreter and the machine. Not a goal: the ceiling the
    apex row can reach, measured in the same run."""
    buf, _, samp, desc = _apex()
    _, rec, _, _ = _apex()
    return buf, rec, samp, dict(desc, record=desc["record"] + " on a second buffer")


def _apex_writer_numpy():
    """Apex's writer and a NumPy thread (the control's work, GIL released
    inside each ufunc call)."""
    buf, rec, _, desc = _apex()
    _, numpy_work, _, _ = _control()
    return buf, rec, numpy_work, dict(desc, sample="np.sin(64k float64, out=)")


def _dqn_sampler_numpy():
    """Small uniform batches from apex's buffer, and a NumPy thread."""
    buf, _, _, desc = _apex()
    ps = harness.uniform(buf)
    _, numpy_work, _, _ = _control()

    def samp():
        buf.get_batch(32, ps)

    return buf, samp, numpy_work, dict(desc, record="get_batch(32, uniform)",
                                       sample="np.sin(64k float64, out=)")


def _atari():
    cap = 2_000 if harness.quick() else 20_000
    buf = harness.impl_class("exreplay")(
        state_shape=harness.ATARI_SHAPE, state_dtype="uint8", capacity=cap, pick_len=1, seed=1
    )
    ps = harness.uniform(buf)
    harness.fill(buf, cap, EP, harness.ATARI_SHAPE, harness.ATARI_DTYPE)
    st, ac, rw, fin, _ = harness.episode_arrays(EP, harness.ATARI_SHAPE, harness.ATARI_DTYPE)

    def rec():
        buf.record_many(buf.new_episode(), st, ac, rw, final_state=fin)

    def samp():
        buf.get_batch(64, ps)

    return buf, rec, samp, dict(state="(84, 84) uint8", capacity=cap, record="record_many(100 steps)",
                                sample="get_batch(64, uniform)")


def _atari_samplers():
    """Two learner threads drawing get_batch(64) from one Atari buffer."""
    buf, _, samp, desc = _atari()
    return buf, samp, samp, dict(desc, record="get_batch(64, uniform)")


def _atari_writers():
    """Two actor threads record_many-ing 100-step Atari rollouts into one buffer."""
    buf, rec, _, desc = _atari()
    return buf, rec, rec, dict(desc, sample="record_many(100 steps)")


def _control():
    """The machine's own ceiling: GIL-free NumPy work (np.sin over 64k float64
    into a preallocated array: a ufunc loop, GIL released, single-threaded) on
    both sides.  On an idle 2-core machine it nears 2x; when the other core is
    busy (shared machine), everything drops with it."""
    x = np.random.default_rng(7).random(1 << 16)
    y1, y2 = np.empty_like(x), np.empty_like(x)

    def one():
        np.sin(x, out=y1)

    def two():
        np.sin(x, out=y2)

    return None, one, two, dict(state="–", capacity=0, record="np.sin(64k float64, out=)",
                                sample="np.sin(64k float64, out=)")


def _loop(fn, n):
    for _ in range(n):
        fn()


WORKLOADS = {"apex": _apex, "apex_two_buffers": _apex_two_buffers, "atari": _atari,
             "atari_samplers": _atari_samplers, "atari_writers": _atari_writers, "control": _control,
             "apex_writer_numpy": _apex_writer_numpy, "dqn_sampler_numpy": _dqn_sampler_numpy}


def _per_call(fn, T):
    """Seconds per call of fn as a loop of it runs: 21 calls first (the
    first calls after the fill touch cold memory: the Ape-X sampler's took
    about twice its time in a loop), then loops of doubling length until
    one lasts T / 4; its mean, the occasional slow call included."""
    _loop(fn, 21)
    n = 8
    while True:
        t0 = time.perf_counter()
        _loop(fn, n)
        dt = time.perf_counter() - t0
        if dt >= T / 4:
            return dt / n
        n *= 2


def _counts(rec, samp, T):
    """Calls of each side that take about T alone."""
    return max(1, int(T / _per_call(rec, T))), max(1, int(T / _per_call(samp, T)))


def _crosscore(xc):
    """The rounds' cross-core round trips (harness.crosscore_ns) as the
    results record them, and as the printed line says them."""
    fields = dict(crosscore_ns=float(np.median(xc)), crosscore_ns_range=[float(min(xc)), float(max(xc))])
    return fields, f"cross-core round trip {fields['crosscore_ns']:.0f} ns ({min(xc):.0f}-{max(xc):.0f})"


def _round(rec, n_rec, samp, n_samp):
    """One sequential run (all records, then all samples) and one concurrent
    run (both threads started together): (sequential, its record part, its
    sample part, concurrent wall time)."""
    t0 = time.perf_counter()
    _loop(rec, n_rec)
    t1 = time.perf_counter()
    _loop(samp, n_samp)
    t2 = time.perf_counter()
    return t2 - t0, t1 - t0, t2 - t1, harness.together([(rec, n_rec), (samp, n_samp)])


@pytest.mark.parametrize("workload", ["control", "apex", "apex_two_buffers", "atari", "atari_samplers",
                                      "atari_writers", "apex_writer_numpy", "dqn_sampler_numpy"])
def test_threads(workload):
    """A workload's speedup, and the control's speedup measured in the same
    rounds (a control round right before each of the workload's), so that
    the ratio of the two compares moments when the machine was the same."""
    buf, rec, samp, desc = WORKLOADS[workload]()
    T = harness.thread_seconds()
    n_rec, n_samp = _counts(rec, samp, T)
    paired = workload != "control"
    if paired:
        _, c_one, c_two, _ = _control()
        c_n1, c_n2 = _counts(c_one, c_two, T)

    seq, par, seq_rec, seq_samp, ctl, xc = [], [], [], [], [], []
    for _ in range(harness.rounds(7, 2)):
        xc.append(harness.crosscore_ns())
        if paired:
            c_seq, _, _, c_par = _round(c_one, c_n1, c_two, c_n2)
            ctl.append(c_seq / c_par)
        s, s_rec, s_samp, p = _round(rec, n_rec, samp, n_samp)
        seq.append(s)
        seq_rec.append(s_rec)
        seq_samp.append(s_samp)
        par.append(p)

    m_seq, m_par = float(np.median(seq)), float(np.median(par))
    xc_fields, xc_txt = _crosscore(xc)
    desc = dict(desc, **xc_fields)
    if paired:
        desc = dict(desc, control_speedup=float(np.median(ctl)))
    ops = n_rec + n_samp
    harness.add_custom(
        "threads", workload=workload, n_record_calls=n_rec, n_sample_calls=n_samp,
        seq_s=m_seq, par_s=m_par, seq_record_s=float(np.median(seq_rec)), seq_sample_s=float(np.median(seq_samp)),
        speedup=m_seq / m_par, seq_ops_per_s=ops / m_seq, par_ops_per_s=ops / m_par,
        records_per_s_par=n_rec * EP / m_par, rounds=len(seq), **desc,
    )
    ctl_txt = f", control in the same rounds {desc['control_speedup']:.2f}x" if paired else ""
    print(f"\nthreads {workload}: sequential {m_seq * 1e3:.1f} ms (record part {np.median(seq_rec) * 1e3:.0f}, "
          f"sample part {np.median(seq_samp) * 1e3:.0f}), concurrent {m_par * 1e3:.1f} ms, "
          f"speedup {m_seq / m_par:.2f}x ({n_rec} record calls + {n_samp} sample calls){ctl_txt}; {xc_txt}")
    assert buf is None or len(buf) > 0


# --- 4 writers and 1 learner ------------------------------------------------------

WRITERS = 4
# Each writer thread records, then waits as an actor stepping its environment
# would: busy this fraction of the time when alone (4 writers: half a core in
# all), so that the learner's core is its own unless the buffer takes it.
WRITER_DUTY = 0.125


@pytest.mark.parametrize("shape", ["apex", "atari"])
def test_writers_and_learner(shape):
    """The learner's batches/s alone, and with 4 writer threads recording at
    the same time (goal: >= 0.8x). Both from the same run, interleaved. Each
    round also runs two references, not goals: the learner beside the same 4
    writers recording into a second buffer of the same shape and fill (the
    threads then share nothing of exreplay: what the interpreter, the cores
    and the scheduler leave the learner), and beside 4 threads that wake as
    often as the round's writers on its buffer called and make no call at
    all (what taking the GIL back at each wake-up, at that rate, alone
    leaves it)."""
    make = {"apex": _apex, "atari": _atari}[shape]
    buf, rec, samp, desc = make()
    _, rec_apart, _, _ = make()
    D = 0.3 if harness.quick() else 2.0
    t_rec = harness.median_time(rec, 21)
    pause = t_rec * (1 / WRITER_DUTY - 1)

    def learner(stop, out):
        n = 0
        t0 = time.perf_counter()
        while not stop.is_set():
            samp()
            n += 1
        out.append(n / (time.perf_counter() - t0))

    def writer(stop, out, fn):
        n = 0
        while not stop.is_set():
            fn()
            n += 1
            stop.wait(pause)
        out.append(n)

    def waker(stop, out, cycle):
        # wakes once every `cycle` seconds, whatever a wake-up costs: each
        # wait runs to the next point of a fixed schedule. Only real waits
        # count; a waker that fell behind starts the schedule again from
        # now rather than looping through the points it missed.
        n, due = 0, time.perf_counter()
        while not stop.is_set():
            due += cycle
            left = due - time.perf_counter()
            if left > 0:
                stop.wait(left)
                n += 1
            else:
                due = time.perf_counter()
        out.append(n)

    def phase(writers_fn, cycle=None):
        stop, lrate, wcounts = threading.Event(), [], []
        ths = [threading.Thread(target=learner, args=(stop, lrate))]
        if writers_fn is not None:
            ths += [threading.Thread(target=writer, args=(stop, wcounts, writers_fn)) for _ in range(WRITERS)]
        if cycle is not None:
            ths += [threading.Thread(target=waker, args=(stop, wcounts, cycle)) for _ in range(WRITERS)]
        for th in ths:
            th.start()
        time.sleep(D)
        stop.set()
        for th in ths:
            th.join()
        return lrate[0], sum(wcounts) / D  # the learner's rate; the others' calls (or wakes) a second

    alone, together, records, apart, records_apart, wakers, wakes, xc = [], [], [], [], [], [], [], []
    for _ in range(harness.rounds(5, 1)):
        xc.append(harness.crosscore_ns())
        alone.append(phase(None)[0])
        r, calls_s = phase(rec)
        together.append(r)
        records.append(calls_s * EP)
        r, calls_apart_s = phase(rec_apart)
        apart.append(r)
        records_apart.append(calls_apart_s * EP)
        # the idle wakers wake as often as this round's writers on the
        # learner's buffer called (each: once every WRITERS / calls_s s)
        r, wake_s = phase(None, cycle=WRITERS / calls_s if calls_s else pause + t_rec)
        wakers.append(r)
        wakes.append(wake_s)
    m_alone, m_tog = float(np.median(alone)), float(np.median(together))
    xc_fields, xc_txt = _crosscore(xc)
    m_apart, m_wakers = float(np.median(apart)), float(np.median(wakers))
    harness.add_custom(
        "writers_learner", workload=shape, writers=WRITERS, writer_duty=WRITER_DUTY,
        learner_alone_per_s=m_alone, learner_with_writers_per_s=m_tog, ratio=m_tog / m_alone,
        records_per_s=float(np.median(records)), calls_per_s=float(np.median(records)) / EP,
        learner_writers_apart_per_s=m_apart, ratio_apart=m_apart / m_alone,
        records_per_s_apart=float(np.median(records_apart)), learner_wakers_per_s=m_wakers,
        ratio_wakers=m_wakers / m_alone, wakes_per_s=float(np.median(wakes)),
        phase_s=D, rounds=len(alone), **xc_fields, **desc,
    )
    print(f"\n4 writers + 1 learner {shape}: learner alone {m_alone:.0f}/s, with writers {m_tog:.0f}/s "
          f"({m_tog / m_alone:.2f}x), writers {np.median(records):.0f} records/s; writers on a second buffer: "
          f"learner {m_apart:.0f}/s ({m_apart / m_alone:.2f}x), writers {np.median(records_apart):.0f} records/s; "
          f"4 idle wakers: learner {m_wakers:.0f}/s ({m_wakers / m_alone:.2f}x), {np.median(wakes):.0f} wakes/s "
          f"(writers' calls/s {np.median(records) / EP:.0f}); {xc_txt}")
    assert len(buf) > 0
