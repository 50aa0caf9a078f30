"""Operators' tools (promtool, systemd-analyze) for the deploy/ checks: skipped with the reason where
a tool is not installed, failed instead where its REVIEW_QUEUE_REQUIRE_* variable is set (.ci/run
installs both and sets them)."""

import os
import shutil

import pytest


def required_tool(name: str, require_env: str, install_hint: str) -> str:
    """The tool's path; a skip (or, with require_env set, a failure) when it is missing."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get(require_env):
            pytest.fail(f"{require_env} is set but {name} is not installed ({install_hint})")
        pytest.skip(f"{name} is not installed ({install_hint}; .ci/run does)")
    return path


@pytest.fixture(scope="session")
def promtool() -> str:
    return required_tool(
        "promtool", "REVIEW_QUEUE_REQUIRE_PROMTOOL", "apt-get install prometheus provides it"
    )


@pytest.fixture(scope="session")
def systemd_analyze() -> str:
    return required_tool(
        "systemd-analyze", "REVIEW_QUEUE_REQUIRE_SYSTEMD_ANALYZE", "apt-get install systemd provides it"
    )
