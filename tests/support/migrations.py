"""A migration run while writers keep writing: the online-migration tests' harness."""

import threading
from collections.abc import Callable
from typing import TypeVar

import psycopg

from tests.support.postgres import libpq

T = TypeVar("T")

# A write is (connection, writer number, its count so far, whether the upgrade is done) -> what it wrote.
Write = Callable[[psycopg.Connection, int, int, bool], T]


def upgrade_while_writing(
    superuser_url: str, write: Write[T], upgrade: Callable[[], None], *, writers: int = 4
) -> tuple[list[list[T]], list[int]]:
    """`writers` threads write without pause on connections of their own; once each has written 10
    times, `upgrade` runs, and they go on until each has written 5 more. What each wrote, and how
    many each had written before the upgrade. A writer's error fails the caller."""
    stop, upgraded = threading.Event(), threading.Event()
    written: list[list[T]] = [[] for _ in range(writers)]
    errors: list[BaseException] = []

    def run(n: int, out: list[T]) -> None:
        try:
            with psycopg.connect(libpq(superuser_url), autocommit=True) as conn:
                while not stop.is_set() or len(out) < 5:
                    out.append(write(conn, n, len(out), upgraded.is_set()))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(n, out)) for n, out in enumerate(written)]
    for thread in threads:
        thread.start()
    # Each writer under way (not 40 writes in all: on a loaded machine one thread may start late, and
    # the tests check that every writer wrote before the upgrade).
    while min(map(len, written)) < 10:
        stop.wait(0.01)
        assert not errors, errors
    during = [len(out) for out in written]
    upgrade()
    upgraded.set()
    done = [len(out) for out in written]
    while any(len(out) < n + 5 for out, n in zip(written, done, strict=True)):
        stop.wait(0.01)
        assert not errors, errors
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return written, during
