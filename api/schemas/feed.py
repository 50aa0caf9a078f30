"""The change feed and webhooks (issue 27, docs/integrations.md)."""

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from api.schemas.fields import MAX_WAIT_S, Strict, Timestamp
from api.schemas.items import EventOut, ItemOut
from db.vocabulary import EVENTS

if TYPE_CHECKING:  # for the annotations of `of` only: the schemas need no queue code to run
    from db.feed import FeedEvent


# A feed position, opaque: 32 hex digits (db/feed.Position.encode). Every string of the pattern is a
# valid position, so the pattern is the whole contract.
FEED_CURSOR_PATTERN = r"^[0-9a-f]{16}[0-7][0-9a-f]{15}$"
FeedCursor = Annotated[
    str,
    StringConstraints(pattern=FEED_CURSOR_PATTERN),
    Field(examples=["00000000000002e1000000000000a3f0"]),
]
_ONE_EVENT = "(" + "|".join(EVENTS) + ")"
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
    item: ItemOut = Field(
        description="The item as it stood right after this event (the same shape as GET /items/{id},"
        " never with a lease token): its state, resolution, note and amounts then, however it has moved"
        " on since; GET /items/{id} has it as it is now. An event written before the service kept this"
        " (`item_as_of` `now`) has its item as it is now."
    )
    item_as_of: Literal["event", "now"] = Field(
        description="`event`: `item` is as it stood right after this event; `now`: the event is older than"
        " that record (issue 42) and `item` is as it is now."
    )
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
            item_as_of=event.item_as_of,
            cursor=event.cursor.encode(),
        )


class FeedOut(BaseModel):
    events: list[FeedEventOut]
    next_cursor: FeedCursor = Field(
        description="Pass as `after` for what comes next; the same as `after` when nothing was new."
    )


WEBHOOK_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
WEBHOOK_TYPES = tuple("item." + name.lower() for name in EVENTS)
WebhookType = Literal[
    "item.enqueued", "item.leased", "item.renewed", "item.released", "item.reclaimed", "item.resolved",
    "item.quarantined", "item.requeued", "item.reopened", "item.submitted_for_approval", "item.approved",
    "item.rejected", "item.revised", "item.reassigned", "item.commented",
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
        description="`retrying`: an event failed and is retried with backoff (its item's later events"
        " wait behind it, other items flow: `held_items`); `failing`:"
        " retrying gave up (REVIEW_QUEUE_WEBHOOK_GIVE_UP_H), POST .../redeliver resumes; `disabled`:"
        " `active` is false (or the receiver answered 410 Gone: `disabled_reason`)."
    )
    disabled_reason: str | None
    cursor: FeedCursor = Field(
        description="Every event up to this feed position has been delivered, or waits in `held_items`."
    )
    attempts: int = Field(description="Failed attempts at the held event that has failed most often.")
    failing_since: Timestamp | None = Field(description="The first failure of the oldest held event.")
    held_items: int = Field(
        description="Items whose first undelivered event failed and waits for a retry: only their"
        " later events wait behind it (each item's events arrive in their own order)."
    )
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
