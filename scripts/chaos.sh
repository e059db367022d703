#!/usr/bin/env bash
# The chaos matrix (tests/chaos): processes SIGKILLed at random moments, queue files and
# logs damaged while in use. Runs every test under tests/chaos for a share of the time
# given and prints one table of trials and outcomes.
#
#   scripts/chaos.sh                 the short CI profile (each test's own budget)
#   scripts/chaos.sh --minutes 30    the long profile: 30 minutes over all chaos tests
#
# Tests read their budget in seconds from MSGQ_CHAOS_SECONDS and append their rows to
# the file named by MSGQ_CHAOS_REPORT (tests/chaos/conftest.py). Extra arguments go to
# pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=""
if [ "${1:-}" = "--minutes" ]; then
  minutes="${2:?--minutes needs a number}"
  shift 2
fi
source scripts/ensure_env.sh
if [ -n "$minutes" ]; then
  tests="$(.venv/bin/python -m pytest --collect-only -q tests/chaos "$@" 2>/dev/null | grep -c '::' || true)"
  [ "$tests" -gt 0 ] || tests=1
  export MSGQ_CHAOS_SECONDS="$(.venv/bin/python -c "print(max(5, $minutes * 60 / $tests))")"
  echo "chaos: $tests test(s), ${MSGQ_CHAOS_SECONDS} s each" >&2
fi
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
export MSGQ_CHAOS_REPORT="$report"
status=0
.venv/bin/python -m pytest -q -p no:cacheprovider -o addopts="" --timeout=0 tests/chaos "$@" || status=$?
.venv/bin/python - "$report" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
if not rows:
    print("no chaos results were reported")
    raise SystemExit(0)
width = max(len(r["test"]) for r in rows)
print()
print(f"{'trial':<{width}}  {'trials':>8}  outcomes")
print(f"{'-' * width}  {'-' * 8}  {'-' * 40}")
for r in rows:
    outcomes = ", ".join(f"{k}={v}" for k, v in r["outcomes"].items())
    print(f"{r['test']:<{width}}  {r['trials']:>8,}  {outcomes}")
PY
exit "$status"
