"""The queue's statements: enqueue, lease, renew, release, complete, reclaim, read.

Each state change is ONE statement. A lease or reclaim that first SELECTs and then UPDATEs
from the application reopens the window in which two workers take the same row (the
seed's DOUBLE_LEASE); here the row lock, the guard, the write and its audit event are one
round trip. A data-modifying CTE inserts the event from the UPDATE's RETURNING, so a state
change without its event, or an event without its change, cannot exist.

Functions take the connection first and never commit: the caller owns the transaction.
"""

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

import psycopg
from sqlalchemy import (
    BigInteger,
    ColumnElement,
    DateTime,
    Integer,
    Interval,
    Numeric,
    Row,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    literal_column,
    null,
    or_,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.sql import visitors
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.sql.selectable import CTE

from db import telemetry
from db.catalogue import approval_threshold
from db.engine import OneRoundTrip, Record
from db.errors import DatabaseUnavailable, is_lock_timeout
from db.notify import CHANNEL, notify_work
from db.tables import DEFAULT_MAX_ATTEMPTS, api_token
from db.tables import resolution_code as catalogue
from db.tables import review_queue_event as event
from db.tables import review_queue_item as item
from db.tokens import fold_subject, same_identity

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


def _item(row: Row[Any] | Record) -> Item:
    return Item(**{name: row._mapping[name] for name in _ITEM_FIELDS})


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
    )
    if where is not None:
        rows = rows.where(where)
    return (
        insert(event)
        .from_select(["item_id", "event", "actor", "lease_epoch", "trace_id", "details"], rows)
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


# --- enqueue ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewItem:
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    match_decision: str
    source_hash: str
    trace_id: UUID | None = None
    context: dict[str, Any] | None = None
    due_at: datetime | None = None  # None: created_at + sla_hours
    sla_hours: int = 168  # the SLA tier of the amount (api.settings.sla_hours)

    def matches(self, existing: Item) -> bool:
        """Same payload as a stored item? A retry that omits trace_id matches any trace_id, and one
        that omits due_at any due_at (a derived deadline depends on when the item first came and on
        the policy then, neither of which the sender chose); the context is part of the payload
        (none and none match)."""
        return (
            self.ledger_entity == existing.ledger_entity
            and self.variance_amount == existing.variance_amount
            and self.match_decision == existing.match_decision
            and self.source_hash == existing.source_hash
            and (self.trace_id is None or self.trace_id == existing.trace_id)
            and (self.due_at is None or self.due_at == existing.due_at)
            and self.context == existing.context
        )


EnqueueOutcome = Literal["created", "existing", "conflict"]

# ON CONFLICT DO NOTHING makes a concurrent duplicate wait for the first insert and then
# insert nothing, instead of failing with a unique violation. Rows go in in key order so
# two overlapping batches lock keys in the same order and cannot deadlock.
_batch = (
    func.unnest(
        bindparam("idempotency_keys", type_=ARRAY(Text)),
        bindparam("ledger_entities", type_=ARRAY(Text)),
        bindparam("variance_amounts", type_=ARRAY(Numeric(18, 2))),
        bindparam("match_decisions", type_=ARRAY(Text)),
        bindparam("source_hashes", type_=ARRAY(Text)),
        bindparam("trace_ids", type_=ARRAY(PG_UUID(as_uuid=True))),
        bindparam("positions", type_=ARRAY(BigInteger)),
        # JSON text, cast below: a text[] binds without a JSON serializer per element.
        bindparam("contexts", type_=ARRAY(Text)),
        bindparam("due_ats", type_=ARRAY(DateTime(timezone=True))),
        bindparam("sla_hours", type_=ARRAY(Integer)),
    )
    .table_valued("k", "e", "a", "d", "h", "t", "p", "c", "due", "sla")
    .render_derived()
)
# One transaction shares one now(); a microsecond per position keeps a batch in request order in
# the queue.
_created_at = func.now() + _batch.c.p * literal_column("interval '1 microsecond'")
_inserted = (
    insert(item)
    .from_select(
        [
            "idempotency_key",
            "ledger_entity",
            "variance_amount",
            "match_decision",
            "source_hash",
            "trace_id",
            "created_at",
            "context",
            "due_at",
        ],
        select(
            _batch.c.k,
            _batch.c.e,
            _batch.c.a,
            _batch.c.d,
            _batch.c.h,
            func.coalesce(_batch.c.t, func.gen_random_uuid()),
            _created_at,
            cast(_batch.c.c, JSONB),
            # The database's clock, like every other time here (the SLA tier is chosen in Python).
            func.coalesce(_batch.c.due, _created_at + func.make_interval(0, 0, 0, 0, _batch.c.sla)),
        ).order_by(_batch.c.k),
    )
    .on_conflict_do_nothing(index_elements=[item.c.idempotency_key])
    .returning(*_ITEM_COLUMNS)
    .cte("inserted")
)
_ENQUEUE = _changed_items(_inserted, "ENQUEUED")
_BY_KEYS = select(*_ITEM_COLUMNS).where(
    item.c.idempotency_key == func.any(bindparam("idempotency_keys", type_=ARRAY(Text)))
)


async def enqueue_items(
    conn: AsyncConnection, *, new: Sequence[NewItem], actor: str
) -> list[tuple[EnqueueOutcome, Item]]:
    """Insert the new keys in one statement; answer per input, in input order."""
    first: dict[str, int] = {}
    for position, candidate in enumerate(new):
        first.setdefault(candidate.idempotency_key, position)
    unique = [new[p] for p in first.values()]
    params = {
        "idempotency_keys": [n.idempotency_key for n in unique],
        "ledger_entities": [n.ledger_entity for n in unique],
        "variance_amounts": [n.variance_amount for n in unique],
        "match_decisions": [n.match_decision for n in unique],
        "source_hashes": [n.source_hash for n in unique],
        "trace_ids": [n.trace_id for n in unique],
        "positions": list(first.values()),
        "contexts": [None if n.context is None else json.dumps(n.context) for n in unique],
        "due_ats": [n.due_at for n in unique],
        "sla_hours": [n.sla_hours for n in unique],
        "actor": actor,
    }
    created = {i.idempotency_key: i for i in map(_item, await conn.execute(_ENQUEUE, params))}
    if created:
        await notify_work(conn)  # once for the whole batch, delivered at commit
    telemetry.enqueued(len(created))
    missing = [k for k in first if k not in created]
    stored = dict(created)
    if missing:
        rows = await conn.execute(_BY_KEYS, {"idempotency_keys": missing})
        stored.update((i.idempotency_key, i) for i in map(_item, rows))
    results: list[tuple[EnqueueOutcome, Item]] = []
    for position, candidate in enumerate(new):
        existing = stored[candidate.idempotency_key]
        if candidate.idempotency_key in created and first[candidate.idempotency_key] == position:
            results.append(("created", existing))
        else:
            results.append(("existing" if candidate.matches(existing) else "conflict", existing))
    return results


async def enqueue_item(conn: AsyncConnection, *, new: NewItem, actor: str) -> tuple[EnqueueOutcome, Item]:
    (result,) = await enqueue_items(conn, new=[new], actor=actor)
    return result


# --- lease ------------------------------------------------------------------------------

# Serialises one reviewer's concurrent lease calls (and nobody else's) so the cap below
# cannot be overshot: the count in the lease statement is taken after this lock is held.
_LOCK_REVIEWER = select(
    func.pg_advisory_xact_lock(
        func.hashtextextended("review_queue.lease:" + bindparam("actor", type_=Text), 0)
    )
)
# Review and approval leases together count against the cap (each on its partial index).
_held = (
    select(func.count())
    .where(item.c.state == ASSIGNED, item.c.leased_by == bindparam("actor", type_=Text))
    .scalar_subquery()
) + (
    select(func.count())
    .where(item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_not(None))
    .where(item.c.leased_by == bindparam("actor", type_=Text))
    .scalar_subquery()
)


def _lease_statement(*, approval: bool, by_entity: bool, by_id: bool) -> Any:
    """The seed's lease: lock up to batch_size leasable rows (of one ledger entity, by_entity; the
    one item named, by_id), earliest due_at first, then oldest, skipping rows another transaction
    holds, and stamp them in the same statement. Each variant reads its own partial index in exactly
    this order (by_id: the primary key).

    The review queue leases PENDING rows (ASSIGNED, one attempt more). The approval queue leases
    AWAITING_APPROVAL rows nobody holds, and the item stays AWAITING_APPROVAL while leased.
    Segregation of duties is part of its row lock's WHERE, so no prior read decides it: a
    preparer's own proposal is never a candidate for them, however the calls race (and the
    approval_lease_not_preparer CHECK would refuse the write if it were).

    The release cool-off is part of the same WHERE: a row the caller released less than
    REVIEW_QUEUE_RELEASE_COOLDOWN_S ago is no candidate for them (for everyone else it is, in its
    old place). It filters the rows the index scan reads, so the lease stays one ordered scan. A
    lease that names the item (by_id) is the caller's deliberate choice and takes it back."""
    prefix = "approval_" if approval else ""
    actor = bindparam("actor", type_=Text)
    unheld = [item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_(None)] if approval else []
    wanted = [*unheld, _not_prepared_by("actor")] if approval else [item.c.state == PENDING]
    if by_entity:
        wanted.append(item.c.ledger_entity == bindparam("entity", type_=Text))
    if by_id:
        wanted.append(item.c.id == bindparam("lease_item_id", type_=PG_UUID(as_uuid=True)))
    else:
        wanted.append(or_(item.c.released_by.is_distinct_from(actor), item.c.released_until <= func.now()))
    candidate = (
        select(item.c.id)
        .where(*wanted)
        .order_by(item.c.due_at, item.c.created_at)
        .limit(func.least(bindparam("batch_size"), func.greatest(bindparam("cap") - _held, 0)))
        .with_for_update(skip_locked=True)
        .cte(f"{prefix}candidate")
    )
    stamped: dict[str, Any] = {
        "leased_by": actor,
        "leased_at": func.now(),
        "lease_expires_at": func.now() + bindparam("lease_duration", type_=Interval),
        "lease_epoch": item.c.lease_epoch + 1,
        "lease_nonce": func.gen_random_uuid(),
    }
    if not approval:
        stamped |= {"state": ASSIGNED, "attempts": item.c.attempts + 1}
    leased = (
        item.update()
        .where(item.c.id == candidate.c.id, *unheld)
        .values(stamped)
        .returning(*_ITEM_COLUMNS)
        .cte(f"{prefix}leased")
    )
    details = func.jsonb_build_object(
        "lease_expires_at", leased.c.lease_expires_at, *(("queue", "approval") if approval else ())
    )
    return _changed_items(leased, "LEASED", details=details)


# Every variant, built once: (queue, one ledger entity, one named item) -> statement.
_LEASES = {
    (which, by_entity, by_id): _lease_statement(
        approval=which == "approval", by_entity=by_entity, by_id=by_id
    )
    for which in ("review", "approval")
    for by_entity in (False, True)
    for by_id in (False, True)
}
_LEASE = _LEASES["review", False, False]
_LEASE_ENTITY = _LEASES["review", True, False]
_LEASE_ITEM = _LEASES["review", False, True]
_LEASE_APPROVALS = _LEASES["approval", False, False]


def _reviewer_lock_timeout(reviewer: str) -> DatabaseUnavailable:
    return DatabaseUnavailable(
        f"lock timeout: another lease call of {reviewer!r} held the per-reviewer lock too long"
    )


async def _lock_reviewer(conn: AsyncConnection, reviewer: str) -> None:
    try:
        await conn.execute(_LOCK_REVIEWER, {"actor": reviewer})
    except DBAPIError as error:
        if is_lock_timeout(error):
            raise _reviewer_lock_timeout(reviewer) from error
        raise


async def lease_items(
    conn: AsyncConnection | OneRoundTrip,
    *,
    reviewer: str,
    batch_size: int,
    lease_duration: timedelta,
    cap: int,
    ledger_entity: str | None = None,
    queue: Queue = "review",
    item_id: UUID | None = None,
) -> list[Item]:
    """Lease up to batch_size items (of ledger_entity only, when given; only item_id, when given)
    to reviewer, never leaving them holding more than cap: PENDING items from the review queue, or
    other people's proposals from the approval queue. Items the reviewer released within the
    cool-off are skipped unless named by item_id."""
    params: dict[str, Any] = {
        "actor": reviewer,
        "batch_size": batch_size,
        "cap": cap,
        "lease_duration": lease_duration,
    }
    if ledger_entity is not None:
        params["entity"] = ledger_entity
    if item_id is not None:
        params["lease_item_id"] = item_id
    statement = _LEASES[queue, ledger_entity is not None, item_id is not None]
    if isinstance(conn, OneRoundTrip):
        try:
            _, rows = await conn.execute_all([(_LOCK_REVIEWER, {"actor": reviewer}), (statement, params)])
        except psycopg.errors.LockNotAvailable as error:
            if conn.failed_step == 0:
                raise _reviewer_lock_timeout(reviewer) from error
            raise
        result: Iterable[Row[Any] | Record] = rows
    else:
        await _lock_reviewer(conn, reviewer)
        result = await conn.execute(statement, params)
    # RETURNING has no order; callers get the queue order.
    items = sorted(map(_item, result), key=lambda i: (i.due_at, i.created_at, i.id))
    telemetry.leased(items, reviewer)
    return items


# --- holder-guarded changes: renew, release, complete ------------------------------------


def _held_by_caller(*states: ColumnElement[Any]) -> list[ColumnElement[bool]]:
    # The lease guard of every holder-only statement. (Bind names must not equal column names:
    # SQLAlchemy would add such a name to the UPDATE's SET clause.) An expired lease not yet reclaimed still
    # counts as held. With a lease_token, its nonce must match the current lease's: that is what
    # tells a stale tab apart from the same reviewer's newer lease of the same item.
    return [
        item.c.id == bindparam("item_id"),
        # ASSIGNED: a review lease; AWAITING_APPROVAL (with leased_by): an approval lease.
        item.c.state.in_(states or [ASSIGNED]),
        item.c.leased_by == bindparam("actor", type_=Text),
        item.c.lease_nonce
        == func.coalesce(bindparam("fence_nonce", type_=PG_UUID(as_uuid=True)), item.c.lease_nonce),
    ]


_renewed = (
    item.update()
    .where(*_held_by_caller(ASSIGNED, AWAITING_APPROVAL))
    .values(lease_expires_at=func.now() + bindparam("lease_duration", type_=Interval))
    .returning(*_ITEM_COLUMNS)
    .cte("renewed")
)
_RENEW = _changed_items(
    _renewed, "RENEWED", details=func.jsonb_build_object("lease_expires_at", _renewed.c.lease_expires_at)
)

_released = (
    item.update()
    .where(*_held_by_caller(ASSIGNED, AWAITING_APPROVAL))
    # created_at is kept, so a released item is first in line again; a released approval lease
    # goes back to the approval queue, never to PENDING.
    .values(
        state=case((item.c.state == AWAITING_APPROVAL, AWAITING_APPROVAL), else_=_BACK_TO_QUEUE),
        leased_by=None,
        leased_at=None,
        lease_expires_at=None,
        # The cool-off: the lease statement does not hand it back to this holder until then.
        released_by=bindparam("actor", type_=Text),
        released_until=func.now() + bindparam("cooloff", type_=Interval),
    )
    .returning(*_ITEM_COLUMNS)
    .cte("released")
)
# Back in its queue (PENDING, or the approval queue), it is leasable again: waiters hear of it.
_released_leasable = _announced(_released, _released.c.state != QUARANTINED, "released_leasable")
_RELEASE = (
    select(*[_released.c[n] for n in _ITEM_FIELDS])
    .select_from(_released.join(_released_leasable, true()))
    .add_cte(
        *_logged_then_quarantined(
            _released, "RELEASED", details=func.jsonb_build_object("reason", bindparam("reason", type_=Text))
        )
    )
)

# The catalogue entry the completion names, if it is active and its note rule is met: the
# completion's UPDATE joins the catalogue row itself (UPDATE ... FROM resolution_code), so a
# deactivation or a threshold change committed by an admin is either wholly before or wholly
# after it: never between a read and the write. No row: the UPDATE matches nothing and
# complete_items says why. (Plain binds in the UPDATE, not a CTE of its own, so that the batch
# completion's rewrite of the per-entry binds reaches them.)
_code_ok = [
    # Not "resolution": a bind named like a column would join the UPDATE's SET clause.
    catalogue.c.code == bindparam("chosen_code", type_=Text),
    catalogue.c.active,
    or_(
        ~catalogue.c.requires_note,
        func.length(func.btrim(func.coalesce(bindparam("note", type_=Text), ""))) > 0,
    ),
]
# At or above the code's threshold or materiality, whichever is lower (by absolute amount), the item
# needs an approver. Both are read by this statement (db/catalogue.py).
_threshold = approval_threshold(catalogue.c.approval_threshold)
_needs_approval = func.abs(item.c.variance_amount) >= _threshold


def _unless_approval(resolved: Any, submitted: Any) -> Any:
    return case((_needs_approval, submitted), else_=resolved)


def _saw_current_source() -> list[ColumnElement[bool]]:
    # Nobody decides on figures they have not seen. A completion carrying a source_hash must carry
    # the current one; once a revision moved the lease on, a completion must show it saw the new
    # figures: by the new lease_token (only the 409 SOURCE_CHANGED or a re-read hands it out) or
    # by the current source_hash.
    expected = bindparam("expected_source_hash", type_=Text)
    return [
        item.c.source_hash == func.coalesce(expected, item.c.source_hash),
        or_(
            cast(bindparam("fence_nonce", type_=PG_UUID(as_uuid=True)), PG_UUID(as_uuid=True)).is_not(None),
            cast(expected, Text).is_not(None),
            item.c.revised_epoch.is_distinct_from(item.c.lease_epoch),
        ),
    ]


# Guarded by holder, state and epoch in the one UPDATE: a late completion from a worker whose
# lease was reclaimed (and maybe re-leased) matches zero rows instead of resolving it. Above the
# threshold the same statement submits the proposal instead: AWAITING_APPROVAL, lease cleared, so
# it is in the approval queue the moment this commits.
_resolved = (
    item.update()
    .where(*_held_by_caller())
    .where(*_code_ok)  # joins the catalogue row: UPDATE ... FROM resolution_code
    .where(*_saw_current_source())
    .values(
        state=_unless_approval(RESOLVED, AWAITING_APPROVAL),
        resolution=_unless_approval(catalogue.c.code, item.c.resolution),
        resolution_note=_unless_approval(bindparam("note", type_=Text), item.c.resolution_note),
        resolved_by=_unless_approval(bindparam("actor", type_=Text), item.c.resolved_by),
        resolved_at=_unless_approval(func.now(), item.c.resolved_at),
        prepared_by=_unless_approval(None, bindparam("actor", type_=Text)),
        prepared_at=_unless_approval(None, func.now()),
        proposed_resolution=_unless_approval(None, catalogue.c.code),
        proposed_note=_unless_approval(None, bindparam("note", type_=Text)),
        approved_by=None,
        approved_at=None,
        leased_by=_unless_approval(item.c.leased_by, None),
        leased_at=_unless_approval(item.c.leased_at, None),
        lease_expires_at=_unless_approval(item.c.lease_expires_at, None),
    )
    .returning(*_ITEM_COLUMNS, _threshold.label("approval_threshold"))
    .cte("resolved")
)
_COMPLETE: Any = select(*[_resolved.c[n] for n in _ITEM_FIELDS]).add_cte(
    _logged(
        _resolved,
        "RESOLVED",
        details=func.jsonb_build_object(
            "resolution", _resolved.c.resolution, "note", _resolved.c.resolution_note
        ),
        where=_resolved.c.state == RESOLVED,
    ),
    _logged(
        _resolved,
        "SUBMITTED_FOR_APPROVAL",
        details=func.jsonb_build_object(
            "resolution",
            _resolved.c.proposed_resolution,
            "note",
            _resolved.c.proposed_note,
            "approval_threshold",
            _resolved.c.approval_threshold,
            "variance_amount",
            _resolved.c.variance_amount,
        ),
        where=_resolved.c.state == AWAITING_APPROVAL,
    ),
)

# Approve and reject: the holder of the approval lease, and never the preparer. The preparer
# guard is in the UPDATE's WHERE, so it holds whatever reached the row first.
_approved = (
    item.update()
    .where(*_held_by_caller(AWAITING_APPROVAL))
    .where(_not_prepared_by("actor"))
    .values(
        state=RESOLVED,
        resolution=item.c.proposed_resolution,
        resolution_note=item.c.proposed_note,
        resolved_by=item.c.prepared_by,
        resolved_at=func.now(),
        approved_by=bindparam("actor", type_=Text),
        approved_at=func.now(),
    )
    .returning(*_ITEM_COLUMNS)
    .cte("approved")
)
_APPROVE = _changed_items(
    _approved,
    "APPROVED",
    details=func.jsonb_build_object(
        "resolution",
        _approved.c.resolution,
        "note",
        _approved.c.resolution_note,
        "prepared_by",
        _approved.c.prepared_by,
    ),
)

# Back to PENDING in its old place (created_at is kept: first in line); the proposal stays on the
# row until the next completion, and the REJECTED event keeps it with the reason.
_rejected = (
    item.update()
    .where(*_held_by_caller(AWAITING_APPROVAL))
    .where(_not_prepared_by("actor"))
    .values(state=PENDING, leased_by=None, leased_at=None, lease_expires_at=None)
    .returning(*_ITEM_COLUMNS)
    .cte("rejected")
)
_REJECT = _changed_items(
    _rejected,
    "REJECTED",
    details=func.jsonb_build_object(
        "reason",
        bindparam("reason", type_=Text),
        "resolution",
        _rejected.c.proposed_resolution,
        "note",
        _rejected.c.proposed_note,
        "prepared_by",
        _rejected.c.prepared_by,
    ),
)

_BY_ID = select(*_ITEM_COLUMNS).where(item.c.id == bindparam("item_id"))

HolderOutcome = Literal["done", "lease_not_held", "not_found"]


async def _holder_change(
    conn: AsyncConnection | OneRoundTrip, statement: Any, params: dict[str, Any]
) -> tuple[HolderOutcome, Item | None]:
    """The holder's change, and when it changed nothing, the item as it is now (to say why)."""
    if isinstance(conn, OneRoundTrip):
        # The re-read goes in the same round trip, after the change: in READ COMMITTED it sees
        # the newest committed row, as the separate read below does.
        changed, now = await conn.execute_all([(statement, params), (_BY_ID, {"item_id": params["item_id"]})])
        if changed:
            return "done", _item(changed[0])
        return ("lease_not_held", _item(now[0])) if now else ("not_found", None)
    row = (await conn.execute(statement, params)).first()
    if row is not None:
        return "done", _item(row)
    current = await get_item(conn, item_id=params["item_id"])
    return ("not_found" if current is None else "lease_not_held"), current


async def renew_lease(
    conn: AsyncConnection | OneRoundTrip,
    *,
    item_id: UUID,
    reviewer: str,
    lease_nonce: UUID | None,
    lease_duration: timedelta,
) -> tuple[HolderOutcome, Item | None]:
    params = {
        "item_id": item_id,
        "actor": reviewer,
        "fence_nonce": lease_nonce,
        "lease_duration": lease_duration,
    }
    outcome, current = await _holder_change(conn, _RENEW, params)
    if outcome == "done" and current is not None:
        telemetry.renewed(current, reviewer)
    return outcome, current


async def release_lease(
    conn: AsyncConnection | OneRoundTrip,
    *,
    item_id: UUID,
    reviewer: str,
    lease_nonce: UUID | None,
    reason: str | None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    cooldown: timedelta = timedelta(0),
) -> tuple[HolderOutcome, Item | None]:
    """Hand the item back: PENDING in its place again, or QUARANTINED once its attempts are used up.
    The reviewer's own leases skip it for `cooldown` (unless they name it)."""
    params = {
        "item_id": item_id,
        "actor": reviewer,
        "fence_nonce": lease_nonce,
        "reason": reason,
        "max_attempts": max_attempts,
        "cooloff": cooldown,
    }
    outcome, current = await _holder_change(conn, _RELEASE, params)
    if outcome == "done" and current is not None:
        telemetry.released(current, reviewer, reason)
        if current.state == "QUARANTINED":
            telemetry.quarantined(current, reviewer)
    return outcome, current


_requeued = (
    item.update()
    .where(item.c.id == bindparam("item_id"), item.c.state == QUARANTINED)
    # In its old place (due_at and created_at are kept), with a fresh allowance of attempts.
    .values(state=PENDING, attempts=0)
    .returning(*_ITEM_COLUMNS)
    .cte("requeued")
)
_REQUEUE = _changed_items(
    _requeued, "REQUEUED", details=func.jsonb_build_object("reason", bindparam("reason", type_=Text))
)

RequeueOutcome = Literal["done", "not_quarantined", "not_found"]


async def requeue_item(
    conn: AsyncConnection, *, item_id: UUID, actor: str, reason: str
) -> tuple[RequeueOutcome, Item | None]:
    """Put a QUARANTINED item back in the queue (an admin decided it deserves more attempts)."""
    row = (await conn.execute(_REQUEUE, {"item_id": item_id, "actor": actor, "reason": reason})).first()
    if row is not None:
        requeued = _item(row)
        await notify_work(conn)  # leasable again
        telemetry.requeued(requeued, actor, reason)
        return "done", requeued
    current = await get_item(conn, item_id=item_id)
    return ("not_found" if current is None else "not_quarantined"), current


# Reopen is one statement: the CTE locks the RESOLVED row and keeps its decision, the UPDATE
# (guarded by state again) puts it back to PENDING, and the event it inserts carries the old
# decision, so the trail still says who decided what, and when, before the reopen.
_before_reopen = (
    select(
        item.c.id,
        item.c.resolution.label("previous_resolution"),
        item.c.resolution_note.label("previous_note"),
        item.c.resolved_by.label("previous_resolved_by"),
        item.c.resolved_at.label("previous_resolved_at"),
        item.c.approved_by.label("previous_approved_by"),
    )
    .where(item.c.id == bindparam("item_id"), item.c.state == RESOLVED)
    .with_for_update()
    .cte("before_reopen")
)
_reopened = (
    item.update()
    .where(item.c.id == _before_reopen.c.id, item.c.state == RESOLVED)
    # due_at and created_at are kept: the item is back in its old place, with a fresh allowance of attempts.
    .values(
        state=PENDING,
        resolution=None,
        resolution_note=None,
        resolved_by=None,
        resolved_at=None,
        approved_by=None,
        approved_at=None,
        leased_by=None,
        leased_at=None,
        lease_expires_at=None,
        lease_nonce=None,
        attempts=0,
    )
    .returning(
        *_ITEM_COLUMNS,
        _before_reopen.c.previous_resolution,
        _before_reopen.c.previous_note,
        _before_reopen.c.previous_resolved_by,
        _before_reopen.c.previous_resolved_at,
        _before_reopen.c.previous_approved_by,
    )
    .cte("reopened")
)
_REOPEN: Any = select(*[_reopened.c[n] for n in _ITEM_FIELDS], _reopened.c.previous_resolution).add_cte(
    _logged(
        _reopened,
        "REOPENED",
        details=func.jsonb_build_object(
            "reason",
            bindparam("reason", type_=Text),
            "previous_resolution",
            _reopened.c.previous_resolution,
            "previous_note",
            _reopened.c.previous_note,
            "previous_resolved_by",
            _reopened.c.previous_resolved_by,
            "previous_resolved_at",
            _reopened.c.previous_resolved_at,
            "previous_approved_by",
            _reopened.c.previous_approved_by,
        ),
    )
)

ReopenOutcome = Literal["done", "not_resolved", "not_found"]


async def reopen_item(
    conn: AsyncConnection, *, item_id: UUID, actor: str, reason: str
) -> tuple[ReopenOutcome, Item | None]:
    """Put a RESOLVED item back to PENDING (an admin decided the decision was wrong)."""
    row = (await conn.execute(_REOPEN, {"item_id": item_id, "actor": actor, "reason": reason})).first()
    if row is not None:
        reopened = _item(row)
        telemetry.reopened(reopened, actor, reason, row.previous_resolution)
        await notify_work(conn)  # leasable again
        return "done", reopened
    current = await get_item(conn, item_id=item_id)
    return ("not_found" if current is None else "not_resolved"), current


# --- source revisions --------------------------------------------------------------------

# A revision is one statement: the CTE locks the item (unless the revision's source_hash is its
# current one or one it had before: a retry), the UPDATE writes the new figures and, by the state
# it finds, moves the lease on (ASSIGNED: new epoch and nonce, the holder keeps it) or reopens the
# decision (RESOLVED: PENDING in its old place, fresh attempts), and the events (REVISED, then
# REOPENED for a decertified decision) read the old values from the CTE. A completion racing it
# either commits first (and is then decertified here) or finds the lease moved on.
_earlier_hash = exists(
    select(event.c.id).where(
        event.c.item_id == item.c.id,
        event.c.event == "REVISED",
        event.c.details["previous"]["source_hash"].astext == bindparam("new_hash", type_=Text),
    )
)
_revision_target = (
    select(
        item.c.id,
        item.c.state.label("previous_state"),
        item.c.variance_amount.label("previous_amount"),
        item.c.match_decision.label("previous_decision"),
        item.c.source_hash.label("previous_hash"),
        item.c.leased_by.label("previous_holder"),
        item.c.resolution.label("previous_resolution"),
        item.c.resolution_note.label("previous_note"),
        item.c.resolved_by.label("previous_resolved_by"),
        item.c.resolved_at.label("previous_resolved_at"),
        item.c.approved_by.label("previous_approved_by"),
    )
    .where(
        item.c.id == bindparam("item_id"),
        item.c.source_hash != bindparam("new_hash", type_=Text),
        ~_earlier_hash,
    )
    .with_for_update()
    .cte("revision_target")
)
_was_resolved = item.c.state == RESOLVED
_was_assigned = item.c.state == ASSIGNED
_was_awaiting = item.c.state == AWAITING_APPROVAL


def _unless_reopened(column: Any) -> Any:
    """`column` kept, or NULL when the revision puts a resolved or proposed item back to PENDING."""
    return case((or_(_was_resolved, _was_awaiting), null()), else_=column)


def _unless_resolved(column: Any, value: Any = None) -> Any:
    """`column` kept, or `value` (NULL by default) when the revision reopens a resolved item."""
    return case((_was_resolved, null() if value is None else value), else_=column)


_revised = (
    item.update()
    .where(item.c.id == _revision_target.c.id, item.c.source_hash == _revision_target.c.previous_hash)
    .values(
        variance_amount=bindparam("new_amount", type_=Numeric(18, 2)),
        match_decision=func.coalesce(bindparam("new_decision", type_=Text), item.c.match_decision),
        source_hash=bindparam("new_hash", type_=Text),
        # Reopened in its old place (due_at and created_at are kept). A proposal awaiting approval
        # rested on the old figures: back to PENDING too (any approval lease ends), its proposal kept
        # on the row until the next completion, as after a rejection.
        state=case((_was_resolved, PENDING), (_was_awaiting, PENDING), else_=item.c.state),
        resolution=_unless_resolved(item.c.resolution),
        resolution_note=_unless_resolved(item.c.resolution_note),
        resolved_by=_unless_resolved(item.c.resolved_by),
        resolved_at=_unless_resolved(item.c.resolved_at),
        leased_by=_unless_reopened(item.c.leased_by),
        leased_at=_unless_reopened(item.c.leased_at),
        lease_expires_at=_unless_reopened(item.c.lease_expires_at),
        approved_by=_unless_resolved(item.c.approved_by),
        approved_at=_unless_resolved(item.c.approved_at),
        attempts=_unless_resolved(item.c.attempts, literal_column("0", Integer)),
        # The holder keeps the item under a new lease: every token of the old one is dead.
        lease_epoch=case((_was_assigned, item.c.lease_epoch + 1), else_=item.c.lease_epoch),
        lease_nonce=case(
            (_was_assigned, func.gen_random_uuid()), (_was_resolved, null()), else_=item.c.lease_nonce
        ),
        revised_epoch=case((_was_assigned, item.c.lease_epoch + 1), else_=item.c.revised_epoch),
    )
    .returning(*_ITEM_COLUMNS, *[c for c in _revision_target.c if c.name != "id"])
    .cte("revised")
)


def _figures(amount: Any, decision: Any, source_hash: Any) -> Any:
    # The amount as text: a JSON number would be read back as a float.
    return func.jsonb_build_object(
        "variance_amount", cast(amount, Text), "match_decision", decision, "source_hash", source_hash
    )


_revised_logged = _logged(
    _revised,
    "REVISED",
    details=func.jsonb_build_object(
        "previous",
        _figures(_revised.c.previous_amount, _revised.c.previous_decision, _revised.c.previous_hash),
        "current",
        _figures(_revised.c.variance_amount, _revised.c.match_decision, _revised.c.source_hash),
        "previous_state",
        _revised.c.previous_state,
        "holder",
        _revised.c.previous_holder,
    ),
)
# After REVISED (it reads that insert's RETURNING): the decision that rested on the old figures.
_decertified_logged = _logged(
    _revised,
    "REOPENED",
    details=func.jsonb_build_object(
        "reason",
        "source revised",
        "decertified",
        True,
        "previous_resolution",
        _revised.c.previous_resolution,
        "previous_note",
        _revised.c.previous_note,
        "previous_resolved_by",
        _revised.c.previous_resolved_by,
        "previous_resolved_at",
        _revised.c.previous_resolved_at,
        "previous_approved_by",
        _revised.c.previous_approved_by,
    ),
    where=and_(_revised.c.previous_state == RESOLVED, _revised.c.id.in_(select(_revised_logged.c.item_id))),
)
_REVISE: Any = select(
    *[_revised.c[n] for n in _ITEM_FIELDS],
    _revised.c.previous_state,
    _revised.c.previous_amount,
    _revised.c.previous_decision,
    _revised.c.previous_hash,
    _revised.c.previous_resolution,
).add_cte(_revised_logged, _decertified_logged)

RevisionOutcome = Literal["revised", "unchanged", "superseded", "conflict", "not_found"]


@dataclass(frozen=True, slots=True)
class Revision:
    outcome: RevisionOutcome
    item: Item | None
    previous_state: str | None = None
    previous_amount: Decimal | None = None
    previous_decision: str | None = None
    previous_hash: str | None = None
    previous_resolution: str | None = None


async def revise_item(
    conn: AsyncConnection,
    *,
    item_id: UUID,
    actor: str,
    variance_amount: Decimal,
    source_hash: str,
    match_decision: str | None,
) -> Revision:
    """New figures for an item; idempotent on source_hash (its current one: `unchanged`, or a
    `conflict` when the figures differ; an earlier one: `superseded`, nothing changes)."""
    params = {
        "item_id": item_id,
        "actor": actor,
        "new_amount": variance_amount,
        "new_hash": source_hash,
        "new_decision": match_decision,
    }
    row = (await conn.execute(_REVISE, params)).first()
    if row is not None:
        revised = _item(row)
        if revised.state == "PENDING":
            await notify_work(conn)  # a reopened decision is leasable again
        telemetry.revised(
            revised,
            actor,
            previous_state=row.previous_state,
            previous_source_hash=row.previous_hash,
            previous_variance_amount=f"{row.previous_amount:.2f}",
            previous_match_decision=row.previous_decision,
            variance_amount=f"{revised.variance_amount:.2f}",
            decertified_resolution=row.previous_resolution,
            state=revised.state,
        )
        return Revision(
            "revised",
            revised,
            row.previous_state,
            row.previous_amount,
            row.previous_decision,
            row.previous_hash,
            row.previous_resolution,
        )
    current = await get_item(conn, item_id=item_id)
    if current is None:
        return Revision("not_found", None)
    if current.source_hash != source_hash:
        return Revision("superseded", current)
    same = current.variance_amount == variance_amount and match_decision in (None, current.match_decision)
    return Revision("unchanged" if same else "conflict", current)


# --- the admin's override: release someone's leases, reassign an item ----------------------


# A lease of either queue: a review lease (ASSIGNED) or an approval lease (AWAITING_APPROVAL, held).
_any_lease = or_(
    item.c.state == ASSIGNED, and_(item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_not(None))
)
# An ended review lease goes back to PENDING, an approval lease back to the approval queue.
_BACK_FROM_LEASE = case((item.c.state == AWAITING_APPROVAL, AWAITING_APPROVAL), else_=PENDING)


def _admin_released(holding: ColumnElement[bool], name: str) -> Any:
    """Release every lease matching `holding`, whoever holds it: one statement, rows locked in id
    order (two overlapping releases cannot deadlock), each with a RELEASED event by the admin that
    names the holder. PENDING again in its old place, never quarantined: the lease ended because of
    an admin, not because the item failed."""
    target = (
        select(item.c.id, item.c.leased_by.label("previous_holder"))
        .where(_any_lease, holding)
        .order_by(item.c.id)
        .with_for_update()
        .cte(f"{name}_target")
    )
    released = (
        item.update()
        .where(item.c.id == target.c.id, _any_lease)
        .values(state=_BACK_FROM_LEASE, leased_by=None, leased_at=None, lease_expires_at=None)
        .returning(*_ITEM_COLUMNS, target.c.previous_holder)
        .cte(name)
    )
    return select(*[released.c[n] for n in _ITEM_FIELDS], released.c.previous_holder).add_cte(
        _logged(
            released,
            "RELEASED",
            details=func.jsonb_build_object(
                "reason",
                bindparam("reason", type_=Text),
                "previous_holder",
                released.c.previous_holder,
                "override",
                True,
            ),
        )
    )


_ADMIN_RELEASE_ITEM = _admin_released(item.c.id == bindparam("item_id"), "admin_released_item")
_ADMIN_RELEASE_REVIEWER = _admin_released(
    item.c.leased_by == bindparam("holder", type_=Text), "admin_released_reviewer"
)


@dataclass(frozen=True, slots=True)
class Overridden:
    item: Item
    previous_holder: str


async def admin_release_item(
    conn: AsyncConnection, *, item_id: UUID, actor: str, reason: str
) -> tuple[Literal["done", "not_assigned", "not_found"], Overridden | None, Item | None]:
    """An admin hands a leased item back to its queue, whoever holds it (an approval lease back to
    the approval queue)."""
    row = (
        await conn.execute(_ADMIN_RELEASE_ITEM, {"item_id": item_id, "actor": actor, "reason": reason})
    ).first()
    if row is not None:
        await notify_work(conn)
        released = Overridden(_item(row), row.previous_holder)
        telemetry.admin_released(released.item, actor, released.previous_holder, reason)
        return "done", released, None
    current = await get_item(conn, item_id=item_id)
    return ("not_found" if current is None else "not_assigned"), None, current


async def admin_release_reviewer(
    conn: AsyncConnection, *, reviewer: str, actor: str, reason: str
) -> list[Overridden]:
    """An admin hands every item `reviewer` holds back to the queue (the reviewer went on leave)."""
    params = {"holder": fold_subject(reviewer), "actor": actor, "reason": reason}
    rows = await conn.execute(_ADMIN_RELEASE_REVIEWER, params)
    released = sorted(
        (Overridden(_item(r), r.previous_holder) for r in rows),
        key=lambda o: (o.item.due_at, o.item.created_at, o.item.id),
    )
    if released:
        await notify_work(conn)
    for o in released:
        telemetry.admin_released(o.item, actor, o.previous_holder, reason)
    return released


def _live_token(*roles: str) -> Any:
    return exists(
        select(api_token.c.id).where(
            api_token.c.subject == bindparam("to_reviewer", type_=Text),
            api_token.c.role.in_(roles),
            api_token.c.revoked_at.is_(None),
            or_(api_token.c.expires_at.is_(None), api_token.c.expires_at > func.now()),
        )
    )


# Someone who can take the lease: a live token of a role that leases from the review queue
# (reviewer, approver, admin: api.deps.Reviewer) for a review lease, approver or admin for an approval lease.
_CAN_LEASE = _live_token("reviewer", "approver", "admin")
_CAN_APPROVE = _live_token("approver", "admin")
_CAN_TAKE = case((item.c.state == AWAITING_APPROVAL, _CAN_APPROVE), else_=_CAN_LEASE)
# Review and approval leases count together against the cap, as in the lease itself.
_target_holds = (
    select(func.count())
    .where(_any_lease, item.c.leased_by == bindparam("to_reviewer", type_=Text))
    .scalar_subquery()
)
_reassign_target = (
    select(item.c.id, item.c.leased_by.label("previous_holder"))
    .where(
        item.c.id == bindparam("item_id"),
        _any_lease,
        item.c.leased_by != bindparam("to_reviewer", type_=Text),
        # Segregation of duties: an approval lease never goes to the proposal's preparer.
        or_(item.c.state != AWAITING_APPROVAL, _not_prepared_by("to_reviewer")),
        _CAN_TAKE,
        # The per-reviewer cap holds for an admin's move too (counted under the reviewer's lock).
        _target_holds < bindparam("cap", type_=Integer),
    )
    .with_for_update()
    .cte("reassign_target")
)
# The lease moves: a new holder, a full lease from now, a new epoch and nonce (every token of
# the old holder is dead). Not a new attempt: the item did not fail anyone.
_reassigned = (
    item.update()
    .where(item.c.id == _reassign_target.c.id, _any_lease)
    .values(
        leased_by=bindparam("to_reviewer", type_=Text),
        leased_at=func.now(),
        lease_expires_at=func.now() + bindparam("lease_duration", type_=Interval),
        lease_epoch=item.c.lease_epoch + 1,
        lease_nonce=func.gen_random_uuid(),
    )
    .returning(*_ITEM_COLUMNS, _reassign_target.c.previous_holder)
    .cte("reassigned")
)
_REASSIGN: Any = select(*[_reassigned.c[n] for n in _ITEM_FIELDS], _reassigned.c.previous_holder).add_cte(
    _logged(
        _reassigned,
        "REASSIGNED",
        details=func.jsonb_build_object(
            "reason",
            bindparam("reason", type_=Text),
            "previous_holder",
            _reassigned.c.previous_holder,
            "leased_by",
            _reassigned.c.leased_by,
            "lease_expires_at",
            _reassigned.c.lease_expires_at,
        ),
    )
)
_IS_REVIEWER = select(_CAN_LEASE)
_IS_APPROVER = select(_CAN_APPROVE)

ReassignOutcome = Literal[
    "done", "not_assigned", "already_held", "segregation_of_duties", "not_a_reviewer", "at_cap", "not_found"
]


async def reassign_item(
    conn: AsyncConnection,
    *,
    item_id: UUID,
    to_reviewer: str,
    actor: str,
    reason: str,
    lease_duration: timedelta,
    cap: int,
) -> tuple[ReassignOutcome, Overridden | None, Item | None]:
    """An admin moves an item's lease (a review lease, or an approval lease: never to the proposal's
    preparer) to another reviewer or approver (never past their cap)."""
    to_reviewer = fold_subject(to_reviewer)
    params = {
        "item_id": item_id,
        "to_reviewer": to_reviewer,
        "actor": actor,
        "reason": reason,
        "lease_duration": lease_duration,
        "cap": cap,
    }
    await _lock_reviewer(conn, to_reviewer)
    row = (await conn.execute(_REASSIGN, params)).first()
    if row is not None:
        moved = Overridden(_item(row), row.previous_holder)
        telemetry.reassigned(moved.item, actor, moved.previous_holder, to_reviewer, reason)
        return "done", moved, None
    current = await get_item(conn, item_id=item_id)
    outcome: ReassignOutcome
    if current is None:
        outcome = "not_found"
    elif not (
        current.state == "ASSIGNED"
        or (current.state == "AWAITING_APPROVAL" and current.leased_by is not None)
    ):
        outcome = "not_assigned"
    elif current.leased_by == to_reviewer:
        outcome = "already_held"
    elif current.state == "AWAITING_APPROVAL" and same_identity(current.prepared_by, to_reviewer):
        outcome = "segregation_of_duties"
    elif not (
        await conn.execute(_IS_APPROVER if current.state == "AWAITING_APPROVAL" else _IS_REVIEWER, params)
    ).scalar():
        outcome = "not_a_reviewer"
    elif (await conn.execute(select(_target_holds), {"to_reviewer": to_reviewer})).scalar_one() >= cap:
        outcome = "at_cap"
    else:  # the item changed between the statement and this read: refused all the same
        outcome = "not_assigned"
    return outcome, None, current


CompleteOutcome = Literal[
    "resolved",
    "already_resolved",
    "submitted_for_approval",
    "already_submitted",
    "resolution_conflict",
    "invalid_resolution",
    "note_required",
    "lease_not_held",
    "source_changed",
    "not_found",
]

# Batch completion runs _COMPLETE above, the single-item statement exactly as written, once per
# entry of a batch: its per-entry bind parameters become the columns of an `entries` CTE (an
# unnest of arrays), so the guards, values and event of every completion are those of _COMPLETE,
# and a change to them applies to POST /items/{id}/complete and POST /items/complete alike.
# Both routes run this one statement (the single route is a batch of one).
_entries = (
    select(
        func.unnest(
            bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True))),
            bindparam("resolutions", type_=ARRAY(Text)),
            bindparam("notes", type_=ARRAY(Text)),
            bindparam("fence_nonces", type_=ARRAY(PG_UUID(as_uuid=True))),
            bindparam("expected_source_hashes", type_=ARRAY(Text)),
        )
        .table_valued("item_id", "resolution", "note", "fence_nonce", "expected_source_hash")
        .render_derived()
    )
).cte("entries")
_PER_ENTRY = {
    name: _entries.c[name] for name in ("item_id", "note", "fence_nonce", "expected_source_hash")
} | {"chosen_code": _entries.c.resolution}  # the catalogue check's bind (see _code_ok)


def _per_entry(element: Any, **_: Any) -> Any:
    if isinstance(element, BindParameter) and element.key in _PER_ENTRY:
        return _PER_ENTRY[element.key]
    return None


_completed = visitors.replacement_traverse(_COMPLETE, {}, _per_entry).cte("completed")
# The entries the completion refused, read again FOR SHARE: in READ COMMITTED that waits for a
# transaction changing the row and then returns its newest version (a snapshot read would show a
# completion this one queued behind as still ASSIGNED), and it tells the caller why nothing changed.
_refused = (
    select(*_ITEM_COLUMNS)
    .where(
        item.c.id == func.any(bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True)))),
        item.c.id.not_in(select(_completed.c.id)),
    )
    .with_for_update(read=True)
    .cte("refused")
)
# For a refused entry, the catalogue row its code names (NULL: no such code), read in the same
# statement so that the caller can say why (an unknown or inactive code, a missing note) without
# a second read; it only explains: the completion itself checked the code.
_refused_code = (
    select(_entries.c.resolution)
    .where(_entries.c.item_id == _refused.c.id)
    .correlate_except(_entries)  # the refused row of the outer SELECT, two levels up
    .scalar_subquery()
)
# A submission puts its item in the approval queue: approvers waiting for work hear of it.
_submitted = _announced(_completed, _completed.c.state == AWAITING_APPROVAL, "submitted")
_COMPLETE_ITEMS = (
    select(
        true().label("done"),
        *[_completed.c[n] for n in _ITEM_FIELDS],
        null().label("code_active"),
        null().label("code_requires_note"),
    )
    .select_from(_completed.join(_submitted, true()))
    .union_all(
        select(
            false().label("done"),
            *[_refused.c[n] for n in _ITEM_FIELDS],
            select(catalogue.c.active).where(catalogue.c.code == _refused_code).scalar_subquery(),
            select(catalogue.c.requires_note).where(catalogue.c.code == _refused_code).scalar_subquery(),
        )
    )
    # Every row it touches is found by primary key, whatever the values: planned once per
    # connection, not on every call (db.engine.OneRoundTrip; tests/db/test_query_plans.py).
    .execution_options(generic_plan=True)
)


@dataclass(frozen=True, slots=True)
class Completion:
    item_id: UUID
    resolution: str
    note: str | None = None
    lease_nonce: UUID | None = None
    source_hash: str | None = None  # the figures the caller decided on, when it says


@dataclass(frozen=True, slots=True)
class ResolutionCode:
    code: str
    label: str
    description: str
    requires_note: bool
    approval_threshold: Decimal | None
    active: bool
    updated_at: datetime
    effective_approval_threshold: Decimal | None  # the lower of approval_threshold and materiality


_CODE_COLUMNS = [
    *(catalogue.c[f.name] for f in dataclasses.fields(ResolutionCode)[:-1]),
    approval_threshold(catalogue.c.approval_threshold).label("effective_approval_threshold"),
]


async def list_resolution_codes(
    conn: AsyncConnection, *, include_inactive: bool = False
) -> list[ResolutionCode]:
    query = select(*_CODE_COLUMNS).order_by(catalogue.c.code)
    if not include_inactive:
        query = query.where(catalogue.c.active)
    return [ResolutionCode(*r) for r in await conn.execute(query)]


async def get_resolution_code(conn: AsyncConnection, *, code: str) -> ResolutionCode | None:
    row = (await conn.execute(select(*_CODE_COLUMNS).where(catalogue.c.code == code))).first()
    return ResolutionCode(*row) if row is not None else None


async def put_resolution_code(
    conn: AsyncConnection,
    *,
    code: str,
    label: str,
    description: str,
    requires_note: bool,
    approval_threshold: Decimal | None,
    active: bool,
) -> tuple[bool, ResolutionCode]:
    """Create or replace a code in one statement; answers (created, the code)."""
    values = {
        "code": code,
        "label": label,
        "description": description,
        "requires_note": requires_note,
        "approval_threshold": approval_threshold,
        "active": active,
    }
    new = insert(catalogue).values(**values)
    # xmax = 0: the row was inserted, not updated (PostgreSQL's upsert tells which this way).
    statement = new.on_conflict_do_update(
        index_elements=[catalogue.c.code],
        set_={**{k: new.excluded[k] for k in values if k != "code"}, "updated_at": func.now()},
    ).returning(*_CODE_COLUMNS, literal_column("(resolution_code.xmax = 0)").label("created"))
    row = (await conn.execute(statement)).one()
    return bool(row.created), ResolutionCode(*row[: len(_CODE_COLUMNS)])


async def deactivate_resolution_code(conn: AsyncConnection, *, code: str) -> ResolutionCode | None:
    statement = (
        catalogue.update()
        .where(catalogue.c.code == code)
        .values(active=False, updated_at=func.now())
        .returning(*_CODE_COLUMNS)
    )
    row = (await conn.execute(statement)).first()
    return ResolutionCode(*row) if row is not None else None


def _holds(current: Item, actor: str, lease_nonce: UUID | None, state: str) -> bool:
    return (
        current.state == state and current.leased_by == actor and lease_nonce in (None, current.lease_nonce)
    )


# api.schemas.NO_LEASE: the nonce a token that cannot be one of the item's leases stands for.
NO_LEASE = UUID(int=0)


def source_changed(current: Item, reviewer: str, lease_nonce: UUID | None, source_hash: str | None) -> bool:
    """Was a holder's refused call refused because the figures changed under their lease (409
    SOURCE_CHANGED, answered with the new values and lease token) rather than because the lease
    is not theirs? `lease_nonce` is the nonce the call's token claims (None without a token)."""
    if current.state != "ASSIGNED" or current.leased_by != reviewer or lease_nonce == NO_LEASE:
        return False
    if source_hash is not None and source_hash != current.source_hash:
        return True
    if not current.revised_during_lease:
        return False
    return lease_nonce != current.lease_nonce if lease_nonce is not None else source_hash is None


def _refusal(
    current: Item, reviewer: str, completion: Completion, code_active: bool | None, requires_note: bool | None
) -> CompleteOutcome:
    """Why a completion changed nothing: the figures changed under the holder's lease
    (SOURCE_CHANGED), a retry of the holder's own completion or submission, the catalogue (an
    unknown or inactive code, a missing note: the holder passed every other guard), or else
    LEASE_NOT_HELD."""
    if source_changed(current, reviewer, completion.lease_nonce, completion.source_hash):
        return "source_changed"
    submitted = current.state == "AWAITING_APPROVAL" and same_identity(current.prepared_by, reviewer)
    if submitted and completion.lease_nonce in (None, current.lease_nonce):
        return (
            "already_submitted"
            if current.proposed_resolution == completion.resolution
            else "resolution_conflict"
        )
    if _holds(current, reviewer, completion.lease_nonce, "ASSIGNED"):
        if not code_active:
            return "invalid_resolution"
        if requires_note and not (completion.note or "").strip():
            return "note_required"
    retry = current.state == "RESOLVED" and current.resolved_by == reviewer
    if (
        retry
        and completion.lease_nonce in (None, current.lease_nonce)
        and completion.source_hash in (None, current.source_hash)
    ):
        return "already_resolved" if current.resolution == completion.resolution else "resolution_conflict"
    return "lease_not_held"


async def complete_items(
    conn: AsyncConnection | OneRoundTrip, *, completions: Sequence[Completion], reviewer: str
) -> list[tuple[CompleteOutcome, Item | None]]:
    """Resolve the items in one statement; answer per input, in input order. An id given more than
    once is applied from its first entry; its later entries answer as a retry of it would."""
    first: dict[UUID, Completion] = {}
    for completion in completions:
        first.setdefault(completion.item_id, completion)
    params = {
        "item_ids": list(first),
        "resolutions": [c.resolution for c in first.values()],
        "notes": [c.note for c in first.values()],
        "fence_nonces": [c.lease_nonce for c in first.values()],
        "expected_source_hashes": [c.source_hash for c in first.values()],
        "actor": reviewer,
    }
    result = await conn.execute(_COMPLETE_ITEMS, params)
    rows = {row.id: (row.done, _item(row), row.code_active, row.code_requires_note) for row in result}
    results: list[tuple[CompleteOutcome, Item | None]] = []
    for completion in completions:
        done, current, code_active, requires_note = rows.get(completion.item_id, (False, None, None, None))
        if current is None:
            results.append(("not_found", None))
            continue
        if done and completion is first[completion.item_id] and current.state == "AWAITING_APPROVAL":
            telemetry.submitted(current, reviewer, resolution=completion.resolution)
            results.append(("submitted_for_approval", current))
            continue
        if done and completion is first[completion.item_id]:
            telemetry.resolved(
                current,
                reviewer,
                idempotency_key=current.idempotency_key,
                resolution=completion.resolution,
                resolved_at=current.resolved_at.isoformat() if current.resolved_at else None,
            )
            results.append(("resolved", current))
            continue
        # Nothing changed; the row only tells the caller why.
        outcome = _refusal(current, reviewer, completion, code_active, requires_note)
        telemetry.completion_noop(current, reviewer, outcome)
        results.append((outcome, current))
    return results


async def complete_item(
    conn: AsyncConnection | OneRoundTrip,
    *,
    item_id: UUID,
    reviewer: str,
    resolution: str,
    note: str | None,
    lease_nonce: UUID | None = None,
    source_hash: str | None = None,
) -> tuple[CompleteOutcome, Item | None]:
    (result,) = await complete_items(
        conn, completions=[Completion(item_id, resolution, note, lease_nonce, source_hash)], reviewer=reviewer
    )
    return result


ApprovalOutcome = Literal[
    "approved", "already_approved", "rejected", "segregation_of_duties", "lease_not_held", "not_found"
]


async def approve_item(
    conn: AsyncConnection, *, item_id: UUID, approver: str, lease_nonce: UUID | None = None
) -> tuple[ApprovalOutcome, Item | None]:
    """Resolve a proposal whose approval lease the approver holds: resolved_by is the preparer."""
    params = {"item_id": item_id, "actor": approver, "fence_nonce": lease_nonce}
    outcome, current = await _holder_change(conn, _APPROVE, params)
    if outcome == "done" and current is not None:
        telemetry.approved(current, approver, resolution=current.resolution, prepared_by=current.prepared_by)
        return "approved", current
    if current is None:
        return "not_found", None
    if same_identity(current.prepared_by, approver) and current.state in ("AWAITING_APPROVAL", "RESOLVED"):
        return "segregation_of_duties", current
    if (
        current.state == "RESOLVED"
        and current.approved_by == approver
        and lease_nonce in (None, current.lease_nonce)
    ):
        return "already_approved", current
    return "lease_not_held", current


async def reject_item(
    conn: AsyncConnection, *, item_id: UUID, approver: str, reason: str, lease_nonce: UUID | None = None
) -> tuple[ApprovalOutcome, Item | None]:
    """Send a proposal back to PENDING, first in line, with the reason in its trail."""
    params = {"item_id": item_id, "actor": approver, "fence_nonce": lease_nonce, "reason": reason}
    outcome, current = await _holder_change(conn, _REJECT, params)
    if outcome == "done" and current is not None:
        await notify_work(conn)  # leasable again
        telemetry.rejected(current, approver, reason=reason, prepared_by=current.prepared_by)
        return "rejected", current
    if current is None:
        return "not_found", None
    if same_identity(current.prepared_by, approver) and current.state == "AWAITING_APPROVAL":
        return "segregation_of_duties", current
    return "lease_not_held", current


# --- reclaim ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reclaimed:
    id: UUID
    trace_id: UUID
    source_hash: str
    match_decision: str
    previous_holder: str
    lease_epoch: int
    state: str  # PENDING, or QUARANTINED when its attempts are used up
    attempts: int


def _reclaim_statement(*, approval: bool) -> Any:
    """Leases expired for longer than the grace, oldest expiry first, back to their queue.

    Same shape and discipline as the lease: a row some transaction holds (a completion or a
    renewal in flight) is skipped this round rather than waited for. A review lease goes back to
    PENDING in its old place (QUARANTINED once its attempts are used up); an approval lease goes
    back to the approval queue (AWAITING_APPROVAL, nobody holding it), never to PENDING: the
    proposal still waits for a second pair of eyes, and no attempt is counted. Each queue has its
    own statement on its own partial index.
    """
    suffix = "_approval" if approval else ""
    leased = (
        [item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_not(None)]
        if approval
        else [item.c.state == ASSIGNED]
    )
    expired = (
        select(item.c.id, item.c.leased_by, item.c.lease_expires_at)
        .where(*leased, item.c.lease_expires_at < func.now() - bindparam("grace", type_=Interval))
        .order_by(item.c.lease_expires_at)
        .limit(bindparam("reclaim_batch"))
        .with_for_update(skip_locked=True)
        .cte(f"expired{suffix}")
    )
    ended: dict[str, Any] = {"leased_by": None, "leased_at": None, "lease_expires_at": None}
    reclaimed = (
        item.update()
        .where(item.c.id == expired.c.id)
        .values(ended if approval else {**ended, "state": _BACK_TO_QUEUE})
        .returning(
            item.c.id,
            item.c.trace_id,
            item.c.source_hash,
            item.c.match_decision,
            item.c.lease_epoch,
            item.c.state,
            item.c.attempts,
            expired.c.leased_by.label("previous_holder"),
            expired.c.lease_expires_at.label("expired_at"),
        )
        .cte(f"reclaimed{suffix}")
    )
    details = func.jsonb_build_object(
        "cause",
        "lease_expired",
        *(("queue", "approval") if approval else ()),
        "previous_holder",
        reclaimed.c.previous_holder,
        "lease_expired_at",
        reclaimed.c.expired_at,
    )
    if approval:
        return select(reclaimed).add_cte(_logged(reclaimed, "RECLAIMED", details=details))
    return select(reclaimed).add_cte(*_logged_then_quarantined(reclaimed, "RECLAIMED", details=details))


_RECLAIM = _reclaim_statement(approval=False)
_RECLAIM_APPROVALS = _reclaim_statement(approval=True)


async def reclaim_expired(
    conn: AsyncConnection,
    *,
    reclaim_batch: int,
    grace: timedelta,
    actor: str,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[Reclaimed]:
    params = {"reclaim_batch": reclaim_batch, "grace": grace, "actor": actor, "max_attempts": max_attempts}
    rows = list(await conn.execute(_RECLAIM, params))
    if len(rows) < reclaim_batch:  # review leases first, then approval leases: one batch in all
        rows += await conn.execute(_RECLAIM_APPROVALS, {**params, "reclaim_batch": reclaim_batch - len(rows)})
    rows.sort(key=lambda r: r.expired_at)  # oldest expiry first
    if rows:
        await notify_work(conn)  # once per reclaim statement, however many rows it returned
    reclaimed = [
        Reclaimed(
            r.id,
            r.trace_id,
            r.source_hash,
            r.match_decision,
            r.previous_holder,
            r.lease_epoch,
            r.state,
            r.attempts,
        )
        for r in rows
    ]
    for row in reclaimed:
        telemetry.reclaimed(row, previous_holder=row.previous_holder, reclaimed_by=actor)
        if row.state == "QUARANTINED":
            telemetry.quarantined(row, actor)
    return reclaimed


# --- reads ------------------------------------------------------------------------------


async def get_item(conn: AsyncConnection, *, item_id: UUID) -> Item | None:
    row = (await conn.execute(_BY_ID, {"item_id": item_id})).first()
    return _item(row) if row is not None else None


@dataclass(frozen=True, slots=True)
class ItemFilter:
    state: str | None = None
    leased_by: str | None = None
    resolved_by: str | None = None
    ledger_entity: str | None = None
    match_decision: str | None = None
    idempotency_key: str | None = None
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    due_before: datetime | None = None  # exclusive
    min_amount: Decimal | None = None  # abs(variance_amount), inclusive
    max_amount: Decimal | None = None  # abs(variance_amount), inclusive
    search: str | None = None  # an id, an idempotency key or a ledger entity, exactly


ListOrder = Literal["created_at", "due_at"]


def _search(term: str) -> ColumnElement[bool]:
    """An id, an idempotency key or a ledger entity: each on its own index (a bitmap OR of them)."""
    matches = [item.c.idempotency_key == term, item.c.ledger_entity == term]
    with contextlib.suppress(ValueError):
        matches.append(item.c.id == UUID(term))
    return or_(*matches)


async def list_items(
    conn: AsyncConnection,
    *,
    where: ItemFilter,
    after: tuple[datetime, UUID] | None,
    limit: int,
    order: ListOrder = "created_at",
) -> list[Item]:
    """Items in (created_at, id) or (due_at, id) order, strictly after the keyset position `after`."""
    return [
        _item(r) for r in await conn.execute(list_query(where=where, after=after, limit=limit, order=order))
    ]


def list_query(
    *, where: ItemFilter, after: tuple[datetime, UUID] | None, limit: int, order: ListOrder
) -> Any:
    """The statement of list_items (tests/db/test_query_plans.py reads its plans).

    By due_at: one open state reads its partial index in that order (PENDING, or the other open
    states'), one ledger entity its index, the rest the (due_at, id) index; a search reads the
    matching rows by their indexes and orders only those."""
    column = item.c[order]
    query = select(*_ITEM_COLUMNS).order_by(column, item.c.id).limit(limit)
    for name in ("state", "leased_by", "resolved_by", "ledger_entity", "match_decision", "idempotency_key"):
        value = getattr(where, name)
        if value is not None:
            # An identity is found whatever the letter case it is typed in.
            folded = name in ("leased_by", "resolved_by")
            query = query.where(item.c[name] == (fold_subject(value) if folded else value))
    if where.created_after is not None:
        query = query.where(item.c.created_at >= where.created_after)
    if where.created_before is not None:
        query = query.where(item.c.created_at < where.created_before)
    if where.due_before is not None:
        query = query.where(item.c.due_at < where.due_before)
    if where.min_amount is not None:
        query = query.where(func.abs(item.c.variance_amount) >= where.min_amount)
    if where.max_amount is not None:
        query = query.where(func.abs(item.c.variance_amount) <= where.max_amount)
    if where.search is not None:
        query = query.where(_search(where.search))
    if after is not None:
        # The bound on the leading column alone lets an index that orders only by it (the partial
        # ones, by due_at) start at the position too.
        query = query.where(column >= after[0], tuple_(column, item.c.id) > tuple_(*after))
    return query


@dataclass(frozen=True, slots=True)
class Event:
    id: int
    item_id: UUID
    event: str
    actor: str
    at: datetime
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]


# Keyset by the event id (an identity: it only grows), on ix_review_queue_event_item_id_id.
_EVENTS = (
    select(*(c for c in event.c if c.name != "xid"))
    .where(event.c.item_id == bindparam("item_id"), event.c.id > bindparam("after"))
    .order_by(event.c.id)
    .limit(bindparam("limit"))
)


async def item_events(conn: AsyncConnection, *, item_id: UUID, after: int | None, limit: int) -> list[Event]:
    """The item's events oldest first, strictly after the event id `after`."""
    params = {"item_id": item_id, "after": after or 0, "limit": limit}
    return [Event(*r) for r in await conn.execute(_EVENTS, params)]


# The decisions of a reviewer: what they resolved, submitted for approval, approved or rejected.
DECISION_EVENTS = ("RESOLVED", "SUBMITTED_FOR_APPROVAL", "APPROVED", "REJECTED")
# Written exactly as the partial index's predicate, so that the planner matches it in every plan.
_IS_DECISION = text(f"review_queue_event.event IN ({', '.join(repr(e) for e in DECISION_EVENTS)})")
_EVENT_COLUMNS = [c for c in event.c if c.name != "xid"]


@dataclass(frozen=True, slots=True)
class Decision:
    event: Event
    item: Item  # as it is now


# Newest first, keyset by the event id, on ix_review_queue_event_decisions_by_actor; each with its
# item as it is now (by primary key).
_DECISIONS = (
    select(*_EVENT_COLUMNS, *_ITEM_COLUMNS)
    .select_from(event.join(item, item.c.id == event.c.item_id))
    .where(event.c.actor == bindparam("actor", type_=Text), _IS_DECISION, event.c.id < bindparam("before"))
    .order_by(event.c.id.desc())
    .limit(bindparam("limit"))
)


async def decisions(conn: AsyncConnection, *, actor: str, before: int | None, limit: int) -> list[Decision]:
    """The actor's decision events newest first, strictly before the event id `before`."""
    params = {"actor": actor, "before": before or 2**63 - 1, "limit": limit}
    rows = await conn.execute(_DECISIONS, params)
    # By position: the event's columns, then the item's (both have an `id`).
    split = len(_EVENT_COLUMNS)
    return [Decision(Event(*r[:split]), Item(*r[split:])) for r in rows]


@dataclass(frozen=True, slots=True)
class LostLease:
    """A holder's lease that expired and that the reclaimer took back: its RECLAIMED event."""

    item_id: UUID
    lease_expired_at: datetime
    reclaimed_at: datetime


_leased_since = event.alias("leased_since")
# Why a holder's call was refused, when the reclaimer ended their lease: the item's last RECLAIMED
# event naming them as the previous holder, unless they leased the item again after it. On the
# index of (item_id, id); read only for a refusal, after it.
_LOST = (
    select(
        event.c.item_id,
        cast(event.c.details["lease_expired_at"].astext, DateTime(timezone=True)).label("lease_expired_at"),
        event.c.at.label("reclaimed_at"),
    )
    .where(
        event.c.item_id == func.any(bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True)))),
        event.c.event == "RECLAIMED",
        event.c.details["previous_holder"].astext == bindparam("holder", type_=Text),
        ~exists().where(
            _leased_since.c.item_id == event.c.item_id,
            _leased_since.c.id > event.c.id,
            _leased_since.c.event == "LEASED",
            _leased_since.c.actor == bindparam("holder", type_=Text),
        ),
    )
    .order_by(event.c.item_id, event.c.id.desc())
)


async def lost_leases(
    conn: AsyncConnection, *, item_ids: Sequence[UUID], holder: str
) -> dict[UUID, LostLease]:
    """For each item whose lease `holder` lost to the reclaimer (and has not leased again since):
    when the lease expired and when it was reclaimed."""
    found: dict[UUID, LostLease] = {}
    for row in await conn.execute(_LOST, {"item_ids": list(item_ids), "holder": holder}):
        found.setdefault(row.item_id, LostLease(*row))  # the newest of each item comes first
    return found
