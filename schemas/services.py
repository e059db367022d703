"""The service registry: one source of truth for every service of the schema.

For each service: its expected frequency (Hz, 0 for event-driven services), whether it is
logged, its decimation in reduced logs, the largest message expected on it, and — derived
from those — its queue size and ZMQ port.

Queue size rule (:func:`derive_queue_size`), for a service whose registry gives its largest
message::

    buffered = message_size * max(frequency, EVENT_DRIVEN_RATE_HZ) * BUFFER_SECONDS
    floor    = max(MIN_QUEUE_SIZE, 4 * message_size)
    size     = next power of two of clamp(buffered, floor, max(floor, MAX_QUEUE_SIZE))

A queue accepts messages up to a third of its size (the ring protocol needs at least three
to fit), so the floor of four messages guarantees that a message of ``message_size``
bytes always fits, whatever the frequency or the bound. Memory stays proportional to what
a service carries: a 100 Hz IMU gets 64 KiB, a 20 Hz model output a few MiB, instead of
10 MiB each. A registry without message sizes (openpilot's ``services.py`` has frequency,
should_log and decimation only) gets :data:`UNSIZED_QUEUE_SIZE` for every service: the 10
MiB upstream msgq gives every queue, so a drop-in never has a smaller queue than upstream.
``python -m msgq.schemas`` prints the registry in force and the total.

Registries come from code (:class:`ServiceRegistry` of :class:`Service`) or from a file
(:func:`load_registry`): a Python file with a ``SERVICE_LIST`` mapping like cereal's
``services.py``, or a TOML/JSON file with a ``[services.NAME]`` table per service.

This module imports no Cap'n Proto: the socket layer and the ZMQ backend read it cheaply.
It puts nothing in force: the registry in force is the schema in force's
(:func:`msgq.schemas.use_schema`, the one place that sets both).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from msgq.tables import format_table, human_bytes

__all__ = [
    "BUFFER_SECONDS",
    "EVENT_DRIVEN_RATE_HZ",
    "MAX_QUEUE_SIZE",
    "MIN_QUEUE_SIZE",
    "SERVICE_LIST",
    "UNSIZED_QUEUE_SIZE",
    "Service",
    "ServiceRegistry",
    "derive_queue_size",
    "load_registry",
    "registry_from_mapping",
    "unknown_service_error",
]

#: Seconds of messages a queue holds at the service's frequency.
BUFFER_SECONDS = 2.0
#: Rate assumed for sizing the queue of an event-driven (frequency 0) service.
EVENT_DRIVEN_RATE_HZ = 10.0
#: Smallest queue made for a service.
MIN_QUEUE_SIZE = 64 * 1024
#: Largest queue the buffering term alone may ask for (the 4-message floor can exceed it).
MAX_QUEUE_SIZE = 64 * 1024 * 1024
#: Queue size of a service whose registry gives no message size (upstream's default for
#: every queue).
UNSIZED_QUEUE_SIZE = 10 * 1024 * 1024
#: First ZMQ port of the default registry (the ZMQ backend's base port).
BASE_PORT = 8023


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def derive_queue_size(message_size: int, frequency: float) -> int:
    """Queue size in bytes for a service (see the module docstring for the rule)."""
    if message_size <= 0:
        raise ValueError(f"message_size must be positive, not {message_size}")
    if frequency < 0:
        raise ValueError(f"frequency must be >= 0 Hz, not {frequency}")
    buffered = message_size * max(frequency, EVENT_DRIVEN_RATE_HZ) * BUFFER_SECONDS
    floor = max(MIN_QUEUE_SIZE, 4 * message_size)
    return _next_power_of_two(min(max(buffered, floor), max(floor, MAX_QUEUE_SIZE)))


@dataclass(frozen=True)
class Service:
    """One service: a field of the schema's Event union and the msgq endpoint of that name.

    ``frequency`` is in Hz (0 = event-driven); ``decimation`` keeps every Nth message in
    reduced logs (None: not in reduced logs); ``message_size`` is the largest encoded Event
    expected (bytes; None: not known, the queue gets :data:`UNSIZED_QUEUE_SIZE`);
    ``queue_size`` is derived from them; ``port`` is the ZMQ port (None: the backend hashes
    the name).
    """

    name: str
    should_log: bool
    frequency: float
    message_size: int | None = None
    decimation: int | None = None
    port: int | None = None
    queue_size: int = field(init=False)

    def __post_init__(self) -> None:
        if self.frequency < 0:
            raise ValueError(f"{self.name}: frequency must be >= 0 Hz, not {self.frequency}")
        size = UNSIZED_QUEUE_SIZE if self.message_size is None else \
            derive_queue_size(self.message_size, self.frequency)
        object.__setattr__(self, "queue_size", size)
        if self.decimation is not None and self.decimation < 1:
            raise ValueError(f"{self.name}: decimation must be >= 1 or None")


def unknown_service_error(name: str, known: Iterable[str]) -> KeyError:
    """A KeyError for an unknown service name that suggests the closest known names."""
    close = difflib.get_close_matches(str(name), list(known), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return KeyError(f"unknown service {name!r}{hint}")


class ServiceRegistry(Mapping[str, Service]):
    """An ordered, read-only mapping of service name to :class:`Service`.

    Unknown names raise a KeyError naming close matches.
    """

    def __init__(self, services: Iterable[Service]) -> None:
        self._services: dict[str, Service] = {}
        for service in services:
            if service.name in self._services:
                raise ValueError(f"service {service.name!r} is listed twice")
            self._services[service.name] = service

    def __getitem__(self, name: str) -> Service:
        try:
            return self._services[name]
        except KeyError:
            raise unknown_service_error(name, self._services) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._services)

    def __len__(self) -> int:
        return len(self._services)

    def __hash__(self) -> int:
        return hash(tuple(self._services.values()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ServiceRegistry):
            return list(self._services.values()) == list(other._services.values())
        return Mapping.__eq__(self, other)

    def __repr__(self) -> str:
        return f"ServiceRegistry({len(self)} services)"

    @property
    def total_queue_size(self) -> int:
        """Bytes of shared memory all queues of this registry take together."""
        return sum(s.queue_size for s in self._services.values())

    def table(self) -> str:
        """The registry as a text table (one line per service) with the total."""
        rows = [("service", "Hz", "log", "decim", "msg bytes", "queue", "port")]
        for s in self._services.values():
            rows.append((
                s.name, f"{s.frequency:g}", "yes" if s.should_log else "no",
                "-" if s.decimation is None else str(s.decimation),
                "-" if s.message_size is None else str(s.message_size),
                human_bytes(s.queue_size), "-" if s.port is None else str(s.port),
            ))
        lines = [format_table(rows)]
        lines.append(f"{len(self)} services, {human_bytes(self.total_queue_size)} of queues "
                     "in all")
        return "\n".join(lines)


# name, should_log, frequency Hz, largest message bytes, decimation in reduced logs.
# Append new services at the end: a service's position gives its default ZMQ port.
_DEFAULT_SERVICES: tuple[tuple[str, bool, float, int, int | None], ...] = (
    ("logStart", True, 0.0, 4096, 1),
    ("gyroscope", True, 104.0, 256, 10),
    ("accelerometer", True, 104.0, 256, 10),
    ("magnetometer", True, 25.0, 256, None),
    ("temperatureSensor", True, 2.0, 256, 1),
    ("gnssMeasurements", True, 10.0, 8192, 1),
    ("gpsLocation", True, 10.0, 512, 1),
    ("can", True, 100.0, 16384, None),
    ("sendcan", True, 100.0, 4096, None),
    ("vehicleState", True, 100.0, 1024, 10),
    ("vehicleParams", True, 0.02, 4096, 1),
    ("controlCommand", True, 100.0, 512, 10),
    ("controllerState", True, 100.0, 1024, 10),
    ("plan", True, 20.0, 8192, 2),
    ("modelOutput", True, 20.0, 131072, 2),
    ("radarState", True, 20.0, 8192, 2),
    ("localization", True, 20.0, 1024, 2),
    ("calibration", True, 4.0, 512, 1),
    ("driverMonitoring", True, 20.0, 512, 2),
    ("roadCameraState", True, 20.0, 512, 2),
    ("driverCameraState", True, 20.0, 512, 2),
    ("wideRoadCameraState", True, 20.0, 512, 2),
    ("roadEncodeIdx", False, 20.0, 256, 1),
    ("driverEncodeIdx", False, 20.0, 256, 1),
    ("wideRoadEncodeIdx", False, 20.0, 256, 1),
    ("deviceState", True, 2.0, 2048, 1),
    ("powerState", True, 2.0, 1024, 1),
    ("managerState", True, 2.0, 16384, 1),
    ("clocks", True, 1.0, 256, 1),
    ("logMessage", True, 0.0, 8192, None),
    ("errorLogMessage", True, 0.0, 8192, 1),
    ("params", True, 0.0, 65536, 1),
    ("userBookmark", True, 0.0, 1024, 1),
    ("customReserved0", True, 0.0, 32768, None),
    ("customReserved1", True, 0.0, 32768, None),
    ("customReserved2", True, 0.0, 32768, None),
    ("customReserved3", True, 0.0, 32768, None),
    ("customReserved4", True, 0.0, 32768, None),
    ("customReserved5", True, 0.0, 32768, None),
    ("customReserved6", True, 0.0, 32768, None),
    ("customReserved7", True, 0.0, 32768, None),
    ("customReserved8", True, 0.0, 32768, None),
    ("customReserved9", True, 0.0, 32768, None),
)

#: The default registry (services of schemas/log.capnp), by name.
SERVICE_LIST = ServiceRegistry(
    Service(name, should_log, frequency, size, decimation, port=BASE_PORT + index)
    for index, (name, should_log, frequency, size, decimation) in enumerate(_DEFAULT_SERVICES)
)

def _number(value: Any, what: str, name: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"service {name!r}: {what} must be a number, not {value!r}")
    return value


def _service_from(name: str, entry: Any, index: int) -> Service:
    """A :class:`Service` from one registry entry: a Service, an object with cereal's
    attributes (``should_log``, ``frequency``, ``decimation``, optional ``port``,
    ``message_size``) or a dict with those keys."""
    if isinstance(entry, Service):
        return entry if entry.name == name else Service(
            name, entry.should_log, entry.frequency, entry.message_size, entry.decimation,
            entry.port)
    get = entry.get if isinstance(entry, Mapping) else \
        (lambda key, default=None: getattr(entry, key, default))
    frequency = get("frequency")
    if frequency is None:
        raise ValueError(f"service {name!r} has no frequency")
    size = get("message_size")
    decimation = get("decimation")
    port = get("port")
    return Service(
        str(name),
        bool(get("should_log", True)),
        float(_number(frequency, "frequency", name)),
        None if size is None else int(_number(size, "message_size", name)),
        None if decimation is None or decimation < 0 else
        max(1, int(_number(decimation, "decimation", name))),
        None if port is None else int(_number(port, "port", name)),
    )


def registry_from_mapping(services: Mapping[str, Any]) -> ServiceRegistry:
    """A :class:`ServiceRegistry` from a mapping of service name to entry (see
    :func:`load_registry` for what an entry may be), keeping its order."""
    if isinstance(services, ServiceRegistry):
        return services
    return ServiceRegistry(_service_from(str(name), entry, index)
                           for index, (name, entry) in enumerate(services.items()))


def load_registry(path: str) -> ServiceRegistry:
    """The service registry in the file at ``path``:

    * ``.py`` — a Python file (run as a script, as cereal's ``services.py`` is imported)
      defining ``SERVICE_LIST``: a mapping of name to an object with ``should_log``,
      ``frequency`` and ``decimation`` attributes (cereal's ``Service``; ``port`` and
      ``message_size`` are used where present), or a :class:`ServiceRegistry`;
    * ``.toml`` / ``.json`` — a ``services`` table of name to ``{frequency, should_log,
      decimation, message_size, port}`` (only ``frequency`` is required).

    Raises FileNotFoundError, or ValueError naming the file and what is wrong with it."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"service registry {path} does not exist")
    suffix = os.path.splitext(path)[1].lower()
    # loaded only to read a registry file (importing msgq stays cheap)
    import json
    import runpy

    try:
        if suffix == ".py":
            namespace = runpy.run_path(path, run_name="msgq_services")
            services = namespace.get("SERVICE_LIST")
            if not isinstance(services, Mapping):
                raise ValueError("it defines no SERVICE_LIST mapping")
        elif suffix in (".toml", ".json"):
            with open(path, "rb") as f:
                if suffix == ".toml":
                    try:
                        import tomllib  # read only for a .toml registry
                    except ImportError:  # Python 3.10: the backport, a dependency there
                        import tomli as tomllib

                    doc = tomllib.load(f)
                else:
                    doc = json.load(f)
            services = doc.get("services") if isinstance(doc, dict) else None
            if not isinstance(services, dict):
                raise ValueError("it has no 'services' table")
        else:
            raise ValueError("a registry is a .py, .toml or .json file")
        return registry_from_mapping(services)
    except (ValueError, TypeError, SyntaxError) as e:
        raise ValueError(f"service registry {path}: {e}") from None

