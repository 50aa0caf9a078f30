"""An admin's changes: requeue a quarantined item, reopen a resolved one, release someone's
leases, reassign an item."""

from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Integer,
    Interval,
    Text,
    and_,
    bindparam,
    case,
    exists,
    func,
    or_,
    select,
)

from db import telemetry
from db.notify import notify_work
from db.queue.lease import _lock_reviewer
from db.queue.reads import get_item
from db.queue.rows import (
    _ITEM_COLUMNS,
    _ITEM_FIELDS,
    ASSIGNED,
    AWAITING_APPROVAL,
    PENDING,
    QUARANTINED,
    RESOLVED,
    Item,
    _changed_items,
    _first,
    _item,
    _logged,
    _not_prepared_by,
    _scalar,
)
from db.tables import api_token
from db.tables import review_queue_item as item
from db.tokens import fold_subject, same_identity
from db.unit import Unit

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
    unit: Unit, *, item_id: UUID, actor: str, reason: str
) -> tuple[RequeueOutcome, Item | None]:
    """Put a QUARANTINED item back in the queue (an admin decided it deserves more attempts)."""
    row = _first(await unit.execute(_REQUEUE, {"item_id": item_id, "actor": actor, "reason": reason}))
    if row is not None:
        requeued = _item(row)
        await notify_work(unit)  # leasable again
        unit.after_commit(partial(telemetry.requeued, requeued, actor, reason))
        return "done", requeued
    current = await get_item(unit, item_id=item_id)
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
    unit: Unit, *, item_id: UUID, actor: str, reason: str
) -> tuple[ReopenOutcome, Item | None]:
    """Put a RESOLVED item back to PENDING (an admin decided the decision was wrong)."""
    row = _first(await unit.execute(_REOPEN, {"item_id": item_id, "actor": actor, "reason": reason}))
    if row is not None:
        reopened = _item(row)
        unit.after_commit(partial(telemetry.reopened, reopened, actor, reason, row.previous_resolution))
        await notify_work(unit)  # leasable again
        return "done", reopened
    current = await get_item(unit, item_id=item_id)
    return ("not_found" if current is None else "not_resolved"), current


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
    unit: Unit, *, item_id: UUID, actor: str, reason: str
) -> tuple[Literal["done", "not_assigned", "not_found"], Overridden | None, Item | None]:
    """An admin hands a leased item back to its queue, whoever holds it (an approval lease back to
    the approval queue)."""
    row = _first(
        await unit.execute(_ADMIN_RELEASE_ITEM, {"item_id": item_id, "actor": actor, "reason": reason})
    )
    if row is not None:
        await notify_work(unit)
        released = Overridden(_item(row), row.previous_holder)
        unit.after_commit(
            partial(telemetry.admin_released, released.item, actor, released.previous_holder, reason)
        )
        return "done", released, None
    current = await get_item(unit, item_id=item_id)
    return ("not_found" if current is None else "not_assigned"), None, current


async def admin_release_reviewer(unit: Unit, *, reviewer: str, actor: str, reason: str) -> list[Overridden]:
    """An admin hands every item `reviewer` holds back to the queue (the reviewer went on leave)."""
    params = {"holder": fold_subject(reviewer), "actor": actor, "reason": reason}
    rows = await unit.execute(_ADMIN_RELEASE_REVIEWER, params)
    released = sorted(
        (Overridden(_item(r), r.previous_holder) for r in rows),
        key=lambda o: (o.item.due_at, o.item.created_at, o.item.id),
    )
    if released:
        await notify_work(unit)
    for o in released:
        unit.after_commit(partial(telemetry.admin_released, o.item, actor, o.previous_holder, reason))
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
    unit: Unit,
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
    await _lock_reviewer(unit, to_reviewer)
    row = _first(await unit.execute(_REASSIGN, params))
    if row is not None:
        moved = Overridden(_item(row), row.previous_holder)
        unit.after_commit(
            partial(telemetry.reassigned, moved.item, actor, moved.previous_holder, to_reviewer, reason)
        )
        return "done", moved, None
    current = await get_item(unit, item_id=item_id)
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
    elif not _scalar(
        await unit.execute(_IS_APPROVER if current.state == "AWAITING_APPROVAL" else _IS_REVIEWER, params)
    ):
        outcome = "not_a_reviewer"
    elif _scalar(await unit.execute(select(_target_holds), {"to_reviewer": to_reviewer})) >= cap:
        outcome = "at_cap"
    else:  # the item changed between the statement and this read: refused all the same
        outcome = "not_assigned"
    return outcome, None, current
