"""make bench, webhooks part (issue 38 item 4): one subscription, 2,000 events over 200 items, a
loopback receiver answering 500 to a fifth of the requests at random, and one `review-queue
deliverer` process at the default retry settings. Reports events/s and the time to the last event
(the slowest item's retries decide it): the target is 50 events/s or more.

Issue 44's rows: the same with a healthy receiver (`fail` 0) at one subscription and at ten (each
its own path of the one receiver, each sent every event): deliveries/s, and what each side spent
(the deliverer's CPU, the receiver's, PostgreSQL's) to say which one stops it."""

import asyncio
import os
import random
import subprocess
import sys
import threading
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import psycopg
from cryptography.fernet import Fernet

from api import webhook_secret
from bench.harness import BASE_CURRENCY, SLA_TIERS, PostgresCpu
from bench.receiver import Received, Receiver
from db import queue, webhooks
from db.engine import create_engine, transaction, unit_of_work
from db.engine import libpq_url as libpq

TARGET_PER_S = 50.0
PATH = "/bench"


def path_of(n: int) -> str:
    """The receiver's path of subscription `n` (the first keeps the one the bench always used)."""
    return PATH if n == 0 else f"{PATH}-{n}"


async def _setup(url: str, key: str, hooks: list[str], items: int) -> list[tuple[str, str]]:
    """The subscriptions first (so every later event is theirs), then the items; their ids and trace ids."""
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=5)
    try:
        async with transaction(engine, lock_timeout_ms=5000, statement_timeout_ms=5000) as conn:
            for n, hook in enumerate(hooks):
                await webhooks.put_subscription(
                    conn, name="bench" if n == 0 else f"bench-{n}", url=hook, event_types=["item.renewed"],
                    secret=webhook_secret.encrypt(key, webhook_secret.generate()), replace_secret=True,
                    active=True,
                )  # fmt: skip
        ids = []
        async with unit_of_work(engine, lock_timeout_ms=5000, statement_timeout_ms=5000) as unit:
            for n in range(items):
                new = queue.NewItem(f"wh-{n}", "BENCH", Decimal("1.00"), "USD", "PARTIAL", "h")
                _, item = await queue.enqueue_item(
                    unit, new=new, actor="bench", sla_tiers=SLA_TIERS, base_currency=BASE_CURRENCY
                )
                ids.append((str(item.id), str(item.trace_id)))
        return ids
    finally:
        await engine.dispose()


def webhook_drain(
    url: str,
    *,
    events: int,
    items: int,
    fail: float,
    timeout_s: float,
    env: dict[str, str] | None = None,
    subscriptions: int = 1,
) -> dict[str, Any]:
    """Deliver `events` RENEWED events (round robin over `items` items, in transactions of 100) to
    each of `subscriptions` subscriptions, through a receiver failing `fail` of the requests; `env`
    overrides the deliverer's settings (none: defaults)."""
    rng, lock = random.Random(38), threading.Lock()  # noqa: S311 - a load, not a secret
    paths = [path_of(n) for n in range(subscriptions)]
    delivered: set[tuple[str, str]] = set()  # (path, webhook-id) answered 200
    arrivals: list[float] = []  # when each first delivery arrived

    def answer(got: Received) -> tuple[int, dict[str, str]]:
        with lock:
            if rng.random() < fail:
                return 500, {}
            key = (got.path, got.headers.get("webhook-id", ""))
            if key not in delivered:
                delivered.add(key)
                arrivals.append(time.monotonic())
            return 200, {}

    receiver = Receiver(answer=answer).start()
    key = Fernet.generate_key().decode()
    deliverer = None
    me = psutil.Process()
    want = events * subscriptions
    try:
        ids = asyncio.run(_setup(url, key, [receiver.url(p) for p in paths], items))
        with psycopg.connect(libpq(url)) as conn:
            for start in range(0, events, 100):
                with conn.transaction():
                    conn.cursor().executemany(
                        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
                        " VALUES (%s, 'RENEWED', 'bench', 0, %s)",
                        [ids[k % items] for k in range(start, min(events, start + 100))],
                    )
        log = Path(f"/tmp/rq_bench_deliverer_{os.getpid()}.log")  # noqa: S108 - the bench's own scratch log
        pg = PostgresCpu(url)
        pg_before, me_before = pg.seconds(), me.cpu_times()
        started = time.monotonic()
        deliverer = subprocess.Popen(
            [sys.executable, "-m", "cli", "deliverer"],
            env={
                **os.environ,
                "DATABASE_URL": url,
                "REVIEW_QUEUE_WEBHOOK_KEY": key,
                "REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP": "1",
                "REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
                "REVIEW_QUEUE_LOG_FORMAT": "text",
                **(env or {}),
            },
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        proc = psutil.Process(deliverer.pid)
        deliverer_cpu, at_first = 0.0, None  # the CPU of each side at the first delivery
        while time.monotonic() - started < timeout_s:
            with lock:
                if len(delivered) >= want:
                    break
                first_in = bool(delivered)
            if first_in and at_first is None:
                at_first = (_cpu(proc, 0.0), pg.seconds(), sum(me.cpu_times()[:2]))
            if deliverer.poll() is not None:
                raise RuntimeError(f"the deliverer exited: {log.read_text()[-2000:]}")
            deliverer_cpu = _cpu(proc, deliverer_cpu)
            time.sleep(0.05)
        seconds = time.monotonic() - started
        deliverer_cpu = _cpu(proc, deliverer_cpu)
        pg_after, me_after = pg.seconds(), me.cpu_times()
        with lock:
            got, first, last = len(delivered), min(arrivals, default=started), max(arrivals, default=started)
    finally:
        if deliverer is not None and deliverer.poll() is None:
            deliverer.terminate()
            deliverer.wait(30)
        receiver.stop()
    requests = [r for p in paths for r in receiver.of(p)]
    steady = last - first
    return {
        "events": events,
        "subscriptions": subscriptions,
        "items": items,
        "fail": fail,
        "env": env or {},
        "delivered": got,
        "wanted": want,
        "seconds": round(seconds, 1),
        "events_per_s": round(got / seconds, 1),
        # From the first delivery to the last: without the deliverer's start-up (about a second).
        "steady_per_s": round((got - 1) / steady, 1) if steady > 0 else None,
        "requests": len(requests),
        "failed_answers": sum(r.answered == 500 for r in requests),
        "target_ratio": round(got / seconds / TARGET_PER_S, 2),
        # CPU over the whole run, in seconds and as cores busy (seconds / run's seconds).
        "deliverer_cpu_s": round(deliverer_cpu, 2),
        "receiver_cpu_s": round(sum(me_after[:2]) - sum(me_before[:2]), 2),  # the bench process: receiver
        "postgres_cpu_s": None if pg_before is None or pg_after is None else round(pg_after - pg_before, 2),
        # From the first delivery to the last, as cores busy: the deliverer's start-up left out.
        "steady_cores": None
        if at_first is None or steady <= 0
        else {
            "deliverer": round((deliverer_cpu - at_first[0]) / steady, 2),
            "receiver": round((sum(me_after[:2]) - at_first[2]) / steady, 2),
            "postgres": None
            if at_first[1] is None or pg_after is None
            else round((pg_after - at_first[1]) / steady, 2),
        },
    }


def _cpu(process: psutil.Process, last: float) -> float:
    """The process's CPU seconds so far (the last seen once it has gone)."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return last
    return float(times.user + times.system)


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = ["webhooks: one `review-queue deliverer` process, a loopback receiver"]
    for name, run in result.items():
        want = run.get("wanted", run["events"])
        done = "" if run["delivered"] == want else f" (only {run['delivered']:,} delivered: timed out)"
        subs = run.get("subscriptions", 1)
        what = f"{subs} subscription{'s' if subs > 1 else ''}, " + (
            f"failing {run['fail']:.0%} at random" if run["fail"] else "healthy"
        )
        line = (
            f"  {name} ({what}): {run['delivered']:,} deliveries of {run['events']:,} events over"
            f" {run['items']} items in {run['seconds']} s to the last: {run['events_per_s']}/s"
        )
        if run["fail"]:
            line += f" = {run['target_ratio']} x the 50/s target"
        line += f"; {run['requests']:,} requests, {run['failed_answers']} answered 500{done}"
        lines.append(line)
        if "deliverer_cpu_s" in run:
            seconds = run["seconds"] or 1
            pg = run["postgres_cpu_s"]
            lines.append(
                f"      CPU over the run (cores busy): deliverer {run['deliverer_cpu_s']} s"
                f" ({run['deliverer_cpu_s'] / seconds:.2f}), receiver {run['receiver_cpu_s']} s"
                f" ({run['receiver_cpu_s'] / seconds:.2f}), PostgreSQL {pg} s"
                f" ({'?' if pg is None else f'{pg / seconds:.2f}'})"
            )
            cores = run.get("steady_cores") or {}
            lines.append(
                f"      first to last delivery: {run['steady_per_s']}/s, cores busy: deliverer"
                f" {cores.get('deliverer')}, receiver {cores.get('receiver')},"
                f" PostgreSQL {cores.get('postgres')}"
            )
    return lines
