"""The OpenAPI document is a contract for generated clients: stable operationIds, one tag per
resource, a summary, examples that match their own schemas, and a version."""

from typing import Any

import jsonschema_rs  # schemathesis' own validator
import pytest

from api.app import API_VERSION
from tests.support.openapi import OPENAPI

# Renaming one breaks every generated client: a change here is a breaking change (a new major).
OPERATION_IDS = {
    ("post", "/items"): "enqueueItem",
    ("post", "/items/batch"): "enqueueItems",
    ("get", "/items"): "listItems",
    ("get", "/items/{item_id}"): "getItem",
    ("put", "/fx-rates/{currency}"): "setFxRate",
    ("get", "/fx-rates"): "listFxRates",
    ("get", "/fx-rates/{currency}/history"): "fxRateHistory",
    ("get", "/items/{item_id}/events"): "getItemEvents",
    ("get", "/decisions"): "listDecisions",
    ("post", "/items/{item_id}/complete"): "completeItem",
    ("post", "/items/complete"): "completeItems",
    ("post", "/items/{item_id}/renew"): "renewItem",
    ("post", "/items/{item_id}/release"): "releaseItem",
    ("post", "/items/{item_id}/requeue"): "requeueItem",
    ("post", "/items/{item_id}/reopen"): "reopenItem",
    ("post", "/items/{item_id}/approve"): "approveItem",
    ("post", "/items/{item_id}/reject"): "rejectItem",
    ("post", "/items/{item_id}/comments"): "commentOnItem",
    ("get", "/resolutions"): "listResolutions",
    ("put", "/resolutions/{code}"): "putResolution",
    ("get", "/resolutions/policy"): "getResolutionPolicy",
    ("put", "/resolutions/policy"): "putResolutionPolicy",
    ("post", "/items/{item_id}/revisions"): "reviseItem",
    ("post", "/admin/items/{item_id}/release"): "adminReleaseItem",
    ("post", "/admin/reviewers/{reviewer}/release"): "adminReleaseReviewer",
    ("post", "/admin/items/{item_id}/reassign"): "reassignItem",
    ("post", "/leases"): "leaseItems",
    ("post", "/admin/reclaim"): "reclaimExpired",
    ("get", "/stats"): "getStats",
    ("get", "/metrics"): "getMetrics",
    ("get", "/healthz"): "healthz",
    ("get", "/readyz"): "readyz",
    ("post", "/session"): "signIn",
    ("get", "/session"): "getSession",
    ("delete", "/session"): "signOut",
    ("get", "/auth/oidc"): "getOidcProvider",
    ("get", "/auth/oidc/login"): "startOidcSignIn",
    ("get", "/auth/oidc/callback"): "finishOidcSignIn",
    ("get", "/audit/export"): "exportAudit",
    ("get", "/events"): "readFeed",
    ("put", "/webhooks/{name}"): "putWebhook",
    ("get", "/webhooks"): "listWebhooks",
    ("get", "/webhooks/{name}/deliveries"): "listWebhookDeliveries",
    ("post", "/webhooks/{name}/redeliver"): "redeliverWebhook",
    ("get", "/reports/sla"): "getSlaReport",
    ("get", "/reports/throughput"): "getThroughputReport",
    ("get", "/reports/backlog"): "getBacklogReport",
    ("get", "/reports/decisions.csv"): "exportDecisionsCsv",
    ("get", "/reports/decisions.ndjson"): "exportDecisionsNdjson",
}


def _operations() -> dict[tuple[str, str], dict[str, Any]]:
    return {(m, p): op for p, ops in OPENAPI["paths"].items() for m, op in ops.items()}


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = OPENAPI["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:  # an optional body: the object or null
        (schema,) = [s for s in schema["anyOf"] if s.get("type") != "null"]
        return _resolve(schema)
    return schema


def _validate(example: object, schema: dict[str, Any]) -> None:
    # $refs inside resolve against the whole document's components.
    jsonschema_rs.Draft202012Validator({**schema, "components": OPENAPI["components"]}).validate(example)


def test_every_operation_has_its_stable_id_one_tag_and_a_summary() -> None:
    operations = _operations()
    assert {k: op.get("operationId") for k, op in operations.items()} == OPERATION_IDS
    tags = {t["name"] for t in OPENAPI["tags"]}
    for key, op in operations.items():
        assert len(op["tags"]) == 1 and op["tags"][0] in tags, (key, op["tags"])
        assert op.get("summary"), f"{key} has no summary"


def test_the_api_is_versioned() -> None:
    assert OPENAPI["info"]["version"] == API_VERSION
    assert API_VERSION.count(".") == 2 and int(API_VERSION.split(".")[0]) >= 1


def _bodies() -> list[tuple[str, dict[str, Any]]]:
    bodies = []
    for (method, path), op in _operations().items():
        if "requestBody" in op:
            bodies.append(
                (f"{method} {path} request", op["requestBody"]["content"]["application/json"]["schema"])
            )
        for status, response in op["responses"].items():
            content = response.get("content", {}).get("application/json")
            if content and content.get("schema"):
                bodies.append((f"{method} {path} {status}", content["schema"]))
    return bodies


@pytest.mark.parametrize(("where", "schema"), _bodies(), ids=[w for w, _ in _bodies()])
def test_every_request_and_json_response_body_has_examples_that_match_its_schema(
    where: str, schema: dict[str, Any]
) -> None:
    resolved = _resolve(schema)
    examples = resolved.get("examples")
    assert examples, f"{where}: no example"
    for example in examples:
        _validate(example, schema)


def test_every_period_states_its_rules_across_parameters() -> None:
    """A report's `from` and `to` obey rules a JSON Schema cannot state; the operation states them
    (`x-period`, read by tests/integration/api/test_reports.py against what the API does) and so does `to`."""
    periods = {
        key: op
        for key, op in _operations().items()
        if any(
            p["name"] == "from" and _resolve(p["schema"]).get("format") == "date"
            for p in op.get("parameters", [])
        )
    }
    assert {path for _, path in periods} == {p for p in OPENAPI["paths"] if p.startswith("/reports/")}
    for key, op in periods.items():
        rules = op.get("x-period")
        assert rules and rules["to_after_from"] is True, f"{key}: no x-period"
        (to,) = [p for p in op["parameters"] if p["name"] == "to"]
        assert "after `from`" in to["description"], key
        bucket = {p["name"]: _resolve(p["schema"]) for p in op["parameters"]}.get("bucket")
        sizes = set(bucket.get("enum") or [bucket["const"]]) if bucket else set()
        assert set(rules.get("max_buckets", {})) == sizes, (key, rules, sizes)
        assert ("week_starts_on" in rules) == ("week" in sizes), (key, rules)
        for size, most in rules.get("max_buckets", {}).items():
            unit = "weeks" if size == "week" else "days"
            assert f"{most} {unit}" in to["description"], (key, to["description"])
