#!/usr/bin/env bash
# Old/new A/B of msgq's benchmark rows in one window: how every change to the C core, the
# bindings or the messaging hot path is judged (docs/benchmarks.md, "Judging a change").
#
#   scripts/bench-ab.sh REF [ROWS] [ARGS...]     e.g. scripts/bench-ab.sh f742234
#                                                      scripts/bench-ab.sh HEAD~1 core,count
#
# REF (any commit) and NEW ($AB_NEW, default HEAD; "worktree": the checkout's own build in
# .venv, uncommitted changes included) are each exported with `git archive` into
# build/ab/<commit>/ and built there in place with the checkout's .venv (its Cython and
# compiler; nothing is installed, .venv is not touched), once per commit, under the
# build lock. tests/c/count_pair.c is compiled against each side's msgq/src. Then
# msgq.bench.ab runs the ROWS (comma-separated groups, default
# core,onecpu,count,submaster,logs; also: large) alternating REF and NEW in ABBA order
# (REF first in odd rounds, NEW first in even ones), and prints each row's runs per side,
# medians, spreads, ratio and whether the spreads separate the sides, with the load and
# the placement (core: CPUs as the OS gives them; onecpu: every process of a run pinned to
# one CPU). ARGS go to msgq.bench.ab (--rounds N, default 5; --pairs N, SubMaster pairs,
# default max(6, rounds); --pin-cpu K; --duration S; --seconds S; --json PATH).
#
# The submaster rows compare NEW's SubMaster with cereal's own over upstream msgq:
# $CEREAL_DIR is a cereal checkout (log.capnp, services.py, messaging/; default
# build/ab/cereal when it is there) and cereal's environment is the one
# scripts/cereal-bench.sh makes (run that once). Without either the rows are left out,
# said on stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$here/scripts/lib/checkout.sh"
usage="usage: $0 REF [ROWS] [ARGS...]  (ROWS: core,onecpu,large,count,submaster,logs)"
ref="${1:-}"
if [ -z "$ref" ] || [ "$ref" = -h ] || [ "$ref" = --help ]; then
  echo "$usage" >&2
  exit 2
fi
shift
rows="core,onecpu,count,submaster,logs"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  rows="$1"
  shift
fi
use_project_python
cd "$here"
ab_dir="$here/build/ab"
mkdir -p "$ab_dir"

# resolve NAME: the full commit of NAME; exits 2 when it is none.
resolve() {
  git rev-parse --verify --quiet "$1^{commit}" || {
    echo "bench-ab: $1 is not a commit of this repository" >&2
    exit 2
  }
}

# prepare COMMIT: build/ab/COMMIT with its extensions built in place (once).
prepare() {
  local commit="$1" tree="$ab_dir/$1"
  if [ ! -f "$tree/.built" ]; then
    echo "bench-ab: building ${commit:0:9} in build/ab/ (log: $tree.log)" >&2
    rm -rf "$tree"
    mkdir -p "$tree"
    git archive "$commit" | tar -x -C "$tree"
    if ! (cd "$tree" && flock /tmp/msgq-build.lock "$python" setup.py -q build_ext --inplace \
          > "$tree.log" 2>&1); then
      tail -20 "$tree.log" >&2
      echo "bench-ab: building ${commit:0:9} failed" >&2
      exit 1
    fi
    # setup.py maps msgq.schemas and msgq.visionipc to top-level folders; links make the
    # tree importable as it is from PYTHONPATH (the checkout's editable install maps
    # them to the checkout's own folders, which must not stand in for the tree's).
    local name
    for name in schemas visionipc; do
      [ -d "$tree/$name" ] && [ ! -e "$tree/msgq/$name" ] && ln -s "../$name" "$tree/msgq/$name"
    done
    touch "$tree/.built"
  fi
}

# count_bin SRC_ROOT OUT: tests/c/count_pair.c against SRC_ROOT's C core, as setup.py
# compiles the extension's (-O2, link-time optimisation).
count_bin() {
  local src="$1/msgq/src" out="$2"
  if [ ! -x "$out" ] || [ "$here/tests/c/count_pair.c" -nt "$out" ] ||
     [ -n "$(find "$src" -newer "$out" -name '*.[ch]' 2>/dev/null | head -1)" ]; then
    ${CC:-gcc} -std=c11 -O2 -flto -I"$src" "$here/tests/c/count_pair.c" \
      "$src"/{msgq,msgq_ring,queue_file,os_wait,msgq_errors,crc32c}.c -lpthread -o "$out"
  fi
}

ref_commit="$(resolve "$ref")"
prepare "$ref_commit"
count_bin "$ab_dir/$ref_commit" "$ab_dir/$ref_commit/count_pair"
args=(--ref-tree "$ab_dir/$ref_commit" --ref-label "${ref_commit:0:7}"
      --ref-count-bin "$ab_dir/$ref_commit/count_pair")
new="${AB_NEW:-HEAD}"
if [ "$new" = worktree ]; then
  count_bin "$here" "$ab_dir/count_pair.worktree"
  args+=(--new-tree "" --new-label worktree --new-count-bin "$ab_dir/count_pair.worktree")
else
  new_commit="$(resolve "$new")"
  prepare "$new_commit"
  count_bin "$ab_dir/$new_commit" "$ab_dir/$new_commit/count_pair"
  args+=(--new-tree "$ab_dir/$new_commit" --new-label "${new_commit:0:7}"
         --new-count-bin "$ab_dir/$new_commit/count_pair")
fi

if [[ ",$rows," == *,count,* ]] && ! command -v valgrind > /dev/null; then
  echo "bench-ab: no valgrind: the count rows are left out" >&2
  rows="$(echo ",$rows," | sed 's/,count,/,/; s/^,//; s/,$//')"
fi
if [[ ",$rows," == *,submaster,* ]]; then
  cereal="${CEREAL_DIR:-$ab_dir/cereal}"
  venv="${MSGQ_CEREAL_BENCH_VENV:-$HOME/.cache/msgq/cereal-bench-venv}"
  if [ ! -f "$cereal/log.capnp" ] || ! "$venv/bin/python" -I -c "import msgq.ipc_pyx, capnp" \
       2> /dev/null; then
    echo "bench-ab: the submaster rows need a cereal checkout in \$CEREAL_DIR (now: $cereal)" \
      "and cereal's environment (run scripts/cereal-bench.sh CEREAL_DIR once): left out" >&2
    rows="$(echo ",$rows," | sed 's/,submaster,/,/; s/^,//; s/,$//')"
  else
    args+=(--cereal "$cereal" --cereal-python "$venv/bin/python")
  fi
fi
[ -n "$rows" ] || { echo "bench-ab: no rows left to run" >&2; exit 2; }
exec "$python" -m msgq.bench.ab "${args[@]}" --rows "$rows" "$@"
