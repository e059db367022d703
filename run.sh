#!/usr/bin/env bash
# The main job on its embedded defaults. Installs what it needs first, and only that (a C
# compiler, Python headers, a Java runtime for Spark, msgq with the spark extra in .venv;
# one line per step; apt's output in build/setup.log, pip's and the build's in .venv/*.log).
# The demo starts before the spark extra is in, and waits for it at its Spark step.
#   ./run.sh                      the end-to-end demo: a simulated robot, health view,
#                                 recording, lockstep replay, Spark statistics (~30 s)
#   ./run.sh [demo] [ARGS]        the same, with demo options (see --help)
#   ./run.sh robot [ARGS]         the simulated robot alone, in the default namespace,
#                                 until Ctrl-C: msgq top / dump / record in another terminal
#   ./run.sh throughput [ARGS]    a publisher and subscribers at full speed
#   ./run.sh bench [ARGS]         the benchmark tables (msgq bench: core, visionipc, ...)
set -euo pipefail
cd "$(dirname "$0")"
job=demo
case "${1:-}" in
  demo|robot|throughput|bench) job="$1"; shift ;;
esac
# The demo needs pyspark only for its last step, the robot not at all: on a fresh machine
# they start while pyspark still installs (the demo waits for it there; the other jobs
# start after set-up).
case "$job" in demo|robot) export MSGQ_SETUP_DEFER_SPARK=1 ;; esac
source scripts/ensure_env.sh run
case "$job" in
  demo) exec .venv/bin/python -m msgq.demo "$@" ;;
  robot) exec .venv/bin/python -m msgq.demo.robot "$@" ;;
  throughput) exec .venv/bin/python -m msgq.demo.throughput "$@" ;;
  bench) exec .venv/bin/python -m msgq bench "$@" ;;
esac
