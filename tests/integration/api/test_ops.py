"""Operations: /stats, /metrics, lock contention, an exhausted pool, retries, request ids, CORS."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import psycopg
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql as pgsql
from sqlalchemy.engine import make_url

from api.app import create_app
from tests.support import backdate_lease, lock_waiters, wait_for
from tests.support.api import Auth, assert_problem, item_body
from tests.support.audit import seal
from tests.support.postgres import libpq, make_settings


def scrape(client: TestClient, headers: dict) -> dict[str, float]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_metrics_parse_and_move_with_a_scripted_sequence(client: TestClient, auth: Auth, sql) -> None:
    admin, alice = auth("ops", "admin"), auth("alice", "reviewer")
    before = scrape(client, admin)
    for _ in range(3):
        client.post("/items", json=item_body(), headers=admin)
    leased = client.post("/leases", json={"batch_size": 3}, headers=alice).json()["items"]
    assert client.post(f"/items/{leased[0]['id']}/renew", headers=alice).status_code == 200
    client.post(f"/items/{leased[0]['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
    client.post(f"/items/{leased[1]['id']}/release", headers=alice)
    backdate_lease(sql, leased[2]["id"])
    client.post("/admin/reclaim", headers=admin)
    after = scrape(client, admin)

    def delta(name: str) -> float:
        return after.get(name, 0) - before.get(name, 0)

    assert delta("review_queue_items_enqueued_total") == 3
    assert delta("review_queue_items_leased_total") == 3
    assert delta("review_queue_items_renewed_total") == 1
    assert delta("review_queue_items_resolved_total{resolution=APPROVED}") == 1
    assert delta("review_queue_items_released_total") == 1
    assert delta("review_queue_items_reclaimed_total") == 1
    assert delta("review_queue_http_requests_total{method=POST,route=/leases,status=200}") == 1
    assert delta("review_queue_http_request_duration_seconds_count{method=POST,route=/items}") == 3
    assert after["review_queue_pending_items"] == 2
    assert after["review_queue_assigned_items"] == 0
    assert after["review_queue_oldest_pending_age_seconds"] > 0
    assert after["review_queue_inflight_ratio"] == 0


def test_metrics_access(db_url: str, auth: Auth) -> None:
    with TestClient(create_app(make_settings(db_url))) as client:
        assert_problem(client.get("/metrics"), 401, "UNAUTHENTICATED")
        assert_problem(client.get("/metrics", headers=auth("r", "reviewer")), 403, "FORBIDDEN")
        assert client.get("/metrics", headers=auth("a", "admin")).status_code == 200
    with TestClient(create_app(make_settings(db_url, metrics_token="s3cret-scrape"))) as client:
        assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"}).status_code == 200
        assert_problem(client.get("/metrics", headers=auth("a2", "admin")), 401, "UNAUTHENTICATED")


def test_stats_match_sql(client: TestClient, auth: Auth, sql) -> None:
    admin, alice, bob = auth("ops", "admin"), auth("alice", "reviewer"), auth("bob", "reviewer")
    client.post("/items/batch", json={"items": [item_body() for _ in range(10)]}, headers=admin)
    a = client.post("/leases", json={"batch_size": 3}, headers=alice).json()["items"]
    client.post("/leases", json={"batch_size": 2}, headers=bob)
    client.post(f"/items/{a[0]['id']}/complete", json={"resolution": "APPROVED"}, headers=alice)
    backdate_lease(sql, a[1]["id"], seconds=10)
    backdate_lease(sql, a[2]["id"])
    response = client.get("/stats", headers=alice)
    assert response.status_code == 200, response.text
    got = response.json()
    counts = dict(sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall())
    assert got["counts"] == {
        "PENDING": counts["PENDING"],
        "ASSIGNED": counts["ASSIGNED"],
        "RESOLVED": counts["RESOLVED"],
        "QUARANTINED": counts.get("QUARANTINED", 0),
        "AWAITING_APPROVAL": counts.get("AWAITING_APPROVAL", 0),
    }
    assert got["counts"] == {
        "PENDING": 5,
        "ASSIGNED": 4,
        "RESOLVED": 1,
        "QUARANTINED": 0,
        "AWAITING_APPROVAL": 0,
    }
    assert got["assigned"] == 4 and got["max_inflight"] == 1000 and got["inflight_ratio"] == 0.004
    assert (got["expired_unreclaimed"], got["reclaimable"]) == (2, 1)
    assert got["open_leases_by_reviewer"] == {"alice": 2, "bob": 2}
    oldest = sql.execute(
        "SELECT extract(epoch FROM now() - min(created_at)) FROM review_queue_item WHERE state = 'PENDING'"
    )
    assert abs(got["oldest_pending_age_s"] - float(oldest.fetchone()[0])) < 5
    soonest = sql.execute(
        "SELECT extract(epoch FROM min(lease_expires_at) - now())"
        " FROM review_queue_item WHERE state = 'ASSIGNED'"
    )
    assert abs(got["next_lease_expires_in_s"] - float(soonest.fetchone()[0])) < 5
    assert got["next_lease_expires_in_s"] < 0  # a lease has lapsed (backdated above)
    assert_problem(client.get("/stats", headers=auth("m", "ingest")), 403, "FORBIDDEN")


def test_lease_under_a_table_lock_is_a_fast_503_and_counted(auth: Auth, db_url: str) -> None:
    # The lock is held until the request has answered, so any answer at all means a timeout fired;
    # "fast" means it was the short lock_timeout, not the long statement_timeout.
    settings = make_settings(db_url, pg_lock_timeout_ms=500, statement_timeout_ms=60_000)
    client = TestClient(create_app(settings)).__enter__()
    admin, alice = auth("ops", "admin"), auth("alice", "reviewer")
    client.post("/items", json=item_body(), headers=admin)
    before = scrape(client, admin).get("review_queue_lock_timeouts_total{route=/leases}", 0)
    with psycopg.connect(libpq(db_url)) as locker:
        locker.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        started = time.monotonic()
        response = client.post("/leases", headers=alice)
        elapsed = time.monotonic() - started
        locker.rollback()
    assert_problem(response, 503, "DATABASE_UNAVAILABLE")
    assert response.headers["retry-after"] == "1"
    assert elapsed < settings.statement_timeout_ms / 1000 / 2, f"took {elapsed:.2f} s"
    after = scrape(client, admin).get("review_queue_lock_timeouts_total{route=/leases}", 0)
    assert after - before == 1
    assert len(client.post("/leases", headers=alice).json()["items"]) == 1  # and it recovers at once
    client.__exit__(None, None, None)


def test_an_exhausted_pool_is_a_fast_503_not_a_hang(db_url: str, make_token, sql) -> None:
    # The stuck request keeps the only connection until its lock wait ends (pg_lock_timeout_ms, long);
    # "fast" is well under that, so the answer came from the pool timeout, not from waiting it out.
    settings = make_settings(
        db_url, pool_size=1, pool_max_overflow=0, pool_timeout_ms=200, pg_lock_timeout_ms=60_000
    )
    headers = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    with TestClient(create_app(settings)) as client, psycopg.connect(libpq(db_url)) as locker:
        client.get("/items", headers=headers)  # the token lookup works; the pool is warm
        locker.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        with ThreadPoolExecutor(1) as pool:
            stuck = pool.submit(client.post, "/leases", headers=headers)
            # It holds the only connection once it waits for the table lock.
            wait_for(lambda: lock_waiters(sql) == 1, 60)
            started = time.monotonic()
            response = client.get("/items", headers=headers)
            elapsed = time.monotonic() - started
            locker.rollback()
            assert stuck.result(timeout=60).status_code == 200
    assert_problem(response, 503, "DATABASE_UNAVAILABLE")
    assert "pool" in response.json()["detail"]
    assert elapsed < settings.pg_lock_timeout_ms / 1000 / 4, f"took {elapsed:.2f} s"


def test_a_request_queued_for_a_busy_pool_is_answered_not_503(db_url: str, make_token, sql) -> None:
    # Issue 38 item 5: under 30 clients one API process held every pooled connection for over a
    # second now and then (a busy host), and a completion queued behind them got a 503 after the old
    # 1 s wait. The default wait must outlast such a stretch: here the only connection is held 1.5 s.
    settings = make_settings(db_url, pool_size=1, pool_max_overflow=0, pg_lock_timeout_ms=60_000)
    headers = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}
    with TestClient(create_app(settings)) as client, psycopg.connect(libpq(db_url)) as locker:
        client.get("/items", headers=headers)  # the token lookup works; the pool is warm
        locker.execute("LOCK TABLE review_queue_item IN ACCESS EXCLUSIVE MODE")
        with ThreadPoolExecutor(2) as pool:
            stuck = pool.submit(client.post, "/leases", headers=headers)
            wait_for(lambda: lock_waiters(sql) == 1, 60)  # it holds the only connection
            queued = pool.submit(client.get, "/items", headers=headers)
            time.sleep(1.5)
            locker.rollback()
            assert stuck.result(timeout=60).status_code == 200
            assert queued.result(timeout=60).status_code == 200


@pytest.mark.fresh_db("sets the database's deadlock_timeout")
def test_a_deadlock_is_retried_and_the_request_succeeds(
    auth: Auth, db_url: str, superuser_url: str, sql, caplog
) -> None:
    """Force a real deadlock between a batch enqueue and another session; the API retries it."""
    admin = auth("ops", "admin")
    # The API's sessions look for a deadlock DEADLOCK_S after they start waiting: time enough for the
    # other side to close the cycle on a loaded machine (a check that comes too early finds no cycle
    # and is not repeated). lock_timeout is far above it, so the deadlock is what fires.
    deadlock_s = 3
    sql.execute(
        pgsql.SQL("ALTER DATABASE {} SET deadlock_timeout = {}").format(
            pgsql.Identifier(make_url(db_url).database or ""), pgsql.Literal(f"{deadlock_s}s")
        )
    )
    client = TestClient(create_app(make_settings(db_url, pg_lock_timeout_ms=20_000 * deadlock_s))).__enter__()
    a, b = item_body(idempotency_key="dl-a"), item_body(idempotency_key="dl-b")
    with psycopg.connect(libpq(superuser_url)) as other:  # SET deadlock_timeout needs a superuser
        # Let the API's backend be the one that detects the deadlock and is rolled back.
        other.execute("SET deadlock_timeout = '60s'")
        other.execute(
            "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
            " source_hash) VALUES ('dl-b', 'OTHER', 1, 'PARTIAL', 'x')"
        )
        result: dict = {}
        request = threading.Thread(
            target=lambda: result.update(r=client.post("/items/batch", json={"items": [a, b]}, headers=admin))
        )
        request.start()  # inserts dl-a, then waits for our uncommitted dl-b
        wait_for(lambda: lock_waiters(sql) == 1, 60)
        other.execute(  # waits for the API's dl-a: a cycle; the API's side fails after deadlock_s
            "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
            " source_hash) VALUES ('dl-a', 'OTHER', 1, 'PARTIAL', 'x') ON CONFLICT DO NOTHING"
        )
        other.commit()
        request.join(timeout=60)
    client.__exit__(None, None, None)
    assert not request.is_alive(), "the request never finished"
    response = result["r"]
    assert response.status_code == 200, response.text
    assert [r["outcome"] for r in response.json()["results"]] == ["conflict", "conflict"]
    assert [r.getMessage() for r in caplog.records].count("transaction_retry") == 1


def test_request_id_is_echoed_or_generated(client: TestClient) -> None:
    assert client.get("/healthz", headers={"X-Request-ID": "abc-123"}).headers["x-request-id"] == "abc-123"
    generated = client.get("/healthz").headers["x-request-id"]
    assert len(generated) == 32
    hostile = client.get("/healthz", headers={"X-Request-ID": "x" * 500}).headers["x-request-id"]
    assert hostile != "x" * 500


@pytest.mark.parametrize(("origins", "allowed"), [("", False), ("https://review.example.com", True)])
def test_cors_only_for_configured_origins(db_url: str, origins: str, allowed: bool) -> None:
    with TestClient(create_app(make_settings(db_url, cors_origins=origins))) as client:
        response = client.options(
            "/leases",
            headers={"Origin": "https://review.example.com", "Access-Control-Request-Method": "POST"},
        )
    assert (response.headers.get("access-control-allow-origin") == "https://review.example.com") is allowed


def test_metrics_show_how_far_the_audit_chain_trails(client: TestClient, auth: Auth, db_url: str) -> None:

    admin = auth("ops", "admin")
    for _ in range(3):
        client.post("/items", json=item_body(), headers=admin)
    before = scrape(client, admin)
    assert before["review_queue_audit_unsealed_events"] == 3
    assert before["review_queue_audit_oldest_unsealed_age_seconds"] > 0
    assert seal(db_url) == 3
    after = scrape(client, admin)
    assert after["review_queue_audit_unsealed_events"] == 0
    assert after["review_queue_audit_oldest_unsealed_age_seconds"] == 0


def _trail_ends(sql: psycopg.Connection) -> float:
    """Seconds from now to the end of the last monthly partition, read from their names."""
    rows = sql.execute(
        "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'review_queue_event'::regclass"
    ).fetchall()
    year, month = max(tuple(map(int, name.split("_")[-2:])) for (name,) in rows if name[-1].isdigit())
    ends = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
    return (ends - datetime.now(UTC)).total_seconds()


@pytest.mark.fresh_db("creates partitions of the event trail")
def test_metrics_show_how_long_the_event_trails_months_last(
    client: TestClient, auth: Auth, sql: psycopg.Connection
) -> None:
    """Until the end of the last monthly partition: the migration's three months ahead (at least
    the three after this one), and further once more are created."""
    admin = auth("ops", "admin")
    ahead = scrape(client, admin)["review_queue_event_partitions_ahead_seconds"]
    assert abs(ahead - _trail_ends(sql)) < 60
    assert ahead > 3 * 28 * 86400
    sql.execute("SELECT review_queue_event_add_months(5)")
    further = scrape(client, admin)["review_queue_event_partitions_ahead_seconds"]
    assert abs(further - _trail_ends(sql)) < 60
    assert further > ahead + 28 * 86400


def test_metrics_show_how_far_back_the_trail_goes_against_its_retention(
    client: TestClient, auth: Auth, sql: psycopg.Connection, db_url: str
) -> None:
    """The age of the live chain's first event (the oldest the trail keeps, what the archive moves
    first), beside the retention: ReviewQueueArchiveOverdue compares the two."""
    admin = auth("ops", "admin")
    assert scrape(client, admin)["review_queue_trail_oldest_event_age_seconds"] == 0  # nothing sealed
    first, second = (client.post("/items", json=item_body(), headers=admin).json()["id"] for _ in range(2))
    assert seal(db_url) == 2
    # Moved back (past the append-only trigger): the first item 400 days, the second 10.
    sql.execute("SET session_replication_role = replica")
    for item_id, days in ((first, 400), (second, 10)):
        sql.execute(
            "UPDATE review_queue_event SET at = at - make_interval(days => %s) WHERE item_id = %s",
            (days, item_id),
        )
    sql.execute("SET session_replication_role = origin")
    scraped = scrape(client, admin)
    assert abs(scraped["review_queue_trail_oldest_event_age_seconds"] - 400 * 86400) < 60
    assert scraped["review_queue_trail_retention_seconds"] == 2557 * 86400


def test_metrics_count_the_open_items_in_a_currency_without_a_rate(client: TestClient, auth: Auth) -> None:
    admin = auth("ops", "admin")
    for currency in ("USD", "EUR", "EUR", "JPY"):
        created = client.post(
            "/items", json=item_body(variance_amount="125", currency=currency), headers=admin
        )
        assert created.status_code == 201, created.text
    assert scrape(client, admin)["review_queue_items_without_rate"] == 3
    assert client.put("/fx-rates/EUR", json={"rate": "1.0850"}, headers=admin).status_code == 200
    assert scrape(client, admin)["review_queue_items_without_rate"] == 1


def test_stats_count_open_items_per_currency_and_those_waiting_without_a_rate(
    client: TestClient, auth: Auth, sql
) -> None:
    admin, alice = auth("ops", "admin"), auth("alice", "reviewer")
    created = client.post(
        "/items/batch",
        json={
            "items": [
                item_body(variance_amount="125", currency=currency)
                for currency in ("USD", "USD", "EUR", "EUR", "EUR", "JPY", "KWD")
            ]
        },
        headers=admin,
    )
    assert created.status_code == 200, created.text
    # A resolved USD item is no longer open: not counted; the leased ones are.
    leased = client.post("/leases", json={"batch_size": 10}, headers=alice).json()["items"]
    held = next(i for i in leased if i["currency"] == "USD")
    done = client.post(
        f"/items/{held['id']}/complete",
        json={"resolution": "APPROVED", "lease_token": held["lease_token"]},
        headers=alice,
    )
    assert done.json()["outcome"] == "resolved", done.text
    got = client.get("/stats", headers=alice).json()
    by_sql = dict(
        sql.execute(
            "SELECT currency, count(*) FROM review_queue_item WHERE state <> 'RESOLVED' GROUP BY currency"
        ).fetchall()
    )
    assert got["open_by_currency"] == by_sql == {"EUR": 3, "USD": 1, "JPY": 1, "KWD": 1}
    assert list(got["open_by_currency"]) == ["EUR", "JPY", "KWD", "USD"]  # most first, then by code
    assert (got["open_without_rate"], got["currencies_without_rate"]) == (5, ["EUR", "JPY", "KWD"])
    assert client.put("/fx-rates/EUR", json={"rate": "1.0850"}, headers=admin).status_code == 200
    got = client.get("/stats", headers=alice).json()
    assert (got["open_without_rate"], got["currencies_without_rate"]) == (2, ["JPY", "KWD"])
    # The same figure as the gauge the alert watches.
    assert scrape(client, admin)["review_queue_items_without_rate"] == got["open_without_rate"]
