"""Build script for the exreplay._core C extension.

Project metadata lives in pyproject.toml; this file only describes the
extension module.  One extension, ``exreplay._core``, is built from every
``src/core/*.c`` (pure C11, no Python.h) plus every ``src/py/*.c`` (the
CPython/NumPy binding).

Environment switches:
  EXREPLAY_SANITIZE=1  -O1 -g with AddressSanitizer + UBSan + float-cast-overflow and the
                       lock assertions of EXR_DEBUG_LOCKS (`make asan`)
  EXREPLAY_WERROR=1    add -Werror (the `make warnings` build)
  EXREPLAY_ALLOCFAIL=1 the allocation-failure test build (`make allocfail`): adds
                       tests/allocfail/allocfail.c and wraps the malloc family
  EXREPLAY_NO_LTO=1    no link-time optimization in the release build

The release build (-O3) links with -flto=auto when the compiler and linker
can: the core and the binding are split into files by concern (docs/design.md,
"File map"), and link-time optimization inlines the small functions that
cross those files on the record and get_batch paths as it did when they
shared one file. It is left out where it cannot help or may hurt: sanitizer
builds and the allocation-failure build (its --wrap of malloc).
"""

import os
import sys
import tempfile
from glob import glob

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ZLIB_MISSING = "zlib headers not found: on Debian/Ubuntu run `apt-get install zlib1g-dev`"


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _rel_glob(pattern):
    # setuptools wants source paths relative to the project root.
    return sorted(os.path.relpath(p, HERE) for p in glob(os.path.join(HERE, pattern)))


class BuildExt(build_ext):
    """build_ext that checks for zlib.h first and adds NumPy's include dir lazily."""

    def finalize_options(self):
        super().finalize_options()
        # Imported here, not at module level, so that `setup.py --help` and
        # metadata-only commands work without NumPy; the build backend always
        # has it (pyproject.toml [build-system] requires numpy>=2.0).
        import numpy

        if int(numpy.__version__.split(".")[0]) < 2:
            sys.stderr.write(
                "warning: building exreplay against NumPy %s; build against NumPy >= 2.0 "
                "for a module that runs on both NumPy 1.x and 2.x\n" % numpy.__version__
            )
        for ext in self.extensions:
            inc = numpy.get_include()
            if inc not in ext.include_dirs:
                ext.include_dirs.append(inc)

    def _builds(self, code, flags=(), link=False):
        """Whether this compiler compiles code with flags (and links it, if link)."""
        with tempfile.TemporaryDirectory() as tmp:
            src = os.path.join(tmp, "check.c")
            with open(src, "w") as f:
                f.write(code)
            try:
                objs = self.compiler.compile([src], output_dir=tmp, extra_postargs=list(flags))
                if link:
                    self.compiler.link_shared_object(objs, os.path.join(tmp, "check.so"),
                                                     extra_postargs=list(flags))
            except Exception:
                return False
        return True

    def _check_zlib(self):
        if not self._builds("#include <zlib.h>\nint main(void) { return ZLIB_VERNUM == 0; }\n"):
            raise SystemExit("error: " + ZLIB_MISSING)

    def _lto_links(self):
        """Whether this compiler and linker build a shared object with -flto=auto."""
        return self._builds("int exr_lto_check(int x) { return x + 1; }\n", LTO, link=True)

    def build_extensions(self):
        self._check_zlib()
        if USE_LTO and self._lto_links():
            for e in self.extensions:
                e.extra_compile_args += LTO
                e.extra_link_args += LTO
        super().build_extensions()


SANITIZE = _flag("EXREPLAY_SANITIZE")
WERROR = _flag("EXREPLAY_WERROR")
LTO = ["-flto=auto"]
USE_LTO = not (SANITIZE or _flag("EXREPLAY_ALLOCFAIL") or _flag("EXREPLAY_NO_LTO"))

compile_args = ["-std=c11", "-Wall", "-Wextra", "-fvisibility=hidden", "-pthread"]
link_args = ["-pthread"]
if SANITIZE:
    compile_args += [
        "-O1",
        "-g",
        # float-cast-overflow: not part of GCC's "undefined"
        "-fsanitize=address,undefined,float-cast-overflow",
        "-fno-omit-frame-pointer",
        "-fno-sanitize-recover=undefined,float-cast-overflow",
        # Python's CFLAGS carry -DNDEBUG; keep the core's assert()s live here.
        "-UNDEBUG",
        # *_locked functions assert that the buffer's lock is held (buffer_impl.h)
        "-DEXR_DEBUG_LOCKS",
    ]
    link_args += ["-fsanitize=address,undefined,float-cast-overflow"]
else:
    compile_args += ["-O3"]
if WERROR:
    compile_args += ["-Werror"]

core_sources = _rel_glob("src/core/*.c")
py_sources = _rel_glob("src/py/*.c")
if _flag("EXREPLAY_ALLOCFAIL"):
    py_sources += ["tests/allocfail/allocfail.c"]
    link_args += ["-Wl," + ",".join("--wrap=" + f for f in
                                    ("malloc", "calloc", "realloc", "aligned_alloc", "posix_memalign"))]
headers = _rel_glob("src/core/*.h") + _rel_glob("src/py/*.h") + ["setup.py"]

ext = Extension(
    "exreplay._core",
    sources=core_sources + py_sources,
    # Headers (and this file, which sets the flags) listed so that an
    # incremental build_ext rebuilds when only they changed.
    depends=headers,
    include_dirs=["src/core"],  # + numpy.get_include(), added in BuildExt
    define_macros=[
        # Keep these two in step with the numpy floor in pyproject.toml.
        ("NPY_NO_DEPRECATED_API", "NPY_1_21_API_VERSION"),
        ("NPY_TARGET_VERSION", "NPY_1_21_API_VERSION"),
    ],
    libraries=["z", "m"],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
)

setup(ext_modules=[ext], cmdclass={"build_ext": BuildExt})
