#!/usr/bin/env bash
# Runs every test: the C unit tests (plain, ASan+UBSan and TSan builds), a bounded
# libFuzzer run of the ring (MSGQ_FUZZ_SECONDS, default 45) and of VisionIPC's parsers
# (MSGQ_VIPC_FUZZ_SECONDS, default 10) and of the log scanner (MSGQ_LOG_FUZZ_SECONDS,
# default 10), and the pytest suite.
# Installs what it needs first. Extra arguments go to pytest (e.g. ./test.sh -k zmq).
#
# ./test.sh --quick: the tier to run after each change (a few minutes): the plain C unit
# tests, ruff, and the pytest tests not marked slow plus one per layer that only slow
# tests reach (-m "quick or not slow"; tests/conftest.py says how tests get marked).
# ./test.sh --pythons [NOX ARGS]: that pytest tier (and the tests marked pythons: Spark's
# data source) on Python 3.10, 3.11, 3.12 and 3.13, each from the sdist in a fresh
# environment (noxfile.py; -s quick-3.12: one of them; .ci/run runs quick-3.10).
#
# pytest runs in MSGQ_TEST_WORKERS processes (pytest-xdist, default 3: most tests wait on
# other processes — on two cores, three workers ran the suite in 649 s where two took
# 798-872 s; scripts/lib/pytest_workers.sh says how files are handed out).
# MSGQ_TEST_WORKERS=1 runs them in this process.
set -euo pipefail
cd "$(dirname "$0")"
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
if [ "${1:-}" = --pythons ]; then
  # Every Python requires-python claims (3.10-3.13): nox builds the sdist, installs it with
  # the test extra into a fresh environment of each and runs the quick tier's tests there
  # (noxfile.py). nox itself comes from the package index into build/nox-venv.
  shift
  if [ ! -x build/nox-venv/bin/nox ]; then
    echo "installing nox into build/nox-venv" >&2
    mkdir -p build
    python3 -m venv build/nox-venv
    build/nox-venv/bin/python -m pip install -q --disable-pip-version-check nox \
      > build/nox-venv.log 2>&1 || { tail -n 20 build/nox-venv.log >&2; exit 1; }
  fi
  exec build/nox-venv/bin/nox -f noxfile.py "$@"
fi
source scripts/ensure_env.sh test  # (the profile: else the sourced script would see our pytest arguments)
source scripts/lib/pytest_workers.sh
pytest_parallel_args

elapsed() { echo "   (${SECONDS} s so far)"; }
# scons builds (and runs the test programs) on every core
jobs="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
# scons_step NAME ARGS...: scons ARGS with its compiler lines and the test programs' output
# in a log named after the step (build/c-tests-plain.log, ...); prints the programs'
# totals, or the log's end when it fails.
scons_step() {
  local log="build/$1.log"
  shift
  mkdir -p build
  if ! .venv/bin/scons -Q -j "$jobs" "$@" > "$log" 2>&1; then
    tail -n 60 "$log"
    echo "failed: scons $* (full output: $log)" >&2
    exit 1
  fi
  awk -v logfile="$log" '
    match($0, /[0-9]+ passed, [0-9]+ failed/) {
      split(substr($0, RSTART, RLENGTH), n, " "); passed += n[1]; failed += n[3]; runs++ }
    END { if (runs) printf "   %d passed, %d failed in %d C test run(s) (output: %s)\n",
                           passed, failed, runs, logfile
          else printf "   built, no test program had to run again (output: %s)\n", logfile }
  ' "$log"
}
if [ "$quick" -eq 1 ]; then
  echo "== C unit tests (plain)"
  scons_step c-tests-plain test
  echo "== ruff"
  .venv/bin/ruff check msgq visionipc schemas tests
  elapsed
  echo "== pytest (quick tier: -m \"quick or not slow\")"
  exec .venv/bin/python -m pytest "${parallel[@]}" -m "quick or not slow" "$@"
fi
echo "== C unit tests (plain; the C benchmarks are built too, not run)"
scons_step c-tests-plain test bench
elapsed
echo "== C unit tests (ASan + UBSan)"
scons_step c-tests-asan test --sanitize=address
elapsed
echo "== C unit tests (ThreadSanitizer; suppressions: the payload byte copies only)"
scons_step c-tests-tsan test --sanitize=thread
elapsed
if command -v clang >/dev/null 2>&1; then
  echo "== libFuzzer builds"
  scons_step fuzz-build fuzz
  mkdir -p build/fuzz/corpus build/fuzz/corpus_visionipc build/fuzz/corpus_log_scan
  # The ring's fuzzer runs beside the two others (one core each); their reports follow
  # in order, each with its exit status kept.
  build/fuzz/fuzz_ring -max_total_time="${MSGQ_FUZZ_SECONDS:-45}" -print_final_stats=1 \
    -close_fd_mask=1 build/fuzz/corpus > build/fuzz/ring.out 2>&1 &
  ring_job=$!
  fuzz_status=0
  build/fuzz/fuzz_visionipc -max_total_time="${MSGQ_VIPC_FUZZ_SECONDS:-10}" \
    -print_final_stats=1 build/fuzz/corpus_visionipc > build/fuzz/visionipc.out 2>&1 \
    || fuzz_status=$?
  build/fuzz/fuzz_log_scan -max_total_time="${MSGQ_LOG_FUZZ_SECONDS:-10}" \
    -print_final_stats=1 build/fuzz/corpus_log_scan > build/fuzz/log_scan.out 2>&1 \
    || fuzz_status=$?
  wait "$ring_job" || fuzz_status=$?
  echo "== libFuzzer on the ring (${MSGQ_FUZZ_SECONDS:-45} s)"
  tail -n 12 build/fuzz/ring.out
  echo "== libFuzzer on VisionIPC's packet and handshake parsers (${MSGQ_VIPC_FUZZ_SECONDS:-10} s)"
  tail -n 6 build/fuzz/visionipc.out
  echo "== libFuzzer on the log scanner (${MSGQ_LOG_FUZZ_SECONDS:-10} s)"
  tail -n 6 build/fuzz/log_scan.out
  if [ "$fuzz_status" -ne 0 ]; then
    echo "a fuzzer found a failure (exit $fuzz_status; full output: build/fuzz/*.out)" >&2
    exit "$fuzz_status"
  fi
else
  echo "clang is missing (scripts/ensure_env.sh installs it as root): fuzzing skipped" >&2
  exit 1
fi
elapsed
echo "== ruff"
.venv/bin/ruff check msgq visionipc schemas tests
elapsed
echo "== pytest (${MSGQ_TEST_WORKERS:-3} worker(s); the 15 slowest tests are listed at the end)"
.venv/bin/python -m pytest "${parallel[@]}" --durations=15 "$@"
elapsed
