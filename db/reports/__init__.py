"""The controller's reports: SLA attainment, throughput per reviewer, the backlog by age, and the
decisions of a period. docs/reports.md defines every figure; each is computed here, in SQL, from
the items and the event trail.

Fast over a year of history, exactly: an item's row sums up its trail (created_at, resolved_at,
leased_at, resolved_by, approved_by) for as long as its decision has never been reopened. A
report therefore reads the resolved rows once, through a partial index of RESOLVED rows, and the
live queue through its own partial indexes; then it corrects for the few items ever reopened
(ix_review_queue_event_reopened) by reading their trail instead of their row. The tests compute
every figure from the trail alone and compare.

The trail's time: an item's events are in trail order (event id, the order their statements took
the item's row lock), and each takes effect at its `at` or, when an earlier event of the item has
a later `at` (a transaction that started first and committed second), at that later `at`: the
running maximum, so that an item's states follow each other in time.
"""

from db.reports.aging import AGE_BANDS, BacklogPoint, BacklogReport, backlog
from db.reports.common import Period, UnknownTimeZone
from db.reports.deadlines import SlaBucket, SlaFigures, SlaReport, sla, sla_trailing
from db.reports.decisions import DECISIONS_PAGE, Cursor, Decision, decision_bounds, decisions_page
from db.reports.rollup import ROLLUP_STATEMENT_TIMEOUT_MS, RolledDays, roll_up
from db.reports.workload import ThroughputReport, ThroughputRow, throughput, throughput_json

__all__ = [
    "AGE_BANDS",
    "DECISIONS_PAGE",
    "ROLLUP_STATEMENT_TIMEOUT_MS",
    "BacklogPoint",
    "BacklogReport",
    "Cursor",
    "Decision",
    "Period",
    "RolledDays",
    "SlaBucket",
    "SlaFigures",
    "SlaReport",
    "ThroughputReport",
    "ThroughputRow",
    "UnknownTimeZone",
    "backlog",
    "decision_bounds",
    "decisions_page",
    "roll_up",
    "sla",
    "sla_trailing",
    "throughput",
    "throughput_json",
]
