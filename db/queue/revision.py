"""Source revisions: new figures for an item, moving its lease on or reopening its decision."""

from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    Integer,
    Numeric,
    Text,
    and_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    null,
    or_,
    select,
)

from db import telemetry
from db.notify import notify_work
from db.queue.reads import get_item
from db.queue.rows import (
    _ITEM_COLUMNS,
    _ITEM_FIELDS,
    ASSIGNED,
    AWAITING_APPROVAL,
    PENDING,
    RESOLVED,
    Item,
    _first,
    _item,
    _logged,
)
from db.tables import review_queue_event as event
from db.tables import review_queue_item as item
from db.unit import Unit

# A revision is one statement: the CTE locks the item (unless the revision's source_hash is its
# current one or one it had before: a retry), the UPDATE writes the new figures and, by the state
# it finds, moves the lease on (ASSIGNED: new epoch and nonce, the holder keeps it) or reopens the
# decision (RESOLVED: PENDING in its old place, fresh attempts), and the events (REVISED, then
# REOPENED for a decertified decision) read the old values from the CTE. A completion racing it
# either commits first (and is then decertified here) or finds the lease moved on.
_earlier_hash = exists(
    select(event.c.id).where(
        event.c.item_id == item.c.id,
        event.c.event == "REVISED",
        event.c.details["previous"]["source_hash"].astext == bindparam("new_hash", type_=Text),
    )
)
_revision_target = (
    select(
        item.c.id,
        item.c.state.label("previous_state"),
        item.c.variance_amount.label("previous_amount"),
        item.c.currency.label("previous_currency"),
        item.c.match_decision.label("previous_decision"),
        item.c.source_hash.label("previous_hash"),
        item.c.leased_by.label("previous_holder"),
        item.c.resolution.label("previous_resolution"),
        item.c.resolution_note.label("previous_note"),
        item.c.resolved_by.label("previous_resolved_by"),
        item.c.resolved_at.label("previous_resolved_at"),
        item.c.approved_by.label("previous_approved_by"),
    )
    .where(
        item.c.id == bindparam("item_id"),
        item.c.source_hash != bindparam("new_hash", type_=Text),
        ~_earlier_hash,
    )
    .with_for_update()
    .cte("revision_target")
)
_was_resolved = item.c.state == RESOLVED
_was_assigned = item.c.state == ASSIGNED
_was_awaiting = item.c.state == AWAITING_APPROVAL


def _unless_reopened(column: Any) -> Any:
    """`column` kept, or NULL when the revision puts a resolved or proposed item back to PENDING."""
    return case((or_(_was_resolved, _was_awaiting), null()), else_=column)


def _unless_resolved(column: Any, value: Any = None) -> Any:
    """`column` kept, or `value` (NULL by default) when the revision reopens a resolved item."""
    return case((_was_resolved, null() if value is None else value), else_=column)


_revised = (
    item.update()
    .where(item.c.id == _revision_target.c.id, item.c.source_hash == _revision_target.c.previous_hash)
    .values(
        variance_amount=bindparam("new_amount", type_=Numeric()),
        currency=func.coalesce(bindparam("new_currency", type_=Text), item.c.currency),
        match_decision=func.coalesce(bindparam("new_decision", type_=Text), item.c.match_decision),
        source_hash=bindparam("new_hash", type_=Text),
        # Reopened in its old place (due_at and created_at are kept). A proposal awaiting approval
        # rested on the old figures: back to PENDING too (any approval lease ends), its proposal kept
        # on the row until the next completion, as after a rejection.
        state=case((_was_resolved, PENDING), (_was_awaiting, PENDING), else_=item.c.state),
        resolution=_unless_resolved(item.c.resolution),
        resolution_note=_unless_resolved(item.c.resolution_note),
        resolved_by=_unless_resolved(item.c.resolved_by),
        resolved_at=_unless_resolved(item.c.resolved_at),
        leased_by=_unless_reopened(item.c.leased_by),
        leased_at=_unless_reopened(item.c.leased_at),
        lease_expires_at=_unless_reopened(item.c.lease_expires_at),
        approved_by=_unless_resolved(item.c.approved_by),
        approved_at=_unless_resolved(item.c.approved_at),
        attempts=_unless_resolved(item.c.attempts, literal_column("0", Integer)),
        # The holder keeps the item under a new lease: every token of the old one is dead.
        lease_epoch=case((_was_assigned, item.c.lease_epoch + 1), else_=item.c.lease_epoch),
        lease_nonce=case(
            (_was_assigned, func.gen_random_uuid()), (_was_resolved, null()), else_=item.c.lease_nonce
        ),
        revised_epoch=case((_was_assigned, item.c.lease_epoch + 1), else_=item.c.revised_epoch),
    )
    .returning(*_ITEM_COLUMNS, *[c for c in _revision_target.c if c.name != "id"])
    .cte("revised")
)


def _figures(amount: Any, currency: Any, decision: Any, source_hash: Any) -> Any:
    # The amount as text: a JSON number would be read back as a float.
    return func.jsonb_build_object(
        "variance_amount",
        cast(amount, Text),
        "currency",
        currency,
        "match_decision",
        decision,
        "source_hash",
        source_hash,
    )


_revised_logged = _logged(
    _revised,
    "REVISED",
    details=func.jsonb_build_object(
        "previous",
        _figures(
            _revised.c.previous_amount,
            _revised.c.previous_currency,
            _revised.c.previous_decision,
            _revised.c.previous_hash,
        ),
        "current",
        _figures(
            _revised.c.variance_amount, _revised.c.currency, _revised.c.match_decision, _revised.c.source_hash
        ),
        "previous_state",
        _revised.c.previous_state,
        "holder",
        _revised.c.previous_holder,
    ),
)
# After REVISED (it reads that insert's RETURNING): the decision that rested on the old figures.
_decertified_logged = _logged(
    _revised,
    "REOPENED",
    details=func.jsonb_build_object(
        "reason",
        "source revised",
        "decertified",
        True,
        "previous_resolution",
        _revised.c.previous_resolution,
        "previous_note",
        _revised.c.previous_note,
        "previous_resolved_by",
        _revised.c.previous_resolved_by,
        "previous_resolved_at",
        _revised.c.previous_resolved_at,
        "previous_approved_by",
        _revised.c.previous_approved_by,
    ),
    where=and_(_revised.c.previous_state == RESOLVED, _revised.c.id.in_(select(_revised_logged.c.item_id))),
)
_REVISE: Any = select(
    *[_revised.c[n] for n in _ITEM_FIELDS],
    _revised.c.previous_state,
    _revised.c.previous_amount,
    _revised.c.previous_currency,
    _revised.c.previous_decision,
    _revised.c.previous_hash,
    _revised.c.previous_resolution,
).add_cte(_revised_logged, _decertified_logged)

RevisionOutcome = Literal["revised", "unchanged", "superseded", "conflict", "not_found"]


@dataclass(frozen=True, slots=True)
class Revision:
    outcome: RevisionOutcome
    item: Item | None
    previous_state: str | None = None
    previous_amount: Decimal | None = None
    previous_currency: str | None = None
    previous_decision: str | None = None
    previous_hash: str | None = None
    previous_resolution: str | None = None


async def revise_item(
    unit: Unit,
    *,
    item_id: UUID,
    actor: str,
    variance_amount: Decimal,
    source_hash: str,
    match_decision: str | None,
    currency: str | None = None,
) -> Revision:
    """New figures for an item; idempotent on source_hash (its current one: `unchanged`, or a
    `conflict` when the figures differ; an earlier one: `superseded`, nothing changes)."""
    params = {
        "item_id": item_id,
        "actor": actor,
        "new_amount": variance_amount,
        "new_hash": source_hash,
        "new_decision": match_decision,
        "new_currency": currency,
    }
    row = _first(await unit.execute(_REVISE, params))
    if row is not None:
        revised = _item(row)
        if revised.state == "PENDING":
            await notify_work(unit)  # a reopened decision is leasable again
        unit.after_commit(
            partial(
                telemetry.revised,
                revised,
                actor,
                previous_state=row.previous_state,
                previous_source_hash=row.previous_hash,
                previous_variance_amount=str(row.previous_amount),
                previous_currency=row.previous_currency,
                previous_match_decision=row.previous_decision,
                variance_amount=str(revised.variance_amount),
                currency=revised.currency,
                decertified_resolution=row.previous_resolution,
                state=revised.state,
            )
        )
        return Revision(
            "revised",
            revised,
            row.previous_state,
            row.previous_amount,
            row.previous_currency,
            row.previous_decision,
            row.previous_hash,
            row.previous_resolution,
        )
    current = await get_item(unit, item_id=item_id)
    if current is None:
        return Revision("not_found", None)
    if current.source_hash != source_hash:
        return Revision("superseded", current)
    same = (
        current.variance_amount == variance_amount
        and currency in (None, current.currency)
        and match_decision in (None, current.match_decision)
    )
    return Revision("unchanged" if same else "conflict", current)
