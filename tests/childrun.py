"""Python source run in a fresh interpreter on this tree, for the tests whose
case may crash or hang the process, or needs a process of its own (a limit,
a signal): the child imports exreplay from the same tree as the tests."""

import os
import subprocess
import sys

import exreplay

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(exreplay.__file__)))


def child_env():
    """This process's environment with the tree first on PYTHONPATH."""
    return dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_child(src, *args, timeout=60):
    """Runs src with args in a child; a hang is a TimeoutExpired."""
    return subprocess.run([sys.executable, "-c", src, *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=child_env())
