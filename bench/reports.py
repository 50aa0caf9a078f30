"""make bench, part 8: the reports over a year of history.

Loads a year of work (1,000,000 items by default, enqueued evenly over the last 365 days, and their
events: leases, renewals, releases, resolutions, proposals and approvals, reopenings) with a few
set-based statements, then times each report through the API, as a client sees it. The target is
under a second per report; it is printed as measured, never asserted.
"""

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psutil
import psycopg
from sqlalchemy import text

from db.engine import libpq_url as libpq
from db.unit import Transaction

# One row per item: its figures and the moments of its life, drawn from its number (no randomness:
# two runs load the same history). Deadlines by the default SLA tiers; about 17 % of items are
# leased after their deadline; 5 % are released once first, 3 % go through approval, 0.5 % are
# reopened after resolution (and resolved again). A lease is renewed 0 to 4 times while it is worked
# (2 on average, as a desk renews a lease it holds), so the trail holds about 5 events an item: the
# 50M events of 10M items that issue 29 names.
PLAN = """
CREATE UNLOGGED TABLE bench_plan AS
WITH base AS (
    SELECT i, gen_random_uuid() AS id, gen_random_uuid() AS trace_id,
           %(now)s::timestamptz - interval '365 days'
               + (i - 1) * (interval '365 days' / %(items)s) AS created,
           CASE WHEN i %% 100 < 2 THEN 24 WHEN i %% 100 < 10 THEN 72 WHEN i %% 100 < 30 THEN 120 ELSE 168 END
               AS due_h,
           abs(hashint4(i)) %% 1200 / 1000.0 AS frac,
           1 + abs(hashint4(i + 1000003)) %% 59 AS handle_min
    FROM generate_series(1, %(items)s) AS i
)
SELECT i, id, trace_id, created,
       (CASE due_h WHEN 24 THEN 150000.00 WHEN 72 THEN 25000.00 WHEN 120 THEN 2500.00 ELSE 12.50 END
        * CASE WHEN i %% 7 = 0 THEN -1 ELSE 1 END)::numeric(18, 2) AS amount,
       created + due_h * interval '1 hour' AS due,
       created + frac * due_h * interval '1 hour' AS lease_at,
       created + frac * due_h * interval '1 hour' + handle_min * interval '1 minute' AS decided_at,
       i %% 20 = 3 AND frac * due_h > 1 AS released_first,
       due_h <= 72 AND i %% 3 = 0 AS approval,
       i %% 5 AS renewals,
       i %% 200 = 7 AS reopened,
       'ENTITY-' || i %% 20 AS entity,
       'reviewer-' || i %% 40 AS reviewer, 'reviewer-' || (i + 1) %% 40 AS other,
       'approver-' || i %% 5 AS approver
FROM base
"""

# Every event the plan implies, up to now, in the item's order (seq).
TRAIL = """
CREATE UNLOGGED TABLE bench_trail AS
WITH p AS (
    SELECT *, decided_at + CASE WHEN approval THEN interval '35 minutes' ELSE interval '0' END AS final_at
    FROM bench_plan
), candidates AS (
    SELECT i, 1 AS seq, 'ENQUEUED' AS event, 'ingest' AS actor, created AS at, '{}'::jsonb AS details FROM p
    UNION ALL
    SELECT i, 2, 'LEASED', other, created + (lease_at - created) / 2, '{}' FROM p WHERE released_first
    UNION ALL
    SELECT i, 3, 'RELEASED', other, created + (lease_at - created) / 2 + interval '10 minutes',
           '{"reason": "skipped"}' FROM p WHERE released_first
    UNION ALL
    SELECT i, 4, 'LEASED', reviewer, lease_at, '{}' FROM p
    UNION ALL
    SELECT i, 5, 'RENEWED', reviewer, lease_at + (decided_at - lease_at) * k / (renewals + 1), '{}'
    FROM p CROSS JOIN LATERAL generate_series(1, renewals) AS k
    UNION ALL
    SELECT i, 6, CASE WHEN approval THEN 'SUBMITTED_FOR_APPROVAL' ELSE 'RESOLVED' END, reviewer, decided_at,
           CASE WHEN approval
                THEN jsonb_build_object('resolution', 'ADJUSTMENT_POSTED', 'note', 'JE-' || i,
                                        'approval_threshold', '10000.00', 'variance_amount', amount)
                ELSE jsonb_build_object('resolution', CASE WHEN i %% 2 = 0 THEN 'MATCH_CONFIRMED'
                                                           ELSE 'TIMING_DIFFERENCE' END, 'note', NULL) END
    FROM p
    UNION ALL
    SELECT i, 7, 'LEASED', approver, decided_at + interval '30 minutes', '{"queue": "approval"}'
    FROM p WHERE approval
    UNION ALL
    SELECT i, 8, 'APPROVED', approver, final_at,
           jsonb_build_object('resolution', 'ADJUSTMENT_POSTED', 'note', 'JE-' || i, 'prepared_by', reviewer)
    FROM p WHERE approval
    UNION ALL
    SELECT i, 9, 'REOPENED', 'ada', final_at + interval '2 days',
           jsonb_build_object('reason', 'wrong entity', 'previous_resolved_at', final_at,
                              'previous_resolved_by', reviewer,
                              'previous_approved_by', CASE WHEN approval THEN approver END)
    FROM p WHERE reopened
    UNION ALL
    SELECT i, 10, 'LEASED', reviewer, final_at + interval '2 days 1 hour', '{}' FROM p WHERE reopened
    UNION ALL
    SELECT i, 11, 'RESOLVED', reviewer, final_at + interval '2 days 1 hour 5 minutes',
           '{"resolution": "MATCH_REJECTED", "note": "second look"}' FROM p WHERE reopened
)
SELECT c.*, count(*) FILTER (WHERE c.event = 'LEASED') OVER (PARTITION BY c.i ORDER BY c.seq) AS epoch
FROM candidates c WHERE c.at < %(now)s::timestamptz
"""

# Each item's row as its trail leaves it (state, holder, decision, proposal, approval, reopened),
# written in the order of each item's last event: where a running queue leaves the row's last
# version (each change writes a new one, beside that moment's other writes). Not in the join's
# order, which would scatter the live queue and each week's deadlines over the whole year's pages.
ITEMS = """
INSERT INTO review_queue_item (id, idempotency_key, ledger_entity, variance_amount, match_decision, state,
    leased_by, leased_at, lease_expires_at, trace_id, source_hash, created_at, resolution, resolution_note,
    resolved_by, resolved_at, lease_epoch, attempts, due_at, prepared_by, proposed_resolution, proposed_note,
    prepared_at, approved_by, approved_at, context{reopened})
SELECT p.id, 'bench-' || p.i, p.entity, p.amount, 'UNMATCHED', s.state,
       CASE WHEN s.state IN ('ASSIGNED', 'RESOLVED') OR s.last = 'LEASED' THEN s.lessee END,
       CASE WHEN s.state IN ('ASSIGNED', 'RESOLVED') OR s.last = 'LEASED' THEN s.leased_at END,
       CASE WHEN s.state = 'ASSIGNED' OR (s.state = 'AWAITING_APPROVAL' AND s.last = 'LEASED')
            THEN %(now)s::timestamptz + interval '1 hour'
            WHEN s.state = 'RESOLVED' THEN s.leased_at + interval '30 seconds' END,
       p.trace_id, 'sha256:' || p.i, p.created,
       CASE WHEN s.state = 'RESOLVED' THEN s.decision ->> 'resolution' END,
       CASE WHEN s.state = 'RESOLVED' THEN s.decision ->> 'note' END,
       CASE WHEN s.state = 'RESOLVED' THEN coalesce(s.decision ->> 'prepared_by', s.decider) END,
       CASE WHEN s.state = 'RESOLVED' THEN s.decided END,
       s.epoch, s.epoch, p.due,
       CASE WHEN p.approval AND s.state IN ('AWAITING_APPROVAL', 'RESOLVED') THEN p.reviewer END,
       CASE WHEN p.approval AND s.state IN ('AWAITING_APPROVAL', 'RESOLVED') THEN 'ADJUSTMENT_POSTED' END,
       CASE WHEN p.approval AND s.state IN ('AWAITING_APPROVAL', 'RESOLVED') THEN 'JE-' || p.i END,
       CASE WHEN p.approval AND s.state IN ('AWAITING_APPROVAL', 'RESOLVED') THEN p.decided_at END,
       CASE WHEN s.state = 'RESOLVED' AND s.last = 'APPROVED' THEN s.decider END,
       CASE WHEN s.state = 'RESOLVED' AND s.last = 'APPROVED' THEN s.decided END,
       jsonb_build_object('invoice', 'INV-' || p.i, 'counterparty', p.entity){reopened_value}
FROM bench_plan p
JOIN (
    SELECT t.i,
           (array_agg(t.event ORDER BY t.seq DESC))[1] AS last,
           max(t.at) AS last_at,
           bool_or(t.event = 'REOPENED') AS reopened,
           max(t.epoch) AS epoch,
           (array_agg(t.actor ORDER BY t.seq DESC) FILTER (WHERE t.event = 'LEASED'))[1] AS lessee,
           max(t.at) FILTER (WHERE t.event = 'LEASED') AS leased_at,
           (array_agg(t.details ORDER BY t.seq DESC) FILTER (WHERE t.event IN ('RESOLVED', 'APPROVED')))[1]
               AS decision,
           (array_agg(t.actor ORDER BY t.seq DESC) FILTER (WHERE t.event IN ('RESOLVED', 'APPROVED')))[1]
               AS decider,
           max(t.at) FILTER (WHERE t.event IN ('RESOLVED', 'APPROVED')) AS decided,
           CASE (array_agg(t.event ORDER BY t.seq DESC))[1]
                WHEN 'ENQUEUED' THEN 'PENDING' WHEN 'RELEASED' THEN 'PENDING' WHEN 'REOPENED' THEN 'PENDING'
                WHEN 'LEASED' THEN CASE WHEN max(t.seq) = 7 THEN 'AWAITING_APPROVAL' ELSE 'ASSIGNED' END
                WHEN 'RENEWED' THEN 'ASSIGNED'
                WHEN 'SUBMITTED_FOR_APPROVAL' THEN 'AWAITING_APPROVAL'
                ELSE 'RESOLVED' END AS state
    FROM bench_trail t GROUP BY t.i
) AS s ON s.i = p.i
ORDER BY s.last_at
"""

# Events in the order of their moments, as a busy queue writes them (ids follow time).
EVENTS = """
INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)
SELECT p.id, t.event, t.actor, t.at, t.epoch, p.trace_id, t.details
FROM bench_trail t JOIN bench_plan p USING (i)
ORDER BY t.at, t.i, t.seq
"""
EVENT_FK = "fk_review_queue_event_item_id_review_queue_item"


@contextmanager
def reopened_rows_allowed(conn: psycopg.Connection) -> Iterator[bool]:
    """Item rows that say they were reopened may be inserted meanwhile (the guard of
    2026_12_05_1500 refuses one before its REOPENED event is in); whether the schema has the flag
    (schemas before that migration have neither)."""
    (flagged,) = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'review_queue_item'::regclass"
        " AND attname = 'reopened' AND NOT attisdropped)"
    ).fetchone() or (False,)
    if not flagged:
        yield False
        return
    conn.execute("ALTER TABLE review_queue_item DISABLE TRIGGER review_queue_item_reopened_insert")
    try:
        yield True
    finally:
        conn.execute("ALTER TABLE review_queue_item ENABLE TRIGGER review_queue_item_reopened_insert")


def load_year(url: str, items: int) -> dict[str, Any]:
    """A year of history in the (freshly migrated) database at `url`; counts and seconds taken."""
    started = time.perf_counter()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET work_mem = '256MB'")
        conn.execute("SET maintenance_work_mem = '512MB'")
        (now,) = conn.execute("SELECT date_trunc('minute', now())").fetchone() or (None,)
        params = {"now": now, "items": items}
        conn.execute(PLAN, params)
        conn.execute(TRAIL, params)
        # The row says it was reopened (as the REOPENED trigger leaves it), so that the trigger finds
        # nothing to update: 50,000 updates at 10M would leave holes all over the year, which the
        # live queue loaded next would fill.
        with reopened_rows_allowed(conn) as flagged:
            flag = (", reopened", ",\n       s.reopened") if flagged else ("", "")
            conn.execute(ITEMS.format(reopened=flag[0], reopened_value=flag[1]), params)
        # The foreign key is checked once for all events afterwards, not row by row (a random
        # primary-key probe per event): the same guarantee, a fraction of the time.
        conn.execute(f"ALTER TABLE review_queue_event DROP CONSTRAINT {EVENT_FK}")
        conn.execute(EVENTS)
        conn.execute(
            f"ALTER TABLE review_queue_event ADD CONSTRAINT {EVENT_FK}"
            " FOREIGN KEY (item_id) REFERENCES review_queue_item (id)"
        )
        conn.execute("DROP TABLE bench_plan, bench_trail")
        conn.execute("VACUUM ANALYZE review_queue_item")
        conn.execute("VACUUM ANALYZE review_queue_event")
        (events,) = conn.execute("SELECT count(*) FROM review_queue_event").fetchone() or (0,)
    return {"items": items, "events": int(events), "load_s": round(time.perf_counter() - started, 1)}


# The live queue beside the history: `items` open items enqueued over the last 30 days, most
# PENDING, 15 % leased (ASSIGNED, their lease an hour from now), 5 % proposals awaiting approval, each
# with the events that put it there. Deterministic, like the year.
OPEN = """
CREATE UNLOGGED TABLE bench_open AS
SELECT i, gen_random_uuid() AS id, gen_random_uuid() AS trace_id,
       %(now)s::timestamptz - (i %% 43200) * interval '1 minute' AS created,
       CASE WHEN i %% 20 < 3 THEN 'ASSIGNED' WHEN i %% 20 = 3 THEN 'AWAITING_APPROVAL' ELSE 'PENDING' END
           AS state,
       'ENTITY-' || i %% 20 AS entity, 'reviewer-' || i %% 40 AS reviewer
FROM generate_series(1, %(items)s) AS i
"""
OPEN_ITEMS = """
INSERT INTO review_queue_item (id, idempotency_key, ledger_entity, variance_amount, match_decision, state,
    leased_by, leased_at, lease_expires_at, trace_id, source_hash, created_at, lease_epoch, attempts, due_at,
    prepared_by, proposed_resolution, proposed_note, prepared_at, context)
SELECT id, 'open-' || i, entity, 12.50, 'UNMATCHED', state,
       CASE WHEN state = 'ASSIGNED' THEN reviewer END,
       CASE WHEN state = 'ASSIGNED' THEN %(now)s::timestamptz - interval '5 minutes' END,
       CASE WHEN state = 'ASSIGNED' THEN %(now)s::timestamptz + interval '1 hour' END,
       trace_id, 'sha256:open-' || i, created, (state <> 'PENDING')::int, (state <> 'PENDING')::int,
       created + interval '168 hours',
       CASE WHEN state = 'AWAITING_APPROVAL' THEN reviewer END,
       CASE WHEN state = 'AWAITING_APPROVAL' THEN 'ADJUSTMENT_POSTED' END,
       CASE WHEN state = 'AWAITING_APPROVAL' THEN 'JE-open-' || i END,
       CASE WHEN state = 'AWAITING_APPROVAL' THEN created + interval '1 hour' END,
       jsonb_build_object('invoice', 'INV-OPEN-' || i, 'counterparty', entity)
FROM bench_open
"""
OPEN_EVENTS = """
INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)
SELECT id, event, actor, at, epoch, trace_id, details FROM (
    SELECT id, trace_id, 'ENQUEUED' AS event, 'ingest' AS actor, created AS at, 0 AS epoch,
           '{}'::jsonb AS details FROM bench_open
    UNION ALL
    SELECT id, trace_id, 'LEASED', reviewer,
           CASE WHEN state = 'ASSIGNED' THEN %(now)s::timestamptz - interval '5 minutes'
                ELSE created + interval '30 minutes' END, 1, '{}' FROM bench_open WHERE state <> 'PENDING'
    UNION ALL
    SELECT id, trace_id, 'SUBMITTED_FOR_APPROVAL', reviewer, created + interval '1 hour', 1,
           jsonb_build_object('resolution', 'ADJUSTMENT_POSTED', 'note', 'JE-open-' || i,
                              'approval_threshold', '10000.00', 'variance_amount', '12.50')
    FROM bench_open WHERE state = 'AWAITING_APPROVAL'
) AS e ORDER BY at
"""


def load_open(url: str, items: int) -> dict[str, Any]:
    """`items` open items (and their events) in the database at `url`; counts and seconds taken."""
    started = time.perf_counter()
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET work_mem = '256MB'")
        (now,) = conn.execute("SELECT date_trunc('minute', now())").fetchone() or (None,)
        params = {"now": now, "items": items}
        conn.execute(OPEN, params)
        conn.execute(OPEN_ITEMS, params)
        conn.execute(OPEN_EVENTS, params)
        conn.execute("DROP TABLE bench_open")
        conn.execute("VACUUM ANALYZE review_queue_item")
        conn.execute("VACUUM ANALYZE review_queue_event")
    return {"open_items": items, "load_s": round(time.perf_counter() - started, 1)}


# The chain over every event, in the sealer's order (xid, id), as the sealer would have left it on a
# service that has been running: the head at the newest event, so that the seal lag (a /metrics
# gauge) counts nothing. The hashes are placeholders (sha256 of the event id), not the documented
# links: no read the bench times checks them, and computing the real ones is one sequential pass
# (the sealer's own speed is part 7). `audit verify` on this database reports the chain broken.
PLACEHOLDER_CHAIN = """
INSERT INTO review_queue_chain (seq, event_id, hash)
SELECT coalesce((SELECT max(seq) FROM review_queue_chain), 0) + row_number() OVER (ORDER BY xid, id), id,
       sha256(convert_to(id::text, 'UTF8'))
FROM review_queue_event e
WHERE NOT EXISTS (SELECT FROM review_queue_chain c WHERE c.event_id = e.id)
ORDER BY xid, id
"""


def placeholder_chain(url: str) -> int:
    """Chain every unsealed event with placeholder hashes (PLACEHOLDER_CHAIN); returns how many."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("SET work_mem = '256MB'")
        chained = conn.execute(PLACEHOLDER_CHAIN).rowcount
        conn.execute("VACUUM ANALYZE review_queue_chain")
    return chained


# The zone the bench's service keeps the throughput and backlog reports' closed days in, and another
# with the same midnights all year, which the reports read from the trail: the two side by side.
ROLLUP_ZONE, LIVE_ZONE = "Europe/Berlin", "Europe/Paris"


def _periods() -> list[tuple[str, dict[str, str]]]:
    """A year up to today, as the API takes it: 365 days, and the 53 ISO weeks that cover it."""
    today = datetime.now(UTC).date()
    first = today - timedelta(days=364)
    monday = first - timedelta(days=first.weekday())
    after = today - timedelta(days=today.weekday()) + timedelta(weeks=1)
    days = {"from": first.isoformat(), "to": (today + timedelta(days=1)).isoformat(), "tz": ROLLUP_ZONE}
    weeks = {"from": monday.isoformat(), "to": after.isoformat(), "tz": ROLLUP_ZONE, "bucket": "week"}
    return [
        ("/reports/sla", weeks),
        ("/reports/sla", days),
        ("/reports/throughput", weeks),
        ("/reports/throughput", weeks | {"tz": LIVE_ZONE}),
        ("/reports/throughput", days),
        ("/reports/throughput", days | {"tz": LIVE_ZONE}),
        ("/reports/backlog", days),
        ("/reports/backlog", days | {"tz": LIVE_ZONE}),
    ]


def time_reports(
    base: str, token: str, runs: int, postgres_cpu: Callable[[], float | None]
) -> list[dict[str, Any]]:
    """Each report `runs` times through the API (after one warm-up): median and best seconds, and
    the CPU seconds PostgreSQL spent on it (its median), which a busy machine inflates far less."""
    results = []
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=120) as http:
        for path, params in _periods():
            samples, cpu = [], []
            for n in range(runs + 1):
                cpu0, started = postgres_cpu(), time.perf_counter()
                response = http.get(path, params=params)
                elapsed, cpu1 = time.perf_counter() - started, postgres_cpu()
                if response.status_code != 200:
                    raise SystemExit(f"{path} answered {response.status_code}: {response.text[:300]}")
                if n:  # the first run warms the caches
                    samples.append(elapsed)
                    if cpu0 is not None and cpu1 is not None:
                        cpu.append(cpu1 - cpu0)
            results.append(
                {
                    "report": f"{path}?bucket={params.get('bucket', 'day')}"
                    + (" (read live)" if params["tz"] == LIVE_ZONE else ""),
                    "p50_s": round(statistics.median(samples), 3),
                    "best_s": round(min(samples), 3),
                    "postgres_cpu_s": round(statistics.median(cpu), 3) if cpu else None,
                }
            )
        # The export of the whole year: the first byte, then every row.
        days = _periods()[-2][1]
        started = time.perf_counter()
        rows, first_byte = 0, None
        with http.stream("GET", "/reports/decisions.csv", params=days) as response:
            for line in response.iter_lines():
                if first_byte is None:
                    first_byte = time.perf_counter() - started
                rows += bool(line)
        total = time.perf_counter() - started
        results.append(
            {
                "report": "/reports/decisions.csv (a year)",
                "first_byte_s": round(first_byte or 0.0, 3),
                "total_s": round(total, 1),
                "rows": rows - 1,
                "rows_per_s": round((rows - 1) / total),
            }
        )
    return results


def report_lines(result: dict[str, Any]) -> list[str]:
    load = result["load"]
    write = [write_cost_line(result["write_cost"])] if "write_cost" in result else []
    if "write_cost_list" in result:
        write.append(write_cost_line(result["write_cost_list"], "the list filters' indexes (match, amount)"))
    lines = [
        f"8. reports over a year of history: {load['items']:,} items, {load['events']:,} events"
        f" (loaded in {load['load_s']} s); through the API, {result['runs']} runs each after a warm-up,"
        f" load average at start {result['loadavg']}. The throughput and backlog reports' closed days"
        f" kept in {ROLLUP_ZONE} as the reclaimer does ({result['rollup_s']} s for the year); read live"
        f" in {LIVE_ZONE}, the same midnights:"
    ]
    for r in result["reports"]:
        if "p50_s" in r:
            verdict = "met" if r["p50_s"] < 1 else "NOT met"
            lines.append(
                f"     {r['report']:<50}p50 {r['p50_s']:>6} s   best {r['best_s']:>6} s   (< 1 s: {verdict});"
                f" PostgreSQL CPU {r['postgres_cpu_s']} s"
            )
        else:
            lines.append(
                f"     {r['report']:<50}first byte {r['first_byte_s']} s,"
                f" {r['rows']:,} rows in {r['total_s']} s ({r['rows_per_s']:,} rows/s)"
            )
    return lines + write


# --- what the report indexes cost the queue's writes ---------------------------------------------

REPORT_INDEXES = (
    "ix_review_queue_item_resolved_due",
    "ix_review_queue_item_resolved_at",
    "ix_review_queue_event_reopened",
    "ix_review_queue_event_decision_at",
    "ix_review_queue_event_other_work",
    "ix_review_queue_event_lease_start",
)


async def _lease_and_complete(url: str, cycles: int) -> float:
    """PostgreSQL CPU seconds (of the one backend serving it) per lease and completion of an item,
    each in its own transaction, by the service's own statements."""
    from db import queue
    from db.engine import create_engine

    engine = create_engine(url, pool_size=1, max_overflow=0)
    try:
        async with engine.connect() as conn:
            pid = await conn.scalar(text("SELECT pg_backend_pid()"))
        backend = psutil.Process(pid)
        before = sum(backend.cpu_times()[:2])
        for _ in range(cycles):
            # The statements only: its reports (log lines, metrics) are not this bench's.
            async with engine.begin() as conn:
                (item,) = await queue.lease_items(
                    Transaction(conn),
                    reviewer="bench",
                    batch_size=1,
                    lease_duration=timedelta(minutes=5),
                    cap=10,
                )
            async with engine.begin() as conn:
                await queue.complete_item(
                    Transaction(conn),
                    item_id=item.id,
                    reviewer="bench",
                    resolution="MATCH_CONFIRMED",
                    note=None,
                )
        return float(sum(backend.cpu_times()[:2]) - before) / cycles
    finally:
        await engine.dispose()


# The list filters' indexes on a rare match decision or amount (2026_12_04_2230), and on the open
# items' amounts (2026_12_07_0610: the last is the only one a lease and a renewal write to).
LIST_INDEXES = (
    "ix_review_queue_item_resolved_match",
    "ix_review_queue_item_resolved_abs_amount",
    "ix_review_queue_item_pending_abs_amount",
    "ix_review_queue_item_open_abs_amount",
)


def write_cost(
    with_indexes: str, without: str, *, cycles: int, rounds: int, indexes: tuple[str, ...] = REPORT_INDEXES
) -> dict[str, Any]:
    """The same lease-and-complete cycle on two copies of one history, with and without `indexes`,
    alternated `rounds` times (the machine's noise moves both alike): PostgreSQL CPU per item."""
    import asyncio

    with psycopg.connect(libpq(without), autocommit=True) as conn:
        for name in indexes:
            conn.execute(f"DROP INDEX {name}")
    seeded = (
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash, due_at) SELECT 'write-' || i, 'ACME', 12.50, 'PARTIAL', 'h', now() + interval '1 day'"
        " FROM generate_series(1, %(n)s) AS i"
    )
    for url in (with_indexes, without):
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute(seeded, {"n": cycles * rounds + 10})
            conn.execute("VACUUM ANALYZE review_queue_item")
    samples: dict[str, list[float]] = {"with": [], "without": []}
    for _ in range(rounds):
        samples["with"].append(asyncio.run(_lease_and_complete(with_indexes, cycles)))
        samples["without"].append(asyncio.run(_lease_and_complete(without, cycles)))
    us = {k: [round(v * 1e6) for v in values] for k, values in samples.items()}
    ratio = round(statistics.median(samples["with"]) / statistics.median(samples["without"]), 3)
    return {"cycles": cycles, "rounds": rounds, "postgres_us_per_item": us, "ratio": ratio}


def write_cost_line(cost: dict[str, Any], what: str = "the report indexes") -> str:
    return (
        f"   {what} on the write path: PostgreSQL CPU per lease + completion (us), with"
        f" {cost['postgres_us_per_item']['with']}, without {cost['postgres_us_per_item']['without']}"
        f" (x{cost['ratio']}, medians; {cost['rounds']} alternated rounds of {cost['cycles']:,} items)"
    )
