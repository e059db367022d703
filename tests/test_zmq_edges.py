"""ZMQ backend edges found while making the socket API one on every backend."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

import msgq
from msgq.zmq_backend import endpoint_port


@pytest.fixture(autouse=True)
def zmq_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MSGQ_BACKEND", "zmq")


def test_a_stream_of_dropped_input_does_not_extend_the_receive_timeout(endpoint: str) -> None:
    # A foreign ZMQ publisher on the endpoint's port sends multi-part messages without
    # pause; the subscriber drops every one. Each dropped message used to restart the wait,
    # so a receive with a 300 ms timeout never returned.
    ctx = zmq.Context.instance()
    foreign = ctx.socket(zmq.PUB)
    foreign.setsockopt(zmq.LINGER, 0)
    foreign.bind(f"tcp://127.0.0.1:{endpoint_port(endpoint)}")
    stop = threading.Event()

    def stream() -> None:
        while not stop.is_set():
            foreign.send_multipart([b"not", b"msgq"])
            time.sleep(0.005)

    sub = msgq.sub_sock(endpoint, timeout=300)
    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while sub.dropped_messages == 0:
            assert time.monotonic() < deadline, "the foreign messages never arrived"
            sub.receive(non_blocking=True)
            time.sleep(0.01)
        started = time.monotonic()
        assert sub.receive() is None
        assert time.monotonic() - started < 5.0, "the 300 ms timeout was extended"
    finally:
        stop.set()
        thread.join(5)
        sub.close()
        foreign.close()
