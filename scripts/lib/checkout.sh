# Sourced by the scripts that run a foreign checkout's code against this one
# (cereal-bench.sh, cereal-tests.sh, upstream-tests.sh); defines functions only.
# Each expects `here` (this checkout's root) to be set, and `set -euo pipefail`.

# checkout_dir USAGE DIR [FILE...]: prints DIR as an absolute path; exits 2 with USAGE
# when DIR is not a folder or lacks one of the FILEs (paths inside it).
checkout_dir() {
  local usage="$1" dir="$2" file
  shift 2
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    echo "$usage" >&2
    exit 2
  fi
  for file in "$@"; do
    if [ ! -f "$dir/$file" ]; then
      echo "$usage" >&2
      exit 2
    fi
  done
  (cd "$dir" && pwd)
}

# use_project_python: sets `python` to $PYTHON, else this checkout's .venv Python; exits 2
# saying how to get one when it is not there.
use_project_python() {
  python="${PYTHON:-$here/.venv/bin/python}"
  if [ ! -x "$python" ]; then
    echo "no Python at $python: run ./test.sh once (it builds .venv) or set PYTHON" >&2
    exit 2
  fi
}

# use_scratch: sets `scratch` to a new temporary folder, removed when the script exits.
use_scratch() {
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
}
