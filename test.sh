#!/usr/bin/env bash
# Runs every test: the C unit tests (plain and ASan+UBSan builds) and the pytest suite.
# Installs what it needs first. Extra arguments go to pytest (e.g. ./test.sh -k zmq).
set -euo pipefail
cd "$(dirname "$0")"
source scripts/ensure_env.sh
echo "== C unit tests (plain)"
.venv/bin/scons -Q test
echo "== C unit tests (ASan + UBSan)"
.venv/bin/scons -Q test --sanitize=address
echo "== ruff"
.venv/bin/ruff check msgq visionipc schemas tests
echo "== pytest"
.venv/bin/python -m pytest "$@"
