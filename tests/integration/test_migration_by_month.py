"""The switch to a trail partitioned by month (alembic/versions/2026_12_05_0200_event_trail_by_month.py)
on a trail with history: every event kept as it was, the chain verifying, the identity going on;
the online first step found when run by hand; writers waiting out the switch, none failing; and
back down to one table."""

from datetime import timedelta

import psycopg
import pytest

from alembic import command
from db import audit
from db.migrations import MigrationRefused, alembic_config
from tests.support import utc_month
from tests.support.audit import add_events, seal
from tests.support.migrations import upgrade_while_writing
from tests.support.postgres import libpq

pytestmark = pytest.mark.fresh_db("migrates the event trail down and up by hand")

BEFORE = "8b2e6d4a9c31"  # the revision before the switch


def _trail(sql: psycopg.Connection) -> list[tuple[object, ...]]:
    # The columns of the switch's revision: a later one (item_after) is not there below head.
    return sql.execute(
        "SELECT id, item_id, event, actor, at, lease_epoch, trace_id, details, xid, leased_at"
        " FROM review_queue_event ORDER BY id"
    ).fetchall()


def _kind(sql: psycopg.Connection) -> str:
    (kind,) = sql.execute("SELECT relkind FROM pg_class WHERE relname = 'review_queue_event'").fetchone()  # type: ignore[misc]
    return str(kind)


def _verified(db_url: str) -> int:
    with psycopg.connect(libpq(db_url)) as conn:
        result = audit.verify(conn)
    assert result.broken is None, result.broken
    return result.events


def _history(sql: psycopg.Connection) -> None:
    """Events of now, and one from last year (the owner alone may place an event in time)."""
    add_events(sql, 12)
    sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, at)"
        " SELECT id, 'RESOLVED', 'bob', 1, trace_id, now() - interval '1 year' FROM review_queue_item LIMIT 1"
    )


def test_the_switch_keeps_every_event_and_the_chain_and_goes_back(
    owner_url: str, db_url: str, sql: psycopg.Connection
) -> None:
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    assert _kind(sql) == "r"
    _history(sql)
    assert seal(db_url) == 13
    before = _trail(sql)
    command.upgrade(config, "head")
    assert _kind(sql) == "p"
    assert _trail(sql) == before
    places = sql.execute("SELECT DISTINCT tableoid::regclass::text FROM review_queue_event").fetchall()
    assert places == [("review_queue_event_legacy",)]  # attached, not copied
    assert _verified(db_url) == 13
    # The identity goes on after the legacy's last id; the new event is sealed after the old.
    add_events(sql, 1)
    after = _trail(sql)
    assert after[:-1] == before and after[-1][0] == before[-1][0] + 1  # type: ignore[operator]
    assert seal(db_url) == 1
    assert _verified(db_url) == 14
    command.downgrade(config, BEFORE)
    assert _kind(sql) == "r"
    assert _trail(sql) == after
    assert _verified(db_url) == 14
    command.upgrade(config, "head")
    assert _trail(sql) == after
    assert _verified(db_url) == 14
    # Up and down with no event between: the identity still goes on after the last id.
    command.downgrade(config, BEFORE)
    command.upgrade(config, "head")
    command.downgrade(config, BEFORE)
    add_events(sql, 1)
    command.upgrade(config, "head")
    add_events(sql, 1)
    ids = [row[0] for row in _trail(sql)]
    assert ids == [*(row[0] for row in after), after[-1][0] + 1, after[-1][0] + 2]  # type: ignore[operator]


def test_the_first_step_run_by_hand_beforehand_is_found_and_its_bound_kept(
    owner_url: str, sql: psycopg.Connection
) -> None:
    """The online first step of the migration's docstring, with a bound two months out: the
    migration builds no index, reads nothing, and the legacy partition ends at that bound."""
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    _history(sql)
    bound = utc_month(2)
    with psycopg.connect(libpq(owner_url), autocommit=True) as owner:
        owner.execute(
            "CREATE UNIQUE INDEX CONCURRENTLY pk_review_queue_event_legacy ON review_queue_event (id, at)"
        )
        owner.execute(
            "ALTER TABLE review_queue_event ADD CONSTRAINT ck_review_queue_event_legacy_at"
            f" CHECK (at < '{bound.isoformat()}') NOT VALID"
        )
        owner.execute("ALTER TABLE review_queue_event VALIDATE CONSTRAINT ck_review_queue_event_legacy_at")
        (index_oid,) = owner.execute("SELECT 'pk_review_queue_event_legacy'::regclass::oid").fetchone()  # type: ignore[misc]
    command.upgrade(config, "head")
    (legacy_bound,) = sql.execute(
        "SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'review_queue_event_legacy'"
    ).fetchone()  # type: ignore[misc]
    assert f"TO ('{bound:%Y-%m-%d} 00:00:00+00')" in legacy_bound
    # The index made by hand is the legacy partition's primary key: the same one, not a rebuilt one.
    assert sql.execute(
        "SELECT conindid FROM pg_constraint WHERE conname = 'pk_review_queue_event_legacy'"
    ).fetchone() == (index_oid,)
    months = sql.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits"
        " WHERE inhparent = 'review_queue_event'::regclass ORDER BY 1"
    ).fetchall()
    assert [m for (m,) in months] == [
        f"review_queue_event_{utc_month(2):%Y_%m}",
        f"review_queue_event_{utc_month(3):%Y_%m}",
        "review_queue_event_legacy",
    ]


@pytest.mark.parametrize(
    ("check", "refusal"),
    [
        (f"CHECK (at < '{utc_month(1) + timedelta(days=14)}')", "not the first of a month in UTC"),
        (f"CHECK (at < '{utc_month(1).replace(tzinfo=None)}+02')", "not the first of a month in UTC"),
        (f"CHECK (at < '{utc_month(1)}') NOT VALID", "NOT VALID"),
    ],
)
def test_a_first_step_by_hand_with_a_bound_the_months_cannot_follow_stops_the_migration(
    owner_url: str, sql: psycopg.Connection, check: str, refusal: str
) -> None:
    """A mid-month or non-UTC bound would leave the rest of its month with no partition (every event
    then fails); an unvalidated one would be read under the lock. Nothing changes."""
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    _history(sql)
    sql.execute(f"ALTER TABLE review_queue_event ADD CONSTRAINT ck_review_queue_event_legacy_at {check}")
    with pytest.raises(MigrationRefused, match=refusal):
        command.upgrade(config, "head")
    assert _kind(sql) == "r"


def test_writers_wait_out_the_switch_and_none_fails(
    owner_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    """Four writers append events without pause while the migration runs: each waits for the
    switch's lock, then writes into the partitioned table; no write fails or is lost."""
    config = alembic_config(owner_url)
    command.downgrade(config, BEFORE)
    add_events(sql, 1)

    def write(conn: psycopg.Connection, *_: object) -> int:
        (event_id,) = conn.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 'alice', 1, trace_id FROM review_queue_item LIMIT 1"
            " RETURNING id"
        ).fetchone()  # type: ignore[misc]
        return int(event_id)

    written, during = upgrade_while_writing(superuser_url, write, lambda: command.upgrade(config, "head"))
    assert all(n > 0 for n in during)
    assert _kind(sql) == "p"
    ids = sorted(i for w in written for i in w)
    stored = [
        int(r[0])
        for r in sql.execute("SELECT id FROM review_queue_event WHERE event = 'RENEWED' ORDER BY id")
    ]
    assert stored == ids
    assert len(set(ids)) == len(ids)
