"""The client package (client/) against a real server: typed errors, and the work loop under short leases."""

import asyncio
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from uuid import UUID

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from api.schemas.money import currencies, minor_units
from client import (
    AlreadyHeld,
    AsyncReviewQueueClient,
    Forbidden,
    IdempotencyConflict,
    LeaseNotHeld,
    NotAssigned,
    NotFound,
    ReviewQueueClient,
    SourceChanged,
    Unauthenticated,
    ValidationFailed,
)
from client.models import ItemOut
from db import queue
from db.engine import create_engine
from db.unit import Transaction
from tests.support import LONG, seed_items, wait_for
from tests.support.servers import start_server, stop_server

LEASE_S = 1  # REVIEW_QUEUE_LOCK_TIMEOUT_MS, the minimum: the client renews every LEASE_S / 3
# The test reclaimer takes a lease back once it is expired for longer than this: a renewal may be up to
# (LEASE_S + GRACE_S) / (LEASE_S / 3) = 10.5 cadences late before an item is lost, headroom enough for a
# loaded machine, while a slow item (SLOW_S) outlives an unrenewed lease and its grace, so without
# renewals it would surely be reclaimed.
GRACE_S = 2.5
SLOW_S = 2 * (LEASE_S + GRACE_S)


@pytest.fixture
def short_lease_server(db_url: str) -> Iterator[str]:
    """A server whose leases last one second (the minimum), so renewals really matter."""
    env = {"DATABASE_URL": db_url, "REVIEW_QUEUE_LOCK_TIMEOUT_MS": str(LEASE_S * 1000)}
    process, base = start_server(env)
    yield base
    stop_server(process)


def aggressive_reclaimer(db_url: str, stop: threading.Event, grace_s: float) -> threading.Thread:
    """Reclaims anything expired for more than grace_s, every 100 ms (far stricter than production)."""

    async def run() -> None:
        engine = create_engine(db_url, pool_size=1)
        try:
            while not stop.is_set():
                async with engine.begin() as conn:
                    await queue.reclaim_expired(
                        Transaction(conn),
                        reclaim_batch=1000,
                        grace=timedelta(seconds=grace_s),
                        actor="test-reclaimer",
                    )
                await asyncio.sleep(0.1)
        finally:
            await engine.dispose()

    thread = threading.Thread(target=asyncio.run, args=(run(),))
    thread.start()
    return thread


def test_typed_errors_and_calls(live_server: str, make_token: Callable[[str, str], str]) -> None:
    with (
        ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
        ReviewQueueClient(live_server, make_token("ada", "admin")) as admin,
    ):
        # The biggest amount resolves without an approver only above materiality (issue 23).
        policy = admin.put_resolution_policy(Decimal("9999999999999999.99"))
        assert (policy.materiality_threshold, policy.updated_by) == (Decimal("9999999999999999.99"), "ada")
        assert alice.resolution_policy() == policy
        item = ingest.enqueue(
            idempotency_key="c-1",
            ledger_entity="ACME",
            variance_amount=Decimal("1234567890123456.78"),
            match_decision="PARTIAL",
            source_hash="h",
        )
        assert item.variance_amount == Decimal("1234567890123456.78")
        with pytest.raises(IdempotencyConflict) as conflict:
            ingest.enqueue(
                idempotency_key="c-1",
                ledger_entity="X",
                variance_amount="1",
                match_decision="PARTIAL",
                source_hash="h",
            )
        assert conflict.value.code == "IDEMPOTENCY_CONFLICT" and conflict.value.status == 409
        (leased,) = alice.lease(1)
        assert alice.renew(leased.id, lease_token=leased.lease_token).state == "ASSIGNED"
        done = alice.complete(leased.id, "APPROVED", note="ok", lease_token=leased.lease_token)
        assert done.outcome == "resolved"
        assert (
            alice.complete(leased.id, "APPROVED", lease_token=leased.lease_token).outcome
            == "already_resolved"
        )
        with pytest.raises(LeaseNotHeld):
            alice.release(leased.id)
        assert [e.event for e in alice.events(leased.id)] == ["ENQUEUED", "LEASED", "RENEWED", "RESOLVED"]
        with pytest.raises(NotFound):
            alice.get(leased.id.__class__(int=0))
    with ReviewQueueClient(live_server, "rq_nope") as nobody, pytest.raises(Unauthenticated):
        nobody.lease()


@pytest.mark.parametrize("batch_complete", [False, True], ids=["per-item", "batch-complete"])
def test_work_loop_drains_with_renewals_and_no_double_resolution(
    short_lease_server: str,
    make_token: Callable[[str, str], str],
    sql: psycopg.Connection,
    db_url: str,
    batch_complete: bool,
) -> None:
    """Six workers drain 300 items under one-second leases and a reclaimer far stricter than
    production's. In batch mode the slow items make a renew fall due mid-batch: the results in
    hand are flushed then, and the items still unflushed stay renewed, so none is lost."""
    total, workers = 300, 6
    seed_items(sql, total)
    slow = {f"idem-{n}" for n in range(1, total + 1, 60)}  # 5 items outlive their lease and the grace
    handled: list[str] = []

    def handler(item: ItemOut) -> tuple[str, str]:
        handled.append(str(item.id))
        if item.idempotency_key in slow:
            time.sleep(SLOW_S)
        return "APPROVED", f"by {threading.current_thread().name}"

    clients = [
        ReviewQueueClient(short_lease_server, make_token(f"bot-{n}", "reviewer")) for n in range(workers)
    ]
    if batch_complete:
        for c in clients:  # every result goes through POST /items/complete
            c.complete = None  # type: ignore[assignment,method-assign]
    stats: list = []

    def run(client: ReviewQueueClient) -> None:
        stats.append(
            client.work(handler, batch_size=5, wait_s=1, handle_signals=False, batch_complete=batch_complete)
        )

    stop_reclaim = threading.Event()
    reclaimer = aggressive_reclaimer(db_url, stop_reclaim, grace_s=GRACE_S)
    threads = [threading.Thread(target=run, args=(c,), name=f"bot-{n}") for n, c in enumerate(clients)]
    for t in threads:
        t.start()
    try:
        resolved = "SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED'"
        wait_for(lambda: sql.execute(resolved).fetchone()[0] == total, timeout=240)
    finally:
        for c in clients:
            c.stop()
        for t in threads:
            t.join(timeout=60)
        stop_reclaim.set()
        reclaimer.join(timeout=60)
    assert not any(t.is_alive() for t in [*threads, reclaimer]), "a worker or the reclaimer hung"
    for c in clients:
        c.close()

    resolved = Counter(
        r[0]
        for r in sql.execute("SELECT item_id FROM review_queue_event WHERE event = 'RESOLVED'").fetchall()
    )
    assert len(resolved) == total, f"{total - len(resolved)} items not resolved"
    assert max(resolved.values()) == 1, "an item was resolved twice"
    kinds = Counter(r[0] for r in sql.execute("SELECT event FROM review_queue_event").fetchall())
    assert kinds["RECLAIMED"] == 0, f"renewals did not keep slow items leased: {kinds}"
    renewals = Counter(
        r[0]
        for r in sql.execute(
            "SELECT i.idempotency_key FROM review_queue_event e JOIN review_queue_item i ON i.id = e.item_id"
            " WHERE e.event = 'RENEWED'"
        ).fetchall()
    )
    assert all(renewals[key] >= 1 for key in slow), f"slow items not renewed: {renewals}"
    assert sum(s.resolved for s in stats) == total and sum(s.lost for s in stats) == 0, stats
    assert Counter(handled).most_common(1)[0][1] == 1


@pytest.fixture
def no_cool_off_server(db_url: str) -> Iterator[str]:
    """A server without the release cool-off: a worker may be handed back what it released."""
    process, base = start_server({"DATABASE_URL": db_url, "REVIEW_QUEUE_RELEASE_COOLDOWN_S": "0"})
    yield base
    stop_server(process)


def test_work_loop_releases_on_handler_error(
    no_cool_off_server: str, make_token, sql: psycopg.Connection
) -> None:
    seed_items(sql, 3)
    with ReviewQueueClient(no_cool_off_server, make_token("bot", "reviewer")) as client:
        calls: list[str] = []

        def handler(item: ItemOut) -> str:
            calls.append(item.idempotency_key)
            if item.idempotency_key == "idem-2" and calls.count("idem-2") == 1:
                raise RuntimeError("upstream ledger timed out")
            if len(calls) >= 4:
                client.stop()
            return "APPROVED"

        stats = client.work(handler, batch_size=3, wait_s=1, handle_signals=False)
    assert calls == ["idem-1", "idem-2", "idem-3", "idem-2"]
    assert (stats.resolved, stats.released) == (3, 1)
    reason = sql.execute(
        "SELECT details->>'reason' FROM review_queue_event WHERE event = 'RELEASED'"
    ).fetchone()[0]
    assert "upstream ledger timed out" in reason


def test_async_client_work_loop(live_server: str, make_token, sql: psycopg.Connection) -> None:
    seed_items(sql, 40)
    tokens = [make_token(f"a{n}", "reviewer") for n in range(3)]

    def unresolved() -> int:
        return sql.execute("SELECT count(*) FROM review_queue_item WHERE state <> 'RESOLVED'").fetchone()[0]

    async def main() -> list:
        async def handler(item: ItemOut) -> str:
            await asyncio.sleep(0)
            return "APPROVED"

        clients = [AsyncReviewQueueClient(live_server, token) for token in tokens]

        async def run(client: AsyncReviewQueueClient) -> object:
            task = asyncio.create_task(client.work(handler, batch_size=4, wait_s=1, handle_signals=False))
            while unresolved():  # noqa: ASYNC110 - polling the database, not an in-process event
                await asyncio.sleep(0.05)
            client.stop()
            result = await task
            await client.aclose()
            return result

        return await asyncio.gather(*(run(c) for c in clients))

    stats = asyncio.run(main())
    assert sum(s.resolved for s in stats) == 40
    rows = sql.execute(
        "SELECT count(*), count(DISTINCT item_id) FROM review_queue_event WHERE event = 'RESOLVED'"
    )
    assert rows.fetchone() == (40, 40)


def test_resolution_policy_in_both_halves(live_server: str, make_token: Callable[[str, str], str]) -> None:
    admin_token, alice_token = make_token("ada", "admin"), make_token("alice", "reviewer")
    with ReviewQueueClient(live_server, alice_token) as alice:
        assert alice.resolution_policy().materiality_threshold == Decimal("10000.00")
        codes = {c.code: c for c in alice.resolutions()}
        assert codes["APPROVED"].effective_approval_threshold == Decimal("10000.00")
        assert codes["WRITE_OFF"].effective_approval_threshold == Decimal("1000.00")
        with pytest.raises(Forbidden):
            alice.put_resolution_policy("1.00")

    async def main() -> None:
        async with AsyncReviewQueueClient(live_server, admin_token) as admin:
            saved = await admin.put_resolution_policy("500.00")
            assert (saved.materiality_threshold, saved.updated_by) == (Decimal("500.00"), "ada")
            assert await admin.resolution_policy() == saved
            codes = {c.code: c for c in await admin.resolutions()}
            assert codes["WRITE_OFF"].effective_approval_threshold == Decimal("500.00")

    asyncio.run(main())


def test_events_follow_every_page(live_server: str, make_token, sql: psycopg.Connection) -> None:
    """An audit trail longer than one page (500) comes back whole, from both clients."""
    with ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest:
        item = ingest.enqueue(
            idempotency_key="long-trail", ledger_entity="E", variance_amount=Decimal("1.00"),
            match_decision="PARTIAL", source_hash="h",
        )  # fmt: skip
        sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 'alice', 0, trace_id FROM review_queue_item, generate_series(1, 1200)"
            " WHERE id = %s",
            (item.id,),
        )
        trail = ingest.events(item.id)
    assert len(trail) == 1201 and trail[0].event == "ENQUEUED"
    assert [e.id for e in trail] == sorted({e.id for e in trail})

    token = make_token("ops", "admin")

    async def read() -> list[int]:
        async with AsyncReviewQueueClient(live_server, token) as client:
            return [e.id for e in await client.events(item.id)]

    assert asyncio.run(read()) == [e.id for e in trail]


def test_revision_and_override_calls(live_server: str, make_token: Callable[[str, str], str]) -> None:
    with (
        ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest,
        ReviewQueueClient(live_server, make_token("ada", "admin")) as ada,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
        ReviewQueueClient(live_server, make_token("bob", "reviewer")) as bob,
    ):
        for n in range(3):
            ingest.enqueue(
                idempotency_key=f"o-{n}", ledger_entity="ACME", variance_amount="1.00",
                match_decision="PARTIAL", source_hash=f"h-{n}",
            )  # fmt: skip
        first, second, third = alice.lease(3)
        revision = ingest.revise(first.id, variance_amount=Decimal("2.50"), source_hash="h-0b")
        assert (revision.outcome, revision.item.variance_amount) == ("revised", Decimal("2.50"))
        with pytest.raises(SourceChanged) as changed:
            alice.complete(first.id, "APPROVED", lease_token=first.lease_token)
        assert changed.value.item.variance_amount == Decimal("2.50") and changed.value.item.lease_token
        done = alice.complete(first.id, "APPROVED", lease_token=changed.value.item.lease_token)
        assert done.item.source_hash == "h-0b"

        moved = ada.reassign(second.id, reviewer="bob", reason="cover")
        assert moved.leased_by == "bob"
        with pytest.raises(AlreadyHeld):
            ada.reassign(second.id, reviewer="bob", reason="again")
        assert bob.get(second.id).lease_token is not None
        assert ada.admin_release(third.id, reason="leave").state == "PENDING"
        with pytest.raises(NotAssigned):
            ada.admin_release(third.id, reason="leave")
        released = ada.admin_release_reviewer("bob", reason="leave")
        assert [i.id for i in released.items] == [second.id]


def test_work_loop_decides_again_when_the_figures_change(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    """The handler's first look is at the old figures; the source is revised meanwhile; the
    completion is refused with SOURCE_CHANGED and the loop decides again on the new figures."""
    seen: list[Decimal] = []
    with (
        ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest,
        ReviewQueueClient(live_server, make_token("worker", "reviewer")) as worker,
    ):
        item = ingest.enqueue(
            idempotency_key="w-1", ledger_entity="ACME", variance_amount="1.00",
            match_decision="PARTIAL", source_hash="w-1a",
        )  # fmt: skip

        def handler(leased: ItemOut) -> str:
            seen.append(leased.variance_amount)
            if len(seen) == 1:
                ingest.revise(leased.id, variance_amount="250.00", source_hash="w-1b")
            else:
                worker.stop()
            return "APPROVED" if leased.variance_amount < 100 else "TIMING_DIFFERENCE"

        stats = worker.work(handler, wait_s=1, handle_signals=False)
        assert seen == [Decimal("1.00"), Decimal("250.00")]
        assert (stats.resolved, stats.revised) == (1, 1)
        final = worker.get(item.id)
        assert (final.state, final.resolution, final.source_hash) == ("RESOLVED", "TIMING_DIFFERENCE", "w-1b")


class Crash(BaseException):
    """Not an Exception: the worker process dies, nothing in `work` handles it."""


def test_batch_mode_flushes_on_stop_and_a_crash_loses_nothing(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    seed_items(sql, 6)
    with ReviewQueueClient(live_server, make_token("bot", "reviewer")) as client:
        handled: list[str] = []

        def crashing(item: ItemOut) -> str:
            handled.append(item.idempotency_key)
            if len(handled) == 3:
                raise Crash
            return "APPROVED"

        with pytest.raises(Crash):
            client.work(crashing, batch_size=6, wait_s=1, handle_signals=False, batch_complete=True)
        # Nothing was flushed: every item is still leased (none resolved, none released).
        states = sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall()
        assert states == [("ASSIGNED", 6)], states

        sql.execute("UPDATE review_queue_item SET lease_expires_at = now() - interval '1 hour'")
        admin = {"Authorization": f"Bearer {make_token('admin', 'admin')}"}
        reclaimed = httpx.post(f"{live_server}/admin/reclaim", json={}, headers=admin)
        assert reclaimed.json()["reclaimed"] == 6, reclaimed.text

        def stopping(item: ItemOut) -> str:
            handled.append(item.idempotency_key)
            if len(handled) == 3 + 4:
                client.stop()
            return "APPROVED"

        stats = client.work(stopping, batch_size=6, wait_s=1, handle_signals=False, batch_complete=True)
    # Stopped after the fourth item: those four were flushed, the other two released.
    assert (stats.resolved, stats.released, stats.lost) == (4, 2, 0), stats
    rows = sql.execute(
        "SELECT state, count(*) FROM review_queue_item GROUP BY state ORDER BY state"
    ).fetchall()
    assert rows == [("PENDING", 2), ("RESOLVED", 4)], rows


def test_a_named_lease_the_cool_off_and_my_decisions_from_both_clients(live_server: str, make_token) -> None:
    """Issue 24 through the client: lease(item_id=...) takes exactly that item, a released item is
    not handed back by the next lease (the cool-off), and decisions() lists what was decided."""
    with (
        ReviewQueueClient(live_server, make_token("feeder", "ingest")) as feeder,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
    ):
        first, second = (
            feeder.enqueue(
                idempotency_key=f"named-{n}",
                ledger_entity="E",
                variance_amount=Decimal("1.00"),
                match_decision="PARTIAL",
                source_hash=f"h{n}",
            )
            for n in range(2)
        )
        (named,) = alice.lease(item_id=second.id)
        assert named.id == second.id
        alice.release(named.id, lease_token=named.lease_token)
        assert [i.id for i in alice.lease()] == [first.id]  # not the one she released
        assert alice.lease(item_id=first.id) == []  # hers already: nothing to lease
        alice.complete(first.id, "APPROVED", lease_token=alice.get(first.id).lease_token)
        assert [(d.event.event, d.item.id) for d in alice.decisions()] == [("RESOLVED", first.id)]
        token = make_token("alice", "reviewer")

    async def read() -> tuple[list[UUID], list[str]]:
        async with AsyncReviewQueueClient(live_server, token) as client:
            taken_back = [i.id for i in await client.lease(item_id=second.id)]  # named: she may
            return taken_back, [d.event.event for d in await client.decisions()]

    assert asyncio.run(read()) == ([second.id], ["RESOLVED"])


def test_feed_iterates_every_event_resumes_from_a_cursor_and_follows(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    """`feed` (sync and async) walks the change feed page by page; a stored cursor resumes it; with
    `follow`, it long-polls and hands over an event that commits while it waits."""
    admin = ReviewQueueClient(live_server, make_token("ada", "admin"))
    reader = ReviewQueueClient(live_server, make_token("ingrid", "integration"))
    for n in range(5):
        admin.enqueue(idempotency_key=f"feed-{n}", ledger_entity="E", variance_amount=Decimal("1.00"),
                      match_decision="PARTIAL", source_hash=f"h{n}")  # fmt: skip
    everything = list(reader.feed(limit=2, follow=False))
    by_position = [r[0] for r in sql.execute("SELECT id FROM review_queue_event ORDER BY xid, id")]
    assert [e.id for e in everything] == by_position and len(by_position) == 5
    assert all(e.event == "ENQUEUED" and e.item.lease_token is None for e in everything)
    assert [e.id for e in reader.feed(everything[1].cursor, follow=False)] == by_position[2:]
    with pytest.raises(Forbidden):
        list(ReviewQueueClient(live_server, make_token("rita", "reviewer")).feed(follow=False))

    token = make_token("ingo", "integration")

    async def follow() -> list[int]:
        async with AsyncReviewQueueClient(live_server, token) as client:
            got = []
            async for event in client.feed(everything[-1].cursor, wait_s=20, types=["RESOLVED", "ENQUEUED"]):
                got.append(event.id)
                return got
        return []

    later = threading.Timer(
        0.5,
        lambda: admin.enqueue(
            idempotency_key="feed-late",
            ledger_entity="E",
            variance_amount=Decimal("2.00"),
            match_decision="PARTIAL",
            source_hash="late",
        ),
    )
    later.start()
    (late,) = asyncio.run(follow())
    later.join()
    assert late == max(r[0] for r in sql.execute("SELECT id FROM review_queue_event"))


def test_verify_webhook_takes_a_genuine_delivery_and_refuses_a_forged_one() -> None:
    from datetime import UTC, datetime

    from standardwebhooks import Webhook

    from client import InvalidWebhook, verify_webhook

    secret = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"type":"item.resolved","timestamp":"2026-12-03T09:05:12+00:00","data":{}}'
    # The server's clock is the database's; a receiver checks freshness against its own.
    now = datetime.now(UTC)
    headers = {
        "Webhook-Id": "evt_1",
        "Webhook-Timestamp": str(int(now.timestamp())),
        "Webhook-Signature": Webhook(secret).sign("evt_1", now, body),
    }
    assert verify_webhook(headers, body, secret)["type"] == "item.resolved"
    assert ReviewQueueClient.verify_webhook(headers, body, secret) == AsyncReviewQueueClient.verify_webhook(
        headers, body, secret
    )
    for forged in (body.replace(b"resolved", b"approved"), body + b" "):
        with pytest.raises(InvalidWebhook):
            verify_webhook(headers, forged, secret)
    with pytest.raises(InvalidWebhook):
        verify_webhook({**headers, "Webhook-Id": "evt_2"}, body, secret)
    with pytest.raises(InvalidWebhook):
        verify_webhook(headers, body, "whsec_" + "A" * 32)


def test_the_token_can_be_a_function_called_for_every_request(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    """An identity provider's client-credentials token expires: the client asks for the current one
    before every request (both halves)."""
    seed_items(sql, 4)
    tokens = iter([make_token("first", "reviewer"), make_token("second", "reviewer")])
    with ReviewQueueClient(live_server, lambda: next(tokens)) as client:
        assert [i.leased_by for i in client.lease(batch_size=1)] == ["first"]
        assert [i.leased_by for i in client.lease(batch_size=1)] == ["second"]
    later = iter([make_token("third", "reviewer"), make_token("fourth", "reviewer")])

    async def run() -> list[str | None]:
        async with AsyncReviewQueueClient(live_server, lambda: next(later)) as client:
            return [(await client.lease(batch_size=1))[0].leased_by for _ in range(2)]

    assert asyncio.run(run()) == ["third", "fourth"]


def test_lease_not_held_says_when_the_reclaimer_took_the_lease_back(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    from tests.support import backdate_lease

    seed_items(sql, 1)
    admin = make_token("ada", "admin")
    with ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice:
        (leased,) = alice.lease(1)
        backdate_lease(sql, leased.id)
        reclaimed_now = httpx.post(
            f"{live_server}/admin/reclaim", headers={"Authorization": f"Bearer {admin}"}
        )
        assert reclaimed_now.json()["reclaimed"] == 1
        with pytest.raises(LeaseNotHeld) as lost:
            alice.complete(leased.id, "APPROVED", lease_token=leased.lease_token)
        (reclaimed,) = [e for e in alice.events(leased.id) if e.event == "RECLAIMED"]
    assert lost.value.reclaimed_at == reclaimed.at
    assert lost.value.lease_expired_at == datetime.fromisoformat(reclaimed.details["lease_expired_at"])

    alice_again = make_token("alice", "reviewer")

    async def tokenless() -> LeaseNotHeld:
        async with AsyncReviewQueueClient(live_server, alice_again) as again:
            with pytest.raises(LeaseNotHeld) as refused:
                await again.renew(leased.id)
            return refused.value

    assert asyncio.run(tokenless()).reclaimed_at == reclaimed.at
    with (
        ReviewQueueClient(live_server, make_token("bob", "reviewer")) as bob,
        pytest.raises(LeaseNotHeld) as plain,
    ):
        bob.renew(leased.id)
    assert plain.value.reclaimed_at is None and plain.value.lease_expired_at is None


def test_reports_and_the_streamed_decisions(live_server: str, make_token: Callable[[str, str], str]) -> None:
    from datetime import UTC, date, datetime

    from client import Forbidden
    from client.models import DecisionRowOut

    with (
        ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
        ReviewQueueClient(live_server, make_token("audrey", "auditor")) as audrey,
    ):
        for n in range(3):
            ingest.enqueue(
                idempotency_key=f"r-{n}",
                ledger_entity="ACME",
                variance_amount=Decimal("-0.50"),
                match_decision="PARTIAL",
                source_hash="h",
            )
        for item in alice.lease(batch_size=3):
            alice.complete(item.id, "MATCH_CONFIRMED", lease_token=item.lease_token)
        today = datetime.now(UTC).date()
        tomorrow = date.fromordinal(today.toordinal() + 1)
        sla = audrey.report_sla(today, tomorrow, tz="Europe/Berlin")
        assert sla.from_ == today and sla.tz == "Europe/Berlin" and len(sla.buckets) == 1
        own = alice.report_throughput(today, tomorrow)
        assert own.reviewer == "alice"
        assert [(r.reviewer, r.resolved, r.decisions) for r in own.rows] == [("alice", 3, 3)]
        assert audrey.report_backlog(today, tomorrow).points[0].open == 0
        split = audrey.report_backlog(today, tomorrow, by="currency")  # nothing open: an empty split
        assert split.by == "currency" and split.points[0].by_currency == {}
        streamed = list(audrey.report_decisions(today, tomorrow))
        assert len(streamed) == 3 and all(isinstance(d, DecisionRowOut) for d in streamed)
        assert {d.variance_amount for d in streamed} == {Decimal("-0.50")}
        # The base currency's conversion, as exact decimals: rate 1, the amount itself.
        assert {(d.rate, d.base_amount) for d in streamed} == {(Decimal(1), Decimal("-0.50"))}
        with pytest.raises(Forbidden):
            list(alice.report_decisions(today, tomorrow))

    admin = make_token("ada", "admin")

    async def asynchronously() -> list[DecisionRowOut]:
        async with AsyncReviewQueueClient(live_server, admin) as ada:
            assert (await ada.report_sla(today, tomorrow)).total.fell_due == 0
            assert len((await ada.report_throughput(today, tomorrow)).rows) == 1
            assert len((await ada.report_backlog(today, tomorrow)).points) == 1
            assert (await ada.report_backlog(today, tomorrow, by="currency")).points[0].by_currency == {}
            return [d async for d in ada.report_decisions(today, tomorrow)]

    assert asyncio.run(asynchronously()) == streamed


@settings(max_examples=60 if not LONG else 600, deadline=None)
@given(data=st.data())
def _round_trip(data: st.DataObject, ingest: ReviewQueueClient, read: ReviewQueueClient) -> None:
    code = data.draw(st.sampled_from(sorted(currencies())))
    decimals = minor_units(code)
    whole = data.draw(st.integers(min_value=-(10**16) + 1, max_value=10**16 - 1))
    fraction = data.draw(st.integers(min_value=0, max_value=10**decimals - 1))
    text = f"{whole}" + (f".{fraction:0{decimals}d}" if decimals else "")
    if whole == 0 and text.startswith("-"):
        text = text[1:]
    sent = Decimal(text)
    item = ingest.enqueue(
        idempotency_key=f"prop-{uuid.uuid4()}", ledger_entity="ACME-GMBH", variance_amount=sent,
        currency=code, match_decision="PARTIAL", source_hash="sha256:prop",
    )  # fmt: skip
    again = read.get(item.id)
    for got in (item, again):
        assert got.currency == code
        # Exactly the decimals sent: Decimal equality would also take 1.5 for 1.50.
        assert str(got.variance_amount) == text, (code, text, got.variance_amount)


def test_every_iso_currencys_minor_units_round_trip_exactly_through_the_api_and_the_client(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    """Issue 40: an amount in any currency of the ISO list, with exactly its minor units, comes back
    through the API and the Python client as the same decimal string (never via a float)."""
    with (
        ReviewQueueClient(live_server, make_token("ingest", "ingest")) as ingest,
        ReviewQueueClient(live_server, make_token("audrey", "auditor")) as read,
    ):
        _round_trip(ingest=ingest, read=read)


def test_a_comment_from_both_clients_is_in_the_trail_and_changes_nothing(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    """Issue 42 through the client: comment() appends a COMMENTED event; a blank one is refused
    with the typed validation error."""
    with (
        ReviewQueueClient(live_server, make_token("feeder", "ingest")) as feeder,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
    ):
        item = feeder.enqueue(
            idempotency_key="commented",
            ledger_entity="E",
            variance_amount=Decimal("1.00"),
            match_decision="PARTIAL",
            source_hash="hc",
        )
        said = alice.comment(item.id, text="Statement 4471 covers it.")
        assert (said.event, said.actor, said.details) == (
            "COMMENTED",
            "alice",
            {"text": "Statement 4471 covers it."},
        )
        with pytest.raises(ValidationFailed):
            alice.comment(item.id, text="   ")
        token = make_token("audrey", "auditor")

    async def read() -> list[tuple[str, str]]:
        async with AsyncReviewQueueClient(live_server, token) as client:
            await client.comment(item.id, text="Seen in the audit.")
            return [(e.event, e.actor) for e in await client.events(item.id)]

    trail = asyncio.run(read())
    assert trail[-2:] == [("COMMENTED", "alice"), ("COMMENTED", "audrey")], trail


def test_my_decisions_carry_the_rejection_in_the_client(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    """Issue 42, part 3 through the client: decisions() parses `rejection` on a rejected submission."""
    with (
        ReviewQueueClient(live_server, make_token("feeder", "ingest")) as feeder,
        ReviewQueueClient(live_server, make_token("alice", "reviewer")) as alice,
        ReviewQueueClient(live_server, make_token("bob", "approver")) as bob,
    ):
        item = feeder.enqueue(
            idempotency_key="rejected-in-client",
            ledger_entity="E",
            variance_amount=Decimal("25000.00"),
            match_decision="PARTIAL",
            source_hash="hr",
        )
        (held,) = alice.lease(item_id=item.id)
        assert alice.complete(held.id, "ADJUSTMENT_POSTED", note="JE-9", lease_token=held.lease_token)
        (proposal,) = bob.lease(queue="approval")
        bob.reject(proposal.id, reason="wrong entity", lease_token=proposal.lease_token)
        (decision,) = alice.decisions()
        assert decision.event.event == "SUBMITTED_FOR_APPROVAL" and decision.item.state == "PENDING"
        assert decision.rejection is not None
        assert (decision.rejection.by, decision.rejection.reason) == ("bob", "wrong entity")


def test_items_searches_through_every_page_from_both_clients(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    """Issue 42 through the client: items(q=...) reads GET /items a page (200) at a time, lazily,
    and finds the start of a context value in any letter case; other filters pass through."""
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, context, created_at)"
        " SELECT 'client-search-' || g, 'E', 1, 'PARTIAL', 'h', jsonb_build_object('invoice', 'INV-77' || g),"
        " now() - g * interval '1 second' FROM generate_series(1, 203) g"
    )
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, context) VALUES ('client-other', 'E', 1, 'PARTIAL', 'h', '{\"invoice\": \"INV-78\"}')"
    )
    token = make_token("alice", "reviewer")
    with ReviewQueueClient(live_server, token) as alice:
        found = list(alice.items(q="inv-77"))
        assert [i.idempotency_key for i in found] == [f"client-search-{g}" for g in range(203, 0, -1)]
        assert [i.idempotency_key for i in alice.items(q="INV-77203")] == ["client-search-203"]
        assert list(alice.items(q="inv-77", state="RESOLVED")) == []

    async def read() -> list[str]:
        async with AsyncReviewQueueClient(live_server, token) as client:
            return [i.idempotency_key async for i in client.items(q="INV-78", sort="due_at")]

    assert asyncio.run(read()) == ["client-other"]
