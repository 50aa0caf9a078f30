"""Crafted bodies over a real socket (the API in its own process): each refused, the connection kept."""

import http.client
import json
from collections.abc import Callable

from tests.support.api import JSON, OFFSETS, item_body, raw_body


def test_crafted_bodies_keep_the_connection_alive(
    live_server: str, make_token: Callable[[str, str], str]
) -> None:
    host, port = live_server.removeprefix("http://").split(":")
    headers = {"Authorization": f"Bearer {make_token('ada', 'admin')}", **JSON}
    deep = "[" * 700 + "]" * 700
    crafted = [
        ("/items", raw_body(item_body(context={"a": "N"}), replace={"N": deep})),
        (
            "/items",
            raw_body(item_body(context={"a": "N"}), replace={"N": "[" + ",".join(["1e300"] * 110) + "]"}),
        ),
        ("/items", raw_body(item_body(variance_amount="N"), replace={"N": "1E+1000000"})),
        (
            "/items/batch",
            b'{"items": [' + raw_body(item_body(variance_amount="N"), replace={"N": "-1E+1000000"}) + b"]}",
        ),
        ("/leases", b'{"batch_size": 1E+1000000}'),
        ("/items", json.dumps(item_body()).removesuffix("}").encode() + b', "source_hash": "again"}'),
    ]
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.connect()
        sock = connection.sock
        for path, body in crafted:
            connection.request("POST", path, body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 422, (path, body[:200], answer)
            assert json.loads(answer)["code"] == "VALIDATION_ERROR"
            assert response.getheader("connection") != "close" and connection.sock is sock, path
        # An offset PostgreSQL does not read, then a plain read: both answered on the same socket.
        connection.request("POST", "/items", body=json.dumps(item_body(due_at=OFFSETS[0])), headers=headers)
        response = connection.getresponse()
        assert response.status == 201, response.read()
        response.read()
        connection.request("GET", "/stats", headers=headers)
        response = connection.getresponse()
        assert response.status == 200, response.read()
        response.read()
        assert connection.sock is sock
    finally:
        connection.close()
