"""Arranging database state for tests: seeded items, backdated leases; waiting for conditions."""

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import psycopg

# Longer property-based runs (the model tests) when set.
LONG = bool(os.environ.get("REVIEW_QUEUE_TEST_LONG"))


def utc_month(offset: int) -> datetime:
    """The first instant of the UTC month `offset` months from this one (the event trail's
    partitions are UTC months)."""
    now = datetime.now(UTC)
    months = now.year * 12 + now.month - 1 + offset
    return datetime(months // 12, months % 12 + 1, 1, tzinfo=UTC)


def seed_items(sql: psycopg.Connection, count: int, *, amount: str = "12.50") -> None:
    """count PENDING items idem-1..idem-N with strictly increasing created_at (oldest first is defined)."""
    sql.execute(
        """
        INSERT INTO review_queue_item
            (idempotency_key, ledger_entity, variance_amount, match_decision, source_hash, created_at)
        SELECT 'idem-' || i, 'ACME-CORP', %s::numeric, 'UNMATCHED', 'hash-' || i,
               now() - interval '1 hour' + i * interval '1 millisecond'
        FROM generate_series(1, %s) AS i
        """,
        (amount, count),
    )


def backdate_lease(sql: psycopg.Connection, item_id: object = None, *, seconds: float = 3600) -> None:
    """Make a lease (or every lease, when item_id is None) expire `seconds` ago, by the database clock."""
    sql.execute(
        "UPDATE review_queue_item SET lease_expires_at = now() - make_interval(secs => %s)"
        " WHERE state = 'ASSIGNED' AND (%s::uuid IS NULL OR id = %s::uuid)",
        (seconds, item_id, item_id),
    )


def wait_for(predicate: Callable[[], object], timeout: float, step: float = 0.05) -> float:
    """Seconds until predicate() held; fails the test after timeout (make it generous: it is only
    reached when something is broken, and a loaded machine is slow)."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - started


def lock_waiters(sql: psycopg.Connection) -> int:
    """Backends of this database (other than `sql`'s) waiting for a lock right now."""
    row = sql.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
    ).fetchone()
    return int(row[0]) if row else 0


TESTS = Path(__file__).resolve().parents[1]
# The tiers, each a folder of tests/: no database or process; the database and the app in-process;
# processes, clusters, browsers, the provider, faults, the model runs, the mutation check.
TIERS = ("unit", "integration", "system")
DEPLOY = TESTS.parent / "deploy"

# A valid OIDC configuration as environment variables (tests/unit/test_oidc_settings.py changes
# one at a time).
OIDC_ENV = {
    "REVIEW_QUEUE_OIDC_ISSUER": "https://sso.example.com/realms/finance",
    "REVIEW_QUEUE_OIDC_CLIENT_ID": "review-queue",
    "REVIEW_QUEUE_OIDC_ROLE_MAP": "recon-reviewers=reviewer,recon-admins=admin",
    "REVIEW_QUEUE_PUBLIC_URL": "https://review.example.com",
}


def seed_expired(sql: psycopg.Connection, count: int, *, prefix: str = "x") -> None:
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, leased_by, leased_at, lease_expires_at, lease_epoch)
           SELECT %s || i, 'ACME', 1, 'UNMATCHED', 'h' || i, 'ASSIGNED', 'gone-' || (i %% 3),
                  now() - interval '2 hours', now() - interval '1 hour', 1
           FROM generate_series(1, %s) i""",
        (prefix, count),
    )


def reclaimed_of(sql: psycopg.Connection, prefix: str) -> int:
    """How many of the leases seed_expired made with `prefix` are back in the queue (PENDING)."""
    row = sql.execute(
        "SELECT count(*) FROM review_queue_item WHERE idempotency_key LIKE %s AND state = 'PENDING'",
        (prefix + "%",),
    ).fetchone()
    return 0 if row is None else int(row[0])
