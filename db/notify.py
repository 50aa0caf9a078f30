"""Work arrives without polling: NOTIFY when items become leasable, one LISTEN connection per process.

Enqueue, reclaim, requeue, reopen, revise and the admin's release call `notify_work` once per
statement (not per row), in their own transaction: PostgreSQL delivers the notification at COMMIT, so
a listener never hears of a change it cannot see yet, and a rolled-back change is never announced.
A holder's release and a completion that submits a proposal for approval announce it from inside
their one statement (`_announced` in db/queue/rows.py: they run in one round trip, with no room for a
second statement that depends on the first's result). NOTIFY takes a lock at commit that
serialises committing transactions, which is why it is sent once per statement and only by the
statements that make items leasable (lease, renew, approve and a completion that resolves never
notify); `make bench` measures what it costs.

`WorkSignal` is the listening side: one psycopg connection in autocommit, outside the
SQLAlchemy pool, fanned out in-process to every waiting request through a generation counter
and an asyncio.Event. When the connection is lost, waiters fall back to polling every
`poll_interval_s` and the listener reconnects by itself.

A LISTEN is session state, so it only works on a connection that stays one backend: through a
pooler in transaction mode (PgBouncer) the LISTEN lands on a server connection that goes back to
the pooler's pool, the service hears nothing, and that backend collects notifications nobody reads
(holding back PostgreSQL's notification queue for everyone). So every new listening connection
first proves it hears: a NOTIFY with a unique payload, sent on a second connection, must arrive
within `probe_timeout_s`. One that does not is reported (`work_listener_deaf`, with the remedy:
REVIEW_QUEUE_LISTEN_DATABASE_URL, a direct URL), its backend is terminated so nothing piles up
there, waiters poll, and the listener tries again after `deaf_retry_s`.
"""

import asyncio
import contextlib
import logging
import secrets
from typing import Any

import psycopg
from prometheus_client import Gauge
from sqlalchemy import func, select

from db.unit import Unit

log = logging.getLogger("review_queue.notify")

CHANNEL = "review_queue_work"
LISTENER_NAME = "review-queue-listener"  # application_name of the listening connection

# livesum: summed over the live API processes in multiprocess mode.
WAITERS = Gauge(
    "review_queue_lease_waiters",
    "POST /leases calls waiting for work (wait_s) right now.",
    multiprocess_mode="livesum",
)
LISTENING = Gauge(
    "review_queue_work_listener_up",
    "1 while the process's LISTEN connection is up; 0 means waits fall back to polling.",
    multiprocess_mode="livemin",
)

_NOTIFY = select(func.pg_notify(CHANNEL, ""))
_PROBE = "probe:"  # payload prefix of a listener's proof that it hears; wakes nobody


async def notify_work(unit: Unit) -> None:
    """Announce, at this unit's commit, that items may be leasable."""
    await unit.execute(_NOTIFY, {})


class WorkSignal:
    """Wakes lease requests that wait for work.

    A waiter reads `generation` before its lease attempt and, when the attempt found nothing,
    calls `wait(seen, timeout)`: a notification that arrived in between has already moved the
    generation on, so no wake-up is lost between the attempt and the wait.
    """

    def __init__(
        self,
        libpq_url: str,
        *,
        poll_interval_s: float,
        connect_timeout_s: int = 2,
        probe_timeout_s: float = 5.0,
        deaf_retry_s: float = 60.0,
    ) -> None:
        self.url = libpq_url
        self._poll_interval_s = poll_interval_s
        self._connect_timeout_s = connect_timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._deaf_retry_s = deaf_retry_s
        self._event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.generation = 0
        self.listening = False
        self.backend_pid: int | None = None  # of the listening connection, for operators and tests
        self.deaf = False  # the last listening connection did not hear its own probe
        self.waiters = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="review-queue-listener")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.listening = False

    def _wake(self) -> None:
        self.generation += 1
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: int, up_to_s: float) -> None:
        """Return on a notification after generation `seen`, or after `up_to_s` seconds; while
        the listener is down, after one poll interval at most (the caller then tries again)."""
        if self.generation != seen or up_to_s <= 0:
            return
        if not self.listening:
            up_to_s = min(up_to_s, self._poll_interval_s)
        self.waiters += 1
        WAITERS.inc()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), up_to_s)
        finally:
            self.waiters -= 1
            WAITERS.dec()

    async def _connect(self, purpose: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
        return await psycopg.AsyncConnection.connect(
            self.url,
            autocommit=True,
            connect_timeout=self._connect_timeout_s,
            application_name=f"{LISTENER_NAME}{purpose}",
            prepare_threshold=None,  # the probe may go through a pooler that cannot carry them
        )

    async def _hears(self, conn: psycopg.AsyncConnection[tuple[Any, ...]], backend_pid: int) -> bool:
        """Whether `conn` receives a NOTIFY sent on another connection; if not, its backend (which
        a pooler lent it for the LISTEN) is terminated, so it does not collect notifications."""
        payload = f"{_PROBE}{secrets.token_hex(8)}"
        async with await self._connect("-probe") as probe:
            await probe.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
            async for note in conn.notifies(timeout=self._probe_timeout_s):
                if note.payload == payload:
                    return True
            with contextlib.suppress(psycopg.Error):  # the probe may be on that very backend
                await probe.execute("SELECT pg_terminate_backend(%s)", (backend_pid,))
        return False

    async def _listen_forever(self) -> None:
        while True:
            self.deaf = False
            try:
                await self._listen_once()
            except psycopg.Error as error:
                if self.listening:
                    log.warning("work_listener_lost", extra={"error": str(error)})
            finally:
                was_listening, self.listening = self.listening, False
                LISTENING.set(0)
                if was_listening:
                    self._wake()  # waiters switch to polling now, not after their full wait
            await asyncio.sleep(self._deaf_retry_s if self.deaf else self._poll_interval_s)

    async def _listen_once(self) -> None:
        async with await self._connect("") as conn:
            # One transaction: a pooler in transaction mode keeps it on one backend, so the pid read
            # is the one that holds the LISTEN (the connection's own may be the pooler's).
            async with conn.transaction():
                await conn.execute(f"LISTEN {CHANNEL}")
                row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            self.backend_pid = int(row[0]) if row else None
            if not await self._hears(conn, self.backend_pid or 0):
                self.deaf = True
                log.error(
                    "work_listener_deaf",
                    extra={
                        "backend_pid": self.backend_pid,
                        "remedy": "LISTEN needs a connection that stays one backend: set"
                        " REVIEW_QUEUE_LISTEN_DATABASE_URL to PostgreSQL itself, not to a pooler in"
                        " transaction mode; meanwhile waiting leases poll",
                    },
                )
                return
            self.listening = True
            LISTENING.set(1)
            # Whatever was enqueued while nobody listened: let every waiter look again.
            self._wake()
            log.info("work_listener_connected", extra={"backend_pid": self.backend_pid})
            async for note in conn.notifies():
                if not note.payload.startswith(_PROBE):
                    self._wake()
