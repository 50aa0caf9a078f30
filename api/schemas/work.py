"""Work on an item: leases, renewals, releases, completion, approval, reclaim and the admin's
interventions."""

from typing import Annotated, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from api.schemas.codecs import LeaseToken
from api.schemas.fields import (
    AdminReason,
    BatchSize,
    CommentText,
    MatchDecision,
    Note,
    Reason,
    ReclaimBatch,
    Resolution,
    Strict,
    Subject,
    Text200,
    WaitSeconds,
)
from api.schemas.items import ItemOut
from api.schemas.service import Problem


class LeaseIn(Strict):
    batch_size: BatchSize | None = None
    queue: Literal["review", "approval"] = Field(
        default="review",
        description="`review`: PENDING items (roles reviewer, approver, admin). `approval`: other"
        " people's proposals awaiting approval (roles approver, admin); never your own.",
    )
    ledger_entity: Text200 | None = Field(
        default=None, description="Lease only items of this ledger entity (a reviewer who handles one)."
    )
    wait_s: WaitSeconds = Field(
        default=0,
        description="When nothing can be leased, wait up to this many seconds for work (long poll).",
    )
    item_id: UUID | None = Field(
        default=None,
        description="Lease exactly this item if you can lease it now (PENDING, or in the approval queue"
        " someone else's unheld proposal; under the cap), else an empty list. It takes back an item"
        " you released within the cool-off.",
    )


class LeaseOut(BaseModel):
    items: list[ItemOut]


class CompleteIn(Strict):
    resolution: Resolution
    note: Note | None = None
    lease_token: LeaseToken | None = None
    source_hash: Text200 | None = Field(
        default=None,
        description="The source_hash of the figures you decided on; anything but the item's current"
        " one is a 409 SOURCE_CHANGED. Without a lease_token, required once a revision moved your lease on.",
    )


class AdminReleaseIn(Strict):
    reason: AdminReason = Field(description="Why; kept in each RELEASED event with the previous holder.")


class ReassignIn(Strict):
    reviewer: Subject = Field(description="Who takes the lease over: a reviewer or admin with a live token.")
    reason: AdminReason = Field(description="Why; kept in the REASSIGNED event with both holders.")


class ReleasedOut(BaseModel):
    released: int
    items: list[ItemOut]


class RenewIn(Strict):
    lease_token: LeaseToken | None = None


class RequeueIn(Strict):
    reason: Annotated[Reason, StringConstraints(min_length=1)]


class ReopenIn(Strict):
    reason: Annotated[Reason, StringConstraints(min_length=1)] = Field(
        description="Why the decision is reopened; kept in the REOPENED event with the old decision."
    )


class ReleaseIn(Strict):
    reason: Reason | None = None
    lease_token: LeaseToken | None = None


class CompleteOut(BaseModel):
    outcome: Literal["resolved", "already_resolved", "submitted_for_approval", "already_submitted"] = Field(
        description="`submitted_for_approval`: the code's approval threshold was met, the item is"
        " AWAITING_APPROVAL; the `already_` outcomes answer a retry."
    )
    item: ItemOut


class ApproveIn(Strict):
    lease_token: LeaseToken | None = None


class ApproveOut(BaseModel):
    outcome: Literal["approved", "already_approved"] = Field(
        description="`already_approved` answers a retry."
    )
    item: ItemOut


class CommentIn(Strict):
    text: CommentText = Field(
        description="The comment, 1-2,000 characters, not only spaces, tabs and line breaks; kept in the"
        " COMMENTED event's `details.text`."
    )


class RejectIn(Strict):
    reason: Annotated[Reason, StringConstraints(min_length=1)] = Field(
        description="Why the proposal is rejected; kept in the REJECTED event with the proposal."
    )
    lease_token: LeaseToken | None = None


MAX_COMPLETE_ITEMS = 200


class CompleteEntry(Strict):
    id: UUID = Field(description="The item's id.")
    resolution: Resolution
    note: Note | None = None
    lease_token: LeaseToken | None = None
    source_hash: Text200 | None = Field(default=None, description="As in POST /items/{id}/complete.")


class CompleteBatchIn(Strict):
    items: list[CompleteEntry] = Field(min_length=1, max_length=MAX_COMPLETE_ITEMS)


class CompleteResult(BaseModel):
    id: UUID
    outcome: Literal[
        "resolved", "already_resolved", "submitted_for_approval", "already_submitted", "refused"
    ] = Field(
        description="`resolved`, `already_resolved`, `submitted_for_approval` (the code's approval"
        " threshold was met: AWAITING_APPROVAL) and `already_submitted` as POST /items/{id}/complete"
        " answers them (with the item); `refused` with the problem the single route would answer"
        " (LEASE_NOT_HELD, RESOLUTION_CONFLICT, SOURCE_CHANGED, NOT_FOUND, VALIDATION_ERROR for an"
        " unknown or inactive code or a missing note), nothing changed for this entry."
    )
    item: "ItemOut | None" = None
    problem: "Problem | None" = None


class CompleteBatchOut(BaseModel):
    results: list[CompleteResult]


class ReclaimIn(Strict):
    reclaim_batch: ReclaimBatch = 100


class ReclaimedOut(BaseModel):
    id: UUID
    trace_id: UUID
    source_hash: str
    match_decision: MatchDecision
    state: Literal["PENDING", "QUARANTINED", "AWAITING_APPROVAL"] = Field(
        description="PENDING, or QUARANTINED when the item had used up its attempts;"
        " AWAITING_APPROVAL for an approval lease (back to the approval queue)."
    )

    model_config = ConfigDict(from_attributes=True)


class ReclaimOut(BaseModel):
    reclaimed: int
    items: list[ReclaimedOut]
