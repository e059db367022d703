"""openpilot's ``cereal`` over msgq: code that does ::

    from cereal import log, car, custom
    import cereal.messaging as messaging
    from cereal.services import SERVICE_LIST

runs unchanged, with the schema (``log.capnp``) and services (``services.py``) of a cereal
checkout in force for every layer of msgq. In the program, before anything imports
cereal::

    from msgq.compat.cereal import install
    install("/path/to/openpilot/cereal")   # the folder with log.capnp and services.py

or, for every process started with it on its path (child processes too)::

    python -m msgq.compat.cereal /path/to/openpilot/cereal /tmp/cereal-shim
    PYTHONPATH=/tmp/cereal-shim python program.py

:func:`install` calls ``msgq.schemas.use_schema(<checkout>/log.capnp,
<checkout>/services.py)`` and puts these modules in ``sys.modules`` (nothing of cereal
is copied; its files are read where they lie):

* ``cereal`` — a package with ``log``, ``car`` and ``custom`` (the checkout's schema
  files, loaded once: a file pycapnp already loaded is reused) and ``CEREAL_PATH``; its
  ``__path__`` ends with the checkout, so its pure-Python submodules
  (``cereal.messaging.tests``, ...) import from there;
* ``cereal.services`` — the checkout's own ``services.py``, imported as it is: its
  ``SERVICE_LIST`` holds its own ``Service`` objects (``port``, ``frequency``,
  ``should_log``, ``decimation``);
* ``cereal.messaging`` — the names of cereal's messaging module, bound to msgq's
  (:data:`MESSAGING_NAMES`): the socket API of :mod:`msgq` and the cereal-style API of
  :mod:`msgq.messaging`; ``MessagingError`` is :class:`msgq.IpcError`;
* ``cereal.visionipc`` (when the checkout has one) — :mod:`msgq.visionipc`'s
  ``VisionIpcServer``, ``VisionIpcClient``, ``VisionBuf``, ``VisionStreamType`` and
  ``get_endpoint_name``, imported at first use.

``scripts/cereal-tests.sh`` runs cereal's own messaging tests this way; docs/compat.md
lists what differs.

Layer: a tool — over :mod:`msgq.messaging`, :mod:`msgq.visionipc` (at first use), the
package's socket API and the Event layer.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

import msgq
import msgq.messaging
from msgq.fake_events import cereal_fake_event_handle
from msgq.schemas import use_schema
from msgq.schemas.schema import load_module

__all__ = ["MESSAGING_NAMES", "SCHEMA_MODULES", "VISIONIPC_NAMES", "install", "main",
           "write_shim"]

#: The schema files cereal's ``__init__`` loads, as the attributes of ``cereal`` (``log``
#: is required; the others are loaded when the checkout has them).
SCHEMA_MODULES = ("log", "car", "custom")

#: Every public name of cereal's messaging module and where msgq keeps it.
MESSAGING_NAMES: dict[str, Any] = {
    "Context": msgq.Context,
    "Poller": msgq.Poller,
    "SubSocket": msgq.SubSocket,
    "PubSocket": msgq.PubSocket,
    "SocketEventHandle": msgq.SocketEventHandle,
    "toggle_fake_events": msgq.toggle_fake_events,
    "set_fake_prefix": msgq.set_fake_prefix,
    "get_fake_prefix": msgq.get_fake_prefix,
    "delete_fake_prefix": msgq.delete_fake_prefix,
    "wait_for_one_event": msgq.wait_for_one_event,
    "MultiplePublishersError": msgq.MultiplePublishersError,
    "MessagingError": msgq.IpcError,
    "fake_event_handle": cereal_fake_event_handle,
    "NO_TRAVERSAL_LIMIT": msgq.NO_TRAVERSAL_LIMIT,
    "context": msgq.context,
    "pub_sock": msgq.messaging.pub_sock,
    "sub_sock": msgq.messaging.sub_sock,
    "drain_sock_raw": msgq.messaging.drain_sock_raw,
    "drain_sock": msgq.messaging.drain_sock,
    "recv_sock": msgq.messaging.recv_sock,
    "recv_one": msgq.messaging.recv_one,
    "recv_one_or_none": msgq.messaging.recv_one_or_none,
    "recv_one_retry": msgq.messaging.recv_one_retry,
    "log_from_bytes": msgq.messaging.log_from_bytes,
    "new_message": msgq.messaging.new_message,
    "SubMaster": msgq.messaging.SubMaster,
    "PubMaster": msgq.messaging.PubMaster,
}

#: The names of cereal's ``visionipc`` package (msgq.visionipc keeps them all).
VISIONIPC_NAMES = ("VisionBuf", "VisionIpcClient", "VisionIpcServer", "VisionStreamType",
                   "get_endpoint_name")

_CHECKOUT_ATTR = "__msgq_cereal_checkout__"


def _checkout_path(checkout: str | os.PathLike[str]) -> str:
    """The checkout's absolute path; raises when it is not a cereal checkout."""
    path = os.path.abspath(os.fspath(checkout))
    for name in ("log.capnp", "services.py"):
        if not os.path.isfile(os.path.join(path, name)):
            raise FileNotFoundError(
                f"{path} has no {name}: give the cereal folder (the one with log.capnp and "
                "services.py, openpilot/cereal)")
    return path


def _package(name: str, path: list[str], doc: str, module: types.ModuleType | None = None
             ) -> types.ModuleType:
    """``module`` (or a new module called ``name``) made a package searched in ``path``."""
    if module is None:
        module = types.ModuleType(name, doc)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    elif module.__doc__ is None:
        module.__doc__ = doc
    module.__path__ = path
    if module.__spec__ is not None:
        module.__spec__.submodule_search_locations = path
    return module


def _subpackage_path(parent_path: Sequence[str], name: str) -> list[str]:
    """The folders called ``name`` in a package's folders (a shim's first, then the
    checkout's)."""
    return [os.path.join(d, name) for d in parent_path if os.path.isdir(os.path.join(d, name))]


def _messaging_module(path: list[str], log: Any, services: Any) -> types.ModuleType:
    module = _package("cereal.messaging", path,
                      "cereal's messaging API over msgq (see msgq.compat.cereal).")
    for name, value in MESSAGING_NAMES.items():
        setattr(module, name, value)
    module.log = log
    module.SERVICE_LIST = services.SERVICE_LIST
    module.__all__ = sorted(MESSAGING_NAMES)
    return module


def _visionipc_module(path: list[str]) -> types.ModuleType:
    module = _package("cereal.visionipc", path,
                      "cereal's VisionIPC API over msgq.visionipc (see msgq.compat.cereal).")

    def __getattr__(name: str) -> Any:  # noqa: N807 (the module attribute hook)
        if name in VISIONIPC_NAMES:
            # start-up cost: msgq.visionipc loads numpy, which messaging code does not
            # need (imported at first use)
            import msgq.visionipc

            value = getattr(msgq.visionipc, name)
            setattr(module, name, value)
            return value
        raise AttributeError(f"module 'cereal.visionipc' has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    module.__all__ = list(VISIONIPC_NAMES)
    return module


def install(checkout: str | os.PathLike[str],
            package: types.ModuleType | None = None) -> types.ModuleType:
    """Makes ``cereal``, ``cereal.messaging``, ``cereal.services`` (and
    ``cereal.visionipc``) importable in this process, over msgq, with the checkout's
    ``log.capnp`` and ``services.py`` in force (:func:`msgq.schemas.use_schema`, which
    also exports ``MSGQ_SCHEMA``/``MSGQ_REGISTRY`` to child processes); returns the
    ``cereal`` module.

    ``checkout``: the cereal folder (``openpilot/cereal``, with ``log.capnp`` and
    ``services.py``). ``package``: the module to fill in — a shim package's own ``cereal``
    (:func:`write_shim`); default: a new one. Call it before anything imports cereal;
    calling it again with the same checkout returns the same module. Raises
    FileNotFoundError for a folder that is not a cereal checkout, ValueError when its
    services are not members of its Event union, RuntimeError when another cereal is
    already imported."""
    path = _checkout_path(checkout)
    current = sys.modules.get("cereal")
    if current is not None and current is not package:
        installed = getattr(current, _CHECKOUT_ATTR, None)
        if installed == path:
            return current
        where = installed or getattr(current, "__file__", None) or "elsewhere"
        raise RuntimeError(
            f"cereal is already imported in this process (from {where}): install cereal "
            f"over msgq once, before anything imports cereal")

    schema = use_schema(os.path.join(path, "log.capnp"), os.path.join(path, "services.py"))
    names = ["cereal"]
    try:
        search = [*(package.__path__ if package is not None else []), path]
        cereal = _package("cereal", search, "openpilot's cereal over msgq, with the schema "
                          f"and services of {path} (see msgq.compat.cereal).", package)
        setattr(cereal, _CHECKOUT_ATTR, path)
        cereal.CEREAL_PATH = path
        for name in SCHEMA_MODULES:
            file = os.path.join(path, f"{name}.capnp")
            if name == "log":
                setattr(cereal, name, schema.module)
            elif os.path.isfile(file):
                setattr(cereal, name, load_module(file))
        sys.modules["cereal"] = cereal
        names.append("cereal.services")
        services = importlib.import_module("cereal.services")  # the checkout's own file
        cereal.services = services
        names.append("cereal.messaging")
        cereal.messaging = sys.modules["cereal.messaging"] = _messaging_module(
            _subpackage_path(search, "messaging"), schema.module, services)
        visionipc_path = _subpackage_path(search, "visionipc")
        if visionipc_path:
            names.append("cereal.visionipc")
            cereal.visionipc = sys.modules["cereal.visionipc"] = _visionipc_module(
                visionipc_path)
    except BaseException:
        for name in names:
            if sys.modules.get(name) is not package:
                sys.modules.pop(name, None)
        raise
    return cereal


_SHIM_INIT = '''"""openpilot's cereal over msgq, with the schema and services of {checkout}.

Written by msgq.compat.cereal.write_shim: put {folder} first on PYTHONPATH."""
import sys

from msgq.compat.cereal import install

install({checkout!r}, package=sys.modules[__name__])
'''

_SHIM_SUBPACKAGE = '''"""cereal.{name} over msgq: cereal/__init__.py installs it
(msgq.compat.cereal); this file only marks the folder as a package."""
'''


def write_shim(checkout: str | os.PathLike[str], folder: str | os.PathLike[str]) -> str:
    """Writes a tiny ``cereal`` package into ``folder`` (created if needed) that installs
    cereal over msgq with the checkout's schema when imported (:func:`install`): with
    ``folder`` first on ``PYTHONPATH``, every process imports cereal unchanged. Copies
    nothing of the checkout; returns ``folder``'s absolute path."""
    path = _checkout_path(checkout)
    folder = os.path.abspath(os.fspath(folder))
    package = os.path.join(folder, "cereal")
    os.makedirs(package, exist_ok=True)
    with open(os.path.join(package, "__init__.py"), "w") as f:
        f.write(_SHIM_INIT.format(checkout=path, folder=folder))
    for name in ("messaging", "visionipc"):
        if os.path.isdir(os.path.join(path, name)):
            os.makedirs(os.path.join(package, name), exist_ok=True)
            with open(os.path.join(package, name, "__init__.py"), "w") as f:
                f.write(_SHIM_SUBPACKAGE.format(name=name))
    return folder


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m msgq.compat.cereal CHECKOUT FOLDER``: writes the shim package and
    prints the folder to put on PYTHONPATH."""
    parser = argparse.ArgumentParser(
        prog="python -m msgq.compat.cereal",
        description="Write a 'cereal' package that runs openpilot's cereal API over msgq "
                    "with a checkout's schema; put FOLDER first on PYTHONPATH.")
    parser.add_argument("checkout", help="the cereal folder (with log.capnp, services.py)")
    parser.add_argument("folder", help="where to write the cereal package")
    args = parser.parse_args(argv)
    try:
        print(write_shim(args.checkout, args.folder))
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
