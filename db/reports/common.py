"""What every report shares: the period and its buckets, the transaction they are read in, and the
items ever reopened (whose trail, not their row, tells their history)."""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date, datetime

from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

# Reports sort and hash up to a year of decisions in memory, not on disk; only their own
# transaction gets this (SET LOCAL), never the queue's.
WORK_MEM = "128MB"


class UnknownTimeZone(ValueError):
    """PostgreSQL does not know the time zone (the API checks names first; this is the backstop)."""


@dataclass(frozen=True, slots=True)
class Period:
    """Buckets of `step_days` days from `start` to `end` (exclusive), both local dates in `tz`.
    A bucket runs from local midnight to local midnight, as PostgreSQL places them:
    `date::timestamp AT TIME ZONE tz`."""

    start: date
    end: date
    tz: str
    step_days: int = 1

    @property
    def buckets(self) -> int:
        return (self.end - self.start).days // self.step_days


@contextmanager
def time_zone_checked(tz: str) -> Iterator[None]:
    """PostgreSQL's refusal of an unknown zone (invalid_parameter_value) as UnknownTimeZone."""
    try:
        yield
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) == "22023":
            raise UnknownTimeZone(tz) from None
        raise


# ---------------------------------------------------------------------------------------------
# Bucket edges: local midnights as instants, in the report's transaction (so `now()` is shared)
# ---------------------------------------------------------------------------------------------

_EDGES = text(
    "SELECT array_agg((CAST(:start AS date) + n * :step)::timestamp AT TIME ZONE :tz ORDER BY n), now()"
    " FROM generate_series(0, :buckets) AS n"
)


async def begin(conn: AsyncConnection, period: Period) -> tuple[list[datetime], datetime]:
    """The period's bucket edges (one more than buckets) and the report's moment, `now()`."""
    await conn.execute(text(f"SET LOCAL work_mem = '{WORK_MEM}'"))
    with time_zone_checked(period.tz):
        row = (
            await conn.execute(
                _EDGES,
                {"start": period.start, "step": period.step_days, "tz": period.tz, "buckets": period.buckets},
            )
        ).one()
    return list(row[0]), row[1]


async def keep(conn: AsyncConnection, period: Period, statement: TextClause, **params: object) -> None:
    """Run a report's keep statement over the period's bucket edges (and their first, `lo`), when
    the period has any (db/reports/rollup.py: the periods it is given are over)."""
    if period.buckets > 0:
        edges, _ = await begin(conn, period)
        await conn.execute(statement, {"edges": edges, "lo": edges[0], "start": period.start, **params})


# The items ever reopened, and their decisive moments in trail order, read from the REOPENED events
# (each names the decision it reopened: previous_resolved_at) and the item's row (its enqueue and its
# standing decision): enqueue, then per reopening the decision it reopened and the reopening, then
# the standing decision if RESOLVED. That is the order of their events' ids; `effective` is the
# running maximum of their moments. Two CTEs, shared by the SLA and the backlog.
_REOPENED = """
reopened_item AS MATERIALIZED (
    SELECT i.id, i.created_at, i.due_at, i.state, i.resolved_at, i.ledger_entity, i.currency
    FROM ({items}) AS r
    -- One primary-key read per reopened item (OFFSET 0 keeps the planner from scanning all items).
    CROSS JOIN LATERAL (
        SELECT id, created_at, due_at, state, resolved_at, ledger_entity, currency
        FROM review_queue_item WHERE id = r.item_id OFFSET 0
    ) AS i
),
timeline AS MATERIALIZED (
    SELECT t.id, t.decision, t.k1, t.k2,
           max(t.at) OVER (PARTITION BY t.id ORDER BY t.k1, t.k2) AS effective
    FROM (
        SELECT id, false AS decision, created_at AS at, 0::bigint AS k1, 0 AS k2 FROM reopened_item
        UNION ALL
        SELECT r.id, m.decision, m.at, e.id, m.k2
        FROM reopened_item r
        -- Each item's REOPENED events off ix_review_queue_event_reopened (OFFSET 0 keeps the
        -- planner from reading every reopening in the trail and joining them to a few items).
        CROSS JOIN LATERAL (
            SELECT id, at, details FROM review_queue_event
            WHERE item_id = r.id AND event = 'REOPENED' OFFSET 0
        ) AS e
        CROSS JOIN LATERAL (VALUES
            (true, CAST(e.details ->> 'previous_resolved_at' AS timestamptz), 0),
            (false, e.at, 1)
        ) AS m (decision, at, k2)
        UNION ALL
        SELECT id, true, resolved_at, 9223372036854775807, 0 FROM reopened_item WHERE state = 'RESOLVED'
    ) AS t
)"""
# The items ever reopened that may have been open at one of the period's day ends (the backlog):
# those open now, and those whose standing decision came at or after the period began (one resolved
# before it has stayed resolved since). Each set is one partial index of reopened items alone
# (2026_12_05_1510): O(reopened items open now and the period's), not every reopening in the history
# (49,498 at 10M items) nor a probe per open item and resolution (320,000 for a week at 10M) ...
REOPENED = _REOPENED.format(
    items="SELECT id AS item_id FROM review_queue_item WHERE reopened AND state <> 'RESOLVED'"
    " UNION ALL SELECT id FROM review_queue_item, edges"
    " WHERE reopened AND state = 'RESOLVED' AND resolved_at >= e[1]"
)
# ... or only those due in the period's edges (the SLA), off ix_review_queue_reopened_item_due_at.
REOPENED_DUE = _REOPENED.format(
    items="SELECT item_id FROM review_queue_reopened_item, edges"
    " WHERE due_at >= e[1] AND due_at < e[cardinality(e)]"
)
