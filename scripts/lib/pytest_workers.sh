# Sourced by test.sh and scripts/flake-check.sh; defines functions only.

# pytest_parallel_args: sets the array `parallel` to pytest-xdist's options for
# MSGQ_TEST_WORKERS processes (default 3; 1: none, the tests run in pytest's process):
# a test file's tests in one worker (--dist loadfile: module fixtures and the Spark
# session are made once per file and worker), the files handed out in the order
# tests/conftest.py collects them, heavy files first (--no-loadscope-reorder: else xdist
# orders files by their number of tests).
pytest_parallel_args() {
  local workers="${MSGQ_TEST_WORKERS:-3}"
  parallel=()
  if [ "$workers" != 1 ]; then
    parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
  fi
}
