"""Reading, merging and replaying experience logs (docs/log.md).

An experience log is the file an :class:`exreplay.ExperienceLog` writes: every
step recorded into a buffer (or appended to the log) with a timestamp and a
source id, in zlib-compressed chunks. This module reads it back:

- :func:`open` iterates a log chunk by chunk as NumPy arrays (:class:`Chunk`),
  never loading the whole file;
- :func:`tail` returns the last ``n`` records, reading from the end;
- :func:`info` summarises a log from its chunk headers (records: its steps;
  ends: its ends without a step);
- :func:`merge` writes one log in timestamp order from many (streaming k-way);
- ``ExperienceReplay.from_log`` / ``buf.ingest`` rebuild a buffer from a log.

Every reader is held to the standard of ``unserialize``: bytes that are not a
valid log raise ``ValueError`` (naming the file and the offset); a chunk cut
short at the end of the file (a writer killed mid-write) ends the iteration
cleanly and is reported as the torn tail. No allocation is larger than what
the file's own length justifies.

Command line: ``python -m exreplay.log info|tail|merge|cat FILE...`` (``merge -o OUT
[--overwrite]``: docs/log.md).
"""

from __future__ import annotations

import builtins
import collections.abc
import errno
import json
import os
import stat
import struct
import sys
import time
import zlib
from typing import Callable, Iterator, NamedTuple, Optional, Sequence, Union

import numpy as np

from ._args import int_arg, path_arg, truth_arg, type_name

__all__ = ["Chunk", "LogReader", "open", "tail", "info", "merge", "main", "FLAG_END",
           "FLAG_TERMINATED", "FLAG_FINAL", "FLAG_NO_STEP", "MIXED_SOURCE"]

FILE_MAGIC = b"EXRPLOG\n"
FILE_VERSION = 1  # a log without per-step extras
FILE_VERSION_EXTRAS = 2  # rows carry extras: the header adds their byte count
CHUNK_MAGIC = b"XRCK"
TRAILER_MAGIC = b"XREN"
# KIND_NOSTEP: a records chunk some of whose records are no step (FLAG_NO_STEP)
KIND_RECORDS, KIND_END, KIND_NOSTEP = 1, 2, 3
CODEC_STORED, CODEC_ZLIB = 0, 1
FLAG_END, FLAG_TERMINATED, FLAG_FINAL = 1, 2, 4
# The record ends its episode after `position` steps without a step of its
# own (ExperienceReplay.end_episode): the file holds no row for it, and a
# Chunk shows zeros in its state, action, reward (and extras).
FLAG_NO_STEP = 8
MIXED_SOURCE = 0xFFFFFFFF
MAX_SCHEMA = 4096  # the schema an ExperienceLog writes (EXR_LOG_MAX_SCHEMA)
# A merged log's schema adds the list of its sources: at most
# MAX_MERGE_SOURCES ids of at most 10 digits and 2 bytes of separator each,
# with room to spare for the record layout's fields (docs/log.md, "Merging").
MAX_MERGE_SOURCES = 1 << 16
MAX_MERGED_SCHEMA = 1 << 20
assert MAX_MERGE_SOURCES * 12 + (1 << 17) <= MAX_MERGED_SCHEMA
MAX_RAW = 1 << 31  # raw bytes of one chunk (ExperienceLog stays within 2**30; merge adds final states to its chunk_bytes)
META = 29  # timestamp, handle, position (8 bytes each), source (4), flags (1)
# A schema nests 3 deep ({"state_fields": [{"shape": [..]}]}); json.loads
# recurses once a level, so deeper text is refused before it is parsed.
MAX_SCHEMA_DEPTH = 16
# deflate expands at most about 1032:1; a longer claim is corrupt
ZLIB_RATIO = 1032

_HDR = struct.Struct("<4sHHIIqqQQII")  # 56 bytes
_TRL = struct.Struct("<QI4s")  # 16 bytes
HDR, TRL = _HDR.size, _TRL.size
assert HDR == 56 and TRL == 16

PathLike = Union[str, "os.PathLike[str]"]


class Chunk(NamedTuple):
    """The records of one chunk (or of a tail) as NumPy arrays, in log order.

    ``final_states`` holds one state per record whose flags have
    ``FLAG_FINAL``, in the same order as those records.
    """

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    handles: np.ndarray  # int64
    positions: np.ndarray  # int64: the step's position in its episode
    timestamps: np.ndarray  # int64 nanoseconds, CLOCK_REALTIME
    sources: np.ndarray  # uint32
    flags: np.ndarray  # uint8: FLAG_END | FLAG_TERMINATED | FLAG_FINAL | FLAG_NO_STEP
    final_states: np.ndarray
    # a log of a buffer with named fields: states and final_states are dicts
    # {name: array}, and extras is {name: (n, *shape) array} (else None)
    extras: Optional[dict] = None


class _Raw(NamedTuple):
    """A chunk's records undecoded: rows are state|action|reward bytes."""

    ts: np.ndarray
    h: np.ndarray
    pos: np.ndarray
    src: np.ndarray
    fl: np.ndarray
    rows: np.ndarray  # (n, row) uint8; zeros for a record with FLAG_NO_STEP
    fins: np.ndarray  # (nfin, state_bytes) uint8


class _Schema:
    """The record layout of a log (its file header). A row is
    state|action|reward|extras; with named state fields the state part is
    their packed bytes (docs/log.md)."""

    def __init__(self, sb, ab, rb, js, header_len, xb=0):
        self.state_bytes, self.action_bytes, self.reward_bytes = sb, ab, rb
        self.extra_bytes = xb
        self.row = sb + ab + rb + xb
        self.header_len = header_len
        self.json = js
        self.state_dtype, self.state_shape = js["state"]
        self.action_dtype, self.action_shape = js["action"]
        self.reward_dtype, _ = js["reward"]
        self.sources = js.get("sources")
        # [(name, dtype, shape, offset, bytes)] or None
        self.state_fields = js.get("state_fields")
        self.extras = js.get("extras")

    def same_layout(self, o: "_Schema") -> bool:
        return (self.state_dtype == o.state_dtype and self.state_shape == o.state_shape
                and self.action_dtype == o.action_dtype and self.action_shape == o.action_shape
                and self.reward_dtype == o.reward_dtype and self.extra_bytes == o.extra_bytes
                and self.state_fields == o.state_fields and self.extras == o.extras)

    def header_bytes(self, extra: Optional[dict] = None) -> bytes:
        js = {k: {"dtype": d.str, "shape": list(s)} for k, (d, s) in
              (("state", (self.state_dtype, self.state_shape)),
               ("action", (self.action_dtype, self.action_shape)),
               ("reward", (self.reward_dtype, ())))}
        for key, fs in (("state_fields", self.state_fields), ("extras", self.extras)):
            if fs is not None:
                js[key] = [{"name": n, "dtype": d.str, "shape": list(s), "offset": off}
                           for n, d, s, off, _ in fs]
        if extra:
            js.update(extra)
        blob = json.dumps(js).encode()
        if len(blob) > MAX_MERGED_SCHEMA:
            raise ValueError("schema: expected at most %d bytes, got %d"
                             % (MAX_MERGED_SCHEMA, len(blob)))
        xb = self.extra_bytes
        more = struct.pack("<QI", xb, len(blob)) if xb else struct.pack("<I", len(blob))
        hl = 8 + 4 + 4 + 24 + len(more) + len(blob) + 4
        head = (FILE_MAGIC + struct.pack("<IIQQQ", FILE_VERSION_EXTRAS if xb else FILE_VERSION,
                                         hl, self.state_bytes, self.action_bytes,
                                         self.reward_bytes) + more + blob)
        return head + struct.pack("<I", zlib.crc32(head))


def _bad(path, off, what):
    return ValueError("%s: not a valid experience log at byte %d: %s" % (path, off, what))


def _open_log_file(path):
    """path opened for reading, as open(path, "rb") would, but a FIFO (or a
    socket) is refused as not a log, not waited on for a writer for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            raise _bad(path, 0, "a FIFO or socket, not a file")
        os.set_blocking(fd, True)
        return builtins.open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _field(js, name, path, nbytes, reward=False):
    f = js.get(name)
    dt, shape, size = _dtype_shape(f, name, path, reward)
    if size != nbytes:
        raise _bad(path, 0, "schema %s takes %d bytes, the header says %d" % (name, size, nbytes))
    return dt, shape


def _named(js, key, path, nbytes):
    """The named fields of one part of a row (state_fields or extras):
    [(name, dtype, shape, offset, bytes)], packed in order, nbytes in all."""
    fs = js.get(key)
    if not isinstance(fs, list) or not 1 <= len(fs) <= 32:
        raise _bad(path, 0, "schema %s is not a list of 1 to 32 fields" % key)
    out, off, names = [], 0, set()
    for f in fs:
        name = f.get("name") if isinstance(f, dict) else None
        if not isinstance(name, str) or not 1 <= len(name) <= 64 or name in names:
            raise _bad(path, 0, "schema %s: a field name %r" % (key, name))
        names.add(name)
        dt, shape, size = _dtype_shape(f, "%s %r" % (key, name), path)
        if f.get("offset") != off:
            raise _bad(path, 0, "schema %s %r: offset %r, packed it is %d" % (
                key, name, f.get("offset"), off))
        out.append((name, dt, shape, off, size))
        off += size
    if off != nbytes:
        raise _bad(path, 0, "schema %s take %d bytes, the header says %d" % (key, off, nbytes))
    return out


def _dtype_shape(f, name, path, reward=False):
    """A schema entry's dtype (little-endian), shape and byte size."""
    if not isinstance(f, dict) or not isinstance(f.get("dtype"), str) or not isinstance(
            f.get("shape"), list):
        raise _bad(path, 0, "schema field %r missing or malformed" % name)
    ds = f["dtype"]
    if len(ds) > 8 or len(ds) < 2 or ds[0] not in "<>|=" or ds[1] not in ("f" if reward else "biuf"):
        raise _bad(path, 0, "schema %s dtype %r is not a plain numeric dtype" % (name, ds))
    try:
        dt = np.dtype(ds)
    except (TypeError, ValueError) as e:  # ValueError: "format number 1 of ... is not recognized"
        raise _bad(path, 0, "schema %s dtype %r: %s" % (name, ds, e)) from None
    if dt.kind not in ("f" if reward else "biuf") or dt.fields is not None or dt.subdtype:
        raise _bad(path, 0, "schema %s dtype %r is not a plain numeric dtype" % (name, ds))
    shape = f["shape"]
    # at most 30 dimensions, as the writer allows (EXR_LOG_MAX_DIMS): a
    # column of n items has one more, within NumPy 1.x's 32
    if len(shape) > 30 or not all(type(d) is int and 1 <= d <= 1 << 40 for d in shape):
        raise _bad(path, 0, "schema %s shape %r" % (name, shape))
    if reward and shape:
        raise _bad(path, 0, "schema reward shape must be ()")
    size = dt.itemsize
    for d in shape:
        size *= d
    return dt.newbyteorder("<") if dt.byteorder == ">" else dt, tuple(shape), size


def _json_depth(blob: bytes) -> int:
    """How deep [ and { nest in JSON text, outside its strings, in one pass
    of array operations (a regex over strings retried from every quote of
    an unterminated one: quadratic, hours for a 1 MiB schema of them). A
    quote opens or closes a string unless an odd number of backslashes
    comes right before it."""
    c = np.frombuffer(blob, np.uint8)
    if not c.size:
        return 0
    at = np.arange(c.size)
    last_other = np.maximum.accumulate(np.where(c == ord("\\"), -1, at))
    slashes = np.zeros(c.size, np.int64)  # backslashes right before each byte
    slashes[1:] = at[:-1] - last_other[:-1]
    quote = (c == ord('"')) & (slashes % 2 == 0)
    outside = np.cumsum(quote) % 2 == 0
    step = ((np.isin(c, (ord("["), ord("{"))) & outside).astype(np.int64)
            - (np.isin(c, (ord("]"), ord("}"))) & outside))
    return int(np.cumsum(step).max(initial=0))


def _read_schema(f, path) -> _Schema:
    head = f.read(40)
    if len(head) < 40 or head[:8] != FILE_MAGIC:
        raise _bad(path, 0, "no experience log header (magic %r)" % head[:8])
    version, hl, sb, ab, rb = struct.unpack("<IIQQQ", head[8:40])
    if version not in (FILE_VERSION, FILE_VERSION_EXTRAS):
        raise _bad(path, 8, "format version %d (this reader knows %d and %d)" % (
            version, FILE_VERSION, FILE_VERSION_EXTRAS))
    more = f.read(12 if version == FILE_VERSION_EXTRAS else 4)
    if len(more) < (12 if version == FILE_VERSION_EXTRAS else 4):
        raise _bad(path, 40, "file header cut short")
    xb = struct.unpack("<Q", more[:8])[0] if version == FILE_VERSION_EXTRAS else 0
    (slen,) = struct.unpack("<I", more[-4:])
    at = 40 + len(more)
    if slen > MAX_MERGED_SCHEMA or hl != at + slen + 4:
        raise _bad(path, 12, "header length %d / schema length %d" % (hl, slen))
    rest = f.read(slen + 4)
    if len(rest) < slen + 4:
        raise _bad(path, at, "file header cut short")
    (crc,) = struct.unpack("<I", rest[slen:])
    if zlib.crc32(head + more + rest[:slen]) != crc:
        raise _bad(path, at + slen, "file header CRC mismatch")
    if (sb < 1 or sb > MAX_RAW or ab > MAX_RAW or rb not in (2, 4, 8)
            or (version == FILE_VERSION_EXTRAS and not 1 <= xb <= MAX_RAW)):
        raise _bad(path, 16, "field sizes %d/%d/%d/%d" % (sb, ab, rb, xb))
    if _json_depth(rest[:slen]) > MAX_SCHEMA_DEPTH:
        raise _bad(path, at, "schema nests deeper than %d" % MAX_SCHEMA_DEPTH)
    try:
        js = json.loads(rest[:slen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise _bad(path, 44, "schema is not JSON: %s" % e) from None
    if not isinstance(js, dict):
        raise _bad(path, 44, "schema is not a JSON object")
    fields = {
        "state": _field(js, "state", path, sb),
        "action": _field(js, "action", path, ab),
        "reward": _field(js, "reward", path, rb, reward=True),
    }
    src = js.get("sources")
    if src is not None and not (isinstance(src, list) and all(
            type(s) is int and 0 <= s < MIXED_SOURCE for s in src)):
        raise _bad(path, 44, "schema sources %r" % (src,))
    fields["sources"] = src
    fields["state_fields"] = _named(js, "state_fields", path, sb) if "state_fields" in js else None
    fields["extras"] = _named(js, "extras", path, xb) if xb else None
    return _Schema(sb, ab, rb, fields, hl, xb)


class _Header(NamedTuple):
    kind: int
    codec: int
    count: int
    source: int
    first: int
    last: int
    raw_len: int
    body_len: int
    body_crc: int
    header_crc: int


def _parse_header(b: bytes, path, off, schema: _Schema, remaining: int):
    """A checked chunk header, or None if b is not a whole valid header."""
    magic, kind, codec, count, source, first, last, raw, blen, bcrc, hcrc = _HDR.unpack(b)
    if magic != CHUNK_MAGIC or zlib.crc32(b[:52]) != hcrc:
        return None
    h = _Header(kind, codec, count, source, first, last, raw, blen, bcrc, hcrc)
    if kind == KIND_END:
        if count or raw or blen or codec != CODEC_STORED:
            raise _bad(path, off, "end marker with contents")
        return h
    if kind not in (KIND_RECORDS, KIND_NOSTEP) or codec not in (CODEC_STORED, CODEC_ZLIB):
        raise _bad(path, off, "chunk kind %d codec %d" % (kind, codec))
    _check_raw_len(h, path, off, schema)
    if codec == CODEC_STORED and blen != raw:
        raise _bad(path, off, "stored chunk body %d != raw %d" % (blen, raw))
    if codec == CODEC_ZLIB and raw > blen * ZLIB_RATIO + 64:
        raise _bad(path, off, "chunk claims %d raw bytes from %d compressed" % (raw, blen))
    if first > last:
        raise _bad(path, off, "chunk first timestamp after its last")
    return h


def _check_raw_len(h: "_Header", path, off, schema: _Schema) -> None:
    """What the header alone says of a chunk's raw length: R = n x (29 +
    row) + k x state (k <= n final states) for kind 1; for kind 3, whose
    records without a step have no row, n x 29 <= R <= n x (29 + row +
    state) (the decode checks it exactly)."""
    count, raw, row, sb = h.count, h.raw_len, schema.row, schema.state_bytes
    if count < 1 or raw > MAX_RAW:
        raise _bad(path, off, "chunk of %d records in %d raw bytes" % (count, raw))
    if h.kind == KIND_NOSTEP:
        if not count * META <= raw <= count * (META + row + sb):
            raise _bad(path, off, "chunk of %d records in %d raw bytes" % (count, raw))
        return
    if count * (META + row) > raw:
        raise _bad(path, off, "chunk of %d records in %d raw bytes" % (count, raw))
    if (raw - count * (META + row)) % sb or (raw - count * (META + row)) // sb > count:
        raise _bad(path, off, "chunk raw length %d does not fit %d records" % (raw, count))


def _inflate(h: _Header, body: bytes, path, off) -> bytes:
    if zlib.crc32(body) != h.body_crc:
        raise _bad(path, off, "chunk body CRC mismatch")
    if h.codec != CODEC_ZLIB:
        return body
    d = zlib.decompressobj()
    try:
        raw = d.decompress(body, h.raw_len)
    except zlib.error as e:
        raise _bad(path, off, "chunk body: %s" % e) from None
    if len(raw) != h.raw_len or not d.eof or d.unused_data or d.unconsumed_tail:
        raise _bad(path, off, "chunk body does not inflate to %d bytes" % h.raw_len)
    return raw


def _check_flags(h: _Header, fl, path, off, schema: _Schema) -> tuple:
    """(rows, final states) of a chunk by its flags column, which is
    checked, with the raw length they imply."""
    # bits 1 to 3 need bit 0; bit 3 (kind 3 only) needs bit 1 or 2: an end
    # without a step says how the episode ended
    allowed = 15 if h.kind == KIND_NOSTEP else 7
    end = (fl & FLAG_END) != 0
    how = (fl & (FLAG_TERMINATED | FLAG_FINAL)) != 0
    nostep = (fl & FLAG_NO_STEP) != 0
    if np.any(fl & ~np.uint8(allowed)) or np.any((how | nostep) & ~end) or np.any(nostep & ~how):
        raise _bad(path, off, "record flags")
    nrows = h.count - int(np.count_nonzero(nostep))
    nfin = int(np.count_nonzero(fl & FLAG_FINAL))
    if h.count * META + nrows * schema.row + nfin * schema.state_bytes != h.raw_len:
        raise _bad(path, off, "chunk has %d rows and %d final states, its length says otherwise"
                   % (nrows, nfin))
    return nrows, nfin


def _decode(h: _Header, body: bytes, path, off, schema: _Schema) -> _Raw:
    raw = _inflate(h, body, path, off)
    n = h.count
    buf = memoryview(raw)
    ts = np.frombuffer(buf, "<i8", n, 0)
    hh = np.frombuffer(buf, "<i8", n, 8 * n)
    pos = np.frombuffer(buf, "<i8", n, 16 * n)
    src = np.frombuffer(buf, "<u4", n, 24 * n)
    fl = np.frombuffer(buf, "u1", n, 28 * n)
    step = (fl & FLAG_NO_STEP) == 0
    nrows, nfin = _check_flags(h, fl, path, off, schema)
    rows = np.frombuffer(buf, "u1", nrows * schema.row, META * n).reshape(nrows, schema.row)
    if nrows < n:  # records without a step read as zeros
        full = np.zeros((n, schema.row), np.uint8)
        full[step] = rows
        rows = full
    fins = np.frombuffer(buf, "u1", nfin * schema.state_bytes,
                         META * n + nrows * schema.row).reshape(nfin, schema.state_bytes)
    if ts[0] != h.first or ts[-1] != h.last or (n > 1 and np.any(ts[1:] < ts[:-1])):
        raise _bad(path, off, "timestamps out of order or not those of the header")
    if np.any(pos < 0):
        raise _bad(path, off, "negative position")
    if h.source != MIXED_SOURCE and np.any(src != h.source):
        raise _bad(path, off, "record source differs from the chunk's")
    if np.any(src == MIXED_SOURCE):
        raise _bad(path, off, "record source %d" % MIXED_SOURCE)
    return _Raw(ts, hh, pos, src, fl, rows, fins)


def _column(block, dtype, shape):
    """(n, nbytes) uint8 -> (n, *shape) of dtype, its own contiguous copy."""
    return np.ascontiguousarray(block).view(dtype).reshape((len(block),) + tuple(shape))


def _split(block, fields):
    """The named fields' columns of a (n, bytes) block: {name: (n, *shape)}."""
    return {name: _column(block[:, off:off + size], dt, shape)
            for name, dt, shape, off, size in fields}


def _to_chunk(r: _Raw, schema: _Schema) -> Chunk:
    n, sb, ab, rb = len(r.ts), schema.state_bytes, schema.action_bytes, schema.reward_bytes
    rows = r.rows
    if schema.state_fields is not None:
        states, fins = _split(rows[:, :sb], schema.state_fields), _split(r.fins,
                                                                          schema.state_fields)
    else:
        states = _column(rows[:, :sb], schema.state_dtype, schema.state_shape)
        fins = _column(r.fins, schema.state_dtype, schema.state_shape)
    actions = _column(rows[:, sb:sb + ab], schema.action_dtype, schema.action_shape)
    rewards = _column(rows[:, sb + ab:sb + ab + rb], schema.reward_dtype, ()).reshape(n)
    extras = _split(rows[:, sb + ab + rb:], schema.extras) if schema.extras else None
    return Chunk(states, actions, rewards, r.h.copy(), r.pos.copy(), r.ts.copy(),
                 r.src.copy(), r.fl.copy(), fins, extras)


class LogReader:
    """An open experience log: iterate it for :class:`Chunk` s (see :func:`open`).

    After the iteration ends, ``torn`` is the number of bytes of an
    incomplete last chunk that were skipped (0 for a whole file) and
    ``ended`` tells whether the writer closed the log (its end marker).
    """

    def __init__(self, path: PathLike):
        self.path = path_arg("path", path)
        self._f = _open_log_file(self.path)
        try:
            self.schema = _read_schema(self._f, self.path)
            self.size = os.fstat(self._f.fileno()).st_size
        except BaseException:
            self._f.close()
            raise
        self.torn = 0
        self.ended = False

    # layout
    @property
    def state_shape(self):
        return self.schema.state_shape

    @property
    def state_dtype(self):
        return self.schema.state_dtype

    @property
    def action_shape(self):
        return self.schema.action_shape

    @property
    def action_dtype(self):
        return self.schema.action_dtype

    @property
    def reward_dtype(self):
        return self.schema.reward_dtype

    def close(self):
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _headers(self, with_body: bool):
        """(offset, header, body or None) for each records chunk; sets torn/ended."""
        f, path, schema = self._f, self.path, self.schema
        off = schema.header_len
        f.seek(off)
        self.torn = 0  # each pass starts from the first chunk
        self.ended = False
        last_ts = None
        while True:
            remaining = self.size - off
            if remaining == 0:
                return
            if self.ended:
                raise _bad(path, off, "data after the end marker")
            hb = f.read(HDR)
            if len(hb) < HDR:
                self.torn = remaining
                return
            h = _parse_header(hb, path, off, schema, remaining)
            if h is None:
                raise _bad(path, off, "bad chunk header (magic or CRC)")
            total = HDR + h.body_len + TRL
            if total > remaining:
                # torn, unless a whole later chunk ends the file: then the
                # length is wrong, which no crash of the writer produces
                t = _trailer_at(f, path, schema, self.size)
                if t is not None and t[0] > off:
                    raise _bad(path, off, "chunk length runs past the next chunk")
                self.torn = remaining
                return
            if with_body:
                body = f.read(h.body_len)
                if len(body) != h.body_len:
                    raise _bad(path, off, "file shrank while reading")
            else:
                body = None
                f.seek(h.body_len, 1)
            tb = f.read(TRL)
            tot, thcrc, tmagic = _TRL.unpack(tb)
            if tmagic != TRAILER_MAGIC or tot != total or thcrc != h.header_crc:
                raise _bad(path, off + HDR + h.body_len, "bad chunk trailer")
            if h.kind == KIND_END:
                self.ended = True
            else:
                if last_ts is not None and h.first < last_ts:
                    raise _bad(path, off, "chunk starts before the previous one ends")
                last_ts = h.last
                yield off, h, body
            off += total

    def raw_chunks(self) -> Iterator[_Raw]:
        for off, h, body in self._headers(True):
            yield _decode(h, body, self.path, off, self.schema)

    def __iter__(self) -> Iterator[Chunk]:
        for r in self.raw_chunks():
            yield _to_chunk(r, self.schema)


def open(path: PathLike) -> LogReader:  # noqa: A001 - the module's reader, as in the docs
    """Opens a log for reading; iterate the result for one :class:`Chunk` per
    chunk. Raises ValueError if the file is not an experience log."""
    return LogReader(path)


# ---- tail ---------------------------------------------------------------------


def _trailer_at(f, path, schema, end) -> Optional[tuple]:
    """(start, header) of the chunk whose trailer ends at byte `end`, if valid."""
    if end - schema.header_len < HDR + TRL:
        return None
    f.seek(end - TRL)
    tot, thcrc, tmagic = _TRL.unpack(f.read(TRL))
    if tmagic != TRAILER_MAGIC or tot < HDR + TRL or tot > end - schema.header_len:
        return None
    start = end - tot
    f.seek(start)
    hb = f.read(HDR)
    try:
        h = _parse_header(hb, path, start, schema, end - start)
    except ValueError:
        return None
    if h is None or h.header_crc != thcrc or HDR + h.body_len + TRL != tot:
        return None
    return start, h


# Trailer magics in a torn tail that tail() checks before it finds the last
# whole chunk by walking the file's chunk headers from the front instead.
MAX_TORN_CANDIDATES = 64


def _last_whole_end(f, path, schema, size) -> int:
    """End offset of the last whole chunk: the file's end, or, with a torn
    tail, the last trailer before it that checks out (scanning back over at
    most the torn bytes). A torn tail is a prefix of a chunk, where a
    trailer's magic is rare; one holding many (hostile bytes: each costs
    two reads) is measured from the front, as the iteration measures it."""
    if size == schema.header_len or _trailer_at(f, path, schema, size):
        return size
    step = 1 << 20
    hi = size
    tried = 0
    while hi > schema.header_len:
        lo = max(schema.header_len, hi - step)
        f.seek(lo)
        block = f.read(hi - lo + 3)
        i = len(block)
        while True:
            i = block.rfind(TRAILER_MAGIC, 0, i)
            if i < 0:
                break
            end = lo + i + 4
            if end > size:
                continue
            if tried == MAX_TORN_CANDIDATES:
                return _whole_end_from_front(path, size)
            tried += 1
            if _trailer_at(f, path, schema, end):
                return end
        hi = lo
    return schema.header_len


def _whole_end_from_front(path, size) -> int:
    """End offset of the last whole chunk, from the chunk headers (as info
    reads them); ValueError where they do not check out."""
    with LogReader(path) as r:
        for _ in r._headers(False):
            pass
        if r.size != size:
            raise _bad(path, size, "file changed while reading")
        return size - r.torn


def tail(path: PathLike, n: int = 100) -> Chunk:
    """The last ``n`` records of a log (fewer if it holds fewer), reading only
    the chunks that hold them, from the end of the file: the cost does not
    grow with the file. A torn tail is skipped. The chunks it reads are
    checked as every reader checks them: an end marker before the last
    chunk, or a chunk that starts before the one before it ends, is a
    ValueError at the offset the forward readers give."""
    path = path_arg("path", path)
    n = int_arg("n", n, 0, None, "an int >= 0")
    with _open_log_file(path) as f:
        schema = _read_schema(f, path)
        size = os.fstat(f.fileno()).st_size
        end = _last_whole_end(f, path, schema, size)
        found = []
        have = 0
        later = None  # (offset, first timestamp) of the records chunk after this one
        while have < n and end > schema.header_len:
            t = _trailer_at(f, path, schema, end)
            if t is None:
                raise _bad(path, end, "no valid chunk ends here")
            start, h = t
            if h.kind == KIND_END and end != size:  # a chunk or a torn tail after it
                raise _bad(path, end, "data after the end marker")
            if h.kind != KIND_END:
                if later is not None and later[1] < h.last:
                    raise _bad(path, later[0], "chunk starts before the previous one ends")
                later = (start, h.first)
                f.seek(start + HDR)
                found.append(_decode(h, f.read(h.body_len), path, start, schema))
                have += h.count
            end = start
    found.reverse()
    return _take_last(found, n, schema)


def _concat(raws: Sequence[_Raw], schema: _Schema) -> _Raw:
    if not raws:
        z = np.zeros(0, "<i8")
        return _Raw(z, z, z, np.zeros(0, "<u4"), np.zeros(0, "u1"),
                    np.zeros((0, schema.row), "u1"), np.zeros((0, schema.state_bytes), "u1"))
    if len(raws) == 1:
        return raws[0]
    return _Raw(*(np.concatenate([getattr(r, k) for r in raws]) for k in _Raw._fields))


def _take_last(raws, n, schema) -> Chunk:
    r = _concat(raws, schema)
    k = max(0, len(r.ts) - n)
    skipped_fins = int(np.count_nonzero(r.fl[:k] & FLAG_FINAL))
    r = _Raw(r.ts[k:], r.h[k:], r.pos[k:], r.src[k:], r.fl[k:], r.rows[k:], r.fins[skipped_fins:])
    return _to_chunk(r, schema)


# ---- info ----------------------------------------------------------------------


def _flags_column(f, h: _Header, off, path) -> np.ndarray:
    """The flags column of a chunk (its n bytes after 28 n of metadata), read
    from the file without the rest of the body: stored, those bytes; zlib,
    the body inflated as far as the metadata columns only."""
    n, fd, start = h.count, f.fileno(), off + HDR
    if h.codec == CODEC_STORED:
        got = os.pread(fd, n, start + 28 * n)
    else:
        want, end, d, got, data = META * n, start + h.body_len, zlib.decompressobj(), b"", b""
        while len(got) < want and not d.eof:
            if not data:
                data = os.pread(fd, min(1 << 16, end - start), start) if start < end else b""
                if not data:
                    break
                start += len(data)
            try:
                got += d.decompress(data, want - len(got))
            except zlib.error as e:
                raise _bad(path, off, "chunk body: %s" % e) from None
            data = d.unconsumed_tail
        if len(got) < want:
            raise _bad(path, off, "chunk body does not inflate to %d bytes" % h.raw_len)
        got = got[28 * n:]
    if len(got) != n:
        raise _bad(path, off, "file shrank while reading")
    return np.frombuffer(got, "u1")


def _ends_in(f, h: _Header, off, path, schema: _Schema) -> int:
    """How many of a chunk's records are ends without a step (FLAG_NO_STEP):
    0 in a chunk of kind 1, counted from the flags column (checked as the
    reader checks it) in one of kind 3."""
    if h.kind != KIND_NOSTEP:
        return 0
    nrows, _ = _check_flags(h, _flags_column(f, h, off, path), path, off, schema)
    return h.count - nrows


def info(path: PathLike) -> dict:
    """records (steps), ends (ends without a step: FLAG_NO_STEP records),
    chunks, sources, first/last timestamp (ns), bytes, torn (bytes of an
    incomplete last chunk), ended (closed by its writer), and the record
    layout. Reads the chunk headers, and of a chunk of kind 3 (which holds
    ends without a step) its flags column, no other part of a body."""
    with LogReader(path) as r:
        records = ends = chunks = 0
        sources = set(r.schema.sources or ())
        first = last = None
        for off, h, _ in r._headers(False):
            k = _ends_in(r._f, h, off, r.path, r.schema)
            records += h.count - k
            ends += k
            chunks += 1
            if h.source != MIXED_SOURCE:
                sources.add(h.source)
            if first is None:
                first = h.first
            last = h.last
        return {
            "path": r.path,
            "records": records,
            "ends": ends,
            "chunks": chunks,
            "sources": sorted(sources),
            "first_ts": first,
            "last_ts": last,
            "span_s": (last - first) / 1e9 if first is not None else 0.0,
            "bytes": r.size,
            "torn": r.torn,
            "ended": r.ended,
            "state_shape": r.state_shape,
            "state_dtype": str(r.state_dtype),
            "action_shape": r.action_shape,
            "action_dtype": str(r.action_dtype),
            "reward_dtype": str(r.reward_dtype),
            # {name: (shape, dtype str)} of named state fields and extras, or None
            "state_spec": _spec_str(r.schema.state_fields),
            "extras_spec": _spec_str(r.schema.extras),
        }


def _spec_str(fields):
    return None if fields is None else {n: (s, str(d)) for n, d, s, _, _ in fields}


# ---- writing (merge) ----------------------------------------------------------------


class _Writer:
    """Writes records chunks in the log format from Python: a second,
    independent writer of the format (the tests build logs of chosen
    timestamps with it; merge writes through the C core, log_merge.h).

    Compression and writing run on one helper thread (zlib releases the GIL);
    at most two chunks wait for it, so memory stays bounded."""

    def __init__(self, path, schema: _Schema, level: int, sources):
        from concurrent.futures import ThreadPoolExecutor

        self.f = builtins.open(path, "xb")
        self.schema = schema
        self.level = level
        self.f.write(schema.header_bytes({"sources": sorted(sources)}))
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="exreplay-log-merge")
        self.pending: list = []

    def write(self, r: _Raw):
        self.write_parts([r])

    def write_parts(self, parts):
        """One chunk of the records of parts, in order. Its raw body is built
        with one copy of the rows, each part's straight into place."""
        n = sum(len(p.ts) for p in parts)
        if not n:
            return
        cols = [np.concatenate([getattr(p, k) for p in parts]).astype(dt, copy=False)
                for k, dt in (("ts", "<i8"), ("h", "<i8"), ("pos", "<i8"), ("src", "<u4"),
                              ("fl", "u1"))]
        nfin = sum(len(p.fins) for p in parts)
        row, sb = self.schema.row, self.schema.state_bytes
        # the rows of the records that are steps (a record without one has none)
        steps = [p.rows[(np.asarray(p.fl) & FLAG_NO_STEP) == 0] for p in parts]
        nrows = sum(len(r) for r in steps)
        raw = bytearray(META * n + row * nrows + sb * nfin)
        at = 0
        for c in cols:
            raw[at:at + c.nbytes] = c.tobytes()
            at += c.nbytes
        for blocks, width in ((steps, row), ([p.fins for p in parts], sb)):
            for b in blocks:
                if len(b):
                    np.frombuffer(raw, np.uint8, len(b) * width, at).reshape(len(b), width)[:] = b
                    at += len(b) * width
        ts, srcs = cols[0], cols[3]
        src = int(srcs[0]) if np.all(srcs == srcs[0]) else MIXED_SOURCE
        kind = KIND_NOSTEP if nrows < n else KIND_RECORDS
        while len(self.pending) >= 2:
            self.pending.pop(0).result()
        self.pending.append(self.pool.submit(self._compress_write, raw, n, src,
                                             int(ts[0]), int(ts[-1]), kind))

    def _compress_write(self, raw, n, src, first, last, kind=KIND_RECORDS):
        body = zlib.compress(raw, self.level) if self.level else raw
        self._block(kind, CODEC_ZLIB if self.level else CODEC_STORED, n, src,
                    first, last, len(raw), body)

    def _block(self, kind, codec, count, src, first, last, raw_len, body):
        hb = struct.pack("<4sHHIIqqQQI", CHUNK_MAGIC, kind, codec, count, src, first, last,
                         raw_len, len(body), zlib.crc32(body))
        hcrc = zlib.crc32(hb)
        hb += struct.pack("<I", hcrc)
        self.f.write(hb)
        self.f.write(body)
        self.f.write(_TRL.pack(HDR + len(body) + TRL, hcrc, TRAILER_MAGIC))

    def drain(self):
        while self.pending:
            self.pending.pop(0).result()

    def close(self, last_ts):
        self.drain()
        self.pool.shutdown()
        self._block(KIND_END, CODEC_STORED, 0, MIXED_SOURCE, last_ts, last_ts, 0, b"")
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()

    def abort(self):
        for fu in self.pending:
            fu.cancel()
        self.pool.shutdown(wait=True)
        self.f.close()


class _Progress:
    def __init__(self, total, progress):
        self.total = total
        self.cb = progress if callable(progress) else None
        self.bar = progress is True or (progress is None and total >= 256 << 20
                                        and sys.stderr.isatty())
        self.t0 = time.monotonic()
        self.shown = 0.0

    def __call__(self, done, final=False):
        if self.cb:
            self.cb(done, self.total)
        if not self.bar:
            return
        now = time.monotonic()
        if not final and now - self.shown < 0.2:
            return
        self.shown = now
        frac = min(1.0, done / self.total) if self.total else 1.0
        w = 30
        el = now - self.t0
        sys.stderr.write("\rmerge [%-*s] %5.1f%% %.0f MB/s" % (
            w, "#" * int(frac * w), 100 * frac, done / max(el, 1e-9) / 1e6))
        if final:
            sys.stderr.write("\n")
        sys.stderr.flush()


def merge(inputs: Sequence[PathLike], output: PathLike, *, level: int = 1,
          chunk_bytes: int = 1 << 20,
          progress: Union[None, bool, Callable[[int, int], None]] = None,
          threads: Optional[int] = None, overwrite: bool = False) -> dict:
    """Writes one log holding every record of ``inputs`` in timestamp order.

    A streaming k-way merge (docs/log.md, "Merging"): each input holds its
    current chunk and one more being decoded, so memory does not grow with
    the logs. Records with equal timestamps keep the order of ``inputs``
    (and within one input, their order in it). ``output`` must not exist
    (FileExistsError), unless ``overwrite`` is true; it is written under a
    temporary name in its directory, or none, and gets its name only once
    complete and on disk: a merge that fails, or is killed, leaves no
    output, and running it again just works (docs/log.md, "Merging").
    ``overwrite=True`` replaces an existing output as ``save`` replaces its
    file: in one rename once the new log is complete (a symbolic link is
    followed and stays), so that until then the old file stays as it was,
    whatever happens to the merge.
    ``progress``: True draws a bar on stderr, a callable gets (bytes_done,
    bytes_total); None draws the bar only for inputs of 256 MB or more on a
    terminal. ``threads``: how many threads decode the inputs' chunks and
    compress the output's (None: the machine's cores, at most 4; 0: all on
    the calling thread). Returns :func:`info` of the output. Torn tails of
    the inputs are skipped.
    """
    inputs, output, level, chunk_bytes, progress, threads, overwrite = _check_merge_args(
        inputs, output, level, chunk_bytes, progress, threads, overwrite)
    from . import _core

    if threads is None:
        threads = min(4, os.cpu_count() or 1)
    readers: list = []
    try:
        schema, sources = _open_inputs(inputs, readers)
        header = schema.header_bytes({"sources": sorted(sources)})
        total = sum(r.size for r in readers)
        prog = _Progress(total, progress)
        try:  # a temp file (or an unnamed one) in output's (or its target's) directory
            out = _core._NewFile(output, overwrite)
        except OSError as e:
            _raise_if_too_many_files(e, len(inputs))
            raise
        fd = out.fileno()
        eng = None
        try:
            _write_fd(fd, header, output)
            eng = _core._LogMerge(len(readers), schema.row, schema.state_bytes, chunk_bytes,
                                  level, fd, threads)
            last_ts = _merge_run(eng, readers, prog, output)
            eng.close()
            eng = None
            _write_fd(fd, _block_bytes(KIND_END, CODEC_STORED, 0, MIXED_SOURCE, last_ts,
                                       last_ts, 0, b""), output)
            out.publish()  # fsync, the name output (overwrite: a rename), fsync of the directory
        except BaseException:
            if eng is not None:
                eng.close()
            out.discard()
            raise
        prog(total, final=True)
    finally:
        for r in readers:
            r.close()
    return info(output)


def _merge_run(eng, readers, prog, output) -> int:
    """Feeds the inputs' chunk headers to the merge (the C core reads,
    inflates, merges and compresses); returns the last timestamp written."""
    heads = [r._headers(False) for r in readers]
    fds = [r._f.fileno() for r in readers]
    files = [r._f for r in readers]
    while True:
        try:
            i = eng.run()
        except OSError as e:  # a read of an input, or the write of the output
            k = eng.error()[0]
            raise OSError(e.errno, e.strerror,
                          readers[k].path if 0 <= k < len(readers) else output) from None
        if i == -1:
            break
        if i == -2:
            k, off, what = eng.error()
            raise _bad(readers[k].path, off, what)
        x = next(heads[i], None)
        if x is None:
            eng.end(i)
        else:
            off, h, _ = x
            eng.push(i, fds[i], off + HDR, off, h.codec, h.count, h.source, h.body_crc,
                     h.first, h.last, h.raw_len, h.body_len, h.kind)
        prog(sum(f.tell() for f in files))
    return eng.result()[2]


def _path_named(fn, path, *args):
    """fn(*args), whose OSError (os.write's, os.fsync's: they name no file)
    names path."""
    try:
        return fn(*args)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None


def _write_fd(fd, b, path):
    view = memoryview(b)
    while view:
        view = view[_path_named(os.write, path, fd, view):]


def _block_bytes(kind, codec, count, src, first, last, raw_len, body) -> bytes:
    hb = struct.pack("<4sHHIIqqQQI", CHUNK_MAGIC, kind, codec, count, src, first, last,
                     raw_len, len(body), zlib.crc32(body))
    hcrc = zlib.crc32(hb)
    return (hb + struct.pack("<I", hcrc) + bytes(body)
            + _TRL.pack(HDR + len(body) + TRL, hcrc, TRAILER_MAGIC))


def _check_merge_args(inputs, output, level, chunk_bytes, progress, threads, overwrite):
    """merge's arguments, checked before anything is opened: (list of input
    paths, output path, level, chunk_bytes, progress, threads, overwrite)."""
    if (isinstance(inputs, (str, bytes, os.PathLike))
            or not isinstance(inputs, collections.abc.Sequence)):
        raise TypeError("inputs: expected a sequence of log paths (a list or tuple: its order "
                        "breaks timestamp ties), got %s" % type_name(inputs))
    if not len(inputs):
        raise ValueError("inputs: expected at least one log path, got an empty %s"
                         % type_name(inputs))
    paths = [path_arg("inputs[%d]" % i, p) for i, p in enumerate(inputs)]
    options = _check_merge_options(output, level, chunk_bytes, progress, threads)
    return (paths,) + options + (truth_arg("overwrite", overwrite),)


def _check_merge_options(output, level, chunk_bytes, progress, threads):
    """merge's arguments but inputs, checked: (output, level, chunk_bytes,
    progress, threads). gather_logs (exreplay.ray) checks its own with it."""
    output = path_arg("output", output)
    level = int_arg("level", level, 0, 9, "an int from 0 to 9")
    chunk_bytes = int_arg("chunk_bytes", chunk_bytes, 1, 1 << 30, "an int from 1 to 2**30")
    if threads is not None:
        threads = int_arg("threads", threads, 0, 64, "None or an int from 0 to 64")
    if progress is not None and not callable(progress):
        # a flag, taken as the binding takes its flags (a bool, or an int)
        if not isinstance(progress, (bool, np.bool_, int, np.integer)):
            raise TypeError("progress: expected None, a bool or a callable(bytes_done, "
                            "bytes_total), got %s" % type_name(progress))
        progress = bool(progress)
    return output, level, chunk_bytes, progress, threads


def _open_inputs(inputs, readers):
    """Opens every input into readers (closed by the caller); (schema, sources)."""
    for p in inputs:
        try:
            readers.append(LogReader(p))
        except OSError as e:
            _raise_if_too_many_files(e, len(inputs))
            raise
    schema = readers[0].schema
    for r in readers[1:]:
        if not r.schema.same_layout(schema):
            raise ValueError("inputs: %s has a record layout different from %s's"
                             % (r.path, readers[0].path))
    sources = set()
    for r in readers:  # as info() counts them, through the files already open
        sources.update(r.schema.sources or ())
        sources.update(h.source for _, h, _ in r._headers(False) if h.source != MIXED_SOURCE)
    if len(sources) > MAX_MERGE_SOURCES:
        raise ValueError("inputs: expected logs of at most %d distinct sources in all (a merged "
                         "log's header lists each), got %d sources in %d inputs; split the "
                         "inputs among several merged logs"
                         % (MAX_MERGE_SOURCES, len(sources), len(readers)))
    return schema, sources


def _raise_if_too_many_files(e: OSError, n: int) -> None:
    """For a process out of file descriptors, raises e again saying what to
    do about it (a merge of n inputs)."""
    if e.errno not in (errno.EMFILE, errno.ENFILE):
        return
    try:
        import resource

        limit = " (its limit is %d, ulimit -n)" % resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        limit = ""
    raise OSError(e.errno, "inputs: a merge keeps every input open, and %d inputs are more "
                  "files than this process may open at once%s: raise the limit "
                  "(resource.setrlimit), or merge consecutive groups of the inputs, then "
                  "the groups' outputs in the same order: the same records in the same "
                  "order (%s)" % (n, limit, e.strerror), e.filename) from e


# ---- buffers from logs ------------------------------------------------------------------


def _ingest(buf, path: PathLike, check_first: bool = True) -> int:
    """Records every step of the log into buf, in log order. Episodes are keyed
    by (source, handle) in the log and get new handles in buf; a step that
    ends its episode ends it in buf too, and so does a record without a step
    (FLAG_NO_STEP: ExperienceReplay.end_episode), through end_episode.
    Returns the number of steps.
    check_first: every chunk is read and checked before the first is recorded,
    so that a damaged log leaves buf as it was (from_log, whose buffer is new
    and dropped on an error, skips that pass)."""
    with LogReader(path) as r:
        s = r.schema
        if not _same_record_layout(buf, s):
            raise ValueError("path: %s's record layout differs from the buffer's" % r.path)
        if check_first:
            for _ in r:  # raises ValueError on the first damaged chunk
                pass
        open_eps: dict = {}
        count = 0
        for c in r:
            count += _ingest_chunk(buf, c, open_eps)
        return count


def _ingest_chunk(buf, c: Chunk, open_eps: dict) -> int:
    """One chunk's records into buf, a run of one episode's steps at a time
    (open_eps: (source, handle) -> buf's handle of each episode left open).
    Returns the number of steps."""
    n = len(c.timestamps)
    nostep = (c.flags & FLAG_NO_STEP) != 0
    key_change = np.ones(n, bool)
    if n > 1:  # a record without a step is a run of its own
        key_change[1:] = ((c.handles[1:] != c.handles[:-1])
                          | (c.sources[1:] != c.sources[:-1])
                          | ((c.flags[:-1] & FLAG_END) != 0) | nostep[1:])
    starts = np.flatnonzero(key_change)
    ends = np.append(starts[1:], n)
    fin_idx = np.cumsum((c.flags & FLAG_FINAL) != 0) - 1
    count = 0
    for a, b in zip(starts.tolist(), ends.tolist()):
        key = (int(c.sources[a]), int(c.handles[a]))
        h = open_eps.get(key)
        fl = int(c.flags[b - 1])
        fin = _at(c.final_states, fin_idx[b - 1]) if fl & FLAG_FINAL else None
        term = bool(fl & FLAG_TERMINATED)
        if nostep[a]:
            # the end of an episode whose steps came before; none open (its
            # steps not in this log): nothing to end
            if open_eps.pop(key, None) is not None and (fin is not None or term):
                buf.end_episode(h, final_state=fin, terminated=term)
            continue
        kw = {"extras": _at(c.extras, slice(a, b))} if c.extras is not None else {}
        h = buf.record_many(h, _at(c.states, slice(a, b)), c.actions[a:b], c.rewards[a:b],
                            final_state=fin, terminated=term, **kw)
        if fl & FLAG_END:
            open_eps.pop(key, None)
        else:
            open_eps[key] = h
        count += b - a
    return count


def _at(x, i):
    """x[i] of an array, or of each array of a dict of named fields."""
    return {k: v[i] for k, v in x.items()} if isinstance(x, dict) else x[i]


def _spec(fields):
    """{name: (shape, dtype)} of a schema's named fields, None without."""
    return None if fields is None else {n: (s, d) for n, d, s, _, _ in fields}


def _norm_spec(spec):
    return None if spec is None else [(n, tuple(s), np.dtype(d)) for n, (s, d) in spec.items()]


def _same_record_layout(buf, s: _Schema) -> bool:
    if (_norm_spec(buf.state_spec) != _norm_spec(_spec(s.state_fields))
            or _norm_spec(buf.extras_spec) != _norm_spec(_spec(s.extras))):
        return False
    if s.state_fields is None and (tuple(buf.state_shape) != s.state_shape
                                   or np.dtype(buf.state_dtype) != s.state_dtype):
        return False
    return (tuple(buf.action_shape) == s.action_shape
            and np.dtype(buf.action_dtype) == s.action_dtype
            and np.dtype(buf.reward_dtype) == s.reward_dtype)


def _from_log(cls, path: PathLike, **kwargs):
    """cls (ExperienceReplay) with the log's record layout, then _ingest."""
    with LogReader(path) as r:
        s = r.schema
    for k in ("state_shape", "state_dtype", "action_shape", "action_dtype", "reward_dtype",
              "state_spec", "extras_spec"):
        if k in kwargs:
            raise TypeError("from_log: %s comes from the log, not an argument" % k)
    if s.state_fields is not None:
        state = {"state_spec": _spec(s.state_fields)}
    else:
        state = {"state_shape": s.state_shape, "state_dtype": s.state_dtype}
    buf = cls(action_shape=s.action_shape, action_dtype=s.action_dtype,
              reward_dtype=s.reward_dtype, extras_spec=_spec(s.extras), **state, **kwargs)
    _ingest(buf, path, check_first=False)
    return buf


# ---- command line ----------------------------------------------------------------------


def _fmt_ts(ns):
    if ns is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + ".%09dZ" % (ns % 10**9)


def _print_records(c: Chunk, out, full=False):
    for i in range(len(c.timestamps)):
        fl = int(c.flags[i])
        tags = "".join(t for b, t in ((FLAG_END, "E"), (FLAG_TERMINATED, "T"), (FLAG_FINAL, "F"),
                                      (FLAG_NO_STEP, "N")) if fl & b) or "-"
        if fl & FLAG_NO_STEP:  # an end without a step: no action, reward or state
            out.write("%s src=%d h=%d pos=%d %s (end without a step)\n" % (
                _fmt_ts(int(c.timestamps[i])), int(c.sources[i]), int(c.handles[i]),
                int(c.positions[i]), tags))
            continue
        state = _fmt_value(c.states, i, full)
        extras = " extras=%s" % _fmt_value(c.extras, i, full) if c.extras is not None else ""
        out.write("%s src=%d h=%d pos=%d %s action=%s reward=%.6g state=%s%s\n" % (
            _fmt_ts(int(c.timestamps[i])), int(c.sources[i]), int(c.handles[i]),
            int(c.positions[i]), tags, np.array2string(c.actions[i], separator=","),
            float(c.rewards[i]), state, extras))


def _fmt_value(x, i, full):
    """Record i of an array (or of each named field of a dict) for cat/tail."""
    if isinstance(x, dict):
        return "{%s}" % ", ".join("%s: %s" % (k, _fmt_value(v, i, full)) for k, v in x.items())
    st = x[i]
    s = (np.array2string(st, threshold=8, edgeitems=2, separator=",")
         if full or st.size <= 8 else "%s%s mean=%.4g" % (st.dtype, st.shape, float(st.mean())))
    return s.replace("\n", "")


def _check_argv(argv):
    if isinstance(argv, str) or not isinstance(argv, collections.abc.Sequence):
        raise TypeError("argv: expected None or a sequence of str (the arguments after the "
                        "program name), got %s" % type_name(argv))
    for i, a in enumerate(argv):
        if not isinstance(a, str):
            raise TypeError("argv[%d]: expected a str, got %s" % (i, type_name(a)))


def _cli_merge(a, out) -> None:
    """`merge FILE... -o OUT [--level N] [--no-progress] [--overwrite]`."""
    try:
        d = merge(a.files, a.output, level=a.level,
                  progress=False if a.no_progress else None, overwrite=a.overwrite)
    except FileExistsError as e:
        # the option as the command line spells it, not merge()'s keyword
        if a.overwrite or "overwrite=True" not in (e.strerror or ""):
            raise
        raise FileExistsError(e.errno, e.strerror.replace("overwrite=True", "--overwrite"),
                              e.filename) from None
    out.write("%s: %d records (steps), %d ends without a step, in %d chunks, %d bytes, "
              "sources %s\n" % (a.output, d["records"], d["ends"], d["chunks"], d["bytes"],
                                d["sources"]))


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    if argv is not None:
        _check_argv(argv)
    ap = argparse.ArgumentParser(prog="python -m exreplay.log",
                                 description="Inspect and merge experience logs (docs/log.md).")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("info", help="summary of each log (from its chunk headers)")
    p.add_argument("files", nargs="+")
    p.add_argument("--json", action="store_true", help="one JSON object a line")
    p = sub.add_parser("tail", help="the last N records")
    p.add_argument("files", nargs="+")
    p.add_argument("-n", type=int, default=100)
    p = sub.add_parser("cat", help="every record, one a line")
    p.add_argument("files", nargs="+")
    p = sub.add_parser("merge", help="merge logs into one, in timestamp order")
    p.add_argument("files", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--level", type=int, default=1)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing output, in one rename once the merged log is "
                        "complete (until then the old file stays as it was)")
    a = ap.parse_args(argv)
    out = sys.stdout
    try:
        if a.cmd == "info":
            for fn in a.files:
                d = info(fn)
                if a.json:
                    d = dict(d, state_shape=list(d["state_shape"]),
                             action_shape=list(d["action_shape"]))
                    out.write(json.dumps(d) + "\n")
                    continue
                out.write("%s\n  records %d (steps), %d ends without a step, in %d chunks, "
                          "%d bytes%s%s\n  sources %s\n"
                          "  time %s .. %s (%.3f s)\n  state %s %s, action %s %s, reward %s\n" % (
                              fn, d["records"], d["ends"], d["chunks"], d["bytes"],
                              ", closed" if d["ended"] else ", not closed",
                              ", torn tail of %d bytes" % d["torn"] if d["torn"] else "",
                              d["sources"], _fmt_ts(d["first_ts"]), _fmt_ts(d["last_ts"]),
                              d["span_s"], d["state_dtype"], d["state_shape"],
                              d["action_dtype"], d["action_shape"], d["reward_dtype"]))
                for k in ("state_spec", "extras_spec"):
                    if d[k]:
                        out.write("  %s %s\n" % (k, d[k]))
        elif a.cmd == "tail":
            for fn in a.files:
                _print_records(tail(fn, a.n), out)
        elif a.cmd == "cat":
            for fn in a.files:
                with LogReader(fn) as r:
                    for c in r:
                        _print_records(c, out)
                    if r.torn:
                        sys.stderr.write("%s: torn tail of %d bytes skipped\n" % (fn, r.torn))
        elif a.cmd == "merge":
            _cli_merge(a, out)
        out.flush()  # a closed pipe shows here, not at the interpreter's exit
    except BrokenPipeError:  # before OSError, of which it is one: `... | head` is no error
        # The reader has gone: what is left of stdout goes to devnull, so that
        # Python's flush at exit does not fail again (as Python's docs advise).
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, out.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # stdout without a file descriptor (replaced in-process)
            pass
        return 0
    except (ValueError, OSError) as e:
        sys.stderr.write("error: %s\n" % e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
