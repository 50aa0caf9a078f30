"""Issue 12, parts 1 and 2: the resolution catalogue, and maker-checker approval above a threshold.

Every state change is checked in the database and in the audit trail; refusals change nothing."""

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.support.api import assert_problem, item_body
from tests.support.approval import Auth, events_of, lease_one, snapshot, submitted
from tests.support.postgres import make_settings

# --- the catalogue --------------------------------------------------------------------------


def test_the_migration_seeds_a_default_catalogue_that_any_role_can_read(
    client: TestClient, auth: Auth
) -> None:
    for role in ("reviewer", "approver", "ingest", "auditor", "admin"):
        response = client.get("/resolutions", headers=auth(f"u-{role}", role))
        assert response.status_code == 200, response.text
    codes = {c["code"]: c for c in response.json()["resolutions"]}
    assert {
        "WRITE_OFF",
        "ADJUSTMENT_POSTED",
        "TIMING_DIFFERENCE",
        "MATCH_CONFIRMED",
        "MATCH_REJECTED",
    } <= set(codes)
    assert codes["ADJUSTMENT_POSTED"]["approval_threshold"] == "10000.00"
    assert codes["ADJUSTMENT_POSTED"]["requires_note"] is True
    assert codes["MATCH_CONFIRMED"]["approval_threshold"] is None


def test_an_admin_creates_updates_and_deactivates_a_code(client: TestClient, auth: Auth) -> None:
    admin = auth("ada", "admin")
    body = {"label": "FX revaluation", "approval_threshold": "500.00"}
    created = client.put("/resolutions/FX_REVALUATION", json=body, headers=admin)
    assert created.status_code == 201, created.text
    assert created.json()["approval_threshold"] == "500.00" and created.json()["active"] is True
    updated = client.put("/resolutions/FX_REVALUATION", json={**body, "requires_note": True}, headers=admin)
    assert updated.status_code == 200 and updated.json()["requires_note"] is True
    off = client.put("/resolutions/FX_REVALUATION", json={**body, "active": False}, headers=admin)
    assert off.status_code == 200 and off.json()["active"] is False
    listed = client.get("/resolutions", headers=admin).json()["resolutions"]
    assert "FX_REVALUATION" not in {c["code"] for c in listed}
    for refused in ({"label": "x", "approval_threshold": "-1.00"}, {"label": ""}, {"label": "x", "extra": 1}):
        assert_problem(
            client.put("/resolutions/FX_REVALUATION", json=refused, headers=admin), 422, "VALIDATION_ERROR"
        )
    assert_problem(client.put("/resolutions/fx", json=body, headers=admin), 422, "VALIDATION_ERROR")
    assert_problem(
        client.put("/resolutions/FX", json=body, headers=auth("alice", "approver")), 403, "FORBIDDEN"
    )


def test_the_database_refuses_to_delete_a_code_for_the_service(db_url: str) -> None:
    from tests.support.postgres import libpq

    with (
        psycopg.connect(libpq(db_url), autocommit=True) as app_role,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        app_role.execute("DELETE FROM resolution_code WHERE code = 'WRITE_OFF'")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"resolution": "NO_SUCH_CODE"}, "resolution"),
        ({"resolution": "WRITE_OFF"}, "note"),  # requires a note
        ({"resolution": "WRITE_OFF", "note": "   "}, "note"),
    ],
)
def test_an_unknown_code_or_a_missing_note_is_a_422_that_changes_nothing(
    client: TestClient, auth: Auth, sql: psycopg.Connection, body: dict[str, Any], field: str
) -> None:
    alice = auth("alice", "reviewer")
    client.post("/items", json=item_body(), headers=auth("ada", "admin"))
    leased = lease_one(client, alice)
    before = snapshot(sql)
    problem = assert_problem(
        client.post(f"/items/{leased['id']}/complete", json=body, headers=alice), 422, "VALIDATION_ERROR"
    )
    assert problem["errors"][0]["loc"] == ["body", field]
    assert (
        "WRITE_OFF" in problem["allowed_resolutions"] and "MATCH_CONFIRMED" in problem["allowed_resolutions"]
    )
    if field == "resolution":
        assert "MATCH_CONFIRMED" in problem["detail"]
    assert snapshot(sql) == before


def test_an_inactive_code_is_refused_and_old_decisions_keep_it(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    for _ in range(2):
        client.post("/items", json=item_body(), headers=admin)
    first = lease_one(client, alice)
    done = client.post(
        f"/items/{first['id']}/complete", json={"resolution": "TIMING_DIFFERENCE"}, headers=alice
    )
    assert done.json()["outcome"] == "resolved"
    client.put("/resolutions/TIMING_DIFFERENCE", json={"label": "Timing", "active": False}, headers=admin)
    second = lease_one(client, alice)
    refused = client.post(
        f"/items/{second['id']}/complete", json={"resolution": "TIMING_DIFFERENCE"}, headers=alice
    )
    assert_problem(refused, 422, "VALIDATION_ERROR")
    # The retry of the earlier decision still answers as a retry; the row keeps its code.
    retry = client.post(
        f"/items/{first['id']}/complete", json={"resolution": "TIMING_DIFFERENCE"}, headers=alice
    )
    assert retry.status_code == 200 and retry.json()["outcome"] == "already_resolved"
    assert sql.execute(
        "SELECT resolution FROM review_queue_item WHERE id = %s", (first["id"],)
    ).fetchone() == ("TIMING_DIFFERENCE",)


def test_rows_from_before_the_catalogue_keep_their_free_text(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id = client.post("/items", json=item_body(), headers=auth("ada", "admin")).json()["id"]
    sql.execute(
        "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'LEGACY_FREE_TEXT',"
        " resolved_by = 'old',"
        " resolved_at = now() WHERE id = %s",
        (item_id,),
    )
    assert client.get(f"/items/{item_id}", headers=auth("alice", "reviewer")).json()["resolution"] == (
        "LEGACY_FREE_TEXT"
    )


# --- maker-checker --------------------------------------------------------------------------


def test_below_the_threshold_a_completion_resolves_at_once(client: TestClient, auth: Auth) -> None:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    client.post("/items", json=item_body(variance_amount="-9999.99"), headers=admin)
    leased = lease_one(client, alice)
    done = client.post(
        f"/items/{leased['id']}/complete",
        json={"resolution": "ADJUSTMENT_POSTED", "note": "JE-1"},
        headers=alice,
    )
    assert done.json()["outcome"] == "resolved" and done.json()["item"]["approved_by"] is None


@pytest.mark.parametrize("amount", ["10000.00", "-10000.00", "25000.00"])
def test_at_or_above_the_threshold_the_item_awaits_approval(
    client: TestClient, auth: Auth, sql: psycopg.Connection, amount: str
) -> None:
    item_id, _ = submitted(client, auth, amount)
    item = client.get(f"/items/{item_id}", headers=auth("alice", "reviewer")).json()
    assert item["state"] == "AWAITING_APPROVAL"
    assert (item["prepared_by"], item["proposed_resolution"], item["proposed_note"]) == (
        "alice",
        "ADJUSTMENT_POSTED",
        "JE-7",
    )
    assert (item["resolution"], item["resolved_by"], item["leased_by"], item["lease_token"]) == (
        None,
        None,
        None,
        None,
    )
    event, actor, details = events_of(sql, item_id)[-1]
    assert (event, actor) == ("SUBMITTED_FOR_APPROVAL", "alice")
    assert details["resolution"] == "ADJUSTMENT_POSTED" and details["note"] == "JE-7"
    assert details["approval_threshold"] == 10000.0


def test_a_retried_submission_answers_already_submitted(client: TestClient, auth: Auth) -> None:
    alice = auth("alice", "reviewer")
    item_id, leased = submitted(client, auth)
    body = {"resolution": "ADJUSTMENT_POSTED", "note": "JE-7", "lease_token": leased["lease_token"]}
    retry = client.post(f"/items/{item_id}/complete", json=body, headers=alice)
    assert retry.status_code == 200 and retry.json()["outcome"] == "already_submitted"
    conflict = client.post(
        f"/items/{item_id}/complete", json={**body, "resolution": "WRITE_OFF"}, headers=alice
    )
    assert_problem(conflict, 409, "RESOLUTION_CONFLICT")
    assert_problem(
        client.post(f"/items/{item_id}/complete", json=body, headers=auth("bob", "reviewer")),
        409,
        "LEASE_NOT_HELD",
    )


def test_the_approval_queue_never_hands_the_preparer_their_own_proposal(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    sql.execute("UPDATE api_token SET role = 'approver' WHERE subject = 'alice'")
    alice = auth("alice", "approver")  # a preparer who is also an approver
    assert client.post("/leases", json={"queue": "approval"}, headers=alice).json()["items"] == []
    bob = auth("bob", "approver")
    leased = lease_one(client, bob, "approval")
    assert leased["id"] == item_id and leased["state"] == "AWAITING_APPROVAL"
    assert leased["leased_by"] == "bob" and leased["lease_token"]
    assert events_of(sql, item_id)[-1][:2] == ("LEASED", "bob")


def test_a_reviewer_cannot_lease_from_the_approval_queue(client: TestClient, auth: Auth) -> None:
    submitted(client, auth)
    for role in ("reviewer",):
        assert_problem(
            client.post("/leases", json={"queue": "approval"}, headers=auth("carol", role)), 403, "FORBIDDEN"
        )
    assert_problem(
        client.post("/leases", json={"queue": "other"}, headers=auth("carol", "approver")),
        422,
        "VALIDATION_ERROR",
    )


def test_approve_resolves_with_the_preparer_as_resolver_and_a_retry_answers_already_approved(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    bob = auth("bob", "approver")
    leased = lease_one(client, bob, "approval")
    response = client.post(
        f"/items/{item_id}/approve", json={"lease_token": leased["lease_token"]}, headers=bob
    )
    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "approved"
    item = response.json()["item"]
    assert (item["state"], item["resolution"], item["resolution_note"]) == (
        "RESOLVED",
        "ADJUSTMENT_POSTED",
        "JE-7",
    )
    assert (item["resolved_by"], item["approved_by"]) == ("alice", "bob") and item["approved_at"]
    event, actor, details = events_of(sql, item_id)[-1]
    assert (event, actor, details["prepared_by"], details["resolution"]) == (
        "APPROVED",
        "bob",
        "alice",
        "ADJUSTMENT_POSTED",
    )
    before = snapshot(sql)
    retry = client.post(f"/items/{item_id}/approve", json={"lease_token": leased["lease_token"]}, headers=bob)
    assert retry.status_code == 200 and retry.json()["outcome"] == "already_approved"
    assert_problem(
        client.post(f"/items/{item_id}/approve", headers=auth("dora", "approver")), 409, "LEASE_NOT_HELD"
    )
    # The preparer's own completion retry, without a token, answers already_resolved.
    again = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "ADJUSTMENT_POSTED"},
        headers=auth("alice", "reviewer"),
    )
    assert again.json()["outcome"] == "already_resolved"
    assert snapshot(sql) == before


def test_approving_your_own_work_is_403_segregation_of_duties(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    sql.execute("UPDATE api_token SET role = 'admin' WHERE subject = 'alice'")
    alice = auth("alice", "admin")
    before = snapshot(sql)
    for action, body in (("approve", {}), ("reject", {"reason": "mine"})):
        problem = assert_problem(
            client.post(f"/items/{item_id}/{action}", json=body, headers=alice), 403, "SEGREGATION_OF_DUTIES"
        )
        assert problem["prepared_by"] == "alice"
    assert snapshot(sql) == before


@pytest.mark.fresh_db("drops a CHECK constraint to reach the statement's own guard")
def test_the_statement_itself_refuses_the_preparer_even_holding_the_lease(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """The SQL guard, not the lease, stops it: with the row forced to show alice as the approval
    lease holder (the CHECK constraint dropped for the test), approve still changes nothing."""
    item_id, _ = submitted(client, auth)
    sql.execute(
        "ALTER TABLE review_queue_item DROP CONSTRAINT ck_review_queue_item_approval_lease_not_preparer"
    )
    sql.execute(
        "UPDATE review_queue_item SET leased_by = 'alice', leased_at = now(),"
        " lease_expires_at = now() + interval '1 hour', lease_nonce = gen_random_uuid() WHERE id = %s",
        (item_id,),
    )
    sql.execute("UPDATE api_token SET role = 'approver' WHERE subject = 'alice'")
    before = snapshot(sql)
    assert_problem(
        client.post(f"/items/{item_id}/approve", headers=auth("alice", "approver")),
        403,
        "SEGREGATION_OF_DUTIES",
    )
    assert snapshot(sql) == before


def test_the_database_refuses_an_approval_lease_held_by_the_preparer(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    with pytest.raises(psycopg.errors.CheckViolation):
        sql.execute(
            "UPDATE review_queue_item SET leased_by = 'alice', lease_expires_at = now() WHERE id = %s",
            (item_id,),
        )


def test_reject_sends_the_item_back_to_its_preparer_with_the_proposal_and_reason_in_the_trail(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin = auth("ada", "admin")
    item_id, _ = submitted(client, auth)
    newer = client.post("/items", json=item_body(), headers=admin).json()["id"]
    bob = auth("bob", "approver")
    leased = lease_one(client, bob, "approval")
    assert_problem(client.post(f"/items/{item_id}/reject", json={}, headers=bob), 422, "VALIDATION_ERROR")
    response = client.post(
        f"/items/{item_id}/reject",
        json={"reason": "wrong entity", "lease_token": leased["lease_token"]},
        headers=bob,
    )
    assert response.status_code == 200, response.text
    item = response.json()
    assert (item["state"], item["leased_by"], item["resolution"]) == ("PENDING", None, None)
    event, actor, details = events_of(sql, item_id)[-1]
    assert (event, actor) == ("REJECTED", "bob")
    assert details == {
        "reason": "wrong entity",
        "resolution": "ADJUSTMENT_POSTED",
        "note": "JE-7",
        "prepared_by": "alice",
    }
    # Returned to alice for REVIEW_QUEUE_REJECTED_RETURN_S (4 h by default): carol gets the newer item.
    (returned,) = sql.execute(
        "SELECT returned_until - now() FROM review_queue_item WHERE id = %s", (item_id,)
    ).fetchone()
    assert timedelta(hours=3, minutes=59) < returned <= timedelta(hours=4), returned
    assert lease_one(client, auth("carol", "reviewer"))["id"] == newer


# --- a rejected proposal goes back to its preparer first (issue 42) -------------------------------


def rejected(client: TestClient, auth: Auth, **fields: Any) -> str:
    """alice's proposal, rejected by bob: PENDING, returned to alice."""
    item_id, _ = submitted(client, auth, **fields)
    bob = auth("bob", "approver")
    token = lease_one(client, bob, "approval")["lease_token"]
    response = client.post(
        f"/items/{item_id}/reject", json={"reason": "no", "lease_token": token}, headers=bob
    )
    assert response.status_code == 200, response.text
    return item_id


def leased_ids(client: TestClient, headers: dict[str, str], **body: Any) -> list[str]:
    response = client.post("/leases", json={"batch_size": 5, **body}, headers=headers)
    assert response.status_code == 200, response.text
    return [i["id"] for i in response.json()["items"]]


def test_the_preparer_gets_their_rejected_proposal_ahead_of_due_order_and_nobody_else_does(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, alice, carol = auth("ada", "admin"), auth("alice", "reviewer"), auth("carol", "reviewer")
    item_id = rejected(client, auth, due_at="2031-01-01T00:00:00Z")
    due_first = client.post("/items", json=item_body(due_at="2030-01-01T00:00:00Z"), headers=admin).json()[
        "id"
    ]
    # Nobody else's lease takes it, unnamed or named, of every entity or of its own.
    assert leased_ids(client, carol, batch_size=1) == [due_first]
    assert leased_ids(client, carol) == []
    assert leased_ids(client, carol, ledger_entity="ACME-CORP") == []
    assert leased_ids(client, carol, item_id=item_id) == []
    client.post(f"/items/{due_first}/release", json={"reason": "back"}, headers=carol)
    # alice's next lease: her returned item first, ahead of the earlier deadline.
    assert leased_ids(client, auth("Alice", "reviewer"), batch_size=1) == [item_id]  # case-folded
    (cleared,) = sql.execute(
        "SELECT returned_until FROM review_queue_item WHERE id = %s", (item_id,)
    ).fetchone()
    assert cleared is None  # the lease ends the return: a release puts it in its due-date place
    assert leased_ids(client, alice) == [due_first]


def test_the_preparers_lease_of_one_entity_takes_it_first_too(client: TestClient, auth: Auth) -> None:
    item_id = rejected(client, auth, due_at="2031-01-01T00:00:00Z")
    client.post("/items", json=item_body(due_at="2030-01-01T00:00:00Z"), headers=auth("ada", "admin"))
    assert leased_ids(client, auth("alice", "reviewer"), ledger_entity="ACME-CORP", batch_size=1) == [item_id]


def test_after_the_return_anyone_leases_it_in_its_due_date_place(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin, carol = auth("ada", "admin"), auth("carol", "reviewer")
    item_id = rejected(client, auth, due_at="2031-01-01T00:00:00Z")
    earlier = client.post("/items", json=item_body(due_at="2030-01-01T00:00:00Z"), headers=admin).json()["id"]
    sql.execute("UPDATE review_queue_item SET returned_until = now() - interval '1 second'")
    assert leased_ids(client, carol) == [earlier, item_id]


def test_an_admin_can_take_a_returned_item_by_name_and_reassign_it(client: TestClient, auth: Auth) -> None:
    admin = auth("ada", "admin")
    item_id = rejected(client, auth)
    assert leased_ids(client, admin) == []
    assert leased_ids(client, admin, item_id=item_id) == [item_id]
    auth("carol", "reviewer")  # a live token: someone who can take the lease
    moved = client.post(
        f"/admin/items/{item_id}/reassign",
        json={"reviewer": "carol", "reason": "alice is away"},
        headers=admin,
    )
    assert moved.status_code == 200, moved.text
    assert moved.json()["leased_by"] == "carol"


def test_with_no_return_a_rejected_item_is_anyones_in_its_place(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    with TestClient(create_app(make_settings(db_url, rejected_return_s=0))) as client:

        def auth(subject: str, role: str) -> dict[str, str]:
            return {"Authorization": f"Bearer {make_token(subject, role)}"}

        item_id = rejected(client, auth)
        assert leased_ids(client, auth("carol", "reviewer")) == [item_id]


def test_approval_leases_renew_release_and_are_reclaimed_back_to_the_approval_queue(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    bob = auth("bob", "approver")
    leased = lease_one(client, bob, "approval")
    token = {"lease_token": leased["lease_token"]}
    renewed = client.post(f"/items/{item_id}/renew", json=token, headers=bob)
    assert renewed.status_code == 200 and renewed.json()["state"] == "AWAITING_APPROVAL"
    released = client.post(f"/items/{item_id}/release", json={**token, "reason": "later"}, headers=bob)
    assert released.status_code == 200, released.text
    assert (released.json()["state"], released.json()["leased_by"]) == ("AWAITING_APPROVAL", None)
    # The old token is fenced off. (bob names the item: his release cools it off for his own
    # unnamed leases.)
    response = client.post("/leases", json={"queue": "approval", "item_id": item_id}, headers=bob)
    (again,) = response.json()["items"]
    assert_problem(client.post(f"/items/{item_id}/approve", json=token, headers=bob), 409, "LEASE_NOT_HELD")
    assert again["lease_token"] != leased["lease_token"]
    # Expired past the grace: the reclaim puts it back to the approval queue, never PENDING.
    sql.execute(
        "UPDATE review_queue_item SET lease_expires_at = now() - interval '1 hour' WHERE id = %s", (item_id,)
    )
    reclaimed = client.post("/admin/reclaim", json={}, headers=auth("ada", "admin")).json()
    assert reclaimed["reclaimed"] == 1 and reclaimed["items"][0]["state"] == "AWAITING_APPROVAL"
    row = sql.execute("SELECT state, leased_by FROM review_queue_item WHERE id = %s", (item_id,)).fetchone()
    assert row == ("AWAITING_APPROVAL", None)
    event, _, details = events_of(sql, item_id)[-1]
    assert event == "RECLAIMED" and details["queue"] == "approval" and details["previous_holder"] == "bob"
    # Nobody leases it from the review queue; dora approves it.
    assert (
        client.post("/leases", json={"batch_size": 5}, headers=auth("carol", "reviewer")).json()["items"]
        == []
    )
    dora = auth("dora", "approver")
    lease_one(client, dora, "approval")
    assert client.post(f"/items/{item_id}/approve", headers=dora).json()["item"]["approved_by"] == "dora"


def test_stats_metrics_and_item_filters_count_the_approval_queue(client: TestClient, auth: Auth) -> None:
    admin = auth("ada", "admin")
    item_id, _ = submitted(client, auth)
    submitted(client, auth)
    lease_one(client, auth("bob", "approver"), "approval")
    stats = client.get("/stats", headers=auth("bob", "approver")).json()
    assert stats["counts"]["AWAITING_APPROVAL"] == 2 and stats["approval_leases"] == 1
    metrics = client.get("/metrics", headers=admin).text
    assert "review_queue_awaiting_approval_items 2.0" in metrics
    assert "review_queue_approval_leases 1.0" in metrics
    listed = client.get("/items", params={"state": "AWAITING_APPROVAL"}, headers=admin).json()["items"]
    assert len(listed) == 2 and item_id in {i["id"] for i in listed}


def test_a_submission_needs_the_code_active_at_the_statement_and_a_threshold_change_applies_at_once(
    client: TestClient, auth: Auth
) -> None:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    client.put(
        "/resolutions/MATCH_CONFIRMED",
        json={"label": "Match confirmed", "approval_threshold": "0.00"},
        headers=admin,
    )
    client.post("/items", json=item_body(variance_amount="0.00"), headers=admin)
    leased = lease_one(client, alice)
    done = client.post(
        f"/items/{leased['id']}/complete", json={"resolution": "MATCH_CONFIRMED"}, headers=alice
    )
    assert done.json()["outcome"] == "submitted_for_approval"


def test_reopen_of_an_approved_item_clears_the_approval_and_keeps_it_in_the_trail(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    item_id, _ = submitted(client, auth)
    bob = auth("bob", "approver")
    lease_one(client, bob, "approval")
    client.post(f"/items/{item_id}/approve", headers=bob)
    reopened = client.post(
        f"/items/{item_id}/reopen", json={"reason": "re-issued"}, headers=auth("ada", "admin")
    )
    assert reopened.status_code == 200 and reopened.json()["approved_by"] is None
    assert events_of(sql, item_id)[-1][2]["previous_approved_by"] == "bob"


# --- each guard on its own (issue 23: a mutation audit found them caught only by a CHECK's 500) ---


def _drop_sod_checks(sql: psycopg.Connection) -> None:
    for name in ("approval_lease_not_preparer", "four_eyes"):
        sql.execute(f"ALTER TABLE review_queue_item DROP CONSTRAINT ck_review_queue_item_{name}")


@pytest.mark.fresh_db("drops a CHECK constraint to reach the statement's own guard")
@pytest.mark.parametrize("action", ["approve", "reject"])
def test_approve_and_reject_refuse_the_preparer_by_their_own_guard(
    client: TestClient, auth: Auth, sql: psycopg.Connection, action: str
) -> None:
    """Both SoD CHECKs dropped and the row forced to show alice, the preparer, holding the approval
    lease: only the statement's `prepared_by <> caller` guard is left to refuse her, and it does."""
    item_id, _ = submitted(client, auth)
    _drop_sod_checks(sql)
    sql.execute(
        "UPDATE review_queue_item SET leased_by = 'alice', leased_at = now(),"
        " lease_expires_at = now() + interval '1 hour', lease_nonce = gen_random_uuid() WHERE id = %s",
        (item_id,),
    )
    before = snapshot(sql)
    body = {"reason": "mine"} if action == "reject" else {}
    assert_problem(
        client.post(f"/items/{item_id}/{action}", json=body, headers=auth("alice", "approver")),
        403,
        "SEGREGATION_OF_DUTIES",
    )
    assert snapshot(sql) == before


@pytest.mark.fresh_db("drops a CHECK constraint to reach the statement's own guard")
def test_the_approval_lease_skips_the_preparers_proposal_by_its_own_guard(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """With the CHECK that would refuse it dropped, the approval lease's WHERE alone keeps alice's
    own proposal from her; another approver gets it."""
    item_id, _ = submitted(client, auth)
    _drop_sod_checks(sql)
    before = snapshot(sql)
    alice = auth("alice", "approver")
    assert client.post("/leases", json={"queue": "approval"}, headers=alice).json()["items"] == []
    assert snapshot(sql) == before
    assert lease_one(client, auth("bob", "approver"), "approval")["id"] == item_id


def test_the_database_refuses_an_approval_by_the_resolver(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """The four_eyes CHECK itself: approved_by equal to resolved_by (in any letter case) is refused,
    whoever writes the row."""
    item_id, _ = submitted(client, auth)
    for approver in ("alice", "ALICE"):
        with pytest.raises(psycopg.errors.CheckViolation, match="four_eyes"):
            sql.execute(
                "UPDATE review_queue_item SET state = 'RESOLVED', resolution = proposed_resolution,"
                " resolved_by = prepared_by, resolved_at = now(), approved_by = %s, approved_at = now()"
                " WHERE id = %s",
                (approver, item_id),
            )


def test_approval_leases_count_against_the_per_person_cap(db_url: str, auth: Auth) -> None:
    """The cap counts review and approval leases together: an approver holding CAP approval leases
    gets nothing from either queue until one is handed back."""
    cap = 2
    with TestClient(create_app(make_settings(db_url, max_leases_per_reviewer=cap))) as capped:
        for _ in range(cap + 1):
            submitted(capped, auth)
        capped.post("/items", json=item_body(), headers=auth("ada", "admin"))  # a PENDING item too
        bob = auth("bob", "approver")
        held = capped.post("/leases", json={"queue": "approval", "batch_size": 5}, headers=bob).json()[
            "items"
        ]
        assert len(held) == cap, held
        assert capped.post("/leases", json={"batch_size": 5}, headers=bob).json()["items"] == []
        assert capped.post("/leases", json={"queue": "approval"}, headers=bob).json()["items"] == []
        released = capped.post(f"/items/{held[0]['id']}/release", json={}, headers=bob)
        assert released.status_code == 200, released.text
        (review,) = capped.post("/leases", json={"batch_size": 5}, headers=bob).json()["items"]
        assert review["state"] == "ASSIGNED"


def test_my_decisions_say_who_rejected_a_proposal_and_why(client: TestClient, auth: Auth) -> None:
    """Issue 42, part 3: the preparer's submission row carries the approver's rejection; the same
    item submitted again, waiting and then approved, carries none."""
    alice, bob = auth("alice", "reviewer"), auth("bob", "approver")
    item_id = rejected(client, auth)
    (first,) = client.get("/decisions", headers=alice).json()["decisions"]
    assert (first["event"]["event"], first["item"]["state"]) == ("SUBMITTED_FOR_APPROVAL", "PENDING")
    assert (first["rejection"]["by"], first["rejection"]["reason"]) == ("bob", "no"), first
    assert first["rejection"]["at"] >= first["event"]["at"]
    again = lease_one(client, alice)  # hers first: the rejection returned it to her
    assert again["id"] == item_id
    body = {"resolution": "ADJUSTMENT_POSTED", "note": "JE-8", "lease_token": again["lease_token"]}
    assert client.post(f"/items/{item_id}/complete", json=body, headers=alice).status_code == 200
    second, first = client.get("/decisions", headers=alice).json()["decisions"]
    assert second["rejection"] is None and first["rejection"]["reason"] == "no"
    token = lease_one(client, bob, "approval")["lease_token"]
    approved = client.post(f"/items/{item_id}/approve", json={"lease_token": token}, headers=bob)
    assert approved.status_code == 200, approved.text
    second, first = client.get("/decisions", headers=alice).json()["decisions"]
    assert second["rejection"] is None and second["item"]["state"] == "RESOLVED"
    assert first["rejection"]["by"] == "bob"
    # The approver's own REJECTED and APPROVED rows are their decisions, never a rejection of theirs.
    assert all(d["rejection"] is None for d in client.get("/decisions", headers=bob).json()["decisions"])
