"""pytest plugin: the ``lockstep`` fixture.

::

    def test_controller_replays(lockstep, tmp_path):
        first = lockstep.run(my_service.main, "logs/drive1", "vehicleState",
                             ["controlCommand"])
        second = lockstep.run(my_service.main, "logs/drive1", "vehicleState",
                              ["controlCommand"])
        lockstep.assert_equal(first, second, tolerances={"controlCommand.accel": 1e-6})

``lockstep.run(...)`` is :func:`msgq.lockstep.run_lockstep`; ``lockstep.start(...)``
returns a started :class:`msgq.lockstep.LockstepProcess` to step by hand; every process
the fixture started is stopped, and its shared memory removed, when the test ends (pass
or fail). ``lockstep.diff`` / ``lockstep.assert_equal`` compare output streams
(:mod:`msgq.lockstep.diff`). Defaults for every run can be set per test:
``lockstep.defaults["step_timeout"] = 30``.

Registration (pick one, not both — pytest refuses a plugin registered twice): the
distribution's entry point ``[project.entry-points.pytest11] msgq_lockstep =
"msgq.lockstep.pytest_plugin"`` (the fixture is then there in every project that has msgq
installed), or ``pytest_plugins = ["msgq.lockstep.pytest_plugin"]`` in the root
``conftest.py``, or ``from msgq.lockstep.pytest_plugin import lockstep`` in one test
module. Importing this module is cheap: the harness loads when the fixture is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pytest

# msgq.lockstep loads its harness and diff on first use of their names (the package's
# __getattr__), so importing the plugin (in every pytest run of a project that installs
# msgq) stays cheap
import msgq.lockstep as api

if TYPE_CHECKING:
    from msgq.lockstep.diff import OutputDiff
    from msgq.lockstep.harness import LockstepProcess, LockstepResult

__all__ = ["Lockstep", "lockstep"]


class Lockstep:
    """What the ``lockstep`` fixture gives a test (see the module docstring)."""

    def __init__(self, **defaults: Any) -> None:
        #: Keyword arguments applied to every run/start unless given there.
        self.defaults: dict[str, Any] = dict(defaults)
        self._processes: list[LockstepProcess] = []

    def run(self, target: Callable[..., Any] | Sequence[str], inputs: Any, trigger: str,
            outputs: Iterable[str], **kwargs: Any) -> LockstepResult:
        """:func:`msgq.lockstep.run_lockstep` with the fixture's defaults."""
        return api.run_lockstep(target, inputs, trigger, outputs, **{**self.defaults, **kwargs})

    def start(self, target: Callable[..., Any] | Sequence[str], trigger: str,
              outputs: Iterable[str] = (), **kwargs: Any) -> LockstepProcess:
        """A started :class:`msgq.lockstep.LockstepProcess` (closed at teardown); what
        it published before its first receive is in ``process.startup``."""
        options = {**self.defaults, **kwargs}
        options.pop("max_steps", None)
        options.pop("input_services", None)
        process = api.LockstepProcess(target, trigger, outputs, **options)
        self._processes.append(process)
        process.start()
        return process

    def diff(self, a: Any, b: Any, **kwargs: Any) -> OutputDiff:
        """:func:`msgq.lockstep.diff_outputs`."""
        return api.diff_outputs(a, b, **kwargs)

    def assert_equal(self, a: Any, b: Any, **kwargs: Any) -> None:
        """:func:`msgq.lockstep.assert_outputs_equal`."""
        api.assert_outputs_equal(a, b, **kwargs)

    def close(self) -> None:
        """Stops every process started through :meth:`start` that is still running."""
        errors = []
        while self._processes:
            process = self._processes.pop()
            try:
                process.close()
            except Exception as e:  # close the others regardless
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def lockstep() -> Iterator[Lockstep]:
    """The lockstep replay harness, with cleanup of what it started (see
    :class:`Lockstep`)."""
    harness = Lockstep()
    try:
        yield harness
    finally:
        harness.close()
