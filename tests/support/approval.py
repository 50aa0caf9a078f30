"""Maker-checker arrangements shared by the approval tests: an item submitted for approval, its
events, a snapshot of the tables."""

from typing import Any

import psycopg
from fastapi.testclient import TestClient

from tests.support.api import Auth, item_body


def snapshot(sql: psycopg.Connection) -> tuple[list[Any], list[Any]]:
    items = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall()
    events = sql.execute("SELECT id FROM review_queue_event ORDER BY id").fetchall()
    return items, events


def events_of(sql: psycopg.Connection, item_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return sql.execute(
        "SELECT event, actor, details FROM review_queue_event WHERE item_id = %s ORDER BY id", (item_id,)
    ).fetchall()


def lease_one(client: TestClient, headers: dict[str, str], queue: str = "review") -> dict[str, Any]:
    response = client.post("/leases", json={"batch_size": 1, "queue": queue}, headers=headers)
    assert response.status_code == 200, response.text
    (leased,) = response.json()["items"]
    return leased


def submitted(
    client: TestClient, auth: Auth, amount: str = "25000.00", **fields: Any
) -> tuple[str, dict[str, Any]]:
    """An item alice completed with ADJUSTMENT_POSTED (threshold 10000.00): AWAITING_APPROVAL."""
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    body = item_body(variance_amount=amount, **fields)
    item_id = client.post("/items", json=body, headers=admin).json()["id"]
    leased = lease_one(client, alice)
    assert leased["id"] == item_id
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "ADJUSTMENT_POSTED", "note": "JE-7", "lease_token": leased["lease_token"]},
        headers=alice,
    )
    assert done.status_code == 200, done.text
    assert done.json()["outcome"] == "submitted_for_approval"
    return item_id, leased
