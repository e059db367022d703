"""asyncio steps every backend's sockets share: awaiting a result that a non-blocking
try may give (``receive_async``, ``poll_async``) and the step of ``async for msg in sub``.
What differs between backends is only how a task sleeps until input may be there (a
waiter thread on the futex for msgq, the event loop's readers on ZMQ's descriptors), and
that comes in as ``wait``.

Layer: foundation — the standard library only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

__all__ = ["await_until", "next_message", "running_loop", "wait_for_result"]

T = TypeVar("T")


def running_loop() -> asyncio.AbstractEventLoop:
    """``asyncio.get_running_loop()``. Every ``import msgq`` loads this module and the
    shared-memory backend, and importing asyncio costs about 25 ms, so it is imported
    here, when a task asks: with a loop running it is imported already."""
    import asyncio  # start-up cost: 25 ms, for tasks only (above)

    return asyncio.get_running_loop()


async def await_until(loop: asyncio.AbstractEventLoop, awaitable: Awaitable[Any],
                      deadline: float | None) -> None:
    """Awaits ``awaitable`` until the loop's clock reaches ``deadline`` (None: no limit);
    at the deadline it is cancelled and this returns, as when it completes."""
    import asyncio  # imported already: a loop is running (running_loop)

    if deadline is None:
        await awaitable
        return
    try:
        await asyncio.wait_for(awaitable, max(0.0, deadline - loop.time()))
    except asyncio.TimeoutError:
        pass


async def wait_for_result(
    loop: asyncio.AbstractEventLoop,
    take: Callable[[], T | None],
    wait: Callable[[float | None], Awaitable[None]],
    deadline: float | None,
    result: T | None = None,
) -> T | None:
    """``result``, or else ``take()``'s first result other than None, awaiting
    ``wait(deadline)`` between tries; None once the loop's clock has passed ``deadline``
    (None: no limit). ``take`` must not block. Cancelling loses nothing: only the try
    that returns a result takes it."""
    if result is None:
        result = take()
    while result is None:
        if deadline is not None and loop.time() >= deadline:
            return None
        await wait(deadline)
        result = take()
    return result


async def next_message(sub: Any, is_open: Callable[[], bool]) -> bytes:
    """The next message of ``sub`` for ``async for``: timeouts do not end the loop, a
    closed socket does (StopAsyncIteration)."""
    while True:
        if not is_open():
            raise StopAsyncIteration
        msg = await sub.receive_async()
        if msg is not None:
            return msg  # type: ignore[no-any-return]
