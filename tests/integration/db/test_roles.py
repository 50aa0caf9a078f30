"""Least privilege: the role the service runs as can do the service's work and nothing more.

The audit trail's trigger stops UPDATE, DELETE and TRUNCATE, but a table's owner can disable a
trigger and a superuser can set session_replication_role = replica, which skips it. So the
service must be neither: these tests connect exactly as the service does (the `db_url` every
API test uses) and try each way around the trail.
"""

from collections.abc import Callable, Iterator

import psycopg
import pytest

from db.roles import APP_ROLE, OWNER_ROLE, SEALER_ROLE
from tests.support import seed_items
from tests.support.postgres import libpq

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
    # Issue 23: the sealer is the only writer of the chain. One row at seq = max + 1 (or seq 1 on an
    # empty chain) would stop it for good.
    "INSERT INTO review_queue_chain (seq, event_id, hash)"
    " SELECT coalesce(max(seq), 0) + 1, 1, sha256('x') FROM review_queue_chain",
    "ALTER FUNCTION review_queue_seal(integer) SECURITY INVOKER",
    "CREATE OR REPLACE FUNCTION review_queue_canonical_json(v jsonb) RETURNS text"
    " LANGUAGE sql AS $f$SELECT '{}'$f$",
    # An event's place in time and in the chain's order comes from the database, never the client.
    "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, xid)"
    " SELECT id, 'LEASED', 'mallory', 1, trace_id, '1' FROM review_queue_item LIMIT 1",
    "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, at)"
    " SELECT id, 'LEASED', 'mallory', 1, trace_id, now() - interval '1 year' FROM review_queue_item LIMIT 1",
    "INSERT INTO review_queue_event (id, item_id, event, actor, lease_epoch, trace_id)"
    " OVERRIDING SYSTEM VALUE SELECT 1, id, 'LEASED', 'mallory', 1, trace_id FROM review_queue_item LIMIT 1",
    # The trail's partitions grant nothing: written through the parent, an event's id, time and
    # transaction come from the database; a partition is never truncated, detached or dropped by it.
    "INSERT INTO review_queue_event_legacy (id, item_id, event, actor, at, lease_epoch, trace_id, xid)"
    " OVERRIDING SYSTEM VALUE SELECT 1, id, 'LEASED', 'mallory', now() - interval '1 year', 1, trace_id, '1'"
    " FROM review_queue_item LIMIT 1",
    "SELECT count(*) FROM review_queue_event_legacy",
    "TRUNCATE review_queue_event_legacy",
    "ALTER TABLE review_queue_event DETACH PARTITION review_queue_event_legacy",
    "DROP TABLE review_queue_event_legacy",
    "ALTER FUNCTION review_queue_event_add_months(integer) SECURITY INVOKER",
    # The archive is the owner's: the service may neither run it nor delete what it lets through.
    "SELECT review_queue_archive_apply(now(), 1, sha256('x'), 1, sha256('x'), 0, '', '', 'mallory')",
    "WITH s AS (SELECT set_config('review_queue.archiving', 'on', true))"
    " DELETE FROM review_queue_event WHERE EXISTS (SELECT FROM s)",
    "INSERT INTO review_queue_archive (cutoff, first_seq, through_seq, through_hash, through_xid,"
    " through_event_id, events, items, events_sha256, items_sha256, archived_by)"
    " VALUES (now(), 1, 1000000, sha256('x'), '1', 1, 1, 0, '', '', 'mallory')",
    "DELETE FROM review_queue_archive",
    # The backlog trusts review_queue_item.reopened: only a REOPENED event sets it (2026_12_05_1500).
    "UPDATE review_queue_item SET reopened = true",
    "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
    " source_hash, reopened) VALUES ('mallory', 'ACME', 1, 'MATCHED', 'h-mallory', true)",
    "ALTER TABLE review_queue_item DISABLE TRIGGER review_queue_item_reopened_update",
    "ALTER TABLE approval_policy ADD COLUMN mallory text",
    "DELETE FROM approval_policy",
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
        # The sealer function appends to the chain; the service may only call it.
        "review_queue_chain": "SELECT",
        # Where the live chain starts: appended by the owner's archive only.
        "review_queue_archive": "SELECT",
        # INSERT on the event's content columns only (test_an_event_gets_its_place_from_the_database).
        "review_queue_event": "SELECT",
        # Exchange rates: appended, never changed or deleted (the evidence of which rate applied).
        "fx_rate": "INSERT,SELECT",
        # Materiality: one row, updated, never added or deleted.
        "approval_policy": "SELECT,UPDATE",
        "review_queue_item": "INSERT,SELECT,UPDATE",
        # /stats' RESOLVED rollup: one row, moved forward by the reclaimer, never added or deleted.
        "review_queue_resolved_rollup": "SELECT,UPDATE",
        # The throughput report's closed days: added, and all deleted when the zone changes.
        "review_queue_throughput_bucket": "DELETE,INSERT,SELECT",
        "review_queue_backlog_day": "DELETE,INSERT,SELECT",
        "review_queue_throughput_rollup": "SELECT,UPDATE",
        # The items ever reopened, by deadline: added by the (owner's) trigger on a REOPENED event.
        "review_queue_reopened_item": "SELECT",
        # Sign-in with the identity provider: a login attempt is taken once (deleted), a provider
        # session ends with the desk session.
        # A used state is recorded once and swept when old.
        "oidc_used_state": "DELETE,INSERT,SELECT",
        "oidc_session": "DELETE,INSERT,SELECT",
        # A name, once the provider signed it in, stays with that account (issuer, sub).
        "oidc_identity": "INSERT,SELECT",
        # Subscriptions are deactivated, never deleted; attempts are appended and pruned.
        "webhook_delivery": "DELETE,INSERT,SELECT",
        "webhook_subscription": "INSERT,SELECT,UPDATE",
        # The events held behind a failed one of their item: added, retried, deleted once delivered.
        "webhook_held": "DELETE,INSERT,SELECT,UPDATE",
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


def test_an_event_gets_its_place_from_the_database(
    as_service: psycopg.Connection, sql: psycopg.Connection
) -> None:
    """The service inserts an event's content; its id, time and transaction come from the database."""
    rows = as_service.execute(
        "SELECT column_name FROM information_schema.column_privileges WHERE grantee = current_user"
        " AND table_name = 'review_queue_event' AND privilege_type = 'INSERT' ORDER BY 1"
    ).fetchall()
    assert [r[0] for r in rows] == [
        "actor", "details", "event", "item_after", "item_id", "lease_epoch", "trace_id"
    ]  # fmt: skip
    with as_service.transaction():
        (xid, now) = as_service.execute("SELECT pg_current_xact_id()::text, now()").fetchone()  # type: ignore[misc]
        (event_id,) = as_service.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'LEASED', 'alice', 1, trace_id FROM review_queue_item LIMIT 1 RETURNING id"
        ).fetchone()  # type: ignore[misc]
    row = sql.execute("SELECT xid::text, at FROM review_queue_event WHERE id = %s", (event_id,)).fetchone()
    assert row == (xid, now)


def test_the_service_role_can_only_ask_the_sealer(
    as_service: psycopg.Connection, sql: psycopg.Connection
) -> None:
    """The service's role calls review_queue_seal (what the reclaimer does), which appends the
    real events; temporary tables of the same names in its session do not divert it."""
    as_service.execute("CREATE TEMPORARY TABLE review_queue_chain (seq bigint, event_id bigint, hash bytea)")
    as_service.execute(
        "CREATE TEMPORARY TABLE review_queue_event AS SELECT * FROM review_queue_event WHERE false"
    )
    (sealed,) = as_service.execute("SELECT review_queue_seal(1000)").fetchone()  # type: ignore[misc]
    (events,) = sql.execute("SELECT count(*) FROM review_queue_event").fetchone()  # type: ignore[misc]
    assert sealed == events == 3
    assert sql.execute("SELECT count(*) FROM review_queue_chain").fetchone() == (3,)
    assert as_service.execute("SELECT count(*) FROM pg_temp.review_queue_chain").fetchone() == (0,)
    (owner, definer) = sql.execute(
        "SELECT proowner::regrole::text, prosecdef FROM pg_proc WHERE proname = 'review_queue_seal'"
    ).fetchone()  # type: ignore[misc]
    assert (owner, definer) == (SEALER_ROLE, True)
    inserters = sql.execute(
        "SELECT grantee FROM information_schema.role_table_grants WHERE table_schema = 'public'"
        " AND table_name = 'review_queue_chain' AND privilege_type = 'INSERT' ORDER BY 1"
    ).fetchall()
    assert [g for (g,) in inserters] == [OWNER_ROLE, SEALER_ROLE]
    assert sql.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (SEALER_ROLE,)).fetchone() == (
        False,
    )
