"""Every error is problem+json with a stable code; nothing malformed produces a 500."""

from collections.abc import Callable

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Route

from tests.api.helpers import assert_problem

Auth = Callable[[str, str], dict[str, str]]


@pytest.fixture
def admin(auth: Auth) -> dict[str, str]:
    return auth("root", "admin")


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        ("{not json", "application/json"),
        ("", "application/json"),
        ("[1,2", "application/json"),
        ('"just a string"', "application/json"),
        ("idempotency_key=a", "application/x-www-form-urlencoded"),
        ("\xff\xfe", "application/json"),
        ("null", "application/json"),
    ],
)
def test_malformed_bodies_are_422(client: TestClient, admin: dict, content: str, content_type: str) -> None:
    response = client.post(
        "/items", content=content.encode("latin-1"), headers={**admin, "content-type": content_type}
    )
    assert_problem(response, 422, "VALIDATION_ERROR")


def test_validation_problem_lists_every_error(client: TestClient, admin: dict) -> None:
    body = assert_problem(client.post("/items", json={}, headers=admin), 422, "VALIDATION_ERROR")
    locations = {tuple(err["loc"]) for err in body["errors"]}
    assert {
        ("body", f) for f in ("idempotency_key", "ledger_entity", "variance_amount", "match_decision")
    } <= locations
    assert body["instance"] == "/items"


def test_unknown_route_is_404_problem(client: TestClient, admin: dict) -> None:
    assert_problem(client.get("/nope", headers=admin), 404, "NOT_FOUND")


def test_wrong_method_is_405_problem(client: TestClient, admin: dict) -> None:
    assert_problem(client.delete("/leases", headers=admin), 405, "METHOD_NOT_ALLOWED")


def test_oversized_body_is_413_problem(client: TestClient, admin: dict) -> None:
    response = client.post(
        "/items",
        content=b"{" + b" " * (1024 * 1024 + 10) + b"}",
        headers={**admin, "content-type": "application/json"},
    )
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")


def test_huge_numbers_and_deep_nesting_are_422_not_500(client: TestClient, admin: dict) -> None:
    for content in ('{"batch_size": ' + "9" * 5000 + "}", '{"batch_size": ' + "[" * 5000 + "]" * 5000 + "}"):
        response = client.post(
            "/leases", content=content, headers={**admin, "content-type": "application/json"}
        )
        assert_problem(response, 422, "VALIDATION_ERROR")


def test_oversized_chunked_body_is_413_problem(client: TestClient, admin: dict) -> None:
    def chunks():
        for _ in range(20):
            yield b" " * 65536

    response = client.post("/items", content=chunks(), headers={**admin, "content-type": "application/json"})
    assert_problem(response, 413, "PAYLOAD_TOO_LARGE")


def _paths(app: FastAPI) -> set[str]:
    return {
        context.path
        for context in iter_route_contexts(app.routes)
        if isinstance(context.original_route, Route | APIRoute) and context.path
    }


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def test_405_allow_names_every_method_of_the_path(client: TestClient) -> None:
    """For every path: a method that answers 405 lists in Allow exactly the methods that do not
    (found by trying each), not only those of the first route that matched the path."""
    for path in _paths(client.app):  # type: ignore[arg-type]
        url = path.replace("{item_id}", "00000000-0000-4000-8000-000000000000")
        answers = {method: client.request(method, url) for method in METHODS}
        allowed = sorted(m for m, r in answers.items() if r.status_code != 405)
        refused = [m for m, r in answers.items() if r.status_code == 405]
        assert refused, f"{path}: every method answered"
        for method in refused:
            assert answers[method].headers["allow"] == ", ".join(allowed), (method, path)
            if method != "HEAD":  # a HEAD answer has no body
                body = assert_problem(answers[method], 405, "METHOD_NOT_ALLOWED")
                assert method in body["detail"]


def test_delete_items_allows_get_and_post(client: TestClient) -> None:
    response = client.delete("/items")
    assert_problem(response, 405, "METHOD_NOT_ALLOWED")
    assert response.headers["allow"] == "GET, POST"
