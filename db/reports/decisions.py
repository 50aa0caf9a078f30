"""The decisions of a period, a page at a time: the export for the audit binder."""

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from uuid import UUID

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.reports.common import time_zone_checked

DECISIONS_PAGE = 1000


@dataclass(frozen=True, slots=True)
class Decision:
    event_id: int
    item_id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal  # the figures the decision was made on
    currency: str
    match_decision: str
    resolution: str
    note: str | None
    resolved_by: str
    resolved_at: datetime
    approved_by: str | None
    approved_at: datetime | None
    due_at: datetime
    on_time: bool
    reopened_at: datetime | None  # when the decision was reopened (by an admin or a revision), if ever
    # Why four eyes applied or not: the rate the completion converted at and the base-currency amount
    # it compared (an approval's are its submission's), as the event recorded them, exact decimal
    # text; None without a rate (an approver was needed) or from before currencies.
    rate: str | None
    base_amount: str | None


_PERIOD = text(
    "SELECT CAST(:start AS date)::timestamp AT TIME ZONE :tz, CAST(:end AS date)::timestamp AT TIME ZONE :tz"
)

# Keyset pages in (at, id) order on ix_review_queue_event_decision_at. The figures are those the
# decision was made on: the `previous` figures of the first revision after it, if any, else the
# item's own (a revision of a resolved item reopens it, so a standing decision had none since).
_DECISIONS = text("""
WITH page AS (
    -- The page itself, straight off the index in (at, id) order: never a sort of the period.
    SELECT e.id, e.item_id, e.event, e.actor, e.at, e.details
    FROM review_queue_event e
    WHERE e.event IN ('RESOLVED', 'APPROVED') AND e.at >= :lo AND e.at < :hi
      AND (e.at, e.id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
    ORDER BY e.at, e.id
    LIMIT :limit
)
SELECT e.id AS event_id, e.item_id, i.idempotency_key, i.ledger_entity,
       coalesce(CAST(rev.details -> 'previous' ->> 'variance_amount' AS numeric), i.variance_amount)
           AS variance_amount,
       -- A revision from before currencies (2026_12_06_1910) kept none: the item's, the base then.
       CASE WHEN rev.details IS NULL THEN i.currency
            ELSE coalesce(rev.details -> 'previous' ->> 'currency', i.currency) END AS currency,
       coalesce(rev.details -> 'previous' ->> 'match_decision', i.match_decision) AS match_decision,
       e.details ->> 'resolution' AS resolution, e.details ->> 'note' AS note,
       CASE e.event WHEN 'APPROVED' THEN e.details ->> 'prepared_by' ELSE e.actor END AS resolved_by,
       e.at AS resolved_at,
       CASE e.event WHEN 'APPROVED' THEN e.actor END AS approved_by,
       CASE e.event WHEN 'APPROVED' THEN e.at END AS approved_at,
       i.due_at, e.at <= i.due_at AS on_time, reopen.at AS reopened_at,
       CASE e.event WHEN 'APPROVED' THEN sub.details ELSE e.details END ->> 'rate' AS rate,
       CASE e.event WHEN 'APPROVED' THEN sub.details ELSE e.details END ->> 'base_amount' AS base_amount
FROM page e
JOIN review_queue_item i ON i.id = e.item_id
-- Reopened since? Through the small index of reopenings; most decisions never were.
LEFT JOIN LATERAL (
    SELECT r.at FROM review_queue_event r
    WHERE r.item_id = e.item_id AND r.event = 'REOPENED' AND r.id > e.id ORDER BY r.id LIMIT 1
) AS reopen ON true
-- A revision after a decision reopens it (or comes after a reopening): looked for only then.
LEFT JOIN LATERAL (
    SELECT r.details FROM review_queue_event r
    WHERE reopen.at IS NOT NULL AND r.item_id = e.item_id AND r.id > e.id AND r.event = 'REVISED'
    ORDER BY r.id LIMIT 1
) AS rev ON true
-- An approval's conversion is its submission's: the last one before it, for approvals only.
LEFT JOIN LATERAL (
    SELECT r.details FROM review_queue_event r
    WHERE e.event = 'APPROVED' AND r.item_id = e.item_id AND r.at <= e.at AND r.id < e.id
      AND r.event = 'SUBMITTED_FOR_APPROVAL'
    ORDER BY r.id DESC LIMIT 1
) AS sub ON true
ORDER BY e.at, e.id
""")

Cursor = tuple[datetime, int]
_BEFORE_EVERYTHING: Cursor = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), 0)


async def decision_bounds(
    conn: AsyncConnection, *, start: date, end: date, tz: str
) -> tuple[datetime, datetime]:
    """The instants of local midnight of `start` and `end` in `tz`: the export's period."""
    with time_zone_checked(tz):
        row = (await conn.execute(_PERIOD, {"start": start, "end": end, "tz": tz})).one()
    return row[0], row[1]


async def decisions_page(
    conn: AsyncConnection, *, lo: datetime, hi: datetime, after: Cursor | None, limit: int = DECISIONS_PAGE
) -> list[Decision]:
    """Up to `limit` decisions made in [lo, hi), after the cursor (at, event id), in that order."""
    after_at, after_id = after or _BEFORE_EVERYTHING
    rows = await conn.execute(
        _DECISIONS, {"lo": lo, "hi": hi, "after_at": after_at, "after_id": after_id, "limit": limit}
    )
    return [Decision(**row._mapping) for row in rows]
