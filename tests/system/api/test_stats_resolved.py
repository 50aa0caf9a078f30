"""/stats' RESOLVED count from the rollup (db/stats.py): exactly count(*) of the RESOLVED rows after
real histories through the API (completions, approvals, admin reopenings, revisions of resolved
items, resolutions on both sides of the rollup's edge, rows written by hand), and with roll-ups
running while completions and reopenings are in flight on other connections."""

import asyncio
import random
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import httpx
import psycopg
from fastapi.testclient import TestClient
from sqlalchemy import text

from api.settings import Settings
from cli import reclaimer
from db import queue, stats
from db.engine import create_engine
from db.unit import Transaction
from tests.support import seed_items
from tests.support.api import Auth, item_body
from tests.support.approval import lease_one
from tests.support.postgres import libpq

NOW = timedelta(0)  # a roll-up margin of nothing: the edge goes as far as the guard lets it
RESOLVED_ONE = "SELECT 1 FROM review_queue_item WHERE id = %s AND state = 'RESOLVED'"


def resolved_in_stats(client: TestClient, headers: dict[str, str]) -> int:
    response = client.get("/stats", headers=headers)
    assert response.status_code == 200, response.text
    count: int = response.json()["counts"]["RESOLVED"]
    return count


def resolved_rows(sql: psycopg.Connection) -> int:
    row = sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED'").fetchone()
    assert row is not None
    return int(row[0])


def roll_up(settings: Settings, db_url: str) -> stats.RolledUp:
    rolled = asyncio.run(reclaimer.roll_up_once(settings, db_url, margin=NOW))
    assert rolled is not None and rolled.caught_up, rolled
    return rolled


def complete(client: TestClient, headers: dict[str, str], resolution: str = "WRITE_OFF") -> str:
    leased = lease_one(client, headers)
    done = client.post(
        f"/items/{leased['id']}/complete",
        json={"resolution": resolution, "note": "n", "lease_token": leased["lease_token"]},
        headers=headers,
    )
    assert done.status_code == 200, done.text
    item_id: str = leased["id"]
    return item_id


def test_the_count_is_exact_through_a_history_with_reopenings_and_revisions(
    client: TestClient, auth: Auth, sql: psycopg.Connection, settings: Settings, db_url: str
) -> None:
    admin, alice, bob = auth("ada", "admin"), auth("alice", "reviewer"), auth("bob", "approver")

    def check(when: str) -> None:
        assert resolved_in_stats(client, alice) == resolved_rows(sql), when

    # Two months of history written by hand (several roll-up steps), and rows with no resolved_at.
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, state, resolution, resolved_by, resolved_at, created_at)"
        " SELECT 'old-' || i, 'E', 1, 'PARTIAL', 'h', 'RESOLVED', 'OK', 'r',"
        "        CASE WHEN i % 50 = 0 THEN NULL ELSE now() - i * interval '6 hours' END,"
        "        now() - interval '90 days'"
        " FROM generate_series(1, 240) AS i"
    )
    check("history written by hand, never rolled up")
    first = roll_up(settings, db_url)
    assert first.resolved == 240 - 4, first  # the four without resolved_at stay in the live count
    check("after the first roll-up")

    # Completions and approvals, rolled up.
    for _ in range(8):
        client.post("/items", json=item_body(), headers=admin)
    resolved = [complete(client, alice) for _ in range(6)]
    policy = client.put("/resolutions/policy", json={"materiality_threshold": "10000.00"}, headers=admin)
    assert policy.status_code == 200, policy.text
    client.post("/items", json=item_body(variance_amount="25000.00"), headers=admin)
    proposal = complete(client, alice, "ADJUSTMENT_POSTED")
    approval = lease_one(client, bob, "approval")
    approved = client.post(
        f"/items/{proposal}/approve", json={"lease_token": approval["lease_token"]}, headers=bob
    )
    assert approved.status_code == 200, approved.text
    check("completions and an approval, not rolled up")
    rolled = roll_up(settings, db_url)
    check("completions and an approval, rolled up")
    assert rolled.resolved == resolved_rows(sql) - 4, rolled

    # Rolled-up decisions taken back (an admin's reopen, a revision of the source), and one old row.
    def reopen(item_id: str) -> None:
        answer = client.post(f"/items/{item_id}/reopen", json={"reason": "wrong"}, headers=admin)
        assert answer.status_code == 200, answer.text

    old = sql.execute("SELECT id FROM review_queue_item WHERE idempotency_key = 'old-7'").fetchone()
    assert old is not None
    reopen(resolved[0])
    reopen(proposal)
    reopen(str(old[0]))
    revised = client.post(
        f"/items/{resolved[1]}/revisions",
        json={"variance_amount": "99.10", "source_hash": "sha256:rerun-2", "match_decision": "PARTIAL"},
        headers=auth("ivan", "ingest"),
    )
    assert revised.status_code == 200, revised.text
    check("rolled-up resolutions reopened since the roll-up")

    # Resolved again (after the edge), then a resolution after the edge reopened before any roll-up.
    again = [complete(client, alice) for _ in range(4)]
    check("reopened items resolved again")
    # (the reopened proposal, above the threshold, went back for approval: not RESOLVED)
    again = [i for i in again if sql.execute(RESOLVED_ONE, (i,)).fetchone() is not None]
    assert len(again) >= 2, again
    reopen(again[0])
    check("a resolution after the edge reopened")
    roll_up(settings, db_url)
    check("rolled up again")
    reopen(again[1])
    reopen(resolved[2])
    check("reopenings on both sides of the edge")
    for _ in range(3):
        roll_up(settings, db_url)
        check("repeated roll-ups change nothing")
    final = roll_up(settings, db_url)
    assert final.resolved == resolved_rows(sql) - 4, final


async def _hold_open_across_a_roll_up(
    db_url: str, settings: Settings, work: Callable[[Transaction], Any]
) -> None:
    """`work` in a transaction of the service's role that began before a roll-up and commits after it."""
    engine = create_engine(db_url, pool_size=2, max_overflow=0)
    try:
        async with engine.connect() as conn:
            transaction = await conn.begin()
            await conn.execute(text("SELECT pg_sleep(0.05)"))  # its start is clearly before the roll-up
            await work(Transaction(conn))
            # The roll-up, on its own connection, while this transaction is still open.
            rolled = await reclaimer.roll_up(engine, settings, margin=NOW)
            assert rolled is not None
            await transaction.commit()
    finally:
        await engine.dispose()


def test_a_completion_begun_before_a_roll_up_and_committed_after_it_is_counted(
    client: TestClient, auth: Auth, sql: psycopg.Connection, settings: Settings, db_url: str
) -> None:
    alice = auth("alice", "reviewer")
    seed_items(sql, 3)
    complete(client, alice)
    roll_up(settings, db_url)
    leased = lease_one(client, alice)

    async def resolve(unit: Transaction) -> None:
        outcome, _ = await queue.complete_item(
            unit, item_id=UUID(leased["id"]), reviewer="alice", resolution="WRITE_OFF", note="n"
        )
        assert outcome == "resolved", outcome

    asyncio.run(_hold_open_across_a_roll_up(db_url, settings, resolve))
    assert resolved_in_stats(client, alice) == resolved_rows(sql) == 2
    roll_up(settings, db_url)
    assert resolved_in_stats(client, alice) == resolved_rows(sql) == 2


def test_a_reopening_committed_after_a_roll_up_that_did_not_see_it_is_taken_off(
    client: TestClient, auth: Auth, sql: psycopg.Connection, settings: Settings, db_url: str
) -> None:
    alice = auth("alice", "reviewer")
    seed_items(sql, 3)
    done = [complete(client, alice) for _ in range(3)]
    roll_up(settings, db_url)

    async def reopen(unit: Transaction) -> None:
        outcome, _ = await queue.reopen_item(unit, item_id=UUID(done[0]), actor="ada", reason="wrong")
        assert outcome == "done", outcome

    asyncio.run(_hold_open_across_a_roll_up(db_url, settings, reopen))
    assert resolved_in_stats(client, alice) == resolved_rows(sql) == 2
    rolled = roll_up(settings, db_url)
    assert rolled.resolved == 2, rolled
    assert resolved_in_stats(client, alice) == resolved_rows(sql) == 2


def test_roll_ups_racing_completions_and_reopenings_keep_the_count_exact(
    live_server: str,
    make_token: Callable[[str, str], str],
    sql: psycopg.Connection,
    settings: Settings,
    db_url: str,
) -> None:
    total, reviewers, reopenings = 120, 3, 25
    seed_items(sql, total)
    stop, errors = threading.Event(), []
    rolls, reopened = [0], [0]

    def reviewer(n: int) -> None:
        headers = {"Authorization": f"Bearer {make_token(f'reviewer-{n}', 'reviewer')}"}
        with httpx.Client(base_url=live_server, headers=headers, timeout=30) as http:
            idle = 0
            while idle < 20:  # reopened items come back: stop after the queue stays empty a while
                items = http.post("/leases", json={"batch_size": 2}).json()["items"]
                if not items:
                    idle += 1
                    stop.wait(0.05)
                    continue
                idle = 0
                for item in items:
                    done = http.post(f"/items/{item['id']}/complete", json={"resolution": "APPROVED"})
                    assert done.status_code == 200, done.text

    def admin() -> None:
        rng = random.Random(29)
        headers = {"Authorization": f"Bearer {make_token('ada', 'admin')}"}
        with (
            httpx.Client(base_url=live_server, headers=headers, timeout=30) as http,
            psycopg.connect(libpq(db_url)) as conn,
        ):
            while reopened[0] < reopenings and not stop.is_set():
                ids = conn.execute("SELECT id FROM review_queue_item WHERE state = 'RESOLVED'").fetchall()
                conn.commit()
                if (
                    ids
                    and http.post(f"/items/{rng.choice(ids)[0]}/reopen", json={"reason": "x"}).status_code
                    == 200
                ):
                    reopened[0] += 1
                stop.wait(0.02)

    def roller() -> None:
        try:
            while not stop.is_set():
                asyncio.run(reclaimer.roll_up_once(settings, db_url, margin=NOW))
                rolls[0] += 1
        except Exception as error:  # reported by the test below
            errors.append(error)

    workers = [threading.Thread(target=reviewer, args=(n,)) for n in range(reviewers)]
    others = [threading.Thread(target=admin), threading.Thread(target=roller)]
    for t in [*workers, *others]:
        t.start()
    for t in workers:
        t.join(timeout=300)
    stop.set()
    for t in others:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in [*workers, *others]), "a thread is still running"
    assert rolls[0] >= 5 and reopened[0] >= 5, (rolls, reopened)
    with httpx.Client(base_url=live_server, timeout=30) as http:
        headers = {"Authorization": f"Bearer {make_token('watcher', 'auditor')}"}
        counted = http.get("/stats", headers=headers).json()["counts"]["RESOLVED"]
    assert counted == resolved_rows(sql), (counted, rolls, reopened)
    rolled = roll_up(settings, db_url)
    edge_count = sql.execute(
        "SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED' AND resolved_at < %s", (rolled.edge,)
    ).fetchone()
    assert edge_count is not None and rolled.resolved == edge_count[0], (rolled, edge_count)
