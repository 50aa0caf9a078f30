"""Items: enqueue, read, and the holder's actions (renew, release, complete)."""

from datetime import UTC, datetime, timedelta
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Path, Query, Request, Response, status

from api.deps import (
    Admin,
    AnyRole,
    Approver,
    Ingest,
    Reviewer,
    SettingsDep,
    Work,
    one_round_trip,
    request_unit,
)
from api.errors import ProblemError, problem_body, problem_responses
from api.routing import QueueRoute
from api.schemas import (
    ApproveIn,
    ApproveOut,
    BatchIn,
    BatchOut,
    BatchResult,
    CompleteBatchIn,
    CompleteBatchOut,
    CompleteIn,
    CompleteOut,
    CompleteResult,
    DecisionOut,
    DecisionQuery,
    DecisionsPage,
    EventOut,
    EventQuery,
    EventsOut,
    ItemIn,
    ItemOut,
    ItemPage,
    ItemQuery,
    Problem,
    RejectIn,
    ReleaseIn,
    RenewIn,
    ReopenIn,
    RequeueIn,
    RevisionIn,
    RevisionOut,
    decode_cursor,
    decode_event_cursor,
    encode_cursor,
    encode_event_cursor,
    lease_nonce_for,
)
from api.settings import Settings, sla_hours
from db import queue
from db.tokens import Principal, fold_subject
from db.unit import Unit

router = APIRouter(route_class=QueueRoute, tags=["items"])

ItemId = Annotated[UUID, Path(description="The item's id (a UUID).")]


def _new_item(body: ItemIn, settings: Settings) -> queue.NewItem:
    return queue.NewItem(**body.model_dump(), sla_hours=sla_hours(settings.sla_tiers, body.variance_amount))


def _conflict_detail(key: str) -> str:
    return f"idempotency_key {key!r} exists with a different payload"


# The holder's calls come first: FastAPI tries the routes in the order they are declared, and
# every route tried before the one that matches costs each request (declared first, the
# completion costs 10 % fewer instructions: docs/performance.md).


def _nonce(item_id: UUID, token: str | None) -> UUID | None:
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


def _may_have_lost(outcome: str, item: queue.Item | None, principal: Principal) -> bool:
    # A refusal the reclaimer may explain: not the caller's current lease, and the caller does
    # not hold the item now (if they do, their token is from an older lease of theirs).
    return outcome == "lease_not_held" and item is not None and item.leased_by != principal.subject


async def _lost_leases(
    request: Request, principal: Principal, refused: list[tuple[str, queue.Item | None]]
) -> dict[UUID, queue.LostLease]:
    """The caller's leases the reclaimer took back, for the refusals it may explain: read only
    then, in a transaction of its own after the holder's call (one round trip, already over)."""
    ids = [
        item.id for outcome, item in refused if item is not None and _may_have_lost(outcome, item, principal)
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
)
async def complete(item_id: ItemId, body: CompleteIn, principal: Reviewer, request: Request) -> CompleteOut:
    """Resolve an item you hold with an active code of the catalogue (`GET /resolutions`).

    When `abs(variance_amount)` reaches the code's `approval_threshold`, the item is not resolved:
    it becomes AWAITING_APPROVAL (`submitted_for_approval`) until an approver approves or rejects
    it. A retry with the same resolution answers `already_resolved` (`already_submitted`). An
    unknown or inactive code, or a missing note the code requires, is a 422 naming the codes.
    Refused with SOURCE_CHANGED (the current item and a new lease_token in the answer) when the
    figures changed under your lease and this call does not show you saw the new ones.
    """
    outcome, item = await queue.complete_item(
        one_round_trip(request),
        item_id=item_id,
        reviewer=principal.subject,
        resolution=body.resolution,
        note=body.note,
        lease_nonce=_nonce(item_id, body.lease_token),
        source_hash=body.source_hash,
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
    return CompleteOut(outcome=outcome, item=ItemOut.of(item, principal.subject))


@router.post("/items/complete", operation_id="completeItems", summary="Resolve items you hold, in one call")
async def complete_batch(body: CompleteBatchIn, principal: Reviewer, request: Request) -> CompleteBatchOut:
    """Resolve up to 200 items you hold in one transaction and one statement. Each entry gets
    exactly the answer POST /items/{id}/complete would give it, in request order; a refused entry
    changes nothing and never undoes the others."""
    completions = [
        queue.Completion(e.id, e.resolution, e.note, _nonce(e.id, e.lease_token), e.source_hash)
        for e in body.items
    ]
    results = await queue.complete_items(
        one_round_trip(request), completions=completions, reviewer=principal.subject
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
    nonce = _nonce(item_id, body.lease_token if body else None)
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
    nonce = _nonce(item_id, body.lease_token)
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


@router.post(
    "/items",
    operation_id="enqueueItem",
    summary="Enqueue an item",
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": ItemOut, "description": "The same key and payload arrived before."},
        **problem_responses("IDEMPOTENCY_CONFLICT"),
    },
)
async def enqueue(
    body: ItemIn, unit: Work, principal: Ingest, response: Response, settings: SettingsDep
) -> ItemOut:
    """Enqueue an item for review; idempotent on `idempotency_key`. Without `due_at`, the item is
    due its SLA tier's hours after enqueue (REVIEW_QUEUE_SLA_TIERS, by abs(variance_amount))."""
    outcome, item = await queue.enqueue_item(unit, new=_new_item(body, settings), actor=principal.subject)
    if outcome == "conflict":
        raise ProblemError(
            "IDEMPOTENCY_CONFLICT", _conflict_detail(body.idempotency_key), extra={"item_id": str(item.id)}
        )
    if outcome == "existing":
        response.status_code = status.HTTP_200_OK
    return ItemOut.of(item)


@router.post("/items/batch", operation_id="enqueueItems", summary="Enqueue items in one transaction")
async def enqueue_batch(body: BatchIn, unit: Work, principal: Ingest, settings: SettingsDep) -> BatchOut:
    """Enqueue up to 1000 items in one transaction; one result per item, in request order."""
    results = await queue.enqueue_items(
        unit, new=[_new_item(i, settings) for i in body.items], actor=principal.subject
    )
    out = []
    for (outcome, item), sent in zip(results, body.items, strict=True):
        if outcome == "conflict":
            problem = problem_body(
                "IDEMPOTENCY_CONFLICT", _conflict_detail(sent.idempotency_key), item_id=str(item.id)
            )
            out.append(BatchResult(outcome=outcome, problem=Problem(**problem)))
        else:
            out.append(BatchResult(outcome=outcome, item=ItemOut.of(item)))
    return BatchOut(results=out)


@router.get("/items", operation_id="listItems", summary="List items")
async def list_items(query: Annotated[ItemQuery, Query()], unit: Work, principal: AnyRole) -> ItemPage:
    """Items oldest first (or earliest due first, `sort=due_at`), filtered, paginated by keyset;
    `leased_by=me` is the caller's own work. `min_amount` and `max_amount` bound abs(variance_amount);
    `q` finds an id, an idempotency key or a ledger entity."""
    after = decode_cursor(query.cursor) if query.cursor else None
    where = queue.ItemFilter(
        state=query.state,
        leased_by=principal.subject if query.leased_by == "me" else query.leased_by,
        resolved_by=principal.subject if query.resolved_by == "me" else query.resolved_by,
        ledger_entity=query.ledger_entity,
        match_decision=query.match_decision,
        idempotency_key=query.idempotency_key,
        created_after=query.created_after,
        created_before=query.created_before,
        due_before=query.due_before,
        min_amount=query.min_amount,
        max_amount=query.max_amount,
        search=query.q,
    )
    # One row more than asked tells whether there is a next page without a count.
    rows = await queue.list_items(unit, where=where, after=after, limit=query.limit + 1, order=query.sort)
    page = rows[: query.limit]
    more = len(rows) > query.limit
    last = page[-1] if page else None
    return ItemPage(
        items=[ItemOut.of(i, principal.subject) for i in page],
        next_cursor=encode_cursor(getattr(last, query.sort), last.id) if more and last else None,
    )


@router.get("/decisions", operation_id="listDecisions", summary="List a reviewer's decisions")
async def list_decisions(
    query: Annotated[DecisionQuery, Query()], unit: Work, principal: AnyRole
) -> DecisionsPage:
    """What a reviewer decided, newest first: the RESOLVED, SUBMITTED_FOR_APPROVAL, APPROVED and
    REJECTED events they are the actor of (`actor=me`: the caller), each with its item as it is now.
    Keyset-paginated by the event id."""
    actor = principal.subject if query.actor == "me" else fold_subject(query.actor)
    before = decode_event_cursor(query.cursor) if query.cursor else None
    rows = await queue.decisions(unit, actor=actor, before=before, limit=query.limit + 1)
    page = rows[: query.limit]
    return DecisionsPage(
        decisions=[
            DecisionOut(event=EventOut.model_validate(d.event), item=ItemOut.of(d.item, principal.subject))
            for d in page
        ],
        next_cursor=encode_event_cursor(page[-1].event.id) if len(rows) > query.limit else None,
    )


@router.get(
    "/items/{item_id}",
    operation_id="getItem",
    summary="Get an item",
    responses=problem_responses("NOT_FOUND"),
)
async def get_item(item_id: ItemId, unit: Work, principal: AnyRole) -> ItemOut:
    return ItemOut.of(await _existing(unit, item_id), principal.subject)


@router.get(
    "/items/{item_id}/events",
    operation_id="getItemEvents",
    summary="Get an item's audit trail",
    responses=problem_responses("NOT_FOUND"),
)
async def get_events(
    item_id: ItemId, query: Annotated[EventQuery, Query()], unit: Work, _: AnyRole
) -> EventsOut:
    """The item's audit trail, oldest first, paginated by keyset like `GET /items`."""
    after = decode_event_cursor(query.cursor) if query.cursor else None
    await _existing(unit, item_id)
    rows = await queue.item_events(unit, item_id=item_id, after=after, limit=query.limit + 1)
    page = rows[: query.limit]
    return EventsOut(
        events=[EventOut.model_validate(e) for e in page],
        next_cursor=encode_event_cursor(page[-1].id) if len(rows) > query.limit else None,
    )


async def _existing(unit: Unit, item_id: UUID) -> queue.Item:
    item = await queue.get_item(unit, item_id=item_id)
    if item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    return item


@router.post(
    "/items/{item_id}/requeue",
    operation_id="requeueItem",
    summary="Requeue a quarantined item",
    responses=problem_responses("NOT_FOUND", "NOT_QUARANTINED"),
)
async def requeue(item_id: ItemId, body: RequeueIn, principal: Admin, unit: Work) -> ItemOut:
    """Put a QUARANTINED item back in the queue, in its old place, with its attempts reset (admin)."""
    outcome, item = await queue.requeue_item(
        unit, item_id=item_id, actor=principal.subject, reason=body.reason
    )
    return _moved_by_admin(outcome, item, item_id, principal, needs="QUARANTINED")


def _moved_by_admin(
    outcome: str, item: queue.Item | None, item_id: UUID, principal: Principal, *, needs: str
) -> ItemOut:
    """The answer of an admin's state change that applies only to items in state `needs`."""
    if outcome == "not_found" or item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    if outcome != "done":
        raise ProblemError(f"NOT_{needs}", f"item {item_id} is {item.state}, not {needs}")
    return ItemOut.of(item, principal.subject)


@router.post(
    "/items/{item_id}/reopen",
    operation_id="reopenItem",
    summary="Reopen a resolved item (admin)",
    responses=problem_responses("NOT_FOUND", "NOT_RESOLVED"),
)
async def reopen(item_id: ItemId, body: ReopenIn, principal: Admin, unit: Work) -> ItemOut:
    """Put a RESOLVED item back to PENDING, in its old place; the REOPENED event keeps the old
    decision and the reason (admin)."""
    outcome, item = await queue.reopen_item(
        unit, item_id=item_id, actor=principal.subject, reason=body.reason
    )
    return _moved_by_admin(outcome, item, item_id, principal, needs="RESOLVED")


_APPROVAL_PROBLEMS = problem_responses("NOT_FOUND", "LEASE_NOT_HELD", "SEGREGATION_OF_DUTIES")


async def _approval_refused(
    unit: Unit,
    outcome: queue.ApprovalOutcome,
    item: queue.Item | None,
    item_id: UUID,
    approver: Principal,
) -> None:
    if outcome == "not_found" or item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    if outcome == "segregation_of_duties":
        raise ProblemError(
            "SEGREGATION_OF_DUTIES",
            f"you prepared the proposal of item {item_id}; another approver must decide it",
            extra={"prepared_by": item.prepared_by},
        )
    if outcome == "lease_not_held":
        lost = None
        if _may_have_lost(outcome, item, approver):  # the refusal changed nothing: read why, here
            lost = (await queue.lost_leases(unit, item_ids=[item_id], holder=approver.subject)).get(item_id)
        raise not_held(item_id, lost, lease="approval lease")


@router.post(
    "/items/{item_id}/approve",
    operation_id="approveItem",
    summary="Approve a proposal you hold the approval lease of",
    responses=_APPROVAL_PROBLEMS,
)
async def approve(
    item_id: ItemId, unit: Work, principal: Approver, body: Annotated[ApproveIn | None, Body()] = None
) -> ApproveOut:
    """Resolve an AWAITING_APPROVAL item with the preparer's proposal: `resolved_by` is the
    preparer, `approved_by` you (roles approver, admin). Never your own proposal (403
    `SEGREGATION_OF_DUTIES`). A retry answers `already_approved`."""
    outcome, item = await queue.approve_item(
        unit,
        item_id=item_id,
        approver=principal.subject,
        lease_nonce=_nonce(item_id, body.lease_token if body else None),
    )
    await _approval_refused(unit, outcome, item, item_id, principal)
    assert item is not None and outcome in ("approved", "already_approved")
    return ApproveOut(outcome=outcome, item=ItemOut.of(item, principal.subject))


@router.post(
    "/items/{item_id}/reject",
    operation_id="rejectItem",
    summary="Reject a proposal you hold the approval lease of",
    responses=_APPROVAL_PROBLEMS,
)
async def reject(item_id: ItemId, body: RejectIn, unit: Work, principal: Approver) -> ItemOut:
    """Send an AWAITING_APPROVAL item back to PENDING, first in line; the REJECTED event keeps
    the proposal and your reason (roles approver, admin; never your own proposal)."""
    outcome, item = await queue.reject_item(
        unit,
        item_id=item_id,
        approver=principal.subject,
        reason=body.reason,
        lease_nonce=_nonce(item_id, body.lease_token),
    )
    await _approval_refused(unit, outcome, item, item_id, principal)
    assert item is not None
    return ItemOut.of(item, principal.subject)


@router.post(
    "/items/{item_id}/revisions",
    operation_id="reviseItem",
    summary="Revise an item's figures (ingest, admin)",
    responses=problem_responses("NOT_FOUND", "IDEMPOTENCY_CONFLICT"),
)
async def revise(item_id: ItemId, body: RevisionIn, unit: Work, principal: Ingest) -> RevisionOut:
    """New figures from a re-run of the matcher; idempotent on `source_hash`. PENDING and QUARANTINED
    items are updated; an ASSIGNED one stays with its holder under a new lease (their old token is
    refused with SOURCE_CHANGED); a RESOLVED one is reopened (PENDING in its old place), its decision
    kept in the trail as decertified."""
    revision = await queue.revise_item(
        unit,
        item_id=item_id,
        actor=principal.subject,
        variance_amount=body.variance_amount,
        source_hash=body.source_hash,
        match_decision=body.match_decision,
    )
    item = revision.item
    if revision.outcome == "not_found" or item is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    if revision.outcome == "conflict":
        raise ProblemError(
            "IDEMPOTENCY_CONFLICT",
            f"item {item_id} already has source_hash {body.source_hash!r} with other figures",
            extra={"item_id": str(item_id)},
        )
    return RevisionOut(outcome=revision.outcome, item=ItemOut.of(item, principal.subject))
