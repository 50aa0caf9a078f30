"""A TCP relay to the test server that can freeze: it stops passing bytes and closes nothing, so to
its clients the server is a hung machine (nothing answers, nothing resets), while the server itself
and every other test on it go on. Cheaper than SIGSTOPping a server of one's own, and it can freeze
one engine's connections only."""

import asyncio
import contextlib
from types import TracebackType

import psycopg
from sqlalchemy.engine import make_url

from tests.support.postgres import libpq


class Relay:
    def __init__(self, url: str) -> None:
        self.url = url
        self.running = asyncio.Event()
        self.running.set()
        self.tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> "Relay":
        async with await psycopg.AsyncConnection.connect(libpq(self.url)) as conn:
            host, port = conn.info.host, conn.info.port
        self._open = (
            (lambda: asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}"))
            if host.startswith("/")
            else (lambda: asyncio.open_connection(host, port))
        )
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.running.set()
        self.server.close()
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    def through(self) -> str:
        """The URL through this relay (the same database, role and options but the socket's)."""
        url = make_url(self.url)
        query = {key: value for key, value in url.query.items() if key != "host"}
        return url.set(host="127.0.0.1", port=self.port, query=query).render_as_string(hide_password=False)

    def freeze(self) -> None:
        self.running.clear()

    def thaw(self) -> None:
        self.running.set()

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        server_in, server_out = await self._open()
        pumps = [
            asyncio.create_task(self._pump(client_in, server_out)),
            asyncio.create_task(self._pump(server_in, client_out)),
        ]
        self.tasks.update(pumps)
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        for pump in pumps:
            pump.cancel()
        for writer in (client_out, server_out):
            writer.close()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await source.read(65536):
                await self.running.wait()  # frozen: read, held, never passed on
                sink.write(data)
                await sink.drain()
