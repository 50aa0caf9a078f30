"""The backlog by age: per day, the items open at its end, rebuilt from the trail."""

from dataclasses import dataclass
from datetime import date, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.reports import common
from db.reports.common import REOPENED, Period, begin

# The age bands of the backlog, as in /stats: [0, 1 d), [1 d, 3 d), [3 d, 7 d), [7 d, 30 d), 30 d and more.
AGE_BANDS = ("0-1d", "1-3d", "3-7d", "7-30d", "30d+")


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
{REOPENED},
span (c, s, f, n) AS (
    -- (grid positions of created_at, the span's start, its end or null; how many items)
    SELECT width_bucket(i.created_at, g), width_bucket(i.created_at, g), width_bucket(i.resolved_at, g),
           count(*)
    -- Resolved before the period began: closed at every point (the grid reaches 30 days further
    -- back, for the age bands of the created_at). The period's start is a parameter of its own
    -- (:lo = e[1]), not read from the array: the planner then estimates the period's resolutions,
    -- not a third of all history, and does not size this hash table for millions of cells (zeroing
    -- it cost 15 ms at 10M items).
    FROM grid, review_queue_item i
    WHERE i.state = 'RESOLVED' AND i.resolved_at >= CAST(:lo AS timestamptz)
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


_KEEP = text(f"""
INSERT INTO review_queue_backlog_day (day, at, by_age)
SELECT start, at, by_age FROM ({_BACKLOG.text}) AS point
""")
# The kept days of the period (db/reports/rollup.py), when it is asked in the kept zone, and the day
# by which they end: every day before it is kept, or before anything was enqueued (nothing open).
_KEPT = text("""
SELECT d.day, d.at, d.by_age, s.through
FROM review_queue_throughput_rollup s
LEFT JOIN review_queue_backlog_day d
    ON d.day >= CAST(:start AS date) AND d.day < least(s.through, CAST(:end AS date))
WHERE s.time_zone = :tz AND s.through IS NOT NULL
ORDER BY d.day
""")


async def keep(conn: AsyncConnection, period: Period) -> None:
    """Keep the backlog's points of the period's days, which are over (db/reports/rollup.py)."""
    await common.keep(conn, period, _KEEP)


async def backlog(conn: AsyncConnection, *, period: Period) -> BacklogReport:
    """Per day: the items open at its end, by age. Rebuilt from the trail, so true for the past; the
    days that are over, in the kept zone, as they were kept."""
    edges, as_of = await begin(conn, period)
    kept = (await conn.execute(_KEPT, {"start": period.start, "end": period.end, "tz": period.tz})).all()
    first_live = min(max(kept[0].through, period.start), period.end) if kept else period.start
    by_day = {r.day: r for r in kept if r.day is not None}
    points = []
    for n in range((first_live - period.start).days):
        day, r = period.start + timedelta(days=n), by_day.get(period.start + timedelta(days=n))
        at, by_age = (r.at, tuple(r.by_age)) if r else (edges[n + 1], (0,) * len(AGE_BANDS))
        points.append(BacklogPoint(start=day, at=at, by_age=by_age))
    skip = (first_live - period.start).days
    if first_live < period.end:
        rows = await conn.execute(_BACKLOG, {"edges": edges[skip:], "lo": edges[skip], "start": first_live})
        points += [BacklogPoint(start=r.start, at=r.at, by_age=tuple(int(n) for n in r.by_age)) for r in rows]
    return BacklogReport(as_of=as_of, points=points)
