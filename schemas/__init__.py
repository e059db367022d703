"""The Event layer, importable as ``msgq.schemas``: what an Event is and how its bytes look.

* ``log`` — the compiled ``log.capnp`` module (``log.Event`` is the root struct), loaded on
  first use so that importing msgq stays cheap.
* :data:`SERVICE_LIST` — the default service registry (:mod:`msgq.schemas.services`).
* :class:`Schema` — a schema file, its root struct and its registry together;
  :func:`default_schema` is ours, :func:`load_schema` loads an application's own, which
  PubMaster / SubMaster, the logs and the CLI accept in place of ours
  (:mod:`msgq.schemas.schema`).
* :mod:`msgq.schemas.events` — making and parsing Event messages (``new_message``,
  ``log_from_bytes``, ``decode_event``).
* :mod:`msgq.schemas.framing` — Cap'n Proto stream framing and :class:`EventLayout`, the
  three fields every tool peeks from an Event's bytes without pycapnp.

Layer: the Event layer sits at the bottom, over :mod:`msgq.clock`, :mod:`msgq.errors` and
:mod:`msgq.tables` only. It knows nothing of sockets, logs or lockstep; ``messaging``,
``logs``, ``lockstep``, ``bridge`` and ``spark`` build on it.
"""

from __future__ import annotations

from typing import Any

from msgq.errors import MessageDecodeError
from msgq.schemas.events import decode_event, log_from_bytes, new_message
from msgq.schemas.framing import EventLayout
from msgq.schemas.schema import (
    NO_TRAVERSAL_LIMIT,
    SCHEMA_DIR,
    Schema,
    default_schema,
    load_schema,
    schema_fingerprint,
)
from msgq.schemas.services import (
    SERVICE_LIST,
    Service,
    ServiceRegistry,
    derive_queue_size,
    find_service,
)

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "SCHEMA_DIR",
    "SERVICE_LIST",
    "EventLayout",
    "MessageDecodeError",
    "Schema",
    "Service",
    "ServiceRegistry",
    "decode_event",
    "default_schema",
    "derive_queue_size",
    "find_service",
    "load_schema",
    "log",
    "log_from_bytes",
    "new_message",
    "schema_fingerprint",
]


def __getattr__(name: str) -> Any:
    # ``msgq.schemas.log`` (and ``from msgq.schemas import log``) load the schema lazily.
    if name == "log":
        return default_schema().module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
