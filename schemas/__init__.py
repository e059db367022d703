"""The Event layer, importable as ``msgq.schemas``: what an Event is and how its bytes look.

* ``log`` — the compiled ``log.capnp`` module (``log.Event`` is the root struct), loaded on
  first use so that importing msgq stays cheap.
* :data:`SERVICE_LIST` — the default service registry (:mod:`msgq.schemas.services`).
* :class:`Schema` — a schema file, its root struct and its registry together;
  :func:`load_schema` loads an application's own (a ``.capnp`` file or a module pycapnp
  already loaded, with a registry in code or in a file: :func:`load_registry`);
  :func:`msgq_schema` is msgq's own (:mod:`msgq.schemas.schema`).
* The schema in force (:mod:`msgq.schemas.selection`): one per process, set once with
  :func:`use_schema` or the ``MSGQ_SCHEMA``/``MSGQ_REGISTRY`` environment variables, and
  read by every layer (:func:`default_schema` / :func:`schema_in_force`); a
  :class:`SchemaSpec` rebuilds it in another process.
* :mod:`msgq.schemas.events` — making and parsing Event messages (``new_message``,
  ``log_from_bytes``, ``decode_event``); :class:`StaleBuilderError`: a struct builder of
  ``new_message``'s used after its struct left the message (:mod:`._event_builder`).
* :mod:`msgq.schemas.framing` — Cap'n Proto stream framing and :class:`EventLayout`, the
  three fields every tool peeks from an Event's bytes without pycapnp.

Layer: the Event layer sits at the bottom, over :mod:`msgq.clock`, :mod:`msgq.errors` and
:mod:`msgq.tables` only. It knows nothing of sockets, logs or lockstep; ``messaging``,
``logs``, ``lockstep``, ``bridge`` and ``spark`` build on it.
"""

from __future__ import annotations

from typing import Any

from msgq.errors import MessageDecodeError
from msgq.schemas._event_builder import StaleBuilderError
from msgq.schemas.events import decode_event, log_from_bytes, new_message
from msgq.schemas.framing import EventLayout
from msgq.schemas.schema import (
    NO_TRAVERSAL_LIMIT,
    SCHEMA_DIR,
    Schema,
    SchemaSpec,
    load_schema,
    msgq_schema,
    schema_fingerprint,
)
from msgq.schemas.selection import (
    default_schema,
    find_service,
    registry_in_force,
    schema_in_force,
    spec_in_force,
    use_schema,
)
from msgq.schemas.services import (
    SERVICE_LIST,
    UNSIZED_QUEUE_SIZE,
    Service,
    ServiceRegistry,
    derive_queue_size,
    load_registry,
)

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "SCHEMA_DIR",
    "SERVICE_LIST",
    "UNSIZED_QUEUE_SIZE",
    "EventLayout",
    "MessageDecodeError",
    "Schema",
    "SchemaSpec",
    "Service",
    "ServiceRegistry",
    "StaleBuilderError",
    "decode_event",
    "default_schema",
    "derive_queue_size",
    "find_service",
    "load_registry",
    "load_schema",
    "log",
    "log_from_bytes",
    "msgq_schema",
    "new_message",
    "registry_in_force",
    "schema_fingerprint",
    "schema_in_force",
    "spec_in_force",
    "use_schema",
]


def __getattr__(name: str) -> Any:
    # ``msgq.schemas.log`` (and ``from msgq.schemas import log``): the schema in force's
    # module, loaded lazily.
    if name == "log":
        return default_schema().module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
