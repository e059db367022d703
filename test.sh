#!/usr/bin/env bash
# Runs every test: the C unit tests (plain, ASan+UBSan and TSan builds), a bounded
# libFuzzer run of the ring (MSGQ_FUZZ_SECONDS, default 45) and of VisionIPC's parsers
# (MSGQ_VIPC_FUZZ_SECONDS, default 10), and the pytest suite.
# Installs what it needs first. Extra arguments go to pytest (e.g. ./test.sh -k zmq).
#
# ./test.sh --quick: the tier to run after each change (a few minutes): the plain C unit
# tests, ruff, and the pytest tests not marked slow plus one per layer that only slow
# tests reach (-m "quick or not slow"; tests/conftest.py says how tests get marked).
set -euo pipefail
cd "$(dirname "$0")"
quick=0
if [ "${1:-}" = --quick ]; then
  quick=1
  shift
fi
source scripts/ensure_env.sh test  # (the profile: else the sourced script would see our pytest arguments)
if [ "$quick" -eq 1 ]; then
  echo "== C unit tests (plain)"
  .venv/bin/scons -Q test
  echo "== ruff"
  .venv/bin/ruff check msgq visionipc schemas tests
  echo "== pytest (quick tier: -m \"quick or not slow\")"
  exec .venv/bin/python -m pytest -m "quick or not slow" "$@"
fi
echo "== C unit tests (plain; the C benchmarks are built too, not run)"
.venv/bin/scons -Q test bench
echo "== C unit tests (ASan + UBSan)"
.venv/bin/scons -Q test --sanitize=address
echo "== C unit tests (ThreadSanitizer; suppressions: the payload byte copies only)"
.venv/bin/scons -Q test --sanitize=thread
echo "== libFuzzer on the ring (${MSGQ_FUZZ_SECONDS:-45} s)"
if command -v clang >/dev/null 2>&1; then
  .venv/bin/scons -Q fuzz
  mkdir -p build/fuzz/corpus
  build/fuzz/fuzz_ring -max_total_time="${MSGQ_FUZZ_SECONDS:-45}" -print_final_stats=1 \
    -close_fd_mask=1 build/fuzz/corpus 2>&1 | tail -n 12
  echo "== libFuzzer on VisionIPC's packet and handshake parsers (${MSGQ_VIPC_FUZZ_SECONDS:-10} s)"
  mkdir -p build/fuzz/corpus_visionipc
  build/fuzz/fuzz_visionipc -max_total_time="${MSGQ_VIPC_FUZZ_SECONDS:-10}" \
    -print_final_stats=1 build/fuzz/corpus_visionipc 2>&1 | tail -n 6
else
  echo "clang is missing (scripts/ensure_env.sh installs it as root): fuzzing skipped" >&2
  exit 1
fi
echo "== ruff"
.venv/bin/ruff check msgq visionipc schemas tests
echo "== pytest"
.venv/bin/python -m pytest "$@"
