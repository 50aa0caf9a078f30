"""A holder's call after their lease expired and the reclaimer took it back: still 409
LEASE_NOT_HELD (the stable code), and the detail says what happened and when, from the item's
events (`lease_expired_at`, `reclaimed_at`). It names nobody but the caller: who holds the item now
is not said (GET /items/{id} shows the item to any role)."""

from datetime import datetime
from typing import Any

import psycopg
from fastapi.testclient import TestClient

from tests.support import backdate_lease
from tests.support.api import Auth, assert_problem, item_body


def _reclaimed(client: TestClient, headers: dict[str, str], item_id: str) -> dict[str, Any]:
    events = client.get(f"/items/{item_id}/events", headers=headers).json()["events"]
    (event,) = [e for e in events if e["event"] == "RECLAIMED"][-1:]
    return dict(event)


def _when(value: str) -> datetime:
    return datetime.fromisoformat(value)


def _lost(response: Any, event: dict[str, Any], item_id: str) -> dict[str, Any]:
    problem = assert_problem(response, 409, "LEASE_NOT_HELD")
    assert _when(problem["reclaimed_at"]) == _when(event["at"]), (problem, event)
    assert _when(problem["lease_expired_at"]) == _when(event["details"]["lease_expired_at"]), (problem, event)
    detail = problem["detail"]
    assert item_id in detail and "expired" in detail and "reclaimed" in detail, detail
    assert "bob" not in response.text, "who holds the item now is not for the refusal to say"
    return problem


def test_a_holder_after_the_reclaim_is_told_the_lease_expired_and_when(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    bob, carol = auth("bob", "reviewer"), auth("carol", "reviewer")
    assert client.post("/items", json=item_body(), headers=admin).status_code == 201
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    item_id, token = leased["id"], leased["lease_token"]
    backdate_lease(sql, item_id)
    assert client.post("/admin/reclaim", json={}, headers=admin).json()["reclaimed"] == 1
    event = _reclaimed(client, alice, item_id)
    (again,) = client.post("/leases", json={"batch_size": 1}, headers=bob).json()["items"]
    assert again["id"] == item_id

    calls = [
        ("complete", {"resolution": "APPROVED", "lease_token": token}),
        ("complete", {"resolution": "APPROVED"}),
        ("renew", {"lease_token": token}),
        ("renew", {}),
        ("release", {"lease_token": token}),
    ]
    for action, body in calls:
        _lost(client.post(f"/items/{item_id}/{action}", json=body, headers=alice), event, item_id)
    batch = client.post(
        "/items/complete", json={"items": [{"id": item_id, "resolution": "APPROVED"}]}, headers=alice
    ).json()
    (result,) = batch["results"]
    assert result["outcome"] == "refused" and result["problem"]["code"] == "LEASE_NOT_HELD", result
    assert _when(result["problem"]["reclaimed_at"]) == _when(event["at"]), result

    # Someone who never held it is told only that they do not hold it.
    plain = assert_problem(
        client.post(f"/items/{item_id}/complete", json={"resolution": "APPROVED"}, headers=carol),
        409,
        "LEASE_NOT_HELD",
    )
    assert "reclaimed_at" not in plain and "expired" not in plain["detail"], plain
    # Nothing changed for anyone: bob still holds it.
    assert client.get(f"/items/{item_id}", headers=bob).json()["leased_by"] == "bob"

    # Once alice leases the item again, her old token is simply not her current lease.
    assert client.post(f"/items/{item_id}/release", json={}, headers=bob).status_code == 200
    (mine,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert mine["id"] == item_id
    stale = assert_problem(
        client.post(f"/items/{item_id}/complete", json={"resolution": "APPROVED", "lease_token": token},
                    headers=alice),
        409,
        "LEASE_NOT_HELD",
    )  # fmt: skip
    assert "reclaimed_at" not in stale, stale


def test_an_approver_after_the_reclaim_of_an_approval_lease_is_told_so(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, rita, anna = auth("ada", "admin"), auth("rita", "reviewer"), auth("anna", "approver")
    assert client.post("/items", json=item_body(variance_amount="25000.00"), headers=admin).status_code == 201
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=rita).json()["items"]
    body = {"resolution": "ADJUSTMENT_POSTED", "note": "JE-1", "lease_token": leased["lease_token"]}
    submitted = client.post(f"/items/{leased['id']}/complete", json=body, headers=rita).json()
    assert submitted["outcome"] == "submitted_for_approval", submitted
    (approval,) = client.post("/leases", json={"queue": "approval"}, headers=anna).json()["items"]
    sql.execute(
        "UPDATE review_queue_item SET lease_expires_at = now() - interval '1 hour' WHERE id = %s",
        (approval["id"],),
    )
    assert client.post("/admin/reclaim", json={}, headers=admin).json()["reclaimed"] == 1
    event = _reclaimed(client, anna, approval["id"])
    approve = client.post(
        f"/items/{approval['id']}/approve", json={"lease_token": approval["lease_token"]}, headers=anna
    )
    assert "approval lease" in _lost(approve, event, approval["id"])["detail"]
    reject = client.post(f"/items/{approval['id']}/reject", json={"reason": "no"}, headers=anna)
    _lost(reject, event, approval["id"])
