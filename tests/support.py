"""Arranging database state for tests: seeded items, backdated leases."""

import psycopg


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
