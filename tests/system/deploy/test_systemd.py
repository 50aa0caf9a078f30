"""deploy/systemd: every unit passes `systemd-analyze verify` and its offline security review, and
carries what docs/production.md promises (dedicated user, EnvironmentFile, restart, hardening); the
monthly archive runs as a one-shot service from its timer."""

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import DEPLOY

UNITS = {
    "review-queue.service": "review-queue serve --no-reclaimer --no-deliverer",
    "review-queue-reclaimer.service": "review-queue reclaimer",
    "review-queue-deliverer.service": "review-queue deliverer",
}
# Started by its timer, once, not kept running.
ONESHOT = {"review-queue-archive.service": "review-queue archive --to /var/lib/review-queue-archive"}
TIMER = "review-queue-archive.timer"
SERVICES = {**UNITS, **ONESHOT}
COMMAND = Path("/opt/review-queue/.venv/bin/review-queue")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A file-system root for `--root`: the host's own unit tree (for sysinit.target and the
    like), our units, and an executable where ExecStart expects the command, so verify checks
    the real paths without installing anything on this machine."""
    root = tmp_path_factory.mktemp("systemd-root")
    for system in (Path("/lib/systemd/system"), Path("/usr/lib/systemd/system")):
        if system.is_dir() and not system.is_symlink():
            shutil.copytree(system, root / system.relative_to("/"), symlinks=True, dirs_exist_ok=True)
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for name in [*SERVICES, TIMER]:
        shutil.copy(DEPLOY / "systemd" / name, units / name)
    command = root / COMMAND.relative_to("/")
    command.parent.mkdir(parents=True)
    command.write_text("#!/bin/sh\n")
    command.chmod(0o755)
    return root


def _analyze(tool: str, root: Path, *args: str, units: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool, *args, f"--root={root}", *units],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_units_pass_systemd_analyze_verify(systemd_analyze: str, root: Path) -> None:
    done = _analyze(systemd_analyze, root, "verify", "--man=no", "--generators=no", units=[*SERVICES, TIMER])
    # An unknown key or a bad value is only a warning (exit 0): any output is a failure here.
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


def test_units_are_hardened_by_systemd_analyze_security(systemd_analyze: str, root: Path) -> None:
    # Exposure 0.0 (locked down) to 10.0 (unprotected); 2.0 and below is what systemd calls OK.
    done = _analyze(
        systemd_analyze, root, "security", "--offline=true", "--threshold=20", "--no-pager", units=[*SERVICES]
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("OK") >= len(SERVICES), done.stdout[-2000:]


def _unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / name)
    return unit


@pytest.mark.parametrize(("name", "command"), SERVICES.items())
def test_unit_has_user_environment_file_restart_and_hardening(name: str, command: str) -> None:
    unit = _unit(name)
    service = unit["Service"]
    assert service["ExecStart"] == f"{COMMAND.parent}/{command}"
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "PrivateDevices": "yes",
        "CapabilityBoundingSet": "",
    }.items():
        assert service[key] == value, f"{name}: {key}={service.get(key)!r}, expected {value!r}"
    # A key given twice (EnvironmentFile=) keeps the last value in configparser: read them all.
    files = [line.split("=", 1)[1] for line in (DEPLOY / "systemd" / name).read_text().splitlines()
             if line.startswith("EnvironmentFile=")]  # fmt: skip
    assert files[0] == "/etc/review-queue/review-queue.env"
    if name in ONESHOT:
        # Its own user, the owner's URL from a file of its own, and its files in its own directory:
        # the service's user can read neither.
        assert service["User"] == service["Group"] == "review-queue-archive"
        assert files[1:] == ["/etc/review-queue/archive.env"]
        assert service["Type"] == "oneshot" and "Restart" not in service and "Install" not in unit
        assert service["StateDirectory"] == "review-queue-archive"
        return
    assert service["User"] == "review-queue" and service["Group"] == "review-queue"
    assert service["Restart"] == "always"
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_sysusers_file_declares_both_users() -> None:
    lines = (DEPLOY / "systemd" / "review-queue.sysusers.conf").read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("u ")]
    assert users == ["review-queue", "review-queue-archive"]


def test_the_archive_runs_monthly_and_catches_up_after_downtime() -> None:
    timer = _unit(TIMER)["Timer"]
    assert timer["OnCalendar"] == "*-*-02 03:00:00 UTC" and timer["Persistent"] == "true"
    assert _unit(TIMER)["Install"]["WantedBy"] == "timers.target"
