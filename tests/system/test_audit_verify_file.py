"""`review-queue audit verify --file`, offline, on files that are not what an export writes: every
such line is a BROKEN line naming its number (never a traceback), and a file with no line at all
verified nothing, which is not "intact"."""

import subprocess
from pathlib import Path

import pytest

from db import chain
from tests.support.cli import completed, invoke

OFFLINE = "postgresql+psycopg://nobody@127.0.0.1:1/none"  # no database is needed, or reachable


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    """`review-queue audit verify --file PATH`, in-process (tests/support/cli.py): an exception that
    escapes the command fails the test, as a traceback of the script would."""
    args = ("audit", "verify", "--file", str(path))
    return completed(invoke(OFFLINE, *args), *args)


def first_line() -> bytes:
    event = chain.EventFields(
        id=1,
        item_id="00000000-0000-4000-8000-000000000001",
        event="ENQUEUED",
        actor="ada",
        at="2026-12-04T06:30:00.000000Z",
        lease_epoch=0,
        trace_id="00000000-0000-4000-8000-000000000002",
        details="{}",
    )
    return chain.export_line(1, chain.GENESIS, chain.link(chain.GENESIS, event), event)


def test_a_real_line_verifies(tmp_path: Path) -> None:
    export = tmp_path / "export.ndjson"
    export.write_bytes(first_line())
    result = verify(export)
    assert result.returncode == 0, result.stderr
    assert "verified 1 events" in result.stdout and "intact" in result.stdout


def deep_details(depth: int) -> bytes:
    """A second line of an export's shape whose details are nested `depth` levels deep."""
    line = first_line().replace(b'"details":{}', b'"details":' + b"[" * depth + b"]" * depth)
    return line.replace(b'"seq":1', b'"seq":2').rstrip(b"\n")


@pytest.mark.parametrize(
    "second",
    [
        b"[" * 100_000 + b"]" * 100_000,  # deeper than the JSON parser goes
        deep_details(600),  # parsed, then too deep to encode
        b'{"event":{"actor":"ada","at":"x","details":' + b'{"a":' * 5000 + b"1" + b"}" * 5000 + b"}}",
    ],
    ids=["deep-array", "deep-details", "deep-objects"],
)
def test_a_deeply_nested_line_is_broken_at_its_number(tmp_path: Path, second: bytes) -> None:
    export = tmp_path / "export.ndjson"
    export.write_bytes(first_line() + second + b"\n")
    result = verify(export)
    assert result.returncode == 1, (result.stdout, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("BROKEN at seq 2: malformed: line 2 is not an export line"), line


@pytest.mark.parametrize("content", [b"", b"\n", b"\n\n"], ids=["empty", "one-blank-line", "blank-lines"])
def test_a_file_without_export_lines_verified_nothing(tmp_path: Path, content: bytes) -> None:
    export = tmp_path / "export.ndjson"
    export.write_bytes(content)
    result = verify(export)
    assert result.returncode != 0, result.stdout
    assert "intact" not in result.stdout, result.stdout
    assert "Traceback" not in result.stderr
    assert result.stderr.strip(), "the reason goes to stderr"
