"""Items: enqueue, read, and the decisions on an item other than its holder's (requeue, reopen,
approve, reject, revise). The holder's calls (complete, renew, release) are in api/routes/holder.py,
whose router the app adds first."""

from datetime import timedelta
from decimal import Decimal
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Body, Query, Response, status

from api.deps import (
    Admin,
    AnyRole,
    Approver,
    Ingest,
    SettingsDep,
    Work,
)
from api.errors import ProblemError, problem_body, problem_responses
from api.routes.holder import ItemId, may_have_lost, not_held, token_nonce
from api.routing import QueueRoute
from api.schemas import (
    ApproveIn,
    ApproveOut,
    BatchIn,
    BatchOut,
    BatchResult,
    CommentIn,
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
    RejectionOut,
    ReopenIn,
    RequeueIn,
    RevisionIn,
    RevisionOut,
    decode_cursor,
    decode_event_cursor,
    encode_cursor,
    encode_event_cursor,
)
from api.schemas.money import decimals_problem, in_minor_units
from api.settings import Settings
from db import queue
from db.tokens import Principal, fold_subject
from db.unit import Unit

router = APIRouter(route_class=QueueRoute, tags=["items"])


def _in_its_currency(amount: Decimal, currency: str, loc: list[str | int]) -> Decimal:
    """The amount with exactly its currency's decimals, or a 422 naming them: a rule across two
    fields, so checked here and not by the field's own type (never rounded)."""
    problem = decimals_problem(amount, currency)
    if problem is not None:
        where = ".".join(map(str, loc))
        raise ProblemError(
            "VALIDATION_ERROR",
            f"{where}: {problem}",
            extra={"errors": [{"loc": loc, "msg": problem, "type": "currency_minor_units"}]},
        )
    return in_minor_units(amount, currency)


def _new_item(body: ItemIn, settings: Settings, loc: list[str | int]) -> queue.NewItem:
    currency = body.currency or settings.base_currency
    amount = _in_its_currency(body.variance_amount, currency, [*loc, "variance_amount"])
    return queue.NewItem(**{**body.model_dump(), "variance_amount": amount, "currency": currency})


def _conflict_detail(key: str) -> str:
    return f"idempotency_key {key!r} exists with a different payload"


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
    due its SLA tier's hours after enqueue (REVIEW_QUEUE_SLA_TIERS, base-currency amounts, by
    abs(variance_amount) converted at its currency's latest rate; no rate: the strictest tier)."""
    outcome, item = await queue.enqueue_item(
        unit,
        new=_new_item(body, settings, ["body"]),
        actor=principal.subject,
        sla_tiers=settings.sla_tiers,
        base_currency=settings.base_currency,
    )
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
        unit,
        new=[_new_item(sent, settings, ["body", "items", n]) for n, sent in enumerate(body.items)],
        actor=principal.subject,
        sla_tiers=settings.sla_tiers,
        base_currency=settings.base_currency,
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
async def list_items(
    query: Annotated[ItemQuery, Query()], unit: Work, principal: AnyRole, settings: SettingsDep
) -> ItemPage:
    """Items oldest first (or earliest due first, `sort=due_at`), filtered, paginated by keyset;
    `leased_by=me` is the caller's own work. `min_amount` and `max_amount` bound abs(variance_amount):
    in `currency` when given, else its base-currency equivalent at the latest rates (an item whose
    currency has no rate matches no bound then); `q` finds, in any letter case, a prefix of the id,
    the idempotency key, the ledger entity or any string or number in `context`."""
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
        currency=query.currency,
        base_currency=settings.base_currency,
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
    REJECTED events they are the actor of (`actor=me`: the caller), each with its item as it is now
    and, of a submission an approver rejected, the `rejection` (who, why, when). Keyset-paginated by
    the event id."""
    actor = principal.subject if query.actor == "me" else fold_subject(query.actor)
    before = decode_event_cursor(query.cursor) if query.cursor else None
    rows = await queue.decisions(unit, actor=actor, before=before, limit=query.limit + 1)
    page = rows[: query.limit]
    return DecisionsPage(
        decisions=[
            DecisionOut(
                event=EventOut.model_validate(d.event),
                item=ItemOut.of(d.item, principal.subject),
                rejection=RejectionOut.model_validate(d.rejection) if d.rejection else None,
            )
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
    item = await _existing(unit, item_id)
    rows = await queue.item_events(
        unit, item_id=item_id, since=item.created_at, after=after, limit=query.limit + 1
    )
    page = rows[: query.limit]
    return EventsOut(
        events=[EventOut.model_validate(e) for e in page],
        next_cursor=encode_event_cursor(page[-1].id) if len(rows) > query.limit else None,
    )


@router.post(
    "/items/{item_id}/comments",
    operation_id="commentOnItem",
    summary="Comment on an item",
    status_code=status.HTTP_201_CREATED,
    responses=problem_responses("NOT_FOUND"),
)
async def comment(item_id: ItemId, body: CommentIn, unit: Work, principal: AnyRole) -> EventOut:
    """Append a COMMENTED event with your `text` to the item's trail (every role that reads items;
    integration tokens do not comment). A comment never changes the item: not its state, its lease
    or its place in the queue. It is chained like every event, and is in the feed
    (`item.commented`), the webhooks and the audit export."""
    event = await queue.comment_on_item(unit, item_id=item_id, actor=principal.subject, text=body.text)
    if event is None:
        raise ProblemError("NOT_FOUND", f"no item {item_id}")
    return EventOut.model_validate(event)


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
        if may_have_lost(outcome, item, approver):  # the refusal changed nothing: read why, here
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
        lease_nonce=token_nonce(item_id, body.lease_token if body else None),
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
async def reject(
    item_id: ItemId, body: RejectIn, unit: Work, principal: Approver, settings: SettingsDep
) -> ItemOut:
    """Send an AWAITING_APPROVAL item back to PENDING, to its preparer first: for
    REVIEW_QUEUE_REJECTED_RETURN_S their next lease takes it ahead of due order and nobody else's
    unnamed lease takes it; then it is leasable by anyone in its due-date place. The REJECTED event
    keeps the proposal and your reason (roles approver, admin; never your own proposal)."""
    outcome, item = await queue.reject_item(
        unit,
        item_id=item_id,
        approver=principal.subject,
        reason=body.reason,
        lease_nonce=token_nonce(item_id, body.lease_token),
        returned_for=timedelta(seconds=settings.rejected_return_s),
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
    kept in the trail as decertified. With `currency`, the amount is in that currency from now on."""
    currency = body.currency
    if currency is None:  # the amount is in the item's currency, which it keeps
        current = await queue.get_item(unit, item_id=item_id)
        if current is None:
            raise ProblemError("NOT_FOUND", f"no item {item_id}")
        currency = current.currency
    revision = await queue.revise_item(
        unit,
        item_id=item_id,
        actor=principal.subject,
        variance_amount=_in_its_currency(body.variance_amount, currency, ["body", "variance_amount"]),
        source_hash=body.source_hash,
        match_decision=body.match_decision,
        currency=body.currency,
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
