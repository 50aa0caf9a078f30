"""db/sql/ is the current text of every function and trigger the migrations made (as Procrastinate's
schema.sql check): the migrated database has a file for each of them and nothing else, and running
every file over it changes no definition (each file is the database's body, compared as PostgreSQL
prints them, in a transaction rolled back). Its grants, row security and policies equal the committed
snapshot db/sql/privileges.txt. docs/architecture.md says the rule these hold."""

import difflib
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

SQL = Path(__file__).resolve().parents[3] / "db" / "sql"
FUNCTIONS = SQL / "functions"
TRIGGERS = SQL / "triggers"
PRIVILEGES = SQL / "privileges.txt"
# Set to write db/sql/privileges.txt from the migrated database (the test then fails: read the diff).
WRITE_SNAPSHOT = "REVIEW_QUEUE_WRITE_PRIVILEGES"

# Our functions (an extension's are its own), by signature, as PostgreSQL prints them.
_FUNCTIONS = """
SELECT p.oid::regprocedure::text, p.proname, pg_get_functiondef(p.oid)
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = 'public' AND p.prokind IN ('f', 'p')
  AND NOT EXISTS (SELECT FROM pg_depend d
                  WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e')
"""
# Every trigger but the constraints' own. A partition's (the event trail's months) are made by
# review_queue_event_add_months() or cloned from its parent's: they are checked as that function's
# body and the parent's triggers, and which months exist depends on the day the database was made.
_TRIGGERS = """
SELECT c.relname || '.' || t.tgname, t.tgname, c.relispartition, pg_get_triggerdef(t.oid)
FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND NOT t.tgisinternal
"""
# Who may do what, on tables, views and sequences (and their columns), functions and the schema;
# row security and the policies. Partitions left out, as above; PUBLIC is the grantee 0.
_PRIVILEGES = """
WITH relation AS (
    SELECT c.* FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S') AND NOT c.relispartition
), granted AS (
    SELECT 'relation ' || r.relname AS object, a.grantee, a.privilege_type, a.is_grantable
    FROM relation r, aclexplode(r.relacl) a
    UNION ALL
    SELECT 'column ' || r.relname || '.' || att.attname, a.grantee, a.privilege_type, a.is_grantable
    FROM relation r JOIN pg_attribute att ON att.attrelid = r.oid, aclexplode(att.attacl) a
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text, a.grantee, a.privilege_type, a.is_grantable
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,
         aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
    WHERE n.nspname = 'public'
    UNION ALL
    SELECT 'schema public', a.grantee, a.privilege_type, a.is_grantable
    FROM pg_namespace n, aclexplode(coalesce(n.nspacl, acldefault('n', n.nspowner))) a
    WHERE n.nspname = 'public'
)
SELECT format('grant %s: %s %s%s', g.object, coalesce(r.rolname, 'PUBLIC'), g.privilege_type,
              CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
FROM granted g LEFT JOIN pg_roles r ON r.oid = g.grantee
UNION ALL
SELECT format('row security %s: %s%s', relname, relrowsecurity,
              CASE WHEN relforcerowsecurity THEN ' forced' ELSE '' END)
FROM relation WHERE relkind IN ('r', 'p') AND (relrowsecurity OR relforcerowsecurity)
UNION ALL
SELECT format('policy %s.%s: %s %s to %s using (%s) with check (%s)', tablename, policyname, permissive,
              cmd, roles, qual, with_check)
FROM pg_policies WHERE schemaname = 'public'
"""


@pytest.fixture
def rolled_back(sql: psycopg.Connection) -> Iterator[psycopg.Connection]:
    """The migrated database in a transaction that is rolled back, whatever the test ran in it."""
    with sql.transaction(force_rollback=True):
        yield sql


def _functions(conn: psycopg.Connection) -> dict[str, tuple[str, str]]:
    return {signature: (name, body) for signature, name, body in conn.execute(_FUNCTIONS)}


def _triggers(conn: psycopg.Connection) -> dict[str, tuple[str, bool, str]]:
    return {key: (name, partition, body) for key, name, partition, body in conn.execute(_TRIGGERS)}


def _files(folder: Path) -> dict[str, str]:
    return {path.stem: path.read_text() for path in sorted(folder.glob("*.sql"))}


def _run_every_file(conn: psycopg.Connection) -> None:
    for text in [*_files(FUNCTIONS).values(), *_files(TRIGGERS).values()]:
        conn.execute(text.encode())  # bytes: no placeholders, a `%` in a body stays as it is


def _privileges(conn: psycopg.Connection) -> str:
    return "".join(f"{line}\n" for (line,) in sorted(conn.execute(_PRIVILEGES).fetchall()))


def test_every_function_and_trigger_has_a_file_and_every_file_one(
    rolled_back: psycopg.Connection,
) -> None:
    functions = {name for name, _ in _functions(rolled_back).values()}
    triggers = {name for name, partition, _ in _triggers(rolled_back).values() if not partition}
    assert set(_files(FUNCTIONS)) == functions
    assert set(_files(TRIGGERS)) == triggers
    assert len(functions) >= 14 and len(triggers) >= 10


def test_each_file_is_the_migrated_databases_definition(rolled_back: psycopg.Connection) -> None:
    """Running every file leaves every definition as the migrations made it: a file whose body, or
    signature, or trigger, differs from the database's changes (or adds) one."""
    functions, triggers = _functions(rolled_back), _triggers(rolled_back)
    _run_every_file(rolled_back)
    assert _functions(rolled_back) == functions
    assert _triggers(rolled_back) == triggers


def test_a_file_that_drifted_from_the_database_is_seen(rolled_back: psycopg.Connection) -> None:
    """The comparison is not vacuous: a body changed by one word, or a trigger on other events,
    changes what the database holds once the files have run."""
    functions, triggers = _functions(rolled_back), _triggers(rolled_back)
    body = (FUNCTIONS / "review_queue_event_lease_start.sql").read_text()
    rolled_back.execute(body.replace("ORDER BY l.id DESC", "ORDER BY l.id ASC").encode())
    trigger = (TRIGGERS / "review_queue_reopened_item.sql").read_text()
    rolled_back.execute(trigger.replace("AFTER INSERT", "AFTER INSERT OR UPDATE").encode())
    changed = _functions(rolled_back)
    assert changed != functions
    assert [s for s in functions if changed[s] != functions[s]] == ["review_queue_event_lease_start()"]
    assert (
        _triggers(rolled_back)["review_queue_event.review_queue_reopened_item"]
        != (triggers["review_queue_event.review_queue_reopened_item"])
    )


def test_grants_row_security_and_policies_equal_the_snapshot(rolled_back: psycopg.Connection) -> None:
    current = _privileges(rolled_back)
    if os.environ.get(WRITE_SNAPSHOT):
        PRIVILEGES.write_text(current)
        pytest.fail(f"{PRIVILEGES} written from the migrated database: review the diff, commit it")
    committed = PRIVILEGES.read_text()
    diff = "".join(
        difflib.unified_diff(committed.splitlines(True), current.splitlines(True), "snapshot", "database")
    )
    assert current == committed, f"a migration changed who may do what; if meant, {WRITE_SNAPSHOT}=1:\n{diff}"


def test_a_changed_grant_is_seen(rolled_back: psycopg.Connection) -> None:
    before = _privileges(rolled_back)
    assert "grant relation review_queue_item: review_queue_app SELECT\n" in before
    rolled_back.execute("REVOKE SELECT ON review_queue_item FROM review_queue_app")
    assert _privileges(rolled_back) != before
