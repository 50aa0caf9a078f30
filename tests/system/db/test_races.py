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

Both sides winning is not enough (holding one side back by 50 ms guarantees that): the test also
asserts that some rounds were truly contended, i.e. a third connection saw, in pg_stat_activity,
one statement waiting for the other's row lock while the round ran.
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
from tests.support import LONG, backdate_lease, lock_waiters
from tests.support.postgres import libpq, make_settings
from tests.support.servers import start_server, stop_server

ROUNDS = 500 if LONG else 50
GRACE_S = 10  # the shortest reclaim_after_s; leases are backdated an hour
# Released together, one side nearly always wins: the completion has a token lookup to do first. So
# each round holds one side back after the barrier by an offset (seconds; > 0 holds the reclaim back,
# < 0 the completion). Every FORCED-th round uses +-50 ms, where the two run one after the other, so
# each side surely wins some rounds. The other rounds follow a staircase: after a completion win the
# offset moves STEP towards the completion, after a reclaim win towards the reclaim. It settles where
# the winner flips, wherever that is on this machine and under this load: the point where both
# statements reach the row together and one waits for the other's lock.
FORCED, APART, STEP = 5, 0.05, 0.00025


class LockWaitSampler:
    """A third connection that, while a round runs, polls pg_stat_activity for a backend of the test
    database waiting on a lock: the completion's UPDATE queued behind the reclaim's row lock. Such a
    round was truly contended (the two statements overlapped on the server)."""

    def __init__(self, db_url: str) -> None:
        self.conn = psycopg.connect(libpq(db_url), autocommit=True)
        self.active, self.done = threading.Event(), threading.Event()
        self.seen = False
        self.thread = threading.Thread(target=self._run, name="lock-wait-sampler", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.is_set():
            if not self.active.wait(0.1):
                continue
            if lock_waiters(self.conn):
                self.seen = True

    def start_round(self) -> None:
        self.seen = False
        self.active.set()

    def end_round(self) -> bool:
        self.active.clear()
        return self.seen

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=30)
        self.conn.close()


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
    contended: Counter[str] = Counter()  # rounds where one statement waited for the other's lock, by winner
    staircase = 0.0
    sampler = LockWaitSampler(db_url)
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

            forced = n % FORCED == 0
            offset = (APART if n % (2 * FORCED) else -APART) if forced else staircase
            sampler.start_round()
            reclaimed_future = other.submit(reclaim, offset)
            completion = complete(item_id, token, offset)
            reclaimed = reclaimed_future.result(timeout=60)
            waited = sampler.end_round()

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
                winner = "completion"
            else:
                assert completion.status_code == 409, seen
                assert completion.json()["code"] == "LEASE_NOT_HELD", seen
                assert (state, leased_by, reclaimed) == ("PENDING", None, 1), f"neither won? {seen}"
                assert events["RECLAIMED"] == 1 and events["RESOLVED"] == 0, seen
                winner = "reclaim"
                # Take the item out of the queue so the next round leases its own item.
                sql.execute(
                    "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'RETIRED',"
                    " resolved_by = 'race-test' WHERE id = %s",
                    (item_id,),
                )
            wins[winner] += 1
            by_offset[round(offset * 1000, 2)][winner] += 1
            contended[winner] += waited
            if not forced:
                staircase += -STEP if winner == "completion" else STEP
                staircase = max(-APART, min(APART, staircase))
    finally:
        sampler.close()
        other.submit(runner.run, engine.dispose()).result()
        other.submit(runner.close).result()
        other.shutdown()
        reviewer.close()
        admin.close()

    print(f"reclaim via {reclaim_via}, {ROUNDS} rounds: {dict(wins)}")
    print("by offset (ms, > 0: reclaim later):", {k: dict(v) for k, v in sorted(by_offset.items())})
    print(f"contended rounds (a lock wait seen), by winner: {dict(contended)}")
    assert sum(wins.values()) == ROUNDS
    assert wins["completion"] and wins["reclaim"], f"one side never won: {dict(wins)}"
    assert sum(contended.values()) > 0, (
        f"no round was contended (no lock wait seen): the two sides never met; wins {dict(wins)},"
        f" by offset {dict(by_offset)}"
    )
