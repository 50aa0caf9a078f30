"""The resolution catalogue: the codes a completion may name."""

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from sqlalchemy import (
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects.postgresql import insert

from db.catalogue import approval_threshold
from db.tables import resolution_code as catalogue
from db.unit import Unit


@dataclass(frozen=True, slots=True)
class ResolutionCode:
    code: str
    label: str
    description: str
    requires_note: bool
    approval_threshold: Decimal | None
    active: bool
    updated_at: datetime
    effective_approval_threshold: Decimal | None  # the lower of approval_threshold and materiality


_CODE_COLUMNS = [
    *(catalogue.c[f.name] for f in dataclasses.fields(ResolutionCode)[:-1]),
    approval_threshold(catalogue.c.approval_threshold).label("effective_approval_threshold"),
]


async def list_resolution_codes(unit: Unit, *, include_inactive: bool = False) -> list[ResolutionCode]:
    query = select(*_CODE_COLUMNS).order_by(catalogue.c.code)
    if not include_inactive:
        query = query.where(catalogue.c.active)
    return [ResolutionCode(*r.values()) for r in await unit.execute(query, {})]


async def get_resolution_code(unit: Unit, *, code: str) -> ResolutionCode | None:
    rows = await unit.execute(select(*_CODE_COLUMNS).where(catalogue.c.code == code), {})
    return ResolutionCode(*rows[0].values()) if rows else None


async def put_resolution_code(
    unit: Unit,
    *,
    code: str,
    label: str,
    description: str,
    requires_note: bool,
    approval_threshold: Decimal | None,
    active: bool,
) -> tuple[bool, ResolutionCode]:
    """Create or replace a code in one statement; answers (created, the code)."""
    values = {
        "code": code,
        "label": label,
        "description": description,
        "requires_note": requires_note,
        "approval_threshold": approval_threshold,
        "active": active,
    }
    new = insert(catalogue).values(**values)
    # xmax = 0: the row was inserted, not updated (PostgreSQL's upsert tells which this way).
    statement = new.on_conflict_do_update(
        index_elements=[catalogue.c.code],
        set_={**{k: new.excluded[k] for k in values if k != "code"}, "updated_at": func.now()},
    ).returning(*_CODE_COLUMNS, literal_column("(resolution_code.xmax = 0)").label("created"))
    (row,) = await unit.execute(statement, {})
    return bool(row.created), ResolutionCode(*list(row.values())[: len(_CODE_COLUMNS)])


async def deactivate_resolution_code(unit: Unit, *, code: str) -> ResolutionCode | None:
    statement = (
        catalogue.update()
        .where(catalogue.c.code == code)
        .values(active=False, updated_at=func.now())
        .returning(*_CODE_COLUMNS)
    )
    rows = await unit.execute(statement, {})
    return ResolutionCode(*rows[0].values()) if rows else None
