"""make bench, part 6: work that arrives by itself.

(a) Wake-up latency, enqueue -> lease answer: a reviewer long-polling with `wait_s` against one
    polling as the client used to (an empty lease, then a sleep of REVIEW_QUEUE_POLL_INTERVAL_MS
    +-20 %). One item at a time, enqueued through the API at a random moment.
(b) What NOTIFY costs: producers enqueueing one item per transaction and consumers leasing and
    completing, in separate processes through the service's own db functions, for a fixed time,
    with the NOTIFY of enqueue on and off (a listener connected in both runs).
"""

import asyncio
import multiprocessing as mp
import random
import threading
import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import httpx
import psycopg

from bench.harness import BASE_CURRENCY, SLA_TIERS
from db import queue
from db.engine import create_engine, unit_of_work
from db.engine import libpq_url as libpq
from db.queue import enqueue


def _percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


def wakeup_latency(
    base: str, reviewer: str, admin: str, *, samples: int, poll_interval_ms: int
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for mode in ("long_poll", "polling"):
        arrived: dict[str, float] = {}
        got = threading.Event()
        stop = threading.Event()

        def reviewer_loop(
            mode: str = mode,
            arrived: dict[str, float] = arrived,
            got: threading.Event = got,
            stop: threading.Event = stop,
        ) -> None:
            with httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {reviewer}"}, timeout=30
            ) as http:
                while not stop.is_set():
                    body = {"batch_size": 1, "wait_s": 2 if mode == "long_poll" else 0}
                    items = http.post("/leases", json=body).json()["items"]
                    if items:
                        arrived[items[0]["idempotency_key"]] = time.perf_counter()
                        http.post(f"/items/{items[0]['id']}/complete", json={"resolution": "APPROVED"})
                        got.set()
                    elif mode == "polling":
                        time.sleep(poll_interval_ms / 1000 * random.uniform(0.8, 1.2))  # noqa: S311

        thread = threading.Thread(target=reviewer_loop)
        thread.start()
        latencies = []
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {admin}"}) as http:
            for n in range(samples):
                time.sleep(random.uniform(0.2, 0.7))  # noqa: S311 - a random phase against the poll
                got.clear()
                key = f"wake-{mode}-{n}"
                sent = time.perf_counter()
                body = {
                    "idempotency_key": key,
                    "ledger_entity": "BENCH",
                    "variance_amount": "1.00",
                    "match_decision": "PARTIAL",
                    "source_hash": key,
                }
                assert http.post("/items", json=body).status_code == 201
                if not got.wait(10):
                    raise SystemExit(f"{mode}: item {key} was not leased within 10 s")
                latencies.append(arrived[key] - sent)
        stop.set()
        thread.join()
        result[mode] = {
            "p50_ms": round(_percentile(latencies, 50) * 1000, 1),
            "p99_ms": round(_percentile(latencies, 99) * 1000, 1),
            "max_ms": round(max(latencies) * 1000, 1),
        }
    return result


def _notify_worker(url: str, role: str, n: int, notify: bool, seconds: float, barrier: Any, out: Any) -> None:
    if not notify:
        enqueue.notify_work = _no_notify  # type: ignore[attr-defined]

    async def run() -> int:
        engine = create_engine(url, pool_size=1, max_overflow=0)
        done = 0
        try:
            barrier.wait()
            until = time.perf_counter() + seconds
            while time.perf_counter() < until:
                async with unit_of_work(engine, lock_timeout_ms=5000, statement_timeout_ms=5000) as unit:
                    if role == "producer":
                        new = queue.NewItem(
                            f"n-{notify}-{n}-{done}", "BENCH", Decimal("1.00"), "USD", "PARTIAL", "h"
                        )
                        await queue.enqueue_item(
                            unit, new=new, actor="bench", sla_tiers=SLA_TIERS, base_currency=BASE_CURRENCY
                        )
                        done += 1
                        continue
                    items = await queue.lease_items(
                        unit, reviewer=f"c{n}", batch_size=1, lease_duration=timedelta(minutes=5), cap=100
                    )
                if role == "consumer" and items:
                    async with unit_of_work(engine, lock_timeout_ms=5000, statement_timeout_ms=5000) as unit:
                        await queue.complete_item(
                            unit, item_id=items[0].id, reviewer=f"c{n}", resolution="APPROVED", note=None
                        )
                    done += 1
        finally:
            await engine.dispose()
        return done

    out.put((role, asyncio.run(run())))


async def _no_notify(unit: Any) -> None:
    return None


def notify_cost(url: str, *, producers: int, consumers: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    result: dict[str, Any] = {}
    with psycopg.connect(libpq(url), autocommit=True) as listener:
        listener.execute("LISTEN review_queue_work")  # as an API process would be
        for notify in (True, False, True, False):  # twice each, interleaved, against drift
            barrier, out = ctx.Barrier(producers + consumers, timeout=300), ctx.Queue()
            roles = ["producer"] * producers + ["consumer"] * consumers
            procs = [
                ctx.Process(target=_notify_worker, args=(url, role, n, notify, seconds, barrier, out))
                for n, role in enumerate(roles)
            ]
            for p in procs:
                p.start()
            totals = {"producer": 0, "consumer": 0}
            for _ in procs:
                role, count = out.get(timeout=seconds + 120)
                totals[role] += count
            for p in procs:
                p.join()
            # Drain what was delivered, so the listener's socket never fills up.
            for _ in listener.notifies(timeout=0.1):
                pass
            key = "with_notify" if notify else "without_notify"
            runs = result.setdefault(key, {"enqueued_per_s": [], "completed_per_s": []})
            runs["enqueued_per_s"].append(round(totals["producer"] / seconds, 1))
            runs["completed_per_s"].append(round(totals["consumer"] / seconds, 1))
    for runs in result.values():
        for name in ("enqueued_per_s", "completed_per_s"):
            runs[name] = round(sum(runs[name]) / len(runs[name]), 1)
    on, off = result["with_notify"], result["without_notify"]
    result["enqueue_ratio"] = round(on["enqueued_per_s"] / off["enqueued_per_s"], 3)
    result["complete_ratio"] = round(on["completed_per_s"] / max(off["completed_per_s"], 0.1), 3)
    return result
