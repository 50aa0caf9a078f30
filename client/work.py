"""The parts of the `work` loop that do no I/O, shared by the sync and async clients."""

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from client.errors import ReviewQueueError, problem_error
from client.models import CompleteResult, ItemOut

HandlerResult = str | tuple[str, str | None]
# What `work` calls with each item it leased: a function for the sync client, a coroutine function for
# the async one (generating the sync client renames the one to the other).
Handler = Callable[[ItemOut], HandlerResult]
AsyncHandler = Callable[[ItemOut], Awaitable[HandlerResult]]

# A handler decides again on new figures this many times for one item; an item whose source keeps
# changing faster than that is handed back.
MAX_REDECISIONS = 3

FAILURE_BACKOFF_CEILING_S = 30.0

# A decision queued for a batch was made on figures that have changed since: hand the item back (in
# its place) so it is decided again on the new ones, by this worker or another.
CHANGED_BEFORE_FLUSH = "the figures changed before the batch was sent"
KEPT_CHANGING = "the figures kept changing while deciding"


@dataclass
class WorkStats:
    leased: int = 0
    resolved: int = 0
    released: int = 0
    lost: int = 0  # the lease was gone (reclaimed) by the time the handler finished
    revised: int = 0  # decisions made again because the figures changed under the lease


@dataclass
class Failed:
    """An item the handler failed on: kept leased until the next lease has been taken, so that
    lease hands out other items first, then released with the error as its reason."""

    item: ItemOut
    reason: str


def handler_failed(item: ItemOut, error: Exception) -> Failed:
    return Failed(item, f"handler error: {error!r}"[:500])


def tally(results: list[CompleteResult], stats: WorkStats) -> list[ItemOut]:
    """Count a flush like the single completions it replaces: a lease lost meanwhile is `lost`;
    any other refusal is raised, as `complete` would raise it. Returns the items whose figures
    changed before the flush (SOURCE_CHANGED): still held, under the new lease in the problem."""
    refused: ReviewQueueError | None = None
    changed = []
    for result in results:
        if result.outcome != "refused":
            stats.resolved += 1
        elif result.problem is not None and result.problem.code == "LEASE_NOT_HELD":
            stats.lost += 1
        elif result.problem is not None and result.problem.code == "SOURCE_CHANGED":
            stats.revised += 1
            changed.append(ItemOut.model_validate(result.problem.model_dump()["item"]))
        elif result.problem is not None:
            refused = refused or problem_error(result.problem.status, result.problem.model_dump())
    if refused is not None:
        raise refused
    return changed


def resolution(result: HandlerResult) -> tuple[str, str | None]:
    return (result, None) if isinstance(result, str) else result


def renew_interval(item: ItemOut, renew_every_s: float | None) -> float:
    if renew_every_s is not None:
        return renew_every_s
    assert item.leased_at is not None and item.lease_expires_at is not None
    # Three heartbeats per lease period: one lost request never costs the lease.
    return max(0.1, (item.lease_expires_at - item.leased_at).total_seconds() / 3)


def failure_backoff(failures: int) -> float:
    """Pause after the handler failed `failures` batches in a row: 0.5 s doubling to 30 s, jittered,
    so a poison item (or a broken handler) cannot spin the queue."""
    return min(FAILURE_BACKOFF_CEILING_S, 0.5 * 2.0 ** (failures - 1)) * random.uniform(0.5, 1.0)  # noqa: S311
