"""get_batch of named fields against the gather floor, paired in one process.

    python benchmarks/pair_fields_floor.py BUILD_DIR atari|r2d2 [rounds]

BUILD_DIR holds a built exreplay/_core*.so (a worktree built in place).
A buffer with state_spec = {"img": (84, 84) uint8, "vec": (4,) float32} and
one extras field (r2d2: "h" (2, 256) float32, B = 32, L = 80; atari:
"logp" float32, B = 512, L = 1), 40 episodes of 500 steps; each round times
_core._floor_gather_cols (the same fields from one contiguous array each,
into outputs made once) and then get_batch, and the median of the
per-round ratios is printed. Pairing the two in every round keeps the
machine's load out of the ratio better than two separate runs.
"""
import sys, os, time, statistics, numpy as np
import importlib.util, glob
p = glob.glob(sys.argv[1] + "/exreplay/_core*.so")[0]
spec = importlib.util.spec_from_file_location("x._core", p); m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
case = sys.argv[2]; reps = int(sys.argv[3]) if len(sys.argv) > 3 else 40
rng = np.random.default_rng(0); EP=500; NEP=40
img = rng.integers(0, 255, (EP * NEP, 84, 84), dtype=np.uint8); vec = rng.normal(size=(EP * NEP, 4)).astype(np.float32)
if case == "r2d2": L, B, xs, X = 80, 32, {"h": ((2, 256), "float32")}, rng.normal(size=(EP*NEP, 2, 256)).astype(np.float32)
else: L, B, xs, X = 1, 512, {"logp": ((), "float32")}, rng.normal(size=EP*NEP).astype(np.float32)
b = m.ExperienceReplay(state_spec={"img": ((84, 84), "uint8"), "vec": ((4,), "float32")}, extras_spec=xs, capacity=None, pick_len=L, seed=1)
ps = b.new_pick_selector(0)
k = next(iter(xs))
for e in range(NEP):
    sl = slice(e * EP, (e + 1) * EP)
    b.record_many(None, {"img": img[sl], "vec": vec[sl]}, np.zeros(EP, np.int64), np.zeros(EP, np.float32), extras={k: X[sl]}, terminated=True)
cols=[img,vec,X]
out = m._floor_gather_cols(cols, rng.integers(0, EP*NEP-L-2, B), L, 2)
rs=[]; tx=[]; tf=[]
for r in range(reps):
    s = rng.integers(0, EP*NEP-L-2, B)
    t0=time.perf_counter(); m._floor_gather_cols(cols, s, L, 2, out); t1=time.perf_counter()
    b.get_batch(B, ps); t2=time.perf_counter()
    tf.append(t1-t0); tx.append(t2-t1); rs.append((t2-t1)/(t1-t0))
print(f"{case} {os.environ.get('TAG','')} x {statistics.median(tx)*1e3:.3f} ms floor {statistics.median(tf)*1e3:.3f} ms  median ratio {statistics.median(rs):.3f}")
