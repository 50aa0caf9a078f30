"""Maker-checker meets deadlines, source revisions and the admin's override (the merge of issue 12's
controls with issues 12-deadlines and 14): the approval queue's order, a revision of a proposal,
and an admin's release or reassign of an approval lease."""

import psycopg
from fastapi.testclient import TestClient

from tests.support.api import assert_problem, item_body
from tests.support.approval import Auth, events_of, lease_one, snapshot, submitted


def test_the_approval_queue_goes_by_due_at_then_created_at(client: TestClient, auth: Auth) -> None:
    admin, alice, bob = auth("ada", "admin"), auth("alice", "reviewer"), auth("bob", "approver")
    late = client.post(
        "/items", json=item_body(variance_amount="25000.00", due_at="2999-01-01T00:00:00Z"), headers=admin
    ).json()["id"]
    early = client.post(
        "/items", json=item_body(variance_amount="25000.00", due_at="2001-01-01T00:00:00Z"), headers=admin
    ).json()["id"]
    leased = client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
    assert [i["id"] for i in leased] == [early, late]
    tokens = {i["id"]: i["lease_token"] for i in leased}
    # Submitted in creation order: the approval queue must still hand out the earlier deadline first.
    for item_id in (late, early):
        done = client.post(
            f"/items/{item_id}/complete",
            json={"resolution": "ADJUSTMENT_POSTED", "note": "JE-1", "lease_token": tokens[item_id]},
            headers=alice,
        )
        assert done.json()["outcome"] == "submitted_for_approval", done.text
    assert lease_one(client, bob, "approval")["id"] == early
    assert lease_one(client, bob, "approval")["id"] == late


def test_a_revision_sends_a_proposal_back_to_pending_and_ends_the_approval_lease(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    bob, feeder = auth("bob", "approver"), auth("feeder", "ingest")
    approval = lease_one(client, bob, "approval")
    revised = client.post(
        f"/items/{item_id}/revisions",
        json={"variance_amount": "26000.00", "source_hash": "sha256:rev-1"},
        headers=feeder,
    )
    assert revised.status_code == 200, revised.text
    item = revised.json()["item"]
    assert revised.json()["outcome"] == "revised"
    assert (item["state"], item["leased_by"], item["variance_amount"]) == ("PENDING", None, "26000.00")
    # The proposal stays on the row until the next completion (as after a rejection).
    assert (item["prepared_by"], item["proposed_resolution"]) == ("alice", "ADJUSTMENT_POSTED")
    event, actor, details = events_of(sql, item_id)[-1]
    assert (event, actor, details["previous_state"], details["holder"]) == (
        "REVISED",
        "feeder",
        "AWAITING_APPROVAL",
        "bob",
    )
    # The approver's lease is over: approve is refused and changes nothing.
    before = snapshot(sql)
    refused = client.post(
        f"/items/{item_id}/approve", json={"lease_token": approval["lease_token"]}, headers=bob
    )
    assert_problem(refused, 409, "LEASE_NOT_HELD")
    assert snapshot(sql) == before
    # Nothing in the approval queue; a reviewer decides again on the new figures.
    assert client.post("/leases", json={"queue": "approval"}, headers=bob).json()["items"] == []
    assert lease_one(client, auth("carol", "reviewer"))["id"] == item_id


def test_a_revision_of_an_unleased_proposal_sends_it_back_too(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    revised = client.post(
        f"/items/{item_id}/revisions",
        json={"variance_amount": "30.00", "source_hash": "sha256:rev-2"},
        headers=auth("feeder", "ingest"),
    )
    assert revised.status_code == 200 and revised.json()["item"]["state"] == "PENDING", revised.text
    row = sql.execute("SELECT state, leased_by FROM review_queue_item WHERE id = %s", (item_id,)).fetchone()
    assert row == ("PENDING", None)
    # Below the threshold now: the next completion resolves at once.
    alice = auth("alice", "reviewer")
    leased = lease_one(client, alice)
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "ADJUSTMENT_POSTED", "note": "JE-2", "lease_token": leased["lease_token"]},
        headers=alice,
    )
    assert done.json()["outcome"] == "resolved", done.text


def test_an_admin_release_of_an_approval_lease_returns_it_to_the_approval_queue(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    admin, bob = auth("ada", "admin"), auth("bob", "approver")
    approval = lease_one(client, bob, "approval")
    released = client.post(f"/admin/items/{item_id}/release", json={"reason": "on leave"}, headers=admin)
    assert released.status_code == 200, released.text
    assert (released.json()["state"], released.json()["leased_by"]) == ("AWAITING_APPROVAL", None)
    event, actor, details = events_of(sql, item_id)[-1]
    assert (event, actor, details["previous_holder"], details["override"]) == ("RELEASED", "ada", "bob", True)
    assert_problem(
        client.post(f"/items/{item_id}/approve", json={"lease_token": approval["lease_token"]}, headers=bob),
        409,
        "LEASE_NOT_HELD",
    )
    # Back in the approval queue, never in the review queue.
    assert (
        client.post("/leases", json={"batch_size": 5}, headers=auth("carol", "reviewer")).json()["items"]
        == []
    )
    assert lease_one(client, auth("dora", "approver"), "approval")["id"] == item_id


def test_an_admin_release_of_all_a_persons_leases_includes_approval_leases(
    client: TestClient, auth: Auth
) -> None:
    item_id, _ = submitted(client, auth)
    admin, bob = auth("ada", "admin"), auth("bob", "approver")
    lease_one(client, bob, "approval")
    answer = client.post("/admin/reviewers/bob/release", json={"reason": "on leave"}, headers=admin).json()
    assert answer["released"] == 1
    assert (answer["items"][0]["id"], answer["items"][0]["state"]) == (item_id, "AWAITING_APPROVAL")


def test_reassign_of_an_approval_lease_never_goes_to_the_preparer(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)  # prepared by alice
    admin, bob, dora = auth("ada", "admin"), auth("bob", "approver"), auth("dora", "approver")
    auth("alice", "approver")  # the preparer also holds an approver's token: still refused
    approval = lease_one(client, bob, "approval")
    before = snapshot(sql)
    refused = client.post(
        f"/admin/items/{item_id}/reassign", json={"reviewer": "alice", "reason": "cover"}, headers=admin
    )
    assert assert_problem(refused, 403, "SEGREGATION_OF_DUTIES")["prepared_by"] == "alice"
    # A reviewer without an approver's (or admin's) token cannot take an approval lease.
    auth("carol", "reviewer")
    assert_problem(
        client.post(
            f"/admin/items/{item_id}/reassign", json={"reviewer": "carol", "reason": "cover"}, headers=admin
        ),
        409,
        "NOT_A_REVIEWER",
    )
    assert snapshot(sql) == before
    moved = client.post(
        f"/admin/items/{item_id}/reassign", json={"reviewer": "dora", "reason": "cover"}, headers=admin
    )
    assert moved.status_code == 200, moved.text
    assert (moved.json()["state"], moved.json()["leased_by"]) == ("AWAITING_APPROVAL", "dora")
    event, _, details = events_of(sql, item_id)[-1]
    assert (event, details["previous_holder"], details["leased_by"]) == ("REASSIGNED", "bob", "dora")
    assert_problem(
        client.post(f"/items/{item_id}/approve", json={"lease_token": approval["lease_token"]}, headers=bob),
        409,
        "LEASE_NOT_HELD",
    )
    approved = client.post(f"/items/{item_id}/approve", headers=dora)
    assert approved.status_code == 200, approved.text
    assert (approved.json()["item"]["resolved_by"], approved.json()["item"]["approved_by"]) == (
        "alice",
        "dora",
    )


def test_the_database_refuses_a_reassign_to_the_preparer_even_without_the_guard(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    lease_one(client, auth("bob", "approver"), "approval")
    try:
        sql.execute("UPDATE review_queue_item SET leased_by = 'alice' WHERE id = %s", (item_id,))
    except psycopg.errors.CheckViolation:
        return
    raise AssertionError("the approval_lease_not_preparer CHECK let the preparer hold the approval lease")


def test_batch_completion_applies_the_catalogue_and_the_threshold_per_entry(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    big, small, unknown, no_note = (
        client.post("/items", json=item_body(variance_amount=amount), headers=admin).json()["id"]
        for amount in ("25000.00", "12.50", "13.50", "14.50")
    )
    leased = client.post("/leases", json={"batch_size": 4}, headers=alice).json()["items"]
    tokens = {i["id"]: i["lease_token"] for i in leased}
    assert set(tokens) == {big, small, unknown, no_note}
    entries = [
        {"id": big, "resolution": "ADJUSTMENT_POSTED", "note": "JE-9", "lease_token": tokens[big]},
        {"id": unknown, "resolution": "NO_SUCH_CODE", "lease_token": tokens[unknown]},
        {"id": small, "resolution": "ADJUSTMENT_POSTED", "note": "JE-10", "lease_token": tokens[small]},
        {"id": no_note, "resolution": "WRITE_OFF", "lease_token": tokens[no_note]},
    ]
    response = client.post("/items/complete", json={"items": entries}, headers=alice)
    assert response.status_code == 200, response.text
    results = {r["id"]: r for r in response.json()["results"]}
    assert results[big]["outcome"] == "submitted_for_approval"
    assert (results[big]["item"]["state"], results[big]["item"]["prepared_by"]) == (
        "AWAITING_APPROVAL",
        "alice",
    )
    assert results[small]["outcome"] == "resolved" and results[small]["item"]["state"] == "RESOLVED"
    refused = results[unknown]
    assert (refused["outcome"], refused["problem"]["code"], refused["problem"]["status"]) == (
        "refused",
        "VALIDATION_ERROR",
        422,
    )
    assert "ADJUSTMENT_POSTED" in refused["problem"]["allowed_resolutions"]
    assert refused["problem"]["errors"][0]["loc"] == ["body", "resolution"]
    assert results[no_note]["problem"]["errors"][0]["loc"] == ["body", "note"]
    states = dict(sql.execute("SELECT id::text, state FROM review_queue_item").fetchall())
    assert (states[big], states[small], states[unknown], states[no_note]) == (
        "AWAITING_APPROVAL",
        "RESOLVED",
        "ASSIGNED",
        "ASSIGNED",
    )
    assert [e for e, _, _ in events_of(sql, big)][-1] == "SUBMITTED_FOR_APPROVAL"
    # A retry of the batch answers per entry as the single route would.
    again = client.post("/items/complete", json={"items": entries[:1]}, headers=alice).json()["results"]
    assert again[0]["outcome"] == "already_submitted"
    # The approver finds it in the approval queue.
    assert lease_one(client, auth("bob", "approver"), "approval")["id"] == big
