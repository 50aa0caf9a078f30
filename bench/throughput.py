"""make bench, parts 1 and 2: the raw-SQL ceiling, the HTTP API draining the same work, the floor (a bare
FastAPI route and one psycopg round trip), and the bytes on disk."""

import asyncio
import itertools
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil
import psycopg

from bench.harness import (
    SEED_COMPLETE,
    SEED_LEASE,
    SEED_PENDING,
    SEED_PENDING_IN,
    SET_RATE,
    MemorySampler,
    PostgresCpu,
    Server,
    cpu_seconds,
    fresh_database,
    machine_busy_seconds,
    per_item_ms,
    percentile,
    reviewer_tokens,
    run_sql,
    start_server,
    stop_server,
    total_size,
)
from db.engine import libpq_url as libpq

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
    pg0, machine0, started = postgres.seconds(), machine_busy_seconds(), time.perf_counter()
    for w in workers:
        w.join()
        if w.exitcode != 0:
            raise SystemExit(f"a raw client failed (exit {w.exitcode})")
    elapsed = time.perf_counter() - started
    machine_s = machine_busy_seconds() - machine0
    time.sleep(1)  # the clients' backends have exited; let the postmaster reap them into its times
    pg1 = postgres.seconds()
    done = sum(out.get() for _ in workers)
    assert done == items, f"raw loop resolved {done} of {items}"
    return {
        "items": done,
        "seconds": round(elapsed, 2),
        "items_per_s": round(done / elapsed, 1),
        "cpu_ms_per_item": round(machine_s / done * 1000, 3),
        "postgres_cpu_ms_per_item": per_item_ms(None if pg0 is None or pg1 is None else pg1 - pg0, done),
        "machine_busy_cores": round(machine_s / elapsed, 2),
    }


# --- 2. the API -------------------------------------------------------------------------------


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


def api_throughput(
    server: Server, tokens: list[str], items: int, batch: int, url: str, *, batch_complete: bool = False
) -> dict[str, Any]:
    run = ApiRun()
    postgres = PostgresCpu(url)
    sampler = MemorySampler(server.process.pid)
    sampler.start()
    root = psutil.Process(server.process.pid)
    api_processes = [root, *root.children(recursive=True)]
    api0, machine0, pg0 = cpu_seconds(api_processes), machine_busy_seconds(), postgres.seconds()
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
    api_s, machine_s = cpu_seconds(api_processes) - api0, machine_busy_seconds() - machine0
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
            "postgres": per_item_ms(pg_s, items),
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
    rate: tuple[str, str] | None = None,
) -> tuple[dict[str, Any], str]:
    """One HTTP run on a fresh database: `clients` clients drain `items` items (with `rate`, a
    (currency, rate): every item in that currency, which has that rate). (results, its URL)"""
    url = fresh_database(server_url, name)
    seed = {"prefix": "api-", "entity": "ACME-CORP", "count": items}
    if rate is None:
        run_sql(url, SEED_PENDING, seed, vacuum=True)
    else:
        run_sql(url, SET_RATE, {"currency": rate[0], "rate": rate[1]})
        run_sql(url, SEED_PENDING_IN, seed | {"currency": rate[0]}, vacuum=True)
    tokens = reviewer_tokens(url, clients)
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


_SIZES = f"""
SELECT {total_size("review_queue_item")}, {total_size("review_queue_event")},
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
