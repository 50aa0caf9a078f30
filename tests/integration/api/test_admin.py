"""POST /admin/reclaim and the lease lifecycle around it."""

import pytest
from fastapi.testclient import TestClient

from tests.support import backdate_lease
from tests.support.api import Auth, assert_problem, item_body


def test_reclaim_then_late_completion_loses_and_new_holder_wins(
    client: TestClient, admin: dict, auth: Auth, sql
) -> None:
    alice, bob = auth("alice", "reviewer"), auth("bob", "reviewer")
    client.post("/items", json=item_body(), headers=admin)
    (item,) = client.post("/leases", headers=alice).json()["items"]
    backdate_lease(sql, item["id"], seconds=46)  # past the 45 s grace

    response = client.post("/admin/reclaim", headers=admin)
    assert response.status_code == 200
    body = response.json()
    assert body["reclaimed"] == 1
    assert body["items"] == [
        {**{k: item[k] for k in ("id", "trace_id", "source_hash", "match_decision")}, "state": "PENDING"}
    ]
    pending = client.get(f"/items/{item['id']}", headers=admin).json()
    assert (pending["state"], pending["leased_by"], pending["leased_at"], pending["lease_expires_at"]) == (
        "PENDING", None, None, None,
    )  # fmt: skip

    (again,) = client.post("/leases", headers=bob).json()["items"]
    assert again["id"] == item["id"]
    late = client.post(f"/items/{item['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
    assert_problem(late, 409, "LEASE_NOT_HELD")
    won = client.post(f"/items/{item['id']}/complete", json={"resolution": "REJECTED"}, headers=bob)
    assert won.status_code == 200 and won.json()["item"]["resolved_by"] == "bob"


def test_inside_the_grace_nothing_is_reclaimed(client: TestClient, admin: dict, auth: Auth, sql) -> None:
    alice = auth("alice", "reviewer")
    client.post("/items", json=item_body(), headers=admin)
    (item,) = client.post("/leases", headers=alice).json()["items"]
    backdate_lease(sql, item["id"], seconds=40)  # expired, but within reclaim_after_s
    assert client.post("/admin/reclaim", headers=admin).json() == {"reclaimed": 0, "items": []}
    assert client.get(f"/items/{item['id']}", headers=admin).json()["state"] == "ASSIGNED"


def test_reclaim_batch_bounds_the_sweep(client: TestClient, admin: dict, auth: Auth, sql) -> None:
    alice = auth("alice", "reviewer")
    for _ in range(5):
        client.post("/items", json=item_body(), headers=admin)
    client.post("/leases", headers=alice)
    backdate_lease(sql)
    assert client.post("/admin/reclaim", json={"reclaim_batch": 2}, headers=admin).json()["reclaimed"] == 2
    assert client.post("/admin/reclaim", json={"reclaim_batch": 1000}, headers=admin).json()["reclaimed"] == 3


@pytest.mark.parametrize("body", [{"reclaim_batch": 0}, {"reclaim_batch": 1001}, {"grace": 0}])
def test_bad_reclaim_body_is_422(client: TestClient, admin: dict, body: dict) -> None:
    assert_problem(client.post("/admin/reclaim", json=body, headers=admin), 422, "VALIDATION_ERROR")
