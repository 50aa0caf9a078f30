"""`review-queue --help` (and each group's and command's): every command listed with its whole
one-line summary, flags shown as flags. In-process (Typer's CliRunner, the `app` that the
`review-queue` script runs): a process per page cost about 2 s of CPU for its imports; the
system tier's CLI tests run the script itself."""

import pytest
from typer.main import get_command
from typer.testing import CliRunner, Result

from cli.main import app

ROOT = get_command(app)
GROUPS = [(), *((name,) for name, command in ROOT.commands.items() if hasattr(command, "commands"))]  # type: ignore[attr-defined]


def help_page(*command: str) -> Result:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"}, prog_name="review-queue")
    assert result.exit_code == 0, result.output
    return result


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
    result = help_page(*group)
    lines = result.stdout.splitlines()
    commands = listed(group)
    assert commands, group
    for name, text in commands.items():
        assert text.endswith("."), f"{name}: a summary is one sentence: {text!r}"
        row = [line for line in lines if line.split()[:1] == [name]]
        assert len(row) == 1, f"{name} is not listed once:\n{result.stdout}"
        assert row[0].split(None, 1)[1].strip() == text, f"{name}: {row[0]!r} is not {text!r}"
        assert len(row[0]) <= 80 and "..." not in row[0], row[0]


def _commands() -> list[tuple[str, ...]]:
    found: list[tuple[str, ...]] = [()]
    for name, command in ROOT.commands.items():  # type: ignore[attr-defined]
        found.append((name,))
        found += [(name, sub) for sub in getattr(command, "commands", {})]
    return found


@pytest.mark.parametrize("command", _commands(), ids=lambda c: " ".join(c) or "review-queue")
def test_help_shows_flags_as_flags(command: tuple[str, ...]) -> None:
    result = help_page(*command)
    assert "<bool>" not in result.stdout and "[default: True]" not in result.stdout, result.stdout
    assert "--help  " in result.stdout or "--help\n" in result.stdout
