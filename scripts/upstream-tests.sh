#!/usr/bin/env bash
# Runs upstream msgq's own Python tests against the msgq installed here: the executable
# form of our compatibility contract (29 of 29), run by .ci/run, and a quick check for
# anyone migrating.
#
#   scripts/upstream-tests.sh [PYTEST_ARGS...]              the tests the msgq-ipc wheel
#                                                           carries (the package index)
#   scripts/upstream-tests.sh --checkout DIR [PYTEST_ARGS...]   a checkout of commaai/msgq
#
# By default the tests come from upstream's wheel on the package index (msgq-ipc,
# MSGQ_UPSTREAM_VERSION, default 1.0): `pip download --no-deps` fetches it once into
# build/upstream/ and its test files are unzipped there. It is never installed: only its
# test files are used, and its own msgq/ package is never imported. The tests run with
# this checkout's .venv Python (or $PYTHON), from a scratch folder, with pytest's
# importlib mode so that no upstream msgq/ folder can shadow the installed package, in a
# fresh MSGQ_PREFIX namespace.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/lib/checkout.sh"
use_project_python
files=(
  msgq/tests/test_messaging.py
  msgq/tests/test_poller.py
  msgq/tests/test_fake.py
  msgq/visionipc/tests/test_visionipc.py
)
if [ "${1:-}" = --checkout ]; then
  upstream="$(checkout_dir "usage: $0 --checkout UPSTREAM_DIR [PYTEST_ARGS...]  (a checkout\
 of commaai/msgq)" "${2:-}")"
  shift 2
else
  version="${MSGQ_UPSTREAM_VERSION:-1.0}"
  upstream="$here/build/upstream/msgq-ipc-$version"
  if [ ! -f "$upstream/${files[0]}" ]; then
    mkdir -p "$here/build/upstream"
    # Any of its wheels carries the same test files: the one for this platform and
    # CPython 3.11 is asked for, whatever Python runs this.
    if ! "$python" -m pip download --no-deps --only-binary=:all: -q \
        --disable-pip-version-check --python-version 3.11 --implementation cp \
        -d "$here/build/upstream" "msgq-ipc==$version" >"$here/build/upstream/pip.log" 2>&1
    then
      tail -n 5 "$here/build/upstream/pip.log" >&2
      echo "could not download msgq-ipc==$version from the package index" \
        "(log: build/upstream/pip.log); with a checkout: $0 --checkout DIR" >&2
      exit 1
    fi
    wheel="$(ls "$here/build/upstream/msgq_ipc-$version"-*.whl | head -n 1)"
    rm -rf "$upstream.tmp"
    "$python" - "$wheel" "$upstream.tmp" <<'PY'
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    tests = [n for n in wheel.namelist() if "/tests/" in n and n.endswith(".py")]
    wheel.extractall(sys.argv[2], members=tests)
PY
    mv "$upstream.tmp" "$upstream"
  fi
fi
use_scratch
# Copy the test files (with their packages' __init__.py) so pytest sees nothing else of
# upstream's tree.
for f in "${files[@]}"; do
  if [ ! -f "$upstream/$f" ]; then
    echo "$upstream/$f is missing: is $upstream upstream msgq's tree?" >&2
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
"$python" -m pytest -q -p no:cacheprovider -p no:randomly --import-mode=importlib \
  --rootdir="$scratch" "${files[@]/#/upstream/}" "$@" || status=$?
rm -rf "${MSGQ_SHM_DIR:-/dev/shm}/$MSGQ_PREFIX"
exit "$status"
