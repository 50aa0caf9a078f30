"""The reports of db/reports/ computed again in plain Python, from the event trail alone, as
docs/reports.md defines them; and histories of items (rows and events, consistent with each other
as db/queue/ writes them) to arrange in a test database.

Nothing here reads an item's row for a figure: the row is only where created_at, due_at, the
ledger entity and the figures live. Every state comes from the events.
"""

import asyncio
import bisect
import json
import math
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from typing import Any, TypeVar
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

DECISIVE = ("ENQUEUED", "RESOLVED", "APPROVED", "REOPENED")
DECISIONS = ("RESOLVED", "APPROVED")
LEASE_STARTS = ("LEASED", "REASSIGNED")
BANDS = (timedelta(0), timedelta(days=1), timedelta(days=3), timedelta(days=7), timedelta(days=30))
MICROSECOND = timedelta(microseconds=1)


# ---------------------------------------------------------------------------------------------
# Rows, as read from (or written to) the database
# ---------------------------------------------------------------------------------------------


@dataclass
class Event:
    id: int
    item_id: UUID
    event: str
    actor: str
    at: datetime
    details: dict[str, Any] = field(default_factory=dict)
    lease_epoch: int = 0


@dataclass
class Item:
    id: UUID
    idempotency_key: str
    ledger_entity: str
    variance_amount: Decimal
    match_decision: str
    created_at: datetime
    due_at: datetime
    currency: str


def read_back(sql: psycopg.Connection) -> tuple[dict[UUID, Item], list[Event]]:
    items = {
        row[0]: Item(*row)
        for row in sql.execute(
            "SELECT id, idempotency_key, ledger_entity, variance_amount, match_decision, created_at, due_at,"
            " currency FROM review_queue_item"
        )
    }
    # The details' numbers as the exact decimals recorded (a rate, a base amount), never floats.
    events = [
        Event(*row[:5], json.loads(row[5], parse_float=Decimal), row[6])
        for row in sql.execute(
            "SELECT id, item_id, event, actor, at, details::text, lease_epoch"
            " FROM review_queue_event ORDER BY id"
        )
    ]
    return items, events


def trails(events: list[Event]) -> dict[UUID, list[Event]]:
    by_item: dict[UUID, list[Event]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e.id):
        by_item[e.item_id].append(e)
    return by_item


# ---------------------------------------------------------------------------------------------
# Time: local midnights as PostgreSQL places them, and the trail's effective times
# ---------------------------------------------------------------------------------------------


def local_midnight(day: date, tz: str) -> datetime:
    """`day 00:00` in `tz` as an instant, by PostgreSQL's rule: a local time that occurs twice is
    the later instant, one that is skipped takes the offset from before the jump."""
    zone = ZoneInfo(tz)
    naive = datetime(day.year, day.month, day.day)
    early, late = naive.replace(tzinfo=zone, fold=0), naive.replace(tzinfo=zone, fold=1)
    if early.utcoffset() == late.utcoffset():
        return early.astimezone(UTC)
    exists = early.astimezone(UTC).astimezone(zone).replace(tzinfo=None) == naive
    return (late if exists else early).astimezone(UTC)


def edges(start: date, end: date, tz: str, step_days: int = 1) -> list[datetime]:
    days = (end - start).days // step_days
    return [local_midnight(start + timedelta(days=n * step_days), tz) for n in range(days + 1)]


def bucket_of(at: datetime, cuts: list[datetime]) -> int | None:
    """1-based bucket of `at` among [cuts[k-1], cuts[k]), or None outside."""
    k = bisect.bisect_right(cuts, at)
    return k if 1 <= k < len(cuts) else None


def decisive(trail: list[Event]) -> list[tuple[Event, datetime]]:
    """The enqueue, decisions and reopenings, each with its effective time (the running maximum
    of `at` in trail order)."""
    out: list[tuple[Event, datetime]] = []
    latest: datetime | None = None
    for e in trail:
        if e.event in DECISIVE:
            latest = e.at if latest is None else max(latest, e.at)
            out.append((e, latest))
    return out


def resolved_at(trail: list[Event], moment: datetime, *, inclusive: bool) -> bool:
    in_effect = [e for e, t in decisive(trail) if (t <= moment if inclusive else t < moment)]
    return bool(in_effect) and in_effect[-1].event in DECISIONS


def open_at(trail: list[Event], moment: datetime) -> bool:
    in_effect = [e for e, t in decisive(trail) if t < moment]
    return bool(in_effect) and in_effect[-1].event not in DECISIONS


def resolved_now(trail: list[Event]) -> bool:
    kinds = [e.event for e in trail if e.event in DECISIVE]
    return bool(kinds) and kinds[-1] in DECISIONS


# ---------------------------------------------------------------------------------------------
# The reports
# ---------------------------------------------------------------------------------------------


def attainment(on_time: int, fell_due: int) -> Decimal | None:
    if fell_due == 0:
        return None
    # Exactly, as a fraction, then half up to 4 places: no float, no double rounding.
    whole = math.floor(Fraction(on_time, fell_due) * 10_000 + Fraction(1, 2))
    return Decimal(whole).scaleb(-4)


def sla(
    items: dict[UUID, Item],
    events: list[Event],
    cuts: list[datetime],
    as_of: datetime,
    entity: str | None = None,
) -> tuple[list[tuple[int, int, int, int, Decimal | None]], tuple[int, int, int, int, Decimal | None]]:
    by_item = trails(events)
    counts = [[0, 0, 0, 0] for _ in range(len(cuts) - 1)]
    for item in items.values():
        k = bucket_of(item.due_at, cuts)
        if k is None or item.due_at > as_of or (entity is not None and item.ledger_entity != entity):
            continue
        trail = by_item[item.id]
        row = counts[k - 1]
        row[0] += 1
        if resolved_at(trail, item.due_at, inclusive=True):
            row[1] += 1
        elif resolved_now(trail):
            row[2] += 1
        else:
            row[3] += 1
    buckets = [(f, o, la, op, attainment(o, f)) for f, o, la, op in counts]
    total = [sum(c[i] for c in counts) for i in range(4)]
    return buckets, (total[0], total[1], total[2], total[3], attainment(total[1], total[0]))


OUTCOMES = {
    "RESOLVED": "resolved",
    "SUBMITTED_FOR_APPROVAL": "submitted_for_approval",
    "APPROVED": "approved",
    "REJECTED": "rejected",
    "RELEASED": "released",
}


def percentile_disc(values: list[int], fraction: float) -> int | None:
    """PostgreSQL's percentile_disc: the first value whose position reaches the fraction."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)), 1) - 1]


def seconds(microseconds: int | None) -> Decimal | None:
    return None if microseconds is None else Decimal(microseconds).scaleb(-6)


def throughput(
    events: list[Event], cuts: list[datetime], reviewer: str | None = None
) -> list[dict[str, Any]]:
    groups: dict[tuple[int, str], list[tuple[str, int | None]]] = defaultdict(list)
    for trail in trails(events).values():
        for n, e in enumerate(trail):
            if e.event not in OUTCOMES or (e.event == "RELEASED" and "override" in e.details):
                continue
            k = bucket_of(e.at, cuts)
            if k is None or (reviewer is not None and e.actor != reviewer):
                continue
            starts = [s for s in trail[:n] if s.event in LEASE_STARTS]
            took = None
            if starts:
                took = max(e.at - starts[-1].at, timedelta(0)) // MICROSECOND
            groups[(k, e.actor)].append((OUTCOMES[e.event], took))
    rows = []
    for (k, who), decided in sorted(groups.items(), key=lambda g: (g[0][0], g[0][1].encode())):
        # A release hands the work back undecided: counted apart, not a decision (issue 42).
        times = [t for o, t in decided if t is not None and o != "released"]
        rows.append(
            {
                "k": k,
                "reviewer": who,
                **{name: sum(1 for o, _ in decided if o == name) for name in OUTCOMES.values()},
                "decisions": sum(1 for o, _ in decided if o != "released"),
                "median": seconds(percentile_disc(times, 0.5)),
                "p90": seconds(percentile_disc(times, 0.9)),
            }
        )
    return rows


def backlog(
    items: dict[UUID, Item], events: list[Event], cuts: list[datetime], as_of: datetime
) -> list[tuple[int, datetime, tuple[int, ...]]]:
    by_item = trails(events)
    points = []
    for k in range(1, len(cuts)):
        if cuts[k - 1] >= as_of:
            continue
        moment = min(cuts[k], as_of)
        bands = [0] * len(BANDS)
        for item in items.values():
            if open_at(by_item[item.id], moment):
                age = moment - item.created_at
                bands[max(t for t, lo in enumerate(BANDS) if age >= lo)] += 1
        points.append((k, moment, tuple(bands)))
    return points


def currency_at(item: Item, trail: list[Event], moment: datetime) -> str:
    """The item's currency at `moment`: a revision that changed it takes effect after its effective
    time (the running maximum of those revisions' `at`, in trail order), as a decision does."""
    changes = [
        e
        for e in trail
        if e.event == "REVISED"
        and e.details["previous"].get("currency") != e.details["current"].get("currency")
    ]
    currency = changes[0].details["previous"]["currency"] if changes else item.currency
    latest: datetime | None = None
    for e in changes:
        latest = e.at if latest is None else max(latest, e.at)
        if latest < moment:
            currency = e.details["current"]["currency"]
    return currency


def backlog_by_currency(
    items: dict[UUID, Item], events: list[Event], cuts: list[datetime], as_of: datetime
) -> list[dict[str, tuple[int, ...]]]:
    """Per point (as `backlog`), the currencies with items open then, each with its counts per band."""
    by_item = trails(events)
    points = []
    for k in range(1, len(cuts)):
        if cuts[k - 1] >= as_of:
            continue
        moment = min(cuts[k], as_of)
        split: dict[str, list[int]] = {}
        for item in items.values():
            trail = by_item[item.id]
            if open_at(trail, moment):
                age = moment - item.created_at
                bands = split.setdefault(currency_at(item, trail, moment), [0] * len(BANDS))
                bands[max(t for t, lo in enumerate(BANDS) if age >= lo)] += 1
        points.append({code: tuple(bands) for code, bands in sorted(split.items())})
    return points


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def decisions(
    items: dict[UUID, Item], events: list[Event], lo: datetime, hi: datetime
) -> list[dict[str, Any]]:
    by_item = trails(events)
    out = []
    for e in sorted(events, key=lambda e: (e.at, e.id)):
        if e.event not in DECISIONS or not lo <= e.at < hi:
            continue
        item, later = items[e.item_id], [x for x in by_item[e.item_id] if x.id > e.id]
        revision = next((x for x in later if x.event == "REVISED"), None)
        reopening = next((x for x in later if x.event == "REOPENED"), None)
        figures = revision.details["previous"] if revision else None
        approved = e.event == "APPROVED"
        earlier = [x for x in by_item[e.item_id] if x.id < e.id and x.event == "SUBMITTED_FOR_APPROVAL"]
        converted = (earlier[-1].details if earlier else {}) if approved else e.details
        out.append(
            {
                "event_id": e.id,
                "item_id": e.item_id,
                "idempotency_key": item.idempotency_key,
                "ledger_entity": item.ledger_entity,
                "variance_amount": Decimal(figures["variance_amount"]) if figures else item.variance_amount,
                "currency": figures.get("currency", item.currency) if figures else item.currency,
                "match_decision": figures["match_decision"] if figures else item.match_decision,
                "resolution": e.details["resolution"],
                "note": e.details.get("note"),
                "resolved_by": e.details["prepared_by"] if approved else e.actor,
                "resolved_at": e.at,
                "approved_by": e.actor if approved else None,
                "approved_at": e.at if approved else None,
                "due_at": item.due_at,
                "on_time": e.at <= item.due_at,
                "reopened_at": reopening.at if reopening else None,
                "rate": _text(converted.get("rate")),
                "base_amount": _text(converted.get("base_amount")),
            }
        )
    return out


# ---------------------------------------------------------------------------------------------
# Histories: an item's life as db/queue/ would write it, at chosen moments
# ---------------------------------------------------------------------------------------------

REVIEWERS = ("alice", "bob", "carol")
CURRENCIES = ("USD", "EUR", "JPY", "KWD")
APPROVERS = ("april", "arthur")
ADMIN = "ada"


@dataclass
class History:
    """One item: its row as the queue would leave it, and its events (ids assigned on insert)."""

    id: UUID
    key: str
    entity: str
    amount: Decimal
    created_at: datetime
    due_at: datetime
    currency: str = "USD"
    events: list[dict[str, Any]] = field(default_factory=list)
    row: dict[str, Any] = field(default_factory=dict)


class Life:
    """Builds one item's history step by step, keeping the row as db/queue/'s statements would."""

    def __init__(
        self, rng: random.Random, n: int, created_at: datetime, due_at: datetime, entity: str
    ) -> None:
        self.rng = rng
        self.now = created_at
        self.epoch = 0
        self.state = "PENDING"
        self.holder: str | None = None
        self.leased_at: datetime | None = None
        self.prepared_by: str | None = None
        self.proposal: tuple[str, str | None] | None = None
        self.decision: dict[str, Any] = {}  # resolution, note, resolved_by, resolved_at, approved_by/at
        self.amount = Decimal(rng.choice(["12.50", "-40.00", "2500.00", "25000.00"]))
        self.currency = rng.choice(CURRENCIES)
        self.match_decision = "PARTIAL"
        self.source = f"h-{n}"
        self.history = History(uuid4(), f"rep-{n}", entity, self.amount, created_at, due_at, self.currency)
        self.log("ENQUEUED", "ivan", {}, at=created_at)

    def log(self, event: str, actor: str, details: dict[str, Any], *, at: datetime | None = None) -> None:
        self.history.events.append(
            {"event": event, "actor": actor, "at": at or self.now, "details": details, "epoch": self.epoch}
        )

    def later(self, gap: timedelta) -> None:
        self.now += gap

    def lease(self, who: str) -> None:
        self.epoch += 1
        self.holder, self.leased_at = who, self.now
        if self.state == "PENDING":
            self.state = "ASSIGNED"
            self.log("LEASED", who, {"lease_expires_at": (self.now + timedelta(seconds=30)).isoformat()})
        else:
            self.log("LEASED", who, {"queue": "approval"})

    def end_lease(self) -> None:
        self.holder = self.leased_at = None

    def release(self, *, override: bool) -> None:
        details: dict[str, Any] = {"reason": "test"}
        if override:
            details |= {"previous_holder": self.holder, "override": True}
        self.log("RELEASED", ADMIN if override else str(self.holder), details)
        self.state = "AWAITING_APPROVAL" if self.state == "AWAITING_APPROVAL" else "PENDING"
        self.end_lease()

    def reclaim(self) -> None:
        self.log("RECLAIMED", "reclaimer@test", {"cause": "expired", "previous_holder": self.holder})
        self.state = "AWAITING_APPROVAL" if self.state == "AWAITING_APPROVAL" else "PENDING"
        self.end_lease()

    def reassign(self, to: str) -> None:
        self.epoch += 1
        self.log("REASSIGNED", ADMIN, {"reason": "cover", "previous_holder": self.holder, "leased_by": to})
        self.holder, self.leased_at = to, self.now

    def revise(self) -> None:
        previous = {
            "variance_amount": str(self.amount),
            "currency": self.currency,
            "match_decision": self.match_decision,
            "source_hash": self.source,
        }
        self.amount = self.amount + Decimal("1.00")
        if self.rng.random() < 0.5:  # the source corrects the currency too (the backlog's split moves)
            self.currency = self.rng.choice([c for c in CURRENCIES if c != self.currency])
        self.match_decision = "UNMATCHED" if self.match_decision == "PARTIAL" else "PARTIAL"
        self.source += "'"
        was = self.state
        if was == "ASSIGNED":
            self.epoch += 1
        current = {
            "variance_amount": str(self.amount),
            "currency": self.currency,
            "match_decision": self.match_decision,
            "source_hash": self.source,
        }
        self.log("REVISED", "ivan", {"previous": previous, "current": current, "previous_state": was})
        if was == "RESOLVED":
            self.reopen(decertified=True)
        elif was == "AWAITING_APPROVAL":
            self.state = "PENDING"
            self.end_lease()

    def resolve(self, code: str) -> None:
        who = str(self.holder)
        self.log("RESOLVED", who, {"resolution": code, "note": f"note by {who}"})
        self.decision = {
            "resolution": code,
            "resolution_note": f"note by {who}",
            "resolved_by": who,
            "resolved_at": self.now,
            "approved_by": None,
            "approved_at": None,
        }
        self.state = "RESOLVED"

    def submit(self) -> None:
        who = str(self.holder)
        self.prepared_by, self.proposal = who, ("ADJUSTMENT_POSTED", f"JE by {who}")
        self.log(
            "SUBMITTED_FOR_APPROVAL",
            who,
            {"resolution": "ADJUSTMENT_POSTED", "note": self.proposal[1], "approval_threshold": "10000.00"},
        )
        self.state = "AWAITING_APPROVAL"
        self.end_lease()

    def approve(self) -> None:
        assert self.proposal is not None
        who = str(self.holder)
        code, note = self.proposal
        self.log("APPROVED", who, {"resolution": code, "note": note, "prepared_by": self.prepared_by})
        self.decision = {
            "resolution": code,
            "resolution_note": note,
            "resolved_by": self.prepared_by,
            "resolved_at": self.now,
            "approved_by": who,
            "approved_at": self.now,
        }
        self.state = "RESOLVED"  # the approval lease's holder and start stay on the row

    def reject(self) -> None:
        assert self.proposal is not None
        self.log("REJECTED", str(self.holder), {"reason": "no", "prepared_by": self.prepared_by})
        self.state = "PENDING"
        self.end_lease()

    def reopen(self, *, decertified: bool = False) -> None:
        # As db/queue/ writes it: the decision it reopens, under previous_*.
        d = self.decision
        details: dict[str, Any] = {
            "reason": "source revised" if decertified else "wrong",
            "previous_resolution": d["resolution"],
            "previous_note": d["resolution_note"],
            "previous_resolved_by": d["resolved_by"],
            "previous_resolved_at": d["resolved_at"].isoformat(),
            "previous_approved_by": d["approved_by"],
        }
        if decertified:
            details["decertified"] = True
        self.log("REOPENED", "ivan" if decertified else ADMIN, details)
        self.decision = {}
        self.state = "PENDING"
        self.end_lease()

    def step(self) -> bool:
        """One random step of the item's life; False when it is over."""
        rng = self.rng
        choice = rng.random()
        if self.state == "PENDING":
            if choice < 0.08:
                return False  # left open
            if choice < 0.12:
                self.revise()
            else:
                self.lease(rng.choice(REVIEWERS))
        elif self.state == "ASSIGNED":
            if choice < 0.08:
                self.release(override=False)
            elif choice < 0.11:
                self.release(override=True)
            elif choice < 0.14:
                self.reclaim()
            elif choice < 0.17:
                self.reassign(rng.choice([r for r in REVIEWERS if r != self.holder]))
            elif choice < 0.20:
                self.revise()
            elif choice < 0.24:
                self.log("RENEWED", str(self.holder), {})
            elif choice < 0.40 and abs(self.amount) >= 10000:
                self.submit()
            else:
                self.resolve(rng.choice(["MATCH_CONFIRMED", "TIMING_DIFFERENCE"]))
        elif self.state == "AWAITING_APPROVAL" and self.holder is None:
            if choice < 0.1:
                return False
            self.lease(rng.choice(APPROVERS))
        elif self.state == "AWAITING_APPROVAL":
            if choice < 0.1:
                self.release(override=False)
            elif choice < 0.3:
                self.reject()
            else:
                self.approve()
        else:  # RESOLVED
            if choice < 0.7:
                return False
            if choice < 0.85:
                self.reopen()
            else:
                self.revise()
        return True

    def finish(self) -> History:
        # A resolved row keeps its last lease (holder, start, expiry), as the completion and the
        # approval leave it; reopening, releasing, rejecting clear it.
        h = self.history
        holding = self.holder is not None
        h.amount, h.currency = self.amount, self.currency
        h.row = {
            "state": self.state,
            "leased_by": self.holder,
            "leased_at": self.leased_at,
            "lease_expires_at": self.now + timedelta(hours=1) if holding else None,
            "lease_epoch": self.epoch,
            "match_decision": self.match_decision,
            "source_hash": self.source,
            "prepared_by": self.prepared_by,
            "proposed_resolution": self.proposal[0] if self.proposal else None,
            "proposed_note": self.proposal[1] if self.proposal else None,
            **dict.fromkeys(_DECISION_COLUMNS),
            **self.decision,
        }
        return h


def live(
    rng: random.Random,
    n: int,
    *,
    created_at: datetime,
    due_at: datetime,
    entity: str,
    gaps: list[timedelta],
    max_steps: int = 12,
) -> History:
    """An item enqueued at `created_at`, then up to `max_steps` steps, each after a gap drawn from `gaps`."""
    life = Life(rng, n, created_at, due_at, entity)
    for _ in range(max_steps):
        life.later(rng.choice(gaps))
        if not life.step():
            break
    return life.finish()


_DECISION_COLUMNS = (
    "resolution", "resolution_note", "resolved_by", "resolved_at", "approved_by", "approved_at",
)  # fmt: skip
_ROW_COLUMNS = (
    "state", "leased_by", "leased_at", "lease_expires_at", "lease_epoch", "match_decision", "source_hash",
    "prepared_by", "proposed_resolution", "proposed_note", "resolution", "resolution_note", "resolved_by",
    "resolved_at", "approved_by", "approved_at",
)  # fmt: skip


def arrange(sql: psycopg.Connection, histories: list[History]) -> None:
    """Empty the queue (as the server's superuser, past the append-only trigger) and its rollups
    (the RESOLVED count, the throughput report's closed buckets), and insert the histories: rows,
    then events in the order of their moments (ids follow)."""
    sql.execute("SET session_replication_role = replica")
    sql.execute(
        "TRUNCATE review_queue_chain, review_queue_event, review_queue_item, review_queue_throughput_bucket,"
        " review_queue_backlog_day, review_queue_reopened_item"
    )
    sql.execute("UPDATE review_queue_throughput_rollup SET time_zone = NULL, through = NULL")
    sql.execute(
        "UPDATE review_queue_resolved_rollup SET edge = '-infinity', resolved = 0,"
        " counted_in = pg_current_snapshot()"
    )
    sql.execute("SET session_replication_role = origin")
    columns = ", ".join(_ROW_COLUMNS)
    placeholders = ", ".join(["%s"] * len(_ROW_COLUMNS))
    with sql.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO review_queue_item (id, idempotency_key, ledger_entity, variance_amount, currency,"
            f" created_at, due_at, trace_id, {columns})"
            f" VALUES (%s, %s, %s, %s, %s, %s, %s, gen_random_uuid(), {placeholders})",
            [
                (
                    h.id,
                    h.key,
                    h.entity,
                    h.amount,
                    h.currency,
                    h.created_at,
                    h.due_at,
                    *(h.row[c] for c in _ROW_COLUMNS),
                )
                for h in histories
            ],
        )
        # Each item's events in its own order (as its row lock serialises them); items interleaved
        # by moment, as a busy queue interleaves them.
        ordered = sorted(
            ((h, n, e) for h in histories for n, e in enumerate(h.events)),
            key=lambda t: (t[2]["at"], t[1]),
        )
        cursor.executemany(
            "INSERT INTO review_queue_event (item_id, event, actor, at, lease_epoch, trace_id, details)"
            " SELECT %s, %s, %s, %s, %s, trace_id, %s FROM review_queue_item WHERE id = %s",
            [
                (h.id, e["event"], e["actor"], e["at"], e["epoch"], Jsonb(e["details"]), h.id)
                for h, _, e in _in_trail_order(ordered)
            ],
        )


def _in_trail_order(
    ordered: list[tuple[History, int, dict[str, Any]]],
) -> list[tuple[History, int, dict[str, Any]]]:
    """By moment, but never an item's event before an earlier one of the same item (a moment can go
    back: a transaction that started first and committed second)."""
    out, done = [], defaultdict(int)
    pending = list(ordered)
    while pending:
        rest = []
        for h, n, e in pending:
            if done[h.id] == n:
                out.append((h, n, e))
                done[h.id] += 1
            else:
                rest.append((h, n, e))
        pending = rest
    return out


T = TypeVar("T")


def run(db_url: str, call: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """`call` in one transaction of the application role, as a request runs it."""

    async def go() -> T:
        engine = create_async_engine(db_url, poolclass=NullPool)
        try:
            async with engine.begin() as conn:
                return await call(conn)
        finally:
            await engine.dispose()

    return asyncio.run(go())
