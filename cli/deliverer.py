"""The deliverer: reads the change feed for each webhook subscription and POSTs its events, at least once.

Supervised like the reclaimer (`review-queue deliverer`; `serve` runs one as a child; any number
may run): each pass claims one due subscription (db/webhooks.py, FOR UPDATE SKIP LOCKED), sends
the events after its cursor in feed order, and writes the outcomes in batches (FLUSH_EVERY, and at
least once per timeout, which also extends the claim). A failure holds back only its own item: the
item's later events wait behind it (db/webhooks.py's webhook_held) and it is retried (soon while
the receiver answers other requests, with exponential backoff otherwise; `retry_in`) until
REVIEW_QUEUE_WEBHOOK_GIVE_UP_H, while every other item flows on; a 410 disables the subscription.
A crash before a batch is written only means those events go again, with the same webhook-ids.
"""

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
import signal
import socket
import time
from contextlib import AbstractAsyncContextManager
from datetime import datetime, timedelta
from uuid import UUID

import httpx
from prometheus_client import Counter
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from standardwebhooks import Webhook

from api import webhook_secret
from api.schemas import FeedEventOut
from api.settings import Settings
from cli import outbound
from db import feed, webhooks
from db.engine import create_engine, transaction
from db.errors import classify

log = logging.getLogger("review_queue.deliverer")

ATTEMPTS = Counter(
    "review_queue_webhook_attempts_total",
    "Webhook delivery attempts by outcome: delivered, http_error, gone (410), timeout, unreachable, refused.",
    ["outcome"],
)
PAGE = 50  # events read from the feed at a time
PER_CLAIM = 200  # events sent before the subscription is let go, so others get their turn
FLUSH_EVERY = 50  # outcomes written in one transaction (and at least once per timeout)
MAX_BACKOFF_S = 30.0
QUICK_RETRIES = 5  # retries of one event that come soon while its receiver is up
QUICK_RETRY_S = 1.0
RECENT = 10  # requests to a receiver that decide whether it is up


def deliverer_identity() -> str:
    return f"deliverer@{socket.gethostname()}:{os.getpid()}"


def retry_in(settings: Settings, failures: int, *, receiver_up: bool = False) -> timedelta:
    """How long the n-th failure of an event waits, times a jitter of 0.5-1.

    While the receiver is up (it answered 2xx to one of its last RECENT requests) the first
    QUICK_RETRIES retries come within QUICK_RETRY_S: a receiver that fails now and then is served
    at once, and a held item does not hold its later events for long. Otherwise, and for an event
    that keeps failing, min(max, base * 2^(n-1)) with base REVIEW_QUEUE_WEBHOOK_RETRY_BASE_MS
    (10 s), then hours apart: a receiver that is down is not hammered."""
    if receiver_up and failures <= QUICK_RETRIES:
        ceiling = min(QUICK_RETRY_S, settings.webhook_retry_base_ms / 1000)
    else:
        ceiling = min(
            settings.webhook_retry_max_s, settings.webhook_retry_base_ms / 1000 * 2 ** min(failures - 1, 40)
        )
    return timedelta(seconds=ceiling * random.uniform(0.5, 1.0))  # noqa: S311 - jitter, not a secret


class ReceiverHealth:
    """The outcomes of each subscription's last RECENT requests from this process: the receiver is
    up when one of them succeeded. Kept across claims (a new claim starts with what the last saw);
    a new process starts knowing nothing, so with the exponential schedule."""

    def __init__(self) -> None:
        self._recent: dict[str, collections.deque[bool]] = {}

    def note(self, subscription: str, ok: bool) -> None:
        self._recent.setdefault(subscription, collections.deque(maxlen=RECENT)).append(ok)

    def up(self, subscription: str) -> bool:
        return any(self._recent.get(subscription, ()))


HEALTH = ReceiverHealth()


def payload(event: feed.FeedEvent) -> bytes:
    """The Standard Webhooks body: {type, timestamp, data}, data being the feed entry."""
    data = FeedEventOut.of(event).model_dump(mode="json")
    return json.dumps(
        {"type": event.type, "timestamp": data["at"], "data": data}, separators=(",", ":")
    ).encode()


class Delivery:
    """One claimed subscription, delivered until it is caught up, fails, or has had its turn."""

    def __init__(
        self, engine: AsyncEngine, http: httpx.AsyncClient, settings: Settings, held: webhooks.Claim
    ):
        self.engine, self.http, self.settings, self.held = engine, http, settings, held
        self.hold = timedelta(seconds=settings.webhook_timeout_s * 3 + 10)
        self._claimed = time.monotonic()
        self._signer: Webhook | None = None

    def _transaction(self) -> AbstractAsyncContextManager[AsyncConnection]:
        return transaction(
            self.engine,
            lock_timeout_ms=self.settings.pg_lock_timeout_ms,
            statement_timeout_ms=self.settings.statement_timeout_ms,
        )

    def _now(self) -> datetime:
        # The database's clock at the claim, moved on by a monotonic timer: webhook-timestamp
        # follows the database, like every other time the service writes.
        return self.held.claimed_at + timedelta(seconds=time.monotonic() - self._claimed)

    def _sign_with(self) -> Webhook | str:
        """The signer, or why there is none."""
        if self._signer is None:
            keys = webhook_secret.keys(self.settings)
            if keys is None:
                return "REVIEW_QUEUE_WEBHOOK_KEY is not set: the secret cannot be read"
            try:
                self._signer = Webhook(webhook_secret.decrypt(keys, self.held.secret))
            except webhook_secret.InvalidToken:
                return (
                    "the secret cannot be decrypted: REVIEW_QUEUE_WEBHOOK_KEY changed, the old key not kept"
                )
        return self._signer

    async def _send(self, event: feed.FeedEvent) -> outbound.Sent:
        signer = self._sign_with()
        if isinstance(signer, str):
            return outbound.Sent("refused", None, 0.0, signer)
        return await outbound.send(
            self.http,
            self.held.subscription.url,
            webhook_id=event.webhook_id,
            timestamp=self._now(),
            body=payload(event),
            signer=signer,
            timeout_s=self.settings.webhook_timeout_s,
            allow=self.settings.webhook_allow_hosts,
        )

    async def _flush(self, done: webhooks.Settlement) -> bool:
        """Write what was sent since the last flush; False when the claim is lost or retrying gave up."""
        async with self._transaction() as conn:
            state = await webhooks.settle(
                conn,
                self.held,
                done,
                hold=self.hold,
                give_up=timedelta(seconds=self.settings.webhook_give_up_s),
            )
        self._flushed = time.monotonic()
        name = self.held.subscription.name
        if state == "lost":
            log.warning("webhook_claim_lost", extra={"subscription": name})
        elif state == "gave_up":
            log.error("webhook_gave_up", extra={"subscription": name, "error": done.last_error})
        done.clear()
        return state == "ok"

    def _flush_due(self, done: webhooks.Settlement) -> bool:
        # Often enough that the claim (3 x the timeout + 10 s) is extended before it can lapse.
        return len(done) >= FLUSH_EVERY or time.monotonic() - self._flushed >= self.settings.webhook_timeout_s

    async def _attempt(self, done: webhooks.Settlement, event: feed.FeedEvent, attempt: int) -> outbound.Sent:
        """Send one event and note the outcome; a failure holds the event's item back."""
        result = await self._send(event)
        ATTEMPTS.labels(result.outcome).inc()
        outcome = webhooks.Outcome(
            event.id, event.webhook_id, event.type, result.status_code, result.latency_ms, result.error
        )
        done.attempts.append((outcome, result.ok, attempt))
        extra = {
            "subscription": self.held.subscription.name,
            "webhook_id": event.webhook_id,
            "type": event.type,
            "status": result.status_code,
            "latency_ms": result.latency_ms,
        }
        name = self.held.subscription.name
        HEALTH.note(name, result.ok)
        if result.ok:
            log.info("webhook_delivered", extra=extra)
        else:
            wait = retry_in(self.settings, attempt, receiver_up=HEALTH.up(name))
            done.failed.append((event.id, event.item_id, attempt, wait, result.error))
            done.last_error = result.error
            log.warning(
                "webhook_delivery_failed",
                extra={**extra, "attempt": attempt, "error": result.error,
                       "retry_in_s": round(wait.total_seconds(), 1)},
            )  # fmt: skip
        return result

    async def _gone(self, done: webhooks.Settlement, result: outbound.Sent) -> None:
        if await self._flush(done):
            async with self._transaction() as conn:
                await webhooks.gone(conn, self.held, error=result.error)
        log.warning("webhook_disabled_gone", extra={"subscription": self.held.subscription.name})

    async def run(self) -> None:
        """The held items whose retry is due first (each item's waiting events in order, until one
        fails), then the feed after the cursor: an event of a held item joins its item's line, any
        other is sent, and one that fails starts a line of its own. Only that item waits."""
        sub = self.held.subscription
        types = [feed.EVENTS_OF_TYPE[t] for t in sub.event_types if t in feed.EVENTS_OF_TYPE]
        done, sent = webhooks.Settlement(), 0
        self._flushed = time.monotonic()
        async with self._transaction() as conn:
            held = await webhooks.held_items(conn, name=sub.name)
            due = await webhooks.due(conn, name=sub.name, limit=PAGE)
            events = await feed.events_by_id(conn, [h.event_id for h in due])
        still_failing: set[UUID] = set()
        for waiting in due:
            if waiting.item_id in still_failing:
                continue
            event = events.get(waiting.event_id)
            if event is None:  # no longer in the trail (archived): nothing left to send
                done.released.append(waiting.event_id)
                continue
            result = await self._attempt(done, event, waiting.attempts + 1)
            sent += 1
            if result.outcome == "gone":
                await self._gone(done, result)
                return
            if result.ok:
                done.released.append(waiting.event_id)
            else:
                still_failing.add(waiting.item_id)
            if self._flush_due(done) and not await self._flush(done):
                return
        held -= {w.item_id for w in due} - still_failing  # their whole lines went out
        cursor = sub.cursor
        while sent < PER_CLAIM:
            async with self._transaction() as conn:
                page = await feed.read(conn, after=cursor, limit=PAGE, events=types)
            for event in page.events:
                if event.item_id in held:
                    done.waiting.append((event.id, event.item_id))  # behind its item's failed event
                else:
                    result = await self._attempt(done, event, 1)
                    sent += 1
                    if result.outcome == "gone":
                        await self._gone(done, result)
                        return
                    if not result.ok:
                        held.add(event.item_id)
                done.cursor = event.cursor
                if self._flush_due(done) and not await self._flush(done):
                    return
            if page.next != cursor:
                done.cursor = cursor = page.next
            elif not page.events:
                break  # caught up
        if len(done) and not await self._flush(done):
            return
        async with self._transaction() as conn:
            await webhooks.prune(conn, name=sub.name)
            # Had its turn: due again at once; caught up: looked at again after an interval (which
            # is also when a held item's retry that has come due is seen).
            later = 0.0 if sent >= PER_CLAIM else self.settings.deliverer_interval_ms / 1000
            await webhooks.release(conn, self.held, later=timedelta(seconds=later))


async def deliver_one(
    engine: AsyncEngine, http: httpx.AsyncClient, settings: Settings, identity: str
) -> bool:
    """Claim the subscription due first and deliver it; False when none is due."""
    async with transaction(
        engine,
        lock_timeout_ms=settings.pg_lock_timeout_ms,
        statement_timeout_ms=settings.statement_timeout_ms,
    ) as conn:
        held = await webhooks.claim(
            conn, deliverer=identity, hold=timedelta(seconds=settings.webhook_timeout_s * 3 + 10)
        )
    if held is None:
        return False
    await Delivery(engine, http, settings, held).run()
    return True


async def _worker(
    engine: AsyncEngine, http: httpx.AsyncClient, settings: Settings, stop: asyncio.Event
) -> None:
    identity, failures = deliverer_identity(), 0
    while not stop.is_set():
        try:
            worked = await deliver_one(engine, http, settings, identity)
            failures = 0
            delay = 0.0 if worked else settings.deliverer_interval_ms / 1000 * random.uniform(0.9, 1.1)  # noqa: S311
        except Exception as error:
            failures += 1
            delay = min(MAX_BACKOFF_S, 0.5 * 2**failures)
            reason = classify(error)
            if reason is None:
                log.exception("deliverer_failed", extra={"retry_in_s": delay})
            else:
                log.warning("deliverer_database_unavailable", extra={"reason": reason, "retry_in_s": delay})
        if delay:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)


async def run_forever(settings: Settings, url: str, stop: asyncio.Event | None = None) -> None:
    """REVIEW_QUEUE_DELIVERER_CONCURRENCY workers, each claiming one subscription at a time, until
    SIGTERM or SIGINT (the deliveries in flight finish first)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    concurrency = settings.deliverer_concurrency
    engine = create_engine(url, pool_size=concurrency, max_overflow=1, pool_timeout_s=5)
    log.info("deliverer_started", extra={"concurrency": concurrency, "identity": deliverer_identity()})
    try:
        async with outbound.client() as http:
            await asyncio.gather(*(_worker(engine, http, settings, stop) for _ in range(concurrency)))
    finally:
        await engine.dispose()
        log.info("deliverer_stopped")
