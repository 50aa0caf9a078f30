"""`review-queue stats`: the queue's gauges for an operator."""

import typer
from sqlalchemy.ext.asyncio import AsyncConnection

from api.settings import get_settings
from cli.common import in_transaction


def stats() -> None:
    """Print queue depth, age, leases, overdue items and aging.

    Leases in flight, overdue items, the aging of open items by bucket, and open items per currency
    (those in a currency with no exchange rate yet need an approver whatever their amount)."""
    from datetime import timedelta

    from db import fx
    from db import stats as queue_stats

    settings = get_settings()

    async def read(
        conn: AsyncConnection,
    ) -> tuple[
        queue_stats.QueueGauges, int, dict[str, int], dict[str, int], dict[str, int], list[fx.OpenInCurrency]
    ]:
        gauges = await queue_stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
        return (
            gauges,
            await queue_stats.resolved_count(conn),
            await queue_stats.open_leases_by_reviewer(conn),
            await queue_stats.aging(conn),
            await queue_stats.overdue_by_ledger_entity(conn),
            await fx.open_by_currency(conn, base_currency=settings.base_currency),
        )

    gauges, resolved, by_reviewer, aging, overdue_by_entity, by_currency = in_transaction(read)
    age = f"{gauges.oldest_pending_age_s:.1f} s" if gauges.oldest_pending_age_s is not None else "-"
    rows = [
        ("pending", str(gauges.pending)),
        ("assigned", f"{gauges.assigned} of max_inflight {settings.max_inflight}"),
        ("resolved", str(resolved)),
        ("quarantined", str(gauges.quarantined)),
        ("awaiting approval", str(gauges.awaiting_approval)),
        ("approval leases", str(gauges.approval_leases)),
        ("oldest pending age", age),
        ("expired, not reclaimed", str(gauges.expired_unreclaimed)),
        ("past the reclaim grace", str(gauges.reclaimable)),
    ]
    rows += [(f"  leased by {reviewer}", str(count)) for reviewer, count in by_reviewer.items()]
    overdue_s = f"{gauges.oldest_overdue_s:.1f} s" if gauges.oldest_overdue_s is not None else "-"
    rows += [("overdue", str(gauges.overdue)), ("most overdue by", overdue_s)]
    rows += [(f"  overdue in {entity}", str(count)) for entity, count in overdue_by_entity.items()]
    rows += [("open items by age", "")] + [(f"  {bucket}", str(count)) for bucket, count in aging.items()]
    rows += [("open items by currency", "")] + [
        (f"  {c.currency}", str(c.open) if c.has_rate else f"{c.open} (no rate: each needs an approver)")
        for c in by_currency
    ]
    for label, value in rows:
        typer.echo(f"{label:<26} {value}")
