"""The controller's reports: SLA attainment, throughput per reviewer, the backlog by age, and the
decisions of a period. docs/reports.md defines every figure; each is computed here, in SQL, from
the items and the event trail.

Fast over a year of history, exactly: an item's row sums up its trail (created_at, resolved_at,
leased_at, resolved_by, approved_by) for as long as its decision has never been reopened. A
report therefore reads the resolved rows once, through a partial index of RESOLVED rows, and the
live queue through its own partial indexes; then it corrects for the few items ever reopened
(ix_review_queue_event_reopened) by reading their trail instead of their row. The tests compute
every figure from the trail alone and compare.

The trail's time: an item's events are in trail order (event id, the order their statements took
the item's row lock), and each takes effect at its `at` or, when an earlier event of the item has
a later `at` (a transaction that started first and committed second), at that later `at`: the
running maximum, so that an item's states follow each other in time.
"""

from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

# Reports sort and hash up to a year of decisions in memory, not on disk; only their own
# transaction gets this (SET LOCAL), never the queue's.
WORK_MEM = "128MB"
# The age bands of the backlog, as in /stats: [0, 1 d), [1 d, 3 d), [3 d, 7 d), [7 d, 30 d), 30 d and more.
AGE_BANDS = ("0-1d", "1-3d", "3-7d", "7-30d", "30d+")
DECISIONS_PAGE = 1000


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


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    start: date
    reviewer: str
    resolved: int
    submitted_for_approval: int
    approved: int
    rejected: int
    released: int
    decisions: int
    median_lease_to_decision_s: Decimal | None  # nearest rank; None when no decision had a lease
    p90_lease_to_decision_s: Decimal | None


@dataclass(frozen=True, slots=True)
class ThroughputReport:
    as_of: datetime
    rows: list[ThroughputRow]


@dataclass(frozen=True, slots=True)
class BacklogPoint:
    start: date
    at: datetime  # the end of the bucket, or the report's moment for the bucket in progress
    by_age: tuple[int, ...]  # open items per AGE_BANDS band

    @property
    def open(self) -> int:
        return sum(self.by_age)


@dataclass(frozen=True, slots=True)
class BacklogReport:
    as_of: datetime
    points: list[BacklogPoint]


@dataclass(frozen=True, slots=True)
class Decision:
    event_id: int
    item_id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal  # the figures the decision was made on
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


# ---------------------------------------------------------------------------------------------
# Bucket edges: local midnights as instants, in the report's transaction (so `now()` is shared)
# ---------------------------------------------------------------------------------------------

_EDGES = text(
    "SELECT array_agg((CAST(:start AS date) + n * :step)::timestamp AT TIME ZONE :tz ORDER BY n), now()"
    " FROM generate_series(0, :buckets) AS n"
)


async def _begin(conn: AsyncConnection, period: Period) -> tuple[list[datetime], datetime]:
    """The period's bucket edges (one more than buckets) and the report's moment, `now()`."""
    await conn.execute(text(f"SET LOCAL work_mem = '{WORK_MEM}'"))
    try:
        row = (
            await conn.execute(
                _EDGES,
                {"start": period.start, "step": period.step_days, "tz": period.tz, "buckets": period.buckets},
            )
        ).one()
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) == "22023":  # invalid_parameter_value
            raise UnknownTimeZone(period.tz) from None
        raise
    return list(row[0]), row[1]


# ---------------------------------------------------------------------------------------------
# SLA attainment
# ---------------------------------------------------------------------------------------------

# The items ever reopened, and their decisive moments in trail order, read from the REOPENED events
# (each names the decision it reopened: previous_resolved_at) and the item's row (its enqueue and its
# standing decision): enqueue, then per reopening the decision it reopened and the reopening, then
# the standing decision if RESOLVED. That is the order of their events' ids; `effective` is the
# running maximum of their moments. Two CTEs, shared by the SLA and the backlog.
_REOPENED = """
reopened_item AS MATERIALIZED (
    SELECT i.id, i.created_at, i.due_at, i.state, i.resolved_at, i.ledger_entity
    FROM (SELECT DISTINCT item_id FROM review_queue_event WHERE event = 'REOPENED') AS r
    -- One primary-key read per reopened item (OFFSET 0 keeps the planner from scanning all items).
    CROSS JOIN LATERAL (
        SELECT id, created_at, due_at, state, resolved_at, ledger_entity
        FROM review_queue_item WHERE id = r.item_id OFFSET 0
    ) AS i
),
timeline AS MATERIALIZED (
    SELECT t.id, t.decision, t.k1, t.k2,
           max(t.at) OVER (PARTITION BY t.id ORDER BY t.k1, t.k2) AS effective
    FROM (
        SELECT id, false AS decision, created_at AS at, 0::bigint AS k1, 0 AS k2 FROM reopened_item
        UNION ALL
        SELECT e.item_id, m.decision, m.at, e.id, m.k2
        FROM review_queue_event e
        CROSS JOIN LATERAL (VALUES
            (true, CAST(e.details ->> 'previous_resolved_at' AS timestamptz), 0),
            (false, e.at, 1)
        ) AS m (decision, at, k2)
        WHERE e.event = 'REOPENED'
        UNION ALL
        SELECT id, true, resolved_at, 9223372036854775807, 0 FROM reopened_item WHERE state = 'RESOLVED'
    ) AS t
)"""

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
{_REOPENED},
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
    edges, as_of = await _begin(conn, period)
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


# ---------------------------------------------------------------------------------------------
# Throughput per reviewer
# ---------------------------------------------------------------------------------------------

# The lease a trail decision ended: the item's latest LEASED or REASSIGNED event before it.
_LEASE_START = """(SELECT l.at FROM review_queue_event l
    WHERE l.item_id = {e}.item_id AND l.id < {e}.id AND l.event IN ('LEASED', 'REASSIGNED')
    ORDER BY l.id DESC LIMIT 1)"""
# Outcomes as numbers while rows are counted (cheaper than comparing text for each of five counts).
_OUTCOME = "CASE {e}.event WHEN 'SUBMITTED_FOR_APPROVAL' THEN 2 WHEN 'REJECTED' THEN 4 ELSE 5 END"

# Every decision made in the period, with who made it and how long after the lease began:
# - each item's standing decision, from its row (resolved_at, leased_at, approved_by or resolved_by),
#   through ix_review_queue_item_resolved_at;
# - submissions, rejections and the holders' releases, from the trail (ix_review_queue_event_other_work),
#   each with the start of the lease it ended: recorded on the event (`leased_at`, set by the
#   database since 2026_12_04_0900), or looked up for older events (ix_review_queue_event_lease_start);
# - decisions reopened since (no longer on their item's row), from the REOPENED events that name them,
#   gathered into one row of arrays per bucket, unnested where the bucket is counted (a reopening
#   records the start of the lease that made the decision it reopened, as the other work does).
# Bucket by bucket (an index range each), each bucket's decisions grouped by reviewer in a hash
# table (counts, and the durations gathered unsorted), and then each group's few hundred durations
# sorted on their own for its two percentiles, rather than every decision of the bucket sorted by
# reviewer first (18 % less PostgreSQL CPU for a year of weeks at 1M items). The durations stay
# intervals (exact, and cheaper to sort than numbers) until the percentiles are turned into seconds.
_THROUGHPUT = text(f"""
WITH edges AS (SELECT CAST(:edges AS timestamptz[]) AS e),
bucket AS (
    SELECT k, e[k] AS lo, e[k + 1] AS hi FROM edges, generate_series(1, cardinality(e) - 1) AS k
),
reopened AS (
    SELECT width_bucket(d.at, edges.e) AS k, array_agg(d.reviewer) AS reviewer,
           array_agg(d.outcome) AS outcome,
           array_agg(d.at - coalesce(r.leased_at, {_LEASE_START.format(e="r")})) AS took
    FROM edges, review_queue_event r
    CROSS JOIN LATERAL (
        SELECT CAST(r.details ->> 'previous_resolved_at' AS timestamptz) AS at,
               coalesce(r.details ->> 'previous_approved_by', r.details ->> 'previous_resolved_by')
                   AS reviewer,
               CASE WHEN r.details ->> 'previous_approved_by' IS NULL THEN 1 ELSE 3 END AS outcome
    ) AS d
    WHERE r.event = 'REOPENED' AND d.at >= e[1] AND d.at < e[cardinality(e)]
    GROUP BY 1
),
per_bucket AS (
    SELECT b.k, g.*
    FROM bucket b
    LEFT JOIN reopened r ON r.k = b.k
    CROSS JOIN LATERAL (
        SELECT d.reviewer COLLATE "C" AS reviewer,
               count(*) FILTER (WHERE d.outcome = 1) AS resolved,
               count(*) FILTER (WHERE d.outcome = 2) AS submitted_for_approval,
               count(*) FILTER (WHERE d.outcome = 3) AS approved,
               count(*) FILTER (WHERE d.outcome = 4) AS rejected,
               count(*) FILTER (WHERE d.outcome = 5) AS released,
               count(*) AS decisions,
               -- A lease that began after the decision (clocks of racing transactions) took no time.
               array_agg(greatest(d.took, interval '0')) AS took
        FROM (
            SELECT coalesce(i.approved_by, i.resolved_by),
                   CASE WHEN i.approved_by IS NULL THEN 1 ELSE 3 END,
                   i.resolved_at - i.leased_at
            FROM review_queue_item i
            WHERE i.state = 'RESOLVED' AND i.resolved_at >= b.lo AND i.resolved_at < b.hi
            UNION ALL
            SELECT w.actor, {_OUTCOME.format(e="w")},
                   w.at - coalesce(w.leased_at, {_LEASE_START.format(e="w")})
            FROM review_queue_event w
            WHERE (w.event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED')
                   OR (w.event = 'RELEASED' AND NOT w.details ? 'override'))
              AND w.at >= b.lo AND w.at < b.hi
            UNION ALL
            SELECT * FROM unnest(r.reviewer, r.outcome, r.took)
        ) AS d (reviewer, outcome, took)
        WHERE CAST(:reviewer AS text) IS NULL OR d.reviewer = CAST(:reviewer AS text)
        GROUP BY d.reviewer COLLATE "C"
    ) AS g
)
-- Reviewers in byte order ("C"): the grouping compares bytes, not a locale's collation.
SELECT CAST(:start AS date) + (k - 1) * :step AS start, reviewer, resolved, submitted_for_approval,
       approved, rejected, released, decisions,
       round(extract(epoch FROM p.took[1]), 6) AS median, round(extract(epoch FROM p.took[2]), 6) AS p90
FROM per_bucket
CROSS JOIN LATERAL (
    SELECT percentile_disc(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY t) FROM unnest(per_bucket.took) AS t
) AS p (took)
ORDER BY k, reviewer
""")


async def throughput(
    conn: AsyncConnection, *, period: Period, reviewer: str | None = None
) -> ThroughputReport:
    """Per bucket and reviewer: decisions by outcome, and the time from lease to decision."""
    edges, as_of = await _begin(conn, period)
    rows = await conn.execute(
        _THROUGHPUT,
        {"edges": edges, "start": period.start, "step": period.step_days, "reviewer": reviewer},
    )
    return ThroughputReport(
        as_of=as_of,
        rows=[
            ThroughputRow(
                start=r.start,
                reviewer=r.reviewer,
                resolved=r.resolved,
                submitted_for_approval=r.submitted_for_approval,
                approved=r.approved,
                rejected=r.rejected,
                released=r.released,
                decisions=r.decisions,
                median_lease_to_decision_s=r.median,
                p90_lease_to_decision_s=r.p90,
            )
            for r in rows
        ],
    )


# ---------------------------------------------------------------------------------------------
# Backlog by age
# ---------------------------------------------------------------------------------------------

# Point k measures at b_k (the end of bucket k, or now() for the bucket in progress). An item is open
# at b when it was enqueued before b and no decision was in effect just before b; of age band t or
# older when created_at < p(t, k) = b_k - lo_t (+ 1 µs, so that exactly lo_t old counts; p(0, k) = b_k).
#
# Every source of open time is a span (s, f] with its item's created_at c: open at b_k when
# s < b_k <= f (f null: still open). For band t that is the run of points
#   from max(#{b <= s}, #{p(t, .) <= c}) + 1 to #{b <= f}
# which becomes +n at its first point and -n after its last; a running sum per band gives the counts.
#
# The resolved rows (c, resolved_at] are many, so first each instant is replaced by its position on
# the grid of all thresholds (width_bucket): the counts above depend only on those positions, and
# a year of resolved rows collapses to a few thousand (created, resolved) cells in one pass.
# Sources: resolved rows and open rows (s = c); minus the rows of items ever reopened, plus the
# spans their trail gives (from each enqueue or reopening to the next decision).
_BACKLOG = text(f"""
WITH edges AS (SELECT CAST(:edges AS timestamptz[]) AS e),
point AS MATERIALIZED (
    SELECT k, least(e[k + 1], now()) AS b
    FROM edges, generate_series(1, cardinality(e) - 1) AS k WHERE e[k] < now()
),
band (t, lo) AS (VALUES (0, interval '0'), (1, interval '1 day'), (2, interval '3 days'),
                        (3, interval '7 days'), (4, interval '30 days')),
threshold AS MATERIALIZED (
    SELECT t, k, b - lo + CASE WHEN t > 0 THEN interval '1 microsecond' ELSE interval '0' END AS p
    FROM point, band
),
grid AS MATERIALIZED (SELECT array_agg(DISTINCT p ORDER BY p) AS g FROM threshold),
-- Per band, the grid positions of its thresholds in point order (band 0's are the points b).
position AS MATERIALIZED (
    SELECT t, array_agg(width_bucket(p, g) ORDER BY k) AS pos FROM threshold, grid GROUP BY t
),
{_REOPENED},
span (c, s, f, n) AS (
    -- (grid positions of created_at, the span's start, its end or null; how many items)
    SELECT width_bucket(i.created_at, g), width_bucket(i.created_at, g), width_bucket(i.resolved_at, g),
           count(*)
    FROM grid, review_queue_item i
    WHERE i.state = 'RESOLVED' AND i.resolved_at >= g[1]
    GROUP BY 1, 3
    UNION ALL
    SELECT width_bucket(o.created_at, g), width_bucket(o.created_at, g), NULL, count(*)
    FROM grid, (
        SELECT created_at FROM review_queue_item WHERE state = 'PENDING'
        UNION ALL
        SELECT created_at FROM review_queue_item WHERE state NOT IN ('PENDING', 'RESOLVED')
    ) AS o
    GROUP BY 1
    UNION ALL
    SELECT width_bucket(x.created_at, g), width_bucket(x.created_at, g),
           width_bucket(CASE WHEN x.state = 'RESOLVED' THEN x.resolved_at END, g), -1
    FROM grid, reopened_item x
    UNION ALL
    SELECT width_bucket(x.created_at, g), width_bucket(m.effective, g), width_bucket(m.next_effective, g), 1
    FROM grid, reopened_item x
    JOIN (
        SELECT t.id, t.decision, t.effective,
               lead(t.effective) OVER (PARTITION BY t.id ORDER BY t.k1, t.k2) AS next_effective
        FROM timeline t
    ) AS m ON m.id = x.id
    WHERE NOT m.decision
),
run AS (
    SELECT p.t, greatest(width_bucket(s.s, b.pos), width_bucket(s.c, p.pos)) + 1 AS first,
           CASE WHEN s.f IS NULL THEN cardinality(b.pos) ELSE width_bucket(s.f, b.pos) END AS last,
           s.n
    FROM span s, position p, (SELECT pos FROM position WHERE t = 0) AS b
),
delta AS (
    SELECT run.t, d.k, sum(d.n) AS n FROM run
    CROSS JOIN LATERAL (VALUES (run.first, run.n), (run.last + 1, -run.n)) AS d (k, n)
    WHERE run.first <= run.last
    GROUP BY run.t, d.k
),
at_least AS (
    SELECT p.k, band.t,
           coalesce(sum(d.n) OVER (PARTITION BY band.t ORDER BY p.k), 0) AS n
    FROM point p CROSS JOIN band LEFT JOIN delta d ON d.t = band.t AND d.k = p.k
)
SELECT p.k, CAST(:start AS date) + (p.k - 1) AS start, p.b AS at,
       array_agg(a.n - coalesce(older.n, 0) ORDER BY a.t) AS by_age
FROM point p
JOIN at_least a ON a.k = p.k
LEFT JOIN at_least older ON older.k = p.k AND older.t = a.t + 1
GROUP BY p.k, p.b ORDER BY p.k
""")


async def backlog(conn: AsyncConnection, *, period: Period) -> BacklogReport:
    """Per day: the items open at its end, by age. Rebuilt from the trail, so true for the past."""
    edges, as_of = await _begin(conn, period)
    rows = await conn.execute(_BACKLOG, {"edges": edges, "start": period.start})
    return BacklogReport(
        as_of=as_of,
        points=[BacklogPoint(start=r.start, at=r.at, by_age=tuple(int(n) for n in r.by_age)) for r in rows],
    )


# ---------------------------------------------------------------------------------------------
# Decisions of a period, a page at a time
# ---------------------------------------------------------------------------------------------

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
       coalesce(CAST(rev.details -> 'previous' ->> 'variance_amount' AS numeric(18, 2)), i.variance_amount)
           AS variance_amount,
       coalesce(rev.details -> 'previous' ->> 'match_decision', i.match_decision) AS match_decision,
       e.details ->> 'resolution' AS resolution, e.details ->> 'note' AS note,
       CASE e.event WHEN 'APPROVED' THEN e.details ->> 'prepared_by' ELSE e.actor END AS resolved_by,
       e.at AS resolved_at,
       CASE e.event WHEN 'APPROVED' THEN e.actor END AS approved_by,
       CASE e.event WHEN 'APPROVED' THEN e.at END AS approved_at,
       i.due_at, e.at <= i.due_at AS on_time, reopen.at AS reopened_at
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
ORDER BY e.at, e.id
""")

Cursor = tuple[datetime, int]
_BEFORE_EVERYTHING: Cursor = (datetime.fromisoformat("0001-01-01T00:00:00+00:00"), 0)


async def decision_bounds(
    conn: AsyncConnection, *, start: date, end: date, tz: str
) -> tuple[datetime, datetime]:
    """The instants of local midnight of `start` and `end` in `tz`: the export's period."""
    try:
        row = (await conn.execute(_PERIOD, {"start": start, "end": end, "tz": tz})).one()
    except DBAPIError as error:
        if getattr(error.orig, "sqlstate", None) == "22023":
            raise UnknownTimeZone(tz) from None
        raise
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
