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


def test_make_run_prints_the_desk_url_next_to_the_tokens(client: TestClient) -> None:
    from cli.devtokens import instructions

    text = instructions({"admin": "rq_a", "reviewer": "rq_r"}, "http://127.0.0.1:8000")
    assert "reviewer  rq_r" in text and "admin     rq_a" in text
    desk_url = next(w for w in text.split() if w.endswith("/desk/"))
    assert desk_url == "http://127.0.0.1:8000/desk/"
    # ... and it is the page the service serves.
    assert "Reviewer desk" in client.get("/desk/").text
