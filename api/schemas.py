"""Request and response bodies. Money is Decimal in, a two-decimal string out, never a float."""

from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
)


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

Timestamp = Annotated[
    datetime, PlainSerializer(lambda d: d.astimezone(UTC).isoformat(), return_type=str, when_used="json")
]

MatchDecision = Literal["MATCHED", "PARTIAL", "UNMATCHED"]
State = Literal["PENDING", "ASSIGNED", "RESOLVED"]
Resolution = Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]{0,63}$")]


class Strict(BaseModel):
    # Unknown fields are refused, so a body can never smuggle in leased_by, state or the like.
    model_config = ConfigDict(extra="forbid")


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

    model_config = ConfigDict(from_attributes=True)


class LeaseIn(Strict):
    batch_size: int | None = Field(default=None, ge=1, le=200)


class LeaseOut(BaseModel):
    items: list[ItemOut]


class CompleteIn(Strict):
    resolution: Resolution
    note: Annotated[str, StringConstraints(max_length=4000), AfterValidator(_storable)] | None = None


class CompleteOut(BaseModel):
    outcome: Literal["resolved", "already_resolved"]
    item: ItemOut


class ReclaimIn(Strict):
    reclaim_batch: int = Field(default=100, ge=1, le=1000)


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
    """RFC 9457 problem details, as every 4xx and 5xx body."""

    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None
    errors: list[dict[str, object]] | None = None
