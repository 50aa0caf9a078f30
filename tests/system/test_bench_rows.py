"""make bench's rows of issue 44 at a tiny size, each against a real API or deliverer process: the
change feed read end to end (bench/feed_read.py) and the healthy-receiver webhook rows
(bench/webhooks.py). The numbers must be sane (every event read exactly once and in order, every
delivery arrived); no timing is asserted."""

import math
from collections.abc import Iterator

import pytest

from bench import feed_read, webhooks
from bench.harness import drop_databases, fresh_database
from tests.support.servers import free_port


@pytest.fixture
def bench_url(server_url: str, worker_id: str) -> Iterator[str]:
    """A database of the bench's own making (bench.harness.fresh_database), dropped afterwards."""
    name = f"rq_bench_rows_{worker_id}"
    yield fresh_database(server_url, name)
    drop_databases(server_url, name)


def test_the_feed_read_serves_every_event_once_in_order_catching_up_and_at_the_head(bench_url: str) -> None:
    result = feed_read.feed_read(
        bench_url, free_port(), 200, head_rates=[100.0], head_seconds=1.0, split_pages=2,
        default_limit_events=100,
    )  # fmt: skip
    assert result["load"] == {"items": 40, "events": 200, "load_s": result["load"]["load_s"]}
    whole, first = result["catch_up"]
    assert (whole["limit"], whole["events"], whole["pages"]) == (500, 200, 2)  # the last page is empty
    assert whole["read_each_once"] and whole["duplicates"] == whole["out_of_order"] == 0
    assert (first["limit"], first["events"], first["pages"]) == (100, 100, 1)
    assert first["read_each_once"] and first["duplicates"] == first["out_of_order"] == 0
    (head,) = result["head"]
    assert head["written"] == head["received"] > 0 and head["missing"] == 0
    assert head["duplicates"] == head["out_of_order"] == 0
    assert 0 <= head["p50_ms"] <= head["p95_ms"] <= head["max_ms"]
    for split in result["split"]:
        assert split["pages"] >= 1 and all(math.isfinite(v) for v in split["p50_ms"].values())
    assert len(feed_read.report_lines(result)) == 1 + 2 + 2 + 1


def test_a_healthy_receiver_gets_every_event_of_each_subscription_once(bench_url: str) -> None:
    run = webhooks.webhook_drain(bench_url, events=40, items=4, fail=0.0, timeout_s=120, subscriptions=2)
    assert run["delivered"] == run["wanted"] == 80
    assert run["requests"] >= 80 and run["failed_answers"] == 0
    assert run["deliverer_cpu_s"] > 0 and run["steady_cores"] is not None
    lines = webhooks.report_lines({"2_subscriptions_healthy": run})
    assert "2 subscriptions, healthy" in lines[1] and "timed out" not in lines[1]
