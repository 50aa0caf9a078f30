"""Every error is problem+json with a stable code; nothing malformed produces a 500."""

import json
from typing import Any

import psycopg
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from starlette.routing import Route

from api import routing
from api.app import MAX_BODY_BYTES
from tests.support.api import assert_problem


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


@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded", "text/plain"])
@pytest.mark.parametrize("path", ["/items", "/leases", "/items/batch", "/admin/reclaim"])
def test_a_json_body_without_a_json_content_type_says_so(
    client: TestClient, admin: dict, path: str, content_type: str | None
) -> None:
    headers = {**admin, **({"content-type": content_type} if content_type else {})}
    request = client.build_request("POST", path, content=b'{"batch_size": 1}', headers=headers)
    assert request.headers.get("content-type") == content_type
    body = assert_problem(client.send(request), 422, "VALIDATION_ERROR")
    assert "Content-Type: application/json is required" in body["detail"], body
    assert body["errors"][0]["loc"] == ["header", "content-type"]


def test_long_distinct_content_types_are_answered_and_not_kept(client: TestClient, admin: dict) -> None:
    # Whether a Content-Type is JSON is remembered per value, before authentication: a client
    # sending huge distinct values must not make the server keep them (256 x 8 MB otherwise).
    kept = routing._cached_is_json.cache_info().currsize
    for n in range(5):
        long_json = "application/json; x=" + str(n) * 200_000
        response = client.post(
            "/leases", content=b'{"batch_size": 1}', headers={**admin, "content-type": long_json}
        )
        assert response.status_code == 200, response.text  # still JSON, still understood
    assert routing._cached_is_json.cache_info().currsize == kept


def test_curl_d_without_content_type_is_told_what_to_add(client: TestClient, admin: dict) -> None:
    # `curl -d '{...}'` sends application/x-www-form-urlencoded.
    response = client.post(
        "/leases",
        content=b'{"batch_size": 1}',
        headers={**admin, "content-type": "application/x-www-form-urlencoded"},
    )
    body = assert_problem(response, 422, "VALIDATION_ERROR")
    assert body["detail"].startswith("Content-Type: application/json is required")
    assert "application/x-www-form-urlencoded" in body["detail"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (
            '{"batch_size": 1,,}',
            "Expecting property name enclosed in double quotes at line 1, column 18 (character 17)",
        ),
        ('{\n  "batch_size": 1\n  "x": 2}', "Expecting ',' delimiter at line 3, column 3 (character 22)"),
        ('{"batch_size": 1', "Expecting ',' delimiter at line 1, column 17 (character 16)"),
        ("[1, tru]", "Expecting value at line 1, column 5 (character 4)"),
        ('{"batch_size": 1} x', "Extra data at line 1, column 19 (character 18)"),
    ],
)
def test_malformed_json_names_the_position_and_the_problem(
    client: TestClient, admin: dict, content: str, words: str
) -> None:
    response = client.post(
        "/leases", content=content.encode(), headers={**admin, "content-type": "application/json"}
    )
    body = assert_problem(response, 422, "VALIDATION_ERROR")
    assert body["detail"].startswith("body: the body is not valid JSON: "), body
    assert words in body["detail"], body["detail"]
    assert body["errors"][0]["type"] == "json_invalid"
