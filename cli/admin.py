"""`review-queue admin`: an admin's override of leases."""

from datetime import timedelta
from typing import Annotated
from uuid import UUID

import typer

from api.logs import configure_logging
from api.settings import get_settings
from cli.common import command_group, in_unit, subject_option

admin_app = command_group("An admin's override of leases: release or reassign them.")


def _reason(value: str) -> str:
    if not 1 <= len(value) <= 500 or "\x00" in value:
        raise typer.BadParameter("1-500 characters (kept in the audit trail)")
    return value


AdminName = Annotated[
    str, typer.Option("--admin", callback=subject_option, help="Who is doing this: the audit trail's actor.")
]
AdminReason = Annotated[
    str, typer.Option(callback=_reason, help="Why (1-500 characters), kept in the trail.")
]


@admin_app.command("release")
def admin_release(
    reason: AdminReason,
    admin: AdminName,
    item: Annotated[UUID | None, typer.Option(help="Release this item, whoever holds it.")] = None,
    reviewer: Annotated[str | None, typer.Option(help="Release every item this reviewer holds.")] = None,
) -> None:
    """Hand someone's leases back to the queue: one item or all.

    One item (--item), or every item a reviewer holds (--reviewer). Releasing nothing is an error
    (exit 1)."""
    from db import queue

    if (item is None) == (reviewer is None):
        raise typer.BadParameter("give either --item or --reviewer")
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    if item is not None:
        _, done, current = in_unit(
            lambda unit: queue.admin_release_item(unit, item_id=item, actor=admin, reason=reason)
        )
        released = [done] if done is not None else []
        nothing = f"item {item} is {current.state}, not ASSIGNED" if current else f"no item {item}"
    else:
        released = in_unit(
            lambda unit: queue.admin_release_reviewer(
                unit, reviewer=str(reviewer), actor=admin, reason=reason
            )
        )
        nothing = f"{reviewer} holds no items"
    # db.queue reported each release, and in_unit emitted the reports after its COMMIT.
    if not released:
        typer.echo(f"review-queue: {nothing}; nothing released", err=True)
        raise typer.Exit(1)
    for o in released:
        typer.echo(f"released {o.item.id} (held by {o.previous_holder}): PENDING")
    typer.echo(f"released {len(released)} item(s)")


@admin_app.command("reassign")
def admin_reassign(
    item: Annotated[UUID, typer.Argument(help="The ASSIGNED item to move.")],
    to: Annotated[
        str, typer.Option("--to", callback=subject_option, help="The reviewer who takes the lease over.")
    ],
    reason: AdminReason,
    admin: AdminName,
) -> None:
    """Move an item's lease to another reviewer, with a new token.

    A full lease from now; the old holder's token is refused from then on."""
    from db import queue

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    outcome, done, current = in_unit(
        lambda unit: queue.reassign_item(
            unit,
            item_id=item,
            to_reviewer=to,
            actor=admin,
            reason=reason,
            lease_duration=timedelta(milliseconds=settings.lock_timeout_ms),
            cap=settings.max_leases_per_reviewer,
        )
    )
    if done is None:
        why = {
            "not_found": f"no item {item}",
            "already_held": f"{to} already holds item {item}",
            "not_a_reviewer": f"{to!r} has no live token of a role that can take this lease",
            "segregation_of_duties": f"{to} prepared the proposal of item {item}: another approver decides",
            "at_cap": f"{to} already holds as many items as anyone may",
        }.get(outcome, f"item {item} is {current.state if current else 'gone'}, not ASSIGNED")
        typer.echo(f"review-queue: {why}; nothing reassigned", err=True)
        raise typer.Exit(1)
    typer.echo(f"reassigned {item} from {done.previous_holder} to {to}")
