"""A real webhook receiver for the bench and the tests: an HTTP server on 127.0.0.1 in a thread,
that keeps every request it gets, verifies each with the standardwebhooks package as a receiver
would, and answers what the caller tells it to (a status, a delay, a redirect, a body without
end), or is taken down and brought back."""

import http.server
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

# What an "endless" answer sends at most: far more than a deliverer may read, and yet a bound, so
# that a deliverer which reads it all (the bug) costs this machine a few hundred MB, not all of it.
ENDLESS_CAP = 256 * 1024 * 1024


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    answered: int = 0
    verified: Any = None  # the parsed body when its signature verified with the path's secret
    forged: str | None = None  # why it did not verify

    @property
    def payload(self) -> Any:
        return json.loads(self.body)


@dataclass
class Receiver:
    """`answer(request) -> (status, headers)` decides each answer (200 by default); `secrets` maps a
    path to the secret its signatures must verify with. With `endless` set, an answer's body has no
    length and no end: it is written until the client closes the connection (or ENDLESS_CAP), and
    `body_sent` keeps how many bytes of it went out, by webhook-id."""

    answer: Callable[[Received], tuple[int, dict[str, str]]] = lambda _: (200, {})
    delay_s: float = 0.0
    secrets: dict[str, str] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)
    most_in_flight: dict[str, int] = field(default_factory=dict)
    in_flight_ids: set[str] = field(default_factory=set)  # webhook-ids being answered right now
    endless: bool = False
    body_sent: dict[str, int] = field(default_factory=dict)
    port: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: http.server.ThreadingHTTPServer | None = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                got = Received(
                    self.path, {k.lower(): v for k, v in self.headers.items()}, self.rfile.read(length)
                )
                secret = receiver.secrets.get(self.path)
                if secret is not None:
                    try:
                        got.verified = Webhook(secret).verify(got.body, got.headers)
                    except WebhookVerificationError as error:
                        got.forged = str(error)
                with receiver.lock:
                    receiver.received.append(got)
                    now = receiver.in_flight.get(self.path, 0) + 1
                    receiver.in_flight[self.path] = now
                    receiver.most_in_flight[self.path] = max(now, receiver.most_in_flight.get(self.path, 0))
                    receiver.in_flight_ids.add(got.headers.get("webhook-id", ""))
                try:
                    time.sleep(receiver.delay_s)
                    status, headers = (400, {}) if got.forged else receiver.answer(got)
                    got.answered = status
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    if receiver.endless:
                        self.end_headers()  # HTTP/1.0 and no length: the body ends when the connection does
                        self._endless(got.headers.get("webhook-id", ""))
                    else:
                        self.send_header("content-length", "0")
                        self.end_headers()
                finally:
                    with receiver.lock:
                        receiver.in_flight[self.path] -= 1
                        receiver.in_flight_ids.discard(got.headers.get("webhook-id", ""))

            def _endless(self, webhook_id: str) -> None:
                chunk, sent = b"x" * 65536, 0
                try:
                    while sent < ENDLESS_CAP:
                        self.wfile.write(chunk)
                        sent += len(chunk)
                except OSError:
                    pass  # the client hung up: what it wanted
                finally:
                    with receiver.lock:
                        receiver.body_sent[webhook_id] = sent
                self.close_connection = True

            def log_message(self, *_: object) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Down: connections to the port are refused until `start` (on the same port) again."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def of(self, path: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.path == path]
