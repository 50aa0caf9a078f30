"""Checking a webhook delivery, for a receiver (Standard Webhooks signatures)."""

from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

InvalidWebhook = WebhookVerificationError


def verify_webhook(headers: Any, body: bytes | str, secret: str) -> dict[str, Any]:
    """A delivery's body ({type, timestamp, data}) once its Standard Webhooks signature checks out
    with `secret` (`whsec_...`, shown once by PUT /webhooks/{name}) and its timestamp is within five
    minutes; raises InvalidWebhook otherwise. Pass the raw body bytes exactly as received. Drop a
    delivery whose `webhook-id` you have already handled: delivery is at least once."""
    payload: dict[str, Any] = Webhook(secret).verify(body, dict(headers))
    return payload
