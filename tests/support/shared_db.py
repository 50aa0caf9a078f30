"""One database per test worker, reset after each test instead of cloned for it (River's test
schemas are reused and truncated the same way, riverdbtest.go).

The reset is one call of rq_test.reset(), installed in that database only: it truncates the data
tables a test wrote (RESTART IDENTITY), puts back the rows the migrations seed when a test changed
them, and rewinds the sequences. It also says when a test changed what a reset cannot put back (the
schema, grants, the database's settings): an event trigger logs every DDL statement, and such a
test must ask for a database of its own with @pytest.mark.fresh_db("why")."""

import psycopg

from db import roles
from tests.support.postgres import admin_sql, libpq, with_database

SCHEMA = "rq_test"

# Installed once, as the superuser, in the worker's database (never in the template: the clones
# the fresh_db tests get carry none of it).
_INSTALL = f"""
CREATE SCHEMA {SCHEMA};
REVOKE ALL ON SCHEMA {SCHEMA} FROM PUBLIC;
CREATE TABLE {SCHEMA}.ddl (what text NOT NULL);

CREATE FUNCTION {SCHEMA}.log_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO {SCHEMA}.ddl
    SELECT command_tag || ' ' || coalesce(object_identity, '') FROM pg_event_trigger_ddl_commands()
    WHERE coalesce(schema_name, '') NOT LIKE 'pg\\_temp%';
END $$;
CREATE FUNCTION {SCHEMA}.log_drop() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    INSERT INTO {SCHEMA}.ddl
    SELECT 'DROP ' || object_type || ' ' || coalesce(object_identity, '')
    FROM pg_event_trigger_dropped_objects() WHERE NOT is_temporary;
END $$;
CREATE EVENT TRIGGER rq_test_ddl ON ddl_command_end EXECUTE FUNCTION {SCHEMA}.log_ddl();
CREATE EVENT TRIGGER rq_test_drop ON sql_drop EXECUTE FUNCTION {SCHEMA}.log_drop();

-- The data tables (partitions are truncated through their parent), and for those the migrations
-- seed, a copy of the rows and their fingerprint.
CREATE FUNCTION {SCHEMA}.fingerprint(tbl regclass) RETURNS text LANGUAGE plpgsql AS $$
DECLARE result text;
BEGIN
    EXECUTE format('SELECT md5(coalesce(string_agg(t::text, '','' ORDER BY t::text), '''')) FROM %s t', tbl)
    INTO result;
    RETURN result;
END $$;
CREATE TABLE {SCHEMA}.data_table AS
SELECT c.oid::regclass AS tbl, NULL::text AS fingerprint, NULL::regclass AS copy
FROM pg_class c
WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> 'alembic_version';
CREATE TABLE {SCHEMA}.sequence AS
SELECT format('%I.%I', schemaname, sequencename)::regclass AS seq, last_value, start_value
FROM pg_sequences WHERE schemaname = 'public';

DO $$
DECLARE r record; seeded boolean;
BEGIN
    FOR r IN SELECT tbl FROM {SCHEMA}.data_table LOOP
        EXECUTE format('SELECT EXISTS (SELECT FROM %s)', r.tbl) INTO seeded;
        IF seeded THEN
            EXECUTE format('CREATE TABLE {SCHEMA}.%I AS TABLE %s', 'seed_' || r.tbl::text, r.tbl);
            UPDATE {SCHEMA}.data_table
            SET fingerprint = {SCHEMA}.fingerprint(r.tbl),
                copy = format('{SCHEMA}.%I', 'seed_' || r.tbl::text)::regclass
            WHERE tbl = r.tbl;
        END IF;
    END LOOP;
END $$;

-- What a test left behind, undone; returns what it changed that a reset cannot undo (NULL: nothing).
CREATE FUNCTION {SCHEMA}.reset() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r record;
    dirty text[] := '{{}}';
    written boolean;
    changed text;
BEGIN
    SELECT string_agg(DISTINCT what, '; ') INTO changed FROM {SCHEMA}.ddl;
    SELECT concat_ws('; ', changed, string_agg('ALTER ... SET ' || array_to_string(setconfig, ', '), '; '))
    INTO changed
    FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database());
    IF changed = '' THEN
        changed := NULL;
    END IF;
    -- The append-only guards (BEFORE TRUNCATE triggers) and the foreign keys' triggers stand down
    -- for this transaction only; this is the harness, not the service.
    PERFORM set_config('session_replication_role', 'replica', true);
    FOR r IN SELECT * FROM {SCHEMA}.data_table LOOP
        IF r.copy IS NULL THEN
            EXECUTE format('SELECT EXISTS (SELECT FROM %s)', r.tbl) INTO written;
        ELSE
            written := {SCHEMA}.fingerprint(r.tbl) <> r.fingerprint;
        END IF;
        IF written THEN
            dirty := dirty || r.tbl::text;
        END IF;
    END LOOP;
    IF cardinality(dirty) > 0 THEN
        EXECUTE 'TRUNCATE ' || array_to_string(dirty, ', ') || ' RESTART IDENTITY CASCADE';
        FOR r IN SELECT * FROM {SCHEMA}.data_table WHERE copy IS NOT NULL LOOP
            IF {SCHEMA}.fingerprint(r.tbl) <> r.fingerprint THEN
                EXECUTE format('DELETE FROM %s', r.tbl);
                EXECUTE format('INSERT INTO %s OVERRIDING SYSTEM VALUE SELECT * FROM %s', r.tbl, r.copy);
            END IF;
        END LOOP;
    END IF;
    PERFORM CASE WHEN s.last_value IS NULL THEN setval(s.seq, s.start_value, false)
                 ELSE setval(s.seq, s.last_value, true) END
    FROM {SCHEMA}.sequence s
    JOIN pg_sequences p ON format('%I.%I', p.schemaname, p.sequencename)::regclass = s.seq
    WHERE p.last_value IS DISTINCT FROM s.last_value;
    DELETE FROM {SCHEMA}.ddl;
    RETURN changed;
END $$;
"""


class SharedDatabase:
    """The worker's database: cloned from the template once, reset after every test that used it.
    `conn` is the worker's own superuser connection (tokens, the reset)."""

    def __init__(self, server_url: str, template_db: str, name: str) -> None:
        self.server_url, self.template_db, self.name = server_url, template_db, name
        self.generation = 0  # bumped whenever the database is created anew
        self.conn = self._create()

    def _create(self) -> psycopg.Connection:
        admin_sql(self.server_url, f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
        admin_sql(
            self.server_url,
            f"CREATE DATABASE {self.name} TEMPLATE {self.template_db} OWNER {roles.OWNER_ROLE}",
        )
        conn = psycopg.connect(libpq(with_database(self.server_url, self.name)), autocommit=True)
        conn.execute(_INSTALL)
        conn.execute("DELETE FROM rq_test.ddl")
        conn.execute("SET lock_timeout = '5s'")
        self.generation += 1
        return conn

    def reset(self) -> str | None:
        """Undo what the last test wrote; what it changed that cannot be undone (the database is
        then created anew), or None."""
        try:
            changed = self.conn.execute("SELECT rq_test.reset()").fetchone()
        except psycopg.errors.LockNotAvailable:
            # A connection the test left open in a transaction holds a lock on a table: it is
            # the test's leftover, not the next test's business.
            self.conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            changed = self.conn.execute("SELECT rq_test.reset()").fetchone()
        except psycopg.OperationalError:
            if not self.conn.broken:
                raise
            # The test ended every session of the database, this one too: what it left cannot be
            # known, so the database is created anew (not every later test failing on a dead
            # connection), and the test is told to ask for its own.
            self.recreate()
            return "ended the database's sessions, the harness's own too"
        if changed is None or changed[0] is None:
            return None
        self.recreate()
        return str(changed[0])

    def recreate(self) -> None:
        self.conn.close()
        self.conn = self._create()

    def close(self) -> None:
        self.conn.close()
        admin_sql(self.server_url, f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")
