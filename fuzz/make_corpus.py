"""Writes the seed corpus of fuzz/atheris_unserialize.py into fuzz/corpus/.

    python fuzz/make_corpus.py [DIR]        # default: fuzz/corpus (not committed)

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
    out = argv[1] if len(argv) > 1 else os.path.join(HERE, "corpus")
    os.makedirs(out, exist_ok=True)
    n = 0
    for name, b in fw.seed_buffers():
        for level in (0, 1, 6, 9):
            data = b.serialize(level=level)
            with open(os.path.join(out, f"{name}-L{level}.exr"), "wb") as f:
                f.write(data)
            n += 1
        payload = fw.unpack(b.serialize(level=0))[1]
        off, k = 0, 0
        while off < len(payload):  # section boundaries
            ln = struct.unpack_from("<Q", payload, off + 8)[0]
            off += 16 + ln
            if off < len(payload):
                with open(os.path.join(out, f"{name}-cut{k}.exr"), "wb") as f:
                    f.write(fw.pack(payload[:off], 0))
                n += 1
                k += 1
    print(f"{n} inputs in {out}")


if __name__ == "__main__":
    main(sys.argv)
