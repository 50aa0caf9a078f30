"""Nothing is lost: decisions reach a receiver at least once, in each item's order, through crashes.

Real processes throughout: the API (`review-queue serve`), deliverers (`review-queue deliverer`), a
producer making decisions through the API, and a real HTTP receiver that verifies every request with
the standardwebhooks package. On the way, a deliverer is SIGKILLed while a request of its is in
flight, the API is SIGKILLed and started again, the receiver is taken down for a while (the issue's
"minute", seconds here, with the backoff scaled down to match) and answers 500 to a fifth of the
requests at random. Then every decision event in the database must have been delivered with a 2xx,
each event under one webhook-id only (a duplicate is the same event again), every request signed,
and each item's events first received in their own order.
"""

import random
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from bench.receiver import Receiver
from tests.support import wait_for
from tests.support.api import item_body
from tests.support.servers import FAST, start_deliverer, start_server, stop_process, stop_server

ITEMS = 16
BIG = "25000.00"  # ADJUSTMENT_POSTED needs an approver from 10,000.00 on
DOWN_S = 3.0  # the receiver's "minute" of downtime
DECISIONS = ("RESOLVED", "APPROVED", "REJECTED", "REOPENED", "QUARANTINED", "SUBMITTED_FOR_APPROVAL",
             "REQUEUED", "REVISED")  # fmt: skip
ENV = {**FAST, "REVIEW_QUEUE_WEBHOOK_TIMEOUT_S": "1"}


class Api:
    """The API's address, which changes when it is killed and started again; calls retried through it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.process, self.base = start_server(env)

    def restart_after_sigkill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.process, self.base = start_server(self.env)

    def call(self, method: str, path: str, token: str, body: Any = None) -> httpx.Response:
        deadline = time.monotonic() + 120
        while True:
            try:
                response = httpx.request(
                    method,
                    self.base + path,
                    json=body,
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=10,
                )
                if response.status_code != 503:
                    return response
            except httpx.TransportError:
                pass  # killed, or restarting: the same call again (each is safe to repeat)
            assert time.monotonic() < deadline, f"{method} {path} never got through"
            time.sleep(0.2)


def produce(api: Api, tokens: dict[str, str], done: threading.Event) -> None:
    """Enqueue, resolve, submit for approval, approve or reject, reopen: decisions of every kind."""
    try:
        for n in range(ITEMS):
            big = n % 4 == 0
            api.call("POST", "/items", tokens["admin"], item_body(variance_amount=BIG if big else "12.50"))
            for held in (
                api.call("POST", "/leases", tokens["alice"], {"batch_size": 2}).json().get("items", [])
            ):
                code, note = (
                    ("ADJUSTMENT_POSTED", "JE-1") if held["variance_amount"] == BIG else ("APPROVED", None)
                )
                api.call(
                    "POST",
                    f"/items/{held['id']}/complete",
                    tokens["alice"],
                    {"resolution": code, "note": note},
                )
                if n % 5 == 1 and code == "APPROVED":
                    api.call(
                        "POST", f"/items/{held['id']}/reopen", tokens["admin"], {"reason": "check again"}
                    )
            for proposal in (
                api.call("POST", "/leases", tokens["bob"], {"queue": "approval"}).json().get("items", [])
            ):
                if n % 8 == 0:
                    api.call("POST", f"/items/{proposal['id']}/approve", tokens["bob"], {})
                else:
                    api.call(
                        "POST", f"/items/{proposal['id']}/reject", tokens["bob"], {"reason": "wrong entity"}
                    )
    finally:
        done.set()


@pytest.mark.timeout(600)
def test_every_decision_is_delivered_at_least_once_in_item_order_through_crashes(
    db_url: str, tmp_path: Path, sql: psycopg.Connection, make_token: Callable[[str, str], str]
) -> None:
    rng = random.Random(27)
    receiver = Receiver(delay_s=0.05).start()
    # The first requests are held until the deliverer that sent them has been killed.
    held, killed = threading.Event(), threading.Event()

    def answer(_: object) -> tuple[int, dict[str, str]]:
        if not killed.is_set():
            held.set()
            killed.wait(60)
        return (500, {}) if rng.random() < 0.2 else (200, {})

    receiver.answer = answer
    api = Api({"DATABASE_URL": db_url, **ENV})
    deliverers = []
    try:
        tokens = {
            "admin": make_token("ada", "admin"),
            "alice": make_token("alice", "reviewer"),
            "bob": make_token("bob", "approver"),
        }
        every_type = ["ENQUEUED", "LEASED", "RENEWED", "RELEASED", "RECLAIMED", *DECISIONS, "REASSIGNED"]
        for name, body in (
            ("decisions", {}),
            ("everything", {"events": [f"item.{e.lower()}" for e in every_type]}),
        ):
            answer = api.call(
                "PUT", f"/webhooks/{name}", tokens["admin"], {"url": receiver.url(f"/{name}"), **body}
            )
            assert answer.status_code == 201, answer.text
            receiver.secrets[f"/{name}"] = answer.json()["secret"]
        deliverers.append(start_deliverer(db_url, tmp_path / "a.log", **ENV))
        done = threading.Event()
        producer = threading.Thread(target=produce, args=(api, tokens, done), daemon=True)
        producer.start()

        # A deliverer dies with a request of its in flight: that event must go again, same webhook-id.
        assert held.wait(120), "nothing was delivered"
        killed_mid_request = set(receiver.in_flight_ids)
        deliverers[0].send_signal(signal.SIGKILL)
        deliverers[0].wait()
        killed.set()
        deliverers += [start_deliverer(db_url, tmp_path / f"{n}.log", **ENV) for n in ("b", "c")]

        # The API dies and comes back (somewhere else) while decisions and deliveries go on.
        wait_for(lambda: len(receiver.received) >= 20, 120)
        api.restart_after_sigkill()

        # The receiver is away for a while.
        wait_for(lambda: len(receiver.received) >= 40, 120)
        receiver.stop()
        time.sleep(DOWN_S)
        receiver.start()

        assert done.wait(240), "the producer did not finish"
        producer.join()
        events = sql.execute("SELECT id, item_id::text, event FROM review_queue_event ORDER BY id").fetchall()
        wanted = {
            "/decisions": {f"evt_{i}" for i, _, e in events if e in DECISIONS},
            "/everything": {f"evt_{i}" for i, _, _ in events},
        }
        assert len(wanted["/decisions"]) >= ITEMS, "too few decisions to show anything"

        def delivered(path: str) -> set[str]:
            return {r.headers["webhook-id"] for r in receiver.of(path) if 200 <= r.answered < 300}

        try:
            wait_for(lambda: all(wanted[p] <= delivered(p) for p in wanted), 300, step=0.5)
        except AssertionError:
            state = api.call("GET", "/webhooks", tokens["admin"]).json()
            missing = {p: sorted(wanted[p] - delivered(p))[:10] for p in wanted}
            logs = "".join(log.read_text()[-1500:] for log in sorted(tmp_path.glob("*.log")))
            raise AssertionError(f"not delivered: {missing}\n{state}\n{logs}") from None
    finally:
        for process in deliverers:
            if process.poll() is None:
                stop_process(process)
        stop_server(api.process)
        receiver.stop()

    assert not [r for r in receiver.received if r.forged], "a request that does not verify"
    order = {i: (item, e) for i, item, e in events}
    for path in wanted:
        got = receiver.of(path)
        # One webhook-id per event, and one event per webhook-id: a duplicate is the same event again.
        ids_of: dict[int, set[str]] = defaultdict(set)
        for r in got:
            data = r.verified["data"]
            ids_of[data["id"]].add(r.headers["webhook-id"])
            assert r.headers["webhook-id"] == f"evt_{data['id']}"
            assert r.verified["type"] == "item." + order[data["id"]][1].lower()
        assert all(len(ids) == 1 for ids in ids_of.values()), ids_of
        # Each item's events first arrive in their own order.
        first: dict[str, list[int]] = defaultdict(list)
        for r in got:
            event_id, item = r.verified["data"]["id"], r.verified["data"]["item_id"]
            if event_id not in first[item]:
                first[item].append(event_id)
        out_of_order = {item: ids for item, ids in first.items() if ids != sorted(ids)}
        assert not out_of_order, f"{path}: items whose events arrived out of order: {out_of_order}"
    # The request cut off by the SIGKILL was delivered again, under its one webhook-id.
    again = [
        w for w in killed_mid_request if sum(r.headers["webhook-id"] == w for r in receiver.received) >= 2
    ]
    assert again, f"the event in flight when its deliverer died was not sent again: {killed_mid_request}"
    # The faults happened: 500s answered, and something retried after the receiver came back.
    assert sum(r.answered == 500 for r in receiver.received) >= 3


def test_a_receiver_failing_a_fifth_at_random_holds_back_only_the_failed_items(
    db_url: str, tmp_path: Path, sql: psycopg.Connection, make_token: Callable[[str, str], str]
) -> None:
    """300 events over 20 items, a receiver answering 500 to a fifth of the requests at random:
    every event is delivered, each item's events first arrive in their own order, and the other
    items' events went on while one was held (deliveries overtook a held event)."""
    rng, lock = random.Random(38), threading.Lock()

    def answer(_: object) -> tuple[int, dict[str, str]]:
        with lock:
            return (500, {}) if rng.random() < 0.2 else (200, {})

    receiver = Receiver(answer=answer).start()
    api = Api({"DATABASE_URL": db_url, **ENV})
    deliverer = None
    try:
        admin = make_token("ada", "admin")
        made = api.call(
            "PUT", "/webhooks/flaky", admin, {"url": receiver.url("/flaky"), "events": ["item.renewed"]}
        )
        assert made.status_code == 201, made.text
        receiver.secrets["/flaky"] = made.json()["secret"]
        items = [api.call("POST", "/items", admin, item_body()).json() for _ in range(20)]
        for n in range(0, 300, 30):  # ten transactions of 30 events each, round robin over the items
            with sql.transaction():
                for k in range(n, n + 30):
                    item = items[k % len(items)]
                    sql.execute(
                        "INSERT INTO review_queue_event (item_id, event, actor, lease_epoch, trace_id)"
                        " VALUES (%s, 'RENEWED', 'load', 0, %s)",
                        (item["id"], item["trace_id"]),
                    )
        wanted = {
            f"evt_{r[0]}" for r in sql.execute("SELECT id FROM review_queue_event WHERE event = 'RENEWED'")
        }
        assert len(wanted) == 300
        started = time.monotonic()
        deliverer = start_deliverer(db_url, tmp_path / "d.log", **ENV)

        def delivered() -> set[str]:
            return {r.headers["webhook-id"] for r in receiver.of("/flaky") if r.answered == 200}

        wait_for(lambda: wanted <= delivered(), 300, step=0.2)
        print(f"300 events, 20 % failing: drained in {time.monotonic() - started:.1f} s")
    finally:
        if deliverer is not None:
            stop_process(deliverer)
        stop_server(api.process)
        receiver.stop()
    got = receiver.of("/flaky")
    assert not [r for r in got if r.forged], "a request that does not verify"
    assert sum(r.answered == 500 for r in got) >= 20, "the receiver failed too little to show anything"
    first: dict[str, list[int]] = defaultdict(list)
    for r in got:
        data = r.verified["data"]
        if data["id"] not in first[data["item_id"]]:
            first[data["item_id"]].append(data["id"])
    out_of_order = {item: ids for item, ids in first.items() if ids != sorted(ids)}
    assert not out_of_order, f"items whose events arrived out of order: {out_of_order}"
    # Flow: some event was delivered while an earlier event (of another item) still waited.
    ok_order = [r.verified["data"]["id"] for r in got if r.answered == 200]
    assert ok_order != sorted(ok_order), "every delivery waited for every earlier one: head-of-line"
