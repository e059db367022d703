"""The schema in force: one schema and one service registry per process, read from one
place by every layer — sockets (queue sizes, ZMQ ports), messaging, logs, replay, the CLI
and Spark.

Resolution (:func:`schema_in_force`): an explicit ``schema`` argument, else the process
default, else msgq's own (``schemas/log.capnp`` with :data:`msgq.schemas.SERVICE_LIST`).
The process default is set once, without changing any call site (cereal's API has no
schema argument):

* in the environment, before the process starts: ``MSGQ_SCHEMA`` (a ``.capnp`` file),
  ``MSGQ_REGISTRY`` (a registry file, see :func:`msgq.schemas.load_registry`) and
  ``MSGQ_SCHEMA_ROOT`` (the root struct, default ``Event``); or
* in code: :func:`use_schema`, which also exports those variables when the schema and
  registry are files, so that child processes (lockstep children, ``msgq`` commands run
  from the program, local Spark workers) follow.

These are the only ways: a schema and its registry are put in force together, so the
registry that sizes a queue (``pub_sock``) is the one ``PubMaster`` and ``SubMaster`` read
(there is no registry set apart for sockets).

:class:`SchemaSpec` is the small, picklable description of a schema (file, root struct,
registry, import folders) that a Spark executor, a lockstep child or a CLI command
rebuilds identically (:meth:`SchemaSpec.load`, cached per spec); every
:class:`msgq.schemas.Schema` carries its own as ``schema.spec``.

The registry in force (:func:`registry_in_force`) is read without loading Cap'n Proto: the
socket layer and the ZMQ backend look up queue sizes and ports through it on every
``pub_sock``/``sub_sock``.

Layer: the Event layer; imports the standard library and the rest of the Event layer.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from msgq.schemas.schema import ENV_ROOT, ENV_SCHEMA, ENV_SERVICES, Schema, SchemaSpec, spec_of
from msgq.schemas.services import Service, ServiceRegistry

__all__ = [
    "ENV_ROOT",
    "ENV_SCHEMA",
    "ENV_SERVICES",
    "SchemaSpec",
    "default_schema",
    "find_service",
    "registry_in_force",
    "schema_in_force",
    "spec_in_force",
    "use_schema",
]

_lock = threading.RLock()


_MSGQ_OWN = SchemaSpec()
# The process default (None: not read from the environment yet).
_default_spec: SchemaSpec | None = None
# The loaded schema of _default_spec once asked for (None: not yet): schema_in_force()'s
# answer without the two calls of spec_in_force().load(), 3 us of a cold 100 Hz tick's
# new_message. (SchemaSpec.load's own _last_loaded spares any spec asked again its hash.)
_default_schema: Schema | None = None
_registry_cache: tuple[SchemaSpec, ServiceRegistry] | None = None


def _spec_from_environment() -> SchemaSpec:
    schema = os.environ.get(ENV_SCHEMA) or None
    services = os.environ.get(ENV_SERVICES) or None
    root = os.environ.get(ENV_ROOT) or None
    if schema is None and services is None and root in (None, "Event"):
        return _MSGQ_OWN
    try:
        return spec_of(schema, services, root or "Event")
    except (OSError, ValueError) as e:
        raise ValueError(f"the schema in force ({ENV_SCHEMA}={schema or ''}, "
                         f"{ENV_SERVICES}={services or ''}) cannot be read: {e}") from None


def spec_in_force() -> SchemaSpec:
    """The process default's spec (from :func:`use_schema`, else the environment, else
    msgq's own)."""
    global _default_spec
    spec = _default_spec
    if spec is None:
        with _lock:
            if _default_spec is None:
                _default_spec = _spec_from_environment()
            spec = _default_spec
    return spec


def schema_in_force(schema: Schema | None = None) -> Schema:
    """``schema`` when given, else the process default (see the module docstring)."""
    if schema is not None:
        return schema
    loaded = _default_schema  # every new_message asks: one global read
    return loaded if loaded is not None else _load_default()


def _load_default() -> Schema:
    global _default_schema
    spec = spec_in_force()
    loaded = spec.load()
    with _lock:
        if _default_spec is spec:  # not replaced by use_schema meanwhile
            _default_schema = loaded
    return loaded


def default_schema() -> Schema:
    """The schema in force in this process (:func:`use_schema`, the
    ``MSGQ_SCHEMA``/``MSGQ_REGISTRY`` environment variables, else msgq's own)."""
    return schema_in_force()


def registry_in_force() -> ServiceRegistry:
    """The registry that sizes queues and numbers ZMQ ports in this process: the schema in
    force's (no other can be set apart from it), read without loading Cap'n Proto when
    the registry is known from its file."""
    global _registry_cache
    spec = spec_in_force()
    cached = _registry_cache
    if cached is not None and cached[0] is spec:
        return cached[1]
    registry = spec.registry()
    if registry is None:
        registry = spec.load().services
    _registry_cache = (spec, registry)
    return registry


def find_service(name: str | bytes) -> Service | None:
    """The service called ``name`` in the registry in force, or None when it has none
    of that name (socket queue sizes, ZMQ ports)."""
    if isinstance(name, bytes):
        name = name.decode("utf-8", "replace")
    return registry_in_force().get(name)


def use_schema(
    schema: Any = None,
    services: ServiceRegistry | str | Any = None,
    root: str = "Event",
    imports: tuple[str, ...] = (),
    export: bool = True,
) -> Schema:
    """Makes a schema the process default and returns it.

    ``schema``: a ``.capnp`` path, a :class:`msgq.schemas.Schema`, a module pycapnp
    already loaded (``from cereal import log``: it is reused, never loaded twice), or None
    for msgq's own. ``services``: a registry file, a :class:`ServiceRegistry`, a mapping
    like cereal's ``SERVICE_LIST``, or None (see :class:`SchemaSpec`). With ``export``
    (default) the environment variables are set too, so child processes follow, when the
    schema and registry are files. Every later ``new_message``, ``PubMaster``,
    ``SubMaster``, ``pub_sock``/``sub_sock`` (queue sizes), log reader/writer and replay
    of this process use it."""
    global _default_spec, _default_schema, _registry_cache
    if isinstance(schema, Schema):
        if services is not None or root != "Event" or imports:
            raise ValueError("give a Schema alone, or a path with its services")
        spec = schema.spec
    else:
        spec = spec_of(schema, services, root, imports)
    loaded = spec.load()  # fails here, not at the first socket, when the schema is wrong
    with _lock:
        _default_spec = spec
        _default_schema = loaded
        _registry_cache = None
    if export:
        for name in (ENV_SCHEMA, ENV_SERVICES, ENV_ROOT):
            os.environ.pop(name, None)
        try:
            os.environ.update(spec.environment())
        except ValueError:
            pass  # a registry given in code: children get the spec passed explicitly
    return loaded


def reset_to_environment() -> None:
    """Forgets the process default: the next use reads the environment again (tests)."""
    global _default_spec, _default_schema, _registry_cache
    with _lock:
        _default_spec = None
        _default_schema = None
        _registry_cache = None
