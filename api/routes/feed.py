"""The change feed: every event across items, in commit-safe order, for the systems that act on them."""

import asyncio
import functools
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from api.deps import FeedReader, SettingsDep, request_transaction
from api.errors import ProblemError, problem_responses
from api.feed_watch import BUDGET_WAIT, AnswerBudget, FeedWatch
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
    as something arrives and its turn comes (one look per API process every
    REVIEW_QUEUE_POLL_INTERVAL_MS serves all its waiting calls; a call holds no database connection
    while it waits). Turns: an API process reads for its waiting calls at most
    REVIEW_QUEUE_FEED_ANSWERS_PER_S times a second (default 25), first come first served, so that
    its other routes keep their latency however many poll. With N pollers that each want every
    event, each is answered about every N / REVIEW_QUEUE_FEED_ANSWERS_PER_S seconds (500 pollers:
    every 20 s) with up to `limit` events: a poller that must keep up asks for a larger `limit`.
    A call whose turn does not come within `wait_s` answers then with no events and `next_cursor`
    equal to `after`: no event is ever skipped. Calls without `wait_s` are ordinary requests,
    answered at once. Beyond REVIEW_QUEUE_FEED_MAX_WAITERS calls with `wait_s` in progress on one
    API process, one more is 429 `FEED_BUSY` with `Retry-After`.
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
    budget: AnswerBudget = state.feed_budget
    deadline = asyncio.get_running_loop().time() + query.wait_s

    async def read(at: feed.Position) -> feed.FeedPage:
        # Each read is its own short transaction, and the reads of all the feed's readers share
        # part of the pool (app.py): other routes keep the rest however many read at once.
        async with state.feed_looks, request_transaction(request) as conn:
            return await feed.read(conn, after=at, limit=query.limit, events=types)

    async def read_and_render(at: feed.Position) -> tuple[feed.FeedPage, bytes]:
        page = await read(at)
        return page, _answer(page).model_dump_json(by_alias=True).encode()

    gone: asyncio.Future[None] | None = None  # done when the client has left

    async def turn() -> bool:
        """Wait for this call's turn in the process's answer budget: True when it came before the
        deadline, with the client still there; otherwise it waited out its deadline (or its client
        left), and answers with nothing."""
        nonlocal gone
        loop = asyncio.get_running_loop()
        now = loop.time()
        at = budget.reserve(now, deadline)
        until = deadline if at is None else at
        if until > now:
            gone = gone or asyncio.ensure_future(_disconnected(request))
            await asyncio.wait({gone}, timeout=until - now)
            BUDGET_WAIT.inc(loop.time() - now)
        return at is not None and not (gone and gone.done())

    body: bytes | None = None
    has_turn = False  # a turn of the budget, held by a waiting call from its read until it waits
    state.feed_waiters += waits
    try:
        while True:
            caught_up = waits and watch.caught_up(after)  # nothing new as of the last look
            if waits and not caught_up and not (has_turn := has_turn or await turn()):
                page, body = feed.FeedPage([], after), None
                break
            seen = watch.generation  # after the turn: the read below covers every look before it
            if not waits:
                page = await read(after)
            elif caught_up:  # wait for the next look without reading
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
            # connection and no query of its own. Woken, it reads again in a turn of its own: a
            # turn is one answer's worth, not held across waits (or 500 waiters woken at once
            # would all answer at once on turns taken long before).
            has_turn = False
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
