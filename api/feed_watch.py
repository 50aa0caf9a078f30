"""One look at the change feed per poll interval for every GET /events that waits on this process.

Each long-poll used to look at the feed itself every REVIEW_QUEUE_POLL_INTERVAL_MS: 500 waiters
made about 1,000 queries a second and slowed every other route (issue 38 item 2). Now one task,
started by the first waiter and ending when none is left, reads the feed's head (db.feed.head,
the walk's own xmin rule) once per interval and wakes the waiters it has moved past. The waiters a
look woke at the same place share one page (`page`), read and rendered once: with every poller at
the head, one enqueue costs one look, one read and one JSON body, whatever their number. Waiting
costs no connection and no query.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge
from sqlalchemy.exc import SQLAlchemyError

from db.feed import Position

log = logging.getLogger("review_queue.feed")
T = TypeVar("T")

# livesum: summed over the live API processes in multiprocess mode.
WAITERS = Gauge(
    "review_queue_feed_waiters",
    "GET /events calls waiting for new events (wait_s) right now.",
    multiprocess_mode="livesum",
)
LOOKS = Counter(
    "review_queue_feed_looks_total",
    "Looks at the change feed's head by the process's watcher (one per poll interval while anyone waits).",
)


@dataclass(eq=False)
class _Waiter:
    after: Position
    seen: int
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class FeedWatch:
    """The feed's head as last seen, and the waiters behind it.

    A waiter reads `generation` before its own read and, when that found nothing new, calls
    `wait(after, seen, ...)`: a look that moved the head in between has already moved the
    generation on, so no wake-up is lost between the read and the wait, and a look the read
    already covered (the read's snapshot is newer) wakes no one a second time.
    """

    def __init__(self, look: Callable[[], Awaitable[Position]], *, interval_s: float) -> None:
        self._look = look
        self._interval_s = interval_s
        self._queue: dict[_Waiter, None] = {}
        self._task: asyncio.Task[None] | None = None
        self._pages: dict[Hashable, asyncio.Future[Any]] = {}
        self.head: Position | None = None
        self.generation = 0
        self.waiters = 0
        self.looks = 0

    @property
    def watching(self) -> bool:
        return self._task is not None and not self._task.done()

    def caught_up(self, after: Position) -> bool:
        """Nothing past `after` as of the last look, while the watcher runs (so that look is at
        most one interval old): a new long-poll there can wait without reading first."""
        return self.watching and self.head is not None and after >= self.head

    async def wait(self, after: Position, seen: int, up_to_s: float, gone: "asyncio.Future[None]") -> bool:
        """Until a look after generation `seen` finds the head past `after` and wakes this waiter
        (True), or `up_to_s` seconds pass, or `gone` is done (the client left) (False)."""
        waiter = _Waiter(after, seen)
        self._queue[waiter] = None
        self.waiters += 1
        WAITERS.inc()
        if not self.watching:
            self._task = asyncio.create_task(self._watch(), name="review-queue-feed-watch")
        woken: asyncio.Future[Any] = asyncio.ensure_future(waiter.woken.wait())
        try:
            await asyncio.wait({woken, gone}, timeout=max(0, up_to_s), return_when=asyncio.FIRST_COMPLETED)
            return waiter.woken.is_set()
        finally:
            woken.cancel()
            self._queue.pop(waiter, None)
            self.waiters -= 1
            WAITERS.dec()

    def _wake(self) -> None:
        head = self.head
        if head is None:
            return
        for waiter in list(self._queue):
            if waiter.seen != self.generation and head > waiter.after:
                waiter.woken.set()
                del self._queue[waiter]

    async def page(self, key: Hashable, read: Callable[[], Awaitable[T]]) -> T:
        """`read()`, shared by the callers with the same `key` (position, limit, filter) while it
        runs, if the head has not moved since it started: the waiters one look woke at the same
        place (every long-poller at the head, after an enqueue) make one read, begun after that
        look, so it holds everything up to the head they were woken for. Only reads in flight are
        kept: a page is never served from memory later."""
        key = (self.generation, key)
        shared: asyncio.Future[T] | None = self._pages.get(key)
        if shared is None:
            # A task of its own: a reader whose client leaves does not cancel the others' page.
            shared = self._pages[key] = asyncio.ensure_future(read())
            shared.add_done_callback(lambda _: self._pages.pop(key, None))
        return await asyncio.shield(shared)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self) -> None:
        # Checked after each sleep: the task ends within an interval of the last waiter leaving,
        # and a waiter arriving meanwhile keeps it going (no await between the check and the end).
        while self.waiters:
            try:
                head = await self._look()
            # The database away: the waiters wait on, and answer (or fail) at their deadline.
            except (SQLAlchemyError, OSError) as error:
                log.warning("feed_watch_look_failed", extra={"error": str(error)})
            else:
                self.looks += 1
                LOOKS.inc()
                if head != self.head:
                    self.head = head
                    self.generation += 1
                self._wake()
            await asyncio.sleep(self._interval_s)


BUDGET_WAIT = Counter(
    "review_queue_feed_budget_wait_seconds_total",
    "Seconds GET /events calls with wait_s spent waiting for their turn in the process's answer"
    " budget (REVIEW_QUEUE_FEED_ANSWERS_PER_S) before reading.",
)


class AnswerBudget:
    """At most `per_s` feed reads a second for the waiting calls of one process, first come first
    served, in bursts of at most a tenth of a second's worth.

    The generic cell rate algorithm (a token bucket kept as one timestamp): each call reserves the
    next free turn and sleeps until it, so 500 pollers waiting for a turn cost one timer each and
    are answered in the order they asked. (aiolimiter's bucket wakes every waiter at each drip to
    race for the capacity: 500 wake-ups per turn, in no fixed order.)
    """

    def __init__(self, per_s: float) -> None:
        self._gap = 1 / per_s
        self._tolerance = max(0.0, per_s // 10 - 1) * self._gap
        self._next = float("-inf")  # when the next turn is due, less the burst's tolerance

    def reserve(self, now: float, by: float) -> float | None:
        """The time of the caller's turn, reserved, if it comes by `by`; None (nothing reserved)
        when every turn until then is taken."""
        turn = max(now, self._next - self._tolerance)
        if turn > by:
            return None
        self._next = max(self._next, now) + self._gap
        return turn
