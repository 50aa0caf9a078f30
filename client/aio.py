"""The review-queue client over httpx: each method carries one request of `client.calls`.

Written once, for asyncio, in client/aio.py (`AsyncReviewQueueClient`); client/sync.py
(`ReviewQueueClient`) is generated from it by unasync (client/generate_sync.py), so the two cannot
drift apart. What they do differently (sleeping, the stop flag, the heartbeat, signals) is in
client/concurrency.py, each primitive beside its twin."""

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import date
from decimal import Decimal
from typing import Any, Literal, TypeVar
from uuid import UUID

import httpx

from client import calls
from client.calls import MAX_COMPLETE_ITEMS, Call, Completion, Page, Token
from client.concurrency import AsyncStop, async_repeat, async_sleep, async_stop_on_signals
from client.errors import LeaseNotHeld, ReviewQueueError, SourceChanged, raise_for_problem, retryable
from client.models import (
    ApproveOut,
    BacklogOut,
    CompleteOut,
    CompleteResult,
    DecisionOut,
    DecisionRowOut,
    EventOut,
    FeedEventOut,
    ItemOut,
    RateHistoryOut,
    RateOut,
    RatesOut,
    ReleasedOut,
    ResolutionCodeOut,
    ResolutionPolicyOut,
    RevisionOut,
    SlaOut,
    ThroughputOut,
)
from client.webhooks import verify_webhook
from client.work import (
    CHANGED_BEFORE_FLUSH,
    KEPT_CHANGING,
    MAX_REDECISIONS,
    AsyncHandler,
    Failed,
    WorkStats,
    failure_backoff,
    handler_failed,
    renew_interval,
    resolution,
    tally,
)

T = TypeVar("T")
log = logging.getLogger("review_queue.client")


class AsyncReviewQueueClient:
    """The client (`ReviewQueueClient` blocks, `AsyncReviewQueueClient` is awaited; the same methods).
    Pass `http` to reuse an httpx client of the same kind (it must carry no auth)."""

    def __init__(
        self,
        base_url: str,
        token: Token,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._http = http or httpx.AsyncClient(base_url=base_url, timeout=timeout)
        self._token = token
        self._retries = retries
        self._stop = AsyncStop()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "AsyncReviewQueueClient":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _send(self, call: Call[T]) -> T:
        for attempt in range(self._retries + 1):
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    headers=calls.auth(self._token),
                    timeout=calls.timeout(self._http, call.wait_s),
                )
                raise_for_problem(response)
                return call.read(response.json())
            except Exception as error:
                if not retryable(error) or attempt == self._retries:
                    raise
                await async_sleep(calls.backoff(attempt))
        raise AssertionError("unreachable")

    async def _every_page(self, page: Callable[[str | None], Call[Page[T]]]) -> list[T]:
        rows: list[T] = []
        cursor = None
        while True:
            answer = await self._send(page(cursor))
            rows += answer.rows
            if (cursor := answer.next_cursor) is None:
                return rows

    async def enqueue(self, **fields: Any) -> ItemOut:
        return await self._send(calls.enqueue(fields))

    async def lease(
        self,
        batch_size: int | None = None,
        *,
        wait_s: int = 0,
        ledger_entity: str | None = None,
        queue: str = "review",
        item_id: UUID | None = None,
    ) -> list[ItemOut]:
        """Lease up to batch_size items (of ledger_entity only, when given; exactly item_id, when
        given, or nothing), earliest due first; with wait_s (0-20), wait that long for work to
        arrive. queue="approval" leases other people's proposals awaiting approval (approver,
        admin). An item you released is not handed back to you within the release cool-off unless
        you name it."""
        return await self._send(calls.lease(batch_size, wait_s, ledger_entity, queue, item_id))

    async def complete(
        self,
        item_id: UUID,
        resolution: str,
        *,
        note: str | None = None,
        lease_token: str | None = None,
        source_hash: str | None = None,
    ) -> CompleteOut:
        """Resolve an item you hold; SourceChanged (with the new item) when its figures changed."""
        return await self._send(calls.complete(item_id, resolution, note, lease_token, source_hash))

    async def complete_many(self, completions: Sequence[Completion]) -> list[CompleteResult]:
        """Up to 200 completions in one request and one transaction; one result per entry, in order
        (a refused entry has `outcome` "refused" and the `problem` the single route would answer)."""
        return await self._send(calls.complete_many(completions))

    async def renew(self, item_id: UUID, *, lease_token: str | None = None) -> ItemOut:
        return await self._send(calls.renew(item_id, lease_token))

    async def release(
        self, item_id: UUID, *, reason: str | None = None, lease_token: str | None = None
    ) -> ItemOut:
        return await self._send(calls.release(item_id, reason, lease_token))

    async def requeue(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Put a QUARANTINED item back in the queue (admin)."""
        return await self._send(calls.requeue(item_id, reason))

    async def reopen(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Put a RESOLVED item back to PENDING; the trail keeps the old decision (admin)."""
        return await self._send(calls.reopen(item_id, reason))

    async def approve(self, item_id: UUID, *, lease_token: str | None = None) -> ApproveOut:
        """Approve a proposal you hold the approval lease of (approver, admin)."""
        return await self._send(calls.approve(item_id, lease_token))

    async def reject(self, item_id: UUID, *, reason: str, lease_token: str | None = None) -> ItemOut:
        """Send a proposal back to PENDING with a reason (approver, admin)."""
        return await self._send(calls.reject(item_id, reason, lease_token))

    async def comment(self, item_id: UUID, *, text: str) -> EventOut:
        """Add a comment (1-2,000 characters) to the item's trail: a COMMENTED event; the item does
        not change (every role but integration)."""
        return await self._send(calls.comment(item_id, text))

    async def resolutions(self) -> list[ResolutionCodeOut]:
        """The active resolution codes."""
        return await self._send(calls.resolutions())

    async def put_resolution(self, code: str, **fields: Any) -> ResolutionCodeOut:
        """Create or update a resolution code (admin): label, description, requires_note,
        approval_threshold (Decimal or None), active."""
        return await self._send(calls.put_resolution(code, fields))

    async def set_fx_rate(self, currency: str, rate: Decimal | str) -> RateOut:
        """A currency's rate into the base currency from now on (ingest, admin); never overwritten."""
        return await self._send(calls.set_fx_rate(currency, rate))

    async def fx_rates(self) -> RatesOut:
        """The latest rate of each currency, into the base currency."""
        return await self._send(calls.fx_rates())

    async def fx_rate_history(self, currency: str) -> RateHistoryOut:
        """Every rate the currency had, newest first, with who set it and when."""
        return await self._send(calls.fx_rate_history(currency))

    async def resolution_policy(self) -> ResolutionPolicyOut:
        """The catalogue-wide approval policy: the materiality threshold."""
        return await self._send(calls.resolution_policy())

    async def put_resolution_policy(self, materiality_threshold: Decimal | str) -> ResolutionPolicyOut:
        """Set the materiality threshold (admin): every completion at or above it needs an approver."""
        return await self._send(calls.put_resolution_policy(materiality_threshold))

    async def revise(
        self,
        item_id: UUID,
        *,
        variance_amount: Decimal | str,
        source_hash: str,
        match_decision: str | None = None,
        currency: str | None = None,
    ) -> RevisionOut:
        """New figures for an item (ingest, admin); idempotent on source_hash. With currency (ISO
        4217), the amount is in that currency from now on; without, in the item's own."""
        return await self._send(calls.revise(item_id, variance_amount, source_hash, match_decision, currency))

    async def admin_release(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Hand an item back to the queue, whoever holds it (admin)."""
        return await self._send(calls.admin_release(item_id, reason))

    async def admin_release_reviewer(self, reviewer: str, *, reason: str) -> ReleasedOut:
        """Hand every item `reviewer` holds back to the queue (admin)."""
        return await self._send(calls.admin_release_reviewer(reviewer, reason))

    async def reassign(self, item_id: UUID, *, reviewer: str, reason: str) -> ItemOut:
        """Move an item's lease to `reviewer` (admin)."""
        return await self._send(calls.reassign(item_id, reviewer, reason))

    async def get(self, item_id: UUID) -> ItemOut:
        return await self._send(calls.get(item_id))

    async def events(self, item_id: UUID) -> list[EventOut]:
        """The whole audit trail of the item, oldest first (every page)."""
        return await self._every_page(lambda cursor: calls.events_page(item_id, cursor))

    async def items(self, q: str | None = None, **filters: Any) -> AsyncIterator[ItemOut]:
        """The items that match, in list order (`sort`: "created_at", the default, or "due_at"), read a
        page at a time as the loop goes on, so a broad search costs what is read of it. `q` searches,
        in any letter case, for the start of an id, an idempotency key, a ledger entity or any value in
        the item's context (`q="inv-7741"` finds `{"invoice": "INV-77412"}`); the other filters are
        GET /items' (`state=`, `ledger_entity=`, `currency=`, `min_amount=` ...)."""
        cursor = None
        while True:
            page = await self._send(calls.items_page({"q": q, **filters}, cursor))
            for item in page.rows:
                yield item
            if (cursor := page.next_cursor) is None:
                return

    async def decisions(self, actor: str = "me") -> list[DecisionOut]:
        """What `actor` resolved, submitted for approval, approved or rejected, newest first (every
        page), each with its item as it is now."""
        return await self._every_page(lambda cursor: calls.decisions_page(actor, cursor))

    async def feed(
        self,
        after: str | None = None,
        *,
        wait_s: int = 20,
        types: Sequence[str] | None = None,
        limit: int = 100,
        follow: bool = True,
    ) -> AsyncIterator[FeedEventOut]:
        """The change feed (GET /events; roles integration, auditor, admin): every event across items
        after the cursor `after` (None: from the start), oldest first, each with its item as it is now.
        Store each event's `cursor` once you have handled it and pass it back as `after` to resume.
        With `follow` it never ends: it long-polls (`wait_s`) for what comes next; without, it ends
        when it has caught up. (`events(item_id)` is one item's trail.)"""
        while True:
            page = await self._send(calls.feed_page(after, limit, types, wait_s if follow else 0))
            for event in page.events:
                yield event
            if not page.events and not follow:
                return
            after = page.next_cursor

    verify_webhook = staticmethod(verify_webhook)
    # --- reports (roles auditor and admin; a reviewer's throughput is their own) -----------------

    async def report_sla(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC", ledger_entity: str | None = None
    ) -> SlaOut:
        """SLA attainment per day or week of the local dates [from_, to) in `tz`."""
        return await self._send(calls.report_sla(from_, to, bucket, tz, ledger_entity))

    async def report_throughput(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC"
    ) -> ThroughputOut:
        """Decisions per reviewer per day or week, with the time from lease to decision."""
        return await self._send(calls.report_throughput(from_, to, bucket, tz))

    async def report_backlog(
        self, from_: date, to: date, *, tz: str = "UTC", by: Literal["currency"] | None = None
    ) -> BacklogOut:
        """Open items by age at the end of each day; with by="currency", split by currency too."""
        return await self._send(calls.report_backlog(from_, to, tz, by))

    async def report_decisions(
        self, from_: date, to: date, *, tz: str = "UTC"
    ) -> AsyncIterator[DecisionRowOut]:
        """Every decision of the period, streamed (NDJSON): memory stays flat however many there are.
        A stream cut short raises httpx.RemoteProtocolError rather than ending early."""
        path = calls.report_path("decisions.ndjson", from_, to, tz=tz)
        async with self._http.stream("GET", path, headers=calls.auth(self._token)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_problem(response)
            async for line in response.aiter_lines():
                if line:
                    yield DecisionRowOut.model_validate_json(line)

    def stop(self) -> None:
        """Ask `work` to finish the item in hand, release the rest of its batch, and return."""
        self._stop.set()

    # --- the work loop -------------------------------------------------------------------------

    async def _flush(
        self, done: list[tuple[ItemOut, Completion]], held: dict[UUID, ItemOut], stats: WorkStats
    ) -> None:
        while done:
            chunk, done[:] = done[:MAX_COMPLETE_ITEMS], done[MAX_COMPLETE_ITEMS:]
            results = await self.complete_many([c for _, c in chunk])
            for item, _ in chunk:
                held.pop(item.id, None)
            for changed in tally(results, stats):
                with contextlib.suppress(LeaseNotHeld):
                    await self.release(
                        changed.id, reason=CHANGED_BEFORE_FLUSH, lease_token=changed.lease_token
                    )
                    stats.released += 1

    async def _renew_held(self, held: dict[UUID, ItemOut], lost: set[UUID]) -> None:
        """Renew every item of the batch still in hand, not only the one being handled: the rest of
        the batch waits behind a slow item and would expire meanwhile."""
        for item in list(held.values()):
            try:
                await self.renew(item.id, lease_token=item.lease_token)
            except SourceChanged as changed:
                held[item.id] = changed.item  # renewed from now on under the new token
            except LeaseNotHeld:
                lost.add(item.id)
                held.pop(item.id, None)
            except (ReviewQueueError, httpx.TransportError) as error:
                log.warning("renew_failed", extra={"item_id": str(item.id), "error": str(error)})

    async def _process(
        self,
        item: ItemOut,
        handler: AsyncHandler,
        stats: WorkStats,
        done: list[tuple[ItemOut, Completion]] | None = None,
    ) -> Failed | None:
        for _ in range(MAX_REDECISIONS + 1):
            try:
                code, note = resolution(await handler(item))
            except Exception as error:
                log.exception("handler_failed", extra={"item_id": str(item.id)})
                return handler_failed(item, error)
            if done is not None:  # batch mode: completed at the next flush
                done.append((item, Completion(item.id, code, note, item.lease_token, item.source_hash)))
                return None
            try:
                await self.complete(item.id, code, note=note, lease_token=item.lease_token)
                stats.resolved += 1
            except LeaseNotHeld:
                stats.lost += 1
            except SourceChanged as changed:
                # The figures changed while the handler decided: decide again on the new ones.
                item = changed.item
                stats.revised += 1
                continue
            return None
        return Failed(item, KEPT_CHANGING)

    async def _release_all(self, items: list[Failed], stats: WorkStats) -> None:
        for failed in items:
            with contextlib.suppress(LeaseNotHeld):
                try:
                    await self.release(
                        failed.item.id, reason=failed.reason, lease_token=failed.item.lease_token
                    )
                except SourceChanged as changed:
                    await self.release(
                        failed.item.id, reason=failed.reason, lease_token=changed.item.lease_token
                    )
                stats.released += 1
        items.clear()

    async def work(
        self,
        handler: AsyncHandler,
        *,
        batch_size: int | None = None,
        wait_s: int = 5,
        renew_every_s: float | None = None,
        handle_signals: bool = True,
        batch_complete: bool = False,
        ledger_entity: str | None = None,
    ) -> WorkStats:
        """Lease (of ledger_entity only, when given) and adjudicate until `stop()` or SIGINT/SIGTERM;
        returns what happened. The async client's handler is a coroutine function.

        An empty queue is waited on by the server (`wait_s`, long poll), not by sleeping here.
        `stop()` ends the async client's wait at once (the lease request is cancelled, the server
        sees the disconnect and stops waiting), the sync client's when it ends, within wait_s. With
        `batch_complete`, results go through POST /items/complete (see the `client` package's
        docstring)."""
        stats = WorkStats()
        self._stop.clear()
        failed: list[Failed] = []  # still leased; released once the next lease is taken
        failures = 0  # batches in a row in which the handler failed
        with async_stop_on_signals(self.stop, handle_signals):
            try:
                while not self._stop.is_set():
                    leasing = self.lease(batch_size, wait_s=wait_s, ledger_entity=ledger_entity)
                    if (batch := await self._stop.unless_set(leasing)) is None:
                        break
                    stats.leased += len(batch)
                    await self._release_all(failed, stats)
                    if batch:
                        await self._work_batch(batch, handler, stats, failed, renew_every_s, batch_complete)
                    failures = failures + 1 if failed else 0
                    if failed:
                        await self._stop.wait(failure_backoff(failures))
            finally:
                await self._release_all(failed, stats)
        return stats

    async def _work_batch(
        self,
        batch: list[ItemOut],
        handler: AsyncHandler,
        stats: WorkStats,
        failed: list[Failed],
        renew_every_s: float | None,
        batch_complete: bool,
    ) -> None:
        """One leased batch through the handler, its leases renewed meanwhile; on stop, the rest of
        the batch is released."""
        held, lost = {i.id: i for i in batch}, set[UUID]()
        every_s = renew_interval(batch[0], renew_every_s)
        done: list[tuple[ItemOut, Completion]] | None = [] if batch_complete else None
        flush_by = time.monotonic() + every_s
        async with async_repeat(every_s, lambda: self._renew_held(held, lost)):
            for position, item in enumerate(batch):
                if self._stop.is_set():
                    if done:
                        await self._flush(done, held, stats)
                    await self._release_all([Failed(i, "worker stopping") for i in batch[position:]], stats)
                    return
                if item.id in lost:
                    stats.lost += 1
                    continue
                item = held.get(item.id, item)  # the heartbeat's, if the figures changed
                if (failure := await self._process(item, handler, stats, done)) is not None:
                    failed.append(failure)
                if done is None or failure is not None:
                    held.pop(item.id, None)
                elif time.monotonic() >= flush_by:  # a renew falls due: complete instead
                    await self._flush(done, held, stats)
                    flush_by = time.monotonic() + every_s
            if done:
                await self._flush(done, held, stats)
