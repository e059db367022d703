#!/usr/bin/env bash
# Makes sure this checkout has what a job needs, and nothing more:
#   source scripts/ensure_env.sh run    run.sh: a C compiler, Python headers and venv, a
#                                       Java 17+ runtime (Spark), and msgq built into .venv
#                                       (editable) with the spark extra
#   source scripts/ensure_env.sh test   test.sh: the same, plus clang (libFuzzer) and the
#                                       test extra (pytest, ruff, scons, atheris, ...)
# With MSGQ_SETUP_DEFER_SPARK=1 (run.sh's demo; run profile only) the spark extra may go
# on installing after this returns: MSGQ_PENDING_SETUP then names a file that its exit
# status is written to when it ends, and the demo waits for that before its Spark step
# (beside it, a .pyspark file appears once pyspark itself is in: the JVM can start).
# One line per step it takes, on stderr; apt's output goes to build/setup.log (the Java
# runtime's to build/setup-java.log), pip's and the build's to .venv/deps.log,
# .venv/extra-setup.log and .venv/build.log; a log's end is shown only when its step fails. Safe to re-run: it does
# nothing when everything is there, and rebuilds only when a build input changed
# (MSGQ_DEBUG=1 builds with debug info and unstripped libraries).
set -euo pipefail

profile="${1:-test}"
print_requirements=0
if [ "$profile" = --print-requirements ]; then
  # (bash scripts/ensure_env.sh --print-requirements PROFILE: the packages it installs)
  print_requirements=1
  profile="${2:-test}"
fi
case "$profile" in
  run|test) ;;
  *) echo "ensure_env.sh: unknown profile '$profile' (run or test)" >&2; exit 2 ;;
esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# The extra this job needs (test's includes spark's).
extra="spark"
[ "$profile" = test ] && extra="test"

# PYTHON EXTRA: prints msgq's requirements and those of EXTRA (extras that name msgq's
# own extras expanded; none when EXTRA is ""), one a line, from pyproject.toml.
requirements() {
  "$1" - "$2" <<'PY'
import re
import sys

try:
    import tomllib
except ImportError:  # Python 3.10: the copy pip carries
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    project = tomllib.load(f)["project"]
extras = project.get("optional-dependencies", {})
own = re.compile(re.escape(project["name"]) + r"\[([^\]]+)\]\s*$")
found, todo, seen = list(project["dependencies"]), [e for e in sys.argv[1:] if e], set()
while todo:
    extra = todo.pop()
    if extra not in seen:
        seen.add(extra)
        for req in extras[extra]:
            match = own.match(req)
            if match:
                todo += [e.strip() for e in match.group(1).split(",")]
            else:
                found.append(req)
print("\n".join(dict.fromkeys(found)))
PY
}
if [ "$print_requirements" -eq 1 ]; then
  requirements python3 "$extra"
  exit 0
fi
mkdir -p build
setup_log="$root/build/setup.log"

# STATUS_FILE CMD...: runs CMD, then writes its exit status to STATUS_FILE (for a job in
# the background that another job waits for).
with_status() {
  local status_file="$1" code=0
  shift
  "$@" || code=$?
  # written whole, then renamed: whoever waits never reads a created, still empty file
  echo "$code" > "$status_file.tmp" && mv -f "$status_file.tmp" "$status_file"
  return "$code"
}

# Byte-compiles the virtual environment's packages, less their own test suites: pip
# installs them with --no-compile, since compiling pandas' tests alone (1,100 files that
# nothing here imports) takes 15 s of CPU on a new machine. A file that does not compile
# is left to be compiled where imported, as pip would. Arguments: a command to run it
# under (nice -n 19).
compile_packages() {
  local site
  site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  (cd "$site" && "$@" "$root/.venv/bin/python" -m compileall -q -x '/tests?/' . || true)
}

# msgq's own requirements (run in the background while msgq builds).
install_requirements() {
  "${pip[@]}" install --no-compile -r .venv/requirements.txt || return
  compile_packages
}

# The extra's own requirements (those msgq itself does not need), installed once msgq's
# are in (they share numpy and others: two pip runs must not install the same package).
install_extra_rest() {
  while [ ! -f .venv/deps.status ]; do sleep 0.2; done
  [ "$(cat .venv/deps.status)" = 0 ] || return 1
  [ ! -s .venv/requirements-extra.txt ] ||
    nice -n 19 "${pip[@]}" install --no-compile -r .venv/requirements-extra.txt
}

# The spark extra: its other packages (above) and pyspark side by side. pyspark, a 456 MB
# sdist of jars, is downloaded and built into a wheel while msgq's requirements install
# and msgq builds: built without deflating the jars again (--compression=stored: 17 s
# instead of 37 s here). It then goes in alone, with py4j (all it requires, which no
# other package here holds), and .venv/extra-setup.pyspark says so: the demo's Spark step
# starts its JVM then, while the rest may still be installing. Everything runs at the
# lowest priority: on a machine with few cores, msgq's build and then the demo's robot
# come first. Writes the stamp when msgq's build is done too (run through with_status,
# which then writes .venv/extra-setup.status).
install_extra() {
  local code=0 rest_job
  install_extra_rest &
  rest_job=$!
  if [ -n "$spark_req" ]; then
    nice -n 19 "${pip[@]}" wheel --no-deps \
      --config-settings=--build-option=--compression=stored -w .venv/spark-wheel \
      "$spark_req" || code=$?
    if [ "$code" -eq 0 ]; then
      nice -n 19 "${pip[@]}" install --no-compile .venv/spark-wheel/*.whl || code=$?
    fi
    [ "$code" -ne 0 ] || : > .venv/extra-setup.pyspark
  fi
  wait "$rest_job" || { [ "$code" -ne 0 ] || code=1; }
  rm -rf .venv/spark-wheel  # (pip's cache keeps the built wheel)
  if [ "$code" -eq 0 ] && [ -f "$stamp.pending" ]; then
    mv -f "$stamp.pending" "$stamp"
  fi
  return "$code"
}

# Runs a set-up command with its output in the log; on failure shows the log's end.
quietly() {
  if ! "$@" >>"$setup_log" 2>&1; then
    tail -n 30 "$setup_log" >&2
    echo "failed: $* (full output: $setup_log)" >&2
    exit 1
  fi
}

need_apt=()
need_clang=0
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc libc6-dev)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
if [ "$profile" = test ]; then
  # clang builds the libFuzzer targets (test.sh runs them for a bounded time).
  command -v clang >/dev/null 2>&1 || need_clang=1
fi
python3 - <<'PY' >/dev/null 2>&1 || need_apt+=(python3-dev)
import os, sysconfig
raise SystemExit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
# Spark (the demo's statistics, msgq logstats, the Spark tests) needs a Java 17+ runtime:
# a headless JRE from the distribution's own packages, nothing downloaded from elsewhere.
java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local major
  major="$(java -version 2>&1 | sed -n 's/.* version "\([0-9][0-9]*\).*/\1/p' | head -n 1)"
  [ -n "$major" ] && [ "$major" -ge 17 ]
}
need_java=0
java_job=""
java_ok || need_java=1
if [ "$need_java" -eq 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "no Java 17+ runtime: Spark (msgq logstats, the Spark tests) will not run;" \
    "install one as root: apt-get install openjdk-17-jre-headless" >&2
  need_java=0
fi

if [ ${#need_apt[@]} -gt 0 ] || [ "$need_java" -eq 1 ] || [ "$need_clang" -eq 1 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    [ "$need_clang" -eq 1 ] && need_apt+=(clang)
    echo "missing ${need_apt[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "updating the apt package lists (log: build/setup.log)" >&2
  quietly apt-get update -q
  jre=""
  if [ "$need_java" -eq 1 ]; then
    # the first JRE of 17 or newer this distribution has (Debian 12: 17; Debian 13: 21)
    for candidate in openjdk-17-jre-headless openjdk-21-jre-headless openjdk-25-jre-headless; do
      if apt-cache show "$candidate" >/dev/null 2>&1; then
        jre="$candidate"
        break
      fi
    done
  fi
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing system packages: ${need_apt[*]}" >&2
    # --no-install-recommends: the compiler and the headers, not their documentation
    quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
      --no-install-recommends "${need_apt[@]}"
  fi
  if [ "$need_clang" -eq 1 ]; then
    echo "installing clang (libFuzzer, for test.sh)" >&2
    # with what it recommends: the fuzzer runtime comes that way on some releases
    quietly env DEBIAN_FRONTEND=noninteractive apt-get install -y -q clang
  fi
  if [ -n "$jre" ]; then
    # The largest package, needed only once Spark starts: it installs while msgq builds.
    echo "installing $jre in the background (log: build/setup-java.log)" >&2
    mkdir -p /usr/share/man/man1  # slim images lack the folder its alternatives link into
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$jre" \
      > build/setup-java.log 2>&1 &
    java_job=$!
  elif [ "$need_java" -eq 1 ]; then
    echo "no Java 17+ runtime in the apt sources; Spark (msgq logstats, the Spark tests)" \
      "will not run" >&2
  fi
fi

# A new environment is made without pip where this Python's pip can install into it
# (pip 22.3+, --python): ensurepip takes 4 s before the build could start. Until the
# environment has its own (add_own_pip, at the end of the extra's job), that pip is
# aimed at it.
new_venv=0
if [ ! -x .venv/bin/python ]; then
  echo "creating the virtual environment .venv" >&2
  new_venv=1
  # (--python takes a path: a bare "python3" is not looked up on PATH)
  if python3 -m pip --python "$(command -v python3)" --version >/dev/null 2>&1; then
    quietly python3 -m venv --without-pip .venv
  else
    quietly python3 -m venv .venv
  fi
fi
pip=(.venv/bin/python -m pip)
[ -x .venv/bin/pip ] || pip=(python3 -m pip --python .venv/bin/python)
# (the run profile keeps the pip that Python brings: any since 21.3 installs msgq; the
# test profile's environment gets the newest)
if [ "$profile" = test ] && [ "$new_venv" -eq 1 ]; then
  quietly "${pip[@]}" install -q --upgrade pip
  pip=(.venv/bin/python -m pip)
fi

# The environment's own pip, when it was made without one (in the background, once its
# packages are in: nothing of the set-up waits for it).
add_own_pip() {
  [ -x .venv/bin/pip ] || nice -n 19 .venv/bin/python -m ensurepip --default-pip || true
}

# Rebuild when any build input changed since the last install, or when the extra this
# job needs is not installed yet.
# (every Cython and C source wherever it lives, so that moving one never breaks this line)
build_inputs() {
  printf '%s\n' pyproject.toml setup.py MANIFEST.in
  find msgq schemas visionipc \( -name '*.pyx' -o -name '*.pxd' -o -name '*.pxi' \
    -o -path '*/src/*.[ch]' \) -type f | LC_ALL=C sort
}
inputs_hash="$(build_inputs | xargs cat | sha256sum | cut -d' ' -f1) debug=${MSGQ_DEBUG:-0}"
stamp=.venv/.msgq-build-inputs
# An earlier ./run.sh may have left the spark extra installing behind its demo (below).
extra_pid_file=.venv/extra-setup.pid
if [ -f "$extra_pid_file" ] && kill -0 "$(cat "$extra_pid_file")" 2>/dev/null; then
  echo "waiting for the install an earlier run started (log: .venv/extra-setup.log)" >&2
  while kill -0 "$(cat "$extra_pid_file")" 2>/dev/null; do sleep 0.5; done
fi
installed=""
[ -f "$stamp" ] && installed="$(cat "$stamp")"
satisfied=0
if [ "$installed" = "$inputs_hash test" ] ||
   { [ "$extra" = spark ] && [ "$installed" = "$inputs_hash spark" ]; }; then
  satisfied=1
fi
if [ "$satisfied" -eq 0 ]; then
  # msgq's requirements install in the background while msgq builds (the build is
  # compiling C; they are mostly unpacking), and the extra's after them, in a job of its
  # own that the run profile's demo need not wait for until its Spark step. They are
  # byte-compiled when installed (compile_packages): where PYTHONDONTWRITEBYTECODE is
  # set, nothing would cache them later.
  echo "installing msgq's requirements (log: .venv/deps.log)" >&2
  # (with the Python whose pip installs them: on 3.10 it reads pyproject.toml with the
  # TOML parser pip carries)
  requirements "${pip[0]}" "" > .venv/requirements.txt
  requirements "${pip[0]}" "$extra" | grep -v -x -F -f .venv/requirements.txt \
    > .venv/requirements-extra.txt || true
  spark_pattern='^pyspark([^A-Za-z0-9_.-]|$)'
  spark_req=""
  if ! .venv/bin/python -c "import importlib.metadata as m; m.version('pyspark')" \
      >/dev/null 2>&1; then
    spark_req="$(grep -E "$spark_pattern" .venv/requirements-extra.txt || true)"
  fi
  if [ -n "$spark_req" ]; then
    grep -v -E "$spark_pattern" .venv/requirements-extra.txt > .venv/requirements-rest.txt || true
    mv .venv/requirements-rest.txt .venv/requirements-extra.txt
  fi
  rm -f .venv/deps.status .venv/extra-setup.status .venv/extra-setup.pyspark "$stamp.pending"
  with_status .venv/deps.status install_requirements > .venv/deps.log 2>&1 &
  deps_job=$!
  echo "installing the $extra extra after them (log: .venv/extra-setup.log)" >&2
  # (its packages are byte-compiled after its status is written: what the demo imports
  # meanwhile is compiled as it is imported; then the environment gets its own pip if
  # it was made without one)
  { with_status .venv/extra-setup.status install_extra && compile_packages nice -n 19
    add_own_pip
  } > .venv/extra-setup.log 2>&1 &
  extra_job=$!
  echo "$extra_job" > "$extra_pid_file"
  echo "building msgq into .venv (pip install -e .; log: .venv/build.log)" >&2
  # The run profile leaves out the MCAP export's JSON writer: only the viz extra, which
  # it does not install, uses it (the test profile builds every extension).
  skip=""
  [ "$profile" = run ] && skip="msgq.viz._json_writer"
  built=1
  MSGQ_SKIP_EXTENSIONS="$skip" "${pip[@]}" install --no-deps -e . \
    > .venv/build.log 2>&1 || built=0
  if ! wait "$deps_job"; then
    tail -n 40 .venv/deps.log >&2
    echo "failed: pip install -r .venv/requirements.txt (full output: .venv/deps.log)" >&2
    exit 1
  fi
  if [ "$built" -eq 0 ] ||
     ! .venv/bin/python -c "import msgq.shm_backend" 2>> .venv/build.log; then
    tail -n 40 .venv/build.log >&2
    echo "build failed: see .venv/build.log" >&2
    exit 1
  fi
  # A checkout installed before the distribution was renamed msgq-shm still has the old
  # editable "msgq" distribution: its files that the new one does not own go (the
  # command's script, written by both, stays).
  .venv/bin/python - "$root" <<'PY' >> .venv/build.log 2>&1
import json, os, shutil, sys, sysconfig
from importlib import metadata
root = sys.argv[1].rstrip("/")
# the venv's own site-packages only: the checkout's stale msgq.egg-info (the build's, in
# the current folder) is not an installed distribution
site = sysconfig.get_paths()["purelib"]
found = {d.metadata["Name"]: d for d in metadata.distributions(path=[site])}
old, new = found.get("msgq"), found.get("msgq-shm")
url = "" if old is None else json.loads(old.read_text("direct_url.json") or "{}").get("url", "")
if old is not None and new is not None and url.rstrip("/") == "file://" + root:
    owned = {str(f) for f in new.files or ()}
    base = old.locate_file("")
    files = list(old.files or ())  # read from its RECORD, which goes too
    for f in files:
        if str(f) not in owned:
            path = os.path.normpath(os.path.join(base, f))
            if os.path.isfile(path):
                os.remove(path)
    for f in files:
        folder = os.path.normpath(os.path.join(base, os.path.dirname(f)))
        if f.name == "RECORD" and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)  # the dist-info folder, now empty
    print("removed the old editable distribution msgq of this checkout")
stale = os.path.join(root, "msgq.egg-info")  # the old name's build metadata
if new is not None and os.path.isdir(stale):
    shutil.rmtree(stale)
PY
  # The stamp waits for the extra: whichever of the two jobs ends last writes it.
  echo "$inputs_hash $extra" > "$stamp.pending"
  if [ "$profile" = run ] && [ "${MSGQ_SETUP_DEFER_SPARK:-0}" = 1 ] &&
     [ ! -f .venv/extra-setup.status ]; then
    echo "the $extra extra goes on installing while the demo starts" >&2
    export MSGQ_PENDING_SETUP="$root/.venv/extra-setup.status"
  else
    if ! wait "$extra_job"; then
      tail -n 40 .venv/extra-setup.log >&2
      echo "failed: installing the $extra extra (full output: .venv/extra-setup.log)" >&2
      exit 1
    fi
    if [ -f "$stamp.pending" ]; then mv -f "$stamp.pending" "$stamp"; fi
  fi
fi

# msgq's own modules byte-compiled: the editable install runs them from the checkout, and
# where PYTHONDONTWRITEBYTECODE is set every fresh Python (each Spark worker and query
# runner, each command) would compile them again (~60 ms a process). Files already
# compiled and unchanged are skipped.
.venv/bin/python -m compileall -q -x '/tests?/' msgq schemas > /dev/null 2>&1 || true

if [ -n "$java_job" ]; then
  if ! wait "$java_job"; then
    tail -n 30 build/setup-java.log >&2
    echo "failed: apt-get install $jre (full output: $root/build/setup-java.log)" >&2
    exit 1
  fi
  java_ok || echo "no Java 17+ runtime after installing $jre;" \
    "Spark (msgq logstats, the Spark tests) will not run" >&2
fi
