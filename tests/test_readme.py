"""The README's curl walk-through, run as written against a live server, so the docs cannot drift.

Every ```sh block of the "Walk-through with curl" section is cut into its commands, in order; the
commands run in one bash session (with the dev tokens exported as `make run` prints them, and
`localhost:8000` pointed at the test's server), and each command's answer is checked. A changed,
added or removed command fails the test until the expectations below say what it should answer.
The snippets need curl and python3 (jq is not assumed): the test fails, and says so, without curl.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from api.settings import REPO_ROOT
from tests.conftest import free_port

README = (REPO_ROOT / "README.md").read_text()
END = "@@end-of-command@@"


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, re.S)


def commands(block: str) -> list[str]:
    """Logical commands: backslash continuations joined, quotes spanning lines kept whole."""
    found, pending = [], ""
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line + "\n"
        if line.endswith("\\"):
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote still open: the command goes on
            continue
        found.append(pending.rstrip("\n"))
        pending = ""
    assert not pending, f"unterminated command in the README: {pending}"
    return found


def _json(out: str) -> Any:
    return json.loads(out)


def _empty(out: str) -> None:
    assert out.strip() == "", out


# (a fragment of the command, a check of its answer), in README order.
Check = Callable[[str, dict[str, Any]], None]


def _enqueued(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["idempotency_key"], item["state"], item["variance_amount"]) == (
        "ACME-2026-11-30-0042",
        "PENDING",
        "12.50",
    ), item


def _leased(out: str, seen: dict[str, Any]) -> None:
    (item,) = _json(out)["items"]
    assert item["state"] == "ASSIGNED" and item["leased_by"] == "reviewer" and item["lease_token"], item
    seen["id"] = item["id"]


def _renewed(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["id"], item["state"], item["leased_by"]) == (seen["id"], "ASSIGNED", "reviewer"), item


def _mine(out: str, seen: dict[str, Any]) -> None:
    assert [i["id"] for i in _json(out)["items"]] == [seen["id"]], out


def _completed(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    assert body["outcome"] == "resolved", body
    assert (body["item"]["id"], body["item"]["resolution"], body["item"]["resolved_by"]) == (
        seen["id"],
        "APPROVED",
        "reviewer",
    )


def _trail(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    assert [e["event"] for e in body["events"]] == ["ENQUEUED", "LEASED", "RENEWED", "RESOLVED"], body
    assert [e["actor"] for e in body["events"]] == ["admin", "reviewer", "reviewer", "reviewer"]
    assert body["next_cursor"] is None


def _batch(out: str, seen: dict[str, Any]) -> None:
    (result,) = _json(out)["results"]
    assert result["outcome"] == "created" and result["item"]["idempotency_key"] == "b-1", result
    assert result["item"]["due_at"] == "2030-12-31T17:00:00+00:00", result


def _released(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["idempotency_key"], item["state"], item["leased_by"]) == ("b-1", "PENDING", None), item


def _catalogue(out: str, seen: dict[str, Any]) -> None:
    codes = {c["code"]: c for c in _json(out)["resolutions"]}
    assert codes["ADJUSTMENT_POSTED"]["approval_threshold"] == "10000.00", codes
    assert codes["ADJUSTMENT_POSTED"]["requires_note"] is True and "WRITE_OFF" in codes, codes


def _big_enqueued(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["variance_amount"], item["state"]) == ("25000.00", "PENDING"), item
    seen["big"] = item["id"]


def _submitted(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    assert body["outcome"] == "submitted_for_approval", body
    item = body["item"]
    assert (item["id"], item["state"], item["prepared_by"]) == (seen["big"], "AWAITING_APPROVAL", "reviewer")


def _approved(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    assert body["outcome"] == "approved", body
    item = body["item"]
    assert (item["id"], item["state"], item["resolution"], item["resolved_by"], item["approved_by"]) == (
        seen["big"],
        "RESOLVED",
        "ADJUSTMENT_POSTED",
        "reviewer",
        "approver",
    ), item


def _batch_completed(out: str, seen: dict[str, Any]) -> None:
    resolved, unknown = _json(out)["results"]
    assert (resolved["outcome"], resolved["item"]["idempotency_key"]) == ("resolved", "b-1"), resolved
    assert (unknown["outcome"], unknown["problem"]["code"], unknown["item"]) == ("refused", "NOT_FOUND", None)


def _due_soon(out: str, seen: dict[str, Any]) -> None:
    assert [i["idempotency_key"] for i in _json(out)["items"]] == ["b-1"], out


def _stats(out: str, seen: dict[str, Any]) -> None:
    stats = _json(out)
    assert stats["counts"] == {
        "PENDING": 0,
        "ASSIGNED": 0,
        "QUARANTINED": 0,
        "RESOLVED": 3,
        "AWAITING_APPROVAL": 0,
    }, out
    assert (stats["overdue"], stats["aging"]["0-1d"]) == (0, 0), out


def _throughput(out: str, seen: dict[str, Any]) -> None:
    report = _json(out)
    rows = {r["reviewer"]: r for r in report["rows"]}
    assert set(rows) == {"reviewer", "approver"} and report["reviewer"] is None, report
    mine = rows["reviewer"]
    assert (mine["resolved"], mine["submitted_for_approval"], mine["released"], mine["decisions"]) == (
        2, 1, 1, 4), mine  # fmt: skip
    assert (rows["approver"]["approved"], rows["approver"]["decisions"]) == (1, 1), rows


def _decisions_csv(out: str, seen: dict[str, Any]) -> None:
    import csv
    import io

    header, *rows = list(csv.reader(io.StringIO(out, newline="")))
    assert header[:3] == ["event_id", "item_id", "idempotency_key"], header
    decided = [dict(zip(header, row, strict=True)) for row in rows]
    assert [(d["idempotency_key"], d["resolution"], d["resolved_by"], d["approved_by"]) for d in decided] == [
        ("ACME-2026-11-30-0042", "APPROVED", "reviewer", ""),
        ("ACME-2026-11-30-0043", "ADJUSTMENT_POSTED", "reviewer", "approver"),
        ("b-1", "APPROVED", "reviewer", ""),
    ], decided


def _reclaimed_nothing(out: str, seen: dict[str, Any]) -> None:
    assert _json(out) == {"reclaimed": 0, "items": []}, out


def _nothing(out: str, seen: dict[str, Any]) -> None:
    _empty(out)


EXPECTED: list[tuple[str, Check]] = [
    ("-X POST localhost:8000/items ", _enqueued),
    ("LEASED=$(curl", _nothing),
    ('echo "$LEASED"', _leased),
    ('ID=$(echo "$LEASED"', _nothing),
    ('LEASE_TOKEN=$(echo "$LEASED"', _nothing),
    ("/items/$ID/renew", _renewed),
    ("leased_by=me", _mine),
    ("/items/$ID/complete", _completed),
    ("/items/$ID/events", _trail),
    ("localhost:8000/resolutions", _catalogue),
    ("ACME-2026-11-30-0043", _big_enqueued),
    ("LEASED=$(curl", _nothing),
    ('ID=$(echo "$LEASED"', _nothing),
    ('LEASE_TOKEN=$(echo "$LEASED"', _nothing),
    ("/items/$ID/complete", _submitted),
    ("APPROVAL=$(curl", _nothing),
    ("APPROVAL_TOKEN=$(echo", _nothing),
    ("/items/$ID/approve", _approved),
    ("/items/batch", _batch),
    ("ID=$(curl -s -X POST localhost:8000/leases", _nothing),
    ("/items/$ID/release", _released),
    ("due_before=", _due_soon),
    ("ID=$(curl -s -X POST localhost:8000/leases", _nothing),
    ("localhost:8000/items/complete ", _batch_completed),
    ("localhost:8000/stats", _stats),
    ("TODAY=$(python3", _nothing),
    ("TOMORROW=$(python3", _nothing),
    ("/reports/throughput", _throughput),
    ("/reports/decisions.csv", _decisions_csv),
    ("/admin/reclaim", _reclaimed_nothing),
]


def _serve_blocks() -> list[str]:
    return [b for b in sh_blocks(section("Walk-through with curl")) if "review-queue serve" in b]


def _walk_through() -> list[str]:
    blocks = [b for b in sh_blocks(section("Walk-through with curl")) if "review-queue serve" not in b]
    return [command for block in blocks for command in commands(block)]


def test_the_walk_through_is_what_this_test_checks() -> None:
    walk = _walk_through()
    assert len(walk) == len(EXPECTED), "\n---\n".join(walk)
    for command, (fragment, _) in zip(walk, EXPECTED, strict=True):
        assert fragment in command, f"expected a command with {fragment!r}, the README has:\n{command}"
    assert "jq " not in README, "the README's snippets use python3 for JSON, not jq (not on a fresh machine)"
    assert "uv run" not in README, "uv may not be on PATH on a fresh machine: use .venv/bin or make"


def _needs(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"the README walk-through needs {tool} on PATH (apt-get install {tool})"
    return path


def test_the_curl_walk_through_answers_as_documented(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    _needs("curl"), _needs("python3")
    host = live_server.removeprefix("http://")
    script = ["set -eu -o pipefail"]
    for command in _walk_through():
        script += [command.replace("localhost:8000", host), f"printf '\\n{END}\\n'"]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        # As `make run` prints them: subjects admin and reviewer.
        "RQ_ADMIN": make_token("admin", "admin"),
        "RQ_REVIEWER": make_token("reviewer", "reviewer"),
        "RQ_APPROVER": make_token("approver", "approver"),
    }
    result = subprocess.run(
        ["bash", "-c", "\n".join(script)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"the walk-through failed:\n{result.stdout}\n{result.stderr}"
    outputs = result.stdout.split(f"\n{END}\n")
    assert outputs[-1] == "", outputs[-1]
    assert len(outputs) - 1 == len(EXPECTED), result.stdout
    seen: dict[str, Any] = {}
    for out, (fragment, check) in zip(outputs, EXPECTED, strict=False):
        try:
            check(out, seen)
        except (AssertionError, ValueError, KeyError) as error:
            raise AssertionError(f"the README command with {fragment!r} answered:\n{out}") from error


def test_the_reclaim_demo_reclaims(db_url: str, make_token: Callable[[str, str], str]) -> None:
    """The README's way to see /admin/reclaim at work, run as written (PORT and DATABASE_URL added)."""
    (block,) = _serve_blocks()
    (line,) = commands(block)
    port = free_port()
    env = {**os.environ, "DATABASE_URL": db_url, "PORT": str(port), "REVIEW_QUEUE_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(["bash", "-c", line], cwd=REPO_ROOT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {make_token('admin', 'admin')}"}
    reviewer = {"Authorization": f"Bearer {make_token('reviewer', 'reviewer')}"}
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert server.poll() is None, "the README's serve command exited"
            try:
                if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        body = {"idempotency_key": "demo", "ledger_entity": "E", "variance_amount": "1.00",
                "match_decision": "PARTIAL", "source_hash": "h"}  # fmt: skip
        assert httpx.post(f"{base}/items", json=body, headers=admin).status_code == 201
        (item,) = httpx.post(f"{base}/leases", json={"batch_size": 1}, headers=reviewer).json()["items"]
        reclaimed: dict[str, Any] = {"reclaimed": 0}
        deadline = time.monotonic() + 60  # lease 1 s + grace 10 s, on a busy machine
        while reclaimed["reclaimed"] == 0 and time.monotonic() < deadline:
            time.sleep(1)
            reclaimed = httpx.post(f"{base}/admin/reclaim", headers=admin).json()
        assert reclaimed["reclaimed"] == 1 and reclaimed["items"][0]["id"] == item["id"], reclaimed
        assert set(reclaimed["items"][0]) == {"id", "trace_id", "source_hash", "match_decision", "state"}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@pytest.mark.parametrize("title", ["Walk-through with curl"])
def test_every_sh_block_of_the_walk_through_is_run(title: str) -> None:
    blocks = sh_blocks(section(title))
    run = {c for c in _walk_through()} | {c for b in _serve_blocks() for c in commands(b)}
    assert {c for b in blocks for c in commands(b)} == run


def test_auto_adjudicate_runs_until_ctrl_c(
    live_server: str, make_token: Callable[[str, str], str], sql: Any, tmp_path: Any
) -> None:
    """The README's Python client example, run as written: it works the queue and keeps polling
    until Ctrl-C (SIGINT), then returns its tally, which it prints."""
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "auto_adjudicate" in b]
    script = tmp_path / "auto_adjudicate.py"
    script.write_text(snippet.replace("http://127.0.0.1:8000", live_server))
    sql.execute(
        "INSERT INTO review_queue_item (idempotency_key, ledger_entity, variance_amount, match_decision,"
        " source_hash) SELECT 'aa-' || i, 'ACME', i * 0.75, 'PARTIAL', 'h' FROM generate_series(1, 3) i"
    )
    env = {**os.environ, "RQ_REVIEWER": make_token("bot", "reviewer"), "PYTHONPATH": str(REPO_ROOT)}
    worker = subprocess.Popen(
        [str(REPO_ROOT / ".venv/bin/python"), str(script)], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        resolved = 0
        while resolved < 3 and time.monotonic() < deadline:
            assert worker.poll() is None, "auto_adjudicate.py returned before it was stopped"
            time.sleep(0.2)
            (resolved,) = sql.execute(
                "SELECT count(*) FROM review_queue_item WHERE state = 'RESOLVED'"
            ).fetchone()
        assert resolved == 3
        time.sleep(0.5)
        assert worker.poll() is None, "an empty queue must not end the loop"
        worker.send_signal(signal.SIGINT)
        out, _ = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0
    assert "resolved=3" in out, out
    rows = sql.execute("SELECT resolution FROM review_queue_item ORDER BY idempotency_key").fetchall()
    assert rows == [("WRITE_OFF",), ("ESCALATED",), ("ESCALATED",)]
