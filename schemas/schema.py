"""What a schema is: :class:`Schema` (a Cap'n Proto file, its root Event struct and its
service registry), loading one (:func:`load_schema`, :func:`default_schema`) and decoding
bytes as its root struct with a bounded traversal (:meth:`Schema.decode`).

Traversal limits: pycapnp refuses to walk more than a traversal limit of words per
message, which stops a crafted message whose pointers all point at the same data from
costing unbounded CPU. :meth:`Schema.decode` (used on bytes from other processes) bounds
the walk to a few times the message's own size (at least capnp's default of 8 Mi words),
so a message can be read completely but not amplified; :data:`NO_TRAVERSAL_LIMIT` is
upstream's constant for trusted bytes.

Layer: the Event layer. Imports the standard library, pycapnp (loaded on first use, so
that importing msgq stays cheap), :mod:`msgq.errors` and the rest of the Event layer.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections.abc import Iterable
from typing import Any

from msgq.errors import MessageDecodeError
from msgq.schemas.framing import EventLayout
from msgq.schemas.services import SERVICE_LIST, Service, ServiceRegistry, register

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "SCHEMA_DIR",
    "Schema",
    "default_schema",
    "load_schema",
    "read_struct",
    "schema_fingerprint",
]

#: Traversal limit that disables pycapnp's message traversal check (upstream constant).
NO_TRAVERSAL_LIMIT = 2**64 - 1
# Words a message may make the decoder visit, per word of the message.
_TRAVERSAL_FACTOR = 4
_MIN_TRAVERSAL_WORDS = 8 * 1024 * 1024

#: Folder of the schema files shipped with msgq.
SCHEMA_DIR = os.path.dirname(os.path.abspath(__file__))

_IMPORT_RE = re.compile(rb'import\s+"([^"]+)"')
_lock = threading.Lock()
_default: Schema | None = None


def _capnp() -> Any:
    import capnp  # loaded on first use: importing msgq stays cheap (about 30 ms saved)

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
        read them from a message's bytes (:class:`msgq.schemas.framing.EventLayout`; its
        ``identify`` is the check that bytes are an Event). Worked out once per schema."""
        return EventLayout.of(self)

    def decode(self, data: Any) -> Any:
        """The root struct's reader over ``data`` (bytes from another process), with a
        traversal limit proportional to its size. Malformed bytes →
        :class:`msgq.errors.MessageDecodeError`."""
        limit = max(_MIN_TRAVERSAL_WORDS, _TRAVERSAL_FACTOR * (len(data) // 8))
        try:
            msg = read_struct(self.event, data, limit)
            msg.which()  # touches the root: a bad root pointer fails here, not later
        except Exception as e:  # pycapnp raises KjException, ValueError or TypeError
            raise MessageDecodeError(
                f"{len(data)} bytes are not a valid {self.root_name}: {e}") from None
        return msg

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



def read_struct(struct: Any, data: Any, traversal_limit: int) -> Any:
    """The reader of ``struct`` over ``data`` with ``traversal_limit`` words."""
    with struct.from_bytes(data, traversal_limit_in_words=traversal_limit) as msg:
        return msg
