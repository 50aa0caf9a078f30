"""Queue health in a few indexed queries: depth, age of the oldest waiting item, leases in flight,
and the RESOLVED count from a rollup, so that no figure costs more as history grows."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Interval,
    ScalarSelect,
    and_,
    bindparam,
    extract,
    func,
    literal_column,
    select,
    text,
    true,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from db.queue import ASSIGNED, AWAITING_APPROVAL, PENDING, QUARANTINED, RESOLVED
from db.tables import review_queue_item as item
from db.tables import review_queue_resolved_rollup as rollup


@dataclass(frozen=True, slots=True)
class QueueGauges:
    pending: int
    assigned: int
    expired_unreclaimed: int  # lease_expires_at has passed, the row is still ASSIGNED
    reclaimable: int  # ... and the reclaim grace has passed too
    quarantined: int  # used up their attempts; wait for an admin's requeue
    oldest_pending_age_s: float | None
    overdue: int  # open (not RESOLVED) items past their due_at
    oldest_overdue_s: float | None  # how far past its due_at the most overdue open item is
    awaiting_approval: int = 0  # proposals in the approval queue, leased or not
    approval_leases: int = 0  # ... of which an approver holds the lease


def _count(*where: ColumnElement[bool]) -> ScalarSelect[int]:
    return select(func.count()).where(*where).scalar_subquery()


# Open items are the PENDING ones and the others that are not RESOLVED (leased, quarantined, and any
# open state added later); each part is read through its own partial index, written exactly as that
# index's predicate so that the planner can match it.
_OTHER_OPEN = item.c.state.not_in([PENDING, RESOLVED])  # ix_review_queue_item_open_due
_OPEN_PARTS = (item.c.state == PENDING, _OTHER_OPEN)
_PAST_DUE = item.c.due_at < func.now()


def _earliest_due(part: ColumnElement[bool]) -> ScalarSelect[Any]:
    return select(func.min(item.c.due_at)).where(part, _PAST_DUE).scalar_subquery()


# One pass over the PENDING rows gives their count and the oldest: with count(*) beside it, min() is
# not answered from the (created_at, id) index, which would walk the resolved history first.
_pending = (
    select(func.count().label("n"), func.min(item.c.created_at).label("oldest"))
    .where(item.c.state == PENDING)
    .subquery("pending")
)

# Every subquery matches a partial index (pending rows, assigned rows, open rows by due_at), so the
# cost follows the live queue, not the resolved history.
_GAUGES = select(
    _pending.c.n.label("pending"),
    _count(item.c.state == ASSIGNED).label("assigned"),
    _count(item.c.state == QUARANTINED).label("quarantined"),
    # Each on its own partial index: the approval queue, and its leases.
    _count(item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_(None)).label("approval_queued"),
    _count(item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_not(None)).label("approval_leases"),
    _count(item.c.state == ASSIGNED, item.c.lease_expires_at < func.now()).label("expired"),
    _count(
        item.c.state == ASSIGNED,
        item.c.lease_expires_at < func.now() - bindparam("grace", type_=Interval),
    ).label("reclaimable"),
    extract("epoch", func.now() - _pending.c.oldest).label("oldest_pending_age_s"),
    (_count(item.c.state == PENDING, _PAST_DUE) + _count(_OTHER_OPEN, _PAST_DUE)).label("overdue"),
    extract("epoch", func.now() - func.least(*(_earliest_due(part) for part in _OPEN_PARTS))).label(
        "oldest_overdue_s"
    ),
).select_from(_pending)


async def queue_gauges(conn: AsyncConnection, *, grace: timedelta) -> QueueGauges:
    row = (await conn.execute(_GAUGES, {"grace": grace})).one()
    age, overdue_s = row.oldest_pending_age_s, row.oldest_overdue_s
    return QueueGauges(
        pending=row.pending,
        assigned=row.assigned,
        expired_unreclaimed=row.expired,
        reclaimable=row.reclaimable,
        quarantined=row.quarantined,
        oldest_pending_age_s=float(age) if age is not None else None,
        awaiting_approval=row.approval_queued + row.approval_leases,
        approval_leases=row.approval_leases,
        overdue=row.overdue,
        oldest_overdue_s=float(overdue_s) if overdue_s is not None else None,
    )


_BY_REVIEWER = (
    select(item.c.leased_by, func.count())
    .where(item.c.state == ASSIGNED)
    .group_by(item.c.leased_by)
    .order_by(func.count().desc(), item.c.leased_by)
)


async def open_leases_by_reviewer(conn: AsyncConnection) -> dict[str, int]:
    return {reviewer: count for reviewer, count in await conn.execute(_BY_REVIEWER)}


# By the database clock, as every lease decision: negative when a lease has already lapsed.
_NEXT_EXPIRY = select(extract("epoch", func.min(item.c.lease_expires_at) - func.now())).where(
    item.c.state == ASSIGNED
)


async def next_lease_expiry_in_s(conn: AsyncConnection) -> float | None:
    """Seconds until the soonest open lease expires; None when nothing is leased."""
    value = await conn.scalar(_NEXT_EXPIRY)
    return float(value) if value is not None else None


# Open items by age (now - created_at): [0, 1 d), [1 d, 3 d), [3 d, 7 d), [7 d, 30 d), 30 d and more.
AGING_BUCKETS = (("0-1d", 0, 1), ("1-3d", 1, 3), ("3-7d", 3, 7), ("7-30d", 7, 30), ("30d+", 30, None))


def _days_ago(days: int) -> ScalarSelect[Any]:
    # A subquery, so computed once per statement (an InitPlan): `now() - interval` in a row's filter
    # is calendar arithmetic in the session's zone, and was most of the cost per open item.
    return select(func.now() - literal_column(f"interval '{days} days'")).scalar_subquery()


def _in_bucket(created_at: ColumnElement[Any], lo: int, hi: int | None) -> list[ColumnElement[bool]]:
    return [
        *([created_at <= _days_ago(lo)] if lo else []),
        *([created_at > _days_ago(hi)] if hi is not None else []),
    ]


_open = union_all(
    *(select(item.c.created_at, item.c.ledger_entity, item.c.due_at).where(p) for p in _OPEN_PARTS)
)
_open_items = _open.subquery("open_items")

# The PENDING rows, the bulk of a large queue, by one range count per band on
# ix_review_queue_item_pending_created (index only); the other open rows (leased, quarantined,
# awaiting approval: bounded by the leases in flight) in one pass. 100,000 open items: 96 -> 29 ms.
_other_open = (
    select(
        *(
            func.count().filter(and_(true(), *_in_bucket(item.c.created_at, lo, hi))).label(name)
            for name, lo, hi in AGING_BUCKETS
        )
    )
    .where(_OTHER_OPEN)
    .subquery("other_open")
)
_AGING = select(
    *(
        (_count(item.c.state == PENDING, *_in_bucket(item.c.created_at, lo, hi)) + _other_open.c[name]).label(
            name
        )
        for name, lo, hi in AGING_BUCKETS
    )
)

OVERDUE_ENTITIES = 20  # /stats lists the ledger entities with the most overdue items, this many
_OVERDUE_BY_ENTITY = (
    select(_open_items.c.ledger_entity, func.count())
    .where(_open_items.c.due_at < func.now())
    .group_by(_open_items.c.ledger_entity)
    .order_by(func.count().desc(), _open_items.c.ledger_entity)
    .limit(OVERDUE_ENTITIES)
)


async def aging(conn: AsyncConnection) -> dict[str, int]:
    """Open items by age, in AGING_BUCKETS order."""
    row = (await conn.execute(_AGING)).one()
    return {name: int(count) for (name, _, _), count in zip(AGING_BUCKETS, row, strict=True)}


async def overdue_by_ledger_entity(conn: AsyncConnection) -> dict[str, int]:
    """Overdue open items per ledger entity: the OVERDUE_ENTITIES with most, most first."""
    return {entity: count for entity, count in await conn.execute(_OVERDUE_BY_ENTITY)}


# ---------------------------------------------------------------------------------------------
# The RESOLVED count: a rollup, the resolutions since its edge, and the reopenings since its count
# ---------------------------------------------------------------------------------------------
#
# count(*) of the RESOLVED rows grows with history. The one row of review_queue_resolved_rollup holds
# `resolved`: the items RESOLVED with resolved_at < `edge` as of the snapshot `counted_in`. Now, the
# RESOLVED items are exactly
#   those counted there                   (rolled-up resolutions still standing)
# + those with resolved_at >= edge        (resolved since; ix_review_queue_item_resolved_at)
# + those with no resolved_at             (rows written by hand; the service always sets it)
# - the reopenings `counted_in` did not see that took back a resolution from before `edge`
#   (ix_review_queue_event_reopened_xid, from the snapshot's xmin: the few since the last roll-up).
# A reopened item resolved again has a resolved_at after its reopening, so after `edge`: counted once.
# This holds as long as no resolution from before `edge` commits after `counted_in` was taken,
# which roll_up_resolved guarantees (see there). Exact, in any transaction, whenever the roll-up ran.
_SINCE_COUNTED = """(SELECT count(*) FROM review_queue_event e
    WHERE e.event = 'REOPENED' AND e.xid >= pg_snapshot_xmin(r.counted_in)
      AND NOT pg_visible_in_snapshot(e.xid, r.counted_in)
      AND CAST(e.details ->> 'previous_resolved_at' AS timestamptz) < r.edge)"""
_RESOLVED = text(f"""
SELECT r.resolved
       + (SELECT count(*) FROM review_queue_item i WHERE i.state = 'RESOLVED' AND i.resolved_at >= r.edge)
       + (SELECT count(*) FROM review_queue_item i WHERE i.state = 'RESOLVED' AND i.resolved_at IS NULL)
       - {_SINCE_COUNTED}
FROM review_queue_resolved_rollup r
""")
_RESOLVED_ALL = select(func.count()).where(item.c.state == RESOLVED)


async def resolved_count(conn: AsyncConnection) -> int:
    """Items in state RESOLVED, exactly, at a cost that follows the recent resolutions, not history."""
    count = await conn.scalar(_RESOLVED)
    if count is None:  # no rollup row (the migration writes it; nobody may delete it): count them all
        count = await conn.scalar(_RESOLVED_ALL)
    return int(count or 0)


# Resolutions are folded in until this long before now (a completion's resolved_at is the start of
# its transaction, which commits later), and never past the start of a transaction still running
# (of this role: pg_stat_activity shows other roles' start times only to the privileged), so a
# resolution from before the edge cannot commit after the count. A run folds in at most a week.
ROLLUP_MARGIN = timedelta(minutes=5)
ROLLUP_STEP = timedelta(days=7)

_TAKE = select(rollup.c.one).with_for_update(skip_locked=True)
# pg_stat_activity is read once per transaction (a copy kept until its end) and here before the
# UPDATE's snapshot is taken: a transaction that began before the edge is either seen running here
# (the edge stays before its start) or had committed before the UPDATE's snapshot (it is counted).
_NEXT_EDGE = text("""
WITH target AS (
    SELECT least(now() - :margin, (SELECT min(xact_start) FROM pg_stat_activity)) AS at
)
SELECT greatest(r.edge, least(target.at, greatest(r.edge, coalesce(
           (SELECT min(resolved_at) FROM review_queue_item
            WHERE state = 'RESOLVED' AND resolved_at >= r.edge), target.at)) + :step)),
       target.at
FROM review_queue_resolved_rollup r, target
""").bindparams(bindparam("margin", type_=Interval), bindparam("step", type_=Interval))
# One statement, so the snapshot it records is the one it counted under (pg_current_snapshot() is
# the statement's): the resolutions between the old edge and the new one, less the reopenings the
# old count had not seen of resolutions before the old edge.
_FOLD = text(f"""
UPDATE review_queue_resolved_rollup r
SET resolved = r.resolved
        + (SELECT count(*) FROM review_queue_item i
           WHERE i.state = 'RESOLVED' AND i.resolved_at >= r.edge AND i.resolved_at < :edge)
        - {_SINCE_COUNTED},
    edge = :edge, counted_in = pg_current_snapshot(), rolled_at = now()
RETURNING r.resolved
""")


@dataclass(frozen=True, slots=True)
class RolledUp:
    edge: datetime
    resolved: int  # RESOLVED items with resolved_at before the edge, as of the roll-up
    caught_up: bool  # False: the edge stopped a step short of where it may go; run again


async def roll_up_resolved(
    conn: AsyncConnection, *, margin: timedelta = ROLLUP_MARGIN, step: timedelta = ROLLUP_STEP
) -> RolledUp | None:
    """Move the RESOLVED rollup forward (in this transaction, which must be fresh: READ COMMITTED,
    and nothing read from pg_stat_activity yet); None when another roll-up holds the row."""
    if await conn.scalar(_TAKE) is None:
        return None
    new_edge, target = (await conn.execute(_NEXT_EDGE, {"margin": margin, "step": step})).one()
    resolved = await conn.scalar(_FOLD, {"edge": new_edge})
    return RolledUp(edge=new_edge, resolved=int(resolved or 0), caught_up=new_edge >= target)
