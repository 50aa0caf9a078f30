"""Throughput per reviewer: decisions by outcome, the leases handed back apart, and the time from
lease to decision."""

import json
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.reports import common
from db.reports.common import Period, begin


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    start: date
    reviewer: str
    resolved: int
    submitted_for_approval: int
    approved: int
    rejected: int
    released: int  # leases handed back: not a decision, not in `decisions` nor the percentiles
    decisions: int  # resolved + submitted_for_approval + approved + rejected
    median_lease_to_decision_s: Decimal | None  # nearest rank; None when no decision had a lease
    p90_lease_to_decision_s: Decimal | None


@dataclass(frozen=True, slots=True)
class ThroughputReport:
    as_of: datetime
    rows: list[ThroughputRow]


# The lease a trail decision ended: the item's latest LEASED or REASSIGNED event before it.
_LEASE_START = """(SELECT l.at FROM review_queue_event l
    WHERE l.item_id = {e}.item_id AND l.id < {e}.id AND l.event IN ('LEASED', 'REASSIGNED')
    ORDER BY l.id DESC LIMIT 1)"""
# Outcomes as numbers while rows are counted (cheaper than comparing text for each of five counts).
_OUTCOME = "CASE {e}.event WHEN 'SUBMITTED_FOR_APPROVAL' THEN 2 WHEN 'REJECTED' THEN 4 ELSE 5 END"

# Every decision made in a bucket, with who made it and how long after the lease began:
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
# A decision stays in its bucket whatever happens to its item later (a reopening keeps it, from the
# REOPENED event), so the figures of a day or week that is over never change: the reclaimer keeps
# them in review_queue_throughput_bucket for one zone, and such a bucket is read from there.
_BUCKETS = f"""
edges AS (SELECT CAST(:edges AS timestamptz[]) AS e),
bucket AS (
    SELECT k, e[k] AS lo, e[k + 1] AS hi, {{rolled}} AS rolled,
           CAST(:start AS date) + (k - 1) * :step AS first_day, CAST(:start AS date) + k * :step AS next_day
    FROM edges, generate_series(1, cardinality(e) - 1) AS k
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
    -- A reopening follows the decision it reopens, so the period's are among those since its start
    -- (ix_review_queue_event_reopened_at), not every reopening kept. A day earlier: the two times
    -- are their transactions' starts, and a revision that began just before the decision it waited
    -- for may carry the earlier one.
    WHERE r.event = 'REOPENED' AND r.at >= e[1] - interval '1 day'
      AND d.at >= e[1] AND d.at < e[cardinality(e)]
    GROUP BY 1
)"""
_ONE_REVIEWER = "(CAST(:reviewer AS text) IS NULL OR {reviewer} = CAST(:reviewer AS text))"
_FROM_THE_TRAIL = f"""
        SELECT d.reviewer COLLATE "C" AS reviewer,
               count(*) FILTER (WHERE d.outcome = 1) AS resolved,
               count(*) FILTER (WHERE d.outcome = 2) AS submitted_for_approval,
               count(*) FILTER (WHERE d.outcome = 3) AS approved,
               count(*) FILTER (WHERE d.outcome = 4) AS rejected,
               count(*) FILTER (WHERE d.outcome = 5) AS released,
               -- A release hands the work back undecided: counted apart, never a decision, and
               -- its time is not a time to decision.
               count(*) FILTER (WHERE d.outcome <> 5) AS decisions,
               -- A lease that began after the decision (clocks of racing transactions) took no time.
               array_agg(greatest(d.took, interval '0')) FILTER (WHERE d.outcome <> 5) AS took
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
        WHERE NOT b.rolled AND {_ONE_REVIEWER.format(reviewer="d.reviewer")}
        GROUP BY d.reviewer COLLATE "C"
"""
# A bucket's rows read from the trail, with each reviewer's two percentiles.
_LIVE = f"""
        SELECT g.reviewer, g.resolved, g.submitted_for_approval, g.approved, g.rejected, g.released,
               g.decisions, p.took[1], p.took[2]
        FROM ({_FROM_THE_TRAIL}        ) AS g
        CROSS JOIN LATERAL (
            SELECT percentile_disc(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY t) FROM unnest(g.took) AS t
        ) AS p (took)"""
# ... or, when it is over, in the precomputed zone, and a day or a Monday week, as it was kept.
_ROLLED = """coalesce((
    SELECT s.time_zone = :tz AND s.through >= CAST(:start AS date) + k * :step
           AND (:step = 1 OR (:step = 7 AND extract(isodow FROM CAST(:start AS date)) = 1))
    FROM review_queue_throughput_rollup s), false)"""
_KEPT = f"""
        SELECT c.reviewer, c.resolved, c.submitted_for_approval, c.approved, c.rejected, c.released,
               c.decisions, c.median, c.p90
        FROM review_queue_throughput_bucket c
        WHERE b.rolled AND c.days = :step AND c.start = b.first_day
          AND {_ONE_REVIEWER.format(reviewer="c.reviewer")}"""
_PER_BUCKET = """
per_bucket AS (
    SELECT b.k, g.*
    FROM bucket b
    LEFT JOIN reopened r ON r.k = b.k
    CROSS JOIN LATERAL ({rows}
    ) AS g (reviewer, resolved, submitted_for_approval, approved, rejected, released, decisions, median, p90)
)"""
_LIVE_OR_KEPT = _LIVE + "\n        UNION ALL" + _KEPT
# The rows as JSON, built by PostgreSQL in one value, in the API's field names and formats
# (api/schemas/reports.py ThroughputRowOut: dates ISO, seconds as strings to the microsecond). A
# year of days at 40 reviewers is 16,000 rows: as Python objects, fetching them and building their
# models took several times the statement's own time (docs/performance.md).
_THROUGHPUT = text(f"""
WITH {_BUCKETS.format(rolled=_ROLLED)},
{_PER_BUCKET.format(rows=_LIVE_OR_KEPT)}
-- Reviewers in byte order ("C"): the grouping compares bytes, not a locale's collation.
SELECT coalesce(json_agg(json_build_object(
           'start', CAST(:start AS date) + (k - 1) * :step, 'reviewer', reviewer, 'resolved', resolved,
           'submitted_for_approval', submitted_for_approval, 'approved', approved, 'rejected', rejected,
           'released', released, 'decisions', decisions,
           'median_lease_to_decision_s', CAST(round(extract(epoch FROM median), 6) AS text),
           'p90_lease_to_decision_s', CAST(round(extract(epoch FROM p90), 6) AS text))
       ORDER BY k, reviewer), '[]')::text
FROM per_bucket
""")


async def throughput_json(
    conn: AsyncConnection, *, period: Period, reviewer: str | None = None
) -> tuple[str, datetime]:
    """Per bucket and reviewer: decisions by outcome, and the time from lease to decision, as one
    JSON array of ThroughputRowOut (text); and the report's moment."""
    edges, as_of = await begin(conn, period)
    params = {
        "edges": edges,
        "start": period.start,
        "step": period.step_days,
        "tz": period.tz,
        "reviewer": reviewer,
    }
    return str(await conn.scalar(_THROUGHPUT, params)), as_of


def _seconds(value: str | None) -> Decimal | None:
    return None if value is None else Decimal(value)


async def throughput(
    conn: AsyncConnection, *, period: Period, reviewer: str | None = None
) -> ThroughputReport:
    """throughput_json()'s rows as Python values."""
    rows, as_of = await throughput_json(conn, period=period, reviewer=reviewer)
    return ThroughputReport(
        as_of=as_of,
        rows=[
            ThroughputRow(
                **{
                    **r,
                    "start": date.fromisoformat(r["start"]),
                    "median_lease_to_decision_s": _seconds(r["median_lease_to_decision_s"]),
                    "p90_lease_to_decision_s": _seconds(r["p90_lease_to_decision_s"]),
                }
            )
            for r in json.loads(rows)
        ],
    )


# The buckets of a period, read from the trail as the report reads them, kept (db/reports/rollup.py).
_KEEP = text(f"""
WITH {_BUCKETS.format(rolled="false")},
{_PER_BUCKET.format(rows=_LIVE)}
INSERT INTO review_queue_throughput_bucket (days, start, reviewer, resolved, submitted_for_approval,
    approved, rejected, released, decisions, median, p90)
SELECT :step, CAST(:start AS date) + (k - 1) * :step, reviewer, resolved, submitted_for_approval,
       approved, rejected, released, decisions, median, p90
FROM per_bucket
""")


async def keep(conn: AsyncConnection, period: Period) -> None:
    """Keep the throughput of the period's buckets, which are over (db/reports/rollup.py)."""
    await common.keep(conn, period, _KEEP, step=period.step_days, reviewer=None)
