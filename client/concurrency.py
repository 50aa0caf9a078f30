"""What the two clients do differently, and only that: each async primitive beside its blocking twin.

client/aio.py uses the async ones; generating client/sync.py from it (client/generate_sync.py, with
unasync) renames each to its twin: AsyncStop to Stop, async_sleep to sleep, async_repeat to repeat,
async_stop_on_signals to stop_on_signals."""

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

async_sleep = asyncio.sleep
sleep = time.sleep


class AsyncStop:
    """The work loop's stop flag; a wait on it ends as soon as it is set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self, seconds: float) -> None:
        """Return after `seconds`, or as soon as the flag is set."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)

    async def unless_set(self, call: Awaitable[T]) -> T | None:
        """`call`'s result, or None when the flag is set first: the call is then cancelled (a long
        poll's request is dropped, the server sees the disconnect and stops waiting)."""
        task = asyncio.ensure_future(call)
        stopped = asyncio.ensure_future(self._event.wait())
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return None
        return task.result()


class Stop:
    """The work loop's stop flag; a wait on it ends as soon as it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def clear(self) -> None:
        self._event.clear()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, seconds: float) -> None:
        """Return after `seconds`, or as soon as the flag is set."""
        self._event.wait(seconds)

    def unless_set(self, result: T) -> T | None:
        """The call's `result`, made before this is called: a blocking call cannot be cut short, so
        the flag is seen once it returns (a long poll's, within its wait_s)."""
        return result


@contextlib.asynccontextmanager
async def async_repeat(every_s: float, beat: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """While the block runs, `beat` every `every_s` seconds in a task, cancelled when the block ends."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(every_s)
            await beat()

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()


@contextlib.contextmanager
def repeat(every_s: float, beat: Callable[[], None]) -> Iterator[None]:
    """While the block runs, `beat` every `every_s` seconds in a thread; the block's end waits for a
    beat in progress."""
    done = threading.Event()

    def loop() -> None:
        while not done.wait(every_s):
            beat()

    thread = threading.Thread(target=loop, name="review-queue-renew", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


@contextlib.contextmanager
def async_stop_on_signals(stop: Callable[[], None], enabled: bool) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM call `stop` (handled by the running event loop)."""
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if enabled else ()
    for sig in signals:
        loop.add_signal_handler(sig, stop)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


@contextlib.contextmanager
def stop_on_signals(stop: Callable[[], None], enabled: bool) -> Iterator[None]:
    """While the block runs, SIGINT and SIGTERM call `stop`; in the main thread only (Python installs
    signal handlers nowhere else), the previous handlers restored at the end."""
    restore: dict[int, Any] = {}
    if enabled and threading.current_thread() is threading.main_thread():
        restore = {sig: signal.signal(sig, lambda *_: stop()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, previous in restore.items():
            signal.signal(signum, previous)
