"""What the service answers, as the client reads it: plain pydantic models, no server code.

Field names and types follow the server's response schemas (api/schemas.py, a test compares them);
the checks on input live on the server. Money and figures are Decimal (parsed from their strings,
never via float); vocabularies (state, outcome, event) are plain strings, so a value a newer server
adds does not break an older client. Fields a newer server adds are ignored."""

from datetime import date, datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field


class ItemOut(BaseModel):
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal  # exactly its currency's decimals: Decimal("1500") JPY, Decimal("1.234") KWD
    currency: str  # ISO 4217
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
    attempts: int
    lease_token: str | None
    context: dict[str, Any] | None = None
    prepared_by: str | None = None
    prepared_at: datetime | None = None
    proposed_resolution: str | None = None
    proposed_note: str | None = None
    approved_by: str | None = None
    approved_at: datetime | None = None
    due_at: datetime


class CompleteOut(BaseModel):
    outcome: str
    item: ItemOut


class ApproveOut(BaseModel):
    outcome: str
    item: ItemOut


class RevisionOut(BaseModel):
    outcome: str
    item: ItemOut


class ReleasedOut(BaseModel):
    released: int
    items: list[ItemOut]


class Problem(BaseModel):
    """RFC 9457 problem details (some codes add members, e.g. item_id: kept as extras)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, object]] | None = None


class CompleteResult(BaseModel):
    id: UUID
    outcome: str
    item: ItemOut | None = None
    problem: Problem | None = None


class CompleteBatchOut(BaseModel):
    results: list[CompleteResult]


class EventOut(BaseModel):
    id: int
    item_id: UUID
    event: str
    actor: str
    at: datetime
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]


class RejectionOut(BaseModel):
    by: str
    reason: str
    at: datetime


class DecisionOut(BaseModel):
    event: EventOut
    item: ItemOut
    rejection: RejectionOut | None = None


class FeedEventOut(EventOut):
    item: ItemOut  # as it stood right after the event ("event"), or as it is now ("now": an older event)
    item_as_of: str
    cursor: str


class FeedOut(BaseModel):
    events: list[FeedEventOut]
    next_cursor: str


class ResolutionCodeOut(BaseModel):
    code: str
    label: str
    description: str
    requires_note: bool
    approval_threshold: Decimal | None
    active: bool
    updated_at: datetime
    effective_approval_threshold: Decimal | None


class RateOut(BaseModel):
    currency: str
    rate: Decimal  # one unit of `currency` in the base currency
    set_by: str
    set_at: datetime


class RatesOut(BaseModel):
    base_currency: str
    rates: list[RateOut]


class RateHistoryOut(BaseModel):
    currency: str
    rates: list[RateOut]


class ResolutionPolicyOut(BaseModel):
    materiality_threshold: Decimal
    updated_at: datetime
    updated_by: str | None
    base_currency: str


class ReportOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: date = Field(alias="from")
    to: date
    tz: str
    bucket: str
    as_of: datetime


class SlaFiguresOut(BaseModel):
    fell_due: int
    on_time: int
    late: int
    open_past_due: int
    attainment: Decimal | None


class SlaBucketOut(SlaFiguresOut):
    start: date


class SlaOut(ReportOut):
    ledger_entity: str | None
    buckets: list[SlaBucketOut]
    total: SlaFiguresOut


class ThroughputRowOut(BaseModel):
    start: date
    reviewer: str
    resolved: int
    submitted_for_approval: int
    approved: int
    rejected: int
    released: int
    decisions: int
    median_lease_to_decision_s: Decimal | None
    p90_lease_to_decision_s: Decimal | None


class ThroughputOut(ReportOut):
    reviewer: str | None
    rows: list[ThroughputRowOut]


class BacklogFiguresOut(BaseModel):
    open: int
    by_age: dict[str, int]


class BacklogPointOut(BaseModel):
    start: date
    at: datetime
    open: int
    by_age: dict[str, int]
    by_currency: dict[str, BacklogFiguresOut] | None = None  # with by="currency"


class BacklogOut(ReportOut):
    by: str | None = None
    bands: list[str]
    points: list[BacklogPointOut]


class DecisionRowOut(BaseModel):
    """One decision, as a line of the NDJSON export."""

    event_id: int
    item_id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    currency: str
    match_decision: str
    resolution: str
    note: str | None
    resolved_by: str
    resolved_at: datetime
    approved_by: str | None
    approved_at: datetime | None
    due_at: datetime
    on_time: bool
    reopened_at: datetime | None
    # The conversion that decided four eyes, exact (decimal strings on the wire); None without a rate.
    rate: Decimal | None
    base_amount: Decimal | None
