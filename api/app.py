"""The FastAPI application: create_app() wires settings, the engine, errors and routes."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from asgi_correlation_id import CorrelationIdMiddleware
from cachetools import TTLCache
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from api.errors import COMMON_PROBLEMS, install_error_handlers
from api.logs import configure_logging
from api.metrics import AccessLog
from api.middleware import BodyLimit
from api.routes import admin, audit, health, items, leases, ops
from api.settings import Settings, get_settings
from db.engine import create_engine, database_url

MAX_BODY_BYTES = 1024 * 1024


def _acceptable_request_id(value: str) -> bool:
    # Take a caller's id when it is short and printable ASCII; otherwise generate one (a log
    # pipeline must not receive homoglyphs or control characters from a client).
    return 0 < len(value) <= 128 and value.isascii() and all(c.isalnum() or c in "-_.:" for c in value)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings.log_format, settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = create_engine(
            database_url(settings.database_url, settings.data_dir),
            pool_size=settings.pool_size,
            max_overflow=settings.pool_max_overflow,
            pool_timeout_s=settings.pool_timeout_ms / 1000,
            connect_timeout_s=settings.connect_timeout_s,
            prepare_threshold=settings.prepare_threshold or None,
        )
        app.state.engine = engine
        try:
            yield
        finally:
            await engine.dispose()

    app = FastAPI(
        title="review-queue",
        summary="Lease-based review queue for reconciliation exceptions.",
        version="0.1.0",
        lifespan=lifespan,
        # A redirect to the slash-less path would be built from the client's Host header (an open
        # redirect to any host); a path with a trailing slash is simply not found.
        redirect_slashes=False,
    )
    app.state.settings = settings
    app.state.token_cache = (
        TTLCache(maxsize=10_000, ttl=settings.token_cache_s) if settings.token_cache_s else None
    )
    install_error_handlers(app)
    # Added innermost first: the request id is bound before the access log runs.
    app.add_middleware(BodyLimit, max_body_size=MAX_BODY_BYTES)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(AccessLog)
    app.add_middleware(CorrelationIdMiddleware, header_name="X-Request-ID", validator=_acceptable_request_id)
    app.include_router(health.router)
    for router in (items.router, leases.router, admin.router, ops.router, audit.router):
        app.include_router(router, responses=COMMON_PROBLEMS)
    return app
