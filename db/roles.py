"""The database roles: an owner that runs migrations, the role the service runs as, and the sealer.

The service's role owns nothing. It can read and write the queue's rows and append to the audit
trail, and nothing more: no UPDATE, DELETE or TRUNCATE of events, no DDL, so it can neither edit
the trail nor switch its trigger off, and it writes no row of the hash chain: the sealer does,
a NOLOGIN role that owns the SECURITY DEFINER function `review_queue_seal` (the service may only
call it). Migrations (run as the owner) grant exactly that.
"""

import psycopg

OWNER_ROLE = "review_queue_owner"  # the embedded default; any role that owns the schema will do
APP_ROLE = "review_queue_app"  # REVIEW_QUEUE_APP_ROLE: the role the migrations grant to
SEALER_ROLE = "review_queue_sealer"  # NOLOGIN: owns review_queue_seal, the only writer of the chain


def ensure_roles(conn: psycopg.Connection, *, app_role: str = APP_ROLE, owner_role: str = OWNER_ROLE) -> None:
    """Create the two login roles and the sealer if missing, the sealer granted to the owner (who
    gives it the function it owns); needs a superuser (the embedded server and tests)."""
    # Several processes of one checkout start at once (serve, its reclaimer, a CLI call).
    conn.execute("SELECT pg_advisory_lock(hashtext('review_queue.roles'))")
    try:
        for role, options in ((owner_role, "LOGIN CREATEDB"), (app_role, "LOGIN"), (SEALER_ROLE, "NOLOGIN")):
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone() is None:
                conn.execute(
                    psycopg.sql.SQL("CREATE ROLE {} " + options).format(psycopg.sql.Identifier(role))
                )
        if not conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (owner_role, SEALER_ROLE)).fetchone()[0]:  # type: ignore[index]
            conn.execute(
                psycopg.sql.SQL("GRANT {} TO {}").format(
                    psycopg.sql.Identifier(SEALER_ROLE), psycopg.sql.Identifier(owner_role)
                )
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
