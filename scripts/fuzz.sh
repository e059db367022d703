#!/usr/bin/env bash
# Long coverage-guided fuzzing runs (atheris) of the parsers that read untrusted bytes:
# the VisionIPC handshake and frame packets, the log framing and segment reader, and the
# bridge wire format. Each harness (tests/fuzz/fuzz_<name>.py) runs for --seconds, from
# its seeds plus the corpus kept from earlier runs; a failing input is saved and the
# script exits 1.
#
#   scripts/fuzz.sh --seconds 600                 every harness, 10 minutes each
#   scripts/fuzz.sh --seconds 60 logs wire        two of them
#   MSGQ_FUZZ_DIR=/data/fuzz scripts/fuzz.sh ...  where corpora and crashes go
#                                                 (default /tmp/msgq-fuzz, kept between runs)
# Reproduce a crash: .venv/bin/python tests/fuzz/fuzz_<name>.py <crash file>
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60
harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --seconds=*) seconds="${1#*=}"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=(packet handshake wire logs)
fi
case "$seconds" in ''|*[!0-9]*) echo "--seconds takes a whole number" >&2; exit 2 ;; esac

source scripts/ensure_env.sh
dir="${MSGQ_FUZZ_DIR:-${TMPDIR:-/tmp}/msgq-fuzz}"
failed=0
for name in "${harnesses[@]}"; do
  script="tests/fuzz/fuzz_${name}.py"
  [ -f "$script" ] || { echo "no harness $script" >&2; exit 2; }
  corpus="$dir/$name/corpus"
  crashes="$dir/$name/crashes"
  mkdir -p "$corpus" "$crashes"
  .venv/bin/python "$script" --seeds-into "$corpus"
  echo "== fuzz_${name}: ${seconds} s (corpus $corpus)"
  if ! .venv/bin/python "$script" -max_total_time="$seconds" -timeout=20 \
      -rss_limit_mb=2048 -artifact_prefix="$crashes/" -print_final_stats=1 "$corpus"; then
    echo "fuzz_${name}: FAILED; the input is in $crashes/" >&2
    failed=1
  fi
done
exit "$failed"
