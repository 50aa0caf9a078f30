"""The `review-queue` commands that only read and write the database, in-process
(tests/support/cli.py): tokens, reclaim, the audit chain, resolution codes and the approval policy.
tests/system/test_cli.py runs the script itself."""

import re
from datetime import timedelta

import psycopg
import pytest
from fastapi.testclient import TestClient

from db import tokens
from tests.support.cli import invoke, principal
from tests.support.postgres import libpq


def test_token_create_prints_the_token_alone_on_the_last_line(db_url: str, client: TestClient) -> None:
    result = invoke(db_url, "token", "create", "--subject", "dora", "--role", "reviewer")
    assert result.exit_code == 0, result.stderr
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("rq_") and " " not in token
    with psycopg.connect(libpq(db_url)) as conn:
        stored = conn.execute("SELECT subject, role, token_hash FROM api_token").fetchall()
    assert [(s, r) for s, r, _ in stored] == [("dora", "reviewer")]
    assert token not in stored[0][2], "only a hash may be stored"
    response = client.post("/leases", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_token_list_and_revoke(db_url: str) -> None:
    invoke(db_url, "token", "create", "--subject", "eve", "--role", "ingest")
    invoke(db_url, "token", "create", "--subject", "eve", "--role", "ingest")
    assert "revoked 2 token(s) of eve" in invoke(db_url, "token", "revoke", "--subject", "eve").stdout
    listing = invoke(db_url, "token", "list").stdout
    rows = [line.split() for line in listing.splitlines()[1:]]
    assert [(r[1], r[-3]) for r in rows] == [("eve", "revoked"), ("eve", "revoked")], listing
    assert "rq_" not in listing


def test_reclaim_once_prints_the_count(db_url: str, sql: psycopg.Connection) -> None:
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, state, leased_by, leased_at, lease_expires_at)"
        " SELECT 'k' || i, 'E', 1, 'PARTIAL', 'h', 'ASSIGNED', 'gone', now() - interval '2 hours',"
        " now() - interval '1 hour' FROM generate_series(1, 250) i"
    )
    result = invoke(db_url, "reclaim", "--once")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "reclaimed 250"


@pytest.mark.parametrize("subject", ["alice", "alice.smith@example.com", "svc-ingest_2", "x" * 128, "meg"])
def test_ordinary_subjects_are_accepted(db_url: str, subject: str) -> None:
    result = invoke(db_url, "token", "create", "--subject", subject, "--role", "reviewer")
    assert result.exit_code == 0, result.stderr
    assert principal(db_url, result.stdout.strip().splitlines()[-1]) == tokens.Principal(subject, "reviewer")


def test_token_list_has_a_header_and_shows_expiry(db_url: str, sql: psycopg.Connection) -> None:
    assert invoke(db_url, "token", "create", "--subject", "kim", "--role", "reviewer").exit_code == 0
    made = invoke(db_url, "token", "create", "--subject", "lee", "--role", "admin", "--expires-in", "12h")
    assert made.exit_code == 0, made.stderr
    assert "created an admin token for lee, expiring in 12 hours:" in made.stdout
    expiry = sql.execute("SELECT expires_at - created_at FROM api_token WHERE subject = 'lee'").fetchone()
    assert expiry == (timedelta(hours=12),)
    lines = invoke(db_url, "token", "list").stdout.splitlines()
    assert lines[0].split() == ["ID", "SUBJECT", "ROLE", "CREATED", "EXPIRES", "STATE"]
    kim, lee = (line.split() for line in lines[1:])
    assert (kim[1], kim[2], kim[5], kim[6]) == ("kim", "reviewer", "never", "active")
    assert (lee[1], lee[2], lee[-1]) == ("lee", "admin", "active")
    sql.execute("UPDATE api_token SET expires_at = now() - interval '1 second' WHERE subject = 'lee'")
    assert invoke(db_url, "token", "list").stdout.splitlines()[2].split()[-1] == "expired"


def test_an_expired_token_is_401(db_url: str, client: TestClient, sql: psycopg.Connection) -> None:
    made = invoke(db_url, "token", "create", "--subject", "lee", "--role", "reviewer", "--expires-in", "90m")
    token = made.stdout.strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {token}"}
    assert client.post("/leases", headers=headers).status_code == 200
    sql.execute("UPDATE api_token SET expires_at = now() WHERE subject = 'lee'")
    response = client.post("/leases", headers=headers)
    assert response.status_code == 401 and response.json()["code"] == "UNAUTHENTICATED", response.text


def test_revoking_nothing_is_an_error_and_revoke_by_id(db_url: str, sql: psycopg.Connection) -> None:
    nobody = invoke(db_url, "token", "revoke", "--subject", "nobody")
    assert nobody.exit_code == 1 and "no active token of nobody" in nobody.stderr, nobody
    for _ in range(2):
        invoke(db_url, "token", "create", "--subject", "max", "--role", "reviewer")
    first, second = (r[0] for r in sql.execute("SELECT id FROM api_token ORDER BY id"))
    by_id = invoke(db_url, "token", "revoke", "--id", str(first))
    assert by_id.exit_code == 0 and f"revoked 1 token(s) with id {first}" in by_id.stdout, by_id
    states = sql.execute("SELECT id, revoked_at IS NOT NULL FROM api_token ORDER BY id").fetchall()
    assert states == [(first, True), (second, False)]
    again = invoke(db_url, "token", "revoke", "--id", str(first))
    assert again.exit_code == 1 and f"no active token with id {first}" in again.stderr
    assert invoke(db_url, "token", "revoke").exit_code == 2
    assert invoke(db_url, "token", "revoke", "--id", str(second), "--subject", "max").exit_code == 2
    assert sql.execute("SELECT count(*) FROM api_token WHERE revoked_at IS NULL").fetchone() == (1,)


def test_audit_seal_head_verify_and_verify_against(db_url: str, sql: psycopg.Connection) -> None:
    from tests.support.audit import add_events

    add_events(sql, 4)
    assert invoke(db_url, "audit", "seal", "--once").stdout.strip().splitlines()[-1] == "sealed 4"
    head = invoke(db_url, "audit", "head").stdout.strip()
    assert head.startswith("4:") and len(head) == 2 + 64
    ok = invoke(db_url, "audit", "verify", "--against", head)
    assert ok.exit_code == 0, ok.stderr
    assert "verified 4 events" in ok.stdout and "events/s" in ok.stdout and "intact" in ok.stdout
    wrong = invoke(db_url, "audit", "verify", "--against", "4:" + "0" * 64)
    assert wrong.exit_code == 1
    assert "BROKEN at seq 4: rewritten" in wrong.stderr
    with sql.transaction():
        sql.execute("SET LOCAL session_replication_role = replica")
        sql.execute(
            "UPDATE review_queue_event SET actor = 'mallory'"
            " WHERE id = (SELECT event_id FROM review_queue_chain WHERE seq = 2)"
        )
    broken = invoke(db_url, "audit", "verify")
    assert broken.exit_code == 1
    assert "BROKEN at seq 2: modified" in broken.stderr
    assert invoke(db_url, "audit", "verify", "--against", "nonsense").exit_code == 2


def test_resolutions_list_set_and_deactivate(db_url: str, sql: psycopg.Connection) -> None:
    listed = invoke(db_url, "resolutions", "list")
    assert listed.exit_code == 0, listed.stderr
    assert re.search(r"ADJUSTMENT_POSTED\s+required\s+10000\.00\s+10000\.00\s+active", listed.stdout), (
        listed.stdout
    )
    created = invoke(
        db_url, "resolutions", "set", "FX_REVALUATION", "--label", "FX revaluation",
        "--requires-note", "--approval-threshold", "500.00",
    )  # fmt: skip
    assert (created.exit_code, created.stdout.strip()) == (0, "created FX_REVALUATION"), created.stderr
    updated = invoke(db_url, "resolutions", "set", "FX_REVALUATION", "--label", "FX reval")
    assert (updated.exit_code, updated.stdout.strip()) == (0, "updated FX_REVALUATION"), updated.stderr
    row = sql.execute(
        "SELECT label, requires_note, approval_threshold, active FROM resolution_code"
        " WHERE code = 'FX_REVALUATION'"
    ).fetchone()
    assert row == ("FX reval", False, None, True)
    assert invoke(db_url, "resolutions", "deactivate", "FX_REVALUATION").exit_code == 0
    assert "FX_REVALUATION" not in invoke(db_url, "resolutions", "list").stdout
    assert re.search(r"FX_REVALUATION.*inactive", invoke(db_url, "resolutions", "list", "--all").stdout)
    # Refused, with a message and exit status, and nothing changed.
    assert invoke(db_url, "resolutions", "deactivate", "NO_SUCH_CODE").exit_code == 1
    bad = invoke(db_url, "resolutions", "set", "fx", "--label", "x")
    assert bad.exit_code == 2 and "code" in bad.stderr, bad.stderr
    negative = invoke(db_url, "resolutions", "set", "FX", "--label", "x", "--approval-threshold", "-1")
    assert negative.exit_code == 2, negative.stderr
    assert sql.execute("SELECT count(*) FROM resolution_code WHERE code IN ('FX', 'fx')").fetchone() == (0,)


def test_resolutions_policy_prints_and_sets_materiality(db_url: str, sql: psycopg.Connection) -> None:
    shown = invoke(db_url, "resolutions", "policy")
    assert shown.exit_code == 0, shown.stderr
    assert "materiality threshold 10000.00" in shown.stdout
    listed = invoke(db_url, "resolutions", "list").stdout
    # APPROVED has no threshold of its own: materiality applies to it.
    assert re.search(r"^APPROVED\s+-\s+never\s+10000\.00\s+active", listed, re.M), listed
    assert re.search(r"^WRITE_OFF\s+required\s+1000\.00\s+1000\.00\s+active", listed, re.M), listed
    set_ = invoke(db_url, "resolutions", "policy", "--materiality-threshold", "250000.00", "--admin", "Ada")
    assert set_.exit_code == 0, set_.stderr
    assert "materiality threshold 250000.00" in set_.stdout and "by ada" in set_.stdout
    assert sql.execute("SELECT materiality_threshold::text, updated_by FROM approval_policy").fetchall() == [
        ("250000.00", "ada")
    ]
    for refused in (
        ("--materiality-threshold", "-1", "--admin", "ada"),
        ("--materiality-threshold", "1e5", "--admin", "ada"),
        ("--materiality-threshold", "5.00"),  # who sets it must be said
    ):
        result = invoke(db_url, "resolutions", "policy", *refused)
        assert result.exit_code == 2, (refused, result.stdout, result.stderr)
    assert sql.execute("SELECT materiality_threshold::text FROM approval_policy").fetchone() == ("250000.00",)
