"""The service registry: queue-size rule, ports, lookups, and the schema it describes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import msgq
from msgq import schemas
from msgq.queues import MAX_SEGMENT_SIZE, MIN_SEGMENT_SIZE
from msgq.schemas import selection
from msgq.schemas import services as registry_module
from msgq.schemas.services import (
    MAX_QUEUE_SIZE,
    MIN_QUEUE_SIZE,
    SERVICE_LIST,
    Service,
    ServiceRegistry,
    derive_queue_size,
)


def test_every_service_is_a_member_of_the_event_union() -> None:
    union = schemas.default_schema().union_fields
    assert len(SERVICE_LIST) >= 30
    assert list(SERVICE_LIST) == list(union)  # one registry entry per union member, in order


@pytest.mark.parametrize("service", list(SERVICE_LIST))
def test_queue_size_fits_at_least_three_largest_messages(service: str) -> None:
    s = SERVICE_LIST[service]
    size = s.queue_size
    assert size & (size - 1) == 0, "queue sizes are powers of two"
    assert MIN_SEGMENT_SIZE <= size <= MAX_SEGMENT_SIZE
    assert size >= 4 * s.message_size
    # what the ring really accepts (a third of the ring, less framing)
    sock = msgq.pub_sock(service)
    assert sock.segment_size == size
    assert sock.max_message_size >= s.message_size
    sock.close()


def test_queue_size_rule_examples() -> None:
    # 100 Hz x 256 B x 2 s = 51 KB: the 64 KiB floor
    assert derive_queue_size(256, 100) == MIN_QUEUE_SIZE
    # 20 Hz x 128 KiB x 2 s = 5 MiB -> 8 MiB (next power of two)
    assert derive_queue_size(128 * 1024, 20) == 8 * 1024 * 1024
    # event-driven services are sized as if they ran at 10 Hz
    assert derive_queue_size(8192, 0) == derive_queue_size(8192, 10)
    # the buffering term is bounded ...
    assert derive_queue_size(1024 * 1024, 1000) == MAX_QUEUE_SIZE
    # ... but never below four messages
    assert derive_queue_size(40 * 1024 * 1024, 1) == 256 * 1024 * 1024
    with pytest.raises(ValueError):
        derive_queue_size(0, 10)
    with pytest.raises(ValueError):
        derive_queue_size(10, -1)


def test_memory_is_proportional_and_the_total_is_printed() -> None:
    total = SERVICE_LIST.total_queue_size
    assert total < len(SERVICE_LIST) * 10 * 1024 * 1024 / 4  # far below 10 MiB per queue
    done = subprocess.run([sys.executable, "-m", "msgq.schemas"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "gyroscope" in out and "modelOutput" in out
    assert f"{len(SERVICE_LIST)} services" in out.splitlines()[-1]


def test_unknown_service_names_close_matches() -> None:
    with pytest.raises(KeyError, match="gyroscope"):
        SERVICE_LIST["gyroscop"]
    with pytest.raises(KeyError, match="unknown service 'zzz'"):
        SERVICE_LIST["zzz"]


def test_ports_are_unique_and_stable() -> None:
    ports = [SERVICE_LIST[s].port for s in SERVICE_LIST]
    assert len(set(ports)) == len(ports)
    assert SERVICE_LIST["logStart"].port == 8023
    assert SERVICE_LIST["gyroscope"].port == 8024


def test_zmq_backend_uses_registry_ports_without_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from msgq.zmq import endpoint_port

    monkeypatch.delenv("MSGQ_ZMQ_BASE_PORT", raising=False)  # the default range
    monkeypatch.delenv("MSGQ_ZMQ_PORT_SPAN", raising=False)

    assert endpoint_port("gyroscope", prefix="") == SERVICE_LIST["gyroscope"].port
    assert endpoint_port("can", prefix="") == SERVICE_LIST["can"].port
    # with a prefix every name is hashed, so parallel runs stay apart
    assert endpoint_port("gyroscope", prefix="run1") != endpoint_port("gyroscope", prefix="run2")


def test_the_schema_in_force_sizes_plain_sockets_and_messaging_alike(prefix: str) -> None:
    """One setter of the schema in force (use_schema) and one registry: a plain pub_sock,
    PubMaster and the registry lookups all size a queue from it, so two registries can no
    longer disagree about a queue's size (there is no registry set apart for sockets)."""
    from msgq.messaging import PubMaster

    custom = ServiceRegistry([Service("gyroscope", True, 50.0, 200_000),
                              *(SERVICE_LIST[n] for n in SERVICE_LIST if n != "gyroscope")])
    assert custom["gyroscope"].queue_size != SERVICE_LIST["gyroscope"].queue_size
    assert not hasattr(registry_module, "register")  # the second setter is gone
    with pytest.raises(ValueError, match="use_schema"):
        schemas.load_schema(os.path.join(schemas.SCHEMA_DIR, "log.capnp"), custom,
                            register_services=True)
    assert selection.find_service("gyroscope") == SERVICE_LIST["gyroscope"]
    schemas.use_schema(None, custom)
    pm = PubMaster(["gyroscope"])
    try:
        plain = msgq.pub_sock("gyroscope")
        sizes = {plain.segment_size, pm.sock["gyroscope"].segment_size,
                 selection.registry_in_force()["gyroscope"].queue_size,
                 schemas.default_schema().services["gyroscope"].queue_size}
        assert sizes == {custom["gyroscope"].queue_size}
        plain.close()
    finally:
        pm.close()
    # a schema loaded, not put in force, sizes nothing behind the caller's back
    schemas.load_schema(os.path.join(schemas.SCHEMA_DIR, "log.capnp"), SERVICE_LIST)
    assert selection.find_service("gyroscope") == custom["gyroscope"]
    schemas.use_schema(None)
    assert selection.find_service("gyroscope") == SERVICE_LIST["gyroscope"]


def test_duplicate_service_is_refused() -> None:
    with pytest.raises(ValueError, match="twice"):
        ServiceRegistry([Service("a", True, 1, 10), Service("a", True, 1, 10)])


def test_schema_fingerprint_follows_the_text(tmp_path: os.PathLike[str]) -> None:
    fp = schemas.default_schema().fingerprint
    assert fp == schemas.schema_fingerprint(os.path.join(schemas.SCHEMA_DIR, "log.capnp"))
    assert len(fp) == 16
    # an imported file is part of the fingerprint
    a = os.path.join(tmp_path, "a.capnp")
    b = os.path.join(tmp_path, "b.capnp")
    with open(a, "w") as f:
        f.write('@0xb1a2c3d4e5f60718;\nusing B = import "b.capnp";\n')
    with open(b, "w") as f:
        f.write("@0xc1a2c3d4e5f60718;\nstruct X {}\n")
    before = schemas.schema_fingerprint(a)
    with open(b, "a") as f:
        f.write("struct Y {}\n")
    assert schemas.schema_fingerprint(a) != before
