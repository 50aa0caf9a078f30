"""Migrations keep frozen copies of the SQL they run (docs/architecture.md): none reads db/sql/,
whose files change after a migration was written, so an old migration would create something else
than it did the day it ran."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
MIGRATIONS = sorted((REPO / "alembic" / "versions").glob("*.py"))


def reads_db_sql(source: str) -> bool:
    squeezed = "".join(source.split())
    return any(sign in squeezed for sign in ("db/sql", '"db","sql"', "'db','sql'", '/"sql"', "/'sql'"))


def test_no_migration_reads_the_current_sql_files() -> None:
    assert len(MIGRATIONS) >= 30
    assert [m.name for m in MIGRATIONS if reads_db_sql(m.read_text())] == []


def test_the_check_sees_a_migration_that_reads_them() -> None:
    assert reads_db_sql('op.execute((REPO / "db" / "sql" / "functions" / "f.sql").read_text())')
    assert reads_db_sql("op.execute(Path('db/sql/functions/f.sql').read_text())")
    assert not reads_db_sql('op.execute("CREATE OR REPLACE FUNCTION f() ...")')
