"""db/ sits below api/: the arrows of the import graph point down only."""

import ast
from pathlib import Path

from api.settings import REPO_ROOT


def _imported_modules(path: Path) -> list[str]:
    modules: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.append(node.module)
    return modules


def test_db_imports_nothing_from_api_or_cli() -> None:
    files = sorted((REPO_ROOT / "db").rglob("*.py"))
    assert any(p.match("db/queue/lease.py") for p in files), files  # the walk sees the package
    upward = [
        f"{path.relative_to(REPO_ROOT)}: {module}"
        for path in files
        for module in _imported_modules(path)
        if module.split(".")[0] in ("api", "cli", "bench", "tests")
    ]
    assert not upward, "db/ imports from a layer above it:\n" + "\n".join(upward)


def test_no_shipped_package_imports_the_tests() -> None:
    """api, db, cli, client and bench ship in the wheel; tests/ does not (issue 43). Before: the
    bench took its tokens and its webhook receiver from tests/support/."""
    files = [
        path
        for package in ("api", "db", "cli", "client", "bench")
        for path in (REPO_ROOT / package).rglob("*.py")
    ]
    assert any(p.match("bench/harness.py") for p in files), files
    into_tests = [
        f"{path.relative_to(REPO_ROOT)}: {module}"
        for path in files
        for module in _imported_modules(path)
        if module.split(".")[0] == "tests"
    ]
    assert not into_tests, "shipped code imports from tests/:\n" + "\n".join(into_tests)
