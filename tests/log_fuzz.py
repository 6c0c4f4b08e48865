"""Mutation fuzzing of the experience log reader: structure-aware mutations
with every CRC fixed up afterwards, and the oracle every reader entry point
must satisfy. Used by tests/test_fuzz_log.py and fuzz/atheris_log.py.

The oracle: for any bytes, exreplay.log.open (iterated), info, tail and
ExperienceReplay.from_log either succeed or raise ValueError; when the
iteration succeeds, info and tail agree with it.
"""

import json
import os
import struct
import tempfile
import zlib

import numpy as np

import exreplay
import exreplay.log as xlog


class Failure(Exception):
    pass


def make_seed(path, level=1, chunk_bytes=300, n=80, finals=True):
    """A small valid log: several chunks, final states, terminated steps."""
    with exreplay.ExperienceLog(path, source=4, level=level, chunk_bytes=chunk_bytes,
                                state_shape=(3,), state_dtype="uint8", action_shape=(2,),
                                action_dtype="float32", reward_dtype="float32",
                                overwrite=True) as lg:
        for i in range(n):
            end = i % 9 == 8
            lg.append(i // 9, i % 9, [i, i + 1, i + 2], [i, -i], float(i),
                      final_state=[1, 2, 3] if end and finals and i % 2 else None,
                      terminated=end and not (finals and i % 2))
    with open(path, "rb") as f:
        return f.read()


def make_fields_seed(path, level=1, chunk_bytes=400, n=60):
    """A valid log of a buffer with named state fields and extras (format
    version 2): several chunks, final states, terminated steps."""
    if os.path.exists(path):
        os.unlink(path)
    lg = exreplay.ExperienceLog(path, source=2, level=level, chunk_bytes=chunk_bytes)
    buf = exreplay.ExperienceReplay(state_spec={"img": ((2, 2), "uint8"), "v": ((1,), "float32")},
                                    extras_spec={"logp": ((), "float32"), "m": ((2,), "bool")},
                                    capacity=None, log=lg)
    h = None
    for i in range(n):
        end = i % 7 == 6
        st = {"img": np.full((2, 2), i, np.uint8), "v": np.array([i], np.float32)}
        h = buf.record(h, st, i, float(i), final_state=st if end and i % 2 else None,
                       terminated=end and not i % 2,
                       extras={"logp": -float(i), "m": np.array([i % 2, i % 3], bool)})
        h = None if end else h
    lg.close()
    with open(path, "rb") as f:
        return f.read()


def make_end_seed(path, level=1, chunk_bytes=250, episodes=24):
    """A valid log with ends without a step (ExperienceReplay.end_episode:
    records with FLAG_NO_STEP and no row, in chunks of kind 3) among
    ordinary steps: several chunks, final states, terminated ends."""
    if os.path.exists(path):
        os.unlink(path)
    lg = exreplay.ExperienceLog(path, source=7, level=level, chunk_bytes=chunk_bytes)
    buf = exreplay.ExperienceReplay((3,), "uint8", (2,), "float32", capacity=None, log=lg)
    for e in range(episodes):
        T = 1 + e % 4
        h = buf.record_many(None, np.full((T, 3), e, np.uint8), np.full((T, 2), e, np.float32),
                            np.arange(T, dtype=np.float32))
        if e % 3 == 2:  # ended by its last step
            buf.record(h, [e, e, e], [0, 0], 0.0, terminated=True)
        else:
            fin = [e, 1, 2] if e % 3 else None
            buf.end_episode(h, final_state=fin, terminated=fin is None or e % 2 == 0)
    lg.close()
    with open(path, "rb") as f:
        return f.read()


# ---- structure ---------------------------------------------------------------


def _file_header(blob):
    """version, header length, sb, ab, rb, xb, schema of a log's header."""
    version, hl, sb, ab, rb = struct.unpack_from("<IIQQQ", blob, 8)
    if version == 2:
        xb, slen = struct.unpack_from("<QI", blob, 40)
        at = 52
    else:
        xb, (slen,), at = 0, struct.unpack_from("<I", blob, 40), 44
    return version, hl, sb, ab, rb, xb, blob[at:at + slen]


def parse(blob):
    """(file header fields, [chunk dicts], trailing bytes) of a valid log."""
    magic = blob[:8]
    version, hl, sb, ab, rb, xb, schema = _file_header(blob)
    head = {"magic": magic, "version": version, "sb": sb, "ab": ab, "rb": rb, "xb": xb,
            "schema": schema}
    off = hl
    chunks = []
    while off + xlog.HDR <= len(blob):
        (m, kind, codec, count, src, first, last, raw_len, blen, bcrc,
         hcrc) = xlog._HDR.unpack_from(blob, off)
        body = blob[off + xlog.HDR:off + xlog.HDR + blen]
        raw = zlib.decompress(body) if codec == xlog.CODEC_ZLIB else body
        chunks.append({"kind": kind, "codec": codec, "count": count, "source": src,
                       "first": first, "last": last, "raw": raw, "raw_len": None,
                       "body_len": None})
        off += xlog.HDR + blen + xlog.TRL
    return head, chunks, blob[off:]


def serialize(head, chunks, tail=b"", level=1):
    """Bytes with every length and CRC consistent with the (mutated) content,
    unless a chunk carries an explicit raw_len/body_len override."""
    sch = head["schema"]
    if head["version"] == 2:  # rows with extras: the header adds their byte count
        more = struct.pack("<QI", head["xb"] & (2**64 - 1), len(sch))
    else:
        more = struct.pack("<I", len(sch))
    h = head["magic"] + struct.pack("<IIQQQ", head["version"] & 0xFFFFFFFF,
                                    40 + len(more) + len(sch) + 4, head["sb"], head["ab"],
                                    head["rb"]) + more + sch
    out = [h + struct.pack("<I", zlib.crc32(h))]
    for c in chunks:
        raw = c["raw"]
        body = zlib.compress(raw, level) if c["codec"] == xlog.CODEC_ZLIB else raw
        raw_len = c["raw_len"] if c["raw_len"] is not None else len(raw)
        blen = c["body_len"] if c["body_len"] is not None else len(body)
        hb = struct.pack("<4sHHIIqqQQI", xlog.CHUNK_MAGIC, c["kind"] & 0xFFFF,
                         c["codec"] & 0xFFFF, c["count"] & 0xFFFFFFFF,
                         c["source"] & 0xFFFFFFFF, c["first"], c["last"],
                         raw_len & (2**64 - 1), blen & (2**64 - 1), zlib.crc32(body))
        hcrc = zlib.crc32(hb)
        out.append(hb + struct.pack("<I", hcrc) + body
                   + xlog._TRL.pack(xlog.HDR + len(body) + xlog.TRL, hcrc, xlog.TRAILER_MAGIC))
    out.append(tail)
    return b"".join(out)


BOUNDARY = [0, 1, 2, 3, 7, 8, 29, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1]
SCHEMAS = [
    b"", b"{", b"[]", b"null", b'{"state": 1}',
    b'{"state": {"dtype": "O", "shape": [3]}, "action": {"dtype": "<f4", "shape": [2]},'
    b' "reward": {"dtype": "<f4", "shape": []}}',
    b'{"state": {"dtype": "|u1", "shape": [1099511627776]}, "action": {"dtype": "<f4",'
    b' "shape": [2]}, "reward": {"dtype": "<f4", "shape": []}}',
    b'{"state": {"dtype": "|u1", "shape": [3]}, "action": {"dtype": "<f4", "shape": [2]},'
    b' "reward": {"dtype": "<i4", "shape": []}}',
    b'{"state": {"dtype": "|u1", "shape": [3]}, "action": {"dtype": "<f4", "shape": [2]},'
    b' "reward": {"dtype": "<f4", "shape": []}, "sources": [-1, "x"]}',
    b'{"state": {"dtype": "<U1", "shape": [3]}, "action": {"dtype": "<f4", "shape": [2]},'
    b' "reward": {"dtype": "<f4", "shape": []}}',
    b'{"state": {"dtype": "|u1", "shape": [3, 0]}, "action": {"dtype": "<f4", "shape": [2]},'
    b' "reward": {"dtype": "<f4", "shape": []}}',
]


def mutate(blob, rng):
    """One mutated input (CRCs fixed up in most modes). Returns (mode, bytes)."""
    head, chunks, tail = parse(blob)
    mode = int(rng.integers(0, 11))
    if mode == 0:  # raw bytes, nothing fixed
        b = bytearray(blob)
        for _ in range(int(rng.integers(1, 6))):
            b[int(rng.integers(0, len(b)))] ^= int(rng.integers(1, 256))
        return "raw", bytes(b)
    if mode == 1:  # truncated
        return "truncate", blob[:int(rng.integers(0, len(blob)))]
    if mode == 2 and chunks:  # decompressed body bytes
        c = chunks[int(rng.integers(0, len(chunks)))]
        raw = bytearray(c["raw"])
        if raw:
            for _ in range(int(rng.integers(1, 8))):
                raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
        c["raw"] = bytes(raw)
        return "body", serialize(head, chunks, tail)
    if mode == 3 and chunks:  # header fields at boundary values
        c = chunks[int(rng.integers(0, len(chunks)))]
        k = ["kind", "codec", "count", "source", "first", "last", "raw_len", "body_len"][
            int(rng.integers(0, 8))]
        v = BOUNDARY[int(rng.integers(0, len(BOUNDARY)))]
        if k in ("first", "last"):
            v = int(v) - 2**62 if rng.random() < 0.5 else min(int(v), 2**63 - 1)
        c[k] = v
        return "field:" + k, serialize(head, chunks, tail)
    if mode == 4:  # file header sizes
        k = ["sb", "ab", "rb", "version", "xb"][int(rng.integers(0, 5))]
        head[k] = BOUNDARY[int(rng.integers(0, len(BOUNDARY)))] & (
            2**32 - 1 if k == "version" else 2**64 - 1)
        return "head:" + k, serialize(head, chunks, tail)
    if mode == 5:  # schema
        head["schema"] = SCHEMAS[int(rng.integers(0, len(SCHEMAS)))]
        return "schema", serialize(head, chunks, tail)
    if mode == 6 and len(chunks) > 1:  # chunks swapped or duplicated
        i, j = (int(x) for x in rng.integers(0, len(chunks), 2))
        if rng.random() < 0.5:
            chunks[i], chunks[j] = chunks[j], chunks[i]
        else:
            chunks.insert(i, dict(chunks[j]))
        return "reorder", serialize(head, chunks, tail)
    if mode == 7 and chunks:  # raw length changes: cut or grow the body
        c = chunks[int(rng.integers(0, len(chunks)))]
        n = int(rng.integers(0, 64))
        c["raw"] = c["raw"][:-n] if rng.random() < 0.5 and n else c["raw"] + bytes(n)
        return "rawlen", serialize(head, chunks, tail)
    if mode == 10 and chunks:  # records without a step: FLAG_NO_STEP set or cleared, kind 1 <-> 3
        c = chunks[int(rng.integers(0, len(chunks)))]
        n = c["count"]
        raw = bytearray(c["raw"])
        if n and len(raw) >= 29 * n:
            i = 28 * n + int(rng.integers(0, n))
            raw[i] ^= (8, 9, 11, 13)[int(rng.integers(0, 4))]
            if rng.random() < 0.5:  # the record's row dropped, as a writer would
                k = int(rng.integers(0, n))
                row = head["sb"] + head["ab"] + head["rb"] + head["xb"]
                at = 29 * n + k * row
                del raw[at:at + row]
        c["raw"] = bytes(raw)
        if rng.random() < 0.7:
            c["kind"] = 4 - c["kind"] if c["kind"] in (1, 3) else c["kind"]
        return "nostep", serialize(head, chunks, tail)
    if mode == 8:  # garbage or a second end marker at the end
        g = bytes(rng.integers(0, 256, int(rng.integers(1, 100)), dtype=np.uint8))
        return "append", blob + g
    # flags column
    if chunks:
        c = chunks[int(rng.integers(0, len(chunks)))]
        n = c["count"]
        raw = bytearray(c["raw"])
        if n and len(raw) >= 29 * n:
            raw[28 * n + int(rng.integers(0, n))] = int(rng.integers(0, 256))
        c["raw"] = bytes(raw)
    return "flags", serialize(head, chunks, tail)


# ---- the oracle -------------------------------------------------------------------


def check_file(path):
    """Raises Failure if any entry point misbehaves on the file at path."""
    def guarded(what, fn):
        try:
            return fn(), None
        except ValueError as e:
            return None, e
        except Exception as e:  # noqa: BLE001 - anything else is a finding
            raise Failure("%s raised %s: %s" % (what, type(e).__name__, e)) from e

    torn = 0

    def read():
        nonlocal torn
        with xlog.open(path) as r:
            out = [c for c in r]
            torn = r.torn
            return out

    chunks, err = guarded("open", read)
    inf, ierr = guarded("info", lambda: xlog.info(path))
    t, terr = guarded("tail", lambda: xlog.tail(path, 5))
    guarded("from_log", lambda: exreplay.ExperienceReplay.from_log(path, capacity=None))
    out = path + ".merged"

    def merged():
        try:
            d = xlog.merge([path], out, chunk_bytes=200, progress=False)
            return d["records"] + d["ends"]  # steps and ends without a step: every record
        finally:
            if os.path.exists(out):
                os.unlink(out)

    nm, _ = guarded("merge", merged)
    if chunks is not None:
        n = sum(len(c.timestamps) for c in chunks)
        for c in chunks:
            m = len(c.timestamps)
            if not all(_lengths(getattr(c, f)) == {m} for f in
                       ("states", "actions", "rewards", "handles", "positions", "sources",
                        "flags")) or (c.extras is not None and _lengths(c.extras) != {m}):
                raise Failure("chunk arrays of different lengths")
            nfin = int(np.count_nonzero(c.flags & xlog.FLAG_FINAL))
            if _lengths(c.final_states) != {nfin}:
                raise Failure("final states do not match the flags")
        if inf is None:
            raise Failure("open read %d records but info raised %s" % (n, ierr))
        if nm is not None and not torn and nm != n:
            raise Failure("merge wrote %d records, open read %d" % (nm, n))
        ends = sum(int(np.count_nonzero(c.flags & xlog.FLAG_NO_STEP)) for c in chunks)
        if (inf["records"], inf["ends"]) != (n - ends, ends):
            raise Failure("info says %d steps and %d ends without a step, open read %d and %d"
                          % (inf["records"], inf["ends"], n - ends, ends))
        if t is None and not torn:
            raise Failure("open read the file but tail raised %s" % terr)
        if torn:
            return  # tail recovers from the last chunk that checks out (docs/log.md)
        last = np.concatenate([c.timestamps for c in chunks])[-5:] if n else np.zeros(0)
        if not np.array_equal(t.timestamps, last):
            raise Failure("tail disagrees with open")


def _lengths(x):
    """{len} of an array, or of each array of a dict of named fields."""
    return {len(v) for v in x.values()} if isinstance(x, dict) else {len(x)}


def check_input(blob, tmpdir=None):
    d = tmpdir or tempfile.gettempdir()
    path = os.path.join(d, "exreplay-fuzz-%d.log" % os.getpid())
    with open(path, "wb") as f:
        f.write(blob)
    try:
        check_file(path)
    finally:
        os.unlink(path)


def schema_json(blob):
    return json.loads(_file_header(blob)[6])
