#!/usr/bin/env bash
# Runs cereal's own messaging tests against the msgq installed here, through the cereal
# compatibility package (msgq.compat.cereal) with the checkout's own schema and services:
# the executable form of "the user's schema is part of the contract".
#
#   scripts/cereal-tests.sh CEREAL_DIR [PYTEST_ARGS...]
#   ZMQ=1 scripts/cereal-tests.sh CEREAL_DIR     # on the ZMQ backend, as cereal's CI
#
# CEREAL_DIR is a cereal checkout (openpilot/cereal, or commaai/cereal: the folder with
# log.capnp and services.py). Its messaging/ and visionipc/ code is never imported: a tiny
# `cereal` package written to a scratch folder installs msgq's in its place, reading the
# checkout's log.capnp, car.capnp, custom.capnp and services.py where they lie. The test
# files are copied into the scratch folder and run there with this checkout's .venv Python
# (or $PYTHON), in a fresh MSGQ_PREFIX namespace. cereal's tests need the
# `parameterized` package.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/lib/checkout.sh"
cereal="$(checkout_dir "usage: $0 CEREAL_DIR [PYTEST_ARGS...]  (the cereal folder: log.capnp,\
 services.py)" "${1:-}" log.capnp services.py)"
shift
use_project_python
use_scratch
"$python" -m msgq.compat.cereal "$cereal" "$scratch" >/dev/null
files=()
for name in test_messaging.py test_pub_sub_master.py test_services.py test_fake.py \
            test_poller.py; do
  if [ -f "$cereal/messaging/tests/$name" ]; then
    files+=("cereal/messaging/tests/$name")
  fi
done
if [ ${#files[@]} -eq 0 ]; then
  echo "$cereal/messaging/tests has none of cereal's messaging tests" >&2
  exit 2
fi
mkdir -p "$scratch/cereal/messaging/tests"
cp "$cereal/messaging/tests/__init__.py" "$scratch/cereal/messaging/tests/" 2>/dev/null ||
  touch "$scratch/cereal/messaging/tests/__init__.py"
for f in "${files[@]}"; do
  cp "$cereal/${f#cereal/}" "$scratch/$f"
done
if grep -q "^from parameterized\|^import parameterized" "$scratch"/cereal/messaging/tests/*.py &&
   ! "$python" -c "import parameterized" 2>/dev/null; then
  echo "cereal's tests need the parameterized package: $python -m pip install parameterized" >&2
  exit 2
fi
cd "$scratch"
export MSGQ_PREFIX="cereal_tests_$$"
export PYTHONPATH="$scratch${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONDONTWRITEBYTECODE=1
# The backend: shared memory, or ZMQ when the caller sets ZMQ=1 (as cereal's CI runs them).
zmq="${ZMQ:-}"
unset OPENPILOT_PREFIX ZMQ MSGQ_BACKEND CEREAL_FAKE MSGQ_SCHEMA MSGQ_REGISTRY MSGQ_SCHEMA_ROOT
if [ -n "$zmq" ] && [ "$zmq" != "0" ]; then
  export ZMQ=1
fi
status=0
"$python" -m pytest -q -p no:cacheprovider --rootdir="$scratch" "${files[@]}" "$@" ||
  status=$?
rm -rf "${MSGQ_SHM_DIR:-/dev/shm}/$MSGQ_PREFIX"
exit "$status"
