"""The admin's override (issue 13 item 11): release another reviewer's leases (one item, or all of a
reviewer's) and reassign an item to a named reviewer. Each is one guarded statement with an event
naming the admin; the old holder's token is dead afterwards."""

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.support.api import Auth, assert_problem, item_body
from tests.support.postgres import make_settings
from tests.support.servers import cli


def _lease(client: TestClient, headers: dict[str, str], count: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.post("/leases", json={"batch_size": count}, headers=headers).json()[
        "items"
    ]
    assert len(items) == count
    return items


def _events(sql: psycopg.Connection, item_id: str) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (e, a, d)
        for e, a, d in sql.execute(
            "SELECT event, actor, details FROM review_queue_event WHERE item_id = %s ORDER BY id", (item_id,)
        )
    ]


@pytest.fixture
def people(client: TestClient, auth: Auth) -> dict[str, dict[str, str]]:
    ada = auth("ada", "admin")
    for _ in range(5):
        assert client.post("/items", json=item_body(), headers=ada).status_code == 201
    return {"ada": ada, "alice": auth("alice", "reviewer"), "bob": auth("bob", "reviewer")}


def test_admin_releases_one_item_and_the_holder_token_is_dead(
    client: TestClient, people: dict[str, dict[str, str]], sql: psycopg.Connection
) -> None:
    (held,) = _lease(client, people["alice"], 1)
    response = client.post(
        f"/admin/items/{held['id']}/release", json={"reason": "alice is on leave"}, headers=people["ada"]
    )
    assert response.status_code == 200, response.text
    item = response.json()
    assert (item["state"], item["leased_by"], item["lease_token"]) == ("PENDING", None, None)
    assert item["created_at"] == held["created_at"]  # its old place in the queue
    assert _events(sql, held["id"])[-1] == (
        "RELEASED", "ada", {"reason": "alice is on leave", "previous_holder": "alice", "override": True},
    )  # fmt: skip
    for action, body in (("complete", {"resolution": "APPROVED"}), ("renew", {}), ("release", {})):
        sent = {**body, "lease_token": held["lease_token"]}
        assert_problem(
            client.post(f"/items/{held['id']}/{action}", json=sent, headers=people["alice"]),
            409,
            "LEASE_NOT_HELD",
        )
    # Not ASSIGNED any more: a second release is refused and writes nothing.
    events = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()
    again = client.post(f"/admin/items/{held['id']}/release", json={"reason": "x"}, headers=people["ada"])
    assert "PENDING" in assert_problem(again, 409, "NOT_ASSIGNED")["detail"]
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == events
    # It is leased again first (oldest).
    (next_up,) = _lease(client, people["bob"], 1)
    assert next_up["id"] == held["id"]


def test_admin_releases_all_of_a_reviewers_items_in_one_statement(
    client: TestClient, people: dict[str, dict[str, str]], sql: psycopg.Connection
) -> None:
    alices = _lease(client, people["alice"], 3)
    (bobs,) = _lease(client, people["bob"], 1)
    response = client.post(
        "/admin/reviewers/alice/release", json={"reason": "on leave for two weeks"}, headers=people["ada"]
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["released"] == 3
    assert [i["id"] for i in answer["items"]] == [i["id"] for i in alices]  # queue order
    assert {i["state"] for i in answer["items"]} == {"PENDING"}
    for held in alices:
        event, actor, details = _events(sql, held["id"])[-1]
        assert (event, actor, details["previous_holder"], details["override"]) == (
            "RELEASED",
            "ada",
            "alice",
            True,
        )
    # All three events were written by one statement (one transaction).
    xids = sql.execute(
        "SELECT count(DISTINCT xid) FROM review_queue_event WHERE event = 'RELEASED'"
    ).fetchone()
    assert xids == (1,)
    assert client.get(f"/items/{bobs['id']}", headers=people["bob"]).json()["leased_by"] == "bob"
    # Nothing left to release: an empty answer, nothing written.
    again = client.post("/admin/reviewers/alice/release", json={"reason": "x"}, headers=people["ada"])
    assert again.json() == {"released": 0, "items": []}


def test_reassign_moves_the_lease_and_kills_the_old_token(
    client: TestClient, people: dict[str, dict[str, str]], sql: psycopg.Connection
) -> None:
    (held,) = _lease(client, people["alice"], 1)
    epoch = sql.execute("SELECT lease_epoch FROM review_queue_item WHERE id = %s", (held["id"],)).fetchone()
    response = client.post(
        f"/admin/items/{held['id']}/reassign",
        json={"reviewer": "bob", "reason": "bob covers ACME"},
        headers=people["ada"],
    )
    assert response.status_code == 200, response.text
    moved = response.json()
    assert (moved["state"], moved["leased_by"], moved["lease_token"]) == ("ASSIGNED", "bob", None)
    assert moved["attempts"] == held["attempts"]  # not a new attempt
    after = sql.execute("SELECT lease_epoch FROM review_queue_item WHERE id = %s", (held["id"],)).fetchone()
    assert after is not None and epoch is not None and after[0] == epoch[0] + 1
    event, actor, details = _events(sql, held["id"])[-1]
    assert (event, actor, details["previous_holder"], details["leased_by"], details["reason"]) == (
        "REASSIGNED", "ada", "alice", "bob", "bob covers ACME",
    )  # fmt: skip

    # Alice is refused with her token and without one.
    for body in ({"resolution": "APPROVED", "lease_token": held["lease_token"]}, {"resolution": "APPROVED"}):
        assert_problem(
            client.post(f"/items/{held['id']}/complete", json=body, headers=people["alice"]),
            409,
            "LEASE_NOT_HELD",
        )
    # Bob finds it in his work, with a token, and completes it.
    mine = client.get("/items", params={"state": "ASSIGNED", "leased_by": "me"}, headers=people["bob"]).json()
    (found,) = [i for i in mine["items"] if i["id"] == held["id"]]
    assert found["lease_token"] not in (None, held["lease_token"])
    done = client.post(
        f"/items/{held['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": found["lease_token"]},
        headers=people["bob"],
    )
    assert done.status_code == 200 and done.json()["item"]["resolved_by"] == "bob", done.text


def test_reassign_refusals_change_nothing(
    client: TestClient, people: dict[str, dict[str, str]], sql: psycopg.Connection, auth: Auth
) -> None:
    (held,) = _lease(client, people["alice"], 1)
    auth("ivan", "ingest")
    pending = client.get("/items", params={"state": "PENDING", "limit": 1}, headers=people["ada"]).json()[
        "items"
    ][0]
    before = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall()
    events = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()
    for item_id, reviewer, status, code in (
        (held["id"], "alice", 409, "ALREADY_HELD"),
        (held["id"], "zed", 409, "NOT_A_REVIEWER"),
        (held["id"], "ivan", 409, "NOT_A_REVIEWER"),  # ingest cannot lease
        (pending["id"], "bob", 409, "NOT_ASSIGNED"),
        ("00000000-0000-4000-8000-000000000000", "bob", 404, "NOT_FOUND"),
        (held["id"], "me!", 422, "VALIDATION_ERROR"),
    ):
        response = client.post(
            f"/admin/items/{item_id}/reassign",
            json={"reviewer": reviewer, "reason": "r"},
            headers=people["ada"],
        )
        assert_problem(response, status, code)
    for body in ({"reviewer": "bob"}, {"reviewer": "bob", "reason": ""}):
        response = client.post(f"/admin/items/{held['id']}/reassign", json=body, headers=people["ada"])
        assert_problem(response, 422, "VALIDATION_ERROR")
    for path in (f"/admin/items/{held['id']}/reassign", f"/admin/items/{held['id']}/release"):
        body = {"reviewer": "bob", "reason": "r"} if path.endswith("reassign") else {"reason": "r"}
        assert_problem(client.post(path, json=body, headers=people["alice"]), 403, "FORBIDDEN")
    assert_problem(
        client.post("/admin/reviewers/alice/release", json={"reason": "r"}, headers=people["bob"]),
        403,
        "FORBIDDEN",
    )
    assert (
        sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall() == before
    )
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == events


def test_release_all_racing_the_holders_completions(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    """The admin releases all of alice's items while she completes them, on separate connections:
    every item ends up either resolved by alice or released by the admin, never both, never neither
    (one event each, by the event table)."""
    ada = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    count = 30
    with httpx.Client(base_url=live_server, timeout=60) as http:
        http.post("/items/batch", json={"items": [item_body() for _ in range(count)]}, headers=ada)
        held = http.post("/leases", json={"batch_size": count}, headers=alice).json()["items"]
    assert len(held) == count
    barrier = threading.Barrier(2)
    completed: list[tuple[str, int]] = []
    released: list[str] = []

    def complete_all() -> None:
        with httpx.Client(base_url=live_server, timeout=60) as http:
            barrier.wait(timeout=60)
            for item in held:
                body = {"resolution": "APPROVED", "lease_token": item["lease_token"]}
                completed.append(
                    (
                        item["id"],
                        http.post(f"/items/{item['id']}/complete", json=body, headers=alice).status_code,
                    )
                )

    def release_all() -> None:
        with httpx.Client(base_url=live_server, timeout=60) as http:
            barrier.wait(timeout=60)
            answer = http.post("/admin/reviewers/alice/release", json={"reason": "leave"}, headers=ada).json()
            released.extend(i["id"] for i in answer["items"])

    threads = [threading.Thread(target=complete_all), threading.Thread(target=release_all)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    resolved = {i for i, status in completed if status == 200}
    assert {status for _, status in completed} <= {200, 409}, completed
    assert resolved.isdisjoint(released) and resolved | set(released) == {i["id"] for i in held}
    with httpx.Client(base_url=live_server, timeout=60) as http:
        for item in held:
            trail = http.get(f"/items/{item['id']}/events", headers=ada).json()["events"]
            kinds = Counter(e["event"] for e in trail)
            assert kinds["RESOLVED"] + kinds["RELEASED"] == 1, trail
            assert (kinds["RESOLVED"] == 1) == (item["id"] in resolved)


def test_cli_release_and_reassign(
    db_url: str, client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    alice, bob = auth("alice", "reviewer"), auth("bob", "reviewer")
    for _ in range(3):
        client.post("/items", json=item_body(), headers=auth("ada", "admin"))
    first, second, third = _lease(client, alice, 3)

    moved = cli(
        db_url, "admin", "reassign", first["id"], "--to", "bob", "--reason", "covering", "--admin", "ada"
    )
    assert moved.returncode == 0, moved.stderr
    assert f"reassigned {first['id']} from alice to bob" in moved.stdout
    # Reported once, after the commit (the db function reports it; the command must not again).
    assert moved.stdout.count('"review_item_reassigned"') == 1, moved.stdout
    assert client.get(f"/items/{first['id']}", headers=bob).json()["leased_by"] == "bob"

    one = cli(db_url, "admin", "release", "--item", second["id"], "--reason", "stuck", "--admin", "ada")
    assert one.returncode == 0, one.stderr
    assert "released 1 item(s)" in one.stdout
    assert one.stdout.count('"review_item_released_by_admin"') == 1, one.stdout
    rest = cli(db_url, "admin", "release", "--reviewer", "alice", "--reason", "on leave", "--admin", "ada")
    assert rest.returncode == 0 and f"released {third['id']} (held by alice)" in rest.stdout, rest.stderr
    assert rest.stdout.count('"review_item_released_by_admin"') == 1, rest.stdout
    nothing = cli(db_url, "admin", "release", "--reviewer", "alice", "--reason", "again", "--admin", "ada")
    assert nothing.returncode == 1 and "alice holds no items; nothing released" in nothing.stderr
    bad = cli(db_url, "admin", "reassign", first["id"], "--to", "zed", "--reason", "x", "--admin", "ada")
    assert bad.returncode == 1 and "'zed' has no live token" in bad.stderr
    assert (
        cli(db_url, "admin", "release", "--item", first["id"], "--reason", "x", "--admin", "me").returncode
        == 2
    )

    actors = sql.execute(
        "SELECT event, actor, details->>'previous_holder' FROM review_queue_event"
        " WHERE event IN ('REASSIGNED', 'RELEASED') ORDER BY id"
    ).fetchall()
    assert actors == [
        ("REASSIGNED", "ada", "alice"),
        ("RELEASED", "ada", "alice"),
        ("RELEASED", "ada", "alice"),
    ]


def test_reassign_respects_the_per_reviewer_cap(db_url: str, auth: Auth) -> None:
    with TestClient(create_app(make_settings(db_url, max_leases_per_reviewer=1))) as capped:
        ada, alice, bob = auth("ada", "admin"), auth("alice", "reviewer"), auth("bob", "reviewer")
        for _ in range(2):
            capped.post("/items", json=item_body(), headers=ada)
        (mine,) = _lease(capped, alice, 1)
        _lease(capped, bob, 1)
        body = {"reviewer": "bob", "reason": "bob is full"}
        refused = capped.post(f"/admin/items/{mine['id']}/reassign", json=body, headers=ada)
        assert_problem(refused, 409, "REVIEWER_AT_CAP")
        assert capped.get(f"/items/{mine['id']}", headers=ada).json()["leased_by"] == "alice"
