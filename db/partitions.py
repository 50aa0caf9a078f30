"""The event trail's monthly partitions (alembic/versions/2026_12_05_0200_event_trail_by_month.py)."""

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

_ADD = text("SELECT review_queue_event_add_months(:ahead)")
# The upper bound of the last partition: events up to then have a month to go to.
_BOUNDS = r"""
SELECT max(CAST((regexp_match(pg_get_expr(c.relpartbound, c.oid), 'TO \(''([^'']+)''\)'))[1] AS timestamptz))
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'review_queue_event'::regclass
"""
_COVERED_UNTIL = text(_BOUNDS)
_AHEAD = text(f"SELECT greatest(extract(epoch FROM ({_BOUNDS}) - now()), 0)")


async def add_event_months(conn: AsyncConnection, *, ahead: int) -> int:
    """Create the partitions of this month and the `ahead` next ones that are missing (owner-run,
    under a short lock_timeout: a busy moment raises, and the next round tries again); how many."""
    return int(await conn.scalar(_ADD, {"ahead": ahead}) or 0)


async def covered_until(conn: AsyncConnection) -> datetime:
    """Until when an event has a partition (an INSERT after it would fail)."""
    until: datetime = await conn.scalar(_COVERED_UNTIL)
    return until


async def ahead_s(conn: AsyncConnection) -> float:
    """Seconds from now until covered_until() (the /metrics gauge); 0 when past it."""
    return float(await conn.scalar(_AHEAD) or 0)
