#!/usr/bin/env bash
# The main job on its embedded defaults. Installs what it needs first.
#   ./run.sh                      the end-to-end demo: a simulated robot, health view,
#                                 recording, lockstep replay, Spark statistics (~45 s)
#   ./run.sh [demo] [ARGS]        the same, with demo options (see --help)
#   ./run.sh throughput [ARGS]    a publisher and subscribers at full speed
#   ./run.sh bench [ARGS]         the benchmark tables (msgq bench: core, visionipc, ...)
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
job=demo
case "${1:-}" in
  demo|throughput|bench) job="$1"; shift ;;
esac
case "$job" in
  demo) exec .venv/bin/python -m msgq.demo "$@" ;;
  throughput) exec .venv/bin/python -m msgq.demo.throughput "$@" ;;
  bench) exec .venv/bin/python -m msgq bench "$@" ;;
esac
