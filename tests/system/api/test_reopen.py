"""Reopen: an admin puts a RESOLVED item back to PENDING with a reason; the trail keeps the old
decision. One guarded statement: a race between admins reopens once."""

import threading
from collections import Counter
from collections.abc import Callable

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, item_body


def _resolved_item(client: TestClient, auth: Auth) -> tuple[str, dict, dict]:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert leased["id"] == item_id
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "WRITE_OFF", "note": "below tolerance", "lease_token": leased["lease_token"]},
        headers=alice,
    )
    assert done.status_code == 200, done.text
    return item_id, admin, alice


def test_reopen_puts_a_resolved_item_back_and_keeps_the_old_decision_in_the_trail(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, admin, alice = _resolved_item(client, auth)
    resolved_at = client.get(f"/items/{item_id}", headers=admin).json()["resolved_at"]

    response = client.post(
        f"/items/{item_id}/reopen", json={"reason": "amount was FX, not rounding"}, headers=admin
    )
    assert response.status_code == 200, response.text
    item = response.json()
    assert (item["state"], item["resolution"], item["resolved_by"], item["resolution_note"]) == (
        "PENDING", None, None, None,
    )  # fmt: skip
    assert (item["leased_by"], item["lease_expires_at"], item["attempts"], item["lease_token"]) == (
        None,
        None,
        0,
        None,
    )

    trail = client.get(f"/items/{item_id}/events", headers=alice).json()["events"]
    assert [e["event"] for e in trail] == ["ENQUEUED", "LEASED", "RESOLVED", "REOPENED"]
    reopened = trail[-1]
    assert reopened["actor"] == "ada"
    assert reopened["details"]["reason"] == "amount was FX, not rounding"
    assert reopened["details"]["previous_resolution"] == "WRITE_OFF"
    assert reopened["details"]["previous_note"] == "below tolerance"
    assert reopened["details"]["previous_resolved_by"] == "alice"
    stored = sql.execute(
        "SELECT (details->>'previous_resolved_at')::timestamptz = resolved_at_then FROM review_queue_event,"
        " (SELECT %s::timestamptz AS resolved_at_then) t WHERE event = 'REOPENED'",
        (resolved_at,),
    ).fetchone()
    assert stored == (True,)

    # It is leased again, and can be decided again, differently.
    (again,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert again["id"] == item_id and again["attempts"] == 1
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "ESCALATED", "note": "to the FX desk", "lease_token": again["lease_token"]},
        headers=alice,
    )
    assert done.json()["outcome"] == "resolved" and done.json()["item"]["resolution"] == "ESCALATED"


@pytest.mark.parametrize("state", ["PENDING", "ASSIGNED"])
def test_only_a_resolved_item_can_be_reopened(
    client: TestClient, auth: Auth, sql: psycopg.Connection, state: str
) -> None:
    admin = auth("ada", "admin")
    item_id = client.post("/items", json=item_body(), headers=admin).json()["id"]
    if state == "ASSIGNED":
        client.post("/leases", json={"batch_size": 1}, headers=auth("alice", "reviewer"))
    before = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall()
    events = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()
    problem = assert_problem(
        client.post(f"/items/{item_id}/reopen", json={"reason": "x"}, headers=admin), 409, "NOT_RESOLVED"
    )
    assert state in problem["detail"]
    assert sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall() == before
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == events


@pytest.mark.parametrize(
    "body", [{}, {"reason": ""}, {"reason": "x" * 501}, {"reason": "x", "state": "PENDING"}]
)
def test_reopen_needs_a_reason(client: TestClient, auth: Auth, body: dict) -> None:
    item_id, admin, _ = _resolved_item(client, auth)
    assert_problem(client.post(f"/items/{item_id}/reopen", json=body, headers=admin), 422, "VALIDATION_ERROR")
    assert client.get(f"/items/{item_id}", headers=admin).json()["state"] == "RESOLVED"


def test_admins_racing_to_reopen_reopen_once(live_server: str, make_token: Callable[[str, str], str]) -> None:
    admins = [{"Authorization": f"Bearer {make_token(f'admin-{n}', 'admin')}"} for n in range(6)]
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    with httpx.Client(base_url=live_server, timeout=30) as http:
        item_id = http.post("/items", json=item_body(), headers=admins[0]).json()["id"]
        (_leased,) = http.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
        assert (
            http.post(
                f"/items/{item_id}/complete", json={"resolution": "APPROVED"}, headers=alice
            ).status_code
            == 200
        )
    barrier = threading.Barrier(len(admins))
    answers: list[tuple[int, str | None]] = []

    def reopen(headers: dict[str, str]) -> None:
        with httpx.Client(base_url=live_server, timeout=30) as http:
            barrier.wait(timeout=30)
            response = http.post(f"/items/{item_id}/reopen", json={"reason": "race"}, headers=headers)
            answers.append((response.status_code, response.json().get("code")))

    threads = [threading.Thread(target=reopen, args=(h,)) for h in admins]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert Counter(answers) == Counter({(200, None): 1, (409, "NOT_RESOLVED"): len(admins) - 1}), answers
    with httpx.Client(base_url=live_server, timeout=30) as http:
        trail = http.get(f"/items/{item_id}/events", headers=alice).json()["events"]
    assert [e["event"] for e in trail].count("REOPENED") == 1
