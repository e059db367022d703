#!/usr/bin/env bash
# Makes sure this checkout has what it needs to build and run: system packages (a C
# compiler, Python headers and venv), a virtual environment in .venv, and msgq installed
# in it (editable, with the test extra). Sourced by run.sh and test.sh; safe to re-run:
# it rebuilds only when a build input changed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

need_apt=()
command -v gcc >/dev/null 2>&1 || need_apt+=(gcc)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)
python3 -c "import venv, ensurepip" >/dev/null 2>&1 || need_apt+=(python3-venv)
# clang builds the libFuzzer target of the ring (test.sh runs it for a bounded time).
command -v clang >/dev/null 2>&1 || need_apt+=(clang)
python3 - <<'PY' >/dev/null 2>&1 || need_apt+=(python3-dev)
import os, sysconfig
raise SystemExit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)
PY
# Spark (msgq.spark, `msgq logstats`, the Spark tests) needs a Java 17+ runtime: a
# headless JRE from the distribution's own packages, nothing downloaded from elsewhere.
java_ok() {
  command -v java >/dev/null 2>&1 || return 1
  local major
  major="$(java -version 2>&1 | sed -n 's/.* version "\([0-9][0-9]*\).*/\1/p' | head -n 1)"
  [ -n "$major" ] && [ "$major" -ge 17 ]
}
need_java=0
java_ok || need_java=1
if [ "$need_java" -eq 1 ] && [ "$(id -u)" -ne 0 ]; then
  echo "no Java 17+ runtime: Spark (msgq logstats, the Spark tests) will not run;" \
    "install one as root: apt-get install openjdk-17-jre-headless" >&2
  need_java=0
fi

if [ ${#need_apt[@]} -gt 0 ] || [ "$need_java" -eq 1 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing ${need_apt[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  apt-get update -q
  if [ "$need_java" -eq 1 ]; then
    # the first JRE of 17 or newer this distribution has (Debian 12: 17; Debian 13: 21)
    for jre in openjdk-17-jre-headless openjdk-21-jre-headless openjdk-25-jre-headless; do
      if apt-cache show "$jre" >/dev/null 2>&1; then
        need_apt+=("$jre")
        # slim images lack the man folder the JRE's alternatives link into
        mkdir -p /usr/share/man/man1
        break
      fi
    done
  fi
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing system packages: ${need_apt[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}"
  fi
  if [ "$need_java" -eq 1 ] && ! java_ok; then
    echo "no Java 17+ runtime could be installed from the apt sources;" \
      "Spark (msgq logstats, the Spark tests) will not run" >&2
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi

# Rebuild when any build input changed since the last install.
inputs_hash="$(cat pyproject.toml setup.py msgq/*.pyx msgq/*.pxd msgq/spark/*.pyx msgq/src/*.[ch] \
  visionipc/*.pyx visionipc/*.pxi visionipc/src/*.[ch] 2>/dev/null \
  | sha256sum | cut -d' ' -f1)"
stamp=.venv/.msgq-build-inputs
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$inputs_hash" ]; then
  echo "building msgq (pip install -e '.[test]'; log in .venv/build.log) ..." >&2
  if ! .venv/bin/python -m pip install -e '.[test]' > .venv/build.log 2>&1 ||
     ! .venv/bin/python -c "import msgq.shm_backend" 2>> .venv/build.log; then
    tail -n 40 .venv/build.log >&2
    echo "build failed: see .venv/build.log" >&2
    exit 1
  fi
  echo "$inputs_hash" > "$stamp"
fi
