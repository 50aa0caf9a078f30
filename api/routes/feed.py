"""The change feed: every event across items, in commit-safe order, for the systems that act on them."""

import asyncio
import functools
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.deps import FeedReader, SettingsDep, request_transaction
from api.errors import ProblemError, problem_responses
from api.feed_watch import FeedWatch
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
    response_model=FeedOut,
)
async def read_feed(
    request: Request, query: Annotated[FeedQuery, Query()], _: FeedReader, settings: SettingsDep
) -> FeedOut | Response:
    """Every event across items after `after`, oldest first, each with its item as it is now (roles
    auditor, admin, integration). Store `next_cursor` (or each event's `cursor` as you go) and pass
    it back as `after`: only events of finished transactions are served, so an event that commits
    late is never skipped, and each item's events come in their own order.

    With `wait_s`, a call that finds nothing new waits up to that many seconds and answers as soon
    as something arrives (one look per API process every REVIEW_QUEUE_POLL_INTERVAL_MS serves all
    its waiting calls; a call holds no database connection while it waits). Beyond
    REVIEW_QUEUE_FEED_MAX_WAITERS such calls waiting at once on one API process, one more is 429
    `FEED_BUSY` with `Retry-After`.
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
    waits = query.wait_s > 0
    watch: FeedWatch = state.feed_watch
    deadline = asyncio.get_running_loop().time() + query.wait_s

    async def read(at: feed.Position) -> feed.FeedPage:
        # Each read is its own short transaction, and the reads of all the feed's readers share
        # part of the pool (app.py): other routes keep the rest however many read at once.
        async with state.feed_looks, request_transaction(request) as conn:
            return await feed.read(conn, after=at, limit=query.limit, events=types)

    async def read_and_render(at: feed.Position) -> tuple[feed.FeedPage, bytes]:
        page = await read(at)
        return page, _answer(page).model_dump_json(by_alias=True).encode()

    body: bytes | None = None
    gone: asyncio.Future[None] | None = None
    state.feed_waiters += waits
    try:
        while True:
            seen = watch.generation
            if not waits:
                page = await read(after)
            elif watch.caught_up(after):  # nothing new as of the last look: wait for the next
                page, body = feed.FeedPage([], after), None
            else:
                # Read once and rendered once for all the waiters at this place: 500 pollers at
                # the head cost one page's JSON, not 500 (api/feed_watch.py).
                key = (after, query.limit, query.types)
                page, body = await watch.page(key, functools.partial(read_and_render, after))
            remaining = deadline - asyncio.get_running_loop().time()
            if page.events or remaining <= 0:
                break
            if page.next != after:  # a filter skipped a stretch: there may be more right behind it
                after = page.next
                continue
            # One look per process for every waiter (api/feed_watch.py): waiting costs no
            # connection and no query of its own.
            gone = gone or asyncio.ensure_future(_disconnected(request))
            if not await watch.wait(after, seen, remaining, gone):
                break
    finally:
        state.feed_waiters -= waits
        if gone is not None:
            gone.cancel()
            await asyncio.gather(gone, return_exceptions=True)
    if body is not None:
        return Response(body, media_type="application/json")
    return _answer(page)


def _answer(page: feed.FeedPage) -> FeedOut:
    return FeedOut(events=[FeedEventOut.of(e) for e in page.events], next_cursor=page.next.encode())
