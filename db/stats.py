"""Queue health in a few indexed queries: depth, age of the oldest waiting item, leases in flight."""

from dataclasses import dataclass
from datetime import timedelta
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
    true,
    union_all,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from db.queue import ASSIGNED, AWAITING_APPROVAL, PENDING, QUARANTINED, RESOLVED
from db.tables import review_queue_item as item


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


_RESOLVED = select(func.count()).where(item.c.state == RESOLVED)
_BY_REVIEWER = (
    select(item.c.leased_by, func.count())
    .where(item.c.state == ASSIGNED)
    .group_by(item.c.leased_by)
    .order_by(func.count().desc(), item.c.leased_by)
)


async def resolved_count(conn: AsyncConnection) -> int:
    return int(await conn.scalar(_RESOLVED) or 0)


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


def _days_ago(days: int) -> ColumnElement[Any]:
    return func.now() - literal_column(f"interval '{days} days'")


def _in_bucket(created_at: ColumnElement[Any], lo: int, hi: int | None) -> list[ColumnElement[bool]]:
    return [
        *([created_at <= _days_ago(lo)] if lo else []),
        *([created_at > _days_ago(hi)] if hi is not None else []),
    ]


_open = union_all(
    *(select(item.c.created_at, item.c.ledger_entity, item.c.due_at).where(p) for p in _OPEN_PARTS)
)
_open_items = _open.subquery("open_items")

_AGING = select(
    *(
        func.count().filter(and_(true(), *_in_bucket(_open_items.c.created_at, lo, hi))).label(name)
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
