"""Least privilege: the role the service runs as can do the service's work and nothing more.

The audit trail's trigger stops UPDATE, DELETE and TRUNCATE, but a table's owner can disable a
trigger and a superuser can set session_replication_role = replica, which skips it. So the
service must be neither: these tests connect exactly as the service does (the `db_url` every
API test uses) and try each way around the trail.
"""

from collections.abc import Callable, Iterator

import psycopg
import pytest

from db.roles import APP_ROLE
from tests.conftest import libpq
from tests.support import seed_items

ATTEMPTS = [
    "UPDATE review_queue_event SET actor = 'mallory'",
    "DELETE FROM review_queue_event",
    "TRUNCATE review_queue_event",
    "ALTER TABLE review_queue_event DISABLE TRIGGER review_queue_event_no_change",
    "ALTER TABLE review_queue_event DISABLE TRIGGER USER",
    "DROP TRIGGER review_queue_event_no_change ON review_queue_event",
    "SET session_replication_role = replica",
    "ALTER TABLE review_queue_item ADD COLUMN mallory text",
    "ALTER TABLE review_queue_item DROP CONSTRAINT ck_review_queue_item_valid_state",
    "DELETE FROM review_queue_item",
    "TRUNCATE review_queue_item",
    "CREATE TABLE mallory (id int)",
    "CREATE FUNCTION mallory() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "ALTER ROLE review_queue_app SUPERUSER",
    "DROP TABLE review_queue_event",
    "UPDATE review_queue_chain SET seq = seq",
    "DELETE FROM review_queue_chain",
    "TRUNCATE review_queue_chain",
    "ALTER TABLE review_queue_chain DISABLE TRIGGER review_queue_chain_no_change",
]


@pytest.fixture
def as_service(db_url: str, sql: psycopg.Connection) -> Iterator[psycopg.Connection]:
    seed_items(sql, 3)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'ENQUEUED', 'ingest', 0, trace_id FROM review_queue_item"
    )
    with psycopg.connect(libpq(db_url), autocommit=True) as conn:
        assert conn.execute("SELECT current_user").fetchone() == (APP_ROLE,)
        yield conn


def _trail(sql: psycopg.Connection) -> list[tuple[object, ...]]:
    return sql.execute("SELECT * FROM review_queue_event ORDER BY id").fetchall()


@pytest.mark.parametrize("statement", ATTEMPTS)
def test_the_service_role_cannot_get_around_the_audit_trail(
    as_service: psycopg.Connection, sql: psycopg.Connection, statement: str
) -> None:
    before = _trail(sql)
    items = sql.execute("SELECT count(*) FROM review_queue_item").fetchone()
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        as_service.execute(statement)
    assert _trail(sql) == before
    assert sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == items


def test_the_service_role_has_exactly_the_table_rights_it_needs(as_service: psycopg.Connection) -> None:
    rows = as_service.execute(
        "SELECT table_name, string_agg(privilege_type, ',' ORDER BY privilege_type)"
        " FROM information_schema.role_table_grants WHERE grantee = current_user GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert dict(rows) == {
        "alembic_version": "SELECT",
        "api_token": "INSERT,SELECT,UPDATE",
        "desk_session": "DELETE,INSERT,SELECT",
        # Codes are deactivated, never deleted.
        "resolution_code": "INSERT,SELECT,UPDATE",
        "review_queue_chain": "INSERT,SELECT",
        "review_queue_event": "INSERT,SELECT",
        "review_queue_item": "INSERT,SELECT,UPDATE",
        # Subscriptions are deactivated, never deleted; attempts are appended and pruned.
        "webhook_delivery": "DELETE,INSERT,SELECT",
        "webhook_subscription": "INSERT,SELECT,UPDATE",
    }
    owns = as_service.execute(
        "SELECT count(*) FROM pg_class WHERE relowner = current_user::regrole"
    ).fetchone()
    assert owns == (0,)
    superuser = as_service.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    assert superuser == (False,)


def test_the_service_role_can_append_events(
    as_service: psycopg.Connection, sql: psycopg.Connection, make_token: Callable[[str, str], str]
) -> None:
    (count,) = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()  # type: ignore[misc]
    as_service.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'LEASED', 'alice', 1, trace_id FROM review_queue_item LIMIT 1"
    )
    assert sql.execute("SELECT count(*) FROM review_queue_event").fetchone() == (count + 1,)
