"""Webhook subscriptions and their delivery attempts: the statements of the API and of the deliverer.

A subscription delivers strictly in feed order: the event after its cursor blocks it until that
event is delivered or retrying gives up (head-of-line blocking, docs/integrations.md). A deliverer
claims a subscription in one short transaction (FOR UPDATE SKIP LOCKED, so several deliverers
never pick the same row and never wait on each other), sends without any transaction open, and
writes each outcome in another short transaction guarded by the claim's nonce: a deliverer whose
claim lapsed (it was slow, or killed) and was taken over changes nothing. A claim held by no
transaction holds no transaction id, so it never holds the feed (or the audit sealer) back.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal
from uuid import UUID

from sqlalchemy import Interval, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import Text

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
    " s.attempts, s.failing_since, s.gave_up_at, s.next_attempt_at, s.last_error, s.created_at, s.updated_at"
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
    return bool(row[-1]), _subscription(row[:-1])


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


_RECORD = text(
    "INSERT INTO webhook_delivery"
    " (subscription, event_id, webhook_id, type, attempt, outcome, status_code, latency_ms, error)"
    " SELECT :name, :event_id, :webhook_id, :type, attempts + 1, :outcome, :status_code, :latency_ms, :error"
    " FROM webhook_subscription WHERE name = :name AND claim_nonce = :nonce"
)

# Delivered: the cursor moves past the event, the retry state starts over, the claim is extended.
_DELIVERED = text(
    "UPDATE webhook_subscription SET cursor_xid = CAST(:xid AS xid8), cursor_id = :id, attempts = 0,"
    " failing_since = NULL, last_error = NULL, claim_expires_at = now() + :hold"
    " WHERE name = :name AND claim_nonce = :nonce"
).bindparams(bindparam("hold", type_=Interval))


@dataclass(frozen=True, slots=True)
class Outcome:
    event_id: int
    webhook_id: str
    type: str
    status_code: int | None
    latency_ms: float | None
    error: str | None


async def delivered(
    conn: AsyncConnection, held: Claim, *, outcome: Outcome, cursor: Position, hold: timedelta
) -> bool:
    """Record a delivery and move the cursor to `cursor`; False when the claim is no longer ours."""
    await _record(conn, held, outcome, "delivered")
    result = await conn.execute(
        _DELIVERED,
        {
            "name": held.subscription.name,
            "nonce": held.nonce,
            "xid": str(cursor.xid),
            "id": cursor.id,
            "hold": hold,
        },
    )
    return result.rowcount == 1


async def _record(conn: AsyncConnection, held: Claim, outcome: Outcome, kind: str) -> None:
    await conn.execute(
        _RECORD,
        {
            "name": held.subscription.name,
            "nonce": held.nonce,
            "event_id": outcome.event_id,
            "webhook_id": outcome.webhook_id,
            "type": outcome.type,
            "outcome": kind,
            "status_code": outcome.status_code,
            "latency_ms": outcome.latency_ms,
            "error": outcome.error,
        },
    )


_ADVANCE = text(
    "UPDATE webhook_subscription SET cursor_xid = CAST(:xid AS xid8), cursor_id = :id,"
    " claim_expires_at = now() + :hold WHERE name = :name AND claim_nonce = :nonce"
).bindparams(bindparam("hold", type_=Interval))


async def advance(conn: AsyncConnection, held: Claim, *, cursor: Position, hold: timedelta) -> bool:
    """Move the cursor over positions that serve none of the subscription's types."""
    result = await conn.execute(
        _ADVANCE,
        {
            "name": held.subscription.name,
            "nonce": held.nonce,
            "xid": str(cursor.xid),
            "id": cursor.id,
            "hold": hold,
        },
    )
    return result.rowcount == 1


# Failed: try again after `retry_in`, or give up once the event has failed for `give_up`; the claim
# is let go either way. A 410 Gone disables the subscription instead.
_FAILED = text(
    """
    UPDATE webhook_subscription SET
        attempts = attempts + 1,
        failing_since = coalesce(failing_since, now()),
        gave_up_at = CASE WHEN NOT :gone AND coalesce(failing_since, now()) <= now() - :give_up
                          THEN now() END,
        active = active AND NOT :gone,
        disabled_reason = CASE WHEN :gone THEN :error ELSE disabled_reason END,
        next_attempt_at = now() + :retry_in, last_error = :error,
        claimed_by = NULL, claim_nonce = NULL, claim_expires_at = NULL
    WHERE name = :name AND claim_nonce = :nonce
    RETURNING gave_up_at IS NOT NULL
    """
).bindparams(bindparam("give_up", type_=Interval), bindparam("retry_in", type_=Interval))


async def failed(
    conn: AsyncConnection,
    held: Claim,
    *,
    outcome: Outcome,
    retry_in: timedelta,
    give_up: timedelta,
    gone: bool = False,
) -> Literal["retrying", "gave_up", "disabled", "lost"]:
    """Record a failed attempt. `gone` (the receiver answered 410) disables the subscription."""
    await _record(conn, held, outcome, "failed")
    row = (
        await conn.execute(
            _FAILED,
            {
                "name": held.subscription.name,
                "nonce": held.nonce,
                "gone": gone,
                "give_up": give_up,
                "retry_in": retry_in,
                "error": outcome.error,
            },
        )
    ).first()
    if row is None:
        return "lost"
    if gone:
        return "disabled"
    return "gave_up" if row[0] else "retrying"


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
