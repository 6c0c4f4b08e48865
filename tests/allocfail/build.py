"""Builds the allocation-failure test variant of the extension into
build/allocfail/ (`make allocfail`): the product's sources plus
tests/allocfail/allocfail.c, linked with --wrap for the malloc family.

    python tests/allocfail/build.py     # prints the path of the .so
"""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    env = dict(os.environ, EXREPLAY_ALLOCFAIL="1")
    subprocess.run(
        [sys.executable, "setup.py", "--quiet", "build_ext", "--build-lib", "build/allocfail",
         "--build-temp", "build/allocfail-tmp"],
        cwd=ROOT, env=env, check=True,
    )
    import sysconfig

    so = os.path.join(ROOT, "build", "allocfail", "exreplay", "_core" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        sys.exit(f"error: {so} was not built")
    print(so)


if __name__ == "__main__":
    main()
