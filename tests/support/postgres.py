"""The test databases: URLs by role, fresh copies of the migrated template, settings and real
tokens for them."""

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from api.settings import Settings
from bench.harness import create_token as create_token  # re-exported: the tests' real tokens are the bench's
from bench.harness import insert_token as insert_token
from db import roles, tokens
from db.engine import libpq_url

# REVIEW_QUEUE_WEBHOOK_KEY of every app and server the tests start (a Fernet key made for them).
WEBHOOK_KEY = "J6wXOUNQcj5mY_sF4YjRrhlu84-dLEnaDSu373Qo1Ho="
_DIALECT = PGDialect_psycopg()


def libpq(url: str) -> str:
    """A SQLAlchemy URL as psycopg/libpq wants it."""
    return libpq_url(url)


def with_database(url: str, name: str, *, role: str | None = None) -> str:
    """`url` pointed at database `name`, as `role` (the server's own user when None)."""
    parsed = make_url(url).set(drivername="postgresql+psycopg", database=name)
    if role is not None:
        # Both roles log in without a password on the test server (trust on its socket).
        parsed = parsed.set(username=role, password=None)
    return parsed.render_as_string(hide_password=False)


def admin_sql(server_url: str, statement: str) -> None:
    with psycopg.connect(libpq(with_database(server_url, "postgres")), autocommit=True) as conn:
        conn.execute(statement)


@contextmanager
def fresh_database(server_url: str, template_db: str) -> Iterator[str]:
    """A new database cloned from the migrated template (about 30 ms), dropped afterwards: its name."""
    name = f"rq_test_{uuid.uuid4().hex[:12]}"
    admin_sql(server_url, f"CREATE DATABASE {name} TEMPLATE {template_db} OWNER {roles.OWNER_ROLE}")
    try:
        yield name
    finally:
        admin_sql(server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def make_settings(db_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "database_url": db_url,
        "token_cache_s": 0,
        "log_format": "text",
        "webhook_key": WEBHOOK_KEY,
    }
    values.update(overrides)
    return Settings(**values)  # type: ignore[arg-type]


def revoke_tokens(conn: psycopg.Connection, subject: str) -> int:
    """db.tokens' own revocation of the subject's tokens, through a connection the caller holds."""
    compiled = tokens.revocation(subject=subject).compile(dialect=_DIALECT)
    return conn.execute(str(compiled), compiled.params).rowcount
