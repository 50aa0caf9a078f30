"""A real HA stack on 127.0.0.1 for the failover tests: one etcd member (Debian's etcd-server) and
two PostgreSQL nodes (the embedded package's PostgreSQL 18 binaries) managed by Patroni, which lives
in a private virtualenv made here, never in the project's dependencies.
Facts, timings and pitfalls: ../shared/notes/patroni-testing.md."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg

from db import roles
from tests.support.clusters import as_postgres, owned_by_postgres, pg_bin
from tests.support.servers import free_port

PATRONI = "patroni[etcd3,psycopg3]==4.1.5"
VENV = Path(os.environ.get("REVIEW_QUEUE_PATRONI_VENV", "/var/tmp/review-queue-patroni/venv"))
SUPERUSER_PASSWORD = "pw-super"


class Missing(Exception):
    """etcd or Patroni is not installed here, and could not be."""


def patroni_venv() -> Path:
    """Patroni's virtualenv, made on first use with Debian's Python (user postgres must be able to
    read its interpreter: a venv under root's home is not)."""
    if not (VENV / "bin" / "patroni").exists():
        made = subprocess.run(
            ["/usr/bin/python3", "-m", "venv", str(VENV)], capture_output=True, text=True, check=False
        )
        installed = made.returncode == 0 and (
            subprocess.run(
                [str(VENV / "bin" / "pip"), "install", "-q", PATRONI], capture_output=True, check=False
            ).returncode
            == 0
        )
        if not installed:
            raise Missing(f"could not install {PATRONI} into {VENV}")
    return VENV


def etcd_binary() -> str:
    found = shutil.which("etcd") or ("/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else None)
    if found is None:
        raise Missing("etcd is not installed (apt-get install etcd-server)")
    return found


class Node:
    def __init__(self, cluster: "PatroniCluster", name: str) -> None:
        self.name = name
        self.rest = free_port()
        self.port = free_port()
        self.dir = owned_by_postgres(cluster.root / name)
        self.config = cluster.root / f"{name}.yml"
        self.process: subprocess.Popen[bytes] | None = None
        self.config.write_text(
            json.dumps(  # JSON is YAML
                {
                    "scope": cluster.scope,
                    "name": name,
                    "log": {"level": "WARNING"},
                    "restapi": {
                        "listen": f"127.0.0.1:{self.rest}",
                        "connect_address": f"127.0.0.1:{self.rest}",
                    },
                    "etcd3": {"hosts": f"127.0.0.1:{cluster.etcd_port}"},
                    "bootstrap": {
                        "dcs": {
                            "ttl": 20,
                            "loop_wait": 2,
                            "retry_timeout": 5,
                            "maximum_lag_on_failover": 1048576,
                            "synchronous_mode": cluster.synchronous,
                            "postgresql": {
                                "use_pg_rewind": True,
                                "use_slots": True,
                                "parameters": {
                                    "max_connections": 60,
                                    "shared_buffers": "32MB",
                                    "wal_log_hints": "on",
                                },
                            },
                        },
                        "initdb": [{"encoding": "UTF8"}, "data-checksums"],
                    },
                    "postgresql": {
                        "listen": f"127.0.0.1:{self.port}",
                        "connect_address": f"127.0.0.1:{self.port}",
                        "data_dir": str(self.dir / "data"),
                        "pgpass": str(self.dir / "pgpass"),
                        "bin_dir": str(cluster.bin_dir),
                        "authentication": {
                            "superuser": {"username": "postgres", "password": SUPERUSER_PASSWORD},
                            "replication": {"username": "replicator", "password": "pw-repl"},
                            "rewind": {"username": "postgres", "password": SUPERUSER_PASSWORD},
                        },
                        "parameters": {"unix_socket_directories": str(self.dir)},
                        # A test machine's loopback: trust, so the service's roles need no password.
                        "pg_hba": [
                            "local all all trust",
                            "host replication replicator 127.0.0.1/32 trust",
                            "host all all 127.0.0.1/32 trust",
                        ],
                    },
                }
            )
        )
        self.log = cluster.root / f"{name}.log"

    def start(self, venv: Path) -> None:
        self.process = subprocess.Popen(
            as_postgres(["nice", "-n", "5", str(venv / "bin" / "patroni"), str(self.config)]),
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )

    @property
    def server(self) -> str:
        return f"127.0.0.1:{self.port}"

    def role(self) -> int:
        """The REST API's answer to /primary: 200 on the leader."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.rest}/primary", timeout=1).status_code
        except httpx.HTTPError:
            return 0

    def status(self, path: str) -> int:
        try:
            return httpx.get(f"http://127.0.0.1:{self.rest}/{path}", timeout=1).status_code
        except httpx.HTTPError:
            return 0

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.dir / "data" / "postmaster.pid").read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    def backend_pids(self) -> list[int]:
        """The postmaster and every process it forked (the backends, walsender, checkpointer...)."""
        postmaster = self.postmaster_pid()
        if postmaster is None:
            return []
        children = subprocess.run(
            ["pgrep", "-P", str(postmaster)], capture_output=True, text=True, check=False
        ).stdout.split()
        return [postmaster, *map(int, children)]

    def signal_all(self, sig: signal.Signals) -> None:
        """`sig` to this node's Patroni, its postmaster and every backend: SIGSTOP is a hung machine."""
        assert self.process is not None
        # runuser too: it stops itself when its child stops, and would stay stopped after a SIGCONT
        # to the child alone.
        for pid in [self.process.pid, self.patroni_pid(), *self.backend_pids()]:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def patroni_pid(self) -> int | None:
        """runuser's child: Patroni itself."""
        assert self.process is not None
        found = subprocess.run(
            ["pgrep", "-P", str(self.process.pid)], capture_output=True, text=True, check=False
        ).stdout.split()
        return int(found[0]) if found else self.process.pid

    def kill(self) -> None:
        """SIGKILL the postmaster, then the node's Patroni: the machine is gone."""
        for pid in (self.postmaster_pid(), self.patroni_pid()):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        assert self.process is not None
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        pid = self.patroni_pid()
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


def _wait(predicate: object, timeout: float, what: str) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():  # type: ignore[operator]
            return time.monotonic() - start
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout} s")


# Debian's PostgreSQL 15 (apt-get install postgresql-15), the other server the failover tests run on.
DEBIAN_PG15 = Path("/usr/lib/postgresql/15/bin")


class PatroniCluster:
    """etcd and two Patroni nodes; `synchronous`: synchronous_mode (a commit is acknowledged only
    once the standby has it); `bin_dir`: the PostgreSQL binaries (the embedded package's 18 unless
    given)."""

    def __init__(self, *, synchronous: bool = True, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir or pg_bin()
        if not (self.bin_dir / "postgres").exists():
            raise Missing(f"no PostgreSQL binaries in {self.bin_dir}")
        self.venv = patroni_venv()
        self.root = owned_by_postgres(Path(tempfile.mkdtemp(prefix="rq-patroni-")))
        self.root.chmod(0o755)
        self.scope = f"rq-{uuid.uuid4().hex[:8]}"
        self.synchronous = synchronous
        self.etcd_port, etcd_peer = free_port(), free_port()
        self.etcd = subprocess.Popen(
            [etcd_binary(), "--name", "rq-etcd", "--data-dir", str(self.root / "etcd"),
             "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
             "--listen-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-advertise-peer-urls", f"http://127.0.0.1:{etcd_peer}",
             "--initial-cluster", f"rq-etcd=http://127.0.0.1:{etcd_peer}", "--initial-cluster-state", "new"],
            stdout=(self.root / "etcd.log").open("wb"),
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.nodes = [Node(self, "n1"), Node(self, "n2")]
        try:
            _wait(self._etcd_up, 30, "etcd")
            self.nodes[0].start(self.venv)
            _wait(lambda: self.nodes[0].role() == 200, 90, "the first node as leader")
            self.nodes[1].start(self.venv)
            self.wait_healthy(120)
            with psycopg.connect(self.url("postgres", "postgres"), autocommit=True) as conn:
                roles.ensure_roles(conn)
                conn.execute(f"CREATE DATABASE rq OWNER {roles.OWNER_ROLE}")
        except BaseException:
            self.stop()
            raise

    def _etcd_up(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.etcd_port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def url(self, database: str = "rq", user: str = roles.APP_ROLE, *, driver: str = "postgresql") -> str:
        """libpq's multi-host form, as an operator writes it: every node, the writable one chosen."""
        servers = ",".join(node.server for node in self.nodes)
        return f"{driver}://{user}@{servers}/{database}?target_session_attrs=read-write&connect_timeout=2"

    def leader(self) -> Node | None:
        return next((node for node in self.nodes if node.role() == 200), None)

    def other(self, node: Node) -> Node:
        return next(other for other in self.nodes if other is not node)

    def wait_healthy(self, timeout: float) -> float:
        """Until there is a leader and the other node is its (sync) standby."""
        standby = "sync" if self.synchronous else "replica"

        def healthy() -> bool:
            leader = self.leader()
            return leader is not None and self.other(leader).status(standby) == 200

        return _wait(healthy, timeout, f"a leader and a {standby} standby")

    def wait_writable(self, timeout: float) -> float:
        def writable() -> bool:
            try:
                with psycopg.connect(self.url("postgres", "postgres"), connect_timeout=1) as conn:
                    conn.execute("CREATE TEMP TABLE probe ()")
                return True
            except psycopg.Error:
                return False

        return _wait(writable, timeout, "a writable leader")

    def switchover(self) -> None:
        subprocess.run(
            as_postgres(
                [
                    str(self.venv / "bin" / "patronictl"),
                    "-c",
                    str(self.nodes[0].config),
                    "switchover",
                    "--force",
                ]
            ),
            check=True,
            capture_output=True,
            timeout=120,
        )

    def stop(self) -> None:
        """Every node, then etcd, each even when stopping another failed (a frozen node's Patroni
        that would not die left the other node and etcd running)."""
        try:
            for node in self.nodes:
                with contextlib.suppress(Exception):
                    if node.process is not None:
                        node.signal_all(signal.SIGCONT)
                    node.stop()
        finally:
            self.etcd.terminate()
            self.etcd.wait(timeout=30)
            shutil.rmtree(self.root, ignore_errors=True)
