"""What `review-queue token create` refuses before it stores anything, in-process
(tests/support/cli.py)."""

import psycopg
import pytest

from tests.support.cli import invoke


def stored(sql: psycopg.Connection) -> int:
    row = sql.execute("SELECT count(*) FROM api_token").fetchone()
    assert row is not None
    return int(row[0])


def test_bad_role_is_refused(db_url: str, sql: psycopg.Connection) -> None:
    result = invoke(db_url, "token", "create", "--subject", "x", "--role", "root")
    assert result.exit_code == 2 and "--role" in result.stderr, result.output
    assert stored(sql) == 0


@pytest.mark.parametrize("subject", ["", "me", "ME", "reclaimer", "reclaimer@host-1", "a b", "-x", "x" * 129])
def test_token_create_refuses_subjects_that_break_things(
    db_url: str, sql: psycopg.Connection, subject: str
) -> None:
    result = invoke(db_url, "token", "create", "--subject", subject, "--role", "reviewer")
    assert result.exit_code == 2, result.output
    assert "subject" in result.stderr and ("reserved" in result.stderr or "1-128" in result.stderr)
    assert stored(sql) == 0


@pytest.mark.parametrize("subject", ["", "me", "Reclaimer", "reclaimer@host-1", "a b", "é"])
def test_the_database_refuses_the_same_subjects(sql: psycopg.Connection, subject: str) -> None:
    with pytest.raises(psycopg.errors.CheckViolation, match="ck_api_token_valid_subject"):
        sql.execute(
            "INSERT INTO api_token (subject, role, token_hash) VALUES (%s, 'reviewer', %s)",
            (subject, f"hash-{subject}"),
        )


@pytest.mark.parametrize("value", ["0m", "30s", "3y", "12", "h", "-5d", "1000000w", "90 m"])
def test_expires_in_refuses_what_it_cannot_mean(db_url: str, sql: psycopg.Connection, value: str) -> None:
    result = invoke(db_url, "token", "create", "--subject", "lee", "--role", "admin", "--expires-in", value)
    assert result.exit_code == 2 and "--expires-in" in result.stderr, result.output
    assert stored(sql) == 0


def test_an_accepted_token_create_stores_one_token(db_url: str, sql: psycopg.Connection) -> None:
    """The control of the refusals above: the same call with good arguments stores its token."""
    result = invoke(db_url, "token", "create", "--subject", "lee", "--role", "admin", "--expires-in", "12h")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].startswith("rq_")
    assert stored(sql) == 1
