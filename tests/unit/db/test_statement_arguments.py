"""db.engine's arguments of a compiled statement, decided once per statement (_plan), give what
SQLAlchemy's construct_params gives on every call: the same values, in the same order."""

from datetime import timedelta
from uuid import uuid4

import pytest
from sqlalchemy import bindparam, select

from db.engine import _arguments, _compiled
from db.queue.completion import _COMPLETE_ITEMS
from db.queue.lease import _LEASES, _RELEASE, _RENEW

COMPLETION = {
    "item_ids": [uuid4(), uuid4()],
    "resolutions": ["APPROVED", "WRITE_OFF"],
    "notes": [None, "a note"],
    "fence_nonces": [uuid4(), None],
    "expected_source_hashes": [None, "h"],
    "actor": "rev-1",
    "base_currency": "EUR",
}


def _both(statement: object, parameters: dict[str, object]) -> tuple[list[object], list[object]]:
    _, compiled, plan = _compiled(statement)  # type: ignore[arg-type]
    assert plan is not None, "the statement should be planned, not left to construct_params"
    return _arguments(compiled, plan, parameters), _arguments(compiled, None, parameters)


def test_the_completion_statement_gets_what_construct_params_gives() -> None:
    planned, constructed = _both(_COMPLETE_ITEMS, COMPLETION)
    assert repr(planned) == repr(constructed), f"planned {planned!r}\nconstructed {constructed!r}"


@pytest.mark.parametrize("key", sorted(_LEASES, key=repr))
def test_the_lease_statements_get_what_construct_params_gives(key: tuple[object, ...]) -> None:
    statement = _LEASES[key]
    _, compiled, _ = _compiled(statement)
    # Every parameter the statement takes, given a value of the right kind from the ones the
    # lease functions pass.
    given: dict[str, object] = {}
    for name in compiled.positiontup or ():
        bind = compiled.binds[name]
        if bind.required:
            given[bind.key] = _value_for(bind.type.python_type if hasattr(bind.type, "python_type") else str)
    planned, constructed = _both(statement, given)
    assert repr(planned) == repr(constructed)


def _value_for(kind: type) -> object:
    try:
        return {int: 7, str: "rev-1", timedelta: timedelta(minutes=5)}.get(kind, uuid4())
    except NotImplementedError:
        return "x"


@pytest.mark.parametrize("statement", [_RENEW, _RELEASE], ids=["renew", "release"])
def test_renew_and_release_are_planned(statement: object) -> None:
    _, _, plan = _compiled(statement)  # type: ignore[arg-type]
    assert plan is not None


def test_a_default_given_by_its_key_or_its_name_wins_and_a_missing_required_one_is_refused() -> None:
    statement = select(bindparam("limit_", value=5), bindparam("who"))
    _, compiled, plan = _compiled(statement)
    assert plan is not None
    assert _arguments(compiled, plan, {"who": "a"}) == _arguments(compiled, None, {"who": "a"}) == [5, "a"]
    assert _arguments(compiled, plan, {"who": "a", "limit_": 9}) == [9, "a"]
    with pytest.raises(KeyError, match="who"):
        _arguments(compiled, plan, {})
