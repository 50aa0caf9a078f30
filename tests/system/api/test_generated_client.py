"""A client generated from the served /openapi.json with openapi-python-client, as a team using
the API would generate it, runs the reviewer's path against a live server. A schema change that
breaks generated clients (a renamed operation, a model they cannot parse) fails here."""

import importlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from db import roles
from tests.support.postgres import create_token, fresh_database, with_database
from tests.support.servers import start_server, stop_server

PACKAGE = "rq_generated"


@pytest.fixture(scope="module")
def live(server_url: str, template_db: str) -> Iterator[tuple[str, str]]:
    """(base URL, database URL) of one `review-queue serve` for the module."""
    with fresh_database(server_url, template_db) as name:
        url = with_database(server_url, name, role=roles.APP_ROLE)
        process, base = start_server({"DATABASE_URL": url})
        try:
            yield base, url
        finally:
            stop_server(process)


@pytest.fixture(scope="module")
def generated(live: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The client package, generated once per module (offline: the generator needs no network)."""
    root = tmp_path_factory.mktemp("generated-client")
    document = httpx.get(f"{live[0]}/openapi.json", timeout=10).json()
    # Known generator limit: openapi-python-client cannot parse a recursive schema, and an item's
    # `context` (any JSON, documented recursively so that schemathesis generates only what is
    # accepted) is one. It is read as plain JSON here; everything else must generate cleanly.
    assert "ContextValue" in document["components"]["schemas"]
    document["components"]["schemas"]["ContextValue"] = {}
    (root / "openapi.json").write_text(json.dumps(document))
    # No post-hooks: formatting the generated code with ruff is the user's business, and slow.
    # The audit export is NDJSON, which the generator reads as a file download.
    (root / "config.yml").write_text(
        f"post_hooks: []\npackage_name_override: {PACKAGE}\n"
        "content_type_overrides:\n  application/x-ndjson: application/octet-stream\n"
    )
    generator = Path(sys.executable).parent / "openapi-python-client"
    done = subprocess.run(
        [str(generator), "generate", "--path", "openapi.json", "--config", "config.yml",
         "--meta", "none", "--output-path", PACKAGE],
        cwd=root, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "Warning" not in output, f"the generator skipped parts of the schema:\n{output}"
    sys.path.insert(0, str(root))
    try:
        yield importlib.import_module(PACKAGE)
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
            del sys.modules[name]


def _op(generated: ModuleType, tag: str, operation: str) -> Any:
    return importlib.import_module(f"{generated.__name__}.api.{tag}.{operation}")


def test_generated_functions_are_named_by_operation_id(generated: ModuleType) -> None:
    for tag, operation in [
        ("leases", "lease_items"),
        ("items", "enqueue_item"),
        ("items", "enqueue_items"),
        ("items", "complete_item"),
        ("items", "complete_items"),
        ("items", "renew_item"),
        ("items", "release_item"),
        ("items", "requeue_item"),
        ("items", "approve_item"),
        ("items", "reject_item"),
        ("items", "comment_on_item"),
        ("resolutions", "list_resolutions"),
        ("resolutions", "put_resolution"),
        ("items", "list_items"),
        ("items", "get_item"),
        ("items", "get_item_events"),
        ("admin", "reclaim_expired"),
        ("items", "revise_item"),
        ("admin", "admin_release_item"),
        ("admin", "admin_release_reviewer"),
        ("admin", "reassign_item"),
        ("operations", "get_stats"),
        ("operations", "get_metrics"),
        ("health", "healthz"),
        ("health", "readyz"),
    ]:
        module = _op(generated, tag, operation)
        assert callable(module.sync) and callable(module.asyncio_detailed)


def test_generated_client_enqueue_lease_complete_retry_conflict(
    generated: ModuleType, live: tuple[str, str]
) -> None:
    base, url = live
    models = importlib.import_module(f"{PACKAGE}.models")
    client_of = importlib.import_module(PACKAGE).AuthenticatedClient

    def client(subject: str, role: str) -> Any:
        return client_of(
            base_url=base, token=create_token(url, subject, role), raise_on_unexpected_status=True
        )

    enqueue = _op(generated, "items", "enqueue_item")
    lease = _op(generated, "leases", "lease_items")
    complete = _op(generated, "items", "complete_item")
    events = _op(generated, "items", "get_item_events")

    with (
        client("ingest-bot", "ingest") as ingest,
        client("ann", "reviewer") as ann,
        client("bob", "reviewer") as bob,
    ):
        new = models.ItemIn(
            idempotency_key="gen-1",
            ledger_entity="ACME-CORP",
            variance_amount="12.50",
            match_decision=models.ItemInMatchDecision.PARTIAL,
            source_hash="sha256:9f2c",
        )
        created = enqueue.sync_detailed(client=ingest, body=new)
        assert created.status_code == 201, created.content
        item = created.parsed
        assert isinstance(item, models.ItemOut) and item.variance_amount == "12.50"
        assert enqueue.sync_detailed(client=ingest, body=new).status_code == 200  # idempotent

        leased = lease.sync(client=ann, body=models.LeaseIn(batch_size=5))
        assert isinstance(leased, models.LeaseOut)
        assert [i.id for i in leased.items] == [item.id]
        token = leased.items[0].lease_token
        assert isinstance(token, str)

        stranger = complete.sync(item.id, client=bob, body=models.CompleteIn(resolution="APPROVED"))
        assert isinstance(stranger, models.Problem) and stranger.code == "LEASE_NOT_HELD"

        body = models.CompleteIn(resolution="APPROVED", note="FX rounding", lease_token=token)
        done = complete.sync(item.id, client=ann, body=body)
        assert isinstance(done, models.CompleteOut), done
        assert done.outcome == models.CompleteOutOutcome.RESOLVED
        assert done.item.state == models.ItemOutState.RESOLVED and done.item.resolved_by == "ann"

        retry = complete.sync(item.id, client=ann, body=body)
        assert isinstance(retry, models.CompleteOut)
        assert retry.outcome == models.CompleteOutOutcome.ALREADY_RESOLVED

        conflict = complete.sync_detailed(item.id, client=ann, body=models.CompleteIn(resolution="REJECTED"))
        assert conflict.status_code == 409
        problem = conflict.parsed
        assert isinstance(problem, models.Problem), problem
        assert problem.code == "RESOLUTION_CONFLICT" and problem.status == 409
        assert "APPROVED" in problem.detail and problem.instance == f"/items/{item.id}/complete"

        trail = events.sync(item.id, client=ann)
        assert isinstance(trail, models.EventsOut)
        assert [e.event.value for e in trail.events] == ["ENQUEUED", "LEASED", "RESOLVED"]


def test_generated_client_revision_and_source_changed(generated: ModuleType, live: tuple[str, str]) -> None:
    base, url = live
    models = importlib.import_module(f"{PACKAGE}.models")
    client_of = importlib.import_module(PACKAGE).AuthenticatedClient

    def client(subject: str, role: str) -> Any:
        return client_of(
            base_url=base, token=create_token(url, subject, role), raise_on_unexpected_status=True
        )

    enqueue = _op(generated, "items", "enqueue_item")
    lease = _op(generated, "leases", "lease_items")
    complete = _op(generated, "items", "complete_item")
    revise = _op(generated, "items", "revise_item")
    with client("ingest-bot", "ingest") as ingest, client("cy", "reviewer") as cy:
        new = models.ItemIn(
            idempotency_key="gen-rev-1",
            ledger_entity="ACME-CORP",
            variance_amount="12.50",
            match_decision=models.ItemInMatchDecision.PARTIAL,
            source_hash="sha256:gen-a",
        )
        item = enqueue.sync(client=ingest, body=new)
        (leased,) = lease.sync(client=cy, body=models.LeaseIn(batch_size=1)).items
        assert leased.id == item.id
        revised = revise.sync(
            item.id,
            client=ingest,
            body=models.RevisionIn(variance_amount="13.00", source_hash="sha256:gen-b"),
        )
        assert isinstance(revised, models.RevisionOut), revised
        assert (
            revised.outcome == models.RevisionOutOutcome.REVISED and revised.item.variance_amount == "13.00"
        )
        refused = complete.sync(
            item.id, client=cy, body=models.CompleteIn(resolution="APPROVED", lease_token=leased.lease_token)
        )
        assert isinstance(refused, models.Problem) and refused.code == "SOURCE_CHANGED"
        current = refused.additional_properties["item"]
        assert current["variance_amount"] == "13.00"
        done = complete.sync(
            item.id,
            client=cy,
            body=models.CompleteIn(resolution="APPROVED", lease_token=current["lease_token"]),
        )
        assert isinstance(done, models.CompleteOut), done
