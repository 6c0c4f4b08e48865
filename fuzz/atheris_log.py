"""Coverage-guided fuzzing of the experience log reader with atheris (libFuzzer).

    pip install atheris
    python fuzz/atheris_log.py fuzz/corpus-log -max_total_time=600 \\
        -rss_limit_mb=4096 -timeout=10 -artifact_prefix=fuzz/findings/

Seeds: with an empty corpus directory the target writes five valid logs
into it first (tests/log_fuzz.py make_seed, make_fields_seed, and
make_end_seed, whose ends without a step are chunks of kind 3). The oracle is
tests/log_fuzz.py's check_file(): exreplay.log.open (iterated), info, tail
and ExperienceReplay.from_log succeed consistently or raise ValueError;
anything else is reported as a crash.

The custom mutator keeps inputs deep in the format: three times in four it
mutates a decompressed chunk body (or a header field, the schema, the chunk
order) through libFuzzer's own mutation and then recomputes every length
and CRC (file header, chunk header, body, trailer), so the field checks
behind the checksums are reached; otherwise it mutates the raw bytes.
"""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

import atheris  # noqa: E402
import numpy as np  # noqa: E402

import exreplay  # noqa: E402,F401

with atheris.instrument_imports():
    import exreplay.log  # noqa: E402,F401
    import log_fuzz as lf  # noqa: E402

TMP = tempfile.mkdtemp(prefix="exreplay-atheris-log-")


def custom_mutator(data, max_size, seed):
    if seed % 4 != 3:
        try:
            head, chunks, tail = lf.parse(data)
        except Exception:  # noqa: BLE001 - not parseable: mutate the bytes
            head = None
        if head is not None and chunks:
            c = chunks[seed % len(chunks)]
            c["raw"] = atheris.Mutate(c["raw"], max(len(c["raw"]) * 2, 64))
            try:
                return lf.serialize(head, chunks, tail)[:max_size]
            except Exception:  # noqa: BLE001
                pass
        if head is not None:
            # libFuzzer refuses a mutation longer than max_size: cut it (a torn tail)
            return lf.mutate(data, np.random.default_rng(seed))[1][:max_size]
    return atheris.Mutate(data, max_size)


def test_one_input(data: bytes):
    try:
        lf.check_input(data, TMP)
    except lf.Failure as e:
        raise AssertionError(str(e)) from None


def main():
    corpus = [a for a in sys.argv[1:] if not a.startswith("-")]
    if corpus and os.path.isdir(corpus[0]) and not os.listdir(corpus[0]):
        for i, (lv, cb) in enumerate(((1, 300), (0, 120), (6, 1000))):
            lf.make_seed(os.path.join(corpus[0], "seed%d.log" % i), level=lv, chunk_bytes=cb)
        lf.make_fields_seed(os.path.join(corpus[0], "seed3.log"))  # format version 2
        lf.make_end_seed(os.path.join(corpus[0], "seed4.log"))  # chunks of kind 3
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
