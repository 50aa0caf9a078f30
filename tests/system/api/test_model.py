"""Model-based test: a Hypothesis state machine drives the real API and checks it against a model.

All examples share one database and one in-process app; each example starts from an empty queue
(the previous examples' items are retired, see ReviewQueueMachine.__init__). The rules enqueue
(one by one and in batches, and again with the same or another payload; amounts in two SLA tiers,
some with a due_at of their own), lease (three reviewers, the per-reviewer cap in play, any ledger
entity or one), renew, release and complete (by the last holder or anybody; with no
token, the current token, a stale token of an earlier lease, or another item's token), retry
completions, backdate leases in SQL (within and past the reclaim grace; one lease, or all of a
reviewer's), reclaim as admin (with and without a batch limit), revise an item's figures (new ones,
a retry, a conflicting one, an earlier hash; in every state, and under an open lease followed by
the holder's old token), let an admin release or reassign a lease or release all of a reviewer's,
and make calls that must be refused (wrong role, no token, unknown item). Issue 12: bob and carol
are approvers; completions of big items with a thresholded code are submitted for approval,
approvers lease from the approval queue (never their own proposals, in the same due order), approve
or reject (the preparer is refused with SEGREGATION_OF_DUTIES), and approval leases are released and
reclaimed back to that queue; a revision sends a proposal back to PENDING. After every step the
database must show: approved_by never equal to resolved_by, nothing RESOLVED at or above its code's
threshold without an approval, and no item resolved more than once per reopen. Issue 24: a holder's
release starts a cool-off in which that reviewer's (or approver's) own leases skip the item while
everyone else gets it in its place, until a rule ends every cool-off; a lease naming its item
(item_id) takes exactly that item when it is PENDING and the caller is under the cap, cool-off or not.
Issue 42: a rejected proposal is returned to its preparer: their unnamed leases take it ahead of
due order and nobody else's leases (named or not) take it, until the next lease or a rule ends
every return. Comments (issue 42): anyone who reads items comments on any item in any state (1-2,000
characters, not only blanks; the rest a 422), an integration token is refused (403); a comment never
changes the item (the invariant compares every item with the model after it), and the trail holds
each item's comments in the order they were made, by their authors, word for word.
Materiality (issue 23) is set above every amount here, so the codes' own thresholds decide;
MaterialMachine (at the end) runs the same machine at the seeded 10,000.00.

A plain-Python model predicts every answer exactly: which items a lease hands out and in which
order, which items a reclaim returns and in which order, and the status and problem `code` of every
refused call. After every step the invariant compares the model with the database: state, holder,
lease epoch, resolution, resolver and note of every item, whether its lease is live, expired within
the grace or past it (and never longer than the lease duration), per-reviewer counts under the cap,
and the audit trail (one ENQUEUED per item, one LEASED per lease, exactly one RESOLVED per resolved
item by its resolver, one RENEWED/RELEASED/RECLAIMED per change, nothing for refused calls or
no-ops).

On failure Hypothesis shrinks the run and prints the steps as Python.

Coverage is checked, not hoped for: the test counts the transitions it exists for (leases that hand
out items, successful completions, stale-token refusals while the same reviewer holds the newer
lease, reclaims that take leases back, retries answered already_resolved), prints the tally, and
fails with it when any of them falls under its minimum per example (KEY_MINIMUMS). Some rules are
composites of others (top up the queue before a lease, abandon then reclaim, release and re-lease
then use the old token) because Hypothesis' swarm testing switches whole rules off per example, and
those chains would otherwise be rare.
"""

import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, ClassVar

import httpx
import hypothesis
import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from api.app import create_app
from tests.support import LONG
from tests.support.api import ABOVE_EVERY_AMOUNT, assert_problem, set_materiality
from tests.support.postgres import libpq, make_settings

REVIEWERS = ("alice", "bob", "carol")
APPROVERS = ("bob", "carol")  # role approver: they review too; alice is a plain reviewer
CAP = 3  # REVIEW_QUEUE_MAX_LEASES_PER_REVIEWER: small, so the cap is reached often
MAX_ATTEMPTS = 3  # REVIEW_QUEUE_MAX_ATTEMPTS: small, so items are quarantined and requeued
LEASE_S = 120  # the longest lease (lock_timeout_ms): nothing expires by itself during an example
GRACE_S = 600  # the longest grace: a lease backdated "within the grace" stays unreclaimable
IN_GRACE_S = 60  # backdated this far, a lease is expired but not reclaimable
PAST_GRACE_S = 3600  # backdated this far, it is reclaimable
RESOLUTIONS = ("APPROVED", "WRITE_OFF", "ADJUSTMENT_POSTED")
# The catalogue of this test (set through PUT /resolutions at the start): APPROVED never needs an
# approver and takes no note; the other two need a note, and an approver from BIG on.
NEEDS_NOTE = ("WRITE_OFF", "ADJUSTMENT_POSTED")
BIG = 50000  # every third item is at least this big (see new_payload)
NOTES = (None, "FX rounding", "another note")
# Repeats weight a choice: the holder with a valid token is the common case (it is what lets items
# get resolved and retried at all); every other kind of caller and token still comes up often.
TOKENS = ("none", "current", "current", "stale", "foreign")
# Who calls a holder-only action: whoever leased the item last (the holder, the resolver, or the
# reviewer whose lease was reclaimed or released), or a given reviewer.
CALLERS = ("last_holder", "last_holder", "last_holder", *REVIEWERS)
EVENTS = (
    "ENQUEUED", "LEASED", "RENEWED", "RELEASED", "RECLAIMED", "RESOLVED",
    "QUARANTINED", "REQUEUED", "REOPENED", "REVISED", "REASSIGNED", "SUBMITTED_FOR_APPROVAL", "APPROVED",
    "REJECTED", "COMMENTED",
)  # fmt: skip
# Who comments: every role that reads items (reviewers, approvers, admin, ingest, auditor), and an
# integration token, which may not.
COMMENTERS = (*REVIEWERS, "root", "feeder", "audrey", "hook")
# Texts at and past each limit (1 and 2,000 characters; blanks only; NUL), and plain ones.
COMMENT_TEXTS = (
    "Which JE?",
    "JE-7, posted on the 3rd.\nSee the bank letter.",
    "\u00e9" * 1999 + "\U0001f9fe",  # 2,000 characters, 4,000 bytes
    "x",
    "\u00a0",  # a no-break space is not a blank of the rule
    "",
    " \n\t ",
    "x" * 2001,
    "a\u0000b",
)


def comment_allowed(text: str) -> bool:
    """CommentIn's rule: 1-2,000 characters, not only spaces, tabs and line breaks, no NUL."""
    return 1 <= len(text) <= 2000 and "\x00" not in text and any(c not in " \t\n\r" for c in text)


UNKNOWN = "00000000-0000-4000-8000-000000000000"
# Calls that must be refused whatever the state: (path, caller or None for no token, status, code).
REFUSED = (
    ("/admin/reclaim", "alice", 403, "FORBIDDEN"),
    ("/admin/reclaim", "feeder", 403, "FORBIDDEN"),
    ("/leases", "feeder", 403, "FORBIDDEN"),
    (f"/items/{UNKNOWN}/complete", "feeder", 403, "FORBIDDEN"),
    ("/items/batch", "alice", 403, "FORBIDDEN"),
    # An auditor reads; it never changes the queue.
    ("/leases", "audrey", 403, "FORBIDDEN"),
    ("/items/batch", "audrey", 403, "FORBIDDEN"),
    (f"/items/{UNKNOWN}/complete", "audrey", 403, "FORBIDDEN"),
    ("/admin/reclaim", "audrey", 403, "FORBIDDEN"),
    ("/leases", None, 401, "UNAUTHENTICATED"),
    (f"/items/{UNKNOWN}/renew", "alice", 404, "NOT_FOUND"),
    (f"/items/{UNKNOWN}/release", "bob", 404, "NOT_FOUND"),
    (f"/items/{UNKNOWN}/complete", "carol", 404, "NOT_FOUND"),
    (f"/items/{UNKNOWN}/events", "alice", 404, "NOT_FOUND"),
    # Revisions are the feeder's (ingest); the override is an admin's.
    (f"/items/{UNKNOWN}/revisions", "alice", 403, "FORBIDDEN"),
    (f"/items/{UNKNOWN}/revisions", "audrey", 403, "FORBIDDEN"),
    (f"/items/{UNKNOWN}/revisions", "feeder", 404, "NOT_FOUND"),
    (f"/admin/items/{UNKNOWN}/release", "alice", 403, "FORBIDDEN"),
    (f"/admin/items/{UNKNOWN}/release", "root", 404, "NOT_FOUND"),
    (f"/admin/items/{UNKNOWN}/reassign", "feeder", 403, "FORBIDDEN"),
    (f"/admin/items/{UNKNOWN}/reassign", "root", 404, "NOT_FOUND"),
    ("/admin/reviewers/alice/release", "bob", 403, "FORBIDDEN"),
    (f"/items/{UNKNOWN}/comments", "audrey", 404, "NOT_FOUND"),
    (f"/items/{UNKNOWN}/comments", "hook", 403, "FORBIDDEN"),
)
# The body each refused path is sent with (the rest take none, or an empty one).
REFUSED_BODIES = {
    "/revisions": {"variance_amount": "1.00", "source_hash": "sha256:refused"},
    "/reassign": {"reviewer": "bob", "reason": "refused"},
    "/release": {"reason": "refused"},
    "/comments": {"text": "refused"},
}

# REVIEW_QUEUE_SLA_TIERS: a big item (abs amount BIG or more) is due a day after enqueue, any other a
# week after.
SLA_TIERS = f"{BIG}:24h,0:168h"
# Some items name their due_at: one before every derived deadline, or one after all of them.
EARLY, LATE = "2001-01-01T00:00:00+00:00", "2999-01-01T00:00:00+00:00"
ENTITIES = ("ENTITY-0", "ENTITY-1", "ENTITY-2")

MAX_EXAMPLES, STEPS = (400, 150) if LONG else (60, 100)

# What the runs exercised, over all examples; printed at the end (pytest -s, and on failure) and per
# label with --hypothesis-show-statistics.
TALLY: Counter[str] = Counter()
# The transitions the test exists for, counted over all examples; each must happen at least this many
# times per example on average, or the test fails (its coverage was lost, say by a change to the rules).
KEY_MINIMUMS = {
    "lease handed out items": 1.0,
    "completion resolved an item": 1.0,
    "stale token refused, the same reviewer holding the newer lease": 0.2,
    "a named lease took back an item within its cool-off": 0.2,
    "reclaim took leases back": 0.2,
    "retry answered already_resolved": 0.2,
    "completion submitted for approval": 0.3,
    "proposal approved": 0.2,
    "proposal rejected": 0.1,
    "a preparer's lease took their rejected proposal back first": 0.02,
    "approval refused: segregation of duties": 0.1,
    "a batch completion resolved items": 0.2,
    "lease of one ledger entity handed out items": 0.2,
    "revision applied": 0.5,
    "revision moved a lease on": 0.2,
    "revision sent a proposal back to PENDING": 0.02,
    "old token after a revision answered SOURCE_CHANGED": 0.1,
    "admin released or reassigned a lease": 0.3,
    "comment appended": 0.5,
}
KEY: Counter[str] = Counter()


def key(label: str) -> None:
    KEY[label] += 1
    tally(f"KEY {label}")


def tally(label: str) -> None:
    TALLY[label] += 1
    event(label)


KEYS = itertools.count(1)  # idempotency keys, unique across examples


@dataclass
class Model:
    """What the queue must hold for one item."""

    seq: int  # created_at order
    payload: dict[str, Any]
    trace_id: str
    state: str = "PENDING"
    leased_by: str | None = None  # the holder while ASSIGNED; kept once RESOLVED; None when PENDING
    last_holder: str | None = None  # whoever leased it last
    epoch: int = 0  # lease_epoch == number of leases so far
    attempts: int = 0  # leases since enqueue or the last requeue
    tokens: dict[int, str] = field(default_factory=dict)  # epoch -> lease_token of that lease
    expiry: str = "live"  # live | in_grace | past_grace (while ASSIGNED)
    expired_seq: int = 0  # order of backdating: reclaim returns the oldest expiry first
    resolution: str | None = None
    resolved_by: str | None = None
    note: str | None = None
    resolvers: list[str] = field(default_factory=list)  # every resolution, reopened ones too
    events: Counter[str] = field(default_factory=Counter)
    prepared_by: str | None = None  # the last proposal's preparer (kept after approve or reject)
    proposed: str | None = None
    proposed_note: str | None = None
    approved_by: str | None = None
    # The release cool-off (issue 24): who released it as its holder last; their own leases skip it
    # (the test's cool-off outlasts an example) until the cool_off_ends rule ends it.
    released_by: str | None = None
    # Issue 42: the preparer a rejection returned it to (REVIEW_QUEUE_REJECTED_RETURN_S outlasts an
    # example): their unnamed leases take it first, nobody else's take it; the next lease ends it,
    # and so does the returns_end rule.
    returned_to: str | None = None
    comments: list[tuple[str, str]] = field(default_factory=list)  # (author, text), in order made

    @property
    def big(self) -> bool:
        return abs(float(self.payload["variance_amount"])) >= BIG

    @property
    def lease_open(self) -> bool:
        """A review lease, or an approval lease (AWAITING_APPROVAL with a holder)."""
        return self.state == "ASSIGNED" or (self.state == "AWAITING_APPROVAL" and self.leased_by is not None)

    @property
    def lease_times(self) -> bool:
        """leased_at and lease_expires_at are set (kept once resolved, cleared on submission)."""
        return self.lease_open or self.state == "RESOLVED"

    revised_epoch: int | None = None  # the epoch a revision moved the lease to
    hashes: list[str] = field(default_factory=list)  # earlier source hashes (revised away)

    tier: int = 0  # set from the enqueued payload: a revision changes the amount, never due_at

    def __post_init__(self) -> None:
        due = self.payload.get("due_at")
        if due is not None:
            self.tier = 0 if due == EARLY else 3
        else:
            self.tier = 1 if abs(Decimal(self.payload["variance_amount"])) >= BIG else 2

    @property
    def place(self) -> tuple[int, int]:
        """Queue position, kept across release, reclaim, requeue, reopen and revisions: due_at first
        (a named EARLY one, then the 24 h tier, the 168 h tier, a named LATE one), then created_at."""
        return self.tier, self.seq


class ReviewQueueMachine(RuleBasedStateMachine):
    # Set by the test function: one app and one database for all examples.
    client: ClassVar[TestClient]
    sql: ClassVar[psycopg.Connection]
    tokens: ClassVar[dict[str, str]] = {}  # subject -> bearer token: reviewers, root, feeder
    feed_cursor: ClassVar[str | None] = None  # where the change feed was read to, across examples

    items = Bundle("items")  # every enqueued item
    leases = Bundle("leases")  # an item each time it is leased: holder actions aim here
    resolved = Bundle("resolved")  # items once resolved: completion retries aim here
    proposals = Bundle("proposals")  # items once submitted for approval: approve and reject aim here

    def __init__(self) -> None:
        super().__init__()
        # A clean queue for this example. The audit trail is append-only (TRUNCATE is refused), so
        # instead of emptying the tables, the previous examples' items are retired: RESOLVED rows
        # are invisible to leases, reclaims and the cap. Everything this example checks is what was
        # created or happened from `since` on.
        self.sql.execute(
            "UPDATE review_queue_item SET state = 'RESOLVED', resolution = 'RETIRED',"
            " resolved_by = 'model-test', resolved_at = now() WHERE state <> 'RESOLVED'"
        )
        self.since = self.sql.execute("SELECT clock_timestamp()").fetchone()[0]  # type: ignore[index]
        self.model: dict[str, Model] = {}
        self.seq = itertools.count()
        self.payloads = itertools.count()
        self.expired_seq = itertools.count(1)
        self.all_tokens: set[str] = set()
        # The change feed from here on: each event once, each item's in id order, its item as it stood
        # right after the event (so an item's latest event has it as it is now).
        self.feed_seen: Counter[tuple[str, str]] = Counter()
        self.feed_ids: dict[str, list[int]] = {}
        self.feed_last_state: dict[str, str] = {}
        self.read_feed(500, check=False)
        TALLY["examples"] += 1

    # --- helpers ------------------------------------------------------------------------

    def headers(self, subject: str | None) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[subject]}"} if subject else {}

    def post(self, path: str, subject: str | None, body: dict[str, Any] | None = None) -> httpx.Response:
        if body is None:
            return self.client.post(path, headers=self.headers(subject))
        return self.client.post(path, json=body, headers=self.headers(subject))

    def new_payload(self) -> dict[str, Any]:
        # The key is unique across examples; everything that decides the queue order (amount,
        # due_at, entity) and whether an item is big counts within the example, so that a replayed
        # example behaves the same.
        n, k = next(KEYS), next(self.payloads)
        due = {0: EARLY, 3: LATE}.get(k % 7)
        amount = f"{BIG + k}.00" if k % 3 == 0 else f"{k * 337 % 1000}.{k % 100:02d}"  # both SLA tiers
        return {
            "idempotency_key": f"model-{n}",
            "ledger_entity": ENTITIES[k % 3],
            "variance_amount": f"-{amount}" if k % 2 else amount,
            "match_decision": ("MATCHED", "PARTIAL", "UNMATCHED")[k % 3],
            "source_hash": f"sha256:{n:08x}",
            **({"due_at": due} if due else {}),
            # Half carry an invoice number, nested as a matcher may send it: the search finds it.
            **({"context": {"refs": {"invoice": f"INV-{n}"}}} if k % 2 == 0 else {}),
        }

    def created(self, item: dict[str, Any], payload: dict[str, Any]) -> str:
        assert item["id"] not in self.model, f"a new key answered an existing item: {item}"
        self.model[item["id"]] = Model(
            seq=next(self.seq), payload=payload, trace_id=item["trace_id"], events=Counter(ENQUEUED=1)
        )
        self.check_item(item, item["id"], "feeder")
        return str(item["id"])

    def caller(self, item_id: str, caller: str) -> str:
        return (self.model[item_id].last_holder or REVIEWERS[0]) if caller == "last_holder" else caller

    def token_for(self, item_id: str, choice: str) -> tuple[str | None, int | None, bool, str]:
        """(token to send, its epoch when it is this item's, whether it is another item's, its kind).

        A choice that does not exist (no earlier lease, no other item leased yet) sends no token.
        """
        m = self.model[item_id]
        if choice == "current" and m.epoch in m.tokens:
            return m.tokens[m.epoch], m.epoch, False, "current"
        if choice == "stale" and m.epoch - 1 in m.tokens:
            return m.tokens[m.epoch - 1], m.epoch - 1, False, "stale"
        if choice == "foreign":
            for other_id, other in sorted(self.model.items(), key=lambda kv: kv[1].seq):
                if other_id != item_id and other.tokens:
                    return other.tokens[max(other.tokens)], None, True, "foreign"
        return None, None, False, "none"

    def holder_call(
        self, action: str, item_id: str, caller: str, token: str, fields: dict[str, Any]
    ) -> tuple[str, httpx.Response | None]:
        """POST /items/{id}/<action> (renew, release) with the chosen lease_token; a caller who does
        not hold the current lease must get 409 LEASE_NOT_HELD (then None), a holder 200."""
        reviewer = self.caller(item_id, caller)
        sent, epoch, foreign, kind = self.token_for(item_id, token)
        body = {k: v for k, v in {"lease_token": sent, **fields}.items() if v is not None}
        response = self.post(f"/items/{item_id}/{action}", reviewer, body or None)
        tally(f"{action} by {caller}, token {kind}: {response.status_code}")
        self.tally_stale(item_id, reviewer, kind)
        if not self.holds(item_id, reviewer, epoch, foreign, approval=None):
            self.check_refusal(response, item_id, reviewer, epoch, foreign, complete=False)
            return reviewer, None
        assert response.status_code == 200, response.text
        return reviewer, response

    def tally_stale(self, item_id: str, reviewer: str, kind: str) -> None:
        """The stale-tab case: an older lease's token from the reviewer who holds the newer lease."""
        m = self.model[item_id]
        if kind == "stale" and m.state == "ASSIGNED" and m.leased_by == reviewer:
            key("stale token refused, the same reviewer holding the newer lease")

    def source_changed(
        self, item_id: str, reviewer: str, epoch: int | None, foreign: bool, *, complete: bool
    ) -> bool:
        """Is the holder's call refused because a revision moved their lease on? With a token of an
        earlier epoch, any action; without a token, a completion (which sends no source_hash here)."""
        m = self.model[item_id]
        if foreign or m.state != "ASSIGNED" or m.leased_by != reviewer or m.revised_epoch != m.epoch:
            return False
        return complete if epoch is None else epoch != m.epoch

    def check_refusal(
        self,
        response: httpx.Response,
        item_id: str,
        reviewer: str,
        epoch: int | None,
        foreign: bool,
        *,
        complete: bool,
    ) -> None:
        """409 SOURCE_CHANGED (with the current item and the holder's new token) or LEASE_NOT_HELD."""
        if self.source_changed(item_id, reviewer, epoch, foreign, complete=complete):
            problem = assert_problem(response, 409, "SOURCE_CHANGED")
            self.check_item(problem["item"], item_id, reviewer)
            key("old token after a revision answered SOURCE_CHANGED")
        else:
            assert_problem(response, 409, "LEASE_NOT_HELD")

    def holds(
        self, item_id: str, reviewer: str, epoch: int | None, foreign: bool, approval: bool | None = False
    ) -> bool:
        """Does this call pass the holder guard (and the fence, when it carries a token)? approval:
        False for a review lease, True for an approval lease, None for either (renew, release)."""
        m = self.model[item_id]
        states = {False: ("ASSIGNED",), True: ("AWAITING_APPROVAL",), None: ("ASSIGNED", "AWAITING_APPROVAL")}
        return (
            not foreign
            and m.state in states[approval]
            and m.leased_by == reviewer
            and (epoch is None or epoch == m.epoch)
        )

    def check_item(self, body: dict[str, Any], item_id: str, viewer: str) -> None:
        """An item in a response equals the model (with the token only when the viewer holds it)."""
        m = self.model[item_id]
        assert body["id"] == item_id
        held = m.lease_open and m.leased_by == viewer
        expected = {
            "prepared_by": m.prepared_by,
            "proposed_resolution": m.proposed,
            "proposed_note": m.proposed_note,
            "approved_by": m.approved_by,
            "state": m.state,
            "leased_by": m.leased_by,
            "attempts": m.attempts,
            "resolution": m.resolution,
            "resolved_by": m.resolved_by,
            "resolution_note": m.note,
            "lease_token": m.tokens[m.epoch] if held else None,
            "trace_id": m.trace_id,
            **m.payload,
        }
        assert {k: body[k] for k in expected} == expected, (body, expected)
        leased = m.lease_times
        assert (body["leased_at"] is not None) == leased, body
        assert (body["lease_expires_at"] is not None) == leased, body
        assert (body["resolved_at"] is not None) == (m.state == "RESOLVED"), body

    def complete_as(
        self, item_id: str, caller: str, token: str, resolution: str, note: str | None, rule: str
    ) -> bool:
        """POST complete and check the answer against the model; True when it resolved the item."""
        reviewer = self.caller(item_id, caller)
        sent, epoch, foreign, kind = self.token_for(item_id, token)
        body = {"resolution": resolution, "note": note, "lease_token": sent}
        response = self.post(
            f"/items/{item_id}/complete", reviewer, {k: v for k, v in body.items() if v is not None}
        )
        answer = response.json()
        tally(f"{rule} by {caller}, token {kind}: {answer.get('outcome') or answer.get('code')}")
        self.tally_stale(item_id, reviewer, kind)
        if response.status_code == 200:
            assert set(answer) == {"outcome", "item"}, answer
            return self.judge_completion(item_id, reviewer, epoch, foreign, resolution, note, answer)
        problem = assert_problem(response, response.status_code, answer.get("code", "?"))
        return self.judge_completion(
            item_id, reviewer, epoch, foreign, resolution, note, {"problem": problem}
        )

    def judge_completion(
        self,
        item_id: str,
        reviewer: str,
        epoch: int | None,
        foreign: bool,
        resolution: str,
        note: str | None,
        answer: dict[str, Any],
    ) -> bool:
        """Check one completion's answer (the single route's body, or one entry of the batch route's:
        `outcome` and `item`, or `problem`) against the model and apply it; True when it resolved."""
        m = self.model[item_id]
        fenced = not foreign and (epoch is None or epoch == m.epoch)
        retry = fenced and m.state == "RESOLVED" and m.resolved_by == reviewer
        resubmitted = fenced and m.state == "AWAITING_APPROVAL" and m.prepared_by == reviewer
        code = (answer.get("problem") or {}).get("code")
        changed = self.source_changed(item_id, reviewer, epoch, foreign, complete=True)
        held = self.holds(item_id, reviewer, epoch, foreign) and not changed
        if held and resolution in NEEDS_NOTE and not note:
            assert code == "VALIDATION_ERROR", answer
            assert answer["problem"]["status"] == 422, answer
            assert answer["problem"]["errors"][0]["loc"] == ["body", "note"], answer
            tally("completion refused: note required")
            return False
        if held and resolution != "APPROVED" and m.big:
            assert answer.get("outcome") == "submitted_for_approval", answer
            key("completion submitted for approval")
            m.state, m.leased_by, m.expiry = "AWAITING_APPROVAL", None, "live"
            m.prepared_by, m.proposed, m.proposed_note, m.approved_by = reviewer, resolution, note, None
            m.events["SUBMITTED_FOR_APPROVAL"] += 1
            self.check_item(answer["item"], item_id, reviewer)
            return False
        if held:
            assert answer.get("outcome") == "resolved", answer
            key("completion resolved an item")
            # leased_by stays: it records who held the item when it was resolved.
            m.state, m.resolution, m.resolved_by, m.note = "RESOLVED", resolution, reviewer, note
            m.prepared_by = m.proposed = m.proposed_note = m.approved_by = None
            m.resolvers.append(reviewer)
            m.events["RESOLVED"] += 1
        elif resubmitted:
            if resolution != m.proposed:
                assert code == "RESOLUTION_CONFLICT", answer
                assert answer["problem"]["status"] == 409, answer
                return False
            assert answer.get("outcome") == "already_submitted", answer
            tally("retry answered already_submitted")
        elif retry and resolution == m.resolution:
            # A retry changes nothing, not even the note.
            assert answer.get("outcome") == "already_resolved", answer
            key("retry answered already_resolved")
        elif retry:
            assert code == "RESOLUTION_CONFLICT", answer
            assert answer["problem"]["status"] == 409, answer
            return False
        else:
            if changed:
                assert code == "SOURCE_CHANGED", answer
                self.check_item(answer["problem"]["item"], item_id, reviewer)
                key("old token after a revision answered SOURCE_CHANGED")
            else:
                assert code == "LEASE_NOT_HELD", answer
            assert answer["problem"]["status"] == 409, answer
            return False
        self.check_item(answer["item"], item_id, reviewer)
        return answer["outcome"] == "resolved"

    def approval_queue(self) -> list[str]:
        return [
            i
            for i, m in sorted(self.model.items(), key=lambda kv: kv[1].place)
            if m.state == "AWAITING_APPROVAL" and m.leased_by is None
        ]

    def open_leases(self, reviewer: str) -> int:
        return sum(1 for m in self.model.values() if m.lease_open and m.leased_by == reviewer)

    def lease_approvals(self, approver: str, batch_size: int) -> list[str]:
        """POST /leases {queue: approval}: other people's proposals, oldest first, under the cap."""
        held = self.open_leases(approver)
        mine_excluded = [
            i
            for i in self.approval_queue()
            if self.model[i].prepared_by != approver and self.model[i].released_by != approver
        ]
        expected = mine_excluded[: max(0, min(batch_size, CAP - held))]
        response = self.post("/leases", approver, {"batch_size": batch_size, "queue": "approval"})
        if approver not in APPROVERS:
            assert_problem(response, 403, "FORBIDDEN")
            return []
        assert response.status_code == 200, response.text
        got = response.json()["items"]
        tally(f"approval lease: {'some' if got else 'none'}")
        assert [i["id"] for i in got] == expected, (approver, expected, got)
        for body in got:
            m = self.model[body["id"]]
            token = body["lease_token"]
            assert token and token not in self.all_tokens, token
            self.all_tokens.add(token)
            m.leased_by, m.last_holder, m.epoch, m.expiry = approver, approver, m.epoch + 1, "live"
            m.tokens[m.epoch] = token
            m.events["LEASED"] += 1
            self.check_item(body, body["id"], approver)
        return expected

    def decide(self, item_id: str, caller: str, token: str, approve: bool) -> None:
        """POST approve or reject, checked against the model."""
        m = self.model[item_id]
        actor = self.caller(item_id, caller)
        sent, epoch, foreign, kind = self.token_for(item_id, token)
        action = "approve" if approve else "reject"
        body = {
            k: v for k, v in {"lease_token": sent, "reason": None if approve else "wrong entity"}.items() if v
        }
        response = self.post(f"/items/{item_id}/{action}", actor, body or None)
        tally(f"{action} by {caller}, token {kind}: {response.status_code}")
        if actor not in APPROVERS:
            assert_problem(response, 403, "FORBIDDEN")
            return
        if self.holds(item_id, actor, epoch, foreign, approval=True) and m.prepared_by != actor:
            assert response.status_code == 200, response.text
            if approve:
                assert response.json()["outcome"] == "approved"
                key("proposal approved")
                m.state, m.resolution, m.note = "RESOLVED", m.proposed, m.proposed_note
                m.resolved_by, m.approved_by = m.prepared_by, actor
                m.events["APPROVED"] += 1
                self.check_item(response.json()["item"], item_id, actor)
            else:
                key("proposal rejected")
                m.state, m.leased_by, m.returned_to = "PENDING", None, m.prepared_by
                m.events["REJECTED"] += 1
                self.check_item(response.json(), item_id, actor)
            return
        if (
            m.prepared_by == actor
            and m.state in ("AWAITING_APPROVAL", "RESOLVED")
            and (approve or m.state == "AWAITING_APPROVAL")
        ):
            assert_problem(response, 403, "SEGREGATION_OF_DUTIES")
            key("approval refused: segregation of duties")
            return
        fenced = not foreign and (epoch is None or epoch == m.epoch)
        if approve and m.state == "RESOLVED" and m.approved_by == actor and fenced:
            assert response.status_code == 200, response.text
            assert response.json()["outcome"] == "already_approved"
            tally("retry answered already_approved")
            return
        assert_problem(response, 409, "LEASE_NOT_HELD")

    def complete_many(
        self, reviewer: str, entries: list[tuple[str, str, str, str | None]], rule: str
    ) -> list[str]:
        """POST /items/complete with (item_id, token choice, resolution, note) entries; each entry's
        answer is checked as the single route's would be, in order. The ids it resolved."""
        sent_entries, judged = [], []
        for item_id, token, resolution, note in entries:
            sent, epoch, foreign, kind = self.token_for(item_id, token)
            self.tally_stale(item_id, reviewer, kind)
            entry = {"id": item_id, "resolution": resolution, "note": note, "lease_token": sent}
            sent_entries.append({k: v for k, v in entry.items() if v is not None})
            judged.append((item_id, epoch, foreign, resolution, note))
        response = self.post("/items/complete", reviewer, {"items": sent_entries})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["id"] for r in results] == [e["id"] for e in sent_entries], results
        done = []
        for (item_id, epoch, foreign, resolution, note), result in zip(judged, results, strict=True):
            tally(f"{rule}: {result['outcome']} {(result['problem'] or {}).get('code', '')}")
            if result["outcome"] == "refused":
                assert result["item"] is None, result
            else:
                assert result["problem"] is None, result
            if self.judge_completion(item_id, reviewer, epoch, foreign, resolution, note, result):
                done.append(item_id)
        if done:
            key("a batch completion resolved items")
        return done

    # --- rules --------------------------------------------------------------------------

    @initialize(target=items, count=st.integers(1, 4))
    def seed(self, count: int) -> Any:
        return self.enqueue(count=count, batch=True)

    @rule(target=items, count=st.integers(1, 3), batch=st.booleans())
    def enqueue(self, count: int, batch: bool) -> Any:
        payloads = [self.new_payload() for _ in range(count)]
        if batch:
            response = self.post("/items/batch", "feeder", {"items": payloads})
            assert response.status_code == 200, response.text
            results = response.json()["results"]
            assert [r["outcome"] for r in results] == ["created"] * count, results
            ids = [self.created(r["item"], p) for r, p in zip(results, payloads, strict=True)]
        else:
            ids = []
            for payload in payloads:
                response = self.post("/items", "feeder", payload)
                assert response.status_code == 201, response.text
                ids.append(self.created(response.json(), payload))
        return multiple(*ids)

    @rule(item_id=items, same=st.booleans(), batch=st.booleans())
    def enqueue_again(self, item_id: str, same: bool, batch: bool) -> None:
        """The same key again: the same item when the payload is the same, else a conflict."""
        m = self.model[item_id]
        payload = dict(m.payload) if same else {**m.payload, "source_hash": "sha256:different"}
        if batch:
            response = self.post("/items/batch", "feeder", {"items": [payload]})
            assert response.status_code == 200, response.text
            (result,) = response.json()["results"]
            if same:
                assert result["outcome"] == "existing" and result["problem"] is None, result
                self.check_item(result["item"], item_id, "feeder")
            else:
                assert result["outcome"] == "conflict" and result["item"] is None, result
                problem = result["problem"]
                assert (problem["status"], problem["code"], problem["item_id"]) == (
                    409, "IDEMPOTENCY_CONFLICT", item_id,
                ), problem  # fmt: skip
        else:
            response = self.post("/items", "feeder", payload)
            if same:
                assert response.status_code == 200, response.text
                self.check_item(response.json(), item_id, "feeder")
            else:
                assert assert_problem(response, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == item_id

    def searchable(self, item_id: str) -> list[str]:
        """What GET /items?q= looks at: the id, the key, the entity, the context's values."""
        payload = self.model[item_id].payload
        invoice = payload.get("context", {}).get("refs", {}).get("invoice")
        return [item_id, payload["idempotency_key"], payload["ledger_entity"], *filter(None, [invoice])]

    def search(self, n: int) -> None:
        """Issue 42: q finds, in any letter case, exactly the items whose id, key, entity or a context
        value starts with the term (this example's: created from `since` on), in any state. The term
        is the n-th in a fixed rotation (item, which value, how long, which case), drawing nothing."""
        if not self.model:
            return
        ordered = sorted(self.model, key=lambda i: self.model[i].seq)
        values = self.searchable(ordered[n % len(ordered)])
        term = values[n % len(values)][: 1 + n * 7 % 14]
        term = term.upper() if n % 2 else term.lower()
        starts = term.lower()
        expected = {i for i in self.model if any(v.lower().startswith(starts) for v in self.searchable(i))}
        served: list[str] = []
        params: dict[str, Any] = {"q": term, "created_after": self.since.isoformat(), "limit": 200}
        while True:  # every page: a one-letter term can match more than a page of items
            response = self.client.get("/items", params=params, headers=self.headers("audrey"))
            assert response.status_code == 200, response.text
            page = response.json()
            served += [i["id"] for i in page["items"]]
            if page["next_cursor"] is None:
                break
            params["cursor"] = page["next_cursor"]
        found = set(served)
        assert len(found) == len(served), f"an item on two pages: {Counter(served).most_common(3)}"
        assert found == expected, (term, found ^ expected)
        tally(f"search found {'one item' if len(expected) == 1 else 'several items'}")

    @rule(
        target=leases,
        reviewer=st.sampled_from((*REVIEWERS, "least_busy", "least_busy")),
        batch_size=st.integers(1, 5),
        top_up=st.sampled_from([True, True, True, False]),
        entity=st.sampled_from((None, None, None, *ENTITIES)),
    )
    def lease(self, reviewer: str, batch_size: int, top_up: bool = False, entity: str | None = None) -> Any:
        """Lease; with top_up the feeder first enqueues what the queue lacks for this batch. Swarm
        testing disables whole rules in an example (enqueue too), so without it most leases would
        find the queue empty; leases of an empty queue still come up (top_up False). "least_busy"
        is whoever holds fewest, so that leases at the cap are common but not the rule. With an
        entity, only that ledger entity's items are leased."""
        if reviewer == "least_busy":
            holding = Counter(m.leased_by for m in self.model.values() if m.lease_open)
            reviewer = min(REVIEWERS, key=lambda r: holding[r])
        pending_now = sum(1 for m in self.model.values() if m.state == "PENDING")
        if top_up and pending_now < batch_size:
            self.enqueue(count=batch_size - pending_now, batch=True)
        held = self.open_leases(reviewer)
        pending = sorted(
            (m.returned_to != reviewer, m.place, i)
            for i, m in self.model.items()
            if m.state == "PENDING"
            and entity in (None, m.payload["ledger_entity"])
            and m.released_by != reviewer
            and m.returned_to in (None, reviewer)
        )
        # The reviewer's returned proposals are taken first; the batch comes back in queue order.
        chosen = pending[: max(0, min(batch_size, CAP - held))]
        expected = [i for _, _, i in sorted(chosen, key=lambda c: c[1:])]
        body = {"batch_size": batch_size, **({"ledger_entity": entity} if entity else {})}
        response = self.post("/leases", reviewer, body)
        assert response.status_code == 200, response.text
        got = response.json()["items"]
        tally(
            f"lease{' of one entity' if entity else ''}: {'some' if got else 'none'}"
            f"{' (at the cap)' if held == CAP else ''}"
        )
        if got:
            key("lease handed out items")
            if entity:
                key("lease of one ledger entity handed out items")
        assert [i["id"] for i in got] == expected, (
            f"{reviewer} holding {held} asked for {batch_size} of {entity or 'any entity'}: expected"
            f" {expected} (earliest due, then oldest first, cap {CAP}), got {[i['id'] for i in got]}"
        )
        for body in got:
            m = self.model[body["id"]]
            token = body["lease_token"]
            assert token and token not in self.all_tokens, f"lease_token missing or reused: {token!r}"
            self.all_tokens.add(token)
            if m.returned_to == reviewer:
                key("a preparer's lease took their rejected proposal back first")
            m.state, m.leased_by, m.last_holder, m.epoch = "ASSIGNED", reviewer, reviewer, m.epoch + 1
            m.returned_to = None
            m.attempts += 1
            m.expiry = "live"
            m.tokens[m.epoch] = token
            m.events["LEASED"] += 1
            self.check_item(body, body["id"], reviewer)
        return multiple(*expected)

    @rule(item_id=leases, caller=st.sampled_from(CALLERS), token=st.sampled_from(TOKENS))
    def renew(self, item_id: str, caller: str, token: str) -> None:
        reviewer, response = self.holder_call("renew", item_id, caller, token, {})
        if response is None:
            return
        m = self.model[item_id]
        m.expiry = "live"
        m.events["RENEWED"] += 1
        self.check_item(response.json(), item_id, reviewer)

    @rule(
        item_id=leases,
        caller=st.sampled_from(CALLERS),
        token=st.sampled_from(TOKENS),
        reason=st.sampled_from([None, "needs the FX desk"]),
    )
    def release(self, item_id: str, caller: str, token: str, reason: str | None) -> None:
        reviewer, response = self.holder_call("release", item_id, caller, token, {"reason": reason})
        if response is None:
            return
        m = self.model[item_id]
        m.leased_by = None
        m.released_by = reviewer
        m.events["RELEASED"] += 1
        if m.state == "ASSIGNED":
            self.back_to_queue(m)
        self.check_item(response.json(), item_id, reviewer)

    def back_to_queue(self, m: Model) -> None:
        """A release or reclaim: PENDING again, or QUARANTINED once the attempts are used up."""
        m.state = "QUARANTINED" if m.attempts >= MAX_ATTEMPTS else "PENDING"
        if m.state == "QUARANTINED":
            m.events["QUARANTINED"] += 1
            tally("quarantined")

    @rule(item_id=items, reason=st.sampled_from(["poison fixed", "retry after the FX feed"]))
    def requeue(self, item_id: str, reason: str) -> None:
        """An admin requeues an item: a quarantined one goes back to its place with fresh attempts."""
        m = self.model[item_id]
        response = self.post(f"/items/{item_id}/requeue", "root", {"reason": reason})
        tally(f"requeue of {m.state}: {response.status_code}")
        if m.state != "QUARANTINED":
            assert_problem(response, 409, "NOT_QUARANTINED")
            return
        assert response.status_code == 200, response.text
        m.state, m.attempts = "PENDING", 0
        m.events["REQUEUED"] += 1
        self.check_item(response.json(), item_id, "root")

    @rule(item_id=resolved, reason=st.sampled_from(["wrong resolution", "auditor asked"]))
    def reopen(self, item_id: str, reason: str) -> None:
        """An admin reopens an item: a resolved one is PENDING again, in its place, with fresh
        attempts; the old decision stays in the trail (checked in test_reopen)."""
        m = self.model[item_id]
        response = self.post(f"/items/{item_id}/reopen", "root", {"reason": reason})
        tally(f"reopen of {m.state}: {response.status_code}")
        if m.state != "RESOLVED":
            assert_problem(response, 409, "NOT_RESOLVED")
            return
        assert response.status_code == 200, response.text
        m.state, m.attempts, m.leased_by = "PENDING", 0, None
        m.resolution = m.resolved_by = m.note = m.approved_by = None
        m.events["REOPENED"] += 1
        self.check_item(response.json(), item_id, "root")

    @rule(
        target=resolved,
        item_id=leases,
        caller=st.sampled_from(CALLERS),
        token=st.sampled_from(TOKENS),
        resolution=st.sampled_from(RESOLUTIONS),
        note=st.sampled_from(NOTES),
    )
    def complete(self, item_id: str, caller: str, token: str, resolution: str, note: str | None) -> Any:
        if self.complete_as(item_id, caller, token, resolution, note, "complete"):
            return item_id
        return multiple()

    @rule(
        target=proposals,
        approver=st.sampled_from((*APPROVERS, *APPROVERS, "alice")),
        batch_size=st.integers(1, 3),
        submit_first=st.sampled_from([True, True, False]),
    )
    def lease_for_approval(self, approver: str, batch_size: int, submit_first: bool) -> Any:
        """Lease from the approval queue; usually after someone submitted a big item first (a
        composite, so that proposals exist even when swarm testing turned other rules off)."""
        if submit_first:
            # Someone other than the approver, an approver first: with the release cool-off the
            # lease order no longer brings proposals of approvers (for the preparer's own refusal)
            # often enough by itself.
            others = [r for r in dict.fromkeys((*APPROVERS, *REVIEWERS)) if r != approver]
            preparer = next((r for r in others if self.open_leases(r) < CAP), None)
            if preparer is not None:
                big = [i for i in self.approval_queue() if self.model[i].prepared_by != approver]
                if not big:
                    self.enqueue(count=3, batch=True)  # every third payload is big
                    self.lease(preparer, 3, top_up=False)
                    # Leases go by deadline: the new big item may wait behind earlier ones, so any
                    # big item the preparer holds is submitted.
                    for item_id in self.assigned():
                        if self.model[item_id].leased_by == preparer and self.model[item_id].big:
                            self.complete_as(item_id, preparer, "current", "WRITE_OFF", "big", "submit")
        return multiple(*self.lease_approvals(approver, batch_size))

    @rule(
        item_id=proposals,
        caller=st.sampled_from(CALLERS),
        token=st.sampled_from(TOKENS),
        approve=st.booleans(),
    )
    def decide_proposal(self, item_id: str, caller: str, token: str, approve: bool) -> None:
        self.decide(item_id, caller, token, approve)

    @precondition(lambda self: bool(self.held_proposals()))
    @rule(approve=st.booleans())
    def holder_decides(self, approve: bool) -> None:
        """The approver holding the oldest held proposal decides it with their lease's token: the
        desk's path (decide_proposal draws callers and tokens at random, and seldom lands on it).
        A rejection is followed by its preparer's lease, which must take the proposal back first
        (issue 42; not a rule of its own: a new rule shifts which rules each derandomized example
        draws)."""
        item_id = self.held_proposals()[0]
        self.decide(item_id, "last_holder", "current", approve)
        preparer = self.model[item_id].returned_to
        if not approve and preparer is not None:
            self.lease(preparer, 1)

    def held_proposals(self) -> list[str]:
        return [
            i
            for i, m in sorted(self.model.items(), key=lambda kv: kv[1].place)
            if m.state == "AWAITING_APPROVAL" and m.leased_by in APPROVERS
        ]

    @rule(item_id=proposals, approve=st.booleans())
    def preparer_decides(self, item_id: str, approve: bool) -> None:
        """The preparer of a proposal tries to decide it: refused, whatever their role."""
        m = self.model[item_id]
        if m.prepared_by in APPROVERS:
            self.decide(item_id, m.prepared_by, "none", approve)

    @precondition(lambda self: bool(self.assigned()))
    @rule(
        target=resolved,
        nth=st.integers(0, 3 * CAP),
        token=st.sampled_from(("current", "none")),
        resolution=st.sampled_from(RESOLUTIONS),
        note=st.sampled_from(NOTES),
        retry=st.booleans(),
    )
    def complete_held(self, nth: int, token: str, resolution: str, note: str | None, retry: bool) -> Any:
        """The holder completes an open lease, the everyday case: the `complete` rule aims at any item
        ever leased, by anybody, so most of its calls are refusals and few items would get resolved
        (and retried) otherwise."""
        assigned = self.assigned()
        item_id = assigned[nth % len(assigned)]
        m = self.model[item_id]
        if token == "none" and m.revised_epoch == m.epoch:
            # Without a token the holder must show the new figures: refused, then done with the token.
            assert not self.complete_as(
                item_id, "last_holder", token, resolution, note, "tokenless after revision"
            )
            token = "current"
        # Resolved, or (a big item, a code with a threshold) submitted, or refused for a missing note.
        done = self.complete_as(item_id, "last_holder", token, resolution, note, "complete held")
        if retry:  # the answer was lost and the client sends the same call again
            self.complete_as(item_id, "last_holder", token, resolution, note, "retry held")
        return item_id if done else multiple()

    @precondition(lambda self: bool(self.assigned()))
    @rule(
        target=resolved,
        picks=st.lists(st.integers(0, 3 * CAP), min_size=1, max_size=4),
        token=st.sampled_from(("current", "none", "stale")),
        resolution=st.sampled_from(RESOLUTIONS),
        extra=st.sampled_from(("none", "resolved", "other")),
    )
    def complete_held_batch(self, picks: list[int], token: str, resolution: str, extra: str) -> Any:
        """The holder of several open leases completes them in one POST /items/complete (an id may
        repeat: applied once, the repeat answers as a retry), with an entry that is refused mixed in:
        a resolved item, or an item nobody in the batch holds."""
        assigned = self.assigned()
        holder = self.model[assigned[picks[0] % len(assigned)]].leased_by
        assert holder is not None
        mine = [i for i in assigned if self.model[i].leased_by == holder]
        # One note for the whole batch (a repeated id answers as a retry of its first entry): with
        # none, a code that requires one is refused per entry; with one, a big item is submitted.
        note = "batch" if picks[0] % 2 == 0 else None
        entries = [(mine[p % len(mine)], token, resolution, note) for p in picks]
        others = [
            i
            for i, m in sorted(self.model.items(), key=lambda kv: kv[1].seq)
            if (m.state == "RESOLVED") == (extra == "resolved") and i not in mine
        ]
        if extra != "none" and others:
            entries.insert(len(entries) // 2, (others[0], "none", resolution, "batch"))
        done = self.complete_many(holder, entries, "complete held batch")
        return multiple(*done)

    @rule(
        item_id=resolved,
        caller=st.sampled_from(CALLERS),
        token=st.sampled_from(TOKENS),
        same_resolution=st.booleans(),
        note=st.sampled_from(NOTES),
    )
    def retry_completion(
        self, item_id: str, caller: str, token: str, same_resolution: bool, note: str | None
    ) -> None:
        """Completing a resolved item again: already_resolved, RESOLUTION_CONFLICT or LEASE_NOT_HELD."""
        m = self.model[item_id]
        other = next(r for r in RESOLUTIONS if r != m.resolution)
        resolution = m.resolution if same_resolution and m.resolution else other
        self.complete_as(item_id, caller, token, resolution, note, "retry")

    def assigned(self) -> list[str]:
        return [i for i, m in sorted(self.model.items(), key=lambda kv: kv[1].seq) if m.state == "ASSIGNED"]

    @precondition(lambda self: bool(self.assigned()))
    @rule(nth=st.integers(0, 3 * CAP), past_grace=st.booleans())
    def expire(self, nth: int, past_grace: bool) -> None:
        """Backdate the nth open lease in SQL (database clock), as an abandoned or a slow reviewer's."""
        assigned = self.assigned()
        item_id = assigned[nth % len(assigned)]
        seconds = PAST_GRACE_S if past_grace else IN_GRACE_S
        changed = self.sql.execute(
            "UPDATE review_queue_item SET lease_expires_at = now() - make_interval(secs => %s)"
            " WHERE id = %s AND state = 'ASSIGNED'",
            (seconds, item_id),
        ).rowcount
        assert changed == 1, f"{item_id} is not ASSIGNED in the database"
        m = self.model[item_id]
        m.expiry = "past_grace" if past_grace else "in_grace"
        m.expired_seq = next(self.expired_seq)

    @precondition(lambda self: bool(self.assigned()))
    @rule(reviewer=st.sampled_from(REVIEWERS))
    def abandon(self, reviewer: str) -> None:
        """A reviewer vanishes: every lease they hold ends up past the grace, oldest item first."""
        for item_id in [i for i, m in sorted(self.model.items(), key=lambda kv: kv[1].seq) if m.lease_open]:
            m = self.model[item_id]
            if m.leased_by == reviewer:
                self.sql.execute(
                    "UPDATE review_queue_item SET lease_expires_at = now() - make_interval(secs => %s)"
                    " WHERE id = %s",
                    (PAST_GRACE_S, item_id),
                )  # one statement (one now()) each, so the expiry order is the model's
                m.expiry, m.expired_seq = "past_grace", next(self.expired_seq)

    def first_in_line_once_released(self) -> list[str]:
        """Open leases with attempts left (not quarantined on release): released, such an item is
        PENDING and its holder can take it back by naming it."""
        return [i for i in self.assigned() if self.model[i].attempts < MAX_ATTEMPTS]

    @rule(item_id=items, reviewer=st.sampled_from(REVIEWERS))
    def lease_named(self, item_id: str, reviewer: str) -> None:
        """POST /leases {item_id}: exactly that item if it is PENDING and the reviewer is under the cap
        (the cool-off does not apply: naming it is a choice), else nothing."""
        m = self.model[item_id]
        expected = (
            [item_id]
            if m.state == "PENDING" and m.returned_to in (None, reviewer) and self.open_leases(reviewer) < CAP
            else []
        )
        response = self.post("/leases", reviewer, {"item_id": item_id})
        assert response.status_code == 200, response.text
        got = response.json()["items"]
        tally(f"named lease of {m.state}: {'some' if got else 'none'}")
        assert [i["id"] for i in got] == expected, (reviewer, m.state, expected, got)
        for body in got:
            token = body["lease_token"]
            assert token and token not in self.all_tokens, token
            self.all_tokens.add(token)
            if m.returned_to == reviewer:
                key("a preparer's lease took their rejected proposal back first")
            m.state, m.leased_by, m.last_holder, m.epoch = "ASSIGNED", reviewer, reviewer, m.epoch + 1
            m.returned_to = None
            m.attempts += 1
            m.expiry = "live"
            m.tokens[m.epoch] = token
            m.events["LEASED"] += 1
            if m.released_by == reviewer:
                key("a named lease took back an item within its cool-off")
            self.check_item(body, item_id, reviewer)

    @precondition(lambda self: any(m.released_by for m in self.model.values()))
    @rule()
    def cool_off_ends(self) -> None:
        """Every release cool-off ends (REVIEW_QUEUE_RELEASE_COOLDOWN_S has passed): released items
        can be handed to the reviewers who released them again."""
        self.sql.execute(
            "UPDATE review_queue_item SET released_until = now() - interval '1 second'"
            " WHERE released_until > now()"
        )
        for m in self.model.values():
            m.released_by = None

    @precondition(lambda self: any(m.returned_to for m in self.model.values()))
    @rule()
    def returns_end(self) -> None:
        """Every rejection's return ends (REVIEW_QUEUE_REJECTED_RETURN_S has passed): those items are
        anyone's again, in their due-date place."""
        self.sql.execute(
            "UPDATE review_queue_item SET returned_until = now() - interval '1 second'"
            " WHERE returned_until > now()"
        )
        for m in self.model.values():
            m.returned_to = None

    @precondition(lambda self: bool(self.first_in_line_once_released()))
    @rule(
        nth=st.integers(0, 3 * CAP),
        action=st.sampled_from(("complete", "renew", "release")),
        resolution=st.sampled_from(RESOLUTIONS),
    )
    def stale_tab(self, nth: int, action: str, resolution: str) -> None:
        """A holder hands an item back and takes it back at once by naming it (a plain lease would skip
        it: the release cool-off). It comes back to them under a new lease, and their older token is
        now a stale tab's: the `action` sent with it must be refused although the same reviewer
        holds the item."""
        candidates = self.first_in_line_once_released()
        item_id = candidates[nth % len(candidates)]
        holder = self.model[item_id].leased_by
        assert holder is not None
        self.release(item_id, holder, "current", None)
        self.lease_named(item_id, holder)  # within the cool-off: only naming it brings it back
        m = self.model[item_id]
        assert m.state == "ASSIGNED" and m.leased_by == holder, "the model's queue order is off"
        if action == "complete":
            assert not self.complete_as(item_id, holder, "stale", resolution, None, "stale tab")
        else:
            self.holder_call(action, item_id, holder, "stale", {})

    @precondition(lambda self: any(m.lease_open for m in self.model.values()))
    @rule(
        reclaim_batch=st.one_of(st.none(), st.integers(1, 3)),
        abandon_first=st.sampled_from([True, True, False]),
    )
    def reclaim(self, reclaim_batch: int | None, abandon_first: bool = False) -> None:
        """Reclaim as admin; usually after the holder of the oldest open lease vanished (see abandon),
        so that there is something to take back even in examples that never backdate a lease."""
        if abandon_first:
            holder = next(
                m.leased_by for _, m in sorted(self.model.items(), key=lambda kv: kv[1].seq) if m.lease_open
            )
            assert holder is not None
            self.abandon(holder)
        limit = reclaim_batch or 100

        def due(state: str) -> list[tuple[int, str]]:
            return sorted(
                (m.expired_seq, i)
                for i, m in self.model.items()
                if m.state == state and m.lease_open and m.expiry == "past_grace"
            )

        review = due("ASSIGNED")[:limit]
        approval = due("AWAITING_APPROVAL")[: limit - len(review)]
        expected = [i for _, i in sorted(review + approval)]
        body = {"reclaim_batch": reclaim_batch} if reclaim_batch else None
        response = self.post("/admin/reclaim", "root", body)
        assert response.status_code == 200, response.text
        answer = response.json()
        tally(f"reclaim: {'some' if expected else 'none'}{' (limited batch)' if reclaim_batch else ''}")
        if expected:
            key("reclaim took leases back")
        assert answer == {
            "reclaimed": len(expected),
            "items": [
                {
                    "id": i,
                    "trace_id": self.model[i].trace_id,
                    "source_hash": self.model[i].payload["source_hash"],
                    "match_decision": self.model[i].payload["match_decision"],
                    "state": "AWAITING_APPROVAL"
                    if self.model[i].state == "AWAITING_APPROVAL"
                    else "QUARANTINED"
                    if self.model[i].attempts >= MAX_ATTEMPTS
                    else "PENDING",
                }
                for i in expected
            ],
        }, (answer, expected)
        for i in expected:
            m = self.model[i]
            m.leased_by, m.expiry = None, "live"
            m.events["RECLAIMED"] += 1
            if m.state == "ASSIGNED":
                self.back_to_queue(m)

    @rule(
        item_id=items,
        kind=st.sampled_from(("new", "new", "new", "retry", "conflict", "earlier")),
        decision=st.sampled_from((None, "MATCHED", "UNMATCHED")),
    )
    def revise(self, item_id: str, kind: str, decision: str | None) -> None:
        """The matcher re-ran: new figures (by state: updated; the lease moved on; the decision
        reopened), or the current ones again (unchanged), the current hash with other figures
        (a conflict), or an earlier hash (superseded)."""
        m = self.model[item_id]
        n = next(KEYS)
        if kind == "earlier" and not m.hashes:
            kind = "new"
        current = m.payload
        body: dict[str, Any] = {
            "new": {"variance_amount": self.revised_amount(), "source_hash": f"sha256:rev-{n:08x}"},
            "retry": {"variance_amount": current["variance_amount"], "source_hash": current["source_hash"]},
            "conflict": {
                "variance_amount": "0.02" if current["variance_amount"] == "0.01" else "0.01",
                "source_hash": current["source_hash"],
            },
            "earlier": {"variance_amount": "1.00", "source_hash": m.hashes[0] if m.hashes else ""},
        }[kind]
        if kind == "new" and decision is not None:
            body["match_decision"] = decision
        response = self.post(f"/items/{item_id}/revisions", "feeder", body)
        tally(f"revise ({kind}) of {m.state}: {response.status_code}")
        if kind == "conflict":
            assert assert_problem(response, 409, "IDEMPOTENCY_CONFLICT")["item_id"] == item_id
            return
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["outcome"] == {"new": "revised", "retry": "unchanged", "earlier": "superseded"}[kind], (
            answer
        )
        if kind == "new":
            key("revision applied")
            m.hashes.append(current["source_hash"])
            m.payload = {**current, **body}
            m.events["REVISED"] += 1
            if m.state == "ASSIGNED":
                assert m.leased_by is not None
                m.epoch += 1
                m.revised_epoch = m.epoch
                self.new_token(item_id, m.leased_by)
                key("revision moved a lease on")
            elif m.state == "RESOLVED":
                m.state, m.attempts, m.leased_by = "PENDING", 0, None
                m.resolution = m.resolved_by = m.note = None
                m.approved_by = None
                m.events["REOPENED"] += 1
                tally("revision decertified a decision")
            elif m.state == "AWAITING_APPROVAL":
                # The proposal rested on the old figures: back to PENDING in its old place (any
                # approval lease ends); the proposal stays on the row until the next completion.
                m.state, m.leased_by, m.expiry = "PENDING", None, "live"
                key("revision sent a proposal back to PENDING")
        self.check_item(answer["item"], item_id, "feeder")

    def revised_amount(self) -> str:
        """A revision's amount: big or small by this example's own count (replays behave the same)."""
        k = next(self.payloads)
        return f"{BIG + k}.05" if k % 3 == 0 else f"{k * 337 % 1000}.05"

    def new_token(self, item_id: str, holder: str) -> None:
        """The holder re-reads the item for the token of its new epoch (how a page carries on)."""
        m = self.model[item_id]
        token = self.client.get(f"/items/{item_id}", headers=self.headers(holder)).json()["lease_token"]
        assert token and token not in self.all_tokens, f"lease_token missing or reused: {token!r}"
        self.all_tokens.add(token)
        m.tokens[m.epoch] = token

    @precondition(lambda self: bool(self.assigned()))
    @rule(nth=st.integers(0, 3 * CAP), to=st.sampled_from((None, *REVIEWERS)))
    def override(self, nth: int, to: str | None) -> None:
        """An admin releases someone's lease (to None) or reassigns it to a reviewer."""
        assigned = self.assigned()
        item_id = assigned[nth % len(assigned)]
        m = self.model[item_id]
        if to is None:
            response = self.post(f"/admin/items/{item_id}/release", "root", {"reason": "on leave"})
            assert response.status_code == 200, response.text
            m.state, m.leased_by, m.expiry = "PENDING", None, "live"  # never quarantined
            m.events["RELEASED"] += 1
        else:
            held = self.open_leases(to)  # review and approval leases count together
            response = self.post(
                f"/admin/items/{item_id}/reassign", "root", {"reviewer": to, "reason": "cover"}
            )
            tally(f"reassign: {response.status_code}")
            if m.leased_by == to:
                assert_problem(response, 409, "ALREADY_HELD")
                return
            if held >= CAP:
                assert_problem(response, 409, "REVIEWER_AT_CAP")
                return
            assert response.status_code == 200, response.text
            m.leased_by = m.last_holder = to
            m.epoch += 1
            m.expiry = "live"
            m.events["REASSIGNED"] += 1
            self.new_token(item_id, to)
        key("admin released or reassigned a lease")
        self.check_item(response.json(), item_id, "root")

    @precondition(lambda self: bool(self.assigned()))
    @rule(
        nth=st.integers(0, 3 * CAP),
        action=st.sampled_from(("complete", "renew", "release", "tokenless")),
        resolution=st.sampled_from(RESOLUTIONS),
    )
    def figures_changed_under_holder(self, nth: int, action: str, resolution: str) -> None:
        """A revision moves an open lease on; the holder's next call still carries the old token (or
        completes without one): refused with SOURCE_CHANGED, nothing written."""
        assigned = self.assigned()
        item_id = assigned[nth % len(assigned)]
        holder = self.model[item_id].leased_by
        assert holder is not None
        self.revise(item_id, "new", None)
        if action == "tokenless":
            assert not self.complete_as(item_id, holder, "none", resolution, None, "tokenless after revision")
        elif action == "complete":
            assert not self.complete_as(
                item_id, holder, "stale", resolution, None, "old token after revision"
            )
        else:
            self.holder_call(action, item_id, holder, "stale", {})

    @precondition(lambda self: bool(self.assigned()))
    @rule(reviewer=st.sampled_from(REVIEWERS))
    def release_reviewer(self, reviewer: str) -> None:
        """An admin releases every lease of a reviewer, in one statement, in queue order."""
        # Review and approval leases alike (an approval lease goes back to the approval queue).
        expected = sorted(
            (i for i, m in self.model.items() if m.lease_open and m.leased_by == reviewer),
            key=lambda i: self.model[i].place,
        )
        response = self.post(f"/admin/reviewers/{reviewer}/release", "root", {"reason": "on leave"})
        assert response.status_code == 200, response.text
        answer = response.json()
        assert [i["id"] for i in answer["items"]] == expected and answer["released"] == len(expected), answer
        tally(f"release reviewer: {'some' if expected else 'none'}")
        for body in answer["items"]:
            m = self.model[body["id"]]
            if m.state == "ASSIGNED":
                m.state = "PENDING"
            m.leased_by, m.expiry = None, "live"
            m.events["RELEASED"] += 1
            self.check_item(body, body["id"], "root")
        if expected:
            key("admin released or reassigned a lease")

    def read_feed(self, limit: int, check: bool = True) -> None:
        """Read GET /events (as the auditor) to its end: what it serves is exactly the events the
        model expects, each once, each item's in their own order, each with its item as it stood right
        after it: the item's latest event has the item as it is now.

        The feed serves an event once every transaction older than it has ended, in the whole
        PostgreSQL cluster (pg_snapshot_xmin): a write of another test worker, in another database,
        holds it back for that long. So the end is read again, for up to 30 s, until the events
        the model expects are there; what is served is checked on every page all the same.

        A page shorter than `limit` is the end as of now: no page more is asked for to see it
        empty (8,544 feed requests of 16,935 in both runs before, 7,281 of 15,672 after)."""
        deadline = time.monotonic() + 30
        while True:
            params = {"limit": limit, **({"after": self.feed_cursor} if self.feed_cursor else {})}
            page = self.client.get("/events", params=params, headers=self.headers("audrey"))
            assert page.status_code == 200, page.text
            served = page.json()["events"]
            for entry in served if check else ():
                item_id = entry["item_id"]
                assert item_id in self.model, f"the feed served another example's event: {entry}"
                self.feed_seen[(item_id, entry["event"])] += 1
                ids = self.feed_ids.setdefault(item_id, [])
                assert not ids or ids[-1] < entry["id"], f"item {item_id}: {entry['id']} after {ids}"
                ids.append(entry["id"])
                assert entry["item_as_of"] == "event" and entry["item"]["lease_token"] is None, entry
                self.feed_last_state[item_id] = entry["item"]["state"]
            ReviewQueueMachine.feed_cursor = page.json()["next_cursor"]
            if len(served) < limit:
                if not check or dict(self.feed_seen) == self._feed_wanted() or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        if check:
            wanted = self._feed_wanted()
            assert dict(self.feed_seen) == wanted, {
                k: (self.feed_seen.get(k, 0), wanted.get(k, 0))
                for k in self.feed_seen.keys() | wanted.keys()
                if self.feed_seen.get(k, 0) != wanted.get(k, 0)
            }
            for item_id, state in self.feed_last_state.items():
                assert state == self.model[item_id].state, (item_id, state, self.model[item_id].state)
            tally("feed read to its end")

    def _feed_wanted(self) -> dict[tuple[str, str], int]:
        return {(i, e): n for i, m in self.model.items() for e, n in m.events.items() if n}

    @rule(
        item_id=items,
        who=st.sampled_from(COMMENTERS),
        text=st.one_of(st.sampled_from(COMMENT_TEXTS), st.text(max_size=12)),
    )
    def comment(self, item_id: str, who: str, text: str) -> None:
        """POST /items/{id}/comments: a COMMENTED event by `who`, last in the item's trail; the item
        itself unchanged (the invariant compares it with the model, which a comment does not touch)."""
        m = self.model[item_id]
        response = self.post(f"/items/{item_id}/comments", who, {"text": text})
        if who == "hook":
            assert_problem(response, 403, "FORBIDDEN")
            tally("comment refused: integration")
            return
        if not comment_allowed(text):
            problem = assert_problem(response, 422, "VALIDATION_ERROR")
            assert problem["errors"][0]["loc"] == ["body", "text"], problem
            tally("comment refused: text")
            return
        assert response.status_code == 201, response.text
        event = response.json()
        assert (event["event"], event["actor"], event["item_id"]) == ("COMMENTED", who, item_id), event
        assert (event["details"], event["lease_epoch"]) == ({"text": text}, m.epoch), event
        m.comments.append((who, text))
        m.events["COMMENTED"] += 1
        trail = self.client.get(f"/items/{item_id}/events", headers=self.headers("audrey"))
        assert trail.status_code == 200, trail.text
        events = trail.json()["events"]
        assert events[-1] == event, (events[-1], event)
        said = [(e["actor"], e["details"]["text"]) for e in events if e["event"] == "COMMENTED"]
        assert said == m.comments, (said, m.comments)
        key("comment appended")
        tally(f"comment on a {m.state} item by {who}")

    @rule(case=st.sampled_from(REFUSED))
    def refused(self, case: tuple[str, str | None, int, str]) -> None:
        path, subject, status, code = case
        if path.endswith("/events"):
            response = self.client.get(path, headers=self.headers(subject))
        elif path == "/items/batch":
            response = self.post(path, subject, {"items": [self.new_payload()]})
        elif path.endswith("/complete"):
            response = self.post(path, subject, {"resolution": "APPROVED"})
        elif (suffix := "/" + path.rsplit("/", 1)[1]) in REFUSED_BODIES:
            response = self.post(path, subject, REFUSED_BODIES[suffix])
        else:
            response = self.post(path, subject)
        assert_problem(response, status, code)

    # --- invariant ----------------------------------------------------------------------

    @invariant()
    def database_matches_model(self) -> None:
        TALLY["steps"] += 1
        # Not a rule of its own: a new rule shifts which rules each derandomized example draws.
        self.read_feed((1, 3, 500)[TALLY["steps"] % 3])
        if TALLY["steps"] % 4 == 0:
            self.search(TALLY["steps"] // 4)
        rows = self.sql.execute(
            """
            SELECT id::text, state, leased_by, lease_epoch, attempts, resolution, resolved_by,
                   resolution_note, prepared_by, proposed_resolution, approved_by,
                   CASE WHEN NOT (state = 'ASSIGNED'
                                  OR (state = 'AWAITING_APPROVAL' AND leased_by IS NOT NULL)) THEN NULL
                        WHEN lease_expires_at > now() + make_interval(secs => %(lease)s)
                            THEN 'longer than the lease duration'
                        WHEN lease_expires_at > now() THEN 'live'
                        WHEN lease_expires_at >= now() - make_interval(secs => %(grace)s) THEN 'in_grace'
                        ELSE 'past_grace' END,
                   leased_at IS NOT NULL, lease_expires_at IS NOT NULL, resolved_at IS NOT NULL
            FROM review_queue_item WHERE created_at >= %(since)s
            """,
            {"lease": LEASE_S, "grace": GRACE_S, "since": self.since},
        ).fetchall()
        actual = {r[0]: r[1:] for r in rows}
        expected = {
            i: (
                m.state,
                m.leased_by,
                m.epoch,
                m.attempts,
                m.resolution,
                m.resolved_by,
                m.note,
                m.prepared_by,
                m.proposed,
                m.approved_by,
                m.expiry if m.lease_open else None,
                m.lease_times,
                m.lease_times,
                m.state == "RESOLVED",
            )
            for i, m in self.model.items()
        }
        assert actual.keys() == expected.keys(), set(actual) ^ set(expected)
        diff = {i: {"db": actual[i], "model": expected[i]} for i in expected if actual[i] != expected[i]}
        assert not diff, (
            f"(state, leased_by, epoch, attempts, resolution, resolved_by, note, prepared_by, proposed,"
            f" approved_by, expiry, ...): {diff}"
        )
        held = Counter(m.leased_by for m in self.model.values() if m.lease_open)
        assert all(n <= CAP for n in held.values()), held

        trail = self.sql.execute(
            "SELECT item_id::text, event, count(*), array_agg(actor ORDER BY id) FROM review_queue_event"
            " WHERE at >= %s GROUP BY 1, 2",
            (self.since,),
        ).fetchall()
        events = {(i, e): n for i, e, n, _ in trail}
        wanted = {(i, e): m.events[e] for i, m in self.model.items() for e in EVENTS if m.events[e]}
        assert events == wanted, {
            k: {"database": events.get(k, 0), "model": wanted.get(k, 0)}
            for k in events.keys() | wanted.keys()
            if events.get(k, 0) != wanted.get(k, 0)
        }
        resolvers = {i: actors for i, e, _, actors in trail if e == "RESOLVED"}
        assert resolvers == {i: m.resolvers for i, m in self.model.items() if m.resolvers}
        said: dict[str, list[tuple[str, str]]] = {}
        for item_id, actor, text in self.sql.execute(
            "SELECT item_id::text, actor, details ->> 'text' FROM review_queue_event"
            " WHERE at >= %s AND event = 'COMMENTED' ORDER BY id",
            (self.since,),
        ).fetchall():
            said.setdefault(item_id, []).append((actor, text))
        assert said == {i: m.comments for i, m in self.model.items() if m.comments}
        self.four_eyes_hold()

    def four_eyes_hold(self) -> None:
        """Issue 12's invariants, from the database alone (over every row, not only this example's)."""
        same = self.sql.execute(
            "SELECT id FROM review_queue_item WHERE approved_by IS NOT NULL AND approved_by = resolved_by"
        ).fetchall()
        assert not same, f"approved by their own resolver: {same}"
        unapproved = self.sql.execute(
            "SELECT i.id, i.resolution, i.variance_amount FROM review_queue_item i JOIN resolution_code c"
            " ON c.code = i.resolution WHERE i.state = 'RESOLVED' AND i.created_at >= %s"
            " AND abs(i.variance_amount) >= c.approval_threshold AND i.approved_by IS NULL",
            (self.since,),
        ).fetchall()
        assert not unapproved, f"resolved above the threshold without an approval: {unapproved}"
        # Resolved at most once: every RESOLVED or APPROVED event but the current decision's was
        # undone by a REOPENED event.
        twice = self.sql.execute(
            "SELECT i.id, i.state, count(*) FILTER (WHERE e.event IN ('RESOLVED', 'APPROVED')) AS decided,"
            " count(*) FILTER (WHERE e.event = 'REOPENED') AS reopened"
            " FROM review_queue_item i JOIN review_queue_event e ON e.item_id = i.id"
            " WHERE i.created_at >= %s GROUP BY i.id, i.state"
            " HAVING count(*) FILTER (WHERE e.event IN ('RESOLVED', 'APPROVED'))"
            " <> count(*) FILTER (WHERE e.event = 'REOPENED') + (i.state = 'RESOLVED')::int",
            (self.since,),
        ).fetchall()
        assert not twice, f"resolved more than once: {twice}"


# Hypothesis gives up shrinking after 5 minutes; the timeout must not cut its report short.
@pytest.mark.timeout(1800 if LONG else 900)
def test_api_behaves_like_the_model(db_url: str, make_token: Callable[[str, str], str]) -> None:
    tokens = {s: make_token(s, "approver" if s in APPROVERS else "reviewer") for s in REVIEWERS}
    tokens["root"] = make_token("root", "admin")
    tokens["feeder"] = make_token("feeder", "ingest")
    tokens["audrey"] = make_token("audrey", "auditor")
    tokens["hook"] = make_token("hook", "integration")
    ReviewQueueMachine.feed_cursor = None
    app_settings = make_settings(
        db_url,
        max_leases_per_reviewer=CAP,
        max_attempts=MAX_ATTEMPTS,
        lock_timeout_ms=LEASE_S * 1000,
        reclaim_after_s=GRACE_S,
        sla_tiers=SLA_TIERS,
    )
    TALLY.clear()
    KEY.clear()
    with (
        TestClient(create_app(app_settings), raise_server_exceptions=False) as client,
        psycopg.connect(libpq(db_url), autocommit=True) as sql,
    ):
        for code, threshold in (("WRITE_OFF", BIG), ("ADJUSTMENT_POSTED", BIG), ("APPROVED", None)):
            body = {
                "label": code,
                "requires_note": code in NEEDS_NOTE,
                "approval_threshold": f"{threshold}.00" if threshold else None,
            }
            answer = client.put(
                f"/resolutions/{code}", json=body, headers={"Authorization": f"Bearer {tokens['root']}"}
            )
            assert answer.status_code == 200, answer.text
        set_materiality(client, tokens["root"], ABOVE_EVERY_AMOUNT)
        ReviewQueueMachine.client = client
        ReviewQueueMachine.sql = sql
        ReviewQueueMachine.tokens = tokens
        run_state_machine_as_test(
            ReviewQueueMachine,
            settings=settings(
                max_examples=MAX_EXAMPLES,
                stateful_step_count=STEPS,
                deadline=None,
                # CI runs the same examples every time (a red build is reproducible); the long
                # run explores new ones.
                derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            ),
        )
    report = "\n".join(f"{n:6} {label}" for label, n in sorted(TALLY.items()))
    print(report)
    examples = TALLY["examples"]
    short = {
        label: f"{KEY[label]} < {minimum * examples:.0f}"
        for label, minimum in KEY_MINIMUMS.items()
        if KEY[label] < minimum * examples
    }
    assert not short, f"the model test lost coverage over {examples} examples: {short}\n{report}"


# --- Materiality (issue 23) -----------------------------------------------------------------------
# The machine above with the catalogue-wide approval threshold as seeded (10,000.00). It lies
# between the model's small amounts and BIG, so every big completion needs an approver whatever its
# code, APPROVED too; every other answer is the model's as before. (A machine of its own, so that
# the main run's examples, on which its coverage minimums were set, stay exactly as they were.)

MATERIALITY = "10000.00"  # as the migration seeds it


class MaterialMachine(ReviewQueueMachine):
    # Not a rule here: the main run holds comments, and this quarter-size run's steps go to the one
    # branch that is new (with comments drawn too, no approval happened in its 16 examples).
    comment = None  # type: ignore[assignment]

    def judge_completion(
        self,
        item_id: str,
        reviewer: str,
        epoch: int | None,
        foreign: bool,
        resolution: str,
        note: str | None,
        answer: dict[str, Any],
    ) -> bool:
        """APPROVED (no threshold of its own in this catalogue) on a big item by its holder is
        submitted for approval like the thresholded codes; everything else as the main"""
        m = self.model[item_id]
        changed = self.source_changed(item_id, reviewer, epoch, foreign, complete=True)
        held = self.holds(item_id, reviewer, epoch, foreign) and not changed
        if not (held and resolution == "APPROVED" and m.big):
            return super().judge_completion(item_id, reviewer, epoch, foreign, resolution, note, answer)
        assert answer.get("outcome") == "submitted_for_approval", answer
        key("completion submitted at materiality")
        m.state, m.leased_by, m.expiry = "AWAITING_APPROVAL", None, "live"
        m.prepared_by, m.proposed, m.proposed_note, m.approved_by = reviewer, resolution, note, None
        m.events["SUBMITTED_FOR_APPROVAL"] += 1
        self.check_item(answer["item"], item_id, reviewer)
        return False

    @precondition(lambda self: bool(self.held_big()))
    @rule()
    def holder_approves_a_big_item(self) -> None:
        """The holder of a big item resolves it APPROVED, the code without a threshold of its own:
        past materiality it goes to an approver (the other rules draw it seldom)."""
        self.complete_as(self.held_big()[0], "last_holder", "current", "APPROVED", None, "complete")

    def held_big(self) -> list[str]:
        return [i for i, m in sorted(self.model.items(), key=lambda kv: kv[1].seq) if m.big and m.lease_open]


# The examples CI runs. derandomize alone seeds each run from a digest of its machine's source, so
# any edit of the class, a comment's too, drew other examples, and the coverage minimums (KEY_MINIMUMS,
# set on one draw) failed on some: "proposal approved" 1 < 13 after an edit of the feed read,
# "completion resolved an item" 50 < 73 after a change to search()'s paging (issue 39). These are
# those digests as of 3ebb906, the examples the minimums were met on: an edit that draws nothing
# new runs the very same examples. An edit that draws differently re-checks the minimums, and
# picks new seeds if it must. The long run (LONG) explores new examples every time.
SEEDS = {
    ReviewQueueMachine: 14944034357038277020137672539568794787982785047999278630379499270153336612401220692170598059460539858617321755785663,  # noqa: E501
    MaterialMachine: 26344306532924685121881724891180189694184682475394847619154490490445458020170271858112090364121913235997650989572677,  # noqa: E501
}
if not LONG:
    for machine, number in SEEDS.items():
        hypothesis.seed(number)(machine)  # the machine's own `seed` is a rule's helper


@pytest.mark.timeout(1800 if LONG else 900)
def test_api_behaves_like_the_model_at_the_seeded_materiality(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    tokens = {s: make_token(s, "approver" if s in APPROVERS else "reviewer") for s in REVIEWERS}
    for subject, role in (
        ("root", "admin"),
        ("feeder", "ingest"),
        ("audrey", "auditor"),
        ("hook", "integration"),
    ):
        tokens[subject] = make_token(subject, role)
    app_settings = make_settings(
        db_url,
        max_leases_per_reviewer=CAP,
        max_attempts=MAX_ATTEMPTS,
        lock_timeout_ms=LEASE_S * 1000,
        reclaim_after_s=GRACE_S,
        sla_tiers=SLA_TIERS,
    )
    TALLY.clear()
    KEY.clear()
    root = {"Authorization": f"Bearer {tokens['root']}"}
    with (
        TestClient(create_app(app_settings), raise_server_exceptions=False) as client,
        psycopg.connect(libpq(db_url), autocommit=True) as sql,
    ):
        for code, threshold in (
            ("WRITE_OFF", BIG),
            ("ADJUSTMENT_POSTED", BIG),
            ("APPROVED", None),
        ):
            body = {
                "label": code,
                "requires_note": code in NEEDS_NOTE,
                "approval_threshold": f"{threshold}.00" if threshold else None,
            }
            assert client.put(f"/resolutions/{code}", json=body, headers=root).status_code == 200
        set_materiality(client, tokens["root"], MATERIALITY)
        MaterialMachine.client, MaterialMachine.sql, MaterialMachine.tokens = client, sql, tokens
        run_state_machine_as_test(
            MaterialMachine,
            settings=settings(
                # A quarter of the main run: the rules are the same; what is new here is one branch.
                max_examples=MAX_EXAMPLES // 4,
                stateful_step_count=STEPS,
                deadline=None,
                derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            ),
        )
    report = "\n".join(f"{n:6} {label}" for label, n in sorted(TALLY.items()))
    print(report)
    for label in ("completion submitted at materiality", "proposal approved"):
        assert KEY[label] > 0, f"{label!r} never happened over {TALLY['examples']} examples\n{report}"
