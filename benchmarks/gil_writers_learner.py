"""What CPython's GIL and this machine leave the learner in the 4 writers + 1
learner pattern of benchmarks/test_bench_threads.py, with no replay buffer:
exreplay's calls replaced by NumPy ufunc calls of the same duration (np.sin
into a preallocated array releases the GIL, as record_many and get_batch do).

    OPENBLAS_NUM_THREADS=1 python benchmarks/gil_writers_learner.py

Prints, for two pairs of call lengths, the learner's calls/s alone and with 4
writer threads busy 12.5% of the time (the suite's WRITER_DUTY), 5 rounds of
2 s phases, medians."""
import threading
import time

import numpy as np

def sized(us):
    n = 64
    while True:
        x = np.random.rand(n); y = np.empty_like(x)
        t = time.perf_counter(); k = 0
        while time.perf_counter() - t < 0.05:
            np.sin(x, out=y); k += 1
        per = (time.perf_counter() - t) / k
        if per * 1e6 >= us:
            return (lambda x=x, y=y: np.sin(x, out=y)), per
        n *= 2 if per * 1e6 < us / 2 else 1.2
        n = int(n)

def run(rec_us, samp_us, D=2.0, rounds=5, duty=0.125):
    rec, t_rec = sized(rec_us)
    samp, t_samp = sized(samp_us)
    pause = t_rec * (1 / duty - 1)
    def learner(stop, out):
        n = 0; t0 = time.perf_counter()
        while not stop.is_set():
            samp(); n += 1
        out.append(n / (time.perf_counter() - t0))
    def writer(stop, out):
        n = 0
        while not stop.is_set():
            rec(); n += 1; stop.wait(pause)
        out.append(n)
    def phase(w):
        stop, lr, wc = threading.Event(), [], []
        ths = [threading.Thread(target=learner, args=(stop, lr))]
        if w: ths += [threading.Thread(target=writer, args=(stop, wc)) for _ in range(4)]
        for t in ths: t.start()
        time.sleep(D); stop.set()
        for t in ths: t.join()
        return lr[0], sum(wc) / D
    al, tg, wr = [], [], []
    for _ in range(rounds):
        al.append(phase(False)[0]); r, w = phase(True); tg.append(r); wr.append(w)
    a, t = np.median(al), np.median(tg)
    print(f"writer call {t_rec*1e6:.1f} us, learner call {t_samp*1e6:.1f} us: learner alone {a:.0f}/s, "
          f"with 4 writers {t:.0f}/s ({t/a:.2f}x), writer calls {np.median(wr):.0f}/s", flush=True)

if __name__ == "__main__":
    for rec_us, samp_us in ((8, 40), (80, 160)):
        run(rec_us, samp_us)
