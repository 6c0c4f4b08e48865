#!/usr/bin/env bash
# fuzz/run.sh - builds and runs the libFuzzer harnesses (docs/fuzzing.md).
#
#   fuzz/run.sh SECONDS            every harness fuzz/fuzz_NAME.c, SECONDS each
#   fuzz/run.sh SECONDS NAME...    only those
#   fuzz/run.sh --coverage NAME [CORPUS]
#                                  line/region coverage of src/core by a corpus
#                                  (default: NAME's working corpus), from a
#                                  separate build with clang's source coverage
#
# A harness is one file, fuzz/fuzz_NAME.c, defining LLVMFuzzerTestOneInput
# over the core (src/core/*.c, no Python). Its committed seed corpus is
# fuzz/seeds/NAME/; the corpus the fuzzer grows lives in build/fuzz/corpus/NAME
# (seeded from fuzz/seeds/NAME on every run), crashes go to
# build/fuzz/artifacts/NAME/. Adding a reader = adding fuzz/fuzz_NAME.c and
# fuzz/seeds/NAME/.
#
# Built with ASan + UBSan (+ float-cast-overflow), leak checking on. Any
# crash, leak, sanitizer report, timeout (-timeout=10 s an input) or
# out-of-memory (-rss_limit_mb=2048) makes the run fail.
#
# Environment: FUZZ_CC (clang), FUZZ_MAX_LEN (16384),
# FUZZ_ARGS (extra libFuzzer flags, e.g. -runs=10000000).
set -euo pipefail
cd "$(dirname "$0")/.."

CC=${FUZZ_CC:-clang}
OUT=build/fuzz
SAN="-fsanitize=fuzzer,address,undefined,float-cast-overflow -fno-sanitize-recover=undefined,float-cast-overflow"
CFLAGS="-std=c11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Werror -pthread -Isrc/core"

need_clang() {
    if command -v "$CC" >/dev/null 2>&1 &&
       echo 'int LLVMFuzzerTestOneInput(const char *d, long n){(void)d;(void)n;return 0;}' |
       "$CC" -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null; then
        return 0
    fi
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "clang with libFuzzer not found: installing clang and libclang-rt-dev"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q && apt-get install -y -q clang </dev/null
        # the runtime package is versioned (libclang-rt-14-dev on Debian 12)
        v=$(clang --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
        apt-get install -y -q "libclang-rt-$v-dev" </dev/null || true
        return 0
    fi
    echo "error: clang with libFuzzer is needed (Debian: apt-get install clang libclang-rt-14-dev)" >&2
    exit 1
}

# The core's objects, compiled once per set of flags (into $OUT/obj-TAG/) and
# shared by every harness: each .c again only when it or a header is newer.
core_objs() { # tag [flags...]
    local dir=$OUT/obj-$1 c o; shift
    mkdir -p "$dir"
    for c in src/core/*.c; do
        o=$dir/$(basename "${c%.c}").o
        if [ ! -f "$o" ] || [ -n "$(find "$c" src/core/*.h -newer "$o" -print -quit)" ]; then
            # shellcheck disable=SC2086
            "$CC" $CFLAGS "$@" -c -o "$o" "$c" || { rm -f "$o"; return 1; }
        fi
        echo "$o"
    done
}

build() { # name binary tag [flags...]
    local name=$1 bin=$2 tag=$3; shift 3
    mkdir -p "$OUT"
    local objs
    core_objs "$tag" "$@" >"$OUT/objs-$tag.list" || exit 1
    mapfile -t objs <"$OUT/objs-$tag.list"
    if [ ! -x "$bin" ] || [ -n "$(find fuzz/fuzz_"$name".c "${objs[@]}" -newer "$bin" -print -quit)" ]; then
        echo "building $bin" >&2
        # shellcheck disable=SC2086
        "$CC" $CFLAGS "$@" -o "$bin" fuzz/fuzz_"$name".c "${objs[@]}" -lz -lm || exit 1
    fi
    echo "$bin"
}

need_clang

if [ "${1:-}" = "--coverage" ]; then
    name=${2:?usage: fuzz/run.sh --coverage NAME}
    bin=$(build "$name" "$OUT/fuzz_$name-cov" cov -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping)
    corpus=${3:-$OUT/corpus/$name}
    [ -d "$corpus" ] || corpus="fuzz/seeds/$name"
    rm -f "$OUT/cov-$name".prof*
    LLVM_PROFILE_FILE="$OUT/cov-$name.profraw" "$bin" -runs=0 -max_len=1048576 "$corpus" "fuzz/seeds/$name" >/dev/null 2>&1
    llvm-profdata merge -sparse "$OUT/cov-$name.profraw" -o "$OUT/cov-$name.profdata"
    llvm-cov report "$bin" -instr-profile="$OUT/cov-$name.profdata" src/core/*.c
    exit 0
fi

secs=${1:?usage: fuzz/run.sh SECONDS [NAME...]}
shift
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do n=${f#fuzz/fuzz_}; names+=("${n%.c}"); done
fi
status=0
for name in "${names[@]}"; do
    bin=$(build "$name" "$OUT/fuzz_$name" san $SAN)
    corpus="$OUT/corpus/$name"
    art="$OUT/artifacts/$name"
    mkdir -p "$corpus" "$art"
    echo "fuzzing $name for ${secs}s (corpus $corpus, seeds fuzz/seeds/$name)"
    # shellcheck disable=SC2086
    if ! ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
         UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
         nice -n 5 "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 \
            -max_len="${FUZZ_MAX_LEN:-16384}" \
            -print_final_stats=1 -artifact_prefix="$art/" ${FUZZ_ARGS:-} \
            "$corpus" "fuzz/seeds/$name" 2>&1 | tee "$OUT/$name.log" | grep -E "^(#[0-9]+ +(INITED|DONE|pulse))|stat::|ERROR|SUMMARY|==[0-9]+==" ; then
        :
    fi
    if grep -qE "ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)|runtime error|SUMMARY: " "$OUT/$name.log"; then
        echo "error: fuzz_$name found a problem: see $OUT/$name.log and $art/" >&2
        status=1
    elif ! grep -q "^Done [0-9]* runs" "$OUT/$name.log"; then
        echo "error: fuzz_$name did not finish: see $OUT/$name.log" >&2
        status=1
    fi
done
exit $status
