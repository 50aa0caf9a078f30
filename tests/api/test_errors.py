"""Every error is problem+json with a stable code; nothing malformed produces a 500."""

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

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
