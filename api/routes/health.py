"""Liveness and readiness for load balancers and orchestrators; no token needed."""

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy.ext.asyncio import AsyncEngine

from api.errors import problem_responses, unavailable
from api.schemas import Health
from db.engine import drop_pool, writable
from db.errors import classify
from db.migrations import current_revision, head_revision

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="healthz", summary="Liveness")
async def healthz() -> Health:
    """The process is up. Never touches the database."""
    return Health(status="ok")


@router.get(
    "/readyz",
    operation_id="readyz",
    summary="Readiness",
    response_model=Health,
    responses=problem_responses("DATABASE_UNAVAILABLE"),
)
async def readyz(request: Request) -> Health | JSONResponse:
    """The database answers and its schema is at the Alembic head."""
    engine: AsyncEngine = request.app.state.engine
    try:
        async with asyncio.timeout(2), engine.connect() as conn:
            revision = await current_revision(conn)
            primary = await writable(conn)
            if not primary:
                # Its siblings went to the same demoted server: new ones find the new leader.
                drop_pool(engine, await conn.get_raw_connection())
    except Exception as error:  # noqa: BLE001 - any failure here means "not ready"
        return unavailable(request, classify(error) or f"database check failed: {type(error).__name__}")
    if not primary:
        return unavailable(request, "database is read-only (a standby, or a failover in progress)")
    if revision != head_revision():
        return unavailable(request, f"schema at {revision}, expected {head_revision()}; run migrations")
    return Health(status="ok")
