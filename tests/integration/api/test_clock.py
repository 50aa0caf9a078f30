"""Clock independence: every lease and reclaim decision is taken on the database clock.

The service never reads the wall clock: lease_expires_at is `now() + lease` and the reclaim
cut-off is `now() - grace`, both inside the statements (db/queue/lease.py). Two tests hold that up:

- by inspection: no module of the service (api/, db/, cli/) calls a wall-clock function
  (time.time, datetime.now, ...). SQLAlchemy's `func.now()` is the database's clock and allowed;
  monotonic timers (durations, timeouts) are not wall clock and allowed.
- in action: with the application's clock skewed by +6 h and -6 h (time.time, time.time_ns,
  datetime.now/utcnow/today and date.today patched for every module, as a skewed host would show
  them), a fresh lease is not reclaimed, a lease backdated on the database clock past the grace
  is (over the API and by the standalone reclaimer), one inside the grace is not, the stats count
  them on the database clock, and the leased_at of a lease (and lease_expires_at - lease of a
  renewal) lies between two reads of the database's now() taken just before and just after the
  call. A service that computed any of these from the application's clock would be six hours off
  in one direction or the other and fail.
"""

import ast
import asyncio
import datetime as datetime_module
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.settings import REPO_ROOT
from cli.reclaimer import drain_once
from db.queue import rows
from tests.support import backdate_lease
from tests.support.api import item_body
from tests.support.postgres import make_settings

LEASE = timedelta(seconds=30)
GRACE = timedelta(seconds=10)  # the shortest reclaim_after_s
SKEWS = [timedelta(hours=6), timedelta(hours=-6)]
# A float seconds timestamp (time.time()) carries about a microsecond of rounding.
ROUNDING = timedelta(microseconds=2)

# Wall-clock reads: these functions of the time module, and these methods of datetime and date.
# (Monotonic clocks, time.monotonic() or loop.time(), measure durations and are fine.)
TIME_READS = {
    "time",
    "time_ns",
    "localtime",
    "gmtime",
    "ctime",
    "asctime",
    "clock_gettime",
    "clock_gettime_ns",
}
DATETIME_READS = {"now", "utcnow", "today"}
SERVICE = ("api", "db", "cli")  # not client/: the Python client runs on the reviewers' machines

_real_datetime = datetime_module.datetime
_real_date = datetime_module.date
_real_time = time.time
_real_time_ns = time.time_ns


class _Stands_in(type):
    """isinstance(a real datetime, SkewedDatetime) stays true, so patching the classes breaks nothing."""

    real: type

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls.real)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, cls.real)


def skew_app_clock(monkeypatch: pytest.MonkeyPatch, skew: timedelta) -> None:
    """Make every wall-clock read of this process `skew` off, as on a host with a wrong clock."""

    class SkewedDatetime(_real_datetime, metaclass=_Stands_in):
        real = _real_datetime

        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return _real_datetime.now(tz) + skew

        @classmethod
        def utcnow(cls) -> Any:
            return _real_datetime.now(UTC).replace(tzinfo=None) + skew

        @classmethod
        def today(cls) -> Any:
            return _real_datetime.now() + skew

    class SkewedDate(_real_date, metaclass=_Stands_in):
        real = _real_date

        @classmethod
        def today(cls) -> Any:
            return (_real_datetime.now() + skew).date()

    seconds = skew.total_seconds()
    monkeypatch.setattr(time, "time", lambda: _real_time() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: _real_time_ns() + int(seconds * 1e9))
    monkeypatch.setattr(datetime_module, "datetime", SkewedDatetime)
    monkeypatch.setattr(datetime_module, "date", SkewedDate)
    # Modules that did `from datetime import datetime` or `from time import time` hold the real ones.
    replacements = {
        id(_real_datetime): SkewedDatetime,
        id(_real_date): SkewedDate,
        id(_real_time): time.time,
        id(_real_time_ns): time.time_ns,
    }
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".")[0] not in SERVICE:
            continue
        for attr, value in list(vars(module).items()):
            if id(value) in replacements:
                monkeypatch.setattr(module, attr, replacements[id(value)])


def _calls_wall_clock(path: Path) -> list[str]:
    """Every call in `path` that reads the wall clock, however time and datetime were imported."""
    tree = ast.parse(path.read_text(), str(path))
    modules: dict[str, str] = {}  # local name -> "time" | "datetime"
    classes: set[str] = set()  # local names of datetime.datetime and datetime.date
    functions: set[str] = set()  # local names of time.time and friends
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("time", "datetime"):
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module == "datetime":
            classes |= {a.asname or a.name for a in node.names if a.name in ("datetime", "date")}
        elif isinstance(node, ast.ImportFrom) and node.module == "time":
            functions |= {a.asname or a.name for a in node.names if a.name in TIME_READS}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f, hit = node.func, False
        if isinstance(f, ast.Name):
            hit = f.id in functions
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name):
            owner = f.value.id
            hit = (modules.get(owner) == "time" and f.attr in TIME_READS) or (
                owner in classes and f.attr in DATETIME_READS
            )
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute):
            inner = f.value  # datetime.datetime.now(), dt.date.today()
            hit = (
                isinstance(inner.value, ast.Name)
                and modules.get(inner.value.id) == "datetime"
                and inner.attr in ("datetime", "date")
                and f.attr in DATETIME_READS
            )
        if hit:
            found.append(f"{path}:{node.lineno}: {ast.unparse(f)}()")
    return found


def test_the_service_never_reads_the_wall_clock() -> None:
    files = [p for package in SERVICE for p in sorted((REPO_ROOT / package).rglob("*.py"))]
    assert any(p.match("db/queue/lease.py") for p in files) and len(files) > 10, files
    found = [hit for p in files for hit in _calls_wall_clock(p)]
    assert not found, "wall-clock reads in the service; use the database's now():\n" + "\n".join(found)


def test_the_inspection_would_see_a_wall_clock_read(tmp_path: Path) -> None:
    """The check above is not blind: each way of reading the wall clock is reported."""
    source = tmp_path / "m.py"
    source.write_text(
        "import asyncio\nimport time\nimport datetime as dt\nfrom datetime import date, datetime\n"
        "from time import time as now_s\nfrom sqlalchemy import func\n"
        "a = datetime.now()\nb = time.time()\nc = now_s()\nd = dt.datetime.utcnow()\ne = date.today()\n"
        "f = func.now()\ng = time.monotonic()\nh = asyncio.get_event_loop().time()\n"
        "i = datetime.fromisoformat('2026-01-01T00:00:00+00:00')\n"
    )
    found = sorted(hit.split(": ", 1)[1] for hit in _calls_wall_clock(source))
    assert found == ["date.today()", "datetime.now()", "dt.datetime.utcnow()", "now_s()", "time.time()"]


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


@pytest.mark.parametrize("skew", SKEWS, ids=["app+6h", "app-6h"])
def test_leases_and_reclaims_follow_the_database_clock_not_the_apps(
    skew: timedelta,
    db_url: str,
    sql: psycopg.Connection,
    make_token: Callable[[str, str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    admin = {"Authorization": f"Bearer {make_token('root', 'admin')}"}
    alice = {"Authorization": f"Bearer {make_token('alice', 'reviewer')}"}

    def db_now() -> datetime:
        value: datetime = sql.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        return value

    skew_app_clock(monkeypatch, skew)
    # The skew is in effect for every way the service's code could read the clock. Each read is
    # bracketed by two reads of the database clock (same host, so same clock), whatever the load.
    reads: list[Callable[[], datetime]] = [
        lambda: _real_datetime.fromtimestamp(time.time(), UTC),
        lambda: _real_datetime.fromtimestamp(time.time_ns() / 1e9, UTC),
        lambda: datetime_module.datetime.now(UTC),
        lambda: rows.datetime.now(UTC),  # db.queue.rows' own `datetime` name
    ]
    for read in reads:
        before, app_now, after = db_now(), read(), db_now()
        assert before - ROUNDING <= app_now - skew <= after + ROUNDING, (before, app_now, after)
    local_dates = {(db_now() + skew + timedelta(seconds=d)).astimezone().date() for d in (-5, 0, 5)}
    assert datetime_module.date.today() in local_dates, (datetime_module.date.today(), local_dates)

    settings = make_settings(
        db_url, lock_timeout_ms=int(LEASE.total_seconds() * 1000), reclaim_after_s=int(GRACE.total_seconds())
    )
    with TestClient(create_app(settings), raise_server_exceptions=False) as client:

        def reclaim() -> list[str]:
            response = client.post("/admin/reclaim", headers=admin)
            assert response.status_code == 200, response.text
            return [i["id"] for i in response.json()["items"]]

        def stats() -> tuple[int, int]:
            body = client.get("/stats", headers=alice).json()
            return body["expired_unreclaimed"], body["reclaimable"]

        for _ in range(3):
            assert client.post("/items", json=item_body(), headers=admin).status_code == 201
        # The lease's transaction starts between these two database clock reads, so its now() does too.
        before = db_now()
        response = client.post("/leases", json={"batch_size": 3}, headers=alice)
        after = db_now()
        assert response.status_code == 200, response.text
        leased = response.json()["items"]
        assert len(leased) == 3
        for item in leased:
            assert _ts(item["lease_expires_at"]) - _ts(item["leased_at"]) == LEASE, item
            assert before <= _ts(item["leased_at"]) <= after, (item, before, after)

        # Fresh leases: nothing expired, nothing to reclaim, for the API and for the reclaimer.
        assert stats() == (0, 0)
        assert reclaim() == []
        assert asyncio.run(drain_once(settings, db_url)) == 0

        # Backdated on the database clock: one past the grace, one expired but inside it.
        past, inside, renewed = (item["id"] for item in leased)
        backdate_lease(sql, past, seconds=(GRACE + timedelta(seconds=5)).total_seconds())
        backdate_lease(sql, inside, seconds=(GRACE - timedelta(seconds=5)).total_seconds())
        assert stats() == (2, 1)
        assert reclaim() == [past]

        # The standalone reclaimer, once the other one is past the grace too.
        backdate_lease(sql, inside, seconds=(GRACE + timedelta(seconds=5)).total_seconds())
        assert asyncio.run(drain_once(settings, db_url)) == 1
        states = dict(sql.execute("SELECT id::text, state FROM review_queue_item").fetchall())
        assert states == {past: "PENDING", inside: "PENDING", renewed: "ASSIGNED"}

        # A renewal of an expired lease runs from the database's now(), and keeps it from the reclaim.
        backdate_lease(sql, renewed, seconds=3600)
        before = db_now()
        response = client.post(f"/items/{renewed}/renew", headers=alice)
        after = db_now()
        assert response.status_code == 200, response.text
        expires = _ts(response.json()["lease_expires_at"])
        assert before + LEASE <= expires <= after + LEASE, (expires, before, after)
        assert stats() == (0, 0)
        assert reclaim() == []
        assert asyncio.run(drain_once(settings, db_url)) == 0
        assert sql.execute("SELECT state FROM review_queue_item WHERE id = %s", (renewed,)).fetchone() == (
            "ASSIGNED",
        )
