"""Completion: the holder resolves an item, or submits it for approval above the threshold,
one statement for one entry or a batch."""

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import Any, Literal
from uuid import UUID

from sqlalchemy import (
    ColumnElement,
    Numeric,
    Text,
    bindparam,
    case,
    false,
    func,
    literal,
    null,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import UUID as PG_UUID

from db import telemetry
from db.catalogue import approval_threshold
from db.queue.rows import (
    _ITEM_COLUMNS,
    _ITEM_FIELDS,
    AWAITING_APPROVAL,
    RESOLVED,
    Item,
    _announced,
    _held_by_caller,
    _item,
    _logged,
)
from db.tables import fx_rate
from db.tables import resolution_code as catalogue
from db.tables import review_queue_item as item
from db.tokens import same_identity
from db.unit import Unit
from db.vocabulary import DEFAULT_BASE_CURRENCY, NO_LEASE

# The entries of a completion, one row each (an unnest of arrays). Both routes run this one
# statement, the single route with one entry, so POST /items/{id}/complete and POST /items/complete
# have the same guards, values and events; the guards read an entry's columns.
_entries = (
    select(
        func.unnest(
            bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True))),
            bindparam("resolutions", type_=ARRAY(Text)),
            bindparam("notes", type_=ARRAY(Text)),
            bindparam("fence_nonces", type_=ARRAY(PG_UUID(as_uuid=True))),
            bindparam("expected_source_hashes", type_=ARRAY(Text)),
        )
        .table_valued("item_id", "resolution", "note", "fence_nonce", "expected_source_hash")
        .render_derived()
    )
).cte("entries")
_entry = _entries.c


def _code_ok(code: ColumnElement[Any], note: ColumnElement[Any]) -> list[ColumnElement[bool]]:
    # The catalogue entry the completion names, if it is active and its note rule is met: the
    # completion's UPDATE joins the catalogue row itself (UPDATE ... FROM resolution_code), so a
    # deactivation or a threshold change committed by an admin is either wholly before or wholly
    # after it: never between a read and the write. No row: the UPDATE matches nothing and
    # complete_items says why.
    return [
        catalogue.c.code == code,
        catalogue.c.active,
        or_(~catalogue.c.requires_note, func.length(func.btrim(func.coalesce(note, ""))) > 0),
    ]


# At or above the code's threshold or materiality, whichever is lower (by absolute amount), the item
# needs an approver. Both are read by this statement (db/catalogue.py) and are amounts of the base
# currency: an item's amount is converted at the latest rate of its currency set at or before this
# transaction began (fx_rate, read backwards along its (currency, set_at, id) index), exactly, with
# no rounding. The base currency's rate is 1 and no rate is read for it (CASE stops there). A
# currency without a rate has no base amount, and such an item always needs an approver: fail safe.
_base_currency = bindparam("base_currency", type_=Text)
_rate = case(
    (item.c.currency == _base_currency, literal(Decimal(1), Numeric())),
    else_=select(fx_rate.c.rate)
    .where(fx_rate.c.currency == item.c.currency, fx_rate.c.set_at <= func.now())
    .order_by(fx_rate.c.set_at.desc(), fx_rate.c.id.desc())
    .limit(1)
    .scalar_subquery(),
)
_threshold = approval_threshold(catalogue.c.approval_threshold)
_needs_approval = or_(_rate.is_(None), func.abs(item.c.variance_amount) * _rate >= _threshold)


def _unless_approval(resolved: Any, submitted: Any) -> Any:
    return case((_needs_approval, submitted), else_=resolved)


def _saw_current_source(
    fence_nonce: ColumnElement[Any], expected_source_hash: ColumnElement[Any]
) -> list[ColumnElement[bool]]:
    # Nobody decides on figures they have not seen. A completion carrying a source_hash must carry
    # the current one; once a revision moved the lease on, a completion must show it saw the new
    # figures: by the new lease_token (only the 409 SOURCE_CHANGED or a re-read hands it out) or
    # by the current source_hash.
    return [
        item.c.source_hash == func.coalesce(expected_source_hash, item.c.source_hash),
        or_(
            fence_nonce.is_not(None),
            expected_source_hash.is_not(None),
            item.c.revised_epoch.is_distinct_from(item.c.lease_epoch),
        ),
    ]


# Guarded by holder, state and epoch in the one UPDATE: a late completion from a worker whose
# lease was reclaimed (and maybe re-leased) matches zero rows instead of resolving it. Above the
# threshold the same statement submits the proposal instead: AWAITING_APPROVAL, lease cleared, so
# it is in the approval queue the moment this commits.
_resolved = (
    item.update()
    .where(*_held_by_caller(item_id=_entry.item_id, fence_nonce=_entry.fence_nonce))
    # Joins the catalogue row: UPDATE ... FROM entries, resolution_code.
    .where(*_code_ok(_entry.resolution, _entry.note))
    .where(*_saw_current_source(_entry.fence_nonce, _entry.expected_source_hash))
    .values(
        state=_unless_approval(RESOLVED, AWAITING_APPROVAL),
        resolution=_unless_approval(catalogue.c.code, item.c.resolution),
        resolution_note=_unless_approval(_entry.note, item.c.resolution_note),
        resolved_by=_unless_approval(bindparam("actor", type_=Text), item.c.resolved_by),
        resolved_at=_unless_approval(func.now(), item.c.resolved_at),
        prepared_by=_unless_approval(None, bindparam("actor", type_=Text)),
        prepared_at=_unless_approval(None, func.now()),
        proposed_resolution=_unless_approval(None, catalogue.c.code),
        proposed_note=_unless_approval(None, _entry.note),
        approved_by=None,
        approved_at=None,
        leased_by=_unless_approval(item.c.leased_by, None),
        leased_at=_unless_approval(item.c.leased_at, None),
        lease_expires_at=_unless_approval(item.c.lease_expires_at, None),
    )
    .returning(*_ITEM_COLUMNS, _threshold.label("approval_threshold"), _rate.label("fx_rate"))
    .cte("resolved")
)


def _conversion(resolved: Any) -> list[Any]:
    # The evidence of why four eyes applied or not: the rate used and the amount it made (null: no
    # rate, so an approver was needed whatever the amount).
    return ["rate", resolved.c.fx_rate, "base_amount", resolved.c.variance_amount * resolved.c.fx_rate]


_completed = (
    select(*[_resolved.c[n] for n in _ITEM_FIELDS])
    .add_cte(
        _logged(
            _resolved,
            "RESOLVED",
            details=func.jsonb_build_object(
                "resolution",
                _resolved.c.resolution,
                "note",
                _resolved.c.resolution_note,
                *_conversion(_resolved),
            ),
            where=_resolved.c.state == RESOLVED,
        ),
        _logged(
            _resolved,
            "SUBMITTED_FOR_APPROVAL",
            details=func.jsonb_build_object(
                "resolution",
                _resolved.c.proposed_resolution,
                "note",
                _resolved.c.proposed_note,
                "approval_threshold",
                _resolved.c.approval_threshold,
                "variance_amount",
                _resolved.c.variance_amount,
                *_conversion(_resolved),
            ),
            where=_resolved.c.state == AWAITING_APPROVAL,
        ),
    )
    .cte("completed")
)
# The entries the completion refused, read again FOR SHARE: in READ COMMITTED that waits for a
# transaction changing the row and then returns its newest version (a snapshot read would show a
# completion this one queued behind as still ASSIGNED), and it tells the caller why nothing changed.
_refused = (
    select(*_ITEM_COLUMNS)
    .where(
        item.c.id == func.any(bindparam("item_ids", type_=ARRAY(PG_UUID(as_uuid=True)))),
        item.c.id.not_in(select(_completed.c.id)),
    )
    .with_for_update(read=True)
    .cte("refused")
)
# For a refused entry, the catalogue row its code names (NULL: no such code), read in the same
# statement so that the caller can say why (an unknown or inactive code, a missing note) without
# a second read; it only explains: the completion itself checked the code.
_refused_code = (
    select(_entries.c.resolution)
    .where(_entries.c.item_id == _refused.c.id)
    .correlate_except(_entries)  # the refused row of the outer SELECT, two levels up
    .scalar_subquery()
)
# A submission puts its item in the approval queue: approvers waiting for work hear of it.
_submitted = _announced(_completed, _completed.c.state == AWAITING_APPROVAL, "submitted")
_COMPLETE_ITEMS = (
    select(
        true().label("done"),
        *[_completed.c[n] for n in _ITEM_FIELDS],
        null().label("code_active"),
        null().label("code_requires_note"),
    )
    .select_from(_completed.join(_submitted, true()))
    .union_all(
        select(
            false().label("done"),
            *[_refused.c[n] for n in _ITEM_FIELDS],
            select(catalogue.c.active).where(catalogue.c.code == _refused_code).scalar_subquery(),
            select(catalogue.c.requires_note).where(catalogue.c.code == _refused_code).scalar_subquery(),
        )
    )
    # Every row it touches is found by primary key, whatever the values: planned once per
    # connection, not on every call (db.engine.OneRoundTrip; tests/integration/db/test_query_plans.py).
    .execution_options(generic_plan=True)
)


CompleteOutcome = Literal[
    "resolved",
    "already_resolved",
    "submitted_for_approval",
    "already_submitted",
    "resolution_conflict",
    "invalid_resolution",
    "note_required",
    "lease_not_held",
    "source_changed",
    "not_found",
]


@dataclass(frozen=True, slots=True)
class Completion:
    item_id: UUID
    resolution: str
    note: str | None = None
    lease_nonce: UUID | None = None
    source_hash: str | None = None  # the figures the caller decided on, when it says


def _holds(current: Item, actor: str, lease_nonce: UUID | None, state: str) -> bool:
    return (
        current.state == state and current.leased_by == actor and lease_nonce in (None, current.lease_nonce)
    )


def source_changed(current: Item, reviewer: str, lease_nonce: UUID | None, source_hash: str | None) -> bool:
    """Was a holder's refused call refused because the figures changed under their lease (409
    SOURCE_CHANGED, answered with the new values and lease token) rather than because the lease
    is not theirs? `lease_nonce` is the nonce the call's token claims (None without a token)."""
    if current.state != "ASSIGNED" or current.leased_by != reviewer or lease_nonce == NO_LEASE:
        return False
    if source_hash is not None and source_hash != current.source_hash:
        return True
    if not current.revised_during_lease:
        return False
    return lease_nonce != current.lease_nonce if lease_nonce is not None else source_hash is None


def _refusal(
    current: Item, reviewer: str, completion: Completion, code_active: bool | None, requires_note: bool | None
) -> CompleteOutcome:
    """Why a completion changed nothing: the figures changed under the holder's lease
    (SOURCE_CHANGED), a retry of the holder's own completion or submission, the catalogue (an
    unknown or inactive code, a missing note: the holder passed every other guard), or else
    LEASE_NOT_HELD."""
    if source_changed(current, reviewer, completion.lease_nonce, completion.source_hash):
        return "source_changed"
    submitted = current.state == "AWAITING_APPROVAL" and same_identity(current.prepared_by, reviewer)
    if submitted and completion.lease_nonce in (None, current.lease_nonce):
        return (
            "already_submitted"
            if current.proposed_resolution == completion.resolution
            else "resolution_conflict"
        )
    if _holds(current, reviewer, completion.lease_nonce, "ASSIGNED"):
        if not code_active:
            return "invalid_resolution"
        if requires_note and not (completion.note or "").strip():
            return "note_required"
    retry = current.state == "RESOLVED" and current.resolved_by == reviewer
    if (
        retry
        and completion.lease_nonce in (None, current.lease_nonce)
        and completion.source_hash in (None, current.source_hash)
    ):
        return "already_resolved" if current.resolution == completion.resolution else "resolution_conflict"
    return "lease_not_held"


async def complete_items(
    unit: Unit,
    *,
    completions: Sequence[Completion],
    reviewer: str,
    base_currency: str = DEFAULT_BASE_CURRENCY,
) -> list[tuple[CompleteOutcome, Item | None]]:
    """Resolve the items in one statement; answer per input, in input order. An id given more than
    once is applied from its first entry; its later entries answer as a retry of it would."""
    first: dict[UUID, Completion] = {}
    for completion in completions:
        first.setdefault(completion.item_id, completion)
    params = {
        "item_ids": list(first),
        "resolutions": [c.resolution for c in first.values()],
        "notes": [c.note for c in first.values()],
        "fence_nonces": [c.lease_nonce for c in first.values()],
        "expected_source_hashes": [c.source_hash for c in first.values()],
        "actor": reviewer,
        "base_currency": base_currency,
    }
    result = await unit.execute(_COMPLETE_ITEMS, params)
    rows = {row.id: (row.done, _item(row), row.code_active, row.code_requires_note) for row in result}
    results: list[tuple[CompleteOutcome, Item | None]] = []
    for completion in completions:
        done, current, code_active, requires_note = rows.get(completion.item_id, (False, None, None, None))
        if current is None:
            results.append(("not_found", None))
            continue
        if done and completion is first[completion.item_id] and current.state == "AWAITING_APPROVAL":
            unit.after_commit(
                partial(telemetry.submitted, current, reviewer, resolution=completion.resolution)
            )
            results.append(("submitted_for_approval", current))
            continue
        if done and completion is first[completion.item_id]:
            unit.after_commit(
                partial(
                    telemetry.resolved,
                    current,
                    reviewer,
                    idempotency_key=current.idempotency_key,
                    resolution=completion.resolution,
                    resolved_at=current.resolved_at.isoformat() if current.resolved_at else None,
                )
            )
            results.append(("resolved", current))
            continue
        # Nothing changed; the row only tells the caller why.
        outcome = _refusal(current, reviewer, completion, code_active, requires_note)
        unit.after_commit(partial(telemetry.completion_noop, current, reviewer, outcome))
        results.append((outcome, current))
    return results


async def complete_item(
    unit: Unit,
    *,
    item_id: UUID,
    reviewer: str,
    resolution: str,
    note: str | None,
    lease_nonce: UUID | None = None,
    source_hash: str | None = None,
    base_currency: str = DEFAULT_BASE_CURRENCY,
) -> tuple[CompleteOutcome, Item | None]:
    (result,) = await complete_items(
        unit,
        completions=[Completion(item_id, resolution, note, lease_nonce, source_hash)],
        reviewer=reviewer,
        base_currency=base_currency,
    )
    return result
