"""The lease and its holder's changes to it (renew, release), and the reclaimer that ends
expired ones."""

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Literal
from uuid import UUID

import psycopg
from sqlalchemy import (
    Interval,
    Text,
    bindparam,
    case,
    func,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import UUID as PG_UUID
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.elements import ColumnElement

from db import telemetry
from db.errors import DatabaseUnavailable, is_lock_timeout
from db.notify import notify_work
from db.queue.rows import (
    _BACK_TO_QUEUE,
    _BY_ID,
    _ITEM_COLUMNS,
    _ITEM_FIELDS,
    ASSIGNED,
    AWAITING_APPROVAL,
    PENDING,
    QUARANTINED,
    Item,
    Queue,
    _announced,
    _changed_items,
    _held_by_caller,
    _item,
    _logged,
    _logged_then_quarantined,
    _not_prepared_by,
)
from db.tables import review_queue_item as item
from db.unit import Unit
from db.vocabulary import DEFAULT_MAX_ATTEMPTS

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
    lease that names the item (by_id) is the caller's deliberate choice and takes it back.

    A rejected proposal goes back to its preparer first (issue 42): while its returned_until is
    ahead, the preparer's unnamed lease takes it before anything else (a second ordered scan, of the
    small index of returned rows, locked with the same SKIP LOCKED and counted against the same
    batch and cap), and everyone else's unnamed lease skips it (a filter on the main scan, like the
    cool-off). Named, it goes to the preparer or an admin (override_return) only."""
    prefix = "approval_" if approval else ""
    actor = bindparam("actor", type_=Text)
    room = func.least(bindparam("batch_size"), func.greatest(bindparam("cap") - _held, 0))
    unheld = [item.c.state == AWAITING_APPROVAL, item.c.leased_by.is_(None)] if approval else []
    wanted = [*unheld, _not_prepared_by("actor")] if approval else [item.c.state == PENDING]
    if by_entity:
        wanted.append(item.c.ledger_entity == bindparam("entity", type_=Text))
    returned: Any = None
    if not approval and by_id:
        # Named: the preparer's within the return, anyone's after it, and an admin's always (so an
        # admin can take it and reassign it).
        wanted.append(or_(_not_returned(), ~_not_prepared_by("actor"), bindparam("override_return")))
    elif not approval:
        # The preparer's half: the items a rejection returned to them, ahead of due order, on their
        # own small index. Everyone's half below skips rows still returned to someone.
        returned = (
            select(item.c.id)
            .where(
                *wanted,
                item.c.returned_until.is_not(None),
                func.lower(item.c.prepared_by) == func.lower(actor),
                item.c.returned_until > func.now(),
            )
            .order_by(func.lower(item.c.prepared_by), item.c.due_at, item.c.created_at)
            .limit(room)
            .with_for_update(skip_locked=True)
            .cte(f"{prefix}returned")
        )
        room = func.greatest(room - select(func.count()).select_from(returned).scalar_subquery(), 0)
        wanted.append(_not_returned())
    if by_id:
        wanted.append(item.c.id == bindparam("lease_item_id", type_=PG_UUID(as_uuid=True)))
    else:
        wanted.append(or_(item.c.released_by.is_distinct_from(actor), item.c.released_until <= func.now()))
    candidate: Any = (
        select(item.c.id)
        .where(*wanted)
        .order_by(item.c.due_at, item.c.created_at)
        .limit(room)
        .with_for_update(skip_locked=True)
        .cte(f"{prefix}candidate")
    )
    if returned is not None:
        candidate = union_all(select(returned.c.id), select(candidate.c.id)).cte(f"{prefix}candidates")
    stamped: dict[str, Any] = {
        "leased_by": actor,
        "leased_at": func.now(),
        "lease_expires_at": func.now() + bindparam("lease_duration", type_=Interval),
        "lease_epoch": item.c.lease_epoch + 1,
        "lease_nonce": func.gen_random_uuid(),
    }
    if not approval:
        # A lease ends a rejection's return, whoever takes it.
        stamped |= {"state": ASSIGNED, "attempts": item.c.attempts + 1, "returned_until": None}
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


def _not_returned() -> ColumnElement[bool]:
    """Not held back for its preparer: never rejected, or the rejection's return is over."""
    return or_(item.c.returned_until.is_(None), item.c.returned_until <= func.now())


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


async def _lock_reviewer(unit: Unit, reviewer: str) -> None:
    try:
        await unit.execute(_LOCK_REVIEWER, {"actor": reviewer})
    except (DBAPIError, psycopg.Error) as error:
        if is_lock_timeout(error):
            raise _reviewer_lock_timeout(reviewer) from error
        raise


async def lease_items(
    unit: Unit,
    *,
    reviewer: str,
    batch_size: int,
    lease_duration: timedelta,
    cap: int,
    ledger_entity: str | None = None,
    queue: Queue = "review",
    item_id: UUID | None = None,
    override_return: bool = False,
) -> list[Item]:
    """Lease up to batch_size items (of ledger_entity only, when given; only item_id, when given)
    to reviewer, never leaving them holding more than cap: PENDING items from the review queue, or
    other people's proposals from the approval queue. Items the reviewer released within the
    cool-off are skipped unless named by item_id. The reviewer's own rejected proposals still
    within their return come first; other people's are skipped, and named by item_id, taken only
    with override_return (an admin)."""
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
        if queue == "review":
            params["override_return"] = override_return
    statement = _LEASES[queue, ledger_entity is not None, item_id is not None]
    # The reviewer's lock, then the lease: in one round trip when the unit sends them so.
    try:
        _, rows = await unit.execute_all([(_LOCK_REVIEWER, {"actor": reviewer}), (statement, params)])
    except (DBAPIError, psycopg.Error) as error:
        if unit.failed_step == 0 and is_lock_timeout(error):
            raise _reviewer_lock_timeout(reviewer) from error
        raise
    # RETURNING has no order; callers get the queue order.
    items = sorted(map(_item, rows), key=lambda i: (i.due_at, i.created_at, i.id))
    unit.after_commit(partial(telemetry.leased, items, reviewer))
    return items


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


HolderOutcome = Literal["done", "lease_not_held", "not_found"]


async def _holder_change(
    unit: Unit, statement: Any, params: dict[str, Any]
) -> tuple[HolderOutcome, Item | None]:
    """The holder's change, and when it changed nothing, the item as it is now (to say why)."""
    # The re-read goes after the change (in the same round trip, when the unit sends them so):
    # in READ COMMITTED it sees the newest committed row.
    changed, now = await unit.execute_all([(statement, params), (_BY_ID, {"item_id": params["item_id"]})])
    if changed:
        return "done", _item(changed[0])
    return ("lease_not_held", _item(now[0])) if now else ("not_found", None)


async def renew_lease(
    unit: Unit,
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
    outcome, current = await _holder_change(unit, _RENEW, params)
    if outcome == "done" and current is not None:
        unit.after_commit(partial(telemetry.renewed, current, reviewer))
    return outcome, current


async def release_lease(
    unit: Unit,
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
    outcome, current = await _holder_change(unit, _RELEASE, params)
    if outcome == "done" and current is not None:
        unit.after_commit(partial(telemetry.released, current, reviewer, reason))
        if current.state == "QUARANTINED":
            unit.after_commit(partial(telemetry.quarantined, current, reviewer))
    return outcome, current


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
        # Every column: the events keep the item as it stands after this (rows.item_after).
        .returning(
            *_ITEM_COLUMNS,
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
    unit: Unit,
    *,
    reclaim_batch: int,
    grace: timedelta,
    actor: str,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> list[Reclaimed]:
    params = {"reclaim_batch": reclaim_batch, "grace": grace, "actor": actor, "max_attempts": max_attempts}
    rows = list(await unit.execute(_RECLAIM, params))
    if len(rows) < reclaim_batch:  # review leases first, then approval leases: one batch in all
        rows += await unit.execute(_RECLAIM_APPROVALS, {**params, "reclaim_batch": reclaim_batch - len(rows)})
    rows.sort(key=lambda r: r.expired_at)  # oldest expiry first
    if rows:
        await notify_work(unit)  # once per reclaim statement, however many rows it returned
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
        unit.after_commit(
            partial(telemetry.reclaimed, row, previous_holder=row.previous_holder, reclaimed_by=actor)
        )
        if row.state == "QUARANTINED":
            unit.after_commit(partial(telemetry.quarantined, row, actor))
    return reclaimed
