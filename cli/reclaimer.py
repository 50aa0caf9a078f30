"""Reclaiming abandoned leases, creating the event trail's next months, sealing the audit chain,
rolling up the RESOLVED count and the reports' closed days outside the request path: one drain, or
two supervised loops.

The seed: reclaim runs "on its own supervised schedule independent of the worker pool". The
loop survives the database going away (logs, backs off, carries on), exits cleanly on
SIGTERM/SIGINT, and any number of reclaimers can run at once: FOR UPDATE SKIP LOCKED hands
each expired row to exactly one of them.
"""

import asyncio
import contextlib
import logging
import random
import signal
import socket
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from typing import Protocol, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from api.settings import Settings
from db import audit, partitions, queue, reports, stats
from db.engine import create_engine, transaction, unit_of_work
from db.errors import classify

log = logging.getLogger("review_queue.reclaimer")

RECLAIM_BATCH = 100
LEAK_WARNING_RATIO = 0.9
MAX_BACKOFF_S = 30.0
LOCK_NOT_AVAILABLE = "55P03"


def reclaimer_identity() -> str:
    """The audit trail's actor for sweeps not started by a person."""
    return f"reclaimer@{socket.gethostname()}"


async def drain(engine: AsyncEngine, settings: Settings, *, actor: str) -> int:
    """Reclaim batch after batch, each its own short transaction, until one comes back short."""
    total = 0
    while True:
        async with unit_of_work(
            engine,
            lock_timeout_ms=settings.pg_lock_timeout_ms,
            statement_timeout_ms=settings.statement_timeout_ms,
        ) as unit:
            batch = await queue.reclaim_expired(
                unit,
                reclaim_batch=RECLAIM_BATCH,
                grace=timedelta(seconds=settings.reclaim_after_s),
                actor=actor,
                max_attempts=settings.max_attempts,
            )
        total += len(batch)
        if len(batch) < RECLAIM_BATCH:
            return total


async def seal(engine: AsyncEngine, settings: Settings) -> int:
    """Chain every event of a finished transaction, batch after batch (docs/audit.md). Returns 0
    at once when another sealer holds the chain's lock: it is doing the same work."""
    total = 0
    while True:
        async with transaction(
            engine,
            lock_timeout_ms=settings.pg_lock_timeout_ms,
            statement_timeout_ms=settings.statement_timeout_ms,
        ) as conn:
            sealed = await audit.seal_batch(conn)
        total += sealed or 0
        if sealed is None or sealed < audit.SEAL_BATCH:
            return total


async def seal_logged(engine: AsyncEngine, settings: Settings) -> None:
    """The loop's sealing step: the chain trails the events by at most one interval. A failure
    here (a tampered chain, say) is logged and never stops reclaiming."""
    try:
        sealed = await seal(engine, settings)
    except audit.ChainBroken as error:
        log.error("audit_chain_broken", extra={"error": str(error)})
        return
    if sealed:
        log.info("audit_chain_sealed", extra={"sealed": sealed})


async def seal_once(settings: Settings, url: str) -> int:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        return await seal(engine, settings)
    finally:
        await engine.dispose()


class _Step(Protocol):
    @property
    def caught_up(self) -> bool: ...


S = TypeVar("S", bound=_Step)


async def _until_caught_up(
    engine: AsyncEngine,
    settings: Settings,
    step: Callable[[AsyncConnection], Awaitable[S | None]],
    *,
    statement_timeout_ms: int | None = None,
) -> S | None:
    """`step` in one short transaction after another until it has caught up; None at once when
    another reclaimer is doing it."""
    while True:
        async with transaction(
            engine,
            lock_timeout_ms=settings.pg_lock_timeout_ms,
            statement_timeout_ms=statement_timeout_ms or settings.statement_timeout_ms,
        ) as conn:
            done = await step(conn)
        if done is None or done.caught_up:
            return done


async def roll_up(
    engine: AsyncEngine, settings: Settings, *, margin: timedelta = stats.ROLLUP_MARGIN
) -> stats.RolledUp | None:
    """Fold the RESOLVED count forward (db/stats.py), a week per transaction."""
    return await _until_caught_up(engine, settings, lambda conn: stats.roll_up_resolved(conn, margin=margin))


async def roll_up_days(engine: AsyncEngine, settings: Settings) -> reports.RolledDays | None:
    """Keep the throughput and backlog reports' closed days (db/reports/rollup.py), up to the
    RESOLVED rollup's edge, so run after roll_up: four weeks of days per transaction."""
    return await _until_caught_up(
        engine,
        settings,
        lambda conn: reports.roll_up(conn, tz=settings.report_time_zone),
        statement_timeout_ms=max(settings.statement_timeout_ms, reports.ROLLUP_STATEMENT_TIMEOUT_MS),
    )


async def roll_up_once(
    settings: Settings, url: str, *, margin: timedelta = stats.ROLLUP_MARGIN
) -> stats.RolledUp | None:
    """The RESOLVED count, then the reports' closed days, rolled up to now."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        rolled = await roll_up(engine, settings, margin=margin)
        await roll_up_days(engine, settings)
        return rolled
    finally:
        await engine.dispose()


async def add_event_months(engine: AsyncEngine, settings: Settings) -> None:
    """Keep REVIEW_QUEUE_EVENT_MONTHS_AHEAD months of the event trail's partitions created. A lock
    the attach waited for too long is not a failure of the round: the next one tries again."""
    try:
        async with transaction(
            engine,
            lock_timeout_ms=settings.pg_lock_timeout_ms,
            statement_timeout_ms=settings.statement_timeout_ms,
        ) as conn:
            made = await partitions.add_event_months(conn, ahead=settings.event_months_ahead)
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        log.warning("event_months_deferred", extra={"reason": "lock_timeout"})
        return
    if made:
        log.info("event_months_added", extra={"partitions": made, "ahead": settings.event_months_ahead})


async def warn_on_leak(engine: AsyncEngine, settings: Settings) -> None:
    """Seed: LEASE_LEAK. ASSIGNED rows approaching max_inflight mean leases are not coming back.
    A `transaction`, though it only reads: its watchdog is what gives up on a frozen primary."""
    async with transaction(
        engine,
        lock_timeout_ms=settings.pg_lock_timeout_ms,
        statement_timeout_ms=settings.statement_timeout_ms,
    ) as conn:
        gauges = await stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
    ratio = gauges.assigned / settings.max_inflight
    if ratio > LEAK_WARNING_RATIO:
        log.warning(
            "review_queue_lease_leak",
            extra={
                "assigned": gauges.assigned,
                "max_inflight": settings.max_inflight,
                "inflight_ratio": round(ratio, 3),
            },
        )


async def drain_once(settings: Settings, url: str) -> int:
    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        return await drain(engine, settings, actor=reclaimer_identity())
    finally:
        await engine.dispose()


async def _reclaim_round(engine: AsyncEngine, settings: Settings, actor: str) -> None:
    reclaimed = await drain(engine, settings, actor=actor)
    if reclaimed:
        log.info("reclaim_drained", extra={"reclaimed": reclaimed})
    # Before the longer steps: a step failing round after round must not leave the trail without
    # its next months (writes fail past the last one).
    await add_event_months(engine, settings)
    await seal_logged(engine, settings)
    await warn_on_leak(engine, settings)


async def _roll_up_round(engine: AsyncEngine, settings: Settings) -> None:
    await roll_up(engine, settings)
    await roll_up_days(engine, settings)


Round = Callable[[AsyncEngine], Awaitable[None]]


async def _supervise(settings: Settings, url: str, stop: asyncio.Event, loop: str, round_: Round) -> None:
    """`round_` every reclaim_interval_s (plus up to 10 % jitter) on an engine of its own, until
    stopped; a failed round is logged and retried after a backoff."""
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=5)
    failures = 0
    try:
        while not stop.is_set():
            try:
                await round_(engine)
                failures = 0
                delay = settings.reclaim_interval_s * random.uniform(1.0, 1.1)  # noqa: S311 - jitter
            except Exception as error:
                failures += 1
                delay = min(MAX_BACKOFF_S, settings.reclaim_interval_s, 0.5 * 2**failures)
                reason, extra = classify(error), {"loop": loop, "retry_in_s": delay}
                if reason is None:
                    log.exception("reclaim_failed", extra=extra)
                else:
                    log.warning("reclaim_database_unavailable", extra={"reason": reason, **extra})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
    finally:
        await engine.dispose()


async def run_forever(settings: Settings, url: str, stop: asyncio.Event | None = None) -> None:
    """Reclaim (with the trail's months, the chain's seal and the leak check) and roll up the
    reports, each in its own loop until stopped or signalled. Two loops, because a rollup's
    transaction may take minutes (ROLLUP_STATEMENT_TIMEOUT_MS), and so may its watchdog on a
    primary that froze under it: reclaiming must not wait for that (tests/system/test_failover.py's
    frozen leader)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    actor = reclaimer_identity()
    log.info("reclaimer_started", extra={"interval_s": settings.reclaim_interval_s, "actor": actor})
    reclaiming = partial(_reclaim_round, settings=settings, actor=actor)
    rolling_up = partial(_roll_up_round, settings=settings)
    try:
        await asyncio.gather(
            _supervise(settings, url, stop, "reclaim", reclaiming),
            _supervise(settings, url, stop, "roll_up", rolling_up),
        )
    finally:
        log.info("reclaimer_stopped")
