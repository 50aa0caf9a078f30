"""The change feed: every event across items, in commit-safe order, for the systems that act on them."""

import asyncio
from typing import Annotated

from fastapi import APIRouter, Query, Request

from api.deps import FeedReader, SettingsDep, request_transaction
from api.errors import ProblemError, problem_responses
from api.routes.leases import _disconnected
from api.routing import QueueRoute
from api.schemas import FeedEventOut, FeedOut, FeedQuery
from db import feed

router = APIRouter(route_class=QueueRoute, tags=["feed"])


# How long a refused long-poll is told to wait before it asks again.
RETRY_AFTER_S = 5


@router.get(
    "/events",
    operation_id="readFeed",
    summary="Read the change feed",
    responses=problem_responses("FEED_BUSY"),
)
async def read_feed(
    request: Request, query: Annotated[FeedQuery, Query()], _: FeedReader, settings: SettingsDep
) -> FeedOut:
    """Every event across items after `after`, oldest first, each with its item as it is now (roles
    auditor, admin, integration). Store `next_cursor` (or each event's `cursor` as you go) and pass
    it back as `after`: only events of finished transactions are served, so an event that commits
    late is never skipped, and each item's events come in their own order.

    With `wait_s`, a call that finds nothing new waits up to that many seconds and answers as soon
    as something arrives (it looks again every REVIEW_QUEUE_POLL_INTERVAL_MS, holding no database
    connection in between). Beyond REVIEW_QUEUE_FEED_MAX_WAITERS such calls waiting at once on
    one API process, one more is 429 `FEED_BUSY` with `Retry-After`.
    """
    state = request.app.state
    if query.wait_s > 0 and state.feed_waiters >= settings.feed_max_waiters:
        raise ProblemError(
            "FEED_BUSY",
            f"{state.feed_waiters} feed readers are waiting on this server, its most"
            " (REVIEW_QUEUE_FEED_MAX_WAITERS); ask again later",
            headers={"Retry-After": str(RETRY_AFTER_S)},
        )
    after = feed.Position.decode(query.after) if query.after else feed.START
    types = query.types.split(",") if query.types else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + query.wait_s
    gone: asyncio.Future[None] | None = None
    waits = query.wait_s > 0
    state.feed_waiters += waits
    try:
        while True:
            # Each look is its own short transaction: a waiting request holds no pooled connection;
            # and the looks of all the feed's readers share part of the pool (app.py), so many
            # long-pollers queue here, not for the connections every other route needs.
            async with request.app.state.feed_looks, request_transaction(request) as conn:
                page = await feed.read(conn, after=after, limit=query.limit, events=types)
            remaining = deadline - loop.time()
            if page.events or remaining <= 0:
                break
            if page.next != after:  # a filter skipped a stretch: there may be more right behind it
                after = page.next
                continue
            gone = gone or asyncio.ensure_future(_disconnected(request))
            pause = asyncio.ensure_future(asyncio.sleep(min(remaining, settings.poll_interval_ms / 1000)))
            await asyncio.wait({pause, gone}, return_when=asyncio.FIRST_COMPLETED)
            pause.cancel()
            if gone.done():
                break
    finally:
        state.feed_waiters -= waits
        if gone is not None:
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
    return FeedOut(events=[FeedEventOut.of(e) for e in page.events], next_cursor=page.next.encode())
