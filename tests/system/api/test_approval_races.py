"""Preparers and approvers race over a few hundred items through a live server (uvicorn in its own
process, each worker on its own HTTP connection and so its own database connection), and the
four-eyes rules hold, checked from the event table afterwards:

- every item ends RESOLVED exactly once (one APPROVED event more than REOPENED, no RESOLVED event:
  every item is above the threshold);
- every APPROVED event's actor differs from the preparer of the proposal it approved, and the
  item's approved_by from its resolved_by;
- no approval lease ever went to the preparer of the proposal it leased (LEASED events with
  queue=approval, against the latest SUBMITTED_FOR_APPROVAL before them);
- an approver who also prepares, and tries to approve their own proposal the moment they submit
  it (while the other approvers race for it), is never let through: 403 SEGREGATION_OF_DUTIES while
  it is still their proposal, or 409 LEASE_NOT_HELD when another approver rejected it first (it is
  then nobody's proposal, or someone else's), which the event table must show.
"""

import random
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx
import psycopg

from tests.support import LONG, seed_items

TOTAL = 1000 if LONG else 300
PREPARERS = 3  # reviewers
APPROVERS = 3  # approvers who also prepare (an approver can do everything a reviewer does)
DEADLINE_S = 600  # generous, for a loaded 2-core machine; the loop ends when the queue is empty


def test_preparers_and_approvers_racing_keep_the_four_eyes_rules(
    live_server: str, make_token: Callable[[str, str], str], sql: psycopg.Connection
) -> None:
    seed_items(sql, TOTAL, amount="25000.00")  # all above ADJUSTMENT_POSTED's 10000.00
    statuses: Counter[tuple[str, int]] = Counter()
    own_attempts: list[tuple[str, str, int, str | None]] = []  # (approver, item, status, code)
    lock = threading.Lock()
    errors: list[str] = []
    stop_at = time.monotonic() + DEADLINE_S

    def note(action: str, response: httpx.Response) -> None:
        with lock:
            statuses[(action, response.status_code)] += 1

    def finished() -> bool:
        (open_items,) = sql_count("SELECT count(*) FROM review_queue_item WHERE state <> 'RESOLVED'")
        return open_items == 0 or time.monotonic() > stop_at

    def worker(name: str, role: str, seed: int) -> None:
        rng = random.Random(seed)
        headers = {"Authorization": f"Bearer {make_token(name, role)}"}
        try:
            with httpx.Client(base_url=live_server, headers=headers, timeout=60) as http:
                idle = 0
                while not finished():
                    queues = ["approval", "review"] if role == "approver" else ["review"]
                    rng.shuffle(queues)
                    worked = False
                    for queue in queues:
                        leased = http.post("/leases", json={"batch_size": rng.randint(1, 3), "queue": queue})
                        note(f"lease {queue}", leased)
                        for item in leased.json()["items"]:
                            worked = True
                            token = item["lease_token"]
                            if queue == "review":
                                body = {
                                    "resolution": "ADJUSTMENT_POSTED",
                                    "note": f"JE by {name}",
                                    "lease_token": token,
                                }
                                done = http.post(f"/items/{item['id']}/complete", json=body)
                                note("complete", done)
                                if done.json().get("outcome") != "submitted_for_approval":
                                    errors.append(f"{name} complete: {done.text}")
                                if role == "approver":  # try to approve my own proposal at once
                                    mine = http.post(f"/items/{item['id']}/approve")
                                    note("approve own", mine)
                                    with lock:
                                        own_attempts.append(
                                            (name, item["id"], mine.status_code, mine.json().get("code"))
                                        )
                            elif rng.random() < 0.15:
                                rejected = http.post(
                                    f"/items/{item['id']}/reject",
                                    json={"reason": "race", "lease_token": token},
                                )
                                note("reject", rejected)
                            else:
                                approved = http.post(
                                    f"/items/{item['id']}/approve", json={"lease_token": token}
                                )
                                note("approve", approved)
                    if not worked:
                        idle += 1
                        time.sleep(min(0.05 * idle, 0.5))  # back off while others hold the rest
                    else:
                        idle = 0
        except Exception as error:
            errors.append(f"{name}: {error!r}")

    def sql_count(query: str) -> tuple[int]:
        with lock:  # one psycopg connection, shared by the threads one at a time
            row = sql.execute(query).fetchone()
        assert row is not None
        return (int(row[0]),)

    workers = [(f"prep-{n}", "reviewer") for n in range(PREPARERS)]
    workers += [(f"appr-{n}", "approver") for n in range(APPROVERS)]
    threads = [
        threading.Thread(target=worker, args=(name, role, n), name=name)
        for n, (name, role) in enumerate(workers)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=DEADLINE_S + 120)
    assert not [t.name for t in threads if t.is_alive()], "workers still running"
    assert not errors, errors[:5]

    # Every call answered as the rules say: no 5xx, and the only refusals are the expected ones.
    refusals = {("approve own", 403), ("approve own", 409)}
    unexpected = {k: n for k, n in statuses.items() if k[1] != 200 and k not in refusals}
    assert not unexpected, (unexpected, statuses)
    outcomes = Counter((status, code) for _, _, status, code in own_attempts)
    assert set(outcomes) <= {(403, "SEGREGATION_OF_DUTIES"), (409, "LEASE_NOT_HELD")}, outcomes
    assert outcomes[(403, "SEGREGATION_OF_DUTIES")] > 0, outcomes
    # A 409 only where another approver rejected the proposal after it was submitted: until then
    # the item is the caller's own proposal, and the answer must be 403.
    for name, item_id, status, _ in own_attempts:
        if status == 409:
            rejected_after = sql.execute(
                "SELECT EXISTS (SELECT FROM review_queue_event s JOIN review_queue_event r"
                " ON r.item_id = s.item_id AND r.id > s.id AND r.event = 'REJECTED' AND r.actor <> %s"
                " WHERE s.item_id = %s AND s.event = 'SUBMITTED_FOR_APPROVAL' AND s.actor = %s)",
                (name, item_id, name),
            ).fetchone()
            assert rejected_after == (True,), (
                f"{name}'s own approve of {item_id} was a 409 without a rejection"
            )
    assert statuses[("approve", 200)] >= TOTAL and statuses[("reject", 200)] > 0, statuses

    states = sql.execute("SELECT state, count(*) FROM review_queue_item GROUP BY state").fetchall()
    assert states == [("RESOLVED", TOTAL)], states

    # From the event table: one decision per item, by an approver who did not prepare it.
    decided = sql.execute(
        "SELECT item_id, count(*) FILTER (WHERE event = 'APPROVED') AS approved,"
        " count(*) FILTER (WHERE event = 'RESOLVED') AS resolved FROM review_queue_event GROUP BY item_id"
        " HAVING count(*) FILTER (WHERE event = 'APPROVED') <> 1"
        " OR count(*) FILTER (WHERE event = 'RESOLVED') <> 0"
    ).fetchall()
    assert not decided, f"items not approved exactly once: {decided[:5]}"
    own = sql.execute(
        """
        SELECT e.item_id, e.event, e.actor, s.actor AS preparer
        FROM review_queue_event e
        CROSS JOIN LATERAL (
            SELECT actor FROM review_queue_event p
            WHERE p.item_id = e.item_id AND p.event = 'SUBMITTED_FOR_APPROVAL' AND p.id < e.id
            ORDER BY p.id DESC LIMIT 1
        ) s
        WHERE (e.event IN ('APPROVED', 'REJECTED')
               OR (e.event = 'LEASED' AND e.details->>'queue' = 'approval'))
          AND e.actor = s.actor
        """
    ).fetchall()
    assert not own, f"a preparer leased, approved or rejected their own proposal: {own[:5]}"
    same = sql.execute(
        "SELECT id FROM review_queue_item WHERE approved_by IS NULL OR approved_by = resolved_by"
        " OR resolved_by NOT IN (SELECT actor FROM review_queue_event WHERE event = 'SUBMITTED_FOR_APPROVAL')"
    ).fetchall()
    assert not same, f"resolved without a second pair of eyes: {same[:5]}"
    # The approvers who also prepare did take part on both sides.
    both = sql.execute(
        "SELECT count(DISTINCT actor) FROM review_queue_event WHERE event = 'SUBMITTED_FOR_APPROVAL'"
        " AND actor LIKE 'appr-%'"
    ).fetchone()
    assert both is not None and both[0] >= 1, both
