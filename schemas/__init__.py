"""Cap'n Proto schemas and the service registry, importable as ``msgq.schemas``.

* ``log`` — the compiled ``log.capnp`` module (``log.Event`` is the root struct), loaded on
  first use so that importing msgq stays cheap.
* :data:`SERVICE_LIST` — the default service registry (:mod:`msgq.schemas.services`).
* :class:`Schema` — a schema file, its root struct and its registry together;
  :func:`default_schema` is ours, :func:`load_schema` loads an application's own, which
  PubMaster / SubMaster, the logs and the CLI accept in place of ours.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from msgq.schemas.services import (
    SERVICE_LIST,
    Service,
    ServiceRegistry,
    derive_queue_size,
    find_service,
    register,
)

if TYPE_CHECKING:
    from msgq.logs.framing import EventLayout

__all__ = [
    "SCHEMA_DIR",
    "SERVICE_LIST",
    "Schema",
    "Service",
    "ServiceRegistry",
    "default_schema",
    "derive_queue_size",
    "find_service",
    "load_schema",
    "log",
    "schema_fingerprint",
]

#: Folder of the schema files shipped with msgq.
SCHEMA_DIR = os.path.dirname(os.path.abspath(__file__))

_IMPORT_RE = re.compile(rb'import\s+"([^"]+)"')
_lock = threading.Lock()
_default: Schema | None = None


def _capnp() -> Any:
    import capnp

    capnp.remove_import_hook()
    return capnp


def schema_fingerprint(path: str) -> str:
    """A hex fingerprint of a schema file and every file it imports (relative imports):
    equal fingerprints mean the same schema text."""
    digest = hashlib.sha256()
    seen: set[str] = set()
    pending = [os.path.abspath(path)]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        with open(current, "rb") as f:
            text = f.read()
        digest.update(os.path.basename(current).encode() + b"\0" + text + b"\0")
        for name in sorted(_IMPORT_RE.findall(text)):
            if not name.startswith(b"/"):
                pending.append(os.path.join(os.path.dirname(current), name.decode()))
    return digest.hexdigest()[:16]


class Schema:
    """A Cap'n Proto schema, its root struct (one union field per service, plus
    ``logMonoTime`` and ``valid``) and its service registry."""

    def __init__(self, module: Any, registry: ServiceRegistry, root: str, path: str) -> None:
        self.module = module
        self.services = registry
        self.path = path
        self.root_name = root
        try:
            self.event = getattr(module, root)
        except AttributeError:
            raise ValueError(f"schema {path} has no struct {root!r}") from None
        fields = set(self.event.schema.fieldnames)
        missing = {"logMonoTime", "valid"} - fields
        if missing:
            raise ValueError(f"{root} in {path} lacks the fields {sorted(missing)}")
        self.union_fields: tuple[str, ...] = tuple(self.event.schema.union_fields)
        unknown = [name for name in registry if name not in self.union_fields]
        if unknown:
            raise ValueError(
                f"services {unknown} of the registry are not members of {root}'s union in {path}")
        fields = self.event.schema.fields
        # Union members initialised with a length (lists, text, data) rather than as structs.
        self.sized_fields = frozenset(
            name for name in self.union_fields
            if fields[name].proto.slot.type.which() in ("list", "text", "data"))
        self.fingerprint = schema_fingerprint(path)

    def init_payload(self, msg: Any, service: str, size: int | None = None) -> Any:
        """Initialises ``service``'s union member of the Event builder ``msg`` (a list,
        text or data member with ``size`` elements, default 0) and returns it."""
        if service in self.sized_fields:
            return msg.init(service, size or 0)
        if size is not None:
            raise ValueError(f"{service!r} is a struct: it takes no size")
        return msg.init(service)

    @functools.cached_property
    def layout(self) -> EventLayout:
        """Where the root struct keeps logMonoTime, valid and the union discriminant, to
        read them from a message's bytes (:class:`msgq.logs.framing.EventLayout`; its
        ``identify`` is the check that bytes are an Event). Worked out once per schema."""
        from msgq.logs.framing import EventLayout

        return EventLayout.of(self)

    def __repr__(self) -> str:
        return f"Schema({self.path!r}, root={self.root_name!r}, {len(self.services)} services)"


def load_schema(
    path: str,
    services: ServiceRegistry | Iterable[Service],
    root: str = "Event",
    imports: Iterable[str] = (),
    register_services: bool = True,
) -> Schema:
    """Loads an application's own schema file with its registry.

    ``services`` names the union members of ``root`` that are services (with their
    frequency, logging policy and message size); ``imports`` are extra folders for
    ``import "/..."`` lines. With ``register_services`` the plain ``pub_sock``/``sub_sock``
    also size those services' queues from the registry. Raises ValueError when the file
    does not define ``root`` with ``logMonoTime``, ``valid`` and a member per service.
    """
    capnp = _capnp()
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"schema file {path} does not exist")
    registry = services if isinstance(services, ServiceRegistry) else ServiceRegistry(services)
    module = capnp.load(path, imports=[os.path.dirname(path), SCHEMA_DIR, *imports])
    schema = Schema(module, registry, root, path)
    if register_services:
        register(registry)
    return schema


def default_schema() -> Schema:
    """msgq's own schema (schemas/log.capnp) with :data:`SERVICE_LIST`; loaded once."""
    global _default
    with _lock:
        if _default is None:
            path = os.path.join(SCHEMA_DIR, "log.capnp")
            module = _capnp().load(path, imports=[SCHEMA_DIR])
            _default = Schema(module, SERVICE_LIST, "Event", path)
    return _default


def __getattr__(name: str) -> Any:
    # ``msgq.schemas.log`` (and ``from msgq.schemas import log``) load the schema lazily.
    if name == "log":
        return default_schema().module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
