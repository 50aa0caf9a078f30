"""Operator actions: reclaim abandoned leases now; release or reassign another reviewer's leases."""

from datetime import timedelta
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Path

from api.deps import Admin, SettingsDep, Work
from api.errors import ProblemError, problem_responses
from api.routing import QueueRoute
from api.schemas import (
    AdminReleaseIn,
    ItemOut,
    ReassignIn,
    ReclaimedOut,
    ReclaimIn,
    ReclaimOut,
    ReleasedOut,
    Subject,
)
from db import queue

router = APIRouter(route_class=QueueRoute, tags=["admin"])

ItemId = Annotated[UUID, Path(description="The item's id (a UUID).")]


@router.post("/admin/reclaim", operation_id="reclaimExpired", summary="Reclaim expired leases")
async def reclaim(
    unit: Work,
    principal: Admin,
    settings: SettingsDep,
    body: Annotated[ReclaimIn | None, Body()] = None,
) -> ReclaimOut:
    """Return leases expired for longer than `reclaim_after_s` to the queue, oldest expiry first."""
    reclaimed = await queue.reclaim_expired(
        unit,
        reclaim_batch=(body or ReclaimIn()).reclaim_batch,
        grace=timedelta(seconds=settings.reclaim_after_s),
        actor=principal.subject,
        max_attempts=settings.max_attempts,
    )
    return ReclaimOut(reclaimed=len(reclaimed), items=[ReclaimedOut.model_validate(r) for r in reclaimed])


@router.post(
    "/admin/items/{item_id}/release",
    operation_id="adminReleaseItem",
    summary="Release anyone's lease on an item (admin)",
    responses=problem_responses("NOT_FOUND", "NOT_ASSIGNED"),
)
async def release_item(item_id: ItemId, body: AdminReleaseIn, unit: Work, principal: Admin) -> ItemOut:
    """Hand a leased item back to the queue whoever holds it: PENDING in its old place (an approval
    lease: back to the approval queue, still AWAITING_APPROVAL); the
    holder's token is refused from now on. The RELEASED event names the admin, the holder and the reason."""
    outcome, done, current = await queue.admin_release_item(
        unit, item_id=item_id, actor=principal.subject, reason=body.reason
    )
    if done is None:
        if outcome == "not_found" or current is None:
            raise ProblemError("NOT_FOUND", f"no item {item_id}")
        raise ProblemError("NOT_ASSIGNED", f"item {item_id} is {current.state}, not ASSIGNED")
    return ItemOut.of(done.item, principal.subject)


@router.post(
    "/admin/reviewers/{reviewer}/release",
    operation_id="adminReleaseReviewer",
    summary="Release every lease a reviewer holds (admin)",
)
async def release_reviewer(
    reviewer: Annotated[Subject, Path(description="Whose leases to release.")],
    body: AdminReleaseIn,
    unit: Work,
    principal: Admin,
) -> ReleasedOut:
    """Hand every item `reviewer` holds back to the queue in one statement (they went on leave):
    PENDING in their old places; a RELEASED event per item names the admin, the holder and the reason."""
    released = await queue.admin_release_reviewer(
        unit, reviewer=reviewer, actor=principal.subject, reason=body.reason
    )
    return ReleasedOut(
        released=len(released), items=[ItemOut.of(o.item, principal.subject) for o in released]
    )


@router.post(
    "/admin/items/{item_id}/reassign",
    operation_id="reassignItem",
    summary="Move an item's lease to another reviewer (admin)",
    responses=problem_responses(
        "NOT_FOUND",
        "NOT_ASSIGNED",
        "ALREADY_HELD",
        "SEGREGATION_OF_DUTIES",
        "NOT_A_REVIEWER",
        "REVIEWER_AT_CAP",
    ),
)
async def reassign(
    item_id: ItemId,
    body: ReassignIn,
    unit: Work,
    principal: Admin,
    settings: SettingsDep,
) -> ItemOut:
    """Move an item's lease to `reviewer` (a live reviewer or admin token, below the
    per-reviewer cap; an approval lease: a live approver or admin token, never the proposal's preparer:
    403 SEGREGATION_OF_DUTIES): a full lease from now, a new epoch and lease token; the old holder's token
    is refused from now on. The new holder finds it in `GET /items?state=ASSIGNED&leased_by=me`."""
    outcome, done, current = await queue.reassign_item(
        unit,
        item_id=item_id,
        to_reviewer=body.reviewer,
        actor=principal.subject,
        reason=body.reason,
        lease_duration=timedelta(milliseconds=settings.lock_timeout_ms),
        cap=settings.max_leases_per_reviewer,
    )
    if done is None:
        if outcome == "not_found" or current is None:
            raise ProblemError("NOT_FOUND", f"no item {item_id}")
        if outcome == "already_held":
            raise ProblemError("ALREADY_HELD", f"{body.reviewer} already holds item {item_id}")
        if outcome == "segregation_of_duties":
            raise ProblemError(
                "SEGREGATION_OF_DUTIES",
                f"{body.reviewer} prepared the proposal of item {item_id}; another approver must decide it",
                extra={"prepared_by": current.prepared_by},
            )
        if outcome == "not_a_reviewer":
            raise ProblemError(
                "NOT_A_REVIEWER",
                f"{body.reviewer!r} has no live token of a role that can take this lease"
                " (reviewer, approver or admin; approver or admin for an approval lease)",
            )
        if outcome == "at_cap":
            raise ProblemError(
                "REVIEWER_AT_CAP", f"{body.reviewer} already holds as many items as anyone may"
            )
        raise ProblemError("NOT_ASSIGNED", f"item {item_id} is {current.state}, not ASSIGNED")
    return ItemOut.of(done.item, principal.subject)
