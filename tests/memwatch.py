"""Bounds on bytes instead of seconds: how far a call makes the process's
resident memory peak above what it held before (Linux: /proc/self/status's
VmHWM, reset through /proc/self/clear_refs). A reader that refuses hostile
input must not have allocated for what the input only claims."""

import os
import re

# Under ASan the allocator keeps freed memory in quarantine and maps shadow
# memory: resident bytes say nothing about what the code allocated.
ASAN = os.environ.get("EXREPLAY_ASAN", "") not in ("", "0")


def _kib(field):
    with open("/proc/self/status") as f:
        m = re.search(r"^%s:\s+(\d+) kB" % field, f.read(), re.M)
    return int(m.group(1)) if m else None


def available():
    if ASAN or _kib("VmHWM") is None:
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def peak_growth(fn):
    """Calls fn(); returns (bytes the resident peak rose above the resident
    size before the call, or None if that cannot be measured here, and the
    exception fn raised or None)."""
    measure = available()  # resets the peak to the current resident size
    before = _kib("VmRSS") if measure else None
    exc = None
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - handed to the caller
        exc = e
    if not measure:
        return None, exc
    return max(0, _kib("VmHWM") - before) * 1024, exc
