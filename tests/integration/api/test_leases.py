"""POST /leases."""

from datetime import datetime

import pytest
from fastapi.testclient import TestClient

from api.settings import Settings
from tests.support.api import Auth, assert_problem, item_body


def enqueue_n(client: TestClient, headers: dict[str, str], n: int) -> list[dict]:
    items = []
    for _ in range(n):
        response = client.post("/items", json=item_body(), headers=headers)
        assert response.status_code == 201
        items.append(response.json())
    return items


def test_empty_queue_gives_an_empty_list(client: TestClient, alice: dict) -> None:
    response = client.post("/leases", headers=alice)
    assert response.status_code == 200
    assert response.json() == {"items": []}


def test_default_batch_is_the_setting_and_oldest_first(
    client: TestClient, admin: dict, alice: dict, settings: Settings
) -> None:
    created = enqueue_n(client, admin, settings.batch_size + 3)
    response = client.post("/leases", headers=alice)
    items = response.json()["items"]
    assert [i["id"] for i in items] == [c["id"] for c in created[: settings.batch_size]]
    for item in items:
        assert item["state"] == "ASSIGNED" and item["leased_by"] == "alice"
        leased_at = datetime.fromisoformat(item["leased_at"])
        expires = datetime.fromisoformat(item["lease_expires_at"])
        assert (expires - leased_at).total_seconds() == settings.lock_timeout_ms / 1000


def test_batch_size_is_honoured_and_leased_items_are_not_handed_out_again(
    client: TestClient, admin: dict, alice: dict, auth: Auth
) -> None:
    created = enqueue_n(client, admin, 5)
    first = client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
    bob = auth("bob", "reviewer")
    second = client.post("/leases", json={"batch_size": 10}, headers=bob).json()["items"]
    assert [i["id"] for i in first] == [c["id"] for c in created[:2]]
    assert [i["id"] for i in second] == [c["id"] for c in created[2:]]
    assert {i["leased_by"] for i in second} == {"bob"}


def test_the_lease_belongs_to_the_token_subject_not_the_body(
    client: TestClient, admin: dict, alice: dict
) -> None:
    enqueue_n(client, admin, 1)
    response = client.post("/leases", json={"batch_size": 1, "worker_id": "mallory"}, headers=alice)
    assert_problem(response, 422, "VALIDATION_ERROR")
    response = client.post(
        "/leases", json={"batch_size": 1}, headers={**alice, "X-Forwarded-User": "mallory"}
    )
    assert response.json()["items"][0]["leased_by"] == "alice"


@pytest.mark.parametrize(
    "body", [{"batch_size": 0}, {"batch_size": 201}, {"batch_size": "x"}, {"batch_size": 1.5}]
)
def test_bad_batch_size_is_422(client: TestClient, alice: dict, body: dict) -> None:
    assert_problem(client.post("/leases", json=body, headers=alice), 422, "VALIDATION_ERROR")


def test_batch_size_200_is_allowed(client: TestClient, admin: dict, alice: dict, sql) -> None:
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
           source_hash) SELECT 'k' || i, 'E', 1, 'PARTIAL', 'h' FROM generate_series(1, 250) i"""
    )
    response = client.post("/leases", json={"batch_size": 200}, headers=alice)
    assert len(response.json()["items"]) == 200
