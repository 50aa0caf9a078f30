"""db/reports/ against the same figures computed in Python from the event trail alone
(tests/support/reports.py), on generated histories around time-zone edges, DST changes and
reopened decisions, and on hand-made ones for each rule docs/reports.md states."""

import asyncio
import random
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli import reclaimer
from db import queue, reports
from db.unit import Transaction
from tests.support import LONG
from tests.support import reports as ref
from tests.support.postgres import make_settings
from tests.support.reports import run


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


# ---------------------------------------------------------------------------------------------
# Every report, compared with the reference
# ---------------------------------------------------------------------------------------------


def check_sla(
    db_url: str,
    items: dict[Any, ref.Item],
    events: list[ref.Event],
    period: reports.Period,
    entity: str | None,
) -> None:
    cuts = ref.edges(period.start, period.end, period.tz, period.step_days)
    got = run(db_url, lambda c: reports.sla(c, period=period, ledger_entity=entity))
    expected, total = ref.sla(items, events, cuts, got.as_of, entity)
    assert [(b.fell_due, b.on_time, b.late, b.open_past_due, b.attainment) for b in got.buckets] == expected
    assert (got.total.fell_due, got.total.on_time, got.total.late, got.total.open_past_due,
            got.total.attainment) == total  # fmt: skip
    step = timedelta(days=period.step_days)
    assert [b.start for b in got.buckets] == [period.start + step * n for n in range(len(cuts) - 1)]


def roll_up_days(db_url: str, tz: str) -> None:
    """What the reclaimer's round does: the RESOLVED rollup's edge to now, then the closed days."""
    settings = make_settings(db_url, report_time_zone=tz)
    asyncio.run(reclaimer.roll_up_once(settings, db_url, margin=timedelta(0)))


def periods(start: date, end: date, tz: str) -> list[reports.Period]:
    """The days from start to end, and the Monday weeks that cover them."""
    monday = start - timedelta(days=start.weekday())
    weeks = (end - monday).days // 7 + 1
    return [reports.Period(start, end, tz), reports.Period(monday, monday + timedelta(weeks=weeks), tz, 7)]


def check_throughput(db_url: str, events: list[ref.Event], period: reports.Period) -> None:
    cuts = ref.edges(period.start, period.end, period.tz, period.step_days)
    flow = run(db_url, lambda c: reports.throughput(c, period=period))
    assert [_row(r, period.start, period.step_days) for r in flow.rows] == ref.throughput(events, cuts)


def check_backlog(
    db_url: str, items: dict[Any, ref.Item], events: list[ref.Event], period: reports.Period
) -> None:
    cuts = ref.edges(period.start, period.end, period.tz)
    stock = run(db_url, lambda c: reports.backlog(c, period=period))
    assert [(p.start, p.at, p.by_age) for p in stock.points] == [
        (period.start + timedelta(days=k - 1), moment, bands)
        for k, moment, bands in ref.backlog(items, events, cuts, stock.as_of)
    ]
    assert all(p.by_currency is None for p in stock.points)
    # Split by currency: each day's split is the trail's, and sums to the day's total.
    split = run(db_url, lambda c: reports.backlog(c, period=period, by_currency=True))
    assert [p.by_currency for p in split.points] == ref.backlog_by_currency(items, events, cuts, split.as_of)
    # (today's point is at each report's own moment)
    assert [(p.start, min(p.at, stock.as_of), p.by_age) for p in split.points] == [
        (p.start, p.at, p.by_age) for p in stock.points
    ]
    for p in split.points:
        assert p.by_currency is not None
        assert tuple(map(sum, zip(*p.by_currency.values(), strict=True))) in {p.by_age, ()}


def check_all(db_url: str, sql: psycopg.Connection, start: date, end: date, tz: str) -> None:
    items, events = ref.read_back(sql)
    for period in periods(start, end, tz):
        for entity in (None, "ACME"):
            check_sla(db_url, items, events, period, entity)
        check_throughput(db_url, events, period)
    check_backlog(db_url, items, events, reports.Period(start, end, tz))  # from the trail
    # Again with the closed days kept in this zone: the same figures, read from them.
    roll_up_days(db_url, tz)
    assert sql.execute(
        "SELECT time_zone, through >= %s FROM review_queue_throughput_rollup", (end,)
    ).fetchone() == (
        tz,
        True,
    )
    for period in periods(start, end, tz):
        check_throughput(db_url, events, period)
    check_backlog(db_url, items, events, reports.Period(start, end, tz))

    check_backlog(db_url, items, events, reports.Period(start, end, tz))

    cuts = ref.edges(start, end, tz)
    lo, hi = cuts[0], cuts[-1]
    assert run(db_url, lambda c: reports.decision_bounds(c, start=start, end=end, tz=tz)) == (lo, hi)
    pages: list[reports.Decision] = []
    cursor = None
    while True:  # small pages, so that the keyset paging is exercised too
        page = run(db_url, lambda c, a=cursor: reports.decisions_page(c, lo=lo, hi=hi, after=a, limit=3))
        pages += page
        if len(page) < 3:
            break
        cursor = (page[-1].resolved_at, page[-1].event_id)
    assert [_fields(d) for d in pages] == ref.decisions(items, events, lo, hi)


def _fields(decision: reports.Decision) -> dict[str, Any]:
    return {name: getattr(decision, name) for name in decision.__slots__}


def _row(r: reports.ThroughputRow, first: date, step: int) -> dict[str, Any]:
    return {
        "k": (r.start - first).days // step + 1,
        "reviewer": r.reviewer,
        "resolved": r.resolved,
        "submitted_for_approval": r.submitted_for_approval,
        "approved": r.approved,
        "rejected": r.rejected,
        "released": r.released,
        "decisions": r.decisions,
        "median": r.median_lease_to_decision_s,
        "p90": r.p90_lease_to_decision_s,
    }


# ---------------------------------------------------------------------------------------------
# Generated histories
# ---------------------------------------------------------------------------------------------

# (time zone, a day with a DST change or none) around which items are created.
EDGES = [
    ("Europe/Berlin", date(2026, 3, 29)),  # 02:00 -> 03:00: a 23-hour day
    ("Europe/Berlin", date(2026, 10, 25)),  # 03:00 -> 02:00: a 25-hour day
    ("America/New_York", date(2026, 11, 1)),
    ("Australia/Lord_Howe", date(2026, 10, 4)),  # a half-hour change
    ("Asia/Kolkata", date(2026, 6, 1)),  # +05:30, no DST
    ("UTC", date(2026, 2, 28)),
]
GAPS = [
    timedelta(0),
    timedelta(microseconds=1),
    timedelta(microseconds=-3),  # a transaction that started first and committed second
    timedelta(seconds=30),
    timedelta(minutes=25),
    timedelta(hours=3),
    timedelta(hours=23, minutes=30),
    timedelta(days=2),
    timedelta(days=8),
]


@st.composite
def scenario(draw: st.DrawFn) -> tuple[str, date, list[ref.History]]:
    tz, day = draw(st.sampled_from(EDGES))
    seed = draw(st.integers(0, 2**32))
    count = draw(st.integers(1, 25))
    rng = random.Random(seed)
    midnight = ref.local_midnight(day, tz)
    histories = []
    for n in range(count):
        # Most items are created and fall due near the edge, some exactly on a local midnight.
        created = midnight + rng.choice(
            [timedelta(0), timedelta(microseconds=-1), timedelta(minutes=rng.randint(-3000, 3000))]
        )
        due = rng.choice([created + timedelta(hours=rng.choice([0, 1, 20, 24, 30, 72])), midnight, created])
        history = ref.live(
            rng, n, created_at=created, due_at=due, entity=rng.choice(["ACME", "GLOBEX"]), gaps=GAPS
        )
        if rng.random() < 0.3:  # due at the very moment of one of its events (a decision, say)
            history.due_at = rng.choice(history.events)["at"]
        histories.append(history)
    return tz, day, histories


@settings(
    max_examples=200 if LONG else 25,
    deadline=None,
    derandomize=not LONG,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=scenario())
def test_every_report_equals_the_trail_on_generated_histories(
    db_url: str, sql: psycopg.Connection, case: tuple[str, date, list[ref.History]]
) -> None:
    tz, day, histories = case
    ref.arrange(sql, histories)
    check_all(db_url, sql, day - timedelta(days=3), day + timedelta(days=12), tz)


# ---------------------------------------------------------------------------------------------
# Each rule, by hand
# ---------------------------------------------------------------------------------------------


def life(n: int, created: str, due: str, *, amount: str = "12.50") -> ref.Life:
    item = ref.Life(random.Random(n), n, at(created), at(due), "ACME")
    item.amount = item.history.amount = Decimal(amount)
    return item


def when(item: ref.Life, moment: str) -> ref.Life:
    item.now = at(moment)
    return item


def resolved(n: int, created: str, due: str, leased: str, decided: str, who: str = "alice") -> ref.History:
    item = life(n, created, due)
    when(item, leased).lease(who)
    when(item, decided).resolve("MATCH_CONFIRMED")
    return item.finish()


def sla_of(db_url: str, start: date, end: date, tz: str, step: int = 1) -> reports.SlaReport:
    return run(db_url, lambda c: reports.sla(c, period=reports.Period(start, end, tz, step)))


def test_a_deadline_at_2330_utc_falls_due_on_the_next_day_in_berlin(
    db_url: str, sql: psycopg.Connection
) -> None:
    ref.arrange(
        sql, [resolved(1, "2026-01-15T08:00Z", "2026-01-15T23:30Z", "2026-01-15T09:00Z", "2026-01-15T23:30Z")]
    )
    utc = sla_of(db_url, date(2026, 1, 15), date(2026, 1, 17), "UTC")
    berlin = sla_of(db_url, date(2026, 1, 15), date(2026, 1, 17), "Europe/Berlin")
    assert [b.fell_due for b in utc.buckets] == [1, 0]
    assert [b.fell_due for b in berlin.buckets] == [0, 1]
    # Resolved at the very moment it fell due: on time.
    assert (utc.total.on_time, utc.total.attainment) == (1, Decimal("1.0000"))
    flow = run(
        db_url,
        lambda c: reports.throughput(
            c, period=reports.Period(date(2026, 1, 15), date(2026, 1, 17), "Europe/Berlin")
        ),
    )
    assert [(r.start, r.reviewer, r.resolved) for r in flow.rows] == [(date(2026, 1, 16), "alice", 1)]


def test_dst_days_are_23_and_25_hours_long_and_weeks_start_on_monday(
    db_url: str, sql: psycopg.Connection
) -> None:
    # Berlin, 2026-03-29: 02:00 becomes 03:00, so that day ends at 22:00 UTC; 2026-10-25 ends at 23:00 UTC.
    ref.arrange(
        sql,
        [
            resolved(
                1,
                "2026-03-29T10:00Z",
                "2026-03-29T21:59:59.999999Z",
                "2026-03-29T11:00Z",
                "2026-03-29T12:00Z",
            ),
            resolved(2, "2026-03-29T10:00Z", "2026-03-29T22:00Z", "2026-03-29T11:00Z", "2026-03-29T12:00Z"),
            resolved(
                3, "2026-10-25T10:00Z", "2026-10-25T22:59:59Z", "2026-10-25T11:00Z", "2026-10-26T12:00Z"
            ),
        ],
    )
    spring = sla_of(db_url, date(2026, 3, 29), date(2026, 3, 31), "Europe/Berlin")
    assert [b.fell_due for b in spring.buckets] == [1, 1]
    autumn = sla_of(db_url, date(2026, 10, 25), date(2026, 10, 26), "Europe/Berlin")
    assert [(b.fell_due, b.late) for b in autumn.buckets] == [(1, 1)]
    day = run(
        db_url,
        lambda c: reports.decision_bounds(
            c, start=date(2026, 3, 29), end=date(2026, 3, 30), tz="Europe/Berlin"
        ),
    )
    assert day == (at("2026-03-28T23:00Z"), at("2026-03-29T22:00Z"))
    weekly = sla_of(db_url, date(2026, 3, 23), date(2026, 4, 6), "Europe/Berlin", step=7)
    assert [(b.start, b.fell_due) for b in weekly.buckets] == [(date(2026, 3, 23), 1), (date(2026, 3, 30), 1)]


def test_a_local_midnight_that_happens_twice_starts_the_day_at_the_later_one(
    db_url: str, sql: psycopg.Connection
) -> None:
    # Havana, 2025-11-02: 01:00 CDT becomes 00:00 CST, so local midnight is both 04:00 and 05:00 UTC;
    # PostgreSQL (and so the reports) start the day at 05:00 UTC.
    start, end = date(2025, 11, 1), date(2025, 11, 3)
    assert ref.local_midnight(date(2025, 11, 2), "America/Havana") == at("2025-11-02T05:00Z")
    ref.arrange(
        sql, [resolved(1, "2025-11-01T12:00Z", "2025-11-02T04:30Z", "2025-11-01T13:00Z", "2025-11-01T14:00Z")]
    )
    havana = sla_of(db_url, start, end, "America/Havana")
    assert [b.fell_due for b in havana.buckets] == [1, 0]
    check_all(db_url, sql, start, end, "America/Havana")


def test_a_decision_reopened_after_resolution_counts_as_it_stood_at_the_deadline(
    db_url: str, sql: psycopg.Connection
) -> None:
    due = "2026-02-10T17:00Z"
    # On time, reopened after the deadline and still open: it was resolved when it fell due.
    a = life(1, "2026-02-09T08:00Z", due)
    when(a, "2026-02-10T09:00Z").lease("alice")
    when(a, "2026-02-10T10:00Z").resolve("MATCH_CONFIRMED")
    when(a, "2026-02-11T10:00Z").reopen()
    # On time, reopened before the deadline, resolved again after it: late.
    b = life(2, "2026-02-09T08:00Z", due)
    when(b, "2026-02-10T09:00Z").lease("bob")
    when(b, "2026-02-10T10:00Z").resolve("MATCH_CONFIRMED")
    when(b, "2026-02-10T12:00Z").reopen()
    when(b, "2026-02-10T18:00Z").lease("bob")
    when(b, "2026-02-10T18:30Z").resolve("TIMING_DIFFERENCE")
    # Late, then reopened by a source revision, and open: open past due.
    c = life(3, "2026-02-09T08:00Z", due)
    when(c, "2026-02-10T18:00Z").lease("carol")
    when(c, "2026-02-10T19:00Z").resolve("MATCH_CONFIRMED")
    when(c, "2026-02-12T09:00Z").revise()
    # On time, decertified by a revision after the deadline, resolved again: on time.
    d = life(4, "2026-02-09T08:00Z", due)
    when(d, "2026-02-10T09:00Z").lease("alice")
    when(d, "2026-02-10T09:30Z").resolve("MATCH_CONFIRMED")
    when(d, "2026-02-12T09:00Z").revise()
    when(d, "2026-02-12T10:00Z").lease("alice")
    when(d, "2026-02-12T11:00Z").resolve("MATCH_REJECTED")
    ref.arrange(sql, [x.finish() for x in (a, b, c, d)])
    report = sla_of(db_url, date(2026, 2, 10), date(2026, 2, 11), "UTC")
    assert (report.total.fell_due, report.total.on_time, report.total.late, report.total.open_past_due) == (
        4,
        2,
        1,
        1,
    )
    assert report.total.attainment == Decimal("0.5000")
    check_all(db_url, sql, date(2026, 2, 9), date(2026, 2, 13), "UTC")
    # The export: every decision once, with the figures it was made on and when it was reopened.
    lo, hi = at("2026-02-09T00:00Z"), at("2026-02-13T00:00Z")
    rows = run(db_url, lambda c: reports.decisions_page(c, lo=lo, hi=hi, after=None))
    assert len(rows) == 6  # every decision (1 + 2 + 1 + 2), reopened or standing
    decertified = [r for r in rows if r.item_id == d.history.id]
    assert [(r.variance_amount, r.reopened_at, r.on_time) for r in decertified] == [
        (Decimal("12.50"), at("2026-02-12T09:00Z"), True),
        (Decimal("13.50"), None, False),
    ]


@pytest.mark.parametrize(
    ("on_time", "fell_due", "attainment"), [(1, 32, "0.0313"), (2, 3, "0.6667"), (0, 0, None)]
)
def test_attainment_is_on_time_over_fell_due_to_four_places_half_up(
    db_url: str, sql: psycopg.Connection, on_time: int, fell_due: int, attainment: str | None
) -> None:
    due = "2026-05-05T12:00Z"
    histories = [
        resolved(
            n,
            "2026-05-04T08:00Z",
            due,
            "2026-05-04T09:00Z",
            "2026-05-05T11:00Z" if n < on_time else "2026-05-05T13:00Z",
        )
        for n in range(fell_due)
    ]
    ref.arrange(sql, histories)
    report = sla_of(db_url, date(2026, 5, 5), date(2026, 5, 6), "UTC")
    assert report.total.attainment == (None if attainment is None else Decimal(attainment))
    assert str(report.total.attainment) == str(attainment)


def test_lease_to_decision_is_from_the_lease_that_ended_and_percentiles_are_nearest_rank(
    db_url: str, sql: psycopg.Connection
) -> None:
    histories = []
    for n, minutes in enumerate([10, 20, 30, 40]):
        item = life(n, "2026-07-01T08:00Z", "2026-07-09T08:00Z")
        when(item, "2026-07-01T09:00Z").lease("bob")
        item.later(timedelta(minutes=minutes))
        item.resolve("MATCH_CONFIRMED")
        histories.append(item.finish())
    # A reassign starts the new holder's lease; an admin's release is not a decision of anyone's.
    moved = life(10, "2026-07-01T08:00Z", "2026-07-09T08:00Z")
    when(moved, "2026-07-01T09:00Z").lease("carol")
    when(moved, "2026-07-01T09:10Z").reassign("alice")
    when(moved, "2026-07-01T09:15Z").resolve("MATCH_CONFIRMED")
    dropped = life(11, "2026-07-01T08:00Z", "2026-07-09T08:00Z")
    when(dropped, "2026-07-01T09:00Z").lease("carol")
    when(dropped, "2026-07-01T09:05Z").release(override=True)
    when(dropped, "2026-07-01T10:00Z").lease("carol")
    when(dropped, "2026-07-01T10:02Z").release(override=False)
    kept = life(12, "2026-07-01T08:00Z", "2026-07-09T08:00Z")
    when(kept, "2026-07-01T11:00Z").lease("carol")
    when(kept, "2026-07-01T11:30Z").resolve("MATCH_CONFIRMED")
    ref.arrange(sql, [*histories, moved.finish(), dropped.finish(), kept.finish()])
    flow = run(
        db_url,
        lambda c: reports.throughput(c, period=reports.Period(date(2026, 7, 1), date(2026, 7, 2), "UTC")),
    )
    by_reviewer = {r.reviewer: r for r in flow.rows}
    assert set(by_reviewer) == {"alice", "bob", "carol"}  # never the admin
    bob = by_reviewer["bob"]
    assert (bob.resolved, bob.median_lease_to_decision_s, bob.p90_lease_to_decision_s) == (
        4, Decimal("1200.000000"), Decimal("2400.000000"))  # fmt: skip
    assert by_reviewer["alice"].median_lease_to_decision_s == Decimal("300.000000")
    # Her own release (after 2 minutes) is counted, apart: handing the work back is not a decision
    # (issue 42), so it is neither among her decisions nor in her time to decision (30 minutes).
    carol = by_reviewer["carol"]
    assert (carol.released, carol.resolved, carol.decisions) == (1, 1, 1)
    assert carol.median_lease_to_decision_s == carol.p90_lease_to_decision_s == Decimal("1800.000000")


def test_the_backlog_is_rebuilt_from_the_trail_by_age_at_each_days_end(
    db_url: str, sql: psycopg.Connection
) -> None:
    a = life(1, "2026-01-10T12:00Z", "2026-01-20T12:00Z")
    when(a, "2026-01-14T11:00Z").lease("alice")
    when(a, "2026-01-14T12:00Z").resolve("MATCH_CONFIRMED")  # open at the end of the 10th to the 13th
    when(a, "2026-01-15T06:00Z").reopen()  # open again at the end of the 15th and 16th
    when(a, "2026-01-16T23:00Z").lease("alice")
    # At midnight: the end of the 16th is that very instant, and the decision was not yet in effect
    # before it, so the item is open at the end of the 16th and closed at the end of the 17th.
    when(a, "2026-01-17T00:00Z").resolve("MATCH_CONFIRMED")
    b = life(2, "2026-01-11T00:00Z", "2026-01-20T12:00Z")  # created at the very end of the 10th
    ref.arrange(sql, [a.finish(), b.finish()])
    period = reports.Period(date(2026, 1, 10), date(2026, 1, 18), "UTC")
    stock = run(db_url, lambda c: reports.backlog(c, period=period))
    assert [(p.start.day, p.at, p.by_age) for p in stock.points] == [
        (10, at("2026-01-11T00:00Z"), (1, 0, 0, 0, 0)),  # a 12 h old; b not yet there
        (11, at("2026-01-12T00:00Z"), (0, 2, 0, 0, 0)),  # a 36 h, b exactly 24 h: 1-3d
        (12, at("2026-01-13T00:00Z"), (0, 2, 0, 0, 0)),
        (13, at("2026-01-14T00:00Z"), (0, 0, 2, 0, 0)),  # a 84 h, b exactly 3 days
        (14, at("2026-01-15T00:00Z"), (0, 0, 1, 0, 0)),  # a resolved at noon
        (15, at("2026-01-16T00:00Z"), (0, 0, 2, 0, 0)),  # a reopened: its age counts from enqueue
        (16, at("2026-01-17T00:00Z"), (0, 0, 2, 0, 0)),
        (17, at("2026-01-18T00:00Z"), (0, 0, 0, 1, 0)),  # b exactly 7 days
    ]
    assert [p.open for p in stock.points] == [1, 2, 2, 2, 1, 2, 2, 1]
    check_all(db_url, sql, date(2026, 1, 10), date(2026, 1, 18), "UTC")


def test_the_export_names_preparer_and_approver_and_the_figures_decided_on(
    db_url: str, sql: psycopg.Connection
) -> None:
    item = life(1, "2026-08-03T08:00Z", "2026-08-04T08:00Z", amount="25000.00")
    when(item, "2026-08-03T09:00Z").lease("alice")
    when(item, "2026-08-03T09:10Z").submit()
    when(item, "2026-08-03T10:00Z").lease("april")
    when(item, "2026-08-03T10:05Z").approve()
    when(item, "2026-08-05T10:00Z").revise()  # decertifies the approved decision
    ref.arrange(sql, [item.finish()])
    lo, hi = at("2026-08-03T00:00Z"), at("2026-08-04T00:00Z")
    (row,) = run(db_url, lambda c: reports.decisions_page(c, lo=lo, hi=hi, after=None))
    assert (row.resolution, row.note, row.resolved_by, row.approved_by) == (
        "ADJUSTMENT_POSTED", "JE by alice", "alice", "april")  # fmt: skip
    assert row.resolved_at == row.approved_at == at("2026-08-03T10:05Z")
    assert (row.variance_amount, row.match_decision) == (
        Decimal("25000.00"),
        "PARTIAL",
    )  # before the revision
    assert (row.on_time, row.reopened_at) == (True, at("2026-08-05T10:00Z"))


# ---------------------------------------------------------------------------------------------
# The throughput report's closed days, precomputed for one zone
# ---------------------------------------------------------------------------------------------


def decided_in_march() -> list[ref.Life]:
    """Decisions on 2 and 3 March 2026: resolved, submitted and approved, by three people."""
    a = life(1, "2026-03-01T08:00Z", "2026-03-05T17:00Z")
    when(a, "2026-03-02T09:00Z").lease("alice")
    when(a, "2026-03-02T09:20Z").resolve("MATCH_CONFIRMED")
    b = life(2, "2026-03-01T08:00Z", "2026-03-05T17:00Z")
    when(b, "2026-03-02T23:00Z").lease("bob")
    when(b, "2026-03-03T00:30Z").resolve("TIMING_DIFFERENCE")
    c = life(3, "2026-03-01T08:00Z", "2026-03-05T17:00Z", amount="25000.00")
    when(c, "2026-03-03T10:00Z").lease("alice")
    when(c, "2026-03-03T10:05Z").submit()
    when(c, "2026-03-03T11:00Z").lease("april")
    when(c, "2026-03-03T11:45Z").approve()
    d = life(4, "2026-03-01T08:00Z", "2026-03-05T17:00Z")
    when(d, "2026-03-03T12:00Z").lease("bob")
    when(d, "2026-03-03T16:00Z").resolve("MATCH_CONFIRMED")
    return [a, b, c, d]


MARCH = date(2026, 3, 1), date(2026, 3, 9)


def throughput_of(db_url: str, period: reports.Period) -> list[tuple[date, str, int, int]]:
    flow = run(db_url, lambda c: reports.throughput(c, period=period))
    return [(r.start, r.reviewer, r.resolved, r.approved) for r in flow.rows]


def test_the_report_reads_closed_days_in_the_rollups_zone_from_the_rollup_and_the_rest_from_the_trail(
    db_url: str, sql: psycopg.Connection
) -> None:
    today = life(5, "2026-03-01T08:00Z", "2026-03-05T17:00Z")
    when(today, "2026-03-01T09:00Z").now = datetime.now(UTC) - timedelta(minutes=2)
    today.lease("carol")
    today.later(timedelta(seconds=30))
    today.resolve("MATCH_CONFIRMED")
    ref.arrange(sql, [x.finish() for x in [*decided_in_march(), today]])
    roll_up_days(db_url, "UTC")
    # Marked, so that what is read from the rollup shows: a hundred more of alice's on Monday 2 March
    # (the day) and in the week it starts.
    sql.execute(
        "UPDATE review_queue_throughput_bucket SET resolved = resolved + 100, decisions = decisions + 100"
        " WHERE start = '2026-03-02'"
    )

    by_day = throughput_of(db_url, reports.Period(*MARCH, "UTC"))
    assert (date(2026, 3, 2), "alice", 101, 0) in by_day
    week = throughput_of(db_url, reports.Period(date(2026, 3, 2), date(2026, 3, 9), "UTC", 7))
    assert (date(2026, 3, 2), "alice", 101, 0) in week
    # One reviewer's own rows (what a reviewer may see), from the rollup too.
    own = run(db_url, lambda c: reports.throughput(c, period=reports.Period(*MARCH, "UTC"), reviewer="alice"))
    assert [(r.start, r.reviewer, r.resolved) for r in own.rows] == [
        (date(2026, 3, 2), "alice", 101),
        (date(2026, 3, 3), "alice", 0),
    ]
    # Another zone (with the same midnights in March) reads the trail.
    assert (date(2026, 3, 2), "alice", 1, 0) in throughput_of(db_url, reports.Period(*MARCH, "Europe/London"))
    # The backlog of 2 March, marked too: read from the rollup in UTC, from the trail in London; the
    # days before anything was enqueued (none is kept) have nothing open.
    sql.execute("UPDATE review_queue_backlog_day SET by_age = '{7, 7, 7, 7, 7}' WHERE day = '2026-03-02'")
    feb = reports.Period(date(2026, 2, 25), date(2026, 3, 5), "UTC")
    kept = run(db_url, lambda c: reports.backlog(c, period=feb)).points
    trail = run(db_url, lambda c: reports.backlog(c, period=replace(feb, tz="Europe/London"))).points
    assert [p.by_age for p in kept if p.start == date(2026, 3, 2)] == [(7, 7, 7, 7, 7)]
    assert [(p.start, p.at, p.by_age) for p in kept if p.start != date(2026, 3, 2)] == [
        (p.start, p.at, p.by_age) for p in trail if p.start != date(2026, 3, 2)
    ]
    assert kept[0].by_age == (0, 0, 0, 0, 0) and kept[5].by_age != (0, 0, 0, 0, 0)
    # Today is not closed: read from the trail, beside the closed days read from the rollup.
    now = datetime.now(UTC).date()
    recent = throughput_of(db_url, reports.Period(date(2026, 3, 2), now + timedelta(days=1), "UTC"))
    assert recent[0] == (date(2026, 3, 2), "alice", 101, 0)
    assert recent[-1] == (now, "carol", 1, 0)


def test_the_kept_days_carry_their_split_by_currency_as_it_stood_then(
    db_url: str, sql: psycopg.Connection
) -> None:
    open_in_eur = life(9, "2026-03-01T10:00Z", "2026-03-05T17:00Z")
    open_in_eur.currency = "EUR"
    ref.arrange(sql, [x.finish() for x in [*decided_in_march(), open_in_eur]])
    roll_up_days(db_url, "UTC")
    march = reports.Period(*MARCH, "UTC")
    assert sql.execute(
        "SELECT count(*) FROM review_queue_backlog_day WHERE by_currency IS NULL"
    ).fetchone() == (0,)
    kept = run(db_url, lambda c: reports.backlog(c, period=march, by_currency=True)).points
    assert kept[2].by_currency is not None and kept[2].by_currency["EUR"] == (0, 1, 0, 0, 0)
    # The source moves the open item to JPY today: the kept days keep EUR, the currency it had then
    # (as the trail says), and today's point has it in JPY.
    revised = run(
        db_url,
        lambda conn: queue.revise_item(
            Transaction(conn), item_id=open_in_eur.history.id, actor="ivan", variance_amount=Decimal("1250"),
            currency="JPY", source_hash="h-9-yen", match_decision="PARTIAL",
        ),
    )  # fmt: skip
    assert revised.item is not None and revised.item.currency == "JPY"
    items, events = ref.read_back(sql)
    today = datetime.now(UTC).date()
    check_backlog(db_url, items, events, march)
    check_backlog(
        db_url, items, events, reports.Period(today - timedelta(days=2), today + timedelta(days=1), "UTC")
    )
    assert run(db_url, lambda c: reports.backlog(c, period=march, by_currency=True)).points == kept
    # A day kept by the release before the split has none: read from the trail, and the next round
    # keeps every day again, with it.
    sql.execute("UPDATE review_queue_backlog_day SET by_currency = NULL WHERE day = '2026-03-04'")
    check_backlog(db_url, items, events, march)
    roll_up_days(db_url, "UTC")
    assert sql.execute(
        "SELECT count(*) FROM review_queue_backlog_day WHERE by_currency IS NULL"
    ).fetchone() == (0,)
    check_backlog(db_url, items, events, march)


def test_decisions_reopened_after_their_day_was_rolled_up_stay_in_it(
    db_url: str, sql: psycopg.Connection
) -> None:
    histories = decided_in_march()
    ref.arrange(sql, [x.finish() for x in histories])
    roll_up_days(db_url, "UTC")
    before = [throughput_of(db_url, p) for p in periods(*MARCH, "UTC")]

    a, _, c, d = (h.history.id for h in histories)
    run(db_url, lambda conn: queue.reopen_item(Transaction(conn), item_id=a, actor="ada", reason="wrong"))
    run(db_url, lambda conn: queue.reopen_item(Transaction(conn), item_id=c, actor="ada", reason="wrong"))
    revised = run(
        db_url,
        lambda conn: queue.revise_item(
            Transaction(conn), item_id=d, actor="ivan", variance_amount=Decimal("13.50"),
            source_hash="h-4-revised", match_decision="UNMATCHED",
        ),
    )  # fmt: skip
    assert revised.item is not None and revised.item.state == "PENDING"
    assert sql.execute("SELECT count(*) FROM review_queue_event WHERE event = 'REOPENED'").fetchone() == (3,)
    # Both ways of reopening mark the row (the trigger on REOPENED events): the backlog follows
    # them. In another zone every day is read from the trail, where they were resolved until now.
    assert sql.execute("SELECT count(*) FROM review_queue_item WHERE reopened").fetchone() == (3,)
    items, events = ref.read_back(sql)
    today = datetime.now(UTC).date()
    check_backlog(
        db_url,
        items,
        events,
        reports.Period(today - timedelta(days=3), today + timedelta(days=2), "Asia/Tokyo"),
    )

    for period, figures in zip(periods(*MARCH, "UTC"), before, strict=True):
        assert throughput_of(db_url, period) == figures
        check_throughput(db_url, events, period)
    # Weeks from a Tuesday (the API refuses them; db.reports takes them) are read from the trail.
    check_throughput(db_url, events, reports.Period(date(2026, 3, 3), date(2026, 3, 17), "UTC", 7))
    # A new zone starts the days over, and gives the trail's figures in it.
    roll_up_days(db_url, "America/New_York")
    assert sql.execute("SELECT DISTINCT time_zone FROM review_queue_throughput_rollup").fetchall() == [
        ("America/New_York",)
    ]
    for period in periods(*MARCH, "America/New_York"):
        check_throughput(db_url, events, period)


def test_no_day_is_rolled_up_past_the_resolved_rollups_edge(db_url: str, sql: psycopg.Connection) -> None:
    ref.arrange(sql, [x.finish() for x in decided_in_march()])

    def roll(tz: str) -> tuple[Any, ...]:
        while not (rolled := run(db_url, lambda c: reports.roll_up(c, tz=tz, days=2))).caught_up:
            pass
        (days,) = sql.execute("SELECT count(*) FROM review_queue_throughput_bucket WHERE days = 1").fetchone()
        return rolled.through, days

    assert roll("UTC") == (None, 0)  # the RESOLVED rollup has never run: no day is known to be closed
    sql.execute("UPDATE review_queue_resolved_rollup SET edge = '2026-03-03T12:00Z'")
    assert roll("UTC") == (date(2026, 3, 3), 1)  # 2 March (alice's) only: 3 March is not over
    # In Auckland (UTC+13) 3 March ended at 11:00Z; its first decisions, bob's, were on 3 March too.
    assert roll("Pacific/Auckland") == (date(2026, 3, 4), 3)
    # The edge moved back (a restore): the kept days after it are forgotten, then kept again.
    sql.execute("UPDATE review_queue_resolved_rollup SET edge = '2026-03-02T12:00Z'")
    assert roll("Pacific/Auckland") == (date(2026, 3, 3), 1)
    sql.execute("UPDATE review_queue_resolved_rollup SET edge = '2026-03-03T12:00Z'")
    assert roll("Pacific/Auckland") == (date(2026, 3, 4), 3)
