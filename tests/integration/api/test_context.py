"""The optional `context` object: stored as JSONB, returned with the item, at most 16 KiB, and part
of the idempotency comparison."""

import json

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, item_body

CONTEXT = {
    "account": "ACME-EUR-001",
    "counterparty": "Globex GmbH",
    "value_dates": ["2026-11-28", "2026-11-30"],
    "fx_rate": 1.0825,
    "lines": 3,
    "documents": [{"title": "statement <b>Nov</b>", "href": "https://docs.example/stmt/42"}],
    "reviewed_before": False,
    "note": None,
}


def test_context_is_stored_and_returned_everywhere(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    ingest, alice = auth("feeder", "ingest"), auth("alice", "reviewer")
    created = client.post("/items", json=item_body(context=CONTEXT), headers=ingest)
    assert created.status_code == 201, created.text
    item_id = created.json()["id"]
    assert created.json()["context"] == CONTEXT
    assert client.get(f"/items/{item_id}", headers=alice).json()["context"] == CONTEXT
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert leased["context"] == CONTEXT
    assert client.get("/items", headers=alice).json()["items"][0]["context"] == CONTEXT
    stored = sql.execute("SELECT jsonb_typeof(context), context FROM review_queue_item").fetchone()
    assert stored == ("object", CONTEXT)
    without = client.post("/items", json=item_body(), headers=ingest).json()
    assert without["context"] is None


def test_context_is_part_of_the_idempotency_comparison(client: TestClient, auth: Auth) -> None:
    ingest = auth("feeder", "ingest")
    body = item_body(context=CONTEXT)
    first = client.post("/items", json=body, headers=ingest)
    # The same object, keys in another order: the same payload.
    reordered = {**body, "context": dict(reversed(list(CONTEXT.items())))}
    again = client.post("/items", json=reordered, headers=ingest)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"], again.text
    for changed in ({**CONTEXT, "lines": 4}, {}, None):
        conflict = client.post("/items", json={**body, "context": changed}, headers=ingest)
        assert assert_problem(conflict, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == first.json()["id"]
    batch = client.post("/items/batch", json={"items": [body, {**body, "context": {"x": 1}}]}, headers=ingest)
    assert [r["outcome"] for r in batch.json()["results"]] == ["existing", "conflict"], batch.text


def test_a_batch_stores_each_items_own_context(client: TestClient, auth: Auth) -> None:
    ingest = auth("feeder", "ingest")
    items = [item_body(context={"n": n}) for n in range(3)] + [item_body()]
    results = client.post("/items/batch", json={"items": items}, headers=ingest).json()["results"]
    assert [r["item"]["context"] for r in results] == [{"n": 0}, {"n": 1}, {"n": 2}, None]


def _of_size(size: int) -> dict:
    base = json.dumps({"t": ""}, separators=(",", ":"))
    return {"t": "é" * 0 + "x" * (size - len(base))}


def test_context_up_to_16_kib_and_no_more(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    ingest = auth("feeder", "ingest")
    largest = _of_size(16 * 1024)
    assert client.post("/items", json=item_body(context=largest), headers=ingest).status_code == 201
    problem = assert_problem(
        client.post("/items", json=item_body(context=_of_size(16 * 1024 + 1)), headers=ingest),
        422,
        "VALIDATION_ERROR",
    )
    assert "16384 bytes" in problem["detail"], problem
    # Counted in UTF-8 bytes, not characters.
    wide = {"t": "é" * 8200}
    assert_problem(
        client.post("/items", json=item_body(context=wide), headers=ingest), 422, "VALIDATION_ERROR"
    )
    assert sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (1,)


@pytest.mark.parametrize(
    "raw",
    [
        '"a string"',
        "[1, 2]",
        "5",
        '{"a": "nul \\u0000 inside"}',
        '{"nul \\u0000 key": 1}',
        '{"a": 0.1000000000000000055511151231257827}',  # more digits than a double holds
        '{"a": 1e400}',
    ],
)
def test_context_must_be_a_storable_object(
    client: TestClient, auth: Auth, sql: psycopg.Connection, raw: str
) -> None:
    body = json.dumps(item_body()).removesuffix("}") + f', "context": {raw}}}'
    response = client.post(
        "/items",
        content=body.encode(),
        headers={**auth("feeder", "ingest"), "content-type": "application/json"},
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (0,)


def test_the_database_refuses_a_context_that_is_not_an_object(sql: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="ck_review_queue_item_context_object"):
        sql.execute(
            "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
            " source_hash, context) VALUES ('k', 'E', 1, 'PARTIAL', 'h', '[1]')"
        )
