"""The ZMQ backend: the msgq socket protocol over pyzmq TCP sockets.

This is the portable backend (no Linux-only calls) and the one that reaches other
machines. Each endpoint maps to one TCP port (:func:`endpoint_port`); its publisher binds
that port on ``bind_address`` (default every interface) and subscribers connect to
``tcp://<addr>:<port>``.

Behaviour that differs from the shared-memory backend, by nature of ZMQ:

* A second publisher of an endpoint fails in ``connect`` with
  :class:`~msgq.errors.MultiplePublishersError` (the port is taken); the first one keeps
  the endpoint. The shared-memory backend lets the newcomer take over instead.
* Delivery starts once a subscriber's connection is up. ``SubSocket.connect`` waits
  (at most ``connect_wait_ms``) until the publisher answered, and ``PubSocket.send``
  waits (at most ``join_wait_ms``) for the subscription of a connection it has accepted
  but not yet heard from, so a message sent after ``sub_sock()`` returned reaches that
  subscriber. A subscriber that connects after a send does not get that message.
* ``all_readers_updated()`` means what it means on shared memory: at least one
  subscriber is connected and every subscriber has read everything sent to it. ZMQ has
  no read acknowledgements of its own, so msgq's subscribers send one upstream (a
  subscription they drop at once, which filters nothing: ``ACK_TOPIC``) when they have
  read everything that arrived, naming the last message they read by its fingerprint
  (length and the CRC-32 of its first and last 32 bytes); the publisher compares it with
  the last message it sent. The acknowledgement travels like a message, so the publisher
  learns of a read a moment after it happened: ``wait_for_readers`` / ``wait_until_read``
  wait for it. A subscriber that is not msgq's (another ZMQ program) tells nothing of its
  reads and counts as up to date once subscribed. ``num_readers`` counts subscribed
  connections.
* Queues are bounded by message count, not bytes: ``sndhwm`` messages per subscriber on
  the publisher side and ``rcvhwm`` on the subscriber side; past them messages to that
  subscriber are dropped, so a stalled or dead subscriber never grows the publisher's
  memory without bound. Heartbeats drop connections to peers that vanished.
* ``segment_size`` is checked like the shared-memory backend does and otherwise ignored.

Environment, read when a socket is created (keyword arguments of the socket win):

``MSGQ_ZMQ_BASE_PORT`` / ``MSGQ_ZMQ_PORT_SPAN``
    The port range (default 8023, 24745 ports: 8023..32767, below Linux's ephemeral range).
``MSGQ_PREFIX`` / ``OPENPILOT_PREFIX``
    Part of the port hash, so runs with different prefixes use different ports.
``MSGQ_ZMQ_BIND``
    Address publishers bind (default ``*``: every interface).
``MSGQ_ZMQ_SNDHWM`` / ``MSGQ_ZMQ_RCVHWM``
    High-water marks in messages (default 1000 each).
``MSGQ_ZMQ_LINGER``
    Milliseconds ``close`` (and process exit) may spend flushing unsent messages
    (default 1000).
``MSGQ_ZMQ_CONNECT_WAIT_MS`` / ``MSGQ_ZMQ_JOIN_WAIT_MS``
    The two waits above (defaults 500 and 200; 0 turns a wait off).

Messages that did not come from a publisher of this endpoint are dropped and counted in
``SubSocket.dropped_messages``, with one logged warning per socket: multi-part messages
(msgq messages are one frame), messages from a msgq publisher of another endpoint (two
names hashed to one port) and messages from peers without ZMTP 3 metadata (legacy ZMQ,
or a non-ZMQ program on the port whose bytes libzmq parsed as ZMTP 1.0). Single-frame
messages from other ZMQ 4 publishers carry no endpoint tag and are delivered as they are.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import fnmatch
import itertools
import logging
import os
import re
import socket as _socket
import threading
import time
import weakref
import zlib
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

try:
    import zmq
    import zmq.utils.z85
    from zmq.utils.monitor import parse_monitor_message
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError(
        "the zmq backend needs pyzmq: pip install pyzmq (or choose MSGQ_BACKEND=msgq)"
    ) from e

from msgq._reservation import Reservation
from msgq.aio import await_until, next_message, wait_for_result
from msgq.errors import IpcError, MultiplePublishersError, readers_timeout
from msgq.queues import (
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    fnv1a_64,
    namespace_prefix,
    validate_endpoint,
)
from msgq.schemas import selection, services

__all__ = [
    "DEFAULT_BASE_PORT",
    "QUEUED_ON_SEND",
    "DEFAULT_PORT_SPAN",
    "CLIENT_ENV",
    "KEYS_ENV",
    "ClientGrant",
    "Context",
    "Keys",
    "Poller",
    "PubSocket",
    "SubSocket",
    "ZapHandler",
    "create_keys",
    "endpoint_port",
    "keys_setting",
    "load_keys",
]

log = logging.getLogger("msgq.zmq")

#: A message still travels (libzmq's I/O threads, TCP) when ``send`` returns: it is not
#: yet in the subscribers' queues (the backend protocol's flag; see msgq/sockets.py).
QUEUED_ON_SEND = False
#: First port of the endpoint port range (the port upstream msgq's mapping starts at).
DEFAULT_BASE_PORT = 8023
#: Number of ports in the range: 8023..32767, which stays below Linux's ephemeral ports.
DEFAULT_PORT_SPAN = 32768 - DEFAULT_BASE_PORT
DEFAULT_SNDHWM = 1000
DEFAULT_RCVHWM = 1000
DEFAULT_LINGER_MS = 1000
DEFAULT_CONNECT_WAIT_MS = 500
DEFAULT_JOIN_WAIT_MS = 200
DEFAULT_BIND_ADDRESS = "*"

#: Connection-level metadata a publisher attaches to every message it sends.
ENDPOINT_PROPERTY = "X-Msgq-Endpoint"

#: Connection-level metadata of a subscriber: its reader id (16 hex digits), which the
#: publisher keys the subscriber's read acknowledgements by.
READER_PROPERTY = "X-Msgq-Reader"
#: Topic prefix of a read acknowledgement: a subscriber subscribes to and at once
#: unsubscribes from ``ACK_TOPIC + reader id + fingerprint`` (little-endian, 8 bytes) of
#: the last message it read. The publisher applies subscriptions itself (XPUB_MANUAL) and
#: never applies these, so they filter nothing.
ACK_TOPIC = b"\xfdmsgq-read:"
#: Topic a subscriber that does not conflate subscribes to besides everything
#: (``+ reader id``): the unsubscription libzmq makes when its connection ends then
#: names it. (A conflating socket delivers only the last of its subscriptions, so it
#: keeps to one; its reader id travels in its connection's metadata instead.)
READER_TOPIC = b"\xfemsgq-reader:"
#: Sent like an acknowledgement (``+ reader id``) by a subscriber that closes.
BYE_TOPIC = b"\xfdmsgq-bye:"

#: Shortest time between two reads of a publisher's peer events (seconds).
PEER_CHECK_INTERVAL_S = 0.001

# Longest single wait inside a blocking call, so Ctrl-C is answered promptly.
_SLICE_MS = 50
_HEARTBEAT_IVL_MS = 1000
_HEARTBEAT_TIMEOUT_MS = 5000
_RECONNECT_IVL_MS = 50
_RECONNECT_IVL_MAX_MS = 500
# Shortest time between two reconnects after a non-ZMQ peer spoke on a subscriber's port.
_RELINK_S = 0.1
# How long connect() waits for the listener of a publisher closed by this process to go
# away (plus that publisher's linger).
_RELEASE_WAIT_S = 1.0
# How long the port-conflict diagnosis waits for a ZMTP greeting.
_PROBE_TIMEOUT_S = 0.25

# This process's id, kept current across fork() without a getpid() call per message.
_process_id = os.getpid()


def _forked_child() -> None:
    global _process_id
    _process_id = os.getpid()


os.register_at_fork(after_in_child=_forked_child)


def _env_int(name: str, default: int, minimum: int, maximum: int = 2**31 - 1) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 10)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer; unset it or give a number") from None
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}={value} is out of range; use {minimum}..{maximum}")
    return value


def _option(value: int | None, env: str, default: int, minimum: int = 0) -> int:
    if value is None:
        return _env_int(env, default, minimum)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{env.removeprefix('MSGQ_ZMQ_').lower()} must be int, not "
                        f"{type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{env.removeprefix('MSGQ_ZMQ_').lower()} must be >= {minimum}")
    return value


def _endpoint_str(endpoint: Any) -> str:
    validate_endpoint(endpoint)  # TypeError / ValueError, same rules as every backend
    return endpoint.decode("utf-8") if isinstance(endpoint, bytes) else str(endpoint)


def _check_segment_size(endpoint: str, segment_size: Any) -> None:
    if not isinstance(segment_size, int) or isinstance(segment_size, bool):
        raise TypeError(f"segment_size must be int, not {type(segment_size).__name__}")
    if segment_size != 0 and not MIN_SEGMENT_SIZE <= segment_size <= MAX_SEGMENT_SIZE:
        raise ValueError(
            f"endpoint {endpoint!r}: segment_size must be 0 or between {MIN_SEGMENT_SIZE} "
            f"and {MAX_SEGMENT_SIZE} bytes")


def endpoint_port(endpoint: str | bytes, prefix: str | None = None) -> int:
    """The TCP port of ``endpoint``: ``base + fnv1a_64(key) % span``, or, without a
    namespace prefix, the service registry's port of a registry service (``base`` + its
    position in the registry: stable, collision-free ports for the well-known services).

    ``key`` is the endpoint name, or ``"<prefix>/<endpoint>"`` when a namespace prefix is
    set (``prefix``, default :func:`namespace_prefix`), so parallel runs with different
    prefixes get different ports. ``base`` and ``span`` come from ``MSGQ_ZMQ_BASE_PORT``
    (default 8023) and ``MSGQ_ZMQ_PORT_SPAN`` (default 24745, clamped to end at 65535).
    Different names can share a port; the second publisher then fails with a clear error
    and subscribers drop messages tagged with another endpoint.
    """
    name = _endpoint_str(endpoint)
    if prefix is None:
        prefix = namespace_prefix()
    base = _env_int("MSGQ_ZMQ_BASE_PORT", DEFAULT_BASE_PORT, 1, 65535)
    span = _env_int("MSGQ_ZMQ_PORT_SPAN", min(DEFAULT_PORT_SPAN, 65536 - base), 1, 65535)
    if base + span - 1 > 65535:
        raise ValueError(
            f"MSGQ_ZMQ_BASE_PORT={base} with MSGQ_ZMQ_PORT_SPAN={span} goes past port 65535; "
            "lower one of them")
    if not prefix:
        service = selection.find_service(name)
        if service is not None and service.port is not None:
            offset = service.port - services.BASE_PORT
            if 0 <= offset < span:
                return base + offset
    key = f"{prefix}/{name}" if prefix else name
    return base + fnv1a_64(key.encode("utf-8")) % span


def fingerprint(data: Any) -> int:
    """What a read acknowledgement says of a message: its length and a CRC-32 of its
    first and last 32 bytes (a message's own time stamp lies in its first bytes)."""
    if type(data) is not bytes:
        data = memoryview(data)
        if data.format != "B" or data.ndim != 1:
            data = data.cast("B")
    size = len(data)
    crc = zlib.crc32(data[:32])
    if size > 32:
        crc = zlib.crc32(data[-32:], crc)
    return (crc << 32) | (size & 0xFFFFFFFF)


@dataclass
class _ReaderState:
    """What a publisher knows of one subscriber that acknowledges reads."""

    #: Messages the publisher had sent when the reader's subscription took effect.
    base: int
    #: Fingerprint of the last message the reader said it read (None: none yet).
    read: int | None = None
    #: Whether the end of its connection names it (READER_TOPIC): not so for a
    #: conflating subscriber, which is forgotten when an unnamed connection ends.
    named: bool = False


def _endpoint_tag(endpoint: str) -> str:
    prefix = namespace_prefix()
    return f"{prefix}/{endpoint}" if prefix else endpoint


def _tcp_host(address: str) -> str:
    """``address`` as the host part of a tcp:// URL (IPv6 literals in brackets)."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]"
    return address


# ---------------------------------------------------------------------------------------
# CurveZMQ keys and permissions. libzmq does the cryptography (CURVE) and pyzmq the
# certificate files (zmq.auth); this part only chooses keys and answers ZAP requests.

#: The setting that turns CURVE on for every ZMQ socket of a process: a key directory.
KEYS_ENV = "MSGQ_ZMQ_KEYS"
#: Which client key of the key directory a subscriber uses (a name in DIR/clients).
CLIENT_ENV = "MSGQ_ZMQ_CLIENT"
#: Name of the publisher's (server's) key pair in a key directory.
SERVER_KEY_NAME = "server"
#: Folder of the client key pairs in a key directory.
CLIENTS_FOLDER = "clients"
#: The permissions file of a key directory (optional).
PERMISSIONS_FILE = "permissions.toml"
#: Where libzmq sends a CURVE server's authentication requests (RFC 27, ZAP).
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                     | zmq.EVENT_HANDSHAKE_FAILED_AUTH)
_CLIENT_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ClientGrant:
    """What one client key may read: service names and VisionIPC streams
    (``"NAME/STREAM"``) matching its glob patterns."""

    name: str
    public_key: bytes
    services: tuple[str, ...] = ("*",)
    vision: tuple[str, ...] = ("*",)

    def may_read(self, service: str) -> bool:
        """True when ``service`` matches one of the client's service patterns."""
        return any(fnmatch.fnmatchcase(service, p) for p in self.services)

    def may_watch(self, name: str, stream: int) -> bool:
        """True when VisionIPC stream ``name/stream`` matches one of its vision patterns."""
        return any(fnmatch.fnmatchcase(f"{name}/{stream}", p) for p in self.vision)


@dataclass(frozen=True)
class Keys:
    """A loaded key directory (see :func:`load_keys`)."""

    directory: str
    server_public: bytes
    server_secret: bytes | None
    client_name: str | None
    client_public: bytes | None
    client_secret: bytes | None
    grants: dict[bytes, ClientGrant] = field(default_factory=dict)
    #: Public keys of the client key files in DIR/clients, by name.
    clients: dict[str, bytes] = field(default_factory=dict)
    #: Why this process has no client key to use (when it has none).
    client_problem: str = ""

    def grant(self, public_key: bytes) -> ClientGrant | None:
        """The grant of a client's public key (Z85), None for a key not allowed at all."""
        return self.grants.get(public_key)

    def server_secret_or_raise(self) -> bytes:
        """The publisher's secret key, or ValueError saying how to get one."""
        if self.server_secret is None:
            raise ValueError(
                f"{self.directory}: no {SERVER_KEY_NAME}.key_secret, so this process cannot "
                "publish with keys; copy it from the key directory made by `msgq keys init`")
        return self.server_secret

    def client_keys_or_raise(self) -> tuple[bytes, bytes]:
        """This process's client key pair, or ValueError saying which to choose."""
        if self.client_public is None or self.client_secret is None:
            raise ValueError(self.client_problem)
        return self.client_public, self.client_secret


def _check_secret_mode(path: str) -> None:
    mode = os.stat(path).st_mode & 0o777
    if mode & 0o077:
        raise ValueError(f"{path} can be read by other users (mode {mode:o}); "
                         f"run chmod 600 {path}")


def _load_pair(path_public: str) -> tuple[bytes, bytes | None]:
    """The public key of ``NAME.key`` and the secret of ``NAME.key_secret`` beside it
    (None when absent)."""
    import zmq.auth  # only a process with keys reads certificate files

    secret_path = path_public + "_secret"
    if os.path.exists(secret_path):
        _check_secret_mode(secret_path)
        public, secret = zmq.auth.load_certificate(secret_path)
        return public, secret
    public, _ = zmq.auth.load_certificate(path_public)
    return public, None


def _patterns(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ValueError(f"{where} must be a list of glob patterns, e.g. [\"carState\", "
                         "\"gps*\"]")
    return tuple(value)


def _read_permissions(path: str, known: dict[str, bytes]) -> dict[bytes, ClientGrant]:
    import tomllib  # only a process with a permissions file parses TOML

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML ({e}); fix the file") from None
    clients = doc.get("clients", {})
    unknown = set(doc) - {"clients"}
    if unknown or not isinstance(clients, dict):
        raise ValueError(f"{path}: only [clients.NAME] tables are allowed, found "
                         f"{sorted(unknown) or 'clients = ' + type(clients).__name__}")
    grants: dict[bytes, ClientGrant] = {}
    for name, entry in clients.items():
        where = f"{path}: [clients.{name}]"
        if not isinstance(entry, dict) or set(entry) - {"public_key", "services", "vision"}:
            raise ValueError(f"{where} takes public_key, services and vision only")
        public = entry.get("public_key")
        if public is None:
            if name not in known:
                raise ValueError(f"{where}: no {CLIENTS_FOLDER}/{name}.key; add it with "
                                 "`msgq keys init DIR --client NAME` or give public_key")
            key = known[name]
        elif isinstance(public, str) and len(public) == 40:
            key = public.encode("ascii")
        else:
            raise ValueError(f"{where}: public_key must be the 40-character Z85 text of a "
                             ".key file's public-key line")
        grants[key] = ClientGrant(name, key, _patterns(entry.get("services", []),
                                                        f"{where} services"),
                                  _patterns(entry.get("vision", []), f"{where} vision"))
    return grants


def load_keys(directory: str | os.PathLike[str], client: str | None = None) -> Keys:
    """Reads a key directory made by ``msgq keys init``::

        DIR/server.key              the publishers' public key (every machine)
        DIR/server.key_secret       its secret (only where publishers run), mode 0600
        DIR/clients/NAME.key        each client's public key (where publishers run)
        DIR/clients/NAME.key_secret a client's secret (only on that client), mode 0600
        DIR/permissions.toml        optional: which client may read which services

    ``client`` (else ``MSGQ_ZMQ_CLIENT``, else the only client secret in the folder)
    picks the key pair this process subscribes with. Without a permissions file every
    client key in ``clients/`` may read everything. Raises ValueError naming what is
    missing or unsafe (a secret other users can read).
    """
    path = os.fspath(directory)
    server_public_path = os.path.join(path, f"{SERVER_KEY_NAME}.key")
    if not os.path.isfile(server_public_path) and not os.path.isfile(
            server_public_path + "_secret"):
        raise ValueError(f"{KEYS_ENV}={path}: no {SERVER_KEY_NAME}.key there; make a key "
                         f"directory with `msgq keys init {path}`")
    server_public, server_secret = _load_pair(server_public_path)
    clients_dir = os.path.join(path, CLIENTS_FOLDER)
    known: dict[str, bytes] = {}
    secrets: dict[str, bytes] = {}
    if os.path.isdir(clients_dir):
        for entry in sorted(os.listdir(clients_dir)):
            name, ext = os.path.splitext(entry)
            if ext == ".key" or (ext == ".key_secret"
                                 and not os.path.exists(os.path.join(clients_dir, name + ".key"))):
                public, secret = _load_pair(os.path.join(clients_dir, name + ".key"))
                known[name] = public
                if secret is not None:
                    secrets[name] = secret
    permissions = os.path.join(path, PERMISSIONS_FILE)
    if os.path.isfile(permissions):
        grants = _read_permissions(permissions, known)
    else:
        grants = {key: ClientGrant(name, key) for name, key in known.items()}
    client = client or os.environ.get(CLIENT_ENV) or None
    problem = ""
    if client is None:
        if len(secrets) == 1:
            client = next(iter(secrets))
        elif secrets:
            problem = (f"{path} holds the secret keys of {len(secrets)} clients "
                       f"({', '.join(sorted(secrets))}); choose one with {CLIENT_ENV}=NAME")
        else:
            problem = (f"{path} holds no client secret key ({CLIENTS_FOLDER}/NAME.key_secret), "
                       "so this process cannot subscribe with keys; copy this machine's "
                       "client key there")
    elif client not in secrets:
        problem = (f"{path}: no {CLIENTS_FOLDER}/{client}.key_secret for client {client!r}; "
                   f"choose one of {sorted(secrets) or 'none'} with {CLIENT_ENV}")
    if client is not None and client not in secrets:
        client = None
    return Keys(path, server_public, server_secret, client,
                known.get(client) if client else None, secrets.get(client) if client else None,
                grants, known, problem)


def _write_pair(folder: str, name: str, force: bool) -> bytes:
    """Writes NAME.key and NAME.key_secret (0600) into ``folder`` through a private
    temporary folder, so a secret is never readable by others, not even for a moment."""
    import tempfile  # only key-making code needs a scratch folder

    import zmq.auth  # and writes certificate files

    targets = [os.path.join(folder, name + ext) for ext in (".key", ".key_secret")]
    if not force:
        for target in targets:
            if os.path.exists(target):
                raise FileExistsError(
                    f"{target} exists; pass --force to replace it (every machine that holds "
                    "the old key then needs the new one)")
    scratch = tempfile.mkdtemp(prefix=".new-", dir=folder)  # mode 0700
    try:
        public_file, secret_file = zmq.auth.create_certificates(scratch, name)
        os.chmod(secret_file, 0o600)
        os.chmod(public_file, 0o644)
        public, _ = zmq.auth.load_certificate(public_file)
        os.replace(secret_file, targets[1])
        os.replace(public_file, targets[0])
    finally:
        for leftover in os.listdir(scratch):
            os.unlink(os.path.join(scratch, leftover))
        os.rmdir(scratch)
    return public


def create_keys(directory: str | os.PathLike[str], clients: list[str], server: bool = True,
                force: bool = False) -> list[tuple[str, bytes]]:
    """Makes a key directory (see :func:`load_keys`): the publishers' key pair (when
    ``server``) and one key pair per name in ``clients``, secrets 0600, folders 0700.
    Refuses to replace an existing key (FileExistsError) unless ``force``. Returns
    ``(name, public key)`` of every pair written (the server's as ``"server"``)."""
    path = os.fspath(directory)
    for name in clients:
        if not isinstance(name, str) or not _CLIENT_NAME.fullmatch(name):
            raise ValueError(f"client name {name!r}: use 1-64 letters, digits, '_', '-', '.'")
    if len(set(clients)) != len(clients):
        raise ValueError("each client name once, please")
    clients_dir = os.path.join(path, CLIENTS_FOLDER)
    os.makedirs(clients_dir, mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    os.chmod(clients_dir, 0o700)
    if not force:  # check every target first: nothing is written when one exists
        wanted = ([os.path.join(path, SERVER_KEY_NAME)] if server else []) + \
            [os.path.join(clients_dir, name) for name in clients]
        for stem in wanted:
            for ext in (".key", ".key_secret"):
                if os.path.exists(stem + ext):
                    raise FileExistsError(
                        f"{stem + ext} exists; pass --force to replace it (every machine "
                        "that holds the old key then needs the new one)")
    written = []
    if server:
        written.append((SERVER_KEY_NAME, _write_pair(path, SERVER_KEY_NAME, force)))
    for name in clients:
        written.append((name, _write_pair(clients_dir, name, force)))
    return written


def keys_setting(keys: str | os.PathLike[str] | None) -> str | None:
    """The key directory in force: ``keys`` when given (``""``: none), else
    ``MSGQ_ZMQ_KEYS`` (unset or empty: none, upstream's open sockets)."""
    if keys is None:
        keys = os.environ.get(KEYS_ENV, "")
    path = os.fspath(keys)
    return path or None


class ZapHandler:
    """Answers the ZAP requests of the CURVE servers (publishers) of one zmq.Context in a
    thread of its own, per ZAP domain (a publisher's endpoint or a bridge's socket):
    ``register(domain, decide)`` with ``decide(public_key) -> (user_id or None, reason)``.

    A request of a domain nobody registered is refused. Refusals are counted per domain
    (``refusals``); the first of each domain is logged with its reason, the others only
    counted.
    """

    def __init__(self, context: zmq.Context) -> None:
        self._context = context
        self._policies: dict[str, Any] = {}
        #: Refused clients, by domain.
        self.refusals: Counter[str] = Counter()
        #: Why the last client of each domain was refused.
        self.reasons: dict[str, str] = {}
        self._zap = context.socket(zmq.REP)
        self._zap.setsockopt(zmq.LINGER, 0)
        self._zap.bind(ZAP_ENDPOINT)
        address = f"inproc://msgq-zap-stop-{id(self)}"
        self._stop_end = context.socket(zmq.PAIR)
        self._stop_end.setsockopt(zmq.LINGER, 0)
        self._stop_end.bind(address)
        self._stop_listener = context.socket(zmq.PAIR)
        self._stop_listener.setsockopt(zmq.LINGER, 0)
        self._stop_listener.connect(address)
        self._thread = threading.Thread(target=self._serve, name="msgq-zap", daemon=True)
        self._thread.start()

    def register(self, domain: str, decide: Any) -> None:
        """Answers requests of ``domain`` with ``decide(public_key_z85)``."""
        self._policies[domain] = decide
        self.reasons.pop(domain, None)

    def unregister(self, domain: str, decide: Any = None) -> None:
        """Refuses ``domain`` from now on (only if its policy is ``decide``, when given)."""
        if decide is None or self._policies.get(domain) is decide:
            self._policies.pop(domain, None)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._zap, zmq.POLLIN)
        poller.register(self._stop_listener, zmq.POLLIN)
        try:
            while True:
                ready = dict(poller.poll())
                if self._stop_listener in ready:
                    return
                request = self._zap.recv_multipart()
                try:
                    reply = self._answer(request)
                except Exception as e:  # noqa: BLE001 - a refusal, never a dead handler
                    log.error("ZAP handler: %r while deciding; the client is refused", e)
                    request_id = request[1] if len(request) > 1 else b""
                    if len(request) > 2:
                        self.refusals[request[2].decode("utf-8", "replace")] += 1
                    reply = [b"1.0", request_id, b"500", b"internal error", b"", b""]
                self._zap.send_multipart(reply)
        except zmq.ContextTerminated:
            return
        finally:
            self._zap.close(0)
            self._stop_listener.close(0)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain_raw, address, _identity, mechanism = request[:6]
        domain = domain_raw.decode("utf-8", "replace")
        user_id, reason = None, "the client does not use CURVE"
        if mechanism == b"CURVE" and len(request) == 7 and len(request[6]) == 32:
            public = zmq.utils.z85.encode(request[6])
            decide = self._policies.get(domain)
            if decide is None:
                reason = "no publisher of that name takes clients here"
            else:
                user_id, reason = decide(public)
        if user_id is not None:
            return [version, request_id, b"200", b"OK", user_id.encode("utf-8"), b""]
        self.refusals[domain] += 1
        if domain not in self.reasons:
            log.warning("%r: refused a client at %s: %s (further refusals are counted, "
                        "not logged)", domain, address.decode("ascii", "replace"), reason)
        self.reasons[domain] = reason
        return [version, request_id, b"400", reason.encode("utf-8")[:255], b"", b""]

    def close(self) -> None:
        """Stops the thread; call before the context is ended."""
        if self._thread.is_alive():
            self._stop_end.send(b"")
            self._thread.join()
        self._stop_end.close(0)


# ZAP handlers by the zmq.Context they serve (one per context: one ZAP endpoint each).
_zap_handlers: dict[int, tuple[zmq.Context, ZapHandler]] = {}
_zap_lock = threading.Lock()


def zap_handler(context: zmq.Context) -> ZapHandler:
    """The ZAP handler of ``context``, started on first use."""
    with _zap_lock:
        entry = _zap_handlers.get(id(context))
        if entry is None or entry[0] is not context:
            entry = _zap_handlers[id(context)] = (context, ZapHandler(context))
        return entry[1]


def _unregister_zap(context: zmq.Context, domain: str, decide: Any) -> None:
    entry = _zap_handlers.get(id(context))
    if entry is not None and entry[0] is context:
        entry[1].unregister(domain, decide)


def stop_zap_handler(context: zmq.Context) -> None:
    """Stops ``context``'s ZAP handler, if it has one (before ending the context)."""
    with _zap_lock:
        entry = _zap_handlers.pop(id(context), None)
    if entry is not None and entry[0] is context:
        entry[1].close()


def service_policy(keys: Keys, service: str) -> Any:
    """The ZAP decision of a publisher of ``service``: clients whose grant covers it."""

    def decide(public: bytes) -> tuple[str | None, str]:
        grant = keys.grant(public)
        if grant is None:
            return None, (f"client key {public[:8].decode()}... is not in "
                          f"{keys.directory}/{CLIENTS_FOLDER} nor in {PERMISSIONS_FILE}")
        if not grant.may_read(service):
            return None, f"{PERMISSIONS_FILE} does not let client {grant.name!r} read it"
        return grant.name, ""

    return decide


def make_curve_server(sock: zmq.Socket, keys: Keys, domain: str, decide: Any) -> None:
    """Makes ``sock`` (not yet bound) a CURVE server whose clients ``decide`` admits, in
    ZAP domain ``domain``."""
    secret = keys.server_secret_or_raise()
    zap_handler(sock.context).register(domain, decide)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode("utf-8"))


def make_curve_client(sock: zmq.Socket, keys: Keys) -> None:
    """Makes ``sock`` (not yet connected) a CURVE client that accepts only the publisher
    key of ``keys``."""
    public, secret = keys.client_keys_or_raise()
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, secret)


def handshake_problem(event: int, value: int, keyed: bool, role: str) -> str:
    """One line saying why a handshake failed, for the ``role`` (publisher or subscriber)
    that saw ``event`` (a monitor event) with ``value``."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"the publisher refused this subscriber's key (ZAP status {value}): its "
                f"{PERMISSIONS_FILE} must let this client read the service")
    if role == "subscriber" and not keyed:
        return (f"the publisher requires CurveZMQ keys: set {KEYS_ENV}=DIR with a client "
                "key it allows")
    if role == "subscriber":
        return ("the publisher did not prove it holds the server key of "
                f"{KEYS_ENV} (a forged publisher, or one without or with other keys): "
                "nothing from it is delivered")
    if keyed:
        return (f"a peer without CurveZMQ keys for it was refused (a subscriber needs "
                f"{KEYS_ENV} with this key directory's server key and a client key)")
    return (f"a peer failed the handshake (a subscriber with CurveZMQ keys? then set "
            f"{KEYS_ENV} on this publisher too)")


class Context:
    """A zmq.Context, made on first use and made again in a forked child (a ZMQ context
    must not cross a fork).

    At normal exit (and at the end of a multiprocessing child) every context is ended, so
    messages sent just before exit still go out, waiting at most each socket's linger.
    """

    def __init__(self) -> None:
        self._ctx: zmq.Context | None = None
        self._pid = 0

    @property
    def zmq_context(self) -> zmq.Context:
        """The zmq.Context of this process."""
        if self._ctx is None or self._pid != os.getpid() or self._ctx.closed:
            self._ctx = zmq.Context(io_threads=1)
            self._pid = os.getpid()
            _live_contexts.add(self)
            _register_exit_flush()
        return self._ctx

    def term(self) -> None:
        """Closes every socket made with this context and ends it; unsent messages get at
        most each socket's linger to go out."""
        if self._ctx is not None and self._pid == os.getpid() and not self._ctx.closed:
            stop_zap_handler(self._ctx)
            self._ctx.destroy()
        self._ctx = None


_live_contexts: weakref.WeakSet[Context] = weakref.WeakSet()
# Connected publishers, closed (each within its linger) before the contexts at exit.
_live_publishers: weakref.WeakSet[PubSocket] = weakref.WeakSet()
_exit_flush_pid = 0


def _flush_at_exit() -> None:
    for publisher in list(_live_publishers):  # each waits for its readers first
        try:
            publisher.close()
        except Exception:
            pass
    for context in list(_live_contexts):
        if context._pid == os.getpid():
            try:
                context.term()
            except Exception:
                pass


def _register_exit_flush() -> None:
    # pyzmq does not end contexts at exit, and a process exiting with a live context
    # loses what its I/O thread had not sent yet. atexit covers ordinary exits; the
    # multiprocessing finalizer covers fork/forkserver children (they leave via os._exit).
    global _exit_flush_pid
    if _exit_flush_pid == os.getpid():
        return
    _exit_flush_pid = os.getpid()
    atexit.register(_flush_at_exit)
    import multiprocessing.util  # only where needed: it is slow to import

    multiprocessing.util.Finalize(None, _flush_at_exit, exitpriority=10)


default_context = Context()


def _new_socket(
    context: Any, endpoint: Any, segment_size: Any, kind: int, linger: int
) -> tuple[str, int, zmq.Socket]:
    """Checks the arguments every socket takes and makes a ZMQ socket with the options
    both ends share (linger, heartbeats): the endpoint name, its port and the socket."""
    name = _endpoint_str(endpoint)
    _check_segment_size(name, segment_size)
    port = endpoint_port(name)
    sock = _zmq_context(context).socket(kind)
    try:
        sock.setsockopt(zmq.LINGER, linger)
        sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    except BaseException:
        sock.close(linger=0)
        raise
    return name, port, sock


def _usable(sock: zmq.Socket | None, pid: int, endpoint: Any, role: str) -> zmq.Socket:
    """``sock`` if it is connected and was made in this process, else IpcError."""
    if sock is None:
        raise IpcError("socket is not connected; call connect() first")
    if pid != _process_id:
        raise IpcError(f"endpoint {endpoint!r}: a ZMQ socket cannot be used after fork; "
                       f"create the {role} in the process that uses it")
    return sock


def _zmq_context(context: Any) -> zmq.Context:
    # msgq.context (a ProcessContext) or another backend's context means "this process's
    # default ZMQ context".
    if isinstance(context, Context):
        return context.zmq_context
    return default_context.zmq_context


def _slice_ms(deadline: float | None) -> int:
    """The next wait of a blocking call in ms: at most ``_SLICE_MS`` (so Ctrl-C is
    answered), else the whole milliseconds left until ``deadline`` (None: none); 0 once
    the deadline is reached.

    ZMQ waits count whole milliseconds, so the last fraction of one is slept here, by
    the clock: rounding it up to a whole millisecond made every timed wait end up to
    1 ms late, the whole margin of a 199 ms receive timeout checked against 200 ms
    (cereal's test_receive_timeout)."""
    if deadline is None:
        return _SLICE_MS
    remaining = deadline - time.monotonic()
    if remaining >= 0.001:
        return min(_SLICE_MS, int(remaining * 1000))
    if remaining > 0:
        time.sleep(remaining)
    return 0


_monitor_ids = itertools.count()


def _open_monitor(sock: zmq.Socket, events: int) -> zmq.Socket:
    """A monitor socket of ``sock`` for ``events`` whose queue has no limit.

    libzmq's side of a monitor sends blocking, in the I/O thread: with pyzmq's
    get_monitor_socket (a queue of ~2000 messages) a publisher that is not reading its
    monitor — idle between sends — stopped accepting connections after a few hundred
    connection attempts (a flood of them locked out its real subscribers). The events
    are read at each send (or look); what waits meanwhile is a few dozen bytes each.
    """
    address = f"inproc://msgq-monitor-{os.getpid()}-{next(_monitor_ids)}"
    sock.monitor(address, events)
    monitor = sock.context.socket(zmq.PAIR)
    try:
        monitor.setsockopt(zmq.LINGER, 0)
        monitor.setsockopt(zmq.RCVHWM, 0)
        monitor.connect(address)
    except BaseException:
        monitor.close(0)
        sock.disable_monitor()
        raise
    return monitor


def _close_monitor(sock: zmq.Socket, monitor: zmq.Socket | None) -> None:
    """Stops ``sock``'s monitor and closes the monitor socket (nothing when ``monitor`` is
    None); a socket whose monitor is already gone is fine."""
    if monitor is None:
        return
    try:
        sock.disable_monitor()
    except zmq.ZMQError:
        pass
    monitor.close(0)


def _wait_monitor(monitor: zmq.Socket, wanted: int, deadline: float,
                  failed: Any = None) -> int:
    """Waits on a monitor socket for an event in ``wanted``; returns it, or 0 at the
    deadline. A failed handshake is passed to ``failed(event, value)`` first."""
    while True:
        slice_ms = _slice_ms(deadline)
        if not slice_ms:
            return 0
        if monitor.poll(slice_ms):
            message = parse_monitor_message(monitor.recv_multipart())
            event = int(message["event"])
            if failed is not None and event & _HANDSHAKE_FAILED:
                failed(event, int(message["value"]))
            if event & wanted:
                return event


# Ports of publishers this process closed -> until when a bind may wait for them.
_released_ports: dict[int, float] = {}


def _bind(sock: zmq.Socket, url: str, port: int) -> None:
    """Binds, waiting while a publisher this process just closed still holds the port."""
    while True:
        try:
            sock.bind(url)
        except zmq.ZMQError as e:
            if e.errno != errno.EADDRINUSE or time.monotonic() >= _released_ports.get(port, 0):
                _released_ports.pop(port, None)
                raise
            time.sleep(0.002)
            continue
        _released_ports.pop(port, None)
        return


def _port_holder(host: str, port: int) -> str:
    """Says what holds a TCP port that a bind was refused: ``"zmq"`` (a ZMQ publisher
    answered, or something listens on another address, as a publisher bound to one
    address does) or ``"other"``."""
    probe_host = "127.0.0.1" if host in ("*", "0.0.0.0") else host.strip("[]")
    try:
        with _socket.create_connection((probe_host, port), timeout=_PROBE_TIMEOUT_S) as s:
            greeting = s.recv(10)
    except ConnectionRefusedError:
        if host not in ("*", "0.0.0.0"):
            return "other"
        # Nothing listens on the loopback address. If we may bind it, the holder is bound
        # to another address only: a publisher bound with bind_address/MSGQ_ZMQ_BIND.
        try:
            with _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM) as s:
                s.bind((probe_host, port))
        except OSError:
            return "other"
        return "zmq"
    except OSError:
        return "other"
    # A ZMTP greeting: 0xFF, 8 bytes of padding, then 0x7F.
    if len(greeting) >= 10 and greeting[0] == 0xFF and greeting[9] & 1:
        return "zmq"
    return "other"


class BufferReservation(Reservation):
    """A :class:`~msgq.shm_backend.Reservation` (the commit/abort protocol of every
    backend) whose room is a buffer of this process, sent when committed: ZMQ sends it
    without another copy (``copy=False``). :meth:`PubSocket.reserve` makes it: the
    base's constructor takes the view, ``_pub`` and ``_buffer`` are set after (no
    Python ``__init__``: a quarter less time per reservation)."""

    __slots__ = ("_pub", "_buffer")
    _pub: PubSocket
    _buffer: bytearray

    def _publish(self) -> None:
        self._pub._reservation = None
        self._pub._send(self._buffer, copy=False)

    def _drop(self) -> None:
        self._pub._reservation = None


class PubSocket:
    """The publisher of one endpoint: an XPUB socket bound on the endpoint's port.

    Options (keyword arguments, else the environment, else the default): ``sndhwm``
    (messages queued per subscriber), ``linger`` (ms), ``bind_address``, ``join_wait_ms``,
    ``keys`` (a key directory, ``MSGQ_ZMQ_KEYS``: the publisher is then a CURVE server
    that admits the client keys its permissions let read this endpoint; ``""``: none).
    """

    def __init__(
        self,
        *,
        sndhwm: int | None = None,
        linger: int | None = None,
        bind_address: str | None = None,
        join_wait_ms: int | None = None,
        keys: str | os.PathLike[str] | None = None,
    ) -> None:
        self.sndhwm = _option(sndhwm, "MSGQ_ZMQ_SNDHWM", DEFAULT_SNDHWM)
        self.linger = _option(linger, "MSGQ_ZMQ_LINGER", DEFAULT_LINGER_MS)
        self.join_wait_ms = _option(join_wait_ms, "MSGQ_ZMQ_JOIN_WAIT_MS", DEFAULT_JOIN_WAIT_MS)
        self.bind_address = bind_address or os.environ.get("MSGQ_ZMQ_BIND") or DEFAULT_BIND_ADDRESS
        #: The key directory in force (None: no keys, upstream's open socket).
        self.keys_dir = keys_setting(keys)
        self.endpoint: str | None = None
        self.port: int | None = None
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._refused = 0
        self._refusal_said = False
        self._decide: Any = None
        self._pid = 0
        self._connections = 0
        self._subscriptions = 0
        self._readers = 0
        self._last_accept = float("-inf")
        self._next_peer_check = 0.0
        self._reservation: BufferReservation | None = None
        # Read acknowledgements: messages sent, the fingerprint of the last one (kept
        # while a reader acknowledges), and the readers by id.
        self._sent = 0
        self._last_sent: int | None = None
        self._last_data: Any = None  # the last message, while its fingerprint is not made
        self._ack_readers: dict[str, _ReaderState] = {}
        self._named_ends = 0

    def connect(self, context: Any, endpoint: str, segment_size: int = 0) -> None:
        """Binds the endpoint's port and becomes its publisher.

        Raises MultiplePublishersError when the port is taken (another publisher of this
        endpoint, or of an endpoint hashed to the same port), IpcError when an unrelated
        program holds it or the bind address is not usable.
        """
        keys = load_keys(self.keys_dir) if self.keys_dir else None
        if keys is not None:
            keys.server_secret_or_raise()
        name, port, sock = _new_socket(context, endpoint, segment_size, zmq.XPUB, self.linger)
        self.close()
        monitor = None
        decide = None
        try:
            if keys is not None:
                decide = service_policy(keys, name)
                make_curve_server(sock, keys, name, decide)
            sock.setsockopt(zmq.SNDHWM, self.sndhwm)
            # What comes upstream (subscriptions, read acknowledgements) is small and read
            # at every send: no limit, for a full inbound queue stops libzmq reading that
            # connection and then ends it, unsent messages and all.
            sock.setsockopt(zmq.RCVHWM, 0)
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every (un)subscription, for counting
            # Subscriptions take effect when _update_peers applies them, so the publisher
            # knows which messages each reader was sent (its read acknowledgements).
            sock.setsockopt(zmq.XPUB_MANUAL, 1)
            sock.setsockopt(zmq.METADATA, f"{ENDPOINT_PROPERTY}:{_endpoint_tag(name)}".encode())
            if ":" in self.bind_address or self.bind_address == "*":
                # "*" then means both IPv4 and IPv6 (libzmq falls back to IPv4 alone where
                # the machine has no IPv6).
                sock.setsockopt(zmq.IPV6, 1)
            monitor = _open_monitor(
                sock, zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | _HANDSHAKE_FAILED)
            host = _tcp_host(self.bind_address)
            try:
                _bind(sock, f"tcp://{host}:{port}", port)
            except zmq.ZMQError as e:
                raise self._bind_error(e, name, host, port) from None
        except BaseException:
            _close_monitor(sock, monitor)
            if decide is not None:
                _unregister_zap(sock.context, name, decide)
            sock.close(0)
            raise
        self._sock, self._monitor = sock, monitor
        self._pid = os.getpid()
        self.endpoint, self.port = name, port
        _live_publishers.add(self)
        self._decide = decide
        self._connections = self._subscriptions = self._readers = 0
        self._sent = 0
        self._last_sent = self._last_data = None
        self._ack_readers = {}
        self._refused = 0
        self._refusal_said = False
        self._last_accept = float("-inf")

    def _bind_error(self, e: zmq.ZMQError, name: str, host: str, port: int) -> Exception:
        where = f"endpoint {name!r} (TCP port {port} on {host})"
        if e.errno == errno.EADDRINUSE:
            hint = ("move this run's ports with MSGQ_PREFIX, MSGQ_ZMQ_BASE_PORT or "
                    "MSGQ_ZMQ_PORT_SPAN")
            if _port_holder(host, port) == "zmq":
                return MultiplePublishersError(
                    f"{where}: the port is in use by another ZMQ publisher: another "
                    "publisher of this endpoint, or of an endpoint whose name maps to the "
                    f"same port; close the other publisher, or {hint}")
            return IpcError(
                f"{where}: the port is in use by a program that is not a ZMQ publisher; "
                f"stop that program, or {hint}")
        if e.errno in (errno.EADDRNOTAVAIL, errno.ENODEV, errno.EINVAL):
            return IpcError(f"{where}: cannot bind: {e.strerror}; check bind_address / "
                            "MSGQ_ZMQ_BIND (an address of this machine, or *)")
        return IpcError(f"{where}: cannot bind: {e.strerror}")

    def _check_connected(self) -> zmq.Socket:
        return _usable(self._sock, self._pid, self.endpoint, "publisher")

    def _update_peers(self) -> None:
        """Reads accepted/closed connections and (un)subscriptions that have arrived."""
        sock, monitor = self._sock, self._monitor
        assert sock is not None and monitor is not None
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = parse_monitor_message(monitor.recv_multipart())
            event = message["event"]
            if event == zmq.EVENT_ACCEPTED:
                self._connections += 1
                self._last_accept = time.monotonic()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connections = max(0, self._connections - 1)
            elif event & _HANDSHAKE_FAILED:
                self._refused += 1
                # A ZAP refusal is told (once) by the ZAP handler, with the client's name.
                if not self._refusal_said and event != zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                    self._refusal_said = True
                    log.warning("endpoint %r: %s (refusals are counted in "
                                "refused_connections, not logged again)", self.endpoint,
                                handshake_problem(event, int(message["value"]),
                                                  self.keys_dir is not None, "publisher"))
        ended = self._named_ends = 0  # connections that ended; those a reader named
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frame = sock.recv(zmq.NOBLOCK, copy=False)
            if frame.more:  # anything multi-part is a foreign client's noise
                while sock.getsockopt(zmq.RCVMORE):
                    sock.recv(zmq.NOBLOCK, copy=False)
                continue
            data = frame.bytes
            if not data or data[0] > 1:
                continue  # anything but a (un)subscription: a foreign client's noise
            subscribe = data[0] == 1
            topic = data[1:]
            if topic.startswith((ACK_TOPIC, BYE_TOPIC, READER_TOPIC)):
                self._reader_said(subscribe, topic)
                continue  # never applied: they are messages, not filters
            # XPUB_MANUAL: apply it to the connection it came from (the last one read);
            # libzmq's own unsubscriptions of an ended connection apply to none.
            sock.setsockopt(zmq.SUBSCRIBE if subscribe else zmq.UNSUBSCRIBE, topic)
            delta = 1 if subscribe else -1
            self._subscriptions = max(0, self._subscriptions + delta)
            if not topic:
                self._readers = max(0, self._readers + delta)
                if subscribe:
                    self._reader_joined(frame)
                else:
                    ended += 1
        if ended > self._named_ends:
            # A connection ended that no READER_TOPIC names: another ZMQ program, or a
            # conflating msgq subscriber that vanished without saying goodbye. Forget
            # the conflating ones; each comes back with its next acknowledgement.
            for reader in [r for r, state in self._ack_readers.items() if not state.named]:
                del self._ack_readers[reader]

    def _reader_joined(self, frame: zmq.Frame) -> None:
        """A connection subscribed to everything (``frame``): if its subscriber
        acknowledges reads (its metadata names its reader id), everything sent from now
        on is for it to read."""
        try:
            reader = frame.get(READER_PROPERTY)
        except zmq.ZMQError:
            return  # not a msgq subscriber: counted, but it tells nothing of its reads
        if re.fullmatch(r"[0-9a-f]{16}", reader):
            state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
            state.base, state.read = self._sent, None

    def _reader_said(self, subscribe: bool, topic: bytes) -> None:
        """A subscriber's message: it read something (ACK_TOPIC + id + fingerprint), it
        is closing (BYE_TOPIC + id), it names its connection (READER_TOPIC + id,
        subscribed) or that connection ended (unsubscribed)."""
        if topic.startswith(ACK_TOPIC):
            payload = topic[len(ACK_TOPIC):]
            if len(payload) == 24:
                reader = payload[:16].decode("ascii", "replace")
                state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
                state.read = int.from_bytes(payload[16:], "little")
            return
        if topic.startswith(BYE_TOPIC):
            self._ack_readers.pop(topic[len(BYE_TOPIC):].decode("ascii", "replace"), None)
            return
        reader = topic[len(READER_TOPIC):].decode("ascii", "replace")
        if subscribe:
            state = self._ack_readers.setdefault(reader, _ReaderState(self._sent))
            state.named = True
        else:
            self._named_ends += 1
            self._ack_readers.pop(reader, None)

    def _joining(self) -> bool:
        return self._connections > self._subscriptions

    def _wait_for_joins(self, deadline: float | None, at_least_one: bool = False,
                        condition: Any = None) -> bool:
        """Waits until every accepted connection subscribed (and, with ``at_least_one``,
        one did; or until ``condition()``), or the deadline."""
        sock, monitor = self._sock, self._monitor
        assert sock is not None and monitor is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        while True:
            self._update_peers()
            if condition is not None:
                if condition():
                    return True
            elif self._ready() if at_least_one else not self._joining():
                return True
            slice_ms = _slice_ms(deadline)
            if not slice_ms:
                return False
            poller.poll(slice_ms)

    def send(self, data: Any) -> int:
        """Publishes ``data`` (bytes or any contiguous bytes-like object). Returns the
        number of bytes sent. Never blocks on slow subscribers (past ``sndhwm`` their
        copy is dropped); may wait up to ``join_wait_ms`` for a just-accepted subscriber's
        subscription."""
        self._check_connected()
        if self._reservation is not None:
            raise RuntimeError("a reservation is open on this socket; commit it first")
        if isinstance(data, str):
            raise TypeError("send() takes bytes-like data, not str; encode it first")
        if type(data) is bytes:
            n = len(data)
        else:
            try:
                view = memoryview(data)
            except TypeError:
                raise TypeError(
                    f"send() takes a bytes-like object, not {type(data).__name__}") from None
            if not view.contiguous:
                raise TypeError("send() needs a contiguous bytes-like object")
            n = view.nbytes
        self._send(data)
        return n

    def reserve(self, size: int) -> Reservation:
        """Room for a message of ``size`` bytes, written in place and sent at commit:
        ``with pub.reserve(n) as buf: buf[:n] = ...`` (as on the shared-memory backend)."""
        self._check_connected()
        if self._reservation is not None:
            raise RuntimeError("a reservation is already open on this socket")
        if not isinstance(size, int):
            raise TypeError(f"size must be an int, not {type(size).__name__}")
        if size < 0:
            raise ValueError("size must be >= 0")
        buffer = bytearray(size)
        reservation = BufferReservation(memoryview(buffer))
        reservation._pub, reservation._buffer = self, buffer
        self._reservation = reservation
        return reservation

    def _send(self, data: Any, copy: bool = True) -> None:
        sock = self._check_connected()
        # Reading peer events costs ~2 us per getsockopt(EVENTS), 5x a small send: do it
        # at most once per PEER_CHECK_INTERVAL_S. libzmq itself only processes incoming
        # subscriptions about once a millisecond while sending, so a subscriber joining a
        # publisher that is streaming may miss up to that much, as with plain pyzmq; a
        # publisher that was idle always checks, and waits for just-accepted joiners.
        now = time.monotonic()
        if now >= self._next_peer_check:
            self._next_peer_check = now + PEER_CHECK_INTERVAL_S
            self._update_peers()
            if self._joining() and self.join_wait_ms > 0:
                deadline = self._last_accept + self.join_wait_ms / 1000
                if now < deadline:
                    self._wait_for_joins(deadline)
        try:
            sock.send(data, zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            pass  # XPUB drops at the high-water mark instead of blocking; so do we
        except zmq.ZMQError as e:
            raise IpcError(f"endpoint {self.endpoint!r}: send failed: {e.strerror}") from None
        self._sent += 1
        if self._ack_readers:  # what a reader's acknowledgement is compared with:
            if type(data) is bytes or not copy:  # unchanging: fingerprinted when asked
                self._last_data, self._last_sent = data, None
            else:  # the caller may change it once send returns
                self._last_data, self._last_sent = None, fingerprint(data)

    def all_readers_updated(self) -> bool:
        """True when at least one subscriber is connected and every connection this
        publisher accepted has subscribed (a message sent now reaches every connected
        subscriber). ZMQ cannot report what subscribers have read."""
        self._check_connected()
        self._update_peers()
        return self._ready()

    def _ready(self) -> bool:
        if self._subscriptions == 0 or self._joining():
            return False
        return self._all_read()

    def _all_read(self) -> bool:
        # A reader is up to date when nothing was sent since it joined, or the last
        # message it read is the last one sent.
        if self._last_data is not None:
            self._last_sent, self._last_data = fingerprint(self._last_data), None
        sent, last = self._sent, self._last_sent
        return all(r.base == sent or r.read == last for r in self._ack_readers.values())

    def wait_until_read(self, timeout: float | None = None,
                        poll_interval: float = 0.001) -> bool:
        """Blocks until ``all_readers_updated()`` (True) or ``timeout`` seconds (False;
        None waits forever). ``poll_interval`` is accepted for the protocol's sake: this
        wait sleeps on the socket's events, not in steps."""
        self._check_connected()
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._wait_for_joins(deadline, at_least_one=True)

    def wait_for_readers(self, timeout: float = 1.0, interval: float = 0.001) -> None:
        """Upstream's wait (seconds): returns once ``all_readers_updated()``, raises
        TimeoutError after ``timeout``."""
        if not self.wait_until_read(timeout, interval):
            raise readers_timeout(self.endpoint, timeout, self._readers)

    @property
    def num_readers(self) -> int:
        """Connected subscribers (connections subscribed to every message)."""
        self._check_connected()
        self._update_peers()
        return self._readers

    @property
    def refused_connections(self) -> int:
        """Connections refused since ``connect``: failed CURVE handshakes (no keys, another
        server key, not ZMQ) and clients its permissions refuse."""
        if self._sock is not None and self._pid == _process_id:
            self._update_peers()
        return self._refused

    def close(self) -> None:
        """Closes the publisher. Messages already sent still go out (for at most
        ``linger`` ms); a new publisher of the endpoint in this process can bind at once
        (it waits for ZMQ to release the port)."""
        if self._reservation is not None:
            self._reservation.abort()
        sock, monitor = self._sock, self._monitor
        self._sock = self._monitor = None
        if sock is None or self._pid != os.getpid():
            return  # a forked child must not touch the parent's ZMQ state
        if self._decide is not None and self.endpoint is not None:
            _unregister_zap(sock.context, self.endpoint, self._decide)
            self._decide = None
        # No unbind(): it drops messages still queued for subscribers. The listener goes
        # away in ZMQ's I/O thread shortly after close(); connect() of a new publisher
        # retries for that long (see _released_ports).
        if self.linger and self._ack_readers:
            # A subscriber's read acknowledgement that reaches a closed publisher makes
            # libzmq end that connection before what is still queued for it went out
            # (its input stops, then the whole connection). So first wait, within the
            # linger, for the readers to have read everything (their last acknowledgement
            # then came while the socket was open), reading their acknowledgements.
            self._sock, self._monitor = sock, monitor
            try:
                self._wait_for_joins(time.monotonic() + self.linger / 1000,
                                     condition=self._all_read)
            except zmq.ZMQError:
                pass
            finally:
                self._sock = self._monitor = None
        _close_monitor(sock, monitor)
        sock.close()
        if self.port is not None:
            _released_ports[self.port] = time.monotonic() + _RELEASE_WAIT_S + self.linger / 1000

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class SubSocket:
    """One subscriber of an endpoint: a SUB socket connected to the publisher's port.

    Options: ``rcvhwm`` (messages queued before newer ones are dropped), ``linger`` (ms),
    ``connect_wait_ms`` (how long ``connect`` waits for a running publisher to answer),
    ``keys`` (a key directory, ``MSGQ_ZMQ_KEYS``: the subscriber is then a CURVE client
    that accepts only the publisher key there; ``""``: none) and ``client`` (its client
    key, ``MSGQ_ZMQ_CLIENT``).
    """

    def __init__(
        self,
        *,
        rcvhwm: int | None = None,
        linger: int | None = None,
        connect_wait_ms: int | None = None,
        keys: str | os.PathLike[str] | None = None,
        client: str | None = None,
    ) -> None:
        self.rcvhwm = _option(rcvhwm, "MSGQ_ZMQ_RCVHWM", DEFAULT_RCVHWM)
        self.linger = _option(linger, "MSGQ_ZMQ_LINGER", DEFAULT_LINGER_MS)
        self.connect_wait_ms = _option(
            connect_wait_ms, "MSGQ_ZMQ_CONNECT_WAIT_MS", DEFAULT_CONNECT_WAIT_MS)
        #: The key directory in force (None: no keys, upstream's open socket).
        self.keys_dir = keys_setting(keys)
        self.client = client
        self.endpoint: str | None = None
        self.address: str | None = None
        self.port: int | None = None
        #: Messages dropped because they did not come from a publisher of this endpoint.
        self.dropped_messages = 0
        #: Failed handshakes with the publisher (refused keys, a publisher without or with
        #: other keys); the first is logged with its reason.
        self.failed_handshakes = 0
        self._monitor: zmq.Socket | None = None
        self._handshake_said = False
        self._keyed = False
        self._conflate = False
        self._sock: zmq.Socket | None = None
        self._tag = ""
        self._timeout_ms = -1
        self._stash: bytes | zmq.Frame | None = None  # taken ahead (Poller, receive_into)
        self._lent: bytes | zmq.Frame | None = None  # see FrameView.keep_readable
        # Read acknowledgements: this subscriber's reader id, the last message read and
        # not yet acknowledged, and the fingerprint last acknowledged.
        self._reader_id = b""
        self._unacked: bytes | zmq.Frame | None = None
        self._acked: int | None = None
        self._pid = 0
        self._warned = False
        self._url = ""
        # Set when a peer that is not a ZMQ 4 publisher spoke on the port: libzmq ends such
        # a connection for good after a protocol error, so while nothing valid arrives the
        # socket connects again (at most every _RELINK_S) to reach a publisher that binds
        # the port later.
        self._foreign_link = False
        self._next_relink = 0.0

    def connect(
        self,
        context: Any,
        endpoint: str,
        address: bytes | str = b"127.0.0.1",
        conflate: bool = False,
        segment_size: int = 0,
    ) -> None:
        """Connects to the publisher of ``endpoint`` at ``address`` (a host name or IP of
        the publisher's machine). Returns once a running publisher answered, or at once
        when none listens yet (ZMQ keeps retrying in the background)."""
        if isinstance(address, bytes):
            address = address.decode("utf-8")
        if not isinstance(address, str):
            raise TypeError(f"address must be str or bytes, not {type(address).__name__}")
        if not address or any(c.isspace() for c in address) or "/" in address:
            raise ValueError(f"address {address!r} is not a host name or IP address")
        keys = load_keys(self.keys_dir, self.client) if self.keys_dir else None
        if keys is not None:
            keys.client_keys_or_raise()
        name, port, sock = _new_socket(context, endpoint, segment_size, zmq.SUB, self.linger)
        self.close()
        monitor = None
        self.failed_handshakes = 0
        self._handshake_said = False
        try:
            if keys is not None:
                make_curve_client(sock, keys)
            sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
            sock.setsockopt(zmq.RECONNECT_IVL, _RECONNECT_IVL_MS)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, _RECONNECT_IVL_MAX_MS)
            if conflate:
                sock.setsockopt(zmq.CONFLATE, 1)
            if ":" in address:
                sock.setsockopt(zmq.IPV6, 1)
            reader_id = os.urandom(8).hex().encode("ascii")
            sock.setsockopt(zmq.METADATA, READER_PROPERTY.encode("ascii") + b":" + reader_id)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            if not conflate:
                sock.setsockopt(zmq.SUBSCRIBE, READER_TOPIC + reader_id)
            # The monitor stays: a failed handshake is read from it (and said once) when
            # nothing arrives.
            monitor = _open_monitor(
                sock, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED | _HANDSHAKE_FAILED)
            try:
                url = f"tcp://{_tcp_host(address)}:{port}"
                sock.connect(url)
            except zmq.ZMQError as e:
                raise ValueError(f"endpoint {name!r}: cannot connect to {address!r} port "
                                 f"{port}: {e.strerror}; check the address") from None
            self.endpoint, self.address, self.port = name, address, port
            self._monitor, self._keyed = monitor, keys is not None
            if self.connect_wait_ms > 0:
                deadline = time.monotonic() + self.connect_wait_ms / 1000
                event = _wait_monitor(
                    monitor, zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_CONNECT_RETRIED
                    | _HANDSHAKE_FAILED, deadline, self._handshake_failed)
                if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                    sock.getsockopt(zmq.EVENTS)  # let the socket attach the new connection
        except BaseException:
            self._monitor = None
            _close_monitor(sock, monitor)
            sock.close(0)
            raise
        self._sock = sock
        self._pid = os.getpid()
        self._conflate = bool(conflate)
        self._tag = _endpoint_tag(name)
        self._url = url
        self._reader_id, self._unacked, self._acked = reader_id, None, None
        self._foreign_link = False
        self.endpoint, self.address, self.port = name, address, port

    @property
    def conflate(self) -> bool:
        """True when only the newest message is kept."""
        return self._conflate

    def setTimeout(self, timeout: int | None) -> None:  # noqa: N802 (upstream name)
        """Timeout of a blocking ``receive`` in milliseconds; negative or None: forever."""
        self._timeout_ms = -1 if timeout is None or timeout < 0 else int(timeout)

    def _check_connected(self) -> zmq.Socket:
        return _usable(self._sock, self._pid, self.endpoint, "subscriber")

    def _handshake_failed(self, event: int, value: int) -> None:
        self.failed_handshakes += 1
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            # libzmq gives up on a peer that broke the protocol (a forged or keyless
            # publisher): connect again (at most every _RELINK_S) to reach the real one.
            self._foreign_link = True
        if not self._handshake_said:
            self._handshake_said = True
            log.warning("endpoint %r at %s:%s: %s (further failures are counted in "
                        "failed_handshakes, not logged)", self.endpoint, self.address,
                        self.port, handshake_problem(event, value, self._keyed, "subscriber"))

    def _check_handshakes(self) -> None:
        """Reads the connection events that came; says the first failed handshake."""
        monitor = self._monitor
        if monitor is None:
            return
        while monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            message = parse_monitor_message(monitor.recv_multipart())
            if message["event"] & _HANDSHAKE_FAILED:
                self._handshake_failed(int(message["event"]), int(message["value"]))

    def _drop(self, why: str) -> None:
        self.dropped_messages += 1
        if not self._warned:
            self._warned = True
            log.warning("endpoint %r: dropped a message from %s:%s: %s (counted in "
                        "dropped_messages; further drops are not logged)",
                        self.endpoint, self.address, self.port, why)

    def _recv_one(self, sock: zmq.Socket) -> zmq.Frame | None:
        """One valid message (its frame, not copied) if one is queued, else None."""
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            if frame.more:
                while sock.getsockopt(zmq.RCVMORE):
                    sock.recv(zmq.NOBLOCK, copy=False)
                self._drop("a multi-part message (msgq messages are one frame)")
                continue
            # One metadata lookup per message from a msgq publisher: its endpoint tag (a
            # tag implies ZMTP 3 metadata). Only untagged messages ask for more.
            try:
                origin = frame.get(ENDPOINT_PROPERTY)
            except zmq.ZMQError:
                try:
                    frame.get("Socket-Type")
                except zmq.ZMQError:
                    # No ZMTP 3 metadata: a legacy ZMTP 1.0 peer, or a byte stream that
                    # libzmq parsed as one (anything listening on the port that is not ZMQ).
                    self._drop("a peer that is not a ZMQ 4 publisher")
                    self._foreign_link = True
                    continue
                return frame  # a foreign ZMQ 4 publisher: no tag, delivered as is
            if origin != self._tag:
                self._drop(f"a publisher of endpoint {origin!r} (names hashed to one port)")
                continue
            return frame

    def _relink(self, sock: zmq.Socket) -> None:
        """Connects again after a peer that is not a ZMQ publisher spoke on the port (see
        ``_foreign_link``); at most once per _RELINK_S."""
        now = time.monotonic()
        if now < self._next_relink:
            return
        self._next_relink = now + _RELINK_S
        self._foreign_link = False
        try:
            sock.disconnect(self._url)
        except zmq.ZMQError:
            pass  # libzmq already dropped the endpoint
        sock.connect(self._url)

    def _wait(self, sock: zmq.Socket, deadline: float | None) -> bool:
        """Waits for input until ``deadline`` (None: no limit); False when it passed."""
        while True:
            slice_ms = _slice_ms(deadline)
            if not slice_ms:  # (input that came during the last fraction counts)
                return bool(sock.poll(0, zmq.POLLIN))
            if sock.poll(slice_ms, zmq.POLLIN):
                return True
            self._check_handshakes()
            if self._foreign_link:
                self._relink(sock)

    def _next(self, non_blocking: bool) -> bytes | zmq.Frame | None:
        """The next message: a stashed one (bytes) or a received frame; None when there
        is none (non-blocking) or the timeout passed."""
        sock = self._check_connected()
        if self._stash is not None:
            msg, self._stash = self._stash, None
            if self._conflate:  # a newer message may have come after the stashed one
                newer = self._recv_one(sock)
                return msg if newer is None else newer
            return msg
        # One deadline for the whole call: input that is dropped (foreign or malformed)
        # must not extend the timeout.
        deadline = None if self._timeout_ms < 0 else time.monotonic() + self._timeout_ms / 1000
        while True:
            frame = self._recv_one(sock)
            if frame is not None:
                return frame
            if self._unacked is not None:  # everything that arrived has been read
                self._acknowledge(sock)
            self._check_handshakes()
            if self._foreign_link:
                self._relink(sock)
            if non_blocking or self._timeout_ms == 0 or not self._wait(sock, deadline):
                return None

    def _read(self, msg: bytes | zmq.Frame) -> None:
        """Notes ``msg`` as read by the caller; once nothing more is queued the
        publisher is told (a read acknowledgement: see ``ACK_TOPIC``). Whether more is
        queued is learnt by taking the next message ahead into the stash: free while
        messages stream (the next receive takes it from there), one look at an empty
        queue otherwise."""
        self._unacked = msg
        sock = self._sock
        if sock is None or self._stash is not None:
            return
        ahead = self._recv_one(sock)
        if ahead is None:
            self._acknowledge(sock)
        else:
            self._stash = ahead

    def _acknowledge(self, sock: zmq.Socket) -> None:
        msg, self._unacked = self._unacked, None
        assert msg is not None
        read = fingerprint(msg if isinstance(msg, bytes) else msg.buffer)
        if read == self._acked:
            return
        self._acked = read
        # Subscribing and unsubscribing at once filters nothing; a conflating socket
        # keeps only the last message it sends upstream, the unsubscription, which
        # carries the same acknowledgement.
        topic = ACK_TOPIC + self._reader_id + read.to_bytes(8, "little")
        sock.setsockopt(zmq.SUBSCRIBE, topic)
        sock.setsockopt(zmq.UNSUBSCRIBE, topic)

    def receive(self, non_blocking: bool = False) -> bytes | None:
        """Returns the next message as ``bytes``, or None when there is none
        (non-blocking) or the timeout passed."""
        msg = self._next(non_blocking)
        if msg is None:
            return None
        self._read(msg)
        return msg if isinstance(msg, bytes) else msg.bytes

    async def receive_async(self) -> bytes | None:
        """``await sub.receive_async()``: the next message, or None when the socket's
        timeout (ms) passes first. The task sleeps on the socket's descriptor in the
        event loop meanwhile; cancelling it loses no message."""
        msg = self.receive(non_blocking=True)
        if msg is not None:
            return msg
        loop = asyncio.get_running_loop()
        deadline = None if self._timeout_ms < 0 else loop.time() + self._timeout_ms / 1000
        return await wait_for_result(
            loop, partial(self.receive, non_blocking=True),
            partial(wait_readable_async, loop, [self]), deadline)

    def __aiter__(self) -> SubSocket:
        return self

    async def __anext__(self) -> bytes:
        """``async for msg in sub``: every message (timeouts do not end the loop; closing
        the socket does)."""
        return await next_message(self, lambda: self._sock is not None)

    def receive_view(self, non_blocking: bool = False) -> FrameView:
        """The next message without a copy: ``with sub.receive_view() as view:`` gives a
        read-only memoryview of the received frame (None as ``receive``). The frame is
        this process's own, so it is never overwritten (no MessageOverwritten here)."""
        self._check_connected()
        return FrameView(self, non_blocking)

    def receive_into(self, buffer: Any, non_blocking: bool = False) -> int | None:
        """Copies the next message into ``buffer`` (a writable bytes-like object) and
        returns its size, or None as ``receive``. A buffer too small raises ValueError and
        keeps the message for the next receive."""
        try:
            view = memoryview(buffer)
        except TypeError:
            raise TypeError("receive_into() needs a writable contiguous buffer") from None
        if view.readonly or not view.contiguous:
            raise TypeError("receive_into() needs a writable contiguous buffer")
        frame = self._next(non_blocking)
        if frame is None:
            return None
        msg = frame if isinstance(frame, bytes) else frame.bytes
        view = view.cast("B")
        if len(msg) > len(view):
            self._stash = msg
            raise ValueError(f"message of {len(msg)} bytes does not fit a buffer of "
                             f"{len(view)} bytes; the message stays queued")
        view[: len(msg)] = msg
        self._read(msg)
        return len(msg)

    def has_data(self) -> bool:
        """True when a message is waiting (it may still be dropped as invalid)."""
        sock = self._check_connected()
        return self._stash is not None or bool(sock.poll(0, zmq.POLLIN))

    def close(self) -> None:
        """Closes the socket; it can connect again."""
        sock, self._sock = self._sock, None
        monitor, self._monitor = self._monitor, None
        self._stash = None
        if sock is not None and self._pid == os.getpid():
            if self._conflate:  # nothing else tells the publisher which reader left
                try:
                    sock.setsockopt(zmq.SUBSCRIBE, BYE_TOPIC + self._reader_id)
                except zmq.ZMQError:
                    pass
            _close_monitor(sock, monitor)
            sock.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


async def wait_readable_async(loop: asyncio.AbstractEventLoop, socks: list[SubSocket],
                              deadline: float | None = None) -> None:
    """Returns once any of ``socks`` may have input, or at ``deadline`` (the loop's clock;
    None: no limit): the loop watches their ZMQ descriptors (edge-triggered, so their
    events are read before sleeping). Cancellable."""
    zsocks = []
    for sock in socks:
        zsock = sock._check_connected()
        if sock._stash is not None or zsock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return
        zsocks.append(zsock)
    woken = loop.create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    fds = [zsock.getsockopt(zmq.FD) for zsock in zsocks]
    for fd in fds:
        loop.add_reader(fd, wake)
    try:
        # Input that came between the check above and add_reader left the descriptor
        # readable, so the loop sees it; looking again costs little and is certain.
        if any(zsock.getsockopt(zmq.EVENTS) & zmq.POLLIN for zsock in zsocks):
            return
        await await_until(loop, woken, deadline)
    finally:
        for fd in fds:
            loop.remove_reader(fd)


def _address(buffer: memoryview) -> int:
    """Where ``buffer``'s bytes start in memory."""
    # Imported here: numpy costs 0.15 s at start-up and only views need an address.
    import numpy as np

    return int(np.frombuffer(buffer, dtype=np.uint8).__array_interface__["data"][0])


class FrameView:
    """The context manager of :meth:`SubSocket.receive_view` on ZMQ: the frame is
    received when the block is entered, its read-only memoryview released at the end."""

    def __init__(self, sock: SubSocket, non_blocking: bool) -> None:
        self._sock = sock
        self._non_blocking = non_blocking
        self._msg: bytes | zmq.Frame | None = None
        self._view: memoryview | None = None

    def __enter__(self) -> memoryview | None:
        self._msg = self._sock._next(self._non_blocking)
        if self._msg is None:
            return None
        self._sock._read(self._msg)
        msg = self._msg
        if not isinstance(msg, bytes) and _address(msg.buffer) % 8:
            # Cap'n Proto readers need word-aligned bytes, libzmq frames need not be: an
            # unaligned frame is copied once (bytes objects are aligned).
            msg = self._msg = msg.bytes
        self._view = memoryview(msg if isinstance(msg, bytes) else msg.buffer).toreadonly()
        return self._view

    def keep_readable(self) -> None:
        """Keeps the frame alive until the socket's next view, for a decoder that keeps
        raw pointers into it without holding a buffer (pycapnp's readers)."""
        self._sock._lent = self._msg

    def __exit__(self, *exc: object) -> bool:
        if self._view is not None:
            try:
                self._view.release()
            except BufferError:
                pass  # something holds a buffer of it: the frame lives on with it
            self._view = None
        return False


class Poller:
    """Waits on many SubSockets of the ZMQ backend at once."""

    def __init__(self) -> None:
        self._sockets: list[SubSocket] = []
        self._poller = zmq.Poller()
        self._next_handshake_check = 0.0

    def registerSocket(self, socket: SubSocket) -> None:  # noqa: N802 (upstream name)
        """Adds ``socket``; registering a socket twice has no further effect."""
        sock = socket  # upstream's parameter name, for keyword callers
        if not isinstance(sock, SubSocket):
            raise TypeError(f"a ZMQ Poller takes ZMQ SubSockets, not {type(sock).__name__}")
        if sock._sock is None:
            raise IpcError("register a connected SubSocket")
        if any(s is sock for s in self._sockets):
            return
        self._sockets.append(sock)
        self._poller.register(sock._sock, zmq.POLLIN)

    def poll(self, timeout: int | None) -> list[SubSocket]:
        """Sockets with a message waiting, after at most ``timeout`` ms (negative or None:
        no limit). Empty list on timeout."""
        if not self._sockets:
            return []
        for s in self._sockets:
            if s._sock is None:
                raise IpcError("a socket registered with this Poller was closed")
        stashed = [s for s in self._sockets if s._stash is not None]
        if stashed:
            timeout = 0
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout / 1000
        while True:
            slice_ms = _slice_ms(deadline)
            ready = {id(sk) for sk, _ in self._poller.poll(slice_ms)}
            if ready:
                # A readable socket may hold only messages receive() would drop (foreign
                # or malformed): take its next valid one into the stash, so a socket is
                # reported exactly when receive() has something to return.
                for s in self._sockets:
                    if s._stash is None and id(s._sock) in ready:
                        s._stash = s._recv_one(s._sock)
                stashed = [s for s in self._sockets if s._stash is not None]
            if stashed:
                return stashed
            now = time.monotonic()
            if now >= self._next_handshake_check:  # at most once a slice, not per poll(0)
                self._next_handshake_check = now + _SLICE_MS / 1000
                for s in self._sockets:
                    s._check_handshakes()
            if deadline is not None and now >= deadline:
                return []

    async def poll_async(self, timeout: int | None = None) -> list[SubSocket]:
        """``await poller.poll_async(timeout)``: the registered sockets with a message
        waiting, after at most ``timeout`` ms (None or negative: no limit); empty on
        timeout. The task sleeps on the sockets' descriptors meanwhile."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None or timeout < 0 else loop.time() + timeout / 1000
        ready = await wait_for_result(
            loop, lambda: self.poll(0) or None,
            partial(wait_readable_async, loop, list(self._sockets)), deadline)
        return ready or []
