"""`review-queue resolutions`: the resolution catalogue and the materiality policy."""

import re
from decimal import Decimal
from typing import Annotated

import typer

from cli.common import command_group, in_transaction, in_unit, subject_option

resolutions_app = command_group("The resolution catalogue and the materiality policy.")


_CODE = re.compile(r"[A-Z][A-Z0-9_]{0,63}")
_AMOUNT = re.compile(r"[0-9]{1,16}(\.[0-9]{1,2})?")


def _code(value: str) -> str:
    if not _CODE.fullmatch(value):
        raise typer.BadParameter("a code is A-Z, 0-9 and _, starting with a letter, at most 64 characters")
    return value


@resolutions_app.command("list")
def resolutions_list(
    all_: Annotated[bool, typer.Option("--all", help="Include deactivated codes.")] = False,
) -> None:
    """List the resolution codes (active ones unless --all)."""
    from db import queue

    codes = in_unit(lambda unit: queue.list_resolution_codes(unit, include_inactive=all_))
    # APPROVAL AT is what applies (the lower of the code's own threshold and materiality).
    typer.echo(f"{'CODE':<20} {'NOTE':<8} {'OWN':>14} {'APPROVAL AT':>20}  {'STATE':<8} LABEL")
    for c in codes:
        own = _amount_or_never(c.approval_threshold)
        applies = _amount_or_never(c.effective_approval_threshold)
        note = "required" if c.requires_note else "-"
        state = "active" if c.active else "inactive"
        typer.echo(f"{c.code:<20} {note:<8} {own:>14} {applies:>20}  {state:<8} {c.label}")


def _amount_or_never(amount: Decimal | None) -> str:
    return f"{amount:.2f}" if amount is not None else "never"


def _amount(value: str | None, param_hint: str) -> Decimal | None:
    if value is None:
        return None
    if not _AMOUNT.fullmatch(value):
        raise typer.BadParameter(
            "an amount like 10000.00 (no sign, at most 2 decimals)", param_hint=param_hint
        )
    return Decimal(value)


@resolutions_app.command("set")
def resolutions_set(
    code: Annotated[str, typer.Argument(help="The code, e.g. WRITE_OFF.", callback=_code)],
    label: Annotated[str, typer.Option(help="What people see.")],
    description: Annotated[str, typer.Option(help="When to use it.")] = "",
    requires_note: Annotated[
        bool, typer.Option("--requires-note/--no-note", help="A note is required.")
    ] = False,
    approval_threshold: Annotated[
        str | None,
        typer.Option(help="Needs an approver at or above this absolute amount, e.g. 10000.00; omit: never."),
    ] = None,
) -> None:
    """Create or update a code (active)."""
    from db import queue

    threshold = _amount(approval_threshold, "--approval-threshold")
    if not label.strip() or len(label) > 200:
        raise typer.BadParameter("1-200 characters", param_hint="--label")
    created, saved = in_unit(
        lambda unit: queue.put_resolution_code(
            unit,
            code=code,
            label=label,
            description=description,
            requires_note=requires_note,
            approval_threshold=threshold,
            active=True,
        )
    )
    typer.echo(f"{'created' if created else 'updated'} {saved.code}")


@resolutions_app.command("deactivate")
def resolutions_deactivate(
    code: Annotated[str, typer.Argument(help="The code to deactivate.", callback=_code)],
) -> None:
    """Deactivate a code: no new completion may use it.

    Decisions made with it keep it."""
    from db import queue

    saved = in_unit(lambda unit: queue.deactivate_resolution_code(unit, code=code))
    if saved is None:
        typer.echo(f"no resolution code {code}", err=True)
        raise typer.Exit(1)
    typer.echo(f"deactivated {code}")


@resolutions_app.command("policy")
def resolutions_policy(
    materiality_threshold: Annotated[
        str | None,
        typer.Option(
            help="Set it: every completion at or above this absolute amount needs an approver, whatever"
            " its code (unless the code's own threshold is lower), e.g. 10000.00. Omit to print it."
        ),
    ] = None,
    admin: Annotated[
        str | None, typer.Option("--admin", help="Who sets it (kept as updated_by); needed to set it.")
    ] = None,
) -> None:
    """Print or set the materiality threshold.

    Setting it needs --admin, the subject recorded as having changed it."""
    from db import catalogue

    threshold = _amount(materiality_threshold, "--materiality-threshold")
    if threshold is None:
        policy = in_transaction(catalogue.get_policy)
    elif admin is None:
        raise typer.BadParameter("say who sets it", param_hint="--admin")
    else:
        actor = subject_option(admin)
        policy = in_transaction(
            lambda conn: catalogue.put_policy(conn, materiality_threshold=threshold, actor=actor)
        )
    by = f" by {policy.updated_by}" if policy.updated_by else ""
    typer.echo(
        f"materiality threshold {policy.materiality_threshold:.2f}: every completion at or above it needs"
        f" an approver (set {policy.updated_at:%Y-%m-%d %H:%M}{by})"
    )
