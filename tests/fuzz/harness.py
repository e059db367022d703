"""What every fuzz harness shares: atheris set-up with coverage instrumentation of the
modules under test only (not the whole msgq import), a seed corpus, and a sabotage switch
that proves the harness's assertions can fail.

A harness is a script: ``python tests/fuzz/fuzz_<name>.py [libFuzzer flags] [CORPUS...]``
(``-runs=N``, ``-max_total_time=S``, ``-seed=S``; see libFuzzer's documentation);
``--seeds-into DIR`` writes its seed inputs and exits. ``MSGQ_FUZZ_SABOTAGE=1`` swaps the
parser under test for a lax one that accepts what it should refuse: the harness must then
fail, or its assertions would be worth nothing.
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Iterable
from types import ModuleType

__all__ = ["instrument", "main", "sabotaged"]


def sabotaged() -> bool:
    """Whether this run swaps in the lax parser (MSGQ_FUZZ_SABOTAGE=1)."""
    return os.environ.get("MSGQ_FUZZ_SABOTAGE") == "1"


def instrument(*modules: ModuleType) -> None:
    """Adds atheris's coverage instrumentation to the functions and methods defined in
    ``modules`` (in place: every caller sees the instrumented code)."""
    import atheris

    for module in modules:
        for obj in list(vars(module).values()):
            if inspect.isfunction(obj) and obj.__module__ == module.__name__:
                atheris.instrument_func(obj)
            elif inspect.isclass(obj) and obj.__module__ == module.__name__:
                for member in list(vars(obj).values()):
                    if isinstance(member, (classmethod, staticmethod)):
                        member = member.__func__
                    if inspect.isfunction(member):
                        atheris.instrument_func(member)


def main(test_one_input: Callable[[bytes], None], seeds: Iterable[bytes],
         modules: Iterable[ModuleType]) -> None:
    """Runs the fuzzer on ``test_one_input`` (or writes ``seeds`` with --seeds-into)."""
    argv = list(sys.argv)
    if "--seeds-into" in argv:
        folder = argv[argv.index("--seeds-into") + 1]
        os.makedirs(folder, exist_ok=True)
        for i, seed in enumerate(seeds):
            with open(os.path.join(folder, f"seed-{i:03d}"), "wb") as f:
                f.write(seed)
        return
    import atheris

    atheris.Setup(argv, test_one_input)
    instrument(*modules)
    atheris.Fuzz()
