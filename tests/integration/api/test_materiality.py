"""Issue 23, point 3: materiality. A catalogue-wide approval threshold (10,000.00 as seeded, admin
only) applies to every code without a lower threshold of its own, decided inside the completion
statement like a code's own threshold."""

from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from tests.support.api import Auth, assert_problem, item_body


def _complete(
    client: TestClient, auth: Auth, amount: str, code: str, note: str | None = None, currency: str = "USD"
) -> dict[str, Any]:
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    body = item_body(variance_amount=amount, currency=currency)
    item_id = client.post("/items", json=body, headers=admin).json()["id"]
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


def _set_rate(client: TestClient, auth: Auth, currency: str, rate: str) -> None:
    response = client.put(f"/fx-rates/{currency}", json={"rate": rate}, headers=auth("ada", "admin"))
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("amount", "currency"), [("9000", "JPY"), ("9000.000", "KWD"), ("0.01", "EUR")])
def test_an_item_in_a_currency_without_a_rate_always_needs_an_approver(
    client: TestClient, auth: Auth, sql: psycopg.Connection, amount: str, currency: str
) -> None:
    # No rate, no base amount: 9,000 JPY and 9,000 KWD must not pass under 10,000.00 USD as if they
    # were dollars (fail safe). A rate of another currency does not count.
    _set_rate(client, auth, "GBP", "1.27")
    answer = _complete(client, auth, amount, "APPROVED", currency=currency)
    assert (answer["outcome"], answer["item"]["state"]) == ("submitted_for_approval", "AWAITING_APPROVAL")


@pytest.mark.parametrize(
    ("amount", "outcome"),
    [
        # 10,000.00 / 1.0850 = 9,216.5898...: no cent lands on the boundary itself.
        ("9216.58", "resolved"),  # 9,999.98930 USD
        ("-9216.58", "resolved"),
        ("9216.59", "submitted_for_approval"),  # 10,000.00015 USD: exact, not rounded to 10,000.00
        ("-9216.59", "submitted_for_approval"),
        ("150000.00", "submitted_for_approval"),
    ],
)
def test_the_threshold_applies_to_the_amount_converted_at_the_latest_rate(
    client: TestClient, auth: Auth, amount: str, outcome: str
) -> None:
    _set_rate(client, auth, "EUR", "1.2000")
    _set_rate(client, auth, "EUR", "1.0850")  # the latest one applies, not the first
    assert _complete(client, auth, amount, "APPROVED", currency="EUR")["outcome"] == outcome


@pytest.mark.parametrize(
    ("amount", "outcome"),
    [("7999.99", "resolved"), ("8000.00", "submitted_for_approval"), ("8000.01", "submitted_for_approval")],
)
def test_an_amount_converting_exactly_to_the_threshold_needs_an_approver(
    client: TestClient, auth: Auth, amount: str, outcome: str
) -> None:
    _set_rate(client, auth, "EUR", "1.25")  # 8,000.00 EUR = 10,000.00 USD exactly
    assert _complete(client, auth, amount, "APPROVED", currency="EUR")["outcome"] == outcome


def test_a_currency_with_three_decimals_and_a_codes_own_threshold(client: TestClient, auth: Auth) -> None:
    _set_rate(client, auth, "KWD", "3.25")
    assert _complete(client, auth, "3076.923", "APPROVED", currency="KWD")["outcome"] == "resolved"
    assert _complete(client, auth, "3076.924", "APPROVED", currency="KWD")["outcome"] == (
        "submitted_for_approval"
    )
    # WRITE_OFF's own 1,000.00: 307.692 KWD is 999.999 USD, 307.693 KWD is 1,000.00225 USD.
    assert _complete(client, auth, "307.692", "WRITE_OFF", note="n", currency="KWD")["outcome"] == "resolved"
    assert _complete(client, auth, "307.693", "WRITE_OFF", note="n", currency="KWD")["outcome"] == (
        "submitted_for_approval"
    )


def test_a_rate_set_between_two_completions_changes_only_the_later(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    _set_rate(client, auth, "EUR", "1.0850")
    earlier = _complete(client, auth, "9000.00", "APPROVED", currency="EUR")  # 9,765.00 USD
    assert earlier["outcome"] == "resolved"
    _set_rate(client, auth, "EUR", "1.2000")
    later = _complete(client, auth, "9000.00", "APPROVED", currency="EUR")  # 10,800.00 USD
    assert later["outcome"] == "submitted_for_approval"
    state = sql.execute(
        "SELECT state FROM review_queue_item WHERE id = %s", (earlier["item"]["id"],)
    ).fetchone()
    assert state == ("RESOLVED",)


def test_an_item_in_the_base_currency_below_the_threshold_resolves(client: TestClient, auth: Auth) -> None:
    assert _complete(client, auth, "9000.00", "APPROVED")["outcome"] == "resolved"


def _conversion(sql: psycopg.Connection, item_id: str) -> tuple[str, str | None, str | None]:
    # Read as text: the exact decimals recorded, not a float's.
    row = sql.execute(
        "SELECT event, details->>'rate', details->>'base_amount' FROM review_queue_event"
        " WHERE item_id = %s ORDER BY id DESC LIMIT 1",
        (item_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def test_the_event_records_the_rate_and_the_base_amount_that_decided(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    _set_rate(client, auth, "EUR", "1.0850")
    resolved = _complete(client, auth, "-9216.58", "APPROVED", currency="EUR")["item"]["id"]
    assert _conversion(sql, resolved) == ("RESOLVED", "1.0850", "-9999.989300")
    submitted = _complete(client, auth, "9216.59", "APPROVED", currency="EUR")["item"]["id"]
    assert _conversion(sql, submitted) == ("SUBMITTED_FOR_APPROVAL", "1.0850", "10000.000150")
    assert _conversion(sql, _complete(client, auth, "12.50", "APPROVED")["item"]["id"]) == (
        "RESOLVED", "1", "12.50"
    )  # fmt: skip
    # No rate: no base amount, and an approver whatever the amount. The keys are there, null.
    no_rate = _complete(client, auth, "1500", "APPROVED", currency="JPY")["item"]["id"]
    assert _conversion(sql, no_rate) == ("SUBMITTED_FOR_APPROVAL", None, None)
    (details,) = sql.execute(
        "SELECT details FROM review_queue_event WHERE item_id = %s ORDER BY id DESC LIMIT 1", (no_rate,)
    ).fetchone()
    assert {"rate", "base_amount"} <= details.keys() and details["rate"] is None


def test_an_earlier_completions_event_keeps_the_rate_it_used(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    _set_rate(client, auth, "EUR", "1.0850")
    earlier = _complete(client, auth, "9000.00", "APPROVED", currency="EUR")["item"]["id"]
    _set_rate(client, auth, "EUR", "1.2000")
    later = _complete(client, auth, "9000.00", "APPROVED", currency="EUR")["item"]["id"]
    assert _conversion(sql, earlier) == ("RESOLVED", "1.0850", "9765.000000")
    assert _conversion(sql, later) == ("SUBMITTED_FOR_APPROVAL", "1.2000", "10800.000000")
