"""Deterministic lockstep replay: run a process against logged inputs, one step at a time.

The process under test (a Python callable run in a fresh interpreter, or a command) runs
with its sockets wrapped in fake events, in a namespace of its own::

    MSGQ_PREFIX=<unique>  CEREAL_FAKE=1  CEREAL_FAKE_PREFIX=<unique>  MSGQ_BACKEND=msgq
    MSGQ_LOCKSTEP_CLOCK=<clock file>  SIMULATION=1

The harness owns the fake events of one service, the *trigger* (e.g. ``vehicleState``),
so each of the process's receives on it waits at a gate. A step:

1. the process is at its receive on the trigger (``recv_called`` is set); the harness
   clears ``recv_called``;
2. it publishes every input event that precedes the step's trigger event in the log (all
   input services, in log order), then the trigger event itself;
3. it sets the simulated clock to the trigger's ``logMonoTime`` and sets ``recv_ready``:
   the process's receive returns that event;
4. it waits until the process is back at its receive on the trigger (``recv_called``
   again), which means it has handled the step — or it died (its exit is watched through a
   pidfd), or ``step_timeout`` passed;
5. it drains its subscribers of the output services: what the process published during
   the step. Shared-memory sends are complete when ``send`` returns, so nothing is late.

See docs/lockstep.md for how to write a service that replays deterministically.
"""

from __future__ import annotations

import ctypes
import faulthandler
import importlib.util
import os
import pickle
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import msgq
from msgq import fake_events, queues
from msgq.lockstep.clock import CLOCK_ENV, ClockFile
from msgq.logs import LogEvent, LogReader
from msgq.logs.index import read_index
from msgq.logs.reader import segment_paths
from msgq.logs.writer import writes_log_start
from msgq.schemas import Schema, SchemaSpec, schema_in_force, spec_in_force, use_schema
from msgq.schemas.events import MessageDecodeError, log_from_bytes
from msgq.schemas.selection import ENV_ROOT, ENV_SCHEMA, ENV_SERVICES
from msgq.schemas.services import unknown_service_error

__all__ = [
    "InputEvent",
    "LockstepError",
    "LockstepProcess",
    "LockstepProcessError",
    "LockstepResult",
    "LockstepTimeoutError",
    "OutputEvent",
    "StepOutput",
    "input_events",
    "remove_stale_runs",
    "run_lockstep",
]

#: Characters of the process's captured output quoted in errors.
OUTPUT_TAIL_CHARS = 4000
#: Characters of captured output kept after the process ended.
OUTPUT_KEEP_CHARS = 64 * 1024
#: Step number of events published before the first step.
STARTUP = -1


# --- errors ------------------------------------------------------------------------------

class LockstepError(RuntimeError):
    """The process under test did not complete a step. ``step``: the step index (None
    before the first one); ``output``: the end of what it printed."""

    def __init__(self, message: str, step: int | None = None, output: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.output = output


class LockstepProcessError(LockstepError):
    """The process under test exited (crashed, or returned) instead of coming back to
    receive; ``exit_code`` is its exit status (negative: killed by that signal)."""

    def __init__(self, message: str, exit_code: int | None, step: int | None = None,
                 output: str = "") -> None:
        super().__init__(message, step, output)
        self.exit_code = exit_code


class LockstepTimeoutError(LockstepError, TimeoutError):
    """The process under test did not come back to receive within the time allowed."""


# --- events ------------------------------------------------------------------------------

@dataclass(frozen=True)
class InputEvent:
    """One input event as published: its service, logMonoTime and bytes."""

    service: str
    mono_ns: int
    data: bytes


@dataclass(frozen=True)
class OutputEvent:
    """One event the process under test published. ``step`` is the step during which it
    was published (``STARTUP`` = -1 before the first). ``event`` decodes it."""

    service: str
    data: bytes
    mono_ns: int
    step: int
    schema: Schema | None = field(default=None, repr=False, compare=False)

    @property
    def event(self) -> Any:
        """The decoded Event (a pycapnp reader)."""
        return log_from_bytes(self.data, schema_in_force(self.schema).event)

    def to_dict(self) -> dict[str, Any]:
        """The decoded Event as a dict."""
        return dict(self.event.to_dict())


@dataclass
class StepOutput:
    """What one step published. ``index`` counts steps from 0; ``mono_ns`` is the trigger
    event's logMonoTime (the simulated time of the step); ``inputs`` the number of events
    published for it (the trigger included)."""

    index: int
    mono_ns: int
    inputs: int
    events: list[OutputEvent]

    def of(self, service: str) -> list[OutputEvent]:
        """The events of ``service`` published in this step."""
        return [e for e in self.events if e.service == service]


@dataclass
class LockstepResult:
    """The outputs of a lockstep run, per step."""

    trigger: str
    outputs: tuple[str, ...]
    steps: list[StepOutput]
    startup: list[OutputEvent]
    exit_code: int | None = None
    output: str = ""
    unused_inputs: int = 0

    @property
    def events(self) -> list[OutputEvent]:
        """Every output event in order: startup first, then step by step."""
        return self.startup + [e for s in self.steps for e in s.events]

    def by_service(self, service: str) -> list[OutputEvent]:
        """Every output event of ``service``, in order."""
        return [e for e in self.events if e.service == service]

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[StepOutput]:
        return iter(self.steps)


def _to_input(item: Any, schema: Schema) -> InputEvent:
    if isinstance(item, InputEvent):
        return item
    if isinstance(item, LogEvent):
        return InputEvent(item.service, item.mono_ns, item.data)
    if isinstance(item, OutputEvent):
        return InputEvent(item.service, item.mono_ns, item.data)
    if isinstance(item, (bytes, bytearray, memoryview)):
        data = bytes(item)
        identity = schema.layout.identify(data)
        if identity is None:
            raise MessageDecodeError(f"{len(data)} bytes are not exactly one valid Event")
        return InputEvent(identity[2], identity[0], data)
    if hasattr(item, "which") and hasattr(item, "to_bytes"):  # an Event builder
        return InputEvent(str(item.which()), int(item.logMonoTime), item.to_bytes())
    if hasattr(item, "which") and hasattr(item, "as_builder"):  # an Event reader
        return InputEvent(str(item.which()), int(item.logMonoTime),
                          item.as_builder().to_bytes())
    raise TypeError("an input event must be the bytes of an Event, an Event reader or "
                    f"builder, or a LogEvent, not {type(item).__name__}")


def input_events(inputs: Any, schema: Schema | None = None) -> Iterator[InputEvent]:
    """The events of ``inputs`` in log order: a log file, folder or glob (path), a
    :class:`~msgq.logs.LogReader`, or an iterable of events (bytes, Event readers or
    builders, LogEvents). Logs are streamed, never read whole."""
    schema = schema_in_force(schema)
    if isinstance(inputs, (str, os.PathLike)):
        inputs = LogReader(inputs, schema=schema)
    if isinstance(inputs, LogReader):
        for raw in inputs.raw():
            yield InputEvent(raw.service, raw.mono_ns, raw.data)
        return
    if isinstance(inputs, (bytes, bytearray, memoryview)):
        raise TypeError("inputs must be a log path, a LogReader or an iterable of events, "
                        "not the bytes of one event (wrap it in a list)")
    for item in inputs:
        yield _to_input(item, schema)


# --- the child process -------------------------------------------------------------------

# Runs a command with PR_SET_PDEATHSIG (it survives exec): if the harness dies, so does
# the process under test. argv: parent pid, then the command.
_EXEC_BOOTSTRAP = """\
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
except (AttributeError, OSError):
    pass
if os.getppid() != int(sys.argv[1]):
    os._exit(70)
try:
    os.execvp(sys.argv[2], sys.argv[2:])
except OSError as e:
    sys.stderr.write(f"cannot run {sys.argv[2]!r}: {e}\\n")
    os._exit(127)
"""

# Runs a pickled Python callable: the payload file holds the parent's sys.path, then the
# call. sys.path comes first so the callable's module imports as it did in the parent.
_PYTHON_BOOTSTRAP = """\
import pickle, sys
with open(sys.argv[1], "rb") as f:
    sys.path[:] = pickle.load(f)
from msgq.lockstep.harness import _child_main
_child_main(sys.argv[1])
"""


def _die_with_parent(parent_pid: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (AttributeError, OSError):
        pass
    if os.getppid() != parent_pid:
        os._exit(70)


def _load_main_module(path: str) -> None:
    """Imports the parent's ``__main__`` script as ``__mp_main__`` (its ``if __name__ ==
    "__main__"`` block does not run), so callables defined there unpickle."""
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the main script {path!r}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    spec.loader.exec_module(module)


def _child_main(payload_path: str) -> None:
    """Entry point of a Python target's process (see _PYTHON_BOOTSTRAP)."""
    with open(payload_path, "rb") as f:
        pickle.load(f)  # sys.path, already applied
        spec = pickle.load(f)
    _die_with_parent(spec["parent_pid"])

    faulthandler.enable()
    if hasattr(faulthandler, "register"):  # the harness asks for the stacks on timeout
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    _use_parent_schema(spec.get("schema"))
    if spec["main_path"]:
        _load_main_module(spec["main_path"])
    target, args, kwargs = pickle.loads(spec["call"])
    sys.argv = [spec["name"]]
    target(*args, **kwargs)


def _use_parent_schema(schema_spec: SchemaSpec | None) -> None:
    """Puts the harness's schema in force in the process under test, rebuilt from its
    pickled spec (the environment names it too, unless its registry was given in code;
    nothing is loaded when the environment already says the same)."""
    if schema_spec is None or spec_in_force() == schema_spec:
        return
    use_schema(schema_spec.load())


def _qualified_name(target: Callable[..., Any]) -> str:
    module = getattr(target, "__module__", None) or "?"
    name = getattr(target, "__qualname__", None) or type(target).__name__
    return f"{module}:{name}"


def _python_payload(target: Callable[..., Any], args: Sequence[Any],
                    kwargs: Mapping[str, Any]) -> tuple[list[str], dict[str, Any]]:
    try:
        call = pickle.dumps((target, tuple(args), dict(kwargs)))
    except Exception as e:
        raise TypeError(
            f"the target {_qualified_name(target)} and its arguments must be picklable to "
            f"run in a new process (a module-level function, not a lambda or a nested "
            f"function): {e}") from None
    main_path = None
    if getattr(target, "__module__", None) == "__main__":
        main_path = getattr(sys.modules["__main__"], "__file__", None)
        if main_path is None:
            raise TypeError(f"the target {_qualified_name(target)} is defined in an "
                            "interactive __main__; move it into a module")
        main_path = os.path.abspath(main_path)
    spec = {"parent_pid": os.getpid(), "main_path": main_path, "call": call,
            "name": _qualified_name(target)}
    return list(sys.path), spec


# --- the harness -------------------------------------------------------------------------

#: Variables the harness sets for the process under test; ``env`` may not change them.
HARNESS_VARIABLES = ("MSGQ_PREFIX", "OPENPILOT_PREFIX", "CEREAL_FAKE", "CEREAL_FAKE_PREFIX",
                     "MSGQ_BACKEND", "ZMQ", CLOCK_ENV)


def _apply(env: MutableMapping[str, str], changes: Mapping[str, str | None]) -> None:
    """Sets the variables of ``changes`` in ``env``; a None value removes one."""
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


@contextmanager
def _environment(changes: Mapping[str, str | None]) -> Iterator[None]:
    """Sets (None: unsets) variables of this process while sockets and handles of the
    run's namespace are made; the sockets keep their namespace afterwards."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _apply(os.environ, changes)
        yield
    finally:
        _apply(os.environ, saved)


def _signal_name(code: int | None) -> str:
    if code is None or code >= 0:
        return ""
    try:
        return f" ({signal.Signals(-code).name})"
    except ValueError:
        return f" (signal {-code})"


def _check_service(schema: Schema, service: str) -> str:
    if service not in schema.union_fields:
        raise unknown_service_error(service, schema.union_fields)
    return service


class LockstepProcess:
    """One process under test, driven step by step (the engine of :func:`run_lockstep`).

    ``target``: a picklable Python callable (run as ``target(*args, **kwargs)`` in a new
    interpreter with the parent's ``sys.path``), or a command as a list of strings.
    ``trigger``: the service whose receives are gated. ``outputs``: the services collected.
    ``env``: extra variables for the process (a None value unsets one).
    ``simulation``: sets ``SIMULATION=1`` (SubMaster's alive/freq checks then do not
    depend on real time); False unsets it, None leaves the environment as it is.
    ``capture_output``: the process's stdout and stderr go to a file whose end is quoted
    in errors and kept in :attr:`output` (False: they are inherited).

    Use as a context manager, or call :meth:`start` and :meth:`close`. Errors in
    :meth:`start` or :meth:`step` close the process before they are raised.
    """

    def __init__(
        self,
        target: Callable[..., Any] | Sequence[str],
        trigger: str,
        outputs: Iterable[str] = (),
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        env: Mapping[str, str | None] | None = None,
        step_timeout: float = 10.0,
        startup_timeout: float = 60.0,
        shutdown_timeout: float = 5.0,
        simulation: bool | None = True,
        capture_output: bool = True,
        cwd: str | os.PathLike[str] | None = None,
        start_mono_ns: int = 0,
        wall_offset_ns: int = 0,
        schema: Schema | None = None,
    ) -> None:
        self.schema = schema_in_force(schema)
        self.trigger = _check_service(self.schema, trigger)
        self.outputs = tuple(dict.fromkeys(_check_service(self.schema, s) for s in outputs))
        if self.trigger in self.outputs:
            raise ValueError(f"the trigger {trigger!r} cannot also be an output service")
        for name in HARNESS_VARIABLES:
            if env is not None and name in env:
                raise ValueError(f"env may not set {name}: the harness sets it for the "
                                 "process under test")
        if step_timeout <= 0 or startup_timeout <= 0 or shutdown_timeout < 0:
            raise ValueError("timeouts must be positive")
        self._python = callable(target)
        if self._python:
            self._payload = _python_payload(target, args, dict(kwargs or {}))  # type: ignore[arg-type]
            self.name = _qualified_name(target)  # type: ignore[arg-type]
            self._argv: list[str] = []
        elif isinstance(target, (list, tuple)) and target and all(
                isinstance(a, (str, os.PathLike)) for a in target):
            if args or kwargs:
                raise ValueError("args and kwargs apply to a Python callable target; put "
                                 "a command's arguments in its argv")
            self._argv = [os.fspath(a) for a in target]
            self.name = " ".join(self._argv)
        else:
            raise TypeError("target must be a Python callable or a command (a non-empty "
                            f"list of strings), not {target!r}")
        self.env = {name: None if value is None else str(value)
                    for name, value in (env or {}).items()}
        self.step_timeout = float(step_timeout)
        self.startup_timeout = float(startup_timeout)
        self.shutdown_timeout = float(shutdown_timeout)
        self.simulation = simulation
        self.capture_output = capture_output
        self.cwd = None if cwd is None else os.fspath(cwd)
        self._start_mono_ns = int(start_mono_ns)
        self._wall_offset_ns = int(wall_offset_ns)

        token = uuid.uuid4().hex[:12]
        parent = os.environ.get("MSGQ_PREFIX") or os.environ.get("OPENPILOT_PREFIX") or ""
        run = f"lockstep-{os.getpid()}-{token}"
        #: The namespace (MSGQ_PREFIX) of the run: its queues, fake events and clock.
        self.namespace = f"{parent[:60]}.{run}" if parent else run
        #: The fake-event identifier (CEREAL_FAKE_PREFIX) of the run.
        self.identifier = f"lockstep-{token}"
        self.queue_dir = ""
        self.steps_done = 0
        self.exit_code: int | None = None
        self.output = ""
        self.started = False
        self.closed = False
        #: What the process published before its first receive on the trigger.
        self.startup: list[OutputEvent] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._handle: fake_events.SocketEventHandle | None = None
        self._called: fake_events.Event | None = None
        self._ready: fake_events.Event | None = None
        self._clock: ClockFile | None = None
        self._pubs: dict[str, Any] = {}
        self._subs: dict[str, Any] = {}
        self._pidfd = -1
        self._workdir = ""
        self._capture: IO[bytes] | None = None
        self._made_queue_dir = False

    # -- lifecycle --------------------------------------------------------------------

    def _namespace_env(self) -> AbstractContextManager[None]:
        return _environment({"MSGQ_PREFIX": self.namespace, "OPENPILOT_PREFIX": None,
                             "CEREAL_FAKE": None, "CEREAL_FAKE_PREFIX": None,
                             "MSGQ_BACKEND": "msgq", "ZMQ": None})

    def _child_env(self, clock_path: str) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("PYTHONFAULTHANDLER", "1")
        if self.simulation is True:
            env["SIMULATION"] = "1"
        elif self.simulation is False:
            env.pop("SIMULATION", None)
        _apply(env, self.env)
        env.pop("ZMQ", None)
        try:  # the harness's schema, for commands (Python targets get its spec pickled)
            schema_env = self.schema.spec.environment()
        except ValueError:  # a registry given in code: no file to name
            schema_env = None
        if schema_env is not None and not any(name in self.env for name in
                                              (ENV_SCHEMA, ENV_SERVICES, ENV_ROOT)):
            for name in (ENV_SCHEMA, ENV_SERVICES, ENV_ROOT):
                env.pop(name, None)
            env.update(schema_env)
        env.update({
            "MSGQ_PREFIX": self.namespace,
            "OPENPILOT_PREFIX": self.namespace,
            "CEREAL_FAKE": "1",
            "CEREAL_FAKE_PREFIX": self.identifier,
            "MSGQ_BACKEND": "msgq",
            CLOCK_ENV: clock_path,
        })
        return env

    def start(self) -> list[OutputEvent]:
        """Starts the process and waits until it receives on the trigger for the first
        time; returns what it published until then."""
        if self.started:
            raise RuntimeError("the process was started already")
        self.started = True
        try:
            self.startup = self._start()
            return self.startup
        except BaseException:
            self.close()
            raise

    def _start(self) -> list[OutputEvent]:
        self._workdir = tempfile.mkdtemp(prefix=f"msgq-lockstep-{os.getpid()}-")
        with self._namespace_env():
            self.queue_dir = queues.queue_dir(create=False)
            self._made_queue_dir = not os.path.exists(self.queue_dir)
            queues.queue_dir(create=True)
            self._handle = msgq.fake_event_handle(self.trigger, identifier=self.identifier,
                                                  enable=True)
            self._called = self._handle.recv_called_event
            self._ready = self._handle.recv_ready_event
            for service in self.outputs:  # before the process exists: nothing is missed
                self._subs[service] = msgq.sub_sock(service, conflate=False)
            self._publisher(self.trigger)
        clock_path = os.path.join(self.queue_dir, f"msgq-lockstep.{self.identifier}.clock")
        self._clock = ClockFile(clock_path, self._start_mono_ns, self._wall_offset_ns)

        if self._python:
            path = os.path.join(self._workdir, "target.pickle")
            sys_path, spec = self._payload
            with open(path, "wb") as f:
                pickle.dump(sys_path, f)
                pickle.dump({**spec, "schema": self.schema.spec}, f)
            argv = [sys.executable, "-c", _PYTHON_BOOTSTRAP, path]
        else:
            argv = [sys.executable, "-c", _EXEC_BOOTSTRAP, str(os.getpid()), *self._argv]
        if self.capture_output:
            self._capture = open(os.path.join(self._workdir, "output"), "w+b")  # noqa: SIM115
        self.process = subprocess.Popen(
            argv, env=self._child_env(clock_path), cwd=self.cwd, stdin=subprocess.DEVNULL,
            stdout=self._capture, stderr=subprocess.STDOUT if self._capture else None,
            start_new_session=True, close_fds=True)
        try:
            self._pidfd = os.pidfd_open(self.process.pid)
        except (AttributeError, OSError):
            self._pidfd = -1
        self._wait_back(self.startup_timeout, None, None)
        return self._drain(STARTUP)

    def _publisher(self, service: str) -> Any:
        pub = self._pubs.get(service)
        if pub is None:
            if service in self.outputs:
                raise ValueError(f"{service!r} is an output of the process under test; it "
                                 "cannot be published as an input too")
            with self._namespace_env():
                pub = self._pubs[service] = msgq.pub_sock(service)
        return pub

    def publish(self, event: InputEvent | Any) -> None:
        """Publishes an input event now, without stepping (the process reads it at its
        next step). Bytes, Event readers/builders and LogEvents are taken too."""
        self._check_running()
        event = _to_input(event, self.schema)
        self._publisher(event.service).send(event.data)

    def set_wall_offset(self, offset_ns: int) -> None:
        """Sets ``wall - monotonic`` of the simulated clock (see msgq.lockstep.clock)."""
        self._wall_offset_ns = int(offset_ns)
        if self._clock is not None:
            self._clock.set_wall_offset(self._wall_offset_ns)

    def step(self, trigger_event: InputEvent | Any,
             before: Iterable[InputEvent | Any] = ()) -> StepOutput:
        """One step: publishes ``before`` (in order) and ``trigger_event``, lets the
        process's receive return, waits until it receives again, and returns what it
        published meanwhile."""
        self._check_running()
        trigger = _to_input(trigger_event, self.schema)
        if trigger.service != self.trigger:
            raise ValueError(f"a step is triggered by a {self.trigger!r} event, not "
                             f"{trigger.service!r}")
        assert self._called is not None and self._ready is not None and self._clock is not None
        index = self.steps_done
        try:
            self._called.clear()
            count = 0
            for item in before:
                event = _to_input(item, self.schema)
                self._publisher(event.service).send(event.data)
                count += 1
            self._publisher(self.trigger).send(trigger.data)
            self._clock.set(trigger.mono_ns, step=index + 1)
            self._ready.set()
            self._wait_back(self.step_timeout, index, trigger)
            events = self._drain(index)
        except BaseException:
            self.close()
            raise
        self.steps_done += 1
        return StepOutput(index, trigger.mono_ns, count + 1, events)

    def close(self) -> int | None:
        """Stops the process (SIGTERM to its process group, SIGKILL after
        ``shutdown_timeout``), removes the run's shared memory, fake events, clock and
        temporary files. Returns the exit status. Safe to call twice."""
        if self.closed:
            return self.exit_code
        self.closed = True
        try:
            self._stop_process()
        finally:
            self._release()
        return self.exit_code

    def __enter__(self) -> LockstepProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if not self.closed and getattr(self, "process", None) is not None:
                self.close()
        except Exception:
            pass

    @property
    def pid(self) -> int | None:
        """The process id of the process under test (None before start)."""
        return None if self.process is None else self.process.pid

    @property
    def clock_ns(self) -> int:
        """The simulated time the process reads now."""
        return self._clock.monotonic_ns if self._clock is not None else self._start_mono_ns

    # -- waiting ----------------------------------------------------------------------

    def _check_running(self) -> None:
        if not self.started or self.closed:
            raise RuntimeError("the lockstep process is not running (call start(); after "
                               "close() or an error, make a new one)")

    def _exited(self) -> bool:
        assert self.process is not None
        if self._pidfd >= 0:
            return select.select([self._pidfd], [], [], 0)[0] != []
        try:
            info = os.waitid(os.P_PID, self.process.pid,
                             os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return info is not None

    def _wait_back(self, timeout: float, index: int | None, trigger: InputEvent | None) -> None:
        """Waits until the process sets recv_called (it is at its receive on the trigger);
        raises when it exits first or the time passes."""
        assert self._called is not None
        poller = select.poll()
        poller.register(self._called.fd, select.POLLIN)
        if self._pidfd >= 0:
            poller.register(self._pidfd, select.POLLIN)
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            slice_s = remaining if self._pidfd >= 0 else min(remaining, 0.05)
            ready = {fd for fd, _ in poller.poll(slice_s * 1000)}
            if self._called.fd in ready:
                return
            if self._exited():
                raise self._crash_error(index, trigger)
            if time.monotonic() >= deadline:
                raise self._timeout_error(timeout, index, trigger)

    def _where(self, index: int | None, trigger: InputEvent | None) -> str:
        if index is None or trigger is None:
            return f"before its first receive on {self.trigger!r}"
        return (f"during step {index} ({self.trigger} event at logMonoTime "
                f"{trigger.mono_ns})")

    def _crash_error(self, index: int | None, trigger: InputEvent | None) -> LockstepError:
        code = self._reap()
        output = self._read_output()
        what = "exited normally" if code == 0 else "crashed"
        message = (f"the process under test ({self.name}, pid {self.pid}) {what} with exit "
                   f"code {code}{_signal_name(code)} {self._where(index, trigger)}")
        message += self._tail_text(output)
        self.close()
        return LockstepProcessError(message, code, index, self._tail(output))

    def _timeout_error(self, timeout: float, index: int | None,
                       trigger: InputEvent | None) -> LockstepError:
        if self._python and self.process is not None and self._capture is not None:
            self._dump_stacks()
        output = self._read_output()
        if index is None:
            message = (f"the process under test ({self.name}, pid {self.pid}) did not "
                       f"receive on {self.trigger!r} within {timeout:g} s of starting "
                       "(startup_timeout): does it subscribe to the trigger and receive on "
                       "it, e.g. SubMaster([...], poll=trigger)?")
        else:
            message = (f"step {index} timed out: the process under test ({self.name}, pid "
                       f"{self.pid}) did not come back to receive on {self.trigger!r} within "
                       f"{timeout:g} s (step_timeout) {self._where(index, trigger)}; it is "
                       "stuck, waiting for something else, or slower than step_timeout")
        message += self._tail_text(output)
        self.close()
        return LockstepTimeoutError(message, index, self._tail(output))

    def _dump_stacks(self) -> None:
        """Asks a Python target for its threads' stacks (faulthandler on SIGUSR1) and
        waits until they are written."""
        assert self.process is not None and self._capture is not None
        before = os.fstat(self._capture.fileno()).st_size
        try:
            os.kill(self.process.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 2.0
        size, stable_since = before, time.monotonic()
        while time.monotonic() < deadline and not self._exited():
            now_size = os.fstat(self._capture.fileno()).st_size
            if now_size != size:
                size, stable_since = now_size, time.monotonic()
            elif size > before and time.monotonic() - stable_since > 0.1:
                return
            time.sleep(0.01)

    # -- output -----------------------------------------------------------------------

    def _drain(self, index: int) -> list[OutputEvent]:
        events = []
        for service in self.outputs:
            for data in msgq.drain_sock_raw(self._subs[service]):
                identity = self.schema.layout.identify(data)
                # garbage is kept as published (at time 0); a diff will show it
                mono = 0 if identity is None else identity[0]
                events.append(OutputEvent(service, data, mono, index, self.schema))
        return events

    def _read_output(self) -> str:
        if self._capture is None or self._capture.closed:
            return self.output
        self._capture.flush()
        size = os.fstat(self._capture.fileno()).st_size
        start = max(0, size - OUTPUT_KEEP_CHARS)
        data = os.pread(self._capture.fileno(), size - start, start)
        self.output = data.decode("utf-8", "replace")
        return self.output

    @staticmethod
    def _tail(output: str) -> str:
        return output[-OUTPUT_TAIL_CHARS:]

    def _tail_text(self, output: str) -> str:
        tail = self._tail(output).rstrip()
        if not self.capture_output:
            return " (its output was not captured: see the terminal)"
        if not tail:
            return "; it printed nothing"
        return f"; the end of its output:\n{tail}"

    # -- cleanup ----------------------------------------------------------------------

    def _wait_exit(self, timeout: float) -> bool:
        """Waits (without reaping) until the process exited; True when it did."""
        deadline = time.monotonic() + timeout
        while not self._exited():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self._pidfd >= 0:
                select.select([self._pidfd], [], [], remaining)
            else:
                time.sleep(min(0.02, remaining))
        return True

    def _kill_group(self, sig: int) -> None:
        assert self.process is not None
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _reap(self) -> int | None:
        """Kills what is left of the process group while the leader's pid is still
        reserved (exited, not reaped), then reaps the leader."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self._kill_group(signal.SIGKILL)
            self.process.wait()
        self.exit_code = self.process.returncode
        return self.exit_code

    def _stop_process(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        if not self._exited():
            self._kill_group(signal.SIGTERM)
            if not self._wait_exit(self.shutdown_timeout):
                self._kill_group(signal.SIGKILL)
                self._wait_exit(self.shutdown_timeout + 5.0)
        self._reap()

    def _release(self) -> None:
        self._read_output()
        if self._capture is not None:
            self._capture.close()
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1
        for sock in [*self._subs.values(), *self._pubs.values()]:
            sock.close()
        self._subs.clear()
        self._pubs.clear()
        self._called = self._ready = None
        if self._handle is not None:
            self._handle.close()
            self._handle = None
        if self._clock is not None:
            self._clock.close()
        if self.queue_dir and self._made_queue_dir:
            shutil.rmtree(self.queue_dir, ignore_errors=True)
        if self._workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)


# --- after a crash of the harness ----------------------------------------------------------

_RUN_NAME = re.compile(r"(?:^|\.)lockstep-(\d+)-[0-9a-f]{12}$")
_WORKDIR_NAME = re.compile(r"^msgq-lockstep-(\d+)-")


def remove_stale_runs(shm_dir: str | None = None, temp_dir: str | None = None) -> list[str]:
    """Removes what harnesses that died without closing left behind (a run's namespace
    folder in ``shm_dir``, default ``$MSGQ_SHM_DIR`` or ``/dev/shm``, and its temporary
    folder in ``temp_dir``, default the system's), when the harness process is gone.
    Returns the paths removed."""
    removed = []
    places = [(shm_dir or os.environ.get("MSGQ_SHM_DIR") or "/dev/shm", _RUN_NAME),
              (temp_dir or tempfile.gettempdir(), _WORKDIR_NAME)]
    for folder, pattern in places:
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            continue
        for name in names:
            match = pattern.search(name)
            path = os.path.join(folder, name)
            owner_gone = match is not None and not queues.process_alive(int(match.group(1)))
            if owner_gone and os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


# --- the one-call API --------------------------------------------------------------------

class _StepPlan:
    """Groups the input events into steps: each trigger event with the inputs before it."""

    def __init__(self, events: Iterator[InputEvent], trigger: str,
                 wanted: Callable[[str], bool], schema: Schema,
                 wall_offset_ns: int = 0) -> None:
        self._events = events
        self._trigger = trigger
        self._wanted = wanted
        self._schema = schema
        self._log_start_name = "logStart" if writes_log_start(schema) else None
        self.first_mono_ns: int | None = None
        self.wall_offset_ns = wall_offset_ns
        self.unused = 0
        self.seen: dict[str, int] = {}

    def _log_start(self, event: InputEvent) -> None:
        try:
            start = log_from_bytes(event.data, self._schema.event).logStart
            self.wall_offset_ns = int(start.wallTimeNs) - int(start.monoTimeNs)
        except Exception:
            pass  # an unreadable logStart changes nothing but the wall-clock offset

    def __iter__(self) -> Iterator[tuple[list[InputEvent], InputEvent]]:
        before: list[InputEvent] = []
        for event in self._events:
            if self.first_mono_ns is None:
                self.first_mono_ns = event.mono_ns
            self.seen[event.service] = self.seen.get(event.service, 0) + 1
            if event.service == self._log_start_name:
                self._log_start(event)
            if event.service == self._trigger:
                yield before, event
                before = []
            elif self._wanted(event.service):
                before.append(event)
        self.unused = len(before)


def _index_wall_offset(inputs: Any) -> int:
    """``wall - monotonic`` at the start of the first segment of a recording, from its
    index (what a logStart event says, for schemas without one); 0 when unknown."""
    if isinstance(inputs, LogReader):
        paths = inputs.paths
    elif isinstance(inputs, (str, os.PathLike)):
        try:
            paths = segment_paths(inputs)
        except FileNotFoundError:
            return 0
    else:
        return 0
    if not paths:
        return 0
    first = paths[0]
    for entry in read_index(os.path.dirname(first)) or []:
        start = entry.start
        if entry.file == os.path.basename(first) and isinstance(start, dict):
            try:
                return int(start["wall_time_ns"]) - int(start["mono_time_ns"])
            except (KeyError, TypeError, ValueError):
                return 0
    return 0


def run_lockstep(
    target: Callable[..., Any] | Sequence[str],
    inputs: Any,
    trigger: str,
    outputs: Iterable[str],
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    input_services: Iterable[str] | None = None,
    env: Mapping[str, str | None] | None = None,
    step_timeout: float = 10.0,
    startup_timeout: float = 60.0,
    shutdown_timeout: float = 5.0,
    max_steps: int | None = None,
    simulation: bool | None = True,
    capture_output: bool = True,
    cwd: str | os.PathLike[str] | None = None,
    schema: Schema | None = None,
) -> LockstepResult:
    """Replays ``inputs`` through ``target`` in lockstep and returns what it published.

    ``target``: a picklable Python callable (``target(*args, **kwargs)`` in a new
    interpreter) or a command (list of strings). ``inputs``: a log path (file, folder,
    glob), a LogReader, or an iterable of events, in log order. ``trigger``: the service
    whose events make the steps. ``outputs``: the services collected.
    ``input_services``: the services published (default: every service of the inputs
    except the outputs and ``logStart``); the trigger always is. ``max_steps``: stop
    after that many steps. Input events after the last trigger event are not published
    (counted in ``unused_inputs``). ``step_timeout``, ``startup_timeout`` and
    ``shutdown_timeout`` are in seconds. The other arguments: see
    :class:`LockstepProcess`.

    Raises :class:`LockstepProcessError` when the process exits during the run,
    :class:`LockstepTimeoutError` when a step (or the start) takes too long, ValueError
    when the inputs hold no trigger event. The process and everything the run made in
    shared memory are gone when this returns or raises.
    """
    schema = schema_in_force(schema)
    _check_service(schema, trigger)
    outputs = tuple(dict.fromkeys(outputs))
    if input_services is None:
        excluded = set(outputs) | ({"logStart"} if writes_log_start(schema) else set())

        def wanted(service: str) -> bool:
            return service not in excluded
    else:
        chosen = {_check_service(schema, s) for s in input_services}
        clash = chosen & set(outputs)
        if clash:
            raise ValueError(f"services {sorted(clash)} are both inputs and outputs")

        def wanted(service: str) -> bool:
            return service in chosen
    if max_steps is not None and max_steps < 1:
        raise ValueError("max_steps must be at least 1 (or None)")

    plan = _StepPlan(input_events(inputs, schema), trigger, wanted, schema,
                     _index_wall_offset(inputs))
    steps = iter(plan)
    first = next(steps, None)  # before starting anything: the inputs may hold no step
    if first is None:
        seen = ", ".join(f"{s} ({n})" for s, n in sorted(plan.seen.items())) or "none"
        raise ValueError(f"the inputs hold no {trigger!r} event, so there is no step to "
                         f"run (services in the inputs: {seen})")

    process = LockstepProcess(
        target, trigger, outputs, args=args, kwargs=kwargs, env=env,
        step_timeout=step_timeout, startup_timeout=startup_timeout,
        shutdown_timeout=shutdown_timeout, simulation=simulation,
        capture_output=capture_output, cwd=cwd, start_mono_ns=plan.first_mono_ns or 0,
        wall_offset_ns=plan.wall_offset_ns, schema=schema)
    with process:
        startup = process.start()
        results: list[StepOutput] = []
        wall_offset = plan.wall_offset_ns
        pending: tuple[list[InputEvent], InputEvent] | None = first
        while pending is not None:
            if plan.wall_offset_ns != wall_offset:
                wall_offset = plan.wall_offset_ns
                process.set_wall_offset(wall_offset)
            before, event = pending
            results.append(process.step(event, before))
            if max_steps is not None and len(results) >= max_steps:
                break
            pending = next(steps, None)
        exit_code = process.close()
    return LockstepResult(trigger, outputs, results, startup, exit_code, process.output,
                          plan.unused)
