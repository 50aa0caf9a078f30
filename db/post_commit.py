"""The reports (log lines, metrics) of the transaction in progress, kept until it commits.

Its own module, free of prometheus_client: db.engine imports it, and the CLI must not create a
metric before `serve` has chosen multiprocess mode (tests/test_cli.py).
"""

import contextlib
from collections.abc import Callable
from contextvars import ContextVar, Token

Report = Callable[[], None]

# The reports of the transaction in progress in this task; None outside `db.engine.transaction`.
_pending: ContextVar[list[Report] | None] = ContextVar("review_queue_pending_reports", default=None)


def pending() -> list[Report] | None:
    return _pending.get()


def collect() -> tuple[list[Report], Token[list[Report] | None]]:
    """Keep the reports made from now on (until `stop_collecting`) instead of emitting them."""
    reports: list[Report] = []
    return reports, _pending.set(reports)


def stop_collecting(token: Token[list[Report] | None]) -> None:
    # A dependency's generator closed from another context (a cancelled request) cannot reset the
    # variable, and need not: that context ends with it.
    with contextlib.suppress(ValueError, RuntimeError):
        _pending.reset(token)


def emit(reports: list[Report]) -> None:
    for report in reports:
        report()
    reports.clear()
