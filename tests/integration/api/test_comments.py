"""Comments (issue 42, part 2): POST /items/{id}/comments appends a COMMENTED event to the item's
trail, by every role that reads items but integration; the item itself never changes. The event is
in the trail, the feed and the sealed, exported chain like every other."""

import json

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, enqueue
from tests.support.approval import lease_one, snapshot, submitted
from tests.support.audit import seal


def comment(client: TestClient, headers: dict[str, str], item_id: str, text: str) -> dict:
    response = client.post(f"/items/{item_id}/comments", json={"text": text}, headers=headers)
    assert response.status_code == 201, response.text
    body: dict = response.json()
    return body


@pytest.mark.parametrize("role", ["reviewer", "approver", "ingest", "auditor", "admin"])
def test_every_reading_role_comments_and_the_item_does_not_change(
    client: TestClient, auth: Auth, sql: psycopg.Connection, role: str
) -> None:
    item = enqueue(client, auth("ada", "admin"))
    lease_one(client, auth("alice", "reviewer"))
    items_before, _ = snapshot(sql)
    event = comment(client, auth("casey", role), item["id"], "Invoice INV-77412 is in the March run.")
    assert (event["event"], event["actor"], event["item_id"]) == ("COMMENTED", "casey", item["id"])
    assert event["details"] == {"text": "Invoice INV-77412 is in the March run."}
    assert event["lease_epoch"] == 1 and event["trace_id"] == item["trace_id"]  # the lease it was made under
    assert snapshot(sql)[0] == items_before  # not the state, the lease, nor anything else
    trail = client.get(f"/items/{item['id']}/events", headers=auth("audrey", "auditor")).json()["events"]
    assert trail[-1] == event


def test_a_comment_on_a_proposal_leaves_it_awaiting_approval(client: TestClient, auth: Auth) -> None:
    item_id, _ = submitted(client, auth)
    comment(client, auth("bob", "approver"), item_id, "Which JE?")
    comment(client, auth("alice", "reviewer"), item_id, "JE-7, posted on the 3rd.")
    item = client.get(f"/items/{item_id}", headers=auth("bob", "approver")).json()
    assert item["state"] == "AWAITING_APPROVAL"
    assert lease_one(client, auth("bob", "approver"), "approval")["id"] == item_id


def test_integration_tokens_do_not_comment(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    item = enqueue(client, auth("ada", "admin"))
    before = snapshot(sql)
    refused = client.post(
        f"/items/{item['id']}/comments", json={"text": "hi"}, headers=auth("hook", "integration")
    )
    assert_problem(refused, 403, "FORBIDDEN")
    assert snapshot(sql) == before


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"text": ""},
        {"text": " \n\t "},
        {"text": "x" * 2001},
        {"text": 7},
        {"text": "a\u0000b"},
        {"text": "a", "x": 1},
    ],
    ids=["missing", "empty", "blank", "too-long", "number", "nul", "extra"],
)
def test_a_malformed_comment_is_a_422_that_writes_nothing(
    client: TestClient, auth: Auth, sql: psycopg.Connection, body: dict
) -> None:
    item = enqueue(client, auth("ada", "admin"))
    before = snapshot(sql)
    assert_problem(
        client.post(f"/items/{item['id']}/comments", json=body, headers=auth("alice", "reviewer")),
        422,
        "VALIDATION_ERROR",
    )
    assert snapshot(sql) == before


def test_two_thousand_characters_are_kept_whole(client: TestClient, auth: Auth) -> None:
    item = enqueue(client, auth("ada", "admin"))
    text = "é" * 1999 + "\U0001f9fe"  # characters, not bytes
    assert comment(client, auth("alice", "reviewer"), item["id"], text)["details"]["text"] == text


def test_a_comment_on_no_item_is_a_404(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    before = snapshot(sql)
    missing = "00000000-0000-4000-8000-000000000000"
    assert_problem(
        client.post(f"/items/{missing}/comments", json={"text": "hi"}, headers=auth("alice", "reviewer")),
        404,
        "NOT_FOUND",
    )
    assert snapshot(sql) == before


def test_a_comment_is_in_the_feed_and_in_the_sealed_exported_chain(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    item = enqueue(client, auth("ada", "admin"))
    event = comment(client, auth("alice", "reviewer"), item["id"], "see the bank letter")
    feed = client.get("/events", params={"limit": 100}, headers=auth("ada", "admin"))
    assert feed.status_code == 200, feed.text
    (fed,) = [e for e in feed.json()["events"] if e["id"] == event["id"]]
    assert (fed["event"], fed["details"], fed["item"]["id"]) == ("COMMENTED", event["details"], item["id"])
    seal(db_url)
    export = client.get("/audit/export", headers=auth("audrey", "auditor"))
    assert export.status_code == 200, export.text
    lines = [json.loads(line) for line in export.text.splitlines()]
    (sealed,) = [line for line in lines if line["event"]["id"] == event["id"]]
    assert sealed["event"]["event"] == "COMMENTED" and sealed["event"]["details"] == event["details"]
