"""What a schema is: :class:`Schema` (a Cap'n Proto file, its root Event struct and its
service registry), loading one (:func:`load_schema`; :func:`default_schema` is the schema
in force, :func:`msgq_schema` msgq's own) and decoding bytes as its root struct with a
bounded traversal (:meth:`Schema.decode`).

Loading never aborts the process: pycapnp aborts ("Duplicate ID") when a file it already
parsed is parsed again with other import folders — what happens when a program did ``from
cereal import log`` (``capnp.load(path)``) and then loads the same file again. A file
already loaded in this process (found by its ``@0x...`` id among pycapnp's loaded
modules) is reused, never parsed twice, and a file is loaded with the import folders the
caller gives and no others, as cereal loads it.

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
from dataclasses import dataclass
from typing import Any

from msgq.errors import MessageDecodeError
from msgq.schemas._event_builder import EventFactory
from msgq.schemas.builder_layouts import build_layout
from msgq.schemas.framing import EventLayout
from msgq.schemas.payload_views import PayloadViews
from msgq.schemas.services import (
    SERVICE_LIST,
    Service,
    ServiceRegistry,
    load_registry,
    registry_from_mapping,
)

__all__ = [
    "NO_TRAVERSAL_LIMIT",
    "SCHEMA_DIR",
    "Schema",
    "ENV_ROOT",
    "ENV_SCHEMA",
    "ENV_SERVICES",
    "SchemaSpec",
    "build_schema",
    "check_compiles",
    "load_module",
    "load_schema",
    "msgq_schema",
    "read_struct",
    "schema_fingerprint",
    "traversal_limit",
]

#: Traversal limit that disables pycapnp's message traversal check (upstream constant).
NO_TRAVERSAL_LIMIT = 2**64 - 1
# Words a message may make the decoder visit, per word of the message.
_TRAVERSAL_FACTOR = 4
_MIN_TRAVERSAL_WORDS = 8 * 1024 * 1024


def traversal_limit(message_size: int) -> int:
    """The traversal limit (words) :meth:`Schema.decode` gives a message of
    ``message_size`` bytes: 4 words per word of it, at least capnp's default of 8 Mi
    words. Readers that decode many messages in one pycapnp call (the log reader) pass
    the largest one's."""
    return max(_MIN_TRAVERSAL_WORDS, _TRAVERSAL_FACTOR * (message_size // 8))

#: Folder of the schema files shipped with msgq.
SCHEMA_DIR = os.path.dirname(os.path.abspath(__file__))

_IMPORT_RE = re.compile(rb'import\s+"([^"]+)"')
_FILE_ID_RE = re.compile(rb'^\s*@0x([0-9a-fA-F]{16})\s*;', re.MULTILINE)
_lock = threading.RLock()

#: Environment variable naming the schema file in force.
ENV_SCHEMA = "MSGQ_SCHEMA"
#: Environment variable naming the service registry file in force (the ``msgq`` command's
#: ``--registry``; ``--services`` there selects services by name).
ENV_SERVICES = "MSGQ_REGISTRY"
#: Environment variable naming the root struct of the schema in force (default Event).
ENV_ROOT = "MSGQ_SCHEMA_ROOT"


def _capnp() -> Any:
    import capnp  # loaded on first use: importing msgq stays cheap (about 30 ms saved)

    capnp.remove_import_hook()
    from msgq.schemas import field_errors  # start-up cost: imports pycapnp, loaded with it

    field_errors.install(_loaded_roots)  # misspelled fields said in one line
    return capnp


def _loaded_roots() -> list[Any]:
    """The root structs of the schemas this process loaded (what a misspelled field of a
    pycapnp reader or builder is looked up in)."""
    return [schema.event.schema for schema in list(_loaded.values())]


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


@dataclass(frozen=True)
class SchemaSpec:
    """What a schema is, in a form that pickles and rebuilds identically elsewhere.

    ``path``: the ``.capnp`` file (None: msgq's own). ``services``: the registry — a
    :class:`ServiceRegistry`, or None: msgq's own registry with msgq's schema, else every
    union member of the root struct as an event-driven, logged service (a schema without a
    registry still reads logs; it has no rates to check). ``services_path``: the registry
    file the registry came from, if any (what :func:`use_schema` exports). ``root``: the
    root struct. ``imports``: folders for ``import "/..."`` lines.
    """

    path: str | None = None
    services: ServiceRegistry | None = None
    root: str = "Event"
    imports: tuple[str, ...] = ()
    services_path: str | None = None

    @property
    def is_msgq_own(self) -> bool:
        """Whether this is msgq's own schema and registry."""
        return self.path is None and self.services is None and self.root == "Event"

    def registry(self) -> ServiceRegistry | None:
        """The registry when it is known without loading the schema (msgq's own, or an
        explicit one); None when it is derived from the schema's union."""
        if self.services is not None:
            return self.services
        return SERVICE_LIST if self.path is None else None

    def load(self) -> Schema:
        """The :class:`msgq.schemas.Schema` this spec describes (loaded once per spec in a
        process)."""
        last = _last_loaded
        if last is not None and last[0] is self:
            # the spec in force, asked again (every new_message): no hash of its registry
            return last[1]
        with _lock:
            schema = _loaded.get(self)
            if schema is None:
                schema = _loaded[self] = build_schema(self)
            _remember(self, schema)
            return schema

    def environment(self) -> dict[str, str]:
        """The environment variables that make this spec the default of a child process;
        raises ValueError when the registry was given in code and has no file."""
        if self.is_msgq_own:
            return {}
        if self.services is not None and self.services_path is None:
            raise ValueError("a registry given in code has no file to name in the "
                             f"environment: write it to a file for {ENV_SERVICES}")
        env = {ENV_ROOT: self.root}
        if self.path is not None:
            env[ENV_SCHEMA] = self.path
        if self.services_path is not None:
            env[ENV_SERVICES] = self.services_path
        return env


_loaded: dict[SchemaSpec, Schema] = {}
#: The spec loaded last and its schema: SchemaSpec.load's answer without hashing the
#: spec (a registry hashes every service: 73 of openpilot's cost 0.1 ms a new_message).
_last_loaded: tuple[SchemaSpec, Schema] | None = None


def _remember(spec: SchemaSpec, schema: Schema) -> None:
    global _last_loaded
    _last_loaded = (spec, schema)


def _loaded_module(path: str) -> Any:
    """The module pycapnp already loaded from the file at ``path`` in this process (found
    by the file's ``@0x...`` id), or None; ValueError when another text with that id was
    loaded (pycapnp would abort on it)."""
    import capnp.lib.capnp as capnp_lib  # pycapnp is loaded on first use (cheap import)

    parser = getattr(capnp_lib, "_global_schema_parser", None)
    if parser is None:
        return None
    try:
        with open(path, "rb") as f:
            match = _FILE_ID_RE.search(f.read())
    except OSError:
        return None
    if match is None:
        return None
    module = parser.modules_by_id.get(int(match.group(1), 16))
    loaded_from = getattr(module, "__file__", None)
    if loaded_from is None:
        return None
    if os.path.realpath(loaded_from) != os.path.realpath(path) and \
            _file_text(loaded_from) != _file_text(path):
        raise ValueError(f"schema file {path} declares the file id "
                         f"@0x{match.group(1).decode()} of {loaded_from}, already loaded in "
                         "this process with other text: two schemas cannot share an id (give "
                         "one a new one: capnp id)")
    return module  # (a copy of the same text elsewhere is the same schema)


def _file_text(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


# The program a child runs to try compiling a schema: pycapnp aborts the process on any
# compile error (parse error, unknown type, missing file id), so a file nobody has compiled
# on this machine is compiled in a child first.
# The child first replays the loads this process made (a file imported under another path
# than it was loaded by is a "Duplicate ID" abort too), then loads the new file.
_TRY_COMPILE = ("import capnp, json, sys; capnp.remove_import_hook(); "
                "[capnp.load(p, imports=i) for p, i in json.loads(sys.argv[1])]")
_compiled: set[str] = set()  # schema keys known to compile, in this process
_loads: list[tuple[str, list[str]]] = []  # (path, imports) of load_module's loads, in order


def _compile_key(loads: list[tuple[str, list[str]]]) -> str:
    # only for a schema not yet checked here
    import json
    from importlib.metadata import version

    text = json.dumps([[schema_fingerprint(p), p, i] for p, i in loads]) + version("pycapnp")
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _compile_marker(key: str) -> str | None:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "msgq", "compiled-schemas", key) if base else None


def check_compiles(path: str, imports: Iterable[str] = ()) -> None:
    """Raises ValueError, in one line with pycapnp's reason, when the schema file at
    ``path`` does not compile — found in a child process, since pycapnp aborts the process
    that compiles a bad file, or that parses a file again under another import path. The
    child replays this process's earlier loads first. A file that compiled is remembered
    (in this process, and in ``~/.cache/msgq/compiled-schemas`` by the fingerprints of the
    files and import folders loaded), so the child runs once per schema version and
    machine."""
    # only for a schema not yet checked here
    import json
    import subprocess
    import sys

    loads = [*_loads, (os.path.abspath(path), [os.path.abspath(i) for i in imports])]
    key = _compile_key(loads)
    marker = _compile_marker(key)
    if key in _compiled or (marker is not None and os.path.exists(marker)):
        _compiled.add(key)
        return
    done = subprocess.run([sys.executable, "-c", _TRY_COMPILE, json.dumps(loads)],
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reasons = [line for line in lines if "failed:" in line] or lines[-1:]
        reason = reasons[-1] if reasons else f"exit code {done.returncode}"
        reason = reason.removeprefix("what():").strip()
        if "Duplicate ID" in reason:
            raise ValueError(f"schema file {path} reaches a file this process already "
                             f"loaded, under another path or import folders ({reason}); "
                             "pycapnp would abort: import it the way it was loaded")
        raise ValueError(f"schema file {path} does not compile: {reason}")
    _compiled.add(key)
    if marker is not None:
        try:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w"):
                pass
        except OSError:
            pass  # no cache folder: the child runs again next time


def load_module(path: str, imports: Iterable[str] = ()) -> Any:
    """The pycapnp module of the schema file at ``path``: the one already loaded in this
    process when there is one (never parsed twice, which would abort the process), else
    loaded with ``imports`` as its only extra folders, after :func:`check_compiles` (a
    file that does not compile is a ValueError, never an abort). msgq's own schema is
    loaded directly."""
    capnp = _capnp()
    with _lock:
        module = _loaded_module(path)
        if module is None:
            if os.path.dirname(os.path.abspath(path)) != SCHEMA_DIR:
                check_compiles(path, imports)
            module = capnp.load(path, imports=list(imports))
            _loads.append((os.path.abspath(path), [os.path.abspath(i) for i in imports]))
    return module


class Schema:
    """A Cap'n Proto schema, its root struct (one union field per service, plus
    ``logMonoTime`` and ``valid``) and its service registry. ``spec`` is its
    :class:`msgq.schemas.SchemaSpec`: pickle that, not the Schema, to rebuild it in
    another process."""

    def __init__(self, module: Any, registry: ServiceRegistry | None, root: str, path: str,
                 spec: SchemaSpec | None = None) -> None:
        self.module = module
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
        #: The union members as a set: membership without a scan (openpilot has 126).
        self.union_set: frozenset[str] = frozenset(self.union_fields)
        if registry is None:
            # no registry: every union member is an event-driven, logged service
            registry = ServiceRegistry(Service(name, True, 0.0) for name in self.union_fields)
        self.services = registry
        self.spec = spec if spec is not None else SchemaSpec(path, registry, root)
        unknown = [name for name in registry if name not in self.union_fields]
        if unknown:
            shown = ", ".join(unknown[:5]) + (f" and {len(unknown) - 5} more"
                                              if len(unknown) > 5 else "")
            raise ValueError(
                f"{len(unknown)} services of the registry are not members of {root}'s "
                f"union in {path} ({shown}): is it the registry of another schema?")
        fields = self.event.schema.fields
        #: The root's logMonoTime and valid fields and its union members' fields:
        #: new_message sets them with pycapnp's *_by_field calls, without its lookup by
        #: name (a search through the schema's own text, cold in a 100 Hz tick).
        self.mono_field = fields["logMonoTime"]
        self.valid_field = fields["valid"]
        self.member_fields: dict[str, Any] = {name: fields[name] for name in self.union_fields}
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

    @functools.cached_property
    def builder(self) -> EventFactory:
        """new_message's builder of this schema's Event (msgq's own: fields written
        straight into the bytes, pycapnp's builder made from them for anything else;
        :mod:`msgq.schemas.builder_layouts`). Made once per schema."""
        event = self.event

        def handover(data: bytes) -> Any:
            return read_struct(event, data, NO_TRAVERSAL_LIMIT).as_builder()

        return EventFactory(build_layout(event.schema), handover)

    @functools.cached_property
    def views(self) -> PayloadViews:
        """Payload views of this schema's services: fields read straight from a
        message's bytes, pycapnp for the rest (:mod:`msgq.schemas.payload_views`)."""
        return PayloadViews(self)

    def decode(self, data: Any) -> Any:
        """The root struct's reader over ``data`` (bytes from another process), with a
        traversal limit proportional to its size. Malformed bytes →
        :class:`msgq.errors.MessageDecodeError`."""
        limit = traversal_limit(len(data))
        try:
            msg = read_struct(self.event, data, limit)
            msg.which()  # touches the root: a bad root pointer fails here, not later
        except Exception as e:  # pycapnp raises KjException, ValueError or TypeError
            raise MessageDecodeError(
                f"{len(data)} bytes are not a valid {self.root_name}: {e}") from None
        return msg

    def __repr__(self) -> str:
        return f"Schema({self.path!r}, root={self.root_name!r}, {len(self.services)} services)"


def _registry_of(services: Any) -> ServiceRegistry | None:
    if services is None or isinstance(services, ServiceRegistry):
        return services
    if isinstance(services, (str, os.PathLike)):
        return load_registry(os.fspath(services))
    if hasattr(services, "items"):
        return registry_from_mapping(services)
    return ServiceRegistry(services)


def spec_of(schema: Any, services: Any = None, root: str = "Event",
            imports: Iterable[str] = ()) -> SchemaSpec:
    """The :class:`SchemaSpec` of a schema named as :func:`load_schema` takes it."""
    if schema is None:
        path = None
    elif isinstance(schema, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(schema))
    elif getattr(schema, "__file__", None):  # a module pycapnp loaded
        path = os.path.abspath(schema.__file__)
    else:
        raise TypeError(f"a schema is a .capnp path or a loaded pycapnp module, not "
                        f"{type(schema).__name__}")
    if path is not None and not os.path.isfile(path):
        raise FileNotFoundError(f"schema file {path} does not exist")
    services_path = os.path.abspath(os.fspath(services)) \
        if isinstance(services, (str, os.PathLike)) else None
    return SchemaSpec(path=path, services=_registry_of(services), root=root,
                      imports=tuple(os.path.abspath(i) for i in imports),
                      services_path=services_path)


def build_schema(spec: SchemaSpec) -> Schema:
    """Loads the schema ``spec`` describes (:meth:`SchemaSpec.load` caches it)."""
    path = spec.path or os.path.join(SCHEMA_DIR, "log.capnp")
    module = load_module(path, spec.imports)
    registry = spec.registry()
    schema = Schema(module, registry, spec.root, path, spec)
    return schema


def load_schema(
    path: Any,
    services: ServiceRegistry | Iterable[Service] | str | Any = None,
    root: str = "Event",
    imports: Iterable[str] = (),
    register_services: bool = False,
) -> Schema:
    """Loads an application's own schema with its registry (it does not make it the
    process default: :func:`msgq.schemas.use_schema` does).

    ``path``: the ``.capnp`` file, or a module pycapnp already loaded (``from cereal
    import log``: reused, never parsed twice). ``services``: the registry — a
    :class:`ServiceRegistry` or list of :class:`Service`, a registry file (``.py`` like
    cereal's ``services.py``, ``.toml``, ``.json``), a mapping like cereal's
    ``SERVICE_LIST``, or None (every union member, event-driven). ``imports`` are extra
    folders for ``import "/..."`` lines. Raises ValueError when the file does not define
    ``root`` with ``logMonoTime``, ``valid`` and a member per service.
    ``register_services=True`` is refused (ValueError): one call puts a schema and its
    registry in force, :func:`msgq.schemas.use_schema`.
    """
    if register_services:
        raise ValueError("load_schema(register_services=True) is gone: "
                         "msgq.schemas.use_schema(path, services) puts a schema and its "
                         "registry in force (the one way to)")
    spec = spec_of(path, services, root, imports)
    return spec.load()


def msgq_schema() -> Schema:
    """msgq's own schema (schemas/log.capnp) with :data:`SERVICE_LIST`, whatever is in
    force; loaded once."""
    return SchemaSpec().load()



def read_struct(struct: Any, data: Any, traversal_limit: int) -> Any:
    """The reader of ``struct`` over ``data`` with ``traversal_limit`` words."""
    with struct.from_bytes(data, traversal_limit_in_words=traversal_limit) as msg:
        return msg
