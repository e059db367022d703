#!/usr/bin/env bash
# SubMaster's CPU per tick against cereal's own SubMaster over upstream msgq (issue 31):
# the row "SubMaster CPU per tick vs cereal over upstream msgq" of `msgq bench messaging`.
#
#   scripts/cereal-bench.sh CEREAL_DIR [BENCH_ARGS...]    e.g. --rounds 5 --seconds 8
#
# CEREAL_DIR is a cereal checkout (commaai/cereal, or openpilot's cereal folder: log.capnp,
# services.py, messaging/). Nothing of it is copied: both sides run the checkout's schema
# where it lies — ours through msgq.compat.cereal with this checkout's .venv (or $PYTHON),
# cereal's from a folder of links to the checkout's files in which messaging_pyx (the part
# cereal builds with scons) is upstream msgq's compiled module. Upstream msgq comes from
# the package index (msgq-ipc) with pycapnp, in its own environment, made once:
# $MSGQ_CEREAL_BENCH_VENV, default ~/.cache/msgq/cereal-bench-venv.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/lib/checkout.sh"
cereal="$(checkout_dir "usage: $0 CEREAL_DIR [BENCH_ARGS...]  (a cereal checkout: log.capnp,\
 services.py, messaging/)" "${1:-}" log.capnp services.py messaging/__init__.py)"
shift
use_project_python
venv="${MSGQ_CEREAL_BENCH_VENV:-$HOME/.cache/msgq/cereal-bench-venv}"
if ! "$venv/bin/python" -I -c "import msgq.ipc_pyx, capnp" 2>/dev/null; then
  echo "making cereal's environment in $venv (msgq-ipc, pycapnp)" >&2
  base="$("$python" -c 'import sys; print(sys._base_executable)')"
  "$base" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check msgq-ipc pycapnp
fi
# Check that cereal's messaging imports over upstream msgq before measuring anything.
use_scratch
"$python" -c 'import sys; from msgq.bench.messaging import cereal_over_upstream as c
c(sys.argv[1], sys.argv[2])' "$cereal" "$scratch"
if ! (cd "$scratch" && PYTHONPATH="$scratch" "$venv/bin/python" -c "import cereal.messaging"); then
  echo "cereal.messaging of $cereal does not import over upstream msgq in $venv" >&2
  exit 1
fi
exec "$python" -m msgq.bench.messaging --cereal "$cereal" --cereal-python "$venv/bin/python" \
  --cereal-only "$@"
