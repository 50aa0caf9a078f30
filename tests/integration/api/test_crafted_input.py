"""Crafted input that used to reach a 500: offsets PostgreSQL does not take, contexts nested too deep
or that grow when stored, numbers with huge exponents, keys given twice. Each is a 422 problem that
stores nothing, and over a real socket the keep-alive connection survives it."""

import json
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import JSON, OFFSETS, Auth, assert_problem, item_body, raw_body


def _stored(sql: psycopg.Connection) -> int:
    return int(sql.execute("SELECT count(*) FROM review_queue_item").fetchone()[0])  # type: ignore[index]


# ---- due_at: any offset RFC 3339 allows, kept as its instant -------------------------------------


# PostgreSQL takes offsets up to 15:59 only; the documented pattern (and RFC 3339) allow up to 23:59.
def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value).astimezone(UTC)


@pytest.mark.parametrize("due_at", [*OFFSETS, "2030-06-01T12:00:00+15:59", "2030-06-01T12:00:00Z"])
def test_a_due_at_with_any_documented_offset_is_kept_as_its_instant(
    client: TestClient, auth: Auth, sql: psycopg.Connection, due_at: str
) -> None:
    ingest = auth("feeder", "ingest")
    body = item_body(due_at=due_at)
    created = client.post("/items", json=body, headers=ingest)
    assert created.status_code == 201, created.text
    assert _instant(created.json()["due_at"]) == _instant(due_at)
    batch = client.post("/items/batch", json={"items": [item_body(due_at=due_at)]}, headers=ingest)
    assert batch.status_code == 200, batch.text
    assert _instant(batch.json()["results"][0]["item"]["due_at"]) == _instant(due_at)
    stored = [row[0] for row in sql.execute("SELECT due_at FROM review_queue_item").fetchall()]
    assert stored == [_instant(due_at)] * 2
    # A retry with the same instant written in UTC is the same payload.
    in_utc = {**body, "due_at": _instant(due_at).strftime("%Y-%m-%dT%H:%M:%SZ")}
    again = client.post("/items", json=in_utc, headers=ingest)
    assert again.status_code == 200 and again.json()["id"] == created.json()["id"], again.text


@pytest.mark.parametrize("parameter", ["created_after", "created_before", "due_before"])
def test_a_query_timestamp_with_a_large_offset_is_answered(
    client: TestClient, auth: Auth, parameter: str
) -> None:
    for value in OFFSETS:
        response = client.get("/items", params={parameter: value}, headers=auth("alice", "reviewer"))
        assert response.status_code == 200, response.text


# ---- context: depth, and its size as stored ------------------------------------------------------


@pytest.mark.parametrize("depth", [33, 500, 700, 900])
def test_a_context_nested_too_deep_is_a_422(
    client: TestClient, auth: Auth, sql: psycopg.Connection, depth: int
) -> None:
    nested = "[" * (depth - 1) + "]" * (depth - 1)  # the context object itself is the first level
    body = raw_body(item_body(context={"a": "NESTED"}), replace={"NESTED": nested})
    for path, sent in (("/items", body), ("/items/batch", b'{"items": [' + body + b"]}")):
        problem = assert_problem(
            client.post(path, content=sent, headers={**auth("feeder", "ingest"), **JSON}),
            422,
            "VALIDATION_ERROR",
        )
        assert "32 levels" in problem["detail"], problem
    assert _stored(sql) == 0


def test_a_context_32_levels_deep_is_accepted(client: TestClient, auth: Auth) -> None:
    context: Any = []
    for _ in range(30):
        context = [context]
    body = item_body(context={"a": context})  # the object, then 31 levels of lists
    created = client.post("/items", json=body, headers=auth("feeder", "ingest"))
    assert created.status_code == 201, created.text
    assert created.json()["context"] == body["context"]


def test_a_context_is_measured_as_it_is_stored_not_as_it_was_sent(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    # Under 1 KB as sent; jsonb keeps each number's digits in full: 110 * 301 bytes once stored.
    numbers = ",".join(["1e300"] * 110)
    body = raw_body(item_body(context={"a": "NUMBERS"}), replace={"NUMBERS": f"[{numbers}]"})
    assert len(body) < 1024
    problem = assert_problem(
        client.post("/items", content=body, headers={**auth("feeder", "ingest"), **JSON}),
        422,
        "VALIDATION_ERROR",
    )
    assert "16384 bytes" in problem["detail"] and "as stored" in problem["detail"], problem
    small = ",".join(["1.5e-7"] * 10)  # stored as 0.00000015: counted so, and accepted
    body = raw_body(item_body(context={"a": "NUMBERS"}), replace={"NUMBERS": f"[{small}]"})
    created = client.post("/items", content=body, headers={**auth("feeder", "ingest"), **JSON})
    assert created.status_code == 201, created.text
    assert _stored(sql) == 1


def test_the_stored_size_is_what_postgresql_stores(sql: psycopg.Connection) -> None:
    """The API's measure of a context against jsonb's own text, for the numbers that expand."""
    from api.schemas import stored_size

    context = {"a": [1e300, 1.5e-7, -2.5e20, 0.1, 12], "b": {"c": 'é\n"', "d": [True, None, []]}}
    (size,) = sql.execute(
        "SELECT octet_length(c::text) - (SELECT count(*) FROM regexp_matches(c::text, '[,:] ', 'g'))"
        " FROM (SELECT %s::jsonb AS c) AS s",
        (json.dumps(context),),
    ).fetchone()  # type: ignore[misc]
    # jsonb's text puts a space after every separator; the API counts compact JSON
    assert stored_size(context) == size


# ---- money with exponents that overflow Python's decimal context ----------------------------------

HUGE = ["1E+1000000", "-1E+1000000", "1e999999999", "0E+1000000", "1E-1000000"]


@pytest.mark.parametrize("number", HUGE)
def test_money_with_a_huge_exponent_is_a_422_everywhere(
    client: TestClient, auth: Auth, sql: psycopg.Connection, number: str
) -> None:
    admin = {**auth("ada", "admin"), **JSON}
    if number.startswith("0E"):
        # Zero, whatever its exponent: accepted, and stored as 0.00 (PostgreSQL takes no such exponent).
        body = raw_body(item_body(variance_amount="N"), replace={"N": number})
        created = client.post("/items", content=body, headers=admin)
        assert created.status_code == 201 and created.json()["variance_amount"] == "0.00", created.text
        return
    item = client.post("/items", json=item_body(), headers=admin).json()
    one = raw_body(item_body(variance_amount="N"), replace={"N": number})
    sends = [
        ("POST", "/items", one),
        ("POST", "/items/batch", b'{"items": [' + one + b"]}"),
        ("POST", f"/items/{item['id']}/revisions",
         raw_body({"variance_amount": "N", "source_hash": "h2"}, replace={"N": number})),
        ("PUT", "/resolutions/BIG_ONES",
         raw_body({"label": "Big", "approval_threshold": "N"}, replace={"N": number})),
    ]  # fmt: skip
    for method, path, body in sends:
        assert_problem(client.request(method, path, content=body, headers=admin), 422, "VALIDATION_ERROR")
    assert _stored(sql) == 1
    assert sql.execute("SELECT count(*) FROM resolution_code WHERE code = 'BIG_ONES'").fetchone() == (0,)


@pytest.mark.parametrize("field", ["batch_size", "wait_s"])
@pytest.mark.parametrize("number", ["1E+1000000", "1E+999999999999999999", "-1E+1000000"])
def test_an_integer_with_a_huge_exponent_is_a_quick_422(
    client: TestClient, auth: Auth, field: str, number: str
) -> None:
    # int(Decimal("1E+1000000")) alone takes minutes of CPU: the event loop would stop for it.
    body = raw_body({field: "N"}, replace={"N": number})
    response = client.post("/leases", content=body, headers={**auth("alice", "reviewer"), **JSON})
    assert assert_problem(response, 422, "VALIDATION_ERROR")["errors"][0]["loc"] == ["body", field]
    reclaim = raw_body({"reclaim_batch": "N"}, replace={"N": number})
    assert_problem(
        client.post("/admin/reclaim", content=reclaim, headers={**auth("ada", "admin"), **JSON}),
        422,
        "VALIDATION_ERROR",
    )


# ---- a key given twice ---------------------------------------------------------------------------


def test_a_key_given_twice_is_refused(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    body = (
        json.dumps(item_body(variance_amount="1.00")).removesuffix("}") + ', "variance_amount": "99999.00"}'
    )
    problem = assert_problem(
        client.post("/items", content=body, headers={**auth("feeder", "ingest"), **JSON}),
        422,
        "VALIDATION_ERROR",
    )
    assert "'variance_amount' appears twice" in problem["detail"], problem
    nested = json.dumps(item_body(context={"a": 1})).replace('{"a": 1}', '{"a": 1, "a": 2}')
    problem = assert_problem(
        client.post("/items", content=nested, headers={**auth("feeder", "ingest"), **JSON}),
        422,
        "VALIDATION_ERROR",
    )
    assert "'a' appears twice" in problem["detail"], problem
    assert _stored(sql) == 0


def _body_operations(client: TestClient) -> list[tuple[str, str]]:
    paths = client.get("/openapi.json").json()["paths"]
    return [
        (method.upper(), path)
        for path, operations in paths.items()
        for method, operation in operations.items()
        if "requestBody" in operation
    ]


def test_every_route_with_a_body_refuses_a_key_given_twice(client: TestClient, auth: Auth) -> None:
    operations = _body_operations(client)
    assert len(operations) >= 15, operations
    admin = {**auth("ada", "admin"), **JSON}
    for method, path in operations:
        concrete = path.format(
            item_id="00000000-0000-4000-8000-000000000000",
            code="X",
            reviewer="bob",
            name="ledger",
            currency="EUR",
        )
        response = client.request(method, concrete, content=b'{"reason": "a", "reason": "b"}', headers=admin)
        problem = assert_problem(response, 422, "VALIDATION_ERROR")
        assert "'reason' appears twice" in problem["detail"], (method, path, problem)
