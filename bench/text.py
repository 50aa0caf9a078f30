"""make bench's report: the rows printed from the results."""

import os
from typing import Any


def report_wakeup(w: dict[str, Any]) -> str:
    lat, n = w["latency"], w["notify"]
    on, off = n["with_notify"], n["without_notify"]
    return "\n".join(
        [
            "6. work arrives by itself (enqueue -> lease answer, one reviewer waiting):",
            f"     long poll (wait_s, LISTEN/NOTIFY)   p50 {lat['long_poll']['p50_ms']} ms, "
            f"p99 {lat['long_poll']['p99_ms']} ms, max {lat['long_poll']['max_ms']} ms",
            f"     polling every {w['poll_interval_ms']} ms +-20 %        p50 {lat['polling']['p50_ms']} ms, "
            f"p99 {lat['polling']['p99_ms']} ms, max {lat['polling']['max_ms']} ms",
            "   NOTIFY cost (4 producers enqueueing, 4 consumers leasing and completing,"
            " one item per transaction):",
            f"     enqueued/s   with NOTIFY {on['enqueued_per_s']}, without {off['enqueued_per_s']}"
            f"   (x{n['enqueue_ratio']})",
            f"     completed/s  with NOTIFY {on['completed_per_s']}, without {off['completed_per_s']}"
            f"   (x{n['complete_ratio']})",
        ]
    )


def _extra_rows(results: dict[str, Any]) -> list[str]:
    """The batched row (2b) and the one-client row (2c), when they ran."""
    lines = []
    raw = results.get("raw")
    if "batched" in results:
        b = results["batched"]
        ratio = f"x{results['batched_raw_ratio']} of raw" if raw else ""
        lines += [
            f"{'2b. HTTP API, POST /items/complete':38}{b['items_per_s']:>10}"
            f"   {ratio}   (target >= x1.5; {results['complete_batch']} items per lease and per completion)",
            f"{'     POST /items/complete':38}{'':>10}{b['complete_p50_ms']:>10}{b['complete_p99_ms']:>10}"
            f"   CPU per item (ms): API {b['cpu_ms_per_item']['api']},"
            f" PostgreSQL {b['cpu_ms_per_item']['postgres']}",
        ]
    if "one_client" in results:
        one = results["one_client"]
        lines += [
            f"{'2c. HTTP API, 1 client':38}{one['items_per_s']:>10}",
            f"{'     POST /items/{id}/complete':38}{'':>10}{one['complete_p50_ms']:>10}"
            f"{one['complete_p99_ms']:>10}   (target p50 <= 1.5 ms; API CPU per item"
            f" {one['cpu_ms_per_item']['api']} ms)",
        ]
    return lines


def report_throughput(results: dict[str, Any]) -> str:
    """--throughput-only: the raw, per-item, batched and one-client rows of one run, as ratios."""
    raw, api = results["raw"], results["api"]
    lines = [
        f"review-queue bench (throughput)  {results['clients']} clients, {results['items']} items, "
        f"batch {results['batch']}, {results['workers']} API worker(s), {results['machine']}, "
        f"load average at start {results['loadavg']}",
        "",
        f"{'':38}{'items/s':>10}{'p50 ms':>10}{'p99 ms':>10}",
        f"{'1. raw SQL (seed loop, psycopg)':38}{raw['items_per_s']:>10}"
        f"   ({raw['cpu_ms_per_item']} ms CPU per item, {raw['postgres_cpu_ms_per_item']} of it PostgreSQL)",
        f"{'2. HTTP API, per item':38}{api['items_per_s']:>10}   x{results['api_raw_ratio']} of raw"
        "   (target >= x0.35)",
        f"{'     POST /leases':38}{'':>10}{api['lease_p50_ms']:>10}{api['lease_p99_ms']:>10}",
        f"{'     POST /items/{id}/complete':38}{'':>10}"
        f"{api['complete_p50_ms']:>10}{api['complete_p99_ms']:>10}",
        f"     CPU per item (ms): API {api['cpu_ms_per_item']['api']}, load generator "
        f"{api['cpu_ms_per_item']['load_generator']}, PostgreSQL {api['cpu_ms_per_item']['postgres']}; "
        f"machine busy {api['machine_busy_cores']} cores",
        *_extra_rows(results),
    ]
    if "floor" in results:
        fl, fl1 = results["floor"], results["floor_one_client"]
        lines += [
            f"{'F. floor: bare FastAPI + 1 round trip':38}{fl['items_per_s']:>10}{fl['p50_ms']:>10}"
            f"   x{results['floor_raw_ratio']} of raw: the most any per-item HTTP row can reach here",
            f"{'   the same, 1 client':38}{fl1['items_per_s']:>10}{fl1['p50_ms']:>10}",
        ]
    return "\n".join(lines)


def report_dequeue(dq: dict[str, Any]) -> list[str]:
    lines = ["4. POST /leases (batch 20) as the table grows:"]
    for name, label in [
        ("a_empty_history", "(a) empty history"),
        ("b_1m_resolved", "(b) 1,000,000 RESOLVED rows"),
        ("c_10k_assigned_at_head", "(c) 10,000 ASSIGNED at the head"),
        ("d_both", "(d) both"),
        ("e_one_entity_of_20", "(e) (b), ledger_entity 1 of 20"),
    ]:
        ratio = dq[name].get("p50_ratio_to_a", 1.0)
        lines.append(
            f"     {label:<33}{'':>10}{dq[name]['p50_ms']:>10}{dq[name]['p99_ms']:>10}   x{ratio} of (a)"
        )
    lines.append(
        f"     lease statement alone in (d): {dq['raw_statement_p50_ms_d']} ms with the split indexes, "
        f"{dq['raw_statement_p50_ms_d_seed_index']} ms with the seed's index shape"
    )
    return lines


def report(results: dict[str, Any]) -> str:
    if "raw" not in results:
        api = results["api"]
        return (
            f"review-queue bench (API only)  {results['clients']} clients, {results['items']} items, "
            f"sealer {'on' if results['sealer'] else 'off'}\n"
            f"HTTP API {api['items_per_s']} items/s; POST /items/{{id}}/complete p50 "
            f"{api['complete_p50_ms']} ms, p99 {api['complete_p99_ms']} ms; by quarter "
            f"{api['items_per_s_by_quarter']}; machine busy {api['machine_busy_cores']} cores"
        )
    raw, api, dq, st = results["raw"], results["api"], results["dequeue"], results["storage"]
    lines = [
        f"review-queue bench  {results['clients']} clients, {results['items']} items, "
        f"batch {results['batch']}, {results['workers']} API worker(s), {results['machine']}",
        "",
        f"{'':38}{'items/s':>10}{'p50 ms':>10}{'p99 ms':>10}",
        f"{'1. raw SQL (seed loop, psycopg)':38}{raw['items_per_s']:>10}"
        f"   ({raw['cpu_ms_per_item']} ms CPU per item, {raw['postgres_cpu_ms_per_item']} of it PostgreSQL;"
        f" machine busy {raw['machine_busy_cores']} cores)",
        f"{'2. HTTP API':38}{api['items_per_s']:>10}",
        f"{'     POST /leases':38}{'':>10}{api['lease_p50_ms']:>10}{api['lease_p99_ms']:>10}",
        f"{'     POST /items/{id}/complete':38}{'':>10}"
        f"{api['complete_p50_ms']:>10}{api['complete_p99_ms']:>10}",
        f"     API items/s by quarter of the run: {api['items_per_s_by_quarter']}",
        *_extra_rows(results),
        f"3. API / raw ratio: {results['api_raw_ratio']}   (target >= 0.35)",
    ]
    lines += report_dequeue(dq)
    lines += [
        f"5. peak RSS per API process under load (MB): {api['peak_rss_mb_per_process']}   (target < 200)",
        f"   CPU per item (ms): API {api['cpu_ms_per_item']['api']}, load generator "
        f"{api['cpu_ms_per_item']['load_generator']}, PostgreSQL and the rest "
        f"{api['cpu_ms_per_item']['postgres_and_rest']} (PostgreSQL alone, measured on its processes: "
        f"{api['cpu_ms_per_item']['postgres']}); machine busy {api['machine_busy_cores']} of "
        f"{os.cpu_count()} cores",
        f"   load generator CPU: {api['loadgen_cpu_cores']} cores"
        + ("  -- SATURATED, the API number is a lower bound" if api["loadgen_cpu_cores"] > 0.9 else ""),
        f"6. on disk after {st['items']} items resolved through the API ({st['events']} events), "
        "pg_total_relation_size (compacted: after VACUUM FULL):",
        f"     per item  {st['item_bytes']:>6} B as run, {st['item_bytes_compacted']:>6} B compacted",
        f"     per event {st['event_bytes']:>6} B as run, {st['event_bytes_compacted']:>6} B compacted",
        f"   (API run with the sealer {'running every second' if results['sealer'] else 'off'})",
    ]
    if "audit" in results:
        au = results["audit"]
        lines.append(
            f"7. audit chain, {au['events']:,} events: sealed in {au['seal_s']} s"
            f" ({au['sealed_per_s']:,}/s), verified in {au['verify_s']} s ({au['verified_per_s']:,}/s,"
            f" {au['verify_python_cpu_s']} s Python CPU)"
        )
    return "\n".join(lines)
