"""The tiers run longest first (tests/conftest.py): `--dist loadgroup` hands out the tests in
collection order, so the system tier's minutes-long tests go out while the many short unit and
integration tests are left to even out the two workers' ends."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import pytest_collection_modifyitems
from tests.support import TESTS


@dataclass
class Collected:
    """What the hook reads of a pytest.Item: its path and node id; what it writes: the marker."""

    file: str
    name: str
    markers: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return TESTS / self.file

    @property
    def nodeid(self) -> str:
        return f"tests/{self.file}::{self.name}"

    def add_marker(self, marker: pytest.MarkDecorator) -> None:
        self.markers.append(marker.name)


def test_the_system_tier_goes_first_and_the_unit_tier_last_each_file_in_its_order() -> None:
    items = [
        Collected("integration/api/test_a.py", "test_1"),
        Collected("integration/api/test_a.py", "test_2"),
        Collected("system/api/test_b.py", "test_1"),
        Collected("system/api/test_b.py", "test_2"),
        Collected("system/test_c.py", "test_1"),
        Collected("unit/test_d.py", "test_1"),
        Collected("integration/test_e.py", "test_1"),
    ]
    pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/system/api/test_b.py::test_1",
        "tests/system/api/test_b.py::test_2",
        "tests/system/test_c.py::test_1",
        "tests/integration/api/test_a.py::test_1",
        "tests/integration/api/test_a.py::test_2",
        "tests/integration/test_e.py::test_1",
        "tests/unit/test_d.py::test_1",
    ], [item.nodeid for item in items]
    assert {item.nodeid: item.markers for item in items}["tests/unit/test_d.py::test_1"] == ["unit"]
    assert all(item.markers == [item.file.split("/")[0]] for item in items), items
