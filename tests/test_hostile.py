"""Hostile serialized input and edge values: the regression tests of the
defects that adversarial testing found (docs/fuzzing.md, "Hostile input").

Each test here failed before its fix: a file of chosen colliding handles
made loading quadratic; a small zlib input made the reader allocate
gigabytes; a FIFO buffer's hand broke the invariants; the handle counters
could be written at a value the reader refused. One is a guard, a race that
failed in about two runs of three: a header rewritten by another thread
during unserialize made a small stored input allocate gigabytes.
"""

import collections
import json
import os
import resource
import struct
import subprocess
import sys
import textwrap
import threading
import time
import zlib

import numpy as np
import pytest

import exreplay
import exreplay.log
from childrun import run_child
from exreplay import ExperienceReplay

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fuzz_worker as fw  # noqa: E402

MAX_HANDLE = 1 << 62
ASAN = os.environ.get("EXREPLAY_ASAN") == "1"


def sections(payload):
    """[(tag, content)] of a payload."""
    out, off = [], 0
    while off < len(payload):
        tag, ln = struct.unpack_from("<IxxxxQ", payload, off)
        out.append([tag, bytearray(payload[off + 16 : off + 16 + ln])])
        off += 16 + ln
    return out


def join(secs):
    return b"".join(struct.pack("<IIQ", t, 0, len(c)) + bytes(c) for t, c in secs)


def empty_buffer(**kw):
    kw.setdefault("state_shape", (1,))
    kw.setdefault("state_dtype", "uint8")
    kw.setdefault("pick_len", 1)
    return ExperienceReplay(**kw)


def with_open_episodes(handles, level=0, **kw):
    """A valid serialized buffer holding one empty open episode per handle."""
    secs = sections(fw.unpack(empty_buffer(**kw).serialize(level=0))[1])
    cfg = secs[0][1]
    struct.pack_into("<q", cfg, 48, max(handles) + 1)  # next_handle
    eps = struct.pack("<Q", len(handles)) + b"".join(
        struct.pack("<qQBBBBI", h, 0, 0, 0, 0, 0, 0) for h in handles
    )
    secs[2][1] = bytearray(eps)
    return fw.pack(join(secs), level)


def colliding_handles(n):
    """n increasing handles < 2^62 that the old fixed hash, (h * phi >> 17)
    & (cap - 1), put in one slot at every table size."""
    inv = pow(0x9E3779B97F4A7C15, -1, 2**64)
    hs = sorted(h for h in ((x << 37) * inv % 2**64 for x in range(1, 1 << 20)) if h < MAX_HANDLE)
    assert len(hs) >= n
    return hs[:n]


# --- 1. chosen keys -----------------------------------------------------------
#
# Bounded by probe counts, not by time: the episode map reports how far each
# live handle sits from its home slot (buf._map_probes(), docs/api.md). With
# the old fixed hash the colliding handles below all shared one home slot, so
# their mean distance was about n / 2 (every load, record and set_priority
# lookup walking that run: quadratic in n); with the keyed hash they spread
# like any handles (a half-full table: a mean under 1, a short longest run).

PROBES_MEAN, PROBES_MAX = 2.0, 64


def test_colliding_handles_spread_in_the_episode_map():
    n = 40_000
    hostile = with_open_episodes(colliding_handles(n))
    ordinary = with_open_episodes(list(range(0, 2 * n, 2)))
    assert len(hostile) == len(ordinary)
    for data in (hostile, ordinary):
        b = ExperienceReplay.unserialize(data)
        assert b.num_episodes == n
        b._check()
        mean, longest = b._map_probes()
        assert mean < PROBES_MEAN and longest < PROBES_MAX, (mean, longest)


def test_record_and_set_priority_against_colliding_handles_keep_short_probes():
    """record and set_priority find episodes through the same map: after
    thousands of both against the last colliding handle, and new episodes,
    the map's runs stay as short (each lookup O(1))."""
    n = 40_000
    hs = colliding_handles(n)
    b = ExperienceReplay.unserialize(with_open_episodes(hs, pick_len=1))
    ps = b.new_pick_selector(exreplay.PickSelectorClass.Prioritized, alpha=1.0, beta=0.0)
    s = np.zeros(1, np.uint8)
    for _ in range(2000):
        b.record(hs[-1], s, 0, 0.0)
    b.set_priority(ps, np.full(2000, hs[-1]), np.arange(2000), np.ones(2000))
    for _ in range(100):
        b.record(None, s, 0, 0.0, terminated=True)  # new episodes enter the map too
    b._check()
    mean, longest = b._map_probes()
    assert mean < PROBES_MEAN and longest < PROBES_MAX, (mean, longest)


def test_handles_sharing_low_bits_are_found_through_the_map():
    """The direct table in front of the map (docs/design.md, "Episodes")
    indexes a handle by its low bits: 40,000 handles that share their low
    22 bits all land on one entry, which can answer for one of them, so
    every other lookup goes to the keyed map. Each is still found: records
    go to the right episode and set_priority by (epi, pos) reaches every
    pick, with the map's runs as short as for any handles."""
    n = 40_000
    hs = [(k + 1) << 22 for k in range(n)]
    b = ExperienceReplay.unserialize(with_open_episodes(hs, pick_len=1))
    ps = b.new_pick_selector(exreplay.PickSelectorClass.Prioritized, alpha=1.0, beta=0.0)
    s = np.zeros(1, np.uint8)
    some = hs[::997] + [hs[-1]]
    for h in some:
        b.record(h, s, 0, 0.0)
        b.record(h, s, 0, 0.0)
    assert b.set_priority(ps, some, [0] * len(some), np.arange(1.0, len(some) + 1)) == len(some)
    assert b._priority(ps, some, [0] * len(some)).tolist() == list(np.arange(1.0, len(some) + 1))
    assert b.set_priority(ps, [hs[1] + 1, hs[1] - (1 << 22) + 1], [0, 0], 5.0) == 0  # no such episodes
    b._check()
    mean, longest = b._map_probes()
    assert mean < PROBES_MEAN and longest < PROBES_MAX, (mean, longest)


# --- 2. memory bounded by what was inflated --------------------------------------


def _bomb(junk=2_000_000, row_state=1032):
    """A zlib input: a valid prefix declaring one open episode of as many
    rows of row_state + 4 bytes as the 1032:1 limit lets it declare, 64 real
    rows, then junk (inflate fails there). ~junk bytes. (Random junk would
    not do: it can inflate to a hundred times its size before it fails.)"""
    b = ExperienceReplay(
        state_shape=(row_state,), state_dtype="uint8", action_dtype="int32", capacity=None, pick_len=1
    )
    secs = sections(fw.unpack(b.serialize(level=0))[1])
    struct.pack_into("<q", secs[0][1], 48, 1)
    row = row_state + 4 + 4  # uint8 state, int32 action, float32 reward

    def head_for(rows):
        ep = struct.pack("<Q", 1) + struct.pack("<qQBBBBI", 0, rows, 0, 0, 0, 0, 0)
        return join(secs[:2]) + struct.pack("<IIQ", 3, 0, 8 + 24 + rows * (row + 4)) + ep

    c = zlib.compressobj(1)
    body = c.compress(head_for(0)) + c.compress(bytes(row * 64)) + c.flush(zlib.Z_SYNC_FLUSH)
    body += b"\xff" * junk  # a deflate block of the reserved type 3: inflate fails here
    rows = (1032 * len(body) - 4096) // (row + 4)
    c = zlib.compressobj(1)
    head = head_for(rows)
    body = c.compress(head) + c.compress(bytes(row * 64)) + c.flush(zlib.Z_SYNC_FLUSH)
    body += b"\xff" * junk  # a deflate block of the reserved type 3: inflate fails here
    raw_len = len(head) + rows * (row + 4) + 100
    assert raw_len <= 1032 * len(body)
    return bytes(fw.make_header(raw_len, len(body), 1, 0)) + body


def test_small_zlib_input_declaring_gigabytes_is_valueerror_under_2gib():
    data = _bomb()
    script = textwrap.dedent(
        """
        import resource, sys
        import exreplay
        data = open(sys.argv[1], "rb").read()
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        try:
            exreplay.ExperienceReplay.unserialize(data)
        except ValueError as e:
            print("ValueError", e)
        except MemoryError as e:
            print("MemoryError", repr(e))
        # VmHWM: this process's peak RSS (ru_maxrss would carry the parent's
        # over the fork and exec)
        hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0].split()[1]
        print("maxrss_kb", hwm)
        """
    )
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"exr-bomb-{os.getpid()}.bin")
    with open(path, "wb") as f:
        f.write(data)
    try:
        env = dict(os.environ)
        if ASAN:
            pytest.skip("ASan reserves terabytes of shadow: no RLIMIT_AS there")
        r = subprocess.run(
            [sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120, env=env
        )
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("ValueError data: invalid serialized buffer"), r.stdout
    maxrss_mb = int(lines[1].split()[1]) / 1024
    # the input is ~2 MB and holds 64 real rows; the interpreter and NumPy
    # take ~40-60 MB; before the fix the reader mapped 2.2 GB first
    assert maxrss_mb < 200 + 20 * len(data) / 2**20, maxrss_mb


def test_small_zlib_input_reserves_little_address_space():
    """Without a limit: the peak of the process's address space (VmPeak)
    grows by a small multiple of the input, not by what it declares (before
    the fix: 2.2 GB reserved, then ValueError)."""
    if ASAN:
        pytest.skip("ASan's allocator reserves its own address space")
    data = _bomb(junk=1_000_000)
    script = textwrap.dedent(
        """
        import sys
        import exreplay

        def vmpeak_kb():
            for line in open("/proc/self/status"):
                if line.startswith("VmPeak:"):
                    return int(line.split()[1])

        data = open(sys.argv[1], "rb").read()
        before = vmpeak_kb()
        try:
            exreplay.ExperienceReplay.unserialize(data)
        except ValueError:
            print("ValueError")
        print((vmpeak_kb() - before) // 1024)
        """
    )
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"exr-bomb2-{os.getpid()}.bin")
    with open(path, "wb") as f:
        f.write(data)
    try:
        r = subprocess.run([sys.executable, "-c", script, path], capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(path)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[0] == "ValueError"
    grew_mb = int(out[1])
    # declared: ~1 GB; read: 64 rows. Thread stacks, arenas: tens of MB.
    assert grew_mb < 10 * len(data) / 2**20 + 64, grew_mb


# --- 3. FIFO hand, 4. counter limits ------------------------------------------------


def _patched_config(buf, fn):
    secs = sections(fw.unpack(buf.serialize(level=0))[1])
    fn(secs[0][1])
    return fw.pack(join(secs), 0)


def test_fifo_buffer_with_a_hand_is_refused():
    b = ExperienceReplay(state_shape=(1,), state_dtype="uint8", pick_len=1, capacity=8, eviction="fifo")
    s = np.zeros(1, np.uint8)
    for _ in range(3):
        h = b.new_episode()
        for _ in range(2):
            b.record(h, s, 0, 0.0)
    first = b._handles()[0]
    data = _patched_config(b, lambda cfg: struct.pack_into("<q", cfg, 64, first))
    with pytest.raises(ValueError, match="data: invalid serialized buffer"):
        ExperienceReplay.unserialize(data)
    # the same hand with second-chance eviction is fine
    sc = _patched_config(b, lambda cfg: (struct.pack_into("<q", cfg, 64, first), cfg.__setitem__(37, 1)))
    r = ExperienceReplay.unserialize(sc)
    r._check()


@pytest.mark.parametrize("which", ["episode", "selector"])
def test_counter_at_its_limit_round_trips(which):
    b = empty_buffer()
    off = 48 if which == "episode" else 56
    data = _patched_config(b, lambda cfg: struct.pack_into("<q", cfg, off, MAX_HANDLE - 1))
    r = ExperienceReplay.unserialize(data)
    s = np.zeros(1, np.uint8)
    if which == "episode":
        assert r.new_episode() == MAX_HANDLE - 1
        r.record(MAX_HANDLE - 1, s, 0, 0.0)
        with pytest.raises(MemoryError, match="2\\*\\*62 handles"):
            r.new_episode()
    else:
        assert int(r.new_pick_selector(exreplay.PickSelectorClass.Uniform)) == MAX_HANDLE - 1
        with pytest.raises(MemoryError, match="2\\*\\*62 handles"):
            r.new_pick_selector(exreplay.PickSelectorClass.Uniform)
    r._check()
    # what the writer writes at the limit, the reader takes
    again = ExperienceReplay.unserialize(r.serialize())
    again._check()
    assert again.serialize() == r.serialize()
    # and one past the limit is refused
    past = _patched_config(b, lambda cfg: struct.pack_into("<q", cfg, off, MAX_HANDLE + 1))
    with pytest.raises(ValueError):
        ExperienceReplay.unserialize(past)



def test_header_rewritten_by_another_thread_during_unserialize():
    """A guard (a race: it cannot fail at every run). unserialize reads the
    caller's buffer without the GIL, and it read the 40-byte header twice
    and some fields a third time: a check against the input's length, then
    the fields it read by. Another thread writing a bytearray's header in
    between could have the body read by a header never checked against the
    input: here a stored body of some 300 bytes whose header then declares
    2**50 bytes, and whose config declares 64 GiB states, made the reader
    allocate 64 GiB for the final state (MemoryError: about one call in
    150,000 here, so about two runs in three of this test failed on the old
    code). The header is now copied once, and only
    the checked copy is read: every call raises ValueError (the body is not
    valid under the real header), never anything else, never a crash."""
    b = ExperienceReplay((4,), "float32", capacity=None, seed=1)
    b.record_many(None, np.ones((1, 4), np.float32), np.ones(1, np.int64),
                  np.zeros(1, np.float32), final_state=np.ones(4, np.float32))
    secs = sections(fw.unpack(b.serialize(level=0))[1])
    struct.pack_into("<Q", secs[0][1], 0, 1 << 36)  # state_bytes: 64 GiB
    payload = join(secs)
    real = bytes(fw.make_header(len(payload), len(payload), 0, fw.crc(payload)))
    lying = bytes(fw.make_header(1 << 50, 1 << 50, 0, fw.crc(payload)))
    data = bytearray(real + payload)
    with pytest.raises(ValueError, match="data: invalid serialized buffer"):
        ExperienceReplay.unserialize(bytes(data))
    stop = threading.Event()

    def rewrite():
        while not stop.is_set():
            data[:40] = lying
            data[:40] = real

    t = threading.Thread(target=rewrite)
    t.start()
    got = collections.Counter()
    try:
        end = time.monotonic() + 4.0
        for i in range(300_000):
            if i % 1000 == 0 and time.monotonic() > end:
                break
            try:
                ExperienceReplay.unserialize(data)
                got["returned"] += 1
            except ValueError as e:
                assert str(e) == "data: invalid serialized buffer"
                got["ValueError"] += 1
            except MemoryError as e:
                got["MemoryError: %s" % e] += 1
    finally:
        stop.set()
        t.join()
    assert list(got) == ["ValueError"], got


# --- 5. selectors: at most 1,024 a buffer ----------------------------------------------


def test_selector_count_is_capped_and_a_file_with_more_is_refused():
    """A selector costs a fixed ~24 KiB (prioritized) for ~88 bytes of a
    serialized buffer: a file of many selectors would otherwise allocate
    hundreds of times its length. A buffer holds at most 1,024; the reader
    refuses a file with more."""
    b = empty_buffer()
    kinds = list(exreplay.PickSelectorClass)
    sels = [b.new_pick_selector(kinds[i % 3]) for i in range(1024)]
    before = b.serialize(level=0)
    with pytest.raises(ValueError, match="new_pick_selector: expected a buffer holding fewer "
                                         "than 1024 selectors"):
        b.new_pick_selector(exreplay.PickSelectorClass.Prioritized)
    assert b.serialize(level=0) == before  # the handle counter did not move either
    b._check()
    r = ExperienceReplay.unserialize(before)  # what the writer writes, the reader takes
    r._check()
    b.remove_pick_selector(sels[7])
    assert int(b.new_pick_selector(exreplay.PickSelectorClass.Prioritized)) == 1024

    # a 1,025th selector record appended to the file: refused
    secs = sections(fw.unpack(before)[1])
    sel = secs[4][1]
    (count,) = struct.unpack_from("<Q", sel, 0)
    assert count == 1024
    last = bytes(sel[-(56 + 8):])  # a Uniform record: 56 bytes of head, state_len 0
    assert struct.unpack_from("<q", last, 0)[0] == 1023 and struct.unpack_from("<I", last, 8)[0] == 0
    extra = struct.pack("<q", 1024) + last[8:]
    struct.pack_into("<Q", sel, 0, 1025)
    secs[4][1] = sel + extra
    struct.pack_into("<q", secs[0][1], 56, 1025)  # next_sel_handle
    with pytest.raises(ValueError, match="invalid serialized buffer"):
        ExperienceReplay.unserialize(fw.pack(join(secs), 0))


# --- 6. the experience log's readers -----------------------------------------------------
#
# Logs forged field by field (docs/log.md, "Format"), every CRC right: what
# the readers must refuse, they refuse on the fields, not on a checksum.

LOG_SCHEMA = {"state": {"dtype": "|u1", "shape": [3]}, "action": {"dtype": "<f4", "shape": [2]},
              "reward": {"dtype": "<f4", "shape": []}}
LOG_ROW = 3 + 8 + 4


def log_header(schema=None):
    """A version-1 file header of LOG_SCHEMA's layout (or of schema's bytes)."""
    blob = schema if schema is not None else json.dumps(LOG_SCHEMA).encode()
    h = b"EXRPLOG\n" + struct.pack("<IIQQQI", 1, 48 + len(blob), 3, 8, 4, len(blob)) + blob
    return h + struct.pack("<I", zlib.crc32(h))


def log_chunk(count, raw_len, body, kind=1, codec=1, first=0, last=0):
    """A chunk around body, its header and trailer consistent with it."""
    hb = struct.pack("<4sHHIIqqQQI", b"XRCK", kind, codec, count, 0, first, last, raw_len,
                     len(body), zlib.crc32(body))
    hcrc = zlib.crc32(hb)
    return (hb + struct.pack("<I", hcrc) + body
            + struct.pack("<QI4s", 56 + len(body) + 16, hcrc, b"XREN"))


LOG_END = log_chunk(0, 0, b"", kind=2, codec=0)


def log_readers(path):
    """Every reader of a log, each run to its end."""
    return {"open": lambda: list(exreplay.log.open(path)), "info": lambda: exreplay.log.info(path),
            "tail": lambda: exreplay.log.tail(path, 5),
            "from_log": lambda: ExperienceReplay.from_log(path, capacity=None),
            "merge": lambda: exreplay.log.merge([path], str(path) + ".merged")}


def test_log_schema_nested_deeply_is_valueerror(tmp_path):
    """The schema is JSON; nested thousands deep (within the header's limit
    and its CRC right) json.loads recursed until a RecursionError, not the
    ValueError every reader promises. Nesting deeper than a schema has is
    refused before it is parsed."""
    deep = json.dumps(LOG_SCHEMA).encode()[:-1] + b', "x": ' + b"[" * 3000 + b"]" * 3000 + b"}"
    strings = json.dumps(dict(LOG_SCHEMA, x='[[[{{{"\\"' * 500)).encode()  # brackets in a string
    p, q = tmp_path / "deep.log", tmp_path / "strings.log"
    p.write_bytes(log_header(deep) + LOG_END)
    q.write_bytes(log_header(strings) + LOG_END)
    for name, read in log_readers(p).items():
        with pytest.raises(ValueError, match="deep.log: not a valid experience log at byte 44: "
                                             "schema nests"):
            read()
    assert exreplay.log.info(q)["records"] == 0


def test_log_schema_of_unterminated_escaped_quotes_is_read_in_one_pass(tmp_path):
    """A 1 MiB schema of one string that never ends, all escaped quotes: the
    depth check stripped strings with a regex that tried again from every
    quote, quadratic (about 70 minutes for this file). Every reader now
    refuses it at once (a child process, so that the old way is a timeout)."""
    blob = b'{"x": "' + b'\\"' * ((1 << 19) - 8)
    p = tmp_path / "quotes.log"
    p.write_bytes(log_header(blob) + LOG_END)
    r = run_child("import sys, exreplay.log as x\n"
                  "try:\n    x.info(sys.argv[1])\nexcept ValueError as e:\n    print(e)\n",
                  p, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "quotes.log: not a valid experience log" in r.stdout


def _log_bomb(path, junk=2_000_000):
    """A log of one zlib chunk whose ~junk bytes of body claim as many raw
    bytes as the 1032:1 limit lets them (~2 GB of records), of which a
    thousand inflate before inflate fails (a reserved block type)."""
    c = zlib.compressobj(1)
    body = c.compress(bytes(1000)) + c.flush(zlib.Z_SYNC_FLUSH) + b"\xff" * junk
    count = min(1 << 31, 1032 * len(body) + 64) // (29 + LOG_ROW)
    path.write_bytes(log_header() + log_chunk(count, count * (29 + LOG_ROW), body) + LOG_END)


def test_merge_of_a_small_log_declaring_gigabytes_reserves_little(tmp_path):
    """The merge reserved a chunk's declared raw length before inflating a
    byte: a 2 MB log declaring 2 GB was a MemoryError under a 2 GiB address
    space limit (the readers said ValueError) and mapped 2 GB without one.
    Its output now grows as the body inflates."""
    if ASAN:
        pytest.skip("ASan reserves terabytes of shadow: no RLIMIT_AS there")
    p = tmp_path / "bomb.log"
    _log_bomb(p)
    script = textwrap.dedent(
        """
        import resource, sys
        import exreplay.log

        def vmpeak_mb():
            for line in open("/proc/self/status"):
                if line.startswith("VmPeak:"):
                    return int(line.split()[1]) // 1024

        src, out, limit = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
        if limit:
            resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        before = vmpeak_mb()
        for threads in (0, 2):
            try:
                exreplay.log.merge([src], out, threads=threads)
            except ValueError as e:
                print("ValueError", e)
            except MemoryError as e:
                print("MemoryError", e)
        print(vmpeak_mb() - before)
        """
    )
    for limit in ("1", "0"):
        r = subprocess.run([sys.executable, "-c", script, str(p), str(tmp_path / "o.log"), limit],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        for line in lines[:2]:
            assert line.startswith("ValueError "), lines
            assert "bomb.log: not a valid experience log" in line, lines
        assert not (tmp_path / "o.log").exists()
        # ~2 MB of input, a kilobyte inflated; thread stacks and arenas: tens of MB
        assert int(lines[2]) < 10 * p.stat().st_size / 2**20 + 128, lines


def test_merge_inflates_chunks_larger_than_its_first_room(tmp_path):
    """The merge's room for a chunk starts at 1 MiB and doubles: chunks of
    several MiB (one compressible, one not) merge to the same records."""
    rng = np.random.default_rng(5)
    p = tmp_path / "big.log"
    with exreplay.ExperienceLog(p, state_shape=(4096,), state_dtype="uint8", level=1,
                                chunk_bytes=6 << 20, flush_interval=None) as lg:
        for k in range(2):
            st = rng.integers(0, 256, (1200, 4096), np.uint8) if k else np.zeros((1200, 4096),
                                                                                   np.uint8)
            lg.append_many(k, 0, st, np.arange(1200), np.ones(1200, np.float32),
                           terminated=True)
            lg.flush()
    want = list(exreplay.log.open(p))
    assert [len(c.timestamps) for c in want] == [1200, 1200]
    for threads in (0, 2):
        out = tmp_path / ("o%d.log" % threads)
        exreplay.log.merge([p], out, threads=threads, chunk_bytes=8 << 20)
        got = list(exreplay.log.open(out))
        for f in ("states", "actions", "rewards", "handles", "positions", "flags"):
            assert np.array_equal(np.concatenate([getattr(c, f) for c in got]),
                                  np.concatenate([getattr(c, f) for c in want]))


def test_tail_over_a_torn_tail_of_trailer_magics_reads_a_bounded_number(tmp_path, monkeypatch):
    """tail finds the last whole chunk from the end, checking each trailer
    magic in the torn bytes (two reads each). A torn tail of 1 MiB made of
    16-byte trailers that each point at a plausible chunk took 65,536 checks
    (0.3 s a MiB; a 1 GB file, minutes, where info takes a millisecond).
    Past 64 candidates the chunk headers are walked from the front instead,
    and tail returns what the iteration reads."""
    good = [log_chunk(1, 29 + LOG_ROW, struct.pack("<qqqIB", t, 0, t, 0, 0) + bytes(LOG_ROW),
                      codec=0, first=t, last=t) for t in range(3)]
    hb = struct.pack("<4sHHIIqqQQI", b"XRCK", 1, 1, 1, 0, 9, 9, 44, 1 << 30, 0)
    torn = hb + struct.pack("<I", zlib.crc32(hb)) + struct.pack("<QI4s", 72, 0, b"XREN") * 65536
    p = tmp_path / "torn.log"
    p.write_bytes(log_header() + b"".join(good) + torn)
    calls = []
    real = exreplay.log._trailer_at
    monkeypatch.setattr(exreplay.log, "_trailer_at", lambda *a: calls.append(1) or real(*a))
    c = exreplay.log.tail(p, 2)
    assert list(c.timestamps) == [1, 2]
    assert len(calls) < 100, len(calls)
    assert exreplay.log.info(p)["torn"] == len(torn)
    # a torn tail with a few such magics is still scanned from the end
    p.write_bytes(log_header() + b"".join(good) + torn[:56 + 16 * 10])
    calls.clear()
    assert list(exreplay.log.tail(p, 3).timestamps) == [0, 1, 2]
    assert 10 <= len(calls) < 20
