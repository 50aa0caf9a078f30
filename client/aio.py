"""The asyncio client: the same methods as ReviewQueueClient (client.sync), awaited; each carries one
request of `client.calls` over httpx.AsyncClient. `work` takes an async handler."""

import asyncio
import contextlib
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import date
from decimal import Decimal
from typing import Any, TypeVar
from uuid import UUID

import httpx

from client import calls
from client.calls import MAX_COMPLETE_ITEMS, Call, Completion, Page, Token
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
from client.sync import ReviewQueueClient
from client.webhooks import verify_webhook
from client.work import (
    CHANGED_BEFORE_FLUSH,
    KEPT_CHANGING,
    MAX_REDECISIONS,
    Failed,
    HandlerResult,
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
    """The same client for asyncio; `work` takes an async handler."""

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
        self._stop = asyncio.Event()

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
                await asyncio.sleep(calls.backoff(attempt))
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
        return await self._send(calls.complete(item_id, resolution, note, lease_token, source_hash))

    async def complete_many(self, completions: Sequence[Completion]) -> list[CompleteResult]:
        return await self._send(calls.complete_many(completions))

    async def renew(self, item_id: UUID, *, lease_token: str | None = None) -> ItemOut:
        return await self._send(calls.renew(item_id, lease_token))

    async def release(
        self, item_id: UUID, *, reason: str | None = None, lease_token: str | None = None
    ) -> ItemOut:
        return await self._send(calls.release(item_id, reason, lease_token))

    async def requeue(self, item_id: UUID, *, reason: str) -> ItemOut:
        return await self._send(calls.requeue(item_id, reason))

    async def reopen(self, item_id: UUID, *, reason: str) -> ItemOut:
        return await self._send(calls.reopen(item_id, reason))

    async def approve(self, item_id: UUID, *, lease_token: str | None = None) -> ApproveOut:
        return await self._send(calls.approve(item_id, lease_token))

    async def reject(self, item_id: UUID, *, reason: str, lease_token: str | None = None) -> ItemOut:
        return await self._send(calls.reject(item_id, reason, lease_token))

    async def comment(self, item_id: UUID, *, text: str) -> EventOut:
        return await self._send(calls.comment(item_id, text))

    async def resolutions(self) -> list[ResolutionCodeOut]:
        return await self._send(calls.resolutions())

    async def put_resolution(self, code: str, **fields: Any) -> ResolutionCodeOut:
        return await self._send(calls.put_resolution(code, fields))

    async def resolution_policy(self) -> ResolutionPolicyOut:
        return await self._send(calls.resolution_policy())

    async def put_resolution_policy(self, materiality_threshold: Decimal | str) -> ResolutionPolicyOut:
        return await self._send(calls.put_resolution_policy(materiality_threshold))

    async def set_fx_rate(self, currency: str, rate: Decimal | str) -> RateOut:
        return await self._send(calls.set_fx_rate(currency, rate))

    async def fx_rates(self) -> RatesOut:
        return await self._send(calls.fx_rates())

    async def fx_rate_history(self, currency: str) -> RateHistoryOut:
        return await self._send(calls.fx_rate_history(currency))

    async def revise(
        self,
        item_id: UUID,
        *,
        variance_amount: Decimal | str,
        source_hash: str,
        match_decision: str | None = None,
        currency: str | None = None,
    ) -> RevisionOut:
        return await self._send(calls.revise(item_id, variance_amount, source_hash, match_decision, currency))

    async def admin_release(self, item_id: UUID, *, reason: str) -> ItemOut:
        return await self._send(calls.admin_release(item_id, reason))

    async def admin_release_reviewer(self, reviewer: str, *, reason: str) -> ReleasedOut:
        return await self._send(calls.admin_release_reviewer(reviewer, reason))

    async def reassign(self, item_id: UUID, *, reviewer: str, reason: str) -> ItemOut:
        return await self._send(calls.reassign(item_id, reviewer, reason))

    async def get(self, item_id: UUID) -> ItemOut:
        return await self._send(calls.get(item_id))

    async def events(self, item_id: UUID) -> list[EventOut]:
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
        while True:
            page = await self._send(calls.feed_page(after, limit, types, wait_s if follow else 0))
            for event in page.events:
                yield event
            if not page.events and not follow:
                return
            after = page.next_cursor

    verify_webhook = staticmethod(verify_webhook)
    # --- reports -------------------------------------------------------------------------------

    async def report_sla(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC", ledger_entity: str | None = None
    ) -> SlaOut:
        return await self._send(calls.report_sla(from_, to, bucket, tz, ledger_entity))

    async def report_throughput(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC"
    ) -> ThroughputOut:
        return await self._send(calls.report_throughput(from_, to, bucket, tz))

    async def report_backlog(self, from_: date, to: date, *, tz: str = "UTC") -> BacklogOut:
        return await self._send(calls.report_backlog(from_, to, tz))

    async def report_decisions(
        self, from_: date, to: date, *, tz: str = "UTC"
    ) -> AsyncIterator[DecisionRowOut]:
        path = calls.report_path("decisions.ndjson", from_, to, tz=tz)
        async with self._http.stream("GET", path, headers=calls.auth(self._token)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise_for_problem(response)
            async for line in response.aiter_lines():
                if line:
                    yield DecisionRowOut.model_validate_json(line)

    def stop(self) -> None:
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

    async def _beat(self, held: dict[UUID, ItemOut], lost: set[UUID], every_s: float) -> None:
        """Renew every item of the batch still in hand (see the sync client)."""
        while True:
            await asyncio.sleep(every_s)
            for item in list(held.values()):
                try:
                    await self.renew(item.id, lease_token=item.lease_token)
                except SourceChanged as changed:
                    held[item.id] = changed.item
                except LeaseNotHeld:
                    lost.add(item.id)
                    held.pop(item.id, None)
                except (ReviewQueueError, httpx.TransportError) as error:
                    log.warning("renew_failed", extra={"item_id": str(item.id), "error": str(error)})

    async def _process(
        self,
        item: ItemOut,
        handler: Callable[[ItemOut], Awaitable[HandlerResult]],
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

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def work(
        self,
        handler: Callable[[ItemOut], Awaitable[HandlerResult]],
        *,
        batch_size: int | None = None,
        wait_s: int = 5,
        renew_every_s: float | None = None,
        handle_signals: bool = True,
        batch_complete: bool = False,
        ledger_entity: str | None = None,
    ) -> WorkStats:
        """`work` of the sync client, for async handlers; `stop()` also ends a wait in progress (the
        lease request is cancelled, the server sees the disconnect and stops waiting)."""
        stats = WorkStats()
        self._stop.clear()
        loop = asyncio.get_running_loop()
        signals = (signal.SIGINT, signal.SIGTERM) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.stop)
        failed: list[Failed] = []  # still leased; released once the next lease is taken
        failures = 0  # batches in a row in which the handler failed
        try:
            while not self._stop.is_set():
                leasing = asyncio.ensure_future(
                    self.lease(batch_size, wait_s=wait_s, ledger_entity=ledger_entity)
                )
                stop_wait = asyncio.ensure_future(self._stop.wait())
                await asyncio.wait({leasing, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                stop_wait.cancel()
                if not leasing.done():
                    leasing.cancel()
                    await asyncio.gather(leasing, return_exceptions=True)
                    break
                batch = leasing.result()
                stats.leased += len(batch)
                await self._release_all(failed, stats)
                if not batch:
                    continue
                held, lost = {i.id: i for i in batch}, set[UUID]()
                every_s = renew_interval(batch[0], renew_every_s)
                heartbeat = asyncio.create_task(self._beat(held, lost, every_s))
                done: list[tuple[ItemOut, Completion]] | None = [] if batch_complete else None
                flush_by = loop.time() + every_s
                try:
                    for position, item in enumerate(batch):
                        if self._stop.is_set():
                            if done:
                                await self._flush(done, held, stats)
                            stopping = [Failed(i, "worker stopping") for i in batch[position:]]
                            await self._release_all(stopping, stats)
                            break
                        if item.id in lost:
                            stats.lost += 1
                            continue
                        item = held.get(item.id, item)  # the heartbeat's, if the figures changed
                        if (failure := await self._process(item, handler, stats, done)) is not None:
                            failed.append(failure)
                        if done is None or failure is not None:
                            held.pop(item.id, None)
                        elif loop.time() >= flush_by:  # a renew falls due: complete instead
                            await self._flush(done, held, stats)
                            flush_by = loop.time() + every_s
                    if done:
                        await self._flush(done, held, stats)
                finally:
                    heartbeat.cancel()
                failures = failures + 1 if failed else 0
                if failed:
                    await self._pause(failure_backoff(failures))
        finally:
            await self._release_all(failed, stats)
            for sig in signals:
                loop.remove_signal_handler(sig)
        return stats


# One docstring per method, written once on the sync client.
for _name, _method in vars(AsyncReviewQueueClient).items():
    if callable(_method) and _method.__doc__ is None and (_twin := getattr(ReviewQueueClient, _name, None)):
        _method.__doc__ = _twin.__doc__
