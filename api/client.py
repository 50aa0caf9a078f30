"""A Python client for scripted adjudication, sync and async, on httpx.

    client = ReviewQueueClient("http://127.0.0.1:8000", token)
    client.work(lambda item: "APPROVED" if abs(item.variance_amount) < 1 else ("ESCALATED", "over 1.00"))

`work` is the seed's worker loop over HTTP: lease a batch, keep each lease alive with
`renew` while the handler runs, complete with the handler's resolution (fenced by the
item's `lease_token`), release on handler error, long-poll for work (`wait_s`), stop cleanly on
SIGINT/SIGTERM or `stop()`. Errors are typed exceptions carrying the problem `code`.

`work(..., batch_complete=True)` sends the handler's results through POST /items/complete
instead, one request per flush: when the leased batch is done, when a renew of the batch falls
due, and on stop. A crash loses nothing: an unflushed item is still leased (and renewed until
flushed), so it is reclaimed and handled again.

`feed(after=..., wait_s=...)` iterates the change feed (GET /events) and follows it with long
polls; `verify_webhook(headers, body, secret)` checks a webhook delivery's Standard Webhooks
signature, for a receiver. (`events(item_id)` is one item's audit trail, as before.)
"""

import asyncio
import contextlib
import logging
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode
from uuid import UUID

import httpx
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from api.schemas import (
    MAX_COMPLETE_ITEMS,
    ApproveOut,
    BacklogOut,
    CompleteBatchOut,
    CompleteOut,
    CompleteResult,
    DecisionOut,
    DecisionRowOut,
    EventOut,
    FeedEventOut,
    FeedOut,
    ItemOut,
    ReleasedOut,
    ResolutionCodeOut,
    ResolutionPolicyOut,
    RevisionOut,
    SlaOut,
    ThroughputOut,
)

log = logging.getLogger("review_queue.client")

HandlerResult = str | tuple[str, str | None]


class ReviewQueueError(Exception):
    """A problem+json answer; `code` is the service's stable error code."""

    def __init__(self, status: int, code: str, detail: str, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.problem = status, code, detail, problem


class Unauthenticated(ReviewQueueError): ...


class Forbidden(ReviewQueueError): ...


class NotFound(ReviewQueueError): ...


class LeaseNotHeld(ReviewQueueError):
    """Not your current lease. When the reclaimer took your lease back (it expired), `reclaimed_at`
    and `lease_expired_at` say when; both are None otherwise."""

    @property
    def reclaimed_at(self) -> datetime | None:
        return _moment(self.problem.get("reclaimed_at"))

    @property
    def lease_expired_at(self) -> datetime | None:
        return _moment(self.problem.get("lease_expired_at"))


def _moment(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


class IdempotencyConflict(ReviewQueueError): ...


class ResolutionConflict(ReviewQueueError): ...


class ValidationFailed(ReviewQueueError): ...


class DatabaseUnavailable(ReviewQueueError): ...


class NotQuarantined(ReviewQueueError): ...


class NotResolved(ReviewQueueError): ...


class SegregationOfDuties(ReviewQueueError): ...


class SourceChanged(ReviewQueueError):
    """The figures changed under your lease (a source revision). `item` is the item now, with the
    new lease_token: look at the new figures, then carry on with that token."""

    @property
    def item(self) -> ItemOut:
        return ItemOut.model_validate(self.problem["item"])


class NotAssigned(ReviewQueueError): ...


class AlreadyHeld(ReviewQueueError): ...


class NotAReviewer(ReviewQueueError): ...


class ReviewerAtCap(ReviewQueueError): ...


_BY_CODE: dict[str, type[ReviewQueueError]] = {
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "NOT_FOUND": NotFound,
    "LEASE_NOT_HELD": LeaseNotHeld,
    "IDEMPOTENCY_CONFLICT": IdempotencyConflict,
    "RESOLUTION_CONFLICT": ResolutionConflict,
    "NOT_QUARANTINED": NotQuarantined,
    "NOT_RESOLVED": NotResolved,
    "SEGREGATION_OF_DUTIES": SegregationOfDuties,
    "SOURCE_CHANGED": SourceChanged,
    "NOT_ASSIGNED": NotAssigned,
    "ALREADY_HELD": AlreadyHeld,
    "NOT_A_REVIEWER": NotAReviewer,
    "REVIEWER_AT_CAP": ReviewerAtCap,
    "VALIDATION_ERROR": ValidationFailed,
    "DATABASE_UNAVAILABLE": DatabaseUnavailable,
}


@dataclass
class WorkStats:
    leased: int = 0
    resolved: int = 0
    released: int = 0
    lost: int = 0  # the lease was gone (reclaimed) by the time the handler finished
    revised: int = 0  # decisions made again because the figures changed under the lease


# A handler decides again on new figures this many times for one item; an item whose source keeps
# changing faster than that is handed back.
MAX_REDECISIONS = 3


@dataclass(frozen=True)
class Completion:
    """One entry of `complete_many`."""

    item_id: UUID
    resolution: str
    note: str | None = None
    lease_token: str | None = None
    source_hash: str | None = None  # the figures decided on: a revision since is SOURCE_CHANGED


def _problem_error(status: int, problem: dict[str, Any]) -> ReviewQueueError:
    code, detail = str(problem.get("code", f"HTTP_{status}")), str(problem.get("detail", ""))
    return _BY_CODE.get(code, ReviewQueueError)(status, code, detail, problem)


def _tally(results: list[CompleteResult], stats: "WorkStats") -> list[ItemOut]:
    """Count a flush like the single completions it replaces: a lease lost meanwhile is `lost`;
    any other refusal is raised, as `complete` would raise it. Returns the items whose figures
    changed before the flush (SOURCE_CHANGED): still held, under the new lease in the problem."""
    refused, changed = None, []
    for result in results:
        if result.outcome != "refused":
            stats.resolved += 1
        elif result.problem is not None and result.problem.code == "LEASE_NOT_HELD":
            stats.lost += 1
        elif result.problem is not None and result.problem.code == "SOURCE_CHANGED":
            stats.revised += 1
            changed.append(ItemOut.model_validate(result.problem.model_dump()["item"]))
        elif result.problem is not None:
            refused = refused or _problem_error(result.problem.status, result.problem.model_dump())
    if refused is not None:
        raise refused
    return changed


# A decision queued for a batch was made on figures that have changed since: hand the item back (in
# its place) so it is decided again on the new ones, by this worker or another.
_CHANGED_BEFORE_FLUSH = "the figures changed before the batch was sent"


def _raise_for_problem(response: httpx.Response) -> None:
    if response.status_code < 400:
        return
    try:
        problem = response.json()
        code, detail = str(problem["code"]), str(problem.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        problem, code, detail = {}, f"HTTP_{response.status_code}", response.text[:200]
    raise _BY_CODE.get(code, ReviewQueueError)(response.status_code, code, detail, problem)


def _retryable(error: Exception) -> bool:
    # Every call is safe to repeat: completion is idempotent, renew/release are fenced, and a
    # lease whose answer was lost simply expires and is reclaimed.
    return isinstance(error, (DatabaseUnavailable, httpx.TransportError))


def _timeout(http: httpx.Client | httpx.AsyncClient, wait_s: int) -> httpx.Timeout:
    # A long poll may legitimately take wait_s before the first byte of its answer.
    base = http.timeout
    return httpx.Timeout(
        connect=base.connect,
        read=None if base.read is None else base.read + wait_s,
        write=base.write,
        pool=base.pool,
    )


def _backoff(attempt: int) -> float:
    return min(2.0, 0.1 * 2.0**attempt) * random.uniform(0.5, 1.5)  # noqa: S311 - jitter


FAILURE_BACKOFF_CEILING_S = 30.0


def _failure_backoff(failures: int) -> float:
    """Pause after the handler failed `failures` batches in a row: 0.5 s doubling to 30 s, jittered,
    so a poison item (or a broken handler) cannot spin the queue."""
    return min(FAILURE_BACKOFF_CEILING_S, 0.5 * 2.0 ** (failures - 1)) * random.uniform(0.5, 1.0)  # noqa: S311


@dataclass
class _Failed:
    """An item the handler failed on: kept leased until the next lease has been taken, so that
    lease hands out other items first, then released with the error as its reason."""

    item: ItemOut
    reason: str


def _enqueue_body(fields: dict[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in fields.items() if v is not None}
    if isinstance(body.get("variance_amount"), Decimal):
        body["variance_amount"] = str(body["variance_amount"])  # exact, never via float
    if isinstance(body.get("trace_id"), UUID):
        body["trace_id"] = str(body["trace_id"])
    if isinstance(body.get("due_at"), datetime):
        body["due_at"] = body["due_at"].isoformat()  # the server refuses one without an offset
    return body


def verify_webhook(headers: Any, body: bytes | str, secret: str) -> dict[str, Any]:
    """A delivery's body ({type, timestamp, data}) once its Standard Webhooks signature checks out
    with `secret` (`whsec_...`, shown once by PUT /webhooks/{name}) and its timestamp is within five
    minutes; raises InvalidWebhook otherwise. Pass the raw body bytes exactly as received. Drop a
    delivery whose `webhook-id` you have already handled: delivery is at least once."""
    payload: dict[str, Any] = Webhook(secret).verify(body, dict(headers))
    return payload


InvalidWebhook = WebhookVerificationError


def _feed_path(after: str | None, limit: int, types: Sequence[str] | None, wait_s: int) -> str:
    query: dict[str, Any] = {"limit": limit}
    if after:
        query["after"] = after
    if types:
        query["types"] = ",".join(types)
    if wait_s:
        query["wait_s"] = wait_s
    return f"/events?{urlencode(query)}"


def _events_path(item_id: UUID, cursor: str | None) -> str:
    return f"/items/{item_id}/events" + (
        f"?{urlencode({'cursor': cursor, 'limit': 500})}" if cursor else "?limit=500"
    )


def _decisions_path(actor: str, cursor: str | None) -> str:
    return "/decisions?" + urlencode({"actor": actor, "limit": 200, **({"cursor": cursor} if cursor else {})})


def _report_path(name: str, from_: date, to: date, **params: str | None) -> str:
    """/reports/<name> for the local dates [from_, to) and the other parameters that are set."""
    query = {"from": from_.isoformat(), "to": to.isoformat(), **{k: v for k, v in params.items() if v}}
    return f"/reports/{name}?{urlencode(query)}"


def _resolution(result: HandlerResult) -> tuple[str, str | None]:
    return (result, None) if isinstance(result, str) else result


def _renew_interval(item: ItemOut, renew_every_s: float | None) -> float:
    if renew_every_s is not None:
        return renew_every_s
    assert item.leased_at is not None and item.lease_expires_at is not None
    # Three heartbeats per lease period: one lost request never costs the lease.
    return max(0.1, (item.lease_expires_at - item.leased_at).total_seconds() / 3)


class _Calls:
    """What each endpoint sends and how its answer is read; no I/O here."""

    @staticmethod
    def enqueue(fields: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", "/items", _enqueue_body(fields)

    @staticmethod
    def lease(
        batch_size: int | None,
        wait_s: int,
        ledger_entity: str | None,
        queue: str = "review",
        item_id: UUID | None = None,
    ) -> tuple[str, str, dict[str, Any] | None]:
        body = {
            "batch_size": batch_size,
            "wait_s": wait_s or None,
            "ledger_entity": ledger_entity,
            "queue": None if queue == "review" else queue,
            "item_id": str(item_id) if item_id else None,
        }
        return "POST", "/leases", {k: v for k, v in body.items() if v is not None} or None

    @staticmethod
    def complete(
        item_id: UUID,
        resolution: str,
        note: str | None,
        lease_token: str | None,
        source_hash: str | None = None,
    ) -> tuple[str, str, dict[str, Any] | None]:
        body = {
            "resolution": resolution,
            "note": note,
            "lease_token": lease_token,
            "source_hash": source_hash,
        }
        return "POST", f"/items/{item_id}/complete", {k: v for k, v in body.items() if v is not None}

    @staticmethod
    def complete_many(completions: Sequence[Completion]) -> tuple[str, str, dict[str, Any] | None]:
        entries = [
            {
                "id": str(c.item_id),
                "resolution": c.resolution,
                "note": c.note,
                "lease_token": c.lease_token,
                "source_hash": c.source_hash,
            }
            for c in completions
        ]
        return (
            "POST",
            "/items/complete",
            {"items": [{k: v for k, v in e.items() if v is not None} for e in entries]},
        )

    @staticmethod
    def renew(item_id: UUID, lease_token: str | None) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/items/{item_id}/renew", {"lease_token": lease_token} if lease_token else None

    @staticmethod
    def release(
        item_id: UUID, reason: str | None, lease_token: str | None
    ) -> tuple[str, str, dict[str, Any] | None]:
        body = {"reason": reason, "lease_token": lease_token}
        return "POST", f"/items/{item_id}/release", {k: v for k, v in body.items() if v is not None}

    @staticmethod
    def requeue(item_id: UUID, reason: str) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/items/{item_id}/requeue", {"reason": reason}

    @staticmethod
    def reopen(item_id: UUID, reason: str) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/items/{item_id}/reopen", {"reason": reason}

    @staticmethod
    def approve(item_id: UUID, lease_token: str | None) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/items/{item_id}/approve", {"lease_token": lease_token} if lease_token else None

    @staticmethod
    def reject(item_id: UUID, reason: str, lease_token: str | None) -> tuple[str, str, dict[str, Any] | None]:
        body = {"reason": reason, "lease_token": lease_token}
        return "POST", f"/items/{item_id}/reject", {k: v for k, v in body.items() if v is not None}

    @staticmethod
    def put_resolution(code: str, fields: dict[str, Any]) -> tuple[str, str, dict[str, Any] | None]:
        if fields.get("approval_threshold") is not None:
            fields = {**fields, "approval_threshold": str(fields["approval_threshold"])}
        return "PUT", f"/resolutions/{code}", fields

    @staticmethod
    def put_resolution_policy(materiality_threshold: Decimal | str) -> tuple[str, str, dict[str, Any] | None]:
        return "PUT", "/resolutions/policy", {"materiality_threshold": str(materiality_threshold)}

    @staticmethod
    def revise(
        item_id: UUID, variance_amount: Decimal | str, source_hash: str, match_decision: str | None
    ) -> tuple[str, str, dict[str, Any] | None]:
        body = {
            "variance_amount": str(variance_amount),
            "source_hash": source_hash,
            "match_decision": match_decision,
        }
        return "POST", f"/items/{item_id}/revisions", {k: v for k, v in body.items() if v is not None}

    @staticmethod
    def admin_release(item_id: UUID, reason: str) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/admin/items/{item_id}/release", {"reason": reason}

    @staticmethod
    def admin_release_reviewer(reviewer: str, reason: str) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/admin/reviewers/{quote(reviewer, safe='')}/release", {"reason": reason}

    @staticmethod
    def reassign(item_id: UUID, reviewer: str, reason: str) -> tuple[str, str, dict[str, Any] | None]:
        return "POST", f"/admin/items/{item_id}/reassign", {"reviewer": reviewer, "reason": reason}


# A project token, or a function returning the current bearer, called before every request: for the
# identity provider's client-credentials tokens, which expire (keep it cheap: return a cached token,
# fetching a new one shortly before the old one's expiry).
Token = str | Callable[[], str]


def _auth(token: Token) -> dict[str, str]:
    return {"Authorization": f"Bearer {token if isinstance(token, str) else token()}"}


class ReviewQueueClient:
    """Synchronous client. Pass `http` to reuse an httpx.Client (it must carry no auth)."""

    def __init__(
        self,
        base_url: str,
        token: "Token",
        *,
        timeout: float = 10.0,
        retries: int = 3,
        http: httpx.Client | None = None,
    ) -> None:
        self._http = http or httpx.Client(base_url=base_url, timeout=timeout)
        self._token = token
        self._retries = retries
        self._stop = threading.Event()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "ReviewQueueClient":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, wait_s: int = 0) -> Any:
        for attempt in range(self._retries + 1):
            try:
                response = self._http.request(
                    method, path, json=body, headers=_auth(self._token), timeout=_timeout(self._http, wait_s)
                )
                _raise_for_problem(response)
                return response.json()
            except Exception as error:
                if not _retryable(error) or attempt == self._retries:
                    raise
                time.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    def enqueue(self, **fields: Any) -> ItemOut:
        return ItemOut.model_validate(self._call(*_Calls.enqueue(fields)))

    def lease(
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
        answer = self._call(*_Calls.lease(batch_size, wait_s, ledger_entity, queue, item_id), wait_s=wait_s)
        return [ItemOut.model_validate(i) for i in answer["items"]]

    def complete(
        self,
        item_id: UUID,
        resolution: str,
        *,
        note: str | None = None,
        lease_token: str | None = None,
        source_hash: str | None = None,
    ) -> CompleteOut:
        """Resolve an item you hold; SourceChanged (with the new item) when its figures changed."""
        return CompleteOut.model_validate(
            self._call(*_Calls.complete(item_id, resolution, note, lease_token, source_hash))
        )

    def complete_many(self, completions: Sequence[Completion]) -> list[CompleteResult]:
        """Up to 200 completions in one request and one transaction; one result per entry, in order
        (a refused entry has `outcome` "refused" and the `problem` the single route would answer)."""
        return CompleteBatchOut.model_validate(self._call(*_Calls.complete_many(completions))).results

    def _flush(
        self, done: list[tuple[ItemOut, Completion]], held: dict[UUID, ItemOut], stats: WorkStats
    ) -> None:
        while done:
            chunk, done[:] = done[:MAX_COMPLETE_ITEMS], done[MAX_COMPLETE_ITEMS:]
            results = self.complete_many([c for _, c in chunk])
            for item, _ in chunk:
                held.pop(item.id, None)
            for changed in _tally(results, stats):
                with contextlib.suppress(LeaseNotHeld):
                    self.release(changed.id, reason=_CHANGED_BEFORE_FLUSH, lease_token=changed.lease_token)
                    stats.released += 1

    def renew(self, item_id: UUID, *, lease_token: str | None = None) -> ItemOut:
        return ItemOut.model_validate(self._call(*_Calls.renew(item_id, lease_token)))

    def release(self, item_id: UUID, *, reason: str | None = None, lease_token: str | None = None) -> ItemOut:
        return ItemOut.model_validate(self._call(*_Calls.release(item_id, reason, lease_token)))

    def requeue(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Put a QUARANTINED item back in the queue (admin)."""
        return ItemOut.model_validate(self._call(*_Calls.requeue(item_id, reason)))

    def reopen(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Put a RESOLVED item back to PENDING; the trail keeps the old decision (admin)."""
        return ItemOut.model_validate(self._call(*_Calls.reopen(item_id, reason)))

    def approve(self, item_id: UUID, *, lease_token: str | None = None) -> ApproveOut:
        """Approve a proposal you hold the approval lease of (approver, admin)."""
        return ApproveOut.model_validate(self._call(*_Calls.approve(item_id, lease_token)))

    def reject(self, item_id: UUID, *, reason: str, lease_token: str | None = None) -> ItemOut:
        """Send a proposal back to PENDING with a reason (approver, admin)."""
        return ItemOut.model_validate(self._call(*_Calls.reject(item_id, reason, lease_token)))

    def resolutions(self) -> list[ResolutionCodeOut]:
        """The active resolution codes."""
        return [ResolutionCodeOut.model_validate(c) for c in self._call("GET", "/resolutions")["resolutions"]]

    def put_resolution(self, code: str, **fields: Any) -> ResolutionCodeOut:
        """Create or update a resolution code (admin): label, description, requires_note,
        approval_threshold (Decimal or None), active."""
        return ResolutionCodeOut.model_validate(self._call(*_Calls.put_resolution(code, fields)))

    def resolution_policy(self) -> ResolutionPolicyOut:
        """The catalogue-wide approval policy: the materiality threshold."""
        return ResolutionPolicyOut.model_validate(self._call("GET", "/resolutions/policy"))

    def put_resolution_policy(self, materiality_threshold: Decimal | str) -> ResolutionPolicyOut:
        """Set the materiality threshold (admin): every completion at or above it needs an approver."""
        return ResolutionPolicyOut.model_validate(
            self._call(*_Calls.put_resolution_policy(materiality_threshold))
        )

    def revise(
        self,
        item_id: UUID,
        *,
        variance_amount: Decimal | str,
        source_hash: str,
        match_decision: str | None = None,
    ) -> RevisionOut:
        """New figures for an item (ingest, admin); idempotent on source_hash."""
        return RevisionOut.model_validate(
            self._call(*_Calls.revise(item_id, variance_amount, source_hash, match_decision))
        )

    def admin_release(self, item_id: UUID, *, reason: str) -> ItemOut:
        """Hand an item back to the queue, whoever holds it (admin)."""
        return ItemOut.model_validate(self._call(*_Calls.admin_release(item_id, reason)))

    def admin_release_reviewer(self, reviewer: str, *, reason: str) -> ReleasedOut:
        """Hand every item `reviewer` holds back to the queue (admin)."""
        return ReleasedOut.model_validate(self._call(*_Calls.admin_release_reviewer(reviewer, reason)))

    def reassign(self, item_id: UUID, *, reviewer: str, reason: str) -> ItemOut:
        """Move an item's lease to `reviewer` (admin)."""
        return ItemOut.model_validate(self._call(*_Calls.reassign(item_id, reviewer, reason)))

    def get(self, item_id: UUID) -> ItemOut:
        return ItemOut.model_validate(self._call("GET", f"/items/{item_id}"))

    def events(self, item_id: UUID) -> list[EventOut]:
        """The whole audit trail of the item, oldest first (every page)."""
        events, cursor = [], None
        while True:
            page = self._call("GET", _events_path(item_id, cursor))
            events += [EventOut.model_validate(e) for e in page["events"]]
            if (cursor := page["next_cursor"]) is None:
                return events

    def decisions(self, actor: str = "me") -> list[DecisionOut]:
        """What `actor` resolved, submitted for approval, approved or rejected, newest first (every
        page), each with its item as it is now."""
        decisions, cursor = [], None
        while True:
            page = self._call("GET", _decisions_path(actor, cursor))
            decisions += [DecisionOut.model_validate(d) for d in page["decisions"]]
            if (cursor := page["next_cursor"]) is None:
                return decisions

    def feed(
        self,
        after: str | None = None,
        *,
        wait_s: int = 20,
        types: Sequence[str] | None = None,
        limit: int = 100,
        follow: bool = True,
    ) -> Iterator[FeedEventOut]:
        """The change feed (GET /events; roles integration, auditor, admin): every event across items
        after the cursor `after` (None: from the start), oldest first, each with its item as it is now.
        Store each event's `cursor` once you have handled it and pass it back as `after` to resume.
        With `follow` it never ends: it long-polls (`wait_s`) for what comes next; without, it ends
        when it has caught up. (`events(item_id)` is one item's trail.)"""
        while True:
            page = FeedOut.model_validate(
                self._call("GET", _feed_path(after, limit, types, wait_s if follow else 0), wait_s=wait_s)
            )
            yield from page.events
            if not page.events and not follow:
                return
            after = page.next_cursor

    verify_webhook = staticmethod(verify_webhook)
    # --- reports (roles auditor and admin; a reviewer's throughput is their own) -----------------

    def report_sla(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC", ledger_entity: str | None = None
    ) -> SlaOut:
        """SLA attainment per day or week of the local dates [from_, to) in `tz`."""
        path = _report_path("sla", from_, to, bucket=bucket, tz=tz, ledger_entity=ledger_entity)
        return SlaOut.model_validate(self._call("GET", path))

    def report_throughput(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC"
    ) -> ThroughputOut:
        """Decisions per reviewer per day or week, with the time from lease to decision."""
        return ThroughputOut.model_validate(
            self._call("GET", _report_path("throughput", from_, to, bucket=bucket, tz=tz))
        )

    def report_backlog(self, from_: date, to: date, *, tz: str = "UTC") -> BacklogOut:
        """Open items by age at the end of each day."""
        return BacklogOut.model_validate(self._call("GET", _report_path("backlog", from_, to, tz=tz)))

    def report_decisions(self, from_: date, to: date, *, tz: str = "UTC") -> Iterator[DecisionRowOut]:
        """Every decision of the period, streamed (NDJSON): memory stays flat however many there are.
        A stream cut short raises httpx.RemoteProtocolError rather than ending early."""
        path = _report_path("decisions.ndjson", from_, to, tz=tz)
        with self._http.stream("GET", path, headers=_auth(self._token)) as response:
            if response.status_code >= 400:
                response.read()
                _raise_for_problem(response)
            for line in response.iter_lines():
                if line:
                    yield DecisionRowOut.model_validate_json(line)

    def stop(self) -> None:
        """Ask `work` to finish the item in hand, release the rest of its batch, and return."""
        self._stop.set()

    @contextlib.contextmanager
    def _heartbeat(self, held: dict[UUID, ItemOut], lost: set[UUID], every_s: float) -> Iterator[None]:
        """Renew every item of the batch still in hand, not only the one being handled: the
        rest of the batch waits behind a slow item and would expire meanwhile."""
        done = threading.Event()

        def beat() -> None:
            while not done.wait(every_s):
                for item in list(held.values()):
                    try:
                        self.renew(item.id, lease_token=item.lease_token)
                    except SourceChanged as changed:
                        held[item.id] = changed.item  # renewed from now on under the new token
                    except LeaseNotHeld:
                        lost.add(item.id)
                        held.pop(item.id, None)
                    except (ReviewQueueError, httpx.TransportError) as error:
                        log.warning("renew_failed", extra={"item_id": str(item.id), "error": str(error)})

        thread = threading.Thread(target=beat, name="review-queue-renew", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _process(
        self,
        item: ItemOut,
        handler: Callable[[ItemOut], HandlerResult],
        stats: WorkStats,
        done: list[tuple[ItemOut, Completion]] | None = None,
    ) -> _Failed | None:
        for _ in range(MAX_REDECISIONS + 1):
            try:
                resolution, note = _resolution(handler(item))
            except Exception as error:
                log.exception("handler_failed", extra={"item_id": str(item.id)})
                return _Failed(item, f"handler error: {error!r}"[:500])
            if done is not None:  # batch mode: completed at the next flush
                done.append((item, Completion(item.id, resolution, note, item.lease_token, item.source_hash)))
                return None
            try:
                self.complete(item.id, resolution, note=note, lease_token=item.lease_token)
                stats.resolved += 1
            except LeaseNotHeld:
                stats.lost += 1
            except SourceChanged as changed:
                # The figures changed while the handler decided: decide again on the new ones.
                item = changed.item
                stats.revised += 1
                continue
            return None
        return _Failed(item, "the figures kept changing while deciding")

    def _release_all(self, items: list[_Failed], stats: WorkStats) -> None:
        for failed in items:
            with contextlib.suppress(LeaseNotHeld):
                try:
                    self.release(failed.item.id, reason=failed.reason, lease_token=failed.item.lease_token)
                except SourceChanged as changed:
                    self.release(failed.item.id, reason=failed.reason, lease_token=changed.item.lease_token)
                stats.released += 1
        items.clear()

    def work(
        self,
        handler: Callable[[ItemOut], HandlerResult],
        *,
        batch_size: int | None = None,
        wait_s: int = 5,
        renew_every_s: float | None = None,
        handle_signals: bool = True,
        batch_complete: bool = False,
        ledger_entity: str | None = None,
    ) -> WorkStats:
        """Lease (of ledger_entity only, when given) and adjudicate until `stop()` or SIGINT/SIGTERM;
        returns what happened.

        An empty queue is waited on by the server (`wait_s`, long poll), not by sleeping here;
        `stop()` takes effect when the current wait ends, within wait_s. With `batch_complete`,
        results go through POST /items/complete (see the module's docstring)."""
        stats = WorkStats()
        self._stop.clear()
        restore = self._install_signals() if handle_signals else {}
        failed: list[_Failed] = []  # still leased; released once the next lease is taken
        failures = 0  # batches in a row in which the handler failed
        try:
            while not self._stop.is_set():
                batch = self.lease(batch_size, wait_s=wait_s, ledger_entity=ledger_entity)
                stats.leased += len(batch)
                self._release_all(failed, stats)
                if not batch:
                    continue
                held, lost = {i.id: i for i in batch}, set[UUID]()
                every_s = _renew_interval(batch[0], renew_every_s)
                done: list[tuple[ItemOut, Completion]] | None = [] if batch_complete else None
                flush_by = time.monotonic() + every_s
                with self._heartbeat(held, lost, every_s):
                    for position, item in enumerate(batch):
                        if self._stop.is_set():
                            if done:
                                self._flush(done, held, stats)
                            self._release_all(
                                [_Failed(i, "worker stopping") for i in batch[position:]], stats
                            )
                            break
                        if item.id in lost:
                            stats.lost += 1
                            continue
                        item = held.get(item.id, item)  # the heartbeat's, if the figures changed
                        if (failure := self._process(item, handler, stats, done)) is not None:
                            failed.append(failure)
                        if done is None or failure is not None:
                            held.pop(item.id, None)
                        elif time.monotonic() >= flush_by:  # a renew falls due: complete instead
                            self._flush(done, held, stats)
                            flush_by = time.monotonic() + every_s
                    if done:
                        self._flush(done, held, stats)
                failures = failures + 1 if failed else 0
                if failed:
                    self._stop.wait(_failure_backoff(failures))
        finally:
            self._release_all(failed, stats)
            for signum, previous in restore.items():
                signal.signal(signum, previous)
        return stats

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        return {sig: signal.signal(sig, lambda *_: self.stop()) for sig in (signal.SIGINT, signal.SIGTERM)}


class AsyncReviewQueueClient:
    """The same client for asyncio; `work` takes an async handler."""

    def __init__(
        self,
        base_url: str,
        token: "Token",
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

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, wait_s: int = 0
    ) -> Any:
        for attempt in range(self._retries + 1):
            try:
                response = await self._http.request(
                    method, path, json=body, headers=_auth(self._token), timeout=_timeout(self._http, wait_s)
                )
                _raise_for_problem(response)
                return response.json()
            except Exception as error:
                if not _retryable(error) or attempt == self._retries:
                    raise
                await asyncio.sleep(_backoff(attempt))
        raise AssertionError("unreachable")

    async def enqueue(self, **fields: Any) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.enqueue(fields)))

    async def lease(
        self,
        batch_size: int | None = None,
        *,
        wait_s: int = 0,
        ledger_entity: str | None = None,
        queue: str = "review",
        item_id: UUID | None = None,
    ) -> list[ItemOut]:
        answer = await self._call(
            *_Calls.lease(batch_size, wait_s, ledger_entity, queue, item_id), wait_s=wait_s
        )
        return [ItemOut.model_validate(i) for i in answer["items"]]

    async def complete(
        self,
        item_id: UUID,
        resolution: str,
        *,
        note: str | None = None,
        lease_token: str | None = None,
        source_hash: str | None = None,
    ) -> CompleteOut:
        return CompleteOut.model_validate(
            await self._call(*_Calls.complete(item_id, resolution, note, lease_token, source_hash))
        )

    async def complete_many(self, completions: Sequence[Completion]) -> list[CompleteResult]:
        """Up to 200 completions in one request (see the sync client)."""
        return CompleteBatchOut.model_validate(await self._call(*_Calls.complete_many(completions))).results

    async def _flush(
        self, done: list[tuple[ItemOut, Completion]], held: dict[UUID, ItemOut], stats: WorkStats
    ) -> None:
        while done:
            chunk, done[:] = done[:MAX_COMPLETE_ITEMS], done[MAX_COMPLETE_ITEMS:]
            results = await self.complete_many([c for _, c in chunk])
            for item, _ in chunk:
                held.pop(item.id, None)
            for changed in _tally(results, stats):
                with contextlib.suppress(LeaseNotHeld):
                    await self.release(
                        changed.id, reason=_CHANGED_BEFORE_FLUSH, lease_token=changed.lease_token
                    )
                    stats.released += 1

    async def renew(self, item_id: UUID, *, lease_token: str | None = None) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.renew(item_id, lease_token)))

    async def release(
        self, item_id: UUID, *, reason: str | None = None, lease_token: str | None = None
    ) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.release(item_id, reason, lease_token)))

    async def requeue(self, item_id: UUID, *, reason: str) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.requeue(item_id, reason)))

    async def reopen(self, item_id: UUID, *, reason: str) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.reopen(item_id, reason)))

    async def approve(self, item_id: UUID, *, lease_token: str | None = None) -> ApproveOut:
        return ApproveOut.model_validate(await self._call(*_Calls.approve(item_id, lease_token)))

    async def reject(self, item_id: UUID, *, reason: str, lease_token: str | None = None) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.reject(item_id, reason, lease_token)))

    async def resolutions(self) -> list[ResolutionCodeOut]:
        answer = await self._call("GET", "/resolutions")
        return [ResolutionCodeOut.model_validate(c) for c in answer["resolutions"]]

    async def put_resolution(self, code: str, **fields: Any) -> ResolutionCodeOut:
        return ResolutionCodeOut.model_validate(await self._call(*_Calls.put_resolution(code, fields)))

    async def resolution_policy(self) -> ResolutionPolicyOut:
        return ResolutionPolicyOut.model_validate(await self._call("GET", "/resolutions/policy"))

    async def put_resolution_policy(self, materiality_threshold: Decimal | str) -> ResolutionPolicyOut:
        return ResolutionPolicyOut.model_validate(
            await self._call(*_Calls.put_resolution_policy(materiality_threshold))
        )

    async def revise(
        self,
        item_id: UUID,
        *,
        variance_amount: Decimal | str,
        source_hash: str,
        match_decision: str | None = None,
    ) -> RevisionOut:
        return RevisionOut.model_validate(
            await self._call(*_Calls.revise(item_id, variance_amount, source_hash, match_decision))
        )

    async def admin_release(self, item_id: UUID, *, reason: str) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.admin_release(item_id, reason)))

    async def admin_release_reviewer(self, reviewer: str, *, reason: str) -> ReleasedOut:
        return ReleasedOut.model_validate(await self._call(*_Calls.admin_release_reviewer(reviewer, reason)))

    async def reassign(self, item_id: UUID, *, reviewer: str, reason: str) -> ItemOut:
        return ItemOut.model_validate(await self._call(*_Calls.reassign(item_id, reviewer, reason)))

    async def get(self, item_id: UUID) -> ItemOut:
        return ItemOut.model_validate(await self._call("GET", f"/items/{item_id}"))

    async def events(self, item_id: UUID) -> list[EventOut]:
        """The whole audit trail of the item, oldest first (every page)."""
        events, cursor = [], None
        while True:
            page = await self._call("GET", _events_path(item_id, cursor))
            events += [EventOut.model_validate(e) for e in page["events"]]
            if (cursor := page["next_cursor"]) is None:
                return events

    async def decisions(self, actor: str = "me") -> list[DecisionOut]:
        decisions, cursor = [], None
        while True:
            page = await self._call("GET", _decisions_path(actor, cursor))
            decisions += [DecisionOut.model_validate(d) for d in page["decisions"]]
            if (cursor := page["next_cursor"]) is None:
                return decisions

    async def feed(
        self,
        after: str | None = None,
        *,
        wait_s: int = 20,
        types: Sequence[str] | None = None,
        limit: int = 100,
        follow: bool = True,
    ) -> AsyncIterator[FeedEventOut]:
        """The change feed as an async iterator (see the sync client's `feed`)."""
        while True:
            answer = await self._call(
                "GET", _feed_path(after, limit, types, wait_s if follow else 0), wait_s=wait_s
            )
            page = FeedOut.model_validate(answer)
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
        path = _report_path("sla", from_, to, bucket=bucket, tz=tz, ledger_entity=ledger_entity)
        return SlaOut.model_validate(await self._call("GET", path))

    async def report_throughput(
        self, from_: date, to: date, *, bucket: str = "day", tz: str = "UTC"
    ) -> ThroughputOut:
        path = _report_path("throughput", from_, to, bucket=bucket, tz=tz)
        return ThroughputOut.model_validate(await self._call("GET", path))

    async def report_backlog(self, from_: date, to: date, *, tz: str = "UTC") -> BacklogOut:
        return BacklogOut.model_validate(await self._call("GET", _report_path("backlog", from_, to, tz=tz)))

    async def report_decisions(
        self, from_: date, to: date, *, tz: str = "UTC"
    ) -> AsyncIterator[DecisionRowOut]:
        path = _report_path("decisions.ndjson", from_, to, tz=tz)
        async with self._http.stream("GET", path, headers=_auth(self._token)) as response:
            if response.status_code >= 400:
                await response.aread()
                _raise_for_problem(response)
            async for line in response.aiter_lines():
                if line:
                    yield DecisionRowOut.model_validate_json(line)

    def stop(self) -> None:
        self._stop.set()

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
    ) -> _Failed | None:
        for _ in range(MAX_REDECISIONS + 1):
            try:
                resolution, note = _resolution(await handler(item))
            except Exception as error:
                log.exception("handler_failed", extra={"item_id": str(item.id)})
                return _Failed(item, f"handler error: {error!r}"[:500])
            if done is not None:  # batch mode: completed at the next flush
                done.append((item, Completion(item.id, resolution, note, item.lease_token, item.source_hash)))
                return None
            try:
                await self.complete(item.id, resolution, note=note, lease_token=item.lease_token)
                stats.resolved += 1
            except LeaseNotHeld:
                stats.lost += 1
            except SourceChanged as changed:
                # The figures changed while the handler decided: decide again on the new ones.
                item = changed.item
                stats.revised += 1
                continue
            return None
        return _Failed(item, "the figures kept changing while deciding")

    async def _release_all(self, items: list[_Failed], stats: WorkStats) -> None:
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
        failed: list[_Failed] = []  # still leased; released once the next lease is taken
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
                every_s = _renew_interval(batch[0], renew_every_s)
                heartbeat = asyncio.create_task(self._beat(held, lost, every_s))
                done: list[tuple[ItemOut, Completion]] | None = [] if batch_complete else None
                flush_by = loop.time() + every_s
                try:
                    for position, item in enumerate(batch):
                        if self._stop.is_set():
                            if done:
                                await self._flush(done, held, stats)
                            stopping = [_Failed(i, "worker stopping") for i in batch[position:]]
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
                    await self._pause(_failure_backoff(failures))
        finally:
            await self._release_all(failed, stats)
            for sig in signals:
                loop.remove_signal_handler(sig)
        return stats
