"""Endpoints and TCP ports: the port of an endpoint (:func:`endpoint_port`), the name
checks every socket shares, binding a port a publisher of this process just released,
and what holds a port a bind was refused."""

from __future__ import annotations

import errno
import socket as _socket
import time
from typing import Any

import zmq

from msgq.queues import (
    MAX_SEGMENT_SIZE,
    MIN_SEGMENT_SIZE,
    fnv1a_64,
    namespace_prefix,
    validate_endpoint,
)
from msgq.schemas import selection, services
from msgq.zmq.options import _env_int

#: First port of the endpoint port range (the port upstream msgq's mapping starts at).
DEFAULT_BASE_PORT = 8023
#: Number of ports in the range: 8023..32767, which stays below Linux's ephemeral ports.
DEFAULT_PORT_SPAN = 32768 - DEFAULT_BASE_PORT

#: Connection-level metadata a publisher attaches to every message it sends.
ENDPOINT_PROPERTY = "X-Msgq-Endpoint"

# How long connect() waits for the listener of a publisher closed by this process to go
# away (plus that publisher's linger).
_RELEASE_WAIT_S = 1.0
# How long the port-conflict diagnosis waits for a ZMTP greeting.
_PROBE_TIMEOUT_S = 0.25


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


def _endpoint_tag(endpoint: str) -> str:
    prefix = namespace_prefix()
    return f"{prefix}/{endpoint}" if prefix else endpoint


def _tcp_host(address: str) -> str:
    """``address`` as the host part of a tcp:// URL (IPv6 literals in brackets)."""
    if ":" in address and not address.startswith("["):
        return f"[{address}]"
    return address


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
