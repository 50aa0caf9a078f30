"""make bench's harness: the seeds, databases, tokens, the API process and what it costs (CPU, memory).
The bench takes nothing from tests/ (it ships in the wheel); what both use, the tests take from here
or from bench/receiver.py."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from api.setting_values import parse_sla_tiers
from db import tokens
from db.engine import libpq_url as libpq
from db.migrations import upgrade_head
from db.vocabulary import DEFAULT_BASE_CURRENCY, DEFAULT_SLA_TIERS

# What the service passes to an enqueue (its settings' defaults), for benches that enqueue directly.
SLA_TIERS, BASE_CURRENCY = parse_sla_tiers(DEFAULT_SLA_TIERS), DEFAULT_BASE_CURRENCY

# The seed's statements, verbatim but for completion: this schema's CHECK constraint wants a
# resolution and resolver on RESOLVED rows, so the raw loop sets them as the service does.
SEED_LEASE = """
WITH candidate AS (
    SELECT id FROM review_queue_item
    WHERE state = 'PENDING'
    ORDER BY created_at
    LIMIT %(batch_size)s
    FOR UPDATE SKIP LOCKED
)
UPDATE review_queue_item AS rq
SET state = 'ASSIGNED', leased_by = %(worker_id)s, leased_at = now(),
    lease_expires_at = now() + make_interval(secs => %(lock_timeout_ms)s / 1000.0)
FROM candidate
WHERE rq.id = candidate.id
RETURNING rq.id, rq.idempotency_key, rq.ledger_entity, rq.variance_amount,
          rq.match_decision, rq.trace_id, rq.source_hash;
"""


SEED_COMPLETE = """
UPDATE review_queue_item
SET state = 'RESOLVED', resolution = 'APPROVED', resolved_by = %(worker_id)s, resolved_at = now()
WHERE id = %(item_id)s AND state = 'ASSIGNED' AND leased_by = %(worker_id)s
RETURNING id, idempotency_key, trace_id, source_hash, match_decision;
"""


# Deadlines as the SLA tiers make them (created_at plus 1 to 7 days, interleaved), so that the
# lease's due order is not the table's physical order.
SEED_PENDING = """
INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision, source_hash,
                               created_at, due_at)
SELECT %(prefix)s || i, %(entity)s, 12.50, 'UNMATCHED', 'hash-' || i, now() + i * interval '1 microsecond',
       now() + i * interval '1 microsecond' + (1 + i %% 7) * interval '1 day'
FROM generate_series(1, %(count)s) i
"""

# The same pending work in one currency (the conversion run: every completion then converts its
# amount at the currency's latest rate, which SET_RATE gives it).
SEED_PENDING_IN = """
INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, currency, match_decision,
                               source_hash, created_at, due_at)
SELECT %(prefix)s || i, %(entity)s, 12.50, %(currency)s, 'UNMATCHED', 'hash-' || i,
       now() + i * interval '1 microsecond',
       now() + i * interval '1 microsecond' + (1 + i %% 7) * interval '1 day'
FROM generate_series(1, %(count)s) i
"""
SET_RATE = "INSERT INTO fx_rate (currency, rate, set_by) VALUES (%(currency)s, %(rate)s, 'bench')"

# (e): the pending work of 19 other ledger entities, beside the one leased from.
SEED_OTHER_ENTITIES = """
INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision, source_hash,
                               created_at, due_at)
SELECT 'other-' || i, 'ENTITY-' || (i %% 19), 12.50, 'UNMATCHED', 'h', now() + i * interval '1 microsecond',
       now() + (1 + i %% 7) * interval '1 day'
FROM generate_series(1, %(count)s) i
"""


SEED_ASSIGNED_AT_HEAD = """
INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision, source_hash,
                               state, leased_by, leased_at, lease_expires_at, lease_epoch, created_at)
SELECT 'open-' || i, 'ACME-CORP', 1, 'PARTIAL', 'h', 'ASSIGNED', 'holder-' || (i %% 50), now(),
       now() + interval '1 day', 1, now() - interval '30 days' + i * interval '1 millisecond'
FROM generate_series(1, %(count)s) i
"""


# (b) is (d) with the open leases resolved: the same 1,000,000 rows of history, none open.
RESOLVE_OPEN = """
UPDATE review_queue_item
SET state = 'RESOLVED', resolution = 'OK', resolved_by = leased_by, resolved_at = now()
WHERE idempotency_key LIKE 'open-%%'
"""


SEED_RESOLVED_HISTORY = """
INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision, source_hash,
                               state, leased_by, leased_at, lease_expires_at, lease_epoch, resolution,
                               resolved_by, resolved_at, created_at)
SELECT 'done-' || i, 'ACME-CORP', 1, 'MATCHED', 'h', 'RESOLVED', 'r', now(), now(), 1, 'OK', 'r', now(),
       now() - interval '400 days' + i * interval '10 milliseconds'
FROM generate_series(1, %(count)s) i
"""


def total_size(table: str) -> str:
    """SQL for a table's bytes on disk (heap, TOAST, indexes) with all its partitions: a partitioned
    table's own pg_total_relation_size is 0."""
    # pg_partition_tree has no row for a table that is not partitioned.
    return (
        f"coalesce((SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('{table}')),"
        f" pg_total_relation_size('{table}'))::bigint"
    )


def drop_databases(server: str, *names: str) -> None:
    """Drop the bench's databases, whoever is still connected to them."""
    with psycopg.connect(libpq(server, "postgres"), autocommit=True) as conn:
        for name in names:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def database_url(server: str, name: str) -> str:
    return make_url(server).set(database=name).render_as_string(hide_password=False)


def fresh_database(server: str, name: str) -> str:
    drop_databases(server, name)
    with psycopg.connect(libpq(server, "postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = database_url(server, name)
    upgrade_head(url)
    return url


def run_sql(url: str, statement: str, params: dict[str, Any] | None = None, *, vacuum: bool = False) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(statement, params)
        if vacuum:
            conn.execute("VACUUM ANALYZE review_queue_item")


def insert_token(conn: psycopg.Connection[Any], subject: str, role: str) -> str:
    """A real token stored through a connection the caller holds, by db.tokens' own INSERT (as
    `review-queue token create` stores one); the tests make theirs with it too."""
    token, statement = tokens.new_token(subject=subject, role=role)
    compiled = statement.compile(dialect=PGDialect_psycopg())  # type: ignore[no-untyped-call]
    conn.execute(str(compiled), compiled.params)
    return token


def create_token(url: str, subject: str, role: str) -> str:
    """A real token stored in the database at `url`, through a connection of its own."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        return insert_token(conn, subject, role)


def reviewer_tokens(url: str, count: int) -> list[str]:
    """Real reviewer tokens bench-0 .. bench-N."""
    return [create_token(url, f"bench-{n}", "reviewer") for n in range(count)]


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


class PostgresCpu:
    """CPU seconds of the PostgreSQL server, measured on its own processes when it runs on this
    machine: the postmaster, its live children, and, through the postmaster's children_* times,
    every backend that has already exited. Other load on a shared machine does not count."""

    def __init__(self, url: str) -> None:
        self.postmaster: psutil.Process | None = None
        try:
            with psycopg.connect(libpq(url)) as conn:
                row = conn.execute("SELECT pg_backend_pid()").fetchone()
                parent = psutil.Process(row[0] if row else -1).parent()
            # A server on another host has a pid that means nothing here.
            if parent is not None and "postgres" in parent.name():
                self.postmaster = parent
        except (psutil.Error, psycopg.Error, ValueError):
            pass

    def seconds(self) -> float | None:
        if self.postmaster is None:
            return None
        try:
            own = self.postmaster.cpu_times()
            children = self.postmaster.children(recursive=True)
        except psutil.Error:
            return None
        return float(own.user + own.system + own.children_user + own.children_system) + cpu_seconds(children)


def per_item_ms(seconds: float | None, items: int) -> float | None:
    return None if seconds is None else round(seconds / items * 1000, 3)


# --- the API, in its own process -----------------------------------------------------------------


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base: str
    log: Path


def start_server(
    url: str, workers: int, port: int, *, sealer: bool = False, env: dict[str, str] | None = None
) -> Server:
    """The API; with `sealer`, beside the reclaimer child sealing the audit chain every second
    (the shortest interval: the most the sealer can cost the API)."""
    log = Path(tempfile.mkstemp(prefix="rq-bench-server-", suffix=".log")[1])
    process = subprocess.Popen(  # noqa: S603 - our own CLI, fixed arguments
        [
            sys.executable,
            "-m",
            "cli",
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--reclaimer" if sealer else "--no-reclaimer",
        ],
        env={**os.environ, "DATABASE_URL": url, "REVIEW_QUEUE_RECLAIM_INTERVAL_S": "1", **(env or {})},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return Server(process, base, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise SystemExit(f"the API did not start; see {log}")


def stop_server(server: Server) -> None:
    server.process.terminate()
    server.process.wait(timeout=30)


class MemorySampler(threading.Thread):
    """Peak resident memory of each process of the server tree, sampled every 100 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.root, self.peaks, self.stop = psutil.Process(pid), dict[int, int](), threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.1):
            for proc in [self.root, *self.root.children(recursive=True)]:
                try:
                    if proc.cmdline()[-1:] == ["reclaimer"]:  # a reclaimer child is not the API
                        continue
                    self.peaks[proc.pid] = max(self.peaks.get(proc.pid, 0), proc.memory_info().rss)
                except psutil.Error:
                    pass


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))
