"""The item as a row: its states, its columns, the guards and the event CTEs every statement shares."""

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.selectable import CTE

from db.notify import CHANNEL
from db.tables import review_queue_event as event
from db.tables import review_queue_item as item
from db.unit import Record

# Inline constants, not bind parameters: the planner can only match the partial indexes
# (WHERE state = 'PENDING' ...) against a literal it can see in every plan.
PENDING, ASSIGNED, RESOLVED, QUARANTINED, AWAITING_APPROVAL = (
    literal_column(f"'{s}'", Text)
    for s in ("PENDING", "ASSIGNED", "RESOLVED", "QUARANTINED", "AWAITING_APPROVAL")
)

Queue = Literal["review", "approval"]


@dataclass(frozen=True, slots=True)
class Item:
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    currency: str  # ISO 4217; variance_amount has at most its minor units
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
    lease_epoch: int
    lease_nonce: UUID | None
    attempts: int
    context: dict[str, Any] | None
    prepared_by: str | None
    prepared_at: datetime | None
    proposed_resolution: str | None
    proposed_note: str | None
    approved_by: str | None
    approved_at: datetime | None
    due_at: datetime
    revised_epoch: int | None

    @property
    def revised_during_lease(self) -> bool:
        """A source revision moved this lease on (and nothing has leased or reassigned it since)."""
        return self.state == "ASSIGNED" and self.revised_epoch == self.lease_epoch


_ITEM_FIELDS = [f.name for f in dataclasses.fields(Item)]
_ITEM_COLUMNS = [item.c[name] for name in _ITEM_FIELDS]


def _item(row: Record) -> Item:
    return Item(**{name: row[name] for name in _ITEM_FIELDS})


def _first(rows: list[Record]) -> Record | None:
    return rows[0] if rows else None


def _scalar(rows: list[Record]) -> Any:
    """The first column of the only row."""
    (row,) = rows
    return next(iter(row.values()))


# What an event keeps of its item (issue 42): every column a statement can change, as it stands right
# after the statement that writes the event, so that the feed and the webhooks say what happened
# then, not what is true now. The columns no statement changes after the enqueue (id,
# idempotency_key, ledger_entity, trace_id, created_at, context, due_at) are not copied into every
# event: they are read from the item's row, where they are the same. The lease's token is never
# kept. Written by the event's own INSERT from the UPDATE's RETURNING, so it is exact and costs no
# read; not part of the hash chain (db/chain.py encodes only the event's own fields), like leased_at.
# A jsonb array in this order, not an object: the keys would double its size on every event (274
# bytes against 567 for a resolved item); a column added later goes at the end, and an older,
# shorter array reads it as null.
AFTER_FIELDS = (
    "state", "variance_amount", "currency", "match_decision", "source_hash", "leased_by", "leased_at",
    "lease_expires_at", "resolution", "resolution_note", "resolved_by", "resolved_at", "attempts",
    "prepared_by", "prepared_at", "proposed_resolution", "proposed_note", "approved_by", "approved_at",
)  # fmt: skip


def item_after(row: Any) -> ColumnElement[Any]:
    """The jsonb array an event keeps of its item, from `row`'s columns (a CTE's, or the item
    table's), in AFTER_FIELDS order."""
    # The amount as text: a JSON number would be read back as a float.
    return func.jsonb_build_array(
        *[cast(row[name], Text) if name == "variance_amount" else row[name] for name in AFTER_FIELDS]
    )


def _logged(
    changed: CTE,
    name: str,
    *,
    details: ColumnElement[Any] | None = None,
    where: ColumnElement[bool] | None = None,
) -> CTE:
    """A CTE inserting one `name` event per row of `changed` (matching `where`), by :actor."""
    rows = select(
        changed.c.id,
        literal_column(f"'{name}'", Text),
        bindparam("actor", type_=Text),
        changed.c.lease_epoch,
        changed.c.trace_id,
        details if details is not None else func.jsonb_build_object(),
        item_after(changed.c),
    )
    if where is not None:
        rows = rows.where(where)
    return (
        insert(event)
        .from_select(["item_id", "event", "actor", "lease_epoch", "trace_id", "details", "item_after"], rows)
        .returning(event.c.item_id)
        .cte(f"logged_{name.lower()}")
    )


def _changed_items(changed: CTE, name: str, *, details: ColumnElement[Any] | None = None) -> Any:
    """SELECT the changed rows, with the event insert attached to the same statement."""
    return select(*[changed.c[n] for n in _ITEM_FIELDS]).add_cte(_logged(changed, name, details=details))


def _logged_then_quarantined(changed: CTE, name: str, *, details: ColumnElement[Any]) -> tuple[CTE, CTE]:
    """The `name` event of every row of a release or reclaim, then a QUARANTINED event for the rows
    it quarantined. The second insert reads the first one's RETURNING, so PostgreSQL runs the first
    before it and the trail reads RELEASED (or RECLAIMED), then QUARANTINED."""
    logged = _logged(changed, name, details=details)
    quarantined = _logged(
        changed,
        "QUARANTINED",
        details=func.jsonb_build_object("attempts", changed.c.attempts),
        where=and_(changed.c.state == QUARANTINED, changed.c.id.in_(select(logged.c.item_id))),
    )
    return logged, quarantined


def _announced(changed: CTE, leasable: ColumnElement[bool], name: str) -> CTE:
    """NOTIFY, at the COMMIT, that items may be leasable when one of the `changed` rows is: once per
    statement (PostgreSQL folds a transaction's identical notifications into one; db/notify.py).
    pg_notify is volatile, so this CTE is evaluated once, and only where it is read: join the
    changed rows to its one row (an aggregate without GROUP BY always has exactly one)."""
    return select(func.count(func.pg_notify(CHANNEL, "")).label("announced")).where(leasable).cte(name)


def _not_prepared_by(name: str) -> ColumnElement[bool]:
    """Segregation of duties in SQL: the item's preparer is not the identity bound as `name`,
    compared case-folded like the CHECKs (`CaseyX` is `caseyx`)."""
    return func.lower(item.c.prepared_by) != func.lower(bindparam(name, type_=Text))


# A release or reclaim of an item that has used up its attempts quarantines it: a poison item
# that crashes every handler stops circulating instead of being leased again in a tight loop.
_BACK_TO_QUEUE = case(
    (item.c.attempts >= bindparam("max_attempts", type_=Integer), QUARANTINED), else_=PENDING
)


# The item and the lease a holder-only statement names: binds, unless the statement reads them from
# columns (the completion's entries). (Bind names must not equal column names: SQLAlchemy would add
# such a name to the UPDATE's SET clause.)
_ITEM_ID: BindParameter[Any] = bindparam("item_id")
_FENCE_NONCE: BindParameter[Any] = bindparam("fence_nonce", type_=PG_UUID(as_uuid=True))


def _held_by_caller(
    *states: ColumnElement[Any],
    item_id: ColumnElement[Any] = _ITEM_ID,
    fence_nonce: ColumnElement[Any] = _FENCE_NONCE,
) -> list[ColumnElement[bool]]:
    # The lease guard of every holder-only statement. An expired lease not yet reclaimed still
    # counts as held. With a lease_token, its nonce must match the current lease's: that is what
    # tells a stale tab apart from the same reviewer's newer lease of the same item.
    return [
        item.c.id == item_id,
        # ASSIGNED: a review lease; AWAITING_APPROVAL (with leased_by): an approval lease.
        item.c.state.in_(states or [ASSIGNED]),
        item.c.leased_by == bindparam("actor", type_=Text),
        item.c.lease_nonce == func.coalesce(fence_nonce, item.c.lease_nonce),
    ]


_BY_ID = select(*_ITEM_COLUMNS).where(item.c.id == bindparam("item_id"))
