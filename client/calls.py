"""Every request the client makes, without I/O: what it sends (method, path, body) and how its answer
is read into a typed result. The sync and async clients only carry these over the wire."""

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode
from uuid import UUID

import httpx

from client.models import (
    ApproveOut,
    BacklogOut,
    CompleteBatchOut,
    CompleteOut,
    CompleteResult,
    DecisionOut,
    EventOut,
    FeedOut,
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

T = TypeVar("T")

# The server's limit on entries of one POST /items/complete.
MAX_COMPLETE_ITEMS = 200

# A project token, or a function returning the current bearer, called before every request: for the
# identity provider's client-credentials tokens, which expire (keep it cheap: return a cached token,
# fetching a new one shortly before the old one's expiry).
Token = str | Callable[[], str]


def auth(token: Token) -> dict[str, str]:
    return {"Authorization": f"Bearer {token if isinstance(token, str) else token()}"}


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and the reader of its JSON answer; `wait_s` is how long the server may hold it."""

    method: str
    path: str
    read: Callable[[Any], T]
    body: dict[str, Any] | None = None
    wait_s: int = 0


@dataclass(frozen=True)
class Completion:
    """One entry of `complete_many`."""

    item_id: UUID
    resolution: str
    note: str | None = None
    lease_token: str | None = None
    source_hash: str | None = None  # the figures decided on: a revision since is SOURCE_CHANGED


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a paged list and the cursor of the next (None on the last page)."""

    rows: list[T] = field(default_factory=list)
    next_cursor: str | None = None


def timeout(http: httpx.Client | httpx.AsyncClient, wait_s: int) -> httpx.Timeout:
    # A long poll may legitimately take wait_s before the first byte of its answer.
    base = http.timeout
    return httpx.Timeout(
        connect=base.connect,
        read=None if base.read is None else base.read + wait_s,
        write=base.write,
        pool=base.pool,
    )


def backoff(attempt: int) -> float:
    """Pause before retry `attempt` (from 0): 0.1 s doubling to 2 s, jittered."""
    return min(2.0, 0.1 * 2.0**attempt) * random.uniform(0.5, 1.5)  # noqa: S311 - jitter


def _set(**fields: Any) -> dict[str, Any]:
    """The fields that are set: the server applies its defaults to the others."""
    return {k: v for k, v in fields.items() if v is not None}


def _item(answer: Any) -> ItemOut:
    return ItemOut.model_validate(answer)


def _items(answer: Any) -> list[ItemOut]:
    return [ItemOut.model_validate(i) for i in answer["items"]]


def enqueue(fields: dict[str, Any]) -> Call[ItemOut]:
    body = _set(**fields)
    if isinstance(body.get("variance_amount"), Decimal):
        body["variance_amount"] = str(body["variance_amount"])  # exact, never via float
    if isinstance(body.get("trace_id"), UUID):
        body["trace_id"] = str(body["trace_id"])
    if isinstance(body.get("due_at"), datetime):
        body["due_at"] = body["due_at"].isoformat()  # the server refuses one without an offset
    return Call("POST", "/items", _item, body)


def lease(
    batch_size: int | None, wait_s: int, ledger_entity: str | None, queue: str, item_id: UUID | None
) -> Call[list[ItemOut]]:
    body = _set(
        batch_size=batch_size,
        wait_s=wait_s or None,
        ledger_entity=ledger_entity,
        queue=None if queue == "review" else queue,
        item_id=str(item_id) if item_id else None,
    )
    return Call("POST", "/leases", _items, body or None, wait_s)


def complete(
    item_id: UUID, resolution: str, note: str | None, lease_token: str | None, source_hash: str | None
) -> Call[CompleteOut]:
    body = _set(resolution=resolution, note=note, lease_token=lease_token, source_hash=source_hash)
    return Call("POST", f"/items/{item_id}/complete", CompleteOut.model_validate, body)


def _results(answer: Any) -> list[CompleteResult]:
    return CompleteBatchOut.model_validate(answer).results


def complete_many(completions: Sequence[Completion]) -> Call[list[CompleteResult]]:
    entries = [
        _set(
            id=str(c.item_id),
            resolution=c.resolution,
            note=c.note,
            lease_token=c.lease_token,
            source_hash=c.source_hash,
        )
        for c in completions
    ]
    return Call("POST", "/items/complete", _results, {"items": entries})


def renew(item_id: UUID, lease_token: str | None) -> Call[ItemOut]:
    return Call("POST", f"/items/{item_id}/renew", _item, _set(lease_token=lease_token) or None)


def release(item_id: UUID, reason: str | None, lease_token: str | None) -> Call[ItemOut]:
    return Call("POST", f"/items/{item_id}/release", _item, _set(reason=reason, lease_token=lease_token))


def requeue(item_id: UUID, reason: str) -> Call[ItemOut]:
    return Call("POST", f"/items/{item_id}/requeue", _item, {"reason": reason})


def reopen(item_id: UUID, reason: str) -> Call[ItemOut]:
    return Call("POST", f"/items/{item_id}/reopen", _item, {"reason": reason})


def approve(item_id: UUID, lease_token: str | None) -> Call[ApproveOut]:
    body = _set(lease_token=lease_token) or None
    return Call("POST", f"/items/{item_id}/approve", ApproveOut.model_validate, body)


def reject(item_id: UUID, reason: str, lease_token: str | None) -> Call[ItemOut]:
    return Call("POST", f"/items/{item_id}/reject", _item, _set(reason=reason, lease_token=lease_token))


def comment(item_id: UUID, text: str) -> Call[EventOut]:
    return Call("POST", f"/items/{item_id}/comments", EventOut.model_validate, {"text": text})


def _codes(answer: Any) -> list[ResolutionCodeOut]:
    return [ResolutionCodeOut.model_validate(c) for c in answer["resolutions"]]


def resolutions() -> Call[list[ResolutionCodeOut]]:
    return Call("GET", "/resolutions", _codes)


def put_resolution(code: str, fields: dict[str, Any]) -> Call[ResolutionCodeOut]:
    if fields.get("approval_threshold") is not None:
        fields = {**fields, "approval_threshold": str(fields["approval_threshold"])}
    return Call("PUT", f"/resolutions/{code}", ResolutionCodeOut.model_validate, fields)


def set_fx_rate(currency: str, rate: Decimal | str) -> Call[RateOut]:
    return Call("PUT", f"/fx-rates/{currency}", RateOut.model_validate, {"rate": str(rate)})


def fx_rates() -> Call[RatesOut]:
    return Call("GET", "/fx-rates", RatesOut.model_validate)


def fx_rate_history(currency: str) -> Call[RateHistoryOut]:
    return Call("GET", f"/fx-rates/{currency}/history", RateHistoryOut.model_validate)


def resolution_policy() -> Call[ResolutionPolicyOut]:
    return Call("GET", "/resolutions/policy", ResolutionPolicyOut.model_validate)


def put_resolution_policy(materiality_threshold: Decimal | str) -> Call[ResolutionPolicyOut]:
    body = {"materiality_threshold": str(materiality_threshold)}
    return Call("PUT", "/resolutions/policy", ResolutionPolicyOut.model_validate, body)


def revise(
    item_id: UUID,
    variance_amount: Decimal | str,
    source_hash: str,
    match_decision: str | None,
    currency: str | None = None,
) -> Call[RevisionOut]:
    body = _set(
        variance_amount=str(variance_amount),
        source_hash=source_hash,
        match_decision=match_decision,
        currency=currency,
    )
    return Call("POST", f"/items/{item_id}/revisions", RevisionOut.model_validate, body)


def admin_release(item_id: UUID, reason: str) -> Call[ItemOut]:
    return Call("POST", f"/admin/items/{item_id}/release", _item, {"reason": reason})


def admin_release_reviewer(reviewer: str, reason: str) -> Call[ReleasedOut]:
    path = f"/admin/reviewers/{quote(reviewer, safe='')}/release"
    return Call("POST", path, ReleasedOut.model_validate, {"reason": reason})


def reassign(item_id: UUID, reviewer: str, reason: str) -> Call[ItemOut]:
    return Call("POST", f"/admin/items/{item_id}/reassign", _item, {"reviewer": reviewer, "reason": reason})


def get(item_id: UUID) -> Call[ItemOut]:
    return Call("GET", f"/items/{item_id}", _item)


def _event_page(answer: Any) -> Page[EventOut]:
    return Page([EventOut.model_validate(e) for e in answer["events"]], answer["next_cursor"])


def events_page(item_id: UUID, cursor: str | None) -> Call[Page[EventOut]]:
    return Call("GET", f"/items/{item_id}/events?" + urlencode(_set(cursor=cursor, limit=500)), _event_page)


def _item_page(answer: Any) -> Page[ItemOut]:
    return Page(_items(answer), answer["next_cursor"])


def items_page(filters: dict[str, Any], cursor: str | None) -> Call[Page[ItemOut]]:
    """A page of GET /items with the filters that are set, by their query names."""
    return Call("GET", "/items?" + urlencode(_set(**filters, limit=200, cursor=cursor)), _item_page)


def _decision_page(answer: Any) -> Page[DecisionOut]:
    return Page([DecisionOut.model_validate(d) for d in answer["decisions"]], answer["next_cursor"])


def decisions_page(actor: str, cursor: str | None) -> Call[Page[DecisionOut]]:
    return Call("GET", "/decisions?" + urlencode(_set(actor=actor, limit=200, cursor=cursor)), _decision_page)


def feed_page(after: str | None, limit: int, types: Sequence[str] | None, wait_s: int) -> Call[FeedOut]:
    query = _set(
        limit=limit, after=after or None, types=",".join(types) if types else None, wait_s=wait_s or None
    )
    return Call("GET", f"/events?{urlencode(query)}", FeedOut.model_validate, wait_s=wait_s)


def report_path(name: str, from_: date, to: date, **params: str | None) -> str:
    """/reports/<name> for the local dates [from_, to) and the other parameters that are set."""
    query = {"from": from_.isoformat(), "to": to.isoformat(), **{k: v for k, v in params.items() if v}}
    return f"/reports/{name}?{urlencode(query)}"


def report_sla(from_: date, to: date, bucket: str, tz: str, ledger_entity: str | None) -> Call[SlaOut]:
    path = report_path("sla", from_, to, bucket=bucket, tz=tz, ledger_entity=ledger_entity)
    return Call("GET", path, SlaOut.model_validate)


def report_throughput(from_: date, to: date, bucket: str, tz: str) -> Call[ThroughputOut]:
    return Call(
        "GET", report_path("throughput", from_, to, bucket=bucket, tz=tz), ThroughputOut.model_validate
    )


def report_backlog(from_: date, to: date, tz: str, by: str | None = None) -> Call[BacklogOut]:
    return Call("GET", report_path("backlog", from_, to, tz=tz, by=by), BacklogOut.model_validate)
