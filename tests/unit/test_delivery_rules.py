"""The deliverer's arithmetic and keys, with no database and no connection: the backoff of each retry
(`retry_in`), the 72 h give-up, and secrets read back after a key rotation."""

import random
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet

from api import webhook_secret
from api.settings import Settings
from cli.deliverer import RECENT, ReceiverHealth, retry_in


def settings(**values: object) -> Settings:
    return Settings(database_url="postgresql://rq@127.0.0.1/rq", **values)  # type: ignore[arg-type]


@pytest.mark.parametrize("jitter", ["low", "high"])
def test_the_nth_retry_waits_base_times_two_to_the_n_minus_one_with_jitter_and_a_ceiling(
    jitter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defaults: base 10 s, ceiling 4 h; the jitter multiplies by 0.5 to 1."""
    factor = 0.5 if jitter == "low" else 1.0
    monkeypatch.setattr(random, "uniform", lambda lo, hi: lo if jitter == "low" else hi)
    defaults = settings()
    waits = [retry_in(defaults, n).total_seconds() for n in range(1, 16)]
    expected = [min(4 * 3600, 10 * 2 ** (n - 1)) * factor for n in range(1, 16)]
    assert waits == pytest.approx(expected), list(zip(waits, expected, strict=True))
    assert waits[:3] == pytest.approx([10 * factor, 20 * factor, 40 * factor])  # the first within 10 s
    assert retry_in(defaults, 500) == timedelta(hours=4) * factor  # no overflow, the ceiling holds
    fast = settings(webhook_retry_base_ms=200, webhook_retry_max_s=1)
    assert [retry_in(fast, n).total_seconds() for n in (1, 2, 3, 4)] == pytest.approx(
        [0.2 * factor, 0.4 * factor, 0.8 * factor, 1.0 * factor]
    )


@pytest.mark.parametrize("jitter", ["low", "high"])
def test_while_the_receiver_is_up_the_first_five_retries_come_within_a_second(
    jitter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that answers other requests fails now and then: the first five retries of an event
    wait 0.5-1 s (never more than the base), the sixth on the exponential schedule (base x 2^5)."""
    factor = 0.5 if jitter == "low" else 1.0
    monkeypatch.setattr(random, "uniform", lambda lo, hi: lo if jitter == "low" else hi)
    defaults = settings()
    waits = [retry_in(defaults, n, receiver_up=True).total_seconds() for n in range(1, 8)]
    assert waits == pytest.approx([1.0 * factor] * 5 + [320 * factor, 640 * factor])
    fast = settings(webhook_retry_base_ms=200, webhook_retry_max_s=1)
    assert retry_in(fast, 1, receiver_up=True).total_seconds() == pytest.approx(0.2 * factor)
    # Down (nothing answered 2xx lately): the exponential schedule from the first retry.
    assert retry_in(defaults, 1, receiver_up=False).total_seconds() == pytest.approx(10 * factor)


def test_a_receiver_is_up_while_one_of_its_last_ten_requests_succeeded() -> None:
    health = ReceiverHealth()
    assert not health.up("a")  # nothing known: the exponential schedule
    health.note("a", True)
    assert health.up("a") and not health.up("b")
    for _ in range(RECENT - 1):
        health.note("a", False)
    assert health.up("a")
    health.note("a", False)  # ten failures in a row: down
    assert not health.up("a")
    health.note("a", True)
    assert health.up("a")


def test_the_jitter_is_drawn_between_half_and_the_whole() -> None:
    drawn = {round(retry_in(settings(), 1).total_seconds(), 3) for _ in range(200)}
    assert min(drawn) >= 5 and max(drawn) <= 10 and len(drawn) > 20, sorted(drawn)


def test_retrying_gives_up_after_72_hours_with_some_30_to_40_attempts() -> None:
    """REVIEW_QUEUE_WEBHOOK_GIVE_UP_H is hours (72 by default), and docs/integrations.md's count of
    attempts in that window (30 to 40 at the average jitter) holds."""
    defaults = settings()
    assert defaults.webhook_give_up_h == 72
    assert defaults.webhook_give_up_s == 72 * 3600
    assert settings(webhook_give_up_h=1).webhook_give_up_s == 3600
    assert settings(webhook_give_up_test_s=3).webhook_give_up_s == 3  # the tests' override

    def attempts_within_give_up(factor: float, *, receiver_up: bool = False) -> int:
        waited, n = 0.0, 1  # the first attempt, then its retries
        while True:
            waited += retry_in(defaults, n, receiver_up=receiver_up).total_seconds() * factor
            if waited > defaults.webhook_give_up_s:
                return n
            n += 1

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(random, "uniform", lambda lo, hi: 1.0)  # the factor alone sets the jitter
        # A receiver that is down: about 36 on average; 28 with the whole wait every time, 46 with half.
        assert 30 <= attempts_within_give_up(0.75) <= 40
        assert (attempts_within_give_up(1.0), attempts_within_give_up(0.5)) == (28, 46)
        # Up, but refusing this one event: the five quick retries take the place of the first five
        # exponential ones (10 s to 160 s), so the count in 72 h is the same.
        assert (
            attempts_within_give_up(1.0, receiver_up=True),
            attempts_within_give_up(0.5, receiver_up=True),
        ) == (28, 46)


def test_a_secret_encrypted_under_the_old_key_is_read_under_the_rotated_list() -> None:
    """Rotation: `K2,K1` encrypts with K2 and reads what K1 encrypted."""
    k1, k2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    secret = webhook_secret.generate()
    stored_under_k1 = webhook_secret.encrypt(k1, secret)
    assert webhook_secret.decrypt(f"{k2},{k1}", stored_under_k1) == secret
    assert webhook_secret.decrypt(f"{k2}, {k1}", stored_under_k1) == secret
    stored_under_k2 = webhook_secret.encrypt(f"{k2},{k1}", secret)
    assert webhook_secret.decrypt(k2, stored_under_k2) == secret  # the first key encrypts
    with pytest.raises(webhook_secret.InvalidToken):
        webhook_secret.decrypt(k2, stored_under_k1)  # a changed key, the old one not kept
