#!/usr/bin/env bash
# The main job on its embedded defaults. Installs what it needs first.
#   ./run.sh                 the demo: publisher + subscribers in separate processes
#   ./run.sh [demo] [ARGS]   the same, with demo options (see --help)
#   ./run.sh bench [ARGS]    the benchmark table (python -m msgq.bench)
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
job=demo
case "${1:-}" in
  demo|bench) job="$1"; shift ;;
esac
case "$job" in
  demo) exec .venv/bin/python -m msgq.demo "$@" ;;
  bench) exec .venv/bin/python -m msgq.bench "$@" ;;
  *) echo "usage: ./run.sh [demo|bench] [ARGS...]" >&2; exit 2 ;;
esac
