"""Reclaim against completion on the same expired lease, forced to collide, many times over.

Each round seeds one item, leases it over HTTP, backdates its lease past the grace (database
clock), then releases two threads from a `threading.Barrier`: one reclaims, the other completes as
the holder. Exactly one of them may win:

- completion wins: 200 `resolved`, the item RESOLVED, one RESOLVED event, no RECLAIMED event, and
  the reclaim took nothing;
- reclaim wins: the completion is 409 LEASE_NOT_HELD, the item PENDING with no holder, one
  RECLAIMED event, no RESOLVED event.

Never both, never neither. Both sides run the service's own code on their own connections: the
completion is POST /items/{id}/complete on a live server (uvicorn in its own process), the reclaim
either POST /admin/reclaim on that server or the standalone reclaimer's drain (cli.reclaimer.drain,
what `review-queue reclaimer` runs) on its own engine in its own thread. Half of the completions
carry the lease_token, half rely on the holder guard alone.
"""

import asyncio
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from cli.reclaimer import drain
from db.engine import create_engine
from tests.conftest import LONG, make_settings, start_server, stop_server
from tests.support import backdate_lease

ROUNDS = 500 if LONG else 50
GRACE_S = 10  # the shortest reclaim_after_s; leases are backdated an hour
# Released together, the reclaim nearly always wins: the completion has a token lookup to do
# first. So each round also holds one side back after the barrier, sweeping the offset over
# OFFSETS (seconds; > 0 holds the reclaim back, < 0 the completion). Between -2 ms and +3 ms, in
# steps of 0.25 ms, the two transactions meet at every point of each other's work (on an idle
# machine the winner flips between 0 and +1.5 ms), including the window where both touch the row at
# once and one waits for the other's lock. At +-50 ms they run one after the other, so each side
# surely wins some rounds.
OFFSETS = [-0.05, *(0.00025 * k for k in range(-8, 13)), 0.05]


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    process, base = start_server({"DATABASE_URL": db_url, "REVIEW_QUEUE_RECLAIM_AFTER_S": str(GRACE_S)})
    yield base
    stop_server(process)


def _seed(sql: psycopg.Connection, key: str) -> None:
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash) VALUES (%s, 'ACME-CORP', 12.50, 'UNMATCHED', 'sha256:race')",
        (key,),
    )


def _events(sql: psycopg.Connection, item_id: str) -> Counter[str]:
    rows = sql.execute(
        "SELECT event, count(*) FROM review_queue_event WHERE item_id = %s GROUP BY event", (item_id,)
    ).fetchall()
    return Counter(dict(rows))


@pytest.mark.parametrize("reclaim_via", ["admin_api", "reclaimer"])
def test_reclaim_and_completion_of_one_expired_lease_never_both_win(
    server: str,
    db_url: str,
    sql: psycopg.Connection,
    make_token: Callable[[str, str], str],
    reclaim_via: str,
) -> None:
    reviewer = httpx.Client(
        base_url=server, headers={"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}, timeout=30
    )
    admin = httpx.Client(
        base_url=server, headers={"Authorization": f"Bearer {make_token('root', 'admin')}"}, timeout=30
    )
    settings = make_settings(db_url, reclaim_after_s=GRACE_S)
    # One thread for the reclaim side. A single-worker executor always runs on the same thread, so
    # the reclaimer's event loop (asyncio.Runner) and its engine's connection stay on that thread.
    other = ThreadPoolExecutor(1, thread_name_prefix="reclaim")
    runner = other.submit(asyncio.Runner).result()
    engine = create_engine(db_url, pool_size=1, max_overflow=0, pool_timeout_s=10)
    barrier = threading.Barrier(2, timeout=30)

    def reclaim(offset: float) -> int:
        """The reclaim side: how many leases it took."""
        barrier.wait()
        time.sleep(max(offset, 0))
        if reclaim_via == "admin_api":
            response = admin.post("/admin/reclaim")
            assert response.status_code == 200, response.text
            return int(response.json()["reclaimed"])
        return runner.run(drain(engine, settings, actor="race-reclaimer"))

    def complete(item_id: str, token: str | None, offset: float) -> httpx.Response:
        body: dict[str, Any] = {"resolution": "APPROVED", **({"lease_token": token} if token else {})}
        barrier.wait()
        time.sleep(max(-offset, 0))
        return reviewer.post(f"/items/{item_id}/complete", json=body)

    wins: Counter[str] = Counter()
    by_offset: defaultdict[float, Counter[str]] = defaultdict(Counter)
    try:
        # Warm up both sides (connections, pools, first-request costs) before the first round.
        assert admin.post("/admin/reclaim").json()["reclaimed"] == 0
        assert reviewer.post("/leases").json()["items"] == []
        assert other.submit(lambda: runner.run(drain(engine, settings, actor="race-reclaimer"))).result() == 0

        for n in range(ROUNDS):
            _seed(sql, f"race-{n}")
            leased = reviewer.post("/leases", json={"batch_size": 1})
            assert leased.status_code == 200, leased.text
            (item,) = leased.json()["items"]
            item_id, token = item["id"], item["lease_token"] if n % 2 else None
            backdate_lease(sql, item_id, seconds=3600)

            offset = OFFSETS[n * 7 % len(OFFSETS)]
            reclaimed_future = other.submit(reclaim, offset)
            completion = complete(item_id, token, offset)
            reclaimed = reclaimed_future.result(timeout=30)

            state, leased_by = sql.execute(
                "SELECT state, leased_by FROM review_queue_item WHERE id = %s", (item_id,)
            ).fetchone()  # type: ignore[misc]
            events = _events(sql, item_id)
            seen = (
                f"round {n}: completion {completion.status_code} {completion.text}, reclaimed {reclaimed},"
                f" item {state} held by {leased_by}, events {dict(events)}"
            )
            if completion.status_code == 200:
                assert completion.json()["outcome"] == "resolved", seen
                assert (state, reclaimed) == ("RESOLVED", 0), f"both won? {seen}"
                assert events["RESOLVED"] == 1 and events["RECLAIMED"] == 0, seen
                wins["completion"] += 1
                by_offset[round(offset * 1000, 2)]["completion"] += 1
            else:
                assert completion.status_code == 409, seen
                assert completion.json()["code"] == "LEASE_NOT_HELD", seen
                assert (state, leased_by, reclaimed) == ("PENDING", None, 1), f"neither won? {seen}"
                assert events["RECLAIMED"] == 1 and events["RESOLVED"] == 0, seen
                wins["reclaim"] += 1
                by_offset[round(offset * 1000, 2)]["reclaim"] += 1
                # Take the item out of the queue so the next round leases its own item.
                sql.execute(
                    "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'RETIRED',"
                    " resolved_by = 'race-test' WHERE id = %s",
                    (item_id,),
                )
    finally:
        other.submit(runner.run, engine.dispose()).result()
        other.submit(runner.close).result()
        other.shutdown()
        reviewer.close()
        admin.close()

    print(f"reclaim via {reclaim_via}, {ROUNDS} rounds: {dict(wins)}")
    print("by offset (ms, > 0: reclaim later):", {k: dict(v) for k, v in sorted(by_offset.items())})
    assert sum(wins.values()) == ROUNDS
    assert wins["completion"] and wins["reclaim"], f"one side never won: {dict(wins)}"
