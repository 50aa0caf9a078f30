"""The client's own result types (client/models.py) read what the server answers: each has the fields
of the server's response schema of the same name (api/schemas.py), so neither can drift alone, and
each reads every documented example (api/examples.py) the server's schema accepts."""

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

import api.examples
import api.schemas
import client.models

PAIRS = [
    (getattr(client.models, name), getattr(api.schemas, name))
    for name, model in vars(client.models).items()
    if isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel
]
IDS = [ours.__name__ for ours, _ in PAIRS]
EXAMPLES = [value for value in vars(api.examples).values() if isinstance(value, dict)]


def _fields(model: type[BaseModel]) -> dict[str, tuple[str | None, bool]]:
    return {name: (f.alias, f.is_required()) for name, f in model.model_fields.items()}


def _server_reads(model: type[BaseModel], example: dict[str, Any]) -> bool:
    try:
        model.model_validate(example)
    except ValidationError:
        return False
    return True


def test_every_model_the_clients_return_is_compared() -> None:
    compared = {ours for ours, _ in PAIRS}
    assert len(PAIRS) >= 20
    assert {client.models.ItemOut, client.models.FeedOut, client.models.DecisionRowOut} <= compared


@pytest.mark.parametrize(("ours", "theirs"), PAIRS, ids=IDS)
def test_the_client_model_has_the_server_models_fields(
    ours: type[BaseModel], theirs: type[BaseModel]
) -> None:
    assert _fields(ours) == _fields(theirs)


def test_the_client_reads_every_example_the_server_schema_reads() -> None:
    read = 0
    for ours, theirs in PAIRS:
        for example in EXAMPLES:
            if _server_reads(theirs, example):
                assert ours.model_validate(example).model_dump() is not None
                read += 1
    assert read >= 10  # the examples of items, completions, events, the feed and the reports
