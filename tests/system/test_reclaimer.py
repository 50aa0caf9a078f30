"""The reclaimer as a real process against real PostgreSQL."""

import signal
import subprocess
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.support import seed_expired, wait_for
from tests.support.postgres import libpq
from tests.support.servers import INTERVAL_S, STARTUP_S, OwnPostgres, start_reclaimer

# "On schedule" with headroom for a loaded machine: within this many intervals, still far below the
# default interval a reclaimer that ignored its configuration would sleep.
ON_SCHEDULE = 8


@contextmanager
def running_reclaimer(db_url: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    process = start_reclaimer(db_url, log)
    try:
        wait_for(lambda: "reclaimer_started" in log.read_text(), STARTUP_S)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def reclaimer(db_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    log = tmp_path / "reclaimer.log"
    with running_reclaimer(db_url, log) as process:
        yield process, log


def pending(sql: psycopg.Connection) -> int:
    return sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'PENDING'").fetchone()[0]


def test_reclaims_backdated_leases_on_schedule_and_stops_on_sigterm(
    reclaimer: tuple[subprocess.Popen[bytes], Path], sql: psycopg.Connection
) -> None:
    process, log = reclaimer
    # Seeded after the reclaimer started, so only a later, scheduled drain can take these.
    seed_expired(sql, 250)
    wait_for(lambda: pending(sql) == 250, timeout=ON_SCHEDULE * INTERVAL_S)
    # Logged after the commit the query above saw: the line may follow it by a moment.
    wait_for(lambda: "review_item_lease_reclaimed" in log.read_text(), timeout=30)

    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0
    assert "reclaimer_stopped" in log.read_text()


def test_the_reclaimer_loop_seals_the_audit_chain(
    reclaimer: tuple[subprocess.Popen[bytes], Path], sql: psycopg.Connection
) -> None:
    _, log = reclaimer
    seed_expired(sql, 30)  # reclaiming them writes 30 RECLAIMED events, sealed by the same loop

    def chained() -> bool:
        events, sealed = sql.execute(
            "SELECT (SELECT count(*) FROM review_queue_event), (SELECT count(*) FROM review_queue_chain)"
        ).fetchone()  # type: ignore[misc]
        return bool(events == 30 and sealed == 30)

    wait_for(chained, timeout=30)
    wait_for(lambda: "audit_chain_sealed" in log.read_text(), timeout=30)  # logged after the commit


def test_the_reclaimer_loop_rolls_up_the_resolved_count(
    db_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    # Resolved over the last 30 days, and older than the roll-up's margin: folded in a week at a time.
    # Written before the reclaimer starts: a resolution from before the edge must not commit after a
    # roll-up (the service's completions never do; rows written by hand must keep to it too).
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, resolution, resolved_by, resolved_at)
           SELECT 'done-' || i, 'ACME', 1, 'UNMATCHED', 'h' || i, 'RESOLVED', 'OK', 'r',
                  now() - interval '1 hour' - i * interval '1 day'
           FROM generate_series(1, 30) i"""
    )

    def rolled_up() -> bool:
        row = sql.execute(
            "SELECT resolved, edge > now() - interval '1 hour' FROM review_queue_resolved_rollup"
        ).fetchone()
        # ... and the throughput report's closed days after it, in the default zone: one decision each.
        days = sql.execute(
            "SELECT time_zone, count(*), sum(resolved)"
            " FROM review_queue_throughput_bucket, review_queue_throughput_rollup WHERE days = 1 GROUP BY 1"
        ).fetchone()
        return row == (30, True) and days == ("UTC", 30, 30)

    log = tmp_path / "reclaimer.log"
    with running_reclaimer(db_url, log):
        wait_for(rolled_up, timeout=ON_SCHEDULE * INTERVAL_S + 30)
    assert "reclaim_failed" not in log.read_text()


def test_two_reclaimers_never_reclaim_one_item_twice(
    db_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    seed_expired(sql, 3000)
    processes = [start_reclaimer(db_url, tmp_path / f"r{n}.log") for n in range(2)]
    for n in range(2):
        wait_for(lambda n=n: "reclaimer_started" in (tmp_path / f"r{n}.log").read_text(), STARTUP_S)
    try:
        wait_for(lambda: pending(sql) == 3000, timeout=120)
    finally:
        for process in processes:
            process.send_signal(signal.SIGINT)
        assert [p.wait(timeout=60) for p in processes] == [0, 0]
    reclaims = Counter(
        r[0]
        for r in sql.execute("SELECT item_id FROM review_queue_event WHERE event = 'RECLAIMED'").fetchall()
    )
    assert len(reclaims) == 3000
    assert max(reclaims.values()) == 1, "an item was reclaimed twice"
    actors = {r[0] for r in sql.execute("SELECT DISTINCT actor FROM review_queue_event").fetchall()}
    assert all(a.startswith("reclaimer@") for a in actors), actors


def test_survives_the_database_going_away(own_postgres: OwnPostgres, tmp_path: Path) -> None:
    log = tmp_path / "reclaimer.log"
    process = start_reclaimer(own_postgres.url, log)
    try:
        wait_for(lambda: "reclaimer_started" in log.read_text(), STARTUP_S)
        own_postgres.stop()
        wait_for(lambda: "reclaim_database_unavailable" in log.read_text(), 60)
        assert process.poll() is None, "the reclaimer died with the database"
        own_postgres.start()
        with psycopg.connect(libpq(own_postgres.url), autocommit=True) as sql:
            seed_expired(sql, 10)
            wait_for(lambda: pending(sql) == 10, timeout=60)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
