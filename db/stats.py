"""Queue health in a few indexed queries: depth, age of the oldest waiting item, leases in flight."""

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import ColumnElement, Interval, ScalarSelect, bindparam, extract, func, select
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
    awaiting_approval: int = 0  # proposals in the approval queue, leased or not
    approval_leases: int = 0  # ... of which an approver holds the lease


def _count(*where: ColumnElement[bool]) -> ScalarSelect[int]:
    return select(func.count()).where(*where).scalar_subquery()


# Every subquery matches a partial index (pending rows, assigned rows), so the cost follows the
# live queue, not the resolved history.
_GAUGES = select(
    _count(item.c.state == PENDING).label("pending"),
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
    select(extract("epoch", func.now() - func.min(item.c.created_at)))
    .where(item.c.state == PENDING)
    .scalar_subquery()
    .label("oldest_pending_age_s"),
)


async def queue_gauges(conn: AsyncConnection, *, grace: timedelta) -> QueueGauges:
    row = (await conn.execute(_GAUGES, {"grace": grace})).one()
    age = row.oldest_pending_age_s
    return QueueGauges(
        pending=row.pending,
        assigned=row.assigned,
        expired_unreclaimed=row.expired,
        reclaimable=row.reclaimable,
        quarantined=row.quarantined,
        oldest_pending_age_s=float(age) if age is not None else None,
        awaiting_approval=row.approval_queued + row.approval_leases,
        approval_leases=row.approval_leases,
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
