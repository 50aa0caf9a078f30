"""Many HTTP clients against a real uvicorn server: nothing leased twice, nothing lost."""

from collections.abc import Callable

import psycopg

from tests.support import LONG
from tests.support.api import drain_concurrently


def test_concurrent_http_clients_resolve_every_item_exactly_once(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    total, clients = (2000, 24) if LONG else (400, 12)
    drain_concurrently(live_server, make_token, sql, total=total, clients=clients)
