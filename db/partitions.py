"""The event trail's monthly partitions (alembic/versions/2026_12_05_0200_event_trail_by_month.py)."""

from dataclasses import dataclass
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
# ... and the age of the live chain's first event: the oldest the trail keeps, which the next
# archive would move first (its `at` read by id, one primary-key probe per month).
_GAUGES = text(f"""
SELECT greatest(extract(epoch FROM ({_BOUNDS}) - now()), 0) AS ahead_s,
       coalesce((SELECT greatest(extract(epoch FROM now() - e.at), 0)
                 FROM (SELECT event_id FROM review_queue_chain ORDER BY seq LIMIT 1) AS c
                 JOIN review_queue_event e ON e.id = c.event_id), 0) AS oldest_event_age_s
""")


@dataclass(frozen=True, slots=True)
class TrailGauges:
    ahead_s: float  # from now until covered_until(); 0 when past it
    oldest_event_age_s: float  # of the live chain's first event; 0 when nothing is sealed


async def add_event_months(conn: AsyncConnection, *, ahead: int) -> int:
    """Create the partitions of this month and the `ahead` next ones that are missing (owner-run,
    under a short lock_timeout: a busy moment raises, and the next round tries again); how many."""
    return int(await conn.scalar(_ADD, {"ahead": ahead}) or 0)


async def covered_until(conn: AsyncConnection) -> datetime:
    """Until when an event has a partition (an INSERT after it would fail)."""
    until: datetime = await conn.scalar(_COVERED_UNTIL)
    return until


async def trail_gauges(conn: AsyncConnection) -> TrailGauges:
    """How long the partitions last, and how far back the trail goes (the /metrics gauges)."""
    row = (await conn.execute(_GAUGES)).one()
    return TrailGauges(ahead_s=float(row.ahead_s), oldest_event_age_s=float(row.oldest_event_age_s))
