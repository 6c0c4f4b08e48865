"""Coverage-guided fuzzing of ExperienceReplay.unserialize with atheris (libFuzzer).

    pip install atheris                     # 3.0.0 has wheels for CPython 3.11
    python fuzz/make_corpus.py              # seeds into fuzz/corpus/
    python fuzz/atheris_unserialize.py fuzz/corpus -max_total_time=600 \\
        -rss_limit_mb=4096 -timeout=10 -artifact_prefix=fuzz/findings/

The target is tests/fuzz_worker.py's oracle, check_input(): unserialize
either raises ValueError, or returns a buffer that passes _check(), serializes
again, serves get_batch and accepts a record. Anything else raises, and
atheris reports the input as a crash (so does a segfault, an ASan report, an
input slower than -timeout, or memory beyond -rss_limit_mb).

Coverage: atheris instruments Python bytecode; to steer by the C code's edge
coverage too, build the extension with clang and -fsanitize=fuzzer-no-link
(docs/fuzzing.md). Without that, the C side is reached through two custom
mutators below that keep inputs deep in the format:

- the header is always made consistent (CRCs, raw_len, body_len) for a
  fraction of inputs, as in the CI fuzzer's "fixed" mode, so libFuzzer's
  byte mutations reach the field checks behind the checksum;
- a zlib input is mutated in its decompressed form and recompressed.

Flags after the corpus directories go to libFuzzer (-help=1 lists them).
EXREPLAY_FUZZ_NOFIX=1 turns the fix-up off (plain byte-level fuzzing).
EXREPLAY_FUZZ_RLIMIT_AS sets the address-space limit (default 2 GiB; 0: none).
Inputs that hit a known bug (tests/test_fuzz.py, xfail) are not findings:
check_input() counts them as known and moves on.
"""

import os
import resource
import struct
import sys
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import atheris  # noqa: E402
import numpy  # noqa: E402,F401  (imported first: not instrumented, it is not under test)

import exreplay  # noqa: E402,F401

with atheris.instrument_imports():
    import fuzz_worker as fw  # noqa: E402

NOFIX = os.environ.get("EXREPLAY_FUZZ_NOFIX", "") not in ("", "0")


def _fixup(data: bytes, seed: int) -> bytes:
    """Makes the header agree with the (possibly mutated) body, 3 times in 4."""
    if NOFIX or len(data) < fw.HEADER or seed % 4 == 3:
        return data
    codec = struct.unpack_from("<I", data, 12)[0]
    body = data[fw.HEADER:]
    if codec == 1:
        try:
            payload = zlib.decompressobj().decompress(body, 1 << 24)
        except zlib.error:
            return data
    elif codec == 0:
        payload = body
    else:
        return data
    h = fw.make_header(len(payload), len(body), codec, fw.crc(payload))
    return bytes(h) + body


def custom_mutator(data, max_size, seed):
    """libFuzzer's mutation on the payload (decompressed if zlib), then the fix-up."""
    if len(data) >= fw.HEADER and not NOFIX and seed % 2 == 0:
        codec = struct.unpack_from("<I", data, 12)[0]
        if codec == 1:
            try:
                payload = zlib.decompress(data[fw.HEADER:])
            except zlib.error:
                payload = None
            if payload is not None:
                payload = atheris.Mutate(payload, max(len(payload) * 2, 64))
                return fw.pack(payload, 1 + seed % 9)[:max(max_size, fw.HEADER)]
        elif codec == 0:
            payload = atheris.Mutate(data[fw.HEADER:], max(max_size - fw.HEADER, 0))
            return fw.pack(payload, 0)
    return _fixup(atheris.Mutate(data, max_size), seed)


def test_one_input(data: bytes):
    try:
        fw.check_input(data)
    except fw.Failure as e:
        raise AssertionError(str(e)) from None


def main():
    warnings.simplefilter("error")  # a warning escaping unserialize is a finding
    # Over-allocation shows up as MemoryError (a finding) under this limit;
    # EXREPLAY_FUZZ_RLIMIT_AS=0 lifts it (needed under ASan).
    limit = int(os.environ.get("EXREPLAY_FUZZ_RLIMIT_AS", str(2 << 30)))
    if limit:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
