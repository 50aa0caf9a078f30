"""The hot statements' plans: an index regression fails here instead of in production.

With resolved history and open leases in the table, the lease must read the PENDING index in lease
order (due_at, created_at), the lease of one ledger entity that entity's PENDING index, reclaim the
expiry index, the overdue and aging figures the index of open items, and nothing may scan the whole
table.
"""

import asyncio
import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from importlib import import_module
from typing import Any

import psycopg
import pytest
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection

from cli import reclaimer
from db import audit, feed, fx, queue, stats
from db.engine import _arguments, _compiled, create_engine
from db.queue.completion import _COMPLETE_ITEMS
from db.queue.lease import _LEASE, _LEASE_APPROVALS, _LEASE_ENTITY, _LEASE_ITEM, _RECLAIM, _RECLAIM_APPROVALS
from db.queue.reads import _DECISIONS
from db.unit import Transaction
from tests.support import seed_items
from tests.support.postgres import admin_sql, fresh_database, libpq, make_settings, with_database

# A plan follows the tables' statistics, which a reset leaves behind (a TRUNCATE keeps pg_statistic,
# and autovacuum analyzes a shared table when it likes): each test plans on a fresh copy. One worker
# runs the module's tests one after another: a fill's times are relative to when it was made
# (deadlines around now, leases expiring within 100 s), so its copies are used within minutes.
pytestmark = [
    pytest.mark.fresh_db("plans depend on the statistics earlier tests left in a shared database"),
    pytest.mark.xdist_group("query_plans"),
]


async def _generic_plans_explained(conn: AsyncConnection, plans: list[str]) -> None:
    """From now on every statement on `conn` runs its generic plan (as a prepared statement's
    would be), and auto_explain appends each plan to `plans`."""
    raw = (await conn.get_raw_connection()).driver_connection
    raw.add_notice_handler(lambda notice: plans.append(notice.message_primary or ""))
    for setting in (
        "LOAD 'auto_explain'",
        "SET auto_explain.log_min_duration = 0",
        "SET auto_explain.log_level = notice",
        "SET plan_cache_mode = force_generic_plan",
    ):
        await conn.exec_driver_sql(setting)
    await conn.commit()


def _fill_busy_table(sql: psycopg.Connection) -> None:
    """55,000 items: 50,000 resolved, 3,000 leased (leases expiring within 100 s), 2,000 PENDING."""
    # Deadlines spread around now: some open items overdue, most not. Set by the INSERT itself: an
    # UPDATE of every row after it cost as much as the INSERT (7.4 s and 7.7 s of an 18 s setup).
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, leased_by, leased_at, lease_expires_at, resolution, resolved_by,
               resolved_at, created_at, due_at)
           SELECT key, 'E' || (i % 50), 1, 'PARTIAL', 'h',
                  CASE WHEN i <= 50000 THEN 'RESOLVED' WHEN i <= 53000 THEN 'ASSIGNED' ELSE 'PENDING' END,
                  CASE WHEN i <= 53000 THEN 'r' || (i % 40) END,
                  CASE WHEN i <= 53000 THEN now() END,
                  CASE WHEN i <= 53000 THEN now() + (i % 100) * interval '1 second' END,
                  CASE WHEN i <= 50000 THEN 'OK' END,
                  CASE WHEN i <= 50000 THEN 'r' || (i % 40) END,
                  CASE WHEN i <= 50000 THEN now() END,
                  created, created + (hashtext(key) % 48) * interval '1 hour'
           FROM generate_series(1, 55000) i,
                LATERAL (SELECT 'k' || i AS key, now() - interval '1 day' + i * interval '1 millisecond'
                         AS created) AS generated"""
    )
    sql.execute("VACUUM ANALYZE review_queue_item")


def plan(sql: psycopg.Connection, statement: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The plan, with the event trail's partitions that hold rows, and their indexes, named as the
    parent's (a scan of them is a scan of the trail), as is the legacy partition, where the tests'
    events go (it holds the months up to the migration's). A scan of an empty month is no scan
    ("Empty partition"): the planner may read an empty month any way it likes."""
    compiled = statement.compile(dialect=postgresql.psycopg.dialect())
    row = sql.execute(f"EXPLAIN (FORMAT JSON) {compiled}", compiled.construct_params(params)).fetchone()
    tree: dict[str, Any] = row[0][0]["Plan"] if isinstance(row[0], list) else json.loads(row[0])[0]["Plan"]
    parents = _parents_of_partitions(sql)
    for node in nodes(tree):
        for key in ("Index Name", "Relation Name"):
            if key in node and node[key] in parents:
                parent = parents[node[key]]
                if parent is None:
                    node["Node Type"] = "Empty partition"
                else:
                    node[key] = parent
    return tree


def _parents_of_partitions(sql: psycopg.Connection) -> dict[str, str | None]:
    """{partition or its index: the parent table or index, None when it is an empty month}."""
    pairs = sql.execute(
        "SELECT c.relname, p.relname, coalesce(t.relname, c.relname) FROM pg_inherits i"
        " JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_class p ON p.oid = i.inhparent"
        " LEFT JOIN pg_index x ON x.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = x.indrelid"
        " WHERE p.relname LIKE 'review_queue_event%' OR p.relname LIKE 'ix_review_queue_event%'"
        " OR p.relname LIKE 'pk_review_queue_event%'"
    ).fetchall()
    filled = {
        table
        for table in {t for _, _, t in pairs}
        if sql.execute(f'SELECT EXISTS (SELECT FROM "{table}")').fetchone() == (True,)
    }
    return {
        child: parent if table in filled or table == "review_queue_event_legacy" else None
        for child, parent, table in pairs
    }


def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
    return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]


def scans(node: dict[str, Any]) -> set[tuple[str, str]]:
    return {
        (n["Node Type"], n.get("Index Name", n.get("Relation Name", "")))
        for n in nodes(node)
        if "Scan" in n["Node Type"]
    }


def assert_no_table_scan(found: set[tuple[str, str]]) -> None:
    assert ("Seq Scan", "review_queue_item") not in found, f"full scan of the queue table: {found}"


# The partial indexes of PENDING rows: whichever the planner takes, it reads no other rows.
PENDING_INDEXES = {"ix_review_queue_item_pending_due", "ix_review_queue_item_pending_entity_due"}
LEASE_PARAMS = {"actor": "r1", "batch_size": 20, "cap": 200, "lease_duration": timedelta(seconds=30)}


def lease_order_scan(node: dict[str, Any], index: str) -> None:
    """The candidates come straight off `index` in lease order: an index scan under the LIMIT,
    no sort of all pending rows."""
    found = [n for n in nodes(node) if n.get("Index Name") == index]
    assert found and found[0]["Node Type"] == "Index Scan", found
    assert not any(n["Node Type"] in ("Sort", "Incremental Sort") for n in nodes(node)), node


def test_lease_reads_the_pending_index_in_due_order(busy_table: psycopg.Connection) -> None:
    tree = plan(busy_table, _LEASE, LEASE_PARAMS)
    found = scans(tree)
    lease_order_scan(tree, "ix_review_queue_item_pending_due")
    assert any(name == "ix_review_queue_item_assigned_by_reviewer" for _, name in found), found  # the cap
    assert_no_table_scan(found)


def test_lease_of_one_entity_reads_its_own_index(busy_table: psycopg.Connection) -> None:
    tree = plan(busy_table, _LEASE_ENTITY, {**LEASE_PARAMS, "entity": "E7"})
    found = scans(tree)
    lease_order_scan(tree, "ix_review_queue_item_pending_entity_due")
    assert "ix_review_queue_item_pending_due" not in {name for _, name in found}, found
    assert_no_table_scan(found)


def test_reclaim_reads_the_expiry_index(busy_table: psycopg.Connection) -> None:
    found = scans(
        plan(
            busy_table,
            _RECLAIM,
            {"reclaim_batch": 100, "grace": timedelta(seconds=45), "actor": "x", "max_attempts": 10},
        )
    )
    assert any(name == "ix_review_queue_item_lease_expiry" for _, name in found), found
    assert_no_table_scan(found)


def with_rate_history(sql: psycopg.Connection) -> None:
    # Years of rates in six currencies: the completion reads the latest one of an item's currency
    # backwards along (currency, set_at, id), never the whole history.
    sql.execute(
        """INSERT INTO fx_rate (currency, rate, set_by, set_at)
           SELECT c, 1 + (i % 100) / 1000.0, 'feed', now() - i * interval '1 hour'
           FROM unnest(ARRAY['EUR', 'GBP', 'JPY', 'KWD', 'CHF', 'SEK']) c, generate_series(1, 5000) i"""
    )
    sql.execute("ANALYZE fx_rate")


def test_holder_statements_read_by_primary_key(busy_table: psycopg.Connection) -> None:
    item_id = busy_table.execute(
        "SELECT id FROM review_queue_item WHERE state = 'ASSIGNED' LIMIT 1"
    ).fetchone()[0]
    # The single route's completion: the completion statement with one entry.
    params = {
        "item_ids": [item_id],
        "resolutions": ["APPROVED"],
        "notes": [None],
        "fence_nonces": [None],
        "expected_source_hashes": [None],
        "actor": "r1",
        "base_currency": "USD",
    }
    with_rate_history(busy_table)
    found = scans(plan(busy_table, _COMPLETE_ITEMS, params))
    # The completion also reads its catalogue row, by primary key, and materiality (one row).
    # (A handful of codes: the planner may read the small tables whole.) Its entries are the
    # unnest of the arrays it is given (a Function Scan).
    allowed = {
        ("Function Scan", ""),
        ("Index Scan", "pk_review_queue_item"),
        ("Index Scan", "pk_resolution_code"),
        ("Seq Scan", "resolution_code"),
        ("Index Scan", "pk_approval_policy"),
        ("Seq Scan", "approval_policy"),
        ("Index Scan", "ix_fx_rate_currency_set_at"),
    }
    assert found - {("CTE Scan", "")} <= allowed, found
    assert ("Index Scan", "pk_review_queue_item") in found, found


def test_stats_gauges_never_scan_the_table(busy_table: psycopg.Connection) -> None:
    found = scans(plan(busy_table, stats._GAUGES, {"grace": timedelta(seconds=45)}))
    assert_no_table_scan(found)
    assert {name for _, name in found if name} <= PENDING_INDEXES | {
        "ix_review_queue_item_lease_expiry",
        "ix_review_queue_item_assigned_by_reviewer",
        "ix_review_queue_item_quarantined",
        "ix_review_queue_item_awaiting_approval",
        "ix_review_queue_item_approval_lease_expiry",
        "ix_review_queue_item_open_due",
    }, found
    assert any(name == "ix_review_queue_item_open_due" for _, name in found), found  # the overdue gauges


def test_the_items_without_a_rate_gauge_reads_the_open_items_only(busy_table: psycopg.Connection) -> None:
    with_rate_history(busy_table)
    found = scans(plan(busy_table, fx._WITHOUT_RATE, {"base_currency": "USD"}))
    assert_no_table_scan(found)
    assert ("Seq Scan", "fx_rate") not in found, found


def test_the_approval_queue_and_its_reclaim_use_their_partial_indexes(busy_table: psycopg.Connection) -> None:
    busy_table.execute(
        "UPDATE review_queue_item SET state = 'AWAITING_APPROVAL', prepared_by = 'p',"
        " proposed_resolution = 'OK',"
        " leased_by = NULL, lease_expires_at = NULL WHERE state = 'PENDING' AND created_at IN"
        " (SELECT created_at FROM review_queue_item WHERE state = 'PENDING' ORDER BY created_at LIMIT 50)"
    )
    busy_table.execute("ANALYZE review_queue_item")
    lease = scans(
        plan(
            busy_table,
            _LEASE_APPROVALS,
            {"actor": "r1", "batch_size": 10, "cap": 200, "lease_duration": timedelta(seconds=30)},
        )
    )
    assert_no_table_scan(lease)
    assert any(name == "ix_review_queue_item_awaiting_approval" for _, name in lease), lease
    reclaim = scans(
        plan(
            busy_table,
            _RECLAIM_APPROVALS,
            {"grace": timedelta(seconds=45), "reclaim_batch": 100, "actor": "reclaimer@x"},
        )
    )
    assert_no_table_scan(reclaim)
    assert any(name == "ix_review_queue_item_approval_lease_expiry" for _, name in reclaim), reclaim


@pytest.mark.parametrize(
    ("statement", "pending_indexes"),
    [
        # The PENDING rows by a range count per age band, on their enqueue-time index.
        ("_AGING", {"ix_review_queue_item_pending_created"}),
        ("_OVERDUE_BY_ENTITY", PENDING_INDEXES),
    ],
)
def test_aging_and_overdue_read_the_open_items_only(
    busy_table: psycopg.Connection, statement: str, pending_indexes: set[str]
) -> None:
    found = scans(plan(busy_table, getattr(stats, statement), {}))
    assert_no_table_scan(found)
    indexes = {name for _, name in found if name.startswith("ix_")}
    assert "ix_review_queue_item_open_due" in indexes, found
    assert indexes & pending_indexes, found
    assert indexes <= pending_indexes | {"ix_review_queue_item_open_due"}, found


def test_the_completion_statements_generic_plan_reads_by_primary_key(busy_table: psycopg.Connection) -> None:
    """Completion runs with a generic plan (prepared once, never planned again: db.engine.OneRoundTrip),
    so that plan, made without the parameters' values, must still read the queue by primary key."""
    sql, compiled, plan = _compiled(_COMPLETE_ITEMS)
    held = busy_table.execute("SELECT id, leased_by FROM review_queue_item WHERE state = 'ASSIGNED' LIMIT 3")
    ids, holders = zip(*held.fetchall(), strict=True)
    params = {
        "item_ids": list(ids),
        "resolutions": ["APPROVED"] * 3,
        "notes": [None] * 3,
        "fence_nonces": [None] * 3,
        "expected_source_hashes": [None] * 3,
        "actor": holders[0],
        "base_currency": "USD",
    }
    with_rate_history(busy_table)
    busy_table.execute("SET plan_cache_mode = force_generic_plan")
    busy_table.execute(f"PREPARE completion AS {sql}")
    explain = psycopg.ClientCursor(busy_table)
    placeholders = ", ".join(["%s"] * len(compiled.positiontup or ()))
    arguments = _arguments(compiled, plan, params)
    explain.execute(f"EXPLAIN (FORMAT JSON) EXECUTE completion({placeholders})", arguments)
    row = explain.fetchone()
    assert row is not None
    tree = row[0][0]["Plan"]
    found = scans(tree)
    assert_no_table_scan(found)
    indexes = {name for kind, name in found if "Index" in kind}
    assert "pk_review_queue_item" in indexes, found
    assert indexes <= {
        "pk_review_queue_item",
        "pk_resolution_code",
        "pk_approval_policy",
        "ix_fx_rate_currency_set_at",
    }, found
    assert ("Seq Scan", "fx_rate") not in found, found


def test_the_lease_with_the_release_cool_off_still_reads_the_pending_index_in_order(
    busy_table: psycopg.Connection,
) -> None:
    """The cool-off (issue 24) is a filter on the rows the ordered index scan reads: no sort, no
    other index, however many items this reviewer released."""
    busy_table.execute(
        "UPDATE review_queue_item SET released_by = 'r1', released_until = now() + interval '15 minutes'"
        " WHERE state = 'PENDING' AND created_at IN (SELECT created_at FROM review_queue_item"
        " WHERE state = 'PENDING' ORDER BY due_at LIMIT 30)"
    )
    busy_table.execute("ANALYZE review_queue_item")
    tree = plan(busy_table, _LEASE, LEASE_PARAMS)
    lease_order_scan(tree, "ix_review_queue_item_pending_due")
    assert_no_table_scan(scans(tree))
    approvals = scans(plan(busy_table, _LEASE_APPROVALS, LEASE_PARAMS))
    assert any(name == "ix_review_queue_item_awaiting_approval" for _, name in approvals), approvals


def test_the_lease_with_returned_proposals_reads_their_index_then_the_pending_index_in_order(
    busy_table: psycopg.Connection,
) -> None:
    """Issue 42: the preparer's returned proposals come off their own small index in lease order, the
    rest off the PENDING index in lease order, with the return a filter on it: no sort, no other
    index, for the preparer and for everyone else (one entity's lease alike)."""
    busy_table.execute(
        "UPDATE review_queue_item SET prepared_by = 'r' || (hashtext(idempotency_key) & 7),"
        " proposed_resolution = 'OK', returned_until = now() + interval '4 hours'"
        " WHERE state = 'PENDING' AND hashtext(idempotency_key) % 40 = 0"
    )
    busy_table.execute("ANALYZE review_queue_item")
    for actor in ("r1", "someone-else"):
        tree = plan(busy_table, _LEASE, {**LEASE_PARAMS, "actor": actor})
        lease_order_scan(tree, "ix_review_queue_item_pending_due")
        lease_order_scan(tree, "ix_review_queue_item_pending_returned")
        assert_no_table_scan(scans(tree))
        entity = plan(busy_table, _LEASE_ENTITY, {**LEASE_PARAMS, "actor": actor, "entity": "E7"})
        lease_order_scan(entity, "ix_review_queue_item_pending_entity_due")
        assert_no_table_scan(scans(entity))


def test_a_lease_that_names_its_item_reads_it_by_primary_key(busy_table: psycopg.Connection) -> None:
    item_id = busy_table.execute(
        "SELECT id FROM review_queue_item WHERE state = 'PENDING' LIMIT 1"
    ).fetchone()[0]
    params = {**LEASE_PARAMS, "lease_item_id": item_id, "override_return": False}
    found = scans(plan(busy_table, _LEASE_ITEM, params))
    assert ("Index Scan", "pk_review_queue_item") in found, found
    assert_no_table_scan(found)


def list_plan(sql: psycopg.Connection, after: Any = None, **where: Any) -> dict[str, Any]:
    # list_items reads the range of rates first; these tables have none set.
    where = {"rate_range": (Decimal(1), Decimal(1)), **where}
    statement = queue.list_query(where=queue.ItemFilter(**where), after=after, limit=51, order="due_at")
    return plan(sql, statement, {})


def no_full_sort(node: dict[str, Any]) -> None:
    """Rows come off an index in (due_at, ...) order: at most an incremental sort of equal due_at."""
    assert not any(n["Node Type"] == "Sort" for n in nodes(node)), node


@pytest.mark.parametrize(
    ("where", "index"),
    [
        ({}, "ix_review_queue_item_due_at_id"),
        ({"state": "PENDING"}, "ix_review_queue_item_pending_due"),
        ({"state": "ASSIGNED"}, "ix_review_queue_item_open_due"),
        ({"state": "RESOLVED"}, "ix_review_queue_item_due_at_id"),
        ({"ledger_entity": "E7"}, "ix_review_queue_item_entity_due_id"),
        ({"state": "PENDING", "ledger_entity": "E7"}, "ix_review_queue_item_pending_entity_due"),
    ],
)
def test_the_work_list_by_due_date_reads_an_index_in_that_order(
    busy_table: psycopg.Connection, where: dict[str, Any], index: str
) -> None:
    """GET /items?sort=due_at (the desk's list): each state's tab and one entity read an index in
    due order (no sort of the table); a later page starts at its keyset position on that index.
    With an amount range and 'overdue only' too, only the rows an index finds are read (when few
    are left the planner may sort those few)."""
    tree = list_plan(busy_table, **where)
    found = scans(tree)
    assert_no_table_scan(found)
    if "ledger_entity" not in where or "state" not in where:
        no_full_sort(tree)
    assert index in {name for _, name in found}, (where, found)
    position = busy_table.execute(
        "SELECT due_at, id FROM review_queue_item ORDER BY due_at LIMIT 1 OFFSET 100"
    )
    later = scans(list_plan(busy_table, tuple(position.fetchone()), **where))
    assert_no_table_scan(later)
    assert index in {name for _, name in later}, (where, later)
    filtered = list_plan(busy_table, min_amount=1, max_amount=5000, due_before=datetime.now(UTC), **where)
    assert_no_table_scan(scans(filtered))


@pytest.mark.parametrize(
    ("order", "where", "index"),
    [
        ("created_at", {}, "ix_review_queue_item_created_at_id"),
        ("created_at", {"state": "PENDING"}, "ix_review_queue_item_pending_created"),
        ("created_at", {"resolved_by": "rare-reviewer"}, "ix_review_queue_item_resolved_by_created"),
        ("due_at", {"resolved_by": "rare-reviewer"}, "ix_review_queue_item_resolved_by_due"),
    ],
)
def test_a_list_reads_an_index_led_by_its_filter_not_the_history(
    busy_table: psycopg.Connection, order: queue.ListOrder, where: dict[str, Any], index: str
) -> None:
    """GET /items in either order, filtered by the live queue's state (PENDING: the newest rows,
    behind all the resolved history in enqueue order) or by who resolved:
    the page comes off an index led by the filter, in the list's order (issue 29: a list costs
    O(page), not O(history)). The reviewer is rare (2,000 decisions spread through the
    history, as most are in a long one): read from a wider index in the list's order, their page
    would come after a long walk; read by the filter alone, after a sort of all their rows."""
    busy_table.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, state, leased_by, leased_at, resolution, resolved_by, resolved_at, created_at,
               due_at)
           SELECT 'rare-' || i, 'RARE', 1, 'PARTIAL', 'h', 'RESOLVED', 'rare-reviewer', now(), 'OK',
                  'rare-reviewer', now(), now() - interval '1 day' + i * interval '25 milliseconds',
                  now() + (i % 48) * interval '1 hour'
           FROM generate_series(1, 2000) i"""
    )
    busy_table.execute("ANALYZE review_queue_item")
    # list_items reads the range of rates first; these tables have none set.
    where = {"rate_range": (Decimal(1), Decimal(1)), **where}
    statement = queue.list_query(where=queue.ItemFilter(**where), after=None, limit=51, order=order)
    tree = plan(busy_table, statement, {})
    found = scans(tree)
    assert_no_table_scan(found)
    assert index in {name for _, name in found}, (where, found)
    assert not any(n["Node Type"] == "Sort" for n in nodes(tree)), tree


@pytest.mark.parametrize("order", ["created_at", "due_at"])
@pytest.mark.parametrize(
    ("where", "index"),
    [
        ({"match_decision": "MATCHED"}, "ix_review_queue_item_resolved_match"),
        ({"min_amount": 900_000}, "ix_review_queue_item_resolved_abs_amount"),
        ({"max_amount": Decimal("0.05")}, "ix_review_queue_item_resolved_abs_amount"),
        ({"match_decision": "MATCHED", "state": "RESOLVED"}, "ix_review_queue_item_resolved_match"),
    ],
)
def test_a_rare_match_or_amount_reads_the_history_by_its_index(
    busy_table: psycopg.Connection, order: queue.ListOrder, where: dict[str, Any], index: str
) -> None:
    """A match decision or an amount found on a few resolved rows spread through the history (issue
    29): the resolved part is read by its index, the open items by theirs, never the table nor the
    whole list order (which would walk the history to fill a page)."""
    busy_table.execute(
        "UPDATE review_queue_item SET match_decision = 'MATCHED',"
        " variance_amount = CASE WHEN abs(hashtext(idempotency_key || 'amount')) % 10 = 3"
        " THEN -987654.32 ELSE 0.01 END"
        " WHERE state = 'RESOLVED' AND hashtext(idempotency_key) % 500 = 0"
    )
    rare = busy_table.execute(
        "SELECT count(*) FILTER (WHERE variance_amount < -900000),"
        " count(*) FILTER (WHERE variance_amount = 0.01)"
        " FROM review_queue_item WHERE match_decision = 'MATCHED'"
    ).fetchone()
    assert rare is not None and rare[0] > 0 and rare[1] > 0, f"both amounts are there to find: {rare}"
    busy_table.execute("ANALYZE review_queue_item")
    # list_items reads the range of rates first; these tables have none set.
    where = {"rate_range": (Decimal(1), Decimal(1)), **where}
    statement = queue.list_query(where=queue.ItemFilter(**where), after=None, limit=51, order=order)
    found = scans(plan(busy_table, statement, {}))
    assert_no_table_scan(found)
    indexes = {name for _, name in found}
    assert index in indexes, (where, found)
    assert not indexes & {"ix_review_queue_item_created_at_id", "ix_review_queue_item_due_at_id"}, found


@pytest.mark.parametrize("where", [{"match_decision": "PARTIAL"}, {"max_amount": 5}])
def test_a_common_match_or_amount_never_walks_the_history_for_the_other_open_items(
    busy_table: psycopg.Connection, where: dict[str, Any]
) -> None:
    """A match decision or an amount that most rows have: the leased items (3,000 here, the newest
    but the pending ones) are fetched by their own partial index and sorted, not looked for by
    walking the (created_at, id) index through the whole resolved history, as the planner chose
    when it took them for spread through the table (5 s at 10M items in make bench)."""
    statement = queue.list_query(where=queue.ItemFilter(**where), after=None, limit=51, order="created_at")
    tree = plan(busy_table, statement, {})
    walks = [
        n
        for n in nodes(tree)
        if n.get("Index Name") in ("ix_review_queue_item_created_at_id", "ix_review_queue_item_due_at_id")
        and "PENDING,RESOLVED" in n.get("Filter", "")
    ]
    assert not walks, walks
    # Either partial index that holds exactly the other open items: by deadline, or, for an amount
    # bound (which proves its guard), by amount (2026_12_07_0610).
    other_open = {"ix_review_queue_item_open_due", "ix_review_queue_item_open_abs_amount"}
    assert other_open & {name for _, name in scans(tree)}, scans(tree)


def _fill_invoices(sql: psycopg.Connection) -> None:
    """busy_table with an invoice number in every item's context: INV- and the key's number."""
    sql.execute(
        "UPDATE review_queue_item"
        " SET context = jsonb_build_object('invoice', 'INV-' || substr(idempotency_key, 2))"
    )
    sql.execute("VACUUM ANALYZE review_queue_item")


@pytest.mark.parametrize("order", ["created_at", "due_at"])
def test_the_search_reads_its_indexes(invoices: psycopg.Connection, order: queue.ListOrder) -> None:
    """q (issue 42) is a prefix of the id, the key, the entity or a context value, in any case. A
    rare term (an invoice number: 11 of 55,000 items) is read off the prefix index
    ix_review_queue_item_search and only its rows sorted; a prefix of an id off the primary key; a
    term most items match walks the list order until a page is full. Never the whole table."""

    def search(term: str) -> dict[str, Any]:
        where = queue.ItemFilter(search=term, rate_range=(Decimal(1), Decimal(1)))
        return plan(invoices, queue.list_query(where=where, after=None, limit=51, order=order), {})

    rare = scans(search("inv-4711"))
    assert ("Bitmap Index Scan", "ix_review_queue_item_search") in rare, rare
    assert_no_table_scan(rare)
    item_id = invoices.execute("SELECT id FROM review_queue_item WHERE idempotency_key = 'k777'").fetchone()
    assert item_id is not None
    by_id = scans(search(str(item_id[0])[:8].upper()))
    assert "pk_review_queue_item" in {name for _, name in by_id}, by_id
    assert_no_table_scan(by_id)
    for common in ("k", "inv-4"):  # every key; a fifth of the invoices (INV-4, INV-4x, ... INV-4xxxx)
        found = scans(search(common))
        assert_no_table_scan(found)
        assert f"ix_review_queue_item_{order}_id" in {name for _, name in found}, (common, found)
    # Every entity, one entity in 50: also prefixes of ids (hex digits), whose range the planner
    # may OR with the prefix index's rows rather than walk the list order; either way, no scan.
    for term in ("e", "E7"):
        assert_no_table_scan(scans(search(term)))


@pytest.mark.anyio
async def test_a_search_is_planned_for_its_term_even_once_prepared(
    invoices: psycopg.Connection, superuser_url: str
) -> None:
    """A prepared statement may run PostgreSQL's generic plan, costed for no term in particular; a
    search is planned for its term on every call (list_items sets force_custom_plan for its
    transaction). Here every statement is prepared at once, the session asks for generic plans
    (what the plan cache may choose after five runs), and auto_explain reports each plan run: the
    search's condition names its term, not $1."""
    engine = create_engine(superuser_url, prepare_threshold=0)
    plans: list[str] = []
    try:
        async with engine.connect() as conn:
            await _generic_plans_explained(conn, plans)
            for _ in range(3):
                where = queue.ItemFilter(search="inv-4711")
                found = await queue.list_items(Transaction(conn), where=where, after=None, limit=51)
                await conn.commit()
                assert len(found) == 11, found  # INV-4711 and INV-47110 ... INV-47119
    finally:
        await engine.dispose()
    searches = [p for p in plans if "review_queue_item_search_prefixes" in p and "Limit" in p]
    assert len(searches) == 3, plans
    for ran in searches:
        tree = ran.split("Limit", 1)[1]  # the plan, after the query's text and parameters
        assert "inv-4711" in tree and "$1" not in tree, ran


def test_my_decisions_read_their_partial_index(busy_table: psycopg.Connection) -> None:
    """A trail like a real one (mostly leases and renewals) and one reviewer's decisions newest
    first: read backwards from the partial index of decisions, each item by primary key."""
    busy_table.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, CASE WHEN state = 'RESOLVED' THEN 'RESOLVED' ELSE 'LEASED' END, leased_by, 1, trace_id"
        " FROM review_queue_item WHERE leased_by IS NOT NULL"
    )
    busy_table.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'RENEWED', 'r' || (g % 40), 1, trace_id FROM review_queue_item, generate_series(1, 4) g"
    )
    # ... and submissions, whose answer (issue 42: a rejection) is the item's next decision event.
    busy_table.execute(
        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
        " SELECT id, 'SUBMITTED_FOR_APPROVAL', leased_by, 1, trace_id FROM review_queue_item"
        " WHERE state = 'ASSIGNED'"
    )
    busy_table.execute("ANALYZE review_queue_event")
    tree = plan(busy_table, _DECISIONS, {"actor": "r1", "before": 2**62, "limit": 51})
    found = scans(tree)
    assert ("Seq Scan", "review_queue_event") not in found, found
    assert any(name == "ix_review_queue_event_decisions_by_actor" for _, name in found), found
    # The answer of each row: the item's own events, on the index of (item_id, id).
    assert any(name == "ix_review_queue_event_item_id_id" for _, name in found), found
    assert_no_table_scan(found)
    no_full_sort(tree)


def _fill_busy_trail(sql: psycopg.Connection) -> None:
    """2,000 items with 20 events each, written by 40 transactions (so 40 xids), analysed."""
    seed_items(sql, 2000)
    for batch in range(40):
        sql.execute(
            "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
            " SELECT id, 'RENEWED', 'r', 1, trace_id FROM review_queue_item i, generate_series(1, 20)"
            " WHERE abs(hashtext(i.id::text) %% 40) = %s",
            (batch,),
        )
    sql.execute("VACUUM ANALYZE review_queue_event")
    sql.execute("VACUUM ANALYZE review_queue_item")


@pytest.mark.parametrize("types", [None, ["RESOLVED", "APPROVED"]])
def test_the_feed_walks_the_xid_index_and_reads_one_items_trail(
    busy_trail: psycopg.Connection, types: list[str] | None
) -> None:
    """A page of the change feed reads positions off (xid, id) from the cursor, and each position's
    item trail (the barrier, what it serves, whether it was served early) by (item_id, id): never a
    scan of the whole event table, whatever its size."""
    (xid, id_) = busy_trail.execute(
        "SELECT xid::text, id FROM review_queue_event ORDER BY xid, id OFFSET 20000 LIMIT 1"
    ).fetchone()  # type: ignore[misc]
    found = scans(plan(busy_trail, feed._PAGE, {"xid": xid, "id": id_, "scan": 100, "types": types}))
    assert ("Seq Scan", "review_queue_event") not in found, found
    assert ("Index Scan", "ix_review_queue_event_xid_id") in found or (
        "Index Only Scan",
        "ix_review_queue_event_xid_id",
    ) in found, found
    assert any(index == "ix_review_queue_event_item_id_id" for _, index in found), found


# --- /stats and /metrics as history grows (issue 29) -------------------------------------------


def test_the_resolved_count_reads_the_rollup_and_the_resolutions_since_its_edge(
    busy_table: psycopg.Connection,
) -> None:
    """The RESOLVED figure: the rollup's row, the resolutions from its edge on (an index range of
    ix_review_queue_item_resolved_at) and the reopenings since its snapshot (from the snapshot's xmin
    on ix_review_queue_event_reopened_xid): never the 50,000 resolved rows of history."""
    busy_table.execute(
        "UPDATE review_queue_resolved_rollup SET edge = now(), counted_in = pg_current_snapshot(),"
        " resolved = (SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED')"
    )
    found = scans(plan(busy_table, stats._RESOLVED, {}))
    assert_no_table_scan(found)
    assert ("Seq Scan", "review_queue_event") not in found, found
    assert {name for _, name in found} <= {
        "review_queue_resolved_rollup",
        "pk_review_queue_resolved_rollup",
        "ix_review_queue_item_resolved_at",
        "ix_review_queue_event_reopened_xid",
    }, found
    assert any(name == "ix_review_queue_event_reopened_xid" for _, name in found), found


def test_a_roll_up_reads_the_resolutions_of_its_step_only(busy_table: psycopg.Connection) -> None:
    busy_table.execute("UPDATE review_queue_resolved_rollup SET edge = now() - interval '2 days'")
    for statement, params in (
        (stats._NEXT_EDGE, {"margin": timedelta(minutes=5), "step": stats.ROLLUP_STEP}),
        (stats._FOLD, {"edge": datetime.now(UTC)}),
    ):
        found = scans(plan(busy_table, statement, params))
        assert_no_table_scan(found)
        assert ("Seq Scan", "review_queue_event") not in found, found
        assert any(name == "ix_review_queue_item_resolved_at" for _, name in found), found


def test_the_seal_lag_reads_the_events_after_the_chain_head_only(busy_trail: psycopg.Connection) -> None:
    """/metrics' seal lag counts the events after the chain's head, from the (xid, id) index: with
    the chain sealed up to the last few events, nothing else of the trail is read."""
    busy_trail.execute(
        "INSERT INTO review_queue_chain (seq, event_id, hash)"
        " SELECT row_number() OVER (ORDER BY xid, id), id, sha256(convert_to(id::text, 'UTF8'))"
        " FROM (SELECT xid, id FROM review_queue_event ORDER BY xid, id OFFSET 0 LIMIT 39990) AS sealed"
    )
    busy_trail.execute("VACUUM ANALYZE review_queue_chain")
    xid, id_ = busy_trail.execute(
        "SELECT e.xid::text, e.id FROM review_queue_chain c JOIN review_queue_event e ON e.id = c.event_id"
        " ORDER BY c.seq DESC LIMIT 1"
    ).fetchone()  # type: ignore[misc]
    found = scans(plan(busy_trail, audit._LAG, {"xid": xid, "id": id_}))
    assert ("Seq Scan", "review_queue_event") not in found, found
    assert {name for _, name in found} <= {"ix_review_queue_event_xid_id"}, found


# --- the reports (db/reports/) -----------------------------------------------------------------


def _fill_history(sql: psycopg.Connection) -> None:
    """60 days of work, 60,000 items (a few still open), their events, some releases, approvals and
    reopenings: the reports' plans must read a day's rows through their indexes, not the history."""
    sql.execute(
        """
        WITH item AS (
            INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
                source_hash, state, leased_by, leased_at, lease_expires_at, resolution, resolved_by,
                resolved_at, approved_by, approved_at, prepared_by, created_at, due_at)
            SELECT 'h' || i, 'E' || (i % 20), 1, 'PARTIAL', 'h',
                   CASE WHEN i > 59000 THEN 'PENDING' ELSE 'RESOLVED' END,
                   CASE WHEN i <= 59000 THEN 'r' || (i % 40) END,
                   CASE WHEN i <= 59000 THEN t + interval '1 hour' END,
                   CASE WHEN i <= 59000 THEN t + interval '1 hour 30 seconds' END,
                   CASE WHEN i <= 59000 THEN 'OK' END,
                   CASE WHEN i <= 59000 THEN 'r' || (i % 40) END,
                   CASE WHEN i <= 59000 THEN t + interval '90 minutes' END,
                   CASE WHEN i <= 59000 AND i % 30 = 0 THEN 'approver' END,
                   CASE WHEN i <= 59000 AND i % 30 = 0 THEN t + interval '90 minutes' END,
                   CASE WHEN i % 30 = 0 THEN 'r' || (i % 40) END,
                   t, t + interval '2 days'
            FROM generate_series(1, 60000) AS i,
                 LATERAL (SELECT now() - interval '60 days' + i * interval '86 seconds' AS t) AS time
            RETURNING id, trace_id, created_at, state, leased_by, leased_at, resolved_at
        ),
        trail AS (
            SELECT id, 'ENQUEUED' AS event, 'ingest' AS actor, created_at AS at, '{}'::jsonb AS details
            FROM item
            UNION ALL
            SELECT id, 'LEASED', leased_by, leased_at, '{}' FROM item WHERE leased_at IS NOT NULL
            UNION ALL
            SELECT id, 'RELEASED', leased_by, leased_at + interval '1 minute', '{"reason": "x"}'
            FROM item WHERE leased_at IS NOT NULL AND hashtext(id::text) % 20 = 0
            UNION ALL
            SELECT id, 'RESOLVED', leased_by, resolved_at, '{"resolution": "OK"}'
            FROM item WHERE state = 'RESOLVED'
            UNION ALL
            SELECT id, 'REOPENED', 'ada', resolved_at - interval '5 minutes',
                   jsonb_build_object('previous_resolved_at', resolved_at - interval '10 minutes',
                                      'previous_resolved_by', leased_by)
            FROM item WHERE state = 'RESOLVED' AND hashtext(id::text) % 200 = 0
        )
        INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)
        SELECT t.id, t.event, t.actor, t.at, 1, i.trace_id, t.details
        FROM trail t JOIN item i USING (id) ORDER BY t.at
        """
    )
    sql.execute("VACUUM ANALYZE review_queue_item")
    sql.execute("VACUUM ANALYZE review_queue_event")


def _report_params(sql: psycopg.Connection, *, days: int) -> dict[str, Any]:
    """The last `days` days in UTC, as db.reports binds them."""
    (edges,) = sql.execute(
        "SELECT array_agg(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
        " - (%s - n) * interval '1 day' ORDER BY n) FROM generate_series(0, %s) AS n",
        (days, days),
    ).fetchone()
    return {
        "edges": edges,
        "lo": edges[0],
        "start": None,
        "step": 1,
        "entity": None,
        "reviewer": None,
        "tz": "UTC",
    }


REPORT_SCANS = [
    # The SLA reads the reopened items due in the period, not every reopening (2026_12_04_1630).
    ("deadlines._SLA", {"ix_review_queue_item_resolved_due", "ix_review_queue_reopened_item_due_at"}),
    # The throughput reads the reopenings since its period began (2026_12_05_1300), not them all.
    (
        "workload._THROUGHPUT",
        {
            "ix_review_queue_item_resolved_at",
            "ix_review_queue_event_other_work",
            "ix_review_queue_event_lease_start",
            "ix_review_queue_event_reopened_at",
        },
    ),
    # The backlog follows the reopened items open now or decided in its period (2026_12_05_1500).
    (
        "aging._BACKLOG",
        {
            "ix_review_queue_item_resolved_at",
            "ix_review_queue_event_reopened",
            "ix_review_queue_item_reopened_open",
            "ix_review_queue_item_reopened_resolved",
        },
    ),
    # ... and split by currency (the reclaimer keeps every day so), the revisions that changed a
    # currency since its period began too (2026_12_07_0110), off their own partial index.
    (
        "aging._BACKLOG_BY_CURRENCY",
        {
            "ix_review_queue_event_reopened",
            "ix_review_queue_item_reopened_open",
            "ix_review_queue_item_reopened_resolved",
            "ix_review_queue_event_currency_revised",
        },
    ),
    # The reclaimer's keeping of a closed day reads what the report reads for that day.
    (
        "workload._KEEP",
        {
            "ix_review_queue_item_resolved_at",
            "ix_review_queue_event_other_work",
            "ix_review_queue_event_lease_start",
            "ix_review_queue_event_reopened_at",
        },
    ),
]


@pytest.mark.parametrize(("statement", "indexes"), REPORT_SCANS, ids=[s for s, _ in REPORT_SCANS])
def test_a_reports_day_reads_its_indexes_not_the_history(
    history: psycopg.Connection, statement: str, indexes: set[str]
) -> None:
    module, name = statement.split(".")
    tree = plan(
        history, getattr(import_module(f"db.reports.{module}"), name), _report_params(history, days=1)
    )
    found = scans(tree)
    assert_no_table_scan(found)
    # Read from the period's start on, not whole (which a partial index also allows).
    by_time = [n for n in nodes(tree) if n.get("Index Name") == "ix_review_queue_event_reopened_at"]
    assert all("Index Cond" in n for n in by_time), by_time
    assert ("Seq Scan", "review_queue_event") not in found, f"full scan of the event trail: {found}"
    # The reopenings are one partial index's entries or the other's (both hold exactly the REOPENED
    # events, the second, for /stats, keyed by transaction): either is read whole, never the trail.
    names = {
        "ix_review_queue_event_reopened" if n == "ix_review_queue_event_reopened_xid" else n for _, n in found
    }
    assert indexes <= names, found


def test_the_sla_reads_the_reopenings_of_its_own_reopened_items_item_by_item(
    history: psycopg.Connection,
) -> None:
    """The /metrics SLA gauge's reopened items are the few due in its week. Their REOPENED events
    are read item by item off ix_review_queue_event_reopened, never every reopening of the trail
    joined to them (at 1M items: 4,947 events read for 80 items, 8 of the statement's 16 ms)."""
    from db.reports import deadlines

    tree = plan(history, deadlines._SLA, _report_params(history, days=7))
    reads = [n for n in nodes(tree) if n.get("Index Name", "").startswith("ix_review_queue_event_reopened")]
    assert reads, tree
    for read in reads:
        assert read["Index Name"] == "ix_review_queue_event_reopened", read
        assert "item_id" in read.get("Index Cond", ""), read


def test_closed_days_of_the_throughput_report_are_read_from_their_rollup_alone(
    history: psycopg.Connection, db_url: str
) -> None:
    from db.reports import workload

    asyncio.run(reclaimer.roll_up_once(make_settings(db_url), db_url))
    params = _report_params(history, days=30)
    params["edges"] = params["edges"][:-2]  # the 28 days before yesterday: all closed
    params["start"] = params["edges"][0].date()
    compiled = workload._THROUGHPUT.compile(dialect=postgresql.psycopg.dialect())
    (row,) = history.execute(
        f"EXPLAIN (ANALYZE, FORMAT JSON) {compiled}", compiled.construct_params(params)
    ).fetchone()
    ran = {
        n.get("Index Name", n.get("Relation Name", "")): n["Actual Loops"]
        for n in nodes(row[0]["Plan"])
        if "Scan" in n["Node Type"] and n["Actual Loops"]
    }
    assert "pk_review_queue_throughput_bucket" in ran, ran
    # Not a row of the items or of the decisions' events: each of those scans never ran.
    assert not {"ix_review_queue_item_resolved_at", "ix_review_queue_event_other_work"} & set(ran), ran
    assert not any(name.startswith("review_queue_item") for name in ran), ran


def test_a_page_of_the_decisions_export_reads_the_decision_index(history: psycopg.Connection) -> None:
    from db.reports import decisions

    (lo, hi) = history.execute("SELECT now() - interval '2 days', now()").fetchone()
    params = {"lo": lo, "hi": hi, "after_at": lo, "after_id": 0, "limit": decisions.DECISIONS_PAGE}
    tree = plan(history, decisions._DECISIONS, params)
    found = scans(tree)
    assert_no_table_scan(found)
    assert ("Seq Scan", "review_queue_event") not in found, found
    (read,) = [n for n in nodes(tree) if n.get("Index Name") == "ix_review_queue_event_decision_at"]
    # In (at, id) order straight off the index, a page at a time: no sort of the period's decisions
    # (a sort of the page's own rows, above its LIMIT, is all there may be).
    assert read["Node Type"] in ("Index Scan", "Index Only Scan"), read["Node Type"]
    sorts = [n for n in nodes(tree) if n["Node Type"] in ("Sort", "Incremental Sort")]
    assert not any(read in nodes(sort) for sort in sorts if not _has_limit_between(sort, read)), tree


def _has_limit_between(top: dict[str, Any], bottom: dict[str, Any]) -> bool:
    """Whether a Limit node stands on the path from `top` down to `bottom`."""
    for child in top.get("Plans", []):
        if child is bottom:
            return False
        if bottom in nodes(child):
            return child["Node Type"] == "Limit" or _has_limit_between(child, bottom)
    return False


def _fill_month_end(sql: psycopg.Connection) -> None:
    """busy_table and a month-end queue: 60,000 more PENDING items of the common amount, and one
    open item in 500 (PENDING, ASSIGNED alike) and one resolved item in 500 of a rare large one."""
    sql.execute(
        """INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,
               source_hash, created_at, due_at)
           SELECT 'open-' || i, 'E' || (i % 50), 12.50, 'PARTIAL', 'h', now() - i * interval '1 second',
                  now() + (hashtext('open-' || i) % 48) * interval '1 hour' + i * interval '1 millisecond'
           FROM generate_series(1, 60000) i"""
    )
    sql.execute(
        "UPDATE review_queue_item SET variance_amount = -987654.32, currency = 'EUR'"
        " WHERE hashtext(idempotency_key) % 500 = 0"
    )
    rare = sql.execute(
        "SELECT count(*) FILTER (WHERE state = 'PENDING'), count(*) FILTER (WHERE state = 'ASSIGNED'),"
        " count(*) FILTER (WHERE state = 'RESOLVED')"
        " FROM review_queue_item WHERE variance_amount < -900000"
    ).fetchone()
    assert rare is not None and all(rare), f"rare amounts in every part: {rare}"
    sql.execute("VACUUM ANALYZE review_queue_item")


# What a list walks in its order, or reads whole for a state: never for a rare amount.
WALKS = {
    "ix_review_queue_item_created_at_id",
    "ix_review_queue_item_due_at_id",
    "ix_review_queue_item_pending_created",
    "ix_review_queue_item_pending_due",
    "ix_review_queue_item_open_due",
}
OPEN_AMOUNT_INDEXES = {"ix_review_queue_item_pending_abs_amount", "ix_review_queue_item_open_abs_amount"}


# Every statement that reads the open items without comparing an amount, with its parameters.
NO_AMOUNT = {
    "lease": (_LEASE, LEASE_PARAMS),
    "lease of one entity": (_LEASE_ENTITY, {**LEASE_PARAMS, "entity": "E7"}),
    "approval lease": (_LEASE_APPROVALS, LEASE_PARAMS),
    "reclaim": (
        _RECLAIM,
        {"reclaim_batch": 100, "grace": timedelta(seconds=45), "actor": "x", "max_attempts": 10},
    ),
    "approval reclaim": (
        _RECLAIM_APPROVALS,
        {"grace": timedelta(seconds=45), "reclaim_batch": 100, "actor": "x"},
    ),
    "gauges": (stats._GAUGES, {"grace": timedelta(seconds=45)}),
    "aging": (stats._AGING, {}),
    "overdue by entity": (stats._OVERDUE_BY_ENTITY, {}),
    "items without a rate": (fx._WITHOUT_RATE, {"base_currency": "USD"}),
}


def test_no_statement_but_an_amount_bound_can_read_the_open_amount_indexes(
    busy_table: psycopg.Connection,
) -> None:
    """Issue 44's first indexes (bare `state = 'PENDING'` and `state NOT IN ('PENDING', 'RESOLVED')`
    predicates, reverted) took the lease off ix_review_queue_item_pending_due: its LIMIT is an
    expression, costed as 10 % of the PENDING rows fetched in due order at random heap pages, and a
    whole read of a small index in heap order plus a sort came cheaper (every amount here is 1: one
    deduplicated key, correlation 1). The predicate of each open amount index also says
    `abs(variance_amount) IS NOT NULL`, which only a statement comparing the amount proves: no lease,
    reclaim or gauge may read either index, here where a bare twin does take the lease (the control,
    so that this table stays one that would catch the regression)."""
    busy_table.execute(
        "UPDATE review_queue_item SET state = 'AWAITING_APPROVAL', prepared_by = 'p',"
        " proposed_resolution = 'OK', leased_by = NULL, lease_expires_at = NULL WHERE state = 'PENDING'"
        " AND created_at IN (SELECT created_at FROM review_queue_item WHERE state = 'PENDING'"
        " ORDER BY created_at LIMIT 50)"
    )
    busy_table.execute("ANALYZE review_queue_item")
    busy_table.execute(
        "CREATE INDEX ix_bare_pending_abs_amount ON review_queue_item (abs(variance_amount))"
        " WHERE state = 'PENDING'"
    )
    busy_table.execute("ANALYZE review_queue_item")
    control = scans(plan(busy_table, _LEASE, LEASE_PARAMS))
    assert ("Index Scan", "ix_review_queue_item_pending_due") not in control, (
        "the control no longer moves the lease: this table no longer shows the hazard",
        control,
    )
    busy_table.execute("DROP INDEX ix_bare_pending_abs_amount")
    busy_table.execute("ANALYZE review_queue_item")
    assert {
        r[0]
        for r in busy_table.execute(
            "SELECT indexrelid::regclass::text FROM pg_index WHERE indexrelid = ANY(%s::regclass[])",
            (sorted(OPEN_AMOUNT_INDEXES),),
        )
    } == OPEN_AMOUNT_INDEXES
    for name, (statement, params) in NO_AMOUNT.items():
        found = scans(plan(busy_table, statement, params))
        assert not {index for _, index in found} & OPEN_AMOUNT_INDEXES, (name, found)
    lease_order_scan(plan(busy_table, _LEASE, LEASE_PARAMS), "ix_review_queue_item_pending_due")


@pytest.mark.parametrize(
    "where",
    [
        {"min_amount": 900_000, "currency": "EUR"},
        {"min_amount": 900_000, "max_amount": 1_000_000, "currency": "EUR"},
        # In base-currency equivalents: the amount itself bounded by the highest rate (1.0850).
        {"min_amount": 1_000_000, "rate_range": (Decimal("0.0067"), Decimal("1.0850"))},
    ],
)
def test_a_rare_amount_reads_the_open_items_by_their_index(
    month_end: psycopg.Connection, where: dict[str, Any]
) -> None:
    """GET /items?min_amount= with no state (issue 44): the PENDING and the other open items are read
    off their amount indexes as the resolved ones off theirs, and only the rows found are sorted;
    not every PENDING item walked in list order (70-210 ms at 200,000 open items), nor every leased
    one fetched to be filtered, nor a state's whole index read to check the state of the rows found
    (one index over every open state was ANDed with all of PENDING's: 20-28 ms)."""
    where = {"rate_range": (Decimal(1), Decimal(1)), **where}
    for order in ("created_at", "due_at"):
        statement = queue.list_query(where=queue.ItemFilter(**where), after=None, limit=51, order=order)
        found = scans(plan(month_end, statement, {}))
        assert_no_table_scan(found)
        indexes = {name for _, name in found}
        assert indexes >= OPEN_AMOUNT_INDEXES, (order, found)
        assert not indexes & WALKS, (order, found)


# Amounts at the edges of the bounds below, each in an open and a resolved state, converted at the
# latest rates (EUR 1.0850, set after 1.0849; JPY 0.0067; KWD 3.25; CHF has none).
BOUNDARY_AMOUNTS = [
    ("USD", "-1000.00"),
    ("USD", "999.99"),
    ("EUR", "921.66"),  # 1,000.0011 USD (999.98... at the earlier 1.0849)
    ("EUR", "-921.65"),  # 999.99025 USD
    ("JPY", "150000"),  # 1,005.00 USD
    ("KWD", "307.693"),  # 1,000.00225 USD
    ("KWD", "-307.692"),  # 999.999 USD
    ("CHF", "5000.00"),  # no rate: no equivalent, meets no bound without `currency`
]
RATES = {"EUR": Decimal("1.0850"), "JPY": Decimal("0.0067"), "KWD": Decimal("3.25"), "USD": Decimal(1)}


def _matches(currency: str, amount: Decimal, query: dict[str, Any]) -> bool:
    """The filter's meaning, in Python: amounts of `currency`, or else USD equivalents."""
    if "currency" in query:
        value: Decimal | None = abs(amount) if currency == query["currency"] else None
    else:
        value = abs(amount) * RATES[currency] if currency in RATES else None
    low, high = query.get("min_amount"), query.get("max_amount")
    return value is not None and (low is None or value >= low) and (high is None or value <= high)


@pytest.mark.anyio
async def test_amount_bounds_find_exactly_their_items_off_the_open_index(
    month_end: psycopg.Connection, superuser_url: str
) -> None:
    """The index changes how the rows are found, never which (issue 44): amounts at the edges of
    each bound, in several currencies, open and resolved, give every page exactly the items the
    bound's meaning keeps, in list order. Run as the API runs it, from a prepared statement in a
    session that asks for generic plans (what the plan cache may choose after five runs): list_items
    plans an amount range for its values, so auto_explain shows each page read off the index."""
    for n, (currency, amount) in enumerate(BOUNDARY_AMOUNTS):
        for state in ("PENDING", "ASSIGNED", "RESOLVED"):
            month_end.execute(
                "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, currency,"
                " match_decision, source_hash, state, leased_by, leased_at, lease_expires_at, resolution,"
                " resolved_by, resolved_at, created_at)"
                " VALUES (%s, 'E1', %s, %s, 'PARTIAL', 'h', %s, %s, now(), now() + interval '1 hour', %s, %s,"
                " %s, now() - %s * interval '1 minute')",
                (
                    f"edge-{n}-{state}",
                    Decimal(amount),
                    currency,
                    state,
                    None if state == "PENDING" else "r1",
                    "OK" if state == "RESOLVED" else None,
                    "r1" if state == "RESOLVED" else None,
                    datetime.now(UTC) if state == "RESOLVED" else None,
                    n * 7,
                ),
            )
    for currency, rate in (("EUR", "1.0849"), ("EUR", "1.0850"), ("JPY", "0.0067"), ("KWD", "3.25")):
        month_end.execute(
            "INSERT INTO fx_rate (currency, rate, set_by, set_at) VALUES (%s, %s, 'root', clock_timestamp())",
            (currency, Decimal(rate)),
        )
    month_end.execute("ANALYZE review_queue_item")
    everything = month_end.execute(
        "SELECT id, currency, variance_amount, created_at, due_at FROM review_queue_item"
    ).fetchall()
    queries: list[dict[str, Any]] = [
        {"min_amount": Decimal(1000)},
        {"min_amount": Decimal("999.99"), "max_amount": Decimal(1000)},
        {"min_amount": Decimal(1005), "max_amount": Decimal(1005)},
        {"min_amount": Decimal("1000.0011"), "max_amount": Decimal("1000.00225")},
        {"currency": "EUR", "min_amount": Decimal("921.66")},
        {"currency": "KWD", "min_amount": Decimal("307.692"), "max_amount": Decimal("307.693")},
        {"currency": "CHF", "min_amount": Decimal(5000), "max_amount": Decimal(5000)},
        {"currency": "USD", "min_amount": Decimal(1000)},
    ]
    engine = create_engine(superuser_url, prepare_threshold=0)
    plans: list[str] = []
    try:
        async with engine.connect() as conn:
            await _generic_plans_explained(conn, plans)
            for query in queries:
                kept = [r for r in everything if _matches(r[1], r[2], query)]
                for order in ("created_at", "due_at"):
                    column = 3 if order == "created_at" else 4
                    expected = [r[0] for r in sorted(kept, key=lambda r, c=column: (r[c], r[0]))]
                    assert len(expected) >= 2, (query, expected)
                    seen: list[Any] = []
                    after = None
                    while True:
                        where = queue.ItemFilter(**query)
                        page = await queue.list_items(
                            Transaction(conn), where=where, after=after, limit=51, order=order
                        )
                        await conn.commit()
                        seen += [i.id for i in page]
                        if len(page) < 51:
                            break
                        after = (getattr(page[-1], order), page[-1].id)
                    assert seen == expected, (query, order, len(seen), len(expected))
    finally:
        await engine.dispose()
    lists = [p for p in plans if "Limit" in p and "abs(variance_amount)" in p]
    assert len(lists) >= 2 * len(queries), plans
    unindexed = [p for p in lists if not all(name in p for name in OPEN_AMOUNT_INDEXES)]
    assert not unindexed, "\n\n".join(
        "\n".join(line for line in p.splitlines() if "Scan" in line or "Cond" in line or "duration" in line)
        for p in unindexed
    )


# --- the fills: each made once, copied for each test that asks for it by name --------------------

# A fixture's name -> (the fill it starts from, what it adds).
FILLS: dict[str, tuple[str | None, Callable[[psycopg.Connection], None]]] = {
    "busy_table": (None, _fill_busy_table),
    "month_end": ("busy_table", _fill_month_end),
    "invoices": ("busy_table", _fill_invoices),
    "busy_trail": (None, _fill_busy_trail),
    "history": (None, _fill_history),
}


class Fills:
    """Each fill made once, in a database of its own, and analysed; a test gets a copy (CREATE
    DATABASE ... TEMPLATE), statistics and visibility map included, to change as it likes. Filling
    for each test cost 16 minutes of the suite's time for 55 tests that plan in milliseconds."""

    def __init__(self, server_url: str, template_db: str) -> None:
        self.server_url, self.template_db = server_url, template_db
        self.made: dict[str, str] = {}

    def database(self, fill: str | None) -> str:
        """The database a test's copy is made from: the fill's, made now if it is the first ask."""
        if fill is None:
            return self.template_db
        if fill not in self.made:
            base, add = FILLS[fill]
            name = f"rq_fill_{fill}_{uuid.uuid4().hex[:8]}"
            admin_sql(self.server_url, f"CREATE DATABASE {name} TEMPLATE {self.database(base)}")
            with psycopg.connect(libpq(with_database(self.server_url, name)), autocommit=True) as conn:
                add(conn)
            # A template nobody connects to: a session on it (autovacuum's) would fail the copy.
            admin_sql(self.server_url, f"ALTER DATABASE {name} WITH ALLOW_CONNECTIONS false")
            self.made[fill] = name
        return self.made[fill]

    def drop(self) -> None:
        for name in self.made.values():
            admin_sql(self.server_url, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(scope="module")
def fills(server_url: str, template_db: str) -> Iterator[Fills]:
    made = Fills(server_url, template_db)
    yield made
    made.drop()


@pytest.fixture
def db_name(request: pytest.FixtureRequest, server_url: str, fills: Fills) -> Iterator[str]:
    """This module's tests' databases: a copy of the fill the test names as a fixture, or of the
    migrated template."""
    named = [fill for fill in FILLS if fill in request.fixturenames]
    assert len(named) <= 1, f"a test plans on one fill: {named}"
    with fresh_database(server_url, fills.database(named[0] if named else None)) as name:
        yield name


def _copy_of(fill: str) -> Any:
    """The fixture a test names to plan on a copy of `fill` (db_name makes the copy): its connection."""

    @pytest.fixture(name=fill)
    def copy(sql: psycopg.Connection) -> psycopg.Connection:
        return sql

    return copy


busy_table, month_end, invoices, busy_trail, history = map(_copy_of, FILLS)
