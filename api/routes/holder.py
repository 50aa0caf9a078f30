"""The lease holder's calls on an item: complete (one item or many in one call), renew, release.

Their router is the first the app adds: FastAPI tries the routes in the order they are added, and
every route tried before the one that matches costs each request (the completion first costs 10 %
fewer instructions: docs/performance.md). The other item routes are in api/routes/items.py."""

from datetime import UTC, datetime, timedelta
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Path, Request, Response

from api.deps import Reviewer, SettingsDep, one_round_trip, request_unit
from api.errors import ProblemError, problem_body, problem_responses
from api.routing import QueueRoute
from api.schemas import (
    CompleteBatchIn,
    CompleteBatchOut,
    CompleteIn,
    CompleteOut,
    CompleteResult,
    ItemOut,
    Problem,
    ReleaseIn,
    RenewIn,
    lease_nonce_for,
)
from api.settings import Settings
from db import queue
from db.tokens import Principal

router = APIRouter(route_class=QueueRoute, tags=["items"])

ItemId = Annotated[UUID, Path(description="The item's id (a UUID).")]


def token_nonce(item_id: UUID, token: str | None) -> UUID | None:
    # A token that is not one of this item's leases (another item's, the old epoch form, random)
    # goes to the guard as a nonce no lease has: 409, or 404 for an unknown item, like any other.
    return None if token is None else lease_nonce_for(item_id, token)


def source_changed(item: queue.Item, principal: Principal) -> ProblemError:
    """409 SOURCE_CHANGED for the holder: the current item, with the new lease_token to carry on with
    once they have looked at the new figures."""
    figures = f"variance_amount {item.variance_amount:.2f}, match_decision {item.match_decision}"
    return ProblemError(
        "SOURCE_CHANGED",
        f"the figures of item {item.id} changed while you held it: {figures}, source_hash"
        f" {item.source_hash!r}; decide on these, with the lease_token in `item`",
        extra={"item": ItemOut.of(item, principal.subject).model_dump(mode="json")},
    )


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def not_held(item_id: UUID, lost: queue.LostLease | None, *, lease: str = "lease") -> ProblemError:
    """409 LEASE_NOT_HELD; when the reclaimer took the caller's lease back, what happened and when
    (from its RECLAIMED event). It names nobody else: who holds the item now, if anyone, is for
    GET /items/{id} to say."""
    if lost is None:
        return ProblemError("LEASE_NOT_HELD", f"you do not hold the current {lease} on item {item_id}")
    expired, reclaimed = _utc(lost.lease_expired_at), _utc(lost.reclaimed_at)
    return ProblemError(
        "LEASE_NOT_HELD",
        f"your {lease} on item {item_id} expired at {expired} and was reclaimed at {reclaimed}, back"
        " to its queue; nothing was changed",
        extra={"lease_expired_at": expired, "reclaimed_at": reclaimed},
    )


def may_have_lost(outcome: str, item: queue.Item | None, principal: Principal) -> bool:
    # A refusal the reclaimer may explain: not the caller's current lease, and the caller does
    # not hold the item now (if they do, their token is from an older lease of theirs).
    return outcome == "lease_not_held" and item is not None and item.leased_by != principal.subject


async def _lost_leases(
    request: Request, principal: Principal, refused: list[tuple[str, queue.Item | None]]
) -> dict[UUID, queue.LostLease]:
    """The caller's leases the reclaimer took back, for the refusals it may explain: read only
    then, in a transaction of its own after the holder's call (one round trip, already over)."""
    ids = [
        item.id for outcome, item in refused if item is not None and may_have_lost(outcome, item, principal)
    ]
    if not ids:
        return {}
    async with request_unit(request) as unit:
        return await queue.lost_leases(unit, item_ids=ids, holder=principal.subject)


async def _held(
    request: Request,
    outcome: queue.HolderOutcome,
    item: queue.Item | None,
    item_id: UUID,
    principal: Principal,
    nonce: UUID | None,
) -> ItemOut:
    if outcome == "not_found" or item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    if outcome == "lease_not_held":
        if queue.source_changed(item, principal.subject, nonce, None):
            raise source_changed(item, principal)
        lost = await _lost_leases(request, principal, [(outcome, item)])
        raise not_held(item_id, lost.get(item_id))
    return ItemOut.of(item, principal.subject)


_NOT_HELD = problem_responses("NOT_FOUND", "LEASE_NOT_HELD", "SOURCE_CHANGED")


async def _allowed_codes(request: Request, outcomes: list[queue.CompleteOutcome]) -> list[str]:
    """The active codes, read only when a completion was refused by the catalogue: the completion
    itself is one statement in one round trip, so this is a read of its own, after it."""
    if not any(o in ("invalid_resolution", "note_required") for o in outcomes):
        return []
    async with request_unit(request) as unit:
        return [c.code for c in await queue.list_resolution_codes(unit)]


def _completion_problem(
    outcome: queue.CompleteOutcome,
    item: queue.Item | None,
    item_id: UUID,
    resolution: str,
    principal: Principal,
    allowed: list[str],
    lost: queue.LostLease | None,
) -> ProblemError | None:
    """The problem a completion answers, or None when it succeeded: one rule for both routes."""
    if outcome == "not_found" or item is None:
        return ProblemError("NOT_FOUND", f"no item {item_id}")
    if outcome == "source_changed":
        return source_changed(item, principal)
    if outcome == "resolution_conflict":
        chosen = item.resolution if item.state == "RESOLVED" else item.proposed_resolution
        return ProblemError(
            "RESOLUTION_CONFLICT", f"you already resolved this item as {chosen}, not {resolution}"
        )
    if outcome in ("invalid_resolution", "note_required"):
        if outcome == "invalid_resolution":
            field, message = "resolution", f"{resolution} is not an active resolution code; use one of "
            message += ", ".join(allowed)
        else:
            field, message = "note", f"resolution {resolution} requires a note"
        return ProblemError(
            "VALIDATION_ERROR",
            f"body.{field}: {message}",
            extra={
                "allowed_resolutions": allowed,
                "errors": [{"loc": ["body", field], "msg": message, "type": outcome}],
            },
        )
    if outcome == "lease_not_held":
        return not_held(item_id, lost)
    return None


@router.post(
    "/items/{item_id}/complete",
    operation_id="completeItem",
    summary="Resolve an item you hold",
    responses=problem_responses("NOT_FOUND", "LEASE_NOT_HELD", "RESOLUTION_CONFLICT", "SOURCE_CHANGED"),
    response_model=CompleteOut,
)
async def complete(item_id: ItemId, body: CompleteIn, principal: Reviewer, request: Request) -> Response:
    """Resolve an item you hold with an active code of the catalogue (`GET /resolutions`).

    When `abs(variance_amount)`, converted into the base currency at the latest rate of its currency
    (`PUT /fx-rates/{currency}`), reaches the code's `approval_threshold` (a base-currency amount),
    or its currency has no rate yet (fail safe), the item is not resolved:
    it becomes AWAITING_APPROVAL (`submitted_for_approval`) until an approver approves or rejects
    it. A retry with the same resolution answers `already_resolved` (`already_submitted`). An
    unknown or inactive code, or a missing note the code requires, is a 422 naming the codes.
    Refused with SOURCE_CHANGED (the current item and a new lease_token in the answer) when the
    figures changed under your lease and this call does not show you saw the new ones.
    """
    # The settings from the app rather than a dependency, and the answer serialised here rather
    # than validated again by FastAPI: each costs every completion (docs/performance.md, issue 44).
    settings: Settings = request.app.state.settings
    outcome, item = await queue.complete_item(
        one_round_trip(request),
        item_id=item_id,
        reviewer=principal.subject,
        resolution=body.resolution,
        note=body.note,
        lease_nonce=token_nonce(item_id, body.lease_token),
        source_hash=body.source_hash,
        base_currency=settings.base_currency,
    )
    allowed = await _allowed_codes(request, [outcome])
    lost = await _lost_leases(request, principal, [(outcome, item)])
    problem = _completion_problem(
        outcome, item, item_id, body.resolution, principal, allowed, lost.get(item_id)
    )
    if problem is not None:
        raise problem
    assert item is not None and outcome in (
        "resolved",
        "already_resolved",
        "submitted_for_approval",
        "already_submitted",
    )
    answer = CompleteOut(outcome=outcome, item=ItemOut.of(item, principal.subject))
    return Response(answer.model_dump_json(by_alias=True), media_type="application/json")


@router.post("/items/complete", operation_id="completeItems", summary="Resolve items you hold, in one call")
async def complete_batch(
    body: CompleteBatchIn, principal: Reviewer, request: Request, settings: SettingsDep
) -> CompleteBatchOut:
    """Resolve up to 200 items you hold in one transaction and one statement. Each entry gets
    exactly the answer POST /items/{id}/complete would give it, in request order; a refused entry
    changes nothing and never undoes the others."""
    completions = [
        queue.Completion(e.id, e.resolution, e.note, token_nonce(e.id, e.lease_token), e.source_hash)
        for e in body.items
    ]
    results = await queue.complete_items(
        one_round_trip(request),
        completions=completions,
        reviewer=principal.subject,
        base_currency=settings.base_currency,
    )
    allowed = await _allowed_codes(request, [outcome for outcome, _ in results])
    lost = await _lost_leases(request, principal, list(results))
    out = []
    for (outcome, item), entry in zip(results, body.items, strict=True):
        problem = _completion_problem(
            outcome, item, entry.id, entry.resolution, principal, allowed, lost.get(entry.id)
        )
        if problem is not None:
            body_ = problem_body(problem.code, problem.detail, **problem.extra)
            out.append(CompleteResult(id=entry.id, outcome="refused", problem=Problem(**body_)))
        else:
            assert item is not None and outcome in (
                "resolved",
                "already_resolved",
                "submitted_for_approval",
                "already_submitted",
            )
            out.append(CompleteResult(id=entry.id, outcome=outcome, item=ItemOut.of(item, principal.subject)))
    return CompleteBatchOut(results=out)


@router.post(
    "/items/{item_id}/renew", operation_id="renewItem", summary="Renew your lease", responses=_NOT_HELD
)
async def renew(
    item_id: ItemId,
    principal: Reviewer,
    settings: SettingsDep,
    request: Request,
    body: Annotated[RenewIn | None, Body()] = None,
) -> ItemOut:
    """Heartbeat: extend your lease to now + the lease duration (database clock)."""
    nonce = token_nonce(item_id, body.lease_token if body else None)
    outcome, item = await queue.renew_lease(
        one_round_trip(request),
        item_id=item_id,
        reviewer=principal.subject,
        lease_nonce=nonce,
        lease_duration=timedelta(milliseconds=settings.lock_timeout_ms),
    )
    return await _held(request, outcome, item, item_id, principal, nonce)


@router.post(
    "/items/{item_id}/release", operation_id="releaseItem", summary="Release your lease", responses=_NOT_HELD
)
async def release(
    item_id: ItemId,
    principal: Reviewer,
    settings: SettingsDep,
    request: Request,
    body: Annotated[ReleaseIn | None, Body()] = None,
) -> ItemOut:
    """Hand an item you hold back; it goes back to its place in line (QUARANTINED if its attempts are
    used up). Your own leases skip it for REVIEW_QUEUE_RELEASE_COOLDOWN_S, so it goes to someone
    else (unless you lease it by `item_id`)."""
    body = body or ReleaseIn()
    nonce = token_nonce(item_id, body.lease_token)
    outcome, item = await queue.release_lease(
        one_round_trip(request),
        item_id=item_id,
        reviewer=principal.subject,
        lease_nonce=nonce,
        reason=body.reason,
        max_attempts=settings.max_attempts,
        cooldown=timedelta(seconds=settings.release_cooldown_s),
    )
    return await _held(request, outcome, item, item_id, principal, nonce)
