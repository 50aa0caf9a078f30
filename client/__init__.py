"""A Python client for the review-queue service, sync and async, on httpx.

    from client import ReviewQueueClient

    client = ReviewQueueClient("http://127.0.0.1:8000", token)
    client.work(lambda item: "APPROVED" if abs(item.variance_amount) < 1 else ("ESCALATED", "over 1.00"))

`work` is the worker loop over HTTP: lease a batch, keep each lease alive with `renew` while the
handler runs, complete with the handler's resolution (fenced by the item's `lease_token`), release
on handler error, long-poll for work (`wait_s`), stop cleanly on SIGINT/SIGTERM or `stop()`. Errors
are typed exceptions carrying the problem `code` (client.errors).

`work(..., batch_complete=True)` sends the handler's results through POST /items/complete
instead, one request per flush: when the leased batch is done, when a renew of the batch falls
due, and on stop. A crash loses nothing: an unflushed item is still leased (and renewed until
flushed), so it is reclaimed and handled again.

`feed(after=..., wait_s=...)` iterates the change feed (GET /events) and follows it with long
polls; `verify_webhook(headers, body, secret)` checks a webhook delivery's Standard Webhooks
signature, for a receiver. (`events(item_id)` is one item's audit trail.)

Layout: `calls` says what each request sends and how its answer is read (no I/O); `aio` carries
those calls over httpx, and `sync` is generated from it (`python -m client.generate_sync`, unasync);
`concurrency` holds what the two do differently; `models` are the answers; `errors` the problems;
`work` the parts of the work loop both clients share. This package imports nothing of the server.
"""

from client.aio import AsyncReviewQueueClient
from client.calls import Completion, Token
from client.errors import (
    AlreadyHeld,
    DatabaseUnavailable,
    FeedBusy,
    Forbidden,
    IdempotencyConflict,
    IdentityProviderUnavailable,
    LeaseNotHeld,
    NotAReviewer,
    NotAssigned,
    NotFound,
    NotQuarantined,
    NotResolved,
    ResolutionConflict,
    ReviewerAtCap,
    ReviewQueueError,
    SegregationOfDuties,
    SourceChanged,
    Unauthenticated,
    ValidationFailed,
)
from client.sync import ReviewQueueClient
from client.webhooks import InvalidWebhook, verify_webhook
from client.work import HandlerResult, WorkStats

__all__ = [
    "AlreadyHeld",
    "AsyncReviewQueueClient",
    "Completion",
    "DatabaseUnavailable",
    "FeedBusy",
    "Forbidden",
    "HandlerResult",
    "IdempotencyConflict",
    "IdentityProviderUnavailable",
    "InvalidWebhook",
    "LeaseNotHeld",
    "NotAReviewer",
    "NotAssigned",
    "NotFound",
    "NotQuarantined",
    "NotResolved",
    "ResolutionConflict",
    "ReviewQueueClient",
    "ReviewQueueError",
    "ReviewerAtCap",
    "SegregationOfDuties",
    "SourceChanged",
    "Token",
    "Unauthenticated",
    "ValidationFailed",
    "WorkStats",
    "verify_webhook",
]
