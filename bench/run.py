"""make bench: the HTTP API against the raw-SQL ceiling, and dequeue latency as history grows.

Everything runs on one PostgreSQL (embedded by default, DATABASE_URL otherwise), side by side in
one run, and is reported as ratios: absolute numbers on a shared 2-core machine mean little.
"""

import asyncio
import itertools
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import httpx
import psutil
import psycopg
import typer
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url

from api.settings import get_settings
from bench import reports as report_bench
from bench import stats as stats_bench
from bench import wakeup
from cli.common import owner_url
from db.engine import libpq_url as libpq
from db.migrations import upgrade_head
from db.queue.lease import _LEASE

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

app = typer.Typer(add_completion=False)


def fresh_database(server: str, name: str) -> str:
    with psycopg.connect(libpq(server, "postgres"), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    url = make_url(server).set(database=name).render_as_string(hide_password=False)
    upgrade_head(url)
    return url


def run_sql(url: str, statement: str, params: dict[str, Any] | None = None, *, vacuum: bool = False) -> None:
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(statement, params)
        if vacuum:
            conn.execute("VACUUM ANALYZE review_queue_item")


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
        return float(own.user + own.system + own.children_user + own.children_system) + _cpu_seconds(children)


def _per_item_ms(seconds: float | None, items: int) -> float | None:
    return None if seconds is None else round(seconds / items * 1000, 3)


# --- 1. the raw-SQL ceiling -------------------------------------------------------------------


def _raw_worker(url: str, name: str, batch: int, barrier: Any, out: Any) -> None:
    done = 0
    with psycopg.connect(url) as conn:
        barrier.wait()
        while True:
            rows = conn.execute(
                SEED_LEASE, {"batch_size": batch, "worker_id": name, "lock_timeout_ms": 30_000}
            ).fetchall()
            conn.commit()  # the seed commits the lease at once; the lease columns are the guard
            if not rows:
                break
            for row in rows:
                conn.execute(SEED_COMPLETE, {"item_id": row[0], "worker_id": name}).fetchone()
                conn.commit()
                done += 1
    out.put(done)


def raw_ceiling(url: str, clients: int, items: int, batch: int) -> dict[str, Any]:
    run_sql(url, SEED_PENDING, {"prefix": "raw-", "entity": "ACME-CORP", "count": items}, vacuum=True)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(clients + 1, timeout=600), ctx.Queue()  # spawning is slow on a loaded machine
    workers = [
        ctx.Process(target=_raw_worker, args=(libpq(url), f"raw-{n}", batch, barrier, out))
        for n in range(clients)
    ]
    for w in workers:
        w.start()
    postgres = PostgresCpu(url)
    barrier.wait()
    pg0, machine0, started = postgres.seconds(), _machine_busy_seconds(), time.perf_counter()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"a raw client failed (exit {w.exitcode})")
    elapsed = time.perf_counter() - started
    machine_s = _machine_busy_seconds() - machine0
    time.sleep(1)  # the clients' backends have exited; let the postmaster reap them into its times
    pg1 = postgres.seconds()
    done = sum(out.get() for _ in workers)
    assert done == items, f"raw loop resolved {done} of {items}"
    return {
        "items": done,
        "seconds": round(elapsed, 2),
        "items_per_s": round(done / elapsed, 1),
        "cpu_ms_per_item": round(machine_s / done * 1000, 3),
        "postgres_cpu_ms_per_item": _per_item_ms(None if pg0 is None or pg1 is None else pg1 - pg0, done),
        "machine_busy_cores": round(machine_s / elapsed, 2),
    }


# --- 2. the API -------------------------------------------------------------------------------


def create_tokens(url: str, count: int) -> list[str]:
    tokens = []
    for n in range(count):
        result = subprocess.run(  # noqa: S603 - our own CLI, fixed arguments
            [sys.executable, "-m", "cli", "token", "create", "--subject", f"bench-{n}", "--role", "reviewer"],
            env={**os.environ, "DATABASE_URL": url},
            capture_output=True,
            text=True,
            check=True,
        )
        tokens.append(result.stdout.strip().splitlines()[-1])
    return tokens


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


@dataclass
class ApiRun:
    lease_s: list[float] = field(default_factory=list)
    complete_s: list[float] = field(default_factory=list)  # one per complete request
    finished_at: list[float] = field(default_factory=list)  # one per item resolved
    errors: int = 0


async def _api_client(
    base: str, token: str, batch: int, run: ApiRun, start: asyncio.Event, batch_complete: bool = False
) -> None:
    # aiohttp, not httpx: at ~1000 requests/s the client's own CPU matters on 2 cores, and
    # aiohttp's C parser costs about half of httpx's per request (measured in this bench).
    headers = {"Authorization": f"Bearer {token}"}
    connector = aiohttp.TCPConnector(limit=1)  # one keep-alive connection per client
    async with aiohttp.ClientSession(base, headers=headers, connector=connector) as http:
        async with http.get("/healthz") as warm:  # open the keep-alive connection now
            await warm.read()
        await start.wait()
        while True:
            t0 = time.perf_counter()
            async with http.post("/leases", json={"batch_size": batch}) as response:
                body = await response.json()
                run.lease_s.append(time.perf_counter() - t0)
            if response.status != 200:
                run.errors += 1
                continue
            if not body["items"]:
                return
            if batch_complete:  # the whole lease in one POST /items/complete
                entries = [
                    {"id": i["id"], "resolution": "APPROVED", "lease_token": i["lease_token"]}
                    for i in body["items"]
                ]
                t0 = time.perf_counter()
                async with http.post("/items/complete", json={"items": entries}) as done:
                    results = (await done.json())["results"]
                t1 = time.perf_counter()
                run.complete_s.append(t1 - t0)
                run.finished_at += [t1] * sum(r["outcome"] == "resolved" for r in results)
                if done.status != 200 or any(r["outcome"] != "resolved" for r in results):
                    run.errors += 1
                continue
            for item in body["items"]:
                t0 = time.perf_counter()
                payload = {"resolution": "APPROVED", "lease_token": item["lease_token"]}
                async with http.post(f"/items/{item['id']}/complete", json=payload) as done:
                    await done.read()
                t1 = time.perf_counter()
                run.complete_s.append(t1 - t0)
                run.finished_at.append(t1)
                if done.status != 200:
                    run.errors += 1


def _cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for proc in processes:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.Error:
            pass
    return total


def _machine_busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def api_throughput(
    server: Server, tokens: list[str], items: int, batch: int, url: str, *, batch_complete: bool = False
) -> dict[str, Any]:
    run = ApiRun()
    postgres = PostgresCpu(url)
    sampler = MemorySampler(server.process.pid)
    sampler.start()
    root = psutil.Process(server.process.pid)
    api_processes = [root, *root.children(recursive=True)]
    api0, machine0, pg0 = _cpu_seconds(api_processes), _machine_busy_seconds(), postgres.seconds()
    cpu0, started = time.process_time(), time.perf_counter()

    async def main() -> None:
        start = asyncio.Event()
        clients = []
        for token in tokens:
            # Connect one client at a time, as real reviewers arrive: a burst of simultaneous
            # connects is accepted by whichever worker wakes first, all of them on one process.
            clients.append(
                asyncio.create_task(_api_client(server.base, token, batch, run, start, batch_complete))
            )
            await asyncio.sleep(0.05)
        start.set()
        await asyncio.gather(*clients)

    asyncio.run(main())
    elapsed = time.perf_counter() - started
    loadgen_s = time.process_time() - cpu0
    loadgen_cpu = loadgen_s / elapsed
    api_s, machine_s = _cpu_seconds(api_processes) - api0, _machine_busy_seconds() - machine0
    pg1 = postgres.seconds()
    pg_s = None if pg0 is None or pg1 is None else pg1 - pg0
    sampler.stop.set()
    sampler.join()
    assert len(run.finished_at) == items and run.errors == 0, (
        f"{len(run.finished_at)} done, {run.errors} errors"
    )
    quarters = [started + elapsed * q / 4 for q in range(5)]
    decay = [
        round(sum(1 for t in run.finished_at if lo <= t < hi) / (hi - lo), 1)
        for lo, hi in itertools.pairwise(quarters)
    ]
    ms = 1000.0
    return {
        "items": items,
        "seconds": round(elapsed, 2),
        "items_per_s": round(items / elapsed, 1),
        "items_per_s_by_quarter": decay,
        "lease_p50_ms": round(percentile(run.lease_s, 50) * ms, 2),
        "lease_p99_ms": round(percentile(run.lease_s, 99) * ms, 2),
        "complete_p50_ms": round(percentile(run.complete_s, 50) * ms, 2),
        "complete_p99_ms": round(percentile(run.complete_s, 99) * ms, 2),
        "loadgen_cpu_cores": round(loadgen_cpu, 2),
        # Where the machine's CPU went, per item resolved: the API's processes, the load
        # generator, and everything else (PostgreSQL, mostly).
        "cpu_ms_per_item": {
            "api": round(api_s / items * 1000, 3),
            "load_generator": round(loadgen_s / items * 1000, 3),
            "postgres_and_rest": round((machine_s - api_s - loadgen_s) / items * 1000, 3),
            # Measured on PostgreSQL's own processes (None when it runs elsewhere).
            "postgres": _per_item_ms(pg_s, items),
        },
        "machine_busy_cores": round(machine_s / elapsed, 2),
        "peak_rss_mb_per_process": sorted(round(v / 2**20, 1) for v in sampler.peaks.values()),
    }


def api_run(
    server_url: str,
    name: str,
    *,
    clients: int,
    items: int,
    batch: int,
    workers: int,
    port: int,
    sealer: bool,
    batch_complete: bool = False,
) -> tuple[dict[str, Any], str]:
    """One HTTP run on a fresh database: `clients` clients drain `items` items. (results, its URL)"""
    url = fresh_database(server_url, name)
    run_sql(url, SEED_PENDING, {"prefix": "api-", "entity": "ACME-CORP", "count": items}, vacuum=True)
    tokens = create_tokens(url, clients)
    server = start_server(url, workers, port, sealer=sealer)
    try:
        return api_throughput(server, tokens, items, batch, url, batch_complete=batch_complete), url
    finally:
        stop_server(server)


# --- the floor: a bare FastAPI route and one psycopg round trip ---------------------------------


async def _floor_client(base: str, requests: int, latencies: list[float], start: asyncio.Event) -> None:
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(base, connector=connector) as http:
        async with http.post(f"/items/{uuid.uuid4()}/complete", json={"resolution": "APPROVED"}) as warm:
            await warm.read()
        await start.wait()
        for _ in range(requests):
            t0 = time.perf_counter()
            body = {"resolution": "APPROVED", "lease_token": "x" * 43}
            async with http.post(f"/items/{uuid.uuid4()}/complete", json=body) as done:
                await done.read()
                assert done.status == 200, await done.text()
            latencies.append(time.perf_counter() - t0)


def floor(url: str, workers: int, port: int, clients: int, items: int) -> dict[str, Any]:
    """Requests/s of bench/floor_app.py, `clients` aiohttp clients sending `items` requests in all."""
    log = Path(tempfile.mkstemp(prefix="rq-bench-floor-", suffix=".log")[1])
    process = subprocess.Popen(  # noqa: S603 - fixed arguments
        [sys.executable, "-m", "uvicorn", "bench.floor_app:app", "--port", str(port), "--host", "127.0.0.1",
         "--workers", str(workers), "--no-access-log", "--log-level", "warning"],
        env={**os.environ, "FLOOR_DATABASE_URL": libpq(url)}, stdout=log.open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/docs", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        latencies: list[float] = []

        async def main() -> None:
            start = asyncio.Event()
            tasks = []
            for _ in range(clients):
                tasks.append(asyncio.create_task(_floor_client(base, items // clients, latencies, start)))
                await asyncio.sleep(0.05)
            start.set()
            await asyncio.gather(*tasks)

        started = time.perf_counter()
        asyncio.run(main())
        elapsed = time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(timeout=30)
    return {
        "items_per_s": round(len(latencies) / elapsed, 1),
        "p50_ms": round(percentile(latencies, 50) * 1000, 2),
    }


# --- 6. bytes on disk ---------------------------------------------------------------------------

_SIZES = """
SELECT pg_total_relation_size('review_queue_item'), pg_total_relation_size('review_queue_event'),
       (SELECT count(*) FROM review_queue_item), (SELECT count(*) FROM review_queue_event)
"""


def storage(url: str) -> dict[str, Any]:
    """Bytes per item and per audit event (heap, TOAST and indexes: pg_total_relation_size), as the
    run left them (dead row versions of the churn included, as autovacuum would keep them) and
    compacted by VACUUM FULL (the live rows alone)."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE review_queue_item")
        conn.execute("VACUUM ANALYZE review_queue_event")
        item_b, event_b, items, events = conn.execute(_SIZES).fetchone() or (0, 0, 0, 0)
        conn.execute("VACUUM FULL review_queue_item")
        conn.execute("VACUUM FULL review_queue_event")
        item_full, event_full, _, _ = conn.execute(_SIZES).fetchone() or (0, 0, 0, 0)
    return {
        "items": items,
        "events": events,
        "item_bytes": round(item_b / items),
        "item_bytes_compacted": round(item_full / items),
        "event_bytes": round(event_b / events),
        "event_bytes_compacted": round(event_full / events),
    }


# --- 4. dequeue scaling -----------------------------------------------------------------------


def lease_latencies(
    server: Server, token: str, url: str, samples: int, ledger_entity: str | None = None
) -> list[float]:
    """Sequential POST /leases of 20 (of one ledger entity, when given); the leased items are
    resolved in SQL, untimed, in between."""
    latencies = []
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=server.base, headers=headers) as http,
        psycopg.connect(libpq(url), autocommit=True) as sql,
    ):
        for n in range(samples + 10):
            t0 = time.perf_counter()
            response = http.post(
                "/leases",
                json={"batch_size": 20, **({"ledger_entity": ledger_entity} if ledger_entity else {})},
            )
            elapsed = time.perf_counter() - t0
            items = response.json()["items"]
            assert len(items) == 20, response.text
            if n >= 10:  # warm-up
                latencies.append(elapsed)
            sql.execute(
                "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'OK',"
                " resolved_by = leased_by, resolved_at = now() WHERE id = ANY(%s)",
                ([i["id"] for i in items],),
            )
    return latencies


def raw_lease_p50(url: str, samples: int) -> float:
    """The service's own lease statement, run directly and rolled back (so the queue is unchanged)."""
    compiled = _LEASE.compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
    params = compiled.construct_params(
        {"actor": "raw-probe", "batch_size": 20, "cap": 10_000, "lease_duration": timedelta(seconds=30)}
    )
    latencies = []
    with psycopg.connect(libpq(url)) as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            conn.execute(str(compiled), params).fetchall()
            latencies.append(time.perf_counter() - t0)
            conn.rollback()
    return statistics.median(latencies) * 1000


def dequeue_scaling(server_url: str, workers: int, port: int, samples: int) -> dict[str, Any]:
    url = fresh_database(server_url, "rq_bench_dequeue")
    leases = (samples + 10) * 20  # items one scenario leases
    run_sql(
        url, SEED_PENDING, {"prefix": "p-", "entity": "ACME-CORP", "count": leases * 4 + 1000}, vacuum=True
    )
    (token,) = create_tokens(url, 1)
    server = start_server(url, workers, port)
    result: dict[str, Any] = {}
    try:
        scenarios = [
            ("a_empty_history", None),
            ("c_10k_assigned_at_head", (SEED_ASSIGNED_AT_HEAD, {"count": 10_000})),
            ("d_both", (SEED_RESOLVED_HISTORY, {"count": 1_000_000})),
            ("b_1m_resolved", (RESOLVE_OPEN, {})),
            ("e_one_entity_of_20", (SEED_OTHER_ENTITIES, {"count": 20_000})),
        ]  # fmt: skip
        for name, change in scenarios:
            if change:
                run_sql(url, change[0], change[1], vacuum=True)
            entity = None
            if name == "e_one_entity_of_20":  # (b)'s history, 20,000 items of 19 other entities pending
                entity = "ROUTED"
                run_sql(
                    url, SEED_PENDING, {"prefix": "e-", "entity": entity, "count": leases + 100}, vacuum=True
                )
            latencies = lease_latencies(server, token, url, samples, entity)
            result[name] = {
                "p50_ms": round(percentile(latencies, 50) * 1000, 2),
                "p99_ms": round(percentile(latencies, 99) * 1000, 2),
            }
            if name == "d_both":
                result["raw_statement_p50_ms_d"] = round(raw_lease_p50(url, samples), 3)
                # The seed's index shape (PENDING and ASSIGNED rows in one index; on the lease's
                # order, due_at then created_at) instead of the split ones, same data: what the
                # split buys.
                run_sql(url, "DROP INDEX ix_review_queue_item_pending_due")
                run_sql(url, "CREATE INDEX seed_dequeue ON review_queue_item (due_at, created_at)"
                             " WHERE state IN ('PENDING', 'ASSIGNED')", vacuum=True)  # fmt: skip
                result["raw_statement_p50_ms_d_seed_index"] = round(raw_lease_p50(url, samples), 3)
                run_sql(url, "DROP INDEX seed_dequeue")
                run_sql(url, "CREATE INDEX ix_review_queue_item_pending_due ON review_queue_item"
                             " (due_at, created_at) WHERE state = 'PENDING'", vacuum=True)  # fmt: skip
    finally:
        stop_server(server)
    base = result["a_empty_history"]["p50_ms"]
    for name in ("b_1m_resolved", "c_10k_assigned_at_head", "d_both", "e_one_entity_of_20"):
        result[name]["p50_ratio_to_a"] = round(result[name]["p50_ms"] / base, 2)
    return result


# --- 6. work arrives by itself ------------------------------------------------------------------


def work_arrives(
    server_url: str, port: int, poll_interval_ms: int, samples: int, seconds: float
) -> dict[str, Any]:
    url = fresh_database(server_url, "rq_bench_wakeup")
    reviewer, admin = create_tokens(url, 1)[0], _admin_token(url)
    server = start_server(url, 1, port)
    try:
        result: dict[str, Any] = {
            "latency": wakeup.wakeup_latency(
                server.base, reviewer, admin, samples=samples, poll_interval_ms=poll_interval_ms
            ),
            "poll_interval_ms": poll_interval_ms,
        }
    finally:
        stop_server(server)
    notify_url = fresh_database(server_url, "rq_bench_notify")
    result["notify"] = wakeup.notify_cost(notify_url, producers=4, consumers=4, seconds=seconds)
    with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
        for name in ("rq_bench_wakeup", "rq_bench_notify"):
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return result


def _admin_token(url: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "cli", "token", "create", "--subject", "bench-admin", "--role", "admin"],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.strip().splitlines()[-1]


def report_wakeup(w: dict[str, Any]) -> str:
    lat, n = w["latency"], w["notify"]
    on, off = n["with_notify"], n["without_notify"]
    return "\n".join(
        [
            "6. work arrives by itself (enqueue -> lease answer, one reviewer waiting):",
            f"     long poll (wait_s, LISTEN/NOTIFY)   p50 {lat['long_poll']['p50_ms']} ms, "
            f"p99 {lat['long_poll']['p99_ms']} ms, max {lat['long_poll']['max_ms']} ms",
            f"     polling every {w['poll_interval_ms']} ms +-20 %        p50 {lat['polling']['p50_ms']} ms, "
            f"p99 {lat['polling']['p99_ms']} ms, max {lat['polling']['max_ms']} ms",
            "   NOTIFY cost (4 producers enqueueing, 4 consumers leasing and completing,"
            " one item per transaction):",
            f"     enqueued/s   with NOTIFY {on['enqueued_per_s']}, without {off['enqueued_per_s']}"
            f"   (x{n['enqueue_ratio']})",
            f"     completed/s  with NOTIFY {on['completed_per_s']}, without {off['completed_per_s']}"
            f"   (x{n['complete_ratio']})",
        ]
    )


# --- report -------------------------------------------------------------------------------------


# --- 6. the audit chain ----------------------------------------------------------------------

SEED_EVENTS = """
INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details)
SELECT i.id, 'RESOLVED', 'alice', 1, i.trace_id,
       jsonb_build_object('resolution', 'APPROVED', 'note', 'FX rounding ' || g)
FROM review_queue_item i, generate_series(1, %(per_item)s) g
"""


def audit_chain(server_url: str, events: int) -> dict[str, Any]:
    """Seal and verify `events` events: the sealer's catch-up rate and `audit verify`'s speed."""
    from cli import reclaimer
    from db import audit

    url = fresh_database(server_url, "rq_bench_audit")
    run_sql(url, SEED_PENDING, {"prefix": "audit-", "entity": "ACME-CORP", "count": 1000})
    run_sql(url, SEED_EVENTS, {"per_item": max(1, events // 1000)}, vacuum=True)
    settings = get_settings().model_copy(update={"statement_timeout_ms": 600_000})
    started = time.perf_counter()
    sealed = asyncio.run(reclaimer.seal_once(settings, url))
    seal_s = time.perf_counter() - started
    with psycopg.connect(libpq(url)) as conn:
        cpu0 = time.process_time()
        result = audit.verify(conn)
        verify_cpu = time.process_time() - cpu0
    assert result.broken is None and result.events == sealed, result
    return {
        "events": sealed,
        "seal_s": round(seal_s, 1),
        "sealed_per_s": round(sealed / seal_s),
        "verify_s": round(result.seconds, 1),
        "verified_per_s": round(sealed / result.seconds),
        "verify_python_cpu_s": round(verify_cpu, 1),
    }


def _extra_rows(results: dict[str, Any]) -> list[str]:
    """The batched row (2b) and the one-client row (2c), when they ran."""
    lines = []
    raw = results.get("raw")
    if "batched" in results:
        b = results["batched"]
        ratio = f"x{results['batched_raw_ratio']} of raw" if raw else ""
        lines += [
            f"{'2b. HTTP API, POST /items/complete':38}{b['items_per_s']:>10}"
            f"   {ratio}   (target >= x1.5; {results['complete_batch']} items per lease and per completion)",
            f"{'     POST /items/complete':38}{'':>10}{b['complete_p50_ms']:>10}{b['complete_p99_ms']:>10}"
            f"   CPU per item (ms): API {b['cpu_ms_per_item']['api']},"
            f" PostgreSQL {b['cpu_ms_per_item']['postgres']}",
        ]
    if "one_client" in results:
        one = results["one_client"]
        lines += [
            f"{'2c. HTTP API, 1 client':38}{one['items_per_s']:>10}",
            f"{'     POST /items/{id}/complete':38}{'':>10}{one['complete_p50_ms']:>10}"
            f"{one['complete_p99_ms']:>10}   (target p50 <= 1.5 ms; API CPU per item"
            f" {one['cpu_ms_per_item']['api']} ms)",
        ]
    return lines


def report_throughput(results: dict[str, Any]) -> str:
    """--throughput-only: the raw, per-item, batched and one-client rows of one run, as ratios."""
    raw, api = results["raw"], results["api"]
    lines = [
        f"review-queue bench (throughput)  {results['clients']} clients, {results['items']} items, "
        f"batch {results['batch']}, {results['workers']} API worker(s), {results['machine']}, "
        f"load average at start {results['loadavg']}",
        "",
        f"{'':38}{'items/s':>10}{'p50 ms':>10}{'p99 ms':>10}",
        f"{'1. raw SQL (seed loop, psycopg)':38}{raw['items_per_s']:>10}"
        f"   ({raw['cpu_ms_per_item']} ms CPU per item, {raw['postgres_cpu_ms_per_item']} of it PostgreSQL)",
        f"{'2. HTTP API, per item':38}{api['items_per_s']:>10}   x{results['api_raw_ratio']} of raw"
        "   (target >= x0.35)",
        f"{'     POST /leases':38}{'':>10}{api['lease_p50_ms']:>10}{api['lease_p99_ms']:>10}",
        f"{'     POST /items/{id}/complete':38}{'':>10}"
        f"{api['complete_p50_ms']:>10}{api['complete_p99_ms']:>10}",
        f"     CPU per item (ms): API {api['cpu_ms_per_item']['api']}, load generator "
        f"{api['cpu_ms_per_item']['load_generator']}, PostgreSQL {api['cpu_ms_per_item']['postgres']}; "
        f"machine busy {api['machine_busy_cores']} cores",
        *_extra_rows(results),
    ]
    if "floor" in results:
        fl, fl1 = results["floor"], results["floor_one_client"]
        lines += [
            f"{'F. floor: bare FastAPI + 1 round trip':38}{fl['items_per_s']:>10}{fl['p50_ms']:>10}"
            f"   x{results['floor_raw_ratio']} of raw: the most any per-item HTTP row can reach here",
            f"{'   the same, 1 client':38}{fl1['items_per_s']:>10}{fl1['p50_ms']:>10}",
        ]
    return "\n".join(lines)


def report_dequeue(dq: dict[str, Any]) -> list[str]:
    lines = ["4. POST /leases (batch 20) as the table grows:"]
    for name, label in [
        ("a_empty_history", "(a) empty history"),
        ("b_1m_resolved", "(b) 1,000,000 RESOLVED rows"),
        ("c_10k_assigned_at_head", "(c) 10,000 ASSIGNED at the head"),
        ("d_both", "(d) both"),
        ("e_one_entity_of_20", "(e) (b), ledger_entity 1 of 20"),
    ]:
        ratio = dq[name].get("p50_ratio_to_a", 1.0)
        lines.append(
            f"     {label:<33}{'':>10}{dq[name]['p50_ms']:>10}{dq[name]['p99_ms']:>10}   x{ratio} of (a)"
        )
    lines.append(
        f"     lease statement alone in (d): {dq['raw_statement_p50_ms_d']} ms with the split indexes, "
        f"{dq['raw_statement_p50_ms_d_seed_index']} ms with the seed's index shape"
    )
    return lines


def report(results: dict[str, Any]) -> str:
    if "raw" not in results:
        api = results["api"]
        return (
            f"review-queue bench (API only)  {results['clients']} clients, {results['items']} items, "
            f"sealer {'on' if results['sealer'] else 'off'}\n"
            f"HTTP API {api['items_per_s']} items/s; POST /items/{{id}}/complete p50 "
            f"{api['complete_p50_ms']} ms, p99 {api['complete_p99_ms']} ms; by quarter "
            f"{api['items_per_s_by_quarter']}; machine busy {api['machine_busy_cores']} cores"
        )
    raw, api, dq, st = results["raw"], results["api"], results["dequeue"], results["storage"]
    lines = [
        f"review-queue bench  {results['clients']} clients, {results['items']} items, "
        f"batch {results['batch']}, {results['workers']} API worker(s), {results['machine']}",
        "",
        f"{'':38}{'items/s':>10}{'p50 ms':>10}{'p99 ms':>10}",
        f"{'1. raw SQL (seed loop, psycopg)':38}{raw['items_per_s']:>10}"
        f"   ({raw['cpu_ms_per_item']} ms CPU per item, {raw['postgres_cpu_ms_per_item']} of it PostgreSQL;"
        f" machine busy {raw['machine_busy_cores']} cores)",
        f"{'2. HTTP API':38}{api['items_per_s']:>10}",
        f"{'     POST /leases':38}{'':>10}{api['lease_p50_ms']:>10}{api['lease_p99_ms']:>10}",
        f"{'     POST /items/{id}/complete':38}{'':>10}"
        f"{api['complete_p50_ms']:>10}{api['complete_p99_ms']:>10}",
        f"     API items/s by quarter of the run: {api['items_per_s_by_quarter']}",
        *_extra_rows(results),
        f"3. API / raw ratio: {results['api_raw_ratio']}   (target >= 0.35)",
    ]
    lines += report_dequeue(dq)
    lines += [
        f"5. peak RSS per API process under load (MB): {api['peak_rss_mb_per_process']}   (target < 200)",
        f"   CPU per item (ms): API {api['cpu_ms_per_item']['api']}, load generator "
        f"{api['cpu_ms_per_item']['load_generator']}, PostgreSQL and the rest "
        f"{api['cpu_ms_per_item']['postgres_and_rest']} (PostgreSQL alone, measured on its processes: "
        f"{api['cpu_ms_per_item']['postgres']}); machine busy {api['machine_busy_cores']} of "
        f"{os.cpu_count()} cores",
        f"   load generator CPU: {api['loadgen_cpu_cores']} cores"
        + ("  -- SATURATED, the API number is a lower bound" if api["loadgen_cpu_cores"] > 0.9 else ""),
        f"6. on disk after {st['items']} items resolved through the API ({st['events']} events), "
        "pg_total_relation_size (compacted: after VACUUM FULL):",
        f"     per item  {st['item_bytes']:>6} B as run, {st['item_bytes_compacted']:>6} B compacted",
        f"     per event {st['event_bytes']:>6} B as run, {st['event_bytes_compacted']:>6} B compacted",
        f"   (API run with the sealer {'running every second' if results['sealer'] else 'off'})",
    ]
    if "audit" in results:
        au = results["audit"]
        lines.append(
            f"7. audit chain, {au['events']:,} events: sealed in {au['seal_s']} s"
            f" ({au['sealed_per_s']:,}/s), verified in {au['verify_s']} s ({au['verified_per_s']:,}/s,"
            f" {au['verify_python_cpu_s']} s Python CPU)"
        )
    return "\n".join(lines)


def reports_over_a_year(server_url: str, port: int, items: int, runs: int) -> dict[str, Any]:
    """Part 8: a year of history, then every report through one API worker; and what the reports'
    indexes cost a lease and a completion (two copies of a smaller history, with and without them)."""
    costs = [fresh_database(server_url, f"rq_bench_write_{kind}") for kind in ("with", "without")]
    for url in costs:
        report_bench.load_year(url, 50_000)
    write = report_bench.write_cost(*costs, cycles=2_000, rounds=3)
    url = fresh_database(server_url, "rq_bench_reports")
    load = report_bench.load_year(url, items)
    (token,) = create_tokens(url, 1)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("UPDATE api_token SET role = 'auditor'")
    loadavg = [round(x, 2) for x in os.getloadavg()]
    # A slow report is measured, not cut off by the default 5 s statement timeout.
    server = start_server(url, 1, port, env={"REVIEW_QUEUE_STATEMENT_TIMEOUT_MS": "120000"})
    try:
        timed = report_bench.time_reports(server.base, token, runs, PostgresCpu(url).seconds)
    finally:
        stop_server(server)
    return {"load": load, "reports": timed, "runs": runs, "loadavg": loadavg, "write_cost": write}


def stats_over_history(server_url: str, port: int, items: int, open_items: int, runs: int) -> dict[str, Any]:
    """Part 9: the same live queue with no history and with `items` of history behind it, each
    rolled up and sealed as a running service keeps it; /stats and /metrics timed on both."""
    from cli import reclaimer

    started = time.perf_counter()
    urls = {name: fresh_database(server_url, f"rq_bench_stats_{name}") for name in ("empty", "history")}
    load = report_bench.load_year(urls["history"], items)
    for url in urls.values():
        report_bench.load_open(url, open_items)
        report_bench.placeholder_chain(url)
        asyncio.run(reclaimer.roll_up_once(get_settings(), url))
    load_s = round(time.perf_counter() - started)
    tokens = {name: create_tokens(url, 1)[0] for name, url in urls.items()}
    loadavg = [round(x, 2) for x in os.getloadavg()]
    env = {"REVIEW_QUEUE_METRICS_TOKEN": stats_bench.METRICS_TOKEN}
    servers = {name: start_server(url, 1, port + n, env=env) for n, (name, url) in enumerate(urls.items())}
    try:
        timings = stats_bench.time_side_by_side(
            {name: server.base for name, server in servers.items()}, tokens, runs
        )
    finally:
        for server in servers.values():
            stop_server(server)
    return {
        "load": load, "open_items": open_items, "load_s": load_s, "runs": runs, "loadavg": loadavg,
        "timings": timings,
    }  # fmt: skip


@app.command()
def main(
    clients: Annotated[int, typer.Option(help="Concurrent clients (raw and API).")] = 8,
    items: Annotated[int, typer.Option(help="Items each throughput run drains.")] = 20_000,
    batch: Annotated[int, typer.Option(help="Lease batch size.")] = 20,
    workers: Annotated[
        int | None, typer.Option(help="API worker processes; default one per core, as the README recommends.")
    ] = None,
    lease_samples: Annotated[int, typer.Option(help="Timed leases per dequeue scenario.")] = 200,
    port: Annotated[int, typer.Option(help="Port for the API under test.")] = 8765,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    wakeup_samples: Annotated[int, typer.Option(help="Enqueue-to-lease samples per mode.")] = 30,
    notify_seconds: Annotated[float, typer.Option(help="Length of each NOTIFY on/off run.")] = 5.0,
    only_wakeup: Annotated[bool, typer.Option(help="Run part 6 (wake-up, NOTIFY cost) alone.")] = False,
    only_dequeue: Annotated[bool, typer.Option(help="Run part 4 (dequeue scaling) alone.")] = False,
    only_reports: Annotated[bool, typer.Option(help="Run part 8 (reports over a year) alone.")] = False,
    report_items: Annotated[
        int, typer.Option(help="Items in part 8's year of history (0: skip part 8).")
    ] = 1_000_000,
    report_runs: Annotated[int, typer.Option(help="Timed runs of each report in part 8.")] = 3,
    only_stats: Annotated[
        bool, typer.Option(help="Run part 9 (/stats and /metrics as history grows) alone.")
    ] = False,
    stats_items: Annotated[
        int, typer.Option(help="Items of history in part 9 (0: skip part 9; 10000000 for issue 29's size).")
    ] = 1_000_000,
    stats_open: Annotated[int, typer.Option(help="Open items on both sides of part 9.")] = 20_000,
    stats_runs: Annotated[
        int, typer.Option(help="Timed calls of each endpoint on each side in part 9.")
    ] = 40,
    sealer: Annotated[
        bool,
        typer.Option("--sealer/--no-sealer", help="Seal the audit chain every second during the API run."),
    ] = True,
    api_only: Annotated[
        bool, typer.Option("--api-only", help="Only the HTTP API throughput (part 2).")
    ] = False,
    audit_events: Annotated[
        int, typer.Option(help="Events sealed and verified in part 6 (0: skip).")
    ] = 1_000_000,
    complete_batch: Annotated[
        int,
        typer.Option(
            help="Items per lease and per POST /items/complete in the batched run (2b); 0 skips it."
        ),
    ] = 100,
    one_client_items: Annotated[int, typer.Option(help="Items the one-client run (2c) drains.")] = 2_000,
    throughput_only: Annotated[
        bool,
        typer.Option(
            "--throughput-only", help="Only rows 1, 2, 2b and 2c (raw, per item, batched, 1 client)."
        ),
    ] = False,
) -> None:
    settings = get_settings()
    # The owner creates the bench's databases (the application role cannot) and the API runs as it.
    server_url = owner_url(settings)
    workers = workers or os.cpu_count() or 1
    results: dict[str, Any] = {
        "clients": clients,
        "items": items,
        "batch": batch,
        "workers": workers,
        "machine": f"{os.cpu_count()} cores, {round(psutil.virtual_memory().total / 2**30)} GiB",
        "sealer": sealer,
        "complete_batch": complete_batch,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if throughput_only:
        typer.echo("1/4 raw SQL ceiling ...", err=True)
        results["raw"] = raw_ceiling(fresh_database(server_url, "rq_bench_raw"), clients, items, batch)
        common: dict[str, Any] = {"workers": workers, "port": port, "sealer": sealer}
        typer.echo("2/4 HTTP API, per item ...", err=True)
        results["api"], _ = api_run(
            server_url, "rq_bench_api", clients=clients, items=items, batch=batch, **common
        )
        if complete_batch:  # 0: a server without POST /items/complete (a before/after run)
            typer.echo("3/4 HTTP API, batched ...", err=True)
            results["batched"], _ = api_run(
                server_url, "rq_bench_batched", clients=clients, items=items, batch=complete_batch,
                batch_complete=True, **common,
            )  # fmt: skip
        typer.echo("4/4 HTTP API, one client ...", err=True)
        results["one_client"], _ = api_run(
            server_url, "rq_bench_one", clients=1, items=one_client_items, batch=batch, **common
        )
        typer.echo("floor: bare FastAPI route + one psycopg round trip ...", err=True)
        floor_url = fresh_database(server_url, "rq_bench_floor")
        results["floor"] = floor(floor_url, workers, port, clients, items)
        results["floor_one_client"] = floor(floor_url, workers, port, 1, one_client_items)
        results["floor_raw_ratio"] = round(results["floor"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        results["api_raw_ratio"] = round(results["api"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        if "batched" in results:
            results["batched_raw_ratio"] = round(
                results["batched"]["items_per_s"] / results["raw"]["items_per_s"], 2
            )
        with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
            for name in (
                "rq_bench_raw",
                "rq_bench_api",
                "rq_bench_batched",
                "rq_bench_one",
                "rq_bench_floor",
            ):
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        typer.echo(report_throughput(results))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_wakeup:
        results["wakeup"] = work_arrives(
            server_url, port, settings.poll_interval_ms, wakeup_samples, notify_seconds
        )
        typer.echo(report_wakeup(results["wakeup"]))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_reports:
        results["reports"] = reports_over_a_year(server_url, port, report_items, report_runs)
        with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
            for name in ("rq_bench_reports", "rq_bench_write_with", "rq_bench_write_without"):
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        typer.echo("\n".join(report_bench.report_lines(results["reports"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_stats:
        results["stats"] = stats_over_history(server_url, port, stats_items, stats_open, stats_runs)
        with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
            for name in ("rq_bench_stats_empty", "rq_bench_stats_history"):
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        typer.echo("\n".join(stats_bench.report_lines(results["stats"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_dequeue:
        results["dequeue"] = dequeue_scaling(server_url, workers, port, lease_samples)
        with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
            conn.execute("DROP DATABASE IF EXISTS rq_bench_dequeue WITH (FORCE)")
        typer.echo("\n".join(report_dequeue(results["dequeue"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if not api_only:
        typer.echo("1/4 raw SQL ceiling ...", err=True)
        results["raw"] = raw_ceiling(fresh_database(server_url, "rq_bench_raw"), clients, items, batch)
    typer.echo("2/4 HTTP API ...", err=True)
    api_url = fresh_database(server_url, "rq_bench_api")
    run_sql(api_url, SEED_PENDING, {"prefix": "api-", "entity": "ACME-CORP", "count": items}, vacuum=True)
    tokens = create_tokens(api_url, clients)
    server = start_server(api_url, workers, port, sealer=sealer)
    try:
        results["api"] = api_throughput(server, tokens, items, batch, api_url)
    finally:
        stop_server(server)
    results["storage"] = storage(api_url)
    if not api_only:
        common = {"workers": workers, "port": port, "sealer": sealer}
        typer.echo("2b HTTP API, batched ...", err=True)
        results["batched"], _ = api_run(
            server_url, "rq_bench_batched", clients=clients, items=items, batch=complete_batch,
            batch_complete=True, **common,
        )  # fmt: skip
        typer.echo("2c HTTP API, one client ...", err=True)
        results["one_client"], _ = api_run(
            server_url, "rq_bench_one", clients=1, items=one_client_items, batch=batch, **common
        )
        results["batched_raw_ratio"] = round(
            results["batched"]["items_per_s"] / results["raw"]["items_per_s"], 2
        )
        results["api_raw_ratio"] = round(results["api"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        typer.echo("3/4 dequeue scaling (seeds 1,000,000 rows) ...", err=True)
        results["dequeue"] = dequeue_scaling(server_url, workers, port, lease_samples)
        typer.echo("4/4 wake-up latency and NOTIFY cost ...", err=True)
        results["wakeup"] = work_arrives(
            server_url, port, settings.poll_interval_ms, wakeup_samples, notify_seconds
        )
        if audit_events:
            typer.echo(f"5/5 audit chain (seals and verifies {audit_events:,} events) ...", err=True)
            results["audit"] = audit_chain(server_url, audit_events)
        if report_items:
            typer.echo(f"reports over a year ({report_items:,} items) ...", err=True)
            results["reports"] = reports_over_a_year(server_url, port, report_items, report_runs)
        if stats_items:
            typer.echo(f"/stats and /metrics over history ({stats_items:,} items) ...", err=True)
            results["stats"] = stats_over_history(server_url, port, stats_items, stats_open, stats_runs)
    typer.echo("done", err=True)
    with psycopg.connect(libpq(server_url, "postgres"), autocommit=True) as conn:
        for name in ("rq_bench_raw", "rq_bench_api", "rq_bench_batched", "rq_bench_one",
                     "rq_bench_dequeue", "rq_bench_audit", "rq_bench_reports", "rq_bench_write_with",
                     "rq_bench_write_without", "rq_bench_stats_empty", "rq_bench_stats_history"):  # fmt: skip
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    typer.echo(report(results))
    if "wakeup" in results:
        typer.echo(report_wakeup(results["wakeup"]))
    if "reports" in results:
        typer.echo("\n".join(report_bench.report_lines(results["reports"])))
    if "stats" in results:
        typer.echo("\n".join(stats_bench.report_lines(results["stats"])))
    if json_path:
        json_path.write_text(json.dumps(results, indent=2))
        typer.echo(f"wrote {json_path}", err=True)
