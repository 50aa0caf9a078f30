"""Approve and reject: an approver decides on another person's proposal."""

from datetime import timedelta
from functools import partial
from typing import Literal
from uuid import UUID

from sqlalchemy import (
    Interval,
    Text,
    bindparam,
    func,
)

from db import telemetry
from db.notify import notify_work
from db.queue.lease import _holder_change
from db.queue.rows import (
    _ITEM_COLUMNS,
    AWAITING_APPROVAL,
    PENDING,
    RESOLVED,
    Item,
    _changed_items,
    _held_by_caller,
    _not_prepared_by,
)
from db.tables import review_queue_item as item
from db.tokens import same_identity
from db.unit import Unit

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

# Back to PENDING, returned to its preparer until returned_until (the lease statement gives it to
# them first and to nobody else until then; afterwards it is in its due-date place again); the
# proposal stays on the row until the next completion, and the REJECTED event keeps it with the reason.
_rejected = (
    item.update()
    .where(*_held_by_caller(AWAITING_APPROVAL))
    .where(_not_prepared_by("actor"))
    .values(
        state=PENDING,
        leased_by=None,
        leased_at=None,
        lease_expires_at=None,
        returned_until=func.now() + bindparam("returned_for", type_=Interval),
    )
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


ApprovalOutcome = Literal[
    "approved", "already_approved", "rejected", "segregation_of_duties", "lease_not_held", "not_found"
]


async def approve_item(
    unit: Unit, *, item_id: UUID, approver: str, lease_nonce: UUID | None = None
) -> tuple[ApprovalOutcome, Item | None]:
    """Resolve a proposal whose approval lease the approver holds: resolved_by is the preparer."""
    params = {"item_id": item_id, "actor": approver, "fence_nonce": lease_nonce}
    outcome, current = await _holder_change(unit, _APPROVE, params)
    if outcome == "done" and current is not None:
        unit.after_commit(
            partial(
                telemetry.approved,
                current,
                approver,
                resolution=current.resolution,
                prepared_by=current.prepared_by,
            )
        )
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
    unit: Unit,
    *,
    item_id: UUID,
    approver: str,
    reason: str,
    lease_nonce: UUID | None = None,
    returned_for: timedelta = timedelta(0),
) -> tuple[ApprovalOutcome, Item | None]:
    """Send a proposal back to PENDING, to its preparer first for `returned_for`, with the reason
    in its trail."""
    params = {
        "item_id": item_id,
        "actor": approver,
        "fence_nonce": lease_nonce,
        "reason": reason,
        "returned_for": returned_for,
    }
    outcome, current = await _holder_change(unit, _REJECT, params)
    if outcome == "done" and current is not None:
        await notify_work(unit)  # leasable again
        unit.after_commit(
            partial(telemetry.rejected, current, approver, reason=reason, prepared_by=current.prepared_by)
        )
        return "rejected", current
    if current is None:
        return "not_found", None
    if same_identity(current.prepared_by, approver) and current.state == "AWAITING_APPROVAL":
        return "segregation_of_duties", current
    return "lease_not_held", current
