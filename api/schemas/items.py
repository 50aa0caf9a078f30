"""Items: what is enqueued, what an item looks like, the list, the batch, revisions, events and
decisions."""

from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, field_serializer, model_validator

from api.schemas.codecs import CURSOR_PATTERN, EVENT_CURSOR_PATTERN, encode_lease_token
from api.schemas.fields import Context, DueAt, MatchDecision, Rfc3339, State, Strict, Text200, Timestamp
from api.schemas.money import Amount, AmountBound, AmountOut, CurrencyCode, amount_fits_currency, amount_text
from api.schemas.service import Problem
from db.vocabulary import EventName

if TYPE_CHECKING:  # for the annotations of `of` only: the schemas need no queue code to run
    from db.queue import Item


CURRENCY_IN = (
    "ISO 4217 code of variance_amount. Absent or null: the deployment's base currency"
    " (REVIEW_QUEUE_BASE_CURRENCY, `base_currency` of GET /resolutions/policy). The amount has at most"
    " its minor units as decimals (JPY none, USD two, KWD three): more is a 422, never rounded."
)


class ItemIn(Strict):
    idempotency_key: Text200
    ledger_entity: Text200
    variance_amount: Amount
    currency: CurrencyCode | None = Field(default=None, description=CURRENCY_IN)

    @model_validator(mode="before")
    @classmethod
    def _fits_currency(cls, data: Any) -> Any:
        return amount_fits_currency(data)

    match_decision: MatchDecision
    source_hash: Text200
    trace_id: UUID | None = None
    context: Context | None = None
    due_at: DueAt | None = Field(
        default=None,
        description="The deadline. Absent or null: created_at plus the SLA tier of abs(variance_amount)"
        " in the base currency at the latest rate (REVIEW_QUEUE_SLA_TIERS; no rate: the strictest tier)."
        " Part of the idempotency comparison only when given.",
    )


class ItemOut(BaseModel):
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: AmountOut = Field(description="Written with exactly its currency's decimals.")
    currency: str = Field(description="ISO 4217 code of variance_amount.", examples=["EUR"])
    match_decision: MatchDecision
    state: State
    leased_by: str | None
    leased_at: Timestamp | None
    lease_expires_at: Timestamp | None
    trace_id: UUID
    source_hash: str
    created_at: Timestamp
    resolution: str | None
    resolution_note: str | None
    resolved_by: str | None
    resolved_at: Timestamp | None
    attempts: int = Field(
        description="Leases since enqueue or the last requeue; at REVIEW_QUEUE_MAX_ATTEMPTS a release"
        " or reclaim quarantines the item."
    )
    lease_token: str | None = Field(
        description="Fencing token of the current lease; shown to the holder only, null otherwise."
    )
    context: dict[str, Any] | None = Field(
        default=None, description="The context sent at enqueue, as sent; null when none was."
    )
    prepared_by: str | None = Field(
        default=None,
        description="Who proposed the resolution that needed approval (the preparer); kept after the"
        " approval or rejection, until the next completion.",
    )
    prepared_at: Timestamp | None = None
    proposed_resolution: str | None = Field(default=None, description="The preparer's proposed code.")
    proposed_note: str | None = None
    approved_by: str | None = Field(
        default=None, description="The approver of the resolution; never the same as resolved_by."
    )
    approved_at: Timestamp | None = None
    due_at: Timestamp = Field(
        description="The deadline: as given at enqueue, or created_at plus the SLA tier of the amount."
    )

    @field_serializer("variance_amount", when_used="json")
    def _amount(self, amount: Decimal) -> str:
        return amount_text(amount, self.currency)

    @classmethod
    def of(cls, item: "Item", viewer: str | None = None) -> "ItemOut":
        fields = {name: getattr(item, name) for name in cls.model_fields if hasattr(item, name)}
        # A review lease (ASSIGNED) or an approval lease (AWAITING_APPROVAL with a holder).
        held = (
            item.state in ("ASSIGNED", "AWAITING_APPROVAL")
            and viewer is not None
            and item.leased_by == viewer
        )
        return cls(
            **fields,
            lease_token=encode_lease_token(item.id, item.lease_nonce) if held and item.lease_nonce else None,
        )


class RevisionIn(Strict):
    variance_amount: Amount
    currency: CurrencyCode | None = Field(
        default=None,
        description="Unchanged when omitted. The amount has at most this currency's decimals (or the"
        " item's, when omitted).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fits_currency(cls, data: Any) -> Any:
        return amount_fits_currency(data)

    source_hash: Text200 = Field(description="Of the new figures; a revision is idempotent on it.")
    match_decision: MatchDecision | None = Field(default=None, description="Unchanged when omitted.")


class RevisionOut(BaseModel):
    outcome: Literal["revised", "unchanged", "superseded"] = Field(
        description="`revised`: applied now; `unchanged`: the item already has this source_hash (a"
        " retry); `superseded`: the item had this source_hash before and has moved on (nothing changes)."
    )
    item: ItemOut


class ItemQuery(Strict):
    state: State | None = None
    leased_by: Text200 | None = Field(default=None, description="A reviewer, or `me` for the caller.")
    resolved_by: Text200 | None = Field(default=None, description="A reviewer, or `me` for the caller.")
    ledger_entity: Text200 | None = None
    match_decision: MatchDecision | None = None
    idempotency_key: Text200 | None = Field(default=None, description="The item enqueued with this key.")
    created_after: Rfc3339 | None = Field(default=None, description="Inclusive; RFC 3339 with offset.")
    created_before: Rfc3339 | None = Field(default=None, description="Exclusive; RFC 3339 with offset.")
    due_before: Rfc3339 | None = Field(
        default=None, description="Items due before this time (exclusive); RFC 3339 with offset."
    )
    currency: CurrencyCode | None = Field(
        default=None,
        description="Items in this ISO 4217 currency; `min_amount` and `max_amount` are then amounts of it.",
    )
    min_amount: AmountBound | None = Field(
        default=None,
        description="Items with abs(variance_amount) at least this (inclusive; up to 16 integer and 3"
        " fraction digits, the amount column's bounds): in `currency` when given,"
        " else in the base currency, each amount converted at its currency's latest rate (an item whose"
        " currency has no rate yet matches no amount bound then).",
    )
    max_amount: AmountBound | None = Field(
        default=None,
        description="Items with abs(variance_amount) at most this (inclusive), as `min_amount`.",
    )
    q: Text200 | None = Field(
        default=None,
        description="Search, in any letter case: the items whose id, idempotency key or ledger entity"
        " starts with this, or with a string or number starting with it anywhere in `context`, nested"
        " too (keys, booleans and nulls are not searched). `inv-7741` finds"
        ' `"invoice": "INV-77412"`; `%`, `_` and `\\` are plain characters. Combines with the other'
        " filters; paged like the list.",
    )
    sort: Literal["created_at", "due_at"] = Field(
        default="created_at",
        description="`created_at`: oldest first; `due_at`: earliest deadline first (ties by id).",
    )
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(
        default=None,
        pattern=CURSOR_PATTERN,
        description="`next_cursor` of the previous page, with the same filters and `sort`.",
    )


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


MAX_BATCH_ITEMS = 1000


class BatchIn(Strict):
    items: list[ItemIn] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class BatchResult(BaseModel):
    outcome: Literal["created", "existing", "conflict"]
    item: "ItemOut | None" = None
    problem: "Problem | None" = None


class BatchOut(BaseModel):
    results: list[BatchResult]


class EventOut(BaseModel):
    id: int
    item_id: UUID
    event: EventName
    actor: str
    at: Timestamp
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]

    model_config = ConfigDict(from_attributes=True)


class EventQuery(Strict):
    limit: int = Field(default=100, ge=1, le=500)
    cursor: str | None = Field(
        default=None, pattern=EVENT_CURSOR_PATTERN, description="`next_cursor` of the previous page."
    )


class EventsOut(BaseModel):
    events: list[EventOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


class DecisionQuery(Strict):
    actor: Text200 = Field(default="me", description="Whose decisions: a reviewer, or `me` for the caller.")
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(
        default=None, pattern=EVENT_CURSOR_PATTERN, description="`next_cursor` of the previous page."
    )


class RejectionOut(BaseModel):
    by: str = Field(description="The approver who rejected the proposal.")
    reason: str = Field(description="Their reason, as in the REJECTED event.")
    at: Timestamp

    model_config = ConfigDict(from_attributes=True)


class DecisionOut(BaseModel):
    event: EventOut = Field(
        description="RESOLVED, SUBMITTED_FOR_APPROVAL, APPROVED or REJECTED, with its details"
        " (resolution, note, reason, approval_threshold, ...)."
    )
    item: ItemOut = Field(description="The item as it is now (its state tells what became of a proposal).")
    rejection: RejectionOut | None = Field(
        default=None,
        description="Of a SUBMITTED_FOR_APPROVAL decision an approver answered with a rejection: who,"
        " why and when; null otherwise (not answered yet, approved, or sent back by a revision).",
    )


class DecisionsPage(BaseModel):
    decisions: list[DecisionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")
