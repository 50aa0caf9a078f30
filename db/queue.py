"""The queue's statements: enqueue, lease, complete, reclaim, read.

Each state change is ONE statement. A lease or reclaim that first SELECTs and then UPDATEs
from the application reopens the window in which two workers take the same row (the
seed's DOUBLE_LEASE); here the row lock, the guard and the write are one round trip.
Functions take the connection first and never commit: the caller owns the transaction.
"""

import dataclasses
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Literal
from uuid import UUID

from sqlalchemy import Interval, Row, bindparam, func, select
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection

from db.tables import review_queue_item as item

# The seed's logger and event names; each state change is logged here, beside the statement
# that made it, so the API and the reclaimer log it identically.
log = logging.getLogger("reconciliation.review_queue.lease")


def _fields(row: "Item | Reclaimed") -> dict[str, str]:
    return {
        "trace_id": str(row.trace_id),
        "source_hash": row.source_hash,
        "match_decision": row.match_decision,
        "item_id": str(row.id),
    }


@dataclass(frozen=True, slots=True)
class Item:
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    match_decision: str
    state: str
    leased_by: str | None
    leased_at: datetime | None
    lease_expires_at: datetime | None
    trace_id: UUID
    source_hash: str
    created_at: datetime
    resolution: str | None
    resolution_note: str | None
    resolved_by: str | None
    resolved_at: datetime | None


_ITEM_COLUMNS = [item.c[f.name] for f in dataclasses.fields(Item)]


def _item(row: Row) -> Item:  # type: ignore[type-arg]
    return Item(*row)


@dataclass(frozen=True, slots=True)
class NewItem:
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    match_decision: str
    source_hash: str
    trace_id: UUID | None = None

    def matches(self, existing: Item) -> bool:
        """Same payload as a stored item? A retry that omits trace_id matches any trace_id."""
        return (
            self.ledger_entity == existing.ledger_entity
            and self.variance_amount == existing.variance_amount
            and self.match_decision == existing.match_decision
            and self.source_hash == existing.source_hash
            and (self.trace_id is None or self.trace_id == existing.trace_id)
        )


EnqueueOutcome = Literal["created", "existing", "conflict"]

# ON CONFLICT DO NOTHING makes a concurrent duplicate wait for the first insert and then
# insert nothing, instead of failing with a unique violation.
_ENQUEUE = (
    insert(item)
    .values(
        idempotency_key=bindparam("idempotency_key"),
        ledger_entity=bindparam("ledger_entity"),
        variance_amount=bindparam("variance_amount"),
        match_decision=bindparam("match_decision"),
        source_hash=bindparam("source_hash"),
        trace_id=func.coalesce(bindparam("trace_id", type_=PG_UUID(as_uuid=True)), func.gen_random_uuid()),
    )
    .on_conflict_do_nothing(index_elements=[item.c.idempotency_key])
    .returning(*_ITEM_COLUMNS)
)

_BY_KEY = select(*_ITEM_COLUMNS).where(item.c.idempotency_key == bindparam("idempotency_key"))


async def enqueue_item(conn: AsyncConnection, *, new: NewItem) -> tuple[EnqueueOutcome, Item]:
    row = (await conn.execute(_ENQUEUE, dataclasses.asdict(new))).first()
    if row is not None:
        return "created", _item(row)
    existing = _item((await conn.execute(_BY_KEY, {"idempotency_key": new.idempotency_key})).one())
    return ("existing" if new.matches(existing) else "conflict"), existing


# The seed's lease: lock up to batch_size PENDING rows, oldest first, skipping rows another
# transaction holds, and stamp them in the same statement.
_candidate = (
    select(item.c.id)
    .where(item.c.state == "PENDING")
    .order_by(item.c.created_at)
    .limit(bindparam("batch_size"))
    .with_for_update(skip_locked=True)
    .cte("candidate")
)
_LEASE = (
    item.update()
    .where(item.c.id == _candidate.c.id)
    .values(
        state="ASSIGNED",
        leased_by=bindparam("reviewer"),
        leased_at=func.now(),
        lease_expires_at=func.now() + bindparam("lease_duration", type_=Interval),
    )
    .returning(*_ITEM_COLUMNS)
)


async def lease_items(
    conn: AsyncConnection, *, reviewer: str, batch_size: int, lease_duration: timedelta
) -> list[Item]:
    result = await conn.execute(
        _LEASE,
        {"reviewer": reviewer, "batch_size": batch_size, "lease_duration": lease_duration},
    )
    # RETURNING has no order; callers get the queue order.
    items = sorted((_item(r) for r in result), key=lambda i: (i.created_at, i.id))
    for leased in items:
        log.info("review_item_leased", extra={**_fields(leased), "worker_id": reviewer})
    return items


CompleteOutcome = Literal[
    "resolved", "already_resolved", "resolution_conflict", "lease_not_held", "not_found"
]

# Guarded by holder and state in the one UPDATE: a late completion from a worker whose
# lease was reclaimed (and maybe re-leased) matches zero rows instead of resolving it.
# An expired lease that has not been reclaimed yet still counts as held.
_COMPLETE = (
    item.update()
    .where(
        item.c.id == bindparam("item_id"),
        item.c.state == "ASSIGNED",
        item.c.leased_by == bindparam("reviewer"),
    )
    .values(
        state="RESOLVED",
        resolution=bindparam("resolution"),
        resolution_note=bindparam("note"),
        resolved_by=bindparam("reviewer"),
        resolved_at=func.now(),
    )
    .returning(*_ITEM_COLUMNS)
)

_BY_ID = select(*_ITEM_COLUMNS).where(item.c.id == bindparam("item_id"))


async def complete_item(
    conn: AsyncConnection, *, item_id: UUID, reviewer: str, resolution: str, note: str | None
) -> tuple[CompleteOutcome, Item | None]:
    params = {"item_id": item_id, "reviewer": reviewer, "resolution": resolution, "note": note}
    row = (await conn.execute(_COMPLETE, params)).first()
    if row is not None:
        resolved = _item(row)
        log.info(
            "review_item_resolved",
            extra={
                **_fields(resolved),
                "worker_id": reviewer,
                "idempotency_key": resolved.idempotency_key,
                "resolution": resolution,
                "resolved_at": resolved.resolved_at.isoformat() if resolved.resolved_at else None,
            },
        )
        return "resolved", resolved
    # Nothing changed; read the row only to tell the caller why.
    current = await get_item(conn, item_id=item_id)
    if current is None:
        return "not_found", None
    outcome: CompleteOutcome = "lease_not_held"
    if current.state == "RESOLVED" and current.resolved_by == reviewer:
        outcome = "already_resolved" if current.resolution == resolution else "resolution_conflict"
    log.info(
        "review_item_completion_noop", extra={**_fields(current), "worker_id": reviewer, "reason": outcome}
    )
    return outcome, current


@dataclass(frozen=True, slots=True)
class Reclaimed:
    id: UUID
    trace_id: UUID
    source_hash: str
    match_decision: str


# Same shape and discipline as the lease: a row some transaction holds (a completion in
# flight) is skipped this round rather than waited for.
_expired = (
    select(item.c.id, item.c.lease_expires_at)
    .where(
        item.c.state == "ASSIGNED",
        item.c.lease_expires_at < func.now() - bindparam("grace", type_=Interval),
    )
    .order_by(item.c.lease_expires_at)
    .limit(bindparam("reclaim_batch"))
    .with_for_update(skip_locked=True)
    .cte("expired")
)
_RECLAIM = (
    item.update()
    .where(item.c.id == _expired.c.id)
    .values(state="PENDING", leased_by=None, leased_at=None, lease_expires_at=None)
    .returning(
        item.c.id,
        item.c.trace_id,
        item.c.source_hash,
        item.c.match_decision,
        _expired.c.lease_expires_at,
    )
)


async def reclaim_expired(conn: AsyncConnection, *, reclaim_batch: int, grace: timedelta) -> list[Reclaimed]:
    result = await conn.execute(_RECLAIM, {"reclaim_batch": reclaim_batch, "grace": grace})
    rows = sorted(result, key=lambda r: r.lease_expires_at)  # oldest expiry first
    reclaimed = [Reclaimed(r.id, r.trace_id, r.source_hash, r.match_decision) for r in rows]
    for row in reclaimed:
        log.warning("review_item_lease_reclaimed", extra=_fields(row))
    return reclaimed


async def get_item(conn: AsyncConnection, *, item_id: UUID) -> Item | None:
    row = (await conn.execute(_BY_ID, {"item_id": item_id})).first()
    return _item(row) if row is not None else None
