"""The problem+json answers as exceptions: one class per stable `code`, ReviewQueueError otherwise."""

from datetime import datetime
from typing import Any

import httpx

from client.models import ItemOut


class ReviewQueueError(Exception):
    """A problem+json answer; `code` is the service's stable error code."""

    def __init__(self, status: int, code: str, detail: str, problem: dict[str, Any]) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail, self.problem = status, code, detail, problem


class Unauthenticated(ReviewQueueError): ...


class Forbidden(ReviewQueueError): ...


class NotFound(ReviewQueueError): ...


class LeaseNotHeld(ReviewQueueError):
    """Not your current lease. When the reclaimer took your lease back (it expired), `reclaimed_at`
    and `lease_expired_at` say when; both are None otherwise."""

    @property
    def reclaimed_at(self) -> datetime | None:
        return _moment(self.problem.get("reclaimed_at"))

    @property
    def lease_expired_at(self) -> datetime | None:
        return _moment(self.problem.get("lease_expired_at"))


def _moment(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


class IdempotencyConflict(ReviewQueueError): ...


class ResolutionConflict(ReviewQueueError): ...


class ValidationFailed(ReviewQueueError): ...


class DatabaseUnavailable(ReviewQueueError): ...


class IdentityProviderUnavailable(ReviewQueueError):
    """The server could not check an identity provider's token (its keys, or its introspection
    endpoint, out of reach): retried, as the provider usually answers again shortly."""


class FeedBusy(ReviewQueueError):
    """Too many feed readers wait on that server: ask again after its Retry-After."""


class NotQuarantined(ReviewQueueError): ...


class NotResolved(ReviewQueueError): ...


class SegregationOfDuties(ReviewQueueError): ...


class SourceChanged(ReviewQueueError):
    """The figures changed under your lease (a source revision). `item` is the item now, with the
    new lease_token: look at the new figures, then carry on with that token."""

    @property
    def item(self) -> ItemOut:
        return ItemOut.model_validate(self.problem["item"])


class NotAssigned(ReviewQueueError): ...


class AlreadyHeld(ReviewQueueError): ...


class NotAReviewer(ReviewQueueError): ...


class ReviewerAtCap(ReviewQueueError): ...


_BY_CODE: dict[str, type[ReviewQueueError]] = {
    "UNAUTHENTICATED": Unauthenticated,
    "FORBIDDEN": Forbidden,
    "NOT_FOUND": NotFound,
    "LEASE_NOT_HELD": LeaseNotHeld,
    "IDEMPOTENCY_CONFLICT": IdempotencyConflict,
    "RESOLUTION_CONFLICT": ResolutionConflict,
    "NOT_QUARANTINED": NotQuarantined,
    "NOT_RESOLVED": NotResolved,
    "SEGREGATION_OF_DUTIES": SegregationOfDuties,
    "SOURCE_CHANGED": SourceChanged,
    "NOT_ASSIGNED": NotAssigned,
    "ALREADY_HELD": AlreadyHeld,
    "NOT_A_REVIEWER": NotAReviewer,
    "REVIEWER_AT_CAP": ReviewerAtCap,
    "VALIDATION_ERROR": ValidationFailed,
    "DATABASE_UNAVAILABLE": DatabaseUnavailable,
    "IDENTITY_PROVIDER_UNAVAILABLE": IdentityProviderUnavailable,
    "FEED_BUSY": FeedBusy,
}


def problem_error(status: int, problem: dict[str, Any]) -> ReviewQueueError:
    """The exception for a problem body (an answer's, or a refused entry's of a batch)."""
    code, detail = str(problem.get("code", f"HTTP_{status}")), str(problem.get("detail", ""))
    return _BY_CODE.get(code, ReviewQueueError)(status, code, detail, problem)


def raise_for_problem(response: httpx.Response) -> None:
    """Raise the answer's problem, if it is one (the body must have been read)."""
    if response.status_code < 400:
        return
    try:
        problem = response.json()
        code, detail = str(problem["code"]), str(problem.get("detail", ""))
    except (ValueError, KeyError, TypeError):
        problem, code, detail = {}, f"HTTP_{response.status_code}", response.text[:200]
    raise _BY_CODE.get(code, ReviewQueueError)(response.status_code, code, detail, problem)


def retryable(error: Exception) -> bool:
    # Every call is safe to repeat: completion is idempotent, renew/release are fenced, and a
    # lease whose answer was lost simply expires and is reclaimed.
    return isinstance(
        error, (DatabaseUnavailable, IdentityProviderUnavailable, FeedBusy, httpx.TransportError)
    )
