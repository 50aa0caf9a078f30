"""Request and response bodies. Money is Decimal in, a two-decimal string out, never a float."""

import base64
import binascii
import json
import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StrictInt,
    StringConstraints,
    model_validator,
)

if TYPE_CHECKING:  # the HTTP client imports these models without pulling in the database layer
    from db.queue import Item


def _storable(value: str) -> str:
    # PostgreSQL text cannot hold NUL, and a lone surrogate cannot be encoded: refuse both
    # here as a 422 instead of letting the driver fail with a 500.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text") from None
    return value


def _money(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise ValueError("must be a finite number")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent < -2:
        raise ValueError("at most 2 fraction digits; the amount is never rounded")
    if abs(value) >= Decimal("1e16"):
        raise ValueError("at most 16 integer digits")
    return value


Text200 = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable)]

# Decimal in (a string like "12.50" or a JSON number parsed straight to Decimal, see
# api.routing), a string with exactly two decimals out.
Money = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["12.50"]),
    AfterValidator(_money),
    PlainSerializer(lambda d: f"{d:.2f}", return_type=str, when_used="json"),
]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: object) -> object:
    # pydantic alone would also take "1700000000" (Unix seconds), "2026-01-01T00:00Z" and the like.
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 timestamp with an offset, e.g. 2026-01-01T00:00:00Z")
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


def _not_a_boolean(value: object) -> object:
    # pydantic's lax mode would take `true` for 1.
    if isinstance(value, bool):
        raise ValueError("must be an integer, not a boolean")
    return value


Count = Annotated[int, BeforeValidator(_not_a_boolean)]

Timestamp = Annotated[
    datetime, PlainSerializer(lambda d: d.astimezone(UTC).isoformat(), return_type=str, when_used="json")
]


def encode_lease_token(item_id: UUID, lease_epoch: int) -> str:
    """The fencing token of one lease of one item; opaque to clients."""
    return base64.urlsafe_b64encode(item_id.bytes + lease_epoch.to_bytes(8, "big")).decode().rstrip("=")


def decode_lease_token(token: str) -> tuple[UUID, int]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        raise ValueError("not a lease token") from None
    if len(raw) != 24:
        raise ValueError("not a lease token")
    return UUID(bytes=raw[:16]), int.from_bytes(raw[16:], "big")


def _lease_token(value: str) -> str:
    decode_lease_token(value)
    return value


LeaseToken = Annotated[
    str,
    StringConstraints(min_length=32, max_length=32, pattern=r"^[A-Za-z0-9_-]{32}$"),
    AfterValidator(_lease_token),
    Field(description="The `lease_token` of your lease; refused once the item has been leased again."),
]


def encode_cursor(created_at: datetime, item_id: UUID) -> str:
    return base64.urlsafe_b64encode(json.dumps([created_at.isoformat(), str(item_id)]).encode()).decode()


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """Raises ValueError for anything next_cursor did not produce."""
    try:
        created_at, item_id = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        position = (datetime.fromisoformat(created_at), UUID(item_id))
    except (ValueError, TypeError, UnicodeEncodeError, binascii.Error):
        raise ValueError("malformed cursor") from None
    if position[0].tzinfo is None:
        raise ValueError("malformed cursor")
    return position


MatchDecision = Literal["MATCHED", "PARTIAL", "UNMATCHED"]
State = Literal["PENDING", "ASSIGNED", "RESOLVED"]
Resolution = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")]


class Strict(BaseModel):
    # Unknown fields are refused, so a body can never smuggle in leased_by, state or the like.
    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: Any) -> Any:
        # FastAPI validates bodies with from_attributes=True, and api.routing parses a JSON number
        # into a Decimal, which pydantic would then read as an object with no attributes: a body
        # of `1.5` would pass as `{}`.
        if not isinstance(data, dict | BaseModel):
            raise ValueError("must be a JSON object")
        return data


class ItemIn(Strict):
    idempotency_key: Text200
    ledger_entity: Text200
    variance_amount: Money
    match_decision: MatchDecision
    source_hash: Text200
    trace_id: UUID | None = None


class ItemOut(BaseModel):
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Money
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
    attempts: int = Field(description="How many times the item has been leased.")
    lease_token: str | None = Field(
        description="Fencing token of the current lease; shown to the holder only, null otherwise."
    )

    @classmethod
    def of(cls, item: "Item", viewer: str | None = None) -> "ItemOut":
        fields = {name: getattr(item, name) for name in cls.model_fields if hasattr(item, name)}
        held = item.state == "ASSIGNED" and viewer is not None and item.leased_by == viewer
        return cls(
            **fields,
            attempts=item.lease_epoch,
            lease_token=encode_lease_token(item.id, item.lease_epoch) if held else None,
        )


MAX_WAIT_S = 20


class LeaseIn(Strict):
    batch_size: Count | None = Field(default=None, ge=1, le=200)
    wait_s: StrictInt = Field(
        default=0,
        ge=0,
        le=MAX_WAIT_S,
        description="When nothing can be leased, wait up to this many seconds for work (long poll).",
    )


class LeaseOut(BaseModel):
    items: list[ItemOut]


class CompleteIn(Strict):
    resolution: Resolution
    note: Annotated[str, StringConstraints(max_length=4000), AfterValidator(_storable)] | None = None
    lease_token: LeaseToken | None = None


class RenewIn(Strict):
    lease_token: LeaseToken | None = None


class ReleaseIn(Strict):
    reason: Annotated[str, StringConstraints(max_length=500), AfterValidator(_storable)] | None = None
    lease_token: LeaseToken | None = None


class ItemQuery(Strict):
    state: State | None = None
    leased_by: Text200 | None = Field(default=None, description="A reviewer, or `me` for the caller.")
    resolved_by: Text200 | None = Field(default=None, description="A reviewer, or `me` for the caller.")
    ledger_entity: Text200 | None = None
    match_decision: MatchDecision | None = None
    idempotency_key: Text200 | None = Field(default=None, description="The item enqueued with this key.")
    created_after: Rfc3339 | None = Field(default=None, description="Inclusive; RFC 3339 with offset.")
    created_before: Rfc3339 | None = Field(default=None, description="Exclusive; RFC 3339 with offset.")
    limit: int = Field(default=50, ge=1, le=200)
    cursor: str | None = Field(
        default=None, max_length=200, description="`next_cursor` of the previous page."
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
    event: Literal["ENQUEUED", "LEASED", "RENEWED", "RELEASED", "RECLAIMED", "RESOLVED"]
    actor: str
    at: Timestamp
    lease_epoch: int
    trace_id: UUID
    details: dict[str, Any]

    model_config = ConfigDict(from_attributes=True)


class EventsOut(BaseModel):
    events: list[EventOut]


class CompleteOut(BaseModel):
    outcome: Literal["resolved", "already_resolved"]
    item: ItemOut


class ReclaimIn(Strict):
    reclaim_batch: Count = Field(default=100, ge=1, le=1000)


class ReclaimedOut(BaseModel):
    id: UUID
    trace_id: UUID
    source_hash: str
    match_decision: MatchDecision

    model_config = ConfigDict(from_attributes=True)


class ReclaimOut(BaseModel):
    reclaimed: int
    items: list[ReclaimedOut]


class Health(BaseModel):
    status: Literal["ok"]


class Problem(BaseModel):
    """RFC 9457 problem details, as every 4xx and 5xx body (some codes add members, e.g. item_id)."""

    model_config = ConfigDict(extra="allow")

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, object]] | None = None


class SessionIn(Strict):
    token: Annotated[str, StringConstraints(min_length=1, max_length=200)] = Field(
        description="A bearer token (from `review-queue token create`), exchanged for a session cookie."
    )


class SessionOut(BaseModel):
    subject: str
    role: Literal["reviewer", "ingest", "admin"]
    csrf_token: str | None = Field(
        description="Send it as X-CSRF-Token with every write made with the session cookie; "
        "null when the caller used a bearer token."
    )
    lease_s: float = Field(description="Lease duration (REVIEW_QUEUE_LOCK_TIMEOUT_MS) in seconds.")
    idle_release_s: int = Field(description="REVIEW_QUEUE_UI_IDLE_RELEASE_S: the desk releases idle work.")
    max_wait_s: int = Field(description="The largest wait_s of POST /leases.")
