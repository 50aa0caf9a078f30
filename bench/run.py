"""make bench: the HTTP API against the raw-SQL ceiling, and dequeue latency as history grows.

Everything runs on one PostgreSQL (embedded by default, DATABASE_URL otherwise), side by side in
one run, and is reported as ratios: absolute numbers on a shared 2-core machine mean little.
"""

import asyncio
import json
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import httpx
import psutil
import psycopg
import typer
from sqlalchemy.dialects import postgresql

from api.settings import get_settings
from bench import capacity as capacity_bench
from bench import feed_read as feed_read_bench
from bench import pool as pool_bench
from bench import reports as report_bench
from bench import stats as stats_bench
from bench import wakeup
from bench import webhooks as webhook_bench
from bench.harness import (
    RESOLVE_OPEN,
    SEED_ASSIGNED_AT_HEAD,
    SEED_OTHER_ENTITIES,
    SEED_PENDING,
    SEED_RESOLVED_HISTORY,
    PostgresCpu,
    Server,
    create_token,
    database_url,
    drop_databases,
    fresh_database,
    percentile,
    reviewer_tokens,
    run_sql,
    start_server,
    stop_server,
)
from bench.text import report, report_dequeue, report_throughput, report_wakeup
from bench.throughput import api_run, api_throughput, floor, raw_ceiling, storage
from cli.common import owner_url
from db.engine import libpq_url as libpq
from db.migrations import upgrade_head
from db.queue.lease import _LEASE

app = typer.Typer(add_completion=False)


# --- 4. dequeue scaling -----------------------------------------------------------------------


def lease_latencies(
    server: Server, token: str, url: str, samples: int, ledger_entity: str | None = None
) -> list[float]:
    """Sequential POST /leases of 20 (of one ledger entity, when given); the leased items are
    resolved in SQL, untimed, in between."""
    latencies = []
    headers = {"Authorization": f"Bearer {token}"}
    with (
        httpx.Client(base_url=server.base, headers=headers) as http,
        psycopg.connect(libpq(url), autocommit=True) as sql,
    ):
        for n in range(samples + 10):
            t0 = time.perf_counter()
            response = http.post(
                "/leases",
                json={"batch_size": 20, **({"ledger_entity": ledger_entity} if ledger_entity else {})},
            )
            elapsed = time.perf_counter() - t0
            items = response.json()["items"]
            assert len(items) == 20, response.text
            if n >= 10:  # warm-up
                latencies.append(elapsed)
            sql.execute(
                "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'OK',"
                " resolved_by = leased_by, resolved_at = now() WHERE id = ANY(%s)",
                ([i["id"] for i in items],),
            )
    return latencies


def raw_lease_p50(url: str, samples: int) -> float:
    """The service's own lease statement, run directly and rolled back (so the queue is unchanged)."""
    compiled = _LEASE.compile(dialect=postgresql.psycopg.dialect())  # type: ignore[no-untyped-call]
    params = compiled.construct_params(
        {"actor": "raw-probe", "batch_size": 20, "cap": 10_000, "lease_duration": timedelta(seconds=30)}
    )
    latencies = []
    with psycopg.connect(libpq(url)) as conn:
        for _ in range(samples):
            t0 = time.perf_counter()
            conn.execute(str(compiled), params).fetchall()
            latencies.append(time.perf_counter() - t0)
            conn.rollback()
    return statistics.median(latencies) * 1000


def dequeue_scaling(server_url: str, workers: int, port: int, samples: int) -> dict[str, Any]:
    url = fresh_database(server_url, "rq_bench_dequeue")
    leases = (samples + 10) * 20  # items one scenario leases
    run_sql(
        url, SEED_PENDING, {"prefix": "p-", "entity": "ACME-CORP", "count": leases * 4 + 1000}, vacuum=True
    )
    (token,) = reviewer_tokens(url, 1)
    server = start_server(url, workers, port)
    result: dict[str, Any] = {}
    try:
        scenarios = [
            ("a_empty_history", None),
            ("c_10k_assigned_at_head", (SEED_ASSIGNED_AT_HEAD, {"count": 10_000})),
            ("d_both", (SEED_RESOLVED_HISTORY, {"count": 1_000_000})),
            ("b_1m_resolved", (RESOLVE_OPEN, {})),
            ("e_one_entity_of_20", (SEED_OTHER_ENTITIES, {"count": 20_000})),
        ]  # fmt: skip
        for name, change in scenarios:
            if change:
                run_sql(url, change[0], change[1], vacuum=True)
            entity = None
            if name == "e_one_entity_of_20":  # (b)'s history, 20,000 items of 19 other entities pending
                entity = "ROUTED"
                run_sql(
                    url, SEED_PENDING, {"prefix": "e-", "entity": entity, "count": leases + 100}, vacuum=True
                )
            latencies = lease_latencies(server, token, url, samples, entity)
            result[name] = {
                "p50_ms": round(percentile(latencies, 50) * 1000, 2),
                "p99_ms": round(percentile(latencies, 99) * 1000, 2),
            }
            if name == "d_both":
                result["raw_statement_p50_ms_d"] = round(raw_lease_p50(url, samples), 3)
                # The seed's index shape (PENDING and ASSIGNED rows in one index; on the lease's
                # order, due_at then created_at) instead of the split ones, same data: what the
                # split buys.
                run_sql(url, "DROP INDEX ix_review_queue_item_pending_due")
                run_sql(url, "CREATE INDEX seed_dequeue ON review_queue_item (due_at, created_at)"
                             " WHERE state IN ('PENDING', 'ASSIGNED')", vacuum=True)  # fmt: skip
                result["raw_statement_p50_ms_d_seed_index"] = round(raw_lease_p50(url, samples), 3)
                run_sql(url, "DROP INDEX seed_dequeue")
                run_sql(url, "CREATE INDEX ix_review_queue_item_pending_due ON review_queue_item"
                             " (due_at, created_at) WHERE state = 'PENDING'", vacuum=True)  # fmt: skip
    finally:
        stop_server(server)
    base = result["a_empty_history"]["p50_ms"]
    for name in ("b_1m_resolved", "c_10k_assigned_at_head", "d_both", "e_one_entity_of_20"):
        result[name]["p50_ratio_to_a"] = round(result[name]["p50_ms"] / base, 2)
    return result


# --- 6. work arrives by itself ------------------------------------------------------------------


def work_arrives(
    server_url: str, port: int, poll_interval_ms: int, samples: int, seconds: float
) -> dict[str, Any]:
    url = fresh_database(server_url, "rq_bench_wakeup")
    reviewer, admin = reviewer_tokens(url, 1)[0], create_token(url, "bench-admin", "admin")
    server = start_server(url, 1, port)
    try:
        result: dict[str, Any] = {
            "latency": wakeup.wakeup_latency(
                server.base, reviewer, admin, samples=samples, poll_interval_ms=poll_interval_ms
            ),
            "poll_interval_ms": poll_interval_ms,
        }
    finally:
        stop_server(server)
    notify_url = fresh_database(server_url, "rq_bench_notify")
    result["notify"] = wakeup.notify_cost(notify_url, producers=4, consumers=4, seconds=seconds)
    drop_databases(server_url, "rq_bench_wakeup", "rq_bench_notify")
    return result


# --- 6. the audit chain ----------------------------------------------------------------------


SEED_EVENTS = """
INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id, details)
SELECT i.id, 'RESOLVED', 'alice', 1, i.trace_id,
       jsonb_build_object('resolution', 'APPROVED', 'note', 'FX rounding ' || g)
FROM review_queue_item i, generate_series(1, %(per_item)s) g
"""


def audit_chain(server_url: str, events: int) -> dict[str, Any]:
    """Seal and verify `events` events: the sealer's catch-up rate and `audit verify`'s speed."""
    from cli import reclaimer
    from db import audit

    url = fresh_database(server_url, "rq_bench_audit")
    run_sql(url, SEED_PENDING, {"prefix": "audit-", "entity": "ACME-CORP", "count": 1000})
    run_sql(url, SEED_EVENTS, {"per_item": max(1, events // 1000)}, vacuum=True)
    settings = get_settings().model_copy(update={"statement_timeout_ms": 600_000})
    started = time.perf_counter()
    sealed = asyncio.run(reclaimer.seal_once(settings, url))
    seal_s = time.perf_counter() - started
    with psycopg.connect(libpq(url)) as conn:
        cpu0 = time.process_time()
        result = audit.verify(conn)
        verify_cpu = time.process_time() - cpu0
    assert result.broken is None and result.events == sealed, result
    return {
        "events": sealed,
        "seal_s": round(seal_s, 1),
        "sealed_per_s": round(sealed / seal_s),
        "verify_s": round(result.seconds, 1),
        "verified_per_s": round(sealed / result.seconds),
        "verify_python_cpu_s": round(verify_cpu, 1),
    }


def reports_over_a_year(
    server_url: str, port: int, items: int, runs: int, *, write_costs: bool = True
) -> dict[str, Any]:
    """Part 8: a year of history, then every report through one API worker; and what the reports'
    indexes cost a lease and a completion (two copies of a smaller history, with and without them)."""
    costs: dict[str, Any] = {}
    if write_costs:
        urls = [fresh_database(server_url, f"rq_bench_write_{kind}") for kind in ("with", "without")]
        for url in urls:
            report_bench.load_year(url, 50_000)
        costs["write_cost"] = report_bench.write_cost(*urls, cycles=2_000, rounds=3)
        costs["write_cost_list"] = list_index_cost(server_url)
    from cli import reclaimer

    url = fresh_database(server_url, "rq_bench_reports")
    load = report_bench.load_year(url, items)
    (token,) = reviewer_tokens(url, 1)
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute("UPDATE api_token SET role = 'auditor'")
    zone = {"REVIEW_QUEUE_REPORT_TIME_ZONE": report_bench.ROLLUP_ZONE}
    started = time.perf_counter()
    settings = get_settings().model_copy(update={"report_time_zone": report_bench.ROLLUP_ZONE})
    asyncio.run(reclaimer.roll_up_once(settings, url))
    rollup_s = round(time.perf_counter() - started, 1)
    loadavg = [round(x, 2) for x in os.getloadavg()]
    # A slow report is measured, not cut off by the default 5 s statement timeout.
    server = start_server(url, 1, port, env={"REVIEW_QUEUE_STATEMENT_TIMEOUT_MS": "120000", **zone})
    try:
        timed = report_bench.time_reports(server.base, token, runs, PostgresCpu(url).seconds)
    finally:
        stop_server(server)
    return {
        "load": load,
        "reports": timed,
        "runs": runs,
        "loadavg": loadavg,
        **costs,
        "rollup_s": rollup_s,
    }


def list_index_cost(server_url: str) -> dict[str, Any]:
    """What the list filters' indexes (bench/reports.py LIST_INDEXES) cost a lease and a completion,
    alone: two copies of a small history that differ only by them."""
    costs = [fresh_database(server_url, f"rq_bench_listw_{kind}") for kind in ("with", "without")]
    for url in costs:
        report_bench.load_year(url, 50_000)
    cost = report_bench.write_cost(*costs, cycles=2_000, rounds=3, indexes=report_bench.LIST_INDEXES)
    drop_databases(server_url, "rq_bench_listw_with", "rq_bench_listw_without")
    return cost


def stats_over_history(
    server_url: str, port: int, items: int, open_items: int, runs: int, *, reuse: bool = False
) -> dict[str, Any]:
    """Part 9: the same live queue with no history and with `items` of history behind it, each
    rolled up and sealed as a running service keeps it; /stats and /metrics timed on both. With
    `reuse`, the history is the one a --stats-keep run left, whatever `items` says."""
    from cli import reclaimer

    started = time.perf_counter()
    names = {name: f"rq_bench_stats_{name}" for name in ("empty", "history")}
    # The side without history is cheap: made anew each time. With `reuse`, the history side is
    # the one a --stats-keep run left, migrated to head.
    urls = {"empty": fresh_database(server_url, names["empty"])}
    if reuse:
        urls["history"] = database_url(server_url, names["history"])
        upgrade_head(urls["history"])
        load = stats_bench.history_size(urls["history"])
    else:
        urls["history"] = fresh_database(server_url, names["history"])
        load = report_bench.load_year(urls["history"], items)
    stats_bench.match_live_queue(urls["history"], urls["empty"])
    report_bench.load_open(urls["empty"], open_items)
    report_bench.placeholder_chain(urls["empty"])
    if not reuse:
        report_bench.load_open(urls["history"], open_items)
        report_bench.placeholder_chain(urls["history"])
    for url in urls.values():
        asyncio.run(reclaimer.roll_up_once(get_settings(), url))
    load_s = round(time.perf_counter() - started)
    live = {name: stats_bench.open_items(url) for name, url in urls.items()}
    week = {name: stats_bench.due_this_week(url) for name, url in urls.items()}
    tokens = {
        name: {
            "reviewer": reviewer_tokens(url, 1)[0],
            "auditor": create_token(url, "bench-auditor", "auditor"),
        }
        for name, url in urls.items()
    }
    loadavg = [round(x, 2) for x in os.getloadavg()]
    env = {"REVIEW_QUEUE_METRICS_TOKEN": stats_bench.METRICS_TOKEN}
    servers = {name: start_server(url, 1, port + n, env=env) for n, (name, url) in enumerate(urls.items())}
    try:
        timings = stats_bench.time_side_by_side(
            {name: server.base for name, server in servers.items()}, tokens, runs
        )
    finally:
        for server in servers.values():
            stop_server(server)
    return {
        "load": load, "reused": reuse, "open_items": live, "due_this_week": week, "load_s": load_s,
        "runs": runs,
        "loadavg": loadavg,
        "timings": timings,
    }  # fmt: skip


def capacity(server_url: str, items: int, wal_items: int) -> dict[str, Any]:
    """Part 10 (bench/capacity.py): WAL per item, then a year of history kept."""
    result = {
        "wal": capacity_bench.wal_per_item(server_url, wal_items),
        "year": capacity_bench.history_upkeep(server_url, items),
        "partitions": capacity_bench.partition_cost(server_url),
        "archive": capacity_bench.archive_cost(server_url, items),
    }
    drop_databases(
        server_url,
        "rq_bench_capacity_wal",
        "rq_bench_capacity_year",
        "rq_bench_part_partitioned",
        "rq_bench_part_plain",
        "rq_bench_capacity_archive",
    )
    return result


# Issue 40: a completion compares its amount converted into the base currency at the latest rate.
# An item in the base currency takes the rate 1 without reading the rate table; one in another
# currency reads its latest rate (one probe of ix_fx_rate_currency_set_at). Its cost is the gap.
CONVERTED = ("EUR", "1.0850")


def conversion(
    server_url: str, *, clients: int, items: int, batch: int, complete_batch: int, rounds: int, **common: Any
) -> dict[str, Any]:
    """Per-item and batched completions of items in the base currency and of items in a currency with
    a rate, side by side: each round runs both, in ABBA order across rounds (drift cancels)."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        mode: {"base": [], "converted": []} for mode in ("per_item", "batched")
    }
    for n in range(rounds):
        sides = ("base", "converted") if n % 2 == 0 else ("converted", "base")
        for mode in ("per_item", "batched"):
            for side in sides:
                typer.echo(f"conversion round {n + 1}/{rounds}: {mode}, {side} ...", err=True)
                result, url = api_run(
                    server_url, f"rq_bench_fx_{side}", clients=clients, items=items,
                    batch=complete_batch if mode == "batched" else batch, batch_complete=mode == "batched",
                    rate=CONVERTED if side == "converted" else None, **common,
                )  # fmt: skip
                # Each completion converted as its side says: the rate its RESOLVED event records.
                with psycopg.connect(libpq(url)) as conn:
                    rates = conn.execute(
                        "SELECT details ->> 'rate', count(*) FROM review_queue_event"
                        " WHERE event = 'RESOLVED' GROUP BY 1"
                    ).fetchall()
                assert rates == [(CONVERTED[1] if side == "converted" else "1", items)], rates
                runs[mode][side].append(result)
    drop_databases(server_url, "rq_bench_fx_base", "rq_bench_fx_converted")
    out: dict[str, Any] = {"rounds": rounds, "items": items, "currency": CONVERTED}
    for mode, by_side in runs.items():
        speed = {side: statistics.mean(r["items_per_s"] for r in rs) for side, rs in by_side.items()}
        p50 = {side: statistics.median(r["complete_p50_ms"] for r in rs) for side, rs in by_side.items()}
        # CPU per item moves less than wall-clock time when other work shares the cores: beside
        # the mean speed, each round's own ratio (its two runs side by side) and PostgreSQL's and
        # the API's CPU per item.
        paired = [c["items_per_s"] / b["items_per_s"] for b, c in zip(*by_side.values(), strict=True)]
        cpu = {
            who: {
                side: round(statistics.median(r["cpu_ms_per_item"][who] for r in rs), 3)
                for side, rs in by_side.items()
            }
            for who in ("postgres", "api")
            if all(r["cpu_ms_per_item"][who] is not None for rs in by_side.values() for r in rs)
        }
        out[mode] = {
            "items_per_s": {side: round(v, 1) for side, v in speed.items()},
            "each_run_items_per_s": {side: [r["items_per_s"] for r in rs] for side, rs in by_side.items()},
            "complete_p50_ms": {side: round(v, 2) for side, v in p50.items()},
            "ratio": round(speed["converted"] / speed["base"], 3),
            "round_ratios": [round(x, 3) for x in paired],
            "median_round_ratio": round(statistics.median(paired), 3),
            "cpu_ms_per_item_median": cpu,
        }
    return out


def report_conversion(fx: dict[str, Any]) -> list[str]:
    code, rate = fx["currency"]
    lines = [
        f"Completion with the conversion (issue 40): {fx['items']:,} items per run, {fx['rounds']} rounds"
        f" (ABBA); base = every item in the base currency, converted = every item in {code} at {rate}",
        f"{'':24}{'base items/s':>14}{'converted':>12}{'ratio':>8}{'p50 ms base/conv':>20}   target",
    ]
    for mode, label in (("per_item", "per item"), ("batched", "batched")):
        m = fx[mode]
        verdict = "met" if m["median_round_ratio"] >= 0.95 else "not met"
        speed, p50 = m["items_per_s"], m["complete_p50_ms"]
        lines.append(
            f"{label:24}{speed['base']:>14}{speed['converted']:>12}{'x' + str(m['ratio']):>8}"
            f"{str(p50['base']) + ' / ' + str(p50['converted']):>20}"
            f"   median round >= x0.95: {verdict}"
        )
        lines.append(f"{'':24}each round: {m['round_ratios']}, median x{m['median_round_ratio']}")
        for who, sides in m["cpu_ms_per_item_median"].items():
            lines.append(
                f"{'':24}{who} CPU ms per item (median): {sides['base']} base, {sides['converted']} converted"
            )
    return lines


@app.command()
def main(
    clients: Annotated[int, typer.Option(help="Concurrent clients (raw and API).")] = 8,
    items: Annotated[int, typer.Option(help="Items each throughput run drains.")] = 20_000,
    batch: Annotated[int, typer.Option(help="Lease batch size.")] = 20,
    workers: Annotated[
        int | None, typer.Option(help="API worker processes; default one per core, as the README recommends.")
    ] = None,
    lease_samples: Annotated[int, typer.Option(help="Timed leases per dequeue scenario.")] = 200,
    port: Annotated[int, typer.Option(help="Port for the API under test.")] = 8765,
    json_path: Annotated[Path | None, typer.Option("--json", help="Also write the results here.")] = None,
    wakeup_samples: Annotated[int, typer.Option(help="Enqueue-to-lease samples per mode.")] = 30,
    notify_seconds: Annotated[float, typer.Option(help="Length of each NOTIFY on/off run.")] = 5.0,
    only_wakeup: Annotated[bool, typer.Option(help="Run part 6 (wake-up, NOTIFY cost) alone.")] = False,
    only_dequeue: Annotated[bool, typer.Option(help="Run part 4 (dequeue scaling) alone.")] = False,
    only_pool: Annotated[
        bool,
        typer.Option(help="Run part 11a (one API process, 30 clients: 503s, old pool vs defaults) alone."),
    ] = False,
    pool_clients: Annotated[
        int, typer.Option(help="Concurrent clients of part 11a (and 11b's measured ones).")
    ] = 30,
    pool_items: Annotated[int, typer.Option(help="Items part 11a completes on each side.")] = 1_800,
    only_feed: Annotated[
        bool, typer.Option(help="Run part 11b (other routes' p95 beside feed long-pollers) alone.")
    ] = False,
    feed_pollers: Annotated[
        int, typer.Option(help="Feed long-pollers of part 11b (0: skip part 11b).")
    ] = 500,
    feed_clients: Annotated[
        int,
        typer.Option(help="Clients whose lease and complete part 11b times, idle and beside the pollers."),
    ] = 8,
    only_webhooks: Annotated[
        bool, typer.Option(help="Run the webhooks part (a receiver failing 20 %, default retries) alone.")
    ] = False,
    webhook_events: Annotated[
        int, typer.Option(help="Events the webhooks part delivers (to each subscription).")
    ] = 2_000,
    webhook_subscriptions: Annotated[
        list[int] | None,
        typer.Option(
            help="Subscriptions of the webhooks part, each to its own path of one receiver; repeat the"
            " option for a run at each count (--webhook-subscriptions 1 --webhook-subscriptions 10)."
        ),
    ] = None,
    webhook_fail: Annotated[
        float,
        typer.Option(help="Share of the webhooks part's requests the receiver answers 500 (0: healthy)."),
    ] = 0.2,
    only_feed_read: Annotated[
        bool,
        typer.Option(
            help="Run the change feed read end to end (catching up from the start, at the head) alone."
        ),
    ] = False,
    feed_read_events: Annotated[
        int, typer.Option(help="Events loaded for the feed read (five an item).")
    ] = 1_000_000,
    feed_head_rates: Annotated[
        list[float] | None,
        typer.Option(
            help="The head writer's events/s, one run each (repeat the option); default 200 and 2000."
        ),
    ] = None,
    feed_head_seconds: Annotated[
        float, typer.Option(help="How long the head writer writes, each run.")
    ] = 10.0,
    only_reports: Annotated[bool, typer.Option(help="Run part 8 (reports over a year) alone.")] = False,
    report_items: Annotated[
        int, typer.Option(help="Items in part 8's year of history (0: skip part 8).")
    ] = 1_000_000,
    report_runs: Annotated[int, typer.Option(help="Timed runs of each report in part 8.")] = 3,
    report_write_costs: Annotated[
        bool, typer.Option(help="Part 8 also measures what the report and list indexes cost the writes.")
    ] = True,
    only_stats: Annotated[
        bool, typer.Option(help="Run part 9 (/stats and /metrics as history grows) alone.")
    ] = False,
    stats_items: Annotated[
        int, typer.Option(help="Items of history in part 9 (0: skip part 9; 10000000 for issue 29's size).")
    ] = 1_000_000,
    stats_open: Annotated[int, typer.Option(help="Open items on both sides of part 9.")] = 20_000,
    stats_runs: Annotated[
        int, typer.Option(help="Timed calls of each endpoint on each side in part 9.")
    ] = 40,
    stats_keep: Annotated[
        bool,
        typer.Option(
            help="Keep part 9's two databases afterwards (rq_bench_stats_*), to look into a figure."
        ),
    ] = False,
    stats_reuse: Annotated[
        bool,
        typer.Option(
            help="Time part 9 on the history a --stats-keep run left (migrated to head), without loading it."
        ),
    ] = False,
    only_capacity: Annotated[
        bool,
        typer.Option(
            help="Run part 10 (WAL per item; size, vacuum and dump of a year;"
            " the partitioned trail's write cost) alone."
        ),
    ] = False,
    capacity_items: Annotated[
        int, typer.Option(help="Items of history in part 10's year (0: skip part 10).")
    ] = 1_000_000,
    capacity_wal_items: Annotated[int, typer.Option(help="Items per WAL run in part 10.")] = 2_000,
    only_upkeep: Annotated[
        bool,
        typer.Option(
            help="Part 10's size, vacuum and dump alone, of the history a --stats-keep run left"
            " (10M items without loading another)."
        ),
    ] = False,
    sealer: Annotated[
        bool,
        typer.Option("--sealer/--no-sealer", help="Seal the audit chain every second during the API run."),
    ] = True,
    api_only: Annotated[
        bool, typer.Option("--api-only", help="Only the HTTP API throughput (part 2).")
    ] = False,
    audit_events: Annotated[
        int, typer.Option(help="Events sealed and verified in part 6 (0: skip).")
    ] = 1_000_000,
    complete_batch: Annotated[
        int,
        typer.Option(
            help="Items per lease and per POST /items/complete in the batched run (2b); 0 skips it."
        ),
    ] = 100,
    one_client_items: Annotated[int, typer.Option(help="Items the one-client run (2c) drains.")] = 2_000,
    only_conversion: Annotated[
        bool,
        typer.Option(
            help="Only the conversion's cost: per-item and batched runs in the base currency and in a"
            " currency with a rate, side by side."
        ),
    ] = False,
    conversion_rounds: Annotated[int, typer.Option(help="Rounds of the conversion runs (ABBA).")] = 2,
    throughput_only: Annotated[
        bool,
        typer.Option(
            "--throughput-only", help="Only rows 1, 2, 2b and 2c (raw, per item, batched, 1 client)."
        ),
    ] = False,
) -> None:
    settings = get_settings()
    # The owner creates the bench's databases (the application role cannot) and the API runs as it.
    server_url = owner_url(settings)
    workers = workers or os.cpu_count() or 1
    results: dict[str, Any] = {
        "clients": clients,
        "items": items,
        "batch": batch,
        "workers": workers,
        "machine": f"{os.cpu_count()} cores, {round(psutil.virtual_memory().total / 2**30)} GiB",
        "sealer": sealer,
        "complete_batch": complete_batch,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if only_conversion:
        results["conversion"] = conversion(
            server_url, clients=clients, items=items, batch=batch, complete_batch=complete_batch or 100,
            rounds=conversion_rounds, workers=workers, port=port, sealer=sealer,
        )  # fmt: skip
        typer.echo("\n".join(report_conversion(results["conversion"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if throughput_only:
        typer.echo("1/4 raw SQL ceiling ...", err=True)
        results["raw"] = raw_ceiling(fresh_database(server_url, "rq_bench_raw"), clients, items, batch)
        common: dict[str, Any] = {"workers": workers, "port": port, "sealer": sealer}
        typer.echo("2/4 HTTP API, per item ...", err=True)
        results["api"], _ = api_run(
            server_url, "rq_bench_api", clients=clients, items=items, batch=batch, **common
        )
        if complete_batch:  # 0: a server without POST /items/complete (a before/after run)
            typer.echo("3/4 HTTP API, batched ...", err=True)
            results["batched"], _ = api_run(
                server_url, "rq_bench_batched", clients=clients, items=items, batch=complete_batch,
                batch_complete=True, **common,
            )  # fmt: skip
        typer.echo("4/4 HTTP API, one client ...", err=True)
        results["one_client"], _ = api_run(
            server_url, "rq_bench_one", clients=1, items=one_client_items, batch=batch, **common
        )
        typer.echo("floor: bare FastAPI route + one psycopg round trip ...", err=True)
        floor_url = fresh_database(server_url, "rq_bench_floor")
        results["floor"] = floor(floor_url, workers, port, clients, items)
        results["floor_one_client"] = floor(floor_url, workers, port, 1, one_client_items)
        results["floor_raw_ratio"] = round(results["floor"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        results["api_raw_ratio"] = round(results["api"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        if "batched" in results:
            results["batched_raw_ratio"] = round(
                results["batched"]["items_per_s"] / results["raw"]["items_per_s"], 2
            )
        drop_databases(
            server_url, "rq_bench_raw", "rq_bench_api", "rq_bench_batched", "rq_bench_one", "rq_bench_floor"
        )
        typer.echo(report_throughput(results))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_wakeup:
        results["wakeup"] = work_arrives(
            server_url, port, settings.poll_interval_ms, wakeup_samples, notify_seconds
        )
        typer.echo(report_wakeup(results["wakeup"]))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_reports:
        results["reports"] = reports_over_a_year(
            server_url, port, report_items, report_runs, write_costs=report_write_costs
        )
        drop_databases(server_url, "rq_bench_reports", "rq_bench_write_with", "rq_bench_write_without")
        typer.echo("\n".join(report_bench.report_lines(results["reports"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_stats:
        results["stats"] = stats_over_history(
            server_url, port, stats_items, stats_open, stats_runs, reuse=stats_reuse
        )
        if not stats_keep:
            drop_databases(server_url, "rq_bench_stats_empty", "rq_bench_stats_history")
        typer.echo("\n".join(stats_bench.report_lines(results["stats"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_upkeep:
        history = database_url(server_url, "rq_bench_stats_history")
        year = {"load": stats_bench.history_size(history), **capacity_bench.upkeep(history)}
        results["upkeep"] = year
        typer.echo("\n".join(["10. capacity, the kept part 9 history:", *capacity_bench.year_lines(year)]))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_capacity:
        results["capacity"] = capacity(server_url, capacity_items, capacity_wal_items)
        typer.echo("\n".join(capacity_bench.report_lines(results["capacity"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_pool or only_feed:
        if only_pool:
            results["pool"] = pool_bench.pool_under_clients(server_url, port, pool_clients, pool_items)
        if only_feed and feed_pollers:
            results["feed"] = pool_bench.feed_pollers(
                server_url, port, feed_pollers, feed_clients, pool_items
            )
        drop_databases(server_url, "rq_bench_pool", "rq_bench_feed")
        typer.echo("\n".join(pool_bench.report_lines(results)))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_feed_read:
        url = fresh_database(server_url, "rq_bench_feed_read")
        results["feed_read"] = feed_read_bench.feed_read(
            url, port, feed_read_events, head_rates=feed_head_rates or [200.0, 2000.0],
            head_seconds=feed_head_seconds,
        )  # fmt: skip
        results["feed_read"]["loadavg"] = results["loadavg"]
        results["feed_read"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        drop_databases(server_url, "rq_bench_feed_read")
        typer.echo("\n".join(feed_read_bench.report_lines(results["feed_read"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_webhooks:
        results["webhooks"] = {}
        for subscriptions in webhook_subscriptions or [1]:
            url = fresh_database(server_url, "rq_bench_webhooks")
            name = "defaults" if (subscriptions, webhook_fail) == (1, 0.2) else (
                f"{subscriptions}_subscription{'s' if subscriptions > 1 else ''}"
                + (f"_fail_{webhook_fail:g}" if webhook_fail else "_healthy")
            )  # fmt: skip
            results["webhooks"][name] = webhook_bench.webhook_drain(
                url, events=webhook_events, items=max(1, webhook_events // 10), fail=webhook_fail,
                timeout_s=600, subscriptions=subscriptions,
            )  # fmt: skip
            drop_databases(server_url, "rq_bench_webhooks")
        results["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        typer.echo("\n".join(webhook_bench.report_lines(results["webhooks"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if only_dequeue:
        results["dequeue"] = dequeue_scaling(server_url, workers, port, lease_samples)
        drop_databases(server_url, "rq_bench_dequeue")
        typer.echo("\n".join(report_dequeue(results["dequeue"])))
        if json_path:
            json_path.write_text(json.dumps(results, indent=2))
        return
    if not api_only:
        typer.echo("1/4 raw SQL ceiling ...", err=True)
        results["raw"] = raw_ceiling(fresh_database(server_url, "rq_bench_raw"), clients, items, batch)
    typer.echo("2/4 HTTP API ...", err=True)
    api_url = fresh_database(server_url, "rq_bench_api")
    run_sql(api_url, SEED_PENDING, {"prefix": "api-", "entity": "ACME-CORP", "count": items}, vacuum=True)
    tokens = reviewer_tokens(api_url, clients)
    server = start_server(api_url, workers, port, sealer=sealer)
    try:
        results["api"] = api_throughput(server, tokens, items, batch, api_url)
    finally:
        stop_server(server)
    results["storage"] = storage(api_url)
    if not api_only:
        common = {"workers": workers, "port": port, "sealer": sealer}
        typer.echo("2b HTTP API, batched ...", err=True)
        results["batched"], _ = api_run(
            server_url, "rq_bench_batched", clients=clients, items=items, batch=complete_batch,
            batch_complete=True, **common,
        )  # fmt: skip
        typer.echo("2c HTTP API, one client ...", err=True)
        results["one_client"], _ = api_run(
            server_url, "rq_bench_one", clients=1, items=one_client_items, batch=batch, **common
        )
        results["batched_raw_ratio"] = round(
            results["batched"]["items_per_s"] / results["raw"]["items_per_s"], 2
        )
        results["api_raw_ratio"] = round(results["api"]["items_per_s"] / results["raw"]["items_per_s"], 2)
        typer.echo("3/4 dequeue scaling (seeds 1,000,000 rows) ...", err=True)
        results["dequeue"] = dequeue_scaling(server_url, workers, port, lease_samples)
        typer.echo("4/4 wake-up latency and NOTIFY cost ...", err=True)
        results["wakeup"] = work_arrives(
            server_url, port, settings.poll_interval_ms, wakeup_samples, notify_seconds
        )
        if audit_events:
            typer.echo(f"5/5 audit chain (seals and verifies {audit_events:,} events) ...", err=True)
            results["audit"] = audit_chain(server_url, audit_events)
        if report_items:
            typer.echo(f"reports over a year ({report_items:,} items) ...", err=True)
            results["reports"] = reports_over_a_year(
                server_url, port, report_items, report_runs, write_costs=report_write_costs
            )
        if stats_items:
            typer.echo(f"/stats and /metrics over history ({stats_items:,} items) ...", err=True)
            results["stats"] = stats_over_history(
                server_url, port, stats_items, stats_open, stats_runs, reuse=stats_reuse
            )
        if capacity_items:
            typer.echo(f"capacity: WAL per item, a year of history ({capacity_items:,} items) ...", err=True)
            results["capacity"] = capacity(server_url, capacity_items, capacity_wal_items)
        typer.echo(f"one API process: {pool_clients} clients, old pool vs defaults ...", err=True)
        results["pool"] = pool_bench.pool_under_clients(server_url, port, pool_clients, pool_items)
        if feed_pollers:
            typer.echo(f"one API process beside {feed_pollers} feed long-pollers ...", err=True)
            results["feed"] = pool_bench.feed_pollers(
                server_url, port, feed_pollers, feed_clients, pool_items
            )
    typer.echo("done", err=True)
    drop_databases(
        server_url,
        *("rq_bench_raw", "rq_bench_api", "rq_bench_batched", "rq_bench_one", "rq_bench_floor"),
        *("rq_bench_dequeue", "rq_bench_audit", "rq_bench_reports", "rq_bench_write_with"),
        *("rq_bench_write_without", "rq_bench_pool", "rq_bench_feed"),
        *(() if stats_keep else ("rq_bench_stats_empty", "rq_bench_stats_history")),
    )
    typer.echo(report(results))
    if "wakeup" in results:
        typer.echo(report_wakeup(results["wakeup"]))
    if "reports" in results:
        typer.echo("\n".join(report_bench.report_lines(results["reports"])))
    if "stats" in results:
        typer.echo("\n".join(stats_bench.report_lines(results["stats"])))
    if "capacity" in results:
        typer.echo("\n".join(capacity_bench.report_lines(results["capacity"])))
    if "pool" in results:
        typer.echo("\n".join(pool_bench.report_lines(results)))
    if json_path:
        json_path.write_text(json.dumps(results, indent=2))
        typer.echo(f"wrote {json_path}", err=True)
