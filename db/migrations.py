"""Alembic from code: the same migrations `alembic upgrade head` runs, and the head they reach."""

import importlib.util
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from alembic import command

# alembic.ini sits at the top of the source tree, beside alembic/ and db/ (api.settings.REPO_ROOT is
# the same directory; db/ does not import api/, which sits above it).
ALEMBIC_INI = Path(__file__).resolve().parent.parent / "alembic.ini"


class MigrationRefused(RuntimeError):
    """A migration that stops because the data needs a person's decision first; its message says
    which decision and how (the CLI prints it as one message, without a traceback)."""


def earlier_revision(filename: str) -> ModuleType:
    """An earlier revision's module, by its file name under alembic/versions: a downgrade puts back
    the function bodies it defined."""
    path = ALEMBIC_INI.parent / "alembic" / "versions" / filename
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def alembic_config(url: str, *, app_role: str | None = None) -> Config:
    """Alembic on `url` (the schema owner), granting the service's rights to `app_role`."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["configure_logging"] = False
    if app_role is not None:
        config.attributes["app_role"] = app_role
    return config


def upgrade_head(url: str, *, app_role: str | None = None) -> None:
    command.upgrade(alembic_config(url, app_role=app_role), "head")


@lru_cache
def head_revision() -> str | None:
    return ScriptDirectory.from_config(Config(str(ALEMBIC_INI))).get_current_head()


async def current_revision(conn: AsyncConnection) -> str | None:
    """The schema's Alembic revision, or None before the first migration."""
    exists = await conn.scalar(text("SELECT to_regclass('alembic_version') IS NOT NULL"))
    if not exists:
        return None
    revision: str | None = await conn.scalar(text("SELECT version_num FROM alembic_version"))
    return revision
