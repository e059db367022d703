"""CurveZMQ keys, the ZAP handler and per-service permissions: what the ZMQ backend (and
the bridge) use when ``MSGQ_ZMQ_KEYS`` names a key directory (docs/security.md).

libzmq does the cryptography (CURVE) and pyzmq the certificate files (zmq.auth); this
module only chooses keys and answers ZAP requests, the way pyzmq keeps zmq.auth apart
from its sockets."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.utils.z85

from msgq.zmq.options import log

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
    if os.name != "posix":
        return  # no mode bits (Windows reports 0o666 for every file): its ACLs decide
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
    try:
        import tomllib  # only a process with a permissions file parses TOML
    except ImportError:  # Python 3.10: the backport, a dependency there
        import tomli as tomllib

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
