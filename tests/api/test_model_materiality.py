"""Issue 23, materiality, in the model test: the machine of test_model.py with the catalogue-wide
approval threshold as seeded (10,000.00). It lies between the model's small amounts and BIG, so
every big completion needs an approver whatever its code, APPROVED too; every other answer is the
model's as before. (A machine of its own, so that the main run's examples, on which its coverage
minimums were set, stay exactly as they were.)"""

from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from hypothesis.stateful import precondition, rule, run_state_machine_as_test

from api.app import create_app
from tests.api import test_model as model
from tests.api.helpers import set_materiality
from tests.conftest import LONG, libpq, make_settings

MATERIALITY = "10000.00"  # as the migration seeds it


class MaterialMachine(model.ReviewQueueMachine):
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
        submitted for approval like the thresholded codes; everything else as the main model."""
        m = self.model[item_id]
        changed = self.source_changed(item_id, reviewer, epoch, foreign, complete=True)
        held = self.holds(item_id, reviewer, epoch, foreign) and not changed
        if not (held and resolution == "APPROVED" and m.big):
            return super().judge_completion(item_id, reviewer, epoch, foreign, resolution, note, answer)
        assert answer.get("outcome") == "submitted_for_approval", answer
        model.key("completion submitted at materiality")
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


@pytest.mark.timeout(1800 if LONG else 900)
def test_api_behaves_like_the_model_at_the_seeded_materiality(
    db_url: str, make_token: Callable[[str, str], str]
) -> None:
    tokens = {s: make_token(s, "approver" if s in model.APPROVERS else "reviewer") for s in model.REVIEWERS}
    for subject, role in (("root", "admin"), ("feeder", "ingest"), ("audrey", "auditor")):
        tokens[subject] = make_token(subject, role)
    app_settings = make_settings(
        db_url,
        max_leases_per_reviewer=model.CAP,
        max_attempts=model.MAX_ATTEMPTS,
        lock_timeout_ms=model.LEASE_S * 1000,
        reclaim_after_s=model.GRACE_S,
        sla_tiers=model.SLA_TIERS,
    )
    model.TALLY.clear()
    model.KEY.clear()
    root = {"Authorization": f"Bearer {tokens['root']}"}
    with (
        TestClient(create_app(app_settings), raise_server_exceptions=False) as client,
        psycopg.connect(libpq(db_url), autocommit=True) as sql,
    ):
        for code, threshold in (
            ("WRITE_OFF", model.BIG),
            ("ADJUSTMENT_POSTED", model.BIG),
            ("APPROVED", None),
        ):
            body = {
                "label": code,
                "requires_note": code in model.NEEDS_NOTE,
                "approval_threshold": f"{threshold}.00" if threshold else None,
            }
            assert client.put(f"/resolutions/{code}", json=body, headers=root).status_code == 200
        set_materiality(client, tokens["root"], MATERIALITY)
        MaterialMachine.client, MaterialMachine.sql, MaterialMachine.tokens = client, sql, tokens
        run_state_machine_as_test(
            MaterialMachine,
            settings=settings(
                # A quarter of the main run: the rules are the same; what is new here is one branch.
                max_examples=model.MAX_EXAMPLES // 4,
                stateful_step_count=model.STEPS,
                deadline=None,
                derandomize=not LONG,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
            ),
        )
    report = "\n".join(f"{n:6} {label}" for label, n in sorted(model.TALLY.items()))
    print(report)
    for label in ("completion submitted at materiality", "proposal approved"):
        assert model.KEY[label] > 0, (
            f"{label!r} never happened over {model.TALLY['examples']} examples\n{report}"
        )
