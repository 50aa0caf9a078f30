"""Issue 23, point 3: materiality. A catalogue-wide approval threshold (10,000.00 as seeded, admin
only) applies to every code without a lower threshold of its own, decided inside the completion
statement like a code's own threshold."""

from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, item_body


def _complete(
    client: TestClient, auth: Auth, amount: str, code: str, note: str | None = None
) -> dict[str, Any]:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    item_id = client.post("/items", json=item_body(variance_amount=amount), headers=admin).json()["id"]
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert leased["id"] == item_id
    body = {"resolution": code, "lease_token": leased["lease_token"], **({"note": note} if note else {})}
    done = client.post(f"/items/{item_id}/complete", json=body, headers=alice)
    assert done.status_code == 200, done.text
    answer: dict[str, Any] = done.json()
    return answer


def _last_event(sql: psycopg.Connection, item_id: str) -> tuple[str, dict[str, Any]]:
    row = sql.execute(
        "SELECT event, details FROM review_queue_event WHERE item_id = %s ORDER BY id DESC LIMIT 1",
        (item_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.parametrize("code", ["APPROVED", "MATCH_CONFIRMED", "TIMING_DIFFERENCE"])
@pytest.mark.parametrize("amount", ["150000.00", "-150000.00", "10000.00"])
def test_a_code_without_a_threshold_needs_an_approver_at_materiality(
    client: TestClient, auth: Auth, sql: psycopg.Connection, code: str, amount: str
) -> None:
    answer = _complete(client, auth, amount, code)
    assert answer["outcome"] == "submitted_for_approval", answer
    assert (answer["item"]["state"], answer["item"]["prepared_by"]) == ("AWAITING_APPROVAL", "alice")
    event, details = _last_event(sql, answer["item"]["id"])
    assert (event, details["approval_threshold"], details["resolution"]) == (
        "SUBMITTED_FOR_APPROVAL",
        10000.00,
        code,
    )


def test_below_materiality_and_below_a_codes_own_threshold(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    assert _complete(client, auth, "9999.99", "APPROVED")["outcome"] == "resolved"
    # A code's own lower threshold still applies, and the event names the one that applied.
    answer = _complete(client, auth, "5000.00", "WRITE_OFF", note="small")
    assert answer["outcome"] == "submitted_for_approval"
    assert _last_event(sql, answer["item"]["id"])[1]["approval_threshold"] == 1000.00


def test_an_admin_reads_and_sets_materiality_and_it_applies_at_once(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    admin = auth("ada", "admin")
    for role in ("reviewer", "approver", "ingest", "auditor", "admin"):
        policy = client.get("/resolutions/policy", headers=auth(f"u-{role}", role))
        assert policy.status_code == 200, policy.text
    assert policy.json()["materiality_threshold"] == "10000.00" and policy.json()["updated_by"] is None
    codes = {c["code"]: c for c in client.get("/resolutions", headers=admin).json()["resolutions"]}
    assert codes["APPROVED"]["effective_approval_threshold"] == "10000.00"
    assert codes["WRITE_OFF"]["effective_approval_threshold"] == "1000.00"

    changed = client.put("/resolutions/policy", json={"materiality_threshold": "200000"}, headers=admin)
    assert changed.status_code == 200, changed.text
    assert (changed.json()["materiality_threshold"], changed.json()["updated_by"]) == ("200000.00", "ada")
    assert client.get("/resolutions/policy", headers=admin).json() == changed.json()
    assert _complete(client, auth, "150000.00", "APPROVED")["outcome"] == "resolved"
    # Lower than a code's own threshold, materiality applies to that code too.
    client.put("/resolutions/policy", json={"materiality_threshold": "500.00"}, headers=admin)
    codes = {c["code"]: c for c in client.get("/resolutions", headers=admin).json()["resolutions"]}
    assert codes["ADJUSTMENT_POSTED"]["effective_approval_threshold"] == "500.00"
    assert _complete(client, auth, "600.00", "MATCH_CONFIRMED")["outcome"] == "submitted_for_approval"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"materiality_threshold": None},
        {"materiality_threshold": "-1.00"},
        {"materiality_threshold": "1.001"},
        {"materiality_threshold": "1e3"},
        {"materiality_threshold": "10000.00", "updated_by": "mallory"},
    ],
)
def test_a_bad_policy_is_a_422_that_changes_nothing(
    client: TestClient, auth: Auth, sql: psycopg.Connection, body: dict[str, Any]
) -> None:
    before = sql.execute("SELECT * FROM approval_policy").fetchall()
    assert_problem(
        client.put("/resolutions/policy", json=body, headers=auth("ada", "admin")), 422, "VALIDATION_ERROR"
    )
    assert sql.execute("SELECT * FROM approval_policy").fetchall() == before


def test_the_service_role_cannot_add_or_delete_the_policy_row(db_url: str) -> None:
    from tests.support.postgres import libpq

    with psycopg.connect(libpq(db_url), autocommit=True) as service:
        for statement in (
            "INSERT INTO approval_policy (id, materiality_threshold) VALUES (false, 1)",
            "DELETE FROM approval_policy",
            "TRUNCATE approval_policy",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                service.execute(statement)


def test_a_policy_change_is_wholly_before_or_after_a_completion(
    client: TestClient, auth: Auth, superuser_url: str
) -> None:
    """The completion statement reads materiality itself: a change not yet committed is not seen
    (and not waited for), and the next statement after its commit sees all of it."""
    from tests.support.postgres import libpq

    with psycopg.connect(libpq(superuser_url)) as admin_tx:
        admin_tx.execute("UPDATE approval_policy SET materiality_threshold = 200000")
        assert _complete(client, auth, "150000.00", "APPROVED")["outcome"] == "submitted_for_approval"
        admin_tx.commit()
    assert _complete(client, auth, "150000.00", "APPROVED")["outcome"] == "resolved"


@pytest.mark.parametrize(("amount", "currency"), [("9000", "JPY"), ("9000.000", "KWD"), ("0.01", "EUR")])
def test_an_item_in_another_currency_always_needs_an_approver(
    client: TestClient, auth: Auth, amount: str, currency: str
) -> None:
    # The thresholds are base-currency amounts and the completion does not convert yet: 9,000 JPY
    # and 9,000 KWD must not both pass under 10,000.00 USD as if they were dollars (fail safe).
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    body = item_body(variance_amount=amount, currency=currency)
    item_id = client.post("/items", json=body, headers=admin).json()["id"]
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "APPROVED", "lease_token": leased["lease_token"]},
        headers=alice,
    ).json()
    assert (done["outcome"], done["item"]["state"]) == ("submitted_for_approval", "AWAITING_APPROVAL"), done


def test_an_item_in_the_base_currency_below_the_threshold_resolves(client: TestClient, auth: Auth) -> None:
    assert _complete(client, auth, "9000.00", "APPROVED")["outcome"] == "resolved"
