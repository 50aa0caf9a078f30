"""The docs' shell and Python snippets, run as written against a live server, so they cannot drift.

Every ```sh block of docs/walkthrough.md (the curl walk-through) is cut into its commands, in order; the
commands run in one bash session (with the dev tokens exported as `make run` prints them, and PORT
set to the test's server), and each command's answer is checked. The walk-through runs twice over
the same server and database, as a person who tries it again the next day does: every answer is
checked both times, and neither run may print a traceback. A changed, added or removed command fails
the test until the expectations below say what it should answer. The snippets need curl and python3
(jq is not assumed): the test fails, and says so, without curl. The README's short sample (enqueue,
lease, complete) is run the same way, and docs/client.md's two Python examples as programs.
"""

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from api.settings import REPO_ROOT
from tests.support import wait_for
from tests.support.servers import free_port

README = (REPO_ROOT / "README.md").read_text()
WALKTHROUGH = (REPO_ROOT / "docs/walkthrough.md").read_text()
CLIENT = (REPO_ROOT / "docs/client.md").read_text()
END = "@@end-of-command@@"
# The README's first block: the two commands, which `make` itself and CI (`.ci/run`) run.
README_COMMANDS = ["make run", "make test"]


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
    assert not pending, f"unterminated command in the docs: {pending}"
    return found


def _json(out: str) -> Any:
    return json.loads(out)


def _empty(out: str) -> None:
    assert out.strip() == "", out


# (a fragment of the command, a check of its answer), in the walk-through's order.
Check = Callable[[str, dict[str, Any]], None]


def _enqueued(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["idempotency_key"], item["state"], item["variance_amount"]) == (
        f"ACME-2026-11-30-0042-{seen['run']}",
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
    assert result["outcome"] == "created" and result["item"]["idempotency_key"] == f"b-1-{seen['run']}", (
        result
    )
    assert result["item"]["due_at"] == "2030-12-31T17:00:00+00:00", result


def _released(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["idempotency_key"], item["state"], item["leased_by"]) == (
        f"b-1-{seen['run']}",
        "PENDING",
        None,
    )


def _catalogue(out: str, seen: dict[str, Any]) -> None:
    codes = {c["code"]: c for c in _json(out)["resolutions"]}
    assert codes["ADJUSTMENT_POSTED"]["approval_threshold"] == "10000.00", codes
    assert codes["ADJUSTMENT_POSTED"]["requires_note"] is True and "WRITE_OFF" in codes, codes


def _big_enqueued(out: str, seen: dict[str, Any]) -> None:
    item = _json(out)
    assert (item["variance_amount"], item["state"]) == ("25000.00", "PENDING"), item
    assert item["idempotency_key"] == f"ACME-2026-11-30-0043-{seen['run']}", item
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
    assert (resolved["outcome"], resolved["item"]["idempotency_key"]) == ("resolved", f"b-1-{seen['run']}")
    assert (unknown["outcome"], unknown["problem"]["code"], unknown["item"]) == ("refused", "NOT_FOUND", None)


def _due_soon(out: str, seen: dict[str, Any]) -> None:
    assert [i["idempotency_key"] for i in _json(out)["items"]] == [f"b-1-{seen['run']}"], out


def _stats(out: str, seen: dict[str, Any]) -> None:
    stats = _json(out)
    assert stats["counts"] == {
        "PENDING": 0,
        "ASSIGNED": 0,
        "QUARANTINED": 0,
        "RESOLVED": 3 * seen["runs"],  # each run resolves its three items
        "AWAITING_APPROVAL": 0,
    }, out
    assert (stats["overdue"], stats["aging"]["0-1d"]) == (0, 0), out


def _throughput(out: str, seen: dict[str, Any]) -> None:
    report = _json(out)
    rows = {r["reviewer"]: r for r in report["rows"]}
    assert set(rows) == {"reviewer", "approver"} and report["reviewer"] is None, report
    # Today's figures: each run of the walk-through adds the same decisions again.
    runs = seen["runs"]
    mine = rows["reviewer"]
    # A release is not a decision (issue 42): two resolutions and a submission are.
    assert (mine["resolved"], mine["submitted_for_approval"], mine["released"], mine["decisions"]) == (
        2 * runs, runs, runs, 3 * runs), mine  # fmt: skip
    assert (rows["approver"]["approved"], rows["approver"]["decisions"]) == (runs, runs), rows


def _decisions_csv(out: str, seen: dict[str, Any]) -> None:
    import csv
    import io

    header, *rows = list(csv.reader(io.StringIO(out, newline="")))
    assert header[:3] == ["event_id", "item_id", "idempotency_key"], header
    decided = [dict(zip(header, row, strict=True)) for row in rows]
    assert len(decided) == 3 * seen["runs"], decided  # today's: this run's and the earlier run's
    suffix = f"-{seen['run']}"
    assert [
        (d["idempotency_key"].removesuffix(suffix), d["resolution"], d["resolved_by"], d["approved_by"])
        for d in decided
        if d["idempotency_key"].endswith(suffix)
    ] == [
        ("ACME-2026-11-30-0042", "APPROVED", "reviewer", ""),
        ("ACME-2026-11-30-0043", "ADJUSTMENT_POSTED", "reviewer", "approver"),
        ("b-1", "APPROVED", "reviewer", ""),
    ], decided


def _reclaimed_nothing(out: str, seen: dict[str, Any]) -> None:
    assert _json(out) == {"reclaimed": 0, "items": []}, out


def _feed(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    # The feed from its start: the first run's first item, whichever run this is.
    assert [e["event"] for e in body["events"]] == ["ENQUEUED", "LEASED"], body
    (key,) = {e["item"]["idempotency_key"] for e in body["events"]}
    this_run = f"ACME-2026-11-30-0042-{seen['run']}"
    assert (
        key == this_run if seen["runs"] == 1 else key != this_run and key.startswith("ACME-2026-11-30-0042-")
    )
    # Each event carries the item as it stood right after it (issue 42), never a lease token.
    first, second = body["events"]
    assert (first["item"]["state"], second["item"]["state"]) == ("PENDING", "ASSIGNED"), body
    assert first["item_as_of"] == second["item_as_of"] == "event" and second["item"]["lease_token"] is None
    assert (
        re.fullmatch("[0-9a-f]{32}", body["next_cursor"])
        and body["next_cursor"] == body["events"][1]["cursor"]
    )


def _nothing(out: str, seen: dict[str, Any]) -> None:
    _empty(out)


def _run_suffix(out: str, seen: dict[str, Any]) -> None:
    assert re.fullmatch(r"[0-9a-f]{8}", out), out
    seen["run"] = out


EXPECTED: list[tuple[str, Check]] = [
    ("RUN=$(python3", _run_suffix),
    ("-X POST localhost:${PORT:-8000}/items ", _enqueued),
    ("LEASED=$(curl", _nothing),
    ('echo "$LEASED"', _leased),
    ('ID=$(echo "$LEASED"', _nothing),
    ('LEASE_TOKEN=$(echo "$LEASED"', _nothing),
    ("/items/$ID/renew", _renewed),
    ("leased_by=me", _mine),
    ("/items/$ID/complete", _completed),
    ("/items/$ID/events", _trail),
    ("localhost:${PORT:-8000}/resolutions", _catalogue),
    ("ACME-2026-11-30-0043", _big_enqueued),
    ("LEASED=$(curl", _nothing),
    ('ID=$(echo "$LEASED"', _nothing),
    ('LEASE_TOKEN=$(echo "$LEASED"', _nothing),
    ("/items/$ID/complete", _submitted),
    ("APPROVAL=$(curl", _nothing),
    ("APPROVAL_TOKEN=$(echo", _nothing),
    ("/items/$ID/approve", _approved),
    ("/items/batch", _batch),
    ("ID=$(curl -s -X POST localhost:${PORT:-8000}/leases", _nothing),
    ("/items/$ID/release", _released),
    ("due_before=", _due_soon),
    ("ID=$(curl -s -X POST localhost:${PORT:-8000}/leases", _nothing),
    ("localhost:${PORT:-8000}/items/complete ", _batch_completed),
    ("localhost:${PORT:-8000}/stats", _stats),
    ("TODAY=$(python3", _nothing),
    ("TOMORROW=$(python3", _nothing),
    ("/reports/throughput", _throughput),
    ("/reports/decisions.csv", _decisions_csv),
    ("/admin/reclaim", _reclaimed_nothing),
    ("localhost:${PORT:-8000}/events?limit=2", _feed),
]


def _serve_blocks() -> list[str]:
    return [b for b in sh_blocks(WALKTHROUGH) if "review-queue serve" in b]


def _walk_through() -> list[str]:
    blocks = [b for b in sh_blocks(WALKTHROUGH) if "review-queue serve" not in b]
    return [command for block in blocks for command in commands(block)]


def _readme_sample() -> list[str]:
    """The README's short curl sample: every sh block but the first (the two commands)."""
    return [command for block in sh_blocks(README)[1:] for command in commands(block)]


def test_the_walk_through_is_what_this_test_checks() -> None:
    walk = _walk_through()
    assert len(walk) == len(EXPECTED), "\n---\n".join(walk)
    for command, (fragment, _) in zip(walk, EXPECTED, strict=True):
        assert fragment in command, f"expected a command with {fragment!r}, the docs have:\n{command}"


@pytest.mark.parametrize("page", ["README.md", "docs/walkthrough.md", "docs/client.md"])
def test_the_snippets_need_nothing_a_fresh_machine_lacks(page: str) -> None:
    text = (REPO_ROOT / page).read_text()
    assert "jq " not in text, "the snippets use python3 for JSON, not jq (not on a fresh machine)"
    assert "uv run" not in text, "uv may not be on PATH on a fresh machine: use .venv/bin or make"
    assert "localhost:8000" not in text, "the port is ${PORT:-8000}"


def _needs(tool: str) -> str:
    path = shutil.which(tool)
    assert path, f"the docs' snippets need {tool} on PATH (apt-get install {tool})"
    return path


def _run_twice(
    commands: list[str],
    expected: list[tuple[str, Check]],
    live_server: str,
    make_token: Callable[[str, str], str],
) -> None:
    """Run the commands in one bash session, twice over one database, and check every answer."""
    _needs("curl"), _needs("python3")
    script = ["set -eu -o pipefail"]
    for command in commands:
        # The RUN suffix is printed, so that the checks know this run's keys.
        script += [
            command,
            'printf "%s" "$RUN"' if command.startswith("RUN=") else ":",
            f"printf '\\n{END}\\n'",
        ]
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/tmp"),
        "PORT": live_server.rsplit(":", 1)[1],
        # As `make run` prints them: subjects admin and reviewer.
        "RQ_ADMIN": make_token("admin", "admin"),
        "RQ_REVIEWER": make_token("reviewer", "reviewer"),
        "RQ_APPROVER": make_token("approver", "approver"),
    }
    for runs in (1, 2):
        result = subprocess.run(
            ["bash", "-c", "\n".join(script)], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, f"run {runs} of the snippets failed:\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, f"run {runs}:\n{result.stderr}"
        outputs = result.stdout.split(f"\n{END}\n")
        assert outputs[-1] == "", outputs[-1]
        assert len(outputs) - 1 == len(expected), result.stdout
        seen: dict[str, Any] = {"runs": runs}
        for out, (fragment, check) in zip(outputs, expected, strict=False):
            try:
                check(out, seen)
            except (AssertionError, ValueError, KeyError) as error:
                raise AssertionError(f"run {runs}: the command with {fragment!r} answered:\n{out}") from error


def test_the_curl_walk_through_answers_as_documented_twice_over_one_database(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    _run_twice(_walk_through(), EXPECTED, live_server, make_token)


def _sample_completed(out: str, seen: dict[str, Any]) -> None:
    body = _json(out)
    assert body["outcome"] == "resolved", body
    item = body["item"]
    assert (item["idempotency_key"], item["state"], item["resolution"], item["resolved_by"]) == (
        f"ACME-2026-11-30-0042-{seen['run']}",
        "RESOLVED",
        "APPROVED",
        "reviewer",
    ), item


README_SAMPLE: list[tuple[str, Check]] = [
    ("RUN=$(python3", _run_suffix),
    ("-X POST localhost:${PORT:-8000}/items ", _enqueued),
    ("LEASED=$(curl", _nothing),
    ('ID=$(echo "$LEASED"', _nothing),
    ('LEASE_TOKEN=$(echo "$LEASED"', _nothing),
    ("/items/$ID/complete", _sample_completed),
]


def test_the_readme_sample_is_what_this_test_checks() -> None:
    """Every sh block of the README is run: the first is the two commands (Makefile targets; `make
    test` runs this very test), and every command of the others is the sample, checked below."""
    (first, *_) = sh_blocks(README)
    assert [c.split("#")[0].strip() for c in commands(first)] == README_COMMANDS
    sample = _readme_sample()
    assert len(sample) == len(README_SAMPLE), "\n---\n".join(sample)
    for command, (fragment, _) in zip(sample, README_SAMPLE, strict=True):
        assert fragment in command, f"expected a command with {fragment!r}, the README has:\n{command}"
    for target in README_COMMANDS:
        assert re.search(rf"^{target.split()[1]}:", (REPO_ROOT / "Makefile").read_text(), re.M), target


def test_the_readme_sample_answers_as_documented_twice_over_one_database(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    _run_twice(_readme_sample(), README_SAMPLE, live_server, make_token)


def test_the_reclaim_demo_reclaims(db_url: str, make_token: Callable[[str, str], str]) -> None:
    """The walk-through's way to see /admin/reclaim at work, run as written (PORT and DATABASE_URL added)."""
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
            assert server.poll() is None, "the walk-through's serve command exited"
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


def test_every_sh_block_of_the_walk_through_is_run() -> None:
    blocks = sh_blocks(WALKTHROUGH)
    run = {c for c in _walk_through()} | {c for b in _serve_blocks() for c in commands(b)}
    assert {c for b in blocks for c in commands(b)} == run


def test_auto_adjudicate_runs_until_ctrl_c(
    live_server: str, make_token: Callable[[str, str], str], sql: Any, tmp_path: Any
) -> None:
    """docs/client.md's Python client example, run as written: it works the queue and keeps polling
    until Ctrl-C (SIGINT), then returns its tally, which it prints."""
    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", CLIENT, re.S) if "auto_adjudicate" in b]
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


def test_the_webhook_receiver_gets_verified_deliveries(
    db_url: str, make_token: Callable[[str, str], str], tmp_path: Any
) -> None:
    """docs/client.md's ten-line receiver, run as written (its port changed): a subscription to it, a
    deliverer beside the API as `make run` has, and a resolution that reaches it, verified."""
    from tests.support.api import item_body
    from tests.support.servers import start_server, stop_server

    (snippet,) = [b for b in re.findall(r"```python\n(.*?)```", CLIENT, re.S) if "webhook_receiver" in b]
    code = [line for line in snippet.splitlines() if line.strip() and not line.startswith("#")]
    assert len(code) <= 14, "the receiver is meant to be about ten lines"
    port = free_port()
    script = tmp_path / "webhook_receiver.py"
    script.write_text(snippet.replace("8001", str(port)))
    env = {"REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP": "1", "REVIEW_QUEUE_WEBHOOK_ALLOW_HOSTS": "127.0.0.1",
           "REVIEW_QUEUE_DELIVERER_INTERVAL_MS": "100", "DATABASE_URL": db_url}  # fmt: skip
    server, base = start_server(env, deliverer=True)
    receiver = None
    try:
        admin = {"Authorization": f"Bearer {make_token('admin', 'admin')}"}
        reviewer = {"Authorization": f"Bearer {make_token('reviewer', 'reviewer')}"}
        hook = httpx.put(f"{base}/webhooks/demo", json={"url": f"http://127.0.0.1:{port}/"}, headers=admin)
        assert hook.status_code == 201, hook.text
        receiver = subprocess.Popen(
            [str(REPO_ROOT / ".venv/bin/python"), str(script)],
            env={**os.environ, "RQ_WEBHOOK_SECRET": hook.json()["secret"], "PYTHONPATH": str(REPO_ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

        def listening() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return True
            return False

        # Started, it takes a moment to listen; a delivery before that would be retried, and this
        # test reads the attempts.
        wait_for(listening, 30)
        item = httpx.post(f"{base}/items", json=item_body(), headers=admin).json()
        (held,) = httpx.post(f"{base}/leases", json={"batch_size": 1}, headers=reviewer).json()["items"]
        done = httpx.post(
            f"{base}/items/{held['id']}/complete", json={"resolution": "APPROVED"}, headers=reviewer
        )
        assert done.status_code == 200, done.text
        assert receiver.stdout is not None
        line = receiver.stdout.readline()  # blocks until the delivery is printed (the test has a timeout)
        assert line.split() == ["item.resolved", item["id"], "RESOLVED"], (line, receiver.poll())

        def deliveries() -> list[dict[str, Any]]:
            return list(httpx.get(f"{base}/webhooks/demo/deliveries", headers=admin).json()["deliveries"])

        wait_for(deliveries, 30)  # recorded right after the answer came back
        assert [(d["outcome"], d["status_code"]) for d in deliveries()] == [("delivered", 204)]
    finally:
        if receiver is not None:
            receiver.kill()
            receiver.wait()
        stop_server(server)
