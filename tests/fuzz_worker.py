"""Mutation fuzzer of ExperienceReplay.unserialize (docs/format.md), run as a subprocess.

tests/test_fuzz.py starts this script (so that a segfault or an abort fails
that test instead of killing pytest); fuzz/atheris_unserialize.py imports it
for its seed buffers, its format helpers and its per-input oracle.

    python tests/fuzz_worker.py --count 100000 --seed 1 --out /tmp/fuzz
    python tests/fuzz_worker.py --seed 1 --only 4711          # re-run one input
    python tests/fuzz_worker.py --replay /tmp/fuzz/failure.bin   # re-run a saved input

Every input is made deterministically from (--seed, its index): input i uses
random.Random(f"{seed}:{i}"), so any input can be regenerated alone with
--only i, and --shard k --shards K runs the indices i = k (mod K).

The oracle (check_input): ExperienceReplay.unserialize(data) either raises
ValueError, or returns a buffer that passes _check(), serializes again (level
0, and that output unserializes and passes _check() too), serves get_batch on
each of its selectors when it holds picks, and accepts one more record (which
exercises eviction with the restored eviction state). Anything else is a
failure: another exception (MemoryError included), a failed _check(), an
input that takes longer than --max-input-seconds, a crash or a hang.

Before it runs an input the worker copies it into OUT/current.bin (a shared
memory mapping: it survives a crash of this process), so the parent can name
the input that crashed or hung the worker. A Python-level failure is saved as
OUT/failure.bin and printed as hex. The last line on stdout is always
``FUZZ-SUMMARY {json}`` unless the process died.

Mutations (see mutate()): bit flips; bytes set to 0, 1, 0x7f, 0x80, 0xff or a
random value; inserted, deleted and duplicated byte ranges; truncation;
splicing two buffers; u32/u64 fields (found by parsing the seed's payload, or
at random offsets) overwritten with 0, 1, 2**31, 2**32-1, 2**63, 2**64-1, -1
and neighbours of the old value; f32/f64 fields with NaN, +-inf, -1, -0, the
smallest subnormal and the largest finite value. The modes (see make_input()):

- "fixed" (most inputs): the payload is mutated and then the header is made
  consistent again: payload crc32 (header bytes 32..35) and header crc32
  (36..39) recomputed; raw_len and body_len set to the new lengths in most
  cases, to boundary or off-by-one values otherwise. For zlib seeds the body
  is decompressed, the payload mutated, then recompressed. So each field's
  own validation is what rejects the input, not the checksum.
- "zbody": a zlib seed's compressed body mutated; lengths and header crc fixed.
- "raw": the whole serialized buffer, header included, mutated with no fix-up
  (in half of them the header crc is fixed so the header's other checks run).
- "bomb": a short zlib body of zeros whose header declares the largest raw
  length the format permits (1032 per compressed byte), or more.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import mmap
import os
import random
import resource
import struct
import sys
import time
import warnings
import zlib

import numpy as np

import exreplay

HEADER = 40
MAGIC = b"EXREPLAY"
ZLIB_MAX_RATIO = 1032
SEC_CONFIG, SEC_META, SEC_EPISODES, SEC_PICKS, SEC_SELECTORS, SEC_END = range(1, 7)
KIND_UNIFORM, KIND_PRIORITIZED = 0, 1

U32_VALUES = (0, 1, 2, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x10000,
              2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1)
U64_VALUES = (0, 1, 2, 0xFF, 2**20, 2**31, 2**32 - 1, 2**32, 2**40, 2**40 + 1,
              2**62, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
F32_VALUES = (float("nan"), float("inf"), float("-inf"), -1.0, -0.0, 0.0, 1.0,
              1e-45, 3.4028234663852886e38, 1e30)
F64_VALUES = (float("nan"), float("inf"), float("-inf"), -1.0, -0.0, 0.0, 0.5, 1.0,
              5e-324, 1.7976931348623157e308, 1e300)
BYTE_VALUES = (0, 1, 0x7F, 0x80, 0xFF)


# ---- the format --------------------------------------------------------------


def crc(b) -> int:
    return zlib.crc32(b) & 0xFFFFFFFF


def make_header(raw_len, body_len, codec, payload_crc, version=2) -> bytearray:
    h = bytearray(MAGIC + struct.pack("<IIQQI", version, codec, raw_len, body_len, payload_crc))
    h += struct.pack("<I", crc(h))
    return h


def fix_header_crc(h: bytearray) -> None:
    h[36:40] = struct.pack("<I", crc(bytes(h[:36])))


def pack(payload: bytes, level: int) -> bytes:
    """A serialized buffer for this payload, as serialize(level) writes it."""
    body = payload if level == 0 else zlib.compress(payload, level)
    return bytes(make_header(len(payload), len(body), int(level > 0), crc(payload)) + body)


def unpack(data: bytes):
    """(codec, payload) of a well-formed serialized buffer."""
    codec = struct.unpack_from("<I", data, 12)[0]
    body = data[HEADER:]
    return codec, (zlib.decompress(body) if codec else body)


def _picks_target(n, ended, pick_len, allow_short):
    c = n if ended else max(n - 1, 0)
    if ended and allow_short:
        return c
    return c - pick_len + 1 if c >= pick_len else 0


def parse_payload(p: bytes):
    """Fields of a well-formed payload: (fields, info).

    fields: (offset, size, type) with type in u8 u32 u64 f32 f64 (the fields
    worth overwriting with boundary values); info: the selectors
    [(handle, kind)] and the config, for the oracle.
    """
    f = []
    off = 0

    def sec():
        nonlocal off
        tag, _, ln = struct.unpack_from("<IIQ", p, off)
        f.extend([(off, 4, "u32"), (off + 4, 4, "u32"), (off + 8, 8, "u64")])
        off += 16
        return tag, ln

    sec()  # CONFIG
    sb, ab, rb, cap, pick_len = struct.unpack_from("<QQQQI", p, off)
    eb = struct.unpack_from("<Q", p, off + 72)[0]  # extras (version 2)
    allow_short = p[off + 36]
    for o in (0, 8, 16, 24):
        f.append((off + o, 8, "u64"))
    f += [(off + 32, 4, "u32"), (off + 36, 1, "u8"), (off + 37, 1, "u8"), (off + 38, 1, "u8")]
    for o in (40, 48, 56, 64, 72):
        f.append((off + o, 8, "u64"))
    off += 80
    _, mlen = sec()  # META
    m = off
    f.append((m, 1, "u8"))  # version
    q = m + 1
    for _ in range(2):  # shapes
        nd = p[q]
        f.append((q, 1, "u8"))
        q += 1
        for _ in range(nd):
            f.append((q, 8, "u64"))
            q += 8
    for _ in range(3):  # dtype strings
        ln = p[q]
        f.append((q, 1, "u8"))
        for k in range(ln):
            f.append((q + 1 + k, 1, "u8"))
        q += 1 + ln
    f.append((q, 1, "u8"))  # seed_none
    q += 1
    if p[m] == 2:  # named fields: flags, then each set
        flags = p[q]
        f.append((q, 1, "u8"))
        q += 1
        for _ in range(bin(flags & 3).count("1")):
            f.append((q, 1, "u8"))  # field count
            nf = p[q]
            q += 1
            for _ in range(nf):
                f.append((q, 1, "u8"))  # name length
                q += 1 + p[q]
                f.append((q, 1, "u8"))  # nd
                nd = p[q]
                q += 1
                for _ in range(nd):
                    f.append((q, 8, "u64"))
                    q += 8
                f.append((q, 1, "u8"))  # dtype length
                f.append((q + 1, 1, "u8"))  # its byte order
                q += 1 + p[q]
    off = m + mlen
    sec()  # EPISODES
    count = struct.unpack_from("<Q", p, off)[0]
    f.append((off, 8, "u64"))
    off += 8
    for _ in range(count):
        n = struct.unpack_from("<Q", p, off + 8)[0]
        ended, has_final = p[off + 16], p[off + 19]
        f += [(off, 8, "u64"), (off + 8, 8, "u64"), (off + 16, 1, "u8"), (off + 17, 1, "u8"),
              (off + 18, 1, "u8"), (off + 19, 1, "u8"), (off + 20, 4, "u32")]
        off += 24
        if has_final:
            off += sb
        if n and rb == 4:
            f.append((off + n * (sb + ab), 4, "f32"))  # first reward
        off += n * (sb + ab + rb + eb)
        mm = _picks_target(n, ended, pick_len, allow_short)
        for k in range(n - mm):
            f.append((off + 4 * k, 4, "f32"))  # pending priorities
        off += 4 * (n - mm)
    sec()  # PICKS
    npk = struct.unpack_from("<Q", p, off)[0]
    f.append((off, 8, "u64"))
    off += 8
    for k in range(min(npk, 64)):
        f += [(off + 8 * k, 4, "u32"), (off + 8 * k + 4, 4, "u32")]
    off += 8 * npk
    sec()  # SELECTORS
    nsel = struct.unpack_from("<Q", p, off)[0]
    f.append((off, 8, "u64"))
    off += 8
    sels = []
    for _ in range(nsel):
        h, kind, npar = struct.unpack_from("<QII", p, off)
        sels.append((h, kind))
        f += [(off, 8, "u64"), (off + 8, 4, "u32"), (off + 12, 4, "u32")]
        for o in range(16, 56, 8):
            f.append((off + o, 8, "u64"))
        off += 56
        for k in range(npar):
            f.append((off + 8 * k, 8, "f64"))
        off += 8 * npar
        slen = struct.unpack_from("<Q", p, off)[0]
        f.append((off, 8, "u64"))
        off += 8
        if kind == KIND_PRIORITIZED and slen >= 8:
            f.append((off, 8, "f64"))  # max_prio
            for k in range(min((slen - 8) // 4, 64)):
                f.append((off + 8 + 4 * k, 4, "f32"))
        off += slen
    sec()  # END
    info = {"selectors": sels, "state_bytes": sb, "action_bytes": ab, "reward_bytes": rb,
            "extra_bytes": eb, "pick_len": pick_len, "capacity": cap}
    return f, info


# ---- seeds ---------------------------------------------------------------------


def _rand(rng, spec, shape=None, dt=None):
    if spec:
        return {k: (rng.random(sh) * 100).astype(d) for k, (sh, d) in spec.items()}
    return (rng.random(shape) * 100).astype(dt)


def _rec(buf, h, rng, n, final=False, terminated=False, prio=False):
    spec = buf.state_spec
    shape, dt = buf.state_shape, None if spec else np.dtype(buf.state_dtype)
    adt, ash = np.dtype(buf.action_dtype), buf.action_shape
    for t in range(n):
        s = _rand(rng, spec, shape, dt)
        a = (rng.random(ash) * 3).astype(adt)
        last = t == n - 1
        kw = {}
        if buf.extras_spec:
            kw["extras"] = _rand(rng, buf.extras_spec)
        if prio and t % 2 == 0:
            kw["priority"] = float(rng.random() * 2)
        if last and final:
            kw["final_state"] = _rand(rng, spec, shape, dt)
        if last and terminated:
            kw["terminated"] = True
        h = buf.record(h, s, a, float(t) * 0.5, **kw)
    return h


def seed_buffers():
    """Small valid buffers covering every part of the format: [(name, buffer)]."""
    ER, K = exreplay.ExperienceReplay, exreplay.PickSelectorClass
    rng = np.random.default_rng(12345)
    out = []

    # 1: CartPole-like, uniform + prioritized, episodes ended (final state,
    #    terminated without one) and open, priorities, set_priority.
    b = ER(state_shape=(4,), capacity=None, seed=7)
    u = b.new_pick_selector(K.Uniform)
    p = b.new_pick_selector(K.Prioritized, alpha=0.7, beta=0.5)
    b.new_pick_selector(K.Rank, alpha=0.6, beta=0.5)
    _rec(b, b.new_episode(), rng, 5, final=True, prio=True)
    _rec(b, b.new_episode(), rng, 3, terminated=True)
    _rec(b, b.new_episode(), rng, 4, prio=True)
    bt = b.get_batch(4, p)
    b.set_priority(p, bt.pick_epi, bt.pick_pos, np.linspace(0.0, 3.0, 4))
    b.get_batch(2, u)
    out.append(("cartpole", b))

    # 2: image-like uint8 states, array actions, float64 rewards, pick_len 3
    #    with short picks, second-chance eviction that has run (hand, sampled
    #    flags), two prioritized selectors, one removed selector.
    b = ER(state_shape=(3, 2), state_dtype="uint8", action_shape=(2,), action_dtype="float32",
           reward_dtype="float64", capacity=14, pick_len=3, allow_short=True,
           eviction="second_chance", seed=99)
    p1 = b.new_pick_selector(K.Prioritized)
    gone = b.new_pick_selector(K.Uniform)
    u = b.new_pick_selector(K.Uniform)
    p2 = b.new_pick_selector(K.Prioritized, alpha=1.0, beta=0.0)
    b.remove_pick_selector(gone)
    for i in range(5):
        _rec(b, b.new_episode(), rng, 3 + i % 3, final=i % 2 == 0, terminated=i == 1, prio=True)
        if b.num_picks:
            b.get_batch(3, p1 if i % 2 else u)
    _rec(b, b.new_episode(), rng, 2)
    b.get_batch(2, p2)
    out.append(("atari-ish", b))

    # 3: empty, one prioritized selector, seed None.
    b = ER(state_shape=(2,), state_dtype="int16", action_shape=(), action_dtype="int32",
           reward_dtype="float16", capacity=100, pick_len=2)
    b.new_pick_selector(K.Prioritized, alpha=0.0, beta=1.0)
    out.append(("empty", b))

    # 4: empty episodes, an open one-step episode, pick_len 2 (no short picks),
    #    FIFO eviction that has run.
    b = ER(state_shape=(), state_dtype="float64", action_dtype="uint8", capacity=9, pick_len=2,
           seed=3)
    u = b.new_pick_selector(K.Uniform)
    b.new_episode()
    for i in range(4):
        _rec(b, b.new_episode(), rng, 3, final=True, terminated=i % 2 == 1, prio=i == 2)
    b.new_episode()
    _rec(b, b.new_episode(), rng, 1)
    out.append(("fifo-short", b))

    # 5: no selectors at all, one long episode spanning several segments.
    b = ER(state_shape=(1,), state_dtype="uint8", action_dtype="int8", capacity=None, pick_len=1,
           seed=0)
    _rec(b, b.new_episode(), rng, 40, final=True)
    out.append(("no-selectors", b))

    # 6: named state fields and per-step extras (format version 2, META
    #    version 2): short picks, a prioritized selector, FIFO eviction.
    b = ER(state_spec={"img": ((2, 3), "uint8"), "vec": ((2,), "float32")},
           extras_spec={"logp": ((), "float32"), "mask": ((3,), "bool")},
           capacity=12, pick_len=2, allow_short=True, seed=5)
    p = b.new_pick_selector(K.Prioritized)
    for i in range(4):
        _rec(b, b.new_episode(), rng, 2 + i, final=i % 2 == 0, terminated=i == 3, prio=True)
    _rec(b, b.new_episode(), rng, 2)
    b.get_batch(3, p)
    out.append(("fields", b))

    # 7: named state fields without extras (version 1 header, META version 2)
    b = ER(state_spec={"o": ((3,), "int16")}, capacity=None, pick_len=1, seed=6)
    b.new_pick_selector(K.Uniform)
    _rec(b, b.new_episode(), rng, 3, final=True)
    out.append(("fields-noextras", b))
    for _, b in out:
        b._check()
    return out


def seed_inputs():
    """[(name, level, bytes)]: every seed buffer at level 0 and at level 6."""
    res = []
    for name, b in seed_buffers():
        for level in (0, 6):
            res.append((f"{name}/L{level}", level, b.serialize(level=level)))
    return res


# ---- mutations -------------------------------------------------------------------


def _put_int(b: bytearray, off: int, size: int, v: int) -> None:
    if off < 0 or off + size > len(b):
        return
    b[off:off + size] = (v % (1 << (8 * size))).to_bytes(size, "little")


def _int_value(r: random.Random, size: int, old: int) -> int:
    c = r.random()
    if c < 0.6:
        vals = U64_VALUES if size == 8 else U32_VALUES if size == 4 else BYTE_VALUES
        v = r.choice(vals)
        if r.random() < 0.15:
            v = -1
        return v
    if c < 0.9:
        return old + r.choice((-2, -1, 1, 2, 8, -8, 16, 1024))
    return r.getrandbits(8 * size)


def mut_field(r, b: bytearray, fields) -> None:
    """Overwrite one field found by parse_payload with a boundary value."""
    if not fields:
        return mut_int(r, b, fields)
    off, size, typ = r.choice(fields)
    if off + size > len(b):
        return
    if typ == "f32":
        b[off:off + 4] = struct.pack("<f", r.choice(F32_VALUES))
    elif typ == "f64":
        b[off:off + 8] = struct.pack("<d", r.choice(F64_VALUES))
    else:
        old = int.from_bytes(b[off:off + size], "little")
        _put_int(b, off, size, _int_value(r, size, old))


def mut_int(r, b: bytearray, fields=None) -> None:
    """A u32 or u64 at a random (or 4-aligned) offset set to a boundary value."""
    if len(b) < 8:
        return mut_byte(r, b)
    size = r.choice((4, 8))
    off = r.randrange(0, len(b) - size + 1)
    if r.random() < 0.5:
        off &= ~3
    old = int.from_bytes(b[off:off + size], "little")
    _put_int(b, off, size, _int_value(r, size, old))


def mut_bitflip(r, b: bytearray, fields=None) -> None:
    if not b:
        return
    for _ in range(r.choice((1, 1, 1, 2, 4, 8))):
        i = r.randrange(len(b))
        b[i] ^= 1 << r.randrange(8)


def mut_byte(r, b: bytearray, fields=None) -> None:
    if not b:
        return
    for _ in range(r.choice((1, 1, 2, 3))):
        i = r.randrange(len(b))
        b[i] = r.choice(BYTE_VALUES) if r.random() < 0.7 else r.randrange(256)


def _range_len(r) -> int:
    return r.choice((1, 1, 2, 3, 4, 7, 8, 16, 24, 56, 64, 80, 200))


def mut_insert(r, b: bytearray, fields=None) -> None:
    i = r.randrange(len(b) + 1)
    n = _range_len(r)
    c = r.random()
    if c < 0.4:
        ins = bytes(r.getrandbits(8) for _ in range(n))
    elif c < 0.7:
        ins = bytes([r.choice(BYTE_VALUES)]) * n
    else:
        j = r.randrange(len(b) + 1)
        ins = bytes(b[j:j + n])
    b[i:i] = ins


def mut_delete(r, b: bytearray, fields=None) -> None:
    if not b:
        return
    i = r.randrange(len(b))
    del b[i:i + _range_len(r)]


def mut_duplicate(r, b: bytearray, fields=None) -> None:
    if not b:
        return
    i = r.randrange(len(b))
    chunk = bytes(b[i:i + _range_len(r)])
    reps = r.choice((1, 1, 2, 8))
    j = r.choice((i, r.randrange(len(b) + 1)))
    b[j:j] = chunk * reps


def mut_truncate(r, b: bytearray, fields=None) -> None:
    if not b:
        return
    i = r.randrange(len(b)) if r.random() < 0.7 else max(0, len(b) - r.randrange(1, 9))
    del b[i:]


MUTATORS = [
    (mut_field, 6), (mut_int, 3), (mut_bitflip, 4), (mut_byte, 4), (mut_insert, 2),
    (mut_delete, 2), (mut_duplicate, 2), (mut_truncate, 1),
]
_MUT_FNS = [m for m, _ in MUTATORS]
_MUT_W = [w for _, w in MUTATORS]


def mutate(r: random.Random, b: bytearray, fields, others) -> str:
    """Applies 1 to 4 mutations in place (sometimes a splice); returns their names."""
    names = []
    k = r.choice((1, 1, 1, 2, 2, 3, 4))
    # field-aware ones first, while the seed's offsets still hold
    ops = sorted(r.choices(_MUT_FNS, _MUT_W, k=k), key=lambda m: m is not mut_field)
    for op in ops:
        op(r, b, fields)
        names.append(op.__name__[4:])
    if others and r.random() < 0.08:
        o = r.choice(others)
        i, j = r.randrange(len(b) + 1), r.randrange(len(o) + 1)
        b[i:] = o[j:]
        names.append("splice")
    return "+".join(names)


# ---- inputs ----------------------------------------------------------------------


class Corpus:
    def __init__(self):
        self.seeds = []  # (name, level, data, payload, fields)
        for name, level, data in seed_inputs():
            _, payload = unpack(data)
            fields, _ = parse_payload(payload)
            self.seeds.append((name, level, data, payload, fields))
        self.payloads = [s[3] for s in self.seeds]


def _lengths(r, raw_len, body_len, codec):
    """raw_len, body_len as the header will declare them: mostly right."""
    c = r.random()
    if c < 0.82:
        return raw_len, body_len
    if c < 0.88:
        return raw_len + r.choice((-1, 1)), body_len
    if c < 0.92:
        return r.choice(U64_VALUES), body_len
    if c < 0.95:
        return raw_len, body_len + r.choice((-1, 1))
    if c < 0.97:
        return raw_len, r.choice(U64_VALUES)
    if codec:
        return body_len * ZLIB_MAX_RATIO + r.choice((0, 0, 1)), body_len  # the bound itself
    return raw_len, body_len


def make_input(corpus: Corpus, seed: int, i: int):
    """Input i of this run: (bytes, mode, seed name, mutation names)."""
    r = random.Random(f"{seed}:{i}")
    name, level, data, payload, fields = corpus.seeds[r.randrange(len(corpus.seeds))]
    c = r.random()
    if c < 0.01:  # bomb: a tiny body declaring a huge raw length
        zeros = zlib.compress(bytes(r.choice((16, 4096, 65536))), r.choice((1, 9)))
        body = bytearray(zeros)
        raw = r.choice((len(body) * ZLIB_MAX_RATIO, 2**32, 2**63, 2**64 - 1, 65536 * 2))
        h = make_header(raw, len(body), 1, crc(bytes(65536)))
        return bytes(h + body), "bomb", name, "bomb"
    if c < 0.11:  # raw: header and all, no fix-up
        b = bytearray(data)
        hf = [(8, 4, "u32"), (12, 4, "u32"), (16, 8, "u64"), (24, 8, "u64"), (32, 4, "u32"),
              (36, 4, "u32")] + [(o + HEADER, s, t) for o, s, t in fields] if level == 0 else \
             [(8, 4, "u32"), (12, 4, "u32"), (16, 8, "u64"), (24, 8, "u64"), (32, 4, "u32")]
        ms = mutate(r, b, hf, [corpus.seeds[k][2] for k in range(len(corpus.seeds))])
        if len(b) >= HEADER and r.random() < 0.5:
            fix_header_crc(b)
            ms += "+hcrc"
        return bytes(b), "raw", name, ms
    if level and c < 0.21:  # zbody: mutate the compressed stream
        b = bytearray(data[HEADER:])
        ms = mutate(r, b, None, None)
        raw_len, body_len = _lengths(r, len(payload), len(b), 1)
        h = make_header(raw_len, body_len, 1, crc(payload))
        return bytes(h + b), "zbody", name, ms
    # fixed: mutate the payload, then make the header consistent again
    b = bytearray(payload)
    ms = mutate(r, b, fields, corpus.payloads)
    p = bytes(b)
    if level:
        body = zlib.compress(p, r.choice((1, 6, 9)))
    else:
        body = p
    raw_len, body_len = _lengths(r, len(p), len(body), int(level > 0))
    pc = crc(p) if r.random() < 0.97 else crc(p) ^ 1
    # the seed's own format version, now and then the other one
    version = struct.unpack_from("<I", data, 8)[0]
    if r.random() < 0.05:
        version = 3 - version
    h = make_header(raw_len, body_len, int(level > 0), pc, version)
    return bytes(h + body), "fixed", name, ms


# ---- the oracle ----------------------------------------------------------------------


class Failure(Exception):
    pass


INT64_MAX = 2**63 - 1


BATCH_BYTES_LIMIT = 64 << 20


MAX_HANDLE = 1 << 62


def _expect_limit(buf, fn, text):
    """fn must raise MemoryError saying `text` and leave buf as it was."""
    before = buf.serialize(level=0)
    try:
        fn()
    except MemoryError as e:
        if text not in str(e):
            raise
    else:
        raise Failure("a handle counter at 2**62 gave out another handle")
    if buf.serialize(level=0) != before:
        raise Failure("a refused call at the handle limit changed the buffer")


def _zeros_of(spec):
    return {k: np.zeros(shape, dt) for k, (shape, dt) in spec.items()}


def check_input(data: bytes, stats: dict | None = None) -> str:
    """Runs one input; returns "rejected" or "accepted", raises Failure otherwise."""
    ER = exreplay.ExperienceReplay
    try:
        buf = ER.unserialize(data)
    except ValueError:
        return "rejected"
    except MemoryError as e:
        raise Failure(f"unserialize raised MemoryError: {e}") from e
    except BaseException as e:  # noqa: BLE001 - the point
        raise Failure(f"unserialize raised {type(e).__name__}: {e}") from e
    step = "_check"
    try:
        buf._check()
        step = "serialize(0)"
        out = buf.serialize(level=0)
        _, payload = unpack(data)
        if stats is not None and out[HEADER:] != payload:
            stats["noncanonical"] = stats.get("noncanonical", 0) + 1
        step = "unserialize(serialize(0))"
        again = ER.unserialize(out)
        again._check()
        if again.serialize(level=0) != out:
            raise Failure("serialize(unserialize(serialize(x))) differs from serialize(x)")
        _, info = parse_payload(out[HEADER:])
        row = 2 * info["state_bytes"] + info["action_bytes"] + info["reward_bytes"] + info["extra_bytes"]
        if buf.num_picks and 2 * info["pick_len"] * row <= BATCH_BYTES_LIMIT:
            for h, kind in info["selectors"]:
                step = f"get_batch(2, {h}) [{'uniform' if kind == KIND_UNIFORM else 'prioritized'}]"
                try:
                    bt = buf.get_batch(2, h)
                except ValueError:
                    # allowed only for a prioritized selector whose priorities are all 0
                    if kind == KIND_UNIFORM:
                        raise
                    if stats is not None:
                        stats["zero_prio_batches"] = stats.get("zero_prio_batches", 0) + 1
                    continue
                if stats is not None:
                    stats["batches"] = stats.get("batches", 0) + 1
                if kind == KIND_PRIORITIZED and len(bt.pick_epi):
                    step = f"set_priority({h})"
                    buf.set_priority(h, bt.pick_epi, bt.pick_pos, np.ones(len(bt.pick_epi)))
            step = "_check after get_batch"
            buf._check()
        next_handle, next_sel = struct.unpack_from("<qq", out, HEADER + 16 + 48)
        # unserialize takes counters up to 2**62 (what the writer can write):
        # at exactly 2**62 the next handle is refused, and nothing changes
        limit = "a size limit was reached"
        step = "new_pick_selector"
        if next_sel == MAX_HANDLE:
            _expect_limit(buf, lambda: buf.new_pick_selector(exreplay.PickSelectorClass.Uniform), limit)
        else:
            h = int(buf.new_pick_selector(exreplay.PickSelectorClass.Uniform))
            if h != next_sel:
                raise Failure(f"new_pick_selector returned {h}, expected {next_sel}")
        if (info["state_bytes"] <= (1 << 20) and info["action_bytes"] <= (1 << 20)
                and info["extra_bytes"] <= (1 << 20)):
            step = "record"
            s = _zeros_of(buf.state_spec) if buf.state_spec else np.zeros(buf.state_shape, buf.state_dtype)
            a = np.zeros(buf.action_shape, buf.action_dtype)
            x = _zeros_of(buf.extras_spec) if buf.extras_spec else None
            if next_handle == MAX_HANDLE:
                _expect_limit(buf, lambda: buf.record(None, s, a, 1.0, final_state=s, extras=x), limit)
            else:
                buf.record(None, s, a, 1.0, final_state=s, extras=x)
            step = "_check after record"
            buf._check()
        step = "serialize(1)"
        ER.unserialize(buf.serialize(level=1))._check()
    except Failure:
        raise
    except BaseException as e:  # noqa: BLE001
        raise Failure(f"accepted input, then {step} raised {type(e).__name__}: {e}") from e
    return "accepted"


# ---- the run -----------------------------------------------------------------------------


class CurrentInput:
    """OUT/current.bin: [u64 index][u64 length][bytes] of the input being run.

    A MAP_SHARED file mapping: what is written survives this process being
    killed by a signal, so the parent can recover the input that crashed it.
    """

    CAP = 8 << 20

    def __init__(self, path):
        self.f = open(path, "w+b")
        self.f.truncate(self.CAP)
        self.m = mmap.mmap(self.f.fileno(), self.CAP)

    def set(self, index: int, data: bytes) -> None:
        n = min(len(data), self.CAP - 16)
        self.m[16:16 + n] = data[:n]
        self.m[0:16] = struct.pack("<QQ", index, len(data))

    def close(self):
        self.m.close()
        self.f.close()

    @staticmethod
    def read(path):
        with open(path, "rb") as f:
            head = f.read(16)
            if len(head) < 16:
                return None, None
            index, n = struct.unpack("<QQ", head)
            return index, f.read(min(n, CurrentInput.CAP - 16))


def _summary(d):
    sys.stdout.write("FUZZ-SUMMARY " + json.dumps(d, sort_keys=True) + "\n")
    sys.stdout.flush()


def run(args) -> int:
    os.makedirs(args.out, exist_ok=True)
    corpus = Corpus()
    if args.rlimit_as:
        resource.setrlimit(resource.RLIMIT_AS, (args.rlimit_as, args.rlimit_as))
    cur = CurrentInput(os.path.join(args.out, f"current-{args.shard}.bin"))
    stats = {"inputs": 0, "accepted": 0, "rejected": 0, "seed": args.seed, "shard": args.shard,
             "shards": args.shards, "modes": {}, "accepted_by_mode": {}, "max_input_s": 0.0,
             "seeds": len(corpus.seeds), "bytes_total": 0, "failures": 0, "failure": None,
             "rlimit_as": args.rlimit_as}
    if args.only is not None:
        indices = [args.only]
    else:
        indices = range(args.start + args.shard, args.start + args.count, args.shards)
    t0 = time.perf_counter()
    batch_t = t0
    done_in_batch = 0
    if args.watchdog:
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    for i in indices:
        data, mode, seed_name, ms = make_input(corpus, args.seed, i)
        cur.set(i, data)
        t = time.perf_counter()
        try:
            verdict = check_input(data, stats)
            dt = time.perf_counter() - t
            if dt > args.max_input_seconds:
                raise Failure(f"input took {dt:.2f} s (limit {args.max_input_seconds} s)")
        except Failure as e:
            path = os.path.join(args.out, "failure.bin")
            with open(path, "wb") as f:
                f.write(data)
            stats["failures"] = 1
            stats["failure"] = {"index": i, "mode": mode, "seed_input": seed_name, "mutations": ms,
                                "error": str(e), "file": path, "len": len(data),
                                "hex": data.hex()}
            sys.stderr.write(f"FAILURE at input {i} ({mode}, {seed_name}, {ms}): {e}\n"
                             f"saved to {path}\nhex: {data.hex()}\n")
            break
        stats["max_input_s"] = max(stats["max_input_s"], dt)
        stats["inputs"] += 1
        stats["bytes_total"] += len(data)
        stats[verdict] += 1
        stats["modes"][mode] = stats["modes"].get(mode, 0) + 1
        if verdict == "accepted":
            stats["accepted_by_mode"][mode] = stats["accepted_by_mode"].get(mode, 0) + 1
        done_in_batch += 1
        if done_in_batch == args.batch:
            now = time.perf_counter()
            if args.verbose:
                sys.stderr.write(f"shard {args.shard}: {stats['inputs']} inputs, "
                                 f"{args.batch / (now - batch_t):.0f}/s\n")
            batch_t, done_in_batch = now, 0
            if args.watchdog:  # re-arm: a batch that hangs dumps every thread and exits
                faulthandler.dump_traceback_later(args.watchdog, exit=True)
    faulthandler.cancel_dump_traceback_later()
    cur.close()
    stats["seconds"] = round(time.perf_counter() - t0, 2)
    stats["max_input_s"] = round(stats["max_input_s"], 4)
    _summary(stats)
    return 1 if stats["failures"] else 0


def replay(path) -> int:
    with open(path, "rb") as f:
        data = f.read()
    try:
        verdict = check_input(data)
    except Failure as e:
        print(f"FAILURE: {e}")
        return 1
    print(verdict)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=10000, help="inputs (over all shards)")
    ap.add_argument("--start", type=int, default=0, help="first input index")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--shard", type=int, default=0)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--batch", type=int, default=2000, help="inputs per progress line / watchdog period")
    ap.add_argument("--watchdog", type=float, default=120.0,
                    help="seconds a batch may take before the worker dumps its stacks and exits (0: off)")
    ap.add_argument("--max-input-seconds", type=float, default=2.0)
    ap.add_argument("--rlimit-as", type=int, default=0, help="RLIMIT_AS in bytes (0: none)")
    ap.add_argument("--out", default="fuzz-out")
    ap.add_argument("--only", type=int, default=None, help="run input INDEX only")
    ap.add_argument("--replay", default=None, help="run the input saved in this file")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    # A warning that escapes unserialize would be an exception other than
    # ValueError under `-W error`: make every warning an error here.
    warnings.simplefilter("error")
    faulthandler.enable()  # a crash prints the Python stack to stderr
    asan_core = os.environ.get("EXREPLAY_ASAN_CORE")
    if asan_core and os.path.realpath(exreplay._core.__file__) != os.path.realpath(asan_core):
        sys.stderr.write(f"fuzz_worker: imported {exreplay._core.__file__}, not the ASan build {asan_core}\n")
        return 3
    if args.replay:
        return replay(args.replay)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
