"""`review-queue token`: create, revoke and list API tokens."""

import re
from datetime import timedelta
from enum import StrEnum
from typing import Annotated

import typer

from cli.common import command_group, in_transaction, subject_option
from db import tokens

token_app = command_group("Create, revoke and list API tokens.")


class Role(StrEnum):
    reviewer = "reviewer"
    approver = "approver"
    ingest = "ingest"
    auditor = "auditor"
    admin = "admin"
    integration = "integration"


_DURATION = re.compile(r"([1-9][0-9]{0,5})([mhdw])")
_UNIT = {"m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_duration(value: str) -> timedelta:
    """`90m`, `12h`, `30d`, `8w`: 1 minute to 10 years."""
    match = _DURATION.fullmatch(value.strip())
    duration = timedelta(**{_UNIT[match[2]]: int(match[1])}) if match else None
    if duration is None or not timedelta(minutes=1) <= duration <= timedelta(days=3653):
        raise typer.BadParameter(
            f"{value!r}: a number and m, h, d or w (90m, 12h, 30d, 8w), 1 minute to 10 years"
        )
    return duration


def _human(duration: timedelta) -> str:
    minutes = int(duration.total_seconds()) // 60
    for size, unit in ((7 * 24 * 60, "week"), (24 * 60, "day"), (60, "hour"), (1, "minute")):
        if minutes % size == 0:
            count = minutes // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    raise AssertionError("unreachable: a whole number of minutes")


@token_app.command("create")
def token_create(
    subject: Annotated[
        str,
        typer.Option(
            callback=subject_option,
            help="Who the token speaks for; written to leased_by. 1-128 letters, digits, . _ @ + -;"
            " not me, reclaimer or reclaimer@...",
        ),
    ],
    role: Annotated[
        Role,
        typer.Option(help="reviewer, approver, ingest, auditor, admin or integration (the change feed)."),
    ],
    expires_in: Annotated[
        timedelta | None,
        typer.Option(
            parser=parse_duration,
            metavar="DURATION",
            help="Expire this long from now: 90m, 12h, 30d, 8w (1 minute to 10 years). Default: never.",
        ),
    ] = None,
) -> None:
    """Create a token; it is printed once and never stored.

    The token is alone on the last line of the output; only its sha256 is kept."""
    token = in_transaction(
        lambda conn: tokens.create_token(conn, subject=subject, role=role.value, expires_in=expires_in)
    )
    until = f", expiring in {_human(expires_in)}" if expires_in else ""
    article = "an" if role.value[0] in "aeiou" else "a"
    typer.echo(f"created {article} {role.value} token for {subject}{until}:")
    typer.echo(token)


@token_app.command("revoke")
def token_revoke(
    subject: Annotated[str | None, typer.Option(help="Revoke every active token of this subject.")] = None,
    token_id: Annotated[
        int | None, typer.Option("--id", help="Revoke the token with this id (token list).")
    ] = None,
) -> None:
    """Revoke a subject's tokens, or one token by its id.

    Revoking nothing is an error (exit 1)."""
    if (subject is None) == (token_id is None):
        raise typer.BadParameter("give either --subject or --id")
    count = in_transaction(lambda conn: tokens.revoke_tokens(conn, subject=subject, token_id=token_id))
    which = f"of {subject}" if subject is not None else f"with id {token_id}"
    if count == 0:
        # A typo must not pass for a revocation.
        typer.echo(
            f"review-queue: no active token {which}; nothing revoked (see: review-queue token list)", err=True
        )
        raise typer.Exit(1)
    typer.echo(f"revoked {count} token(s) {which}")


@token_app.command("list")
def token_list() -> None:
    """List tokens (never the secrets), oldest first."""
    listed = in_transaction(tokens.list_tokens)
    typer.echo(f"{'ID':>5}  {'SUBJECT':<24} {'ROLE':<9} {'CREATED':<16}  {'EXPIRES':<16}  STATE")
    for info in listed:
        if info.revoked_at:
            state = f"revoked {info.revoked_at:%Y-%m-%d %H:%M}"
        else:
            state = "expired" if info.expired else "active"
        expires = f"{info.expires_at:%Y-%m-%d %H:%M}" if info.expires_at else "never"
        created = f"{info.created_at:%Y-%m-%d %H:%M}"
        typer.echo(f"{info.id:>5}  {info.subject:<24} {info.role:<9} {created:<16}  {expires:<16}  {state}")
