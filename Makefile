# exreplay — build, test and CI entry points (GNU make).
#
#   make test     warnings, build, then two lanes side by side (tests/run_lanes.sh): pytest and the
#                 benchmarks' smoke run; the C unit tests, TSan, fuzz smoke, allocfail, pytest under ASan+UBSan
#   make venv     create $(VENV) and install the package (editable) with the test, ray and rllib extras
#   make build    (re)build the extension in place (exreplay/_core*.so) for the venv
#   make ctest    C unit tests of src/core under ASan+UBSan (no Python)
#   make ctest-tsan  stress test of src/core from many pthreads under ThreadSanitizer
#   make pytest   pytest against the in-place build
#   make asan     pytest against an ASan+UBSan build of the extension
#   make warnings build once with -Werror (proves -Wall -Wextra is clean)
#   make fuzz     libFuzzer harnesses fuzz/fuzz_*.c under ASan+UBSan, FUZZ_TIME s each (docs/fuzzing.md)
#   make fuzz-smoke  the same for FUZZ_SMOKE_TIME s each (part of `make test`)
#   make allocfail   every public operation with its Nth allocation failing, for every N
#   make memcheck    a workload of the extension under valgrind's memcheck (needs valgrind;
#                    MEMCHECK_RUNS=N repeats it until a run fails)
#   make soak     the thread stress test's soak mode for SOAK_SECONDS (default an hour)
#   make tsan-soak   the ThreadSanitizer stress test for TSAN_SOAK_SECONDS under each of TSAN_SEEDS
#   make bench    the full benchmark suite (benchmarks/), then docs/benchmarks.md + docs/img/*.png
#   make bench-quick  every benchmark at a few small sizes: a smoke run of seconds (part of `make test`)
#   make bench-phases get_batch's phases (draw, plan, copy) per pick next to the floor, in C (benchmarks/c/)
#                     and two bounds: all of get_batch's output from records, the picks' starts given
#   make bench-draw   the prioritized sum-tree draw alone, ns per draw (benchmarks/c/draw.c)
#   make bench-pair   the Ape-X thread pair in C (no interpreter): one buffer shared, and two (benchmarks/c/pair.c;
#                     build/bench-pair ROUNDS SECONDS writers4: 4 writers + 1 learner, and the same
#                     writers on a second buffer); each round prints the machine's cross-core round
#                     trip and the learner's step by phase; build/bench-pair-timed (same arguments) is
#                     built with the core's timing.h counts: each side's time taking and holding the
#                     storage lock, the learner's draws without it and its set_priority calls by part
#   make build/ab-core build/ab-NAME.so  get_batch of two trees' cores in one process, paired (benchmarks/c/ab_core.c)
#   make demo     Ape-X DQN on CartPole on a local Ray cluster (python -m exreplay.examples.apex_cartpole),
#                 logging every experience (--log build/demo-log), then the merged log's info and tail
#   make fuzz-log a long mutation fuzz of the experience log reader (tests/test_fuzz_log.py)
#   make demo-paper  the paper's record/get_batch timings against the pure-Python buffer (python -m exreplay.demo)
#   make bench-rllib  RLlib's DQN on CartPole with exreplay's and RLlib's buffers, and the replay calls alone
#   make pymatrix     build + API/error/persistence tests on CPython 3.10, 3.12 and 3.13 (pyenv)
#   make numpy-oldest build against the oldest supported NumPy (1.x headers) and test
#   make dist-check   python -m build: wheel + sdist, each installed in a fresh venv and tested from outside
#   make clean | distclean

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test
.DELETE_ON_ERROR:

PY   ?= python3
VENV ?= .venv
# make predefines CC=cc; the C tests and the libasan lookup want gcc.
CTEST_CC ?= gcc
CTEST_CFLAGS ?= -std=c11 -O1 -g -Wall -Wextra -Werror -pthread -DEXR_DEBUG_LOCKS \
                -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer \
                -fno-sanitize-recover=undefined,float-cast-overflow
# Extra pytest arguments for the ASan run (it is several times slower). The
# RLlib adapter is Python over the buffer (which every other test drives
# under ASan); importing torch and RLlib into the sanitized process is slow
# and loads many libraries with thread-local storage, the trigger of the
# sanitizer runtime's exit-time crash that `intercept_tls_get_addr=0` below
# avoids (docs/fuzzing.md, "Leak checking"), so those tests run in
# `make pytest` only.
ASAN_PYTEST_ARGS ?= -m "not slow" --ignore=tests/test_rllib.py

VPY     := $(VENV)/bin/python
# The stamp's name changes when the extras installed with the venv change.
STAMP   := $(VENV)/.exreplay-installed-test-ray-rllib
ASANPKG := build/asan-pkg

CORE_SRC := $(sort $(wildcard src/core/*.c))
CORE_HDR := $(wildcard src/core/*.h)
# One C test program per tests/c/test_*.c (each links the whole core, compiled
# once into build/ctest-obj/ with the tests' sanitizer flags).
CTESTS := $(patsubst tests/c/%.c,build/%,$(sort $(wildcard tests/c/test_*.c)))
CTEST_OBJ := $(patsubst src/core/%.c,build/ctest-obj/%.o,$(CORE_SRC))
.SECONDARY: $(CTEST_OBJ)

export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1

.PHONY: test venv build warnings ctest ctest-tsan pytest asan demo demo-paper bench bench-quick bench-deps clean distclean zlib fuzz-log
.PHONY: bench-rllib pymatrix numpy-oldest dist-check bench-phases bench-draw bench-pair tsan-soak
.PHONY: fuzz fuzz-smoke allocfail soak memcheck

# --- environment ------------------------------------------------------------

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py
	@test -x $(VPY) || { echo "creating $(VENV) with $(PY)"; $(PY) -m venv $(VENV); }
	@$(MAKE) --no-print-directory zlib
	$(VPY) -m pip install --quiet --disable-pip-version-check --upgrade pip setuptools wheel
	$(VPY) -m pip install --disable-pip-version-check --progress-bar off -e '.[test,ray,rllib]'
	@touch $@

# zlib headers: needed by setup.py and by the C tests.
zlib:
	@if echo '#include <zlib.h>' | $(CTEST_CC) -E -x c - >/dev/null 2>&1; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "zlib.h not found: installing zlib1g-dev"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get update -q && apt-get install -y -q zlib1g-dev </dev/null; \
	else \
	  echo "zlib headers not found: on Debian/Ubuntu run \`apt-get install zlib1g-dev\` (as root)" >&2; \
	  exit 1; \
	fi

# --- builds -----------------------------------------------------------------
# setup.py lists every header and itself as dependencies, so these are
# incremental: build_ext skips an extension that is newer than all of them.

# In place: exreplay/_core*.so next to the .py files, which the editable
# install (and `python -m pytest` run from the repo root) imports.
build: venv
	$(VPY) setup.py --quiet build_ext --inplace

warnings: venv
	EXREPLAY_WERROR=1 $(VPY) setup.py --quiet build_ext \
	  --build-lib build/werror --build-temp build/werror-tmp

# --- tests ------------------------------------------------------------------

build/ctest-obj/%.o: src/core/%.c $(CORE_HDR) | zlib
	@mkdir -p build/ctest-obj
	$(CTEST_CC) $(CTEST_CFLAGS) -Isrc/core -c -o $@ $<

build/test_%: tests/c/test_%.c $(wildcard tests/c/*.h) $(CTEST_OBJ) $(CORE_HDR) | zlib
	@mkdir -p build
	$(CTEST_CC) $(CTEST_CFLAGS) -Isrc/core -o $@ $< $(CTEST_OBJ) -lz -lm

ctest: $(CTESTS)
	@for t in $(CTESTS); do echo "== $$t"; ./$$t; done

# The core from many pthreads at once under ThreadSanitizer (tests/c/test_stress.c;
# `make ctest` also runs it under ASan+UBSan): a short run here;
# STRESS_SECONDS=60 ./build/tsan/test_stress for a soak.
STRESS_SECONDS ?= 3
build/tsan/test_stress: tests/c/test_stress.c $(CORE_SRC) $(CORE_HDR) | zlib
	@mkdir -p build/tsan
	$(CTEST_CC) -std=c11 -O1 -g -Wall -Wextra -Werror -pthread -fsanitize=thread -DEXR_DEBUG_LOCKS \
	  -Isrc/core -o $@ tests/c/test_stress.c $(CORE_SRC) -lz -lm

ctest-tsan: build/tsan/test_stress
	TSAN_OPTIONS=halt_on_error=1:exitcode=66 STRESS_SECONDS=$(STRESS_SECONDS) ./build/tsan/test_stress

# Its soak: TSAN_SOAK_SECONDS under each seed of TSAN_SEEDS in turn (each
# seed gives every thread and the buffer other random streams).
TSAN_SOAK_SECONDS ?= 300
TSAN_SEEDS ?= 1 2 3
tsan-soak: build/tsan/test_stress
	@for s in $(TSAN_SEEDS); do \
	  TSAN_OPTIONS=halt_on_error=1:exitcode=66 STRESS_SEED=$$s STRESS_SECONDS=$(TSAN_SOAK_SECONDS) \
	    ./build/tsan/test_stress || exit 1; \
	done

pytest: build
	$(VPY) -m pytest -q tests

# The ASan run imports the package from $(ASANPKG): a copy of exreplay/*.py
# (+ stubs) with the sanitized _core*.so, next to a copy of tests/ and
# pyproject.toml, run from there so that neither the cwd on sys.path nor
# pytest's rootdir insertion can pick up the in-place build.
# .ci/asan_plugin.py aborts the run unless exreplay._core is the ASan .so.
asan: venv | zlib
	EXREPLAY_SANITIZE=1 $(VPY) setup.py --quiet build_ext \
	  --build-lib build/asan --build-temp build/asan-tmp
	rm -rf $(ASANPKG)
	mkdir -p $(ASANPKG)
	cp -R exreplay tests pyproject.toml .ci/asan_plugin.py $(ASANPKG)/
	find $(ASANPKG) \( -name '*.so' -o -name __pycache__ \) -prune -exec rm -rf {} +
	@so=exreplay/_core$$($(VPY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))'); \
	 cp "build/asan/$$so" "$(ASANPKG)/$$so"; \
	 if nm -D "$(ASANPKG)/$$so" | grep ' U __asan_init' >/dev/null; then echo "ASan build: $(ASANPKG)/$$so"; \
	 else echo "error: $(ASANPKG)/$$so is not an ASan build (no __asan_init)" >&2; exit 1; fi
	cd $(ASANPKG) && \
	  so=$$(realpath exreplay/_core*.so) && \
	  libasan=$$($(CTEST_CC) -print-file-name=libasan.so) && \
	  echo "LD_PRELOAD=$$libasan" && \
	  env LD_PRELOAD="$$libasan" \
	      ASAN_OPTIONS=detect_leaks=1:malloc_context_size=2:allocator_may_return_null=1:intercept_tls_get_addr=0 \
	      LSAN_OPTIONS=suppressions=$(abspath .ci/lsan.supp):print_suppressions=0 \
	      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	      PYTHONMALLOC=malloc \
	      PYTHONPATH="$$PWD" \
	      EXREPLAY_ASAN=1 EXREPLAY_ASAN_CORE="$$so" \
	      $(abspath $(VPY)) -m pytest -q -p no:cacheprovider -p asan_plugin $(ASAN_PYTEST_ARGS) tests

# Each step in order, timed; any failure stops the run with a non-zero exit.
# The first steps in order, then two lanes side by side (tests/run_lanes.sh):
# each lane's steps in order, its output in build/test-logs/.
TEST_FIRST := warnings build bench-deps
TEST_LANE0 := pytest bench-quick
TEST_LANE1 := ctest ctest-tsan fuzz-smoke allocfail asan
test: venv
	@for step in $(TEST_FIRST); do \
	  echo "=== make $$step"; s=$$(date +%s); \
	  $(MAKE) --no-print-directory $$step; \
	  echo "=== make $$step: ok in $$(( $$(date +%s) - s ))s"; \
	done
	@s=$$(date +%s); tests/run_lanes.sh "$(MAKE)" "$(TEST_LANE0)" "$(TEST_LANE1)"; \
	  st=$$?; echo "=== lanes: $$(( $$(date +%s) - s ))s"; exit $$st

# Coverage-guided fuzzing (clang's libFuzzer; fuzz/run.sh installs clang as
# root if it is missing). Each fuzz/fuzz_NAME.c is one harness, seeded from
# fuzz/seeds/NAME/.
FUZZ_TIME ?= 600
FUZZ_SMOKE_TIME ?= 20
fuzz: | zlib
	fuzz/run.sh $(FUZZ_TIME)

fuzz-smoke: | zlib
	fuzz/run.sh $(FUZZ_SMOKE_TIME)

# Allocation-failure testing (tests/test_allocfail.py): a build of the
# extension whose malloc family fails on the Nth call, for every N.
allocfail: venv | zlib
	so=$$($(VPY) tests/allocfail/build.py | tail -1) && \
	  EXREPLAY_ALLOCFAIL_SO="$$so" $(VPY) -m pytest -q -p no:cacheprovider tests/test_allocfail.py

# Valgrind's memcheck over a workload of the extension (tests/memcheck.py):
# fails on an error with a frame in exreplay's _core (reads of memory never
# written, which ASan does not see). Needs valgrind (Debian: apt-get install
# valgrind); about 15 s.
MEMCHECK_RUNS ?= 1
memcheck: build
	@command -v valgrind >/dev/null || { echo "memcheck: valgrind not found (Debian: apt-get install valgrind)"; exit 2; }
	$(VPY) tests/memcheck.py $(MEMCHECK_RUNS)

# The thread stress test's soak mode (tests/test_threads.py::test_soak).
SOAK_SECONDS ?= 3600
soak: build
	EXREPLAY_SOAK_SECONDS=$(SOAK_SECONDS) $(VPY) -m pytest -q -s -p no:cacheprovider tests/test_threads.py -k soak

# --- other ------------------------------------------------------------------

# Ape-X DQN (exreplay/examples/apex_cartpole.py) on a local Ray cluster of 2
# CPUs: stops at mean greedy return >= 475 over 20 episodes (3-40 s of
# training here, plus a few seconds of Ray start-up) or after 5 minutes.
DEMO_ARGS ?=
DEMO_LOG  ?= build/demo-log
demo: build
	$(VPY) -m exreplay.examples.apex_cartpole --log $(DEMO_LOG) $(DEMO_ARGS)
	$(VPY) -m exreplay.log info $(DEMO_LOG)/merged.xlog
	$(VPY) -m exreplay.log tail -n 3 $(DEMO_LOG)/merged.xlog

LOG_FUZZ_INPUTS ?= 200000
fuzz-log: build
	EXREPLAY_LOG_FUZZ_INPUTS=$(LOG_FUZZ_INPUTS) $(VPY) -m pytest -q tests/test_fuzz_log.py

demo-paper: build
	$(VPY) -m exreplay.demo

# The benchmarks need the `bench` extra (pytest-benchmark, cpprb, matplotlib).
BENCH_STAMP  := $(VENV)/.exreplay-bench-installed
BENCH_JSON   ?= benchmarks/results/full.json
QUICK_DIR    := build/bench-quick
BENCH_PYTEST := $(VPY) -m pytest -q -p no:cacheprovider benchmarks --benchmark-columns=median,iqr,rounds --benchmark-sort=name

bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(VPY) -m pip install --disable-pip-version-check --progress-bar off -e '.[test,bench]'
	@touch $@

# The persistence and Ray files of the suite also write results of their own:
# persistence.json (where EXREPLAY_BENCH_PERSISTENCE_JSON says) and, at fixed
# paths, ray.json + benchmarks_ray.md (full: benchmarks/results/ + docs/; quick:
# build/bench-quick/).  report.py takes the suite's JSON first (the same
# records are in it) and these files where the JSON has none.
BENCH_PERSIST := $(dir $(BENCH_JSON))persistence.json
BENCH_RAY     := benchmarks/results/ray.json
BENCH_RAY_MD  := docs/benchmarks_ray.md

# Full suite, every file in full mode (~10-20 min here, most of it the 2 GB saves,
# zlib level 1 and Ape-X to the goal): results JSON, then ONE docs/benchmarks.md
# (with the persistence and Ray sections) and the plots from it.
bench: build bench-deps
	@mkdir -p $(dir $(BENCH_JSON))
	EXREPLAY_BENCH_TARGET="make bench" EXREPLAY_BENCH_PERSISTENCE_JSON=$(BENCH_PERSIST) \
		$(BENCH_PYTEST) --benchmark-json=$(BENCH_JSON)
	MPLBACKEND=Agg $(VPY) benchmarks/report.py $(BENCH_JSON) \
		--persistence $(BENCH_PERSIST) --ray $(BENCH_RAY) --ray-md $(BENCH_RAY_MD)

# Smoke run (seconds): every benchmark runs; nothing asserts on a time.  Its
# report goes to build/, never over docs/.  Side files of an earlier quick run
# are removed first, so the report shows only this run.
bench-quick: build bench-deps
	@mkdir -p $(QUICK_DIR)
	@rm -f $(QUICK_DIR)/persistence.json $(QUICK_DIR)/ray.json $(QUICK_DIR)/benchmarks_ray.md
	EXREPLAY_BENCH_TARGET="make bench-quick" EXREPLAY_BENCH_PERSISTENCE_JSON=$(QUICK_DIR)/persistence.json \
		$(BENCH_PYTEST) --bench-quick --benchmark-json=$(QUICK_DIR)/quick.json
	MPLBACKEND=Agg $(VPY) benchmarks/report.py $(QUICK_DIR)/quick.json --md $(QUICK_DIR)/benchmarks.md \
		--persistence $(QUICK_DIR)/persistence.json --ray $(QUICK_DIR)/ray.json --ray-md $(QUICK_DIR)/benchmarks_ray.md

# get_batch's time by phase (benchmarks/c/phases.c, linked against src/core
# with the release build's flags): PHASES_REPS repetitions of each case.
PHASES_REPS ?= 31
build/bench-phases: benchmarks/c/phases.c benchmarks/c/batch_out.h $(CORE_SRC) $(CORE_HDR) | zlib
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O3 -flto=auto -Wall -Wextra -Werror -pthread -Isrc/core -o $@ $< $(CORE_SRC) -lz -lm

bench-phases: build/bench-phases
	./build/bench-phases $(PHASES_REPS)

# The prioritized draw alone (benchmarks/c/draw.c): exr_sumtree_sample at N = 1M and 10k.
build/bench-draw: benchmarks/c/draw.c $(CORE_SRC) $(CORE_HDR) | zlib
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O3 -flto=auto -Wall -Wextra -Werror -pthread -Isrc/core -o $@ $< $(CORE_SRC) -lz -lm

bench-draw: build/bench-draw
	./build/bench-draw 1000000 2000 15
	./build/bench-draw 10000 2000 15

# The suite's Ape-X writer and learner as pthreads calling the core
# (benchmarks/c/pair.c): each alone, on one buffer, and on two buffers.
PAIR_ROUNDS ?= 7
PAIR_SECONDS ?= 1.0
build/bench-pair: benchmarks/c/pair.c benchmarks/c/batch_out.h $(CORE_SRC) $(CORE_HDR) | zlib
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O3 -flto=auto -Wall -Wextra -Werror -pthread -Isrc/core -o $@ $< $(CORE_SRC) -lz -lm

bench-pair: build/bench-pair
	./build/bench-pair $(PAIR_ROUNDS) $(PAIR_SECONDS)

# the same with the core's timing.h counts: where each thread's time goes
# around the storage lock, and the learner's draws without it and its set_priority calls by part
build/bench-pair-timed: benchmarks/c/pair.c benchmarks/c/batch_out.h $(CORE_SRC) $(CORE_HDR) | zlib
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O3 -flto=auto -Wall -Wextra -Werror -pthread -DEXR_TIMING -Isrc/core -o $@ $< $(CORE_SRC) -lz -lm

# get_batch of two trees' cores in one process (benchmarks/c/ab_core.c):
#   make build/ab-base.so AB_TREE=/path/to/base/tree; make build/ab-after.so build/ab-core
#   build/ab-core build/ab-base.so build/ab-after.so N B REPS [KIND]
# build/ab-NAME.so is the core of AB_TREE (default: this tree), rebuilt every time.
AB_TREE ?= .
build/ab-%.so: benchmarks/c/ab_core.c benchmarks/c/batch_out.h FORCE | zlib
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O3 -flto=auto -fPIC -shared -DAB_CORE_LIB -Wall -Wextra -Werror -pthread \
	  -I$(AB_TREE)/src/core -o $@ $< $(sort $(wildcard $(AB_TREE)/src/core/*.c)) -lz -lm

FORCE:
.PHONY: FORCE

build/ab-core: benchmarks/c/ab_core.c
	@mkdir -p build
	$(CTEST_CC) -std=c11 -O2 -Wall -Wextra -Werror -o $@ $< -ldl

# RLlib: docs/benchmarks.md section "RLlib" (via report.py) from benchmarks/results/rllib.json.
BENCH_RLLIB_ARGS ?=
bench-rllib: build
	$(VPY) benchmarks/rllib_dqn.py $(BENCH_RLLIB_ARGS)
	@if [ -f $(BENCH_JSON) ]; then MPLBACKEND=Agg $(VPY) benchmarks/report.py $(BENCH_JSON) \
		--persistence $(BENCH_PERSIST) --ray $(BENCH_RAY) --ray-md $(BENCH_RAY_MD); fi

# --- other Pythons, the oldest NumPy, the packages ---------------------------
# Each installs exreplay (not editable) into a fresh venv under build/ and runs
# the API, error, diagnostics and persistence tests from outside the checkout.
PYENV_ROOT ?= /root/.pyenv
MATRIX     ?= 3.10 3.12 3.13
pymatrix: | zlib
	@for v in $(MATRIX); do \
	  py=$$(ls -d $(PYENV_ROOT)/versions/$$v.*/bin/python3 2>/dev/null | sort -V | tail -n 1); \
	  if [ -z "$$py" ]; then echo "python $$v not found under $(PYENV_ROOT)/versions" >&2; exit 1; fi; \
	  echo "=== python $$v: $$py"; \
	  .ci/outside_test.sh "$$py" build/py$$v "$$PWD"; \
	done

# The oldest NumPy tested: 1.24.4, built against with --no-build-isolation
# (1.x headers).  1.23 builds and imports too, but there a ragged list becomes
# an object array (NumPy's deprecation period), so `state=[[1, 2], [3]]` is a
# TypeError ("got object") rather than the ValueError the tests expect.
NUMPY_OLDEST ?= 1.24.4
numpy-oldest: | zlib
	.ci/outside_test.sh $(PY) build/numpy-oldest --no-build-isolation "$$PWD" -- "numpy==$(NUMPY_OLDEST)"

# python -m build makes the wheel and the sdist; the sdist's own tests/ are
# the ones run, against the wheel and then against the sdist installed.
dist-check: venv | zlib
	$(VPY) -m pip install --quiet --disable-pip-version-check build
	rm -rf build/dist && $(VPY) -m build --outdir build/dist . >/dev/null
	@ls build/dist
	rm -rf build/sdist-src && mkdir -p build/sdist-src && tar -xzf build/dist/exreplay-*.tar.gz -C build/sdist-src
	@test -f build/sdist-src/exreplay-*/LICENSE && test -f build/sdist-src/exreplay-*/tests/conftest.py && \
	  test -f build/sdist-src/exreplay-*/docs/api.md || { echo "sdist lacks LICENSE, tests or docs" >&2; exit 1; }
	EXREPLAY_TESTS_DIR=$$(ls -d $$PWD/build/sdist-src/exreplay-*)/tests \
	  .ci/outside_test.sh $(PY) build/dist-wheel "$$(ls $$PWD/build/dist/*.whl)"
	EXREPLAY_TESTS_DIR=$$(ls -d $$PWD/build/sdist-src/exreplay-*)/tests \
	  .ci/outside_test.sh $(PY) build/dist-sdist "$$(ls $$PWD/build/dist/*.tar.gz)"

clean:
	rm -rf build dist *.egg-info exreplay/_core*.so .pytest_cache .hypothesis .benchmarks
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
