"""Writes the seed corpus of the merge engine's libFuzzer harness
(fuzz/fuzz_log_merge.c; docs/fuzzing.md):

    python fuzz/make_log_seeds.py [DIR]     # default: fuzz/seeds/log_merge

Each seed is the harness's setup (4 bytes) and up to 4 input logs without
their file headers (a u16 length each), encoded here as docs/log.md says,
deterministically (fixed timestamps, no clock). Before writing them, the
script checks every input log whole, with a file header, against
exreplay.log: it must read (open, info) and merge to the records the seed
means, or, for the seeds of a zlib body shorter than its wrapper (which
the engine once refused when pushed) and of one asking for a preset
dictionary, be refused by both with the reader's ValueError. Modes 2 and 3 (raw bodies, which the harness compresses
itself) are written for each other seed beside mode 0.
"""
import os
import struct
import sys
import tempfile
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

HDR = struct.Struct("<4sHHIIqqQQII")
TRL = struct.Struct("<QI4s")
META = 29
SB, ROW = 16, 28  # float32 x 4 state, int64 action, float32 reward
MIXED = 0xFFFFFFFF


def raw_body(recs, kind):
    """recs: (ts, handle, pos, source, flags) tuples; rows and final states
    are made from the record's index."""
    n = len(recs)
    cols = [b"".join(struct.pack(fmt, r[i]) for r in recs)
            for i, fmt in enumerate(("<q", "<q", "<q", "<I", "B"))]
    rows = b"".join(bytes([(7 * k + j) & 0xFF for j in range(ROW)])
                    for k, r in enumerate(recs) if not r[4] & 8)
    fins = b"".join(bytes([(3 * k + 1) & 0xFF] * SB) for k, r in enumerate(recs) if r[4] & 4)
    assert kind == 3 or all(not r[4] & 8 for r in recs)
    raw = b"".join(cols) + rows + fins
    assert len(raw) >= META * n
    return raw


def chunk(recs, codec, kind=1, source=None, raw_mode=False, cut=None, fdict=False):
    """One chunk's bytes; raw_mode: the body is the raw body (the harness's
    modes 2 and 3), its lengths and CRCs as the harness will set them; cut:
    the zlib body cut to that many bytes; fdict: its zlib header asks for a
    preset dictionary (the CRCs right either way)."""
    raw = raw_body(recs, kind)
    body = raw if codec == 0 or raw_mode else zlib.compress(raw, 6)[:cut]
    if fdict:  # FDICT set, FCHECK made right again (RFC 1950)
        body = bytes([0x78, 0x20 + (31 - 0x7820 % 31)]) + body[2:]
    srcs = {r[3] for r in recs}
    src = source if source is not None else (srcs.pop() if len(srcs) == 1 else MIXED)
    head = HDR.pack(b"XRCK", kind, codec, len(recs), src, recs[0][0], recs[-1][0],
                    len(raw), len(body), zlib.crc32(body), 0)
    head = head[:52] + struct.pack("<I", zlib.crc32(head[:52]))
    return head + body + TRL.pack(HDR.size + len(body) + TRL.size, zlib.crc32(head[:52]), b"XREN")


def end_marker(ts):
    head = HDR.pack(b"XRCK", 2, 0, 0, MIXED, ts, ts, 0, 0, 0, 0)
    head = head[:52] + struct.pack("<I", zlib.crc32(head[:52]))
    return head + TRL.pack(HDR.size + TRL.size, zlib.crc32(head[:52]), b"XREN")


def episode(src, h, t0, n, step=10, end=1, start_pos=0):
    """n steps of episode h from source src, the last with flags `end`."""
    return [(t0 + step * k, h, start_pos + k, src, end if k == n - 1 else 0) for k in range(n)]


def file_header():
    js = (b'{"state": {"dtype": "<f4", "shape": [4]}, "action": {"dtype": "<i8", "shape": []}, '
          b'"reward": {"dtype": "<f4", "shape": []}}')
    b = b"EXRPLOG\n" + struct.pack("<IIQQQI", 1, 48 + len(js), SB, 8, 4, len(js)) + js
    return b + struct.pack("<I", zlib.crc32(b))


def seed_inputs():
    """name -> (setup byte 0 without the mode, [input logs as chunk lists])."""
    a = episode(0, 1, 100, 6, end=5) + episode(0, 2, 170, 4, end=3)
    b = episode(1, 7, 105, 5, step=12, end=1) + episode(1, 8, 170, 3, step=5, end=5)
    ends = [(300, 4, 3, 2, 1 | 8 | 2), (300, 5, 2, 2, 1 | 8 | 4), (310, 6, 0, 2, 0),
            (320, 6, 1, 2, 1 | 8 | 4 | 2)]
    return {
        # threads 0, level 1, chunk_bytes 97: two inputs, zlib, ties at 170
        "two-zlib": (0b00_01_00, [[(a[:6], 1), (a[6:], 1)], [(b[:5], 1), (b[5:], 1)]]),
        # threads 1, level 0, chunk_bytes 1024: stored, ends without a step (kind 3)
        "ends-stored": (0b10_00_01, [[(episode(2, 4, 280, 3, end=0), 0), (ends, 0, 3)],
                                     [(episode(3, 9, 290, 4), 0)]]),
        # threads 2, level 6, chunk_bytes 2^20: three inputs, a mixed chunk, end marker
        "three-mixed": (0b11_10_10, [[(a, 1), "end"], [(b, 0)],
                                     [(episode(4, 1, 90, 8, end=7)[:4] +
                                       episode(5, 1, 130, 4, end=3), 1, 1, MIXED)]]),
        # threads 0, level 9, chunk_bytes 1: one record an output chunk, torn tail
        "torn": (0b01_11_11, [[(episode(6, 3, 50, 3), 1), (episode(6, 3, 80, 2), 1), "torn"]]),
        # threads 1, level 1, chunk_bytes 97: the engine once refused it when pushed
        "short-zlib": (0b00_01_01, [[(episode(7, 2, 900, 3), 1), "short"]]),
        "dict-zlib": (0b00_01_00, [[(episode(7, 2, 900, 3), 1), "dict"], [(b, 1)]]),
    }


def input_bytes(chunks, raw_mode):
    out, last = b"", 0
    for c in chunks:
        if c == "end":
            out += end_marker(last)
        elif c == "torn":
            out += chunk(episode(6, 9, 900, 2), 1)[:70]
        elif c == "short":  # a zlib body shorter than its wrapper: refused when decoded
            out += chunk(episode(7, 1, 950, 1), 1, cut=2)
        elif c == "dict":  # a zlib body asking for a preset dictionary: refused when decoded
            out += chunk(episode(7, 1, 950, 2), 1, fdict=True)
        else:
            recs, codec = c[0], c[1]
            kind = c[2] if len(c) > 2 else 1
            out += chunk(recs, codec, kind, c[3] if len(c) > 3 else None, raw_mode)
            last = recs[-1][0]
    return out


def check_with_reader(inputs):
    """Each input, as a whole log, reads and merges with exreplay.log (or,
    holding a "short" or "dict" chunk, is refused by both with the reader's
    error)."""
    import exreplay.log as xl

    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, chunks in enumerate(inputs):
            p = os.path.join(d, f"in{i}.xlog")
            with open(p, "wb") as f:
                f.write(file_header() + input_bytes(chunks, False))
            xl.info(p)
            paths.append(p)
        bad = any("short" in c or "dict" in c for c in inputs)
        for run in (lambda: [sum(1 for _ in xl.open(p)) for p in paths],
                    lambda: xl.merge(paths, os.path.join(d, "out.xlog"), level=1,
                                     chunk_bytes=97, threads=0)):
            try:
                run()
                assert not bad, "a log with a short zlib body was read"
            except ValueError as e:
                assert bad and "not a valid experience log at byte" in str(e), e


def main(argv):
    out = argv[0] if argv else os.path.join(HERE, "seeds", "log_merge")
    os.makedirs(out, exist_ok=True)
    for name, (cfg, inputs) in seed_inputs().items():
        check_with_reader(inputs)
        for mode in (0,) if name in ("short-zlib", "dict-zlib") else (0, 2, 3):
            setup = bytes([cfg | mode << 6, SB - 1, ROW - SB, len(inputs) - 1])
            body = b"".join(struct.pack("<H", len(x)) + x
                            for x in (input_bytes(c, mode >= 2) for c in inputs))
            with open(os.path.join(out, f"{name}-mode{mode}"), "wb") as f:
                f.write(setup + body)
    print(f"wrote the seeds to {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
