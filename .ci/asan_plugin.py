"""pytest plugin loaded by `make asan` (as `-p asan_plugin`).

It proves that the test session really exercises the AddressSanitizer build
of ``exreplay._core`` and not the optimised in-place one: after collection
(when the tests have imported the package) it compares the file behind
``exreplay._core`` with ``$EXREPLAY_ASAN_CORE`` and aborts the run if they
differ.
"""

import os
import sys

import pytest


def _core_file():
    import exreplay._core as core  # noqa: PLC0415  (import on purpose, late)

    return os.path.realpath(core.__file__)


def pytest_report_header(config):
    return "exreplay._core (ASan build expected): %s" % _core_file()


def pytest_collection_finish(session):
    expected = os.environ.get("EXREPLAY_ASAN_CORE")
    if not expected:
        raise pytest.UsageError("asan_plugin: EXREPLAY_ASAN_CORE is not set")
    got = _core_file()
    if got != os.path.realpath(expected):
        raise pytest.UsageError(
            "asan_plugin: tests imported %s, not the ASan build %s" % (got, expected)
        )
    mod = sys.modules["exreplay._core"]
    sys.stdout.write("\nasan_plugin: tests use %s\n" % getattr(mod, "__file__", "?"))
