"""Every error is problem+json with a stable code; nothing malformed produces a 500."""

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import MAX_BODY_BYTES
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


def post_counting_reads(
    client: TestClient, path: str, headers: dict[str, str], chunks: list[bytes], *, declare_length: bool
) -> tuple[int, dict[str, Any], int]:
    """POST `chunks` straight into the ASGI app, one receive() message each, and count what the app
    pulls: (status, JSON answer, body bytes the app read). The test client would hand the app the
    whole body in one message; this shows how far the app read before it answered."""
    app: Any = client.app
    read = 0
    pending = list(chunks)
    raw_headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw_headers.append((b"content-type", b"application/json"))
    if declare_length:
        raw_headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
    else:
        raw_headers.append((b"transfer-encoding", b"chunked"))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": raw_headers, "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }  # fmt: skip
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if not pending:
            return {"type": "http.disconnect"}
        chunk = pending.pop(0)
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def call() -> None:
        await app(scope, receive, send)

    assert client.portal is not None
    client.portal.call(call)
    (start,) = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers_out = {k.decode(): v.decode() for k, v in start["headers"]}
    assert headers_out["content-type"] == "application/problem+json", headers_out
    return start["status"], json.loads(body), read


def items_stored(sql: psycopg.Connection) -> int:
    return int(sql.execute("SELECT count(*) FROM review_queue_item").fetchone()[0])  # type: ignore[index]


def test_oversized_body_is_413_problem(client: TestClient, admin: dict, sql: psycopg.Connection) -> None:
    """A declared Content-Length over the limit is refused before the app reads a byte of the body."""
    body = b"{" + b" " * (MAX_BODY_BYTES + 10) + b"}"
    status, problem, read = post_counting_reads(client, "/items", admin, [body], declare_length=True)
    assert (status, problem["code"]) == (413, "PAYLOAD_TOO_LARGE"), problem
    assert read == 0, f"the app read {read} bytes of a body it refused by its declared length"
    assert items_stored(sql) == 0


def test_huge_numbers_and_deep_nesting_are_422_not_500(client: TestClient, admin: dict) -> None:
    for content in ('{"batch_size": ' + "9" * 5000 + "}", '{"batch_size": ' + "[" * 5000 + "]" * 5000 + "}"):
        response = client.post(
            "/leases", content=content, headers={**admin, "content-type": "application/json"}
        )
        assert_problem(response, 422, "VALIDATION_ERROR")


def test_oversized_chunked_body_is_413_problem(
    client: TestClient, admin: dict, sql: psycopg.Connection
) -> None:
    """A chunked body (no length) is cut off at the first chunk past the limit: the app reads no
    further, so the rest, and the closing brace, never reach the JSON parser."""
    chunk = 64 * 1024
    chunks = [b"{", *(b" " * chunk for _ in range(20)), b"}"]
    status, problem, read = post_counting_reads(client, "/items", admin, chunks, declare_length=False)
    assert (status, problem["code"]) == (413, "PAYLOAD_TOO_LARGE"), problem
    assert MAX_BODY_BYTES < read <= MAX_BODY_BYTES + chunk, f"the app read {read} bytes"
    assert items_stored(sql) == 0
