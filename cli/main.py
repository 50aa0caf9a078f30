"""The `review-queue` command: serve, migrate, tokens, reclaim, deliver webhooks."""

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from decimal import Decimal
from enum import StrEnum
from typing import Annotated, Any, TypeVar
from uuid import UUID

import psycopg
import typer
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.exc import TimeoutError as SATimeoutError
from sqlalchemy.ext.asyncio import AsyncConnection
from typer.core import TyperGroup

from api.logs import configure_logging
from api.settings import Settings, get_settings, hide_password
from db import tokens
from db.engine import create_engine, database_url, libpq_url, migration_url, unit_of_work
from db.errors import DatabaseUnavailable
from db.migrations import MigrationRefused, upgrade_head
from db.unit import Transaction


class _Commands(TyperGroup):
    """Lists each command with the whole first paragraph of its help, a one-line summary: click
    would cut it at its first period ("Create a token.") or at the terminal's width ("...")."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            if command.short_help is None and command.help:
                command.short_help = " ".join(command.help.split("\n\n")[0].split())


def _typer(help_: str | None) -> typer.Typer:
    # Plain help (rich_markup_mode=None): the rich panels of this Typer print `<bool>` after every flag.
    return typer.Typer(
        no_args_is_help=True, add_completion=False, help=help_, rich_markup_mode=None, cls=_Commands
    )


app = _typer(__doc__)
token_app = _typer("Create, revoke and list API tokens.")
app.add_typer(token_app, name="token")
audit_app = _typer("The audit trail's hash chain: seal, head, verify, export.")
app.add_typer(audit_app, name="audit")
resolutions_app = _typer("The resolution catalogue and the materiality policy.")
app.add_typer(resolutions_app, name="resolutions")
admin_app = _typer("An admin's override of leases: release or reassign them.")
app.add_typer(admin_app, name="admin")
webhooks_app = typer.Typer(
    no_args_is_help=True, help="Webhooks: the deliverer's key for secrets at rest.", rich_markup_mode=None
)
app.add_typer(webhooks_app, name="webhooks")

T = TypeVar("T")


class Role(StrEnum):
    reviewer = "reviewer"
    approver = "approver"
    ingest = "ingest"
    auditor = "auditor"
    admin = "admin"
    integration = "integration"


def resolved_url(settings: Settings) -> str:
    return database_url(settings.database_url, settings.data_dir)


def owner_url(settings: Settings) -> str:
    return migration_url(settings.migration_database_url, settings.database_url, settings.data_dir)


def migrate_to_head(settings: Settings) -> None:
    upgrade_head(owner_url(settings), app_role=settings.app_role)


def in_transaction(fn: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """Run fn in one committed transaction on a short-lived engine."""
    return in_unit(lambda unit: fn(unit.connection))


def in_unit(fn: Callable[[Transaction], Awaitable[T]]) -> T:
    """Run fn in one committed unit of work (what db.queue's functions take) on a short-lived
    engine; the reports of its changes are emitted after its COMMIT."""
    settings = get_settings()

    async def run() -> T:
        engine = create_engine(resolved_url(settings), pool_size=1, max_overflow=0)
        try:
            async with unit_of_work(
                engine,
                lock_timeout_ms=settings.pg_lock_timeout_ms,
                statement_timeout_ms=settings.statement_timeout_ms,
            ) as unit:
                return await fn(unit)
        finally:
            await engine.dispose()

    return asyncio.run(run())


@app.command()
def migrate() -> None:
    """Bring the schema to head (alembic upgrade head)."""
    migrate_to_head(get_settings())
    typer.echo("schema is at head")


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


def _subject(value: str) -> str:
    try:
        return tokens.check_subject(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None


@token_app.command("create")
def token_create(
    subject: Annotated[
        str,
        typer.Option(
            callback=_subject,
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
        actor = _subject(admin)
        policy = in_transaction(
            lambda conn: catalogue.put_policy(conn, materiality_threshold=threshold, actor=actor)
        )
    by = f" by {policy.updated_by}" if policy.updated_by else ""
    typer.echo(
        f"materiality threshold {policy.materiality_threshold:.2f}: every completion at or above it needs"
        f" an approver (set {policy.updated_at:%Y-%m-%d %H:%M}{by})"
    )


def _reason(value: str) -> str:
    if not 1 <= len(value) <= 500 or "\x00" in value:
        raise typer.BadParameter("1-500 characters (kept in the audit trail)")
    return value


AdminName = Annotated[
    str, typer.Option("--admin", callback=_subject, help="Who is doing this: the audit trail's actor.")
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
        str, typer.Option("--to", callback=_subject, help="The reviewer who takes the lease over.")
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


@app.command()
def reclaim(
    once: Annotated[
        bool, typer.Option("--once", help="Run one drain and exit (the default).", show_default=False)
    ] = True,
) -> None:
    """Return expired leases to the queue now; print how many.

    Drains batch after batch until none is left."""
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    count = asyncio.run(reclaimer.drain_once(settings, resolved_url(settings)))
    typer.echo(f"reclaimed {count}")


@app.command("reclaimer")
def reclaimer_loop() -> None:
    """Reclaim expired leases every interval until SIGTERM or SIGINT.

    The interval is REVIEW_QUEUE_RECLAIM_INTERVAL_S."""
    # A stop signal before the loop installs its own handlers (while the embedded server starts,
    # say) is still a clean stop, not a KeyboardInterrupt traceback and exit 130.
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(reclaimer.run_forever(settings, resolved_url(settings), stop))


@app.command("deliverer")
def deliverer_loop() -> None:
    """Deliver webhooks from the change feed until SIGTERM or SIGINT.

    Any number may run: each claims a subscription at a time."""
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    from cli import deliverer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    asyncio.run(deliverer.run_forever(settings, resolved_url(settings), stop))


@webhooks_app.command("key")
def webhooks_key() -> None:
    """Print a new Fernet key for REVIEW_QUEUE_WEBHOOK_KEY.

    To rotate, put the new key before the old one (comma-separated)."""
    from cryptography.fernet import Fernet

    typer.echo(Fernet.generate_key().decode())


@audit_app.command("seal")
def audit_seal(
    once: Annotated[
        bool, typer.Option("--once", help="Seal what is ready and exit (the default).", show_default=False)
    ] = True,
) -> None:
    """Chain every event of a finished transaction now.

    The reclaimer does it every interval."""
    from cli import reclaimer

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    count = asyncio.run(reclaimer.seal_once(settings, resolved_url(settings)))
    typer.echo(f"sealed {count}")


@audit_app.command("head")
def audit_head() -> None:
    """Print the chain's head as SEQ:HASH, to store outside the database."""
    from db import audit, chain

    seq, digest = in_transaction(audit.head)
    typer.echo(chain.format_head(seq, digest))


@audit_app.command("verify")
def audit_verify(
    against: Annotated[
        str | None, typer.Option(help="SEQ:HASH from `audit head`: the history up to it must be unchanged.")
    ] = None,
    file: Annotated[
        str | None, typer.Option(help="Verify this export instead, with no database access.")
    ] = None,
) -> None:
    """Recompute the chain; exit 1 naming the first broken seq.

    Exit 0 when intact. With --file, a file that holds no line at all exits 1 too: nothing was
    verified."""
    import time

    from db import chain

    try:
        head = chain.parse_head(against) if against else None
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="--against") from None
    if file is not None:
        started = time.perf_counter()
        result = chain.verify_lines(chain.iter_file(file), against=head)
        if result.events == 0 and result.broken is None:
            # An empty file proves nothing; "intact" would read as a clean audit.
            typer.echo(f"NOTHING VERIFIED: {file} holds no export lines", err=True)
            raise typer.Exit(1)
        seconds, events, broken = time.perf_counter() - started, result.events, result.broken
        scope = "no events"
        if result.last_seq is not None and result.last_hash is not None:
            last = chain.format_head(result.last_seq, result.last_hash)
            scope = f"seq {result.first_seq}..{result.last_seq}, head {last}"
    else:
        import psycopg

        from db import audit

        with psycopg.connect(libpq_url(resolved_url(get_settings()))) as conn:
            outcome = audit.verify(conn, against=head)
        seconds, events, broken = outcome.seconds, outcome.events, outcome.broken
        scope = f"head {chain.format_head(outcome.head_seq, outcome.head_hash)}"
    rate = events / seconds if seconds > 0 else 0.0
    typer.echo(f"verified {events} events in {seconds:.2f} s ({rate:,.0f} events/s); {scope}")
    if broken is not None:
        typer.echo(f"BROKEN at {broken}", err=True)
        raise typer.Exit(1)
    typer.echo("intact" + (f", and matches {against}" if against else ""))


@audit_app.command("export")
def audit_export(
    file: Annotated[str, typer.Option(help="Write the NDJSON here.")],
    first: Annotated[int, typer.Option("--from", min=1, help="First seq.")] = 1,
    last: Annotated[int | None, typer.Option("--to", min=1, help="Last seq (default: the head).")] = None,
) -> None:
    """Write the chain from --from to --to as NDJSON, like the API.

    The same lines as GET /audit/export."""
    from db import audit

    upto = last if last is not None else 2**63 - 1

    with open(file, "wb") as out:

        async def write(conn: AsyncConnection) -> int:
            # One transaction for every page: no pool to keep free here.
            at: audit.ExportPosition | None = await audit.export_start(conn, first=first, last=upto)
            size = 0
            while at is not None:
                chunk, at = await audit.export_page(conn, at=at)
                out.write(chunk)
                size += chunk.count(b"\n")
            return size

        count = in_transaction(write)
    typer.echo(f"exported {count} events to {file}")


@app.command()
def stats() -> None:
    """Print queue depth, age, leases, overdue items and aging.

    Leases in flight, overdue items, and the aging of open items by bucket."""
    from datetime import timedelta

    from db import stats as queue_stats

    settings = get_settings()

    async def read(
        conn: AsyncConnection,
    ) -> tuple[queue_stats.QueueGauges, int, dict[str, int], dict[str, int], dict[str, int]]:
        gauges = await queue_stats.queue_gauges(conn, grace=timedelta(seconds=settings.reclaim_after_s))
        return (
            gauges,
            await queue_stats.resolved_count(conn),
            await queue_stats.open_leases_by_reviewer(conn),
            await queue_stats.aging(conn),
            await queue_stats.overdue_by_ledger_entity(conn),
        )

    gauges, resolved, by_reviewer, aging, overdue_by_entity = in_transaction(read)
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
    for label, value in rows:
        typer.echo(f"{label:<26} {value}")


def _check_port_free(host: str, port: int) -> None:
    """Fail before anything is printed or started when the port is taken (a second `make run`)."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port in TIME_WAIT after a restart still counts as free.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as error:
            typer.echo(
                f"review-queue: cannot listen on {host}:{port}: {error.strerror or error}. Is another"
                f" review-queue (make run) running? Stop it, or choose another port: PORT={port + 1}"
                " make run (or serve --port).",
                err=True,
            )
            raise SystemExit(1) from None


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default HOST or 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default PORT or 8000).")] = None,
    workers: Annotated[int | None, typer.Option(help="Uvicorn worker processes.")] = None,
    with_reclaimer: Annotated[
        bool, typer.Option("--reclaimer/--no-reclaimer", help="Run the reclaimer as a child process.")
    ] = True,
    with_deliverer: Annotated[
        bool, typer.Option("--deliverer/--no-deliverer", help="Run the webhook deliverer as a child process.")
    ] = True,
) -> None:
    """Migrate, then serve the API beside a reclaimer and a deliverer.

    On the embedded database, dev tokens are printed first."""
    import shutil
    import subprocess
    import tempfile

    import uvicorn

    from api import webhook_secret
    from cli import devtokens

    settings = get_settings()
    host, port = host or settings.host, port or settings.port
    _check_port_free(host, port)
    migrate_to_head(settings)
    url = resolved_url(settings)
    _warn_if_privileged(url)
    if settings.database_url is None:
        devtokens.ensure_and_print(url, settings.data_dir, host, port)
    # Workers and the reclaimer child must reach the same database without starting their own
    # embedded server, and write their counters where one /metrics scrape sums them all.
    os.environ["DATABASE_URL"] = url
    # The embedded database's webhook key (kept in the data directory), for the workers and the
    # deliverer, which now see a DATABASE_URL.
    if (key := webhook_secret.keys(settings)) is not None:
        os.environ["REVIEW_QUEUE_WEBHOOK_KEY"] = key
    metrics_dir = None
    if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
        metrics_dir = tempfile.mkdtemp(prefix="review-queue-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    get_settings.cache_clear()
    _raise_open_file_limit()
    children = [
        subprocess.Popen([sys.executable, "-m", "cli", command])  # noqa: S603 - our own commands
        for command, wanted in (("reclaimer", with_reclaimer), ("deliverer", with_deliverer))
        if wanted
    ]
    # uvicorn re-raises SIGTERM after its graceful shutdown; exiting through SystemExit
    # instead runs the cleanup below and lets atexit stop the embedded server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        uvicorn.run(
            "api.app:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers or settings.workers,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=20,
            proxy_headers=bool(settings.forwarded_allow_ips),
            forwarded_allow_ips=settings.forwarded_allow_ips or None,
        )
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=20)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


def _database_target(settings: Settings) -> str:
    if settings.database_url is None:
        return f"the embedded PostgreSQL in {settings.data_dir / 'pg'}"
    try:
        url = make_url(settings.database_url)
    except ArgumentError:
        return hide_password(settings.database_url)
    socket_dir = url.query.get("host")
    host = socket_dir if isinstance(socket_dir, str) else url.host or "localhost"
    return f"PostgreSQL at {host}:{url.port or 5432} (database {url.database or url.username or '?'})"


def database_failure(error: BaseException, settings: Settings) -> str | None:
    """One line for an operator when `error` means the database could not be used, else None."""
    driver = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    if isinstance(driver, psycopg.errors.UndefinedTable):
        return (
            f"review-queue: {_database_target(settings)} has no review-queue schema ({driver}); run"
            " `review-queue migrate` (or make migrate) first, or check DATABASE_URL."
        )
    if not isinstance(driver, psycopg.OperationalError | DatabaseUnavailable | SATimeoutError):
        return None
    reason = next((line.strip() for line in str(driver).splitlines() if line.strip()), type(driver).__name__)
    return (
        f"review-queue: cannot use {_database_target(settings)}: {reason}. Check that the server is"
        " running and reachable from here and that DATABASE_URL (host, port, user, password, database)"
        " is right; REVIEW_QUEUE_LOG_LEVEL=DEBUG shows the traceback."
    )


def _warn_if_privileged(url: str) -> None:
    """The audit trail's append-only promise holds against the application role only."""
    import psycopg

    with psycopg.connect(libpq_url(url)) as conn:
        superuser, owner = conn.execute(
            "SELECT rolsuper, pg_has_role(current_user, (SELECT tableowner FROM pg_tables"
            " WHERE tablename = 'review_queue_event'), 'MEMBER') FROM pg_roles WHERE rolname = current_user"
        ).fetchone() or (False, False)
    if superuser or owner:
        typer.echo(
            "warning: DATABASE_URL's role owns the tables or is a superuser, so it could edit the audit"
            " trail; serve as an application role (docs/security.md)",
            err=True,
        )


def _raise_open_file_limit() -> None:
    # uvicorn never closes a connection that has not sent a complete request head, so idle or
    # half-open sockets last until the client goes; the open-file limit is the ceiling. Take the
    # hard limit (production runs behind a proxy with header timeouts: docs/security.md).
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )


def main() -> None:
    try:
        app()
    except MigrationRefused as error:
        typer.echo(f"review-queue: the migration stopped: {error}", err=True)
        sys.exit(1)
    except Exception as error:
        settings = get_settings()
        message = database_failure(error, settings)
        if message is None or settings.log_level == "DEBUG":
            raise
        typer.echo(message, err=True)
        sys.exit(1)
