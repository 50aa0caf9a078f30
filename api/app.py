"""The FastAPI application: create_app() wires settings, the engine, errors and routes."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from cachetools import TTLCache
from fastapi import FastAPI

from api.errors import COMMON_PROBLEMS, install_error_handlers
from api.middleware import BodyLimit
from api.routes import admin, health, items, leases
from api.settings import Settings, get_settings
from db.engine import create_engine, database_url

MAX_BODY_BYTES = 1024 * 1024


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

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
    )
    app.state.settings = settings
    app.state.token_cache = (
        TTLCache(maxsize=10_000, ttl=settings.token_cache_s) if settings.token_cache_s else None
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_body_size=MAX_BODY_BYTES)
    app.include_router(health.router)
    for router in (items.router, leases.router, admin.router):
        app.include_router(router, responses=COMMON_PROBLEMS)
    return app
