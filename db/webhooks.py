"""Webhook subscriptions and their delivery attempts: the statements of the API and of the deliverer.

A subscription delivers in feed order, and each item's events in their own order: an event that
fails holds back its own item's later events only (webhook_held), while the cursor, and every
other item, move on (docs/integrations.md). A deliverer
claims a subscription in one short transaction (FOR UPDATE SKIP LOCKED, so several deliverers
never pick the same row and never wait on each other), sends without any transaction open, and
writes each outcome in another short transaction guarded by the claim's nonce: a deliverer whose
claim lapsed (it was slow, or killed) and was taken over changes nothing. A claim held by no
transaction holds no transaction id, so it never holds the feed (or the audit sealer) back.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from sqlalchemy import Interval, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import BigInteger, Text

from db.feed import Position

Status = Literal["ok", "retrying", "failing", "disabled"]
# The attempts kept per subscription for GET /webhooks/{name}/deliveries; older ones are pruned.
KEEP_ATTEMPTS = 1000


@dataclass(frozen=True, slots=True)
class Subscription:
    name: str
    url: str
    event_types: list[str]
    active: bool
    disabled_reason: str | None
    cursor: Position
    attempts: int
    failing_since: datetime | None
    gave_up_at: datetime | None
    next_attempt_at: datetime
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    held_items: int = 0  # items whose first undelivered event waits for a retry

    @property
    def status(self) -> Status:
        if not self.active:
            return "disabled"
        if self.gave_up_at is not None:
            return "failing"
        return "retrying" if self.attempts else "ok"


@dataclass(frozen=True, slots=True)
class Claim:
    """A subscription one deliverer holds, with what it needs to send."""

    subscription: Subscription
    nonce: UUID
    secret: bytes  # encrypted
    claimed_at: datetime  # the database's clock: webhook-timestamp is counted from it


@dataclass(frozen=True, slots=True)
class Attempt:
    id: int
    event_id: int
    webhook_id: str
    type: str
    attempt: int
    attempted_at: datetime
    outcome: Literal["delivered", "failed"]
    status_code: int | None
    latency_ms: float | None
    error: str | None


_FIELDS = (
    "s.name, s.url, s.event_types, s.active, s.disabled_reason, s.cursor_xid::text, s.cursor_id,"
    " s.attempts, s.failing_since, s.gave_up_at, s.next_attempt_at, s.last_error, s.created_at, s.updated_at,"
    " (SELECT count(DISTINCT h.item_id) FROM webhook_held h WHERE h.subscription = s.name)"
)


def _subscription(row: Sequence[object]) -> Subscription:
    (
        name,
        url,
        types,
        active,
        reason,
        xid,
        id_,
        attempts,
        since,
        gave_up,
        next_at,
        error,
        created,
        updated,
        held,
    ) = row
    return Subscription(
        name=str(name),
        url=str(url),
        event_types=list(types),  # type: ignore[call-overload]
        active=bool(active),
        disabled_reason=reason,  # type: ignore[arg-type]
        cursor=Position(int(str(xid)), int(id_)),  # type: ignore[call-overload]
        attempts=int(attempts),  # type: ignore[call-overload]
        failing_since=since,  # type: ignore[arg-type]
        gave_up_at=gave_up,  # type: ignore[arg-type]
        next_attempt_at=next_at,  # type: ignore[arg-type]
        last_error=error,  # type: ignore[arg-type]
        created_at=created,  # type: ignore[arg-type]
        updated_at=updated,  # type: ignore[arg-type]
        held_items=int(held),  # type: ignore[call-overload]
    )


# The feed's head, below xmin: a new subscription delivers what commits from now on. Every PUT
# is an admin's hand on it: the retry state starts over and it is tried at once.
_PUT = text(
    f"""
    WITH head AS (
        SELECT coalesce(max(xid), '0'::xid8) AS xid FROM review_queue_event
        WHERE xid < pg_snapshot_xmin(pg_current_snapshot())
    ), head_id AS (
        SELECT head.xid,
               coalesce((SELECT max(e.id) FROM review_queue_event e WHERE e.xid = head.xid), 0) AS id
        FROM head
    ), saved AS (
        INSERT INTO webhook_subscription AS s (name, url, event_types, secret, active, cursor_xid, cursor_id)
        SELECT :name, :url, :types, :secret, :active, head_id.xid, head_id.id FROM head_id
        ON CONFLICT (name) DO UPDATE SET
            url = EXCLUDED.url, event_types = EXCLUDED.event_types, active = EXCLUDED.active,
            secret = CASE WHEN :replace_secret THEN EXCLUDED.secret ELSE s.secret END,
            disabled_reason = CASE WHEN EXCLUDED.active THEN NULL ELSE s.disabled_reason END,
            attempts = 0, failing_since = NULL, gave_up_at = NULL, next_attempt_at = now(),
            claimed_by = NULL, claim_nonce = NULL, claim_expires_at = NULL, updated_at = now()
        RETURNING s.*, (s.xmax = 0) AS created
    )
    SELECT {_FIELDS}, s.created FROM saved s
    """
).bindparams(bindparam("types", type_=ARRAY(Text)))


async def put_subscription(
    conn: AsyncConnection,
    *,
    name: str,
    url: str,
    event_types: Sequence[str],
    secret: bytes,
    replace_secret: bool,
    active: bool,
) -> tuple[bool, Subscription]:
    """Create (True) or update (False) a subscription. `secret` (encrypted) is stored when the row
    is new or `replace_secret` is set; otherwise the stored one is kept."""
    row = (
        await conn.execute(
            _PUT,
            {
                "name": name,
                "url": url,
                "types": list(event_types),
                "secret": secret,
                "replace_secret": replace_secret,
                "active": active,
            },
        )
    ).one()
    await conn.execute(_HELD_DUE_NOW, {"name": name})
    return bool(row[-1]), _subscription(row[:-1])


# An admin's hand on a subscription: each held item's first event is tried at once, from scratch.
_HELD_DUE_NOW = text(
    "UPDATE webhook_held SET attempts = 0, failing_since = NULL, next_attempt_at = now()"
    " WHERE subscription = :name AND next_attempt_at IS NOT NULL"
)
# A redelivery from a position replays (or skips) everything after it, held events included.
_HELD_DROPPED = text("DELETE FROM webhook_held WHERE subscription = :name")

_LIST = text(f"SELECT {_FIELDS} FROM webhook_subscription s ORDER BY s.name")
_GET = text(f"SELECT {_FIELDS} FROM webhook_subscription s WHERE s.name = :name")


async def list_subscriptions(conn: AsyncConnection) -> list[Subscription]:
    return [_subscription(r) for r in await conn.execute(_LIST)]


async def get_subscription(conn: AsyncConnection, *, name: str) -> Subscription | None:
    row = (await conn.execute(_GET, {"name": name})).first()
    return None if row is None else _subscription(row)


# Resume: from `from` when given (back to replay, or on to skip), else where it stopped; the claim
# of a deliverer still holding the old state is void from here on.
_REDELIVER = text(
    f"""
    UPDATE webhook_subscription s SET
        cursor_xid = coalesce(CAST(:xid AS xid8), s.cursor_xid), cursor_id = coalesce(:id, s.cursor_id),
        attempts = 0, failing_since = NULL, gave_up_at = NULL, next_attempt_at = now(),
        claimed_by = NULL, claim_nonce = NULL, claim_expires_at = NULL, updated_at = now()
    WHERE s.name = :name
    RETURNING {_FIELDS}
    """
)


async def redeliver(conn: AsyncConnection, *, name: str, after: Position | None) -> Subscription | None:
    params = {
        "name": name,
        "xid": None if after is None else str(after.xid),
        "id": None if after is None else after.id,
    }
    await conn.execute(_HELD_DUE_NOW if after is None else _HELD_DROPPED, {"name": name})
    row = (await conn.execute(_REDELIVER, params)).first()
    return None if row is None else _subscription(row)


_ATTEMPTS = text(
    "SELECT id, event_id, webhook_id, type, attempt, attempted_at, outcome, status_code, latency_ms, error"
    " FROM webhook_delivery WHERE subscription = :name"
    " AND (CAST(:outcome AS text) IS NULL OR outcome = :outcome)"
    " ORDER BY id DESC LIMIT :limit"
)


async def list_attempts(
    conn: AsyncConnection, *, name: str, outcome: str | None, limit: int
) -> list[Attempt]:
    """The latest attempts, newest first, on ix_webhook_delivery_subscription_id."""
    rows = await conn.execute(_ATTEMPTS, {"name": name, "outcome": outcome, "limit": limit})
    return [Attempt(*r) for r in rows]


# ---------------------------------------------------------------------------------------------
# The deliverer's statements
# ---------------------------------------------------------------------------------------------

_CLAIM = text(
    f"""
    UPDATE webhook_subscription s SET
        claimed_by = :deliverer, claim_nonce = gen_random_uuid(), claim_expires_at = now() + :hold
    FROM (
        SELECT name FROM webhook_subscription
        WHERE active AND gave_up_at IS NULL AND next_attempt_at <= now()
          AND (claim_expires_at IS NULL OR claim_expires_at < now())
        ORDER BY next_attempt_at
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    ) AS due
    WHERE s.name = due.name
    RETURNING {_FIELDS}, s.claim_nonce, s.secret, clock_timestamp()
    """
).bindparams(bindparam("hold", type_=Interval))


async def claim(conn: AsyncConnection, *, deliverer: str, hold: timedelta) -> Claim | None:
    """The subscription due first that nobody holds, now held by `deliverer` for `hold`."""
    row = (await conn.execute(_CLAIM, {"deliverer": deliverer, "hold": hold})).first()
    if row is None:
        return None
    return Claim(_subscription(row[:-3]), row[-3], bytes(row[-2]), row[-1])


@dataclass(frozen=True, slots=True)
class Outcome:
    event_id: int
    webhook_id: str
    type: str
    status_code: int | None
    latency_ms: float | None
    error: str | None


@dataclass(frozen=True, slots=True)
class HeldEvent:
    """An event the cursor has passed, waiting in its item's line; the first of each item carries
    the retry state."""

    event_id: int
    item_id: UUID
    attempts: int
    due: bool  # the item's first event, and its retry is due


_HELD_ITEMS = text("SELECT DISTINCT item_id FROM webhook_held WHERE subscription = :name")


async def held_items(conn: AsyncConnection, *, name: str) -> set[UUID]:
    return {row[0] for row in await conn.execute(_HELD_ITEMS, {"name": name})}


# The held items whose first event is due (the longest waiting first), each with its whole line.
_DUE = text(
    """
    SELECT h.event_id, h.item_id, h.attempts, h.next_attempt_at IS NOT NULL
    FROM webhook_held h
    WHERE h.subscription = :name AND h.item_id IN (
        SELECT item_id FROM webhook_held
        WHERE subscription = :name AND next_attempt_at <= now()
        ORDER BY next_attempt_at LIMIT :limit)
    ORDER BY h.item_id, h.event_id
    """
)


async def due(conn: AsyncConnection, *, name: str, limit: int) -> list[HeldEvent]:
    """Up to `limit` held items due for a retry: their events in order, item by item."""
    rows = await conn.execute(_DUE, {"name": name, "limit": limit})
    return [HeldEvent(int(r[0]), r[1], int(r[2]), bool(r[3])) for r in rows]


@dataclass
class Settlement:
    """What one stretch of sending changed, written in one transaction (`settle`): the attempts,
    the events that failed or now wait behind one, the held events delivered, the cursor."""

    attempts: list[tuple[Outcome, bool, int]] = field(default_factory=list)  # (what, delivered, attempt)
    failed: list[tuple[int, UUID, int, timedelta, str | None]] = field(default_factory=list)
    waiting: list[tuple[int, UUID]] = field(default_factory=list)  # behind a failed event of its item
    released: list[int] = field(default_factory=list)  # held events now delivered
    cursor: Position | None = None
    last_error: str | None = None

    def __len__(self) -> int:
        return len(self.attempts) + len(self.waiting) + (self.cursor is not None)

    def clear(self) -> None:
        self.attempts, self.failed, self.waiting, self.released = [], [], [], []
        self.cursor, self.last_error = None, None


_MINE = text("SELECT 1 FROM webhook_subscription WHERE name = :name AND claim_nonce = :nonce FOR UPDATE")
_RECORD = text(
    "INSERT INTO webhook_delivery"
    " (subscription, event_id, webhook_id, type, attempt, outcome, status_code, latency_ms, error)"
    " VALUES (:name, :event_id, :webhook_id, :type, :attempt, :outcome, :status_code, :latency_ms, :error)"
)
# A failed event: the first of its item's line, retried after `retry_in`; failing since its first failure.
_FAILED = text(
    """
    INSERT INTO webhook_held AS h
        (subscription, event_id, item_id, attempts, failing_since, next_attempt_at, last_error)
    VALUES (:name, :event_id, :item_id, :attempts, now(), now() + :retry_in, :error)
    ON CONFLICT (subscription, event_id) DO UPDATE SET
        attempts = EXCLUDED.attempts, failing_since = coalesce(h.failing_since, now()),
        next_attempt_at = EXCLUDED.next_attempt_at, last_error = EXCLUDED.last_error
    """
).bindparams(bindparam("retry_in", type_=Interval))
_WAITING = text(
    "INSERT INTO webhook_held (subscription, event_id, item_id) VALUES (:name, :event_id, :item_id)"
    " ON CONFLICT (subscription, event_id) DO NOTHING"
)
_RELEASED = text("DELETE FROM webhook_held WHERE subscription = :name AND event_id = ANY(:ids)").bindparams(
    bindparam("ids", type_=ARRAY(BigInteger))
)
# The subscription's retry state is its held events': the most attempts, the oldest failure (none
# held: it starts over). Retrying gives up once an event has failed for `give_up`.
_SETTLED = text(
    """
    WITH held AS (
        SELECT max(attempts) AS attempts, min(failing_since) AS since
        FROM webhook_held WHERE subscription = :name
    )
    UPDATE webhook_subscription s SET
        cursor_xid = coalesce(CAST(:xid AS xid8), s.cursor_xid), cursor_id = coalesce(:id, s.cursor_id),
        attempts = coalesce(held.attempts, 0), failing_since = held.since,
        last_error = CASE WHEN held.since IS NULL THEN NULL ELSE coalesce(:error, s.last_error) END,
        gave_up_at = CASE WHEN held.since <= now() - :give_up THEN now() END,
        claim_expires_at = now() + :hold
    FROM held
    WHERE s.name = :name AND s.claim_nonce = :nonce
    RETURNING s.gave_up_at IS NOT NULL
    """
).bindparams(bindparam("give_up", type_=Interval), bindparam("hold", type_=Interval))


async def settle(
    conn: AsyncConnection, held: Claim, done: Settlement, *, hold: timedelta, give_up: timedelta
) -> Literal["ok", "gave_up", "lost"]:
    """Write a stretch of outcomes, and extend the claim; "lost" (nothing written) when the claim is
    no longer ours, "gave_up" when an event has now failed for `give_up`."""
    name = held.subscription.name
    if (await conn.execute(_MINE, {"name": name, "nonce": held.nonce})).first() is None:
        return "lost"
    if done.attempts:
        await conn.execute(
            _RECORD,
            [
                {"name": name, "event_id": o.event_id, "webhook_id": o.webhook_id, "type": o.type,
                 "attempt": attempt, "outcome": "delivered" if ok else "failed",
                 "status_code": o.status_code, "latency_ms": o.latency_ms, "error": o.error}
                for o, ok, attempt in done.attempts
            ],
        )  # fmt: skip
    if done.released:
        await conn.execute(_RELEASED, {"name": name, "ids": done.released})
    if done.waiting:
        await conn.execute(_WAITING, [{"name": name, "event_id": e, "item_id": i} for e, i in done.waiting])
    if done.failed:
        await conn.execute(
            _FAILED,
            [
                {"name": name, "event_id": e, "item_id": i, "attempts": n, "retry_in": wait, "error": error}
                for e, i, n, wait, error in done.failed
            ],
        )
    cursor = done.cursor
    row = (
        await conn.execute(
            _SETTLED,
            {
                "name": name,
                "nonce": held.nonce,
                "xid": None if cursor is None else str(cursor.xid),
                "id": None if cursor is None else cursor.id,
                "error": done.last_error,
                "give_up": give_up,
                "hold": hold,
            },
        )
    ).one()
    return "gave_up" if row[0] else "ok"


# A 410 Gone disables the subscription (and lets the claim go).
_GONE = text(
    """
    UPDATE webhook_subscription SET active = false, disabled_reason = :error, last_error = :error,
        claimed_by = NULL, claim_nonce = NULL, claim_expires_at = NULL
    WHERE name = :name AND claim_nonce = :nonce
    """
)


async def gone(conn: AsyncConnection, held: Claim, *, error: str | None) -> None:
    await conn.execute(_GONE, {"name": held.subscription.name, "nonce": held.nonce, "error": error})


_RELEASE = text(
    "UPDATE webhook_subscription SET claimed_by = NULL, claim_nonce = NULL, claim_expires_at = NULL,"
    " next_attempt_at = now() + :later WHERE name = :name AND claim_nonce = :nonce"
).bindparams(bindparam("later", type_=Interval))


async def release(conn: AsyncConnection, held: Claim, *, later: timedelta) -> None:
    """Let the subscription go, to be looked at again after `later` (by any deliverer)."""
    await conn.execute(_RELEASE, {"name": held.subscription.name, "nonce": held.nonce, "later": later})


_PRUNE = text(
    "DELETE FROM webhook_delivery WHERE subscription = :name AND id < ("
    " SELECT id FROM webhook_delivery WHERE subscription = :name ORDER BY id DESC OFFSET :keep LIMIT 1)"
)


async def prune(conn: AsyncConnection, *, name: str, keep: int = KEEP_ATTEMPTS) -> None:
    await conn.execute(_PRUNE, {"name": name, "keep": keep - 1})


# ---------------------------------------------------------------------------------------------
# Gauges, read on every scrape
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeliveryGauges:
    lag_s: dict[str, float]  # active subscription -> age of its oldest undelivered event (0: none)
    failing: int  # subscriptions whose retrying gave up


# The first committed event after each active subscription's cursor of one of its types (on the
# (xid, id) index from the cursor): its age is how far the subscription trails.
_GAUGES = text(
    """
    SELECT s.name, s.gave_up_at IS NOT NULL,
           coalesce(extract(epoch FROM now() - (
               SELECT e.at FROM review_queue_event e
               WHERE (e.xid, e.id) > (s.cursor_xid, s.cursor_id)
                 AND 'item.' || lower(e.event) = ANY(s.event_types)
               ORDER BY e.xid, e.id LIMIT 1)), 0)
    FROM webhook_subscription s WHERE s.active ORDER BY s.name
    """
)


async def delivery_gauges(conn: AsyncConnection) -> DeliveryGauges:
    rows = (await conn.execute(_GAUGES)).all()
    return DeliveryGauges(lag_s={r[0]: float(r[2]) for r in rows}, failing=sum(1 for r in rows if r[1]))
