"""make bench, the change feed read end to end (issue 44): GET /events through the real API process.

N events (1,000,000 by default; five an item: enqueued, leased, renewed twice, resolved, each with
its item as it stood after it, as the service writes them) are loaded set-based into a fresh
database, in transactions of CHUNK_ITEMS items, so the walk crosses many transaction ids. Then:

- a reader catching up: from the start to the head with `limit=500`, then with the default 100,
  events/s, pages and seconds, and the CPU each side spent (the API process, PostgreSQL, the
  client); every event is checked read exactly once, each item's in its own order;
- a reader at the head: long-polls (`wait_s`) while a writer commits events at a steady rate;
  the delay from each event's commit to its receipt (p50, p95) and the events/s it keeps up with;
- where a page's time goes, measured in-process on the same database: the feed's page statement,
  the items' statement, the rest of db.feed.read (Python), the JSON rendering, the client's parse.

The numbers are printed, never asserted. A long transaction anywhere on the PostgreSQL cluster
holds the feed's head back (the walk serves only transactions below xmin): run it on a cluster of
its own (make bench's embedded one is per checkout).
"""

import asyncio
import json
import statistics
import threading
import time
from typing import Any

import httpx
import psutil
import psycopg
from sqlalchemy.dialects import postgresql

from api.schemas import FeedEventOut, FeedOut
from bench.harness import PostgresCpu, Server, cpu_seconds, percentile, start_server, stop_server
from bench.reports import EVENT_FK
from db import feed, tokens
from db.engine import create_engine, transaction
from db.engine import libpq_url as libpq

EVENTS_PER_ITEM = 5
CHUNK_ITEMS = 10_000  # items (50,000 events) per transaction of the load

ITEMS = """
INSERT INTO review_queue_item (id, idempotency_key, ledger_entity, variance_amount, currency, match_decision,
    source_hash, state, leased_by, leased_at, lease_expires_at, lease_epoch, attempts, resolution,
    resolution_note, resolved_by, resolved_at, created_at, due_at, context)
SELECT gen_random_uuid(), 'feed-' || i, 'ENTITY-' || i %% 20, (i %% 997 * 12.5)::numeric(18, 2), 'USD',
       'UNMATCHED', 'sha256:feed-' || i, 'RESOLVED', 'reviewer-' || i %% 40,
       now() - interval '1 hour', now() - interval '59 minutes', 1, 1,
       'MATCH_CONFIRMED', 'checked against INV-' || i, 'reviewer-' || i %% 40, now() - interval '50 minutes',
       now() - interval '2 hours', now() + interval '5 days',
       jsonb_build_object('invoice', 'INV-' || i, 'counterparty', 'ENTITY-' || i %% 20)
FROM generate_series(1, %(items)s::int) AS i
"""


def _after(state: str, held: str, done: str, epoch: str) -> str:
    """The item's changeable columns as they stood after an event (db/queue/rows.py AFTER_FIELDS order)."""
    return f"""jsonb_build_array({state}, i.variance_amount::text, i.currency, i.match_decision,
    i.source_hash, CASE WHEN {held} THEN i.leased_by END, CASE WHEN {held} THEN i.leased_at END,
    CASE WHEN {held} THEN i.lease_expires_at END, CASE WHEN {done} THEN i.resolution END,
    CASE WHEN {done} THEN i.resolution_note END, CASE WHEN {done} THEN i.resolved_by END,
    CASE WHEN {done} THEN i.resolved_at END, {epoch}, NULL, NULL, NULL, NULL, NULL, NULL)"""


EVENTS = f"""
INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details, item_after)
SELECT i.id, e.event, CASE WHEN e.seq = 1 THEN 'ingest' ELSE i.leased_by END, e.epoch, i.trace_id,
       CASE WHEN e.done THEN jsonb_build_object('resolution', i.resolution, 'note', i.resolution_note)
            ELSE '{{}}'::jsonb END,
       {_after("e.state", "e.held", "e.done", "e.epoch")}
FROM generate_series(%(first)s::int, %(last)s::int) AS g
JOIN review_queue_item i ON i.idempotency_key = 'feed-' || g
CROSS JOIN (VALUES (1, 'ENQUEUED', 'PENDING', 0, false, false), (2, 'LEASED', 'ASSIGNED', 1, true, false),
                   (3, 'RENEWED', 'ASSIGNED', 1, true, false), (4, 'RENEWED', 'ASSIGNED', 1, true, false),
                   (5, 'RESOLVED', 'RESOLVED', 1, true, true)) AS e(seq, event, state, epoch, held, done)
ORDER BY g, e.seq
"""

# The head's writer: one COMMENTED event on each of `keys`' items, as the service writes one.
WRITE = f"""
INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details, item_after)
SELECT i.id, 'COMMENTED', 'bench-writer', 1, i.trace_id, '{{"comment": "looked again"}}'::jsonb,
       {_after("i.state", "true", "true", "i.attempts")}
FROM review_queue_item i WHERE i.idempotency_key = ANY(%(keys)s)
RETURNING id
"""


def load(url: str, events: int) -> dict[str, Any]:
    """`events` events (EVENTS_PER_ITEM an item) in the freshly migrated database at `url`."""
    items = max(1, events // EVENTS_PER_ITEM)
    started = time.perf_counter()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET work_mem = '256MB'")
        conn.execute(ITEMS, {"items": items})
        # The foreign key is checked once for all events afterwards (bench/reports.py does the same).
        conn.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {EVENT_FK}")
        for first in range(1, items + 1, CHUNK_ITEMS):
            conn.execute(EVENTS, {"first": first, "last": min(items, first + CHUNK_ITEMS - 1)})
        conn.execute(
            f"ALTER TABLE review_queue_event ADD CONSTRAINT {EVENT_FK}"
            " FOREIGN KEY (item_id) REFERENCES review_queue_item (id)"
        )
        conn.execute("VACUUM ANALYZE review_queue_item")
        conn.execute("VACUUM ANALYZE review_queue_event")
        (count,) = conn.execute("SELECT count(*) FROM review_queue_event").fetchone() or (0,)
    return {"items": items, "events": int(count), "load_s": round(time.perf_counter() - started, 1)}


def feed_token(url: str, subject: str = "bench-feed", role: str = "integration") -> str:
    """A real token (db.tokens' own INSERT) of a role that reads the feed."""
    token, statement = tokens.new_token(subject=subject, role=role)
    compiled = statement.compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(str(compiled), compiled.params)
    return token


class Walk:
    """What a reader got: each event exactly once, each item's events in their order."""

    def __init__(self) -> None:
        self.ids: set[int] = set()
        self.last_of_item: dict[str, int] = {}
        self.events = self.duplicates = self.out_of_order = 0

    def take(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            id_, item = event["id"], event["item_id"]
            self.events += 1
            if id_ in self.ids:
                self.duplicates += 1
            self.ids.add(id_)
            if self.last_of_item.get(item, -1) >= id_:
                self.out_of_order += 1
            self.last_of_item[item] = id_


def _cpu(server: Server, pg: PostgresCpu) -> tuple[float, float | None, float]:
    try:
        root = psutil.Process(server.process.pid)
        api = cpu_seconds([root, *root.children(recursive=True)])
    except psutil.Error:
        api = 0.0
    return api, pg.seconds(), time.process_time()


def catch_up(
    server: Server, token: str, limit: int, pg: PostgresCpu, *, up_to: int | None = None
) -> tuple[dict[str, Any], Walk, str | None]:
    """Read from the start to the head (or the first `up_to` events), `limit` a page; the result,
    the walk and the cursor reached."""
    walk, cursor, pages, parse_s = Walk(), None, 0, 0.0
    before = _cpu(server, pg)
    started = time.perf_counter()
    with httpx.Client(
        base_url=server.base, headers={"Authorization": f"Bearer {token}"}, timeout=120
    ) as http:
        while True:
            response = http.get("/events", params={"limit": limit, **({"after": cursor} if cursor else {})})
            t0 = time.perf_counter()
            body = response.json()
            parse_s += time.perf_counter() - t0
            if response.status_code != 200:
                raise RuntimeError(f"GET /events: {response.status_code} {response.text[:500]}")
            pages += 1
            walk.take(body["events"])
            moved = body["next_cursor"] != cursor
            cursor = body["next_cursor"]
            if (not body["events"] and not moved) or (up_to is not None and walk.events >= up_to):
                break
    seconds = time.perf_counter() - started
    after = _cpu(server, pg)
    api_s, client_s = after[0] - before[0], after[2] - before[2]
    pg_s = None if before[1] is None or after[1] is None else after[1] - before[1]
    result = {
        "limit": limit,
        "events": walk.events,
        "pages": pages,
        "seconds": round(seconds, 2),
        "events_per_s": round(walk.events / seconds) if seconds else 0,
        "ms_per_page": round(seconds / pages * 1000, 2),
        "api_cpu_s": round(api_s, 2),
        "postgres_cpu_s": None if pg_s is None else round(pg_s, 2),
        "client_cpu_s": round(client_s, 2),
        "client_parse_s": round(parse_s, 2),
        "duplicates": walk.duplicates,
        "out_of_order": walk.out_of_order,
    }
    return result, walk, cursor


def at_the_head(
    server: Server, token: str, url: str, cursor: str | None, *, rate: float, seconds: float, items: int
) -> dict[str, Any]:
    """A reader long-polling at the head while a writer commits `rate` events a second (transactions
    of up to 10, evenly spaced) for `seconds`: the delay from commit to receipt of each event."""
    per_tx = max(1, min(10, round(rate / 20)))
    interval = per_tx / rate
    committed: dict[int, float] = {}
    received: dict[int, float] = {}
    walk, lock, stop = Walk(), threading.Lock(), threading.Event()
    answers, empty, reached = [0], [0], [cursor]

    def write() -> None:
        with psycopg.connect(libpq(url)) as conn:
            n, next_at = 0, time.monotonic()
            end = next_at + seconds
            while next_at < end:
                keys = [f"feed-{(n + k) % items + 1}" for k in range(per_tx)]
                n += per_tx
                with conn.transaction():
                    ids = [row[0] for row in conn.execute(WRITE, {"keys": keys}).fetchall()]
                now = time.monotonic()
                with lock:
                    for id_ in ids:
                        committed[id_] = now
                next_at += interval
                time.sleep(max(0.0, next_at - time.monotonic()))

    def read() -> None:
        after = cursor
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=server.base, headers=headers, timeout=30) as http:
            while not stop.is_set():
                params: dict[str, Any] = {"limit": 500, "wait_s": 2, **({"after": after} if after else {})}
                response = http.get("/events", params=params)
                now = time.monotonic()
                body = response.json()
                answers[0] += 1
                empty[0] += not body.get("events")
                if response.status_code != 200:
                    raise RuntimeError(f"GET /events: {response.status_code} {response.text[:500]}")
                with lock:
                    for event in body["events"]:
                        received.setdefault(event["id"], now)
                walk.take(body["events"])
                after = reached[0] = body["next_cursor"]

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(0.5)  # the reader is waiting at the head
    started = time.monotonic()
    write()
    wrote_s = time.monotonic() - started
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with lock:
            if committed.keys() <= received.keys():
                break
        time.sleep(0.05)
    stop.set()
    reader.join(timeout=5)
    with lock:
        delays = [received[i] - committed[i] for i in committed if i in received]
        last = max((received[i] for i in committed if i in received), default=started)
        missing = len(committed.keys() - received.keys())
    return {
        "rate": rate,
        "events_per_tx": per_tx,
        "written": len(committed),
        "written_per_s": round(len(committed) / wrote_s),
        "received": len(delays),
        "missing": missing,
        "received_per_s": round(len(delays) / max(last - started, 1e-9)),
        "answers": answers[0],
        "empty_answers": empty[0],
        "cursor": reached[0],
        "p50_ms": round(percentile(delays, 50) * 1000, 1),
        "p95_ms": round(percentile(delays, 95) * 1000, 1),
        "max_ms": round(max(delays, default=float("nan")) * 1000, 1),
        "duplicates": walk.duplicates,
        "out_of_order": walk.out_of_order,
    }


async def _page_split(url: str, limit: int, pages: int) -> dict[str, Any]:
    """The first `pages` pages of the walk, in-process: each part of a page's cost, p50 in ms."""
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout_s=5)
    parts: dict[str, list[float]] = {k: [] for k in ("page_sql", "items_sql", "read", "render", "parse")}
    sizes: list[int] = []
    after = feed.START
    try:
        for _ in range(pages):
            async with transaction(engine, lock_timeout_ms=5000, statement_timeout_ms=60_000) as conn:
                params = {"xid": str(after.xid), "id": after.id, "scan": limit, "types": None}
                t0 = time.perf_counter()
                rows = (await conn.execute(feed._PAGE, params)).all()
                parts["page_sql"].append(time.perf_counter() - t0)
                ids = list({row[3] for row in rows if row[3] is not None})
                t0 = time.perf_counter()
                (await conn.execute(feed._ITEMS, {"ids": ids})).all()
                parts["items_sql"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                page = await feed.read(conn, after=after, limit=limit)
                parts["read"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            out = FeedOut(events=[FeedEventOut.of(e) for e in page.events], next_cursor=page.next.encode())
            body = out.model_dump_json(by_alias=True).encode()
            parts["render"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            json.loads(body)
            parts["parse"].append(time.perf_counter() - t0)
            sizes.append(len(body))
            if not page.events:
                break
            after = page.next
    finally:
        await engine.dispose()
    ms = {k: round(statistics.median(v) * 1000, 2) for k, v in parts.items() if v}
    ms["read_python"] = round(ms["read"] - ms["page_sql"] - ms["items_sql"], 2)
    return {
        "limit": limit,
        "pages": len(sizes),
        "p50_ms": ms,
        "bytes_per_page": round(statistics.median(sizes)),
    }


def feed_read(
    url: str,
    port: int,
    events: int,
    *,
    head_rates: list[float],
    head_seconds: float,
    split_pages: int = 20,
    default_limit_events: int = 100_000,
) -> dict[str, Any]:
    """Load `events` events into the fresh database at `url`, then read them through one API
    process: all of them at `limit=500`, the first `default_limit_events` at the default 100 (the
    same per-page cost, five times the pages: a whole 1M walk at 100 would double the part's time)."""
    loaded = load(url, events)
    token = feed_token(url)
    result: dict[str, Any] = {"load": loaded, "split": []}
    for limit in (500, 100):  # 500: MAX_FEED_LIMIT; 100: the default
        result["split"].append(asyncio.run(_page_split(url, limit, split_pages)))
    pg = PostgresCpu(url)
    server = start_server(url, 1, port)
    try:
        result["catch_up"] = []
        cursor = None
        for limit, up_to in ((500, None), (100, default_limit_events)):
            run, walk, reached = catch_up(server, token, limit, pg, up_to=up_to)
            if up_to is None or up_to >= loaded["events"]:
                run["read_each_once"] = walk.events == loaded["events"] == len(walk.ids)
                cursor = reached
            else:  # a stretch from the start: each once, and the reader moves on to the head
                run["read_each_once"] = walk.events == len(walk.ids)
            result["catch_up"].append(run)
        result["head"] = []
        for rate in head_rates:
            head = at_the_head(
                server, token, url, cursor, rate=rate, seconds=head_seconds, items=loaded["items"]
            )
            cursor = head.pop("cursor")
            result["head"].append(head)
    finally:
        stop_server(server)
    return result


def report_lines(result: dict[str, Any]) -> list[str]:
    load = result["load"]
    lines = [
        f"change feed read, end to end: {load['events']:,} events of {load['items']:,} items"
        f" (loaded in {load['load_s']} s), one API process; load average {result.get('loadavg', '?')}"
        f" at start, {result.get('loadavg_end', '?')} at end"
    ]
    for run in result["catch_up"]:
        once = (
            "each once, in order"
            if run.get("read_each_once") and not run["out_of_order"]
            else "NOT each once"
        )
        lines.append(
            f"  catching up, limit={run['limit']}:"
            f" {'' if run['events'] >= load['events'] else 'the first '}{run['events']:,} events"
            f" in {run['pages']:,} pages,"
            f" {run['seconds']} s = {run['events_per_s']:,} events/s ({run['ms_per_page']} ms a page;"
            f" {once}); CPU: API {run['api_cpu_s']} s, PostgreSQL {run['postgres_cpu_s']} s,"
            f" client {run['client_cpu_s']} s (of it JSON parse {run['client_parse_s']} s)"
        )
    for split in result["split"]:
        ms = split["p50_ms"]
        lines.append(
            f"  one page of {split['limit']} in-process, p50 of {split['pages']}:"
            f" page SQL {ms['page_sql']} ms, items SQL {ms['items_sql']} ms,"
            f" read's Python {ms['read_python']} ms, JSON render"
            f" {ms['render']} ms, client parse {ms['parse']} ms ({split['bytes_per_page']:,} bytes)"
        )
    for head in result["head"]:
        gap = f", {head['missing']} NOT received" if head["missing"] else ""
        lines.append(
            f"  at the head, writer at {head['rate']:g}/s ({head['events_per_tx']} a transaction):"
            f" {head['written']:,} written ({head['written_per_s']}/s), received {head['received_per_s']}/s"
            f" in {head['answers']} answers ({head['empty_answers']} empty);"
            f" commit to receipt p50 {head['p50_ms']} ms, p95 {head['p95_ms']} ms,"
            f" max {head['max_ms']} ms{gap}"
        )
    return lines
