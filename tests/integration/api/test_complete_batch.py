"""POST /items/complete: many completions in one request, one transaction and one statement, each
with exactly the answer the single-item route gives it."""

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.ext.asyncio import AsyncEngine

from db import queue
from db.engine import create_engine, unit_of_work
from db.unit import Transaction
from tests.support import backdate_lease, lock_waiters, seed_items
from tests.support.api import Auth, assert_problem


def _lease(client: TestClient, headers: dict[str, str], n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = client.post("/leases", json={"batch_size": n}, headers=headers).json()[
        "items"
    ]
    assert len(items) == n, items
    return items


def _rows(sql: psycopg.Connection) -> list[tuple[str]]:
    return sql.execute("SELECT row_to_json(i)::text FROM review_queue_item i ORDER BY id").fetchall()


def test_each_entry_answers_as_the_single_route_in_request_order(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """Every outcome in one batch: a refused entry changes nothing and undoes nothing."""
    seed_items(sql, 6)
    alice, bob = auth("alice", "reviewer"), auth("bob", "reviewer")
    fresh, fenced, done_ok, done_other, stale = _lease(client, alice, 5)
    (bobs,) = _lease(client, bob, 1)
    for earlier in (done_ok, done_other):
        body = {"resolution": "APPROVED", "lease_token": earlier["lease_token"]}
        assert client.post(f"/items/{earlier['id']}/complete", json=body, headers=alice).status_code == 200
    unknown = str(uuid.uuid4())
    entries = [
        {"id": fresh["id"], "resolution": "APPROVED", "note": "FX rounding"},
        {"id": unknown, "resolution": "APPROVED"},
        {"id": done_ok["id"], "resolution": "APPROVED", "lease_token": done_ok["lease_token"]},
        {"id": bobs["id"], "resolution": "APPROVED"},
        {"id": done_other["id"], "resolution": "REJECTED"},
        {"id": stale["id"], "resolution": "APPROVED", "lease_token": bobs["lease_token"]},  # not its token
        {
            "id": fenced["id"],
            "resolution": "WRITE_OFF",
            "note": "below the threshold",
            "lease_token": fenced["lease_token"],
        },
    ]
    before = dict(sql.execute("SELECT id::text, row_to_json(i)::text FROM review_queue_item i").fetchall())
    response = client.post("/items/complete", json={"items": entries}, headers=alice)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    assert [r["id"] for r in results] == [e["id"] for e in entries]
    answers = [(r["outcome"], (r["problem"] or {}).get("code")) for r in results]
    assert answers == [
        ("resolved", None),
        ("refused", "NOT_FOUND"),
        ("already_resolved", None),
        ("refused", "LEASE_NOT_HELD"),
        ("refused", "RESOLUTION_CONFLICT"),
        ("refused", "LEASE_NOT_HELD"),
        ("resolved", None),
    ], results
    assert (
        results[0]["item"]["resolution_note"] == "FX rounding"
        and results[0]["item"]["resolved_by"] == "alice"
    )
    assert results[6]["item"]["resolution"] == "WRITE_OFF"
    after = dict(sql.execute("SELECT id::text, row_to_json(i)::text FROM review_queue_item i").fetchall())
    changed = {k for k in after if after[k] != before[k]}
    assert changed == {fresh["id"], fenced["id"]}, changed
    trail = sql.execute(
        "SELECT item_id::text, details->>'resolution' FROM review_queue_event WHERE event = 'RESOLVED'"
        " AND item_id = ANY(%s::uuid[])",
        ([fresh["id"], fenced["id"]],),
    ).fetchall()
    assert sorted(trail) == sorted([(fresh["id"], "APPROVED"), (fenced["id"], "WRITE_OFF")])

    # The same calls one by one answer the same problems (status, code and detail).
    for entry, result in zip(entries[1:6], results[1:6], strict=True):
        single = client.post(
            f"/items/{entry['id']}/complete",
            json={k: v for k, v in entry.items() if k != "id"},
            headers=alice,
        )
        if result["outcome"] == "refused":
            problem = assert_problem(single, result["problem"]["status"], result["problem"]["code"])
            assert problem["detail"] == result["problem"]["detail"]
        else:
            assert single.json()["outcome"] == result["outcome"]


def test_an_id_given_twice_is_applied_once(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    seed_items(sql, 2)
    alice = auth("alice", "reviewer")
    one, two = _lease(client, alice, 2)
    entries = [
        {"id": one["id"], "resolution": "APPROVED"},
        {"id": one["id"], "resolution": "APPROVED"},
        {"id": two["id"], "resolution": "APPROVED"},
        {"id": two["id"], "resolution": "REJECTED"},
    ]
    results = client.post("/items/complete", json={"items": entries}, headers=alice).json()["results"]
    assert [(r["outcome"], (r["problem"] or {}).get("code")) for r in results] == [
        ("resolved", None),
        ("already_resolved", None),
        ("resolved", None),
        ("refused", "RESOLUTION_CONFLICT"),
    ]
    resolved = sql.execute("SELECT count(*) FROM review_queue_event WHERE event = 'RESOLVED'").fetchone()
    assert resolved == (2,)


@pytest.mark.parametrize(
    "body",
    [
        {"items": []},
        {"items": "nope"},
        {},
        {"items": [{"id": "not-a-uuid", "resolution": "APPROVED"}]},
        {"items": [{"id": "{held}", "resolution": "lower case"}]},
        {"items": [{"id": "{held}", "resolution": "APPROVED", "leased_by": "mallory"}]},
        {
            "items": [{"id": "{held}", "resolution": "APPROVED"}] * 200
            + [{"id": "x", "resolution": "APPROVED"}]
        },
        {"items": [{"id": "{held}", "resolution": "APPROVED"}] * 201},
    ],
    ids=["empty", "not-a-list", "no-items", "bad-id", "bad-resolution", "server-field", "bad-201st", "201"],
)
def test_a_malformed_request_is_422_and_stores_nothing(
    client: TestClient, auth: Auth, sql: psycopg.Connection, body: dict[str, Any]
) -> None:
    seed_items(sql, 1)
    alice = auth("alice", "reviewer")
    (held,) = _lease(client, alice, 1)
    text = str(body).replace("'", '"').replace("{held}", held["id"])
    before = _rows(sql)
    response = client.post(
        "/items/complete", content=text, headers={**alice, "content-type": "application/json"}
    )
    assert_problem(response, 422, "VALIDATION_ERROR")
    assert _rows(sql) == before


def test_200_entries_in_one_call(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    seed_items(sql, 200)
    alice = auth("alice", "reviewer")
    held = _lease(client, alice, 200)
    entries = [{"id": i["id"], "resolution": "APPROVED", "lease_token": i["lease_token"]} for i in held]
    results = client.post("/items/complete", json={"items": entries}, headers=alice).json()["results"]
    assert [r["outcome"] for r in results] == ["resolved"] * 200
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED'").fetchone() == (200,)


def test_only_reviewers_and_admins(client: TestClient, auth: Auth, sql: psycopg.Connection) -> None:
    body = {"items": [{"id": str(uuid.uuid4()), "resolution": "APPROVED"}]}
    for role in ("ingest", "auditor"):
        assert_problem(client.post("/items/complete", json=body, headers=auth(role, role)), 403, "FORBIDDEN")
    assert_problem(client.post("/items/complete", json=body), 401, "UNAUTHENTICATED")


# --- the statement, on real concurrent connections ----------------------------------------------


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(db_url, pool_size=4, max_overflow=0, pool_timeout_s=10)
    yield engine
    await engine.dispose()


@pytest.mark.anyio
async def test_a_batch_queued_behind_the_same_batch_answers_already_resolved(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    """Two identical batches at once (a client's retry racing its first attempt): the second waits
    for the first's row locks, then answers every entry as the retry it is, from the committed rows
    (a read of its own snapshot would still see them ASSIGNED and answer LEASE_NOT_HELD)."""
    seed_items(sql, 3)
    async with engine.begin() as conn:
        held = await queue.lease_items(
            Transaction(conn), reviewer="alice", batch_size=3, lease_duration=timedelta(seconds=30), cap=100
        )
    completions = [queue.Completion(i.id, "APPROVED", None, i.lease_nonce) for i in held]

    async def batch() -> list[tuple[str, queue.Item | None]]:
        async with engine.begin() as conn:
            return list(
                await queue.complete_items(Transaction(conn), completions=completions, reviewer="alice")
            )

    async with engine.connect() as first:
        tx = await first.begin()
        assert [
            o
            for o, _ in await queue.complete_items(
                Transaction(first), completions=completions, reviewer="alice"
            )
        ] == ["resolved"] * 3
        second = asyncio.create_task(batch())
        deadline = asyncio.get_running_loop().time() + 30
        while not lock_waiters(sql):
            assert not second.done(), f"the second batch did not wait: {second.result()}"
            assert asyncio.get_running_loop().time() < deadline, "the second batch never reached a row lock"
            await asyncio.sleep(0.01)
        await tx.commit()
        results = await asyncio.wait_for(second, 30)
    assert [o for o, _ in results] == ["already_resolved"] * 3, results
    assert sql.execute("SELECT count(*) FROM review_queue_event WHERE event = 'RESOLVED'").fetchone() == (3,)


@pytest.mark.anyio
async def test_a_batch_behind_a_reclaim_in_flight_resolves_nothing_it_lost(
    engine: AsyncEngine, sql: psycopg.Connection
) -> None:
    seed_items(sql, 2)
    async with engine.begin() as conn:
        kept, lost = await queue.lease_items(
            Transaction(conn), reviewer="alice", batch_size=2, lease_duration=timedelta(seconds=30), cap=100
        )
    backdate_lease(sql, lost.id)

    async def batch() -> list[tuple[str, queue.Item | None]]:
        async with engine.begin() as conn:
            completions = [queue.Completion(i.id, "APPROVED", None, i.lease_nonce) for i in (kept, lost)]
            return list(
                await queue.complete_items(Transaction(conn), completions=completions, reviewer="alice")
            )

    async with engine.connect() as reclaimer:
        tx = await reclaimer.begin()
        reclaimed = await queue.reclaim_expired(
            Transaction(reclaimer), reclaim_batch=10, grace=timedelta(seconds=45), actor="reclaimer"
        )
        assert [r.id for r in reclaimed] == [lost.id]
        completion = asyncio.create_task(batch())
        deadline = asyncio.get_running_loop().time() + 30
        while not lock_waiters(sql):
            assert not completion.done(), f"the batch did not wait: {completion.result()}"
            assert asyncio.get_running_loop().time() < deadline, "the batch never reached the row lock"
            await asyncio.sleep(0.01)
        await tx.commit()
        (kept_outcome, _), (lost_outcome, current) = await asyncio.wait_for(completion, 30)
    assert (kept_outcome, lost_outcome) == ("resolved", "lease_not_held")
    assert current is not None and (current.state, current.leased_by) == ("PENDING", None)


@pytest.mark.anyio
async def test_log_lines_only_after_the_commit(
    engine: AsyncEngine, sql: psycopg.Connection, caplog: pytest.LogCaptureFixture
) -> None:
    """A "resolved" line describes a committed change: a transaction that rolls back logs nothing."""
    seed_items(sql, 2)
    async with engine.begin() as conn:
        one, two = await queue.lease_items(
            Transaction(conn), reviewer="alice", batch_size=2, lease_duration=timedelta(seconds=30), cap=100
        )
    caplog.set_level(logging.INFO, logger="reconciliation.review_queue.lease")

    def resolved_lines() -> list[str]:
        return [r.__dict__["item_id"] for r in caplog.records if r.getMessage() == "review_item_resolved"]

    async def rolled_back() -> None:
        async with unit_of_work(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as unit:
            await queue.complete_item(
                unit, item_id=one.id, reviewer="alice", resolution="MATCH_CONFIRMED", note=None
            )
            raise RuntimeError("the commit never happens")

    with pytest.raises(RuntimeError):
        await rolled_back()
    assert resolved_lines() == []
    async with unit_of_work(engine, lock_timeout_ms=1000, statement_timeout_ms=5000) as unit:
        await queue.complete_item(
            unit, item_id=two.id, reviewer="alice", resolution="MATCH_CONFIRMED", note=None
        )
        assert resolved_lines() == [], "logged before the commit"
    assert resolved_lines() == [str(two.id)]
