"""Valgrind's memcheck over the extension: `make memcheck` (Debian: apt-get
install valgrind; not part of `make test`, which needs only Python and a C
compiler).

    python tests/memcheck.py [RUNS]

runs itself again under `valgrind --xml=yes` with PYTHONMALLOC=malloc (so
that each Python object is a heap block of its own), doing the calls
below, and fails if valgrind reports an error with a frame in exreplay's
_core extension: a read of memory never written (memcheck's "uninitialised
value", which AddressSanitizer does not see), or a read or write out of
a block (leak records are not judged: judged() says why). Errors wholly
inside CPython, NumPy or libc are CPython's own (it does not run clean
under memcheck without its suppressions) and are counted but not judged.
RUNS (default 1) repeats the whole run until one fails: the workload's
threads meet differently from run to run, so an error on a path that only
some interleavings take can need several. A failing run's report is kept
as build/memcheck-failed.xml, with stacks 40 frames deep.

The calls cover the binding's paths that keep state between calls: a
batch's block and its draw's notes (get_batch, out=, every set_priority
form), spare batches, the log of a prioritized selector drawn beside
another thread's records, serialize and unserialize."""
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET

WORKLOAD = "--workload"


def workload():
    import numpy as np

    import exreplay

    rng = np.random.default_rng(0)
    buf = exreplay.ExperienceReplay((4,), capacity=2000, pick_len=1, seed=1)
    pr = buf.new_pick_selector(1)
    un = buf.new_pick_selector(0)
    st = rng.random((100, 4), dtype=np.float32)
    ac, rw = np.zeros(100, np.int64), np.ones(100, np.float32)

    def record():
        buf.record_many(None, st, ac, rw, final_state=np.zeros(4, np.float32),
                        priorities=rng.random(100) + 0.1)

    for _ in range(30):
        record()
    for _ in range(10):
        b = buf.get_batch(64, pr)
        buf.set_priority(pr, b, rng.random(64) + 0.1)
        buf.set_priority(pr, b.pick_epi, b.pick_pos, rng.random(64) + 0.1)
        buf.set_priority(pr, b.pick_epi.copy(), b.pick_pos, 1.0, pick_index=b.pick_index)
        record()
        buf.get_batch(64, pr, out=b)
        buf.set_priority(pr, b, 2.0)
        buf.get_batch(32, un)
    # a writer thread beside the draws (detached draws, notes after
    # moves); a fixed number of calls each: valgrind runs one thread at a
    # time, and a writer looping until told to stop could take all of it
    pri = rng.random((40, 256)) + 0.1

    def writer():
        for _ in range(40):
            buf.record_many(buf.new_episode(), st, ac, rw, priorities=pri[0, :100])

    th = threading.Thread(target=writer)
    th.start()
    for k in range(40):
        b = buf.get_batch(256, pr)
        buf.set_priority(pr, b.pick_epi, b.pick_pos, pri[k])
    th.join()
    copy = exreplay.ExperienceReplay.unserialize(buf.serialize())
    copy._check()
    buf._check()


def judged(error):
    """Whether the error is of a kind this script judges: a read of memory
    never written, or an access outside a block. Not a leak record: valgrind
    writes those into its XML although leaks are not checked here, and one
    of them, 8 bytes that glibc allocates for a thread's block of the
    extension's thread-local variables (its thread number, buffer.c) when
    that thread first takes the storage lock, shows up now and then with a
    frame in _core."""
    return not (error.findtext("kind") or "").startswith("Leak_")


def frames_in_core(error):
    """Whether any frame of the error's stacks is in exreplay's extension."""
    for frame in error.iter("frame"):
        obj = frame.findtext("obj") or ""
        if "exreplay" in obj and "_core" in obj:
            return True
    return False


def run_once(xml):
    """One run of the workload under valgrind; 1 if it failed, else 0."""
    env = dict(os.environ, PYTHONMALLOC="malloc", OPENBLAS_NUM_THREADS="1")
    cmd = ["valgrind", "--xml=yes", f"--xml-file={xml}", "--track-origins=yes",
           "--num-callers=40", "--leak-check=no", sys.executable, os.path.abspath(__file__),
           WORKLOAD]
    done = subprocess.run(cmd, env=env)
    if done.returncode != 0:
        print(f"memcheck: the workload under valgrind exited {done.returncode}")
        return 1
    errors = ET.parse(xml).getroot().findall("error")
    ours = [e for e in errors if judged(e) and frames_in_core(e)]
    for e in ours:
        print("memcheck:", e.findtext("kind"), "-", e.findtext("what") or e.findtext("xwhat/text"))
        for frame in e.iter("frame"):
            print("   ", frame.findtext("fn"), frame.findtext("file"), frame.findtext("line"))
    kinds = sum(1 for e in errors if judged(e))
    print(f"memcheck: {len(errors)} errors reported ({kinds} not leak records), {len(ours)} "
          "with a frame in exreplay's _core")
    return 1 if ours else 0


def main():
    if WORKLOAD in sys.argv:
        workload()
        return 0
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    os.makedirs("build", exist_ok=True)
    xml = os.path.abspath("build/memcheck.xml")
    for k in range(runs):
        if run_once(xml):
            if os.path.exists(xml):
                os.replace(xml, os.path.abspath("build/memcheck-failed.xml"))
            print(f"memcheck: run {k + 1} of {runs} failed (its report: build/memcheck-failed.xml)")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
