"""The FastAPI application: create_app() wires settings, the engine, errors and routes."""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import fastapi_offline
from asgi_correlation_id import CorrelationIdMiddleware
from cachetools import TTLCache
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy.ext.asyncio import AsyncEngine

from api import desk, webhook_secret
from api.errors import COMMON_PROBLEMS, install_error_handlers, problem_responses
from api.examples import with_examples
from api.feed_watch import AnswerBudget, FeedWatch
from api.introspection import Introspection
from api.logs import configure_logging
from api.metrics import AccessLog
from api.middleware import BodyLimit
from api.oidc import OidcProvider
from api.routes import (
    admin,
    audit,
    feed,
    fx,
    health,
    holder,
    items,
    leases,
    oidc,
    ops,
    reports,
    resolutions,
    session,
    webhooks,
)
from api.settings import Settings, get_settings
from db import feed as db_feed
from db.engine import create_engine, database_url, libpq_url, transaction
from db.feed import Position
from db.notify import WorkSignal

log = logging.getLogger("review_queue.api")

MAX_BODY_BYTES = 1024 * 1024
DOCS_ASSETS = Path(fastapi_offline.__file__).parent / "static"
DOCS_ASSETS_URL = "/docs/assets"

# The version of the HTTP contract (OpenAPI info.version), not of the package: semantic versioning,
# the major bumped only for a breaking change (see docs/api.md, "Generated clients and versioning").
# 1.1: due_at, due_before, ledger_entity leases, overdue and aging in /stats.
# 1.2: source revisions (SOURCE_CHANGED), admin release and reassign, POST /items/complete.
# 1.3: the resolution catalogue, maker-checker approval (AWAITING_APPROVAL, approve, reject).
# 1.4: the change feed (GET /events), webhooks, the integration role; materiality (GET/PUT
# /resolutions/policy; effective_approval_threshold of each code); OIDC sign-in; the work list;
# reports (SLA, throughput, backlog) and the decisions export.
API_VERSION = "1.4.0"

# One tag per resource; generated clients group their functions by these.
TAGS = [
    {
        "name": "items",
        "description": "Enqueue, read and list items; the holder's complete, renew, release; approve and"
        " reject.",
    },
    {"name": "leases", "description": "Lease the oldest pending items, or proposals awaiting approval."},
    {"name": "resolutions", "description": "The resolution catalogue: codes, notes, approval thresholds."},
    {"name": "fx-rates", "description": "Exchange rates into the base currency, kept with who set them."},
    {"name": "admin", "description": "Operators' actions (admin role)."},
    {"name": "operations", "description": "Queue statistics and Prometheus metrics."},
    {"name": "health", "description": "Liveness and readiness; no token needed."},
    {"name": "session", "description": "The reviewer desk's cookie session: sign in and out."},
    {"name": "audit", "description": "The hash-chained audit trail, exported for auditors."},
    {"name": "feed", "description": "The change feed: every event across items, in an order safe to resume."},
    {
        "name": "webhooks",
        "description": "Signed webhooks (Standard Webhooks), delivered at least once (admin).",
    },
    {
        "name": "reports",
        "description": "The controller's reports: SLA attainment, throughput, backlog, the decisions export.",
    },
]


def _acceptable_request_id(value: str) -> bool:
    # Take a caller's id when it is short and printable ASCII; otherwise generate one (a log
    # pipeline must not receive homoglyphs or control characters from a client).
    return 0 < len(value) <= 128 and value.isascii() and all(c.isalnum() or c in "-_.:" for c in value)


def _serve_docs(app: FastAPI) -> None:
    """/docs (Swagger UI) and /redoc with every asset served by the service itself, from the
    fastapi-offline wheel: the pages work offline and under a Content-Security-Policy of 'self'."""
    app.mount(DOCS_ASSETS_URL, StaticFiles(directory=DOCS_ASSETS), name="docs-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{DOCS_ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            # No badge image from validator.swagger.io either: nothing leaves the origin.
            swagger_ui_parameters={**(app.swagger_ui_parameters or {}), "validatorUrl": None},
        )

    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{app.openapi_url}",
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{root}{DOCS_ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{DOCS_ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )

    # Plain Starlette routes, like FastAPI's own docs routes: public, and not in the schema.
    app.add_route("/docs", swagger_ui, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings.log_format, settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def engine_for(url: str) -> AsyncEngine:
            return create_engine(
                url,
                pool_size=settings.pool_size,
                max_overflow=settings.pool_max_overflow,
                pool_timeout_s=settings.pool_timeout_ms / 1000,
                connect_timeout_s=settings.connect_timeout_s,
                prepare_threshold=settings.prepare_threshold or None,
            )

        url = database_url(settings.database_url, settings.data_dir, settings.db_liveness)
        engine = engine_for(url)
        app.state.engine = engine
        # Reports, /stats and the decisions export: a standby when REVIEW_QUEUE_READ_DATABASE_URL is set.
        read_engine = engine
        if settings.read_database_url is not None:
            read_engine = engine_for(
                database_url(settings.read_database_url, settings.data_dir, settings.db_liveness)
            )
        app.state.read_engine = read_engine
        # One LISTEN connection per process, outside the pool, for POST /leases with wait_s; it
        # needs a connection that stays one backend (db/notify.py), hence its own URL behind a pooler.
        listen_url = url
        if settings.listen_database_url is not None:
            listen_url = database_url(settings.listen_database_url, settings.data_dir, settings.db_liveness)
        work_signal = WorkSignal(
            libpq_url(listen_url),
            poll_interval_s=settings.poll_interval_ms / 1000,
            connect_timeout_s=settings.connect_timeout_s,
        )
        work_signal.start()
        app.state.work_signal = work_signal

        async def feed_head() -> Position:
            async with (
                app.state.feed_looks,
                transaction(
                    engine,
                    lock_timeout_ms=settings.pg_lock_timeout_ms,
                    statement_timeout_ms=settings.statement_timeout_ms,
                ) as conn,
            ):
                return await db_feed.head(conn)

        # One look at the feed per poll interval for every GET /events that waits (api/feed_watch.py).
        feed_watch = FeedWatch(feed_head, interval_s=settings.poll_interval_ms / 1000)
        app.state.feed_watch = feed_watch
        # What an amount without a currency means here, and what every threshold is counted in.
        log.info("review_queue_base_currency", extra={"base_currency": settings.base_currency})
        try:
            yield
        finally:
            await work_signal.stop()
            await feed_watch.stop()
            await engine.dispose()
            if read_engine is not engine:
                await read_engine.dispose()
            if app.state.oidc is not None:
                await app.state.oidc.aclose()
                await app.state.introspection.aclose()

    app = FastAPI(
        title="review-queue",
        summary="Lease-based review queue for reconciliation exceptions.",
        version=API_VERSION,
        openapi_tags=TAGS,
        lifespan=lifespan,
        docs_url=None,  # FastAPI's own pages load their scripts from a CDN: see _serve_docs
        redoc_url=None,
        # A redirect to the slash-less path would be built from the client's Host header (an open
        # redirect to any host); a path with a trailing slash is simply not found.
        redirect_slashes=False,
        # Prometheus (/metrics) and the JSON logs are this service's telemetry; FastAPI's own
        # OpenTelemetry hooks would otherwise ask on every request whether a provider is set up.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_examples(FastAPI.openapi(app))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.state.settings = settings
    # GET /events' reads of the feed and the watcher's looks, at most half of the pool at once:
    # however many read, the other routes keep the rest (waiting for this holds no connection).
    app.state.feed_looks = asyncio.Semaphore(max(1, settings.pool_size // 2))
    app.state.feed_waiters = 0  # GET /events calls with wait_s in progress (routes/feed.py)
    app.state.feed_budget = AnswerBudget(settings.feed_answers_per_s)
    # The Fernet keys of webhook secrets; None: PUT /webhooks answers NOT_CONFIGURED.
    app.state.webhook_keys = webhook_secret.keys(settings)
    # Sign-in with the company's identity provider, and API calls with its JWTs (docs/security.md).
    app.state.oidc = OidcProvider(settings) if settings.oidc_issuer is not None else None
    # ... and with its opaque access tokens (RFC 7662 introspection).
    app.state.introspection = Introspection(app.state.oidc) if app.state.oidc is not None else None
    app.state.token_cache = (
        TTLCache(maxsize=10_000, ttl=settings.token_cache_s) if settings.token_cache_s else None
    )
    app.state.token_lookups = {}  # token hash -> its lookup in flight (deps._identify)
    install_error_handlers(app)
    # Added innermost first: the request id is bound before the access log runs.
    app.add_middleware(BodyLimit, max_body_size=MAX_BODY_BYTES)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST", "PUT", "DELETE"],
            allow_headers=["Authorization", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(AccessLog)
    app.add_middleware(CorrelationIdMiddleware, header_name="X-Request-ID", validator=_acceptable_request_id)
    # FastAPI tries the routes in the order they are added, and every route tried before the one
    # that matches costs each request: the busiest first (docs/performance.md).
    for router in (
        holder.router,
        items.router,
        leases.router,
        resolutions.router,
        fx.router,
        admin.router,
        ops.router,
        session.router,
        audit.router,
        feed.router,
        webhooks.router,
        reports.router,
    ):
        app.include_router(router, responses=COMMON_PROBLEMS)
    # Public, like health: browser navigations that need no token.
    app.include_router(oidc.router, responses=problem_responses("VALIDATION_ERROR", "DATABASE_UNAVAILABLE"))
    app.include_router(health.router)
    _serve_docs(app)
    desk.install(app)
    return app
