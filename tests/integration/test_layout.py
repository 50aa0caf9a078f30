"""The tests' own layout: shared fixtures live in a conftest.py, shared plain helpers in
tests/support/. So no test module imports another test module (its tests would be collected, and
run, twice, and the two files could no longer move apart), and nothing imports a conftest's private
names (pytest owns conftest modules; a helper a test needs is a public name in tests/support/)."""

import ast
from pathlib import Path

from tests.support import TESTS, TIERS


def is_test_module(module: str) -> bool:
    return module.rsplit(".", 1)[-1].startswith("test_")


def is_conftest(module: str) -> bool:
    return module.rsplit(".", 1)[-1] == "conftest"


def bad_imports(root: Path) -> list[str]:
    """Each import under `root` that breaks the layout, as `path:line: what`."""
    found = []
    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [
                    f"{where}:{node.lineno}: imports the test module {alias.name}"
                    for alias in node.names
                    if alias.name.startswith("tests.") and is_test_module(alias.name)
                ]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if not (node.module == "tests" or node.module.startswith("tests.")):
                    continue
                if is_test_module(node.module):
                    found.append(f"{where}:{node.lineno}: imports from the test module {node.module}")
                found += [
                    f"{where}:{node.lineno}: imports the test module {node.module}.{alias.name}"
                    for alias in node.names
                    if is_test_module(alias.name)
                ]
                if is_conftest(node.module):
                    found += [
                        f"{where}:{node.lineno}: imports the private {alias.name} from {node.module}"
                        for alias in node.names
                        if alias.name.startswith("_")
                    ]
    return found


def test_no_test_imports_a_test_module_or_a_conftests_private_names() -> None:
    assert bad_imports(TESTS) == []


def test_the_check_finds_each_kind_of_bad_import(tmp_path: Path) -> None:
    root = tmp_path / "tests"
    (root / "api").mkdir(parents=True)
    (root / "api" / "test_a.py").write_text(
        "from tests.api.test_b import helper\n"
        "from tests.api import test_b as b\n"
        "import tests.db.test_c\n"
        "from tests.conftest import _admin_sql, libpq\n"
        "def test_x() -> None:\n"
        "    from tests.api.conftest import _fixture\n"
    )
    (root / "api" / "test_fine.py").write_text(
        "from tests.support import seed_items\nfrom tests.support.api import item_body\nimport pytest\n"
    )
    assert bad_imports(root) == [
        "tests/api/test_a.py:1: imports from the test module tests.api.test_b",
        "tests/api/test_a.py:2: imports the test module tests.api.test_b",
        "tests/api/test_a.py:3: imports the test module tests.db.test_c",
        "tests/api/test_a.py:4: imports the private _admin_sql from tests.conftest",
        "tests/api/test_a.py:6: imports the private _fixture from tests.api.conftest",
    ]


def test_every_test_file_is_in_a_tier_folder() -> None:
    """The tier of a test is its folder (tests/unit, tests/integration, tests/system; the marker
    comes from it in tests/conftest.py): a file elsewhere would be in no tier, left out of
    `make test-quick` and `make test-unit` without a word."""
    outside = sorted(
        path.relative_to(TESTS).as_posix()
        for path in TESTS.rglob("test_*.py")
        if "node_modules" not in path.parts and path.relative_to(TESTS).parts[0] not in TIERS
    )
    assert outside == [], f"test files outside tests/unit, tests/integration, tests/system: {outside}"
