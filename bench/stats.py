"""make bench, part 9: /stats and /metrics as history grows.

Two databases with the same live queue (open items and their events, the audit chain sealed up to
the newest event, the RESOLVED rollup caught up as the reclaimer keeps it): one with no history
behind it, one with a year of resolved items (bench/reports.py's generator). The year leaves its
last week's items open, as a busy queue has them; they, and the items resolved and due in the last
8 days (the 7-day SLA gauge's), are copied to the side without history, so that the two differ by
the history alone. Each endpoint is called
through the API on both, alternately, so that the machine's noise falls on both alike; the ratio
of the medians is the figure (issue 29: at most 1.3, and /stats under 50 ms).
"""

import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg

from bench.reports import reopened_rows_allowed
from db.engine import libpq_url as libpq

METRICS_TOKEN = "bench-metrics-scrape"  # noqa: S105 - a throwaway token for the bench's own servers
# What part 9 times on both sides: the two gauges, a page of each list filter that history could
# slow (oldest first, the worst order for a history), and the reports over the last 7 days, a
# period both sides have (a report costs what its period holds: a year's report reads a year).
LISTS = (
    "/items?state=RESOLVED&ledger_entity=ENTITY-7&limit=50",
    "/items?ledger_entity=ENTITY-7&limit=50",
    "/items?match_decision=UNMATCHED&limit=50",
    "/items?min_amount=100000&limit=50",
    "/items?resolved_by=reviewer-3&limit=50",
    "/items?sort=due_at&limit=50",
    "/items?q=ENTITY-7&limit=50",
    # Issue 42's search: a prefix of an invoice number in the context (the year's items carry
    # INV-<n>, the live queue's INV-OPEN-<n>): at 10M items 1,111 of the history's start so; and a
    # prefix of an id, a range of the primary key.
    "/items?q=inv-7741&limit=50",
    "/items?q=5a9c3e&limit=50",
)
REPORTS = ("/reports/sla", "/reports/throughput", "/reports/backlog")
ENDPOINTS = ("/stats", "/metrics", *LISTS, *REPORTS)
# Every other endpoint: <= 1.3 (issue 29); the search's, issue 42's: <= 1.5.
TARGETS = {
    "/stats": " (target <= 1.3, < 50 ms)",
    "/items?q=inv-7741&limit=50": " (target <= 1.5)",
    "/items?q=5a9c3e&limit=50": " (target <= 1.5)",
}


def _week() -> dict[str, str]:
    """The last 7 days up to today (UTC), as the reports take a period."""
    today = datetime.now(UTC).date()
    return {"from": (today - timedelta(days=6)).isoformat(), "to": (today + timedelta(days=1)).isoformat()}


def _role(path: str) -> str:
    """Whose token reads `path` (/metrics takes the scraper's, METRICS_TOKEN)."""
    return "auditor" if path in REPORTS else "reviewer"


# The year's present, beyond the open items both sides get: the items it left open (a year's
# generator leaves the last week's items open, as a busy queue has them: 101,570 at 10M items), and
# the resolved items due in the last 8 days, which /metrics' 7-day SLA gauge counts. A queue with
# no history still has its last week; what the sides must differ by is everything older.
_PRESENT = (
    "FROM review_queue_item WHERE idempotency_key NOT LIKE 'open-%'"
    " AND (state <> 'RESOLVED' OR due_at >= now() - interval '8 days')"
)
_COLUMNS = "item_id, event, actor, at, lease_epoch, trace_id, details, leased_at"


def match_live_queue(history: str, empty: str) -> int:
    """Copy the year's present in `history` (open items, and resolved items due in the last 8
    days, with their events) into `empty`, so that both sides have the same live queue and week
    and differ by the history alone; how many items."""
    with (
        psycopg.connect(libpq(history)) as source,
        psycopg.connect(libpq(empty), autocommit=True) as target,
    ):
        copies = (
            (f"SELECT * {_PRESENT}", "review_queue_item"),
            (
                f"SELECT {_COLUMNS} FROM review_queue_event WHERE item_id IN (SELECT id {_PRESENT})"
                " ORDER BY id",
                f"review_queue_event ({_COLUMNS})",
            ),
        )
        # The rows say whether they were reopened (bench/reports.py load_year writes them so too).
        with reopened_rows_allowed(target):
            for query, table in copies:
                with (
                    source.cursor().copy(f"COPY ({query}) TO STDOUT") as out,
                    target.cursor().copy(f"COPY {table} FROM STDIN") as into,
                ):
                    for block in out:
                        into.write(block)
        (copied,) = source.execute(f"SELECT count(*) {_PRESENT}").fetchone() or (0,)
        target.execute("VACUUM ANALYZE review_queue_item")
        target.execute("VACUUM ANALYZE review_queue_event")
    return int(copied)


def open_items(url: str) -> int:
    with psycopg.connect(libpq(url)) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM review_queue_item WHERE state <> 'RESOLVED'"
        ).fetchone() or (0,)
    return int(count)


def due_this_week(url: str) -> int:
    """The items the 7-day SLA gauge counts: due in the last 7 days, whatever their state."""
    with psycopg.connect(libpq(url)) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM review_queue_item WHERE due_at >= now() - interval '7 days'"
            " AND due_at <= now()"
        ).fetchone() or (0,)
    return int(count)


def history_size(url: str) -> dict[str, int]:
    """The items and events of a kept history database (--stats-reuse)."""
    with psycopg.connect(libpq(url)) as conn:
        items, events = conn.execute(
            "SELECT (SELECT count(*) FROM review_queue_item), (SELECT count(*) FROM review_queue_event)"
        ).fetchone() or (0, 0)
    return {"items": items, "events": events}


def time_side_by_side(
    bases: dict[str, str], tokens: dict[str, dict[str, str]], runs: int
) -> dict[str, dict[str, Any]]:
    """Each endpoint on each server `runs` times (after two warm-ups), alternating servers:
    {endpoint: {server: {p50_ms, p90_ms}, "ratio": p50 with history / p50 without}}."""
    samples: dict[str, dict[str, list[float]]] = {path: {name: [] for name in bases} for path in ENDPOINTS}
    clients = {name: httpx.Client(base_url=base, timeout=60) for name, base in bases.items()}
    try:
        for n in range(runs + 2):
            for path in ENDPOINTS:
                for name, http in clients.items():
                    started = time.perf_counter()
                    token = METRICS_TOKEN if path == "/metrics" else tokens[name][_role(path)]
                    params = _week() if path in REPORTS else None
                    response = http.get(path, params=params, headers={"Authorization": f"Bearer {token}"})
                    elapsed = time.perf_counter() - started
                    if response.status_code != 200:
                        raise SystemExit(
                            f"{name} {path} answered {response.status_code}: {response.text[:300]}"
                        )
                    if n >= 2:
                        samples[path][name].append(elapsed * 1000)
    finally:
        for http in clients.values():
            http.close()
    result: dict[str, dict[str, Any]] = {}
    for path, by_server in samples.items():
        figures: dict[str, Any] = {
            name: {
                "p50_ms": round(statistics.median(values), 1),
                "p90_ms": round(sorted(values)[int(0.9 * (len(values) - 1))], 1),
            }
            for name, values in by_server.items()
        }
        figures["ratio"] = round(figures["history"]["p50_ms"] / figures["empty"]["p50_ms"], 2)
        result[path] = figures
    return result


def report_lines(result: dict[str, Any]) -> list[str]:
    load = result["load"]
    loaded = "kept from an earlier run" if result.get("reused") else "loaded"
    lines = [
        "9. Reads as history grows (/stats, /metrics, list pages, 7-day reports):"
        f" open items {result['open_items']['empty']:,} without"
        f" history, {result['open_items']['history']:,} with; due in the last 7 days"
        f" {result['due_this_week']['empty']:,} and {result['due_this_week']['history']:,};"
        f" history {load['items']:,} items, {load['events']:,} events ({loaded} in {result['load_s']} s);"
        f" {result['runs']} calls each, alternating, load average at start {result['loadavg']}:",
        f"     {'':58}{'empty p50':>12}{'p90':>8}{'history p50':>14}{'p90':>8}{'ratio':>8}",
    ]
    for path in ENDPOINTS:
        r = result["timings"].get(path)
        if r is None:  # a result from before the endpoint was timed
            continue
        empty, history = r["empty"], r["history"]
        lines.append(
            f"     {path:<58}{empty['p50_ms']:>10} ms{empty['p90_ms']:>8}{history['p50_ms']:>11} ms"
            f"{history['p90_ms']:>8}{'x' + str(r['ratio']):>8}{TARGETS.get(path, ' (target <= 1.3)')}"
        )
    return lines
