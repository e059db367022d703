"""Every Python block of README.md and docs/*.md runs as a test, on each backend profile:
shared memory, ZMQ (``ZMQ=1``, the upstream way) and the fake layer (``CEREAL_FAKE=1``).

Each profile is one pytest run with pytest-markdown-docs over the Markdown files, in a
subprocess (the backend is chosen by the environment, as users choose it). Blocks mark
what they need with fixtures of ``tests/doc_examples.py``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]

PROFILES = {
    "msgq": {"MSGQ_BACKEND": "msgq"},
    "zmq": {"ZMQ": "1"},
    "fake": {"MSGQ_BACKEND": "msgq", "CEREAL_FAKE": "1"},
}


@pytest.mark.slow
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_documented_examples_run(profile: str) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MSGQ_BACKEND", "ZMQ", "CEREAL_FAKE", "CEREAL_FAKE_PREFIX",
                        "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
    env.update(PROFILES[profile])
    env["MSGQ_DOCS_PROFILE"] = profile
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "tests"), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "doc_examples",
         "--markdown-docs", "-m", "markdown-docs", "--timeout", "240", "-rs", *DOCS],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    report = done.stdout[-12000:] + done.stderr[-4000:]
    assert done.returncode == 0, f"examples failed on the {profile} profile:\n{report}"
    assert " passed" in done.stdout, report


# --- install hints ---------------------------------------------------------------------

#: Where install hints live: the pages, the scripts and the code (messages and help).
HINT_FILES = sorted(
    p for pattern in ("*.md", "docs/*.md", "*.sh", "scripts/*.sh", "msgq/**/*.py",
                      "msgq/**/*.pyx", "visionipc/**/*.py", "schemas/**/*.py", "examples/**/*")
    for p in ROOT.glob(pattern) if p.is_file())
#: A package a `pip install` hint names that starts with "msgq": the name (with an extra
#: or a version after it, or a file name's version), unless it is a path (./msgq).
PIP_HINT = re.compile(r"pip install\b[^\n`#(]*?(?<![\w./-])['\"]?(msgq[\w.-]*)")


def pip_install_hints(text: str) -> list[str]:
    """The msgq-like names ``pip install`` hints in ``text`` name."""
    return PIP_HINT.findall(text)


def test_the_hint_scanner_sees_a_wrong_name() -> None:
    assert pip_install_hints("run: pip install 'msgq[spark]' first") == ["msgq"]
    assert pip_install_hints("pip install msgq") == ["msgq"]
    assert pip_install_hints("`pip install msgq-shm`, pip install './msgq[viz]'") == [
        "msgq-shm"]
    assert pip_install_hints("pip install msgq_shm-*.tar.gz") == ["msgq_shm-"]
    assert pip_install_hints("pip install pyzmq (or choose MSGQ_BACKEND=msgq)") == []
    assert pip_install_hints("pip install ./x   # msgq-like words in a comment") == []


def test_install_hints_name_this_projects_distribution() -> None:
    # `msgq` on the package index is an unrelated project: every hint names the
    # distribution of msgq.version (the CLI's errors format theirs from it), its sdist's
    # file name, or upstream's msgq-ipc where upstream is meant.
    from msgq.__main__ import DISTRIBUTION as MAIN_DISTRIBUTION
    from msgq.version import DISTRIBUTION

    assert MAIN_DISTRIBUTION == DISTRIBUTION
    sdist_file = DISTRIBUTION.replace("-", "_") + "-"
    allowed = {DISTRIBUTION, sdist_file, "msgq-ipc"}
    wrong = [(str(path.relative_to(ROOT)), name) for path in HINT_FILES
             for name in pip_install_hints(path.read_text(errors="replace"))
             if name not in allowed]
    assert len(HINT_FILES) > 50
    assert wrong == []


# --- paths and rates the pages name ----------------------------------------------------

#: The set-up logs: build/NAME.log or .venv/NAME.log (a glob as .venv/*.log too).
LOG_PATH = re.compile(r"(?:build|\.venv)/[\w*-]+\.log")
PAGES = [ROOT / name for name in DOCS] + [ROOT / "run.sh", ROOT / "test.sh"]


def test_the_setup_logs_the_pages_name_are_where_setup_writes_them() -> None:
    # The README said build/setup.log held the package managers' output; pip's and the
    # build's went to .venv/*.log.
    import fnmatch

    def written_by(script: str) -> set[str]:
        text = (ROOT / script).read_text()
        code = "\n".join(line for line in text.splitlines()
                         if not line.lstrip().startswith("#"))
        return set(LOG_PATH.findall(code)) | {
            "build/" + name for name in re.findall(r'"\$root/build/([\w-]+\.log)"', code)} | {
            f"build/{step}.log" for step in re.findall(r"scons_step ([\w-]+)", code)}

    setup = written_by("scripts/ensure_env.sh")
    assert {"build/setup.log", ".venv/deps.log", ".venv/build.log"} <= setup, setup
    written = setup | written_by("test.sh") | written_by("run.sh")
    for page in PAGES:
        for named in LOG_PATH.findall(page.read_text()):
            assert fnmatch.filter(written, named), (page.name, named, sorted(written))
    readme = (ROOT / "README.md").read_text()
    assert [w for w in sorted(setup) if w not in readme] == []


def test_the_rates_the_pages_name_are_the_registrys() -> None:
    # The demo's health view expected 100 Hz of the 104 Hz IMU services.
    from msgq.demo.robot import SENSOR_RATES, VEHICLE_RATES
    from msgq.schemas.services import SERVICE_LIST

    registry = {name: s.frequency for name, s in SERVICE_LIST.items()}
    named = [(page.name, service, float(hz)) for page in PAGES
             for service, hz in re.findall(r"\b(\w+) at (\d+(?:\.\d+)?) ?Hz\b", page.read_text())
             if service in registry]
    assert named, "no page names a service's rate"
    assert [n for n in named if n[2] != registry[n[1]]] == []
    # What the robot publishes (./run.sh, ./run.sh robot) is the registry's rates.
    assert {s: registry[s] for s in {**SENSOR_RATES, **VEHICLE_RATES}} == {
        **SENSOR_RATES, **VEHICLE_RATES}


def test_messages_point_to_help_that_ships_not_to_docs_folder() -> None:
    # The wheel carries no docs/: `msgq keys init` sent users to docs/security.md. What a
    # command prints or raises points to `msgq ... --help` (or a URL) instead.
    import ast

    hits = []
    for path in sorted((ROOT / "msgq").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (func.id if isinstance(func, ast.Name)
                    else func.attr if isinstance(func, ast.Attribute) else "")
            if name in ("print", "print_error", "warn") or name.endswith(("Error", "Exception")):
                hits += [(str(path.relative_to(ROOT)), sub.lineno) for sub in ast.walk(node)
                         if isinstance(sub, ast.Constant) and isinstance(sub.value, str)
                         and re.search(r"\bdocs/\w", sub.value)]
    assert hits == []


# --- generated figures -------------------------------------------------------------------


def test_the_generated_figure_blocks_are_as_generated_and_cite_current_rows() -> None:
    from msgq.bench import figures

    assert figures.problems(ROOT) == []


def test_a_hand_edit_or_a_row_the_benchmark_dropped_is_caught(tmp_path: Path) -> None:
    from msgq.bench import figures

    (tmp_path / "docs").mkdir()
    body = "*Generated ...*\n\n| row | msgq |\n|---|---|\n| 8 B, 1 subscriber | 3.0× |\n"

    def marked(name: str, rows: Sequence[str]) -> str:
        attrs = f' rows="{";".join(rows)}" '
        return (f"<!-- bench:{name} begin{attrs}-->\n{body}"
                f"<!-- bench:{name} end {figures.checksum(attrs, body)} -->")

    others = [marked(b.name, b.rows) for b in figures.BLOCKS if b.name != "core"]
    core = marked("core", figures.CORE_ROWS)
    page = tmp_path / "README.md"
    page.write_text("# page\n\n" + "\n\n".join([core, *others]) + "\n")
    assert figures.problems(tmp_path) == []
    page.write_text(page.read_text().replace("3.0×", "3.5×", 1))  # a number typed over
    [edited] = figures.problems(tmp_path)
    assert "edited by hand" in edited and "'core'" in edited
    # A row the benchmark no longer defines (a payload size it stopped measuring).
    page.write_text("\n".join([marked("core", ["throughput/8/1", "throughput/3000/1"]),
                               *others]))
    [stale] = figures.problems(tmp_path)
    assert "no longer has: throughput/3000/1" in stale
    page.write_text("\n".join(others))
    assert figures.problems(tmp_path) == ["README.md: block 'core' is missing"]
