"""asyncio: ``await sub.receive_async()``, ``async for msg in sub``,
``await poller.poll_async(timeout)`` and ``AsyncSubMaster``, on the shared-memory and ZMQ
backends, each with and without the fake layer; a waiting task costs no CPU, and
cancelling it loses no message and leaves no thread behind.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from helpers import connect_pair, wait_until

import msgq
from msgq.messaging import AsyncSubMaster, PubMaster, new_message


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


def waiter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name == "msgq-async-waiter"]


def test_receive_async_waits_without_blocking_the_loop(backend: str, fake_layer: bool,
                                                       endpoint: str) -> None:
    pub, sub = connect_pair(endpoint)

    async def main() -> tuple[bytes | None, int]:
        ticks = 0

        async def ticker() -> None:  # another task: sends once it has run 5 times
            nonlocal ticks
            while True:
                await asyncio.sleep(0.005)
                ticks += 1
                if ticks == 5:
                    pub.send(b"later")

        tick_task = asyncio.create_task(ticker())
        # a receive that blocked the loop would starve the ticker, so nothing would be
        # sent: it times out instead (the ticks are counted, not timed: a loaded machine
        # gave 2 ticks in a fixed 100 ms window)
        msg = await asyncio.wait_for(sub.receive_async(), 10)
        tick_task.cancel()
        return msg, ticks

    msg, ticks = run(main())
    assert msg == b"later" and ticks >= 5


def test_receive_async_honours_the_socket_timeout(backend: str, endpoint: str) -> None:
    _pub, sub = connect_pair(endpoint)
    sub.setTimeout(60)

    async def main() -> tuple[bytes | None, float]:
        t0 = time.monotonic()
        msg = await sub.receive_async()
        return msg, time.monotonic() - t0

    msg, waited = run(main())
    assert msg is None and waited >= 0.05


def test_async_for_and_cancellation_lose_nothing(backend: str, fake_layer: bool,
                                                 endpoint: str) -> None:
    pub, sub = connect_pair(endpoint)

    async def main() -> list[bytes]:
        task = asyncio.create_task(sub.receive_async())
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for i in range(5):
            pub.send(b"m%d" % i)
        got = []
        async for msg in sub:
            got.append(msg)
            if len(got) == 5:
                break
        return got

    assert run(main()) == [b"m%d" % i for i in range(5)]


def test_poll_async(backend: str, fake_layer: bool, endpoint: str) -> None:
    poller = msgq.Poller()
    subs = [msgq.sub_sock(f"{endpoint}_{i}", poller=poller, timeout=5000) for i in range(3)]
    pubs = [msgq.pub_sock(f"{endpoint}_{i}") for i in range(3)]
    for pub in pubs:
        pub.wait_for_readers(timeout=5)

    async def main() -> tuple[list[Any], list[Any]]:
        empty = await poller.poll_async(30)
        asyncio.get_running_loop().call_later(0.05, pubs[1].send, b"x")
        ready = []
        while not ready:
            ready = await poller.poll_async(5000)
        return empty, ready

    empty, ready = run(main())
    assert empty == []
    assert ready == [subs[1]]
    assert subs[1].receive(non_blocking=True) == b"x"


def test_async_submaster(backend: str, fake_layer: bool) -> None:
    sm = AsyncSubMaster(["vehicleState", "gyroscope"])
    pm = PubMaster(["vehicleState", "gyroscope"])
    for service in ("vehicleState", "gyroscope"):
        pm.sock[service].wait_for_readers(timeout=5)

    async def main() -> None:
        msg = new_message("vehicleState", valid=True)
        msg.vehicleState.speed = 2.5
        asyncio.get_running_loop().call_later(0.05, pm.send, "vehicleState", msg)
        for _ in range(100):
            await sm.update(100)
            if sm.updated["vehicleState"]:
                break
        assert sm["vehicleState"].speed == 2.5 and sm.valid["vehicleState"]

    run(main())
    sm.close()
    pm.close()


def _cpu_of(threads: list[threading.Thread]) -> float:
    """CPU seconds that these threads (and the calling one) used so far: their own
    clocks, not the process's, which counts every other thread of the test run too."""
    return time.thread_time() + sum(
        time.clock_gettime(time.pthread_getcpuclockid(t.ident))  # type: ignore[arg-type]
        for t in threads if t.ident is not None and t.is_alive())


def test_a_waiting_task_costs_no_cpu_and_leaves_no_thread(endpoint: str) -> None:
    """The shared-memory backend's waiter thread sleeps in the kernel while a task
    awaits (a busy poll would burn a whole core), and ends a second after the last
    waiter is gone."""
    _pub, sub = connect_pair(endpoint)

    async def main() -> float:
        task = asyncio.create_task(sub.receive_async())
        waiters: list[threading.Thread] = []

        def started() -> bool:
            waiters[:] = [t for t in threading.enumerate() if t.name == "msgq-async-waiter"]
            return bool(waiters)

        while not started():
            await asyncio.sleep(0.005)
        cpu0 = _cpu_of(waiters)
        await asyncio.sleep(1.0)
        cpu = _cpu_of(waiters) - cpu0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return cpu

    cpu = run(main())
    # a polling waiter burns its share of a core even on a loaded machine (a third of one
    # with six runnable threads on two cores); one asleep in the kernel uses ~nothing
    assert cpu < 0.1, f"{cpu:.3f} s of CPU (loop and waiter threads) in 1 s of waiting"
    wait_until(lambda: not waiter_threads(), timeout=5, what="the waiter thread to end")


def test_closing_an_awaited_socket_fails_the_task(endpoint: str) -> None:
    _pub, sub = connect_pair(endpoint)

    async def main() -> None:
        task = asyncio.create_task(sub.receive_async())
        await asyncio.sleep(0.05)
        sub.close()
        with pytest.raises(msgq.IpcError, match="closed while a task awaited it"):
            await task

    run(main())


def test_many_tasks_on_many_sockets(endpoint: str) -> None:
    pairs = [connect_pair(f"{endpoint}_{i}") for i in range(20)]

    async def main() -> list[bytes | None]:
        tasks = [asyncio.create_task(sub.receive_async()) for _pub, sub in pairs]
        await asyncio.sleep(0.05)
        for i, (pub, _sub) in enumerate(reversed(pairs)):
            pub.send(b"%d" % i)
        return list(await asyncio.gather(*tasks))

    got = run(main())
    assert sorted(got) == sorted(b"%d" % i for i in range(20))  # type: ignore[type-var]


def test_a_gated_subscriber_awaits_the_harness(backend: str, endpoint: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Under an enabled fake-event handle, ``receive_async`` signals recv_called and the
    task sleeps (the loop keeps running) until the harness sets recv_ready."""
    monkeypatch.setenv("CEREAL_FAKE", "1")
    monkeypatch.setenv("CEREAL_FAKE_PREFIX", f"gate_{os.getpid()}")
    handle = msgq.fake_event_handle(endpoint, override=True)
    pub, sub = connect_pair(endpoint)
    handle.enabled = True
    pub.send(b"gated")

    async def main() -> tuple[bool, bytes | None]:
        task = asyncio.create_task(sub.receive_async())
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, handle.recv_called_event.wait, 5.0)
        await asyncio.sleep(0.05)
        waited = not task.done()  # gated: it waits for the harness
        handle.recv_called_event.clear()
        handle.recv_ready_event.set()
        return waited, await task

    waited, msg = run(main())
    assert waited and msg == b"gated"
    handle.enabled = False
