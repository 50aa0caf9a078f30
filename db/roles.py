"""The two database roles: an owner that runs migrations, and the role the service runs as.

The service's role owns nothing. It can read and write the queue's rows and append to the audit
trail, and nothing more: no UPDATE, DELETE or TRUNCATE of events, no DDL, so it can neither edit
the trail nor switch its trigger off. Migrations (run as the owner) grant exactly that.
"""

import psycopg

OWNER_ROLE = "review_queue_owner"  # the embedded default; any role that owns the schema will do
APP_ROLE = "review_queue_app"  # REVIEW_QUEUE_APP_ROLE: the role the migrations grant to


def ensure_roles(conn: psycopg.Connection, *, app_role: str = APP_ROLE, owner_role: str = OWNER_ROLE) -> None:
    """Create both login roles if missing (needs CREATEROLE; the embedded server and tests)."""
    # Several processes of one checkout start at once (serve, its reclaimer, a CLI call).
    conn.execute("SELECT pg_advisory_lock(hashtext('review_queue.roles'))")
    try:
        for role, options in ((owner_role, "LOGIN CREATEDB"), (app_role, "LOGIN")):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                conn.execute(
                    psycopg.sql.SQL("CREATE ROLE {} " + options).format(psycopg.sql.Identifier(role))
                )
    finally:
        conn.execute("SELECT pg_advisory_unlock(hashtext('review_queue.roles'))")


def ensure_database(conn: psycopg.Connection, name: str, *, owner_role: str = OWNER_ROLE) -> None:
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
        conn.execute(
            psycopg.sql.SQL("CREATE DATABASE {} OWNER {}").format(
                psycopg.sql.Identifier(name), psycopg.sql.Identifier(owner_role)
            )
        )
