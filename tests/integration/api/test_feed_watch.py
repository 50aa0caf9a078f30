"""GET /events long-polls on one process share one look at the feed (api/feed_watch.py): many
waiters cost one query per poll interval, one enqueue wakes them all, a filtered waiter reads on
and waits again, and a waiter whose client leaves is dropped. Real concurrent requests, in-process."""

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.feed_watch import AnswerBudget
from db import feed
from tests.support import wait_for
from tests.support.api import Auth, enqueue
from tests.support.audit import settle

WAIT_S = 15


def long_polls(
    client: TestClient, headers: dict[str, str], count: int, params: dict[str, Any]
) -> tuple[list[threading.Thread], list[httpx.Response]]:
    answers: list[httpx.Response] = []

    def poll() -> None:
        answers.append(client.get("/events", params=params, headers=headers))

    threads = [threading.Thread(target=poll) for _ in range(count)]
    for t in threads:
        t.start()
    return threads, answers


def head_of(client: TestClient, reader: dict[str, str], db_url: str) -> str:
    settle(db_url)
    cursor: str = client.get("/events", headers=reader, params={"limit": 500}).json()["next_cursor"]
    while page := client.get("/events", headers=reader, params={"after": cursor, "limit": 500}).json():
        if page["next_cursor"] == cursor:
            return cursor
        cursor = page["next_cursor"]
    raise AssertionError("unreachable")


def count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """Count the calls of db.feed's function `name` (one query each) from now on: [count]."""
    calls = [0]
    original = getattr(feed, name)

    def counted(*args: Any, **kw: Any) -> Any:
        calls[0] += 1
        return original(*args, **kw)

    monkeypatch.setattr(feed, name, counted)
    return calls


@pytest.fixture
def budget(client: TestClient) -> Iterator[Callable[[int], AnswerBudget]]:
    """budget(per_s): the app's answer budget (REVIEW_QUEUE_FEED_ANSWERS_PER_S) replaced for this test."""
    state: Any = client.app.state  # type: ignore[attr-defined]
    was = state.feed_budget

    def use(per_s: int) -> AnswerBudget:
        state.feed_budget = AnswerBudget(per_s)
        return state.feed_budget  # type: ignore[no-any-return]

    yield use
    state.feed_budget = was


WAITERS = 30


def test_waiting_long_polls_cost_one_query_per_interval_not_one_each(
    client: TestClient, auth: Auth, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: each waiter read the feed every poll interval itself (30 waiters: about 60 queries a
    second, 500 of them about 1,000). Now the process's watcher looks once per interval."""
    reader = auth("ledger", "integration")
    head = head_of(client, reader, db_url)
    queries = {name: count_calls(monkeypatch, name) for name in ("read", "head")}
    state: Any = client.app.state  # type: ignore[attr-defined]
    threads, answers = long_polls(client, reader, WAITERS, {"after": head, "wait_s": 6})
    # Every one past its first read (taken in turns of the answer budget) and waiting.
    wait_for(lambda: state.feed_watch.waiters == WAITERS, timeout=20)
    time.sleep(1)  # the last first read's transaction is over
    before = {name: calls[0] for name, calls in queries.items()}
    window_s, interval_s = 2.0, state.settings.poll_interval_ms / 1000
    time.sleep(window_s)
    during = {name: calls[0] - before[name] for name, calls in queries.items()}
    still_waiting = state.feed_waiters
    for t in threads:
        t.join(timeout=30)
    assert still_waiting == WAITERS, f"only {still_waiting} of {WAITERS} still waited in the window"
    assert sum(during.values()) <= window_s / interval_s + 2, (
        f"{during} queries in {window_s} s from {WAITERS} waiters with nothing new"
        f" (poll interval {interval_s} s): one look per interval for all of them expected"
    )
    assert during["head"] >= 1, f"the watcher never looked: {during}"
    assert [(a.status_code, a.json()["events"]) for a in answers] == [(200, [])] * WAITERS


def test_one_enqueue_wakes_every_waiter_at_the_head_and_each_gets_the_event(
    client: TestClient,
    auth: Auth,
    db_url: str,
    monkeypatch: pytest.MonkeyPatch,
    budget: Callable[[int], AnswerBudget],
) -> None:
    """... from one read between them: the waiters one look woke at one position share it."""
    reader, ingest = auth("ledger", "integration"), auth("ingest", "ingest")
    head = head_of(client, reader, db_url)
    reads = count_calls(monkeypatch, "read")
    # A budget with room for all twelve at once (test_the_answer_budget_*: turns spread over time
    # are reads of their own).
    budget(10_000)
    watch: Any = client.app.state.feed_watch  # type: ignore[attr-defined]
    threads, answers = long_polls(client, reader, 12, {"after": head, "wait_s": WAIT_S})
    wait_for(lambda: watch.waiters == 12, timeout=20)
    time.sleep(0.5)  # their first reads are done
    before = reads[0]
    started = time.monotonic()
    created = enqueue(client, ingest)
    for t in threads:
        t.join(timeout=WAIT_S + 30)
    assert time.monotonic() - started < WAIT_S - 2, "the waiters answered at their deadline, not on the event"
    got = [[(e["event"], e["item_id"]) for e in a.json()["events"]] for a in answers]
    assert got == [[("ENQUEUED", created["id"])]] * 12, got
    assert len({a.json()["next_cursor"] for a in answers}) == 1
    # The shared answer, rendered once, is what a read of its own gives.
    assert answers[0].json() == client.get("/events", params={"after": head}, headers=reader).json()
    assert answers[0].headers["content-type"] == "application/json"
    assert reads[0] - before <= 2, f"{reads[0] - before} reads of the feed for 12 waiters woken by one event"


def test_a_filtered_waiter_reads_past_what_it_skips_and_waits_for_its_own_events(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    reader, ingest, alice = auth("ledger", "integration"), auth("ingest", "ingest"), auth("alice", "reviewer")
    head = head_of(client, reader, db_url)
    watch: Any = client.app.state.feed_watch  # type: ignore[attr-defined]
    threads, answers = long_polls(client, reader, 3, {"after": head, "wait_s": WAIT_S, "types": "LEASED"})
    wait_for(lambda: watch.waiters == 3, timeout=20)
    generation = watch.generation
    enqueue(client, ingest)  # ENQUEUED: not theirs; they read past it and wait again
    wait_for(lambda: watch.generation > generation and watch.waiters == 3, timeout=20)
    assert all(t.is_alive() for t in threads), [a.json() for a in answers]
    (leased,) = client.post("/leases", json={"batch_size": 1}, headers=alice).json()["items"]
    for t in threads:
        t.join(timeout=WAIT_S + 30)
    got = [[(e["event"], e["item_id"]) for e in a.json()["events"]] for a in answers]
    assert got == [[("LEASED", leased["id"])]] * 3, got


def test_a_waiter_whose_client_leaves_is_dropped_and_the_watcher_stops_with_no_one_waiting(
    client: TestClient, auth: Auth, db_url: str
) -> None:
    """The request is driven through the app directly: the test client cannot hang up mid-request."""
    reader = auth("ledger", "integration")
    head = head_of(client, reader, db_url)
    state: Any = client.app.state  # type: ignore[attr-defined]
    app: Any = client.app
    left = asyncio.Event()
    sent: list[dict[str, Any]] = []
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/events", "raw_path": b"/events",
        "query_string": f"after={head}&wait_s=20".encode(), "root_path": "",
        "headers": [(b"authorization", reader["Authorization"].encode())],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }  # fmt: skip
    asked = False

    async def receive() -> dict[str, Any]:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def call() -> None:
        await app(scope, receive, send)

    assert client.portal is not None
    request = threading.Thread(target=lambda: client.portal.call(call))  # type: ignore[union-attr]
    request.start()
    wait_for(lambda: state.feed_watch.waiters == 1 and state.feed_watch.watching, timeout=20)
    started = time.monotonic()
    client.portal.call(left.set)
    wait_for(lambda: state.feed_waiters == 0 and state.feed_watch.waiters == 0, timeout=5)
    request.join(timeout=10)
    assert not request.is_alive()
    wait_for(lambda: not state.feed_watch.watching, timeout=5)
    assert time.monotonic() - started < 10, "the waiter stayed until its 20 s deadline"
    looks = state.feed_watch.looks
    time.sleep(3 * state.settings.poll_interval_ms / 1000)
    assert state.feed_watch.looks == looks, "the watcher looked with no one waiting"
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    assert not body or json.loads(body)["events"] == []


POLLERS, PER_S = 8, 4


def test_the_answer_budget_holds_for_woken_waiters_and_for_pollers_that_come_straight_back(
    client: TestClient,
    auth: Auth,
    db_url: str,
    budget: Callable[[int], AnswerBudget],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """REVIEW_QUEUE_FEED_ANSWERS_PER_S: 8 pollers with limit=1 each want 6 events (48 answers). The
    first answers wake waiters; the rest are pollers back at once with their new cursor, behind the
    head. Before: all 48 read within about a second. Now at most PER_S reads a second (a burst of
    one at this rate), and each poller still gets every event, in the feed's order.

    The budget counts reads, not answers: callers whose turns came while a read of their place was
    in flight share it (api/feed_watch.py), so a read that stalls (a loaded machine) can answer
    several at once. So the reads are what is counted here, each by the real `db.feed.read`."""
    reader, ingest, alice = auth("ledger", "integration"), auth("ingest", "ingest"), auth("alice", "reviewer")
    state: Any = client.app.state  # type: ignore[attr-defined]
    budget(PER_S)
    head = head_of(client, reader, db_url)
    answered: list[float] = []  # when each answer with events came
    reads: list[float] = []  # when each read of the feed began, while the pollers poll
    real_read = feed.read

    async def counted_read(*args: Any, **kwargs: Any) -> feed.FeedPage:
        reads.append(time.monotonic())
        return await real_read(*args, **kwargs)

    monkeypatch.setattr(feed, "read", counted_read)
    seen: list[list[str]] = [[] for _ in range(POLLERS)]

    def poll(i: int) -> None:
        cursor, ends = head, time.monotonic() + 60
        while len(seen[i]) < 6 and time.monotonic() < ends:
            params = {"after": cursor, "wait_s": WAIT_S, "limit": 1}
            page = client.get("/events", params=params, headers=reader)
            assert page.status_code == 200, page.text
            if page.json()["events"]:
                answered.append(time.monotonic())
            seen[i] += [e["cursor"] for e in page.json()["events"]]
            cursor = page.json()["next_cursor"]

    threads = [threading.Thread(target=poll, args=(i,)) for i in range(POLLERS)]
    for t in threads:
        t.start()
    wait_for(lambda: state.feed_watch.waiters == POLLERS, timeout=20)
    for _ in range(3):
        enqueue(client, ingest)
    leased = client.post("/leases", json={"batch_size": 3}, headers=alice).json()["items"]
    assert len(leased) == 3, leased
    for t in threads:
        t.join(timeout=90)
    monkeypatch.setattr(feed, "read", real_read)
    settle(db_url)
    walk = client.get("/events", params={"after": head, "limit": 100}, headers=reader).json()["events"]
    assert [e["event"] for e in walk] == ["ENQUEUED"] * 3 + ["LEASED"] * 3, walk
    assert seen == [[e["cursor"] for e in walk]] * POLLERS, "a poller missed, repeated or reordered events"
    assert len(answered) == POLLERS * 6, answered
    # Without the budget all 48 answers are 48 reads within about a second; with it, shared reads
    # may answer several pollers, but the reads keep to the rate.
    busiest = max(sum(1 for t in reads if start <= t < start + 1) for start in reads)
    took = reads[-1] - reads[0]
    assert busiest <= PER_S + 2, f"{busiest} reads in one second with a budget of {PER_S} a second"
    assert took >= (len(reads) - 1) / PER_S * 0.8, f"{len(reads)} reads in {took:.1f} s"


def test_a_poller_whose_turn_does_not_come_by_its_deadline_answers_at_its_deadline_with_nothing(
    client: TestClient, auth: Auth, db_url: str, budget: Callable[[int], AnswerBudget]
) -> None:
    """Every turn of the next minute taken: a poller behind the head (events waiting for it) keeps
    its deadline and answers with no events and its own cursor, so it skips nothing."""
    reader, ingest = auth("ledger", "integration"), auth("ingest", "ingest")
    turns = budget(1)
    head = head_of(client, reader, db_url)
    enqueue(client, ingest)
    settle(db_url)
    assert client.portal is not None
    now = client.portal.call(lambda: asyncio.get_running_loop().time())
    while turns.reserve(now, now + 60) is not None:  # the app's own loop clock, so no drift
        pass
    started = time.monotonic()
    page = client.get("/events", params={"after": head, "wait_s": 2}, headers=reader)
    took = time.monotonic() - started
    assert (page.status_code, page.json()) == (200, {"events": [], "next_cursor": head}), page.text
    assert 1.8 <= took < 6, f"answered after {took:.1f} s with wait_s=2"
    # wait_s=0 is an ordinary request, outside the budget: the event is there.
    page = client.get("/events", params={"after": head}, headers=reader)
    assert [e["event"] for e in page.json()["events"]] == ["ENQUEUED"], page.text
