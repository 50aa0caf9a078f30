"""The deadlines in `review-queue` itself: the command refuses a bad policy, and its stats show
overdue, aging and open items per currency (each test runs the command;
tests/integration/api/test_deadlines.py has the rest)."""

import os
import subprocess


def test_the_cli_refuses_a_bad_policy_before_it_does_anything(db_url: str) -> None:
    result = subprocess.run(
        ["review-queue", "stats"],
        env={**os.environ, "DATABASE_URL": db_url, "REVIEW_QUEUE_SLA_TIERS": "1000:24h"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result
    assert "REVIEW_QUEUE_SLA_TIERS" in result.stderr and "needs a tier at amount 0" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_cli_stats_show_overdue_and_aging(db_url: str, aged: dict[str, str]) -> None:
    result = subprocess.run(
        ["review-queue", "stats"],
        env={**os.environ, "DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = {line[:26].strip(): line[26:].strip() for line in result.stdout.splitlines()}
    assert lines["overdue"] == "17", result.stdout
    assert (lines["0-1d"], lines["1-3d"], lines["3-7d"], lines["7-30d"], lines["30d+"]) == (
        "3", "4", "5", "6", "2",
    ), result.stdout  # fmt: skip
    assert any(label.startswith("overdue in E") for label in lines), result.stdout
    assert lines["open items by currency"] == "" and lines["USD"] == "20", result.stdout  # every open one
