"""The floor of the per-item HTTP path on this machine: a bare FastAPI route (a pydantic body in,
a pydantic model out) doing ONE psycopg round trip, under uvicorn like the service. `make bench`
(--throughput-only) drives it like the per-item row; whatever the service costs above it is the
service's own work (auth, the transaction, the statement, the event, logs, metrics)."""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel


class CompleteIn(BaseModel):
    resolution: str
    lease_token: str | None = None


class CompleteOut(BaseModel):
    id: UUID
    resolution: str
    at: datetime


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    pool = AsyncConnectionPool(
        os.environ["FLOOR_DATABASE_URL"], min_size=4, max_size=8, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    app.state.pool = pool
    yield
    await pool.close()


app = FastAPI(lifespan=lifespan)


@app.post("/items/{item_id}/complete")
async def complete(item_id: UUID, body: CompleteIn) -> CompleteOut:
    pool: AsyncConnectionPool[Any] = app.state.pool
    async with pool.connection() as conn:
        cursor = await conn.execute("SELECT %s::uuid, now()", (item_id,))
        row = await cursor.fetchone()
    assert row is not None
    return CompleteOut(id=row[0], resolution=body.resolution, at=row[1])
