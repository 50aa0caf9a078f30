"""Webhook subscriptions (admin): create or change one, list them, read their attempts, redeliver."""

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response, status

from api import webhook_secret
from api.deps import Admin, Conn, SettingsDep
from api.errors import ProblemError, problem_responses
from api.routing import QueueRoute
from api.schemas import (
    DEFAULT_WEBHOOK_TYPES,
    WEBHOOK_NAME_PATTERN,
    DeliveriesOut,
    DeliveryOut,
    DeliveryQuery,
    RedeliverIn,
    WebhookIn,
    WebhookOut,
    WebhookPutOut,
    WebhooksOut,
)
from db import feed, webhooks

router = APIRouter(route_class=QueueRoute, tags=["webhooks"])

Name = Annotated[
    str,
    Path(
        pattern=WEBHOOK_NAME_PATTERN,
        description="The subscription's name: a-z, 0-9, _ and -, first a letter or digit, at most 64.",
    ),
]


def webhook_out(sub: webhooks.Subscription) -> WebhookOut:
    return WebhookOut(
        name=sub.name,
        url=sub.url,
        events=sub.event_types,
        active=sub.active,
        status=sub.status,
        disabled_reason=sub.disabled_reason,
        cursor=sub.cursor.encode(),
        attempts=sub.attempts,
        failing_since=sub.failing_since,
        held_items=sub.held_items,
        next_attempt_at=sub.next_attempt_at,
        last_error=sub.last_error,
        created_at=sub.created_at,
        updated_at=sub.updated_at,
    )


async def _existing(conn: Conn, name: str) -> webhooks.Subscription:
    sub = await webhooks.get_subscription(conn, name=name)
    if sub is None:
        raise ProblemError("NOT_FOUND", f"no webhook {name!r}")
    return sub


@router.put(
    "/webhooks/{name}",
    operation_id="putWebhook",
    summary="Create or change a webhook subscription (admin)",
    responses={
        201: {
            "model": WebhookPutOut,
            "description": "Created; `secret` is shown this once if it was made here.",
        },
        **problem_responses("NOT_CONFIGURED"),
    },
)
async def put_webhook(
    name: Name,
    body: WebhookIn,
    conn: Conn,
    _: Admin,
    request: Request,
    response: Response,
    settings: SettingsDep,
) -> WebhookPutOut:
    """Create (201) or replace (200) a subscription. A new one starts at the feed's head: it gets the
    events that commit from now on. Without `secret`, a new subscription gets one made for it,
    returned in this answer only; it is stored encrypted and never shown again."""
    if body.url.startswith("http://") and not settings.webhook_allow_http:
        message = "must be https (plain http only with REVIEW_QUEUE_WEBHOOK_ALLOW_HTTP=1)"
        raise ProblemError(
            "VALIDATION_ERROR",
            f"body.url: {message}",
            extra={"errors": [{"loc": ["body", "url"], "msg": message, "type": "https_required"}]},
        )
    keys: str | None = request.app.state.webhook_keys
    if keys is None:
        raise ProblemError(
            "NOT_CONFIGURED", "webhooks need REVIEW_QUEUE_WEBHOOK_KEY (a Fernet key) on this server"
        )
    secret = body.secret or webhook_secret.generate()
    created, sub = await webhooks.put_subscription(
        conn,
        name=name,
        url=body.url,
        event_types=list(dict.fromkeys(body.events or DEFAULT_WEBHOOK_TYPES)),
        secret=webhook_secret.encrypt(keys, secret),
        replace_secret=body.secret is not None,
        active=body.active,
    )
    if created:
        response.status_code = status.HTTP_201_CREATED
    shown = secret if created and body.secret is None else None
    return WebhookPutOut(**webhook_out(sub).model_dump(), secret=shown)


@router.get("/webhooks", operation_id="listWebhooks", summary="List webhook subscriptions (admin)")
async def list_webhooks(conn: Conn, _: Admin) -> WebhooksOut:
    """Every subscription with where it stands in the feed and how its deliveries go; never a secret."""
    return WebhooksOut(webhooks=[webhook_out(s) for s in await webhooks.list_subscriptions(conn)])


@router.get(
    "/webhooks/{name}/deliveries",
    operation_id="listWebhookDeliveries",
    summary="A subscription's latest delivery attempts (admin)",
    responses=problem_responses("NOT_FOUND"),
)
async def list_deliveries(
    name: Name, query: Annotated[DeliveryQuery, Query()], conn: Conn, _: Admin
) -> DeliveriesOut:
    """The latest attempts, newest first, with the receiver's status code, the latency and the error."""
    await _existing(conn, name)
    attempts = await webhooks.list_attempts(conn, name=name, outcome=query.status, limit=query.limit)
    return DeliveriesOut(deliveries=[DeliveryOut.model_validate(a) for a in attempts])


@router.post(
    "/webhooks/{name}/redeliver",
    operation_id="redeliverWebhook",
    summary="Resume a subscription, or deliver again from a feed position (admin)",
    responses=problem_responses("NOT_FOUND"),
)
async def redeliver(name: Name, body: RedeliverIn, conn: Conn, _: Admin) -> WebhookOut:
    """Resume a failing subscription now (retrying starts over), from `from_cursor` when given: the
    events after it are delivered again, with their own `webhook-id`s, so receivers that keep the ids
    they have seen drop the repeats."""
    after = feed.Position.decode(body.from_cursor) if body.from_cursor else None
    sub = await webhooks.redeliver(conn, name=name, after=after)
    if sub is None:
        raise ProblemError("NOT_FOUND", f"no webhook {name!r}")
    return webhook_out(sub)
