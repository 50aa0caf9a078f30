"""The client's result types (client/models.py) against the OpenAPI document the server serves: each
has its schema's fields, each required where the schema requires it, and each nested model the one
the schema refers to. So a field the server adds, drops, renames or makes optional, and the client
misses, fails here (test_models.py compares the same models with the server's pydantic classes)."""

from types import UnionType
from typing import Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel

import client.models
from tests.support.openapi import OPENAPI

SCHEMAS: dict[str, Any] = OPENAPI["components"]["schemas"]
# Client models that are no response schema of their own: each says where it is checked instead.
NOT_IN_THE_DOCUMENT = {
    "ReportOut": "the fields every report shares: checked through SlaOut, ThroughputOut, BacklogOut",
    "DecisionRowOut": "a line of the NDJSON export (a string in the document): checked by test_models.py",
}
MODELS = [
    model
    for name, model in vars(client.models).items()
    if isinstance(model, type) and issubclass(model, BaseModel) and model is not BaseModel
]
COMPARED = [m for m in MODELS if m.__name__ not in NOT_IN_THE_DOCUMENT]


def _client_fields(model: type[BaseModel]) -> dict[str, bool]:
    """Each field by its name on the wire, and whether it is required."""
    return {f.alias or name: f.is_required() for name, f in model.model_fields.items()}


def _schema_fields(schema: dict[str, Any]) -> dict[str, bool]:
    required = set(schema.get("required", []))
    return {name: name in required for name in schema["properties"]}


def _refs(schema: Any) -> set[str]:
    """The component schemas a property's schema refers to (through anyOf, items, ...)."""
    if isinstance(schema, dict):
        found = {schema["$ref"].rsplit("/", 1)[1]} if "$ref" in schema else set()
        return found.union(*(_refs(value) for value in schema.values()))
    if isinstance(schema, list):
        return set().union(*(_refs(value) for value in schema))
    return set()


def _models(annotation: Any) -> set[str]:
    """The client models an annotation holds (through Optional, list, dict, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation.__name__}
    if get_origin(annotation) in (Union, UnionType, list, dict) or get_args(annotation):
        return set().union(*(_models(arg) for arg in get_args(annotation)))
    return set()


def _nested(model: type[BaseModel]) -> dict[str, set[str]]:
    return {f.alias or name: _models(f.annotation) for name, f in model.model_fields.items()}


def test_every_client_model_is_compared_or_says_why_not() -> None:
    names = {m.__name__ for m in MODELS}
    assert set(NOT_IN_THE_DOCUMENT) <= names
    assert len(COMPARED) >= 20
    assert {m.__name__ for m in COMPARED} <= set(SCHEMAS)
    assert {"ItemOut", "FeedOut", "CompleteResult", "SlaOut"} <= {m.__name__ for m in COMPARED}


@pytest.mark.parametrize("model", COMPARED, ids=[m.__name__ for m in COMPARED])
def test_the_client_model_has_its_openapi_schemas_fields(model: type[BaseModel]) -> None:
    schema = SCHEMAS[model.__name__]
    assert _client_fields(model) == _schema_fields(schema)
    assert _nested(model) == {name: _refs(prop) for name, prop in schema["properties"].items()}


def test_a_drifted_field_is_seen() -> None:
    """The comparison is not vacuous: a field made optional, one missing and one extra all differ."""
    schema = SCHEMAS["RateOut"]
    assert _schema_fields(schema) == {"currency": True, "rate": True, "set_by": True, "set_at": True}
    optional = {**schema, "required": ["currency", "rate", "set_by"]}
    assert _client_fields(client.models.RateOut) != _schema_fields(optional)
    extra = {**schema, "properties": {**schema["properties"], "source": {"type": "string"}}}
    assert _client_fields(client.models.RateOut) != _schema_fields(extra)
    assert _nested(client.models.FeedEventOut)["item"] == {"ItemOut"}
