"""deploy/patroni/: the three hosts' Patroni files agree with each other, with etcd's and with the
service's environment file, and keep what the failover tests rely on (synchronous mode, pg_rewind)
plus what they cannot show on one machine (strict synchronous mode, a watchdog, three etcd members)."""

from pathlib import Path
from typing import Any

import yaml

from db import urls
from tests.support import DEPLOY

PATRONI = DEPLOY / "patroni"
NODES = ("db1", "db2", "db3")


def _env(path: Path) -> dict[str, str]:
    pairs = (
        line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")
    )
    return {key: value.split("#", 1)[0].strip() for key, value in pairs}


def test_the_three_nodes_differ_only_in_their_names_and_addresses() -> None:
    configs = {name: yaml.safe_load((PATRONI / f"{name}.yml").read_text()) for name in NODES}
    for name, config in configs.items():
        assert config["name"] == name
        assert config["restapi"]["connect_address"] == f"{name}.example.internal:8008"
        assert config["postgresql"]["connect_address"] == f"{name}.example.internal:5432"
        dcs = config["bootstrap"]["dcs"]
        assert dcs["synchronous_mode"] is True and dcs["synchronous_mode_strict"] is True
        assert dcs["postgresql"]["use_pg_rewind"] is True
        assert config["watchdog"]["mode"] == "required"
        assert len(config["etcd3"]["hosts"]) == 3

    def shared(config: dict[str, Any]) -> str:
        config["name"] = config["restapi"]["connect_address"] = config["postgresql"]["connect_address"] = (
            "NODE"
        )
        return yaml.safe_dump(config, sort_keys=True)

    assert len({shared(config) for config in configs.values()}) == 1


def test_etcd_has_three_members_on_the_same_hosts() -> None:
    env = _env(PATRONI / "etcd.env")
    members = dict(member.split("=", 1) for member in env["ETCD_INITIAL_CLUSTER"].split(","))
    assert sorted(members) == list(NODES)
    config = yaml.safe_load((PATRONI / "db1.yml").read_text())
    assert sorted(host.split(":")[0] for host in config["etcd3"]["hosts"]) == [
        f"{name}.example.internal" for name in NODES
    ]


def test_the_service_reaches_every_node_and_only_the_leader() -> None:
    env = _env(PATRONI / "review-queue.env")
    for key in ("DATABASE_URL", "REVIEW_QUEUE_MIGRATION_DATABASE_URL"):
        target = urls.parse(env[key])
        assert target.servers == [f"{name}.example.internal:5432" for name in NODES]
        assert target.option("target_session_attrs") == "read-write"
