"""What every command group shares: the Typer group that prints whole summaries, the database
URLs, and one committed transaction per command."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncConnection
from typer.core import TyperGroup

from api.settings import Settings, get_settings
from db import tokens
from db.engine import create_engine, database_url, migration_url, unit_of_work
from db.migrations import upgrade_head
from db.unit import Transaction


class _Commands(TyperGroup):
    """Lists each command with the whole first paragraph of its help, a one-line summary: click
    would cut it at its first period ("Create a token.") or at the terminal's width ("...")."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        for command in self.commands.values():
            if command.short_help is None and command.help:
                command.short_help = " ".join(command.help.split("\n\n")[0].split())


def command_group(help_: str | None) -> typer.Typer:
    # Plain help (rich_markup_mode=None): the rich panels of this Typer print `<bool>` after every flag.
    return typer.Typer(
        no_args_is_help=True, add_completion=False, help=help_, rich_markup_mode=None, cls=_Commands
    )


T = TypeVar("T")


def resolved_url(settings: Settings) -> str:
    return database_url(settings.database_url, settings.data_dir, settings.db_liveness)


def owner_url(settings: Settings) -> str:
    return migration_url(
        settings.migration_database_url, settings.database_url, settings.data_dir, settings.db_liveness
    )


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


def subject_option(value: str) -> str:
    try:
        return tokens.check_subject(value)
    except ValueError as error:
        raise typer.BadParameter(str(error)) from None
