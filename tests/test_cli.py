"""The review-queue command line against a real database."""

import os
import subprocess

import psycopg
from fastapi.testclient import TestClient

from tests.conftest import libpq


def cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["review-queue", *args],
        env={**os.environ, "DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_token_create_prints_the_token_alone_on_the_last_line(db_url: str, client: TestClient) -> None:
    result = cli(db_url, "token", "create", "--subject", "dora", "--role", "reviewer")
    assert result.returncode == 0, result.stderr
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("rq_") and " " not in token
    with psycopg.connect(libpq(db_url)) as conn:
        stored = conn.execute("SELECT subject, role, token_hash FROM api_token").fetchall()
    assert [(s, r) for s, r, _ in stored] == [("dora", "reviewer")]
    assert token not in stored[0][2], "only a hash may be stored"
    response = client.post("/leases", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_token_list_and_revoke(db_url: str) -> None:
    cli(db_url, "token", "create", "--subject", "eve", "--role", "ingest")
    cli(db_url, "token", "create", "--subject", "eve", "--role", "ingest")
    assert "revoked 2 token(s) of eve" in cli(db_url, "token", "revoke", "--subject", "eve").stdout
    listing = cli(db_url, "token", "list").stdout
    assert listing.count("eve") == 2 and listing.count("revoked") == 2
    assert "rq_" not in listing


def test_bad_role_is_refused(db_url: str) -> None:
    result = cli(db_url, "token", "create", "--subject", "x", "--role", "root")
    assert result.returncode != 0


def test_out_of_range_setting_stops_with_a_message(db_url: str) -> None:
    result = subprocess.run(
        ["review-queue", "reclaim", "--once"],
        env={**os.environ, "DATABASE_URL": db_url, "REVIEW_QUEUE_RECLAIM_AFTER_S": "5"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "REVIEW_QUEUE_RECLAIM_AFTER_S" in result.stderr and "10-600" in result.stderr


def test_reclaim_once_prints_the_count(db_url: str, sql: psycopg.Connection) -> None:
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, state, leased_by, leased_at, lease_expires_at)"
        " SELECT 'k' || i, 'E', 1, 'PARTIAL', 'h', 'ASSIGNED', 'gone', now() - interval '2 hours',"
        " now() - interval '1 hour' FROM generate_series(1, 250) i"
    )
    result = cli(db_url, "reclaim", "--once")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "reclaimed 250"


def test_audit_seal_head_verify_and_verify_against(db_url: str, sql: psycopg.Connection) -> None:
    from tests.db.test_audit import add_events

    add_events(sql, 4)
    assert cli(db_url, "audit", "seal", "--once").stdout.strip().splitlines()[-1] == "sealed 4"
    head = cli(db_url, "audit", "head").stdout.strip()
    assert head.startswith("4:") and len(head) == 2 + 64
    ok = cli(db_url, "audit", "verify", "--against", head)
    assert ok.returncode == 0, ok.stderr
    assert "verified 4 events" in ok.stdout and "events/s" in ok.stdout and "intact" in ok.stdout
    wrong = cli(db_url, "audit", "verify", "--against", "4:" + "0" * 64)
    assert wrong.returncode == 1
    assert "BROKEN at seq 4: rewritten" in wrong.stderr
    with sql.transaction():
        sql.execute("SET LOCAL session_replication_role = replica")
        sql.execute(
            "UPDATE review_queue_event SET actor = 'mallory'"
            " WHERE id = (SELECT event_id FROM review_queue_chain WHERE seq = 2)"
        )
    broken = cli(db_url, "audit", "verify")
    assert broken.returncode == 1
    assert "BROKEN at seq 2: modified" in broken.stderr
    assert cli(db_url, "audit", "verify", "--against", "nonsense").returncode == 2
