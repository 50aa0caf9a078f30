"""`review-queue --help` (and each group's) lists every command with its whole one-line summary:
the first paragraph of its help, never cut at a period or at the terminal's width."""

import os
import subprocess

import pytest
from typer.main import get_command

from cli.main import app

ROOT = get_command(app)
GROUPS = [(), *((name,) for name, command in ROOT.commands.items() if hasattr(command, "commands"))]  # type: ignore[attr-defined]


def summary(command: object) -> str:
    text = str(getattr(command, "help", "") or "")
    return " ".join(text.split("\n\n")[0].split())


def listed(group: tuple[str, ...]) -> dict[str, str]:
    command = ROOT
    for name in group:
        command = command.commands[name]  # type: ignore[attr-defined]
    return {name: summary(sub) for name, sub in command.commands.items()}  # type: ignore[attr-defined]


@pytest.mark.parametrize("group", GROUPS, ids=lambda g: " ".join(("review-queue", *g)))
def test_every_command_is_listed_with_its_whole_summary_on_one_line(group: tuple[str, ...]) -> None:
    result = subprocess.run(
        ["review-queue", *group, "--help"],
        env={**os.environ, "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    commands = listed(group)
    assert commands, group
    for name, text in commands.items():
        assert text.endswith("."), f"{name}: a summary is one sentence: {text!r}"
        row = [line for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1, f"{name} is not listed once:\n{result.stdout}"
        assert row[0].split(None, 1)[1].strip() == text, f"{name}: {row[0]!r} is not {text!r}"
        assert len(row[0]) <= 80 and "..." not in row[0], row[0]
