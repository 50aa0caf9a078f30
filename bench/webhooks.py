"""make bench, webhooks part (issue 38 item 4): one subscription, 2,000 events over 200 items, a
loopback receiver answering 500 to a fifth of the requests at random, and one `review-queue
deliverer` process at the default retry settings. Reports events/s and the time to the last event
(the slowest item's retries decide it): the target is 50 events/s or more."""

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

import psycopg
from cryptography.fernet import Fernet

from api import webhook_secret
from bench.harness import BASE_CURRENCY, SLA_TIERS
from db import queue, webhooks
from db.engine import create_engine, transaction, unit_of_work
from db.engine import libpq_url as libpq
from tests.support.receiver import Receiver

TARGET_PER_S = 50.0
PATH = "/bench"


async def _setup(url: str, key: str, hook: str, items: int) -> list[tuple[str, str]]:
    """The subscription first (so every later event is its), then the items; their ids and trace ids."""
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=5)
    try:
        async with transaction(engine, lock_timeout_ms=5000, statement_timeout_ms=5000) as conn:
            await webhooks.put_subscription(
                conn, name="bench", url=hook, event_types=["item.renewed"],
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
    url: str, *, events: int, items: int, fail: float, timeout_s: float, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Deliver `events` RENEWED events (round robin over `items` items, in transactions of 100) to a
    receiver failing `fail` of the requests; `env` overrides the deliverer's settings (none: defaults)."""
    rng, lock = random.Random(38), threading.Lock()  # noqa: S311 - a load, not a secret

    def answer(_: object) -> tuple[int, dict[str, str]]:
        with lock:
            return (500, {}) if rng.random() < fail else (200, {})

    receiver = Receiver(answer=answer).start()
    key = Fernet.generate_key().decode()
    deliverer = None
    try:
        ids = asyncio.run(_setup(url, key, receiver.url(PATH), items))
        with psycopg.connect(libpq(url)) as conn:
            for start in range(0, events, 100):
                with conn.transaction():
                    conn.cursor().executemany(
                        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
                        " VALUES (%s, 'RENEWED', 'bench', 0, %s)",
                        [ids[k % items] for k in range(start, min(events, start + 100))],
                    )
        log = Path(f"/tmp/rq_bench_deliverer_{os.getpid()}.log")  # noqa: S108 - the bench's own scratch log
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

        def delivered() -> set[str]:
            return {r.headers.get("webhook-id", "") for r in receiver.of(PATH) if r.answered == 200}

        while len(delivered()) < events and time.monotonic() - started < timeout_s:
            if deliverer.poll() is not None:
                raise RuntimeError(f"the deliverer exited: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        seconds = time.monotonic() - started
        got = len(delivered())
    finally:
        if deliverer is not None and deliverer.poll() is None:
            deliverer.terminate()
            deliverer.wait(30)
        receiver.stop()
    requests = receiver.of(PATH)
    return {
        "events": events,
        "items": items,
        "fail": fail,
        "env": env or {},
        "delivered": got,
        "seconds": round(seconds, 1),
        "events_per_s": round(got / seconds, 1),
        "requests": len(requests),
        "failed_answers": sum(r.answered == 500 for r in requests),
        "target_ratio": round(got / seconds / TARGET_PER_S, 2),
    }


def report_lines(result: dict[str, Any]) -> list[str]:
    lines = ["webhooks: one subscription, a receiver failing a fifth of the requests at random"]
    for name, run in result.items():
        done = (
            "" if run["delivered"] == run["events"] else f" (only {run['delivered']:,} delivered: timed out)"
        )
        lines.append(
            f"  {name}: {run['events']:,} events over {run['items']} items in {run['seconds']} s to the last"
            f" event: {run['events_per_s']} events/s = {run['target_ratio']} x the 50/s target;"
            f" {run['requests']:,} requests, {run['failed_answers']} answered 500{done}"
        )
    return lines
