"""Source revisions: POST /items/{id}/revisions against every state, the holder's SOURCE_CHANGED and
how they carry on, idempotency on source_hash, a revision racing a completion (exactly one of the
two outcomes, read from the event table), and the audit chain over the new events."""

import logging
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import httpx
import psycopg
import pytest
from fastapi.testclient import TestClient

from db import audit
from tests.support import lock_waiters, wait_for
from tests.support.api import Auth, assert_problem, item_body
from tests.support.audit import seal
from tests.support.postgres import libpq
from tests.support.servers import start_server, stop_server

NEW = {"variance_amount": "99.10", "source_hash": "sha256:rerun-2", "match_decision": "PARTIAL"}


def _trail(client: TestClient, item_id: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = client.get(f"/items/{item_id}/events", headers=headers).json()["events"]
    return events


def _leased(client: TestClient, auth: Auth) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    ingest, alice = auth("ivan", "ingest"), auth("alice", "reviewer")
    body = item_body(variance_amount="12.50", source_hash="sha256:first", match_decision="UNMATCHED")
    assert client.post("/items", json=body, headers=ingest).status_code == 201
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    return leased, ingest, alice


def _revise(client: TestClient, item_id: str, headers: dict[str, str], **body: Any) -> httpx.Response:
    response: httpx.Response = client.post(f"/items/{item_id}/revisions", json=body or NEW, headers=headers)
    return response


def test_a_pending_item_is_updated_and_the_trail_has_old_and_new_figures(
    client: TestClient, auth: Auth
) -> None:
    ingest = auth("ivan", "ingest")
    body = item_body(variance_amount="12.50", source_hash="sha256:first", match_decision="UNMATCHED")
    item = client.post("/items", json=body, headers=ingest).json()

    response = _revise(client, item["id"], ingest)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "revised"
    revised = answer["item"]
    assert {k: revised[k] for k in NEW} == NEW
    assert (revised["state"], revised["created_at"], revised["attempts"]) == (
        "PENDING",
        item["created_at"],
        0,
    )

    trail = _trail(client, item["id"], ingest)
    assert [e["event"] for e in trail] == ["ENQUEUED", "REVISED"]
    assert trail[-1]["actor"] == "ivan" and trail[-1]["lease_epoch"] == 0
    assert trail[-1]["details"] == {
        "previous": {
            "variance_amount": "12.50",
            "currency": "USD",
            "match_decision": "UNMATCHED",
            "source_hash": "sha256:first",
        },
        "current": {**NEW, "currency": "USD"},
        "previous_state": "PENDING",
        "holder": None,
    }


def test_match_decision_is_kept_when_omitted(client: TestClient, auth: Auth) -> None:
    ingest = auth("ivan", "ingest")
    item = client.post("/items", json=item_body(match_decision="MATCHED"), headers=ingest).json()
    answer = _revise(client, item["id"], ingest, variance_amount=1, source_hash="h2").json()
    assert (answer["item"]["match_decision"], answer["item"]["variance_amount"]) == ("MATCHED", "1.00")


def test_idempotent_on_source_hash(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    ingest = auth("ivan", "ingest")
    body = item_body(variance_amount="12.50", source_hash="sha256:first")
    item_id = client.post("/items", json=body, headers=ingest).json()["id"]
    assert _revise(client, item_id, ingest).json()["outcome"] == "revised"
    events = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()

    # The same revision again (a retry): nothing changes.
    again = _revise(client, item_id, ingest)
    assert again.status_code == 200 and again.json()["outcome"] == "unchanged", again.text
    # The current hash with other figures: a conflict, as for an enqueue.
    conflict = _revise(client, item_id, ingest, **{**NEW, "variance_amount": "1.00"})
    assert assert_problem(conflict, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == item_id
    # A hash the item had before (a late retry of an older revision): it has moved on.
    late = _revise(client, item_id, ingest, variance_amount="12.50", source_hash="sha256:first")
    assert late.status_code == 200 and late.json()["outcome"] == "superseded", late.text
    assert late.json()["item"]["source_hash"] == NEW["source_hash"]
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == events

    # A new hash moves on again.
    newer = _revise(client, item_id, ingest, variance_amount="5.00", source_hash="sha256:third")
    assert newer.json()["outcome"] == "revised"


def test_assigned_item_stays_with_its_holder_and_the_old_token_is_source_changed(
    client: TestClient, auth: Auth
) -> None:
    leased, ingest, alice = _leased(client, auth)
    item_id, old_token = leased["id"], leased["lease_token"]

    revised = _revise(client, item_id, ingest).json()["item"]
    assert (revised["state"], revised["leased_by"], revised["lease_token"]) == ("ASSIGNED", "alice", None)
    assert revised["lease_expires_at"] == leased["lease_expires_at"]  # same lease time, new epoch
    trail = _trail(client, item_id, alice)
    assert [e["event"] for e in trail] == ["ENQUEUED", "LEASED", "REVISED"]
    assert trail[-1]["lease_epoch"] == trail[-2]["lease_epoch"] + 1
    assert trail[-1]["details"]["holder"] == "alice"

    # Every call with the old token is refused with the current figures and a new token.
    for action, body in (
        ("complete", {"resolution": "APPROVED", "lease_token": old_token}),
        ("renew", {"lease_token": old_token}),
        ("release", {"lease_token": old_token}),
    ):
        problem = assert_problem(
            client.post(f"/items/{item_id}/{action}", json=body, headers=alice), 409, "SOURCE_CHANGED"
        )
        current = problem["item"]
        assert {k: current[k] for k in NEW} == NEW, problem
        assert current["lease_token"] not in (None, old_token)
        assert "99.10" in problem["detail"]
    # Another reviewer is told it is not theirs, and sees no token.
    bob = auth("bob", "reviewer")
    refused = client.post(f"/items/{item_id}/complete", json={"resolution": "APPROVED"}, headers=bob)
    assert "item" not in assert_problem(refused, 409, "LEASE_NOT_HELD")
    assert [e["event"] for e in _trail(client, item_id, alice)][-1] == "REVISED"  # nothing was written

    # The holder carries on with the new token (or re-reads the item: the same token).
    assert client.get(f"/items/{item_id}", headers=alice).json()["lease_token"] == current["lease_token"]
    done = client.post(
        f"/items/{item_id}/complete",
        json={"resolution": "APPROVED", "lease_token": current["lease_token"]},
        headers=alice,
    )
    assert done.status_code == 200 and done.json()["outcome"] == "resolved", done.text
    assert done.json()["item"]["variance_amount"] == "99.10"


def test_tokenless_completion_must_carry_the_current_source_hash_after_a_revision(
    client: TestClient, auth: Auth
) -> None:
    leased, ingest, alice = _leased(client, auth)
    item_id = leased["id"]
    # Before any revision: tokenless works with no hash; a wrong hash is refused all the same.
    wrong = {"resolution": "APPROVED", "source_hash": "sha256:never"}
    assert_problem(
        client.post(f"/items/{item_id}/complete", json=wrong, headers=alice), 409, "SOURCE_CHANGED"
    )

    _revise(client, item_id, ingest)
    # Renew without a token only extends the lease (it decides nothing).
    assert client.post(f"/items/{item_id}/renew", json={}, headers=alice).status_code == 200
    for body in ({"resolution": "APPROVED"}, {"resolution": "APPROVED", "source_hash": "sha256:first"}):
        problem = assert_problem(
            client.post(f"/items/{item_id}/complete", json=body, headers=alice), 409, "SOURCE_CHANGED"
        )
        assert problem["item"]["source_hash"] == NEW["source_hash"]
    ok = {"resolution": "APPROVED", "source_hash": NEW["source_hash"]}
    done = client.post(f"/items/{item_id}/complete", json=ok, headers=alice)
    assert done.status_code == 200 and done.json()["outcome"] == "resolved", done.text
    # A retry of it is still the idempotent answer.
    assert client.post(f"/items/{item_id}/complete", json=ok, headers=alice).json()["outcome"] == (
        "already_resolved"
    )


def test_a_new_lease_after_a_revision_needs_nothing_special(client: TestClient, auth: Auth) -> None:
    leased, ingest, alice = _leased(client, auth)
    _revise(client, leased["id"], ingest)
    client.post(f"/items/{leased['id']}/release", json={}, headers=alice)  # tokenless: the holder's
    (again,) = client.post("/leases", json={"item_id": leased["id"]}, headers=alice).json()["items"]
    assert again["id"] == leased["id"] and again["variance_amount"] == "99.10"
    done = client.post(f"/items/{again['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
    assert done.status_code == 200, done.text


def test_a_resolved_item_is_reopened_first_in_line_and_its_decision_decertified(
    client: TestClient, auth: Auth
) -> None:
    leased, ingest, alice = _leased(client, auth)
    item_id = leased["id"]
    body = {"resolution": "WRITE_OFF", "note": "below tolerance", "lease_token": leased["lease_token"]}
    resolved = client.post(f"/items/{item_id}/complete", json=body, headers=alice).json()["item"]
    newer = client.post("/items", json=item_body(), headers=ingest).json()

    reopened = _revise(client, item_id, ingest).json()["item"]
    assert (reopened["state"], reopened["resolution"], reopened["resolved_by"], reopened["leased_by"]) == (
        "PENDING", None, None, None,
    )  # fmt: skip
    assert reopened["attempts"] == 0
    trail = _trail(client, item_id, alice)
    assert [e["event"] for e in trail] == ["ENQUEUED", "LEASED", "RESOLVED", "REVISED", "REOPENED"]
    assert trail[-2]["details"]["previous_state"] == "RESOLVED"
    assert trail[-1]["actor"] == "ivan"
    assert trail[-1]["details"] == {
        "reason": "source revised",
        "decertified": True,
        "previous_resolution": "WRITE_OFF",
        "previous_note": "below tolerance",
        "previous_resolved_by": "alice",
        "previous_resolved_at": trail[-1]["details"]["previous_resolved_at"],
        "previous_approved_by": None,  # the approval, if any, is decertified with the decision
    }
    assert trail[-1]["details"]["previous_resolved_at"] is not None
    assert resolved["resolved_at"] is not None

    # First in line: before the newer item.
    (next_up,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    assert next_up["id"] == item_id != newer["id"]
    assert next_up["variance_amount"] == "99.10"


def test_a_quarantined_item_is_updated_and_stays_quarantined(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    ingest = auth("ivan", "ingest")
    item_id = client.post("/items", json=item_body(), headers=ingest).json()["id"]
    sql.execute("UPDATE review_queue_item SET state = 'QUARANTINED', attempts = 10 WHERE id = %s", (item_id,))
    revised = _revise(client, item_id, ingest).json()["item"]
    assert (revised["state"], revised["attempts"], revised["source_hash"]) == (
        "QUARANTINED", 10, NEW["source_hash"],
    )  # fmt: skip
    assert [e["event"] for e in _trail(client, item_id, ingest)] == ["ENQUEUED", "REVISED"]


def test_who_may_revise_and_what_is_refused(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    ingest = auth("ivan", "ingest")
    item_id = client.post("/items", json=item_body(), headers=ingest).json()["id"]
    for role in ("reviewer", "auditor"):
        assert_problem(_revise(client, item_id, auth(f"x-{role}", role)), 403, "FORBIDDEN")
    assert_problem(_revise(client, "00000000-0000-4000-8000-000000000000", ingest), 404, "NOT_FOUND")
    assert _revise(client, item_id, auth("ada", "admin")).status_code == 200
    before = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall()
    for bad in (
        {"source_hash": "h"},
        {"variance_amount": "1.005", "source_hash": "h"},
        {"variance_amount": "1", "source_hash": ""},
        {"variance_amount": "1", "source_hash": "h", "match_decision": "MAYBE"},
        {"variance_amount": "1", "source_hash": "h", "state": "PENDING"},
    ):
        assert_problem(_revise(client, item_id, ingest, **bad), 422, "VALIDATION_ERROR")
    assert sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall() == before


def test_the_audit_chain_verifies_with_revision_events(client: TestClient, auth: Auth, db_url: str) -> None:
    leased, ingest, alice = _leased(client, auth)
    _revise(client, leased["id"], ingest)
    current = client.get(f"/items/{leased['id']}", headers=alice).json()
    client.post(
        f"/items/{leased['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": current["lease_token"]},
        headers=alice,
    )
    _revise(client, leased["id"], ingest, variance_amount="3.00", source_hash="sha256:third")
    seal(db_url)
    with psycopg.connect(libpq(db_url)) as conn:
        result = audit.verify(conn)
    assert result.broken is None, result
    # ENQUEUED LEASED REVISED RESOLVED REVISED REOPENED
    assert result.head_seq == 6


# --- a revision racing a completion ---------------------------------------------------------

RACES = 6


@pytest.fixture
def patient_server(db_url: str) -> Iterator[str]:
    """A server whose requests wait for a row lock as long as the test holds it (the default
    lock_timeout, 500 ms, would turn a waiter into a 503 on a loaded machine)."""
    process, base = start_server(
        {
            "DATABASE_URL": db_url,
            "REVIEW_QUEUE_PG_LOCK_TIMEOUT_MS": "60000",
            "REVIEW_QUEUE_STATEMENT_TIMEOUT_MS": "120000",
        }
    )
    yield base
    stop_server(process)


def test_a_revision_racing_a_completion_has_exactly_one_outcome(
    patient_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection, superuser_url: str
) -> None:
    """Both requests are held behind a row lock a third connection takes, then let go together, on
    their own connections through the live server. Either the completion won (RESOLVED, then REVISED
    and a decertifying REOPENED) or the revision did (REVISED; the completion refused with
    SOURCE_CHANGED and no RESOLVED event): never both, never neither. Which one queues first at the
    lock alternates, so both outcomes are seen."""
    ingest = {"Authorization": f"Bearer {make_token('ivan', 'ingest')}"}
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    outcomes: list[str] = []
    with httpx.Client(base_url=patient_server, timeout=60) as http:
        for n in range(RACES):
            # Only this round's item is PENDING (earlier ones are set aside), so it is the one leased.
            sql.execute("UPDATE review_queue_item SET state = 'QUARANTINED' WHERE state = 'PENDING'")
            item_id = http.post("/items", json=item_body(), headers=ingest).json()["id"]
            (leased,) = http.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
            assert leased["id"] == item_id
            calls = {
                "complete": (
                    f"/items/{item_id}/complete",
                    {"resolution": "APPROVED", "lease_token": leased["lease_token"]},
                    alice,
                ),
                "revise": (
                    f"/items/{item_id}/revisions",
                    {"variance_amount": "7.77", "source_hash": f"sha256:race-{n}"},
                    ingest,
                ),
            }
            answers: dict[str, httpx.Response] = {}

            def call(name: str, calls: dict[str, Any] = calls, answers: dict[str, Any] = answers) -> None:
                path, payload, headers = calls[name]
                with httpx.Client(base_url=patient_server, timeout=60) as own:
                    answers[name] = own.post(path, json=payload, headers=headers)

            order = ("complete", "revise") if n % 2 == 0 else ("revise", "complete")
            threads = [threading.Thread(target=call, args=(name,)) for name in order]
            with psycopg.connect(libpq(superuser_url)) as blocker:
                blocker.execute("SELECT 1 FROM review_queue_item WHERE id = %s FOR UPDATE", (item_id,))
                for waiting, thread in enumerate(threads, start=1):
                    thread.start()
                    wait_for(lambda w=waiting: lock_waiters(sql) >= w, timeout=30)
                blocker.rollback()  # both go now
            for thread in threads:
                thread.join(timeout=60)
            completed, revised = answers["complete"], answers["revise"]
            assert revised.status_code == 200 and revised.json()["outcome"] == "revised", revised.text
            trail = sql.execute(
                "SELECT event, details FROM review_queue_event WHERE item_id = %s ORDER BY id", (item_id,)
            ).fetchall()
            events = [e for e, _ in trail]
            row = sql.execute(
                "SELECT state, variance_amount, resolution FROM review_queue_item WHERE id = %s", (item_id,)
            ).fetchone()
            if completed.status_code == 200:
                outcomes.append("completion first")
                assert events == ["ENQUEUED", "LEASED", "RESOLVED", "REVISED", "REOPENED"], trail
                assert trail[-1][1]["previous_resolution"] == "APPROVED" and trail[-1][1]["decertified"]
                assert row == ("PENDING", Decimal("7.77"), None)
            else:
                outcomes.append("revision first")
                assert_problem(completed, 409, "SOURCE_CHANGED")
                assert events == ["ENQUEUED", "LEASED", "REVISED"], trail
                assert row == ("ASSIGNED", Decimal("7.77"), None)
    assert set(outcomes) == {"completion first", "revision first"}, outcomes


def test_the_log_line_has_the_seeds_fields_and_only_follows_a_commit(
    client: TestClient, auth: Auth, caplog: pytest.LogCaptureFixture
) -> None:
    ingest = auth("ivan", "ingest")
    item = client.post("/items", json=item_body(source_hash="sha256:first"), headers=ingest).json()
    caplog.set_level(logging.INFO, logger="reconciliation.review_queue.lease")
    _revise(client, item["id"], ingest)
    (line,) = [r for r in caplog.records if r.getMessage() == "review_item_revised"]
    fields = {
        k: getattr(line, k) for k in ("trace_id", "source_hash", "match_decision", "item_id", "worker_id")
    }
    assert fields == {
        "trace_id": item["trace_id"],
        "source_hash": NEW["source_hash"],
        "match_decision": NEW["match_decision"],
        "item_id": item["id"],
        "worker_id": "ivan",
    }
    assert (line.previous_source_hash, line.previous_variance_amount, line.variance_amount) == (
        "sha256:first", "12.50", "99.10",
    )  # fmt: skip
    caplog.clear()
    # Refused (a conflict) or a retry: nothing changed, nothing is said.
    _revise(client, item["id"], ingest, **{**NEW, "variance_amount": "1.00"})
    _revise(client, item["id"], ingest)
    assert not [r for r in caplog.records if r.getMessage() == "review_item_revised"]
