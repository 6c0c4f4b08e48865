"""Mutation fuzzing of the experience log reader (tests/log_fuzz.py): every
entry point gets structure-aware mutations of valid logs with their CRCs
fixed up, plus raw byte flips and truncations, and must either succeed
consistently or raise ValueError. EXREPLAY_LOG_FUZZ_INPUTS sets the count
(default 1500, a few seconds); `make fuzz-log` runs a long one."""

import collections
import os

import numpy as np
import pytest

import log_fuzz as lf

N = int(os.environ.get("EXREPLAY_LOG_FUZZ_INPUTS", "1500"))
SEED = int(os.environ.get("EXREPLAY_LOG_FUZZ_SEED", "1313"))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    return [lf.make_seed(str(d / "s0.log"), level=1),
            lf.make_seed(str(d / "s1.log"), level=0, chunk_bytes=120),
            lf.make_seed(str(d / "s2.log"), level=6, n=30, finals=False),
            lf.make_fields_seed(str(d / "s3.log")),
            lf.make_end_seed(str(d / "s4.log"))]


def test_seeds_are_valid(seeds, tmp_path):
    for s in seeds:
        lf.check_input(s, str(tmp_path))
        head, chunks, tail = lf.parse(s)
        assert lf.serialize(head, chunks, tail, level=9) is not None
        assert len(chunks) >= 2 and chunks[-1]["kind"] == 2


def test_mutation_fuzz(seeds, tmp_path):
    rng = np.random.default_rng(SEED)
    modes = collections.Counter()
    for i in range(N):
        seed = seeds[i % len(seeds)]
        mode, blob = lf.mutate(seed, rng)
        modes[mode.split(":")[0]] += 1
        try:
            lf.check_input(blob, str(tmp_path))
        except lf.Failure as e:
            bad = tmp_path / "finding.log"
            bad.write_bytes(blob)
            pytest.fail("input %d (mode %s, saved to %s): %s" % (i, mode, bad, e))
    assert len(modes) >= 9 and "nostep" in modes, modes


def test_header_fields_fixed_up_are_refused(seeds, tmp_path):
    """Every chunk header field at every boundary value, CRCs consistent."""
    head, chunks, tail = lf.parse(seeds[0])
    for k in ("kind", "codec", "count", "source", "raw_len", "body_len"):
        for v in lf.BOUNDARY:
            h2, c2, t2 = lf.parse(seeds[0])
            c2[0][k] = v
            lf.check_input(lf.serialize(h2, c2, t2), str(tmp_path))
