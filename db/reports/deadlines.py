"""SLA attainment: per bucket, the items that fell due in it and whether a decision stood by then."""

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.reports.common import REOPENED_DUE, Period, begin


@dataclass(frozen=True, slots=True)
class SlaFigures:
    fell_due: int
    on_time: int
    late: int
    open_past_due: int
    attainment: Decimal | None  # on_time / fell_due, 4 decimals (half up); None when nothing fell due


@dataclass(frozen=True, slots=True)
class SlaBucket(SlaFigures):
    start: date


@dataclass(frozen=True, slots=True)
class SlaReport:
    as_of: datetime
    buckets: list[SlaBucket]
    total: SlaFigures


_ENTITY = "(CAST(:entity AS text) IS NULL OR {t}.ledger_entity = CAST(:entity AS text))"

# Per bucket: the resolved rows that fell due in it, through ix_review_queue_item_resolved_due (on
# time when the decision took effect by due_at), the open rows through the live queue's partial
# indexes (never resolved by their deadline, or their row would say so, unless reopened), and the
# correction for items ever reopened, whose trail says whether a decision stood at due_at.
_SLA = text(f"""
WITH edges AS (SELECT CAST(:edges AS timestamptz[]) AS e),
bucket AS (
    SELECT k, e[k] AS lo, e[k + 1] AS hi FROM edges, generate_series(1, cardinality(e) - 1) AS k
),
{REOPENED_DUE},
-- Resolved at due_at by the timeline: its last moment in effect then is a decision.
reopened AS MATERIALIZED (
    SELECT i.due_at, i.state = 'RESOLVED' AS resolved_now,
           i.state = 'RESOLVED' AND greatest(i.resolved_at, i.created_at) <= i.due_at AS on_time_by_row,
           coalesce(at_due.decision, false) AS on_time
    FROM edges, reopened_item i
    LEFT JOIN (
        SELECT DISTINCT ON (t.id) t.id, t.decision
        FROM timeline t JOIN reopened_item x ON x.id = t.id
        WHERE t.effective <= x.due_at
        ORDER BY t.id, t.k1 DESC, t.k2 DESC
    ) AS at_due ON at_due.id = i.id
    WHERE i.due_at >= e[1] AND i.due_at < e[cardinality(e)] AND i.due_at <= now()
      AND {_ENTITY.format(t="i")}
),
figures AS MATERIALIZED (
    SELECT b.k, CAST(:start AS date) + (b.k - 1) * :step AS start,
           r.n + o.n AS fell_due,
           r.on_time + f.resolved_fix + f.open_fix AS on_time,
           r.n - r.on_time - f.resolved_fix AS late,
           o.n - f.open_fix AS open_past_due
    FROM bucket b
    CROSS JOIN LATERAL (
        SELECT count(*) AS n,
               count(*) FILTER (WHERE greatest(i.resolved_at, i.created_at) <= i.due_at) AS on_time
        FROM review_queue_item i
        WHERE i.state = 'RESOLVED' AND i.due_at >= b.lo AND i.due_at < b.hi AND i.due_at <= now()
          AND {_ENTITY.format(t="i")}
    ) AS r
    CROSS JOIN LATERAL (
        SELECT count(*) AS n FROM (
            SELECT due_at, ledger_entity FROM review_queue_item WHERE state = 'PENDING'
            UNION ALL
            SELECT due_at, ledger_entity FROM review_queue_item WHERE state NOT IN ('PENDING', 'RESOLVED')
        ) AS o
        WHERE o.due_at >= b.lo AND o.due_at < b.hi AND o.due_at <= now() AND {_ENTITY.format(t="o")}
    ) AS o
    CROSS JOIN LATERAL (
        SELECT coalesce(sum(x.on_time::int - x.on_time_by_row::int) FILTER (WHERE x.resolved_now), 0)
                   AS resolved_fix,
               count(*) FILTER (WHERE x.on_time AND NOT x.resolved_now) AS open_fix
        FROM reopened x WHERE x.due_at >= b.lo AND x.due_at < b.hi
    ) AS f
),
totals AS (
    SELECT k, start, fell_due, on_time, late, open_past_due FROM figures
    UNION ALL
    SELECT NULL, NULL, coalesce(sum(fell_due), 0), coalesce(sum(on_time), 0), coalesce(sum(late), 0),
           coalesce(sum(open_past_due), 0)
    FROM figures
)
SELECT start, fell_due, on_time, late, open_past_due,
       CASE WHEN fell_due > 0 THEN round(on_time::numeric / fell_due, 4) END AS attainment
FROM totals ORDER BY k NULLS LAST
""")


def _sla_counts(row: Any) -> dict[str, Any]:
    return {
        "fell_due": int(row.fell_due),
        "on_time": int(row.on_time),
        "late": int(row.late),
        "open_past_due": int(row.open_past_due),
        "attainment": row.attainment,
    }


async def _sla(
    conn: AsyncConnection, *, edges: list[datetime], start: date, step: int, ledger_entity: str | None
) -> tuple[list[SlaBucket], SlaFigures]:
    rows = (
        await conn.execute(_SLA, {"edges": edges, "start": start, "step": step, "entity": ledger_entity})
    ).all()
    *buckets, total = rows
    return [SlaBucket(start=r.start, **_sla_counts(r)) for r in buckets], SlaFigures(**_sla_counts(total))


async def sla(conn: AsyncConnection, *, period: Period, ledger_entity: str | None = None) -> SlaReport:
    """Per bucket, the items that fell due in it and whether they were resolved by their deadline."""
    edges, as_of = await begin(conn, period)
    buckets, total = await _sla(
        conn, edges=edges, start=period.start, step=period.step_days, ledger_entity=ledger_entity
    )
    return SlaReport(as_of=as_of, buckets=buckets, total=total)


# Up to now, inclusive (due_at <= now(), and the bucket's end is exclusive).
_TRAILING = text("SELECT ARRAY[now() - make_interval(days => :days), now() + interval '1 microsecond']")


async def sla_trailing(conn: AsyncConnection, *, days: int) -> SlaFigures:
    """The SLA of the items that fell due in the last `days` days (the /metrics gauges)."""
    edges = list(await conn.scalar(_TRAILING, {"days": days}) or [])
    _, total = await _sla(conn, edges=edges, start=date(1970, 1, 1), step=days, ledger_entity=None)
    return total
