"""`review-queue archive` and `audit verify --archive` on real PostgreSQL: the oldest range of the
chain goes to files that verify, its months are dropped, the live chain goes on from where the
files end, nothing open is archived, and a refused archive changes nothing and leaves no file."""

import asyncio
import dataclasses
import json
import subprocess
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from fastapi.testclient import TestClient

import cli.archive as cli_archive
from cli.archive import archive_to, default_cutoff
from db import archive as archives
from db import audit, chain
from db.engine import create_engine, transaction
from tests.support import utc_month
from tests.support.audit import seal
from tests.support.cli import completed, invoke
from tests.support.postgres import create_token, libpq

pytestmark = pytest.mark.fresh_db("detaches, creates and drops partitions of the event trail")

# The test's months, relative to today's: M(-4) and M(-3) are archived, M(-2) is the cutoff (always
# older than the 30 days of retention the tests allow), M(-2) and M(-1) stay live.
M = utc_month
RETAIN_DAYS = "30"


def run(db_url: str, owner_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`review-queue ARGS`, in-process (tests/support/cli.py)."""
    env = {"REVIEW_QUEUE_MIGRATION_DATABASE_URL": owner_url, "REVIEW_QUEUE_RETAIN_RESOLVED_DAYS": RETAIN_DAYS}
    return completed(invoke(db_url, *args, env=env), *args)


def archive(db_url: str, owner_url: str, directory: Path, month: int) -> subprocess.CompletedProcess[str]:
    """`review-queue archive` before the first of month M(month)."""
    return run(db_url, owner_url, "archive", "--to", str(directory), "--before", f"{M(month):%Y-%m-%d}")


def _partitions(sql: psycopg.Connection) -> list[str]:
    rows = sql.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'review_queue_event'::regclass"
        " ORDER BY 1"
    )
    return [r[0] for r in rows]


@pytest.fixture
def months(owner_url: str) -> None:
    """The trail as if migrated four months ago: the legacy partition ends at M(-4), and each month
    from M(-4) on has its own partition (the owner's, as review_queue_event_add_months makes them)."""
    with psycopg.connect(libpq(owner_url), autocommit=True) as owner:
        owner.execute("ALTER TABLE review_queue_event DETACH PARTITION review_queue_event_legacy")
        owner.execute(
            "ALTER TABLE review_queue_event ATTACH PARTITION review_queue_event_legacy"
            f" FOR VALUES FROM (MINVALUE) TO ('{M(-4).isoformat()}')"
        )
        for k in range(-4, 1):
            name = f"review_queue_event_{M(k):%Y_%m}"
            owner.execute(
                f"CREATE TABLE {name} (LIKE review_queue_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
            )
            owner.execute(
                f"ALTER TABLE review_queue_event ATTACH PARTITION {name}"
                f" FOR VALUES FROM ('{M(k).isoformat()}') TO ('{M(k + 1).isoformat()}')"
            )


def _item(sql: psycopg.Connection, key: str, created: datetime, state: str) -> str:
    resolved = state == "RESOLVED"
    (item_id,) = sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, created_at, state, resolution, resolved_by, resolved_at)"
        " VALUES (%s, 'ACME-CORP', 12.50, 'UNMATCHED', 'sha256:x', %s, %s, %s, %s, %s) RETURNING id::text",
        (key, created, state, "APPROVED" if resolved else None, "alice" if resolved else None,
         created + timedelta(days=1) if resolved else None),
    ).fetchone()  # type: ignore[misc]  # fmt: skip
    return str(item_id)


Event = Callable[[str, str, datetime], int]


@pytest.fixture
def event(sql: psycopg.Connection) -> Event:
    """An event of `item` at `at`, committed on its own (so chain order is the order of the calls)."""

    def add(item: str, kind: str, at: datetime) -> int:
        (event_id,) = sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, at)"
            " SELECT id, %s, 'alice', 1, trace_id, %s FROM review_queue_item WHERE id = %s RETURNING id",
            (kind, at, item),
        ).fetchone()  # type: ignore[misc]
        return int(event_id)

    return add


@pytest.fixture
def history(months: None, sql: psycopg.Connection, event: Event) -> dict[str, str]:
    """Item a lives and ends in M(-4); b starts in M(-3) and ends in M(-2); c starts in M(-2) and is
    open. One event of a, dated just after the cutoff, is chained before b's last event before it: a
    transaction that began at midnight and was chained among the older ones. The chain:
    1-3 a (M-4), 4 b (M-3), 5 a (M-2, the straddler), 6 b (M-3), 7 b resolved (M-2), 8 c (M-2)."""
    day = timedelta(days=1)
    items = {
        "a": _item(sql, "a", M(-4) + 10 * day, "RESOLVED"),
        "b": _item(sql, "b", M(-3) + 20 * day, "RESOLVED"),
        "c": _item(sql, "c", M(-2) + 5 * day, "PENDING"),
    }
    event(items["a"], "ENQUEUED", M(-4) + 10 * day)
    event(items["a"], "LEASED", M(-4) + 11 * day)
    event(items["a"], "RESOLVED", M(-4) + 12 * day)
    event(items["b"], "ENQUEUED", M(-3) + 20 * day)
    event(items["a"], "RENEWED", M(-2) + timedelta(seconds=1))
    event(items["b"], "LEASED", M(-3) + 25 * day)
    event(items["b"], "RESOLVED", M(-2) + 3 * day)
    event(items["c"], "ENQUEUED", M(-2) + 5 * day)
    return items


def _state(sql: psycopg.Connection) -> tuple[object, ...]:
    return (
        sql.execute("SELECT count(*) FROM review_queue_event").fetchone(),
        sql.execute("SELECT count(*), min(seq) FROM review_queue_chain").fetchone(),
        sql.execute("SELECT count(*) FROM review_queue_item").fetchone(),
        sql.execute("SELECT count(*) FROM review_queue_archive").fetchone(),
        _partitions(sql),
    )


def test_an_archive_moves_the_range_to_files_and_the_chain_goes_on(
    client: TestClient,
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    event: Event,
    tmp_path: Path,
) -> None:
    assert seal(db_url) == 8
    result = archive(db_url, owner_url, tmp_path, -2)
    assert result.returncode == 0, result.stderr
    assert "archived seq 1..6 (6 events, 1 items)" in result.stdout, result.stdout
    name = archives.range_name(1, 6)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"events-{name}.ndjson", f"items-{name}.ndjson"]
    # The months wholly before the cutoff are gone; the straddler left its month; b keeps its live event.
    assert _partitions(sql) == [f"review_queue_event_{M(k):%Y_%m}" for k in range(-2, 4)]
    assert [r[0] for r in sql.execute("SELECT event FROM review_queue_event ORDER BY id")] == [
        "RESOLVED",
        "ENQUEUED",
    ]
    assert sql.execute("SELECT min(seq), max(seq) FROM review_queue_chain").fetchone() == (7, 8)
    keys = [r[0] for r in sql.execute("SELECT idempotency_key FROM review_queue_item ORDER BY 1")]
    assert keys == ["b", "c"], "a (all of its events archived) moved to the file; b and c stay"
    (line,) = (tmp_path / f"items-{name}.ndjson").read_text().splitlines()
    assert '"idempotency_key": "a"' in line and '"variance_amount": 12.50' in line
    # The events file verifies alone, the archive and the live chain as one, and the live alone.
    alone = run(db_url, owner_url, "audit", "verify", "--file", str(tmp_path / f"events-{name}.ndjson"))
    assert alone.returncode == 0 and "seq 1..6" in alone.stdout, alone.stdout + alone.stderr
    whole = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert whole.returncode == 0 and "verified 8 events" in whole.stdout, whole.stdout + whole.stderr
    live = run(db_url, owner_url, "audit", "verify")
    assert live.returncode == 0 and "the live chain from seq 7" in live.stdout, live.stdout + live.stderr
    # The chain goes on after the archive: a new event is sealed at seq 9 and everything verifies.
    event(sql.execute("SELECT id::text FROM review_queue_item WHERE idempotency_key = 'c'").fetchone()[0],  # type: ignore[index]
          "LEASED", datetime.now(UTC))  # fmt: skip
    assert seal(db_url) == 1
    assert sql.execute("SELECT max(seq) FROM review_queue_chain").fetchone() == (9,)
    whole = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert whole.returncode == 0 and "verified 9 events" in whole.stdout, whole.stdout + whole.stderr
    # An export asked from seq 1 starts where the live chain does, from the command and the API.
    export = tmp_path / "live.ndjson"
    assert run(db_url, owner_url, "audit", "export", "--file", str(export)).returncode == 0
    assert export.read_text().splitlines()[0].endswith('"seq":7}')
    auditor = {"Authorization": f"Bearer {create_token(db_url, 'audrey', 'auditor')}"}
    answer = client.get("/audit/export", params={"from": 1}, headers=auditor)
    assert answer.status_code == 200 and answer.content == export.read_bytes(), answer.text[:300]
    # Archiving the same cutoff again finds nothing live before it.
    again = archive(db_url, owner_url, tmp_path / "again", -2)
    assert again.returncode == 0 and "nothing before" in again.stdout, again.stdout + again.stderr


def test_the_archive_files_are_checked_against_what_was_archived(
    history: dict[str, str], db_url: str, owner_url: str, tmp_path: Path
) -> None:
    seal(db_url)
    assert archive(db_url, owner_url, tmp_path, -2).returncode == 0
    events, items = sorted(tmp_path.iterdir())
    original = events.read_bytes()
    events.write_bytes(original.replace(b'"actor":"alice"', b'"actor":"alicf"', 1))
    broken = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert broken.returncode == 1 and "BROKEN at seq 1: modified" in broken.stderr, (
        broken.stdout + broken.stderr
    )
    events.write_bytes(original)
    items.unlink()
    broken = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert broken.returncode == 1 and "missing" in broken.stderr and items.name in broken.stderr, (
        broken.stderr
    )
    # Without --archive, the live chain alone still verifies: the files are the archive's to keep.
    assert run(db_url, owner_url, "audit", "verify").returncode == 0


def test_an_open_item_with_an_event_in_the_range_refuses_the_archive(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    event: Event,
    tmp_path: Path,
) -> None:
    event(history["c"], "RENEWED", M(-3) + timedelta(days=2))  # c is PENDING
    seal(db_url)
    before = _state(sql)
    result = archive(db_url, owner_url, tmp_path, -2)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "nothing open is archived" in result.stderr and history["c"] in result.stderr, result.stderr
    assert _state(sql) == before and list(tmp_path.iterdir()) == []


def test_an_unsealed_event_before_the_cutoff_refuses_the_archive(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    before = _state(sql)
    result = archive(db_url, owner_url, tmp_path, -2)
    assert result.returncode == 1 and "not sealed yet" in result.stderr, result.stdout + result.stderr
    assert _state(sql) == before and list(tmp_path.iterdir()) == []


Files = tuple[archives.Range, str, int, str]


def _apply(owner: psycopg.Connection, files: Files) -> int:
    span, sha, items, items_sha = files
    with owner.transaction():
        return archives.apply(
            owner, span, items=items, events_sha256=sha, items_sha256=items_sha, archived_by="t"
        )


def _live(sql: psycopg.Connection, item_id: str) -> bool:
    return sql.execute("SELECT count(*) FROM review_queue_item WHERE id = %s", (item_id,)).fetchone() == (1,)


def _files(owner: psycopg.Connection, directory: Path) -> Files:
    """What `archive` does before its deletion: the range and both files, in one snapshot."""
    with owner.transaction():
        span = archives.plan(owner, M(-2))
        assert span is not None
        with (directory / archives.events_file(span.name)).open("wb") as out:
            sha = archives.write_events(owner, span, out)
        with (directory / archives.items_file(span.name)).open("wb") as out:
            items, items_sha = archives.write_items(owner, span, out)
    return span, sha, items, items_sha


def test_an_item_reopened_after_the_files_were_written_refuses_the_deletion(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """The files are built in one snapshot and the deletion checks it again: a, in the file, is open
    again before the deletion (it has events in the range)."""
    seal(db_url)
    before = _state(sql)
    with psycopg.connect(libpq(owner_url)) as owner:
        files = _files(owner, tmp_path)
        sql.execute(
            "UPDATE review_queue_item SET state = 'PENDING', resolution = NULL, resolved_by = NULL"
            " WHERE id = %s",
            (history["a"],),
        )
        with pytest.raises(archives.ArchiveRefused, match="nothing open is archived"):
            _apply(owner, files)
    assert _state(sql) == before


def test_an_item_that_gained_an_event_after_the_files_were_written_stays_live(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    event: Event,
    tmp_path: Path,
) -> None:
    seal(db_url)
    with psycopg.connect(libpq(owner_url)) as owner:
        files = _files(owner, tmp_path)
        assert files[2] == 1  # a
        event(history["a"], "RENEWED", datetime.now(UTC))
        assert _apply(owner, files) == 6
        assert archives.delete_items(owner, tmp_path / archives.items_file(files[0].name)) == 0
    assert _live(sql, history["a"])
    assert [
        r[0] for r in sql.execute("SELECT event FROM review_queue_event WHERE item_id = %s", (history["a"],))
    ] == ["RENEWED"]


def test_an_archive_interrupted_before_its_items_went_is_finished_by_the_next_run(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """The items leave after the commit that moved the chain's start: a run stopped in between left
    a (resolved, no event left); the next run deletes it, from the file it wrote."""
    seal(db_url)
    with psycopg.connect(libpq(owner_url)) as owner:
        _apply(owner, _files(owner, tmp_path))
    assert _live(sql, history["a"])
    again = archive(db_url, owner_url, tmp_path, -2)
    assert again.returncode == 0, again.stderr
    assert "deleted 1 items an interrupted archive had left" in again.stdout, again.stdout
    assert "nothing before" in again.stdout, again.stdout
    assert not _live(sql, history["a"])


def test_two_archives_and_an_archive_that_empties_the_chain(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    event: Event,
    tmp_path: Path,
) -> None:
    seal(db_url)
    first = archive(db_url, owner_url, tmp_path, -3)
    assert first.returncode == 0 and "archived seq 1..3 (3 events, 0 items)" in first.stdout, (
        first.stdout + first.stderr
    )
    second = archive(db_url, owner_url, tmp_path, -2)
    assert second.returncode == 0 and "archived seq 4..6 (3 events, 1 items)" in second.stdout, second.stderr
    whole = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert (
        whole.returncode == 0 and "verified 8 events" in whole.stdout and "2 archive files" in whole.stdout
    ), whole.stdout + whole.stderr
    # c resolved too, and a third archive takes what is left: the chain is empty, and the sealer
    # continues from the files (the CLI would refuse M(-1) on some days of the month: retention).
    sql.execute("UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'APPROVED', resolved_by = 'x'")
    done = archive_to(libpq(owner_url), M(-1), tmp_path, archived_by="test")
    assert done.span is not None and (done.span.first_seq, done.span.through_seq) == (7, 8)
    assert (done.events, done.items_in_file, done.items_deleted) == (2, 2, 2)
    assert sql.execute("SELECT count(*) FROM review_queue_chain").fetchone() == (0,)
    assert sql.execute("SELECT count(*) FROM review_queue_item").fetchone() == (0,)
    (d,) = sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash) VALUES ('d', 'ACME-CORP', 1.00, 'UNMATCHED', 'sha256:d') RETURNING id::text"
    ).fetchone()  # type: ignore[misc]
    event(d, "ENQUEUED", datetime.now(UTC))
    assert seal(db_url) == 1
    row = sql.execute("SELECT c.seq, c.hash FROM review_queue_chain c").fetchone()
    assert row is not None and row[0] == 9
    whole = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert (
        whole.returncode == 0 and "verified 9 events" in whole.stdout and "3 archive files" in whole.stdout
    ), whole.stdout + whole.stderr


def test_the_cutoff_is_a_month_start_outside_the_retention(
    db_url: str, owner_url: str, tmp_path: Path
) -> None:
    assert default_cutoff(datetime(2026, 12, 5, 7, tzinfo=UTC), 30) == datetime(2026, 11, 1, tzinfo=UTC)
    assert default_cutoff(datetime(2026, 3, 1, tzinfo=UTC), 30) == datetime(2026, 1, 1, tzinfo=UTC)
    for value, message in (
        (f"{M(-2):%Y-%m}-02", "not the first of a month"),
        (f"{M(0):%Y-%m-%d}", "within REVIEW_QUEUE_RETAIN_RESOLVED_DAYS"),
        ("2026-13-01", "not a date"),
    ):
        result = run(db_url, owner_url, "archive", "--to", str(tmp_path), "--before", value)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_a_second_archive_while_one_runs_is_refused_and_the_first_completes(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two runs into one directory used to both write the same names, and the loser's cleanup
    removed the winner's committed files. The first run holds the archive for its whole run."""
    seal(db_url)
    wrote, go = threading.Event(), threading.Event()
    check = cli_archive._check

    def paused(to: Path, span: archives.Range) -> None:
        wrote.set()
        assert go.wait(60)
        check(to, span)

    monkeypatch.setattr(cli_archive, "_check", paused)
    first: list[object] = []
    runner = threading.Thread(
        target=lambda: first.append(archive_to(libpq(owner_url), M(-2), tmp_path, archived_by="first"))
    )
    runner.start()
    try:
        assert wrote.wait(60)
        for cutoff in (M(-2), M(-3)):
            with pytest.raises(archives.ArchiveRefused, match="another `review-queue archive` is running"):
                archive_to(libpq(owner_url), cutoff, tmp_path, archived_by="second")
    finally:
        go.set()
        runner.join(60)
    assert len(first) == 1
    assert sql.execute("SELECT first_seq, through_seq, archived_by FROM review_queue_archive").fetchall() == [
        (1, 6, "first")
    ]
    whole = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert whole.returncode == 0 and "verified 8 events" in whole.stdout, whole.stdout + whole.stderr


def test_the_apply_refuses_files_that_do_not_start_where_the_live_chain_does(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """Files planned from seq 1, applied after another archive moved the chain's start to seq 4, would
    be recorded as 4..6 while holding 1..6: the database refuses them."""
    seal(db_url)
    early, late = tmp_path / "early", tmp_path / "late"
    late.mkdir()
    with psycopg.connect(libpq(owner_url)) as owner:
        files = _files(owner, late)
        assert (files[0].first_seq, files[0].through_seq) == (1, 6)
        assert archive_to(libpq(owner_url), M(-3), early, archived_by="t").span is not None
        before = _state(sql)
        with pytest.raises(
            archives.ArchiveRefused, match="the files start at seq 1, but the live chain starts at seq 4"
        ):
            _apply(owner, files)
    assert _state(sql) == before


def test_a_file_that_is_already_there_is_never_overwritten_nor_removed(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    seal(db_url)
    theirs = tmp_path / archives.items_file(archives.range_name(1, 6))
    theirs.write_bytes(b"another database's archive\n")
    before = _state(sql)
    result = archive(db_url, owner_url, tmp_path, -2)
    assert (
        result.returncode == 1 and "is already there and is no archive of this database" in result.stderr
    ), result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == [theirs] and theirs.read_bytes() == b"another database's archive\n"
    assert _state(sql) == before


def test_a_commit_whose_outcome_is_unknown_keeps_the_files(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The connection is lost after the apply ran and before its COMMIT was acknowledged: the files
    may be the archive's now, so they stay, and the next run does not overwrite them."""
    seal(db_url)
    apply = archives.apply

    def lost(conn: psycopg.Connection, *args: object, **kwargs: object) -> int:
        removed = apply(conn, *args, **kwargs)  # type: ignore[arg-type]
        sql.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        return removed

    monkeypatch.setattr(archives, "apply", lost)
    before = _state(sql)
    with pytest.raises(archives.ArchiveUnknown, match=r"files in .* are kept"):
        archive_to(libpq(owner_url), M(-2), tmp_path, archived_by="t")
    monkeypatch.setattr(archives, "apply", apply)
    kept = sorted(tmp_path.iterdir())
    assert [p.name for p in kept] == [
        archives.events_file(archives.range_name(1, 6)),
        archives.items_file(archives.range_name(1, 6)),
    ]
    assert _state(sql) == before  # here the COMMIT was never sent
    told = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert told.returncode == 0 and "not archived (no archived range lists them)" in told.stderr, told.stderr
    assert all(path.name in told.stderr for path in kept), told.stderr
    with pytest.raises(archives.ArchiveRefused, match="is already there"):
        archive_to(libpq(owner_url), M(-2), tmp_path, archived_by="t")
    assert sorted(tmp_path.iterdir()) == kept
    for path in kept:
        path.unlink()
    assert archive_to(libpq(owner_url), M(-2), tmp_path, archived_by="t").events == 6


def test_a_default_partition_is_never_dropped(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """It has no upper bound to compare with the cutoff (its bound expression is DEFAULT)."""
    seal(db_url)
    with psycopg.connect(libpq(owner_url), autocommit=True) as owner:
        owner.execute("CREATE TABLE review_queue_event_default PARTITION OF review_queue_event DEFAULT")
    assert archive_to(libpq(owner_url), M(-2), tmp_path, archived_by="t").events == 6
    assert "review_queue_event_default" in _partitions(sql)
    assert f"review_queue_event_{M(-4):%Y_%m}" not in _partitions(sql)


def test_an_event_written_below_the_archive_is_found_when_no_chain_is_live(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """With every sealed event archived, verification still looks for an event slipped in below
    the archive's last one (in no chain, and never to be sealed)."""
    seal(db_url)
    sql.execute("UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'APPROVED', resolved_by = 'x'")
    assert archive_to(libpq(owner_url), M(-1), tmp_path, archived_by="t").events == 8
    assert run(db_url, owner_url, "audit", "verify").returncode == 0
    item = _item(sql, "z", datetime.now(UTC), "RESOLVED")
    (forged,) = sql.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, xid)"
        " SELECT id, 'RESOLVED', 'mallory', 1, trace_id, '3' FROM review_queue_item WHERE id = %s"
        " RETURNING id",
        (item,),
    ).fetchone()  # type: ignore[misc]
    assert seal(db_url) == 0
    result = run(db_url, owner_url, "audit", "verify")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN at seq 9: inserted" in result.stderr and f"event {forged}" in result.stderr, result.stderr


def test_an_export_whose_start_is_archived_meanwhile_stops_rather_than_skip(
    history: dict[str, str], db_url: str, owner_url: str, tmp_path: Path
) -> None:
    seal(db_url)

    async def pages() -> None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as conn:
                at = await audit.export_start(conn, first=1, last=8)
                page, after = await audit.export_page(conn, at=at, limit=2)
            assert page.count(b"\n") == 2 and after is not None
            await asyncio.to_thread(archive_to, libpq(owner_url), M(-2), tmp_path, archived_by="t")
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as conn:
                with pytest.raises(audit.ExportArchived, match="seq 3 was archived during the export"):
                    await audit.export_page(conn, at=after, limit=2)
        finally:
            await engine.dispose()

    asyncio.run(pages())


def test_the_apply_refuses_an_event_before_the_cutoff_outside_the_range_and_a_different_chain(
    history: dict[str, str],
    db_url: str,
    owner_url: str,
    sql: psycopg.Connection,
    event: Event,
    tmp_path: Path,
) -> None:
    """The apply's own checks, beyond what the snapshot saw: an event before the cutoff written
    after the files (not in them), and files whose last hash is not the chain's."""
    seal(db_url)
    with psycopg.connect(libpq(owner_url)) as owner:
        span, sha, items, items_sha = _files(owner, tmp_path)
        other = dataclasses.replace(span, through_hash=bytes(32))
        before = _state(sql)
        with pytest.raises(archives.ArchiveRefused, match="the chain at seq 6 is not what the file holds"):
            _apply(owner, (other, sha, items, items_sha))
        assert _state(sql) == before
        event(history["a"], "RENEWED", M(-3) + timedelta(days=1))
        before = _state(sql)
        with pytest.raises(archives.ArchiveRefused, match="is not in the range: seal first"):
            _apply(owner, (span, sha, items, items_sha))
    assert _state(sql) == before


def test_an_export_holds_the_trail_so_an_archive_cannot_drop_months_under_its_snapshot(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """The export's snapshot keeps the chain rows an archive deletes, but not the months it drops:
    the export holds the trail, and the archive that would drop a month under it is refused."""
    seal(db_url)
    before = _state(sql)

    async def export() -> bytes:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=30000) as conn:
                await audit.one_snapshot(conn)
                at = await audit.export_start(conn, first=1, last=8)
                with pytest.raises(archives.ArchiveRefused, match="the trail is in use"):
                    await asyncio.to_thread(archive_to, libpq(owner_url), M(-2), tmp_path, archived_by="t")
                page, after = await audit.export_page(conn, at=at)
            assert after is None
            return page
        finally:
            await engine.dispose()

    lines = asyncio.run(export()).splitlines()
    assert [int(line.rsplit(b'"seq":', 1)[1].rstrip(b"}")) for line in lines] == list(range(1, 9))
    assert _state(sql) == before and list(tmp_path.iterdir()) == []


def test_an_export_goes_on_past_an_event_that_is_gone_for_verification_to_name(
    client: TestClient, history: dict[str, str], db_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """A sealed event deleted behind the triggers' back is not an archive: the export leaves its
    line out and goes on, and the file does not verify."""
    seal(db_url)
    with sql.transaction():
        sql.execute("SET LOCAL session_replication_role = replica")
        sql.execute(
            "DELETE FROM review_queue_event"
            " WHERE id = (SELECT event_id FROM review_queue_chain WHERE seq = 2)"
        )
    auditor = {"Authorization": f"Bearer {create_token(db_url, 'audrey', 'auditor')}"}
    answer = client.get("/audit/export", params={"from": 1}, headers=auditor)
    assert answer.status_code == 200, answer.text[:300]
    assert len(answer.content.splitlines()) == 7
    exported = tmp_path / "export.ndjson"
    exported.write_bytes(answer.content)
    check = run(db_url, db_url, "audit", "verify", "--file", str(exported))
    assert check.returncode == 1 and "BROKEN at seq 2" in check.stderr, check.stdout + check.stderr


def test_verify_hashes_the_items_file_too(
    history: dict[str, str], db_url: str, owner_url: str, tmp_path: Path
) -> None:
    """One byte of the items file changed (the events file intact, so its chain still verifies):
    only the sha256 recorded at the archive sees it."""
    seal(db_url)
    assert archive(db_url, owner_url, tmp_path, -2).returncode == 0
    (items,) = [p for p in tmp_path.iterdir() if p.name.startswith("items-")]
    original = items.read_bytes()
    assert b"ACME-CORP" in original
    items.write_bytes(original.replace(b"ACME-CORP", b"ACME-CORQ", 1))
    broken = run(db_url, owner_url, "audit", "verify", "--archive", str(tmp_path))
    assert broken.returncode == 1 and "modified" in broken.stderr and items.name in broken.stderr, (
        broken.stdout + broken.stderr
    )


def test_verify_checks_that_each_archive_continues_the_one_before(
    history: dict[str, str], db_url: str, owner_url: str, sql: psycopg.Connection, tmp_path: Path
) -> None:
    """The second archive's events rechained from another starting hash: a file that verifies on
    its own, at the right seqs, listed with its own sha256 and last hash (as an owner rewriting the
    list could make it), is still refused because it does not link to the first archive's end."""
    seal(db_url)
    assert archive(db_url, owner_url, tmp_path, -3).returncode == 0
    assert archive(db_url, owner_url, tmp_path, -2).returncode == 0
    with psycopg.connect(libpq(owner_url)) as owner:
        first, second = archives.archived(owner)
    assert archives.verify_files([first, second], tmp_path) == (6, None)
    path = tmp_path / archives.events_file(second.name)
    previous, lines = b"\x01" * 32, []
    for raw in path.read_bytes().splitlines(keepends=True):
        line = json.loads(raw)
        fields = chain._event_of(line)
        digest = chain.link(previous, fields)
        lines.append(chain.export_line(line["seq"], previous, digest, fields))
        previous = digest
    path.write_bytes(b"".join(lines))
    forged = dataclasses.replace(second, events_sha256=archives.file_sha256(path), through_hash=previous)
    total, broken = archives.verify_files([first, forged], tmp_path)
    assert broken is not None and (broken.seq, broken.kind) == (4, "missing"), broken
    assert "does not continue" in broken.detail and total == 3, (total, broken)
