"""Issue 23, point 2: an identity is one person whatever its letter case. `caseyX` (a reviewer) and
`CaseyX` (an approver) are the same identity, so they cannot split a four-eyes decision, whether
their tokens come from the CLI or from the database function; the database refuses a second
spelling, and its segregation-of-duties CHECKs and guards compare folded values."""

import asyncio
import os
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from db import tokens
from db.engine import create_engine
from tests.support.api import assert_problem, item_body
from tests.support.postgres import libpq

Headers = dict[str, str]


def _cli_token(db_url: str, subject: str, role: str) -> str:
    result = subprocess.run(
        ["review-queue", "token", "create", "--subject", subject, "--role", role],
        env={**os.environ, "DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def _function_token(db_url: str, subject: str, role: str) -> str:
    async def run() -> str:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with engine.begin() as conn:
                return await tokens.create_token(conn, subject=subject, role=role)
        finally:
            await engine.dispose()

    return asyncio.run(run())


MAKERS: dict[str, Callable[[str, str, str], str]] = {"cli": _cli_token, "function": _function_token}


def _bearer(token: str) -> Headers:
    return {"Authorization": f"Bearer {token}"}


def _propose(client: TestClient, admin: Headers, preparer: Headers) -> dict[str, Any]:
    """25,000.00 proposed as ADJUSTMENT_POSTED (threshold 10,000.00) by `preparer`."""
    created = client.post("/items", json=item_body(variance_amount="25000.00"), headers=admin).json()
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=preparer).json()["items"]
    assert leased["id"] == created["id"]
    done = client.post(
        f"/items/{leased['id']}/complete",
        json={"resolution": "ADJUSTMENT_POSTED", "note": "JE-1", "lease_token": leased["lease_token"]},
        headers=preparer,
    )
    assert done.json()["outcome"] == "submitted_for_approval", done.text
    item: dict[str, Any] = done.json()["item"]
    return item


@pytest.mark.parametrize("made_by", sorted(MAKERS))
def test_caseyx_and_caseyX_cannot_split_a_four_eyes_decision(
    made_by: str, db_url: str, client: TestClient, sql: psycopg.Connection
) -> None:
    make = MAKERS[made_by]
    reviewer = _bearer(make(db_url, "caseyX", "reviewer"))
    approver = _bearer(make(db_url, "CaseyX", "approver"))
    admin = _bearer(make(db_url, "ada", "admin"))
    # One identity, stored once, folded.
    assert sql.execute("SELECT DISTINCT subject FROM api_token WHERE subject <> 'ada'").fetchall() == [
        ("caseyx",)
    ]
    assert client.get("/session", headers=approver).json()["subject"] == "caseyx"

    proposal = _propose(client, admin, reviewer)
    assert proposal["prepared_by"] == "caseyx"
    before = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall()
    # The approval queue does not hand CaseyX caseyX's proposal, and approve and reject refuse it.
    assert client.post("/leases", json={"queue": "approval"}, headers=approver).json()["items"] == []
    for action, body in (("approve", {}), ("reject", {"reason": "mine"})):
        problem = assert_problem(
            client.post(f"/items/{proposal['id']}/{action}", json=body, headers=approver),
            403,
            "SEGREGATION_OF_DUTIES",
        )
        assert problem["prepared_by"] == "caseyx"
    assert sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall() == before

    # Nor can an admin hand CaseyX the approval lease.
    dana = _bearer(make(db_url, "dana", "approver"))
    (leased,) = client.post("/leases", json={"queue": "approval"}, headers=dana).json()["items"]
    moved = client.post(
        f"/admin/items/{leased['id']}/reassign", json={"reviewer": "CASEYX", "reason": "cover"}, headers=admin
    )
    assert_problem(moved, 403, "SEGREGATION_OF_DUTIES")
    # Another person approves it.
    approved = client.post(f"/items/{proposal['id']}/approve", headers=dana).json()["item"]
    assert (approved["state"], approved["resolved_by"], approved["approved_by"]) == (
        "RESOLVED",
        "caseyx",
        "dana",
    )


def test_names_typed_in_any_case_find_the_identity(
    db_url: str, client: TestClient, sql: psycopg.Connection
) -> None:
    admin = _bearer(_function_token(db_url, "Ada", "admin"))
    alice = _bearer(_function_token(db_url, "Alice", "reviewer"))
    _function_token(db_url, "BOB", "reviewer")
    client.post("/items", json=item_body(), headers=admin)
    client.post("/items", json=item_body(), headers=admin)
    first, second = client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]
    assert first["leased_by"] == "alice"
    listed = client.get("/items", params={"leased_by": "ALICE"}, headers=admin).json()["items"]
    assert {i["id"] for i in listed} == {first["id"], second["id"]}
    moved = client.post(
        f"/admin/items/{first['id']}/reassign", json={"reviewer": "Bob", "reason": "cover"}, headers=admin
    )
    assert moved.status_code == 200 and moved.json()["leased_by"] == "bob", moved.text
    released = client.post("/admin/reviewers/aLiCe/release", json={"reason": "leave"}, headers=admin)
    assert released.json()["released"] == 1, released.text
    actors = {row[0] for row in sql.execute("SELECT DISTINCT actor FROM review_queue_event").fetchall()}
    assert actors == {"ada", "alice"}, actors


def test_the_database_refuses_a_second_spelling_and_compares_folded(
    db_url: str, client: TestClient, sql: psycopg.Connection
) -> None:
    # Only the folded spelling can be stored, by the service or anyone else.
    with (
        psycopg.connect(libpq(db_url), autocommit=True) as service,
        pytest.raises(psycopg.errors.CheckViolation, match="ck_api_token_valid_subject"),
    ):
        service.execute(
            "INSERT INTO api_token (subject, role, token_hash) VALUES ('CaseyX', 'approver', 'h-1')"
        )
    admin = _bearer(_function_token(db_url, "ada", "admin"))
    proposal = _propose(client, admin, _bearer(_function_token(db_url, "caseyx", "reviewer")))
    # The SoD CHECKs compare folded values: neither the approval lease nor an approval can go to
    # the preparer under another spelling, even written by hand.
    with pytest.raises(psycopg.errors.CheckViolation, match="approval_lease_not_preparer"):
        sql.execute(
            "UPDATE review_queue_item SET leased_by = 'CaseyX', lease_expires_at = now() WHERE id = %s",
            (proposal["id"],),
        )
    with pytest.raises(psycopg.errors.CheckViolation, match="four_eyes"):
        sql.execute(
            "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'ADJUSTMENT_POSTED',"
            " resolved_by = prepared_by, resolved_at = now(), approved_by = 'CaseyX', approved_at = now()"
            " WHERE id = %s",
            (proposal["id"],),
        )


@pytest.mark.fresh_db("drops a CHECK constraint to reach the statement's own guard")
@pytest.mark.parametrize("action", ["approve", "reject"])
def test_the_statements_guard_compares_folded_preparers(
    action: str, db_url: str, client: TestClient, sql: psycopg.Connection
) -> None:
    """With both SoD CHECKs dropped and a preparer spelled `CaseyX` on the row (written by hand), the
    UPDATE's own guard still refuses caseyx: it is what stops it, not a CHECK's error."""
    admin = _bearer(_function_token(db_url, "ada", "admin"))
    proposal = _propose(client, admin, _bearer(_function_token(db_url, "caseyx", "reviewer")))
    for name in ("approval_lease_not_preparer", "four_eyes"):
        sql.execute(f"ALTER TABLE review_queue_item DROP CONSTRAINT ck_review_queue_item_{name}")
    sql.execute(
        "UPDATE review_queue_item SET prepared_by = 'CaseyX', leased_by = 'caseyx', leased_at = now(),"
        " lease_expires_at = now() + interval '1 hour', lease_nonce = gen_random_uuid() WHERE id = %s",
        (proposal["id"],),
    )
    caseyx = _bearer(_function_token(db_url, "caseyx", "approver"))
    before = sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall()
    body = {"reason": "mine"} if action == "reject" else {}
    assert_problem(
        client.post(f"/items/{proposal['id']}/{action}", json=body, headers=caseyx),
        403,
        "SEGREGATION_OF_DUTIES",
    )
    assert sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i").fetchall() == before
