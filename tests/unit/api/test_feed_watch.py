"""api/feed_watch.py with a look that is a plain function: wake-ups, one look per interval however
many wait, the shared page, and the watcher ending with its last waiter. No database."""

import asyncio
import itertools

import pytest

from api.feed_watch import AnswerBudget, FeedWatch
from db.feed import FeedPage, Position

INTERVAL_S = 0.02


class Feed:
    """A feed whose head the test moves, counting the looks at it."""

    def __init__(self) -> None:
        self.head = Position(10, 1)
        self.looks = 0
        self.looked = asyncio.Event()

    async def look(self) -> Position:
        self.looks += 1
        self.looked.set()
        self.looked = asyncio.Event()
        return self.head


def never() -> "asyncio.Future[None]":
    return asyncio.get_running_loop().create_future()


def test_many_waiters_cost_one_look_per_interval_and_a_move_wakes_each_of_them() -> None:
    async def run() -> None:
        feed = Feed()
        watch = FeedWatch(feed.look, interval_s=INTERVAL_S)
        at = feed.head
        waiters = [asyncio.create_task(watch.wait(at, watch.generation, 5, never())) for _ in range(200)]
        await asyncio.sleep(INTERVAL_S * 10)
        assert watch.waiters == 200 and not any(w.done() for w in waiters)
        # About 10 looks for 200 waiters over 10 intervals (a slow machine may make fewer), not 2,000.
        assert 1 <= feed.looks <= 12, feed.looks
        feed.head = Position(11, 2)
        assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [True] * 200
        assert watch.head == feed.head

    asyncio.run(run())


def test_a_waiter_at_or_past_the_head_is_not_woken_by_a_look_it_already_covered() -> None:
    async def run() -> None:
        feed = Feed()
        watch = FeedWatch(feed.look, interval_s=INTERVAL_S)
        ahead = Position(10, 5)  # a cursor past the head: nothing to read until the head passes it
        assert await watch.wait(ahead, watch.generation, INTERVAL_S * 5, never()) is False
        # A read that began after the last look saw what it saw: only a later move wakes its waiter.
        seen = watch.generation
        feed.head = Position(12, 1)
        assert await watch.wait(Position(10, 1), seen, 5, never()) is True
        assert await watch.wait(feed.head, watch.generation, INTERVAL_S * 3, never()) is False

    asyncio.run(run())


def test_a_waiter_whose_client_left_is_dropped_and_the_watcher_ends_with_the_last_waiter() -> None:
    async def run() -> None:
        feed = Feed()
        watch = FeedWatch(feed.look, interval_s=INTERVAL_S)
        gone = never()
        waiter = asyncio.create_task(watch.wait(feed.head, watch.generation, 30, gone))
        await asyncio.sleep(INTERVAL_S * 3)
        assert watch.watching and watch.waiters == 1
        gone.set_result(None)
        assert await asyncio.wait_for(waiter, 5) is False
        assert watch.waiters == 0
        for _ in range(100):
            if not watch.watching:
                break
            await asyncio.sleep(INTERVAL_S)
        assert not watch.watching, "the watcher still looks with no one waiting"
        looks = feed.looks
        await asyncio.sleep(INTERVAL_S * 5)
        assert feed.looks == looks
        # The next waiter starts it again.
        feed.head = Position(20, 1)
        assert await watch.wait(Position(10, 1), watch.generation, 5, never()) is True

    asyncio.run(run())


def test_the_waiters_a_look_woke_at_one_place_share_one_read() -> None:
    async def run() -> None:
        watch = FeedWatch(Feed().look, interval_s=INTERVAL_S)
        reads = 0
        release = asyncio.Event()

        async def read() -> FeedPage:
            nonlocal reads
            reads += 1
            await release.wait()
            return FeedPage([], Position(reads, 0))

        pages = [asyncio.create_task(watch.page(("here", 100, None), read)) for _ in range(50)]
        other = asyncio.create_task(watch.page(("there", 100, None), read))
        await asyncio.sleep(0)
        release.set()
        got = await asyncio.gather(*pages)
        assert reads == 2 and {p.next for p in got} == {got[0].next} and (await other).next != got[0].next
        # Only a read in flight is shared: the next one reads afresh.
        assert (await watch.page(("here", 100, None), read)).next == Position(3, 0)

    asyncio.run(run())


def test_the_answer_budget_hands_out_turns_in_order_at_its_rate_after_a_tenth_of_a_second_burst() -> None:
    budget = AnswerBudget(50)  # a turn every 20 ms, 5 at once
    turns = [budget.reserve(100.0, 200.0) for _ in range(55)]
    assert turns[:5] == [100.0] * 5, turns[:5]
    gaps = [round(b - a, 6) for a, b in itertools.pairwise(turns[4:])]  # type: ignore[operator]
    assert gaps == [0.02] * 50, gaps
    # 55 turns asked at once: the last is 1 s later (50 a second), not sooner.
    assert turns[-1] == pytest.approx(101.0)


def test_a_turn_that_would_come_after_the_callers_deadline_is_refused_and_reserves_nothing() -> None:
    budget = AnswerBudget(10)  # a turn every 100 ms, no burst
    assert budget.reserve(0.0, 1.0) == 0.0
    assert budget.reserve(0.0, 1.0) == 0.1
    assert budget.reserve(0.0, 0.15) is None  # its turn would be at 0.2
    assert budget.reserve(0.0, 1.0) == 0.2, "the refused caller took a turn"
    # Time that passes unused is not saved up beyond the burst.
    assert [budget.reserve(60.0, 61.0) for _ in range(2)] == [60.0, pytest.approx(60.1)]
