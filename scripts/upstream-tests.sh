#!/usr/bin/env bash
# Runs upstream msgq's own Python tests against the msgq installed here: the executable
# form of our compatibility contract, and a quick check for anyone migrating.
#
#   scripts/upstream-tests.sh UPSTREAM_DIR [PYTEST_ARGS...]
#
# UPSTREAM_DIR is a checkout of commaai/msgq (only its test files are used; its own
# msgq/ package is never imported). The tests run with this checkout's .venv Python (or
# $PYTHON), from a scratch folder, with pytest's importlib mode so that upstream's msgq/
# folder cannot shadow the installed package, in a fresh MSGQ_PREFIX namespace.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/lib/checkout.sh"
upstream="$(checkout_dir "usage: $0 UPSTREAM_DIR [PYTEST_ARGS...]  (a checkout of commaai/msgq)" \
  "${1:-}")"
shift
use_project_python
files=(
  msgq/tests/test_messaging.py
  msgq/tests/test_poller.py
  msgq/tests/test_fake.py
  msgq/visionipc/tests/test_visionipc.py
)
use_scratch
# Copy the test files (with their packages' __init__.py) so pytest sees nothing else of
# the checkout.
for f in "${files[@]}"; do
  if [ ! -f "$upstream/$f" ]; then
    echo "$upstream/$f is missing: is $upstream a checkout of commaai/msgq?" >&2
    exit 2
  fi
  mkdir -p "$scratch/upstream/$(dirname "$f")"
  cp "$upstream/$f" "$scratch/upstream/$f"
  init="$upstream/$(dirname "$f")/__init__.py"
  [ -f "$init" ] && cp "$init" "$scratch/upstream/$(dirname "$f")/"
done
cd "$scratch"
export MSGQ_PREFIX="upstream_tests_$$"
unset OPENPILOT_PREFIX ZMQ MSGQ_BACKEND CEREAL_FAKE
status=0
"$python" -m pytest -q -p no:cacheprovider --import-mode=importlib --rootdir="$scratch" \
  "${files[@]/#/upstream/}" "$@" || status=$?
rm -rf "/dev/shm/$MSGQ_PREFIX"
exit "$status"
