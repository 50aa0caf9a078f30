"""The change feed on real PostgreSQL: every event once, nothing skipped behind a transaction in flight,
and each item's events in their own order even where the walk's positions disagree with it."""

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from db import feed, queue
from db.engine import create_engine, transaction
from db.unit import Transaction
from tests.support.api import item_body
from tests.support.audit import settle
from tests.support.postgres import libpq

Headers = Callable[[str, str], dict[str, str]]


def read_all(
    db_url: str,
    after: feed.Position = feed.START,
    *,
    limit: int = 3,
    sizes: list[int] | None = None,
    **kw: Any,
) -> feed.FeedPage:
    """Every page from `after` to the end, as one page (small pages: the boundaries get exercised);
    the length of each page that served something goes to `sizes`."""

    async def run() -> feed.FeedPage:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        events: list[feed.FeedEvent] = []
        position = after
        try:
            while True:
                async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=10_000) as conn:
                    page = await feed.read(conn, after=position, limit=limit, **kw)
                events += page.events
                if sizes is not None and page.events:
                    sizes.append(len(page.events))
                if page.next == position:
                    return feed.FeedPage(events, position)
                position = page.next
        finally:
            await engine.dispose()

    settle(db_url)
    return asyncio.run(run())


def assert_resumable(db_url: str, events: list[feed.FeedEvent], *, limit: int) -> None:
    """Resuming from any event's cursor serves the events after it, and again only the ones that
    were served at the same position before it (an event served early does not carry its position)."""
    ids = [e.id for e in events]
    for n, event in enumerate(events):
        resumed = [e.id for e in read_all(db_url, event.cursor, limit=limit).events]
        rest = ids[n + 1 :]
        again = resumed[: len(resumed) - len(rest)]
        assert resumed[len(again) :] == rest, (n, resumed, rest)
        assert again == ids[n + 1 - len(again) : n + 1], (n, again)
        last_of_its_position = n == 0 or events[n - 1].cursor != event.cursor
        assert not again or not last_of_its_position, (n, again)


def by_position(sql: psycopg.Connection) -> list[int]:
    return [int(r[0]) for r in sql.execute("SELECT id FROM review_queue_event ORDER BY xid, id")]


@pytest.fixture
def lifecycle(client: TestClient, auth: Headers) -> dict[str, dict[str, str]]:
    """Items enqueued, leased, renewed, resolved and released, through the API."""
    heads = {"admin": auth("ada", "admin"), "alice": auth("alice", "reviewer")}
    for _ in range(5):
        assert client.post("/items", json=item_body(), headers=heads["admin"]).status_code == 201
    held = client.post("/leases", json={"batch_size": 4}, headers=heads["alice"]).json()["items"]
    for n, item in enumerate(held):
        action, body = [("complete", {"resolution": "APPROVED"}), ("release", {}), ("renew", {})][n % 3]
        assert (
            client.post(f"/items/{item['id']}/{action}", json=body, headers=heads["alice"]).status_code == 200
        )
    return heads


def test_a_walk_serves_every_event_once_in_position_order(
    lifecycle: dict[str, dict[str, str]], db_url: str, sql: psycopg.Connection
) -> None:
    page = read_all(db_url)
    ids = [e.id for e in page.events]
    assert ids == by_position(sql)
    assert len(ids) == 5 + 4 + 4  # enqueued, leased, then one action each
    assert page.next == feed.Position(*map(int, sql.execute(
        "SELECT xid::text, id FROM review_queue_event ORDER BY xid DESC, id DESC LIMIT 1"
    ).fetchone()))  # fmt: skip
    # Each event carries its item as it stood right after it; the cursor of the last is where the
    # walk ended.
    resolved = [e for e in page.events if e.event == "RESOLVED"]
    assert resolved and all(e.item.state == "RESOLVED" for e in resolved)
    assert {e.item.state for e in page.events if e.event == "ENQUEUED"} == {"PENDING"}
    assert {e.item.state for e in page.events if e.event == "LEASED"} == {"ASSIGNED"}
    assert {e.item_as_of for e in page.events} == {"event"}
    assert page.events[-1].cursor == page.next
    assert_resumable(db_url, page.events, limit=3)


@pytest.mark.parametrize("limit", [2, 3, 5])
def test_a_page_holds_limit_events_while_there_are_more(
    lifecycle: dict[str, dict[str, str]], db_url: str, sql: psycopg.Connection, limit: int
) -> None:
    """Each position here serves one event, so every page but the last is full: a page that stops
    at `limit - 1` (or scans one position short) makes a consumer read more often for nothing."""
    total = len(by_position(sql))
    for kw in ({}, {"events": list(feed.EVENTS_OF_TYPE.values())}):  # unfiltered, and filtered
        sizes: list[int] = []
        page = read_all(db_url, limit=limit, sizes=sizes, **kw)
        full, rest = divmod(total, limit)
        assert sizes == [limit] * full + ([rest] if rest else []), (kw, sizes)
        assert len(page.events) == total


def test_a_filter_serves_only_its_events_and_still_moves_on(
    lifecycle: dict[str, dict[str, str]], db_url: str, sql: psycopg.Connection
) -> None:
    page = read_all(db_url, events=["RESOLVED", "RELEASED"], limit=1)
    expected = [
        int(r[0])
        for r in sql.execute(
            "SELECT id FROM review_queue_event WHERE event IN ('RESOLVED', 'RELEASED') ORDER BY xid, id"
        )
    ]
    assert [e.id for e in page.events] == expected and len(expected) == 3
    assert page.next == read_all(db_url).next  # the whole feed was walked, not only the matches


def test_an_open_transaction_holds_the_feed_back_and_is_never_skipped(
    client: TestClient, auth: Headers, db_url: str, superuser_url: str, sql: psycopg.Connection
) -> None:
    admin = auth("ada", "admin")
    first = client.post("/items", json=item_body(), headers=admin).json()
    with psycopg.connect(libpq(superuser_url)) as slow:
        # An event written early (a low id) by a transaction that commits late.
        slow.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " VALUES (%s, 'RENEWED', 'slow', 0, %s)",
            (first["id"], first["trace_id"]),
        )
        (slow_id,) = slow.execute("SELECT max(id) FROM review_queue_event").fetchone()  # type: ignore[misc]
        for _ in range(3):
            assert client.post("/items", json=item_body(), headers=admin).status_code == 201
        # Committed events with higher ids wait behind it: a reader that kept "the last id" would
        # take them now and never see the slow one.
        held_back = read_all(db_url)
        assert [e.id for e in held_back.events] == [i for i in by_position(sql) if i < slow_id]
        slow.commit()
    after = read_all(db_url, held_back.next)
    assert slow_id in [e.id for e in after.events]
    assert [e.id for e in held_back.events + after.events] == by_position(sql)


def test_an_items_events_come_in_their_own_order_when_a_lower_xid_writes_later(
    client: TestClient, auth: Headers, db_url: str, sql: psycopg.Connection
) -> None:
    """A transaction takes its xid, then a renew of item X commits (a higher xid), then the first
    transaction releases X: by position, RELEASED (lower xid) comes before RENEWED. The feed serves
    X's events in their own order, each once, and the walk's other events where they belong."""
    admin, alice = auth("ada", "admin"), auth("alice", "reviewer")
    for _ in range(2):
        client.post("/items", json=item_body(), headers=admin)
    x, other = client.post("/leases", json={"batch_size": 2}, headers=alice).json()["items"]

    async def release_x_after_a_renew() -> None:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=5000, statement_timeout_ms=10_000) as conn:
                await conn.execute(text("SELECT pg_current_xact_id()"))  # the xid, taken first
                renewed = client.post(f"/items/{x['id']}/renew", headers=alice)
                assert renewed.status_code == 200, renewed.text
                assert client.post(f"/items/{other['id']}/renew", headers=alice).status_code == 200
                outcome, _, _ = await queue.admin_release_item(
                    Transaction(conn), item_id=x["id"], actor="ada", reason="inverted"
                )
                assert outcome == "done"
        finally:
            await engine.dispose()

    asyncio.run(release_x_after_a_renew())
    x_by_id = [
        r[0]
        for r in sql.execute(
            "SELECT event FROM review_queue_event WHERE item_id = %s ORDER BY id", (x["id"],)
        )
    ]
    x_by_position = [
        r[0]
        for r in sql.execute(
            "SELECT event FROM review_queue_event WHERE item_id = %s ORDER BY xid, id", (x["id"],)
        )
    ]
    assert x_by_id[-2:] == ["RENEWED", "RELEASED"] and x_by_position[-2:] == ["RELEASED", "RENEWED"], (
        "the arrangement did not invert the positions"
    )
    for limit in (1, 2, 100):
        page = read_all(db_url, limit=limit)
        ids = [e.id for e in page.events]
        assert sorted(ids) == sorted(by_position(sql)), f"limit {limit}: not every event exactly once"
        assert [e.event for e in page.events if str(e.item_id) == x["id"]] == x_by_id
        # RENEWED is served early, with RELEASED at RELEASED's position, and not again at its own.
        x_ids = [e.id for e in page.events if str(e.item_id) == x["id"]]
        assert page.events[ids.index(x_ids[-1])].cursor != page.events[ids.index(x_ids[-2])].cursor
        assert_resumable(db_url, page.events, limit=limit)


@pytest.mark.parametrize(
    "cursor",
    ["0" * 32, "ffffffffffffffff7fffffffffffffff", "00000000000000010000000000000001"],
)
def test_every_cursor_of_the_pattern_is_a_position(cursor: str) -> None:
    assert feed.Position.decode(cursor).encode() == cursor
    assert feed.Position.decode(cursor).xid <= feed.MAX_XID and feed.Position.decode(cursor).id <= feed.MAX_ID


def enqueued_at_xids(sql: psycopg.Connection, *xids: int) -> list[Any]:
    """One item per xid, each with its ENQUEUED event written at that xid (as a restored trail of
    old transactions would hold it); the items' ids, in the order of `xids`."""
    from tests.support import seed_items

    seed_items(sql, len(xids))
    items = [r[0] for r in sql.execute("SELECT id FROM review_queue_item ORDER BY created_at")]
    for item, xid in zip(items, xids, strict=True):
        sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, xid)"
            " SELECT id, 'ENQUEUED', 'ingest', 0, trace_id, %s::text::xid8"
            " FROM review_queue_item WHERE id = %s",
            (xid, item),
        )
    return items


def test_positions_compare_as_numbers_not_as_text(db_url: str, sql: psycopg.Connection) -> None:
    """xid 9 comes before xid 10 (as text it would not)."""
    first, second = enqueued_at_xids(sql, 10, 9)
    assert [str(e.item_id) for e in read_all(db_url).events] == [str(second), str(first)]


def test_the_head_is_the_last_position_by_number_not_by_text(db_url: str, sql: psycopg.Connection) -> None:
    """Before: the head's query sorted by its own output column `xid::text`, so of xids 9 and 10
    it chose 9; in a cluster past xid 100,000 the head stayed at 99,999 and no long-poll at the
    head was ever woken (bench 11b's pollers received nothing)."""
    enqueued_at_xids(sql, 9, 10)
    (last_id,) = sql.execute("SELECT id FROM review_queue_event WHERE xid = '10'").fetchone()

    async def head() -> feed.Position:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=10_000) as conn:
                return await feed.head(conn)
        finally:
            await engine.dispose()

    assert asyncio.run(head()) == feed.Position(10, last_id)


def _resolve(client: TestClient, heads: dict[str, dict[str, str]], item_id: str, note: str) -> None:
    (held,) = client.post("/leases", json={"batch_size": 1}, headers=heads["alice"]).json()["items"]
    assert held["id"] == item_id
    done = client.post(
        f"/items/{item_id}/complete", json={"resolution": "APPROVED", "note": note}, headers=heads["alice"]
    )
    assert done.status_code == 200 and done.json()["item"]["state"] == "RESOLVED", done.text


def resolved_reopened_revised(client: TestClient, auth: Headers) -> dict[str, Any]:
    """An item resolved at 12.50 ("first look"), reopened, revised to 31.75, resolved again."""
    heads = {"admin": auth("ada", "admin"), "alice": auth("alice", "reviewer")}
    item = client.post("/items", json=item_body(variance_amount="12.50"), headers=heads["admin"]).json()
    _resolve(client, heads, item["id"], "first look")
    reopened = client.post(
        f"/items/{item['id']}/reopen", json={"reason": "re-issued"}, headers=heads["admin"]
    )
    assert reopened.status_code == 200, reopened.text
    revised = client.post(
        f"/items/{item['id']}/revisions",
        json={"variance_amount": "31.75", "source_hash": "h-revised"},
        headers=heads["admin"],
    )
    assert revised.status_code == 200 and revised.json()["outcome"] == "revised", revised.text
    _resolve(client, heads, item["id"], "second look")
    return dict(item)


def test_each_event_carries_its_item_as_it_stood_right_after_it(
    client: TestClient, auth: Headers, db_url: str
) -> None:
    """Issue 42: the first RESOLVED still says RESOLVED at 12.50 with its note after the item was
    reopened, revised and resolved again (it said the item as it is now: 31.75, "second look"),
    in the feed and in a webhook retry's read (events_by_id), and GET /events says so too."""
    enqueued = resolved_reopened_revised(client, auth)
    item_id = enqueued["id"]
    events = [e for e in read_all(db_url).events if str(e.item_id) == item_id]
    stood = [
        (e.event, e.item.state, str(e.item.variance_amount), e.item.resolution, e.item.resolution_note)
        for e in events
    ]
    assert stood == [
        ("ENQUEUED", "PENDING", "12.50", None, None),
        ("LEASED", "ASSIGNED", "12.50", None, None),
        ("RESOLVED", "RESOLVED", "12.50", "APPROVED", "first look"),
        ("REOPENED", "PENDING", "12.50", None, None),
        ("REVISED", "PENDING", "31.75", None, None),
        ("LEASED", "ASSIGNED", "31.75", None, None),
        ("RESOLVED", "RESOLVED", "31.75", "APPROVED", "second look"),
    ], stood
    first = events[2]
    assert (first.item.resolved_by, first.item.source_hash, first.item_as_of) == (
        "alice", enqueued["source_hash"], "event",
    )  # fmt: skip
    assert events[1].item.leased_by == "alice" and events[1].item.lease_expires_at is not None
    assert events[1].item.lease_nonce is None  # never a lease token in the feed

    async def by_id() -> dict[int, feed.FeedEvent]:
        engine = create_engine(db_url, pool_size=1, max_overflow=0)
        try:
            async with transaction(engine, lock_timeout_ms=1000, statement_timeout_ms=10_000) as conn:
                return await feed.events_by_id(conn, [first.id])
        finally:
            await engine.dispose()

    retried = asyncio.run(by_id())[first.id]
    assert (retried.item, retried.item_as_of) == (first.item, "event")
    answer = client.get("/events", params={"limit": 500}, headers=auth("audrey", "auditor")).json()
    (served,) = [e for e in answer["events"] if e["id"] == first.id]
    assert (served["item_as_of"], served["item"]["state"], served["item"]["variance_amount"]) == (
        "event", "RESOLVED", "12.50",
    )  # fmt: skip
    assert (served["item"]["resolution_note"], served["item"]["lease_token"]) == ("first look", None)
    now = client.get(f"/items/{item_id}", headers=auth("ada", "admin")).json()
    assert (now["variance_amount"], now["resolution_note"]) == ("31.75", "second look")


def test_an_event_written_before_the_item_was_kept_has_its_item_as_it_is_now(
    client: TestClient, auth: Headers, db_url: str, superuser_url: str
) -> None:
    """Events of the release before issue 42 have no item_after: served with the item as it is now,
    and `item_as_of` says so."""
    admin = auth("ada", "admin")
    item = client.post("/items", json=item_body(), headers=admin).json()
    with psycopg.connect(libpq(superuser_url), autocommit=True) as old_release:
        old_release.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " VALUES (%s, 'RENEWED', 'older', 0, %s)",
            (item["id"], item["trace_id"]),
        )
    events = [e for e in read_all(db_url).events if str(e.item_id) == item["id"]]
    assert [(e.event, e.item_as_of) for e in events] == [("ENQUEUED", "event"), ("RENEWED", "now")]
    assert events[1].item.state == "PENDING" and events[1].item.lease_nonce is None
