#!/usr/bin/env bash
# Installs exreplay into a fresh venv and runs the API, error, diagnostics
# and persistence tests from a directory outside the repository (so only the
# installed package can be imported).  Used by the Makefile targets
# pymatrix, numpy-oldest and dist-check.
#
#   .ci/outside_test.sh PYTHON WORKDIR INSTALL_ARGS... [-- PRE_INSTALL_ARGS...]
#
# PRE_INSTALL_ARGS go to a first `pip install` (e.g. an old numpy pinned for
# a --no-build-isolation build); INSTALL_ARGS install exreplay itself.
set -euo pipefail
py=$1 work=$2; shift 2
install=() pre=()
while (( $# )); do
  if [[ $1 == -- ]]; then shift; pre=("$@"); break; fi
  install+=("$1"); shift
done
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tests=${EXREPLAY_TESTS_DIR:-$repo/tests}
rm -rf "$work"; mkdir -p "$work"
work=$(cd "$work" && pwd)
"$py" -m venv "$work/venv"
vpy=$work/venv/bin/python
pipq=(-m pip install --quiet --disable-pip-version-check --progress-bar off)
"$vpy" "${pipq[@]}" --upgrade pip setuptools wheel
if (( ${#pre[@]} )); then "$vpy" "${pipq[@]}" "${pre[@]}"; fi
"$vpy" "${pipq[@]}" "${install[@]}" pytest hypothesis
# The tests, copied away from the checkout: neither the cwd nor pytest's
# rootdir can then put the repository's exreplay/ on sys.path.
mkdir -p "$work/run"
cp -R "$tests" "$work/run/tests"
cd "$work/run"
"$vpy" - <<'PY'
import sys, numpy, exreplay, exreplay._core as c
print("python", sys.version.split()[0], "numpy", numpy.__version__, "exreplay from", c.__file__)
assert "/venv/" in c.__file__, c.__file__
PY
"$vpy" -m pytest -q -p no:cacheprovider -m "not slow" \
  tests/test_api.py tests/test_errors.py tests/test_diagnostics.py tests/test_persistence.py
