"""Shared fixtures: the buffer implementations the tests run against."""

import pytest

# Every test that takes `make_buffer` runs once per implementation listed here:
# the same statements of the spec hold for the pure-Python reference and for
# the C buffer exreplay.ExperienceReplay.
IMPLS = ["reference", "c"]


def _buffer_class(name):
    if name == "reference":
        from exreplay.reference import ReferenceReplay

        return ReferenceReplay
    if name == "c":
        import exreplay

        return exreplay.ExperienceReplay
    raise ValueError(f"unknown implementation {name!r}")


@pytest.fixture(params=IMPLS)
def make_buffer(request):
    """The buffer class under test; call it as ExperienceReplay(...)."""
    yield _buffer_class(request.param)
