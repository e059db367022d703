"""The one place that chooses a transport.

Each backend is a module with the same four names: ``Context``, ``PubSocket``,
``SubSocket`` and ``Poller`` (the socket protocol, see :mod:`msgq.protocol`).
:func:`select_backend` picks one from the environment when a socket is created, so a
process can change the environment between sockets. Nothing above this module knows
which backend was chosen.

Environment (first match wins):

* ``MSGQ_BACKEND`` — a backend name from :data:`BACKENDS`.
* ``ZMQ`` — set to a non-empty value other than ``0``: the ``zmq`` backend (upstream name).
* otherwise ``msgq`` (shared memory).

``CEREAL_FAKE`` (non-empty, not ``0``) additionally wraps every new SubSocket and Poller
in fake events (:func:`with_fake_events`, :mod:`msgq.fake_sockets`).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

#: Backend name -> module implementing the socket protocol.
BACKENDS: dict[str, str] = {
    "msgq": "msgq.shm_backend",
    "zmq": "msgq.zmq_backend",
}

DEFAULT_BACKEND = "msgq"

_loaded: dict[str, ModuleType] = {}


def _flag(name: str) -> bool:
    value = os.environ.get(name, "")
    return value not in ("", "0")


def backend_name() -> str:
    """The backend the environment asks for; ValueError names the choices if unknown."""
    name = os.environ.get("MSGQ_BACKEND", "").strip().lower()
    if not name:
        name = "zmq" if _flag("ZMQ") else DEFAULT_BACKEND
    if name not in BACKENDS:
        choices = ", ".join(sorted(BACKENDS))
        raise ValueError(
            f"unknown msgq backend {name!r} (from the environment); choose one of: {choices}"
        )
    return name


def select_backend(name: str | None = None) -> ModuleType:
    """The module of backend ``name`` (default: the one the environment asks for)."""
    if name is None:
        name = backend_name()
    elif name not in BACKENDS:
        choices = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown msgq backend {name!r}; choose one of: {choices}")
    module = _loaded.get(name)
    if module is None:
        module = importlib.import_module(BACKENDS[name])
        from msgq import protocol

        protocol.register_backend(module)
        _loaded[name] = module
    return module


def loaded_backends() -> list[ModuleType]:
    """The backend modules selected so far in this process."""
    return list(_loaded.values())


def with_fake_events(obj: Any) -> Any:
    """A new SubSocket or Poller, wrapped in fake events when ``CEREAL_FAKE`` is set
    (read now, so ``toggle_fake_events`` affects sockets created after it)."""
    if not _flag("CEREAL_FAKE"):
        return obj
    from msgq import fake_sockets

    return fake_sockets.wrap(obj)
