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
    # Split by currency (asked for): per ISO code with items open at `at`, its counts per band.
    by_currency: dict[str, tuple[int, ...]] | None = None

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
#
# Split by currency, each span also carries the item's currency (`cur`) at the points it covers. An
# item's currency changes only by a revision, so the spans of an item whose currency a revision
# changed since the period began are counted again: minus each in its current currency, plus its
# part within each of the item's currency segments (from one such revision's effective time to the
# next's, (lo, hi], as spans are) in that segment's currency. Unsplit, `cur` is '' throughout: the
# same statement, and the resolved rows stay an index-only read (currency is not in their index).
_BACKLOG_SQL = """
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
{reopened},
-- The spans of open time that the reopened items' trails give.
reopened_span AS MATERIALIZED (
    SELECT x.id, x.created_at AS c, m.effective AS s, m.next_effective AS f, {cur_x} AS cur
    FROM reopened_item x
    JOIN (
        SELECT t.id, t.decision, t.effective,
               lead(t.effective) OVER (PARTITION BY t.id ORDER BY t.k1, t.k2) AS next_effective
        FROM timeline t
    ) AS m ON m.id = x.id
    WHERE NOT m.decision
){currency_ctes},
span (c, s, f, n, cur) AS (
    -- (grid positions of created_at, the span's start, its end or null; how many items; currency)
    SELECT width_bucket(i.created_at, g), width_bucket(i.created_at, g), width_bucket(i.resolved_at, g),
           count(*), {cur_i}
    -- Resolved before the period began: closed at every point (the grid reaches 30 days further
    -- back, for the age bands of the created_at). The period's start is a parameter of its own
    -- (:lo = e[1]), not read from the array: the planner then estimates the period's resolutions,
    -- not a third of all history, and does not size this hash table for millions of cells (zeroing
    -- it cost 15 ms at 10M items).
    FROM grid, review_queue_item i
    WHERE i.state = 'RESOLVED' AND i.resolved_at >= CAST(:lo AS timestamptz)
    GROUP BY 1, 3, 5
    UNION ALL
    SELECT width_bucket(o.created_at, g), width_bucket(o.created_at, g), NULL, count(*), o.cur
    FROM grid, (
        SELECT created_at, {cur_bare} AS cur FROM review_queue_item WHERE state = 'PENDING'
        UNION ALL
        SELECT created_at, {cur_bare} FROM review_queue_item WHERE state NOT IN ('PENDING', 'RESOLVED')
    ) AS o
    GROUP BY 1, 5
    UNION ALL
    SELECT width_bucket(x.created_at, g), width_bucket(x.created_at, g),
           width_bucket(CASE WHEN x.state = 'RESOLVED' THEN x.resolved_at END, g), -1, {cur_x}
    FROM grid, reopened_item x
    UNION ALL
    SELECT width_bucket(r.c, g), width_bucket(r.s, g), width_bucket(r.f, g), 1, r.cur
    FROM grid, reopened_span r{currency_spans}
),
run AS (
    SELECT s.cur, p.t, greatest(width_bucket(s.s, b.pos), width_bucket(s.c, p.pos)) + 1 AS first,
           CASE WHEN s.f IS NULL THEN cardinality(b.pos) ELSE width_bucket(s.f, b.pos) END AS last,
           s.n
    FROM span s, position p, (SELECT pos FROM position WHERE t = 0) AS b
),
delta AS (
    SELECT run.cur, run.t, d.k, sum(d.n) AS n FROM run
    CROSS JOIN LATERAL (VALUES (run.first, run.n), (run.last + 1, -run.n)) AS d (k, n)
    WHERE run.first <= run.last
    GROUP BY run.cur, run.t, d.k
),
at_least AS MATERIALIZED (
    SELECT p.k, band.t, c.cur,
           coalesce(sum(d.n) OVER (PARTITION BY c.cur, band.t ORDER BY p.k), 0) AS n
    FROM point p CROSS JOIN band CROSS JOIN (SELECT DISTINCT cur FROM delta) AS c
    LEFT JOIN delta d ON d.cur = c.cur AND d.t = band.t AND d.k = p.k
),
in_band AS MATERIALIZED (
    SELECT a.k, a.cur, a.t, a.n - coalesce(older.n, 0) AS n
    FROM at_least a
    LEFT JOIN at_least older ON older.k = a.k AND older.cur = a.cur AND older.t = a.t + 1
)
SELECT p.k, CAST(:start AS date) + (p.k - 1) AS start, p.b AS at,
       (SELECT array_agg(coalesce(x.n, 0) ORDER BY band.t)
        FROM band LEFT JOIN (SELECT t, sum(n) AS n FROM in_band WHERE k = p.k GROUP BY t) AS x
        ON x.t = band.t) AS by_age,
       -- The currencies with items open at the point, each with its counts per band.
       (SELECT coalesce(jsonb_object_agg(y.cur, y.by_age), '{{}}')
        FROM (SELECT cur, array_agg(n ORDER BY t) AS by_age FROM in_band WHERE k = p.k GROUP BY cur
              HAVING sum(n) > 0) AS y) AS by_currency
FROM point p ORDER BY p.k
"""
# An item's currency revisions: REVISED events whose figures changed the currency (the index
# ix_review_queue_event_currency_revised holds them alone).
CURRENCY_REVISED = (
    "event = 'REVISED'"
    " AND (details -> 'previous' ->> 'currency') IS DISTINCT FROM (details -> 'current' ->> 'currency')"
)
_CURRENCY_CTES = f""",
-- The items whose currency a revision changed at or after the period began: before that, every
-- point has the currency of now. A revision's effective time is the running maximum of their `at`.
currency_revised AS MATERIALIZED (
    SELECT DISTINCT item_id AS id FROM review_queue_event, edges
    WHERE {CURRENCY_REVISED} AND at >= e[1]
),
revision AS MATERIALIZED (
    SELECT r.id, v.id AS k, v.details -> 'previous' ->> 'currency' AS before,
           v.details -> 'current' ->> 'currency' AS after,
           max(v.at) OVER (PARTITION BY r.id ORDER BY v.id) AS effective
    FROM currency_revised r
    CROSS JOIN LATERAL (
        SELECT id, at, details FROM review_queue_event
        WHERE item_id = r.id AND {CURRENCY_REVISED} OFFSET 0
    ) AS v
),
-- (lo, hi]: the item had `currency` at the points after lo up to hi (null: unbounded).
segment AS MATERIALIZED (
    (SELECT DISTINCT ON (id) id, before AS currency, CAST(NULL AS timestamptz) AS lo, effective AS hi
     FROM revision ORDER BY id, k)
    UNION ALL
    SELECT id, after, effective, lead(effective) OVER (PARTITION BY id ORDER BY k) FROM revision
),
-- Their spans of open time: the row's, or the trail's for the items ever reopened.
revised_span AS MATERIALIZED (
    SELECT i.id, i.created_at AS c, i.created_at AS s,
           CASE WHEN i.state = 'RESOLVED' THEN i.resolved_at END AS f, i.currency AS cur
    FROM currency_revised r JOIN review_queue_item i ON i.id = r.id
    WHERE NOT i.reopened
    UNION ALL
    SELECT x.id, x.c, x.s, x.f, x.cur FROM reopened_span x JOIN currency_revised r ON r.id = x.id
)"""
_CURRENCY_SPANS = """
    UNION ALL
    SELECT width_bucket(r.c, g), width_bucket(r.s, g), width_bucket(r.f, g), -1, r.cur
    FROM grid, revised_span r
    UNION ALL
    -- PostgreSQL's greatest and least skip nulls: an unbounded end is the other one.
    SELECT width_bucket(r.c, g), width_bucket(greatest(r.s, z.lo), g), width_bucket(least(r.f, z.hi), g),
           1, z.currency
    FROM grid, revised_span r JOIN segment z ON z.id = r.id"""
_SPLIT = {
    "cur_x": "x.currency",
    "cur_i": "i.currency",
    "cur_bare": "currency",
    "currency_ctes": _CURRENCY_CTES,
    "currency_spans": _CURRENCY_SPANS,
}
_UNSPLIT = {"cur_x": "''", "cur_i": "''", "cur_bare": "''", "currency_ctes": "", "currency_spans": ""}
_BACKLOG = text(_BACKLOG_SQL.format(reopened=REOPENED, **_UNSPLIT))
_BACKLOG_BY_CURRENCY = text(_BACKLOG_SQL.format(reopened=REOPENED, **_SPLIT))


# The reclaimer keeps each closed day with its split by currency (and the total).
_KEEP = text(f"""
INSERT INTO review_queue_backlog_day (day, at, by_age, by_currency)
SELECT start, at, by_age, by_currency FROM ({_BACKLOG_BY_CURRENCY.text}) AS point
""")
# The kept days of the period (db/reports/rollup.py), when it is asked in the kept zone, and the day
# by which they end: every day before it is kept, or before anything was enqueued (nothing open).
# A day kept by a release before the split has no by_currency (the next round keeps it again).
_KEPT = text("""
SELECT d.day, d.at, d.by_age, d.by_currency, s.through
FROM review_queue_throughput_rollup s
LEFT JOIN review_queue_backlog_day d
    ON d.day >= CAST(:start AS date) AND d.day < least(s.through, CAST(:end AS date))
WHERE s.time_zone = :tz AND s.through IS NOT NULL
ORDER BY d.day
""")


async def keep(conn: AsyncConnection, period: Period) -> None:
    """Keep the backlog's points of the period's days, which are over (db/reports/rollup.py)."""
    await common.keep(conn, period, _KEEP)


def _split(by_currency: dict[str, list[int]] | None) -> dict[str, tuple[int, ...]]:
    return {code: tuple(int(n) for n in counts) for code, counts in sorted((by_currency or {}).items())}


async def backlog(conn: AsyncConnection, *, period: Period, by_currency: bool = False) -> BacklogReport:
    """Per day: the items open at its end, by age (and with `by_currency`, split by the currency
    each had then). Rebuilt from the trail, so true for the past; the days that are over, in the
    kept zone, as they were kept."""
    edges, as_of = await begin(conn, period)
    kept = (await conn.execute(_KEPT, {"start": period.start, "end": period.end, "tz": period.tz})).all()
    first_live = min(max(kept[0].through, period.start), period.end) if kept else period.start
    if by_currency:  # a day kept without its split (by the release before it) is read from the trail
        first_live = min([first_live, *(r.day for r in kept if r.day is not None and r.by_currency is None)])
    by_day = {r.day: r for r in kept if r.day is not None}
    points = []
    for n in range((first_live - period.start).days):
        day, r = period.start + timedelta(days=n), by_day.get(period.start + timedelta(days=n))
        at, by_age = (r.at, tuple(r.by_age)) if r else (edges[n + 1], (0,) * len(AGE_BANDS))
        split = _split(r.by_currency if r else None) if by_currency else None
        points.append(BacklogPoint(start=day, at=at, by_age=by_age, by_currency=split))
    skip = (first_live - period.start).days
    if first_live < period.end:
        statement = _BACKLOG_BY_CURRENCY if by_currency else _BACKLOG
        rows = await conn.execute(statement, {"edges": edges[skip:], "lo": edges[skip], "start": first_live})
        points += [
            BacklogPoint(
                start=r.start,
                at=r.at,
                by_age=tuple(int(n) for n in r.by_age),
                by_currency=_split(r.by_currency) if by_currency else None,
            )
            for r in rows
        ]
    return BacklogReport(as_of=as_of, points=points)
