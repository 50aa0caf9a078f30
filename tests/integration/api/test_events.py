"""The append-only audit trail: one event per transition, in the same statement, never edited."""

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support import backdate_lease
from tests.support.api import Auth, assert_problem, item_body


def events(client: TestClient, headers: dict, item_id: str) -> list[tuple]:
    response = client.get(f"/items/{item_id}/events", headers=headers)
    assert response.status_code == 200, response.text
    return [(e["event"], e["actor"], e["lease_epoch"]) for e in response.json()["events"]]


def test_full_lifecycle_writes_exactly_its_events(client: TestClient, auth: Auth, sql) -> None:
    ingest, admin = auth("matcher", "ingest"), auth("ops", "admin")
    alice, bob = auth("alice", "reviewer"), auth("bob", "reviewer")
    item = client.post("/items", json=item_body(), headers=ingest).json()
    item_id = item["id"]
    client.post("/leases", headers=alice)
    client.post(f"/items/{item_id}/renew", headers=alice)
    client.post(f"/items/{item_id}/release", json={"reason": "not mine"}, headers=alice)
    client.post("/leases", headers=bob)
    backdate_lease(sql, item_id)
    client.post("/admin/reclaim", headers=admin)
    # alice released it earlier: within the cool-off she takes it back by naming it.
    (leased,) = client.post("/leases", json={"item_id": item_id}, headers=alice).json()["items"]
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "APPROVED", "note": "FX", "lease_token": leased["lease_token"]},
        headers=alice,
    )
    assert done.status_code == 200, done.text

    assert events(client, bob, item_id) == [
        ("ENQUEUED", "matcher", 0),
        ("LEASED", "alice", 1),
        ("RENEWED", "alice", 1),
        ("RELEASED", "alice", 1),
        ("LEASED", "bob", 2),
        ("RECLAIMED", "ops", 2),
        ("LEASED", "alice", 3),
        ("RESOLVED", "alice", 3),
    ]
    full = client.get(f"/items/{item_id}/events", headers=bob).json()["events"]
    assert all(e["trace_id"] == item["trace_id"] and e["item_id"] == item_id for e in full)
    assert full[3]["details"] == {"reason": "not mine"}
    assert full[5]["details"]["cause"] == "lease_expired"
    assert full[5]["details"]["previous_holder"] == "bob"
    assert full[7]["details"] == {"resolution": "APPROVED", "note": "FX", "rate": 1, "base_amount": 12.5}
    ids = [e["id"] for e in full]
    assert ids == sorted(ids)


@pytest.mark.parametrize("count", [1, 7])
def test_every_items_trail_starts_with_its_enqueue(client: TestClient, auth: Auth, count: int) -> None:
    """One item or a batch: each item of a batch is created a microsecond after the one before it
    (its place in the queue), its ENQUEUED event at the statement's now(); the trail shows it."""
    ingest = auth("matcher", "ingest")
    if count == 1:
        answers = [client.post("/items", json=item_body(), headers=ingest).json()]
    else:
        batch = {"items": [item_body() for _ in range(count)]}
        answers = client.post("/items/batch", json=batch, headers=ingest).json()["results"]
    ids = [a["item"]["id"] if "item" in a else a["id"] for a in answers]
    trails = {item_id: events(client, ingest, item_id) for item_id in ids}
    missing = {i: t for i, t in trails.items() if t[:1] != [("ENQUEUED", "matcher", 0)]}
    assert len(ids) == count and not missing, f"trails without their ENQUEUED first: {missing}"


def test_no_ops_and_refusals_write_nothing(client: TestClient, auth: Auth) -> None:
    admin, alice, bob = auth("ops", "admin"), auth("alice", "reviewer"), auth("bob", "reviewer")
    item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    client.post("/items", json={**item_body(), "idempotency_key": "same"}, headers=admin)
    before = events(client, admin, item_id)
    for url, headers in [
        (f"/items/{item_id}/renew", alice),
        (f"/items/{item_id}/release", alice),
        (f"/items/{item_id}/complete", alice),
    ]:
        assert (
            client.post(
                url, json={"resolution": "X"} if "complete" in url else None, headers=headers
            ).status_code
            == 409
        )
    client.post("/leases", headers=alice)
    during = events(client, admin, item_id)
    for url in (f"/items/{item_id}/renew", f"/items/{item_id}/release"):
        assert_problem(client.post(url, headers=bob), 409, "LEASE_NOT_HELD")
    client.post(f"/items/{item_id}/complete", json={"resolution": "APPROVED"}, headers=alice)
    after_resolve = events(client, admin, item_id)
    retry = client.post(f"/items/{item_id}/complete", json={"resolution": "APPROVED"}, headers=alice)
    assert retry.json()["outcome"] == "already_resolved"
    assert_problem(
        client.post(f"/items/{item_id}/complete", json={"resolution": "NO"}, headers=alice),
        409,
        "RESOLUTION_CONFLICT",
    )
    assert client.post("/admin/reclaim", headers=admin).json()["reclaimed"] == 0
    assert before == [("ENQUEUED", "ops", 0)]
    assert during == [*before, ("LEASED", "alice", 1)]
    assert after_resolve == [*during, ("RESOLVED", "alice", 1)]
    assert events(client, admin, item_id) == after_resolve


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE review_queue_event SET actor = 'mallory'",
        "DELETE FROM review_queue_event",
        "TRUNCATE review_queue_event",
        "TRUNCATE review_queue_event CASCADE",
    ],
)
def test_the_database_refuses_to_edit_events(client: TestClient, auth: Auth, sql, statement: str) -> None:
    client.post("/items", json=item_body(), headers=auth("ops", "admin"))
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="append-only"):
        sql.execute(statement)
    assert sql.execute("SELECT count(*), min(actor) FROM review_queue_event").fetchone() == (1, "ops")


def test_an_item_with_history_cannot_be_deleted(client: TestClient, auth: Auth, sql) -> None:
    item_id = client.post("/items", json=item_body(), headers=auth("ops", "admin")).json()["id"]
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        sql.execute("DELETE FROM review_queue_item WHERE id = %s", (item_id,))


def test_events_of_unknown_item_is_404(client: TestClient, auth: Auth) -> None:
    response = client.get("/items/00000000-0000-0000-0000-000000000000/events", headers=auth("a", "reviewer"))
    assert_problem(response, 404, "NOT_FOUND")


def _many_events(sql: psycopg.Connection, item_id: str, count: int) -> None:
    """count RENEWED events for item_id, straight into the trail (appending is what it allows)."""
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'RENEWED', 'alice', 0, trace_id FROM review_queue_item, generate_series(1, %s)"
        " WHERE id = %s",
        (count, item_id),
    )


def test_events_are_paginated_by_keyset(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    admin = auth("ops", "admin")
    item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    other_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    _many_events(sql, item_id, 6)
    _many_events(sql, other_id, 3)  # interleaved ids of another item never show up
    _many_events(sql, item_id, 2)
    full = client.get(f"/items/{item_id}/events", headers=admin).json()
    assert len(full["events"]) == 9 and full["next_cursor"] is None
    assert {e["item_id"] for e in full["events"]} == {item_id}

    pages, cursor = [], None
    for _ in range(10):  # bounded: 9 events in pages of 2 is 5 pages
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/items/{item_id}/events", params=params, headers=admin)
        assert page.status_code == 200, page.text
        pages.append(page.json()["events"])
        cursor = page.json()["next_cursor"]
        if cursor is None:
            break
    assert [len(p) for p in pages] == [2, 2, 2, 2, 1]
    assert [e for p in pages for e in p] == full["events"]


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "not-a-cursor"},
        {"cursor": "WzEsMl0="},  # base64 of [1,2]: valid base64, not one of ours
        {"limit": 0},
        {"limit": 501},
        {"page": 2},  # unknown, like on GET /items
        {"leased_by": "me"},
    ],
)
def test_events_refuse_bad_and_unknown_query_parameters(client: TestClient, auth: Auth, params: dict) -> None:
    admin = auth("ops", "admin")
    item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    assert_problem(
        client.get(f"/items/{item_id}/events", params=params, headers=admin), 422, "VALIDATION_ERROR"
    )


def test_an_items_cursor_is_no_events_cursor(client: TestClient, auth: Auth) -> None:
    admin = auth("ops", "admin")
    for _ in range(2):
        item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    items_cursor = client.get("/items", params={"limit": 1}, headers=admin).json()["next_cursor"]
    assert items_cursor
    response = client.get(f"/items/{item_id}/events", params={"cursor": items_cursor}, headers=admin)
    assert_problem(response, 422, "VALIDATION_ERROR")
