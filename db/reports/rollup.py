"""The closed days (and Monday weeks) of the throughput and backlog reports, kept for one zone.

A decision never leaves its bucket, and what was open at a day's end stays so whatever happens
later (a reopening keeps the decision it reopens, from its REOPENED event), so the figures of a
day or a week that is over never change. The reclaimer's round keeps them, computed by the
reports' own statements, in review_queue_throughput_bucket and review_queue_backlog_day, for
REVIEW_QUEUE_REPORT_TIME_ZONE; the reports read a bucket from there when it is over in that zone.
"""

from dataclasses import dataclass
from datetime import date, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from db.reports import aging, workload
from db.reports.common import Period

ROLLUP_DAYS = 28  # days (and the weeks that end in them) computed per transaction
# A transaction of them may take longer than a request's statement timeout: the backlog of an old
# day reads every resolution since (about a second per 28 days for a year at 1M items).
ROLLUP_STATEMENT_TIMEOUT_MS = 300_000

_TAKE = text("SELECT time_zone, through FROM review_queue_throughput_rollup FOR UPDATE SKIP LOCKED")
# The day before the first enqueue or decision, whichever is first (a decision's moment is its
# transaction's start, which can precede the enqueue it saw): nothing is open or decided before it.
# The day before, because a local date and the reports' day edges part in a repeated local hour
# around midnight (an instant there can have Sunday's date and belong to Saturday's bucket); an
# extra empty day costs nothing. Each min() on the index of its kind, written as its predicate.
_FIRST_DAY = text("""
SELECT CAST(least(
    (SELECT min(created_at) FROM review_queue_item),
    (SELECT min(at) FROM review_queue_event WHERE event IN ('RESOLVED', 'APPROVED')),
    (SELECT min(at) FROM review_queue_event
     WHERE event IN ('SUBMITTED_FOR_APPROVAL', 'REJECTED')
        OR (event = 'RELEASED' AND NOT details ? 'override')),
    (SELECT min(resolved_at) FROM review_queue_item WHERE state = 'RESOLVED'),
    (SELECT min(CAST(details ->> 'previous_resolved_at' AS timestamptz)) FROM review_queue_event
     WHERE event = 'REOPENED')
) AT TIME ZONE :tz AS date) - 1
""")
# Days before this one are over for good: they ended before the RESOLVED rollup's edge, before which
# every transaction of the service had committed when the rollup last ran (db/stats.py), so no
# enqueue or decision dated in them can still arrive. A day ends at the next local midnight, placed
# as the reports' edges are.
_CLOSED_BEFORE = text("""
SELECT CASE WHEN isfinite(r.edge) THEN
    d - CAST(CAST(d AS timestamp) AT TIME ZONE :tz > r.edge AS integer) END
FROM review_queue_resolved_rollup r
CROSS JOIN LATERAL (SELECT CAST(r.edge AT TIME ZONE :tz AS date) AS d) AS local
""")
_MOVE = text(
    "UPDATE review_queue_throughput_rollup SET time_zone = :tz, through = :through, rolled_at = now()"
)
# Days kept by the release before the backlog's split by currency (2026_12_07_0110): their split is
# not known, so the next round starts over (the kept days are few: one row a day).
_KEPT_UNSPLIT = text("SELECT EXISTS (SELECT FROM review_queue_backlog_day WHERE by_currency IS NULL)")
_FORGET = (text("DELETE FROM review_queue_throughput_bucket"), text("DELETE FROM review_queue_backlog_day"))


@dataclass(frozen=True, slots=True)
class RolledDays:
    through: date | None  # every day and Monday week that ended by this day is kept
    caught_up: bool  # False: more closed days are waiting; run again


async def roll_up(conn: AsyncConnection, *, tz: str, days: int = ROLLUP_DAYS) -> RolledDays | None:
    """Keep up to `days` more closed days of the reports in `tz`, and the Monday weeks that end in
    them (starting over when the zone changed), in this transaction; None when another roll-up
    holds the state row."""
    state = (await conn.execute(_TAKE)).one_or_none()
    if state is None:
        return None
    through: date | None = state.through if state.time_zone == tz else None
    closed = await conn.scalar(_CLOSED_BEFORE, {"tz": tz})
    if closed is None:  # the RESOLVED rollup has not run: no day is known to be over
        await conn.execute(_MOVE, {"tz": tz, "through": None})
        return RolledDays(through=None, caught_up=True)
    if through is not None and through > closed:  # the edge went back (a restore, a hand edit)
        through = None
    if through is not None and await conn.scalar(_KEPT_UNSPLIT):
        through = None
    if through is None:
        for forget in _FORGET:
            await conn.execute(forget)
        through = await conn.scalar(_FIRST_DAY, {"tz": tz})
    if through is None or through > closed:  # nothing before the closed days: all empty
        through = closed
    upto = min(closed, through + timedelta(days=days))
    await workload.keep(conn, Period(through, upto, tz))
    await aging.keep(conn, Period(through, upto, tz))
    # The weeks that end in (through, upto]: from the Monday of `through`'s week (its days before
    # `through` are over, or hold nothing) to the last Monday a week before `upto`.
    monday = through - timedelta(days=through.weekday())
    await workload.keep(
        conn, Period(monday, monday + timedelta(weeks=max(0, (upto - monday).days // 7)), tz, 7)
    )
    await conn.execute(_MOVE, {"tz": tz, "through": upto})
    return RolledDays(through=upto, caught_up=upto >= closed)
