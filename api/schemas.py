"""Request and response bodies. Money is Decimal in, a two-decimal string out, never a float."""

import base64
import binascii
import functools
import json
import re
import zoneinfo
from datetime import UTC, date, datetime, timedelta
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
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from typing_extensions import TypeAliasType

if TYPE_CHECKING:  # the HTTP client imports these models without pulling in the database layer
    from db.feed import FeedEvent
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


# A decimal string exactly as finance writes it: no exponent, no sign but '-', no spaces, no
# digit separators, ASCII digits only (Python's Decimal would take "1_000.50", " 12.50 ", "+5",
# "1e5" and Arabic-Indic digits).
MONEY_PATTERN = r"^-?[0-9]{1,16}(\.[0-9]{1,2})?$"
_MONEY_STRING = re.compile(MONEY_PATTERN)


def _money_input(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError('must be a decimal string such as "12.50" or a JSON number, not a boolean')
    if isinstance(value, str) and not _MONEY_STRING.fullmatch(value):
        raise ValueError(
            'must be a decimal string of up to 16 integer and 2 fraction digits, e.g. "-12.50"'
            " (no exponent, spaces, '+' or separators)"
        )
    return value


_CENT = Decimal("0.01")


def _money(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise ValueError("must be a finite number")
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    if exponent < -2:
        raise ValueError("at most 2 fraction digits; the amount is never rounded")
    # adjusted() reads the exponent; abs() would compute in the decimal context and overflow
    # (decimal.Overflow, a 500) on a JSON number such as 1E+1000000.
    if value and value.adjusted() >= 16:
        raise ValueError("at most 16 integer digits")
    # Exact (at most 18 digits by now); 0E+1000000 becomes 0.00, which PostgreSQL can read.
    return value.quantize(_CENT)


# PostgreSQL text cannot hold NUL: the documented pattern says so, and _storable also refuses lone
# surrogates (which JSON can carry as escapes, and which no schema generator produces).
NO_NUL = r"^[^\u0000]*$"


Text200 = Annotated[
    str, StringConstraints(min_length=1, max_length=200, pattern=NO_NUL), AfterValidator(_storable)
]
Note = Annotated[str, StringConstraints(max_length=4000, pattern=NO_NUL), AfterValidator(_storable)]
Reason = Annotated[str, StringConstraints(max_length=500, pattern=NO_NUL), AfterValidator(_storable)]

# Decimal in (a string like "12.50" or a JSON number parsed straight to Decimal, see
# api.routing), a string with exactly two decimals out. The documented input schema is exactly
# what is accepted: the string pattern, or a number of cents within the limits.
Money = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["12.50"]),
    BeforeValidator(_money_input),
    AfterValidator(_money),
    PlainSerializer(lambda d: f"{d:.2f}", return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": MONEY_PATTERN},
                {"type": "number", "multipleOf": 0.01, "exclusiveMinimum": -1e16, "exclusiveMaximum": 1e16},
            ],
            "examples": ["12.50"],
        },
        mode="validation",
    ),
    WithJsonSchema(
        {"type": "string", "pattern": r"^-?[0-9]{1,16}\.[0-9]{2}$", "examples": ["12.50"]},
        mode="serialization",
    ),
]


def _unsigned_input(value: object) -> object:
    if isinstance(value, str) and value.startswith("-"):
        raise ValueError("must not be negative")
    return value


def _not_negative(value: Decimal) -> Decimal:
    if value < 0:
        raise ValueError("must not be negative")
    return value.copy_abs()  # -0 as a JSON number is 0


# An approval threshold: Money that is never negative (it is compared with an absolute amount).
Threshold = Annotated[
    Decimal,
    Field(allow_inf_nan=False, examples=["10000.00"]),
    BeforeValidator(_money_input),
    BeforeValidator(_unsigned_input),
    AfterValidator(_money),
    AfterValidator(_not_negative),
    PlainSerializer(lambda d: f"{d:.2f}", return_type=str, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": r"^[0-9]{1,16}(\.[0-9]{1,2})?$"},
                {"type": "number", "multipleOf": 0.01, "minimum": 0, "exclusiveMaximum": 1e16},
            ],
            "examples": ["10000.00"],
        },
        mode="validation",
    ),
    WithJsonSchema(
        {"type": "string", "pattern": r"^[0-9]{1,16}\.[0-9]{2}$", "examples": ["10000.00"]},
        mode="serialization",
    ),
]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: object) -> object:
    # pydantic alone would also take "1700000000" (Unix seconds), "2026-01-01T00:00Z" and the like.
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("must be an RFC 3339 timestamp with an offset, e.g. 2026-01-01T00:00:00Z")
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]

# A deadline: RFC 3339 with its offset, years 1970-2999 (so that it stays a timestamp every
# client and PostgreSQL round-trip in UTC). The pattern is the whole contract: the documented
# schema carries it, and the validator applies the same one.
DUE_AT_PATTERN = (
    r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
    r"T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
_DUE_AT = re.compile(DUE_AT_PATTERN)


def _due_at(value: object) -> object:
    if not isinstance(value, str) or not _DUE_AT.fullmatch(value):
        raise ValueError(
            "must be an RFC 3339 timestamp with an offset, years 1970-2999, e.g. 2026-12-04T17:00:00Z"
        )
    return value


def _in_utc(value: datetime) -> datetime:
    # The same instant in UTC: PostgreSQL reads offsets up to 15:59 only, and RFC 3339 (and the
    # pattern) allow up to 23:59 (+23:59 was a 500).
    return value.astimezone(UTC)


DueAt = Annotated[
    AwareDatetime,
    BeforeValidator(_due_at),
    AfterValidator(_in_utc),
    WithJsonSchema(
        {
            "type": "string",
            "format": "date-time",
            "pattern": DUE_AT_PATTERN,
            "examples": ["2026-12-04T17:00:00Z"],
        },
        mode="validation",
    ),
]


def _json_integer(value: object) -> object:
    # What JSON Schema calls an integer: a number with no fraction (2 or 2.0, which api.routing
    # parses to a Decimal). Not `true`, which lax mode takes for 1, and not the string "2".
    if isinstance(value, bool | str):
        raise ValueError("must be a JSON integer")
    if isinstance(value, Decimal) and value.is_finite():
        # Looked at before int(): int(Decimal("1E+1000000")) is minutes of CPU, with the event loop stopped.
        if value and value.adjusted() > 18:
            raise ValueError("is far out of range")
        if value == value.to_integral_value():
            return int(value)
    return value


# JSON integers in a range. (The bounds go before the validator, or pydantic documents them as
# `ge`/`le` instead of JSON Schema's minimum/maximum.)
BatchSize = Annotated[int, Field(ge=1, le=200), BeforeValidator(_json_integer)]
ReclaimBatch = Annotated[int, Field(ge=1, le=1000), BeforeValidator(_json_integer)]
MAX_WAIT_S = 20  # the longest long poll of POST /leases
WaitSeconds = Annotated[int, Field(ge=0, le=MAX_WAIT_S), BeforeValidator(_json_integer)]

Timestamp = Annotated[
    datetime, PlainSerializer(lambda d: d.astimezone(UTC).isoformat(), return_type=str, when_used="json")
]


def encode_lease_token(item_id: UUID, lease_nonce: UUID) -> str:
    """The fencing token of one lease of one item: its id and the lease's random nonce.

    Unforgeable without reading the database: the nonce is 122 random bits drawn by the lease
    statement (gen_random_uuid), stored with the lease and never shown to anyone but the holder.
    """
    return base64.urlsafe_b64encode(item_id.bytes + lease_nonce.bytes).decode().rstrip("=")


# Matches no lease: gen_random_uuid() is version 4, never all zeros.
NO_LEASE = UUID(int=0)


def lease_nonce_for(item_id: UUID, token: str) -> UUID:
    """The nonce a token claims for item_id; NO_LEASE for a token that cannot be one of its leases
    (malformed, another item's, or the old epoch form), so the guard refuses it with 409."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError):
        return NO_LEASE
    if len(raw) != 32 or raw[:16] != item_id.bytes:
        return NO_LEASE
    return UUID(bytes=raw[16:])


LeaseToken = Annotated[
    str,
    StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]{1,64}$"),
    Field(description="The `lease_token` of your lease; refused (409) once the item has been leased again."),
]


# A keyset position: microseconds since the Unix epoch of the order's timestamp (created_at, or
# due_at for sort=due_at: years up to 2999, hence 17 digits), and the id. Every string of this
# form is a valid position (the items after it) in either order, so the pattern is the whole
# contract.
CURSOR_PATTERN = r"^[0-9]{1,17}-[0-9a-f]{32}$"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(created_at: datetime, item_id: UUID) -> str:
    return f"{(created_at - _EPOCH) // _MICROSECOND}-{item_id.hex}"


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The position of a cursor that matches CURSOR_PATTERN (the request model checks it)."""
    micros, item_id = cursor.split("-")
    return _EPOCH + int(micros) * _MICROSECOND, UUID(hex=item_id)


# An events cursor is the id of the last event of the page (an identity column: it only grows).
EVENT_CURSOR_PATTERN = r"^[1-9][0-9]{0,17}$"


def encode_event_cursor(event_id: int) -> str:
    return str(event_id)


def decode_event_cursor(cursor: str) -> int:
    """The position of a cursor that matches EVENT_CURSOR_PATTERN (the request model checks it)."""
    return int(cursor)


MatchDecision = Literal["MATCHED", "PARTIAL", "UNMATCHED"]
State = Literal["PENDING", "ASSIGNED", "RESOLVED", "QUARANTINED", "AWAITING_APPROVAL"]
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


MAX_CONTEXT_BYTES = 16 * 1024
MAX_CONTEXT_DEPTH = 32  # the context object itself is the first level


def _plain_json(value: Any, *, depth: int = 1) -> Any:
    """The context as plain JSON values: NUL-free text, numbers a double holds exactly, at most
    MAX_CONTEXT_DEPTH levels deep (checked on the way down, before any deeper recursion)."""
    if isinstance(value, dict | list) and depth > MAX_CONTEXT_DEPTH:
        raise ValueError(f"nested deeper than {MAX_CONTEXT_DEPTH} levels")
    if isinstance(value, dict):
        return {_storable(k): _plain_json(v, depth=depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_json(v, depth=depth + 1) for v in value]
    if isinstance(value, str):
        return _storable(value)
    if isinstance(value, Decimal):
        # api.routing parses JSON fractions as Decimal; a context is for reading, so a number is
        # kept as a double when it is one exactly, and refused (send it as a string) otherwise.
        as_float = float(value) if value.is_finite() else None
        if as_float is None or Decimal(repr(as_float)) != value:
            raise ValueError(f"the number {value} is not exactly a double; send it as a string")
        return as_float
    return value


def _stored_json(value: Any) -> str:
    if isinstance(value, dict):
        return (
            "{"
            + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_stored_json(v)}" for k, v in value.items())
            + "}"
        )
    if isinstance(value, list):
        return "[" + ",".join(_stored_json(v) for v in value) + "]"
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f")  # as jsonb keeps a number: 1e300 is 301 digits
    return json.dumps(value, ensure_ascii=False)


def stored_size(context: dict[str, Any]) -> int:
    """The bytes of a context as compact JSON with each number written out as PostgreSQL's jsonb
    keeps it: measured as stored, not as sent (110 times 1e300 is 620 bytes sent, 33 KB stored).
    jsonb's text adds a space after each separator, at most half as much again: under its CHECK."""
    return len(_stored_json(context).encode())


def _context_size(value: dict[str, Any]) -> dict[str, Any]:
    size = stored_size(value)
    if size > MAX_CONTEXT_BYTES:
        raise ValueError(f"at most {MAX_CONTEXT_BYTES} bytes of compact JSON as stored, got {size}")
    return value


NulFree = Annotated[str, StringConstraints(pattern=NO_NUL)]
# Recursive, so that the documented schema says what is accepted at every depth (no NUL in any
# key or string): the API fuzzer's valid examples are then exactly the accepted ones.
# A key that does not match the pattern is refused too (patternProperties alone would allow it).
_NO_OTHER_KEYS = Field(json_schema_extra={"additionalProperties": False})
ContextValue = TypeAliasType(
    "ContextValue",
    "NulFree | int | float | bool | list[ContextValue]"
    " | Annotated[dict[NulFree, ContextValue], _NO_OTHER_KEYS] | None",
)

Context = Annotated[
    dict[NulFree, ContextValue],
    _NO_OTHER_KEYS,
    BeforeValidator(_plain_json),
    AfterValidator(_context_size),
    Field(
        description="Facts for the reviewer (account, counterparty, value dates, links): any JSON"
        " object up to 16 KiB as compact JSON, each number counted as stored (written out in full:"
        " 1e300 counts 301 bytes), nested at most 32 levels. Stored as given and returned with the"
        " item; part of the idempotency comparison. Shown as text, never as HTML.",
        examples=[{"account": "ACME-EUR-001", "counterparty": "Globex", "value_date": "2026-11-30"}],
    ),
]


class ItemIn(Strict):
    idempotency_key: Text200
    ledger_entity: Text200
    variance_amount: Money
    match_decision: MatchDecision
    source_hash: Text200
    trace_id: UUID | None = None
    context: Context | None = None
    due_at: DueAt | None = Field(
        default=None,
        description="The deadline. Absent or null: created_at plus the SLA tier of abs(variance_amount)"
        " (REVIEW_QUEUE_SLA_TIERS). Part of the idempotency comparison only when given.",
    )


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


class RevisionIn(Strict):
    variance_amount: Money
    source_hash: Text200 = Field(description="Of the new figures; a revision is idempotent on it.")
    match_decision: MatchDecision | None = Field(default=None, description="Unchanged when omitted.")


class RevisionOut(BaseModel):
    outcome: Literal["revised", "unchanged", "superseded"] = Field(
        description="`revised`: applied now; `unchanged`: the item already has this source_hash (a"
        " retry); `superseded`: the item had this source_hash before and has moved on (nothing changes)."
    )
    item: ItemOut


Subject = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$"),
    Field(description="A token's subject (a reviewer's name).", examples=["bob"]),
]
AdminReason = Annotated[Reason, StringConstraints(min_length=1)]


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
    min_amount: Threshold | None = Field(
        default=None, description="Items with abs(variance_amount) at least this (inclusive)."
    )
    max_amount: Threshold | None = Field(
        default=None, description="Items with abs(variance_amount) at most this (inclusive)."
    )
    q: Text200 | None = Field(
        default=None,
        description="Search: the item with this id or idempotency key, or the items of this"
        " ledger entity (exact matches).",
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
    event: Literal[
        "ENQUEUED",
        "LEASED",
        "RENEWED",
        "RELEASED",
        "RECLAIMED",
        "RESOLVED",
        "QUARANTINED",
        "REQUEUED",
        "REOPENED",
        "SUBMITTED_FOR_APPROVAL",
        "APPROVED",
        "REJECTED",
        "REVISED",
        "REASSIGNED",
    ]
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


class DecisionOut(BaseModel):
    event: EventOut = Field(
        description="RESOLVED, SUBMITTED_FOR_APPROVAL, APPROVED or REJECTED, with its details"
        " (resolution, note, reason, approval_threshold, ...)."
    )
    item: ItemOut = Field(description="The item as it is now (its state tells what became of a proposal).")


class DecisionsPage(BaseModel):
    decisions: list[DecisionOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last page.")


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


class RejectIn(Strict):
    reason: Annotated[Reason, StringConstraints(min_length=1)] = Field(
        description="Why the proposal is rejected; kept in the REJECTED event with the proposal."
    )
    lease_token: LeaseToken | None = None


class ResolutionCodeIn(Strict):
    label: Text200
    description: Annotated[
        str, StringConstraints(max_length=2000, pattern=NO_NUL), AfterValidator(_storable)
    ] = ""
    requires_note: StrictBool = False  # `0` and `"true"` are a 422, as the schema says
    approval_threshold: Threshold | None = Field(
        default=None,
        description="A completion with abs(variance_amount) at or above it needs an approver; null: never.",
    )
    active: StrictBool = True


class ResolutionCodeOut(BaseModel):
    code: str
    label: str
    description: str
    requires_note: bool
    approval_threshold: Threshold | None
    active: bool
    updated_at: Timestamp
    effective_approval_threshold: Threshold | None = Field(
        description="From which abs(variance_amount) a completion with this code needs an approver:"
        " the lower of its approval_threshold and the catalogue's materiality_threshold"
        " (GET /resolutions/policy)."
    )

    model_config = ConfigDict(from_attributes=True)


class ResolutionsOut(BaseModel):
    resolutions: list[ResolutionCodeOut]


class ResolutionPolicyIn(Strict):
    materiality_threshold: Threshold = Field(
        description="A completion with abs(variance_amount) at or above it needs an approver, whatever"
        " its code, unless the code's own approval_threshold is lower."
    )


class ResolutionPolicyOut(BaseModel):
    materiality_threshold: Threshold
    updated_at: Timestamp
    updated_by: str | None = Field(description="The admin who set it; null: the default of the migration.")

    model_config = ConfigDict(from_attributes=True)


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
    role: Literal["reviewer", "approver", "ingest", "auditor", "admin", "integration"]
    csrf_token: str | None = Field(
        description="Send it as X-CSRF-Token with every write made with the session cookie; "
        "null when the caller used a bearer token."
    )
    lease_s: float = Field(description="Lease duration (REVIEW_QUEUE_LOCK_TIMEOUT_MS) in seconds.")
    idle_release_s: int = Field(description="REVIEW_QUEUE_UI_IDLE_RELEASE_S: the desk releases idle work.")
    max_wait_s: int = Field(description="The largest wait_s of POST /leases.")
    release_cooldown_s: int = Field(
        description="REVIEW_QUEUE_RELEASE_COOLDOWN_S: an item you release goes to others for this long."
    )


# ---------------------------------------------------------------------------------------------
# The change feed and webhooks (issue 27, docs/integrations.md)
# ---------------------------------------------------------------------------------------------

# A feed position, opaque: 32 hex digits (db/feed.Position.encode). Every string of the pattern is a
# valid position, so the pattern is the whole contract.
FEED_CURSOR_PATTERN = r"^[0-9a-f]{16}[0-7][0-9a-f]{15}$"
FeedCursor = Annotated[
    str,
    StringConstraints(pattern=FEED_CURSOR_PATTERN),
    Field(examples=["00000000000002e1000000000000a3f0"]),
]
EVENT_NAMES = (
    "ENQUEUED", "LEASED", "RENEWED", "RELEASED", "RECLAIMED", "RESOLVED", "QUARANTINED", "REQUEUED",
    "REOPENED", "SUBMITTED_FOR_APPROVAL", "APPROVED", "REJECTED", "REVISED", "REASSIGNED",
)  # fmt: skip
_ONE_EVENT = "(" + "|".join(EVENT_NAMES) + ")"
EVENT_LIST_PATTERN = f"^{_ONE_EVENT}(,{_ONE_EVENT})*$"
MAX_FEED_LIMIT = 500


class FeedQuery(Strict):
    after: FeedCursor | None = Field(
        default=None,
        description="`next_cursor` (or an event's `cursor`) of an earlier answer; absent: the start.",
    )
    limit: int = Field(default=100, ge=1, le=MAX_FEED_LIMIT)
    types: str | None = Field(
        default=None,
        pattern=EVENT_LIST_PATTERN,
        description="Only these events, comma-separated (`RESOLVED,APPROVED`); the cursor still moves"
        " over the others.",
    )
    # A query parameter is text: no JSON-integer validator here, the bounds are the contract.
    wait_s: int = Field(
        default=0, ge=0, le=MAX_WAIT_S, description="When nothing new is there, wait up to this long for it."
    )


class FeedEventOut(EventOut):
    item: ItemOut = Field(description="The item as it is now (the same shape as GET /items/{id}).")
    cursor: FeedCursor = Field(description="Read on `after` it to get the events that follow this one.")

    @classmethod
    def of(cls, event: "FeedEvent") -> "FeedEventOut":
        """A feed entry as GET /events and the webhooks (their `data`) show it: the item without its
        lease token, whoever reads."""
        return cls(
            id=event.id,
            item_id=event.item_id,
            event=event.event,
            actor=event.actor,
            at=event.at,
            lease_epoch=event.lease_epoch,
            trace_id=event.trace_id,
            details=event.details,
            item=ItemOut.of(event.item),
            cursor=event.cursor.encode(),
        )


class FeedOut(BaseModel):
    events: list[FeedEventOut]
    next_cursor: FeedCursor = Field(
        description="Pass as `after` for what comes next; the same as `after` when nothing was new."
    )


WEBHOOK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
WEBHOOK_TYPES = tuple("item." + name.lower() for name in EVENT_NAMES)
WebhookType = Literal[
    "item.enqueued", "item.leased", "item.renewed", "item.released", "item.reclaimed", "item.resolved",
    "item.quarantined", "item.requeued", "item.reopened", "item.submitted_for_approval", "item.approved",
    "item.rejected", "item.revised", "item.reassigned",
]  # fmt: skip
# What a subscription gets when it names no types: the decisions and what undoes or blocks them.
DEFAULT_WEBHOOK_TYPES: tuple[str, ...] = (
    "item.resolved", "item.approved", "item.rejected", "item.reopened", "item.quarantined",
    "item.submitted_for_approval", "item.requeued", "item.revised",
)  # fmt: skip
# http(s), a host name or an IPv4 address (an IPv6 receiver needs a name), an optional port
# (1-65535), then printable ASCII.
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
WEBHOOK_URL_PATTERN = (
    r"^https?://[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
    rf"(:{_PORT})?([/?][!-~]*)?$"
)
# whsec_ and the base64 of 24 to 64 bytes (Standard Webhooks).
WEBHOOK_SECRET_PATTERN = r"^whsec_([A-Za-z0-9+/]{4}){8,21}([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"  # noqa: S105


class WebhookIn(Strict):
    url: Annotated[str, StringConstraints(max_length=2000, pattern=WEBHOOK_URL_PATTERN)] = Field(
        description="Where to POST: https (http only with REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP=1); never a"
        " private, loopback or link-local address unless REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS allows it"
        " (checked at each delivery). Redirects are not followed."
    )
    events: list[WebhookType] | None = Field(
        default=None,
        min_length=1,
        max_length=len(WEBHOOK_TYPES),
        description="The types to deliver; absent or null: " + ", ".join(DEFAULT_WEBHOOK_TYPES) + ".",
    )
    secret: Annotated[str, StringConstraints(pattern=WEBHOOK_SECRET_PATTERN)] | None = Field(
        default=None,
        description="`whsec_` and base64 of 24-64 bytes. Absent: a new subscription gets one made for"
        " it, returned once in this answer; an existing one keeps its own.",
    )
    active: StrictBool = Field(default=True, description="`false` stops deliveries; the cursor stays.")


class WebhookOut(BaseModel):
    name: str
    url: str
    events: list[str]
    active: bool
    status: Literal["ok", "retrying", "failing", "disabled"] = Field(
        description="`retrying`: the event after `cursor` failed and is retried with backoff; `failing`:"
        " retrying gave up (REVIEW_QUEUE_WEBHOOK_GIVE_UP_H), POST .../redeliver resumes; `disabled`:"
        " `active` is false (or the receiver answered 410 Gone: `disabled_reason`)."
    )
    disabled_reason: str | None
    cursor: FeedCursor = Field(description="Every event up to this feed position has been delivered.")
    attempts: int = Field(description="Failed attempts at the event after `cursor`.")
    failing_since: Timestamp | None
    next_attempt_at: Timestamp
    last_error: str | None
    created_at: Timestamp
    updated_at: Timestamp


class WebhookPutOut(WebhookOut):
    secret: str | None = Field(
        description="The secret made for a new subscription created without one: shown here once,"
        " never again. Null otherwise."
    )


class WebhooksOut(BaseModel):
    webhooks: list[WebhookOut]


class DeliveryQuery(Strict):
    status: Literal["delivered", "failed"] | None = Field(default=None, description="Only these attempts.")
    limit: int = Field(default=50, ge=1, le=200)


class DeliveryOut(BaseModel):
    id: int
    event_id: int
    webhook_id: str = Field(description="The `webhook-id` header: the same on every attempt at the event.")
    type: str
    attempt: int = Field(description="1 for the first attempt at this event, 2 for its first retry, ...")
    attempted_at: Timestamp
    outcome: Literal["delivered", "failed"]
    status_code: int | None = Field(description="The receiver's HTTP status; null when none came back.")
    latency_ms: float | None
    error: str | None = Field(description="Why it failed: the status, a timeout, a refused address, ...")

    model_config = ConfigDict(from_attributes=True)


class DeliveriesOut(BaseModel):
    deliveries: list[DeliveryOut] = Field(description="The latest attempts, newest first.")


class RedeliverIn(Strict):
    from_cursor: FeedCursor | None = Field(
        default=None,
        description="Deliver again everything after this feed position (back to replay, or on to skip);"
        " absent: carry on from `cursor`, where it stopped.",
    )


class OidcProviderOut(BaseModel):
    """Whether the desk offers sign-in with the company's identity provider (OpenID Connect)."""

    enabled: bool
    provider_name: str | None = Field(
        description='For the desk\'s "Sign in with <provider_name>"; null when OIDC sign-in is off.'
    )
    login_url: str | None = Field(description="Where the browser goes to sign in; null when off.")


class SignOutOut(BaseModel):
    end_session_url: str = Field(
        description="The provider's end-session endpoint (RP-Initiated Logout): send the browser there"
        " to end the provider's session too."
    )


# --- Reports (docs/reports.md) -------------------------------------------------------------

# A calendar date as written in ISO 8601, years 1970-2999 (pydantic alone would take Unix seconds).
ISO_DATE_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])$"
_ISO_DATE = re.compile(ISO_DATE_PATTERN)


def _iso_date(value: object) -> object:
    if not isinstance(value, str) or not _ISO_DATE.fullmatch(value):
        raise ValueError("must be a date written YYYY-MM-DD, years 1970-2999, e.g. 2026-11-02")
    return value


IsoDate = Annotated[
    date,
    BeforeValidator(_iso_date),
    WithJsonSchema(
        {"type": "string", "format": "date", "pattern": ISO_DATE_PATTERN, "examples": ["2026-11-02"]},
        mode="validation",
    ),
]

TIME_ZONE_PATTERN = r"^[A-Za-z][A-Za-z0-9_+-]{0,31}(/[A-Za-z0-9_+-]{1,32}){0,2}$"
# In Python's list of IANA names, but not zones: the host's own setting, and the placeholder zone.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@functools.cache
def time_zones() -> frozenset[str]:
    """The IANA time zone names the reports take (Python's tz database; PostgreSQL has its own)."""
    return frozenset(zoneinfo.available_timezones() - _NOT_ZONES) | {"UTC"}


def _time_zone(value: str) -> str:
    if value not in time_zones():
        raise ValueError("must be an IANA time zone name, such as Europe/Berlin or UTC")
    return value


TimeZone = Annotated[
    str,
    StringConstraints(pattern=TIME_ZONE_PATTERN, max_length=64),
    AfterValidator(_time_zone),
    Field(examples=["Europe/Berlin"]),
]


class PeriodQuery(Strict):
    from_: IsoDate = Field(
        alias="from", description="The first day of the period, a local date in `tz` (inclusive)."
    )
    to: IsoDate = Field(description="The day after the period's last day, a local date in `tz` (exclusive).")
    tz: TimeZone = Field(
        default="UTC",
        description="IANA time zone of the dates and the buckets: each day runs from local midnight to"
        " local midnight (23 or 25 hours across a DST change).",
    )


class BucketQuery(PeriodQuery):
    bucket: Literal["day", "week"] = Field(
        default="day",
        description="`week`: ISO weeks, Monday to Monday; `from` and `to` must then be Mondays.",
    )


class SlaQuery(BucketQuery):
    ledger_entity: Text200 | None = Field(default=None, description="Only this ledger entity's items.")


class BacklogQuery(PeriodQuery):
    bucket: Literal["day"] = Field(default="day", description="The backlog is measured at each day's end.")


class DecisionsQuery(PeriodQuery):
    pass


# Exact decimals as strings: a ratio to 4 places, seconds to the microsecond.
Attainment = Annotated[
    Decimal,
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[01]\.[0-9]{4}$", "examples": ["0.9375"]}),
]
Seconds = Annotated[
    Decimal,
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "pattern": r"^[0-9]+\.[0-9]{6}$", "examples": ["754.000000"]}),
]


class ReportOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: date = Field(alias="from")
    to: date
    tz: str
    bucket: Literal["day", "week"]
    as_of: Timestamp = Field(description="The database's clock when the report was computed.")


class SlaFiguresOut(BaseModel):
    fell_due: int = Field(description="Items whose due_at is in the bucket and has passed (as_of).")
    on_time: int = Field(description="... resolved at their due_at: a decision was in effect then.")
    late: int = Field(description="... not resolved at their due_at, resolved now.")
    open_past_due: int = Field(description="... not resolved at their due_at, not resolved now.")
    attainment: Attainment | None = Field(
        description="on_time / fell_due, to 4 decimal places (half up); null when nothing fell due."
    )


class SlaBucketOut(SlaFiguresOut):
    start: date = Field(description="The bucket's first day (a Monday for weeks).")


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
    released: int = Field(description="Leases the holder handed back (an admin's override release is not).")
    decisions: int = Field(description="All of the above.")
    median_lease_to_decision_s: Seconds | None = Field(
        description="Nearest-rank median of the time from the lease each decision ended to the decision."
    )
    p90_lease_to_decision_s: Seconds | None = Field(description="Nearest-rank 90th percentile of the same.")


class ThroughputOut(ReportOut):
    reviewer: str | None = Field(
        description="Set when the rows are the caller's own only (roles reviewer and approver)."
    )
    rows: list[ThroughputRowOut] = Field(description="One per bucket and reviewer with a decision.")


class BacklogPointOut(BaseModel):
    start: date = Field(description="The day.")
    at: Timestamp = Field(description="Its end (the next local midnight), or as_of for the day in progress.")
    open: int = Field(description="Items open at `at`.")
    by_age: dict[str, int] = Field(description="... by age since enqueue: 0-1d, 1-3d, 3-7d, 7-30d, 30d+.")


class BacklogOut(ReportOut):
    bands: list[str]
    points: list[BacklogPointOut] = Field(description="One per day that has begun.")


class DecisionRowOut(BaseModel):
    """One decision, as a line of the NDJSON export (and a row of the CSV export, same order)."""

    event_id: int
    item_id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Money = Field(description="The figures the decision was made on.")
    match_decision: str
    resolution: str
    note: str | None
    resolved_by: str
    resolved_at: Timestamp
    approved_by: str | None
    approved_at: Timestamp | None
    due_at: Timestamp
    on_time: bool = Field(description="resolved_at <= due_at.")
    reopened_at: Timestamp | None = Field(description="When the decision was reopened, if it was.")

    model_config = ConfigDict(from_attributes=True)
