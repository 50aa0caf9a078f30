"""Part 11 of make bench: the connection pool of one API process under many clients.

11a (issue 38 item 5): 30 clients leasing and completing against one `review-queue serve` process,
once with the old pool (10 + 5, 1 s wait) and once with the defaults, counting 503s.
11b (issue 38 item 2): the p95 of the other routes, idle and beside N feed long-pollers, and the 503s.
"""

import asyncio
import contextlib
import multiprocessing
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.harness import (
    SEED_PENDING,
    create_token,
    fresh_database,
    percentile,
    reviewer_tokens,
    run_sql,
    start_server,
    stop_server,
)

# The pool as it was before issue 38 item 5, for the "before" side of 11a.
OLD_POOL = {
    "REVIEW_QUEUE_POOL_SIZE": "10",
    "REVIEW_QUEUE_POOL_MAX_OVERFLOW": "5",
    "REVIEW_QUEUE_POOL_TIMEOUT_MS": "1000",
}


@dataclass
class Tally:
    """Latencies per route and the count of each status."""

    seconds: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)

    def add(self, route: str, status: int, elapsed: float) -> None:
        self.seconds.setdefault(route, []).append(elapsed)
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def p95_ms(self) -> dict[str, float]:
        return {route: round(percentile(s, 95) * 1000, 1) for route, s in self.seconds.items()}


async def _timed(
    http: aiohttp.ClientSession, tally: Tally, route: str, path: str, body: dict[str, Any]
) -> Any:
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with http.post(path, json=body) as response:
        payload = await response.json(content_type=None)
        tally.add(route, response.status, loop.time() - started)
        return payload if response.status in (200, 201) else None


async def _worker(base: str, token: str, rounds: int, tally: Tally, start: asyncio.Event) -> None:
    """Lease one item and complete it, `rounds` times (fewer if the queue runs dry)."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(base, headers=headers) as http:
        await start.wait()
        for _ in range(rounds):
            leased = await _timed(http, tally, "POST /leases", "/leases", {"batch_size": 1})
            for item in (leased or {}).get("items", []):
                body = {"resolution": "APPROVED", "lease_token": item["lease_token"]}
                await _timed(http, tally, "POST /items/{id}/complete", f"/items/{item['id']}/complete", body)


async def _drive(base: str, tokens: list[str], rounds: int) -> Tally:
    tally, start = Tally(), asyncio.Event()
    tasks = [asyncio.create_task(_worker(base, token, rounds, tally, start)) for token in tokens]
    await asyncio.sleep(0.2)
    start.set()
    await asyncio.gather(*tasks)
    return tally


def _summary(tally: Tally) -> dict[str, Any]:
    return {
        "requests": sum(tally.statuses.values()),
        "503": tally.statuses.get(503, 0),
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "p95_ms": tally.p95_ms(),
    }


def pool_under_clients(server_url: str, port: int, clients: int, items: int) -> dict[str, Any]:
    """11a: `clients` clients lease and complete `items` items through one API process, with the old
    pool and then with the defaults; each side on a fresh database."""
    results: dict[str, Any] = {"clients": clients, "items": items}
    for side, env in (("old pool 10+5, 1 s wait", OLD_POOL), ("defaults", {})):
        url = fresh_database(server_url, "rq_bench_pool")
        run_sql(url, SEED_PENDING, {"prefix": "pool-", "entity": "ACME-CORP", "count": items}, vacuum=True)
        tokens = reviewer_tokens(url, clients)
        server = start_server(url, 1, port, env=env)
        try:
            results[side] = _summary(asyncio.run(_drive(server.base, tokens, items // clients)))
        finally:
            stop_server(server)
    return results


@dataclass
class Pollers:
    """What the long-pollers got: each status's count, and how many events each poller has had."""

    statuses: dict[int, int] = field(default_factory=dict)
    received: list[int] = field(default_factory=list)
    # The events a poller must have had to be at the head (known once the clients have finished),
    # and the loop time each poller got there.
    head: float = float("inf")
    caught_up_at: dict[int, float] = field(default_factory=dict)
    all_caught_up: asyncio.Event = field(default_factory=asyncio.Event)

    def check(self, index: int, at: float) -> None:
        if self.received[index] >= self.head:
            self.caught_up_at.setdefault(index, at)
            if len(self.caught_up_at) == len(self.received):
                self.all_caught_up.set()


async def _poller(base: str, token: str, polls: Pollers, index: int, wait_s: int, after: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    timeout = aiohttp.ClientTimeout(total=wait_s + 60)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(base, headers=headers, timeout=timeout) as http:
        while True:
            params = {"wait_s": str(wait_s), "after": after}
            try:
                async with http.get("/events", params=params) as response:
                    body = await response.json(content_type=None)
                    status, retry_s = response.status, float(response.headers.get("Retry-After", "1"))
            # A poller whose call timed out (the server busy beyond wait_s + 60 s) asks again,
            # counted: it must not silently drop out of the lag measured at the end.
            except (aiohttp.ClientError, TimeoutError):
                status, retry_s = 0, 1.0
            polls.statuses[status] = polls.statuses.get(status, 0) + 1
            if status == 200:
                after = body.get("next_cursor") or after
                polls.received[index] += len(body["events"])
                polls.check(index, loop.time())
            else:  # a 429 (FEED_BUSY), a timeout (0) or worse: back off as Retry-After asks
                await asyncio.sleep(retry_s)


async def _feed_head(base: str, token: str, after: str = "") -> tuple[str, int]:
    """The cursor after the last event a walk from `after` can reach now, and the events on the way."""
    async with aiohttp.ClientSession(base, headers={"Authorization": f"Bearer {token}"}) as http:
        cursor, events = after, 0
        while True:
            params = {"limit": "500", **({"after": cursor} if cursor else {})}
            async with http.get("/events", params=params) as response:
                page = await response.json(content_type=None)
            if page["next_cursor"] == cursor:
                return cursor, events
            cursor, events = page["next_cursor"], events + len(page["events"])


# How long the pollers may take, once the clients are done, to reach the head of the feed.
CATCH_UP_S = 90


async def _pollers(base: str, token: str, pollers: int, wait_s: int, after: str, stop: Any) -> dict[str, Any]:
    polls = Pollers(received=[0] * pollers)
    tasks = [asyncio.create_task(_poller(base, token, polls, i, wait_s, after)) for i in range(pollers)]
    await asyncio.to_thread(stop.wait)  # a multiprocessing.Event, set when the clients are done
    loop = asyncio.get_running_loop()
    ended, at_end = loop.time(), list(polls.received)
    # Their lag: how many events behind the head each poller was when the clients finished, and
    # how long it then took to reach it (up to CATCH_UP_S).
    _, written = await _feed_head(base, token, after)
    polls.head = written
    for i in range(pollers):
        polls.check(i, loop.time())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(polls.all_caught_up.wait(), CATCH_UP_S)
    for task in tasks:  # a long-poll in flight is of no more interest
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    lags = sorted(float(written - got) for got in at_end)
    catch_up = sorted(polls.caught_up_at[i] - ended for i in polls.caught_up_at)
    return {
        "statuses": polls.statuses,
        "events": written,
        "events_behind_at_end": {"p50": percentile(lags, 50), "max": lags[-1]},
        "seconds_to_head": {
            "p50": round(percentile(catch_up, 50), 1) if catch_up else None,
            "max": round(catch_up[-1], 1) if catch_up else None,
            "reached": f"{len(catch_up)} of {pollers} within {CATCH_UP_S} s",
        },
    }


def _pollers_process(
    base: str, token: str, pollers: int, wait_s: int, after: str, stop: Any, out: Any
) -> None:
    out.put(asyncio.run(_pollers(base, token, pollers, wait_s, after, stop)))


async def _feed_sides(
    base: str, tokens: list[str], feed_token: str, pollers: int, rounds: int, wait_s: int
) -> dict[str, Any]:
    idle = await _drive(base, tokens, rounds)
    # The pollers start where the feed is, as long-pollers that keep up do: from the start, 500 of
    # them would first each page through the idle side's events while the clients are measured.
    head, _ = await _feed_head(base, feed_token)
    # In a process of their own: in the measured clients' event loop, parsing the pollers'
    # answers delayed the clients' own requests and counted in their latency.
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    process = context.Process(
        target=_pollers_process, args=(base, feed_token, pollers, wait_s, head, stop, out), daemon=True
    )
    process.start()
    await asyncio.sleep(5)  # every poller is in its wait before the measured clients start
    busy = await _drive(base, tokens, rounds)
    stop.set()
    polled = await asyncio.to_thread(out.get, timeout=CATCH_UP_S + 240)
    process.join(timeout=30)
    return {
        "idle": _summary(idle),
        "with_pollers": _summary(busy),
        "poller_statuses": polled.pop("statuses"),
        "pollers_lag": polled,
    }


def feed_pollers(
    server_url: str, port: int, pollers: int, clients: int, items: int, wait_s: int = 20
) -> dict[str, Any]:
    """11b: the p95 of lease and complete from `clients` clients through one API process, first
    alone, then beside `pollers` feed long-pollers (GET /events?wait_s=...)."""
    url = fresh_database(server_url, "rq_bench_feed")
    run_sql(url, SEED_PENDING, {"prefix": "feed-", "entity": "ACME-CORP", "count": items}, vacuum=True)
    tokens = reviewer_tokens(url, clients)
    feed_token = create_token(url, "bench-feed", "auditor")
    server = start_server(url, 1, port)
    try:
        rounds = items // clients // 2
        sides = asyncio.run(_feed_sides(server.base, tokens, feed_token, pollers, rounds, wait_s))
    finally:
        stop_server(server)
    idle, busy = sides["idle"]["p95_ms"], sides["with_pollers"]["p95_ms"]
    sides["ratio"] = {route: round(busy[route] / idle[route], 2) for route in idle if route in busy}
    return {"pollers": pollers, "clients": clients, "items": items, **sides}


def report_lines(results: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    if "pool" in results:
        pool = results["pool"]
        lines.append(
            f"11a. one API process, {pool['clients']} clients leasing + completing {pool['items']} items:"
        )
        for side in ("old pool 10+5, 1 s wait", "defaults"):
            got = pool[side]
            lines.append(
                f"     {side:26} 503s {got['503']} of {got['requests']} requests; p95 ms {got['p95_ms']}"
            )
    if "feed" in results:
        feed = results["feed"]
        lines.append(
            f"11b. one API process, {feed['clients']} clients leasing + completing,"
            f" idle vs beside {feed['pollers']} feed long-pollers:"
        )
        for route, ratio in feed["ratio"].items():
            lines.append(
                f"     {route:28} p95 {feed['idle']['p95_ms'][route]} ms idle,"
                f" {feed['with_pollers']['p95_ms'][route]} ms with pollers: x{ratio}  (target <= 1.5)"
            )
        lines.append(
            f"     503s: {feed['idle']['503']} idle, {feed['with_pollers']['503']} with pollers;"
            f" pollers' statuses {feed['poller_statuses']}"
        )
        lag = feed["pollers_lag"]
        lines.append(
            f"     pollers' lag when the clients finished ({lag['events']} events written): events"
            f" behind the head {lag['events_behind_at_end']}; seconds to reach it {lag['seconds_to_head']}"
        )
    return lines
