"""Writes the seed corpus of fuzz/atheris_unserialize.py into fuzz/corpus/.

    python fuzz/make_corpus.py [DIR]        # default: fuzz/corpus (not committed)
    python fuzz/make_corpus.py --libfuzzer [DIR]   # default: fuzz/seeds/codec_read

--libfuzzer writes the seed corpus of the C harness fuzz/fuzz_codec_read.c,
which is committed: each input starts with the harness's mode byte (0: a
whole serialized buffer, 1: a payload to wrap stored, 2: a payload to wrap
in zlib), so every seed appears once whole and once as each kind of payload.

The seeds are tests/fuzz_worker.py's small valid buffers (every section of
the format: episodes ended, terminated and open, final states, short picks,
uniform and prioritized selectors, a removed selector, second-chance eviction
state), each at level 0 (stored) and level 6 (zlib), plus level 1 and 9, and
every seed's payload truncated at each section boundary (invalid: a head
start for the fuzzer on the checks between sections).
"""

import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import fuzz_worker as fw  # noqa: E402


def main(argv):
    libfuzzer = "--libfuzzer" in argv
    argv = [a for a in argv if a != "--libfuzzer"]
    default = os.path.join(HERE, "seeds", "codec_read") if libfuzzer else os.path.join(HERE, "corpus")
    out = argv[1] if len(argv) > 1 else default
    os.makedirs(out, exist_ok=True)
    n = 0

    def put(name, data):
        nonlocal n
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
        n += 1

    for name, b in fw.seed_buffers():
        payload = fw.unpack(b.serialize(level=0))[1]
        if libfuzzer:
            put(f"{name}-L0.exr", b"\0" + b.serialize(level=0))
            put(f"{name}-L6.exr", b"\0" + b.serialize(level=6))
            put(f"{name}-stored.exr", b"\1" + payload)
            put(f"{name}-zlib.exr", b"\2" + payload)
        else:
            for level in (0, 1, 6, 9):
                put(f"{name}-L{level}.exr", b.serialize(level=level))
        off, k = 0, 0
        while off < len(payload):  # section boundaries
            ln = struct.unpack_from("<Q", payload, off + 8)[0]
            off += 16 + ln
            if off < len(payload):
                put(f"{name}-cut{k}.exr", b"\1" + payload[:off] if libfuzzer else fw.pack(payload[:off], 0))
                k += 1
    print(f"{n} inputs in {out}")


if __name__ == "__main__":
    main(sys.argv)
