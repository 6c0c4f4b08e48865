#!/usr/bin/env bash
# run_lanes.sh MAKE LANE...: `make test`'s steps, in lanes that run side by side.
#
# Each LANE is a space-separated list of make targets, run in order (each
# timed); the lanes run at the same time, each with its output in
# build/test-logs/laneN.log (`tail -f` it to follow a lane). A lane stops at
# its first failing step. When every lane has ended, each log is printed in
# lane order, and the exit status is non-zero if any step failed.
#
# Why lanes: most steps use one core for most of their time (the pytest
# suite's thread tests, and its Ray tests waiting on other processes, are
# the exceptions), so two lanes on a 2-core machine take a little over half
# the time of one after the other (README, "make test").
set -uo pipefail

make_cmd=$1
shift
mkdir -p build/test-logs

pids=()
n=0
for lane in "$@"; do
  log=build/test-logs/lane$n.log
  echo "=== lane $n: $lane (output: $log)"
  (
    for step in $lane; do
      echo "=== make $step"
      s=$(date +%s)
      if ! $make_cmd --no-print-directory "$step"; then
        echo "=== make $step: FAILED after $(( $(date +%s) - s ))s"
        exit 1
      fi
      echo "=== make $step: ok in $(( $(date +%s) - s ))s"
    done
  ) >"$log" 2>&1 </dev/null &
  pids+=($!)
  n=$((n + 1))
done

status=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then
    echo "=== lane $i: ok"
  else
    echo "=== lane $i: FAILED"
    status=1
  fi
done
for i in "${!pids[@]}"; do
  echo "=================== lane $i output (build/test-logs/lane$i.log)"
  cat "build/test-logs/lane$i.log"
done
for i in "${!pids[@]}"; do
  grep -h '^=== make .*: \(ok in\|FAILED\)' "build/test-logs/lane$i.log" | sed "s/^/lane $i: /"
done
exit $status
