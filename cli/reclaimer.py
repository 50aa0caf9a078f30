"""Reclaiming abandoned leases outside the request path."""

from datetime import timedelta

from api.settings import Settings
from db import queue
from db.engine import create_engine, set_transaction_timeouts

RECLAIM_BATCH = 100
# The audit trail's actor for sweeps not started by a person.
RECLAIMER = "reclaimer"


async def drain_once(settings: Settings, url: str) -> int:
    """Reclaim batch after batch, each its own short transaction, until one comes back short."""
    engine = create_engine(url, pool_size=1, max_overflow=0)
    total = 0
    try:
        while True:
            async with engine.begin() as conn:
                await set_transaction_timeouts(
                    conn,
                    lock_timeout_ms=settings.pg_lock_timeout_ms,
                    statement_timeout_ms=settings.statement_timeout_ms,
                )
                batch = await queue.reclaim_expired(
                    conn,
                    reclaim_batch=RECLAIM_BATCH,
                    grace=timedelta(seconds=settings.reclaim_after_s),
                    actor=RECLAIMER,
                )
            total += len(batch)
            if len(batch) < RECLAIM_BATCH:
                return total
    finally:
        await engine.dispose()
