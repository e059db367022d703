#!/usr/bin/env bash
# Flake check: the pytest suite twice in a row while a CPU hog keeps every core busy, so
# a test that passes only on a quiet machine shows up before it reaches CI.
#
#   scripts/flake-check.sh                 # the whole suite, twice, under load
#   scripts/flake-check.sh -k replay -x    # pytest arguments pass through
#   FLAKE_RUNS=3 FLAKE_HOGS=4 scripts/flake-check.sh
#   FLAKE_RUNS=1 FLAKE_REPEAT=200 scripts/flake-check.sh tests/test_sockets.py -k conflate
#   FLAKE_RUNS=1 FLAKE_REPEAT=200 FLAKE_CEREAL=CEREAL_DIR scripts/flake-check.sh \
#       -k test_receive_timeout           # one of cereal's tests, through cereal-tests.sh
#
# FLAKE_REPEAT=N runs every selected test N times in a row inside each run (the plugin
# scripts/lib/flake_repeat.py; the tests then run in one process). FLAKE_CEREAL=DIR runs
# cereal's messaging tests of the cereal checkout DIR (scripts/cereal-tests.sh; ZMQ=1
# selects the ZMQ backend there) instead of this repository's suite.
# The hog is one `yes >/dev/null` per core (FLAKE_HOGS), each under `timeout`
# (FLAKE_HOG_SECONDS, default 3 h) and stopped on exit, however the script ends.
# pytest runs as ./test.sh runs it: in MSGQ_TEST_WORKERS processes (default 3; 1: in one).
# Prints one line per run (passed, failed, errors, duration) and exits 1 if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${FLAKE_RUNS:-2}"
hogs="${FLAKE_HOGS:-$(nproc)}"
hog_seconds="${FLAKE_HOG_SECONDS:-10800}"
python=.venv/bin/python
if [ ! -x "$python" ]; then
  echo "flake-check: no .venv here: run ./test.sh once first (it builds the environment)" >&2
  exit 2
fi

source scripts/lib/pytest_workers.sh
repeat="${FLAKE_REPEAT:-1}"
if ! [[ "$repeat" =~ ^[1-9][0-9]*$ ]]; then
  echo "flake-check: FLAKE_REPEAT=$repeat is not a whole number >= 1" >&2
  exit 2
fi
cereal="${FLAKE_CEREAL:-}"
if [ "$repeat" -gt 1 ] || [ -n "$cereal" ]; then
  MSGQ_TEST_WORKERS=1  # repetitions run in a row in one process; cereal's in its own
fi
pytest_parallel_args
plugin=()
if [ "$repeat" -gt 1 ]; then
  export FLAKE_REPEAT="$repeat"
  export PYTHONPATH="$PWD/scripts/lib${PYTHONPATH:+:$PYTHONPATH}"
  plugin=(-p flake_repeat)
fi
if [ -n "$cereal" ]; then
  test_command=(scripts/cereal-tests.sh "$cereal" "${plugin[@]}")
else
  test_command=("$python" -m pytest -q -p no:cacheprovider "${parallel[@]}" "${plugin[@]}")
fi

hog_pids=()
test_pid=""
stop_all() {
  local pid
  for pid in $test_pid "${hog_pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in $test_pid "${hog_pids[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
  test_pid=""
  hog_pids=()
}
# pytest runs in the background and the script waits for it: a signal interrupts the
# wait at once (it would wait for a foreground command to end), and the exit trap stops
# pytest and the hogs
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP

for _ in $(seq "$hogs"); do
  timeout "$hog_seconds" yes >/dev/null &
  hog_pids+=("$!")
done
echo "flake-check: $runs run(s) of ${test_command[*]} $* (each test $repeat time(s)) with \
$hogs CPU hog(s) on $(nproc) core(s)"

logs="$(mktemp -d "${TMPDIR:-/tmp}/flake-check.XXXXXX")"
failed_runs=0
for run in $(seq "$runs"); do
  log="$logs/run$run.log"
  start=$(date +%s)
  code=0
  "${test_command[@]}" "$@" >"$log" 2>&1 </dev/null &
  test_pid=$!
  wait "$test_pid" || code=$?
  test_pid=""
  seconds=$(( $(date +%s) - start ))
  # pytest's summary: "2 failed, 929 passed, 1 error in 917.55s (0:15:17)" (with -q; in
  # "=" borders without it)
  last="$(grep -E '(passed|failed|error|no tests ran).* in [0-9.]+s' "$log" | tail -n 1 || true)"
  count() { sed -n "s/.* \([0-9][0-9]*\) $1.*/\1/p" <<<" $last" | head -n 1; }
  passed="$(count passed)"; failed="$(count failed)"; errors="$(count error)"
  summary="run $run: ${passed:-0} passed, ${failed:-0} failed, ${errors:-0} errors"
  summary+=", ${seconds} s, exit $code"
  if [ "$code" -ne 0 ]; then
    failed_runs=$((failed_runs + 1))
    summary+=" (log: $log)"
    grep -E '^(FAILED|ERROR) ' "$log" | head -n 20 || true
  fi
  echo "$summary"
done
stop_all
echo "flake-check: $failed_runs of $runs run(s) failed (logs in $logs)"
[ "$failed_runs" -eq 0 ]
